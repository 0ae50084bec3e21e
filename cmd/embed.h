/* embed.h -- iflow-run --embed: one pooled vector per input line, from an encoder model. */
#ifndef IFLOW_CMD_EMBED_H
#define IFLOW_CMD_EMBED_H

#include "cmd/devices.h"
#include "cmd/opt.h"

typedef struct {
    const char *model;     /* -m: a shard, or a source converted on the fly */
    const char *text;      /* -p: one input; NULL: one input per line of standard input */
    int n_ctx, threads;    /* 0: the model's positions (at most IFLOW_MAX_STEP), all cores */
    int verbose;
    int batch;             /* --batch: standard input holds OpenAI batch lines for /v1/embeddings */
    device_opts dev;
} embed_opts;

/* Embed every input and print one JSON object per input on standard output:
 *   {"schema": 1, "index": I, "n_tokens": N, "truncated": false, "embedding": [dim floats]}
 * An input longer than a step (the context, at most IFLOW_MAX_STEP tokens) keeps its first
 * tokens and its last one (the template's closing token, [SEP] for BERT) and says
 * "truncated": true. Failures die() naming what failed. Returns the exit status. */
int embed_run(const iflow_tool *tool, const embed_opts *o);
/* With o->batch each line of standard input is an OpenAI batch line for /v1/embeddings
 * (libcore/serving/request.h), answered on one line in OpenAI's batch output format
 * (cmd/openai.h), in the input's order (--ordered changes nothing); a refused line, or an
 * input longer than a step, gets a 400 reply and the others go on. Blank lines are skipped. */

#endif
