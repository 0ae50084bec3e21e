/*
 * test_lora.c -- LoRA adapters (libcore/formats/lora.h).
 *
 *   - PEFT's form from memory: adapters built here (a safetensors file in a buffer, a config);
 *     the deltas found by target, their shapes, and s = lora_alpha / r, lora_alpha / sqrt(r)
 *     with use_rslora, PEFT's default alpha 8, times the caller's scale; the ".default" names;
 *     F16 and BF16 values read exactly;
 *   - iflow_lora_add() against the sum written out by hand in double, on a row range;
 *   - what is refused, by name: an A without its B, two A's of one target, ranks that differ,
 *     a rank other than the config's r, fan_in_fan_out, use_dora, rank_pattern, modules_to_save,
 *     embedding adapters, DoRA magnitudes, tensors that are no LoRA matrix, integer tensors, a
 *     vector, no tensors, another peft_type;
 *   - llama.cpp's GGUF form: tests/fixtures/lora/smollm2-q-v-down.gguf (gen_lora_refs.py) read
 *     from the file (24 deltas, GGUF names, s = alpha / r = 2, shapes of SmolLM2's matrices), and
 *     a model file refused as no adapter;
 *   - adapters per sequence (iflow_model_add_adapter) on stories260K (converted here) with its two
 *     fixture adapters: a step of five sequences asking for adapters 1, none, 1, 2, 2 (adapter 1's
 *     rows gathered, adapter 2's one run) gives each the logits, bit for bit, of its sequence
 *     alone in a model with that adapter applied to every sequence (iflow_model_add_lora) or in
 *     the base model (the rows of a step are independent: batch invariance); a batch of requests
 *     sharing one long prompt, each asking for an adapter or none, gives each the greedy tokens
 *     of its request alone in that model (so the prefix cache gave no request another adapter's
 *     keys and values), with the prefix cache on, and shares blocks among the requests of one
 *     adapter; adapter numbers out of range and an adapter of another model refused, the model
 *     unchanged.
 */
#include "tests/unit/testlib.h"
#include "libcore/base/error.h"
#include "libcore/formats/lora.h"
#include "libcore/serving/batch.h"

/* ---- a PEFT adapter in memory -------------------------------------------------------------- */

typedef struct {
    const char *name, *dtype;
    int n_dims;
    int64_t shape[3];
    const void *data;
    size_t nbytes;
} st_entry;

/* A safetensors file of the entries, in *buf (free it). */
static size_t make_st(const st_entry *e, int n, unsigned char **buf)
{
    char header[4096];
    size_t h = 0, off = 0;
    h += (size_t)snprintf(header + h, sizeof header - h, "{");
    for (int i = 0; i < n; i++) {
        h += (size_t)snprintf(header + h, sizeof header - h, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
                              e[i].name, e[i].dtype);
        for (int d = 0; d < e[i].n_dims; d++)
            h += (size_t)snprintf(header + h, sizeof header - h, "%s%lld", d ? "," : "", (long long)e[i].shape[d]);
        h += (size_t)snprintf(header + h, sizeof header - h, "],\"data_offsets\":[%zu,%zu]}", off, off + e[i].nbytes);
        off += e[i].nbytes;
    }
    h += (size_t)snprintf(header + h, sizeof header - h, "}");
    while (h % 8)
        header[h++] = ' ';
    *buf = malloc(8 + h + off);
    uint64_t hl = h;
    memcpy(*buf, &hl, 8);
    memcpy(*buf + 8, header, h);
    off = 8 + h;
    for (int i = 0; i < n; i++) {
        memcpy(*buf + off, e[i].data, e[i].nbytes);
        off += e[i].nbytes;
    }
    return off;
}

static int open_peft(iflow_lora **l, const char *config, const st_entry *e, int n, double scale,
                     unsigned char **buf)
{
    size_t len = make_st(e, n, buf);
    return iflow_lora_open_peft_mem(l, config, strlen(config), *buf, len, "mem-adapter", scale);
}

/* A [2][3] and B [4][2] of "model.layers.0.self_attn.q_proj.weight", and A [2][4], B [3][2] of
 * "...mlp.down_proj.weight" (F16 and BF16). */
static const float QA[6] = {1, 2, 3, -1, 0.5f, 0.25f}, QB[8] = {1, 0, 0, 1, 2, -1, 0.5f, 0.5f};
static const uint16_t DA_F16[8] = {0x3c00, 0x4000, 0xbc00, 0x3800, 0, 0x3c00, 0x3c00, 0x4200}; /* 1 2 -1 .5 0 1 1 3 */
static const uint16_t DB_BF16[6] = {0x3f80, 0x4000, 0xbf80, 0, 0x3f00, 0x3f80};                /* 1 2 -1 0 .5 1 */

#define Q_A {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "F32", 2, {2, 3}, QA, sizeof QA}
#define Q_B {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", "F32", 2, {4, 2}, QB, sizeof QB}
#define D_A {"base_model.model.model.layers.0.mlp.down_proj.lora_A.default.weight", "F16", 2, {2, 4}, DA_F16, 16}
#define D_B {"base_model.model.model.layers.0.mlp.down_proj.lora_B.default.weight", "BF16", 2, {3, 2}, DB_BF16, 12}

static void test_peft(void)
{
    const st_entry e[] = {Q_A, Q_B, D_A, D_B};
    unsigned char *buf;
    iflow_lora *l = NULL;
    int rc = open_peft(&l, "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 16}", e, 4, 0.5, &buf);
    CHECK(rc == 0 && l, "open: %s", iflow_errmsg());
    if (l) {
        CHECK(iflow_lora_naming(l) == IFLOW_LORA_HF && iflow_lora_n_deltas(l) == 2, "two deltas, HF names");
        const iflow_lora_delta *q = iflow_lora_find(l, "model.layers.0.self_attn.q_proj.weight"),
                               *d = iflow_lora_find(l, "model.layers.0.mlp.down_proj.weight");
        CHECK(q && q->rank == 2 && q->in == 3 && q->out == 4, "q_proj: rank 2, [4][3]");
        CHECK(q && fabs(q->scale - 4.0) < 1e-12, "s = 16 / 2, times 0.5: %g", q ? q->scale : 0);
        CHECK(d && d->rank == 2 && d->in == 4 && d->out == 3, "down_proj (.default names): rank 2, [3][4]");
        static const float da[8] = {1, 2, -1, 0.5f, 0, 1, 1, 3}, db[6] = {1, 2, -1, 0, 0.5f, 1};
        CHECK(d && memcmp(d->a, da, sizeof da) == 0 && memcmp(d->b, db, sizeof db) == 0, "F16 and BF16 read exactly");
        CHECK(!iflow_lora_find(l, "model.layers.0.self_attn.k_proj.weight"), "no delta for k_proj");
        CHECK(iflow_lora_delta_at(l, 2) == NULL, "nothing past the end");
        /* w [2][3] = rows 1..2 of W, zero: rows 1, 2 of s B A */
        float w[6] = {0}, want[6];
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < 3; k++)
                want[i * 3 + k] =
                    (float)(4.0 * ((double)QB[(1 + i) * 2] * QA[k] + (double)QB[(1 + i) * 2 + 1] * QA[3 + k]));
        w[0] = 1;
        want[0] += 1;
        iflow_lora_add(q, w, 1, 2);
        CHECK(memcmp(w, want, sizeof w) == 0, "rows 1..2 of W + s B A: %g %g %g / %g %g %g", w[0], w[1], w[2], w[3],
              w[4], w[5]);
    }
    iflow_lora_close(l);
    free(buf);

    /* rslora: alpha / sqrt(r); no alpha: PEFT's default 8 */
    rc = open_peft(&l, "{\"lora_alpha\": 2, \"use_rslora\": true}", e, 2, 1, &buf);
    CHECK(rc == 0 && fabs(iflow_lora_delta_at(l, 0)->scale - 2 / sqrt(2.0)) < 1e-12, "rslora: %s", iflow_errmsg());
    iflow_lora_close(l);
    free(buf);
    rc = open_peft(&l, "{}", e, 2, 1, &buf);
    CHECK(rc == 0 && fabs(iflow_lora_delta_at(l, 0)->scale - 4.0) < 1e-12, "default alpha 8: %s", iflow_errmsg());
    iflow_lora_close(l);
    free(buf);
}

static void test_peft_refused(void)
{
    static const int32_t ints[8] = {0};
    static const float v[4] = {0};
    const st_entry qa = Q_A, qb = Q_B, da = D_A, db = D_B;
    st_entry qa_default = qa, qb_rank3 = qb, qa_int = qa, qa_vec = qa, emb = qa, mag = qa, bias = qb, whole = qa;
    qa_default.name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight";
    qb_rank3.shape[0] = 2, qb_rank3.shape[1] = 4; /* B [2][4]: rank 4 against A's 2 */
    qa_int.dtype = "I32", qa_int.data = ints, qa_int.nbytes = 24;
    qa_vec.n_dims = 1, qa_vec.shape[0] = 4, qa_vec.data = v, qa_vec.nbytes = 16;
    emb.name = "base_model.model.model.embed_tokens.lora_embedding_A";
    mag.name = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector";
    bias.name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias";
    whole.name = "base_model.model.lm_head.weight";
    const struct {
        const char *config;
        st_entry e[3];
        int n;
        int rc;
        const char *msg;
    } bad[] = {
        {"{}", {qa}, 1, IFLOW_EFORMAT, "'model.layers.0.self_attn.q_proj.weight' has an A and no B"},
        {"{}", {qb, da, db}, 3, IFLOW_EFORMAT, "'model.layers.0.self_attn.q_proj.weight' has a B and no A"},
        {"{}", {qa, qa_default, qb}, 3, IFLOW_EFORMAT, "has two of the same half"},
        {"{}", {qa, qb_rank3}, 2, IFLOW_EFORMAT, "the rank (A's rows, B's columns) must agree"},
        {"{\"r\": 8}", {qa, qb}, 2, IFLOW_EFORMAT, "has rank 2, the config's r is 8"},
        {"{\"fan_in_fan_out\": true}", {qa, qb}, 2, IFLOW_EUNSUPPORTED, "fan_in_fan_out is true"},
        {"{\"use_dora\": true}", {qa, qb}, 2, IFLOW_EUNSUPPORTED, "use_dora is true"},
        {"{\"rank_pattern\": {\"q_proj\": 4}}", {qa, qb}, 2, IFLOW_EUNSUPPORTED, "rank_pattern"},
        {"{\"modules_to_save\": [\"lm_head\"]}", {qa, qb}, 2, IFLOW_EUNSUPPORTED, "modules_to_save"},
        {"{\"peft_type\": \"IA3\"}", {qa, qb}, 2, IFLOW_EUNSUPPORTED, "peft_type is 'IA3'"},
        {"{}", {emb}, 1, IFLOW_EUNSUPPORTED, "adapts an embedding"},
        {"{}", {mag, qa, qb}, 3, IFLOW_EUNSUPPORTED, "DoRA's magnitude"},
        {"{}", {qa, bias}, 2, IFLOW_EUNSUPPORTED, "is not a LoRA matrix"},
        {"{}", {whole}, 1, IFLOW_EUNSUPPORTED, "'base_model.model.lm_head.weight' is not a LoRA matrix"},
        {"{}", {qa_int, qb}, 2, IFLOW_EUNSUPPORTED, "is I32: F32, F16 or BF16 is needed"},
        {"{}", {qa_vec, qb}, 2, IFLOW_EFORMAT, "must be matrices"},
        {"{}", {{0}}, 0, IFLOW_EFORMAT, "holds no tensors"},
        {"[]", {qa, qb}, 2, IFLOW_EFORMAT, "adapter_config.json is not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unsigned char *buf;
        iflow_lora *l = (iflow_lora *)&buf;
        int rc = open_peft(&l, bad[i].config, bad[i].e, bad[i].n, 1, &buf);
        CHECK_ERR(rc, bad[i].rc, "mem-adapter", bad[i].msg);
        CHECK(l == NULL, "refused %zu: no handle", i);
        free(buf);
    }
}

/* ---- llama.cpp's GGUF form ----------------------------------------------------------------- */

static void test_gguf(void)
{
    iflow_lora *l = NULL;
    const char *path = "tests/fixtures/lora/smollm2-q-v-down.gguf";
    int rc = iflow_lora_open(&l, path, 1);
    CHECK(rc == 0 && l, "open %s: %s", path, iflow_errmsg());
    if (l) {
        CHECK(iflow_lora_naming(l) == IFLOW_LORA_GGUF && iflow_lora_n_deltas(l) == 12, "12 deltas, GGUF names: %zu",
              iflow_lora_n_deltas(l));
        const iflow_lora_delta *q = iflow_lora_find(l, "blk.0.attn_q.weight"),
                               *v = iflow_lora_find(l, "blk.29.attn_v.weight"),
                               *d = iflow_lora_find(l, "blk.10.ffn_down.weight");
        CHECK(q && q->rank == 2 && q->in == 576 && q->out == 576 && q->scale == 2.0, "attn_q: [576][576], r 2, s 4/2");
        CHECK(v && v->in == 576 && v->out == 192, "attn_v: [192][576]");
        CHECK(d && d->in == 1536 && d->out == 576, "ffn_down: [576][1536]");
        CHECK(!iflow_lora_find(l, "blk.1.attn_q.weight"), "layer 1 is not adapted");
    }
    iflow_lora_close(l);
    char model[4096];
    const char *data = getenv("IFLOW_TEST_DATA");
    snprintf(model, sizeof model, "%s/models/stories260K/gguf/stories260K.gguf", data && *data ? data : "../shared");
    if (access(model, R_OK) != 0) {
        check_skipped_++;
        return;
    }
    l = NULL;
    CHECK_ERR(iflow_lora_open(&l, model, 1), IFLOW_EFORMAT, "stories260K.gguf", "is not a LoRA adapter");
    CHECK(!l, "a model is no adapter");
    CHECK_ERR(iflow_lora_open(&l, "/nonexistent/adapter", 1), IFLOW_ENOTFOUND, "/nonexistent/adapter",
              "cannot open LoRA adapter");
    CHECK_ERR(iflow_lora_open(&l, "tests/fixtures/lora", 1), IFLOW_ENOTFOUND, "tests/fixtures/lora",
              "no adapter_config.json");
}

/* ---- adapters per sequence ------------------------------------------------------------------ */

static char dir[] = "/tmp/iflow-test-lora-XXXXXX";
static char s260[512];
static const char *const SPECS[] = {"specs"};
static const char *const ADAPTERS[2] = {"tests/fixtures/lora/stories260K-peft",
                                        "tests/fixtures/lora/stories260K-q-k-up.gguf"};

/* stories260K with adapters[k] applied to every sequence (k < 0: none), or, with per_seq, both
 * added as adapters 1 and 2. NULL after a failed check. */
static iflow_model *open_with(int k, int per_seq)
{
    iflow_model *m = NULL;
    if (iflow_model_open(&m, s260, 0) < 0) {
        CHECK(0, "open: %s", iflow_errmsg());
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        if (!per_seq && i != k)
            continue;
        iflow_lora *l = NULL;
        int rc = iflow_lora_open(&l, ADAPTERS[i], 1);
        if (rc == 0)
            rc = per_seq ? iflow_model_add_adapter(m, l, SPECS, 1) : iflow_model_add_lora(m, l, SPECS, 1);
        iflow_lora_close(l);
        CHECK(rc == (per_seq ? i + 1 : 0), "adapter %s: %d %s", ADAPTERS[i], rc, rc < 0 ? iflow_errmsg() : "");
    }
    return m;
}

/* The logits after each of ids[0..n) (V each) of one sequence alone in m. */
static void alone(iflow_model *m, const int32_t *ids, int n, float *out)
{
    iflow_ctx *c;
    iflow_kv *kv;
    const int32_t table[1] = {0};
    CHECK(iflow_ctx_open_steps(&c, m, 2) == 0 && iflow_kv_open(&kv, m, IFK_KV_F32, 64, 1) == 0, "%s", iflow_errmsg());
    iflow_step_seq q = {.ids = ids, .n = n, .table = table, .logits = out, .n_out = n};
    CHECK(iflow_ctx_step(c, kv, &q, 1) == 0, "alone: %s", iflow_errmsg());
    iflow_kv_close(kv);
    iflow_ctx_close(c);
}

static void test_adapter_steps(void)
{
    iflow_model *base = open_with(-1, 0), *each[2] = {open_with(0, 0), open_with(1, 0)}, *m = open_with(0, 1);
    if (!base || !each[0] || !each[1] || !m)
        return;
    /* adapter 1's sequences apart (their rows gathered), adapter 2's one run of two */
    enum { S = 5 };
    const int V = iflow_model_hparams(m)->vocab_size, N[S] = {9, 5, 12, 1, 3};
    const int adapter[S] = {1, 0, 1, 2, 2};
    int32_t ids[S][12];
    for (int i = 0; i < S; i++)
        for (int t = 0; t < N[i]; t++)
            ids[i][t] = t == 0 ? 1 : (int32_t)((7 * t + 31 * i) % (V - 3)) + 3;
    float *got = malloc(sizeof(float) * S * 12 * (size_t)V), *want = malloc(sizeof(float) * 12 * (size_t)V);
    iflow_ctx *c;
    iflow_kv *kv;
    CHECK(iflow_ctx_open_steps(&c, m, 2) == 0 && iflow_kv_open(&kv, m, IFK_KV_F32, 16, S) == 0, "%s", iflow_errmsg());
    int32_t tables[S][1] = {{0}, {1}, {2}, {3}, {4}};
    iflow_step_seq q[S];
    for (int i = 0; i < S; i++)
        q[i] = (iflow_step_seq){.ids = ids[i], .n = N[i], .table = tables[i], .logits = got + (size_t)i * 12 * V,
                                .n_out = N[i], .adapter = adapter[i]};
    CHECK(iflow_ctx_step(c, kv, q, S) == 0, "step: %s", iflow_errmsg());
    for (int i = 0; i < S; i++) {
        alone(adapter[i] ? each[adapter[i] - 1] : base, ids[i], N[i], want);
        CHECK(!memcmp(got + (size_t)i * 12 * V, want, sizeof(float) * (size_t)N[i] * V),
              "sequence %d (adapter %d): the logits of its sequence alone, bit for bit", i, adapter[i]);
    }
    /* and each adapter does change the logits */
    alone(base, ids[0], N[0], want);
    CHECK(memcmp(got, want, sizeof(float) * (size_t)N[0] * V) != 0, "adapter 1 changes the logits");
    q[1].adapter = 3;
    CHECK_ERR(iflow_ctx_step(c, kv, q, S), IFLOW_EINVAL, "sequence 1", "adapter 3 of the model's 2");
    /* an adapter of another model: refused, nothing added */
    iflow_lora *l = NULL;
    CHECK(iflow_lora_open(&l, "tests/fixtures/lora/smollm2-q-v-down.gguf", 1) == 0, "%s", iflow_errmsg());
    CHECK_ERR(iflow_model_add_adapter(m, l, SPECS, 1), IFLOW_ESHAPE, "smollm2-q-v-down.gguf", "[576, 576]");
    CHECK(iflow_model_n_adapters(m) == 2, "still two adapters");
    iflow_lora_close(l);
    iflow_kv_close(kv);
    iflow_ctx_close(c);
    free(got);
    free(want);
    iflow_model_close(base);
    iflow_model_close(each[0]);
    iflow_model_close(each[1]);
    iflow_model_close(m);
}

/* Greedy tokens of requests r[0..n) in one batch over m (block positions per KV block), into
 * out[i] (zeros after the last); the batch's stats into st. */
static void run_batch(iflow_model *m, iflow_request *r, int n, int32_t out[][24], int block, iflow_batch_stats *st)
{
    iflow_batch_params p = {.n_ctx = 128, .parallel = n, .block = block, .n_threads = 2, .step_tokens = 32};
    iflow_batch *b;
    if (iflow_batch_open(&b, m, &p) < 0) {
        CHECK(0, "batch: %s", iflow_errmsg());
        return;
    }
    for (int i = 0; i < n; i++) {
        r[i].user = (void *)(intptr_t)i;
        CHECK(iflow_batch_add(b, &r[i]) == 0, "add %d: %s", i, iflow_errmsg());
    }
    int rc;
    while ((rc = iflow_batch_step(b)) > 0) {
    }
    CHECK(rc == 0, "step: %s", iflow_errmsg());
    iflow_result *res;
    while (iflow_batch_take(b, &res)) {
        int i = (int)(intptr_t)res->user;
        memset(out[i], 0, sizeof out[i]);
        memcpy(out[i], res->tokens, sizeof(int32_t) * (size_t)res->n_tokens);
        iflow_result_free(res);
    }
    iflow_batch_get_stats(b, st);
    iflow_batch_close(b);
}

static void test_adapter_batch(void)
{
    iflow_model *base = open_with(-1, 0), *each[2] = {open_with(0, 0), open_with(1, 0)}, *m = open_with(0, 1);
    if (!base || !each[0] || !each[1] || !m)
        return;
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    const char *text = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.";
    int32_t *ids;
    size_t n;
    CHECK(iflow_tokenizer_encode(tok, text, strlen(text), IFLOW_TOK_ADD_BOS, &ids, &n) == 0 && n > 20, "encode");
    /* five requests of one prompt: adapters 1, 0, 2, 1, 0 (the cache shares among the same adapter) */
    enum { R = 5 };
    const int adapter[R] = {1, 0, 2, 1, 0};
    iflow_request r[R];
    for (int i = 0; i < R; i++)
        r[i] = (iflow_request){.prompt = ids, .n_prompt = (int)n, .max_tokens = 24, .adapter = adapter[i]};
    int32_t got[R][24], want[1][24];
    iflow_batch_stats st;
    run_batch(m, r, R, got, 8, &st);
    CHECK(st.prompt_cached == 2 * (uint64_t)((n - 1) / 8) * 8, "the 2nd request of adapter 1 and of none share "
          "the first's blocks: %llu positions from the cache", (unsigned long long)st.prompt_cached);
    for (int i = 0; i < R; i++) {
        iflow_request one = r[i];
        one.adapter = 0;
        run_batch(adapter[i] ? each[adapter[i] - 1] : base, &one, 1, want, 8, &st);
        CHECK(!memcmp(got[i], want[0], sizeof want[0]), "request %d (adapter %d): the tokens alone", i, adapter[i]);
    }
    CHECK(memcmp(got[0], got[1], sizeof got[0]) && memcmp(got[2], got[1], sizeof got[0]),
          "the adapters change the reply");
    iflow_request bad = r[0];
    bad.adapter = 3;
    iflow_batch_params p = {.n_ctx = 128};
    iflow_batch *b;
    CHECK(iflow_batch_open(&b, m, &p) == 0, "%s", iflow_errmsg());
    CHECK_ERR(iflow_batch_add(b, &bad), IFLOW_EINVAL, "adapter 3", "the model has 2");
    iflow_batch_close(b);
    free(ids);
    iflow_model_close(base);
    iflow_model_close(each[0]);
    iflow_model_close(each[1]);
    iflow_model_close(m);
}

int main(void)
{
    RUN(test_peft);
    RUN(test_peft_refused);
    RUN(test_gguf);
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(s260, sizeof s260, "%s/s.ifs", dir);
    if (test_convert("models/stories260K/hf", s260, -1) != 0) {
        fprintf(stderr, "test data missing or conversion failed\n");
        return check_summary("test_lora") | 1;
    }
    RUN(test_adapter_steps);
    RUN(test_adapter_batch);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_lora");
}
