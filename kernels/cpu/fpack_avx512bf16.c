/*
 * fpack_avx512bf16.c -- the BF16 product over packed F16 / BF16 matrices (qpack.h's float
 * pairs): y = x W^T with vdpbf16ps, each of its 16 lanes a ROW of W.
 *
 * Why. The row layout's product (matmul_avx512.c) gives each output 16 lanes of partial sums
 * over K and adds them at the end; per step it loads as many weight vectors as x vectors, and a
 * tile of 4 rows x 4 tokens measured 80-90 % of the vdpbf16ps roof (BF16 weights; F16 ones,
 * rounded into a buffer a block at a time, 70-80 %). In the packed layout a vector holds one
 * pair of elements (2 p, 2 p + 1) of 16 rows, so a step is: load the pair of 16 rows once,
 * broadcast the pair of each token (4 bytes), one vdpbf16ps per token into that token's 16
 * rows. Tiles of 32 rows x 8 tokens (16 accumulators) measured 217 GFLOP/s, 92 % of the roof,
 * on one Zen 4 core (2026-11-28; a standalone harness, 2048 x 2048, T = 128; 48 x 8 gave 224,
 * but no gain in the whole model, so the tile stays at 32 rows).
 *
 * Arithmetic. Each output y[t][n] is ONE chain: acc = 0, then acc = vdpbf16ps(acc, pair p of row
 * n, pair p of x[t]) for p = 0, 1, ..., ceil(K / 2) - 1 in order (each product exact in F32, the
 * two added to acc as the instruction does). Prefill takes K in chunks and keeps the chain in y
 * between them (F32 stored and loaded exactly), decode runs it in one go: the same operations,
 * so y[t] depends only on W and x[t], whatever T and the rows' split between threads (kernels.h's
 * batch invariance). Not the row layout's sum: the packed and unpacked products differ by
 * rounding. F16 weights are rounded to BF16 (nearest even) in registers in decode and when the
 * tokens fit one tile (T <= 8: batched decode; the whole of K in one go, as decode); in prefill
 * the first tile of a chunk of 32 rows rounds them as it multiplies and keeps them in a buffer
 * that the chunk's other tiles read: the same rounding. (A separate pass over the chunk before its
 * tiles cost 9 % of F16 prefill: it read the weights from DRAM with nothing to overlap them;
 * inside the first tile they arrive under its products. 2026-11-28: 99-100 -> 102-104 tok/s at
 * 128 tokens, 1 thread.)
 *
 * x: [T][ldx] BF16, rounded by ifk_avx512bf16_round_x (zeros past K up to ldx, so the odd
 * element's pair reads a zero of x against a zero weight). Rows n0 .. n1 - 1, n0 a multiple of
 * 16 (the pool's items are); P is the packed matrix (row 0), or that shifted by whole groups.
 */
#include "kernels/cpu/impl.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/vec_avx512.h"

#define FP_KC 512 /* pairs per prefill chunk: 32 rows x 1024 elements of BF16, 64 KiB (in L2) */
#define FP_C 8    /* tokens per tile */
#define FP_PF_TILES 8 /* token tiles of a call below which prefill does not prefetch the next block */

/* Pair p of 16 rows, as BF16: as stored, or F16 rounded to nearest even. v: 32 elements. */
IFK_INLINE __m512bh pair_w(const uint16_t *v, int f16)
{
    if (!f16)
        return (__m512bh)_mm512_loadu_si512(v);
    __m512 lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)v)); /* rows 0..7's pairs */
    __m512 hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16)));
    return _mm512_cvtne2ps_pbh(hi, lo);
}

IFK_INLINE __m512bh pair_x(const uint16_t *x, int p)
{
    int32_t v;
    __builtin_memcpy(&v, x + 2 * (size_t)p, 4);
    return (__m512bh)_mm512_set1_epi32(v);
}

static __mmask16 lanes(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

/* The tile of R groups x C tokens over pairs p0 .. p1 - 1 of w (BF16 pairs, group r at
 * w + r * gs elements; pair p at 32 p): acc from y (or 0 when first), the chain, acc back to y.
 * cvt: w is not written yet; the pairs come from the F16 source (group r at src + r * sgs, pair
 * p at p + soff), rounded, and are stored to keep (= w) as they are used (keep NULL: not kept).
 * y: token c's row at y + c * ldy, group r's 16 rows at + 16 r; the last group's rows past
 * `last` lanes are not stored. */
IFK_INLINE void tile(const int R, const int C, const int cvt, float *y, size_t ldy, const uint16_t *w, size_t gs,
                     uint16_t *keep, const uint16_t *src, size_t sgs, int soff, const uint16_t *x, size_t ldx, int p0,
                     int p1, int first, __mmask16 last)
{
    __m512 acc[2][FP_C];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const __mmask16 m = r == R - 1 ? last : 0xffff;
            acc[r][c] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, y + (size_t)c * ldy + 16 * r);
        }
#pragma GCC unroll 2
    for (int p = p0; p < p1; p++) {
        __m512bh wv[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            if (cvt) { /* F16 pair p + soff of the source, rounded and kept (where w is) for the next tiles */
                wv[r] = pair_w(src + r * sgs + 32 * (size_t)(p + soff), 1);
                if (keep)
                    _mm512_store_si512(keep + r * gs + 32 * (size_t)p, (__m512i)wv[r]);
            } else {
                wv[r] = (__m512bh)_mm512_loadu_si512(w + r * gs + 32 * (size_t)p);
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512bh xv = pair_x(x + (size_t)c * ldx, p);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv[r], xv);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            _mm512_mask_storeu_ps(y + (size_t)c * ldy + 16 * r, r == R - 1 ? last : 0xffff, acc[r][c]);
}

/* tile() for R and C known only at run time (the last tokens of a call); cvt: the first tile
 * of an F16 chunk, which rounds the source's pairs into w as it goes. */
#define FP_TILE(R, C, CVT) tile(R, C, CVT, y, ldy, w, gs, keep, src, sgs, soff, x, ldx, p0, p1, first, last)
#define FP_TILES(R, CVT)                      \
    switch (C) {                              \
    case 8: FP_TILE(R, 8, CVT); break;        \
    case 7: FP_TILE(R, 7, CVT); break;        \
    case 6: FP_TILE(R, 6, CVT); break;        \
    case 5: FP_TILE(R, 5, CVT); break;        \
    case 4: FP_TILE(R, 4, CVT); break;        \
    case 3: FP_TILE(R, 3, CVT); break;        \
    case 2: FP_TILE(R, 2, CVT); break;        \
    default: FP_TILE(R, 1, CVT); break;       \
    }

static void tile_any(int R, int C, int cvt, float *y, size_t ldy, const uint16_t *w, size_t gs, uint16_t *keep,
                     const uint16_t *src, size_t sgs, int soff, const uint16_t *x, size_t ldx, int p0, int p1,
                     int first, __mmask16 last)
{
    if (R == 2 && cvt)
        FP_TILES(2, 1)
    else if (R == 2)
        FP_TILES(2, 0)
    else if (cvt)
        FP_TILES(1, 1)
    else
        FP_TILES(1, 0)
}
#undef FP_TILES
#undef FP_TILE

/* Decode: groups g0 .. g1 - 1, 4 chains at a time, all K in one go. */
static void fpack_gemv(float *y, const uint16_t *P, size_t gs, int f16, const uint16_t *x, int g0, int g1, int n1,
                       int P2)
{
    for (int g = g0; g < g1; g += 4) {
        const int R = g1 - g < 4 ? g1 - g : 4;
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        const uint16_t *w = P + (size_t)g * gs;
        if (R == 4) {
            for (int p = 0; p < P2; p++) {
                __m512bh xv = pair_x(x, p);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
                    acc[r] = _mm512_dpbf16_ps(acc[r], pair_w(w + r * gs + 32 * (size_t)p, f16), xv);
            }
        } else {
            for (int p = 0; p < P2; p++) {
                __m512bh xv = pair_x(x, p);
                for (int r = 0; r < R; r++)
                    acc[r] = _mm512_dpbf16_ps(acc[r], pair_w(w + r * gs + 32 * (size_t)p, f16), xv);
            }
        }
        for (int r = 0; r < R; r++) {
            const int n = 16 * (g + r);
            _mm512_mask_storeu_ps(y + n, lanes(n1 - n), acc[r]);
        }
    }
}

/* y[t][n] for n0 <= n < n1 (y's columns as the rows of W). W: the packed matrix, wtype its
 * packed code (IFK_QPACKED + IFK_F16 or + IFK_BF16). */
IFK_DECL_BF16_ROWS(ifk_avx512bf16_fpack_rows)
{
    const int f16 = ifk_fpack_base(wtype) == IFK_F16, P2 = (K + 1) / 2, g0 = n0 / 16, g1 = (n1 + 15) / 16;
    const size_t gs = (size_t)P2 * 32; /* elements of a group */
    const uint16_t *P = W;
    if (K <= 0 || n1 <= n0) {
        ifk_zero_rows(y, ldy, T, n0, n1);
        return;
    }
    if (T == 1) {
        fpack_gemv(y, P, gs, f16, x, g0, g1, n1, P2);
        return;
    }
    if (T <= FP_C) { /* one tile of tokens: all of K in one go, F16 rounded in registers */
        for (int g = g0; g < g1; g += 2) {
            const int R = g1 - g < 2 ? 1 : 2;
            const uint16_t *w = P + (size_t)g * gs;
            tile_any(R, T, f16, y + 16 * g, ldy, w, gs, NULL, w, gs, 0, x, ldx, 0, P2, 1, lanes(n1 - 16 * (g + R - 1)));
        }
        return;
    }
    _Alignas(64) uint16_t buf[f16 ? 2 * FP_KC * 32 : 1]; /* F16: 2 groups' chunk as BF16, 64 KiB */
    for (int pc = 0; pc < P2; pc += FP_KC) {
        const int pe = P2 - pc < FP_KC ? P2 : pc + FP_KC;
        for (int g = g0; g < g1; g += 2) {
            const int R = g1 - g < 2 ? 1 : 2;
            const int nl = 16 * (g + R - 1); /* the last group's first row */
            const __mmask16 last = lanes(n1 - nl);
            const uint16_t *src = P + (size_t)g * gs, *w = src; /* w: where the tiles read the pairs */
            size_t wgs = gs;
            int q0 = pc, q1 = pe;
            if (f16) /* the chunk of these groups rounded to BF16 once (by the first tile), for every token */
                w = buf, wgs = (size_t)FP_KC * 32, q0 = 0, q1 = pe - pc;
            /* the next block of pairs (the next groups of this chunk, else the first of the next
             * chunk) into L2 while the tokens pass over this one, a share before each tile; not
             * with fewer than FP_PF_TILES tiles, where the shares come in bursts that stall (12 %
             * of a 16-row decode step) and the first tile's reads of the block serve as well */
            const int n_tiles = (T + FP_C - 1) / FP_C;
            const int gn = g + 2 < g1 ? g + 2 : g0, pn = g + 2 < g1 ? pc : pe;
            const int n_pf = P2 - pn < FP_KC ? P2 - pn : FP_KC;                /* lines: a pair is 64 B */
            const int n_lines = pn < P2 && n_tiles >= FP_PF_TILES ? n_pf : 0;
            const int n_groups = g1 - gn < 2 ? g1 - gn : 2;
            for (int t = 0; t < T; t += FP_C) {
                const int C = T - t < FP_C ? T - t : FP_C, i = t / FP_C;
                for (int r = 0; r < n_groups; r++)
                    for (int l = n_lines * i / n_tiles; l < n_lines * (i + 1) / n_tiles; l++)
                        _mm_prefetch((const char *)(P + (size_t)(gn + r) * gs + 32 * ((size_t)pn + l)), _MM_HINT_T1);
                float *yt = y + (size_t)t * ldy + 16 * g;
                const uint16_t *xt = x + (size_t)t * ldx + 2 * (size_t)pc;
                /* x from the chunk's first pair: tile() indexes pairs from q0 */
                tile_any(R, C, f16 && t == 0, yt, ldy, w, wgs, buf, src, gs, pc, xt - 2 * (size_t)q0, ldx, q0, q1,
                         pc == 0, last);
            }
        }
    }
}
