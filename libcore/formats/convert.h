/*
 * convert.h -- a model source (Hugging Face directory, GGUF file, llama2.c checkpoint) -> shard.
 *
 * Contract
 *   iflow_convert() reads a model directory (config.json, safetensors or pytorch_model.bin weights
 *   (hfdir.h), tokenizer.json or tokenizer.gguf, generation_config.json), picks the spec serving
 *   config.json's "architectures" (or the one given), and writes one shard to out_path ("-" for
 *   stdout).
 *   A regular file is read as a GGUF file instead (ggufsrc.h): its metadata is the config, the
 *   spec is the one whose [gguf] section serves its general.architecture (spec.h), its
 *   vocabulary is the tokenizer, and each tensor keeps the iflow type it converts to without a
 *   second rounding (Q4_1, Q4_0 -> q4_b32; Q8_0 -> q8_b32; F32/F16/BF16 as stored; other ggml
 *   types dequantized to F32) unless opts->dtype names a float type. A file that is a llama2.c
 *   checkpoint (llama2c.h) comes in the same way, as the GGUF llama2c.c makes of it and its
 *   tokenizer.bin. Meta's "source" object says where the shard came from: {"format": "hf" |
 *   "gguf" | "llama2c", "architectures" | "architecture", "tensors": {"SRC -> DST": count}}.
 *   It first checks every tensor the engine will need (name, shape, type) and that the
 *   checkpoint holds nothing unmapped, so a bad checkpoint fails before a byte is written; then
 *   it streams tensor by tensor (memory: one converted tensor). On failure no output file is
 *   left behind. LoRA adapters (lora.h) named in opts are merged: each matrix an adapter names
 *   becomes W + s B A (several adapters add up), computed in F32 from the source's values and
 *   written in opts->dtype, else in the source's type when that is a float type, else in F32
 *   (a quantized source's merged matrices are not quantized again: iflow-quant does that). An
 *   adapter may name tensors as the source does or as the other kind does (PEFT's Hugging Face
 *   names for a GGUF file, llama.cpp's GGUF names for a directory): the spec's two views map one
 *   naming to the other, and where their rope_layout differs the q/k projections' rows are
 *   permuted between rotate-half and interleaved order, whole heads at a time. A delta whose
 *   target the model does not use, or whose shape does not fit it, fails before anything is
 *   written. Meta's "source"
 *   then holds "lora": [{"path", "scale", "tensors"}]. With IFLOW_CONVERT_SYNTHETIC the
 *   directory needs only config.json and a tokenizer, and every weight is seeded random data of
 *   the real shape (for benchmarks).
 */
#ifndef IFLOW_CONVERT_H
#define IFLOW_CONVERT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "libcore/base/progress.h"

enum { IFLOW_CONVERT_SYNTHETIC = 1, IFLOW_CONVERT_ZSTD = 2 };

typedef struct {
    int dtype;                       /* matrices' type (IFLOW_DT_*), or -1 to keep the source's */
    const char *spec_path;           /* a spec file, or NULL to search spec_dirs                */
    const char *const *spec_dirs;
    size_t n_spec_dirs;
    uint64_t seed;                   /* synthetic weights                                       */
    const char *tokenizer_path;      /* a llama2.c checkpoint's tokenizer.bin (NULL: the one    */
                                     /* beside it); an error for other sources                  */
    int flags;                       /* IFLOW_CONVERT_*                                         */
    const char *const *lora_paths;   /* LoRA adapters merged into the weights (lora.h), or NULL */
    const double *lora_scales;       /* [n_loras] each one's scale, or NULL (all 1)             */
    size_t n_loras;
    iflow_progress_fn progress;      /* NULL, or called after each tensor written (tensors and  */
    void *progress_user;             /* payload bytes written, of the totals)                   */
} iflow_convert_opts;

int iflow_convert(const char *src_dir, const char *out_path, const iflow_convert_opts *opts);

/* The first step of iflow_convert() alone: read src_dir's config.json (no weights needed), pick
 * its spec as iflow_convert() does (opts->spec_path, else the spec in opts->spec_dirs serving its
 * architecture) and resolve it. *resolved receives {"spec", "blocks", "hparams"}, the form a
 * shard's meta record stores; the caller json_decref()s it. Only spec_path and spec_dirs of opts
 * are read. For tools that need a model's shape without its weights (iflow-partition --config). */
int iflow_convert_resolve(const char *src_dir, const iflow_convert_opts *opts, json_t **resolved);

/* Everything iflow_convert() checks, without writing: *out (the caller json_decref()s it) is
 * {"path", "source" (as in meta), "spec", "spec_file", "blocks", "hparams", "tensors": [{"name",
 * "source_name", "source_type", "type", "shape"}]}, the tensors in the order a shard holds
 * them. For iflow-convert --info on a source. */
int iflow_convert_describe(const char *src, const iflow_convert_opts *opts, json_t **out);

#endif
