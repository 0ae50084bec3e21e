/* tokrec.c -- a tokenizer's files as shard records. See tokrec.h. */
#include "tokrec.h"
#include "libcore/base/error.h"
#include "libcore/base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENIZER_BYTES (64u << 20)

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The records of side s's files: one blob "tokenizer" for a single-file format, else
 * "tokenizer/<file name>" for each file. */
static void name_records(iflow_tokrec_side *s)
{
    if (strcmp(s->f.format, "spm") != 0) {
        snprintf(s->record, sizeof s->record, "tokenizer");
        return;
    }
    snprintf(s->record, sizeof s->record, "tokenizer/%.100s", base_name(s->f.file));
    if (s->f.vocab[0])
        snprintf(s->vocab_record, sizeof s->vocab_record, "tokenizer/%.100s", base_name(s->f.vocab));
}

static int same_files(const iflow_tokenizer_files *a, const iflow_tokenizer_files *b)
{
    return strcmp(a->file, b->file) == 0 && strcmp(a->vocab, b->vocab) == 0;
}

int iflow_tokrec_find(iflow_tokrec *t, const char *path, int required)
{
    memset(t, 0, sizeof *t);
    int rc = iflow_tokenizer_find(&t->side[0].f, path, IFLOW_TOK_SOURCE);
    if (rc == IFLOW_ENOTFOUND && !required)
        return 0;
    if (rc == 0)
        rc = iflow_tokenizer_find(&t->side[1].f, path, IFLOW_TOK_TARGET);
    if (rc < 0)
        return iflow_preperr(rc, "cannot find the tokenizer");
    t->n_sides = same_files(&t->side[0].f, &t->side[1].f) ? 1 : 2;
    for (int i = 0; i < t->n_sides; i++)
        name_records(&t->side[i]);
    return 0;
}

void iflow_tokrec_blob(iflow_tokrec *t, const void *data, size_t len)
{
    memset(t, 0, sizeof *t);
    t->n_sides = 1;
    t->side[0].f.format = "gguf";
    snprintf(t->side[0].record, sizeof t->side[0].record, "tokenizer");
    t->blob = data;
    t->blob_len = len;
}

/* {"format", "record", "file", "vocab"?, "vocab_file"?} of one side. */
static json_t *describe_side(const iflow_tokrec_side *s, int in_memory)
{
    json_t *d = json_pack("{s:s, s:s}", "format", s->f.format, "record", s->record);
    if (d && !in_memory)
        json_object_set_new(d, "file", json_string(base_name(s->f.file)));
    if (d && s->vocab_record[0]) {
        json_object_set_new(d, "vocab", json_string(s->vocab_record));
        json_object_set_new(d, "vocab_file", json_string(base_name(s->f.vocab)));
    }
    return d;
}

json_t *iflow_tokrec_describe(const iflow_tokrec *t)
{
    if (!t->n_sides)
        return NULL;
    json_t *d = describe_side(&t->side[0], t->blob != NULL);
    if (d && t->n_sides == 2)
        json_object_set_new(d, "target", describe_side(&t->side[1], 0));
    return d;
}

/* A blob record of a file's bytes, unless `written` (NULL-terminated) holds its name already. */
static int write_once(iflow_shard_writer *w, const char *record, const char *data, size_t len, const char **written)
{
    int k = 0;
    for (; written[k]; k++)
        if (strcmp(written[k], record) == 0)
            return 0;
    written[k] = record;
    return iflow_shard_write_blob(w, record, data, len);
}

/* Side s: its files read, its tokenizer built from them (a check), its records written. */
static int write_side(const iflow_tokrec_side *s, iflow_shard_writer *w, const char **written)
{
    char *data = NULL, *vocab = NULL;
    size_t len = 0, vlen = 0;
    iflow_tokenizer *tok = NULL;
    int rc = iflow_read_file(s->f.file, MAX_TOKENIZER_BYTES, &data, &len);
    if (rc == 0 && s->f.vocab[0])
        rc = iflow_read_file(s->f.vocab, MAX_TOKENIZER_BYTES, &vocab, &vlen);
    if (rc == 0 && (rc = iflow_tokenizer_from_format(&tok, s->f.format, data, len, s->f.file, vocab, vlen, s->f.vocab)))
        rc = iflow_preperr(rc, "cannot build the tokenizer (read as %s)", s->f.format);
    if (rc == 0)
        rc = write_once(w, s->record, data, len, written);
    if (rc == 0 && vocab)
        rc = write_once(w, s->vocab_record, vocab, vlen, written);
    iflow_tokenizer_close(tok);
    free(data);
    free(vocab);
    return rc;
}

int iflow_tokrec_write(const iflow_tokrec *t, iflow_shard_writer *w)
{
    const char *written[5] = {0};
    if (t->blob)
        return iflow_shard_write_blob(w, t->side[0].record, t->blob, t->blob_len);
    int rc = 0;
    for (int i = 0; i < t->n_sides && rc == 0; i++)
        rc = write_side(&t->side[i], w, written);
    return rc;
}
