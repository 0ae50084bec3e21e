/* model.c -- decoder-only transformer from blocks; KV cache; forward pass. See model.h. */
#include "model.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/quant.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BATCH 128 /* tokens per forward pass; longer prompts are run in chunks */

/* ===================================================================== hyperparameters ==== */

typedef struct { const char *key; int *dst; int min; } int_field;

static int get_int(const json_t *hp, const char *key, int *dst, int min, const char *what)
{
    const json_t *v = json_object_get(hp, key);
    if (!json_is_integer(v) && !(json_is_real(v) && json_real_value(v) == floor(json_real_value(v))))
        return iflow_seterr(IFLOW_EFORMAT, "hyperparameter '%s' is missing or not an integer in '%s'", key, what);
    json_int_t x = json_is_integer(v) ? json_integer_value(v) : (json_int_t)json_real_value(v);
    if (x < min || x > (1 << 30))
        return iflow_seterr(IFLOW_ERANGE, "hyperparameter '%s' = %lld is out of range in '%s'", key, (long long)x, what);
    *dst = (int)x;
    return 0;
}

static int get_float(const json_t *hp, const char *key, float *dst, const char *what)
{
    const json_t *v = json_object_get(hp, key);
    if (!json_is_number(v))
        return iflow_seterr(IFLOW_EFORMAT, "hyperparameter '%s' is missing or not a number in '%s'", key, what);
    *dst = (float)json_number_value(v);
    return 0;
}

static int get_bool(const json_t *hp, const char *key, int *dst, const char *what)
{
    const json_t *v = json_object_get(hp, key);
    if (!json_is_boolean(v))
        return iflow_seterr(IFLOW_EFORMAT, "hyperparameter '%s' is missing or not a boolean in '%s'", key, what);
    *dst = json_is_true(v);
    return 0;
}

/* A block must be one of the choices the engine implements. */
static int check_block(const json_t *blocks, const char *block, const char *const *choices, int *index,
                       const char *what)
{
    const char *v = json_string_value(json_object_get(blocks, block));
    if (!v)
        return iflow_seterr(IFLOW_EFORMAT, "block '%s' is not chosen in '%s'", block, what);
    for (int i = 0; choices[i]; i++)
        if (strcmp(v, choices[i]) == 0) {
            if (index)
                *index = i;
            return 0;
        }
    return iflow_seterr(IFLOW_EUNSUPPORTED, "block %s = %s is not implemented (in '%s')", block, v, what);
}

static int read_blocks(iflow_hparams *hp, const json_t *blocks, const char *what)
{
    static const char *const layout[] = {"decoder", NULL}, *const norm[] = {"rms", NULL},
                             *const act[] = {"silu", NULL}, *const ffn[] = {"gated", NULL},
                             *const pos[] = {"rope", NULL}, *const rope[] = {"half", "interleaved", NULL};
    static const char *const known[] = {"layout", "norm", "activation", "ffn", "position", "rope_layout", NULL};
    int rc;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)blocks, key, val) {
        int ok = 0;
        for (int i = 0; known[i]; i++)
            ok |= strcmp(key, known[i]) == 0;
        if (!ok)
            return iflow_seterr(IFLOW_EUNSUPPORTED, "unknown block '%s' in '%s'", key, what);
    }
    if ((rc = check_block(blocks, "layout", layout, NULL, what)) || (rc = check_block(blocks, "norm", norm, NULL, what)) ||
        (rc = check_block(blocks, "activation", act, NULL, what)) || (rc = check_block(blocks, "ffn", ffn, NULL, what)) ||
        (rc = check_block(blocks, "position", pos, NULL, what)) ||
        (rc = check_block(blocks, "rope_layout", rope, &hp->rope_layout, what)))
        return rc;
    return 0;
}

static int read_rope_scaling(iflow_hparams *hp, const json_t *h, const char *what)
{
    static const char *const kinds[] = {"none", "linear", "llama3", "default", NULL};
    const char *v = json_string_value(json_object_get(h, "rope_scaling"));
    int rc;
    if (!v)
        return iflow_seterr(IFLOW_EFORMAT, "hyperparameter 'rope_scaling' is missing in '%s'", what);
    hp->rope_scaling = -1;
    for (int i = 0; kinds[i]; i++)
        if (strcmp(v, kinds[i]) == 0)
            hp->rope_scaling = i == 3 ? IFLOW_ROPE_SCALING_NONE : i;
    if (hp->rope_scaling < 0)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "block rope_scaling = %s is not implemented (in '%s')", v, what);
    if ((rc = get_float(h, "rope_factor", &hp->rope_factor, what)) || (rc = get_float(h, "rope_low_freq", &hp->rope_low_freq, what)) ||
        (rc = get_float(h, "rope_high_freq", &hp->rope_high_freq, what)) ||
        (rc = get_int(h, "rope_orig_ctx", &hp->rope_orig_ctx, 1, what)))
        return rc;
    if (hp->rope_scaling != IFLOW_ROPE_SCALING_NONE && !(hp->rope_factor > 0))
        return iflow_seterr(IFLOW_ERANGE, "rope_factor must be positive in '%s'", what);
    return 0;
}

/* bos is an integer; eos an integer or a list of them (Llama 3.1 has several). */
static int read_special(iflow_hparams *hp, const json_t *h, const char *what)
{
    const json_t *eos = json_object_get(h, "eos");
    int rc = get_int(h, "bos", &hp->bos, -1, what);
    if (rc)
        return rc;
    hp->n_eos = 0;
    if (json_is_array(eos)) {
        size_t i;
        const json_t *e;
        json_array_foreach(eos, i, e) {
            if (!json_is_integer(e) || hp->n_eos == IFLOW_MAX_EOS)
                return iflow_seterr(IFLOW_EFORMAT, "bad 'eos' list in '%s'", what);
            hp->eos[hp->n_eos++] = (int)json_integer_value(e);
        }
        return 0;
    }
    if ((rc = get_int(h, "eos", &hp->eos[0], -1, what)))
        return rc;
    hp->n_eos = hp->eos[0] >= 0;
    return 0;
}

int iflow_hparams_from_json(iflow_hparams *hp, const json_t *resolved, const char *what)
{
    const json_t *h = json_object_get(resolved, "hparams"), *b = json_object_get(resolved, "blocks");
    memset(hp, 0, sizeof *hp);
    if (!json_is_object(h) || !json_is_object(b))
        return iflow_seterr(IFLOW_EFORMAT, "no 'blocks' and 'hparams' in the model description of '%s'", what);
    const int_field ints[] = {
        {"dim", &hp->dim, 1},           {"n_layers", &hp->n_layers, 1}, {"n_heads", &hp->n_heads, 1},
        {"n_kv_heads", &hp->n_kv_heads, 1}, {"head_dim", &hp->head_dim, 0}, {"ffn_dim", &hp->ffn_dim, 1},
        {"vocab_size", &hp->vocab_size, 1}, {"max_seq", &hp->max_seq, 1}, {"rope_dim", &hp->rope_dim, 0},
    };
    int rc;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if ((rc = get_int(h, ints[i].key, ints[i].dst, ints[i].min, what)))
            return rc;
    if ((rc = get_float(h, "norm_eps", &hp->norm_eps, what)) || (rc = get_float(h, "rope_theta", &hp->rope_theta, what)) ||
        (rc = get_bool(h, "attn_bias", &hp->attn_bias, what)) || (rc = get_bool(h, "mlp_bias", &hp->mlp_bias, what)) ||
        (rc = get_bool(h, "tie_embeddings", &hp->tie_embeddings, what)) || (rc = read_blocks(hp, b, what)) ||
        (rc = read_rope_scaling(hp, h, what)) || (rc = read_special(hp, h, what)))
        return rc;
    if (!hp->head_dim) {
        if (hp->dim % hp->n_heads)
            return iflow_seterr(IFLOW_ESHAPE, "dim %d is not a multiple of n_heads %d in '%s'", hp->dim, hp->n_heads, what);
        hp->head_dim = hp->dim / hp->n_heads;
    }
    if (!hp->rope_dim)
        hp->rope_dim = hp->head_dim;
    if (hp->n_heads % hp->n_kv_heads)
        return iflow_seterr(IFLOW_ESHAPE, "n_heads %d is not a multiple of n_kv_heads %d in '%s'", hp->n_heads,
                            hp->n_kv_heads, what);
    if (hp->rope_dim > hp->head_dim || hp->rope_dim % 2 || hp->head_dim % 2)
        return iflow_seterr(IFLOW_ESHAPE, "rope_dim %d does not fit head_dim %d in '%s'", hp->rope_dim, hp->head_dim, what);
    return 0;
}

/* ===================================================================== tensor list ======== */

static void req(iflow_tensor_req *r, size_t *n, const char *name, int64_t d0, int64_t d1)
{
    iflow_tensor_req *t = &r[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->is_vector = d1 == 0;
}

int iflow_model_tensors(const iflow_hparams *hp, iflow_tensor_req **reqs, size_t *n)
{
    size_t cap = 3 + (size_t)hp->n_layers * 16;
    iflow_tensor_req *r = calloc(cap, sizeof *r);
    if (!r)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    int64_t D = hp->dim, Q = (int64_t)hp->n_heads * hp->head_dim, KV = (int64_t)hp->n_kv_heads * hp->head_dim,
            F = hp->ffn_dim, V = hp->vocab_size;
    char name[48];
    *n = 0;
    req(r, n, "tok_embd", V, D);
    for (int l = 0; l < hp->n_layers; l++) {
#define L(suffix, d0, d1) (snprintf(name, sizeof name, "blk.%d." suffix, l), req(r, n, name, d0, d1))
        L("attn_norm", D, 0);
        L("wq", Q, D);
        L("wk", KV, D);
        L("wv", KV, D);
        L("wo", D, Q);
        if (hp->attn_bias) {
            L("bq", Q, 0);
            L("bk", KV, 0);
            L("bv", KV, 0);
            L("bo", D, 0);
        }
        L("ffn_norm", D, 0);
        L("ffn_gate", F, D);
        L("ffn_up", F, D);
        L("ffn_down", D, F);
        if (hp->mlp_bias) {
            L("ffn_gate_b", F, 0);
            L("ffn_up_b", F, 0);
            L("ffn_down_b", D, 0);
        }
#undef L
    }
    req(r, n, "output_norm", D, 0);
    if (!hp->tie_embeddings)
        req(r, n, "output", V, D);
    *reqs = r;
    return 0;
}

/* ===================================================================== model ============== */

typedef struct { const void *data; int type; } weight;   /* a matrix [rows][cols] of type */

typedef struct {
    const float *attn_norm, *ffn_norm;                       /* [dim]                       */
    weight wq, wk, wv, wo;                                   /* [Q][dim] [KV][dim] x2 [dim][Q] */
    const float *bq, *bk, *bv, *bo;                          /* [Q] [KV] [KV] [dim] or NULL  */
    weight gate, up, down;                                   /* [F][dim] [F][dim] [dim][F]  */
    const float *gate_b, *up_b, *down_b;                     /* [F] [F] [dim] or NULL        */
} layer_weights;

/* Every weight of the model, as pointers valid on some device(s). */
typedef struct {
    weight tok_embd;              /* [vocab][dim] */
    weight output;                /* [vocab][dim] (tok_embd when tied) */
    const float *output_norm;     /* [dim] */
    layer_weights *layers;        /* [n_layers] */
} weight_set;

struct iflow_model {
    iflow_shard *shard;
    iflow_hparams hp;
    iflow_tokenizer *tok;
    weight_set host;              /* in the mapping */
    float *rope_scale;            /* [rope_dim/2] or NULL, on the host */
    uint64_t decode_bytes;
    /* placement: the devices, each layer's, and the weights as placed (host pointers on
     * host-memory devices, device copies elsewhere); tok_embd is never placed */
    iflow_placement place;
    int *layer_device;                           /* [n_layers] */
    weight_set dev;
    const float *rope_scale_dev[IFLOW_MAX_DEVICES];
};

/* Find a tensor and check it against what the blocks need. */
static int bind(iflow_model *m, const iflow_tensor_req *r, const iflow_shard_rec **out)
{
    const char *path = iflow_shard_path(m->shard);
    const iflow_shard_rec *t = iflow_shard_find(m->shard, r->name);
    if (!t || t->kind != IFLOW_REC_TENSOR)
        return iflow_seterr(IFLOW_ENOTFOUND, "missing tensor '%s' in '%s'", r->name, path);
    if (t->n_dims != r->n_dims || t->shape[0] != r->shape[0] || (r->n_dims == 2 && t->shape[1] != r->shape[1]))
        return iflow_seterr(IFLOW_ESHAPE, "tensor '%s' in '%s' has shape [%lld, %lld], expected [%lld, %lld]", r->name,
                            path, (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0),
                            (long long)r->shape[0], (long long)r->shape[1]);
    int matrix_ok = iflow_dtype_is_float(t->dtype) || ifk_qtype(t->dtype) != NULL;
    if (r->is_vector ? t->dtype != IFLOW_DT_F32 : !matrix_ok)
        return iflow_seterr(IFLOW_ESHAPE, "tensor '%s' in '%s' has type %s, which the engine cannot use there", r->name,
                            path, iflow_dtype_name(t->dtype) ? iflow_dtype_name(t->dtype) : "?");
    *out = t;
    return 0;
}

/* The slot of a weight set that tensor `name` fills; *layer receives its layer (-1: none). */
static void *slot(weight_set *ws, int n_layers, const char *name, int *is_weight, int *layer)
{
    int l;
    char suffix[32];
    *is_weight = 1;
    *layer = -1;
    if (strcmp(name, "tok_embd") == 0) return &ws->tok_embd;
    if (strcmp(name, "output") == 0) return &ws->output;
    *is_weight = 0;
    if (strcmp(name, "output_norm") == 0) return &ws->output_norm;
    if (sscanf(name, "blk.%d.%31s", &l, suffix) != 2 || l < 0 || l >= n_layers)
        return NULL;
    layer_weights *w = &ws->layers[l];
    *layer = l;
    static const struct { const char *s; size_t off; int is_weight; } map[] = {
#define F(n, field, isw) {n, offsetof(layer_weights, field), isw}
        F("attn_norm", attn_norm, 0), F("ffn_norm", ffn_norm, 0), F("wq", wq, 1), F("wk", wk, 1),
        F("wv", wv, 1), F("wo", wo, 1), F("bq", bq, 0), F("bk", bk, 0), F("bv", bv, 0), F("bo", bo, 0),
        F("ffn_gate", gate, 1), F("ffn_up", up, 1), F("ffn_down", down, 1), F("ffn_gate_b", gate_b, 0),
        F("ffn_up_b", up_b, 0), F("ffn_down_b", down_b, 0),
#undef F
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(suffix, map[i].s) == 0) {
            *is_weight = map[i].is_weight;
            return (char *)w + map[i].off;
        }
    return NULL;
}

static void fill_slot(void *dst, int is_weight, const void *data, int type)
{
    if (is_weight)
        *(weight *)dst = (weight){data, type};
    else
        *(const float **)dst = data;
}

static int bind_all(iflow_model *m)
{
    iflow_tensor_req *reqs;
    size_t n;
    int rc = iflow_model_tensors(&m->hp, &reqs, &n);
    if (rc)
        return rc;
    m->host.layers = calloc((size_t)m->hp.n_layers, sizeof *m->host.layers);
    if (!m->host.layers)
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (size_t i = 0; i < n && rc == 0; i++) {
        const iflow_shard_rec *t = NULL;
        int is_weight, layer;
        void *dst = slot(&m->host, m->hp.n_layers, reqs[i].name, &is_weight, &layer);
        if ((rc = bind(m, &reqs[i], &t)) < 0)
            break;
        fill_slot(dst, is_weight, t->data, t->dtype);
        if (!reqs[i].is_vector && strcmp(reqs[i].name, "tok_embd") != 0)
            m->decode_bytes += t->nbytes;
    }
    free(reqs);
    if (rc == 0 && m->hp.tie_embeddings) {
        m->host.output = m->host.tok_embd;
        m->decode_bytes += iflow_tensor_nbytes(m->host.tok_embd.type, 2, (int64_t[]){m->hp.vocab_size, m->hp.dim});
    }
    return rc;
}

/* Per-pair frequency multipliers for context-extension schemes. */
static int make_rope_scale(iflow_model *m)
{
    const iflow_hparams *hp = &m->hp;
    if (hp->rope_scaling == IFLOW_ROPE_SCALING_NONE)
        return 0;
    int half = hp->rope_dim / 2;
    if (!(m->rope_scale = malloc((size_t)half * sizeof(float))))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int i = 0; i < half; i++) {
        float s = 1.0f / hp->rope_factor;
        if (hp->rope_scaling == IFLOW_ROPE_SCALING_LLAMA3) {
            /* Llama 3.1: keep high frequencies, divide low ones by factor, blend between. */
            double freq = pow(hp->rope_theta, -2.0 * i / hp->rope_dim), wavelen = 2 * M_PI / freq;
            double lo_wl = hp->rope_orig_ctx / hp->rope_low_freq, hi_wl = hp->rope_orig_ctx / hp->rope_high_freq;
            if (wavelen < hi_wl)
                s = 1.0f;
            else if (wavelen <= lo_wl) {
                double smooth = (hp->rope_orig_ctx / wavelen - hp->rope_low_freq) / (hp->rope_high_freq - hp->rope_low_freq);
                s = (float)((1 - smooth) / hp->rope_factor + smooth);
            }
        }
        m->rope_scale[i] = s;
    }
    return 0;
}

static int load_tokenizer(iflow_model *m, const json_t *meta)
{
    const char *path = iflow_shard_path(m->shard);
    const json_t *t = json_object_get(meta, "tokenizer");
    const char *format = json_string_value(json_object_get(t, "format"));
    const char *record = json_string_value(json_object_get(t, "record"));
    if (!format || !record)
        return 0; /* a model without a tokenizer still runs on token ids */
    const iflow_shard_rec *r = iflow_shard_find(m->shard, record);
    if (!r || r->kind != IFLOW_REC_BLOB)
        return iflow_seterr(IFLOW_ENOTFOUND, "missing tokenizer record '%s' in '%s'", record, path);
    char what[512];
    snprintf(what, sizeof what, "%s:%s", path, record);
    if (strcmp(format, "hf-json") == 0)
        return iflow_tokenizer_from_hf_json(&m->tok, r->data, r->nbytes, what);
    if (strcmp(format, "gguf") == 0)
        return iflow_tokenizer_from_gguf(&m->tok, r->data, r->nbytes, what);
    return iflow_seterr(IFLOW_EUNSUPPORTED, "unknown tokenizer format '%s' in '%s'", format, path);
}

/* The placement every model starts with: all layers on the context's CPU, weights in place. */
static int place_on_host(iflow_model *m)
{
    int L = m->hp.n_layers;
    m->layer_device = calloc((size_t)L, sizeof *m->layer_device);
    m->dev.layers = malloc((size_t)L * sizeof *m->dev.layers);
    if (!m->layer_device || !m->dev.layers)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    memcpy(m->dev.layers, m->host.layers, (size_t)L * sizeof *m->dev.layers);
    m->dev.tok_embd = m->host.tok_embd;
    m->dev.output = m->host.output;
    m->dev.output_norm = m->host.output_norm;
    memset(&m->place, 0, sizeof m->place);
    m->place.n_devices = 1;
    m->place.layer_device = m->layer_device;
    m->rope_scale_dev[0] = m->rope_scale;
    return 0;
}

int iflow_model_open(iflow_model **out, const char *path, int flags)
{
    *out = NULL;
    iflow_model *m = calloc(1, sizeof *m);
    if (!m)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    int rc = iflow_shard_open(&m->shard, path, (flags & IFLOW_MODEL_NO_VERIFY) ? IFLOW_SHARD_NO_VERIFY : 0);
    json_t *meta = NULL;
    if (rc == 0) {
        json_error_t je;
        meta = json_loads(iflow_shard_meta(m->shard), 0, &je);
        if (!meta)
            rc = iflow_seterr(IFLOW_EFORMAT, "bad meta record in '%s': %s at line %d", path, je.text, je.line);
    }
    if (rc == 0)
        rc = iflow_hparams_from_json(&m->hp, meta, path);
    if (rc == 0)
        rc = bind_all(m);
    if (rc == 0)
        rc = make_rope_scale(m);
    if (rc == 0)
        rc = load_tokenizer(m, meta);
    if (rc == 0)
        rc = place_on_host(m);
    json_decref(meta);
    if (rc < 0) {
        iflow_model_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* ---- placement ---- */

static iflow_device *place_dev(const iflow_placement *p, int i) { return p->devices[i]; }
static int host_dev(const iflow_device *d) { return !d || d->host_memory; }
static const char *dev_name(const iflow_device *d) { return d ? d->info.name : "cpu"; }

/* The device index of tensor `name` under p (tok_embd: -1, it stays on the host). */
static int tensor_device(const iflow_model *m, const iflow_placement *p, const char *name)
{
    int layer;
    if (strcmp(name, "tok_embd") == 0)
        return -1;
    if (sscanf(name, "blk.%d.", &layer) == 1 && layer >= 0 && layer < m->hp.n_layers)
        return p->layer_device[layer];
    return p->output_device;
}

static uint64_t kv_bytes_per_layer(const iflow_hparams *hp, int n_ctx)
{
    return 2ull * (uint64_t)n_ctx * (uint64_t)hp->n_kv_heads * hp->head_dim * sizeof(float);
}

/* Scratch of one batch on a device that runs layers (see dev_scratch below). */
static uint64_t layer_scratch_bytes(const iflow_hparams *hp)
{
    uint64_t D = hp->dim, Q = (uint64_t)hp->n_heads * hp->head_dim, F = hp->ffn_dim;
    return MAX_BATCH * (2 * D + 2 * Q + 2 * F) * sizeof(float);
}

int iflow_placement_bytes(const iflow_model *m, const iflow_placement *p, int n_ctx, iflow_device_bytes *need)
{
    const iflow_hparams *hp = &m->hp;
    if (n_ctx <= 0)
        n_ctx = hp->max_seq;
    if (p->n_devices < 1 || p->n_devices > IFLOW_MAX_DEVICES)
        return iflow_seterr(IFLOW_EINVAL, "a placement needs 1 to %d devices, not %d", IFLOW_MAX_DEVICES, p->n_devices);
    if (p->output_device < 0 || p->output_device >= p->n_devices)
        return iflow_seterr(IFLOW_EINVAL, "output device %d is not one of the placement's %d devices", p->output_device,
                            p->n_devices);
    for (int l = 0; l < hp->n_layers; l++)
        if (p->layer_device[l] < 0 || p->layer_device[l] >= p->n_devices)
            return iflow_seterr(IFLOW_EINVAL, "layer %d is placed on device %d, but the placement has %d devices", l,
                                p->layer_device[l], p->n_devices);
    memset(need, 0, (size_t)p->n_devices * sizeof *need);
    iflow_tensor_req *reqs;
    size_t n;
    int rc = iflow_model_tensors(hp, &reqs, &n);
    if (rc)
        return rc;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *name = reqs[i].name;
        int di = tensor_device(m, p, name);
        if (di < 0)
            continue;
        const iflow_shard_rec *t = iflow_shard_find(m->shard, name);
        iflow_device *d = place_dev(p, di);
        if (d && !reqs[i].is_vector && !d->ops->supports(d, t->dtype))
            rc = iflow_seterr(IFLOW_EUNSUPPORTED, "tensor '%s' has type %s, which has no kernel on %s", name,
                              iflow_dtype_name(t->dtype) ? iflow_dtype_name(t->dtype) : "?", d->info.name);
        if (!host_dev(d))
            need[di].weights += t->nbytes;
    }
    free(reqs);
    if (rc)
        return rc;
    if (hp->tie_embeddings) {
        iflow_device *d = place_dev(p, p->output_device);
        if (d && !d->ops->supports(d, m->host.tok_embd.type))
            return iflow_seterr(IFLOW_EUNSUPPORTED, "tensor 'tok_embd' (the tied output) has type %s, which has no kernel on %s",
                                iflow_dtype_name(m->host.tok_embd.type), d->info.name);
        if (!host_dev(d))
            need[p->output_device].weights += iflow_tensor_nbytes(m->host.tok_embd.type, 2, (int64_t[]){hp->vocab_size, hp->dim});
    }
    int runs_layers[IFLOW_MAX_DEVICES] = {0};
    for (int l = 0; l < hp->n_layers; l++) {
        need[p->layer_device[l]].kv += kv_bytes_per_layer(hp, n_ctx);
        runs_layers[p->layer_device[l]] = 1;
    }
    for (int i = 0; i < p->n_devices; i++) {
        if (runs_layers[i] || i == p->output_device)
            need[i].scratch += layer_scratch_bytes(hp);
        if (i == p->output_device)
            need[i].scratch += (uint64_t)hp->vocab_size * sizeof(float); /* one row of logits */
        if (m->rope_scale)
            need[i].scratch += (uint64_t)hp->rope_dim / 2 * sizeof(float);
    }
    return 0;
}

/* Release what the current placement copied to devices and return to the host placement. */
static void unplace(iflow_model *m)
{
    if (m->dev.layers && m->layer_device) {
        iflow_tensor_req *reqs;
        size_t n;
        if (iflow_model_tensors(&m->hp, &reqs, &n) == 0) {
            for (size_t i = 0; i < n; i++) {
                int di = tensor_device(m, &m->place, reqs[i].name), is_weight, layer;
                if (di < 0)
                    continue;
                void *s = slot(&m->dev, m->hp.n_layers, reqs[i].name, &is_weight, &layer);
                iflow_device *d = place_dev(&m->place, di);
                if (!host_dev(d))
                    iflow_device_unput(d, is_weight ? ((weight *)s)->data : *(const float **)s);
            }
            free(reqs);
        }
        if (m->hp.tie_embeddings && !host_dev(place_dev(&m->place, m->place.output_device)))
            iflow_device_unput(place_dev(&m->place, m->place.output_device), m->dev.output.data);
        for (int i = 0; i < m->place.n_devices; i++)
            if (!host_dev(place_dev(&m->place, i)))
                iflow_device_unput(place_dev(&m->place, i), m->rope_scale_dev[i]);
    }
    free(m->layer_device);
    free(m->dev.layers);
    m->layer_device = NULL;
    m->dev.layers = NULL;
    memset(m->rope_scale_dev, 0, sizeof m->rope_scale_dev);
}

/* Every device must hold what the placement puts on it; the message names the first that
 * cannot and by how much. */
static int check_fit(const iflow_model *m, const iflow_placement *p, const iflow_device_bytes *need, int n_ctx)
{
    for (int i = 0; i < p->n_devices; i++) {
        iflow_device *d = place_dev(p, i);
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

/* Copy every tensor to its device under p into m->dev (fresh arrays). */
static int copy_weights(iflow_model *m, const iflow_placement *p)
{
    iflow_tensor_req *reqs;
    size_t n;
    int rc = iflow_model_tensors(&m->hp, &reqs, &n);
    if (rc)
        return rc;
    for (size_t i = 0; i < n && rc == 0; i++) {
        int di = tensor_device(m, p, reqs[i].name), is_weight = 0, layer;
        if (di < 0)
            continue;
        const iflow_shard_rec *t = iflow_shard_find(m->shard, reqs[i].name);
        const void *data;
        void *dst = slot(&m->dev, m->hp.n_layers, reqs[i].name, &is_weight, &layer);
        if ((rc = iflow_device_put(place_dev(p, di), &data, t->data, t->nbytes)) == 0)
            fill_slot(dst, is_weight, data, t->dtype);
        else
            iflow_preperr(rc, "cannot place tensor '%s' on %s", reqs[i].name, dev_name(place_dev(p, di)));
    }
    free(reqs);
    if (rc == 0 && m->hp.tie_embeddings) {
        iflow_device *d = place_dev(p, p->output_device);
        size_t nb = iflow_tensor_nbytes(m->host.tok_embd.type, 2, (int64_t[]){m->hp.vocab_size, m->hp.dim});
        const void *data;
        if ((rc = iflow_device_put(d, &data, m->host.tok_embd.data, nb)) == 0)
            m->dev.output = (weight){data, m->host.tok_embd.type};
    }
    for (int i = 0; rc == 0 && i < p->n_devices && m->rope_scale; i++) {
        const void *data;
        if ((rc = iflow_device_put(place_dev(p, i), &data, m->rope_scale, (size_t)m->hp.rope_dim / 2 * sizeof(float))) == 0)
            m->rope_scale_dev[i] = data;
    }
    return rc;
}

int iflow_model_place(iflow_model *m, const iflow_placement *p, int n_ctx)
{
    iflow_device_bytes need[IFLOW_MAX_DEVICES];
    int rc = iflow_placement_bytes(m, p, n_ctx, need);
    if (rc == 0)
        rc = check_fit(m, p, need, n_ctx <= 0 ? m->hp.max_seq : n_ctx);
    if (rc)
        return rc;
    unplace(m);
    int L = m->hp.n_layers;
    m->layer_device = malloc((size_t)L * sizeof *m->layer_device);
    m->dev.layers = calloc((size_t)L, sizeof *m->dev.layers);
    if (!m->layer_device || !m->dev.layers) {
        unplace(m);
        place_on_host(m);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    memcpy(m->layer_device, p->layer_device, (size_t)L * sizeof *m->layer_device);
    m->place = *p;
    m->place.layer_device = m->layer_device;
    m->dev.tok_embd = m->host.tok_embd;
    m->dev.output = (weight){0};
    m->dev.output_norm = NULL;
    if ((rc = copy_weights(m, &m->place)) < 0) {
        unplace(m);
        if (place_on_host(m) < 0)
            return IFLOW_ENOMEM;
        return rc;
    }
    return 0;
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

void iflow_model_close(iflow_model *m)
{
    if (!m)
        return;
    unplace(m);
    iflow_tokenizer_close(m->tok);
    iflow_shard_close(m->shard);
    free(m->host.layers);
    free(m->rope_scale);
    free(m);
}

const iflow_hparams *iflow_model_hparams(const iflow_model *m) { return &m->hp; }
const iflow_tokenizer *iflow_model_tokenizer(const iflow_model *m) { return m->tok; }
const iflow_shard *iflow_model_shard(const iflow_model *m) { return m->shard; }
uint64_t iflow_model_decode_bytes(const iflow_model *m) { return m->decode_bytes; }

const char *iflow_kernel_path(void) { return ifk_isa_name(ifk_isa_current()); }

int iflow_model_is_eos(const iflow_model *m, int32_t id)
{
    for (int i = 0; i < m->hp.n_eos; i++)
        if (m->hp.eos[i] == id)
            return 1;
    return 0;
}

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
    float **k_cache, **v_cache; /* [n_layers] -> [n_ctx][kv_dim] on the layer's device */
    float *stage;               /* [B][dim] host: embedding rows, crossings between devices */
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
    const iflow_placement *p = &m->place;
    *out = NULL;
    if (n_ctx <= 0)
        n_ctx = hp->max_seq;
    iflow_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    c->m = m;
    c->n_ctx = n_ctx;
    c->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
    c->n_dev = p->n_devices;
    size_t kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    int rc = 0;
    c->k_cache = calloc((size_t)hp->n_layers, sizeof *c->k_cache);
    c->v_cache = calloc((size_t)hp->n_layers, sizeof *c->v_cache);
    c->stage = malloc(MAX_BATCH * (size_t)hp->dim * sizeof(float));
    c->last_logits = malloc((size_t)hp->vocab_size * sizeof(float));
    if (!c->k_cache || !c->v_cache || !c->stage || !c->last_logits)
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int i = 0; i < p->n_devices && rc == 0; i++) {
        dev_scratch *s = &c->dev[i];
        s->dev = p->devices[i];
        if (!s->dev) {
            rc = iflow_device_open(&s->dev, "cpu", c->n_threads);
            s->owned = rc == 0;
        }
        if (rc == 0)
            rc = scratch_alloc(s, hp);
    }
    for (int l = 0; l < hp->n_layers && rc == 0; l++) {
        iflow_device *d = c->dev[p->layer_device[l]].dev;
        if ((rc = d->ops->alloc(d, (void **)&c->k_cache[l], (size_t)n_ctx * kvd * sizeof(float))) == 0)
            rc = d->ops->alloc(d, (void **)&c->v_cache[l], (size_t)n_ctx * kvd * sizeof(float));
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
    const iflow_placement *p = &c->m->place;
    for (int l = 0; l < c->m->hp.n_layers; l++) {
        iflow_device *d = c->dev[p->layer_device[l]].dev;
        if (!d)
            continue;
        if (c->k_cache && c->k_cache[l])
            d->ops->free(d, c->k_cache[l]);
        if (c->v_cache && c->v_cache[l])
            d->ops->free(d, c->v_cache[l]);
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

/* Attention sub-block of layer l for T tokens at positions pos0..pos0+T-1; adds into s->x. */
static int attention_block(iflow_ctx *c, dev_scratch *s, int l, int T, int pos0)
{
    const iflow_model *m = c->m;
    const iflow_hparams *hp = &m->hp;
    const layer_weights *w = &m->dev.layers[l];
    iflow_device *d = s->dev;
    const float *rope_scale = m->rope_scale_dev[m->layer_device[l]];
    int D = hp->dim, Q = hp->n_heads * hp->head_dim, KV = hp->n_kv_heads * hp->head_dim;
    float *kc = c->k_cache[l], *vc = c->v_cache[l];
    TRY(d->ops->rmsnorm(d, s->xb, s->x, w->attn_norm, T, D, hp->norm_eps));
    /* Q into scratch; K and V straight into their cache rows. */
    TRY(linear(s, s->q, Q, w->wq, w->bq, s->xb, D, T, Q, D));
    TRY(linear(s, kc + (size_t)pos0 * KV, KV, w->wk, w->bk, s->xb, D, T, KV, D));
    TRY(linear(s, vc + (size_t)pos0 * KV, KV, w->wv, w->bv, s->xb, D, T, KV, D));
    TRY(d->ops->rope(d, s->q, (size_t)Q, T, hp->n_heads, hp->head_dim, hp->rope_dim, pos0, hp->rope_theta, rope_scale,
                     hp->rope_layout));
    TRY(d->ops->rope(d, kc + (size_t)pos0 * KV, (size_t)KV, T, hp->n_kv_heads, hp->head_dim, hp->rope_dim, pos0,
                     hp->rope_theta, rope_scale, hp->rope_layout));
    TRY(d->ops->attention(d, s->att, s->q, kc, vc, (size_t)KV, T, pos0, hp->n_heads, hp->n_kv_heads, hp->head_dim,
                          1.0f / sqrtf((float)hp->head_dim)));
    /* o-projection into xb (free now), then the residual add */
    TRY(linear(s, s->xb, D, w->wo, w->bo, s->att, Q, T, D, Q));
    return d->ops->add(d, s->x, s->xb, (size_t)T * D);
}

/* Gated FFN sub-block of layer l for T tokens; adds into s->x. */
static int ffn_block(iflow_ctx *c, dev_scratch *s, int l, int T)
{
    const iflow_hparams *hp = &c->m->hp;
    const layer_weights *w = &c->m->dev.layers[l];
    iflow_device *d = s->dev;
    int D = hp->dim, F = hp->ffn_dim;
    TRY(d->ops->rmsnorm(d, s->xb, s->x, w->ffn_norm, T, D, hp->norm_eps));
    TRY(linear(s, s->gate, F, w->gate, w->gate_b, s->xb, D, T, F, D));
    TRY(linear(s, s->up, F, w->up, w->up_b, s->xb, D, T, F, D));
    TRY(d->ops->silu_mul(d, s->gate, s->up, (size_t)T * F));
    TRY(linear(s, s->xb, D, w->down, w->down_b, s->gate, F, T, D, F));
    return d->ops->add(d, s->x, s->xb, (size_t)T * D);
}

/* Move the hidden state of T tokens from device `from` to device `to` (indices). */
static int cross(iflow_ctx *c, int from, int to, int T)
{
    dev_scratch *a = &c->dev[from], *b = &c->dev[to];
    return iflow_device_transfer(b->dev, b->x, a->dev, a->x, (size_t)T * c->m->hp.dim * sizeof(float), c->stage);
}

/* Embedding rows of T tokens, looked up on the host, into device `to`'s residual stream. */
static int embed(iflow_ctx *c, const int32_t *ids, int T, int to)
{
    const iflow_model *m = c->m;
    int D = m->hp.dim;
    dev_scratch *s = &c->dev[to];
    float *rows = s->dev->host_memory ? s->x : c->stage;
    for (int t = 0; t < T; t++)
        ifk_get_row(rows + (size_t)t * D, m->host.tok_embd.data, m->host.tok_embd.type, (size_t)ids[t], D);
    return rows == s->x ? 0 : s->dev->ops->upload(s->dev, s->x, rows, (size_t)T * D * sizeof(float));
}

/* The layers of one batch of T <= MAX_BATCH tokens; the hidden state ends on the output device.
 * Returns the output device's scratch. */
static int forward_layers(iflow_ctx *c, const int32_t *ids, int T, dev_scratch **out)
{
    const iflow_model *m = c->m;
    const int *ld = m->layer_device;
    int pos0 = c->n_past, cur = ld[0];
    TRY(embed(c, ids, T, cur));
    for (int l = 0; l < m->hp.n_layers; l++) {
        if (ld[l] != cur) {
            TRY(cross(c, cur, ld[l], T));
            cur = ld[l];
        }
        TRY(attention_block(c, &c->dev[cur], l, T, pos0));
        TRY(ffn_block(c, &c->dev[cur], l, T));
    }
    if (m->place.output_device != cur)
        TRY(cross(c, cur, m->place.output_device, T));
    *out = &c->dev[m->place.output_device];
    return 0;
}

/* Logits of `rows` hidden states of s->x starting at row r0, into dst ([rows][vocab]) on the
 * host; on a device that is not the host they are computed into device memory and copied. */
static int output_logits(iflow_ctx *c, dev_scratch *s, int r0, int rows, float *dst)
{
    const iflow_model *m = c->m;
    const iflow_hparams *hp = &m->hp;
    iflow_device *d = s->dev;
    int D = hp->dim, V = hp->vocab_size;
    TRY(d->ops->rmsnorm(d, s->xb, s->x + (size_t)r0 * D, m->dev.output_norm, rows, D, hp->norm_eps));
    float *y = dst;
    if (!d->host_memory) {
        TRY(logits_rows(s, V, rows));
        y = s->logits;
    }
    TRY(linear(s, y, V, m->dev.output, NULL, s->xb, D, rows, V, D));
    return y == dst ? 0 : d->ops->download(d, dst, y, (size_t)rows * V * sizeof(float));
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
    const iflow_hparams *hp = &c->m->hp;
    TRY(check_eval(c, ids, n));
    int done = 0;
    while (n - done > MAX_BATCH) {
        TRY(forward_batch(c, ids + done, MAX_BATCH, NULL, 0));
        done += MAX_BATCH;
    }
    dev_scratch *s;
    int T = n - done, D = hp->dim, V = hp->vocab_size;
    TRY(forward_layers(c, ids + done, T, &s));
    c->n_past += T;
    iflow_device *d = s->dev;
    float *y = c->last_logits;
    if (!d->host_memory) {
        TRY(logits_rows(s, V, 1));
        y = s->logits;
    }
    TRY(d->ops->rmsnorm(d, s->xb, s->x + (size_t)(T - 1) * D, c->m->dev.output_norm, 1, D, hp->norm_eps));
    TRY(linear(s, y, V, c->m->dev.output, NULL, s->xb, D, 1, V, D));
    return d->ops->argmax(d, next, y, V);
}
