/* iflow-run -- generate text from a model; or print the token ids of a text. */
#include "cmd/batch.h"
#include "cmd/comm_mpi.h"
#include "cmd/devices.h"
#include "cmd/embed.h"
#include "cmd/io.h"
#include "cmd/model.h"
#include "cmd/opt.h"
#include "cmd/progress.h"
#include "cmd/translate.h"
#include "libcore/base/error.h"
#include "libcore/base/jsonutil.h"
#include "libcore/engine/model.h"
#include "libcore/engine/sampler.h"
#include "libcore/serving/batch.h"
#include "libcore/serving/beam.h"
#include "libcore/engine/stop.h"
#include "libcore/serving/chat.h"
#include "libcore/serving/grammar.h"
#include "libcore/serving/toolcall.h"
#include "libcore/tokenizers/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum {
    O_MODEL = 'm', O_PROMPT = 'p', O_NPREDICT = 'n', O_THREADS = 't', O_CTX = 'c', O_VERBOSE = 'v',
    O_TEMP = 256, O_TOPK, O_TOPP, O_SEED, O_ECHO, O_JSON, O_TOKENIZE, O_BOS, O_PARSE_SPECIAL, O_DEVICE,
    O_GPU_LAYERS, O_GPU_GRAPHS, O_NO_GPU_GRAPHS, O_LIST_DEVICES, O_PLAN, O_COMM, O_ACTIVATIONS, O_STOP, O_BATCH, O_PARALLEL, O_ORDERED, O_KV_TYPE, O_NO_PREFIX_CACHE, O_LOGPROBS, O_PROMPT_LOGPROBS, O_METRICS, O_DRY_RUN,
    O_CONTEXT_SHIFT, O_KEEP, O_DRAFT, O_LORA, O_LORA_SCALED, O_LORA_MODULE, O_DRAFT_N, O_DRAFT_TOP_K, O_DRAFT_TOP_P,
    O_BEAMS, O_LENGTH_PENALTY, O_LOGIT_BIAS, O_MIN_TOKENS, O_IGNORE_EOS, O_STOP_TOKEN_ID,
    O_INCLUDE_STOP,
    /* sampling: set through iflow_sampler_params_set() by their long names */
    O_SAMPLER, O_MINP, O_TYPICAL, O_TFS, O_MIROSTAT_TAU, O_MIROSTAT_ETA, O_REPEAT_PENALTY, O_REPEAT_LAST_N,
    O_FREQUENCY_PENALTY, O_PRESENCE_PENALTY, O_FSD_ALPHA, O_FSD_K, O_FSD_N, O_FSD_BETA, O_FSD_RANDOM_STEPS,
    O_EMBED, O_TRANSLATE, O_DECODER_PREFIX, O_SOURCE_PREFIX, O_CHAT, O_SYSTEM, O_CHAT_TEMPLATE, O_TOOL_PARSER,
    O_REASONING_PARSER, O_GRAMMAR_IN_REASONING,
    O_GRAMMAR, O_GRAMMAR_FILE, O_JSON_SCHEMA, O_JSON_SCHEMA_FILE, O_REGEX, O_CHOICE,
};

static const iflow_opt opts[] = {
    {O_MODEL, "model", 'm', "FILE", "model shard file ('-': standard input), a directory of per-device files (written by iflow-partition), or a source iflow-convert reads (Hugging Face directory, GGUF file, llama2.c checkpoint), converted on the fly", "file"},
    {O_PROMPT, "prompt", 'p', "TEXT", "generate from TEXT (default: one prompt per line of standard input)", NULL},
    {O_NPREDICT, "n-predict", 'n', "N", "generate at most N tokens per prompt (default 128)", NULL},
    {O_STOP, "stop", 0, "TEXT", "end a continuation where TEXT appears, TEXT not printed (repeatable)", NULL},
    {O_INCLUDE_STOP, "include-stop", 0, NULL, "with --stop: the stop string that ended a continuation stays at its end (vLLM's include_stop_str_in_output)", NULL},
    {O_STOP_TOKEN_ID, "stop-token-id", 0, "ID", "end a continuation at token ID as at an end-of-sequence token, ID not printed (repeatable, at most 16; a request's \"stop_token_ids\" replaces these)", NULL},
    {O_LOGIT_BIAS, "logit-bias", 0, "ID+B", "add B to token ID's logit before sampling: ID+B or ID-B, ID-inf bans the token (repeatable; a request's \"logit_bias\" replaces these)", NULL},
    {O_MIN_TOKENS, "min-tokens", 0, "N", "generate at least N tokens: the model's end-of-sequence tokens are banned before (stop strings still end the text)", NULL},
    {O_IGNORE_EOS, "ignore-eos", 0, NULL, "never end at an end-of-sequence token (it is banned): the text ends at -n, a stop string or the context", NULL},
    {O_CHAT, "chat", 0, NULL, "each prompt is a user's message: the model's chat template (from its checkpoint) makes it a conversation and the assistant's reply is generated", NULL},
    {O_SYSTEM, "system", 0, "TEXT", "with --chat: a system message before each user message", NULL},
    {O_CHAT_TEMPLATE, "chat-template", 0, "FILE", "the chat template (Jinja, as Hugging Face's chat_template) for --chat and --batch's \"messages\" instead of the model's", "file"},
    {O_TOOL_PARSER, "tool-parser", 0, "NAME", "with --batch: how the model writes tool calls, which requests with \"tools\" get back as \"tool_calls\": auto (default: the format the chat template names, if any), hermes, llama3_json, mistral, granite, pythonic (also llama4_pythonic) or none", "auto hermes llama3_json mistral granite pythonic llama4_pythonic none"},
    {O_GRAMMAR_IN_REASONING, "grammar-in-reasoning", 0, NULL, "with --batch and a reasoning parser: a chat request's constraint (grammar, json_schema, regex, choice, a required tool call) covers the reasoning too; by default it applies once </think> has come, as vLLM does", NULL},
    {O_REASONING_PARSER, "reasoning-parser", 0, "NAME", "with --batch: where a chat reply's reasoning goes: auto (default: a <think> block is \"reasoning_content\" when the chat template names <think>), think (the same whatever the template; deepseek_r1 and qwen3 are its other names) or none", "auto think deepseek_r1 qwen3 none"},
    {O_GRAMMAR, "grammar", 0, "TEXT", "constrained decoding: the generated text follows the grammar TEXT (GBNF, llama.cpp's grammar language: rules name ::= ..., starting at the rule root; iflow-run(1), GRAMMARS)", NULL},
    {O_GRAMMAR_FILE, "grammar-file", 0, "FILE", "the same, the grammar read from FILE", "file"},
    {O_JSON_SCHEMA, "json-schema", 0, "TEXT", "constrained decoding: the generated text is JSON valid under the JSON Schema TEXT ('{}': any JSON value; '{\"type\":\"object\"}': any object)", NULL},
    {O_JSON_SCHEMA_FILE, "json-schema-file", 0, "FILE", "the same, the schema read from FILE", "file"},
    {O_REGEX, "regex", 0, "TEXT", "constrained decoding: the generated text matches the regular expression TEXT whole", NULL},
    {O_CHOICE, "choice", 0, "TEXT", "constrained decoding: the generated text is one of the --choice texts (repeatable)", NULL},
    {O_SAMPLER, "sampler", 0, "NAME", "chain (default: every cut set), greedy, top-k, top-p, min-p, typical, tfs (that cut alone), mirostat, mirostat2, fsd or rfsd", "chain greedy top-k top-p min-p typical tfs mirostat mirostat2 fsd rfsd"},
    {O_TEMP, "temp", 0, "T", "sampling temperature; 0 is greedy (default 0.8)", NULL},
    {O_TOPK, "top-k", 0, "K", "sample from the K most likely tokens; 0 or -1 for all (default 40)", NULL},
    {O_TOPP, "top-p", 0, "P", "sample from the smallest set of tokens whose probability reaches P; 1 for all (default 0.95)", NULL},
    {O_MINP, "min-p", 0, "P", "drop the tokens less likely than P times the most likely one (default 0: off)", NULL},
    {O_TYPICAL, "typical", 0, "P", "locally typical sampling: keep the most typical tokens up to mass P (default 1: off)", NULL},
    {O_TFS, "tfs", 0, "Z", "tail-free sampling with parameter Z (default 1: off)", NULL},
    {O_MIROSTAT_TAU, "mirostat-tau", 0, "T", "mirostat: target surprise in bits (default 5)", NULL},
    {O_MIROSTAT_ETA, "mirostat-eta", 0, "E", "mirostat: learning rate (default 0.1)", NULL},
    {O_REPEAT_PENALTY, "repeat-penalty", 0, "R", "divide positive logits and multiply negative ones of recent tokens by R (default 1: off)", NULL},
    {O_REPEAT_LAST_N, "repeat-last-n", 0, "N", "the penalties look at the last N tokens, prompt included; -1 for all (default 64)", NULL},
    {O_FREQUENCY_PENALTY, "frequency-penalty", 0, "F", "lower a recent token's logit by F per occurrence (default 0)", NULL},
    {O_PRESENCE_PENALTY, "presence-penalty", 0, "P", "lower a recent token's logit by P once (default 0)", NULL},
    {O_FSD_ALPHA, "fsd-alpha", 0, "A", "fsd: weight of the n-gram anti-model of the text so far (default 0.65)", NULL},
    {O_FSD_K, "fsd-k", 0, "K", "fsd: choose among the K most likely tokens (default 3)", NULL},
    {O_FSD_N, "fsd-n", 0, "N", "fsd: n-gram order of the anti-model (default 3)", NULL},
    {O_FSD_BETA, "fsd-beta", 0, "B", "fsd: smoothing of the anti-model (default 0.9)", NULL},
    {O_FSD_RANDOM_STEPS, "fsd-random-steps", 0, "N", "rfsd: draw the first N tokens at random, then choose as fsd; 0 for all (default 0)", NULL},
    {O_CONTEXT_SHIFT, "context-shift", 0, "MODE", "when the context is full: none (stop there), rope (keep --keep positions, drop the older half of the rest, rotate the cached keys after them) or recompute (the same, the kept tokens evaluated again); default none, rope when --keep is given", "none rope recompute"},
    {O_KEEP, "keep", 0, "N", "a context shift keeps the first N prompt tokens, the beginning-of-sequence token included; -1 for the whole prompt (default 4)", NULL},
    {O_BEAMS, "beams", 0, "N", "beam search with N beams (1 to 32) instead of sampling: print the most probable continuation found (with --json: every beam, ranked, with its log-probability and score)", NULL},
    {O_LENGTH_PENALTY, "length-penalty", 0, "P", "with --beams: rank beams by log-probability / length^P; 0 ranks by log-probability alone, more favours longer ones (default 1)", NULL},
    {O_LORA, "lora", 0, "FILE", "apply LoRA adapter FILE (a PEFT adapter or a llama.cpp GGUF adapter; repeatable): merged into a source as it is converted, or added at run time to a converted model, on the CPU (iflow-convert(1), LoRA adapters)", "file"},
    {O_LORA_SCALED, "lora-scaled", 0, "FILE:S", "the same, the adapter's deltas multiplied by S", "file"},
    {O_LORA_MODULE, "lora-module", 0, "NAME=FILE", "with --batch: LoRA adapter FILE, applied at run time (on the CPU) to the requests that ask for it by NAME (\"lora\": \"NAME\"); requests of different adapters, and of none, share every step (repeatable: multi-LoRA serving)", "file"},
    {O_DRAFT, "draft", 0, "FILE", "speculative decoding: draft model FILE (sharing the model's tokenizer) proposes tokens that the model checks in one step; greedy output is unchanged, sampled output keeps its distribution", "file"},
    {O_DRAFT_N, "draft-n", 0, "N", "with --draft: tokens the draft proposes per step, 1 to 16 (default 5)", NULL},
    {O_DRAFT_TOP_K, "draft-top-k", 0, "K", "with --draft: accept a proposal when it is among the model's K most likely tokens (faster, no longer the model's distribution; default 0: the exact rule)", NULL},
    {O_DRAFT_TOP_P, "draft-top-p", 0, "P", "with --draft: accept a proposal when the tokens the model finds more likely hold less than P of its probability (faster, no longer the model's distribution; default 0: the exact rule)", NULL},
    {O_SEED, "seed", 0, "N", "random seed; the same seed gives the same output (default: from the clock)", NULL},
    {O_THREADS, "threads", 't', "N", "compute threads (default: all cores)", NULL},
    {O_CTX, "ctx-size", 'c', "N", "context length in tokens (default: the model's)", NULL},
    DEVICES_ACTIVATIONS_OPT(O_ACTIVATIONS),
    {O_DEVICE, "device", 0, "DEV", "compute on auto (a GPU if there is one, else the CPU), cpu, cuda or cuda:N (default auto)", "auto cpu cuda"},
    {O_GPU_LAYERS, "gpu-layers", 0, "N", "put the first N layers on the GPU and the rest on the CPU (default: all)", NULL},
    {O_GPU_GRAPHS, "gpu-graphs", 0, NULL, "on a GPU, record every decode step, those of several requests too, and run it as one CUDA graph (by default a step of one request is recorded once and run again at each next position; the same results)", NULL},
    {O_NO_GPU_GRAPHS, "no-gpu-graphs", 0, NULL, "on a GPU, launch each operation of a decode step on its own (the same results, slower)", NULL},
    {O_PLAN, "plan", 0, "FILE", "place the model over the devices of partition plan FILE (iflow-partition, iflow-plan(5))", "file"},
    DEVICES_COMM_OPT(O_COMM),
    {O_LIST_DEVICES, "list-devices", 0, NULL, "print the devices this machine has (with --json: JSON Lines) and exit", NULL},
    {O_BATCH, "batch", 0, NULL, "read JSON Lines requests from standard input, run them together (continuous batching) and write one JSON result per request as each finishes", NULL},
    {O_PARALLEL, "parallel", 0, "N", "with --batch: requests running at once (default 16)", NULL},
    {O_ORDERED, "ordered", 0, NULL, "with --batch: write the results in the order of the input lines (as vLLM's run-batch does), not as they finish; a finished result waits for those before it, and requests start at most 8 x --parallel lines past the oldest unwritten one", NULL},
    {O_KV_TYPE, "kv-type", 0, "TYPE", "KV cache type f32, f16 or q8 (INT8 with a scale per group; default f32): f16 halves the cache and what decode reads of it", "f32 f16 q8"},
    {O_NO_PREFIX_CACHE, "no-prefix-cache", 0, NULL, "evaluate every prompt whole: by default a prompt takes the KV cache of the longest prefix it shares, in whole blocks, with an earlier prompt still cached (the same output, less prefill)", NULL},
    {O_LOGPROBS, "logprobs", 0, "N", "with --json: each generated token's log-probability and the N most likely tokens at its position, 0 to 20 (with --batch: the requests' default \"logprobs\")", NULL},
    {O_PROMPT_LOGPROBS, "prompt-logprobs", 0, "N", "with --json: each prompt token's log-probability given the ones before it, and the N most likely, 0 to 20 (with --batch: the requests' default \"prompt_logprobs\")", NULL},
    {O_METRICS, "metrics", 0, "FILE", "with --batch: write throughput and latency metrics to FILE as JSON", "file"},
    {O_DRY_RUN, "dry-run", 0, NULL, "print the memory plan of --batch (weights, KV cache per request and in total, scratch) and the largest --parallel that fits (with --json: one JSON object), then exit", NULL},
    {O_ECHO, "echo", 0, NULL, "print the prompt before its continuation", NULL},
    {O_JSON, "json", 0, NULL, "print one JSON object per prompt: prompt, ids, text, why it stopped", NULL},
    {O_EMBED, "embed", 0, NULL, "with an encoder (a BERT-like model): print one JSON object per prompt with its pooled embedding (docs/JSON.md); with --batch, answer OpenAI batch lines for /v1/embeddings", NULL},
    {O_TRANSLATE, "translate", 0, NULL, "with an encoder-decoder (Marian/opus-mt, M2M100, T5): print one translation per input line (with --json: one JSON object each), greedy or with --beams; -n caps the tokens of each (default: the model's positions)", NULL},
    {O_DECODER_PREFIX, "decoder-prefix", 0, "TEXT", "with --translate: force these target tokens after the decoder's start token, special tokens read as such (M2M100's target language: __fr__)", NULL},
    {O_SOURCE_PREFIX, "source-prefix", 0, "TEXT", "with --translate: these tokens, special tokens read as such, instead of those the tokenizer puts before each source (M2M100's source language, __en__ by default: __de__)", NULL},
    {O_TOKENIZE, "tokenize", 0, NULL, "print the token ids of all of standard input, space-separated (with --json: one JSON object), and exit", NULL},
    {O_BOS, "bos", 0, NULL, "with --tokenize: add the beginning-of-sequence token", NULL},
    {O_PARSE_SPECIAL, "parse-special", 0, NULL, "with --tokenize: read special-token text such as <s> as the special token", NULL},
    PROGRESS_OPTS,
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
    int batch, parallel, ordered, kv_type, no_prefix_cache, dry_run, progress, embed;
    int logprobs, prompt_logprobs; /* 0: none; 1 + N */
    int context_shift, keep;
    const char *draft;
    cmd_loras loras;              /* --lora, --lora-scaled (cmd_model_open_lora) */
    int draft_n, draft_top_k;
    float draft_top_p;
    int beams;
    float length_penalty;
    int translate, n_given;
    const char *decoder_prefix, *source_prefix;
    int chat;                 /* --chat */
    const char *system;       /* --system TEXT, or NULL */
    const char *chat_template; /* --chat-template FILE, or NULL */
    int tool_parser;           /* --tool-parser: IFLOW_TOOLS_*, or -1 (auto: the template's)      */
    int reasoning_parser;      /* --reasoning-parser: 1 think, 0 none, -1 auto (the template's)  */
    int grammar_in_reasoning;  /* --grammar-in-reasoning                                        */
    iflow_grammar *grammar;   /* --grammar, --json-schema, --regex, --choice (and the -file forms), or NULL */
    char grammar_opt[4200];   /* which of them, for messages: "--grammar-file 'g.gbnf'" */
    const char *metrics;
    const char *comm;     /* --comm: auto, mpi or nccl */
    device_opts dev;
    iflow_sampler_params sp;
    const char **stops;   /* [n_stops] --stop strings */
    int n_stops;
    int32_t *bias_ids;    /* [n_bias] --logit-bias */
    float *bias_values;
    int n_bias;
    int min_tokens, ignore_eos; /* --min-tokens, --ignore-eos */
    int32_t stop_ids[IFLOW_MAX_STOP_IDS]; /* --stop-token-id */
    int n_stop_ids;
    int include_stop;     /* --include-stop */
} run_opts;

/* --logit-bias's and --stop-token-id's ids are m's tokens (a usage error once, not an error for
 * every prompt). */
static void check_token_ids(const run_opts *o, const iflow_model *m)
{
    const int V = iflow_model_hparams(m)->vocab_size;
    for (int i = 0; i < o->n_bias; i++)
        if (o->bias_ids[i] >= V)
            die_usage(&tool, "--logit-bias: logit bias of token %d, outside the vocabulary of %d", o->bias_ids[i], V);
    for (int i = 0; i < o->n_stop_ids; i++)
        if (o->stop_ids[i] >= V)
            die_usage(&tool, "--stop-token-id %d is outside the vocabulary (%d)", o->stop_ids[i], V);
}

/* --logit-bias ID+B, ID-B or ID-inf into o's lists (room for one per argument). */
static void logit_bias_opt(run_opts *o, const char *arg)
{
    char *end;
    errno = 0;
    long id = strtol(arg, &end, 10);
    const char *b = end;
    double v = 0;
    int ok = arg[0] >= '0' && arg[0] <= '9' && !errno && id <= INT32_MAX && (*b == '+' || *b == '-');
    if (ok && strcmp(b, "-inf") == 0)
        v = -INFINITY;
    else if (ok) {
        v = strtod(b, &end);
        ok = *end == 0 && end != b + 1 && fabs(v) <= 100;
    }
    if (!ok)
        die_usage(&tool, "--logit-bias takes ID+B or ID-B (B from 0 to 100) or ID-inf, not '%s'", arg);
    o->bias_ids[o->n_bias] = (int32_t)id;
    o->bias_values[o->n_bias++] = (float)v;
}

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
        if (cmd_model_open(&m, o->model, IFLOW_MODEL_NO_VERIFY) < 0)
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
    if (o->json) {
        json_t *a = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(a, json_integer(ids[i]));
        json_t *js = json_schema(json_pack("{s:s, s:I, s:I, s:o}", "tokenizer", iflow_tokenizer_kind(tok), "bytes",
                                           (json_int_t)len, "tokens", (json_int_t)n, "ids", a));
        char *s = js ? json_dumps(js, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (!s)
            die(&tool, "out of memory");
        puts(s);
        free(s);
        json_decref(js);
    } else {
        for (size_t i = 0; i < n; i++)
            printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
    }
    free(ids);
    free(text);
    iflow_tokenizer_close(own);
    iflow_model_close(m);
    return 0;
}

/* ---- generation ----
 *
 * One prompt after another through the batch engine (libcore/serving/batch.h) with one request
 * in flight: the text is printed as the engine makes it final (on_text), and a prompt gives
 * the same tokens here as the same request in --batch. Prompt i (from 0) samples with seed
 * --seed + i. */

typedef struct {
    const run_opts *o;
    const iflow_model *m;
    const iflow_tokenizer *tok;
    const iflow_chat *chat;       /* --chat: the template, or NULL */
    iflow_batch *b;
    char *acc;                    /* --json: the text so far */
    size_t acc_len;
    double t_prompt, t_gen;
    long n_prompt_tokens, n_gen_tokens, n_prompts;
} generator;

/* Print final text at once, or (for --json) keep it. */
static void on_text(void *user, const char *t, size_t n)
{
    generator *g = user;
    if (g->o->json) {
        char *na = realloc(g->acc, g->acc_len + n + 1);
        if (!na)
            die(&tool, "out of memory");
        memcpy(na + g->acc_len, t, n);
        g->acc_len += n;
        na[g->acc_len] = 0;
        g->acc = na;
    } else {
        fwrite(t, 1, n, stdout);
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

/* --beams: the search, then the best continuation (with --json, every beam). */
static void generate_beams(generator *g, const char *prompt, size_t prompt_len, const int32_t *ids, size_t n_ids)
{
    const run_opts *o = g->o;
    iflow_beam_params bp = {.n_beams = o->beams, .max_tokens = o->n_predict, .length_penalty = o->length_penalty,
                            .n_ctx = o->n_ctx, .kv_type = o->kv_type, .n_threads = o->threads, .stop = o->stops,
                            .n_stop = o->n_stops};
    iflow_beam *bs;
    int nb;
    double t0 = now_s();
    if (iflow_beam_search(g->m, ids, (int)n_ids, &bp, &bs, &nb) < 0)
        die(&tool, NULL);
    g->t_gen += now_s() - t0;
    if (!o->json) {
        fwrite(bs[0].text, 1, bs[0].text_len, stdout);
    } else {
        json_t *js = json_object(), *arr = json_array();
        json_object_set_new(js, "prompt", iflow_json_text(prompt, prompt_len));
        json_object_set_new(js, "prompt_ids", ids_json(ids, n_ids));
        for (int i = 0; i < nb; i++) {
            json_t *b = json_object();
            json_object_set_new(b, "text", iflow_json_text(bs[i].text, bs[i].text_len));
            json_object_set_new(b, "gen_ids", ids_json(bs[i].tokens, (size_t)bs[i].n_tokens));
            json_object_set_new(b, "logprob", json_real(bs[i].logprob));
            json_object_set_new(b, "score", json_real(bs[i].score));
            json_object_set_new(b, "stop", json_string(iflow_finish_name(bs[i].finish)));
            if (bs[i].stop_index >= 0)
                json_object_set_new(b, "stop_string", json_string(o->stops[bs[i].stop_index]));
            json_array_append_new(arr, b);
            if (i == 0) { /* the best one also where a sampled run puts its continuation */
                json_object_set(js, "gen_ids", json_object_get(b, "gen_ids"));
                json_object_set(js, "text", json_object_get(b, "text"));
                json_object_set(js, "stop", json_object_get(b, "stop"));
                if (bs[i].stop_index >= 0)
                    json_object_set(js, "stop_string", json_object_get(b, "stop_string"));
            }
        }
        json_object_set_new(js, "beams", arr);
        js = json_schema(js);
        json_dumpf(js, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(js);
    }
    g->n_gen_tokens += bs[0].n_tokens;
    iflow_beams_free(bs, nb);
}

/* --chat: the conversation of one prompt ([--system's message,] the prompt as the user's) through
 * the template, into *text (malloc'd). */
static void chat_text(const generator *g, const char *prompt, size_t prompt_len, char **text, size_t *len)
{
    json_t *msgs = json_array(), *user = json_pack("{s:s, s:s%}", "role", "user", "content", prompt, prompt_len);
    json_t *sys = g->o->system ? json_pack("{s:s, s:s}", "role", "system", "content", g->o->system) : NULL;
    if (!user || (g->o->system && !sys))
        die(&tool, "%s is not valid UTF-8, so it cannot be a chat message", user ? "--system's text" : "prompt");
    if (sys)
        json_array_append_new(msgs, sys);
    json_array_append_new(msgs, user);
    if (iflow_chat_render(g->chat, msgs, NULL, 1, text, len) < 0)
        die(&tool, NULL);
    json_decref(msgs);
}

/* Generate the continuation of one prompt; prints it (or its JSON line). */
static void generate(generator *g, const char *prompt, size_t prompt_len)
{
    const run_opts *o = g->o;
    int32_t *ids;
    size_t n_ids;
    char *chat = NULL;
    if (g->chat) { /* what the model continues, and what --echo and --json show: the conversation */
        chat_text(g, prompt, prompt_len, &chat, &prompt_len);
        prompt = chat;
    }
    if ((g->chat ? iflow_chat_encode(g->chat, prompt, prompt_len, &ids, &n_ids)
                 : iflow_tokenizer_encode(g->tok, prompt, prompt_len, IFLOW_TOK_ADD_BOS, &ids, &n_ids)) < 0)
        die(&tool, NULL);
    if (n_ids == 0)
        die(&tool, "prompt is empty and the tokenizer adds no beginning-of-sequence token");
    if (o->echo && !o->json)
        fwrite(prompt, 1, prompt_len, stdout);
    if (o->beams && o->n_predict > 0) {
        generate_beams(g, prompt, prompt_len, ids, n_ids);
        g->n_prompt_tokens += (long)n_ids;
        g->n_prompts++;
        putchar('\n');
        fflush(stdout);
        free(ids);
        free(chat);
        return;
    }
    iflow_result *r = NULL;
    g->acc_len = 0;
    if (o->n_predict > 0) {
        iflow_request q = {.prompt = ids, .n_prompt = (int)n_ids, .max_tokens = o->n_predict, .sampling = o->sp,
                           .n_stop = o->n_stops, .context_shift = o->context_shift, .keep = o->keep, .user = g,
                           .on_text = on_text, .logprobs = o->logprobs, .prompt_logprobs = o->prompt_logprobs,
                           .grammar = o->grammar, .bias_ids = o->bias_ids, .bias_values = o->bias_values,
                           .n_bias = o->n_bias, .min_tokens = o->min_tokens, .ignore_eos = o->ignore_eos,
                           .stop_ids = o->stop_ids, .n_stop_ids = o->n_stop_ids, .include_stop = o->include_stop};
        q.sampling.seed += (uint64_t)g->n_prompts;
        for (int i = 0; i < o->n_stops; i++)
            q.stop[i] = o->stops[i];
        if (iflow_batch_add(g->b, &q) < 0)
            die(&tool, NULL);
        int rc;
        while ((rc = iflow_batch_step(g->b)) > 0)
            ;
        if (rc < 0 || iflow_batch_take(g->b, &r) != 1)
            die(&tool, NULL);
        g->t_prompt += r->t_first - r->t_started;
        g->t_gen += r->t_done - r->t_first;
        g->n_gen_tokens += r->n_tokens;
    }
    g->n_prompt_tokens += (long)n_ids;
    g->n_prompts++;
    if (o->json) {
        json_t *js = json_object();
        json_object_set_new(js, "prompt", iflow_json_text(prompt, prompt_len));
        json_object_set_new(js, "prompt_ids", ids_json(ids, n_ids));
        json_object_set_new(js, "gen_ids", ids_json(r ? r->tokens : NULL, r ? (size_t)r->n_tokens : 0));
        json_object_set_new(js, "text", iflow_json_text(g->acc ? g->acc : "", g->acc_len));
        json_object_set_new(js, "stop", json_string(r ? iflow_finish_name(r->finish) : "length"));
        if (r && r->stop_index >= 0)
            json_object_set_new(js, "stop_string", json_string(o->stops[r->stop_index]));
        if (r && r->stop_token >= 0)
            json_object_set_new(js, "stop_token", json_integer(r->stop_token));
        if (r && r->logprobs)
            json_object_set_new(js, "logprobs", logprobs_json(g->tok, r->logprobs, r->n_tokens, o->logprobs > 1));
        if (r && r->prompt_logprobs)
            json_object_set_new(js, "prompt_logprobs",
                                logprobs_json(g->tok, r->prompt_logprobs, r->n_prompt, o->prompt_logprobs > 1));
        js = json_schema(js);
        json_dumpf(js, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(js);
    }
    putchar('\n');
    fflush(stdout);
    iflow_result_free(r);
    free(ids);
    free(chat);
}

static void generate_line(void *g, const char *line, size_t len) { generate(g, line, len); }

/* --draft: the draft model, on the device the options name (a plan places the model only). */
static iflow_model *open_draft(const run_opts *o, placed *pl)
{
    iflow_model *d;
    if (cmd_model_open(&d, o->draft, 0) < 0)
        die(&tool, NULL);
    device_opts dev = o->dev;
    dev.plan = NULL;
    dev.gpu_layers = -1;
    devices_place(&tool, d, &dev, pl);
    return d;
}

/* Generation from a prompt needs a decoder: an encoder-decoder translates a source (an encoder
 * is refused by the engine: it gives embeddings). */
static void check_generates(const iflow_model *m, const char *path)
{
    if (iflow_model_hparams(m)->layout == IFLOW_LAYOUT_ENCODER_DECODER)
        die(&tool, "model '%s' is an encoder-decoder: it translates a source (--translate), it does not continue a "
                   "prompt", path);
}

/* The chat template: --chat-template's file, else the model's. Without `required`, a model with
 * none (or with one that does not parse) gives NULL, and why[] says it (for the requests that need
 * it); a --chat-template file that cannot be read or parsed is always an error. */
static iflow_chat *open_chat(const run_opts *o, const iflow_model *m, int required, char *why, size_t cap)
{
    iflow_chat *c;
    if (iflow_chat_open_as(&c, m, o->chat_template, o->model) == 0) {
        if (o->verbose)
            fprintf(stderr, "%s: chat: %s\n", tool.name, iflow_chat_source(c));
        return c;
    }
    if (required || o->chat_template)
        die(&tool, NULL);
    snprintf(why, cap, "%s", iflow_errmsg());
    return NULL;
}

/* --batch and --dry-run: the continuous-batching engine (cmd/batch.c). */
static int run_batch(const run_opts *o)
{
    if (strcmp(o->model, "-") == 0 && !o->dry_run)
        die_usage(&tool, "--batch reads requests from standard input, so the model must be a file");
    if (o->prompt)
        die_usage(&tool, "--batch reads its prompts from standard input; -p does not go with it");
    iflow_model *m;
    if (cmd_model_open_lora(&m, o->model, o->dry_run ? IFLOW_MODEL_NO_VERIFY : 0, -1, &o->loras) < 0)
        die(&tool, NULL);
    check_generates(m, o->model);
    check_token_ids(o, m);
    if (!iflow_model_tokenizer(m))
        die(&tool, "model '%s' has no tokenizer", o->model);
    batch_opts b = {.parallel = o->parallel, .ordered = o->ordered, .n_ctx = o->n_ctx, .kv_type = o->kv_type,
                    .threads = o->threads,
                    .no_prefix_cache = o->no_prefix_cache, .logprobs = o->logprobs,
                    .prompt_logprobs = o->prompt_logprobs,
                    .max_tokens = o->n_predict, .verbose = o->verbose, .json = o->json, .sp = o->sp,
                    .context_shift = o->context_shift, .keep = o->keep,
                    .metrics = o->metrics, .model = o->model, .progress = o->progress,
                    .gpu_graphs = o->dev.gpu_graphs, .grammar = o->grammar,
                    .adapters = o->loras.modules, .n_adapters = (int)o->loras.n_modules, .bias_ids = o->bias_ids,
                    .bias_values = o->bias_values, .n_bias = o->n_bias, .min_tokens = o->min_tokens,
                    .ignore_eos = o->ignore_eos, .stop_ids = o->stop_ids, .n_stop_ids = o->n_stop_ids,
                    .include_stop = o->include_stop};
    int rc;
    char why[512];
    iflow_chat *chat = NULL;
    if (o->dry_run) {
        rc = batch_dry_run(&tool, m, &b);
    } else {
        b.chat = chat = open_chat(o, m, 0, why, sizeof why);
        b.chat_error = why;
        b.tool_format = o->tool_parser >= 0 ? o->tool_parser : chat ? iflow_chat_tool_format(chat) : IFLOW_TOOLS_NONE;
        b.reasoning = o->reasoning_parser >= 0 ? o->reasoning_parser : chat && iflow_chat_reasoning(chat);
        b.grammar_in_reasoning = o->grammar_in_reasoning;
        if (o->verbose && chat)
            fprintf(stderr, "%s: tool calls: %s%s; reasoning: %s%s\n", tool.name, iflow_tool_format_name(b.tool_format),
                    o->tool_parser >= 0 ? "" : " (the chat template's)", b.reasoning ? "think" : "none",
                    o->reasoning_parser >= 0 ? "" : " (the chat template's)");
        placed pl, dpl;
        devices_place(&tool, m, &o->dev, &pl);
        iflow_model *d = o->draft ? open_draft(o, &dpl) : NULL;
        b.draft = d, b.draft_n = o->draft_n, b.draft_top_k = o->draft_top_k, b.draft_top_p = o->draft_top_p;
        rc = batch_run(&tool, m, &b);
        iflow_chat_close(chat);
        if (d) {
            iflow_model_close(d);
            devices_release(&dpl);
        }
        iflow_model_close(m);
        devices_release(&pl);
        return rc;
    }
    iflow_model_close(m);
    return rc;
}

static int run(const run_opts *o)
{
    if (strcmp(o->model, "-") == 0 && !o->prompt)
        die_usage(&tool, "the model comes from standard input, so prompts must come from -p");
    if (!o->prompt && isatty(0))
        die_usage(&tool, "no prompt: give -p TEXT or pipe prompts, one per line, to standard input");
    generator g = {.o = o};
    iflow_model *m;
    /* mpirun -np N: this process computes plan device `rank`; process 0 prints */
    iflow_comm *comm = comm_mpi_open(&tool);
    const int nccl_alone = !comm && o->comm && strcmp(o->comm, "nccl") == 0; /* one process through NCCL */
    if (comm && !o->prompt)
        die_usage(&tool, "under mpirun, give the prompt with -p (standard input reaches process 0 only)");
    if (comm && comm->rank != 0 && !freopen("/dev/null", "w", stdout))
        die(&tool, "cannot silence the output of process %d", comm->rank);
    double t0 = now_s();
    /* of a split: its own file */
    if (cmd_model_open_lora(&m, o->model, 0, comm ? comm->rank : nccl_alone ? 0 : -1, &o->loras) < 0)
        die(&tool, NULL);
    if ((comm || nccl_alone) && !o->dev.plan && !iflow_model_split_plan(m))
        die_usage(&tool, "under mpirun or --comm nccl, --plan (or a split model's own plan) gives each process its device");
    check_generates(m, o->model);
    g.m = m;
    if (!(g.tok = iflow_model_tokenizer(m)))
        die(&tool, "model '%s' has no tokenizer", o->model);
    iflow_chat *chat = o->chat ? open_chat(o, m, 1, NULL, 0) : NULL;
    g.chat = chat;
    placed pl, dpl;
    devices_place(&tool, m, &o->dev, &pl);
    iflow_comm *nccl = comm || nccl_alone ? devices_comm_nccl(&tool, o->comm, comm, m, &pl, o->verbose) : NULL;
    iflow_model *draft = o->draft ? open_draft(o, &dpl) : NULL;
    iflow_batch_params bp = {.parallel = 1, .n_ctx = o->n_ctx, .kv_type = o->kv_type, .n_threads = o->threads,
                             .no_prefix_cache = o->no_prefix_cache};
    iflow_sampler *chain; /* for -v: the chain the requests run */
    if (iflow_batch_open(&g.b, m, &bp) < 0 || iflow_sampler_open(&chain, &o->sp, iflow_model_hparams(m)->vocab_size) < 0 ||
        iflow_batch_set_comm(g.b, nccl ? nccl : comm) < 0 ||
        (draft && iflow_batch_set_draft(g.b, draft, o->draft_n, o->draft_top_k, o->draft_top_p) < 0))
        die(&tool, NULL);
    check_token_ids(o, m);
    for (int i = 0; i < o->n_bias; i++) /* for -v's description of the chain */
        if (iflow_sampler_add_bias(chain, o->bias_ids[i], o->bias_values[i], -1) < 0)
            die(&tool, NULL);
    if (o->grammar && iflow_batch_check_grammar(g.b, o->grammar) < 0) /* a token it names: once, with its option */
        die(&tool, "%s: %s", o->grammar_opt, iflow_errmsg());
    iflow_batch_set_graphs(g.b, o->dev.gpu_graphs);
    double t_load = now_s() - t0;
    if (o->prompt)
        generate(&g, o->prompt, strlen(o->prompt));
    else
        each_line(stdin, generate_line, &g);
    char threads[16] = "all";
    if (o->threads)
        snprintf(threads, sizeof threads, "%d", o->threads);
    if (o->verbose)
        fprintf(stderr,
                "%s: load %.3f s; prompt %ld tokens in %.3f s (%.1f tok/s); generated %ld tokens in %.3f s (%.1f tok/s); "
                "threads %s; kernels %s; kv cache %s; seed %llu\n",
                tool.name, t_load, g.n_prompt_tokens, g.t_prompt, g.n_prompt_tokens / (g.t_prompt > 0 ? g.t_prompt : 1),
                g.n_gen_tokens, g.t_gen, g.n_gen_tokens / (g.t_gen > 0 ? g.t_gen : 1), threads, iflow_kernel_path(),
                ifk_kv_type_name(o->kv_type), (unsigned long long)o->sp.seed);
    char desc[256];
    if (o->verbose)
        fprintf(stderr, "%s: sampler: %s\n", tool.name, iflow_sampler_describe(chain, desc, sizeof desc));
    if (o->verbose && pl.gpu && o->dev.gpu_graphs != IFLOW_GRAPHS_OFF) {
        iflow_graph_stats gs;
        iflow_device_graph_stats(pl.gpu, &gs);
        fprintf(stderr, "%s: %s: %ld steps run as one graph (%ld set up anew, %ld run again without recording), %ld "
                "recordings dropped\n", tool.name, pl.gpu->info.name, gs.launches, gs.instantiations, gs.replays,
                gs.aborts);
    }
    iflow_batch_stats st;
    iflow_batch_get_stats(g.b, &st);
    if (o->verbose && draft)
        fprintf(stderr, "%s: draft: %llu tokens proposed, %llu accepted (%.1f %%), %.2f tokens a step, %.1f tok/s "
                "generated (compare a run without --draft)\n", tool.name,
                (unsigned long long)st.drafted, (unsigned long long)st.accepted,
                st.drafted ? 100.0 * (double)st.accepted / (double)st.drafted : 0.0,
                st.steps ? (double)st.generated / (double)st.steps : 0.0, g.n_gen_tokens / (g.t_gen > 0 ? g.t_gen : 1));
    iflow_sampler_close(chain);
    iflow_chat_close(chat);
    free(g.acc);
    iflow_batch_close(g.b);
    if (draft) {
        iflow_model_close(draft);
        devices_release(&dpl);
    }
    iflow_model_close(m);
    iflow_comm_nccl_close(nccl);
    devices_release(&pl);
    comm_mpi_close(comm);
    return 0;
}

/* The sampling options, by the names iflow_sampler_params_set() knows ("--min-p"). */
typedef struct {
    char names[64][40];
    const char *name[64], *value[64];
    int n;
} sampling_opts;

static void sampling_opt(sampling_opts *so, int id, const char *arg)
{
    if (so->n == 64)
        die_usage(&tool, "too many sampling options");
    for (const iflow_opt *op = opts; op->name; op++)
        if (op->id == id)
            snprintf(so->names[so->n], sizeof so->names[0], "--%s", op->name);
    so->name[so->n] = so->names[so->n];
    so->value[so->n++] = arg;
}

/* The constraint options, one at most, made a grammar (before the model is loaded: a bad one
 * fails fast). choices [n_choices]: the --choice texts. */
typedef struct {
    int id;              /* the option given (O_GRAMMAR ...), 0 for none */
    const char *arg;
    const char **choices;
    int n_choices;
} constraint_opts;

static void constraint_opt(constraint_opts *co, int id, const char *arg)
{
    if (co->id && !(co->id == O_CHOICE && id == O_CHOICE))
        die_usage(&tool, "--grammar, --grammar-file, --json-schema, --json-schema-file, --regex and --choice: one at "
                         "most (--choice may be repeated)");
    co->id = id;
    co->arg = arg;
    if (id == O_CHOICE)
        co->choices[co->n_choices++] = arg;
}

static iflow_grammar *constraint_grammar(const constraint_opts *co, char *label, size_t cap)
{
    static const char *const names[] = {"grammar", "grammar-file", "json-schema", "json-schema-file", "regex"};
    if (co->id == O_CHOICE)
        snprintf(label, cap, "--choice");
    else if (co->id)
        snprintf(label, cap, co->id == O_GRAMMAR_FILE || co->id == O_JSON_SCHEMA_FILE ? "--%s '%s'" : "--%s",
                 names[co->id - O_GRAMMAR], co->arg);
    iflow_grammar *g = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc;
    if (!co->id)
        return NULL;
    if (co->id == O_CHOICE) {
        size_t *lens = malloc(sizeof *lens * (size_t)co->n_choices);
        if (!lens)
            die(&tool, "out of memory");
        for (int i = 0; i < co->n_choices; i++)
            lens[i] = strlen(co->choices[i]);
        rc = iflow_grammar_open_choices(&g, co->choices, lens, co->n_choices);
        free(lens);
        if (rc < 0)
            die(&tool, "--choice: %s", iflow_errmsg());
        return g;
    }
    const char *name = names[co->id - O_GRAMMAR];
    int from_file = co->id == O_GRAMMAR_FILE || co->id == O_JSON_SCHEMA_FILE;
    if (from_file && slurp(co->arg, &text, &len) < 0)
        die(&tool, NULL);
    int kind = co->id == O_REGEX ? IFLOW_GRAMMAR_REGEX
             : co->id == O_JSON_SCHEMA || co->id == O_JSON_SCHEMA_FILE ? IFLOW_GRAMMAR_JSON_SCHEMA : IFLOW_GRAMMAR_GBNF;
    rc = iflow_grammar_open_as(&g, kind, from_file ? text : co->arg, from_file ? len : strlen(co->arg));
    free(text);
    if (rc < 0) {
        if (from_file)
            die(&tool, "--%s '%s': %s", name, co->arg, iflow_errmsg());
        die(&tool, "--%s: %s", name, iflow_errmsg());
    }
    return g;
}

/* What main() allocated for the options' lists. */
static void opts_free(run_opts *o, constraint_opts *co)
{
    free(o->stops);
    free(o->bias_ids);
    free(o->bias_values);
    free(co->choices);
}

int main(int argc, char **argv)
{
    run_opts o = {.n_predict = 128, .dev = {.gpu_layers = -1, .gpu_graphs = IFLOW_GRAPHS_REPLAY}, .progress = PROGRESS_AUTO, .context_shift = -1,
                  .keep = 4, .draft_n = 5, .length_penalty = 1.0f, .tool_parser = -1,
                  .reasoning_parser = -1};
    int keep_given = 0, lp_given = 0;
    iflow_sampler_params_default(&o.sp);
    o.sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    sampling_opts so = {.n = 0};
    constraint_opts co = {0};
    o.stops = calloc((size_t)argc, sizeof *o.stops);
    co.choices = calloc((size_t)argc, sizeof *co.choices);
    o.bias_ids = calloc((size_t)argc, sizeof *o.bias_ids);
    o.bias_values = calloc((size_t)argc, sizeof *o.bias_values);
    if (!o.stops || !co.choices || !o.bias_ids || !o.bias_values)
        die(&tool, "out of memory");
    int c;
    const char *arg;
    while ((c = opt_next(&tool, argc, argv, &arg)) != 0) {
        if (c == O_TEMP || c == O_TOPK || c == O_TOPP || c == O_SEED || (c >= O_SAMPLER && c <= O_FSD_RANDOM_STEPS)) {
            sampling_opt(&so, c, arg);
            continue;
        }
        if (c >= O_GRAMMAR && c <= O_CHOICE) {
            constraint_opt(&co, c, arg);
            continue;
        }
        switch (c) {
        case O_MODEL: o.model = arg; break;
        case O_PROMPT: o.prompt = arg; break;
        case O_NPREDICT: o.n_predict = (int)opt_long(&tool, "n-predict", arg, 0, 1 << 24); o.n_given = 1; break;
        case O_STOP: o.stops[o.n_stops++] = arg; break;
        case O_LOGIT_BIAS: logit_bias_opt(&o, arg); break;
        case O_MIN_TOKENS: o.min_tokens = (int)opt_long(&tool, "min-tokens", arg, 0, 1 << 24); break;
        case O_IGNORE_EOS: o.ignore_eos = 1; break;
        case O_INCLUDE_STOP: o.include_stop = 1; break;
        case O_STOP_TOKEN_ID:
            if (o.n_stop_ids == IFLOW_MAX_STOP_IDS)
                die_usage(&tool, "at most %d --stop-token-id", IFLOW_MAX_STOP_IDS);
            o.stop_ids[o.n_stop_ids++] = (int32_t)opt_long(&tool, "stop-token-id", arg, 0, INT32_MAX);
            break;
        case O_THREADS: o.threads = (int)opt_long(&tool, "threads", arg, 1, 1024); break;
        case O_CTX: o.n_ctx = (int)opt_long(&tool, "ctx-size", arg, 1, 1 << 24); break;
        case O_ECHO: o.echo = 1; break;
        case O_JSON: o.json = 1; break;
        case O_TOKENIZE: o.tokenize = 1; break;
        case O_EMBED: o.embed = 1; break;
        case O_TRANSLATE: o.translate = 1; break;
        case O_DECODER_PREFIX: o.decoder_prefix = arg; break;
        case O_SOURCE_PREFIX: o.source_prefix = arg; break;
        case O_CHAT: o.chat = 1; break;
        case O_SYSTEM: o.system = arg; break;
        case O_CHAT_TEMPLATE: o.chat_template = arg; break;
        case O_GRAMMAR_IN_REASONING: o.grammar_in_reasoning = 1; break;
        case O_REASONING_PARSER:
            if (strcmp(arg, "auto") == 0)
                o.reasoning_parser = -1;
            else if (strcmp(arg, "none") == 0)
                o.reasoning_parser = 0;
            else if (strcmp(arg, "think") == 0 || strcmp(arg, "deepseek_r1") == 0 || strcmp(arg, "qwen3") == 0)
                o.reasoning_parser = 1;
            else
                die_usage(&tool, "--reasoning-parser must be auto, think, deepseek_r1, qwen3 or none, not '%s'", arg);
            break;
        case O_TOOL_PARSER:
            if (strcmp(arg, "auto") != 0 && (o.tool_parser = iflow_tool_format_from_name(arg)) < 0)
                die_usage(&tool, "--tool-parser must be auto, hermes, llama3_json, mistral, granite, pythonic or "
                                 "none, not '%s'",
                          arg);
            break;
        case O_BOS: o.bos = 1; break;
        case O_PARSE_SPECIAL: o.parse_special = 1; break;
        case O_VERBOSE: o.verbose = 1; break;
        case OPT_PROGRESS: o.progress = PROGRESS_ON; break;
        case OPT_NO_PROGRESS: o.progress = PROGRESS_OFF; break;
        case O_DEVICE: o.dev.device = arg; break;
        case O_GPU_LAYERS: o.dev.gpu_layers = (int)opt_long(&tool, "gpu-layers", arg, 0, 1 << 20); break;
        case O_GPU_GRAPHS: o.dev.gpu_graphs = IFLOW_GRAPHS_ALL; break;
        case O_NO_GPU_GRAPHS: o.dev.gpu_graphs = IFLOW_GRAPHS_OFF; break;
        case O_LIST_DEVICES: o.list_devices = 1; break;
        case O_PLAN: o.dev.plan = arg; break;
        case O_COMM:
            devices_check_comm(&tool, arg);
            o.comm = arg;
            break;
        case O_ACTIVATIONS: devices_set_activations(&tool, arg); break;
        case O_BATCH: o.batch = 1; break;
        case O_PARALLEL: o.parallel = (int)opt_long(&tool, "parallel", arg, 1, IFLOW_MAX_STEP); break;
        case O_ORDERED: o.ordered = 1; break;
        case O_KV_TYPE:
            if ((o.kv_type = ifk_kv_type_from_name(arg)) < 0)
                die_usage(&tool, "--kv-type must be f32, f16 or q8, not '%s'", arg);
            break;
        case O_NO_PREFIX_CACHE: o.no_prefix_cache = 1; break;
        case O_LOGPROBS: o.logprobs = 1 + (int)opt_long(&tool, "logprobs", arg, 0, IFLOW_MAX_TOP_LOGPROBS); break;
        case O_PROMPT_LOGPROBS:
            o.prompt_logprobs = 1 + (int)opt_long(&tool, "prompt-logprobs", arg, 0, IFLOW_MAX_TOP_LOGPROBS);
            break;
        case O_METRICS: o.metrics = arg; break;
        case O_DRY_RUN: o.dry_run = 1; break;
        case O_CONTEXT_SHIFT:
            if ((o.context_shift = iflow_shift_from_name(arg)) < 0)
                die_usage(&tool, "--context-shift must be none, rope or recompute, not '%s'", arg);
            break;
        case O_BEAMS: o.beams = (int)opt_long(&tool, "beams", arg, 1, IFLOW_MAX_BEAMS); break;
        case O_LENGTH_PENALTY: o.length_penalty = (float)opt_double(&tool, "length-penalty", arg, -100, 100); lp_given = 1; break;
        case O_DRAFT: o.draft = arg; break;
        case O_LORA: cmd_lora_add(&tool, &o.loras, arg, 0); break;
        case O_LORA_SCALED: cmd_lora_add(&tool, &o.loras, arg, 1); break;
        case O_LORA_MODULE: cmd_lora_module_add(&tool, &o.loras, arg); break;
        case O_DRAFT_N: o.draft_n = (int)opt_long(&tool, "draft-n", arg, 1, IFLOW_MAX_DRAFT); break;
        case O_DRAFT_TOP_K: o.draft_top_k = (int)opt_long(&tool, "draft-top-k", arg, 0, 1 << 24); break;
        case O_DRAFT_TOP_P: o.draft_top_p = (float)opt_double(&tool, "draft-top-p", arg, 0, 1); break;
        case O_KEEP:
            o.keep = (int)opt_long(&tool, "keep", arg, -1, 1 << 24);
            keep_given = 1;
            break;
        }
    }
    if (o.context_shift < 0) /* --keep alone asks for a shift */
        o.context_shift = keep_given ? IFLOW_SHIFT_ROPE : IFLOW_SHIFT_NONE;
    if (iflow_sampler_params_set_all(&o.sp, so.name, so.value, so.n) < 0)
        die_usage(&tool, "%s", iflow_errmsg());
    for (int i = 0; i < o.n_stops; i++)
        if (!o.stops[i][0])
            die_usage(&tool, "--stop needs a non-empty string");
    o.dev.threads = o.threads;
    o.dev.n_ctx = o.n_ctx;
    o.dev.verbose = o.verbose;
    if (o.list_devices) {
        devices_list(&tool, o.json);
        opts_free(&o, &co);
        return 0;
    }
    if (opt_index() < argc)
        die_usage(&tool, "unexpected operand '%s'", argv[opt_index()]);
    if (!o.model)
        die_usage(&tool, "no model given (-m FILE)");
    if (lp_given && !o.beams)
        die_usage(&tool, "--length-penalty goes with --beams");
    if (o.beams && o.batch)
        die_usage(&tool, "--beams does not go with --batch: give \"beams\" in a request");
    if (o.beams && o.draft)
        die_usage(&tool, "--beams does not go with --draft: a draft proposes one sequence, beam search keeps several");
    if ((o.n_bias || o.min_tokens || o.ignore_eos || o.n_stop_ids) && (o.beams || o.embed || o.translate))
        die_usage(&tool, "--logit-bias, --min-tokens, --ignore-eos and --stop-token-id go with sampling, not with --%s",
                  o.beams ? "beams" : o.embed ? "embed" : "translate");
    if (o.include_stop && (!o.n_stops || o.beams) && !o.batch)
        die_usage(&tool, "--include-stop goes with --stop (and not with --beams)");
    if (o.n_bias > IFLOW_MAX_BIAS)
        die_usage(&tool, "at most %d --logit-bias", IFLOW_MAX_BIAS);
    if (o.min_tokens > o.n_predict && !o.batch)
        die_usage(&tool, "--min-tokens %d is more than -n %d", o.min_tokens, o.n_predict);
    if ((o.logprobs || o.prompt_logprobs) && (o.beams || (!o.json && !o.batch)))
        die_usage(&tool, "--%s goes with --json or --batch, and not with --beams",
                  o.logprobs ? "logprobs" : "prompt-logprobs");
    if (o.beams && o.context_shift != IFLOW_SHIFT_NONE)
        die_usage(&tool, "--beams does not go with a context shift (--context-shift, --keep): beams end at the context");
    if ((o.draft_n != 5 || o.draft_top_k || o.draft_top_p) && !o.draft)
        die_usage(&tool, "--draft-n, --draft-top-k and --draft-top-p go with --draft");
    if ((o.parallel || o.metrics) && !o.batch && !o.dry_run)
        die_usage(&tool, "--parallel and --metrics go with --batch");
    if (o.ordered && !o.batch)
        die_usage(&tool, "--ordered goes with --batch");
    if (o.embed && (o.dry_run || o.tokenize || o.beams || o.draft || o.n_stops || o.json || o.echo || o.parallel ||
                    o.metrics))
        die_usage(&tool, "--embed goes with none of --dry-run, --tokenize, --beams, --draft, --stop, --json, --echo, "
                         "--parallel, --metrics");
    if (o.embed && o.batch && o.prompt)
        die_usage(&tool, "--embed --batch reads OpenAI batch lines from standard input; -p does not go with it");
    if (o.loras.n && (o.embed || o.translate || o.tokenize || o.list_devices))
        die_usage(&tool, "--lora applies to generation, not to --%s",
                  o.embed ? "embed" : o.translate ? "translate" : o.tokenize ? "tokenize" : "list-devices");
    if (o.loras.n_modules && !o.batch)
        die_usage(&tool, "--lora-module names adapters for --batch's requests (\"lora\": NAME); --lora applies one "
                         "to every prompt");
    if ((o.kv_type || o.no_prefix_cache) && (o.embed || o.translate))
        die_usage(&tool, "--%s goes with generation, not with --%s", o.kv_type ? "kv-type" : "no-prefix-cache",
                  o.embed ? "embed" : "translate");
    if (o.system && !o.chat)
        die_usage(&tool, "--system goes with --chat");
    if (o.chat && (o.batch || o.dry_run || o.tokenize || o.embed || o.translate))
        die_usage(&tool, "--chat goes with none of --batch (give \"messages\" in a request), --dry-run, --tokenize, "
                         "--embed, --translate");
    if (o.chat_template && !o.chat && !o.batch)
        die_usage(&tool, "--chat-template goes with --chat or --batch");
    if (o.tool_parser >= 0 && !o.batch)
        die_usage(&tool, "--tool-parser goes with --batch (its requests give \"tools\")");
    if (o.reasoning_parser >= 0 && !o.batch)
        die_usage(&tool, "--reasoning-parser goes with --batch (its requests' \"messages\")");
    if (o.grammar_in_reasoning && !o.batch)
        die_usage(&tool, "--grammar-in-reasoning goes with --batch (its requests' \"messages\")");
    if (co.id && (o.beams || o.embed || o.translate || o.tokenize))
        die_usage(&tool, "a constraint (--grammar, --json-schema, --regex, --choice) goes with none of --beams, "
                         "--embed, --translate, --tokenize");
    if ((o.decoder_prefix || o.source_prefix) && !o.translate)
        die_usage(&tool, "--%s goes with --translate", o.decoder_prefix ? "decoder-prefix" : "source-prefix");
    if (o.translate && (o.embed || o.batch || o.dry_run || o.tokenize || o.draft || o.n_stops || o.echo || so.n ||
                        o.context_shift != IFLOW_SHIFT_NONE))
        die_usage(&tool, "--translate goes with none of --embed, --batch, --dry-run, --tokenize, --draft, --stop, --echo, "
                         "a context shift or sampling options (it decodes greedily, or with --beams)");
    if (o.translate) {
        translate_opts to = {.model = o.model, .text = o.prompt, .prefix = o.decoder_prefix, .src_prefix = o.source_prefix,
                             .max_new = o.n_given ? o.n_predict : -1, .beams = o.beams,
                             .length_penalty = o.length_penalty, .n_ctx = o.n_ctx, .threads = o.threads,
                             .json = o.json, .verbose = o.verbose, .dev = o.dev};
        if (strcmp(o.model, "-") == 0 && !o.prompt)
            die_usage(&tool, "the model comes from standard input, so the text must come from -p");
        opts_free(&o, &co);
        return translate_run(&tool, &to);
    }
    if (o.embed) {
        embed_opts eo = {.model = o.model, .text = o.prompt, .n_ctx = o.n_ctx, .threads = o.threads,
                         .verbose = o.verbose, .batch = o.batch, .dev = o.dev};
        if (strcmp(o.model, "-") == 0 && !o.prompt)
            die_usage(&tool, "the model comes from standard input, so the text must come from -p");
        opts_free(&o, &co);
        return embed_run(&tool, &eo);
    }
    o.grammar = constraint_grammar(&co, o.grammar_opt, sizeof o.grammar_opt);
    int rc = o.tokenize ? tokenize(&o) : o.batch || o.dry_run ? run_batch(&o) : run(&o);
    iflow_grammar_close(o.grammar);
    opts_free(&o, &co);
    return rc;
}
