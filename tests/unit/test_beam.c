/*
 * test_beam.c -- beam search (libcore/serving/beam.h) on stories260K.
 *
 * References:
 *   - width 1 against greedy decoding by the batch engine (temperature 0): the same tokens
 *     and the same finish reason, for prompts that end by EOS and by max_tokens;
 *   - every beam's log-probability against an independent rescoring of its tokens (prompt +
 *     tokens, and the EOS if it ended so, through iflow_ctx_eval with every position's logits,
 *     log-softmax in double): within 1e-4;
 *   - width 4 (and 8, F16 cache): the best beam's log-probability at least greedy's (length
 *     penalty 0: scores are plain sums), beams ranked by score = logprob / length^penalty;
 *   - stop strings (one spanning two tokens): a beam that reaches one ends with the token that
 *     completes it, its text cut before it, its log-probability rescored; the others go on;
 *     width 1 with a stop string is the batch engine's greedy decoding with it;
 *   - bad parameters refused.
 */
#include "tests/unit/testlib.h"
#include "kernels/cpu/kvcache.h"
#include "libcore/engine/model.h"
#include "libcore/serving/batch.h"
#include "libcore/serving/beam.h"
#include "libcore/tokenizers/tokenizer.h"

#include <math.h>

static char dir[] = "/tmp/iflow-test-beam-XXXXXX";
static char s260[512], s260eos[600];

/* log p(tokens (+ EOS) | prompt) by a fresh context. */
static double rescore(iflow_model *m, const int32_t *prompt, int np, const int32_t *toks, int nt, int32_t eos)
{
    const int V = iflow_model_hparams(m)->vocab_size;
    int n = np + nt;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    float *lg = malloc(sizeof(float) * (size_t)n * V);
    memcpy(ids, prompt, sizeof(int32_t) * (size_t)np);
    memcpy(ids + np, toks, sizeof(int32_t) * (size_t)nt);
    iflow_ctx *c;
    double sum = 0;
    if (iflow_ctx_open(&c, m, 512, 2) < 0 || iflow_ctx_eval(c, ids, n, lg, 1) < 0) {
        CHECK(0, "rescore: %s", iflow_errmsg());
        sum = NAN;
    }
    for (int t = np - 1; t < n && !isnan(sum); t++) {
        if (t == n - 1 && eos < 0)
            break;
        const float *row = lg + (size_t)t * V;
        double mx = row[0], z = 0;
        for (int i = 1; i < V; i++)
            mx = row[i] > mx ? row[i] : mx;
        for (int i = 0; i < V; i++)
            z += exp((double)row[i] - mx);
        int32_t next = t == n - 1 ? eos : ids[t + 1];
        sum += (double)row[next] - mx - log(z);
    }
    iflow_ctx_close(c);
    free(ids), free(lg);
    return sum;
}

/* The end-of-sequence token greedy decoding drew after g's tokens: the argmax there. */
static int32_t g_eos(iflow_model *m, const int32_t *prompt, int np, const iflow_result *g)
{
    int32_t ids[512], next = -1;
    memcpy(ids, prompt, sizeof(int32_t) * (size_t)np);
    memcpy(ids + np, g->tokens, sizeof(int32_t) * (size_t)g->n_tokens);
    iflow_ctx *c;
    if (iflow_ctx_open(&c, m, 512, 2) == 0 && iflow_ctx_eval_argmax(c, ids, np + g->n_tokens, &next) == 0)
        CHECK(iflow_model_is_eos(m, next), "greedy ended by EOS, but the argmax %d is not one", next);
    iflow_ctx_close(c);
    return next;
}

/* Greedy decoding by the batch engine, with a stop string (or NULL). */
static iflow_result *greedy_stop(iflow_model *m, const int32_t *prompt, int np, int max_tokens, const char *stop)
{
    iflow_batch *b;
    iflow_batch_params p = {.parallel = 1, .n_threads = 2};
    iflow_request r = {.prompt = prompt, .n_prompt = np, .max_tokens = max_tokens, .stop = {stop}, .n_stop = !!stop};
    iflow_result *res = NULL;
    int rc;
    if (iflow_batch_open(&b, m, &p) < 0 || iflow_batch_add(b, &r) < 0) {
        CHECK(0, "greedy: %s", iflow_errmsg());
        return NULL;
    }
    while ((rc = iflow_batch_step(b)) > 0)
        ;
    if (rc == 0)
        iflow_batch_take(b, &res);
    iflow_batch_close(b);
    return res;
}

static iflow_result *greedy(iflow_model *m, const int32_t *prompt, int np, int max_tokens)
{
    return greedy_stop(m, prompt, np, max_tokens, NULL);
}

static void beam_case(const char *path, int *eos_seen, int *len_seen)
{
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return;
    }
    const iflow_hparams *hp = iflow_model_hparams(m);
    for (int k = 0; k < 8; k++) {
        /* stories' openings (which can end) and random ids (which ramble) */
        static const char *const texts[] = {"Once upon a time, there was a little girl named Lily. She",
                                            "The end. One day, Tom", "Tim was sad. His mom said", "Ben and Sue played."};
        int32_t prompt[64], *ids = NULL;
        size_t n_ids = 0;
        int np = 2 + (k * 5) % 21, max_tokens = k < 4 ? 200 : 24 + k;
        prompt[0] = hp->bos;
        for (int i = 1; i < np; i++)
            prompt[i] = (int32_t)(rnd_u32() % (uint32_t)(hp->vocab_size - 3)) + 3;
        if (k < 4 && iflow_tokenizer_encode(iflow_model_tokenizer(m), texts[k], strlen(texts[k]), IFLOW_TOK_ADD_BOS, &ids,
                                            &n_ids) == 0 && n_ids < 64) {
            memcpy(prompt, ids, sizeof(int32_t) * n_ids);
            np = (int)n_ids;
        }
        free(ids);
        iflow_result *g = greedy(m, prompt, np, max_tokens);
        if (!g)
            continue;
        int geos = g->finish == IFLOW_FINISH_EOS;
        double glp = rescore(m, prompt, np, g->tokens, g->n_tokens, geos ? g_eos(m, prompt, np, g) : -1);
        for (int W = 1; W <= 8; W *= (W == 1 ? 4 : 2)) {
            iflow_beam_params bp = {.n_beams = W, .max_tokens = max_tokens, .length_penalty = W == 8 ? 1.0f : 0.0f,
                                    .kv_type = W == 8 ? IFK_KV_F16 : IFK_KV_F32, .n_threads = 2};
            iflow_beam *bs;
            int nb;
            if (iflow_beam_search(m, prompt, np, &bp, &bs, &nb) < 0) {
                CHECK(0, "beam %d: %s", W, iflow_errmsg());
                continue;
            }
            CHECK(nb >= 1 && nb <= W, "width %d: %d beams", W, nb);
            if (W == 1)
                CHECK(nb == 1 && bs[0].n_tokens == g->n_tokens && bs[0].finish == g->finish &&
                          memcmp(bs[0].tokens, g->tokens, sizeof(int32_t) * (size_t)g->n_tokens) == 0,
                      "prompt %d: width 1 (%d tokens, %s) is not greedy (%d tokens, %s)", k, nb ? bs[0].n_tokens : 0,
                      nb ? iflow_finish_name(bs[0].finish) : "-", g->n_tokens, iflow_finish_name(g->finish));
            if (W == 4)
                CHECK(bs[0].logprob >= glp - 1e-6, "prompt %d: best of 4 beams %.4f below greedy's %.4f", k,
                      bs[0].logprob, glp);
            for (int i = 0; i < nb; i++) {
                int e = bs[i].finish == IFLOW_FINISH_EOS;
                *eos_seen += e, *len_seen += !e;
                double want = rescore(m, prompt, np, bs[i].tokens, bs[i].n_tokens, bs[i].eos);
                if (W != 8) /* F16 cache: its own rounding */
                    CHECK(fabs(bs[i].logprob - want) < 1e-4, "prompt %d, width %d, beam %d: logprob %.6f, rescored %.6f", k,
                          W, i, bs[i].logprob, want);
                double sc = bp.length_penalty == 0 ? bs[i].logprob
                                                   : bs[i].logprob / pow(bs[i].n_tokens + e, bp.length_penalty);
                CHECK(fabs(sc - bs[i].score) < 1e-9, "beam %d: score %.6f, want %.6f", i, bs[i].score, sc);
                CHECK(i == 0 || bs[i].score <= bs[i - 1].score, "beams not ranked by score");
            }
            if (getenv("BEAM_SHOW"))
                fprintf(stderr, "  prompt %d width %d: best %.3f (%d tokens, %s), greedy %.3f (%d, %s)\n", k, W,
                        bs[0].logprob, bs[0].n_tokens, iflow_finish_name(bs[0].finish), glp, g->n_tokens,
                        iflow_finish_name(g->finish));
            iflow_beams_free(bs, nb);
        }
        iflow_result_free(g);
    }
    /* bad parameters */
    int32_t pr[2] = {hp->bos, 300};
    iflow_beam *bs;
    int nb;
    iflow_beam_params bad = {.n_beams = 33, .max_tokens = 4};
    CHECK_ERR(iflow_beam_search(m, pr, 2, &bad, &bs, &nb), IFLOW_EINVAL, "33 beams", "1 to 32");
    bad.n_beams = 2, bad.n_ctx = 2;
    CHECK_ERR(iflow_beam_search(m, pr, 2, &bad, &bs, &nb), IFLOW_ERANGE, "prompt of 2 tokens", "context of 2");
    iflow_model_close(m);
}

/* Stop strings: "park w" spans the tokens " park" and " with"; some of the 4 beams of "Once upon
 * a time" reach it within 40 tokens. Each beam that stops: its last token completes the string
 * (the text of its tokens holds it, without the last token it does not), its text is that text
 * cut before the string, its log-probability that of its tokens; no beam's text holds it. Width
 * 1 is greedy decoding with the same stop string, text and tokens. */
static void test_stop(void)
{
    iflow_model *m;
    if (iflow_model_open(&m, s260, 0) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return;
    }
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    const int32_t pr[] = {1, 403, 407, 261, 378}; /* "Once upon a time" */
    const char *stops[] = {"never said", "park w"};
    iflow_beam_params bp = {.n_beams = 4, .max_tokens = 40, .length_penalty = 0, .n_threads = 2, .stop = stops,
                            .n_stop = 2};
    iflow_beam *bs;
    int nb, stopped = 0;
    CHECK(iflow_beam_search(m, pr, 5, &bp, &bs, &nb) == 0, "search: %s", iflow_errmsg());
    for (int i = 0; i < nb; i++) {
        const iflow_beam *b = &bs[i];
        char *all, *before;
        size_t n_all, n_before;
        iflow_tokenizer_continuation(tok, b->tokens, (size_t)b->n_tokens, 0, &all, &n_all);
        iflow_tokenizer_continuation(tok, b->tokens, (size_t)b->n_tokens - 1, 0, &before, &n_before);
        CHECK(!strstr(b->text, "park w"), "beam %d: its text holds the stop string: %s", i, b->text);
        CHECK(i == 0 || b->score <= bs[i - 1].score, "beam %d ranked by score", i);
        if (b->finish == IFLOW_FINISH_STOP) {
            stopped++;
            const char *at = strstr(all, "park w");
            CHECK(b->stop_index == 1 && at && !strstr(before, "park w"), "beam %d: its last token completes the string", i);
            CHECK(at && b->text_len == (size_t)(at - all) && memcmp(b->text, all, b->text_len) == 0,
                  "beam %d: the text is cut before the stop string: '%s'", i, b->text);
            double lp = rescore(m, pr, 5, b->tokens, b->n_tokens, -1);
            CHECK(fabs(lp - b->logprob) < 1e-4, "beam %d: logprob %.6f, rescored %.6f", i, b->logprob, lp);
        } else {
            CHECK(b->stop_index == -1 && b->finish == IFLOW_FINISH_LENGTH, "beam %d: not stopped, finish %d", i,
                  b->finish);
        }
        free(all), free(before);
    }
    CHECK(nb == 4 && stopped >= 1 && stopped < nb, "4 beams, some stopped by the string (%d) and some not", stopped);
    iflow_beams_free(bs, nb);
    /* width 1: greedy with a stop string */
    const char *gs[] = {"outside in"};
    iflow_beam_params b1 = {.n_beams = 1, .max_tokens = 40, .n_threads = 2, .stop = gs, .n_stop = 1};
    iflow_result *g = greedy_stop(m, pr, 5, 40, gs[0]);
    CHECK(iflow_beam_search(m, pr, 5, &b1, &bs, &nb) == 0 && nb == 1, "search: %s", iflow_errmsg());
    if (g && nb == 1) {
        CHECK(g->finish == IFLOW_FINISH_STOP && bs[0].finish == IFLOW_FINISH_STOP, "both stop (%d, %d)", g->finish,
              bs[0].finish);
        CHECK(g->n_tokens == bs[0].n_tokens && memcmp(g->tokens, bs[0].tokens, sizeof(int32_t) * (size_t)g->n_tokens) == 0,
              "width 1 with a stop string: greedy's tokens");
        CHECK(g->text_len == bs[0].text_len && memcmp(g->text, bs[0].text, g->text_len) == 0,
              "width 1 with a stop string: greedy's text ('%s' vs '%s')", bs[0].text, g->text);
    }
    iflow_result_free(g);
    iflow_beams_free(bs, nb);
    const char *empty[] = {""};
    iflow_beam_params bad = {.n_beams = 2, .max_tokens = 4, .stop = empty, .n_stop = 1};
    CHECK_ERR(iflow_beam_search(m, pr, 5, &bad, &bs, &nb), IFLOW_EINVAL, "stop string 1", "is empty");
    iflow_model_close(m);
}

static void test_beam(void)
{
    int eos_seen = 0, len_seen = 0;
    beam_case(s260, &eos_seen, &len_seen);
    beam_case(s260eos, &eos_seen, &len_seen);
    CHECK(eos_seen > 10 && len_seen > 10, "the beams should end both ways (EOS %d, length %d)", eos_seen, len_seen);
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(s260, sizeof s260, "%s/s.ifs", dir);
    if (test_convert("models/stories260K/hf", s260, -1) != 0) {
        fprintf(stderr, "test data missing or conversion failed\n");
        return check_summary("test_beam") | 1;
    }
    /* stories260K ends no text by its EOS; a copy whose EOS is "." (id 426) ends them soon */
    const char *hf = test_data("models/stories260K/hf");
    char cmd0[2048];
    snprintf(cmd0, sizeof cmd0,
             "mkdir -p %s/eos && for f in model.safetensors tokenizer.json tokenizer_config.json; do ln -s %s/$f %s/eos/$f; "
             "done && for f in config.json generation_config.json; do sed 's/\"eos_token_id\": 2/\"eos_token_id\": 426/' "
             "%s/$f >%s/eos/$f; done",
             dir, hf, dir, hf, dir);
    snprintf(s260eos, sizeof s260eos, "%s/s.eos.ifs", dir);
    const char *specs[] = {"specs"};
    iflow_convert_opts co = {.dtype = -1, .spec_dirs = specs, .n_spec_dirs = 1};
    char src[600];
    snprintf(src, sizeof src, "%s/eos", dir);
    if (system(cmd0) != 0 || iflow_convert(src, s260eos, &co) != 0) {
        CHECK(0, "a copy of stories260K with another EOS: %s", iflow_errmsg());
        return check_summary("test_beam");
    }
    RUN(test_beam);
    RUN(test_stop);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_beam");
}
