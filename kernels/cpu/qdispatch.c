/*
 * qdispatch.c -- the quantized matrix product and row lookup: picks a path, quantizes x once
 * per call into a per-thread scratch buffer, and deals out blocks of rows on the thread pool
 * (pool.h; an item a preempted worker holds is taken back, so a busy core costs little).
 *
 * Paths: IFK_ISA_AVX512GFNI uses qmatmul_avx512.c compiled a second time with GFNI
 * (qmatmul_avx512gfni.c; it differs in Q3H's unpacking); IFK_ISA_AVX512 uses qmatmul_avx512.c
 * when the CPU also has AVX512_VNNI (the int8 dot product, vpdpbusd), else the AVX2 path;
 * IFK_ISA_AVX2 uses qmatmul_avx2.c; the scalar path is the oracle of quant_ref.c. Built with
 * -DIFK_NO_SIMD, only the scalar path exists. Packed matrices (qpack.h) have kernels of their
 * own (packed_kernel): every type on the GFNI path of a CPU with AVX512_VBMI, Q4 and Q8 on the
 * VNNI paths and on the AVX2 path; elsewhere their rows are unpacked again.
 */
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/quant.h"

enum { QPATH_SCALAR, QPATH_AVX2, QPATH_AVX512, QPATH_AVX512GFNI };

#ifndef IFK_NO_SIMD
static int has_vnni(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
}

static int has_vbmi(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vbmi");
}
#endif

static int qpath(void)
{
#ifdef IFK_NO_SIMD
    return QPATH_SCALAR;
#else
    switch (ifk_isa_current()) {
    case IFK_ISA_AMX: /* AMX multiplies packed F16 / BF16 only (dispatch.c) */
    case IFK_ISA_AVX512GFNI: return QPATH_AVX512GFNI; /* implies VNNI */
    case IFK_ISA_AVX512: return has_vnni() ? QPATH_AVX512 : QPATH_AVX2;
    case IFK_ISA_AVX2: return QPATH_AVX2;
    default: return QPATH_SCALAR;
    }
#endif
}

/* ifk_set_qx_mode(): how quantized products meet the activations (quant.h). */
static _Atomic int qx_mode;

int ifk_set_qx_mode(int mode)
{
    if (mode != IFK_QX_F32 && mode != IFK_QX_INT8 && mode != IFK_QX_INT16)
        mode = IFK_QX_DEFAULT;
    return atomic_exchange_explicit(&qx_mode, mode, memory_order_relaxed);
}

int ifk_qx_mode(void) { return atomic_load_explicit(&qx_mode, memory_order_relaxed); }

int ifk_set_qx_f32(int on) { return ifk_set_qx_mode(on ? IFK_QX_F32 : IFK_QX_DEFAULT) == IFK_QX_F32; }

int ifk_qx_f32(void) { return ifk_qx_mode() == IFK_QX_F32; }

/* Whether `path` has vpdpbusd (AVX512_VNNI). */
static int path_vnni(int path)
{
    return path == QPATH_AVX512 || path == QPATH_AVX512GFNI;
}

/* Whether `type` on `path` meets int8 x although the accuracy rule (ifk_qx_x16) gives it int16:
 * on the paths with vpdpbusd, Q8 (the one of those types that splits) unless the mode is
 * IFK_QX_INT16, and Q6 and Q5 in the mode IFK_QX_INT8 (quant.h). The AVX2 path keeps int16: its
 * maddubs would saturate on Q8's levels. */
static int qx_int8_for_x16(int type, int path)
{
    const int mode = ifk_qx_mode();
    if (!ifk_qx_x16(type) || !path_vnni(path))
        return 0;
    return ifk_qx_splits(type) ? mode == IFK_QX_DEFAULT || mode == IFK_QX_INT8 : mode == IFK_QX_INT8;
}

/* int16 x for `type` on `path` in the current mode: the types of the rule (ifk_qx_x16), unless
 * they meet int8 x above. */
static int qx_int16_on(int type, int path)
{
    return ifk_qx_x16(type) && !qx_int8_for_x16(type, path);
}

/* Whether products of `type` on `path` take outliers out of int8 x (qimpl.h's split): Q8 and
 * Q4 wherever they meet int8 x on the AVX512_VNNI paths (qsplit_avx512.c). */
static int qx_split_on(int type, int path)
{
    return ifk_qx_splits(type) && path_vnni(path) && !qx_int16_on(type, path);
}

int ifk_qx_int16(int type) { return qx_int16_on(type, qpath()); }

int ifk_qx_split(int type, int K) { return qx_split_on(type, qpath()) ? ifk_qx_split_k(K) : 0; }

typedef IFK_DECL_QMATMUL_ROWS((*qrows_fn));

/* The kernel that multiplies packed matrices of base type `type` on the current path, or NULL
 * (their rows are then unpacked, 16 at a time): on the GFNI path of a CPU with AVX512_VBMI
 * every type's (qpack_avx512gfni.c), on the other VNNI paths Q4's and Q8's, and on the AVX2 path
 * Q4's and Q8's (qpack_avx2.c). */
static qrows_fn packed_kernel(int type)
{
#ifndef IFK_NO_SIMD
    const int path = qpath();
    if (path == QPATH_AVX512GFNI && has_vbmi())
        return ifk_avx512gfni_qmatmul_packed_rows;
    const int q4q8 = type == IFK_Q4_B32 || type == IFK_Q4_B64 || type == IFK_Q8_B32 || type == IFK_Q8_B64;
    if (path_vnni(path) && q4q8)
        return ifk_avx512_qmatmul_packed_rows;
    if (path == QPATH_AVX2 && q4q8) /* Q8 on int16 x there (qx_int8_for_x16) */
        return ifk_avx2_qmatmul_packed_rows;
#endif
    return NULL;
}

/* Bytes of software prefetch (into L2) ahead of the packed tiles a product reads from memory
 * (qx.ahead), for `type` and T tokens. With the tiles in huge pages (bigmem.h) one
 * thread's single forward stream for one token is read fastest by the hardware prefetchers
 * alone, and the software prefetch only gets in their way, on one thread or two; with several
 * tokens (each tile's bytes then take longer to use), and for Q6 and Q5, whose heavier
 * unpacking reads a tile out of order, 8 KiB ahead still helps. Measured on the development
 * machine (Zen 4; TinyLlama-1.1B shape; tok/s).
 * 2026-11-28, decode at 2 threads, none / 2 KiB / 8 KiB ahead, 4 alternating rounds: Q8_B64
 * 43-45 / 45-46 / 35-36, Q4_B64 55-74 / 57-70 / 62 (7 of 8 rounds best with none), Q4_B32
 * 48-64 against 46-57 with 8 KiB (6 pairs), Q6 36 / 37 / 36, Q3H 71-73 against 71-75, Q2 even;
 * 1 thread: Q4_B64 48-50 / 42-44 / 37-38, Q8_B64 27-28 / 27-28 / 19-20, Q6 21-22 / 21 / 26.
 * (The day before, two threads read better with 8 KiB, below: the host's other tenants move
 * what this VM's two cores can read, 30 GB/s then, 42-49 now.) Batched decode and prefill keep
 * it: 2 threads, 4 / 16 streams, none against 8 KiB, Q4_B64 135-141 / 188-191 against 167-191 /
 * 212-214; prefill of 128 tokens 3-4 % faster with it at 1 thread.
 * 2026-11-27 (median of 3-4 alternating runs):
 *   decode, 1 / 2 threads, 8 KiB ahead -> none: Q8_B64 20.5 / 30.6 -> 24.0 / 29.2, Q4_B64
 *   37.8 / 60.4 -> 48.0 / 54.7, Q4_B32 31.9 / 55.0 -> 42.2 / 47.3, Q8_B32 19.1 / 26.3 -> 24.9 /
 *   28.5, Q6 25.4 / 38.6 -> 20.0 / 33.4, Q5 34.5 / 55.7 -> 29.7 / 41.0; Q3H, Q3 and Q2 within
 *   the noise at 1 thread;
 *   batched decode at 1 thread, 1 / 4 / 16 streams, none -> 8 KiB ahead (batchbench, 2 runs):
 *   Q4_B64 49-51 / 80-89 / 120-124 -> 31-35 / 127-143 / 144-147, Q8_B64 25-26 / 62-64 / 81 ->
 *   18 / 64-65 / 99-100.
 * (Into L2, prefetcht1: in 4 KiB pages on a loaded machine, L1 measured worse, most for Q6 and
 * Q5.) IFLOW_PACK_AHEAD=BYTES in the environment overrides the rule (to measure it again
 * elsewhere).
 * Intel cores want the prefetch for decode too, every type: measured on an Intel Xeon (family 6,
 * model 207, Emerald Rapids; 2 vCPUs, `membw` one stream 12.5 GB/s a thread, 4 streams 17.4),
 * 2026-11-28, decode tok/s at 1 / 2 threads, none against 4 / 8 / 16 KiB ahead, 2 rounds each:
 * Q4_B64 13.3-15.2 / 24.5-27.5 against 17.8-22.1 / 29.0-37.5, Q8_B64 10.3-10.4 / 18.9-21.9 against
 * 10.3-13.2 / 20.8-24.6, Q4_B32 13.1-14.2 / 24.7-26.1 against 16.6-21.0 / 29.6-37.5, Q8_B32
 * 10.9-12.2 / 19.7-21.6 against 10.4-14.2 / 20.1-26.4, Q6 10.2-11.7 / 19.8-22.0 against 14.6-16.7 /
 * 24.4-31.2, Q5 12.4-12.9 / 20.7-21.5 against 16.6-18.3 / 27.4-31.5, Q3H 15.4-16.3 / 29.1-29.4
 * against 18.0-23.0 / 35.5-39.5, Q2 19.5-20.4 / 31.0-36.8 against 28.3-32.4 / 42.6-60.1: every
 * distance beats none, and none of the three beats the others beyond the noise. (Its L2 streamer
 * keeps fewer lines of one stream in flight than Zen 4's: one stream reads 0.72 of four.) */
static int cpu_is_intel(void)
{
#ifdef IFK_NO_SIMD
    return 0;
#else
    __builtin_cpu_init();
    return __builtin_cpu_is("intel");
#endif
}

/* The integer in the environment variable `name` (an override, to measure a rule again), read
 * once into *cache (-2 until then), or -1 when unset, empty or negative. */
static int env_override(const char *name, int *cache)
{
    if (*cache == -2) {
        const char *e = getenv(name);
        const int v = e && *e ? atoi(e) : -1;
        *cache = v < 0 ? -1 : v;
    }
    return *cache;
}

static int packed_ahead(int type, int T)
{
    static int env = -2;
    if (env_override("IFLOW_PACK_AHEAD", &env) >= 0)
        return env / 64 * 64;
    return T > 1 || type == IFK_Q6_B64 || type == IFK_Q5_B64 || cpu_is_intel() ? 8192 : 0;
}

/* Groups a packed product reads side by side (qx.streams) for T tokens: two for decode on
 * Intel cores, else one. There one thread's single stream, even with the prefetch above, keeps
 * too few lines in flight (membw: one stream a thread 12.5 GB/s, four 17.4); with two groups
 * advancing block by block the L2 streamer follows two streams. Measured on the Xeon (model 207),
 * 2026-11-28, 8 KiB ahead, GB/s, one stream against two: the TinyLlama-1.1B stack of packed
 * Q4_B64 matrices at 1 thread, alternating rounds, 10.0-14.3 against 11.9-15.7 (two ahead in 13
 * of 14 rounds, means 12.2 / 14.1; four streams 8.8-15.1, no better); `qbench --stack`, 4 rounds,
 * 1 / 2 threads: Q4_B64 11.7-15.6 / 23.1-27.5 against 11.6-16.6 / 25.2-31.0, Q8_B64 12.3-15.7 /
 * 24.9-29.3 against 13.1-17.4 / 27.2-29.8 (two ahead in 12 of 16 pairs; Q4_B64 at 1 thread
 * even). Whole models (iflow-bench) even within this host's noise (23-25 / 38-42 tok/s both).
 * IFLOW_PACK_STREAMS=1..4 overrides. */
static int packed_streams(int T)
{
    static int env = -2;
    const int v = env_override("IFLOW_PACK_STREAMS", &env);
    if (T != 1)
        return 1;
    return v >= 1 ? (v > 4 ? 4 : v) : cpu_is_intel() ? 2 : 1;
}

int ifk_qpath_packed(int type)
{
    return ifk_qtype(type) && packed_kernel(type);
}

/* ---- per-thread scratch (impl.h): the quantized x here, the BF16 x in dispatch.c ---------- */

static _Thread_local void *scratch;       /* 64-byte aligned, never shrinks */
static _Thread_local size_t scratch_bytes;

/* A thread's scratch is freed when the thread ends (the engine runs the parts of a split layer
 * on threads of their own, one per sub-block: without this each would leak its scratch). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;
static void scratch_key_init(void) { scratch_key_ok = pthread_key_create(&scratch_key, free) == 0; }

void *ifk_thread_scratch(size_t bytes)
{
    if (bytes > scratch_bytes) {
        size_t want = (bytes + 4095) & ~(size_t)4095;
        void *p = aligned_alloc(64, want);
        if (!p)
            return NULL;
        free(scratch);
        scratch = p;
        scratch_bytes = want;
        pthread_once(&scratch_once, scratch_key_init);
        if (scratch_key_ok)
            pthread_setspecific(scratch_key, p);
    }
    return scratch;
}

/* Room of su (qimpl.h's split): every token's k outliers, at most K distinct ones. */
static int qx_nu_max(int k, int T, int K)
{
    return (size_t)T * k < (size_t)K ? T * k : K;
}

/* Lays qx out for T tokens of K inputs of `type` from `base` (64-byte aligned), as int16 values
 * when x16 (qx_int16_on) else int8, with room for k outliers a token (the split; 0: none);
 * returns the bytes it spans, all that the product's items read. base NULL: only the size. */
static size_t qx_layout(ifk_qx *qx, int type, int x16, int k, int T, int K, char *base)
{
    const ifk_qtype_info *t = ifk_qtype(type);
    qx->type = type;
    qx->B = t->block;
    qx->nb = (K + t->block - 1) / t->block;
    qx->K = K;
    qx->T = T;
    qx->x16 = x16;
    qx->q_ld = ((size_t)qx->nb * t->block * (qx->x16 ? 2 : 1) + 63) & ~(size_t)63;
    qx->s_ld = ((size_t)qx->nb + 15) & ~(size_t)15;
    size_t qbytes = (size_t)T * qx->q_ld, sbytes = (size_t)T * qx->s_ld * sizeof(float);
    qx->q = base ? (int8_t *)base : NULL;
    qx->s0 = base ? (float *)(base + qbytes) : NULL;
    qx->s1 = base ? (float *)(base + qbytes + sbytes) : NULL;
    qx->sum = base ? (float *)(base + qbytes + 2 * sbytes) : NULL;
    qx->cor = base ? (float *)(base + qbytes + 3 * sbytes) : NULL;
    qx->blk = base ? (float *)(base + qbytes + 4 * sbytes) : NULL;
    const size_t tk = (size_t)T * k, nu_max = (size_t)qx_nu_max(k, T, K);
    char *sp = base ? base + qbytes + 8 * sbytes : NULL;
    qx->k = k;
    qx->nu = 0;
    qx->sval = sp ? (float *)sp : NULL;
    qx->spos = sp ? (int32_t *)(sp + 4 * tk) : NULL;
    qx->su = sp ? (int32_t *)(sp + 8 * tk) : NULL;
    qx->ahead = 0;
    qx->streams = 1;
    return qbytes + 8 * sbytes + ((4 * (2 * tk + nu_max) + 63) & ~(size_t)63);
}

/* Scratch of the split beside qx (not read by the items): x with the outliers set to 0,
 * [T][K] floats, and K ints for building su. */
static size_t qx_split_work(int k, int T, int K)
{
    return k ? ((size_t)T * K + (size_t)K) * sizeof(float) : 0;
}

void ifk_qx_finish(const ifk_qx *qx, int t)
{
    const size_t st = (size_t)t * qx->s_ld;
    const float *s0 = qx->s0 + st, *s1 = qx->s1 + st, *sum = qx->sum + st;
    float *cor = qx->cor + st, *bk = qx->blk + 4 * st; /* [s_ld], [s_ld][4] */
    const float c = 0.5f * (float)(ifk_qtype(qx->type)->levels - 1);
    for (size_t b = 0; b < qx->s_ld; b++) {
        /* cor holds s0 X0 + s1 X1 from the path's quantize (int8 x, b < nb) */
        cor[b] = !qx->x16 && b < (size_t)qx->nb ? c * (sum[b] - cor[b]) : 0.0f;
        bk[4 * b] = s0[b];
        bk[4 * b + 1] = sum[b];
        bk[4 * b + 2] = s1[b];
        bk[4 * b + 3] = cor[b];
    }
}

/* Lays qx out in the caller's scratch; 0 if out of memory. *bytes: its size. */
static int qx_init(ifk_qx *qx, int type, int x16, int k, int T, int K, size_t *bytes)
{
    *bytes = qx_layout(qx, type, x16, k, T, K, NULL);
    char *p = ifk_thread_scratch(*bytes + qx_split_work(k, T, K));
    if (!p)
        return 0;
    qx_layout(qx, type, x16, k, T, K, p);
    return 1;
}

#ifndef IFK_NO_SIMD
/* After every token's outliers were picked (spos holding their i): su, the i that any token
 * took out, ascending, and spos turned into places in su. mark: [K] ints of scratch. */
static void qx_split_union(ifk_qx *qx, int32_t *mark)
{
    const size_t tk = (size_t)qx->T * qx->k;
    int nu = 0;
    if (tk <= 64) { /* few: insertion into su */
        for (size_t j = 0; j < tk; j++) {
            const int32_t i = qx->spos[j];
            if (i < 0) /* an unused entry: stays -1 */
                continue;
            int p = 0;
            while (p < nu && qx->su[p] < i)
                p++;
            if (p < nu && qx->su[p] == i)
                continue;
            memmove(qx->su + p + 1, qx->su + p, (size_t)(nu - p) * sizeof *qx->su);
            qx->su[p] = i;
            nu++;
        }
        for (size_t j = 0; j < tk; j++) {
            int p = 0;
            if (qx->spos[j] < 0)
                continue;
            while (qx->su[p] != qx->spos[j])
                p++;
            qx->spos[j] = p;
        }
    } else {
        memset(mark, 0xFF, (size_t)qx->K * sizeof *mark);
        for (size_t j = 0; j < tk; j++)
            if (qx->spos[j] >= 0)
                mark[qx->spos[j]] = 0;
        for (int i = 0; i < qx->K; i++)
            if (mark[i] == 0) {
                mark[i] = nu;
                qx->su[nu++] = i;
            }
        for (size_t j = 0; j < tk; j++)
            if (qx->spos[j] >= 0)
                qx->spos[j] = mark[qx->spos[j]];
    }
    qx->nu = nu;
}

/* Whether the packed kernel of `type` wants int8 x in the int16 pair order: the packed Q8, Q6
 * and Q5 tiles hold a row's 4 levels of a dword as elements 0 2 1 3 (qpack.h), which vpdpbusd
 * meets with x's bytes permuted the same way. */
static int qx_wants_pair_order(const ifk_qx *qx, int packed)
{
    return packed && !qx->x16 && ifk_qx_x16(qx->type);
}

/* Tokens t0 <= t < t1 of int8 x put in the int16 pair order: bytes 1 and 2 of every dword
 * swapped (within a run of 4, so the groups, sums and scales stay as they are). */
static void qx_pair_order(const ifk_qx *qx, int t0, int t1)
{
    const size_t words = qx->q_ld / 4;
    for (int t = t0; t < t1; t++) {
        uint32_t *q = (uint32_t *)(qx->q + (size_t)t * qx->q_ld); /* 64-byte aligned */
        for (size_t i = 0; i < words; i++) {
            const uint32_t v = q[i];
            q[i] = (v & 0xFF0000FFu) | ((v >> 8) & 0x0000FF00u) | ((v << 8) & 0x00FF0000u);
        }
    }
}
#endif

/* ---- entry points ------------------------------------------------------------------------ */

/* Threads for `work` multiply-adds: the request (all cores when <= 0), but no more than one
 * per ~64K multiply-adds (as ifk_matmul). */
static int threads_for(int n_threads, double work)
{
    int nt = n_threads > 0 ? n_threads : omp_get_num_procs();
    double cap = work / 65536.0;
    if (cap < nt)
        nt = cap < 1.0 ? 1 : (int)cap;
    return nt;
}

/* The oracle, threaded. */
typedef struct {
    float *y;
    size_t ldy;
    const void *W;
    const float *x;
    size_t ldx;
    int type, T, N, K, rpi;
} qref_args;

static void qref_run(const void *args, const void *in, int i, float *out)
{
    const qref_args *a = args;
    int n0 = i * a->rpi, n1 = n0 + a->rpi < a->N ? n0 + a->rpi : a->N;
    ifk_qmatmul_ref_rows(a->y, a->ldy, a->W, a->type, a->x, a->ldx, a->T, n0, n1, a->K);
}

#ifndef IFK_NO_SIMD
/* ---- the SIMD product on the pool (pool.h) ----------------------------------------------- *
 * x is quantized once (tokens split between threads when there are many), then items of rpi
 * rows (a multiple of 16) are dealt out. An item may be stolen: run into a worker's scratch
 * ([T][n1 - n0]) with W shifted to its first row, then copied into y by commit. */
typedef struct {
    IFK_DECL_QMATMUL_ROWS((*rows));
    float *y;
    size_t ldy;
    const char *W;    /* [N][row_bytes], or a packed copy */
    size_t row_bytes;
    int type, x16, T, N, K;
    int rpi;          /* rows per item */
    int k, nu, packed;/* the split (qx's k and nu; k = 0: none) */
    int ahead, streams; /* qx's */
} qmm_args;

/* Rows n0 <= n < n1 of the int8 product (n0 a multiple of 16), then the split's F32 columns
 * (qimpl.h) where some token took outliers out: 64 rows at a time, so that the split decodes
 * its columns from the tiles the product has just read, in cache (for the whole of a large
 * matrix at once they came from memory again, one line a column: Q4_B64 prefill 8 % slower). */
static void rows_and_split(qrows_fn rows, float *y, size_t ldy, const void *W, int packed, const ifk_qx *qx, int n0,
                           int n1)
{
    enum { CHUNK = 64 };
    if (!qx->k || !qx->nu) {
        rows(y, ldy, W, qx, n0, n1);
        return;
    }
    for (int n = n0; n < n1; n += CHUNK) {
        const int e = n1 - n < CHUNK ? n1 : n + CHUNK;
        rows(y, ldy, W, qx, n, e);
        ifk_avx512_qsplit_rows(y, ldy, W, packed, qx, n, e);
    }
}

static void qmm_range(const qmm_args *a, int i, int *n0, int *n1)
{
    *n0 = i * a->rpi;
    *n1 = *n0 + a->rpi < a->N ? *n0 + a->rpi : a->N;
}

static void qmm_run(const void *args, const void *in, int i, float *out)
{
    const qmm_args *a = args;
    ifk_qx qx;
    qx_layout(&qx, a->type, a->x16, a->k, a->T, a->K, (char *)in); /* in: the quantized x */
    const int nu_max = qx_nu_max(a->k, a->T, a->K); /* su's room (a stale item: pool.h) */
    qx.nu = a->nu < nu_max ? a->nu : nu_max;
    qx.ahead = a->ahead;
    qx.streams = a->streams;
    int n0, n1;
    qmm_range(a, i, &n0, &n1);
    if (!out)
        rows_and_split(a->rows, a->y, a->ldy, a->W, a->packed, &qx, n0, n1);
    else
        rows_and_split(a->rows, out, (size_t)(n1 - n0), a->W + (size_t)n0 * a->row_bytes, a->packed, &qx, 0, n1 - n0);
}

static void qmm_commit(const void *args, int i, const float *out)
{
    const qmm_args *a = args;
    int n0, n1;
    qmm_range(a, i, &n0, &n1);
    ifk_pool_copy_rows(a->y, a->ldy, n0, out, a->T, n1 - n0);
}

/* Quantizing x: items of tokens, in place. */
typedef struct {
    IFK_DECL_QX_QUANTIZE((*quantize));
    const float *x;
    size_t ldx;
    ifk_qx qx;
    int T, per;
    int pair_order;   /* qx_pair_order after quantizing */
    float *xm;        /* the split: [T][K], x less its outliers (qx.k > 0) */
} qxq_args;

/* Tokens t0 <= t < t1 of x quantized into a->qx (and put in the pair order when asked); with
 * the split, each token's outliers picked first and x less them quantized. */
static void qxq_tokens(const qxq_args *a, int t0, int t1)
{
    const ifk_qx *qx = &a->qx;
    if (qx->k) {
        const size_t K = (size_t)qx->K;
        for (int t = t0; t < t1; t++)
            ifk_avx512_qsplit_pick(a->x + (size_t)t * a->ldx, qx->K, qx->k, a->xm + t * K, qx->spos + (size_t)t * qx->k,
                                   qx->sval + (size_t)t * qx->k);
        a->quantize(qx, a->xm, K, t0, t1);
    } else {
        a->quantize(qx, a->x, a->ldx, t0, t1);
    }
    if (a->pair_order)
        qx_pair_order(qx, t0, t1);
}

static void qxq_run(const void *args, const void *in, int i, float *out)
{
    const qxq_args *a = args;
    int t0 = i * a->per, t1 = t0 + a->per < a->T ? t0 + a->per : a->T;
    qxq_tokens(a, t0, t1);
}
#endif

#ifndef IFK_NO_SIMD
/* ---- the F32-activation path (ifk_set_qx_f32) --------------------------------------------- *
 * Items of rpi rows, as for the int8 product; an item decodes its rows 16 at a time into the
 * thread's scratch ([16][K] F32, after [16][row bytes] for a packed matrix's rows unpacked)
 * and multiplies them with the path's F32 product (impl.h), so x is never rounded. */
typedef struct {
    float *y;
    size_t ldy, ldx;
    const char *W;    /* [N][row_bytes], or a packed copy (qpack.h) */
    size_t row_bytes;
    int type, packed; /* the base type; packed: W is IFK_QPACKED + type */
    int T, N, K, rpi;
} qf_args;

/* Rows n0 <= n < n1 (n0 a multiple of 16) into y[t][n - n0] at stride ldy; 0 if out of memory. */
static int qf_rows(const qf_args *a, float *y, size_t ldy, const float *x, int n0, int n1)
{
    const size_t K = (size_t)a->K, unpacked = a->packed ? 16 * a->row_bytes : 0;
    char *buf = ifk_thread_scratch(unpacked + 16 * K * sizeof(float) + 64);
    if (!buf)
        return 0;
    float *wf = (float *)(buf + ((unpacked + 63) & ~(size_t)63)); /* [16][K] */
    for (int n = n0; n < n1; n += 16) {
        const int nb = n1 - n < 16 ? n1 - n : 16;
        const char *rows = a->W + (size_t)n * a->row_bytes;
        if (a->packed) {
            ifk_qunpack_rows(buf, a->W, IFK_QPACKED + a->type, n, n + nb, a->K);
            rows = buf;
        }
        for (int r = 0; r < nb; r++)
            ifk_qget_row(wf + r * K, rows, a->type, (size_t)r, a->K);
        ifk_path_matmul_rows(y + (n - n0), ldy, wf, IFK_F32, x, a->ldx, a->T, 0, nb, a->K);
    }
    return 1;
}

static void qf_range(const qf_args *a, int i, int *n0, int *n1)
{
    *n0 = i * a->rpi;
    *n1 = *n0 + a->rpi < a->N ? *n0 + a->rpi : a->N;
}

static void qf_run(const void *args, const void *in, int i, float *out)
{
    const qf_args *a = args;
    int n0, n1;
    qf_range(a, i, &n0, &n1);
    float *y = out ? out : a->y + n0;
    size_t ldy = out ? (size_t)(n1 - n0) : a->ldy;
    if (!qf_rows(a, y, ldy, in, n0, n1)) /* out of memory for 16 rows: zeros, as for a bad type */
        for (int n = n0; n < n1; n += 16) {
            const int nb = n1 - n < 16 ? n1 - n : 16;
            for (int t = 0; t < a->T; t++)
                memset(y + (size_t)t * ldy + (n - n0), 0, (size_t)nb * sizeof *y);
        }
}

static void qf_commit(const void *args, int i, const float *out)
{
    const qf_args *a = args;
    int n0, n1;
    qf_range(a, i, &n0, &n1);
    ifk_pool_copy_rows(a->y, a->ldy, n0, out, a->T, n1 - n0);
}

static void qmatmul_f32(float *y, size_t ldy, const void *W, int type, int packed, const float *x, size_t ldx,
                        int T, int N, int K, int nt)
{
    qf_args a = {y, ldy, ldx, W, ifk_qrow_bytes(type, K), type, packed, T, N, K, ifk_pool_rows_per_item(N, nt)};
    ifk_pool_run(&(ifk_pool_job){.run = qf_run, .commit = qf_commit, .args = &a, .args_size = sizeof a,
                                 .input = x, .input_size = ((size_t)(T - 1) * ldx + (size_t)K) * sizeof(float),
                                 .scratch_floats = (size_t)T * a.rpi, .n_items = (N + a.rpi - 1) / a.rpi,
                                 .max_threads = nt});
}
#endif

/* y = 0 for T rows of N: what a product the kernels cannot compute gives. */
static void zero_y(float *y, size_t ldy, int T, int N)
{
    for (int t = 0; t < T; t++)
        memset(y + (size_t)t * ldy, 0, (size_t)N * sizeof *y);
}

/* A packed matrix (qpack.h) on a path that does not read it (the ISA forced lower after
 * packing): rows unpacked to the row layout, a block of 16 at a time. */
static void qmatmul_unpacked(float *y, size_t ldy, const void *P, int ptype, const float *x, size_t ldx, int T, int N,
                             int K, int n_threads)
{
    const int type = ifk_qpack_base(ptype);
    const size_t rb = ifk_qrow_bytes(type, K);
    void *rows = malloc(16 * rb);
    if (!rows) { /* cannot happen in practice: 16 rows; give zeros, as for a bad type */
        zero_y(y, ldy, T, N);
        return;
    }
    for (int n = 0; n < N; n += 16) {
        int n1 = n + 16 < N ? n + 16 : N;
        ifk_qunpack_rows(rows, P, ptype, n, n1, K);
        ifk_qmatmul(y + n, ldy, rows, type, x, ldx, T, n1 - n, K, n_threads);
    }
    free(rows);
}

void ifk_qmatmul(float *y, size_t ldy, const void *W, int type, const float *x, size_t ldx,
                 int T, int N, int K, int n_threads)
{
    if (T <= 0 || N <= 0)
        return;
    const int packed = ifk_qpack_base(type) >= 0;
    const int base = packed ? ifk_qpack_base(type) : type;
#ifndef IFK_NO_SIMD
    if (ifk_qx_f32() && qpath() != QPATH_SCALAR && ifk_qtype(base) && K > 0) {
        int nt = threads_for(n_threads, (double)T * N * K);
        qmatmul_f32(y, ldy, W, base, packed, x, ldx, T, N, K, nt < (N + 15) / 16 ? nt : (N + 15) / 16);
        return;
    }
#endif
    if (packed && !packed_kernel(base)) {
        qmatmul_unpacked(y, ldy, W, type, x, ldx, T, N, K, n_threads);
        return;
    }
    if (packed)
        type = ifk_qpack_base(type); /* x is quantized as for the base type */
    if (!ifk_qtype(type) || K <= 0) {
        zero_y(y, ldy, T, N);
        return;
    }
    int nt = threads_for(n_threads, (double)T * N * K);
    const int blocks = (N + 15) / 16;
    if (nt > blocks)
        nt = blocks;
    int path = qpath();
    ifk_qx qx;
    size_t qx_bytes;
    const int k = ifk_qx_split(type, K);
    if (path == QPATH_SCALAR || !qx_init(&qx, type, qx_int16_on(type, path), k, T, K, &qx_bytes)) {
        if (packed) { /* no scratch for x: the oracle, on rows unpacked */
            qmatmul_unpacked(y, ldy, W, IFK_QPACKED + type, x, ldx, T, N, K, n_threads);
            return;
        }
        qref_args a = {y, ldy, W, x, ldx, type, T, N, K, ifk_pool_rows_per_item(N, nt)};
        ifk_pool_run(&(ifk_pool_job){.run = qref_run, .args = &a, .args_size = sizeof a,
                                     .n_items = (N + a.rpi - 1) / a.rpi, .max_threads = nt});
        return;
    }
#ifndef IFK_NO_SIMD
    IFK_DECL_QX_QUANTIZE((*quantize)) = path == QPATH_AVX2 ? ifk_avx2_qx_quantize : ifk_avx512_qx_quantize;
    IFK_DECL_QMATMUL_ROWS((*rows)) = packed                 ? packed_kernel(type)
                                     : path == QPATH_AVX2   ? ifk_avx2_qmatmul_rows
                                     : path == QPATH_AVX512 ? ifk_avx512_qmatmul_rows
                                                            : ifk_avx512gfni_qmatmul_rows;
    qx.ahead = packed ? packed_ahead(type, T) : 0;
    qx.streams = packed ? packed_streams(T) : 1;
    float *xm = (float *)((char *)qx.q + qx_bytes); /* the split's scratch, after what items read */
    qxq_args q = {quantize, x, ldx, qx, T, (T + 4 * nt - 1) / (4 * nt), qx_wants_pair_order(&qx, packed), xm};
    if (nt > 1 && T >= 16) /* worth sharing */
        ifk_pool_run(&(ifk_pool_job){.run = qxq_run, .args = &q, .args_size = sizeof q,
                                     .n_items = (T + q.per - 1) / q.per, .max_threads = nt});
    else
        qxq_tokens(&q, 0, T);
    if (k)
        qx_split_union(&qx, (int32_t *)(xm + (size_t)T * K));
    if (nt <= 1) {
        rows_and_split(rows, y, ldy, W, packed, &qx, 0, N);
        return;
    }
    int rpi = ifk_pool_rows_per_item(N, nt);
    qmm_args a = {rows, y, ldy, W, ifk_qrow_bytes(type, K), type, qx.x16, T, N, K, rpi, k, qx.nu, packed, qx.ahead, qx.streams};
    ifk_pool_run(&(ifk_pool_job){.run = qmm_run, .commit = qmm_commit, .args = &a, .args_size = sizeof a,
                                 .input = qx.q, .input_size = qx_bytes,
                                 .scratch_floats = (size_t)T * rpi, .n_items = (N + rpi - 1) / rpi,
                                 .max_threads = nt});
#endif
}

void ifk_qget_row(float *out, const void *W, int type, size_t row, int K)
{
    const void *r = (const char *)W + row * ifk_qrow_bytes(type, K);
    if (!ifk_qtype(type) || K <= 0) {
        ifk_dequantize_row(out, type, r, K);
        return;
    }
    switch (qpath()) {
#ifndef IFK_NO_SIMD
    case QPATH_AVX512GFNI: ifk_avx512gfni_qget_row(out, r, type, K); break;
    case QPATH_AVX512: ifk_avx512_qget_row(out, r, type, K); break;
    case QPATH_AVX2: ifk_avx2_qget_row(out, r, type, K); break;
#endif
    default: ifk_dequantize_row(out, type, r, K); break;
    }
}
