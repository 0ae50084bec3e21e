/* forward.c -- contexts and the forward pass, written once against the device layer. See model.h.
 *
 * Per batch of T tokens: embedding rows looked up on the host, then each layer on the device(s)
 * of its parts. A whole layer runs where its one part is, the hidden state moving there first
 * if it is elsewhere. A layer split over several devices (tensor partition) runs each part on
 * its device against a copy of the hidden state; each part's attention output and FFN output
 * are partial sums over its heads and columns, added up in part order in host memory (the
 * all-reduce) and added to the residual stream, which is then sent back to every part. The
 * parts of a split layer run concurrently, a thread each; a device is only ever used by the
 * part running on it, and every part has a device of its own within a layer (plan.h).
 */
#include "model_impl.h"
#include "libcore/base/error.h"
#include "kernels/cpu/kernels.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ===================================================================== context =========== */

/* What one device of the placement holds for a context: scratch for one batch of B tokens. */
typedef struct {
    iflow_device *dev;
    int owned;                  /* the context's own CPU device (a NULL placement entry) */
    float *x;                   /* [B][dim]   residual stream        */
    float *xb;                  /* [B][dim]   normed input            */
    float *q;                   /* [B][Q]     queries                 */
    float *att;                 /* [B][Q]     attention output        */
    float *gate, *up;           /* [B][F]     FFN hidden              */
    float *logits;              /* [logits_rows][vocab] (output device, not host memory) */
    int logits_rows;
} dev_scratch;

struct iflow_ctx {
    const iflow_model *m;
    int n_ctx, n_past, n_threads;
    int n_dev;
    dev_scratch dev[IFLOW_MAX_DEVICES];
    float **k_cache, **v_cache; /* [n_parts] -> [n_ctx][part's kv heads * head_dim] on its device */
    float *stage;               /* [B][dim] host: embedding rows, crossings between devices */
    float *xh, *acc;            /* [B][dim] host: the residual stream and the all-reduce sum of a split layer */
    float *last_logits;         /* [vocab] host, for iflow_ctx_eval_argmax on a host device */
};

static void scratch_free(dev_scratch *s)
{
    iflow_device *d = s->dev;
    if (!d)
        return;
    float *bufs[] = {s->x, s->xb, s->q, s->att, s->gate, s->up, s->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            d->ops->free(d, bufs[i]);
    memset(s, 0, sizeof *s);
}

static int scratch_alloc(dev_scratch *s, const iflow_hparams *hp)
{
    iflow_device *d = s->dev;
    size_t D = (size_t)hp->dim, Q = (size_t)hp->n_heads * hp->head_dim, F = (size_t)hp->ffn_dim;
    int rc;
    if ((rc = d->ops->alloc(d, (void **)&s->x, MAX_BATCH * D * sizeof(float))) ||
        (rc = d->ops->alloc(d, (void **)&s->xb, MAX_BATCH * D * sizeof(float))) ||
        (rc = d->ops->alloc(d, (void **)&s->q, MAX_BATCH * Q * sizeof(float))) ||
        (rc = d->ops->alloc(d, (void **)&s->att, MAX_BATCH * Q * sizeof(float))) ||
        (rc = d->ops->alloc(d, (void **)&s->gate, MAX_BATCH * F * sizeof(float))) ||
        (rc = d->ops->alloc(d, (void **)&s->up, MAX_BATCH * F * sizeof(float))))
        return rc;
    return 0;
}

/* Device-side logits for `rows` rows (grown on demand; only for devices that are not the host). */
static int logits_rows(dev_scratch *s, int vocab, int rows)
{
    if (s->logits_rows >= rows)
        return 0;
    if (s->logits)
        s->dev->ops->free(s->dev, s->logits);
    s->logits = NULL;
    s->logits_rows = 0;
    int rc = s->dev->ops->alloc(s->dev, (void **)&s->logits, (size_t)rows * vocab * sizeof(float));
    if (rc == 0)
        s->logits_rows = rows;
    return rc;
}

int iflow_ctx_open(iflow_ctx **out, const iflow_model *m, int n_ctx, int n_threads)
{
    const iflow_hparams *hp = &m->hp;
    *out = NULL;
    if (n_ctx <= 0)
        n_ctx = hp->max_seq;
    iflow_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    c->m = m;
    c->n_ctx = n_ctx;
    c->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
    c->n_dev = m->n_devs;
    int n_parts = m->part0[hp->n_layers], rc = 0;
    size_t B = MAX_BATCH * (size_t)hp->dim * sizeof(float);
    c->k_cache = calloc((size_t)n_parts, sizeof *c->k_cache);
    c->v_cache = calloc((size_t)n_parts, sizeof *c->v_cache);
    c->stage = malloc(B);
    c->xh = malloc(B);
    c->acc = malloc(B);
    c->last_logits = malloc((size_t)hp->vocab_size * sizeof(float));
    if (!c->k_cache || !c->v_cache || !c->stage || !c->xh || !c->acc || !c->last_logits)
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int i = 0; i < m->n_devs && rc == 0; i++) {
        dev_scratch *s = &c->dev[i];
        s->dev = m->devs[i];
        if (!s->dev) {
            rc = iflow_device_open(&s->dev, "cpu", c->n_threads);
            s->owned = rc == 0;
        }
        if (rc == 0)
            rc = scratch_alloc(s, hp);
    }
    for (int k = 0; k < n_parts && rc == 0; k++) {
        const layer_part *p = &m->parts[k];
        iflow_device *d = c->dev[p->dev].dev;
        size_t n = (size_t)n_ctx * (size_t)(p->kv1 - p->kv0) * hp->head_dim * sizeof(float);
        if ((rc = d->ops->alloc(d, (void **)&c->k_cache[k], n)) == 0)
            rc = d->ops->alloc(d, (void **)&c->v_cache[k], n);
    }
    if (rc < 0) {
        iflow_ctx_close(c);
        return iflow_preperr(rc, "cannot open a context of %d positions", n_ctx);
    }
    *out = c;
    return 0;
}

void iflow_ctx_close(iflow_ctx *c)
{
    if (!c)
        return;
    const iflow_model *m = c->m;
    for (int k = 0; k < m->part0[m->hp.n_layers]; k++) {
        iflow_device *d = c->dev[m->parts[k].dev].dev;
        if (!d)
            continue;
        if (c->k_cache && c->k_cache[k])
            d->ops->free(d, c->k_cache[k]);
        if (c->v_cache && c->v_cache[k])
            d->ops->free(d, c->v_cache[k]);
    }
    for (int i = 0; i < c->n_dev; i++) {
        iflow_device *d = c->dev[i].dev;
        int owned = c->dev[i].owned;
        scratch_free(&c->dev[i]);
        if (owned)
            iflow_device_close(d);
    }
    free(c->k_cache);
    free(c->v_cache);
    free(c->stage);
    free(c->xh);
    free(c->acc);
    free(c->last_logits);
    free(c);
}

void iflow_ctx_reset(iflow_ctx *c) { c->n_past = 0; }
int iflow_ctx_n_past(const iflow_ctx *c) { return c->n_past; }
int iflow_ctx_n_ctx(const iflow_ctx *c) { return c->n_ctx; }
int iflow_ctx_n_vocab(const iflow_ctx *c) { return c->m->hp.vocab_size; }

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ < 0)                                                                               \
            return rc_;                                                                            \
    } while (0)

/* y[t] = W x[t] (+ b) for T tokens, on device s. */
static int linear(dev_scratch *s, float *y, int ldy, weight W, const float *b, const float *x, int ldx, int T, int N,
                  int K)
{
    iflow_device *d = s->dev;
    TRY(d->ops->matmul(d, y, (size_t)ldy, W.data, W.type, x, (size_t)ldx, T, N, K));
    return b ? d->ops->add_bias(d, y, (size_t)ldy, b, T, N) : 0;
}

/* Attention sub-block of part k (of a layer) for T tokens at positions pos0..pos0+T-1 on its
 * device s: its heads' output projection into s->xb (a partial sum when the layer is split),
 * added into s->x when `residual`. */
static int attention_block(iflow_ctx *c, dev_scratch *s, int k, int T, int pos0, int residual)
{
    const iflow_model *m = c->m;
    const iflow_hparams *hp = &m->hp;
    const layer_part *p = &m->parts[k];
    const layer_weights *w = &p->w;
    iflow_device *d = s->dev;
    const float *rope_scale = m->rope_scale_w[p->dev];
    int D = hp->dim, hd = hp->head_dim, nq = p->q1 - p->q0, nkv = p->kv1 - p->kv0, Q = nq * hd, KV = nkv * hd;
    float *kc = c->k_cache[k], *vc = c->v_cache[k];
    TRY(d->ops->rmsnorm(d, s->xb, s->x, w->attn_norm, T, D, hp->norm_eps));
    /* Q into scratch; K and V straight into their cache rows. */
    TRY(linear(s, s->q, Q, w->wq, w->bq, s->xb, D, T, Q, D));
    TRY(linear(s, kc + (size_t)pos0 * KV, KV, w->wk, w->bk, s->xb, D, T, KV, D));
    TRY(linear(s, vc + (size_t)pos0 * KV, KV, w->wv, w->bv, s->xb, D, T, KV, D));
    TRY(d->ops->rope(d, s->q, (size_t)Q, T, nq, hd, hp->rope_dim, pos0, hp->rope_theta, rope_scale, hp->rope_layout));
    TRY(d->ops->rope(d, kc + (size_t)pos0 * KV, (size_t)KV, T, nkv, hd, hp->rope_dim, pos0, hp->rope_theta, rope_scale,
                     hp->rope_layout));
    TRY(d->ops->attention(d, s->att, s->q, kc, vc, (size_t)KV, T, pos0, nq, nkv, hd, 1.0f / sqrtf((float)hd)));
    /* o-projection into xb (free now), then the residual add */
    TRY(linear(s, s->xb, D, w->wo, w->bo, s->att, Q, T, D, Q));
    return residual ? d->ops->add(d, s->x, s->xb, (size_t)T * D) : 0;
}

/* Gated FFN sub-block of part k for T tokens: its columns' down projection into s->xb, added
 * into s->x when `residual`. */
static int ffn_block(iflow_ctx *c, dev_scratch *s, int k, int T, int residual)
{
    const iflow_hparams *hp = &c->m->hp;
    const layer_part *p = &c->m->parts[k];
    const layer_weights *w = &p->w;
    iflow_device *d = s->dev;
    int D = hp->dim, F = p->f1 - p->f0;
    TRY(d->ops->rmsnorm(d, s->xb, s->x, w->ffn_norm, T, D, hp->norm_eps));
    TRY(linear(s, s->gate, F, w->gate, w->gate_b, s->xb, D, T, F, D));
    TRY(linear(s, s->up, F, w->up, w->up_b, s->xb, D, T, F, D));
    TRY(d->ops->silu_mul(d, s->gate, s->up, (size_t)T * F));
    TRY(linear(s, s->xb, D, w->down, w->down_b, s->gate, F, T, D, F));
    return residual ? d->ops->add(d, s->x, s->xb, (size_t)T * D) : 0;
}

/* Where the hidden state is between layers: a device index, or HOST for c->xh. */
enum { HOST = -1 };

/* Move the hidden state of T tokens to device `to` (from a device, or from c->xh). */
static int move_to(iflow_ctx *c, int from, int to, int T)
{
    size_t n = (size_t)T * c->m->hp.dim * sizeof(float);
    dev_scratch *b = &c->dev[to];
    if (from == to)
        return 0;
    if (from == HOST) {
        if (b->dev->host_memory) {
            memcpy(b->x, c->xh, n);
            return 0;
        }
        return b->dev->ops->upload(b->dev, b->x, c->xh, n);
    }
    dev_scratch *a = &c->dev[from];
    return iflow_device_transfer(b->dev, b->x, a->dev, a->x, n, c->stage);
}

/* The hidden state of T tokens into c->xh. */
static int move_to_host(iflow_ctx *c, int from, int T)
{
    size_t n = (size_t)T * c->m->hp.dim * sizeof(float);
    if (from == HOST)
        return 0;
    dev_scratch *a = &c->dev[from];
    if (a->dev->host_memory) {
        memcpy(c->xh, a->x, n);
        return 0;
    }
    return a->dev->ops->download(a->dev, c->xh, a->x, n);
}

/* c->acc = the sum of parts k0..k1-1's partial results (each in its device's xb), in part order. */
static int all_reduce(iflow_ctx *c, int k0, int k1, int T)
{
    size_t n = (size_t)T * c->m->hp.dim;
    for (int k = k0; k < k1; k++) {
        dev_scratch *s = &c->dev[c->m->parts[k].dev];
        float *dst = k == k0 ? c->acc : c->stage;
        if (s->dev->host_memory)
            memcpy(dst, s->xb, n * sizeof(float));
        else
            TRY(s->dev->ops->download(s->dev, dst, s->xb, n * sizeof(float)));
        if (k > k0)
            ifk_add(c->acc, c->stage, (int)n);
    }
    return 0;
}

/* One part's share of a split sub-block, run on a thread of its own. */
typedef struct {
    iflow_ctx *c;
    int k, T, pos0, is_ffn, rc;
    char err[512];            /* the message of a failure (messages are per thread) */
} part_job;

static void *run_part(void *arg)
{
    part_job *j = arg;
    int dv = j->c->m->parts[j->k].dev;
    j->rc = move_to(j->c, HOST, dv, j->T);
    if (j->rc == 0)
        j->rc = j->is_ffn ? ffn_block(j->c, &j->c->dev[dv], j->k, j->T, 0)
                          : attention_block(j->c, &j->c->dev[dv], j->k, j->T, j->pos0, 0);
    if (j->rc < 0)
        snprintf(j->err, sizeof j->err, "%s", iflow_errmsg());
    return NULL;
}

/* One sub-block (attention or FFN) of a layer split over parts k0..k1-1: each part on its own
 * device, concurrently (a thread per part beyond the first; each device computes with its own
 * threads), from the residual stream c->xh; then c->xh += the sum of their outputs. */
static int split_block(iflow_ctx *c, int k0, int k1, int T, int pos0, int is_ffn)
{
    part_job jobs[IFLOW_MAX_DEVICES];
    pthread_t th[IFLOW_MAX_DEVICES];
    int started[IFLOW_MAX_DEVICES] = {0}, n = k1 - k0;
    for (int i = 0; i < n; i++)
        jobs[i] = (part_job){.c = c, .k = k0 + i, .T = T, .pos0 = pos0, .is_ffn = is_ffn};
    for (int i = 1; i < n; i++)
        started[i] = pthread_create(&th[i], NULL, run_part, &jobs[i]) == 0;
    run_part(&jobs[0]);
    for (int i = 1; i < n; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            run_part(&jobs[i]); /* no thread to be had: run it here */
    }
    for (int i = 0; i < n; i++)
        if (jobs[i].rc < 0)
            return iflow_seterr(jobs[i].rc, "%s", jobs[i].err);
    TRY(all_reduce(c, k0, k1, T));
    ifk_add(c->xh, c->acc, T * c->m->hp.dim);
    return 0;
}

/* Embedding rows of T tokens, looked up on the host, into device `to`'s residual stream, or into
 * c->xh for HOST. */
static int embed(iflow_ctx *c, const int32_t *ids, int T, int to)
{
    const iflow_model *m = c->m;
    int D = m->hp.dim;
    float *rows = to == HOST ? c->xh : c->dev[to].dev->host_memory ? c->dev[to].x : c->stage;
    for (int t = 0; t < T; t++)
        ifk_get_row(rows + (size_t)t * D, m->tok_embd.data, m->tok_embd.type, (size_t)ids[t], D);
    if (to == HOST || rows == c->dev[to].x)
        return 0;
    return c->dev[to].dev->ops->upload(c->dev[to].dev, c->dev[to].x, rows, (size_t)T * D * sizeof(float));
}

/* The layers of one batch of T <= MAX_BATCH tokens; the hidden state ends on the output device.
 * Returns the output device's scratch. */
static int forward_layers(iflow_ctx *c, const int32_t *ids, int T, dev_scratch **out)
{
    const iflow_model *m = c->m;
    int pos0 = c->n_past, first_whole = m->part0[1] - m->part0[0] == 1;
    int cur = first_whole ? m->parts[0].dev : HOST;
    TRY(embed(c, ids, T, cur));
    for (int l = 0; l < m->hp.n_layers; l++) {
        int k0 = m->part0[l], k1 = m->part0[l + 1];
        if (k1 - k0 == 1) {
            int dv = m->parts[k0].dev;
            TRY(move_to(c, cur, dv, T));
            cur = dv;
            TRY(attention_block(c, &c->dev[dv], k0, T, pos0, 1));
            TRY(ffn_block(c, &c->dev[dv], k0, T, 1));
        } else {
            TRY(move_to_host(c, cur, T));
            cur = HOST;
            TRY(split_block(c, k0, k1, T, pos0, 0));
            TRY(split_block(c, k0, k1, T, pos0, 1));
        }
    }
    TRY(move_to(c, cur, m->output_dev, T));
    *out = &c->dev[m->output_dev];
    return 0;
}

/* Logits of `rows` hidden states of s->x starting at row r0, computed on s's device: into
 * host ([rows][vocab]) when the device's memory is the host's, else into device scratch. *y
 * receives where they are. */
static int compute_logits(iflow_ctx *c, dev_scratch *s, int r0, int rows, float *host, float **y)
{
    const iflow_model *m = c->m;
    const iflow_hparams *hp = &m->hp;
    iflow_device *d = s->dev;
    int D = hp->dim, V = hp->vocab_size;
    TRY(d->ops->rmsnorm(d, s->xb, s->x + (size_t)r0 * D, m->output_norm_w, rows, D, hp->norm_eps));
    *y = host;
    if (!d->host_memory) {
        TRY(logits_rows(s, V, rows));
        *y = s->logits;
    }
    return linear(s, *y, V, m->output_w, NULL, s->xb, D, rows, V, D);
}

/* The same logits, into dst on the host. */
static int output_logits(iflow_ctx *c, dev_scratch *s, int r0, int rows, float *dst)
{
    float *y;
    TRY(compute_logits(c, s, r0, rows, dst, &y));
    return y == dst ? 0 : s->dev->ops->download(s->dev, dst, y, (size_t)rows * c->m->hp.vocab_size * sizeof(float));
}

/* One batch of T <= MAX_BATCH tokens. */
static int forward_batch(iflow_ctx *c, const int32_t *ids, int T, float *logits, int all_logits)
{
    dev_scratch *s;
    TRY(forward_layers(c, ids, T, &s));
    c->n_past += T;
    if (!logits)
        return 0;
    return all_logits ? output_logits(c, s, 0, T, logits) : output_logits(c, s, T - 1, 1, logits);
}

static int check_eval(const iflow_ctx *c, const int32_t *ids, int n)
{
    const iflow_hparams *hp = &c->m->hp;
    if (n <= 0)
        return iflow_seterr(IFLOW_EINVAL, "no tokens to evaluate");
    if (n > c->n_ctx - c->n_past)
        return iflow_seterr(IFLOW_ERANGE, "context full: %d tokens at position %d exceed the context of %d", n,
                            c->n_past, c->n_ctx);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= hp->vocab_size)
            return iflow_seterr(IFLOW_ERANGE, "token id %d is outside the vocabulary (%d)", ids[i], hp->vocab_size);
    return 0;
}

int iflow_ctx_eval(iflow_ctx *c, const int32_t *ids, int n, float *logits, int all_logits)
{
    const iflow_hparams *hp = &c->m->hp;
    TRY(check_eval(c, ids, n));
    for (int done = 0; done < n;) {
        int T = n - done < MAX_BATCH ? n - done : MAX_BATCH, last_batch = done + T == n;
        float *out = all_logits ? logits + (size_t)done * hp->vocab_size : last_batch ? logits : NULL;
        TRY(forward_batch(c, ids + done, T, out, all_logits));
        done += T;
    }
    return 0;
}

int iflow_ctx_eval_argmax(iflow_ctx *c, const int32_t *ids, int n, int32_t *next)
{
    TRY(check_eval(c, ids, n));
    int done = 0;
    while (n - done > MAX_BATCH) {
        TRY(forward_batch(c, ids + done, MAX_BATCH, NULL, 0));
        done += MAX_BATCH;
    }
    dev_scratch *s;
    int T = n - done;
    float *y;
    TRY(forward_layers(c, ids + done, T, &s));
    c->n_past += T;
    TRY(compute_logits(c, s, T - 1, 1, c->last_logits, &y));
    return s->dev->ops->argmax(s->dev, next, y, c->m->hp.vocab_size);
}
