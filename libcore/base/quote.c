/* quote.c -- see quote.h. */
#include "quote.h"

#include <string.h>

const char *iflow_quoten(const char *s, size_t n)
{
    static _Thread_local char ring[IFLOW_QUOTE_RING][IFLOW_QUOTE_MAX + 1];
    static _Thread_local unsigned next;
    char *out = ring[next++ % IFLOW_QUOTE_RING];
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        size_t need = c < 0x20 || c == 0x7f ? 4 : 1;
        if (o + need > IFLOW_QUOTE_MAX - 3) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (need == 4) {
            out[o++] = '\\', out[o++] = 'x', out[o++] = hex[c >> 4], out[o++] = hex[c & 15];
        } else {
            out[o++] = (char)c;
        }
    }
    out[o] = 0;
    return out;
}

const char *iflow_quote(const char *s)
{
    return s ? iflow_quoten(s, strlen(s)) : "(null)";
}
