/*
 * test_speculative.c -- speculative decoding (sampler.h's iflow_spec_verify and
 * iflow_sampler_dist, batch.h's iflow_batch_set_draft).
 *
 * References:
 *   - the acceptance rule on a toy vocabulary of 8: draft tokens drawn from q, verified
 *     against p, 400,000 times: the tokens returned are distributed as p (chi-square with 7
 *     degrees of freedom below 24.3, p-value 0.001), and the acceptance rate is
 *     sum_i min(p_i, q_i) within 0.005 (its definition); for several (p, q) pairs including
 *     q = p (all accepted), disjoint supports (none accepted) and q with a zero where p is not.
 *   - the flexible rule: accepted exactly when the token is in p's top k.
 *   - iflow_sampler_dist against the chain's definition computed here: top-k 3 of hand-built
 *     logits, softmax at temperature 0.5; greedy: all mass on the argmax; and a draw from it
 *     with iflow_sampler_draw follows it (chi-square).
 *   - the engine: greedy requests with a draft (a quantized copy of the model: the q4 and q2
 *     of stories260K and xs-ckpt) give exactly the tokens they give without one, alone and
 *     four at a time, with stop strings and max_tokens met inside a run of accepted
 *     proposals; the same with stories260K as the draft of xs-ckpt (same tokenizer); seeded
 *     sampled requests with a draft give the same tokens alone and in a batch; a draft that
 *     holds fewer positions than the context is refused. (A draft of another vocabulary is
 *     refused too; no model of another vocabulary is small enough to test it here.)
 *   - a draft with the prefix cache (requests sharing 32 positions of their prompts): greedy tokens
 *     equal the model's without a draft and without the cache;
 *   - a draft with a context shift (rope and recompute; a context of 64, 300 and 350 tokens, two
 *     requests at once): greedy tokens equal the model's without a draft with the same shifts,
 *     as many shifts happen, and the draft saves steps.
 *   - a draft with a grammar: greedy requests give the tokens they give without a draft (some
 *     proposals kept), sampled ones text of the grammar.
 */
#include "tests/unit/testlib.h"
#include "libcore/engine/model.h"
#include "libcore/engine/sampler.h"
#include "libcore/formats/quant.h"
#include "libcore/serving/batch.h"
#include "libcore/serving/grammar.h"
#include "libcore/tokenizers/tokenizer.h"

#include <math.h>

static char dir[] = "/tmp/iflow-test-spec-XXXXXX";
static char s260[512], s260q4[512], s260q2[512], xs[512], xsq2[512];

/* the test's own uniform draws */
static double unit(void) { return (double)(rnd_u32() >> 8) / 16777216.0; }

static int32_t draw(const float *x, int n, double u)
{
    double t = 0, a = 0;
    for (int i = 0; i < n; i++)
        t += x[i];
    for (int i = 0; i < n; i++) {
        a += x[i];
        if (u * t < a && x[i] > 0)
            return i;
    }
    return n - 1;
}

static double chi2(const long *count, const float *p, int n, long trials)
{
    double c = 0;
    for (int i = 0; i < n; i++) {
        double e = p[i] * (double)trials;
        if (e > 0)
            c += (count[i] - e) * (count[i] - e) / e;
        else if (count[i])
            return 1e9; /* a token p never gives */
    }
    return c;
}

static void rule_case(const char *name, const float *p, const float *q)
{
    enum { N = 8 };
    const long T = 400000;
    long count[N] = {0}, acc = 0;
    for (long t = 0; t < T; t++) {
        int32_t d = draw(q, N, unit());
        int a;
        int32_t tok = iflow_spec_verify(p, q, N, d, unit(), unit(), 0, 0, &a);
        count[tok]++;
        acc += a;
        if (a && tok != d) {
            CHECK(0, "%s: accepted, yet %d is not the draft %d", name, tok, d);
            return;
        }
    }
    double want = 0, sp = 0, sq = 0;
    for (int i = 0; i < N; i++)
        sp += p[i], sq += q[i];
    for (int i = 0; i < N; i++)
        want += fmin(p[i] / sp, q[i] / sq);
    double x2 = chi2(count, p, N, T), rate = (double)acc / T;
    float pn[N];
    for (int i = 0; i < N; i++)
        pn[i] = (float)(p[i] / sp);
    x2 = chi2(count, pn, N, T);
    CHECK(x2 < 24.3, "%s: output is not distributed as p: chi-square %.1f", name, x2);
    CHECK(fabs(rate - want) < 0.005, "%s: acceptance %.4f, sum min(p, q) = %.4f", name, rate, want);
}

static void test_rule(void)
{
    float p1[8] = {0.3f, 0.2f, 0.15f, 0.1f, 0.1f, 0.08f, 0.05f, 0.02f};
    float q1[8] = {0.05f, 0.1f, 0.4f, 0.05f, 0.2f, 0.1f, 0.05f, 0.05f};
    float q2[8] = {0.5f, 0.5f, 0, 0, 0, 0, 0, 0};           /* zeros where p is not */
    float p3[8] = {0, 0, 0, 0, 0.25f, 0.25f, 0.25f, 0.25f}; /* disjoint from q2 */
    float q4[8] = {1, 1, 1, 1, 1, 1, 1, 1};                 /* unnormalized uniform */
    rule_case("general", p1, q1);
    rule_case("q zero where p is not", p1, q2);
    rule_case("disjoint", p3, q2);
    rule_case("q = p", p1, p1);
    rule_case("unnormalized q", p1, q4);
    /* the flexible rules: in p's top 3 (0, 1, 2), or where the tokens ahead hold less than 0.6
     * (ahead of 2: 0.5; of 3: 0.65), or both; else p's argmax */
    for (int32_t d = 0; d < 8; d++) {
        int a, b, c;
        int32_t tok = iflow_spec_verify(p1, q1, 8, d, 0.99, 0.5, 3, 0, &a);
        CHECK(a == (d < 3) && tok == (d < 3 ? d : 0), "top-3 rule on %d: accepted %d, token %d", d, a, tok);
        tok = iflow_spec_verify(p1, q1, 8, d, 0.99, 0.5, 0, 0.6f, &b);
        CHECK(b == (d < 3) && tok == (d < 3 ? d : 0), "top-p 0.6 rule on %d: accepted %d, token %d", d, b, tok);
        iflow_spec_verify(p1, q1, 8, d, 0.99, 0.5, 2, 0.6f, &c);
        CHECK(c == (d < 2), "top-2 and top-p 0.6 on %d: accepted %d", d, c);
    }
}

static void test_dist(void)
{
    enum { V = 10 };
    float logits[V] = {1.0f, 3.0f, -2.0f, 2.5f, 0.0f, 2.9f, -1.0f, 0.5f, 1.5f, -3.0f}, probs[V];
    iflow_sampler_params sp;
    iflow_sampler_params_default(&sp);
    sp.temp = 0.5f, sp.top_k = 3, sp.top_p = 1, sp.seed = 11;
    iflow_sampler *s;
    CHECK(iflow_sampler_open(&s, &sp, V) == 0, "open: %s", iflow_errmsg());
    CHECK(iflow_sampler_dist(s, logits, probs) == 0, "dist: %s", iflow_errmsg());
    /* the definition: the 3 largest (ids 1, 5, 3), softmax of logit / 0.5 */
    double z = exp(3.0 / 0.5) + exp(2.9 / 0.5) + exp(2.5 / 0.5), worst = 0;
    for (int i = 0; i < V; i++) {
        double want = i == 1 ? exp(6.0) / z : i == 5 ? exp(5.8) / z : i == 3 ? exp(5.0) / z : 0;
        worst = fmax(worst, fabs(probs[i] - want));
    }
    CHECK(worst < 1e-6, "top-3 at temperature 0.5: off by %.3g", worst);
    long count[V] = {0};
    for (int t = 0; t < 100000; t++)
        count[iflow_sampler_draw(s, probs)]++;
    CHECK(chi2(count, probs, V, 100000) < 16.3, "draws do not follow the distribution"); /* 2 dof, 0.0003 */
    iflow_sampler_close(s);
    sp.temp = 0;
    CHECK(iflow_sampler_open(&s, &sp, V) == 0 && iflow_sampler_dist(s, logits, probs) == 0, "greedy: %s", iflow_errmsg());
    CHECK(probs[1] == 1 && probs[5] == 0, "greedy: all mass on the argmax");
    iflow_sampler_close(s);
    sp.kind = IFLOW_SAMPLER_MIROSTAT2, sp.temp = 0.8f;
    CHECK(iflow_sampler_open(&s, &sp, V) == 0, "mirostat: %s", iflow_errmsg());
    CHECK(!iflow_sampler_has_dist(s), "mirostat has no fixed distribution");
    CHECK_ERR(iflow_sampler_dist(s, logits, probs), IFLOW_EUNSUPPORTED, "mirostat2", "no fixed distribution");
    iflow_sampler_close(s);
}

/* ---- the engine ----------------------------------------------------------------------------- */

typedef struct {
    int32_t prompt[48];
    int n_prompt, max_tokens;
    float temp;
    uint64_t seed;
    const char *stop;
    int shift, keep;              /* context shift (IFLOW_SHIFT_*) and what it keeps */
    const iflow_grammar *grammar; /* a constraint, or NULL */
} job;

/* Run jobs[0..n) in one batch (parallel `par`, a context of n_ctx, a draft or none); tokens into
 * out + i * cap (n_out[i]). */
static int no_prefix_cache; /* run_jobs' batches: 1 for the cache off */

static int run_jobs(iflow_model *m, iflow_model *draft, int n_draft, const job *jobs, int n, int par, int n_ctx,
                    int32_t *out, int cap, int *n_out, iflow_batch_stats *st)
{
    iflow_batch *b;
    iflow_batch_params p = {.parallel = par, .n_ctx = n_ctx, .n_threads = 2, .no_prefix_cache = no_prefix_cache};
    if (iflow_batch_open(&b, m, &p) < 0 || (draft && iflow_batch_set_draft(b, draft, n_draft, 0, 0) < 0)) {
        CHECK(0, "open: %s", iflow_errmsg());
        return -1;
    }
    for (int i = 0; i < n; i++) {
        iflow_request r = {.prompt = jobs[i].prompt, .n_prompt = jobs[i].n_prompt, .max_tokens = jobs[i].max_tokens,
                           .context_shift = jobs[i].shift, .keep = jobs[i].keep, .user = (void *)(intptr_t)i,
                           .grammar = jobs[i].grammar};
        iflow_sampler_params_default(&r.sampling);
        r.sampling.temp = jobs[i].temp, r.sampling.seed = jobs[i].seed;
        if (jobs[i].stop)
            r.stop[0] = jobs[i].stop, r.n_stop = 1;
        if (iflow_batch_add(b, &r) < 0) {
            CHECK(0, "add: %s", iflow_errmsg());
            iflow_batch_close(b);
            return -1;
        }
    }
    int rc;
    while ((rc = iflow_batch_step(b)) > 0)
        ;
    CHECK(rc == 0, "step: %s", iflow_errmsg());
    iflow_result *res;
    while (iflow_batch_take(b, &res) == 1) {
        int i = (int)(intptr_t)res->user;
        n_out[i] = res->n_tokens < cap ? res->n_tokens : cap;
        memcpy(out + (size_t)i * cap, res->tokens, sizeof(int32_t) * (size_t)n_out[i]);
        iflow_result_free(res);
    }
    if (st)
        iflow_batch_get_stats(b, st);
    iflow_batch_close(b);
    return rc;
}

/* A draft with a context shift: greedy tokens equal the model's alone with the same shift. */
static void shift_case(iflow_model *m, iflow_model *d, const char *what)
{
    /* greedy requests (two at once) that run far past a context of 64 */
    const iflow_hparams *hp = iflow_model_hparams(m);
    job jobs[2] = {{.prompt = {hp->bos, 10, 20, 30, 40, 50}, .n_prompt = 6, .max_tokens = 300, .keep = 4},
                   {.prompt = {hp->bos, 7, 70, 17, 170}, .n_prompt = 5, .max_tokens = 350, .keep = 4}};
    static int32_t plain[2][400], spec[2][400];
    int np[2] = {0}, ns[2] = {0};
    iflow_batch_stats s0, s1;
    for (int shift = IFLOW_SHIFT_ROPE; shift <= IFLOW_SHIFT_RECOMPUTE; shift++) {
        jobs[0].shift = jobs[1].shift = shift;
        if (run_jobs(m, NULL, 0, jobs, 2, 2, 64, plain[0], 400, np, &s0) < 0 ||
            run_jobs(m, d, 5, jobs, 2, 2, 64, spec[0], 400, ns, &s1) < 0)
            break;
        for (int i = 0; i < 2; i++)
            CHECK(np[i] == 300 + 50 * i && np[i] == ns[i] &&
                      memcmp(plain[i], spec[i], sizeof(int32_t) * (size_t)np[i]) == 0,
                  "%s, shift %s: request %d differs with the draft (%d vs %d tokens)", what, iflow_shift_name(shift), i,
                  ns[i], np[i]);
        CHECK(s0.shifts >= 8 && s1.shifts == s0.shifts, "%s, shift %s: %llu shifts with the draft, %llu without", what,
              iflow_shift_name(shift), (unsigned long long)s1.shifts, (unsigned long long)s0.shifts);
        CHECK(s1.accepted > 0 && s1.steps < s0.steps, "%s, shift %s: %llu accepted, %llu steps (%llu without)", what,
              iflow_shift_name(shift), (unsigned long long)s1.accepted, (unsigned long long)s1.steps,
              (unsigned long long)s0.steps);
        if (getenv("SPEC_SHOW"))
            fprintf(stderr, "  %s, shift %s: %llu proposed, %llu accepted, %llu steps (%llu without), %llu shifts\n",
                    what, iflow_shift_name(shift), (unsigned long long)s1.drafted, (unsigned long long)s1.accepted,
                    (unsigned long long)s1.steps, (unsigned long long)s0.steps, (unsigned long long)s1.shifts);
    }
}

/* A draft with the prefix cache: requests sharing a 40-token prefix (2 blocks of 16) take it from
 * the cache while the draft's own cache evaluates it: the greedy tokens of no draft and no cache. */
static void prefix_case(iflow_model *m, iflow_model *d, const char *what)
{
    const iflow_hparams *hp = iflow_model_hparams(m);
    enum { NJ = 5 };
    job jobs[NJ];
    for (int i = 0; i < NJ; i++) {
        jobs[i] = (job){.n_prompt = 40 + 1 + i, .max_tokens = 30 + 7 * i, .temp = i < 4 ? 0 : 0.9f, .seed = 7 + i};
        for (int j = 0; j < jobs[i].n_prompt; j++)
            jobs[i].prompt[j] = j == 0 ? hp->bos : j < 40 ? 3 + (j * 29) % 300 : 3 + (i * 13 + j) % 200;
    }
    static int32_t plain[NJ][96], spec[NJ][96];
    int np[NJ], ns[NJ];
    iflow_batch_stats s0, s1;
    no_prefix_cache = 1;
    int rc = run_jobs(m, NULL, 0, jobs, NJ, 3, 128, plain[0], 96, np, &s0);
    no_prefix_cache = 0;
    if (rc < 0 || run_jobs(m, d, 4, jobs, NJ, 3, 128, spec[0], 96, ns, &s1) < 0)
        return;
    for (int i = 0; i < 4; i++) /* greedy: the same tokens */
        CHECK(np[i] == ns[i] && memcmp(plain[i], spec[i], sizeof(int32_t) * (size_t)np[i]) == 0,
              "%s, prefix cache: greedy request %d differs with the draft (%d vs %d tokens)", what, i, ns[i], np[i]);
    CHECK(s0.prompt_cached == 0 && s1.prompt_cached == (NJ - 1) * 32 && s1.accepted > 0,
          "%s, prefix cache with a draft: %llu positions from the cache, %llu proposals accepted", what,
          (unsigned long long)s1.prompt_cached, (unsigned long long)s1.accepted);
}

/* A draft with a grammar: the draft proposes freely, the model's draws follow the grammar. Greedy
 * requests give the tokens they give without a draft, and some proposals are kept; sampled ones
 * give text of the grammar (whole when it ended there, a prefix when cut by length). */
static void grammar_case(iflow_model *m, iflow_model *d, const char *what)
{
    static const char *const gbnf = "root ::= (\" \" [a-z]+ (\",\" | \" and\")?){4,40} \".\"";
    iflow_grammar *g;
    if (iflow_grammar_open(&g, gbnf, strlen(gbnf), NULL) < 0) {
        CHECK(0, "grammar: %s", iflow_errmsg());
        return;
    }
    const iflow_hparams *hp = iflow_model_hparams(m);
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    enum { NJ = 6 };
    job jobs[NJ];
    for (int i = 0; i < NJ; i++) {
        jobs[i] = (job){.n_prompt = 4, .max_tokens = 40 + 9 * i, .temp = i < 3 ? 0 : 0.8f, .seed = 31 + i,
                        .grammar = g, .prompt = {hp->bos, 3 + 17 * i, 40 + 11 * i, 90 + 5 * i}};
    }
    static int32_t plain[NJ][96], spec[NJ][96];
    int np[NJ], ns[NJ];
    iflow_batch_stats st;
    if (run_jobs(m, NULL, 0, jobs, NJ, 3, 128, plain[0], 96, np, NULL) == 0 &&
        run_jobs(m, d, 4, jobs, NJ, 3, 128, spec[0], 96, ns, &st) == 0) {
        for (int i = 0; i < 3; i++)
            CHECK(np[i] == ns[i] && memcmp(plain[i], spec[i], sizeof(int32_t) * (size_t)np[i]) == 0,
                  "%s, a grammar: greedy request %d differs with the draft (%d vs %d tokens)", what, i, ns[i], np[i]);
        CHECK(st.drafted > 0 && st.accepted > 0, "%s, a grammar: %llu proposed, %llu accepted", what,
              (unsigned long long)st.drafted, (unsigned long long)st.accepted);
        for (int i = 0; i < NJ; i++) {
            char *text;
            size_t len;
            int prefix = 0, whole = -1;
            if (iflow_tokenizer_continuation(tok, spec[i], (size_t)ns[i], 0, &text, &len) == 0) {
                whole = iflow_grammar_match(g, text, len, &prefix);
                free(text);
            }
            CHECK(prefix == 1 && (ns[i] == jobs[i].max_tokens || whole == 1),
                  "%s, a grammar: request %d's text (%d tokens) is not of the grammar", what, i, ns[i]);
        }
        if (getenv("SPEC_SHOW"))
            fprintf(stderr, "  %s, a grammar: %llu proposed, %llu accepted\n", what, (unsigned long long)st.drafted,
                    (unsigned long long)st.accepted);
    }
    iflow_grammar_close(g);
}

/* shifts: also shift_case() */
static void engine_case(const char *target, const char *draft_path, const char *what, int shifts)
{
    iflow_model *m, *d;
    if (iflow_model_open(&m, target, 0) < 0 || iflow_model_open(&d, draft_path, 0) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return;
    }
    const iflow_hparams *hp = iflow_model_hparams(m);
    enum { NJ = 6 };
    job jobs[NJ];
    for (int i = 0; i < NJ; i++) {
        jobs[i] = (job){.n_prompt = 3 + i % 4, .max_tokens = 20 + 13 * i, .temp = i < 4 ? 0 : 0.9f, .seed = 100 + i};
        jobs[i].prompt[0] = hp->bos;
        for (int j = 1; j < jobs[i].n_prompt; j++)
            jobs[i].prompt[j] = (int32_t)(rnd_u32() % (uint32_t)(hp->vocab_size - 3)) + 3;
    }
    jobs[1].stop = "e"; /* a stop string hit at some point of a run of accepted proposals */
    static int32_t plain[NJ][96], spec[NJ][96], alone[NJ][96];
    int np[NJ], ns[NJ], na[NJ];
    iflow_batch_stats st;
    for (int n_draft = 1; n_draft <= 7; n_draft += 3) {
        if (run_jobs(m, NULL, 0, jobs, 4, 4, 128, plain[0], 96, np, NULL) < 0 ||
            run_jobs(m, d, n_draft, jobs, 4, 4, 128, spec[0], 96, ns, &st) < 0)
            break;
        for (int i = 0; i < 4; i++)
            CHECK(np[i] == ns[i] && memcmp(plain[i], spec[i], sizeof(int32_t) * (size_t)np[i]) == 0,
                  "%s, %d draft tokens: greedy request %d differs with the draft (%d vs %d tokens)", what, n_draft, i,
                  ns[i], np[i]);
        CHECK(st.drafted > 0 && st.accepted > 0, "%s: %llu proposed, %llu accepted", what,
              (unsigned long long)st.drafted, (unsigned long long)st.accepted);
        if (getenv("SPEC_SHOW"))
            fprintf(stderr, "  %s, %d a step: %llu proposed, %llu accepted, %llu steps for %llu tokens\n", what, n_draft,
                    (unsigned long long)st.drafted, (unsigned long long)st.accepted, (unsigned long long)st.steps,
                    (unsigned long long)st.generated);
    }
    /* seeded sampled requests with the draft: alone and among the others, the same tokens */
    run_jobs(m, d, 4, jobs, NJ, 3, 128, spec[0], 96, ns, NULL);
    for (int i = 4; i < NJ; i++) {
        run_jobs(m, d, 4, jobs + i, 1, 1, 128, alone[i], 96, na + i, NULL);
        CHECK(na[i] == ns[i] && memcmp(alone[i], spec[i], sizeof(int32_t) * (size_t)na[i]) == 0,
              "%s: sampled request %d alone and in a batch differ with the draft", what, i);
    }
    if (shifts)
        shift_case(m, d, what);
    prefix_case(m, d, what);
    grammar_case(m, d, what);
    iflow_model_close(d);
    iflow_model_close(m);
}

static void test_engine(void)
{
    engine_case(s260, s260q4, "stories260K with its q4", 0);
    engine_case(s260, s260q2, "stories260K with its q2", 1);
    engine_case(xs, xsq2, "xs-ckpt with its q2", 1);
    engine_case(xs, s260, "xs-ckpt with stories260K (another model of the same tokenizer)", 0);
    /* a draft that holds fewer positions than the context (xs-ckpt: 256) */
    iflow_model *m, *d;
    if (iflow_model_open(&m, s260, 0) < 0 || iflow_model_open(&d, xs, 0) < 0)
        return;
    iflow_batch *b;
    iflow_batch_params p = {.parallel = 2, .n_ctx = 512};
    CHECK(iflow_batch_open(&b, m, &p) == 0, "open: %s", iflow_errmsg());
    CHECK_ERR(iflow_batch_set_draft(b, d, 4, 0, 0), IFLOW_ERANGE, "draft model holds 256 positions", "context is 512");
    CHECK_ERR(iflow_batch_set_draft(b, m, 17, 0, 0), IFLOW_EINVAL, "17 draft tokens", "from 1 to 16");
    iflow_batch_close(b);
    iflow_model_close(d);
    iflow_model_close(m);
}

static int quantize(const char *in, const char *out, int type)
{
    iflow_quant_policy qp;
    int rc = iflow_quant_policy_init(&qp, type);
    if (rc == 0)
        rc = iflow_quantize_shard(in, out, &qp, 0, NULL);
    CHECK(rc == 0, "quantize %s: %s", in, iflow_errmsg());
    iflow_quant_policy_free(&qp);
    return rc;
}

int main(void)
{
    RUN(test_rule);
    RUN(test_dist);
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(s260, sizeof s260, "%s/s.ifs", dir);
    snprintf(s260q4, sizeof s260q4, "%s/s.q4.ifs", dir);
    snprintf(s260q2, sizeof s260q2, "%s/s.q2.ifs", dir);
    snprintf(xs, sizeof xs, "%s/xs.ifs", dir);
    snprintf(xsq2, sizeof xsq2, "%s/xs.q2.ifs", dir);
    if (test_convert("models/stories260K/hf", s260, -1) != 0 || test_convert("models/xs-ckpt/hf", xs, -1) != 0) {
        fprintf(stderr, "test data missing or conversion failed\n");
        return check_summary("test_speculative") | 1;
    }
    if (quantize(s260, s260q4, IFLOW_DT_Q4_B32) == 0 && quantize(s260, s260q2, IFLOW_DT_Q2_B32) == 0 &&
        quantize(xs, xsq2, IFLOW_DT_Q2_B32) == 0)
        RUN(test_engine);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_speculative");
}
