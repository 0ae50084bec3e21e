/*
 * qpack.h -- packed copies of quantized matrices: 16 rows interleaved, for the int8 product.
 *
 * Why. The product of a quantized matrix and int8 activations (qimpl.h) is a sum over blocks
 * of  delta * sum_i q_i x_i + min * sum(x).  In the row layout (quant.h) one vpdpbusd covers 64
 * levels of ONE row, and each block's 16 int32 lanes must then be converted and scaled on
 * their own: three vector operations per vpdpbusd. In the packed layout the 16 lanes of a
 * vpdpbusd are 16 ROWS, each taking 4 consecutive levels against the same 4 bytes of x
 * (broadcast), so a block of 64 is 16 vpdpbusd into two int32 accumulators per token (the x
 * groups 0 and 1 of qimpl.h), converted and scaled once per block: 3 or 4 float multiplies
 * per 8 or 16 vpdpbusd (see Arithmetic). Measured on the development machine (Zen 4, 1 thread,
 * Q4_B64, 2048 x 2048, 64 tokens): 345-365 GOP/s against 160 for the row layout (75 % of the
 * VNNI roof of 471).
 *
 * Q8 (int16 x, qimpl.h) goes the same way with vpdpwssd: a lane is a row taking 2 levels as
 * int16 against 2 values of x. Measured likewise (Q8_B64): 197-203 against 112-117 GOP/s.
 *
 * What. Packing is done once, at load, by the CPU device (libcore/device/cpu.c) into memory of
 * its own; files keep the row layout. A packed matrix has a type code of its own,
 * IFK_QPACKED + the base type, that only ifk_matmul / ifk_qmatmul (kernels.h) and the functions
 * below accept. Types packed: Q4_B32, Q4_B64, Q8_B32, Q8_B64 (the bytes move, none are added,
 * so the packed copy has exactly the size of the original, padding rows aside). The other types
 * keep the row layout.
 *
 * Byte layout. Rows are taken 16 at a time (group g: rows 16 g .. 16 g + 15; the rows past N in
 * the last group are zero bytes). Group g's blocks follow each other; block b of group g (the
 * "tile") starts at byte (g * nb + b) * 16 * BB (nb = ceil(K / B), BB = the base type's block
 * bytes), so rows n0 .. of a group-aligned range start at n0 * row bytes, as in the row layout:
 *     offset  0: f16 delta[16]   the 16 rows' deltas (row r at 2 r)
 *     offset 32: f16 min[16]
 *     offset 64: Q4: B / 8 slabs of 64 bytes; slab p, byte 4 r + i (r < 16, i < 4):
 *                    q[r][8 p + i] | q[r][8 p + 4 + i] << 4
 *                so a slab's low nibbles are the levels of k-step 2 p (4 levels per row, elements
 *                8 p .. 8 p + 3 of the block) and its high nibbles those of k-step 2 p + 1.
 *                Q8: B / 4 slabs of 64 bytes; slab s, byte 4 r + i = q[r][4 s + (0, 2, 1, 3)[i]],
 *                so the even bytes of a row's dword are levels 4 s, 4 s + 1 (an int16 pair once
 *                masked) and the odd bytes 4 s + 2, 4 s + 3.
 *     Size: 64 + 8 B (Q4) or 64 + 16 B (Q8) = 16 * BB.
 *
 * Arithmetic. Per output (row n, token t) and block, in this order, with a0 / a1 the exact
 * int32 sums of the even / odd k-steps (Q4: x groups 0 / 1) or of the even / odd bytes (Q8):
 *     Q4 of 64:       p = fma(float(a1), s1, float(a0) * s0)
 *     Q4 of 32, Q8:   p = float(a0 + a1) * s0                 (one x scale: the ints add first)
 *     then            y = fma(p, delta, y);  y = fma(min, sum, y)
 * That is 3 or 4 float multiplies a block and token, beside the 8 or 16 vpdpbusd; both use the
 * same two pipes on Zen 4, so the count sets the kernel's share of the roof.
 * (s0, s1, sum: qimpl.h's x scales and block sum; s1 = s0 for B = 32, whose x has one scale per
 * block). The same for every T, so a row of y depends only on W and its own x row (kernels.h's
 * batch invariance), but NOT the same float sum as the row layout: a model gives the same tokens
 * packed or not only up to rounding. IFLOW_PACK=0 in the environment turns packing off.
 */
#ifndef IFK_QPACK_H
#define IFK_QPACK_H

#include <stddef.h>

enum { IFK_QPACKED = 64 }; /* a packed type's code: IFK_QPACKED + its base type (quant.h) */

/* The packed code this CPU's product prefers for matrices of `type` (quant.h), or 0 when it
 * reads the row layout as fast (another type, a CPU without AVX512_VNNI, IFLOW_PACK=0). */
int ifk_qpack_type(int type);
/* The base type of a packed code, or -1 when `ptype` is not one. */
int ifk_qpack_base(int ptype);
/* Bytes of a packed copy of an [N][K] matrix of base type `type` (N rounded up to 16 rows). */
size_t ifk_qpack_bytes(int type, int N, int K);
/* dst: [ifk_qpack_bytes] = W: [N][row bytes] of `type` in the packed layout above. */
void ifk_qpack(void *dst, const void *W, int type, int N, int K);
/* Rows n0 <= n < n1 of a packed matrix back in the row layout: dst [n1 - n0][row bytes]. */
void ifk_qunpack_rows(void *dst, const void *P, int ptype, int n0, int n1, int K);

#endif
