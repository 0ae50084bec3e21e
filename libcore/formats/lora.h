/*
 * lora.h -- a LoRA adapter: low-rank deltas of some of a model's matrices, read so that the
 * converter can merge them into the weights it writes.
 *
 * Contract
 *   An adapter changes each matrix W [out][in] it names into W + s B A, with A [r][in] and
 *   B [out][r] (Hu et al., "LoRA", 2021). iflow_lora_open() reads either of the two forms in use:
 *     - PEFT's (Hugging Face): a directory holding adapter_config.json and
 *       adapter_model.safetensors, or that .safetensors file with the config beside it.
 *       "base_model.model.X.lora_A.weight" is A of the model's tensor "X.weight" and
 *       "base_model.model.X.lora_B.weight" its B (PEFT's save strips the adapter's own name; a
 *       ".default" before ".weight" is accepted too). s = lora_alpha / r, or lora_alpha / sqrt(r)
 *       with use_rslora. Refused by name, never merged wrong: fan_in_fan_out (Conv1D layouts),
 *       use_dora, alpha_pattern / rank_pattern, a LoRA bias, embedding adapters
 *       (lora_embedding_A/B) and full modules saved beside the adapter (modules_to_save).
 *     - llama.cpp's GGUF (convert_lora_to_gguf.py): general.type = "adapter", adapter.type =
 *       "lora", "X.lora_a" (ggml ne [in, r]: A) and "X.lora_b" (ne [r, out]: B) for the model's
 *       tensor X. s = adapter.lora.alpha / r, or 1 when the file has no alpha or alpha is 0 (as
 *       llama.cpp reads it). A and B may be of any type ggufsrc.h dequantizes.
 *   s is then multiplied by the caller's scale. Each A has its B and the reverse, both are
 *   matrices whose ranks agree (1 .. IFLOW_LORA_MAX_RANK), and no target is named twice; every
 *   tensor of the file belongs to a pair. A and B are read into F32 at open (an adapter is small);
 *   a file whose deltas would hold more than IFLOW_LORA_MAX_FLOATS values is refused.
 *
 *   A delta's `target` is the model tensor's name as the adapter names it: Hugging Face names
 *   ("model.layers.0.self_attn.q_proj.weight") for PEFT, GGUF names ("blk.0.attn_q.weight") for
 *   llama.cpp's form; iflow_lora_naming() says which, and the converter maps them onto its
 *   source's naming (convert.h). Whether the shapes fit the model is the converter's check
 *   (in == W's columns, out == W's rows).
 *
 *   Errors name the file and the tensor. The handle owns everything it returns until close.
 */
#ifndef IFLOW_LORA_H
#define IFLOW_LORA_H

#include <stddef.h>
#include <stdint.h>

#define IFLOW_LORA_MAX_RANK   4096
#define IFLOW_LORA_MAX_FLOATS ((uint64_t)1 << 32) /* A and B of all deltas together */

enum { IFLOW_LORA_HF, IFLOW_LORA_GGUF }; /* the adapter's naming of the model's tensors */

typedef struct {
    const char *target; /* the model tensor it changes, e.g. "model.layers.0.self_attn.q_proj.weight" */
    int rank;           /* r */
    int64_t in, out;    /* W's columns and rows */
    const float *a;     /* [rank][in]  */
    const float *b;     /* [out][rank] */
    double scale;       /* s, times the caller's scale */
} iflow_lora_delta;

typedef struct iflow_lora iflow_lora;

/* Read the adapter at path (a PEFT directory or .safetensors file, or a GGUF file). */
int  iflow_lora_open(iflow_lora **out, const char *path, double scale);
/* The PEFT form from memory: adapter_config.json's text and adapter_model.safetensors' bytes
 * (borrowed until close); name stands for the path in messages. For tests and fuzzing. */
int  iflow_lora_open_peft_mem(iflow_lora **out, const char *config, size_t config_len, const void *st, size_t st_len,
                              const char *name, double scale);
/* The GGUF form from memory (borrowed until close). */
int  iflow_lora_open_gguf_mem(iflow_lora **out, const void *buf, size_t len, const char *name, double scale);
void iflow_lora_close(iflow_lora *l); /* NULL is fine */

const char *iflow_lora_path(const iflow_lora *l);
int         iflow_lora_naming(const iflow_lora *l);
size_t      iflow_lora_n_deltas(const iflow_lora *l);
const iflow_lora_delta *iflow_lora_delta_at(const iflow_lora *l, size_t i); /* NULL past the end */
const iflow_lora_delta *iflow_lora_find(const iflow_lora *l, const char *target); /* or NULL */

/* Add rows r0 .. r0+n-1 of d's s B A into w [n][d->in] (F32, row-major): each value is
 * rounded once, from w + s (B A) computed in double. The caller checks r0 + n <= d->out. */
void iflow_lora_add(const iflow_lora_delta *d, float *w, int64_t r0, int64_t n);
/* The same with row i of w taking d's row rows[i] (a permutation of W's rows: the q/k rows of
 * one naming in the other's rotary order). The caller checks every rows[i] < d->out. */
void iflow_lora_add_rows(const iflow_lora_delta *d, float *w, const int64_t *rows, int64_t n);

/* The rows of a q or k projection [R][...] of `heads` whole rotary heads in the other naming's
 * order: rows[t] is the other's row for row t. to_interleaved: t counts in GGUF's interleaved
 * pair order (x = 2 i + e in a head) and the other is Hugging Face's rotate-half order (e * hd/2
 * + i), as llama.cpp's converter permutes q_proj and k_proj; else the reverse. */
void iflow_lora_rotary_rows(int64_t *rows, int64_t R, int heads, int to_interleaved);

#endif
