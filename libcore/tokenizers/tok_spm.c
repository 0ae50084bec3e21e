/* tok_spm.c -- a tokenizer from a SentencePiece model file (.spm / .model: a ModelProto in
 * protobuf's wire format), optionally with a Marian vocab.json that maps pieces to the model's
 * ids. Only the fields a unigram model needs are read (pieces {piece, score, type}, trainer_spec
 * {model_type, vocab_size, byte_fallback, treat_whitespace_as_suffix, bos/eos pieces},
 * normalizer_spec {precompiled_charsmap, add_dummy_prefix, remove_extra_whitespaces,
 * escape_whitespaces}, denormalizer_spec); every other field is skipped by its wire type. Every
 * length is checked against the bytes that remain before it is used. */
#include "libcore/base/error.h"
#include "libcore/base/util.h"
#include "tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- protobuf wire format ------------------------------------------------------------------ */

enum { PB_VARINT = 0, PB_FIXED64 = 1, PB_BYTES = 2, PB_FIXED32 = 5 };

typedef struct {
    const uint8_t *buf; /* the whole file: offsets in messages are file offsets */
    size_t pos, end;    /* the rest of this message */
    const char *name;
} pb_reader;

typedef struct {
    uint32_t field;
    int wire;
    uint64_t v;         /* VARINT, FIXED32, FIXED64 */
    size_t off, len;    /* BYTES: the payload */
    size_t at;          /* where the field's tag starts */
} pb_field;

static int pb_truncated(const pb_reader *r, const char *what, size_t at)
{
    return iflow_seterr(IFLOW_ETRUNC, "truncated protobuf %s at byte %zu in '%s'", what, at, r->name);
}

static int pb_varint(pb_reader *r, uint64_t *v, const char *what)
{
    size_t at = r->pos;
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->pos >= r->end)
            return pb_truncated(r, what, at);
        uint8_t b = r->buf[r->pos++];
        *v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80))
            return 0;
    }
    return iflow_seterr(IFLOW_EFORMAT, "protobuf varint longer than 10 bytes at byte %zu in '%s'", at, r->name);
}

static int pb_fixed(pb_reader *r, pb_field *f, size_t n)
{
    if (r->end - r->pos < n)
        return pb_truncated(r, "fixed-size field", f->at);
    f->v = n == 4 ? rd_u32(r->buf + r->pos) : rd_u64(r->buf + r->pos);
    r->pos += n;
    return 0;
}

static int pb_bytes(pb_reader *r, pb_field *f)
{
    uint64_t n;
    int rc = pb_varint(r, &n, "length");
    if (rc < 0)
        return rc;
    if (n > r->end - r->pos)
        return iflow_seterr(IFLOW_ETRUNC, "protobuf field %u at byte %zu claims %llu bytes but %zu remain in '%s'", f->field,
                            f->at, (unsigned long long)n, r->end - r->pos, r->name);
    f->off = r->pos;
    f->len = (size_t)n;
    r->pos += (size_t)n;
    return 0;
}

/* The next field of the message: 1 with it, 0 at its end, < 0 on malformed input. */
static int pb_next(pb_reader *r, pb_field *f)
{
    uint64_t tag;
    if (r->pos >= r->end)
        return 0;
    f->at = r->pos;
    int rc = pb_varint(r, &tag, "tag");
    if (rc < 0)
        return rc;
    f->field = (uint32_t)(tag >> 3);
    f->wire = (int)(tag & 7);
    if (tag >> 3 == 0 || tag >> 3 > 0x1FFFFFFF)
        return iflow_seterr(IFLOW_EFORMAT, "bad protobuf field number %llu at byte %zu in '%s'",
                            (unsigned long long)(tag >> 3), f->at, r->name);
    switch (f->wire) {
    case PB_VARINT: rc = pb_varint(r, &f->v, "varint"); break;
    case PB_FIXED64: rc = pb_fixed(r, f, 8); break;
    case PB_BYTES: rc = pb_bytes(r, f); break;
    case PB_FIXED32: rc = pb_fixed(r, f, 4); break;
    default:
        return iflow_seterr(IFLOW_EFORMAT, "unsupported protobuf wire type %d (field %u) at byte %zu in '%s'", f->wire,
                            f->field, f->at, r->name);
    }
    return rc < 0 ? rc : 1;
}

static pb_reader pb_sub(const pb_reader *r, const pb_field *f)
{
    return (pb_reader){r->buf, f->off, f->off + f->len, r->name};
}

/* A known field with the wrong wire type. */
static int pb_want(const pb_reader *r, const pb_field *f, int wire, const char *msg)
{
    if (f->wire == wire)
        return 0;
    return iflow_seterr(IFLOW_EFORMAT, "%s field %u has wire type %d, not %d, at byte %zu in '%s'", msg, f->field, f->wire,
                        wire, f->at, r->name);
}

/* ---- ModelProto ----------------------------------------------------------------------------- */

typedef struct {
    size_t off, len; /* the piece's text in the file */
    float score;
    int type;
    size_t at;
} spm_piece;

typedef struct {
    spm_piece *pieces;
    size_t n, cap, text_bytes;
    uint64_t model_type;
    int64_t vocab_size;    /* -1: absent */
    size_t vocab_size_at;
    int byte_fallback, ws_suffix;
    size_t bos_off, bos_len, eos_off, eos_len; /* bos_len/eos_len SIZE_MAX: the defaults */
    size_t cm_off, cm_len;
    int dummy_prefix, extra_ws, escape_ws;
    size_t denorm_len, denorm_at;
} spm_model;

static int parse_piece(const pb_reader *top, const pb_field *pf, spm_model *m)
{
    pb_reader r = pb_sub(top, pf);
    pb_field f;
    spm_piece p = {.type = TOK_NORMAL, .at = pf->at};
    int rc;
    while ((rc = pb_next(&r, &f)) > 0) {
        if (f.field == 1 && (rc = pb_want(&r, &f, PB_BYTES, "piece")) == 0)
            p.off = f.off, p.len = f.len;
        else if (f.field == 2 && (rc = pb_want(&r, &f, PB_FIXED32, "piece")) == 0)
            memcpy(&p.score, &(uint32_t){(uint32_t)f.v}, 4);
        else if (f.field == 3 && (rc = pb_want(&r, &f, PB_VARINT, "piece")) == 0)
            p.type = f.v >= TOK_NORMAL && f.v <= TOK_BYTE ? (int)f.v : -1;
        if (rc < 0)
            return rc;
        if (p.type < 0)
            return iflow_seterr(IFLOW_EFORMAT, "piece %zu has unknown type %llu at byte %zu in '%s'", m->n,
                                (unsigned long long)f.v, f.at, r.name);
    }
    if (rc < 0 || (rc = tok_grow((void **)&m->pieces, &m->cap, m->n + 1, sizeof *m->pieces)) < 0)
        return rc;
    m->pieces[m->n++] = p;
    m->text_bytes += p.len;
    return 0;
}

static int parse_trainer(const pb_reader *top, const pb_field *tf, spm_model *m)
{
    pb_reader r = pb_sub(top, tf);
    pb_field f;
    int rc;
    while ((rc = pb_next(&r, &f)) > 0) {
        int var = f.field == 3 || f.field == 4 || f.field == 24 || f.field == 35;
        if ((var && (rc = pb_want(&r, &f, PB_VARINT, "trainer_spec")) < 0) ||
            ((f.field == 46 || f.field == 47) && (rc = pb_want(&r, &f, PB_BYTES, "trainer_spec")) < 0))
            return rc;
        if (f.field == 3)
            m->model_type = f.v;
        else if (f.field == 4)
            m->vocab_size = (int32_t)(uint32_t)f.v, m->vocab_size_at = f.at;
        else if (f.field == 24)
            m->ws_suffix = f.v != 0;
        else if (f.field == 35)
            m->byte_fallback = f.v != 0;
        else if (f.field == 46)
            m->bos_off = f.off, m->bos_len = f.len;
        else if (f.field == 47)
            m->eos_off = f.off, m->eos_len = f.len;
    }
    return rc;
}

static int parse_normalizer(const pb_reader *top, const pb_field *nf, spm_model *m)
{
    pb_reader r = pb_sub(top, nf);
    pb_field f;
    int rc;
    while ((rc = pb_next(&r, &f)) > 0) {
        if ((f.field >= 3 && f.field <= 5 && (rc = pb_want(&r, &f, PB_VARINT, "normalizer_spec")) < 0) ||
            (f.field == 2 && (rc = pb_want(&r, &f, PB_BYTES, "normalizer_spec")) < 0))
            return rc;
        if (f.field == 2)
            m->cm_off = f.off, m->cm_len = f.len;
        else if (f.field == 3)
            m->dummy_prefix = f.v != 0;
        else if (f.field == 4)
            m->extra_ws = f.v != 0;
        else if (f.field == 5)
            m->escape_ws = f.v != 0;
    }
    return rc;
}

/* The denormalizer only matters when it carries rules. */
static int parse_denormalizer(const pb_reader *top, const pb_field *df, spm_model *m)
{
    spm_model d = {0};
    int rc = parse_normalizer(top, df, &d);
    m->denorm_len = d.cm_len;
    m->denorm_at = df->at;
    return rc;
}

static int parse_model(const uint8_t *buf, size_t len, const char *name, spm_model *m)
{
    pb_reader r = {buf, 0, len, name};
    pb_field f;
    int rc;
    *m = (spm_model){.model_type = 1, .vocab_size = -1, .bos_len = SIZE_MAX, .eos_len = SIZE_MAX, .dummy_prefix = 1,
                     .extra_ws = 1, .escape_ws = 1};
    while ((rc = pb_next(&r, &f)) > 0) {
        if (f.field >= 1 && f.field <= 5 && f.field != 4 && (rc = pb_want(&r, &f, PB_BYTES, "ModelProto")) < 0)
            return rc;
        if (f.field == 1)
            rc = parse_piece(&r, &f, m);
        else if (f.field == 2)
            rc = parse_trainer(&r, &f, m);
        else if (f.field == 3)
            rc = parse_normalizer(&r, &f, m);
        else if (f.field == 5)
            rc = parse_denormalizer(&r, &f, m);
        if (rc < 0)
            return rc;
    }
    return rc;
}

/* What a unigram tokenizer cannot take, and counts that disagree. */
static int check_model(const spm_model *m, const char *name)
{
    static const char *const types[] = {"", "unigram", "bpe", "word", "char"};
    if (m->model_type != 1)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "unsupported sentencepiece model type %s in '%s' (unigram only)",
                            m->model_type <= 4 ? types[m->model_type] : "(unknown)", name);
    if (m->n == 0)
        return iflow_seterr(IFLOW_EFORMAT, "no pieces in '%s'", name);
    if (m->n > INT32_MAX / 2)
        return iflow_seterr(IFLOW_EFORMAT, "too many pieces (%zu) in '%s'", m->n, name);
    if (m->vocab_size >= 0 && (size_t)m->vocab_size != m->n)
        return iflow_seterr(IFLOW_EFORMAT, "trainer_spec.vocab_size at byte %zu says %lld pieces but there are %zu in '%s'",
                            m->vocab_size_at, (long long)m->vocab_size, m->n, name);
    if (m->ws_suffix)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "unsupported treat_whitespace_as_suffix in '%s'", name);
    if (m->denorm_len)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "unsupported denormalizer_spec rules at byte %zu in '%s'", m->denorm_at, name);
    return 0;
}

/* The unigram model of m: pieces, normalizer and the checks of tok_unigram_finish. */
static int make_unigram(const uint8_t *buf, const spm_model *m, const char *name, tok_unigram **out)
{
    tok_unigram *u;
    int rc = tok_unigram_alloc(&u, (int32_t)m->n, m->text_bytes, 1);
    *out = u;
    if (rc < 0)
        return rc;
    size_t pos = 0;
    for (size_t i = 0; i < m->n; i++) {
        const spm_piece *p = &m->pieces[i];
        memcpy(u->arena + pos, buf + p->off, p->len);
        u->off[i] = (uint32_t)pos;
        u->len[i] = (uint32_t)p->len;
        u->type[i] = (uint8_t)p->type;
        u->score[i] = p->score;
        pos += p->len;
    }
    u->byte_fallback = m->byte_fallback;
    u->dummy_prefix = m->dummy_prefix;
    u->extra_ws = m->extra_ws;
    u->escape_ws = m->escape_ws;
    if ((rc = tok_charsmap_parse(&u->cm, buf + m->cm_off, m->cm_len, m->cm_off, name)) < 0)
        return rc;
    return tok_unigram_finish(u, name);
}

/* ---- the tokenizer -------------------------------------------------------------------------- */

/* The pieces are the vocabulary; control and unknown pieces are special tokens. */
static int vocab_from_pieces(iflow_tokenizer *t, const tok_unigram *u, size_t bytes)
{
    size_t pos = 0;
    int rc = tok_vocab_alloc(t, u->n, bytes);
    for (int32_t p = 0; rc == 0 && p < u->n; p++)
        tok_vocab_set(t, p, tok_piece_text(u, p), u->len[p], &pos, u->type[p]);
    if (rc < 0 || (rc = tok_vocab_index(t)) < 0)
        return rc;
    for (int32_t p = 0; rc == 0 && p < u->n; p++)
        if (u->type[p] == TOK_CONTROL || u->type[p] == TOK_UNKNOWN)
            rc = tok_add_added(t, p, 1, 0, 0, 0);
    t->unk = u->unk;
    return rc;
}

static int32_t find_piece(const tok_unigram *u, const char *s, size_t n, int type)
{
    for (int32_t p = 0; p < u->n; p++)
        if (u->type[p] == type && u->len[p] == n && memcmp(tok_piece_text(u, p), s, n) == 0)
            return p;
    return -1;
}

/* Marian's special tokens in its vocab.json: MarianTokenizer's eos, unk and pad. */
static int marian_special(iflow_tokenizer *t, const char *text, int attr)
{
    int32_t id = iflow_strmap_get(&t->vocab, text, strlen(text));
    if (id < 0)
        return 0;
    t->attr[id] = (uint8_t)attr;
    return tok_add_added(t, id, 1, 0, 0, 0);
}

/* vocab.json is the vocabulary; each piece maps to the id of its text there, else <unk>. */
static int vocab_from_json(iflow_tokenizer *t, tok_unigram *u, const char *json, size_t len, const char *vname)
{
    json_error_t err;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &err);
    if (!root)
        return iflow_seterr(IFLOW_EFORMAT, "malformed json in '%s' at line %d column %d: %s", vname, err.line, err.column,
                            err.text);
    int rc = json_is_object(root) ? tok_vocab_from_json(t, root, vname)
                                  : iflow_seterr(IFLOW_EFORMAT, "vocabulary is not an object in '%s'", vname);
    json_decref(root);
    if (rc < 0)
        return rc;
    if ((t->unk = iflow_strmap_get(&t->vocab, "<unk>", 5)) < 0)
        return iflow_seterr(IFLOW_EFORMAT, "no '<unk>' in '%s'", vname);
    for (int32_t p = 0; p < u->n; p++) {
        int32_t id = iflow_strmap_get(&t->vocab, tok_piece_text(u, p), u->len[p]);
        u->to_id[p] = id >= 0 ? id : t->unk;
    }
    u->lookup_unk = 1;
    t->lang_codes = 1;
    t->dec_trim = 1;
    if ((rc = marian_special(t, "</s>", TOK_CONTROL)) < 0 || (rc = marian_special(t, "<unk>", TOK_UNKNOWN)) < 0 ||
        (rc = marian_special(t, "<pad>", TOK_CONTROL)) < 0)
        return rc;
    return 0;
}

/* BOS and EOS: trainer_spec's bos/eos pieces when they are control pieces; </s> is what
 * IFLOW_TOK_ADD_BOS appends (T5 and Marian append it; neither adds a BOS). */
static void set_template(iflow_tokenizer *t, const tok_unigram *u, const uint8_t *buf, const spm_model *m, int mapped)
{
    int32_t bos = m->bos_len == SIZE_MAX ? find_piece(u, "<s>", 3, TOK_CONTROL)
                                         : find_piece(u, (const char *)buf + m->bos_off, m->bos_len, TOK_CONTROL);
    int32_t eos = m->eos_len == SIZE_MAX ? find_piece(u, "</s>", 4, TOK_CONTROL)
                                         : find_piece(u, (const char *)buf + m->eos_off, m->eos_len, TOK_CONTROL);
    t->bos = mapped || bos < 0 ? -1 : u->to_id[bos];
    t->eos = eos < 0 ? -1 : mapped ? iflow_strmap_get(&t->vocab, tok_piece_text(u, eos), u->len[eos]) : u->to_id[eos];
    if (t->eos >= 0)
        t->suffix[t->n_suffix++] = t->eos;
}

static int assemble(iflow_tokenizer *t, tok_unigram *u, const uint8_t *buf, const spm_model *m, const char *vocab,
                    size_t vocab_len, const char *vname)
{
    tok_norm norm = {.kind = NORM_SPM, .uni = u};
    int rc = vocab ? vocab_from_json(t, u, vocab, vocab_len, vname) : vocab_from_pieces(t, u, m->text_bytes);
    if (rc < 0 || (rc = tok_sort_added(t)) < 0 || (rc = tok_norm_add(t, &norm)) < 0)
        return rc;
    t->model = TOK_MODEL_UNIGRAM;
    set_template(t, u, buf, m, vocab != NULL);
    t->dec_metaspace = 1;
    t->dec_strip_empty = m->extra_ws;
    t->dec_strip_first = !m->extra_ws && m->dummy_prefix;
    snprintf(t->kind, sizeof t->kind, "spm-unigram");
    return 0;
}

int iflow_tokenizer_from_spm(iflow_tokenizer **out, const void *spm, size_t len, const char *name, const char *vocab_json,
                             size_t vocab_len, const char *vocab_name)
{
    iflow_tokenizer *t = NULL;
    spm_model m;
    if (!out || (!spm && len) || (!vocab_json && vocab_len))
        return iflow_seterr(IFLOW_EINVAL, "iflow_tokenizer_from_spm: null argument");
    *out = NULL;
    name = name ? name : "<memory>";
    int rc = parse_model(spm ? spm : "", len, name, &m);
    if (rc == 0)
        rc = check_model(&m, name);
    if (rc == 0 && (rc = tok_new(&t, name)) == 0) {
        rc = make_unigram(spm, &m, name, &t->uni);
        if (rc == 0)
            rc = assemble(t, t->uni, spm, &m, vocab_json, vocab_len, vocab_name ? vocab_name : "vocab.json");
    }
    free(m.pieces);
    if (rc < 0) {
        iflow_tokenizer_close(t);
        return rc;
    }
    *out = t;
    return 0;
}
