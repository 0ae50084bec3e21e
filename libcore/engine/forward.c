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
 *
 * Keys and values live in a paged KV cache (iflow_kv; kernels/cpu/kvcache.h): per layer part,
 * a K pool and a V pool of blocks on the part's device. A step's rows belong to one or more
 * sequences, each at its own positions with its own block table; the matrix products run over
 * all rows at once, and attention per sequence. A context's own cache (iflow_ctx_eval) is one
 * F32 block of n_ctx positions, i.e. the contiguous cache.
 */
#include "model_impl.h"
#include "comm.h"
#include "observe.h"
#include "footprint.h"
#include "slice.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "kernels/cpu/bigmem.h"
#include "kernels/cpu/kernels.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ===================================================================== context =========== */

/* What one device of the placement holds for a context: scratch for one pass of B tokens
 * (iflow_ctx.pass: 128, or 512 where no layer runs in host memory). */
typedef struct {
    iflow_device *dev;
    int owned;                  /* the context's own CPU device (a NULL placement entry) */
    float *x;                   /* [B][dim]   residual stream        */
    float *xb;                  /* [B][dim]   normed input            */
    float *q;                   /* [B][Q]     queries                 */
    float *att;                 /* [B][Q]     attention output        */
    float *xa;                  /* [B][D]     the attention's output while the FFN runs (block
                                   parallel_residual only; else NULL) */
    float *gate, *up;           /* [B][F]     FFN hidden              */
    float *kx, *vx;             /* [B][KV]    new keys and values, before they are stored */
    float *mla;                 /* [B][iflow_mla_scratch] latent attention's q_a and queries, or NULL */
    float *logits;              /* [logits_rows][vocab] (output device, not host memory) */
    float *lt;                  /* [n_lt]: a low-rank delta's a x, grown on demand            */
    float *lx, *ly;             /* [n_lx], [n_ly]: the rows of an adapter's sequences gathered
                                 * (input and output), when they are not one run            */
    size_t n_lt, n_lx, n_ly;
    int logits_rows;
    iflow_moe_scratch *moe;     /* a mixture of experts' buffers (moe.c), grown on demand */
} dev_scratch;

/* A paged KV cache: per layer part, a K pool and a V pool of the same layout. */
struct iflow_kv {
    const iflow_model *m;
    int n_parts;
    ifk_kv_layout *L;           /* [n_parts]: the part's kv heads, the cache's type and blocks */
    void **k, **v;              /* [n_parts] pools on the part's device                        */
    iflow_device **dev;         /* [n_parts] the device that allocated them; NULL: the host    */
    uint64_t serial;            /* unique among the caches and contexts of this process        */
    int rope_long;              /* longrope: the long factors rotate (iflow_kv_set_context)     */
};

/* The rope multipliers on device dev as cache kv rotates by them (longrope: short or long), or NULL. */
static const float *rope_scale_of(const iflow_model *m, const iflow_kv *kv, int dev)
{
    const float *s = dev < 0 ? m->rope_scale : m->rope_scale_w[dev];
    return s && kv->rope_long ? s + m->hp.rope_dim / 2 : s;
}

void iflow_kv_set_context(iflow_kv *kv, int n_ctx)
{
    const iflow_hparams *hp = &kv->m->hp;
    kv->rope_long = hp->rope_scaling == IFLOW_ROPE_SCALING_LONGROPE && n_ctx > hp->rope_orig_ctx;
}

/* A number no other cache or context of this process has had (replayed steps' keys). */
static uint64_t next_serial(void)
{
    static atomic_uint_fast64_t n;
    return (uint64_t)atomic_fetch_add(&n, 1) + 1;
}

/* The sequences of a step that ask for one adapter (iflow_step_seq.adapter), so that its delta
 * runs once over all their rows: one run of rows when they are consecutive sequences, else
 * gathered (deltas()). */
typedef struct {
    int adapter;          /* 1 .. the model's n_adapters                                 */
    const int *members;   /* [n_seq] the sequences' indices, ascending                    */
    int n_seq;
    int row0, n_rows;     /* the first sequence's first row; the rows of all of them     */
    int contiguous;       /* the members are consecutive sequences: rows row0 .. + n_rows */
} adapter_rows;

struct iflow_ctx {
    const iflow_model *m;
    int n_ctx, n_past, n_threads;
    int pass;                   /* B: rows of one forward pass (the model's pass) */
    int32_t *step_ids;          /* [B] a step's tokens, gathered from its sequences           */
    ifk_kv_seq *step_seq;       /* [B] a step's sequences                                     */
    adapter_rows *step_groups;  /* [B] their sequences grouped by adapter (iflow_step_seq.adapter) */
    int *step_members;          /* [B] the groups' sequences                                  */
    int n_dev;
    dev_scratch dev[IFLOW_MAX_DEVICES];
    iflow_kv *kv;               /* the context's own cache (one block of n_ctx), or NULL     */
    int32_t table0[1];          /* its block table: {0}                                     */
    float *stage;               /* [B][dim] host: embedding rows, crossings between devices */
    float *xh, *acc;            /* [B][dim] host: the residual stream and the all-reduce sum of a split layer */
    float *last_logits;         /* [vocab] host, for iflow_ctx_eval_argmax on a host device */
    float *out_logits;          /* [out_rows][vocab] host: a step's logits before they are handed out */
    int out_rows;
    iflow_comm *comm;           /* several processes (comm.h), or NULL */
    int record;                 /* IFLOW_GRAPHS_*: how one-token steps run where they can be recorded (iflow_ctx_set_graphs) */
    int record_fails;           /* recordings dropped in a row; at RECORD_MAX_FAILS the context stops trying */
    uint64_t serial;            /* see next_serial */
};

static void scratch_free(dev_scratch *s)
{
    iflow_device *d = s->dev;
    if (!d)
        return;
    float *bufs[] = {s->x,  s->xb,     s->xa, s->q,  s->att, s->gate, s->up,
                     s->kx, s->vx, s->mla, s->logits, s->lt, s->lx, s->ly};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            d->ops->free(d, bufs[i]);
    iflow_moe_scratch_free(s->moe);
    memset(s, 0, sizeof *s);
}

/* Scratch of B rows (the context's pass) on s's device. */
static int scratch_alloc(dev_scratch *s, const iflow_hparams *hp, size_t B)
{
    iflow_device *d = s->dev;
    size_t D = (size_t)hp->dim, Q = (size_t)hp->n_heads * hp->head_dim, F = (size_t)hp->ffn_dim,
           KV = (size_t)hp->n_kv_heads * hp->head_dim;
    int rc;
    if ((rc = d->ops->alloc(d, (void **)&s->x, B * D * sizeof(float))) ||
        (rc = d->ops->alloc(d, (void **)&s->xb, B * D * sizeof(float))) ||
        (rc = d->ops->alloc(d, (void **)&s->q, B * Q * sizeof(float))) ||
        (rc = d->ops->alloc(d, (void **)&s->att, B * Q * sizeof(float))) ||
        (rc = d->ops->alloc(d, (void **)&s->gate, B * F * sizeof(float))) ||
        (rc = d->ops->alloc(d, (void **)&s->up, B * F * sizeof(float))) ||
        (rc = d->ops->alloc(d, (void **)&s->kx, B * KV * sizeof(float))) ||
        (rc = d->ops->alloc(d, (void **)&s->vx, B * KV * sizeof(float))))
        return rc;
    if (hp->kv_lora_rank && (rc = d->ops->alloc(d, (void **)&s->mla, B * iflow_mla_scratch(hp) * sizeof(float))))
        return rc;
    if (hp->parallel_residual)
        return d->ops->alloc(d, (void **)&s->xa, B * D * sizeof(float));
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

/* ---- the paged KV cache ----------------------------------------------------------------- */

/* The layer of part k. */
static int layer_of_part(const iflow_model *m, int k)
{
    int l = 0;
    while (l + 1 < m->hp.n_layers && m->part0[l + 1] <= k)
        l++;
    return l;
}

/* The rope base of a part's layer: rope_theta_local for a windowed layer when the model has
 * one (Gemma 3), else rope_theta. */
static float layer_theta(const iflow_model *m, const ifk_kv_layout *L)
{
    return L->window > 0 && m->hp.rope_theta_local > 0 ? m->hp.rope_theta_local : m->hp.rope_theta;
}

/* The layout of part k's pools. */
static ifk_kv_layout part_layout(const iflow_model *m, int k, int type, int block, int n_blocks)
{
    const layer_part *p = &m->parts[k];
    /* window_pattern > 1: every window_pattern-th layer is global (Gemma 2 and 3) */
    int l = layer_of_part(m, k), global = m->hp.window_pattern > 1 && (l + 1) % m->hp.window_pattern == 0;
    return (ifk_kv_layout){.type = type, .block = block, .n_kv_heads = p->kv1 - p->kv0, .head_dim = m->hp.head_dim,
                           .group = ifk_kv_group(m->hp.head_dim), .n_blocks = n_blocks,
                           .window = global ? 0 : m->hp.sliding_window, .softcap = m->hp.attn_softcap,
                           .bidirectional = m->hp.layout == IFLOW_LAYOUT_ENCODER};
}

uint64_t iflow_kv_block_bytes(const iflow_model *m, int type, int block)
{
    uint64_t n = 0;
    for (int k = 0; k < m->part0[m->hp.n_layers]; k++) {
        ifk_kv_layout L = part_layout(m, k, type, block, 1);
        n += 2 * (uint64_t)ifk_kv_pool_bytes(&L);
    }
    return n;
}

/* A pool on device d, or in host memory: zero pages until the cache grows into them, in huge
 * pages (bigmem.h), since attention walks a head's slice of every row, one 4 KiB page after
 * another, and in 4 KiB pages waited on the TLB (docs/PERFORMANCE.md, "Decoding attention on
 * the CPU"). */
static int kv_alloc(iflow_device *d, void **p, size_t n)
{
    if (d && !d->host_memory)
        return d->ops->alloc(d, p, n);
    *p = ifk_bigmem_alloc(n ? n : 1);
    return *p ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
}

int iflow_kv_open(iflow_kv **out, const iflow_model *m, int type, int block, int n_blocks)
{
    *out = NULL;
    if (!ifk_kv_type_name(type) || block <= 0 || n_blocks <= 0)
        return iflow_seterr(IFLOW_EINVAL, "bad KV cache shape: type %d, %d blocks of %d positions", type, n_blocks,
                            block);
    int n_parts = m->part0[m->hp.n_layers], rc = 0;
    iflow_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    kv->m = m;
    kv->n_parts = n_parts;
    kv->serial = next_serial();
    iflow_kv_set_context(kv, (int)((int64_t)block * n_blocks < INT32_MAX ? (int64_t)block * n_blocks : INT32_MAX));
    kv->L = calloc((size_t)n_parts, sizeof *kv->L);
    kv->k = calloc((size_t)n_parts, sizeof *kv->k);
    kv->v = calloc((size_t)n_parts, sizeof *kv->v);
    kv->dev = calloc((size_t)n_parts, sizeof *kv->dev);
    if (!kv->L || !kv->k || !kv->v || !kv->dev)
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int k = 0; k < n_parts && rc == 0; k++) {
        iflow_device *d = m->devs[m->parts[k].dev];
        kv->L[k] = part_layout(m, k, type, block, n_blocks);
        if (!iflow_dev_is_mine(m, m->parts[k].dev)) /* another process's part: no pools here */
            continue;
        kv->dev[k] = d && !d->host_memory ? d : NULL;
        size_t n = ifk_kv_pool_bytes(&kv->L[k]);
        if ((rc = kv_alloc(kv->dev[k], &kv->k[k], n)) == 0 && !m->hp.kv_lora_rank) /* latent: values in the keys */
            rc = kv_alloc(kv->dev[k], &kv->v[k], n);
    }
    if (rc < 0) {
        iflow_kv_close(kv);
        return iflow_preperr(rc, "cannot allocate a KV cache of %d blocks of %d positions", n_blocks, block);
    }
    *out = kv;
    return 0;
}

void iflow_kv_close(iflow_kv *kv)
{
    if (!kv)
        return;
    for (int k = 0; k < kv->n_parts; k++) {
        void *pools[] = {kv->k ? kv->k[k] : NULL, kv->v ? kv->v[k] : NULL};
        for (int i = 0; i < 2; i++) {
            if (!pools[i])
                continue;
            if (kv->dev && kv->dev[k])
                kv->dev[k]->ops->free(kv->dev[k], pools[i]);
            else
                ifk_bigmem_free(pools[i]);
        }
    }
    free(kv->L);
    free(kv->k);
    free(kv->v);
    free(kv->dev);
    free(kv);
}

int iflow_kv_read_row(const iflow_kv *kv, int layer, int value, const int32_t *table, int pos, float *out)
{
    const iflow_model *m = kv->m;
    if (layer < 0 || layer >= m->hp.n_layers)
        return iflow_seterr(IFLOW_ERANGE, "layer %d of %d", layer, m->hp.n_layers);
    for (int k = m->part0[layer]; k < m->part0[layer + 1]; k++) {
        if (kv->dev[k])
            return iflow_seterr(IFLOW_EUNSUPPORTED, "reading KV rows from %s", kv->dev[k]->info.name);
        const layer_part *p = &m->parts[k];
        ifk_kv_load_row(out + (size_t)p->kv0 * m->hp.head_dim, value && kv->v[k] ? kv->v[k] : kv->k[k], &kv->L[k],
                        table, pos);
    }
    return 0;
}

/* n bytes at offset off of pool p (on device d, or the host) to offset dst. */
static int pool_copy(iflow_device *d, void *p, size_t dst, size_t src, size_t n)
{
    if (n == 0)
        return 0;
    if (!d) {
        memcpy((char *)p + dst, (char *)p + src, n);
        return 0;
    }
    void *tmp = malloc(n); /* through the host: the device layer has no copy within a device */
    if (!tmp)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    int rc = d->ops->download(d, tmp, (char *)p + src, n);
    if (rc == 0)
        rc = d->ops->upload(d, (char *)p + dst, tmp, n);
    free(tmp);
    return rc;
}

int iflow_kv_copy_block(iflow_kv *kv, int dst, int src)
{
    if (dst < 0 || src < 0 || (kv->n_parts && (dst >= kv->L[0].n_blocks || src >= kv->L[0].n_blocks)))
        return iflow_seterr(IFLOW_ERANGE, "cannot copy KV block %d to %d", src, dst);
    for (int k = 0; k < kv->n_parts; k++) {
        size_t vd, vs, n, sd, ss, ns;
        ifk_kv_block_extent(&kv->L[k], dst, &vd, &n, &sd, &ns);
        ifk_kv_block_extent(&kv->L[k], src, &vs, &n, &ss, &ns);
        for (int w = 0; w < 2; w++) {
            void *p = w ? kv->v[k] : kv->k[k];
            if (!p)
                continue;
            int rc = pool_copy(kv->dev[k], p, vd, vs, n);
            if (rc == 0)
                rc = pool_copy(kv->dev[k], p, sd, ss, ns);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

int iflow_kv_can_shift(const iflow_kv *kv, const char **device)
{
    if (kv->m->hp.qk_norm_late) { /* stored keys are norm(rope(k)): a rotation does not move them */
        if (device)
            *device = "a model that norms its keys after rotating them";
        return 0;
    }
    for (int k = 0; k < kv->n_parts; k++)
        if (kv->dev[k] && !kv->dev[k]->ops->kv_shift) {
            if (device)
                *device = kv->dev[k]->info.name;
            return 0;
        }
    return 1;
}

int iflow_kv_shift(iflow_kv *kv, const int32_t *table, int n_past, int keep, int discard)
{
    const iflow_model *m = kv->m;
    const iflow_hparams *hp = &m->hp;
    if (keep < 0 || discard <= 0 || keep + discard > n_past)
        return iflow_seterr(IFLOW_EINVAL, "cannot drop %d positions after the first %d of %d", discard, keep, n_past);
    if (hp->position != IFLOW_POS_ROPE)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a context shift rotates rope keys; this model's positions are learned");
    if (hp->qk_norm_late)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a context shift rotates stored keys; this model norms its keys after "
                            "rotating them (qk_norm_after_rope)");
    for (int k = 0; k < kv->n_parts; k++) {
        if (!kv->k[k]) /* another process's part (a latent attention's has no value pool) */
            continue;
        /* a NoPE layer's keys move unrotated (no rotated dimensions) */
        ifk_rope_params rp = {iflow_layer_rotates(hp, layer_of_part(m, k)) ? hp->rope_dim : 0,
                              layer_theta(m, &kv->L[k]), rope_scale_of(m, kv, -1), hp->rope_layout};
        iflow_device *d = kv->dev[k];
        if (!d) { /* pools in host memory */
            float *tmp = malloc((size_t)kv->L[k].n_kv_heads * kv->L[k].head_dim * sizeof(float));
            if (!tmp)
                return iflow_seterr(IFLOW_ENOMEM, "out of memory");
            ifk_kv_shift(kv->k[k], kv->v[k], &kv->L[k], table, n_past, keep, discard, &rp, tmp);
            free(tmp);
            continue;
        }
        if (!d->ops->kv_shift)
            return iflow_seterr(IFLOW_EUNSUPPORTED, "context shift is not implemented on %s", d->info.name);
        rp.freq_scale = rope_scale_of(m, kv, m->parts[k].dev);
        int rc = d->ops->kv_shift(d, kv->k[k], kv->v[k], &kv->L[k], table, n_past, keep, discard, &rp);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- contexts ---------------------------------------------------------------------------- */

/* A context with scratch on every device; its own cache of n_ctx positions unless n_ctx < 0. */
static int ctx_open(iflow_ctx **out, const iflow_model *m, int n_ctx, int n_threads, int kv_type)
{
    const iflow_hparams *hp = &m->hp;
    *out = NULL;
    iflow_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    c->m = m;
    c->serial = next_serial();
    c->n_ctx = n_ctx;
    c->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
    c->n_dev = m->n_devs;
    int rc = 0;
    c->pass = m->pass; /* >= MAX_BATCH: every model opened is placed (place.c sets it) */
    size_t B = (size_t)c->pass * hp->dim * sizeof(float);
    c->stage = malloc(B);
    c->xh = malloc(B);
    c->acc = malloc(B);
    c->last_logits = malloc((size_t)hp->vocab_size * sizeof(float));
    c->step_ids = malloc((size_t)c->pass * sizeof *c->step_ids);
    c->step_seq = malloc((size_t)c->pass * sizeof *c->step_seq);
    c->step_groups = malloc((size_t)c->pass * sizeof *c->step_groups);
    c->step_members = malloc((size_t)c->pass * sizeof *c->step_members);
    if (!c->stage || !c->xh || !c->acc || !c->last_logits || !c->step_ids || !c->step_seq || !c->step_groups ||
        !c->step_members)
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int i = 0; i < m->n_devs && rc == 0; i++) {
        dev_scratch *s = &c->dev[i];
        if (!iflow_dev_is_mine(m, i)) /* another process's device: it computes nothing here */
            continue;
        s->dev = m->devs[i];
        if (!s->dev) {
            rc = iflow_device_open(&s->dev, "cpu", c->n_threads);
            s->owned = rc == 0;
        }
        if (rc == 0)
            rc = scratch_alloc(s, hp, (size_t)c->pass);
    }
    if (rc == 0 && n_ctx > 0)
        rc = iflow_kv_open(&c->kv, m, kv_type, n_ctx, 1);
    if (rc < 0) {
        iflow_ctx_close(c);
        return n_ctx > 0 ? iflow_preperr(rc, "cannot open a context of %d positions", n_ctx) : rc;
    }
    *out = c;
    return 0;
}

int iflow_ctx_open(iflow_ctx **out, const iflow_model *m, int n_ctx, int n_threads)
{
    return ctx_open(out, m, n_ctx > 0 ? n_ctx : m->hp.max_seq, n_threads, IFK_KV_F32);
}

int iflow_ctx_open_kv(iflow_ctx **out, const iflow_model *m, int n_ctx, int n_threads, int kv_type)
{
    *out = NULL;
    if (!ifk_kv_type_name(kv_type))
        return iflow_seterr(IFLOW_EINVAL, "unknown KV cache type %d", kv_type);
    return ctx_open(out, m, n_ctx > 0 ? n_ctx : m->hp.max_seq, n_threads, kv_type);
}

int iflow_ctx_open_steps(iflow_ctx **out, const iflow_model *m, int n_threads)
{
    return ctx_open(out, m, -1, n_threads, IFK_KV_F32);
}

void iflow_ctx_close(iflow_ctx *c)
{
    if (!c)
        return;
    iflow_ctx_set_observer(c, NULL, NULL);
    iflow_kv_close(c->kv);
    for (int i = 0; i < c->n_dev; i++) {
        iflow_device *d = c->dev[i].dev;
        int owned = c->dev[i].owned;
        scratch_free(&c->dev[i]);
        if (owned)
            iflow_device_close(d);
    }
    free(c->stage);
    free(c->xh);
    free(c->acc);
    free(c->last_logits);
    free(c->out_logits);
    free(c->step_ids);
    free(c->step_seq);
    free(c->step_groups);
    free(c->step_members);
    free(c);
}

void iflow_ctx_reset(iflow_ctx *c) { c->n_past = 0; }
int iflow_ctx_n_past(const iflow_ctx *c) { return c->n_past; }
int iflow_ctx_n_ctx(const iflow_ctx *c) { return c->n_ctx; }
int iflow_ctx_n_vocab(const iflow_ctx *c) { return c->m->hp.vocab_size; }

int iflow_norm_rows(const iflow_model *m, iflow_device *d, float *y, const float *x, const float *w, const float *b, int T,
                    int n)
{
    if (m->hp.norm == IFLOW_NORM_RMS)
        return d->ops->rmsnorm(d, y, x, w, T, n, m->hp.norm_eps);
    if (!d->ops->layernorm)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "block norm = layer is not implemented on %s yet", d->info.name);
    return d->ops->layernorm(d, y, x, w, b, T, n, m->hp.norm_eps);
}

int iflow_linear_rows(iflow_device *d, float *y, int ldy, weight W, const float *b, const float *x, int ldx, int T, int N,
                      int K)
{
    IFLOW_TRY(d->ops->matmul(d, y, (size_t)ldy, W.data, W.type, x, (size_t)ldx, T, N, K));
    return b ? d->ops->add_bias(d, y, (size_t)ldy, b, T, N) : 0;
}

int iflow_ffn_hidden(const iflow_hparams *hp, iflow_device *d, const layer_weights *w, const float *in, int T, int F,
                     float *gate, float *up)
{
    const int D = hp->dim, gated = hp->ffn == IFLOW_FFN_GATED;
    if (gated && hp->activation == IFLOW_ACT_SILU && d->ops->glu && !w->gate_b && !w->up_b &&
        w->gate.type == w->up.type) /* SwiGLU in one op */
        return d->ops->glu(d, gate, up, (size_t)F, w->gate.data, w->up.data, w->gate.type, in, (size_t)D, T, F, D);
    IFLOW_TRY(iflow_ffn_linears(hp, d, w, in, T, F, gate, up));
    return iflow_ffn_act(hp, d, gate, up, T, F);
}

int iflow_ffn_linears(const iflow_hparams *hp, iflow_device *d, const layer_weights *w, const float *in, int T, int F,
                      float *gate, float *up)
{
    const int D = hp->dim, gated = hp->ffn == IFLOW_FFN_GATED;
    IFLOW_TRY(iflow_linear_rows(d, gate, F, gated ? w->gate : w->up, gated ? w->gate_b : w->up_b, in, D, T, F, D));
    return gated ? iflow_linear_rows(d, up, F, w->up, w->up_b, in, D, T, F, D) : 0;
}

/* gpt-oss's clamped SwiGLU (activation swiglu_oai), on host memory:
 * gate = (clamp(up, -L, L) + 1) * g sigmoid(alpha g), g = min(gate, L). */
static int swiglu_oai(const iflow_hparams *hp, iflow_device *d, float *gate, const float *up, size_t n)
{
    if (!d->host_memory)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "block activation = swiglu_oai is not implemented on %s yet",
                            d->info.name);
    const float lim = hp->swiglu_limit, alpha = hp->swiglu_alpha;
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i] < lim ? gate[i] : lim, u = up[i] > lim ? lim : up[i] < -lim ? -lim : up[i];
        gate[i] = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
    }
    return 0;
}

int iflow_ffn_act(const iflow_hparams *hp, iflow_device *d, float *gate, float *up, int T, int F)
{
    const int gated = hp->ffn == IFLOW_FFN_GATED;
    if (hp->activation == IFLOW_ACT_SWIGLU_OAI)
        return swiglu_oai(hp, d, gate, up, (size_t)T * F);
    if (hp->activation == IFLOW_ACT_RELU || hp->activation == IFLOW_ACT_RELU2) { /* relu2: relu(x) * x, plain */
        const int sq = hp->activation == IFLOW_ACT_RELU2;
        if (!d->ops->relu_mul)
            return iflow_seterr(IFLOW_EUNSUPPORTED, "block activation = %s is not implemented on %s yet",
                                sq ? "relu2" : "relu", d->info.name);
        return d->ops->relu_mul(d, gate, sq ? gate : gated ? up : NULL, (size_t)T * F);
    }
    if (hp->activation != IFLOW_ACT_SILU) {
        const int exact = hp->activation == IFLOW_ACT_GELU;
        if (!d->ops->gelu_mul)
            return iflow_seterr(IFLOW_EUNSUPPORTED, "block activation = %s is not implemented on %s yet",
                                exact ? "gelu" : "gelu_tanh", d->info.name);
        return d->ops->gelu_mul(d, gate, gated ? up : NULL, (size_t)T * F, exact);
    }
    return d->ops->silu_mul(d, gate, gated ? up : NULL, (size_t)T * F);
}

/* *buf holding at least n floats of s's device (grown, its old values lost). */
static int grow_scratch(dev_scratch *s, float **buf, size_t *cap, size_t n)
{
    if (*cap >= n)
        return 0;
    if (*buf)
        s->dev->ops->free(s->dev, *buf);
    *buf = NULL;
    *cap = 0;
    IFLOW_TRY(s->dev->ops->alloc(s->dev, (void **)buf, n * sizeof(float)));
    *cap = n;
    return 0;
}

/* y [T][N] (rows of stride N) += b (a x) for x [T][K] at stride ldx: a matrix's low-rank delta,
 * or nothing (rank 0). A matrix product of F16 weights, then the device's lowrank_up (b's
 * F16 columns times a x, added into y), on s's device. */
static int low_rank_rows(dev_scratch *s, float *y, const low_rank *l, const float *x, int ldx, int T, int N, int K)
{
    if (!l->rank)
        return 0;
    iflow_device *d = s->dev;
    if (!d->ops->lowrank_up)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "%s computes no LoRA adapter at run time", d->info.name);
    IFLOW_TRY(grow_scratch(s, &s->lt, &s->n_lt, (size_t)T * l->rank));
    IFLOW_TRY(d->ops->matmul(d, s->lt, (size_t)l->rank, l->a, IFLOW_DT_F16, x, (size_t)ldx, T, l->rank, K));
    return d->ops->lowrank_up(d, y, (size_t)N, l->bt, s->lt, (size_t)l->rank, T, N, l->rank);
}

int iflow_block_in(const iflow_model *m, iflow_device *d, float *x, float *xb, const float *w, const float *b, int T,
                   const float **in)
{
    *in = x;
    if (m->hp.post_ln || m->hp.post_norms_only)
        return 0;
    *in = xb;
    return iflow_norm_rows(m, d, xb, x, w, b, T, m->hp.dim);
}

int iflow_block_out(const iflow_model *m, iflow_device *d, float *x, const float *xb, const float *w, const float *b, int T)
{
    const int D = m->hp.dim;
    IFLOW_TRY(d->ops->add(d, x, xb, (size_t)T * D));
    return m->hp.post_ln ? iflow_norm_rows(m, d, x, x, w, b, T, D) : 0;
}

/* The rows of one step: T tokens in sequences seq[0..n_seq), each sequence's rows contiguous
 * and in order, cached in kv. */
typedef struct {
    iflow_kv *kv;
    const ifk_kv_seq *seq;
    int n_seq, T;
    const adapter_rows *groups; /* [n_groups] the sequences that ask for an adapter, by adapter */
    int n_groups;
} step_rows;

/* Group the step's sequences seqs[0..n) (rows seq[]) by the adapter they ask for, into c's
 * step_groups; returns how many groups. */
static int group_by_adapter(iflow_ctx *c, const iflow_step_seq *seqs, const ifk_kv_seq *seq, int n)
{
    int ng = 0, at = 0;
    for (int a = 1; a <= c->m->n_adapters; a++) {
        adapter_rows *g = &c->step_groups[ng];
        *g = (adapter_rows){.adapter = a, .members = c->step_members + at, .contiguous = 1};
        for (int i = 0; i < n; i++) {
            if (seqs[i].adapter != a)
                continue;
            if (!g->n_seq)
                g->row0 = seq[i].row0;
            else if (g->members[g->n_seq - 1] != i - 1)
                g->contiguous = 0;
            c->step_members[at++] = i;
            g->n_seq++;
            g->n_rows += seq[i].n_rows;
        }
        ng += g->n_seq > 0;
    }
    return ng;
}

/* The rows of the group's sequences in src (rows of n at stride ld) into buf, one after the
 * other. Host memory. */
static void gather_rows(const step_rows *r, const adapter_rows *g, const float *src, size_t ld, float *buf, size_t n)
{
    for (int j = 0; j < g->n_seq; j++) {
        const ifk_kv_seq *q = &r->seq[g->members[j]];
        for (int t = 0; t < q->n_rows; t++, buf += n)
            memcpy(buf, src + (size_t)(q->row0 + t) * ld, n * sizeof *buf);
    }
}

/* And back: buf's rows to the group's rows of dst. */
static void scatter_rows(const step_rows *r, const adapter_rows *g, float *dst, size_t ld, const float *buf, size_t n)
{
    for (int j = 0; j < g->n_seq; j++) {
        const ifk_kv_seq *q = &r->seq[g->members[j]];
        for (int t = 0; t < q->n_rows; t++, buf += n)
            memcpy(dst + (size_t)(q->row0 + t) * ld, buf, n * sizeof *buf);
    }
}

/* y += the deltas of matrix i (LR_*) of part k for the step's rows x (at stride ldx; y [T][N]):
 * the layer's own on every row, then each adapter's on the rows of the sequences that ask for
 * it, once for all of them (rows gathered when their sequences are not consecutive; every
 * row's values are those of its sequence alone: the kernels are batch-invariant). */
static int deltas(const iflow_model *m, dev_scratch *s, int k, int i, const step_rows *r, float *y, const float *x,
                  int ldx, int N, int K)
{
    IFLOW_TRY(low_rank_rows(s, y, &m->parts[k].w.lr[i], x, ldx, r->T, N, K));
    for (int j = 0; j < r->n_groups; j++) {
        const adapter_rows *g = &r->groups[j];
        const low_rank *l = iflow_adapter_delta(m, g->adapter, layer_of_part(m, k), i);
        if (!l->rank)
            continue;
        if (g->contiguous) {
            IFLOW_TRY(low_rank_rows(s, y + (size_t)g->row0 * N, l, x + (size_t)g->row0 * ldx, ldx, g->n_rows, N, K));
            continue;
        }
        if (!s->dev->host_memory)
            return iflow_seterr(IFLOW_EUNSUPPORTED, "%s computes no LoRA adapter at run time", s->dev->info.name);
        IFLOW_TRY(grow_scratch(s, &s->lx, &s->n_lx, (size_t)g->n_rows * K));
        IFLOW_TRY(grow_scratch(s, &s->ly, &s->n_ly, (size_t)g->n_rows * N));
        gather_rows(r, g, x, (size_t)ldx, s->lx, (size_t)K);
        gather_rows(r, g, y, (size_t)N, s->ly, (size_t)N);
        IFLOW_TRY(low_rank_rows(s, s->ly, l, s->lx, K, g->n_rows, N, K));
        scatter_rows(r, g, y, (size_t)N, s->ly, (size_t)N);
    }
    return 0;
}

/* 1 if some row of the step has a delta of matrix i (LR_*) in part k. */
static int has_delta(const iflow_model *m, int k, int i, const step_rows *r)
{
    if (m->parts[k].w.lr[i].rank)
        return 1;
    for (int j = 0; j < r->n_groups; j++)
        if (iflow_adapter_delta(m, r->groups[j].adapter, layer_of_part(m, k), i)->rank)
            return 1;
    return 0;
}

/* A sub-block's output times residual_scale (Granite's residual_multiplier), before the add;
 * a part's partial sum too (the scale is linear). Host memory only (place.c refuses others). */
static void scale_output(const iflow_hparams *hp, iflow_device *d, float *xb, int T)
{
    const size_t n = (size_t)T * hp->dim;
    if (hp->residual_scale > 0 && hp->residual_scale != 1.0f && d->host_memory)
        for (size_t i = 0; i < n; i++)
            xb[i] *= hp->residual_scale;
}

/* qk_norm per head: the q_rows heads of q and kv_rows of k (rows of head_dim) RMS-normed. */
static int head_norms(const iflow_hparams *hp, iflow_device *d, dev_scratch *s, const layer_weights *w, int q_rows,
                      int kv_rows)
{
    IFLOW_TRY(d->ops->rmsnorm(d, s->q, s->q, w->q_norm, q_rows, hp->head_dim, hp->norm_eps));
    return d->ops->rmsnorm(d, s->kx, s->kx, w->k_norm, kv_rows, hp->head_dim, hp->norm_eps);
}

/* x[0..n) clamped to [-c, c]. */
static void clamp_rows(float *x, size_t n, float c)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] > c ? c : x[i] < -c ? -c : x[i];
}

/* The rotated dimensions of `heads` heads of hd in T rows (stride ld) times hp->rope_rot_scale,
 * a rope scaling's attention factor on a partial rotation (host memory: place.c refuses others). */
static void scale_rotated(const iflow_hparams *hp, float *x, size_t ld, int T, int heads, int hd)
{
    if (hp->rope_rot_scale == 1.0f)
        return;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < hp->rope_dim; i++)
                x[(size_t)t * ld + (size_t)h * hd + i] *= hp->rope_rot_scale;
}

/* Latent attention (model.h; DeepSeek-V2/V3) of part k, a whole layer, for a step's rows on its
 * host device s, into s->xb (added into s->x when `residual`), absorbed as in DeepSeek-V2's
 * paper, section 2.1.2 (and llama.cpp's MLA): the cache keeps one row a position,
 * [rope(k_pe) | norm(c)] with [c | k_pe] = wkv_a x; head h's query is
 * [rope(q_pe) | wk_b[h] q_nope] ([q_nope | q_pe] = wq x, or wq norm(wq_a x)), so that its score
 * with a row is the expanded key's q_nope . (W_UK c) + q_pe . k_pe; its output's latent part o
 * leaves through wv_b[h] o ([v_head_dim]), and wo takes the heads' [H * v_head_dim]. Scratch:
 * s->mla holds q_a and the whole queries, s->vx the new latent rows before their norm, s->q
 * the heads' values once attention has read the queries. */
static int mla_attention_block(iflow_ctx *c, dev_scratch *s, int k, const step_rows *r, int residual)
{
    const iflow_model *m = c->m;
    const iflow_hparams *hp = &m->hp;
    const layer_weights *w = &m->parts[k].w;
    const ifk_kv_layout *L = &r->kv->L[k];
    iflow_device *d = s->dev;
    const float *rope_scale = rope_scale_of(m, r->kv, m->parts[k].dev);
    const int D = hp->dim, H = hp->n_heads, R = hp->kv_lora_rank, P = hp->rope_dim, N = hp->qk_nope_dim,
              VH = hp->v_head_dim, QR = hp->q_lora_rank, T = r->T, layer = layer_of_part(m, k);
    const int hd = R + P, Q = H * hd, QH = H * (N + P), VO = H * VH; /* a cache row, the queries, wq's, wo's */
    float *qa = s->mla, *qf = s->mla + (size_t)T * QR, *vo = s->q;
    const float *in;
    IFLOW_TRY(iflow_block_in(m, d, s->x, s->xb, w->attn_norm, w->attn_norm_b, T, &in));
    if (d->host_memory)
        iflow_observe(c, layer, IFLOW_OBS_ATTN_IN, 0, in, D, T, D);
    if (QR) { /* the queries [T][H][N + P] */
        IFLOW_TRY(iflow_linear_rows(d, qa, QR, w->wq_a, NULL, in, D, T, QR, D));
        IFLOW_TRY(d->ops->rmsnorm(d, qa, qa, w->q_a_norm, T, QR, hp->norm_eps));
        IFLOW_TRY(iflow_linear_rows(d, qf, QH, w->wq, NULL, qa, QR, T, QH, QR));
    } else {
        IFLOW_TRY(iflow_linear_rows(d, qf, QH, w->wq, NULL, in, D, T, QH, D));
    }
    IFLOW_TRY(iflow_linear_rows(d, s->vx, hd, w->wkv_a, NULL, in, D, T, hd, D)); /* [c | k_pe] */
    for (int t = 0; t < T; t++) { /* the rows to store: [k_pe | norm(c)] */
        const float *src = s->vx + (size_t)t * hd;
        float *dst = s->kx + (size_t)t * hd;
        memcpy(dst, src + R, (size_t)P * sizeof(float));
        IFLOW_TRY(d->ops->rmsnorm(d, dst + P, src, w->kv_a_norm, 1, R, hp->norm_eps));
    }
    for (int h = 0; h < H; h++) { /* head h's query: [q_pe | wk_b[h] q_nope] */
        for (int t = 0; t < T; t++)
            memcpy(s->q + (size_t)t * Q + (size_t)h * hd, qf + (size_t)t * QH + (size_t)h * (N + P) + N,
                   (size_t)P * sizeof(float));
        IFLOW_TRY(iflow_linear_rows(d, s->q + (size_t)h * hd + P, Q, w->mla_heads[h], NULL, qf + (size_t)h * (N + P),
                                    QH, T, R, N));
    }
    const float theta = layer_theta(m, L);
    for (int i = 0; i < r->n_seq; i++) { /* rope on each head's first P dimensions, and on k_pe */
        const ifk_kv_seq *q = &r->seq[i];
        IFLOW_TRY(d->ops->rope(d, s->q + (size_t)q->row0 * Q, (size_t)Q, q->n_rows, H, hd, P, q->pos0, theta,
                               rope_scale, hp->rope_layout));
        IFLOW_TRY(d->ops->rope(d, s->kx + (size_t)q->row0 * hd, (size_t)hd, q->n_rows, 1, hd, P, q->pos0, theta,
                               rope_scale, hp->rope_layout));
    }
    scale_rotated(hp, s->q, (size_t)Q, T, H, hd);
    scale_rotated(hp, s->kx, (size_t)hd, T, 1, hd);
    IFLOW_TRY(d->ops->kv_store(d, r->kv->k[k], L, r->seq, r->n_seq, s->kx, (size_t)hd));
    /* multi-query attention over the rows, which are the values too (each head's first P
     * output dimensions, the k_pe sums, are not read) */
    IFLOW_TRY(d->ops->attention_paged(d, s->att, s->q, (size_t)Q, r->kv->k[k], r->kv->k[k], L, r->seq, r->n_seq, H,
                                      hp->attn_scale));
    for (int h = 0; h < H; h++) { /* head h's value: wv_b[h] o */
        IFLOW_TRY(iflow_linear_rows(d, vo + (size_t)h * VH, VO, w->mla_heads[H + h], NULL, s->att + (size_t)h * hd + P,
                                    Q, T, VH, R));
    }
    if (d->host_memory)
        iflow_observe(c, layer, IFLOW_OBS_ATTN_OUT, 0, vo, VO, T, VO);
    IFLOW_TRY(iflow_linear_rows(d, s->xb, D, w->wo, NULL, vo, VO, T, D, VO));
    if (w->attn_post_norm)
        IFLOW_TRY(d->ops->rmsnorm(d, s->xb, s->xb, w->attn_post_norm, T, D, hp->norm_eps));
    scale_output(hp, d, s->xb, T);
    return residual ? iflow_block_out(m, d, s->x, s->xb, w->attn_norm, w->attn_norm_b, T) : 0;
}

/* Attention sub-block of part k (of a layer) for a step's rows on its device s: its heads'
 * output projection into s->xb (a partial sum when the layer is split), added into s->x when
 * `residual`. The new keys and values go through s->kx / s->vx into the cache's blocks. */
static int attention_block(iflow_ctx *c, dev_scratch *s, int k, const step_rows *r, int residual)
{
    const iflow_model *m = c->m;
    const iflow_hparams *hp = &m->hp;
    if (hp->kv_lora_rank)
        return mla_attention_block(c, s, k, r, residual);
    const layer_part *p = &m->parts[k];
    const layer_weights *w = &p->w;
    const ifk_kv_layout *L = &r->kv->L[k];
    iflow_device *d = s->dev;
    const float *rope_scale = rope_scale_of(m, r->kv, p->dev);
    int D = hp->dim, hd = hp->head_dim, nq = p->q1 - p->q0, nkv = p->kv1 - p->kv0, Q = nq * hd, KV = nkv * hd, T = r->T;
    const float *in;
    IFLOW_TRY(iflow_block_in(m, s->dev, s->x, s->xb, w->attn_norm, w->attn_norm_b, T, &in));
    if (d->host_memory && p->q0 == 0) /* the inputs of every matrix, for importance matrices (observe.h) */
        iflow_observe(c, layer_of_part(m, k), IFLOW_OBS_ATTN_IN, 0, in, D, T, D);
    if (d->ops->qkv && w->wq.type == w->wk.type && w->wq.type == w->wv.type) { /* one op for the three */
        IFLOW_TRY(d->ops->qkv(d, s->q, (size_t)Q, s->kx, s->vx, (size_t)KV, w->wq.data, w->wk.data, w->wv.data,
                              w->wq.type, in, (size_t)D, T, Q, KV, D));
        if (w->bq)
            IFLOW_TRY(d->ops->add_bias(d, s->q, (size_t)Q, w->bq, T, Q));
        if (w->bk)
            IFLOW_TRY(d->ops->add_bias(d, s->kx, (size_t)KV, w->bk, T, KV));
        if (w->bv)
            IFLOW_TRY(d->ops->add_bias(d, s->vx, (size_t)KV, w->bv, T, KV));
    } else {
        IFLOW_TRY(iflow_linear_rows(s->dev, s->q, Q, w->wq, w->bq, in, D, T, Q, D));
        IFLOW_TRY(iflow_linear_rows(s->dev, s->kx, KV, w->wk, w->bk, in, D, T, KV, D));
        IFLOW_TRY(iflow_linear_rows(s->dev, s->vx, KV, w->wv, w->bv, in, D, T, KV, D));
    }
    IFLOW_TRY(deltas(m, s, k, LR_Q, r, s->q, in, D, Q, D));
    IFLOW_TRY(deltas(m, s, k, LR_K, r, s->kx, in, D, KV, D));
    IFLOW_TRY(deltas(m, s, k, LR_V, r, s->vx, in, D, KV, D));
    if (w->q_norm && hp->qk_norm_full) { /* the whole projection's (a whole layer: check_splittable) */
        IFLOW_TRY(d->ops->rmsnorm(d, s->q, s->q, w->q_norm, T, Q, hp->norm_eps));
        IFLOW_TRY(d->ops->rmsnorm(d, s->kx, s->kx, w->k_norm, T, KV, hp->norm_eps));
    } else if (w->q_norm && !hp->qk_norm_late) { /* qk_norm: each head's q and k (rows of head_dim) */
        IFLOW_TRY(head_norms(hp, d, s, w, T * nq, T * nkv));
    }
    if (hp->clip_qkv > 0 && d->host_memory) { /* OLMo's clamp (place.c refuses other devices) */
        clamp_rows(s->q, (size_t)T * Q, hp->clip_qkv);
        clamp_rows(s->kx, (size_t)T * KV, hp->clip_qkv);
        clamp_rows(s->vx, (size_t)T * KV, hp->clip_qkv);
    }
    const float theta = layer_theta(m, L);
    const int rotates = iflow_layer_rotates(hp, layer_of_part(m, k)); /* NoPE layers: keys stored as they are */
    const int late = w->q_norm && hp->qk_norm_late; /* each head's q and k normed after RoPE (Hunyuan) */
    if (rotates && d->ops->rope_store && !late && hp->rope_rot_scale == 1.0f) { /* RoPE and the cache store in one op */
        const ifk_rope_params rp = {.rot_dim = hp->rope_dim, .theta = theta, .freq_scale = rope_scale,
                                    .layout = hp->rope_layout};
        for (int i = 0; i < r->n_seq; i++) {
            const ifk_kv_seq *q = &r->seq[i];
            IFLOW_TRY(d->ops->rope_store(d, s->q + (size_t)q->row0 * Q, (size_t)Q, nq, s->kx + (size_t)q->row0 * KV,
                                         s->vx + (size_t)q->row0 * KV, (size_t)KV, r->kv->k[k], r->kv->v[k], L, q,
                                         &rp));
        }
    } else {
        for (int i = 0; i < r->n_seq && rotates; i++) {
            const ifk_kv_seq *q = &r->seq[i];
            IFLOW_TRY(d->ops->rope(d, s->q + (size_t)q->row0 * Q, (size_t)Q, q->n_rows, nq, hd, hp->rope_dim, q->pos0,
                                   theta, rope_scale, hp->rope_layout));
            IFLOW_TRY(d->ops->rope(d, s->kx + (size_t)q->row0 * KV, (size_t)KV, q->n_rows, nkv, hd, hp->rope_dim,
                                   q->pos0, theta, rope_scale, hp->rope_layout));
        }
        if (rotates) {
            scale_rotated(hp, s->q, (size_t)Q, T, nq, hd);
            scale_rotated(hp, s->kx, (size_t)KV, T, nkv, hd);
        }
        if (late)
            IFLOW_TRY(head_norms(hp, d, s, w, T * nq, T * nkv));
        IFLOW_TRY(d->ops->kv_store(d, r->kv->k[k], L, r->seq, r->n_seq, s->kx, (size_t)KV));
        IFLOW_TRY(d->ops->kv_store(d, r->kv->v[k], L, r->seq, r->n_seq, s->vx, (size_t)KV));
    }
    ifk_kv_layout La = *L; /* the cache's layout, with the part's heads' sinks */
    La.sinks = w->sinks;
    IFLOW_TRY(d->ops->attention_paged(d, s->att, s->q, (size_t)Q, r->kv->k[k], r->kv->v[k], &La, r->seq, r->n_seq, nq,
                                      hp->attn_scale));
    /* o-projection into xb (free now), then the residual add */
    if (d->host_memory)
        iflow_observe(c, layer_of_part(m, k), IFLOW_OBS_ATTN_OUT, p->q0 * hd, s->att, Q, T, Q);
    IFLOW_TRY(iflow_linear_rows(s->dev, s->xb, D, w->wo, w->bo, s->att, Q, T, D, Q));
    IFLOW_TRY(deltas(m, s, k, LR_O, r, s->xb, s->att, Q, D, Q));
    if (w->attn_post_norm) /* post_norms: on the whole output (a split layer is refused) */
        IFLOW_TRY(d->ops->rmsnorm(d, s->xb, s->xb, w->attn_post_norm, T, D, hp->norm_eps));
    scale_output(hp, d, s->xb, T);
    return residual ? iflow_block_out(m, s->dev, s->x, s->xb, w->attn_norm, w->attn_norm_b, T) : 0;
}

/* The dense FFN of part k for the step's rows `in` (its columns' share): the down projection
 * into s->xb, with the run-time LoRA deltas of gate, up and down. */
static int dense_ffn(iflow_ctx *c, dev_scratch *s, int k, const step_rows *r, const float *in)
{
    const iflow_model *m = c->m;
    const iflow_hparams *hp = &m->hp;
    const int T = r->T;
    const layer_part *p = &m->parts[k];
    const layer_weights *w = &p->w;
    iflow_device *d = s->dev;
    int D = hp->dim, F = p->f1 - p->f0;
    if (has_delta(m, k, LR_GATE, r) || has_delta(m, k, LR_UP, r)) { /* the deltas go in before the activation */
        const int gated = hp->ffn == IFLOW_FFN_GATED;
        IFLOW_TRY(iflow_ffn_linears(hp, d, w, in, T, F, s->gate, s->up));
        IFLOW_TRY(deltas(m, s, k, gated ? LR_GATE : LR_UP, r, s->gate, in, D, F, D));
        if (gated)
            IFLOW_TRY(deltas(m, s, k, LR_UP, r, s->up, in, D, F, D));
        IFLOW_TRY(iflow_ffn_act(hp, d, s->gate, s->up, T, F));
    } else {
        IFLOW_TRY(iflow_ffn_hidden(hp, d, w, in, T, F, s->gate, s->up));
    }
    if (d->host_memory)
        iflow_observe(c, layer_of_part(m, k), IFLOW_OBS_FFN_MID, p->f0, s->gate, F, T, F);
    IFLOW_TRY(iflow_linear_rows(d, s->xb, D, w->down, w->down_b, s->gate, F, T, D, F));
    return deltas(m, s, k, LR_DOWN, r, s->xb, s->gate, F, D, F);
}

/* FFN sub-block of part k for T tokens: its columns' down projection (dense), or the mixture
 * of experts' output (moe.c: whole layers), into s->xb, added into s->x when `residual`.
 * normed: s->xb holds the block's input already (add_rmsnorm). */
static int ffn_block(iflow_ctx *c, dev_scratch *s, int k, const step_rows *r, int residual, int normed)
{
    const iflow_model *m = c->m;
    const iflow_hparams *hp = &m->hp;
    const int T = r->T;
    const layer_part *p = &m->parts[k];
    const layer_weights *w = &p->w;
    iflow_device *d = s->dev;
    const float *in = s->xb;
    if (!normed)
        IFLOW_TRY(iflow_block_in(m, d, s->x, s->xb, w->ffn_norm, w->ffn_norm_b, T, &in));
    const int moe = iflow_layer_moe(hp, layer_of_part(m, k));
    if (d->host_memory && p->f0 == 0 && (!moe || hp->shared_expert)) /* the dense FFN's (shared expert's) */
        iflow_observe(c, layer_of_part(m, k), IFLOW_OBS_FFN_IN, 0, in, hp->dim, T, hp->dim);
    if (!moe) {
        IFLOW_TRY(dense_ffn(c, s, k, r, in));
    } else {
        if (has_delta(m, k, LR_GATE, r) || has_delta(m, k, LR_UP, r) || has_delta(m, k, LR_DOWN, r))
            return iflow_seterr(IFLOW_EUNSUPPORTED, "a LoRA adapter on a mixture of experts' FFN is not implemented");
        IFLOW_TRY(iflow_moe_ffn(hp, c, layer_of_part(m, k), d, &s->moe, w, in, T, s->xb));
    }
    if (w->ffn_post_norm)
        IFLOW_TRY(d->ops->rmsnorm(d, s->xb, s->xb, w->ffn_post_norm, T, hp->dim, hp->norm_eps));
    scale_output(hp, d, s->xb, T);
    return residual ? iflow_block_out(m, d, s->x, s->xb, w->ffn_norm, w->ffn_norm_b, T) : 0;
}

/* A whole layer (part k) on device s: attention then FFN, each added into the residual stream;
 * with parallel_residual both read the layer's input, x + attn(n1(x)) + ffn(n2(x)): the
 * attention's output waits in s->xa (swapped with s->xb, no copy) while the FFN runs. */
static int layer_block(iflow_ctx *c, dev_scratch *s, int k, const step_rows *r)
{
    const iflow_hparams *hp = &c->m->hp;
    iflow_device *d = s->dev;
    if (!hp->parallel_residual && !hp->post_ln && !hp->post_norms_only && hp->norm == IFLOW_NORM_RMS &&
        d->ops->add_rmsnorm) {
        /* the attention's residual add and the FFN's norm in one op */
        IFLOW_TRY(attention_block(c, s, k, r, 0));
        IFLOW_TRY(d->ops->add_rmsnorm(d, s->x, s->xb, c->m->parts[k].w.ffn_norm, r->T, hp->dim, hp->norm_eps));
        return ffn_block(c, s, k, r, 1, 1);
    }
    if (!hp->parallel_residual) {
        IFLOW_TRY(attention_block(c, s, k, r, 1));
        return ffn_block(c, s, k, r, 1, 0);
    }
    IFLOW_TRY(attention_block(c, s, k, r, 0));
    float *t = s->xa;
    s->xa = s->xb, s->xb = t;
    IFLOW_TRY(ffn_block(c, s, k, r, 1, 0));
    return s->dev->ops->add(s->dev, s->x, s->xa, (size_t)r->T * c->m->hp.dim);
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
            IFLOW_TRY(s->dev->ops->download(s->dev, dst, s->xb, n * sizeof(float)));
        if (k > k0)
            ifk_add(c->acc, c->stage, (int)n);
    }
    return 0;
}

/* One part's share of a split sub-block, run on a thread of its own. */
typedef struct {
    iflow_ctx *c;
    const step_rows *r;
    int k, is_ffn, rc;
    char err[512];            /* the message of a failure (messages are per thread) */
} part_job;

static void *run_part(void *arg)
{
    part_job *j = arg;
    int dv = j->c->m->parts[j->k].dev;
    j->rc = move_to(j->c, HOST, dv, j->r->T);
    if (j->rc == 0)
        j->rc = j->is_ffn ? ffn_block(j->c, &j->c->dev[dv], j->k, j->r, 0, 0)
                          : attention_block(j->c, &j->c->dev[dv], j->k, j->r, 0);
    if (j->rc < 0)
        snprintf(j->err, sizeof j->err, "%s", iflow_errmsg());
    return NULL;
}

/* One sub-block (attention or FFN) of a layer split over parts k0..k1-1: each part on its own
 * device, concurrently (a thread per part beyond the first; each device computes with its own
 * threads), from the residual stream c->xh; then c->xh += the sum of their outputs. */
static int split_block(iflow_ctx *c, int k0, int k1, const step_rows *r, int is_ffn)
{
    const int T = r->T;
    part_job jobs[IFLOW_MAX_DEVICES];
    pthread_t th[IFLOW_MAX_DEVICES];
    int started[IFLOW_MAX_DEVICES] = {0}, n = k1 - k0;
    for (int i = 0; i < n; i++)
        jobs[i] = (part_job){.c = c, .r = r, .k = k0 + i, .is_ffn = is_ffn};
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
    IFLOW_TRY(all_reduce(c, k0, k1, T));
    ifk_add(c->xh, c->acc, T * c->m->hp.dim);
    return 0;
}

/* Embedding rows of T tokens, looked up on the host, into device `to`'s residual stream, or into
 * c->xh for HOST. */
static int embed(iflow_ctx *c, const int32_t *ids, const step_rows *r, int to)
{
    const iflow_model *m = c->m;
    int D = m->hp.dim, T = r->T;
    float *rows = to == HOST ? c->xh : c->dev[to].dev->host_memory ? c->dev[to].x : c->stage;
    for (int t = 0; t < T; t++) {
        float *row = rows + (size_t)t * D;
        ifk_get_row(row, m->tok_embd.data, m->tok_embd.type, (size_t)ids[t], D);
        if (m->hp.embed_scale != 1.0f) /* block embedding = scaled */
            for (int i = 0; i < D; i++)
                row[i] *= m->hp.embed_scale;
    }
    if (m->hp.position == IFLOW_POS_LEARNED) /* + the learned row of each token's position */
        for (int i = 0; i < r->n_seq; i++)
            for (int j = 0; j < r->seq[i].n_rows; j++) {
                int pos = r->seq[i].pos0 + j;
                if (pos >= m->hp.max_seq)
                    return iflow_seterr(IFLOW_ERANGE, "position %d is past the model's %d learned positions", pos,
                                        m->hp.max_seq);
                float *row = rows + (size_t)(r->seq[i].row0 + j) * D, tmp[D];
                ifk_get_row(tmp, m->pos_embd.data, m->pos_embd.type, (size_t)pos, D);
                for (int d = 0; d < D; d++)
                    row[d] += tmp[d];
            }
    float type0[D]; /* encoders: + token type 0 (one segment), then the norm */
    if (m->hp.token_types > 0)
        ifk_get_row(type0, m->tok_type_embd.data, m->tok_type_embd.type, 0, D);
    for (int t = 0; t < T; t++) {
        float *row = rows + (size_t)t * D;
        for (int d = 0; d < D && m->hp.token_types > 0; d++)
            row[d] += type0[d];
        if (m->hp.embed_norm && m->hp.norm == IFLOW_NORM_LAYER)
            ifk_layernorm(row, row, m->embd_norm, m->embd_norm_b, D, m->hp.norm_eps);
        else if (m->hp.embed_norm)
            ifk_rmsnorm(row, row, m->embd_norm, D, m->hp.norm_eps);
    }
    if (to == HOST || rows == c->dev[to].x)
        return 0;
    return c->dev[to].dev->ops->upload(c->dev[to].dev, c->dev[to].x, rows, (size_t)T * D * sizeof(float));
}

/* The refusal to run a model opened for one plan device (iflow_model_open_device) without the
 * other processes. */
static int own_device_only(const iflow_model *m)
{
    return iflow_seterr(IFLOW_EINVAL, "a model opened for plan device %d runs only as that process of a plan's "
                        "processes (iflow_ctx_set_comm)", m->own_dev);
}

/* The layers for a step's rows (ids [r->T]); the hidden state ends on the output device.
 * Returns the output device's scratch. */
static int forward_layers(iflow_ctx *c, const int32_t *ids, const step_rows *r, dev_scratch **out)
{
    const iflow_model *m = c->m;
    if (m->own_dev >= 0)
        return own_device_only(m);
    int T = r->T, first_whole = m->part0[1] - m->part0[0] == 1;
    int cur = first_whole ? m->parts[0].dev : HOST;
    IFLOW_TRY(embed(c, ids, r, cur));
    for (int l = 0; l < m->hp.n_layers; l++) {
        int k0 = m->part0[l], k1 = m->part0[l + 1];
        if (k1 - k0 == 1) {
            int dv = m->parts[k0].dev;
            IFLOW_TRY(move_to(c, cur, dv, T));
            cur = dv;
            IFLOW_TRY(layer_block(c, &c->dev[dv], k0, r));
        } else {
            IFLOW_TRY(move_to_host(c, cur, T));
            cur = HOST;
            IFLOW_TRY(split_block(c, k0, k1, r, 0));
            IFLOW_TRY(split_block(c, k0, k1, r, 1));
        }
    }
    IFLOW_TRY(move_to(c, cur, m->output_dev, T));
    *out = &c->dev[m->output_dev];
    return 0;
}

/* ---- one plan over several processes (comm.h) ---------------------------------------------
 *
 * Process r computes the parts on plan device r. `holder` is the process whose copy of the
 * hidden state is current (ALL: every process's is); `cur` is where this process keeps its copy
 * (its device, or HOST: c->xh). When the comm takes device buffers and this process's device
 * memory is not the host's (a GPU over NCCL), the state is exchanged from and into that memory
 * and stays there; otherwise it crosses through c->xh. */
enum { ALL = -2 };

/* 1 if this process exchanges the state in its device's memory. */
static int exchanges_on_device(const iflow_ctx *c)
{
    const iflow_device *d = c->dev[c->comm->rank].dev;
    return c->comm->device_buffers && d && !d->host_memory;
}

/* Where this process sends or receives the state: its device's x (moved there first), or
 * c->xh (moved there first); *cur follows. */
static int exchange_buffer(iflow_ctx *c, int *cur, int T, float **buf)
{
    const int me = c->comm->rank;
    if (exchanges_on_device(c)) {
        IFLOW_TRY(move_to(c, *cur, me, T));
        *cur = me;
        *buf = c->dev[me].x;
    } else {
        IFLOW_TRY(move_to_host(c, *cur, T));
        *cur = HOST;
        *buf = c->xh;
    }
    return 0;
}

/* Make process `to` hold the state (from `holder`). */
static int hand_over(iflow_ctx *c, int *holder, int *cur, int to, int T)
{
    iflow_comm *cm = c->comm;
    size_t n = (size_t)T * c->m->hp.dim * sizeof(float);
    float *buf;
    if (*holder == to)
        return 0;
    if (*holder == ALL) { /* `to` has it already; the others' copies go stale */
        *holder = to;
        return 0;
    }
    if (cm->rank == *holder) {
        IFLOW_TRY(exchange_buffer(c, cur, T, &buf));
        IFLOW_TRY(cm->ops->send(cm, buf, n, to));
    } else if (cm->rank == to) {
        IFLOW_TRY(exchange_buffer(c, cur, T, &buf)); /* (what it moves there is overwritten) */
        IFLOW_TRY(cm->ops->recv(cm, buf, n, *holder));
    }
    *holder = to;
    return 0;
}

/* Every process's copy = the holder's state. */
static int share(iflow_ctx *c, int *holder, int *cur, int T)
{
    iflow_comm *cm = c->comm;
    float *buf;
    if (*holder != ALL) {
        IFLOW_TRY(exchange_buffer(c, cur, T, &buf));
        IFLOW_TRY(cm->ops->bcast(cm, buf, (size_t)T * c->m->hp.dim * sizeof(float), *holder));
    }
    *holder = ALL;
    return 0;
}

/* One sub-block of a layer split over parts k0..k1-1 (every process holding the state): this
 * process's part (if any) from its copy, the partial outputs summed over every process (a
 * process without a part adds zeros), the sum added to every copy. On the device when the
 * process exchanges there, else through the host. */
static int split_block_comm(iflow_ctx *c, int *cur, int k0, int k1, const step_rows *r, int is_ffn)
{
    iflow_comm *cm = c->comm;
    const int me = cm->rank;
    const size_t n = (size_t)r->T * c->m->hp.dim;
    int mine = -1;
    for (int k = k0; k < k1; k++)
        if (c->m->parts[k].dev == me)
            mine = k;
    dev_scratch *s = &c->dev[me];
    if (exchanges_on_device(c)) {
        IFLOW_TRY(move_to(c, *cur, me, r->T));
        *cur = me;
        if (mine >= 0)
            IFLOW_TRY(is_ffn ? ffn_block(c, s, mine, r, 0, 0) : attention_block(c, s, mine, r, 0));
        else { /* zeros into the all-reduce */
            memset(c->acc, 0, n * sizeof(float));
            IFLOW_TRY(s->dev->ops->upload(s->dev, s->xb, c->acc, n * sizeof(float)));
        }
        IFLOW_TRY(cm->ops->allreduce_sum(cm, s->xb, n));
        return s->dev->ops->add(s->dev, s->x, s->xb, n);
    }
    IFLOW_TRY(move_to_host(c, *cur, r->T));
    *cur = HOST;
    memset(c->acc, 0, n * sizeof(float));
    if (mine >= 0) {
        IFLOW_TRY(move_to(c, HOST, me, r->T));
        IFLOW_TRY(is_ffn ? ffn_block(c, s, mine, r, 0, 0) : attention_block(c, s, mine, r, 0));
        if (s->dev->host_memory)
            memcpy(c->acc, s->xb, n * sizeof(float));
        else
            IFLOW_TRY(s->dev->ops->download(s->dev, c->acc, s->xb, n * sizeof(float)));
    }
    IFLOW_TRY(cm->ops->allreduce_sum(cm, c->acc, n));
    ifk_add(c->xh, c->acc, (int)n);
    return 0;
}

/* The layers for a step's rows, this process's share; the state ends with the output device's
 * process, whose scratch *out is (NULL on the other processes). */
static int forward_layers_comm(iflow_ctx *c, const int32_t *ids, const step_rows *r, dev_scratch **out)
{
    const iflow_model *m = c->m;
    const int me = c->comm->rank, T = r->T;
    int holder = m->parts[m->part0[0]].dev, cur = HOST; /* layer 0's first part's process embeds (split.h) */
    if (me == holder)
        IFLOW_TRY(embed(c, ids, r, HOST));
    for (int l = 0; l < m->hp.n_layers; l++) {
        int k0 = m->part0[l], k1 = m->part0[l + 1];
        if (k1 - k0 == 1) {
            int dv = m->parts[k0].dev;
            IFLOW_TRY(hand_over(c, &holder, &cur, dv, T));
            if (me == dv) {
                IFLOW_TRY(move_to(c, cur, dv, T));
                cur = dv;
                IFLOW_TRY(layer_block(c, &c->dev[dv], k0, r));
            }
        } else {
            IFLOW_TRY(share(c, &holder, &cur, T));
            IFLOW_TRY(split_block_comm(c, &cur, k0, k1, r, 0));
            IFLOW_TRY(split_block_comm(c, &cur, k0, k1, r, 1));
        }
    }
    IFLOW_TRY(hand_over(c, &holder, &cur, m->output_dev, T));
    *out = NULL;
    if (me == m->output_dev) {
        IFLOW_TRY(move_to(c, cur, m->output_dev, T));
        *out = &c->dev[m->output_dev];
    }
    return 0;
}

/* Every process runs the same model: its identity (a split's files were cut from one source) agrees
 * with process 0's, on every process or on none, so that all fail together. */
static int check_same_model(const iflow_model *m, iflow_comm *cm)
{
    uint64_t mine = iflow_model_identity(m), root = mine;
    IFLOW_TRY(cm->ops->bcast(cm, &root, sizeof root, 0));
    float differ = root != mine, n_differ = differ;
    IFLOW_TRY(cm->ops->allreduce_sum(cm, &n_differ, 1));
    if (differ)
        return iflow_seterr(IFLOW_EINVAL, "'%s' is not the model process 0 runs (%s)", iflow_shard_path(m->shard),
                            m->split_plan ? "a file of a split cut from another model" : "its meta record differs");
    if (n_differ > 0)
        return iflow_seterr(IFLOW_EINVAL, "%.0f of the %d processes run another model than process 0's", n_differ,
                            cm->size);
    return 0;
}

int iflow_ctx_set_comm(iflow_ctx *c, iflow_comm *comm)
{
    const iflow_model *m = c->m;
    if (comm && comm->size != m->n_devs)
        return iflow_seterr(IFLOW_EINVAL, "%d processes for a placement of %d devices: run one process per device",
                            comm->size, m->n_devs);
    if (comm && (comm->rank < 0 || comm->rank >= comm->size))
        return iflow_seterr(IFLOW_EINVAL, "process rank %d outside 0..%d", comm->rank, comm->size - 1);
    if (comm && m->own_dev >= 0 && m->own_dev != comm->rank)
        return iflow_seterr(IFLOW_EINVAL, "process %d has the model of plan device %d", comm->rank, m->own_dev);
    if (!comm && m->own_dev >= 0)
        return own_device_only(m);
    if (comm)
        IFLOW_TRY(check_same_model(m, comm));
    c->comm = comm;
    return 0;
}

/* T tokens of the context's own sequence at its next positions. */
static int forward_own(iflow_ctx *c, const int32_t *ids, int T, dev_scratch **out)
{
    ifk_kv_seq seq = {.row0 = 0, .n_rows = T, .pos0 = c->n_past, .table = c->table0};
    step_rows r = {.kv = c->kv, .seq = &seq, .n_seq = 1, .T = T};
    IFLOW_TRY(forward_layers(c, ids, &r, out));
    c->n_past += T;
    return 0;
}

/* Logits of `rows` normalized hidden states in s->xb, computed on s's device: into host
 * ([rows][vocab]) when the device's memory is the host's, else into device scratch. *y
 * receives where they are. */
static int project_logits(iflow_ctx *c, dev_scratch *s, int rows, float *host, float **y)
{
    const iflow_model *m = c->m;
    int D = m->hp.dim, V = m->hp.vocab_size;
    *y = host;
    if (!s->dev->host_memory) {
        IFLOW_TRY(logits_rows(s, V, rows));
        *y = s->logits;
    }
    return iflow_linear_rows(s->dev, *y, V, m->output_w, m->output_b_w, s->xb, D, rows, V, D);
}

/* Logits of `rows` hidden states of s->x starting at row r0 (see project_logits). */
static int compute_logits(iflow_ctx *c, dev_scratch *s, int r0, int rows, float *host, float **y)
{
    const iflow_hparams *hp = &c->m->hp;
    iflow_device *d = s->dev;
    IFLOW_TRY(iflow_norm_rows(c->m, d, s->xb, s->x + (size_t)r0 * hp->dim, c->m->output_norm_w, c->m->output_norm_b_w, rows, hp->dim));
    if (d->host_memory)
        iflow_observe(c, -1, IFLOW_OBS_OUTPUT_IN, 0, s->xb, hp->dim, rows, hp->dim);
    return project_logits(c, s, rows, host, y);
}

/* logit_scale (Cohere, Granite) then logit_softcap (Gemma 2: x = cap * tanh(x / cap)) on logits
 * handed out (argmax needs neither: both maps keep the order). */
static void finish_logits(const iflow_model *m, float *x, size_t n)
{
    const float scale = m->hp.logit_scale, cap = m->hp.logit_softcap;
    if (scale > 0 && scale != 1.0f)
        for (size_t i = 0; i < n; i++)
            x[i] *= scale;
    if (cap > 0)
        for (size_t i = 0; i < n; i++)
            x[i] = cap * tanhf(x[i] / cap);
}

/* The same logits, into dst on the host. */
static int output_logits(iflow_ctx *c, dev_scratch *s, int r0, int rows, float *dst)
{
    float *y;
    IFLOW_TRY(compute_logits(c, s, r0, rows, dst, &y));
    if (y != dst)
        IFLOW_TRY(s->dev->ops->download(s->dev, dst, y, (size_t)rows * c->m->hp.vocab_size * sizeof(float)));
    finish_logits(c->m, dst, (size_t)rows * c->m->hp.vocab_size);
    return 0;
}

/* A step of one token recorded as one graph (defined with the steps of several sequences). */
static int recordable(const iflow_ctx *c);
static int ctx_step_recorded(iflow_ctx *c, int32_t id, float *logits, int32_t *next);

/* One pass of T <= c->pass tokens. */
static int forward_batch(iflow_ctx *c, const int32_t *ids, int T, float *logits, int all_logits)
{
    if (T == 1 && logits && !all_logits && recordable(c))
        return ctx_step_recorded(c, ids[0], logits, NULL);
    dev_scratch *s;
    IFLOW_TRY(forward_own(c, ids, T, &s));
    if (!logits)
        return 0;
    return all_logits ? output_logits(c, s, 0, T, logits) : output_logits(c, s, T - 1, 1, logits);
}

/* ids [n] all in the vocabulary. */
static int check_ids(const iflow_ctx *c, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->m->hp.vocab_size)
            return iflow_seterr(IFLOW_ERANGE, "token id %d is outside the vocabulary (%d)", ids[i],
                                c->m->hp.vocab_size);
    return 0;
}

/* Logits come from a decoder only. */
static int check_decoder(const iflow_ctx *c)
{
    if (c->m->hp.layout == IFLOW_LAYOUT_ENCODER)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "an encoder gives embeddings (iflow_ctx_embed), not logits");
    if (c->m->hp.layout == IFLOW_LAYOUT_ENCODER_DECODER)
        return iflow_seterr(IFLOW_EUNSUPPORTED,
                            "an encoder-decoder decodes against an encoded source (seq2seq.h), not from a prompt alone");
    return 0;
}

static int check_eval(const iflow_ctx *c, const int32_t *ids, int n)
{
    IFLOW_TRY(check_decoder(c));
    if (!c->kv)
        return iflow_seterr(IFLOW_EINVAL, "this context has no cache of its own (it runs iflow_ctx_step)");
    if (n <= 0)
        return iflow_seterr(IFLOW_EINVAL, "no tokens to evaluate");
    if (n > c->n_ctx - c->n_past)
        return iflow_seterr(IFLOW_ERANGE, "context full: %d tokens at position %d exceed the context of %d", n,
                            c->n_past, c->n_ctx);
    return check_ids(c, ids, n);
}

/* iflow_ctx_eval's batch of T tokens over several processes: a step of the context's own
 * sequence (the comm path of iflow_ctx_step), the logits of its last row or of all rows into out
 * on every process. */
static int eval_batch_comm(iflow_ctx *c, const int32_t *ids, int T, float *out, int all_logits)
{
    iflow_step_seq q = {.ids = ids, .n = T, .pos0 = c->n_past, .table = c->table0, .logits = out,
                        .n_out = out && all_logits ? T : 0};
    IFLOW_TRY(iflow_ctx_step(c, c->kv, &q, 1));
    c->n_past += T;
    return 0;
}

int iflow_ctx_eval(iflow_ctx *c, const int32_t *ids, int n, float *logits, int all_logits)
{
    const iflow_hparams *hp = &c->m->hp;
    IFLOW_TRY(check_eval(c, ids, n));
    const int B = iflow_ctx_step_tokens(c); /* over processes: steps of iflow_ctx_step */
    for (int done = 0; done < n;) {
        int T = n - done < B ? n - done : B, last_batch = done + T == n;
        float *out = all_logits ? logits + (size_t)done * hp->vocab_size : last_batch ? logits : NULL;
        IFLOW_TRY(c->comm ? eval_batch_comm(c, ids + done, T, out, all_logits)
                          : forward_batch(c, ids + done, T, out, all_logits));
        done += T;
    }
    return 0;
}

/* out[d] = the pooled hidden states of rows [n][D] (hyperparameters pooling, normalize). */
static void pool_states(const iflow_hparams *hp, float *out, const float *rows, int n)
{
    const int D = hp->dim;
    double norm2 = 0;
    for (int d = 0; d < D; d++) {
        double v = rows[d]; /* cls: the first position's state */
        if (hp->pooling == IFLOW_POOL_MEAN) {
            for (int t = 1; t < n; t++)
                v += rows[(size_t)t * D + d];
            v /= n;
        }
        out[d] = (float)v;
        norm2 += (double)out[d] * out[d];
    }
    const double len = sqrt(norm2); /* as torch's normalize: divided by max(|v|, 1e-12) */
    for (int d = 0; d < D && hp->normalize; d++)
        out[d] = (float)(out[d] / (len > 1e-12 ? len : 1e-12));
}

int iflow_ctx_embed(iflow_ctx *c, const int32_t *ids, int n, float *out)
{
    const iflow_hparams *hp = &c->m->hp;
    if (hp->layout != IFLOW_LAYOUT_ENCODER)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a decoder gives logits (iflow_ctx_eval), not embeddings");
    if (c->comm || !c->kv)
        return iflow_seterr(IFLOW_EINVAL, "an embedding needs a context with a cache of its own");
    if (n <= 0)
        return iflow_seterr(IFLOW_EINVAL, "no tokens to embed");
    if (n > MAX_BATCH || n > c->n_ctx)
        return iflow_seterr(IFLOW_ERANGE, "an input of %d tokens is longer than an encoder step takes (%d)", n,
                            MAX_BATCH < c->n_ctx ? MAX_BATCH : c->n_ctx);
    IFLOW_TRY(check_ids(c, ids, n));
    dev_scratch *s;
    c->n_past = 0; /* every input on its own: the step attends to itself only */
    int rc = forward_own(c, ids, n, &s);
    c->n_past = 0;
    IFLOW_TRY(rc);
    const float *rows = s->x;
    if (!s->dev->host_memory) {
        IFLOW_TRY(s->dev->ops->download(s->dev, c->stage, s->x, (size_t)n * hp->dim * sizeof(float)));
        rows = c->stage;
    }
    pool_states(hp, out, rows, n);
    return 0;
}

int iflow_ctx_eval_argmax(iflow_ctx *c, const int32_t *ids, int n, int32_t *next)
{
    IFLOW_TRY(check_eval(c, ids, n));
    if (c->comm)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a context over several processes takes iflow_ctx_eval or "
                            "iflow_ctx_step, not iflow_ctx_eval_argmax");
    int done = 0;
    while (n - done > c->pass) {
        IFLOW_TRY(forward_batch(c, ids + done, c->pass, NULL, 0));
        done += c->pass;
    }
    dev_scratch *s;
    int T = n - done;
    float *y;
    if (T == 1 && recordable(c))
        return ctx_step_recorded(c, ids[done], NULL, next);
    IFLOW_TRY(forward_own(c, ids + done, T, &s));
    IFLOW_TRY(compute_logits(c, s, T - 1, 1, c->last_logits, &y));
    return s->dev->ops->argmax(s->dev, next, y, c->m->hp.vocab_size);
}

/* ---- steps of several sequences ------------------------------------------------------------ */

/* c->out_logits with room for `rows` rows. */
static int out_logits_rows(iflow_ctx *c, int rows)
{
    if (c->out_rows >= rows)
        return 0;
    float *p = realloc(c->out_logits, (size_t)rows * c->m->hp.vocab_size * sizeof(float));
    if (!p)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    c->out_logits = p;
    c->out_rows = rows;
    return 0;
}

/* Rows of output a step sequence asks for. */
static int out_rows_of(const iflow_step_seq *q) { return q->n_out > 0 ? q->n_out : 1; }

/* The rows of output a step's sequences ask for: *n_out in all, *n_full of them as logits (the
 * others' as argmax ids). */
static void step_out_rows(const iflow_step_seq *seqs, int n_seqs, int *n_out, int *n_full)
{
    *n_out = *n_full = 0;
    for (int i = 0; i < n_seqs; i++)
        if (seqs[i].logits || seqs[i].next) {
            *n_out += out_rows_of(&seqs[i]);
            *n_full += seqs[i].logits ? out_rows_of(&seqs[i]) : 0;
        }
}

/* The first half of step_logits, which can be recorded: the output norms and the logits of
 * the rows asked for, into *y (c->out_logits on a host device, else device scratch);
 * *n_out = their count (0: nothing asked for, *y untouched), *n_full = the rows wanted whole. */
static int step_project(iflow_ctx *c, dev_scratch *s, const iflow_step_seq *seqs, const ifk_kv_seq *seq, int n_seqs,
                        float **y, int *n_out, int *n_full)
{
    const iflow_hparams *hp = &c->m->hp;
    int D = hp->dim;
    step_out_rows(seqs, n_seqs, n_out, n_full);
    if (*n_out == 0)
        return 0;
    for (int i = 0, j = 0; i < n_seqs; i++) /* j: the output rows so far */
        if (seqs[i].logits || seqs[i].next) {
            int k = out_rows_of(&seqs[i]), r = seq[i].row0 + seq[i].n_rows - k;
            IFLOW_TRY(iflow_norm_rows(c->m, s->dev, s->xb + (size_t)j * D, s->x + (size_t)r * D, c->m->output_norm_w,
                                      c->m->output_norm_b_w, k, D));
            j += k;
        }
    IFLOW_TRY(out_logits_rows(c, *n_out));
    return project_logits(c, s, *n_out, c->out_logits, y);
}

/* The second half: the logits (downloaded) or argmax ids each sequence asks for. */
static int step_outputs(iflow_ctx *c, dev_scratch *s, const iflow_step_seq *seqs, int n_seqs, float *y, int n_out,
                        int n_full)
{
    iflow_device *d = s->dev;
    int V = c->m->hp.vocab_size;
    if (y != c->out_logits && n_full == n_out)
        IFLOW_TRY(d->ops->download(d, c->out_logits, y, (size_t)n_out * V * sizeof(float)));
    for (int i = 0, j = 0; i < n_seqs; i++) {
        if (!seqs[i].logits && !seqs[i].next)
            continue;
        int k = out_rows_of(&seqs[i]);
        const float *row = y + (size_t)j * V;
        if (seqs[i].logits) {
            if (y == c->out_logits || n_full == n_out)
                memcpy(seqs[i].logits, c->out_logits + (size_t)j * V, (size_t)k * V * sizeof(float));
            else
                IFLOW_TRY(d->ops->download(d, seqs[i].logits, row, (size_t)k * V * sizeof(float)));
            finish_logits(c->m, seqs[i].logits, (size_t)k * V);
        } else {
            for (int t = 0; t < k; t++)
                IFLOW_TRY(d->ops->argmax(d, seqs[i].next + t, row + (size_t)t * V, V));
        }
        j += k;
    }
    return 0;
}

/* The logits (or the argmax) after the last n_out rows of every sequence that asks for them,
 * one matrix product for all of them (the output matrix is read once per step). */
static int step_logits(iflow_ctx *c, dev_scratch *s, const iflow_step_seq *seqs, const ifk_kv_seq *seq, int n_seqs)
{
    float *y;
    int n_out, n_full;
    IFLOW_TRY(step_project(c, s, seqs, seq, n_seqs, &y, &n_out, &n_full));
    return n_out ? step_outputs(c, s, seqs, n_seqs, y, n_out, n_full) : 0;
}

/* ---- steps recorded as one graph -------------------------------------------------------------
 *
 * A decode step launches a dozen operations per layer; on a GPU, launching them one by one can
 * cost more than computing them. Where the output device records (its record ops: CUDA
 * graphs) and every layer is whole on it, a step whose sequences each bring one token is
 * recorded from the first layer to the logits and run as one launch: the embedding rows go up
 * before the recording, the logits or argmax ids come down after it. The recording holds the
 * same ops with the same arguments as the step op by op, so the results are identical. A
 * recording that fails (an op that would have to wait, such as a scratch buffer that grows
 * with the context) is dropped and the step runs op by op; after RECORD_MAX_FAILS failures in
 * a row the context stops recording.
 *
 * Recording a step costs the host about what launching its ops does, so recording every step
 * saves nothing (IFLOW_GRAPHS_ALL; on an H200 it was no faster). A step of one sequence of one
 * token is recorded once instead (the device's record_at: the ops that take the position read
 * it on the device) and run again at each next position (replay) while nothing it depends on
 * changed (replay_key): one launch a step, the host free at once (IFLOW_GRAPHS_REPLAY, the
 * default of iflow-run; docs/PERFORMANCE.md has the figures). */
enum { RECORD_MAX_FAILS = 8 };

static int recordable(const iflow_ctx *c)
{
    const iflow_model *m = c->m;
    const iflow_device *d = c->dev[m->output_dev].dev;
    if (!c->record || c->record_fails >= RECORD_MAX_FAILS || c->comm || d->host_memory || !d->ops->record_begin)
        return 0;
    for (int l = 0; l < m->hp.n_layers; l++)
        if (m->part0[l + 1] - m->part0[l] != 1 || m->parts[m->part0[l]].dev != m->output_dev)
            return 0;
    return 1;
}

/* Every layer on the output device s, then step_project. */
static int layers_project(iflow_ctx *c, dev_scratch *s, const step_rows *r, const iflow_step_seq *seqs, int n_seqs,
                          float **y, int *n_out, int *n_full)
{
    for (int l = 0; l < c->m->hp.n_layers; l++)
        IFLOW_TRY(layer_block(c, s, c->m->part0[l], r));
    return step_project(c, s, seqs, r->seq, n_seqs, y, n_out, n_full);
}

/* What a recording of one sequence's one-token step depends on besides the position: the
 * context and the cache (their serials: their buffers), the sequence's block, the logits
 * buffer (it grows), and what the step hands out. A replay under another key records again. */
static uint64_t replay_key(const iflow_ctx *c, const dev_scratch *s, const step_rows *r, const iflow_step_seq *q)
{
    const uint64_t k[6] = {c->serial, r->kv->serial, (uint64_t)(uintptr_t)s->logits, (uint64_t)r->seq[0].table[0],
                           (uint64_t)q->n_out, (q->logits != NULL) | (q->next != NULL) << 1};
    return XXH64(k, sizeof k, 0);
}

/* The positions a sequence of the cache can hold (its block: one block per sequence on a GPU). */
static int replay_max_pos(const iflow_kv *kv)
{
    int most = kv->L[0].block;
    for (int k = 1; k < kv->n_parts; k++)
        most = kv->L[k].block < most ? kv->L[k].block : most;
    return most;
}

/* A step (rows r of tokens ids) with the layers and the projection recorded (recordable(c)). */
static int step_recorded(iflow_ctx *c, const int32_t *ids, const step_rows *r, const iflow_step_seq *seqs, int n_seqs)
{
    dev_scratch *s = &c->dev[c->m->output_dev];
    iflow_device *d = s->dev;
    float *y = NULL;
    int n_out = 0, n_full = 0, rc;
    IFLOW_TRY(embed(c, ids, r, c->m->output_dev));
    /* One sequence of one token: run the last recording again if it holds (replay_key), else
     * record one that can be (record_at). */
    const int at = n_seqs == 1 && r->T == 1 && d->ops->record_at && d->ops->replay;
    const int pos0 = r->seq[0].pos0;
    uint64_t key = 0;
    if (at) {
        key = replay_key(c, s, r, seqs);
        if ((rc = d->ops->replay(d, pos0, key)) < 0)
            return rc;
        if (rc == 0) { /* what step_project left in s->logits: the key names it */
            step_out_rows(seqs, n_seqs, &n_out, &n_full);
            return n_out ? step_outputs(c, s, seqs, n_seqs, s->logits, n_out, n_full) : 0;
        }
        rc = d->ops->record_at(d, pos0, replay_max_pos(r->kv), key);
    } else {
        rc = d->ops->record_begin(d);
    }
    if (rc == 0) {
        rc = layers_project(c, s, r, seqs, n_seqs, &y, &n_out, &n_full);
        if (rc == 0)
            rc = d->ops->record_end(d);
        else
            d->ops->record_abort(d);
    }
    if (rc < 0) { /* nothing recorded ran: the step op by op */
        c->record_fails++;
        IFLOW_TRY(layers_project(c, s, r, seqs, n_seqs, &y, &n_out, &n_full));
    } else {
        c->record_fails = 0;
    }
    return n_out ? step_outputs(c, s, seqs, n_seqs, y, n_out, n_full) : 0;
}

/* iflow_ctx_eval's and iflow_ctx_eval_argmax's step of one token, recorded: logits [vocab]
 * (host) or *next. */
static int ctx_step_recorded(iflow_ctx *c, int32_t id, float *logits, int32_t *next)
{
    iflow_step_seq q = {.ids = &id, .n = 1, .pos0 = c->n_past, .table = c->table0, .logits = logits, .next = next};
    ifk_kv_seq seq = {.row0 = 0, .n_rows = 1, .pos0 = c->n_past, .table = c->table0};
    step_rows r = {.kv = c->kv, .seq = &seq, .n_seq = 1, .T = 1};
    IFLOW_TRY(step_recorded(c, &id, &r, &q, 1));
    c->n_past += 1;
    return 0;
}

void iflow_ctx_set_graphs(iflow_ctx *c, int mode)
{
    c->record = mode == IFLOW_GRAPHS_ALL || mode == IFLOW_GRAPHS_REPLAY ? mode : IFLOW_GRAPHS_OFF;
}

int iflow_ctx_step_tokens(const iflow_ctx *c)
{
    return c->comm ? MAX_BATCH : c->pass; /* every process of a comm steps at MAX_BATCH */
}

int iflow_ctx_step(iflow_ctx *c, iflow_kv *kv, const iflow_step_seq *seqs, int n_seqs)
{
    int32_t *ids = c->step_ids;
    ifk_kv_seq *seq = c->step_seq;
    const int max_T = iflow_ctx_step_tokens(c);
    int T = 0, adapters = 0;
    if (kv->m != c->m)
        return iflow_seterr(IFLOW_EINVAL, "the KV cache belongs to another model");
    IFLOW_TRY(check_decoder(c));
    if (n_seqs <= 0)
        return iflow_seterr(IFLOW_EINVAL, "no sequences in the step");
    for (int i = 0; i < n_seqs; i++) {
        const iflow_step_seq *q = &seqs[i];
        if (q->n <= 0 || q->pos0 < 0 || !q->table)
            return iflow_seterr(IFLOW_EINVAL, "sequence %d of the step has %d tokens at position %d", i, q->n, q->pos0);
        if (q->n_out < 0 || q->n_out > q->n)
            return iflow_seterr(IFLOW_EINVAL, "sequence %d of the step asks for %d rows of output of its %d", i, q->n_out,
                                q->n);
        if (T + q->n > max_T)
            return iflow_seterr(IFLOW_ERANGE, "a step holds at most %d tokens", max_T);
        if (q->adapter < 0 || q->adapter > c->m->n_adapters)
            return iflow_seterr(IFLOW_EINVAL, "sequence %d of the step asks for adapter %d of the model's %d", i,
                                q->adapter, c->m->n_adapters);
        IFLOW_TRY(check_ids(c, q->ids, q->n));
        memcpy(ids + T, q->ids, (size_t)q->n * sizeof *ids);
        seq[i] = (ifk_kv_seq){.row0 = T, .n_rows = q->n, .pos0 = q->pos0, .table = q->table};
        adapters |= q->adapter;
        T += q->n;
    }
    step_rows r = {.kv = kv, .seq = seq, .n_seq = n_seqs, .T = T, .groups = c->step_groups,
                   .n_groups = adapters ? group_by_adapter(c, seqs, seq, n_seqs) : 0};
    dev_scratch *s;
    if (!c->comm && !adapters && T == n_seqs && recordable(c) &&
        (n_seqs == 1 || c->record == IFLOW_GRAPHS_ALL)) /* one token each */
        return step_recorded(c, ids, &r, seqs, n_seqs);
    if (!c->comm) {
        IFLOW_TRY(forward_layers(c, ids, &r, &s));
        return step_logits(c, s, seqs, seq, n_seqs);
    }
    /* several processes: the output device's process computes the logits, all receive them */
    iflow_comm *cm = c->comm;
    int root = c->m->output_dev;
    IFLOW_TRY(forward_layers_comm(c, ids, &r, &s));
    if (cm->rank == root)
        IFLOW_TRY(step_logits(c, s, seqs, seq, n_seqs));
    for (int i = 0; i < n_seqs; i++) {
        size_t k = (size_t)out_rows_of(&seqs[i]);
        if (seqs[i].logits)
            IFLOW_TRY(cm->ops->bcast(cm, seqs[i].logits, k * c->m->hp.vocab_size * sizeof(float), root));
        else if (seqs[i].next)
            IFLOW_TRY(cm->ops->bcast(cm, seqs[i].next, k * sizeof(int32_t), root));
    }
    return 0;
}
