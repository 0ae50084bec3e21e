/* tok_open.c -- which files make a tokenizer (iflow_tokenizer_find: a tokenizer.json, a GGUF file
 * sniffed by its magic, a SentencePiece model .spm / .model, or a model directory: tokenizer.json
 * with bos/eos from tokenizer_config.json / config.json, else tokenizer.gguf, else Marian's
 * source.spm + vocab.json -- target.spm for the target side -- else M2M100's
 * sentencepiece.bpe.model + vocab.json with M2M100Tokenizer's language tokens, else
 * spiece.model), opening them (iflow_tokenizer_open, _open_target, _open_files), and a tokenizer
 * from a format's bytes (iflow_tokenizer_from_format, as a shard stores them). */
#include "libcore/base/error.h"
#include "libcore/formats/gguf.h"
#include "tok_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int read_file(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    tok_buf b = {0};
    char chunk[65536];
    size_t n;
    if (!f)
        return iflow_seterr(IFLOW_EIO, "cannot open '%s': %s", path, strerror(errno));
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (tok_buf_put(&b, chunk, n) < 0)
            break;
    int bad = ferror(f) || n > 0;
    fclose(f);
    if (bad) {
        free(b.p);
        return n > 0 ? IFLOW_ENOMEM : iflow_seterr(IFLOW_EIO, "cannot read '%s'", path);
    }
    *buf = b.p;
    *len = b.n;
    return 0;
}

static int is_gguf(const char *path)
{
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

static int open_gguf(iflow_tokenizer **out, const char *path)
{
    iflow_gguf *g;
    int rc = iflow_gguf_open(&g, path);
    if (rc < 0)
        return rc;
    rc = tok_from_gguf_handle(out, g);
    iflow_gguf_close(g);
    return rc;
}

static int open_json(iflow_tokenizer **out, const char *path)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = read_file(path, &buf, &len);
    if (rc == 0)
        rc = iflow_tokenizer_from_hf_json(out, buf, len, path);
    free(buf);
    return rc;
}

/* A SentencePiece model, with a vocab.json when vocab is not NULL (and the tokens after it). */
static int open_spm(iflow_tokenizer **out, const char *path, const char *vocab, const iflow_tok_added *added)
{
    char *buf = NULL, *vbuf = NULL;
    size_t len = 0, vlen = 0;
    int rc = read_file(path, &buf, &len);
    if (rc == 0 && vocab)
        rc = read_file(vocab, &vbuf, &vlen);
    if (rc == 0)
        rc = iflow_tokenizer_from_spm(out, buf, len, path, vbuf, vlen, vocab, added);
    free(buf);
    free(vbuf);
    return rc;
}

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && strcmp(s + n - k, tail) == 0;
}

/* ---- finding the files ---------------------------------------------------------------------- */

/* dir/file into path; 1 if it exists. */
static int in_dir(char *path, size_t cap, const char *dir, const char *file)
{
    struct stat st;
    snprintf(path, cap, "%s/%s", dir, file);
    return stat(path, &st) == 0;
}

/* A single file by its kind: a GGUF (by its magic), a SentencePiece model (by its name), else a
 * tokenizer.json. */
static void find_file(iflow_tokenizer_files *f, const char *path)
{
    snprintf(f->file, sizeof f->file, "%s", path);
    f->format = is_gguf(path) ? "gguf" : ends_with(path, ".spm") || ends_with(path, ".model") ? "spm" : "hf-json";
}

/* Marian: `spm` with the vocabulary `vocab` (else vocab.json); 0 when the directory lacks them. */
static int find_marian(iflow_tokenizer_files *f, const char *dir, const char *spm, const char *vocab)
{
    if (in_dir(f->file, sizeof f->file, dir, spm) &&
        (in_dir(f->vocab, sizeof f->vocab, dir, vocab) || in_dir(f->vocab, sizeof f->vocab, dir, "vocab.json"))) {
        f->format = "spm";
        return 1;
    }
    f->file[0] = f->vocab[0] = 0;
    return 0;
}

/* ---- M2M100's language tokens ------------------------------------------------------------ */

/* M2M100Tokenizer's FAIRSEQ_LANGUAGE_CODES (transformers' tokenization_m2m_100.py) as its tokens:
 * in this order they follow vocab.json's ids. */
static const char *const m2m100_tokens[] = {
    "__af__", "__am__", "__ar__", "__ast__", "__az__", "__ba__", "__be__", "__bg__", "__bn__", "__br__",
    "__bs__", "__ca__", "__ceb__", "__cs__", "__cy__", "__da__", "__de__", "__el__", "__en__", "__es__",
    "__et__", "__fa__", "__ff__", "__fi__", "__fr__", "__fy__", "__ga__", "__gd__", "__gl__", "__gu__",
    "__ha__", "__he__", "__hi__", "__hr__", "__ht__", "__hu__", "__hy__", "__id__", "__ig__", "__ilo__",
    "__is__", "__it__", "__ja__", "__jv__", "__ka__", "__kk__", "__km__", "__kn__", "__ko__", "__lb__",
    "__lg__", "__ln__", "__lo__", "__lt__", "__lv__", "__mg__", "__mk__", "__ml__", "__mn__", "__mr__",
    "__ms__", "__my__", "__ne__", "__nl__", "__no__", "__ns__", "__oc__", "__or__", "__pa__", "__pl__",
    "__ps__", "__pt__", "__ro__", "__ru__", "__sd__", "__si__", "__sk__", "__sl__", "__so__", "__sq__",
    "__sr__", "__ss__", "__su__", "__sv__", "__sw__", "__ta__", "__th__", "__tl__", "__tn__", "__tr__",
    "__uk__", "__ur__", "__uz__", "__vi__", "__wo__", "__xh__", "__yi__", "__yo__", "__zh__", "__zu__"};
static const char *const wmt21_tokens[] = {
    "__en__", "__ha__", "__is__", "__ja__", "__cs__", "__ru__", "__zh__", "__de__"};
#define N_M2M100 (int)(sizeof m2m100_tokens / sizeof m2m100_tokens[0])
#define N_WMT21 (int)(sizeof wmt21_tokens / sizeof wmt21_tokens[0])

static int config_int(const json_t *cfg, const char *key, int fallback)
{
    const json_t *v = json_object_get(cfg, key);
    return json_is_integer(v) ? (int)json_integer_value(v) : fallback;
}

/* tokenizer_config.json's language_codes, num_madeup_words and src_lang (M2M100Tokenizer's
 * defaults when the file or a key is absent) into f->added. */
static int m2m100_added(iflow_tokenizer_files *f, const char *dir)
{
    char path[4096 + 32];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    const char *list = json_string_value(json_object_get(cfg, "language_codes")),
               *src = json_string_value(json_object_get(cfg, "src_lang"));
    list = list ? list : "m2m100";
    src = src ? src : "en";
    int wmt = strcmp(list, "wmt21") == 0, rc = 0;
    if (!wmt && strcmp(list, "m2m100") != 0)
        rc = iflow_seterr(IFLOW_EUNSUPPORTED, "unknown language_codes '%s' in '%s' (m2m100 or wmt21)", list, path);
    f->added.tokens = wmt ? wmt21_tokens : m2m100_tokens;
    f->added.n = wmt ? N_WMT21 : N_M2M100;
    f->added.hidden = config_int(cfg, "num_madeup_words", 8);
    snprintf(f->added.prefix, sizeof f->added.prefix, "__%.40s__", src);
    int known = 0;
    for (int i = 0; i < f->added.n; i++)
        known |= strcmp(f->added.tokens[i], f->added.prefix) == 0;
    if (rc == 0 && !known)
        rc = iflow_seterr(IFLOW_EUNSUPPORTED, "unknown src_lang '%s' in '%s' (not among language_codes %s)", src, path, list);
    if (rc == 0 && (f->added.hidden < 0 || f->added.hidden > IFLOW_TOK_MAX_ADDED))
        rc = iflow_seterr(IFLOW_ERANGE, "num_madeup_words %d in '%s' is not 0 to %d", f->added.hidden, path,
                          IFLOW_TOK_MAX_ADDED);
    json_decref(cfg);
    return rc;
}

/* M2M100: sentencepiece.bpe.model with vocab.json; 1 when found, 0 when not, < 0 on a bad
 * tokenizer_config.json. */
static int find_m2m100(iflow_tokenizer_files *f, const char *dir)
{
    if (!in_dir(f->file, sizeof f->file, dir, "sentencepiece.bpe.model") ||
        !in_dir(f->vocab, sizeof f->vocab, dir, "vocab.json")) {
        f->file[0] = f->vocab[0] = 0;
        return 0;
    }
    f->format = "spm";
    int rc = m2m100_added(f, dir);
    return rc < 0 ? rc : 1;
}

static int find_in_dir(iflow_tokenizer_files *f, const char *dir, int side)
{
    int rc = 0;
    f->in_dir = 1;
    if (side == IFLOW_TOK_TARGET && find_marian(f, dir, "target.spm", "target_vocab.json"))
        return 0;
    if (in_dir(f->file, sizeof f->file, dir, "tokenizer.json"))
        f->format = "hf-json";
    else if (in_dir(f->file, sizeof f->file, dir, "tokenizer.gguf"))
        f->format = "gguf";
    else if (!find_marian(f, dir, "source.spm", "vocab.json") && (rc = find_m2m100(f, dir)) == 0 &&
             in_dir(f->file, sizeof f->file, dir, "spiece.model"))
        f->format = "spm";
    if (rc < 0)
        return rc;
    if (!f->format)
        return iflow_seterr(IFLOW_ENOTFOUND,
                            "no tokenizer.json, tokenizer.gguf, source.spm with vocab.json, sentencepiece.bpe.model with "
                            "vocab.json, or spiece.model in directory '%s'",
                            dir);
    return 0;
}

/* 1 for a directory, 0 for anything else, < 0 when path does not exist. */
static int path_kind(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return iflow_seterr(errno == ENOENT ? IFLOW_ENOTFOUND : IFLOW_EIO, "cannot open '%s': %s", path, strerror(errno));
    return S_ISDIR(st.st_mode) ? 1 : 0;
}

int iflow_tokenizer_find(iflow_tokenizer_files *f, const char *path, int side)
{
    memset(f, 0, sizeof *f);
    if (!path)
        return iflow_seterr(IFLOW_EINVAL, "iflow_tokenizer_find: null argument");
    int kind = path_kind(path);
    if (kind == 0)
        find_file(f, path);
    return kind < 0 ? kind : kind ? find_in_dir(f, path, side) : 0;
}

/* ---- opening what was found ----------------------------------------------------------------- */

/* "bos_token": "<s>" or {"content": "<s>", ...} in tokenizer_config.json. */
static int32_t config_token(const iflow_tokenizer *t, const json_t *cfg, const char *key)
{
    const json_t *v = json_object_get(cfg, key);
    const json_t *s = json_is_object(v) ? json_object_get(v, "content") : v;
    if (!json_is_string(s))
        return -1;
    return iflow_strmap_get(&t->vocab, json_string_value(s), json_string_length(s));
}

/* "eos_token_id": 2 or [2, 7] in config.json. */
static int32_t config_id(const iflow_tokenizer *t, const json_t *cfg, const char *key)
{
    const json_t *v = json_object_get(cfg, key);
    if (json_is_array(v))
        v = json_array_get(v, 0);
    json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
    return id >= 0 && id < t->n_vocab ? (int32_t)id : -1;
}

static json_t *load_json_file(const char *dir, const char *file)
{
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return json_load_file(path, 0, NULL);
}

/* A tokenizer.json's directory: bos/eos from its tokenizer_config.json or config.json.
 * Optional files: anything missing or malformed is ignored. */
static void apply_dir_config(iflow_tokenizer *t, const char *dir)
{
    json_t *tc = load_json_file(dir, "tokenizer_config.json"), *c = load_json_file(dir, "config.json");
    int32_t bos = config_token(t, tc, "bos_token"), eos = config_token(t, tc, "eos_token");
    if (bos < 0)
        bos = config_id(t, c, "bos_token_id");
    if (eos < 0)
        eos = config_id(t, c, "eos_token_id");
    if (bos >= 0)
        t->bos = bos;
    if (eos >= 0)
        t->eos = eos;
    json_decref(tc);
    json_decref(c);
}

int iflow_tokenizer_open_files(iflow_tokenizer **out, const iflow_tokenizer_files *f)
{
    int rc = strcmp(f->format, "gguf") == 0  ? open_gguf(out, f->file)
             : strcmp(f->format, "spm") == 0 ? open_spm(out, f->file, f->vocab[0] ? f->vocab : NULL, &f->added)
                                             : open_json(out, f->file);
    if (rc == 0 && f->in_dir && strcmp(f->format, "hf-json") == 0) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", f->file);
        *strrchr(dir, '/') = 0; /* in_dir wrote "dir/tokenizer.json" */
        apply_dir_config(*out, dir);
    }
    return rc;
}

/* The tokenizer of path's `side`. */
static int open_side(iflow_tokenizer **out, const char *path, int side, const char *fn)
{
    iflow_tokenizer_files f;
    if (!out || !path)
        return iflow_seterr(IFLOW_EINVAL, "%s: null argument", fn);
    *out = NULL;
    int rc = iflow_tokenizer_find(&f, path, side);
    return rc < 0 ? rc : iflow_tokenizer_open_files(out, &f);
}

int iflow_tokenizer_open(iflow_tokenizer **out, const char *path)
{
    return open_side(out, path, IFLOW_TOK_SOURCE, "iflow_tokenizer_open");
}

int iflow_tokenizer_open_target(iflow_tokenizer **out, const char *path)
{
    return open_side(out, path, IFLOW_TOK_TARGET, "iflow_tokenizer_open_target");
}

int iflow_tokenizer_from_format(iflow_tokenizer **out, const char *format, const void *data, size_t len,
                                const char *name, const char *vocab, size_t vocab_len, const char *vocab_name,
                                const iflow_tok_added *added)
{
    if (strcmp(format, "hf-json") == 0)
        return iflow_tokenizer_from_hf_json(out, data, len, name);
    if (strcmp(format, "gguf") == 0)
        return iflow_tokenizer_from_gguf(out, data, len, name);
    if (strcmp(format, "spm") == 0)
        return iflow_tokenizer_from_spm(out, data, len, name, vocab, vocab_len, vocab_name, added);
    return iflow_seterr(IFLOW_EUNSUPPORTED, "unknown tokenizer format '%s' in '%s'", format, name);
}
