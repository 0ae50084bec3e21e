/* tokenizer.c -- see tokenizer.h: vocabulary storage, added tokens, the encode pipeline and
 * decoding. Loaders are in tok_hfjson.c / tok_gguf.c / tok_open.c, the steps in tok_*.c. */
#include "tokenizer.h"
#include "libcore/base/error.h"
#include "tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- building ----------------------------------------------------------------------------- */

int tok_new(iflow_tokenizer **out, const char *name)
{
    iflow_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(name ? name : "<memory>"))) {
        free(t);
        return tok_nomem();
    }
    t->bos = t->eos = t->unk = -1;
    t->wp_max_chars = 100;
    for (int b = 0; b < 256; b++)
        t->byte_tok[b] = -1;
    *out = t;
    return 0;
}

int tok_vocab_alloc(iflow_tokenizer *t, int32_t n, size_t bytes)
{
    if (n <= 0)
        return iflow_seterr(IFLOW_EFORMAT, "empty vocabulary in '%s'", t->name);
    if (bytes > UINT32_MAX)
        return iflow_seterr(IFLOW_EFORMAT, "vocabulary text of %zu bytes is too large in '%s'", bytes, t->name);
    t->n_vocab = n;
    t->tok_off = calloc((size_t)n, sizeof *t->tok_off);
    t->tok_len = calloc((size_t)n, sizeof *t->tok_len);
    t->attr = malloc((size_t)n);
    t->arena = malloc(bytes + 1);
    if (!t->tok_off || !t->tok_len || !t->attr || !t->arena)
        return tok_nomem();
    memset(t->attr, TOK_UNUSED, (size_t)n);
    return 0;
}

void tok_vocab_set(iflow_tokenizer *t, int32_t id, const char *s, size_t len, size_t *pos, int attr)
{
    if (len)
        memcpy(t->arena + *pos, s, len);
    t->tok_off[id] = (uint32_t)*pos;
    t->tok_len[id] = (uint32_t)len;
    t->attr[id] = (uint8_t)attr;
    *pos += len;
}

static int index_bytes(iflow_tokenizer *t)
{
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_tok[b] = iflow_strmap_get(&t->vocab, name, 6);
    }
    return 0;
}

int tok_meta_inside(const char *s, size_t n)
{
    for (const char *p = s + 1; n > 3 && (p = memmem(p, n - (size_t)(p - s), "\xE2\x96\x81", 3)); p++)
        if (p - s < 3 || memcmp(p - 3, "\xE2\x96\x81", 3) != 0)
            return 1;
    return 0;
}

/* Is there a token with U+2581 right after a character other than U+2581? */
static int meta_inside(const iflow_tokenizer *t)
{
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (tok_meta_inside(tok_text(t, id), t->tok_len[id]))
            return 1;
    return 0;
}

int tok_vocab_index(iflow_tokenizer *t)
{
    t->split_meta = !meta_inside(t);
    if (iflow_strmap_reserve(&t->vocab, (size_t)t->n_vocab) < 0)
        return IFLOW_ENOMEM;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->tok_len[id] && iflow_strmap_put(&t->vocab, tok_text(t, id), t->tok_len[id], id) < 0)
            return IFLOW_ENOMEM;
        t->max_token_len = t->tok_len[id] > t->max_token_len ? t->tok_len[id] : t->max_token_len;
    }
    return index_bytes(t);
}

int tok_add_added(iflow_tokenizer *t, int32_t id, int special, int lstrip, int rstrip, int single_word)
{
    if (id < 0 || id >= t->n_vocab || t->tok_len[id] == 0)
        return 0;
    tok_added *a = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *a);
    if (!a)
        return tok_nomem();
    t->added = a;
    t->added[t->n_added++] = (tok_added){id, t->tok_len[id], (uint8_t)tok_text(t, id)[0], (uint8_t)special,
                                         (uint8_t)lstrip, (uint8_t)rstrip, (uint8_t)single_word};
    return 0;
}

static int added_cmp(const void *pa, const void *pb)
{
    const tok_added *a = pa, *b = pb;
    if (a->first != b->first)
        return a->first - b->first;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    return a->id - b->id;
}

int tok_sort_added(iflow_tokenizer *t)
{
    if (t->n_added > 1)
        qsort(t->added, (size_t)t->n_added, sizeof *t->added, added_cmp);
    int k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < t->n_added && t->added[k].first < b)
            k++;
        t->added_at[b] = k;
    }
    return 0;
}

void tok_scratch_free(tok_scratch *s)
{
    free(s->na.p);
    free(s->nb.p);
    free(s->text.p);
    free(s->text2.p);
    free(s->spans.p);
    free(s->spans2.p);
    free(s->pieces);
    free(s->word.p);
    free(s->syms);
    free(s->heap);
    free(s->rev.p);
    free(s->best);
    if (s->md)
        pcre2_match_data_free(s->md);
    if (s->mctx)
        pcre2_match_context_free(s->mctx);
    if (s->jit)
        pcre2_jit_stack_free(s->jit);
}

void iflow_tokenizer_close(iflow_tokenizer *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n_norm; i++)
        tok_norm_free(&t->norm[i]);
    for (int i = 0; i < t->n_pre; i++)
        tok_pre_free(&t->pre[i]);
    free(t->norm);
    free(t->pre);
    free(t->added);
    free(t->arena);
    free(t->tok_off);
    free(t->tok_len);
    free(t->attr);
    free(t->scores);
    tok_unigram_free(t->uni);
    iflow_strmap_free(&t->vocab);
    iflow_u64map_free(&t->merges);
    free(t->name);
    free(t);
}

/* ---- added tokens ------------------------------------------------------------------------- */

static int is_word_char(int32_t cp)
{
    if (cp < 0)
        return 0;
    utf8proc_category_t k = utf8proc_category(cp);
    return cp == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_NO);
}

/* Code point ending just before byte i of text (i > 0), -1 if invalid. */
static int32_t cp_before(const char *text, size_t i)
{
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)text[j] & 0xC0) == 0x80 && i - j < 4)
        j--;
    int32_t cp;
    return (size_t)tok_utf8_next(text + j, i - j, &cp) == i - j ? cp : -1;
}

static int whole_word(const char *text, size_t n, size_t s, size_t e)
{
    int32_t cp = -1;
    if (s > 0 && is_word_char(cp_before(text, s)))
        return 0;
    if (e < n)
        tok_utf8_next(text + e, n - e, &cp);
    return e >= n || !is_word_char(cp);
}

/* Grow [*s, *e) over whitespace: left down to `from`, right up to n. */
static void strip_around(const tok_added *a, const char *text, size_t from, size_t n, size_t *s, size_t *e)
{
    while (a->lstrip && *s > from) {
        int32_t cp = cp_before(text, *s);
        if (!tok_is_space(cp))
            break;
        utf8proc_uint8_t u[4];
        *s -= (size_t)utf8proc_encode_char(cp, u);
    }
    while (a->rstrip && *e < n) {
        int32_t cp;
        int k = tok_utf8_next(text + *e, n - *e, &cp);
        if (!tok_is_space(cp))
            break;
        *e += (size_t)k;
    }
}

/* The added token starting at byte i, or NULL. */
static const tok_added *added_at(const iflow_tokenizer *t, const char *text, size_t n, size_t i, int parse_special)
{
    uint8_t b = (uint8_t)text[i];
    for (int k = t->added_at[b]; k < t->added_at[b + 1]; k++) {
        const tok_added *a = &t->added[k];
        size_t len = a->len;
        if ((a->special && !parse_special) || len > n - i || memcmp(text + i, tok_text(t, a->id), len) != 0)
            continue;
        if (a->single_word && !whole_word(text, n, i, i + len))
            continue;
        return a;
    }
    return NULL;
}

/* Leftmost-longest added token in text[from, n): 1 with its (stripped) extent, else 0. */
static int next_added(const iflow_tokenizer *t, const char *text, size_t n, size_t from, int parse_special,
                      size_t *s, size_t *e, int32_t *id)
{
    for (size_t i = from; i < n; i++) {
        uint8_t b = (uint8_t)text[i];
        if (t->added_at[b] == t->added_at[b + 1])
            continue;
        const tok_added *a = added_at(t, text, n, i, parse_special);
        if (a) {
            *s = i;
            *e = i + t->tok_len[a->id];
            *id = a->id;
            strip_around(a, text, from, n, s, e);
            return 1;
        }
    }
    return 0;
}

/* ---- encoding ----------------------------------------------------------------------------- */

static int encode_word(const iflow_tokenizer *t, tok_scratch *s, const char *w, size_t len, tok_ids *out)
{
    switch (t->model) {
    case TOK_MODEL_WORDPIECE: return tok_wordpiece_word(t, s, w, len, out);
    case TOK_MODEL_UNIGRAM: return tok_unigram_word(t, s, w, len, out);
    }
    return tok_bpe_word(t, s, w, len, out);
}

/* Marian's language code: ">>xx<<" at the start of a segment is one token (its id in the
 * vocabulary, else <unk>), taken off before the text; returns the bytes it took. */
static size_t lang_code(const iflow_tokenizer *t, const char *seg, size_t n, tok_ids *out, int *rc)
{
    const char *end = n >= 4 && memcmp(seg, ">>", 2) == 0 ? memmem(seg + 2, n - 2, "<<", 2) : NULL;
    if (!t->lang_codes || !end)
        return 0;
    size_t len = (size_t)(end - seg) + 2;
    int32_t id = iflow_strmap_get(&t->vocab, seg, len);
    *rc = tok_ids_push(out, id >= 0 ? id : t->unk);
    return len;
}

static int encode_raw(const iflow_tokenizer *t, tok_scratch *s, const char *seg, size_t n, int first, tok_ids *out)
{
    const char *norm;
    size_t nn;
    int rc = 0;
    size_t code = lang_code(t, seg, n, out, &rc);
    if (rc < 0 || (rc = tok_norm_run(t, s, seg + code, n - code, &norm, &nn)) < 0 ||
        (rc = tok_pretok_run(t, s, norm, nn, first)) < 0)
        return rc;
    for (size_t i = 0; i < s->spans.n; i++)
        if ((rc = encode_word(t, s, s->text.p + s->spans.p[i].off, s->spans.p[i].len, out)) < 0)
            return rc;
    return 0;
}

static int push_all(tok_ids *out, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (tok_ids_push(out, ids[i]) < 0)
            return IFLOW_ENOMEM;
    return 0;
}

static int encode_all(const iflow_tokenizer *t, tok_scratch *s, const char *text, size_t len, int flags, tok_ids *out)
{
    int rc = flags & IFLOW_TOK_ADD_BOS ? push_all(out, t->prefix, t->n_prefix) : 0;
    for (size_t pos = 0; rc == 0 && pos < len;) {
        size_t ms = len, me = len;
        int32_t id = -1;
        int found = t->n_added && next_added(t, text, len, pos, flags & IFLOW_TOK_PARSE_SPECIAL, &ms, &me, &id);
        if (ms > pos)
            rc = encode_raw(t, s, text + pos, ms - pos, pos == 0, out);
        if (rc == 0 && found)
            rc = tok_ids_push(out, id);
        pos = me;
    }
    if (rc == 0 && (flags & IFLOW_TOK_ADD_BOS))
        rc = push_all(out, t->suffix, t->n_suffix);
    return rc;
}

int iflow_tokenizer_encode(const iflow_tokenizer *t, const char *text, size_t len, int flags, int32_t **ids,
                           size_t *n_ids)
{
    if (!t || !ids || !n_ids || (!text && len))
        return iflow_seterr(IFLOW_EINVAL, "iflow_tokenizer_encode: null argument");
    tok_ids out = {0};
    tok_scratch s = {0};
    int rc = encode_all(t, &s, text, len, flags, &out);
    tok_scratch_free(&s);
    *ids = NULL;
    *n_ids = 0;
    if (rc < 0) {
        free(out.p);
        return iflow_preperr(rc, "cannot tokenize text with '%s'", t->name);
    }
    if (out.n) {
        *ids = out.p;
        *n_ids = out.n;
    } else {
        free(out.p);
    }
    return 0;
}

/* ---- decoding ----------------------------------------------------------------------------- */

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The byte of a "<0xXX>" token, or -1. */
static int byte_of(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>' || hexval(s[3]) < 0 || hexval(s[4]) < 0)
        return -1;
    return hexval(s[3]) * 16 + hexval(s[4]);
}

/* GPT-2 code points back to bytes; a token with a code point outside the map stays as is. */
static int put_bytelevel(tok_buf *out, const char *s, size_t n)
{
    size_t start = out->n;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = tok_utf8_next(s + i, n - i, &cp);
        int b = tok_cp_to_byte(cp);
        if (b < 0) {
            out->n = start;
            return tok_buf_put(out, s, n);
        }
        if (tok_buf_putc(out, (char)b) < 0)
            return IFLOW_ENOMEM;
        i += (size_t)k;
    }
    return 0;
}

static int put_metaspace(tok_buf *out, const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int is_meta = n - i >= 3 && memcmp(s + i, "\xE2\x96\x81", 3) == 0;
        if ((is_meta ? tok_buf_putc(out, ' ') : tok_buf_put(out, s + i, 1)) < 0)
            return IFLOW_ENOMEM;
        i += is_meta ? 3 : 1;
    }
    return 0;
}

/* Replace every `from` by `to` in out[start..]. */
static void replace_tail(tok_buf *out, size_t start, const char *from, const char *to)
{
    size_t fl = strlen(from), tl = strlen(to);
    for (size_t i = start; i + fl <= out->n;) {
        if (memcmp(out->p + i, from, fl) != 0) {
            i++;
            continue;
        }
        memmove(out->p + i + tl, out->p + i + fl, out->n - i - fl); /* tl <= fl */
        memcpy(out->p + i, to, tl);
        out->n -= fl - tl;
        i += tl;
    }
}

static void wordpiece_cleanup(tok_buf *out, size_t start)
{
    static const char *const rules[][2] = {
        {" .", "."},      {" ?", "?"},   {" !", "!"},   {" ,", ","},   {" ' ", "'"},  {" n't", "n't"},
        {" 'm", "'m"},    {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        replace_tail(out, start, rules[i][0], rules[i][1]);
}

static int put_wordpiece(const iflow_tokenizer *t, tok_buf *out, const char *s, size_t n, int first)
{
    size_t start = out->n;
    int cont = !first && n >= t->wp_prefix_len && memcmp(s, t->wp_prefix, t->wp_prefix_len) == 0;
    int rc = 0;
    if (cont)
        rc = tok_buf_put(out, s + t->wp_prefix_len, n - t->wp_prefix_len);
    else if ((rc = first ? 0 : tok_buf_putc(out, ' ')) == 0)
        rc = tok_buf_put(out, s, n);
    if (rc == 0 && t->dec_cleanup)
        wordpiece_cleanup(out, start);
    return rc;
}

static int put_normal(const iflow_tokenizer *t, tok_buf *out, const char *s, size_t n, int first)
{
    if (t->dec_bytelevel)
        return put_bytelevel(out, s, n);
    if (t->dec_wordpiece)
        return put_wordpiece(t, out, s, n, first);
    if (t->dec_metaspace)
        return put_metaspace(out, s, n);
    return tok_buf_put(out, s, n);
}

/* Is id a token that decodes to nothing? */
static int is_hidden(const iflow_tokenizer *t, int32_t id)
{
    int a = t->attr[id];
    return a == TOK_CONTROL || a == TOK_UNKNOWN || a == TOK_UNUSED;
}

static int piece_into(const iflow_tokenizer *t, int32_t id, int first, tok_buf *out)
{
    if (id < 0 || id >= t->n_vocab)
        return iflow_seterr(IFLOW_ERANGE, "token id %d is outside the vocabulary (%d) of '%s'", id, t->n_vocab, t->name);
    const char *s = tok_text(t, id);
    size_t n = t->tok_len[id], start = out->n;
    int byte = t->attr[id] == TOK_BYTE ? byte_of(s, n) : -1, rc;
    if (is_hidden(t, id))
        return 0;
    if (byte >= 0)
        rc = tok_buf_putc(out, (char)byte);
    else if (t->attr[id] == TOK_USER && t->user_raw)
        rc = tok_buf_put(out, s, n);
    else
        rc = put_normal(t, out, s, n, first);
    if (rc == 0 && first && (t->dec_strip_first || t->dec_strip_empty) && out->n > start && out->p[start] == ' ') {
        memmove(out->p + start, out->p + start + 1, out->n - start - 1);
        out->n--;
    }
    if (rc == 0 && out->p)
        out->p[out->n] = 0; /* edits above may have shortened the text */
    return rc;
}

int iflow_tokenizer_piece(const iflow_tokenizer *t, int32_t id, int first, char *buf, size_t cap)
{
    tok_buf b = {0};
    if (!t || (!buf && cap))
        return iflow_seterr(IFLOW_EINVAL, "iflow_tokenizer_piece: null argument");
    int rc = piece_into(t, id, first, &b);
    if (rc == 0) {
        size_t n = b.n < cap ? b.n : cap;
        if (n)
            memcpy(buf, b.p, n);
        rc = n > INT32_MAX ? INT32_MAX : (int)n;
    }
    free(b.p);
    return rc;
}

/* Drop the spaces at the end of b (and at its start when `start`). */
static void trim_spaces(tok_buf *b, int start)
{
    size_t lead = 0;
    while (b->n && b->p[b->n - 1] == ' ')
        b->n--;
    while (start && lead < b->n && b->p[lead] == ' ')
        lead++;
    memmove(b->p, b->p + lead, b->n - lead);
    b->n -= lead;
    b->p[b->n] = 0;
}

int iflow_tokenizer_decode(const iflow_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len)
{
    return iflow_tokenizer_continuation(t, ids, n, 1, text, len);
}

int iflow_tokenizer_continuation(const iflow_tokenizer *t, const int32_t *ids, size_t n, int starts, char **text,
                                 size_t *len)
{
    tok_buf b = {0};
    if (!t || !text || (!ids && n))
        return iflow_seterr(IFLOW_EINVAL, "iflow_tokenizer_decode: null argument");
    int first = starts, rc = tok_buf_put(&b, "", 0);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        rc = piece_into(t, ids[i], first, &b);
        if (rc == 0 && !is_hidden(t, ids[i]))
            first = t->dec_strip_empty && b.n == 0 ? first : 0;
    }
    if (rc < 0) {
        free(b.p);
        *text = NULL;
        return rc;
    }
    if (t->dec_trim)
        trim_spaces(&b, starts);
    *text = b.p;
    if (len)
        *len = b.n;
    return 0;
}

int iflow_tokenizer_affix(const iflow_tokenizer *t, int before, const int32_t **ids)
{
    *ids = before ? t->prefix : t->suffix;
    return before ? t->n_prefix : t->n_suffix;
}

int32_t iflow_tokenizer_n_vocab(const iflow_tokenizer *t) { return t->n_vocab; }

size_t iflow_tokenizer_max_piece(const iflow_tokenizer *t) { return (size_t)t->max_token_len + 1; }

const char *iflow_tokenizer_token_text(const iflow_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab)
        return NULL;
    *len = t->tok_len[id];
    return tok_text(t, id);
}
int32_t iflow_tokenizer_bos(const iflow_tokenizer *t) { return t->bos; }
int32_t iflow_tokenizer_eos(const iflow_tokenizer *t) { return t->eos; }
const char *iflow_tokenizer_kind(const iflow_tokenizer *t) { return t->kind; }
