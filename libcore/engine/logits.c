/* logits.c -- see logits.h. */
#include "logits.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void iflow_cands_init(iflow_cands *cs, iflow_cand *buf, const float *logits, int n_vocab)
{
    for (int i = 0; i < n_vocab; i++)
        buf[i] = (iflow_cand){i, isnan(logits[i]) ? -INFINITY : logits[i], 0};
    *cs = (iflow_cands){buf, n_vocab, 0};
}

/* a comes before b: larger logit, then smaller id. */
static int before(const iflow_cand *a, const iflow_cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int by_logit(const void *a, const void *b)
{
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

void iflow_cands_sort(iflow_cands *cs)
{
    if (!cs->sorted)
        qsort(cs->c, (size_t)cs->n, sizeof *cs->c, by_logit);
    cs->sorted = 1;
}

void iflow_cands_softmax(iflow_cands *cs)
{
    iflow_cands_sort(cs);
    float mx = cs->c[0].logit;
    if (mx == -INFINITY) { /* nothing is possible: every candidate alike */
        for (int i = 0; i < cs->n; i++)
            cs->c[i].p = 1.0f / (float)cs->n;
        return;
    }
    double sum = 0;
    for (int i = 0; i < cs->n; i++)
        sum += cs->c[i].p = expf(cs->c[i].logit - mx);
    for (int i = 0; i < cs->n; i++)
        cs->c[i].p = (float)(cs->c[i].p / sum);
}

/* Index of token id in the list, or -1. */
static int find(const iflow_cands *cs, int32_t id)
{
    if (id >= 0 && id < cs->n && cs->c[id].id == id)
        return id;
    for (int i = 0; i < cs->n; i++)
        if (cs->c[i].id == id)
            return i;
    return -1;
}

void iflow_cands_penalize(iflow_cands *cs, const int32_t *last, int n_last, float repeat, float freq,
                          float presence)
{
    if ((repeat == 1 || repeat == 0) && freq == 0 && presence == 0)
        return;
    /* Count the occurrences in p (stale here anyway): no scratch needed. */
    for (int i = 0; i < cs->n; i++)
        cs->c[i].p = 0;
    for (int j = 0; j < n_last; j++) {
        int i = find(cs, last[j]);
        if (i >= 0)
            cs->c[i].p += 1;
    }
    for (int i = 0; i < cs->n; i++) {
        float c = cs->c[i].p, *l = &cs->c[i].logit;
        if (c == 0)
            continue;
        if (repeat != 0 && repeat != 1)
            *l = *l > 0 ? *l / repeat : *l * repeat;
        *l -= c * freq + presence;
    }
    cs->sorted = 0;
}

/* Sift a min-heap (worst candidate at the root) of n down from i. */
static void sift(iflow_cand *h, int n, int i)
{
    for (;;) {
        int w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && before(&h[w], &h[l]))
            w = l;
        if (r < n && before(&h[w], &h[r]))
            w = r;
        if (w == i)
            return;
        iflow_cand t = h[i];
        h[i] = h[w], h[w] = t, i = w;
    }
}

/* Move the k best candidates to the front, sorted; the others stay behind them in some order. */
static void select_front(iflow_cands *cs, int k)
{
    if (cs->sorted)
        return;
    if (k >= cs->n) {
        iflow_cands_sort(cs);
        return;
    }
    iflow_cand *h = cs->c;
    for (int i = k / 2 - 1; i >= 0; i--)
        sift(h, k, i);
    for (int i = k; i < cs->n; i++)
        if (before(&h[i], &h[0])) {
            iflow_cand t = h[0];
            h[0] = h[i], h[i] = t;
            sift(h, k, 0);
        }
    qsort(h, (size_t)k, sizeof *h, by_logit);
}

void iflow_cands_top_k(iflow_cands *cs, int k)
{
    if (k <= 0 || k >= cs->n)
        return;
    select_front(cs, k);
    cs->n = k;
    cs->sorted = 1;
}

/* The largest logit and the softmax normalizer of the whole list, without sorting. */
static float max_logit(const iflow_cands *cs)
{
    float mx = -INFINITY;
    for (int i = 0; i < cs->n; i++)
        if (cs->c[i].logit > mx)
            mx = cs->c[i].logit;
    return mx;
}

static double normalizer(const iflow_cands *cs, float mx)
{
    double z = 0;
    for (int i = 0; i < cs->n; i++)
        z += expf(cs->c[i].logit - mx);
    return z;
}

/* Keep the first n of the sorted list. */
static void keep(iflow_cands *cs, int n)
{
    cs->n = n < 1 ? 1 : n < cs->n ? n : cs->n;
}

void iflow_cands_tail_free(iflow_cands *cs, float z)
{
    if (z <= 0 || z >= 1 || cs->n < 3)
        return;
    iflow_cands_softmax(cs);
    int m = cs->n - 2;
    double sum = 0;
    for (int i = 0; i < m; i++)
        sum += fabs((double)cs->c[i].p - 2.0 * cs->c[i + 1].p + cs->c[i + 2].p);
    double cum = 0;
    for (int i = 0; i < m; i++) {
        double d2 = fabs((double)cs->c[i].p - 2.0 * cs->c[i + 1].p + cs->c[i + 2].p);
        cum += sum > 1e-6 ? d2 / sum : 1.0 / m;
        if (cum > z) {
            keep(cs, i + 1);
            return;
        }
    }
    keep(cs, m); /* rounding left the sum just under z */
}

/* Typical order: rising key (kept in p for the sort), ties in the sorted order. */
static int by_key(const void *a, const void *b)
{
    const iflow_cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p < y->p ? -1 : 1;
    return by_logit(a, b);
}

void iflow_cands_typical(iflow_cands *cs, float mass)
{
    if (mass <= 0 || mass >= 1 || cs->n < 2)
        return;
    iflow_cands_softmax(cs);
    int n = cs->n;
    float mx = cs->c[0].logit;
    if (mx == -INFINITY)
        return;
    double h = 0, z = 0;
    for (int i = 0; i < n; i++) {
        z += expf(cs->c[i].logit - mx);
        if (cs->c[i].p > 0)
            h -= cs->c[i].p * log(cs->c[i].p);
    }
    /* Sort by the key |-ln p - H| held in p, then give p back from the logits. */
    for (int i = 0; i < n; i++)
        cs->c[i].p = cs->c[i].p > 0 ? (float)fabs(-log(cs->c[i].p) - h) : INFINITY;
    qsort(cs->c, (size_t)n, sizeof *cs->c, by_key);
    for (int i = 0; i < n; i++)
        cs->c[i].p = (float)(expf(cs->c[i].logit - mx) / z);
    double cum = 0;
    for (int i = 0; i < n; i++) {
        cum += cs->c[i].p;
        if (cum >= mass) {
            cs->n = i + 1;
            break;
        }
    }
    cs->sorted = 0;
}

void iflow_cands_top_p(iflow_cands *cs, float p)
{
    if (p <= 0 || p >= 1)
        return;
    /* Sort only as far as the mass needs: the best 64, 256, ... until they reach p (the
     * probabilities are those of the whole list, so the cut is the full sort's). */
    float mx = max_logit(cs);
    if (mx == -INFINITY)
        return;
    double z = normalizer(cs, mx);
    for (int k = cs->sorted ? cs->n : 64;; k *= 4) {
        if (k > cs->n)
            k = cs->n;
        select_front(cs, k);
        double cum = 0;
        for (int i = 0; i < k; i++) {
            cum += (float)(expf(cs->c[i].logit - mx) / z);
            if (cum >= p) {
                keep(cs, i + 1);
                cs->sorted = 1;
                return;
            }
        }
        if (k == cs->n)
            return;
    }
}

void iflow_cands_min_p(iflow_cands *cs, float min_p)
{
    if (min_p <= 0 || cs->n < 2)
        return;
    float mx = -INFINITY;
    for (int i = 0; i < cs->n; i++)
        if (cs->c[i].logit > mx)
            mx = cs->c[i].logit;
    /* p_i >= min_p * p_max  <=>  logit_i >= max + ln(min_p); the order is kept. */
    float cut = mx + logf(min_p);
    int n = 0;
    for (int i = 0; i < cs->n; i++)
        if (cs->c[i].logit >= cut || cs->c[i].logit == mx)
            cs->c[n++] = cs->c[i];
    cs->n = n;
}

void iflow_cands_temperature(iflow_cands *cs, float t)
{
    if (t == 1)
        return;
    if (t <= 0) {
        int b = 0;
        for (int i = 1; i < cs->n; i++)
            if (before(&cs->c[i], &cs->c[b]))
                b = i;
        cs->c[0] = cs->c[b];
        cs->n = 1;
        cs->sorted = 1;
        return;
    }
    for (int i = 0; i < cs->n; i++) { /* a tiny t must not turn finite logits into inf (inf - inf) */
        float l = cs->c[i].logit, v = l / t;
        cs->c[i].logit = isinf(v) && !isinf(l) ? (v > 0 ? FLT_MAX : -FLT_MAX) : v;
    }
}

int32_t iflow_cands_greedy(iflow_cands *cs)
{
    int b = 0;
    for (int i = 1; i < cs->n; i++)
        if (before(&cs->c[i], &cs->c[b]))
            b = i;
    return cs->c[b].id;
}

/* Index at u in the cumulative distribution of p (sums to 1, or to total). */
static int draw_index(const iflow_cands *cs, double u, double total)
{
    double r = u * total, acc = 0;
    int last = 0;
    for (int i = 0; i < cs->n; i++) {
        if (cs->c[i].p <= 0)
            continue;
        acc += cs->c[i].p;
        last = i;
        if (r < acc)
            return i;
    }
    return last;
}

int32_t iflow_cands_draw(iflow_cands *cs, double u)
{
    iflow_cands_softmax(cs);
    return cs->c[draw_index(cs, u, 1.0)].id;
}

/* Draw from the renormalized list and move mu toward tau by the drawn token's surprise. */
static int32_t mirostat_draw(iflow_cands *cs, float tau, float eta, float *mu, double u)
{
    iflow_cands_softmax(cs);
    int i = draw_index(cs, u, 1.0);
    float surprise = -log2f(cs->c[i].p);
    *mu -= eta * (surprise - tau);
    return cs->c[i].id;
}

int32_t iflow_cands_mirostat(iflow_cands *cs, float tau, float eta, int m, int n_vocab, float *mu, double u)
{
    iflow_cands_softmax(cs);
    double sum_tb = 0, sum_tt = 0;
    for (int i = 0; i < m - 1 && i < cs->n - 1; i++) {
        if (cs->c[i + 1].p <= 0)
            break;
        double t = log((i + 2.0) / (i + 1.0)), b = log((double)cs->c[i].p / cs->c[i + 1].p);
        sum_tb += t * b;
        sum_tt += t * t;
    }
    int k = 1;
    if (sum_tt > 0) {
        double s = sum_tb / sum_tt, e = s - 1;
        double kk = pow(e * pow(2, *mu) / (1 - pow(n_vocab, -e)), 1 / s);
        k = !(kk >= 1) ? 1 : kk >= cs->n ? cs->n : (int)kk; /* NaN (s ~ 1) keeps one */
    }
    keep(cs, k);
    return mirostat_draw(cs, tau, eta, mu, u);
}

int32_t iflow_cands_mirostat2(iflow_cands *cs, float tau, float eta, float *mu, double u)
{
    /* Keep the tokens with surprise <= mu (a prefix of the sorted list): filter, then sort those. */
    float mx = max_logit(cs);
    if (mx != -INFINITY) {
        double z = normalizer(cs, mx);
        int n = 0, best = 0;
        for (int i = 0; i < cs->n; i++)
            if (before(&cs->c[i], &cs->c[best]))
                best = i;
        iflow_cand first = cs->c[best];
        for (int i = 0; i < cs->n; i++)
            if (-log2f((float)(expf(cs->c[i].logit - mx) / z)) <= *mu)
                cs->c[n++] = cs->c[i];
        if (n == 0)
            cs->c[n++] = first;
        cs->n = n;
        cs->sorted = 0;
    }
    return mirostat_draw(cs, tau, eta, mu, u);
}

float iflow_antilm_prob(const int32_t *h, int len, int n, float beta, int32_t y)
{
    if (n < 1 || len < n - 1 || len <= 0)
        return 0;
    double score = 0, rest = 1;
    for (int i = n - 1; i >= 0; i--) {
        const int32_t *ctx = h + len - i; /* the last i tokens */
        long total = 0, count = 0;
        for (int j = i; j < len; j++) { /* h[j] followed h[j-i .. j-1] */
            if (i && (h[j - 1] != ctx[i - 1] || memcmp(h + j - i, ctx, (size_t)i * sizeof *h) != 0))
                continue;
            total++;
            count += h[j] == y;
        }
        if (!count)
            continue;
        score += i ? rest * beta * (double)count / (double)(total + 1) : rest * (double)count / (double)total;
        rest -= rest * beta;
    }
    return (float)score;
}

static int by_score(const void *a, const void *b)
{
    const iflow_cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void iflow_cands_fsd(iflow_cands *cs, const int32_t *hist, int n_hist, int k, float alpha, int n, float beta)
{
    /* P_LM over the whole list (no sort needed), then the k best by selection. */
    float mx = max_logit(cs);
    double z = mx == -INFINITY ? cs->n : normalizer(cs, mx);
    iflow_cands_top_k(cs, k < 1 ? 1 : k);
    while (cs->n > 1 && cs->c[cs->n - 1].logit == -INFINITY) /* banned: never scored above a possible token */
        cs->n--;
    for (int i = 0; i < cs->n; i++) {
        double plm = (mx == -INFINITY ? 1 : expf(cs->c[i].logit - mx)) / z;
        cs->c[i].p = (float)((1 - alpha) * plm - alpha * iflow_antilm_prob(hist, n_hist, n, beta, cs->c[i].id));
    }
    qsort(cs->c, (size_t)cs->n, sizeof *cs->c, by_score);
    cs->sorted = 0;
}

int32_t iflow_cands_draw_scores(iflow_cands *cs, double u)
{
    double total = 0;
    for (int i = 0; i < cs->n; i++)
        total += cs->c[i].p > 0 ? cs->c[i].p : 0;
    if (!(total > 0))
        return cs->c[0].id;
    return cs->c[draw_index(cs, u, total)].id;
}
