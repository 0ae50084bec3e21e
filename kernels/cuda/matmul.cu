/*
 * matmul.cu -- y = x W^T for every iflow weight type on the GPU. Contract: cuda_kernels.h
 * (ifkc_supports_wtype, ifkc_matmul); references: ifk_matmul (F32/F16/BF16) and
 * ifk_qmatmul_ref (quantized).
 *
 * Plan
 *   Decode, T <= IFKC_MATVEC_MAX_T: one matrix-vector kernel per weight type, templated on TM
 *   in {1, 2, 4, 8} (T rounded up; rows of x past T are a copy of the last one and are not
 *   stored), so every accumulator lives in registers. A warp owns MV_R = 2 rows of W and
 *   computes all T outputs of both; a block is MV_WARPS = 4 warps (8 rows). W is read once,
 *   in place; x (at most 8 x K floats, hot in L1/L2) is read through the read-only cache as
 *   16-byte loads, each used for both rows. Lane partial sums are added with xor shuffles at
 *   the end, in F32 throughout.
 *   - Quantized: a warp step covers 32 / G consecutive blocks of a row (G = B / 8 lanes per
 *     block, 256 elements per step); lane j of a block group decodes slice j with
 *     ifkc_qslice (qblock.cuh, tested on the CPU): elements 4j..4j+3 and B/2+4j..B/2+4j+3,
 *     whose level bytes are one or two coalesced 32-bit loads (the warp's loads of a step
 *     cover a contiguous run of blocks). The f16 delta and min are one more 32-bit load.
 *     Levels become floats with a byte-permute into the mantissa of 2^23 (ifkc_qbyte_f32,
 *     no int -> float instruction), and a block contributes
 *         min * sum(x) + delta * sum(q * x)
 *     (sum(x) of the slice computed once for both rows). U = 8, 4, 2 steps of loads (TM = 1, 2,
 *     4-8) are issued before they are used, so enough bytes are in flight to stream HBM with
 *     few warps per SM (4096 rows = 2048 warps = 15.5 per SM on an H100).
 *     Blocks are 4-byte aligned (every block size is a multiple of 4), so 32-bit loads are
 *     always legal; x must be 16-byte aligned (else it is first copied to scratch). The
 *     last block of a row whose K is not a multiple of B reads x under a guard (x has only
 *     K elements); its padding levels are 0 anyway.
 *   - F32 / F16 / BF16: lane l reads 16-byte chunks l, l + 32, ... of each row (4 or 8
 *     elements), perfectly coalesced, when every row is 16-byte aligned (W aligned and K a
 *     multiple of 4 / 8); otherwise a plain kernel reads one element per lane (any K, any
 *     alignment; correct, not bandwidth-optimal).
 *
 *   Prefill, T > IFKC_MATVEC_MAX_T: cuBLAS on the column-major view. Row-major y [T][N] at
 *   ldy is the column-major N x T matrix with leading dimension ldy; W [N][K] is the
 *   column-major K x N matrix (ld K) and x [T][K] the K x T matrix (ld ldx), so
 *       y = op(W)^T x  ->  gemm(OP_T, OP_N, m = N, n = T, k = K, A = W, lda = K, B = x, ldb = ldx,
 *                               C = y, ldc = ldy).
 *   cuBLAS is called through ifkc_blas() (blas.cuh: loaded at the first ifkc_open).
 *   - F32: cublasSgemm (the handle's default math mode: no TF32).
 *   - F16 / BF16: x rounded once to the weight type into scratch IFKC_SCRATCH_X16, then
 *     cublasGemmEx with 16-bit inputs, F32 output and CUBLAS_COMPUTE_32F (tensor cores).
 *   - Quantized: x to F16 as above; then tiles of at most QTILE_BYTES of F16 weights: a kernel
 *     (ifkc_qslice again) dequantizes rows n0..n0+rows of W into scratch IFKC_SCRATCH_W16
 *     (row stride nb * B elements so that whole blocks fit; only K columns are used) and
 *     cublasGemmEx multiplies that tile into y[:, n0..]. The stream orders a tile's GEMM
 *     before the next tile's dequantization, so one buffer is enough.
 */
#include "kernels/cuda/blas.cuh"
#include "kernels/cuda/common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <stdint.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/qblock.cuh"
#include "kernels/cuda/qtile.cuh"

#define QTILE_BYTES (64u << 20) /* the largest dequantized F16 tile of the prefill path */

/* ---- quantized matrix-vector ----------------------------------------------------------------- */

/* One block's slice for MV_RT(TM) rows and TM tokens: acc[t][r] += min_r * sum(x) + delta_r * sum(q x).
 * dm, lo, hi: [MV_RT(TM)] the block's f16 delta|min word and slice levels per row;
 * xt: [TM] pointers to x rows, already offset by the slice's 4j; k0: the block's first element;
 * lim = K - 4j: elements k0 + i with k0 + i >= lim are past K (read only when !full). */
template <int TM, int B>
__device__ __forceinline__ void qslice_dot(float (&acc)[TM][MV_RT(TM)], const uint32_t (&dm)[MV_RT(TM)],
                                           const uint32_t (&lo)[MV_RT(TM)], const uint32_t (&hi)[MV_RT(TM)],
                                           const float *const (&xt)[TM], int k0, int lim, bool full)
{
    float dl[MV_RT(TM)], mn[MV_RT(TM)], qa[MV_RT(TM)][4], qb[MV_RT(TM)][4];
#pragma unroll
    for (int r = 0; r < MV_RT(TM); r++) {
        dl[r] = ifkc_f16_to_f32((uint16_t)(dm[r] & 0xffffu));
        mn[r] = ifkc_f16_to_f32((uint16_t)(dm[r] >> 16));
#pragma unroll
        for (int e = 0; e < 4; e++) {
            qa[r][e] = ifkc_qbyte_f32(lo[r], e);
            qb[r][e] = ifkc_qbyte_f32(hi[r], e);
        }
    }
#pragma unroll
    for (int t = 0; t < TM; t++) {
        float xa[4], xb[4];
        if (full) {
            float4 a = ldg4(xt[t] + k0), b = ldg4(xt[t] + k0 + B / 2);
            xa[0] = a.x, xa[1] = a.y, xa[2] = a.z, xa[3] = a.w;
            xb[0] = b.x, xb[1] = b.y, xb[2] = b.z, xb[3] = b.w;
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                xa[e] = k0 + e < lim ? __ldg(xt[t] + k0 + e) : 0.0f;
                xb[e] = k0 + B / 2 + e < lim ? __ldg(xt[t] + k0 + B / 2 + e) : 0.0f;
            }
        }
        float sx = ((xa[0] + xa[1]) + (xa[2] + xa[3])) + ((xb[0] + xb[1]) + (xb[2] + xb[3]));
#pragma unroll
        for (int r = 0; r < MV_RT(TM); r++) {
            float sq = qa[r][0] * xa[0];
#pragma unroll
            for (int e = 1; e < 4; e++)
                sq = fmaf(qa[r][e], xa[e], sq);
#pragma unroll
            for (int e = 0; e < 4; e++)
                sq = fmaf(qb[r][e], xb[e], sq);
            acc[t][r] = fmaf(dl[r], sq, fmaf(mn[r], sx, acc[t][r]));
        }
    }
}

/* ---- quantized matrix-vector on int8 activations (IFKC_MV_DP4A=1; off by default until it has
 * run on a GPU) ----------------------------------------------------------------------------------
 *
 * x is first rounded to int8 in blocks of 32 (scale = max |x| / 127 a block, round to nearest)
 * into the handle's IFKC_SCRATCH_XQ slot, zero-padded to a multiple of 64; then a block's slice
 * (ifkc_qslice's levels as four bytes, the kernels' decoder) is two dp4a instructions against
 * the matching int8 x instead of eight float multiply-adds and eight byte-to-float conversions:
 *     delta * (sx_a * dp4a(lo, xq_a) + sx_b * dp4a(hi, xq_b)) + min * (sx_a * sum xq_a + sx_b * sum xq_b)
 * (the 4-element sums of xq by dp4a with 0x01010101). Rounding x costs each output at most
 * sum_k |w_k| * max|x|_block(k) / 254: tests/gpu/test_cuda_matmul checks that bound. */
#ifndef IFKC_MV_DP4A
#define IFKC_MV_DP4A 0
#endif

/* One block's slice against int8 x: acc[t][r] += delta_r * sum(q x) + min_r * sum(x). xq: [TM]
 * rows offset by the slice's 4j; sx: [TM] rows of scales; k0: the block's first element; j4: 4j. */
template <int TM, int B>
__device__ __forceinline__ void qslice_dot_i8(float (&acc)[TM][MV_RT(TM)], const uint32_t (&dm)[MV_RT(TM)],
                                              const uint32_t (&lo)[MV_RT(TM)], const uint32_t (&hi)[MV_RT(TM)],
                                              const int8_t *const (&xq)[TM], const float *const (&sx)[TM], int k0,
                                              int j4)
{
    float dl[MV_RT(TM)], mn[MV_RT(TM)];
#pragma unroll
    for (int r = 0; r < MV_RT(TM); r++) {
        dl[r] = ifkc_f16_to_f32((uint16_t)(dm[r] & 0xffffu));
        mn[r] = ifkc_f16_to_f32((uint16_t)(dm[r] >> 16));
    }
#pragma unroll
    for (int t = 0; t < TM; t++) {
        const int xa = __ldg((const int *)(xq[t] + k0)), xb = __ldg((const int *)(xq[t] + k0 + B / 2));
        const float fa = __ldg(sx[t] + (k0 + j4) / 32), fb = __ldg(sx[t] + (k0 + j4 + B / 2) / 32);
        const float msum = fmaf(fa, (float)__dp4a(0x01010101, xa, 0), fb * (float)__dp4a(0x01010101, xb, 0));
#pragma unroll
        for (int r = 0; r < MV_RT(TM); r++) {
            const float dot = fmaf(fa, (float)dp4a_us(lo[r], xa, 0), fb * (float)dp4a_us(hi[r], xb, 0));
            acc[t][r] = fmaf(dl[r], dot, fmaf(mn[r], msum, acc[t][r]));
        }
    }
}

#if IFKC_MV_DP4A
/* xq [T][kp] int8 and sx [T][kp / 32]: x [T][K] (ldx) in blocks of 32, one warp a block; past K 0. */
__global__ void quantize_x_i8(int8_t *__restrict__ xq, float *__restrict__ sx, const float *__restrict__ x, size_t ldx,
                              int T, int K, int kp)
{
    ifkc_grid_begin();
    const int wpb = blockDim.x / 32, lane = threadIdx.x % 32;
    const long long blk = (long long)blockIdx.x * wpb + threadIdx.x / 32, nblk = (long long)T * (kp / 32);
    if (blk >= nblk)
        return;
    const int t = (int)(blk / (kp / 32)), k = (int)(blk % (kp / 32)) * 32 + lane;
    const float v = k < K ? x[(size_t)t * ldx + k] : 0.0f;
    float amax = fabsf(v);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    /* below 2^-64, 127 / amax would overflow to inf (every value then +-127): scale the block up
     * by 2^64 first, as the CPU's int8 paths do (qmatmul_avx512.c's prescale) */
    const float pre = amax < 0x1p-64f ? 0x1p64f : 1.0f;
    const float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / (amax * pre) : 0.0f;
    xq[(size_t)t * kp + k] = (int8_t)max(-127, min(127, __float2int_rn(v * pre * inv)));
    if (lane == 0)
        sx[(size_t)t * (kp / 32) + k / 32] = s;
}

#endif

/* The activations of a decode product: F32 rows x [T][ldx], or (I8) int8 rows xq [T][kp] with
 * scales sx [T][kp / 32] (quantize_x_i8). */
struct mv_x {
    const float *x;
    size_t ldx;
    const int8_t *xq;
    const float *sx;
    int kp;
};

/* y[t][n] = sum_k dequant(W[n])[k] x[t][k], T <= TM.
 * W: [N][nb * BB] bytes (4-byte aligned); x: [T][K] at stride ldx (16-byte aligned rows), or
 * with I8 (IFKC_MV_DP4A) int8 x; y: [T][N] at stride ldy. Blocks past K with int8 x need no
 * guard: xq is zero there, and so are the levels. */
template <int QT, int TM, bool I8>
__global__ void __launch_bounds__(MV_THREADS, MV_MINB(TM))
    qmatvec_kernel(float *__restrict__ y, size_t ldy, const uint8_t *__restrict__ W,
                   const uint8_t *__restrict__ W2, mv_x xin, int T, int N, int K, mv_segs sg)
{
    constexpr int B = IFKC_QB(QT), BB = IFKC_QBB(QT), G = B / 8, BPW = 32 / G;
    constexpr int U = TM == 1 ? IFKC_MV_U1 : TM == 2 ? 4 : 2; /* steps of loads in flight */
    const int lane = threadIdx.x & 31, g = lane / G, j = lane % G;
    const int nb = (K + B - 1) / B, nbf = K / B, lim = K - 4 * j;
    int n0, Nm;
    float *ym;
    size_t ldm;
    const uint8_t *wr[MV_RT(TM)];
    if (!warp_begin<TM>(W, W2, y, ldy, N, (size_t)nb * BB, sg, lane, n0, ym, ldm, Nm, wr))
        return;
    const float *xt[TM];
    const int8_t *xqt[TM];
    const float *sxt[TM];
#pragma unroll
    for (int t = 0; t < TM; t++) {
        const size_t tt = (size_t)min(t, T - 1);
        if constexpr (I8) {
            xqt[t] = xin.xq + tt * xin.kp + 4 * j;
            sxt[t] = xin.sx + tt * (xin.kp / 32);
        } else {
            xt[t] = xin.x + tt * xin.ldx + 4 * j;
        }
    }
    float acc[TM][MV_RT(TM)];
#pragma unroll
    for (int t = 0; t < TM; t++)
#pragma unroll
        for (int r = 0; r < MV_RT(TM); r++)
            acc[t][r] = 0.0f;

    int b = g;
    for (; b + (U - 1) * BPW < nbf; b += U * BPW) { /* U full blocks per lane, loads first */
        uint32_t dm[U][MV_RT(TM)], lo[U][MV_RT(TM)], hi[U][MV_RT(TM)];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < MV_RT(TM); r++) {
                const uint8_t *blk = wr[r] + (size_t)(b + u * BPW) * BB;
                dm[u][r] = ifkc_ld32(blk);
                ifkc_qslice(QT, blk, j, &lo[u][r], &hi[u][r]);
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if constexpr (I8)
                qslice_dot_i8<TM, B>(acc, dm[u], lo[u], hi[u], xqt, sxt, (b + u * BPW) * B, 4 * j);
            else
                qslice_dot<TM, B>(acc, dm[u], lo[u], hi[u], xt, (b + u * BPW) * B, lim, true);
        }
    }
    for (; b < nb; b += BPW) { /* the rest, one block at a time; the last may be partial */
        uint32_t dm[MV_RT(TM)], lo[MV_RT(TM)], hi[MV_RT(TM)];
#pragma unroll
        for (int r = 0; r < MV_RT(TM); r++) {
            const uint8_t *blk = wr[r] + (size_t)b * BB;
            dm[r] = ifkc_ld32(blk);
            ifkc_qslice(QT, blk, j, &lo[r], &hi[r]);
        }
        if constexpr (I8)
            qslice_dot_i8<TM, B>(acc, dm, lo, hi, xqt, sxt, b * B, 4 * j);
        else
            qslice_dot<TM, B>(acc, dm, lo, hi, xt, b * B, lim, b < nbf);
    }
    if (W2)
        warp_store_glu<TM>(acc, y, ldy, T, n0, lane);
    else
        warp_store<TM>(acc, ym, ldm, T, Nm, n0, lane);
}

/* ---- F32 / F16 / BF16 matrix-vector ---------------------------------------------------------- */

/* Elements of a 16-byte chunk of weights and the bytes of one element. */
template <int WT> struct fw {
    static constexpr int EPC = WT == IFK_F32 ? 4 : 8;
    static constexpr int ES = WT == IFK_F32 ? 4 : 2;
};

/* The EPC weights of a 16-byte chunk c as floats. f: [EPC]. */
template <int WT>
__device__ __forceinline__ void chunk_f32(const uint4 &c, float *f)
{
    const uint32_t v[4] = { c.x, c.y, c.z, c.w };
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (WT == IFK_F32) {
            f[i] = __uint_as_float(v[i]);
        } else if (WT == IFK_F16) {
            f[2 * i] = ifkc_f16_to_f32((uint16_t)(v[i] & 0xffffu));
            f[2 * i + 1] = ifkc_f16_to_f32((uint16_t)(v[i] >> 16));
        } else {
            f[2 * i] = __uint_as_float(v[i] << 16);
            f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
        }
    }
}

/* acc[t][r] += chunk r . x[t][k0 .. k0 + EPC). w: [MV_RT(TM)] chunks; xt: [TM] 16-byte aligned rows. */
template <int WT, int TM>
__device__ __forceinline__ void chunk_dot(float (&acc)[TM][MV_RT(TM)], const uint4 (&w)[MV_RT(TM)],
                                          const float *const (&xt)[TM], int k0)
{
    constexpr int EPC = fw<WT>::EPC;
    float wf[MV_RT(TM)][EPC];
#pragma unroll
    for (int r = 0; r < MV_RT(TM); r++)
        chunk_f32<WT>(w[r], wf[r]);
#pragma unroll
    for (int t = 0; t < TM; t++) {
        float xv[EPC];
#pragma unroll
        for (int h = 0; h < EPC / 4; h++) {
            float4 a = ldg4(xt[t] + k0 + 4 * h);
            xv[4 * h] = a.x, xv[4 * h + 1] = a.y, xv[4 * h + 2] = a.z, xv[4 * h + 3] = a.w;
        }
#pragma unroll
        for (int r = 0; r < MV_RT(TM); r++)
#pragma unroll
            for (int e = 0; e < EPC; e++)
                acc[t][r] = fmaf(wf[r][e], xv[e], acc[t][r]);
    }
}

/* y[t][n] = sum_k W[n][k] x[t][k], T <= TM, with 16-byte chunks.
 * W: [N][K] of WT, 16-byte aligned rows (K a multiple of EPC); x: [T][K] at ldx, 16-byte
 * aligned rows; y: [T][N] at ldy. */
template <int WT, int TM>
__global__ void __launch_bounds__(MV_THREADS, MV_MINB(TM))
    fmatvec_kernel(float *__restrict__ y, size_t ldy, const void *__restrict__ W, const void *__restrict__ W2,
                   const float *__restrict__ x, size_t ldx, int T, int N, int K, mv_segs sg)
{
    constexpr int EPC = fw<WT>::EPC, ES = fw<WT>::ES;
    constexpr int U = TM <= 2 ? 4 : 2;
    const int lane = threadIdx.x & 31, nch = K / EPC;
    int n0, Nm;
    float *ym;
    size_t ldm;
    const uint8_t *wb[MV_RT(TM)];
    if (!warp_begin<TM>((const uint8_t *)W, (const uint8_t *)W2, y, ldy, N, (size_t)K * ES, sg, lane, n0, ym, ldm, Nm,
                        wb))
        return;
    const uint4 *wr[MV_RT(TM)];
#pragma unroll
    for (int r = 0; r < MV_RT(TM); r++)
        wr[r] = (const uint4 *)wb[r];
    const float *xt[TM];
#pragma unroll
    for (int t = 0; t < TM; t++)
        xt[t] = x + (size_t)min(t, T - 1) * ldx;
    float acc[TM][MV_RT(TM)];
#pragma unroll
    for (int t = 0; t < TM; t++)
#pragma unroll
        for (int r = 0; r < MV_RT(TM); r++)
            acc[t][r] = 0.0f;

    int c = lane;
    for (; c + (U - 1) * 32 < nch; c += U * 32) {
        uint4 w[U][MV_RT(TM)];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < MV_RT(TM); r++)
                w[u][r] = __ldg(wr[r] + c + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++)
            chunk_dot<WT, TM>(acc, w[u], xt, (c + 32 * u) * EPC);
    }
    for (; c < nch; c += 32) {
        uint4 w[MV_RT(TM)];
#pragma unroll
        for (int r = 0; r < MV_RT(TM); r++)
            w[r] = __ldg(wr[r] + c);
        chunk_dot<WT, TM>(acc, w, xt, c * EPC);
    }
    if (W2)
        warp_store_glu<TM>(acc, y, ldy, T, n0, lane);
    else
        warp_store<TM>(acc, ym, ldm, T, Nm, n0, lane);
}

/* Element i of a weight array of type WT as a float. W: [> i]. */
template <int WT>
__device__ __forceinline__ float welem(const void *W, size_t i)
{
    if (WT == IFK_F32)
        return __ldg((const float *)W + i);
    unsigned short h = __ldg((const unsigned short *)W + i);
    return WT == IFK_F16 ? ifkc_f16_to_f32(h) : __uint_as_float((uint32_t)h << 16);
}

/* The same product for any K and alignment: lane l takes elements l, l + 32, ...
 * W: [N][K] of WT; x: [T][K] at ldx; y: [T][N] at ldy. */
template <int WT, int TM>
__global__ void __launch_bounds__(MV_THREADS, MV_MINB(TM))
    fmatvec_any_kernel(float *__restrict__ y, size_t ldy, const void *__restrict__ W,
                       const float *__restrict__ x, size_t ldx, int T, int N, int K)
{
    ifkc_grid_begin();
    const int lane = threadIdx.x & 31;
    const int n0 = (int)(blockIdx.x * MV_WARPS + threadIdx.x / 32) * MV_RT(TM);
    if (n0 >= N)
        return;
    size_t row[MV_RT(TM)];
#pragma unroll
    for (int r = 0; r < MV_RT(TM); r++)
        row[r] = (size_t)min(n0 + r, N - 1) * K;
    const float *xt[TM];
#pragma unroll
    for (int t = 0; t < TM; t++)
        xt[t] = x + (size_t)min(t, T - 1) * ldx;
    float acc[TM][MV_RT(TM)];
#pragma unroll
    for (int t = 0; t < TM; t++)
#pragma unroll
        for (int r = 0; r < MV_RT(TM); r++)
            acc[t][r] = 0.0f;
    for (int k = lane; k < K; k += 32) {
        float w[MV_RT(TM)];
#pragma unroll
        for (int r = 0; r < MV_RT(TM); r++)
            w[r] = welem<WT>(W, row[r] + k);
#pragma unroll
        for (int t = 0; t < TM; t++) {
            float xv = __ldg(xt[t] + k);
#pragma unroll
            for (int r = 0; r < MV_RT(TM); r++)
                acc[t][r] = fmaf(w[r], xv, acc[t][r]);
        }
    }
    warp_store<TM>(acc, y, ldy, T, N, n0, lane);
}

/* ---- conversions for the prefill path -------------------------------------------------------- */

__device__ __forceinline__ void store_as(float *p, float v) { *p = v; }
__device__ __forceinline__ void store_as(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_as(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* out[t][k] = x[t][k] rounded to H (or copied, H = float). out: [T][ldo]; x: [T][K] at ldx. */
template <typename H>
__global__ void convert_x_kernel(H *__restrict__ out, size_t ldo, const float *__restrict__ x, size_t ldx,
                                 int T, int K)
{
    ifkc_grid_begin();
    size_t n = (size_t)T * K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (size_t)K, k = i % (size_t)K;
        store_as(out + t * ldo + k, x[t * ldx + k]);
    }
}

/* Rows of a quantized matrix to F16: one thread per slice (8 elements, two runs of 4).
 * W: [rows][nb * BB] bytes; out: [rows][nb * B] F16 (whole blocks, padding included). */
template <int QT>
__global__ void dequant_f16_kernel(__half *__restrict__ out, const uint8_t *__restrict__ W, int rows, int nb)
{
    ifkc_grid_begin();
    constexpr int B = IFKC_QB(QT), BB = IFKC_QBB(QT), G = B / 8;
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned per_row = (unsigned)nb * G;
    if (i >= (unsigned)rows * per_row)
        return;
    unsigned row = i / per_row, rem = i % per_row, b = rem / G, j = rem % G;
    const uint8_t *blk = W + (size_t)row * nb * BB + (size_t)b * BB;
    float d, m;
    uint32_t lo, hi;
    ifkc_qdelta_min(blk, &d, &m);
    ifkc_qslice(QT, blk, (int)j, &lo, &hi);
    __half *o = out + (size_t)row * nb * B + (size_t)b * B + 4 * j; /* 8-byte aligned */
    *(uint2 *)o = make_uint2(half2_bits(fmaf(ifkc_qbyte_f32(lo, 0), d, m), fmaf(ifkc_qbyte_f32(lo, 1), d, m)),
                             half2_bits(fmaf(ifkc_qbyte_f32(lo, 2), d, m), fmaf(ifkc_qbyte_f32(lo, 3), d, m)));
    *(uint2 *)(o + B / 2) =
        make_uint2(half2_bits(fmaf(ifkc_qbyte_f32(hi, 0), d, m), fmaf(ifkc_qbyte_f32(hi, 1), d, m)),
                   half2_bits(fmaf(ifkc_qbyte_f32(hi, 2), d, m), fmaf(ifkc_qbyte_f32(hi, 3), d, m)));
}

/* ---- launches -------------------------------------------------------------------------------- */

/* The decode kernels by TM, for launch_tm (matvec.cuh). */
template <int QT, bool I8> struct qmatvec_k {
    template <int TM> static auto k() { return &qmatvec_kernel<QT, TM, I8>; }
};
template <int WT> struct fmatvec_k {
    template <int TM> static auto k() { return &fmatvec_kernel<WT, TM>; }
};
template <int WT> struct fmatvec_any_k {
    template <int TM> static auto k() { return &fmatvec_any_kernel<WT, TM>; }
};


#define MV_ARGS y, ldy, W, W2, x, ldx, T, N, K, sg

/* xin: F32 x, or with I8 int8 x (matvec_i8). */
template <int QT, bool I8 = false>
static int launch_qmatvec(ifkc_dev *d, float *y, size_t ldy, const uint8_t *W, const uint8_t *W2, const mv_x &xin,
                          int T, int N, int K, const mv_segs &sg)
{
    const cudaError_t e = launch_tm<qmatvec_k<QT, I8>>(d, T, N, W2 != NULL, y, ldy, W, W2, xin, T, N, K, sg);
    IFKC_CKL(e, "qmatvec_kernel");
    return 0;
}

/* launch_qmatvec for the quantized type wtype (a known one: is_quant). */
template <bool I8>
static int launch_qmatvec_type(ifkc_dev *d, float *y, size_t ldy, const void *W, const void *W2, int wtype,
                               const mv_x &xin, int T, int N, int K, const mv_segs &sg)
{
    const uint8_t *Wq = (const uint8_t *)W, *Wq2 = (const uint8_t *)W2;
    switch (wtype) {
    case IFK_Q8_B32: return launch_qmatvec<IFK_Q8_B32, I8>(d, y, ldy, Wq, Wq2, xin, T, N, K, sg);
    case IFK_Q8_B64: return launch_qmatvec<IFK_Q8_B64, I8>(d, y, ldy, Wq, Wq2, xin, T, N, K, sg);
    case IFK_Q6_B64: return launch_qmatvec<IFK_Q6_B64, I8>(d, y, ldy, Wq, Wq2, xin, T, N, K, sg);
    case IFK_Q5_B64: return launch_qmatvec<IFK_Q5_B64, I8>(d, y, ldy, Wq, Wq2, xin, T, N, K, sg);
    case IFK_Q4_B32: return launch_qmatvec<IFK_Q4_B32, I8>(d, y, ldy, Wq, Wq2, xin, T, N, K, sg);
    case IFK_Q4_B64: return launch_qmatvec<IFK_Q4_B64, I8>(d, y, ldy, Wq, Wq2, xin, T, N, K, sg);
    case IFK_Q3H_B64: return launch_qmatvec<IFK_Q3H_B64, I8>(d, y, ldy, Wq, Wq2, xin, T, N, K, sg);
    case IFK_Q3_B32: return launch_qmatvec<IFK_Q3_B32, I8>(d, y, ldy, Wq, Wq2, xin, T, N, K, sg);
    default: return launch_qmatvec<IFK_Q2_B32, I8>(d, y, ldy, Wq, Wq2, xin, T, N, K, sg);
    }
}

template <int WT>
static int launch_fmatvec(ifkc_dev *d, float *y, size_t ldy, const void *W, const void *W2, const float *x,
                          size_t ldx, int T, int N, int K, bool chunked, const mv_segs &sg)
{
    if (chunked)
        IFKC_CKL(launch_tm<fmatvec_k<WT>>(d, T, N, W2 != NULL, MV_ARGS), "fmatvec_kernel");
    else /* (never a GLU pair: ifkc_matmul_glu computes those apart) */
        IFKC_CKL(launch_tm<fmatvec_any_k<WT>>(d, T, N, false, y, ldy, W, x, ldx, T, N, K), "fmatvec_any_kernel");
    return 0;
}

/* x [T][K] at ldx -> out [T][ldo] of H on the stream. */
template <typename H>
static int launch_convert_x(ifkc_dev *d, H *out, size_t ldo, const float *x, size_t ldx, int T, int K)
{
    size_t n = (size_t)T * K;
    unsigned blocks = ifkc_cdiv(n, 256);
    if (blocks > 8u * (unsigned)(d->sm_count > 0 ? d->sm_count : 132))
        blocks = 8u * (unsigned)(d->sm_count > 0 ? d->sm_count : 132);
    IFKC_CKL(ifkc_launch(d, convert_x_kernel<H>, blocks, 256, 0, out, ldo, x, ldx, T, K), "convert_x_kernel");
    return 0;
}

template <int QT>
static int launch_dequant(ifkc_dev *d, __half *out, const uint8_t *W, int rows, int nb)
{
    unsigned n = (unsigned)rows * (unsigned)nb * (IFKC_QB(QT) / 8);
    IFKC_CKL(ifkc_launch(d, dequant_f16_kernel<QT>, ifkc_cdiv(n, 256), 256, 0, out, W, rows, nb), "dequant_f16_kernel");
    return 0;
}

/* ---- the decode path ------------------------------------------------------------------------- */

static int is_quant(int wtype) { return wtype >= IFK_Q8_B32 && wtype < IFK_QTYPE_END_; }

/* a warp-tile code (qtiled.cu): IFKC_TILED + a base type qtile.cuh lays out */
static int is_tiled(int wtype) { return wtype > IFKC_TILED && IFKC_TILE_TYPE(wtype - IFKC_TILED); }

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* 1 if the decode kernels read W's rows in place a warp at a time (what a GLU pair or a qkv
 * segment needs): quantized blocks 4-byte aligned; F32 / F16 / BF16 rows of whole 16-byte
 * chunks, 16-byte aligned (else the element-wise kernel). */
static int rows_in_place(const void *W, int wtype, int K)
{
    if (is_tiled(wtype))
        return aligned16(W);
    if (is_quant(wtype))
        return ((uintptr_t)W & 3) == 0;
    return aligned16(W) && K % (wtype == IFK_F32 ? 4 : 8) == 0;
}

#if IFKC_MV_DP4A
/* The quantized decode product on int8 activations: x rounded into scratch, then the kernel. */
static int matvec_i8(ifkc_dev *d, float *y, size_t ldy, const void *W, const void *W2, int wtype, const float *x,
                     size_t ldx, int T, int N, int K, const mv_segs &sg)
{
    const int kp = (K + 63) / 64 * 64;
    const size_t xq_bytes = ((size_t)T * kp + 15) / 16 * 16, sx_bytes = (size_t)T * (kp / 32) * sizeof(float);
    void *p;
    int rc = ifkc_scratch(d, IFKC_SCRATCH_XQ, xq_bytes + sx_bytes, &p);
    if (rc)
        return rc;
    int8_t *xq = (int8_t *)p;
    float *sx = (float *)((char *)p + xq_bytes);
    const long long nblk = (long long)T * (kp / 32);
    IFKC_CKL(ifkc_launch(d, quantize_x_i8, (unsigned)((nblk + 7) / 8), 256, 0, xq, sx, x, ldx, T, K, kp),
             "quantize_x_i8");
    const mv_x xin = {NULL, 0, xq, sx, kp};
    return launch_qmatvec_type<true>(d, y, ldy, W, W2, wtype, xin, T, N, K, sg);
}
#endif

extern "C" int ifkc_matvec_int8_x(int wtype) { return IFKC_MV_DP4A && is_quant(wtype); }

/* T <= IFKC_MATVEC_MAX_T. W2 not NULL: the GLU pair (ifkc_matmul_glu; then chunked or quantized).
 * sg->n > 0: the segments of ifkc_matmul_qkv (W the first, N their rows; chunked or quantized). */
static int matvec(ifkc_dev *d, float *y, size_t ldy, const void *W, const void *W2, int wtype, const float *x,
                  size_t ldx, int T, int N, int K, const mv_segs &segs)
{
    mv_segs sg = segs;
    sg.prefetch = d->overlap || IFKC_MV_PREFETCH;
    if (is_tiled(wtype))
        return tiled_matvec(d, y, ldy, W, W2, wtype, x, ldx, T, N, K, sg);
#if IFKC_MV_DP4A
    if (is_quant(wtype))
        return matvec_i8(d, y, ldy, W, W2, wtype, x, ldx, T, N, K, sg);
#endif
    /* The quantized and chunked kernels read x as 16-byte pieces: rows of x must be aligned. */
    int chunked = !is_quant(wtype) && rows_in_place(W, wtype, K);
    int x_ok = aligned16(x) && (T == 1 || ldx % 4 == 0);
    if ((is_quant(wtype) || chunked) && !x_ok) {
        size_t ldc = ((size_t)K + 3) & ~(size_t)3;
        void *p;
        int rc = ifkc_scratch(d, IFKC_SCRATCH_X16, (size_t)T * ldc * sizeof(float), &p);
        if (rc)
            return rc;
        rc = launch_convert_x<float>(d, (float *)p, ldc, x, ldx, T, K);
        if (rc)
            return rc;
        x = (const float *)p;
        ldx = ldc;
    }
    if (W2 && !(rows_in_place(W, wtype, K) && rows_in_place(W2, wtype, K)))
        return ifkc_seterr(IFKC_EINVAL, "matvec: a GLU pair of rows that are not 16-byte chunks");
    if (sg.n && !is_quant(wtype) && !chunked)
        return ifkc_seterr(IFKC_EINVAL, "matvec: segments of rows that are not 16-byte chunks");
    switch (wtype) {
    case IFK_F32: return launch_fmatvec<IFK_F32>(d, y, ldy, W, W2, x, ldx, T, N, K, chunked, sg);
    case IFK_F16: return launch_fmatvec<IFK_F16>(d, y, ldy, W, W2, x, ldx, T, N, K, chunked, sg);
    case IFK_BF16: return launch_fmatvec<IFK_BF16>(d, y, ldy, W, W2, x, ldx, T, N, K, chunked, sg);
    }
    if (!is_quant(wtype))
        return ifkc_seterr(IFKC_EUNSUPPORTED, "ifkc_matmul: weight type %d is not supported", wtype);
    const mv_x xf = {x, ldx, NULL, NULL, 0};
    return launch_qmatvec_type<false>(d, y, ldy, W, W2, wtype, xf, T, N, K, sg);
}

/* ---- the prefill path (cuBLAS) --------------------------------------------------------------- */

/* y[:, 0..m) = A x16 with A [m][K] 16-bit of dtype at lda, x16 [T][K] at ldb (column-major
 * views as in the plan); F32 accumulation and output. blas: the loaded cuBLAS (ifkc_blas()). */
static int gemm16(const ifkc_blas_api *blas, ifkc_dev *d, float *y, size_t ldy, const void *A, size_t lda,
                  const void *x16, size_t ldb, cudaDataType dtype, int T, int m, int K)
{
    const float one = 1.0f, zero = 0.0f;
    IFKC_CKB(blas->gemm_ex(d->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, T, K, &one, A, dtype, (int)lda, x16, dtype,
                          (int)ldb, &zero, y, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
    return 0;
}

/* Rows n0 <= n < n0 + rows of the quantized W to F16 at out [rows][nb * B]. */
static int dequant_rows(ifkc_dev *d, __half *out, const uint8_t *W, int wtype, int rows, int nb)
{
    switch (wtype) {
    case IFK_Q8_B32: return launch_dequant<IFK_Q8_B32>(d, out, W, rows, nb);
    case IFK_Q8_B64: return launch_dequant<IFK_Q8_B64>(d, out, W, rows, nb);
    case IFK_Q6_B64: return launch_dequant<IFK_Q6_B64>(d, out, W, rows, nb);
    case IFK_Q5_B64: return launch_dequant<IFK_Q5_B64>(d, out, W, rows, nb);
    case IFK_Q4_B32: return launch_dequant<IFK_Q4_B32>(d, out, W, rows, nb);
    case IFK_Q4_B64: return launch_dequant<IFK_Q4_B64>(d, out, W, rows, nb);
    case IFK_Q3H_B64: return launch_dequant<IFK_Q3H_B64>(d, out, W, rows, nb);
    case IFK_Q3_B32: return launch_dequant<IFK_Q3_B32>(d, out, W, rows, nb);
    case IFK_Q2_B32: return launch_dequant<IFK_Q2_B32>(d, out, W, rows, nb);
    default: return ifkc_seterr(IFKC_EUNSUPPORTED, "ifkc_matmul: weight type %d is not supported", wtype);
    }
}

/* T > IFKC_MATVEC_MAX_T. */
static int gemm(ifkc_dev *d, float *y, size_t ldy, const void *W, int wtype, const float *x, size_t ldx,
                int T, int N, int K)
{
    if (ldx > INT_MAX || ldy > INT_MAX)
        return ifkc_seterr(IFKC_EINVAL, "ifkc_matmul: stride too large for cublas (ldx %zu, ldy %zu)", ldx, ldy);
    const ifkc_blas_api *blas = ifkc_blas(); /* loaded by ifkc_open; NULL only without it */
    d->seq++; /* cuBLAS writes y */
    if (!blas)
        return IFKC_ENODEV;
    if (wtype == IFK_F32) {
        const float one = 1.0f, zero = 0.0f;
        IFKC_CKB(blas->sgemm(d->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, (const float *)W, K, x, (int)ldx,
                             &zero, y, (int)ldy),
                 "cublasSgemm");
        return 0;
    }
    /* x rounded once to the 16-bit type, rows padded to a multiple of 8 elements (16 bytes) */
    size_t ldx16 = ((size_t)K + 7) & ~(size_t)7;
    void *x16;
    int rc = ifkc_scratch(d, IFKC_SCRATCH_X16, (size_t)T * ldx16 * 2, &x16);
    if (rc)
        return rc;
    if (wtype == IFK_BF16) {
        rc = launch_convert_x<__nv_bfloat16>(d, (__nv_bfloat16 *)x16, ldx16, x, ldx, T, K);
        return rc ? rc : gemm16(blas, d, y, ldy, W, (size_t)K, x16, ldx16, CUDA_R_16BF, T, N, K);
    }
    rc = launch_convert_x<__half>(d, (__half *)x16, ldx16, x, ldx, T, K);
    if (rc)
        return rc;
    if (wtype == IFK_F16)
        return gemm16(blas, d, y, ldy, W, (size_t)K, x16, ldx16, CUDA_R_16F, T, N, K);

    /* quantized: tiles of whole rows, dequantized to F16 with a row stride of nb * B */
    /* (quant.h's functions have C linkage without extern "C": the macros of qblock.cuh here) */
    const int base = is_tiled(wtype) ? wtype - IFKC_TILED : wtype, B = IFKC_QB(base), nb = (K + B - 1) / B;
    const size_t ldw = (size_t)nb * B, rb = (size_t)nb * IFKC_QBB(base);
    size_t rows = QTILE_BYTES / (ldw * sizeof(__half));
    if (rows >= 64)
        rows -= rows % 64;
    if (rows < 1)
        rows = 1;
    if (rows > (size_t)N)
        rows = (size_t)N;
    void *w16;
    rc = ifkc_scratch(d, IFKC_SCRATCH_W16, rows * ldw * sizeof(__half), &w16);
    if (rc)
        return rc;
    for (int n0 = 0; n0 < N; n0 += (int)rows) {
        int nr = N - n0 < (int)rows ? N - n0 : (int)rows;
        const uint8_t *Wn = (const uint8_t *)W + (size_t)n0 * rb;
        rc = is_tiled(wtype) ? tiled_dequant(d, (__half *)w16, Wn, base, nr, nb) : dequant_rows(d, (__half *)w16, Wn, wtype, nr, nb);
        if (rc)
            return rc;
        rc = gemm16(blas, d, y + n0, ldy, w16, ldw, x16, ldx16, CUDA_R_16F, T, nr, K);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- entry points ---------------------------------------------------------------------------- */

extern "C" int ifkc_supports_wtype(int wtype)
{
    return wtype == IFK_F32 || wtype == IFK_F16 || wtype == IFK_BF16 || is_quant(wtype) || is_tiled(wtype);
}

extern "C" int ifkc_matmul(ifkc_dev *d, float *y, size_t ldy, const void *W, int wtype, const float *x,
                           size_t ldx, int T, int N, int K)
{
    if (!ifkc_supports_wtype(wtype))
        return ifkc_seterr(IFKC_EUNSUPPORTED, "ifkc_matmul: weight type %d is not supported", wtype);
    if (!d || !y || !W || !x)
        return ifkc_seterr(IFKC_EINVAL, "ifkc_matmul: NULL argument (handle %p, y %p, W %p, x %p)", (void *)d,
                           (void *)y, W, (const void *)x);
    if (T <= 0 || N <= 0 || K <= 0)
        return ifkc_seterr(IFKC_EINVAL, "ifkc_matmul: bad shape T=%d N=%d K=%d", T, N, K);
    if (T > 1 && (ldx < (size_t)K || ldy < (size_t)N))
        return ifkc_seterr(IFKC_EINVAL, "ifkc_matmul: strides too small (ldx %zu < K %d or ldy %zu < N %d)", ldx,
                           K, ldy, N);
    if (is_quant(wtype) && ((uintptr_t)W & 3))
        return ifkc_seterr(IFKC_EINVAL, "ifkc_matmul: quantized weights at %p are not 4-byte aligned", W);
    if (is_tiled(wtype) && ((uintptr_t)W & 15))
        return ifkc_seterr(IFKC_EINVAL, "ifkc_matmul: tiled weights at %p are not 16-byte aligned", W);
    if (T <= IFKC_MATVEC_MAX_T)
        return matvec(d, y, ldy, W, NULL, wtype, x, ldx, T, N, K, mv_segs{});
    return gemm(d, y, ldy, W, wtype, x, ldx, T, N, K);
}

extern "C" int ifkc_matmul_qkv(ifkc_dev *d, float *yq, size_t ldq, float *yk, float *yv, size_t ldkv, const void *Wq,
                               const void *Wk, const void *Wv, int wtype, const float *x, size_t ldx, int T, int Nq,
                               int Nkv, int K)
{
    if (!d || !yq || !yk || !yv || !Wq || !Wk || !Wv || !x)
        return ifkc_seterr(IFKC_EINVAL, "ifkc_matmul_qkv: a NULL argument");
    const int R = MV_RT(tm_of(T));
    const void *Ws[3] = {Wq, Wk, Wv};
    int pair = T > 0 && T <= IFKC_MATVEC_MAX_T && Nq > 0 && Nkv > 0 && Nq % R == 0 && Nkv % R == 0 && K > 0;
    for (int i = 0; i < 3 && pair; i++)
        pair = rows_in_place(Ws[i], wtype, K);
    if (!pair || !ifkc_supports_wtype(wtype) || (T > 1 && (ldx < (size_t)K || ldq < (size_t)Nq || ldkv < (size_t)Nkv))) {
        int rc = ifkc_matmul(d, yq, ldq, Wq, wtype, x, ldx, T, Nq, K); /* apart: the same values */
        if (!rc)
            rc = ifkc_matmul(d, yk, ldkv, Wk, wtype, x, ldx, T, Nkv, K);
        return rc ? rc : ifkc_matmul(d, yv, ldkv, Wv, wtype, x, ldx, T, Nkv, K);
    }
    mv_segs sg = {{Wq, Wk, Wv}, {yq, yk, yv}, {ldq, ldkv, ldkv}, {Nq, Nq + Nkv, Nq + 2 * Nkv}, 3};
    return matvec(d, yq, ldq, Wq, NULL, wtype, x, ldx, T, Nq + 2 * Nkv, K, sg);
}

extern "C" int ifkc_matmul_glu(ifkc_dev *d, float *y, float *u, size_t ldy, const void *Wg, const void *Wu, int wtype,
                               const float *x, size_t ldx, int T, int N, int K)
{
    if (!Wu || !u)
        return ifkc_seterr(IFKC_EINVAL, "ifkc_matmul_glu: NULL argument (Wu %p, u %p)", Wu, (void *)u);
    /* one kernel: a warp's two rows are gate row n and up row n (two rows a warp, 16-byte chunks) */
    const int pair = T <= IFKC_MATVEC_MAX_T && MV_RT(tm_of(T)) == 2 && rows_in_place(Wg, wtype, K) &&
                     rows_in_place(Wu, wtype, K);
    if (!pair) { /* apart: the same values */
        int rc = ifkc_matmul(d, y, ldy, Wg, wtype, x, ldx, T, N, K);
        if (!rc)
            rc = ifkc_matmul(d, u, ldy, Wu, wtype, x, ldx, T, N, K);
        if (!rc && ldy == (size_t)N)
            rc = ifkc_silu_mul(d, y, u, (size_t)T * N);
        for (int t = 0; !rc && ldy != (size_t)N && t < T; t++)
            rc = ifkc_silu_mul(d, y + (size_t)t * ldy, u + (size_t)t * ldy, (size_t)N);
        return rc;
    }
    if (!ifkc_supports_wtype(wtype))
        return ifkc_seterr(IFKC_EUNSUPPORTED, "ifkc_matmul_glu: weight type %d is not supported", wtype);
    if (!d || !y || !Wg || !x)
        return ifkc_seterr(IFKC_EINVAL, "ifkc_matmul_glu: NULL argument");
    if (T <= 0 || N <= 0 || K <= 0 || (T > 1 && (ldx < (size_t)K || ldy < (size_t)N)))
        return ifkc_seterr(IFKC_EINVAL, "ifkc_matmul_glu: bad shape T=%d N=%d K=%d", T, N, K);
    return matvec(d, y, ldy, Wg, Wu, wtype, x, ldx, T, N, K, mv_segs{});
}
