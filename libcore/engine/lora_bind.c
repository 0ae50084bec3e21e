/* lora_bind.c -- LoRA adapters applied at run time (iflow_model_add_lora, model.h): each delta
 * of an adapter bound to the matrix of the model it changes, found through the spec the shard
 * was converted with. */
#include "model_impl.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/base/quote.h"
#include "libcore/formats/lora.h"
#include "libcore/formats/spec.h"

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

/* lr += d: a stacked on a's rows, s b (rows permuted by rows, when given) beside b's columns,
 * rounded to F16 once (the values of lr's earlier rows kept as they are); lr's old arrays go. */
static int stack(low_rank *lr, const iflow_lora_delta *d, const int64_t *rows)
{
    const int r0 = lr->rank, r = r0 + d->rank;
    const int64_t K = d->in, N = d->out;
    uint16_t *a = malloc((size_t)r * (size_t)K * sizeof *a), *b = malloc((size_t)N * (size_t)r * sizeof *b);
    if (!a || !b) {
        free(a);
        free(b);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    if (r0)
        memcpy(a, lr->a, (size_t)r0 * (size_t)K * sizeof *a);
    for (size_t i = 0; i < (size_t)d->rank * (size_t)K; i++)
        a[(size_t)r0 * (size_t)K + i] = iflow_f32_to_f16(d->a[i]);
    for (int64_t i = 0; i < N; i++) {
        const float *src = d->b + (size_t)(rows ? rows[i] : i) * (size_t)d->rank;
        for (int q = 0; q < r0; q++)
            b[i * r + q] = lr->b[i * r0 + q];
        for (int q = 0; q < d->rank; q++)
            b[i * r + r0 + q] = iflow_f32_to_f16((float)(d->scale * src[q]));
    }
    free((void *)lr->a);
    free((void *)lr->b);
    *lr = (low_rank){.a = a, .b = b, .rank = r};
    return 0;
}

/* Every delta of l on its matrix (apply 0: only checked), used[k] marking delta k. */
static int bind(iflow_model *m, const iflow_lora *l, const iflow_spec *view, const char *model_rope, char *used,
                int apply)
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
            int rc = stack(&m->layers[L].lr[i], d, rows);
            free(rows);
            IFLOW_TRY(rc);
        }
    return 0;
}

int iflow_model_add_lora(iflow_model *m, const iflow_lora *l, const char *const *spec_dirs, size_t n_dirs)
{
    const iflow_hparams *hp = &m->hp;
    if (!m->layers || m->split_plan)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a LoRA adapter cannot be applied to a split model (iflow-partition "
                            "--split): merge it before splitting (iflow-convert --lora)");
    if (hp->layout != IFLOW_LAYOUT_DECODER)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a LoRA adapter is applied at run time to decoder-only models only");
    json_error_t je;
    json_t *meta = json_loads(iflow_shard_meta(m->shard), 0, &je);
    const char *spec = json_string_value(json_object_get(meta, "spec"));
    const char *rope = json_string_value(json_object_get(json_object_get(meta, "blocks"), "rope_layout"));
    iflow_spec *view = NULL;
    char *used = calloc(iflow_lora_n_deltas(l) + 1, 1);
    int rc = !spec ? iflow_seterr(IFLOW_EFORMAT, "the meta of '%s' names no spec", iflow_shard_path(m->shard))
           : !used ? iflow_seterr(IFLOW_ENOMEM, "out of memory")
                   : load_spec(&view, spec, spec_dirs, n_dirs, iflow_lora_naming(l) == IFLOW_LORA_GGUF);
    if (rc == 0) /* checked whole first, so that a refused adapter leaves the model as it was */
        rc = bind(m, l, view, rope, used, 0);
    for (size_t k = 0; rc == 0 && k < iflow_lora_n_deltas(l); k++)
        if (!used[k])
            rc = iflow_seterr(IFLOW_ENOTFOUND, "LoRA adapter '%s' changes '%s', which the model in '%s' does not use "
                              "(or not as a matrix iflow adapts at run time: q, k, v, o, gate, up, down)",
                              iflow_lora_path(l), iflow_lora_delta_at(l, k)->target, iflow_shard_path(m->shard));
    if (rc == 0)
        rc = bind(m, l, view, rope, used, 1);
    free(used);
    iflow_spec_close(view);
    json_decref(meta);
    if (rc == 0) /* the parts read the deltas from the layers */
        rc = iflow_place_on_host(m);
    return rc;
}

void iflow_model_free_lora(iflow_model *m)
{
    for (int L = 0; m->layers && L < m->hp.n_layers; L++)
        for (int i = 0; i < LR_COUNT; i++) {
            free((void *)m->layers[L].lr[i].a);
            free((void *)m->layers[L].lr[i].b);
            m->layers[L].lr[i] = (low_rank){0};
        }
}

int iflow_model_has_lora(const iflow_model *m)
{
    for (int L = 0; m->layers && L < m->hp.n_layers; L++)
        for (int i = 0; i < LR_COUNT; i++)
            if (m->layers[L].lr[i].rank)
                return 1;
    return 0;
}
