/*
 * qdispatch.c -- the quantized matrix product and row lookup: picks a path, quantizes x once
 * per call into a per-thread scratch buffer, and splits the rows between OpenMP threads.
 *
 * Paths: IFK_ISA_AVX512GFNI uses qmatmul_avx512.c compiled a second time with GFNI
 * (qmatmul_avx512gfni.c; it differs in Q3H's unpacking); IFK_ISA_AVX512 uses qmatmul_avx512.c
 * when the CPU also has AVX512_VNNI (the int8 dot product, vpdpbusd), else the AVX2 path;
 * IFK_ISA_AVX2 uses qmatmul_avx2.c; the scalar path is the oracle of quant_ref.c. Built with
 * -DIFK_NO_SIMD, only the scalar path exists.
 */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/quant.h"

enum { QPATH_SCALAR, QPATH_AVX2, QPATH_AVX512, QPATH_AVX512GFNI };

#ifndef IFK_NO_SIMD
static int has_vnni(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
}
#endif

static int qpath(void)
{
#ifdef IFK_NO_SIMD
    return QPATH_SCALAR;
#else
    switch (ifk_isa_current()) {
    case IFK_ISA_AVX512GFNI: return QPATH_AVX512GFNI; /* implies VNNI */
    case IFK_ISA_AVX512: return has_vnni() ? QPATH_AVX512 : QPATH_AVX2;
    case IFK_ISA_AVX2: return QPATH_AVX2;
    default: return QPATH_SCALAR;
    }
#endif
}

/* ---- per-thread scratch for the quantized x ---------------------------------------------- */

static _Thread_local void *scratch;       /* 64-byte aligned, never shrinks */
static _Thread_local size_t scratch_bytes;

/* A thread's scratch is freed when the thread ends (the engine runs the parts of a split layer
 * on threads of their own, one per sub-block: without this each would leak its scratch). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;
static void scratch_key_init(void) { scratch_key_ok = pthread_key_create(&scratch_key, free) == 0; }

/* NULL if it cannot grow to `bytes`. */
static void *scratch_get(size_t bytes)
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

/* Lays qx out for T tokens of K inputs of `type` in the caller's scratch; 0 if out of memory. */
static int qx_init(ifk_qx *qx, int type, int T, int K)
{
    const ifk_qtype_info *t = ifk_qtype(type);
    qx->type = type;
    qx->B = t->block;
    qx->nb = (K + t->block - 1) / t->block;
    qx->K = K;
    qx->T = T;
    qx->x16 = ifk_qx_x16(type);
    qx->q_ld = ((size_t)qx->nb * t->block * (qx->x16 ? 2 : 1) + 63) & ~(size_t)63;
    qx->s_ld = ((size_t)qx->nb + 15) & ~(size_t)15;
    size_t qbytes = (size_t)T * qx->q_ld, sbytes = (size_t)T * qx->s_ld * sizeof(float);
    char *p = scratch_get(qbytes + 7 * sbytes);
    if (!p)
        return 0;
    qx->q = (int8_t *)p;
    qx->s0 = (float *)(p + qbytes);
    qx->s1 = (float *)(p + qbytes + sbytes);
    qx->sum = (float *)(p + qbytes + 2 * sbytes);
    qx->blk = (float *)(p + qbytes + 3 * sbytes);
    return 1;
}

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

/* Rows [n0, n1) of thread id of team (ranges start at multiples of 16 rows). */
static void split_rows(int N, int id, int team, int *n0, int *n1)
{
    int blocks = (N + 15) / 16;
    *n0 = (int)((long long)blocks * id / team) * 16;
    *n1 = (int)((long long)blocks * (id + 1) / team) * 16;
    if (*n1 > N)
        *n1 = N;
}

/* The oracle, threaded. */
static void qmatmul_scalar(float *y, size_t ldy, const void *W, int type, const float *x, size_t ldx,
                           int T, int N, int K, int nt)
{
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int n0, n1;
        split_rows(N, omp_get_thread_num(), omp_get_num_threads(), &n0, &n1);
        if (n0 < n1)
            ifk_qmatmul_ref_rows(y, ldy, W, type, x, ldx, T, n0, n1, K);
    }
}

void ifk_qmatmul(float *y, size_t ldy, const void *W, int type, const float *x, size_t ldx,
                 int T, int N, int K, int n_threads)
{
    if (T <= 0 || N <= 0)
        return;
    if (!ifk_qtype(type) || K <= 0) {
        for (int t = 0; t < T; t++)
            memset(y + (size_t)t * ldy, 0, (size_t)N * sizeof *y);
        return;
    }
    int nt = threads_for(n_threads, (double)T * N * K);
    if (nt > (N + 15) / 16)
        nt = (N + 15) / 16;
    int path = qpath();
    ifk_qx qx;
    if (path == QPATH_SCALAR || !qx_init(&qx, type, T, K)) {
        qmatmul_scalar(y, ldy, W, type, x, ldx, T, N, K, nt);
        return;
    }
#ifndef IFK_NO_SIMD
    IFK_DECL_QX_QUANTIZE((*quantize)) = path == QPATH_AVX2 ? ifk_avx2_qx_quantize : ifk_avx512_qx_quantize;
    IFK_DECL_QMATMUL_ROWS((*rows)) = path == QPATH_AVX2     ? ifk_avx2_qmatmul_rows
                                     : path == QPATH_AVX512 ? ifk_avx512_qmatmul_rows
                                                            : ifk_avx512gfni_qmatmul_rows;
    if (nt <= 1) {
        quantize(&qx, x, ldx, 0, T);
        rows(y, ldy, W, &qx, 0, N);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        /* the team quantizes x (tokens split), then computes (rows split) */
        int id = omp_get_thread_num(), team = omp_get_num_threads();
        int t0 = (int)((long long)T * id / team), t1 = (int)((long long)T * (id + 1) / team);
        if (t0 < t1)
            quantize(&qx, x, ldx, t0, t1);
#pragma omp barrier
        int n0, n1;
        split_rows(N, id, team, &n0, &n1);
        if (n0 < n1)
            rows(y, ldy, W, &qx, n0, n1);
    }
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
