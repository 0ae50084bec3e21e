/*
 * ref.c -- scalar reference of every kernel.
 *
 * Written to be obviously correct, not fast: the SIMD paths are tested against these, and the
 * -DIFK_NO_SIMD build (and CPUs without AVX2) run them for real. Dot products accumulate in
 * double, so the reference is at least as accurate as any float summation order; elementwise
 * results use the C library's expf / sqrt. Every output is computed on its own, so batch
 * invariance (kernels.h) holds trivially.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/kernels.h"

float ifk_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {                 /* inf or NaN (NaNs made quiet, as F16C does) */
        bits = sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0);
    } else if (exp != 0) {             /* normal: rebias 15 -> 127 */
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else {                           /* zero or subnormal: man * 2^-24 is exact in float */
        float f = (float)man * 0x1p-24f;
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

float ifk_bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* sum_k W[row][k] * x[k] in double. W: [*][K] of wtype; x: [K]. An unknown wtype reads as 0. */
static double dot_row(const void *W, int wtype, size_t row, int K, const float *x)
{
    double s = 0.0;
    if (wtype == IFK_F32) {
        const float *w = (const float *)W + row * (size_t)K;
        for (int k = 0; k < K; k++)
            s += (double)w[k] * x[k];
    } else if (wtype == IFK_F16) {
        const uint16_t *w = (const uint16_t *)W + row * (size_t)K;
        for (int k = 0; k < K; k++)
            s += (double)ifk_f16_to_f32(w[k]) * x[k];
    } else if (wtype == IFK_BF16) {
        const uint16_t *w = (const uint16_t *)W + row * (size_t)K;
        for (int k = 0; k < K; k++)
            s += (double)ifk_bf16_to_f32(w[k]) * x[k];
    }
    return s;
}

/* W: [N][K]; x: [T][K] at stride ldx; y: [T][N] at stride ldy; rows n0 <= n < n1. */
IFK_DECL_MATMUL_ROWS(ifk_ref_matmul_rows)
{
    for (int n = n0; n < n1; n++)
        for (int t = 0; t < T; t++)
            y[(size_t)t * ldy + n] = (float)dot_row(W, wtype, (size_t)n, K, x + (size_t)t * ldx);
}

/* out: [K]; W: [*][K] of wtype. */
void ifk_ref_get_row(float *out, const void *W, int wtype, size_t row, int K)
{
    for (int k = 0; k < K; k++) {
        size_t i = row * (size_t)K + (size_t)k;
        if (wtype == IFK_F32)
            out[k] = ((const float *)W)[i];
        else if (wtype == IFK_F16)
            out[k] = ifk_f16_to_f32(((const uint16_t *)W)[i]);
        else if (wtype == IFK_BF16)
            out[k] = ifk_bf16_to_f32(((const uint16_t *)W)[i]);
        else
            out[k] = 0.0f;
    }
}

/* y, x, w: [n]. */
void ifk_ref_rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
    if (n <= 0)
        return;
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = 0; i < n; i++)
        y[i] = x[i] * inv * w[i];
}

/* x: [n_heads][head_dim], in place. Angles in double: cos/sin are then correctly rounded
 * floats of the exact angle, which is what a float64 reference computes. */
void ifk_ref_rope(float *x, int n_heads, int head_dim, int rot_dim, int pos, float theta,
                  const float *freq_scale, int layout)
{
    if (rot_dim > head_dim)
        rot_dim = head_dim;
    int half = rot_dim / 2;
    for (int i = 0; i < half; i++) {
        double angle = (double)pos * pow((double)theta, -2.0 * i / rot_dim);
        if (freq_scale)
            angle *= freq_scale[i];
        float c = (float)cos(angle), s = (float)sin(angle);
        int a = layout == IFK_ROPE_INTERLEAVED ? 2 * i : i;
        int b = layout == IFK_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
        for (int h = 0; h < n_heads; h++) {
            float *xh = x + (size_t)h * head_dim;
            float x0 = xh[a], x1 = xh[b];
            xh[a] = x0 * c - x1 * s;
            xh[b] = x0 * s + x1 * c;
        }
    }
}

/* x: [n], in place. */
void ifk_ref_softmax(float *x, int n)
{
    if (n <= 0)
        return;
    float m = x[0];
    for (int i = 1; i < n; i++)
        m = x[i] > m ? x[i] : m;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

/* g, u: [n]. */
void ifk_ref_silu_mul(float *g, const float *u, int n)
{
    for (int i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* y, x: [n]. */
void ifk_ref_add(float *y, const float *x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += x[i];
}

/* y [T][N] at ldy (+)= t [T][r] at ldt times b [N][r] (F16, in tiles bt: kernels.h): impl.h. */
void ifk_ref_lowrank_up(float *y, size_t ldy, const uint16_t *bt, const float *t, size_t ldt, int T, int N, int r,
                        int add)
{
    for (int i = 0; i < T; i++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f, *yn = &y[(size_t)i * ldy + n];
            for (int q = 0; q < r; q++) {
                const float b = ifk_f16_to_f32(bt[ifk_lr_at((size_t)n, (size_t)q, (size_t)N, (size_t)r)]);
                acc = fmaf(t[(size_t)i * ldt + q], b, acc);
            }
            *yn = add ? *yn + acc : acc;
        }
}

/* scale * (q . k_row); q, k_row: [head_dim]. */
static float score(const float *q, const float *k_row, int head_dim, float scale)
{
    double s = 0.0;
    for (int d = 0; d < head_dim; d++)
        s += (double)q[d] * k_row[d];
    return (float)s * scale;
}

/* One query. q: [head_dim]; k, v: n_keys rows of [head_dim] at stride kv_ld; out: [head_dim].
 * Two passes over the keys (max, then exp-weighted sum), so no score buffer is needed. */
static void attend_one(float *out, const float *q, const float *k, const float *v, size_t kv_ld,
                       int n_keys, int head_dim, float scale)
{
    for (int d = 0; d < head_dim; d++)
        out[d] = 0.0f;
    if (n_keys <= 0)
        return;
    float m = -INFINITY;
    for (int j = 0; j < n_keys; j++) {
        float s = score(q, k + (size_t)j * kv_ld, head_dim, scale);
        m = s > m ? s : m;
    }
    double sum = 0.0;
    for (int j = 0; j < n_keys; j++) {
        float e = expf(score(q, k + (size_t)j * kv_ld, head_dim, scale) - m);
        const float *vj = v + (size_t)j * kv_ld;
        sum += e;
        for (int d = 0; d < head_dim; d++)
            out[d] += e * vj[d];
    }
    float inv = (float)(1.0 / sum);
    for (int d = 0; d < head_dim; d++)
        out[d] *= inv;
}

/* See IFK_DECL_ATTEND in impl.h: each query of the block on its own. */
IFK_DECL_ATTEND(ifk_ref_attend)
{
    for (int i = 0; i < nt; i++)
        for (int h = 0; h < nh; h++) {
            size_t off = (size_t)i * ld + (size_t)h * head_dim;
            attend_one(out + off, q + off, k, v, kv_ld, pos + i + 1, head_dim, scale);
        }
}
