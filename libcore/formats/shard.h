/*
 * shard.h -- the iflow shard file, version 1: how models travel between the tools.
 *
 * Byte layout (all integers little-endian; man/iflow-shard.5 is the full description)
 *
 *   file header, 64 bytes at offset 0
 *     0   char[8]  magic "IFLOWSHD"
 *     8   u32      format version (1)
 *     12  u32      header size (64)
 *     16  u32      alignment of every record and payload (64)
 *     20  u8[40]   reserved, zero
 *     60  u32      XXH32 (seed 0) of bytes 0..59
 *   then records, back to back, each starting at a multiple of 64:
 *     0   char[4]  tag: "BLOB" (bytes), "TNSR" (tensor) or "END!" (last record)
 *     4   u32      hdr_size: size of this record header, a multiple of 64
 *     8   u64      data_size: payload bytes after the header (then zero padding to 64)
 *     16  u64      XXH64 (seed 0) of the data_size payload bytes
 *     24  u32      dtype (IFLOW_DT_*; u8 for blobs)
 *     28  u32      n_dims, 0..4 (blobs: 1, shape[0] = data_size)
 *     32  u64[4]   shape, outermost first, unused dimensions 0
 *     64  u32      name length, then the name (UTF-8), zero padding
 *     hdr_size-4   u32 XXH32 (seed 0) of the header's bytes 0 .. hdr_size-5
 *   The first record is the BLOB "meta": JSON text (format, resolved spec, hyperparameters,
 *   tokenizer description, shard placement). The END! record carries the number of records
 *   before it in shape[0]; a stream without it is truncated.
 *
 *   The tokenizer is BLOB records of its files' bytes, unchanged: "tokenizer" for a one-file
 *   tokenizer (a tokenizer.json, a GGUF vocabulary), "tokenizer/<file name>" for each file of
 *   a SentencePiece one ("tokenizer/source.spm", "tokenizer/target.spm", "tokenizer/vocab.json",
 *   "tokenizer/spiece.model"; a file both sides use once). Meta's "tokenizer" object names them:
 *     {"format": "hf-json" | "gguf" | "spm", "record": BLOB, "vocab": BLOB (spm with a Marian
 *      vocab.json), "file", "vocab_file": the files' names (informational),
 *      "target": {the same keys} (an encoder-decoder's target side, when it has its own)}
 *   Shards written before SentencePiece files were stored have {"format", "record":
 *   "tokenizer"} only, and read the same way (libcore/tokenizers/tok_shard.c reads,
 *   libcore/formats/tokrec.c writes).
 *   A chat template (Jinja text) is the BLOB "chat_template", its bytes as the checkpoint had
 *   them (at most IFLOW_MAX_CHAT_TEMPLATE); meta's "chat_template" is {"record": "chat_template",
 *   "from": where convert found it} (libcore/formats/convert.c writes, libcore/serving/chat.c reads).
 *
 * Why this shape: each record is complete when written (its checksum is of data in hand),
 * so a writer streams to a pipe with no seeking back and holds one tensor at a time; a
 * reader from a pipe reads records in order; from disk the file is mmap-ed and every payload
 * sits 64-byte aligned, used in place. A file may also be one zstd frame of the same bytes
 * (".ifs.zst"), decompressed while read.
 *
 * Contract
 *   iflow_shard_open() loads a whole shard: from a regular uncompressed file by mmap (payloads
 *   point into the mapping), otherwise (pipe, "-", zstd) by reading every record into memory it
 *   owns. Unless IFLOW_SHARD_NO_VERIFY, every header and payload checksum is verified at open.
 *   Record pointers stay valid until iflow_shard_close().
 *   iflow_shard_reader_* reads a stream one record at a time (memory: one record), for tools
 *   that transform a model tensor by tensor.
 *   iflow_shard_writer_open() writes to a temporary file beside the target and renames it on
 *   iflow_shard_writer_close(); on any failure or iflow_shard_writer_abort() the temporary is
 *   removed, so no half-written file is ever left under the target name. Path "-" (or NULL)
 *   writes to standard output.
 */
#ifndef IFLOW_SHARD_H
#define IFLOW_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define IFLOW_MAX_CHAT_TEMPLATE (1u << 20) /* bytes of a chat template, read from any file */

#define IFLOW_SHARD_VERSION 1
#define IFLOW_SHARD_ALIGN   64
#define IFLOW_SHARD_MAX_DIMS 4

enum { IFLOW_REC_BLOB = 1, IFLOW_REC_TENSOR = 2, IFLOW_REC_END = 3 };

enum {
    IFLOW_SHARD_NO_VERIFY = 1, /* open: skip payload checksums (headers are always checked) */
    IFLOW_SHARD_ZSTD      = 2, /* writer: compress the stream with zstd                     */
};

typedef struct {
    const char *name;
    int         kind;     /* IFLOW_REC_BLOB or IFLOW_REC_TENSOR */
    int         dtype;    /* IFLOW_DT_*                          */
    int         n_dims;
    int64_t     shape[IFLOW_SHARD_MAX_DIMS];
    const void *data;     /* 64-byte aligned                     */
    size_t      nbytes;
    uint64_t    offset;   /* byte offset of the payload in the (uncompressed) stream */
    uint64_t    xxh64;
} iflow_shard_rec;

/* ---- whole-shard reader ---- */
typedef struct iflow_shard iflow_shard;

int  iflow_shard_open(iflow_shard **out, const char *path, int flags);
void iflow_shard_close(iflow_shard *sh);
const char *iflow_shard_path(const iflow_shard *sh);
/* The "meta" blob as a NUL-terminated string. */
const char *iflow_shard_meta(const iflow_shard *sh);
size_t iflow_shard_n_records(const iflow_shard *sh);
const iflow_shard_rec *iflow_shard_rec_at(const iflow_shard *sh, size_t i);
/* NULL if absent. */
const iflow_shard_rec *iflow_shard_find(const iflow_shard *sh, const char *name);
/* 1 if the payloads live in a file mapping (mmap), 0 if in memory read from a stream. */
int iflow_shard_is_mapped(const iflow_shard *sh);
/* The pages wholly inside [p, p + n) of sh's mapping leave this process (MADV_DONTNEED: the
 * page cache keeps them, and a later read maps them again), for payloads a user has copied
 * elsewhere and no longer reads. Nothing when sh is not mapped or the range is not in it. */
void iflow_shard_release(const iflow_shard *sh, const void *p, size_t n);

/* ---- streaming reader ---- */
typedef struct iflow_shard_reader iflow_shard_reader;

int  iflow_shard_reader_open(iflow_shard_reader **out, const char *path);
/* Read the next record into *rec (valid until the next call). Returns 1 for a record, 0 at the
 * END! record (after checking its count), <0 on error (truncation, corruption). */
int  iflow_shard_reader_next(iflow_shard_reader *r, iflow_shard_rec *rec);
void iflow_shard_reader_close(iflow_shard_reader *r);

/* ---- writer ---- */
typedef struct iflow_shard_writer iflow_shard_writer;

int  iflow_shard_writer_open(iflow_shard_writer **out, const char *path, int flags);
int  iflow_shard_write_blob(iflow_shard_writer *w, const char *name, const void *data, size_t n);
int  iflow_shard_write_tensor(iflow_shard_writer *w, const char *name, int dtype, int n_dims,
                              const int64_t *shape, const void *data, size_t nbytes);
/* Finish: END! record, flush, rename into place. Frees w whatever the result. */
int  iflow_shard_writer_close(iflow_shard_writer *w);
/* Give up: remove the temporary file. Frees w. */
void iflow_shard_writer_abort(iflow_shard_writer *w);

#endif
