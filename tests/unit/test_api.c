/* test_api.c -- include/iflow.h, the public API, used as a program outside the repository
 * would (only iflow.h's declarations, but for converting the test model):
 *   - the version functions agree with the header's macros;
 *   - every error code has its own name and description; others are "unknown";
 *   - iflow_model_get_info() against config.json read here with jansson;
 *   - iflow_ppl_windows() against the windows iflow_ppl_run() scores, for both protocols,
 *     text lengths around the window and a window limit;
 *   - iflow_generate() against an independent greedy loop (iflow_ctx_eval + iflow_argmax), its
 *     on_text pieces against its text, a seeded run repeating, and its argument errors. */
#include "include/iflow.h"
#include "testlib.h"

#include <jansson.h>

static char dir[] = "/tmp/iflow-test-api-XXXXXX";
static char model_path[300];

static void test_version(void)
{
    CHECK(iflow_version_number() == IFLOW_VERSION_NUMBER, "%u vs %d", iflow_version_number(), IFLOW_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", IFLOW_VERSION_MAJOR, IFLOW_VERSION_MINOR, IFLOW_VERSION_PATCH);
    CHECK(strcmp(iflow_version_string(), want) == 0, "%s vs %s", iflow_version_string(), want);
    CHECK(strcmp(IFLOW_VERSION_STRING, want) == 0, "macro %s vs %s", IFLOW_VERSION_STRING, want);
}

static void test_errors(void)
{
    for (int c = 0; c > -IFLOW_E_COUNT_; c--) {
        CHECK(strcmp(iflow_strerror(c), "unknown") != 0, "code %d has a name", c);
        CHECK(strcmp(iflow_error_describe(c), "unknown error code") != 0, "code %d has a description", c);
        for (int d = 0; d > c; d--) {
            CHECK(strcmp(iflow_strerror(c), iflow_strerror(d)) != 0, "codes %d and %d share a name", c, d);
            CHECK(strcmp(iflow_error_describe(c), iflow_error_describe(d)) != 0, "codes %d and %d share a description", c, d);
        }
    }
    CHECK(strcmp(iflow_strerror(IFLOW_ENOTFOUND), "notfound") == 0, "notfound");
    CHECK(strcmp(iflow_strerror(-IFLOW_E_COUNT_), "unknown") == 0 && strcmp(iflow_strerror(1), "unknown") == 0, "out of range");
    CHECK(strcmp(iflow_error_describe(-99), "unknown error code") == 0, "describe out of range");
    iflow_model *m = NULL;
    int rc = iflow_model_open(&m, "/nonexistent/model.ifs", 0);
    CHECK(rc < 0 && m == NULL, "a missing model fails");
    CHECK(strstr(iflow_errmsg(), "/nonexistent/model.ifs") != NULL, "the message names the file: %s", iflow_errmsg());
}

static void test_info(void)
{
    iflow_model *m;
    json_error_t e;
    json_t *cfg = json_load_file(test_data("models/stories260K/hf/config.json"), 0, &e);
    CHECK(cfg != NULL, "config.json: %s", e.text);
    if (!cfg || iflow_model_open(&m, model_path, 0) < 0)
        return;
    iflow_model_info in;
    iflow_model_get_info(m, &in);
#define CFG(k) (int)json_integer_value(json_object_get(cfg, k))
    CHECK(in.n_vocab == CFG("vocab_size") && in.n_ctx_train == CFG("max_position_embeddings") &&
              in.n_layers == CFG("num_hidden_layers") && in.dim == CFG("hidden_size") &&
              in.n_heads == CFG("num_attention_heads") && in.n_kv_heads == CFG("num_key_value_heads") &&
              in.head_dim == CFG("head_dim") && in.ffn_dim == CFG("intermediate_size") && in.bos == CFG("bos_token_id") &&
              in.eos == CFG("eos_token_id"),
          "info %d %d %d %d %d %d %d %d %d %d", in.n_vocab, in.n_ctx_train, in.n_layers, in.dim, in.n_heads,
          in.n_kv_heads, in.head_dim, in.ffn_dim, in.bos, in.eos);
#undef CFG
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    CHECK(tok && iflow_tokenizer_n_vocab(tok) == in.n_vocab && iflow_tokenizer_bos(tok) == in.bos, "the tokenizer agrees");
    CHECK(iflow_model_is_eos(m, in.eos) && !iflow_model_is_eos(m, in.bos), "eos");
    /* tokenize and detokenize through the API, freeing with iflow_free */
    int32_t *ids;
    size_t n;
    char *text;
    size_t len;
    CHECK(iflow_tokenizer_encode(tok, "Once upon a time", 16, IFLOW_TOK_ADD_BOS, &ids, &n) == 0 && n > 1 && ids[0] == in.bos,
          "encode with BOS");
    CHECK(iflow_tokenizer_decode(tok, ids, n, &text, &len) == 0 && strcmp(text, "Once upon a time") == 0,
          "decode gives the text back: '%s'", text);
    iflow_free(ids);
    iflow_free(text);
    json_decref(cfg);
    iflow_model_close(m);
}

static void test_ppl_windows(void)
{
    iflow_model *m;
    iflow_ctx *c;
    if (iflow_model_open(&m, model_path, 0) < 0 || iflow_ctx_open(&c, m, 32, 1) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return;
    }
    int32_t text[100];
    for (int i = 0; i < 100; i++)
        text[i] = 3 + (int32_t)(rnd_u32() % 500);
    static const size_t lens[] = {0, 1, 30, 31, 32, 33, 62, 63, 64, 100};
    for (int proto = 0; proto < 2; proto++)
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
            for (long maxw = 0; maxw < 3; maxw += 2) {
                iflow_ppl_opts o = {.protocol = proto, .n_ctx = 32, .max_windows = maxw};
                iflow_ppl_result r;
                int rc = iflow_ppl_run(c, text, lens[k], 1, &o, &r, NULL, NULL);
                CHECK(rc == 0, "ppl_run: %s", iflow_errmsg());
                CHECK(iflow_ppl_windows(lens[k], &o) == r.n_windows, "protocol %d, %zu tokens, max %ld: %ld windows, run %ld",
                      proto, lens[k], maxw, iflow_ppl_windows(lens[k], &o), r.n_windows);
            }
    iflow_ctx_close(c);
    iflow_model_close(m);
}

typedef struct {
    char buf[4096];
    size_t n;
} pieces;

static void collect(void *user, const char *t, size_t n)
{
    pieces *p = user;
    if (p->n + n < sizeof p->buf)
        memcpy(p->buf + p->n, t, n), p->n += n;
}

static void test_generate(void)
{
    iflow_model *m;
    iflow_ctx *c;
    if (iflow_model_open(&m, model_path, 0) < 0 || iflow_ctx_open(&c, m, 0, 1) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return;
    }
    /* the reference: a greedy loop over the evaluation API */
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    int32_t *ids, ref[40];
    size_t n;
    int n_ref = 0, V = iflow_ctx_n_vocab(c);
    float *logits = malloc(sizeof(float) * (size_t)V);
    iflow_tokenizer_encode(tok, "Lily and Tom", 12, IFLOW_TOK_ADD_BOS, &ids, &n);
    CHECK(iflow_ctx_eval(c, ids, (int)n, logits, 0) == 0, "prefill: %s", iflow_errmsg());
    while (n_ref < 40) {
        int32_t t = iflow_argmax(logits, V);
        if (iflow_model_is_eos(m, t))
            break;
        ref[n_ref++] = t;
        if (iflow_ctx_eval(c, &t, 1, logits, 0) < 0)
            break;
    }
    CHECK(n_ref >= 8, "the reference continuation has %d tokens", n_ref);
    iflow_generate_params gp;
    iflow_generate_params_default(&gp);
    CHECK(gp.max_tokens == 128 && gp.add_bos == 1 && gp.sampling.top_k == 40, "defaults");
    gp.max_tokens = 40;
    gp.sampling.temp = 0;
    gp.n_threads = 1;
    pieces p = {.n = 0};
    gp.on_text = collect, gp.user = &p;
    iflow_result *r = NULL;
    CHECK(iflow_generate(m, "Lily and Tom", &gp, &r) == 0, "generate: %s", iflow_errmsg());
    if (r) {
        CHECK(r->n_tokens == n_ref && memcmp(r->tokens, ref, sizeof(int32_t) * (size_t)n_ref) == 0,
              "greedy tokens equal the evaluation loop's (%d vs %d)", r->n_tokens, n_ref);
        CHECK(r->n_prompt == (int)n, "prompt tokens %d vs %zu", r->n_prompt, n);
        CHECK(p.n == r->text_len && memcmp(p.buf, r->text, p.n) == 0, "on_text pieces make the text");
        CHECK(r->finish == (n_ref == 40 ? IFLOW_FINISH_LENGTH : IFLOW_FINISH_EOS), "finish %s", iflow_finish_name(r->finish));
        iflow_result_free(r);
    }
    /* seeded sampling repeats; another seed differs */
    gp.on_text = NULL;
    gp.sampling.temp = 1.0f, gp.sampling.seed = 11;
    iflow_result *a = NULL, *b = NULL, *d = NULL;
    iflow_generate(m, "Lily and Tom", &gp, &a);
    iflow_generate(m, "Lily and Tom", &gp, &b);
    gp.sampling.seed = 12;
    iflow_generate(m, "Lily and Tom", &gp, &d);
    CHECK(a && b && d && strcmp(a->text, b->text) == 0, "the same seed repeats");
    CHECK(a && d && strcmp(a->text, d->text) != 0, "another seed differs: '%s'", a ? a->text : "");
    iflow_result_free(a), iflow_result_free(b), iflow_result_free(d);
    /* errors */
    gp.max_tokens = 0;
    r = NULL;
    CHECK_ERR(iflow_generate(m, "x", &gp, &r), IFLOW_EINVAL, "max_tokens", "at least 1");
    CHECK(r == NULL, "no result on failure");
    gp.max_tokens = 4, gp.n_stop = IFLOW_MAX_STOP + 1;
    CHECK_ERR(iflow_generate(m, "x", &gp, &r), IFLOW_EINVAL, "stop strings", "from 0 to 8");
    gp.n_stop = 0, gp.add_bos = 0;
    CHECK_ERR(iflow_generate(m, "", &gp, &r), IFLOW_EINVAL, "prompt", "empty");
    free(logits);
    free(ids);
    iflow_ctx_close(c);
    iflow_model_close(m);
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(model_path, sizeof model_path, "%s/s.ifs", dir);
    if (test_convert("models/stories260K/hf", model_path, -1)) {
        fprintf(stderr, "test data missing or conversion failed\n");
        return check_summary("test_api") | 1;
    }
    RUN(test_version);
    RUN(test_errors);
    RUN(test_info);
    RUN(test_ppl_windows);
    RUN(test_generate);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_api");
}
