/* tok_norm.c -- normalizer steps: Prepend, Replace, NFC/NFD/NFKC/NFKD, Lowercase, Strip,
 * StripAccents and BertNormalizer, with HF tokenizers' semantics; Precompiled and
 * SentencePiece's own normalizer are tok_charsmap.c's. */
#include "libcore/base/error.h"
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static int prepend(const tok_norm *n, const char *w, size_t len, tok_buf *out)
{
    if (len == 0)
        return 0;
    if (tok_buf_put(out, n->a, n->alen) < 0)
        return IFLOW_ENOMEM;
    return tok_buf_put(out, w, len);
}

static int replace_literal(const tok_norm *n, const char *w, size_t len, tok_buf *out)
{
    size_t i = 0;
    while (n->alen && i < len) {
        const char *hit = memmem(w + i, len - i, n->a, n->alen);
        size_t at = hit ? (size_t)(hit - w) : len;
        if (tok_buf_put(out, w + i, at - i) < 0)
            return IFLOW_ENOMEM;
        if (!hit)
            return 0;
        if (tok_buf_put(out, n->b, n->blen) < 0)
            return IFLOW_ENOMEM;
        i = at + n->alen;
    }
    return tok_buf_put(out, w + i, len - i);
}

static int replace_regex(const tok_norm *n, tok_scratch *s, const char *w, size_t len, tok_buf *out)
{
    if (!s->md && !(s->md = pcre2_match_data_create(1, NULL)))
        return tok_nomem();
    size_t pos = 0, prev = 0;
    while (pos < len) {
        int rc = pcre2_match(n->re, (PCRE2_SPTR)w, len, pos, 0, s->md, NULL);
        if (rc < 0)
            break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        if (ov[1] <= ov[0]) {
            int32_t cp;
            pos = ov[0] + (size_t)tok_utf8_next(w + ov[0], len - ov[0], &cp);
            continue;
        }
        if (tok_buf_put(out, w + prev, ov[0] - prev) < 0 || tok_buf_put(out, n->b, n->blen) < 0)
            return IFLOW_ENOMEM;
        prev = pos = ov[1];
    }
    return tok_buf_put(out, w + prev, len - prev);
}

static int unicode_form(int kind, tok_scratch *s, const char *w, size_t len, tok_buf *out)
{
    static const int opts[] = {
        [NORM_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
        [NORM_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        [NORM_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        [NORM_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
    };
    utf8proc_uint8_t *res = NULL;
    if (tok_utf8_sanitize(w, len, &s->word) < 0)
        return IFLOW_ENOMEM;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s->word.p, (utf8proc_ssize_t)s->word.n, &res,
                                      (utf8proc_option_t)opts[kind]);
    if (n < 0)
        return iflow_seterr(n == UTF8PROC_ERROR_NOMEM ? IFLOW_ENOMEM : IFLOW_EINVAL, "unicode normalization failed: %s",
                            utf8proc_errmsg(n));
    int rc = tok_buf_put(out, res, (size_t)n);
    free(res);
    return rc;
}

/* Rust's char::to_lowercase: the simple mapping, except U+0130 -> "i\u0307". */
static int put_lower(tok_buf *out, int32_t cp)
{
    if (cp == 0x130)
        return tok_buf_put(out, "i\xCC\x87", 3);
    return tok_buf_put_cp(out, utf8proc_tolower(cp));
}

static int lowercase(const char *w, size_t len, tok_buf *out)
{
    for (size_t i = 0; i < len;) {
        int32_t cp;
        int k = tok_utf8_next(w + i, len - i, &cp);
        int rc = cp < 0 ? tok_buf_put(out, w + i, 1) : put_lower(out, cp);
        if (rc < 0)
            return rc;
        i += (size_t)k;
    }
    return 0;
}

/* Byte length of the whitespace run at the start of w. */
static size_t leading_space(const char *w, size_t len)
{
    size_t i = 0;
    while (i < len) {
        int32_t cp;
        int k = tok_utf8_next(w + i, len - i, &cp);
        if (!tok_is_space(cp))
            break;
        i += (size_t)k;
    }
    return i;
}

/* Byte length of the whitespace run at the end of w. */
static size_t trailing_space(const char *w, size_t len)
{
    size_t i = 0, run = len;
    while (i < len) {
        int32_t cp;
        int k = tok_utf8_next(w + i, len - i, &cp);
        if (!tok_is_space(cp))
            run = len;
        else if (run == len)
            run = i;
        i += (size_t)k;
    }
    return len - run;
}

static int strip(const tok_norm *n, const char *w, size_t len, tok_buf *out)
{
    size_t a = n->left ? leading_space(w, len) : 0;
    size_t b = n->right ? trailing_space(w + a, len - a) : 0;
    return tok_buf_put(out, w + a, len - a - b);
}

static int is_mark(int32_t cp, int nonspacing_only)
{
    utf8proc_category_t k = utf8proc_category(cp);
    return k == UTF8PROC_CATEGORY_MN || (!nonspacing_only && (k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME));
}

/* Drop marks (after NFD, for BERT). */
static int strip_marks(const char *w, size_t len, int nonspacing_only, tok_buf *out)
{
    for (size_t i = 0; i < len;) {
        int32_t cp;
        int k = tok_utf8_next(w + i, len - i, &cp);
        if ((cp < 0 || !is_mark(cp, nonspacing_only)) && tok_buf_put(out, w + i, (size_t)k) < 0)
            return IFLOW_ENOMEM;
        i += (size_t)k;
    }
    return 0;
}

/* BERT: Cc/Cf/Cn/Co/Cs other than \t \n \r are dropped. */
static int bert_is_control(int32_t cp)
{
    if (cp == '\t' || cp == '\n' || cp == '\r')
        return 0;
    utf8proc_category_t k = utf8proc_category(cp);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CN ||
           k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CS;
}

static int is_chinese(int32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static int put_spaced(tok_buf *out, int32_t cp)
{
    if (tok_buf_putc(out, ' ') < 0 || tok_buf_put_cp(out, cp) < 0)
        return IFLOW_ENOMEM;
    return tok_buf_putc(out, ' ');
}

/* clean_text + handle_chinese_chars on valid UTF-8. */
static int bert_clean(const tok_norm *n, const char *w, size_t len, tok_buf *out)
{
    for (size_t i = 0; i < len;) {
        int32_t cp;
        int k = tok_utf8_next(w + i, len - i, &cp);
        int rc = 0;
        i += (size_t)k;
        if (n->clean && (cp == 0 || cp == 0xFFFD || bert_is_control(cp)))
            continue;
        if (n->clean && tok_is_space(cp))
            rc = tok_buf_putc(out, ' ');
        else if (n->chinese && is_chinese(cp))
            rc = put_spaced(out, cp);
        else
            rc = tok_buf_put_cp(out, cp);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* BertNormalizer: clean text, space out CJK, strip accents (NFD, drop Mn), lowercase. */
static int bert(const tok_norm *n, tok_scratch *s, const char *w, size_t len, tok_buf *out)
{
    tok_buf a = {0}, b = {0};
    int rc = tok_utf8_sanitize(w, len, &a);
    if (rc == 0)
        rc = bert_clean(n, a.p, a.n, &b);
    if (rc == 0 && n->strip_accents) {
        a.n = 0;
        rc = unicode_form(NORM_NFD, s, b.p ? b.p : "", b.n, &a);
        b.n = 0;
        if (rc == 0)
            rc = strip_marks(a.p ? a.p : "", a.n, 1, &b);
    }
    if (rc == 0)
        rc = n->lower ? lowercase(b.p ? b.p : "", b.n, out) : tok_buf_put(out, b.p, b.n);
    free(a.p);
    free(b.p);
    return rc;
}

static int apply(const tok_norm *n, tok_scratch *s, const char *w, size_t len, tok_buf *out)
{
    switch (n->kind) {
    case NORM_PREPEND: return prepend(n, w, len, out);
    case NORM_REPLACE: return n->re ? replace_regex(n, s, w, len, out) : replace_literal(n, w, len, out);
    case NORM_NFC:
    case NORM_NFD:
    case NORM_NFKC:
    case NORM_NFKD: return unicode_form(n->kind, s, w, len, out);
    case NORM_LOWER: return lowercase(w, len, out);
    case NORM_STRIP: return strip(n, w, len, out);
    case NORM_STRIP_ACCENTS: return strip_marks(w, len, 0, out);
    case NORM_BERT: return bert(n, s, w, len, out);
    case NORM_PRECOMPILED: return tok_norm_precompiled(n->cm, s, w, len, out);
    case NORM_SPM: return tok_norm_spm(n->uni, w, len, out);
    }
    return iflow_seterr(IFLOW_EINVAL, "bad normalizer step %d", n->kind);
}

int tok_norm_run(const iflow_tokenizer *t, tok_scratch *s, const char *text, size_t len, const char **out,
                 size_t *out_len)
{
    const char *cur = text;
    size_t n = len;
    for (int i = 0; i < t->n_norm; i++) {
        tok_buf *dst = cur == s->na.p ? &s->nb : &s->na;
        dst->n = 0;
        int rc = apply(&t->norm[i], s, cur, n, dst);
        if (rc < 0 || (rc = tok_buf_put(dst, "", 0)) < 0)
            return rc;
        cur = dst->p;
        n = dst->n;
    }
    *out = cur;
    *out_len = n;
    return 0;
}

void tok_norm_free(tok_norm *n)
{
    free(n->a);
    free(n->b);
    if (n->cm)
        tok_charsmap_free(n->cm);
    free(n->cm);
    if (n->re)
        pcre2_code_free(n->re);
}

static char *dup_bytes(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        if (n)
            memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

int tok_norm_add(iflow_tokenizer *t, const tok_norm *step)
{
    tok_norm n = *step;
    n.a = step->a ? dup_bytes(step->a, step->alen) : NULL;
    n.b = step->b ? dup_bytes(step->b, step->blen) : NULL;
    tok_norm *v = realloc(t->norm, (size_t)(t->n_norm + 1) * sizeof *v);
    if ((step->a && !n.a) || (step->b && !n.b) || !v) {
        free(n.a);
        free(n.b);
        if (v)
            t->norm = v;
        return tok_nomem();
    }
    t->norm = v;
    t->norm[t->n_norm++] = n;
    return 0;
}
