/*
 * bench/membw-avx2.h -- lets ../shared/tools/membw.c build on a CPU without AVX-512 (make bench).
 *
 * membw.c is written with the _mm512_* intrinsics of doubles. On a CPU without AVX-512F its
 * `-march=native` build fails, and with it `make bench`. The Makefile then builds it again with
 * `-include bench/membw-avx2.h`: each 512-bit vector becomes a pair of AVX 256-bit ones, so the
 * program makes the same loads, in the same order, of the same bytes (two 32-byte loads where it
 * made one 64-byte load; the two non-temporal stores likewise). Only the intrinsics membw.c uses
 * are here.
 */
#ifndef IFLOW_MEMBW_AVX2_H
#define IFLOW_MEMBW_AVX2_H

#include <immintrin.h> /* first: membw.c's own #include of it is then a no-op */

typedef struct {
    __m256d lo, hi;
} membw_m512d;

static inline membw_m512d membw_setzero_pd(void) { return (membw_m512d){_mm256_setzero_pd(), _mm256_setzero_pd()}; }
static inline membw_m512d membw_set1_pd(double s) { return (membw_m512d){_mm256_set1_pd(s), _mm256_set1_pd(s)}; }
static inline membw_m512d membw_load_pd(const double *p)
{
    return (membw_m512d){_mm256_load_pd(p), _mm256_load_pd(p + 4)};
}
static inline membw_m512d membw_add_pd(membw_m512d a, membw_m512d b)
{
    return (membw_m512d){_mm256_add_pd(a.lo, b.lo), _mm256_add_pd(a.hi, b.hi)};
}
static inline membw_m512d membw_fmadd_pd(membw_m512d a, membw_m512d b, membw_m512d c)
{
    return (membw_m512d){_mm256_fmadd_pd(a.lo, b.lo, c.lo), _mm256_fmadd_pd(a.hi, b.hi, c.hi)};
}
static inline void membw_stream_pd(double *p, membw_m512d a)
{
    _mm256_stream_pd(p, a.lo);
    _mm256_stream_pd(p + 4, a.hi);
}
static inline double membw_reduce_add_pd(membw_m512d a)
{
    double v[4];
    _mm256_storeu_pd(v, _mm256_add_pd(a.lo, a.hi));
    return (v[0] + v[1]) + (v[2] + v[3]);
}

#define __m512d membw_m512d
#define _mm512_setzero_pd membw_setzero_pd
#define _mm512_set1_pd membw_set1_pd
#define _mm512_load_pd membw_load_pd
#define _mm512_add_pd membw_add_pd
#define _mm512_fmadd_pd membw_fmadd_pd
#define _mm512_stream_pd membw_stream_pd
#define _mm512_reduce_add_pd membw_reduce_add_pd

#endif
