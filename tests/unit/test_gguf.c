/* test_gguf.c -- the GGUF reader: a hand-built file with every value type and two tensors,
 * each way a header can lie (truncation at every byte, string lengths, counts, tensor
 * extents), and the real vocab / model files in $IFLOW_TEST_DATA. */
#include "check.h"
#include "libcore/base/error.h"
#include "libcore/formats/gguf.h"

#include <stdint.h>

/* ---- a tiny GGUF writer ------------------------------------------------------------------- */

typedef struct {
    uint8_t p[8192];
    size_t n;
} wbuf;

static void put(wbuf *b, const void *s, size_t n)
{
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void put_u32(wbuf *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}

static void put_u64(wbuf *b, uint64_t v)
{
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_str(wbuf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void put_key(wbuf *b, const char *key, uint32_t type)
{
    put_str(b, key);
    put_u32(b, type);
}

static void put_header(wbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    b->n = 0;
    put(b, "GGUF", 4);
    put_u32(b, version);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}

static void put_tensor(wbuf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off)
{
    put_str(b, name);
    put_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++)
        put_u64(b, ne[i]);
    put_u32(b, type);
    put_u64(b, off);
}

static void pad(wbuf *b, size_t align)
{
    while (b->n % align)
        b->p[b->n++] = 0;
}

#define TINY_NKV 19

/* Every scalar type, string and numeric arrays, and two tensors (f32 [4,2], q8_0 [32]). */
static void build_tiny(wbuf *b)
{
    float f = 1.5f, fa[2] = {0.5f, -1.0f};
    double d = 2.25;
    int32_t ia[3] = {1, -2, 3};
    put_header(b, 3, 2, TINY_NKV);
    put_key(b, "general.architecture", IFLOW_GGUF_STR), put_str(b, "llama");
    put_key(b, "general.alignment", IFLOW_GGUF_U32), put_u32(b, 32);
    put_key(b, "t.u8", IFLOW_GGUF_U8), put(b, "\x07", 1);
    put_key(b, "t.i8", IFLOW_GGUF_I8), put(b, "\xfd", 1);
    put_key(b, "t.u16", IFLOW_GGUF_U16), put(b, "\x34\x12", 2);
    put_key(b, "t.i16", IFLOW_GGUF_I16), put(b, "\xfe\xff", 2);
    put_key(b, "t.u32", IFLOW_GGUF_U32), put_u32(b, 4000000000u);
    put_key(b, "t.i32", IFLOW_GGUF_I32), put_u32(b, (uint32_t)-5);
    put_key(b, "t.f32", IFLOW_GGUF_F32), put(b, &f, 4);
    put_key(b, "t.bool", IFLOW_GGUF_BOOL), put(b, "\x01", 1);
    put_key(b, "t.u64", IFLOW_GGUF_U64), put_u64(b, 1ull << 40);
    put_key(b, "t.i64", IFLOW_GGUF_I64), put_u64(b, (uint64_t)-1);
    put_key(b, "t.f64", IFLOW_GGUF_F64), put(b, &d, 8);
    put_key(b, "tokenizer.ggml.tokens", IFLOW_GGUF_ARR), put_u32(b, IFLOW_GGUF_STR), put_u64(b, 3);
    put_str(b, "a"), put_str(b, "b"), put_str(b, "ab");
    put_key(b, "t.arr_i32", IFLOW_GGUF_ARR), put_u32(b, IFLOW_GGUF_I32), put_u64(b, 3), put(b, ia, 12);
    put_key(b, "t.arr_f32", IFLOW_GGUF_ARR), put_u32(b, IFLOW_GGUF_F32), put_u64(b, 2), put(b, fa, 8);
    put_key(b, "t.empty", IFLOW_GGUF_ARR), put_u32(b, IFLOW_GGUF_I32), put_u64(b, 0);
    put_key(b, "t.u8s", IFLOW_GGUF_ARR), put_u32(b, IFLOW_GGUF_U8), put_u64(b, 3), put(b, "\x01\x02\x03", 3);
    put_key(b, "t.empty_str", IFLOW_GGUF_STR), put_str(b, "");
    uint64_t ne_w[2] = {4, 2}, ne_q[1] = {32};
    put_tensor(b, "w", 2, ne_w, 0, 0);
    put_tensor(b, "q", 1, ne_q, 8, 32);
    pad(b, 32);
    for (int i = 0; i < 8; i++) {
        float v = (float)i;
        put(b, &v, 4);
    }
    for (int i = 0; i < 34; i++)
        b->p[b->n++] = (uint8_t)i;
}

static int contains(const char *s, const char *sub)
{
    return strstr(s, sub) != NULL;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_tiny_scalars(void)
{
    wbuf b;
    iflow_gguf *g;
    build_tiny(&b);
    int rc = iflow_gguf_open_mem(&g, b.p, b.n, "tiny.gguf");
    CHECK(rc == 0, "open tiny: %s", iflow_errmsg());
    if (rc)
        return;
    uint32_t u32 = 0;
    int32_t i32 = 0;
    uint64_t u64 = 0;
    float f = 0;
    int bl = 0;
    const char *s = NULL;
    size_t len = 9;
    CHECK(iflow_gguf_version(g) == 3 && iflow_gguf_n_kv(g) == TINY_NKV, "version/n_kv");
    CHECK(iflow_gguf_get_str(g, "general.architecture", &s, &len) == 0 && strcmp(s, "llama") == 0 && len == 5, "str");
    CHECK(iflow_gguf_get_str(g, "t.empty_str", &s, &len) == 0 && s[0] == 0 && len == 0, "empty str");
    CHECK(iflow_gguf_get_u32(g, "t.u8", &u32) == 0 && u32 == 7, "u8 as u32");
    CHECK(iflow_gguf_get_i32(g, "t.i8", &i32) == 0 && i32 == -3, "i8 as i32");
    CHECK(iflow_gguf_get_u32(g, "t.u16", &u32) == 0 && u32 == 0x1234, "u16");
    CHECK(iflow_gguf_get_i32(g, "t.i16", &i32) == 0 && i32 == -2, "i16");
    CHECK(iflow_gguf_get_u32(g, "t.u32", &u32) == 0 && u32 == 4000000000u, "u32");
    CHECK(iflow_gguf_get_i32(g, "t.i32", &i32) == 0 && i32 == -5, "i32");
    CHECK(iflow_gguf_get_f32(g, "t.f32", &f) == 0 && f == 1.5f, "f32");
    CHECK(iflow_gguf_get_f32(g, "t.f64", &f) == 0 && f == 2.25f, "f64 as f32");
    CHECK(iflow_gguf_get_bool(g, "t.bool", &bl) == 0 && bl == 1, "bool");
    CHECK(iflow_gguf_get_u64(g, "t.u64", &u64) == 0 && u64 == 1ull << 40, "u64");
    CHECK(iflow_gguf_get_i32(g, "t.i64", &i32) == 0 && i32 == -1, "i64 as i32");
    int64_t k = iflow_gguf_find_key(g, "t.u16");
    CHECK(k == 4 && strcmp(iflow_gguf_key(g, k), "t.u16") == 0 && iflow_gguf_kv_type(g, k) == IFLOW_GGUF_U16, "find_key");
    CHECK(iflow_gguf_find_key(g, "nope") == -1 && iflow_gguf_key(g, 999) == NULL, "absent key");
    iflow_gguf_close(g);
}

static void test_tiny_arrays(void)
{
    wbuf b;
    iflow_gguf *g;
    build_tiny(&b);
    if (iflow_gguf_open_mem(&g, b.p, b.n, "tiny.gguf") != 0) {
        CHECK(0, "open tiny: %s", iflow_errmsg());
        return;
    }
    const iflow_gguf_str *toks;
    const int32_t *ia;
    const float *fa;
    const void *raw;
    size_t n = 0;
    int et = -1;
    CHECK(iflow_gguf_get_arr_str(g, "tokenizer.ggml.tokens", &toks, &n) == 0 && n == 3 && toks[2].len == 2 &&
              memcmp(toks[2].ptr, "ab", 2) == 0, "string array");
    CHECK(iflow_gguf_get_arr_i32(g, "t.arr_i32", &ia, &n) == 0 && n == 3 && ia[1] == -2, "i32 array");
    CHECK(iflow_gguf_get_arr_f32(g, "t.arr_f32", &fa, &n) == 0 && n == 2 && fa[1] == -1.0f, "f32 array");
    CHECK(iflow_gguf_get_arr_i32(g, "t.empty", &ia, &n) == 0 && n == 0, "empty array");
    CHECK(iflow_gguf_get_arr(g, "t.u8s", &et, &raw, &n) == 0 && et == IFLOW_GGUF_U8 && n == 3 &&
              ((const uint8_t *)raw)[2] == 3, "raw u8 array");
    int64_t k = iflow_gguf_find_key(g, "t.arr_f32");
    CHECK(iflow_gguf_arr_type(g, k) == IFLOW_GGUF_F32 && iflow_gguf_arr_count(g, k) == 2, "array type/count");
    CHECK(iflow_gguf_get_arr_f32(g, "t.arr_i32", &fa, &n) == IFLOW_EFORMAT &&
              contains(iflow_errmsg(), "'t.arr_i32' is an array of i32, not an array of f32, in 'tiny.gguf'"),
          "wrong array type: %s", iflow_errmsg());
    iflow_gguf_close(g);
}

static void test_getter_errors(void)
{
    wbuf b;
    iflow_gguf *g;
    build_tiny(&b);
    if (iflow_gguf_open_mem(&g, b.p, b.n, "tiny.gguf") != 0)
        return;
    uint32_t u32;
    int32_t i32;
    int bl;
    const char *s;
    CHECK(iflow_gguf_get_u32(g, "missing.key", &u32) == IFLOW_ENOTFOUND &&
              strcmp(iflow_errmsg(), "missing key 'missing.key' in 'tiny.gguf'") == 0, "missing: %s", iflow_errmsg());
    CHECK(iflow_gguf_get_str(g, "t.u32", &s, NULL) == IFLOW_EFORMAT &&
              strcmp(iflow_errmsg(), "key 't.u32' is u32, not str, in 'tiny.gguf'") == 0, "type: %s", iflow_errmsg());
    CHECK(iflow_gguf_get_u32(g, "t.i32", &u32) == IFLOW_ERANGE, "negative as u32");
    CHECK(iflow_gguf_get_i32(g, "t.u32", &i32) == IFLOW_ERANGE && contains(iflow_errmsg(), "4000000000"), "range: %s",
          iflow_errmsg());
    CHECK(iflow_gguf_get_bool(g, "t.u8", &bl) == IFLOW_EFORMAT, "bool from u8");
    iflow_gguf_close(g);
}

static void test_tiny_tensors(void)
{
    wbuf b;
    iflow_gguf *g;
    build_tiny(&b);
    if (iflow_gguf_open_mem(&g, b.p, b.n, "tiny.gguf") != 0)
        return;
    CHECK(iflow_gguf_n_tensors(g) == 2, "n_tensors");
    const iflow_gguf_tensor *w = iflow_gguf_tensor_at(g, iflow_gguf_find_tensor(g, "w"));
    const iflow_gguf_tensor *q = iflow_gguf_tensor_at(g, iflow_gguf_find_tensor(g, "q"));
    CHECK(w && w->n_dims == 2 && w->ne[0] == 4 && w->ne[1] == 2 && w->ne[2] == 1 && w->type == 0 && w->nbytes == 32,
          "tensor w");
    CHECK(q && q->type == 8 && q->nbytes == 34 && q->offset == 32, "tensor q");
    CHECK(iflow_gguf_data_offset(g) % 32 == 0 && iflow_gguf_data_offset(g) + 66 == b.n, "data offset");
    const float *wd = iflow_gguf_tensor_data(g, iflow_gguf_find_tensor(g, "w"));
    float v7;
    memcpy(&v7, (const char *)wd + 28, 4);
    CHECK(v7 == 7.0f, "tensor data");
    CHECK(iflow_gguf_tensor_at(g, 2) == NULL && iflow_gguf_find_tensor(g, "x") == -1, "absent tensor");
    CHECK(strcmp(iflow_ggml_type_name(8), "q8_0") == 0 && iflow_ggml_nbytes(12, 512) == 288 &&
              iflow_ggml_nbytes(8, 33) == 0 && iflow_ggml_type_name(4) == NULL, "ggml types");
    iflow_gguf_close(g);
}

/* Every prefix of a valid file fails cleanly, with the file name and a byte offset. */
static void test_every_truncation(void)
{
    wbuf b;
    iflow_gguf *g;
    int bad = 0;
    build_tiny(&b);
    for (size_t len = 0; len < b.n; len++) {
        int rc = iflow_gguf_open_mem(&g, b.p, len, "cut.gguf");
        if (rc != IFLOW_ETRUNC || !contains(iflow_errmsg(), "'cut.gguf'") || !contains(iflow_errmsg(), "byte")) {
            if (bad++ < 3)
                CHECK(0, "prefix %zu: rc %d: %s", len, rc, iflow_errmsg());
            if (rc == 0)
                iflow_gguf_close(g);
        }
    }
    CHECK(bad == 0, "%d of %zu prefixes misreported", bad, b.n);
}

static void test_lying_lengths(void)
{
    wbuf b;
    iflow_gguf *g;
    build_tiny(&b);
    uint64_t huge = 1000000000000ull;
    memcpy(b.p + 24, &huge, 8); /* length of the first key */
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "lying.gguf") == IFLOW_ETRUNC &&
              contains(iflow_errmsg(), "truncated gguf key at byte 24 in 'lying.gguf' (length 1000000000000"),
          "lying key length: %s", iflow_errmsg());

    build_tiny(&b);
    size_t at = 24 + 8 + strlen("general.architecture") + 4; /* the value string's length */
    uint64_t len = 6;
    memcpy(b.p + at, &len, 8); /* one byte too long: swallows part of the next key */
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "lying.gguf") < 0, "string one byte too long accepted");

    put_header(&b, 3, 0, 1);
    put_key(&b, "a", IFLOW_GGUF_ARR), put_u32(&b, IFLOW_GGUF_U64), put_u64(&b, 1ull << 62);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "arr.gguf") == IFLOW_ETRUNC && contains(iflow_errmsg(), "'arr.gguf'"),
          "array count x size: %s", iflow_errmsg());

    put_header(&b, 3, 0, 1);
    put_key(&b, "a", IFLOW_GGUF_ARR), put_u32(&b, IFLOW_GGUF_STR), put_u64(&b, UINT64_MAX / 8);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "arr.gguf") == IFLOW_ETRUNC, "string array count: %s", iflow_errmsg());

    put_header(&b, 3, 0, 1ull << 40);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "kv.gguf") == IFLOW_EFORMAT, "n_kv 2^40: %s", iflow_errmsg());
    put_header(&b, 3, 0, 1000);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "kv.gguf") == IFLOW_ETRUNC && contains(iflow_errmsg(), "1000 key-value"),
          "n_kv 1000: %s", iflow_errmsg());
    put_header(&b, 3, 1000000, 0);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "t.gguf") == IFLOW_ETRUNC, "n_tensors: %s", iflow_errmsg());
}

static void test_bad_headers(void)
{
    wbuf b;
    iflow_gguf *g;
    put_header(&b, 3, 0, 0);
    b.p[0] = 'X';
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "m.gguf") == IFLOW_EFORMAT &&
              strcmp(iflow_errmsg(), "bad gguf magic at byte 0 in 'm.gguf'") == 0, "magic: %s", iflow_errmsg());
    put_header(&b, 1, 0, 0);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "v1.gguf") == IFLOW_EUNSUPPORTED, "v1");
    put_header(&b, 0x03000000, 0, 0);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "be.gguf") == IFLOW_EUNSUPPORTED && contains(iflow_errmsg(), "big-endian"),
          "big-endian: %s", iflow_errmsg());
    put_header(&b, 2, 0, 0);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "v2.gguf") == 0 && iflow_gguf_version(g) == 2, "v2 accepted");
    iflow_gguf_close(g);
    CHECK(iflow_gguf_open_mem(&g, NULL, 0, "empty") == IFLOW_ETRUNC, "empty buffer");

    put_header(&b, 3, 0, 2);
    put_key(&b, "k", IFLOW_GGUF_U8), put(&b, "\x01", 1);
    put_key(&b, "k", IFLOW_GGUF_U8), put(&b, "\x01", 1);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "dup.gguf") == IFLOW_EFORMAT && contains(iflow_errmsg(), "duplicate gguf key 'k'"),
          "duplicate key: %s", iflow_errmsg());
    put_header(&b, 3, 0, 1);
    put_key(&b, "k", 13);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "type.gguf") == IFLOW_EFORMAT, "bad type");
    put_header(&b, 3, 0, 1);
    put_key(&b, "k", IFLOW_GGUF_ARR), put_u32(&b, IFLOW_GGUF_ARR), put_u64(&b, 0);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "nest.gguf") == IFLOW_EUNSUPPORTED, "nested array");
    put_header(&b, 3, 0, 1);
    put_key(&b, "general.alignment", IFLOW_GGUF_U32), put_u32(&b, 24);
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "al.gguf") == IFLOW_EFORMAT, "alignment 24");
}

/* A file with one tensor described by (n_dims, ne0, type, offset) and `data` bytes after the padding. */
static int one_tensor(uint32_t n_dims, uint64_t ne0, uint32_t type, uint64_t off, size_t data)
{
    wbuf b;
    iflow_gguf *g;
    uint64_t ne[5] = {ne0, 1, 1, 1, 1};
    put_header(&b, 3, 1, 0);
    put_tensor(&b, "t", n_dims, ne, type, off);
    pad(&b, 32);
    memset(b.p + b.n, 0, data);
    b.n += data;
    int rc = iflow_gguf_open_mem(&g, b.p, b.n, "t.gguf");
    if (rc == 0)
        iflow_gguf_close(g);
    return rc;
}

static void test_tensor_checks(void)
{
    CHECK(one_tensor(1, 8, 0, 0, 32) == 0, "valid tensor: %s", iflow_errmsg());
    CHECK(one_tensor(1, 8, 0, 0, 31) == IFLOW_ETRUNC &&
              contains(iflow_errmsg(), "truncated tensor data: 't' in 't.gguf' at byte"), "short data: %s", iflow_errmsg());
    CHECK(one_tensor(1, 8, 0, 16, 64) == IFLOW_EFORMAT, "misaligned offset");
    CHECK(one_tensor(1, 8, 99, 0, 64) == IFLOW_EUNSUPPORTED && contains(iflow_errmsg(), "unknown ggml type 99"),
          "unknown type: %s", iflow_errmsg());
    CHECK(one_tensor(1, 33, 8, 0, 64) == IFLOW_EFORMAT, "q8_0 row not a block multiple");
    CHECK(one_tensor(5, 8, 0, 0, 64) == IFLOW_EFORMAT, "rank 5");
    CHECK(one_tensor(0, 8, 0, 0, 64) == IFLOW_EFORMAT, "rank 0");
    CHECK(one_tensor(1, 1ull << 62, 0, 0, 64) == IFLOW_ETRUNC, "huge tensor");
    CHECK(one_tensor(1, 8, 0, UINT64_MAX - 31, 64) == IFLOW_ETRUNC, "offset overflow");

    wbuf b;
    iflow_gguf *g;
    uint64_t ne[1] = {8};
    put_header(&b, 3, 2, 0);
    put_tensor(&b, "t", 1, ne, 0, 0);
    put_tensor(&b, "t", 1, ne, 0, 32);
    pad(&b, 32);
    b.n += 64;
    CHECK(iflow_gguf_open_mem(&g, b.p, b.n, "dup.gguf") == IFLOW_EFORMAT, "duplicate tensor");

    /* no tensors: the padded data offset may lie past EOF */
    put_header(&b, 3, 0, 1);
    put_key(&b, "k", IFLOW_GGUF_U8), put(&b, "\x01", 1);
    int rc = iflow_gguf_open_mem(&g, b.p, b.n, "vocab.gguf");
    CHECK(rc == 0 && iflow_gguf_data_offset(g) > b.n, "0 tensors, data past EOF: %s", iflow_errmsg());
    if (rc == 0)
        iflow_gguf_close(g);
}

static void test_vocab_files(void)
{
    static const char *const fams[] = {"baichuan", "deepseek-llm", "falcon", "gpt-2", "gpt-neox",
                                       "llama-spm", "mpt", "phi-3", "refact"};
    int ok = 0;
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "tokenizer-tests/ggml-vocab-%s.gguf", fams[i]);
        const char *path = test_data(rel);
        if (!path)
            SKIP("no %s", rel);
        iflow_gguf *g;
        const iflow_gguf_str *toks;
        size_t n = 0, size = 0;
        int rc = iflow_gguf_open(&g, path);
        CHECK(rc == 0, "%s: %s", fams[i], iflow_errmsg());
        if (rc)
            continue;
        iflow_gguf_data(g, &size);
        ok += iflow_gguf_n_tensors(g) == 0 && iflow_gguf_get_arr_str(g, "tokenizer.ggml.tokens", &toks, &n) == 0 &&
              n > 30000 && iflow_gguf_data_offset(g) > size;
        if (strcmp(fams[i], "baichuan") == 0)
            CHECK(iflow_gguf_data_offset(g) == 1341024 && size == 1340998, "baichuan data offset");
        iflow_gguf_close(g);
    }
    printf("gguf vocab files: %d/9 read\n", ok);
    CHECK(ok == 9, "vocab files");
}

static void test_model_file(void)
{
    const char *path = test_data("models/stories260K/gguf/stories260K.gguf");
    if (!path)
        SKIP("no stories260K.gguf");
    iflow_gguf *g;
    int rc = iflow_gguf_open(&g, path);
    CHECK(rc == 0, "%s", iflow_errmsg());
    if (rc)
        return;
    uint32_t ctx = 0;
    const iflow_gguf_tensor *e = iflow_gguf_tensor_at(g, iflow_gguf_find_tensor(g, "token_embd.weight"));
    CHECK(iflow_gguf_n_tensors(g) == 48 && iflow_gguf_n_kv(g) == 19, "counts");
    CHECK(e && e->n_dims == 2 && e->ne[0] == 64 && e->ne[1] == 512 && e->type == 0 && e->nbytes == 64 * 512 * 4,
          "token_embd.weight");
    CHECK(iflow_gguf_get_u32(g, "llama.context_length", &ctx) == 0 && ctx == 2048, "context_length");
    uint64_t total = 0;
    for (int64_t i = 0; i < iflow_gguf_n_tensors(g); i++)
        total += iflow_gguf_tensor_at(g, i)->nbytes;
    CHECK(total == 260032 * 4 + 512 * 64 * 4, "total tensor bytes %llu", (unsigned long long)total);
    iflow_gguf_close(g);
}

static void test_open_errors(void)
{
    iflow_gguf *g;
    CHECK(iflow_gguf_open(&g, "/nonexistent/x.gguf") == IFLOW_EIO && contains(iflow_errmsg(), "'/nonexistent/x.gguf'"),
          "missing file: %s", iflow_errmsg());
    CHECK(iflow_gguf_open(&g, "/") == IFLOW_EIO && contains(iflow_errmsg(), "not a regular file"), "directory: %s",
          iflow_errmsg());
    const char *path = test_data("models/stories260K/hf/tokenizer.json");
    if (path)
        CHECK(iflow_gguf_open(&g, path) == IFLOW_EFORMAT && contains(iflow_errmsg(), "bad gguf magic"), "json: %s",
              iflow_errmsg());
}

int main(void)
{
    RUN(test_tiny_scalars);
    RUN(test_tiny_arrays);
    RUN(test_getter_errors);
    RUN(test_tiny_tensors);
    RUN(test_every_truncation);
    RUN(test_lying_lengths);
    RUN(test_bad_headers);
    RUN(test_tensor_checks);
    RUN(test_vocab_files);
    RUN(test_model_file);
    RUN(test_open_errors);
    return check_summary("test_gguf");
}
