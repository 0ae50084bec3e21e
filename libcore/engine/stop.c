/* stop.c -- see stop.h. */
#include "stop.h"
#include "libcore/base/error.h"

#include <stdlib.h>
#include <string.h>

struct iflow_stop {
    char **str;       /* [n] copies */
    size_t *len;      /* [n] */
    int n, which;
    int disarmed;     /* iflow_stop_arm(s, 0): matches are not looked for */
    char *buf;        /* [cap]: buf[start .. len) is held back, not emitted yet */
    size_t start, used, cap;
};

int iflow_stop_open(iflow_stop **out, const char *const *stops, int n)
{
    *out = NULL;
    for (int i = 0; i < n; i++)
        if (!stops[i] || !stops[i][0])
            return iflow_seterr(IFLOW_EINVAL, "stop string %d is empty", i + 1);
    iflow_stop *s = calloc(1, sizeof *s);
    if (!s || (n && (!(s->str = calloc((size_t)n, sizeof *s->str)) || !(s->len = calloc((size_t)n, sizeof *s->len))))) {
        iflow_stop_close(s);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    s->n = n;
    for (int i = 0; i < n; i++) {
        s->len[i] = strlen(stops[i]);
        if (!(s->str[i] = strdup(stops[i]))) {
            iflow_stop_close(s);
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        }
    }
    s->which = -1;
    *out = s;
    return 0;
}

void iflow_stop_close(iflow_stop *s)
{
    if (!s)
        return;
    for (int i = 0; s->str && i < s->n; i++)
        free(s->str[i]);
    free(s->str);
    free(s->len);
    free(s->buf);
    free(s);
}

void iflow_stop_reset(iflow_stop *s)
{
    s->start = s->used = 0;
    s->which = -1;
    s->disarmed = 0;
}

void iflow_stop_arm(iflow_stop *s, int armed) { s->disarmed = !armed; }

int iflow_stop_which(const iflow_stop *s) { return s->which; }

const char *iflow_stop_string(const iflow_stop *s, int i) { return i >= 0 && i < s->n ? s->str[i] : NULL; }

/* Length of the longest tail of t[0..n) that is a proper prefix of a stop string. */
static size_t held_tail(const iflow_stop *s, const char *t, size_t n)
{
    size_t best = 0;
    for (int i = 0; i < s->n; i++)
        for (size_t k = s->len[i] - 1 < n ? s->len[i] - 1 : n; k > best; k--)
            if (memcmp(t + n - k, s->str[i], k) == 0) {
                best = k;
                break;
            }
    return best;
}

int iflow_stop_feed(iflow_stop *s, const char *text, size_t n, const char **emit, size_t *n_emit)
{
    /* Move the held tail to the front, then append. */
    size_t held = s->used - s->start;
    if (held)
        memmove(s->buf, s->buf + s->start, held);
    s->start = 0, s->used = held;
    if (held + n + 1 > s->cap) {
        size_t cap = 2 * (held + n) + 64;
        char *b = realloc(s->buf, cap);
        if (!b)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        s->buf = b, s->cap = cap;
    }
    if (n)
        memcpy(s->buf + held, text, n);
    s->used += n;
    const char *t = s->buf;
    size_t len = s->used, at = len;
    for (int i = 0; i < s->n && !s->disarmed; i++) { /* a match must take a byte of text: one within the
                                                      * held tail was passed while disarmed */
        size_t from = held >= s->len[i] ? held - s->len[i] + 1 : 0;
        const char *m = memmem(t + from, len - from, s->str[i], s->len[i]);
        if (m && (size_t)(m - t) < at)
            at = (size_t)(m - t), s->which = i;
    }
    *emit = t;
    if (s->which >= 0) {
        *n_emit = at;
        s->start = s->used = 0;
        return 1;
    }
    *n_emit = len - held_tail(s, t, len);
    s->start = *n_emit;
    return 0;
}

void iflow_stop_flush(iflow_stop *s, const char **emit, size_t *n_emit)
{
    *emit = s->buf ? s->buf + s->start : "";
    *n_emit = s->used - s->start;
    s->start = s->used;
}
