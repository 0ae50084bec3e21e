/*
 * stop.h -- stop strings: finding them in generated text that arrives a token's piece at a time.
 *
 * Contract
 *   Open a matcher with the stop strings of one request (none is fine: it then passes the text
 *   through), feed it each decoded piece in order, and emit what it says is safe: the text that
 *   can no longer be the start of a stop string. A stop string may span any number of pieces;
 *   the matcher holds back the longest tail of the text that is a prefix of a stop string until
 *   the next piece settles it. The first piece that completes a stop string ends the sequence:
 *   the text before the earliest match in the text so far is emitted (on a tie, the first string
 *   given wins), the match and everything after it are not. A longer stop string that began
 *   earlier but is not complete yet does not count: generation cannot wait for it. At the end
 *   of a sequence that did not stop, iflow_stop_flush() gives the held-back tail.
 *   iflow_stop_reset() starts the next sequence with the same strings (armed).
 *   A disarmed matcher (iflow_stop_arm(s, 0): vLLM's min_tokens, before which no stop string
 *   counts) finds no match: it still holds back a tail that may begin one, so a stop string
 *   that the first piece fed after arming completes is found, wherever it began.
 *   The matcher copies the strings and owns its buffer; an emitted pointer is valid until the
 *   next call on the matcher. Matching is on bytes.
 */
#ifndef IFLOW_STOP_H
#define IFLOW_STOP_H

#include <stddef.h>

typedef struct iflow_stop iflow_stop;

/* stops: [n] NUL-terminated, none empty (IFLOW_EINVAL). */
int  iflow_stop_open(iflow_stop **out, const char *const *stops, int n);
void iflow_stop_close(iflow_stop *s);
void iflow_stop_reset(iflow_stop *s);
/* Append text[0..n). *emit, *n_emit: the bytes now safe to print. Returns 1 when a stop string
 * matched (then feed no more until a reset), 0 when not, IFLOW_ENOMEM. */
int  iflow_stop_feed(iflow_stop *s, const char *text, size_t n, const char **emit, size_t *n_emit);
/* armed 0: the pieces fed from now on complete no stop string; 1: they do again (the default). */
void iflow_stop_arm(iflow_stop *s, int armed);
/* The held-back tail, at the end of a sequence that did not stop. */
void iflow_stop_flush(iflow_stop *s, const char **emit, size_t *n_emit);
/* The index of the stop string that matched, or -1. */
int  iflow_stop_which(const iflow_stop *s);
/* Stop string i (the matcher's copy), or NULL outside 0 .. n-1. */
const char *iflow_stop_string(const iflow_stop *s, int i);

#endif
