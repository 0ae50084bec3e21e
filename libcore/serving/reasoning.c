/* reasoning.c -- <think> blocks out of a reply. See reasoning.h. */
#include "libcore/serving/reasoning.h"
#include "libcore/base/util.h"

#include <string.h>

static const char OPEN[] = "<think>", CLOSE[] = "</think>";

int iflow_reasoning_detect(const char *text, size_t len)
{
    return text && memmem(text, len, OPEN, sizeof OPEN - 1) != NULL;
}

/* s [n] ends with `tag` once trailing whitespace is left out. */
static int ends_with(const char *s, size_t n, const char *tag)
{
    size_t k = strlen(tag), from = 0;
    iflow_trim_ws(s, &from, &n);
    return n - from >= k && memcmp(s + n - k, tag, k) == 0;
}

int iflow_reasoning_split(const char *prompt, size_t plen, const char *text, size_t len, size_t *r_off, size_t *r_len,
                          size_t *c_off)
{
    *r_off = *r_len = *c_off = 0;
    size_t i = iflow_skip_ws(text, 0, len);
    int inside = prompt && ends_with(prompt, plen, OPEN);
    if (!inside && len - i >= sizeof OPEN - 1 && memcmp(text + i, OPEN, sizeof OPEN - 1) == 0)
        inside = 1, i += sizeof OPEN - 1;
    if (!inside)
        return 0;
    const char *close = memmem(text + i, len - i, CLOSE, sizeof CLOSE - 1);
    size_t end = close ? (size_t)(close - text) : len, c = close ? end + sizeof CLOSE - 1 : len;
    iflow_trim_ws(text, &i, &end);
    *r_off = i, *r_len = end - i, *c_off = iflow_skip_ws(text, c, len);
    return 1;
}

int iflow_reasoning_closed(const char *prompt, size_t plen) { return prompt && ends_with(prompt, plen, CLOSE); }
