/*
 * test_seq2seq.c -- encoder-decoders (block layout = encoder-decoder) on the tiny random-weight
 * Hugging Face models of tests/fixtures/families (gen_family_refs.py): MarianMTModel (post-LN,
 * Marian's sinusoidal table, scaled embeddings, final_logits_bias, swish), M2M100 (pre-LN with
 * final norms, fairseq's table from row 2, ReLU), T5 v1.0 (RMS norm, relative buckets, ReLU,
 * tied output rescaled) and T5 v1.1 (gated GELU, untied, 3 encoder and 2 decoder layers). Each
 * converts with its spec; the decoder logits of every position of refs.json's `dec` against the
 * encoded `src` match transformers' float64 forward within 1e-4 (one step, and one row a step
 * through the cache), and greedy decoding gives generate()'s ids exactly (M2M100 also with a
 * forced first token). T5's buckets equal transformers' for distances -40..40; two sequences
 * in one step and a forked sequence give what one alone does; the refusals name the layout.
 */
#include "check.h"
#include "testlib.h"
#include "libcore/engine/seq2seq.h"
#include "libcore/serving/beam.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static char dir[] = "/tmp/iflow-test-seq2seq-XXXXXX";

/* tests/fixtures/families/FAMILY converted with specs/ and opened, and its refs.json. */
static int open_s2s(const char *family, iflow_model **m, json_t **r)
{
    char rel[256], src[4096], out[300], refs[4200];
    snprintf(rel, sizeof rel, "families/%s", family);
    const char *fx = test_fixture(rel);
    if (!fx)
        SKIP_RET(-1, "no fixture for %s (run from the repository root)", family);
    snprintf(src, sizeof src, "%s", fx);
    snprintf(out, sizeof out, "%s/%s.ifs", dir, family);
    snprintf(refs, sizeof refs, "%s/refs.json", src);
    const char *specs[] = {"specs"};
    iflow_convert_opts o = {.dtype = -1, .spec_dirs = specs, .n_spec_dirs = 1};
    json_error_t je;
    CHECK(iflow_convert(src, out, &o) == 0, "%s: convert: %s", family, iflow_errmsg());
    *r = json_load_file(refs, 0, &je);
    CHECK(*r != NULL, "%s: %s: %s", family, refs, je.text);
    if (*r && iflow_model_open(m, out, 0) == 0)
        return 0;
    CHECK(0, "%s: open: %s", family, iflow_errmsg());
    json_decref(*r);
    return -1;
}

/* max |logits - want| over rows [n][V] (NaN counts as infinite). */
static double worst_row_diff(const float *logits, const json_t *want, int n, int V)
{
    double worst = 0;
    for (int i = 0; i < n; i++)
        for (int v = 0; v < V; v++) {
            double d = fabs(logits[(size_t)i * V + v] - json_real_value(json_array_get(json_array_get(want, (size_t)i), (size_t)v)));
            worst = d > worst || d != d ? (d != d ? INFINITY : d) : worst;
        }
    return worst;
}

/* The decoder logits of refs' dec against src: all rows in one step (by_row 0) or a row a
 * step; sequence `seq` of a context of two. */
static double logits_diff(iflow_model *m, const json_t *r, int by_row, int seq)
{
    const int V = iflow_model_hparams(m)->vocab_size;
    size_t n_src, n;
    int32_t *src = test_ids(json_object_get(r, "src"), &n_src), *dec = test_ids(json_object_get(r, "dec"), &n);
    float *logits = malloc(sizeof(float) * n * V);
    int seqs[64];
    for (size_t i = 0; i < n; i++)
        seqs[i] = seq;
    iflow_s2s *s;
    double worst = INFINITY;
    int rc = iflow_s2s_open(&s, m, 32, 32, 2, 1);
    if (rc == 0)
        rc = iflow_s2s_encode(s, src, (int)n_src);
    for (size_t i = 0; rc == 0 && i < n; i += by_row ? 1 : n)
        rc = iflow_s2s_step(s, dec + i, seqs, by_row ? 1 : (int)n, logits + i * V);
    CHECK(rc == 0, "decode: %s", iflow_errmsg());
    if (rc == 0)
        worst = worst_row_diff(logits, json_object_get(r, "logits"), (int)n, V);
    iflow_s2s_close(s);
    free(logits), free(src), free(dec);
    return worst;
}

/* Greedy ids (an ending EOS appended, as generate() returns it) equal refs' `key`. */
static void check_greedy(iflow_model *m, const json_t *r, const char *key, const json_t *prefix, const char *family)
{
    size_t n_src, n_want, n_prefix = 0;
    int32_t *src = test_ids(json_object_get(r, "src"), &n_src), *want = test_ids(json_object_get(r, key), &n_want);
    int32_t *pre = prefix ? test_ids(prefix, &n_prefix) : NULL;
    iflow_s2s *s;
    iflow_s2s_result res = {0};
    int rc = iflow_s2s_open(&s, m, 32, 32, 1, 1);
    if (rc == 0)
        rc = iflow_s2s_greedy(s, src, (int)n_src, pre, (int)n_prefix, 12 - (int)n_prefix, &res);
    CHECK(rc == 0, "%s: greedy: %s", family, iflow_errmsg());
    int32_t got[32];
    size_t n_got = 0;
    for (size_t i = 0; i < n_prefix; i++) /* generate() returns the forced token too */
        got[n_got++] = pre[i];
    for (int i = 0; i < res.n_tokens && n_got < 31; i++)
        got[n_got++] = res.tokens[i];
    if (res.finish == IFLOW_FINISH_EOS)
        got[n_got++] = res.eos;
    int same = n_got == n_want && memcmp(got, want, n_got * sizeof *got) == 0;
    printf("%s: %s %zu ids, %s\n", family, key, n_got, same ? "as transformers" : "DIFFERENT");
    CHECK(same, "%s: %s differs from generate()'s (%zu ids against %zu; first %d against %d)", family, key, n_got,
          n_want, n_got ? got[0] : -1, n_want ? want[0] : -1);
    iflow_s2s_close(s);
    free(res.tokens), free(src), free(want), free(pre);
}

/* A search of 4 beams (length penalty 1, early stopping) gives generate()'s best ids. */
static void check_beams(iflow_model *m, const json_t *r, const char *family)
{
    size_t n_src, n_want;
    int32_t *src = test_ids(json_object_get(r, "src"), &n_src), *want = test_ids(json_object_get(r, "beam4"), &n_want);
    iflow_beam_params bp = {.n_beams = 4, .max_tokens = 12, .length_penalty = 1.0f};
    iflow_s2s *s;
    iflow_beam_run *run = NULL;
    iflow_beam *b = NULL;
    int nb = 0, rc = iflow_s2s_open(&s, m, 32, 32, 9, 1);
    if (rc == 0 && (rc = iflow_beam_open_s2s(&run, m, s, src, (int)n_src, NULL, 0, &bp)) == 0) {
        while ((rc = iflow_beam_step(run)) > 0)
            ;
        if (rc == 0)
            rc = iflow_beam_take(run, &b, &nb);
    }
    CHECK(rc == 0 && nb > 0, "%s: beams: %s", family, iflow_errmsg());
    int32_t got[32];
    size_t n_got = 0;
    for (int i = 0; nb > 0 && i < b[0].n_tokens && n_got < 31; i++)
        got[n_got++] = b[0].tokens[i];
    if (nb > 0 && b[0].finish == IFLOW_FINISH_EOS)
        got[n_got++] = b[0].eos;
    int same = n_got == n_want && memcmp(got, want, n_got * sizeof *got) == 0;
    printf("%s: beam4 %zu ids, %s\n", family, n_got, same ? "as transformers" : "DIFFERENT");
    CHECK(same, "%s: the best of 4 beams differs from generate()'s (%zu ids against %zu)", family, n_got, n_want);
    iflow_beams_free(b, nb);
    iflow_beam_close(run);
    iflow_s2s_close(s);
    free(src), free(want);
}

static void check_s2s(const char *family, int (*check)(const iflow_hparams *hp))
{
    iflow_model *m;
    json_t *r;
    if (open_s2s(family, &m, &r) < 0)
        return;
    CHECK(check(iflow_model_hparams(m)), "%s: the spec's hyperparameters", family);
    double a = logits_diff(m, r, 0, 0), b = logits_diff(m, r, 1, 1);
    printf("%s: max |logit - transformers float64| = %.2e (one step), %.2e (a row a step)\n", family, a, b);
    CHECK(a <= 1e-4 && b <= 1e-4, "%s: logits differ from transformers by %.3g / %.3g", family, a, b);
    check_greedy(m, r, "greedy", NULL, family);
    if (json_object_get(r, "prefix"))
        check_greedy(m, r, "greedy_prefix", json_object_get(r, "prefix"), family);
    check_beams(m, r, family);
    iflow_model_close(m);
    json_decref(r);
}

/* post-LN, no final norm, Marian's table, sqrt(d)-scaled embeddings, logits bias, swish */
static int marian_hp(const iflow_hparams *hp)
{
    return hp->layout == IFLOW_LAYOUT_ENCODER_DECODER && hp->post_ln && !hp->final_norm && hp->logits_bias &&
           hp->position == IFLOW_POS_SINUSOIDAL && !hp->pos_endpoint && hp->pos_offset == 0 &&
           hp->embed_scale == (float)sqrt(32.0) && hp->activation == IFLOW_ACT_SILU && hp->ffn == IFLOW_FFN_PLAIN &&
           hp->decoder_start == 127 && hp->pad == 127 && hp->eos[0] == 0 && hp->tie_embeddings;
}

/* pre-LN with final norms, fairseq's table from row 2, ReLU */
static int m2m100_hp(const iflow_hparams *hp)
{
    return !hp->post_ln && hp->final_norm && !hp->logits_bias && hp->pos_endpoint && hp->pos_offset == 2 &&
           hp->activation == IFLOW_ACT_RELU && hp->decoder_start == 2 && hp->eos[0] == 2;
}

/* RMS norm, relative buckets (8, distance 20), no scaling, ReLU dense, tied and rescaled */
static int t5_hp(const iflow_hparams *hp)
{
    return hp->norm == IFLOW_NORM_RMS && hp->position == IFLOW_POS_RELATIVE && hp->rel_buckets == 8 &&
           hp->rel_max_distance == 20 && hp->attn_scale == 1.0f && hp->ffn == IFLOW_FFN_PLAIN &&
           hp->activation == IFLOW_ACT_RELU && hp->tie_embeddings && hp->output_rescale && hp->decoder_start == 0 &&
           !hp->attn_bias && !hp->mlp_bias;
}

/* gated GELU (tanh), untied and not rescaled, 3 encoder layers and 2 decoder layers */
static int t5v11_hp(const iflow_hparams *hp)
{
    return hp->ffn == IFLOW_FFN_GATED && hp->activation == IFLOW_ACT_GELU_TANH && !hp->tie_embeddings &&
           !hp->output_rescale && hp->n_enc_layers == 3 && hp->n_layers == 2;
}

static void test_marian(void) { check_s2s("marian", marian_hp); }
static void test_m2m100(void) { check_s2s("m2m100", m2m100_hp); }
static void test_t5(void) { check_s2s("t5", t5_hp); }
static void test_t5v11(void) { check_s2s("t5v11", t5v11_hp); }

/* iflow_rel_bucket against transformers' _relative_position_bucket */
static void test_buckets(void)
{
    char path[4200];
    const char *fx = test_fixture("families/t5");
    if (!fx)
        SKIP("no t5 fixture");
    snprintf(path, sizeof path, "%s/refs.json", fx);
    json_t *r = json_load_file(path, 0, NULL), *b = json_object_get(r, "buckets");
    int nb = (int)json_integer_value(json_object_get(b, "buckets")), md = (int)json_integer_value(json_object_get(b, "max_distance")),
        rel0 = (int)json_integer_value(json_object_get(b, "rel0")), bad = 0;
    const json_t *bi = json_object_get(b, "bidirectional"), *ca = json_object_get(b, "causal");
    for (size_t i = 0; i < json_array_size(bi); i++) {
        int rel = rel0 + (int)i;
        bad += iflow_rel_bucket(rel, 1, nb, md) != json_integer_value(json_array_get(bi, i));
        bad += iflow_rel_bucket(rel, 0, nb, md) != json_integer_value(json_array_get(ca, i));
    }
    CHECK(json_array_size(bi) == 81 && bad == 0, "%d buckets differ from transformers'", bad);
    json_decref(r);
}

/* Two sequences in one step, and a fork, give what one sequence alone does; refusals. */
static void test_sequences(void)
{
    iflow_model *m;
    json_t *r;
    if (open_s2s("t5", &m, &r) < 0)
        return;
    const int V = iflow_model_hparams(m)->vocab_size;
    size_t n_src, n;
    int32_t *src = test_ids(json_object_get(r, "src"), &n_src), *dec = test_ids(json_object_get(r, "dec"), &n);
    iflow_s2s *s;
    float *alone = malloc(sizeof(float) * 4 * V), *both = malloc(sizeof(float) * 4 * V);
    CHECK(iflow_s2s_open(&s, m, 16, 8, 3, 2) == 0, "open: %s", iflow_errmsg());
    CHECK(iflow_s2s_encode(s, src, (int)n_src) == 0, "encode: %s", iflow_errmsg());
    int s0[2] = {0, 0}, s12[4] = {1, 2, 1, 2};
    CHECK(iflow_s2s_step(s, dec, s0, 2, alone) == 0, "step: %s", iflow_errmsg());
    int32_t ids[4] = {dec[0], dec[0], dec[1], dec[1]};
    CHECK(iflow_s2s_step(s, ids, s12, 4, both) == 0, "step of two: %s", iflow_errmsg());
    CHECK(memcmp(alone + V, both + 2 * V, sizeof(float) * V) == 0 && memcmp(alone + V, both + 3 * V, sizeof(float) * V) == 0,
          "a sequence's logits depend on the other sequences of its step");
    int one = 1, two = 2;
    CHECK(iflow_s2s_fork(s, 1, 0) == 0 && iflow_s2s_n_past(s, 1) == 2, "fork: %s", iflow_errmsg());
    CHECK(iflow_s2s_step(s, dec + 2, &one, 1, alone) == 0 && iflow_s2s_step(s, dec + 2, s0, 1, both) == 0, "steps");
    CHECK(memcmp(alone, both, sizeof(float) * V) == 0, "a forked sequence differs from its source");
    int32_t many[9] = {0};
    int s2[9] = {2, 2, 2, 2, 2, 2, 2, 2, 2};
    CHECK_ERR(iflow_s2s_step(s, many, s2, 9, NULL), IFLOW_ERANGE, "sequence 2", "full");
    CHECK(iflow_s2s_step(s, many, s2, 6, NULL) == 0, "six more rows: %s", iflow_errmsg()); /* 2 + 6: full */
    CHECK_ERR(iflow_s2s_step(s, many, &two, 1, NULL), IFLOW_ERANGE, "sequence 2", "full");
    int32_t big = V;
    CHECK_ERR(iflow_s2s_step(s, &big, s0, 1, NULL), IFLOW_ERANGE, "128", "outside the vocabulary");
    CHECK_ERR(iflow_s2s_encode(s, many, 0), IFLOW_EINVAL, "source", "no tokens");
    iflow_s2s_close(s);
    iflow_ctx *c;
    CHECK(iflow_ctx_open(&c, m, 16, 1) == 0, "ctx: %s", iflow_errmsg());
    CHECK_ERR(iflow_ctx_eval(c, dec, 1, alone, 0), IFLOW_EUNSUPPORTED, "encoder-decoder", "source");
    iflow_ctx_close(c);
    iflow_model_close(m);
    free(alone), free(both), free(src), free(dec);
    json_decref(r);
    /* a decoder-only model is not an encoder-decoder */
    if (open_s2s("qwen2", &m, &r) < 0)
        return;
    CHECK_ERR(iflow_s2s_open(&s, m, 8, 8, 1, 1), IFLOW_EUNSUPPORTED, "decoder", "not an encoder-decoder");
    iflow_model_close(m);
    json_decref(r);
}

/* A config value no [blocks.KEY=VALUE] section names is refused, naming the key and the value
 * (T5's feed_forward_proj gated-silu: not a silent ReLU FFN). */
static void test_unknown_variant(void)
{
    const char *fx = test_fixture("families/t5");
    if (!fx)
        SKIP("no t5 fixture");
    char cmd[9000], src[300], out[300];
    snprintf(src, sizeof src, "%s/t5-silu", dir);
    snprintf(out, sizeof out, "%s/t5-silu.ifs", dir);
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && ln -sf \"$(cd %s && pwd)/model.safetensors\" %s/ && "
             "sed 's/\"feed_forward_proj\": \"relu\"/\"feed_forward_proj\": \"gated-silu\"/' %s/config.json > %s/config.json",
             src, fx, src, fx, src);
    CHECK(system(cmd) == 0, "make %s", src);
    const char *specs[] = {"specs"};
    iflow_convert_opts o = {.dtype = -1, .spec_dirs = specs, .n_spec_dirs = 1};
    CHECK_ERR(iflow_convert(src, out, &o), IFLOW_ESPEC, "feed_forward_proj = \"gated-silu\"", "relu, gated-gelu");
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    RUN(test_buckets);
    RUN(test_marian);
    RUN(test_m2m100);
    RUN(test_t5);
    RUN(test_t5v11);
    RUN(test_sequences);
    RUN(test_unknown_variant);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_seq2seq");
}
