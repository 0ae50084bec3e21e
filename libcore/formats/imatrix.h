/*
 * imatrix.h -- importance matrices: for each weight matrix of a model, the mean squared
 * activation each of its input columns sees on calibration text (iflow-ppl --save-imatrix
 * computes one; iflow-quant --imatrix weighs each column's rounding error by it). The file
 * format is iflow-imatrix(5); briefly, all little-endian:
 *     "IFIMTX01"  u32 n_entries  u32 0  u64 n_tokens
 *     n_entries x { u16 name_len  name[name_len]  u32 K  u64 count  f32 mean_sq[K] }
 *     "IFIMEND!"
 * where count is the number of activation rows (tokens) the matrix saw and mean_sq[k] the mean
 * of x_k^2 over them.
 *
 * Contract
 *   iflow_imatrix_parse() checks everything of an untrusted buffer (magic, sizes against the
 *   bytes there, names 1..255 printable bytes and unique, K in 1..2^24, every value finite and
 *   >= 0, the end marker and nothing after it) and names the entry and byte offset of the first
 *   problem. iflow_imatrix_check_model() checks it fits a model: every entry names a matrix of
 *   the model with the same number of columns, and every matrix the model multiplies with (all
 *   matrices but untied token embeddings; an expert no token was routed to may have none) has an
 *   entry; the message names the tensor.
 *   Errors: IFLOW_EFORMAT (a bad file), IFLOW_EINVAL (another model's), IFLOW_EIO, IFLOW_ENOMEM.
 */
#ifndef IFLOW_IMATRIX_H
#define IFLOW_IMATRIX_H

#include <stddef.h>
#include <stdint.h>

#define IFLOW_IMATRIX_MAX_K (1 << 24)

typedef struct {
    char     *name;      /* iflow tensor name: "blk.3.wq", "output", ...      */
    int       K;         /* input columns of the matrix                        */
    uint64_t  count;     /* activation rows (tokens) accumulated               */
    float    *mean_sq;   /* [K] mean of x_k^2                                   */
} iflow_imatrix_entry;

typedef struct iflow_imatrix {
    iflow_imatrix_entry *e;   /* [n] in file order */
    size_t    n;
    uint64_t  n_tokens;       /* calibration tokens evaluated */
} iflow_imatrix;

/* An empty matrix (n_tokens 0), to fill with iflow_imatrix_add. */
int  iflow_imatrix_new(iflow_imatrix **out);
/* Append an entry (name copied, mean_sq: [K] copied). IFLOW_EINVAL for a duplicate name or a bad K. */
int  iflow_imatrix_add(iflow_imatrix *im, const char *name, int K, uint64_t count, const float *mean_sq);
void iflow_imatrix_free(iflow_imatrix *im);   /* NULL is fine */

/* Parse the n bytes at buf; `where` names the file in messages. */
int iflow_imatrix_parse(iflow_imatrix **out, const void *buf, size_t n, const char *where);
int iflow_imatrix_load(iflow_imatrix **out, const char *path);
/* Write to path (atomically: a temporary file renamed when complete). */
int iflow_imatrix_save(const iflow_imatrix *im, const char *path);

/* The entry for a tensor, or NULL. */
const iflow_imatrix_entry *iflow_imatrix_find(const iflow_imatrix *im, const char *name);

/* Does im fit the model whose matrices are names[i] with cols[i] input columns (n of them)?
 * mult[i] is 1 for a matrix the model multiplies activations with, 2 for one it multiplies only
 * some rows with, which may have no entry (an expert of a mixture that the text never routed a
 * token to), 0 for one it only looks rows up in (untied token embeddings). im_name and
 * model_name name both in messages. */
int iflow_imatrix_check_model(const iflow_imatrix *im, const char *const *names, const int64_t *cols,
                              const int *mult, size_t n, const char *im_name, const char *model_name);

#endif
