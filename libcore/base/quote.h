/*
 * quote.h -- make text that came from a file safe to put inside a one-line error message.
 *
 * Contract
 *   Tensor names, dict keys, member names and the like are bytes chosen by whoever wrote the
 *   file: they may hold newlines or other control characters, or be very long. iflow_quote()
 *   returns a copy with every byte below 0x20 and 0x7f written as \xNN, cut to at most
 *   IFLOW_QUOTE_MAX bytes (ending in "..."). The copy lives in a thread-local ring of
 *   IFLOW_QUOTE_RING buffers, so up to that many can appear in one message; it is valid until
 *   the same number of later calls on this thread. Nothing is allocated; never fails.
 */
#ifndef IFLOW_QUOTE_H
#define IFLOW_QUOTE_H

#include <stddef.h>

#define IFLOW_QUOTE_MAX  240
#define IFLOW_QUOTE_RING 8

/* s as printable text (NULL gives "(null)"). */
const char *iflow_quote(const char *s);
/* The n bytes at s (which need not be NUL-terminated) as printable text. */
const char *iflow_quoten(const char *s, size_t n);

#endif
