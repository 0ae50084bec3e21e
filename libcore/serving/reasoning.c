/* reasoning.c -- <think> blocks out of a reply. See reasoning.h. */
#include "libcore/serving/reasoning.h"

#include <string.h>

static const char OPEN[] = "<think>", CLOSE[] = "</think>";

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int iflow_reasoning_detect(const char *text, size_t len)
{
    return text && memmem(text, len, OPEN, sizeof OPEN - 1) != NULL;
}

/* s [n] ends with `tag` once trailing whitespace is left out. */
static int ends_with(const char *s, size_t n, const char *tag)
{
    size_t k = strlen(tag);
    while (n && is_ws(s[n - 1]))
        n--;
    return n >= k && memcmp(s + n - k, tag, k) == 0;
}

int iflow_reasoning_split(const char *prompt, size_t plen, const char *text, size_t len, size_t *r_off, size_t *r_len,
                          size_t *c_off)
{
    *r_off = *r_len = *c_off = 0;
    size_t i = 0;
    while (i < len && is_ws(text[i]))
        i++;
    int inside = prompt && ends_with(prompt, plen, OPEN);
    if (!inside && len - i >= sizeof OPEN - 1 && memcmp(text + i, OPEN, sizeof OPEN - 1) == 0)
        inside = 1, i += sizeof OPEN - 1;
    if (!inside)
        return 0;
    const char *close = memmem(text + i, len - i, CLOSE, sizeof CLOSE - 1);
    size_t end = close ? (size_t)(close - text) : len, c = close ? end + sizeof CLOSE - 1 : len;
    while (i < end && is_ws(text[i]))
        i++;
    while (end > i && is_ws(text[end - 1]))
        end--;
    while (c < len && is_ws(text[c]))
        c++;
    *r_off = i, *r_len = end - i, *c_off = c;
    return 1;
}
