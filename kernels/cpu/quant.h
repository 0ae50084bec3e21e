/*
 * quant.h -- block-quantized weight types (the Inferflow paper, section 3) and their layouts.
 *
 * Every type is block-wise min/max linear quantization (paper Eq. 1-2): a block of B weights
 * w is stored as two FP16 numbers and B integer levels q in 0..L-1, where
 *     delta = (max(w) - min(w)) / (L - 1),   q = round((w - min(w)) / delta),
 *     w'    = min + q * delta.
 * (delta = 0 when max == min: every q is 0 and w' = min.) round() is round-half-away-from-zero
 * (C's roundf). That is the paper's rule, ifk_quantize_row below; the layout and the decoding
 * w' = min + q * delta hold for any delta, min and levels, which ifk_quantize_row_search
 * chooses to minimize the block's squared error instead. Q3H is the paper's 3.5-bit type: L = 11 levels, and each pair of adjacent
 * levels is one 7-bit code c = q[2i] * 11 + q[2i+1] (Eq. 3-5).
 *
 * Byte layout of one block (all little-endian):
 *     offset 0: f16 delta      offset 2: f16 min      offset 4: the packed levels below
 *
 *   type        B   L    level bytes  block bytes  bits/weight   packing of the levels
 *   Q8_B32     32  256   32           36           9.0           qs[i] = q[i]
 *   Q8_B64     64  256   64           68           8.5           qs[i] = q[i]
 *   Q6_B64     64   64   48           52           6.5           ql[32]: ql[j] = q[j] & 15 | (q[j+32] & 15) << 4
 *                                                                qh[16]: qh[j] = (q[j] >> 4) | (q[j+16] >> 4) << 2
 *                                                                        | (q[j+32] >> 4) << 4 | (q[j+48] >> 4) << 6
 *   Q5_B64     64   32   40           44           5.5           ql[32] as Q6; qh[8]: bit i of the
 *                                                                little-endian u64 = q[i] >> 4
 *   Q4_B32     32   16   16           20           5.0           qs[j] = q[j] | q[j+16] << 4
 *   Q4_B64     64   16   32           36           4.5           qs[j] = q[j] | q[j+32] << 4
 *   Q3H_B64    64   11   28           32           4.0           32 codes c[i] = q[2i]*11 + q[2i+1] (0..120):
 *                                                                cl[16]: cl[j] = c[j] & 15 | (c[j+16] & 15) << 4
 *                                                                ch[12]: three u32 planes; bit i of plane p
 *                                                                        = bit (4+p) of c[i]
 *   Q3_B32     32    8   12           16           4.0           ql[8]: ql[j] = q[j]&3 | (q[j+8]&3)<<2
 *                                                                        | (q[j+16]&3)<<4 | (q[j+24]&3)<<6
 *                                                                qh[4]: bit i of the u32 = q[i] >> 2
 *   Q2_B32     32    4    8           12           3.0           qs[j] = q[j] | q[j+8]<<2 | q[j+16]<<4 | q[j+24]<<6
 *
 * Rows: a weight matrix [N][K] is stored row by row; each row is ceil(K/B) whole blocks, so a
 * row length that is not a multiple of B (stories260K's 172) is padded: the last block's min
 * and delta come from its real elements only, and its padding levels are 0. Kernels treat the
 * activations past K as zero, so padding never contributes. Row bytes = ceil(K/B) * block bytes.
 *
 * The codes continue libcore's dtype codes (they are stored in shard files; never renumber).
 */
#ifndef IFK_QUANT_H
#define IFK_QUANT_H

#include <stddef.h>
#include <stdint.h>

enum {
    IFK_Q8_B32 = 16, IFK_Q8_B64 = 17, IFK_Q6_B64 = 18, IFK_Q5_B64 = 19, IFK_Q4_B32 = 20,
    IFK_Q4_B64 = 21, IFK_Q3H_B64 = 22, IFK_Q3_B32 = 23, IFK_Q2_B32 = 24,
    IFK_QTYPE_END_ = 25
};

typedef struct {
    const char *name;        /* "q8_b32", "q3h", ... as iflow-quant spells them        */
    int         block;       /* B                                                       */
    int         levels;      /* L                                                       */
    int         block_bytes; /* bytes of one block, the two FP16 numbers included        */
    double      bits;        /* nominal bits per weight: 8, 6, 5, 4, 3.5, 3, 2            */
} ifk_qtype_info;

/* NULL if type is not a quantized type. */
const ifk_qtype_info *ifk_qtype(int type);
/* Bytes of one row of K weights of a quantized type (whole blocks). */
size_t ifk_qrow_bytes(int type, int K);

/* Reference quantization and dequantization of one row of K weights (scalar, exact to the
 * formulas above); these define the types, and every fast path is tested against them. */
void ifk_quantize_row(void *dst, int type, const float *src, int K);
void ifk_dequantize_row(float *dst, int type, const void *src, int K);

/* Error-minimizing quantization of one row (quant_search.c), in the same layout: each block's
 * FP16 step and minimum and its levels are searched to minimize sum_i imp[i] (w_i - w'_i)^2
 * (imp: [K] non-negative importances of the row's columns, or NULL for all 1). Per block this
 * error is never above that of ifk_quantize_row (the paper's rule). Deterministic: a pure
 * function of its arguments. */
void ifk_quantize_row_search(void *dst, int type, const float *src, const float *imp, int K);

/* The scalar oracle of the quantized matrix product (quant_ref.c): every row is dequantized
 * and dotted with x in double,
 *     y[t][n] = sum_k dequant(W[n])[k] * x[t][k]      for 0 <= t < T, 0 <= n < N
 * W: [N][ifk_qrow_bytes(type, K)] bytes; x: [T][K] F32 at stride ldx; y: [T][N] at stride ldy.
 * An unknown type gives zeros. */
void ifk_qmatmul_ref(float *y, size_t ldy, const void *W, int type, const float *x, size_t ldx,
                     int T, int N, int K);

/* The fast quantized matrix product (qdispatch.c), same arguments and result as
 * ifk_qmatmul_ref up to the rounding of x to integers. The SIMD paths compute each block as
 *     min * sum(x) + delta * (sum_i q_i * xq_i * s + c * sum_i (x_i - xq_i * s))
 * with sum(x) exact in F32 and x rounded once per call, xq = round(x / s) with s = max|x| / top
 * of its group: int8 (top = 127) per group of 32 elements for Q4 and below, and for Q8 on the
 * AVX512_VNNI paths after each token's 8 largest |x_i| (4 for rows of 64) are taken out of the
 * rounding and multiplied in F32 (qimpl.h's split; x_i is then 0 in the bound below); int16
 * (top = 32767) per block for Q6 and Q5, and for Q8 on the AVX2 path and in the mode
 * IFK_QX_INT16, where plain int8 x would add much to the weights' own error (qimpl.h; int8 for
 * Q6 and Q5 too in the opt-in mode IFK_QX_INT8, ifk_set_qx_mode below).
 * c = (L - 1) / 2 for int8 x (the rounding residual's share at the middle level, corrected:
 * qimpl.h), 0 for int16. So per output
 *     |y - y_ref| <= sum_i |q_i - c| delta_b(i) * amax_b(i) / (2 top) * (1 + 1e-3)
 *                    + 1e-5 * sum_i (|min_b(i)| + (q_i + c) delta_b(i)) |x_i|
 * where amax_b is max |x| over element i's weight block. Measured on normal data with
 * K >= 1024: at most ~1e-3 of sum_i |w'_i x_i| for int8 x (~1e-2 with outliers in x and W),
 * ~1e-5 for int16 x. Scalar path (IFK_ISA_SCALAR, -DIFK_NO_SIMD): the oracle itself.
 * Threads split N; n_threads <= 0 means all cores. Batch invariant (kernels.h): row t of y is
 * bit-identical to a call with x[t] alone, whatever T, t and n_threads (x is rounded per
 * token, and decode and prefill sum in the same order). */
void ifk_qmatmul(float *y, size_t ldy, const void *W, int type, const float *x, size_t ldx,
                 int T, int N, int K, int n_threads);

/* The F32-activation path. While on, ifk_qmatmul (and ifk_matmul with quantized or packed
 * weights) does not round x: each block of 16 rows is decoded to F32 (as ifk_qget_row) and
 * multiplied by the path's F32 product, so the result is the oracle's up to float summation
 * order (and batch invariant, as the F32 product is). It is the reference the int8 path is
 * measured against (iflow-ppl --activations f32) and the fallback where a model's activations
 * make int8 lose accuracy; it reads each weight once per call like the int8 path but runs at
 * the FMA roof, not the int8 one. Off by default. On the scalar path the oracle runs either
 * way. The same switch turns off the BF16 dot product of F16 and BF16 weights (kernels.h's
 * ifk_bf16_dot), whose x is rounded to BF16: while on, ifk_matmul multiplies them with FMA in
 * F32, the reference for them too. Process-wide, like ifk_set_isa(): set it before computing.
 * Returns the previous state. */
int ifk_set_qx_f32(int on);
int ifk_qx_f32(void);

/* How quantized products meet the activations, process-wide (a superset of ifk_set_qx_f32):
 *   IFK_QX_DEFAULT  x rounded to int8 (Q8 with the split on the AVX512_VNNI paths), or to int16
 *                   for Q6 and Q5 (the accuracy rule above)
 *   IFK_QX_F32      the F32-activation path (ifk_set_qx_f32(1))
 *   IFK_QX_INT8     x rounded to int8 for every quantized type: Q6 and Q5 too, on the
 *                   AVX512_VNNI paths (vpdpbusd, as Q4; qimpl.h's ifk_qx_int16). Faster in
 *                   prefill (vpdpbusd does twice vpdpwssd's work), at int8 x's accuracy: the
 *                   bound above with top = 127 and c = (L - 1) / 2 for those types too. The AVX2
 *                   path keeps int16 x for them (its maddubs would saturate on 8-bit levels).
 *   IFK_QX_INT16    int16 x for Q8, Q6 and Q5 (Q8 without the split): the default before Q8
 *                   took int8 x, ~3 times more accurate for Q8 (KL divergence over F32 x), its
 *                   prefill about 0.7 times as fast.
 * ifk_set_qx_mode returns the previous mode (an unknown mode is taken as IFK_QX_DEFAULT). */
enum { IFK_QX_DEFAULT = 0, IFK_QX_F32 = 1, IFK_QX_INT8 = 2, IFK_QX_INT16 = 3 };
int ifk_set_qx_mode(int mode);
int ifk_qx_mode(void);

/* out[k] = dequant(W[row])[k] for 0 <= k < K, bit-identical to ifk_dequantize_row. */
void ifk_qget_row(float *out, const void *W, int type, size_t row, int K);

#endif
