/*
 * error.h -- libiflow's error codes and the per-thread error message.
 *
 * Contract
 *   Every libiflow function that can fail returns 0 (or a non-negative count) on success and a
 *   negative IFLOW_E* code on failure. Before returning the code it records a one-line message
 *   with iflow_seterr(): lowercase, saying what failed first, then where (file, tensor, line,
 *   byte offset), e.g.
 *       "truncated tensor data: 'blk.3.wq' in 'model.ifs' at byte 81920 (need 16384, have 100)"
 *   The message lives in thread-local storage; iflow_errmsg() returns it until the next failure
 *   on the same thread. The library never prints and never exits; the programs in cmd/ print
 *   "iflow-x: <message>" and exit non-zero.
 *
 *   The numeric codes are stable (they are part of the ABI); iflow_strerror() names them.
 */
#ifndef IFLOW_ERROR_H
#define IFLOW_ERROR_H

#include <stdarg.h>

#include "include/iflow.h"

/* The codes (IFLOW_OK, IFLOW_EIO, ... IFLOW_ERANGE) are the public header's: include/iflow.h. */


/* Name of an error code: "io", "nomem", "format", ... ; "unknown" for anything else. */
const char *iflow_strerror(int code);
/* What a code means, one sentence (the comments of the enum). */
const char *iflow_error_describe(int code);

/* Record a message for this thread and return `code` (so callers can `return iflow_seterr(...)`). */
int iflow_seterr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int iflow_vseterr(int code, const char *fmt, va_list ap);

/* Prefix the current message with "<prefix>: " (used to add context while unwinding). */
int iflow_preperr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last message recorded on this thread ("" if none). */
const char *iflow_errmsg(void);

/* Evaluate a call that returns 0 or a negative code; return the code from the enclosing
 * function when it failed (the message is already set). */
#define IFLOW_TRY(expr)                                                                            \
    do {                                                                                           \
        int iflow_rc_ = (expr);                                                                    \
        if (iflow_rc_ < 0)                                                                         \
            return iflow_rc_;                                                                      \
    } while (0)

#endif
