/*
 * qpack_avx512gfni.c -- qpack_avx512.c compiled again for CPUs that also have GFNI and
 * AVX512_VBMI (Ice Lake, Zen 4 and later): the product over packed tiles of every packed type
 * (qpack.h), named ifk_avx512gfni_qmatmul_packed_rows; qdispatch.c picks it on the
 * IFK_ISA_AVX512GFNI path. Q4 and Q8 run the same code as in qpack_avx512.c.
 */
#define QP_GFNI 1
#include "kernels/cpu/qpack_avx512.c"
