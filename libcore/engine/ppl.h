/*
 * ppl.h -- perplexity of a model over a token sequence, under a stated protocol.
 *
 * Protocols (the text's token ids x_1..x_n carry no BOS; c is the context length):
 *   IFLOW_PPL_WINDOWS   (iflow's default) non-overlapping windows of c-1 text tokens, each fed
 *                       after a BOS from an empty cache; every position is scored, so each
 *                       x_i is predicted exactly once (x_1 from BOS alone). The last window may
 *                       be shorter.
 *   IFLOW_PPL_LLAMACPP  llama.cpp's llama-perplexity: the sequence [BOS] x_1..x_n is cut into
 *                       floor((n+1)/c) chunks of c tokens; each chunk's first token is replaced
 *                       by BOS, and only the second half is scored (logits at c/2 .. c-2).
 * Both match ../shared/golden (see its README) to float precision.
 *
 * With a base context (o->base, another model with the same vocabulary, e.g. the unquantized
 * one), every window is also run through the base, and each scored position adds
 * KL(P_base || P_model) = sum_v p_base(v) (log p_base(v) - log p_model(v)), whether the two
 * argmax tokens agree, and the base's own negative log-likelihood (for delta perplexity).
 *
 * Contract
 *   iflow_ppl_run() evaluates with the given context (whose n_ctx must be >= c), summing in
 *   double precision. If cb is non-NULL it is called once per scored position. Nothing is
 *   printed; nothing is allocated beyond one window's logits (two with a base).
 */
#ifndef IFLOW_PPL_H
#define IFLOW_PPL_H

#include <stddef.h>
#include <stdint.h>

#include "include/iflow.h"
#include "model.h"

/* IFLOW_PPL_*, iflow_ppl_opts, iflow_ppl_result and iflow_ppl_cb are the public header's
 * (include/iflow.h). A callback's position is the index (from 0) of the predicting token in
 * [BOS] x_1..x_n terms of the text, i.e. the prediction of x_{position+1}. */

int iflow_ppl_run(iflow_ctx *ctx, const int32_t *text_ids, size_t n, int32_t bos, const iflow_ppl_opts *o,
                  iflow_ppl_result *res, iflow_ppl_cb cb, void *user);

/* The windows iflow_ppl_run scores for n text tokens under o (for progress reports). */
long iflow_ppl_windows(size_t n, const iflow_ppl_opts *o);

/* log_softmax(logits)[id] in double precision. */
double iflow_logprob(const float *logits, int n_vocab, int32_t id);
/* log(sum(exp(x[0..n)))) in double, from the largest (log_softmax(x)[i] = x[i] minus it). */
double iflow_logsumexp(const float *x, int n);

#endif
