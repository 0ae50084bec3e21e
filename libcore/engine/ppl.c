/* ppl.c -- perplexity protocols. See ppl.h. */
#include "ppl.h"
#include "libcore/base/error.h"

#include <math.h>
#include <stdlib.h>

#include "sampler.h"

double iflow_logsumexp(const float *x, int n)
{
    float mx = x[0];
    for (int i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int i = 0; i < n; i++)
        s += exp((double)x[i] - mx);
    return mx + log(s);
}

double iflow_logprob(const float *logits, int n_vocab, int32_t id)
{
    return (double)logits[id] - iflow_logsumexp(logits, n_vocab);
}

/* KL(P_base || P_model) for one position's logits. */
static double kl_divergence(const float *base, const float *model, int n)
{
    double zb = iflow_logsumexp(base, n), zm = iflow_logsumexp(model, n), kl = 0;
    for (int i = 0; i < n; i++) {
        double lb = base[i] - zb;
        kl += exp(lb) * (lb - (model[i] - zm));
    }
    return kl > 0 ? kl : 0; /* rounding can leave a tiny negative for identical models */
}

/* Per-window state: the model's logits and, with a base model, the base's. */
typedef struct {
    iflow_ctx *ctx, *base;
    float *logits, *base_logits;   /* [c][n_vocab] each */
    int n_vocab;
} window_eval;

/* Evaluate one window `in[0..len)` from an empty cache and score positions [from, len-1):
 * position j predicts in[j+1]. pos0 = global position of in[0]. */
static int score_window(window_eval *w, const int32_t *in, int len, int from, long pos0, long window,
                        iflow_ppl_result *res, iflow_ppl_cb cb, void *user)
{
    int rc, V = w->n_vocab;
    iflow_ctx_reset(w->ctx);
    if ((rc = iflow_ctx_eval(w->ctx, in, len, w->logits, 1)) < 0)
        return rc;
    if (w->base) {
        iflow_ctx_reset(w->base);
        if ((rc = iflow_ctx_eval(w->base, in, len, w->base_logits, 1)) < 0)
            return rc;
    }
    for (int j = from; j < len - 1; j++) {
        const float *lm = w->logits + (size_t)j * V;
        double lp = iflow_logprob(lm, V, in[j + 1]);
        res->nll_sum -= lp;
        res->n_scored++;
        if (w->base) {
            const float *lb = w->base_logits + (size_t)j * V;
            double kl = kl_divergence(lb, lm, V);
            res->kld_sum += kl;
            res->kld_max = kl > res->kld_max ? kl : res->kld_max;
            res->base_nll_sum -= iflow_logprob(lb, V, in[j + 1]);
            res->top1_same += iflow_argmax(lb, V) == iflow_argmax(lm, V);
        }
        if (cb)
            cb(user, pos0 + j, window, j, in[j], in[j + 1], lp);
    }
    res->n_windows++;
    return 0;
}

long iflow_ppl_windows(size_t n, const iflow_ppl_opts *o)
{
    long w;
    if (o->n_ctx < 2)
        return 0;
    if (o->protocol == IFLOW_PPL_WINDOWS)
        w = (long)((n + (size_t)o->n_ctx - 2) / ((size_t)o->n_ctx - 1));
    else
        w = (long)((n + 1) / (size_t)o->n_ctx);
    return o->max_windows && o->max_windows < w ? o->max_windows : w;
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
    if (o->base && (iflow_ctx_n_vocab(o->base) != n_vocab || iflow_ctx_n_ctx(o->base) < c))
        return iflow_seterr(IFLOW_EINVAL, "the base model's vocabulary (%d) or context (%d) does not match (%d, %d)",
                            iflow_ctx_n_vocab(o->base), iflow_ctx_n_ctx(o->base), n_vocab, c);
    size_t window_floats = (size_t)c * (size_t)n_vocab;
    window_eval w = {ctx, o->base, malloc(sizeof(float) * window_floats),
                     o->base ? malloc(sizeof(float) * window_floats) : NULL, n_vocab};
    int32_t *in = malloc(sizeof(int32_t) * (size_t)c);
    int rc = in && w.logits && (w.base_logits || !o->base)
                 ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory for a window of %d tokens", c);
    if (rc == 0 && o->protocol == IFLOW_PPL_WINDOWS) {
        size_t step = (size_t)c - 1;
        for (size_t start = 0; start < n && rc == 0; start += step) {
            if (o->max_windows && res->n_windows >= o->max_windows)
                break;
            int len = 1 + (int)(n - start < step ? n - start : step);
            in[0] = bos;
            for (int j = 1; j < len; j++)
                in[j] = x[start + (size_t)j - 1];
            rc = score_window(&w, in, len, 0, (long)start, res->n_windows, res, cb, user);
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
            rc = score_window(&w, in, c, c / 2, k * (long)c, k, res, cb, user);
        }
    }
    free(in);
    free(w.logits);
    free(w.base_logits);
    return rc;
}
