/*
 * gpubench.c -- micro-benchmark of the CUDA kernels (kernels/cuda); one JSON object per line on
 * stdout.
 *
 *   gpubench [--device N] [--only device|copy|matvec|prefill|attention_decode|attention_prefill|
 *            ops] [--quick]
 *
 * device:            the GPU as ifkc_device_info_get sees it (name, memory, SMs, compute
 *                    capability, runtime and driver versions, peak bandwidth from the memory
 *                    clock and bus width).
 * copy:              ifkc_copy of a 1 GiB buffer to another on the device. A copy reads N bytes
 *                    and writes N, so the memory system moves 2N bytes per copy: bw_gbps = 2N / t
 *                    is the measured bandwidth, the ceiling every read-bound kernel below is
 *                    compared with (its fraction_of_bw = bytes it reads / t / bw_gbps). A kernel
 *                    that only reads can in principle beat it slightly (no read/write turnaround),
 *                    so a fraction a little above 1 is possible; read_gbps = N / t is reported too
 *                    but is not the ceiling. Always measured before matvec and attention_decode
 *                    (their fractions need it), so --only of those prints this line as well.
 * matvec:            ifkc_matmul with T = 1 (decode) for every weight type (F32, F16, BF16 and
 *                    the nine quantized types) on the Llama-2-7B shapes N x K = 4096 x 4096
 *                    (attention projections), 11008 x 4096 (gate, up), 4096 x 11008 (down) and
 *                    32000 x 4096 (output); and T = 8 (batched decode) for F16, Q8_B64 and Q4_B64;
 *                    Q4_B32, Q4_B64, Q8_B32 and Q8_B64 at T = 1, and Q8_B64 and Q4_B64 at
 *                    T = 8, in warp tiles ("layout":"tiled", ifkc_tile_pack: a lane reads 16
 *                    level bytes at a time, int8 activations; IFLOW_CUDA_TILED=1 in the engine);
 *                    then T = 1 for those three, and tiled Q8_B64 and Q4_B64, again with
 *                    overlapped launches ("overlap": each
 *                    call's kernel starts, and fetches its rows into L2, while the one before it
 *                    finishes; ifkc_set_overlap), on a GPU that has them (compute capability 9.0).
 *                    weight_gbps = bytes of the weight matrix / time per call. Calls go round-robin
 *                    over several copies of the matrix (>= 256 MiB in all), so the 50 MB L2 of an
 *                    H100 cannot serve a repeat: weights come from HBM as in a real model.
 * prefill:           ifkc_matmul with T = 512 (cuBLAS) for F16, BF16, F32, Q8_B64 and Q4_B64 on
 *                    4096 x 4096 and 11008 x 4096; tflops = 2 T N K / time (one matrix, reused).
 * attention_decode:  ifkc_attention_decode over 1024, 4096, 16384 and 65536 positions, 32 query
 *                    heads over 8 KV heads of 128 (grouped-query attention as in Llama-3-8B), KV
 *                    F16 and F32; and 32 heads over 32 KV heads (no grouping, as in Llama-2-7B)
 *                    at 4096 and 16384 positions, KV F16; then the grouped F16 ones again with
 *                    overlapped launches ("overlap"). kv_gbps = bytes of K and V read
 *                    (2 n_pos n_kv_heads head_dim elem_size) / time; round-robin over copies of
 *                    the cache (>= 256 MiB in all), as for matvec.
 * attention_prefill: ifkc_attention_prefill of T = 512 queries at pos0 = 0 (a first prompt
 *                    chunk), same heads, KV F16; tflops = 4 (T (T+1) / 2) n_heads head_dim / time
 *                    (causal: query t sees t + 1 positions; QK^T and PV are 2 flops per
 *                    multiply-add each).
 * ops:               where a decode step's time goes: each operation of one token's layer, alone
 *                    and as the whole layer in order (norm, q k v, two RoPEs, two cache stores,
 *                    attention over 512 positions, o, add, norm, gate, up, SiLU, down, add), and
 *                    the argmax over 32000 logits, on the TinyLlama-1.1B and Llama-2-7B shapes
 *                    with F16 and Q4_B64 weights and an F16 cache. host_us: the host's time to
 *                    enqueue one call; gpu_us: the device's time for one call, from CUDA events
 *                    around 100 calls that queued up behind 2 GiB of copies (so the device ran
 *                    them back to back, not waiting for the host; queued_behind says whether
 *                    the host did finish enqueueing before the copies ended). A step that costs
 *                    more host_us than gpu_us is bound by the host's launches. Then the fused
 *                    ops (qkv, rope_store, add_rmsnorm, glu) and the layer with them, as the
 *                    engine runs it on a GPU (layer_fused), and that layer with overlapped
 *                    launches (layer_fused_overlap, compute capability 9.0 and up); for Q4_B64
 *                    the products again in warp tiles (qkv_tiled, wo_tiled, glu_tiled, down_tiled:
 *                    each with its rounding of x to int8) and the layer with them
 *                    (layer_fused_tiled, layer_fused_tiled_overlap).
 *
 * Timing: each measurement enqueues calls on the device's stream and ends a round with
 * ifkc_sync(), timed on the host (bench.h). Two warm-up passes first (cuBLAS set-up, first
 * touches); then a round is as many passes over the copies as make it last >= 5 ms, so the
 * synchronisation adds < 1 %. Times are per call: the best and the median round. Small shapes
 * include the launch cost of back-to-back calls, as a model's decode step pays it.
 *
 * Data: pseudo-random from fixed seeds. To keep set-up fast for large matrices, 256 distinct
 * rows are generated (quantized types through ifk_quantize_row, the reference quantizer) and
 * replicated on the device to fill the matrix; KV caches likewise repeat 256 distinct positions.
 * The kernels' speed does not depend on the values.
 *
 * --only NAME: the device line and that measurement (and copy, as said above).
 *
 * A failing measurement prints {"bench":..., "case":..., "error": ifkc_errmsg()} and the others
 * go on (the exit status is then 1). With no usable GPU it prints one line on stderr saying why
 * and exits 1. --quick: fewer shapes and shorter rounds.
 *
 * Built by the Makefile as $(BUILD)/gpubench when CUDA is on; run by bench/bench-gpu.sh
 * (make bench-gpu).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/qtile.cuh"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIN_TOTAL_BYTES ((size_t)256 << 20) /* copies of a weight matrix or KV cache: >= 5x L2 */
#define PATTERN_ROWS 256                    /* distinct rows generated on the host            */
#define ROUND_TARGET_S 5e-3                 /* a timed round lasts at least this long          */

typedef struct {
    ifkc_dev *d;
    double min_s;   /* least time spent on each measurement's rounds            */
    double bw_gbps; /* the copy bench's 2N/t (0 until measured)                  */
    double peak_gbps;
    int failed;     /* some measurement printed an error                         */
    int overlap;    /* launches overlap (ifkc_set_overlap) in what is measured now */
} gpubench;

/* ---- output ------------------------------------------------------------------------------------ */

/* s as a JSON string. */
static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

/* One error line for a failed measurement: the case it was and the kernels' message. */
static void report_error(gpubench *g, const char *bench, const char *what)
{
    printf("{\"bench\":");
    json_str(bench);
    printf(",\"case\":");
    json_str(what);
    printf(",\"error\":");
    json_str(ifkc_errmsg());
    printf("}\n");
    fflush(stdout);
    g->failed = 1;
}

static const char *wtype_name(int wt)
{
    if (wt == IFK_F32)
        return "f32";
    if (wt == IFK_F16)
        return "f16";
    if (wt == IFK_BF16)
        return "bf16";
    const ifk_qtype_info *q = ifk_qtype(wt);
    return q ? q->name : "?";
}

/* ---- data -------------------------------------------------------------------------------------- */

/* Uniform in [-1, 1), from a 32-bit LCG state. */
static float rnd(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 8388608.0f - 1.0f;
}

/* F32 -> F16 bits, round to nearest even; magnitudes below F16's smallest normal (6.1e-5)
 * become signed zero, which is all random benchmark data needs. |f| < 65504. */
static uint16_t f16_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int e = (int)((x >> 23) & 0xff) - 127 + 15;
    if (e <= 0)
        return (uint16_t)sign;
    uint32_t m = x & 0x7fffff, h = ((uint32_t)e << 10) | (m >> 13), rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++; /* a carry into the exponent is the right result */
    return (uint16_t)(sign | h);
}

/* F32 -> BF16 bits, round to nearest even (finite input). */
static uint16_t bf16_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* Bytes of one row of K weights of type wt. */
static size_t row_bytes(int wt, int K)
{
    if (wt == IFK_F32)
        return (size_t)K * 4;
    if (wt == IFK_F16 || wt == IFK_BF16)
        return (size_t)K * 2;
    return ifk_qrow_bytes(wt, K);
}

/* One row of K random weights (about N(0, 0.03)-sized, as trained weights are) in type wt.
 * tmp: [K] floats of scratch. */
static void make_row(void *dst, int wt, int K, uint32_t seed, float *tmp)
{
    uint32_t s = seed * 2654435761u + 1;
    for (int k = 0; k < K; k++)
        tmp[k] = 0.05f * rnd(&s);
    if (wt == IFK_F32)
        memcpy(dst, tmp, (size_t)K * 4);
    else if (wt == IFK_F16)
        for (int k = 0; k < K; k++)
            ((uint16_t *)dst)[k] = f16_bits(tmp[k]);
    else if (wt == IFK_BF16)
        for (int k = 0; k < K; k++)
            ((uint16_t *)dst)[k] = bf16_bits(tmp[k]);
    else
        ifk_quantize_row(dst, wt, tmp, K);
}

/* Fills total bytes at dst with copies of the host block src[0 .. block): uploads it once, then
 * doubles the filled prefix with device copies. total is a multiple of block. */
static int fill_tiled(ifkc_dev *d, char *dst, const void *src, size_t block, size_t total)
{
    size_t filled = block < total ? block : total;
    int rc = ifkc_upload(d, dst, src, filled);
    while (!rc && filled < total) {
        size_t n = filled < total - filled ? filled : total - filled;
        rc = ifkc_copy(d, dst + filled, dst, n);
        filled += n;
    }
    return rc ? rc : ifkc_sync(d);
}

/* n random F32 values in [-1, 1) on the device. */
static int fill_random_f32(ifkc_dev *d, float *dst, size_t n, uint32_t seed)
{
    float *h = bench_alloc64("gpubench", n * 4);
    uint32_t s = seed;
    for (size_t i = 0; i < n; i++)
        h[i] = rnd(&s);
    int rc = ifkc_upload(d, dst, h, n * 4);
    free(h);
    return rc;
}

/* An [N][K] weight matrix of type wt at dst: PATTERN_ROWS distinct random rows, repeated. */
static int fill_weights(ifkc_dev *d, char *dst, int wt, int N, int K)
{
    int R = N < PATTERN_ROWS ? N : PATTERN_ROWS;
    size_t rb = row_bytes(wt, K);
    char *h = bench_alloc64("gpubench", (size_t)R * rb);
    float *tmp = bench_alloc64("gpubench", (size_t)K * 4);
    for (int r = 0; r < R; r++)
        make_row(h + (size_t)r * rb, wt, K, (uint32_t)r, tmp);
    int rc = fill_tiled(d, dst, h, (size_t)R * rb, (size_t)N * rb);
    free(h);
    free(tmp);
    return rc;
}

/* A KV cache of n_pos rows of `row` elements of kv_type: PATTERN_ROWS distinct rows, repeated. */
static int fill_kv(ifkc_dev *d, char *dst, int kv_type, int n_pos, int row, uint32_t seed)
{
    int R = n_pos < PATTERN_ROWS ? n_pos : PATTERN_ROWS;
    size_t rb = (size_t)row * (kv_type == IFK_F32 ? 4 : 2);
    char *h = bench_alloc64("gpubench", (size_t)R * rb);
    uint32_t s = seed;
    for (size_t i = 0; i < (size_t)R * row; i++) {
        float v = rnd(&s);
        if (kv_type == IFK_F32)
            ((float *)h)[i] = v;
        else
            ((uint16_t *)h)[i] = f16_bits(v);
    }
    int rc = fill_tiled(d, dst, h, (size_t)R * rb, (size_t)n_pos * rb);
    free(h);
    return rc;
}

/* How many copies of an object of `bytes` make at least MIN_TOTAL_BYTES. */
static int copies_for(size_t bytes)
{
    return (int)((MIN_TOTAL_BYTES + bytes - 1) / bytes);
}

/* Distance between copies: bytes rounded up to 256 (the alignment cudaMalloc gives). */
static size_t copy_stride(size_t bytes)
{
    return (bytes + 255) & ~(size_t)255;
}

/* Fills copies 1 .. n-1 (stride apart) from copy 0 (bytes long). */
static int replicate(ifkc_dev *d, char *base, size_t bytes, size_t stride, int n)
{
    int rc = 0;
    for (int c = 1; c < n && !rc; c++)
        rc = ifkc_copy(d, base + (size_t)c * stride, base, bytes);
    return rc ? rc : ifkc_sync(d);
}

/* ---- timing ------------------------------------------------------------------------------------ */

/* Enqueues call number i of a pass (0 <= i < the pass's length). */
typedef int (*enqueue_fn)(void *arg, int i);

/* Enqueues `passes` passes of `unit` calls and waits for them. */
static int run_passes(ifkc_dev *d, enqueue_fn fn, void *arg, int unit, int passes)
{
    int rc = 0;
    for (int p = 0; p < passes && !rc; p++)
        for (int i = 0; i < unit && !rc; i++)
            rc = fn(arg, i);
    return rc ? rc : ifkc_sync(d);
}

/* Times calls of fn: two warm-up passes (a pass = unit calls, one per copy of the data), then
 * rounds of as many passes as last >= ROUND_TARGET_S, each ended by ifkc_sync. *best and *med:
 * seconds per call, the best and the median round. */
static int time_calls(gpubench *g, enqueue_fn fn, void *arg, int unit, double *best, double *med)
{
    int rc = run_passes(g->d, fn, arg, unit, 1);
    if (rc)
        return rc;
    double t0 = bench_now();
    if ((rc = run_passes(g->d, fn, arg, unit, 1)))
        return rc;
    double t_pass = bench_now() - t0;
    int passes = t_pass >= ROUND_TARGET_S ? 1 : (int)ceil(ROUND_TARGET_S / (t_pass > 1e-7 ? t_pass : 1e-7));
    BENCH_ROUNDS(g->min_s, best, med, if (!rc) rc = run_passes(g->d, fn, arg, unit, passes));
    double calls = (double)unit * passes;
    *best /= calls;
    *med /= calls;
    return rc;
}

/* ---- device ------------------------------------------------------------------------------------ */

static int bench_device(gpubench *g, int index)
{
    ifkc_device_info in;
    if (ifkc_device_info_get(index, &in)) {
        report_error(g, "device", "ifkc_device_info_get");
        return -1;
    }
    g->peak_gbps = in.mem_bw_peak * 1e-9;
    printf("{\"bench\":\"device\",\"index\":%d,\"name\":", index);
    json_str(in.name);
    printf(",\"mem_total_gib\":%.2f,\"mem_free_gib\":%.2f,\"sm_count\":%d,\"compute_capability\":\"%d.%d\","
           "\"runtime_version\":%d,\"driver_version\":%d,\"peak_gbps\":%.1f}\n",
           in.mem_total / GIB, in.mem_free / GIB, in.sm_count, in.cc_major, in.cc_minor,
           in.runtime_version, in.driver_version, g->peak_gbps);
    fflush(stdout);
    return 0;
}

/* ---- copy -------------------------------------------------------------------------------------- */

typedef struct {
    ifkc_dev *d;
    char *dst;
    const char *src;
    size_t n;
} copy_args;

static int copy_call(void *arg, int i)
{
    copy_args *a = arg;
    return ifkc_copy(a->d, a->dst, a->src, a->n);
}

/* Sets g->bw_gbps. */
static void bench_copy(gpubench *g)
{
    const size_t N = (size_t)1 << 30;
    char *buf = NULL;
    double best, med;
    if (ifkc_malloc(g->d, (void **)&buf, 2 * N) || ifkc_memset0(g->d, buf, 2 * N)) {
        report_error(g, "copy", "allocating 2 x 1 GiB");
        goto out;
    }
    copy_args a = {g->d, buf + N, buf, N};
    if (time_calls(g, copy_call, &a, 1, &best, &med)) {
        report_error(g, "copy", "ifkc_copy of 1 GiB");
        goto out;
    }
    g->bw_gbps = 2.0 * N / best * 1e-9;
    printf("{\"bench\":\"copy\",\"bytes\":%zu,\"us\":%.1f,\"us_median\":%.1f,\"bw_gbps\":%.1f,"
           "\"bw_gbps_median\":%.1f,\"read_gbps\":%.1f,\"peak_gbps\":%.1f,",
           N, best * 1e6, med * 1e6, g->bw_gbps, 2.0 * N / med * 1e-9, N / best * 1e-9, g->peak_gbps);
    if (g->peak_gbps > 0)
        printf("\"fraction_of_peak\":%.3f}\n", g->bw_gbps / g->peak_gbps);
    else
        printf("\"fraction_of_peak\":null}\n");
    fflush(stdout);
out:
    ifkc_free(g->d, buf);
}

/* bytes / t as a fraction of the copy bench's bandwidth, or null before it. */
static void print_fraction(double gbps, double bw)
{
    if (bw > 0)
        printf(",\"fraction_of_bw\":%.3f", gbps / bw);
    else
        printf(",\"fraction_of_bw\":null");
}

/* ---- matvec and prefill ------------------------------------------------------------------------ */

typedef struct {
    ifkc_dev *d;
    float *y;
    const char *W; /* copy c at W + c * stride */
    size_t stride;
    int copies, wtype;
    const float *x;
    int T, N, K;
} matmul_args;

static int matmul_call(void *arg, int i)
{
    matmul_args *a = arg;
    return ifkc_matmul(a->d, a->y, (size_t)a->N, a->W + (size_t)(i % a->copies) * a->stride, a->wtype,
                       a->x, (size_t)a->K, a->T, a->N, a->K);
}

/* Device buffers of one product: `copies` weight matrices, x [T][K], y [T][N]; filled. */
static int matmul_setup(gpubench *g, matmul_args *a, int wt, int T, int N, int K, int copies)
{
    size_t bytes = (size_t)N * row_bytes(wt, K);
    *a = (matmul_args){g->d, NULL, NULL, copy_stride(bytes), copies, wt, NULL, T, N, K};
    int rc = ifkc_malloc(g->d, (void **)&a->W, a->stride * copies);
    if (!rc)
        rc = ifkc_malloc(g->d, (void **)&a->x, (size_t)T * K * 4);
    if (!rc)
        rc = ifkc_malloc(g->d, (void **)&a->y, (size_t)T * N * 4);
    if (!rc)
        rc = fill_weights(g->d, (char *)a->W, wt, N, K);
    if (!rc)
        rc = replicate(g->d, (char *)a->W, bytes, a->stride, copies);
    if (!rc)
        rc = fill_random_f32(g->d, (float *)a->x, (size_t)T * K, 99);
    return rc;
}

static void matmul_free(gpubench *g, matmul_args *a)
{
    ifkc_free(g->d, (void *)a->W);
    ifkc_free(g->d, (void *)a->x);
    ifkc_free(g->d, a->y);
}

/* Returns 0 if ifkc_matmul takes wt, else prints a line saying it was skipped. */
static int check_wtype(const char *bench, int wt, int T, int N, int K)
{
    if (ifkc_supports_wtype(wt))
        return 0;
    printf("{\"bench\":\"%s\",\"wtype\":\"%s\",\"T\":%d,\"N\":%d,\"K\":%d,"
           "\"skipped\":\"weight type not supported by ifkc_matmul\"}\n",
           bench, wtype_name(wt), T, N, K);
    fflush(stdout);
    return -1;
}

/* Decode-sized products (T <= IFKC_MATVEC_MAX_T): weight bytes read per second. tiled: the
 * matrix repacked into warp tiles (ifkc_tile_pack, from a host copy; the same bytes) and
 * replicated, timed through ifkc_matmul with its tiled code (int8 activations, their rounding
 * kernel included in each call). */
static void bench_matvec(gpubench *g, int wt, int T, int N, int K, int tiled)
{
    if (check_wtype("matvec", wt, T, N, K))
        return;
    char what[96];
    snprintf(what, sizeof what, "%s%s T=%d N=%d K=%d", wtype_name(wt), tiled ? " tiled" : "", T, N, K);
    size_t bytes = (size_t)N * row_bytes(wt, K);
    int copies = copies_for(bytes);
    matmul_args a, p;
    char *P = NULL, *one = NULL, *host = NULL;
    double best, med;
    int rc = matmul_setup(g, &a, wt, T, N, K, copies), ptype = wt;
    if (tiled && !rc) {
        host = malloc(bytes);
        rc = host ? ifkc_download(g->d, host, a.W, bytes) : -1;
        if (!rc)
            rc = ifkc_tile_pack(g->d, (void **)&one, &ptype, host, wt, N, K);
        if (!rc && !one)
            rc = -1; /* not a tiled shape: reported below */
        if (!rc)
            rc = ifkc_malloc(g->d, (void **)&P, a.stride * copies);
        if (!rc)
            rc = ifkc_copy(g->d, P, one, bytes);
        if (!rc)
            rc = replicate(g->d, P, bytes, a.stride, copies);
    }
    p = a;
    if (tiled)
        p.W = P, p.wtype = ptype;
    if (rc || time_calls(g, matmul_call, &p, copies, &best, &med)) {
        report_error(g, "matvec", what);
        goto out;
    }
    double gbps = bytes / best * 1e-9;
    printf("{\"bench\":\"matvec\",\"wtype\":\"%s\",%s\"T\":%d,\"N\":%d,\"K\":%d,\"int8_x\":%s,\"overlap\":%s,"
           "\"weight_bytes\":%zu,\"copies\":%d,\"us\":%.2f,\"us_median\":%.2f,\"weight_gbps\":%.1f,"
           "\"weight_gbps_median\":%.1f",
           wtype_name(wt), tiled ? "\"layout\":\"tiled\"," : "", T, N, K,
           tiled || ifkc_matvec_int8_x(wt) ? "true" : "false", g->overlap ? "true" : "false", bytes, copies,
           best * 1e6, med * 1e6, gbps, bytes / med * 1e-9);
    print_fraction(gbps, g->bw_gbps);
    printf("}\n");
    fflush(stdout);
out:
    ifkc_free(g->d, P);
    ifkc_free(g->d, one);
    free(host);
    matmul_free(g, &a);
}

/* Prompt-sized products (cuBLAS): flops per second; one matrix (compute-bound, L2 irrelevant). */
static void bench_prefill(gpubench *g, int wt, int T, int N, int K)
{
    if (check_wtype("prefill", wt, T, N, K))
        return;
    char what[96];
    snprintf(what, sizeof what, "%s T=%d N=%d K=%d", wtype_name(wt), T, N, K);
    matmul_args a;
    double best, med, flop = 2.0 * T * N * K;
    if (matmul_setup(g, &a, wt, T, N, K, 1) || time_calls(g, matmul_call, &a, 1, &best, &med)) {
        report_error(g, "prefill", what);
        goto out;
    }
    printf("{\"bench\":\"prefill\",\"wtype\":\"%s\",\"T\":%d,\"N\":%d,\"K\":%d,\"us\":%.1f,"
           "\"us_median\":%.1f,\"tflops\":%.2f,\"tflops_median\":%.2f}\n",
           wtype_name(wt), T, N, K, best * 1e6, med * 1e6, flop / best * 1e-12, flop / med * 1e-12);
    fflush(stdout);
out:
    matmul_free(g, &a);
}

/* ---- attention --------------------------------------------------------------------------------- */

enum { ATT_HEADS = 32, ATT_KV_HEADS = 8, ATT_HEAD_DIM = 128 };

typedef struct {
    ifkc_dev *d;
    float *out;
    const float *q;
    const char *kv; /* copy c: K at kv + c * stride, V half a stride later */
    size_t stride;
    int copies, kv_type, T, n_pos, kvh; /* kvh: KV heads (ATT_KV_HEADS, or ATT_HEADS: no grouping) */
} attention_args;

static int attention_decode_call(void *arg, int i)
{
    attention_args *a = arg;
    const char *k = a->kv + (size_t)(i % a->copies) * a->stride;
    return ifkc_attention_decode(a->d, a->out, a->q, k, k + a->stride / 2, a->kv_type,
                                 (size_t)a->kvh * ATT_HEAD_DIM, a->n_pos, ATT_HEADS, a->kvh,
                                 ATT_HEAD_DIM, 1.0f / sqrtf((float)ATT_HEAD_DIM));
}

static int attention_prefill_call(void *arg, int i)
{
    attention_args *a = arg;
    return ifkc_attention_prefill(a->d, a->out, a->q, a->kv, a->kv + a->stride / 2, a->kv_type,
                                  (size_t)a->kvh * ATT_HEAD_DIM, a->T, 0, ATT_HEADS, a->kvh,
                                  ATT_HEAD_DIM, 1.0f / sqrtf((float)ATT_HEAD_DIM));
}

/* Bytes of one of K or V over n_pos positions of kvh heads. */
static size_t kv_bytes(int kv_type, int n_pos, int kvh)
{
    return (size_t)n_pos * kvh * ATT_HEAD_DIM * (kv_type == IFK_F32 ? 4 : 2);
}

/* Device buffers of one attention call: `copies` (K, V) pairs of n_pos positions, q and out of
 * T queries; filled. */
static int attention_setup(gpubench *g, attention_args *a, int kv_type, int T, int n_pos, int copies, int kvh)
{
    size_t half = copy_stride(kv_bytes(kv_type, n_pos, kvh)), qn = (size_t)T * ATT_HEADS * ATT_HEAD_DIM;
    *a = (attention_args){g->d, NULL, NULL, NULL, 2 * half, copies, kv_type, T, n_pos, kvh};
    int rc = ifkc_malloc(g->d, (void **)&a->kv, a->stride * copies);
    if (!rc)
        rc = ifkc_malloc(g->d, (void **)&a->q, qn * 4);
    if (!rc)
        rc = ifkc_malloc(g->d, (void **)&a->out, qn * 4);
    if (!rc)
        rc = fill_kv(g->d, (char *)a->kv, kv_type, n_pos, kvh * ATT_HEAD_DIM, 1);
    if (!rc)
        rc = fill_kv(g->d, (char *)a->kv + half, kv_type, n_pos, kvh * ATT_HEAD_DIM, 2);
    if (!rc)
        rc = replicate(g->d, (char *)a->kv, a->stride, a->stride, copies);
    if (!rc)
        rc = fill_random_f32(g->d, (float *)a->q, qn, 3);
    return rc;
}

static void attention_free(gpubench *g, attention_args *a)
{
    ifkc_free(g->d, (void *)a->kv);
    ifkc_free(g->d, (void *)a->q);
    ifkc_free(g->d, a->out);
}

/* One decode token over n_pos cached positions: K and V bytes read per second. */
static void bench_attention_decode(gpubench *g, int kv_type, int n_pos, int kvh)
{
    char what[64];
    snprintf(what, sizeof what, "kv %s n_pos=%d kv_heads=%d", wtype_name(kv_type), n_pos, kvh);
    size_t bytes = 2 * kv_bytes(kv_type, n_pos, kvh);
    int copies = copies_for(bytes);
    attention_args a;
    double best, med;
    if (attention_setup(g, &a, kv_type, 1, n_pos, copies, kvh) ||
        time_calls(g, attention_decode_call, &a, copies, &best, &med)) {
        report_error(g, "attention_decode", what);
        goto out;
    }
    double gbps = bytes / best * 1e-9;
    printf("{\"bench\":\"attention_decode\",\"kv_type\":\"%s\",\"n_pos\":%d,\"heads\":%d,\"kv_heads\":%d,"
           "\"head_dim\":%d,\"tensor_cores\":%s,\"overlap\":%s,\"kv_bytes\":%zu,\"copies\":%d,\"us\":%.2f,"
           "\"us_median\":%.2f,\"kv_gbps\":%.1f,\"kv_gbps_median\":%.1f",
           wtype_name(kv_type), n_pos, ATT_HEADS, kvh, ATT_HEAD_DIM,
           ifkc_attention_decode_tensor_cores(kv_type, ATT_HEAD_DIM, ATT_HEADS / kvh) ? "true" : "false",
           g->overlap ? "true" : "false", bytes, copies, best * 1e6, med * 1e6, gbps, bytes / med * 1e-9);
    print_fraction(gbps, g->bw_gbps);
    printf("}\n");
    fflush(stdout);
out:
    attention_free(g, &a);
}

/* T causal queries from position 0: flops per second. */
static void bench_attention_prefill(gpubench *g, int kv_type, int T)
{
    char what[64];
    snprintf(what, sizeof what, "kv %s T=%d pos0=0", wtype_name(kv_type), T);
    attention_args a;
    double best, med, flop = 4.0 * (T * (T + 1.0) / 2) * ATT_HEADS * ATT_HEAD_DIM;
    if (attention_setup(g, &a, kv_type, T, T, 1, ATT_KV_HEADS) ||
        time_calls(g, attention_prefill_call, &a, 1, &best, &med)) {
        report_error(g, "attention_prefill", what);
        goto out;
    }
    printf("{\"bench\":\"attention_prefill\",\"kv_type\":\"%s\",\"T\":%d,\"pos0\":0,\"heads\":%d,"
           "\"kv_heads\":%d,\"head_dim\":%d,\"tensor_cores\":%s,\"us\":%.1f,\"us_median\":%.1f,\"tflops\":%.2f,"
           "\"tflops_median\":%.2f}\n",
           wtype_name(kv_type), T, ATT_HEADS, ATT_KV_HEADS, ATT_HEAD_DIM,
           ifkc_attention_prefill_tensor_cores(kv_type, ATT_HEAD_DIM, T) ? "true" : "false", best * 1e6, med * 1e6,
           flop / best * 1e-12, flop / med * 1e-12);
    fflush(stdout);
out:
    attention_free(g, &a);
}

/* ---- a decode step's operations ----------------------------------------------------------------- */

typedef struct {
    const char *name;
    int D, nq, nkv, hd, F, vocab;
} step_shape;

typedef struct {
    ifkc_dev *d;
    const step_shape *sh;
    int wtype, n_pos;
    float *x, *xb, *q, *kx, *vx, *att, *gate, *up, *logits, *norm_w;
    char *wq, *wk, *wv, *wo, *wg, *wu, *wd, *kc, *vc;
} step_args;

typedef int (*step_op)(step_args *a);

static int op_rmsnorm(step_args *a) { return ifkc_rmsnorm(a->d, a->xb, a->x, a->norm_w, 1, a->sh->D, 1e-5f); }
static int op_wq(step_args *a) { return ifkc_matmul(a->d, a->q, a->sh->nq * a->sh->hd, a->wq, a->wtype, a->xb, a->sh->D, 1, a->sh->nq * a->sh->hd, a->sh->D); }
static int op_wk(step_args *a) { return ifkc_matmul(a->d, a->kx, a->sh->nkv * a->sh->hd, a->wk, a->wtype, a->xb, a->sh->D, 1, a->sh->nkv * a->sh->hd, a->sh->D); }
static int op_wv(step_args *a) { return ifkc_matmul(a->d, a->vx, a->sh->nkv * a->sh->hd, a->wv, a->wtype, a->xb, a->sh->D, 1, a->sh->nkv * a->sh->hd, a->sh->D); }
static int op_rope_q(step_args *a) { return ifkc_rope(a->d, a->q, a->sh->nq * a->sh->hd, 1, a->sh->nq, a->sh->hd, a->sh->hd, a->n_pos - 1, 10000.0f, NULL, IFK_ROPE_HALF); }
static int op_rope_k(step_args *a) { return ifkc_rope(a->d, a->kx, a->sh->nkv * a->sh->hd, 1, a->sh->nkv, a->sh->hd, a->sh->hd, a->n_pos - 1, 10000.0f, NULL, IFK_ROPE_HALF); }
static int op_store_k(step_args *a) { int n = a->sh->nkv * a->sh->hd; return ifkc_kv_store(a->d, a->kc, IFK_F16, n, a->n_pos - 1, a->kx, n, 1, n); }
static int op_store_v(step_args *a) { int n = a->sh->nkv * a->sh->hd; return ifkc_kv_store(a->d, a->vc, IFK_F16, n, a->n_pos - 1, a->vx, n, 1, n); }
static int op_attention(step_args *a)
{
    return ifkc_attention_decode(a->d, a->att, a->q, a->kc, a->vc, IFK_F16, (size_t)a->sh->nkv * a->sh->hd, a->n_pos,
                                 a->sh->nq, a->sh->nkv, a->sh->hd, 1.0f / sqrtf((float)a->sh->hd));
}
static int op_wo(step_args *a) { return ifkc_matmul(a->d, a->xb, a->sh->D, a->wo, a->wtype, a->att, a->sh->nq * a->sh->hd, 1, a->sh->D, a->sh->nq * a->sh->hd); }
static int op_add(step_args *a) { return ifkc_add(a->d, a->x, a->xb, a->sh->D); }
static int op_gate(step_args *a) { return ifkc_matmul(a->d, a->gate, a->sh->F, a->wg, a->wtype, a->xb, a->sh->D, 1, a->sh->F, a->sh->D); }
static int op_up(step_args *a) { return ifkc_matmul(a->d, a->up, a->sh->F, a->wu, a->wtype, a->xb, a->sh->D, 1, a->sh->F, a->sh->D); }
static int op_silu(step_args *a) { return ifkc_silu_mul(a->d, a->gate, a->up, a->sh->F); }
static int op_down(step_args *a) { return ifkc_matmul(a->d, a->xb, a->sh->D, a->wd, a->wtype, a->gate, a->sh->F, 1, a->sh->D, a->sh->F); }
static int op_argmax(step_args *a) { return ifkc_argmax_start(a->d, a->logits, a->sh->vocab); }
static int op_rope_store(step_args *a)
{
    int nkv = a->sh->nkv, hd = a->sh->hd;
    return ifkc_rope_store(a->d, a->q, (size_t)a->sh->nq * hd, a->sh->nq, a->kx, a->vx, (size_t)nkv * hd, nkv, a->kc,
                           a->vc, IFK_F16, (size_t)nkv * hd, 1, hd, hd, a->n_pos - 1, 10000.0f, NULL, IFK_ROPE_HALF);
}
static int op_add_rmsnorm(step_args *a) { return ifkc_add_rmsnorm(a->d, a->x, a->xb, a->norm_w, 1, a->sh->D, 1e-5f); }
static int op_qkv(step_args *a)
{
    const step_shape *sh = a->sh;
    return ifkc_matmul_qkv(a->d, a->q, (size_t)sh->nq * sh->hd, a->kx, a->vx, (size_t)sh->nkv * sh->hd, a->wq, a->wk,
                           a->wv, a->wtype, a->xb, sh->D, 1, sh->nq * sh->hd, sh->nkv * sh->hd, sh->D);
}
static int op_glu(step_args *a)
{
    return ifkc_matmul_glu(a->d, a->gate, a->up, a->sh->F, a->wg, a->wu, a->wtype, a->xb, a->sh->D, 1, a->sh->F,
                           a->sh->D);
}

static const struct {
    const char *name;
    step_op fn;
} step_ops[] = {
    {"rmsnorm", op_rmsnorm}, {"wq", op_wq}, {"wk", op_wk}, {"wv", op_wv}, {"rope_q", op_rope_q},
    {"rope_k", op_rope_k}, {"store_k", op_store_k}, {"store_v", op_store_v}, {"attention", op_attention},
    {"wo", op_wo}, {"add", op_add}, {"rmsnorm", op_rmsnorm}, {"gate", op_gate}, {"up", op_up},
    {"silu_mul", op_silu}, {"down", op_down}, {"add", op_add},
};
#define N_STEP_OPS ((int)(sizeof step_ops / sizeof step_ops[0]))

/* The same layer with the fused ops the engine uses on a GPU. */
static const struct {
    const char *name;
    step_op fn;
} fused_ops[] = {
    {"rmsnorm", op_rmsnorm}, {"qkv", op_qkv}, {"rope_store", op_rope_store},
    {"attention", op_attention}, {"wo", op_wo}, {"add_rmsnorm", op_add_rmsnorm}, {"glu", op_glu},
    {"down", op_down}, {"add", op_add},
};
#define N_FUSED_OPS ((int)(sizeof fused_ops / sizeof fused_ops[0]))

static int layer_call(step_args *a)
{
    int rc = 0;
    for (int i = 0; i < N_STEP_OPS && !rc; i++)
        rc = step_ops[i].fn(a);
    return rc;
}

static int layer_fused_call(step_args *a)
{
    int rc = 0;
    for (int i = 0; i < N_FUSED_OPS && !rc; i++)
        rc = fused_ops[i].fn(a);
    return rc;
}

/* Host and device time of `reps` calls of fn (one op, or a layer of them: fn NULL), queued
 * behind `blocker` bytes of copies. Best of 5 for each. */
static int time_queued(step_args *a, step_op fn, int reps, char *blk, size_t blk_bytes, double *host_us,
                       double *gpu_us, int *queued)
{
    *host_us = *gpu_us = 1e30;
    *queued = 1;
    for (int round = 0; round < 5; round++) {
        int rc = ifkc_mark(a->d, 2);
        for (int c = 0; c < 4 && !rc; c++)
            rc = ifkc_copy(a->d, blk + blk_bytes / 2, blk, blk_bytes / 2);
        if (!rc)
            rc = ifkc_mark(a->d, 0);
        double t0 = bench_now();
        for (int i = 0; i < reps && !rc; i++)
            rc = fn ? fn(a) : layer_call(a);
        double host = bench_now() - t0;
        float gpu_ms = 0, blk_ms = 0;
        if (!rc)
            rc = ifkc_mark(a->d, 1);
        if (!rc)
            rc = ifkc_marks_ms(a->d, 0, 1, &gpu_ms);
        if (!rc)
            rc = ifkc_marks_ms(a->d, 2, 0, &blk_ms);
        if (rc)
            return rc;
        if (host * 1e3 > blk_ms)
            *queued = 0;
        if (host * 1e6 / reps < *host_us)
            *host_us = host * 1e6 / reps;
        if (gpu_ms * 1e3 / reps < *gpu_us)
            *gpu_us = gpu_ms * 1e3 / reps;
    }
    return 0;
}

static void print_op(const step_args *a, const char *op, double host_us, double gpu_us, int queued)
{
    printf("{\"bench\":\"ops\",\"shape\":\"%s\",\"wtype\":\"%s\",\"n_pos\":%d,\"op\":\"%s\",\"host_us\":%.2f,"
           "\"gpu_us\":%.2f,\"queued_behind\":%s}\n",
           a->sh->name, wtype_name(a->wtype), a->n_pos, op, host_us, gpu_us, queued ? "true" : "false");
    fflush(stdout);
}

static int step_alloc(ifkc_dev *d, char **p, size_t n, int wt, int N, int K)
{
    int rc = ifkc_malloc(d, (void **)p, n);
    if (!rc && wt >= 0)
        rc = fill_weights(d, *p, wt, N, K);
    else if (!rc)
        rc = fill_random_f32(d, (float *)*p, n / 4, (uint32_t)n);
    return rc;
}

/* *p (an N x K matrix of wt on the device) replaced by its warp tiles (ifkc_tile_pack). */
static int tile_matrix(ifkc_dev *d, char **p, int wt, int N, int K)
{
    size_t bytes = (size_t)N * row_bytes(wt, K);
    char *host = malloc(bytes), *t = NULL;
    int ptype, rc = host ? ifkc_download(d, host, *p, bytes) : -1;
    if (!rc)
        rc = ifkc_tile_pack(d, (void **)&t, &ptype, host, wt, N, K);
    free(host);
    if (!rc && !t)
        rc = -1; /* a shape the tiles do not take */
    if (rc)
        return rc;
    ifkc_free(d, *p);
    *p = t;
    return 0;
}

/* The layer's products again in warp tiles: each alone ("_tiled": the rounding of x to int8
 * included, one more launch each), the fused layer (its norms round x for qkv and GLU in their
 * own launch, as in a model), and with overlapped launches. */
static int bench_ops_tiled(gpubench *g, step_args *a, char *blk, size_t blk_bytes)
{
    const step_shape *sh = a->sh;
    const int wt = a->wtype, Q = sh->nq * sh->hd, KV = sh->nkv * sh->hd;
    int rc = tile_matrix(g->d, &a->wq, wt, Q, sh->D);
    rc = rc ? rc : tile_matrix(g->d, &a->wk, wt, KV, sh->D);
    rc = rc ? rc : tile_matrix(g->d, &a->wv, wt, KV, sh->D);
    rc = rc ? rc : tile_matrix(g->d, &a->wo, wt, sh->D, Q);
    rc = rc ? rc : tile_matrix(g->d, &a->wg, wt, sh->F, sh->D);
    rc = rc ? rc : tile_matrix(g->d, &a->wu, wt, sh->F, sh->D);
    rc = rc ? rc : tile_matrix(g->d, &a->wd, wt, sh->D, sh->F);
    if (rc)
        return rc;
    a->wtype = IFKC_TILED + wt;
    ifkc_tile_norm(g->d, wt); /* the norms round x for the qkv and GLU products, as in a model */
    static const struct {
        const char *name;
        step_op fn;
    } ops[] = {{"qkv_tiled", op_qkv}, {"wo_tiled", op_wo}, {"glu_tiled", op_glu}, {"down_tiled", op_down}};
    double host, gpu;
    int queued;
    for (int i = 0; i < 4 && !rc; i++)
        if (!(rc = time_queued(a, ops[i].fn, 100, blk, blk_bytes, &host, &gpu, &queued)))
            print_op(a, ops[i].name, host, gpu, queued);
    if (!rc && !(rc = time_queued(a, layer_fused_call, 10, blk, blk_bytes, &host, &gpu, &queued)))
        print_op(a, "layer_fused_tiled", host, gpu, queued);
    if (!rc && ifkc_set_overlap(g->d, 1)) {
        if (!(rc = time_queued(a, layer_fused_call, 10, blk, blk_bytes, &host, &gpu, &queued)))
            print_op(a, "layer_fused_tiled_overlap", host, gpu, queued);
        ifkc_set_overlap(g->d, 0);
    }
    a->wtype = wt;
    ifkc_tile_norm(g->d, 0);
    return rc;
}

static void bench_ops_shape(gpubench *g, const step_shape *sh, int wt, char *blk, size_t blk_bytes)
{
    step_args a = {.d = g->d, .sh = sh, .wtype = wt, .n_pos = 512};
    int Q = sh->nq * sh->hd, KV = sh->nkv * sh->hd, ctx = 4096;
    int rc = 0;
    struct { char **p; size_t n; int wt, N, K; } bufs[] = {
        {(char **)&a.x, (size_t)sh->D * 4, -1, 0, 0}, {(char **)&a.xb, (size_t)sh->D * 4, -1, 0, 0},
        {(char **)&a.q, (size_t)Q * 4, -1, 0, 0}, {(char **)&a.kx, (size_t)KV * 4, -1, 0, 0},
        {(char **)&a.vx, (size_t)KV * 4, -1, 0, 0}, {(char **)&a.att, (size_t)Q * 4, -1, 0, 0},
        {(char **)&a.gate, (size_t)sh->F * 4, -1, 0, 0}, {(char **)&a.up, (size_t)sh->F * 4, -1, 0, 0},
        {(char **)&a.logits, (size_t)sh->vocab * 4, -1, 0, 0}, {(char **)&a.norm_w, (size_t)sh->D * 4, -1, 0, 0},
        {&a.wq, (size_t)Q * row_bytes(wt, sh->D), wt, Q, sh->D}, {&a.wk, (size_t)KV * row_bytes(wt, sh->D), wt, KV, sh->D},
        {&a.wv, (size_t)KV * row_bytes(wt, sh->D), wt, KV, sh->D}, {&a.wo, (size_t)sh->D * row_bytes(wt, Q), wt, sh->D, Q},
        {&a.wg, (size_t)sh->F * row_bytes(wt, sh->D), wt, sh->F, sh->D}, {&a.wu, (size_t)sh->F * row_bytes(wt, sh->D), wt, sh->F, sh->D},
        {&a.wd, (size_t)sh->D * row_bytes(wt, sh->F), wt, sh->D, sh->F},
        {&a.kc, (size_t)ctx * KV * 2, -1, 0, 0}, {&a.vc, (size_t)ctx * KV * 2, -1, 0, 0},
    };
    int nb = (int)(sizeof bufs / sizeof bufs[0]);
    for (int i = 0; i < nb && !rc; i++)
        rc = step_alloc(g->d, bufs[i].p, bufs[i].n, bufs[i].wt, bufs[i].N, bufs[i].K);
    if (!rc)
        rc = ifkc_memset0(g->d, a.kc, (size_t)ctx * KV * 2);
    if (!rc)
        rc = ifkc_memset0(g->d, a.vc, (size_t)ctx * KV * 2);
    double host, gpu, lh = 0, lg = 0;
    int queued, all_queued = 1;
    for (int i = 0; i < N_STEP_OPS && !rc; i++) {
        if (!(rc = layer_call(&a)) && !(rc = time_queued(&a, step_ops[i].fn, 100, blk, blk_bytes, &host, &gpu, &queued))) {
            print_op(&a, step_ops[i].name, host, gpu, queued);
            lh += host, lg += gpu, all_queued &= queued;
        }
    }
    if (!rc) /* the sum of the ops alone, then the layer as one sequence */
        print_op(&a, "sum_of_ops", lh, lg, all_queued);
    if (!rc && !(rc = time_queued(&a, NULL, 10, blk, blk_bytes, &host, &gpu, &queued)))
        print_op(&a, "layer", host, gpu, queued);
    lh = lg = 0, all_queued = 1;
    for (int i = 0; i < N_FUSED_OPS && !rc; i++) { /* the fused ops alone (the others again) */
        if (!(rc = time_queued(&a, fused_ops[i].fn, 100, blk, blk_bytes, &host, &gpu, &queued))) {
            if (fused_ops[i].fn == op_qkv || fused_ops[i].fn == op_rope_store || fused_ops[i].fn == op_add_rmsnorm ||
                fused_ops[i].fn == op_glu)
                print_op(&a, fused_ops[i].name, host, gpu, queued);
            lh += host, lg += gpu, all_queued &= queued;
        }
    }
    if (!rc)
        print_op(&a, "sum_of_fused_ops", lh, lg, all_queued);
    if (!rc && !(rc = time_queued(&a, layer_fused_call, 10, blk, blk_bytes, &host, &gpu, &queued)))
        print_op(&a, "layer_fused", host, gpu, queued);
    if (!rc && ifkc_set_overlap(g->d, 1)) { /* the same with overlapped launches */
        if (!(rc = time_queued(&a, layer_fused_call, 10, blk, blk_bytes, &host, &gpu, &queued)))
            print_op(&a, "layer_fused_overlap", host, gpu, queued);
        ifkc_set_overlap(g->d, 0);
    }
    if (!rc && IFKC_TILE_TYPE(wt)) /* the products in warp tiles (IFLOW_CUDA_TILED=1) */
        rc = bench_ops_tiled(g, &a, blk, blk_bytes);
    if (!rc && !(rc = time_queued(&a, op_argmax, 100, blk, blk_bytes, &host, &gpu, &queued)))
        print_op(&a, "argmax_start", host, gpu, queued);
    if (!rc)
        for (a.n_pos = 1024; a.n_pos <= ctx && !rc; a.n_pos *= 4)
            if (!(rc = time_queued(&a, op_attention, 100, blk, blk_bytes, &host, &gpu, &queued)))
                print_op(&a, "attention", host, gpu, queued);
    if (rc) {
        char what[64];
        snprintf(what, sizeof what, "%s %s", sh->name, wtype_name(wt));
        report_error(g, "ops", what);
    }
    for (int i = 0; i < nb; i++)
        ifkc_free(g->d, *bufs[i].p);
}

static void run_ops(gpubench *g)
{
    static const step_shape shapes[] = {{"tinyllama-1.1b", 2048, 32, 4, 64, 5632, 32000},
                                        {"llama-2-7b", 4096, 32, 32, 128, 11008, 32000}};
    static const int types[] = {IFK_F16, IFK_Q4_B64};
    const size_t blk_bytes = (size_t)1 << 30; /* 4 copies of 512 MiB: about 1 ms on an H200 */
    char *blk = NULL;
    if (ifkc_malloc(g->d, (void **)&blk, blk_bytes) || ifkc_memset0(g->d, blk, blk_bytes)) {
        report_error(g, "ops", "allocating 1 GiB to queue behind");
        return;
    }
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < 2; t++)
            bench_ops_shape(g, &shapes[s], types[t], blk, blk_bytes);
    ifkc_free(g->d, blk);
}

/* ---- main -------------------------------------------------------------------------------------- */

static int wanted(const char *only, const char *name)
{
    return !only || !strcmp(only, name);
}

static void run_matvec(gpubench *g, int quick)
{
    static const int shapes[][2] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {32000, 4096}};
    static const int batched[] = {IFK_F16, IFK_Q8_B64, IFK_Q4_B64};
    static const int tiled[] = {IFK_Q4_B32, IFK_Q4_B64, IFK_Q8_B32, IFK_Q8_B64};
    int n_shapes = quick ? 2 : 4;
    for (int s = 0; s < n_shapes; s++) {
        for (int wt = IFK_F32; wt <= IFK_BF16; wt++)
            bench_matvec(g, wt, 1, shapes[s][0], shapes[s][1], 0);
        for (int wt = IFK_Q8_B32; wt < IFK_QTYPE_END_; wt++)
            bench_matvec(g, wt, 1, shapes[s][0], shapes[s][1], 0);
    }
    for (int s = 0; s < n_shapes; s++)
        for (int b = 0; b < 3; b++)
            bench_matvec(g, batched[b], 8, shapes[s][0], shapes[s][1], 0);
    /* Q4 and Q8 in warp tiles (IFLOW_CUDA_TILED=1: 16 level bytes a lane, int8 activations) */
    for (int s = 0; s < n_shapes; s++) {
        for (int b = 0; b < 4; b++)
            bench_matvec(g, tiled[b], 1, shapes[s][0], shapes[s][1], 1);
        bench_matvec(g, IFK_Q8_B64, 8, shapes[s][0], shapes[s][1], 1);
        bench_matvec(g, IFK_Q4_B64, 8, shapes[s][0], shapes[s][1], 1);
    }
    /* back-to-back products with overlapped launches (each fetches its rows while the one
     * before it finishes): what the gaps between kernels cost the figures above */
    if ((g->overlap = ifkc_set_overlap(g->d, 1))) {
        for (int s = 0; s < n_shapes; s++) {
            for (int b = 0; b < 3; b++)
                bench_matvec(g, batched[b], 1, shapes[s][0], shapes[s][1], 0);
            bench_matvec(g, IFK_Q8_B64, 1, shapes[s][0], shapes[s][1], 1);
            bench_matvec(g, IFK_Q4_B64, 1, shapes[s][0], shapes[s][1], 1);
        }
        g->overlap = ifkc_set_overlap(g->d, 0);
    }
}

static void run_prefill(gpubench *g, int quick)
{
    static const int shapes[][2] = {{4096, 4096}, {11008, 4096}};
    static const int types[] = {IFK_F16, IFK_BF16, IFK_F32, IFK_Q8_B64, IFK_Q4_B64};
    for (int s = 0; s < (quick ? 1 : 2); s++)
        for (int t = 0; t < 5; t++)
            bench_prefill(g, types[t], 512, shapes[s][0], shapes[s][1]);
}

static void run_attention_decode(gpubench *g, int quick)
{
    static const int ctx[] = {1024, 4096, 16384, 65536};
    static const int kv_types[] = {IFK_F16, IFK_F32};
    for (int t = 0; t < 2; t++)
        for (int c = 0; c < 4; c++)
            if (!quick || c % 2 == 0)
                bench_attention_decode(g, kv_types[t], ctx[c], ATT_KV_HEADS);
    /* Llama-2-7B's attention: no grouping, 32 KV heads (an F16 cache) */
    for (int c = 1; c < 3; c++)
        bench_attention_decode(g, IFK_F16, ctx[c], ATT_HEADS);
    /* grouped heads, F16, with overlapped launches (each call's chunks fetched into L2 while the
     * call before it finishes) */
    if ((g->overlap = ifkc_set_overlap(g->d, 1))) {
        for (int c = 0; c < 4; c++)
            if (!quick || c % 2 == 0)
                bench_attention_decode(g, IFK_F16, ctx[c], ATT_KV_HEADS);
        g->overlap = ifkc_set_overlap(g->d, 0);
    }
}

static int usage(void)
{
    fprintf(stderr, "usage: gpubench [--device N] [--only device|copy|matvec|prefill|attention_decode|"
                    "attention_prefill|ops] [--quick]\n");
    return 2;
}

int main(int argc, char **argv)
{
    int quick = 0, index = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            index = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else
            return usage();
    }
    static const char *const names[] = {"device", "copy", "matvec", "prefill", "attention_decode",
                                        "attention_prefill", "ops"};
    int known = !only;
    for (int i = 0; i < 7 && !known; i++)
        known = !strcmp(only, names[i]);
    if (!known)
        return usage();

    gpubench g = {.min_s = quick ? 0.1 : 0.5};
    if (ifkc_open(&g.d, index)) {
        fprintf(stderr, "gpubench: %s\n", ifkc_errmsg());
        return 1;
    }
    bench_device(&g, index); /* always: it names the machine the other lines were measured on */
    if (ifkc_make_current(g.d)) {
        fprintf(stderr, "gpubench: %s\n", ifkc_errmsg());
        return 1;
    }
    if (wanted(only, "copy") || wanted(only, "matvec") || wanted(only, "attention_decode"))
        bench_copy(&g);
    if (wanted(only, "matvec"))
        run_matvec(&g, quick);
    if (wanted(only, "prefill"))
        run_prefill(&g, quick);
    if (wanted(only, "attention_decode"))
        run_attention_decode(&g, quick);
    if (wanted(only, "attention_prefill"))
        bench_attention_prefill(&g, IFK_F16, 512);
    if (wanted(only, "ops"))
        run_ops(&g);
    ifkc_close(g.d);
    return g.failed;
}
