/*
 * test_batch.c -- the paged KV cache and continuous batching (libcore/serving/batch.h).
 *
 * References, all computed here by an independent path through the engine:
 *   - paged vs contiguous: the same tokens run through iflow_ctx_eval (one contiguous F32 block)
 *     and through iflow_ctx_step over a paged cache whose blocks were used by another sequence,
 *     freed and handed out again in a scrambled order, with the same chunking: the logits must
 *     be bit-identical (paging changes only where a row lives);
 *   - continuous batching vs alone: each request run alone (one request in the batch) against
 *     the same requests joining a running batch at different steps, queued behind a small
 *     `parallel`, with a small step budget that splits prompts into chunks: the tokens must be
 *     identical, greedy and seeded sampling, on stories260K and xs-ckpt (batch invariance);
 *   - alone vs iflow-run's path: greedy tokens of a request alone equal iflow_ctx_eval_argmax's;
 *   - F16 and INT8 KV: perplexity over 256 tokens of WikiText-2 on xs-ckpt within stated deltas
 *     of the F32 cache: F16 0.05 %, INT8 2 % (measured +1.55 %: head_dim 8, so each group of 8
 *     values has its own scale, the hardest case; BATCH_SHOW=1 prints them);
 *   - prefix caching: requests whose prompts share prefixes (equal, one a prefix of another,
 *     a prompt of whole blocks), all at once, joining a running batch, one after another, and
 *     in a cache so small that cached blocks are evicted: the tokens must be those of each
 *     request alone with the cache off, and the positions taken from the cache those that a
 *     comparison of the prompts' tokens predicts;
 *   - log-probabilities: a prompt's (prompt_logprobs) against the float64 torch reference
 *     ../shared/golden/stories260K.wiki1024.win256.logprobs.tsv within 1e-4, the prompt cut into
 *     chunks beside another request; each generated token's against the same position scored as
 *     part of a longer prompt (the same bits: decode and prefill rows are computed alike); the
 *     tokens the same with log-probabilities asked or not, greedy and sampled; continuations of one
 *     context scored with the context from the prefix cache: the scores of the cache off;
 *   - finish reasons, stop strings across token boundaries, blocks returned, refused requests;
 *   - logit biases and end-of-sequence bans on stories260K (whose greedy text holds no EOS in 20
 *     tokens): with its EOS raised by +100 a request ends at once; with min_tokens 5 too it gives
 *     exactly the 5 greedy tokens, then the EOS; with ignore_eos its 20 greedy tokens; the same
 *     three with a draft (the model itself) proposing, and a stop token (a greedy token k) ending
 *     it after the k before it, with and without the draft; -inf on the first greedy token gives the
 *     argmax of iflow_ctx_eval's logits without it; a sampled request never draws a banned token;
 *     out-of-range biases and min_tokens refused;
 *   - allowed tokens (vLLM's allowed_token_ids): the tokens are the argmax among them at each
 *     position of iflow_ctx_eval's logits, with and without a draft; a banned sequence (bad_words)
 *     of the first two greedy tokens keeps the first and takes the next best after it; one whose
 *     head is in the prompt bans nothing; out-of-range lists refused.
 */
#include "tests/unit/testlib.h"
#include "libcore/engine/model.h"
#include "libcore/serving/batch.h"
#include "libcore/tokenizers/tokenizer.h"

static char dir[] = "/tmp/iflow-test-batch-XXXXXX";
static char s260[512], xs[512];

/* ---- paged vs contiguous --------------------------------------------------------------- */

static void paged_vs_contiguous(const char *path)
{
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0) {
        CHECK(0, "open %s: %s", path, iflow_errmsg());
        return;
    }
    const int V = iflow_model_hparams(m)->vocab_size, N = 61, CH = 7, BLOCK = 4;
    int32_t ids[64];
    for (int i = 0; i < N; i++)
        ids[i] = i == 0 ? 1 : (int32_t)(rnd_u32() % (uint32_t)(V - 3)) + 3;
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    iflow_ctx *c, *sc;
    iflow_kv *kv;
    int rc = iflow_ctx_open(&c, m, 64, 2);
    CHECK(rc == 0, "ctx: %s", iflow_errmsg());
    rc = iflow_ctx_open_steps(&sc, m, 2);
    CHECK(rc == 0, "step ctx: %s", iflow_errmsg());
    rc = iflow_kv_open(&kv, m, IFK_KV_F32, BLOCK, 40);
    CHECK(rc == 0, "kv: %s", iflow_errmsg());
    /* another sequence fills blocks 0..15 with different tokens first */
    int32_t used[16], table[16];
    for (int i = 0; i < 16; i++)
        used[i] = i;
    int32_t other[64];
    for (int i = 0; i < 64; i++)
        other[i] = (int32_t)(rnd_u32() % (uint32_t)(V - 3)) + 3;
    iflow_step_seq o = {.ids = other, .n = 64, .pos0 = 0, .table = used};
    CHECK(iflow_ctx_step(sc, kv, &o, 1) == 0, "other sequence: %s", iflow_errmsg());
    /* the real one gets those blocks back in a scrambled order, plus fresh ones */
    for (int i = 0; i < 16; i++)
        table[i] = (int32_t)((i * 7 + 3) % 16) + (i % 3 == 0 ? 20 : 0);
    int same = 1, steps = 0;
    for (int p = 0; p < N && rc == 0; p += CH) {
        int n = N - p < CH ? N - p : CH;
        rc = iflow_ctx_eval(c, ids + p, n, a, 0);
        iflow_step_seq s = {.ids = ids + p, .n = n, .pos0 = p, .table = table, .logits = b};
        if (rc == 0)
            rc = iflow_ctx_step(sc, kv, &s, 1);
        same &= rc == 0 && memcmp(a, b, sizeof(float) * V) == 0;
        steps++;
    }
    CHECK(rc == 0, "%s: %s", path, iflow_errmsg());
    CHECK(same, "%s: paged logits differ from the contiguous cache's (%d chunks)", path, steps);
    iflow_kv_close(kv);
    iflow_ctx_close(sc);
    iflow_ctx_close(c);
    free(a);
    free(b);
    iflow_model_close(m);
}

static void test_paged_vs_contiguous(void)
{
    paged_vs_contiguous(s260);
    paged_vs_contiguous(xs);
}

/* ---- continuous batching vs alone ------------------------------------------------------ */

#define N_REQ 10

typedef struct {
    int32_t prompt[64];
    int n_prompt, max_tokens;
    iflow_sampler_params sp;
    int32_t out[64];
    int n_out, finish;
} tcase;

static void make_cases(tcase *t, int V, float temp)
{
    for (int i = 0; i < N_REQ; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].n_prompt = 1 + (i * 11) % 40;
        t[i].prompt[0] = 1;
        for (int j = 1; j < t[i].n_prompt; j++)
            t[i].prompt[j] = (int32_t)(rnd_u32() % (uint32_t)(V - 3)) + 3;
        t[i].max_tokens = 8 + (i * 13) % 40;
        t[i].sp = (iflow_sampler_params){.temp = temp, .top_k = 40, .top_p = 0.95f, .seed = 1000 + (uint64_t)i};
    }
}

static int add_case(iflow_batch *b, tcase *t)
{
    iflow_request r = {.prompt = t->prompt, .n_prompt = t->n_prompt, .max_tokens = t->max_tokens,
                       .sampling = t->sp, .user = t};
    return iflow_batch_add(b, &r);
}

/* Take every finished result into its case. */
static void take_all(iflow_batch *b)
{
    iflow_result *r;
    while (iflow_batch_take(b, &r) == 1) {
        tcase *t = r->user;
        memcpy(t->out, r->tokens, sizeof(int32_t) * (size_t)r->n_tokens);
        t->n_out = r->n_tokens;
        t->finish = r->finish;
        iflow_result_free(r);
    }
}

static int drain(iflow_batch *b)
{
    int rc;
    while ((rc = iflow_batch_step(b)) > 0)
        take_all(b);
    take_all(b);
    return rc;
}

/* Run cases through a batch of params p: all added at once (join 0), or a few at a time between
 * steps. 0 or < 0; *st the batch's counters at the end. */
static int run_cases(iflow_model *m, tcase *t, const iflow_batch_params *p, int join, iflow_batch_stats *st)
{
    iflow_batch *b;
    int rc = iflow_batch_open(&b, m, p), next = 0;
    CHECK(rc == 0, "open: %s", iflow_errmsg());
    if (rc < 0)
        return rc;
    for (int round = 0; rc == 0 && (next < N_REQ || iflow_batch_pending(b)); round++) {
        for (int k = 0; k < (join ? 1 + round % 3 : N_REQ) && next < N_REQ && rc == 0; k++)
            rc = add_case(b, &t[next++]);
        if (!join && rc == 0)
            rc = drain(b) < 0 ? -1 : 0;
        for (int s = 0; join && s < 1 + round % 4 && rc == 0; s++)
            rc = iflow_batch_step(b) < 0 ? -1 : 0;
        take_all(b);
    }
    CHECK(rc == 0, "run: %s", iflow_errmsg());
    iflow_batch_get_stats(b, st);
    CHECK(st->blocks_used == 0 && st->running == 0 && st->queued == 0, "%d blocks still held", st->blocks_used);
    iflow_batch_close(b);
    return rc;
}

static void batching_vs_alone(const char *path, float temp, int kv_type)
{
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0) {
        CHECK(0, "open %s: %s", path, iflow_errmsg());
        return;
    }
    const int V = iflow_model_hparams(m)->vocab_size;
    tcase alone[N_REQ], mixed[N_REQ];
    make_cases(alone, V, temp);
    memcpy(mixed, alone, sizeof mixed);
    /* alone: one request at a time, the whole prompt in one step */
    iflow_batch_params p1 = {.parallel = 1, .n_ctx = 128, .kv_type = kv_type, .n_threads = 1, .no_prefix_cache = 1};
    iflow_batch_stats st = {0};
    int rc = run_cases(m, alone, &p1, 0, &st);
    /* mixed: 4 at a time, 9 tokens a step, requests joining while others run, 2 threads */
    iflow_batch_params p4 = {.parallel = 4, .n_ctx = 128, .kv_type = kv_type, .block = 8, .step_tokens = 9,
                             .n_threads = 2};
    if (rc == 0)
        rc = run_cases(m, mixed, &p4, 1, &st);
    CHECK(st.blocks_peak <= st.blocks_total && st.blocks_peak > 0, "block peak %d of %d", st.blocks_peak,
          st.blocks_total);
    int same = 0;
    for (int i = 0; i < N_REQ; i++) {
        int eq = alone[i].n_out == mixed[i].n_out && alone[i].finish == mixed[i].finish &&
                 memcmp(alone[i].out, mixed[i].out, sizeof(int32_t) * (size_t)alone[i].n_out) == 0;
        same += eq;
        CHECK(eq, "%s temp %.1f kv %s: request %d alone gives %d tokens (%s), in the batch %d (%s)", path, temp,
              ifk_kv_type_name(kv_type), i, alone[i].n_out, iflow_finish_name(alone[i].finish), mixed[i].n_out,
              iflow_finish_name(mixed[i].finish));
        CHECK(alone[i].n_out > 0, "request %d generated nothing", i);
    }
    if (temp == 0 && kv_type == IFK_KV_F32) { /* alone = the plain context's greedy decoding */
        iflow_ctx *c;
        for (int i = 0; i < N_REQ; i++) {
            CHECK(iflow_ctx_open(&c, m, 128, 1) == 0, "ctx: %s", iflow_errmsg());
            int32_t id, got[64];
            int n = 0;
            rc = iflow_ctx_eval_argmax(c, alone[i].prompt, alone[i].n_prompt, &id);
            while (rc == 0 && n < alone[i].max_tokens && !iflow_model_is_eos(m, id)) {
                got[n++] = id;
                if (n < alone[i].max_tokens)
                    rc = iflow_ctx_eval_argmax(c, &id, 1, &id);
            }
            CHECK(rc == 0 && n == alone[i].n_out && memcmp(got, alone[i].out, sizeof(int32_t) * (size_t)n) == 0,
                  "%s request %d: the batch engine alone differs from iflow_ctx_eval_argmax", path, i);
            iflow_ctx_close(c);
        }
    }
    iflow_model_close(m);
}

static void test_batching(void)
{
    batching_vs_alone(s260, 0.0f, IFK_KV_F32);
    batching_vs_alone(s260, 0.8f, IFK_KV_F32);
    batching_vs_alone(xs, 0.0f, IFK_KV_F32);
    batching_vs_alone(xs, 0.9f, IFK_KV_F32);
    batching_vs_alone(s260, 0.8f, IFK_KV_Q8);
    batching_vs_alone(xs, 0.0f, IFK_KV_F16);
}

/* ---- prefix caching ---------------------------------------------------------------------------- */

/* Prompts from two prefixes P and Q (after a BOS) and tokens of their own: equal prompts, one a
 * prefix of another, one of exactly 5 blocks of 8, and one ('M') whose first block is Q's and
 * whose second is P's (a name is that of the whole prefix: it shares Q's first block only). */
static void make_prefix_cases(tcase *t, int V, float temp)
{
    static const int from[N_REQ][2] = {{'P', 45}, {'P', 45}, {'=', 0}, {'Q', 30}, {'P', 40},
                                       {'P', 20}, {'Q', 30}, {'P', 60}, {'P', 8}, {'M', 16}};
    static const int own[N_REQ] = {3, 10, 0, 5, 0, 30, 5, 0, 1, 2};
    int32_t P[64], Q[64];
    P[0] = Q[0] = 1;
    for (int j = 1; j < 64; j++) {
        P[j] = (int32_t)(rnd_u32() % (uint32_t)(V - 3)) + 3;
        Q[j] = (int32_t)(rnd_u32() % (uint32_t)(V - 3)) + 3;
    }
    for (int i = 0; i < N_REQ; i++) {
        memset(&t[i], 0, sizeof t[i]);
        if (from[i][0] == '=') { /* the one before, again */
            memcpy(t[i].prompt, t[i - 1].prompt, sizeof t[i].prompt);
            t[i].n_prompt = t[i - 1].n_prompt;
        } else {
            memcpy(t[i].prompt, from[i][0] == 'Q' ? Q : P, sizeof(int32_t) * (size_t)from[i][1]);
            if (from[i][0] == 'M')
                memcpy(t[i].prompt, Q, sizeof(int32_t) * 8);
            t[i].n_prompt = from[i][1] + own[i];
            for (int j = from[i][1]; j < t[i].n_prompt; j++)
                t[i].prompt[j] = (int32_t)(rnd_u32() % (uint32_t)(V - 3)) + 3;
        }
        t[i].max_tokens = 8 + (i * 13) % 40;
        t[i].sp = (iflow_sampler_params){.temp = temp, .top_k = 40, .top_p = 0.95f, .seed = 77 + (uint64_t)i};
    }
}

/* The positions requests 0..n-1, admitted in order while nothing is evicted, take from the cache:
 * for each, the most whole blocks of 8 before its last token that an earlier prompt has equal from
 * position 0 (among that prompt's own whole blocks before its last token). Token comparison
 * only: the reference for the names. */
static int expected_cached(const tcase *t, int n)
{
    int sum = 0;
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int j = 0; j < i; j++) {
            int k = 0, lim_i = (t[i].n_prompt - 1) / 8, lim_j = (t[j].n_prompt - 1) / 8;
            while (k < lim_i && k < lim_j &&
                   memcmp(t[i].prompt, t[j].prompt, sizeof(int32_t) * 8 * (size_t)(k + 1)) == 0)
                k++;
            best = k > best ? k : best;
        }
        sum += 8 * best;
    }
    return sum;
}

static void prefix_cache(const char *path, float temp, int kv_type)
{
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0) {
        CHECK(0, "open %s: %s", path, iflow_errmsg());
        return;
    }
    const int V = iflow_model_hparams(m)->vocab_size;
    tcase ref[N_REQ], got[N_REQ];
    make_prefix_cases(ref, V, temp);
    int n_prompt = 0;
    for (int i = 0; i < N_REQ; i++)
        n_prompt += ref[i].n_prompt;
    const int want = expected_cached(ref, N_REQ);
    CHECK(want >= 150, "the cases share %d positions; they were made to share more", want);
    iflow_batch_stats st;
    /* the reference: one at a time, the cache off */
    iflow_batch_params off = {.parallel = 1, .n_ctx = 128, .kv_type = kv_type, .n_threads = 1, .no_prefix_cache = 1};
    if (run_cases(m, ref, &off, 1, &st) < 0) {
        iflow_model_close(m);
        return;
    }
    CHECK(st.prompt_cached == 0 && st.blocks_idle == 0, "the cache off: %llu positions from it, %d idle blocks",
          (unsigned long long)st.prompt_cached, st.blocks_idle);
    static const struct {
        const char *what;
        iflow_batch_params p;
        int join, exact;            /* exact: the cached positions are `want` */
    } runs[] = {
        {"all at once", {.parallel = 10, .n_ctx = 128, .block = 8, .step_tokens = 32, .n_threads = 2}, 0, 1},
        {"joining", {.parallel = 4, .n_ctx = 128, .block = 8, .step_tokens = 9, .n_threads = 2}, 1, 0},
        {"one after another", {.parallel = 1, .n_ctx = 128, .block = 8, .n_blocks = 200, .n_threads = 1}, 1, 1},
        {"evicting", {.parallel = 2, .n_ctx = 128, .block = 8, .n_blocks = 20, .step_tokens = 16, .n_threads = 2},
         1, 0},
    };
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        iflow_batch_params p = runs[k].p;
        p.kv_type = kv_type;
        memcpy(got, ref, sizeof got);
        for (int i = 0; i < N_REQ; i++)
            got[i].n_out = -1;
        if (run_cases(m, got, &p, runs[k].join, &st) < 0)
            continue;
        for (int i = 0; i < N_REQ; i++)
            CHECK(got[i].n_out == ref[i].n_out && got[i].finish == ref[i].finish &&
                      memcmp(got[i].out, ref[i].out, sizeof(int32_t) * (size_t)ref[i].n_out) == 0,
                  "%s temp %.1f kv %s, %s: request %d gives %d tokens (%s) with the prefix cache, %d (%s) without",
                  path, temp, ifk_kv_type_name(kv_type), runs[k].what, i, got[i].n_out,
                  iflow_finish_name(got[i].finish), ref[i].n_out, iflow_finish_name(ref[i].finish));
        CHECK(st.prompt + st.prompt_cached == (uint64_t)n_prompt,
              "%s: %llu prompt tokens evaluated + %llu cached != %d", runs[k].what, (unsigned long long)st.prompt,
              (unsigned long long)st.prompt_cached, n_prompt);
        if (runs[k].exact)
            CHECK(st.prompt_cached == (uint64_t)want, "%s: %llu positions from the cache, the prompts share %d",
                  runs[k].what, (unsigned long long)st.prompt_cached, want);
        else
            CHECK(st.prompt_cached > 0, "%s: nothing taken from the cache", runs[k].what);
        CHECK(st.blocks_idle > 0 && st.blocks_idle <= st.blocks_total, "%s: %d idle blocks of %d", runs[k].what,
              st.blocks_idle, st.blocks_total);
    }
    iflow_model_close(m);
}

/* Random batches over prefixes of three prompts: blocks of 4, 8 or 16, 1 to 6 requests at once,
 * caches with a few blocks to spare (idle ones evicted all the time), requests joining between
 * steps, six rounds; every request's tokens those of the cache off, one at a time. */
static void prefix_stress(const char *path)
{
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0) {
        CHECK(0, "open %s: %s", path, iflow_errmsg());
        return;
    }
    const int V = iflow_model_hparams(m)->vocab_size;
    enum { NS = 48 };
    static tcase ref[NS], got[NS];
    int32_t base[3][64];
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 64; j++)
            base[k][j] = j == 0 ? 1 : (int32_t)(rnd_u32() % (uint32_t)(V - 3)) + 3;
    for (int round = 0; round < 6 && check_failed_ == 0; round++) {
        int biggest = 0;
        for (int i = 0; i < NS; i++) {
            tcase *t = &ref[i];
            memset(t, 0, sizeof *t);
            int cut = 1 + (int)(rnd_u32() % 56), own = (int)(rnd_u32() % 8);
            memcpy(t->prompt, base[rnd_u32() % 3], sizeof(int32_t) * (size_t)cut);
            for (int j = cut; j < cut + own; j++)
                t->prompt[j] = (int32_t)(rnd_u32() % (uint32_t)(V - 3)) + 3;
            t->n_prompt = cut + own;
            t->max_tokens = 1 + (int)(rnd_u32() % 40);
            t->sp = (iflow_sampler_params){.temp = rnd_u32() % 2 ? 0.8f : 0, .top_k = 40, .seed = 900 + (uint64_t)i};
            biggest = t->n_prompt + t->max_tokens > biggest ? t->n_prompt + t->max_tokens : biggest;
        }
        tcase *sets[2] = {ref, got};
        memcpy(got, ref, sizeof got);
        const int block = 4 << (round % 3);
        iflow_batch_params off = {.parallel = 1, .n_ctx = 128, .n_threads = 1, .no_prefix_cache = 1};
        iflow_batch_params on = {.parallel = 1 + (int)(rnd_u32() % 6), .n_ctx = 128, .block = block,
                                 .n_blocks = (biggest + block - 1) / block + (int)(rnd_u32() % 6),
                                 .step_tokens = 8 + (int)(rnd_u32() % 40), .n_threads = 2};
        iflow_batch_stats st[2];
        /* N_REQ requests a run: the cases in runs of N_REQ */
        for (int k = 0; k < 2; k++)
            for (int i = 0; i + N_REQ <= NS; i += N_REQ) {
                iflow_batch_stats one;
                if (run_cases(m, sets[k] + i, k ? &on : &off, k, &one) < 0)
                    break;
                st[k] = one;
            }
        int same = 0;
        for (int i = 0; i < NS - NS % N_REQ; i++)
            same += got[i].n_out == ref[i].n_out && got[i].finish == ref[i].finish &&
                    !memcmp(got[i].out, ref[i].out, sizeof(int32_t) * (size_t)ref[i].n_out);
        CHECK(same == NS - NS % N_REQ, "%s, round %d (blocks of %d, parallel %d, %d blocks): %d of %d the same",
              path, round, block, on.parallel, on.n_blocks, same, NS - NS % N_REQ);
        CHECK(st[1].prompt_cached > 0, "%s, round %d: nothing from the cache", path, round);
        if (getenv("BATCH_SHOW"))
            fprintf(stderr, "stress round %d: blocks of %d, parallel %d, %d blocks, %d tokens a step: %llu prompt "
                    "positions evaluated, %llu from the cache, %d idle at the end\n", round, block, on.parallel,
                    on.n_blocks, on.step_tokens, (unsigned long long)st[1].prompt,
                    (unsigned long long)st[1].prompt_cached, st[1].blocks_idle);
    }
    iflow_model_close(m);
}

static void test_prefix_cache(void)
{
    prefix_cache(s260, 0.0f, IFK_KV_F32);
    prefix_cache(s260, 0.8f, IFK_KV_F32);
    prefix_cache(xs, 0.0f, IFK_KV_F32);
    prefix_cache(xs, 0.9f, IFK_KV_Q8);
    prefix_stress(s260);
}

/* ---- log-probabilities ------------------------------------------------------------------------ */

/* One request through a batch beside a distractor (step budget 100: prompts in chunks); the
 * result (free it), or NULL. */
static iflow_result *run_one(iflow_model *m, const iflow_request *q)
{
    iflow_batch_params p = {.parallel = 2, .n_ctx = 512, .step_tokens = 100, .n_threads = 2};
    iflow_batch *b;
    iflow_result *got = NULL, *r;
    int32_t other[40];
    for (int i = 0; i < 40; i++)
        other[i] = i == 0 ? 1 : 3 + i * 7;
    iflow_request o = {.prompt = other, .n_prompt = 40, .max_tokens = 30};
    int rc = iflow_batch_open(&b, m, &p);
    if (rc == 0)
        rc = iflow_batch_add(b, &o);
    if (rc == 0)
        rc = iflow_batch_add(b, q);
    for (int left = 1; rc == 0 && left > 0;)
        rc = (left = iflow_batch_step(b)) < 0 ? left : 0;
    CHECK(rc == 0, "run: %s", iflow_errmsg());
    while (iflow_batch_take(b, &r) == 1)
        if (r->user == q->user)
            got = r;
        else
            iflow_result_free(r);
    iflow_batch_close(b);
    return got;
}

static void test_logprobs(void)
{
    char ids_path[4096]; /* test_data's buffer is static */
    const char *tsv_path = test_data("golden/stories260K.wiki1024.ids.txt");
    snprintf(ids_path, sizeof ids_path, "%s", tsv_path ? tsv_path : "");
    if (!tsv_path || !(tsv_path = test_data("golden/stories260K.wiki1024.win256.logprobs.tsv")))
        SKIP("golden log-probabilities missing");
    enum { N = 256 };
    int32_t ids[N + 40];
    double ref[N];
    FILE *f = fopen(ids_path, "r");
    int n = 0;
    while (f && n < N && fscanf(f, "%d", &ids[n]) == 1)
        n++;
    if (f)
        fclose(f);
    f = fopen(tsv_path, "r");
    char line[256];
    int rows = 0;
    while (f && fgets(line, sizeof line, f) && rows < N - 1) {
        long pos, win, wpos, in, next;
        double lp;
        if (sscanf(line, "%ld %ld %ld %ld %ld %lf", &pos, &win, &wpos, &in, &next, &lp) == 6 && win == 0)
            ref[rows++] = lp; /* window 0: BOS + ids[1..255], row j scores ids[j + 1] */
    }
    if (f)
        fclose(f);
    CHECK(n == N && rows == N - 1, "read %d ids and %d reference rows", n, rows);
    iflow_model *m;
    if (n != N || iflow_model_open(&m, s260, 0) < 0)
        return;
    /* the prompt's log-probabilities, top 3, and those of 8 greedy tokens, top 2 */
    iflow_request q = {.prompt = ids, .n_prompt = N, .max_tokens = 8, .prompt_logprobs = 4, .logprobs = 3, .user = &q};
    iflow_result *r = run_one(m, &q);
    double worst = 0;
    int ok = r && r->prompt_logprobs && r->logprobs && r->prompt_logprobs[0].id == 1 &&
             isnan(r->prompt_logprobs[0].logprob) && r->prompt_logprobs[0].n_top == 0;
    for (int p = 1; ok && p < N; p++) {
        const iflow_token_logprob *e = &r->prompt_logprobs[p];
        double d = fabs(e->logprob - ref[p - 1]);
        worst = d > worst ? d : worst;
        ok &= e->id == ids[p] && e->n_top == 3 && e->top_logprob[0] >= e->top_logprob[1] &&
              e->top_logprob[1] >= e->top_logprob[2] && e->logprob <= e->top_logprob[0];
        for (int k = 0; k < e->n_top; k++)
            ok &= e->top_id[k] != e->id || e->top_logprob[k] == e->logprob;
    }
    CHECK(ok, "prompt log-probabilities: ids, tops in order");
    CHECK(worst <= 1e-4, "prompt log-probabilities: max |diff| %.3g from the float64 reference > 1e-4", worst);
    if (getenv("BATCH_SHOW"))
        fprintf(stderr, "prompt log-probabilities of 255 positions: max |diff| %.3g from the float64 reference\n",
                worst);
    CHECK(r && r->n_tokens == 8, "8 tokens");
    for (int i = 0; r && i < r->n_tokens; i++) /* greedy: each token is the most likely one */
        CHECK(r->logprobs[i].id == r->tokens[i] && r->logprobs[i].n_top == 2 &&
                  r->logprobs[i].top_id[0] == r->tokens[i],
              "generated token %d: id %d, top %d", i, r->logprobs[i].id, r->logprobs[i].top_id[0]);
    /* the same positions scored as a prompt: the generated tokens' log-probabilities, bit for bit */
    if (r && r->n_tokens == 8) {
        memcpy(ids + N, r->tokens, sizeof(int32_t) * 8);
        iflow_request q2 = {.prompt = ids, .n_prompt = N + 8, .max_tokens = 1, .prompt_logprobs = 1, .user = &q2};
        iflow_result *r2 = run_one(m, &q2);
        for (int i = 0; r2 && i < 8; i++)
            CHECK(r2->prompt_logprobs[N + i].logprob == r->logprobs[i].logprob,
                  "generated token %d: log-probability %.9g, %.9g as a prompt token", i, r->logprobs[i].logprob,
                  r2->prompt_logprobs[N + i].logprob);
        iflow_result_free(r2);
    }
    /* asking for log-probabilities does not change the tokens: greedy and sampled */
    for (int t = 0; t < 2; t++) {
        iflow_request a = {.prompt = ids, .n_prompt = 30, .max_tokens = 40, .user = &a,
                           .sampling = {.temp = t ? 0.9f : 0, .top_k = 40, .seed = 5}};
        iflow_request with = a;
        with.user = &with;
        with.logprobs = 1;
        iflow_result *ra = run_one(m, &a), *rw = run_one(m, &with);
        CHECK(ra && rw && ra->n_tokens == rw->n_tokens && !ra->logprobs && rw->logprobs &&
                  !memcmp(ra->tokens, rw->tokens, sizeof(int32_t) * (size_t)ra->n_tokens),
              "temp %d: the tokens differ with log-probabilities asked", t);
        for (int i = 0; rw && i < rw->n_tokens; i++)
            CHECK(rw->logprobs[i].id == rw->tokens[i] && rw->logprobs[i].n_top == 0 && rw->logprobs[i].logprob <= 0,
                  "temp %d token %d: entry id %d", t, i, rw->logprobs[i].id);
        iflow_result_free(ra);
        iflow_result_free(rw);
    }
    /* scoring continuations of one context (an evaluation's multiple choice): positions from 40
     * scored, nothing generated; the context's first 32 positions (4 blocks of 8 before position
     * 39) from the prefix cache for all but the first; the scores those of the cache off */
    enum { CH = 4, CTX = 40 };
    int32_t prompts[CH][CTX + 8];
    iflow_result *res[2][CH] = {{0}};
    iflow_batch_stats st[2];
    for (int off = 0; off < 2; off++) {
        iflow_batch_params sp = {.parallel = CH, .n_ctx = 128, .block = 8, .step_tokens = 64, .n_threads = 2,
                                 .no_prefix_cache = off};
        iflow_batch *b;
        int rc = iflow_batch_open(&b, m, &sp);
        for (int c = 0; c < CH && rc == 0; c++) {
            memcpy(prompts[c], ids, sizeof(int32_t) * CTX);
            for (int j = 0; j < 3 + c; j++)
                prompts[c][CTX + j] = 3 + (c * 37 + j * 11) % 400;
            iflow_request sq = {.prompt = prompts[c], .n_prompt = CTX + 3 + c, .max_tokens = 0, .prompt_logprobs = 2,
                                .prompt_logprobs_from = CTX, .user = &res[off][c]};
            rc = iflow_batch_add(b, &sq);
        }
        for (int left = 1; rc == 0 && left > 0;)
            rc = (left = iflow_batch_step(b)) < 0 ? left : 0;
        CHECK(rc == 0, "scoring: %s", iflow_errmsg());
        iflow_result *x;
        while (iflow_batch_take(b, &x) == 1)
            *(iflow_result **)x->user = x;
        iflow_batch_get_stats(b, &st[off]);
        iflow_batch_close(b);
    }
    CHECK(st[0].prompt_cached == (CH - 1) * 32 && st[1].prompt_cached == 0, "scoring: %llu positions from the cache",
          (unsigned long long)st[0].prompt_cached);
    for (int c = 0; c < CH; c++) {
        iflow_result *a = res[0][c], *z = res[1][c];
        int same = a && z && a->n_tokens == 0 && z->n_tokens == 0 && a->finish == IFLOW_FINISH_LENGTH;
        for (int p = 0; same && p < CTX + 3 + c; p++)
            same &= a->prompt_logprobs[p].id == prompts[c][p] &&
                    (p < CTX ? isnan(a->prompt_logprobs[p].logprob)
                             : a->prompt_logprobs[p].logprob == z->prompt_logprobs[p].logprob &&
                                   a->prompt_logprobs[p].top_id[0] == z->prompt_logprobs[p].top_id[0]);
        CHECK(same, "choice %d: scores with the prefix cache differ from those without", c);
        iflow_result_free(a);
        iflow_result_free(z);
    }
    iflow_request bad = {.prompt = ids, .n_prompt = 3, .max_tokens = 1, .logprobs = IFLOW_MAX_TOP_LOGPROBS + 2};
    iflow_batch *b;
    iflow_batch_params bp = {.parallel = 1, .n_ctx = 64};
    if (iflow_batch_open(&b, m, &bp) == 0) {
        CHECK_ERR(iflow_batch_add(b, &bad), IFLOW_EINVAL, "log-probabilities", "from 0 (none) to 21");
        bad.logprobs = 0;
        bad.max_tokens = 0;
        CHECK_ERR(iflow_batch_add(b, &bad), IFLOW_EINVAL, "max_tokens is 0", "0 only to score a prompt");
        iflow_batch_close(b);
    }
    iflow_result_free(r);
    iflow_model_close(m);
}

/* ---- KV cache types: perplexity ---------------------------------------------------------- */

/* Perplexity of the first n tokens of ids, one position per step (F32 logits of every position). */
static double ppl_steps(iflow_model *m, int kv_type, const int32_t *ids, int n)
{
    const int V = iflow_model_hparams(m)->vocab_size;
    iflow_ctx *c;
    iflow_kv *kv;
    int32_t table[64];
    for (int i = 0; i < 64; i++)
        table[i] = 63 - i;
    if (iflow_ctx_open_steps(&c, m, 2) < 0 || iflow_kv_open(&kv, m, kv_type, 8, 64) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return NAN;
    }
    float *lg = malloc(sizeof(float) * V);
    double nll = 0;
    for (int p = 0; p + 1 < n; p++) {
        iflow_step_seq s = {.ids = ids + p, .n = 1, .pos0 = p, .table = table, .logits = lg};
        if (iflow_ctx_step(c, kv, &s, 1) < 0) {
            CHECK(0, "step: %s", iflow_errmsg());
            break;
        }
        double mx = lg[0], sum = 0;
        for (int i = 1; i < V; i++)
            mx = lg[i] > mx ? lg[i] : mx;
        for (int i = 0; i < V; i++)
            sum += exp(lg[i] - mx);
        nll += mx + log(sum) - lg[ids[p + 1]];
    }
    free(lg);
    iflow_kv_close(kv);
    iflow_ctx_close(c);
    return exp(nll / (n - 1));
}

static void test_kv_types(void)
{
    const char *wiki = test_data("data/wikitext-2-raw/wiki.test.raw");
    if (!wiki)
        SKIP("WikiText-2 missing");
    iflow_model *m;
    if (iflow_model_open(&m, xs, 0) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return;
    }
    char *text;
    size_t len = 0;
    int32_t *ids;
    size_t n;
    text = test_read_file(wiki, &len);
    CHECK(text != NULL, "read %s", wiki);
    if (len > 20000)
        len = 20000;
    CHECK(iflow_tokenizer_encode(iflow_model_tokenizer(m), text, len, IFLOW_TOK_ADD_BOS, &ids, &n) == 0, "encode");
    const int N = 256; /* the model's context */
    CHECK(n >= (size_t)N, "%zu tokens", n);
    double f32 = ppl_steps(m, IFK_KV_F32, ids, N), f16 = ppl_steps(m, IFK_KV_F16, ids, N),
           q8 = ppl_steps(m, IFK_KV_Q8, ids, N);
    if (getenv("BATCH_SHOW"))
        fprintf(stderr, "xs-ckpt ppl over %d tokens: kv f32 %.4f, f16 %.4f (%+.4f %%), q8 %.4f (%+.4f %%)\n", N, f32,
                f16, 100 * (f16 / f32 - 1), q8, 100 * (q8 / f32 - 1));
    CHECK(fabs(f16 / f32 - 1) < 5e-4, "f16 KV perplexity %.4f vs f32 %.4f", f16, f32);
    CHECK(fabs(q8 / f32 - 1) < 2e-2, "q8 KV perplexity %.4f vs f32 %.4f", q8, f32);
    /* a TinyStories model on Wikipedia text: high, but far below the vocabulary's 512 */
    CHECK(f32 > 1 && f32 < 400, "f32 perplexity %.3f is implausible", f32);
    free(ids);
    free(text);
    iflow_model_close(m);
}

/* ---- finish reasons, stop strings, refusals ------------------------------------------------- */

static void test_finish_and_errors(void)
{
    iflow_model *m;
    if (iflow_model_open(&m, s260, 0) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return;
    }
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    int32_t *ids;
    size_t n;
    CHECK(iflow_tokenizer_encode(tok, "Once upon a time", 16, IFLOW_TOK_ADD_BOS, &ids, &n) == 0, "encode");
    iflow_batch_params p = {.parallel = 2, .n_ctx = 40, .block = 4, .n_blocks = 12, .n_threads = 1};
    iflow_batch *b;
    CHECK(iflow_batch_open(&b, m, &p) == 0, "open: %s", iflow_errmsg());
    iflow_request r = {.prompt = ids, .n_prompt = (int)n, .max_tokens = 5};
    iflow_result *res = NULL;
    /* length */
    CHECK(iflow_batch_add(b, &r) == 0, "add: %s", iflow_errmsg());
    while (iflow_batch_step(b) > 0)
        ;
    CHECK(iflow_batch_take(b, &res) == 1, "a result");
    CHECK(res && res->finish == IFLOW_FINISH_LENGTH && res->n_tokens == 5, "finish %s after %d tokens",
          res ? iflow_finish_name(res->finish) : "-", res ? res->n_tokens : -1);
    char *full = res && res->text ? strdup(res->text) : NULL;
    iflow_result_free(res);
    /* stop: a string spanning the first tokens' boundary; the text ends before it */
    CHECK(full && strlen(full) > 4, "text '%s'", full ? full : "");
    if (full && strlen(full) > 4) {
        char stop[8];
        size_t fl = strlen(full), at = fl / 2;
        snprintf(stop, sizeof stop, "%.3s", full + at - 1);
        r.stop[0] = "\x01never";
        r.stop[1] = stop;
        r.n_stop = 2;
        CHECK(iflow_batch_add(b, &r) == 0, "add: %s", iflow_errmsg());
        while (iflow_batch_step(b) > 0)
            ;
        CHECK(iflow_batch_take(b, &res) == 1, "a result");
        const char *hit = strstr(full, stop);
        CHECK(res && res->finish == IFLOW_FINISH_STOP && hit && res->text_len == (size_t)(hit - full) &&
                  strncmp(res->text, full, res->text_len) == 0,
              "stop '%s' in '%s': finish %s, text '%s'", stop, full, res ? iflow_finish_name(res->finish) : "-",
              res && res->text ? res->text : "");
        iflow_result_free(res);
        r.n_stop = 0;
    }
    free(full);
    /* context: max_tokens clipped to what the context of 40 holds */
    r.max_tokens = 1000;
    CHECK(iflow_batch_add(b, &r) == 0, "add: %s", iflow_errmsg());
    while (iflow_batch_step(b) > 0)
        ;
    CHECK(iflow_batch_take(b, &res) == 1, "a result");
    CHECK(res && (res->finish == IFLOW_FINISH_CONTEXT || res->finish == IFLOW_FINISH_EOS) &&
              res->n_prompt + res->n_tokens <= 40,
          "finish %s with %d + %d tokens", res ? iflow_finish_name(res->finish) : "-", res ? res->n_prompt : 0,
          res ? res->n_tokens : 0);
    iflow_result_free(res);
    /* refusals */
    int32_t bad = 100000, big[40] = {1};
    iflow_request e = {.prompt = &bad, .n_prompt = 1, .max_tokens = 4};
    CHECK_ERR(iflow_batch_add(b, &e), IFLOW_ERANGE, "100000", "outside the vocabulary");
    e.n_prompt = 0;
    CHECK_ERR(iflow_batch_add(b, &e), IFLOW_EINVAL, "prompt", "no tokens");
    e.prompt = big, e.n_prompt = 40;
    CHECK_ERR(iflow_batch_add(b, &e), IFLOW_ERANGE, "40 tokens", "does not fit the context of 40");
    e.n_prompt = 1, e.max_tokens = 0;
    CHECK_ERR(iflow_batch_add(b, &e), IFLOW_EINVAL, "max_tokens", "at least 1");
    CHECK(iflow_batch_pending(b) == 0, "refused requests are not queued");
    iflow_batch_close(b);
    /* a request needing more blocks than the cache has */
    p.n_blocks = 2;
    CHECK(iflow_batch_open(&b, m, &p) == 0, "open: %s", iflow_errmsg());
    r.max_tokens = 30;
    CHECK_ERR(iflow_batch_add(b, &r), IFLOW_ERANGE, "KV blocks", "the cache has 2");
    iflow_batch_close(b);
    free(ids);
    iflow_model_close(m);
}

/* ---- logit biases, min_tokens, ignore_eos --------------------------------------------------- */

/* q (user tag set) alone in a batch over m, with `draft` proposing 4 tokens when not NULL. */
static iflow_result *run_biased(iflow_model *m, iflow_model *draft, const iflow_request *q)
{
    iflow_batch_params p = {.parallel = 1, .n_ctx = 64, .n_threads = 2};
    iflow_batch *b;
    iflow_result *r = NULL;
    int rc = iflow_batch_open(&b, m, &p);
    if (rc == 0 && draft)
        rc = iflow_batch_set_draft(b, draft, 4, 0, 0);
    if (rc == 0)
        rc = iflow_batch_add(b, q);
    while (rc == 0 && (rc = iflow_batch_step(b)) > 0)
        rc = 0;
    CHECK(rc == 0, "run: %s", iflow_errmsg());
    if (rc == 0 && iflow_batch_take(b, &r) != 1)
        r = NULL;
    iflow_batch_close(b);
    return r;
}

static int has_token(const iflow_result *r, int32_t t)
{
    for (int i = 0; r && i < r->n_tokens; i++)
        if (r->tokens[i] == t)
            return 1;
    return 0;
}

static void test_bias_and_eos(void)
{
    iflow_model *m;
    if (iflow_model_open(&m, s260, 0) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return;
    }
    const iflow_hparams *hp = iflow_model_hparams(m);
    const int32_t prompt[5] = {1, 403, 407, 261, 378}, eos = hp->eos[0]; /* "Once upon a time" */
    iflow_request q = {.prompt = prompt, .n_prompt = 5, .max_tokens = 20};
    iflow_result *plain = run_biased(m, NULL, &q);
    CHECK(plain && plain->n_tokens == 20 && !has_token(plain, eos), "the greedy text: 20 tokens, no EOS");
    if (!plain) {
        iflow_model_close(m);
        return;
    }
    float up = 100;
    q.bias_ids = &eos, q.bias_values = &up, q.n_bias = 1;
    for (int d = 0; d < 2; d++) {
        iflow_model *draft = d ? m : NULL;
        q.min_tokens = 0, q.ignore_eos = 0;
        iflow_result *r = run_biased(m, draft, &q);
        CHECK(r && r->finish == IFLOW_FINISH_EOS && r->n_tokens == 0, "EOS +100%s: it ends at once (%d tokens)",
              d ? ", a draft" : "", r ? r->n_tokens : -1);
        iflow_result_free(r);
        q.min_tokens = 5;
        r = run_biased(m, draft, &q);
        CHECK(r && r->finish == IFLOW_FINISH_EOS && r->n_tokens == 5 && !memcmp(r->tokens, plain->tokens, 5 * 4),
              "EOS +100, min_tokens 5%s: the 5 greedy tokens, then the EOS (%d tokens)", d ? ", a draft" : "",
              r ? r->n_tokens : -1);
        iflow_result_free(r);
        q.min_tokens = 0, q.ignore_eos = 1;
        r = run_biased(m, draft, &q);
        CHECK(r && r->finish == IFLOW_FINISH_LENGTH && r->n_tokens == 20 && !memcmp(r->tokens, plain->tokens, 20 * 4),
              "EOS +100, ignore_eos%s: the 20 greedy tokens", d ? ", a draft" : "");
        iflow_result_free(r);
        /* a stop token: greedy token k (the first not among those before it, from 4 on) */
        int k = 4;
        while (k < 19 && has_token(&(iflow_result){.tokens = plain->tokens, .n_tokens = k}, plain->tokens[k]))
            k++;
        iflow_request s = {.prompt = prompt, .n_prompt = 5, .max_tokens = 20, .stop_ids = &plain->tokens[k],
                           .n_stop_ids = 1};
        r = run_biased(m, draft, &s);
        CHECK(r && r->finish == IFLOW_FINISH_STOP && r->stop_token == plain->tokens[k] && r->stop_index == -1 &&
                  r->n_tokens == k && !memcmp(r->tokens, plain->tokens, (size_t)k * 4),
              "stop token %d%s: the %d greedy tokens before it", plain->tokens[k], d ? ", a draft" : "", k);
        iflow_result_free(r);
    }
    /* -inf on the first greedy token: the next best of the prompt's logits */
    const int V = hp->vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)V), ban = -INFINITY;
    iflow_ctx *c;
    CHECK(iflow_ctx_open(&c, m, 64, 2) == 0 && iflow_ctx_eval(c, prompt, 5, logits, 0) == 0, "%s", iflow_errmsg());
    logits[plain->tokens[0]] = -INFINITY;
    q = (iflow_request){.prompt = prompt, .n_prompt = 5, .max_tokens = 3, .bias_ids = &plain->tokens[0],
                        .bias_values = &ban, .n_bias = 1};
    iflow_result *r = run_biased(m, NULL, &q);
    CHECK(r && r->n_tokens == 3 && r->tokens[0] == iflow_argmax(logits, V),
          "the first greedy token banned: the argmax of the rest (%d)", iflow_argmax(logits, V));
    iflow_result_free(r);
    iflow_ctx_close(c);
    free(logits);
    /* sampled: the token an unbiased draw takes first never comes once banned */
    q = (iflow_request){.prompt = prompt, .n_prompt = 5, .max_tokens = 40,
                        .sampling = {.temp = 1.0f, .seed = 11}};
    r = run_biased(m, NULL, &q);
    const int32_t x = r && r->n_tokens ? r->tokens[0] : 0;
    iflow_result_free(r);
    q.bias_ids = &x, q.bias_values = &ban, q.n_bias = 1;
    r = run_biased(m, NULL, &q);
    CHECK(r && r->n_tokens == 40 && !has_token(r, x), "sampled, token %d banned: never drawn", x);
    iflow_result_free(r);
    /* refused */
    iflow_batch_params p = {.n_ctx = 64};
    iflow_batch *b;
    CHECK(iflow_batch_open(&b, m, &p) == 0, "%s", iflow_errmsg());
    int32_t far = V;
    q = (iflow_request){.prompt = prompt, .n_prompt = 5, .max_tokens = 4, .min_tokens = 5};
    CHECK_ERR(iflow_batch_add(b, &q), IFLOW_EINVAL, "min_tokens 5", "max_tokens (4)");
    q = (iflow_request){.prompt = prompt, .n_prompt = 5, .max_tokens = 4, .bias_ids = &far, .bias_values = &up,
                        .n_bias = 1};
    CHECK_ERR(iflow_batch_add(b, &q), IFLOW_ERANGE, "token 512", "outside the vocabulary");
    q.n_bias = IFLOW_MAX_BIAS + 1;
    CHECK_ERR(iflow_batch_add(b, &q), IFLOW_EINVAL, "1025 logit biases", "at most 1024");
    CHECK(iflow_batch_pending(b) == 0, "nothing queued");
    iflow_batch_close(b);
    iflow_result_free(plain);
    iflow_model_close(m);
}

/* ---- allowed tokens, banned sequences (vLLM's allowed_token_ids, bad_words) ---------------- */

/* The argmax of logits [V] among the tokens with allow[id] (lowest id on ties). */
static int32_t argmax_among(const float *logits, int V, const uint8_t *allow)
{
    int32_t best = -1;
    for (int i = 0; i < V; i++)
        if (allow[i] && (best < 0 || logits[i] > logits[best]))
            best = i;
    return best;
}

static void test_allowed_and_banned(void)
{
    iflow_model *m;
    if (iflow_model_open(&m, s260, 0) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return;
    }
    const int V = iflow_model_hparams(m)->vocab_size;
    const int32_t prompt[5] = {1, 403, 407, 261, 378}; /* "Once upon a time" */
    iflow_request q = {.prompt = prompt, .n_prompt = 5, .max_tokens = 12};
    iflow_result *plain = run_biased(m, NULL, &q);
    float *logits = malloc(sizeof(float) * (size_t)V);
    uint8_t *allow = calloc((size_t)V, 1);
    iflow_ctx *c;
    if (!plain || !logits || !allow || iflow_ctx_open(&c, m, 64, 2) < 0) {
        CHECK(0, "setup: %s", iflow_errmsg());
        return;
    }
    /* allowed: eight tokens, two of them greedy ones; the reference is the argmax among them at
     * each position of iflow_ctx_eval's logits (the end-of-sequence token is not allowed) */
    const int32_t allowed[8] = {300, 301, 302, 303, 304, 305, plain->tokens[2], plain->tokens[6]};
    for (int i = 0; i < 8; i++)
        allow[allowed[i]] = 1;
    int32_t want[12];
    int rc = iflow_ctx_eval(c, prompt, 5, logits, 0);
    for (int i = 0; i < 12 && rc == 0; i++) {
        want[i] = argmax_among(logits, V, allow);
        rc = iflow_ctx_eval(c, &want[i], 1, logits, 0);
    }
    CHECK(rc == 0, "reference: %s", iflow_errmsg());
    q.allowed_ids = allowed, q.n_allowed = 8;
    for (int d = 0; d < 2; d++) {
        iflow_result *r = run_biased(m, d ? m : NULL, &q);
        CHECK(r && r->n_tokens == 12 && !memcmp(r->tokens, want, sizeof want),
              "allowed_ids%s: the argmax among them at each position", d ? ", a draft" : "");
        iflow_result_free(r);
    }
    /* banned: the first two greedy tokens as a sequence; the first stays, the second is the next
     * best after it */
    memset(allow, 1, (size_t)V);
    allow[plain->tokens[1]] = 0;
    iflow_ctx_reset(c);
    rc = iflow_ctx_eval(c, prompt, 5, logits, 0);
    if (rc == 0)
        rc = iflow_ctx_eval(c, plain->tokens, 1, logits, 0);
    CHECK(rc == 0, "reference: %s", iflow_errmsg());
    const int32_t second = argmax_among(logits, V, allow);
    int lens[2] = {2, 2};
    int32_t seqs[4] = {plain->tokens[0], plain->tokens[1], prompt[4], plain->tokens[0]};
    q = (iflow_request){.prompt = prompt, .n_prompt = 5, .max_tokens = 12, .bad_ids = seqs, .bad_lens = lens,
                        .n_bad = 1};
    for (int d = 0; d < 2; d++) {
        iflow_result *r = run_biased(m, d ? m : NULL, &q);
        CHECK(r && r->n_tokens == 12 && r->tokens[0] == plain->tokens[0] && r->tokens[1] == second,
              "banned [%d %d]%s: %d, then the next best %d", seqs[0], seqs[1], d ? ", a draft" : "",
              plain->tokens[0], second);
        iflow_result_free(r);
    }
    /* a sequence whose head is the prompt's last token does not apply: only generated tokens count */
    q.bad_ids = seqs + 2, q.bad_lens = lens + 1;
    iflow_result *r = run_biased(m, NULL, &q);
    CHECK(r && r->n_tokens == 12 && !memcmp(r->tokens, plain->tokens, 12 * sizeof *r->tokens),
          "a sequence begun in the prompt bans nothing");
    iflow_result_free(r);
    /* refused */
    iflow_batch_params p = {.n_ctx = 64};
    iflow_batch *b;
    CHECK(iflow_batch_open(&b, m, &p) == 0, "%s", iflow_errmsg());
    int32_t far = V;
    q = (iflow_request){.prompt = prompt, .n_prompt = 5, .max_tokens = 4, .allowed_ids = &far, .n_allowed = 1};
    CHECK_ERR(iflow_batch_add(b, &q), IFLOW_ERANGE, "allowed token 512", "outside the vocabulary");
    q = (iflow_request){.prompt = prompt, .n_prompt = 5, .max_tokens = 4, .bad_ids = seqs, .bad_lens = lens,
                        .n_bad = IFLOW_MAX_BAD_WORDS + 1};
    CHECK_ERR(iflow_batch_add(b, &q), IFLOW_EINVAL, "129 banned sequences", "at most 128");
    int zero = 0, huge = IFLOW_MAX_BAD_TOKENS + 1;
    q.n_bad = 1, q.bad_lens = &zero;
    CHECK_ERR(iflow_batch_add(b, &q), IFLOW_EINVAL, "banned sequence 1 of 0 tokens", "at most 1024");
    q.bad_lens = &huge;
    CHECK_ERR(iflow_batch_add(b, &q), IFLOW_EINVAL, "banned sequence 1 of 1025 tokens", "at least 1");
    q.bad_ids = &far, q.bad_lens = lens;
    lens[0] = 1;
    CHECK_ERR(iflow_batch_add(b, &q), IFLOW_ERANGE, "banned sequence 1: token 512", "outside the vocabulary");
    CHECK(iflow_batch_pending(b) == 0, "nothing queued");
    iflow_batch_close(b);
    iflow_ctx_close(c);
    free(logits);
    free(allow);
    iflow_result_free(plain);
    iflow_model_close(m);
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(s260, sizeof s260, "%s/s.ifs", dir);
    snprintf(xs, sizeof xs, "%s/xs.ifs", dir);
    if (test_convert("models/stories260K/hf", s260, -1) != 0 || test_convert("models/xs-ckpt/hf", xs, -1) != 0) {
        fprintf(stderr, "test data missing or conversion failed\n");
        return check_summary("test_batch") | 1;
    }
    RUN(test_paged_vs_contiguous);
    RUN(test_batching);
    RUN(test_prefix_cache);
    RUN(test_logprobs);
    RUN(test_kv_types);
    RUN(test_finish_and_errors);
    RUN(test_bias_and_eos);
    RUN(test_allowed_and_banned);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_batch");
}
