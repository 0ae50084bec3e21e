/* sampler.c -- see sampler.h. */
#include "sampler.h"
#include "logits.h"
#include "libcore/base/error.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A bias added to one token's logit while fewer than `until` tokens are accepted (< 0: always). */
typedef struct {
    int32_t id;
    float bias;
    int until;
} bias_entry;

/* A banned sequence (a bad word's tokens): ban_ids[off + len - 1] is banned wherever the tokens
 * accepted from hist[from] on end with ban_ids[off .. off + len - 1). */
typedef struct {
    int off, len, from;
} ban_entry;

struct iflow_sampler {
    iflow_sampler_params p; /* defaults filled in */
    int n_vocab;
    bias_entry *bias;       /* [n_bias] in the order added */
    int n_bias, cap_bias;
    uint8_t *allowed;       /* [n_vocab] 1: may be drawn; NULL: every token may */
    int n_allowed;
    ban_entry *ban;         /* [n_ban] */
    int n_ban, cap_ban;
    int32_t *ban_ids;       /* [n_ban_ids] the sequences' tokens, end to end */
    int n_ban_ids, cap_ban_ids;
    uint64_t st[4];         /* xoshiro256** state */
    iflow_cand *c;          /* [n_vocab] scratch */
    int32_t *hist;          /* [cap] accepted tokens */
    int n_hist, cap;
    float mu;               /* mirostat */
    long n_sampled;         /* samples since the last reset */
};

/* ---- the generator ---- */

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

/* ---- parameters by name ---- */

static const char *const kind_names[IFLOW_SAMPLER_KINDS_] = {"chain", "greedy", "mirostat", "mirostat2", "fsd", "rfsd"};

const char *iflow_sampler_kind_name(int kind)
{
    return kind >= 0 && kind < IFLOW_SAMPLER_KINDS_ ? kind_names[kind] : "unknown";
}

/* type: 'f' float, 'i' int, 'u' uint64, 's' the preset, 'm' mirostat 0/1/2 (sets kind). */
typedef struct {
    const char *name, *alias;
    char type;
    double min, max;
    size_t off;
} field;

#define F(name, alias, type, min, max, member) {name, alias, type, min, max, offsetof(iflow_sampler_params, member)}
static const field fields[] = {
    {"sampler", NULL, 's', 0, 0, 0},
    F("temperature", "temp", 'f', 0, 100, temp),
    F("top_k", NULL, 'i', -1, 1 << 24, top_k), /* 0 or -1 (vLLM's): off */
    F("top_p", NULL, 'f', 0, 1, top_p),
    F("min_p", NULL, 'f', 0, 1, min_p),
    F("typical_p", "typical", 'f', 0, 1, typical_p),
    F("tfs_z", "tfs", 'f', 0, 1, tfs_z),
    {"mirostat", NULL, 'm', 0, 2, 0},
    F("mirostat_tau", NULL, 'f', 0, 100, mirostat_tau),
    F("mirostat_eta", NULL, 'f', 0, 1, mirostat_eta),
    F("repeat_penalty", "repetition_penalty", 'f', 0, 100, repeat_penalty), /* the alias: vLLM's, HF's */
    F("repeat_last_n", NULL, 'i', -1, 1 << 24, repeat_last_n),
    F("frequency_penalty", NULL, 'f', -2, 2, frequency_penalty),
    F("presence_penalty", NULL, 'f', -2, 2, presence_penalty),
    F("fsd_alpha", NULL, 'f', 0, 1, fsd_alpha),
    F("fsd_k", NULL, 'i', 0, 1 << 24, fsd_k),
    F("fsd_n", NULL, 'i', 0, 16, fsd_n),
    F("fsd_beta", NULL, 'f', 0, 1, fsd_beta),
    F("fsd_random_steps", NULL, 'i', 0, 1 << 24, fsd_random_steps),
    F("seed", NULL, 'u', 0, 0, seed),
};
#define N_FIELDS (int)(sizeof fields / sizeof fields[0])

/* a equals b with the leading dashes of a skipped and '-' taken as '_'. */
static int same_name(const char *a, const char *b)
{
    if (!b)
        return 0;
    while (*a == '-')
        a++;
    for (; *a && *b; a++, b++)
        if (*a != *b && !((*a == '-' || *a == '_') && (*b == '-' || *b == '_')))
            return 0;
    return !*a && !*b;
}

static const field *find_field(const char *name)
{
    for (int i = 0; i < N_FIELDS; i++)
        if (same_name(name, fields[i].name) || same_name(name, fields[i].alias))
            return &fields[i];
    return NULL;
}

int iflow_sampler_param_known(const char *name) { return name && find_field(name) != NULL; }

void iflow_sampler_params_default(iflow_sampler_params *p)
{
    *p = (iflow_sampler_params){.temp = 0.8f, .top_k = 40, .top_p = 0.95f};
}

/* A preset: a cut's name keeps that cut alone. */
static int set_preset(iflow_sampler_params *p, const char *name, const char *v)
{
    static const char *const cuts[] = {"top-k", "top-p", "min-p", "typical", "tfs"};
    for (int k = 0; k < IFLOW_SAMPLER_KINDS_; k++)
        if (same_name(v, kind_names[k])) {
            p->kind = k;
            return 0;
        }
    for (int c = 0; c < 5; c++) {
        if (!same_name(v, cuts[c]))
            continue;
        iflow_sampler_params q = *p;
        p->kind = IFLOW_SAMPLER_CHAIN;
        p->top_k = c == 0 ? (q.top_k > 0 ? q.top_k : 40) : 0;
        p->top_p = c == 1 ? (q.top_p > 0 && q.top_p < 1 ? q.top_p : 0.95f) : 0;
        p->min_p = c == 2 ? (q.min_p > 0 ? q.min_p : 0.05f) : 0;
        p->typical_p = c == 3 ? (q.typical_p > 0 && q.typical_p < 1 ? q.typical_p : 0.95f) : 0;
        p->tfs_z = c == 4 ? (q.tfs_z > 0 && q.tfs_z < 1 ? q.tfs_z : 0.95f) : 0;
        return 0;
    }
    return iflow_seterr(IFLOW_EINVAL,
                        "unknown sampler '%s' for %s (chain, greedy, top-k, top-p, min-p, typical, tfs, mirostat, "
                        "mirostat2, fsd, rfsd)",
                        v, name);
}

int iflow_sampler_params_set(iflow_sampler_params *p, const char *name, const char *v)
{
    if (!name || !v)
        return iflow_seterr(IFLOW_EINVAL, "sampling parameter %s has no %s", name ? name : "(null)", name ? "value" : "name");
    const field *f = find_field(name);
    if (!f) {
        char list[512];
        int n = 0;
        for (int i = 0; i < N_FIELDS && n < (int)sizeof list; i++)
            n += snprintf(list + n, sizeof list - (size_t)n, "%s%s", i ? ", " : "", fields[i].name);
        return iflow_seterr(IFLOW_EINVAL, "unknown sampling parameter '%s' (expected %s)", name, list);
    }
    if (f->type == 's')
        return set_preset(p, name, v);
    char *end;
    errno = 0;
    if (f->type == 'u') {
        unsigned long long u = strtoull(v, &end, 10);
        if (!*v || *end || errno || *v == '-')
            return iflow_seterr(IFLOW_EINVAL, "invalid value '%s' for %s (a non-negative integer)", v, name);
        *(uint64_t *)((char *)p + f->off) = u;
        return 0;
    }
    if (f->type == 'f') {
        double d = strtod(v, &end);
        if (!*v || *end || errno || !(d >= f->min && d <= f->max))
            return iflow_seterr(IFLOW_EINVAL, "invalid value '%s' for %s (a number from %g to %g)", v, name, f->min,
                                f->max);
        *(float *)((char *)p + f->off) = (float)d;
        return 0;
    }
    long l = strtol(v, &end, 10);
    if (!*v || *end || errno || l < f->min || l > f->max)
        return iflow_seterr(IFLOW_EINVAL, "invalid value '%s' for %s (an integer from %ld to %ld)", v, name,
                            (long)f->min, (long)f->max);
    if (f->type == 'm') {
        if (l)
            p->kind = l == 1 ? IFLOW_SAMPLER_MIROSTAT : IFLOW_SAMPLER_MIROSTAT2;
        else if (p->kind == IFLOW_SAMPLER_MIROSTAT || p->kind == IFLOW_SAMPLER_MIROSTAT2)
            p->kind = IFLOW_SAMPLER_CHAIN;
        return 0;
    }
    *(int *)((char *)p + f->off) = (int)l;
    return 0;
}

int iflow_sampler_params_set_all(iflow_sampler_params *p, const char *const *names, const char *const *values, int n)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            const field *f = find_field(names[i]);
            if ((f && f->type == 's') != (pass == 0))
                continue;
            int rc = iflow_sampler_params_set(p, names[i], values[i]);
            if (rc < 0)
                return rc;
        }
    return 0;
}

/* ---- the sampler ---- */

int iflow_sampler_open(iflow_sampler **out, const iflow_sampler_params *p, int n_vocab)
{
    *out = NULL;
    if (!(p->temp >= 0) || !(p->top_p >= 0) || !(p->min_p >= 0 && p->min_p <= 1) || !(p->typical_p >= 0) ||
        !(p->tfs_z >= 0) || p->kind < 0 || p->kind >= IFLOW_SAMPLER_KINDS_ || p->repeat_last_n < -1 ||
        p->fsd_k < 0 || p->fsd_n < 0 || p->fsd_random_steps < 0 || !(p->mirostat_tau >= 0) ||
        !(p->mirostat_eta >= 0) || !(p->repeat_penalty >= 0) || !(p->fsd_alpha >= 0 && p->fsd_alpha <= 1) ||
        !(p->fsd_beta >= 0 && p->fsd_beta <= 1) || n_vocab <= 0)
        return iflow_seterr(IFLOW_EINVAL, "bad sampling parameters (temp %g, top-p %g, min-p %g, kind %d)", p->temp,
                            p->top_p, p->min_p, p->kind);
    iflow_sampler *s = calloc(1, sizeof *s);
    if (!s || !(s->c = malloc((size_t)n_vocab * sizeof *s->c))) {
        free(s);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    s->p = *p;
    iflow_sampler_params *q = &s->p;
    if (q->mirostat_tau == 0)
        q->mirostat_tau = 5;
    if (q->mirostat_eta == 0)
        q->mirostat_eta = 0.1f;
    if (q->repeat_penalty == 0)
        q->repeat_penalty = 1;
    if (q->repeat_last_n == 0)
        q->repeat_last_n = 64;
    if (q->fsd_alpha == 0)
        q->fsd_alpha = 0.65f;
    if (q->fsd_k == 0)
        q->fsd_k = 3;
    if (q->fsd_n == 0)
        q->fsd_n = 3;
    if (q->fsd_beta == 0)
        q->fsd_beta = 0.9f;
    s->n_vocab = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->st[i] = splitmix(&x);
    iflow_sampler_reset(s);
    *out = s;
    return 0;
}

void iflow_sampler_close(iflow_sampler *s)
{
    if (s) {
        free(s->c);
        free(s->hist);
        free(s->bias);
        free(s->allowed);
        free(s->ban);
        free(s->ban_ids);
    }
    free(s);
}

void iflow_sampler_reset(iflow_sampler *s)
{
    s->n_hist = 0;
    for (int i = 0; i < s->n_ban; i++)
        s->ban[i].from = 0;
    s->mu = 2 * s->p.mirostat_tau;
    s->n_sampled = 0;
}

int iflow_sampler_accept(iflow_sampler *s, int32_t token)
{
    if (token < 0 || token >= s->n_vocab)
        return iflow_seterr(IFLOW_ERANGE, "token %d is outside the vocabulary of %d", token, s->n_vocab);
    if (s->n_hist == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        int32_t *h = realloc(s->hist, (size_t)cap * sizeof *h);
        if (!h)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        s->hist = h, s->cap = cap;
    }
    s->hist[s->n_hist++] = token;
    return 0;
}

int iflow_sampler_add_bias(iflow_sampler *s, int32_t id, float bias, int until)
{
    if (id < 0 || id >= s->n_vocab)
        return iflow_seterr(IFLOW_ERANGE, "logit bias of token %d, outside the vocabulary of %d", id, s->n_vocab);
    if (isnan(bias) || bias == INFINITY)
        return iflow_seterr(IFLOW_EINVAL, "logit bias %g of token %d: a number, or -inf to ban it", bias, id);
    if (s->n_bias == s->cap_bias) {
        int cap = s->cap_bias ? 2 * s->cap_bias : 8;
        bias_entry *b = realloc(s->bias, (size_t)cap * sizeof *b);
        if (!b)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        s->bias = b, s->cap_bias = cap;
    }
    s->bias[s->n_bias++] = (bias_entry){id, bias, until};
    return 0;
}

int iflow_sampler_allow(iflow_sampler *s, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->n_vocab)
            return iflow_seterr(IFLOW_ERANGE, "allowed token %d is outside the vocabulary of %d", ids[i], s->n_vocab);
    if (n <= 0) {
        free(s->allowed);
        s->allowed = NULL, s->n_allowed = 0;
        return 0;
    }
    if (!s->allowed && !(s->allowed = malloc((size_t)s->n_vocab)))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    memset(s->allowed, 0, (size_t)s->n_vocab);
    s->n_allowed = 0;
    for (int i = 0; i < n; i++) {
        s->n_allowed += !s->allowed[ids[i]];
        s->allowed[ids[i]] = 1;
    }
    return 0;
}

int iflow_sampler_ban_sequence(iflow_sampler *s, const int32_t *ids, int n)
{
    if (n <= 0)
        return iflow_seterr(IFLOW_EINVAL, "a banned sequence of %d tokens: at least 1", n);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->n_vocab)
            return iflow_seterr(IFLOW_ERANGE, "banned token %d is outside the vocabulary of %d", ids[i], s->n_vocab);
    if (s->n_ban == s->cap_ban) {
        int cap = s->cap_ban ? 2 * s->cap_ban : 8;
        ban_entry *b = realloc(s->ban, (size_t)cap * sizeof *b);
        if (!b)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        s->ban = b, s->cap_ban = cap;
    }
    if (s->n_ban_ids + n > s->cap_ban_ids) {
        int cap = 2 * (s->n_ban_ids + n) + 16;
        int32_t *t = realloc(s->ban_ids, (size_t)cap * sizeof *t);
        if (!t)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        s->ban_ids = t, s->cap_ban_ids = cap;
    }
    memcpy(s->ban_ids + s->n_ban_ids, ids, (size_t)n * sizeof *ids);
    s->ban[s->n_ban++] = (ban_entry){s->n_ban_ids, n, s->n_hist};
    s->n_ban_ids += n;
    return 0;
}

void iflow_sampler_clear_bias(iflow_sampler *s)
{
    s->n_bias = 0;
    free(s->allowed);
    s->allowed = NULL, s->n_allowed = 0;
    s->n_ban = s->n_ban_ids = 0;
}

static int has_penalties(const iflow_sampler_params *p)
{
    return p->repeat_penalty != 1 || p->frequency_penalty != 0 || p->presence_penalty != 0;
}

int iflow_sampler_is_greedy(const iflow_sampler *s)
{
    int k = s->p.kind;
    return !has_penalties(&s->p) && !s->n_bias && !s->allowed && !s->n_ban &&
           (k == IFLOW_SAMPLER_GREEDY ||
            (s->p.temp == 0 && (k == IFLOW_SAMPLER_CHAIN || k == IFLOW_SAMPLER_MIROSTAT || k == IFLOW_SAMPLER_MIROSTAT2)));
}

int32_t iflow_argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* 1 when ban b is in force: the tokens accepted since it began end with its sequence's head. */
static int ban_applies(const iflow_sampler *s, const ban_entry *b)
{
    int head = b->len - 1;
    if (head == 0)
        return 1;
    return s->n_hist - b->from >= head &&
           memcmp(s->hist + s->n_hist - head, s->ban_ids + b->off, (size_t)head * sizeof *s->hist) == 0;
}

/* The vocabulary as candidates, with the biases in force (first, as llama.cpp's chain), then the
 * tokens not allowed and those banned by a sequence at -inf, then the penalties of the recent
 * tokens applied. */
static void penalized(iflow_sampler *s, const float *logits, iflow_cands *cs)
{
    const iflow_sampler_params *p = &s->p;
    iflow_cands_init(cs, s->c, logits, s->n_vocab);
    for (int i = 0; i < s->n_bias; i++) /* the candidates are in id order still */
        if (s->bias[i].until < 0 || s->n_hist < s->bias[i].until)
            cs->c[s->bias[i].id].logit += s->bias[i].bias;
    for (int i = 0; s->allowed && i < s->n_vocab; i++)
        if (!s->allowed[i])
            cs->c[i].logit = -INFINITY;
    for (int i = 0; i < s->n_ban; i++)
        if (ban_applies(s, &s->ban[i]))
            cs->c[s->ban_ids[s->ban[i].off + s->ban[i].len - 1]].logit = -INFINITY;
    int w = p->repeat_last_n < 0 || p->repeat_last_n > s->n_hist ? s->n_hist : p->repeat_last_n;
    if (w > 0)
        iflow_cands_penalize(cs, s->hist + s->n_hist - w, w, p->repeat_penalty, p->frequency_penalty,
                             p->presence_penalty);
}

/* The chain's cuts, in order, then its temperature. */
static void chain_cuts(iflow_cands *cs, const iflow_sampler_params *p)
{
    iflow_cands_top_k(cs, p->top_k);
    iflow_cands_tail_free(cs, p->tfs_z);
    iflow_cands_typical(cs, p->typical_p);
    iflow_cands_top_p(cs, p->top_p);
    iflow_cands_min_p(cs, p->min_p);
    iflow_cands_temperature(cs, p->temp);
}

int32_t iflow_sampler_sample(iflow_sampler *s, const float *logits)
{
    const iflow_sampler_params *p = &s->p;
    s->n_sampled++;
    if (iflow_sampler_is_greedy(s))
        return iflow_argmax(logits, s->n_vocab);
    iflow_cands cs;
    penalized(s, logits, &cs);
    switch (p->kind) {
    case IFLOW_SAMPLER_GREEDY:
        return iflow_cands_greedy(&cs);
    case IFLOW_SAMPLER_MIROSTAT:
    case IFLOW_SAMPLER_MIROSTAT2:
        if (p->temp == 0)
            return iflow_cands_greedy(&cs);
        iflow_cands_temperature(&cs, p->temp);
        if (p->kind == IFLOW_SAMPLER_MIROSTAT)
            return iflow_cands_mirostat(&cs, p->mirostat_tau, p->mirostat_eta, 100, s->n_vocab, &s->mu, next_unit(s));
        return iflow_cands_mirostat2(&cs, p->mirostat_tau, p->mirostat_eta, &s->mu, next_unit(s));
    case IFLOW_SAMPLER_FSD:
    case IFLOW_SAMPLER_RFSD:
        iflow_cands_fsd(&cs, s->hist, s->n_hist, p->fsd_k, p->fsd_alpha, p->fsd_n, p->fsd_beta);
        if (p->kind == IFLOW_SAMPLER_RFSD && (p->fsd_random_steps == 0 || s->n_sampled <= p->fsd_random_steps))
            return iflow_cands_draw_scores(&cs, next_unit(s));
        return cs.c[0].id;
    default:
        if (p->temp == 0)
            return iflow_cands_greedy(&cs);
        chain_cuts(&cs, p);
        return iflow_cands_draw(&cs, next_unit(s));
    }
}

/* ---- for speculative decoding ---- */

int iflow_sampler_has_dist(const iflow_sampler *s)
{
    int k = s->p.kind;
    return k == IFLOW_SAMPLER_CHAIN || k == IFLOW_SAMPLER_GREEDY ||
           ((k == IFLOW_SAMPLER_MIROSTAT || k == IFLOW_SAMPLER_MIROSTAT2) && s->p.temp == 0);
}

int iflow_sampler_dist(iflow_sampler *s, const float *logits, float *probs)
{
    const iflow_sampler_params *p = &s->p;
    if (!iflow_sampler_has_dist(s))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "the %s sampler draws from no fixed distribution",
                            iflow_sampler_kind_name(p->kind));
    memset(probs, 0, (size_t)s->n_vocab * sizeof *probs);
    if (iflow_sampler_is_greedy(s)) {
        probs[iflow_argmax(logits, s->n_vocab)] = 1;
        return 0;
    }
    iflow_cands cs;
    penalized(s, logits, &cs);
    if (p->kind != IFLOW_SAMPLER_CHAIN || p->temp == 0) { /* greedy after the penalties */
        probs[iflow_cands_greedy(&cs)] = 1;
        return 0;
    }
    chain_cuts(&cs, p);
    iflow_cands_softmax(&cs);
    for (int i = 0; i < cs.n; i++)
        probs[cs.c[i].id] = cs.c[i].p;
    return 0;
}

double iflow_sampler_uniform(iflow_sampler *s) { return next_unit(s); }

/* Index at u of the cumulative sum of x [n] (>= 0), scaled to its total. */
static int32_t draw_dense(const float *x, int n, double u)
{
    double total = 0, acc = 0;
    for (int i = 0; i < n; i++)
        total += x[i];
    double r = u * total;
    int32_t last = 0;
    for (int i = 0; i < n; i++) {
        if (x[i] <= 0)
            continue;
        acc += x[i];
        last = i;
        if (r < acc)
            return i;
    }
    return last;
}

int32_t iflow_sampler_draw(iflow_sampler *s, const float *probs) { return draw_dense(probs, s->n_vocab, next_unit(s)); }

int iflow_sampler_n_accepted(const iflow_sampler *s) { return s->n_hist; }

void iflow_sampler_truncate(iflow_sampler *s, int n)
{
    if (n >= 0 && n < s->n_hist)
        s->n_hist = n;
    for (int i = 0; i < s->n_ban; i++) /* a ban begun among the tokens forgotten begins where they did */
        if (s->ban[i].from > s->n_hist)
            s->ban[i].from = s->n_hist;
}

int32_t iflow_spec_verify(const float *p, const float *q, int n, int32_t d, double u_accept, double u_draw, int top_k,
                          float top_p, int *accepted)
{
    double sp = 0, sq = 0;
    for (int i = 0; i < n; i++)
        sp += p[i], sq += q[i];
    if (top_k > 0 || top_p > 0) { /* tokens ahead of d under p: more probable, or as probable with a lower id */
        int rank = 0;
        double ahead = 0;
        for (int i = 0; i < n; i++)
            if (p[i] > p[d] || (p[i] == p[d] && i < d))
                rank++, ahead += p[i] / sp;
        *accepted = (top_k <= 0 || rank < top_k) && (top_p <= 0 || ahead < top_p);
        return *accepted ? d : iflow_argmax(p, n);
    }
    double pd = p[d] / sp, qd = sq > 0 ? q[d] / sq : 0;
    *accepted = qd > 0 && u_accept * qd < pd; /* u < min(1, pd / qd) */
    if (*accepted)
        return d;
    /* the residual max(0, p - q), drawn without building it: two passes over n */
    double total = 0;
    for (int i = 0; i < n; i++) {
        double r = p[i] / sp - (sq > 0 ? q[i] / sq : 0);
        total += r > 0 ? r : 0;
    }
    if (!(total > 0)) /* p == q: nothing left over; p itself */
        return draw_dense(p, n, u_draw);
    double target = u_draw * total, acc = 0;
    int32_t last = 0;
    for (int i = 0; i < n; i++) {
        double r = p[i] / sp - (sq > 0 ? q[i] / sq : 0);
        if (r <= 0)
            continue;
        acc += r;
        last = i;
        if (target < acc)
            return i;
    }
    return last;
}

const char *iflow_sampler_describe(const iflow_sampler *s, char *buf, int cap)
{
    const iflow_sampler_params *p = &s->p;
    int n = 0;
#define ADD(...) (n += snprintf(buf + n, n < cap ? (size_t)(cap - n) : 0, __VA_ARGS__))
    buf[0] = 0;
    if (s->n_bias)
        ADD("logit bias (%d) -> ", s->n_bias);
    if (s->allowed)
        ADD("allowed (%d) -> ", s->n_allowed);
    if (s->n_ban)
        ADD("banned sequences (%d) -> ", s->n_ban);
    if (has_penalties(p)) {
        char last[16] = "all";
        if (p->repeat_last_n >= 0)
            snprintf(last, sizeof last, "%d", p->repeat_last_n);
        ADD("penalties (repeat %g, frequency %g, presence %g, last %s) -> ", p->repeat_penalty, p->frequency_penalty,
            p->presence_penalty, last);
    }
    int k = p->kind;
    if (k == IFLOW_SAMPLER_GREEDY || (p->temp == 0 && k != IFLOW_SAMPLER_FSD && k != IFLOW_SAMPLER_RFSD))
        ADD("greedy");
    else if (k == IFLOW_SAMPLER_MIROSTAT || k == IFLOW_SAMPLER_MIROSTAT2) {
        ADD("temp %g -> %s (tau %g, eta %g)", p->temp, kind_names[k], p->mirostat_tau, p->mirostat_eta);
    } else if (k == IFLOW_SAMPLER_FSD || k == IFLOW_SAMPLER_RFSD) {
        ADD("%s (alpha %g, k %d, n %d, beta %g", kind_names[k], p->fsd_alpha, p->fsd_k, p->fsd_n, p->fsd_beta);
        if (k == IFLOW_SAMPLER_RFSD && p->fsd_random_steps)
            ADD(", random for %d steps", p->fsd_random_steps);
        ADD(")");
    } else {
        if (p->top_k > 0)
            ADD("top-k %d -> ", p->top_k);
        if (p->tfs_z > 0 && p->tfs_z < 1)
            ADD("tfs %g -> ", p->tfs_z);
        if (p->typical_p > 0 && p->typical_p < 1)
            ADD("typical %g -> ", p->typical_p);
        if (p->top_p > 0 && p->top_p < 1)
            ADD("top-p %g -> ", p->top_p);
        if (p->min_p > 0)
            ADD("min-p %g -> ", p->min_p);
        ADD("temp %g -> draw", p->temp);
    }
#undef ADD
    return buf;
}
