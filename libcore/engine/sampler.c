/* sampler.c -- see sampler.h. */
#include "sampler.h"
#include "libcore/base/error.h"

#include <math.h>
#include <stdlib.h>

typedef struct { float p; int32_t id; } cand;

struct iflow_sampler {
    iflow_sampler_params p;
    int n_vocab;
    uint64_t st[4];     /* xoshiro256** state */
    cand *c;            /* [n_vocab] */
};

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(iflow_sampler *s)
{
    uint64_t *t = s->st, r = rotl(t[1] * 5, 7) * 9, u = t[1] << 17;
    t[2] ^= t[0], t[3] ^= t[1], t[1] ^= t[2], t[0] ^= t[3], t[2] ^= u, t[3] = rotl(t[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(iflow_sampler *s) { return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int iflow_sampler_open(iflow_sampler **out, const iflow_sampler_params *p, int n_vocab)
{
    *out = NULL;
    if (!(p->temp >= 0) || n_vocab <= 0 || !(p->top_p > 0))
        return iflow_seterr(IFLOW_EINVAL, "bad sampling parameters (temp %g, top-p %g)", p->temp, p->top_p);
    iflow_sampler *s = calloc(1, sizeof *s);
    if (!s || !(s->c = malloc((size_t)n_vocab * sizeof *s->c))) {
        free(s);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    s->p = *p;
    s->n_vocab = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->st[i] = splitmix(&x);
    *out = s;
    return 0;
}

void iflow_sampler_close(iflow_sampler *s)
{
    if (s)
        free(s->c);
    free(s);
}

int32_t iflow_argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static int by_prob_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p < y->p ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int32_t iflow_sampler_sample(iflow_sampler *s, const float *logits)
{
    if (s->p.temp == 0)
        return iflow_argmax(logits, s->n_vocab);
    int n = s->n_vocab;
    float mx = logits[iflow_argmax(logits, n)];
    for (int i = 0; i < n; i++)
        s->c[i] = (cand){expf((logits[i] - mx) / s->p.temp), i};
    qsort(s->c, (size_t)n, sizeof *s->c, by_prob_desc);
    if (s->p.top_k > 0 && s->p.top_k < n)
        n = s->p.top_k;
    double total = 0;
    for (int i = 0; i < n; i++)
        total += s->c[i].p;
    if (s->p.top_p < 1) {
        double mass = 0;
        for (int i = 0; i < n; i++) {
            mass += s->c[i].p;
            if (mass >= s->p.top_p * total) {
                n = i + 1;
                total = mass;
                break;
            }
        }
    }
    double r = next_unit(s) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->c[i].p;
        if (r < acc)
            return s->c[i].id;
    }
    return s->c[n - 1].id;
}
