/*
 * test_gguf_families.c -- the model families of specs/ read from GGUF files as llama.cpp writes
 * them. tests/fixtures/gguf-families/FAMILY.gguf is the tiny random-weight Hugging Face model of
 * tests/fixtures/families/FAMILY put through llama.cpp's own convert_hf_to_gguf.py (F32; made by
 * tests/fixtures/gen_gguf_families.py): its metadata keys, tensor names, fused q/k/v and
 * gate/up tensors, q/k row order, norm offsets and 3-D expert tensors are llama.cpp's. Each converts with the spec
 * whose [gguf] section serves its general.architecture, and the logits of every position (or
 * the pooled embedding) match transformers' float64 forward within 1e-4: the folder's refs.json,
 * or gguf-families/FAMILY.refs.json where llama.cpp runs the file otherwise than transformers
 * runs the folder (Mistral without its window, Gemma 2's scale from head_dim, a normalized
 * BERT CLS vector, llama3-freqs2's factors of 2). Then the spec's GGUF rules on metadata no
 * fixture has (Gemma 2 and 3's 27B scale, Gemma 3's default pattern, BERT's pooling numbers,
 * an old converter's rope.scale_linear)
 * and rope_freqs factors that are not positive.
 */
#include "check.h"
#include "testlib.h"
#include "libcore/base/error.h"
#include "kernels/cpu/kernels.h"
#include "libcore/engine/model.h"
#include "libcore/formats/convert.h"
#include "libcore/formats/ggufsrc.h"
#include "libcore/formats/shard.h"
#include "libcore/formats/spec.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static char dir[] = "/tmp/iflow-test-gguf-families-XXXXXX";
static const char *specs[] = {"specs"};

/* The committed fixture rel (tests/fixtures/rel) copied into buf; 0, or -1 when absent. */
static int fixture_path(const char *rel, char *buf, size_t cap)
{
    const char *p = test_fixture(rel);
    if (!p)
        return -1;
    snprintf(buf, cap, "%s", p);
    return 0;
}

/* name's reference: gguf-families/NAME.refs.json when there is one, else the Hugging Face
 * folder's (families/FAMILY/refs.json). */
static json_t *load_refs(const char *name, const char *family)
{
    char rel[256], path[4096];
    snprintf(rel, sizeof rel, "gguf-families/%s.refs.json", name);
    if (fixture_path(rel, path, sizeof path) < 0) {
        snprintf(rel, sizeof rel, "families/%s/refs.json", family);
        if (fixture_path(rel, path, sizeof path) < 0)
            return NULL;
    }
    json_error_t je;
    json_t *r = json_load_file(path, 0, &je);
    CHECK(r != NULL, "%s: %s", path, je.text);
    return r;
}

/* Convert gguf-families/NAME.gguf with specs/ and open it: 0, or -1 (reported; a missing
 * fixture skips). */
static int open_gguf(const char *name, iflow_model **m)
{
    char rel[256], src[4096], out[300];
    snprintf(rel, sizeof rel, "gguf-families/%s.gguf", name);
    if (fixture_path(rel, src, sizeof src) < 0)
        SKIP_RET(-1, "no fixture %s (run from the repository root)", rel);
    snprintf(out, sizeof out, "%s/%s.ifs", dir, name);
    iflow_convert_opts o = {.dtype = -1, .spec_dirs = specs, .n_spec_dirs = 1};
    int rc = iflow_convert(src, out, &o);
    CHECK(rc == 0, "%s: convert: %s", name, iflow_errmsg());
    if (rc < 0)
        return -1;
    rc = iflow_model_open(m, out, 0);
    CHECK(rc == 0, "%s: open: %s", name, iflow_errmsg());
    return rc < 0 ? -1 : 0;
}

/* max |iflow - reference| over the logits of the positions `want` has (the first of ids'), in a
 * context of n_ctx: one prefill, or token by token. */
static double logits_diff(iflow_model *m, const json_t *ids, const json_t *want, int one_by_one, int n_ctx)
{
    const int n = (int)json_array_size(want), V = iflow_model_hparams(m)->vocab_size;
    int32_t *tok = malloc(sizeof *tok * (size_t)n);
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)n);
    iflow_ctx *c;
    double worst = INFINITY;
    for (int i = 0; i < n; i++)
        tok[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
    if (n <= (int)json_array_size(ids) && iflow_ctx_open(&c, m, n_ctx, 1) == 0) {
        int rc = 0;
        for (int i = 0; one_by_one && i < n && rc == 0; i++)
            rc = iflow_ctx_eval(c, tok + i, 1, logits + (size_t)i * V, 0);
        if (!one_by_one)
            rc = iflow_ctx_eval(c, tok, n, logits, 1);
        for (int i = 0; rc == 0 && i < n; i++) {
            const json_t *row = json_array_get(want, (size_t)i);
            worst = i ? worst : 0;
            for (int v = 0; v < V; v++) {
                double d = fabs(logits[(size_t)i * V + v] - json_real_value(json_array_get(row, (size_t)v)));
                worst = d > worst || d != d ? d : worst;
            }
        }
        iflow_ctx_close(c);
    }
    free(tok);
    free(logits);
    return worst;
}

/* max |iflow - reference| over the pooled embedding of the ids. */
static double embed_diff(iflow_model *m, const json_t *ids, const json_t *want)
{
    const int n = (int)json_array_size(ids), D = iflow_model_hparams(m)->dim;
    int32_t tok[64];
    float got[64];
    iflow_ctx *c;
    double worst = INFINITY;
    for (int i = 0; i < n && i < 64; i++)
        tok[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
    if (D <= 64 && (int)json_array_size(want) == D && iflow_ctx_open(&c, m, 64, 1) == 0) {
        if (iflow_ctx_embed(c, tok, n, got) == 0) {
            worst = 0;
            for (int d = 0; d < D; d++) {
                double e = fabs(got[d] - json_real_value(json_array_get(want, (size_t)d)));
                worst = e > worst || e != e ? e : worst;
            }
        }
        iflow_ctx_close(c);
    }
    return worst;
}

/* gguf-families/NAME.gguf (from families/FAMILY) against its reference; check: what its spec's
 * [gguf] section must have made of the metadata (spec: the spec's name). */
static void check_gguf(const char *name, const char *family, const char *spec, int (*check)(const iflow_hparams *hp))
{
    iflow_model *m;
    json_t *r = load_refs(name, family);
    if (!r)
        SKIP("no reference for %s", name);
    if (open_gguf(name, &m) < 0) {
        json_decref(r);
        return;
    }
    const iflow_hparams *hp = iflow_model_hparams(m);
    CHECK(check(hp), "%s: the spec's hyperparameters", name);
    json_t *meta = json_loads(iflow_shard_meta(iflow_model_shard(m)), 0, NULL);
    const char *got = json_string_value(json_object_get(meta, "spec"));
    CHECK(got && strcmp(got, spec) == 0, "%s: served by spec %s, not %s", name, got ? got : "?", spec);
    json_decref(meta);
    const json_t *ids = json_object_get(r, "ids");
    if (json_object_get(r, "embedding")) {
        double a = embed_diff(m, ids, json_object_get(r, "embedding"));
        printf("%s: max |embedding - transformers float64| = %.2e\n", name, a);
        CHECK(a <= 1e-4, "%s: the embedding differs from transformers by %.3g", name, a);
    } else {
        const json_t *want = json_object_get(r, "logits"), *shorter = json_object_get(r, "logits_short");
        double a = logits_diff(m, ids, want, 0, 64), b = logits_diff(m, ids, want, 1, 64);
        printf("%s: max |logit - transformers float64| = %.2e (prefill), %.2e (token by token)\n", name, a, b);
        CHECK(a <= 1e-4 && b <= 1e-4, "%s: logits differ from transformers by %.3g / %.3g", name, a, b);
        if (shorter) { /* longrope: the first ids in a context of their own length, by the short factors */
            const int n = (int)json_array_size(shorter);
            a = logits_diff(m, ids, shorter, 0, n);
            printf("%s: short factors (a context of %d): max |logit - transformers float64| = %.2e\n", name, n, a);
            CHECK(a <= 1e-4, "%s: the short factors' logits differ from transformers by %.3g", name, a);
        }
    }
    iflow_model_close(m);
    json_decref(r);
}

/* llama.cpp does not permute qwen2's q/k (NEOX rope: rotate_half); q, k, v biases only */
static int qwen2_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->qkv_bias && !hp->attn_bias && hp->rope_theta == 1e6f &&
           !hp->tie_embeddings && !hp->rope_freqs;
}

/* written as architecture llama (permuted q/k), with no window: llama.cpp has none for it */
static int mistral_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->sliding_window == 0 && hp->tie_embeddings &&
           hp->head_dim == 8;
}

/* the norms already hold 1 + w (not added again), GeGLU, scaled embeddings, one kv head */
static int gemma_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->activation == IFLOW_ACT_GELU_TANH &&
           hp->embed_scale == (float)sqrt(32.0) && hp->n_kv_heads == 1 && hp->tie_embeddings;
}

/* the caps and window from the metadata, every 2nd layer global, scores by 1/sqrt(head_dim) */
static int gemma2_hp(const iflow_hparams *hp)
{
    return hp->post_norms && hp->attn_softcap == 0.3f && hp->logit_softcap == 0.8f && hp->sliding_window == 5 &&
           hp->window_pattern == 2 && hp->attn_scale == 1.0f / sqrtf(8.0f) && hp->rope_theta_local == 0;
}

/* qk-norm, the fixture's pattern 3 from gemma3.attention.sliding_window_pattern, two bases */
static int gemma3_hp(const iflow_hparams *hp)
{
    return hp->qk_norm && hp->window_pattern == 3 && hp->sliding_window == 5 && hp->rope_theta == 1e6f &&
           hp->rope_theta_local == 1e4f && hp->attn_softcap == 0 && hp->logit_softcap == 0 &&
           hp->attn_scale == 1.0f / sqrtf(8.0f);
}

/* q, k, v rows of attn_qkv and gate, up rows of ffn_up; the window from the metadata */
static int phi3_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->sliding_window == 6 && hp->n_kv_heads == 2 &&
           hp->ffn_dim == 48 && !hp->tie_embeddings;
}

/* q, k, v rows of attn_qkv (already [out][in]); tied */
static int gpt2_hp(const iflow_hparams *hp)
{
    return hp->norm == IFLOW_NORM_LAYER && hp->position == IFLOW_POS_LEARNED && hp->ffn_dim == 128 &&
           hp->attn_bias && hp->mlp_bias && hp->max_seq == 64 && hp->tie_embeddings;
}

/* attn_qkv regrouped [q; k; v] by the converter; rope on 4 of 8 dimensions */
static int gptneox_hp(const iflow_hparams *hp)
{
    return hp->parallel_residual && hp->rope_dim == 4 && hp->head_dim == 8 && hp->activation == IFLOW_ACT_GELU &&
           hp->rope_layout == IFK_ROPE_HALF && hp->attn_bias && !hp->tie_embeddings;
}

static int bert_hp(const iflow_hparams *hp)
{
    return hp->layout == IFLOW_LAYOUT_ENCODER && hp->pooling == IFLOW_POOL_MEAN && hp->normalize &&
           hp->token_types == 2 && hp->post_ln && hp->embed_norm;
}

static int bert_cls_hp(const iflow_hparams *hp)
{
    return hp->layout == IFLOW_LAYOUT_ENCODER && hp->pooling == IFLOW_POOL_CLS && hp->normalize;
}

/* llama3 rope scaling as the converter writes it: no metadata, the rope_freqs tensor */
static int llama3_hp(const iflow_hparams *hp)
{
    return hp->rope_freqs && hp->rope_scaling == IFLOW_ROPE_SCALING_NONE &&
           hp->rope_layout == IFK_ROPE_INTERLEAVED && !hp->tie_embeddings;
}

/* qk-norm as attn_q_norm / attn_k_norm, q and k not permuted, head_dim from key_length */
static int qwen3_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->qk_norm && hp->head_dim == 12 && !hp->qkv_bias &&
           hp->tie_embeddings && hp->rope_theta == 1e6f;
}

/* written as architecture llama (permuted q/k): experts as rows of the 3-D ffn_*_exps tensors,
 * renormalized (llama.cpp's llama) */
static int mixtral_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->n_experts == 4 && hp->n_experts_used == 2 &&
           hp->expert_ffn_dim == 24 && hp->expert_norm && !hp->shared_expert;
}

/* qwen3moe: renormalized (llama.cpp's rule for it), expert_feed_forward_length */
static int qwen3_moe_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->qk_norm && hp->n_experts == 6 && hp->n_experts_used == 3 &&
           hp->expert_ffn_dim == 20 && hp->expert_norm;
}

/* qwen2moe: not renormalized, the shared expert (ffn_*_shexp) and its gate (ffn_gate_inp_shexp) */
static int qwen2_moe_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->qkv_bias && hp->n_experts == 4 && hp->expert_ffn_dim == 24 &&
           !hp->expert_norm && hp->shared_expert && hp->shared_expert_gate && hp->ffn_dim == 40;
}

/* olmoe: q and k normed over the whole projections, not renormalized */
static int olmoe_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->qk_norm_full && hp->n_experts == 8 && hp->expert_ffn_dim == 16 &&
           !hp->expert_norm;
}

/* granite: llama.cpp's permuted q/k, the multipliers as embedding_scale, attention.scale,
 * residual_scale and logit_scale (a divisor) */
static int granite_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->embed_scale == 3.0f && hp->attn_scale == 0.3f &&
           hp->residual_scale == 0.5f && hp->logit_scale == 0.25f && hp->tie_embeddings;
}

/* granitemoe: input_linear split by the converter into ffn_gate_exps and ffn_up_exps; renormalized */
static int granitemoe_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->residual_scale == 0.5f && hp->n_experts == 4 &&
           hp->expert_ffn_dim == 24 && hp->expert_norm && !hp->shared_expert;
}

/* and the shared expert as ffn_*_shexp of expert_shared_feed_forward_length, ungated */
static int granitemoeshared_hp(const iflow_hparams *hp)
{
    return hp->n_experts == 4 && hp->expert_ffn_dim == 24 && hp->shared_expert && !hp->shared_expert_gate &&
           hp->ffn_dim == 40 && !hp->tie_embeddings;
}

/* olmo2: no pre-norms, post_attention_norm and post_ffw_norm, q/k norms over the projections;
 * OLMo 3's windowed layers as a list of booleans */
static int olmo2_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->post_norms_only && hp->qk_norm_full && hp->sliding_window == 0;
}

static int olmo3_hp(const iflow_hparams *hp)
{
    return hp->post_norms_only && hp->sliding_window == 5 && hp->window_pattern == 3 && hp->rope_theta == 5e5f;
}

/* stablelm: LayerNorm, rope.dimension_count 4 of 8, q/k/v biases; a parallel residual's one norm */
static int stablelm_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->norm == IFLOW_NORM_LAYER && hp->rope_dim == 4 && hp->qkv_bias &&
           !hp->attn_bias && !hp->parallel_residual;
}

static int stablelm_par_hp(const iflow_hparams *hp)
{
    return hp->norm == IFLOW_NORM_LAYER && hp->rope_dim == 2 && !hp->qkv_bias && hp->parallel_residual;
}

/* phi2: one norm, rope on 4 of 8, the output's bias */
static int phi_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->parallel_residual && hp->rope_dim == 4 && hp->logits_bias &&
           hp->activation == IFLOW_ACT_GELU_TANH && hp->ffn_dim == 128;
}

/* starcoder2: biases everywhere, tied, no window (llama.cpp's) */
static int starcoder2_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->norm == IFLOW_NORM_LAYER && hp->attn_bias && hp->mlp_bias &&
           hp->tie_embeddings && hp->sliding_window == 0;
}

static void test_granite(void)
{
    check_gguf("granite", "granite", "granite", granite_hp);
    check_gguf("granitemoe", "granitemoe", "granitemoe", granitemoe_hp);
    check_gguf("granitemoeshared", "granitemoeshared", "granitemoe", granitemoeshared_hp);
}

static void test_olmo2(void)
{
    check_gguf("olmo2", "olmo2", "olmo2", olmo2_hp);
    check_gguf("olmo3", "olmo3", "olmo2", olmo3_hp);
}

static void test_stablelm(void)
{
    check_gguf("stablelm", "stablelm", "stablelm", stablelm_hp);
    check_gguf("stablelm-par", "stablelm-par", "stablelm", stablelm_par_hp);
}

static void test_phi(void) { check_gguf("phi", "phi", "phi", phi_hp); }
static void test_starcoder2(void) { check_gguf("starcoder2", "starcoder2", "starcoder2", starcoder2_hp); }

/* smollm3: llama's permuted q/k, every fourth layer unrotated (llama.cpp's fixed step) */
static int smollm3_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->nope_pattern == 4 && hp->tie_embeddings;
}

/* command-r: one bias-free LayerNorm a layer, rotated in pairs, logit_scale; cohere2: the window
 * from the metadata, llama.cpp's pattern of 4, the global layers unrotated */
static int cohere_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && !iflow_norm_biased(hp) && hp->parallel_residual &&
           hp->logit_scale == 0.5f && hp->tie_embeddings;
}

static int cohere2_hp(const iflow_hparams *hp)
{
    return cohere_hp(hp) && hp->sliding_window == 5 && hp->window_pattern == 4 && hp->nope_pattern == 4;
}

static void test_nope(void)
{
    check_gguf("smollm3", "smollm3", "smollm3", smollm3_hp);
    check_gguf("cohere", "cohere", "cohere", cohere_hp);
    check_gguf("cohere2", "cohere2", "cohere2", cohere2_hp);
}

/* glm4: q and k as stored (rotated in pairs), 4 of 8 dimensions, post norms, gate and up rows
 * of the fused ffn_up */
static int glm4_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->rope_dim == 4 && hp->qkv_bias && hp->post_norms &&
           !hp->post_norms_only;
}

/* exaone4: post norms only, per-head q/k norms; the -swa file's window and pattern unused (not
 * 64 layers: llama.cpp's rule), every layer rotated */
static int exaone4_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->post_norms_only && hp->qk_norm && !hp->qk_norm_full &&
           hp->sliding_window == 0 && !hp->nope_pattern;
}

static void test_glm_exaone(void)
{
    check_gguf("glm4", "glm4", "glm4", glm4_hp);
    check_gguf("exaone4", "exaone4", "exaone4", exaone4_hp);
    check_gguf("exaone4-swa", "exaone4-swa", "exaone4", exaone4_hp);
}

/* ernie4_5: rotated in pairs, biases; seed_oss: NEOX order, q/k/v biases only */
static int ernie4_5_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->attn_bias && hp->mlp_bias && hp->tie_embeddings;
}

static int seed_oss_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->qkv_bias && !hp->attn_bias && hp->head_dim == 12;
}

static void test_ernie_seed(void)
{
    check_gguf("ernie4_5", "ernie4_5", "ernie4_5", ernie4_5_hp);
    check_gguf("seed_oss", "seed_oss", "seed_oss", seed_oss_hp);
}

/* olmo: llama.cpp's permuted q/k, no norm tensors, the clamp as attention.clamp_kqv */
static int olmo_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->norm_no_weight && hp->clip_qkv == 0.3f;
}

static void test_olmo(void) { check_gguf("olmo", "olmo", "olmo", olmo_hp); }

/* arcee: llama.cpp's permuted q/k, a plain squared-ReLU FFN */
static int arcee_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->ffn == IFLOW_FFN_PLAIN && hp->activation == IFLOW_ACT_RELU2;
}

static void test_arcee(void) { check_gguf("arcee", "arcee", "arcee", arcee_hp); }

/* hunyuan-dense: q and k as stored, normed after rope; the stretched base as rope.freq_base */
static int hunyuan_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->qk_norm_late && fabsf(hp->rope_theta - 1e8f) < 1e3f;
}

static void test_hunyuan(void) { check_gguf("hunyuan_dense", "hunyuan_dense", "hunyuan_dense", hunyuan_hp); }

/* nemotron: NEOX order, norm weights already 1 + w, biases, rope on 4 of 8 */
static int nemotron_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && iflow_norm_biased(hp) && hp->rope_dim == 4 &&
           hp->activation == IFLOW_ACT_RELU2;
}

static void test_nemotron(void) { check_gguf("nemotron", "nemotron", "nemotron", nemotron_hp); }

/* yarn from rope.scaling.type, .factor and .original_context_length (beta 32 and 1 by default) */
static int qwen2_yarn_hp(const iflow_hparams *hp)
{
    const double a = 0.1 * log(4.0) + 1.0;
    return hp->rope_layout == IFK_ROPE_HALF && hp->rope_theta == 1e4f && hp->rope_scaling == IFLOW_ROPE_SCALING_YARN &&
           hp->rope_orig_ctx == 8 && hp->rope_beta_fast == 32.0f && fabs(hp->attn_scale - a * a / sqrt(8.0)) < 1e-6;
}

/* deepseek2: latent attention from attn_kv_a_mqa, attn_k_b (3-D, each head's key rows
 * transposed), attn_v_b; yarn's log multiplier (0.1 mscale_all_dim) for the softmax scale; the
 * group score of V2 (softmax: the best) and V3 (sigmoid with exp_probs_b: the top two) */
static int deepseek_common(const iflow_hparams *hp)
{
    return hp->kv_lora_rank == 16 && hp->qk_nope_dim == 8 && hp->rope_dim == 4 && hp->v_head_dim == 6 &&
           hp->n_kv_heads == 1 && hp->head_dim == 20 && hp->rope_layout == IFK_ROPE_INTERLEAVED &&
           hp->moe_dense_first == 1;
}

static int deepseek_v2_lite_hp(const iflow_hparams *hp)
{
    const double ms = 0.1 * 0.707 * log(4.0) + 1;
    return deepseek_common(hp) && !hp->q_lora_rank && hp->rope_scaling == IFLOW_ROPE_SCALING_YARN &&
           fabs(hp->attn_scale - ms * ms / sqrt(12.0)) < 1e-6 && !hp->router_sigmoid;
}

static int deepseek_v2_hp(const iflow_hparams *hp)
{
    return deepseek_common(hp) && hp->q_lora_rank == 12 && hp->router_groups == 4 && hp->router_group_top == 1 &&
           !hp->router_sigmoid && hp->expert_scale == 2.0f;
}

static int deepseek_v3_hp(const iflow_hparams *hp)
{
    return deepseek_common(hp) && hp->router_sigmoid && hp->router_bias && hp->router_group_top == 2 &&
           hp->expert_norm && hp->expert_scale == 2.5f;
}

/* glm4moe: half-head NEOX rope, q/k/v biases and norms, sigmoid routing with exp_probs_b in
 * groups, a dense first layer; -mtp: block_count 4 with nextn_predict_layers 1, whose layer is
 * carried and never run (the same logits as transformers' 3 layers) */
static int glm4_moe_hp(const iflow_hparams *hp)
{
    return hp->n_layers == 3 && hp->rope_layout == IFK_ROPE_HALF && hp->rope_dim == 4 && hp->qkv_bias &&
           hp->qk_norm && hp->router_sigmoid && hp->router_bias && hp->router_groups == 2 &&
           hp->router_group_top == 2 && hp->moe_dense_first == 1 && hp->expert_scale == 1.5f && hp->expert_norm;
}

static void test_glm4_moe(void)
{
    check_gguf("glm4_moe", "glm4_moe", "glm4_moe", glm4_moe_hp);
    check_gguf("glm4_moe-mtp", "glm4_moe-mtp", "glm4_moe", glm4_moe_hp);
}

/* gpt-oss: sinks as attn_sinks.weight, llama.cpp's fixed window pattern, clamp and rounded yarn
 * ends (the reference: transformers with swiglu_limit 7 and truncate true), experts' biases as
 * rows of ffn_*_exps.bias, the router's as ffn_gate_inp.bias */
static int gpt_oss_hp(const iflow_hparams *hp)
{
    return hp->attn_sinks && hp->sliding_window == 5 && hp->window_pattern == 2 && hp->swiglu_limit == 7.0f &&
           hp->rope_truncate && hp->expert_bias && hp->router_logit_bias && hp->head_dim == 8 &&
           hp->rope_layout == IFK_ROPE_HALF;
}

static void test_gpt_oss(void) { check_gguf("gpt_oss", "gpt_oss", "gpt_oss", gpt_oss_hp); }

static void test_deepseek(void)
{
    check_gguf("deepseek_v2-lite", "deepseek_v2-lite", "deepseek2", deepseek_v2_lite_hp);
    check_gguf("deepseek_v2", "deepseek_v2", "deepseek2", deepseek_v2_hp);
    check_gguf("deepseek_v3", "deepseek_v3", "deepseek2", deepseek_v3_hp);
}

/* phi3 longrope: the factors as tensors rope_factors_short/long, rope.scaling.attn_factor (sqrt 2),
 * the original context; -partial: half of each head rotated, the factor on those dimensions */
static int phi3_longrope_hp(const iflow_hparams *hp)
{
    return hp->rope_scaling == IFLOW_ROPE_SCALING_LONGROPE && hp->rope_factor_tensors && hp->rope_orig_ctx == 8 &&
           (hp->rope_dim == hp->head_dim ? fabs(hp->attn_scale - 2.0 / sqrt(8.0)) < 1e-6
                                         : fabsf(hp->rope_rot_scale - sqrtf(2.0f)) < 1e-6f);
}

static void test_phi3_longrope(void)
{
    check_gguf("phi3-longrope", "phi3-longrope", "phi3", phi3_longrope_hp);
    check_gguf("phi3-longrope-partial", "phi3-longrope-partial", "phi3", phi3_longrope_hp);
}

static void test_qwen2(void)
{
    check_gguf("qwen2", "qwen2", "qwen2", qwen2_hp);
    check_gguf("qwen2-yarn", "qwen2-yarn", "qwen2", qwen2_yarn_hp);
}
static void test_olmoe(void) { check_gguf("olmoe", "olmoe", "olmoe", olmoe_hp); }
static void test_qwen3(void) { check_gguf("qwen3", "qwen3", "qwen3", qwen3_hp); }
static void test_mixtral(void) { check_gguf("mixtral", "mixtral", "llama", mixtral_hp); }
/* the same weights with one tensor per expert, as older converters wrote Mixtral */
static void test_mixtral_old(void) { check_gguf("mixtral-old", "mixtral", "llama", mixtral_hp); }
static void test_qwen3_moe(void) { check_gguf("qwen3_moe", "qwen3_moe", "qwen3_moe", qwen3_moe_hp); }
static void test_qwen2_moe(void) { check_gguf("qwen2_moe", "qwen2_moe", "qwen2_moe", qwen2_moe_hp); }
static void test_mistral(void) { check_gguf("mistral", "mistral", "llama", mistral_hp); }
static void test_gemma(void) { check_gguf("gemma", "gemma", "gemma", gemma_hp); }
static void test_gemma2(void) { check_gguf("gemma2", "gemma2", "gemma2", gemma2_hp); }
static void test_gemma3(void) { check_gguf("gemma3", "gemma3", "gemma3", gemma3_hp); }
static void test_phi3(void) { check_gguf("phi3", "phi3", "phi3", phi3_hp); }
static void test_gpt2(void) { check_gguf("gpt2", "gpt2", "gpt2", gpt2_hp); }
static void test_gptneox(void) { check_gguf("gptneox", "gptneox", "gptneox", gptneox_hp); }
static void test_bert(void) { check_gguf("bert", "bert", "bert", bert_hp); }
static void test_bert_cls(void) { check_gguf("bert-cls", "bert-cls", "bert", bert_cls_hp); }
static void test_llama3(void) { check_gguf("llama3", "llama3", "llama", llama3_hp); }
/* the factors come from the tensor: all 2 (the metadata as llama3's) is linear scaling by 2 */
static void test_llama3_freqs2(void) { check_gguf("llama3-freqs2", "llama3", "llama", llama3_hp); }

/* A copy of llama3.gguf whose rope_freqs.weight holds `bad` at pair 1: refused when opened,
 * naming the tensor. */
static void test_bad_rope_freqs(void)
{
    char src[4096], copy[300], out[300];
    if (fixture_path("gguf-families/llama3.gguf", src, sizeof src) < 0)
        SKIP("no llama3.gguf");
    const float bad[] = {0.0f, -1.0f, NAN};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        size_t len;
        char *bytes = test_read_file(src, &len);
        iflow_ggufsrc *s;
        CHECK(bytes && iflow_ggufsrc_open(&s, src) == 0, "open llama3.gguf: %s", iflow_errmsg());
        if (!bytes)
            return;
        const iflow_src_tensor *t = iflow_ggufsrc_find(s, "rope_freqs.weight");
        CHECK(t && t->nbytes == 16 && t->file_offset + 16 <= len, "rope_freqs.weight: 4 F32 factors");
        if (t && t->nbytes == 16 && t->file_offset + 16 <= len)
            memcpy(bytes + t->file_offset + 4, &bad[k], 4);
        iflow_ggufsrc_close(s);
        snprintf(copy, sizeof copy, "%s/bad-freqs.gguf", dir);
        snprintf(out, sizeof out, "%s/bad-freqs.ifs", dir);
        test_write_file(copy, bytes, len);
        free(bytes);
        iflow_convert_opts o = {.dtype = -1, .spec_dirs = specs, .n_spec_dirs = 1};
        iflow_model *m = NULL;
        CHECK(iflow_convert(copy, out, &o) == 0, "convert: %s", iflow_errmsg());
        CHECK_ERR(iflow_model_open(&m, out, 0), IFLOW_ERANGE, "bad-freqs.ifs", "rope_freqs[1]");
        iflow_model_close(m);
    }
}

/* Resolve spec NAME's GGUF variant against metadata text (JSON, as ggufsrc presents it). */
static json_t *resolve(const char *name, const char *arch, const char *metadata)
{
    iflow_spec *s;
    json_error_t je;
    json_t *cfg = json_loads(metadata, 0, &je), *out = NULL;
    CHECK(cfg != NULL, "metadata: %s", je.text);
    int rc = iflow_spec_find_source(&s, specs, 1, "gguf", arch);
    CHECK(rc == 0 && strcmp(s->name, name) == 0, "%s is served by %s: %s", arch, rc == 0 ? s->name : "?", iflow_errmsg());
    if (rc == 0) {
        CHECK(iflow_spec_resolve(s, cfg, &out) == 0, "resolve %s: %s", name, iflow_errmsg());
        iflow_spec_close(s);
    }
    json_decref(cfg);
    return out;
}

static double hparam(const json_t *resolved, const char *key)
{
    return json_number_value(json_object_get(json_object_get(resolved, "hparams"), key));
}

static const char *hparam_str(const json_t *resolved, const char *key)
{
    const char *s = json_string_value(json_object_get(json_object_get(resolved, "hparams"), key));
    return s ? s : "";
}

#define GEMMA_KEYS(arch, layers)                                                                                    \
    "{\"general\": {\"architecture\": \"" arch "\"}, \"" arch "\": {\"block_count\": " #layers                     \
    ", \"embedding_length\": 32, \"feed_forward_length\": 64, \"context_length\": 64, \"attention\": "              \
    "{\"head_count\": 4, \"layer_norm_rms_epsilon\": 1e-6, \"sliding_window\": 5}}, "                               \
    "\"tokenizer\": {\"ggml\": {\"tokens\": {\"count\": 128}}}, \"tensors\": {}}"

/* What a [gguf] section makes of metadata no fixture has: llama.cpp's 27B scales (46-layer
 * Gemma 2, 62-layer Gemma 3: [gguf.hparams.KEY=VALUE]), Gemma 3's pattern of 6 when the file
 * names none, BERT's pooling numbers; {general.architecture} keys in inherited sections. */
static void test_metadata_rules(void)
{
    json_t *r = resolve("gemma2", "gemma2", GEMMA_KEYS("gemma2", 46));
    CHECK(r && hparam(r, "attn_scale_dim") == 144 && hparam(r, "window_pattern") == 2 && hparam(r, "dim") == 32 &&
              hparam(r, "norm_offset") == 0,
          "gemma2 27B: scale by dim / n_heads (144), pattern 2, dim from gemma2.embedding_length");
    json_decref(r);
    r = resolve("gemma2", "gemma2", GEMMA_KEYS("gemma2", 42));
    CHECK(r && hparam(r, "attn_scale_dim") == 0, "gemma2 9B: scale by head_dim");
    json_decref(r);
    r = resolve("gemma3", "gemma3", GEMMA_KEYS("gemma3", 62));
    CHECK(r && hparam(r, "attn_scale_dim") == 168 && hparam(r, "window_pattern") == 6 && hparam(r, "sliding_window") == 5,
          "gemma3 27B: 168, every 6th layer global");
    json_decref(r);
    r = resolve("gemma3", "gemma3", GEMMA_KEYS("gemma3", 46)); /* gemma2's 27B rule is not gemma3's */
    CHECK(r && hparam(r, "attn_scale_dim") == 0, "gemma3 with 46 layers: head_dim");
    json_decref(r);
    /* exaone4: llama.cpp windows the 64-layer model alone (its window, a pattern of 4 unless the
     * file lists one; the global layers unrotated) */
    r = resolve("exaone4", "exaone4", GEMMA_KEYS("exaone4", 64));
    CHECK(r && hparam(r, "sliding_window") == 5 && hparam(r, "window_pattern") == 4 &&
              json_is_true(json_object_get(json_object_get(r, "hparams"), "nope_global")),
          "exaone4 32B: windowed, every 4th layer global and unrotated");
    json_decref(r);
    r = resolve("exaone4", "exaone4", GEMMA_KEYS("exaone4", 30));
    CHECK(r && hparam(r, "sliding_window") == 0, "exaone4 1.2B: no window, whatever the metadata");
    json_decref(r);
    /* glm4moe: block_count counts the nextn_predict_layers; none left is an error */
    static const char glm[] = "{\"general\": {\"architecture\": \"glm4moe\"}, \"glm4moe\": {\"block_count\": %d, "
                              "\"nextn_predict_layers\": 2, \"embedding_length\": 32, \"feed_forward_length\": 64, "
                              "\"attention\": {\"head_count\": 4}, \"expert_count\": 4, \"expert_used_count\": 2, "
                              "\"expert_feed_forward_length\": 16}, \"tokenizer\": {\"ggml\": {\"tokens\": "
                              "{\"count\": 128}}}}";
    for (int layers = 2; layers <= 5; layers += 3) {
        char text[600];
        iflow_hparams g;
        snprintf(text, sizeof text, glm, layers);
        r = resolve("glm4_moe", "glm4moe", text);
        if (layers == 5)
            CHECK(r && iflow_hparams_from_json(&g, r, "glm") == 0 && g.n_layers == 3, "glm4moe: 5 blocks, 2 extra: %s",
                  iflow_errmsg());
        else
            CHECK_ERR(r ? iflow_hparams_from_json(&g, r, "glm") : 0, IFLOW_ESHAPE, "counts 2 extra layers",
                      "leaving none");
        json_decref(r);
    }
    /* a factor without a type scales linearly, as llama.cpp reads it (older converters' key) */
    static const char llama[] = "{\"general\": {\"architecture\": \"llama\"}, \"llama\": {\"block_count\": 2, "
                                "\"embedding_length\": 32, \"feed_forward_length\": 64, \"attention\": {\"head_count\": 4}, "
                                "\"rope\": {\"scale_linear\": 4.0}}, \"tokenizer\": {\"ggml\": {\"tokens\": {\"count\": 128}}}}";
    r = resolve("llama", "llama", llama);
    iflow_hparams hp;
    CHECK(r && iflow_hparams_from_json(&hp, r, "llama") == 0 && hp.rope_scaling == IFLOW_ROPE_SCALING_LINEAR &&
              hp.rope_factor == 4.0f && !hp.rope_freqs,
          "llama.rope.scale_linear 4: linear scaling by 4 (%s)", iflow_errmsg());
    json_decref(r);
    static const char bert[] = "{\"general\": {\"architecture\": \"bert\"}, \"bert\": {\"block_count\": 2, "
                               "\"embedding_length\": 32, \"feed_forward_length\": 64, \"attention\": {\"head_count\": 4}, "
                               "\"pooling_type\": %d}, \"tokenizer\": {\"ggml\": {\"tokens\": {\"count\": 128}}}}";
    static const struct { int type; const char *pooling; } pools[] = {{1, "mean"}, {2, "cls"}, {0, "cls"}};
    for (size_t k = 0; k < sizeof pools / sizeof *pools; k++) {
        char text[512];
        snprintf(text, sizeof text, bert, pools[k].type);
        r = resolve("bert", "bert", text);
        CHECK(r && strcmp(hparam_str(r, "pooling"), pools[k].pooling) == 0 && json_is_true(json_object_get(
                                                                                     json_object_get(r, "hparams"), "normalize")),
              "bert.pooling_type %d: %s, normalized (got %s)", pools[k].type, pools[k].pooling, hparam_str(r, "pooling"));
        json_decref(r);
    }
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    RUN(test_qwen2);
    RUN(test_deepseek);
    RUN(test_gpt_oss);
    RUN(test_glm4_moe);
    RUN(test_qwen3);
    RUN(test_mixtral);
    RUN(test_mixtral_old);
    RUN(test_qwen3_moe);
    RUN(test_qwen2_moe);
    RUN(test_olmoe);
    RUN(test_granite);
    RUN(test_olmo2);
    RUN(test_stablelm);
    RUN(test_phi);
    RUN(test_starcoder2);
    RUN(test_nope);
    RUN(test_glm_exaone);
    RUN(test_ernie_seed);
    RUN(test_olmo);
    RUN(test_arcee);
    RUN(test_hunyuan);
    RUN(test_nemotron);
    RUN(test_mistral);
    RUN(test_gemma);
    RUN(test_gemma2);
    RUN(test_gemma3);
    RUN(test_phi3);
    RUN(test_phi3_longrope);
    RUN(test_gpt2);
    RUN(test_gptneox);
    RUN(test_bert);
    RUN(test_bert_cls);
    RUN(test_llama3);
    RUN(test_llama3_freqs2);
    RUN(test_bad_rope_freqs);
    RUN(test_metadata_rules);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_gguf_families");
}
