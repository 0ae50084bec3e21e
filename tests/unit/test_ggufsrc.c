/* test_ggufsrc.c -- a GGUF file as a converter source (libcore/formats/ggufsrc.c):
 *   - every ggml type it converts, against gguf-py's dequantization (tests/fixtures/gguf, made
 *     by tests/fixtures/gen_gguf_types.py): F32 values bit-identical; the exact re-encodings
 *     (Q4_1, Q4_0 -> q4_b32, Q8_0 -> q8_b32) decode, through iflow's own block decoder, to the
 *     same bits, and Q4_1 is the source's bytes; F16/BF16 targets are the reference rounded once;
 *     blocks whose scale does not fit iflow's form fall back to F32;
 *   - the metadata as a config, the tokenizer blob, and the errors (unknown types, conversions
 *     that do not exist), on hand-built files and on the real SmolLM2 GGUF;
 *   - the spec's GGUF variant (specs/llama.ini [gguf] sections, '!key' alternatives). */
#include "check.h"
#include "testlib.h"
#include "kernels/cpu/quant.h"
#include "libcore/base/dtype.h"
#include "libcore/formats/ggufsrc.h"
#include "libcore/formats/spec.h"
#include "libcore/tokenizers/tokenizer.h"

#define TYPES "tests/fixtures/gguf/types.gguf"
#define REFS "tests/fixtures/gguf/types.ref.gguf"
#define ROWS 4
#define K 512

/* The fixture's tensors and the iflow type each must convert to without a second rounding. */
static const struct {
    const char *name, *ggml;
    int native;
} cases[] = {
    {"f32", "f32", IFLOW_DT_F32},       {"f16", "f16", IFLOW_DT_F16},       {"bf16", "bf16", IFLOW_DT_BF16},
    {"q8_0", "q8_0", IFLOW_DT_Q8_B32},  {"q4_0", "q4_0", IFLOW_DT_Q4_B32},  {"q4_1", "q4_1", IFLOW_DT_Q4_B32},
    {"q5_0", "q5_0", IFLOW_DT_F32},     {"q5_1", "q5_1", IFLOW_DT_F32},     {"q2_k", "q2_k", IFLOW_DT_F32},
    {"q3_k", "q3_k", IFLOW_DT_F32},     {"q4_k", "q4_k", IFLOW_DT_F32},     {"q5_k", "q5_k", IFLOW_DT_F32},
    {"q6_k", "q6_k", IFLOW_DT_F32},     {"q4_0_big", "q4_0", IFLOW_DT_F32}, {"q8_0_big", "q8_0", IFLOW_DT_F32},
    {"mxfp4", "mxfp4", IFLOW_DT_Q8_B32}, {"mxfp4_tiny", "mxfp4", IFLOW_DT_F32},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* Elements of a and b (n floats) whose bits differ. */
static int bit_mismatches(const float *a, const float *b, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += memcmp(&a[i], &b[i], 4) != 0;
    return bad;
}

/* Elements whose values differ: bits, except that -0 equals +0. */
static int value_mismatches(const float *a, const float *b, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += a[i] != b[i];
    return bad;
}

static void test_types(void)
{
    iflow_ggufsrc *s;
    iflow_gguf *ref;
    int rc = iflow_ggufsrc_open(&s, TYPES);
    CHECK(rc == 0, "open %s: %s", TYPES, iflow_errmsg());
    CHECK(iflow_gguf_open(&ref, REFS) == 0, "open %s: %s", REFS, iflow_errmsg());
    if (rc < 0)
        return;
    CHECK(iflow_ggufsrc_n_tensors(s) == N_CASES, "%zu tensors", iflow_ggufsrc_n_tensors(s));
    static float want[ROWS * K], got[ROWS * K], row[K];
    static uint8_t buf[ROWS * K * 4];
    for (size_t c = 0; c < N_CASES; c++) {
        const char *name = cases[c].name;
        const iflow_src_tensor *t = iflow_ggufsrc_find(s, name);
        int64_t ri = iflow_gguf_find_tensor(ref, name);
        CHECK(t && ri >= 0, "tensor '%s' in both files", name);
        if (!t || ri < 0)
            continue;
        memcpy(want, iflow_gguf_tensor_data(ref, ri), sizeof want);
        CHECK(t->n_dims == 2 && t->shape[0] == ROWS && t->shape[1] == K, "%s: shape [%lld, %lld] (ggml ne reversed)", name,
              (long long)t->shape[0], (long long)t->shape[1]);
        CHECK(strcmp(t->dtype_name, cases[c].ggml) == 0, "%s: type name %s", name, t->dtype_name);
        CHECK(t->dtype == cases[c].native, "%s: converts to %s, want %s", name, iflow_dtype_name(t->dtype),
              iflow_dtype_name(cases[c].native));

        /* dequantized to F32: bit-identical to gguf-py */
        const void *data;
        CHECK(iflow_ggufsrc_payload(s, t, IFLOW_DT_F32, &data, buf) == 0, "%s -> f32: %s", name, iflow_errmsg());
        memcpy(got, data, sizeof got);
        CHECK(bit_mismatches(got, want, ROWS * K) == 0, "%s -> f32: %d of %d values differ from gguf-py", name,
              bit_mismatches(got, want, ROWS * K), ROWS * K);

        /* the native type: a quantized one decodes (iflow's decoder) to the same bits */
        CHECK(iflow_ggufsrc_payload(s, t, t->dtype, &data, buf) == 0, "%s -> native: %s", name, iflow_errmsg());
        if (iflow_dtype_is_quant(t->dtype)) {
            size_t rb = ifk_qrow_bytes(t->dtype, K);
            for (int r = 0; r < ROWS; r++) {
                ifk_dequantize_row(row, t->dtype, (const uint8_t *)data + r * rb, K);
                memcpy(got + r * K, row, sizeof row);
            }
            /* min + q * delta cannot give ggml's -0 ((q - 8) * d with d < 0): zeros' signs aside */
            CHECK(value_mismatches(got, want, ROWS * K) == 0, "%s -> %s decodes to %d values unlike gguf-py's", name,
                  iflow_dtype_name(t->dtype), value_mismatches(got, want, ROWS * K));
        } else if (t->dtype == IFLOW_DT_F32) {
            CHECK(bit_mismatches(data, want, ROWS * K) == 0, "%s native f32", name);
        }
        if (strcmp(name, "q4_1") == 0 || strcmp(name, "f16") == 0 || strcmp(name, "bf16") == 0 || strcmp(name, "f32") == 0)
            CHECK(data == t->data, "%s: stored as it is, byte for byte (no copy)", name);

        /* F16 and BF16 targets: the reference rounded once */
        int bad16 = 0, bad_bf = 0;
        CHECK(iflow_ggufsrc_payload(s, t, IFLOW_DT_F16, &data, buf) == 0, "%s -> f16: %s", name, iflow_errmsg());
        for (int i = 0; i < ROWS * K; i++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)data + 2 * i, 2);
            bad16 += h != iflow_f32_to_f16(want[i]);
        }
        CHECK(iflow_ggufsrc_payload(s, t, IFLOW_DT_BF16, &data, buf) == 0, "%s -> bf16: %s", name, iflow_errmsg());
        for (int i = 0; i < ROWS * K; i++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)data + 2 * i, 2);
            bad_bf += h != iflow_f32_to_bf16(want[i]);
        }
        CHECK(bad16 == 0 && bad_bf == 0, "%s: %d f16 and %d bf16 values not the reference rounded once", name, bad16,
              bad_bf);
    }
    /* a conversion that does not exist names the tensor */
    const iflow_src_tensor *t = iflow_ggufsrc_find(s, "q5_k");
    const void *data;
    if (t) {
        rc = iflow_ggufsrc_payload(s, t, IFLOW_DT_Q4_B64, &data, buf);
        CHECK_ERR(rc, IFLOW_EUNSUPPORTED, "q5_k", "q4_b64");
    }
    iflow_gguf_close(ref);
    iflow_ggufsrc_close(s);
}

/* ---- hand-built files --------------------------------------------------------------------- */

typedef struct {
    uint8_t p[4096];
    size_t n;
} wbuf;

static void put(wbuf *b, const void *s, size_t n)
{
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void put_u32(wbuf *b, uint32_t v) { put(b, &v, 4); } /* the tests run little-endian */
static void put_u64(wbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(wbuf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

/* A GGUF v3 with general.architecture = arch, llama.block_count = 2, an array key, and one
 * tensor "blk.0.x.weight" [2][256] (ggml ne 256, 2) of ggml type `type` (zero data). */
static void build(wbuf *b, const char *arch, uint32_t type, uint64_t data_bytes)
{
    b->n = 0;
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, 1);
    put_u64(b, 3);
    put_str(b, "general.architecture"), put_u32(b, 8), put_str(b, arch);
    put_str(b, "llama.block_count"), put_u32(b, 4), put_u32(b, 2);
    put_str(b, "general.tags"), put_u32(b, 9), put_u32(b, 8), put_u64(b, 2), put_str(b, "a"), put_str(b, "b");
    put_str(b, "blk.0.x.weight"), put_u32(b, 2), put_u64(b, 256), put_u64(b, 2), put_u32(b, type), put_u64(b, 0);
    while (b->n % 32)
        b->p[b->n++] = 0;
    memset(b->p + b->n, 0, data_bytes);
    b->n += data_bytes;
}

static void test_config_and_errors(void)
{
    wbuf b;
    iflow_gguf *g;
    iflow_ggufsrc *s;
    build(&b, "llama", 16 /* iq2_xxs */, 2 * 66);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "hand.gguf") == 0, "open: %s", iflow_errmsg());
    CHECK(iflow_ggufsrc_from(&s, g) == 0, "ggufsrc: %s", iflow_errmsg());
    const json_t *cfg = iflow_ggufsrc_config(s);
    CHECK(json_integer_value(json_object_get(json_object_get(cfg, "llama"), "block_count")) == 2, "llama.block_count nested");
    CHECK(json_integer_value(json_object_get(json_object_get(json_object_get(cfg, "general"), "tags"), "count")) == 2,
          "an array key reads as {count}");
    const json_t *tn = json_object_get(json_object_get(json_object_get(json_object_get(cfg, "tensors"), "blk"), "0"), "x");
    CHECK(json_is_true(json_object_get(tn, "weight")), "tensors.blk.0.x.weight is true");
    CHECK(strcmp(iflow_ggufsrc_architecture(s), "llama") == 0, "architecture");
    const iflow_src_tensor *t = iflow_ggufsrc_tensor(s, 0);
    CHECK(t && t->dtype == -1 && strcmp(t->dtype_name, "iq2_xxs") == 0, "iq2_xxs is not convertible, and named");
    void *blob;
    size_t len;
    CHECK_ERR(iflow_ggufsrc_tokenizer(s, &blob, &len), IFLOW_ENOTFOUND, "hand.gguf", "no tokenizer");
    static uint8_t out[2 * 256 * 4];
    const void *data;
    if (t)
        CHECK_ERR(iflow_ggufsrc_payload(s, t, IFLOW_DT_F32, &data, out), IFLOW_EUNSUPPORTED, "blk.0.x.weight", "iq2_xxs");

    /* resolving the llama spec against it: the hparams it lacks are named with the source */
    const char *dirs[] = {"specs"};
    iflow_spec *spec;
    int rc = iflow_spec_find_source(&spec, dirs, 1, "gguf", "llama");
    CHECK(rc == 0, "the llama spec serves gguf llama: %s", iflow_errmsg());
    if (rc == 0) {
        json_t *resolved;
        CHECK(spec->source && strcmp(spec->source, "gguf") == 0, "variant applied");
        rc = iflow_spec_resolve(spec, cfg, &resolved);
        CHECK_ERR(rc, IFLOW_ESPEC, "gguf metadata", "llama.embedding_length");
        iflow_spec_close(spec);
    }
    iflow_ggufsrc_close(s); /* owns cfg */
    CHECK_ERR(iflow_spec_find_source(&spec, dirs, 1, "gguf", "mamba"), IFLOW_ENOTFOUND, "specs", "unknown gguf architecture 'mamba'");
    /* a spec without a [gguf] section refuses to read GGUF */
    char path[] = "/tmp/iflow-test-spec-XXXXXX";
    int fd = mkstemp(path);
    const char *text = "[model]\nname = x\narchitectures = X\n[blocks]\nrope_layout = half\n";
    CHECK(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text), "write spec");
    close(fd);
    CHECK(iflow_spec_load(&spec, path) == 0, "load: %s", iflow_errmsg());
    if (spec)
        CHECK_ERR(iflow_spec_use_source(spec, "gguf"), IFLOW_ESPEC, path, "has no [gguf] section");
    iflow_spec_close(spec);
    unlink(path);
}

/* [gguf.*] keys override the base spec's, '!key' is presence negated, and a typo in a section
 * name is still an error. */
static void test_spec_variant(void)
{
    char path[] = "/tmp/iflow-test-spec-XXXXXX";
    const char *text = "[model]\nname = v\narchitectures = V\n[blocks]\nrope_layout = half\nnorm = rms\n"
                       "[hparams]\ndim = hidden_size\nkeep = 7\n[tensors]\nx = model.x\ny = model.y\n"
                       "[ignore]\npattern = junk.*\n"
                       "[gguf]\narchitectures = v1, v2\n[gguf.blocks]\nrope_layout = interleaved\n"
                       "[gguf.hparams]\ndim = v.width\ntied = !tensors.output\nuntied = !tensors.input\n"
                       "[gguf.tensors]\nx = gx\n[gguf.ignore]\npattern = other.*\n";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text), "write spec");
    close(fd);
    iflow_spec *s;
    int rc = iflow_spec_load(&s, path);
    CHECK(rc == 0, "load: %s", iflow_errmsg());
    if (rc == 0) {
        CHECK(iflow_spec_use_source(s, "gguf") == 0, "use gguf: %s", iflow_errmsg());
        char name[64];
        CHECK(iflow_spec_source_name(s, "x", name, sizeof name) == 0 && strcmp(name, "gx") == 0, "x overridden: %s", name);
        CHECK(iflow_spec_source_name(s, "y", name, sizeof name) == 0 && strcmp(name, "model.y") == 0, "y inherited");
        CHECK(iflow_spec_ignored(s, "other.1") && !iflow_spec_ignored(s, "junk.1"), "[gguf.ignore] replaces [ignore]");
        json_t *cfg = json_loads("{\"v\": {\"width\": 64}, \"tensors\": {\"input\": true}}", 0, NULL), *r;
        CHECK(iflow_spec_resolve(s, cfg, &r) == 0, "resolve: %s", iflow_errmsg());
        const json_t *hp = json_object_get(r, "hparams"), *bl = json_object_get(r, "blocks");
        CHECK(json_integer_value(json_object_get(hp, "dim")) == 64 && json_integer_value(json_object_get(hp, "keep")) == 7,
              "hparams overridden and inherited");
        CHECK(json_is_true(json_object_get(hp, "tied")) && json_is_false(json_object_get(hp, "untied")), "!key");
        CHECK(strcmp(json_string_value(json_object_get(bl, "rope_layout")), "interleaved") == 0 &&
                  strcmp(json_string_value(json_object_get(bl, "norm")), "rms") == 0,
              "blocks overridden and inherited");
        json_decref(r);
        json_decref(cfg);
        iflow_spec_close(s);
    }
    /* a section of an unknown format, and an unknown key in [gguf] */
    const char *bad[] = {"[model]\nname = v\narchitectures = V\n[ggfu.tensors]\nx = y\n",
                         "[model]\nname = v\narchitectures = V\n[gguf]\narchitecture = v\n"};
    const char *msg[] = {"unknown section [ggfu.tensors]", "unknown key 'architecture' in [gguf]"};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(path, "w");
        fputs(bad[i], f);
        fclose(f);
        CHECK_ERR(iflow_spec_load(&s, path), IFLOW_ESPEC, path, msg[i]);
    }
    unlink(path);
}

/* The real SmolLM2 file: metadata as config, tensor types, the vocabulary blob. */
static void test_smollm2(void)
{
    const char *p = test_data("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!p)
        SKIP("no SmolLM2 GGUF");
    iflow_ggufsrc *s;
    int rc = iflow_ggufsrc_open(&s, p);
    CHECK(rc == 0, "open: %s", iflow_errmsg());
    if (rc < 0)
        return;
    const json_t *cfg = iflow_ggufsrc_config(s), *llama = json_object_get(cfg, "llama");
    CHECK(json_integer_value(json_object_get(llama, "block_count")) == 30, "block_count");
    CHECK(json_real_value(json_object_get(json_object_get(llama, "rope"), "freq_base")) == 100000.0, "rope.freq_base");
    CHECK(!json_object_get(json_object_get(cfg, "tensors"), "output"), "no output.weight (tied)");
    int n[IFLOW_DT_QEND_] = {0};
    for (size_t i = 0; i < iflow_ggufsrc_n_tensors(s); i++)
        n[iflow_ggufsrc_tensor(s, i)->dtype]++;
    CHECK(n[IFLOW_DT_Q4_B32] == 210 && n[IFLOW_DT_Q8_B32] == 1 && n[IFLOW_DT_F32] == 61,
          "210 q4_1 -> q4_b32, 1 q8_0 -> q8_b32, 61 f32 (%d, %d, %d)", n[IFLOW_DT_Q4_B32], n[IFLOW_DT_Q8_B32],
          n[IFLOW_DT_F32]);
    void *blob;
    size_t len;
    iflow_tokenizer *tok = NULL;
    CHECK(iflow_ggufsrc_tokenizer(s, &blob, &len) == 0, "tokenizer: %s", iflow_errmsg());
    CHECK(iflow_tokenizer_from_gguf(&tok, blob, len, "blob") == 0, "tokenizer parses: %s", iflow_errmsg());
    if (tok) {
        int32_t *ids, want[] = {504, 3575, 282, 4649, 314}; /* golden/smollm2 greedy32 prompt 0 */
        size_t n_ids = 0;
        const char *text = "The capital of France is";
        CHECK(iflow_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n_ids) == 0, "encode");
        CHECK(n_ids == 5 && memcmp(ids, want, sizeof want) == 0, "ids of the golden prompt (%zu ids)", n_ids);
        free(ids);
        iflow_tokenizer_close(tok);
    }
    free(blob);
    iflow_ggufsrc_close(s);
}

int main(void)
{
    RUN(test_types);
    RUN(test_config_and_errors);
    RUN(test_spec_variant);
    RUN(test_smollm2);
    return check_summary("test_ggufsrc");
}
