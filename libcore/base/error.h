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

enum {
    IFLOW_OK          = 0,
    IFLOW_EIO         = -1,  /* a read, write, open or rename failed (errno in the message)    */
    IFLOW_ENOMEM      = -2,  /* allocation failed                                               */
    IFLOW_EFORMAT     = -3,  /* a file is malformed: bad magic, bad header, bad field            */
    IFLOW_ETRUNC      = -4,  /* a file ends before its declared contents                         */
    IFLOW_ECHECKSUM   = -5,  /* a stored checksum does not match the data                        */
    IFLOW_EUNSUPPORTED= -6,  /* a valid input uses something iflow lacks (dtype, block, ...)     */
    IFLOW_EINVAL      = -7,  /* a caller passed a bad argument or option value                   */
    IFLOW_ENOTFOUND   = -8,  /* a named file, tensor, key or token does not exist                */
    IFLOW_ESHAPE      = -9,  /* a tensor has the wrong shape or dtype for its role               */
    IFLOW_ESPEC       = -10, /* a spec file is malformed or does not fit the checkpoint          */
    IFLOW_ERANGE      = -11, /* a value is out of its allowed range (context too long, id > vocab)*/
    IFLOW_E_COUNT_    = 12
};

/* Name of an error code: "io", "nomem", "format", ... ; "unknown" for anything else. */
const char *iflow_strerror(int code);

/* Record a message for this thread and return `code` (so callers can `return iflow_seterr(...)`). */
int iflow_seterr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int iflow_vseterr(int code, const char *fmt, va_list ap);

/* Prefix the current message with "<prefix>: " (used to add context while unwinding). */
int iflow_preperr(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last message recorded on this thread ("" if none). */
const char *iflow_errmsg(void);

#endif
