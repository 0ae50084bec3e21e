/*
 * test_ctxshift.c -- context shift (kernels/cpu/kvcache.h ifk_kv_shift, model.h iflow_kv_shift,
 * batch.h IFLOW_SHIFT_*).
 *
 * References:
 *   - the kernel: keys shifted in place against the same raw keys rotated freshly at their
 *     new positions by ifk_rope (the independent path: what a recomputation stores), for every
 *     cache type, both RoPE layouts, partial rotary, with and without per-pair frequency
 *     scales, over a scrambled block table. F32 within 1e-5. F16 and Q8 round the rotated key
 *     a second time, and the first rounding's error is rotated into the pair's other value:
 *     within two rounding steps of the group's largest value (2^-10 of it for F16, 2/127 of it
 *     for Q8; measured up to 0.6 and 1.3 steps). Values and the kept positions move bit for bit.
 *   - the engine: every layer's K and V rows of a real model (stories260K from Hugging Face and
 *     from GGUF, whose rope layout is the interleaved one; xs-ckpt) after
 *     iflow_kv_shift against the rows read before, rotated by ifk_rope at -discard with the
 *     layer's base and the model's frequency scales computed here from the hyperparameters as
 *     Hugging Face does (1e-5); and layer 0's shifted keys against the kept tokens evaluated
 *     afresh at their new positions (1e-5 of the largest key). The same for synthetic models
 *     of stories260K's shape with linear and with Llama 3.1 rope scaling, and of Gemma 3's
 *     blocks with a local rope base on every other layer.
 *   - the batch engine: a request generating 10x its context runs to max_tokens within the
 *     blocks of one context; its tokens before the first shift equal an unshifted run's; in
 *     RECOMPUTE mode the token after the first shift is the greedy argmax of iflow_ctx_eval
 *     over the kept window (an independent evaluation of the same tokens).
 */
#include "tests/unit/testlib.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/kvcache.h"
#include "libcore/engine/model.h"
#include "libcore/formats/convert.h"
#include "libcore/serving/batch.h"

#include <jansson.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/iflow-test-ctxshift-XXXXXX";
static char s260[512], xs[512], s_gguf[512], s_linear[512], s_llama3[512], s_gemma3[512], s_smollm3[512];

static float urand(void) { return (float)(rnd_u32() % 20001) / 10000.0f - 1.0f; }

/* ---- the kernel ----------------------------------------------------------------------------- */

static void kernel_case(int type, int layout, int rot_dim, int scaled)
{
    enum { NKV = 3, HD = 64, KV = NKV * HD, BLOCK = 8, NB = 20, NPAST = 150, KEEP = 4, DISCARD = 73 };
    ifk_kv_layout L = {.type = type, .block = BLOCK, .n_kv_heads = NKV, .head_dim = HD, .group = ifk_kv_group(HD),
                       .n_blocks = NB};
    int32_t table[NB];
    for (int i = 0; i < NB; i++)
        table[i] = (int32_t)((i * 7 + 3) % NB);
    float fs[HD / 2];
    for (int i = 0; i < HD / 2; i++)
        fs[i] = 0.25f + (float)i / HD;
    const float *freq = scaled ? fs : NULL;
    const float theta = 10000.0f;
    size_t bytes = ifk_kv_pool_bytes(&L);
    void *k = calloc(1, bytes), *v = calloc(1, bytes);
    float *raw = malloc(sizeof(float) * NPAST * KV), *vals = malloc(sizeof(float) * NPAST * KV);
    float *row = malloc(sizeof(float) * KV), *want = malloc(sizeof(float) * KV), *vb = malloc(sizeof(float) * NPAST * KV);
    for (int i = 0; i < NPAST * KV; i++)
        raw[i] = urand(), vals[i] = urand();
    for (int p = 0; p < NPAST; p++) { /* what the forward pass stores: rope(k, p), v */
        memcpy(row, raw + (size_t)p * KV, sizeof(float) * KV);
        ifk_rope(row, NKV, HD, rot_dim, p, theta, freq, layout);
        ifk_kv_seq s = {.row0 = 0, .n_rows = 1, .pos0 = p, .table = table};
        ifk_kv_store(k, &L, &s, 1, row, KV, 1);
        ifk_kv_store(v, &L, &s, 1, vals + (size_t)p * KV, KV, 1);
    }
    for (int p = 0; p < NPAST; p++)
        ifk_kv_load_row(vb + (size_t)p * KV, v, &L, table, p);
    float *kb = malloc(sizeof(float) * KV * KEEP);
    for (int p = 0; p < KEEP; p++)
        ifk_kv_load_row(kb + (size_t)p * KV, k, &L, table, p);
    ifk_rope_params rp = {rot_dim, theta, freq, layout};
    ifk_kv_shift(k, v, &L, table, NPAST, KEEP, DISCARD, &rp, row);
    double worst = 0, worst_tol = 0;
    int bad_v = 0, bad_keep = 0;
    for (int q = 0; q < NPAST - DISCARD; q++) {
        int src = q < KEEP ? q : q + DISCARD;
        ifk_kv_load_row(row, k, &L, table, q);
        if (q < KEEP) {
            bad_keep += memcmp(row, kb + (size_t)q * KV, sizeof(float) * KV) != 0;
        } else {
            memcpy(want, raw + (size_t)src * KV, sizeof(float) * KV); /* recomputed at position q */
            ifk_rope(want, NKV, HD, rot_dim, q, theta, freq, layout);
            for (int g = 0; g < KV; g += L.group) {
                float amax = 0;
                for (int i = g; i < g + L.group; i++)
                    amax = fabsf(want[i]) > amax ? fabsf(want[i]) : amax;
                for (int i = g; i < g + L.group; i++) {
                    double tol = type == IFK_KV_F32 ? 1e-5 : type == IFK_KV_F16 ? amax * 0x1p-10 : 2.0 * amax / 127.0;
                    double e = fabs((double)row[i] - want[i]);
                    if (e - tol > worst - worst_tol)
                        worst = e, worst_tol = tol;
                }
            }
        }
        ifk_kv_load_row(want, v, &L, table, q);
        bad_v += memcmp(want, vb + (size_t)src * KV, sizeof(float) * KV) != 0;
    }
    CHECK(worst <= worst_tol, "%s %s rot %d%s: shifted key off by %.3g (tolerance %.3g)", ifk_kv_type_name(type),
          layout == IFK_ROPE_HALF ? "half" : "interleaved", rot_dim, scaled ? " scaled" : "", worst, worst_tol);
    CHECK(bad_v == 0, "%s: %d value rows not moved exactly", ifk_kv_type_name(type), bad_v);
    CHECK(bad_keep == 0, "%s: %d kept key rows changed", ifk_kv_type_name(type), bad_keep);
    free(k), free(v), free(raw), free(vals), free(row), free(want), free(vb), free(kb);
}

static void test_kernel(void)
{
    for (int type = IFK_KV_F32; type <= IFK_KV_Q8; type++)
        for (int layout = IFK_ROPE_HALF; layout <= IFK_ROPE_INTERLEAVED; layout++)
            for (int rot = 32; rot <= 64; rot += 32)
                for (int scaled = 0; scaled < 2; scaled++)
                    kernel_case(type, layout, rot, scaled);
}

/* ---- the engine: every layer of a real model ------------------------------------------------ */

/* The per-pair frequency multipliers of the model's rope scaling, computed here from the
 * hyperparameters as Hugging Face's _compute_linear_scaling / _compute_llama3_parameters do
 * (transformers/modeling_rope_utils.py), in double: NULL for none. */
static const float *ref_scale(const iflow_hparams *hp, float *out)
{
    if (hp->rope_scaling == IFLOW_ROPE_SCALING_NONE)
        return NULL;
    for (int i = 0; i < hp->rope_dim / 2; i++) {
        double inv = pow(hp->rope_theta, -2.0 * i / hp->rope_dim), f = hp->rope_factor, lf = hp->rope_low_freq,
               hf = hp->rope_high_freq, old = hp->rope_orig_ctx;
        if (hp->rope_scaling == IFLOW_ROPE_SCALING_LINEAR) {
            out[i] = (float)(1 / f);
            continue;
        }
        if (hp->rope_scaling == IFLOW_ROPE_SCALING_YARN) { /* _compute_yarn_parameters, truncated */
            const double d = hp->rope_dim, lb = 2 * log(hp->rope_theta);
            double lo = floor(d * log(old / (hp->rope_beta_fast * 2 * M_PI)) / lb);
            double hi = ceil(d * log(old / (hp->rope_beta_slow * 2 * M_PI)) / lb);
            lo = fmax(lo, 0), hi = fmin(hi, d - 1), hi += hi == lo ? 0.001 : 0;
            double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1), extra = 1 - ramp;
            out[i] = (float)(((inv / f) * (1 - extra) + inv * extra) / inv);
            continue;
        }
        double wavelen = 2 * M_PI / inv, lo_wl = old / lf, hi_wl = old / hf, scaled = wavelen > lo_wl ? inv / f : inv;
        if (!(wavelen < hi_wl) && !(wavelen > lo_wl)) { /* medium: smooth between the two */
            double smooth = (old / wavelen - lf) / (hf - lf);
            scaled = (1 - smooth) * scaled / f + smooth * scaled;
        }
        out[i] = (float)(scaled / inv);
    }
    return out;
}

/* The rope base of layer l: Gemma 3's local base on windowed layers. */
static float ref_theta(const iflow_hparams *hp, int l)
{
    int global = hp->window_pattern > 1 && (l + 1) % hp->window_pattern == 0;
    return hp->sliding_window > 0 && !global && hp->rope_theta_local > 0 ? hp->rope_theta_local : hp->rope_theta;
}

static void engine_case(const char *path)
{
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0) {
        CHECK(0, "open %s: %s", path, iflow_errmsg());
        return;
    }
    const iflow_hparams *hp = iflow_model_hparams(m);
    const int N = 90, KEEP = 4, DISCARD = 40, KV = hp->n_kv_heads * hp->head_dim, NL = hp->n_layers;
    int32_t ids[90], table[16];
    for (int i = 0; i < N; i++)
        ids[i] = i == 0 ? hp->bos : (int32_t)(rnd_u32() % (uint32_t)(hp->vocab_size - 3)) + 3;
    for (int i = 0; i < 16; i++)
        table[i] = (int32_t)((i * 5 + 2) % 16);
    iflow_ctx *c;
    iflow_kv *kv;
    CHECK(iflow_ctx_open_steps(&c, m, 2) == 0, "ctx: %s", iflow_errmsg());
    CHECK(iflow_kv_open(&kv, m, IFK_KV_F32, 8, 16) == 0, "kv: %s", iflow_errmsg());
    iflow_step_seq s = {.ids = ids, .n = N, .pos0 = 0, .table = table};
    CHECK(iflow_ctx_step(c, kv, &s, 1) == 0, "step: %s", iflow_errmsg());
    float *before = malloc(sizeof(float) * 2 * NL * N * KV), *row = malloc(sizeof(float) * KV);
    for (int l = 0; l < NL; l++)
        for (int w = 0; w < 2; w++)
            for (int p = 0; p < N; p++)
                CHECK(iflow_kv_read_row(kv, l, w, table, p, before + (((size_t)l * 2 + w) * N + p) * KV) == 0, "read: %s",
                      iflow_errmsg());
    CHECK(iflow_kv_shift(kv, table, N, KEEP, DISCARD) == 0, "shift: %s", iflow_errmsg());
    float scale_buf[256];
    const float *scale = ref_scale(hp, scale_buf);
    double worst = 0;
    int bad = 0;
    for (int l = 0; l < NL; l++)
        for (int w = 0; w < 2; w++)
            for (int q = 0; q < N - DISCARD; q++) {
                int src = q < KEEP ? q : q + DISCARD;
                float *want = before + (((size_t)l * 2 + w) * N + src) * KV;
                /* keys (and latent attention's rows, its values too): rotated back by DISCARD (NoPE: moved) */
                const int keys = w == 0 || hp->kv_lora_rank;
                if (keys && q >= KEEP && iflow_layer_rotates(hp, l))
                    ifk_rope(want, hp->n_kv_heads, hp->head_dim, hp->rope_dim, -DISCARD, ref_theta(hp, l), scale,
                             hp->rope_layout);
                iflow_kv_read_row(kv, l, w, table, q, row);
                for (int i = 0; i < KV; i++) {
                    double e = fabs((double)row[i] - want[i]);
                    worst = e > worst ? e : worst;
                    if (!keys || q < KEEP)
                        bad += row[i] != want[i];
                }
            }
    CHECK(worst <= 1e-5, "%s: a shifted row is off by %.3g", path, worst);
    CHECK(bad == 0, "%s: %d values or kept keys not moved exactly", path, bad);
    /* Layer 0's keys depend on their token and position alone: the kept tokens evaluated afresh
     * at their new positions (the engine's own rope, its scaling and base) give the keys the
     * shift rotated into place. */
    {
        int32_t kept[90], table2[16];
        for (int q = 0; q < N - DISCARD; q++)
            kept[q] = ids[q < KEEP ? q : q + DISCARD];
        for (int i = 0; i < 16; i++)
            table2[i] = i;
        iflow_kv *kv2;
        CHECK(iflow_kv_open(&kv2, m, IFK_KV_F32, 8, 16) == 0, "kv: %s", iflow_errmsg());
        iflow_step_seq s2 = {.ids = kept, .n = N - DISCARD, .pos0 = 0, .table = table2};
        CHECK(iflow_ctx_step(c, kv2, &s2, 1) == 0, "step: %s", iflow_errmsg());
        float *fresh = malloc(sizeof(float) * KV);
        double w0 = 0, mag = 0;
        for (int q = 0; q < N - DISCARD; q++) {
            iflow_kv_read_row(kv, 0, 0, table, q, row);
            iflow_kv_read_row(kv2, 0, 0, table2, q, fresh);
            for (int i = 0; i < KV; i++) {
                w0 = fmax(w0, fabs((double)row[i] - fresh[i]));
                mag = fmax(mag, fabs(fresh[i]));
            }
        }
        CHECK(w0 <= 1e-5 * fmax(1, mag), "%s: layer 0's shifted keys are off the recomputed ones by %.3g (largest %.3g)",
              path, w0, mag);
        free(fresh);
        iflow_kv_close(kv2);
    }
    CHECK_ERR(iflow_kv_shift(kv, table, 10, 4, 7), IFLOW_EINVAL, "drop 7 positions", "first 4 of 10");
    free(before), free(row);
    iflow_kv_close(kv);
    iflow_ctx_close(c);
    iflow_model_close(m);
}

/* A model of stories260K's shape with synthetic weights and the config edited by `edit` (a
 * JSON object merged into config.json), converted to out. */
static int make_variant(const char *name, const char *edit, char *out, size_t cap)
{
    char src[600], cfg[700], tok[700];
    snprintf(src, sizeof src, "%s/%s-hf", dir, name);
    snprintf(cfg, sizeof cfg, "%s/config.json", src);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", src);
    snprintf(out, cap, "%s/%s.ifs", dir, name);
    const char *sc = test_data("models/stories260K/hf/config.json");
    json_t *c = sc ? json_load_file(sc, 0, NULL) : NULL, *e = json_loads(edit, 0, NULL);
    const char *t = test_data("models/stories260K/hf/tokenizer.json"); /* test_data's buffer is reused */
    int rc = -1;
    if (c && e && t && json_object_update(c, e) == 0 && mkdir(src, 0777) == 0 && symlink(t, tok) == 0 &&
        json_dump_file(c, cfg, 0) == 0) {
        const char *specs[] = {"specs"};
        iflow_convert_opts o = {.dtype = -1, .spec_dirs = specs, .n_spec_dirs = 1, .seed = 3,
                                .flags = IFLOW_CONVERT_SYNTHETIC};
        rc = iflow_convert(src, out, &o);
    }
    CHECK(rc == 0, "synthetic model '%s': %s", name, rc == -1 ? "could not write its config" : iflow_errmsg());
    json_decref(c), json_decref(e);
    return rc;
}

/* The scaled models hold what they were made with (so the cases above test scaling). */
static void expect_rope(const char *path, int scaling, float factor, float theta_local)
{
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0)
        return;
    const iflow_hparams *hp = iflow_model_hparams(m);
    CHECK(hp->rope_scaling == scaling && (scaling == 0 || hp->rope_factor == factor) &&
              hp->rope_theta_local == theta_local && (theta_local == 0 || hp->rope_theta != theta_local),
          "%s: rope scaling %d factor %g, local base %g", path, hp->rope_scaling, hp->rope_factor, hp->rope_theta_local);
    iflow_model_close(m);
}

static void test_engine(void)
{
    engine_case(s260);
    engine_case(xs);
    snprintf(s_gguf, sizeof s_gguf, "%s/s.gguf.ifs", dir); /* GGUF: the interleaved rope layout */
    if (test_convert("models/stories260K/gguf/stories260K.gguf", s_gguf, -1) == 0) {
        iflow_model *m;
        if (iflow_model_open(&m, s_gguf, 0) == 0) {
            CHECK(iflow_model_hparams(m)->rope_layout == IFK_ROPE_INTERLEAVED, "the GGUF model's rope is interleaved");
            iflow_model_close(m);
        }
        engine_case(s_gguf);
    }
    /* rope scaling and per-layer bases: Llama 3.1's scaling (an original context of 64, so its
     * four frequencies fall in all three regimes: kept, blended, divided), linear scaling, and
     * Gemma 3's local base on every other layer */
    if (make_variant("linear", "{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}}", s_linear,
                     sizeof s_linear) == 0) {
        expect_rope(s_linear, IFLOW_ROPE_SCALING_LINEAR, 4, 0);
        engine_case(s_linear);
    }
    if (make_variant("llama3",
                     "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                     "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}}",
                     s_llama3, sizeof s_llama3) == 0) {
        expect_rope(s_llama3, IFLOW_ROPE_SCALING_LLAMA3, 8, 0);
        engine_case(s_llama3);
    }
    if (make_variant("gemma3",
                     "{\"architectures\": [\"Gemma3ForCausalLM\"], \"model_type\": \"gemma3_text\", \"rope_theta\": "
                     "1000000.0, \"rope_local_base_freq\": 10000.0, \"sliding_window\": 512, "
                     "\"sliding_window_pattern\": 2, \"query_pre_attn_scalar\": 8, \"hidden_activation\": "
                     "\"gelu_pytorch_tanh\"}",
                     s_gemma3, sizeof s_gemma3) == 0) {
        expect_rope(s_gemma3, IFLOW_ROPE_SCALING_NONE, 0, 10000);
        engine_case(s_gemma3);
    }
    /* DeepSeek's latent attention (-lite: yarn): a cached row is [k_pe | norm(c)], its first
     * rope_dim values rotated by the shift, the latent part moved as it is (no value pool) */
    static const char *const mla[] = {"families/deepseek_v2", "families/deepseek_v2-lite"};
    for (int i = 0; i < 2; i++) {
        const char *fx = test_fixture(mla[i]), *specs[] = {"specs"};
        char out[600];
        iflow_convert_opts o = {.dtype = -1, .spec_dirs = specs, .n_spec_dirs = 1};
        snprintf(out, sizeof out, "%s/mla%d.ifs", dir, i);
        if (!fx)
            SKIP("no fixture %s (run from the repository root)", mla[i]);
        CHECK(iflow_convert(fx, out, &o) == 0, "convert %s: %s", mla[i], iflow_errmsg());
        engine_case(out);
    }
    /* SmolLM3's NoPE layers (every second here): their keys move without a rotation */
    if (make_variant("smollm3",
                     "{\"architectures\": [\"SmolLM3ForCausalLM\"], \"model_type\": \"smollm3\", "
                     "\"no_rope_layers\": [1, 0, 1, 0, 1], \"no_rope_layer_interval\": 2}",
                     s_smollm3, sizeof s_smollm3) == 0) {
        iflow_model *m;
        if (iflow_model_open(&m, s_smollm3, 0) == 0) {
            CHECK(iflow_model_hparams(m)->nope_pattern == 2, "the SmolLM3 variant has NoPE layers");
            iflow_model_close(m);
        }
        engine_case(s_smollm3);
    }
}

/* ---- the batch engine ----------------------------------------------------------------------- */

/* Run one greedy request alone; its result (NULL on failure) and the batch's stats. */
static iflow_result *run_one(iflow_model *m, int n_ctx, const int32_t *prompt, int n_prompt, int max_tokens, int shift,
                             int keep, iflow_batch_stats *st)
{
    iflow_batch *b;
    iflow_batch_params p = {.parallel = 1, .n_ctx = n_ctx, .n_threads = 2};
    if (iflow_batch_open(&b, m, &p) < 0)
        return NULL;
    iflow_request r = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = max_tokens, .context_shift = shift,
                       .keep = keep};
    r.sampling.temp = 0;
    iflow_result *res = NULL;
    int rc = iflow_batch_add(b, &r);
    while (rc >= 0 && (rc = iflow_batch_step(b)) > 0)
        ;
    if (rc == 0)
        iflow_batch_take(b, &res);
    else
        CHECK(0, "batch: %s", iflow_errmsg());
    iflow_batch_get_stats(b, st);
    iflow_batch_close(b);
    return res;
}

static void test_batch(void)
{
    iflow_model *m;
    if (iflow_model_open(&m, s260, 0) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return;
    }
    const iflow_hparams *hp = iflow_model_hparams(m);
    const int NCTX = 48, KEEP = 4, MAX = 10 * NCTX;
    int32_t prompt[6] = {hp->bos, 400, 261, 300, 350, 290};
    iflow_batch_stats st, st0;
    iflow_result *plain = run_one(m, NCTX, prompt, 6, MAX, IFLOW_SHIFT_NONE, KEEP, &st0);
    CHECK(plain && plain->finish == IFLOW_FINISH_CONTEXT && plain->n_tokens == NCTX - 6, "no shift: stops at the context");
    for (int shift = IFLOW_SHIFT_ROPE; shift <= IFLOW_SHIFT_RECOMPUTE; shift++) {
        const char *name = iflow_shift_name(shift);
        iflow_result *r = run_one(m, NCTX, prompt, 6, MAX, shift, KEEP, &st);
        if (!r || !plain) {
            CHECK(0, "%s: no result", name);
            continue;
        }
        int eos = r->finish == IFLOW_FINISH_EOS;
        CHECK(r->finish == IFLOW_FINISH_LENGTH || eos, "%s: finish %s", name, iflow_finish_name(r->finish));
        CHECK(eos || r->n_tokens == MAX, "%s: %d tokens of %d", name, r->n_tokens, MAX);
        CHECK(st.shifts >= (uint64_t)(eos ? 1 : 9), "%s: %llu shifts", name, (unsigned long long)st.shifts);
        CHECK(st.blocks_peak <= (NCTX + 15) / 16, "%s: %d blocks at the peak, a context is %d", name, st.blocks_peak,
              (NCTX + 15) / 16);
        int same = 1;
        for (int i = 0; i < plain->n_tokens && i < r->n_tokens; i++)
            same &= plain->tokens[i] == r->tokens[i];
        CHECK(same, "%s: the tokens before the first shift differ from the unshifted run", name);
        if (shift == IFLOW_SHIFT_RECOMPUTE && r->n_tokens > NCTX - 6 + 1) {
            /* history h = prompt + generated; the first shift happens with positions 0..NCTX-1
             * cached and h[NCTX] pending: the window is h[0..KEEP) + h[KEEP+d..NCTX) + h[NCTX] */
            int32_t h[64], win[64];
            memcpy(h, prompt, sizeof prompt);
            memcpy(h + 6, r->tokens, sizeof(int32_t) * (NCTX + 1 - 6 + 1));
            int d = (NCTX - KEEP) / 2, n = 0;
            for (int i = 0; i < KEEP; i++)
                win[n++] = h[i];
            for (int i = KEEP + d; i <= NCTX; i++)
                win[n++] = h[i];
            iflow_ctx *c;
            int32_t next = -1;
            CHECK(iflow_ctx_open(&c, m, NCTX, 2) == 0 && iflow_ctx_eval_argmax(c, win, n, &next) == 0, "eval: %s",
                  iflow_errmsg());
            CHECK(next == h[NCTX + 1], "recompute: the token after the shift is %d, the window's argmax %d", h[NCTX + 1],
                  next);
            iflow_ctx_close(c);
        }
        iflow_result_free(r);
    }
    iflow_result_free(plain);
    /* a keep that leaves nothing to drop */
    iflow_batch *b;
    iflow_batch_params p = {.parallel = 1, .n_ctx = 7};
    CHECK(iflow_batch_open(&b, m, &p) == 0, "open: %s", iflow_errmsg());
    iflow_request r = {.prompt = prompt, .n_prompt = 6, .max_tokens = 40, .context_shift = IFLOW_SHIFT_ROPE, .keep = 6};
    CHECK_ERR(iflow_batch_add(b, &r), IFLOW_ERANGE, "keeping 6 positions", "context of 7");
    iflow_batch_close(b);
    iflow_model_close(m);
}

int main(void)
{
    RUN(test_kernel);
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(s260, sizeof s260, "%s/s.ifs", dir);
    snprintf(xs, sizeof xs, "%s/xs.ifs", dir);
    if (test_convert("models/stories260K/hf", s260, -1) != 0 || test_convert("models/xs-ckpt/hf", xs, -1) != 0) {
        fprintf(stderr, "test data missing or conversion failed\n");
        return check_summary("test_ctxshift") | 1;
    }
    RUN(test_engine);
    RUN(test_batch);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_ctxshift");
}
