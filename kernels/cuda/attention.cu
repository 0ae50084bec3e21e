/*
 * attention.cu -- causal grouped-query attention over an F32 or F16 KV cache, and the cache
 * store. Contract: cuda_kernels.h (ifkc_attention*, ifkc_kv_store); reference: ifk_attention.
 *
 * Plan
 *   Scores are computed in log2 units: q is multiplied once by scale * log2(e), so every
 *   exponential is an exp2f and the softmax is unchanged. All sums are F32.
 *
 *   Decode (one query token, n_pos keys): flash-decoding in two kernels.
 *   1. attn_decode_chunk<D, KV, GM>, grid (chunk, kv head, query-head slice), 256 threads. A
 *      block owns GM query heads of one kv head (GM = the group rounded up to a power of two,
 *      at most DEC_GMAX = 8: the whole group for ratios up to 8; larger groups are cut into
 *      slices) and a chunk of at most DEC_CHUNK_MAX keys, and reads each K and V row of its
 *      chunk exactly once for all its query heads. GM is a template argument so that a block
 *      computes no more heads than the group has: the per-key arithmetic, which bounds the
 *      kernel (a 128-dim F16 row is 16 bytes a lane for 8 GM multiply-adds), scales with it.
 *      - A cache row is read as 16-byte pieces (4 F32 or 8 F16 values). The lanes of a warp
 *        form segments of S lanes (S = the row's piece count rounded up to a power of two,
 *        at most 32); a segment reads one row, lane by lane contiguous, so a warp reads
 *        32/S whole rows per load instruction: fully coalesced. Each warp keeps DEC_UNROLL
 *        such loads in flight before using them (memory-level parallelism).
 *      - Pass 1: score = q . k for every query head, summed over the segment by a
 *        reduce-scatter of xor shuffles (9 shuffles for 8 heads, not 40; log2(S) for one),
 *        stored to shared memory [head][key].
 *      - Per head: the chunk maximum m, p = exp2(score - m) in place, l = sum p.
 *      - Pass 2: every lane accumulates p * v for the pieces it owns, all heads at once; the
 *        segments of a warp are summed with shuffles, the warps one after another in shared
 *        memory (a fixed order: results do not depend on timing).
 *      - With one chunk the block writes out = acc / l; otherwise it writes the partial
 *        (acc, m, l) to the handle's IFKC_SCRATCH_ATTN slot.
 *   2. attn_decode_merge, one block per query head: M = max m_c, then
 *      out = sum_c acc_c * exp2(m_c - M) / sum_c l_c * exp2(m_c - M) (the chunks' weights
 *      computed by the block's threads together, the sums with several loads in flight).
 *      The chunk length is chosen on the host so that n_kv_heads * slices * chunks is about
 *      two blocks per SM (the kernel fits two per SM; four when GM <= 2, whose blocks need
 *      fewer registers), within [DEC_CHUNK_MIN, DEC_CHUNK_MAX]
 *      keys, a multiple of 32: a context up to 64 keys is one chunk and needs no merge; 4k
 *      keys and more give every SM work; very long contexts give more waves of full chunks.
 *      The 16-byte loads need 16-byte aligned K/V rows (k, v and kv_ld * element size); a
 *      cache that is not aligned so runs the prefill kernel with T = 1 instead (correct, not
 *      bandwidth-optimal).
 *
 *   Prefill (T query tokens at pos0.., causal): attn_prefill_tile, grid (query tile, query
 *   head), 128 threads. A block holds a tile of PF_BQ = 32 queries of one head in shared
 *   memory and walks the key tiles of PF_BK = 32 keys it can see (keys 0 .. pos0 + last
 *   token of the tile): the K tile, later the V tile in the same buffer, is loaded
 *   cooperatively (consecutive threads, consecutive elements; any alignment) and converted
 *   to F32 in shared memory, the 32 x 32 scores are computed (4 threads a query row, 8 keys
 *   each; then head_dim/4 output dims each for P V), masked (key j visible to token t
 *   iff j <= pos0 + t), and merged into the running (max, sum, output) of each row: the
 *   online softmax of flash attention. Memory stays linear in the context; nothing of size
 *   T x n_ctx is stored. Tiles of the last tokens (the most keys) are scheduled first.
 *   Rows of a tile past T see no key and are not written.
 *
 *   Head dims 8, 16, 32, 64, 80, 96, 128, 256 and both cache types are template instances of
 *   the two kernels (the decode kernel also per GM: 1, 2, 4, 8 for head dims 64 and up, 8 for
 *   the others); the merge kernel takes head_dim at run time. 8 to 32 are the tiny test
 *   models' (stories260K, xs-ckpt: 8), correct but not tuned.
 */
#include "kernels/cuda/common.cuh"

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cpu/kernels.h"

#define IFKC_LOG2E 1.4426950408889634f
#define FULL_MASK 0xffffffffu

/* ---- cache element access --------------------------------------------------------------- */

static __device__ __forceinline__ float kv_float(float x) { return x; }
static __device__ __forceinline__ float kv_float(__half x) { return __half2float(x); }

/* A 16-byte piece of a cache row as E floats. */
template <typename KV> struct kv_piece;
template <> struct kv_piece<float> {
    static constexpr int E = 4;
    /* f: [4] */
    static __device__ __forceinline__ void unpack(uint4 r, float *f)
    {
        f[0] = __uint_as_float(r.x);
        f[1] = __uint_as_float(r.y);
        f[2] = __uint_as_float(r.z);
        f[3] = __uint_as_float(r.w);
    }
};
template <> struct kv_piece<__half> {
    static constexpr int E = 8;
    /* f: [8] */
    static __device__ __forceinline__ void unpack(uint4 r, float *f)
    {
        const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h = __halves2half2(__ushort_as_half((unsigned short)(w[i] & 0xffffu)),
                                       __ushort_as_half((unsigned short)(w[i] >> 16)));
            float2 f2 = __half22float2(h);
            f[2 * i] = f2.x;
            f[2 * i + 1] = f2.y;
        }
    }
};

static __host__ __device__ constexpr int pow2_at_least(int x) { return x <= 1 ? 1 : 2 * pow2_at_least((x + 1) / 2); }

/* ---- decode ------------------------------------------------------------------------------ */

/* IFKC_DEC_UNROLL, IFKC_DEC_BPS and IFKC_DEC_MINB exist only so that tools/gpu-variants.sh can
 * build gpubench with other values and time them side by side. */
#ifndef IFKC_DEC_UNROLL
#define IFKC_DEC_UNROLL 4
#endif
#ifndef IFKC_DEC_BPS
#define IFKC_DEC_BPS 2
#endif
#ifndef IFKC_DEC_MINB /* blocks an SM the decoding kernel is compiled for (registers: 64K / (256 x this)) */
#define IFKC_DEC_MINB 2
#endif
#ifndef IFKC_DEC_PREFETCH /* 1: the chunk's rows into L2 also without overlapped launches (where they always are) */
#define IFKC_DEC_PREFETCH 0
#endif

enum {
    DEC_WARPS = 8,
    DEC_THREADS = DEC_WARPS * 32,
    DEC_GMAX = 8,          /* query heads per block, at most                     */
    DEC_CHUNK_MIN = 64,    /* keys per chunk, at least (shorter contexts: 1 chunk) */
    DEC_CHUNK_MAX = 1024,  /* keys per chunk, at most (the score buffer)         */
    DEC_UNROLL = IFKC_DEC_UNROLL /* row loads in flight per lane                 */
};

/* How a row of D elements of KV is spread over a warp. */
template <int D, typename KV> struct dec_shape {
    static constexpr int E = kv_piece<KV>::E;       /* elements per 16-byte piece        */
    static constexpr int P = D / E;                  /* pieces per row                    */
    /* lanes per row: at least 8 (the reduce-scatter's three halvings; lanes past P idle) */
    static constexpr int S = pow2_at_least(P) < 8 ? 8 : pow2_at_least(P) < 32 ? pow2_at_least(P) : 32;
    static constexpr int PPL = (P + S - 1) / S;      /* pieces per lane                   */
    static constexpr int KPW = 32 / S;               /* rows a warp reads at once         */
    static constexpr int STEP = DEC_WARPS * KPW;     /* rows the block reads at once      */
    static_assert(D % E == 0, "head_dim must be a multiple of the piece");
};

struct dec_args {
    float *out;           /* [n_heads][D]: written when n_chunks == 1               */
    float *part_o;        /* [n_heads][n_chunks][D]: unnormalized chunk outputs     */
    float *part_ml;       /* [n_heads][n_chunks][2]: chunk max (log2 units), sum    */
    const float *q;       /* [n_heads][D]                                           */
    const void *k, *v;    /* [n_pos][kv_ld] of KV, 16-byte aligned rows             */
    size_t kv_ld;
    int n_pos, group, chunk_len, n_chunks;
    int chunk_stride;     /* chunks a head's partials are apart (n_chunks, or the most) */
    float qscale;         /* scale * log2(e)                                        */
    /* A positional recording (ifkc_graph_begin_at): n_pos = *pos_dev + 1, and chunk_len and
     * n_chunks follow from it on the device as decode_chunk_len gives them on the host (with
     * bpc and want); the grid has the most chunks, and blocks past n_chunks return. */
    const int *pos_dev;
    int bpc;
    long long want;
    int prefetch;         /* the chunk's K and V rows into L2 before ifkc_grid_begin      */
};

/* Keys per chunk: about `want` blocks over all (kv head, slice) pairs (bpc of them a chunk), a
 * multiple of 32, within [DEC_CHUNK_MIN, DEC_CHUNK_MAX]. */
static __host__ __device__ int decode_chunk_len(int n_pos, int bpc, long long want)
{
    long long len = ((long long)n_pos * bpc + want - 1) / want;
    len = (len + 31) / 32 * 32;
    if (len < DEC_CHUNK_MIN)
        len = DEC_CHUNK_MIN;
    if (len > DEC_CHUNK_MAX)
        len = DEC_CHUNK_MAX;
    return (int)len;
}

/* n_pos, chunk_len and n_chunks of this launch. */
static __device__ __forceinline__ void dec_extent(const dec_args &a, int *n_pos, int *chunk_len, int *n_chunks)
{
    *n_pos = a.n_pos, *chunk_len = a.chunk_len, *n_chunks = a.n_chunks;
    if (a.pos_dev) {
        *n_pos = *a.pos_dev + 1;
        *chunk_len = decode_chunk_len(*n_pos, a.bpc, a.want);
        *n_chunks = (*n_pos + *chunk_len - 1) / *chunk_len;
    }
}

/* The n cached rows from j0 of kv head kvh, K and V, into L2 (overlapped launches: while the
 * kernel before this one finishes). Prefetches never make stale data: L2 is where the GPU's
 * writes go, so rows that kernel is still writing (the step's own key and value) are fetched
 * again or updated there. */
template <int D, typename KV>
static __device__ __forceinline__ void dec_prefetch(const dec_args &a, int j0, int n, int kvh)
{
    for (int i = threadIdx.x; i < 2 * n; i += blockDim.x) {
        const KV *row = (const KV *)(i < n ? a.k : a.v) + (size_t)(j0 + i % n) * a.kv_ld + (size_t)kvh * D;
        ifkc_prefetch_l2(row, D * sizeof(KV), 0, 1);
    }
}

/* A decoding block's start (chunk c of kv head kvh): its launch's extent, the chunk's K and V
 * rows into L2 when a.prefetch, then ifkc_grid_begin. The extent is read before the wait: a
 * positional recording's *pos_dev is set before its graph is launched and by no kernel in it. */
template <int D, typename KV>
static __device__ __forceinline__ void dec_begin(const dec_args &a, int c, int kvh, int *n_pos, int *chunk_len,
                                                 int *n_chunks)
{
    dec_extent(a, n_pos, chunk_len, n_chunks);
    if (a.prefetch && c < *n_chunks)
        dec_prefetch<D, KV>(a, c * *chunk_len, min(*chunk_len, *n_pos - c * *chunk_len), kvh);
    ifkc_grid_begin();
}

template <typename T> static __device__ __forceinline__ T warp_sum(T v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
    return v;
}

/* Sums the GM values acc[0..GM) of each lane over the S lanes of its segment (GM a power of two
 * <= 8, S a power of two, GM <= S <= 32; segments S-aligned in the warp). Reduce-scatter: at
 * each of the first log2(GM) steps a lane keeps half of its values, sends the other half to its
 * partner and adds what it receives; then the single value left is summed over the remaining
 * lanes. 9 shuffles for GM = 8 and S = 32 where 8 separate reductions take 40. Returns the sum
 * for value g = rs_index<S, GM>(sl), sl the lane in the segment; acc is clobbered. */
template <int S, int GM> static __device__ __forceinline__ int rs_index(int sl)
{
    int g = 0;
#pragma unroll
    for (int t = 0, c = GM; c > 1; t++, c >>= 1)
        if (sl & (S >> (t + 1)))
            g |= c >> 1;
    return g;
}

template <int S, int GM> static __device__ __forceinline__ float segment_reduce_scatter(float (&acc)[GM], int sl)
{
    static_assert(GM >= 1 && GM <= 8 && (GM & (GM - 1)) == 0 && S >= GM && S <= 32, "halving steps inside a segment");
    int step = 0;
#pragma unroll
    for (int c = GM; c > 1; c >>= 1, step++) {
        const int off = S >> (step + 1);
        const bool up = (sl & off) != 0; /* keep the upper half */
#pragma unroll
        for (int i = 0; i < c / 2; i++) {
            const float keep = up ? acc[i + c / 2] : acc[i];
            const float send = up ? acc[i] : acc[i + c / 2];
            acc[i] = keep + __shfl_xor_sync(FULL_MASK, send, off);
        }
    }
    float v = acc[0];
#pragma unroll
    for (int off = S / (2 * GM); off > 0; off >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

template <int D, typename KV, int GM>
__global__ void __launch_bounds__(DEC_THREADS, IFKC_DEC_MINB) attn_decode_chunk(dec_args a)
{
    using SH = dec_shape<D, KV>;
    constexpr int E = SH::E, P = SH::P, S = SH::S, PPL = SH::PPL, KPW = SH::KPW, STEP = SH::STEP;
    /* Scores, then probabilities. Rows padded by 4 floats: the 8 heads' scores of one key
     * (and of the up to 4 keys of a warp) are stored at once to distinct banks. */
    __shared__ float s_p[GM][DEC_CHUNK_MAX + 4];
    __shared__ float s_o[GM][D];             /* the block's weighted V sums */
    __shared__ float s_m[GM], s_l[GM];

    const int c = blockIdx.x, kvh = blockIdx.y, g0 = blockIdx.z * GM;
    int n_pos, chunk_len, n_chunks;
    dec_begin<D, KV>(a, c, kvh, &n_pos, &chunk_len, &n_chunks);
    if (c >= n_chunks) /* a positional recording's grid has the most chunks */
        return;
    const int G = min(GM, a.group - g0);
    const int h0 = kvh * a.group + g0;
    const int j0 = c * chunk_len;
    const int n = min(chunk_len, n_pos - j0);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int seg = lane / S, sl = lane % S;
    const KV *kb = (const KV *)a.k + (size_t)j0 * a.kv_ld + (size_t)kvh * D;
    const KV *vb = (const KV *)a.v + (size_t)j0 * a.kv_ld + (size_t)kvh * D;

    /* The query elements of the pieces this lane owns, in log2 units. */
    float qr[GM][PPL][E];
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
        for (int i = 0; i < PPL; i++)
#pragma unroll
            for (int e = 0; e < E; e++) {
                const int p = sl + i * S;
                qr[g][i][e] = (g < G && p < P) ? a.q[(size_t)(h0 + g) * D + p * E + e] * a.qscale : 0.0f;
            }

    /* Pass 1: scores. Row j of the chunk is read by segment seg of warp w when
     * j = w*KPW + seg + u*STEP (mod STEP*DEC_UNROLL); jb is warp-uniform, so every lane
     * reaches the shuffles. */
    for (int jb = warp * KPW; jb < n; jb += STEP * DEC_UNROLL) {
        uint4 kr[DEC_UNROLL][PPL];
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++) {
            const int j = jb + u * STEP + seg;
#pragma unroll
            for (int i = 0; i < PPL; i++) {
                const int p = sl + i * S;
                kr[u][i] = (j < n && p < P) ? __ldg((const uint4 *)(kb + (size_t)j * a.kv_ld + p * E))
                                            : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++) {
            float acc[GM];
#pragma unroll
            for (int g = 0; g < GM; g++)
                acc[g] = 0.0f;
#pragma unroll
            for (int i = 0; i < PPL; i++) {
                float kf[E];
                kv_piece<KV>::unpack(kr[u][i], kf);
#pragma unroll
                for (int g = 0; g < GM; g++)
#pragma unroll
                    for (int e = 0; e < E; e++)
                        acc[g] = fmaf(qr[g][i][e], kf[e], acc[g]);
            }
            const float sc = segment_reduce_scatter<S, GM>(acc, sl);
            const int j = jb + u * STEP + seg;
            if ((sl & (S / GM - 1)) == 0) {
                const int g = rs_index<S, GM>(sl);
                if (g < G && j < n)
                    s_p[g][j] = sc;
            }
        }
    }
    __syncthreads();

    /* Chunk maximum, probabilities, their sum: warp w handles heads w, w + DEC_WARPS, ... */
    for (int g = warp; g < G; g += DEC_WARPS) {
        float m = -INFINITY;
        for (int j = lane; j < n; j += 32)
            m = fmaxf(m, s_p[g][j]);
        m = warp_max(m);
        float l = 0.0f;
        for (int j = lane; j < n; j += 32) {
            const float p = exp2f(s_p[g][j] - m);
            s_p[g][j] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) {
            s_m[g] = m;
            s_l[g] = l;
        }
    }
    __syncthreads();

    /* Pass 2: acc[g] += p[g][j] * v[j] over this lane's rows and pieces. */
    float acc[GM][PPL][E];
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
        for (int i = 0; i < PPL; i++)
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[g][i][e] = 0.0f;
    for (int jb = warp * KPW; jb < n; jb += STEP * DEC_UNROLL) {
        uint4 vr[DEC_UNROLL][PPL];
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++) {
            const int j = jb + u * STEP + seg;
#pragma unroll
            for (int i = 0; i < PPL; i++) {
                const int p = sl + i * S;
                vr[u][i] = (j < n && p < P) ? __ldg((const uint4 *)(vb + (size_t)j * a.kv_ld + p * E))
                                            : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; u++) {
            const int j = jb + u * STEP + seg;
            if (j >= n) /* s_p past n is stale; the row was not loaded */
                continue;
#pragma unroll
            for (int i = 0; i < PPL; i++) {
                float vf[E];
                kv_piece<KV>::unpack(vr[u][i], vf);
#pragma unroll
                for (int g = 0; g < GM; g++) {
                    const float p = g < G ? s_p[g][j] : 0.0f;
#pragma unroll
                    for (int e = 0; e < E; e++)
                        acc[g][i][e] = fmaf(p, vf[e], acc[g][i][e]);
                }
            }
        }
    }

    /* Sum the segments of each warp (lanes sl of all segments own the same pieces) ... */
#pragma unroll
    for (int off = S; off < 32; off <<= 1)
#pragma unroll
        for (int g = 0; g < GM; g++)
#pragma unroll
            for (int i = 0; i < PPL; i++)
#pragma unroll
                for (int e = 0; e < E; e++)
                    acc[g][i][e] += __shfl_xor_sync(FULL_MASK, acc[g][i][e], off);
    /* ... then the warps, in order, into s_o. */
    for (int w = 0; w < DEC_WARPS; w++) {
        if (warp == w && seg == 0) {
#pragma unroll
            for (int g = 0; g < GM; g++)
#pragma unroll
                for (int i = 0; i < PPL; i++) {
                    const int p = sl + i * S;
                    if (g < G && p < P)
#pragma unroll
                        for (int e = 0; e < E; e++)
                            s_o[g][p * E + e] = (w == 0 ? 0.0f : s_o[g][p * E + e]) + acc[g][i][e];
                }
        }
        __syncthreads();
    }

    for (int idx = threadIdx.x; idx < G * D; idx += DEC_THREADS) {
        const int g = idx / D, dd = idx % D;
        if (n_chunks == 1)
            a.out[(size_t)(h0 + g) * D + dd] = s_o[g][dd] / s_l[g];
        else
            a.part_o[((size_t)(h0 + g) * a.chunk_stride + c) * D + dd] = s_o[g][dd];
    }
    if (n_chunks > 1 && threadIdx.x < G) {
        const int g = threadIdx.x;
        float *ml = a.part_ml + ((size_t)(h0 + g) * a.chunk_stride + c) * 2;
        ml[0] = s_m[g];
        ml[1] = s_l[g];
    }
}

/* One block per query head h (blockDim.x: D rounded up to a multiple of 32, at most 128), up to
 * DEC_MERGE_MAX chunks.
 * out: [n_heads][D]; part_o: [n_heads][chunk_stride][D]; part_ml: [n_heads][chunk_stride][2].
 * The threads first find M = max m_c and the chunks' weights e_c = exp2(m_c - M) together (a
 * chunk each, then a block reduction), then each output element sums part_o[c] * e_c over
 * the chunks in order, DEC_MERGE_UNROLL loads in flight: before, every thread walked the
 * chunks' maxima and sums one dependent load at a time, which at 64 chunks cost more than the
 * chunks themselves. */
enum { DEC_MERGE_MAX = 1024, DEC_MERGE_UNROLL = 8 };

static __device__ float block_reduce(float v, bool is_max, float *red)
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float o = __shfl_xor_sync(FULL_MASK, v, off);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    __syncthreads(); /* red is reused */
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < nw; w++)
        v = is_max ? fmaxf(v, red[w]) : v + red[w];
    return v;
}

__global__ void attn_decode_merge(dec_args a, int D)
{
    ifkc_grid_begin();
    int n_pos, chunk_len, n_chunks;
    dec_extent(a, &n_pos, &chunk_len, &n_chunks);
    if (n_chunks == 1) /* one chunk wrote out itself (a positional recording launches this anyway) */
        return;
    __shared__ float s_e[DEC_MERGE_MAX], red[32];
    const int h = blockIdx.x;
    const float *ml = a.part_ml + (size_t)h * a.chunk_stride * 2;
    const float *po = a.part_o + (size_t)h * a.chunk_stride * D;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < n_chunks; c += blockDim.x)
        m = fmaxf(m, ml[2 * c]);
    const float M = block_reduce(m, true, red);
    float l = 0.0f;
    for (int c = threadIdx.x; c < n_chunks; c += blockDim.x) {
        const float e = exp2f(ml[2 * c] - M);
        s_e[c] = e;
        l = fmaf(ml[2 * c + 1], e, l);
    }
    const float inv = 1.0f / block_reduce(l, false, red); /* its barriers publish s_e too */
    for (int dd = threadIdx.x; dd < D; dd += blockDim.x) {
        float o = 0.0f;
        int c = 0;
        for (; c + DEC_MERGE_UNROLL <= n_chunks; c += DEC_MERGE_UNROLL) {
            float p[DEC_MERGE_UNROLL];
#pragma unroll
            for (int u = 0; u < DEC_MERGE_UNROLL; u++)
                p[u] = po[(size_t)(c + u) * D + dd];
#pragma unroll
            for (int u = 0; u < DEC_MERGE_UNROLL; u++)
                o = fmaf(p[u], s_e[c + u], o);
        }
        for (; c < n_chunks; c++)
            o = fmaf(po[(size_t)c * D + dd], s_e[c], o);
        a.out[(size_t)h * D + dd] = o * inv;
    }
}

/* ---- prefill ----------------------------------------------------------------------------- */

enum { PF_BQ = 32, PF_BK = 32, PF_THREADS = 128 };

struct pf_args {
    float *out;           /* [T][n_heads*D]                  */
    const float *q;       /* [T][n_heads*D]                  */
    const void *k, *v;    /* [pos0+T][kv_ld] of KV           */
    size_t kv_ld;
    int T, pos0, n_heads, group;
    float qscale;         /* scale * log2(e)                 */
};

/* Shared memory of attn_prefill_tile<D>: Q [BQ][D+1], K then V [BK][D+1], P [BQ][BK+1]
 * floats (the +1 rows keep the column reads of the score loop free of bank conflicts). K and V
 * take turns in one buffer: 70 KB at D = 256 (under the 99 KB of sm_86/sm_89), 37 KB at 128. */
static size_t pf_smem_bytes(int D)
{
    return sizeof(float) * ((size_t)PF_BQ * (D + 1) + (size_t)PF_BK * (D + 1) + (size_t)PF_BQ * (PF_BK + 1));
}

/* Rows jt .. jt+BK-1 of one kv head's cache (g: row 0 of the head, stride ld) into s [BK][D+1]
 * as F32; rows at or past n_keys as 0. Consecutive threads read consecutive elements. */
template <int D, typename KV>
static __device__ __forceinline__ void pf_load_tile(float *s, const KV *g, size_t ld, int jt, int n_keys)
{
    for (int idx = threadIdx.x; idx < PF_BK * D; idx += PF_THREADS) {
        const int cc = idx / D, dd = idx % D, j = jt + cc;
        s[cc * (D + 1) + dd] = j < n_keys ? kv_float(g[(size_t)j * ld + dd]) : 0.0f;
    }
}

template <int D, typename KV>
__global__ void __launch_bounds__(PF_THREADS) attn_prefill_tile(pf_args a)
{
    ifkc_grid_begin();
    static_assert(PF_THREADS == PF_BQ * 4 && PF_BK == 32 && D % 4 == 0, "thread layout: 4 per row");
    constexpr int QLD = D + 1, KLD = D + 1, PLD = PF_BK + 1, NC = PF_BK / 4, NO = D / 4;
    extern __shared__ float smem[];
    float *s_q = smem;                  /* [BQ][QLD]           */
    float *s_kv = s_q + PF_BQ * QLD;    /* [BK][KLD]: K, then V */
    float *s_p = s_kv + PF_BK * KLD;    /* [BQ][PLD]           */

    const int tile = gridDim.x - 1 - blockIdx.x; /* last tokens (most keys) first */
    const int h = blockIdx.y, kvh = h / a.group;
    const int t0 = tile * PF_BQ, nt = min(PF_BQ, a.T - t0);
    const int n_keys = a.pos0 + t0 + nt;         /* keys the tile's last token sees */
    const size_t qld = (size_t)a.n_heads * D;
    const int r = threadIdx.x / 4, cq = threadIdx.x % 4; /* row r; keys / dims cq + 4*i */
    const int last = r < nt ? a.pos0 + t0 + r : -1;      /* last key row r sees */
    const KV *kg = (const KV *)a.k + (size_t)kvh * D;
    const KV *vg = (const KV *)a.v + (size_t)kvh * D;

    for (int idx = threadIdx.x; idx < PF_BQ * D; idx += PF_THREADS) {
        const int rr = idx / D, dd = idx % D;
        s_q[rr * QLD + dd] = rr < nt ? a.q[(size_t)(t0 + rr) * qld + (size_t)h * D + dd] * a.qscale : 0.0f;
    }

    float o[NO];
#pragma unroll
    for (int i = 0; i < NO; i++)
        o[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;

    for (int jt = 0; jt < n_keys; jt += PF_BK) {
        __syncthreads(); /* the previous tile's V and P are used up (and Q is stored) */
        pf_load_tile<D, KV>(s_kv, kg, a.kv_ld, jt, n_keys);
        __syncthreads();

        float s[NC];
#pragma unroll
        for (int i = 0; i < NC; i++)
            s[i] = 0.0f;
#pragma unroll 8
        for (int dd = 0; dd < D; dd++) {
            const float qv = s_q[r * QLD + dd];
#pragma unroll
            for (int i = 0; i < NC; i++)
                s[i] = fmaf(qv, s_kv[(cq + 4 * i) * KLD + dd], s[i]);
        }
        float tmax = -INFINITY;
#pragma unroll
        for (int i = 0; i < NC; i++) {
            if (jt + cq + 4 * i > last)
                s[i] = -INFINITY;
            tmax = fmaxf(tmax, s[i]);
        }
        /* The 4 threads of a row are lanes 4r'..4r'+3 of one warp. */
        tmax = fmaxf(tmax, __shfl_xor_sync(FULL_MASK, tmax, 1));
        tmax = fmaxf(tmax, __shfl_xor_sync(FULL_MASK, tmax, 2));
        const float m_new = fmaxf(m, tmax);
        const float alpha = m_new == -INFINITY ? 1.0f : exp2f(m - m_new);
        float rs = 0.0f;
#pragma unroll
        for (int i = 0; i < NC; i++) {
            const float p = s[i] == -INFINITY ? 0.0f : exp2f(s[i] - m_new);
            s_p[r * PLD + cq + 4 * i] = p;
            rs += p;
        }
        rs += __shfl_xor_sync(FULL_MASK, rs, 1);
        rs += __shfl_xor_sync(FULL_MASK, rs, 2);
        l = l * alpha + rs;
        m = m_new;
#pragma unroll
        for (int i = 0; i < NO; i++)
            o[i] *= alpha;
        __syncthreads(); /* P complete, K used up */
        pf_load_tile<D, KV>(s_kv, vg, a.kv_ld, jt, n_keys);
        __syncthreads();

#pragma unroll 4
        for (int cc = 0; cc < PF_BK; cc++) {
            const float p = s_p[r * PLD + cc];
#pragma unroll
            for (int i = 0; i < NO; i++)
                o[i] = fmaf(p, s_kv[cc * KLD + cq + 4 * i], o[i]);
        }
    }

    if (r < nt) {
        float *orow = a.out + (size_t)(t0 + r) * qld + (size_t)h * D;
        const float inv = 1.0f / l;
#pragma unroll
        for (int i = 0; i < NO; i++)
            orow[cq + 4 * i] = o[i] * inv;
    }
}

/* ---- host side --------------------------------------------------------------------------- */

/* The shared argument checks; fn names the caller in the message. out, q: [T][n_heads*head_dim];
 * k, v: [n_ctx][kv_ld] (only their being non-NULL is checked here). */
static int attn_check(const char *fn, ifkc_dev *d, const float *out, const float *q, const void *k,
                      const void *v, int kv_type, size_t kv_ld, int n_heads, int n_kv_heads, int head_dim)
{
    if (!d || !out || !q || !k || !v)
        return ifkc_seterr(IFKC_EINVAL, "%s: a NULL handle or pointer", fn);
    if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads)
        return ifkc_seterr(IFKC_EINVAL, "%s: %d heads cannot share %d kv heads", fn, n_heads, n_kv_heads);
    if (head_dim != 8 && head_dim != 16 && head_dim != 32 && head_dim != 64 && head_dim != 80 && head_dim != 96 &&
        head_dim != 128 && head_dim != 256)
        return ifkc_seterr(IFKC_EUNSUPPORTED,
                           "%s: head_dim %d is not supported (8, 16, 32, 64, 80, 96, 128 or 256)", fn, head_dim);
    if (kv_type != IFK_F32 && kv_type != IFK_F16)
        return ifkc_seterr(IFKC_EUNSUPPORTED, "%s: kv cache type %d is not supported (f32 or f16)", fn, kv_type);
    if (kv_ld < (size_t)n_kv_heads * head_dim)
        return ifkc_seterr(IFKC_EINVAL, "%s: kv row stride %zu is shorter than %d kv heads of %d", fn, kv_ld,
                           n_kv_heads, head_dim);
    return 0;
}

template <int D, typename KV> static int prefill_launch(ifkc_dev *d, const pf_args &a)
{
    const size_t smem = pf_smem_bytes(D);
    IFKC_CK(cudaFuncSetAttribute(attn_prefill_tile<D, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
            "cudaFuncSetAttribute (prefill attention shared memory)");
    dim3 grid(ifkc_cdiv((size_t)a.T, PF_BQ), (unsigned)a.n_heads);
    IFKC_CKL(ifkc_launch(d, attn_prefill_tile<D, KV>, grid, PF_THREADS, smem, a), "attn_prefill_tile");
    return 0;
}

template <typename KV> static int prefill_dispatch(ifkc_dev *d, const pf_args &a, int head_dim)
{
    switch (head_dim) {
    case 8: return prefill_launch<8, KV>(d, a);
    case 16: return prefill_launch<16, KV>(d, a);
    case 32: return prefill_launch<32, KV>(d, a);
    case 64: return prefill_launch<64, KV>(d, a);
    case 80: return prefill_launch<80, KV>(d, a);
    case 96: return prefill_launch<96, KV>(d, a);
    case 128: return prefill_launch<128, KV>(d, a);
    default: return prefill_launch<256, KV>(d, a);
    }
}

#ifndef IFKC_PF_TC
#define IFKC_PF_TC 0
#endif
#ifndef IFKC_DEC_TC
#define IFKC_DEC_TC 0
#endif

#if IFKC_PF_TC || IFKC_DEC_TC
#include <mma.h>

/* What the two tensor-core kernels share. tc_load_tile: rows jt .. jt+BK-1 of an F16 cache (g:
 * row 0, stride ld halves, 16-byte aligned) into s [BK][LD] halves, rows at or past n as 0, in
 * 16-byte pieces, thread `tid` of `nt` taking every nt-th piece. tc_softmax_step: one tile's
 * online-softmax step for a row held by two lanes (`side` 0 or 1, HK keys each): srow the row's
 * scores (log2 units), the first `valid` keys of the tile visible to it; P rounded to F16 into
 * prow; m and l updated; the row of O (orow, D floats) scaled by exp2(m_old - m_new). */
template <int D, int BK, int LD>
static __device__ __forceinline__ void tc_load_tile(__half *s, const __half *g, size_t ld, int jt, int n, int tid, int nt)
{
    constexpr int P = D / 8;
    for (int idx = tid; idx < BK * P; idx += nt) {
        const int cc = idx / P, pp = idx % P, j = jt + cc;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (j < n)
            v = __ldg((const uint4 *)(g + (size_t)j * ld) + pp);
        *(uint4 *)(s + cc * LD + pp * 8) = v;
    }
}

template <int D, int HK>
static __device__ __forceinline__ void tc_softmax_step(const float *srow, __half *prow, float *orow, int side,
                                                       int valid, float &m, float &l)
{
    srow += side * HK, prow += side * HK;
    float tmax = -INFINITY;
    for (int j = 0; j < HK; j++)
        if (side * HK + j < valid)
            tmax = fmaxf(tmax, srow[j]);
    tmax = fmaxf(tmax, __shfl_xor_sync(FULL_MASK, tmax, 1));
    const float m_new = fmaxf(m, tmax);
    const float alpha = m_new == -INFINITY ? 1.0f : exp2f(m - m_new);
    float rs = 0.0f;
    for (int j = 0; j < HK; j++) {
        const __half ph = __float2half_rn(side * HK + j < valid ? exp2f(srow[j] - m_new) : 0.0f);
        prow[j] = ph;
        rs += __half2float(ph); /* the sum of what P V multiplies */
    }
    rs += __shfl_xor_sync(FULL_MASK, rs, 1);
    l = l * alpha + rs;
    m = m_new;
    orow += side * (D / 2);
    for (int dd = 0; dd < D / 2; dd++)
        orow[dd] *= alpha;
}
/* One warp's two products on 16 rows (WMMA, F16 inputs, F32 sums): tc_scores S [16][BK] (ld
 * sld) = Q [16][D] (ld qld) K^T, K [BK][D] (ld kld); tc_accumulate O [16][D] (ld old) += P
 * [16][BK] (ld pld) V, V [BK][D] (ld vld). Pointers 32-byte aligned, leading dimensions
 * multiples of 16 bytes. */
template <int D, int BK>
static __device__ __forceinline__ void tc_scores(float *s, int sld, const __half *q, int qld, const __half *k, int kld)
{
    using namespace nvcuda;
#pragma unroll
    for (int cb = 0; cb < BK / 16; cb++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb; /* K^T */
            wmma::load_matrix_sync(fa, q + kk * 16, qld);
            wmma::load_matrix_sync(fb, k + (cb * 16) * kld + kk * 16, kld);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(s + cb * 16, acc, sld, wmma::mem_row_major);
    }
}

template <int D, int BK>
static __device__ __forceinline__ void tc_accumulate(float *o, int old, const __half *p, int pld, const __half *v,
                                                     int vld)
{
    using namespace nvcuda;
#pragma unroll
    for (int cb = 0; cb < D / 16; cb++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::load_matrix_sync(acc, o + cb * 16, old, wmma::mem_row_major);
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
            wmma::load_matrix_sync(fa, p + kk * 16, pld);
            wmma::load_matrix_sync(fb, v + (kk * 16) * vld + cb * 16, vld);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(o + cb * 16, acc, old, wmma::mem_row_major);
    }
}
#endif

/* ---- prefill on tensor cores (IFKC_PF_TC=1; off by default until it has run on a GPU) ------ */

#if IFKC_PF_TC

/* attn_prefill_tc<D>: the prefill kernel's algorithm (a tile of queries against tiles of keys,
 * online softmax) with the two products on tensor cores (WMMA, F16 inputs, F32 sums), for an F16
 * cache with 16-byte aligned rows and D in {64, 80, 96, 128}. A block holds TC_BQ = 64 queries of
 * one head, four warps of 16 rows; a key tile is TC_BK = 64 keys. Per tile: the K tile into
 * shared memory; each warp S[16][64] = Q K^T (its rows); each row's max, P = exp2(S - m) rounded
 * to F16, the sum, and the row of O (shared, F32) scaled by exp2(m_old - m_new), two lanes a row;
 * the V tile into the K tile's buffer; O += P V (accumulators loaded from and stored back to
 * shared memory). Q is rounded to F16 after scaling (scale * log2 e), P to F16: results are within
 * a few 1e-3 of the F32 kernel's (tests/gpu: |o - ref| <= 5e-3 max |v|). */
enum { TC_BQ = 64, TC_BK = 64, TC_THREADS = 128 };

template <int D> struct tc_layout {
    static constexpr int QLD = D + 8;      /* halves: Q and K/V rows (16-byte multiples, fewer conflicts) */
    static constexpr int SLD = TC_BK + 4;  /* floats: scores                                            */
    static constexpr int PLD = TC_BK + 8;  /* halves: probabilities                                     */
    static constexpr int OLD = D + 4;      /* floats: the output accumulator                            */
    static constexpr size_t bytes = sizeof(__half) * ((size_t)TC_BQ * QLD + (size_t)TC_BK * QLD + (size_t)TC_BQ * PLD) +
                                    sizeof(float) * ((size_t)TC_BQ * SLD + (size_t)TC_BQ * OLD);
};

template <int D>
__global__ void __launch_bounds__(TC_THREADS) attn_prefill_tc(pf_args a)
{
    ifkc_grid_begin();
    using L = tc_layout<D>;
    constexpr int QLD = L::QLD, SLD = L::SLD, PLD = L::PLD, OLD = L::OLD;
    static_assert(D % 16 == 0 && TC_THREADS == 4 * 32 && TC_BQ == 64 && TC_BK == 64, "four warps of 16 rows");
    extern __shared__ __align__(128) unsigned char tc_smem[];
    __half *s_q = (__half *)tc_smem;            /* [BQ][QLD]          */
    __half *s_kv = s_q + TC_BQ * QLD;           /* [BK][QLD]: K, then V */
    __half *s_p = s_kv + TC_BK * QLD;           /* [BQ][PLD]          */
    float *s_s = (float *)(s_p + TC_BQ * PLD);  /* [BQ][SLD]          */
    float *s_o = s_s + TC_BQ * SLD;             /* [BQ][OLD]          */

    const int tile = gridDim.x - 1 - blockIdx.x; /* last tokens (most keys) first */
    const int h = blockIdx.y, kvh = h / a.group;
    const int t0 = tile * TC_BQ, nt = min(TC_BQ, a.T - t0);
    const int n_keys = a.pos0 + t0 + nt;
    const size_t qld = (size_t)a.n_heads * D;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row = warp * 16 + lane / 2, side = lane % 2;  /* softmax: two lanes a row, 32 keys each */
    const int last = row < nt ? a.pos0 + t0 + row : -1;     /* the last key the row sees */
    const __half *kg = (const __half *)a.k + (size_t)kvh * D;
    const __half *vg = (const __half *)a.v + (size_t)kvh * D;

    for (int idx = threadIdx.x; idx < TC_BQ * D; idx += TC_THREADS) {
        const int rr = idx / D, dd = idx % D;
        const float qv = rr < nt ? a.q[(size_t)(t0 + rr) * qld + (size_t)h * D + dd] * a.qscale : 0.0f;
        s_q[rr * QLD + dd] = __float2half_rn(qv);
        s_o[rr * OLD + dd] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;

    for (int jt = 0; jt < n_keys; jt += TC_BK) {
        __syncthreads(); /* Q stored; the previous tile's V used up */
        tc_load_tile<D, TC_BK, QLD>(s_kv, kg, a.kv_ld, jt, n_keys, threadIdx.x, TC_THREADS);
        __syncthreads();

        tc_scores<D, TC_BK>(s_s + (warp * 16) * SLD, SLD, s_q + (warp * 16) * QLD, QLD, s_kv, QLD); /* S = Q K^T */
        __syncwarp();

        /* online softmax, two lanes a row: the keys up to `last` */
        tc_softmax_step<D, TC_BK / 2>(s_s + row * SLD, s_p + row * PLD, s_o + row * OLD, side,
                                      last - jt + 1, m, l);
        __syncthreads(); /* every warp is done with K */
        tc_load_tile<D, TC_BK, QLD>(s_kv, vg, a.kv_ld, jt, n_keys, threadIdx.x, TC_THREADS);
        __syncthreads();

        tc_accumulate<D, TC_BK>(s_o + (warp * 16) * OLD, OLD, s_p + (warp * 16) * PLD, PLD, s_kv, QLD); /* O += P V */
        __syncwarp();
    }

    if (row < nt) {
        float *out = a.out + (size_t)(t0 + row) * qld + (size_t)h * D;
        const float inv = 1.0f / l;
        const float *orow = s_o + row * OLD;
        for (int dd = side; dd < D; dd += 2)
            out[dd] = orow[dd] * inv;
    }
}

template <int D> static int prefill_tc_launch(ifkc_dev *d, const pf_args &a)
{
    const size_t smem = tc_layout<D>::bytes;
    IFKC_CK(cudaFuncSetAttribute(attn_prefill_tc<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
            "cudaFuncSetAttribute (tensor-core prefill attention shared memory)");
    dim3 grid(ifkc_cdiv((size_t)a.T, TC_BQ), (unsigned)a.n_heads);
    IFKC_CKL(ifkc_launch(d, attn_prefill_tc<D>, grid, TC_THREADS, smem, a), "attn_prefill_tc");
    return 0;
}
#endif

/* The head dims the tensor-core kernels are built for (WMMA tiles of 16). */
static int tc_head_dim(int head_dim)
{
    return head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128;
}

/* Whether prefill of T tokens over an F16/F32 cache of head_dim runs on tensor cores here. */
static int prefill_tc(int kv_type, int head_dim, int T)
{
    return IFKC_PF_TC && kv_type == IFK_F16 && T >= 16 && tc_head_dim(head_dim);
}

extern "C" int ifkc_attention_prefill_tensor_cores(int kv_type, int head_dim, int T)
{
    return prefill_tc(kv_type, head_dim, T);
}

/* Arguments already checked; T >= 1. */
static int prefill_run(ifkc_dev *d, float *out, const float *q, const void *k, const void *v, int kv_type,
                       size_t kv_ld, int T, int pos0, int n_heads, int n_kv_heads, int head_dim, float scale)
{
    pf_args a;
    a.out = out;
    a.q = q;
    a.k = k;
    a.v = v;
    a.kv_ld = kv_ld;
    a.T = T;
    a.pos0 = pos0;
    a.n_heads = n_heads;
    a.group = n_heads / n_kv_heads;
    a.qscale = scale * IFKC_LOG2E;
#if IFKC_PF_TC
    if (prefill_tc(kv_type, head_dim, T) && (uintptr_t)k % 16 == 0 && (uintptr_t)v % 16 == 0 && kv_ld % 8 == 0)
        switch (head_dim) {
        case 64: return prefill_tc_launch<64>(d, a);
        case 80: return prefill_tc_launch<80>(d, a);
        case 96: return prefill_tc_launch<96>(d, a);
        default: return prefill_tc_launch<128>(d, a);
        }
#endif
    return kv_type == IFK_F32 ? prefill_dispatch<float>(d, a, head_dim) : prefill_dispatch<__half>(d, a, head_dim);
}


/* The chunks' partial results combined (attn_decode_merge), when there is more than one. */
static int decode_merge(ifkc_dev *d, const dec_args &a, int n_heads, int D)
{
    if (a.n_chunks > 1) {
        IFKC_CKL(ifkc_launch(d, attn_decode_merge, n_heads, D < 128 ? (D + 31) / 32 * 32 : 128, 0, a, D),
                 "attn_decode_merge");
    }
    return 0;
}

template <int D, typename KV, int GM> static int decode_launch(ifkc_dev *d, const dec_args &a, dim3 grid, int n_heads)
{
    IFKC_CKL(ifkc_launch(d, attn_decode_chunk<D, KV, GM>, grid, DEC_THREADS, 0, a), "attn_decode_chunk");
    return decode_merge(d, a, n_heads, D);
}

/* gm: query heads per block, 1, 2, 4 or 8 (the tiny head dims: 8 only, the one instance they
 * have; ifkc_attention_decode sets gm so). */
template <int D, typename KV> static int decode_gm(ifkc_dev *d, const dec_args &a, dim3 grid, int n_heads, int gm)
{
    if constexpr (D <= 32) {
        return decode_launch<D, KV, DEC_GMAX>(d, a, grid, n_heads);
    } else {
        switch (gm) {
        case 1: return decode_launch<D, KV, 1>(d, a, grid, n_heads);
        case 2: return decode_launch<D, KV, 2>(d, a, grid, n_heads);
        case 4: return decode_launch<D, KV, 4>(d, a, grid, n_heads);
        default: return decode_launch<D, KV, DEC_GMAX>(d, a, grid, n_heads);
        }
    }
}

template <typename KV>
static int decode_dispatch(ifkc_dev *d, const dec_args &a, dim3 grid, int n_heads, int head_dim, int gm)
{
    switch (head_dim) {
    case 8: return decode_gm<8, KV>(d, a, grid, n_heads, gm);
    case 16: return decode_gm<16, KV>(d, a, grid, n_heads, gm);
    case 32: return decode_gm<32, KV>(d, a, grid, n_heads, gm);
    case 64: return decode_gm<64, KV>(d, a, grid, n_heads, gm);
    case 80: return decode_gm<80, KV>(d, a, grid, n_heads, gm);
    case 96: return decode_gm<96, KV>(d, a, grid, n_heads, gm);
    case 128: return decode_gm<128, KV>(d, a, grid, n_heads, gm);
    default: return decode_gm<256, KV>(d, a, grid, n_heads, gm);
    }
}

/* ---- decoding attention on tensor cores (IFKC_DEC_TC=1; off by default until it has run on a
 * GPU) ----------------------------------------------------------------------------------------
 *
 * attn_decode_tc<D>: a block per (chunk, kv head), as attn_decode_chunk, for an F16 cache with
 * 16-byte aligned rows, D in {64, 80, 96, 128} and groups of 2 to 16 query heads: the group's
 * heads are the 16 rows of one WMMA tile (F16 inputs, F32 sums), so a key costs a tensor-core
 * share instead of G x D FP32 multiply-adds in each pass (which bound the FP32 kernel for
 * groups of 4 and 8). The four warps take the chunk's tiles of DT_BK keys in turn, each with its
 * own online softmax over its tiles (S = Q K^T, P = exp2(S - m) rounded to F16, O += P V, the
 * O rows in shared memory), and the block then combines the four as the merge kernel combines
 * chunks. The chunk's result goes out as the FP32 kernel's: out directly for one chunk, else
 * the partial (o, m, l) for attn_decode_merge. */
#if IFKC_DEC_TC

enum { DT_BK = 32, DT_WARPS = 4, DT_THREADS = DT_WARPS * 32 };

static constexpr size_t dt_round(size_t b) { return (b + 127) / 128 * 128; }

template <int D> struct dt_layout {
    static constexpr int QLD = D + 8;     /* halves: Q, K and V rows              */
    static constexpr int SLD = DT_BK + 4; /* floats: scores                        */
    static constexpr int PLD = DT_BK + 8; /* halves: probabilities                 */
    static constexpr int OLD = D + 4;     /* floats: a warp's output rows          */
    static constexpr size_t q_bytes = dt_round(sizeof(__half) * 16 * QLD);
    static constexpr size_t kv_bytes = dt_round(sizeof(__half) * DT_BK * QLD);
    static constexpr size_t s_bytes = dt_round(sizeof(float) * 16 * SLD);
    static constexpr size_t p_bytes = dt_round(sizeof(__half) * 16 * PLD);
    static constexpr size_t o_bytes = dt_round(sizeof(float) * 16 * OLD);
    static constexpr size_t warp_bytes = kv_bytes + s_bytes + p_bytes + o_bytes;
    static constexpr size_t ml_bytes = dt_round(sizeof(float) * DT_WARPS * 16 * 2);
    static constexpr size_t bytes = q_bytes + DT_WARPS * warp_bytes + ml_bytes;
};

template <int D>
__global__ void __launch_bounds__(DT_THREADS) attn_decode_tc(dec_args a)
{
    using L = dt_layout<D>;
    constexpr int QLD = L::QLD, SLD = L::SLD, PLD = L::PLD, OLD = L::OLD;
    static_assert(D % 16 == 0 && DT_BK % 16 == 0, "WMMA tiles");
    extern __shared__ __align__(128) unsigned char dt_smem[];
    const int c = blockIdx.x, kvh = blockIdx.y;
    int n_pos, chunk_len, n_chunks;
    dec_begin<D, __half>(a, c, kvh, &n_pos, &chunk_len, &n_chunks);
    if (c >= n_chunks) /* a positional recording's grid has the most chunks */
        return;
    const int G = a.group, h0 = kvh * G;
    const int j0 = c * chunk_len, n = min(chunk_len, n_pos - j0);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row = lane / 2, side = lane % 2; /* softmax: two lanes a row, DT_BK / 2 keys each */
    __half *s_q = (__half *)dt_smem;
    unsigned char *wbase = dt_smem + L::q_bytes + warp * L::warp_bytes;
    __half *s_kv = (__half *)wbase;
    float *s_s = (float *)(wbase + L::kv_bytes);
    __half *s_p = (__half *)(wbase + L::kv_bytes + L::s_bytes);
    float *s_o = (float *)(wbase + L::kv_bytes + L::s_bytes + L::p_bytes);
    float *s_ml = (float *)(dt_smem + L::q_bytes + DT_WARPS * L::warp_bytes); /* [DT_WARPS][16][2] */
    const __half *kg = (const __half *)a.k + (size_t)j0 * a.kv_ld + (size_t)kvh * D;
    const __half *vg = (const __half *)a.v + (size_t)j0 * a.kv_ld + (size_t)kvh * D;

    for (int idx = threadIdx.x; idx < 16 * D; idx += DT_THREADS) {
        const int g = idx / D, dd = idx % D;
        s_q[g * QLD + dd] = __float2half_rn(g < G ? a.q[(size_t)(h0 + g) * D + dd] * a.qscale : 0.0f);
    }
    for (int idx = lane; idx < 16 * D; idx += 32)
        s_o[(idx / D) * OLD + idx % D] = 0.0f;
    __syncthreads();

    float m = -INFINITY, l = 0.0f;
    for (int jt = warp * DT_BK; jt < n; jt += DT_WARPS * DT_BK) {
        tc_load_tile<D, DT_BK, QLD>(s_kv, kg, a.kv_ld, jt, n, lane, 32);
        __syncwarp();
        tc_scores<D, DT_BK>(s_s, SLD, s_q, QLD, s_kv, QLD); /* S = Q K^T */
        __syncwarp();
        /* online softmax, two lanes a row: the chunk's keys (rows past the group: none) */
        tc_softmax_step<D, DT_BK / 2>(s_s + row * SLD, s_p + row * PLD, s_o + row * OLD, side, row < G ? n - jt : 0,
                                      m, l);
        __syncwarp(); /* K read, P and the scaled O written */
        tc_load_tile<D, DT_BK, QLD>(s_kv, vg, a.kv_ld, jt, n, lane, 32);
        __syncwarp();
        tc_accumulate<D, DT_BK>(s_o, OLD, s_p, PLD, s_kv, QLD); /* O += P V */
        __syncwarp(); /* V read before the next tile overwrites it */
    }
    if (side == 0) {
        s_ml[(warp * 16 + row) * 2] = m;
        s_ml[(warp * 16 + row) * 2 + 1] = l;
    }
    __syncthreads();

    /* the four warps' results combined, as attn_decode_merge combines chunks */
    for (int idx = threadIdx.x; idx < G * D; idx += DT_THREADS) {
        const int g = idx / D, dd = idx % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DT_WARPS; w++)
            M = fmaxf(M, s_ml[(w * 16 + g) * 2]);
        float o = 0.0f, Ls = 0.0f;
#pragma unroll
        for (int w = 0; w < DT_WARPS; w++) {
            const float mw = s_ml[(w * 16 + g) * 2], e = mw == -INFINITY ? 0.0f : exp2f(mw - M);
            const float *ow = (const float *)(dt_smem + L::q_bytes + w * L::warp_bytes + L::kv_bytes + L::s_bytes +
                                              L::p_bytes);
            o = fmaf(ow[g * OLD + dd], e, o);
            Ls = fmaf(s_ml[(w * 16 + g) * 2 + 1], e, Ls);
        }
        if (n_chunks == 1) {
            a.out[(size_t)(h0 + g) * D + dd] = o / Ls;
        } else {
            a.part_o[((size_t)(h0 + g) * a.chunk_stride + c) * D + dd] = o;
            if (dd == 0) {
                float *ml = a.part_ml + ((size_t)(h0 + g) * a.chunk_stride + c) * 2;
                ml[0] = M;
                ml[1] = Ls;
            }
        }
    }
}

template <int D> static int decode_tc_launch(ifkc_dev *d, const dec_args &a, int n_kv_heads, int n_heads)
{
    const size_t smem = dt_layout<D>::bytes;
    IFKC_CK(cudaFuncSetAttribute(attn_decode_tc<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
            "cudaFuncSetAttribute (tensor-core decoding attention shared memory)");
    IFKC_CKL(ifkc_launch(d, attn_decode_tc<D>, dim3((unsigned)a.n_chunks, (unsigned)n_kv_heads), DT_THREADS, smem, a),
             "attn_decode_tc");
    return decode_merge(d, a, n_heads, D);
}
#endif

/* Whether decoding attention over an F16/F32 cache of head_dim with groups of `group` query
 * heads runs on tensor cores here. */
static int decode_tc(int kv_type, int head_dim, int group)
{
    return IFKC_DEC_TC && kv_type == IFK_F16 && group >= 2 && group <= 16 && tc_head_dim(head_dim);
}

extern "C" int ifkc_attention_decode_tensor_cores(int kv_type, int head_dim, int group)
{
    return decode_tc(kv_type, head_dim, group);
}

/* The launch's arguments: chunks of decode_chunk_len(n_pos, bpc, want) keys (with pos_dev, the
 * grid and the partials sized for the most chunks any position up to max_pos has), and the
 * partials' scratch when there is more than one chunk. */
static int decode_setup(ifkc_dev *d, dec_args *a, float *out, const float *q, const void *k, const void *v,
                        size_t kv_ld, int n_pos, int n_heads, int group, int head_dim, float scale,
                        const int *pos_dev, int max_pos, int bpc, long long want)
{
    const int chunk_len = decode_chunk_len(n_pos, bpc, want);
    int n_chunks = (n_pos + chunk_len - 1) / chunk_len, stride = n_chunks;
    if (pos_dev)
        for (int p = 1; p <= max_pos; p++) {
            const int cl = decode_chunk_len(p, bpc, want), nc = (p + cl - 1) / cl;
            stride = nc > stride ? nc : stride;
        }
    a->out = out;
    a->part_o = NULL;
    a->part_ml = NULL;
    a->q = q;
    a->k = k;
    a->v = v;
    a->kv_ld = kv_ld;
    a->n_pos = n_pos;
    a->group = group;
    a->chunk_len = chunk_len;
    a->n_chunks = pos_dev ? stride : n_chunks; /* the host's view: the grid, and whether to merge */
    a->chunk_stride = stride;
    a->qscale = scale * IFKC_LOG2E;
    a->pos_dev = pos_dev;
    a->bpc = bpc;
    a->want = want;
    a->prefetch = d->overlap || IFKC_DEC_PREFETCH;
    if (stride > DEC_MERGE_MAX)
        return ifkc_seterr(IFKC_EUNSUPPORTED, "decoding attention over %d keys: more than %d chunks of %d",
                           pos_dev ? max_pos : n_pos, DEC_MERGE_MAX, DEC_CHUNK_MAX);
    if (stride > 1) {
        const size_t n_part = (size_t)n_heads * stride;
        void *p;
        int rc = ifkc_scratch(d, IFKC_SCRATCH_ATTN, n_part * (head_dim + 2) * sizeof(float), &p);
        if (rc)
            return rc;
        a->part_o = (float *)p;
        a->part_ml = a->part_o + n_part * head_dim;
    }
    return 0;
}

/* Decoding attention over n_pos keys; with pos_dev (a positional recording), over *pos_dev + 1
 * keys, at most max_pos. */
static int decode_run(ifkc_dev *d, float *out, const float *q, const void *k, const void *v, int kv_type,
                      size_t kv_ld, int n_pos, int n_heads, int n_kv_heads, int head_dim, float scale,
                      const int *pos_dev, int max_pos)
{
    const size_t es = kv_type == IFK_F32 ? 4 : 2;
    if ((uintptr_t)k % 16 || (uintptr_t)v % 16 || kv_ld * es % 16) {
        if (pos_dev)
            return ifkc_seterr(IFKC_EUNSUPPORTED, "decoding attention at a device position needs 16-byte aligned "
                               "cache rows");
        return prefill_run(d, out, q, k, v, kv_type, kv_ld, 1, n_pos - 1, n_heads, n_kv_heads, head_dim, scale);
    }
    const int group = n_heads / n_kv_heads, sms = d->sm_count > 0 ? d->sm_count : 100;
    dec_args a;
    int rc;
#if IFKC_DEC_TC
    if (decode_tc(kv_type, head_dim, group)) { /* a block per (chunk, kv head), IFKC_DEC_BPS of them an SM */
        if ((rc = decode_setup(d, &a, out, q, k, v, kv_ld, n_pos, n_heads, group, head_dim, scale, pos_dev, max_pos,
                               n_kv_heads, (long long)IFKC_DEC_BPS * sms)))
            return rc;
        switch (head_dim) {
        case 64: return decode_tc_launch<64>(d, a, n_kv_heads, n_heads);
        case 80: return decode_tc_launch<80>(d, a, n_kv_heads, n_heads);
        case 96: return decode_tc_launch<96>(d, a, n_kv_heads, n_heads);
        default: return decode_tc_launch<128>(d, a, n_kv_heads, n_heads);
        }
    }
#endif
    /* query heads per block: the group rounded up to a power of two, at most DEC_GMAX (the
     * tiny head dims: always DEC_GMAX); larger groups are cut into slices */
    int gm = 1;
    while (gm < group && gm < DEC_GMAX)
        gm *= 2;
    if (head_dim <= 32)
        gm = DEC_GMAX;
    const int slices = (group + gm - 1) / gm;
    /* fewer heads a block, fewer registers: more blocks fit on an SM, so cut more chunks */
    if ((rc = decode_setup(d, &a, out, q, k, v, kv_ld, n_pos, n_heads, group, head_dim, scale, pos_dev, max_pos,
                           n_kv_heads * slices, (long long)(gm >= 4 ? IFKC_DEC_BPS : 2 * IFKC_DEC_BPS) * sms)))
        return rc;
    dim3 grid((unsigned)a.n_chunks, (unsigned)n_kv_heads, (unsigned)slices);
    return kv_type == IFK_F32 ? decode_dispatch<float>(d, a, grid, n_heads, head_dim, gm)
                              : decode_dispatch<__half>(d, a, grid, n_heads, head_dim, gm);
}

extern "C" int ifkc_attention_decode(ifkc_dev *d, float *out, const float *q, const void *k, const void *v,
                                     int kv_type, size_t kv_ld, int n_pos, int n_heads, int n_kv_heads,
                                     int head_dim, float scale)
{
    int rc = attn_check("decoding attention", d, out, q, k, v, kv_type, kv_ld, n_heads, n_kv_heads, head_dim);
    if (rc)
        return rc;
    if (n_pos <= 0)
        return ifkc_seterr(IFKC_EINVAL, "decoding attention: %d keys (at least 1)", n_pos);
    return decode_run(d, out, q, k, v, kv_type, kv_ld, n_pos, n_heads, n_kv_heads, head_dim, scale, NULL, 0);
}

extern "C" int ifkc_attention_prefill(ifkc_dev *d, float *out, const float *q, const void *k, const void *v,
                                      int kv_type, size_t kv_ld, int T, int pos0, int n_heads, int n_kv_heads,
                                      int head_dim, float scale)
{
    int rc = attn_check("prefill attention", d, out, q, k, v, kv_type, kv_ld, n_heads, n_kv_heads, head_dim);
    if (rc)
        return rc;
    if (T < 0 || pos0 < 0 || (long long)pos0 + T > INT32_MAX)
        return ifkc_seterr(IFKC_EINVAL, "prefill attention: bad token range (T %d at position %d)", T, pos0);
    if (T == 0)
        return 0;
    return prefill_run(d, out, q, k, v, kv_type, kv_ld, T, pos0, n_heads, n_kv_heads, head_dim, scale);
}

extern "C" int ifkc_attention(ifkc_dev *d, float *out, const float *q, const void *k, const void *v, int kv_type,
                              size_t kv_ld, int T, int pos0, int n_heads, int n_kv_heads, int head_dim, float scale)
{
    if (T < 0 || pos0 < 0 || (long long)pos0 + T > INT32_MAX)
        return ifkc_seterr(IFKC_EINVAL, "attention: bad token range (T %d at position %d)", T, pos0);
    if (d && d->pos_on) { /* a positional recording: the step's one token at the device's position */
        if (T != 1)
            return ifkc_seterr(IFKC_EUNSUPPORTED, "attention of %d tokens at a device position (one only)", T);
        int rc = attn_check("decoding attention", d, out, q, k, v, kv_type, kv_ld, n_heads, n_kv_heads, head_dim);
        if (rc)
            return rc;
        return decode_run(d, out, q, k, v, kv_type, kv_ld, pos0 + 1, n_heads, n_kv_heads, head_dim, scale,
                          d->pos_dev, d->pos_max);
    }
    if (T == 1)
        return ifkc_attention_decode(d, out, q, k, v, kv_type, kv_ld, pos0 + 1, n_heads, n_kv_heads, head_dim,
                                     scale);
    return ifkc_attention_prefill(d, out, q, k, v, kv_type, kv_ld, T, pos0, n_heads, n_kv_heads, head_dim, scale);
}

/* ---- cache store ------------------------------------------------------------------------- */

/* cache: rows pos0 .. pos0+T-1 of [*][ld_dst] KV (pos0: *pos_dev when not NULL); src: [T][ld_src]
 * F32, n values a row. */
template <typename KV>
__global__ void kv_store_rows(KV *cache, size_t ld_dst, int pos0, const int *pos_dev, const float *src, size_t ld_src,
                              int T, int n)
{
    ifkc_grid_begin();
    if (pos_dev)
        pos0 = *pos_dev;
    const size_t total = (size_t)T * n;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        const size_t t = idx / n, i = idx % n;
        ifkc_kv_put(cache + ((size_t)pos0 + t) * ld_dst + i, src[t * ld_src + i]);
    }
}

/* Rows r0 .. r0 + n - 1 (r0 >= keep + discard) move to r - discard; in k, pair i of each head is
 * rotated by -discard * theta^(-2i/rot_dim) * fs[i] (angles in double, as ifk_rope), then
 * stored in the cache's type. One thread per (row, pair) for k, per (row, value) for v. */
template <typename KV>
__global__ void kv_shift_rows(KV *k, KV *v, size_t ld, int n_kv_heads, int head_dim, int rot_dim, int r0, int n,
                              int discard, float theta, const float *fs, int interleaved)
{
    ifkc_grid_begin();
    const int half = rot_dim / 2, KVN = n_kv_heads * head_dim;
    const size_t nk = (size_t)n * n_kv_heads * half, nv = (size_t)n * KVN;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < nk + nv;
         idx += (size_t)gridDim.x * blockDim.x) {
        if (idx >= nk) { /* a value, and the key values past rot_dim, as they are */
            const size_t j = idx - nk, r = j / KVN, e = j % KVN;
            const size_t src = ((size_t)r0 + r) * ld + e, dst = src - (size_t)discard * ld;
            v[dst] = v[src];
            if ((int)(e % head_dim) >= 2 * half)
                k[dst] = k[src];
            continue;
        }
        const size_t r = idx / ((size_t)n_kv_heads * half), rest = idx % ((size_t)n_kv_heads * half);
        const int h = (int)(rest / half), i = (int)(rest % half);
        float c, s, y0, y1;
        int ia, ib;
        ifkc_rope_pair(-(double)discard, i, rot_dim, theta, fs, interleaved, &c, &s, &ia, &ib);
        const size_t src = ((size_t)r0 + r) * ld + (size_t)h * head_dim, dst = src - (size_t)discard * ld;
        ifkc_rotate(kv_float(k[src + ia]), kv_float(k[src + ib]), c, s, &y0, &y1);
        ifkc_kv_put(k + dst + ia, y0);
        ifkc_kv_put(k + dst + ib, y1);
    }
}

extern "C" int ifkc_kv_shift(ifkc_dev *d, void *k, void *v, int kv_type, size_t ld, int n_kv_heads, int head_dim,
                             int rot_dim, int n_past, int keep, int discard, float theta, const float *freq_scale,
                             int layout)
{
    if (!d || !k || !v)
        return ifkc_seterr(IFKC_EINVAL, "kv shift: a NULL handle or pointer");
    if (kv_type != IFK_F32 && kv_type != IFK_F16)
        return ifkc_seterr(IFKC_EUNSUPPORTED, "kv shift: kv cache type %d is not supported (f32 or f16)", kv_type);
    if (keep < 0 || discard <= 0 || keep + discard > n_past || n_kv_heads <= 0 || head_dim <= 0 ||
        ld < (size_t)n_kv_heads * head_dim || (layout != IFK_ROPE_HALF && layout != IFK_ROPE_INTERLEAVED))
        return ifkc_seterr(IFKC_EINVAL, "kv shift: bad shape (%d of %d positions after %d, %d heads of %d)", discard,
                           n_past, keep, n_kv_heads, head_dim);
    if (rot_dim > head_dim || rot_dim <= 0)
        rot_dim = head_dim;
    for (int r0 = keep + discard; r0 < n_past; r0 += discard) { /* a launch's rows never overlap its sources */
        const int n = n_past - r0 < discard ? n_past - r0 : discard;
        const size_t total = (size_t)n * n_kv_heads * (rot_dim / 2 + head_dim);
        size_t blocks = (total + 255) / 256;
        if (blocks > 8192)
            blocks = 8192;
        const cudaError_t e =
            kv_type == IFK_F32
                ? ifkc_launch(d, kv_shift_rows<float>, (unsigned)blocks, 256, 0, (float *)k, (float *)v, ld, n_kv_heads,
                              head_dim, rot_dim, r0, n, discard, theta, freq_scale, layout == IFK_ROPE_INTERLEAVED)
                : ifkc_launch(d, kv_shift_rows<__half>, (unsigned)blocks, 256, 0, (__half *)k, (__half *)v, ld,
                              n_kv_heads, head_dim, rot_dim, r0, n, discard, theta, freq_scale,
                              layout == IFK_ROPE_INTERLEAVED);
        IFKC_CKL(e, "kv_shift_rows");
    }
    return 0;
}

extern "C" int ifkc_kv_store(ifkc_dev *d, void *cache, int kv_type, size_t ld_dst, int pos0, const float *src,
                             size_t ld_src, int T, int n)
{
    if (!d || !cache || !src)
        return ifkc_seterr(IFKC_EINVAL, "kv store: a NULL handle or pointer");
    if (kv_type != IFK_F32 && kv_type != IFK_F16)
        return ifkc_seterr(IFKC_EUNSUPPORTED, "kv store: kv cache type %d is not supported (f32 or f16)", kv_type);
    if (T < 0 || n < 0 || pos0 < 0 || (T > 1 && (ld_dst < (size_t)n || ld_src < (size_t)n)))
        return ifkc_seterr(IFKC_EINVAL, "kv store: bad shape (T %d, n %d, position %d, strides %zu, %zu)", T, n,
                           pos0, ld_dst, ld_src);
    if (T == 0 || n == 0)
        return 0;
    const size_t total = (size_t)T * n;
    size_t blocks = (total + 255) / 256;
    if (blocks > 8192)
        blocks = 8192;
    const cudaError_t e =
        kv_type == IFK_F32
            ? ifkc_launch(d, kv_store_rows<float>, (unsigned)blocks, 256, 0, (float *)cache, ld_dst, pos0,
                          ifkc_pos_slot(d), src, ld_src, T, n)
            : ifkc_launch(d, kv_store_rows<__half>, (unsigned)blocks, 256, 0, (__half *)cache, ld_dst, pos0,
                          ifkc_pos_slot(d), src, ld_src, T, n);
    IFKC_CKL(e, "kv_store_rows");
    return 0;
}
