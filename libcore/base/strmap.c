/* strmap.c -- see strmap.h. */
#include "strmap.h"
#include "error.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static size_t cap_for(size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n && cap < ((size_t)1 << 62))
        cap *= 2;
    return cap;
}

static size_t str_slot(const iflow_strmap_slot *slots, size_t cap, const char *key, size_t len)
{
    size_t i = (size_t)XXH3_64bits(key, len) & (cap - 1);
    while (slots[i].key && !(slots[i].len == len && memcmp(slots[i].key, key, len) == 0))
        i = (i + 1) & (cap - 1);
    return i;
}

static int str_rehash(iflow_strmap *m, size_t cap)
{
    iflow_strmap_slot *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory for a hash table of %zu slots", cap);
    for (size_t i = 0; i < m->cap; i++) {
        const iflow_strmap_slot *s = &m->slots[i];
        if (s->key)
            slots[str_slot(slots, cap, s->key, s->len)] = *s;
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

int iflow_strmap_reserve(iflow_strmap *m, size_t n)
{
    size_t cap = cap_for(n);
    return cap > m->cap ? str_rehash(m, cap) : 0;
}

int iflow_strmap_put(iflow_strmap *m, const char *key, size_t len, int32_t val)
{
    if (len > UINT32_MAX)
        return iflow_seterr(IFLOW_EINVAL, "hash key of %zu bytes is too long", len);
    if (2 * (m->n + 1) > m->cap) {
        int rc = str_rehash(m, cap_for(m->n + 1));
        if (rc < 0)
            return rc;
    }
    size_t i = str_slot(m->slots, m->cap, key ? key : "", len);
    int existed = m->slots[i].key != NULL;
    m->slots[i] = (iflow_strmap_slot){key ? key : "", (uint32_t)len, val};
    m->n += !existed;
    return existed;
}

int32_t iflow_strmap_get(const iflow_strmap *m, const char *key, size_t len)
{
    if (!m->cap)
        return -1;
    size_t i = str_slot(m->slots, m->cap, key ? key : "", len);
    return m->slots[i].key ? m->slots[i].val : -1;
}

void iflow_strmap_free(iflow_strmap *m)
{
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static size_t u64_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return (size_t)k;
}

static size_t u64_slot(const iflow_u64map_slot *slots, size_t cap, uint64_t key)
{
    size_t i = u64_hash(key) & (cap - 1);
    while (slots[i].key != UINT64_MAX && slots[i].key != key)
        i = (i + 1) & (cap - 1);
    return i;
}

static int u64_rehash(iflow_u64map *m, size_t cap)
{
    iflow_u64map_slot *slots = malloc(cap * sizeof *slots);
    if (!slots)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory for a hash table of %zu slots", cap);
    for (size_t i = 0; i < cap; i++)
        slots[i].key = UINT64_MAX;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key != UINT64_MAX)
            slots[u64_slot(slots, cap, m->slots[i].key)] = m->slots[i];
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

int iflow_u64map_reserve(iflow_u64map *m, size_t n)
{
    size_t cap = cap_for(n);
    return cap > m->cap ? u64_rehash(m, cap) : 0;
}

int iflow_u64map_put(iflow_u64map *m, uint64_t key, int32_t a, int32_t b)
{
    if (key == UINT64_MAX)
        return iflow_seterr(IFLOW_EINVAL, "reserved hash key");
    if (2 * (m->n + 1) > m->cap) {
        int rc = u64_rehash(m, cap_for(m->n + 1));
        if (rc < 0)
            return rc;
    }
    size_t i = u64_slot(m->slots, m->cap, key);
    int existed = m->slots[i].key == key;
    m->slots[i] = (iflow_u64map_slot){key, a, b};
    m->n += !existed;
    return existed;
}

int iflow_u64map_get(const iflow_u64map *m, uint64_t key, int32_t *a, int32_t *b)
{
    if (!m->cap || key == UINT64_MAX)
        return 0;
    const iflow_u64map_slot *s = &m->slots[u64_slot(m->slots, m->cap, key)];
    if (s->key != key)
        return 0;
    *a = s->a;
    *b = s->b;
    return 1;
}

void iflow_u64map_free(iflow_u64map *m)
{
    free(m->slots);
    memset(m, 0, sizeof *m);
}
