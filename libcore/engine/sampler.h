/*
 * sampler.h -- choosing the next token from logits: a chain of logit processors (logits.h)
 * with the state some of them keep (recent tokens, mirostat's mu, a seeded generator).
 *
 * Contract
 *   One sampler serves one sequence: open it with parameters, call iflow_sampler_accept() for
 *   every token of the sequence (the prompt's, then each generated one that is kept), and
 *   iflow_sampler_sample() for the next token; iflow_sampler_reset() starts a new sequence (the
 *   generator runs on). The sampler owns its scratch ([n_vocab] candidates and the accepted
 *   tokens); logits are read only. Not thread-safe: one sampler per request.
 *
 *   Every field of iflow_sampler_params is "off" or its default at zero, so a zeroed struct is
 *   greedy decoding, and callers that zero the fields they do not know keep their behaviour.
 *
 *   The chain, by kind:
 *     chain (0)    penalties -> top-k -> tail-free -> typical -> top-p -> min-p -> temperature ->
 *                  draw (llama.cpp's order: the cuts see the model's own distribution and the
 *                  temperature reshapes what survives them). Each stage is skipped when off.
 *                  temp 0: penalties -> greedy.
 *     greedy       penalties -> the largest logit (the lowest id among equal maxima).
 *     mirostat     penalties -> temperature -> Mirostat v1 (m = 100); temp 0: greedy.
 *     mirostat2    penalties -> temperature -> Mirostat v2; temp 0: greedy.
 *     fsd          penalties -> FSD (logits.h): the best-scoring of the fsd_k most likely tokens;
 *                  deterministic, temperature is not used.
 *     rfsd         randomized FSD: as fsd, but for the first fsd_random_steps samples (0: every
 *                  one) the token is drawn from the FSD scores clipped at 0 (the Inferflow paper:
 *                  "select between FSD and sampling in the first T steps").
 *   Penalties see the last repeat_last_n accepted tokens (-1: all of them), FSD's n-gram anti-LM
 *   all accepted tokens. The random stages take one number from a xoshiro256** generator seeded
 *   by `seed` through splitmix64, so one seed gives one sequence on every machine and for every
 *   thread count.
 *
 *   Names: iflow_sampler_params_set() sets a field from text, by the names of the table in
 *   sampler.c (request fields "temperature", "top_k", "min_p", ...; the command line's
 *   "--temp", "--top-k", "--min-p", ... are the same fields: '-' and '_' are alike and leading
 *   dashes are ignored). "sampler" (or "--sampler") NAME is a preset: chain, greedy, top-k,
 *   top-p, min-p, typical, tfs, mirostat, mirostat2, fsd, rfsd; the names of a cut keep that
 *   cut alone (the others off; its value is set to a default when it is off) and fields set
 *   after it still apply, so iflow_sampler_params_set_all() applies "sampler" first.
 */
#ifndef IFLOW_SAMPLER_H
#define IFLOW_SAMPLER_H

#include <stdint.h>

#include "include/iflow.h"

/* IFLOW_SAMPLER_* and iflow_sampler_params (every field off or its default at zero) are the
 * public header's: include/iflow.h. */

typedef struct iflow_sampler iflow_sampler;

/* iflow-run's defaults: the chain with temp 0.8, top-k 40, top-p 0.95, the rest off. */
void iflow_sampler_params_default(iflow_sampler_params *p);
/* Set one field from text. IFLOW_EINVAL for an unknown name or a bad value, with a message
 * that names it as given ("invalid value 'x' for --min-p (a number from 0 to 1)"). */
int iflow_sampler_params_set(iflow_sampler_params *p, const char *name, const char *value);
/* 1 if name is a field of the table (or "sampler"), else 0. */
int iflow_sampler_param_known(const char *name);
/* names, values: [n]; "sampler" first wherever it is, then the rest in order. */
int iflow_sampler_params_set_all(iflow_sampler_params *p, const char *const *names, const char *const *values, int n);
/* The preset and kind names ("chain", "greedy", ...), and a kind's name. */
const char *iflow_sampler_kind_name(int kind);

int  iflow_sampler_open(iflow_sampler **out, const iflow_sampler_params *p, int n_vocab);
void iflow_sampler_close(iflow_sampler *s);
/* Forget the accepted tokens and mirostat's state; the generator runs on. */
void iflow_sampler_reset(iflow_sampler *s);
/* Record a token of the sequence (IFLOW_ERANGE outside the vocabulary, IFLOW_ENOMEM). */
int iflow_sampler_accept(iflow_sampler *s, int32_t token);
int32_t iflow_sampler_sample(iflow_sampler *s, const float *logits);
/* Add bias to token id's logit before every other step (penalties, cuts, greedy: llama.cpp's
 * logit-bias sampler, OpenAI's logit_bias) while fewer than `until` tokens have been accepted
 * since the last reset (until < 0: always): -INFINITY bans the token; min_tokens bans the
 * end-of-sequence tokens until the prompt's count plus min_tokens. Biases of one token add up;
 * they stay through iflow_sampler_reset() until iflow_sampler_clear_bias(). IFLOW_ERANGE for
 * an id outside the vocabulary, IFLOW_EINVAL for NaN or +inf. */
int  iflow_sampler_add_bias(iflow_sampler *s, int32_t id, float bias, int until);
/* Only tokens ids [n] may be drawn from now on (vLLM's allowed_token_ids): every other logit is
 * -inf after the biases; n 0 lifts the restriction. Stays through reset(). IFLOW_ERANGE for an
 * id outside the vocabulary. */
int  iflow_sampler_allow(iflow_sampler *s, const int32_t *ids, int n);
/* Ban a sequence of tokens ids [n] (one of vLLM's bad_words, tokenized): its last token is -inf
 * wherever the tokens accepted since this call (or the last reset, if later) end with its first
 * n - 1; a sequence of one token is banned always. Stays through reset(). */
int  iflow_sampler_ban_sequence(iflow_sampler *s, const int32_t *ids, int n);
/* Drop every bias, the allowed set and the banned sequences. */
void iflow_sampler_clear_bias(iflow_sampler *s);
/* 1 when the choice is always the argmax of the raw logits (greedy, no penalties, no bias, no
 * allowed set or banned sequence): the caller may then find it on the device that computed the
 * logits and skip the sampler. */
int iflow_sampler_is_greedy(const iflow_sampler *s);
/* ---- for speculative decoding ----
 * 1 when the choice is a draw from a fixed distribution of the logits (the chain, greedy;
 * not mirostat, whose cut moves with what it draws, nor FSD / rFSD). */
int iflow_sampler_has_dist(const iflow_sampler *s);
/* probs [n_vocab] = the distribution the next draw would come from: the chain's penalties,
 * cuts and temperature applied, 0 for every token cut (greedy: 1 on the choice). Draws
 * nothing. IFLOW_EUNSUPPORTED unless iflow_sampler_has_dist(). */
int iflow_sampler_dist(iflow_sampler *s, const float *logits, float *probs);
/* Uniform in [0, 1) from s's generator. */
double iflow_sampler_uniform(iflow_sampler *s);
/* A token drawn from probs [n_vocab] (>= 0, not all 0; need not sum to 1) with s's generator. */
int32_t iflow_sampler_draw(iflow_sampler *s, const float *probs);
/* Tokens accepted so far (since the last reset); forget those after the first n. */
int  iflow_sampler_n_accepted(const iflow_sampler *s);
void iflow_sampler_truncate(iflow_sampler *s, int n);

/* Speculative sampling's verdict on a draft token d drawn from q (Leviathan et al., "Fast
 * inference from transformers via speculative decoding", 2023; Chen et al. 2023): accept d with
 * probability min(1, p[d] / q[d]) (u_accept decides), else draw from the residual
 * max(0, p - q), normalized (u_draw decides). The token returned is distributed as p whatever
 * q is; *accepted says whether it is d. p, q: [n] (need not sum to 1: each is normalized).
 * top_k > 0 or top_p > 0 is the flexible rule instead: d is accepted when it is among the
 * top_k most probable tokens under p (ties by lower id) and inside p's nucleus of mass top_p
 * (the tokens more probable than d hold less than top_p), whichever are given; else p's most
 * probable token is taken: faster, no longer distributed as p. */
int32_t iflow_spec_verify(const float *p, const float *q, int n, int32_t d, double u_accept, double u_draw, int top_k,
                          float top_p, int *accepted);

/* The chain as it runs, one line ("penalties(repeat 1.1, last 64) top-k 40 ... draw"). */
const char *iflow_sampler_describe(const iflow_sampler *s, char *buf, int cap);
/* Index of the largest value (the first one on ties). */
int32_t iflow_argmax(const float *x, int n);

#endif
