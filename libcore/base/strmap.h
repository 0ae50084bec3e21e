/*
 * strmap.h -- open-addressing hash maps for the readers and the tokenizer.
 *
 * Contract
 *   iflow_strmap maps byte strings (any bytes, not NUL-terminated, given as pointer + length) to
 *   int32 values. It does NOT copy keys: a key's bytes must stay valid and unchanged for as long
 *   as the map is used (the tokenizer keeps token texts in one arena, the GGUF reader keeps its
 *   own copies). Putting an existing key replaces its value.
 *   iflow_u64map maps 64-bit keys (any value except UINT64_MAX) to a pair of int32.
 *   Both start zeroed ({0}), grow as needed (load factor <= 1/2), hash with XXH3, and are freed
 *   with their *_free(). Lookups on a map nobody is writing to are safe from any thread.
 *   Functions that allocate return 0 or IFLOW_ENOMEM (with the message set).
 */
#ifndef IFLOW_STRMAP_H
#define IFLOW_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *key; /* NULL: empty slot */
    uint32_t len;
    int32_t val;
} iflow_strmap_slot;

typedef struct {
    iflow_strmap_slot *slots;
    size_t cap; /* a power of two, or 0 */
    size_t n;
} iflow_strmap;

/* Make room for n keys in total without growing again. */
int iflow_strmap_reserve(iflow_strmap *m, size_t n);
/* Insert or replace. Returns 0 (new key), 1 (value replaced) or IFLOW_ENOMEM. */
int iflow_strmap_put(iflow_strmap *m, const char *key, size_t len, int32_t val);
/* Value for key, or -1 when absent. */
int32_t iflow_strmap_get(const iflow_strmap *m, const char *key, size_t len);
void iflow_strmap_free(iflow_strmap *m);

typedef struct {
    uint64_t key; /* UINT64_MAX: empty slot */
    int32_t a, b;
} iflow_u64map_slot;

typedef struct {
    iflow_u64map_slot *slots;
    size_t cap;
    size_t n;
} iflow_u64map;

int iflow_u64map_reserve(iflow_u64map *m, size_t n);
/* Insert or replace. Returns 0 (new key), 1 (replaced) or IFLOW_ENOMEM. */
int iflow_u64map_put(iflow_u64map *m, uint64_t key, int32_t a, int32_t b);
/* 1 and the pair when present, 0 when absent. */
int iflow_u64map_get(const iflow_u64map *m, uint64_t key, int32_t *a, int32_t *b);
void iflow_u64map_free(iflow_u64map *m);

#endif
