/*
 * qpack.c -- packing quantized matrices into 16-row tiles and back (the layout is qpack.h's);
 * scalar, run once per matrix at load. The product over packed tiles is qpack_avx512.c.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/qimpl.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/quant.h"

static int packable(int type)
{
    return type == IFK_Q4_B32 || type == IFK_Q4_B64 || type == IFK_Q8_B32 || type == IFK_Q8_B64;
}

static int is_q8(int type)
{
    return type == IFK_Q8_B32 || type == IFK_Q8_B64;
}

/* Q8 slabs: byte 4 r + i holds level 4 s + q8_perm[i] (qpack.h), its own inverse. */
static const int q8_perm[4] = { 0, 2, 1, 3 };

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
    return packable(type) && ifk_qpath_vnni() && pack_wanted() ? IFK_QPACKED + type : 0;
}

int ifk_qpack_base(int ptype)
{
    return ptype >= IFK_QPACKED && packable(ptype - IFK_QPACKED) ? ptype - IFK_QPACKED : -1;
}

size_t ifk_qpack_bytes(int type, int N, int K)
{
    return (size_t)((N + 15) / 16) * 16 * ifk_qrow_bytes(type, K);
}

/* Row r's part of a tile: its delta, min and levels.  blk: the row's block (quant.h: f16 delta,
 * f16 min, qs[j] = q[j] | q[j + B/2] << 4); tile: [16 * BB]. With lo / hi the 4 bytes at
 * qs + 8 p and qs + 8 p + 4 (p < B/16), slab p takes their low nibbles (levels 8 p .. 8 p + 7)
 * and slab p + B/16 their high ones (levels B/2 + 8 p ..). */
static void pack_row_block(uint8_t *tile, const uint8_t *blk, int r, int B)
{
    memcpy(tile + 2 * r, blk, 2);          /* delta */
    memcpy(tile + 32 + 2 * r, blk + 2, 2); /* min */
    const uint8_t *qs = blk + 4;
    for (int p = 0; p < B / 16; p++) {
        uint32_t lo, hi;
        memcpy(&lo, qs + 8 * p, 4);
        memcpy(&hi, qs + 8 * p + 4, 4);
        uint32_t low = (lo & 0x0F0F0F0Fu) | (hi & 0x0F0F0F0Fu) << 4, high = (lo >> 4 & 0x0F0F0F0Fu) | (hi & 0xF0F0F0F0u);
        memcpy(tile + 64 + 64 * p + 4 * r, &low, 4);
        memcpy(tile + 64 + 64 * (p + B / 16) + 4 * r, &high, 4);
    }
}

/* The same for Q8 (qs[i] = q[i]): slab s, byte 4 r + i = level 4 s + q8_perm[i]. */
static void pack_row_block_q8(uint8_t *tile, const uint8_t *blk, int r, int B)
{
    memcpy(tile + 2 * r, blk, 2);
    memcpy(tile + 32 + 2 * r, blk + 2, 2);
    for (int st = 0; st < B / 4; st++) { /* bytes 0 1 2 3 -> 0 2 1 3 */
        uint32_t v;
        memcpy(&v, blk + 4 + 4 * st, 4);
        v = (v & 0xFF0000FFu) | (v & 0x0000FF00u) << 8 | (v & 0x00FF0000u) >> 8;
        memcpy(tile + 64 + 64 * st + 4 * r, &v, 4);
    }
}

void ifk_qpack(void *dst, const void *W, int type, int N, int K)
{
    const int B = ifk_qtype(type)->block, BB = ifk_qtype(type)->block_bytes, nb = (K + B - 1) / B;
    const size_t rb = (size_t)nb * BB;
    uint8_t *out = dst;
    const int n_groups = (N + 15) / 16;
    /* groups in parallel: a model's matrices are packed at load */
#pragma omp parallel for schedule(static) if (n_groups >= 64)
    for (int g = 0; g < n_groups; g++) {
        memset(out + (size_t)g * nb * 16 * BB, 0, (size_t)nb * 16 * BB);
        for (int r = 0; r < 16 && 16 * g + r < N; r++) {
            const uint8_t *row = (const uint8_t *)W + (size_t)(16 * g + r) * rb;
            for (int b = 0; b < nb; b++)
                (is_q8(type) ? pack_row_block_q8 : pack_row_block)(out + ((size_t)g * nb + b) * 16 * BB,
                                                                   row + (size_t)b * BB, r, B);
        }
    }
}

void ifk_qunpack_rows(void *dst, const void *P, int ptype, int n0, int n1, int K)
{
    const int type = ifk_qpack_base(ptype);
    const int B = ifk_qtype(type)->block, BB = ifk_qtype(type)->block_bytes, nb = (K + B - 1) / B;
    const size_t rb = (size_t)nb * BB;
    for (int n = n0; n < n1; n++)
        for (int b = 0; b < nb; b++) {
            const uint8_t *tile = (const uint8_t *)P + ((size_t)(n / 16) * nb + b) * 16 * BB;
            uint8_t *blk = (uint8_t *)dst + (size_t)(n - n0) * rb + (size_t)b * BB, q[64];
            const int r = n % 16;
            memcpy(blk, tile + 2 * r, 2);
            memcpy(blk + 2, tile + 32 + 2 * r, 2);
            if (is_q8(type)) {
                for (int st = 0; st < B / 4; st++)
                    for (int i = 0; i < 4; i++)
                        blk[4 + 4 * st + q8_perm[i]] = tile[64 + 64 * st + 4 * r + i];
                continue;
            }
            for (int p = 0; p < B / 8; p++)
                for (int i = 0; i < 4; i++) {
                    uint8_t v = tile[64 + 64 * p + 4 * r + i];
                    q[8 * p + i] = v & 15;
                    q[8 * p + 4 + i] = v >> 4;
                }
            for (int j = 0; j < B / 2; j++)
                blk[4 + j] = (uint8_t)(q[j] | q[j + B / 2] << 4);
        }
}
