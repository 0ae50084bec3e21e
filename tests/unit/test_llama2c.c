/*
 * test_llama2c.c -- llama2.c checkpoints in (libcore/formats/llama2c.h), against independent
 * references in ../shared:
 *   - stories260K.bin + tok512.bin converts to the same tensor bytes as the same weights from
 *     the GGUF file (the shared README verified the two bit-identical), and its tokenizer gives
 *     llama.cpp's ids on the 254 golden lines (golden/stories260K.tokenizer.jsonl);
 *   - greedy continuations equal the goldens token for token: stories260K's 5 prompts (llama2.c
 *     run, llama.cpp and a float64 PyTorch forward agree on them) and xs-ckpt's model.bin;
 *   - a version-1 checkpoint (written here from the legacy file's arrays, in export.py's
 *     version-1 order and header) converts to the same tensors;
 *   - xs-ckpt's PyTorch training checkpoint ckpt.pt (train.py's, read by pickle.h) converts to
 *     the tensors of its llama2.c export model.bin (test_pickle.c: bit-identical), and a zip
 *     that is not one is refused by name;
 *   - a version-2 checkpoint (int8 groups, written here as export.py's quantize_q80 does)
 *     converts to F32 values q * scale, and keeps the golden greedy text for >= 16 tokens;
 *   - bad files fail with the file and the place named: a checkpoint one float short, a header
 *     field out of range, version 3, a truncated tokenizer, a missing tokenizer.bin, and a
 *     tokenizer given for a source that is not llama2.c.
 */
#include "check.h"
#include "testlib.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/engine/model.h"
#include "libcore/engine/sampler.h"
#include "libcore/formats/convert.h"
#include "libcore/formats/llama2c.h"
#include "libcore/formats/shard.h"
#include "libcore/tokenizers/tokenizer.h"
#include "tests/zipwrite.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static char dir[] = "/tmp/iflow-test-llama2c-XXXXXX";
static char s_l2c[300], s_gguf[300];

static int convert_l2c(const char *bin, const char *tok, const char *out)
{
    const char *specs[] = {"specs"};
    iflow_convert_opts o = {.dtype = -1, .spec_dirs = specs, .n_spec_dirs = 1, .tokenizer_path = tok};
    return iflow_convert(bin, out, &o);
}

static char *data_copy(const char *rel)
{
    const char *p = test_data(rel);
    return p ? strdup(p) : NULL;
}

/* Every tensor of shard a is in b with the same type, shape and bytes; returns how many. */
static int same_tensors(const char *a, const char *b)
{
    iflow_shard *sa, *sb;
    if (iflow_shard_open(&sa, a, 0) < 0 || iflow_shard_open(&sb, b, 0) < 0)
        return -1;
    int n = 0, bad = 0;
    for (size_t i = 0; i < iflow_shard_n_records(sa); i++) {
        const iflow_shard_rec *r = iflow_shard_rec_at(sa, i), *q = iflow_shard_find(sb, r->name);
        if (r->kind != IFLOW_REC_TENSOR)
            continue;
        n++;
        if (!q || q->dtype != r->dtype || q->nbytes != r->nbytes || memcmp(q->data, r->data, r->nbytes)) {
            bad++;
            fprintf(stderr, "  tensor %s differs\n", r->name);
        }
    }
    iflow_shard_close(sa);
    iflow_shard_close(sb);
    return bad ? -1 : n;
}

static void test_same_as_gguf(void)
{
    CHECK(test_convert("models/stories260K/gguf/stories260K.gguf", s_gguf, -1) == 0, "gguf");
    int n = same_tensors(s_l2c, s_gguf);
    CHECK(n == 47, "llama2.c and GGUF tensors: %d of 47 identical", n);
}

static void test_tokenizer_golden(void)
{
    const char *p = test_data("golden/stories260K.tokenizer.jsonl");
    if (!p)
        SKIP("no golden/stories260K.tokenizer.jsonl");
    iflow_model *m;
    CHECK(iflow_model_open(&m, s_l2c, 0) == 0, "open: %s", iflow_errmsg());
    const iflow_tokenizer *t = iflow_model_tokenizer(m);
    FILE *f = fopen(p, "r");
    char *line = NULL;
    size_t cap = 0;
    int n = 0, ok = 0;
    while (t && f && getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, JSON_ALLOW_NUL, NULL);
        const json_t *text = json_object_get(j, "text");
        size_t nw, ng = 0;
        int32_t *want = test_ids(json_object_get(j, "ids"), &nw), *got = NULL;
        int rc = iflow_tokenizer_encode(t, json_string_value(text), json_string_length(text), IFLOW_TOK_ADD_BOS, &got, &ng);
        ok += rc == 0 && ng == nw && memcmp(got, want, nw * sizeof *got) == 0;
        n++;
        free(want);
        free(got);
        json_decref(j);
    }
    free(line);
    if (f)
        fclose(f);
    CHECK(n == 254 && ok == n, "tok512.bin: %d of %d golden lines tokenize as llama.cpp does", ok, n);
    iflow_model_close(m);
}

/* test_greedy_match() on the model in shard. */
static int greedy_match(const char *shard, const int32_t *prompt, size_t n_prompt, const int32_t *want, size_t n_want)
{
    iflow_model *m;
    if (iflow_model_open(&m, shard, 0) < 0)
        return -1;
    int got = test_greedy_match(m, 1, prompt, n_prompt, want, n_want);
    iflow_model_close(m);
    return got;
}

static void test_greedy_golden(void)
{
    const char *p = test_data("golden/stories260K.greedy64.jsonl");
    if (!p)
        SKIP("no golden data");
    FILE *f = fopen(p, "r");
    char line[65536];
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        json_t *rec = json_loads(line, 0, NULL);
        size_t np, ng;
        int32_t *prompt = test_ids(json_object_get(rec, "prompt_ids"), &np), *gen = test_ids(json_object_get(rec, "gen_ids"), &ng);
        int got = greedy_match(s_l2c, prompt, np, gen, ng);
        CHECK(got == (int)ng, "stories260K.bin, '%s': %d of %zu greedy tokens match", json_string_value(json_object_get(rec, "prompt")),
              got, ng);
        n++;
        free(prompt), free(gen), json_decref(rec);
    }
    if (f)
        fclose(f);
    CHECK(n == 5, "5 golden prompts (%d)", n);

    /* xs-ckpt: its own checkpoint, stories260K's tokenizer */
    char xs[300], *bin = data_copy("models/xs-ckpt/model.bin"), *tok = data_copy("models/stories260K/llama2c/tok512.bin");
    json_error_t je;
    const char *gp = test_data("golden/xs-ckpt.greedy64.json");
    json_t *g = gp ? json_load_file(gp, 0, &je) : NULL;
    snprintf(xs, sizeof xs, "%s/xs.ifs", dir);
    if (bin && tok && g) {
        CHECK(convert_l2c(bin, tok, xs) == 0, "xs-ckpt model.bin: %s", iflow_errmsg());
        size_t np, ng;
        int32_t *prompt = test_ids(json_object_get(g, "prompt_ids"), &np), *gen = test_ids(json_object_get(g, "gen_ids"), &ng);
        int got = greedy_match(xs, prompt, np, gen, ng);
        CHECK(got == (int)ng && ng == 64, "xs-ckpt model.bin greedy: %d of %zu", got, ng);
        free(prompt), free(gen);
    }
    json_decref(g);
    free(bin), free(tok);
}

/* ---- version 1 ------------------------------------------------------------------------------- */

/* stories260K.bin's legacy arrays, in file order (floats inside file). */
typedef struct {
    unsigned char *file;
    int32_t hp[7];
    size_t D, H, L, V, kv;
    const float *emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final;
} legacy;

static int load_legacy(legacy *g)
{
    char *bin = data_copy("models/stories260K/llama2c/stories260K.bin");
    size_t len;
    g->file = bin ? test_read_file(bin, &len) : NULL;
    free(bin);
    if (!g->file)
        return -1;
    memcpy(g->hp, g->file, sizeof g->hp);
    g->D = (size_t)g->hp[0], g->H = (size_t)g->hp[1], g->L = (size_t)g->hp[2], g->V = (size_t)g->hp[5];
    g->kv = g->D / (size_t)g->hp[3] * (size_t)g->hp[4];
    const size_t D = g->D, L = g->L;
    g->emb = (const float *)(g->file + 28);
    g->rms_att = g->emb + g->V * D, g->wq = g->rms_att + L * D, g->wk = g->wq + L * D * D;
    g->wv = g->wk + L * g->kv * D, g->wo = g->wv + L * g->kv * D, g->rms_ffn = g->wo + L * D * D;
    g->w1 = g->rms_ffn + L * D, g->w2 = g->w1 + L * g->H * D, g->w3 = g->w2 + L * g->H * D;
    g->rms_final = g->w3 + L * g->H * D;
    return 0;
}

static void test_version1(void)
{
    legacy g;
    if (load_legacy(&g) < 0)
        SKIP("no stories260K.bin");
    char *tok = data_copy("models/stories260K/llama2c/tok512.bin");
    const size_t D = g.D, L = g.L;
    /* version 1: 256-byte header, then norms first (export.py's version1_export) */
    const struct {
        const float *p;
        size_t n;
    } parts[] = {{g.rms_att, L * D},        {g.rms_ffn, L * D},        {g.rms_final, D},         {g.emb, g.V * D},
                 {g.wq, L * D * D},         {g.wk, L * g.kv * D},      {g.wv, L * g.kv * D},     {g.wo, L * D * D},
                 {g.w1, L * g.H * D},       {g.w2, L * g.H * D},       {g.w3, L * g.H * D}};
    size_t total = 0;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        total += parts[i].n;
    unsigned char *v1 = calloc(1, 256 + total * 4);
    uint32_t magic = 0x616b3432u;
    int32_t version = 1;
    memcpy(v1, &magic, 4);
    memcpy(v1 + 4, &version, 4);
    memcpy(v1 + 8, g.hp, sizeof g.hp);
    v1[36] = 1; /* shared classifier */
    float *o = (float *)(v1 + 256);
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        memcpy(o, parts[i].p, parts[i].n * 4), o += parts[i].n;
    char path[300], out[300];
    snprintf(path, sizeof path, "%s/v1.bin", dir);
    snprintf(out, sizeof out, "%s/v1.ifs", dir);
    test_write_file(path, v1, 256 + total * 4);
    CHECK(iflow_is_llama2c_file(path), "a version-1 file is recognized");
    CHECK(convert_l2c(path, tok, out) == 0, "version 1: %s", iflow_errmsg());
    int n = same_tensors(out, s_l2c);
    CHECK(n == 47, "version 1 and legacy: %d of 47 tensors identical", n);
    free(g.file), free(v1), free(tok);
}

/* ---- version 2 (int8 groups) ------------------------------------------------------------------ */

/* export.py's quantize_q80 on n floats in groups of gs: q = round(w / (max|w| / 127)). */
static void q80(const float *w, size_t n, int gs, int8_t *q, float *s)
{
    for (size_t g = 0; g < n / (size_t)gs; g++) {
        float m = 0;
        for (int i = 0; i < gs; i++)
            m = fabsf(w[g * gs + i]) > m ? fabsf(w[g * gs + i]) : m;
        s[g] = m / 127.0f;
        for (int i = 0; i < gs; i++)
            q[g * gs + i] = (int8_t)lrintf(w[g * gs + i] / s[g]);
    }
}

static void test_version2(void)
{
    legacy g;
    if (load_legacy(&g) < 0)
        SKIP("no stories260K.bin");
    char *tok = data_copy("models/stories260K/llama2c/tok512.bin");
    const size_t D = g.D, H = g.H, L = g.L, V = g.V, kv = g.kv;
    const int gs = 64;
    const int32_t *hp = g.hp;
    const float *emb = g.emb, *rms_att = g.rms_att, *wq = g.wq, *wk = g.wk, *wv = g.wv, *wo = g.wo, *rms_ffn = g.rms_ffn,
                *w1 = g.w1, *w2 = g.w2, *w3 = g.w3, *rms_final = g.rms_final;
    zbuf out = {0};
    uint32_t magic = 0x616b3432u;
    int32_t version = 2;
    unsigned char hdr[256] = {0};
    memcpy(hdr, &magic, 4), memcpy(hdr + 4, &version, 4), memcpy(hdr + 8, hp, sizeof g.hp);
    hdr[36] = 1;
    memcpy(hdr + 37, &gs, 4);
    zb_put(&out, hdr, sizeof hdr);
    zb_put(&out, rms_att, 4 * L * D), zb_put(&out, rms_ffn, 4 * L * D), zb_put(&out, rms_final, 4 * D);
    /* the matrices, each layer's on its own, with the dequantized values the converter must give */
    typedef struct {
        const float *w;
        size_t n;
    } mat;
    mat mats[1 + 7 * 64];
    size_t nm = 0;
    mats[nm++] = (mat){emb, V * D};
    const float *per[7] = {wq, wk, wv, wo, w1, w2, w3};
    const size_t sz[7] = {D * D, kv * D, kv * D, D * D, H * D, H * D, H * D};
    for (int k = 0; k < 7; k++)
        for (size_t l = 0; l < L; l++)
            mats[nm++] = (mat){per[k] + l * sz[k], sz[k]};
    float *want = malloc(sizeof(float) * V * D * 2), *wp = want; /* emb and wq of layer 0 */
    for (size_t m = 0; m < nm; m++) {
        int8_t *q = malloc(mats[m].n);
        float *s = malloc(sizeof(float) * (mats[m].n / gs));
        q80(mats[m].w, mats[m].n, gs, q, s);
        zb_put(&out, q, mats[m].n), zb_put(&out, s, 4 * (mats[m].n / gs));
        if (m < 2)
            for (size_t i = 0; i < mats[m].n; i++)
                *wp++ = (float)q[i] * s[i / gs];
        free(q), free(s);
    }
    char path[300], shard[300];
    snprintf(path, sizeof path, "%s/v2.bin", dir);
    snprintf(shard, sizeof shard, "%s/v2.ifs", dir);
    test_write_file(path, out.p, out.n);
    CHECK_ERR(iflow_llama2c_check_header(out.p, out.n - 1, "v2.bin"), IFLOW_ETRUNC, "v2.bin", "needs");
    CHECK(iflow_llama2c_check_header(out.p, out.n, "v2.bin") == 0, "v2 header: %s", iflow_errmsg());
    CHECK(convert_l2c(path, tok, shard) == 0, "version 2: %s", iflow_errmsg());
    iflow_shard *sh;
    if (iflow_shard_open(&sh, shard, 0) == 0) {
        const iflow_shard_rec *e = iflow_shard_find(sh, "tok_embd"), *q0 = iflow_shard_find(sh, "blk.0.wq");
        CHECK(e && q0 && e->dtype == IFLOW_DT_F32 && e->nbytes == 4 * V * D && q0->nbytes == 4 * D * D &&
                  !memcmp(e->data, want, e->nbytes) && !memcmp(q0->data, want + V * D, q0->nbytes),
              "version 2: the embedding and wq are q * scale (runq.c's dequantization)");
        iflow_shard_close(sh);
    }
    /* int8 weights in groups of 64 keep the golden greedy text for a while */
    const char *gp = test_data("golden/stories260K.greedy64.jsonl");
    FILE *gf = gp ? fopen(gp, "r") : NULL;
    char line[65536];
    int worst = 64;
    while (gf && fgets(line, sizeof line, gf)) {
        json_t *rec = json_loads(line, 0, NULL);
        size_t np, ng;
        int32_t *prompt = test_ids(json_object_get(rec, "prompt_ids"), &np), *gen = test_ids(json_object_get(rec, "gen_ids"), &ng);
        int got = greedy_match(shard, prompt, np, gen, ng);
        worst = got < worst ? got : worst;
        free(prompt), free(gen), json_decref(rec);
    }
    if (gf)
        fclose(gf);
    printf("version 2 (int8, groups of 64): golden greedy tokens kept, worst prompt: %d of 64\n", worst);
    CHECK(worst >= 16, "version 2: only %d golden greedy tokens on the worst prompt (Q8's bar: 16)", worst);
    free(out.p), free(want), free(g.file), free(tok);
}

/* ---- ckpt.pt -------------------------------------------------------------------------------- */

static void test_ckpt_pt(void)
{
    char *pt = data_copy("models/xs-ckpt/ckpt.pt"), *bin = data_copy("models/xs-ckpt/model.bin"),
         *tok = data_copy("models/stories260K/llama2c/tok512.bin");
    if (!pt || !bin || !tok) {
        free(pt), free(bin), free(tok);
        SKIP("no xs-ckpt");
    }
    char a[300], b[300];
    snprintf(a, sizeof a, "%s/ckpt.ifs", dir);
    snprintf(b, sizeof b, "%s/xsbin.ifs", dir);
    CHECK(iflow_is_llama2c_file(pt), "ckpt.pt is taken for a llama2.c checkpoint");
    CHECK(convert_l2c(pt, tok, a) == 0, "ckpt.pt: %s", iflow_errmsg());
    CHECK(convert_l2c(bin, tok, b) == 0, "model.bin: %s", iflow_errmsg());
    int n = same_tensors(a, b);
    CHECK(n == 47, "ckpt.pt and model.bin: %d of 47 tensors identical", n);
    iflow_shard *sh;
    if (iflow_shard_open(&sh, a, 0) == 0) {
        CHECK(strstr(iflow_shard_meta(sh), "\"max_seq\": 256") != NULL || strstr(iflow_shard_meta(sh), "\"max_seq\":256"),
              "max_seq from model_args.max_seq_len");
        iflow_shard_close(sh);
    }

    /* a PyTorch zip that is no llama2.c training checkpoint: {"w": tensor} */
    zbuf pk = {0}, zip = {0};
    static const float w[4] = {1, 2, 3, 4};
    int32_t size[1] = {4}, stride[1] = {1};
    pk_op(&pk, 0x80), pk_op(&pk, 2), pk_op(&pk, '}');
    pk_str(&pk, "w");
    pk_tensor(&pk, "FloatStorage", "0", 4, 0, size, stride, 1);
    pk_op(&pk, 's'), pk_op(&pk, '.');
    zmember m[] = {{"a/data.pkl", pk.p, pk.n, 0}, {"a/data/0", w, sizeof w, 0}};
    zip_write(&zip, m, 2);
    char path[300];
    snprintf(path, sizeof path, "%s/other.pt", dir);
    test_write_file(path, zip.p, zip.n);
    CHECK_ERR(convert_l2c(path, tok, a), IFLOW_EFORMAT, "other.pt", "not a llama2.c training checkpoint");
    free(pk.p), free(zip.p), free(pt), free(bin), free(tok);
}

/* ---- bad input -------------------------------------------------------------------------------- */

static void test_errors(void)
{
    char *bin = data_copy("models/stories260K/llama2c/stories260K.bin"), *tok = data_copy("models/stories260K/llama2c/tok512.bin");
    size_t len, tlen;
    unsigned char *v0 = bin ? test_read_file(bin, &len) : NULL, *t = tok ? test_read_file(tok, &tlen) : NULL;
    if (!v0 || !t) {
        free(v0), free(t), free(bin), free(tok);
        SKIP("no stories260K.bin");
    }
    char path[300], tpath[300], out[300];
    snprintf(path, sizeof path, "%s/bad.bin", dir);
    snprintf(tpath, sizeof tpath, "%s/bad-tok.bin", dir);
    snprintf(out, sizeof out, "%s/bad.ifs", dir);

    /* one float short: not even recognized as a checkpoint; the parser says what it needs */
    test_write_file(path, v0, len - 4);
    CHECK(!iflow_is_llama2c_file(path), "a file one float short is not taken for a checkpoint");
    CHECK_ERR(iflow_llama2c_check_header(v0, len - 4, "x.bin"), IFLOW_ETRUNC, "x.bin", "needs 1056540");
    CHECK_ERR(convert_l2c(path, tok, out), IFLOW_EFORMAT, "bad.bin", "llama2.c checkpoint");
    CHECK(access(out, F_OK) != 0, "nothing written");

    /* n_heads 7 does not divide dim 64 */
    unsigned char *b = malloc(len);
    memcpy(b, v0, len);
    int32_t seven = 7, neg = -5;
    memcpy(b + 12, &seven, 4);
    CHECK_ERR(iflow_llama2c_check_header(b, len, "x.bin"), IFLOW_EFORMAT, "x.bin", "n_heads 7");
    memcpy(b, v0, len);
    memcpy(b + 8, &neg, 4);
    CHECK_ERR(iflow_llama2c_check_header(b, len, "x.bin"), IFLOW_EFORMAT, "x.bin", "n_layers -5 at byte 8");

    /* version 3 (int4, a fork's) */
    uint32_t magic = 0x616b3432u;
    int32_t two = 3;
    memset(b, 0, 256);
    memcpy(b, &magic, 4);
    memcpy(b + 4, &two, 4);
    test_write_file(path, b, len);
    CHECK(iflow_is_llama2c_file(path), "the magic is recognized");
    CHECK_ERR(convert_l2c(path, tok, out), IFLOW_EUNSUPPORTED, "bad.bin", "version 3 (byte 4)");

    /* a tokenizer cut inside token 300 */
    CHECK_ERR(iflow_llama2c_check_tokenizer(t, 3000, 512, "t.bin"), IFLOW_ETRUNC, "t.bin", "token");
    test_write_file(tpath, t, 3000);
    CHECK_ERR(convert_l2c(bin, tpath, out), IFLOW_ETRUNC, "bad-tok.bin", "token");
    CHECK(iflow_llama2c_check_tokenizer(t, tlen, 512, "t.bin") == 0, "tok512.bin: %s", iflow_errmsg());

    /* no tokenizer.bin beside the checkpoint */
    test_write_file(path, v0, len);
    CHECK_ERR(convert_l2c(path, NULL, out), IFLOW_ENOTFOUND, "bad.bin", "--tokenizer");

    /* a tokenizer for a Hugging Face directory */
    char *hf = data_copy("models/stories260K/hf");
    CHECK_ERR(convert_l2c(hf, tok, out), IFLOW_EINVAL, "stories260K/hf", "llama2.c");
    CHECK(access(out, F_OK) != 0, "nothing written");
    free(hf), free(b), free(v0), free(t), free(bin), free(tok);
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(s_l2c, sizeof s_l2c, "%s/l2c.ifs", dir);
    snprintf(s_gguf, sizeof s_gguf, "%s/gguf.ifs", dir);
    char *bin = data_copy("models/stories260K/llama2c/stories260K.bin"), *tok = data_copy("models/stories260K/llama2c/tok512.bin");
    if (!bin || !tok) {
        fprintf(stderr, "test data missing\n");
        free(bin), free(tok);
        return check_summary("test_llama2c") | 1;
    }
    int rc = convert_l2c(bin, tok, s_l2c);
    CHECK(rc == 0, "convert stories260K.bin: %s", iflow_errmsg());
    free(bin), free(tok);
    if (rc == 0) {
        RUN(test_same_as_gguf);
        RUN(test_tokenizer_golden);
        RUN(test_greedy_golden);
        RUN(test_version1);
        RUN(test_version2);
        RUN(test_ckpt_pt);
        RUN(test_errors);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_llama2c");
}
