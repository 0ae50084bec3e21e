/*
 * convert.h -- Hugging Face model directory -> shard file.
 *
 * Contract
 *   iflow_convert() reads a model directory (config.json, safetensors weights, tokenizer.json or
 *   tokenizer.gguf, generation_config.json), picks the spec serving config.json's
 *   "architectures" (or the one given), and writes one shard to out_path ("-" for stdout).
 *   It first checks every tensor the engine will need (name, shape, type) and that the
 *   checkpoint holds nothing unmapped, so a bad checkpoint fails before a byte is written; then
 *   it streams tensor by tensor (memory: one converted tensor). On failure no output file is
 *   left behind. With IFLOW_CONVERT_SYNTHETIC the directory needs only config.json and a
 *   tokenizer, and every weight is seeded random data of the real shape (for benchmarks).
 */
#ifndef IFLOW_CONVERT_H
#define IFLOW_CONVERT_H

#include <stddef.h>
#include <stdint.h>

enum { IFLOW_CONVERT_SYNTHETIC = 1, IFLOW_CONVERT_ZSTD = 2 };

typedef struct {
    int dtype;                       /* matrices' type (IFLOW_DT_*), or -1 to keep the source's */
    const char *spec_path;           /* a spec file, or NULL to search spec_dirs                */
    const char *const *spec_dirs;
    size_t n_spec_dirs;
    uint64_t seed;                   /* synthetic weights                                       */
    int flags;                       /* IFLOW_CONVERT_*                                         */
} iflow_convert_opts;

int iflow_convert(const char *src_dir, const char *out_path, const iflow_convert_opts *opts);

#endif
