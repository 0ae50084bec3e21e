/*
 * ggufsrc.h -- a GGUF model file as a model source for the converter: its metadata as a config,
 * its tensors in iflow's terms, its tokenizer, and the conversion of ggml tensor types.
 *
 * Contract
 *   iflow_ggufsrc_open() parses a GGUF file (gguf.h checks every size, offset, dimension and
 *   type of the tensor table against the file) and presents:
 *     - config: a JSON object built from the metadata, nested at the dots of the keys, so that a
 *       spec reads "llama.attention.head_count" as it reads a config.json key. A scalar key gives
 *       its value; an array key K gives {"count": n}, so "tokenizer.ggml.tokens.count" is the
 *       vocabulary size. "tensors" holds true at each tensor name (also nested at the dots:
 *       "tensors.output.weight" is present when the file has output.weight). A key that
 *       collides with another's nesting is left out.
 *     - tensors: iflow_src_tensor records with shape outermost first (ggml's ne reversed), data
 *       pointing into the mapping and dtype = the iflow type the tensor converts to without a
 *       second rounding (below), or -1 when iflow cannot convert the ggml type (dtype_name
 *       then names it, e.g. "iq2_xxs").
 *     - tokenizer: a GGUF vocabulary file (tok_gguf.c reads it) holding every key-value entry
 *       of the model file verbatim and no tensors.
 *
 *   Conversions (iflow_ggufsrc_payload). iflow's block types store w = min + q * delta with
 *   F16 delta and min (kernels/cpu/quant.h). Three ggml types fit that form with no second
 *   rounding: q * delta is exact in F32 (at most 8 + 11 significant bits) and so is the sum,
 *   whose exact value is ggml's own w, so every decoded value equals ggml's dequantization
 *   (as a value: ggml's (q - 8) * d gives -0 where q = 8 and d < 0, iflow's form +0):
 *     F32, F16, BF16 -> the same type (the source's bytes)
 *     Q4_1 -> Q4_B32  the source's bytes: the same block (f16 d, f16 m, qs[j] = q[j] | q[j+16] << 4)
 *     Q4_0 -> Q4_B32  delta = d, min = -8 d, the same nibbles (w = (q - 8) d)
 *     Q8_0 -> Q8_B32  delta = d, min = -128 d, level q + 128 (w = q d, q in -128..127)
 *   -8 d and -128 d are exact in F16 (a power-of-two scale) unless they overflow F16 (|d| >
 *   8188 for Q4_0, > 511.75 for Q8_0) or d is not finite; a tensor with such a block is
 *   dequantized to F32 instead (its dtype says so). Every other supported type is dequantized
 *   to F32 bit for bit as ggml does it: Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (tested against
 *   gguf-py, tests/unit/test_ggufsrc.c). Any convertible tensor can also be dequantized to F32,
 *   F16 or BF16 (rounded once, to nearest even, from the F32 value).
 *   Errors name the file and tensor. The handle owns everything it returns until close.
 */
#ifndef IFLOW_GGUFSRC_H
#define IFLOW_GGUFSRC_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "srctensor.h"

typedef struct iflow_ggufsrc iflow_ggufsrc;

/* 1 if the file at path starts with the GGUF magic. */
int iflow_is_gguf_file(const char *path);

int  iflow_ggufsrc_open(iflow_ggufsrc **out, const char *path);
/* Take over an open GGUF handle (closed with the source, also on failure). */
int  iflow_ggufsrc_from(iflow_ggufsrc **out, iflow_gguf *g);
void iflow_ggufsrc_close(iflow_ggufsrc *s); /* NULL is fine */

const char   *iflow_ggufsrc_path(const iflow_ggufsrc *s);
const json_t *iflow_ggufsrc_config(const iflow_ggufsrc *s);
/* general.architecture, or NULL when the file has none. */
const char   *iflow_ggufsrc_architecture(const iflow_ggufsrc *s);

size_t                  iflow_ggufsrc_n_tensors(const iflow_ggufsrc *s);
const iflow_src_tensor *iflow_ggufsrc_tensor(const iflow_ggufsrc *s, size_t i); /* NULL past end */
const iflow_src_tensor *iflow_ggufsrc_find(const iflow_ggufsrc *s, const char *name); /* or NULL */

/* The vocabulary file (malloc'd; the caller frees *blob). IFLOW_ENOTFOUND when the file has no
 * tokenizer.ggml.model key. */
int iflow_ggufsrc_tokenizer(const iflow_ggufsrc *s, void **blob, size_t *len);
/* The chat template (key tokenizer.chat_template; *text NUL-terminated, owned by s): 0, or
 * IFLOW_ENOTFOUND when the file has none, IFLOW_EFORMAT when the key is not a string. */
int iflow_ggufsrc_chat_template(const iflow_ggufsrc *s, const char **text, size_t *len);

/* Tensor t (from s, or a copy of one of s's records narrowed to some of its rows: data and
 * shape[0] a whole number of rows into it, as a spec's NAME[A:B] makes) in iflow type dt: *data
 * points into the source when the bytes are the same, else into buf, which must hold
 * iflow_tensor_nbytes(dt, ...) of t's shape. dt is t->dtype, or
 * F32, F16 or BF16 (dequantized); anything else is IFLOW_EUNSUPPORTED naming the tensor. */
int iflow_ggufsrc_payload(const iflow_ggufsrc *s, const iflow_src_tensor *t, int dt, const void **data, void *buf);

#endif
