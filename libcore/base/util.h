/*
 * util.h -- small helpers shared inside libiflow: little-endian loads and stores, JSON's
 * whitespace, whole-file reads. Nothing here is part of the public API.
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

/* JSON's whitespace: space, tab, newline, carriage return. */
static inline int iflow_is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
/* The first position from i on in s [n] that is not whitespace (n if none). */
static inline size_t iflow_skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && iflow_is_ws(s[i]))
        i++;
    return i;
}
/* The span s [*from, *to) with the whitespace at both its ends left out. */
static inline void iflow_trim_ws(const char *s, size_t *from, size_t *to)
{
    *from = iflow_skip_ws(s, *from, *to);
    while (*to > *from && iflow_is_ws(s[*to - 1]))
        (*to)--;
}

/* Read a whole file (at most max_bytes) into a NUL-terminated malloc'd buffer.
 * Returns 0 or <0 with the error set ("cannot open 'path': ..."). */
int iflow_read_file(const char *path, size_t max_bytes, char **data, size_t *len);

#endif
