/*
 * quant.h -- quantizing a model: which type each tensor gets, and the streaming transform of a
 * shard into a quantized shard. (The block formats themselves are kernels/cpu/quant.h's.)
 *
 * The policy (iflow-quant(1) states it for users)
 *   - The target is a quantized type, or f16 or bf16 (every matrix rounded once to nearest
 *     even from its F32 value: the same bytes as iflow-convert --dtype; no default exceptions).
 *   - Vectors (one dimension: norm weights, biases) are always f32; the engine reads them so.
 *   - Matrices get the target type, with one default exception, as llama.cpp keeps its output
 *     matrix at 6 bits: when the target has fewer than 6 bits, the output projection and the
 *     token embeddings ("output" and "embed" below) get q6. Targets q6, q8_b32 and q8_b64 apply
 *     to them too.
 *   - Overrides (iflow-quant --keep) are a comma-separated list of PATTERN[=TYPE], applied in
 *     order after the defaults, so the last entry that matches a tensor wins. PATTERN is a
 *     shell pattern (fnmatch(3), '*' crosses dots) on iflow tensor names ("blk.*.ffn_down",
 *     "tok_embd"), or an alias: "embed" is tok_embd; "output" is the output projection, which
 *     is the tensor `output`, or tok_embd in a model with tied embeddings (it has no `output`).
 *     TYPE is a quantized type or f32, f16, bf16; a bare PATTERN keeps the source's type.
 *     Overrides apply to matrices only. Every user pattern must match some tensor of the model.
 *   - A tensor whose chosen type is its source type is copied byte for byte. A quantized
 *     source is dequantized (ifk_dequantize_row) when a float type is chosen; quantizing it
 *     to another quantized type is refused unless requantize is set. A source type that holds
 *     no weights (u8, i32) is refused, unless a bare pattern keeps it.
 *
 * Contract
 *   A policy owns its rules (iflow_quant_policy_free releases them). iflow_quant_choose() is a
 *   pure function of the policy and one tensor's name, rank and type.
 *   iflow_quantize_shard() reads a shard one record at a time (a path or "-"), writes its meta
 *   record with a "quantization" object added ({"type", "overrides", "requantize", "source":
 *   the input's own "quantization" object or null, "method", and with an importance matrix
 *   "imatrix": {"file", "tokens"}}), copies the other blobs (the tokenizer)
 *   unchanged, and writes each tensor in its chosen type, converting row by row on all cores
 *   (the result does not depend on the thread count). Memory: one source tensor plus one
 *   output tensor. The output is written through iflow_shard_writer (a file appears under its
 *   name only when complete; to standard output a failure leaves the stream without its END!
 *   record, which every reader reports as truncated). Errors name the tensor and the input.
 *
 *   Importance (policy imatrix, method search): the rows of a matrix with an imatrix entry are
 *   quantized with the importance of column k = mean_sq[k] + 1e-3 * (the mean of mean_sq), so a
 *   column no calibration token reached still counts a little. The imatrix must fit the model
 *   (iflow_imatrix_check_model), checked before any tensor is written.
 */
#ifndef IFLOW_QUANT_H
#define IFLOW_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "libcore/base/progress.h"

#include "libcore/base/dtype.h"

/* ---- the types ---- */

typedef struct {
    int         dtype;            /* IFLOW_DT_Q*, or IFLOW_DT_F16 / BF16 (block 1, 16 bits) */
    const char *name;             /* canonical name, as iflow_dtype_name()                */
    double      bits;             /* nominal bits of a level: 8, 6, 5, 4, 3.5, 3, 2       */
    int         block;            /* weights per block                                    */
    int         levels;           /* levels of a weight (2^bits; 11 for q3h)              */
    int         block_bytes;      /* bytes of a block, its two f16 numbers included       */
    double      bits_per_weight;  /* block_bytes * 8 / block                              */
    double      paper_bits;       /* the Inferflow paper's Table 3 "Actual bits/weight";
                                     0 where the paper has no column for the type (q2)    */
} iflow_qtype_info;

/* Describe a target type of iflow-quant: a quantized type, f16 or bf16. IFLOW_EINVAL if dt
 * is none of them. */
int iflow_qtype_describe(int dt, iflow_qtype_info *info);

/* Look up the measured quality of a type in the text of a quality table (docs/quant-quality.tsv:
 * lines "TYPE<TAB>TEXT", '#' comments). Copies TEXT (to cap-1 bytes) and returns 1, or 0 if the
 * table has no line for the type. */
int iflow_quant_quality(const char *table, const char *type_name, char *out, size_t cap);

/* ---- the policy ---- */

#define IFLOW_QUANT_KEEP_SOURCE (-1)   /* a rule's type: the tensor keeps its source type */

typedef struct {
    char *pattern;      /* shell pattern, or the alias "embed" or "output"   */
    int   dtype;        /* IFLOW_DT_*, or IFLOW_QUANT_KEEP_SOURCE             */
    int   is_default;   /* set by the policy, not given by the user          */
} iflow_quant_rule;

/* How a block's two numbers are chosen (the layout is the same). */
enum {
    IFLOW_QUANT_SEARCH = 0,   /* error-minimizing search (ifk_quantize_row_search): default */
    IFLOW_QUANT_MINMAX = 1,   /* the paper's rule: the block's plain min and max           */
};

struct iflow_imatrix;

typedef struct {
    int               target;       /* IFLOW_DT_Q*: the type of matrices                 */
    int               method;       /* IFLOW_QUANT_SEARCH or IFLOW_QUANT_MINMAX          */
    const struct iflow_imatrix *imatrix; /* importances of matrix columns (search only),
                                       or NULL: every column's error weighs the same      */
    const char       *imatrix_name; /* its file, for messages                             */
    int               requantize;   /* allow quantized -> another quantized type         */
    iflow_quant_rule *rules;        /* the defaults, then the user's, in order           */
    size_t            n_rules;
} iflow_quant_policy;

/* A policy for target type dt (quantized) with its default rules. IFLOW_EINVAL for a type
 * that is not quantized. */
int  iflow_quant_policy_init(iflow_quant_policy *p, int target);
/* Append the rules of one override list "PATTERN[=TYPE][,PATTERN[=TYPE]...]". IFLOW_EINVAL
 * with a message quoting the list for an empty entry or pattern, or an unknown, ambiguous or
 * non-weight TYPE; the policy is unchanged then. */
int  iflow_quant_policy_add_keep(iflow_quant_policy *p, const char *list);
void iflow_quant_policy_free(iflow_quant_policy *p);

/* 1 if rule r names tensor `name` (tied: the model ties its output to tok_embd). */
int iflow_quant_rule_matches(const iflow_quant_rule *r, const char *name, int tied);

/* The type tensor `name` (n_dims dimensions, source type src_dt) gets: an IFLOW_DT_* code, or
 * a negative IFLOW_E* code with a message naming the tensor when the policy refuses it. */
int iflow_quant_choose(const iflow_quant_policy *p, const char *name, int n_dims, int src_dt, int tied);

/* Every user rule must match one of the n tensor names. IFLOW_EINVAL naming the first rule
 * that matches none; `where` names the model in the message. */
int iflow_quant_check_rules(const iflow_quant_policy *p, const char *const *names, size_t n, int tied,
                            const char *where);

/* ---- the stream ---- */

typedef struct {
    size_t   n_tensors;
    size_t   n_by_type[IFLOW_DT_QEND_];  /* tensors written in each type               */
    uint64_t in_bytes, out_bytes;        /* tensor payload bytes read and written      */
} iflow_quant_stats;

enum { IFLOW_QUANT_ZSTD = 1 };           /* flags: compress the output with zstd */

/* Quantize the shard at in_path ("-": standard input) into out_path ("-": standard output).
 * stats may be NULL. */
int iflow_quantize_shard(const char *in_path, const char *out_path, const iflow_quant_policy *p, int flags,
                         iflow_quant_stats *stats);
/* The same, calling progress (if not NULL) after each tensor written: tensors done of the
 * model's, and input payload bytes read (total_bytes 0: a stream's size is not known here). */
int iflow_quantize_shard_progress(const char *in_path, const char *out_path, const iflow_quant_policy *p, int flags,
                                  iflow_quant_stats *stats, iflow_progress_fn progress, void *user);

#endif
