/*
 * beam.h -- beam search: the n most probable continuations, kept side by side (a decoder's, or an
 * encoder-decoder's translations).
 *
 * Contract
 *   iflow_beam_search() runs one prompt with `n_beams` live beams over a paged KV cache
 *   (model.h's iflow_kv). Each step evaluates every live beam's last token in one
 *   iflow_ctx_step (the weights are read once for all beams), extends each beam by its
 *   2 * n_beams most probable tokens, and keeps the n_beams extensions of the highest summed
 *   log-probability. An extension by the end-of-sequence token, among the first n_beams of
 *   the ranking, is a finished hypothesis instead (as Hugging Face's beam search does).
 *   Beams share the blocks of their common prefix: a fork copies only the partly filled block
 *   it would write into (iflow_kv_copy_block), when it writes.
 *   The search ends when n_beams hypotheses have finished (early stopping), when the live
 *   beams reach max_tokens or the context, or when no beam is left. At the last token
 *   max_tokens or the context allows, a model with forced_eos (model.h) extends every beam by
 *   that token alone, with log-probability 0 (transformers' forced_eos_token_id): the
 *   hypotheses end there, finish the limit's (IFLOW_FINISH_EOS where the model would have
 *   picked it anyway), the token counted in their length. The results are the
 *   finished hypotheses and the beams still live, ranked by score = logprob / length^lp
 *   (length: the tokens generated, an ending EOS included; lp = length_penalty, 0: the plain
 *   sum), best first, at most n_beams of them.
 *   Stop strings (stop.h's matching: one may span tokens): an extension whose text completes one
 *   is a finished hypothesis as an EOS is (among the first n_beams of the ranking; it ends with
 *   the token that completed the string, its text cut before the string, finish
 *   IFLOW_FINISH_STOP), and the search goes on among the other beams. Each beam holds back the
 *   tail of its text that may begin a stop string, as the matcher does.
 *   With n_beams = 1 the search is greedy decoding: the argmax at every step (the lowest id
 *   among equal logits).
 *   Errors: IFLOW_EINVAL for bad parameters (an empty stop string) or an empty prompt, IFLOW_ERANGE for a prompt that
 *   fills the context or a token outside the vocabulary, and the engine's errors.
 */
#ifndef IFLOW_BEAM_H
#define IFLOW_BEAM_H

#include <stdint.h>

#include "libcore/engine/model.h"
#include "libcore/engine/seq2seq.h"

#define IFLOW_MAX_BEAMS 32

typedef struct {
    int n_beams;            /* 1 .. IFLOW_MAX_BEAMS                                        */
    int max_tokens;         /* tokens to generate at most (>= 1)                           */
    float length_penalty;   /* score = logprob / length^length_penalty; 1 is HF's default */
    int n_ctx;              /* positions; <= 0: the model's max_seq                         */
    int kv_type;            /* IFK_KV_* (kernels/cpu/kvcache.h)                             */
    int n_threads;          /* <= 0: all cores                                              */
    const char *const *stop; /* [n_stop] stop strings (copied), none empty; NULL when none   */
    int n_stop;
    int adapter;            /* the model's adapter (model.h's iflow_model_add_adapter; 0: none;
                               a decoder's only) */
} iflow_beam_params;

typedef struct {
    int32_t *tokens;        /* [n_tokens] generated (an ending EOS not included)           */
    int n_tokens;
    double logprob;         /* natural log-probability of the tokens (and of the EOS)     */
    double score;           /* logprob / length^length_penalty                            */
    int finish;             /* batch.h's IFLOW_FINISH_EOS, _LENGTH, _STOP or _CONTEXT      */
    int32_t eos;            /* the end-of-sequence token that ended it (IFLOW_FINISH_EOS, or a
                             * limit that forced forced_eos); else -1                        */
    int stop_index;         /* IFLOW_FINISH_STOP: the stop string found (its index); else -1 */
    char *text;             /* the tokens' text after the prompt, NUL-terminated ("" when
                             * the model has no tokenizer); IFLOW_FINISH_STOP: cut before
                             * the stop string                                              */
    size_t text_len;
} iflow_beam;

/* Step by step, for a caller that interleaves a search with other work (iflow-run --batch):
 * open checks the parameters and the prompt and takes the memory; each step runs one forward
 * pass (the prompt first, then every live beam's last token) and returns 1 while there is more
 * to do, 0 when the search has ended, < 0 on failure; take hands over the results as below. */
typedef struct iflow_beam_run iflow_beam_run;
int  iflow_beam_open(iflow_beam_run **out, const iflow_model *m, const int32_t *prompt, int n_prompt,
                     const iflow_beam_params *p);
int  iflow_beam_step(iflow_beam_run *r);
int  iflow_beam_take(iflow_beam_run *r, iflow_beam **out, int *n_out);
void iflow_beam_close(iflow_beam_run *r);

/* The same search for an encoder-decoder (seq2seq.h): src is encoded into s2s (a context of at
 * least 2 n_beams + 1 sequences, owned by the caller, whose max_tgt is the context; p->n_ctx,
 * kv_type and n_threads are not used), and the hypotheses start from decoder_start and the
 * forced prefix; each is a sequence of s2s, copied when it forks. As transformers' beam search
 * with early_stopping=True: the texts are the generated tokens' (they start the text). */
int  iflow_beam_open_s2s(iflow_beam_run **out, const iflow_model *m, iflow_s2s *s2s, const int32_t *src, int n_src,
                         const int32_t *prefix, int n_prefix, const iflow_beam_params *p);

/* The whole search at once. *out: [*n_out] beams, best first (free with iflow_beams_free). */
int  iflow_beam_search(const iflow_model *m, const int32_t *prompt, int n_prompt, const iflow_beam_params *p,
                       iflow_beam **out, int *n_out);
void iflow_beams_free(iflow_beam *b, int n);

#endif
