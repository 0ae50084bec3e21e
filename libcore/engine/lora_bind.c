/* lora_bind.c -- LoRA adapters applied at run time (iflow_model_add_lora, model.h): each delta
 * of an adapter bound to the matrix of the model it changes, found through the spec the shard
 * was converted with. */
#include "model_impl.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/base/quote.h"
#include "libcore/formats/lora.h"
#include "libcore/formats/spec.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The matrices a delta may change (layer_weights.lr's order): their iflow names in a layer and
 * shapes [N][K]. */
typedef struct {
    const char *role;
    char n, k;    /* 'D' dim, 'Q' query heads, 'V' kv heads, 'F' ffn columns */
    char rotary;  /* 'Q' or 'V': rows in rotary order, heads of that kind */
} role;

static const role ROLES[LR_COUNT] = {
    [LR_Q] = {"wq", 'Q', 'D', 'Q'},      [LR_K] = {"wk", 'V', 'D', 'V'},          [LR_V] = {"wv", 'V', 'D', 0},
    [LR_O] = {"wo", 'D', 'Q', 0},        [LR_GATE] = {"ffn_gate", 'F', 'D', 0},  [LR_UP] = {"ffn_up", 'F', 'D', 0},
    [LR_DOWN] = {"ffn_down", 'D', 'F', 0},
};

static int64_t size_of(const iflow_hparams *hp, char c)
{
    return c == 'D' ? hp->dim : c == 'Q' ? (int64_t)hp->n_heads * hp->head_dim
         : c == 'V' ? (int64_t)hp->n_kv_heads * hp->head_dim : hp->ffn_dim;
}

/* The spec file `name` (a shard's meta.spec) in dirs, in the view of the adapter's naming. */
static int load_spec(iflow_spec **out, const char *name, const char *const *dirs, size_t n_dirs, int gguf)
{
    char path[4200];
    *out = NULL;
    for (size_t i = 0; i < n_dirs; i++) {
        snprintf(path, sizeof path, "%s/%s.ini", dirs[i], name);
        if (access(path, R_OK) != 0)
            continue;
        IFLOW_TRY(iflow_spec_load(out, path));
        int rc = gguf ? iflow_spec_use_source(*out, "gguf") : 0;
        if (rc < 0) {
            iflow_spec_close(*out);
            *out = NULL;
        }
        return rc;
    }
    return iflow_seterr(IFLOW_ENOTFOUND, "no spec '%s' to name the model's tensors with (searched %zu directories)",
                        iflow_quote(name), n_dirs);
}

/* lr += d: a stacked on a's rows, s b (rows permuted by rows, when given) beside b's columns in
 * the up-projection's tiles, rounded to F16 once (lr's earlier values kept as they are); lr's
 * old arrays go. */
static int stack(low_rank *lr, const iflow_lora_delta *d, const int64_t *rows)
{
    const int r0 = lr->rank, r = r0 + d->rank;
    const size_t K = (size_t)d->in, N = (size_t)d->out;
    uint16_t *a = malloc((size_t)r * K * sizeof *a), *bt = malloc((size_t)r * N * sizeof *bt);
    if (!a || !bt) {
        free(a);
        free(bt);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    if (r0)
        memcpy(a, lr->a, (size_t)r0 * K * sizeof *a);
    for (size_t i = 0; i < (size_t)d->rank * K; i++)
        a[(size_t)r0 * K + i] = iflow_f32_to_f16(d->a[i]);
    for (size_t i = 0; i < N; i++) { /* b [N][r] in the kernel's tiles (kernels.h's ifk_lr_at) */
        const float *src = d->b + (size_t)(rows ? rows[i] : (int64_t)i) * (size_t)d->rank; /* d's b [N][rank] */
        for (int q = 0; q < r0; q++)
            bt[ifk_lr_at(i, (size_t)q, N, (size_t)r)] = lr->bt[ifk_lr_at(i, (size_t)q, N, (size_t)r0)];
        for (int q = 0; q < d->rank; q++)
            bt[ifk_lr_at(i, (size_t)(r0 + q), N, (size_t)r)] = iflow_f32_to_f16((float)(d->scale * src[q]));
    }
    if (r0)
        ifk_pool_quiesce(); /* no kernel thread still reads the old arrays (pool.h) */
    free((void *)lr->a);
    free((void *)lr->bt);
    *lr = (low_rank){.a = a, .bt = bt, .rank = r};
    return 0;
}

/* Where matrix i of layer L keeps its delta: the layer's own (slot 0: every sequence), or adapter
 * slot's (iflow_model_add_adapter). */
static low_rank *slot_delta(iflow_model *m, int slot, int L, int i)
{
    return slot ? (low_rank *)iflow_adapter_delta(m, slot, L, i) : &m->layers[L].lr[i];
}

/* Every delta of l on its matrix in slot (apply 0: only checked), used[k] marking delta k. */
static int bind(iflow_model *m, int slot, const iflow_lora *l, const iflow_spec *view, const char *model_rope,
                char *used, int apply)
{
    const iflow_hparams *hp = &m->hp;
    const char *theirs = iflow_spec_block(view, "rope_layout");
    const int flip = hp->position == IFLOW_POS_ROPE && model_rope && theirs && strcmp(model_rope, theirs) != 0;
    for (int L = 0; L < hp->n_layers; L++)
        for (int i = 0; i < LR_COUNT; i++) {
            const role *ro = &ROLES[i];
            char iname[64], sname[512];
            snprintf(iname, sizeof iname, "blk.%d.%s", L, ro->role);
            if (iflow_spec_source_name(view, iname, sname, sizeof sname) < 0 || strpbrk(sname, "|[^"))
                continue;
            const iflow_lora_delta *d = iflow_lora_find(l, sname);
            if (!d)
                continue;
            const int64_t N = size_of(hp, ro->n), K = size_of(hp, ro->k);
            if (d->out != N || d->in != K)
                return iflow_seterr(IFLOW_ESHAPE, "LoRA adapter '%s': the delta of '%s' is [%lld, %lld] and the "
                                    "model's %s [%lld, %lld]", iflow_lora_path(l), d->target, (long long)d->out,
                                    (long long)d->in, iname, (long long)N, (long long)K);
            const int heads = ro->rotary == 'Q' ? hp->n_heads : hp->n_kv_heads;
            int64_t *rows = NULL;
            if (flip && ro->rotary && (hp->rope_dim != hp->head_dim || hp->head_dim % 2))
                return iflow_seterr(IFLOW_EUNSUPPORTED, "LoRA adapter '%s' changes '%s', whose rotary rows the two "
                                    "namings order differently and not in whole heads", iflow_lora_path(l), d->target);
            used[d - iflow_lora_delta_at(l, 0)] = 1;
            if (!apply)
                continue;
            if (flip && ro->rotary) {
                if (!(rows = malloc((size_t)N * sizeof *rows)))
                    return iflow_seterr(IFLOW_ENOMEM, "out of memory");
                iflow_lora_rotary_rows(rows, N, heads, strcmp(model_rope, "interleaved") == 0);
            }
            int rc = stack(slot_delta(m, slot, L, i), d, rows);
            free(rows);
            IFLOW_TRY(rc);
        }
    return 0;
}

static void free_delta(low_rank *l)
{
    free((void *)l->a);
    free((void *)l->bt);
    *l = (low_rank){0};
}

/* l's deltas into slot (0: the layers' own), checked whole first, so that a refused adapter
 * leaves the model as it was. */
static int add_to(iflow_model *m, int slot, const iflow_lora *l, const char *const *spec_dirs, size_t n_dirs)
{
    const iflow_hparams *hp = &m->hp;
    if (!m->layers || m->split_plan)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a LoRA adapter cannot be applied to a split model (iflow-partition "
                            "--split): merge it before splitting (iflow-convert --lora)");
    if (hp->layout != IFLOW_LAYOUT_DECODER)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a LoRA adapter is applied at run time to decoder-only models only");
    if (hp->kv_lora_rank)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a LoRA adapter is not applied at run time to latent attention "
                            "(kv_lora_rank) yet: merge it at conversion (iflow-convert --lora)");
    json_error_t je;
    json_t *meta = json_loads(iflow_shard_meta(m->shard), 0, &je);
    const char *spec = json_string_value(json_object_get(meta, "spec"));
    const char *rope = json_string_value(json_object_get(json_object_get(meta, "blocks"), "rope_layout"));
    iflow_spec *view = NULL;
    char *used = calloc(iflow_lora_n_deltas(l) + 1, 1);
    int rc = !spec ? iflow_seterr(IFLOW_EFORMAT, "the meta of '%s' names no spec", iflow_shard_path(m->shard))
           : !used ? iflow_seterr(IFLOW_ENOMEM, "out of memory")
                   : load_spec(&view, spec, spec_dirs, n_dirs, iflow_lora_naming(l) == IFLOW_LORA_GGUF);
    if (rc == 0)
        rc = bind(m, slot, l, view, rope, used, 0);
    for (size_t k = 0; rc == 0 && k < iflow_lora_n_deltas(l); k++)
        if (!used[k])
            rc = iflow_seterr(IFLOW_ENOTFOUND, "LoRA adapter '%s' changes '%s', which the model in '%s' does not use "
                              "(or not as a matrix iflow adapts at run time: q, k, v, o, gate, up, down)",
                              iflow_lora_path(l), iflow_lora_delta_at(l, k)->target, iflow_shard_path(m->shard));
    if (rc == 0)
        rc = bind(m, slot, l, view, rope, used, 1);
    free(used);
    iflow_spec_close(view);
    json_decref(meta);
    if (rc == 0) /* the parts read the deltas from the layers */
        rc = iflow_place_on_host(m);
    return rc;
}

int iflow_model_add_lora(iflow_model *m, const iflow_lora *l, const char *const *spec_dirs, size_t n_dirs)
{
    return add_to(m, 0, l, spec_dirs, n_dirs);
}

int iflow_model_add_adapter(iflow_model *m, const iflow_lora *l, const char *const *spec_dirs, size_t n_dirs)
{
    const size_t per = (size_t)m->hp.n_layers * LR_COUNT;
    if (m->n_adapters >= IFLOW_MAX_ADAPTERS)
        return iflow_seterr(IFLOW_ERANGE, "at most %d LoRA adapters for the sequences to choose from",
                            IFLOW_MAX_ADAPTERS);
    low_rank *grown = realloc(m->adapters, (size_t)(m->n_adapters + 1) * per * sizeof *grown);
    if (!grown)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    m->adapters = grown;
    memset(grown + (size_t)m->n_adapters * per, 0, per * sizeof *grown);
    m->n_adapters++;
    int rc = add_to(m, m->n_adapters, l, spec_dirs, n_dirs);
    if (rc < 0) { /* out of memory half way through, at worst: the slot goes whole */
        for (size_t k = 0; k < per; k++)
            free_delta(&m->adapters[(size_t)(m->n_adapters - 1) * per + k]);
        m->n_adapters--;
    }
    return rc < 0 ? rc : m->n_adapters;
}

int iflow_model_n_adapters(const iflow_model *m) { return m->n_adapters; }

int iflow_layer_deltas(const iflow_model *m, int L, void (*fn)(void *user, int i, const low_rank *d), void *user)
{
    int n = 0;
    for (int a = 0; m->layers && a <= m->n_adapters; a++)
        for (int i = 0; i < LR_COUNT; i++) {
            const low_rank *d = a ? iflow_adapter_delta(m, a, L, i) : &m->layers[L].lr[i];
            if (d->rank && fn)
                fn(user, i, d);
            n += d->rank > 0;
        }
    return n;
}

typedef struct {
    const iflow_hparams *hp;
    uint64_t bytes;
} delta_bytes;

static void add_delta_bytes(void *user, int i, const low_rank *d)
{
    delta_bytes *b = user;
    b->bytes += (uint64_t)d->rank * (uint64_t)(size_of(b->hp, ROLES[i].n) + size_of(b->hp, ROLES[i].k)) *
                sizeof(uint16_t);
}

uint64_t iflow_model_lora_bytes(const iflow_model *m)
{
    delta_bytes b = {.hp = &m->hp};
    for (int L = 0; m->layers && L < m->hp.n_layers; L++)
        iflow_layer_deltas(m, L, add_delta_bytes, &b);
    return b.bytes;
}

int iflow_model_load_lora(iflow_model *m, const char *path, double scale, int per_request, const char *spec_path)
{
    char buf[4096];
    const char *dirs[16];
    size_t n_dirs = 0;
    if (!path || !spec_path || strlen(spec_path) >= sizeof buf)
        return iflow_seterr(IFLOW_EINVAL, "a LoRA adapter needs a path and a spec path (of %zu bytes at most)",
                            sizeof buf - 1);
    memcpy(buf, spec_path, strlen(spec_path) + 1);
    for (char *save = NULL, *d = strtok_r(buf, ":", &save); d && n_dirs < 16; d = strtok_r(NULL, ":", &save))
        dirs[n_dirs++] = d;
    iflow_lora *l = NULL;
    IFLOW_TRY(iflow_lora_open(&l, path, scale));
    int rc = per_request ? iflow_model_add_adapter(m, l, dirs, n_dirs) : iflow_model_add_lora(m, l, dirs, n_dirs);
    iflow_lora_close(l);
    return rc;
}

void iflow_model_free_lora(iflow_model *m)
{
    for (int L = 0; m->layers && L < m->hp.n_layers; L++)
        for (int i = 0; i < LR_COUNT; i++)
            free_delta(&m->layers[L].lr[i]);
    for (size_t k = 0; k < (size_t)m->n_adapters * (size_t)m->hp.n_layers * LR_COUNT; k++)
        free_delta(&m->adapters[k]);
    free(m->adapters);
    m->adapters = NULL;
    m->n_adapters = 0;
}

int iflow_model_has_lora(const iflow_model *m)
{
    int any = m->n_adapters > 0;
    for (int L = 0; m->layers && L < m->hp.n_layers && !any; L++)
        any = iflow_layer_deltas(m, L, NULL, NULL) > 0;
    return any;
}
