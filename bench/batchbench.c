/* batchbench -- continuous batching speed (libcore/serving), as JSON on stdout.
 *
 *   batchbench MODEL streams THREADS PROMPT_TOKENS NEW_TOKENS N...
 *       For each N: N requests at once, each PROMPT_TOKENS fixed pseudo-random ids and up to
 *       NEW_TOKENS greedy tokens, `parallel` = N. Reports generated
 *       tokens/s over the whole run and over the decode phase alone (after the last prompt is
 *       in: llama.cpp batched-bench's S_TG), and the mean tokens per step.
 *   batchbench MODEL replay THREADS TEXT_FILE REQUESTS RATE PARALLEL NEW_TOKENS
 *       REQUESTS prompts cut from the lines of TEXT_FILE (the first 8 to 40 words of its
 *       non-empty lines), arriving as a Poisson process of RATE requests/s (seeded: the same
 *       arrivals every run), NEW_TOKENS tokens each at temperature 0.8 (seed per request).
 *       Reports libcore/serving/metrics.h's object plus the arrival rate.
 *   batchbench MODEL shared THREADS PREFIX_TOKENS OWN_TOKENS NEW_TOKENS N
 *       Prefix caching: N requests at once (parallel N) whose prompts are the same PREFIX_TOKENS
 *       pseudo-random ids followed by OWN_TOKENS of their own, NEW_TOKENS greedy tokens each;
 *       run with the prefix cache and without it (in that order). Reports each run's wall time,
 *       prompt tokens evaluated and taken from the cache, mean time to first token and
 *       generated tokens/s, the ratio of the wall times, and whether both runs generated the
 *       same tokens.
 */
#include "bench/bench.h"
#include "libcore/base/error.h"
#include "libcore/serving/batch.h"
#include "libcore/serving/metrics.h"
#include "libcore/tokenizers/tokenizer.h"

#include <math.h>
#include <string.h>

static void die(const char *what)
{
    fprintf(stderr, "batchbench: %s: %s\n", what, iflow_errmsg());
    exit(1);
}

/* ---- streams ------------------------------------------------------------------------------- */

/* N greedy requests at once. One that draws an end-of-sequence token ends early; tokens are
 * counted as generated. */
static json_t *streams(iflow_model *m, int threads, int n_prompt, int n_new, int n)
{
    const int V = iflow_model_hparams(m)->vocab_size;
    iflow_batch_params p = {.parallel = n, .n_ctx = n_prompt + n_new + 1, .n_threads = threads};
    iflow_batch *b;
    if (iflow_batch_open(&b, m, &p) < 0)
        die("open");
    int32_t *prompts = malloc(sizeof(int32_t) * (size_t)n * n_prompt);
    uint32_t s = 12345;
    for (int i = 0; i < n * n_prompt; i++) {
        s = s * 1664525u + 1013904223u;
        prompts[i] = i % n_prompt == 0 ? 1 : 3 + (int32_t)(s >> 8) % (V - 3);
    }
    double t0 = bench_now(), t_decode = 0;
    for (int i = 0; i < n; i++) {
        iflow_request r = {.prompt = prompts + (size_t)i * n_prompt, .n_prompt = n_prompt, .max_tokens = n_new};
        if (iflow_batch_add(b, &r) < 0)
            die("add");
    }
    uint64_t gen_at_decode = 0;
    iflow_batch_stats st;
    for (;;) {
        int rc = iflow_batch_step(b);
        if (rc < 0)
            die("step");
        iflow_batch_get_stats(b, &st);
        if (t_decode == 0 && st.prompt + st.prompt_cached == (uint64_t)n * n_prompt) { /* every prompt is in */
            t_decode = bench_now();
            gen_at_decode = st.generated;
        }
        iflow_result *r;
        while (iflow_batch_take(b, &r) == 1)
            iflow_result_free(r);
        if (rc == 0)
            break;
    }
    double t1 = bench_now();
    iflow_batch_get_stats(b, &st);
    json_t *o = json_pack("{s:i, s:i, s:i, s:I, s:f, s:f, s:f}", "streams", n, "prompt_tokens", n_prompt,
                          "new_tokens", n_new, "generated", (json_int_t)st.generated, "generated_tok_s",
                          st.generated / (t1 - t0), "decode_tok_s",
                          t1 > t_decode ? (st.generated - gen_at_decode) / (t1 - t_decode) : 0.0, "tokens_per_step",
                          st.steps ? (double)st.step_tokens / st.steps : 0.0);
    iflow_batch_close(b);
    free(prompts);
    return o;
}

/* ---- shared prefix ----------------------------------------------------------------------------- */

/* One run of the shared-prefix requests; the generated tokens of request i into gen[i * n_new ..]. */
static json_t *shared_run(iflow_model *m, int threads, const int32_t *prompts, int n_prompt, int n_new, int n,
                          int no_cache, int32_t *gen)
{
    iflow_batch_params p = {.parallel = n, .n_ctx = n_prompt + n_new + 1, .n_threads = threads,
                            .no_prefix_cache = no_cache};
    iflow_batch *b;
    if (iflow_batch_open(&b, m, &p) < 0)
        die("open");
    double t0 = bench_now(), ttft = 0;
    for (int i = 0; i < n; i++) {
        iflow_request r = {.prompt = prompts + (size_t)i * n_prompt, .n_prompt = n_prompt, .max_tokens = n_new,
                           .user = gen + (size_t)i * n_new};
        if (iflow_batch_add(b, &r) < 0)
            die("add");
    }
    int rc;
    do {
        if ((rc = iflow_batch_step(b)) < 0)
            die("step");
        iflow_result *r;
        while (iflow_batch_take(b, &r) == 1) {
            memcpy(r->user, r->tokens, sizeof(int32_t) * (size_t)r->n_tokens);
            ttft += r->t_first - r->t_added;
            iflow_result_free(r);
        }
    } while (rc > 0);
    double wall = bench_now() - t0;
    iflow_batch_stats st;
    iflow_batch_get_stats(b, &st);
    iflow_batch_close(b);
    return json_pack("{s:b, s:f, s:I, s:I, s:f, s:f}", "prefix_cache", !no_cache, "wall_s", wall, "prompt_evaluated",
                     (json_int_t)st.prompt, "prompt_cached", (json_int_t)st.prompt_cached, "ttft_ms_mean",
                     ttft / n * 1e3, "generated_tok_s", st.generated / wall);
}

static json_t *shared(iflow_model *m, int threads, int n_prefix, int n_own, int n_new, int n)
{
    const int V = iflow_model_hparams(m)->vocab_size, n_prompt = n_prefix + n_own;
    int32_t *prompts = malloc(sizeof(int32_t) * (size_t)n * n_prompt);
    int32_t *gen[2] = {calloc((size_t)n * n_new, sizeof(int32_t)), calloc((size_t)n * n_new, sizeof(int32_t))};
    uint32_t s = 12345;
    for (int i = 0; i < n * n_prompt; i++) { /* the prefix: the first request's; then each its own */
        s = s * 1664525u + 1013904223u;
        int j = i % n_prompt;
        prompts[i] = j == 0 ? 1 : j < n_prefix && i >= n_prompt ? prompts[j] : 3 + (int32_t)(s >> 8) % (V - 3);
    }
    json_t *on = shared_run(m, threads, prompts, n_prompt, n_new, n, 0, gen[0]);
    json_t *off = shared_run(m, threads, prompts, n_prompt, n_new, n, 1, gen[1]);
    double w_on = json_real_value(json_object_get(on, "wall_s"));
    double w_off = json_real_value(json_object_get(off, "wall_s"));
    json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:i, s:o, s:o, s:f, s:b}", "requests", n, "prefix_tokens", n_prefix,
                          "own_tokens", n_own, "new_tokens", n_new, "threads", threads, "cached", on, "uncached", off,
                          "speedup", w_off / w_on, "same_tokens",
                          !memcmp(gen[0], gen[1], sizeof(int32_t) * (size_t)n * n_new));
    free(gen[0]);
    free(gen[1]);
    free(prompts);
    return o;
}

/* ---- replay ---------------------------------------------------------------------------------- */

/* Up to n prompts from the text's non-empty lines: the first 8..40 words of each. */
static int load_prompts(const char *path, char ***out, int n)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char **p = calloc((size_t)n, sizeof *p), *line = NULL;
    size_t cap = 0;
    int k = 0;
    while (k < n && getline(&line, &cap, f) > 0) {
        char *s = line + strspn(line, " \t");
        if (strlen(s) < 40 || *s == '=')
            continue;
        int words = 8 + k % 33, w = 0;
        char *e = s;
        while (*e && *e != '\n' && w < words) {
            e += strcspn(e, " \n");
            w++;
            if (*e == ' ')
                e++;
        }
        p[k++] = strndup(s, (size_t)(e - s));
    }
    free(line);
    fclose(f);
    *out = p;
    return k;
}

static json_t *replay(iflow_model *m, int threads, const char *text, int n_req, double rate, int parallel, int n_new)
{
    char **prompts;
    int n = load_prompts(text, &prompts, n_req);
    if (n <= 0) {
        fprintf(stderr, "batchbench: no prompts in '%s'\n", text);
        exit(1);
    }
    iflow_batch_params p = {.parallel = parallel, .n_ctx = 256, .n_threads = threads};
    iflow_batch *b;
    if (iflow_batch_open(&b, m, &p) < 0)
        die("open");
    /* arrivals: exponential gaps, a fixed LCG seed */
    double *at = malloc(sizeof(double) * (size_t)n), t = 0;
    uint64_t s = 42;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u = ((s >> 11) + 0.5) / 9007199254740992.0;
        t += -log(u) / rate;
        at[i] = t;
    }
    iflow_metrics met = {0};
    int next = 0;
    double t0 = bench_now();
    while (next < n || iflow_batch_pending(b)) {
        double now = bench_now() - t0;
        while (next < n && at[next] <= now) {
            int32_t *ids;
            size_t k;
            if (iflow_tokenizer_encode(iflow_model_tokenizer(m), prompts[next], strlen(prompts[next]), IFLOW_TOK_ADD_BOS,
                                       &ids, &k) < 0)
                die("tokenize");
            iflow_request r = {.prompt = ids, .n_prompt = (int)(k < 200 ? k : 200), .max_tokens = n_new,
                               .sampling = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = (uint64_t)next}};
            if (iflow_batch_add(b, &r) < 0)
                die("add");
            free(ids);
            next++;
        }
        if (!iflow_batch_pending(b)) { /* idle until the next arrival */
            double wait = at[next] - (bench_now() - t0);
            if (wait > 0) {
                struct timespec ts = {(time_t)wait, (long)((wait - floor(wait)) * 1e9)};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        if (iflow_batch_step(b) < 0)
            die("step");
        iflow_result *r;
        while (iflow_batch_take(b, &r) == 1) {
            iflow_metrics_add(&met, r);
            iflow_result_free(r);
        }
    }
    json_t *o = iflow_metrics_json(&met, m, b, bench_now() - t0);
    json_object_set_new(o, "arrival_rate_per_s", json_real(rate));
    json_object_set_new(o, "threads", json_integer(threads));
    iflow_metrics_free(&met);
    iflow_batch_close(b);
    for (int i = 0; i < n; i++)
        free(prompts[i]);
    free(prompts);
    free(at);
    return o;
}

int main(int argc, char **argv)
{
    if (argc < 4 || (strcmp(argv[2], "streams") && strcmp(argv[2], "replay") && strcmp(argv[2], "shared"))) {
        fprintf(stderr, "usage: batchbench MODEL streams THREADS PROMPT_TOKENS NEW_TOKENS N...\n"
                        "       batchbench MODEL replay THREADS TEXT_FILE REQUESTS RATE PARALLEL NEW_TOKENS\n"
                        "       batchbench MODEL shared THREADS PREFIX_TOKENS OWN_TOKENS NEW_TOKENS N\n");
        return 2;
    }
    iflow_model *m;
    if (iflow_model_open(&m, argv[1], IFLOW_MODEL_NO_VERIFY) < 0)
        die(argv[1]);
    int threads = atoi(argv[3]);
    json_t *out = json_array();
    if (!strcmp(argv[2], "streams") && argc >= 7) {
        for (int i = 6; i < argc; i++)
            json_array_append_new(out, streams(m, threads, atoi(argv[4]), atoi(argv[5]), atoi(argv[i])));
    } else if (!strcmp(argv[2], "replay") && argc == 9) {
        json_array_append_new(out, replay(m, threads, argv[4], atoi(argv[5]), atof(argv[6]), atoi(argv[7]), atoi(argv[8])));
    } else if (!strcmp(argv[2], "shared") && argc == 8) {
        json_array_append_new(out, shared(m, threads, atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), atoi(argv[7])));
    } else {
        fprintf(stderr, "batchbench: wrong number of arguments for %s\n", argv[2]);
        return 2;
    }
    json_dumpf(out, stdout, JSON_COMPACT | JSON_REAL_PRECISION(6));
    putchar('\n');
    json_decref(out);
    iflow_model_close(m);
    return 0;
}
