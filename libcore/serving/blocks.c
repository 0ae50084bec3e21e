/* blocks.c -- a batch's KV blocks and the prefix cache's names. See blocks.h. */
#include "libcore/serving/blocks.h"
#include "libcore/base/error.h"

#include <stdlib.h>
#include <xxhash.h>

struct iflow_blocks {
    int n;
    int32_t *stack;             /* [n] free blocks; n_free of them, the next taken on top     */
    int n_free, n_idle, reserved;
    int32_t *refs;              /* [n] holders of each block                                   */
    uint8_t *named, *ready;     /* [n]                                                          */
    iflow_block_name *name;     /* [n] a named block's name                                    */
    int32_t *prev, *next;       /* [n] the idle blocks, released longest ago first (-1: none)  */
    int32_t oldest, newest;
    int32_t *slot;              /* [mask + 1] named blocks by name (linear probing), -1 empty  */
    uint32_t mask;
};

int iflow_blocks_open(iflow_blocks **out, int n_blocks)
{
    *out = NULL;
    if (n_blocks <= 0)
        return iflow_seterr(IFLOW_EINVAL, "a KV cache of %d blocks", n_blocks);
    uint32_t slots = 16;
    while (slots < 2u * (uint32_t)n_blocks)
        slots *= 2;
    iflow_blocks *p = calloc(1, sizeof *p);
    if (p) {
        p->stack = malloc((size_t)n_blocks * sizeof *p->stack);
        p->refs = calloc((size_t)n_blocks, sizeof *p->refs);
        p->named = calloc((size_t)n_blocks, 1);
        p->ready = calloc((size_t)n_blocks, 1);
        p->name = calloc((size_t)n_blocks, sizeof *p->name);
        p->prev = malloc((size_t)n_blocks * sizeof *p->prev);
        p->next = malloc((size_t)n_blocks * sizeof *p->next);
        p->slot = malloc((size_t)slots * sizeof *p->slot);
    }
    if (!p || !p->stack || !p->refs || !p->named || !p->ready || !p->name || !p->prev || !p->next || !p->slot) {
        iflow_blocks_close(p);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    p->n = p->n_free = n_blocks;
    for (int i = 0; i < n_blocks; i++) /* block 0 on top: the first request gets 0, 1, ... */
        p->stack[i] = n_blocks - 1 - i;
    for (uint32_t i = 0; i < slots; i++)
        p->slot[i] = -1;
    p->mask = slots - 1;
    p->oldest = p->newest = -1;
    *out = p;
    return 0;
}

void iflow_blocks_close(iflow_blocks *p)
{
    if (!p)
        return;
    free(p->stack);
    free(p->refs);
    free(p->named);
    free(p->ready);
    free(p->name);
    free(p->prev);
    free(p->next);
    free(p->slot);
    free(p);
}

void iflow_blocks_names(const int32_t *tokens, int n_full, int block, uint64_t salt, iflow_block_name *out)
{
    iflow_block_name parent = {salt, 0};
    for (int i = 0; i < n_full; i++) {
        XXH128_hash_t h = XXH3_128bits_withSeed(tokens + (size_t)i * block, (size_t)block * sizeof *tokens, parent.lo);
        uint64_t both[4] = {h.low64, h.high64, parent.lo, parent.hi};
        h = XXH3_128bits(both, sizeof both);
        parent = out[i] = (iflow_block_name){h.low64, h.high64};
    }
}

/* ---- named blocks by name: open addressing, linear probing ----------------------------------- */

static int same(const iflow_block_name *a, const iflow_block_name *b) { return a->lo == b->lo && a->hi == b->hi; }

/* The block named nm, or -1. */
static int32_t find(const iflow_blocks *p, const iflow_block_name *nm)
{
    for (uint32_t i = (uint32_t)nm->lo & p->mask; p->slot[i] >= 0; i = (i + 1) & p->mask)
        if (same(&p->name[p->slot[i]], nm))
            return p->slot[i];
    return -1;
}

static void insert(iflow_blocks *p, int32_t id)
{
    uint32_t i = (uint32_t)p->name[id].lo & p->mask;
    while (p->slot[i] >= 0)
        i = (i + 1) & p->mask;
    p->slot[i] = id;
}

/* Take id out of the table; the entries after it in its probe run move back into the gap
 * (so that no lookup stops early at it). */
static void erase(iflow_blocks *p, int32_t id)
{
    uint32_t i = (uint32_t)p->name[id].lo & p->mask;
    while (p->slot[i] != id)
        i = (i + 1) & p->mask;
    for (uint32_t j = (i + 1) & p->mask; p->slot[j] >= 0; j = (j + 1) & p->mask) {
        uint32_t home = (uint32_t)p->name[p->slot[j]].lo & p->mask;
        /* the entry at j may fill the gap at i unless its home lies cyclically in (i, j] */
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            p->slot[i] = p->slot[j];
            i = j;
        }
    }
    p->slot[i] = -1;
}

/* ---- the idle list ------------------------------------------------------------------------- */

static void idle_append(iflow_blocks *p, int32_t id)
{
    p->prev[id] = p->newest;
    p->next[id] = -1;
    if (p->newest >= 0)
        p->next[p->newest] = id;
    else
        p->oldest = id;
    p->newest = id;
    p->n_idle++;
}

static void idle_unlink(iflow_blocks *p, int32_t id)
{
    if (p->prev[id] >= 0)
        p->next[p->prev[id]] = p->next[id];
    else
        p->oldest = p->next[id];
    if (p->next[id] >= 0)
        p->prev[p->next[id]] = p->prev[id];
    else
        p->newest = p->prev[id];
    p->n_idle--;
}

/* ---- requests' blocks ------------------------------------------------------------------------ */

int iflow_blocks_match(const iflow_blocks *p, const iflow_block_name *names, int n, int *pins)
{
    int m = 0, idle = 0;
    for (int32_t id; m < n && (id = find(p, &names[m])) >= 0; m++)
        idle += p->refs[id] == 0;
    if (pins)
        *pins = idle;
    return m;
}

void iflow_blocks_share(iflow_blocks *p, const iflow_block_name *names, int m, int32_t *table)
{
    for (int i = 0; i < m; i++) {
        int32_t id = find(p, &names[i]);
        if (p->refs[id]++ == 0)
            idle_unlink(p, id);
        table[i] = id;
    }
}

int iflow_blocks_room(const iflow_blocks *p) { return p->n_free + p->n_idle - p->reserved; }
void iflow_blocks_reserve(iflow_blocks *p, int n) { p->reserved += n; }
int iflow_blocks_n_free(const iflow_blocks *p) { return p->n_free; }
int iflow_blocks_n_idle(const iflow_blocks *p) { return p->n_idle; }

int32_t iflow_blocks_take(iflow_blocks *p)
{
    int32_t id;
    if (p->n_free > 0) {
        id = p->stack[--p->n_free];
    } else { /* the reservation guarantees an idle one */
        id = p->oldest;
        idle_unlink(p, id);
        erase(p, id);
        p->named[id] = 0;
    }
    p->reserved--;
    p->refs[id] = 1;
    p->ready[id] = 0;
    return id;
}

int iflow_blocks_name(iflow_blocks *p, int32_t id, const iflow_block_name *name)
{
    if (find(p, name) >= 0)
        return 0;
    p->name[id] = *name;
    p->named[id] = 1;
    p->ready[id] = 0;
    insert(p, id);
    return 1;
}

void iflow_blocks_set_ready(iflow_blocks *p, int32_t id) { p->ready[id] = 1; }
int iflow_blocks_ready(const iflow_blocks *p, int32_t id) { return p->ready[id]; }

void iflow_blocks_release(iflow_blocks *p, const int32_t *table, int n, int unused)
{
    p->reserved -= unused;
    for (int i = n - 1; i >= 0; i--) {
        int32_t id = table[i];
        if (--p->refs[id] > 0)
            continue;
        if (p->named[id] && p->ready[id]) {
            idle_append(p, id);
        } else { /* a name never written goes with its block */
            if (p->named[id])
                erase(p, id);
            p->named[id] = 0;
            p->stack[p->n_free++] = id;
        }
    }
}
