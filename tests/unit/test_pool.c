/*
 * test_pool.c -- the kernels' thread pool (kernels/cpu/pool.h).
 *
 *   - every item of a job runs exactly once (in place or published by commit), for item
 *     counts 1..IFK_POOL_MAX_ITEMS and 2..5 threads, stealable or not;
 *   - taking items back: a worker made to sleep between claiming its first item of a job and
 *     looking at the item's state (ifk_pool_test_delay, standing in for a preempted thread)
 *     loses it to the submitter; the job still returns every result, the late worker's result
 *     never lands, and its waking after later jobs have used the item's slot changes none of
 *     theirs (it once published into the old job's output and counted as a later job's item);
 *   - a worker that finished a job's last item and looks for another while the submitter is
 *     writing the next, larger job (ifk_pool_test_gap) claims nothing of it (it once claimed
 *     item n of the old generation and ran the new job's item n a second time, in place);
 *   - matrix products (F32 and quantized) and attention at 4 threads, with and without such
 *     a late worker, give the bytes of the 1-thread call (memcmp);
 *   - two threads submitting at once (one runs on the pool, the other with OpenMP) and a job
 *     in a forked child (no workers there) give the same bytes.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/quant.h"

/* ---- counting job --------------------------------------------------------------------------- */

static _Atomic int ran_in_place[IFK_POOL_MAX_ITEMS], committed[IFK_POOL_MAX_ITEMS];
static float placed[IFK_POOL_MAX_ITEMS][4];

typedef struct {
    int work_us; /* each item busy for this long */
    unsigned salt;
} count_args;

static void busy_us(int us)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000L + (t.tv_nsec - t0.tv_nsec) / 1000 < us);
}

static void count_run(const void *args, const void *in, int i, float *out)
{
    const count_args *a = args;
    const float *v = in;
    busy_us(a->work_us);
    float r = v[i] * 2.0f + (float)a->salt;
    if (out)
        out[0] = r; /* published by count_commit */
    else
        placed[i][0] = r, atomic_fetch_add(&ran_in_place[i], 1);
}

static void count_commit(const void *args, int i, const float *out)
{
    placed[i][0] = out[0];
    atomic_fetch_add(&committed[i], 1);
}

static void count_job(int n, int threads, int stealable, unsigned salt, int work_us)
{
    float in[IFK_POOL_MAX_ITEMS];
    for (int i = 0; i < n; i++) {
        in[i] = (float)i;
        placed[i][0] = -1.0f;
        atomic_store(&ran_in_place[i], 0);
        atomic_store(&committed[i], 0);
    }
    count_args a = {work_us, salt};
    ifk_pool_run(&(ifk_pool_job){.run = count_run, .commit = stealable ? count_commit : NULL, .args = &a,
                                 .args_size = sizeof a, .input = in, .input_size = sizeof(float) * (size_t)n,
                                 .scratch_floats = 1, .n_items = n, .max_threads = threads});
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += atomic_load(&ran_in_place[i]) + atomic_load(&committed[i]) != 1 ||
               placed[i][0] != (float)i * 2.0f + (float)salt;
    CHECK(bad == 0, "%d items of %d (threads %d, stealable %d) ran other than once or gave a wrong value", bad, n,
          threads, stealable);
}

static void test_every_item_once(void)
{
    unsigned salt = 0;
    for (int threads = 2; threads <= 5; threads++)
        for (int n = 1; n <= IFK_POOL_MAX_ITEMS; n += n < 20 ? 1 : 37)
            for (int st = 0; st < 2; st++)
                count_job(n, threads, st, ++salt, 0);
    count_job(IFK_POOL_MAX_ITEMS, 4, 1, 7, 1);
}

static void test_taken_back(void)
{
    /* a worker's first item of each job sleeps 30 ms: the submitter takes it back after its
     * patience (twice its own time per item, at least 20 us) */
    long before = ifk_pool_taken_back();
    ifk_pool_test_delay(30000);
    for (int rep = 0; rep < 5; rep++) {
        count_job(64, 4, 1, 100 + rep, 20);
        count_job(64, 4, 0, 200 + rep, 20); /* in place: waited for, never taken back */
    }
    count_job(8, 2, 1, 300, 20);
    float last[8];
    for (int i = 0; i < 8; i++)
        last[i] = placed[i][0];
    usleep(60000); /* the late workers wake and try to publish */
    ifk_pool_quiesce();
    int changed = 0;
    for (int i = 0; i < 8; i++)
        changed += placed[i][0] != last[i] || atomic_load(&committed[i]) + atomic_load(&ran_in_place[i]) != 1;
    CHECK(changed == 0, "%d late workers' results landed after the job returned", changed);
    CHECK(ifk_pool_taken_back() >= before + 5, "only %ld items taken back from 6 late workers",
          ifk_pool_taken_back() - before);
    ifk_pool_test_delay(0);
}

static void test_gap(void)
{
    /* a worker that ran the last item of a job looks for the next item while the submitter is
     * writing a larger job: it must not claim that job's item n of the old generation (it once
     * did, and ran it in place a second time with the args it read meanwhile) */
    ifk_pool_test_gap(4000);
    for (int rep = 0; rep < 6; rep++) {
        count_job(2, 2, 0, 400 + rep, 50);
        count_job(6, 2, 0, 500 + rep, 50);
        count_job(3, 3, 1, 600 + rep, 50);
        count_job(9, 3, 1, 700 + rep, 50);
    }
    ifk_pool_test_gap(0);
    ifk_pool_quiesce();
}

/* ---- products and attention ------------------------------------------------------------------ */

enum { T = 9, N = 203, K = 300 };

static float W32[N * K], X[T * K];
static uint8_t *Wq;

static void fill(void)
{
    for (size_t i = 0; i < (size_t)N * K; i++)
        W32[i] = (float)rnd_normal();
    for (size_t i = 0; i < (size_t)T * K; i++)
        X[i] = (float)rnd_normal();
    Wq = malloc(ifk_qrow_bytes(IFK_Q4_B64, K) * N);
    for (int n = 0; n < N; n++)
        ifk_quantize_row(Wq + ifk_qrow_bytes(IFK_Q4_B64, K) * n, IFK_Q4_B64, W32 + (size_t)n * K, K);
}

/* y of each kind at `threads`: F32 product, Q4_B64 product (T tokens and one), attention. */
typedef struct {
    float f32[T * N], q4[T * N], q4_1[N], att[T * 8 * 32];
} outputs;

static float kv_k[64 * 2 * 32], kv_v[64 * 2 * 32], q_att[T * 8 * 32];

static void compute(outputs *o, int threads)
{
    ifk_matmul(o->f32, N, W32, IFK_F32, X, K, T, N, K, threads);
    ifk_qmatmul(o->q4, N, Wq, IFK_Q4_B64, X, K, T, N, K, threads);
    ifk_qmatmul(o->q4_1, N, Wq, IFK_Q4_B64, X + K, K, 1, N, K, threads);
    ifk_attention(o->att, q_att, kv_k, kv_v, 2 * 32, T, 64 - T, 8, 2, 32, 0.17f, threads);
}

static int same(const outputs *a, const outputs *b, const char **what)
{
    *what = memcmp(a->f32, b->f32, sizeof a->f32)     ? "f32 product"
            : memcmp(a->q4, b->q4, sizeof a->q4)       ? "q4_b64 product"
            : memcmp(a->q4_1, b->q4_1, sizeof a->q4_1) ? "q4_b64 product of 1 token"
            : memcmp(a->att, b->att, sizeof a->att)    ? "attention"
                                                       : NULL;
    return *what == NULL;
}

static outputs ref;

static void test_products(void)
{
    fill();
    for (size_t i = 0; i < sizeof kv_k / sizeof *kv_k; i++)
        kv_k[i] = (float)rnd_normal(), kv_v[i] = (float)rnd_normal();
    for (size_t i = 0; i < sizeof q_att / sizeof *q_att; i++)
        q_att[i] = (float)rnd_normal();
    compute(&ref, 1);
    static outputs o;
    const char *what;
    for (int threads = 2; threads <= 4; threads++) {
        compute(&o, threads);
        CHECK(same(&o, &ref, &what), "%s at %d threads differs from 1 thread", what, threads);
    }
    long before = ifk_pool_taken_back();
    ifk_pool_test_delay(5000); /* a late worker in every job */
    for (int rep = 0; rep < 3; rep++) {
        compute(&o, 4);
        CHECK(same(&o, &ref, &what), "%s with a late worker differs from 1 thread", what);
    }
    ifk_pool_test_delay(0);
    usleep(20000);
    ifk_pool_quiesce();
    CHECK(same(&o, &ref, &what), "%s changed after the late workers woke", what);
    CHECK(ifk_pool_taken_back() > before, "no item of a product was taken back from a late worker");
}

static void *other_submitter(void *arg)
{
    outputs *o = arg;
    for (int rep = 0; rep < 20; rep++)
        compute(o, 2);
    return NULL;
}

static void test_two_submitters(void)
{
    static outputs a, b;
    pthread_t th;
    if (pthread_create(&th, NULL, other_submitter, &a) != 0) {
        SKIP("no thread");
    }
    for (int rep = 0; rep < 20; rep++)
        compute(&b, 3);
    pthread_join(th, NULL);
    const char *what;
    CHECK(same(&a, &ref, &what), "%s from a second submitting thread differs", what);
    CHECK(same(&b, &ref, &what), "%s beside a second submitting thread differs", what);
}

static void test_fork(void)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        static outputs o;
        const char *what;
        compute(&o, 4);
        _exit(same(&o, &ref, &what) ? 0 : 1);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "a forked child's products differ (status %d)", status);
}

int main(void)
{
    ifk_pool_set_take_back(1); /* this test frees nothing an item reads before quiescing */
    RUN(test_every_item_once);
    RUN(test_taken_back);
    RUN(test_gap);
    RUN(test_products);
    RUN(test_two_submitters);
    RUN(test_fork);
    ifk_pool_quiesce(); /* no late worker still reads Wq */
    free(Wq);
    return check_summary("test_pool");
}
