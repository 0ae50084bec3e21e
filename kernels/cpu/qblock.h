/*
 * qblock.h -- one block of a quantized type (quant.h's layouts), for the quantizers: the
 * reference's pieces (quant_ref.c) that the error-minimizing search (quant_search.c) reuses.
 * Internal to kernels/cpu.
 */
#ifndef IFK_QBLOCK_H
#define IFK_QBLOCK_H

#include <stdint.h>

#define IFK_QMAX_BLOCK 64   /* the largest block of any type */

/* Round-to-nearest-even float -> IEEE half; finite values past the range saturate to +-65504. */
uint16_t ifk_f32_to_f16_sat(float f);

/* The paper's rule (quant.h): n (1..B) weights w: [n] -> blk: [block_bytes]; levels past n are 0. */
void ifk_qblock_minmax(uint8_t *blk, int type, const float *w, int n);

/* Store a block from its FP16 step d16 and minimum m16 and its levels q: [B] (each 0..L-1). */
void ifk_qblock_store(uint8_t *blk, int type, uint16_t d16, uint16_t m16, const uint8_t *q);

/* blk -> its first n (1..B) decoded weights w: [n], w = f16(min) + q * f16(delta) in float. */
void ifk_qblock_decode(float *w, int type, const uint8_t *blk, int n);

#endif
