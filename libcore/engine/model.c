/* model.c -- a decoder-only transformer from blocks: hyperparameters, the tensor list, binding a shard.
 * Placement is place.c, the forward pass forward.c. See model.h. */
#include "model_impl.h"
#include "plan.h"
#include "split.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/quant.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <sys/stat.h>


/* ===================================================================== hyperparameters ==== */

typedef struct { const char *key; int *dst; int min; } int_field;

static int get_int(const json_t *hp, const char *key, int *dst, int min, const char *what)
{
    const json_t *v = json_object_get(hp, key);
    if (!json_is_integer(v) && !(json_is_real(v) && json_real_value(v) == floor(json_real_value(v))))
        return iflow_seterr(IFLOW_EFORMAT, "hyperparameter '%s' is missing or not an integer in '%s'", key, what);
    double r = json_is_real(v) ? json_real_value(v) : 0; /* range-checked before any cast */
    if (json_is_real(v) && (r < min || r > (1 << 30)))
        return iflow_seterr(IFLOW_ERANGE, "hyperparameter '%s' = %g is out of range in '%s'", key, r, what);
    json_int_t x = json_is_integer(v) ? json_integer_value(v) : (json_int_t)r;
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

/* A count (>= 0) that shards written before it existed lack: `fallback` then. */
static int get_int_or(const json_t *hp, const char *key, int fallback, int *dst, const char *what)
{
    if (!json_object_get(hp, key)) {
        *dst = fallback;
        return 0;
    }
    return get_int(hp, key, dst, 0, what);
}

/* A number (>= 0) that shards written before it existed lack: `fallback` then. */
static int get_float_or(const json_t *hp, const char *key, float fallback, float *dst, const char *what)
{
    if (!json_object_get(hp, key)) {
        *dst = fallback;
        return 0;
    }
    int rc = get_float(hp, key, dst, what);
    if (rc == 0 && !(*dst >= 0))
        rc = iflow_seterr(IFLOW_ERANGE, "hyperparameter '%s' = %g must not be negative in '%s'", key, *dst, what);
    return rc;
}

/* A layer_types entry: 1 windowed ("sliding_attention", or true: llama.cpp's
 * sliding_window_pattern), 0 global ("full_attention", false), -1 neither. */
static int layer_windowed(const json_t *v)
{
    const char *t = json_string_value(v);
    if (json_is_boolean(v))
        return json_is_true(v);
    return !t ? -1 : strcmp(t, "sliding_attention") == 0 ? 1 : strcmp(t, "full_attention") == 0 ? 0 : -1;
}

/* layer_types (transformers' list of "sliding_attention" / "full_attention" per layer, a GGUF's
 * list of booleans, or the string none): a repeating pattern, every Nth layer global, becomes
 * window_pattern = N (0: every layer windowed; no windowed layer: no window). Other patterns
 * are not implemented. */
static int read_layer_types(iflow_hparams *hp, const json_t *h, const char *what)
{
    const json_t *lt = json_object_get(h, "layer_types");
    if (!json_is_array(lt))
        return 0;
    size_t n = json_array_size(lt);
    long first_global = -1;
    for (size_t l = 0; l < n && first_global < 0; l++)
        if (layer_windowed(json_array_get(lt, l)) == 0)
            first_global = (long)l;
    int pattern = first_global < 0 ? 0 : (int)first_global + 1;
    for (size_t l = 0; l < n; l++) {
        const int windowed = layer_windowed(json_array_get(lt, l)),
                  global = pattern > 0 && (l + 1) % (size_t)pattern == 0;
        if (windowed != !global)
            return iflow_seterr(IFLOW_EUNSUPPORTED,
                                "layer_types in '%s': layer %zu is %s, which is not every %d-th layer global (the "
                                "pattern iflow implements)",
                                what, l,
                                windowed < 0 ? "neither windowed nor global" : windowed ? "windowed" : "global",
                                pattern);
    }
    if (pattern == 1) /* every layer global */
        hp->sliding_window = 0;
    hp->window_pattern = pattern;
    return 0;
}

/* A boolean that shards written before it existed lack: `fallback` then. */
static int get_bool_or(const json_t *hp, const char *key, int fallback, int *dst, const char *what)
{
    if (!json_object_get(hp, key)) {
        *dst = fallback;
        return 0;
    }
    return get_bool(hp, key, dst, what);
}

/* Layers without rotary positions (NoPE): nope_pattern N (every Nth layer), rope_layers (a
 * per-layer list, 1 or true for a rotated layer: SmolLM3's no_rope_layers), which must repeat
 * every Nth layer unrotated, or nope_global (the global layers of window_pattern: Cohere 2). */
static int read_nope(iflow_hparams *hp, const json_t *h, const char *what)
{
    int rc, global;
    const json_t *list = json_object_get(h, "rope_layers");
    if ((rc = get_int_or(h, "nope_pattern", 0, &hp->nope_pattern, what)) ||
        (rc = get_bool_or(h, "nope_global", 0, &global, what)))
        return rc;
    if (global)
        hp->nope_pattern = hp->window_pattern > 1 ? hp->window_pattern : 0;
    if (!json_is_array(list))
        return 0;
    const size_t n = json_array_size(list);
    int pattern = 0;
    for (size_t l = 0; l < n; l++) {
        const json_t *v = json_array_get(list, l);
        const int rotated = json_is_boolean(v) ? json_is_true(v) : json_is_integer(v) ? json_integer_value(v) != 0 : -1;
        if (rotated < 0)
            return iflow_seterr(IFLOW_EFORMAT, "rope_layers in '%s': entry %zu is not 0, 1, true or false", what, l);
        if (!rotated && !pattern)
            pattern = (int)l + 1;
        if (rotated != !(pattern > 0 && (l + 1) % (size_t)pattern == 0))
            return iflow_seterr(IFLOW_EUNSUPPORTED, "rope_layers in '%s': layer %zu is %s, which is not every %d-th "
                                "layer without rotary positions (the pattern iflow implements)", what, l,
                                rotated ? "rotated" : "not rotated", pattern);
    }
    hp->nope_pattern = pattern;
    return 0;
}

/* A token id or -1 (none), -1 when absent. */
static int get_token_or(const json_t *hp, const char *key, int *dst, const char *what)
{
    *dst = -1;
    return json_object_get(hp, key) ? get_int(hp, key, dst, -1, what) : 0;
}

/* shared_expert: a boolean, or the shared expert's width (GraniteMoeShared's
 * shared_intermediate_size; 0: none); absent: none. */
static int get_shared_expert(const json_t *h, int *dst, const char *what)
{
    const json_t *v = json_object_get(h, "shared_expert");
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *dst = json_integer_value(v) > 0;
        return 0;
    }
    return get_bool_or(h, "shared_expert", 0, dst, what);
}

/* A mixture of experts' hyperparameters (n_experts > 0), none when absent. Every layer is a
 * mixture: a spec's moe_step (Qwen's decoder_sparse_step) other than 1 and dense_layers (its
 * mlp_only_layers) that name a layer are refused. */
static int read_moe(iflow_hparams *hp, const json_t *h, const char *what)
{
    int rc, step, shared_count, gating;
    const json_t *dense = json_object_get(h, "dense_layers");
    if ((rc = get_int_or(h, "n_experts", 0, &hp->n_experts, what)) || !hp->n_experts)
        return rc;
    if ((rc = get_int(h, "n_experts_used", &hp->n_experts_used, 1, what)) ||
        (rc = get_int(h, "expert_ffn_dim", &hp->expert_ffn_dim, 1, what)) ||
        (rc = get_bool(h, "expert_norm", &hp->expert_norm, what)) ||
        (rc = get_shared_expert(h, &hp->shared_expert, what)) ||
        (rc = get_bool_or(h, "shared_expert_gate", 0, &hp->shared_expert_gate, what)) ||
        (rc = get_int_or(h, "moe_step", 1, &step, what)) ||
        (rc = get_int_or(h, "shared_ffn_dim", 0, &hp->shared_ffn_dim, what)) ||
        (rc = get_int_or(h, "shared_expert_count", 0, &shared_count, what)) ||
        (rc = get_int_or(h, "moe_dense_first", 0, &hp->moe_dense_first, what)) ||
        (rc = get_bool_or(h, "router_sigmoid", 0, &hp->router_sigmoid, what)) ||
        (rc = get_bool_or(h, "router_bias", 0, &hp->router_bias, what)) ||
        (rc = get_int_or(h, "router_groups", 1, &hp->router_groups, what)) ||
        (rc = get_int_or(h, "router_topk_groups", 1, &hp->router_topk_groups, what)) ||
        (rc = get_int_or(h, "router_group_top", 0, &hp->router_group_top, what)) ||
        (rc = get_int_or(h, "router_gating_func", 0, &gating, what)) ||
        (rc = get_float_or(h, "expert_scale", 1, &hp->expert_scale, what)) ||
        (rc = get_bool_or(h, "expert_bias", 0, &hp->expert_bias, what)) ||
        (rc = get_bool_or(h, "router_logit_bias", 0, &hp->router_logit_bias, what)))
        return rc;
    if (gating == 2) /* llama.cpp's expert_gating_func: sigmoid scores (DeepSeek-V3's, with the correction bias) */
        hp->router_sigmoid = hp->router_bias = 1;
    if (!hp->router_group_top) /* a group's score: DeepSeek-V3's (sigmoid) top-2 sum, V2's (softmax) best */
        hp->router_group_top = hp->router_sigmoid ? 2 : 1;
    if (!hp->shared_ffn_dim) /* n_shared_experts experts' width in one (DeepSeek's), else the dense FFN's */
        hp->shared_ffn_dim = shared_count > 0 ? shared_count * hp->expert_ffn_dim : hp->ffn_dim;
    if (hp->router_groups > 1 && (hp->router_group_top < 1 || hp->router_group_top > hp->n_experts / hp->router_groups))
        return iflow_seterr(IFLOW_ERANGE, "router_group_top %d is not 1 .. %d (a group's experts) in '%s'",
                            hp->router_group_top, hp->n_experts / hp->router_groups, what);
    if (hp->router_groups < 1 || hp->n_experts % hp->router_groups || hp->router_topk_groups < 1 ||
        hp->router_topk_groups > hp->router_groups ||
        hp->n_experts_used > hp->router_topk_groups * (hp->n_experts / hp->router_groups))
        return iflow_seterr(IFLOW_ERANGE, "router_groups %d with router_topk_groups %d do not hold %d of %d experts in "
                            "'%s'", hp->router_groups, hp->router_topk_groups, hp->n_experts_used, hp->n_experts, what);
    if (hp->n_experts < 0 || hp->n_experts > IFLOW_MAX_EXPERTS || hp->n_experts_used > hp->n_experts)
        return iflow_seterr(IFLOW_ERANGE, "n_experts %d with n_experts_used %d is not 1 <= used <= experts <= %d "
                            "in '%s'", hp->n_experts, hp->n_experts_used, IFLOW_MAX_EXPERTS, what);
    if (step != 1 || (dense && !(json_is_array(dense) && json_array_size(dense) == 0) &&
                      !(json_is_string(dense) && strcmp(json_string_value(dense), "none") == 0)))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "dense layers among mixture-of-experts ones (moe_step %d, "
                            "dense_layers) are not implemented (in '%s')", step, what);
    if (hp->shared_expert_gate && !hp->shared_expert)
        return iflow_seterr(IFLOW_EFORMAT, "shared_expert_gate without shared_expert in '%s'", what);
    if (hp->ffn != IFLOW_FFN_GATED || hp->layout != IFLOW_LAYOUT_DECODER || hp->mlp_bias)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a mixture of experts is implemented for a decoder's gated FFN without "
                            "biases only (in '%s')", what);
    return 0;
}

/* extra_layers (multi-token-prediction layers past n_layers: the converter carries them, the
 * engine never runs them); layers_count_extra (a GGUF of glm4moe: its block_count counts them
 * too, so n_layers is that less extra_layers). */
static int read_extra_layers(iflow_hparams *hp, const json_t *h, const char *what)
{
    int rc, extra, counted;
    if ((rc = get_int_or(h, "extra_layers", 0, &extra, what)) ||
        (rc = get_bool_or(h, "layers_count_extra", 0, &counted, what)))
        return rc;
    if (counted && extra >= hp->n_layers)
        return iflow_seterr(IFLOW_ESHAPE, "n_layers %d counts %d extra layers, leaving none, in '%s'", hp->n_layers,
                            extra, what);
    if (counted)
        hp->n_layers -= extra;
    return 0;
}

/* Multi-head latent attention (model.h): kv_lora_rank, q_lora_rank, qk_nope_dim (or qk_head_dim,
 * nope + rope), v_head_dim and rope_dim (the rotated part of each head) make the cache's one head
 * of R + rope_dim; the scores' scale is the expanded heads', (nope + rope)^-1/2, unless
 * attn_scale_dim says otherwise. */
static int read_mla(iflow_hparams *hp, const json_t *h, const char *what)
{
    int rc, qk_head;
    if ((rc = get_int_or(h, "kv_lora_rank", 0, &hp->kv_lora_rank, what)) ||
        (rc = get_int_or(h, "q_lora_rank", 0, &hp->q_lora_rank, what)) ||
        (rc = get_int_or(h, "qk_nope_dim", 0, &hp->qk_nope_dim, what)) ||
        (rc = get_int_or(h, "qk_head_dim", 0, &qk_head, what)) ||
        (rc = get_int_or(h, "v_head_dim", 0, &hp->v_head_dim, what)))
        return rc;
    if (!hp->kv_lora_rank)
        return 0;
    if (!hp->qk_nope_dim && qk_head > hp->rope_dim) /* GGUF: key_length_mla, nope + rope */
        hp->qk_nope_dim = qk_head - hp->rope_dim;
    if (hp->qk_nope_dim < 1 || hp->v_head_dim < 1 || hp->rope_dim < 2 || hp->rope_dim % 2 ||
        hp->kv_lora_rank > (1 << 16) || hp->qk_nope_dim > (1 << 16) || hp->v_head_dim > (1 << 16) ||
        hp->rope_dim > (1 << 16) || hp->q_lora_rank > (1 << 20))
        return iflow_seterr(IFLOW_ERANGE, "latent attention (kv_lora_rank %d) needs qk_nope_dim %d, v_head_dim %d and "
                            "an even rope_dim %d of 2 .. 65536 in '%s'", hp->kv_lora_rank, hp->qk_nope_dim,
                            hp->v_head_dim, hp->rope_dim, what);
    if (hp->layout != IFLOW_LAYOUT_DECODER || hp->position != IFLOW_POS_ROPE || hp->qkv_bias || hp->attn_bias ||
        hp->qk_norm || hp->parallel_residual || hp->post_ln || hp->sliding_window)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "latent attention (kv_lora_rank) is implemented for a rope decoder "
                            "without attention biases, q/k norms, windows, or a parallel or post-norm residual (in "
                            "'%s')", what);
    if (hp->v_head_dim > hp->kv_lora_rank + hp->rope_dim) /* the heads' values reuse the queries' scratch */
        return iflow_seterr(IFLOW_EUNSUPPORTED, "latent attention with v_head_dim %d above kv_lora_rank + rope_dim %d "
                            "is not implemented (in '%s')", hp->v_head_dim, hp->kv_lora_rank + hp->rope_dim, what);
    hp->head_dim = hp->kv_lora_rank + hp->rope_dim;
    hp->n_kv_heads = 1;
    if (hp->attn_scale <= 0) /* attn_scale_dim: the expanded heads' */
        hp->attn_scale = (float)(hp->qk_nope_dim + hp->rope_dim);
    return 0;
}

/* Scales some families put on the residual stream and the logits (Granite's multipliers,
 * Cohere's logit_scale) and OLMo 2's norms after the sub-blocks instead of before; read after
 * the rest (attn_scale and embed_scale are known). */
static int read_scales(iflow_hparams *hp, const json_t *h, const char *what)
{
    float embed_mult, attn_mult, logit_div;
    int rc, pre_norms;
    if ((rc = get_bool_or(h, "pre_norms", 1, &pre_norms, what)) ||
        (rc = get_float_or(h, "residual_scale", 1, &hp->residual_scale, what)) ||
        (rc = get_float_or(h, "logit_scale", 1, &hp->logit_scale, what)) ||
        (rc = get_float_or(h, "logit_divisor", 1, &logit_div, what)) ||
        (rc = get_float_or(h, "embed_multiplier", 1, &embed_mult, what)) ||
        (rc = get_float_or(h, "attn_multiplier", 0, &attn_mult, what)))
        return rc;
    const struct { const char *key; float v; } positive[] = {
        {"residual_scale", hp->residual_scale}, {"logit_scale", hp->logit_scale}, {"logit_divisor", logit_div},
        {"embed_multiplier", embed_mult}};
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
        if (!(positive[i].v > 0 && isfinite(positive[i].v)))
            return iflow_seterr(IFLOW_ERANGE, "hyperparameter '%s' = %g is not a positive number in '%s'",
                                positive[i].key, positive[i].v, what);
    hp->logit_scale /= logit_div;
    hp->embed_scale *= embed_mult;
    if (attn_mult > 0)
        hp->attn_scale = attn_mult;
    hp->post_norms_only = !pre_norms;
    if (!pre_norms && (!hp->post_norms || hp->parallel_residual || hp->post_ln || hp->layout != IFLOW_LAYOUT_DECODER))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "pre_norms = false is implemented for a decoder with post_norms and "
                            "neither parallel_residual nor post_ln (in '%s')", what);
    return 0;
}

/* An encoder-decoder's hyperparameters (block layout = encoder-decoder); defaults elsewhere. */
static int read_encdec(iflow_hparams *hp, const json_t *h, const char *what)
{
    int rc, enc_heads;
    if ((rc = get_bool_or(h, "final_norm", 1, &hp->final_norm, what)) ||
        (rc = get_bool_or(h, "output_rescale", 0, &hp->output_rescale, what)) ||
        (rc = get_bool_or(h, "logits_bias", 0, &hp->logits_bias, what)) ||
        (rc = get_int_or(h, "pos_offset", 0, &hp->pos_offset, what)) ||
        (rc = get_bool_or(h, "pos_endpoint", 0, &hp->pos_endpoint, what)) ||
        (rc = get_int_or(h, "rel_buckets", 32, &hp->rel_buckets, what)) ||
        (rc = get_int_or(h, "rel_max_distance", 128, &hp->rel_max_distance, what)) ||
        (rc = get_token_or(h, "decoder_start", &hp->decoder_start, what)) || (rc = get_token_or(h, "pad", &hp->pad, what)))
        return rc;
    if (hp->layout != IFLOW_LAYOUT_ENCODER_DECODER)
        return 0;
    if ((rc = get_int(h, "n_enc_layers", &hp->n_enc_layers, 1, what)) ||
        (rc = get_int_or(h, "n_enc_heads", hp->n_heads, &enc_heads, what)))
        return rc;
    if (enc_heads != hp->n_heads)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "an encoder of %d heads and a decoder of %d is not implemented (in '%s')",
                            enc_heads, hp->n_heads, what);
    if (hp->decoder_start < 0)
        return iflow_seterr(IFLOW_EFORMAT, "hyperparameter 'decoder_start' is missing in '%s' (an encoder-decoder needs it)",
                            what);
    if (hp->position == IFLOW_POS_RELATIVE && (hp->rel_buckets < 4 || hp->rel_max_distance < hp->rel_buckets / 2))
        return iflow_seterr(IFLOW_ERANGE, "rel_buckets %d and rel_max_distance %d do not make buckets in '%s'",
                            hp->rel_buckets, hp->rel_max_distance, what);
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
    static const char *const layout[] = {"decoder", "encoder", "encoder-decoder", NULL},
                             *const norm[] = {"rms", "layer", NULL},
                             *const act[] = {"silu", "gelu_tanh", "gelu", "relu", "relu2", "swiglu_oai", NULL},
                             *const ffn[] = {"gated", "plain", NULL},
                             *const pos[] = {"rope", "learned", "sinusoidal", "relative", NULL},
                             *const rope[] = {"half", "interleaved", NULL},
                             *const emb[] = {"plain", "scaled", NULL};
    static const char *const known[] = {"layout", "norm", "activation", "ffn", "position", "rope_layout", "embedding", NULL};
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
    if ((rc = check_block(blocks, "layout", layout, &hp->layout, what)) ||
        (rc = check_block(blocks, "norm", norm, &hp->norm, what)) ||
        (rc = check_block(blocks, "activation", act, &hp->activation, what)) ||
        (rc = check_block(blocks, "ffn", ffn, &hp->ffn, what)) ||
        (rc = check_block(blocks, "position", pos, &hp->position, what)))
        return rc;
    if (hp->activation == IFLOW_ACT_SWIGLU_OAI && hp->ffn != IFLOW_FFN_GATED)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "block activation = swiglu_oai is a gated FFN's (in '%s')", what);
    if (hp->activation == IFLOW_ACT_RELU2 && hp->ffn != IFLOW_FFN_PLAIN)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "block activation = relu2 is implemented for ffn = plain only (in '%s')",
                            what);
    /* rope_layout only matters with rope */
    hp->rope_layout = 0;
    if (hp->position == IFLOW_POS_ROPE && (rc = check_block(blocks, "rope_layout", rope, &hp->rope_layout, what)))
        return rc;
    /* optional, for shards written before it existed: plain */
    int scaled = 0;
    if (json_object_get(blocks, "embedding") && (rc = check_block(blocks, "embedding", emb, &scaled, what)))
        return rc;
    hp->embed_scale = scaled ? -1.0f : 1.0f; /* -1: sqrt(dim), once dim is known */
    /* sinusoidal and relative positions come with the encoder-decoder, and it with them */
    const int encdec = hp->layout == IFLOW_LAYOUT_ENCODER_DECODER,
              s2s_pos = hp->position == IFLOW_POS_SINUSOIDAL || hp->position == IFLOW_POS_RELATIVE;
    if (encdec != s2s_pos)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "block position = %s with layout = %s is not implemented (in '%s')",
                            pos[hp->position], layout[hp->layout], what);
    return 0;
}

/* A longrope factor list, KEY: up to IFLOW_MAX_ROPE_PAIRS positive numbers into out; its length. */
static int read_factors(const json_t *h, const char *key, float *out, const char *what)
{
    const json_t *a = json_object_get(h, key);
    const size_t n = json_array_size(a);
    if (!json_is_array(a) || n < 1 || n > IFLOW_MAX_ROPE_PAIRS)
        return iflow_seterr(IFLOW_EFORMAT, "longrope needs '%s', a list of 1 to %d factors, in '%s'", key,
                            IFLOW_MAX_ROPE_PAIRS, what);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        out[i] = (float)json_number_value(v);
        if (!json_is_number(v) || !(out[i] > 0) || !isfinite(out[i]))
            return iflow_seterr(IFLOW_ERANGE, "'%s'[%zu] is not a positive number in '%s'", key, i, what);
    }
    return (int)n;
}

/* longrope (Phi-3's "su"): rope_short_factor and rope_long_factor, lists of equal length (checked
 * against rope_dim / 2 once that is known); factor 1 (none given) is max_seq / rope_orig_ctx, as
 * transformers takes it. */
static int read_longrope(iflow_hparams *hp, const json_t *h, const char *what)
{
    if (hp->max_seq > hp->rope_orig_ctx && hp->rope_factor == 1.0f)
        hp->rope_factor = (float)hp->max_seq / (float)hp->rope_orig_ctx;
    if (hp->rope_factor_tensors) /* rope_dim / 2 of each, read at open */
        return 0;
    int ns = read_factors(h, "rope_short_factor", hp->rope_short, what), nl;
    if (ns < 0 || (nl = read_factors(h, "rope_long_factor", hp->rope_long, what)) < 0)
        return ns < 0 ? ns : nl;
    if (ns != nl)
        return iflow_seterr(IFLOW_ESHAPE, "longrope's short and long factor lists differ in length (%d, %d) in '%s'",
                            ns, nl, what);
    hp->rope_n_factors = ns;
    return 0;
}

static int read_rope_scaling(iflow_hparams *hp, const json_t *h, const char *what)
{
    static const char *const kinds[] = {"none", "linear", "llama3", "yarn", "longrope", "default", "su", NULL};
    const char *v = json_string_value(json_object_get(h, "rope_scaling"));
    int rc;
    if (!v)
        return iflow_seterr(IFLOW_EFORMAT, "hyperparameter 'rope_scaling' is missing in '%s'", what);
    hp->rope_scaling = -1;
    for (int i = 0; kinds[i]; i++)
        if (strcmp(v, kinds[i]) == 0)
            hp->rope_scaling = i == 5 ? IFLOW_ROPE_SCALING_NONE : i == 6 ? IFLOW_ROPE_SCALING_LONGROPE : i;
    if (hp->rope_scaling < 0)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "block rope_scaling = %s is not implemented (in '%s')", v, what);
    if ((rc = get_float(h, "rope_factor", &hp->rope_factor, what)) || (rc = get_float(h, "rope_low_freq", &hp->rope_low_freq, what)) ||
        (rc = get_float(h, "rope_high_freq", &hp->rope_high_freq, what)) ||
        (rc = get_int(h, "rope_orig_ctx", &hp->rope_orig_ctx, 1, what)) ||
        (rc = get_float_or(h, "rope_beta_fast", 32, &hp->rope_beta_fast, what)) ||
        (rc = get_float_or(h, "rope_beta_slow", 1, &hp->rope_beta_slow, what)) ||
        (rc = get_bool_or(h, "rope_truncate", 1, &hp->rope_truncate, what)))
        return rc;
    if (hp->rope_scaling != IFLOW_ROPE_SCALING_NONE && !(hp->rope_factor > 0))
        return iflow_seterr(IFLOW_ERANGE, "rope_factor must be positive in '%s'", what);
    if (hp->rope_scaling == IFLOW_ROPE_SCALING_YARN && !(hp->rope_beta_fast > 0 && hp->rope_beta_slow > 0))
        return iflow_seterr(IFLOW_ERANGE, "yarn's rope_beta_fast and rope_beta_slow must be positive in '%s'", what);
    if ((rc = get_bool_or(h, "rope_factor_tensors", 0, &hp->rope_factor_tensors, what)))
        return rc;
    if (hp->rope_factor_tensors) /* a GGUF's longrope: the factors are tensors, its type key absent */
        hp->rope_scaling = IFLOW_ROPE_SCALING_LONGROPE;
    if (hp->rope_scaling == IFLOW_ROPE_SCALING_LINEAR && hp->rope_factor == 1.0f) /* GGUF's default */
        hp->rope_scaling = IFLOW_ROPE_SCALING_NONE;
    return hp->rope_scaling == IFLOW_ROPE_SCALING_LONGROPE ? read_longrope(hp, h, what) : 0;
}

/* YaRN's mscale: 0.1 * m * ln(factor) + 1 (1 for a factor up to 1). */
static double yarn_mscale(double factor, double m)
{
    return factor <= 1 ? 1.0 : 0.1 * m * log(factor) + 1.0;
}

/* The rope scalings' attention factors, after attn_multiplier:
 *   the cos/sin factor a (rope_attn_factor; else yarn's mscale(factor, rope_mscale) /
 *   mscale(factor, rope_mscale_all_dim) when both are given, else mscale(factor, 1); longrope's
 *   sqrt(1 + ln factor / ln rope_orig_ctx)) scales both q and k's rotated pairs: the scores by
 *   a^2 (attn_scale) when the whole head rotates, else rope_rot_scale;
 *   attn_mscale (DeepSeek's softmax scale): times mscale(factor, rope_mscale_all_dim)^2. GGUF
 *   gives rope_yarn_log_mul, 0.1 * rope_mscale_all_dim. */
static int read_rope_attn(iflow_hparams *hp, const json_t *h, const char *what)
{
    hp->rope_rot_scale = 1;
    float af, ms, ms_all, log_mul;
    int rc, attn_mscale;
    if ((rc = get_float_or(h, "rope_attn_factor", 0, &af, what)) ||
        (rc = get_float_or(h, "rope_mscale", 0, &ms, what)) ||
        (rc = get_float_or(h, "rope_mscale_all_dim", 0, &ms_all, what)) ||
        (rc = get_float_or(h, "rope_yarn_log_mul", 0, &log_mul, what)) ||
        (rc = get_bool_or(h, "attn_mscale", 0, &attn_mscale, what)))
        return rc;
    if (hp->rope_scaling == IFLOW_ROPE_SCALING_NONE)
        return 0;
    const double f = hp->rope_factor, all = log_mul > 0 ? 10.0 * log_mul : ms_all;
    if (attn_mscale)
        hp->attn_scale = (float)(hp->attn_scale * yarn_mscale(f, all) * yarn_mscale(f, all));
    if (hp->rope_factor_tensors)
        hp->rope_n_factors = hp->rope_dim / 2;
    if (hp->rope_scaling == IFLOW_ROPE_SCALING_LONGROPE && hp->rope_n_factors != hp->rope_dim / 2)
        return iflow_seterr(IFLOW_ESHAPE, "longrope has %d factors for %d rotated pairs in '%s'", hp->rope_n_factors,
                            hp->rope_dim / 2, what);
    double a = 1.0;
    if (hp->rope_scaling == IFLOW_ROPE_SCALING_YARN)
        a = af > 0 ? af : ms > 0 && all > 0 ? yarn_mscale(f, ms) / yarn_mscale(f, all) : yarn_mscale(f, 1);
    else if (hp->rope_scaling == IFLOW_ROPE_SCALING_LONGROPE) /* transformers' _compute_longrope_parameters */
        a = af > 0 ? af : f <= 1 ? 1.0 : sqrt(1 + log(f) / log((double)hp->rope_orig_ctx));
    if (hp->rope_dim == hp->head_dim)
        hp->attn_scale = (float)(hp->attn_scale * a * a);
    else
        hp->rope_rot_scale = (float)a;
    return 0;
}

/* pooling (encoders): "cls" (the default) or "mean". */
static int read_pooling(iflow_hparams *hp, const json_t *h, const char *what)
{
    const json_t *v = json_object_get(h, "pooling");
    const char *s = json_string_value(v);
    hp->pooling = IFLOW_POOL_CLS;
    if (!v || (s && strcmp(s, "cls") == 0))
        return 0;
    if (s && strcmp(s, "mean") == 0) {
        hp->pooling = IFLOW_POOL_MEAN;
        return 0;
    }
    return iflow_seterr(IFLOW_EUNSUPPORTED, "pooling = %s is not implemented (cls or mean) in '%s'", s ? s : "?", what);
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

/* banned_tokens: absent, "none" or [] for none; else a list of one-token lists ([[54687]]: the
 * form of transformers' bad_words_ids) of ids in the vocabulary. A longer list bans a sequence,
 * which is not implemented. */
static int read_banned(iflow_hparams *hp, const json_t *h, const char *what)
{
    const json_t *b = json_object_get(h, "banned_tokens"), *seq;
    size_t i;
    hp->n_banned = 0;
    if (!b || (json_is_string(b) && strcmp(json_string_value(b), "none") == 0))
        return 0;
    if (!json_is_array(b))
        return iflow_seterr(IFLOW_EFORMAT, "hyperparameter 'banned_tokens' is not a list of token lists in '%s'", what);
    json_array_foreach(b, i, seq) {
        const json_t *id = json_array_get(seq, 0);
        if (json_array_size(seq) != 1)
            return iflow_seterr(IFLOW_EUNSUPPORTED,
                                "banned_tokens entry %zu of %zu tokens is not implemented in '%s' (only single tokens are "
                                "banned)",
                                i, json_array_size(seq), what);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= hp->vocab_size)
            return iflow_seterr(IFLOW_ERANGE, "banned_tokens entry %zu is not a token of the vocabulary of %d in '%s'", i,
                                hp->vocab_size, what);
        if (hp->n_banned == IFLOW_MAX_BANNED)
            return iflow_seterr(IFLOW_EUNSUPPORTED, "more than %d banned_tokens in '%s'", IFLOW_MAX_BANNED, what);
        hp->banned[hp->n_banned++] = (int)json_integer_value(id);
    }
    return 0;
}

/* forced_eos: absent or "none" for none, else a token of the vocabulary. */
static int read_forced_eos(iflow_hparams *hp, const json_t *h, const char *what)
{
    const json_t *v = json_object_get(h, "forced_eos");
    hp->forced_eos = -1;
    if (!v || (json_is_string(v) && strcmp(json_string_value(v), "none") == 0))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) >= hp->vocab_size)
        return iflow_seterr(IFLOW_ERANGE, "hyperparameter 'forced_eos' is not none or a token of the vocabulary of %d in "
                            "'%s'", hp->vocab_size, what);
    hp->forced_eos = (int)json_integer_value(v);
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
        {"n_kv_heads", &hp->n_kv_heads, 1}, {"head_dim", &hp->head_dim, 0}, {"ffn_dim", &hp->ffn_dim, 0},
        {"vocab_size", &hp->vocab_size, 1}, {"max_seq", &hp->max_seq, 1}, {"rope_dim", &hp->rope_dim, 0},
    };
    int rc;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if ((rc = get_int(h, ints[i].key, ints[i].dst, ints[i].min, what)))
            return rc;
    if ((rc = get_float(h, "norm_eps", &hp->norm_eps, what)) || (rc = get_float(h, "rope_theta", &hp->rope_theta, what)) ||
        (rc = get_bool(h, "attn_bias", &hp->attn_bias, what)) || (rc = get_bool(h, "mlp_bias", &hp->mlp_bias, what)) ||
        (rc = get_bool_or(h, "qkv_bias", 0, &hp->qkv_bias, what)) ||
        (rc = get_int_or(h, "sliding_window", 0, &hp->sliding_window, what)) ||
        (rc = get_int_or(h, "window_pattern", 0, &hp->window_pattern, what)) ||
        (rc = get_float_or(h, "attn_scale_dim", 0, &hp->attn_scale, what)) ||
        (rc = get_float_or(h, "attn_softcap", 0, &hp->attn_softcap, what)) ||
        (rc = get_float_or(h, "logit_softcap", 0, &hp->logit_softcap, what)) ||
        (rc = get_bool_or(h, "post_norms", 0, &hp->post_norms, what)) ||
        (rc = get_bool_or(h, "qk_norm", 0, &hp->qk_norm, what)) ||
        (rc = get_bool_or(h, "qk_norm_full", 0, &hp->qk_norm_full, what)) ||
        (rc = get_bool_or(h, "qk_norm_after_rope", 0, &hp->qk_norm_late, what)) ||
        (rc = get_float_or(h, "rope_theta_local", 0, &hp->rope_theta_local, what)) ||
        (rc = get_bool_or(h, "parallel_residual", 0, &hp->parallel_residual, what)) ||
        (rc = get_bool_or(h, "post_ln", 0, &hp->post_ln, what)) ||
        (rc = get_bool_or(h, "embed_norm", 0, &hp->embed_norm, what)) ||
        (rc = get_int_or(h, "token_types", 0, &hp->token_types, what)) ||
        (rc = get_bool_or(h, "normalize", 0, &hp->normalize, what)) || (rc = read_pooling(hp, h, what)) ||
        (rc = get_bool_or(h, "rope_freqs", 0, &hp->rope_freqs, what)) ||
        (rc = read_layer_types(hp, h, what)) ||
        (rc = get_bool(h, "tie_embeddings", &hp->tie_embeddings, what)) || (rc = read_blocks(hp, b, what)) ||
        (rc = read_rope_scaling(hp, h, what)) || (rc = read_special(hp, h, what)) || (rc = read_encdec(hp, h, what)) ||
        (rc = read_banned(hp, h, what)) || (rc = read_forced_eos(hp, h, what)) || (rc = read_moe(hp, h, what)))
        return rc;
    if ((rc = read_mla(hp, h, what)) || (rc = read_extra_layers(hp, h, what)) ||
        (rc = get_bool_or(h, "attn_sinks", 0, &hp->attn_sinks, what)) ||
        (rc = get_float_or(h, "swiglu_alpha", 1.702f, &hp->swiglu_alpha, what)) ||
        (rc = get_float_or(h, "swiglu_limit", 7.0f, &hp->swiglu_limit, what)))
        return rc;
    if (!hp->head_dim) {
        if (hp->dim % hp->n_heads)
            return iflow_seterr(IFLOW_ESHAPE, "dim %d is not a multiple of n_heads %d in '%s'", hp->dim, hp->n_heads, what);
        hp->head_dim = hp->dim / hp->n_heads;
    }
    float rope_fraction;
    if ((rc = get_float_or(h, "rope_fraction", 1.0f, &rope_fraction, what)))
        return rc;
    if (!(rope_fraction > 0.0f && rope_fraction <= 1.0f))
        return iflow_seterr(IFLOW_ERANGE, "rope_fraction %g is not in (0, 1] in '%s'", rope_fraction, what);
    if (!hp->rope_dim) /* as transformers: int(head_dim * rotary_pct) */
        hp->rope_dim = (int)((double)hp->head_dim * (double)rope_fraction);
    if (!hp->ffn_dim) /* 0: GPT-2's convention, 4 * dim */
        hp->ffn_dim = 4 * hp->dim;
    hp->qkv_bias |= hp->attn_bias;
    hp->qk_norm_full &= hp->qk_norm;
    hp->qk_norm_late &= hp->qk_norm;
    if (hp->qk_norm_late && hp->qk_norm_full)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "qk_norm_after_rope with qk_norm_full is not implemented (in '%s')",
                            what);
    /* rope_alpha (Hunyuan's NTK "dynamic" rope with a fixed alpha): the base stretched by
     * alpha^(d / (d - 2)), d the rotated dimensions, as transformers computes it */
    float rope_alpha;
    if ((rc = get_float_or(h, "rope_alpha", 1, &rope_alpha, what)))
        return rc;
    if (rope_alpha > 0 && rope_alpha != 1 && hp->rope_dim > 2)
        hp->rope_theta = (float)((double)hp->rope_theta * pow((double)rope_alpha,
                                                              (double)hp->rope_dim / (hp->rope_dim - 2)));
    if ((rc = get_float_or(h, "clip_qkv", 0, &hp->clip_qkv, what)))
        return rc;
    /* attn_scale held query_pre_attn_scalar (0: head_dim); now the factor itself */
    hp->attn_scale = 1.0f / sqrtf(hp->attn_scale > 0 ? hp->attn_scale : (float)hp->head_dim);
    if (hp->embed_scale < 0) /* as transformers: the Python float sqrt, then rounded to F32 */
        hp->embed_scale = (float)sqrt((double)hp->dim);
    int norm_bias, norm_weight;
    if ((rc = read_scales(hp, h, what)) || (rc = read_rope_attn(hp, h, what)) || (rc = read_nope(hp, h, what)) ||
        (rc = get_bool_or(h, "norm_bias", 1, &norm_bias, what)) ||
        (rc = get_bool_or(h, "norm_weight", 1, &norm_weight, what)))
        return rc;
    hp->norm_no_bias = !norm_bias;
    hp->norm_no_weight = !norm_weight;
    if (!norm_weight && (hp->norm != IFLOW_NORM_LAYER || hp->layout != IFLOW_LAYOUT_DECODER || hp->post_norms ||
                         hp->qk_norm))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "norm_weight = false is implemented for a decoder's LayerNorms "
                            "(norm = layer) without post or q/k norms (in '%s')", what);
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

/* A small F32 table [d0][d1] used on the host (kept F32 like a vector: T5's relative bias). */
static void req_table(iflow_tensor_req *r, size_t *n, const char *name, int64_t d0, int64_t d1)
{
    req(r, n, name, d0, d1);
    r[*n - 1].is_vector = 1;
}

/* An attention's tensors: PREFIX{norm, q, k, v, o} and their biases, named by `names`
 * (self-attention: attn_norm wq wk wv wo bq bk bv bo; cross-attention: the x forms). */
static void attn_tensors(const iflow_hparams *hp, iflow_tensor_req *r, size_t *n, const char *prefix,
                         const char *const names[9])
{
    int64_t D = hp->dim, Q = (int64_t)hp->n_heads * hp->head_dim, KV = (int64_t)hp->n_kv_heads * hp->head_dim;
    const int64_t rows[9] = {D, Q, KV, KV, D, Q, KV, KV, D}, cols[9] = {0, D, D, D, Q, 0, 0, 0, 0};
    char name[48], norm_b[48];
    for (int i = 0; i < 9; i++) {
        if ((i >= 5 && i < 8 && !hp->qkv_bias) || (i == 8 && !hp->attn_bias) ||
            (i == 0 && (hp->post_norms_only || hp->norm_no_weight)))
            continue;
        snprintf(name, sizeof name, "%s%s", prefix, names[i]);
        req(r, n, name, rows[i], cols[i]);
        if (i == 0 && iflow_norm_biased(hp)) {
            snprintf(norm_b, sizeof norm_b, "%s%s_b", prefix, names[0]);
            req(r, n, norm_b, D, 0);
        }
    }
}

/* Latent attention's tensors (model.h, model_impl.h): PREFIX{attn_norm, [wq_a, q_a_norm], wq,
 * wkv_a, kv_a_norm, wk_b, wv_b, wo}. */
static void mla_tensors(const iflow_hparams *hp, iflow_tensor_req *r, size_t *n, const char *prefix)
{
    const int64_t D = hp->dim, H = hp->n_heads, R = hp->kv_lora_rank, QR = hp->q_lora_rank;
    const int64_t rows[8] = {D, QR, QR, H * (hp->qk_nope_dim + hp->rope_dim), R + hp->rope_dim, R, H * R,
                             H * hp->v_head_dim},
                  cols[8] = {0, D, 0, QR ? QR : D, D, 0, hp->qk_nope_dim, R};
    static const char *const names[8] = {"attn_norm", "wq_a", "q_a_norm", "wq", "wkv_a", "kv_a_norm", "wk_b", "wv_b"};
    char name[48];
    for (int i = 0; i < 8; i++) {
        if ((i == 1 || i == 2) && !QR)
            continue;
        snprintf(name, sizeof name, "%s%s", prefix, names[i]);
        req(r, n, name, rows[i], cols[i]);
    }
    snprintf(name, sizeof name, "%swo", prefix);
    req(r, n, name, D, H * hp->v_head_dim);
}

/* The tensors of one layer, PREFIX (blk.L. or enc.blk.L.) then the suffix; `cross`: a decoder
 * layer of an encoder-decoder, with cross-attention. */
static void layer_tensors(const iflow_hparams *hp, iflow_tensor_req *r, size_t *n, const char *prefix, int l,
                          int cross)
{
    static const char *const self[9] = {"attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"},
                             *const xattn[9] = {"xattn_norm", "xq", "xk", "xv", "xo", "xbq", "xbk", "xbv", "xbo"};
    const int moe = l >= 0 && iflow_layer_moe(hp, l);
    int64_t D = hp->dim, F = moe ? hp->shared_ffn_dim : hp->ffn_dim; /* the dense FFN's, or the shared expert's */
    char name[48];
#define L(suffix, d0, d1) (snprintf(name, sizeof name, "%s" suffix, prefix), req(r, n, name, d0, d1))
    if (hp->kv_lora_rank)
        mla_tensors(hp, r, n, prefix);
    else
        attn_tensors(hp, r, n, prefix, self);
    if (hp->qk_norm) { /* each head's, or the whole projection's (qk_norm_full) */
        L("q_norm", hp->qk_norm_full ? (int64_t)hp->n_heads * hp->head_dim : hp->head_dim, 0);
        L("k_norm", hp->qk_norm_full ? (int64_t)hp->n_kv_heads * hp->head_dim : hp->head_dim, 0);
    }
    if (hp->post_norms)
        L("attn_post_norm", D, 0);
    if (hp->attn_sinks)
        L("attn_sinks", hp->n_heads, 0);
    if (cross)
        attn_tensors(hp, r, n, prefix, xattn);
    if (!hp->post_norms_only && !hp->norm_no_weight)
        L("ffn_norm", D, 0);
    if (!hp->post_norms_only && iflow_norm_biased(hp))
        L("ffn_norm_b", D, 0);
    if (!moe || hp->shared_expert) { /* the dense FFN, or a mixture's shared expert */
        if (hp->ffn == IFLOW_FFN_GATED)
            L("ffn_gate", F, D);
        L("ffn_up", F, D);
        L("ffn_down", D, F);
    }
    if (moe) { /* a mixture of experts: the router (kept F32, as the routing's precision) and E gated FFNs */
        const int64_t Fe = hp->expert_ffn_dim;
        snprintf(name, sizeof name, "%sffn_router", prefix);
        req_table(r, n, name, hp->n_experts, D);
        if (hp->router_bias) {
            snprintf(name, sizeof name, "%sffn_router_bias", prefix);
            req(r, n, name, hp->n_experts, 0);
        }
        if (hp->router_logit_bias) {
            snprintf(name, sizeof name, "%sffn_router_b", prefix);
            req(r, n, name, hp->n_experts, 0);
        }
        if (hp->shared_expert_gate) {
            snprintf(name, sizeof name, "%sffn_shexp_gate", prefix);
            req_table(r, n, name, 1, D);
        }
        for (int e = 0; e < hp->n_experts; e++) {
            snprintf(name, sizeof name, "%sffn_gate.%d", prefix, e), req(r, n, name, Fe, D);
            snprintf(name, sizeof name, "%sffn_up.%d", prefix, e), req(r, n, name, Fe, D);
            snprintf(name, sizeof name, "%sffn_down.%d", prefix, e), req(r, n, name, D, Fe);
            if (hp->expert_bias) {
                snprintf(name, sizeof name, "%sffn_gate_b.%d", prefix, e), req(r, n, name, Fe, 0);
                snprintf(name, sizeof name, "%sffn_up_b.%d", prefix, e), req(r, n, name, Fe, 0);
                snprintf(name, sizeof name, "%sffn_down_b.%d", prefix, e), req(r, n, name, D, 0);
            }
        }
    }
    if (hp->post_norms)
        L("ffn_post_norm", D, 0);
    if (hp->mlp_bias) {
        if (hp->ffn == IFLOW_FFN_GATED)
            L("ffn_gate_b", F, 0);
        L("ffn_up_b", F, 0);
        L("ffn_down_b", D, 0);
    }
#undef L
}

/* A stack's final norm, PREFIX output_norm (and _b). */
static void final_norm(const iflow_hparams *hp, iflow_tensor_req *r, size_t *n, const char *prefix)
{
    char name[48];
    snprintf(name, sizeof name, "%soutput_norm", prefix);
    if (!hp->norm_no_weight)
        req(r, n, name, hp->dim, 0);
    snprintf(name, sizeof name, "%soutput_norm_b", prefix);
    if (iflow_norm_biased(hp))
        req(r, n, name, hp->dim, 0);
}

int iflow_model_tensors(const iflow_hparams *hp, iflow_tensor_req **reqs, size_t *n)
{
    const int encdec = hp->layout == IFLOW_LAYOUT_ENCODER_DECODER;
    /* every model-level and per-layer tensor there can be */
    size_t cap = 16 + (size_t)(hp->n_layers + (encdec ? hp->n_enc_layers : 0)) * (40 + 6 * (size_t)hp->n_experts);
    iflow_tensor_req *r = calloc(cap, sizeof *r);
    if (!r)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    int64_t D = hp->dim, V = hp->vocab_size;
    char prefix[32];
    *n = 0;
    req(r, n, "tok_embd", V, D);
    if (hp->position == IFLOW_POS_LEARNED)
        req(r, n, "pos_embd", hp->max_seq, D);
    if (hp->token_types > 0)
        req(r, n, "tok_type_embd", hp->token_types, D);
    if (hp->rope_freqs && hp->position == IFLOW_POS_ROPE)
        req(r, n, "rope_freqs", hp->rope_dim / 2, 0);
    if (hp->rope_factor_tensors && hp->position == IFLOW_POS_ROPE) {
        req(r, n, "rope_short", hp->rope_dim / 2, 0);
        req(r, n, "rope_long", hp->rope_dim / 2, 0);
    }
    if (hp->embed_norm) {
        req(r, n, "embd_norm", D, 0);
        if (iflow_norm_biased(hp))
            req(r, n, "embd_norm_b", D, 0);
    }
    for (int l = 0; encdec && l < hp->n_enc_layers; l++) {
        snprintf(prefix, sizeof prefix, "enc.blk.%d.", l);
        layer_tensors(hp, r, n, prefix, -1, 0);
    }
    if (encdec && hp->position == IFLOW_POS_RELATIVE)
        req_table(r, n, "enc.rel_bias", hp->rel_buckets, hp->n_heads);
    if (encdec && hp->final_norm)
        final_norm(hp, r, n, "enc.");
    for (int l = 0; l < hp->n_layers; l++) {
        snprintf(prefix, sizeof prefix, "blk.%d.", l);
        layer_tensors(hp, r, n, prefix, l, encdec);
    }
    if (encdec && hp->position == IFLOW_POS_RELATIVE)
        req_table(r, n, "rel_bias", hp->rel_buckets, hp->n_heads);
    if (hp->layout != IFLOW_LAYOUT_ENCODER) { /* an encoder's output is its hidden states */
        if (hp->final_norm)
            final_norm(hp, r, n, "");
        if (!hp->tie_embeddings)
            req(r, n, "output", V, D);
        if (hp->logits_bias)
            req_table(r, n, "output_b", 1, V);
    }
    *reqs = r;
    return 0;
}

int iflow_tensor_expert(const char *name)
{
    const char *dot = strrchr(name, '.');
    char *end;
    if (strncmp(name, "blk.", 4) != 0 || !dot || dot[1] < '0' || dot[1] > '9')
        return -1;
    long e = strtol(dot + 1, &end, 10);
    return *end || e >= IFLOW_MAX_EXPERTS ? -1 : (int)e;
}

/* ===================================================================== model ============== */

int iflow_tensor_check(const iflow_tensor_req *r, const iflow_shard_rec *t, const char *path)
{
    if (t->n_dims != r->n_dims || t->shape[0] != r->shape[0] || (r->n_dims == 2 && t->shape[1] != r->shape[1]))
        return iflow_seterr(IFLOW_ESHAPE, "tensor '%s' in '%s' has shape [%lld, %lld], expected [%lld, %lld]", r->name,
                            path, (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0),
                            (long long)r->shape[0], (long long)r->shape[1]);
    int matrix_ok = iflow_dtype_is_float(t->dtype) || ifk_qtype(t->dtype) != NULL;
    if (r->is_vector ? t->dtype != IFLOW_DT_F32 : !matrix_ok)
        return iflow_seterr(IFLOW_ESHAPE, "tensor '%s' in '%s' has type %s, which the engine cannot use there", r->name,
                            path, iflow_dtype_name(t->dtype) ? iflow_dtype_name(t->dtype) : "?");
    return 0;
}

/* Find a tensor of shard sh and check it against what the blocks need. */
static int bind(const iflow_shard *sh, const iflow_tensor_req *r, const iflow_shard_rec **out)
{
    const char *path = iflow_shard_path(sh);
    const iflow_shard_rec *t = iflow_shard_find(sh, r->name);
    if (!t || t->kind != IFLOW_REC_TENSOR)
        return iflow_seterr(IFLOW_ENOTFOUND, "missing tensor '%s' in '%s'", r->name, path);
    int rc = iflow_tensor_check(r, t, path);
    if (rc == 0)
        *out = t;
    return rc;
}

/* The slot of expert tensor SUFFIX (ffn_gate.E, ffn_up.E, ffn_down.E) of layer w, or NULL. */
static void *expert_slot(layer_weights *w, int n_experts, const char *suffix, int *is_weight)
{
    static const char *const mats[6] = {"ffn_gate.", "ffn_up.", "ffn_down.", "ffn_gate_b.", "ffn_up_b.", "ffn_down_b."};
    for (int i = 0; i < 6 && w->experts; i++) {
        size_t len = strlen(mats[i]);
        char *end;
        if (strncmp(suffix, mats[i], len) != 0 || suffix[len] < '0' || suffix[len] > '9')
            continue;
        long e = strtol(suffix + len, &end, 10);
        if (*end || e >= n_experts)
            return NULL;
        *is_weight = i < 3;
        expert_weights *x = &w->experts[e];
        void *const slots[6] = {&x->gate, &x->up, &x->down, &x->gate_b, &x->up_b, &x->down_b};
        return slots[i];
    }
    return NULL;
}

/* The slot of layer tensor "L.SUFFIX" (name after its blk. prefix) in layers[0..n), whose
 * experts (when n_experts > 0) are allocated. */
static void *layer_slot(layer_weights *layers, int n, int n_experts, const char *name, int *is_weight)
{
    int l;
    char suffix[32];
    if (sscanf(name, "%d.%31s", &l, suffix) != 2 || l < 0 || l >= n)
        return NULL;
    layer_weights *w = &layers[l];
    static const struct { const char *s; size_t off; int is_weight; } map[] = {
#define F(n, field, isw) {n, offsetof(layer_weights, field), isw}
        F("attn_norm", attn_norm, 0), F("ffn_norm", ffn_norm, 0), F("wq", wq, 1), F("wk", wk, 1),
        F("wv", wv, 1), F("wo", wo, 1), F("bq", bq, 0), F("bk", bk, 0), F("bv", bv, 0), F("bo", bo, 0),
        F("ffn_gate", gate, 1), F("ffn_up", up, 1), F("ffn_down", down, 1), F("ffn_gate_b", gate_b, 0),
        F("ffn_up_b", up_b, 0), F("ffn_down_b", down_b, 0), F("attn_post_norm", attn_post_norm, 0),
        F("ffn_post_norm", ffn_post_norm, 0), F("q_norm", q_norm, 0), F("k_norm", k_norm, 0),
        F("attn_norm_b", attn_norm_b, 0), F("ffn_norm_b", ffn_norm_b, 0),
        F("xattn_norm", xattn_norm, 0), F("xattn_norm_b", xattn_norm_b, 0), F("xq", xq, 1), F("xk", xk, 1),
        F("xv", xv, 1), F("xo", xo, 1), F("xbq", xbq, 0), F("xbk", xbk, 0), F("xbv", xbv, 0), F("xbo", xbo, 0),
        F("ffn_router", router, 0), F("ffn_shexp_gate", shexp_gate, 0), F("ffn_router_bias", router_bias, 0),
        F("wq_a", wq_a, 1), F("wkv_a", wkv_a, 1), F("q_a_norm", q_a_norm, 0), F("kv_a_norm", kv_a_norm, 0),
        F("wk_b", wk_b, 1), F("wv_b", wv_b, 1), F("ffn_router_b", router_b, 0), F("attn_sinks", sinks, 0),
#undef F
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(suffix, map[i].s) == 0) {
            *is_weight = map[i].is_weight;
            return (char *)w + map[i].off;
        }
    return expert_slot(w, n_experts, suffix, is_weight);
}

/* The slot of the model that tensor `name` fills; a layer's tensors go into layers[l] (an
 * encoder-decoder's encoder layers into enc_layers). */
static void *slot(iflow_model *m, layer_weights *layers, const char *name, int *is_weight)
{
    *is_weight = 1;
    if (strcmp(name, "tok_embd") == 0) return &m->tok_embd;
    if (strcmp(name, "pos_embd") == 0) return &m->pos_embd;
    if (strcmp(name, "tok_type_embd") == 0) return &m->tok_type_embd;
    if (strcmp(name, "output") == 0) return &m->output;
    *is_weight = 0;
    static const struct { const char *s; size_t off; } vecs[] = {
#define V(n, field) {n, offsetof(iflow_model, field)}
        V("output_norm", output_norm), V("output_norm_b", output_norm_b), V("embd_norm", embd_norm),
        V("embd_norm_b", embd_norm_b), V("enc.output_norm", enc_output_norm), V("enc.output_norm_b", enc_output_norm_b),
        V("enc.rel_bias", enc_rel_bias), V("rel_bias", rel_bias), V("output_b", output_b), V("rope_freqs", rope_freqs),
        V("rope_short", rope_short), V("rope_long", rope_long),
#undef V
    };
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
        if (strcmp(name, vecs[i].s) == 0)
            return (char *)m + vecs[i].off;
    if (strncmp(name, "enc.blk.", 8) == 0)
        return layer_slot(m->enc_layers, m->hp.n_enc_layers, 0, name + 8, is_weight);
    if (strncmp(name, "blk.", 4) == 0)
        return layer_slot(layers, m->hp.n_layers, m->hp.n_experts, name + 4, is_weight);
    return NULL;
}

static int bind_all(iflow_model *m)
{
    iflow_tensor_req *reqs;
    size_t n;
    int rc = iflow_model_tensors(&m->hp, &reqs, &n);
    if (rc)
        return rc;
    m->layers = calloc((size_t)m->hp.n_layers, sizeof *m->layers);
    m->enc_layers = calloc((size_t)m->hp.n_enc_layers + 1, sizeof *m->enc_layers);
    m->experts = calloc((size_t)m->hp.n_layers * (size_t)m->hp.n_experts + 1, sizeof *m->experts);
    if (!m->layers || !m->enc_layers || !m->experts)
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int l = 0; rc == 0 && m->hp.n_experts && l < m->hp.n_layers; l++)
        m->layers[l].experts = m->experts + (size_t)l * (size_t)m->hp.n_experts;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const iflow_shard_rec *t = NULL;
        int is_weight;
        void *dst = slot(m, m->layers, reqs[i].name, &is_weight);
        if ((rc = bind(m->shard, &reqs[i], &t)) < 0)
            break;
        if (is_weight)
            *(weight *)dst = (weight){t->data, t->dtype};
        else
            *(const float **)dst = t->data;
        if (iflow_tensor_expert(reqs[i].name) >= 0) /* an expert: a token reads n_experts_used of n_experts */
            m->decode_bytes += t->nbytes * (uint64_t)m->hp.n_experts_used / (uint64_t)m->hp.n_experts;
        else if (!reqs[i].is_vector && strcmp(reqs[i].name, "tok_embd") != 0 && strcmp(reqs[i].name, "pos_embd") != 0 &&
                 strcmp(reqs[i].name, "tok_type_embd") != 0)
            m->decode_bytes += t->nbytes;
    }
    free(reqs);
    if (rc == 0 && m->hp.tie_embeddings && m->hp.layout != IFLOW_LAYOUT_ENCODER) {
        m->output = m->tok_embd;
        m->decode_bytes += iflow_tensor_nbytes(m->tok_embd.type, 2, (int64_t[]){m->hp.vocab_size, m->hp.dim});
    }
    return rc;
}
/* Per-pair frequency multipliers for context-extension schemes: rope_scaling's, divided by
 * the rope_freqs tensor's factors when there is one (as llama.cpp's freq_factors). */
static int make_rope_scale(iflow_model *m)
{
    const iflow_hparams *hp = &m->hp;
    if (hp->rope_scaling == IFLOW_ROPE_SCALING_NONE && !m->rope_freqs)
        return 0;
    int half = hp->rope_dim / 2;
    if (!(m->rope_scale = malloc(rope_scale_count(hp) * sizeof(float))))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    double lo = 0, hi = 0; /* yarn: pairs below lo keep their frequency, above hi divide it by factor */
    if (hp->rope_scaling == IFLOW_ROPE_SCALING_YARN) {
        const double d = hp->rope_dim, base = hp->rope_theta, ctx = hp->rope_orig_ctx;
        lo = d * log(ctx / (hp->rope_beta_fast * 2 * M_PI)) / (2 * log(base));
        hi = d * log(ctx / (hp->rope_beta_slow * 2 * M_PI)) / (2 * log(base));
        if (hp->rope_truncate)
            lo = floor(lo), hi = ceil(hi);
        lo = lo > 0 ? lo : 0, hi = hi < d - 1 ? hi : d - 1;
        if (hi == lo)
            hi += 0.001;
    }
    for (int i = 0; i < half; i++) {
        float s = hp->rope_scaling == IFLOW_ROPE_SCALING_NONE ? 1.0f : 1.0f / hp->rope_factor;
        if (hp->rope_scaling == IFLOW_ROPE_SCALING_YARN) { /* as transformers: a linear ramp between */
            double ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            s = (float)(ramp / hp->rope_factor + (1 - ramp));
        }
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
        if (m->rope_freqs) {
            float f = m->rope_freqs[i];
            if (!(f > 0.0f) || !isfinite(f))
                return iflow_seterr(IFLOW_ERANGE, "rope_freqs[%d] = %g in '%s' is not a positive factor", i, (double)f,
                                    iflow_shard_path(m->shard));
            s /= f;
        }
        m->rope_scale[i] = s;
        if (hp->rope_scaling == IFLOW_ROPE_SCALING_LONGROPE) { /* the short factors, then the long ones */
            const float fr = m->rope_freqs ? m->rope_freqs[i] : 1.0f;
            const float sf = m->rope_short ? m->rope_short[i] : hp->rope_short[i],
                        lf = m->rope_long ? m->rope_long[i] : hp->rope_long[i];
            if (!(sf > 0.0f) || !isfinite(sf) || !(lf > 0.0f) || !isfinite(lf))
                return iflow_seterr(IFLOW_ERANGE, "longrope's factors for pair %d (%g, %g) in '%s' are not positive",
                                    i, (double)sf, (double)lf, iflow_shard_path(m->shard));
            m->rope_scale[i] = 1.0f / (sf * fr);
            m->rope_scale[half + i] = 1.0f / (lf * fr);
        }
    }
    return 0;
}

/* The shard's tokenizer, and an encoder-decoder's target one when it has its own. */
static int load_tokenizers(iflow_model *m)
{
    int rc = iflow_tokenizer_from_shard(&m->tok, m->shard, IFLOW_TOK_SOURCE);
    return rc < 0 ? rc : iflow_tokenizer_from_shard(&m->tgt_tok, m->shard, IFLOW_TOK_TARGET);
}

static int parse_meta(const iflow_shard *sh, json_t **meta)
{
    json_error_t je;
    if ((*meta = json_loads(iflow_shard_meta(sh), 0, &je)))
        return 0;
    return iflow_seterr(IFLOW_EFORMAT, "bad meta record in '%s': %s at line %d", iflow_shard_path(sh), je.text, je.line);
}

static int shard_flags(int flags) { return (flags & IFLOW_MODEL_NO_VERIFY) ? IFLOW_SHARD_NO_VERIFY : 0; }

/* A model from one shard. */
static int open_whole(iflow_model *m, const char *path, int flags, json_t **meta)
{
    int index, count;
    int rc = iflow_shard_open(&m->shard, path, shard_flags(flags));
    if (rc == 0)
        rc = parse_meta(m->shard, meta);
    if (rc == 0 && iflow_split_is_part(*meta, &index, &count))
        rc = iflow_seterr(IFLOW_EINVAL,
                          "'%s' is device %d of a %d-device split model (iflow-partition --split): open its directory",
                          path, index, count);
    if (rc == 0)
        rc = iflow_hparams_from_json(&m->hp, *meta, path);
    if (rc == 0)
        rc = bind_all(m);
    return rc;
}

/* Device dev's slices, from its own file, into split_layers (and the embeddings, the output). */
static int bind_device(iflow_model *m, int dev)
{
    const iflow_plan *p = m->split_plan;
    iflow_split_tensor *t;
    size_t n;
    int rc = iflow_split_tensors(&m->hp, p, dev, &t, &n), tied_output = dev == p->output_device && m->hp.tie_embeddings;
    layer_weights *layers = m->split_layers + (size_t)dev * m->hp.n_layers;
    for (size_t k = 0; k < n && rc == 0; k++) {
        const iflow_shard_rec *r = NULL;
        const char *name = t[k].req.name;
        int is_embd = strcmp(name, "tok_embd") == 0, is_weight;
        if ((rc = bind(m->split_shards[dev], &t[k].req, &r)) < 0)
            break;
        weight w = {r->data, r->dtype};
        if (is_embd) {
            if (dev == iflow_split_embed_device(p))
                m->tok_embd = w;
            if (tied_output)
                m->output = w;
        } else {
            void *dst = slot(m, layers, name, &is_weight);
            if (is_weight)
                *(weight *)dst = w;
            else
                *(const float **)dst = r->data;
        }
        if (!t[k].req.is_vector && (!is_embd || tied_output))
            m->decode_bytes += r->nbytes;
    }
    free(t);
    return rc;
}

/* A directory of iflow-partition --split: its plan, then each device's file (or only m->own_dev's),
 * checked to belong together (split.h) and bound; *meta0 is the first file's meta. */
static int open_split(iflow_model *m, const char *dir, int flags, json_t **meta0)
{
    char plan_path[4096], path[4096], path0[4096];
    if (!(m->split_plan = calloc(1, sizeof *m->split_plan)) || !(m->split_dir = strdup(dir)))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    const iflow_plan *p = m->split_plan;
    snprintf(plan_path, sizeof plan_path, "%s/%s", dir, IFLOW_SPLIT_PLAN);
    int rc = iflow_plan_load(m->split_plan, plan_path);
    if (rc < 0)
        return iflow_preperr(rc, "'%s' is not a split model", dir);
    if (m->own_dev >= p->n_devices)
        return iflow_seterr(IFLOW_EINVAL, "split model '%s' has %d devices, so there is no device %d to compute: run one "
                            "process per device", dir, p->n_devices, m->own_dev);
    const int first = m->own_dev >= 0 ? m->own_dev : 0, end = m->own_dev >= 0 ? m->own_dev + 1 : p->n_devices;
    for (int i = first; i < end && rc == 0; i++) {
        json_t *meta = NULL, **mine = i != first ? &meta : meta0;
        iflow_split_path(path, sizeof path, dir, i);
        rc = iflow_shard_open(&m->split_shards[i], path, shard_flags(flags));
        if (rc == 0)
            rc = parse_meta(m->split_shards[i], mine);
        if (rc == 0 && i == first) {
            m->shard = m->split_shards[i];
            snprintf(path0, sizeof path0, "%s", path);
            const iflow_hparams *hp = &m->hp;
            if ((rc = iflow_hparams_from_json(&m->hp, *meta0, path)) == 0 && hp->n_experts) /* split.c writes none */
                rc = iflow_seterr(IFLOW_EUNSUPPORTED, "'%s' is a mixture of experts: a split one is not implemented",
                                  path);
            if (rc == 0 && (rc = iflow_plan_check(p, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->ffn_dim)) == 0 &&
                !(m->split_layers = calloc((size_t)p->n_devices * hp->n_layers, sizeof *m->split_layers)))
                rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
        }
        if (rc == 0)
            rc = iflow_split_check_meta(*mine, path, p, plan_path, i, i != first ? *meta0 : NULL, path0);
        if (rc == 0)
            rc = iflow_split_check_source(m->split_shards[i], m->shard);
        if (rc == 0)
            rc = bind_device(m, i);
        json_decref(meta);
        if (rc < 0)
            rc = iflow_preperr(rc, "split model '%s', device %d (%s)", dir, i, p->devices[i].name);
    }
    return rc;
}

int iflow_model_open_device(iflow_model **out, const char *path, int flags, int dev)
{
    *out = NULL;
    iflow_model *m = calloc(1, sizeof *m);
    if (!m)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    m->own_dev = dev < 0 ? -1 : dev;
    struct stat st;
    json_t *meta = NULL;
    int rc = strcmp(path, "-") != 0 && stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? open_split(m, path, flags, &meta)
                                                                                    : open_whole(m, path, flags, &meta);
    if (rc == 0)
        rc = make_rope_scale(m);
    if (rc == 0)
        rc = load_tokenizers(m);
    if (rc == 0)
        rc = iflow_place_on_host(m);
    json_decref(meta);
    if (rc < 0) {
        iflow_model_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

int iflow_model_open(iflow_model **out, const char *path, int flags) { return iflow_model_open_device(out, path, flags, -1); }

void iflow_model_close(iflow_model *m)
{
    if (!m)
        return;
    ifk_pool_quiesce(); /* no kernel thread is still reading the weights (pool.h) */
    iflow_unplace(m);
    iflow_model_free_lora(m);
    iflow_tokenizer_close(m->tok);
    iflow_tokenizer_close(m->tgt_tok);
    for (int i = 0; i < IFLOW_MAX_DEVICES; i++) /* a split model's files; shard is one of them */
        if (m->split_shards[i] != m->shard)
            iflow_shard_close(m->split_shards[i]);
    iflow_shard_close(m->shard);
    free(m->split_layers);
    free(m->split_plan);
    free(m->split_dir);
    free(m->layers);
    free(m->enc_layers);
    free(m->experts);
    free(m->rope_scale);
    free(m);
}

const struct iflow_plan_s *iflow_model_split_plan(const iflow_model *m) { return m->split_plan; }
int iflow_model_own_device(const iflow_model *m) { return m->own_dev; }

uint64_t iflow_model_identity(const iflow_model *m)
{
    const iflow_shard_rec *r = m->split_plan ? iflow_shard_find(m->shard, "split") : NULL;
    if (r) /* a digest of the whole source, the same in every file of the split (split.h) */
        return XXH64(r->data, r->nbytes, 1);
    const char *meta = iflow_shard_meta(m->shard);
    return XXH64(meta, strlen(meta), 0);
}
const iflow_hparams *iflow_model_hparams(const iflow_model *m) { return &m->hp; }
const iflow_tokenizer *iflow_model_tokenizer(const iflow_model *m) { return m->tok; }
const iflow_tokenizer *iflow_model_target_tokenizer(const iflow_model *m) { return m->tgt_tok ? m->tgt_tok : m->tok; }
const iflow_shard *iflow_model_shard(const iflow_model *m) { return m->shard; }
uint64_t iflow_model_decode_bytes(const iflow_model *m) { return m->decode_bytes; }

const char *iflow_kernel_path(void) { return ifk_isa_name(ifk_isa_current()); }
void iflow_kernel_set_f32_activations(int on) { ifk_set_qx_f32(on); }
int iflow_kernel_set_activations(const char *mode)
{
    static const struct { const char *name; int mode; } modes[] = {
        {"int", IFK_QX_DEFAULT}, {"int8", IFK_QX_INT8}, {"int16", IFK_QX_INT16}, {"f32", IFK_QX_F32}};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++)
        if (!strcmp(mode, modes[i].name)) {
            ifk_set_qx_mode(modes[i].mode);
            return 0;
        }
    return -1;
}

int iflow_model_is_eos(const iflow_model *m, int32_t id)
{
    for (int i = 0; i < m->hp.n_eos; i++)
        if (m->hp.eos[i] == id)
            return 1;
    return 0;
}

void iflow_model_ban(const iflow_model *m, float *logits)
{
    for (int i = 0; i < m->hp.n_banned; i++)
        logits[m->hp.banned[i]] = -INFINITY;
}

int iflow_model_force_eos(const iflow_model *m, float *logits)
{
    const int f = m->hp.forced_eos;
    if (f < 0)
        return 0;
    for (int i = 0; i < m->hp.vocab_size; i++)
        logits[i] = i == f ? 0.0f : -INFINITY;
    return 1;
}

void iflow_model_get_info(const iflow_model *m, iflow_model_info *info)
{
    const iflow_hparams *hp = &m->hp;
    *info = (iflow_model_info){
        .n_vocab = hp->vocab_size, .n_ctx_train = hp->max_seq, .n_layers = hp->n_layers, .dim = hp->dim,
        .n_heads = hp->n_heads, .n_kv_heads = hp->n_kv_heads, .head_dim = hp->head_dim, .ffn_dim = hp->ffn_dim,
        .bos = hp->bos, .eos = hp->n_eos ? hp->eos[0] : -1,
    };
}
