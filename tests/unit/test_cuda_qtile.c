/*
 * test_cuda_qtile.c -- the warp-tile layout of kernels/cuda/qtile.cuh, compiled as plain C and
 * run on the CPU, against the row layout of kernels/cpu/quant.h (ifk_quantize_row,
 * ifk_dequantize_row).
 *
 * Every check is exact:
 *   - ifkc_tile_ok: the four types with ceil(K / B) a multiple of 4, nothing else;
 *   - the parts and words of a row's tiles cover its bytes once each (a permutation of the
 *     row), and a part's 16 bytes are 16-byte aligned in the row;
 *   - on random rows (K with 4, 36, 64 and 100 blocks: whole tiles, a short last tile, one
 *     short tile, a last block cut short by K): ifkc_tile_block gives back every block of the
 *     row layout byte for byte, and ifkc_tile_weight equals ifk_dequantize_row bit for bit for
 *     every element < K;
 *   - a hand-built Q4_B64 block with known levels lands where the header's table says.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/qtile.cuh"
#include "tests/unit/check.h"

static const int tile_types[] = { IFK_Q4_B32, IFK_Q4_B64, IFK_Q8_B32, IFK_Q8_B64 };
#define N_TILE ((int)(sizeof tile_types / sizeof tile_types[0]))

static int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

static void test_ok(void)
{
    for (int t = IFK_Q8_B32; t < IFK_QTYPE_END_; t++) {
        const int B = IFKC_QB(t), tiled = t == IFK_Q4_B32 || t == IFK_Q4_B64 || t == IFK_Q8_B32 || t == IFK_Q8_B64;
        CHECK((IFKC_TILE_TYPE(t) ? 1 : 0) == tiled, "IFKC_TILE_TYPE(%d)", t);
        for (int nb = 1; nb <= 9; nb++) {
            CHECK(ifkc_tile_ok(t, nb * B) == (tiled && nb % 4 == 0), "type %d, %d blocks", t, nb);
            CHECK(ifkc_tile_ok(t, nb * B - 1) == (tiled && nb % 4 == 0), "type %d, K = %d", t, nb * B - 1);
        }
        if (tiled) {
            CHECK(ifkc_tile_parts(t) * 16 + 4 == IFKC_QBB(t), "parts of type %d", t);
            CHECK((4 * IFKC_QBB(t)) % 16 == 0, "4 blocks of type %d are whole 16-byte units", t);
        }
    }
    CHECK(!ifkc_tile_ok(IFK_F16, 4096) && !ifkc_tile_ok(IFK_Q4_B64, 0), "other types, K = 0");
}

/* Every byte of a row of nb blocks is one part byte or word byte of exactly one block. */
static void test_cover(void)
{
    const int nbs[] = { 4, 32, 36, 64, 100 };
    for (int ti = 0; ti < N_TILE; ti++)
        for (int ni = 0; ni < 5; ni++) {
            const int t = tile_types[ti], nb = nbs[ni], P = ifkc_tile_parts(t);
            const size_t rs = (size_t)nb * IFKC_QBB(t);
            int *seen = calloc(rs, sizeof *seen), bad = 0, misaligned = 0;
            for (int b = 0; b < nb; b++) {
                for (int p = 0; p < P; p++) {
                    const size_t at = ifkc_tile_part_at(t, nb, b, p);
                    misaligned += at % 16 != 0;
                    for (int e = 0; e < 16 && at + e < rs; e++)
                        seen[at + e]++;
                    bad += at + 16 > rs;
                }
                const size_t w = ifkc_tile_word_at(t, nb, b);
                for (int e = 0; e < 4 && w + e < rs; e++)
                    seen[w + e]++;
                bad += w + 4 > rs || w % 4 != 0;
            }
            for (size_t i = 0; i < rs; i++)
                bad += seen[i] != 1;
            CHECK(!bad && !misaligned, "type %d, %d blocks: %d bytes not covered once, %d parts misaligned", t, nb,
                  bad, misaligned);
            free(seen);
        }
}

static void test_random_rows(void)
{
    for (int ti = 0; ti < N_TILE; ti++) {
        const int t = tile_types[ti], B = IFKC_QB(t), BB = IFKC_QBB(t);
        const int Ks[] = { 4 * B, 36 * B, 64 * B, 100 * B - 5 };
        for (int ki = 0; ki < 4; ki++) {
            const int K = Ks[ki], nb = (K + B - 1) / B;
            CHECK(ifkc_tile_ok(t, K), "type %d, K = %d tiles", t, K);
            float *x = malloc((size_t)K * sizeof *x), *dq = malloc((size_t)K * sizeof *dq);
            uint8_t *row = malloc((size_t)nb * BB), *tiled = malloc((size_t)nb * BB), blk[68];
            for (int k = 0; k < K; k++)
                x[k] = rnd_normal() * (rnd_u32() % 50 == 0 ? 10.0f : 1.0f);
            for (int k = 0; k < B && k < K; k++) /* a constant block: delta = 0 */
                x[k] = 0.25f;
            ifk_quantize_row(row, t, x, K);
            ifk_dequantize_row(dq, t, row, K);
            ifkc_tile_pack_row(tiled, row, t, nb);
            int bad_blocks = 0, bad_weights = 0;
            for (int b = 0; b < nb; b++) {
                ifkc_tile_block(t, tiled, nb, b, blk);
                bad_blocks += memcmp(blk, row + (size_t)b * BB, (size_t)BB) != 0;
            }
            for (int k = 0; k < K; k++)
                bad_weights += !same_bits(ifkc_tile_weight(t, tiled, nb, k), dq[k]);
            CHECK(!bad_blocks && !bad_weights, "type %d, K = %d: %d blocks, %d weights differ", t, K, bad_blocks,
                  bad_weights);
            free(x), free(dq), free(row), free(tiled);
        }
    }
}

/* Q4_B64, 4 blocks; block 1 has level (e % 16) at element e (delta 1, min 0 by construction):
 * part p's byte j holds elements 16 p + j (low nibble) and 32 + 16 p + j (high). */
static void test_known_levels(void)
{
    const int t = IFK_Q4_B64, nb = 4, K = 256;
    float x[256];
    for (int k = 0; k < K; k++)
        x[k] = (float)((k / 64 == 1 ? k : 3 * k) % 16);
    uint8_t row[4 * 36], tiled[4 * 36];
    ifk_quantize_row(row, t, x, K);
    ifkc_tile_pack_row(tiled, row, t, nb);
    int bad = 0;
    for (int p = 0; p < 2; p++)
        for (int j = 0; j < 16; j++) {
            const uint8_t v = tiled[ifkc_tile_part_at(t, nb, 1, p) + j];
            bad += (v & 15) != (16 * p + j) % 16 || (v >> 4) != (32 + 16 * p + j) % 16;
        }
    /* with 4 blocks the tile is short (c = 4): part 1 of block 1 starts at 4 * 16 + 16 */
    CHECK(ifkc_tile_part_at(t, nb, 1, 1) == 80 && ifkc_tile_word_at(t, nb, 1) == 2 * 4 * 16 + 4, "offsets");
    CHECK(!bad, "%d level bytes of block 1 not where the layout puts them", bad);
    CHECK(same_bits(ifkc_tile_weight(t, tiled, nb, 64 + 37), 5.0f), "element 101 decodes to its level");
}

int main(void)
{
    RUN(test_ok);
    RUN(test_cover);
    RUN(test_random_rows);
    RUN(test_known_levels);
    return check_summary("test_cuda_qtile");
}
