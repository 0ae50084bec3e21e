/*
 * bench.h -- the timing harness the benchmark programs share (kbench.c, qbench.c,
 * iflow-bench.c; header-only).
 *
 *   bench_now()            monotonic seconds
 *   bench_alloc64()        64-byte aligned memory, or exit(1) with a message
 *   bench_need()           an allocation made otherwise, or that exit
 *   bench_best_median()    best and median of n timed rounds (sorts them)
 *   BENCH_ROUNDS()         times a statement in rounds: at least 3, and at least a minimum
 *                          time in all (at most BENCH_MAX_ROUNDS); best and median round
 *
 * Report the best round and the median: other processes on the machine show up in the median
 * first, so compare best-of figures.
 */
#ifndef IFLOW_BENCH_H
#define IFLOW_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define BENCH_MAX_ROUNDS 1000

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A benchmark without its memory has nothing to say: p (an allocation of `bytes`), or exit.
 * prog names the program. */
static inline void *bench_need(const char *prog, void *p, size_t bytes)
{
    if (!p) {
        fprintf(stderr, "%s: out of memory (%zu bytes)\n", prog, bytes);
        exit(1);
    }
    return p;
}

static inline void *bench_alloc64(const char *prog, size_t bytes)
{
    return bench_need(prog, aligned_alloc(64, (bytes + 63) & ~(size_t)63), bytes);
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* t: [n] times, n >= 1; sorted on return. */
static inline void bench_best_median(double *t, int n, double *best, double *med)
{
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    *best = t[0];
    *med = t[n / 2];
}

/* Runs the statement(s) after `med` as one round, repeatedly: at least 3 rounds and at least
 * min_s seconds in all, at most BENCH_MAX_ROUNDS. *best and *med get the best and the median
 * round in seconds. */
#define BENCH_ROUNDS(min_s, best, med, ...)                                                    \
    do {                                                                                       \
        double bench_t_[BENCH_MAX_ROUNDS], bench_start_ = bench_now();                         \
        int bench_n_ = 0;                                                                      \
        do {                                                                                   \
            double bench_t0_ = bench_now();                                                    \
            __VA_ARGS__;                                                                       \
            bench_t_[bench_n_++] = bench_now() - bench_t0_;                                    \
        } while (bench_n_ < BENCH_MAX_ROUNDS && (bench_n_ < 3 || bench_now() - bench_start_ < (min_s))); \
        bench_best_median(bench_t_, bench_n_, (best), (med));                                 \
    } while (0)

#endif
