/*
 * logits.h -- the logit processors that sampler.c chains: each one changes the logits of a
 * candidate list, cuts the list, or picks one token from it.
 *
 * Contract
 *   A candidate list is n (id, logit, p) triples in a buffer the caller owns. iflow_cands_init()
 *   fills it with the whole vocabulary in id order (NaN logits become -inf). "Sorted" means by
 *   falling logit, ties by rising id: every order here is total, so a run is the same on every
 *   machine. A processor may leave p stale and the list unsorted; one that needs probabilities
 *   calls iflow_cands_softmax(), which sorts (when the list is not sorted) and sets p to the
 *   softmax of the logits of what is left. The cutting processors keep at least one candidate.
 *   The random pickers take u, uniform in [0, 1), from the caller's generator.
 *
 *   Definitions (p: softmax probabilities of the list as it reaches the processor):
 *     penalize     llama.cpp's penalties over a window of recent tokens: a token that occurs c > 0
 *                  times has its logit divided by `repeat` when positive, multiplied when not,
 *                  then lowered by c * freq + presence (OpenAI's frequency and presence penalties).
 *                  Meant first in a chain, on the list in id order (found by index; else searched).
 *     top_k        keep the k largest logits (k <= 0 or k >= n: all); partial selection, O(n log k).
 *     tail_free    tail-free sampling (Bricken 2019): d2[i] = |p[i] - 2 p[i+1] + p[i+2]| over the
 *                  sorted list, normalized to sum 1 (uniform when it sums to ~0); keep tokens
 *                  0..i where i is the first index at which the running sum of d2 exceeds z
 *                  (Bricken's reference keeps the token before each cut; lists of < 3 unchanged).
 *     typical      locally typical sampling (Meister et al. 2022): order by |-ln p - H| rising
 *                  (H: the entropy of p), keep the smallest prefix whose mass reaches `mass`.
 *     top_p        keep the smallest prefix of the sorted list whose mass reaches p (nucleus).
 *     min_p        keep the tokens with p >= min_p * max p.
 *     temperature  divide the logits by t; t <= 0 keeps only the largest (greedy).
 *     greedy       the first of the largest logits (lowest id among equal maxima).
 *     draw         the token at u in the cumulative distribution of p.
 *     mirostat     Mirostat v1 (Basu et al. 2021, as llama.cpp): estimate the Zipf exponent s
 *                  from the top m probabilities, k = ((e * 2^mu) / (1 - N^-e))^(1/s) with
 *                  e = s - 1 and N the vocabulary size, keep the top k, draw; then mu -= eta *
 *                  (surprise - tau), surprise = -log2 p of the drawn token.
 *     mirostat2    Mirostat v2: keep the sorted prefix whose surprise -log2 p <= mu (at least
 *                  one), renormalize, draw, update mu as v1.
 *     fsd          frustratingly simple decoding: see iflow_cands_fsd below.
 */
#ifndef IFLOW_LOGITS_H
#define IFLOW_LOGITS_H

#include <stdint.h>

typedef struct {
    int32_t id;
    float logit;
    float p;
} iflow_cand;

typedef struct {
    iflow_cand *c;  /* [n], the caller's buffer */
    int n;
    int sorted;     /* 1: by falling logit, ties by rising id */
} iflow_cands;

/* The vocabulary in id order; buf: [n_vocab]; logits: [n_vocab]. */
void iflow_cands_init(iflow_cands *cs, iflow_cand *buf, const float *logits, int n_vocab);
void iflow_cands_sort(iflow_cands *cs);
void iflow_cands_softmax(iflow_cands *cs);

/* last: [n_last] the window of recent tokens (repetitions count). repeat 1 or 0, freq 0 and
 * presence 0 do nothing. */
void iflow_cands_penalize(iflow_cands *cs, const int32_t *last, int n_last, float repeat, float freq,
                          float presence);
void iflow_cands_top_k(iflow_cands *cs, int k);
void iflow_cands_tail_free(iflow_cands *cs, float z);        /* z <= 0 or >= 1: off */
void iflow_cands_typical(iflow_cands *cs, float mass);       /* mass <= 0 or >= 1: off */
void iflow_cands_top_p(iflow_cands *cs, float p);            /* p <= 0 or >= 1: off */
void iflow_cands_min_p(iflow_cands *cs, float min_p);        /* min_p <= 0: off */
void iflow_cands_temperature(iflow_cands *cs, float t);      /* t == 1: nothing */

int32_t iflow_cands_greedy(iflow_cands *cs);
int32_t iflow_cands_draw(iflow_cands *cs, double u);
/* mu: the controller's state (start at 2 tau); m: how many probabilities estimate s (llama.cpp: 100). */
int32_t iflow_cands_mirostat(iflow_cands *cs, float tau, float eta, int m, int n_vocab, float *mu, double u);
int32_t iflow_cands_mirostat2(iflow_cands *cs, float tau, float eta, float *mu, double u);

/*
 * FSD, "A Frustratingly Simple Decoding Method for Neural Text Generation" (Yang et al. 2023,
 * cited by the Inferflow paper): score(y) = (1 - alpha) P_LM(y) - alpha P_anti(y) over the k
 * tokens most likely under the model, P_LM the softmax of the whole list. The anti-LM is the
 * n-gram model of the prefix itself (prompt and generated tokens), smoothed as the authors'
 * reference code (github.com/LHRYANG/FSD, ngram_model/fsd.py) does:
 *     for i = n-1 down to 0 (context: the last i tokens of the prefix):
 *         c = how often y followed that context in the prefix, t = how often anything did
 *         if c > 0: P_anti += r * (i > 0 ? beta * c / (t + 1) : c / t);  r *= 1 - beta
 *     (r starts at 1; a prefix shorter than n-1 tokens gives P_anti = 0)
 * The reference's stop-word coefficient (a per-language word list) is not applied.
 */
/* hist: [n_hist] the prefix. */
float iflow_antilm_prob(const int32_t *hist, int n_hist, int n, float beta, int32_t y);
/* Keep the k most likely candidates (less those at -inf, banned, while another is left) and set
 * p to their FSD score (it may be negative); the list is then ordered by falling score, ties by
 * rising id, so c[0] is FSD's choice. */
void iflow_cands_fsd(iflow_cands *cs, const int32_t *hist, int n_hist, int k, float alpha, int n, float beta);
/* Randomized FSD's draw: token at u in the distribution proportional to max(score, 0) of a list
 * that iflow_cands_fsd() scored; c[0] when no score is positive. */
int32_t iflow_cands_draw_scores(iflow_cands *cs, double u);

#endif
