/*
 * test_blocks.c -- the KV block pool and its names (libcore/serving/blocks.h), against a plain
 * model of the same rules kept here: arrays scanned in full, an idle list in release order.
 *
 * Random requests take shared and fresh blocks, name them, mark them written and let them go,
 * over a pool of 40 blocks, for 20000 operations. The names are made so that they crowd into 4
 * home slots of the pool's table (its lookups run through long probe chains, and erasing a
 * name moves the chain behind it back): after every operation each of the 64 names must be
 * found exactly where the model has it, and the counts (free, idle, room) must agree.
 * Also: iflow_blocks_names() is a chain (a block's name depends on every block before it and
 * on the salt).
 */
#include "tests/unit/check.h"
#include "libcore/serving/blocks.h"

#include <stdlib.h>
#include <string.h>

#define NB 40     /* blocks        */
#define NN 64     /* names         */
#define NR 8      /* requests held */

static iflow_block_name name_of(int k) { return (iflow_block_name){(uint64_t)(k % 4) + 1024u * (uint64_t)k, (uint64_t)k + 1}; }

/* the model */
static int owner[NN];              /* name k -> its block, or -1 */
static int bname[NB], refs[NB], ready[NB], is_free[NB];
static int idle[NB], n_idle;       /* released longest ago first */
static int reserved;

typedef struct {
    int32_t table[12];
    int n, unused;
    int names[6], n_names, first_own; /* names[first_own ..] were named by this request (or not: bname) */
} held;

static void idle_remove(int id)
{
    for (int i = 0; i < n_idle; i++)
        if (idle[i] == id) {
            memmove(idle + i, idle + i + 1, (size_t)(n_idle - i - 1) * sizeof *idle);
            n_idle--;
            return;
        }
}

static int n_free_model(void)
{
    int n = 0;
    for (int i = 0; i < NB; i++)
        n += is_free[i];
    return n;
}

static void agree(iflow_blocks *p, int step)
{
    for (int k = 0; k < NN; k++) {
        iflow_block_name nm = name_of(k);
        int pins = -1, m = iflow_blocks_match(p, &nm, 1, &pins);
        if (m != (owner[k] >= 0) || (m && pins != (refs[owner[k]] == 0))) {
            CHECK(0, "step %d: name %d found %d (idle %d), the model: block %d", step, k, m, pins, owner[k]);
            return;
        }
    }
    CHECK(iflow_blocks_n_free(p) == n_free_model() && iflow_blocks_n_idle(p) == n_idle &&
              iflow_blocks_room(p) == n_free_model() + n_idle - reserved,
          "step %d: free %d idle %d room %d, the model %d %d %d", step, iflow_blocks_n_free(p), iflow_blocks_n_idle(p),
          iflow_blocks_room(p), n_free_model(), n_idle, n_free_model() + n_idle - reserved);
}

/* A block taken: the model checks it is a free one, or the oldest idle one when none is free. */
static int32_t take(iflow_blocks *p)
{
    int32_t id = iflow_blocks_take(p);
    if (n_free_model() > 0) {
        CHECK(id >= 0 && id < NB && is_free[id], "took block %d, not a free one", id);
    } else {
        CHECK(n_idle > 0 && id == idle[0], "took block %d, the oldest idle is %d", id, n_idle ? idle[0] : -1);
        idle_remove(id);
        owner[bname[id]] = -1;
        bname[id] = -1;
    }
    is_free[id] = 0;
    refs[id] = 1;
    ready[id] = 0;
    reserved--;
    return id;
}

static void admit(iflow_blocks *p, held *h)
{
    memset(h, 0, sizeof *h);
    h->n_names = 1 + (int)(rnd_u32() % 6);
    for (int i = 0; i < h->n_names; i++) { /* distinct names, from a few chains that often repeat */
        int k, dup;
        do {
            k = (int)(rnd_u32() % 3) * 20 + i * 3 + (int)(rnd_u32() % 3);
            dup = 0;
            for (int j = 0; j < i; j++)
                dup |= h->names[j] == k;
        } while (dup);
        h->names[i] = k;
    }
    int extra = (int)(rnd_u32() % 4), m = 0, pins = 0;
    while (m < h->n_names && owner[h->names[m]] >= 0)
        pins += refs[owner[h->names[m++]]] == 0;
    iflow_block_name nm[6];
    for (int i = 0; i < h->n_names; i++)
        nm[i] = name_of(h->names[i]);
    int got_pins = -1, got = iflow_blocks_match(p, nm, h->n_names, &got_pins);
    CHECK(got == m && got_pins == pins, "match %d (%d idle), the model %d (%d)", got, got_pins, m, pins);
    int need = h->n_names + extra;
    if (need - m + pins > n_free_model() + n_idle - reserved) {
        h->n = -1; /* no room: not admitted */
        return;
    }
    iflow_blocks_share(p, nm, m, h->table);
    for (int i = 0; i < m; i++) {
        CHECK(h->table[i] == owner[h->names[i]], "shared block %d, the model %d", h->table[i], owner[h->names[i]]);
        if (refs[h->table[i]]++ == 0)
            idle_remove(h->table[i]);
    }
    iflow_blocks_reserve(p, need - m);
    reserved += need - m;
    h->n = m;
    h->first_own = m;
    for (int i = m; i < h->n_names; i++) {
        int32_t id = take(p);
        h->table[h->n++] = id;
        int ok = iflow_blocks_name(p, id, &nm[i]);
        CHECK(ok == (owner[h->names[i]] < 0), "naming block %d: %d, the model's owner %d", id, ok, owner[h->names[i]]);
        if (owner[h->names[i]] < 0) {
            owner[h->names[i]] = id;
            bname[id] = h->names[i];
        }
        if (rnd_u32() % 2) {
            iflow_blocks_set_ready(p, id);
            ready[id] = 1;
        }
    }
    int taken = (int)(rnd_u32() % (unsigned)(extra + 1));
    for (int i = 0; i < taken; i++)
        h->table[h->n++] = take(p);
    h->unused = extra - taken;
}

static void release(iflow_blocks *p, held *h, int mark)
{
    for (int i = h->first_own; mark && i < h->n; i++) { /* its prefill done: what it wrote is ready */
        iflow_blocks_set_ready(p, h->table[i]);
        ready[h->table[i]] = 1;
    }
    iflow_blocks_release(p, h->table, h->n, h->unused);
    reserved -= h->unused;
    for (int i = h->n - 1; i >= 0; i--) {
        int id = h->table[i];
        if (--refs[id] > 0)
            continue;
        if (bname[id] >= 0 && ready[id]) {
            idle[n_idle++] = id;
        } else {
            if (bname[id] >= 0)
                owner[bname[id]] = -1;
            bname[id] = -1;
            is_free[id] = 1;
        }
    }
    h->n = -1;
}

static void test_pool_vs_model(void)
{
    iflow_blocks *p;
    CHECK(iflow_blocks_open(&p, NB) == 0, "open");
    for (int k = 0; k < NN; k++)
        owner[k] = -1;
    for (int i = 0; i < NB; i++)
        bname[i] = -1, is_free[i] = 1;
    held h[NR];
    for (int i = 0; i < NR; i++)
        h[i].n = -1;
    int admitted = 0, evicted_before = 0;
    for (int step = 0; step < 20000 && check_failed_ == 0; step++) {
        held *x = &h[rnd_u32() % NR];
        if (x->n < 0) {
            admit(p, x);
            admitted += x->n >= 0;
        } else {
            release(p, x, rnd_u32() % 8 != 0); /* now and then one goes with names not written */
        }
        evicted_before += n_free_model() == 0 && n_idle > 0;
        agree(p, step);
    }
    for (int i = 0; i < NR; i++)
        if (h[i].n >= 0)
            release(p, &h[i], 1);
    agree(p, -1);
    CHECK(reserved == 0 && n_free_model() + n_idle == NB, "at the end: %d reserved, %d free, %d idle", reserved,
          n_free_model(), n_idle);
    CHECK(admitted > 2000 && evicted_before > 100, "the walk admitted %d requests, ran with no free block %d times",
          admitted, evicted_before);
    iflow_blocks_close(p);
}

static void test_names_chain(void)
{
    int32_t a[24], b[24];
    for (int i = 0; i < 24; i++)
        a[i] = b[i] = (int32_t)i * 7 + 3;
    b[2] = 99; /* the first block differs, the second and third are the same tokens */
    iflow_block_name na[3], nb[3];
    iflow_blocks_names(a, 3, 8, 0, na);
    iflow_blocks_names(b, 3, 8, 0, nb);
    CHECK(na[0].lo != nb[0].lo && na[1].lo != nb[1].lo && na[2].lo != nb[2].lo,
          "a block's name depends on the blocks before it");
    iflow_block_name again[3];
    iflow_blocks_names(a, 2, 8, 0, again);
    CHECK(!memcmp(again, na, sizeof(iflow_block_name) * 2), "the same tokens, the same names");
    iflow_blocks_names(a, 1, 12, 0, again);
    CHECK(again[0].lo != na[0].lo || again[0].hi != na[0].hi, "a block of 12 is not a block of 8");
    iflow_blocks_names(a, 3, 8, 1, again); /* another adapter's keys and values */
    for (int i = 0; i < 3; i++)
        CHECK(again[i].lo != na[i].lo || again[i].hi != na[i].hi, "block %d: salt 1 is not salt 0", i);
}

int main(void)
{
    RUN(test_pool_vs_model);
    RUN(test_names_chain);
    return check_summary("test_blocks");
}
