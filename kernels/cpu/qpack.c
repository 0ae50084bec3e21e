/*
 * qpack.c -- packing quantized matrices into 16-row tiles and back (the layouts are qpack.h's);
 * scalar, run once per matrix at load. The products over packed tiles are qpack_avx512.c and
 * qpack_avx2.c.
 *
 * Each type has one function that moves row r's levels between its block (quant.h) and the
 * level bytes of a tile, in either direction (to_tile), so that packing and unpacking cannot
 * disagree: the bytes are moved as whole dwords or 4-bit groups wherever the layouts allow,
 * which keeps packing a model at load near the speed of reading it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/quant.h"

/* IFLOW_PACK=0 turns packing off (read once). */
static int pack_wanted(void)
{
    static int want = -1;
    if (want < 0) {
        const char *e = getenv("IFLOW_PACK");
        want = !(e && strcmp(e, "0") == 0);
    }
    return want;
}

int ifk_qpack_type(int type)
{
    if (type == IFK_F16 || type == IFK_BF16) /* pairs for the BF16 product (qpack.h) */
        return ifk_bf16_dot(type) && pack_wanted() ? IFK_QPACKED + type : 0;
    return ifk_qtype(type) && ifk_qpath_packed(type) && pack_wanted() ? IFK_QPACKED + type : 0;
}

int ifk_qpack_base(int ptype)
{
    return ptype >= IFK_QPACKED && ifk_qtype(ptype - IFK_QPACKED) ? ptype - IFK_QPACKED : -1;
}

int ifk_fpack_base(int ptype)
{
    return ptype == IFK_QPACKED + IFK_F16 || ptype == IFK_QPACKED + IFK_BF16 ? ptype - IFK_QPACKED : -1;
}

/* A row of a float matrix in pairs: K elements rounded up to an even count. */
static size_t pair_row_bytes(int K) { return (size_t)(K + (K & 1)) * 2; }

size_t ifk_qpack_bytes(int type, int N, int K)
{
    if (type == IFK_F16 || type == IFK_BF16)
        return (size_t)((N + 15) / 16) * 16 * pair_row_bytes(K);
    return (size_t)((N + 15) / 16) * 16 * ifk_qrow_bytes(type, K);
}

/* Float pairs: element (row 16 g + l, 2 p + h) at element ((g * P + p) * 16 + l) * 2 + h of the
 * group's tile, P = ceil(K / 2); rows past N and the element past an odd K are 0 (the caller
 * zeroes the tile). One function for both directions, as move_rows below (to_tile: rows ->
 * tile; else tile -> rows, the const of rows dropped, written only then). */
static void fpack_group(uint16_t *tile, const uint16_t *rows, int nr, int K, int to_tile)
{
    const int P = (K + 1) / 2;
    for (int l = 0; l < nr; l++) {
        const uint16_t *src = rows + (size_t)l * K;
        uint16_t *dst = (uint16_t *)src;
        for (int p = 0; p < P; p++) {
            uint16_t *t = tile + ((size_t)p * 16 + l) * 2;
            if (to_tile) {
                t[0] = src[2 * p];
                t[1] = 2 * p + 1 < K ? src[2 * p + 1] : 0;
            } else {
                dst[2 * p] = t[0];
                if (2 * p + 1 < K)
                    dst[2 * p + 1] = t[1];
            }
        }
    }
}

/* ---- little-endian words and the moves both directions share ------------------------------ */

static uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* Bytes 0 1 2 3 -> 0 2 1 3 (its own inverse): the int16 pair order of Q8, Q6 and Q5 tiles. */
static uint32_t swap_mid_bytes(uint32_t v)
{
    return (v & 0xFF0000FFu) | (v & 0x0000FF00u) << 8 | (v & 0x00FF0000u) >> 8;
}

/* Bits 0 1 2 3 of a nibble -> 0 2 1 3: the same order for the one-bit planes (masks). */
static uint64_t swap_mid_bits(uint64_t n)
{
    return (n & 9) | (n & 2) << 1 | (n & 4) >> 1;
}

/* Row r's dword of unit u of a tile's levels (lv = tile + 64) <-> 4 bytes of the block's levels,
 * through f (its own inverse). */
static void move_dword(uint8_t *lv, uint8_t *blk_bytes, int u, int r, int to_tile, uint32_t (*f)(uint32_t))
{
    uint8_t *t = lv + 64 * u + 4 * r;
    if (to_tile)
        wr32(t, f ? f(ifk_rd32(blk_bytes)) : ifk_rd32(blk_bytes));
    else
        wr32(blk_bytes, f ? f(ifk_rd32(t)) : ifk_rd32(t));
}

/* Row r's 4-bit group of a 64-bit mask at m (bits 4 r .. 4 r + 3) <-> bits `at` .. at + 3 of a
 * block's bit plane *plane, through f (its own inverse). Packing ORs into zeroed masks;
 * unpacking ORs into a zeroed plane. */
static void move_nibble(uint8_t *m, uint64_t *plane, int at, int r, int to_tile, uint64_t (*f)(uint64_t))
{
    if (to_tile) {
        uint64_t n = *plane >> at & 15;
        wr64(m, ifk_rd64(m) | (f ? f(n) : n) << 4 * r);
    } else {
        uint64_t n = ifk_rd64(m) >> 4 * r & 15;
        *plane |= (f ? f(n) : n) << at;
    }
}

/* ---- the levels of one row of a tile, per type (qpack.h) --------------------------------- *
 * blk: the row's block (its level bytes at blk + 4); lv: the tile's levels (tile + 64). */

/* Q4: slab p (p < B/16) takes the low nibbles of the 4 bytes at qs + 8 p (levels 8 p ..) and of
 * qs + 8 p + 4 (levels 8 p + 4 ..), slab p + B/16 their high nibbles (levels B/2 + 8 p ..). */
static void levels_q4(uint8_t *lv, uint8_t *blk, int r, int B, int to_tile)
{
    uint8_t *qs = blk + 4;
    for (int p = 0; p < B / 16; p++) {
        uint8_t *lo_t = lv + 64 * p + 4 * r, *hi_t = lv + 64 * (p + B / 16) + 4 * r;
        if (to_tile) {
            uint32_t lo = ifk_rd32(qs + 8 * p), hi = ifk_rd32(qs + 8 * p + 4);
            wr32(lo_t, (lo & 0x0F0F0F0Fu) | (hi & 0x0F0F0F0Fu) << 4);
            wr32(hi_t, (lo >> 4 & 0x0F0F0F0Fu) | (hi & 0xF0F0F0F0u));
        } else {
            uint32_t low = ifk_rd32(lo_t), high = ifk_rd32(hi_t);
            wr32(qs + 8 * p, (low & 0x0F0F0F0Fu) | (high & 0x0F0F0F0Fu) << 4);
            wr32(qs + 8 * p + 4, (low >> 4 & 0x0F0F0F0Fu) | (high & 0xF0F0F0F0u));
        }
    }
}

/* Q8: slab s = the 4 bytes at qs + 4 s in the int16 pair order. */
static void levels_q8(uint8_t *lv, uint8_t *blk, int r, int B, int to_tile)
{
    for (int s = 0; s < B / 4; s++)
        move_dword(lv, blk + 4 + 4 * s, s, r, to_tile, swap_mid_bytes);
}

/* Q5 and Q6: unit u (u < 8) = the 4 bytes at ql + 4 u in the int16 pair order. */
static void levels_nibbles64(uint8_t *lv, uint8_t *blk, int r, int to_tile)
{
    for (int u = 0; u < 8; u++)
        move_dword(lv, blk + 4 + 4 * u, u, r, to_tile, swap_mid_bytes);
}

/* Q2, and Q3's low bits: unit h (h < 2) = the 4 bytes at qs + 4 h as they are. */
static void levels_q2(uint8_t *lv, uint8_t *blk, int r, int B, int to_tile)
{
    for (int h = 0; h < 2; h++)
        move_dword(lv, blk + 4 + 4 * h, h, r, to_tile, NULL);
}

/* Q3: the crumbs as Q2, then mask o (o < 8, at lv + 128 + 8 o) = the bits 4 o .. 4 o + 3 of qh. */
static void levels_q3(uint8_t *lv, uint8_t *blk, int r, int B, int to_tile)
{
    levels_q2(lv, blk, r, B, to_tile);
    uint64_t qh = to_tile ? ifk_rd32(blk + 12) : 0;
    for (int o = 0; o < 8; o++)
        move_nibble(lv + 128 + 8 * o, &qh, 4 * o, r, to_tile, NULL);
    if (!to_tile)
        wr32(blk + 12, (uint32_t)qh);
}

/* Q5: the nibbles, then mask s (s < 16, at lv + 512 + 8 s) = bits 4 s .. 4 s + 3 of qh in the
 * int16 pair order. */
static void levels_q5(uint8_t *lv, uint8_t *blk, int r, int B, int to_tile)
{
    levels_nibbles64(lv, blk, r, to_tile);
    uint64_t qh = to_tile ? ifk_rd64(blk + 36) : 0;
    for (int s = 0; s < 16; s++)
        move_nibble(lv + 512 + 8 * s, &qh, 4 * s, r, to_tile, swap_mid_bits);
    if (!to_tile)
        wr64(blk + 36, qh);
}

/* Q6: the nibbles, then unit 8 + v (v < 4) = the 4 bytes at qh + 4 v in the int16 pair order. */
static void levels_q6(uint8_t *lv, uint8_t *blk, int r, int B, int to_tile)
{
    levels_nibbles64(lv, blk, r, to_tile);
    for (int v = 0; v < 4; v++)
        move_dword(lv, blk + 36 + 4 * v, 8 + v, r, to_tile, swap_mid_bytes);
}

/* Q3H's 32 codes of a block <-> its level bytes (quant.h: cl[16] nibbles, ch[12] three bit
 * planes). c: [32]. Eight codes at a time as the bytes of a u64; a plane's byte k spread to
 * bit 0 of 8 bytes by a multiply and a carry. */
static void q3h_codes(uint8_t *c, const uint8_t *lv)
{
    for (int k = 0; k < 4; k++) { /* codes 8 k .. 8 k + 7 */
        uint64_t v = ifk_rd64(lv + 8 * (k % 2)) >> 4 * (k / 2) & 0x0F0F0F0F0F0F0F0Full;
        for (int p = 0; p < 3; p++) {
            uint64_t t = (uint64_t)lv[16 + 4 * p + k] * 0x0101010101010101ull & 0x8040201008040201ull;
            v |= ((t + 0x7F7F7F7F7F7F7F7Full) >> 7 & 0x0101010101010101ull) << (4 + p);
        }
        wr64(c + 8 * k, v);
    }
}

static void q3h_level_bytes(uint8_t *lv, const uint8_t *c)
{
    for (int k = 0; k < 2; k++) /* cl bytes 8 k ..: codes 8 k .. low, 16 + 8 k .. high */
        wr64(lv + 8 * k, (ifk_rd64(c + 8 * k) & 0x0F0F0F0F0F0F0F0Full) | (ifk_rd64(c + 16 + 8 * k) & 0x0F0F0F0F0F0F0F0Full) << 4);
    for (int p = 0; p < 3; p++)
        for (int k = 0; k < 4; k++) /* bit 4 + p of 8 codes gathered into a byte by a multiply */
            lv[16 + 4 * p + k] = (uint8_t)(((ifk_rd64(c + 8 * k) >> (4 + p) & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56);
}

/* Q3H: code register m (m < 8), byte 16 L + 8 h + 2 d + e = code 4 m + 2 h + e of row 4 L + d;
 * registers 0..6 are units 0..6 (bits 0-6), register 7's bit m is bit 7 of unit m. A row's codes
 * move in pairs (e = 0, 1): 2 bytes at 16 L + 2 d + 8 h of a unit. */
static void levels_q3h(uint8_t *lv, uint8_t *blk, int r, int B, int to_tile)
{
    uint8_t c[32];
    if (to_tile)
        q3h_codes(c, blk + 4);
    for (int h = 0; h < 2; h++) {
        uint8_t *t = lv + 16 * (r / 4) + 2 * (r % 4) + 8 * h, *top = c + 28 + 2 * h; /* top: register 7's pair */
        uint16_t hi = to_tile ? rd16(top) : 0;
        for (int m = 0; m < 7; m++) {
            uint8_t *pair = c + 4 * m + 2 * h;
            if (to_tile) {
                wr16(t + 64 * m, (uint16_t)(rd16(pair) | (hi >> m & 0x0101) << 7));
            } else {
                uint16_t v = rd16(t + 64 * m);
                wr16(pair, v & 0x7F7F);
                hi |= (uint16_t)((v >> 7 & 0x0101) << m);
            }
        }
        if (!to_tile)
            wr16(top, hi);
    }
    if (!to_tile)
        q3h_level_bytes(blk + 4, c);
}

typedef void levels_fn(uint8_t *lv, uint8_t *blk, int r, int B, int to_tile);

/* Rows r0 <= r < r1 of a group (tiles: its nb tiles) <-> rows: [r1 - r0][nb * BB], delta, min
 * and levels (f). Packing (to_tile) only reads rows and ORs into zeroed tiles; unpacking writes
 * every byte of rows. Inlined with f, B, BB and to_tile constant, so that f is inlined too: packing
 * a model at load is mostly this loop (Q3H, TinyLlama: levels_q3h 32 % of the load's samples when
 * it was called through a pointer). */
static inline __attribute__((always_inline)) void move_rows_with(uint8_t *tiles, uint8_t *rows, int nb, int r0, int r1,
                                                                 levels_fn *f, const int B, const int BB, const int to_tile)
{
    for (int r = r0; r < r1; r++)
        for (int b = 0; b < nb; b++) {
            uint8_t *tile = tiles + (size_t)b * 16 * BB, *blk = rows + ((size_t)(r - r0) * nb + (size_t)b) * BB;
            uint8_t *d = tile + 2 * r, *m = tile + 32 + 2 * r;
            memcpy(to_tile ? d : blk, to_tile ? blk : d, 2);
            memcpy(to_tile ? m : blk + 2, to_tile ? blk + 2 : m, 2);
            f(tile + 64, blk, r, B, to_tile);
        }
}

static void move_rows(uint8_t *tiles, uint8_t *rows, int nb, int r0, int r1, int type, int to_tile)
{
#define QPACK_MOVE(f, B, BB)                                                 \
    (to_tile ? move_rows_with(tiles, rows, nb, r0, r1, f, B, BB, 1)           \
             : move_rows_with(tiles, rows, nb, r0, r1, f, B, BB, 0))
    switch (type) { /* quant.h's blocks */
    case IFK_Q8_B32: QPACK_MOVE(levels_q8, 32, 36); break;
    case IFK_Q8_B64: QPACK_MOVE(levels_q8, 64, 68); break;
    case IFK_Q6_B64: QPACK_MOVE(levels_q6, 64, 52); break;
    case IFK_Q5_B64: QPACK_MOVE(levels_q5, 64, 44); break;
    case IFK_Q4_B32: QPACK_MOVE(levels_q4, 32, 20); break;
    case IFK_Q4_B64: QPACK_MOVE(levels_q4, 64, 36); break;
    case IFK_Q3H_B64: QPACK_MOVE(levels_q3h, 64, 32); break;
    case IFK_Q3_B32: QPACK_MOVE(levels_q3, 32, 16); break;
    case IFK_Q2_B32: QPACK_MOVE(levels_q2, 32, 12); break;
    default: break;
    }
#undef QPACK_MOVE
}

void ifk_qpack(void *dst, const void *W, int type, int N, int K)
{
    if (type == IFK_F16 || type == IFK_BF16) {
        const size_t group_elems = 16 * pair_row_bytes(K) / 2;
        const int n_groups = (N + 15) / 16;
#pragma omp parallel for schedule(static) if (n_groups >= 64)
        for (int g = 0; g < n_groups; g++) {
            uint16_t *out = (uint16_t *)dst + (size_t)g * group_elems;
            memset(out, 0, group_elems * 2);
            fpack_group(out, (const uint16_t *)W + (size_t)g * 16 * K, N - 16 * g < 16 ? N - 16 * g : 16, K, 1);
        }
        return;
    }
    const int nb = (K + ifk_qtype(type)->block - 1) / ifk_qtype(type)->block;
    const size_t group_bytes = 16 * ifk_qrow_bytes(type, K);
    const int n_groups = (N + 15) / 16;
    /* groups in parallel: a model's matrices are packed at load */
#pragma omp parallel for schedule(static) if (n_groups >= 64)
    for (int g = 0; g < n_groups; g++) {
        uint8_t *out = (uint8_t *)dst + (size_t)g * group_bytes;
        memset(out, 0, group_bytes);
        /* read only (to_tile): the const is dropped for the one function of both directions */
        move_rows(out, (uint8_t *)W + (size_t)g * group_bytes, nb, 0, N - 16 * g < 16 ? N - 16 * g : 16, type, 1);
    }
}

void ifk_qunpack_rows(void *dst, const void *P, int ptype, int n0, int n1, int K)
{
    if (ifk_fpack_base(ptype) >= 0) {
        const size_t group_elems = 16 * pair_row_bytes(K) / 2;
        for (int n = n0; n < n1;) { /* the rows of one group at a time */
            const int g = n / 16, r1 = n1 - 16 * g < 16 ? n1 - 16 * g : 16;
            uint16_t *tile = (uint16_t *)P + (size_t)g * group_elems + (size_t)(n % 16) * 2; /* from row n */
            /* row l of the call is lane n % 16 + l of the tile: shift the tile by whole lanes */
            fpack_group(tile, (uint16_t *)dst + (size_t)(n - n0) * K, r1 - n % 16, K, 0);
            n = 16 * g + r1;
        }
        return;
    }
    const int type = ifk_qpack_base(ptype), nb = (K + ifk_qtype(type)->block - 1) / ifk_qtype(type)->block;
    const size_t rb = ifk_qrow_bytes(type, K);
    for (int n = n0; n < n1;) { /* the rows of one group at a time */
        const int g = n / 16, r1 = n1 - 16 * g < 16 ? n1 - 16 * g : 16;
        /* written only by packing: the const is dropped as in ifk_qpack */
        move_rows((uint8_t *)P + (size_t)g * 16 * rb, (uint8_t *)dst + (size_t)(n - n0) * rb, nb, n % 16, r1, type, 0);
        n = 16 * g + r1;
    }
}
