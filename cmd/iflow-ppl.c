/* iflow-ppl -- perplexity of a model over a text file, under a stated protocol. */
#include "cmd/comm_mpi.h"
#include "cmd/devices.h"
#include "cmd/io.h"
#include "cmd/model.h"
#include "cmd/opt.h"
#include "cmd/progress.h"
#include "libcore/base/error.h"
#include "libcore/engine/model.h"
#include "libcore/engine/observe.h"
#include "libcore/engine/ppl.h"
#include "libcore/tokenizers/tokenizer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    O_MODEL = 'm', O_FILE = 'f', O_CTX = 'c', O_THREADS = 't', O_VERBOSE = 'v',
    O_CHUNKS = 256, O_PROTOCOL, O_MAX_TOKENS, O_JSON, O_LOGPROBS, O_KL_BASE, O_KV_TYPE, O_DEVICE, O_GPU_LAYERS, O_PLAN, O_COMM,
    O_SAVE_IMATRIX, O_ACTIVATIONS, O_LORA, O_LORA_SCALED,
};

static const iflow_opt opts[] = {
    {O_MODEL, "model", 'm', "FILE", "model shard file ('-': standard input), a directory of per-device files (written by iflow-partition), or a source iflow-convert reads, converted on the fly", "file"},
    {O_FILE, "file", 'f', "TEXT", "text file to score ('-': standard input)", "file"},
    {O_CTX, "ctx-size", 'c', "N", "window length in tokens, BOS included (default 512)", NULL},
    {O_CHUNKS, "chunks", 0, "N", "score at most N windows (default: the whole text)", NULL},
    {O_PROTOCOL, "protocol", 0, "NAME", "windows (default: BOS + c-1 tokens, all scored) or llama.cpp (second halves)", "windows llama.cpp"},
    {O_MAX_TOKENS, "max-tokens", 0, "N", "use only the first N tokens of the text", NULL},
    {O_LORA, "lora", 0, "FILE", "apply LoRA adapter FILE (repeatable): merged into a source as it is converted, or added at run time to a converted model, on the CPU (iflow-convert(1), LoRA adapters); --kl-base then measures what the adapter changes", "file"},
    {O_LORA_SCALED, "lora-scaled", 0, "FILE:S", "the same, the adapter's deltas multiplied by S", "file"},
    {O_KL_BASE, "kl-base", 0, "FILE", "also compare with base model FILE: KL divergence, top-1 agreement, delta perplexity", "file"},
    {O_KV_TYPE, "kv-type", 0, "TYPE", "KV cache type f32, f16 or q8 (INT8 with a scale per group; default f32); the --kl-base model keeps f32, so '-m M --kv-type q8 --kl-base M' measures what the cache type costs", "f32 f16 q8"},
    {O_THREADS, "threads", 't', "N", "compute threads (default: all cores)", NULL},
    DEVICES_ACTIVATIONS_OPT(O_ACTIVATIONS),
    {O_DEVICE, "device", 0, "DEV", "compute on auto (a GPU if there is one, else the CPU), cpu, cuda or cuda:N (default auto)", "auto cpu cuda"},
    {O_GPU_LAYERS, "gpu-layers", 0, "N", "put the first N layers on the GPU and the rest on the CPU (default: all)", NULL},
    {O_PLAN, "plan", 0, "FILE", "place the model over the devices of partition plan FILE (iflow-partition, iflow-plan(5))", "file"},
    DEVICES_COMM_OPT(O_COMM),
    {O_SAVE_IMATRIX, "save-imatrix", 0, "FILE", "also write the importance matrix of the text to FILE, for iflow-quant (computes on the CPU)", "file"},
    {O_JSON, "json", 0, NULL, "print the result as one JSON object", NULL},
    {O_LOGPROBS, "logprobs", 0, "FILE", "write every scored position's log-probability to FILE as TSV", "file"},
    PROGRESS_OPTS,
    {O_VERBOSE, "verbose", 'v', NULL, "print timings and the kernel path on standard error", NULL},
    {0},
};

static const iflow_tool tool = {
    "iflow-ppl", "-m MODEL -f TEXT [-c N] [options]",
    "Measure a model's perplexity on a text, under a stated protocol.", opts,
};

static void write_row(void *user, long position, long window, int window_pos, int32_t input_id, int32_t next_id,
                      double logprob)
{
    fprintf(user, "%ld\t%ld\t%d\t%d\t%d\t%.12f\n", position, window, window_pos, input_id, next_id, logprob);
}

/* Every scored position: the --logprobs row, and the status line (windows scored, the running
 * perplexity, tokens/s, time left). */
typedef struct {
    FILE *lp;              /* --logprobs, or NULL */
    progress pr;
    long windows, window;  /* windows in all; the one being scored */
    double nll;            /* the sum so far */
    long n;
} scoring;

static void on_position(void *user, long position, long window, int window_pos, int32_t input_id, int32_t next_id,
                        double logprob)
{
    scoring *s = user;
    if (s->lp)
        write_row(s->lp, position, window, window_pos, input_id, next_id, logprob);
    s->nll -= logprob;
    s->n++;
    if (s->pr.on && (window != s->window || s->n == 1)) {
        s->window = window;
        double t = progress_elapsed(&s->pr);
        char left[40];
        progress_left(left, sizeof left, (double)window, (double)s->windows, t);
        progress_show(&s->pr, window + 1 == s->windows, "window %ld/%ld, ppl %.4f, %.0f tok/s%s%s", window + 1, s->windows,
                      exp(s->nll / (double)s->n), t > 0 ? (double)s->n / t : 0.0, left[0] ? ", " : "", left);
    }
}

static const char *describe(int protocol, int c, char *buf, size_t cap)
{
    if (protocol == IFLOW_PPL_WINDOWS)
        snprintf(buf, cap, "non-overlapping windows of %d tokens (BOS + %d text tokens), every position scored", c, c - 1);
    else
        snprintf(buf, cap, "llama.cpp: chunks of %d tokens, first replaced by BOS, positions %d..%d scored", c, c / 2, c - 2);
    return buf;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *file = NULL, *logprobs_path = NULL, *base_path = NULL, *imatrix_path = NULL;
    int c_len = 512, threads = 0, protocol = IFLOW_PPL_WINDOWS, as_json = 0, verbose = 0, c;
    int progress_mode = PROGRESS_AUTO, kv_type = 0;
    long chunks = 0, max_tokens = 0;
    device_opts dev = {.gpu_layers = -1};
    cmd_loras loras = {0};
    const char *comm_kind = NULL; /* --comm */
    const char *arg;
    while ((c = opt_next(&tool, argc, argv, &arg)) != 0) {
        switch (c) {
        case O_MODEL: model = arg; break;
        case O_FILE: file = arg; break;
        case O_CTX: c_len = (int)opt_long(&tool, "ctx-size", arg, 2, 1 << 20); break;
        case O_CHUNKS: chunks = opt_long(&tool, "chunks", arg, 1, 1L << 40); break;
        case O_MAX_TOKENS: max_tokens = opt_long(&tool, "max-tokens", arg, 1, 1L << 40); break;
        case O_THREADS: threads = (int)opt_long(&tool, "threads", arg, 1, 1024); break;
        case O_JSON: as_json = 1; break;
        case O_LOGPROBS: logprobs_path = arg; break;
        case O_KL_BASE: base_path = arg; break;
        case O_LORA: cmd_lora_add(&tool, &loras, arg, 0); break;
        case O_LORA_SCALED: cmd_lora_add(&tool, &loras, arg, 1); break;
        case O_KV_TYPE:
            if ((kv_type = ifk_kv_type_from_name(arg)) < 0)
                die_usage(&tool, "--kv-type must be f32, f16 or q8, not '%s'", arg);
            break;
        case O_SAVE_IMATRIX: imatrix_path = arg; break;
        case O_VERBOSE: verbose = 1; break;
        case OPT_PROGRESS: progress_mode = PROGRESS_ON; break;
        case OPT_NO_PROGRESS: progress_mode = PROGRESS_OFF; break;
        case O_DEVICE: dev.device = arg; break;
        case O_PLAN: dev.plan = arg; break;
        case O_COMM:
            devices_check_comm(&tool, arg);
            comm_kind = arg;
            break;
        case O_GPU_LAYERS: dev.gpu_layers = (int)opt_long(&tool, "gpu-layers", arg, 0, 1 << 20); break;
        case O_ACTIVATIONS: devices_set_activations(&tool, arg); break;
        case O_PROTOCOL:
            if (strcmp(arg, "windows") == 0) protocol = IFLOW_PPL_WINDOWS;
            else if (strcmp(arg, "llama.cpp") == 0) protocol = IFLOW_PPL_LLAMACPP;
            else die_usage(&tool, "unknown protocol '%s' (windows, llama.cpp)", arg);
            break;
        }
    }
    if (opt_index() < argc)
        die_usage(&tool, "unexpected operand '%s'", argv[opt_index()]);
    if (!model || !file)
        die_usage(&tool, "need a model (-m FILE) and a text (-f FILE)");
    if (strcmp(model, "-") == 0 && strcmp(file, "-") == 0)
        die_usage(&tool, "the model and the text cannot both come from standard input");
    if (base_path && strcmp(base_path, "-") == 0 && (strcmp(model, "-") == 0 || strcmp(file, "-") == 0))
        die_usage(&tool, "only one of the model, the base model and the text can come from standard input");

    if (imatrix_path && ((dev.device && strcmp(dev.device, "cpu") != 0) || dev.plan || dev.gpu_layers >= 0))
        die_usage(&tool, "--save-imatrix computes on the CPU: leave out --device, --plan and --gpu-layers");
    if (imatrix_path)
        dev.device = "cpu";
    /* mpirun -np N: this process computes plan device `rank` (over MPI); every process scores the
     * text from the logits they share, process 0 prints */
    iflow_comm *comm = comm_mpi_open(&tool);
    const int nccl_alone = !comm && comm_kind && strcmp(comm_kind, "nccl") == 0; /* one process through NCCL */
    if (comm || nccl_alone) {
        if (imatrix_path || base_path)
            die_usage(&tool, "under mpirun or --comm nccl, --save-imatrix and --kl-base are not available (each "
                             "process holds part of the model)");
        if (strcmp(model, "-") == 0 || strcmp(file, "-") == 0)
            die_usage(&tool, "under mpirun or --comm nccl, the model and the text come from files (standard input "
                             "reaches process 0 only)");
        if (comm && comm->rank != 0) {
            if (!freopen("/dev/null", "w", stdout))
                die(&tool, "cannot silence the output of process %d", comm->rank);
            progress_mode = PROGRESS_OFF;
            verbose = 0;
            logprobs_path = NULL;
        }
    }
    double t0 = now_s();
    iflow_model *m;
    iflow_ctx *ctx;
    char *text;
    size_t len, n_ids;
    int32_t *ids;
    /* of a split: its own file */
    if (cmd_model_open_lora(&m, model, 0, comm ? comm->rank : nccl_alone ? 0 : -1, &loras) < 0)
        die(&tool, NULL);
    if ((comm || nccl_alone) && !dev.plan && !iflow_model_split_plan(m))
        die_usage(&tool, "under mpirun or --comm nccl, --plan (or a split model's own plan) gives each process its device");
    if (iflow_model_hparams(m)->layout == IFLOW_LAYOUT_ENCODER)
        die(&tool, "model '%s' is an encoder: an encoder gives embeddings (iflow-run --embed), not next-token "
                   "probabilities", model);
    if (iflow_model_hparams(m)->layout == IFLOW_LAYOUT_ENCODER_DECODER)
        die(&tool, "model '%s' is an encoder-decoder: its next-token probabilities need a source (iflow-run "
                   "--translate); perplexity of a text alone is not defined for it", model);
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    if (!tok)
        die(&tool, "model '%s' has no tokenizer", model);
    if (slurp(file, &text, &len) < 0 || iflow_tokenizer_encode(tok, text, len, 0, &ids, &n_ids) < 0)
        die(&tool, NULL);
    if (max_tokens && (size_t)max_tokens < n_ids)
        n_ids = (size_t)max_tokens;
    dev.threads = threads;
    dev.n_ctx = c_len;
    dev.verbose = verbose;
    placed pl, base_pl = {0};
    devices_place(&tool, m, &dev, &pl);
    iflow_comm *nccl = comm || nccl_alone ? devices_comm_nccl(&tool, comm_kind, comm, m, &pl, verbose) : NULL;
    iflow_comm *via = nccl ? nccl : comm;
    if (iflow_ctx_open_kv(&ctx, m, c_len, threads, kv_type) < 0 || (via && iflow_ctx_set_comm(ctx, via) < 0))
        die(&tool, NULL);
    iflow_model *base = NULL;
    iflow_ctx *base_ctx = NULL;
    if (base_path) {
        if (cmd_model_open(&base, base_path, 0) < 0)
            die(&tool, NULL);
        devices_place(&tool, base, &dev, &base_pl);
        if (iflow_ctx_open(&base_ctx, base, c_len, threads) < 0)
            die(&tool, NULL);
    }
    FILE *lp = NULL;
    if (logprobs_path) {
        if (!(lp = fopen(logprobs_path, "w")))
            die(&tool, "cannot create '%s'", logprobs_path);
        fprintf(lp, "position\twindow\twindow_pos\tinput_token_id\tnext_token_id\tlogprob\n");
    }
    iflow_imatrix_collector *col = NULL;
    if (imatrix_path && (iflow_imatrix_collector_open(&col, iflow_model_hparams(m)) < 0 ||
                         iflow_ctx_set_observer(ctx, iflow_imatrix_collector_observe, col) < 0))
        die(&tool, NULL);
    double t1 = now_s();
    iflow_ppl_opts po = {protocol, c_len, chunks, base_ctx};
    iflow_ppl_result r;
    scoring sc = {.lp = lp, .windows = iflow_ppl_windows(n_ids, &po), .window = -1};
    progress_open(&sc.pr, tool.name, progress_mode);
    if (iflow_ppl_run(ctx, ids, n_ids, iflow_model_hparams(m)->bos, &po, &r, lp || sc.pr.on ? on_position : NULL,
                      &sc) < 0)
        die(&tool, NULL);
    progress_end(&sc.pr);
    double t2 = now_s();
    if (col) {
        iflow_imatrix *im;
        iflow_ctx_set_observer(ctx, NULL, NULL);
        if (iflow_imatrix_collector_result(col, &im) < 0)
            die(&tool, NULL);
        if (im->n == 0)
            die(&tool, "no activations were observed for --save-imatrix");
        if (iflow_imatrix_save(im, imatrix_path) < 0)
            die(&tool, NULL);
        iflow_imatrix_free(im);
        iflow_imatrix_collector_close(col);
    }
    if (lp && fclose(lp) != 0)
        die(&tool, "cannot write '%s'", logprobs_path);
    if (r.n_scored == 0)
        die(&tool, "the text gives no window to score (%zu tokens, context %d)", n_ids, c_len);

    double nll = r.nll_sum / (double)r.n_scored, ppl = exp(nll);
    char proto[160];
    describe(protocol, c_len, proto, sizeof proto);
    if (as_json) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:f}", "model", model, "file",
                              file, "protocol", protocol == IFLOW_PPL_WINDOWS ? "windows" : "llama.cpp", "ctx", c_len,
                              "kv_type", ifk_kv_type_name(kv_type), "windows", (json_int_t)r.n_windows, "text_tokens",
                              (json_int_t)n_ids, "tokens_scored", (json_int_t)r.n_scored, "mean_nll", nll, "ppl", ppl,
                              "seconds", t2 - t1, "tokens_per_second", (double)r.n_scored / (t2 - t1 > 0 ? t2 - t1 : 1));
        json_object_set_new(o, "protocol_description", json_string(proto));
        if (base) {
            json_t *kl = json_pack("{s:s, s:f, s:f, s:f, s:f, s:f}", "kl_base", base_path, "base_ppl",
                                   exp(r.base_nll_sum / (double)r.n_scored), "delta_ppl",
                                   ppl - exp(r.base_nll_sum / (double)r.n_scored), "mean_kld",
                                   r.kld_sum / (double)r.n_scored, "max_kld", r.kld_max, "top1_agreement",
                                   (double)r.top1_same / (double)r.n_scored);
            json_object_update(o, kl); /* copies references: kl is still ours to release */
            json_decref(kl);
        }
        o = json_schema(o);
        json_dumpf(o, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        putchar('\n');
        json_decref(o);
    } else {
        printf("perplexity: %.6f\nmean NLL: %.10f\ntokens scored: %ld in %ld windows\nprotocol: %s\n", ppl, nll,
               r.n_scored, r.n_windows, proto);
        if (base) {
            double base_ppl = exp(r.base_nll_sum / (double)r.n_scored);
            printf("base: %s\nbase perplexity: %.6f (delta %+.6f)\nmean KL divergence: %.8f (max %.6f)\n"
                   "top-1 agreement: %.4f %%\n",
                   base_path, base_ppl, ppl - base_ppl, r.kld_sum / (double)r.n_scored, r.kld_max,
                   100.0 * (double)r.top1_same / (double)r.n_scored);
        }
    }
    if (verbose)
        fprintf(stderr, "%s: load+tokenize %.3f s; scored %ld tokens in %.3f s (%.1f tok/s); kernels %s\n", tool.name,
                t1 - t0, r.n_scored, t2 - t1, (double)r.n_scored / (t2 - t1 > 0 ? t2 - t1 : 1), iflow_kernel_path());
    free(ids);
    free(text);
    iflow_ctx_close(base_ctx);
    iflow_model_close(base);
    iflow_ctx_close(ctx);
    iflow_model_close(m);
    devices_release(&base_pl);
    devices_release(&pl);
    iflow_comm_nccl_close(nccl);
    comm_mpi_close(comm);
    return 0;
}
