/*
 * utf8.h -- one UTF-8 decoder for the library (header-only: the tokenizers call it per character).
 *
 * Contract
 *   iflow_utf8_decode(s, n, &cp), n >= 1: the length (1 to 4) of the well-formed UTF-8 sequence
 *   at s and its code point in *cp; or, when s does not start one, minus the length of its
 *   maximal invalid subpart (the lead byte and the continuation bytes that could still have
 *   followed it; Unicode's "maximal subpart", what Python's decode(errors="replace") makes one
 *   U+FFFD of), *cp untouched. Well-formed: no overlong forms, no surrogates, nothing past
 *   U+10FFFF, nothing cut by the end at s + n.
 */
#ifndef IFLOW_UTF8_H
#define IFLOW_UTF8_H

#include <stddef.h>
#include <stdint.h>

static inline int iflow_utf8_decode(const char *str, size_t n, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)str;
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
    if (len == 1) {
        *cp = c;
        return 1;
    }
    if (len == 0)
        return -1;
    /* the second byte's range narrows after E0, ED, F0, F4 */
    unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    uint32_t v = c & (0x7Fu >> len);
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n || s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xBF))
            return -i;
        v = v << 6 | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

#endif
