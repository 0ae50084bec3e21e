/*
 * dtype.h -- element types of tensors, and conversions between the float types.
 *
 * Contract
 *   The numeric codes are stored in shard files (man/iflow-shard.5) and must never change;
 *   new types take new codes. The float codes equal the kernels' IFK_* weight codes
 *   (kernels/cpu/kernels.h), and the block-quantized codes 16..24 equal kernels/cpu/quant.h's
 *   IFK_Q* codes (that header owns their byte layouts); both are checked at compile time.
 *   Quantized types have no size per element: a tensor of one is rows of whole blocks, so its
 *   size comes from iflow_tensor_nbytes() (rows x ifk_qrow_bytes(type, last dimension)).
 *   Conversions are pure functions over caller-owned buffers; nothing here allocates.
 *   F32 -> F16 and F32 -> BF16 round to nearest even, as torch and numpy do.
 */
#ifndef IFLOW_DTYPE_H
#define IFLOW_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    IFLOW_DT_F32  = 0,
    IFLOW_DT_F16  = 1,
    IFLOW_DT_BF16 = 2,
    IFLOW_DT_U8   = 3,   /* raw bytes: metadata and tokenizer blobs */
    IFLOW_DT_I32  = 4,
    IFLOW_DT_COUNT_,          /* end of the element types */
    /* block-quantized weights (the Inferflow paper's types; layouts in kernels/cpu/quant.h) */
    IFLOW_DT_Q8_B32  = 16,    /* "q8_b32" 8-bit, blocks of 32: 9.0 bits/weight  */
    IFLOW_DT_Q8_B64  = 17,    /* "q8_b64" 8-bit, blocks of 64: 8.5              */
    IFLOW_DT_Q6_B64  = 18,    /* "q6"     6-bit, blocks of 64: 6.5              */
    IFLOW_DT_Q5_B64  = 19,    /* "q5"     5-bit, blocks of 64: 5.5              */
    IFLOW_DT_Q4_B32  = 20,    /* "q4_b32" 4-bit, blocks of 32: 5.0              */
    IFLOW_DT_Q4_B64  = 21,    /* "q4_b64" 4-bit, blocks of 64: 4.5              */
    IFLOW_DT_Q3H_B64 = 22,    /* "q3h"    3.5-bit (11 levels), blocks of 64: 4.0 */
    IFLOW_DT_Q3_B32  = 23,    /* "q3_b32" 3-bit, blocks of 32: 4.0              */
    IFLOW_DT_Q2_B32  = 24,    /* "q2"     2-bit, blocks of 32: 3.0              */
    IFLOW_DT_QEND_            /* end of the quantized types */
} iflow_dtype;

#define IFLOW_DT_QFIRST IFLOW_DT_Q8_B32

/* "f32", "f16", "bf16", "u8", "i32", "q8_b32", ..., "q2"; NULL for an unknown code. */
const char *iflow_dtype_name(int dt);
/* Parse a name, case-insensitive: the names above and the aliases "float32", "float16",
 * "bfloat16", "fp32", "fp16"; "q8" (= q8_b32); the block-suffixed spellings of the types that
 * have one block size, "q6_b64", "q5_b64", "q3h_b64", "q2_b32". -1 if unknown or ambiguous. */
int iflow_dtype_from_name(const char *name);
/* For a name that could mean several types ("q4", "q3"), the choices as a phrase
 * ("q4_b32 or q4_b64"); NULL for any other name. */
const char *iflow_dtype_ambiguity(const char *name);
/* Bytes taken by n elements of dt; 0 for an unknown or quantized type. SIZE_MAX on overflow. */
size_t iflow_dtype_nbytes(int dt, uint64_t n);
/* Bytes of a tensor of this type and shape (outermost dimension first); rows are the last
 * dimension, and a quantized tensor's rows are whole blocks (padded, see quant.h). 0 for an
 * unknown type or an empty shape, SIZE_MAX on overflow. */
size_t iflow_tensor_nbytes(int dt, int n_dims, const int64_t *shape);
/* 1 for F32/F16/BF16. */
int iflow_dtype_is_float(int dt);
/* 1 for the block-quantized types (codes 16..24). */
int iflow_dtype_is_quant(int dt);

float    iflow_f16_to_f32(uint16_t h);
uint16_t iflow_f32_to_f16(float f);
float    iflow_bf16_to_f32(uint16_t b);
uint16_t iflow_f32_to_bf16(float f);

/* Convert n elements between float types (src and dst must not overlap unless equal types). */
int iflow_dtype_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n);

#endif
