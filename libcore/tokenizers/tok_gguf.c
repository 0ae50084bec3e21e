/* tok_gguf.c -- a tokenizer from the tokenizer.ggml.* keys of a GGUF file: model 'llama'
 * (SentencePiece BPE, merges by score, byte fallback), 'gpt2' (byte-level BPE with merges by
 * rank and the pre-tokenizer named by tokenizer.ggml.pre) or 'bert' (WordPiece, BERT's
 * normalizer and pre-tokenizer, [CLS] ... [SEP]). llama.cpp stores a BERT vocabulary in
 * "phantom space" form: a word-initial piece "x" as "\u2581x", a continuation "##x" as "x",
 * "[...]" specials unchanged; reading undoes it, so the vocabulary is the tokenizer.json's. */
#include "libcore/base/error.h"
#include "libcore/formats/gguf.h"
#include "tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define K_MODEL "tokenizer.ggml.model"
#define K_TOKENS "tokenizer.ggml.tokens"
#define K_TYPES "tokenizer.ggml.token_type"
#define K_SCORES "tokenizer.ggml.scores"
#define K_MERGES "tokenizer.ggml.merges"
#define K_PRE "tokenizer.ggml.pre"

/* A key that may be absent: 0 when present, 1 when absent, < 0 on a real error. */
static int optional(int rc)
{
    return rc == IFLOW_ENOTFOUND ? 1 : rc;
}

static int check_count(const iflow_tokenizer *t, const char *key, size_t n)
{
    if (n == (size_t)t->n_vocab)
        return 0;
    return iflow_seterr(IFLOW_EFORMAT, "%s has %zu entries but there are %d tokens in '%s'", key, n, t->n_vocab,
                        t->name);
}

#define PHANTOM "\xE2\x96\x81" /* U+2581, llama.cpp's word-initial mark in BERT vocabularies */

/* A BERT token as tokenizer.json has it, from its phantom-space form, into buf (>= len + 2). */
static size_t unphantom(const char *s, size_t len, char *buf)
{
    if (len >= 3 && memcmp(s, PHANTOM, 3) == 0)
        return memcpy(buf, s + 3, len - 3), len - 3;
    if (len >= 2 && s[0] == '[' && s[len - 1] == ']')
        return memcpy(buf, s, len), len;
    memcpy(buf, "##", 2);
    memcpy(buf + 2, s, len);
    return len + 2;
}

static int load_vocab(iflow_tokenizer *t, const iflow_gguf *g, int phantom)
{
    const iflow_gguf_str *tok;
    const int32_t *types = NULL;
    size_t n, nt = 0, bytes = 0, pos = 0, longest = 0;
    int rc = iflow_gguf_get_arr_str(g, K_TOKENS, &tok, &n);
    if (rc < 0)
        return rc;
    if (n > INT32_MAX)
        return iflow_seterr(IFLOW_EFORMAT, "too many tokens (%zu) in '%s'", n, t->name);
    for (size_t i = 0; i < n; i++) {
        bytes += (size_t)tok[i].len + (phantom ? 2 : 0);
        longest = tok[i].len > longest ? (size_t)tok[i].len : longest;
    }
    char *buf = phantom ? malloc(longest + 2) : NULL;
    if (phantom && !buf)
        return tok_nomem();
    if ((rc = tok_vocab_alloc(t, (int32_t)n, bytes)) < 0 ||
        (rc = optional(iflow_gguf_get_arr_i32(g, K_TYPES, &types, &nt))) < 0 ||
        (rc == 0 && (rc = check_count(t, K_TYPES, nt)) < 0))
        return free(buf), rc;
    for (size_t i = 0; i < n; i++) {
        int attr = types && types[i] >= TOK_NORMAL && types[i] <= TOK_BYTE ? types[i] : TOK_NORMAL;
        if (phantom)
            tok_vocab_set(t, (int32_t)i, buf, unphantom(tok[i].ptr, (size_t)tok[i].len, buf), &pos, attr);
        else
            tok_vocab_set(t, (int32_t)i, tok[i].ptr, (size_t)tok[i].len, &pos, attr);
    }
    free(buf);
    return tok_vocab_index(t);
}

/* Token id stored under key (absent or out of range: keep *id). */
static int load_id(const iflow_tokenizer *t, const iflow_gguf *g, const char *key, int32_t *id)
{
    uint32_t v;
    int rc = optional(iflow_gguf_get_u32(g, key, &v));
    if (rc == IFLOW_ERANGE)
        return 0;
    if (rc == 0)
        *id = v < (uint32_t)t->n_vocab ? (int32_t)v : -1;
    return rc < 0 ? rc : 0;
}

static int load_bool(const iflow_gguf *g, const char *key, int dflt, int *v)
{
    int rc = optional(iflow_gguf_get_bool(g, key, v));
    if (rc == 1)
        *v = dflt;
    return rc < 0 ? rc : 0;
}

static int load_scores(iflow_tokenizer *t, const iflow_gguf *g)
{
    const float *sc = NULL;
    size_t n = 0;
    int rc = optional(iflow_gguf_get_arr_f32(g, K_SCORES, &sc, &n));
    if (rc < 0 || (rc == 0 && (rc = check_count(t, K_SCORES, n)) < 0))
        return rc;
    if (!(t->scores = calloc((size_t)t->n_vocab, sizeof *t->scores)))
        return tok_nomem();
    if (sc)
        memcpy(t->scores, sc, (size_t)t->n_vocab * sizeof *sc);
    return 0;
}

static int add_spm_normalizer(iflow_tokenizer *t, int space_prefix)
{
    tok_norm pre = {.kind = NORM_PREPEND, .a = "\xE2\x96\x81", .alen = 3};
    tok_norm rep = {.kind = NORM_REPLACE, .a = " ", .alen = 1, .b = "\xE2\x96\x81", .blen = 3};
    int rc = space_prefix ? tok_norm_add(t, &pre) : 0;
    return rc < 0 ? rc : tok_norm_add(t, &rep);
}

static int load_spm(iflow_tokenizer *t, const iflow_gguf *g, int *add_bos)
{
    int space_prefix, rc;
    t->bos = 1 < t->n_vocab ? 1 : -1;
    t->eos = 2 < t->n_vocab ? 2 : -1;
    t->unk = 0;
    if ((rc = load_scores(t, g)) < 0 || (rc = load_bool(g, "tokenizer.ggml.add_space_prefix", 1, &space_prefix)) < 0)
        return rc;
    t->by_score = 1;
    t->byte_fallback = 1;
    t->dec_metaspace = 1;
    t->dec_strip_first = space_prefix;
    *add_bos = 1;
    snprintf(t->kind, sizeof t->kind, "spm-bpe");
    return add_spm_normalizer(t, space_prefix);
}

/* "a b" -> ids of a, b and ab; 0 if some part is not a token, < 0 if malformed. */
static int merge_ids(const iflow_tokenizer *t, const iflow_gguf_str *m, size_t rank, tok_buf *tmp, int32_t id[3])
{
    const char *sp = m->len > 1 ? memchr(m->ptr + 1, ' ', (size_t)m->len - 1) : NULL;
    if (!sp)
        return iflow_seterr(IFLOW_EFORMAT, "bad merge %zu in '%s': no space in '%.*s'", rank, t->name,
                            (int)(m->len > 64 ? 64 : m->len), m->ptr);
    size_t a = (size_t)(sp - m->ptr), b = (size_t)m->len - a - 1;
    tmp->n = 0;
    if (tok_buf_put(tmp, m->ptr, a) < 0 || tok_buf_put(tmp, sp + 1, b) < 0)
        return IFLOW_ENOMEM;
    id[0] = iflow_strmap_get(&t->vocab, m->ptr, a);
    id[1] = iflow_strmap_get(&t->vocab, sp + 1, b);
    id[2] = iflow_strmap_get(&t->vocab, tmp->p, tmp->n);
    return id[0] >= 0 && id[1] >= 0 && id[2] >= 0;
}

static int load_merges(iflow_tokenizer *t, const iflow_gguf *g)
{
    const iflow_gguf_str *m;
    size_t n;
    tok_buf tmp = {0};
    int rc = iflow_gguf_get_arr_str(g, K_MERGES, &m, &n);
    if (rc < 0 || (rc = iflow_u64map_reserve(&t->merges, n)) < 0)
        return rc;
    for (size_t i = 0; i < n && i < INT32_MAX; i++) {
        int32_t id[3] = {-1, -1, -1}, r, x;
        if ((rc = merge_ids(t, &m[i], i, &tmp, id)) < 0)
            break;
        uint64_t key = (uint64_t)id[0] << 32 | (uint32_t)id[1];
        if (rc == 1 && !iflow_u64map_get(&t->merges, key, &r, &x) &&
            (rc = iflow_u64map_put(&t->merges, key, (int32_t)i, id[2])) < 0)
            break;
        rc = 0;
    }
    free(tmp.p);
    return rc;
}

static int load_bpe(iflow_tokenizer *t, const iflow_gguf *g, int *add_bos)
{
    const char *pre = "default";
    int rc = optional(iflow_gguf_get_str(g, K_PRE, &pre, NULL));
    if (rc < 0 || (rc = load_merges(t, g)) < 0 || (rc = tok_pre_add_named(t, pre, &t->ignore_merges)) < 0)
        return rc;
    t->dec_bytelevel = 1;
    *add_bos = t->ignore_merges; /* llama-3 style vocabularies add BOS by default */
    snprintf(t->kind, sizeof t->kind, "bpe-bytelevel/%s", pre);
    return 0;
}

/* The id of token text s, or -1. */
static int32_t id_of(const iflow_tokenizer *t, const char *s)
{
    return iflow_strmap_get(&t->vocab, s, strlen(s));
}

/* BERT's WordPiece: lowercase, accents stripped, CJK characters split; [CLS] text [SEP]. The
 * specials are llama.cpp's cls / separator keys, else bos / eos, else the tokens by name. */
static int load_wpm(iflow_tokenizer *t, const iflow_gguf *g, int *add_bos, int *add_eos)
{
    tok_norm n = {.kind = NORM_BERT, .clean = 1, .chinese = 1, .strip_accents = 1, .lower = 1};
    int rc;
    t->model = TOK_MODEL_WORDPIECE;
    memcpy(t->wp_prefix, "##", 2);
    t->wp_prefix_len = 2;
    t->dec_wordpiece = 1;
    t->dec_cleanup = 1;
    t->unk = id_of(t, "[UNK]");
    t->bos = id_of(t, "[CLS]");
    t->eos = id_of(t, "[SEP]");
    if ((rc = load_id(t, g, "tokenizer.ggml.bos_token_id", &t->bos)) < 0 ||
        (rc = load_id(t, g, "tokenizer.ggml.cls_token_id", &t->bos)) < 0 ||
        (rc = load_id(t, g, "tokenizer.ggml.eos_token_id", &t->eos)) < 0 ||
        (rc = load_id(t, g, "tokenizer.ggml.seperator_token_id", &t->eos)) < 0)
        return rc;
    *add_bos = *add_eos = 1;
    snprintf(t->kind, sizeof t->kind, "wordpiece");
    return (rc = tok_norm_add(t, &n)) < 0 ? rc : tok_pre_add_bert(t);
}

/* Control, unknown and user-defined tokens are cut out of the text before the model. */
static int load_added(iflow_tokenizer *t)
{
    for (int32_t id = 0; id < t->n_vocab; id++) {
        int a = t->attr[id];
        if (a != TOK_CONTROL && a != TOK_UNKNOWN && a != TOK_USER)
            continue;
        int rc = tok_add_added(t, id, a != TOK_USER, 0, 0, 0);
        if (rc < 0)
            return rc;
    }
    return tok_sort_added(t);
}

static int load_template(iflow_tokenizer *t, const iflow_gguf *g, int add_bos, int add_eos)
{
    int rc = load_bool(g, "tokenizer.ggml.add_bos_token", add_bos, &add_bos);
    if (rc < 0 || (rc = load_bool(g, "tokenizer.ggml.add_eos_token", add_eos, &add_eos)) < 0)
        return rc;
    if (add_bos && t->bos >= 0)
        t->prefix[t->n_prefix++] = t->bos;
    if (add_eos && t->eos >= 0)
        t->suffix[t->n_suffix++] = t->eos;
    return 0;
}

static int load_model(iflow_tokenizer *t, const iflow_gguf *g, const char *model)
{
    int add_bos = 0, add_eos = 0, rc;
    t->model = TOK_MODEL_BPE;
    if (strcmp(model, "llama") == 0)
        rc = load_spm(t, g, &add_bos);
    else if (strcmp(model, "gpt2") == 0)
        rc = load_bpe(t, g, &add_bos);
    else if (strcmp(model, "bert") == 0)
        rc = load_wpm(t, g, &add_bos, &add_eos);
    else
        return iflow_seterr(IFLOW_EUNSUPPORTED, "unsupported tokenizer model '%s' in '%s'", model, t->name);
    t->user_raw = 1;
    if (rc < 0 || (t->model == TOK_MODEL_BPE && ((rc = load_id(t, g, "tokenizer.ggml.bos_token_id", &t->bos)) < 0 ||
                                                 (rc = load_id(t, g, "tokenizer.ggml.eos_token_id", &t->eos)) < 0)) ||
        (rc = load_id(t, g, "tokenizer.ggml.unknown_token_id", &t->unk)) < 0)
        return rc;
    if ((rc = load_template(t, g, add_bos, add_eos)) < 0)
        return rc;
    return load_added(t);
}

int tok_from_gguf_handle(iflow_tokenizer **out, const iflow_gguf *g)
{
    iflow_tokenizer *t;
    const char *model;
    *out = NULL;
    int rc = tok_new(&t, iflow_gguf_name(g));
    if (rc < 0)
        return rc;
    if ((rc = iflow_gguf_get_str(g, K_MODEL, &model, NULL)) < 0 || (rc = load_vocab(t, g, strcmp(model, "bert") == 0)) < 0 ||
        (rc = load_model(t, g, model)) < 0) {
        iflow_tokenizer_close(t);
        return rc;
    }
    *out = t;
    return 0;
}

int iflow_tokenizer_from_gguf(iflow_tokenizer **out, const void *buf, size_t len, const char *name)
{
    iflow_gguf *g;
    if (!out)
        return iflow_seterr(IFLOW_EINVAL, "iflow_tokenizer_from_gguf: null argument");
    *out = NULL;
    int rc = iflow_gguf_open_mem(&g, buf, len, name);
    if (rc < 0)
        return rc;
    rc = tok_from_gguf_handle(out, g);
    iflow_gguf_close(g);
    return rc;
}
