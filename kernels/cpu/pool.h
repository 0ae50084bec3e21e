/*
 * pool.h -- the kernels' persistent thread pool: parallel loops that survive a busy core.
 *
 * Contract
 *   A job is n_items independent items (row blocks of a matrix product, attention units).
 *   ifk_pool_run(job) returns when every item has run exactly once in place, in any order, on
 *   the caller and up to max_threads - 1 pool workers. Items are claimed one at a time from a
 *   shared counter, so a worker that the OS has not scheduled yet simply takes none: the caller
 *   never waits at a barrier for a thread that is not running.
 *
 *   Stealable jobs (commit != NULL, submitted by a thread that allowed it with
 *   ifk_pool_set_take_back(1)) go one step further. A worker runs its item into a scratch
 *   buffer of its own (run(args, i, out) with out != NULL) and then publishes it with commit().
 *   When the caller has nothing left to claim and a worker's item is late (the worker was
 *   preempted, for instance by another process on its core), the caller runs the item itself,
 *   in place; the worker's result, if it ever comes, is discarded. So a product on a busy
 *   machine costs at most what the caller alone would take, plus what the workers add.
 *
 *   An abandoned worker may still be reading the job's inputs after ifk_pool_run returned:
 *     - args are copied into the pool at submission, so they may live on the caller's stack;
 *     - the job's input (input_size bytes) is copied into a pool-owned buffer, which run()
 *       receives as `in`; a buffer that grows is retired, never freed, so it stays mapped;
 *     - anything else a stealable item reads (weights) must stay mapped until
 *       ifk_pool_quiesce() returns: its owner calls that before freeing it (the CPU device and
 *       the shard mapping do). That promise is why taking back is opt-in, per submitting
 *       thread; without it a job's items all run in place and ifk_pool_run waits for them.
 *       Stale values are harmless: that result is discarded.
 *   Non-stealable jobs read and write in place, only while ifk_pool_run waits for them.
 *
 *   One job runs at a time; a caller that finds the pool busy (another thread's job) runs its
 *   items with OpenMP instead. Results never depend on who ran an item (each item computes the
 *   same values whatever thread runs it), so batch invariance (kernels.h) holds.
 *
 * Threads: workers start on first use (at most IFK_POOL_MAX_WORKERS), spin briefly after a job
 * and then sleep on a futex; they live as long as the process.
 */
#ifndef IFK_POOL_H
#define IFK_POOL_H

#include <stddef.h>
#include <string.h>

enum {
    IFK_POOL_MAX_ITEMS = 256,  /* items of one job */
    IFK_POOL_ARGS = 512,       /* bytes of a job's args */
    IFK_POOL_MAX_WORKERS = 63,
};

typedef struct {
    /* Item i: in place when out is NULL, else into out[0 .. scratch_floats). `in` is the job's
     * input (the pool's copy of it, or job->input itself when the caller runs everything). */
    void (*run)(const void *args, const void *in, int i, float *out);
    /* Copies item i's result from out to its place; NULL for a job that cannot be stolen. */
    void (*commit)(const void *args, int i, const float *out);
    const void *args;     /* args_size bytes, copied at submission */
    const void *input;    /* input_size bytes that items read, copied for stealable jobs */
    size_t input_size;
    size_t args_size;     /* <= IFK_POOL_ARGS */
    size_t scratch_floats;/* one item's result (stealable jobs) */
    int n_items;          /* 0 .. IFK_POOL_MAX_ITEMS */
    int max_threads;      /* the caller included; <= 1 runs everything on the caller */
} ifk_pool_job;

void ifk_pool_run(const ifk_pool_job *job);

/* Rows per item when a product of N output rows is dealt to nt threads: 8 items a thread, fine
 * enough to balance and to lose little to an item taken back; a multiple of 16 (a line of y). */
static inline int ifk_pool_rows_per_item(int N, int nt)
{
    int blocks = (N + 15) / 16, items = 8 * nt < blocks ? 8 * nt : blocks;
    return (blocks + items - 1) / items * 16;
}

/* A product's commit: rows n0 .. n0+n of y ([T][ldy]) from an item's scratch out ([T][n]). */
static inline void ifk_pool_copy_rows(float *y, size_t ldy, int n0, const float *out, int T, int n)
{
    for (int t = 0; t < T; t++) /* memcpy: the plain loop stayed scalar at -O2 (2 % of Q4 prefill) */
        memcpy(y + (size_t)t * ldy + (size_t)n0, out + (size_t)t * (size_t)n, (size_t)n * sizeof(float));
}

/* Whether the jobs this thread submits may be taken back from late workers (default 0); the
 * caller promises to call ifk_pool_quiesce() before freeing what their items read. Returns the
 * previous setting. */
int ifk_pool_set_take_back(int on);

/* Returns once no worker is inside an item: call before freeing memory that a stealable item
 * may read. Cheap when no item was abandoned. */
void ifk_pool_quiesce(void);

/* Since the process started (benchmarks, tests): items taken back from late workers, and
 * times a worker moved off the submitter's CPU. */
long ifk_pool_taken_back(void);
long ifk_pool_moves(void);

/* Tests: the first item a worker takes in each job makes it sleep `usec` first (0: none), and
 * the submitter leaves the job's first item to a worker (waiting up to a second for one). */
void ifk_pool_test_delay(int usec);

/* Tests: the submitter sleeps `usec` between writing a job and publishing it, and a worker
 * sleeps usec / 2 after each item before looking for the next (0: neither): a worker that
 * finished the last item of a job then looks at the claim while the next job is half-written. */
void ifk_pool_test_gap(int usec);

#endif
