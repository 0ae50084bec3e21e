/* iflow-run -- generate text from a model; or print the token ids of a text. */
#include "cmd/devices.h"
#include "cmd/io.h"
#include "cmd/opt.h"
#include "libcore/base/error.h"
#include "libcore/engine/model.h"
#include "libcore/engine/sampler.h"
#include "libcore/tokenizers/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum {
    O_MODEL = 'm', O_PROMPT = 'p', O_NPREDICT = 'n', O_THREADS = 't', O_CTX = 'c', O_VERBOSE = 'v',
    O_TEMP = 256, O_TOPK, O_TOPP, O_SEED, O_ECHO, O_JSON, O_TOKENIZE, O_BOS, O_PARSE_SPECIAL, O_DEVICE,
    O_GPU_LAYERS, O_LIST_DEVICES, O_PLAN,
};

static const iflow_opt opts[] = {
    {O_MODEL, "model", 'm', "FILE", "model shard file ('-': standard input) or a directory of per-device files (written by iflow-partition); with --tokenize also a Hugging Face directory or a GGUF file", "file"},
    {O_PROMPT, "prompt", 'p', "TEXT", "generate from TEXT (default: one prompt per line of standard input)", NULL},
    {O_NPREDICT, "n-predict", 'n', "N", "generate at most N tokens per prompt (default 128)", NULL},
    {O_TEMP, "temp", 0, "T", "sampling temperature; 0 is greedy (default 0.8)", NULL},
    {O_TOPK, "top-k", 0, "K", "sample from the K most likely tokens; 0 for all (default 40)", NULL},
    {O_TOPP, "top-p", 0, "P", "sample from the smallest set of tokens whose probability reaches P (default 0.95)", NULL},
    {O_SEED, "seed", 0, "N", "random seed; the same seed gives the same output (default: from the clock)", NULL},
    {O_THREADS, "threads", 't', "N", "compute threads (default: all cores)", NULL},
    {O_CTX, "ctx-size", 'c', "N", "context length in tokens (default: the model's)", NULL},
    {O_DEVICE, "device", 0, "DEV", "compute on auto (a GPU if there is one, else the CPU), cpu, cuda or cuda:N (default auto)", "auto cpu cuda"},
    {O_GPU_LAYERS, "gpu-layers", 0, "N", "put the first N layers on the GPU and the rest on the CPU (default: all)", NULL},
    {O_PLAN, "plan", 0, "FILE", "place the model over the devices of partition plan FILE (iflow-partition, iflow-plan(5))", "file"},
    {O_LIST_DEVICES, "list-devices", 0, NULL, "print the devices this machine has (with --json: JSON Lines) and exit", NULL},
    {O_ECHO, "echo", 0, NULL, "print the prompt before its continuation", NULL},
    {O_JSON, "json", 0, NULL, "print one JSON object per prompt: prompt, ids, text, stop reason", NULL},
    {O_TOKENIZE, "tokenize", 0, NULL, "print the token ids of all of standard input, space-separated, and exit", NULL},
    {O_BOS, "bos", 0, NULL, "with --tokenize: add the beginning-of-sequence token", NULL},
    {O_PARSE_SPECIAL, "parse-special", 0, NULL, "with --tokenize: read special-token text such as <s> as the special token", NULL},
    {O_VERBOSE, "verbose", 'v', NULL, "print timings, threads, the kernel path and the seed on standard error", NULL},
    {0},
};

static const iflow_tool tool = {
    "iflow-run", "-m MODEL [-p PROMPT] [options]",
    "Generate a continuation of each prompt with a language model.", opts,
};

typedef struct {
    const char *model, *prompt;
    int n_predict, threads, n_ctx, echo, json, tokenize, bos, parse_special, verbose, list_devices;
    device_opts dev;
    iflow_sampler_params sp;
} run_opts;

/* ---- --tokenize ---- */

static int is_shard(const char *path)
{
    unsigned char head[8] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(head, 1, 8, f) : 0;
    if (f)
        fclose(f);
    return (n == 8 && memcmp(head, "IFLOWSHD", 8) == 0) || (n >= 4 && memcmp(head, "\x28\xb5\x2f\xfd", 4) == 0);
}

static int tokenize(const run_opts *o)
{
    iflow_model *m = NULL;
    iflow_tokenizer *own = NULL;
    const iflow_tokenizer *tok;
    struct stat st;
    if (strcmp(o->model, "-") == 0)
        die_usage(&tool, "--tokenize reads the text from standard input, so the model must be a file");
    if (stat(o->model, &st) == 0 && !S_ISDIR(st.st_mode) && is_shard(o->model)) {
        if (iflow_model_open(&m, o->model, IFLOW_MODEL_NO_VERIFY) < 0)
            die(&tool, NULL);
        if (!(tok = iflow_model_tokenizer(m)))
            die(&tool, "model '%s' has no tokenizer", o->model);
    } else {
        if (iflow_tokenizer_open(&own, o->model) < 0)
            die(&tool, NULL);
        tok = own;
    }
    char *text;
    size_t len, n;
    int32_t *ids;
    if (slurp("-", &text, &len) < 0)
        die(&tool, NULL);
    int flags = (o->bos ? IFLOW_TOK_ADD_BOS : 0) | (o->parse_special ? IFLOW_TOK_PARSE_SPECIAL : 0);
    if (iflow_tokenizer_encode(tok, text, len, flags, &ids, &n) < 0)
        die(&tool, NULL);
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? " " : "", ids[i]);
    printf("\n");
    free(ids);
    free(text);
    iflow_tokenizer_close(own);
    iflow_model_close(m);
    return 0;
}

/* ---- generation ---- */

typedef struct {
    const run_opts *o;
    const iflow_model *m;
    const iflow_tokenizer *tok;
    iflow_ctx *ctx;
    iflow_sampler *sampler;
    float *logits;
    double t_prompt, t_gen;
    long n_prompt_tokens, n_gen_tokens;
} generator;

/* Decode one token: print it, or (to_buffer, for --json) append it to *acc. */
static void put_piece(const generator *g, int32_t id, int first, int to_buffer, char **acc, size_t *acc_len)
{
    char buf[256];
    int n = iflow_tokenizer_piece(g->tok, id, first, buf, sizeof buf);
    if (n <= 0)
        return;
    if (to_buffer) {
        char *na = realloc(*acc, *acc_len + (size_t)n + 1);
        if (!na)
            die(&tool, "out of memory");
        memcpy(na + *acc_len, buf, (size_t)n);
        *acc_len += (size_t)n;
        na[*acc_len] = 0;
        *acc = na;
    } else {
        fwrite(buf, 1, (size_t)n, stdout);
        fflush(stdout);
    }
}

static json_t *ids_json(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* Run n tokens and choose the next one. Greedy decoding finds it on the device that computes
 * the logits, which then copies back only the id; sampling needs them all. */
static int step(generator *g, const int32_t *ids, int n, int32_t *next)
{
    if (g->o->sp.temp == 0)
        return iflow_ctx_eval_argmax(g->ctx, ids, n, next);
    int rc = iflow_ctx_eval(g->ctx, ids, n, g->logits, 0);
    if (rc == 0)
        *next = iflow_sampler_sample(g->sampler, g->logits);
    return rc;
}

/* Generate the continuation of one prompt; prints it (or its JSON line). */
static void generate(generator *g, const char *prompt, size_t prompt_len)
{
    const run_opts *o = g->o;
    int32_t *ids, *gen = malloc(sizeof(int32_t) * (size_t)(o->n_predict > 0 ? o->n_predict : 1));
    size_t n_ids, n_gen = 0, acc_len = 0;
    char *acc = NULL;
    const char *stop = "length";
    if (!gen || iflow_tokenizer_encode(g->tok, prompt, prompt_len, IFLOW_TOK_ADD_BOS, &ids, &n_ids) < 0)
        die(&tool, NULL);
    if (n_ids == 0)
        die(&tool, "prompt is empty and the tokenizer adds no beginning-of-sequence token");
    int has_bos = iflow_model_hparams(g->m)->bos >= 0 && ids[0] == iflow_model_hparams(g->m)->bos;
    int first = n_ids == (size_t)has_bos; /* the continuation starts the text */
    json_t *js = o->json ? json_object() : NULL;
    if (o->echo && !js)
        fwrite(prompt, 1, prompt_len, stdout);
    iflow_ctx_reset(g->ctx);
    double t0 = now_s();
    if ((int)n_ids >= iflow_ctx_n_ctx(g->ctx))
        die(&tool, "prompt of %zu tokens does not fit the context of %d", n_ids, iflow_ctx_n_ctx(g->ctx));
    int32_t next;
    if (step(g, ids, (int)n_ids, &next) < 0)
        die(&tool, NULL);
    double t1 = now_s();
    g->t_prompt += t1 - t0;
    g->n_prompt_tokens += (long)n_ids;
    while ((int)n_gen < o->n_predict) {
        if (iflow_model_is_eos(g->m, next)) {
            stop = "eos";
            break;
        }
        gen[n_gen++] = next;
        put_piece(g, next, first && n_gen == 1, js != NULL, &acc, &acc_len);
        if ((int)n_gen == o->n_predict)
            break;
        if (iflow_ctx_n_past(g->ctx) >= iflow_ctx_n_ctx(g->ctx)) {
            stop = "context";
            break;
        }
        int32_t cur = next;
        if (step(g, &cur, 1, &next) < 0)
            die(&tool, NULL);
    }
    g->t_gen += now_s() - t1;
    g->n_gen_tokens += (long)n_gen;
    if (js) {
        json_object_set_new(js, "prompt", json_stringn(prompt, prompt_len));
        json_object_set_new(js, "prompt_ids", ids_json(ids, n_ids));
        json_object_set_new(js, "gen_ids", ids_json(gen, n_gen));
        json_object_set_new(js, "text", acc ? json_stringn(acc, acc_len) : json_string(""));
        json_object_set_new(js, "stop", json_string(stop));
        json_dumpf(js, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(js);
    }
    putchar('\n');
    fflush(stdout);
    free(acc);
    free(ids);
    free(gen);
}

static int run(const run_opts *o)
{
    if (strcmp(o->model, "-") == 0 && !o->prompt)
        die_usage(&tool, "the model comes from standard input, so prompts must come from -p");
    if (!o->prompt && isatty(0))
        die_usage(&tool, "no prompt: give -p TEXT or pipe prompts, one per line, to standard input");
    generator g = {.o = o};
    iflow_model *m;
    double t0 = now_s();
    if (iflow_model_open(&m, o->model, 0) < 0)
        die(&tool, NULL);
    g.m = m;
    if (!(g.tok = iflow_model_tokenizer(m)))
        die(&tool, "model '%s' has no tokenizer", o->model);
    const iflow_hparams *hp = iflow_model_hparams(m);
    placed pl;
    devices_place(&tool, m, &o->dev, &pl);
    if (iflow_ctx_open(&g.ctx, m, o->n_ctx, o->threads) < 0 || iflow_sampler_open(&g.sampler, &o->sp, hp->vocab_size) < 0)
        die(&tool, NULL);
    if (!(g.logits = malloc(sizeof(float) * (size_t)hp->vocab_size)))
        die(&tool, "out of memory");
    double t_load = now_s() - t0;
    if (o->prompt) {
        generate(&g, o->prompt, strlen(o->prompt));
    } else {
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        while ((len = getline(&line, &cap, stdin)) >= 0) {
            if (len && line[len - 1] == '\n')
                line[--len] = 0;
            if (len && line[len - 1] == '\r')
                line[--len] = 0;
            generate(&g, line, (size_t)len);
        }
        free(line);
    }
    char threads[16] = "all";
    if (o->threads)
        snprintf(threads, sizeof threads, "%d", o->threads);
    if (o->verbose)
        fprintf(stderr,
                "%s: load %.3f s; prompt %ld tokens in %.3f s (%.1f tok/s); generated %ld tokens in %.3f s (%.1f tok/s); "
                "threads %s; kernels %s; seed %llu\n",
                tool.name, t_load, g.n_prompt_tokens, g.t_prompt, g.n_prompt_tokens / (g.t_prompt > 0 ? g.t_prompt : 1),
                g.n_gen_tokens, g.t_gen, g.n_gen_tokens / (g.t_gen > 0 ? g.t_gen : 1), threads, iflow_kernel_path(),
                (unsigned long long)o->sp.seed);
    free(g.logits);
    iflow_sampler_close(g.sampler);
    iflow_ctx_close(g.ctx);
    iflow_model_close(m);
    devices_release(&pl);
    return 0;
}

int main(int argc, char **argv)
{
    run_opts o = {.n_predict = 128, .dev = {.gpu_layers = -1}, .sp = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f}};
    o.sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    int c;
    const char *arg;
    while ((c = opt_next(&tool, argc, argv, &arg)) != 0) {
        switch (c) {
        case O_MODEL: o.model = arg; break;
        case O_PROMPT: o.prompt = arg; break;
        case O_NPREDICT: o.n_predict = (int)opt_long(&tool, "n-predict", arg, 0, 1 << 24); break;
        case O_TEMP: o.sp.temp = (float)opt_double(&tool, "temp", arg, 0, 100); break;
        case O_TOPK: o.sp.top_k = (int)opt_long(&tool, "top-k", arg, 0, 1 << 24); break;
        case O_TOPP: o.sp.top_p = (float)opt_double(&tool, "top-p", arg, 1e-6, 1); break;
        case O_SEED: o.sp.seed = opt_u64(&tool, "seed", arg); break;
        case O_THREADS: o.threads = (int)opt_long(&tool, "threads", arg, 1, 1024); break;
        case O_CTX: o.n_ctx = (int)opt_long(&tool, "ctx-size", arg, 1, 1 << 24); break;
        case O_ECHO: o.echo = 1; break;
        case O_JSON: o.json = 1; break;
        case O_TOKENIZE: o.tokenize = 1; break;
        case O_BOS: o.bos = 1; break;
        case O_PARSE_SPECIAL: o.parse_special = 1; break;
        case O_VERBOSE: o.verbose = 1; break;
        case O_DEVICE: o.dev.device = arg; break;
        case O_GPU_LAYERS: o.dev.gpu_layers = (int)opt_long(&tool, "gpu-layers", arg, 0, 1 << 20); break;
        case O_LIST_DEVICES: o.list_devices = 1; break;
        case O_PLAN: o.dev.plan = arg; break;
        }
    }
    o.dev.threads = o.threads;
    o.dev.n_ctx = o.n_ctx;
    o.dev.verbose = o.verbose;
    if (o.list_devices) {
        devices_list(&tool, o.json);
        return 0;
    }
    if (opt_index() < argc)
        die_usage(&tool, "unexpected operand '%s'", argv[opt_index()]);
    if (!o.model)
        die_usage(&tool, "no model given (-m FILE)");
    return o.tokenize ? tokenize(&o) : run(&o);
}
