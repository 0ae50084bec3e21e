/*
 * safetensors.h -- a checked reader of one .safetensors file.
 *
 * Byte layout (https://github.com/huggingface/safetensors)
 *   u64 LE  N                          header length
 *   N bytes JSON object                {"name": {"dtype": "F32", "shape": [512, 64],
 *                                                "data_offsets": [begin, end]}, ...,
 *                                       "__metadata__": {"format": "pt", ...}}   (optional)
 *   data                               offsets are relative to byte 8 + N
 *
 * Contract
 *   iflow_st_open() maps the file read-only (mmap, MAP_PRIVATE) and validates the whole header
 *   before returning: N fits the file and is at most IFLOW_ST_MAX_HEADER; the header is valid
 *   JSON with unique keys; every entry has a known dtype, a shape of 0..8 non-negative dims and
 *   data_offsets [begin, end) with begin <= end, where shape product * element size equals
 *   end - begin (no overflow) and [begin, end) lies inside the data region; no two tensors
 *   overlap. Gaps between tensors are allowed. Nothing in the data is read or checksummed.
 *   Any failure returns a negative IFLOW_E* code, leaves *out NULL, and sets one message naming
 *   the file and the place (tensor, byte offset).
 *
 *   dtypes: F32, F16 and BF16 map to IFLOW_DT_*; the other safetensors dtypes (F64, I8..I64,
 *   U8..U64, BOOL, F8_E4M3, F8_E5M2, F8_E8M0, F6_E2M3, F6_E3M2, F4, C64) are checked for size
 *   and recorded with dtype -1 and their dtype_name, so a caller can name what it cannot use.
 *   A dtype name outside that list is a format error (its size is unknown).
 *
 *   The handle owns the mapping, the parsed header and the tensor table; every pointer it
 *   hands out (tensors, names, data, metadata) lives until iflow_st_close(). Tensors are listed
 *   in data-offset order. iflow_st_release() gives a tensor's pages back to the kernel
 *   (madvise MADV_DONTNEED on the page-aligned range covering it); the data stays readable and
 *   is read from the file again if touched, so a converter that releases each tensor after use
 *   keeps its resident set near one tensor whatever the file size.
 *
 *   iflow_st_open_mem() reads a caller-owned buffer instead (borrowed: it must outlive the
 *   handle; nothing is copied); `name` stands in for the file name in messages, and release
 *   does nothing.
 */
#ifndef IFLOW_SAFETENSORS_H
#define IFLOW_SAFETENSORS_H

#include <jansson.h>
#include <stddef.h>

#include "srctensor.h"

#define IFLOW_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* bytes */

typedef struct iflow_st iflow_st;

int  iflow_st_open(iflow_st **out, const char *path);
int  iflow_st_open_mem(iflow_st **out, const void *buf, size_t n, const char *name);
void iflow_st_close(iflow_st *st);  /* NULL is fine */

/* The path (or name) the handle was opened with. */
const char *iflow_st_path(const iflow_st *st);

/* Number of tensors, and the i-th in data-offset order (NULL if i is out of range). */
size_t iflow_st_n_tensors(const iflow_st *st);
const iflow_src_tensor *iflow_st_tensor(const iflow_st *st, size_t i);

/* The tensor called `name`, or NULL (binary search; no message is set). */
const iflow_src_tensor *iflow_st_find(const iflow_st *st, const char *name);

/* The "__metadata__" object, or NULL if the file has none. Borrowed. */
const json_t *iflow_st_metadata(const iflow_st *st);

/* Drop t's pages from the resident set (t must come from st). Never fails. */
void iflow_st_release(iflow_st *st, const iflow_src_tensor *t);

/* Size of one element of a safetensors dtype in bits (4 for F4), or 0 if the name is unknown. */
int iflow_st_dtype_bits(const char *dtype_name);

#endif
