/*
 * qtile.cuh -- the warp-tile layout of Q4_B32, Q4_B64, Q8_B32 and Q8_B64 matrices: what the
 * CUDA device stores when it packs them (IFLOW_CUDA_TILED=1; kernels/cuda/qtiled.cu computes
 * with it), and its decoders, for the kernels and, unchanged, for a CPU test (IFKC_HD functions
 * as in qblock.cuh; tests/unit/test_cuda_qtile.c).
 *
 * Why. In quant.h's row layout a block is 20, 36 or 68 bytes, so a lane can read it only 4
 * bytes at a time; the decode product then spends most of its instructions per weight on
 * loads and on turning levels into floats (0.30-0.61 of the copy bandwidth on an H200,
 * docs/PERFORMANCE.md). In a warp tile, lane j of a warp reads whole block j of 32: its level
 * bytes as 16-byte loads that the warp makes 512 contiguous bytes, and its delta|min word; an
 * int8 dot product (dp4a) then takes 4 levels at a time against int8 activations.
 *
 * Byte layout. A row keeps its place and size (row n at byte n * rs, rs = nb * BB, nb =
 * ceil(K / B), BB = quant.h's block bytes): only the bytes inside it move. rs must be a
 * multiple of 16 (nb a multiple of 4 for these four types: ifkc_tile_ok), so that every
 * 16-byte load is aligned when the matrix is. The row's blocks go 32 at a time: tile i holds
 * blocks 32 i .. 32 i + c - 1, c = min(32, nb - 32 i), from row byte 32 i BB:
 *     P parts of c x 16 bytes   part p, bytes 16 j .. 16 j + 15: level bytes 16 p .. 16 p + 15
 *                               of block 32 i + j (quant.h's bytes 4 + 16 p .. of the block)
 *     c words                   word j: block 32 i + j's f16 delta (low half) and f16 min
 * with P = (BB - 4) / 16 (Q4_B32 1, Q4_B64 2, Q8_B32 2, Q8_B64 4). The level bytes keep
 * quant.h's meaning: Q8 byte e = q[e]; Q4_B64 byte e = q[e] | q[e + 32] << 4; Q4_B32 byte e =
 * q[e] | q[e + 16] << 4. So 32-bit word w of part p covers, as four bytes (Q8) or the low and
 * the high nibbles (Q4), the elements
 *     Q8:     16 p + 4 w .. + 3
 *     Q4_B64: 16 p + 4 w .. + 3 and 32 + 16 p + 4 w .. + 3
 *     Q4_B32:        4 w .. + 3 and 16 + 4 w .. + 3
 * which are, in the int8 activations of kernels/cpu/qimpl.h, in group w % 2 for B = 64 (the
 * alternating runs of 4) and in the one group for B = 32.
 *
 *   IFKC_TILE_TYPE(t)                 1 for the four types
 *   ifkc_tile_ok(t, K)                1 if a matrix of type t and K columns has this layout
 *   ifkc_tile_parts(t)                P
 *   ifkc_tile_pack_row(dst, src, t, nb)   one row, quant.h's layout -> tiles (the host packs)
 *   ifkc_tile_block(t, row, nb, b, blk)   block b back in quant.h's layout (BB bytes)
 *   ifkc_tile_weight(t, row, nb, e)   the decoded weight of element e: fmaf(q, delta, min),
 *                                     bit-identical to ifk_dequantize_row
 */
#ifndef IFKC_QTILE_CUH
#define IFKC_QTILE_CUH

#include "kernels/cuda/qblock.cuh"

#define IFKC_TILE_TYPE(t) ((t) == IFK_Q4_B32 || (t) == IFK_Q4_B64 || (t) == IFK_Q8_B32 || (t) == IFK_Q8_B64)

IFKC_HD int ifkc_tile_parts(int t) { return (IFKC_QBB(t) - 4) / 16; }

IFKC_HD int ifkc_tile_ok(int t, int K)
{
    if (!IFKC_TILE_TYPE(t) || K <= 0)
        return 0;
    const int nb = (K + IFKC_QB(t) - 1) / IFKC_QB(t);
    return nb % 4 == 0;
}

/* Byte offsets in a row of nb blocks: block b's level part p, and its delta|min word. */
IFKC_HD size_t ifkc_tile_part_at(int t, int nb, int b, int p)
{
    const int i = b / 32, j = b % 32, c = nb - 32 * i < 32 ? nb - 32 * i : 32;
    return (size_t)32 * i * IFKC_QBB(t) + (size_t)p * c * 16 + (size_t)j * 16;
}

IFKC_HD size_t ifkc_tile_word_at(int t, int nb, int b)
{
    const int i = b / 32, j = b % 32, c = nb - 32 * i < 32 ? nb - 32 * i : 32;
    return (size_t)32 * i * IFKC_QBB(t) + (size_t)ifkc_tile_parts(t) * c * 16 + (size_t)j * 4;
}

/* dst [nb * BB] <- src [nb * BB], one row (host or device memory; no alignment needed). */
IFKC_HD void ifkc_tile_pack_row(uint8_t *dst, const uint8_t *src, int t, int nb)
{
    const int BB = IFKC_QBB(t), P = ifkc_tile_parts(t);
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = src + (size_t)b * BB;
        for (int p = 0; p < P; p++)
            for (int e = 0; e < 16; e++)
                dst[ifkc_tile_part_at(t, nb, b, p) + e] = blk[4 + 16 * p + e];
        for (int e = 0; e < 4; e++)
            dst[ifkc_tile_word_at(t, nb, b) + e] = blk[e];
    }
}

/* blk [BB] <- block b of a tiled row. */
IFKC_HD void ifkc_tile_block(int t, const uint8_t *row, int nb, int b, uint8_t *blk)
{
    const int P = ifkc_tile_parts(t);
    for (int e = 0; e < 4; e++)
        blk[e] = row[ifkc_tile_word_at(t, nb, b) + e];
    for (int p = 0; p < P; p++)
        for (int e = 0; e < 16; e++)
            blk[4 + 16 * p + e] = row[ifkc_tile_part_at(t, nb, b, p) + e];
}

/* The decoded weight of element e (0 <= e < nb * B) of a tiled row. */
IFKC_HD float ifkc_tile_weight(int t, const uint8_t *row, int nb, int e)
{
    const int B = IFKC_QB(t), b = e / B, i = e % B;
    int byte = i, shift = 0; /* Q8: byte i */
    if (t != IFK_Q8_B32 && t != IFK_Q8_B64 && i >= B / 2) /* Q4: the high nibble of byte i - B/2 */
        byte = i - B / 2, shift = 4;
    const uint8_t v = row[ifkc_tile_part_at(t, nb, b, byte / 16) + byte % 16];
    const int q = t == IFK_Q8_B32 || t == IFK_Q8_B64 ? v : (v >> shift) & 15;
    float delta, min;
    ifkc_qdelta_min(row + ifkc_tile_word_at(t, nb, b), &delta, &min); /* the word is 4-byte aligned */
    return fmaf((float)q, delta, min);
}

#endif
