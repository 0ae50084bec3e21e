/* test_api.c -- include/iflow.h, the public API, used as a program outside the repository
 * would: everything above main() sees only iflow.h's declarations (an undeclared function is an
 * error here), main() alone converts the test model with the internal converter:
 *   - the version functions agree with the header's macros;
 *   - every error code has its own name and description; others are "unknown";
 *   - iflow_model_get_info() against config.json read here with jansson;
 *   - iflow_ppl_windows() against the windows iflow_ppl_run() scores, for both protocols,
 *     text lengths around the window and a window limit;
 *   - iflow_generate() against an independent greedy loop (iflow_ctx_eval + iflow_argmax), its
 *     on_text pieces against its text, a seeded run repeating, the EOS raised by a logit bias
 *     (ending at once, after min_tokens greedy tokens, or never with ignore_eos), a stop token
 *     (the greedy tokens before it), the greedy tokens as the allowed set (the greedy text), the
 *     first greedy token's text as a bad word (not taken), and its argument errors;
 *   - the sampler: iflow-run's defaults, parameters set by name (and refused by name), the
 *     distribution of top-k and of min-p draws against softmax computed here in double, the
 *     repeat penalty against llama.cpp's rule, seeds and reset, greedy = iflow_argmax on the
 *     model's logits;
 *   - batches: requests of several prompts, greedy and seeded, queued behind parallel 2 with
 *     prompts split over steps, each against an independent loop over the public evaluation and
 *     sampler API (iflow_ctx_eval, iflow_sampler_accept / _sample: the same tokens) and against
 *     itself alone through iflow_generate; a stop string, on_text pieces, user pointers, the
 *     stats, and the requests a batch refuses;
 *   - grammars: iflow_generate under a GBNF grammar gives text of its shape; a bad grammar
 *     refused; the regex and JSON Schema converters are exported;
 *   - chat: a model without a template refused, a conversation's tokens through Llama 2's template
 *     file equal to the tokens of jinja2's rendering of it (tests/fixtures/chat/expected.jsonl),
 *     messages that are not JSON or not a chat refused;
 *   - LoRA adapters: iflow_model_load_lora per request and for every sequence (test_lora). */
#pragma GCC diagnostic error "-Wimplicit-function-declaration"
#include "include/iflow.h"
#include "tests/unit/check.h"
#include "tests/unit/chatref.h"

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

/* The test model and a context of n_ctx positions (0: the model's) on one thread: 0, or -1
 * with a failed check. */
static int open_model(iflow_model **m, iflow_ctx **c, int n_ctx)
{
    *m = NULL;
    if (iflow_model_open(m, model_path, 0) < 0 || iflow_ctx_open(c, *m, n_ctx, 1) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        iflow_model_close(*m);
        *m = NULL;
        return -1;
    }
    return 0;
}

static void test_ppl_windows(void)
{
    iflow_model *m;
    iflow_ctx *c;
    if (open_model(&m, &c, 32) < 0)
        return;
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

/* The reference continuation of prompt ids[n] by the evaluation API alone, from an empty
 * context c: sp NULL takes iflow_argmax of each step's logits; else a sampler of sp accepts the
 * prompt and each token and samples the next. Stops at EOS (not included) or max tokens;
 * returns the count written to out[max]. */
static int ref_continuation(const iflow_model *m, iflow_ctx *c, const int32_t *ids, size_t n,
                            const iflow_sampler_params *sp, int max, int32_t *out)
{
    int V = iflow_ctx_n_vocab(c), n_out = 0;
    float *logits = malloc(sizeof(float) * (size_t)V);
    iflow_sampler *s = NULL;
    iflow_ctx_reset(c);
    if (!logits || (sp && iflow_sampler_open(&s, sp, V) < 0)) {
        CHECK(0, "reference: %s", iflow_errmsg());
        free(logits);
        return 0;
    }
    for (size_t i = 0; s && i < n; i++)
        iflow_sampler_accept(s, ids[i]);
    CHECK(iflow_ctx_eval(c, ids, (int)n, logits, 0) == 0, "prefill: %s", iflow_errmsg());
    while (n_out < max) {
        int32_t t = s ? iflow_sampler_sample(s, logits) : iflow_argmax(logits, V);
        if (iflow_model_is_eos(m, t))
            break;
        out[n_out++] = t;
        if (s)
            iflow_sampler_accept(s, t);
        if (n_out < max && iflow_ctx_eval(c, &t, 1, logits, 0) < 0)
            break;
    }
    iflow_sampler_close(s);
    free(logits);
    return n_out;
}

static void test_generate(void)
{
    iflow_model *m;
    iflow_ctx *c;
    if (open_model(&m, &c, 0) < 0)
        return;
    /* the reference: a greedy loop over the evaluation API */
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    int32_t *ids, ref[40];
    size_t n;
    iflow_tokenizer_encode(tok, "Lily and Tom", 12, IFLOW_TOK_ADD_BOS, &ids, &n);
    int n_ref = ref_continuation(m, c, ids, n, NULL, 40, ref);
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
    /* the model's EOS raised by +100 ends the text at once; with min_tokens 3, after the 3 greedy
     * tokens; with ignore_eos never: the greedy tokens */
    iflow_model_info info;
    iflow_model_get_info(m, &info);
    const float up = 100;
    gp.sampling.temp = 0, gp.max_tokens = 12, gp.bias_ids = &info.eos, gp.bias_values = &up, gp.n_bias = 1;
    for (int k = 0; k < 3; k++) {
        gp.min_tokens = k == 1 ? 3 : 0, gp.ignore_eos = k == 2;
        r = NULL;
        CHECK(iflow_generate(m, "Lily and Tom", &gp, &r) == 0, "generate: %s", iflow_errmsg());
        const int want = k == 0 ? 0 : k == 1 ? 3 : 12;
        CHECK(r && r->n_tokens == want && !memcmp(r->tokens, ref, sizeof(int32_t) * (size_t)want) &&
                  r->finish == (k == 2 ? IFLOW_FINISH_LENGTH : IFLOW_FINISH_EOS),
              "EOS +100, min_tokens %d, ignore_eos %d: %d greedy tokens", gp.min_tokens, gp.ignore_eos, want);
        iflow_result_free(r);
    }
    gp.n_bias = 0, gp.min_tokens = 0, gp.ignore_eos = 0;
    /* a stop token (the 4th greedy one, kept out); allowed tokens (the greedy ones: the same text);
     * a bad word: the greedy text's 4th token's text, banned, is not where it was */
    gp.stop_ids = &ref[3], gp.n_stop_ids = 1;
    r = NULL;
    CHECK(iflow_generate(m, "Lily and Tom", &gp, &r) == 0, "generate: %s", iflow_errmsg());
    int first = 0; /* the first position of ref[3] among the greedy tokens */
    while (ref[first] != ref[3])
        first++;
    CHECK(r && r->finish == IFLOW_FINISH_STOP && r->stop_token == ref[3] && r->n_tokens == first &&
              !memcmp(r->tokens, ref, sizeof(int32_t) * (size_t)first),
          "stop token %d: the %d greedy tokens before it", ref[3], first);
    iflow_result_free(r);
    gp.stop_ids = NULL, gp.n_stop_ids = 0;
    gp.allowed_ids = ref, gp.n_allowed = 12;
    r = NULL;
    CHECK(iflow_generate(m, "Lily and Tom", &gp, &r) == 0, "generate: %s", iflow_errmsg());
    CHECK(r && r->n_tokens == 12 && !memcmp(r->tokens, ref, sizeof(int32_t) * 12),
          "allowed: the 12 greedy tokens, the greedy text");
    iflow_result_free(r);
    gp.allowed_ids = NULL, gp.n_allowed = 0;
    char piece[64];
    int np = iflow_tokenizer_piece(tok, ref[0], 1, piece, sizeof piece - 1);
    piece[np > 0 ? np : 0] = 0;
    const char *bad[1] = {piece};
    gp.bad_words = bad, gp.n_bad_words = 1;
    r = NULL;
    CHECK(np > 0 && iflow_generate(m, "Lily and Tom", &gp, &r) == 0, "generate: %s", iflow_errmsg());
    CHECK(r && r->n_tokens > 0 && r->tokens[0] != ref[0], "bad word '%s': the first greedy token is not taken", piece);
    iflow_result_free(r);
    gp.n_bad_words = IFLOW_MAX_BAD_WORDS + 1;
    CHECK_ERR(iflow_generate(m, "x", &gp, &r), IFLOW_EINVAL, "129 bad words", "from 0 to 128");
    gp.bad_words = NULL, gp.n_bad_words = 0;
    /* errors */
    gp.max_tokens = 0;
    r = NULL;
    CHECK_ERR(iflow_generate(m, "x", &gp, &r), IFLOW_EINVAL, "max_tokens", "at least 1");
    CHECK(r == NULL, "no result on failure");
    gp.max_tokens = 4, gp.n_stop = IFLOW_MAX_STOP + 1;
    CHECK_ERR(iflow_generate(m, "x", &gp, &r), IFLOW_EINVAL, "stop strings", "from 0 to 8");
    gp.n_stop = 0, gp.add_bos = 0;
    CHECK_ERR(iflow_generate(m, "", &gp, &r), IFLOW_EINVAL, "prompt", "empty");
    /* a grammar: the text is one of the choices, whatever the sampler draws; a bad one refused */
    gp.add_bos = 1, gp.max_tokens = 16, gp.sampling.seed = 5;
    iflow_grammar *g = NULL;
    const char *gbnf = "root ::= \" \" (\"went\" | \"and\" | \"saw\") \" the \" [a-z]+ \".\"";
    CHECK(iflow_grammar_open(&g, gbnf, strlen(gbnf), NULL) == 0, "grammar: %s", iflow_errmsg());
    gp.grammar = g;
    r = NULL;
    CHECK(iflow_generate(m, "Lily and Tom", &gp, &r) == 0, "generate with a grammar: %s", iflow_errmsg());
    if (r) {
        size_t n_text = strlen(r->text);
        int shaped = n_text > 7 && r->text[n_text - 1] == '.' &&
                     (!strncmp(r->text, " went the ", 10) || !strncmp(r->text, " and the ", 9) ||
                      !strncmp(r->text, " saw the ", 9));
        CHECK(shaped || r->finish == IFLOW_FINISH_LENGTH, "'%s' (%s) follows the grammar", r->text,
              iflow_finish_name(r->finish));
        iflow_result_free(r);
    }
    iflow_grammar_close(g);
    gp.grammar = NULL;
    g = NULL;
    CHECK_ERR(iflow_grammar_open(&g, "root ::= [", 10, NULL), IFLOW_EINVAL, "grammar:", "a class is not closed");
    char *text = NULL;
    CHECK(iflow_grammar_from_regex("[0-9]{2}", 8, "root", &text) == 0 && text, "regex: %s", iflow_errmsg());
    free(text);
    text = NULL;
    CHECK(iflow_grammar_from_json_schema("{\"type\":\"integer\"}", 18, &text) == 0 && text, "schema: %s",
          iflow_errmsg());
    free(text);
    free(ids);
    iflow_ctx_close(c);
    iflow_model_close(m);
}

/* ---- the sampler ---- */

#define NL 8
static const float L8[NL] = {2.0f, 1.5f, 1.1f, 0.9f, 0.3f, -0.2f, -1.0f, -2.5f};

/* Draw n tokens from a fresh sampler of p over L8; counts[NL] of each. */
static void draw(const iflow_sampler_params *p, int n, int *counts)
{
    iflow_sampler *s;
    memset(counts, 0, sizeof(int) * NL);
    if (iflow_sampler_open(&s, p, NL) < 0) {
        CHECK(0, "sampler_open: %s", iflow_errmsg());
        return;
    }
    for (int i = 0; i < n; i++) {
        int32_t t = iflow_sampler_sample(s, L8);
        CHECK(t >= 0 && t < NL, "token %d", t);
        if (t >= 0 && t < NL)
            counts[t]++;
    }
    iflow_sampler_close(s);
}

/* The draws' frequencies against softmax(L8 / temp) over the tokens keep[] keeps (in double,
 * here): within 0.015 (4 standard deviations of 20000 draws at p = 0.5); kept out: never. */
static void check_distribution(const char *what, const int *counts, int n, const int *keep, double temp)
{
    double z = 0, p[NL];
    for (int i = 0; i < NL; i++)
        z += p[i] = keep[i] ? exp((L8[i] - L8[0]) / temp) : 0;
    for (int i = 0; i < NL; i++) {
        double f = (double)counts[i] / n;
        CHECK(fabs(f - p[i] / z) <= 0.015 && (keep[i] || counts[i] == 0), "%s: token %d drawn %.4f, expected %.4f", what,
              i, f, p[i] / z);
    }
}

static void test_sampler(void)
{
    iflow_sampler_params p;
    iflow_sampler_params_default(&p);
    CHECK(p.kind == IFLOW_SAMPLER_CHAIN && p.temp == 0.8f && p.top_k == 40 && p.top_p == 0.95f && p.seed == 0 &&
              p.min_p == 0 && p.repeat_penalty == 0,
          "iflow-run's defaults: temp %g, top-k %d, top-p %g", p.temp, p.top_k, p.top_p);
    /* by name, as requests and iflow-run's options spell them */
    CHECK(iflow_sampler_params_set(&p, "temperature", "0.7") == 0 && p.temp == 0.7f, "temperature");
    CHECK(iflow_sampler_params_set(&p, "top_k", "5") == 0 && p.top_k == 5, "top_k");
    CHECK(iflow_sampler_params_set(&p, "--top-p", "1") == 0 && p.top_p == 1.0f, "--top-p");
    CHECK(iflow_sampler_params_set(&p, "seed", "18446744073709551615") == 0 && p.seed == UINT64_MAX, "seed");
    CHECK(iflow_sampler_params_set(&p, "sampler", "mirostat2") == 0 && p.kind == IFLOW_SAMPLER_MIROSTAT2, "sampler");
    CHECK(iflow_sampler_params_set(&p, "sampler", "chain") == 0 && p.kind == IFLOW_SAMPLER_CHAIN, "sampler chain");
    CHECK_ERR(iflow_sampler_params_set(&p, "top_q", "1"), IFLOW_EINVAL, "'top_q'", "unknown sampling parameter");
    CHECK_ERR(iflow_sampler_params_set(&p, "top_k", "ten"), IFLOW_EINVAL, "top_k", "invalid value 'ten'");
    CHECK_ERR(iflow_sampler_params_set(&p, "temperature", "-1"), IFLOW_EINVAL, "temperature", "invalid value '-1'");
    CHECK(p.temp == 0.7f && p.top_k == 5, "a refused value changes nothing");
    char line[256];
    iflow_sampler *s;
    if (iflow_sampler_open(&s, &p, NL) == 0) {
        iflow_sampler_describe(s, line, sizeof line);
        CHECK(strstr(line, "top-k 5") && strstr(line, "temp 0.7"), "describe: %s", line);
        iflow_sampler_close(s);
    }

    /* top-k 5 at temperature 0.7: softmax(L / 0.7) over the 5 best */
    enum { N = 20000 };
    int counts[NL], again[NL];
    int top5[NL] = {1, 1, 1, 1, 1, 0, 0, 0};
    p.seed = 3;
    draw(&p, N, counts);
    check_distribution("top-k 5, temp 0.7", counts, N, top5, 0.7);
    draw(&p, N, again);
    CHECK(memcmp(counts, again, sizeof counts) == 0, "the same seed draws the same tokens");
    /* min-p 0.3 at temperature 1, nothing else: the tokens at least 0.3 as likely as the best
     * (L >= 2 + ln 0.3 = 0.796: the first four) */
    iflow_sampler_params mp = {.temp = 1, .min_p = 0.3f, .seed = 9};
    int minp[NL] = {1, 1, 1, 1, 0, 0, 0, 0};
    draw(&mp, N, counts);
    check_distribution("min-p 0.3", counts, N, minp, 1.0);

    /* seeds: a sampler of the same seed draws the same tokens, another seed others */
    int32_t a[64], b[64], c[64];
    iflow_sampler *s2, *s3;
    p.seed = 3;
    iflow_sampler_open(&s, &p, NL);
    iflow_sampler_open(&s2, &p, NL);
    p.seed = 4;
    iflow_sampler_open(&s3, &p, NL);
    for (int i = 0; i < 64; i++)
        a[i] = iflow_sampler_sample(s, L8), b[i] = iflow_sampler_sample(s2, L8), c[i] = iflow_sampler_sample(s3, L8);
    CHECK(memcmp(a, b, sizeof a) == 0, "the same seed draws the same tokens");
    CHECK(memcmp(a, c, sizeof a) != 0, "another seed draws others");
    iflow_sampler_close(s), iflow_sampler_close(s2), iflow_sampler_close(s3);

    /* the repeat penalty, llama.cpp's rule: a positive logit of a token in the window is divided
     * by the penalty (a negative one multiplied); greedy then picks from the rest */
    iflow_sampler_params rp = {0};
    CHECK(iflow_sampler_params_set(&rp, "repeat_penalty", "2") == 0, "repeat_penalty");
    iflow_sampler_open(&s, &rp, NL);
    CHECK(iflow_sampler_sample(s, L8) == 0, "nothing accepted: the best");
    iflow_sampler_accept(s, 0); /* 2.0 -> 1.0, below 1.5 */
    CHECK(iflow_sampler_sample(s, L8) == 1, "token 0 penalized: token 1");
    iflow_sampler_accept(s, 1); /* 1.5 -> 0.75, below 1.1 and above token 0's 1.0 */
    CHECK(iflow_sampler_sample(s, L8) == 2, "tokens 0 and 1 penalized: token 2");
    CHECK_ERR(iflow_sampler_accept(s, NL), IFLOW_ERANGE, "token 8", "outside the vocabulary");
    iflow_sampler_reset(s); /* a new sequence: nothing accepted */
    CHECK(iflow_sampler_sample(s, L8) == 0, "after reset: the best again");
    iflow_sampler_close(s);

    /* on the model's logits: greedy and top-k 1 are iflow_argmax */
    iflow_model *m;
    iflow_ctx *ctx;
    if (open_model(&m, &ctx, 64) < 0)
        return;
    int V = iflow_ctx_n_vocab(ctx);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t ids[] = {1, 403, 407, 261, 378}; /* BOS "Once upon a time" */
    iflow_sampler_params greedy = {0}, top1 = {.temp = 1.5f, .top_k = 1, .seed = 5};
    iflow_sampler *g, *t1;
    iflow_sampler_open(&g, &greedy, V);
    iflow_sampler_open(&t1, &top1, V);
    for (int i = 0; i < 5; i++) {
        CHECK(iflow_ctx_eval(ctx, &ids[i], 1, logits, 0) == 0, "eval: %s", iflow_errmsg());
        int32_t want = iflow_argmax(logits, V);
        CHECK(iflow_sampler_sample(g, logits) == want && iflow_sampler_sample(t1, logits) == want,
              "position %d: greedy and top-k 1 take the argmax %d", i, want);
    }
    iflow_sampler_close(g), iflow_sampler_close(t1);
    free(logits);
    iflow_ctx_close(ctx);
    iflow_model_close(m);
}

/* ---- batches ---- */

enum { N_REQ = 6, MAX_TOK = 24 };

typedef struct {
    int index;     /* the request's */
    pieces text;   /* its on_text pieces */
} req_user;

static void collect_req(void *user, const char *t, size_t n)
{
    collect(&((req_user *)user)->text, t, n);
}

/* One greedy request of prompt under grammar g from marker `after` on: its result (free it). */
static iflow_result *one_request(iflow_model *m, const int32_t *ids, size_t n, const iflow_grammar *g,
                                 const char *after, int max_tokens, int *add_rc)
{
    iflow_batch_params bp = {.parallel = 1, .n_threads = 1, .n_ctx = 128};
    iflow_batch *b;
    iflow_result *r = NULL;
    if (iflow_batch_open(&b, m, &bp) < 0)
        return NULL;
    iflow_request q = {.prompt = ids, .n_prompt = (int)n, .max_tokens = max_tokens, .grammar = g,
                       .grammar_after = after};
    if ((*add_rc = iflow_batch_add(b, &q)) == 0) {
        while (iflow_batch_step(b) > 0)
            ;
        if (iflow_batch_take(b, &r) != 1)
            r = NULL;
    }
    iflow_batch_close(b);
    return r;
}

/* A grammar that waits for a marker (iflow_request.grammar_after, a reasoning model's </think>):
 * the greedy text is free up to the marker, then the grammar's. The marker is the text of
 * stories260K's first two greedy tokens; after it the grammar allows " and the end." only. A
 * marker that never comes leaves the whole reply free; one of 64 bytes is refused. */
static void test_grammar_after(void)
{
    iflow_model *m;
    iflow_ctx *c;
    if (open_model(&m, &c, 0) < 0)
        return;
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    int32_t *ids;
    size_t n;
    iflow_tokenizer_encode(tok, "Once upon a time", 16, IFLOW_TOK_ADD_BOS, &ids, &n);
    int rc;
    iflow_result *free_run = one_request(m, ids, n, NULL, NULL, 24, &rc);
    CHECK(free_run && free_run->n_tokens >= 3, "the free reply: %s", iflow_errmsg());
    iflow_grammar *g = NULL;
    const char *gbnf = "root ::= \" and the end.\"";
    CHECK(iflow_grammar_open(&g, gbnf, strlen(gbnf), NULL) == 0, "grammar: %s", iflow_errmsg());
    if (free_run && g) {
        char marker[128], want[256];
        size_t k = 0;
        for (int i = 0; i < 2; i++) {
            int p = iflow_tokenizer_piece(tok, free_run->tokens[i], i == 0, marker + k, 64);
            k += p > 0 ? (size_t)p : 0;
        }
        marker[k] = 0;
        snprintf(want, sizeof want, "%s and the end.", marker);
        iflow_result *r = one_request(m, ids, n, g, marker, 24, &rc);
        CHECK(r && strcmp(r->text, want) == 0 && r->finish == IFLOW_FINISH_GRAMMAR,
              "free up to '%s', then the grammar: '%s' (%s)", marker, r ? r->text : iflow_errmsg(),
              r ? iflow_finish_name(r->finish) : "");
        iflow_result_free(r);
        r = one_request(m, ids, n, g, "never in this story", 24, &rc);
        CHECK(r && strcmp(r->text, free_run->text) == 0 && r->finish == free_run->finish,
              "no marker: the free reply ('%s')", r ? r->text : iflow_errmsg());
        iflow_result_free(r);
        char too_long[IFLOW_MAX_GRAMMAR_AFTER + 2];
        memset(too_long, 'x', sizeof too_long - 1);
        too_long[sizeof too_long - 1] = 0;
        r = one_request(m, ids, n, g, too_long, 24, &rc);
        CHECK_ERR(rc, IFLOW_EINVAL, "grammar_after", "at most 63");
        CHECK(!r, "refused: no result");
    }
    iflow_result_free(free_run);
    iflow_grammar_close(g);
    free(ids);
    iflow_ctx_close(c);
    iflow_model_close(m);
}

static void test_batch(void)
{
    static const char *const prompts[N_REQ] = {"Lily and Tom", "Once upon a time", "The little dog",
                                               "One day, a", "Lily and Tom", "Once upon a time"};
    iflow_model *m;
    iflow_ctx *c;
    if (open_model(&m, &c, 0) < 0)
        return;
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    int32_t *ids[N_REQ], ref[N_REQ][MAX_TOK];
    size_t n_ids[N_REQ];
    int n_ref[N_REQ];
    iflow_request req[N_REQ];
    req_user users[N_REQ];
    /* requests 0-3 greedy; 4 and 5 sampled (the same prompts as 0 and 1, other seeds): each
     * reference its own loop over the public evaluation and sampler API */
    for (int i = 0; i < N_REQ; i++) {
        iflow_tokenizer_encode(tok, prompts[i], strlen(prompts[i]), IFLOW_TOK_ADD_BOS, &ids[i], &n_ids[i]);
        req[i] = (iflow_request){.prompt = ids[i], .n_prompt = (int)n_ids[i], .max_tokens = MAX_TOK,
                                 .user = &users[i], .on_text = collect_req};
        users[i] = (req_user){.index = i};
        if (i >= 4) {
            iflow_sampler_params_default(&req[i].sampling);
            req[i].sampling.seed = 100 + (uint64_t)i;
        }
        n_ref[i] = ref_continuation(m, c, ids[i], n_ids[i], i >= 4 ? &req[i].sampling : NULL, MAX_TOK, ref[i]);
    }
    CHECK(n_ref[0] > 0 && (n_ref[4] != n_ref[0] || memcmp(ref[4], ref[0], sizeof(int32_t) * (size_t)n_ref[0]) != 0),
          "the sampled request differs from the greedy one on its prompt");
    /* a stop string in request 0's greedy text (its pieces as a continuation): cut before it */
    char ref0[1024];
    size_t len0 = 0;
    for (int k = 0, n; k < n_ref[0] && len0 + 64 < sizeof ref0; k++)
        if ((n = iflow_tokenizer_piece(tok, ref[0][k], 0, ref0 + len0, 64)) > 0)
            len0 += (size_t)n;
    ref0[len0] = 0;
    const char *stop_at = strstr(ref0, " play");
    CHECK(stop_at != NULL, "' play' is in the greedy text: %s", ref0);
    if (!stop_at)
        return;
    req[0].stop[0] = " play", req[0].n_stop = 1;

    /* parallel 2 and 8-token steps: requests wait in the queue, prompts take several steps */
    iflow_batch_params bp = {.parallel = 2, .step_tokens = 8, .n_threads = 1, .n_ctx = 128};
    iflow_batch *b;
    if (iflow_batch_open(&b, m, &bp) < 0) {
        CHECK(0, "batch_open: %s", iflow_errmsg());
        return;
    }
    for (int i = 0; i < 3; i++)
        CHECK(iflow_batch_add(b, &req[i]) == 0, "add %d: %s", i, iflow_errmsg());
    iflow_result *res[N_REQ] = {0};
    int added = 3, taken = 0, steps = 0, rc;
    iflow_batch_stats st;
    do {
        rc = iflow_batch_step(b);
        CHECK(rc >= 0, "step: %s", iflow_errmsg());
        if (rc < 0)
            break;
        if (++steps == 5) /* the rest join a running batch */
            for (; added < N_REQ; added++)
                CHECK(iflow_batch_add(b, &req[added]) == 0, "add %d: %s", added, iflow_errmsg());
        iflow_result *r;
        while (iflow_batch_take(b, &r) == 1) {
            int i = ((req_user *)r->user)->index;
            CHECK(r->user == &users[i] && !res[i], "result %d handed back once, with its user pointer", i);
            res[i] = r, taken++;
        }
        if (steps == 1) { /* nothing finished yet */
            iflow_batch_get_stats(b, &st);
            CHECK(st.running >= 1 && st.running <= 2 && st.running + st.queued == 3, "parallel 2: %d running, %d queued",
                  st.running, st.queued);
        }
    } while (rc > 0 || added < N_REQ);
    CHECK(taken == N_REQ && iflow_batch_pending(b) == 0, "%d results of %d", taken, N_REQ);
    uint64_t gen = 0, prompt = 0;
    for (int i = 0; i < N_REQ; i++) {
        iflow_result *r = res[i];
        if (!r)
            continue;
        gen += (uint64_t)r->n_tokens, prompt += (uint64_t)r->n_prompt;
        CHECK(r->n_prompt == (int)n_ids[i], "request %d: %d prompt tokens", i, r->n_prompt);
        CHECK(users[i].text.n == r->text_len && memcmp(users[i].text.buf, r->text, r->text_len) == 0,
              "request %d: on_text pieces make the text", i);
        if (i == 0) { /* stopped at " play": the reference's text before it */
            CHECK(r->finish == IFLOW_FINISH_STOP && r->stop_index == 0, "request 0 stops at ' play': %s",
                  iflow_finish_name(r->finish));
            CHECK(r->text_len == (size_t)(stop_at - ref0) && memcmp(r->text, ref0, r->text_len) == 0,
                  "request 0: the greedy text cut before ' play': '%s' vs '%.*s'", r->text, (int)(stop_at - ref0), ref0);
            continue;
        }
        CHECK(r->n_tokens == n_ref[i] && memcmp(r->tokens, ref[i], sizeof(int32_t) * (size_t)n_ref[i]) == 0,
              "request %d (%s): the reference loop's tokens (%d vs %d)", i, i >= 4 ? "sampled" : "greedy", r->n_tokens,
              n_ref[i]);
        CHECK(r->finish == (n_ref[i] == MAX_TOK ? IFLOW_FINISH_LENGTH : IFLOW_FINISH_EOS), "request %d: finish %s", i,
              iflow_finish_name(r->finish));
        /* alone, through iflow_generate: the same tokens as in the batch */
        iflow_generate_params gp;
        iflow_generate_params_default(&gp);
        gp.max_tokens = MAX_TOK, gp.sampling = req[i].sampling, gp.n_threads = 1;
        iflow_result *alone = NULL;
        CHECK(iflow_generate(m, prompts[i], &gp, &alone) == 0, "generate: %s", iflow_errmsg());
        CHECK(alone && alone->n_tokens == r->n_tokens &&
                  memcmp(alone->tokens, r->tokens, sizeof(int32_t) * (size_t)r->n_tokens) == 0,
              "request %d alone gives the tokens it gave in the batch", i);
        iflow_result_free(alone);
    }
    iflow_batch_get_stats(b, &st);
    CHECK(st.generated == gen && st.prompt == prompt, "stats: %llu generated (%llu), %llu prompt (%llu)",
          (unsigned long long)st.generated, (unsigned long long)gen, (unsigned long long)st.prompt,
          (unsigned long long)prompt);
    CHECK(st.running == 0 && st.queued == 0 && st.blocks_used == 0 && st.blocks_peak > 0 && st.steps == (uint64_t)steps,
          "stats at the end: %d running, %d queued, %d blocks used (peak %d), %llu steps", st.running, st.queued,
          st.blocks_used, st.blocks_peak, (unsigned long long)st.steps);

    /* requests a batch refuses, nothing queued */
    int32_t bad_tok[] = {1, 100000}, one[] = {1};
    iflow_request e = {.prompt = bad_tok, .n_prompt = 2, .max_tokens = 4};
    CHECK_ERR(iflow_batch_add(b, &e), IFLOW_ERANGE, "100000", "outside the vocabulary");
    e.n_prompt = 0;
    CHECK_ERR(iflow_batch_add(b, &e), IFLOW_EINVAL, "prompt", "no tokens");
    e = (iflow_request){.prompt = one, .n_prompt = 1, .max_tokens = 0};
    CHECK_ERR(iflow_batch_add(b, &e), IFLOW_EINVAL, "max_tokens", "at least 1");
    CHECK(iflow_batch_pending(b) == 0, "nothing queued");
    iflow_batch_close(b);
    for (int i = 0; i < N_REQ; i++)
        iflow_result_free(res[i]), iflow_free(ids[i]);
    iflow_ctx_close(c);
    iflow_model_close(m);
}

static void test_chat(void)
{
    iflow_model *m;
    iflow_chat *c = NULL;
    if (iflow_model_open(&m, model_path, 0) < 0)
        SKIP("cannot open %s: %s", model_path, iflow_errmsg());
    int rc = iflow_chat_open(&c, m, NULL);
    CHECK_ERR(rc, IFLOW_ENOTFOUND, "s.ifs", "has no chat template");
    CHECK(c == NULL, "no chat handle on failure");
    char *want = chatref_expected("llama2", "system_user", 1, NULL);
    CHECK(want != NULL, "fixture chat/expected.jsonl has llama2/system_user");
    const char *msgs = "[{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"},"
                       " {\"role\": \"user\", \"content\": \"What is the capital of France?\"}]";
    int32_t *ids = NULL, *ref = NULL;
    size_t n = 0, n_ref = 0;
    if (want && iflow_chat_open(&c, m, test_fixture("chat/templates/llama2.jinja")) == 0) {
        CHECK(iflow_chat_tokens(c, msgs, strlen(msgs), 1, &ids, &n) == 0, "chat tokens: %s", iflow_errmsg());
        CHECK(iflow_tokenizer_encode(iflow_model_tokenizer(m), want, strlen(want), IFLOW_TOK_PARSE_SPECIAL, &ref,
                                     &n_ref) == 0, "encode jinja2's text");
        CHECK(n == n_ref && n > 10 && memcmp(ids, ref, n * sizeof *ids) == 0, "the tokens of jinja2's text (%zu, %zu)",
              n, n_ref);
        CHECK(n > 0 && ids[0] == iflow_tokenizer_bos(iflow_model_tokenizer(m)), "the template's <s> is the BOS");
        iflow_free(ids);
        rc = iflow_chat_tokens(c, "[{\"role\": ", 11, 1, &ids, &n);
        CHECK_ERR(rc, IFLOW_EFORMAT, "the messages", "invalid json");
        const char *no_role = "[{\"content\": \"x\"}]";
        rc = iflow_chat_tokens(c, no_role, strlen(no_role), 1, &ids, &n);
        CHECK_ERR(rc, IFLOW_EINVAL, "message 0", "has no 'role'");
        rc = iflow_chat_tokens(c, "{}", 2, 1, &ids, &n);
        CHECK_ERR(rc, IFLOW_EINVAL, "'messages'", "must be a list");
        iflow_chat_close(c);
    } else
        CHECK(0, "chat with llama2.jinja: %s", iflow_errmsg());
    iflow_free(ref);
    free(want);
    iflow_model_close(m);
}

/* LoRA adapters through the public API (iflow_model_load_lora): the PEFT fixture adapter for
 * stories260K (tests/fixtures/lora) added per request to one model and to every sequence of
 * another; in one batch a request asking for it gets the greedy tokens of the second model's own
 * evaluation loop, a request asking for none those of the first's (the base). An adapter of
 * another model and a spec path without the model's spec refused, naming what failed. */
static void test_lora(void)
{
    const char *peft = "tests/fixtures/lora/stories260K-peft";
    iflow_model *m, *all;
    iflow_ctx *c, *call;
    if (open_model(&m, &c, 0) < 0)
        return;
    if (open_model(&all, &call, 0) < 0) {
        iflow_ctx_close(c);
        iflow_model_close(m);
        return;
    }
    CHECK(iflow_model_load_lora(m, peft, 1, 1, "/nonexistent:specs") == 1, "per request: %s", iflow_errmsg());
    CHECK(iflow_model_load_lora(all, peft, 1, 0, "specs") == 0, "every sequence: %s", iflow_errmsg());
    CHECK_ERR(iflow_model_load_lora(m, "tests/fixtures/lora/smollm2-peft", 1, 1, "specs"), IFLOW_ESHAPE,
              "smollm2-peft", "[576, 576]");
    CHECK_ERR(iflow_model_load_lora(m, peft, 1, 1, "/nonexistent"), IFLOW_ENOTFOUND, "no spec", "llama");
    int32_t *ids, base[MAX_TOK], tuned[MAX_TOK];
    size_t n;
    iflow_tokenizer_encode(iflow_model_tokenizer(m), "Once upon a time", 16, IFLOW_TOK_ADD_BOS, &ids, &n);
    int n_base = ref_continuation(m, c, ids, n, NULL, MAX_TOK, base);
    int n_tuned = ref_continuation(all, call, ids, n, NULL, MAX_TOK, tuned);
    CHECK(n_base != n_tuned || memcmp(base, tuned, sizeof(int32_t) * (size_t)n_base) != 0,
          "the adapter changes the text");
    iflow_batch_params bp = {.parallel = 2, .n_threads = 1, .n_ctx = 128};
    iflow_batch *b;
    if (iflow_batch_open(&b, m, &bp) == 0) {
        iflow_request q[2] = {{.prompt = ids, .n_prompt = (int)n, .max_tokens = MAX_TOK, .adapter = 1},
                              {.prompt = ids, .n_prompt = (int)n, .max_tokens = MAX_TOK, .user = &q[1]}};
        CHECK(iflow_batch_add(b, &q[0]) == 0 && iflow_batch_add(b, &q[1]) == 0, "add: %s", iflow_errmsg());
        while (iflow_batch_step(b) > 0)
            ;
        iflow_result *r;
        while (iflow_batch_take(b, &r) == 1) {
            const int *want = r->user ? base : tuned, n_want = r->user ? n_base : n_tuned;
            CHECK(r->n_tokens == n_want && !memcmp(r->tokens, want, sizeof(int32_t) * (size_t)n_want),
                  "the request of %s: the tokens of that model's own loop", r->user ? "no adapter" : "adapter 1");
            iflow_result_free(r);
        }
        iflow_batch_close(b);
    } else
        CHECK(0, "batch: %s", iflow_errmsg());
    iflow_free(ids);
    iflow_ctx_close(c);
    iflow_ctx_close(call);
    iflow_model_close(m);
    iflow_model_close(all);
}

/* Only main() converts the test model, with the internal converter (not public API). */
#include "tests/unit/testlib.h"

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
    RUN(test_sampler);
    RUN(test_batch);
    RUN(test_grammar_after);
    RUN(test_chat);
    RUN(test_lora);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_api");
}
