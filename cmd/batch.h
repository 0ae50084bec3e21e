/*
 * batch.h -- iflow-run --batch: JSON Lines requests in, JSON Lines results out, through the
 * continuous-batching engine (libcore/serving/batch.h).
 *
 * Three threads: a reader parses and tokenizes the next requests, the main thread runs the
 * engine's steps, a writer formats and writes the results, so tokenizing and writing overlap
 * with the compute. The reader stays at most a bounded number of requests ahead, so memory is
 * flat however long the input is. Request fields, results and metrics: man/iflow-run.1.
 */
#ifndef IFLOW_CMD_BATCH_H
#define IFLOW_CMD_BATCH_H

#include "cmd/opt.h"
#include "libcore/engine/model.h"
#include "libcore/engine/sampler.h"

typedef struct {
    int parallel, n_ctx, kv_type, threads, max_tokens, verbose, json;
    int no_prefix_cache;         /* --no-prefix-cache */
    int ordered;                 /* --ordered: results in the input's order */
    int context_shift, keep;     /* defaults for requests that do not say */
    int logprobs, prompt_logprobs; /* the same (request.h: 0 none, 1 + N) */
    int progress;                /* PROGRESS_AUTO, _ON or _OFF (cmd/progress.h)     */
    iflow_sampler_params sp;     /* defaults for requests that do not say */
    const char *metrics;         /* --metrics FILE, or NULL */
    const iflow_model *draft;    /* --draft (placed), or NULL */
    int draft_n, draft_top_k;
    float draft_top_p;
    int gpu_graphs;              /* IFLOW_GRAPHS_* (--gpu-graphs, --no-gpu-graphs) */
    const char *model;           /* for messages */
    const struct iflow_chat *chat; /* the chat template for requests with "messages", or NULL */
    const char *chat_error;      /* then why there is none (said to such a request) */
    int tool_format;             /* IFLOW_TOOLS_*: how replies write tool calls (--tool-parser, the template's) */
    int reasoning;               /* chat replies' <think> blocks go to "reasoning_content" (--reasoning-parser) */
    int grammar_in_reasoning;    /* with reasoning: constraints hold from the first token, not after </think> */
    struct iflow_grammar *grammar; /* --grammar, --json-schema, ...: for requests that give none */
    const char *const *adapters; /* [n_adapters] --lora-module's names: the model's adapters 1.. */
    int n_adapters;
    const int32_t *bias_ids;     /* [n_bias] --logit-bias: for requests that give no "logit_bias" */
    const float *bias_values;
    int n_bias;
    int min_tokens, ignore_eos;  /* --min-tokens, --ignore-eos: defaults likewise */
    const int32_t *stop_ids;     /* [n_stop_ids] --stop-token-id: likewise */
    int n_stop_ids;
    int include_stop;            /* --include-stop: likewise */
} batch_opts;

/* Run every request of standard input; returns the exit status (0; 1 when a result could not
 * be written, the output having been closed). */
int batch_run(const iflow_tool *t, iflow_model *m, const batch_opts *o);

/* --dry-run: print the memory plan of --batch with these options, and the largest --parallel
 * that fits the memory of the model's devices. */
int batch_dry_run(const iflow_tool *t, iflow_model *m, const batch_opts *o);

#endif
