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
 * Int8 x for Q8, Q6 and Q5 (the opt-in mode IFK_QX_INT8, quant.h) reads the SAME tiles: their
 * levels are bytes in the "int16 pair order" below (a row's dword holds elements 0 2 1 3 of a
 * run of 4), and a vpdpbusd does not care in which order it sums its 4 products, so it takes a
 * row's dword as it is against x's 4 bytes of that run permuted the same way. qdispatch.c swaps
 * bytes 1 and 2 of each dword of the quantized x for these kernels (T K bytes a call, against
 * T N K products); the kernel then takes two of the int16 slabs, 2 s and 2 s + 1 (elements
 * 8 s .. 8 s + 7: x groups 0 and 1 of qimpl.h), as the two operands of int8 slab s, with no
 * unpacking at all for Q8. One layout for both modes, so the mode can change at any time
 * (packing is done once, at load). Measured likewise (2026-11-27, loaded machine, one run):
 * Q8_B64 353 against 208 GOP/s for int16 x, Q4_B64 361 beside it (docs/PERFORMANCE.md).
 *
 * The other types go the same way (Q6, Q5 on int16 x; Q3H, Q3, Q2 on int8 x); only the
 * unpacking of a slab differs (Byte layout). In the row layout their decode was bound by that
 * unpacking, done for one row per block; in a tile it is done once for 16 rows. Measured on
 * the development machine (2026-11-27, 1 thread, shared with other builds; best of rounds):
 * decode from cache (qbench --hot, 512 x 2048, GB/s of weights) and prefill (T = 64,
 * 2048 x 2048, GOP/s), row layout -> packed:
 *     Q6   18 -> 44,  120 -> 180      Q3H  12 -> 35,  151 -> 277      Q2  12 -> 35,  112 -> 325
 *     Q5   17 -> 37,  122 -> 185      Q3   14 -> 32,  127 -> 286
 * Decode from cache is 1.3-1.8 times a quiet core's read bandwidth (21-25 GB/s), and decode
 * from DRAM (5632 x 2048) read at 0.90-1.12 of the bandwidth measured beside it, 1 and 2 threads
 * (0.63-0.94 in the row layout): bound by the bandwidth (docs/QUANTIZATION.md).
 *
 * What. Packing is done once, at load, by the CPU device (libcore/device/cpu.c) into memory of
 * its own; files keep the row layout. A packed matrix has a type code of its own,
 * IFK_QPACKED + the base type (quantized, or F16 / BF16: below), that only ifk_matmul /
 * ifk_qmatmul (kernels.h) and the functions below accept. Every quantized type has a packed layout (the bytes move, none are added, so the
 * packed copy has exactly the size of the original, padding rows aside). Which are packed
 * depends on the path (ifk_qpack_type): Q4 and Q8 on every AVX512_VNNI path (qpack_avx512.c)
 * and on the AVX2 path (qpack_avx2.c: the same tiles as two halves of 8 rows, vpmaddubsw /
 * vpmaddwd, the same bits); Q6, Q5, Q3H, Q3 and Q2 where the CPU also has GFNI and AVX512_VBMI
 * (the avx512gfni path), whose instructions their unpacking uses. On a path without a kernel for
 * the type (scalar, or the ISA forced lower after packing) a packed matrix is multiplied by
 * unpacking its rows again, 16 at a time.
 *
 * Byte layout. Rows are taken 16 at a time (group g: rows 16 g .. 16 g + 15; the rows past N in
 * the last group are zero bytes). Group g's blocks follow each other; block b of group g (the
 * "tile") starts at byte (g * nb + b) * 16 * BB (nb = ceil(K / B), BB = the base type's block
 * bytes), so rows n0 .. of a group-aligned range start at n0 * row bytes, as in the row layout:
 *     offset  0: f16 delta[16]   the 16 rows' deltas (row r at 2 r)
 *     offset 32: f16 min[16]
 *     offset 64: the levels, in 64-byte units; "row r's dword" of a unit is its bytes 4 r .. 4 r + 3
 * The product (qpack_avx512.c) reads the levels as slabs: slab s of a block is 16 rows x 8
 * elements (8 s .. 8 s + 7) for int8 x, 16 rows x 4 elements (4 s ..) for int16 x (Q8, Q6,
 * Q5), unpacked into two operands of 16 dwords, one per row: the first half of the slab's
 * elements and the second, as 4 bytes (vpdpbusd) or 2 int16 (vpdpwssd; the "int16 pair order"
 * below puts a row's 4 levels as bytes 0 2 1 3, so that the even bytes are the first pair and the
 * odd bytes the second). Per type, with q[r][e] the level of element e of row r's block and
 * qs / ql / qh / cl / ch its level bytes as quant.h lays them out:
 *     Q4:  B / 8 units; slab p = unit p, byte 4 r + i: q[r][8 p + i] | q[r][8 p + 4 + i] << 4
 *          (low nibbles: the first half, high nibbles: the second).
 *     Q8:  B / 4 units; slab s = unit s, byte 4 r + i = q[r][4 s + (0, 2, 1, 3)[i]].
 *     Q2:  2 units; unit h's row r dword = qs[4 h .. 4 h + 3] of row r as it is, so that bits
 *          2 s, 2 s + 1 of byte i are q[r][8 s + 4 h + i]: slab s is crumb s of unit 0 (first
 *          half) and of unit 1 (second half).
 *     Q3:  Q2's 2 units from ql, then 8 masks of 64 bits (one unit): mask o (bytes 8 o ..) has
 *          bit 4 r + i = bit 2 of q[r][4 o + i] (bits 4 o .. 4 o + 3 of row r's qh); slab s's
 *          halves add 4 where masks 2 s, 2 s + 1 are set.
 *     Q5:  8 units of nibbles, unit u's row r dword = ql[4 u .. 4 u + 3] in the int16 pair
 *          order, then 16 masks of 64 bits (2 units): mask s has bit 4 r + i = bit 4 of
 *          q[r][4 s + (0, 2, 1, 3)[i]]. Slab s is the low (s < 8) or high (s >= 8) nibbles of
 *          unit s % 8, + 16 where mask s is set.
 *     Q6:  Q5's 8 units, then 4 units of crumbs: unit 8 + v's row r dword = qh[4 v .. 4 v + 3]
 *          in the int16 pair order. Slab s is Q5's nibbles | crumb s / 4 of unit 8 + s % 4 << 4.
 *     Q3H: 7 units; with 8 "code registers" X m of 64 bytes, byte 16 L + 8 h + 2 d + e of X m
 *          = code 4 m + 2 h + e of row 4 L + d (code i = 11 q[r][2 i] + q[r][2 i + 1], quant.h):
 *          unit m (m < 7) = X m with bit 7 of each byte = bit m of X 7's byte. Slab m: a and b of X m's 64 codes by two 128-entry lookups, interleaved
 *          bytewise within 128-bit lanes (vpunpck{l,h}bw): the low halves are the slab's
 *          first operand, the high halves its second.
 *     Size: 16 * BB.
 *
 * F16 and BF16 (float pairs). Where ifk_matmul multiplies them with the BF16 dot product
 * (kernels.h's ifk_bf16_dot), F16 and BF16 matrices are packed too, losslessly (their own
 * element type): group g's pair p (elements 2 p and 2 p + 1 of its 16 rows) is 32 elements at
 * element (g * P + p) * 32, P = ceil(K / 2), row l's pair at 2 l; the element past an odd K and
 * the rows past N are 0. A vector of 64 bytes is then one vdpbf16ps operand of 16 rows against
 * a token's pair broadcast (fpack_avx512bf16.c states the arithmetic: one chain per output, the
 * same in decode and prefill), and 16 consecutive pairs of a group (1 KiB) are one AMX tile
 * multiply's second operand (fpack_amx.c). A row is 2 P elements, so rows n0 .. of a group-aligned range
 * start at n0 * 4 P bytes. On the exact F32 product (ifk_set_qx_f32) they are unpacked 16 rows
 * at a time again (the reference); ifk_qpack_type packs them only while the BF16 product is on.
 * Measured (2026-11-28, TinyLlama-1.1B shape, 1 / 2 threads; docs/PERFORMANCE.md): F16 prefill
 * of 128 tokens 89 -> 101 / 159-163 -> 192 tok/s, decode 10.8 -> 13.3-13.6 / 15-20 -> 16-24.
 *
 * Arithmetic. Per output (row n, token t) and block, in this order, with a0 / a1 the exact
 * int32 sums of the slabs' first / second halves (int8 x: the x groups 0 / 1 of qimpl.h):
 *     int8 x, B = 64 (Q4_B64, Q3H):     p = fma(float(a1), s1, fma(float(a0), s0, cor))
 *     int8 x, B = 32 (Q4_B32, Q3, Q2):  p = fma(float(a0 + a1), s0, cor)   (one x scale: the ints add first)
 *     int16 x (Q8, Q6, Q5):             p = float(a0 + a1) * s0
 *     (in the mode IFK_QX_INT8, Q8_B64, Q6 and Q5 take the first line, Q8_B32 the second)
 *     then                              y = fma(p, delta, y);  y = fma(min, sum, y)
 * That is 3 or 4 float multiplies a block and token, beside the 8 or 16 vpdpbusd; both use the
 * same two pipes on Zen 4, so the count sets the kernel's share of the roof.
 * (s0, s1, sum, cor: qimpl.h's x scales, block sum and the rounding residual's correction; s1 =
 * s0 for B = 32, whose x has one scale per block.) How
 * the int32 sums are formed (which slabs share an accumulator, in which order) does not matter:
 * they are exact. The same for every T, so a row of y depends only on W and its own x row
 * (kernels.h's batch invariance), but NOT the same float sum as the row layout: a model gives
 * the same tokens packed or not only up to rounding. IFLOW_PACK=0 in the environment turns
 * packing off.
 */
#ifndef IFK_QPACK_H
#define IFK_QPACK_H

#include <stddef.h>

enum { IFK_QPACKED = 64 }; /* a packed type's code: IFK_QPACKED + its base type (quant.h) */

/* The packed code this CPU's product prefers for matrices of `type` (quant.h, or IFK_F16 /
 * IFK_BF16), or 0 when it has no kernel for it (the scalar path; a path without GFNI and
 * AVX512_VBMI for the types other than Q4 and Q8; F16 / BF16 while ifk_bf16_dot is 0;
 * IFLOW_PACK=0). */
int ifk_qpack_type(int type);
/* The base type of a packed code of a quantized type, or -1 when `ptype` is not one. */
int ifk_qpack_base(int ptype);
/* The base type (IFK_F16, IFK_BF16) of a packed float code, or -1 when `ptype` is not one. */
int ifk_fpack_base(int ptype);
/* Bytes of a packed copy of an [N][K] matrix of base type `type` (N rounded up to 16 rows; F16
 * and BF16: K up to an even count). */
size_t ifk_qpack_bytes(int type, int N, int K);
/* dst: [ifk_qpack_bytes] = W: [N][row bytes] of `type` in the packed layout above. */
void ifk_qpack(void *dst, const void *W, int type, int N, int K);
/* Rows n0 <= n < n1 of a packed matrix back in the row layout: dst [n1 - n0][row bytes]. */
void ifk_qunpack_rows(void *dst, const void *P, int ptype, int n0, int n1, int K);

#endif
