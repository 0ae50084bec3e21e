/* tok_open.c -- which files make a tokenizer (iflow_tokenizer_find: a tokenizer.json, a GGUF file
 * sniffed by its magic, a SentencePiece model .spm / .model, or a model directory: tokenizer.json
 * with bos/eos from tokenizer_config.json / config.json, else tokenizer.gguf, else Marian's
 * source.spm + vocab.json -- target.spm for the target side -- else spiece.model), opening them
 * (iflow_tokenizer_open, _open_target, _open_files), and a tokenizer from a format's bytes
 * (iflow_tokenizer_from_format, as a shard stores them). */
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

/* A SentencePiece model, with a Marian vocab.json when vocab is not NULL. */
static int open_spm(iflow_tokenizer **out, const char *path, const char *vocab)
{
    char *buf = NULL, *vbuf = NULL;
    size_t len = 0, vlen = 0;
    int rc = read_file(path, &buf, &len);
    if (rc == 0 && vocab)
        rc = read_file(vocab, &vbuf, &vlen);
    if (rc == 0)
        rc = iflow_tokenizer_from_spm(out, buf, len, path, vbuf, vlen, vocab);
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

static int find_in_dir(iflow_tokenizer_files *f, const char *dir, int side)
{
    f->in_dir = 1;
    if (side == IFLOW_TOK_TARGET && find_marian(f, dir, "target.spm", "target_vocab.json"))
        return 0;
    if (in_dir(f->file, sizeof f->file, dir, "tokenizer.json"))
        f->format = "hf-json";
    else if (in_dir(f->file, sizeof f->file, dir, "tokenizer.gguf"))
        f->format = "gguf";
    else if (!find_marian(f, dir, "source.spm", "vocab.json") && in_dir(f->file, sizeof f->file, dir, "spiece.model"))
        f->format = "spm";
    if (!f->format)
        return iflow_seterr(IFLOW_ENOTFOUND,
                            "no tokenizer.json, tokenizer.gguf, source.spm with vocab.json, or spiece.model in directory '%s'",
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
             : strcmp(f->format, "spm") == 0 ? open_spm(out, f->file, f->vocab[0] ? f->vocab : NULL)
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
                                const char *name, const char *vocab, size_t vocab_len, const char *vocab_name)
{
    if (strcmp(format, "hf-json") == 0)
        return iflow_tokenizer_from_hf_json(out, data, len, name);
    if (strcmp(format, "gguf") == 0)
        return iflow_tokenizer_from_gguf(out, data, len, name);
    if (strcmp(format, "spm") == 0)
        return iflow_tokenizer_from_spm(out, data, len, name, vocab, vocab_len, vocab_name);
    return iflow_seterr(IFLOW_EUNSUPPORTED, "unknown tokenizer format '%s' in '%s'", format, name);
}
