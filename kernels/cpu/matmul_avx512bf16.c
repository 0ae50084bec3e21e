/*
 * matmul_avx512bf16.c -- matmul_avx512.c compiled again with AVX512_BF16 for F16 and BF16
 * weights: the same traversal (decode streams, prefill blocks), each step a vdpbf16ps of 32
 * elements against x rounded to BF16, named ifk_avx512bf16_* (impl.h). dispatch.c calls it
 * only on CPUs that have AVX512_BF16, and only while the exact F32 path is off
 * (ifk_set_qx_f32). Decode and prefill share the summation order, as in the FMA product, so
 * the same batch invariance holds (kernels.h).
 */
#define MM_BF16 1
#include "kernels/cpu/matmul_avx512.c"
