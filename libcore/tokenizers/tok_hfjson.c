/* tok_hfjson.c -- a tokenizer from a HF tokenizer.json: model (BPE, WordPiece), normalizer,
 * pre_tokenizer, post_processor (what IFLOW_TOK_ADD_BOS adds), decoder and added_tokens. */
#include "libcore/base/error.h"
#include "tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- JSON helpers ------------------------------------------------------------------------- */

static const char *jstr(const json_t *o, const char *key, size_t *len)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        return NULL;
    if (len)
        *len = json_string_length(v);
    return json_string_value(v);
}

static int jbool(const json_t *o, const char *key, int dflt)
{
    const json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *jtype(const json_t *o)
{
    const char *s = jstr(o, "type", NULL);
    return s ? s : "";
}

static int bad(const iflow_tokenizer *t, const char *what, const char *where)
{
    return iflow_seterr(IFLOW_EFORMAT, "bad %s in %s of '%s'", what, where, t->name);
}

static int unsupported(const iflow_tokenizer *t, const char *what, const char *type)
{
    return iflow_seterr(IFLOW_EUNSUPPORTED, "unsupported %s '%s' in '%s'", what, type, t->name);
}

/* {"String": s} or {"Regex": r}: the text and whether it is a literal. */
static int pattern(const iflow_tokenizer *t, const json_t *o, const char *where, const char **s, size_t *n, int *lit)
{
    const json_t *p = json_object_get(o, "pattern");
    *lit = (*s = jstr(p, "String", n)) != NULL;
    if (!*lit && !(*s = jstr(p, "Regex", n)))
        return bad(t, "pattern", where);
    return 0;
}

/* ---- vocabulary --------------------------------------------------------------------------- */

static int json_id(const iflow_tokenizer *t, const json_t *v, int32_t limit, const char *where, int32_t *id)
{
    json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
    if (x < 0 || x >= limit)
        return iflow_seterr(IFLOW_EFORMAT, "bad token id %lld in %s of '%s'", (long long)x, where, t->name);
    *id = (int32_t)x;
    return 0;
}

/* One entry of a Unigram vocabulary list: ["piece", score]. */
static const char *list_entry(const json_t *e, size_t *len, double *score)
{
    const json_t *s = json_array_get(e, 0), *v = json_array_get(e, 1);
    if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_string(s) || !json_is_number(v))
        return NULL;
    *len = json_string_length(s);
    *score = json_number_value(v);
    return json_string_value(s);
}

/* Size the vocabulary (an object text -> id, or a Unigram list whose ids are the positions):
 * highest id + 1, and the bytes of all texts. */
static int vocab_size(iflow_tokenizer *t, const json_t *vocab, const json_t *added, const char *where, int32_t *n,
                      size_t *bytes)
{
    size_t entries = json_object_size(vocab) + json_array_size(vocab) + json_array_size(added), i, len;
    int32_t limit = entries > (INT32_MAX - 1024) / 4 ? INT32_MAX : (int32_t)(4 * entries + 1024), id = 0;
    const char *k;
    json_t *v;
    double score;
    *n = json_is_array(vocab) ? (int32_t)json_array_size(vocab) : 0;
    *bytes = 0;
    json_object_foreach((json_t *)vocab, k, v) {
        if (json_id(t, v, limit, where, &id) < 0)
            return IFLOW_EFORMAT;
        *n = id + 1 > *n ? id + 1 : *n;
        *bytes += strlen(k);
    }
    json_array_foreach(vocab, i, v) {
        if (!list_entry(v, &len, &score))
            return iflow_seterr(IFLOW_EFORMAT, "bad entry %zu in %s of '%s'", i, where, t->name);
        *bytes += len;
    }
    json_array_foreach(added, i, v) {
        if (json_id(t, json_object_get(v, "id"), limit, "added_tokens", &id) < 0)
            return IFLOW_EFORMAT;
        if (!jstr(v, "content", &len))
            return bad(t, "content", "added_tokens");
        *n = id + 1 > *n ? id + 1 : *n;
        *bytes += len;
    }
    return 0;
}

/* The texts of vocab (object or list) and added, then the text -> id index. */
static int vocab_texts(iflow_tokenizer *t, const json_t *vocab, const json_t *added, const char *where)
{
    int32_t n = 0, id = 0;
    size_t bytes = 0, pos = 0, i, len;
    const char *k;
    json_t *v;
    double score;
    int rc = vocab_size(t, vocab, added, where, &n, &bytes);
    if (rc < 0 || (rc = tok_vocab_alloc(t, n, bytes)) < 0)
        return rc;
    json_object_foreach((json_t *)vocab, k, v) {
        json_id(t, v, INT32_MAX, where, &id);
        tok_vocab_set(t, id, k, strlen(k), &pos, TOK_NORMAL);
    }
    json_array_foreach(vocab, i, v) {
        k = list_entry(v, &len, &score);
        tok_vocab_set(t, (int32_t)i, k, len, &pos, TOK_NORMAL);
    }
    json_array_foreach(added, i, v) {
        const char *s = jstr(v, "content", &len);
        json_id(t, json_object_get(v, "id"), INT32_MAX, "added_tokens", &id);
        tok_vocab_set(t, id, s, len, &pos, jbool(v, "special", 0) ? TOK_CONTROL : TOK_USER);
    }
    return tok_vocab_index(t);
}

int tok_vocab_from_json(iflow_tokenizer *t, const json_t *vocab, const char *where)
{
    return vocab_texts(t, vocab, NULL, where);
}

static int load_vocab(iflow_tokenizer *t, const json_t *model, const json_t *added)
{
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab) && !json_is_array(vocab))
        return bad(t, "vocab", "model");
    if (added && !json_is_array(added))
        return bad(t, "list", "added_tokens");
    return vocab_texts(t, vocab, added, "model.vocab");
}

static int load_added(iflow_tokenizer *t, const json_t *added)
{
    size_t i;
    json_t *v;
    json_array_foreach(added, i, v) {
        int32_t id = (int32_t)json_integer_value(json_object_get(v, "id"));
        int rc = tok_add_added(t, id, jbool(v, "special", 0), jbool(v, "lstrip", 0), jbool(v, "rstrip", 0),
                               jbool(v, "single_word", 0));
        if (rc < 0)
            return rc;
    }
    return tok_sort_added(t);
}

/* ---- models ------------------------------------------------------------------------------- */

/* One merge, "a b" or ["a", "b"]: ids of a, b and ab. */
static int merge_ids(const iflow_tokenizer *t, const json_t *m, size_t rank, tok_buf *tmp, int32_t id[3])
{
    const char *a, *b;
    size_t na, nb;
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        a = json_string_value(json_array_get(m, 0));
        na = json_string_length(json_array_get(m, 0));
        b = json_string_value(json_array_get(m, 1));
        nb = json_string_length(json_array_get(m, 1));
    } else {
        const char *s = json_string_value(m), *sp = s ? strchr(s + (s[0] != 0), ' ') : NULL;
        if (!sp)
            return iflow_seterr(IFLOW_EFORMAT, "bad merge %zu in model.merges of '%s'", rank, t->name);
        a = s;
        na = (size_t)(sp - s);
        b = sp + 1;
        nb = json_string_length(m) - na - 1;
    }
    tmp->n = 0;
    if (tok_buf_put(tmp, a, na) < 0 || tok_buf_put(tmp, b, nb) < 0)
        return IFLOW_ENOMEM;
    id[0] = iflow_strmap_get(&t->vocab, a, na);
    id[1] = iflow_strmap_get(&t->vocab, b, nb);
    id[2] = iflow_strmap_get(&t->vocab, tmp->p, tmp->n);
    if (id[0] < 0 || id[1] < 0 || id[2] < 0)
        return iflow_seterr(IFLOW_EFORMAT, "merge %zu ('%.*s' + '%.*s') uses a token missing from the vocab of '%s'",
                            rank, (int)(na > 40 ? 40 : na), a, (int)(nb > 40 ? 40 : nb), b, t->name);
    return 0;
}

static int load_merges(iflow_tokenizer *t, const json_t *merges)
{
    tok_buf tmp = {0};
    size_t i;
    json_t *m;
    int rc = 0;
    if (merges && !json_is_array(merges))
        return bad(t, "list", "model.merges");
    if ((rc = iflow_u64map_reserve(&t->merges, json_array_size(merges))) < 0)
        return rc;
    json_array_foreach(merges, i, m) {
        int32_t id[3] = {-1, -1, -1}, r, x;
        if (i >= INT32_MAX || (rc = merge_ids(t, m, i, &tmp, id)) < 0)
            break;
        uint64_t key = (uint64_t)id[0] << 32 | (uint32_t)id[1];
        if (!iflow_u64map_get(&t->merges, key, &r, &x) && (rc = iflow_u64map_put(&t->merges, key, (int32_t)i, id[2])) < 0)
            break;
        rc = 0;
    }
    free(tmp.p);
    return rc;
}

static int32_t token_id(const iflow_tokenizer *t, const char *s)
{
    return s ? iflow_strmap_get(&t->vocab, s, strlen(s)) : -1;
}

static int load_bpe(iflow_tokenizer *t, const json_t *model)
{
    const char *pfx = jstr(model, "continuing_subword_prefix", NULL), *sfx = jstr(model, "end_of_word_suffix", NULL);
    if ((pfx && *pfx) || (sfx && *sfx))
        return unsupported(t, "bpe option", pfx && *pfx ? "continuing_subword_prefix" : "end_of_word_suffix");
    t->model = TOK_MODEL_BPE;
    t->unk = token_id(t, jstr(model, "unk_token", NULL));
    t->byte_fallback = jbool(model, "byte_fallback", 0);
    t->fuse_unk = jbool(model, "fuse_unk", 0);
    t->ignore_merges = jbool(model, "ignore_merges", 0);
    return load_merges(t, json_object_get(model, "merges"));
}

static int load_wordpiece(iflow_tokenizer *t, const json_t *model)
{
    size_t n = 2;
    const char *pfx = jstr(model, "continuing_subword_prefix", &n);
    const json_t *max = json_object_get(model, "max_input_chars_per_word");
    if (!pfx)
        pfx = "##", n = 2;
    if (n >= sizeof t->wp_prefix)
        return bad(t, "continuing_subword_prefix", "model");
    memcpy(t->wp_prefix, pfx, n);
    t->wp_prefix_len = n;
    if (json_is_integer(max) && json_integer_value(max) > 0)
        t->wp_max_chars = json_integer_value(max) > INT32_MAX ? INT32_MAX : (int)json_integer_value(max);
    t->model = TOK_MODEL_WORDPIECE;
    t->unk = token_id(t, jstr(model, "unk_token", NULL));
    return 0;
}

/* Unigram: {"unk_id": N or null, "vocab": [["piece", score], ...], "byte_fallback": bool}; the
 * pieces are the vocabulary's first entries, in HF tokenizers' rules (tok_unigram.c). */
static int load_unigram(iflow_tokenizer *t, const json_t *model)
{
    const json_t *vocab = json_object_get(model, "vocab"), *unk = json_object_get(model, "unk_id"), *v;
    size_t n = json_array_size(vocab), bytes = 0, pos = 0, i, len;
    double score;
    tok_unigram *u;
    if (!json_is_array(vocab) || n == 0)
        return bad(t, "vocab", "Unigram model");
    json_array_foreach(vocab, i, v) {
        list_entry(v, &len, &score);
        bytes += len;
    }
    int rc = tok_unigram_alloc(&t->uni, (int32_t)n, bytes, 0);
    if (rc < 0)
        return rc;
    u = t->uni;
    json_array_foreach(vocab, i, v) {
        const char *k = list_entry(v, &len, &u->score[i]);
        memcpy(u->arena + pos, k, len);
        u->off[i] = (uint32_t)pos;
        u->len[i] = (uint32_t)len;
        pos += len;
    }
    if (!json_is_null(unk) && unk && json_id(t, unk, (int32_t)n, "model.unk_id", &u->unk) < 0)
        return IFLOW_EFORMAT;
    t->model = TOK_MODEL_UNIGRAM;
    t->unk = u->unk;
    t->byte_fallback = u->byte_fallback = jbool(model, "byte_fallback", 0);
    u->lookup_unk = 1;
    return tok_unigram_finish(u, t->name);
}

static int load_model(iflow_tokenizer *t, const json_t *model)
{
    const char *type = jtype(model);
    if (!*type)
        type = json_object_get(model, "merges")                      ? "BPE"
               : json_object_get(model, "continuing_subword_prefix") ? "WordPiece"
               : json_is_array(json_object_get(model, "vocab"))       ? "Unigram"
                                                                       : "";
    if (strcmp(type, "BPE") == 0)
        return load_bpe(t, model);
    if (strcmp(type, "WordPiece") == 0)
        return load_wordpiece(t, model);
    if (strcmp(type, "Unigram") == 0)
        return load_unigram(t, model);
    return unsupported(t, "model", *type ? type : "(no type)");
}

/* ---- normalizer --------------------------------------------------------------------------- */

static int load_normalizer(iflow_tokenizer *t, const json_t *o, int depth);

static int norm_replace(iflow_tokenizer *t, const json_t *o)
{
    tok_norm n = {.kind = NORM_REPLACE};
    int lit, rc = pattern(t, o, "normalizer Replace", (const char **)&n.a, &n.alen, &lit);
    if (rc < 0)
        return rc;
    if (!(n.b = (char *)jstr(o, "content", &n.blen)))
        return bad(t, "content", "normalizer Replace");
    if (!lit && (rc = tok_regex(&n.re, n.a, n.alen, 0, "normalizer Replace", t->name)) < 0)
        return rc;
    if ((rc = tok_norm_add(t, &n)) < 0 && n.re)
        pcre2_code_free(n.re);
    return rc;
}

static int norm_bert(iflow_tokenizer *t, const json_t *o)
{
    int lower = jbool(o, "lowercase", 1);
    tok_norm n = {.kind = NORM_BERT, .clean = jbool(o, "clean_text", 1), .chinese = jbool(o, "handle_chinese_chars", 1),
                  .strip_accents = jbool(o, "strip_accents", lower), .lower = lower};
    return tok_norm_add(t, &n);
}

/* {"type": "Precompiled", "precompiled_charsmap": base64}; an empty map changes nothing. */
static int norm_precompiled(iflow_tokenizer *t, const json_t *o)
{
    size_t n;
    const char *b64 = jstr(o, "precompiled_charsmap", &n);
    tok_buf blob = {0};
    tok_norm step = {.kind = NORM_PRECOMPILED};
    if (!b64)
        return json_is_null(json_object_get(o, "precompiled_charsmap")) ? 0 : bad(t, "precompiled_charsmap", "normalizer");
    int rc = tok_base64(b64, n, &blob);
    if (rc < 0)
        rc = iflow_preperr(rc, "bad precompiled_charsmap in '%s'", t->name);
    if (rc == 0 && blob.n && (step.cm = calloc(1, sizeof *step.cm)) == NULL)
        rc = tok_nomem();
    if (rc == 0 && step.cm)
        rc = tok_charsmap_parse(step.cm, (const uint8_t *)blob.p, blob.n, 0, t->name);
    if (rc == 0 && step.cm && (rc = tok_norm_add(t, &step)) == 0)
        step.cm = NULL; /* the step owns it now */
    if (step.cm)
        tok_charsmap_free(step.cm);
    free(step.cm);
    free(blob.p);
    return rc;
}

static int norm_simple(iflow_tokenizer *t, int kind)
{
    tok_norm n = {.kind = kind};
    return tok_norm_add(t, &n);
}

static int norm_sequence(iflow_tokenizer *t, const json_t *list, int depth)
{
    size_t i;
    json_t *v;
    if (!json_is_array(list))
        return bad(t, "list", "normalizer Sequence");
    json_array_foreach(list, i, v) {
        int rc = load_normalizer(t, v, depth + 1);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int load_normalizer(iflow_tokenizer *t, const json_t *o, int depth)
{
    const char *type = jtype(o);
    if (!o || json_is_null(o))
        return 0;
    if (depth > 8)
        return bad(t, "nesting", "normalizer");
    if (strcmp(type, "Sequence") == 0)
        return norm_sequence(t, json_object_get(o, "normalizers"), depth);
    if (strcmp(type, "Prepend") == 0) {
        tok_norm n = {.kind = NORM_PREPEND};
        if (!(n.a = (char *)jstr(o, "prepend", &n.alen)))
            return bad(t, "prepend", "normalizer Prepend");
        return tok_norm_add(t, &n);
    }
    if (strcmp(type, "Replace") == 0)
        return norm_replace(t, o);
    if (strcmp(type, "BertNormalizer") == 0)
        return norm_bert(t, o);
    if (strcmp(type, "Precompiled") == 0)
        return norm_precompiled(t, o);
    if (strcmp(type, "Strip") == 0) {
        tok_norm n = {.kind = NORM_STRIP, .left = jbool(o, "strip_left", 1), .right = jbool(o, "strip_right", 1)};
        return tok_norm_add(t, &n);
    }
    static const struct { const char *name; int kind; } simple[] = {
        {"NFC", NORM_NFC}, {"NFD", NORM_NFD}, {"NFKC", NORM_NFKC}, {"NFKD", NORM_NFKD},
        {"Lowercase", NORM_LOWER}, {"StripAccents", NORM_STRIP_ACCENTS},
    };
    for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++)
        if (strcmp(type, simple[i].name) == 0)
            return norm_simple(t, simple[i].kind);
    return unsupported(t, "normalizer", type);
}

/* ---- pre-tokenizer ------------------------------------------------------------------------ */

static int load_pre(iflow_tokenizer *t, const json_t *o, int depth, tok_buf *desc);

static int behavior(const iflow_tokenizer *t, const json_t *o, int dflt, int *b)
{
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    const char *s = jstr(o, "behavior", NULL);
    *b = dflt;
    for (int i = 0; s && i < 5; i++)
        if (strcmp(s, names[i]) == 0)
            return *b = SPLIT_REMOVED + i, 0;
    return s ? unsupported(t, "split behavior", s) : 0;
}

static int describe(tok_buf *desc, const char *name)
{
    if (desc->n && tok_buf_putc(desc, '+') < 0)
        return IFLOW_ENOMEM;
    return tok_buf_put(desc, name, strlen(name));
}

static int pre_split(iflow_tokenizer *t, const json_t *o, tok_buf *desc)
{
    const char *pat;
    size_t n;
    int lit, b;
    char name[32];
    int rc = pattern(t, o, "pre_tokenizer Split", &pat, &n, &lit);
    if (rc < 0 || (rc = behavior(t, o, SPLIT_ISOLATED, &b)) < 0)
        return rc;
    if ((rc = tok_pre_add_split(t, pat, n, lit, b, jbool(o, "invert", 0), "pre_tokenizer Split")) < 0)
        return rc;
    return describe(desc, !lit && tok_pre_pattern_name(pat, n, name, sizeof name) ? name : "split");
}

static int pre_metaspace(iflow_tokenizer *t, const json_t *o)
{
    size_t n;
    const char *repl = jstr(o, "replacement", &n), *scheme = jstr(o, "prepend_scheme", NULL);
    int prepend = jbool(o, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
    if (!repl)
        repl = "\xE2\x96\x81", n = 3;
    if (scheme)
        prepend = strcmp(scheme, "first") == 0 ? PREPEND_FIRST : strcmp(scheme, "never") == 0 ? PREPEND_NEVER : PREPEND_ALWAYS;
    return tok_pre_add_metaspace(t, repl, n, prepend, jbool(o, "split", 1));
}

static int pre_sequence(iflow_tokenizer *t, const json_t *list, int depth, tok_buf *desc)
{
    size_t i;
    json_t *v;
    if (!json_is_array(list))
        return bad(t, "list", "pre_tokenizer Sequence");
    json_array_foreach(list, i, v) {
        int rc = load_pre(t, v, depth + 1, desc);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int pre_simple(iflow_tokenizer *t, const json_t *o, const char *type)
{
    int b, rc;
    if (strcmp(type, "Digits") == 0)
        return jbool(o, "individual_digits", 0) ? tok_pre_add_split(t, "\\p{N}", 5, 0, SPLIT_ISOLATED, 0, "Digits")
                                                 : tok_pre_add_split(t, "\\p{N}+", 6, 0, SPLIT_ISOLATED, 0, "Digits");
    if (strcmp(type, "Punctuation") == 0)
        return (rc = behavior(t, o, SPLIT_ISOLATED, &b)) < 0
                   ? rc : tok_pre_add_split(t, tok_punct_pattern, strlen(tok_punct_pattern), 0, b, 0, "Punctuation");
    if (strcmp(type, "Whitespace") == 0)
        return tok_pre_add_split(t, "\\w+|[^\\w\\s]+", 13, 0, SPLIT_REMOVED, 1, "Whitespace");
    if (strcmp(type, "WhitespaceSplit") == 0)
        return tok_pre_add_split(t, "\\s+", 3, 0, SPLIT_REMOVED, 0, "WhitespaceSplit");
    if (strcmp(type, "BertPreTokenizer") == 0)
        return tok_pre_add_bert(t);
    if (strcmp(type, "ByteLevel") == 0)
        return tok_pre_add_bytelevel(t, jbool(o, "add_prefix_space", 1), jbool(o, "use_regex", 1), "ByteLevel");
    if (strcmp(type, "Metaspace") == 0)
        return pre_metaspace(t, o);
    if (strcmp(type, "CharDelimiterSplit") == 0) {
        size_t n;
        const char *d = jstr(o, "delimiter", &n);
        return d ? tok_pre_add_split(t, d, n, 1, SPLIT_REMOVED, 0, "CharDelimiterSplit") : bad(t, "delimiter", "pre_tokenizer");
    }
    return unsupported(t, "pre-tokenizer", type);
}

static int load_pre(iflow_tokenizer *t, const json_t *o, int depth, tok_buf *desc)
{
    const char *type = jtype(o);
    int rc;
    if (!o || json_is_null(o))
        return 0;
    if (depth > 8)
        return bad(t, "nesting", "pre_tokenizer");
    if (strcmp(type, "Sequence") == 0)
        return pre_sequence(t, json_object_get(o, "pretokenizers"), depth, desc);
    if (strcmp(type, "Split") == 0)
        return pre_split(t, o, desc);
    if ((rc = pre_simple(t, o, type)) < 0)
        return rc;
    char name[32];
    size_t i;
    for (i = 0; type[i] && i + 1 < sizeof name; i++)
        name[i] = (char)(type[i] >= 'A' && type[i] <= 'Z' ? type[i] - 'A' + 'a' : type[i]);
    name[i] = 0;
    return describe(desc, name);
}

/* ---- post-processor ----------------------------------------------------------------------- */

static int push_special(iflow_tokenizer *t, int32_t id, int before)
{
    int32_t *v = before ? t->prefix : t->suffix;
    int *n = before ? &t->n_prefix : &t->n_suffix;
    if (id < 0 || id >= t->n_vocab)
        return iflow_seterr(IFLOW_EFORMAT, "post_processor token %d is outside the vocabulary of '%s'", id, t->name);
    if (*n >= 8)
        return unsupported(t, "post_processor", "template with more than 8 special tokens");
    v[(*n)++] = id;
    return 0;
}

/* The ids of one template item {"SpecialToken": {"id": name}}. */
static int template_special(iflow_tokenizer *t, const json_t *post, const char *name, int before)
{
    const json_t *ids = json_object_get(json_object_get(json_object_get(post, "special_tokens"), name), "ids");
    size_t i;
    json_t *v;
    if (!json_is_array(ids))
        return push_special(t, token_id(t, name), before);
    json_array_foreach(ids, i, v) {
        int rc = push_special(t, json_is_integer(v) ? (int32_t)json_integer_value(v) : -1, before);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int post_template(iflow_tokenizer *t, const json_t *post)
{
    const json_t *single = json_object_get(post, "single");
    int before = 1;
    size_t i;
    json_t *item;
    if (!json_is_array(single))
        return bad(t, "single", "post_processor");
    json_array_foreach(single, i, item) {
        const json_t *sp = json_object_get(item, "SpecialToken");
        const char *name = jstr(sp, "id", NULL);
        if (json_object_get(item, "Sequence")) {
            before = 0;
            continue;
        }
        if (!name)
            return bad(t, "template item", "post_processor");
        int rc = template_special(t, post, name, before);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* BertProcessing / RobertaProcessing: {"cls": [text, id], "sep": [text, id]}. */
static int post_cls_sep(iflow_tokenizer *t, const json_t *post)
{
    const json_t *cls = json_array_get(json_object_get(post, "cls"), 1);
    const json_t *sep = json_array_get(json_object_get(post, "sep"), 1);
    if (!json_is_integer(cls) || !json_is_integer(sep))
        return bad(t, "cls/sep", "post_processor");
    int rc = push_special(t, (int32_t)json_integer_value(cls), 1);
    return rc < 0 ? rc : push_special(t, (int32_t)json_integer_value(sep), 0);
}

static int load_post(iflow_tokenizer *t, const json_t *o, int depth)
{
    const char *type = jtype(o);
    size_t i;
    json_t *v;
    if (!o || json_is_null(o) || strcmp(type, "ByteLevel") == 0)
        return 0;
    if (depth > 8)
        return bad(t, "nesting", "post_processor");
    if (strcmp(type, "TemplateProcessing") == 0)
        return post_template(t, o);
    if (strcmp(type, "BertProcessing") == 0 || strcmp(type, "RobertaProcessing") == 0)
        return post_cls_sep(t, o);
    if (strcmp(type, "Sequence") != 0)
        return unsupported(t, "post_processor", type);
    json_array_foreach(json_object_get(o, "processors"), i, v) {
        int rc = load_post(t, v, depth + 1);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- decoder ------------------------------------------------------------------------------ */

static int load_decoder(iflow_tokenizer *t, const json_t *o, int depth, int *byte_fallback);

static int dec_replace(iflow_tokenizer *t, const json_t *o)
{
    const char *pat, *content = jstr(o, "content", NULL);
    size_t n;
    int lit, rc = pattern(t, o, "decoder Replace", &pat, &n, &lit);
    if (rc < 0)
        return rc;
    if (!lit || strcmp(pat, "\xE2\x96\x81") != 0 || !content || strcmp(content, " ") != 0)
        return unsupported(t, "decoder", "Replace other than U+2581 -> ' '");
    t->dec_metaspace = 1;
    return 0;
}

static int dec_strip(iflow_tokenizer *t, const json_t *o)
{
    const char *c = jstr(o, "content", NULL);
    json_int_t start = json_integer_value(json_object_get(o, "start"));
    json_int_t stop = json_integer_value(json_object_get(o, "stop"));
    if (!c || strcmp(c, " ") != 0 || start > 1 || stop != 0)
        return unsupported(t, "decoder", "Strip other than one leading space");
    t->dec_strip_first = start == 1;
    return 0;
}

static int dec_sequence(iflow_tokenizer *t, const json_t *list, int depth, int *byte_fallback)
{
    size_t i;
    json_t *v;
    if (!json_is_array(list))
        return bad(t, "list", "decoder Sequence");
    json_array_foreach(list, i, v) {
        int rc = load_decoder(t, v, depth + 1, byte_fallback);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int load_decoder(iflow_tokenizer *t, const json_t *o, int depth, int *byte_fallback)
{
    const char *type = jtype(o);
    if (!o || json_is_null(o) || strcmp(type, "Fuse") == 0)
        return 0;
    if (depth > 8)
        return bad(t, "nesting", "decoder");
    if (strcmp(type, "Sequence") == 0)
        return dec_sequence(t, json_object_get(o, "decoders"), depth, byte_fallback);
    if (strcmp(type, "ByteLevel") == 0)
        return t->dec_bytelevel = 1, 0;
    if (strcmp(type, "ByteFallback") == 0)
        return *byte_fallback = 1, 0;
    if (strcmp(type, "Replace") == 0)
        return dec_replace(t, o);
    if (strcmp(type, "Strip") == 0)
        return dec_strip(t, o);
    if (strcmp(type, "Metaspace") == 0) {
        const char *scheme = jstr(o, "prepend_scheme", NULL);
        t->dec_metaspace = 1;
        t->dec_strip_first = scheme ? strcmp(scheme, "never") != 0 : jbool(o, "add_prefix_space", 1);
        return 0;
    }
    if (strcmp(type, "WordPiece") == 0) {
        t->dec_wordpiece = 1;
        t->dec_cleanup = jbool(o, "cleanup", 1);
        return 0;
    }
    return unsupported(t, "decoder", type);
}

/* ---- assembling --------------------------------------------------------------------------- */

static void mark_byte_tokens(iflow_tokenizer *t)
{
    for (int b = 0; b < 256; b++)
        if (t->byte_tok[b] >= 0 && t->attr[t->byte_tok[b]] == TOK_NORMAL)
            t->attr[t->byte_tok[b]] = TOK_BYTE;
}

/* BOS: the first token the template puts before the text; EOS: the last one after it, else a
 * special token with a usual end-of-text name. */
static void pick_bos_eos(iflow_tokenizer *t)
{
    static const char *const eos_names[] = {"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>", "[SEP]"};
    t->bos = t->n_prefix ? t->prefix[0] : -1;
    t->eos = t->n_suffix ? t->suffix[t->n_suffix - 1] : -1;
    for (size_t i = 0; t->eos < 0 && i < sizeof eos_names / sizeof eos_names[0]; i++) {
        int32_t id = token_id(t, eos_names[i]);
        if (id >= 0 && t->attr[id] == TOK_CONTROL)
            t->eos = id;
    }
}

static void set_kind(iflow_tokenizer *t, const tok_buf *desc)
{
    int bytelevel = 0, spm = t->byte_fallback || t->dec_metaspace;
    for (int i = 0; i < t->n_pre; i++)
        bytelevel |= t->pre[i].kind == PRE_BYTELEVEL;
    if (t->model == TOK_MODEL_WORDPIECE)
        snprintf(t->kind, sizeof t->kind, "wordpiece");
    else if (t->model == TOK_MODEL_UNIGRAM)
        snprintf(t->kind, sizeof t->kind, "unigram");
    else if (bytelevel)
        snprintf(t->kind, sizeof t->kind, "bpe-bytelevel/%s", desc->n ? desc->p : "none");
    else
        snprintf(t->kind, sizeof t->kind, spm ? "spm-bpe" : "bpe");
}

static int load(iflow_tokenizer *t, const json_t *root)
{
    const json_t *model = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens");
    int byte_fallback = 0, rc;
    tok_buf desc = {0};
    if (!json_is_object(model))
        return iflow_seterr(IFLOW_EFORMAT, "missing object 'model' in '%s'", t->name);
    if ((rc = load_vocab(t, model, added)) < 0 || (rc = load_model(t, model)) < 0 ||
        (rc = load_normalizer(t, json_object_get(root, "normalizer"), 0)) < 0 ||
        (rc = load_pre(t, json_object_get(root, "pre_tokenizer"), 0, &desc)) < 0 ||
        (rc = load_post(t, json_object_get(root, "post_processor"), 0)) < 0 ||
        (rc = load_decoder(t, json_object_get(root, "decoder"), 0, &byte_fallback)) < 0 || (rc = load_added(t, added)) < 0) {
        free(desc.p);
        return rc;
    }
    if (byte_fallback || t->byte_fallback)
        mark_byte_tokens(t);
    pick_bos_eos(t);
    set_kind(t, &desc);
    t->user_raw = 1;
    free(desc.p);
    return 0;
}

int iflow_tokenizer_from_hf_json(iflow_tokenizer **out, const char *json, size_t len, const char *name)
{
    json_error_t err;
    iflow_tokenizer *t;
    if (!out || (!json && len))
        return iflow_seterr(IFLOW_EINVAL, "iflow_tokenizer_from_hf_json: null argument");
    *out = NULL;
    name = name ? name : "<memory>";
    json_t *root = json_loadb(json ? json : "", len, JSON_ALLOW_NUL, &err);
    if (!root)
        return iflow_seterr(IFLOW_EFORMAT, "malformed json in '%s' at line %d column %d: %s", name, err.line, err.column,
                            err.text);
    int rc = json_is_object(root) ? tok_new(&t, name)
                                  : iflow_seterr(IFLOW_EFORMAT, "tokenizer.json is not an object in '%s'", name);
    if (rc == 0 && (rc = load(t, root)) < 0)
        iflow_tokenizer_close(t);
    json_decref(root);
    if (rc == 0)
        *out = t;
    return rc;
}
