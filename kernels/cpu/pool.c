/*
 * pool.c -- the kernels' persistent thread pool (contract in pool.h).
 *
 * Shared state, one job at a time (P.lock, held by the submitting thread):
 *   claim     generation << 16 | next item. A new job bumps the generation; a thread takes
 *             item `next` by a compare-and-swap that also checks the generation, so a worker
 *             that wakes late can never take an item of a job it did not read.
 *   job       run, commit, input, n_items, limit and args, written by the submitter before it
 *             publishes the generation (release stores). A worker reads them, then claims: the
 *             claim succeeding proves that what it read belongs to that generation, a seqlock
 *             in effect. Before rewriting them the submitter closes the old generation (next =
 *             CLOSED, past any n_items), and its field stores are release stores, so a worker
 *             that read a newer field must also see the claim closed and its claim fails.
 *             (Without the close, a worker that had claimed past the end of a job of n items
 *             could read the next job's larger n_items and claim item n of the old generation:
 *             it then ran that item of the new job in place with torn args, twice.)
 *   state[i]  generation << 2 | ST_*: whether a worker's item i has been published (DONE),
 *             is being published (COMMITTING) or was taken back by the submitter (STOLEN).
 *             Any other generation means "open". The submitter's own items never touch it.
 *   done      items finished by workers in this generation.
 *   busy      workers inside an item (ifk_pool_quiesce waits for 0).
 *
 * Workers spin for SPIN_NS after a job, then sleep on the futex word `wake`.
 */
#include "kernels/cpu/pool.h"

#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { ST_DONE = 1, ST_COMMITTING = 2, ST_STOLEN = 3 };
enum { CLOSED = 0xffff }; /* a claim's next item while the submitter rewrites the job */
_Static_assert((int)CLOSED > (int)IFK_POOL_MAX_ITEMS, "a closed claim is past every job's items");
enum { ARG_WORDS = IFK_POOL_ARGS / 8 };

#define SPIN_NS 200000          /* a worker spins this long for the next job, then sleeps */
#define MIN_PATIENCE_NS 20000   /* the least the submitter waits before taking items back */

static struct {
    pthread_mutex_t lock; /* held by the thread whose job runs */
    int n_workers;        /* started (under lock) */
    uint64_t gen;         /* the current generation (under lock) */
    _Atomic int enabled;  /* -1 unknown, else IFLOW_POOL != "0" */
    void *input;          /* the pool's copy of the job's input (under lock) */
    size_t input_cap;
    void **retired;       /* inputs outgrown: kept mapped for abandoned workers */
    int n_retired;

    _Alignas(64) _Atomic uint64_t claim;
    _Alignas(64) _Atomic uint32_t wake;
    _Atomic int sleepers;
    _Alignas(64) _Atomic int done;
    _Alignas(64) _Atomic int busy;
    _Alignas(64) _Atomic(uintptr_t) run, commit, in;
    _Atomic int n_items, limit;
    _Atomic size_t scratch_floats;
    _Atomic uint64_t args[ARG_WORDS];
    _Alignas(64) _Atomic uint64_t state[IFK_POOL_MAX_ITEMS];
    _Atomic int master_cpu; /* where the submitter ran when it published the job */
    _Atomic long taken_back, moved;
    _Atomic int delay_usec;
    _Atomic uint64_t delay_gen; /* the last generation whose first worker item slept */
    _Atomic int gap_usec;       /* ifk_pool_test_gap() */
} P = {.lock = PTHREAD_MUTEX_INITIALIZER, .enabled = -1};

static _Thread_local int take_back_ok; /* ifk_pool_set_take_back() */

typedef void (*run_fn)(const void *args, const void *in, int i, float *out);
typedef void (*commit_fn)(const void *args, int i, const float *out);

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ---- workers -------------------------------------------------------------------------------- */

/* Item i of generation g, claimed by a worker whose copy of the job is (run, commit, in, args). */
static void worker_item(uint64_t g, int i, run_fn run, commit_fn commit, const void *in, const void *args,
                        size_t scratch_floats, float **scratch, size_t *cap)
{
    atomic_fetch_add(&P.busy, 1);
    /* tests (ifk_pool_test_delay): the first worker item of a generation sleeps here, as a
     * worker preempted between its claim and its look at the item's state */
    int delay = atomic_load_explicit(&P.delay_usec, memory_order_relaxed);
    if (delay > 0 && atomic_exchange(&P.delay_gen, g) != g)
        usleep((useconds_t)delay);
    /* Open means an older generation. g: taken back. Newer: the job ended (the item taken back)
     * and a later job's item i has been published or taken back since; committing over that
     * value would publish into the old job's output, freed or reused by now, and count as one
     * of the later job's items (its submitter would return before they are all done). */
    uint64_t v = atomic_load(&P.state[i]);
    if (v >> 2 >= g)
        goto out;
    if (!commit) { /* in place: the submitter waits for it */
        run(args, in, i, NULL);
        atomic_store(&P.state[i], g << 2 | ST_DONE);
        atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
        goto out;
    }
    if (scratch_floats > *cap) {
        float *p = realloc(*scratch, scratch_floats * sizeof(float));
        if (!p) /* no room: leave the item to the submitter */
            goto out;
        *scratch = p, *cap = scratch_floats;
    }
    run(args, in, i, *scratch);
    if (atomic_compare_exchange_strong(&P.state[i], &v, g << 2 | ST_COMMITTING)) {
        commit(args, i, *scratch);
        atomic_store(&P.state[i], g << 2 | ST_DONE);
        atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
    }
out:
    atomic_fetch_sub(&P.busy, 1);
}

/* Takes items of the generation in c until none is left or the job changes. */
static void worker_job(int id, uint64_t c, float **scratch, size_t *cap)
{
    uint64_t args[ARG_WORDS];
    for (;;) {
        const uint64_t g = c >> 16;
        const int next = (int)(c & 0xffff);
        const int n = atomic_load_explicit(&P.n_items, memory_order_relaxed);
        if (id >= atomic_load_explicit(&P.limit, memory_order_relaxed) || next >= n)
            return;
        run_fn run = (run_fn)atomic_load_explicit(&P.run, memory_order_relaxed);
        commit_fn commit = (commit_fn)atomic_load_explicit(&P.commit, memory_order_relaxed);
        const void *in = (const void *)atomic_load_explicit(&P.in, memory_order_relaxed);
        size_t sf = atomic_load_explicit(&P.scratch_floats, memory_order_relaxed);
        for (int w = 0; w < ARG_WORDS; w++)
            args[w] = atomic_load_explicit(&P.args[w], memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (!atomic_compare_exchange_strong(&P.claim, &c, c + 1)) {
            if (c >> 16 != g)
                return; /* a newer job: the caller's loop picks it up */
            continue;   /* someone else took `next`: try the one after */
        }
        worker_item(g, next, run, commit, in, args, sf, scratch, cap);
        /* tests (ifk_pool_test_gap): the submitter returns and starts rewriting the job meanwhile */
        int gap = atomic_load_explicit(&P.gap_usec, memory_order_relaxed);
        if (gap > 0)
            usleep((useconds_t)gap / 2);
        c = atomic_load_explicit(&P.claim, memory_order_acquire);
        if (c >> 16 != g)
            return;
    }
}

/* A worker on the submitter's CPU only takes time from it (the submitter's serial work between
 * products is the critical path). When it finds itself there, it moves to the other CPUs it is
 * allowed: on a machine where another process holds a core, the submitter then keeps a core of
 * its own and the worker shares the busy one, instead of the two sharing one core. */
static void keep_off_master(cpu_set_t *allowed)
{
    int master = atomic_load_explicit(&P.master_cpu, memory_order_relaxed), here = sched_getcpu();
    if (here < 0 || here != master || CPU_COUNT(allowed) < 2 || !CPU_ISSET(master, allowed))
        return;
    cpu_set_t set = *allowed;
    CPU_CLR(master, &set);
    if (sched_setaffinity(0, sizeof set, &set) == 0)
        atomic_fetch_add_explicit(&P.moved, 1, memory_order_relaxed);
}

static void *worker_main(void *arg)
{
    const int id = (int)(intptr_t)arg;
    float *scratch = NULL;
    size_t cap = 0;
    uint64_t seen = 0;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        CPU_ZERO(&allowed);
    for (;;) {
        uint64_t c = atomic_load_explicit(&P.claim, memory_order_acquire);
        if (c >> 16 != seen) {
            seen = c >> 16;
            worker_job(id, c, &scratch, &cap);
            keep_off_master(&allowed);
            continue;
        }
        /* wait for the next generation: spin, then sleep */
        uint64_t t0 = now_ns();
        int spins = 0;
        while (atomic_load_explicit(&P.claim, memory_order_acquire) >> 16 == seen) {
            cpu_relax();
            if (++spins % 256 == 0 && now_ns() - t0 > SPIN_NS) {
                uint32_t w = atomic_load(&P.wake);
                atomic_fetch_add(&P.sleepers, 1);
                if (atomic_load(&P.claim) >> 16 == seen)
                    syscall(SYS_futex, &P.wake, FUTEX_WAIT_PRIVATE, w, NULL, NULL, 0);
                atomic_fetch_sub(&P.sleepers, 1);
                t0 = now_ns();
            }
        }
    }
    return NULL;
}

static void after_fork_child(void)
{
    /* the workers did not come along; a job then runs on the submitter alone */
    pthread_mutex_init(&P.lock, NULL);
    P.n_workers = 0;
}

/* Starts workers until there are `want` (under lock); fewer if the system refuses. */
static void start_workers(int want)
{
    if (want > IFK_POOL_MAX_WORKERS)
        want = IFK_POOL_MAX_WORKERS;
    if (P.n_workers >= want)
        return;
    if (P.n_workers == 0 && P.gen == 0)
        pthread_atfork(NULL, NULL, after_fork_child);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* signals go to the program's own threads */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (P.n_workers < want) {
        pthread_t th;
        if (pthread_create(&th, &attr, worker_main, (void *)(intptr_t)P.n_workers) != 0)
            break;
        P.n_workers++;
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* ---- the submitter ---------------------------------------------------------------------------- */

static int pool_enabled(void)
{
    int on = atomic_load_explicit(&P.enabled, memory_order_relaxed);
    if (on < 0) {
        const char *e = getenv("IFLOW_POOL");
        on = !(e && strcmp(e, "0") == 0);
        atomic_store_explicit(&P.enabled, on, memory_order_relaxed);
    }
    return on;
}

/* The pool's copy of `bytes` of input (under lock), or NULL when out of memory. */
static void *input_copy(const void *src, size_t bytes)
{
    if (bytes > P.input_cap) {
        size_t want = (bytes + 4095) & ~(size_t)4095;
        void *p = aligned_alloc(64, want);
        void **r = P.input ? realloc(P.retired, (P.n_retired + 1) * sizeof *r) : P.retired;
        if (!p || (P.input && !r)) {
            free(p);
            if (r)
                P.retired = r;
            return NULL;
        }
        if (P.input)
            P.retired = r, P.retired[P.n_retired++] = P.input;
        P.input = p, P.input_cap = want;
    }
    memcpy(P.input, src, bytes);
    return P.input;
}

static void run_all_here(const ifk_pool_job *job)
{
    for (int i = 0; i < job->n_items; i++)
        job->run(job->args, job->input, i, NULL);
}

static void run_openmp(const ifk_pool_job *job, int nt)
{
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int i = 0; i < job->n_items; i++)
        job->run(job->args, job->input, i, NULL);
}

/* After the submitter has claimed the last item: waits for the workers' items, taking back
 * the ones still open after `patience` ns (stealable jobs). mine[i]: the submitter ran item i. */
static void finish(uint64_t g, const ifk_pool_job *job, int stealable, const void *in, const unsigned char *mine,
                   int n_workers_items, uint64_t patience)
{
    const uint64_t t0 = now_ns();
    int taken = 0, spins = 0;
    while (atomic_load_explicit(&P.done, memory_order_acquire) + taken < n_workers_items) {
        cpu_relax();
        if (++spins % 64)
            continue;
        uint64_t waited = now_ns() - t0;
        if (stealable && waited > patience) {
            for (int i = 0; i < job->n_items; i++) {
                if (mine[i])
                    continue;
                uint64_t v = atomic_load(&P.state[i]);
                if (v >> 2 != g && atomic_compare_exchange_strong(&P.state[i], &v, g << 2 | ST_STOLEN)) {
                    job->run(job->args, in, i, NULL);
                    taken++;
                    atomic_fetch_add_explicit(&P.taken_back, 1, memory_order_relaxed);
                }
            }
        } else if (waited > 1000000) {
            sched_yield(); /* a worker holding an in-place item is not running: let it */
        }
    }
}

void ifk_pool_run(const ifk_pool_job *job)
{
    const int n = job->n_items;
    if (n <= 0)
        return;
    int nt = job->max_threads < n ? job->max_threads : n;
    if (nt <= 1) {
        run_all_here(job);
        return;
    }
    if (n > IFK_POOL_MAX_ITEMS || job->args_size > IFK_POOL_ARGS || !pool_enabled() ||
        pthread_mutex_trylock(&P.lock) != 0) {
        run_openmp(job, nt);
        return;
    }
    start_workers(nt - 1);
    int limit = nt - 1 < P.n_workers ? nt - 1 : P.n_workers;
    commit_fn commit = take_back_ok ? job->commit : NULL;
    const void *in = job->input;
    if (commit && job->input_size) {
        void *copy = input_copy(job->input, job->input_size);
        if (copy)
            in = copy;
        else
            commit = NULL; /* cannot be stolen safely: run it in place */
    }
    /* close the old generation first: a worker that reads any field of this job then fails to
     * claim (the seqlock of the header's "job") */
    atomic_store(&P.claim, P.gen << 16 | CLOSED);
    const uint64_t g = ++P.gen;
    atomic_store_explicit(&P.master_cpu, sched_getcpu(), memory_order_relaxed);
    uint64_t args[ARG_WORDS] = {0};
    memcpy(args, job->args, job->args_size);
    atomic_store_explicit(&P.run, (uintptr_t)job->run, memory_order_release);
    atomic_store_explicit(&P.commit, (uintptr_t)commit, memory_order_release);
    atomic_store_explicit(&P.in, (uintptr_t)in, memory_order_release);
    atomic_store_explicit(&P.n_items, n, memory_order_release);
    atomic_store_explicit(&P.limit, limit, memory_order_release);
    atomic_store_explicit(&P.scratch_floats, job->scratch_floats, memory_order_release);
    for (int w = 0; w < ARG_WORDS; w++)
        atomic_store_explicit(&P.args[w], args[w], memory_order_release);
    atomic_store_explicit(&P.done, 0, memory_order_release);
    int gap = atomic_load_explicit(&P.gap_usec, memory_order_relaxed);
    if (gap > 0) /* tests (ifk_pool_test_gap): the job written, not yet published */
        usleep((useconds_t)gap);
    atomic_store(&P.claim, g << 16);
    atomic_store(&P.wake, (uint32_t)g);
    if (atomic_load(&P.sleepers) > 0)
        syscall(SYS_futex, &P.wake, FUTEX_WAKE_PRIVATE, IFK_POOL_MAX_WORKERS, NULL, NULL, 0);

    /* tests (ifk_pool_test_delay): a worker takes the first item, so that one is late for sure */
    if (atomic_load_explicit(&P.delay_usec, memory_order_relaxed) > 0 && limit > 0)
        for (uint64_t t0 = now_ns(); (atomic_load(&P.claim) & 0xffff) == 0 && now_ns() - t0 < 1000000000u;)
            sched_yield();

    /* the submitter's share: whatever the workers do not take first */
    unsigned char mine[IFK_POOL_MAX_ITEMS] = {0};
    int n_mine = 0;
    uint64_t t_mine = 0;
    uint64_t c = atomic_load(&P.claim);
    while ((int)(c & 0xffff) < n) {
        if (!atomic_compare_exchange_weak(&P.claim, &c, c + 1))
            continue;
        int i = (int)(c & 0xffff);
        uint64_t t = now_ns();
        job->run(job->args, job->input, i, NULL);
        t_mine += now_ns() - t;
        mine[i] = 1, n_mine++;
        c = atomic_load(&P.claim);
    }
    uint64_t patience = n_mine ? 2 * t_mine / (uint64_t)n_mine : 0;
    finish(g, job, commit != NULL, in, mine,
           n - n_mine, patience > MIN_PATIENCE_NS ? patience : MIN_PATIENCE_NS);
    pthread_mutex_unlock(&P.lock);
}

int ifk_pool_set_take_back(int on)
{
    int was = take_back_ok;
    take_back_ok = on;
    return was;
}

void ifk_pool_quiesce(void)
{
    for (int spins = 0; atomic_load(&P.busy) > 0; spins++)
        if (spins > 1000)
            sched_yield();
        else
            cpu_relax();
}

long ifk_pool_taken_back(void)
{
    return atomic_load_explicit(&P.taken_back, memory_order_relaxed);
}

long ifk_pool_moves(void)
{
    return atomic_load_explicit(&P.moved, memory_order_relaxed);
}

void ifk_pool_test_delay(int usec)
{
    atomic_store(&P.delay_usec, usec);
}

void ifk_pool_test_gap(int usec)
{
    atomic_store(&P.gap_usec, usec);
}
