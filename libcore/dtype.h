/*
 * dtype.h -- element types of tensors, and conversions between the float types.
 *
 * Contract
 *   The numeric codes are stored in shard files (man/iflow-shard.5) and must never change;
 *   new types take new codes. The float codes equal the kernels' IFK_* weight codes
 *   (kernels/cpu/kernels.h), checked at compile time in dtype.c.
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
    IFLOW_DT_COUNT_
} iflow_dtype;

/* "f32", "f16", "bf16", "u8", "i32"; NULL for an unknown code. */
const char *iflow_dtype_name(int dt);
/* Parse a name (case-insensitive; "float32"/"float16"/"bfloat16" accepted). -1 if unknown. */
int iflow_dtype_from_name(const char *name);
/* Bytes taken by n elements of dt; 0 for an unknown type. Returns SIZE_MAX on overflow. */
size_t iflow_dtype_nbytes(int dt, uint64_t n);
/* Bytes of a tensor of this type and shape (outermost dimension first); rows are the last
 * dimension. 0 for an unknown type or an empty shape, SIZE_MAX on overflow. */
size_t iflow_tensor_nbytes(int dt, int n_dims, const int64_t *shape);
/* 1 for F32/F16/BF16. */
int iflow_dtype_is_float(int dt);

float    iflow_f16_to_f32(uint16_t h);
uint16_t iflow_f32_to_f16(float f);
float    iflow_bf16_to_f32(uint16_t b);
uint16_t iflow_f32_to_bf16(float f);

/* Convert n elements between float types (src and dst must not overlap unless equal types). */
int iflow_dtype_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n);

#endif
