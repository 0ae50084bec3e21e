/* place.c -- putting a model's weights on devices: whole layers (iflow_placement) or head and
 * FFN-column ranges of layers (iflow_plan). See model.h and plan.h.
 *
 * A placement becomes a list of parts per layer (model_impl.h). Building it goes in three steps,
 * so that nothing is copied before everything is known to fit:
 *   1. describe: for each layer, its parts (device, head range, column range);
 *   2. measure:  the bytes each device needs (weights, KV cache, scratch), and refusals (a
 *                weight type without a kernel on its device, a column split inside a block
 *                of a quantized type), and the fit against each device's free memory;
 *   3. copy:     each part's slices to its device. Row slices of a matrix are a pointer into
 *                the mapping (rows are contiguous for every type); column slices (wo, down
 *                split by heads or columns) are built on the host, row by row (slice.h).
 * A split model (split.h) has no whole layers: each part takes its weights from its device's own
 * file, already cut to the part's ranges, so step 3 only puts them on the device.
 */
#include "footprint.h"
#include "model_impl.h"
#include "plan.h"
#include "slice.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static iflow_device *dev_of(const iflow_model *m, int i) { return m->devs[i]; }
static int host_dev(const iflow_device *d) { return !d || d->host_memory; }
static const char *dev_name(const iflow_device *d) { return d ? d->info.name : "cpu"; }

/* ---- 1. describe ---- */

/* What a placement asks for, before anything is checked: parts per layer. */
typedef struct {
    int n_devs;
    iflow_device *devs[IFLOW_MAX_DEVICES];
    int output_dev;
    int *part0;          /* [n_layers + 1] */
    layer_part *parts;   /* ranges and device only */
} layout;

static void layout_free(layout *L)
{
    free(L->part0);
    free(L->parts);
}

static int layout_alloc(layout *L, int n_layers, int n_parts)
{
    L->part0 = calloc((size_t)n_layers + 1, sizeof *L->part0);
    L->parts = calloc((size_t)(n_parts ? n_parts : 1), sizeof *L->parts);
    return L->part0 && L->parts ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
}

/* The kv heads query heads q0..q1-1 read. */
static void kv_range(const iflow_hparams *hp, layer_part *p)
{
    p->kv0 = iflow_part_kv0(hp, p->q0);
    p->kv1 = p->kv0 + iflow_part_kv_heads(hp, p->q0, p->q1);
}

static void whole(const iflow_hparams *hp, layer_part *p, int dev)
{
    memset(p, 0, sizeof *p);
    p->dev = dev;
    p->q1 = hp->n_heads;
    p->f1 = hp->ffn_dim;
    kv_range(hp, p);
}

static int describe_placement(const iflow_model *m, const iflow_placement *pl, layout *L)
{
    const iflow_hparams *hp = &m->hp;
    if (m->split_plan)
        return iflow_seterr(IFLOW_EUNSUPPORTED,
                            "model '%s' is split into one file per device: it runs only as its plan places it",
                            m->split_dir);
    if (pl->n_devices < 1 || pl->n_devices > IFLOW_MAX_DEVICES)
        return iflow_seterr(IFLOW_EINVAL, "a placement needs 1 to %d devices, not %d", IFLOW_MAX_DEVICES, pl->n_devices);
    if (pl->output_device < 0 || pl->output_device >= pl->n_devices)
        return iflow_seterr(IFLOW_EINVAL, "output device %d is not one of the placement's %d devices", pl->output_device,
                            pl->n_devices);
    for (int i = 0; i < pl->n_devices && hp->layout == IFLOW_LAYOUT_ENCODER_DECODER; i++)
        if (!host_dev(pl->devices[i])) /* its encoder and cross-attention run in host memory */
            return iflow_seterr(IFLOW_EUNSUPPORTED, "an encoder-decoder model runs on the cpu only: placing it on %s is "
                                "not implemented", dev_name(pl->devices[i]));
    for (int l = 0; l < hp->n_layers; l++)
        if (pl->layer_device[l] < 0 || pl->layer_device[l] >= pl->n_devices)
            return iflow_seterr(IFLOW_EINVAL, "layer %d is placed on device %d, but the placement has %d devices", l,
                                pl->layer_device[l], pl->n_devices);
    int rc = layout_alloc(L, hp->n_layers, hp->n_layers);
    if (rc)
        return rc;
    L->n_devs = pl->n_devices;
    memcpy(L->devs, pl->devices, sizeof L->devs);
    L->output_dev = pl->output_device;
    for (int l = 0; l < hp->n_layers; l++) {
        whole(hp, &L->parts[l], pl->layer_device[l]);
        L->part0[l + 1] = l + 1;
    }
    return 0;
}

/* A layer split over devices sums its parts' outputs once per sub-block (forward.c); these
 * blocks need the whole output first, or both sub-blocks' inputs at once. */
static int check_splittable(const iflow_hparams *hp, int l)
{
    if (hp->post_norms || hp->post_ln) /* the norm would have to follow the sum of the parts */
        return iflow_seterr(IFLOW_EUNSUPPORTED, "layer %d has post norms: it cannot be split over devices yet", l);
    if (hp->parallel_residual)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "layer %d has a parallel residual: it cannot be split over devices yet", l);
    if (hp->qk_norm_full) /* the norm of the whole q and k projections */
        return iflow_seterr(IFLOW_EUNSUPPORTED, "layer %d norms its whole q and k: it cannot be split over devices yet",
                            l);
    if (hp->kv_lora_rank) /* every head reads the one latent row */
        return iflow_seterr(IFLOW_EUNSUPPORTED, "layer %d is latent attention: it cannot be split over devices yet", l);
    if (iflow_layer_moe(hp, l)) /* moe.c computes whole layers */
        return iflow_seterr(IFLOW_EUNSUPPORTED, "layer %d is a mixture of experts: it cannot be split over devices yet",
                            l);
    return 0;
}

int iflow_plan_splittable(const struct iflow_plan_s *plan, const iflow_hparams *hp)
{
    int idx[IFLOW_PLAN_MAX_DEVICES];
    for (int l = 0; l < hp->n_layers && l < plan->n_layers; l++)
        if (iflow_plan_layer_devices(plan, l, idx) > 1)
            IFLOW_TRY(check_splittable(hp, l));
    return 0;
}

static int describe_plan(const iflow_model *m, const iflow_plan *plan, iflow_device *const *devices, layout *L)
{
    const iflow_hparams *hp = &m->hp;
    if (hp->layout == IFLOW_LAYOUT_ENCODER_DECODER)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "an encoder-decoder model cannot be placed by a partition plan yet");
    int rc = iflow_plan_check(plan, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->ffn_dim);
    if (rc == 0 && m->split_plan && (rc = iflow_plan_same_partition(plan, m->split_plan, "its split's plan")) < 0)
        return iflow_preperr(rc, "model '%s' is split by another plan", m->split_dir);
    if (rc == 0 && m->own_dev >= plan->n_devices)
        rc = iflow_seterr(IFLOW_EINVAL, "this process computes plan device %d, but the plan has %d devices: run one "
                          "process per device", m->own_dev, plan->n_devices);
    if (rc == 0)
        rc = iflow_plan_splittable(plan, hp);
    if (rc)
        return rc;
    int n = 0, idx[IFLOW_PLAN_MAX_DEVICES];
    for (int l = 0; l < hp->n_layers; l++)
        n += iflow_plan_layer_devices(plan, l, idx);
    if ((rc = layout_alloc(L, hp->n_layers, n)))
        return rc;
    L->n_devs = plan->n_devices;
    for (int i = 0; i < plan->n_devices; i++)
        L->devs[i] = devices[i];
    L->output_dev = plan->output_device;
    n = 0;
    for (int l = 0; l < hp->n_layers; l++) {
        int k = iflow_plan_layer_devices(plan, l, idx);
        /* parts in head order, so that part 0 holds head 0 (and adds the output biases) */
        for (int a = 0; a < k; a++)
            for (int b = a + 1; b < k; b++)
                if (plan->devices[idx[b]].head0 < plan->devices[idx[a]].head0 ||
                    (plan->devices[idx[b]].head0 == plan->devices[idx[a]].head0 &&
                     plan->devices[idx[b]].ffn0 < plan->devices[idx[a]].ffn0)) {
                    int t = idx[a];
                    idx[a] = idx[b];
                    idx[b] = t;
                }
        for (int a = 0; a < k; a++) {
            const iflow_plan_device *d = &plan->devices[idx[a]];
            layer_part *p = &L->parts[n++];
            memset(p, 0, sizeof *p);
            p->dev = idx[a];
            p->q0 = d->head0, p->q1 = d->head1, p->f0 = d->ffn0, p->f1 = d->ffn1;
            kv_range(hp, p);
        }
        L->part0[l + 1] = n;
    }
    return 0;
}

/* ---- 2. measure ---- */

/* Where part p of layer l takes its weights from, and the ranges of the layer that src's
 * matrices hold (*base): the whole layer for a model from one shard; for a split model, its
 * device's slices from its own file (whose ranges are the part's, as the plan is the split's:
 * nothing is cut at load). */
static const layer_weights *part_source(const iflow_model *m, int l, const layer_part *p, layer_part *base)
{
    if (!m->split_layers) {
        whole(&m->hp, base, 0);
        return &m->layers[l];
    }
    const iflow_plan_device *d = &m->split_plan->devices[p->dev];
    memset(base, 0, sizeof *base);
    base->q0 = d->head0, base->q1 = d->head1, base->f0 = d->ffn0, base->f1 = d->ffn1;
    kv_range(&m->hp, base);
    return &m->split_layers[(size_t)p->dev * m->hp.n_layers + l];
}

/* Weight bytes of one part (footprint.h), or a refusal naming the tensor. */
static int part_bytes(const iflow_model *m, int l, const layer_part *p, iflow_device *d, uint64_t *bytes)
{
    const iflow_hparams *hp = &m->hp;
    layer_part b;
    const layer_weights *w = part_source(m, l, p, &b);
    int hd = hp->head_dim;
    struct { const char *name; weight W; int c0, c1, K; } mats[IFLOW_PM_COUNT] = {
        [IFLOW_PM_WQ] = {"wq", w->wq, 0, 0, 0},
        [IFLOW_PM_WK] = {"wk", w->wk, 0, 0, 0},
        [IFLOW_PM_WV] = {"wv", w->wv, 0, 0, 0},
        [IFLOW_PM_WO] = {"wo", w->wo, (p->q0 - b.q0) * hd, (p->q1 - b.q0) * hd, (b.q1 - b.q0) * hd},
        [IFLOW_PM_GATE] = {"ffn_gate", w->gate, 0, 0, 0},
        [IFLOW_PM_UP] = {"ffn_up", w->up, 0, 0, 0},
        [IFLOW_PM_DOWN] = {"ffn_down", w->down, p->f0 - b.f0, p->f1 - b.f0, b.f1 - b.f0},
    };
    if (hp->kv_lora_rank) { /* latent attention (whole layers): its key and value matrices stand for wk, wv */
        mats[IFLOW_PM_WK].name = "wkv_a", mats[IFLOW_PM_WK].W = w->wkv_a;
        mats[IFLOW_PM_WV].name = "wv_b", mats[IFLOW_PM_WV].W = w->wv_b;
        mats[IFLOW_PM_WO].K = 0;
    }
    int types[IFLOW_PM_COUNT], rc;
    for (int i = 0; i < IFLOW_PM_COUNT; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.%s", l, mats[i].name);
        if (d && !d->ops->supports(d, mats[i].W.type))
            return iflow_seterr(IFLOW_EUNSUPPORTED, "tensor '%s' has type %s, which has no kernel on %s", name,
                                iflow_dtype_name(mats[i].W.type), d->info.name);
        if (mats[i].K && (rc = iflow_slice_columns_check(mats[i].W.type, mats[i].c0, mats[i].c1, mats[i].K, name)))
            return rc;
        types[i] = mats[i].W.type;
    }
    iflow_part_bytes pb = iflow_part_weight_bytes(hp, types, p->q0, p->q1, p->f0, p->f1);
    *bytes = pb.attn + pb.ffn;
    return 0;
}

#define MAX_PASS 4096 /* the most rows IFLOW_PASS may ask for */

/* Rows of one forward pass of iflow_ctx_eval under layout L: MAX_BATCH, or IFLOW_GPU_PASS when
 * the layers and the output all run on devices that are not the host and this process runs them
 * all (a plan's processes, one per device, evaluate in steps of MAX_BATCH). IFLOW_PASS=n,
 * MAX_BATCH <= n <= MAX_PASS, asks for n instead (benchmarks; the CPU's results do not depend
 * on it, test_invariance's contract). */
static int pass_rows(const iflow_model *m, const layout *L)
{
    const char *e = getenv("IFLOW_PASS");
    if (e && *e) {
        char *end;
        long n = strtol(e, &end, 10);
        if (*end == 0 && n >= MAX_BATCH && n <= MAX_PASS)
            return (int)n;
    }
    if (m->own_dev >= 0 || host_dev(L->devs[L->output_dev]))
        return MAX_BATCH;
    for (int k = 0; k < L->part0[m->hp.n_layers]; k++)
        if (host_dev(L->devs[L->parts[k].dev]))
            return MAX_BATCH;
    return IFLOW_GPU_PASS;
}

static int measure(const iflow_model *m, const layout *L, int n_ctx, iflow_device_bytes *need)
{
    const iflow_hparams *hp = &m->hp;
    memset(need, 0, (size_t)L->n_devs * sizeof *need);
    int uses[IFLOW_MAX_DEVICES] = {0};
    for (int l = 0; l < hp->n_layers; l++)
        for (int k = L->part0[l]; k < L->part0[l + 1]; k++) {
            const layer_part *p = &L->parts[k];
            iflow_device *d = L->devs[p->dev];
            uint64_t b = 0;
            if (!iflow_dev_is_mine(m, p->dev))
                continue;
            int rc = part_bytes(m, l, p, d, &b);
            if (rc)
                return rc;
            if (!host_dev(d))
                need[p->dev].weights += b;
            need[p->dev].kv += iflow_part_kv_bytes(hp, p->kv1 - p->kv0, n_ctx);
            uses[p->dev] = 1;
        }
    iflow_device *od = L->devs[L->output_dev];
    /* an encoder has no output matrix; another process's output device holds it there */
    const int no_output = hp->layout == IFLOW_LAYOUT_ENCODER || !iflow_dev_is_mine(m, L->output_dev);
    if (od && !no_output && !od->ops->supports(od, m->output.type))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "tensor '%s' has type %s, which has no kernel on %s",
                            hp->tie_embeddings ? "tok_embd" : "output", iflow_dtype_name(m->output.type), od->info.name);
    if (!host_dev(od) && !no_output)
        need[L->output_dev].weights += iflow_output_bytes(hp, m->output.type);
    uses[L->output_dev] = iflow_dev_is_mine(m, L->output_dev);
    for (int i = 0; i < L->n_devs; i++) {
        if (!iflow_dev_is_mine(m, i))
            continue;
        if (uses[i])
            need[i].scratch += iflow_scratch_bytes(hp, pass_rows(m, L));
        if (i == L->output_dev)
            need[i].scratch += (uint64_t)hp->vocab_size * sizeof(float); /* one row of logits */
        if (m->rope_scale && !host_dev(L->devs[i]))
            need[i].weights += (uint64_t)rope_scale_count(hp) * sizeof(float);
    }
    return 0;
}

/* Every device must hold what the placement puts on it; the message names the first that
 * cannot and by how much. */
static int check_fit(const layout *L, const iflow_device_bytes *need, int n_ctx)
{
    for (int i = 0; i < L->n_devs; i++) {
        iflow_device *d = L->devs[i];
        uint64_t total = need[i].weights + need[i].kv + need[i].scratch;
        iflow_device_info info;
        int rc = iflow_device_query(d, &info);
        if (rc)
            return rc;
        if (info.mem_free && total > info.mem_free) {
            char a[32], b[32], c[32], e[32], f[32], g[32];
            return iflow_seterr(IFLOW_ENOMEM,
                                "%s lacks %s for this placement: it needs %s (weights %s, KV cache %s for %d positions, "
                                "scratch %s) and has %s free",
                                dev_name(d), iflow_bytes_str(a, sizeof a, total - info.mem_free),
                                iflow_bytes_str(b, sizeof b, total), iflow_bytes_str(c, sizeof c, need[i].weights),
                                iflow_bytes_str(e, sizeof e, need[i].kv), n_ctx, iflow_bytes_str(f, sizeof f, need[i].scratch),
                                iflow_bytes_str(g, sizeof g, info.mem_free));
        }
    }
    return 0;
}

/* ---- 3. copy ---- */

/* Put n bytes on part p's device, remembering what to free. */
static int put(iflow_model *m, layer_part *p, int *n_dev_copies, const void *host, size_t n, const void **out)
{
    iflow_device *d = dev_of(m, p->dev);
    int rc = iflow_device_put(d, out, host, n);
    if (rc == 0 && !host_dev(d))
        p->dev_copy[(*n_dev_copies)++] = *out;
    return rc;
}

/* The device's own layout of a host matrix [N][K] (its pack op), if it has one: *dst then
 * holds the packed copy, which *packed receives for unplace to free, and the pages of the
 * model's mapping that held the matrix leave the process (so that its memory does not double;
 * they are read again if the model is placed again). */
static int pack_matrix(iflow_model *m, iflow_device *d, const void *host, int type, int64_t N, int64_t K, weight *dst,
                       void **packed)
{
    void *out = NULL;
    int ptype = 0, rc = iflow_device_pack(d, &out, &ptype, host, type, (int)N, (int)K);
    if (rc == 0 && out) {
        *dst = (weight){out, ptype};
        *packed = out;
        size_t n = iflow_matrix_bytes(type, N, K);
        iflow_shard_release(m->shard, host, n);
        for (int i = 0; i < IFLOW_MAX_DEVICES && m->split_plan; i++)
            if (m->split_shards[i] && m->split_shards[i] != m->shard)
                iflow_shard_release(m->split_shards[i], host, n);
    }
    return rc;
}

/* A weight slice: rows (a view) or columns (a host copy), put on the part's device, or packed
 * into its memory when the device has a layout of its own for it (its pack op). */
static int put_weight(iflow_model *m, layer_part *p, int *nd, int *nh, weight src, int is_cols, int64_t a0, int64_t a1,
                      int64_t other, int64_t full, weight *dst)
{
    const void *host, *out;
    void *copy = NULL;
    size_t n;
    if (!src.data) { /* a matrix the blocks do not have (ffn = plain: no gate) */
        *dst = (weight){0};
        return 0;
    }
    iflow_device *d = dev_of(m, p->dev);
    int64_t rows = is_cols ? other : a1 - a0, cols = is_cols ? a1 - a0 : other;
    int np = 0;
    while (np < MAX_PACKED && p->packed[np])
        np++;
    if (!is_cols) {
        host = iflow_slice_rows(src.data, src.type, a0, other);
        n = iflow_matrix_bytes(src.type, a1 - a0, other);
    } else if (a0 == 0 && a1 == full) {
        host = src.data;
        n = iflow_matrix_bytes(src.type, other, full);
    } else {
        if (!(copy = iflow_slice_columns(src.data, src.type, other, full, a0, a1)))
            return iflow_seterr(IFLOW_ENOMEM, "out of memory slicing columns");
        host = copy;
        n = iflow_matrix_bytes(src.type, other, a1 - a0);
    }
    if (np < MAX_PACKED) {
        *dst = (weight){0};
        int rc = pack_matrix(m, d, host, src.type, rows, cols, dst, &p->packed[np]);
        if (rc || dst->data) {
            free(copy);
            return rc;
        }
    }
    int rc = put(m, p, nd, host, n, &out);
    if (copy && rc == 0 && host_dev(dev_of(m, p->dev)))
        p->host_copy[(*nh)++] = copy; /* the device uses the host copy itself */
    else
        free(copy);
    if (rc == 0)
        *dst = (weight){out, src.type};
    return rc;
}

/* A vector slice [a0, a1) of floats (NULL stays NULL). */
static int put_vector(iflow_model *m, layer_part *p, int *nd, const float *src, int64_t a0, int64_t a1, const float **dst)
{
    if (!src) {
        *dst = NULL;
        return 0;
    }
    return put(m, p, nd, src + a0, (size_t)(a1 - a0) * sizeof(float), (const void **)dst);
}

/* An encoder-decoder's cross-attention weights of part p (none elsewhere: NULL stays NULL),
 * sliced as the self-attention's (query rows q0..q1, kv rows k0..k1 of the layer). */
static int copy_cross(iflow_model *m, layer_part *p, int *nd, int *nh, const layer_weights *w, int64_t q0, int64_t q1,
                      int64_t k0, int64_t k1, int first)
{
    const int64_t D = m->hp.dim, Q = (int64_t)m->hp.n_heads * m->hp.head_dim;
    layer_weights *o = &p->w;
    int rc;
    if ((rc = put_vector(m, p, nd, w->xattn_norm, 0, D, &o->xattn_norm)) ||
        (rc = put_vector(m, p, nd, w->xattn_norm_b, 0, D, &o->xattn_norm_b)) ||
        (rc = put_weight(m, p, nd, nh, w->xq, 0, q0, q1, D, 0, &o->xq)) ||
        (rc = put_weight(m, p, nd, nh, w->xk, 0, k0, k1, D, 0, &o->xk)) ||
        (rc = put_weight(m, p, nd, nh, w->xv, 0, k0, k1, D, 0, &o->xv)) ||
        (rc = put_weight(m, p, nd, nh, w->xo, 1, q0, q1, D, Q, &o->xo)) ||
        (rc = put_vector(m, p, nd, w->xbq, q0, q1, &o->xbq)) || (rc = put_vector(m, p, nd, w->xbk, k0, k1, &o->xbk)) ||
        (rc = put_vector(m, p, nd, w->xbv, k0, k1, &o->xbv)))
        return rc;
    return put_vector(m, p, nd, first ? w->xbo : NULL, 0, D, &o->xbo);
}

/* A layer's low-rank deltas (iflow_model_add_lora, and the adapters' of iflow_model_add_adapter,
 * read from the model): host memory, read as they are by a part that holds the whole layer on a
 * host device; anywhere else they are refused. */
static int copy_low_rank(iflow_model *m, int l, layer_part *p, const layer_weights *w)
{
    const iflow_hparams *hp = &m->hp;
    if (iflow_layer_deltas(m, l, NULL, NULL) == 0)
        return 0;
    if (!host_dev(dev_of(m, p->dev)) || p->q0 != 0 || p->q1 != hp->n_heads || p->f0 != 0 || p->f1 != hp->ffn_dim)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "cannot place layer %d on %s: a LoRA adapter applied at run time "
                            "computes on the CPU, whole layers only (merge it at conversion: iflow-convert --lora)", l,
                            dev_name(dev_of(m, p->dev)));
    memcpy(p->w.lr, w->lr, sizeof p->w.lr);
    return 0;
}

/* What the engine computes on the host only: residual_scale and clip_qkv (forward.c scales and
 * clamps in place), attention sinks, rope_rot_scale; latent attention is refused by copy_mla,
 * before it packs each head's matrices. */
static int check_host_only(const iflow_model *m, int l, const layer_part *p)
{
    if (m->hp.residual_scale > 0 && m->hp.residual_scale != 1.0f && !host_dev(dev_of(m, p->dev)))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "layer %d scales its output by residual_scale %g, which is not "
                            "implemented on %s yet (it runs on the cpu)", l, m->hp.residual_scale,
                            dev_name(dev_of(m, p->dev)));
    if (m->hp.attn_sinks && !host_dev(dev_of(m, p->dev)))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "layer %d has attention sinks, which are not implemented on %s yet (it "
                            "runs on the cpu)", l, dev_name(dev_of(m, p->dev)));
    if (m->hp.rope_rot_scale != 1.0f && !host_dev(dev_of(m, p->dev)))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "layer %d scales its rotated dimensions by %g (a rope scaling's "
                            "attention factor on a partial rotation), which is not implemented on %s yet (it runs on "
                            "the cpu)", l, m->hp.rope_rot_scale, dev_name(dev_of(m, p->dev)));
    if (m->hp.clip_qkv > 0 && !host_dev(dev_of(m, p->dev)))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "layer %d clamps q, k and v (clip_qkv %g), which is not implemented "
                            "on %s yet (it runs on the cpu)", l, m->hp.clip_qkv, dev_name(dev_of(m, p->dev)));
    return 0;
}

/* A mixture of experts' router and experts (none elsewhere): read in place from the mapping by a
 * part on a host device (moe.c); on any other device refused. */
static int copy_experts(iflow_model *m, int l, layer_part *p, const layer_weights *w)
{
    const iflow_hparams *hp = &m->hp;
    if (!iflow_layer_moe(hp, l))
        return 0;
    if (!w->experts) /* a model from one shard binds them all (a split one is refused at open) */
        return iflow_seterr(IFLOW_EINVAL, "layer %d is a mixture of experts without its experts", l);
    if (!host_dev(dev_of(m, p->dev))) /* whole layers: check_splittable */
        return iflow_seterr(IFLOW_EUNSUPPORTED, "layer %d is a mixture of experts, which is not implemented on %s yet "
                            "(it runs on the cpu)", l, dev_name(dev_of(m, p->dev)));
    p->w.router = w->router;
    p->w.router_bias = w->router_bias;
    p->w.router_b = w->router_b;
    p->w.shexp_gate = w->shexp_gate;
    /* each expert's matrices in the device's own layout where it has one (its pack op: the
     * CPU's int8 and AMX tiles), as the dense matrices are; else the mapping's */
    const int E = hp->n_experts;
    const int64_t D = hp->dim, Fe = hp->expert_ffn_dim;
    if (!(p->own_experts = calloc((size_t)E, sizeof *p->own_experts)) ||
        !(p->packed_experts = calloc(3 * (size_t)E, sizeof *p->packed_experts)))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    p->w.experts = p->own_experts;
    for (int e = 0; e < E; e++) {
        const expert_weights *x = &w->experts[e];
        expert_weights *o = &p->own_experts[e];
        o->gate_b = x->gate_b, o->up_b = x->up_b, o->down_b = x->down_b; /* host memory: the mapping's */
        weight *dst[3] = {&o->gate, &o->up, &o->down};
        const weight src[3] = {x->gate, x->up, x->down};
        for (int i = 0; i < 3; i++) {
            const int64_t N = i == 2 ? D : Fe, K = i == 2 ? Fe : D;
            *dst[i] = (weight){0};
            IFLOW_TRY(pack_matrix(m, dev_of(m, p->dev), src[i].data, src[i].type, N, K, dst[i],
                                  &p->packed_experts[3 * e + i]));
            if (!dst[i]->data)
                *dst[i] = src[i];
        }
    }
    return 0;
}

/* A latent attention's own matrices and norms (model_impl.h; none elsewhere), on a host device
 * (whole layers): wq_a and wkv_a as any matrix; each head's wk_b and wv_b rows a matrix of their
 * own (mla_heads), in the device's layout where it has one (its pack op), else the mapping's. */
static int copy_mla(iflow_model *m, int l, layer_part *p, int *nd, int *nh, const layer_weights *w)
{
    const iflow_hparams *hp = &m->hp;
    if (!hp->kv_lora_rank)
        return 0;
    iflow_device *d = dev_of(m, p->dev);
    if (!host_dev(d))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "layer %d is latent attention (kv_lora_rank %d), which is not "
                            "implemented on %s yet (it runs on the cpu)", l, hp->kv_lora_rank, dev_name(d));
    const int64_t D = hp->dim, H = hp->n_heads, R = hp->kv_lora_rank, QR = hp->q_lora_rank;
    const int64_t N = hp->qk_nope_dim, VH = hp->v_head_dim;
    layer_weights *o = &p->w;
    int rc;
    if ((rc = put_weight(m, p, nd, nh, w->wq_a, 0, 0, QR, D, 0, &o->wq_a)) ||
        (rc = put_weight(m, p, nd, nh, w->wkv_a, 0, 0, R + hp->rope_dim, D, 0, &o->wkv_a)) ||
        (rc = put_vector(m, p, nd, w->q_a_norm, 0, QR, &o->q_a_norm)) ||
        (rc = put_vector(m, p, nd, w->kv_a_norm, 0, R, &o->kv_a_norm)))
        return rc;
    if (!(p->own_mla = calloc(2 * (size_t)H, sizeof *p->own_mla)) ||
        !(p->packed_mla = calloc(2 * (size_t)H, sizeof *p->packed_mla)))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    o->mla_heads = p->own_mla;
    for (int64_t i = 0; i < 2 * H; i++) { /* head h's wk_b [R][N], then its wv_b [VH][R] */
        const weight src = i < H ? w->wk_b : w->wv_b;
        const int64_t rows = i < H ? R : VH, cols = i < H ? N : R, h = i < H ? i : i - H;
        const weight head = {iflow_slice_rows(src.data, src.type, h * rows, cols), src.type};
        IFLOW_TRY(pack_matrix(m, d, head.data, head.type, rows, cols, &p->own_mla[i], &p->packed_mla[i]));
        if (!p->own_mla[i].data)
            p->own_mla[i] = head;
    }
    return 0;
}

static int copy_part(iflow_model *m, int l, layer_part *p, int first)
{
    const iflow_hparams *hp = &m->hp;
    layer_part b;
    const layer_weights *w = part_source(m, l, p, &b);
    layer_weights *o = &p->w;
    /* the part's ranges within what w holds */
    int64_t D = hp->dim, hd = hp->head_dim, Q = (int64_t)(b.q1 - b.q0) * hd, F = b.f1 - b.f0;
    int64_t q0 = (p->q0 - b.q0) * hd, q1 = (p->q1 - b.q0) * hd, k0 = (p->kv0 - b.kv0) * hd, k1 = (p->kv1 - b.kv0) * hd;
    int64_t f0 = p->f0 - b.f0, f1 = p->f1 - b.f0;
    int nd = 0, nh = 0, rc;
    if (iflow_layer_moe(hp, l)) /* a whole layer (check_splittable): its shared expert's columns, if any */
        f0 = 0, f1 = F = hp->shared_ffn_dim;
    /* wq's rows and wo's columns: the part's heads', or a latent attention's whole layer */
    int64_t wq0 = q0, wq1 = q1, wq_cols = D, wo0 = q0, wo1 = q1, wo_cols = Q;
    if (hp->kv_lora_rank)
        wq0 = wo0 = 0, wq1 = (int64_t)hp->n_heads * (hp->qk_nope_dim + hp->rope_dim),
        wq_cols = hp->q_lora_rank ? hp->q_lora_rank : D, wo1 = wo_cols = (int64_t)hp->n_heads * hp->v_head_dim;
    if ((rc = put_vector(m, p, &nd, w->attn_norm, 0, D, &o->attn_norm)) ||
        (rc = put_vector(m, p, &nd, w->ffn_norm, 0, D, &o->ffn_norm)) ||
        (rc = put_vector(m, p, &nd, w->attn_norm_b, 0, D, &o->attn_norm_b)) ||
        (rc = put_vector(m, p, &nd, w->ffn_norm_b, 0, D, &o->ffn_norm_b)) ||
        (rc = put_vector(m, p, &nd, w->attn_post_norm, 0, D, &o->attn_post_norm)) ||
        (rc = put_vector(m, p, &nd, w->ffn_post_norm, 0, D, &o->ffn_post_norm)) ||
        (rc = put_vector(m, p, &nd, w->q_norm, 0, hp->qk_norm_full ? Q : hd, &o->q_norm)) ||
        (rc = put_vector(m, p, &nd, w->sinks, p->q0 - b.q0, p->q1 - b.q0, &o->sinks)) ||
        (rc = put_vector(m, p, &nd, w->k_norm, 0, hp->qk_norm_full ? (int64_t)hp->n_kv_heads * hd : hd, &o->k_norm)) ||
        (rc = put_weight(m, p, &nd, &nh, w->wq, 0, wq0, wq1, wq_cols, 0, &o->wq)) ||
        (rc = put_weight(m, p, &nd, &nh, w->wk, 0, k0, k1, D, 0, &o->wk)) ||
        (rc = put_weight(m, p, &nd, &nh, w->wv, 0, k0, k1, D, 0, &o->wv)) ||
        (rc = put_weight(m, p, &nd, &nh, w->wo, 1, wo0, wo1, D, wo_cols, &o->wo)) ||
        (rc = copy_mla(m, l, p, &nd, &nh, w)) ||
        (rc = put_vector(m, p, &nd, w->bq, q0, q1, &o->bq)) || (rc = put_vector(m, p, &nd, w->bk, k0, k1, &o->bk)) ||
        (rc = put_vector(m, p, &nd, w->bv, k0, k1, &o->bv)) ||
        (rc = put_vector(m, p, &nd, first ? w->bo : NULL, 0, D, &o->bo)) ||
        (rc = put_weight(m, p, &nd, &nh, w->gate, 0, f0, f1, D, 0, &o->gate)) ||
        (rc = put_weight(m, p, &nd, &nh, w->up, 0, f0, f1, D, 0, &o->up)) ||
        (rc = put_weight(m, p, &nd, &nh, w->down, 1, f0, f1, D, F, &o->down)) ||
        (rc = put_vector(m, p, &nd, w->gate_b, f0, f1, &o->gate_b)) ||
        (rc = put_vector(m, p, &nd, w->up_b, f0, f1, &o->up_b)) ||
        (rc = put_vector(m, p, &nd, first ? w->down_b : NULL, 0, D, &o->down_b)) ||
        (rc = copy_cross(m, p, &nd, &nh, w, q0, q1, k0, k1, first)) || (rc = copy_experts(m, l, p, w)) ||
        (rc = check_host_only(m, l, p)))
        return iflow_preperr(rc, "cannot place layer %d on %s", l, dev_name(dev_of(m, p->dev)));
    return copy_low_rank(m, l, p, w);
}

/* The output matrix and the output norm on the output device. */
static int copy_output(iflow_model *m)
{
    const iflow_hparams *hp = &m->hp;
    iflow_device *od = dev_of(m, m->output_dev);
    int rc = pack_matrix(m, od, m->output.data, m->output.type, hp->vocab_size, hp->dim, &m->output_w, &m->output_packed);
    if (rc == 0 && !m->output_w.data) {
        rc = iflow_device_put(od, &m->output_w.data, m->output.data, iflow_matrix_bytes(m->output.type, hp->vocab_size, hp->dim));
        m->output_w.type = m->output.type;
    }
    if (rc == 0 && m->output_norm) /* none: a LayerNorm without parameters (norm_weight = false) */
        rc = iflow_device_put(od, (const void **)&m->output_norm_w, m->output_norm, (size_t)hp->dim * sizeof(float));
    if (rc == 0 && m->output_norm_b)
        rc = iflow_device_put(od, (const void **)&m->output_norm_b_w, m->output_norm_b, (size_t)hp->dim * sizeof(float));
    if (rc == 0 && m->output_b && hp->layout == IFLOW_LAYOUT_DECODER) /* an encoder-decoder adds it on the host */
        rc = iflow_device_put(od, (const void **)&m->output_b_w, m->output_b, (size_t)hp->vocab_size * sizeof(float));
    return rc;
}

/* The output (a decoder's or an encoder-decoder's: an encoder's result is its hidden states) and the rope table on
 * their devices. */
static int copy_shared(iflow_model *m)
{
    const iflow_hparams *hp = &m->hp;
    m->output_w = (weight){0};
    int rc = hp->layout != IFLOW_LAYOUT_ENCODER && iflow_dev_is_mine(m, m->output_dev) ? copy_output(m) : 0;
    for (int i = 0; rc == 0 && i < m->n_devs && m->rope_scale; i++)
        if (iflow_dev_is_mine(m, i))
            rc = iflow_device_put(dev_of(m, i), (const void **)&m->rope_scale_w[i], m->rope_scale,
                                  rope_scale_count(hp) * sizeof(float));
    return rc;
}

void iflow_unplace(iflow_model *m)
{
    int n = m->part0 ? m->part0[m->hp.n_layers] : 0;
    for (int k = 0; k < n; k++) {
        layer_part *p = &m->parts[k];
        for (size_t i = 0; i < sizeof p->dev_copy / sizeof p->dev_copy[0]; i++)
            iflow_device_unput(dev_of(m, p->dev), p->dev_copy[i]);
        free(p->host_copy[0]);
        free(p->host_copy[1]);
        for (int i = 0; i < MAX_PACKED && p->packed[i]; i++)
            iflow_device_unpack(dev_of(m, p->dev), p->packed[i]);
        for (int i = 0; p->packed_experts && i < 3 * m->hp.n_experts; i++)
            if (p->packed_experts[i])
                iflow_device_unpack(dev_of(m, p->dev), p->packed_experts[i]);
        free(p->packed_experts);
        free(p->own_experts);
        for (int i = 0; p->packed_mla && i < 2 * m->hp.n_heads; i++)
            if (p->packed_mla[i])
                iflow_device_unpack(dev_of(m, p->dev), p->packed_mla[i]);
        free(p->packed_mla);
        free(p->own_mla);
    }
    if (m->n_devs) {
        iflow_device *od = dev_of(m, m->output_dev);
        if (m->output_packed)
            iflow_device_unpack(od, m->output_packed);
        else
            iflow_device_unput(od, m->output_w.data);
        m->output_packed = NULL;
        iflow_device_unput(dev_of(m, m->output_dev), m->output_norm_w);
        iflow_device_unput(dev_of(m, m->output_dev), m->output_norm_b_w);
        iflow_device_unput(dev_of(m, m->output_dev), m->output_b_w);
        for (int i = 0; i < m->n_devs; i++)
            iflow_device_unput(dev_of(m, i), m->rope_scale_w[i]);
    }
    free(m->part0);
    free(m->parts);
    m->part0 = NULL;
    m->parts = NULL;
    m->n_devs = 0;
    m->split = 0;
    memset(m->devs, 0, sizeof m->devs);
    memset(m->rope_scale_w, 0, sizeof m->rope_scale_w);
    m->output_w = (weight){0};
    m->output_norm_w = NULL;
    m->output_norm_b_w = NULL;
    m->output_b_w = NULL;
}

/* Copy the weights as L says; on failure the model is back on the host. Takes L's arrays. */
static int apply(iflow_model *m, layout *L)
{
    iflow_unplace(m);
    m->n_devs = L->n_devs;
    memcpy(m->devs, L->devs, sizeof m->devs);
    m->output_dev = L->output_dev;
    m->pass = pass_rows(m, L);
    m->part0 = L->part0;
    m->parts = L->parts;
    L->part0 = NULL;
    L->parts = NULL;
    int rc = 0;
    for (int l = 0; l < m->hp.n_layers && rc == 0; l++) {
        m->split |= m->part0[l + 1] - m->part0[l] > 1;
        for (int k = m->part0[l]; k < m->part0[l + 1] && rc == 0; k++)
            if (iflow_dev_is_mine(m, m->parts[k].dev))
                rc = copy_part(m, l, &m->parts[k], k == m->part0[l]);
    }
    if (rc == 0)
        rc = copy_shared(m);
    if (rc < 0) {
        iflow_unplace(m);
        if (iflow_place_on_host(m) < 0)
            return IFLOW_ENOMEM;
    }
    return rc;
}

int iflow_place_on_host(iflow_model *m)
{
    iflow_placement pl = {.n_devices = 1};
    layout L = {0};
    int rc;
    if (m->split_plan) {
        /* a split model has no whole layers: its plan's parts, each device the context's CPU */
        iflow_device *none[IFLOW_PLAN_MAX_DEVICES] = {0};
        rc = describe_plan(m, m->split_plan, none, &L);
    } else {
        int *ld = calloc((size_t)m->hp.n_layers, sizeof *ld);
        if (!ld)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        pl.layer_device = ld;
        rc = describe_placement(m, &pl, &L);
        free(ld);
    }
    if (rc == 0)
        rc = apply(m, &L);
    layout_free(&L);
    return rc;
}

/* ---- the public entry points ---- */

static int place_layout(iflow_model *m, layout *L, int n_ctx)
{
    iflow_device_bytes need[IFLOW_MAX_DEVICES];
    if (n_ctx <= 0)
        n_ctx = m->hp.max_seq;
    int rc = measure(m, L, n_ctx, need);
    if (rc == 0)
        rc = check_fit(L, need, n_ctx);
    if (rc == 0)
        rc = apply(m, L);
    return rc;
}

int iflow_placement_bytes(const iflow_model *m, const iflow_placement *p, int n_ctx, iflow_device_bytes *need)
{
    layout L = {0};
    int rc = describe_placement(m, p, &L);
    if (rc == 0)
        rc = measure(m, &L, n_ctx <= 0 ? m->hp.max_seq : n_ctx, need);
    layout_free(&L);
    return rc;
}

int iflow_model_place(iflow_model *m, const iflow_placement *p, int n_ctx)
{
    if (m->own_dev >= 0)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a model opened for plan device %d is placed by a plan only", m->own_dev);
    layout L = {0};
    int rc = describe_placement(m, p, &L);
    if (rc == 0)
        rc = place_layout(m, &L, n_ctx);
    layout_free(&L);
    return rc;
}

int iflow_model_place_plan(iflow_model *m, const struct iflow_plan_s *plan, iflow_device *const *devices, int n_ctx)
{
    layout L = {0};
    int rc = describe_plan(m, plan, devices, &L);
    if (rc == 0)
        rc = place_layout(m, &L, n_ctx);
    layout_free(&L);
    return rc;
}

int iflow_model_host_only(const iflow_model *m)
{
    for (int i = 0; i < m->n_devs; i++)
        if (m->devs[i] && !m->devs[i]->host_memory)
            return 0;
    return 1;
}

void iflow_placement_first_n(iflow_placement *p, int *layer_device, int n_layers, iflow_device *first, int n_first,
                             iflow_device *rest)
{
    memset(p, 0, sizeof *p);
    if (n_first > n_layers)
        n_first = n_layers;
    p->n_devices = 2;
    p->devices[0] = first;
    p->devices[1] = rest;
    for (int l = 0; l < n_layers; l++)
        layer_device[l] = l < n_first ? 0 : 1;
    p->layer_device = layer_device;
    p->output_device = n_first == n_layers ? 0 : 1;
}
