/* ppl.c -- perplexity protocols. See ppl.h. */
#include "ppl.h"
#include "error.h"

#include <math.h>
#include <stdlib.h>

double iflow_logprob(const float *logits, int n_vocab, int32_t id)
{
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > mx)
            mx = logits[i];
    double sum = 0;
    for (int i = 0; i < n_vocab; i++)
        sum += exp((double)logits[i] - mx);
    return (double)logits[id] - mx - log(sum);
}

/* Evaluate one window `in[0..len)` from an empty cache and score positions [from, len-1):
 * position j predicts in[j+1]. base = global position of in[0]. */
static int score_window(iflow_ctx *ctx, const int32_t *in, int len, int from, long base, long window, float *logits,
                        int n_vocab, iflow_ppl_result *res, iflow_ppl_cb cb, void *user)
{
    iflow_ctx_reset(ctx);
    int rc = iflow_ctx_eval(ctx, in, len, logits, 1);
    if (rc < 0)
        return rc;
    for (int j = from; j < len - 1; j++) {
        double lp = iflow_logprob(logits + (size_t)j * n_vocab, n_vocab, in[j + 1]);
        res->nll_sum -= lp;
        res->n_scored++;
        if (cb)
            cb(user, base + j, window, j, in[j], in[j + 1], lp);
    }
    res->n_windows++;
    return 0;
}

int iflow_ppl_run(iflow_ctx *ctx, const int32_t *x, size_t n, int32_t bos, const iflow_ppl_opts *o,
                  iflow_ppl_result *res, iflow_ppl_cb cb, void *user)
{
    int c = o->n_ctx;
    *res = (iflow_ppl_result){0};
    if (c < 2 || c > iflow_ctx_n_ctx(ctx))
        return iflow_seterr(IFLOW_EINVAL, "perplexity context %d must be from 2 to %d", c, iflow_ctx_n_ctx(ctx));
    if (bos < 0)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "the model has no beginning-of-sequence token to start windows with");
    int n_vocab = iflow_ctx_n_vocab(ctx);
    int32_t *in = malloc(sizeof(int32_t) * (size_t)c);
    float *logits = malloc(sizeof(float) * (size_t)c * (size_t)n_vocab);
    int rc = in && logits ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory for a window of %d tokens", c);
    if (rc == 0 && o->protocol == IFLOW_PPL_WINDOWS) {
        size_t step = (size_t)c - 1;
        for (size_t start = 0; start < n && rc == 0; start += step) {
            if (o->max_windows && res->n_windows >= o->max_windows)
                break;
            int len = 1 + (int)(n - start < step ? n - start : step);
            in[0] = bos;
            for (int j = 1; j < len; j++)
                in[j] = x[start + (size_t)j - 1];
            rc = score_window(ctx, in, len, 0, (long)start, res->n_windows, logits, n_vocab, res, cb, user);
        }
    } else if (rc == 0) {
        size_t total = n + 1; /* [BOS] x_1..x_n */
        long chunks = (long)(total / (size_t)c);
        if (o->max_windows && o->max_windows < chunks)
            chunks = o->max_windows;
        for (long k = 0; k < chunks && rc == 0; k++) {
            in[0] = bos;
            for (int j = 1; j < c; j++)
                in[j] = x[(size_t)k * c + (size_t)j - 1]; /* token (k*c + j) of [BOS] x */
            rc = score_window(ctx, in, c, c / 2, k * (long)c, k, logits, n_vocab, res, cb, user);
        }
    }
    free(in);
    free(logits);
    return rc;
}
