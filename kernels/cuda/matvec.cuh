/*
 * matvec.cuh -- what the decode products of matmul.cu (row layout) and qtiled.cu (warp tiles)
 * share: their launch shape, the warp's rows and outputs, the qkv segments, and the epilogues.
 * Internal to kernels/cuda (C++; the contract is cuda_kernels.h).
 *
 * A decode product (T <= IFKC_MATVEC_MAX_T tokens, TM = T rounded up to 1, 2, 4 or 8) is a
 * grid of blocks of MV_WARPS warps; a warp owns MV_RT(TM) consecutive rows of W and computes
 * all T outputs of each in registers (acc[TM][MV_RT(TM)]), or, for a GLU pair, one output n
 * from row n of the gate matrix and row n of the up one. Lane partial sums are added with xor
 * shuffles at the end (warp_store, warp_store_glu).
 */
#ifndef IFKC_MATVEC_CUH
#define IFKC_MATVEC_CUH

#include "kernels/cuda/common.cuh"

#include <cuda_fp16.h>
#include <stdint.h>

#include <utility>

/* The IFKC_MV_* macros exist only so that tools/gpu-variants.sh can build gpubench with other
 * values and time them side by side; the defaults are the tuned ones. IFKC_MV_R_WIDE: rows a
 * warp for 4 and 8 tokens (on an H200 4 rows raised T = 8 from 0.31 to 0.43-0.46 of the
 * bandwidth in F16, but with 4 rows at T = 1 too; to be checked on its own). */
#ifndef IFKC_MV_WARPS
#define IFKC_MV_WARPS 4
#endif
#ifndef IFKC_MV_R
#define IFKC_MV_R 2
#endif
#ifndef IFKC_MV_U1
#define IFKC_MV_U1 8
#endif
#ifndef IFKC_MV_MINB
#define IFKC_MV_MINB 4
#endif
/* IFKC_MV_PREFETCH=1: the decode products prefetch their rows into L2 at their start also
 * without overlapped launches (where they always do), to tell the two effects apart. */
#ifndef IFKC_MV_PREFETCH
#define IFKC_MV_PREFETCH 0
#endif
#define MV_WARPS IFKC_MV_WARPS       /* warps per block of the matrix-vector kernels */
#define MV_THREADS (32 * MV_WARPS)
#ifndef IFKC_MV_R_WIDE
#define IFKC_MV_R_WIDE IFKC_MV_R
#endif
#define MV_R IFKC_MV_R               /* rows of W per warp ... */
#define MV_RT(TM) ((TM) >= 4 ? IFKC_MV_R_WIDE : MV_R) /* ... for TM tokens (IFKC_MV_R_WIDE from 4 on) */
/* blocks per SM the kernels are compiled for: small T fits in 128 registers (without this
 * hint ptxas spilled a few bytes there) */
#define MV_MINB(TM) ((TM) <= 2 ? IFKC_MV_MINB : 1)

/* ---- small device helpers -------------------------------------------------------------------- */

__device__ __forceinline__ float4 ldg4(const float *p) /* p: 16-byte aligned */
{
    return __ldg((const float4 *)p);
}

/* Sum acc over the warp; lane 0 stores the outputs that exist. y: [T][N] at stride ldy. */
template <int TM>
__device__ __forceinline__ void warp_store(float (&acc)[TM][MV_RT(TM)], float *y, size_t ldy, int T, int N,
                                           int n0, int lane)
{
#pragma unroll
    for (int t = 0; t < TM; t++)
#pragma unroll
        for (int r = 0; r < MV_RT(TM); r++) {
            float v = acc[t][r];
#pragma unroll
            for (int off = 16; off > 0; off /= 2)
                v += __shfl_xor_sync(0xffffffffu, v, off);
            acc[t][r] = v;
        }
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < TM; t++)
#pragma unroll
            for (int r = 0; r < MV_RT(TM); r++)
                if (t < T && n0 + r < N)
                    y[(size_t)t * ldy + n0 + r] = acc[t][r];
    }
}

/* The gated FFN's epilogue (GLU kernels: row 0 of the warp is gate row n0, row 1 up row n0):
 * y[t][n0] = silu(gate) * up, ifkc_silu_mul's formula. */
template <int TM>
__device__ __forceinline__ void warp_store_glu(float (&acc)[TM][MV_RT(TM)], float *y, size_t ldy, int T, int n0,
                                               int lane)
{
#pragma unroll
    for (int t = 0; t < TM; t++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float v = acc[t][r];
#pragma unroll
            for (int off = 16; off > 0; off /= 2)
                v += __shfl_xor_sync(0xffffffffu, v, off);
            acc[t][r] = v;
        }
    if (lane == 0)
#pragma unroll
        for (int t = 0; t < TM; t++)
            if (t < T) {
                const float v = acc[t][0];
                y[(size_t)t * ldy + n0] = __fmul_rn(v / (1.0f + expf(-v)), acc[t][1]);
            }
}

/* Rows of W a warp starts at, and row r's base: rows n0 + r of W; with GLU (W2 not NULL) the
 * warp owns output n0 alone, row 0 from W and row 1 from W2. */
template <int TM>
__device__ __forceinline__ int warp_row0(bool glu)
{
    const int w = (int)(blockIdx.x * MV_WARPS + threadIdx.x / 32);
    return glu ? w : w * MV_RT(TM);
}

/* Up to three matrices of one type computed by one launch as the rows of one (ifkc_matmul_qkv):
 * rows end[s-1] .. end[s]-1 of the launch are rows 0.. of W[s], written to y[s] at stride
 * ld[s]. n = 0: one matrix (the kernel's own W, y, ldy). Each segment's rows are a multiple of
 * the rows a warp computes, so a warp stays in one. */
struct mv_segs {
    const void *W[3];
    float *y[3];
    size_t ld[3];
    int end[3];
    int n;
    int prefetch; /* the warp's rows into L2 before ifkc_grid_begin (overlapped launches) */
};

/* The matrix, output, stride and local row of row n0 of the launch (and N: that matrix's rows). */
template <typename P>
__device__ __forceinline__ void seg_pick(const mv_segs &sg, int &n0, int &N, P &W, float *&y, size_t &ldy)
{
    if (!sg.n)
        return;
    /* selects, not sg.W[s]: an index into the parameters would copy them to local memory */
    const bool s0 = n0 < sg.end[0], s1 = !s0 && n0 < sg.end[1];
    const int start = s0 ? 0 : s1 ? sg.end[0] : sg.end[1];
    W = (P)(s0 ? sg.W[0] : s1 ? sg.W[1] : sg.W[2]);
    y = s0 ? sg.y[0] : s1 ? sg.y[1] : sg.y[2];
    ldy = s0 ? sg.ld[0] : s1 ? sg.ld[1] : sg.ld[2];
    N = (s0 ? sg.end[0] : s1 ? sg.end[1] : sg.end[2]) - start;
    n0 -= start;
}


/* a (4 unsigned bytes) . b (4 signed bytes) + c */
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c)
{
#ifdef __CUDA_ARCH__
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else /* the CPU emulation (tests/cuda-emu) */
    for (int i = 0; i < 4; i++)
        c += (int)((a >> (8 * i)) & 0xffu) * (int)(int8_t)(b >> (8 * i));
    return c;
#endif
}
/* A decode kernel's start, for one warp: its first row n0 of the launch (false when it has
 * none: it has then waited, and must return), the output, stride and row count of its segment
 * (seg_pick), and its MV_RT(TM) rows of W, rb bytes each (a GLU pair: row n0 of W and of W2;
 * rows past the segment's last repeat it), fetched into L2 before the wait when sg.prefetch
 * (overlapped launches: no kernel writes W). Ends with ifkc_grid_begin(). */
template <int TM>
__device__ __forceinline__ bool warp_begin(const uint8_t *W, const uint8_t *W2, float *y, size_t ldy, int N, size_t rb,
                                           const mv_segs &sg, int lane, int &n0, float *&ym, size_t &ldm, int &Nm,
                                           const uint8_t *(&wr)[MV_RT(TM)])
{
    n0 = warp_row0<TM>(W2 != NULL);
    if (n0 >= N) { /* the whole warp */
        ifkc_grid_begin();
        return false;
    }
    const uint8_t *Wm = W;
    ym = y, ldm = ldy, Nm = N;
    seg_pick(sg, n0, Nm, Wm, ym, ldm);
    if (sg.prefetch) {
        if (W2) {
            ifkc_prefetch_l2(W + (size_t)n0 * rb, rb, lane, 32);
            ifkc_prefetch_l2(W2 + (size_t)n0 * rb, rb, lane, 32);
        } else {
            ifkc_prefetch_l2(Wm + (size_t)n0 * rb, (size_t)min(MV_RT(TM), Nm - n0) * rb, lane, 32);
        }
    }
#pragma unroll
    for (int r = 0; r < MV_RT(TM); r++)
        wr[r] = W2 ? (r == 0 ? W : W2) + (size_t)n0 * rb : Wm + (size_t)min(n0 + r, Nm - 1) * rb;
    ifkc_grid_begin();
    return true;
}

/* Two floats rounded to F16, a in the low half. */
__device__ __forceinline__ uint32_t half2_bits(float a, float b)
{
    return (uint32_t)__half_as_ushort(__float2half_rn(a)) | (uint32_t)__half_as_ushort(__float2half_rn(b)) << 16;
}

/* ---- launch shape (host) ------------------------------------------------------------------- */

static inline int tm_of(int T) { return T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : 8; }

/* Blocks for N outputs: MV_RT rows a warp, or one output a warp for a GLU pair. */
static inline unsigned mv_blocks(int N, int tm, bool glu)
{
    return ifkc_cdiv((size_t)N, (size_t)MV_WARPS * (glu ? 1 : MV_RT(tm)));
}

/* Launch KP::k<TM>() (a decode kernel instantiated for TM tokens) for TM = tm_of(T), on a
 * grid of mv_blocks. KP: a struct with  template <int TM> static auto k() { return &kernel<.., TM>; }. */
template <typename KP, typename... A>
static inline cudaError_t launch_tm(ifkc_dev *d, int T, int N, bool glu, A &&...args)
{
    const dim3 grid(mv_blocks(N, tm_of(T), glu)), block(MV_THREADS);
    switch (tm_of(T)) {
    case 1: return ifkc_launch(d, KP::template k<1>(), grid, block, 0, std::forward<A>(args)...);
    case 2: return ifkc_launch(d, KP::template k<2>(), grid, block, 0, std::forward<A>(args)...);
    case 4: return ifkc_launch(d, KP::template k<4>(), grid, block, 0, std::forward<A>(args)...);
    default: return ifkc_launch(d, KP::template k<8>(), grid, block, 0, std::forward<A>(args)...);
    }
}

/* ---- the warp-tile products (qtiled.cu), called by matmul.cu's entry points -------------------- */

/* The decode product (T <= IFKC_MATVEC_MAX_T) of a tiled matrix (wtype IFKC_TILED + base): as
 * matmul.cu's matvec, W2 a GLU pair's up matrix, sg the qkv segments. x need not be aligned. */
int tiled_matvec(ifkc_dev *d, float *y, size_t ldy, const void *W, const void *W2, int wtype, const float *x,
                 size_t ldx, int T, int N, int K, const mv_segs &sg);
/* ops.cu's RMS norms (r NULL: ifkc_rmsnorm; else ifkc_add_rmsnorm) where the device has tiles of
 * one type (ifkc_tile_pack) and T is decode-sized: the norm's kernel also rounds y to int8 for
 * them, and the tiled product that reads y next uses that rounding instead of launching its
 * own. 1: done so; 0: not applicable (the caller runs its own kernel); < 0: an error. */
int tiled_norm(ifkc_dev *d, float *y, float *x, const float *r, const float *w, int T, int n, float eps);
/* Rows of a tiled matrix (base type wtype) to F16 at out [rows][nb * B], as matmul.cu's
 * dequant_rows does for the row layout (the prefill path). */
int tiled_dequant(ifkc_dev *d, __half *out, const uint8_t *W, int wtype, int rows, int nb);

#endif
