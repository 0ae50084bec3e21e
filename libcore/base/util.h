/*
 * util.h -- small helpers shared inside libiflow: little-endian loads and stores, whole-file
 * reads. Nothing here is part of the public API.
 */
#ifndef IFLOW_UTIL_H
#define IFLOW_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t rd_u32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t rd_u64(const void *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void wr_u32(void *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void wr_u64(void *p, uint64_t v) { memcpy(p, &v, 8); }

/* Read a whole file (at most max_bytes) into a NUL-terminated malloc'd buffer.
 * Returns 0 or <0 with the error set ("cannot open 'path': ..."). */
int iflow_read_file(const char *path, size_t max_bytes, char **data, size_t *len);

#endif
