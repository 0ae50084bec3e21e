/*
 * vec_avx2.h -- small AVX2 helpers shared by the *_avx2.c files (include only there: they are
 * compiled with -mavx2 -mfma -mf16c).
 */
#ifndef IFK_VEC_AVX2_H
#define IFK_VEC_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

#define IFK_INLINE static inline __attribute__((always_inline))

/* Lanes 0..n-1 set (0 <= n <= 8), as a maskload / maskstore mask. */
IFK_INLINE __m256i v8_mask(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 weights of type wt starting at element i of W, as F32. */
IFK_INLINE __m256 v8_load_w(const void *W, int wt, size_t i)
{
    if (wt == IFK_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)W + i)));
    if (wt == IFK_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)W + i))), 16));
    return _mm256_loadu_ps((const float *)W + i);
}

/* The first n (< 8) of them, the other lanes 0; nothing past them is read. */
IFK_INLINE __m256 v8_load_w_part(const void *W, int wt, size_t i, int n)
{
    if (wt == IFK_F32)
        return _mm256_maskload_ps((const float *)W + i, v8_mask(n));
    uint16_t tmp[8] = {0};
    memcpy(tmp, (const uint16_t *)W + i, (size_t)n * sizeof *tmp);
    return v8_load_w(tmp, wt, 0);
}

IFK_INLINE __m256 v8_load_part(const float *p, int n)
{
    return _mm256_maskload_ps(p, v8_mask(n));
}

IFK_INLINE void v8_store_part(float *p, int n, __m256 v)
{
    _mm256_maskstore_ps(p, v8_mask(n), v);
}

IFK_INLINE float v8_hsum(__m256 a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

IFK_INLINE double v4d_hsum(__m256d a)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

IFK_INLINE float v8_hmax(__m256 a)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* (sum a, sum b, sum c, sum d) */
IFK_INLINE __m128 v8_hsum4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 ab = _mm256_hadd_ps(a, b);
    __m256 cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd); /* a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7 */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* e^x per lane, within ~1 ulp of expf: Cody-Waite reduction x = n ln2 + r (|r| <= ln2/2), a
 * degree-6 polynomial for e^r, and 2^n applied as 2^(n/2) * 2^(n - n/2) so that results in
 * the subnormal range and overflow to inf come out right. */
IFK_INLINE __m256 v8_exp(__m256 x)
{
    x = _mm256_min_ps(_mm256_set1_ps(88.8f), x);   /* NaN passes through: min(c, NaN) = NaN */
    x = _mm256_max_ps(_mm256_set1_ps(-104.0f), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n);            /* -150 <= n <= 129 */
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

#endif
