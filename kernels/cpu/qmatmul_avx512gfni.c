/*
 * qmatmul_avx512gfni.c -- qmatmul_avx512.c compiled again for CPUs that also have GFNI (Ice
 * Lake, Zen 4 and later): the same kernels, named ifk_avx512gfni_*, except that Q3H's code
 * bits are unpacked with a GF(2) bit transpose (vgf2p8affineqb). qdispatch.c picks it for
 * IFK_ISA_AVX512GFNI. Same summation order, so the same batch invariance (kernels.h).
 */
#define QK_GFNI 1
#include "kernels/cpu/qmatmul_avx512.c"
