/*
 * test_families.c -- model families served by specs/ other than the Llama checkpoints of
 * ../shared, on the tiny random-weight Hugging Face models of tests/fixtures/families (made by
 * tests/fixtures/gen_family_refs.py with transformers): Qwen2 (q/k/v biases, rope base 1e6),
 * Mistral (sliding-window attention, a window of 5 over 16 positions), Gemma (GeGLU, embeddings
 * scaled by sqrt(dim), RMSNorm by 1 + w, one kv head), Gemma 2 (post norms, attention and
 * logit soft-capping, query_pre_attn_scalar, local and global layers alternating), Gemma 3
 * (qk-norm, local layers with a rope base of their own, the pattern from layer_types), Phi-3 (q/k/v and gate/up as row ranges
 * of fused qkv_proj and gate_up_proj, a window of 6), GPT-2 (LayerNorm, learned positions, a
 * plain GELU FFN, biases, Conv1D weights read transposed), Llama with Llama 3.1's rope scaling.
 * Each folder converts with
 * its spec, and
 * the logits of every position of refs.json's ids match transformers' float64 forward within
 * 1e-4 (absolute; the logits are O(1)), fed as one prefill and token by token.
 */
#include "check.h"
#include "testlib.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "kernels/cpu/kernels.h"
#include "libcore/engine/footprint.h"
#include "libcore/engine/model.h"
#include "libcore/engine/observe.h"
#include "libcore/engine/plan.h"
#include "libcore/formats/quant.h"
#include "libcore/formats/shard.h"
#include "libcore/formats/spec.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static char dir[] = "/tmp/iflow-test-families-XXXXXX";

static const char *fixture(const char *family)
{
    char rel[256];
    snprintf(rel, sizeof rel, "families/%s", family);
    return test_fixture(rel);
}

/* max |iflow - reference| over every position, prefill (T = n) or one token at a time. */
static double worst_diff(iflow_model *m, const json_t *ids, const json_t *want, int one_by_one)
{
    const int n = (int)json_array_size(ids), V = iflow_model_hparams(m)->vocab_size;
    int32_t *tok = malloc(sizeof *tok * (size_t)n);
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)n);
    for (int i = 0; i < n; i++)
        tok[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
    iflow_ctx *c;
    double worst = INFINITY;
    if (iflow_ctx_open(&c, m, 64, 1) == 0) {
        int rc = 0;
        if (one_by_one)
            for (int i = 0; i < n && rc == 0; i++)
                rc = iflow_ctx_eval(c, tok + i, 1, logits + (size_t)i * V, 0);
        else
            rc = iflow_ctx_eval(c, tok, n, logits, 1);
        if (rc == 0) {
            worst = 0;
            for (int i = 0; i < n; i++) {
                const json_t *row = json_array_get(want, (size_t)i);
                for (int v = 0; v < V; v++) {
                    double d = fabs(logits[(size_t)i * V + v] - json_real_value(json_array_get(row, (size_t)v)));
                    worst = d > worst || d != d ? d : worst;
                }
            }
        }
        iflow_ctx_close(c);
    }
    free(tok);
    free(logits);
    return worst;
}

/* The family's fixture converted with specs/ (matrices as dtype: -1, as the source) into
 * DIR/NAME.ifs and opened, and its refs.json: 0, or -1 (the failure checked and reported; a
 * missing fixture skips the test). */
static int open_fixture_as(const char *family, int dtype, const char *name, iflow_model **m, json_t **r)
{
    const char *fx = fixture(family);
    if (!fx)
        SKIP_RET(-1, "no fixture for %s (run from the repository root)", family);
    char src[4096], out[300], refs[4200];
    snprintf(src, sizeof src, "%s", fx);
    snprintf(out, sizeof out, "%s/%s.ifs", dir, name);
    snprintf(refs, sizeof refs, "%s/refs.json", src);
    const char *specs[] = {"specs"};
    iflow_convert_opts o = {.dtype = dtype, .spec_dirs = specs, .n_spec_dirs = 1};
    CHECK(iflow_convert(src, out, &o) == 0, "%s: convert: %s", family, iflow_errmsg());
    json_error_t je;
    *r = json_load_file(refs, 0, &je);
    CHECK(*r != NULL, "%s: %s: %s", family, refs, je.text);
    if (!*r || iflow_model_open(m, out, 0) < 0) {
        CHECK(0, "%s: open: %s", family, iflow_errmsg());
        json_decref(*r);
        return -1;
    }
    return 0;
}

static int open_fixture(const char *family, iflow_model **m, json_t **r)
{
    return open_fixture_as(family, -1, family, m, r);
}

/* check: what the family's spec must have made of its config (NULL: nothing to check) */
static void check_family(const char *family, int (*check)(const iflow_hparams *hp))
{
    iflow_model *m;
    json_t *r;
    if (open_fixture(family, &m, &r) < 0)
        return;
    CHECK(!check || check(iflow_model_hparams(m)), "%s: the spec's hyperparameters", family);
    const json_t *ids = json_object_get(r, "ids"), *logits = json_object_get(r, "logits");
    double a = worst_diff(m, ids, logits, 0), b = worst_diff(m, ids, logits, 1);
    printf("%s: max |logit - transformers float64| = %.2e (prefill), %.2e (token by token)\n", family, a, b);
    CHECK(a <= 1e-4 && b <= 1e-4, "%s: logits differ from transformers by %.3g / %.3g", family, a, b);
    iflow_model_close(m);
    json_decref(r);
}

/* The plan `text` (it splits layers over two CPU devices) refused for the family's converted
 * model when it is placed: IFLOW_EUNSUPPORTED, the message naming `why` and "split over devices". */
static void check_split_refused(const char *family, const char *text, const char *why)
{
    char out[300], plan_path[300];
    snprintf(out, sizeof out, "%s/%s.ifs", dir, family);
    snprintf(plan_path, sizeof plan_path, "%s/%s-plan.ini", dir, family);
    test_write_file(plan_path, text, strlen(text));
    iflow_model *m;
    iflow_plan p;
    iflow_device *devs[IFLOW_PLAN_MAX_DEVICES] = {0};
    if (iflow_model_open(&m, out, 0) < 0)
        return;
    CHECK(iflow_plan_load(&p, plan_path) == 0 && iflow_plan_open_devices(&p, -1, devs) == 0, "plan: %s",
          iflow_errmsg());
    CHECK_ERR(iflow_model_place_plan(m, &p, devs, 16), IFLOW_EUNSUPPORTED, why, "split over devices");
    iflow_model_close(m);
    iflow_plan_close_devices(&p, devs);
}

/* biases on q, k, v only; transformers 5 keeps rope_theta in rope_parameters */
static int qwen2_hp(const iflow_hparams *hp)
{
    return hp->qkv_bias && !hp->attn_bias && hp->rope_theta == 1e6f && !hp->tie_embeddings;
}

/* YaRN: factor 4 over an original context of 8, the scores scaled by (0.1 ln 4 + 1)^2 */
static int qwen2_yarn_hp(const iflow_hparams *hp)
{
    const double a = 0.1 * log(4.0) + 1.0;
    return hp->rope_scaling == IFLOW_ROPE_SCALING_YARN && hp->rope_factor == 4.0f && hp->rope_orig_ctx == 8 &&
           fabs(hp->attn_scale - a * a / sqrt(8.0)) < 1e-6;
}

static void test_qwen2(void)
{
    check_family("qwen2", qwen2_hp);
    check_family("qwen2-yarn", qwen2_yarn_hp);
}

/* a window of 5 positions (the fixture's logits differ without it: gen_family_refs.py checks) */
static int mistral_hp(const iflow_hparams *hp)
{
    return hp->sliding_window == 5 && !hp->qkv_bias && hp->tie_embeddings && hp->head_dim == 8;
}

static void test_mistral(void) { check_family("mistral", mistral_hp); }

/* GeGLU, sqrt(dim)-scaled embeddings, one kv head */
static int gemma_hp(const iflow_hparams *hp)
{
    return hp->activation == IFLOW_ACT_GELU_TANH && hp->embed_scale == (float)sqrt(32.0) && hp->n_kv_heads == 1 &&
           hp->tie_embeddings;
}

static void test_gemma(void) { check_family("gemma", gemma_hp); }

/* post norms, soft caps, query_pre_attn_scalar 12, local layers 0 and 2 (window 5), global 1 */
static int gemma2_hp(const iflow_hparams *hp)
{
    return hp->post_norms && hp->attn_softcap == 0.3f && hp->logit_softcap == 0.8f && hp->sliding_window == 5 &&
           hp->window_pattern == 2 && hp->attn_scale == 1.0f / sqrtf(12.0f) && hp->activation == IFLOW_ACT_GELU_TANH;
}

static void test_gemma2(void) { check_family("gemma2", gemma2_hp); }

/* qk-norm; layer_types make every 3rd layer global (the config's _sliding_window_pattern says 6);
 * local layers rotate with base 10000, the global one with 1e6 */
static int gemma3_hp(const iflow_hparams *hp)
{
    return hp->qk_norm && hp->window_pattern == 3 && hp->sliding_window == 5 && hp->rope_theta == 1e6f &&
           hp->rope_theta_local == 1e4f && hp->attn_softcap == 0 && hp->logit_softcap == 0 && hp->post_norms;
}

static void test_gemma3(void) { check_family("gemma3", gemma3_hp); }

/* q, k, v and gate, up are row ranges of fused matrices; a window of 6 */
static int phi3_hp(const iflow_hparams *hp)
{
    return hp->sliding_window == 6 && hp->n_kv_heads == 2 && !hp->tie_embeddings && hp->ffn_dim == 48;
}

/* longrope: factor 64 / 8, attention factor sqrt(1 + ln 8 / ln 8) = sqrt(2): folded into the
 * scores' scale when the whole head rotates, on the rotated half alone (-partial) */
static int phi3_longrope_hp(const iflow_hparams *hp)
{
    return hp->rope_scaling == IFLOW_ROPE_SCALING_LONGROPE && hp->rope_orig_ctx == 8 && hp->rope_factor == 8.0f &&
           hp->rope_n_factors == 4 && hp->rope_long[3] == 64.0f && hp->rope_rot_scale == 1.0f &&
           fabs(hp->attn_scale - 2.0 / sqrt(8.0)) < 1e-6;
}

static int phi3_longrope_partial_hp(const iflow_hparams *hp)
{
    return hp->rope_scaling == IFLOW_ROPE_SCALING_LONGROPE && hp->rope_dim == 4 && hp->rope_n_factors == 2 &&
           fabsf(hp->rope_rot_scale - sqrtf(2.0f)) < 1e-6f && fabs(hp->attn_scale - 1 / sqrt(8.0)) < 1e-7;
}

/* The first 8 ids in a context of 8 (not past the original one): the short factors, as
 * transformers takes them for a sequence that short (refs' logits_short). */
static void check_longrope_short(const char *family)
{
    char path[300];
    snprintf(path, sizeof path, "%s/%s.ifs", dir, family);
    char refs[4200];
    const char *fx = fixture(family);
    if (!fx)
        return;
    snprintf(refs, sizeof refs, "%s/refs.json", fx);
    json_t *r = json_load_file(refs, 0, NULL);
    iflow_model *m;
    if (!r || iflow_model_open(&m, path, 0) < 0) {
        CHECK(0, "%s: open: %s", family, iflow_errmsg());
        json_decref(r);
        return;
    }
    const json_t *want = json_object_get(r, "logits_short"), *ids = json_object_get(r, "ids");
    const int n = (int)json_array_size(want), V = iflow_model_hparams(m)->vocab_size;
    int32_t tok[16];
    float *logits = malloc(sizeof(float) * (size_t)V * 16);
    iflow_ctx *c;
    double worst = INFINITY;
    for (int i = 0; i < n && i < 16; i++)
        tok[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
    if (n == 8 && iflow_ctx_open(&c, m, 8, 1) == 0) {
        if (iflow_ctx_eval(c, tok, n, logits, 1) == 0) {
            worst = 0;
            for (int i = 0; i < n; i++)
                for (int v = 0; v < V; v++) {
                    double d = fabs(logits[(size_t)i * V + v] -
                                    json_real_value(json_array_get(json_array_get(want, (size_t)i), (size_t)v)));
                    worst = d > worst || d != d ? d : worst;
                }
        }
        iflow_ctx_close(c);
    }
    printf("%s: short factors (a context of 8): max |logit - transformers float64| = %.2e\n", family, worst);
    CHECK(worst <= 1e-4, "%s: the short factors' logits differ from transformers by %.3g", family, worst);
    free(logits);
    iflow_model_close(m);
    json_decref(r);
}

static void test_phi3(void)
{
    check_family("phi3", phi3_hp);
    check_family("phi3-longrope", phi3_longrope_hp);
    check_longrope_short("phi3-longrope");
    check_family("phi3-longrope-partial", phi3_longrope_partial_hp);
    check_longrope_short("phi3-longrope-partial");
}

/* Llama 3.1's rope scaling (factor 8, low 1, high 4, original context 16: the fixture's scores
 * are sharp enough that it moves the logits by 0.2) */
static int llama3_hp(const iflow_hparams *hp)
{
    return hp->rope_scaling == IFLOW_ROPE_SCALING_LLAMA3 && hp->rope_factor == 8 && hp->rope_orig_ctx == 16 &&
           !hp->rope_freqs;
}

static void test_llama3(void) { check_family("llama3", llama3_hp); }

/* LayerNorm, learned positions, plain GELU FFN of 4 * dim, biases everywhere */
static int gpt2_hp(const iflow_hparams *hp)
{
    return hp->norm == IFLOW_NORM_LAYER && hp->position == IFLOW_POS_LEARNED && hp->ffn == IFLOW_FFN_PLAIN &&
           hp->ffn_dim == 128 && hp->attn_bias && hp->mlp_bias && hp->max_seq == 64;
}

static void test_gpt2(void)
{
    check_family("gpt2", gpt2_hp);
    /* past the 64 learned positions: refused, not read out of bounds */
    char out[300];
    snprintf(out, sizeof out, "%s/gpt2.ifs", dir);
    iflow_model *m;
    iflow_ctx *c;
    if (iflow_model_open(&m, out, 0) < 0)
        return;
    int32_t ids[65] = {0};
    float *logits = malloc(sizeof(float) * 128);
    CHECK(iflow_ctx_open(&c, m, 128, 1) == 0, "ctx: %s", iflow_errmsg());
    CHECK_ERR(iflow_ctx_eval(c, ids, 65, logits, 0), IFLOW_ERANGE, "position 64", "64 learned positions");
    iflow_ctx_close(c);
    free(logits);
    iflow_model_close(m);
}

/* qk-norm with a head_dim of its own (12 x 4 heads over a dim of 32), tied embeddings */
static int qwen3_hp(const iflow_hparams *hp)
{
    return hp->qk_norm && hp->head_dim == 12 && !hp->qkv_bias && hp->tie_embeddings && hp->rope_theta == 1e6f &&
           !hp->n_experts;
}

static void test_qwen3(void) { check_family("qwen3", qwen3_hp); }

/* 4 experts of 24 columns, 2 per token, renormalized; no dense FFN */
static int mixtral_hp(const iflow_hparams *hp)
{
    return hp->n_experts == 4 && hp->n_experts_used == 2 && hp->expert_ffn_dim == 24 && hp->expert_norm &&
           !hp->shared_expert && hp->head_dim == 8 && hp->sliding_window == 0;
}

/* 6 experts of 20 columns, 3 per token, renormalized (norm_topk_prob), qk-norm */
static int qwen3_moe_hp(const iflow_hparams *hp)
{
    return hp->n_experts == 6 && hp->n_experts_used == 3 && hp->expert_ffn_dim == 20 && hp->expert_norm &&
           !hp->shared_expert && hp->qk_norm;
}

/* 4 experts of 24 columns, 2 per token, not renormalized, a shared expert of 40 with its gate */
static int qwen2_moe_hp(const iflow_hparams *hp)
{
    return hp->n_experts == 4 && hp->n_experts_used == 2 && hp->expert_ffn_dim == 24 && !hp->expert_norm &&
           hp->shared_expert && hp->shared_expert_gate && hp->ffn_dim == 40 && hp->qkv_bias;
}

/* A step of three sequences (rows of one choose other experts than another's) gives each
 * sequence's logits as it alone would (the experts' rows gathered and scattered back). */
static void check_moe_step(const char *name)
{
    char path[300];
    snprintf(path, sizeof path, "%s/%s.ifs", dir, name);
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0)
        return;
    const int V = iflow_model_hparams(m)->vocab_size;
    const int32_t seqs[3][5] = {{1, 17, 5, 99, 42}, {3, 64, 7, 120, 8}, {8, 31, 77, 2, 50}};
    float *alone = malloc(sizeof(float) * 15 * (size_t)V), *together = malloc(sizeof(float) * 15 * (size_t)V);
    iflow_ctx *c[3];
    for (int i = 0; i < 3; i++) {
        CHECK(iflow_ctx_open(&c[i], m, 16, 1) == 0, "ctx: %s", iflow_errmsg());
        CHECK(iflow_ctx_eval(c[i], seqs[i], 5, alone + (size_t)i * 5 * V, 1) == 0, "eval: %s", iflow_errmsg());
        iflow_ctx_reset(c[i]);
    }
    /* then the three as one step of 15 rows */
    iflow_ctx *sc;
    iflow_kv *kv;
    CHECK(iflow_kv_open(&kv, m, IFLOW_DT_F32, 16, 3) == 0, "kv: %s", iflow_errmsg());
    CHECK(iflow_ctx_open_steps(&sc, m, 1) == 0, "steps ctx: %s", iflow_errmsg());
    int32_t tables[3][1] = {{0}, {1}, {2}};
    iflow_step_seq st[3];
    for (int i = 0; i < 3; i++)
        st[i] = (iflow_step_seq){.ids = seqs[i], .n = 5, .table = tables[i], .logits = together + (size_t)i * 5 * V,
                                 .n_out = 5};
    CHECK(iflow_ctx_step(sc, kv, st, 3) == 0, "step: %s", iflow_errmsg());
    double worst = 0;
    for (size_t i = 0; i < 15 * (size_t)V; i++)
        worst = fmax(worst, fabs((double)alone[i] - together[i]));
    CHECK(worst == 0, "%s: a step of three sequences differs from each alone by %.3g", name, worst);
    /* decode on two threads (each expert's products split over them) as on one, bit for bit */
    float *one = malloc(sizeof(float) * 5 * (size_t)V), *two = malloc(sizeof(float) * 5 * (size_t)V);
    iflow_ctx *c1, *c2;
    CHECK(iflow_ctx_open(&c1, m, 16, 1) == 0 && iflow_ctx_open(&c2, m, 16, 2) == 0, "ctx: %s", iflow_errmsg());
    for (int t = 0; t < 5; t++)
        CHECK(iflow_ctx_eval(c1, seqs[1] + t, 1, one + (size_t)t * V, 0) == 0 &&
                  iflow_ctx_eval(c2, seqs[1] + t, 1, two + (size_t)t * V, 0) == 0,
              "eval: %s", iflow_errmsg());
    CHECK(memcmp(one, two, sizeof(float) * 5 * (size_t)V) == 0, "%s: decode on two threads differs from one", name);
    iflow_ctx_close(c1);
    iflow_ctx_close(c2);
    free(one);
    free(two);
    iflow_ctx_close(sc);
    iflow_kv_close(kv);
    for (int i = 0; i < 3; i++)
        iflow_ctx_close(c[i]);
    free(alone);
    free(together);
    iflow_model_close(m);
}

/* An importance matrix of a mixture (observe.h): each expert's entries count the rows routed to
 * it, n_experts_used per token in all, and there is no dense FFN's entry. */
static void check_moe_imatrix(const char *name)
{
    char path[300];
    snprintf(path, sizeof path, "%s/%s.ifs", dir, name);
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0)
        return;
    const iflow_hparams *hp = iflow_model_hparams(m);
    const int32_t ids[12] = {1, 17, 5, 99, 42, 3, 64, 7, 120, 8, 8, 31};
    iflow_imatrix_collector *col;
    iflow_ctx *c;
    iflow_imatrix *im = NULL;
    float *logits = malloc(sizeof(float) * (size_t)hp->vocab_size);
    CHECK(iflow_imatrix_collector_open(&col, hp) == 0 && iflow_ctx_open(&c, m, 16, 1) == 0, "open: %s", iflow_errmsg());
    CHECK(iflow_ctx_set_observer(c, iflow_imatrix_collector_observe, col) == 0, "observe");
    CHECK(iflow_ctx_eval(c, ids, 12, logits, 0) == 0, "eval: %s", iflow_errmsg());
    iflow_ctx_set_observer(c, NULL, NULL);
    CHECK(iflow_imatrix_collector_result(col, &im) == 0, "result: %s", iflow_errmsg());
    for (int l = 0; im && l < hp->n_layers; l++) {
        uint64_t rows = 0;
        char g[48], d[48];
        for (int e = 0; e < hp->n_experts; e++) {
            snprintf(g, sizeof g, "blk.%d.ffn_gate.%d", l, e);
            snprintf(d, sizeof d, "blk.%d.ffn_down.%d", l, e);
            const iflow_imatrix_entry *eg = iflow_imatrix_find(im, g), *ed = iflow_imatrix_find(im, d);
            CHECK(!eg == !ed && (!eg || (eg->count == ed->count && eg->K == hp->dim && ed->K == hp->expert_ffn_dim)),
                  "%s: expert %d's entries agree", name, e);
            rows += eg ? eg->count : 0;
        }
        const int moe = iflow_layer_moe(hp, l); /* a dense layer's experts see nothing: it has none */
        CHECK(rows == (moe ? 12u * (uint64_t)hp->n_experts_used : 0), "%s: layer %d's experts saw %llu rows, want %d",
              name, l, (unsigned long long)rows, moe ? 12 * hp->n_experts_used : 0);
        snprintf(g, sizeof g, "blk.%d.ffn_gate", l);
        CHECK(!iflow_imatrix_find(im, g) == (moe && !hp->shared_expert),
              "%s: a dense ffn_gate entry only for a dense layer or a shared expert", name);
    }
    iflow_imatrix_free(im);
    iflow_ctx_close(c);
    iflow_imatrix_collector_close(col);
    free(logits);
    iflow_model_close(m);
}

static void test_mixtral(void)
{
    check_family("mixtral", mixtral_hp);
    check_moe_step("mixtral");
    check_moe_imatrix("mixtral");
    /* a plan that splits a layer's heads and FFN columns over two devices is refused, naming the
     * block (moe.c computes whole layers) */
    check_split_refused("mixtral",
                        "[plan]\nlayers = 2\nheads = 4\nkv_heads = 2\nffn = 24\n[device cpu:0]\nheads = 0-1\n"
                        "ffn = 0-11\n[device cpu:1]\nheads = 2-3\nffn = 12-23\n",
                        "layer 0 is a mixture of experts");
}

/* The experts in F16, which the CPU packs for its BF16 product where it has one (AMX or
 * AVX512-BF16: the products round activations to BF16), as the dense matrices: against the
 * float64 reference within 2e-2 (the logits are O(1); F16 weights and BF16 activations), and a
 * step of three sequences equal to each alone. */
static void test_mixtral_f16(void)
{
    iflow_model *m;
    json_t *r;
    if (open_fixture_as("mixtral", IFLOW_DT_F16, "mixtral-f16", &m, &r) < 0)
        return;
    const json_t *ids = json_object_get(r, "ids"), *logits = json_object_get(r, "logits");
    double a = worst_diff(m, ids, logits, 0), b = worst_diff(m, ids, logits, 1);
    printf("mixtral f16: max |logit - transformers float64| = %.2e (prefill), %.2e (token by token)\n", a, b);
    CHECK(a <= 2e-2 && b <= 2e-2, "mixtral f16: logits differ from transformers by %.3g / %.3g", a, b);
    iflow_model_close(m);
    json_decref(r);
    check_moe_step("mixtral-f16");
}

static void test_qwen3_moe(void) { check_family("qwen3_moe", qwen3_moe_hp); }

/* q and k normed over their whole projections (32 and 16 wide), 8 experts of 16, 2 per token */
static int olmoe_hp(const iflow_hparams *hp)
{
    return hp->qk_norm && hp->qk_norm_full && hp->n_experts == 8 && hp->n_experts_used == 2 &&
           hp->expert_ffn_dim == 16 && !hp->expert_norm && !hp->shared_expert;
}

static void test_olmoe(void)
{
    check_family("olmoe", olmoe_hp);
    check_moe_step("olmoe");
}

static void test_qwen2_moe(void)
{
    check_family("qwen2_moe", qwen2_moe_hp);
    check_moe_step("qwen2_moe");
    check_moe_imatrix("qwen2_moe");
}

/* parallel residual, rotary on half of each head (4 of 8), exact GELU, biases everywhere; q, k
 * and v are every third run of head_dim rows of query_key_value */
static int gptneox_hp(const iflow_hparams *hp)
{
    return hp->parallel_residual && hp->rope_dim == 4 && hp->head_dim == 8 && hp->activation == IFLOW_ACT_GELU &&
           hp->norm == IFLOW_NORM_LAYER && hp->ffn == IFLOW_FFN_PLAIN && hp->attn_bias && hp->mlp_bias &&
           !hp->tie_embeddings;
}

static void test_gptneox(void)
{
    check_family("gptneox", gptneox_hp);
    /* its layers cannot be split over devices (each sub-block's parts are summed on their own):
     * the plan is refused when the model is placed, naming the block, not computed as a
     * sequential residual */
    check_split_refused("gptneox",
                        "[plan]\nlayers = 2\nheads = 4\nkv_heads = 4\nffn = 64\n[device cpu:0]\nheads = 0-1\n"
                        "ffn = 0-31\n[device cpu:1]\nheads = 2-3\nffn = 32-63\n",
                        "layer 0 has a parallel residual");
}

/* The plan `text` (it splits each layer's heads and FFN columns over two CPU devices) placed on
 * the family's converted model: the logits still within 1e-4 of transformers' (each part's
 * partial sums go through the same scales and biases once). */
static void check_split_matches(const char *family, const char *text)
{
    char out[300], plan_path[300], refs[4200];
    const char *fx = fixture(family);
    snprintf(out, sizeof out, "%s/%s.ifs", dir, family);
    snprintf(plan_path, sizeof plan_path, "%s/%s-split.ini", dir, family);
    snprintf(refs, sizeof refs, "%s/refs.json", fx ? fx : ".");
    test_write_file(plan_path, text, strlen(text));
    iflow_model *m;
    iflow_plan p;
    iflow_device *devs[IFLOW_PLAN_MAX_DEVICES] = {0};
    json_t *r = json_load_file(refs, 0, NULL);
    if (!r || iflow_model_open(&m, out, 0) < 0) {
        CHECK(0, "%s: open: %s", family, iflow_errmsg());
        json_decref(r);
        return;
    }
    CHECK(iflow_plan_load(&p, plan_path) == 0 && iflow_plan_open_devices(&p, -1, devs) == 0, "plan: %s",
          iflow_errmsg());
    CHECK(iflow_model_place_plan(m, &p, devs, 16) == 0, "%s: place: %s", family, iflow_errmsg());
    const json_t *ids = json_object_get(r, "ids"), *logits = json_object_get(r, "logits");
    double a = worst_diff(m, ids, logits, 0), b = worst_diff(m, ids, logits, 1);
    printf("%s split over two devices: max |logit - transformers float64| = %.2e / %.2e\n", family, a, b);
    CHECK(a <= 1e-4 && b <= 1e-4, "%s split: logits differ from transformers by %.3g / %.3g", family, a, b);
    iflow_model_close(m);
    iflow_plan_close_devices(&p, devs);
    json_decref(r);
}

/* Granite's multipliers: embeddings x 3, scores x 0.3, sub-block outputs x 0.5, logits / 4 */
static int granite_hp(const iflow_hparams *hp)
{
    return hp->embed_scale == 3.0f && hp->attn_scale == 0.3f && hp->residual_scale == 0.5f &&
           hp->logit_scale == 0.25f && hp->tie_embeddings && !hp->n_experts;
}

static void test_granite(void)
{
    check_family("granite", granite_hp);
    /* the residual scale applies to each part's partial sum: a column split matches too */
    check_split_matches("granite", "[plan]\nlayers = 2\nheads = 4\nkv_heads = 2\nffn = 64\n[device cpu:0]\n"
                                   "heads = 0-1\nffn = 0-31\n[device cpu:1]\nheads = 2-3\nffn = 32-63\n");
}

/* the multipliers and 4 experts of 24 columns (rows of input_linear [4][48][32]), 2 per token,
 * the softmax of the chosen logits (renormalized); a shared expert of 40 in the second */
static int granitemoe_hp(const iflow_hparams *hp)
{
    return hp->residual_scale == 0.5f && hp->logit_scale == 0.25f && hp->n_experts == 4 && hp->n_experts_used == 2 &&
           hp->expert_ffn_dim == 24 && hp->expert_norm && !hp->shared_expert;
}

static int granitemoeshared_hp(const iflow_hparams *hp)
{
    return hp->residual_scale == 0.5f && hp->n_experts == 4 && hp->expert_ffn_dim == 24 && hp->shared_expert &&
           !hp->shared_expert_gate && hp->ffn_dim == 40 && !hp->tie_embeddings;
}

static void test_granitemoe(void)
{
    check_family("granitemoe", granitemoe_hp);
    check_moe_step("granitemoe");
    check_family("granitemoeshared", granitemoeshared_hp);
    check_moe_step("granitemoeshared");
}

/* norms after the sub-blocks only, q/k norms over the projections; OLMo 3: two windowed layers
 * (5) then a global one */
static int olmo2_hp(const iflow_hparams *hp)
{
    return hp->post_norms_only && hp->post_norms && hp->qk_norm && hp->qk_norm_full && hp->rope_theta == 5e5f &&
           hp->sliding_window == 0;
}

static int olmo3_hp(const iflow_hparams *hp)
{
    return hp->post_norms_only && hp->qk_norm_full && hp->sliding_window == 5 && hp->window_pattern == 3 &&
           hp->rope_theta == 5e5f;
}

static void test_olmo2(void)
{
    check_family("olmo2", olmo2_hp);
    check_family("olmo3", olmo3_hp);
}

/* LayerNorm, rotary on half of each head (4 of 8), q/k/v biases without o's, a sequential
 * residual; stablelm-par: a quarter of each head and a parallel residual over one norm */
static int stablelm_hp(const iflow_hparams *hp)
{
    return hp->norm == IFLOW_NORM_LAYER && hp->rope_dim == 4 && hp->qkv_bias && !hp->attn_bias &&
           !hp->parallel_residual && hp->ffn == IFLOW_FFN_GATED;
}

static int stablelm_par_hp(const iflow_hparams *hp)
{
    return hp->norm == IFLOW_NORM_LAYER && hp->rope_dim == 2 && !hp->qkv_bias && hp->parallel_residual;
}

static void test_stablelm(void)
{
    check_family("stablelm", stablelm_hp);
    check_family("stablelm-par", stablelm_par_hp);
}

/* Phi-2: a parallel residual over one LayerNorm, rotary on half of each head, tanh GELU, the
 * logits' bias */
static int phi_hp(const iflow_hparams *hp)
{
    return hp->parallel_residual && hp->rope_dim == 4 && hp->activation == IFLOW_ACT_GELU_TANH &&
           hp->ffn == IFLOW_FFN_PLAIN && hp->attn_bias && hp->mlp_bias && hp->logits_bias && !hp->tie_embeddings;
}

static void test_phi(void) { check_family("phi", phi_hp); }

/* LayerNorm, biased GQA, tanh-GELU plain FFN with biases, tied embeddings */
static int starcoder2_hp(const iflow_hparams *hp)
{
    return hp->norm == IFLOW_NORM_LAYER && hp->attn_bias && hp->mlp_bias && hp->ffn == IFLOW_FFN_PLAIN &&
           hp->activation == IFLOW_ACT_GELU_TANH && hp->n_kv_heads == 2 && hp->tie_embeddings &&
           hp->sliding_window == 0;
}

static void test_starcoder2(void) { check_family("starcoder2", starcoder2_hp); }

/* SmolLM3: layer 3 of 4 unrotated (no_rope_layers 1 1 1 0) */
static int smollm3_hp(const iflow_hparams *hp)
{
    return hp->nope_pattern == 4 && iflow_layer_rotates(hp, 2) && !iflow_layer_rotates(hp, 3) && hp->tie_embeddings;
}

/* Cohere: a parallel residual over one LayerNorm without a bias, interleaved rope, logits x 0.5;
 * Cohere 2: three windowed layers (5) rotated, then a global one unrotated */
static int cohere_hp(const iflow_hparams *hp)
{
    return hp->norm == IFLOW_NORM_LAYER && !iflow_norm_biased(hp) && hp->parallel_residual &&
           hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->logit_scale == 0.5f && hp->tie_embeddings &&
           !hp->nope_pattern;
}

static int cohere2_hp(const iflow_hparams *hp)
{
    return !iflow_norm_biased(hp) && hp->parallel_residual && hp->sliding_window == 5 && hp->window_pattern == 4 &&
           hp->nope_pattern == 4 && iflow_layer_rotates(hp, 0) && !iflow_layer_rotates(hp, 3);
}

static void test_nope(void)
{
    check_family("smollm3", smollm3_hp);
    check_family("cohere", cohere_hp);
    check_family("cohere2", cohere2_hp);
}

/* GLM: rotary on 4 of 8 dimensions in interleaved pairs, q/k/v biases, gate and up as rows of
 * gate_up_proj; GLM-4-0414: post norms beside the pre norms */
static int glm_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->rope_dim == 4 && hp->qkv_bias && !hp->attn_bias &&
           !hp->post_norms;
}

static int glm4_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->rope_dim == 4 && hp->qkv_bias && hp->post_norms &&
           !hp->post_norms_only;
}

/* EXAONE 4: post norms only, per-head q/k norms; -swa: three windowed layers (5), then an
 * unrotated global one */
static int exaone4_hp(const iflow_hparams *hp)
{
    return hp->post_norms_only && hp->qk_norm && !hp->qk_norm_full && hp->sliding_window == 0 && !hp->nope_pattern;
}

static int exaone4_swa_hp(const iflow_hparams *hp)
{
    return hp->post_norms_only && hp->qk_norm && hp->sliding_window == 5 && hp->window_pattern == 4 &&
           hp->nope_pattern == 4;
}

static void test_glm_exaone(void)
{
    check_family("glm", glm_hp);
    check_family("glm4", glm4_hp);
    check_family("exaone4", exaone4_hp);
    check_family("exaone4-swa", exaone4_swa_hp);
}

/* ERNIE 4.5: interleaved rope over the whole head, biases everywhere, tied; Seed-OSS: q/k/v
 * biases without the output's, head_dim 12 */
static int ernie4_5_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_INTERLEAVED && hp->rope_dim == 8 && hp->attn_bias && hp->mlp_bias &&
           hp->tie_embeddings;
}

static int seed_oss_hp(const iflow_hparams *hp)
{
    return hp->rope_layout == IFK_ROPE_HALF && hp->qkv_bias && !hp->attn_bias && hp->head_dim == 12;
}

static void test_ernie_seed(void)
{
    check_family("ernie4_5", ernie4_5_hp);
    check_family("seed_oss", seed_oss_hp);
}

/* OLMo 1: LayerNorms without parameters (no norm records), q/k/v clamped to 0.3; OLMoE with its
 * clamp (0.05) after the q/k norms */
static int olmo_hp(const iflow_hparams *hp)
{
    return hp->norm == IFLOW_NORM_LAYER && hp->norm_no_weight && !iflow_norm_biased(hp) && hp->clip_qkv == 0.3f;
}

static int olmoe_clip_hp(const iflow_hparams *hp) { return hp->qk_norm_full && hp->clip_qkv == 0.05f; }

static void test_olmo(void)
{
    check_family("olmo", olmo_hp);
    check_family("olmoe-clip", olmoe_clip_hp);
}

/* Arcee: a plain FFN with the squared ReLU */
static int arcee_hp(const iflow_hparams *hp)
{
    return hp->ffn == IFLOW_FFN_PLAIN && hp->activation == IFLOW_ACT_RELU2 && hp->rope_layout == IFK_ROPE_HALF;
}

static void test_arcee(void) { check_family("arcee", arcee_hp); }

/* Hunyuan: per-head q/k norms after rope; alpha 1000 stretches the base to 1e4 * 1000^(8/6) = 1e8 */
static int hunyuan_hp(const iflow_hparams *hp)
{
    return hp->qk_norm && hp->qk_norm_late && !hp->qk_norm_full && fabsf(hp->rope_theta - 1e8f) < 1e3f &&
           hp->rope_scaling == IFLOW_ROPE_SCALING_NONE && hp->tie_embeddings;
}

static void test_hunyuan(void)
{
    check_family("hunyuan_dense", hunyuan_hp);
    /* its cached keys are normed after their rotation: a context shift (which rotates them) is refused */
    char path[300];
    snprintf(path, sizeof path, "%s/hunyuan_dense.ifs", dir);
    iflow_model *m;
    iflow_kv *kv;
    const char *why = NULL;
    if (iflow_model_open(&m, path, 0) < 0)
        return;
    CHECK(iflow_kv_open(&kv, m, IFLOW_DT_F32, 16, 2) == 0, "kv: %s", iflow_errmsg());
    CHECK(!iflow_kv_can_shift(kv, &why) && why && strstr(why, "after rotating"), "hunyuan: no context shift (%s)",
          why ? why : "?");
    int32_t table[2] = {0, 1};
    CHECK_ERR(iflow_kv_shift(kv, table, 20, 4, 8), IFLOW_EUNSUPPORTED, "after rotating them", "qk_norm_after_rope");
    iflow_kv_close(kv);
    iflow_model_close(m);
}

/* Nemotron: LayerNorm1P with biases, rotary on 4 of 8 dimensions, a plain squared-ReLU FFN */
static int nemotron_hp(const iflow_hparams *hp)
{
    return hp->norm == IFLOW_NORM_LAYER && iflow_norm_biased(hp) && hp->rope_dim == 4 && hp->ffn == IFLOW_FFN_PLAIN &&
           hp->activation == IFLOW_ACT_RELU2;
}

static void test_nemotron(void) { check_family("nemotron", nemotron_hp); }

/* GLM-4.5: layer 0 dense (64), then 8 experts of 16 in 2 groups (1 chosen from), 3 a token by
 * sigmoid scores and a correction bias, renormalized, times 1.5, a shared expert of 16 */
static int glm4_moe_hp(const iflow_hparams *hp)
{
    return hp->n_experts == 8 && hp->n_experts_used == 3 && hp->expert_ffn_dim == 16 && hp->moe_dense_first == 1 &&
           !iflow_layer_moe(hp, 0) && iflow_layer_moe(hp, 1) && hp->router_sigmoid && hp->router_bias &&
           hp->router_groups == 2 && hp->router_topk_groups == 1 && hp->expert_scale == 1.5f && hp->expert_norm &&
           hp->shared_expert && hp->shared_ffn_dim == 16 && hp->ffn_dim == 64 && hp->qk_norm && hp->rope_dim == 4;
}

static void test_glm4_moe(void)
{
    check_family("glm4_moe", glm4_moe_hp);
    check_moe_step("glm4_moe");
    check_moe_imatrix("glm4_moe");
    /* a checkpoint with a multi-token-prediction layer (num_nextn_predict_layers: layer 3 of 3)
     * converts, that layer's tensors carried and never run: the same logits */
    check_family("glm4_moe-mtp", glm4_moe_hp);
}

/* DeepSeek's latent attention: one kv head of the latent 16 + 4 rotated dims, the scores scaled
 * as the expanded heads' (8 + 4)^-1/2, times yarn's mscale(4, mscale_all_dim)^2 where yarn */
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
           fabs(hp->attn_scale - ms * ms / sqrt(12.0)) < 1e-6 && !hp->router_sigmoid && !hp->expert_norm;
}

static int deepseek_v2_hp(const iflow_hparams *hp)
{
    return deepseek_common(hp) && hp->q_lora_rank == 12 && hp->rope_scaling == IFLOW_ROPE_SCALING_NONE &&
           fabs(hp->attn_scale - 1 / sqrt(12.0)) < 1e-7 && hp->router_groups == 4 && hp->router_topk_groups == 2 &&
           hp->router_group_top == 1 && hp->expert_scale == 2.0f && hp->shared_ffn_dim == 32;
}

static int deepseek_v3_hp(const iflow_hparams *hp)
{
    const double ms = 0.1 * log(4.0) + 1;
    return deepseek_common(hp) && hp->q_lora_rank == 12 && fabs(hp->attn_scale - ms * ms / sqrt(12.0)) < 1e-6 &&
           hp->router_sigmoid && hp->router_bias && hp->router_group_top == 2 && hp->expert_norm &&
           hp->expert_scale == 2.5f;
}

/* The cache keeps one latent row a position and no value pool: a context of 64 positions holds
 * 64 * 20 floats a layer (an expanded cache would hold 64 * 4 * (12 + 6)). */
static void check_mla_cache(const char *family)
{
    char path[300];
    snprintf(path, sizeof path, "%s/%s.ifs", dir, family);
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0)
        return;
    const iflow_hparams *hp = iflow_model_hparams(m);
    CHECK(iflow_part_kv_bytes(hp, hp->n_kv_heads, 64) == 64 * 20 * sizeof(float), "%s: kv bytes %llu", family,
          (unsigned long long)iflow_part_kv_bytes(hp, hp->n_kv_heads, 64));
    iflow_model_close(m);
}

/* Quantized: every product of deepseek_v2-q is 32 wide or a multiple, so Q8_B32 takes wk_b and
 * wv_b too (each head's rows read in place, quantized); its logits within 1e-2 of transformers'
 * float64 (the F32 conversion is within 1e-7; Q8_B32 moves them by about 1e-3). */
static void check_mla_quantized(void)
{
    iflow_model *m;
    json_t *r;
    if (open_fixture("deepseek_v2-q", &m, &r) < 0)
        return;
    iflow_model_close(m);
    char src[300], out[300];
    snprintf(src, sizeof src, "%s/deepseek_v2-q.ifs", dir);
    snprintf(out, sizeof out, "%s/deepseek_v2-q8.ifs", dir);
    iflow_quant_policy p;
    iflow_quant_policy_init(&p, IFLOW_DT_Q8_B32);
    CHECK(iflow_quantize_shard(src, out, &p, 0, NULL) == 0, "quantize: %s", iflow_errmsg());
    iflow_quant_policy_free(&p);
    iflow_shard *sh;
    if (iflow_shard_open(&sh, out, 0) == 0) {
        static const char *const names[] = {"blk.1.wk_b", "blk.1.wv_b", "blk.1.wq_a", "blk.1.wkv_a", "blk.1.wo"};
        for (int i = 0; i < 5; i++) {
            const iflow_shard_rec *t = iflow_shard_find(sh, names[i]);
            CHECK(t && t->dtype == IFLOW_DT_Q8_B32, "%s is %s", names[i], t ? iflow_dtype_name(t->dtype) : "missing");
        }
        iflow_shard_close(sh);
    }
    if (iflow_model_open(&m, out, 0) == 0) {
        const json_t *ids = json_object_get(r, "ids"), *logits = json_object_get(r, "logits");
        double a = worst_diff(m, ids, logits, 0), b = worst_diff(m, ids, logits, 1);
        printf("deepseek_v2-q q8_b32: max |logit - transformers float64| = %.2e (prefill), %.2e (token by token)\n",
               a, b);
        CHECK(a <= 1e-2 && b <= 1e-2, "deepseek_v2-q q8_b32: logits differ from transformers by %.3g / %.3g", a, b);
        iflow_model_close(m);
    } else {
        CHECK(0, "open %s: %s", out, iflow_errmsg());
    }
    json_decref(r);
}

/* gpt-oss: sinks, a window on every other layer, yarn without truncation, biased experts with
 * the clamped SwiGLU (limit 0.3), the router's bias on its logits */
static int gpt_oss_hp(const iflow_hparams *hp)
{
    return hp->attn_sinks && hp->sliding_window == 5 && hp->window_pattern == 2 &&
           hp->activation == IFLOW_ACT_SWIGLU_OAI && hp->swiglu_limit == 0.3f &&
           fabsf(hp->swiglu_alpha - 1.702f) < 1e-6f && hp->expert_bias && hp->router_logit_bias && hp->expert_norm && hp->n_experts == 4 &&
           hp->rope_scaling == IFLOW_ROPE_SCALING_YARN && !hp->rope_truncate && hp->attn_bias;
}

/* the release's form: the experts as MXFP4 pairs (blocks, scales), re-encoded by the converter
 * as Q8_B32 exactly (their scales fit F16); the products with F32 activations (the default
 * rounds them to int8 a block: 3.8e-3 here), against transformers decoding the pairs with its
 * convert_moe_packed_tensors */
static int gpt_oss_mxfp4_hp(const iflow_hparams *hp) { return hp->attn_sinks && hp->expert_ffn_dim == 32; }

static void check_gpt_oss_mxfp4(void)
{
    CHECK(iflow_kernel_set_activations("f32") == 0, "f32 activations");
    check_family("gpt_oss-mxfp4", gpt_oss_mxfp4_hp);
    iflow_kernel_set_activations("int");
    char path[300];
    snprintf(path, sizeof path, "%s/gpt_oss-mxfp4.ifs", dir);
    iflow_shard *sh;
    if (iflow_shard_open(&sh, path, 0) == 0) {
        const iflow_shard_rec *t = iflow_shard_find(sh, "blk.1.ffn_up.3"), *b = iflow_shard_find(sh, "blk.1.ffn_up_b.3");
        CHECK(t && t->dtype == IFLOW_DT_Q8_B32 && b && b->dtype == IFLOW_DT_F32, "an MXFP4 expert as Q8_B32 (%s)",
              t ? iflow_dtype_name(t->dtype) : "missing");
        iflow_shard_close(sh);
    }
}

static void test_gpt_oss(void)
{
    check_family("gpt_oss", gpt_oss_hp);
    check_gpt_oss_mxfp4();
    check_moe_step("gpt_oss");
}

static void test_deepseek(void)
{
    check_family("deepseek_v2-q", NULL);
    check_mla_quantized();
    check_family("deepseek_v2-lite", deepseek_v2_lite_hp);
    check_family("deepseek_v2", deepseek_v2_hp);
    check_family("deepseek_v3", deepseek_v3_hp);
    check_moe_step("deepseek_v3");
    check_moe_imatrix("deepseek_v3");
    check_mla_cache("deepseek_v2-lite");
    /* every head reads the one latent row: a layer split by heads is refused, naming the block */
    check_split_refused("deepseek_v2-lite",
                        "[plan]\nlayers = 3\nheads = 4\nkv_heads = 1\nffn = 64\n[device cpu:0]\nheads = 0-1\n"
                        "ffn = 0-31\n[device cpu:1]\nheads = 2-3\nffn = 32-63\n",
                        "layer 0 is latent attention");
}

/* An encoder (specs/bert.ini): the pooled embedding of the fixture's ids against transformers'
 * float64 BertModel with sentence-transformers' pooling, within 1e-5 (F32 against float64). */
static void check_encoder(const char *family, int pooling, int normalize)
{
    iflow_model *m;
    iflow_ctx *c;
    json_t *r;
    if (open_fixture(family, &m, &r) < 0)
        return;
    const iflow_hparams *hp = iflow_model_hparams(m);
    CHECK(hp->layout == IFLOW_LAYOUT_ENCODER && hp->post_ln && hp->embed_norm && hp->token_types == 2 &&
              hp->pooling == pooling && hp->normalize == normalize && hp->activation == IFLOW_ACT_GELU,
          "%s: the spec's hyperparameters (pooling %d, normalize %d)", family, hp->pooling, hp->normalize);
    const json_t *ids = json_object_get(r, "ids"), *want = json_object_get(r, "embedding");
    int n = (int)json_array_size(ids), D = hp->dim;
    int32_t tok[64];
    float got[64], logits[128];
    for (int i = 0; i < n && i < 64; i++)
        tok[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
    CHECK(iflow_ctx_open(&c, m, 64, 1) == 0, "%s: ctx: %s", family, iflow_errmsg());
    double worst = INFINITY;
    for (int pass = 0; pass < 2; pass++) { /* twice: each input stands alone */
        if (iflow_ctx_embed(c, tok, n, got) == 0 && (int)json_array_size(want) == D) {
            worst = 0;
            for (int d = 0; d < D; d++) {
                double e = fabs(got[d] - json_real_value(json_array_get(want, (size_t)d)));
                worst = e > worst || e != e ? e : worst;
            }
        }
        printf("%s: max |embedding - transformers float64| = %.2e (call %d)\n", family, worst, pass + 1);
        CHECK(worst <= 1e-5, "%s: the embedding differs from transformers by %.3g: %s", family, worst, iflow_errmsg());
    }
    CHECK_ERR(iflow_ctx_eval(c, tok, n, logits, 0), IFLOW_EUNSUPPORTED, "embeddings", "not logits");
    int32_t many[65] = {0};
    CHECK_ERR(iflow_ctx_embed(c, many, 65, got), IFLOW_ERANGE, "65 tokens", "longer than an encoder step");
    iflow_ctx_close(c);
    iflow_model_close(m);
    json_decref(r);
}

static void test_bert(void) { check_encoder("bert", IFLOW_POOL_MEAN, 1); }
static void test_bert_cls(void) { check_encoder("bert-cls", IFLOW_POOL_CLS, 0); }

/* a row range the spec gets wrong: its syntax, or rows the source matrix does not have */
static void test_bad_rows(void)
{
    const char *fx = fixture("phi3");
    if (!fx)
        SKIP("no phi3 fixture");
    char src[4096], cmd[600], spec[300], out[300];
    snprintf(src, sizeof src, "%s", fx);
    snprintf(cmd, sizeof cmd, "cp specs/llama.ini %s/llama.ini", dir);
    CHECK(system(cmd) == 0, "copy llama.ini");
    snprintf(spec, sizeof spec, "%s/bad.ini", dir);
    snprintf(out, sizeof out, "%s/bad.ifs", dir);
    static const struct {
        const char *range;
        int rc;
        const char *text;
    } cases[] = {
        {"[0:QQ]", IFLOW_ESPEC, "bad row range"},
        {"[Q:0]", IFLOW_ESPEC, "bad row range"},
        {"[0:Q+99]", IFLOW_ESHAPE, "no rows 0..130"},
        {"[0:2*H/H]", IFLOW_ESPEC, "bad row range"},            /* B > P */
        {"[0:H/]", IFLOW_ESPEC, "bad row range"},
        {"[0:H*]", IFLOW_ESPEC, "bad row range"},                /* a product missing a factor */
        {"[0:*H]", IFLOW_ESPEC, "bad row range"},
        {"[0:H+]", IFLOW_ESPEC, "bad row range"},
        {"[0:H**H]", IFLOW_ESPEC, "bad row range"},
        {"[0:D*D*D*D*D*D*D*D]", IFLOW_ESPEC, "bad row range"},   /* 32^8 = 2^40: too large */
        {"[0:NH*H*2+Q]", IFLOW_ESHAPE, "no rows 0..95"},         /* products of symbols: 4 * 8 * 2 + 32 */
        {"[0:Q][0:H/3]", IFLOW_ESPEC, "want NAME[A:B][C:D]"},    /* a period that does not divide 32 */
        {"[0:Q][0:Q+1]", IFLOW_ESPEC, "want NAME[A:B][C:D]"},    /* more rows than the first range's */
        {"[0:2*Q+2][0:1/2]", IFLOW_ESHAPE, "no rows 0..65"},     /* past qkv_proj's 64 rows */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char text[1024];
        int n = snprintf(text, sizeof text,
                         "[model]\nbase = llama\nname = bad\narchitectures = Phi3ForCausalLM\n[hparams]\nsliding_window = "
                         "sliding_window, 0\n[tensors]\nblk.{L}.wq = model.layers.{L}.self_attn.qkv_proj.weight%s\n"
                         "blk.{L}.wk = model.layers.{L}.self_attn.qkv_proj.weight[Q:Q+KV]\n"
                         "blk.{L}.wv = model.layers.{L}.self_attn.qkv_proj.weight[Q+KV:Q+2*KV]\n"
                         "blk.{L}.ffn_gate = model.layers.{L}.mlp.gate_up_proj.weight[0:F]\n"
                         "blk.{L}.ffn_up = model.layers.{L}.mlp.gate_up_proj.weight[F:2*F]\n",
                         cases[k].range);
        test_write_file(spec, text, (size_t)n);
        iflow_convert_opts o = {.dtype = -1, .spec_path = spec};
        CHECK_ERR(iflow_convert(src, out, &o), cases[k].rc, "qkv_proj", cases[k].text);
        CHECK(access(out, F_OK) != 0, "nothing written for %s", cases[k].range);
    }
}

/* [model] base: the child's keys over its base's; GGUF architectures are not inherited */
static void test_spec_base(void)
{
    iflow_spec *s;
    CHECK(iflow_spec_load(&s, "specs/qwen2.ini") == 0, "load qwen2.ini: %s", iflow_errmsg());
    if (s) {
        char name[256];
        CHECK(strcmp(s->name, "qwen2") == 0 && s->n_architectures == 1 && strcmp(s->architectures[0], "Qwen2ForCausalLM") == 0,
              "qwen2.ini keeps its own name and architectures");
        CHECK(iflow_spec_source_name(s, "blk.3.bq", name, sizeof name) == 0 &&
                  strcmp(name, "model.layers.3.self_attn.q_proj.bias") == 0,
              "tensor names come from llama.ini (%s)", name);
        int gguf_archs = 0, qwen2 = 0;
        for (size_t i = 0; i < s->n_variants; i++)
            for (size_t a = 0; a < s->variants[i].n_architectures; a++)
                gguf_archs++, qwen2 += strcmp(s->variants[i].architectures[a], "qwen2") == 0;
        CHECK(gguf_archs == 1 && qwen2 == 1, "qwen2.ini serves GGUF architecture qwen2 alone, none of llama.ini's");
        iflow_spec_close(s);
    }
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/a.ini", dir);
    snprintf(b, sizeof b, "%s/b.ini", dir);
    const char *nowhere = "[model]\nbase = nowhere\nname = a\narchitectures = A\n",
               *ab = "[model]\nbase = b\nname = a\narchitectures = A\n", *ba = "[model]\nbase = a\nname = b\narchitectures = B\n";
    test_write_file(a, nowhere, strlen(nowhere));
    CHECK_ERR(iflow_spec_load(&s, a), IFLOW_ENOTFOUND, "nowhere.ini", "base 'nowhere'");
    test_write_file(a, ab, strlen(ab));
    test_write_file(b, ba, strlen(ba));
    CHECK_ERR(iflow_spec_load(&s, a), IFLOW_ESPEC, "a.ini", "nests too deep");
    /* {L} and {E} in either order, several times; a name that matches no pattern is not mapped */
    const char *ex = "[model]\nname = ex\narchitectures = Ex\n[tensors]\n"
                     "blk.{L}.ffn_up.{E} = experts.{E}.layer.{L}.up | layer.{L}.expert.{E}.up\n"
                     "blk.{L}.ffn_up = layer.{L}.up\n";
    test_write_file(a, ex, strlen(ex));
    CHECK(iflow_spec_load(&s, a) == 0, "load: %s", iflow_errmsg());
    if (s) {
        char name[256];
        CHECK(iflow_spec_source_name(s, "blk.12.ffn_up.7", name, sizeof name) == 0 &&
                  strcmp(name, "experts.7.layer.12.up | layer.12.expert.7.up") == 0,
              "an expert's name: %s", name);
        CHECK(iflow_spec_source_name(s, "blk.12.ffn_up", name, sizeof name) == 0 && strcmp(name, "layer.12.up") == 0,
              "the dense name: %s", name);
        CHECK_ERR(iflow_spec_source_name(s, "blk.12.ffn_up.x", name, sizeof name), IFLOW_ENOTFOUND, "blk.12.ffn_up.x",
                  "does not map");
        iflow_spec_close(s);
    }
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    RUN(test_spec_base);
    RUN(test_qwen2);
    RUN(test_mistral);
    RUN(test_gemma);
    RUN(test_gemma2);
    RUN(test_gemma3);
    RUN(test_phi3);
    RUN(test_gpt2);
    RUN(test_llama3);
    RUN(test_gptneox);
    RUN(test_qwen3);
    RUN(test_mixtral);
    RUN(test_mixtral_f16);
    RUN(test_qwen3_moe);
    RUN(test_qwen2_moe);
    RUN(test_olmoe);
    RUN(test_granite);
    RUN(test_granitemoe);
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
    RUN(test_glm4_moe);
    RUN(test_deepseek);
    RUN(test_gpt_oss);
    RUN(test_bert);
    RUN(test_bert_cls);
    RUN(test_bad_rows);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_families");
}
