/* translate.h -- iflow-run --translate: one translation per input line, from an encoder-decoder
 * model (Marian / opus-mt, M2M100, T5). */
#ifndef IFLOW_CMD_TRANSLATE_H
#define IFLOW_CMD_TRANSLATE_H

#include "cmd/devices.h"
#include "cmd/opt.h"

typedef struct {
    const char *model;     /* -m: a shard, or a source converted on the fly */
    const char *text;      /* -p: one input; NULL: one input per line of standard input */
    const char *prefix;    /* --decoder-prefix: forced target tokens after decoder_start, or NULL */
    int max_new;           /* -n: target tokens at most; < 0: as many as the model's positions */
    int beams;             /* --beams: 0 or 1 greedy, more a beam search */
    float length_penalty;  /* --length-penalty, with beams */
    int n_ctx, threads;    /* 0: the model's positions (max_seq), all cores */
    int json, verbose;
    device_opts dev;
} translate_opts;

/* Translate every input and print one line per input on standard output: the translation's
 * text, or with json one JSON object
 *   {"schema": 1, "index": I, "source": TEXT, "source_ids": [...], "truncated": false,
 *    "ids": [...], "translation": TEXT, "stop": "eos" | "length" | "context"}
 * (with beams, also "beams": each one's ids, translation, logprob, score and stop, best first).
 * The source is tokenized by the model's tokenizer with its template (T5 and Marian append
 * </s>), the translation decoded and --decoder-prefix encoded by its target side's
 * (iflow_model_target_tokenizer: Marian's target.spm); a source longer than the context keeps
 * its first tokens and its last and says "truncated": true. The model
 * must be an encoder-decoder (else a usage error naming its layout). Failures die() naming
 * what failed. Returns the exit status. */
int translate_run(const iflow_tool *tool, const translate_opts *o);

#endif
