/*
 * gguf.h -- a safe reader for GGUF files (versions 2 and 3), the format of llama.cpp.
 *
 * Byte layout (all integers little-endian; "str" = u64 byte length + that many bytes, no NUL)
 *
 *     u32 magic "GGUF"   u32 version (2|3)   u64 n_tensors   u64 n_kv
 *     n_kv x      { str key; u32 type; value }
 *                 value: u8 i8 u16 i16 u32 i32 f32 bool(u8) str u64 i64 f64 by type, or
 *                        array = { u32 elem_type; u64 count; count x value } (no nested arrays)
 *     n_tensors x { str name; u32 n_dims (1..4); u64 ne[n_dims]; u32 ggml_type; u64 offset }
 *     padding to `general.alignment` (u32 key, default 32)
 *     tensor data: each tensor at data_offset + offset
 *
 * Contract
 *   Parsing checks every size against the buffer before using it (string lengths, array
 *   counts x element sizes, n_kv, n_tensors, tensor extents, integer overflow) and fails with
 *   IFLOW_ETRUNC (the file ends before what it declares) or IFLOW_EFORMAT (a malformed field),
 *   IFLOW_EUNSUPPORTED (GGUF v1, big-endian files, unknown ggml tensor types) and a message
 *   naming the file and the byte offset, e.g.
 *       "truncated gguf string at byte 1234 in 'x.gguf' (length 99999, 12 bytes left)".
 *   A file with 0 tensors may have its aligned data offset past EOF (llama.cpp vocab files do).
 *
 *   iflow_gguf_open_mem() borrows the buffer: it must outlive the handle. iflow_gguf_open()
 *   maps the file read-only and keeps the mapping until iflow_gguf_close(). Everything the
 *   getters return (keys, strings, arrays, tensor records) is owned by the handle and valid
 *   until iflow_gguf_close(); numeric arrays are returned as aligned copies, string arrays as
 *   (pointer, length) pairs pointing into the buffer (not NUL-terminated). The handle is
 *   read-only after opening, so lookups from several threads are safe.
 *   The library never prints and never exits.
 */
#ifndef IFLOW_GGUF_H
#define IFLOW_GGUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct iflow_gguf iflow_gguf;

/* Value types, as stored in the file. */
enum {
    IFLOW_GGUF_U8 = 0,
    IFLOW_GGUF_I8 = 1,
    IFLOW_GGUF_U16 = 2,
    IFLOW_GGUF_I16 = 3,
    IFLOW_GGUF_U32 = 4,
    IFLOW_GGUF_I32 = 5,
    IFLOW_GGUF_F32 = 6,
    IFLOW_GGUF_BOOL = 7,
    IFLOW_GGUF_STR = 8,
    IFLOW_GGUF_ARR = 9,
    IFLOW_GGUF_U64 = 10,
    IFLOW_GGUF_I64 = 11,
    IFLOW_GGUF_F64 = 12,
    IFLOW_GGUF_TYPE_COUNT_
};

/* A string inside the buffer: `len` bytes at `ptr`, not NUL-terminated. */
typedef struct {
    const char *ptr;
    uint64_t len;
} iflow_gguf_str;

/* One entry of the tensor table. */
typedef struct {
    const char *name;  /* NUL-terminated copy */
    uint32_t type;     /* ggml type code (0 = F32, 1 = F16, 8 = Q8_0, 30 = BF16, ...) */
    uint32_t n_dims;   /* 1..4 */
    uint64_t ne[4];    /* ne[0] is the fastest-varying dimension (ggml order); unused dims = 1 */
    uint64_t offset;   /* from the start of the data section */
    uint64_t nbytes;   /* size of the data */
} iflow_gguf_tensor;

/* Parse a GGUF file held in memory. `name` is used in messages only (copied). */
int iflow_gguf_open_mem(iflow_gguf **out, const void *buf, size_t len, const char *name);
/* Parse a buffer that the handle takes over: munmap(map, len) at close (also on failure). */
int iflow_gguf_open_mapped(iflow_gguf **out, void *map, size_t len, const char *name);

/* mmap and parse a file. */
int iflow_gguf_open(iflow_gguf **out, const char *path);
/* Release the handle (and the mapping, for iflow_gguf_open). NULL is a no-op. */
void iflow_gguf_close(iflow_gguf *g);

uint32_t iflow_gguf_version(const iflow_gguf *g);
const char *iflow_gguf_name(const iflow_gguf *g);
/* The buffer the file was parsed from (borrowed or mapped) and its size. */
const void *iflow_gguf_data(const iflow_gguf *g, size_t *len);

/* ---- key-value metadata ---- */

int64_t iflow_gguf_n_kv(const iflow_gguf *g);
/* Index of a key, or -1 when absent. */
int64_t iflow_gguf_find_key(const iflow_gguf *g, const char *key);
/* Key, type, and (for arrays) element type and count of entry i (0 <= i < n_kv). */
const char *iflow_gguf_key(const iflow_gguf *g, int64_t i);
int iflow_gguf_kv_type(const iflow_gguf *g, int64_t i);
int iflow_gguf_arr_type(const iflow_gguf *g, int64_t i); /* -1 if not an array */
uint64_t iflow_gguf_arr_count(const iflow_gguf *g, int64_t i);
/* Name of a value type ("u32", "str", "arr", ...); "?" if unknown. */
const char *iflow_gguf_type_name(int type);

/*
 * Typed getters by key. Each returns 0, IFLOW_ENOTFOUND when the key is absent, IFLOW_EFORMAT
 * when it has another type, IFLOW_ERANGE when an integer does not fit; the message names the
 * key and the file. Integer getters accept any integer type whose value fits; get_f32 accepts
 * f32 and f64; get_bool accepts bool only.
 */
int iflow_gguf_get_str(const iflow_gguf *g, const char *key, const char **s, size_t *len); /* NUL-terminated copy */
#define IFLOW_GGUF_CHAT_TEMPLATE "tokenizer.chat_template" /* the key of a model's chat template (a string) */
int iflow_gguf_get_u32(const iflow_gguf *g, const char *key, uint32_t *v);
int iflow_gguf_get_i32(const iflow_gguf *g, const char *key, int32_t *v);
int iflow_gguf_get_u64(const iflow_gguf *g, const char *key, uint64_t *v);
int iflow_gguf_get_f32(const iflow_gguf *g, const char *key, float *v);
int iflow_gguf_get_bool(const iflow_gguf *g, const char *key, int *v);
/* Arrays: element type must match exactly (str / i32 / f32). *n = number of elements. */
int iflow_gguf_get_arr_str(const iflow_gguf *g, const char *key, const iflow_gguf_str **items, size_t *n);
int iflow_gguf_get_arr_i32(const iflow_gguf *g, const char *key, const int32_t **v, size_t *n);
int iflow_gguf_get_arr_f32(const iflow_gguf *g, const char *key, const float **v, size_t *n);
/* Any numeric array: its element type, an aligned copy of its elements, and their count. */
int iflow_gguf_get_arr(const iflow_gguf *g, const char *key, int *elem_type, const void **data, size_t *n);

/* ---- tensors ---- */

int64_t iflow_gguf_n_tensors(const iflow_gguf *g);
/* Entry i of the tensor table, NULL if out of range. */
const iflow_gguf_tensor *iflow_gguf_tensor_at(const iflow_gguf *g, int64_t i);
/* Index of a tensor by name, or -1. */
int64_t iflow_gguf_find_tensor(const iflow_gguf *g, const char *name);
/* Absolute byte offset of the data section (may be past EOF when there are no tensors). */
uint64_t iflow_gguf_data_offset(const iflow_gguf *g);
/* The key-value entries exactly as stored (from byte 24, after the header, to the tensor
 * table): n_kv entries that a new file with the same n_kv and 0 tensors can carry verbatim. */
const void *iflow_gguf_kv_bytes(const iflow_gguf *g, size_t *len);
/* Pointer to tensor i's data inside the buffer (its extent was checked at open), or NULL. */
const void *iflow_gguf_tensor_data(const iflow_gguf *g, int64_t i);

/* Name of a ggml type ("f32", "q4_0", ...), NULL if unknown. Bytes for n elements: 0 if unknown
 * type or n is not a multiple of the block size, UINT64_MAX on overflow. */
const char *iflow_ggml_type_name(uint32_t type);
uint64_t iflow_ggml_nbytes(uint32_t type, uint64_t n);

#endif
