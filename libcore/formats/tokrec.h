/*
 * tokrec.h -- a tokenizer's files as shard records: what iflow-convert stores so that a shard
 * alone is enough to encode text and decode ids (shard.h has the layout; tokenizer.h's
 * iflow_tokenizer_from_shard() builds the tokenizers back from it).
 *
 * Contract
 *   iflow_tokrec_find() finds the files of a tokenizer path -- a model directory or what
 *   iflow-convert --tokenizer names, a file or a directory -- with iflow_tokenizer_find(): the
 *   source side's, and the target side's when they differ (Marian's target.spm). With
 *   `required` 0 a directory holding none is no error: the set is empty (a shard without a
 *   tokenizer). iflow_tokrec_blob() makes the set of a tokenizer already in memory (a GGUF
 *   source's vocabulary, format "gguf"; the set keeps the pointer, the caller the bytes).
 *   Records: a tokenizer.json or GGUF vocabulary is the blob "tokenizer" (the layout of shards
 *   written before SentencePiece files were stored); a SentencePiece model and a Marian
 *   vocab.json are blobs "tokenizer/<file name>", a file two sides share stored once.
 *   iflow_tokrec_describe() gives meta's "tokenizer" object (shard.h), NULL for an empty set.
 *   iflow_tokrec_write() reads each file (at most 64 MiB), checks that each side's tokenizer
 *   builds from the bytes (the error names the file), and writes the blob records.
 *   Errors: a negative IFLOW_E* code with the message naming the file or directory.
 */
#ifndef IFLOW_TOKREC_H
#define IFLOW_TOKREC_H

#include <jansson.h>
#include <stddef.h>

#include "libcore/tokenizers/tokenizer.h"
#include "shard.h"

typedef struct {
    iflow_tokenizer_files f;          /* format and paths                              */
    char record[128], vocab_record[128]; /* its blobs' names ("" vocab_record: none)    */
} iflow_tokrec_side;

typedef struct {
    int n_sides;                      /* 0: no tokenizer; 1: one for both; 2: source, target */
    iflow_tokrec_side side[2];
    const void *blob;                 /* a tokenizer in memory (iflow_tokrec_blob), or NULL */
    size_t blob_len;
} iflow_tokrec;

int iflow_tokrec_find(iflow_tokrec *t, const char *path, int required);
void iflow_tokrec_blob(iflow_tokrec *t, const void *data, size_t len);
json_t *iflow_tokrec_describe(const iflow_tokrec *t);
int iflow_tokrec_write(const iflow_tokrec *t, iflow_shard_writer *w);

#endif
