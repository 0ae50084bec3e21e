/* tok_charsmap.c -- SentencePiece's precompiled_charsmap (a darts-clone double-array trie of
 * UTF-8 prefixes and their NUL-terminated replacements), read with checked sizes, and the two
 * normalizers that apply it: SentencePiece's own (longest rule over the text, its whitespace
 * rules and dummy prefix, user-defined pieces copied as they are) and HF tokenizers'
 * Precompiled (per grapheme cluster under 6 bytes, else per character, first rule found). */
#include "libcore/base/error.h"
#include "libcore/base/util.h"
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define META "\xE2\x96\x81" /* U+2581, SentencePiece's escaped space */

/* ---- the blob ----------------------------------------------------------------------------- */

/* darts-clone's unit fields. */
static uint32_t unit_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }
static uint32_t unit_label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
static int unit_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static uint32_t unit_value(uint32_t u) { return u & ((1u << 31) - 1); }
static int unit_is_leaf(uint32_t u) { return (int)(u >> 31); }

static int bad_map(const char *name, size_t at, const char *what)
{
    return iflow_seterr(IFLOW_EFORMAT, "bad precompiled_charsmap in '%s' at byte %zu: %s", name, at, what);
}

/* Every leaf value must point into norm. */
static int check_leaves(const tok_charsmap *cm, size_t at, const char *name)
{
    for (size_t i = 0; i < cm->n_units; i++)
        if (unit_is_leaf(cm->units[i]) && unit_value(cm->units[i]) >= cm->norm_len)
            return iflow_seterr(IFLOW_EFORMAT,
                                "bad precompiled_charsmap in '%s' at byte %zu: unit %zu points at %u, past the %zu "
                                "bytes of replacements", name, at + 4 + 4 * i, i, unit_value(cm->units[i]), cm->norm_len);
    return 0;
}

/* <trie bytes: u32 LE> <trie units: u32 LE each> <replacements, each NUL-terminated> */
int tok_charsmap_parse(tok_charsmap *cm, const uint8_t *blob, size_t len, size_t at, const char *name)
{
    memset(cm, 0, sizeof *cm);
    if (len == 0)
        return 0;
    if (len <= 4)
        return bad_map(name, at, "shorter than its 4-byte header");
    uint32_t trie = rd_u32(blob);
    if (trie > len - 4 || trie == 0 || trie % 4)
        return iflow_seterr(IFLOW_EFORMAT, "bad precompiled_charsmap in '%s' at byte %zu: a trie of %u bytes in a blob of %zu",
                            name, at, trie, len);
    size_t n_norm = len - 4 - trie;
    const char *norm = (const char *)blob + 4 + trie;
    if (n_norm == 0 || norm[n_norm - 1] != 0)
        return bad_map(name, at + 4 + trie, "the replacements do not end with a NUL");
    for (size_t i = 0; i < n_norm;) {
        int32_t cp;
        i += (size_t)tok_utf8_next(norm + i, n_norm - i, &cp);
        if (cp < 0)
            return bad_map(name, at + 4 + trie + i - 1, "the replacements are not valid UTF-8");
    }
    cm->n_units = trie / 4;
    cm->norm_len = n_norm;
    if (!(cm->units = malloc(trie)) || !(cm->norm = malloc(n_norm))) {
        tok_charsmap_free(cm);
        return tok_nomem();
    }
    for (size_t i = 0; i < cm->n_units; i++)
        cm->units[i] = rd_u32(blob + 4 + 4 * i);
    memcpy(cm->norm, norm, n_norm);
    int rc = check_leaves(cm, at, name);
    if (rc < 0)
        tok_charsmap_free(cm);
    return rc;
}

void tok_charsmap_free(tok_charsmap *cm)
{
    free(cm->units);
    free(cm->norm);
    memset(cm, 0, sizeof *cm);
}

/* The rule for a prefix of s[0..n): the shortest one found (HF) or the longest (SentencePiece).
 * Returns its replacement's offset in cm->norm with *mlen its length in s, or -1. Every index is
 * checked: a malformed trie finds nothing rather than reading outside the units. */
static int64_t charsmap_find(const tok_charsmap *cm, const char *s, size_t n, int longest, size_t *mlen)
{
    int64_t found = -1;
    if (!cm->n_units)
        return -1;
    uint32_t id = unit_offset(cm->units[0]);
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        id ^= c;
        if (id >= cm->n_units || unit_label(cm->units[id]) != c)
            break;
        uint32_t u = cm->units[id];
        id ^= unit_offset(u);
        if (!unit_has_leaf(u) || id >= cm->n_units || unit_value(cm->units[id]) >= cm->norm_len)
            continue;
        found = unit_value(cm->units[id]);
        *mlen = i + 1;
        if (!longest)
            break;
    }
    return found;
}

/* ---- SentencePiece's normalizer --------------------------------------------------------- */

/* One normalization step at s[0..n) (n > 0), SentencePiece's NormalizePrefix: a user-defined
 * piece as it is, else the longest rule, else the character (an invalid byte: U+FFFD). */
static size_t spm_prefix(const tok_unigram *u, const char *s, size_t n, const char **rep, size_t *rep_len)
{
    size_t len = u->has_user ? tok_unigram_user_prefix(u, s, n) : 0, mlen = 0;
    int64_t at;
    if (len) {
        *rep = s;
        *rep_len = len;
        return len;
    }
    if ((at = charsmap_find(&u->cm, s, n, 1, &mlen)) >= 0) {
        *rep = u->cm.norm + at;
        *rep_len = strlen(*rep);
        return mlen;
    }
    int32_t cp;
    int k = tok_utf8_next(s, n, &cp);
    *rep = cp < 0 ? "\xEF\xBF\xBD" : s;
    *rep_len = cp < 0 ? 3 : (size_t)k;
    return (size_t)k;
}

/* Append rep, spaces escaped to U+2581 when asked. */
static int spm_put(const tok_unigram *u, const char *rep, size_t n, tok_buf *out)
{
    for (size_t i = 0; i < n; i++) {
        int rc = u->escape_ws && rep[i] == ' ' ? tok_buf_put(out, META, 3) : tok_buf_putc(out, rep[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Leading text that normalizes to exactly " " (dropped with remove_extra_whitespaces). */
static size_t spm_leading_space(const tok_unigram *u, const char *w, size_t len)
{
    size_t pos = 0;
    while (u->extra_ws && pos < len) {
        const char *rep;
        size_t rn, k = spm_prefix(u, w + pos, len - pos, &rep, &rn);
        if (rn != 1 || rep[0] != ' ')
            break;
        pos += k;
    }
    return pos;
}

/* Drop trailing escaped spaces (remove_extra_whitespaces). */
static void spm_trim_end(const tok_unigram *u, tok_buf *out, size_t start)
{
    const char *sp = u->escape_ws ? META : " ";
    size_t k = u->escape_ws ? 3 : 1;
    while (out->n - start >= k && memcmp(out->p + out->n - k, sp, k) == 0)
        out->n -= k;
    if (out->p)
        out->p[out->n] = 0;
}

int tok_norm_spm(const tok_unigram *u, const char *w, size_t len, tok_buf *out)
{
    size_t pos = spm_leading_space(u, w, len), start = out->n;
    int prev_space = u->extra_ws, rc = 0;
    if (pos == len)
        return 0;
    if (u->dummy_prefix && (rc = spm_put(u, " ", 1, out)) < 0)
        return rc;
    while (pos < len) {
        const char *rep;
        size_t rn, k = spm_prefix(u, w + pos, len - pos, &rep, &rn);
        while (prev_space && rn && rep[0] == ' ')
            rep++, rn--;
        if (rn) {
            if ((rc = spm_put(u, rep, rn, out)) < 0)
                return rc;
            prev_space = rep[rn - 1] == ' ';
        }
        pos += k;
        prev_space = u->extra_ws && prev_space;
    }
    if (u->extra_ws)
        spm_trim_end(u, out, start);
    return 0;
}

/* ---- HF tokenizers' Precompiled -------------------------------------------------------- */

/* cm's rule for all of s[0..n) as spm_precompiled's transform() finds it: the first (shortest)
 * rule that is a prefix of it -- the rest of the chunk is then dropped, as HF does. */
static int put_first_rule(const tok_charsmap *cm, const char *s, size_t n, tok_buf *out, int *found)
{
    size_t mlen;
    int64_t at = charsmap_find(cm, s, n, 0, &mlen);
    *found = at >= 0;
    return *found ? tok_buf_put(out, cm->norm + at, strlen(cm->norm + at)) : 0;
}

/* End of the extended grapheme cluster that starts at s[0] (valid UTF-8). */
static size_t grapheme_end(const char *s, size_t n)
{
    utf8proc_int32_t state = 0, prev;
    int32_t cp;
    size_t i = (size_t)tok_utf8_next(s, n, &prev);
    while (i < n) {
        int k = tok_utf8_next(s + i, n - i, &cp);
        if (utf8proc_grapheme_break_stateful(prev, cp, &state))
            break;
        prev = cp;
        i += (size_t)k;
    }
    return i;
}

static int put_chars(const tok_charsmap *cm, const char *g, size_t n, tok_buf *out)
{
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = tok_utf8_next(g + i, n - i, &cp), found;
        int rc = put_first_rule(cm, g + i, (size_t)k, out, &found);
        if (rc == 0 && !found)
            rc = tok_buf_put(out, g + i, (size_t)k);
        if (rc < 0)
            return rc;
        i += (size_t)k;
    }
    return 0;
}

int tok_norm_precompiled(const tok_charsmap *cm, tok_scratch *s, const char *w, size_t len, tok_buf *out)
{
    if (tok_utf8_sanitize(w, len, &s->word) < 0)
        return IFLOW_ENOMEM;
    const char *v = s->word.p;
    for (size_t i = 0, n = s->word.n; i < n;) {
        size_t g = grapheme_end(v + i, n - i);
        int found = 0, rc = g < 6 ? put_first_rule(cm, v + i, g, out, &found) : 0;
        if (rc == 0 && !found)
            rc = put_chars(cm, v + i, g, out);
        if (rc < 0)
            return rc;
        i += g;
    }
    return 0;
}

/* ---- base64 -------------------------------------------------------------------------------- */

static int b64val(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

int tok_base64(const char *s, size_t n, tok_buf *out)
{
    uint32_t acc = 0;
    int bits = 0;
    while (n && s[n - 1] == '=')
        n--;
    for (size_t i = 0; i < n; i++) {
        int v = b64val(s[i]);
        if (v < 0)
            return iflow_seterr(IFLOW_EFORMAT, "bad base64 character at offset %zu", i);
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (tok_buf_putc(out, (char)(acc >> bits & 0xFF)) < 0)
                return IFLOW_ENOMEM;
        }
    }
    return 0;
}
