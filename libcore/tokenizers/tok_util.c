/* tok_util.c -- growable buffers, UTF-8 and Unicode predicates for the tokenizer. */
#include "libcore/base/error.h"
#include "tok_internal.h"
#include "libcore/base/utf8.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

int tok_nomem(void)
{
    return iflow_seterr(IFLOW_ENOMEM, "out of memory in the tokenizer");
}

/* Grow *p (elements of `size` bytes) so that it holds at least `need` elements. */
int tok_grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    if (c > SIZE_MAX / size)
        return tok_nomem();
    void *q = realloc(*p, c * size);
    if (!q)
        return tok_nomem();
    *p = q;
    *cap = c;
    return 0;
}

int tok_buf_put(tok_buf *b, const void *s, size_t n)
{
    if (tok_grow((void **)&b->p, &b->cap, b->n + n + 1, 1) < 0)
        return IFLOW_ENOMEM;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int tok_buf_putc(tok_buf *b, char c)
{
    return tok_buf_put(b, &c, 1);
}

int tok_buf_put_cp(tok_buf *b, int32_t cp)
{
    utf8proc_uint8_t u[4];
    utf8proc_ssize_t n = utf8proc_encode_char(cp, u);
    return tok_buf_put(b, u, (size_t)n);
}

int tok_ids_push(tok_ids *v, int32_t id)
{
    if (tok_grow((void **)&v->p, &v->cap, v->n + 1, sizeof *v->p) < 0)
        return IFLOW_ENOMEM;
    v->p[v->n++] = id;
    return 0;
}

int tok_spans_push(tok_spans *v, size_t off, size_t len)
{
    if (tok_grow((void **)&v->p, &v->cap, v->n + 1, sizeof *v->p) < 0)
        return IFLOW_ENOMEM;
    v->p[v->n++] = (tok_span){off, len};
    return 0;
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

int tok_utf8_next(const char *str, size_t n, int32_t *cp)
{
    uint32_t c;
    int len = iflow_utf8_decode(str, n, &c);
    *cp = len > 0 ? (int32_t)c : -1;
    return len > 0 ? len : 1; /* a bad byte is passed one at a time */
}

int tok_utf8_sanitize(const char *s, size_t n, tok_buf *out)
{
    out->n = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = tok_utf8_next(s + i, n - i, &cp);
        int rc = cp < 0 ? tok_buf_put(out, "\xEF\xBF\xBD", 3) : tok_buf_put(out, s + i, (size_t)k);
        if (rc < 0)
            return rc;
        i += (size_t)k;
    }
    return tok_buf_put(out, "", 0);
}

int tok_is_space(int32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

int tok_is_punct(int32_t c)
{
    if (c < 0)
        return 0;
    if (c < 0x80)
        return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* ---- GPT-2 byte <-> unicode map ------------------------------------------------------------
 * Printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to themselves; the other 68 bytes map,
 * in byte order, to U+0100..U+0143. */

static int printable(int b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

int32_t tok_byte_to_cp(uint8_t b)
{
    if (printable(b))
        return b;
    if (b <= 0x20)
        return 256 + b;
    if (b <= 0xA0)
        return 256 + 33 + (b - 0x7F);
    return 256 + 67; /* 0xAD */
}

int tok_cp_to_byte(int32_t cp)
{
    if (cp >= 0 && cp < 256)
        return printable(cp) ? cp : -1;
    if (cp < 256 || cp >= 256 + 68)
        return -1;
    int n = cp - 256;
    if (n <= 32)
        return n;
    if (n <= 66)
        return 0x7F + (n - 33);
    return 0xAD;
}
