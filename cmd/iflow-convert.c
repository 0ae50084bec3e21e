/* iflow-convert -- Hugging Face model directory, GGUF file or llama2.c checkpoint -> iflow shard
 * file; inspection of shards and sources. */
#include "cmd/io.h"
#include "cmd/model.h"
#include "cmd/opt.h"
#include "cmd/progress.h"
#include "libcore/formats/convert.h"
#include "libcore/formats/ggufsrc.h"
#include "libcore/formats/llama2c.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/formats/shard.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    O_OUTPUT = 'o', O_DTYPE = 't', O_VERBOSE = 'v', O_SPEC = 256, O_SYNTHETIC, O_SEED, O_ZSTD, O_INFO, O_JSON,
    O_TOKENIZER, O_LORA, O_LORA_SCALED
};

static const iflow_opt opts[] = {
    {O_OUTPUT, "output", 'o', "FILE", "write the shard to FILE (default: standard output, never a terminal)", "file"},
    {O_DTYPE, "dtype", 't', "TYPE", "store weight matrices as TYPE: f32, f16 or bf16 (default: as in the source, or its nearest exact iflow type)", "f32 f16 bf16"},
    {O_SPEC, "spec", 0, "FILE", "use this model spec instead of the one serving the source's architecture", "file"},
    {O_TOKENIZER, "tokenizer", 0, "PATH", "the tokenizer to store: a tokenizer file or folder for a model directory (default: its own files), a llama2.c checkpoint's tokenizer.bin (default: the one beside it)", "file"},
    {O_LORA, "lora", 0, "FILE", "merge LoRA adapter FILE into the weights: a PEFT adapter (its directory, or adapter_model.safetensors with adapter_config.json beside it) or a llama.cpp GGUF adapter, for either kind of checkpoint (repeatable; the changed matrices are written as --dtype, else as the source's float type, else F32)", "file"},
    {O_LORA_SCALED, "lora-scaled", 0, "FILE:S", "the same, the adapter's deltas multiplied by S", "file"},
    {O_SYNTHETIC, "synthetic", 0, "DIR", "write seeded random weights of the shape in DIR/config.json", "dir"},
    {O_SEED, "seed", 0, "N", "seed of --synthetic weights (default 0)", NULL},
    {O_ZSTD, "zstd", 0, NULL, "compress the shard with zstd (an .ifs.zst file)", NULL},
    {O_INFO, "info", 0, "FILE", "describe shard FILE ('-': standard input), or what converting a source FILE would give", "file"},
    {O_JSON, "json", 0, NULL, "with --info: print JSON instead of text", NULL},
    PROGRESS_OPTS,
    {O_VERBOSE, "verbose", 'v', NULL, "report time and peak memory on standard error", NULL},
    {0},
};

static const iflow_tool tool = {
    "iflow-convert", "[options] MODEL_DIR|MODEL.gguf|MODEL.bin | --synthetic DIR | --info FILE",
    "Convert a Hugging Face model directory, a GGUF file or a llama2.c checkpoint to an iflow shard file, or describe one.", opts,
};

/* "quantization: q4_b64 (embed=q6, output=q6)": the type and overrides iflow-quant applied. */
static void print_quantization(const json_t *q)
{
    const char *type = json_string_value(json_object_get(q, "type"));
    const json_t *rules = json_object_get(q, "overrides");
    if (!type)
        return;
    printf("quantization: %s", type);
    for (size_t i = 0; i < json_array_size(rules); i++) {
        const json_t *r = json_array_get(rules, i);
        const char *pattern = json_string_value(json_object_get(r, "pattern")),
                   *rtype = json_string_value(json_object_get(r, "type"));
        printf("%s%s=%s", i ? ", " : " (", pattern ? pattern : "?", rtype ? rtype : "?");
    }
    printf("%s\n", json_array_size(rules) ? ")" : "");
}

/* "source: gguf, architecture llama; tensors q4_1 -> q4_b32 x210, ..." */
static void print_source(const json_t *src)
{
    const char *format = json_string_value(json_object_get(src, "format"));
    const json_t *arch = json_object_get(src, "architecture"), *archs = json_object_get(src, "architectures"), *v;
    const char *k;
    if (!format)
        return;
    printf("source: %s", format);
    if (json_is_string(arch))
        printf(", architecture %s", json_string_value(arch));
    for (size_t i = 0; i < json_array_size(archs); i++)
        printf("%s%s", i ? " " : ", architecture ", json_string_value(json_array_get(archs, i)));
    int first = 1;
    json_object_foreach((json_t *)json_object_get(src, "tensors"), k, v) {
        printf("%s%s x%lld", first ? "; tensors " : ", ", k, (long long)json_integer_value(v));
        first = 0;
    }
    const json_t *lora = json_object_get(src, "lora");
    for (size_t i = 0; i < json_array_size(lora); i++) {
        const json_t *a = json_array_get(lora, i);
        printf("%s%s (scale %g, %lld matrices)", i ? ", " : "; LoRA ", json_string_value(json_object_get(a, "path")),
               json_number_value(json_object_get(a, "scale")),
               (long long)json_integer_value(json_object_get(a, "tensors")));
    }
    putchar('\n');
}

/* " spm (source.spm, vocab.json)": one side of a tokenizer description (meta's, shard.h) by the
 * names of its files, or " gguf (record tokenizer)" where it names none (a GGUF's vocabulary,
 * shards written before the names were kept); tokens added after vocab.json follow ("; 100
 * added tokens, 8 hidden, source prefix __en__"). */
static void print_tokenizer_side(const json_t *d)
{
    const char *file = json_string_value(json_object_get(d, "file")),
               *vocab = json_string_value(json_object_get(d, "vocab_file")),
               *prefix = json_string_value(json_object_get(d, "prefix"));
    const json_t *added = json_object_get(d, "added");
    printf(" %s (%s%s", json_string_value(json_object_get(d, "format")), file ? "" : "record ",
           file ? file : json_string_value(json_object_get(d, "record")));
    printf("%s%s", vocab ? ", " : "", vocab ? vocab : "");
    if (added)
        printf("; %zu added tokens, %lld hidden", json_array_size(added),
               (long long)json_integer_value(json_object_get(d, "hidden")));
    printf("%s%s)", prefix ? ", source prefix " : "", prefix ? prefix : "");
}

/* "tokenizer: spm (source.spm, vocab.json); target: spm (target.spm, vocab.json)", or "none". */
static void print_tokenizer(const json_t *d)
{
    const json_t *target = json_object_get(d, "target");
    if (!json_string_value(json_object_get(d, "format"))) {
        printf("tokenizer: none\n");
        return;
    }
    printf("tokenizer:");
    print_tokenizer_side(d);
    if (target) {
        printf("; target:");
        print_tokenizer_side(target);
    }
    putchar('\n');
}

/* "chat template: from tokenizer_config.json, 1234 bytes", when the shard has one. */
static void print_chat_template(const json_t *d, const iflow_shard *sh)
{
    const char *record = json_string_value(json_object_get(d, "record")),
               *from = json_string_value(json_object_get(d, "from"));
    const iflow_shard_rec *r = record ? iflow_shard_find(sh, record) : NULL;
    if (r)
        printf("chat template: from %s, %zu bytes\n", from ? from : "?", r->nbytes);
}

static void print_blocks_hparams(const json_t *blocks, const json_t *hp)
{
    const char *k;
    json_t *v;
    printf("blocks:");
    json_object_foreach((json_t *)blocks, k, v) printf(" %s=%s", k, json_string_value(v));
    printf("\nhparams:");
    json_object_foreach((json_t *)hp, k, v) {
        char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        printf(" %s=%s", k, s);
        free(s);
    }
    putchar('\n');
}

/* --info on a source (a model directory, a GGUF file or a llama2.c checkpoint): what converting
 * it would give. */
static int info_source(const char *path, const iflow_convert_opts *o, int as_json)
{
    json_t *d;
    if (iflow_convert_describe(path, o, &d) < 0)
        die(&tool, NULL);
    if (as_json) {
        json_t *out = json_schema(json_incref(d));
        json_dumpf(out, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        putchar('\n');
        json_decref(out);
    } else {
        printf("file: %s\n", path);
        print_source(json_object_get(d, "source"));
        printf("spec: %s (%s)\n", json_string_value(json_object_get(d, "spec")),
               json_string_value(json_object_get(d, "spec_file")));
        print_blocks_hparams(json_object_get(d, "blocks"), json_object_get(d, "hparams"));
        print_tokenizer(json_object_get(d, "tokenizer"));
        printf("%-24s %-32s %-8s %-8s %s\n", "name", "source name", "source", "type", "shape");
        const json_t *tensors = json_object_get(d, "tensors");
        for (size_t i = 0; i < json_array_size(tensors); i++) {
            const json_t *t = json_array_get(tensors, i), *shape = json_object_get(t, "shape");
            char dims[64] = "";
            for (size_t k = 0; k < json_array_size(shape); k++)
                snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", k ? "x" : "",
                         (long long)json_integer_value(json_array_get(shape, k)));
            printf("%-24s %-32s %-8s %-8s %s\n", json_string_value(json_object_get(t, "name")),
                   json_string_value(json_object_get(t, "source_name")), json_string_value(json_object_get(t, "source_type")),
                   json_string_value(json_object_get(t, "type")), dims);
        }
    }
    json_decref(d);
    return 0;
}


static int info(const char *path, int as_json)
{
    iflow_shard *sh;
    if (iflow_shard_open(&sh, path, 0) < 0)
        die(&tool, NULL);
    json_error_t je;
    json_t *meta = json_loads(iflow_shard_meta(sh), 0, &je), *tensors = json_array();
    uint64_t total = 0;
    for (size_t i = 0; i < iflow_shard_n_records(sh); i++) {
        const iflow_shard_rec *r = iflow_shard_rec_at(sh, i);
        json_t *shape = json_array();
        for (int d = 0; d < r->n_dims; d++)
            json_array_append_new(shape, json_integer(r->shape[d]));
        char hash[17];
        snprintf(hash, sizeof hash, "%016llx", (unsigned long long)r->xxh64);
        json_array_append_new(tensors, json_pack("{s:s, s:s, s:s, s:o, s:I, s:I, s:s}", "name", r->name, "kind",
                                                 r->kind == IFLOW_REC_TENSOR ? "tensor" : "blob", "type",
                                                 iflow_dtype_name(r->dtype) ? iflow_dtype_name(r->dtype) : "?", "shape",
                                                 shape, "offset", (json_int_t)r->offset, "bytes", (json_int_t)r->nbytes,
                                                 "xxh64", hash));
        total += r->nbytes;
    }
    if (as_json) {
        json_t *out = json_schema(json_pack("{s:s, s:o?, s:o, s:I}", "file", path, "meta", meta, "records", tensors,
                                            "bytes", (json_int_t)total));
        json_dumpf(out, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        putchar('\n');
        json_decref(out);
    } else {
        printf("file: %s\nformat: iflow shard v%d, %zu records, %llu payload bytes, checksums ok\n", path,
               IFLOW_SHARD_VERSION, iflow_shard_n_records(sh), (unsigned long long)total);
        print_source(json_object_get(meta, "source"));
        printf("spec: %s\n", json_string_value(json_object_get(meta, "spec")));
        print_blocks_hparams(json_object_get(meta, "blocks"), json_object_get(meta, "hparams"));
        print_tokenizer(json_object_get(meta, "tokenizer"));
        print_chat_template(json_object_get(meta, "chat_template"), sh);
        print_quantization(json_object_get(meta, "quantization"));
        printf("%-6s %-32s %-6s %-16s %12s %12s  %s\n", "kind", "name", "type", "shape", "offset", "bytes", "xxh64");
        for (size_t i = 0; i < json_array_size(tensors); i++) {
            const json_t *t = json_array_get(tensors, i), *shape = json_object_get(t, "shape");
            char dims[64] = "";
            for (size_t d = 0; d < json_array_size(shape); d++)
                snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", d ? "x" : "",
                         (long long)json_integer_value(json_array_get(shape, d)));
            printf("%-6s %-32s %-6s %-16s %12lld %12lld  %s\n", json_string_value(json_object_get(t, "kind")),
                   json_string_value(json_object_get(t, "name")), json_string_value(json_object_get(t, "type")), dims,
                   (long long)json_integer_value(json_object_get(t, "offset")),
                   (long long)json_integer_value(json_object_get(t, "bytes")),
                   json_string_value(json_object_get(t, "xxh64")));
        }
        json_decref(meta);
        json_decref(tensors);
    }
    iflow_shard_close(sh);
    return 0;
}

int main(int argc, char **argv)
{
    const char *out = "-", *info_path = NULL, *synthetic = NULL, *dirs[8];
    iflow_convert_opts o = {.dtype = -1};
    cmd_loras loras = {0};
    int as_json = 0, verbose = 0, progress_mode = PROGRESS_AUTO, c;
    const char *arg;
    while ((c = opt_next(&tool, argc, argv, &arg)) != 0) {
        switch (c) {
        case O_OUTPUT: out = arg; break;
        case O_DTYPE:
            if (iflow_dtype_is_quant(o.dtype = iflow_dtype_from_name(arg)) || iflow_dtype_ambiguity(arg))
                die_usage(&tool, "type '%s' is a quantized type: pipe the shard through iflow-quant", arg);
            if (!iflow_dtype_is_float(o.dtype))
                die_usage(&tool, "unknown type '%s' for --dtype (f32, f16, bf16)", arg);
            break;
        case O_SPEC: o.spec_path = arg; break;
        case O_TOKENIZER: o.tokenizer_path = arg; break;
        case O_SYNTHETIC: synthetic = arg; o.flags |= IFLOW_CONVERT_SYNTHETIC; break;
        case O_SEED: o.seed = opt_u64(&tool, "seed", arg); break;
        case O_ZSTD: o.flags |= IFLOW_CONVERT_ZSTD; break;
        case O_LORA: cmd_lora_add(&tool, &loras, arg, 0); break;
        case O_LORA_SCALED: cmd_lora_add(&tool, &loras, arg, 1); break;
        case O_INFO: info_path = arg; break;
        case O_JSON: as_json = 1; break;
        case O_VERBOSE: verbose = 1; break;
        case OPT_PROGRESS: progress_mode = PROGRESS_ON; break;
        case OPT_NO_PROGRESS: progress_mode = PROGRESS_OFF; break;
        }
    }
    int n_operands = argc - opt_index();
    o.spec_dirs = dirs;
    o.n_spec_dirs = (size_t)spec_dirs(dirs, 8);
    cmd_lora_opts(&loras, &o.lora_paths, &o.lora_scales, &o.n_loras);
    if (info_path && n_operands)
        die_usage(&tool, "--info takes no other operand");
    if (info_path && loras.n && !cmd_is_source(info_path))
        die_usage(&tool, "--lora goes with --info on a source, not on a shard");
    if (info_path)
        return cmd_is_source(info_path) ? info_source(info_path, &o, as_json) : info(info_path, as_json);
    if (synthetic ? n_operands != 0 : n_operands != 1)
        die_usage(&tool, synthetic ? "--synthetic takes no other operand" : "expected one model directory, GGUF file or llama2.c checkpoint");
    if (strcmp(out, "-") == 0 && isatty(1))
        die_usage(&tool, "refusing to write a binary shard to a terminal (use -o FILE or a pipe)");
    double t0 = now_s();
    progress pr;
    progress_open(&pr, tool.name, progress_mode);
    if (pr.on)
        o.progress = progress_tensors, o.progress_user = &pr;
    if (iflow_convert(synthetic ? synthetic : argv[opt_index()], out, &o) < 0)
        die(&tool, NULL);
    progress_end(&pr);
    if (verbose)
        fprintf(stderr, "%s: wrote %s in %.2f s, peak RSS %.1f MiB\n", tool.name, strcmp(out, "-") ? out : "<stdout>",
                now_s() - t0, peak_rss_mib());
    return 0;
}
