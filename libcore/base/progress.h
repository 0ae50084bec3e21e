/*
 * progress.h -- how long work in the library says how far it is.
 *
 * Contract
 *   The library never prints. A function that can run for minutes (converting, quantizing)
 *   takes an optional iflow_progress_fn and calls it after each unit of work (a tensor) with
 *   the counts so far; the struct and its strings are valid only during the call. The callback
 *   must not call back into the work. Programs draw a status line from it (cmd/progress.h).
 */
#ifndef IFLOW_PROGRESS_H
#define IFLOW_PROGRESS_H

#include <stdint.h>

typedef struct {
    uint64_t done, total;          /* units done (tensors), and in all (0: not known)            */
    uint64_t bytes, total_bytes;   /* payload bytes done, and in all (0: not known)              */
    const char *item;              /* the unit just done (a tensor's name), or NULL              */
} iflow_progress;

typedef void (*iflow_progress_fn)(void *user, const iflow_progress *p);

#endif
