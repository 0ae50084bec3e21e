/*
 * sampler.h -- choosing the next token from logits.
 *
 * Contract
 *   temp == 0: greedy (the lowest id among the maxima). Otherwise, in this order (as Hugging
 *   Face transformers does): divide logits by temp; keep the top_k largest (top_k <= 0: all);
 *   keep the smallest prefix of those, by falling probability, whose mass reaches top_p
 *   (top_p >= 1: all); draw from what is left. The generator is a seeded xoshiro256**, so one
 *   seed gives one sequence on every machine. The sampler owns its scratch; logits are read only.
 */
#ifndef IFLOW_SAMPLER_H
#define IFLOW_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temp;
    int top_k;
    float top_p;
    uint64_t seed;
} iflow_sampler_params;

typedef struct iflow_sampler iflow_sampler;

int  iflow_sampler_open(iflow_sampler **out, const iflow_sampler_params *p, int n_vocab);
void iflow_sampler_close(iflow_sampler *s);
int32_t iflow_sampler_sample(iflow_sampler *s, const float *logits);
/* Index of the largest value (the first one on ties). */
int32_t iflow_argmax(const float *x, int n);

#endif
