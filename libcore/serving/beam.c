/* beam.c -- beam search over a paged KV cache with shared prefixes, or over an encoder-decoder's
 * sequences. See beam.h. */
#include "libcore/serving/beam.h"
#include "libcore/base/error.h"
#include "libcore/engine/seq2seq.h"
#include "libcore/engine/stop.h"
#include "libcore/serving/batch.h"
#include "libcore/tokenizers/tokenizer.h"
#include "kernels/cpu/kvcache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 16

/* A hypothesis: generated tokens (the last one not yet in the cache while it is live), the
 * blocks that hold its positions. */
typedef struct {
    int32_t *table;               /* [max_tab] block ids (n_past positions, and room)         */
    int32_t *tokens;              /* [max_tokens]                                            */
    int n_tokens, n_past;
    double logprob;
    int32_t eos;                  /* the end-of-sequence token that ended it, or -1          */
    /* stop strings */
    char *held;                   /* [n_held] the text's tail that may begin a stop string   */
    size_t n_held;
    size_t emitted;               /* bytes of text before the held tail (before the stop
                                   * string once one is found)                               */
    int stop_index;               /* the stop string found, or -1                            */
} hyp;

typedef struct search search;

/* Where the hypotheses' keys and values live: a decoder's paged KV cache, whose blocks a fork
 * shares (copied when written), or an encoder-decoder's sequences, one each (a fork copies it;
 * table[0] names it). */
typedef struct {
    int  (*prefill)(search *s, hyp *h, const int32_t *prompt, int n, float *logits);
    int  (*feed)(search *s, hyp *live, int n, float *logits);   /* each live hypothesis's last token */
    int  (*fork)(search *s, hyp *child, const hyp *parent);     /* child's cache = parent's         */
    void (*release)(search *s, hyp *h);
} cache_ops;

struct search {
    const iflow_model *m;
    const cache_ops *ops;
    iflow_kv *kv;
    iflow_ctx *ctx;
    iflow_s2s *s2s;               /* an encoder-decoder's sequences (ops s2s_ops), or NULL      */
    int max_tab, n_blocks;        /* blocks; an encoder-decoder's: sequences                  */
    int32_t *free_ids;            /* [n_blocks] a stack */
    int n_free;
    int *ref;                     /* [n_blocks] hypotheses holding each block */
    const iflow_tokenizer *tok;   /* NULL: no text (and no stop string can match)  */
    char *piece;                  /* [max_piece]: a token's bytes, with tok          */
    size_t max_piece;
    iflow_stop *stop;             /* the stop strings' matcher, or NULL            */
    int starts;                   /* the generated tokens start the text (a lone BOS prompt) */
    int adapter;                  /* the model's adapter every step computes with (0: none)  */
};

typedef struct {
    int beam;
    int32_t token;
    double logprob;
} cand;

static int take_block(search *s)
{
    if (s->n_free == 0)
        return iflow_seterr(IFLOW_ERANGE, "beam search ran out of KV blocks");
    int b = s->free_ids[--s->n_free];
    s->ref[b] = 1;
    return b;
}

static void drop_block(search *s, int b)
{
    if (--s->ref[b] == 0)
        s->free_ids[s->n_free++] = b;
}

static void hyp_release(search *s, hyp *h)
{
    if (h->table)
        s->ops->release(s, h);
    free(h->table);
    free(h->tokens);
    free(h->held);
    memset(h, 0, sizeof *h);
}

static int hyp_alloc(hyp *h, int max_tab, int max_tokens)
{
    h->table = malloc((size_t)max_tab * sizeof *h->table);
    h->tokens = malloc((size_t)(max_tokens > 0 ? max_tokens : 1) * sizeof *h->tokens);
    return h->table && h->tokens ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
}

/* Child of parent extended by token (parent's blocks shared). */
static int hyp_fork(search *s, hyp *child, const hyp *parent, int32_t token, double logprob, int max_tokens)
{
    if (hyp_alloc(child, s->max_tab, max_tokens) < 0 || s->ops->fork(s, child, parent) < 0)
        return -1;
    memcpy(child->tokens, parent->tokens, (size_t)parent->n_tokens * sizeof *child->tokens);
    child->tokens[parent->n_tokens] = token;
    child->n_tokens = parent->n_tokens + 1;
    child->logprob = logprob;
    child->eos = -1;
    return 0;
}

/* ---- a decoder's paged KV cache: blocks shared by forks ---- */

static void kv_release(search *s, hyp *h)
{
    for (int i = 0; i < (h->n_past + BLOCK - 1) / BLOCK; i++)
        drop_block(s, h->table[i]);
}

static int kv_fork(search *s, hyp *child, const hyp *parent)
{
    int nb = (parent->n_past + BLOCK - 1) / BLOCK;
    for (int i = 0; i < nb; i++)
        s->ref[child->table[i] = parent->table[i]]++;
    child->n_past = parent->n_past;
    return 0;
}

/* The block that position pos of h goes into, owned by h alone: a new one at a block
 * boundary, a copy of a shared one otherwise. */
static int own_block(search *s, hyp *h, int pos)
{
    int i = pos / BLOCK, b, rc;
    if (pos % BLOCK == 0) {
        if ((b = take_block(s)) < 0)
            return b;
        h->table[i] = b;
        return 0;
    }
    if (s->ref[h->table[i]] == 1)
        return 0;
    if ((b = take_block(s)) < 0)
        return b;
    if ((rc = iflow_kv_copy_block(s->kv, b, h->table[i])) < 0) {
        drop_block(s, b);
        return rc;
    }
    drop_block(s, h->table[i]);
    h->table[i] = b;
    return 0;
}

/* log_softmax of logits [V] in place into lp (double). */
static void log_softmax(double *lp, const float *logits, int V)
{
    double mx = logits[0], sum = 0;
    for (int i = 1; i < V; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < V; i++)
        sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < V; i++)
        lp[i] = (double)logits[i] - lse;
}

/* Higher log-probability first; ties: the lower beam, then the lower token. */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logprob != y->logprob)
        return x->logprob > y->logprob ? -1 : 1;
    if (x->beam != y->beam)
        return x->beam - y->beam;
    return (x->token > y->token) - (x->token < y->token);
}

/* The k best tokens of beam `beam` (log-probs lp [V], the beam's sum base) appended to cs. */
static int top_tokens(cand *cs, int n, const double *lp, int V, int k, int beam, double base)
{
    int n0 = n;
    for (int t = 0; t < V; t++) {
        cand c = {beam, t, base + lp[t]};
        if (n - n0 < k) {
            cs[n++] = c;
        } else {
            int worst = n0; /* replace the worst kept if t beats it */
            for (int i = n0 + 1; i < n; i++)
                if (cand_cmp(&cs[i], &cs[worst]) > 0)
                    worst = i;
            if (cand_cmp(&c, &cs[worst]) < 0)
                cs[worst] = c;
        }
    }
    return n;
}

static double score_of(double logprob, int length, float lp)
{
    return lp == 0 ? logprob : logprob / pow((double)(length > 0 ? length : 1), lp);
}

static int beam_score_cmp(const void *a, const void *b)
{
    const iflow_beam *x = a, *y = b;
    return x->score > y->score ? -1 : x->score < y->score;
}

/* A hypothesis that ended into the results (its tokens taken over). */
static int finish_hyp(iflow_beam **res, int *n_res, int *cap, hyp *h, int why, float lp)
{
    if (*n_res == *cap) {
        int c = *cap ? 2 * *cap : 16;
        iflow_beam *r = realloc(*res, (size_t)c * sizeof *r);
        if (!r)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        *res = r, *cap = c;
    }
    iflow_beam *b = &(*res)[(*n_res)++];
    int length = h->n_tokens + (h->eos >= 0); /* an ending EOS counts (forced at a limit too) */
    *b = (iflow_beam){.tokens = h->tokens, .n_tokens = h->n_tokens, .logprob = h->logprob,
                      .score = score_of(h->logprob, length, lp), .finish = why, .eos = h->eos,
                      .stop_index = why == IFLOW_FINISH_STOP ? h->stop_index : -1,
                      .text_len = h->emitted}; /* until take() makes the text: where a stop cuts it */
    h->tokens = NULL;
    return 0;
}

/* The text of child, its parent par extended by its last token, through the stop strings'
 * matcher after par's held-back tail: 1 if it now completes a stop string (child->emitted: the
 * bytes before it; child->stop_index: which), 0 if not (child holds back its own tail), < 0. */
static int match_stop(search *s, hyp *child, const hyp *par)
{
    const char *piece = s->piece;
    int32_t token = child->tokens[child->n_tokens - 1];
    int n = iflow_tokenizer_piece(s->tok, token, s->starts && par->n_tokens == 0, s->piece, s->max_piece);
    if (n < 0)
        return n;
    const char *e1, *e2;
    size_t n1, n2;
    iflow_stop_reset(s->stop);
    int hit = iflow_stop_feed(s->stop, par->held, par->n_held, &e1, &n1); /* 0: par would have stopped */
    if (hit == 0)
        hit = iflow_stop_feed(s->stop, piece, (size_t)n, &e2, &n2);
    if (hit < 0)
        return hit;
    child->emitted = par->emitted + n1 + n2;
    child->stop_index = hit ? iflow_stop_which(s->stop) : -1;
    size_t tail = par->n_held - n1 + (size_t)n - n2;
    if (hit || tail == 0)
        return hit;
    if (!(child->held = malloc(tail)))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    memcpy(child->held, e2 + n2, tail);
    child->n_held = tail;
    return 0;
}

/* Prefill the prompt into h (positions 0 .. n - 1); logits after the last token. */
static int kv_prefill(search *s, hyp *h, const int32_t *prompt, int n, float *logits)
{
    for (int p = 0, rc; p < n; p += IFLOW_MAX_STEP) {
        int k = n - p < IFLOW_MAX_STEP ? n - p : IFLOW_MAX_STEP;
        for (int q = p; q < p + k; q++)
            if (q % BLOCK == 0 && (rc = own_block(s, h, q)) < 0)
                return rc;
        iflow_step_seq seq = {.ids = prompt + p, .n = k, .pos0 = p, .table = h->table,
                              .logits = p + k == n ? logits : NULL, .adapter = s->adapter};
        if ((rc = iflow_ctx_step(s->ctx, s->kv, &seq, 1)) < 0)
            return rc;
        h->n_past = p + k;
    }
    return 0;
}

/* One forward step: every live beam's last token, each into a block of its own. */
static int kv_feed(search *s, hyp *live, int n, float *logits)
{
    const int V = iflow_model_hparams(s->m)->vocab_size;
    iflow_step_seq seqs[IFLOW_MAX_BEAMS];
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        hyp *h = &live[i];
        rc = own_block(s, h, h->n_past);
        seqs[i] = (iflow_step_seq){.ids = &h->tokens[h->n_tokens - 1], .n = 1, .pos0 = h->n_past, .table = h->table,
                                   .logits = logits + (size_t)i * V, .adapter = s->adapter};
    }
    if (rc == 0)
        rc = iflow_ctx_step(s->ctx, s->kv, seqs, n);
    for (int i = 0; i < n && rc == 0; i++)
        live[i].n_past++;
    return rc;
}

static const cache_ops kv_ops = {kv_prefill, kv_feed, kv_fork, kv_release};

/* ---- an encoder-decoder's sequences: one each, copied by a fork ---- */

static void s2s_release(search *s, hyp *h)
{
    if (h->n_past > 0)
        drop_block(s, h->table[0]);
}

static int s2s_fork(search *s, hyp *child, const hyp *parent)
{
    int q = take_block(s), rc;
    if (q < 0)
        return q;
    if ((rc = iflow_s2s_fork(s->s2s, q, parent->table[0])) < 0) {
        drop_block(s, q);
        return rc;
    }
    child->table[0] = q;
    child->n_past = parent->n_past;
    return 0;
}

/* decoder_start and the forced prefix in one step, into a sequence of h's own. */
static int s2s_prefill(search *s, hyp *h, const int32_t *prompt, int n, float *logits)
{
    const int V = iflow_model_hparams(s->m)->vocab_size;
    int seqs[IFLOW_MAX_STEP], q = take_block(s), rc;
    float *all = malloc((size_t)n * V * sizeof *all);
    if (q < 0 || !all) {
        free(all);
        return q < 0 ? q : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++)
        seqs[i] = q;
    h->table[0] = q;
    h->n_past = n;
    if ((rc = iflow_s2s_step(s->s2s, prompt, seqs, n, all)) == 0)
        memcpy(logits, all + (size_t)(n - 1) * V, (size_t)V * sizeof *logits);
    free(all);
    return rc;
}

static int s2s_feed(search *s, hyp *live, int n, float *logits)
{
    int32_t ids[IFLOW_MAX_BEAMS] = {0};
    int seqs[IFLOW_MAX_BEAMS] = {0};
    for (int i = 0; i < n; i++) {
        ids[i] = live[i].tokens[live[i].n_tokens - 1];
        seqs[i] = live[i].table[0];
    }
    int rc = iflow_s2s_step(s->s2s, ids, seqs, n, logits);
    for (int i = 0; i < n && rc == 0; i++)
        live[i].n_past++;
    return rc;
}

static const cache_ops s2s_ops = {s2s_prefill, s2s_feed, s2s_fork, s2s_release};

struct iflow_beam_run {
    search s;
    iflow_beam_params p;
    int n_ctx;
    int32_t *prompt;              /* [n_prompt] */
    int n_prompt;
    hyp live[IFLOW_MAX_BEAMS];
    int n_live, n_finished, started, done;
    float *logits;                /* [n_beams][vocab] after each live beam's last token */
    double *lp;                   /* [vocab] */
    cand *cs;                     /* [n_beams * 2 n_beams] */
    iflow_beam *res;              /* [n_res] finished hypotheses */
    int n_res, cap;
};

/* A run of prompt's search over n_ctx positions with `sr`'s cache (its ops, sizes and text
 * start), before the cache is opened. */
static int run_new(iflow_beam_run **out, const iflow_model *m, const int32_t *prompt, int n_prompt,
                   const iflow_beam_params *p, int n_ctx, const search *sr)
{
    const int W = p->n_beams, V = iflow_model_hparams(m)->vocab_size;
    *out = NULL;
    if (W < 1 || W > IFLOW_MAX_BEAMS || p->max_tokens < 1 || isnan(p->length_penalty))
        return iflow_seterr(IFLOW_EINVAL, "beam search: %d beams (1 to %d), %d tokens", W, IFLOW_MAX_BEAMS,
                            p->max_tokens);
    if (p->adapter < 0 || p->adapter > iflow_model_n_adapters(m))
        return iflow_seterr(IFLOW_EINVAL, "beam search: adapter %d of the model's %d", p->adapter,
                            iflow_model_n_adapters(m));
    if (n_prompt <= 0)
        return iflow_seterr(IFLOW_EINVAL, "the prompt has no tokens");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return iflow_seterr(IFLOW_ERANGE, "prompt token %d is id %d, outside the vocabulary (%d)", i, prompt[i], V);
    if (n_prompt >= n_ctx)
        return iflow_seterr(IFLOW_ERANGE, "the prompt of %d tokens does not fit the context of %d", n_prompt, n_ctx);
    iflow_beam_run *r = calloc(1, sizeof *r);
    if (!r)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    r->p = *p;
    r->n_ctx = n_ctx;
    r->s = *sr;
    r->s.m = m, r->s.tok = iflow_model_tokenizer(m);
    r->prompt = malloc((size_t)n_prompt * sizeof *r->prompt);
    r->n_prompt = n_prompt;
    r->logits = malloc((size_t)W * V * sizeof *r->logits);
    r->lp = malloc((size_t)V * sizeof *r->lp);
    r->cs = malloc((size_t)W * 2 * W * sizeof *r->cs);
    r->s.free_ids = malloc((size_t)r->s.n_blocks * sizeof *r->s.free_ids);
    r->s.ref = calloc((size_t)r->s.n_blocks, sizeof *r->s.ref);
    int rc = 0;
    if (!r->prompt || !r->logits || !r->lp || !r->cs || !r->s.free_ids || !r->s.ref)
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    if (rc == 0 && p->n_stop > 0 && r->s.tok)
        rc = iflow_stop_open(&r->s.stop, p->stop, p->n_stop);
    r->s.max_piece = r->s.tok ? iflow_tokenizer_max_piece(r->s.tok) : 0;
    if (rc == 0 && r->s.tok && !(r->s.piece = malloc(r->s.max_piece)))
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    if (rc == 0)
        rc = hyp_alloc(&r->live[0], r->s.max_tab, p->max_tokens);
    r->live[0].eos = -1;
    if (rc < 0) {
        iflow_beam_close(r);
        return rc;
    }
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    for (int i = 0; i < r->s.n_blocks; i++)
        r->s.free_ids[r->s.n_free++] = r->s.n_blocks - 1 - i;
    r->n_live = 1;
    *out = r;
    return 0;
}

int iflow_beam_open(iflow_beam_run **out, const iflow_model *m, const int32_t *prompt, int n_prompt,
                    const iflow_beam_params *p)
{
    const iflow_hparams *hp = iflow_model_hparams(m);
    int n_ctx = p->n_ctx > 0 && p->n_ctx <= hp->max_seq ? p->n_ctx : hp->max_seq, max_tab = (n_ctx + BLOCK - 1) / BLOCK;
    search sr = {.ops = &kv_ops, .max_tab = max_tab, .n_blocks = p->n_beams * (max_tab + 1) + 1,
                 .starts = n_prompt == 1 && prompt[0] == hp->bos, .adapter = p->adapter};
    int rc = run_new(out, m, prompt, n_prompt, p, n_ctx, &sr);
    if (rc == 0 && (rc = iflow_kv_open(&(*out)->s.kv, m, p->kv_type, BLOCK, (*out)->s.n_blocks)) == 0) {
        iflow_kv_set_context((*out)->s.kv, n_ctx); /* longrope: a beam's context, not the pool's */
        rc = iflow_ctx_open_steps(&(*out)->s.ctx, m, p->n_threads);
    }
    if (rc < 0 && *out) {
        iflow_beam_close(*out);
        *out = NULL;
    }
    return rc;
}

int iflow_beam_open_s2s(iflow_beam_run **out, const iflow_model *m, iflow_s2s *s2s, const int32_t *src, int n_src,
                        const int32_t *prefix, int n_prefix, const iflow_beam_params *p)
{
    int32_t prompt[IFLOW_MAX_STEP];
    *out = NULL;
    if (n_prefix < 0 || n_prefix + 1 > IFLOW_MAX_STEP)
        return iflow_seterr(IFLOW_ERANGE, "a forced prefix of %d tokens does not fit a step", n_prefix);
    if (iflow_s2s_n_seqs(s2s) < 2 * p->n_beams + 1)
        return iflow_seterr(IFLOW_EINVAL, "a beam search of %d beams needs a context of %d sequences, not %d",
                            p->n_beams, 2 * p->n_beams + 1, iflow_s2s_n_seqs(s2s));
    prompt[0] = iflow_model_hparams(m)->decoder_start;
    if (n_prefix > 0)
        memcpy(prompt + 1, prefix, (size_t)n_prefix * sizeof *prefix);
    /* a sequence per hypothesis: the live ones and their children while they fork */
    search sr = {.ops = &s2s_ops, .s2s = s2s, .max_tab = 1, .n_blocks = 2 * p->n_beams + 1, .starts = 1};
    int rc = run_new(out, m, prompt, n_prefix + 1, p, iflow_s2s_max_tgt(s2s), &sr);
    if (rc == 0 && (rc = iflow_s2s_encode(s2s, src, n_src)) < 0) {
        iflow_beam_close(*out);
        *out = NULL;
    }
    return rc;
}

/* The limit h's next token is the last one of (IFLOW_FINISH_LENGTH: max_tokens,
 * IFLOW_FINISH_CONTEXT: the context), or 0. */
static int last_allowed(const iflow_beam_run *r, const hyp *h)
{
    return h->n_tokens + 1 >= r->p.max_tokens ? IFLOW_FINISH_LENGTH : h->n_past >= r->n_ctx ? IFLOW_FINISH_CONTEXT : 0;
}

/* Live beam i's logits [V] for the ranking: banned tokens -inf, and at the last token a limit
 * allows the model's forced_eos forced (log-probability 0, as transformers'
 * ForcedEOSTokenLogitsProcessor); returns how an ending there finishes: the limit's code when
 * the model would have picked another token, IFLOW_FINISH_EOS when it picks that one anyway;
 * -1 when nothing was forced. */
static int beam_logits(iflow_beam_run *r, int i, float *logits, int V)
{
    const iflow_model *m = r->s.m;
    int limit = last_allowed(r, &r->live[i]), best = 0;
    iflow_model_ban(m, logits); /* before the softmax: renormalized */
    for (int t = 1; limit && t < V; t++)
        best = logits[t] > logits[best] ? t : best;
    if (!limit || !iflow_model_force_eos(m, logits))
        return -1;
    return best == iflow_model_hparams(m)->forced_eos ? IFLOW_FINISH_EOS : limit;
}

/* The live beams' 2W best extensions each, ranked together: the next live beams, and the
 * hypotheses that end (EOS or a stop string among the first W; max_tokens; the context). */
static int extend(iflow_beam_run *r)
{
    search *s = &r->s;
    const iflow_model *m = s->m;
    const int W = r->p.n_beams, V = iflow_model_hparams(m)->vocab_size;
    hyp next[IFLOW_MAX_BEAMS] = {{0}};
    int n_c = 0, n_next = 0, rc = 0, forced[IFLOW_MAX_BEAMS];
    for (int i = 0; i < r->n_live; i++) {
        forced[i] = beam_logits(r, i, r->logits + (size_t)i * V, V);
        log_softmax(r->lp, r->logits + (size_t)i * V, V);
        n_c = top_tokens(r->cs, n_c, r->lp, V, 2 * W < V ? 2 * W : V, i, r->live[i].logprob);
    }
    qsort(r->cs, (size_t)n_c, sizeof *r->cs, cand_cmp);
    for (int k = 0; k < n_c && n_next < W && rc == 0; k++) {
        const cand *c = &r->cs[k];
        const hyp *par = &r->live[c->beam];
        if (forced[c->beam] >= 0 && isinf(c->logprob)) /* the tokens forced_eos pushed out */
            continue;
        if (iflow_model_is_eos(m, c->token)) {
            if (k >= W)
                continue;
            hyp done = {.tokens = malloc((size_t)(par->n_tokens + 1) * sizeof *done.tokens),
                        .n_tokens = par->n_tokens, .logprob = c->logprob, .eos = c->token};
            if (!done.tokens) {
                rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
                break;
            }
            memcpy(done.tokens, par->tokens, (size_t)par->n_tokens * sizeof *done.tokens);
            rc = finish_hyp(&r->res, &r->n_res, &r->cap, &done, forced[c->beam] >= 0 ? forced[c->beam] : IFLOW_FINISH_EOS,
                            r->p.length_penalty);
            free(done.tokens); /* NULL once the results hold it */
            r->n_finished++;
            continue;
        }
        hyp *h = &next[n_next];
        if ((rc = hyp_fork(s, h, par, c->token, c->logprob, r->p.max_tokens)) == 0 && s->stop)
            rc = match_stop(s, h, par);
        if (rc == 0) {
            n_next++;
            continue;
        }
        if (rc == 1 && k < W) { /* a stop string: finished, as an EOS is */
            rc = finish_hyp(&r->res, &r->n_res, &r->cap, h, IFLOW_FINISH_STOP, r->p.length_penalty);
            r->n_finished++;
        } else if (rc == 1) {
            rc = 0;
        }
        hyp_release(s, h);
    }
    for (int i = 0; i < r->n_live; i++)
        hyp_release(s, &r->live[i]);
    memcpy(r->live, next, sizeof(hyp) * (size_t)n_next);
    r->n_live = n_next;
    /* beams that cannot grow end here */
    for (int i = 0; i < r->n_live && rc == 0;) {
        hyp *h = &r->live[i];
        int why = h->n_tokens == r->p.max_tokens ? IFLOW_FINISH_LENGTH : h->n_past >= r->n_ctx ? IFLOW_FINISH_CONTEXT : -1;
        if (why < 0) {
            i++;
            continue;
        }
        rc = finish_hyp(&r->res, &r->n_res, &r->cap, h, why, r->p.length_penalty);
        hyp_release(s, h);
        r->live[i] = r->live[--r->n_live];
        memset(&r->live[r->n_live], 0, sizeof r->live[r->n_live]);
    }
    if (r->n_finished >= W || r->n_live == 0)
        r->done = 1;
    return rc;
}


int iflow_beam_step(iflow_beam_run *r)
{
    int rc;
    if (r->done)
        return 0;
    if (!r->started) {
        r->started = 1;
        rc = r->s.ops->prefill(&r->s, &r->live[0], r->prompt, r->n_prompt, r->logits);
        return rc < 0 ? rc : 1;
    }
    if ((rc = extend(r)) < 0)
        return rc;
    if (r->done)
        return 0;
    return (rc = r->s.ops->feed(&r->s, r->live, r->n_live, r->logits)) < 0 ? rc : 1;
}

int iflow_beam_take(iflow_beam_run *r, iflow_beam **out, int *n_out)
{
    *out = NULL, *n_out = 0;
    if (!r->done)
        return iflow_seterr(IFLOW_EINVAL, "the beam search has not finished");
    const int W = r->p.n_beams, n = r->n_res < W ? r->n_res : W;
    qsort(r->res, (size_t)r->n_res, sizeof *r->res, beam_score_cmp);
    for (int i = W; i < r->n_res; i++)
        free(r->res[i].tokens);
    r->n_res = n;
    /* the texts, as a request's continuation: the first token starts the text when the prompt
     * is a lone BOS */
    const iflow_tokenizer *tok = r->s.tok;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        iflow_beam *b = &r->res[i];
        size_t cut = b->text_len; /* a stop string's place (finish_hyp) */
        if (tok)
            rc = iflow_tokenizer_continuation(tok, b->tokens, (size_t)b->n_tokens, r->s.starts, &b->text, &b->text_len);
        else if (!(b->text = calloc(1, 1)))
            rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
        if (rc == 0 && b->finish == IFLOW_FINISH_STOP && cut < b->text_len)
            b->text[b->text_len = cut] = 0;
    }
    if (rc < 0)
        return rc;
    *out = r->res;
    *n_out = n;
    r->res = NULL, r->n_res = r->cap = 0;
    return 0;
}

void iflow_beam_close(iflow_beam_run *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n_live; i++)
        hyp_release(&r->s, &r->live[i]);
    iflow_beams_free(r->res, r->n_res);
    iflow_stop_close(r->s.stop);
    free(r->s.piece);
    free(r->prompt), free(r->logits), free(r->lp), free(r->cs), free(r->s.free_ids), free(r->s.ref);
    iflow_ctx_close(r->s.ctx);
    iflow_kv_close(r->s.kv);
    free(r);
}

int iflow_beam_search(const iflow_model *m, const int32_t *prompt, int n_prompt, const iflow_beam_params *p,
                      iflow_beam **out, int *n_out)
{
    iflow_beam_run *r;
    *out = NULL, *n_out = 0;
    int rc = iflow_beam_open(&r, m, prompt, n_prompt, p);
    if (rc < 0)
        return rc;
    while ((rc = iflow_beam_step(r)) > 0)
        ;
    if (rc == 0)
        rc = iflow_beam_take(r, out, n_out);
    iflow_beam_close(r);
    return rc;
}

void iflow_beams_free(iflow_beam *b, int n)
{
    for (int i = 0; b && i < n; i++) {
        free(b[i].tokens);
        free(b[i].text);
    }
    free(b);
}
