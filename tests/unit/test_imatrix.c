/*
 * test_imatrix.c -- importance matrices (libcore/formats/imatrix.h, libcore/engine/observe.h):
 *   - the file round-trips exactly (names, columns, counts, every value's bits, n_tokens);
 *   - bad files are refused with the entry or byte named: bad magic, every truncation of a
 *     good file, a bad name, K = 0, a NaN or negative value, a duplicate, junk after the end;
 *   - against a model: an entry the model lacks, a wrong column count, a missing matrix are
 *     refused naming the tensor; the right one passes;
 *   - the collector, fed activations directly, gives per column mean(x^2) over the rows (an
 *     independent double sum here, tolerance 1e-6 relative), count = rows, split columns (col0)
 *     land in place, tied models name the output tok_embd, and a call outside the model is
 *     reported; the hook calls only the observer of its own context; a mixture's experts get
 *     entries of their own counted over the rows routed to them, none for an expert no row chose;
 *   - iflow_quantize_shard with an imatrix: the importance-weighted error (sum over columns of
 *     mean_sq (w - w')^2) is lower than without it, every tensor; another model's imatrix is
 *     refused before anything is written, naming the tensor.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/quant.h"
#include "libcore/base/dtype.h"
#include "libcore/engine/observe.h"
#include "libcore/formats/imatrix.h"
#include "libcore/formats/quant.h"
#include "libcore/formats/shard.h"
#include "tests/unit/testlib.h"

static char dir[] = "/tmp/iflow-test-imatrix-XXXXXX";

static const char *path_of(const char *name)
{
    static char buf[4][320];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
    return buf[i];
}

static iflow_imatrix *sample(void)
{
    iflow_imatrix *im;
    float v[172];
    iflow_imatrix_new(&im);
    im->n_tokens = 12345;
    for (int k = 0; k < 172; k++)
        v[k] = (float)(rnd_unit() * 3.0);
    v[0] = 0.0f;
    v[1] = 1e-30f;
    iflow_imatrix_add(im, "blk.0.wq", 64, 100, v);
    iflow_imatrix_add(im, "blk.0.ffn_down", 172, 99, v);
    iflow_imatrix_add(im, "output", 64, 7, v + 5);
    return im;
}

static void test_roundtrip(void)
{
    iflow_imatrix *im = sample(), *back = NULL;
    const char *p = path_of("a.imatrix");
    CHECK(iflow_imatrix_save(im, p) == 0, "save: %s", iflow_errmsg());
    CHECK(iflow_imatrix_load(&back, p) == 0, "load: %s", iflow_errmsg());
    if (back) {
        CHECK(back->n == im->n && back->n_tokens == 12345, "n %zu tokens %llu", back->n, (unsigned long long)back->n_tokens);
        for (size_t i = 0; i < im->n && i < back->n; i++)
            CHECK(strcmp(back->e[i].name, im->e[i].name) == 0 && back->e[i].K == im->e[i].K &&
                      back->e[i].count == im->e[i].count &&
                      memcmp(back->e[i].mean_sq, im->e[i].mean_sq, (size_t)im->e[i].K * 4) == 0,
                  "entry %zu differs", i);
        CHECK(iflow_imatrix_find(back, "blk.0.ffn_down") == &back->e[1] && !iflow_imatrix_find(back, "blk.0.wk"), "find");
    }
    CHECK(iflow_imatrix_add(im, "output", 64, 1, im->e[0].mean_sq) == IFLOW_EINVAL, "duplicate add refused");
    CHECK(iflow_imatrix_add(im, "x", 0, 1, im->e[0].mean_sq) == IFLOW_EINVAL, "K = 0 refused");
    iflow_imatrix_free(back);
    iflow_imatrix_free(im);
}

/* Parse a modified copy of a good file: want rc and text in the message. */
static void expect_bad(const uint8_t *buf, size_t n, int want, const char *text, const char *what)
{
    iflow_imatrix *im = (iflow_imatrix *)1;
    int rc = iflow_imatrix_parse(&im, buf, n, "f.imatrix");
    CHECK(im == NULL, "%s: no result on failure", what);
    CHECK_ERR(rc, want, "f.imatrix", text);
}

static void test_bad_files(void)
{
    iflow_imatrix *im = sample();
    const char *p = path_of("b.imatrix");
    iflow_imatrix_save(im, p);
    iflow_imatrix_free(im);
    size_t n;
    uint8_t *good = (uint8_t *)test_read_file(p, &n), *b = malloc(n + 16);
    if (!good)
        return;
    /* every truncation */
    for (size_t cut = 0; cut < n; cut++) {
        iflow_imatrix *t = NULL;
        int rc = iflow_imatrix_parse(&t, good, cut, "f.imatrix");
        CHECK(rc == (cut < 8 ? IFLOW_EFORMAT : IFLOW_ETRUNC), "cut at %zu: rc %d (%s)", cut, rc, iflow_errmsg());
        iflow_imatrix_free(t);
    }
    expect_bad(good, 150, IFLOW_ETRUNC, "entry 'blk.0.wq' at byte 46 needs 256 bytes for its 64 values", "a cut inside values");
    memcpy(b, good, n);
    b[0] = 'X';
    expect_bad(b, n, IFLOW_EFORMAT, "not an iflow imatrix (bad magic at byte 0)", "magic");
    memcpy(b, good, n);
    b[26] = ' '; /* first byte of the first name */
    expect_bad(b, n, IFLOW_EFORMAT, "entry 0's name at byte 26", "a blank in a name");
    memcpy(b, good, n);
    memset(b + 34, 0, 4); /* K of blk.0.wq */
    expect_bad(b, n, IFLOW_EFORMAT, "entry 'blk.0.wq' has 0 columns", "K = 0");
    memcpy(b, good, n);
    float nan = NAN, neg = -1.0f;
    memcpy(b + 46 + 4 * 3, &nan, 4);
    expect_bad(b, n, IFLOW_EFORMAT, "entry 'blk.0.wq' column 3 is nan", "NaN");
    memcpy(b, good, n);
    memcpy(b + 46 + 4 * 63, &neg, 4);
    expect_bad(b, n, IFLOW_EFORMAT, "entry 'blk.0.wq' column 63 is -1", "negative");
    memcpy(b, good, n);
    memcpy(b + n, "x", 1);
    expect_bad(b, n + 1, IFLOW_EFORMAT, "1 bytes after the end marker", "junk after the end");
    memcpy(b, good, n);
    memcpy(b + n - 8, "IFIMEND?", 8);
    expect_bad(b, n, IFLOW_EFORMAT, "no end marker at byte", "end marker");
    iflow_imatrix *t = sample();
    free(t->e[2].name);
    t->e[2].name = strdup("blk.0.wq"); /* a duplicate, written as is */
    iflow_imatrix_save(t, path_of("dup.imatrix"));
    iflow_imatrix_free(t);
    CHECK_ERR(iflow_imatrix_load(&t, path_of("dup.imatrix")), IFLOW_EFORMAT, "dup.imatrix", "entry 'blk.0.wq' appears twice");
    CHECK_ERR(iflow_imatrix_load(&t, path_of("none")), IFLOW_ENOTFOUND, "none", "cannot open");
    free(good);
    free(b);
}

static void test_check_model(void)
{
    static const char *const names[] = {"tok_embd", "blk.0.wq", "blk.0.ffn_down", "output", "blk.0.attn_norm"};
    static const int64_t cols[] = {64, 64, 172, 64, 0};
    static const int mult[] = {0, 1, 1, 1, 0};
    iflow_imatrix *im = sample();
    CHECK(iflow_imatrix_check_model(im, names, cols, mult, 5, "i", "m") == 0, "fits: %s", iflow_errmsg());
    static const int64_t cols2[] = {64, 64, 192, 64, 0};
    CHECK_ERR(iflow_imatrix_check_model(im, names, cols2, mult, 5, "i", "m"), IFLOW_ESHAPE, "'blk.0.ffn_down'",
              "has 172 columns for tensor 'blk.0.ffn_down', model 'm' has 192");
    CHECK_ERR(iflow_imatrix_check_model(im, names, cols, mult, 3, "i", "m"), IFLOW_EINVAL, "'output'",
              "imatrix 'i' has tensor 'output', which is no matrix product of model 'm'");
    static const char *const names3[] = {"tok_embd", "blk.0.wq", "blk.0.ffn_down", "output", "blk.1.wq"};
    static const int64_t cols3[] = {64, 64, 172, 64, 64};
    static const int mult3[] = {0, 1, 1, 1, 1};
    CHECK_ERR(iflow_imatrix_check_model(im, names3, cols3, mult3, 5, "i", "m"), IFLOW_EINVAL, "'blk.1.wq'",
              "imatrix 'i' has no entry for tensor 'blk.1.wq' of model 'm'");
    iflow_imatrix_free(im);
}

/* A mixture of experts: each expert's input and hidden rows under its own names, counted over
 * the rows routed to it; an expert no row chose has no entry, and check_model lets it be. */
static void test_collector_experts(void)
{
    iflow_hparams hp = {.dim = 8, .n_layers = 1, .n_heads = 2, .head_dim = 4, .ffn_dim = 6, .n_experts = 3,
                        .n_experts_used = 1, .expert_ffn_dim = 5};
    iflow_imatrix_collector *c;
    CHECK(iflow_imatrix_collector_open(&c, &hp) == 0, "open");
    float x[4][8];
    double want[8] = {0};
    for (int t = 0; t < 4; t++)
        for (int k = 0; k < 8; k++)
            x[t][k] = (float)rnd_normal(), want[k] += t < 3 ? (double)x[t][k] * x[t][k] / 3 : 0;
    iflow_imatrix_collector_observe(c, 0, IFLOW_OBS_ATTN_IN, 0, &x[0][0], 8, 4, 8);
    iflow_imatrix_collector_observe(c, 0, IFLOW_OBS_EXPERT_IN(2), 0, &x[0][0], 8, 3, 8);  /* rows 0..2 chose 2 */
    iflow_imatrix_collector_observe(c, 0, IFLOW_OBS_EXPERT_MID(2), 0, &x[0][0], 8, 3, 5);
    iflow_imatrix_collector_observe(c, 0, IFLOW_OBS_EXPERT_IN(0), 0, &x[3][0], 8, 1, 8);  /* row 3 chose 0 */
    iflow_imatrix_collector_observe(c, 0, IFLOW_OBS_EXPERT_MID(0), 0, &x[3][0], 8, 1, 5);
    iflow_imatrix *im = NULL;
    CHECK(iflow_imatrix_collector_result(c, &im) == 0, "result: %s", iflow_errmsg());
    if (im) {
        const iflow_imatrix_entry *g = iflow_imatrix_find(im, "blk.0.ffn_gate.2"),
                                  *u = iflow_imatrix_find(im, "blk.0.ffn_up.2"),
                                  *d = iflow_imatrix_find(im, "blk.0.ffn_down.2");
        CHECK(g && u && d && g->K == 8 && u->K == 8 && d->K == 5 && g->count == 3 && d->count == 3,
              "expert 2's entries");
        for (int k = 0; g && k < 8; k++)
            CHECK(fabs(g->mean_sq[k] - want[k]) <= 1e-6 * want[k], "column %d: %g, want %g", k, g->mean_sq[k], want[k]);
        CHECK(iflow_imatrix_find(im, "blk.0.ffn_down.0") && iflow_imatrix_find(im, "blk.0.ffn_down.0")->count == 1,
              "expert 0: one row");
        CHECK(!iflow_imatrix_find(im, "blk.0.ffn_gate.1") && !iflow_imatrix_find(im, "blk.0.ffn_gate"),
              "no entry for expert 1 (no row) nor a dense FFN");
        static const char *const names[] = {"blk.0.ffn_gate.1", "blk.0.ffn_gate.2", "blk.0.ffn_up.2",
                                            "blk.0.ffn_down.2", "blk.0.ffn_gate.0", "blk.0.ffn_up.0",
                                            "blk.0.ffn_down.0", "blk.0.wq",         "blk.0.wk", "blk.0.wv"};
        static const int64_t cols[] = {8, 8, 8, 5, 8, 8, 5, 8, 8, 8};
        static const int optional[] = {2, 2, 2, 2, 2, 2, 2, 1, 1, 1}, required[] = {1, 2, 2, 2, 2, 2, 2, 1, 1, 1};
        CHECK(iflow_imatrix_check_model(im, names, cols, optional, 10, "i", "m") == 0, "an expert without rows: %s",
              iflow_errmsg());
        CHECK_ERR(iflow_imatrix_check_model(im, names, cols, required, 10, "i", "m"), IFLOW_EINVAL,
                  "'blk.0.ffn_gate.1'", "no entry for tensor");
    }
    iflow_imatrix_free(im);
    iflow_imatrix_collector_observe(c, 0, IFLOW_OBS_EXPERT_IN(3), 0, &x[0][0], 8, 1, 8); /* no expert 3 */
    CHECK_ERR(iflow_imatrix_collector_result(c, &im), IFLOW_EINVAL, "imatrix collector", "1 observations outside");
    iflow_imatrix_collector_close(c);
}

static void test_collector(void)
{
    iflow_hparams hp = {.dim = 8, .n_layers = 2, .n_heads = 2, .head_dim = 3, .ffn_dim = 10, .tie_embeddings = 1};
    iflow_imatrix_collector *c;
    CHECK(iflow_imatrix_collector_open(&c, &hp) == 0, "open");
    enum { T = 5 };
    float x[T][12];
    double want[10] = {0};
    for (int t = 0; t < T; t++)
        for (int k = 0; k < 12; k++)
            x[t][k] = (float)rnd_normal();
    /* FFN_MID of layer 1 in two column parts: 0..5 from x[.][0..5], 6..9 from x[.][6..9] */
    iflow_imatrix_collector_observe(c, 1, IFLOW_OBS_FFN_MID, 0, &x[0][0], 12, T, 6);
    iflow_imatrix_collector_observe(c, 1, IFLOW_OBS_FFN_MID, 6, &x[0][6], 12, T, 4);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < 10; k++)
            want[k] += (double)x[t][k] * x[t][k] / T;
    iflow_imatrix_collector_observe(c, 0, IFLOW_OBS_ATTN_IN, 0, &x[0][0], 12, T, 8);
    iflow_imatrix_collector_observe(c, 0, IFLOW_OBS_ATTN_IN, 0, &x[0][0], 12, 2, 8); /* 7 rows in all */
    iflow_imatrix_collector_observe(c, -1, IFLOW_OBS_OUTPUT_IN, 0, &x[0][0], 12, T, 8);
    iflow_imatrix *im = NULL;
    CHECK(iflow_imatrix_collector_result(c, &im) == 0, "result: %s", iflow_errmsg());
    if (im) {
        const iflow_imatrix_entry *e = iflow_imatrix_find(im, "blk.1.ffn_down");
        CHECK(e && e->K == 10 && e->count == T, "ffn_down entry");
        for (int k = 0; e && k < 10; k++)
            CHECK(fabs(e->mean_sq[k] - want[k]) <= 1e-6 * want[k], "column %d: %g, want %g", k, e->mean_sq[k], want[k]);
        const char *wqkv[] = {"blk.0.wq", "blk.0.wk", "blk.0.wv"};
        for (int i = 0; i < 3; i++) {
            e = iflow_imatrix_find(im, wqkv[i]);
            CHECK(e && e->K == 8 && e->count == 7, "%s: 7 rows", wqkv[i]);
        }
        CHECK(iflow_imatrix_find(im, "tok_embd") && !iflow_imatrix_find(im, "output"), "tied: the output is tok_embd");
        CHECK(!iflow_imatrix_find(im, "blk.0.wo") && im->n == 5, "only matrices that saw rows: %zu", im->n);
        CHECK(im->n_tokens == 7, "n_tokens %llu", (unsigned long long)im->n_tokens);
    }
    iflow_imatrix_free(im);
    iflow_imatrix_collector_observe(c, 2, IFLOW_OBS_ATTN_IN, 0, &x[0][0], 12, T, 8);  /* no layer 2 */
    iflow_imatrix_collector_observe(c, 0, IFLOW_OBS_FFN_MID, 8, &x[0][0], 12, T, 4);  /* past column 10 */
    CHECK_ERR(iflow_imatrix_collector_result(c, &im), IFLOW_EINVAL, "imatrix collector", "2 observations outside the model");
    iflow_imatrix_collector_close(c);

    /* the hook: only ctx's own observer, until it is removed */
    iflow_imatrix_collector *a, *b;
    iflow_imatrix_collector_open(&a, &hp);
    iflow_imatrix_collector_open(&b, &hp);
    const iflow_ctx *ca = (const iflow_ctx *)&a, *cb = (const iflow_ctx *)&b; /* any distinct addresses */
    iflow_observe(ca, 0, IFLOW_OBS_ATTN_IN, 0, &x[0][0], 12, T, 8);          /* none set: nothing */
    CHECK(iflow_ctx_set_observer(ca, iflow_imatrix_collector_observe, a) == 0, "set a");
    CHECK(iflow_ctx_set_observer(cb, iflow_imatrix_collector_observe, b) == 0, "set b");
    iflow_observe(ca, 0, IFLOW_OBS_ATTN_IN, 0, &x[0][0], 12, T, 8);
    iflow_observe(cb, 0, IFLOW_OBS_ATTN_IN, 0, &x[0][0], 12, 2, 8);
    iflow_ctx_set_observer(ca, NULL, NULL);
    iflow_observe(ca, 0, IFLOW_OBS_ATTN_IN, 0, &x[0][0], 12, T, 8);
    iflow_imatrix *ia = NULL, *ib = NULL;
    iflow_imatrix_collector_result(a, &ia);
    iflow_imatrix_collector_result(b, &ib);
    CHECK(ia && ib && ia->n_tokens == T && ib->n_tokens == 2, "each context feeds its own observer");
    iflow_ctx_set_observer(cb, NULL, NULL);
    iflow_imatrix_free(ia);
    iflow_imatrix_free(ib);
    iflow_imatrix_collector_close(a);
    iflow_imatrix_collector_close(b);
}

/* sum over a tensor of imp[k] (w - w')^2, w' decoded from the quantized shard q. */
static double weighted_err(const iflow_shard_rec *src, const iflow_shard_rec *q, const float *imp)
{
    int K = (int)src->shape[1];
    float *dq = malloc((size_t)K * sizeof *dq);
    size_t rb = ifk_qrow_bytes(q->dtype, K);
    double e = 0;
    for (int64_t n = 0; n < src->shape[0]; n++) {
        const float *w = (const float *)src->data + n * K;
        ifk_dequantize_row(dq, q->dtype, (const uint8_t *)q->data + n * rb, K);
        for (int k = 0; k < K; k++)
            e += imp[k] * ((double)w[k] - dq[k]) * ((double)w[k] - dq[k]);
    }
    free(dq);
    return e;
}

static void test_quantize_with_imatrix(void)
{
    const char *src = path_of("xs.ifs");
    if (test_convert("models/xs-ckpt/hf", src, IFLOW_DT_F32) == -1)
        SKIP("no xs-ckpt");
    iflow_shard *s = NULL;
    CHECK(iflow_shard_open(&s, src, 0) == 0, "open: %s", iflow_errmsg());
    if (!s)
        return;
    /* an importance matrix with strongly uneven columns, for every matrix product of xs-ckpt */
    iflow_imatrix *im;
    iflow_imatrix_new(&im);
    int tied = 1; /* no `output` tensor: the output product is tok_embd's */
    for (size_t i = 0; i < iflow_shard_n_records(s); i++)
        tied &= strcmp(iflow_shard_rec_at(s, i)->name, "output") != 0;
    for (size_t i = 0; i < iflow_shard_n_records(s); i++) {
        const iflow_shard_rec *r = iflow_shard_rec_at(s, i);
        if (r->kind != IFLOW_REC_TENSOR || r->n_dims != 2 || (!tied && strcmp(r->name, "tok_embd") == 0))
            continue;
        int K = (int)r->shape[1];
        float *v = malloc((size_t)K * sizeof *v);
        for (int k = 0; k < K; k++)
            v[k] = (float)exp(2.0 * rnd_normal());
        iflow_imatrix_add(im, r->name, K, 1000, v);
        free(v);
    }
    iflow_quant_policy p0, p1;
    iflow_quant_policy_init(&p0, IFLOW_DT_Q4_B64);
    iflow_quant_policy_init(&p1, IFLOW_DT_Q4_B64);
    p1.imatrix = im;
    p1.imatrix_name = "im";
    CHECK(iflow_quantize_shard(src, path_of("q0.ifs"), &p0, 0, NULL) == 0, "plain: %s", iflow_errmsg());
    CHECK(iflow_quantize_shard(src, path_of("q1.ifs"), &p1, 0, NULL) == 0, "imatrix: %s", iflow_errmsg());
    iflow_shard *q0 = NULL, *q1 = NULL;
    iflow_shard_open(&q0, path_of("q0.ifs"), 0);
    iflow_shard_open(&q1, path_of("q1.ifs"), 0);
    int n = 0;
    for (size_t i = 0; q0 && q1 && i < iflow_shard_n_records(s); i++) {
        const iflow_shard_rec *r = iflow_shard_rec_at(s, i);
        const iflow_imatrix_entry *e = iflow_imatrix_find(im, r->name);
        if (!e)
            continue;
        double e0 = weighted_err(r, iflow_shard_rec_at(q0, i), e->mean_sq), e1 = weighted_err(r, iflow_shard_rec_at(q1, i), e->mean_sq);
        CHECK(e1 < 0.9 * e0, "'%s': weighted error %.4g with the imatrix, %.4g without", r->name, e1, e0);
        n++;
    }
    CHECK(n == 36, "%d tensors compared", n); /* 5 layers x 7, and the output */
    iflow_shard_close(q0);
    iflow_shard_close(q1);

    /* another model's: refused before the output exists, naming the tensor */
    iflow_imatrix_entry *wo = (iflow_imatrix_entry *)iflow_imatrix_find(im, "blk.2.ffn_down");
    wo->K = 100;
    CHECK_ERR(iflow_quantize_shard(src, path_of("q2.ifs"), &p1, 0, NULL), IFLOW_ESHAPE, "'blk.2.ffn_down'",
              "imatrix 'im' has 100 columns for tensor 'blk.2.ffn_down', model");
    CHECK(access(path_of("q2.ifs"), F_OK) != 0, "nothing written");
    wo->K = 192;
    free(wo->name);
    wo->name = strdup("blk.7.ffn_down");
    CHECK_ERR(iflow_quantize_shard(src, path_of("q2.ifs"), &p1, 0, NULL), IFLOW_EINVAL, "'blk.7.ffn_down'",
              "which is no matrix product of model");
    iflow_quant_policy_free(&p0);
    iflow_quant_policy_free(&p1);
    iflow_imatrix_free(im);
    iflow_shard_close(s);
}

int main(void)
{
    if (!mkdtemp(dir))
        return 1;
    RUN(test_roundtrip);
    RUN(test_bad_files);
    RUN(test_check_model);
    RUN(test_collector);
    RUN(test_collector_experts);
    RUN(test_quantize_with_imatrix);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return 1;
    return check_summary("test_imatrix");
}
