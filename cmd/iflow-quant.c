/* iflow-quant -- quantize the weight matrices of an iflow shard, tensor by tensor; list the types. */
#include "cmd/io.h"
#include "cmd/opt.h"
#include "cmd/progress.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/formats/imatrix.h"
#include "libcore/formats/quant.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { O_TYPE = 't', O_INPUT = 'i', O_OUTPUT = 'o', O_VERBOSE = 'v', O_KEEP = 256, O_METHOD, O_IMATRIX, O_REQUANT, O_ZSTD, O_LIST, O_JSON };

static const iflow_opt opts[] = {
    {O_TYPE, "type", 't', "TYPE", "quantize weight matrices to TYPE, or round them to f16 or bf16 (see --list-types)",
     "q8_b32 q8_b64 q6 q5 q4_b32 q4_b64 q3h q3_b32 q2 f16 bf16"},
    {O_INPUT, "input", 'i', "FILE", "read the shard from FILE (default: standard input)", "file"},
    {O_OUTPUT, "output", 'o', "FILE", "write the shard to FILE (default: standard output, never a terminal)", "file"},
    {O_KEEP, "keep", 0, "LIST", "override types: PATTERN[=TYPE],... (tensor-name patterns; no TYPE: keep as is)", NULL},
    {O_METHOD, "method", 0, "NAME", "choose each block's step and minimum: search (default: least squared error) or minmax (the paper's rule)",
     "search minmax"},
    {O_IMATRIX, "imatrix", 0, "FILE", "weigh each column's rounding error by its mean squared activation in FILE (made by iflow-ppl)",
     "file"},
    {O_REQUANT, "requantize", 0, NULL, "allow quantizing a quantized tensor again (dequantized first)", NULL},
    {O_ZSTD, "zstd", 0, NULL, "compress the shard with zstd (an .ifs.zst file)", NULL},
    {O_LIST, "list-types", 0, NULL, "print the types: bits, block size, bits per weight, measured quality", NULL},
    {O_JSON, "json", 0, NULL, "with --list-types: print JSON Lines instead of a table", NULL},
    PROGRESS_OPTS,
    {O_VERBOSE, "verbose", 'v', NULL, "report the types written, sizes, time and peak memory on standard error", NULL},
    {0},
};

static const iflow_tool tool = {
    "iflow-quant", "-t TYPE [-i FILE] [-o FILE] [--keep LIST] [options] | --list-types",
    "Quantize the weight matrices of an iflow shard, tensor by tensor.", opts,
};

#define MAX_KEEP 64

/* ---- --list-types ---- */

/* The measured-quality table: $IFLOW_QUANT_QUALITY, else docs/quant-quality.tsv of a build tree
 * (beside bin/), else PREFIX/share/iflow/quant-quality.tsv. NULL if there is none. */
static char *quality_table(void)
{
    char exe[PATH_MAX], path[PATH_MAX + 64], *data = NULL;
    size_t len;
    const char *env = getenv("IFLOW_QUANT_QUALITY");
    if (env && *env)
        return slurp(env, &data, &len) == 0 ? data : NULL;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = n > 0 ? (exe[n] = 0, strrchr(exe, '/')) : NULL;
    if (!slash)
        return NULL;
    *slash = 0; /* .../bin */
    static const char *const rel[] = {"../docs/quant-quality.tsv", "../share/iflow/quant-quality.tsv"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", exe, rel[i]);
        if (access(path, R_OK) == 0 && slurp(path, &data, &len) == 0)
            return data;
    }
    return NULL;
}

static void print_type(const iflow_qtype_info *q, const char *quality, int as_json)
{
    if (as_json) {
        json_t *o = json_pack("{s:s, s:i, s:f, s:i, s:i, s:f, s:o, s:o}", "type", q->name, "code", q->dtype, "bits",
                              q->bits, "block", q->block, "block_bytes", q->block_bytes, "bits_per_weight",
                              q->bits_per_weight, "paper_bits_per_weight",
                              q->paper_bits > 0 ? json_real(q->paper_bits) : json_null(), "quality",
                              quality ? json_string(quality) : json_null());
        o = json_schema(o);
        json_dumpf(o, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
        putchar('\n');
        json_decref(o);
        return;
    }
    char paper[16] = "-";
    if (q->paper_bits > 0)
        snprintf(paper, sizeof paper, "%g", q->paper_bits);
    printf("%-8s %4g %5d %11.2f %5s  %s\n", q->name, q->bits, q->block, q->bits_per_weight, paper,
           quality ? quality : "-");
}

static int list_types(int as_json)
{
    char *table = quality_table(), quality[256];
    if (!as_json)
        printf("%-8s %4s %5s %11s %5s  %s\n", "type", "bits", "block", "bits/weight", "paper", "measured quality");
    int types[IFLOW_DT_QEND_ - IFLOW_DT_QFIRST + 2], n = 0;
    for (int dt = IFLOW_DT_QFIRST; dt < IFLOW_DT_QEND_; dt++)
        types[n++] = dt;
    types[n++] = IFLOW_DT_F16;
    types[n++] = IFLOW_DT_BF16;
    for (int i = 0; i < n; i++) {
        int dt = types[i];
        iflow_qtype_info q;
        if (iflow_qtype_describe(dt, &q) < 0)
            die(&tool, NULL);
        print_type(&q, table && iflow_quant_quality(table, q.name, quality, sizeof quality) ? quality : NULL, as_json);
    }
    free(table);
    return 0;
}

/* ---- quantizing ---- */

static int parse_type(const char *name)
{
    const char *choices = iflow_dtype_ambiguity(name);
    int dt = iflow_dtype_from_name(name);
    if (choices)
        die_usage(&tool, "ambiguous type '%s' for --type: say %s", name, choices);
    if (dt < 0)
        die_usage(&tool, "unknown type '%s' for --type (see iflow-quant --list-types)", name);
    if (!iflow_dtype_is_quant(dt) && dt != IFLOW_DT_F16 && dt != IFLOW_DT_BF16)
        die_usage(&tool, "type '%s' for --type is not a quantized type, f16 or bf16 (see iflow-quant --list-types)", name);
    return dt;
}

static void report(const char *out, const iflow_quant_stats *st, double seconds)
{
    fprintf(stderr, "%s: wrote %s: %zu tensors (", tool.name, strcmp(out, "-") ? out : "<stdout>", st->n_tensors);
    const char *sep = "";
    for (int dt = 0; dt < IFLOW_DT_QEND_; dt++)
        if (st->n_by_type[dt]) {
            fprintf(stderr, "%s%zu %s", sep, st->n_by_type[dt], iflow_dtype_name(dt));
            sep = ", ";
        }
    fprintf(stderr, "), %.2f MiB of tensors -> %.2f MiB, in %.2f s, peak RSS %.1f MiB\n", st->in_bytes / 1048576.0,
            st->out_bytes / 1048576.0, seconds, peak_rss_mib());
}

/* The size of in when it is a regular, uncompressed file (about the tensor bytes to read, for
 * the time left); 0 for a stream or a zstd file. */
static uint64_t plain_file_size(const char *in)
{
    struct stat st;
    unsigned char magic[4] = {0};
    FILE *f = strcmp(in, "-") ? fopen(in, "rb") : NULL;
    int plain = f && fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && fread(magic, 1, 4, f) == 4 &&
                memcmp(magic, "\x28\xb5\x2f\xfd", 4) != 0;
    if (f)
        fclose(f);
    return plain ? (uint64_t)st.st_size : 0;
}

int main(int argc, char **argv)
{
    const char *in = "-", *out = "-", *keep[MAX_KEEP], *arg, *imatrix_path = NULL;
    int type = -1, method = IFLOW_QUANT_SEARCH, n_keep = 0, list = 0, as_json = 0, verbose = 0, flags = 0, requantize = 0, c;
    int progress_mode = PROGRESS_AUTO;
    while ((c = opt_next(&tool, argc, argv, &arg)) != 0) {
        switch (c) {
        case O_TYPE: type = parse_type(arg); break;
        case O_INPUT: in = arg; break;
        case O_OUTPUT: out = arg; break;
        case O_KEEP:
            if (n_keep == MAX_KEEP)
                die_usage(&tool, "too many --keep options (at most %d; join lists with commas)", MAX_KEEP);
            keep[n_keep++] = arg;
            break;
        case O_METHOD:
            if (strcmp(arg, "search") == 0) method = IFLOW_QUANT_SEARCH;
            else if (strcmp(arg, "minmax") == 0) method = IFLOW_QUANT_MINMAX;
            else die_usage(&tool, "unknown method '%s' for --method (search, minmax)", arg);
            break;
        case O_IMATRIX: imatrix_path = arg; break;
        case O_REQUANT: requantize = 1; break;
        case O_ZSTD: flags |= IFLOW_QUANT_ZSTD; break;
        case O_LIST: list = 1; break;
        case O_JSON: as_json = 1; break;
        case O_VERBOSE: verbose = 1; break;
        case OPT_PROGRESS: progress_mode = PROGRESS_ON; break;
        case OPT_NO_PROGRESS: progress_mode = PROGRESS_OFF; break;
        }
    }
    if (opt_index() < argc)
        die_usage(&tool, "unexpected operand '%s' (give the input with -i FILE)", argv[opt_index()]);
    if (as_json && !list)
        die_usage(&tool, "--json goes with --list-types");
    if (list)
        return list_types(as_json);
    if (type < 0)
        die_usage(&tool, "no type: give -t TYPE (iflow-quant --list-types lists them)");
    if (imatrix_path && method == IFLOW_QUANT_MINMAX)
        die_usage(&tool, "--imatrix needs --method search (minmax takes no weights)");
    if (strcmp(in, "-") == 0 && isatty(0))
        die_usage(&tool, "no input: give -i FILE or pipe a shard to standard input");
    if (strcmp(out, "-") == 0 && isatty(1))
        die_usage(&tool, "refusing to write a binary shard to a terminal (use -o FILE or a pipe)");

    iflow_quant_policy p;
    if (iflow_quant_policy_init(&p, type) < 0)
        die(&tool, NULL);
    p.requantize = requantize;
    p.method = method;
    iflow_imatrix *im = NULL;
    if (imatrix_path && iflow_imatrix_load(&im, imatrix_path) < 0)
        die(&tool, NULL);
    p.imatrix = im;
    p.imatrix_name = imatrix_path;
    for (int i = 0; i < n_keep; i++)
        if (iflow_quant_policy_add_keep(&p, keep[i]) < 0)
            die_usage(&tool, "%s", iflow_errmsg());
    iflow_quant_stats st;
    double t0 = now_s();
    progress pr;
    progress_open(&pr, tool.name, progress_mode);
    pr.total_bytes = plain_file_size(in);
    int rc = iflow_quantize_shard_progress(in, out, &p, flags, &st, pr.on ? progress_tensors : NULL, &pr);
    progress_end(&pr);
    iflow_quant_policy_free(&p);
    iflow_imatrix_free(im);
    if (rc < 0)
        die(&tool, NULL);
    if (verbose)
        report(out, &st, now_s() - t0);
    return 0;
}
