/*
 * qimpl.h -- what qdispatch.c needs from each instruction-set path of the quantized matrix
 * product (internal to kernels/cpu; the types and layouts are quant.h's).
 *
 * The SIMD paths compute  dot(w'_block, x_block) = min * sum(x_block) + delta * sum(q_i x_i)
 * with x rounded to int8 once per call (ifk_qx below): sum(q_i xq_i) is then an integer dot
 * product of unsigned levels and signed activations. qdispatch.c quantizes x (with the path's
 * ifk_X_qx_quantize) into a per-thread scratch buffer and splits the rows between threads;
 * a path never sees n_threads. The scalar path is the oracle, ifk_qmatmul_ref_rows.
 */
#ifndef IFK_QIMPL_H
#define IFK_QIMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/quant.h"

/* x of T tokens, rounded to integers in the layout of one weight type.
 *
 * Each weight block of B elements of x has its exact F32 sum (for the min term) and integer
 * values round(x / s), one scale s per group (s = 0 and values 0 for an all-zero group):
 *   int8 (most types): s = max|x| / 127 per group of 32 elements;
 *     B = 32: the group is the block.
 *     B = 64: group g in {0, 1} holds the elements i with (i / 4) % 2 == g, i.e. the
 *             alternating runs of 4 that are the even / odd int32 lanes of a u8 x s8 dot
 *             product over the block (vpdpbusd, maddubs + madd), so a lane needs one scale.
 *   int16 (ifk_qx_x16: Q8, Q6 and Q5, where int8 x would add much to the weights' own error):
 *     s = max|x| / 32767 per block; products are s16 x s16 (vpdpwssd, madd).
 *     On the VNNI paths Q8 rounds x to int8 by default (after the split below), and Q6 and Q5
 *     do in the opt-in mode IFK_QX_INT8 (quant.h), with the groups above (ifk_qx_int16 says
 *     which applies now; the mode IFK_QX_INT16 keeps Q8 on int16 x): their levels are
 *     unsigned bytes (Q8: 0..255), so vpdpbusd takes them as Q4's, at twice vpdpwssd's rate.
 *     For the packed Q8, Q6 and Q5 kernels qdispatch.c then swaps bytes 1 and 2 of every dword
 *     of xq after quantizing (the "int16 pair order" of their tiles, qpack.h).
 * Elements past K are 0 (as are their sums and scales), so the weights' padding levels
 * never contribute.
 *
 * The rounding residual (int8 x only). With r_i = x_i - s xq_i, the block's exact delta term is
 * delta (s sum_i q_i xq_i + sum_i q_i r_i), and the kernels drop the second sum. Most of it is
 * c sum_i r_i with c = (L - 1) / 2, the middle level, since the levels sit around it; that part
 * is known per token and block without the weights:
 *     cor = c * (sum - s0 X0 - s1 X1)      (X0, X1: the sums of xq over groups 0 and 1)
 * and the kernels add delta * cor to each block, leaving the error delta sum_i (q_i - c) r_i.
 * On Gaussian weights this cuts the int8 rounding error's RMS by about 2.3; on stories260K and
 * xs-ckpt in Q4 the int8 path's extra KL divergence over the F32-activation path fell from
 * ~0.01 to ~0.001 nats (docs/QUANTIZATION.md). int16 x needs no correction (cor = 0). For Q8
 * on int8 x, c = 127.5: the same formula, whose share of the error it removes is the same (the
 * levels of a min/max block spread around the middle one for any L).
 *
 * Outliers ("the split", int8 x of Q8 and Q4 on the AVX512_VNNI paths: ifk_qx_splits below,
 * qdispatch.c's qx_split_on). The activations of real models have a few channels far larger
 * than the rest, and one of them sets the int8 step of its whole group. So those of each
 * token's k largest |x_i| (k = ifk_qx_split_k(K), ties to the lower i) that stand out,
 * |x_i| >= IFK_QX_SPLIT_RATIO * L with L the least of the 16 maxima of |x_i| over i % 16 = 0 ..
 * 15 (the 16 "lanes"), are taken out before x is rounded: the groups' scales, sums and
 * corrections are those of x with them set to 0, and the product adds x_i * w'_i for each of
 * them in F32 against the weights' decoded values (qsplit_avx512.c). L is about the largest
 * element of a typical group of 32 (1.6-2.6 sigma for normal rows of 576-5632), and is not
 * moved by up to 15 outliers; elements under 2 L set a group's step no more than twice that
 * of its neighbours, and taking them out gained nothing measurable (2026-11-28, below), while
 * rows of normal values, which have none, then cost nothing. Which ones a token takes out
 * depends on that token alone, and the additions run in ascending i, so the product stays
 * batch invariant. On SmolLM2-135M (Q8_B64,
 * WikiText-2, 64 chunks of 256) the split takes int8 x's perplexity from +0.35 % to +0.08 % of
 * F32 x (KL divergence 0.0047 -> 0.0017; the weights' own error is 0.0010), and within 0.2 %
 * on every model and protocol measured (docs/QUANTIZATION.md, "Q8: the outliers taken out").
 * It was opt-in while Q8 decode on int8 x read the memory ~10 % slower than on int16 x; with the
 * weights in huge pages (bigmem.h) both read alike, and prefill on int8 x is ~1.35 times as fast,
 * so it is Q8's default (docs/QUANTIZATION.md). The rule "stand out by 2 L" (2026-11-28; before,
 * every token took its k largest): KL divergence to the F32 model within 0-4 % of taking the k
 * largest on SmolLM2-135M, xs-ckpt and stories260K in Q8_B64 and Q8_B32, and Q8_B64 prefill of
 * the TinyLlama shape's random activations 134 -> 152-154 tok/s at 1 thread (docs/QUANTIZATION.md). */
typedef struct {
    int type;     /* the weight type (IFK_Q*) */
    int B;        /* its block */
    int nb;       /* weight blocks per row: ceil(K / B) */
    int K;
    int T;
    int x16;      /* ifk_qx_int16(type) when laid out: q holds int16 values */
    size_t q_ld;  /* bytes from one token to the next in q: nb * B (* 2 if x16) rounded up to 64 */
    size_t s_ld;  /* floats from one token to the next in s0, s1, sum: nb rounded up to 16 */
    int8_t *q;    /* [T][q_ld]   the int8 (or int16) values, 0 past K; 64-byte aligned */
    float *s0;    /* [T][s_ld]   scale of group 0 of each block, 0 past nb */
    float *s1;    /* [T][s_ld]   scale of group 1 of each block (int8, B = 64), else 0 */
    float *sum;   /* [T][s_ld]   sum of the block's x, 0 past nb */
    float *cor;   /* [T][s_ld]   the residual's correction above (0 for int16 x and past nb) */
    float *blk;   /* [T][s_ld][4] the same per block: { s0, sum, s1, cor } (s1 = 0 for B = 32) */
    /* the split (k > 0; above): */
    int k;        /* outliers a token takes out */
    int nu;       /* channels in su (known once every token is quantized) */
    float *sval;  /* [T][k] a token's outliers x_i, by i ascending */
    int32_t *spos;/* [T][k] their i while quantizing, then their places in su */
    int32_t *su;  /* [nu] the i that any token took out, ascending */
    /* the product's reading (packed tiles, qpack_avx512.c and qpack_avx2.c): */
    int ahead;    /* bytes of software prefetch ahead of a group's first pass; 0: none */
    int streams;  /* packed decode (T = 1): groups read side by side, 1 .. 4 (qpack_avx512.c, qpack_avx2.c) */
} ifk_qx;

/* The types whose int8 products take outliers out (the split above) where it runs: Q8, which
 * thereby meets int8 x instead of int16, and Q4 (docs/QUANTIZATION.md). */
static inline int ifk_qx_splits(int type)
{
    return type == IFK_Q8_B32 || type == IFK_Q8_B64 || type == IFK_Q4_B32 || type == IFK_Q4_B64;
}

/* The split's rule: an outlier is at least this many times L (above). */
#define IFK_QX_SPLIT_RATIO 2.0f

/* Outliers a token takes out of K activations: 8, fewer for K < 128 (none for K < 16). */
static inline int ifk_qx_split_k(int K)
{
    return K >= 128 ? 8 : K / 16;
}

/* qdispatch.c: cor and blk of token t (every entry of s_ld) from its s0, s1, sum and, for int8
 * x, cor[b] = s0 X0 + s1 X1 of its blocks b < nb (the path's quantize sums its rounded values
 * in registers); each path's quantize calls it last. */
void ifk_qx_finish(const ifk_qx *qx, int t);

/* Whether x is rounded to int16 for this weight type: Q8, Q6 and Q5 (the rule). Measured on
 * stories260K and xs-ckpt (WikiText-2, KL divergence to the F32 model, weights of the default
 * search method; docs/QUANTIZATION.md): int8 x adds ~0.009 nats to every type, which is 10x the
 * error of Q8 itself, 1.6x that of Q6, 15-20 % of Q5's (0.054 -> 0.064) and 2-5 % of Q4's and
 * below; int16 x adds nothing measurable (perplexity within 0.01 % of F32 x). Those figures
 * predate the residual's correction; with it, plain int8 x (the mode IFK_QX_INT8, which
 * ifk_qx_int16 follows; Q8 also takes its outliers out there) adds 0.001-0.005 nats to Q8, Q6 and Q5 on those models and SmolLM2-135M,
 * 1.5-19 times Q8's own error (docs/QUANTIZATION.md). */
static inline int ifk_qx_x16(int type)
{
    return type == IFK_Q8_B32 || type == IFK_Q8_B64 || type == IFK_Q6_B64 || type == IFK_Q5_B64;
}

/* Whether a product of `type` rounds x to int16 now: ifk_qx_x16(type), except on the
 * AVX512_VNNI paths for Q8 (unless the mode is IFK_QX_INT16) and in the mode IFK_QX_INT8
 * (qdispatch.c; quant.h's ifk_set_qx_mode). */
int ifk_qx_int16(int type);

/* Outliers a product of `type` with K inputs takes out of each token now (qimpl.h's split:
 * ifk_qx_split_k(K) for Q8 wherever it meets int8 x), else 0. */
int ifk_qx_split(int type, int K);

/* Packed decode over S streams (qx->streams; qpack_avx512.c, qpack_avx2.c): the G groups of 16
 * rows from n0 (a multiple of 16) to n1 are read in h = ceil(G / S) rounds (stream_rounds), round
 * i taking groups i, i + h, i + 2 h, ... side by side (stream_round: their first rows in
 * n[0 .. k - 1], k (1 .. S) returned, *nr the rows of the last of them, <= 16). */
static inline int ifk_qpack_stream_rounds(int n0, int n1, int S)
{
    return ((n1 - n0 + 15) / 16 + S - 1) / S;
}

static inline int ifk_qpack_stream_round(int i, int n0, int n1, int S, int *n, int *nr)
{
    const int G = (n1 - n0 + 15) / 16, h = ifk_qpack_stream_rounds(n0, n1, S);
    int k = 0;
    for (; k < S && i + k * h < G; k++)
        n[k] = n0 + 16 * (i + k * h);
    *nr = n1 - n[k - 1] < 16 ? n1 - n[k - 1] : 16;
    return k;
}

/* Little-endian words at p, any alignment (the level bytes of blocks and tiles). */
static inline uint32_t ifk_rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t ifk_rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* B and the bytes of a block of `type` (quant.h's table, as ifk_qtype has them) as expressions
 * that fold to constants where type is one: the SIMD paths specialize their code per type. */
static inline int ifk_qtype_block(int type)
{
    return type == IFK_Q8_B32 || type == IFK_Q4_B32 || type == IFK_Q3_B32 || type == IFK_Q2_B32 ? 32 : 64;
}

static inline int ifk_qtype_block_bytes(int type)
{
    switch (type) {
    case IFK_Q8_B32: return 36;
    case IFK_Q8_B64: return 68;
    case IFK_Q6_B64: return 52;
    case IFK_Q5_B64: return 44;
    case IFK_Q4_B32: return 20;
    case IFK_Q4_B64: return 36;
    case IFK_Q3H_B64: return 32;
    case IFK_Q3_B32: return 16;
    default: return 12; /* IFK_Q2_B32 */
    }
}

/* Tokens t0 <= t < t1 of x: [T][K] at stride ldx into qx (whose fields are set). */
#define IFK_DECL_QX_QUANTIZE(name) \
    void name(const ifk_qx *qx, const float *x, size_t ldx, int t0, int t1)

/* Rows n0 <= n < n1 of y[t][n] = sum_k dequant(W[n])[k] * x[t][k] for all qx->T tokens.
 * W: [N][qx->nb * block_bytes]; y: [T][N] at stride ldy. */
#define IFK_DECL_QMATMUL_ROWS(name) \
    void name(float *y, size_t ldy, const void *W, const ifk_qx *qx, int n0, int n1)

/* out: [K] = dequant(row)[0..K), bit-identical to ifk_dequantize_row. */
#define IFK_DECL_QGET_ROW(name) void name(float *out, const void *row, int type, int K)

IFK_DECL_QX_QUANTIZE(ifk_avx2_qx_quantize);
IFK_DECL_QMATMUL_ROWS(ifk_avx2_qmatmul_rows);
IFK_DECL_QGET_ROW(ifk_avx2_qget_row);
IFK_DECL_QX_QUANTIZE(ifk_avx512_qx_quantize);
IFK_DECL_QMATMUL_ROWS(ifk_avx512_qmatmul_rows);
IFK_DECL_QGET_ROW(ifk_avx512_qget_row);
IFK_DECL_QMATMUL_ROWS(ifk_avx512gfni_qmatmul_rows); /* x quantized by ifk_avx512_qx_quantize */
IFK_DECL_QGET_ROW(ifk_avx512gfni_qget_row);
/* qsplit_avx512.c (the split above, on the AVX512_VNNI paths):
 *   pick: x: [K] -> xm: [K], x with the token's k outliers set to 0; idx, val: [k] their i
 *         (ascending) and x_i.
 *   rows: y[t][n] += x_i * w'[n][i] for rows n0 <= n < n1 and each outlier of each token t, in
 *         ascending i (qx->nu, su, spos set); W packed (qpack.h; n0 a multiple of 16) or not. */
void ifk_avx512_qsplit_pick(const float *x, int K, int k, float *xm, int32_t *idx, float *val);
void ifk_avx512_qsplit_rows(float *y, size_t ldy, const void *W, int packed, const ifk_qx *qx, int n0, int n1);

/* qpack_avx512.c: rows n0 <= n < n1 (n0 a multiple of 16) of a packed matrix (qpack.h) whose
 * base type is qx->type; x quantized by ifk_avx512_qx_quantize. The avx512 one reads Q4 and Q8
 * (AVX512_VNNI), the avx512gfni one every type (AVX512_VNNI, AVX512_VBMI and GFNI). */
IFK_DECL_QMATMUL_ROWS(ifk_avx512_qmatmul_packed_rows);
IFK_DECL_QMATMUL_ROWS(ifk_avx512gfni_qmatmul_packed_rows);
/* qpack_avx2.c: the same for Q4 (int8 x) and Q8 (int16 x) on the AVX2 path; x quantized by
 * ifk_avx2_qx_quantize. */
IFK_DECL_QMATMUL_ROWS(ifk_avx2_qmatmul_packed_rows);

/* qdispatch.c: 1 when the current path multiplies packed matrices of base type `type` with a
 * kernel of their own (ifk_qpack_type packs only those). */
int ifk_qpath_packed(int type);

/* quant_ref.c: the oracle on rows n0 <= n < n1 (arguments as ifk_qmatmul_ref). */
void ifk_qmatmul_ref_rows(float *y, size_t ldy, const void *W, int type, const float *x, size_t ldx,
                          int T, int n0, int n1, int K);

#endif
