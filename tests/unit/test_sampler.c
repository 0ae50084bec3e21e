/* test_sampler: every logit processor's distribution on hand-built logits against its
 * definition (computed here in double, independently of logits.c), the sampler's chain order,
 * penalties, logit biases (and their limits in accepted tokens), mirostat's controller, FSD's
 * anti-LM, seeds, and the parameter table. */
#include "check.h"
#include "libcore/base/error.h"
#include "libcore/engine/logits.h"
#include "libcore/engine/sampler.h"

#define V 8
#define GRID 20000 /* u = (i + 0.5) / GRID: a processor's distribution to within 1/GRID */

static const float L8[V] = {2.0f, 1.5f, 1.1f, 0.9f, 0.3f, -0.2f, -1.0f, -2.5f};

/* ---- references ---- */

static void ref_softmax(const double *l, const int *keep, int n, double t, double *p)
{
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < n; i++)
        if (keep[i] && l[i] / t > mx)
            mx = l[i] / t;
    for (int i = 0; i < n; i++)
        z += p[i] = keep[i] ? exp(l[i] / t - mx) : 0;
    for (int i = 0; i < n; i++)
        p[i] /= z;
}

/* Order of ids by falling value, ties by id (selection sort: independent of logits.c). */
static void ref_order(const double *v, int n, int *ord, int rising)
{
    int used[64] = {0};
    for (int r = 0; r < n; r++) {
        int b = -1;
        for (int i = 0; i < n; i++)
            if (!used[i] && (b < 0 || (rising ? v[i] < v[b] : v[i] > v[b])))
                b = i;
        used[b] = 1, ord[r] = b;
    }
}

/* Keep the smallest prefix of ord whose mass of p reaches m. */
static void ref_prefix_mass(const double *p, const int *ord, int n, double m, int *keep)
{
    double cum = 0;
    for (int i = 0; i < n; i++)
        keep[i] = 0;
    for (int r = 0; r < n; r++) {
        keep[ord[r]] = 1;
        cum += p[ord[r]];
        if (cum >= m)
            break;
    }
}

static void to_double(const float *l, double *d, int n)
{
    for (int i = 0; i < n; i++)
        d[i] = l[i];
}

/* The distribution a sampler draws over `draws` samples from logits (one sequence, no accept). */
static void sampler_freq(const iflow_sampler_params *p, const float *l, int n, int draws, double *f)
{
    iflow_sampler *s;
    CHECK(iflow_sampler_open(&s, p, n) == 0, "open: %s", iflow_errmsg());
    for (int i = 0; i < n; i++)
        f[i] = 0;
    for (int d = 0; d < draws; d++)
        f[iflow_sampler_sample(s, l)] += 1.0 / draws;
    iflow_sampler_close(s);
}

/* Empirical frequencies within 5 standard errors of the expected ones (and exact zeros). */
static void expect_dist(const double *f, const double *want, int n, int draws, const char *what)
{
    for (int i = 0; i < n; i++) {
        double se = sqrt(want[i] * (1 - want[i]) / draws) + 1e-12;
        if (want[i] == 0)
            CHECK(f[i] == 0, "%s: token %d drawn (%g) but outside the support", what, i, f[i]);
        else
            CHECK(fabs(f[i] - want[i]) <= 5 * se, "%s: token %d frequency %.4f, want %.4f (se %.4f)", what, i, f[i],
                  want[i], se);
    }
}

static void check_sampler_dist(const iflow_sampler_params *p, const double *want, const char *what)
{
    double f[V];
    sampler_freq(p, L8, V, 100000, f);
    expect_dist(f, want, V, 100000, what);
}

/* A processor's distribution by quadrature over u: apply `cut` to a fresh list, then draw. */
typedef void (*cut_fn)(iflow_cands *, float);
static void grid_dist(const float *l, int n, cut_fn cut, float arg, double *f)
{
    iflow_cand buf[64];
    for (int i = 0; i < n; i++)
        f[i] = 0;
    for (int g = 0; g < GRID; g++) {
        iflow_cands cs;
        iflow_cands_init(&cs, buf, l, n);
        if (cut)
            cut(&cs, arg);
        f[iflow_cands_draw(&cs, (g + 0.5) / GRID)] += 1.0 / GRID;
    }
}

static void expect_close(const double *f, const double *want, int n, double tol, const char *what)
{
    for (int i = 0; i < n; i++)
        CHECK(fabs(f[i] - want[i]) <= tol && ((want[i] == 0) == (f[i] == 0)), "%s: token %d %.5f, want %.5f", what, i,
              f[i], want[i]);
}

/* ---- each processor ---- */

static void test_softmax_sort(void)
{
    float l[100];
    iflow_cand buf[100];
    for (int i = 0; i < 100; i++)
        l[i] = (float)(i % 7) - 3.0f; /* many ties */
    iflow_cands cs;
    iflow_cands_init(&cs, buf, l, 100);
    iflow_cands_softmax(&cs);
    double sum = 0;
    for (int i = 0; i < 100; i++) {
        sum += cs.c[i].p;
        if (i)
            CHECK(cs.c[i - 1].logit > cs.c[i].logit || (cs.c[i - 1].logit == cs.c[i].logit && cs.c[i - 1].id < cs.c[i].id),
                  "order at %d", i);
    }
    CHECK(fabs(sum - 1) < 1e-5, "softmax sums to %g", sum);
    CHECK(cs.c[0].id == 6, "the first of the largest is id 6, got %d", cs.c[0].id);
}

static void test_temperature(void)
{
    double d[V], want[V], f[V];
    int all[V] = {1, 1, 1, 1, 1, 1, 1, 1};
    to_double(L8, d, V);
    for (double t = 0.5; t < 2.1; t += 0.75) {
        ref_softmax(d, all, V, t, want);
        grid_dist(L8, V, iflow_cands_temperature, (float)t, f);
        expect_close(f, want, V, 2.0 / GRID, "temperature");
        iflow_sampler_params p = {.temp = (float)t, .seed = 1};
        check_sampler_dist(&p, want, "sampler temperature");
    }
    /* a tiny t is greedy in the limit, not NaN */
    iflow_sampler_params tiny = {.temp = 1e-30f, .seed = 1};
    double one[V] = {1, 0, 0, 0, 0, 0, 0, 0};
    check_sampler_dist(&tiny, one, "temperature 1e-30");
    /* t 0: greedy; the processor keeps the first of the maxima */
    float tie[4] = {1, 3, 3, 0};
    iflow_cand buf[4];
    iflow_cands cs;
    iflow_cands_init(&cs, buf, tie, 4);
    iflow_cands_temperature(&cs, 0);
    CHECK(cs.n == 1 && cs.c[0].id == 1, "temperature 0 keeps id 1 alone (n %d id %d)", cs.n, cs.c[0].id);
}

static void test_greedy(void)
{
    float tie[5] = {0, 2, -1, 2, 1};
    iflow_cand buf[5];
    iflow_cands cs;
    iflow_cands_init(&cs, buf, tie, 5);
    CHECK(iflow_cands_greedy(&cs) == 1, "greedy takes the lowest id among maxima");
    iflow_sampler_params zero = {0};
    double want[V] = {1, 0, 0, 0, 0, 0, 0, 0};
    check_sampler_dist(&zero, want, "zeroed parameters are greedy");
    iflow_sampler_params g = {.kind = IFLOW_SAMPLER_GREEDY, .temp = 1};
    check_sampler_dist(&g, want, "kind greedy");
}

static void top_k_f(iflow_cands *cs, float k) { iflow_cands_top_k(cs, (int)k); }

static void test_top_k(void)
{
    double d[V], want[V], f[V];
    to_double(L8, d, V);
    for (int k = 1; k <= V; k++) {
        int keep[V];
        for (int i = 0; i < V; i++)
            keep[i] = i < k; /* L8 falls */
        ref_softmax(d, keep, V, 1, want);
        grid_dist(L8, V, top_k_f, (float)k, f);
        expect_close(f, want, V, 2.0 / GRID, "top-k");
    }
    /* The partial selection against a full sort on a large shuffled list with ties. */
    enum { N = 5000 };
    static float big[N];
    static iflow_cand b1[N], b2[N];
    for (int i = 0; i < N; i++)
        big[i] = (float)(rnd_u32() % 300) / 10.0f;
    for (int k = 1; k < N; k = k * 3 + 1) {
        iflow_cands x, y;
        iflow_cands_init(&x, b1, big, N);
        iflow_cands_init(&y, b2, big, N);
        iflow_cands_top_k(&x, k);
        iflow_cands_sort(&y);
        int same = x.n == k;
        for (int i = 0; i < k && same; i++)
            same = x.c[i].id == y.c[i].id;
        CHECK(same, "top-k %d by selection equals the first k of a full sort", k);
    }
    /* with temperature after the cut */
    iflow_sampler_params p = {.temp = 0.6f, .top_k = 3, .seed = 5};
    int keep[V] = {1, 1, 1, 0, 0, 0, 0, 0};
    ref_softmax(d, keep, V, 0.6, want);
    check_sampler_dist(&p, want, "sampler top-k 3, temp 0.6");
}

static void test_top_p(void)
{
    double d[V], p1[V], want[V], f[V];
    int all[V] = {1, 1, 1, 1, 1, 1, 1, 1}, ord[V], keep[V];
    to_double(L8, d, V);
    ref_softmax(d, all, V, 1, p1);
    ref_order(p1, V, ord, 0);
    for (double m = 0.1; m < 1; m += 0.15) {
        ref_prefix_mass(p1, ord, V, m, keep);
        ref_softmax(d, keep, V, 1, want);
        grid_dist(L8, V, iflow_cands_top_p, (float)m, f);
        expect_close(f, want, V, 2.0 / GRID, "top-p");
    }
    /* A large list, cut by partial sorts (64, 256, ... best): the same set as a full sort. */
    enum { N = 6000 };
    static float big[N];
    static iflow_cand b1[N], b2[N];
    for (int i = 0; i < N; i++)
        big[i] = (float)(rnd_normal() * (i % 2 ? 1.0 : 3.0));
    for (double m = 0.05; m < 1; m += 0.1) {
        iflow_cands x, y;
        iflow_cands_init(&x, b1, big, N);
        iflow_cands_init(&y, b2, big, N);
        iflow_cands_top_p(&x, (float)m);
        iflow_cands_softmax(&y);
        double cum = 0;
        int k = 0;
        while (k < N && cum < m)
            cum += y.c[k++].p;
        int same = x.n == k;
        for (int i = 0; i < k && same; i++)
            same = x.c[i].id == y.c[i].id;
        CHECK(same, "top-p %.2f of %d logits: %d kept, a full sort keeps %d", m, N, x.n, k);
    }
    /* The cut is made at temperature 1, then the temperature reshapes the survivors. */
    ref_prefix_mass(p1, ord, V, 0.8, keep);
    ref_softmax(d, keep, V, 1.7, want);
    iflow_sampler_params p = {.temp = 1.7f, .top_p = 0.8f, .seed = 3};
    check_sampler_dist(&p, want, "sampler top-p 0.8 then temp 1.7");
}

static void test_min_p(void)
{
    double d[V], p1[V], want[V], f[V];
    int all[V] = {1, 1, 1, 1, 1, 1, 1, 1}, keep[V];
    to_double(L8, d, V);
    ref_softmax(d, all, V, 1, p1);
    for (double m = 0.02; m < 1; m *= 2.3) {
        for (int i = 0; i < V; i++)
            keep[i] = p1[i] >= m * p1[0];
        ref_softmax(d, keep, V, 1, want);
        grid_dist(L8, V, iflow_cands_min_p, (float)m, f);
        expect_close(f, want, V, 2.0 / GRID, "min-p");
    }
    for (int i = 0; i < V; i++)
        keep[i] = p1[i] >= 0.1 * p1[0];
    ref_softmax(d, keep, V, 0.9, want);
    iflow_sampler_params p = {.temp = 0.9f, .min_p = 0.1f, .seed = 4};
    check_sampler_dist(&p, want, "sampler min-p 0.1, temp 0.9");
}

static void test_typical(void)
{
    /* A head over a wide, even rest: the head is the least typical token here. */
    const float l[V] = {2.0f, 1.2f, 1.1f, 1.0f, 0.9f, 0.8f, 0.7f, 0.6f};
    double d[V], p1[V], key[V], want[V], f[V];
    int all[V] = {1, 1, 1, 1, 1, 1, 1, 1}, ord[V], keep[V];
    to_double(l, d, V);
    ref_softmax(d, all, V, 1, p1);
    double h = 0;
    for (int i = 0; i < V; i++)
        h -= p1[i] * log(p1[i]);
    for (int i = 0; i < V; i++)
        key[i] = fabs(-log(p1[i]) - h);
    ref_order(key, V, ord, 1);
    CHECK(ord[0] != 0, "the most likely token is not the most typical here (test design)");
    for (double m = 0.2; m < 1; m += 0.2) {
        ref_prefix_mass(p1, ord, V, m, keep);
        ref_softmax(d, keep, V, 1, want);
        grid_dist(l, V, iflow_cands_typical, (float)m, f);
        expect_close(f, want, V, 2.0 / GRID, "typical");
    }
}

static void test_tail_free(void)
{
    double d[V], p1[V], want[V], f[V];
    int all[V] = {1, 1, 1, 1, 1, 1, 1, 1}, keep[V];
    to_double(L8, d, V);
    ref_softmax(d, all, V, 1, p1); /* L8 falls: p1 is sorted */
    double d2[V - 2], sum = 0;
    for (int i = 0; i < V - 2; i++)
        sum += d2[i] = fabs((p1[i] - p1[i + 1]) - (p1[i + 1] - p1[i + 2]));
    for (double z = 0.1; z < 1; z += 0.2) {
        /* Bricken: token 0 kept; token j+1 kept while the running sum of d2 up to j is <= z. */
        double cum = 0;
        for (int i = 0; i < V; i++)
            keep[i] = i == 0;
        for (int j = 0; j < V - 2; j++) {
            cum += d2[j] / sum;
            if (cum > z)
                break;
            keep[j + 1] = 1;
        }
        ref_softmax(d, keep, V, 1, want);
        grid_dist(L8, V, iflow_cands_tail_free, (float)z, f);
        expect_close(f, want, V, 2.0 / GRID, "tail-free");
    }
}

/* The distribution after iflow_cands_penalize(window, repeat, freq, presence) on L8, by
 * quadrature, against the definitions applied here to each token's count c in the window:
 *   repetition (CTRL, Keskar et al. 2019, with llama.cpp's and Hugging Face's sign rule): a token
 *     with c > 0 has its logit divided by `repeat` when positive, multiplied when negative, once
 *     whatever c is;
 *   frequency and presence (OpenAI's API reference): logit -= c * freq + (c > 0) * presence. */
static void penalty_case(const int32_t *win, int n_win, double repeat, double freq, double presence, const char *what)
{
    double d[V], want[V], f[V];
    int all[V] = {1, 1, 1, 1, 1, 1, 1, 1}, count[V] = {0};
    to_double(L8, d, V);
    for (int i = 0; i < n_win; i++)
        count[win[i]]++;
    for (int i = 0; i < V; i++) {
        if (count[i] && repeat != 1)
            d[i] = d[i] > 0 ? d[i] / repeat : d[i] * repeat;
        d[i] -= count[i] * freq + (count[i] > 0) * presence;
    }
    ref_softmax(d, all, V, 1, want);
    iflow_cand buf[V];
    for (int i = 0; i < V; i++)
        f[i] = 0;
    for (int g = 0; g < GRID; g++) {
        iflow_cands cs;
        iflow_cands_init(&cs, buf, L8, V);
        iflow_cands_penalize(&cs, win, n_win, (float)repeat, (float)freq, (float)presence);
        f[iflow_cands_draw(&cs, (g + 0.5) / GRID)] += 1.0 / GRID;
    }
    expect_close(f, want, V, 2.0 / GRID, what);
}

static void test_penalties(void)
{
    /* window [2 2 5 6 6 6]: token 2 twice (logit 1.1), 5 once (-0.2) and 6 three times (-1.0) */
    const int32_t hist[] = {0, 2, 2, 5, 6, 6, 6}, *win = hist + 1;
    penalty_case(win, 6, 1.3, 0, 0, "repetition 1.3 (divide 1.1, multiply -0.2 and -1.0, once each)");
    penalty_case(win, 6, 0.7, 0, 0, "repetition 0.7 (< 1 favours the tokens seen)");
    penalty_case(win, 6, 1, 0.4, 0, "frequency 0.4 (2, 1 and 3 occurrences)");
    penalty_case(win, 6, 1, 0, 0.6, "presence 0.6 (once per token seen)");
    penalty_case(win, 6, 1, -0.3, 0, "a negative frequency penalty raises the tokens seen");
    penalty_case(win, 6, 1.3, 0.2, 0.5, "repetition, frequency and presence together");
    /* the rules themselves, token by token, on the logits (no sampling): */
    {
        iflow_cand buf[V];
        iflow_cands cs;
        iflow_cands_init(&cs, buf, L8, V);
        iflow_cands_penalize(&cs, win, 6, 2, 0, 0);
        CHECK(buf[2].logit == 1.1f / 2 && buf[5].logit == -0.2f * 2 && buf[6].logit == -1.0f * 2 &&
                  buf[0].logit == L8[0] && buf[3].logit == L8[3],
              "repetition 2: 1.1 -> 0.55, -0.2 -> -0.4, -1 -> -2, unseen tokens unchanged");
        iflow_cands_init(&cs, buf, L8, V);
        iflow_cands_penalize(&cs, win, 6, 1, 0.25f, 0.5f);
        CHECK(fabs(buf[2].logit - (1.1 - 2 * 0.25 - 0.5)) < 1e-6 && fabs(buf[5].logit - (-0.2 - 0.25 - 0.5)) < 1e-6 &&
                  fabs(buf[6].logit - (-1.0 - 3 * 0.25 - 0.5)) < 1e-6 && buf[1].logit == L8[1],
              "frequency 0.25, presence 0.5: minus c * 0.25 + 0.5 for each token seen c times");
    }

    /* Through the sampler, all three over the last 6 accepted tokens (token 0, accepted first,
     * is outside the window). */
    double d[V], want[V];
    int all[V] = {1, 1, 1, 1, 1, 1, 1, 1}, count[V] = {0};
    to_double(L8, d, V);
    for (int i = 1; i < 7; i++)
        count[hist[i]]++;
    for (int i = 0; i < V; i++)
        if (count[i])
            d[i] = (d[i] > 0 ? d[i] / 1.3 : d[i] * 1.3) - count[i] * 0.2 - 0.5;
    ref_softmax(d, all, V, 1, want);
    iflow_sampler_params p = {.temp = 1, .repeat_penalty = 1.3f, .frequency_penalty = 0.2f, .presence_penalty = 0.5f,
                              .repeat_last_n = 6, .seed = 9};
    iflow_sampler *s;
    CHECK(iflow_sampler_open(&s, &p, V) == 0, "open");
    for (int i = 0; i < 7; i++)
        iflow_sampler_accept(s, hist[i]);
    CHECK(!iflow_sampler_is_greedy(s), "penalties need the logits");
    double f[V] = {0};
    int n = 100000;
    for (int k = 0; k < n; k++)
        f[iflow_sampler_sample(s, L8)] += 1.0 / n;
    expect_dist(f, want, V, n, "penalties over the last 6 tokens");
    CHECK(iflow_sampler_accept(s, V) == IFLOW_ERANGE, "accepting a token outside the vocabulary fails");
    iflow_sampler_close(s);

    /* greedy with a repeat penalty avoids the repeated maximum */
    iflow_sampler_params g = {.kind = IFLOW_SAMPLER_GREEDY, .repeat_penalty = 2};
    CHECK(iflow_sampler_open(&s, &g, V) == 0, "open");
    iflow_sampler_accept(s, 0);
    CHECK(iflow_sampler_sample(s, L8) == 1, "greedy with repeat penalty 2: token 0 (2.0 -> 1.0) loses to 1 (1.5)");
    iflow_sampler_reset(s);
    CHECK(iflow_sampler_sample(s, L8) == 0, "after a reset the history is gone");
    iflow_sampler_close(s);
}

/* Logit biases: added before everything else; -inf bans; until counts accepted tokens (a
 * truncation brings the bias back); the distribution a draft is checked against has them. */
static void test_bias(void)
{
    iflow_sampler *s;
    iflow_sampler_params g = {0}; /* greedy */
    CHECK(iflow_sampler_open(&s, &g, V) == 0, "open");
    CHECK(iflow_sampler_is_greedy(s), "greedy without biases");
    CHECK(iflow_sampler_add_bias(s, 3, 1.2f, -1) == 0, "add");
    CHECK(!iflow_sampler_is_greedy(s), "a bias needs the logits");
    CHECK(iflow_sampler_sample(s, L8) == 3, "token 3: 0.9 + 1.2 = 2.1 beats token 0's 2.0");
    iflow_sampler_clear_bias(s);
    CHECK(iflow_sampler_add_bias(s, 0, -INFINITY, 2) == 0 && iflow_sampler_add_bias(s, 1, -INFINITY, -1) == 0, "bans");
    CHECK(iflow_sampler_sample(s, L8) == 2, "0 and 1 banned: token 2 (1.1)");
    iflow_sampler_accept(s, 5);
    iflow_sampler_accept(s, 6);
    CHECK(iflow_sampler_sample(s, L8) == 0, "2 tokens accepted: the ban of 0 until 2 is over, 1's stays");
    iflow_sampler_truncate(s, 1);
    CHECK(iflow_sampler_sample(s, L8) == 2, "truncated to 1 token: 0 is banned again");
    float probs[V];
    CHECK(iflow_sampler_dist(s, L8, probs) == 0 && probs[2] == 1, "greedy's distribution: all on the biased choice");
    iflow_sampler_reset(s);
    CHECK(iflow_sampler_sample(s, L8) == 2, "a reset keeps the biases (and counts from 0)");
    CHECK_ERR(iflow_sampler_add_bias(s, V, 1, -1), IFLOW_ERANGE, "token 8", "outside the vocabulary");
    CHECK_ERR(iflow_sampler_add_bias(s, 1, NAN, -1), IFLOW_EINVAL, "token 1", "-inf to ban");
    iflow_sampler_close(s);
    /* sampled: the chain's distribution is the softmax of the biased logits (before the penalties:
     * token 4 seen once, repetition 1.5 divides its biased logit 0.3 + 0.9) */
    iflow_sampler_params p = {.temp = 1, .repeat_penalty = 1.5f, .seed = 3};
    CHECK(iflow_sampler_open(&s, &p, V) == 0, "open");
    iflow_sampler_accept(s, 4);
    iflow_sampler_add_bias(s, 4, 0.9f, -1);
    iflow_sampler_add_bias(s, 7, -INFINITY, -1);
    double d[V], want[V];
    int all[V] = {1, 1, 1, 1, 1, 1, 1, 0};
    to_double(L8, d, V);
    d[4] = (0.3 + 0.9) / 1.5;
    ref_softmax(d, all, V, 1, want);
    CHECK(iflow_sampler_dist(s, L8, probs) == 0, "dist");
    double worst = 0;
    for (int i = 0; i < V; i++)
        worst = fmax(worst, fabs(probs[i] - want[i]));
    CHECK(worst < 1e-6 && probs[7] == 0, "the biased distribution (%.3g off; the banned token 0)", worst);
    double f[V] = {0};
    int n = 100000;
    for (int k = 0; k < n; k++)
        f[iflow_sampler_sample(s, L8)] += 1.0 / n;
    expect_dist(f, want, V, n, "draws of the biased chain");
    iflow_sampler_close(s);
}

/* Allowed tokens and banned sequences (vLLM's allowed_token_ids and bad_words). */
static void test_allow_and_ban(void)
{
    iflow_sampler *s;
    iflow_sampler_params g = {0}; /* greedy */
    CHECK(iflow_sampler_open(&s, &g, V) == 0, "open");
    const int32_t some[3] = {5, 2, 5};
    CHECK(iflow_sampler_allow(s, some, 3) == 0 && !iflow_sampler_is_greedy(s), "an allowed set needs the logits");
    CHECK(iflow_sampler_sample(s, L8) == 2, "allowed {2, 5}: token 2 (1.1) over 5 (-0.2)");
    float probs[V];
    CHECK(iflow_sampler_dist(s, L8, probs) == 0 && probs[2] == 1, "greedy's distribution: all on the allowed best");
    CHECK(iflow_sampler_allow(s, NULL, 0) == 0 && iflow_sampler_is_greedy(s), "lifted");
    CHECK_ERR(iflow_sampler_allow(s, (int32_t[]){1, V}, 2), IFLOW_ERANGE, "allowed token 8", "outside the vocabulary");
    /* the sequence 6 0: token 0 is banned right after a 6 accepted from now on */
    iflow_sampler_accept(s, 6); /* before the ban: does not count */
    CHECK(iflow_sampler_ban_sequence(s, (int32_t[]){6, 0}, 2) == 0 && !iflow_sampler_is_greedy(s), "ban 6 0");
    CHECK(iflow_sampler_sample(s, L8) == 0, "the 6 came before the ban: 0 (2.0) stays");
    iflow_sampler_accept(s, 6);
    CHECK(iflow_sampler_sample(s, L8) == 1, "after a 6: 0 banned, the next best 1 (1.5)");
    iflow_sampler_accept(s, 1);
    CHECK(iflow_sampler_sample(s, L8) == 0, "after a 1: 0 again");
    iflow_sampler_truncate(s, 0); /* forgets the tokens before the ban too: it counts from 0 */
    iflow_sampler_accept(s, 6);
    CHECK(iflow_sampler_sample(s, L8) == 1, "after a truncation below the ban's start, a 6 counts");
    iflow_sampler_reset(s);
    iflow_sampler_accept(s, 6);
    CHECK(iflow_sampler_sample(s, L8) == 1, "a reset keeps the ban (and counts from 0)");
    CHECK(iflow_sampler_ban_sequence(s, (int32_t[]){1}, 1) == 0, "a one-token sequence");
    iflow_sampler_reset(s);
    CHECK(iflow_sampler_sample(s, L8) == 0 && iflow_sampler_accept(s, 6) == 0, "0 first");
    CHECK(iflow_sampler_sample(s, L8) == 2, "after a 6: 0 and 1 banned, 2 (1.1)");
    CHECK_ERR(iflow_sampler_ban_sequence(s, (int32_t[]){1, V}, 2), IFLOW_ERANGE, "banned token 8",
              "outside the vocabulary");
    CHECK_ERR(iflow_sampler_ban_sequence(s, some, 0), IFLOW_EINVAL, "0 tokens", "at least 1");
    iflow_sampler_clear_bias(s);
    CHECK(iflow_sampler_is_greedy(s) && iflow_sampler_sample(s, L8) == 0, "cleared: greedy again");
    iflow_sampler_close(s);
    /* FSD with one token allowed and k 3: the anti-LM pushes that token's score below 0 (token 0
     * after "0 0 0 0"), yet the two banned ones at -inf (score 0) are not FSD's to choose */
    for (int kind = IFLOW_SAMPLER_FSD; kind <= IFLOW_SAMPLER_RFSD; kind++) {
        iflow_sampler_params f = {.kind = kind, .fsd_k = 3, .fsd_alpha = 0.9f, .seed = 2};
        CHECK(iflow_sampler_open(&s, &f, V) == 0 && iflow_sampler_allow(s, some + 1, 1) == 0, "open");
        for (int i = 0; i < 6; i++)
            iflow_sampler_accept(s, 2);
        int only = 1;
        for (int i = 0; i < 50; i++)
            only &= iflow_sampler_sample(s, L8) == 2;
        CHECK(only, "%s, only token 2 allowed: always 2", iflow_sampler_kind_name(kind));
        iflow_sampler_close(s);
    }
    /* sampled: the chain's distribution is the softmax over the allowed tokens */
    iflow_sampler_params p = {.temp = 1, .seed = 5};
    CHECK(iflow_sampler_open(&s, &p, V) == 0, "open");
    const int32_t three[3] = {1, 4, 7};
    iflow_sampler_allow(s, three, 3);
    double d[V], want[V];
    int keep[V] = {0, 1, 0, 0, 1, 0, 0, 1};
    to_double(L8, d, V);
    ref_softmax(d, keep, V, 1, want);
    CHECK(iflow_sampler_dist(s, L8, probs) == 0, "dist");
    double worst = 0;
    for (int i = 0; i < V; i++)
        worst = fmax(worst, fabs(probs[i] - want[i]));
    CHECK(worst < 1e-6, "the distribution over {1, 4, 7} (%.3g off)", worst);
    iflow_sampler_close(s);
}

static void test_mirostat(void)
{
    /* v2, one step: the prefix with surprise <= mu, renormalized; mu moves by eta * error. */
    double d[V], p1[V], want[V];
    int all[V] = {1, 1, 1, 1, 1, 1, 1, 1}, keep[V];
    to_double(L8, d, V);
    ref_softmax(d, all, V, 1, p1);
    for (float mu0 = 1.0f; mu0 < 6; mu0 += 1.3f) {
        for (int i = 0; i < V; i++)
            keep[i] = i == 0 || -log2(p1[i]) <= mu0;
        ref_softmax(d, keep, V, 1, want);
        double f[V] = {0};
        iflow_cand buf[V];
        int moved = 1;
        for (int g = 0; g < GRID; g++) {
            iflow_cands cs;
            float mu = mu0;
            iflow_cands_init(&cs, buf, L8, V);
            int32_t id = iflow_cands_mirostat2(&cs, 3.0f, 0.1f, &mu, (g + 0.5) / GRID);
            f[id] += 1.0 / GRID;
            moved &= fabs(mu - (mu0 - 0.1 * (-log2(want[id]) - 3.0))) < 1e-4;
        }
        expect_close(f, want, V, 2.0 / GRID, "mirostat v2");
        CHECK(moved, "mirostat v2 updates mu by eta * (surprise - tau)");
    }
    /* v2 on a large list (a filter, then a sort of what passed): the full sort's prefix. */
    {
        enum { NB = 6000 };
        static float big[NB];
        static iflow_cand b1[NB], b2[NB];
        for (int i = 0; i < NB; i++)
            big[i] = (float)(rnd_normal() * 2.5);
        for (float mu = 2; mu < 14; mu += 3) {
            iflow_cands x, y;
            iflow_cands_init(&x, b1, big, NB);
            iflow_cands_init(&y, b2, big, NB);
            float m1 = mu;
            int32_t id = iflow_cands_mirostat2(&x, 5, 0.1f, &m1, 0.3);
            iflow_cands_softmax(&y);
            int k = 0;
            while (k < NB && -log2(y.c[k].p) <= mu)
                k++;
            if (k == 0)
                k = 1;
            int same = x.n == k;
            for (int i = 0; i < k && same; i++)
                same = x.c[i].id == y.c[i].id;
            CHECK(same && id >= 0, "mirostat v2 mu %g: %d kept, the sorted prefix has %d", mu, x.n, k);
        }
    }
    /* v1, one step: k from the Zipf estimate of the top m probabilities. */
    enum { N = 1000 };
    static float zl[N];
    static iflow_cand zb[N];
    double zp[N], z = 0;
    for (int i = 0; i < N; i++)
        z += zp[i] = pow(i + 1, -1.2) * (1 + 0.3 * sin(i)); /* Zipf-like, not exactly */
    for (int i = 0; i < N; i++)
        zl[i] = (float)log(zp[i] / z);
    iflow_cands cs;
    iflow_cands_init(&cs, zb, zl, N);
    iflow_cands_softmax(&cs);
    double stb = 0, stt = 0;
    for (int i = 0; i < 99; i++) {
        double t = log((i + 2.0) / (i + 1)), b = log((double)cs.c[i].p / cs.c[i + 1].p);
        stb += t * b, stt += t * t;
    }
    double sh = stb / stt, e = sh - 1, mu = 6.0;
    int k = (int)pow(e * pow(2, mu) / (1 - pow(N, -e)), 1 / sh);
    CHECK(k > 1 && k < N, "the test's k is a real cut (%d)", k);
    float m = (float)mu;
    iflow_cands_mirostat(&cs, 3.0f, 0.1f, 100, N, &m, 0.5);
    CHECK(cs.n == k, "mirostat v1 keeps k = %d, kept %d", k, cs.n);

    /* v1, one step, its draw (Basu et al. 2021, Algorithm 1): s estimated from the model's
     * top m = 100 probabilities by least squares, k from the Zipf bound for the target surprise
     * mu, then a draw from the top k renormalized (top-k sampling), and mu -= eta * (S - tau)
     * with S the drawn token's surprise in that distribution (llama.cpp's reading). The
     * reference works in double on the list's own definition, sorted here. */
    {
        static int ord[N];
        static double pr[N], want1[N], f1[N];
        double mx = -INFINITY, zz = 0;
        for (int i = 0; i < N; i++)
            mx = zl[i] > mx ? zl[i] : mx;
        for (int i = 0; i < N; i++)
            zz += pr[i] = exp((double)zl[i] - mx);
        for (int i = 0; i < N; i++) { /* insertion sort of the ids by falling probability */
            int j = i;
            pr[i] /= zz;
            while (j > 0 && pr[ord[j - 1]] < pr[i])
                ord[j] = ord[j - 1], j--;
            ord[j] = i;
        }
        double tb = 0, tt = 0;
        for (int i = 0; i < 99; i++) {
            double t = log((i + 2.0) / (i + 1));
            tb += t * log(pr[ord[i]] / pr[ord[i + 1]]), tt += t * t;
        }
        double s1 = tb / tt, e1 = s1 - 1;
        for (double mu0 = 4.5; mu0 <= 8.5; mu0 += 2) {
            int k1 = (int)pow(e1 * pow(2, mu0) / (1 - pow(N, -e1)), 1 / s1);
            CHECK(k1 > 1 && k1 < N, "mu %g: the test's k is a real cut (%d)", mu0, k1);
            double zk = 0;
            for (int i = 0; i < N; i++)
                want1[i] = f1[i] = 0;
            for (int r = 0; r < k1; r++)
                zk += pr[ord[r]];
            for (int r = 0; r < k1; r++)
                want1[ord[r]] = pr[ord[r]] / zk;
            int moved = 1;
            for (int g = 0; g < GRID; g++) {
                float mu = (float)mu0;
                iflow_cands_init(&cs, zb, zl, N);
                int32_t id = iflow_cands_mirostat(&cs, 3.0f, 0.1f, 100, N, &mu, (g + 0.5) / GRID);
                f1[id] += 1.0 / GRID;
                moved &= fabs(mu - (mu0 - 0.1 * (-log2(want1[id]) - 3.0))) < 1e-4;
            }
            expect_close(f1, want1, N, 2.0 / GRID, "mirostat v1 draw");
            CHECK(moved, "mirostat v1 mu %g: updates mu by eta * (surprise - tau)", mu0);
        }
    }

    /* The controller: over a long run the mean surprise of the drawn tokens (in the truncated,
     * renormalized distribution the controller sees) approaches tau, for both versions. */
    for (int v = 1; v <= 2; v++)
        for (float tau = 2; tau <= 5; tau += 3) {
            float mu = 2 * tau;
            double sum = 0;
            int counted = 0;
            for (int t = 0; t < 4000; t++) {
                iflow_cands_init(&cs, zb, zl, N);
                int32_t id = v == 1 ? iflow_cands_mirostat(&cs, tau, 0.1f, 100, N, &mu, rnd_unit())
                                    : iflow_cands_mirostat2(&cs, tau, 0.1f, &mu, rnd_unit());
                for (int i = 0; i < cs.n && t >= 500; i++)
                    if (cs.c[i].id == id) {
                        sum += -log2(cs.c[i].p);
                        counted++;
                    }
            }
            CHECK(counted == 3500 && fabs(sum / counted - tau) < 0.25, "mirostat v%d tau %g: mean surprise %.3f", v, tau,
                  sum / counted);
        }
    /* Through the sampler: a larger tau gives more surprising text. */
    for (int kind = IFLOW_SAMPLER_MIROSTAT; kind <= IFLOW_SAMPLER_MIROSTAT2; kind++) {
        double mean[2];
        for (int j = 0; j < 2; j++) {
            iflow_sampler_params p = {.temp = 1, .kind = kind, .mirostat_tau = j ? 6.0f : 3.0f, .seed = 11};
            iflow_sampler *s;
            CHECK(iflow_sampler_open(&s, &p, N) == 0, "open");
            double sum = 0;
            for (int t = 0; t < 3000; t++)
                sum += -log2(zp[iflow_sampler_sample(s, zl)] / z);
            mean[j] = sum / 3000;
            iflow_sampler_close(s);
        }
        CHECK(mean[1] > mean[0] + 1.5, "%s: tau 6 gives more surprise (%.2f bits) than tau 3 (%.2f)",
              iflow_sampler_kind_name(kind), mean[1], mean[0]);
    }
}

static void test_antilm(void)
{
    /* prefix 1 2 3 1 2, n 3, beta 0.9 (worked by hand):
     * y = 3: context [1 2] was followed by 3 once of 1: 0.9 * 1/2 = 0.45, r = 0.1;
     *        context [2] by 3 once of 1: 0.1 * 0.9 * 1/2 = 0.045, r = 0.01;
     *        unigram 1/5: 0.01 * 0.2 = 0.002.  Total 0.497.
     * y = 1: neither context was followed by 1 (r stays 1); unigram 2/5 = 0.4.
     * y = 7: never seen: 0. */
    const int32_t h[] = {1, 2, 3, 1, 2};
    CHECK(fabs(iflow_antilm_prob(h, 5, 3, 0.9f, 3) - 0.497) < 1e-6, "anti-LM(3) = %g", iflow_antilm_prob(h, 5, 3, 0.9f, 3));
    CHECK(fabs(iflow_antilm_prob(h, 5, 3, 0.9f, 1) - 0.4) < 1e-6, "anti-LM(1) = %g", iflow_antilm_prob(h, 5, 3, 0.9f, 1));
    CHECK(iflow_antilm_prob(h, 5, 3, 0.9f, 7) == 0, "anti-LM(7) = 0");
    CHECK(iflow_antilm_prob(h, 1, 3, 0.9f, 1) == 0, "a prefix shorter than n-1 gives 0");
    /* bigram over 5 5 5 5: context [5] followed by 5 three times of 3: 0.9 * 3/4; unigram 0.1 * 1 */
    const int32_t r[] = {5, 5, 5, 5};
    CHECK(fabs(iflow_antilm_prob(r, 4, 2, 0.9f, 5) - (0.9 * 0.75 + 0.1)) < 1e-6, "anti-LM of a run");
}

static void test_fsd(void)
{
    /* P_LM of L8; prefix 0 1 0 1 0 (after 0 comes 1: FSD should move off token 1). */
    const int32_t h[] = {0, 1, 0, 1, 0};
    double d[V], p1[V];
    int all[V] = {1, 1, 1, 1, 1, 1, 1, 1};
    to_double(L8, d, V);
    ref_softmax(d, all, V, 1, p1);
    double score[3], a = 0.65;
    int best = 0;
    for (int i = 0; i < 3; i++) {
        score[i] = (1 - a) * p1[i] - a * iflow_antilm_prob(h, 5, 3, 0.9f, i);
        if (score[i] > score[best])
            best = i;
    }
    iflow_cand buf[V];
    iflow_cands cs;
    iflow_cands_init(&cs, buf, L8, V);
    iflow_cands_fsd(&cs, h, 5, 3, (float)a, 3, 0.9f);
    CHECK(cs.n == 3, "fsd keeps k = 3 candidates");
    CHECK(cs.c[0].id == best && best == 2, "fsd picks %d, want %d", cs.c[0].id, best);
    for (int i = 0; i < 3; i++)
        CHECK(fabs(cs.c[i].p - score[cs.c[i].id]) < 1e-5, "fsd score of %d", cs.c[i].id);

    iflow_sampler_params p = {.kind = IFLOW_SAMPLER_FSD, .repeat_penalty = 1.5f};
    iflow_sampler *s;
    CHECK(iflow_sampler_open(&s, &p, V) == 0, "open");
    CHECK(iflow_sampler_sample(s, L8) == 0, "before any token is accepted (no history at all) fsd is greedy");
    iflow_sampler_close(s);
    p.repeat_penalty = 0;
    CHECK(iflow_sampler_open(&s, &p, V) == 0, "open");
    for (int i = 0; i < 5; i++)
        iflow_sampler_accept(s, h[i]);
    CHECK(!iflow_sampler_is_greedy(s), "fsd is not greedy");
    CHECK(iflow_sampler_sample(s, L8) == 2, "sampler fsd with the defaults (alpha 0.65, k 3, n 3) picks 2");
    iflow_sampler_reset(s);
    CHECK(iflow_sampler_sample(s, L8) == 0, "with no prefix fsd is greedy");
    iflow_sampler_close(s);

    /* Randomized FSD draws in proportion to the positive scores, then, after fsd_random_steps
     * samples, picks like FSD. Prefix 0 5 1 6 and alpha 0.3 leave three positive scores. */
    const int32_t h2[] = {0, 5, 1, 6};
    double want[V] = {0}, tot = 0, f[V] = {0};
    a = 0.3;
    for (int i = 0; i < 3; i++) {
        score[i] = (1 - a) * p1[i] - a * iflow_antilm_prob(h2, 4, 3, 0.9f, i);
        tot += score[i] > 0 ? score[i] : 0;
    }
    for (int i = 0; i < 3; i++)
        want[i] = score[i] > 0 ? score[i] / tot : 0;
    CHECK(want[0] > 0 && want[1] > 0 && want[2] > 0, "three positive scores (test design)");
    for (int g = 0; g < GRID; g++) {
        iflow_cands_init(&cs, buf, L8, V);
        iflow_cands_fsd(&cs, h2, 4, 3, (float)a, 3, 0.9f);
        f[iflow_cands_draw_scores(&cs, (g + 0.5) / GRID)] += 1.0 / GRID;
    }
    expect_close(f, want, V, 2.0 / GRID, "randomized fsd");
    for (int steps = 0; steps <= 3; steps += 3) {
        iflow_sampler_params r = {.kind = IFLOW_SAMPLER_RFSD, .fsd_alpha = 0.3f, .fsd_random_steps = steps, .seed = 2};
        CHECK(iflow_sampler_open(&s, &r, V) == 0, "open");
        for (int i = 0; i < 4; i++)
            iflow_sampler_accept(s, h2[i]);
        if (steps == 0) { /* random at every step (the prefix is not extended on purpose) */
            int n = 100000;
            for (int i = 0; i < V; i++)
                f[i] = 0;
            for (int t = 0; t < n; t++)
                f[iflow_sampler_sample(s, L8)] += 1.0 / n;
            expect_dist(f, want, V, n, "sampler rfsd");
        } else {
            for (int t = 0; t < steps; t++)
                iflow_sampler_sample(s, L8);
            int after = 1;
            for (int t = 0; t < 50; t++)
                after &= iflow_sampler_sample(s, L8) == 0;
            CHECK(after, "rfsd picks like fsd after its random steps");
        }
        iflow_sampler_close(s);
    }
}

static void test_seeds(void)
{
    iflow_sampler_params p;
    iflow_sampler_params_default(&p);
    p.min_p = 0.05f;
    p.repeat_penalty = 1.1f;
    int32_t a[200], b[200], c[200];
    for (int run = 0; run < 3; run++) {
        p.seed = run == 2 ? 8 : 7;
        iflow_sampler *s;
        CHECK(iflow_sampler_open(&s, &p, V) == 0, "open");
        int32_t *out = run == 0 ? a : run == 1 ? b : c;
        for (int t = 0; t < 200; t++) {
            out[t] = iflow_sampler_sample(s, L8);
            iflow_sampler_accept(s, out[t]);
        }
        iflow_sampler_close(s);
    }
    CHECK(memcmp(a, b, sizeof a) == 0, "one seed, one sequence");
    CHECK(memcmp(a, c, sizeof a) != 0, "seeds 7 and 8 differ");
}

static void test_params(void)
{
    iflow_sampler_params p;
    iflow_sampler_params_default(&p);
    CHECK(p.temp == 0.8f && p.top_k == 40 && p.top_p == 0.95f && p.min_p == 0 && p.kind == 0, "defaults");
    CHECK(iflow_sampler_params_set(&p, "min_p", "0.05") == 0 && p.min_p == 0.05f, "min_p");
    CHECK(iflow_sampler_params_set(&p, "--min-p", "0.1") == 0 && p.min_p == 0.1f, "--min-p");
    CHECK(iflow_sampler_params_set(&p, "temperature", "0.5") == 0 && p.temp == 0.5f, "temperature");
    CHECK(iflow_sampler_params_set(&p, "--temp", "0.7") == 0 && p.temp == 0.7f, "--temp");
    CHECK(iflow_sampler_params_set(&p, "--typical", "0.9") == 0 && p.typical_p == 0.9f, "--typical");
    CHECK(iflow_sampler_params_set(&p, "repeat_last_n", "-1") == 0 && p.repeat_last_n == -1, "repeat_last_n -1");
    CHECK(iflow_sampler_params_set(&p, "seed", "18446744073709551615") == 0 && p.seed == UINT64_MAX, "seed");
    CHECK(iflow_sampler_params_set(&p, "mirostat", "2") == 0 && p.kind == IFLOW_SAMPLER_MIROSTAT2, "mirostat 2");
    CHECK(iflow_sampler_params_set(&p, "mirostat", "0") == 0 && p.kind == IFLOW_SAMPLER_CHAIN, "mirostat 0");
    CHECK(iflow_sampler_params_set(&p, "--temp", "-1") == IFLOW_EINVAL, "bad temp");
    CHECK(strcmp(iflow_errmsg(), "invalid value '-1' for --temp (a number from 0 to 100)") == 0, "message: %s",
          iflow_errmsg());
    CHECK(iflow_sampler_params_set(&p, "top_k", "ten") == IFLOW_EINVAL, "bad top_k");
    CHECK(strcmp(iflow_errmsg(), "invalid value 'ten' for top_k (an integer from -1 to 16777216)") == 0, "message: %s",
          iflow_errmsg());
    /* vLLM's names and values: repetition_penalty (HF's too), top_k -1 for all */
    CHECK(iflow_sampler_params_set(&p, "repetition_penalty", "1.3") == 0 && p.repeat_penalty == 1.3f,
          "repetition_penalty");
    CHECK(iflow_sampler_params_set(&p, "top_k", "-1") == 0 && p.top_k == -1, "top_k -1");
    {
        iflow_sampler_params a = {.temp = 1, .top_k = -1}, z = {.temp = 1, .top_k = 0};
        iflow_sampler *sa, *sz;
        float pa[V], pz[V];
        int ok = iflow_sampler_open(&sa, &a, V) == 0 && iflow_sampler_open(&sz, &z, V) == 0;
        ok = ok && iflow_sampler_dist(sa, L8, pa) == 0 && iflow_sampler_dist(sz, L8, pz) == 0;
        CHECK(ok && !memcmp(pa, pz, sizeof pa), "top_k -1 draws from the whole vocabulary, as 0 does");
        iflow_sampler_close(sa);
        iflow_sampler_close(sz);
    }
    CHECK(iflow_sampler_params_set(&p, "min_p", "nan") == IFLOW_EINVAL, "nan min_p");
    CHECK(iflow_sampler_params_set(&p, "seed", "-3") == IFLOW_EINVAL, "negative seed");
    CHECK(iflow_sampler_params_set(&p, "top_q", "1") == IFLOW_EINVAL, "unknown name");
    CHECK(strncmp(iflow_errmsg(), "unknown sampling parameter 'top_q' (expected sampler, temperature, top_k,", 70) == 0,
          "message: %s", iflow_errmsg());
    CHECK(iflow_sampler_params_set(&p, "sampler", "beam") == IFLOW_EINVAL, "unknown sampler");
    CHECK(strstr(iflow_errmsg(), "unknown sampler 'beam' for sampler (chain, greedy,") == iflow_errmsg(), "message: %s",
          iflow_errmsg());

    /* presets: a cut's name keeps it alone; set_all applies the preset first */
    iflow_sampler_params_default(&p);
    const char *names[] = {"--min-p", "--sampler", "--top-k"}, *values[] = {"0.2", "min-p", "7"};
    CHECK(iflow_sampler_params_set_all(&p, names, values, 3) == 0, "set_all");
    CHECK(p.kind == IFLOW_SAMPLER_CHAIN && p.min_p == 0.2f && p.top_k == 7 && p.top_p == 0, "min-p preset (%g %d %g)",
          p.min_p, p.top_k, p.top_p);
    iflow_sampler_params_default(&p);
    CHECK(iflow_sampler_params_set(&p, "sampler", "min-p") == 0 && p.min_p == 0.05f && p.top_k == 0, "min-p default");
    CHECK(iflow_sampler_params_set(&p, "sampler", "top_p") == 0 && p.min_p == 0 && p.top_p == 0.95f, "top_p preset");
    CHECK(iflow_sampler_params_set(&p, "sampler", "tfs") == 0 && p.top_p == 0 && p.tfs_z == 0.95f, "tfs preset");
    CHECK(iflow_sampler_params_set(&p, "sampler", "rfsd") == 0 && p.kind == IFLOW_SAMPLER_RFSD, "rfsd");
    CHECK(strcmp(iflow_sampler_kind_name(IFLOW_SAMPLER_MIROSTAT2), "mirostat2") == 0, "kind name");

    /* describe and is_greedy */
    iflow_sampler_params_default(&p);
    p.min_p = 0.05f;
    iflow_sampler *s;
    char buf[256];
    CHECK(iflow_sampler_open(&s, &p, V) == 0, "open");
    CHECK(strcmp(iflow_sampler_describe(s, buf, sizeof buf), "top-k 40 -> top-p 0.95 -> min-p 0.05 -> temp 0.8 -> draw") == 0,
          "describe: %s", buf);
    CHECK(!iflow_sampler_is_greedy(s), "sampling is not greedy");
    iflow_sampler_close(s);
    p.temp = 0;
    CHECK(iflow_sampler_open(&s, &p, V) == 0, "open");
    CHECK(iflow_sampler_is_greedy(s) && strcmp(iflow_sampler_describe(s, buf, sizeof buf), "greedy") == 0, "temp 0: %s",
          buf);
    iflow_sampler_close(s);
    iflow_sampler_params bad = {.temp = -1};
    CHECK(iflow_sampler_open(&s, &bad, V) == IFLOW_EINVAL && !s, "negative temperature refused");
}

int main(void)
{
    RUN(test_softmax_sort);
    RUN(test_temperature);
    RUN(test_greedy);
    RUN(test_top_k);
    RUN(test_top_p);
    RUN(test_min_p);
    RUN(test_typical);
    RUN(test_tail_free);
    RUN(test_penalties);
    RUN(test_bias);
    RUN(test_allow_and_ban);
    RUN(test_mirostat);
    RUN(test_antilm);
    RUN(test_fsd);
    RUN(test_seeds);
    RUN(test_params);
    return check_summary("test_sampler");
}
