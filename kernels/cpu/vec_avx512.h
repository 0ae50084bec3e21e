/*
 * vec_avx512.h -- small AVX-512 helpers shared by the *_avx512.c files (include only there:
 * they are compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c).
 */
#ifndef IFK_VEC_AVX512_H
#define IFK_VEC_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#include "kernels/cpu/kernels.h"

#define IFK_INLINE static inline __attribute__((always_inline))

/* Lanes 0..n-1 set (0 <= n <= 16). */
IFK_INLINE __mmask16 v16_mask(int n)
{
    return (__mmask16)((1u << n) - 1u);
}

/* 16 weights of type wt starting at element i of W, as F32. */
IFK_INLINE __m512 v16_load_w(const void *W, int wt, size_t i)
{
    if (wt == IFK_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)W + i)));
    if (wt == IFK_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)W + i))), 16));
    return _mm512_loadu_ps((const float *)W + i);
}

/* The same for the lanes of m only (others 0; nothing outside them is read). */
IFK_INLINE __m512 v16_load_w_mask(const void *W, int wt, size_t i, __mmask16 m)
{
    if (wt == IFK_F16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)W + i));
    if (wt == IFK_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)W + i)), 16));
    return _mm512_maskz_loadu_ps(m, (const float *)W + i);
}

/* (sum a, sum b, sum c, sum d) */
IFK_INLINE __m128 v16_hsum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    __m256 ab = _mm256_hadd_ps(a8, b8);   /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    __m256 cd = _mm256_hadd_ps(c8, d8);
    __m256 abcd = _mm256_hadd_ps(ab, cd); /* a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7 */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* e^x per lane, within ~1 ulp of expf: Cody-Waite reduction x = n ln2 + r (|r| <= ln2/2),
 * a degree-6 polynomial for e^r, and scalef for 2^n (which gives subnormals and inf). */
IFK_INLINE __m512 v16_exp(__m512 x)
{
    x = _mm512_min_ps(_mm512_set1_ps(88.8f), x);   /* NaN passes through: min(c, NaN) = NaN */
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

#endif
