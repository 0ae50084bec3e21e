/*
 * blocks.h -- a batch's KV blocks: which request holds which, and blocks found again by what
 * they hold (prefix caching).
 *
 * A pool of n block ids (model.h's iflow_kv blocks, `block` positions each). A block is
 *   free     on the free stack: nothing in it is of use;
 *   held     by one request or more (refs >= 1);
 *   idle     no request holds it, but it is named (below) and keeps its keys and values, so a
 *            later request whose tokens are the same may take it instead of computing them.
 *            When the free stack is empty, taking a block evicts the idle block released
 *            longest ago (its name goes).
 * A name is the chain hash of a full block of a prompt: XXH3-128 of the hash of the blocks
 * before it (for the first block: a salt) followed by its `block` token ids, so one name means
 * the same tokens at every position from 0 to the block's end (and the same salt), and thus
 * (the kernels being batch-invariant, kernels/cpu/kvcache.h) the same keys and values bit for
 * bit, whoever computed them. Names
 * are unique: a block is named only when no other block has the name. A named block is
 * "ready" once its owner's prefill has written it; a request that shares a block that is not
 * ready yet waits for it (batch.c).
 *
 * Reservation: a request reserves at admission the blocks it will take for itself, and
 * iflow_blocks_room() is what reservations may still claim (free + idle - reserved), so a
 * running request never waits for a block. Pinning an idle block (sharing it) costs one of
 * that room too, since it is no longer there to evict.
 *
 * Not thread-safe (one thread drives a batch). The library's usual return codes (error.h).
 */
#ifndef IFLOW_BLOCKS_H
#define IFLOW_BLOCKS_H

#include <stdint.h>

typedef struct {
    uint64_t lo, hi;
} iflow_block_name;

typedef struct iflow_blocks iflow_blocks;

int  iflow_blocks_open(iflow_blocks **out, int n_blocks);
void iflow_blocks_close(iflow_blocks *p);

/* The names of the first n_full full blocks of tokens (block positions each) into out. Names of
 * different salts never meet (a salt stands for what else the keys and values depend on: a
 * LoRA adapter's number; 0: none). */
void iflow_blocks_names(const int32_t *tokens, int n_full, int block, uint64_t salt, iflow_block_name *out);

/* How many of names[0..n) lead the run of blocks already named that way (the longest run
 * from the first); *pins (optional): how many of those are idle (sharing them costs room). */
int  iflow_blocks_match(const iflow_blocks *p, const iflow_block_name *names, int n, int *pins);
/* Hold the first m blocks iflow_blocks_match() found (m at most what it returned), their ids
 * into table[0..m). */
void iflow_blocks_share(iflow_blocks *p, const iflow_block_name *names, int m, int32_t *table);

/* Free plus idle blocks, less those reserved and not taken yet. */
int  iflow_blocks_room(const iflow_blocks *p);
void iflow_blocks_reserve(iflow_blocks *p, int n);
/* A block for the caller alone, from its reservation: a free one, or the oldest idle one. */
int32_t iflow_blocks_take(iflow_blocks *p);
/* Name the held block id (pending: not ready). 1 if named, 0 if another block has the name
 * (id stays unnamed, the caller's alone). */
int  iflow_blocks_name(iflow_blocks *p, int32_t id, const iflow_block_name *name);
void iflow_blocks_set_ready(iflow_blocks *p, int32_t id);
int  iflow_blocks_ready(const iflow_blocks *p, int32_t id);
/* Let go of table[0..n) (a named block whose last holder goes turns idle, newest last: the
 * table's deepest block is evicted first), and of `unused` blocks reserved and never taken. */
void iflow_blocks_release(iflow_blocks *p, const int32_t *table, int n, int unused);

/* Blocks free (on the stack) and idle now. */
int  iflow_blocks_n_free(const iflow_blocks *p);
int  iflow_blocks_n_idle(const iflow_blocks *p);

#endif
