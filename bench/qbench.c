/*
 * qbench.c -- micro-benchmark of the quantized matrix product (ifk_qmatmul); one JSON object
 * per line on stdout.
 *
 *   qbench [--isa scalar|avx2|avx512|avx512gfni] [--threads N] [--no-single] [--type NAME]... [--shape NxK]...
 *          [--decode] [--hot] [--stack] [--quick] [--roof] [--activations int|int8|int16]
 *
 * decode:  T = 1 on the TinyLlama shapes (N x K = 2048x2048, 5632x2048, 2048x5632, 32000x2048,
 *          256x2048) at 1 thread (unless --no-single) and at --threads (default: all cores). GBps = bytes of the
 *          quantized weights / time. Each call reads the next of several copies of the matrix
 *          (>= 256 MiB in all), so the weights come from DRAM, as in a model. Each round of
 *          calls alternates with a round that only reads the same copies (a sum of 64-byte loads,
 *          as membw's read-only sum, on as many threads of the kernels' pool): read_GBps, and fraction = GBps /
 *          read_GBps, the share of the read bandwidth measured side by side with the product,
 *          so that other tenants' load, which drifts, weighs on both alike; fraction_paired is
 *          the median over rounds of the same share from a product round and the read round
 *          right after it (and _max its largest), steadier than best over best on a busy machine.
 * hot:     decode from cache instead (every call reads the same copy; the default shape is
 *          256x2048, which fits L2): how fast the kernel itself goes, in GB/s of weights. Far
 *          above the read bandwidth means that decode from DRAM is bound by the bandwidth, not by
 *          the kernel; and unlike timings from DRAM it hardly depends on other tenants' traffic.
 *          Only this is run.
 * stack:   decode through the TinyLlama-1.1B stack of one type (bench_stack: 22 layers x 7
 *          matrices and the output, each its own allocation, in the model's order), packed
 *          where this CPU has it: GBps of a token's pass. Only this is run.
 * prefill: T = 64 on 2048x2048 and 5632x2048; GFLOPs = 2 T N K / time.
 * Each type in the row layout ("layout":"rows"), then packed (qpack.h) where this CPU has it.
 * "x": how x was rounded ("int8" or "int16", qimpl.h's ifk_qx_int16); --activations int8 sets the
 * mode IFK_QX_INT8 (quant.h: int8 x for Q6 and Q5 too), int16 the mode IFK_QX_INT16 (int16 x for
 * Q8 too, which by default takes int8 x less each token's outliers, qimpl.h's split), int (the
 * default) leaves it.
 * roof:    the peak of vpdpbusd (int8), vpdpwssd (int16), FMA (F32) and, when the CPU has
 *          AVX512_BF16, vdpbf16ps (BF16) on 512-bit registers, and on the amx path tdpbf16ps
 *          (AMX tiles, BF16), in GOP/s (a multiply-add is 2), at
 *          1 thread and at --threads, when the CPU has VNNI: what the products' GFLOPs are
 *          fractions of. Only this is run.
 * Times: the best and the median of rounds (a decode round reads every copy once). Other
 * processes on the machine show up in the median first; compare best-of figures.
 *
 * Built by `make bench` (build/rel/qbench, linked with libiflow.a); bench.sh does not run it.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"
#include "kernels/cpu/bigmem.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/quant.h"

/* 64-byte aligned, or exit; large blocks in huge pages, as the CPU device allocates packed
 * weights (bigmem.h), so that decode from DRAM reads them as the engine does. */
static void *alloc64(size_t bytes) { return bench_need("qbench", ifk_bigmem_alloc(bytes), bytes); }

/* Deterministic pseudo-normal values (sum of 4 uniforms), scaled. */
static void fill(float *a, size_t n, uint32_t seed, float scale)
{
    for (size_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int j = 0; j < 4; j++) {
            seed = seed * 1664525u + 1013904223u;
            s += (float)(seed >> 8) / 16777216.0f;
        }
        a[i] = (s - 2.0f) * scale;
    }
}

/* A quantized [N][K] matrix of type: rows quantized from random floats; packed (qpack.h) when
 * ptype is a packed code. */
static uint8_t *make_matrix(int type, int ptype, int N, int K, uint32_t seed)
{
    size_t rb = ifk_qrow_bytes(type, K);
    uint8_t *W = alloc64((size_t)N * rb);
    float *row = malloc((size_t)K * sizeof *row);
    for (int n = 0; n < N; n++) {
        fill(row, (size_t)K, seed + (uint32_t)n * 7919u, 0.05f);
        ifk_quantize_row(W + (size_t)n * rb, type, row, K);
    }
    free(row);
    if (ptype == type)
        return W;
    uint8_t *P = alloc64(ifk_qpack_bytes(type, N, K));
    ifk_qpack(P, W, type, N, K);
    ifk_bigmem_free(W);
    return P;
}

/* The sum of bytes [n] (n a multiple of 512) as 64-bit words, read 64 bytes at a time with 8
 * accumulators (membw.c's read-only sum). */
__attribute__((target("avx512f"))) static long long read_sum(const uint8_t *p, size_t n)
{
    __m512i s[8];
    for (int k = 0; k < 8; k++)
        s[k] = _mm512_setzero_si512();
    for (size_t i = 0; i < n / 512; i++)
        for (int k = 0; k < 8; k++)
            s[k] = _mm512_add_epi64(s[k], _mm512_load_si512(p + 512 * i + 64 * k));
    for (int k = 1; k < 8; k++)
        s[0] = _mm512_add_epi64(s[0], s[k]);
    return _mm512_reduce_add_epi64(s[0]);
}

/* read_sum over bytes [n] on the kernels' thread pool (pool.h), as the product is dealt out:
 * items of `chunk` bytes (a multiple of 512), each into sums[i]. */
typedef struct {
    const uint8_t *p;
    size_t n, chunk;
    long long *sums;
} read_args;

static void read_item(const void *args, const void *in, int i, float *out)
{
    const read_args *a = args;
    size_t lo = (size_t)i * a->chunk, hi = lo + a->chunk < a->n ? lo + a->chunk : a->n;
    a->sums[i] = read_sum(a->p + lo, hi - lo);
}

static long long read_pool(const uint8_t *p, size_t n, int threads)
{
    long long sums[IFK_POOL_MAX_ITEMS], total = 0;
    int items = 8 * threads < IFK_POOL_MAX_ITEMS ? 8 * threads : IFK_POOL_MAX_ITEMS;
    read_args a = { p, n, (n / (size_t)items + 511) & ~(size_t)511, sums };
    items = (int)((n + a.chunk - 1) / a.chunk);
    ifk_pool_run(&(ifk_pool_job){ .run = read_item, .args = &a, .args_size = sizeof a, .n_items = items,
                                  .max_threads = threads });
    for (int i = 0; i < items; i++)
        total += sums[i];
    return total;
}

/* Bytes of an [N][K] matrix of type in layout ptype (type: rows; its packed code: qpack.h). */
static size_t matrix_bytes(int type, int ptype, int N, int K)
{
    return ptype == type ? (size_t)N * ifk_qrow_bytes(type, K) : ifk_qpack_bytes(type, N, K);
}

/* ptype: type, or its packed code (qpack.h). hot: one copy, read from cache. */
static void bench_decode(int type, int ptype, int N, int K, int threads, double min_s, int hot)
{
    size_t bytes = matrix_bytes(type, ptype, N, K);
    int copies = hot ? 1 : (int)((256u << 20) / bytes) + 1;
    uint8_t **W = alloc64((size_t)copies * sizeof *W);
    W[0] = make_matrix(type, ptype, N, K, 1);
    for (int c = 1; c < copies; c++) { /* copies of the first (quantizing is slow) */
        W[c] = alloc64(bytes);
        memcpy(W[c], W[0], bytes);
    }
    float *x = alloc64((size_t)K * 4);
    float *y = alloc64((size_t)N * 4);
    fill(x, (size_t)K, 99, 1.0f);
    for (int c = 0; c < copies; c++) /* warm-up: page faults, thread team, scratch */
        ifk_qmatmul(y, (size_t)N, W[c], ptype, x, (size_t)K, 1, N, K, threads);
    /* BENCH_ROUNDS' rule (at least 3 rounds and min_s of products), each product round followed
     * by a read-only round timed apart */
    static double t[BENCH_MAX_ROUNDS], ratio[BENCH_MAX_ROUNDS]; /* ratio: read time / product time, per pair */
    double best, med, read_best = 1e30, spent = 0.0;
    volatile long long sink = 0;
    const size_t read_bytes = bytes & ~(size_t)511; /* read_sum's unit */
    int n = 0;
    do {
        double t0 = bench_now();
        for (int c = 0; c < copies; c++)
            ifk_qmatmul(y, (size_t)N, W[c], ptype, x, (size_t)K, 1, N, K, threads);
        spent += t[n++] = bench_now() - t0;
        if (!hot) {
            t0 = bench_now();
            for (int c = 0; c < copies; c++)
                sink += read_pool(W[c], read_bytes, threads);
            double tr = bench_now() - t0;
            read_best = tr < read_best ? tr : read_best;
            ratio[n - 1] = tr / t[n - 1] * (double)bytes / (double)read_bytes;
        }
    } while (n < BENCH_MAX_ROUNDS && (n < 3 || spent < min_s));
    double frac_best = 0.0, frac_med = 0.0;
    if (!hot)
        bench_best_median(ratio, n, &frac_med, &frac_med), frac_best = ratio[n - 1];
    bench_best_median(t, n, &best, &med);
    (void)sink;
    best /= copies; /* per call */
    med /= copies;
    printf("{\"bench\":\"%s\",\"isa\":\"%s\",\"wtype\":\"%s\",\"layout\":\"%s\",\"x\":\"%s\",\"N\":%d,\"K\":%d,"
           "\"threads\":%d,\"us\":%.2f,\"GBps\":%.2f,\"GBps_median\":%.2f",
           hot ? "qdecode_hot" : "qdecode", ifk_isa_name(ifk_isa_current()), ifk_qtype(type)->name,
           ptype == type ? "rows" : "packed", ifk_qx_int16(type) ? "int16" : "int8", N, K, threads, best * 1e6, bytes / best * 1e-9, bytes / med * 1e-9);
    if (!hot) {
        double read_gbps = (double)read_bytes * copies / read_best * 1e-9;
        printf(",\"read_GBps\":%.2f,\"fraction\":%.3f,\"fraction_paired\":%.3f,\"fraction_paired_max\":%.3f", read_gbps,
               bytes / best * 1e-9 / read_gbps, frac_med, frac_best);
    }
    printf("}\n");
    fflush(stdout);
    for (int c = 0; c < copies; c++)
        ifk_bigmem_free(W[c]);
    ifk_bigmem_free(W);
    ifk_bigmem_free(x);
    ifk_bigmem_free(y);
}

static double roof_round(int op, double ops, int threads);

/* Decode through a TinyLlama-1.1B-shaped stack: 22 layers of 7 matrices (q, k, v, o, gate, up,
 * down) and the output matrix, each an allocation of its own as the engine's, multiplied in that
 * order with T = 1; one pass is a token's products. The matrices are copies of one per shape
 * (quantizing is slow; the bytes read are the same). GBps = the stack's bytes / a pass's time.
 * Unlike --decode, which reads copies of one shape back to back, this starts a new matrix as
 * often as a model does (what measured the decode streams of qdispatch.c's packed_streams). */
static void bench_stack(int type, int ptype, int threads, double min_s)
{
    enum { LAYERS = 22, PER = 7 };
    static const int shape[PER + 1][2] = { { 2048, 2048 }, { 256, 2048 }, { 256, 2048 }, { 2048, 2048 },
                                           { 5632, 2048 }, { 5632, 2048 }, { 2048, 5632 }, { 32000, 2048 } };
    const int n = LAYERS * PER + 1;
    uint8_t *proto[PER + 1], **W = alloc64((size_t)n * sizeof *W);
    size_t bytes[PER + 1];
    double total = 0.0;
    for (int s = 0; s <= PER; s++) {
        proto[s] = make_matrix(type, ptype, shape[s][0], shape[s][1], 7 + (uint32_t)s);
        bytes[s] = matrix_bytes(type, ptype, shape[s][0], shape[s][1]);
    }
    for (int i = 0; i < n; i++) {
        const int s = i == n - 1 ? PER : i % PER;
        W[i] = alloc64(bytes[s]);
        memcpy(W[i], proto[s], bytes[s]);
        total += (double)bytes[s];
    }
    float *x = alloc64(5632 * sizeof(float)), *y = alloc64(32000 * sizeof(float));
    fill(x, 5632, 5, 1.0f);
    static double t[BENCH_MAX_ROUNDS];
    double spent = 0.0, best, med;
    int r = 0;
    for (int pass = -1; pass < BENCH_MAX_ROUNDS && (pass < 3 || spent < min_s); pass++) {
        const double t0 = bench_now();
        for (int i = 0; i < n; i++) {
            const int s = i == n - 1 ? PER : i % PER;
            ifk_qmatmul(y, (size_t)shape[s][0], W[i], ptype, x, (size_t)shape[s][1], 1, shape[s][0], shape[s][1],
                        threads);
        }
        if (pass >= 0) /* pass -1: warm-up (page faults, scratch) */
            spent += t[r++] = bench_now() - t0;
    }
    bench_best_median(t, r, &best, &med);
    printf("{\"bench\":\"qstack\",\"isa\":\"%s\",\"wtype\":\"%s\",\"layout\":\"%s\",\"threads\":%d,\"MB\":%.1f,"
           "\"ms\":%.2f,\"GBps\":%.2f,\"GBps_median\":%.2f}\n",
           ifk_isa_name(ifk_isa_current()), ifk_qtype(type)->name, ptype == type ? "rows" : "packed", threads,
           total * 1e-6, best * 1e3, total / best * 1e-9, total / med * 1e-9);
    fflush(stdout);
    for (int i = 0; i < n; i++)
        ifk_bigmem_free(W[i]);
    for (int s = 0; s <= PER; s++)
        ifk_bigmem_free(proto[s]);
    ifk_bigmem_free(W);
    ifk_bigmem_free(x);
    ifk_bigmem_free(y);
}

/* Each product round is followed by a round of the roof of the instruction the type's product
 * runs on (vpdpwssd for int16 x, else vpdpbusd; as --roof) for about as many operations:
 * roof_fraction_paired is the median over rounds of the product's GFLOPs / that roof's, the
 * share of the roof measured beside it (steadier on a busy machine than two runs apart). */
static void bench_prefill(int type, int ptype, int T, int N, int K, int threads, double min_s)
{
    uint8_t *W = make_matrix(type, ptype, N, K, 7);
    float *x = alloc64((size_t)T * K * 4);
    float *y = alloc64((size_t)T * N * 4);
    fill(x, (size_t)T * K, 5, 1.0f);
    ifk_qmatmul(y, (size_t)N, W, ptype, x, (size_t)K, T, N, K, threads);
    static double t[BENCH_MAX_ROUNDS], share[BENCH_MAX_ROUNDS];
    double best, med, flop = 2.0 * T * N * K, spent = 0.0, share_med = 0.0, unused;
    int n = 0;
    __builtin_cpu_init();
    const int roof = __builtin_cpu_supports("avx512vnni"), op = ifk_qx_int16(type) ? 1 : 0;
    do {
        double t0 = bench_now();
        ifk_qmatmul(y, (size_t)N, W, ptype, x, (size_t)K, T, N, K, threads);
        spent += t[n] = bench_now() - t0;
        share[n] = roof ? roof_round(op, flop, threads) / t[n] : 0.0;
        n++;
    } while (n < BENCH_MAX_ROUNDS && (n < 3 || spent < min_s));
    bench_best_median(share, n, &unused, &share_med);
    bench_best_median(t, n, &best, &med);
    printf("{\"bench\":\"qprefill\",\"isa\":\"%s\",\"wtype\":\"%s\",\"layout\":\"%s\",\"x\":\"%s\",\"T\":%d,\"N\":%d,\"K\":%d,"
           "\"threads\":%d,\"us\":%.1f,\"GFLOPs\":%.1f,\"GFLOPs_median\":%.1f,\"roof_fraction_paired\":%.3f}\n",
           ifk_isa_name(ifk_isa_current()), ifk_qtype(type)->name, ptype == type ? "rows" : "packed",
           op ? "int16" : "int8", T, N, K, threads, best * 1e6,
           flop / best * 1e-9, flop / med * 1e-9, share_med);
    fflush(stdout);
    ifk_bigmem_free(W);
    ifk_bigmem_free(x);
    ifk_bigmem_free(y);
}

/* ---- the roof: peak vpdpbusd, vpdpwssd, FMA and vdpbf16ps throughput --------------------- */

#define ROOF_CHAINS 12 /* independent accumulators: more than latency x throughput */

/* iters x ROOF_CHAINS instructions of one kind on 512-bit registers, in independent chains;
 * returns a value that depends on every result (so that nothing is optimized away). */
#define ROOF_FN(name, isa, T, init, step, reduce)                                                 \
    __attribute__((target(isa), noinline)) static float name(long iters)                         \
    {                                                                                            \
        T a[ROOF_CHAINS];                                                                        \
        _Pragma("GCC unroll 12") for (int c = 0; c < ROOF_CHAINS; c++) a[c] = init;              \
        for (long i = 0; i < iters; i++)                                                         \
            _Pragma("GCC unroll 12") for (int c = 0; c < ROOF_CHAINS; c++) a[c] = step;          \
        float r = 0.0f;                                                                          \
        for (int c = 0; c < ROOF_CHAINS; c++)                                                    \
            r += (float)reduce(a[c]);                                                            \
        return r;                                                                                \
    }
ROOF_FN(roof_dpbusd, "avx512f,avx512bw,avx512vnni", __m512i, _mm512_set1_epi32(c),
        _mm512_dpbusd_epi32(a[c], _mm512_set1_epi8(3), _mm512_set1_epi8(-2)), _mm512_reduce_add_epi32)
ROOF_FN(roof_dpwssd, "avx512f,avx512bw,avx512vnni", __m512i, _mm512_set1_epi32(c),
        _mm512_dpwssd_epi32(a[c], _mm512_set1_epi16(3), _mm512_set1_epi16(-2)), _mm512_reduce_add_epi32)
ROOF_FN(roof_fma, "avx512f,avx512bw,avx512vnni", __m512, _mm512_set1_ps((float)c),
        _mm512_fmadd_ps(a[c], _mm512_set1_ps(1.0000001f), _mm512_set1_ps(-1e-7f)), _mm512_reduce_add_ps)
/* BF16 pairs (1, 2^-20): the sums grow by 2^-19 an instruction, as slowly as FMA's chains. */
ROOF_FN(roof_dpbf16, "avx512f,avx512bw,avx512bf16", __m512, _mm512_set1_ps((float)c),
        _mm512_dpbf16_ps(a[c], (__m512bh)_mm512_set1_epi32(0x35803f80), (__m512bh)_mm512_set1_epi32(0x35803f80)),
        _mm512_reduce_add_ps)

/* AMX tiles (the amx path, fpack_amx.c): iters x ROOF_CHAINS tdpbf16ps (16 x 16 outputs of
 * 32 BF16 pairs each, 16384 operations), four accumulators in turn. The thread's tiles are
 * configured here and released after. */
__attribute__((target("avx512f,amx-tile,amx-bf16"), noinline)) static float roof_tdpbf16(long iters)
{
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } __attribute__((aligned(64))) c = {.palette = 1};
    static const uint16_t ab[16 * 32] __attribute__((aligned(64))) = {0}; /* zeros: the sums stay finite */
    float out[16 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 8; i++)
        c.rows[i] = 16, c.colsb[i] = 64;
    _tile_loadconfig(&c);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ab, 64);
    _tile_loadd(5, ab, 64);
    _tile_loadd(6, ab, 64);
    _tile_loadd(7, ab, 64);
    for (long i = 0; i < iters * (ROOF_CHAINS / 4); i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
}

static float roof_loop(int op, long iters)
{
    return op == 0 ? roof_dpbusd(iters) : op == 1 ? roof_dpwssd(iters) : op == 2 ? roof_fma(iters)
           : op == 3 ? roof_dpbf16(iters) : roof_tdpbf16(iters);
}

/* roof_loop on `threads` threads at once; the sum of their results. */
static float roof_team(int op, long iters, int threads)
{
    float sum = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
    sum += roof_loop(op, iters);
    return sum;
}

/* One item of roof_round: roof_loop on the thread that runs it. */
typedef struct {
    int op;
    long iters;
    float *sink;
} roof_args;

static void roof_item(const void *args, const void *in, int i, float *out)
{
    const roof_args *a = args;
    a->sink[i] = roof_loop(a->op, a->iters);
}

/* Seconds that about `ops` operations of roof instruction op (0 vpdpbusd, 1 vpdpwssd) take on
 * `threads` threads of the kernels' pool, as the product runs (an OpenMP team beside the pool's
 * spinning workers measured far below the roof). */
static double roof_round(int op, double ops, int threads)
{
    static const double per_insn[] = { 128, 64 };
    float sink[IFK_POOL_MAX_ITEMS];
    roof_args a = { op, (long)(ops / (per_insn[op] * ROOF_CHAINS * threads)) + 1, sink };
    double t0 = bench_now();
    ifk_pool_run(&(ifk_pool_job){ .run = roof_item, .args = &a, .args_size = sizeof a, .n_items = threads,
                                  .max_threads = threads });
    return (bench_now() - t0) * ops / (per_insn[op] * ROOF_CHAINS * threads * (double)a.iters);
}

/* The peak of each kind of instruction, in GOP/s (a multiply-add is 2 operations), on every
 * thread at once: the ceiling the products' GFLOPs are fractions of. */
static void bench_roof(int threads, double min_s)
{
    static const char *names[] = { "vpdpbusd_int8", "vpdpwssd_int16", "vfmadd_f32", "vdpbf16ps_bf16", "tdpbf16ps_amx_bf16" };
    static const double ops_per_insn[] = { 128, 64, 32, 64, 16384 };
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512vnni"))
        return;
    const int n_ops = ifk_isa_detect() == IFK_ISA_AMX ? 5 : __builtin_cpu_supports("avx512bf16") ? 4 : 3;
    for (int op = 0; op < n_ops; op++) {
        const long iters = op == 4 ? 20000 : 2000000; /* a round of about 0.1 s on one core */
        double best, med;
        volatile float sink = 0.0f;
        BENCH_ROUNDS(min_s, &best, &med, sink += roof_team(op, iters, threads));
        double ops = ops_per_insn[op] * ROOF_CHAINS * (double)iters * threads;
        printf("{\"bench\":\"roof\",\"op\":\"%s\",\"threads\":%d,\"GOPs\":%.1f,\"GOPs_median\":%.1f}\n",
               names[op], threads, ops / best * 1e-9, ops / med * 1e-9);
        fflush(stdout);
        (void)sink;
    }
}

static int type_by_name(const char *s)
{
    for (int t = IFK_Q8_B32; t < IFK_QTYPE_END_; t++)
        if (!strcmp(ifk_qtype(t)->name, s))
            return t;
    return -1;
}

int main(int argc, char **argv)
{
    int threads = omp_get_num_procs(), quick = 0, roof = 0, stack = 0, decode_only = 0, hot = 0, single = 1, types[IFK_QTYPE_END_],
        n_types = 0;
    int shapes[16][2] = { { 2048, 2048 }, { 5632, 2048 }, { 2048, 5632 }, { 32000, 2048 }, { 256, 2048 } };
    int n_shapes = 5, own_shapes = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *s = argv[++i];
            int want = ifk_isa_by_name(s);
            if (want == -2) /* as before: an unknown name asks for avx512gfni */
                want = IFK_ISA_AVX512GFNI;
            if (ifk_set_isa(want) != want) {
                fprintf(stderr, "qbench: this CPU lacks %s\n", s);
                return 1;
            }
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--type") && i + 1 < argc && n_types < IFK_QTYPE_END_) {
            int t = type_by_name(argv[++i]);
            if (t < 0) {
                fprintf(stderr, "qbench: unknown type %s\n", argv[i]);
                return 1;
            }
            types[n_types++] = t;
        } else if (!strcmp(argv[i], "--shape") && i + 1 < argc && own_shapes < 16) {
            if (sscanf(argv[++i], "%dx%d", &shapes[own_shapes][0], &shapes[own_shapes][1]) != 2) {
                fprintf(stderr, "qbench: --shape NxK\n");
                return 1;
            }
            n_shapes = ++own_shapes;
        } else if (!strcmp(argv[i], "--no-single")) {
            single = 0;
        } else if (!strcmp(argv[i], "--decode")) {
            decode_only = 1;
        } else if (!strcmp(argv[i], "--hot")) {
            hot = decode_only = 1;
        } else if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--roof")) {
            roof = 1;
        } else if (!strcmp(argv[i], "--stack")) {
            stack = 1;
        } else if (!strcmp(argv[i], "--activations") && i + 1 < argc &&
                   (!strcmp(argv[i + 1], "int") || !strcmp(argv[i + 1], "int8") || !strcmp(argv[i + 1], "int16"))) {
            i++;
            ifk_set_qx_mode(!strcmp(argv[i], "int8") ? IFK_QX_INT8 : !strcmp(argv[i], "int16") ? IFK_QX_INT16 : IFK_QX_DEFAULT);
        } else {
            fprintf(stderr, "usage: qbench [--isa scalar|avx2|avx512] [--threads N] [--no-single] [--type NAME]... "
                            "[--shape NxK]... [--decode] [--hot] [--stack] [--quick] [--roof] [--activations int|int8|int16]\n");
            return 1;
        }
    }
    if (n_types == 0)
        for (int t = IFK_Q8_B32; t < IFK_QTYPE_END_; t++)
            types[n_types++] = t;
    const double min_s = quick ? 0.2 : 1.0;
    if (hot && !own_shapes)
        n_shapes = 1, shapes[0][0] = 256, shapes[0][1] = 2048;
    if (roof) {
        bench_roof(1, min_s);
        if (threads > 1)
            bench_roof(threads, min_s);
        return 0;
    }
    int thread_counts[2] = { 1, threads }, n_tc = threads > 1 ? 2 : 1, tc0 = single || threads == 1 ? 0 : 1;
    if (stack) {
        for (int ti = 0; ti < n_types; ti++) {
            const int ptype = ifk_qpack_type(types[ti]) ? ifk_qpack_type(types[ti]) : types[ti];
            for (int c = tc0; c < n_tc; c++)
                bench_stack(types[ti], ptype, thread_counts[c], min_s);
        }
        return 0;
    }
    for (int ti = 0; ti < n_types; ti++) {
        /* the row layout, then the packed one where this CPU has it */
        int layouts[2] = { types[ti], ifk_qpack_type(types[ti]) }, n_layouts = layouts[1] ? 2 : 1;
        for (int l = 0; l < n_layouts; l++) {
            for (int c = tc0; c < n_tc; c++)
                for (int s = 0; s < n_shapes; s++)
                    bench_decode(types[ti], layouts[l], shapes[s][0], shapes[s][1], thread_counts[c], min_s, hot);
            for (int c = tc0; c < n_tc && !decode_only; c++) {
                bench_prefill(types[ti], layouts[l], 64, 2048, 2048, thread_counts[c], min_s);
                if (!quick)
                    bench_prefill(types[ti], layouts[l], 64, 5632, 2048, thread_counts[c], min_s);
            }
        }
    }
    return 0;
}
