/* shiftbench -- generating past the context (batch.h's context shifts), as JSON on stdout.
 *
 *   shiftbench MODEL TEXT_FILE N_CTX KEEP TOKENS THREADS
 *       Reads TOKENS tokens of TEXT_FILE one at a time through a context of N_CTX positions,
 *       as generation past the context sees them (each token's log-probability given the
 *       tokens still in the cache), for each way of making room when the context is full:
 *         rope       keep KEEP positions, drop the older half of the rest, rotate the cached
 *                    keys after them back (model.h's iflow_kv_shift; no recomputation);
 *         recompute  the same kept tokens, evaluated again from scratch;
 *         restart    drop everything but the KEEP first tokens (the cheapest, the least context).
 *       Reports each mode's perplexity over the same tokens and its tokens/s.
 */
#include "bench/bench.h"
#include "libcore/base/error.h"
#include "libcore/engine/model.h"
#include "libcore/tokenizers/tokenizer.h"
#include "kernels/cpu/kvcache.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

static void die(const char *what)
{
    fprintf(stderr, "shiftbench: %s: %s\n", what, iflow_errmsg());
    exit(1);
}

/* log p(id) from logits [V] */
static double logprob(const float *logits, int V, int32_t id)
{
    double mx = logits[0], sum = 0;
    for (int i = 1; i < V; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < V; i++)
        sum += exp((double)logits[i] - mx);
    return (double)logits[id] - mx - log(sum);
}

enum { ROPE, RECOMPUTE, RESTART };

static json_t *run(iflow_model *m, const int32_t *ids, int n, int n_ctx, int keep, int mode, int threads)
{
    const int V = iflow_model_hparams(m)->vocab_size, BLOCK = 16, NB = (n_ctx + BLOCK - 1) / BLOCK;
    iflow_ctx *c;
    iflow_kv *kv;
    if (iflow_ctx_open_steps(&c, m, threads) < 0 || iflow_kv_open(&kv, m, IFK_KV_F32, BLOCK, NB) < 0)
        die("open");
    int32_t *table = malloc(sizeof(int32_t) * NB), *win = malloc(sizeof(int32_t) * (n_ctx + 1));
    float *logits = malloc(sizeof(float) * V);
    for (int i = 0; i < NB; i++)
        table[i] = i;
    double nll = 0, t0 = bench_now();
    int n_past = 0, shifts = 0;
    long evaluated = 0;
    for (int i = 0; i + 1 < n; i++) {
        if (n_past == n_ctx) { /* make room */
            int discard = mode == RESTART ? n_past - keep : (n_past - keep) / 2;
            if (mode == ROPE && iflow_kv_shift(kv, table, n_past, keep, discard) < 0)
                die("shift");
            memmove(win + keep, win + keep + discard, sizeof(int32_t) * (size_t)(n_past - keep - discard));
            n_past -= discard;
            shifts++;
            if (mode != ROPE) { /* the kept tokens again, in steps of at most IFLOW_MAX_STEP */
                for (int p = 0; p < n_past; p += IFLOW_MAX_STEP) {
                    int k = n_past - p < IFLOW_MAX_STEP ? n_past - p : IFLOW_MAX_STEP;
                    iflow_step_seq s = {.ids = win + p, .n = k, .pos0 = p, .table = table};
                    if (iflow_ctx_step(c, kv, &s, 1) < 0)
                        die("step");
                    evaluated += k;
                }
            }
        }
        win[n_past] = ids[i];
        iflow_step_seq s = {.ids = ids + i, .n = 1, .pos0 = n_past, .table = table, .logits = logits};
        if (iflow_ctx_step(c, kv, &s, 1) < 0)
            die("step");
        evaluated++;
        n_past++;
        nll -= logprob(logits, V, ids[i + 1]);
    }
    double dt = bench_now() - t0;
    static const char *const names[] = {"rope", "recompute", "restart"};
    json_t *o = json_pack("{s:s, s:f, s:i, s:I, s:f}", "mode", names[mode], "ppl", exp(nll / (n - 1)), "shifts", shifts,
                          "tokens_evaluated", (json_int_t)evaluated, "tokens_per_s", (n - 1) / dt);
    free(table), free(win), free(logits);
    iflow_kv_close(kv);
    iflow_ctx_close(c);
    return o;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: shiftbench MODEL TEXT_FILE N_CTX KEEP TOKENS THREADS\n");
        return 2;
    }
    int n_ctx = atoi(argv[3]), keep = atoi(argv[4]), want = atoi(argv[5]), threads = atoi(argv[6]);
    iflow_model *m;
    if (iflow_model_open(&m, argv[1], 0) < 0)
        die("model");
    if (n_ctx < keep + 2 || n_ctx > iflow_model_hparams(m)->max_seq || want < 2) {
        fprintf(stderr, "shiftbench: bad N_CTX, KEEP or TOKENS\n");
        return 2;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    /* enough text for TOKENS tokens: about 8 bytes a token, read generously */
    size_t cap = (size_t)want * 16 + 4096;
    char *text = malloc(cap);
    size_t len = fread(text, 1, cap, f);
    fclose(f);
    int32_t *ids;
    size_t n;
    if (iflow_tokenizer_encode(iflow_model_tokenizer(m), text, len, IFLOW_TOK_ADD_BOS, &ids, &n) < 0)
        die("tokenize");
    if ((int)n > want)
        n = (size_t)want;
    json_t *modes = json_array();
    for (int mode = ROPE; mode <= RESTART; mode++)
        json_array_append_new(modes, run(m, ids, (int)n, n_ctx, keep, mode, threads));
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:o}", "model", argv[1], "n_ctx", n_ctx, "keep", keep, "tokens",
                          (int)n, "threads", threads, "modes", modes);
    json_dumpf(o, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(o);
    free(ids);
    free(text);
    iflow_model_close(m);
    return 0;
}
