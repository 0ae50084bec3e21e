/*
 * qtiled.cu -- Q4_B32, Q4_B64, Q8_B32 and Q8_B64 products on warp tiles (qtile.cuh) against
 * int8 activations. Contract: cuda_kernels.h (ifkc_tile_pack, IFKC_TILED; ifkc_matmul and its
 * GLU and qkv forms take the tiled type codes); matmul.cu dispatches here (matvec.cuh).
 *
 * Plan
 *   Packing (ifkc_tile_pack): at load, on the host, a row at a time (qtile.cuh), uploaded in
 *   pieces of about 8 MiB. The same bytes as the file's rows, so the plan's memory accounting
 *   holds; only matrices whose rows are whole 16-byte units (ifkc_tile_ok) are packed.
 *
 *   Decode, T <= IFKC_MATVEC_MAX_T: two kernels.
 *   1. tiled_qx_kernel, one block per token: x rounded to int8 exactly as the CPU's int8
 *      products round it (kernels/cpu/qimpl.h): per block of B, scales max|x| / 127 of group 0
 *      and 1 (B = 64: the alternating runs of 4; B = 32: one group), the block's F32 sum, and
 *      the residual's correction c (sum - s0 X0 - s1 X1), c = (L - 1) / 2; and first the split:
 *      of the token's ifk_qx_split_k(K) largest |x_i| (ties to the lower i), those at least
 *      IFK_QX_SPLIT_RATIO times the least of the 16 maxima of |x_i| over i % 16 are taken out
 *      of x before it is rounded, and kept (index, value) to be added in F32. The same rule,
 *      scales and rounding as the CPU's: the int8 values are the CPU's, bit for bit; sums are
 *      in another order. QX_THREADS threads: two passes over x (the lane maxima, then the
 *      values that stand out into a shared list, which warp 0 ranks), then B / 8 lanes a
 *      block of B, 8 consecutive values a lane.
 *   2. tiled_matvec_kernel: the matvec.cuh shape (a warp owns MV_RT(TM) rows and all T
 *      tokens); lane j takes block j of each tile of 32: its level bytes as P 16-byte loads
 *      (the warp's loads of a part are 512 contiguous bytes), its delta|min word, and for each
 *      token the block's int8 x (B / 16 16-byte loads) and { s0, sum, s1, cor } (one 16-byte
 *      load): then per row
 *          d_g = sum over group g of q_i xq_i       (dp4a: 4 levels a time, Q4 nibbles masked)
 *          acc += delta (s0 d_0 + s1 d_1 + cor) + min sum
 *      IFKC_TILE_U = 2 tiles (TM = 1, 2) or 1 in flight. After the tiles each lane k < split
 *      adds outlier k's x_i w'_i (qtile.cuh's ifkc_tile_weight) for its token, and the warp's
 *      sums are added as in matmul.cu. Per weight this is about a quarter of an instruction for Q8 and
 *      a half for Q4, against 2-3 for the row layout's F32 kernels.
 *
 *   The rounding's launch is saved where x is a norm's output (the attention's and the FFN's
 *   inputs, the logits'): once ifkc_tile_pack has made tiles of one type on a device, its
 *   ifkc_rmsnorm and ifkc_add_rmsnorm of decode-sized T (rows of 513 to 8192 values) run
 *   norm_round_kernel, ops.cu's norm of the row (norm.cuh, the same bits) and then the row's
 *   rounding by the same block, and note it (ifkc_dev's xq); a tiled product whose x is that
 *   output, with nothing enqueued on the device since (ifkc_dev's seq: every launch, copy,
 *   cuBLAS and NCCL call counts), uses it. The attention output and the FFN's hidden rows are
 *   rounded by the product's own launch.
 *
 *   Prefill, T > IFKC_MATVEC_MAX_T: matmul.cu's cuBLAS path with tiled_dequant, one thread
 *   per 16 level bytes, in place of its row-layout dequantization.
 */
#include "kernels/cuda/common.cuh"

#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/qtile.cuh"

/* Tiles of loads a warp has in flight for one and two tokens (one from four tokens on); a macro
 * so that tools/gpu-variants.sh can time others. */
#ifndef IFKC_TILE_U
#define IFKC_TILE_U 2
#endif
#define QX_THREADS 512 /* threads of tiled_qx_kernel: one block a token (1024 spill) */
#define QX_KMAX 8      /* the most outliers a token takes out (ifk_qx_split_k) */
#define QX_CAND 256    /* candidates for them a warp ranks (more: block-wide rounds) */

/* A token's rounded x, as tiled_qx_kernel leaves it in the handle's IFKC_SCRATCH_XQ slot. */
struct tq_x {
    int8_t *q;     /* [T][kp]    int8 values, kp = nb * B (0 past K and for outliers) */
    float4 *blk;   /* [T][nb]    { s0, sum, s1, cor } of each block                  */
    int32_t *oi;   /* [T][QX_KMAX] outliers' i ascending, -1 for unused entries       */
    float *ov;     /* [T][QX_KMAX] their x_i                                          */
    int kp, nb, k; /* k: outliers a token takes out (0: none)                         */
};

/* Level c = (L - 1) / 2 of the residual's correction (qimpl.h). */
#define MID_LEVEL(QT) ((QT) == IFK_Q8_B32 || (QT) == IFK_Q8_B64 ? 127.5f : 7.5f)

/* ---- rounding x ------------------------------------------------------------------------------ */

/* a ranks before b: larger, or as large and earlier (the CPU's ranks_before) */
__device__ __forceinline__ bool ranks_before(float av, int ai, float bv, int bi)
{
    return av > bv || (av == bv && ai < bi);
}

/* Round v to int8 with the group's prescale and inverse step (the CPU's to_i8). */
__device__ __forceinline__ int round_i8(float v, float pre, float inv)
{
    return max(-128, min(127, __float2int_rn(__fmul_rn(__fmul_rn(v, pre), inv))));
}

/* Max and sum over each aligned group of N lanes (N a power of 2, at most 32), every lane. */
template <int N>
__device__ __forceinline__ float group_max(float v)
{
#pragma unroll
    for (int off = N / 2; off > 0; off /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

template <int N, typename V>
__device__ __forceinline__ V group_sum(V v)
{
#pragma unroll
    for (int off = N / 2; off > 0; off /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* The group's prescale (2^64 below 2^-64) and inverse step 127 / (amax pre) (0 for amax 0). */
__device__ __forceinline__ void group_step(float amax, float &pre, float &inv)
{
    pre = amax < 0x1p-64f ? 0x1p64f : 1.0f;
    inv = amax > 0.0f ? 127.0f / (amax * pre) : 0.0f;
}

/* Warp-wide: of the n candidates (cv: |x_i|, ci: i; any order), the k that rank first into
 * sel[0 ..), their count into *nsel (lane 0 writes). Lane l holds entries l, l + 32, ... */
__device__ __forceinline__ void pick_from_list(const float *cv, const int *ci, int n, int k, int *sel, int *nsel,
                                               int lane)
{
    unsigned taken = 0; /* bit s: entry lane + 32 s is taken */
    int got = 0;
    for (int round = 0; round < k; round++) {
        float bv = -1.0f;
        int bi = INT_MAX;
        for (int s = 0; s < QX_CAND / 32; s++) {
            const int e = lane + 32 * s;
            if (e < n && !(taken >> s & 1u) && ranks_before(cv[e], ci[e], bv, bi))
                bv = cv[e], bi = ci[e];
        }
#pragma unroll
        for (int off = 16; off > 0; off /= 2) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
            if (ranks_before(ov, oi, bv, bi))
                bv = ov, bi = oi;
        }
        if (bv < 0.0f) /* the same in every lane: none left */
            break;
        for (int s = 0; s < QX_CAND / 32; s++) /* its holder marks it (indices are unique) */
            if (lane + 32 * s < n && ci[lane + 32 * s] == bi)
                taken |= 1u << s;
        if (lane == 0)
            sel[round] = bi;
        got = round + 1;
    }
    if (lane == 0)
        *nsel = got;
}

/* Block-wide, for lists longer than QX_CAND: k rounds of the best |x_i| >= thr not taken yet
 * (sv, si: QX_THREADS entries of scratch). Every thread calls it. */
__device__ void pick_by_rounds(const float *xt, int K, float thr, int k, float *sv, int *si, int *sel, int *nsel,
                               int tid)
{
    for (int round = 0; round < k; round++) {
        float bv = -1.0f;
        int bi = INT_MAX;
        for (int i = tid; i < K; i += QX_THREADS) {
            const float a = fabsf(xt[i]);
            bool taken = false;
            for (int s = 0; s < round; s++)
                taken |= sel[s] == i;
            if (a >= thr && !taken && ranks_before(a, i, bv, bi))
                bv = a, bi = i;
        }
        sv[tid] = bv;
        si[tid] = bi;
        __syncthreads();
        for (int half = QX_THREADS / 2; half > 0; half /= 2) {
            if (tid < half && ranks_before(sv[tid + half], si[tid + half], sv[tid], si[tid]))
                sv[tid] = sv[tid + half], si[tid] = si[tid + half];
            __syncthreads();
        }
        const bool found = sv[0] >= 0.0f;
        if (tid == 0 && found)
            sel[round] = si[0], *nsel = round + 1;
        __syncthreads();
        if (!found)
            break;
    }
}

/* Token t's row xt [K] -> o for base type QT, by the whole block (QX_THREADS threads; every
 * thread calls it). xt is read with plain loads: it may have been written by this block. */
template <int QT>
__device__ __forceinline__ void qx_row(const tq_x &o, const float *xt, int K, int t)
{
    constexpr int B = IFKC_QB(QT);
    __shared__ float sv[QX_THREADS], cv[QX_CAND], lmax[16];
    __shared__ int si[QX_THREADS], ci[QX_CAND], sel[QX_KMAX];
    __shared__ int nsel, ncand;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    if (tid == 0)
        nsel = 0, ncand = 0;
    __syncthreads();

    /* the split: the threshold; then the candidates (|x_i| >= thr) into a list, of which warp 0
     * takes the k that rank first, a warp-wide "best not taken yet" per round (few stand out in
     * real activations; more than QX_CAND of them, as when L is 0, take block-wide rounds) */
    if (o.k > 0) {
        float m = 0.0f; /* thread tid sees i = tid mod QX_THREADS, so lane i % 16 = tid % 16 */
        for (int i = tid; i < K; i += QX_THREADS)
            m = fmaxf(m, fabsf(xt[i]));
        sv[tid] = m;
        __syncthreads();
        if (tid < 16) {
            for (int j = tid + 16; j < QX_THREADS; j += 16)
                m = fmaxf(m, sv[j]);
            lmax[tid] = m;
        }
        __syncthreads();
        float L = lmax[0];
        for (int l = 1; l < 16; l++)
            L = fminf(L, lmax[l]);
        const float thr = IFK_QX_SPLIT_RATIO * L;
        for (int i = tid; i < K; i += QX_THREADS) {
            const float a = fabsf(xt[i]);
            if (a >= thr) {
                const int p = atomicAdd(&ncand, 1); /* the list's order is any: the ranking decides */
                if (p < QX_CAND)
                    cv[p] = a, ci[p] = i;
            }
        }
        __syncthreads();
        const int nc = ncand;
        if (nc <= QX_CAND) {
            if (warp == 0)
                pick_from_list(cv, ci, nc, o.k, sel, &nsel, lane);
        } else {
            pick_by_rounds(xt, K, thr, o.k, sv, si, sel, &nsel, tid);
        }
        __syncthreads();
        if (tid == 0) { /* by i ascending, then out */
            for (int a = 1; a < nsel; a++)
                for (int b = a; b > 0 && sel[b] < sel[b - 1]; b--) {
                    const int s = sel[b];
                    sel[b] = sel[b - 1];
                    sel[b - 1] = s;
                }
            for (int j = 0; j < o.k; j++) {
                o.oi[(size_t)t * QX_KMAX + j] = j < nsel ? sel[j] : -1;
                o.ov[(size_t)t * QX_KMAX + j] = j < nsel ? xt[sel[j]] : 0.0f;
            }
        }
        __syncthreads();
    }
    const int ns = nsel;

    /* the blocks, B / 8 lanes each (a warp takes 32 / (B / 8) at a time): lane j of a block
     * holds its elements 8 j .. 8 j + 7 of x with the outliers set to 0, the first four in
     * group 0 and the last four in group 1 for B = 64 (the alternating runs of 4), all eight in
     * group 0 for B = 32 */
    constexpr int LPB = B / 8;
    const int j = lane % LPB;
    int8_t *q = o.q + (size_t)t * o.kp;
    float4 *bk = o.blk + (size_t)t * o.nb;
    for (int b0 = warp * (32 / LPB); b0 < o.nb; b0 += QX_THREADS / LPB) { /* b0: the warp's first */
        const int b = b0 + lane / LPB;
        const bool on = b < o.nb; /* alike in a group of LPB lanes; every lane shuffles */
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int i = b * B + 8 * j + e;
            bool out = false;
            for (int s = 0; s < ns; s++)
                out |= sel[s] == i;
            v[e] = on && i < K && !out ? xt[i] : 0.0f;
        }
        float a0 = 0.0f, a1 = 0.0f, sum = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            if (B == 64 && e >= 4)
                a1 = fmaxf(a1, fabsf(v[e]));
            else
                a0 = fmaxf(a0, fabsf(v[e]));
            sum += v[e];
        }
        a0 = group_max<LPB>(a0), a1 = group_max<LPB>(a1), sum = group_sum<LPB>(sum);
        float pre0, inv0, pre1, inv1;
        group_step(a0, pre0, inv0);
        group_step(a1, pre1, inv1);
        int q4[8], x0 = 0, x1 = 0;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const bool g1 = B == 64 && e >= 4;
            q4[e] = round_i8(v[e], g1 ? pre1 : pre0, g1 ? inv1 : inv0);
            (g1 ? x1 : x0) += q4[e];
        }
        x0 = group_sum<LPB>(x0), x1 = group_sum<LPB>(x1);
        if (on) {
            uint32_t w[2];
#pragma unroll
            for (int h = 0; h < 2; h++)
                w[h] = (uint32_t)(q4[4 * h] & 255) | (uint32_t)(q4[4 * h + 1] & 255) << 8 |
                       (uint32_t)(q4[4 * h + 2] & 255) << 16 | (uint32_t)(q4[4 * h + 3] & 255) << 24;
            *(uint2 *)(q + (size_t)b * B + 8 * j) = make_uint2(w[0], w[1]);
            if (j == 0) {
                const float s0 = a0 / 127.0f, s1 = a1 / 127.0f;
                const float rounded = __fadd_rn(__fmul_rn(s0, (float)x0), __fmul_rn(s1, (float)x1));
                bk[b] = make_float4(s0, sum, s1, MID_LEVEL(QT) * (sum - rounded));
            }
        }
    }
}

/* x [T][K] (ldx) -> o for base type QT. Grid: T blocks of QX_THREADS. */
template <int QT>
__global__ void __launch_bounds__(QX_THREADS) tiled_qx_kernel(tq_x o, const float *__restrict__ x, size_t ldx, int K)
{
    ifkc_grid_begin();
    qx_row<QT>(o, x + (size_t)blockIdx.x * ldx, K, blockIdx.x);
}

/* qx_row as a call of its own: inlined into norm_round_kernel it spilled a few bytes there. */
template <int QT>
__device__ __noinline__ void qx_row_call(const tq_x o, const float *xt, int K, int t)
{
    qx_row<QT>(o, xt, K, t);
}

/* ops.cu's norm of row blockIdx.x (norm.cuh, r NULL for ifkc_rmsnorm), then that row of y
 * rounded into o: the norm and the next tiled product's rounding in one launch. */
template <int PT, int QT>
__global__ void __launch_bounds__(RMS_THREADS) norm_round_kernel(float *y, float *x, const float *r, const float *w,
                                                                 int n, float eps, tq_x o)
{
    ifkc_grid_begin();
    norm_row_reg<PT>(y, x, r, w, n, eps);
    __syncthreads(); /* the row's y, written by the block's threads, visible to all of them */
    qx_row_call<QT>(o, y + (size_t)blockIdx.x * n, n, blockIdx.x);
}
static_assert(RMS_THREADS == QX_THREADS, "the norm's block rounds its row as tiled_qx_kernel's does");

/* ---- the decode product ---------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t word_of(const uint4 &v, int w) { return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w; }

/* The int8 dot products of one block of row r with one token: d[g] += q . xq over group g.
 * lv: the block's P level parts; xv: the token's B / 16 pieces of int8 x. */
template <int QT>
__device__ __forceinline__ void block_dots(const uint4 (&lv)[(IFKC_QBB(QT) - 4) / 16], const uint4 (&xv)[IFKC_QB(QT) / 16],
                                           int (&d)[2])
{
    constexpr int B = IFKC_QB(QT), P = (IFKC_QBB(QT) - 4) / 16;
    constexpr bool Q8 = QT == IFK_Q8_B32 || QT == IFK_Q8_B64;
#pragma unroll
    for (int p = 0; p < P; p++)
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const uint32_t word = word_of(lv[p], w);
            const int g = B == 64 ? w % 2 : 0;
            if (Q8) {
                d[g] = dp4a_us(word, (int)word_of(xv[p], w), d[g]);
            } else {
                /* low nibbles: elements 16 p + 4 w (B = 64) or 4 w (B = 32); high: B / 2 later */
                const uint32_t lo = word & 0x0f0f0f0fu, hi = (word >> 4) & 0x0f0f0f0fu;
                d[g] = dp4a_us(lo, (int)word_of(xv[p], w), d[g]);
                d[g] = dp4a_us(hi, (int)word_of(xv[p + B / 32], w), d[g]);
            }
        }
}

/* y[t][n] = sum_k w'[n][k] x[t][k] for the tiled W [N][nb * BB] of base type QT; xin: x rounded
 * by tiled_qx_kernel; y [T][N] at ldy; W2, sg as matmul.cu's qmatvec_kernel. */
template <int QT, int TM>
__global__ void __launch_bounds__(MV_THREADS, MV_MINB(TM))
    tiled_matvec_kernel(float *__restrict__ y, size_t ldy, const uint8_t *__restrict__ W,
                        const uint8_t *__restrict__ W2, tq_x xin, int T, int N, mv_segs sg)
{
    constexpr int B = IFKC_QB(QT), BB = IFKC_QBB(QT), P = (BB - 4) / 16, R = MV_RT(TM);
    constexpr int U = TM <= 2 ? IFKC_TILE_U : 1; /* tiles of loads in flight */
    const int lane = threadIdx.x & 31, nb = xin.nb, nt = (nb + 31) / 32;
    int n0, Nm;
    float *ym;
    size_t ldm;
    const uint8_t *wr[R];
    if (!warp_begin<TM>(W, W2, y, ldy, N, (size_t)nb * BB, sg, lane, n0, ym, ldm, Nm, wr))
        return;
    float acc[TM][R];
#pragma unroll
    for (int t = 0; t < TM; t++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[t][r] = 0.0f;

    for (int i0 = 0; i0 < nt; i0 += U) {
        uint4 lv[U][R][P];
        uint32_t dm[U][R];
#pragma unroll
        for (int u = 0; u < U; u++) { /* loads first */
            const int i = i0 + u, c = i < nt ? min(32, nb - 32 * i) : 0;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint8_t *base = wr[r] + (size_t)32 * i * BB;
#pragma unroll
                for (int p = 0; p < P; p++)
                    lv[u][r][p] = lane < c ? __ldg((const uint4 *)(base + (size_t)p * c * 16 + 16 * lane))
                                           : make_uint4(0, 0, 0, 0);
                dm[u][r] = lane < c ? ifkc_ld32(base + (size_t)P * c * 16 + 4 * lane) : 0u;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int b = 32 * (i0 + u) + lane;
            if (b >= nb)
                continue;
#pragma unroll
            for (int t = 0; t < TM; t++) {
                const size_t tt = (size_t)min(t, T - 1);
                const uint4 *xp = (const uint4 *)(xin.q + tt * xin.kp + (size_t)b * B);
                uint4 xv[B / 16];
#pragma unroll
                for (int h = 0; h < B / 16; h++)
                    xv[h] = __ldg(xp + h);
                const float4 xb = __ldg(xin.blk + tt * nb + b); /* s0, sum, s1, cor */
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int d[2] = {0, 0};
                    block_dots<QT>(lv[u][r], xv, d);
                    const float dl = ifkc_f16_to_f32((uint16_t)(dm[u][r] & 0xffffu)),
                                mn = ifkc_f16_to_f32((uint16_t)(dm[u][r] >> 16));
                    acc[t][r] = fmaf(dl, fmaf(xb.x, (float)d[0], fmaf(xb.z, (float)d[1], xb.w)), fmaf(mn, xb.y, acc[t][r]));
                }
            }
        }
    }
    if (xin.k > 0 && lane < xin.k) { /* the outliers, lane k taking the token's k-th */
#pragma unroll
        for (int t = 0; t < TM; t++) {
            const int i = t < T ? xin.oi[(size_t)t * QX_KMAX + lane] : -1;
            if (i < 0)
                continue;
            const float v = xin.ov[(size_t)t * QX_KMAX + lane];
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[t][r] = fmaf(v, ifkc_tile_weight(QT, wr[r], nb, i), acc[t][r]);
        }
    }
    if (W2)
        warp_store_glu<TM>(acc, ym, ldm, T, n0, lane);
    else
        warp_store<TM>(acc, ym, ldm, T, Nm, n0, lane);
}

/* ---- prefill: rows to F16 -------------------------------------------------------------------- */

/* One thread per level part (16 bytes) of a block. W: [rows][nb * BB] tiled; out: [rows][nb * B]. */
template <int QT>
__global__ void tiled_dequant_kernel(__half *__restrict__ out, const uint8_t *__restrict__ W, int rows, int nb)
{
    constexpr int B = IFKC_QB(QT), BB = IFKC_QBB(QT), P = (BB - 4) / 16;
    constexpr bool Q8 = QT == IFK_Q8_B32 || QT == IFK_Q8_B64;
    ifkc_grid_begin();
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, per_row = (size_t)nb * P;
    if (i >= (size_t)rows * per_row)
        return;
    const size_t row = i / per_row;
    const int b = (int)(i % per_row / P), p = (int)(i % P);
    const uint8_t *rp = W + row * nb * BB;
    const uint4 v = *(const uint4 *)(rp + ifkc_tile_part_at(QT, nb, b, p));
    float d, m;
    ifkc_qdelta_min(rp + ifkc_tile_word_at(QT, nb, b), &d, &m);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    __half *o = out + row * nb * B + (size_t)b * B;
    uint32_t h[2][8]; /* h[0]: the 16 elements of the bytes (Q8) or low nibbles, h[1]: high nibbles */
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const uint32_t a = w[k / 2] >> (16 * (k % 2)), b2 = a >> 8;
        h[0][k] = Q8 ? half2_bits(fmaf((float)(a & 255u), d, m), fmaf((float)(b2 & 255u), d, m))
                     : half2_bits(fmaf((float)(a & 15u), d, m), fmaf((float)(b2 & 15u), d, m));
        h[1][k] = half2_bits(fmaf((float)((a >> 4) & 15u), d, m), fmaf((float)((b2 >> 4) & 15u), d, m));
    }
    /* Q8: elements 16 p ..; Q4_B64: 16 p .. and 32 + 16 p ..; Q4_B32: 0 .. and 16 .. */
    uint4 *o0 = (uint4 *)(o + 16 * p);
    o0[0] = make_uint4(h[0][0], h[0][1], h[0][2], h[0][3]);
    o0[1] = make_uint4(h[0][4], h[0][5], h[0][6], h[0][7]);
    if (!Q8) {
        uint4 *o1 = (uint4 *)(o + 16 * p + B / 2);
        o1[0] = make_uint4(h[1][0], h[1][1], h[1][2], h[1][3]);
        o1[1] = make_uint4(h[1][4], h[1][5], h[1][6], h[1][7]);
    }
}

/* ---- launches -------------------------------------------------------------------------------- */

/* tiled_matvec_kernel by TM, for launch_tm (matvec.cuh). */
template <int QT> struct tiled_matvec_k {
    template <int TM> static auto k() { return &tiled_matvec_kernel<QT, TM>; }
};

/* The rounding of T rows of K for base type QT in the handle's IFKC_SCRATCH_XQ slot. */
template <int QT>
static int xq_layout(ifkc_dev *d, int T, int K, tq_x *xin)
{
    constexpr int B = IFKC_QB(QT);
    const int nb = (K + B - 1) / B, kp = nb * B;
    const size_t qb = (size_t)T * kp, bb = (size_t)T * nb * sizeof(float4), ob = (size_t)T * QX_KMAX * 4;
    void *p;
    int rc = ifkc_scratch(d, IFKC_SCRATCH_XQ, qb + bb + 2 * ob, &p);
    if (rc)
        return rc;
    /* kp is a multiple of 128 (nb % 4 == 0), so every piece is 16-byte aligned */
    *xin = {(int8_t *)p, (float4 *)((char *)p + qb), (int32_t *)((char *)p + qb + bb),
            (float *)((char *)p + qb + bb + ob), kp, nb, ifk_qx_split_k(K)};
    if (xin->k > QX_KMAX)
        xin->k = QX_KMAX;
    return 0;
}

template <int QT>
static int launch_tiled(ifkc_dev *d, float *y, size_t ldy, const uint8_t *W, const uint8_t *W2, const float *x,
                        size_t ldx, int T, int N, int K, const mv_segs &sg)
{
    tq_x xin;
    int rc = xq_layout<QT>(d, T, K, &xin);
    if (rc)
        return rc;
    /* x rounded by the norm that wrote it, with nothing enqueued since (tiled_norm)? */
    const bool rounded = d->xq.src == x && d->xq.seq == d->seq && d->xq.T == T && d->xq.K == K && d->xq.type == QT &&
                         (T == 1 || ldx == (size_t)K);
    if (!rounded)
        IFKC_CKL(ifkc_launch(d, tiled_qx_kernel<QT>, (unsigned)T, QX_THREADS, 0, xin, x, ldx, K), "tiled_qx_kernel");
    IFKC_CKL(launch_tm<tiled_matvec_k<QT>>(d, T, N, W2 != NULL, y, ldy, W, W2, xin, T, N, sg), "tiled_matvec_kernel");
    return 0;
}

template <int QT>
static int launch_norm_round(ifkc_dev *d, float *y, float *x, const float *r, const float *w, int T, int n, float eps)
{
    tq_x o;
    int rc = xq_layout<QT>(d, T, n, &o);
    if (rc)
        return rc;
    const int pt = (n + RMS_THREADS - 1) / RMS_THREADS;
    cudaError_t e;
    if (pt <= 2)
        e = ifkc_launch(d, norm_round_kernel<2, QT>, (unsigned)T, RMS_THREADS, 0, y, x, r, w, n, eps, o);
    else if (pt <= 4)
        e = ifkc_launch(d, norm_round_kernel<4, QT>, (unsigned)T, RMS_THREADS, 0, y, x, r, w, n, eps, o);
    else if (pt <= 8)
        e = ifkc_launch(d, norm_round_kernel<8, QT>, (unsigned)T, RMS_THREADS, 0, y, x, r, w, n, eps, o);
    else
        e = ifkc_launch(d, norm_round_kernel<RMS_PT_MAX, QT>, (unsigned)T, RMS_THREADS, 0, y, x, r, w, n, eps, o);
    IFKC_CKL(e, "norm_round_kernel");
    d->xq.src = y, d->xq.T = T, d->xq.K = n, d->xq.type = QT, d->xq.seq = d->seq;
    return 1;
}

int tiled_norm(ifkc_dev *d, float *y, float *x, const float *r, const float *w, int T, int n, float eps)
{
    const int type = d->tile_type, pt = (n + RMS_THREADS - 1) / RMS_THREADS;
    /* (ops.cu's own kernels take rows of one block's threads or fewer, and past RMS_PT_MAX a
     * block's values, otherwise) */
    if (type <= 0 || T < 1 || T > IFKC_MATVEC_MAX_T || pt < 2 || pt > RMS_PT_MAX || !ifkc_tile_ok(type, n))
        return 0;
    switch (type) {
    case IFK_Q4_B32: return launch_norm_round<IFK_Q4_B32>(d, y, x, r, w, T, n, eps);
    case IFK_Q4_B64: return launch_norm_round<IFK_Q4_B64>(d, y, x, r, w, T, n, eps);
    case IFK_Q8_B32: return launch_norm_round<IFK_Q8_B32>(d, y, x, r, w, T, n, eps);
    default: return launch_norm_round<IFK_Q8_B64>(d, y, x, r, w, T, n, eps);
    }
}

extern "C" int ifkc_tile_norm(ifkc_dev *d, int type)
{
    if (!d || (type != 0 && !IFKC_TILE_TYPE(type)))
        return ifkc_seterr(IFKC_EINVAL, "ifkc_tile_norm: type %d has no tiles", type);
    d->tile_type = type;
    d->xq.src = NULL;
    return 0;
}

int tiled_matvec(ifkc_dev *d, float *y, size_t ldy, const void *W, const void *W2, int wtype, const float *x,
                 size_t ldx, int T, int N, int K, const mv_segs &sg)
{
    const int base = wtype - IFKC_TILED;
    if (!ifkc_tile_ok(base, K))
        return ifkc_seterr(IFKC_EINVAL, "ifkc_matmul: a tiled matrix of type %d cannot have K = %d columns", base, K);
    const uint8_t *Wt = (const uint8_t *)W, *Wt2 = (const uint8_t *)W2;
    switch (base) {
    case IFK_Q4_B32: return launch_tiled<IFK_Q4_B32>(d, y, ldy, Wt, Wt2, x, ldx, T, N, K, sg);
    case IFK_Q4_B64: return launch_tiled<IFK_Q4_B64>(d, y, ldy, Wt, Wt2, x, ldx, T, N, K, sg);
    case IFK_Q8_B32: return launch_tiled<IFK_Q8_B32>(d, y, ldy, Wt, Wt2, x, ldx, T, N, K, sg);
    default: return launch_tiled<IFK_Q8_B64>(d, y, ldy, Wt, Wt2, x, ldx, T, N, K, sg);
    }
}

template <int QT>
static int launch_tiled_dequant(ifkc_dev *d, __half *out, const uint8_t *W, int rows, int nb)
{
    const size_t n = (size_t)rows * nb * ((IFKC_QBB(QT) - 4) / 16);
    IFKC_CKL(ifkc_launch(d, tiled_dequant_kernel<QT>, ifkc_cdiv(n, 256), 256, 0, out, W, rows, nb),
             "tiled_dequant_kernel");
    return 0;
}

int tiled_dequant(ifkc_dev *d, __half *out, const uint8_t *W, int wtype, int rows, int nb)
{
    switch (wtype) {
    case IFK_Q4_B32: return launch_tiled_dequant<IFK_Q4_B32>(d, out, W, rows, nb);
    case IFK_Q4_B64: return launch_tiled_dequant<IFK_Q4_B64>(d, out, W, rows, nb);
    case IFK_Q8_B32: return launch_tiled_dequant<IFK_Q8_B32>(d, out, W, rows, nb);
    default: return launch_tiled_dequant<IFK_Q8_B64>(d, out, W, rows, nb);
    }
}

/* ---- packing ----------------------------------------------------------------------------------- */

extern "C" int ifkc_tile_pack(ifkc_dev *d, void **out, int *out_type, const void *W, int wtype, int N, int K)
{
    if (!d || !out || !out_type || !W || N <= 0)
        return ifkc_seterr(IFKC_EINVAL, "ifkc_tile_pack: bad arguments (N %d)", N);
    *out = NULL;
    *out_type = wtype;
    if (!ifkc_tile_ok(wtype, K))
        return 0;
    const int nb = (K + IFKC_QB(wtype) - 1) / IFKC_QB(wtype);
    const size_t rs = (size_t)nb * IFKC_QBB(wtype);
    size_t rows = ((size_t)8 << 20) / rs;
    if (rows < 1)
        rows = 1;
    if (rows > (size_t)N)
        rows = (size_t)N;
    uint8_t *buf = (uint8_t *)malloc(rows * rs);
    if (!buf)
        return ifkc_seterr(IFKC_ENOMEM, "ifkc_tile_pack: out of host memory (%zu bytes)", rows * rs);
    void *p = NULL;
    int rc = ifkc_malloc(d, &p, (size_t)N * rs);
    for (size_t n0 = 0; rc == 0 && n0 < (size_t)N; n0 += rows) {
        const size_t nr = (size_t)N - n0 < rows ? (size_t)N - n0 : rows;
        for (size_t r = 0; r < nr; r++)
            ifkc_tile_pack_row(buf + r * rs, (const uint8_t *)W + (n0 + r) * rs, wtype, nb);
        rc = ifkc_upload(d, (uint8_t *)p + n0 * rs, buf, nr * rs);
    }
    free(buf);
    if (rc) {
        if (p)
            ifkc_free(d, p);
        return rc;
    }
    *out = p;
    *out_type = IFKC_TILED + wtype;
    d->tile_type = d->tile_type == 0 || d->tile_type == wtype ? wtype : -1; /* the norms round for one type */
    return 0;
}
