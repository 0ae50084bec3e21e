/*
 * fpack_amx.c -- the BF16 product over packed F16 / BF16 matrices (qpack.h's float pairs) on
 * AMX tiles (AMX-TILE, AMX-BF16: Sapphire Rapids and later): y = x W^T with tdpbf16ps.
 *
 * Why. An AMX tile multiply (tdpbf16ps: 16 x 16 outputs, 32 BF16 elements of K each) measured
 * 2280 GFLOP/s on one core of the development VM's Xeon (2026-11-28, model 207), against 85 for
 * vdpbf16ps and 170 for F32 FMA on the same core: prefill of F16 and BF16 weights, bound by
 * vdpbf16ps on the avx512 path, becomes bound by reading the weights.
 *
 * Layout. qpack.h's pairs are already what a tile multiply takes as its second operand (B): 16
 * consecutive pairs p .. p + 15 of a group (16 rows) are 16 rows of 64 bytes, row i holding
 * pair p + i of the 16 rows, 1 KiB contiguous. The first operand (A) is 16 tokens' elements
 * 2 p .. 2 p + 31 of x rounded to BF16 (64 bytes a token, at x's stride), and the accumulator
 * (C) 16 tokens x 16 rows of F32, stored straight into y. Tiles: C 0..3 (2 token tiles x 2
 * groups), A 4..5, B 6..7; a token tile is 16 tokens, or the T % 16 left over (the tiles are
 * configured again for those, rows = T % 16).
 *
 * Arithmetic. Each output y[t][n] is ONE chain over the steps of 16 pairs (32 elements of K)
 * in order: acc = 0, then acc = tdpbf16ps(acc, step) for each step, the hardware's own sum of
 * the step's 32 products into acc (DAZ, FTZ, round to nearest even, as vdpbf16ps). Prefill takes
 * K in chunks of FA_KC pairs and keeps the chain in y between them (F32 stored and loaded
 * exactly); every T, decode included, runs the same steps, so y[t] depends only on W and x[t]
 * (kernels.h's batch invariance): T = 1 is a tile of one token. The last step of an odd or
 * short K reads x's zeros (round_x pads x to a multiple of 32 and more) against a copy of the
 * last pairs padded with zeros. F16 weights are rounded to BF16 (nearest even; the avx512
 * path's rounding) a step at a time just before its multiply: in prefill by a chunk's first token
 * tile, into a buffer of the chunk that its other tiles read; in decode into a small buffer.
 * Results differ from the avx512 path's vdpbf16ps chain by summation order only.
 *
 * A thread's tile state is its own: each call loads the configuration (ldtilecfg) and releases
 * the tiles when done. The process must have asked the kernel for the tile data state
 * (dispatch.c does, once, before it picks this path).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/qpack.h"

#define FA_KC 512 /* pairs per chunk: two groups' chunk of BF16 is 2 x 32 KiB (L2) */
#define FA_STEP 16 /* pairs per tile step */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} fa_config;

/* Tiles 0..5 (C and A) hold `tokens` rows, 6..7 (B) 16; every row is 64 bytes. Loading a
 * configuration zeroes the tiles. */
static void configure(int tokens)
{
    _Alignas(64) fa_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.rows[i] = (uint8_t)(i < 6 ? tokens : 16);
        c.colsb[i] = 64;
    }
    _tile_loadconfig(&c);
}

/* Pairs q0 .. q1 - 1 of R groups (group r's 16 rows at src + r * gs, F16, pair p at 32 p)
 * rounded to BF16 into dst (group r's pair q0 at r * dgs), zeros after them up to a whole
 * step. The groups are read side by side, the lines FA_PF pairs ahead prefetched (one group
 * after the other, decode read the weights at half the speed; 2026-11-28). */
#define FA_PF 32
static void round_pairs(uint16_t *dst, size_t dgs, const uint16_t *src, size_t gs, int R, int q0, int q1, int P2)
{
    for (int p = q0; p < q1; p++)
        for (int r = 0; r < R; r++) {
            const uint16_t *v = src + r * gs + (size_t)32 * p;
            if (p + FA_PF < P2)
                _mm_prefetch((const char *)(v + 32 * FA_PF), _MM_HINT_T0);
            __m512 lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)v));
            __m512 hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16)));
            _mm512_store_si512(dst + r * dgs + (size_t)32 * (p - q0), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    for (int r = 0; r < R; r++)
        for (int p = q1; (p - q0) % FA_STEP; p++)
            _mm512_store_si512(dst + r * dgs + (size_t)32 * (p - q0), _mm512_setzero_si512());
}

/* The weights of a block's steps: n_steps steps of 16 pairs from pair q0 (of P2), R groups.
 * BF16 at hand (src NULL): group r's step s at w[r] + 512 s, except a short last step, at
 * tail[r] when set (zero-padded); pf: prefetch the lines FA_PF pairs ahead (first reads).
 * F16 (src: group r at src + r * gs): each step rounded just before its multiply, so that
 * reading the weights overlaps the multiplies, into keep (group r's step s at keep + r * FA_KC
 * * 32 + 512 s, for the chunk's other token tiles) or, keep NULL, a small buffer of the block. */
typedef struct {
    const uint16_t *w[2], *tail[2], *src;
    uint16_t *keep;
    size_t gs;
    int q0, q1, P2, n_steps, pf;
} fa_steps;

/* One block: NT token tiles (1 or 2; the second 16 tokens after the first) x R groups (1 or 2)
 * over the steps of `ws`. x: token tile 0's first token at pair q0; ldx in elements. y: token
 * tile 0's first token, group 0's first row; the last group's first `last` rows are y's (fewer
 * than 16: through tmp); `tokens` a tile's rows; first: the chains start here (else they
 * continue from y). */
static inline __attribute__((always_inline)) void block(const int NT, const int R, float *y, size_t ldy,
                                                        const fa_steps *ws, const uint16_t *x, size_t ldx,
                                                        int tokens, int first, int last)
{
    _Alignas(64) uint16_t sb[2][2][FA_STEP * 32]; /* F16 steps not kept: [step parity][group] */
    _Alignas(64) float tmp[2][16][16]; /* the partial last group's C, per token tile */
    const size_t sx = ldx * sizeof(uint16_t);
    const int part = last < 16; /* the last group (R - 1) goes through tmp */
    /* C c (0..3): token tile c / 2, group c % 2; in y, or tmp for the partial last group */
#define FA_C(c) ((c) % 2 == R - 1 && part ? (void *)tmp[(c) / 2] : (void *)(y + 16 * ldy * ((c) / 2) + 16 * ((c) % 2)))
#define FA_CS(c) ((c) % 2 == R - 1 && part ? (size_t)64 : ldy * sizeof(float))
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        if (part)
            for (int i = 0; i < NT; i++)
                for (int t = 0; t < tokens; t++) {
                    memset(tmp[i][t], 0, sizeof tmp[i][t]);
                    memcpy(tmp[i][t], y + ((size_t)16 * i + t) * ldy + 16 * (R - 1), (size_t)last * sizeof(float));
                }
        _tile_loadd(0, FA_C(0), FA_CS(0));
        if (R == 2)
            _tile_loadd(1, FA_C(1), FA_CS(1));
        if (NT == 2)
            _tile_loadd(2, FA_C(2), FA_CS(2));
        if (NT == 2 && R == 2)
            _tile_loadd(3, FA_C(3), FA_CS(3));
    }
    for (int s = 0; s < ws->n_steps; s++) {
        if (ws->src) {
            const int q = ws->q0 + FA_STEP * s, qe = ws->q1 - q < FA_STEP ? ws->q1 : q + FA_STEP;
            uint16_t *d = ws->keep ? ws->keep + (size_t)512 * s : sb[s & 1][0];
            const size_t dgs = ws->keep ? (size_t)FA_KC * 32 : FA_STEP * 32;
            round_pairs(d, dgs, ws->src, ws->gs, R, q, qe, ws->P2);
            _tile_loadd(6, d, 64);
            if (R == 2)
                _tile_loadd(7, d + dgs, 64);
        } else {
            if (ws->pf && s + FA_PF / FA_STEP < ws->n_steps)
                for (int r = 0; r < R; r++)
                    for (int l = 0; l < FA_STEP; l++)
                        _mm_prefetch((const char *)(ws->w[r] + (size_t)512 * s + 32 * (FA_PF + l)), _MM_HINT_T0);
            const int t_ = ws->tail[0] && s == ws->n_steps - 1;
            _tile_loadd(6, t_ ? ws->tail[0] : ws->w[0] + (size_t)512 * s, 64);
            if (R == 2)
                _tile_loadd(7, t_ ? ws->tail[1] : ws->w[1] + (size_t)512 * s, 64);
        }
        _tile_loadd(4, x + (size_t)32 * s, sx);
        if (NT == 2)
            _tile_loadd(5, x + 16 * ldx + (size_t)32 * s, sx);
        _tile_dpbf16ps(0, 4, 6);
        if (R == 2)
            _tile_dpbf16ps(1, 4, 7);
        if (NT == 2) {
            _tile_dpbf16ps(2, 5, 6);
            if (R == 2)
                _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, FA_C(0), FA_CS(0));
    if (R == 2)
        _tile_stored(1, FA_C(1), FA_CS(1));
    if (NT == 2)
        _tile_stored(2, FA_C(2), FA_CS(2));
    if (NT == 2 && R == 2)
        _tile_stored(3, FA_C(3), FA_CS(3));
#undef FA_C
#undef FA_CS
    if (part)
        for (int i = 0; i < NT; i++)
            for (int t = 0; t < tokens; t++)
                memcpy(y + ((size_t)16 * i + t) * ldy + 16 * (R - 1), tmp[i][t], (size_t)last * sizeof(float));
}

static void block_any(int NT, int R, float *y, size_t ldy, const fa_steps *ws, const uint16_t *x, size_t ldx,
                      int tokens, int first, int last)
{
    if (NT == 2 && R == 2)
        block(2, 2, y, ldy, ws, x, ldx, tokens, first, last);
    else if (NT == 2)
        block(2, 1, y, ldy, ws, x, ldx, tokens, first, last);
    else if (R == 2)
        block(1, 2, y, ldy, ws, x, ldx, tokens, first, last);
    else
        block(1, 1, y, ldy, ws, x, ldx, tokens, first, last);
}

/* The steps of pairs q0 .. q1 - 1 of groups g, g + 1 (R of them) of the packed matrix P. */
static fa_steps steps_of(const uint16_t *P, size_t gs, int f16, int g, int R, int q0, int q1, int P2,
                         uint16_t tailw[2][FA_STEP * 32])
{
    fa_steps ws = {.gs = gs, .q0 = q0, .q1 = q1, .P2 = P2, .n_steps = (q1 - q0 + FA_STEP - 1) / FA_STEP};
    for (int r = 0; r < 2; r++)
        ws.w[r] = P + (size_t)(g + (r < R ? r : 0)) * gs + (size_t)32 * q0;
    if (f16) {
        ws.src = P + (size_t)g * gs;
    } else if ((q1 - q0) % FA_STEP) { /* the short last step's pairs, then zeros */
        const int q = q0 + (ws.n_steps - 1) * FA_STEP;
        for (int r = 0; r < R; r++) {
            memset(tailw[r], 0, sizeof tailw[r]);
            memcpy(tailw[r], ws.w[r] + (size_t)32 * (q - q0), (size_t)(q1 - q) * 64);
            ws.tail[r] = tailw[r];
        }
        ws.tail[1] = ws.tail[R - 1];
    }
    return ws;
}

/* y[t][n] for n0 <= n < n1 (kernels/cpu/impl.h's IFK_DECL_BF16_ROWS; W packed, n0 a multiple
 * of 16). */
IFK_DECL_BF16_ROWS(ifk_amx_fpack_rows)
{
    const int f16 = ifk_fpack_base(wtype) == IFK_F16, P2 = (K + 1) / 2, g0 = n0 / 16, g1 = (n1 + 15) / 16;
    const size_t gs = (size_t)P2 * 32; /* elements of a group */
    const uint16_t *P = W;
    if (K <= 0 || n1 <= n0) {
        ifk_zero_rows(y, ldy, T, n0, n1);
        return;
    }
    _Alignas(64) uint16_t tailw[2][FA_STEP * 32];
    if (T < 16) { /* few tokens (decode): all of K in one go, F16 steps rounded as they are used */
        configure(T);
        for (int g = g0; g < g1; g += 2) {
            const int R = g1 - g < 2 ? 1 : 2, nl = n1 - 16 * (g + R - 1);
            fa_steps ws = steps_of(P, gs, f16, g, R, 0, P2, P2, tailw);
            ws.pf = 1;
            block_any(1, R, y + 16 * (size_t)g, ldy, &ws, x, ldx, T, 1, nl < 16 ? nl : 16);
        }
        _tile_release();
        return;
    }
    /* prefill: K in chunks of FA_KC pairs; per chunk and pair of groups, the token tiles (two at
     * a time, then one, then the tokens left over), the first of which reads the weights (and
     * rounds F16 ones into buf, which the others read) */
    _Alignas(64) uint16_t buf[f16 ? 2 * FA_KC * 32 : 1]; /* F16: two groups' chunk as BF16, 64 KiB */
    const int full = T / 16 * 16, rest = T - full; /* tokens in whole tiles; the rest */
    int cfg = 16;
    configure(cfg);
    for (int pc = 0; pc < P2; pc += FA_KC) {
        const int pe = P2 - pc < FA_KC ? P2 : pc + FA_KC;
        for (int g = g0; g < g1; g += 2) {
            const int R = g1 - g < 2 ? 1 : 2, nl = n1 - 16 * (g + R - 1), last = nl < 16 ? nl : 16;
            fa_steps ws = steps_of(P, gs, f16, g, R, pc, pe, P2, tailw), kept = ws;
            ws.pf = 1;
            if (f16) /* the first tile rounds into buf; the other tiles read it */
                ws.keep = buf, kept.src = NULL, kept.w[0] = buf, kept.w[1] = buf + (size_t)(R - 1) * FA_KC * 32;
            float *yg = y + 16 * (size_t)g;
            const uint16_t *xc = x + 2 * (size_t)pc;
            if (cfg != 16)
                configure(cfg = 16);
            for (int t = 0; t < full; t += 32)
                block_any(full - t >= 32 ? 2 : 1, R, yg + (size_t)t * ldy, ldy, t ? &kept : &ws, xc + (size_t)t * ldx,
                          ldx, 16, pc == 0, last);
            if (rest) {
                configure(cfg = rest);
                block_any(1, R, yg + (size_t)full * ldy, ldy, &kept, xc + (size_t)full * ldx, ldx, rest, pc == 0, last);
            }
        }
    }
    _tile_release();
}
