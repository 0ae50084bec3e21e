/*
 * test_pickle.c -- pickle.h and zip.h: xs-ckpt/ckpt.pt against NAMES.txt and the llama2.c
 * export model.bin; hand-assembled checkpoints for the edge cases and the refusals.
 */
#include "check.h"
#include "testlib.h"

#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/base/jsonutil.h"
#include "libcore/formats/pickle.h"
#include "libcore/formats/safetensors.h"
#include "libcore/formats/zip.h"
#include "tests/zipwrite.h"

#include <stdint.h>


/* ---- the real checkpoint ------------------------------------------------------------------- */

/* Every NAMES.txt row: "model.<name>" has that dtype, shape and storage member. */
static void check_names_txt(const iflow_pt *pt)
{
    const char *np = test_data("models/xs-ckpt/NAMES.txt");
    FILE *f = np ? fopen(np, "r") : NULL;
    if (!f) {
        CHECK(0, "cannot read NAMES.txt");
        return;
    }
    char line[512];
    int rows = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        char name[128], dtype[16], shape[64], member[64], full[160];
        if (sscanf(line, "%127[^\t]\t%15[^\t]\t%63[^\t]\t%63[^\t]", name, dtype, shape, member) != 4)
            continue;
        rows++;
        snprintf(full, sizeof full, "model.%s", name);
        const iflow_strided_tensor *t = iflow_pt_find(pt, full);
        CHECK(t != NULL, "no tensor %s", full);
        if (!t)
            continue;
        char got[64];
        int len = snprintf(got, sizeof got, "[");
        for (int d = 0; d < t->t.n_dims; d++)
            len += snprintf(got + len, sizeof got - (size_t)len, "%s%lld", d ? ", " : "",
                            (long long)t->t.shape[d]);
        snprintf(got + len, sizeof got - (size_t)len, "]");
        CHECK(strcmp(got, shape) == 0, "%s shape %s, want %s", full, got, shape);
        CHECK(strcmp(dtype, "float32") == 0 && t->t.dtype == IFLOW_DT_F32, "%s dtype", full);
        CHECK(strcmp(t->storage, member) == 0, "%s member %s, want %s", full, t->storage, member);
        CHECK(t->contiguous && t->storage_offset == 0 && t->t.data == t->storage_data, "%s view",
              full);
    }
    fclose(f);
    CHECK(rows == 48, "%d NAMES.txt rows", rows);
}

/* The 47 exported tensors equal model.bin (llama2.c order, same Meta q/k order). */
static void check_against_bin(const iflow_pt *pt)
{
    const char *bp = test_data("models/xs-ckpt/model.bin");
    size_t bn;
    unsigned char *bin = bp ? test_read_file(bp, &bn) : NULL;
    if (!bin) {
        CHECK(0, "cannot read model.bin");
        return;
    }
    static const char *const per_layer[] = {
        "attention_norm.weight", "attention.wq.weight", "attention.wk.weight",
        "attention.wv.weight", "attention.wo.weight", "ffn_norm.weight",
        "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight",
    };
    size_t off = 28;
    char name[128];
    const iflow_strided_tensor *t = iflow_pt_find(pt, "model.tok_embeddings.weight");
    int same = t && off + t->t.nbytes <= bn && memcmp(bin + off, t->t.data, t->t.nbytes) == 0;
    off += t ? t->t.nbytes : 0;
    for (int k = 0; k < 9; k++) /* llama2.c groups each kind over all layers */
        for (int l = 0; l < 5; l++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, per_layer[k]);
            t = iflow_pt_find(pt, name);
            same &= t && off + t->t.nbytes <= bn && memcmp(bin + off, t->t.data, t->t.nbytes) == 0;
            off += t ? t->t.nbytes : 0;
        }
    t = iflow_pt_find(pt, "model.norm.weight");
    same &= t && off + t->t.nbytes <= bn && memcmp(bin + off, t->t.data, t->t.nbytes) == 0;
    CHECK(same, "ckpt.pt tensors differ from model.bin");
    free(bin);
}

static void test_xs_ckpt(void)
{
    const char *path = test_data("models/xs-ckpt/ckpt.pt");
    if (!path)
        SKIP("no xs-ckpt/ckpt.pt");
    iflow_pt *pt;
    int rc = iflow_pt_open(&pt, path);
    CHECK(rc == 0, "%s", iflow_errmsg());
    if (rc < 0)
        return;
    /* 48 model entries + 47 x (step, exp_avg, exp_avg_sq) + best_val_loss */
    CHECK(iflow_pt_n_tensors(pt) == 190, "%zu tensors", iflow_pt_n_tensors(pt));
    check_names_txt(pt);
    check_against_bin(pt);
    const iflow_strided_tensor *emb = iflow_pt_find(pt, "model.tok_embeddings.weight"),
                               *out = iflow_pt_find(pt, "model.output.weight");
    CHECK(emb && out && emb->t.data == out->t.data, "tied output shares the storage");
    const iflow_strided_tensor *loss = iflow_pt_find(pt, "best_val_loss");
    float v = 0;
    if (loss && loss->t.nbytes == 4)
        memcpy(&v, loss->t.data, 4);
    CHECK(loss && loss->t.n_dims == 0 && v == 1.9282231330871582f, "best_val_loss %g", v);
    const iflow_strided_tensor *m = iflow_pt_find(pt, "optimizer.state.1.exp_avg");
    CHECK(m && m->t.n_dims == 2 && m->t.shape[0] == 64 && m->t.shape[1] == 64, "adam moment");
    const json_t *data = iflow_pt_data(pt);
    CHECK(iflow_json_int(data, "iter_num", 0) == 500, "iter_num");
    CHECK(iflow_json_int(data, "model_args.n_kv_heads", 0) == 4, "model_args");
    CHECK(iflow_json_number(data, "config.beta2", 0) == 0.95, "config");
    CHECK(strcmp(iflow_json_string(data, "model.norm.weight.__tensor__", ""), "model.norm.weight")
              == 0, "tensor marker");
    CHECK(iflow_pt_tensor(pt, 0) == emb && iflow_pt_tensor(pt, 190) == NULL, "order");
    CHECK(iflow_pt_find(pt, "model") == NULL && iflow_pt_find(pt, "zzz") == NULL, "find");
    for (size_t i = 0; i < iflow_pt_n_tensors(pt); i++)
        iflow_pt_release(pt, iflow_pt_tensor(pt, i));
    CHECK(emb && memcmp(emb->t.data, out->t.data, emb->t.nbytes) == 0, "readable after release");

    /* The same weights as the HF folder (v_proj needs no RoPE permutation). */
    iflow_st *st;
    const char *hf = test_data("models/xs-ckpt/hf/model.safetensors");
    if (hf && iflow_st_open(&st, hf) == 0) {
        const iflow_src_tensor *a = iflow_st_find(st, "model.layers.3.self_attn.v_proj.weight");
        const iflow_strided_tensor *b = iflow_pt_find(pt, "model.layers.3.attention.wv.weight");
        CHECK(a && b && a->nbytes == b->t.nbytes && memcmp(a->data, b->t.data, a->nbytes) == 0,
              "v_proj differs from the safetensors");
        iflow_st_close(st);
    }
    iflow_pt_close(pt);
    iflow_pt_close(NULL);
}

static void test_xs_ckpt_truncated(void)
{
    const char *path = test_data("models/xs-ckpt/ckpt.pt");
    size_t n;
    unsigned char *buf = path ? test_read_file(path, &n) : NULL;
    if (!buf)
        SKIP("no xs-ckpt/ckpt.pt");
    const size_t cuts[] = {0, 3, 21, 100, 24488, n / 2, n - 23, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        iflow_pt *pt = (iflow_pt *)1;
        int rc = iflow_pt_open_mem(&pt, buf, cuts[i], "cut.pt");
        CHECK_ERR(rc, IFLOW_EFORMAT, "cut.pt", "not a zip archive");
        CHECK(pt == NULL, "handle left");
    }
    /* A lying central directory offset: the entries are not where it says. */
    unsigned char *copy = malloc(n);
    memcpy(copy, buf, n);
    copy[n - 22 + 16] ^= 0x40;
    iflow_pt *pt;
    int rc = iflow_pt_open_mem(&pt, copy, n, "lie.pt");
    CHECK_ERR(rc, IFLOW_EFORMAT, "lie.pt", "disagree");
    /* A corrupted byte inside data.pkl's opcodes (the 6th byte is a MARK). */
    memcpy(copy, buf, n);
    iflow_zip z;
    const void *pkl = NULL;
    size_t pkl_n;
    if (iflow_zip_parse(&z, buf, n, "x") == 0 &&
        iflow_zip_find_stored(&z, "ckpt/data.pkl", &pkl, &pkl_n) == 0)
        copy[(const unsigned char *)pkl - buf + 5] = 0xff;
    iflow_zip_free(&z);
    CHECK(pkl != NULL, "no ckpt/data.pkl");
    rc = iflow_pt_open_mem(&pt, copy, n, "bad.pt");
    CHECK(rc < 0 && strstr(iflow_errmsg(), "bad.pt") && strstr(iflow_errmsg(), "data.pkl"), "%s",
          iflow_errmsg());
    free(copy);
    free(buf);
}

/* ---- hand-made checkpoints ------------------------------------------------------------------ */

static const float W[6] = {1, 2, 3, 4, 5, 6};

/* A checkpoint a/data.pkl = pickle `pk`, with storages a/data/0 = W (24 bytes) and a/data/1 =
 * 4 bytes, plus a/byteorder. */
static int open_ckpt(iflow_pt **pt, zbuf *pk, zbuf *zip, int method)
{
    static const char le[] = "little";
    zmember m[] = {
        {"a/data.pkl", pk->p, pk->n, method},
        {"a/byteorder", le, 6, 0},
        {"a/data/0", W, sizeof W, 0},
        {"a/data/1", W, 4, 0},
    };
    zip->n = 0;
    zip_write(zip, m, 4);
    return iflow_pt_open_mem(pt, zip->p, zip->n, "t.pt");
}

/* {"w": tensor} with the given view of storage key. */
static void dict_with_tensor(zbuf *pk, const char *type, const char *key, int32_t numel,
                             int32_t offset, const int32_t *size, const int32_t *stride, int nd)
{
    pk->n = 0;
    pk_op(pk, 0x80), pk_op(pk, 2);
    pk_op(pk, '}');
    pk_str(pk, "w");
    pk_tensor(pk, type, key, numel, offset, size, stride, nd);
    pk_op(pk, 's');
    pk_op(pk, '.');
}

static void test_views(void)
{
    zbuf pk = {0}, zip = {0};
    iflow_pt *pt;
    const int32_t s23[] = {2, 3}, d23[] = {3, 1}, t32[] = {3, 2}, dt[] = {1, 3}, s2[] = {2},
                  d2[] = {1}, s0[] = {0, 5}, d0[] = {5, 1};
    /* Contiguous 2x3 view. */
    dict_with_tensor(&pk, "FloatStorage", "0", 6, 0, s23, d23, 2);
    int rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK(rc == 0, "%s", iflow_errmsg());
    if (rc == 0) {
        const iflow_strided_tensor *t = iflow_pt_find(pt, "w");
        CHECK(t && t->contiguous && t->t.nbytes == 24 && t->t.data == t->storage_data &&
                  t->t.shape[0] == 2 && t->t.shape[1] == 3 && t->stride[0] == 3,
              "2x3 view");
        CHECK(strcmp(t->storage, "a/data/0") == 0 && t->storage_nbytes == 24, "storage");
        iflow_pt_close(pt);
    }
    /* Transposed: strided, so no flat data. */
    dict_with_tensor(&pk, "FloatStorage", "0", 6, 0, t32, dt, 2);
    rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK(rc == 0, "%s", iflow_errmsg());
    if (rc == 0) {
        const iflow_strided_tensor *t = iflow_pt_find(pt, "w");
        CHECK(t && !t->contiguous && t->t.data == NULL && t->t.nbytes == 0 &&
                  t->stride[0] == 1 && t->stride[1] == 3,
              "transposed view");
        iflow_pt_close(pt);
    }
    /* Offset view: elements 4..5. */
    dict_with_tensor(&pk, "FloatStorage", "0", 6, 4, s2, d2, 1);
    rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK(rc == 0, "%s", iflow_errmsg());
    if (rc == 0) {
        const iflow_strided_tensor *t = iflow_pt_find(pt, "w");
        float x[2] = {0, 0};
        if (t && t->t.nbytes == 8)
            memcpy(x, t->t.data, 8);
        CHECK(t && t->storage_offset == 4 && x[0] == 5 && x[1] == 6, "offset view");
        iflow_pt_close(pt);
    }
    /* Empty tensor; a bf16 view of 2 elements over the 4-byte storage. */
    dict_with_tensor(&pk, "FloatStorage", "0", 6, 6, s0, d0, 2);
    rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK(rc == 0 && iflow_pt_find(pt, "w")->t.nbytes == 0, "empty: %s", iflow_errmsg());
    iflow_pt_close(rc == 0 ? pt : NULL);
    dict_with_tensor(&pk, "BFloat16Storage", "1", 2, 0, s2, d2, 1);
    rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK(rc == 0 && iflow_pt_find(pt, "w")->t.dtype == IFLOW_DT_BF16 &&
              iflow_pt_find(pt, "w")->t.nbytes == 4,
          "bf16: %s", iflow_errmsg());
    iflow_pt_close(rc == 0 ? pt : NULL);
    dict_with_tensor(&pk, "LongStorage", "0", 3, 0, s2, d2, 1);
    rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK(rc == 0 && iflow_pt_find(pt, "w")->t.dtype == -1 &&
              strcmp(iflow_pt_find(pt, "w")->t.dtype_name, "I64") == 0,
          "int64 recorded: %s", iflow_errmsg());
    iflow_pt_close(rc == 0 ? pt : NULL);
    free(pk.p);
    free(zip.p);
}

static void test_bad_views(void)
{
    zbuf pk = {0}, zip = {0};
    iflow_pt *pt;
    const int32_t s23[] = {2, 3}, d23[] = {3, 1}, s2[] = {2}, d2[] = {1}, d6[] = {6},
                  s9[] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    dict_with_tensor(&pk, "FloatStorage", "0", 6, 1, s23, d23, 2);
    int rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK_ERR(rc, IFLOW_EFORMAT, "t.pt", "tensor view reaches element 6 of storage '0' (6 "
                                         "elements)");
    dict_with_tensor(&pk, "FloatStorage", "0", 6, 0, s2, d6, 1);
    rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK_ERR(rc, IFLOW_EFORMAT, "a/data.pkl", "tensor view reaches element 6");
    dict_with_tensor(&pk, "FloatStorage", "0", 5, 0, s2, d2, 1);
    rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK_ERR(rc, IFLOW_EFORMAT, "a/data/0", "holds 24 bytes, not 5 x 4");
    dict_with_tensor(&pk, "FloatStorage", "7", 6, 0, s2, d2, 1);
    rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK_ERR(rc, IFLOW_ENOTFOUND, "no member 'a/data/7' in zip archive 't.pt'", "storage '7'");
    dict_with_tensor(&pk, "QUInt8Storage", "0", 24, 0, s2, d2, 1);
    rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK_ERR(rc, IFLOW_EUNSUPPORTED, "t.pt", "unsupported storage type 'torch.QUInt8Storage'");
    dict_with_tensor(&pk, "FloatStorage", "0", 6, 0, s9, s9, 9);
    rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK_ERR(rc, IFLOW_EUNSUPPORTED, "t.pt", "more than 8 dimensions");
    pk.n = 0;
    pk_op(&pk, 0x80), pk_op(&pk, 2);
    pk_tensor2(&pk, "FloatStorage", "0", 6, 0, s23, 2, d2, 1);
    pk_op(&pk, '.');
    rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK_ERR(rc, IFLOW_EFORMAT, "t.pt", "size and stride");
    dict_with_tensor(&pk, "FloatStorage", "../x", 6, 0, s2, d2, 1);
    rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK_ERR(rc, IFLOW_EFORMAT, "t.pt", "bad storage key");
    dict_with_tensor(&pk, "FloatStorage", "0", 6, 0, s2, d2, 1);
    rc = open_ckpt(&pt, &pk, &zip, 8);
    CHECK_ERR(rc, IFLOW_EUNSUPPORTED, "t.pt", "zip member 'a/data.pkl' is compressed (method 8)");
    free(pk.p);
    free(zip.p);
}

/* Nothing is ever called: a REDUCE of os.system stays an inert object. */
static void test_no_calls(void)
{
    zbuf pk = {0}, zip = {0};
    pk_op(&pk, 0x80), pk_op(&pk, 2);
    pk_op(&pk, '}');
    pk_str(&pk, "evil");
    pk_global(&pk, "os", "system");
    pk_op(&pk, '(');
    pk_str(&pk, "touch /tmp/iflow-pwned");
    pk_op(&pk, 't');
    pk_op(&pk, 'R');
    pk_op(&pk, 's');
    pk_str(&pk, "obj");
    pk_global(&pk, "builtins", "object");
    pk_op(&pk, ')');
    pk_op(&pk, 0x81); /* NEWOBJ */
    pk_op(&pk, '}');
    pk_op(&pk, 'b'); /* BUILD */
    pk_op(&pk, 's');
    pk_op(&pk, '.');
    iflow_pt *pt;
    remove("/tmp/iflow-pwned");
    int rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK(rc == 0, "%s", iflow_errmsg());
    if (rc == 0) {
        CHECK(strcmp(iflow_json_string(iflow_pt_data(pt), "evil.__object__", ""), "os.system") == 0,
              "opaque object");
        CHECK(strcmp(iflow_json_string(iflow_pt_data(pt), "obj.__object__", ""),
                     "builtins.object") == 0,
              "newobj");
        CHECK(iflow_pt_n_tensors(pt) == 0, "no tensors");
        iflow_pt_close(pt);
    }
    CHECK(access("/tmp/iflow-pwned", F_OK) != 0, "something ran");
    free(pk.p);
    free(zip.p);
}

/* Lists, tuples, int keys, memo sharing, a self-referencing list, text opcodes, LONG1. */
static void test_structures(void)
{
    zbuf pk = {0}, zip = {0};
    const int32_t s2[] = {2}, d2[] = {1};
    pk_op(&pk, 0x80), pk_op(&pk, 2);
    pk_op(&pk, '}');
    pk_op(&pk, '(');
    pk_str(&pk, "l");
    pk_op(&pk, ']');
    pk_op(&pk, 'q'), pk_op(&pk, 1); /* memo 1 = the list */
    pk_op(&pk, '(');
    pk_tensor(&pk, "FloatStorage", "0", 6, 0, s2, d2, 1);
    pk_op(&pk, 'q'), pk_op(&pk, 2); /* memo 2 = the tensor */
    pk_op(&pk, 'h'), pk_op(&pk, 1); /* the list inside itself */
    pk_op(&pk, 'e');
    pk_op(&pk, 'J'), zb_le(&pk, 7, 4); /* int key 7 */
    pk_op(&pk, 'h'), pk_op(&pk, 2);  /* the same tensor again */
    pk_str(&pk, "t");
    pk_op(&pk, 'I'), zb_put(&pk, "01\n", 3);
    pk_op(&pk, 'I'), zb_put(&pk, "-12\n", 4);
    pk_op(&pk, 0x8a), pk_op(&pk, 2), zb_le(&pk, 0xff38, 2); /* LONG1 -200 */
    pk_op(&pk, 0x87);                                       /* TUPLE3 */
    pk_str(&pk, "f");
    pk_op(&pk, 'G');
    zb_put(&pk, "\x3f\xf8\0\0\0\0\0\0", 8); /* 1.5 */
    pk_op(&pk, 'u');
    pk_op(&pk, '.');
    iflow_pt *pt;
    int rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK(rc == 0, "%s", iflow_errmsg());
    if (rc == 0) {
        CHECK(iflow_pt_n_tensors(pt) == 2, "%zu tensors", iflow_pt_n_tensors(pt));
        const iflow_strided_tensor *a = iflow_pt_find(pt, "l.0"), *b = iflow_pt_find(pt, "7");
        CHECK(a && b && a->t.data == b->t.data, "shared tensor under two names");
        const json_t *d = iflow_pt_data(pt);
        const json_t *t = iflow_json_lookup(d, "t");
        CHECK(json_is_array(t) && json_array_size(t) == 3 && json_is_true(json_array_get(t, 0)) &&
                  json_integer_value(json_array_get(t, 1)) == -12 &&
                  json_integer_value(json_array_get(t, 2)) == -200,
              "tuple");
        CHECK(iflow_json_number(d, "f", 0) == 1.5, "float");
        const json_t *l = iflow_json_lookup(d, "l");
        CHECK(json_is_array(l) && json_array_size(l) == 2 && json_is_null(json_array_get(l, 1)),
              "cycle becomes null");
        iflow_pt_close(pt);
    }
    free(pk.p);
    free(zip.p);
}

static void test_bad_pickles(void)
{
    static const struct {
        const char *bytes;
        size_t n;
        int code;
        const char *text;
    } cases[] = {
        {"\x80\x02}q\x00", 5, IFLOW_ETRUNC, "pickle ends without STOP at byte 5"},
        {"\x80\x02}X\x10\x00\x00\x00" "ab", 10, IFLOW_ETRUNC, "pickle ends inside an opcode"},
        {"\x80\x02s.", 4, IFLOW_EFORMAT, "pickle stack underflow at byte 2"},
        {"\x80\x02h\x05.", 5, IFLOW_EFORMAT, "pickle memo key not set at byte 2"},
        {"\x80\x02}}.", 5, IFLOW_EFORMAT, "pickle stack not a single value"},
        {"\x80\x02(.", 4, IFLOW_EFORMAT, "pickle stack not a single value"},
        {"\x80\x02N\xff.", 5, IFLOW_EUNSUPPORTED, "unsupported pickle opcode 0xff at byte 3"},
        {"\x80\x09N.", 4, IFLOW_EUNSUPPORTED, "pickle protocol above 5"},
        {"\x80\x02NN\x86Q.", 7, IFLOW_EUNSUPPORTED, "persistent id that is not a torch storage"},
        {"\x80\x02Nr\xff\xff\xff\xff.", 9, IFLOW_EUNSUPPORTED, "pickle memo key too large"},
        {"\x80\x02(N(u.", 7, IFLOW_EFORMAT, "pickle setitem on a non-dict"},
        {"\x80\x02}(Nu.", 7, IFLOW_EFORMAT, "odd number of items"},
        {"\x80\x02Ncos\nsystem", 14, IFLOW_ETRUNC, "pickle ends inside a text operand"},
        {"\x80\x02NN\x93.", 6, IFLOW_EFORMAT, "STACK_GLOBAL needs two strings"},
        {"\x80\x02Ix\n.", 6, IFLOW_EFORMAT, "bad integer operand"},
    };
    zbuf pk = {0}, zip = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pk.n = 0;
        zb_put(&pk, cases[i].bytes, cases[i].n);
        iflow_pt *pt = (iflow_pt *)1;
        int rc = open_ckpt(&pt, &pk, &zip, 0);
        CHECK_ERR(rc, cases[i].code, "of 'a/data.pkl' in 't.pt'", cases[i].text);
        CHECK(pt == NULL, "handle left");
    }
    /* Values shared so often that naming them would explode: l0 = [x, x], l1 = [l0, l0], ... */
    pk.n = 0;
    pk_op(&pk, 0x80), pk_op(&pk, 2);
    pk_op(&pk, 'N');
    for (int i = 0; i < 40; i++) {
        pk_op(&pk, 'q'), pk_op(&pk, 0);
        pk_op(&pk, 'h'), pk_op(&pk, 0);
        pk_op(&pk, 0x86);
    }
    pk_op(&pk, '.');
    iflow_pt *pt;
    int rc = open_ckpt(&pt, &pk, &zip, 0);
    CHECK_ERR(rc, IFLOW_EFORMAT, "t.pt", "shared too often");
    /* A legacy file and a zip without data.pkl. */
    rc = iflow_pt_open_mem(&pt, "\x80\x02\x8a\x0a", 4, "old.pt");
    CHECK_ERR(rc, IFLOW_EUNSUPPORTED, "old.pt", "legacy");
    zmember m = {"x/other", "hi", 2, 0};
    zip.n = 0;
    zip_write(&zip, &m, 1);
    rc = iflow_pt_open_mem(&pt, zip.p, zip.n, "nopkl.pt");
    CHECK_ERR(rc, IFLOW_EFORMAT, "nopkl.pt", "no data.pkl member");
    /* Big-endian byte order is refused. */
    pk.n = 0;
    zb_put(&pk, "\x80\x02N.", 4);
    zmember be[] = {{"a/data.pkl", pk.p, pk.n, 0}, {"a/byteorder", "big", 3, 0}};
    zip.n = 0;
    zip_write(&zip, be, 2);
    rc = iflow_pt_open_mem(&pt, zip.p, zip.n, "be.pt");
    CHECK_ERR(rc, IFLOW_EUNSUPPORTED, "be.pt", "not little-endian");
    rc = iflow_pt_open(&pt, "/nonexistent/ckpt.pt");
    CHECK_ERR(rc, IFLOW_ENOTFOUND, "/nonexistent/ckpt.pt", "cannot open");
    free(pk.p);
    free(zip.p);
}

static void test_zip(void)
{
    zbuf zip = {0};
    zmember m[] = {{"b", "bbb", 3, 0}, {"a", "aa", 2, 0}, {"c", "c", 1, 8}};
    zip_write(&zip, m, 3);
    iflow_zip z;
    int rc = iflow_zip_parse(&z, zip.p, zip.n, "t.zip");
    CHECK(rc == 0 && z.n == 3, "%s", iflow_errmsg());
    const void *d;
    size_t n;
    CHECK(iflow_zip_find_stored(&z, "a", &d, &n) == 0 && n == 2 && memcmp(d, "aa", 2) == 0, "a");
    CHECK(iflow_zip_find_stored(&z, "b", &d, &n) == 0 && n == 3 && memcmp(d, "bbb", 3) == 0, "b");
    rc = iflow_zip_find_stored(&z, "c", &d, &n);
    CHECK_ERR(rc, IFLOW_EUNSUPPORTED, "t.zip", "zip member 'c' is compressed");
    rc = iflow_zip_find_stored(&z, "d", &d, &n);
    CHECK_ERR(rc, IFLOW_ENOTFOUND, "t.zip", "no member 'd'");
    CHECK(iflow_zip_find(&z, "") == NULL, "empty name");
    iflow_zip_free(&z);
    /* Duplicate member names; a member whose data runs into the directory. */
    zmember dup[] = {{"a", "1", 1, 0}, {"a", "2", 1, 0}};
    zip.n = 0;
    zip_write(&zip, dup, 2);
    rc = iflow_zip_parse(&z, zip.p, zip.n, "dup.zip");
    CHECK_ERR(rc, IFLOW_EFORMAT, "dup.zip", "duplicate zip member 'a'");
    zip.n = 0;
    zip_write(&zip, m, 1);
    zip.p[18] = 100, zip.p[30 + 1 + 3 + 20] = 100; /* sizes in local and central header */
    rc = iflow_zip_parse(&z, zip.p, zip.n, "long.zip");
    CHECK_ERR(rc, IFLOW_ETRUNC, "long.zip", "runs past the central directory");
    rc = iflow_zip_parse(&z, "PK\5\6", 4, "tiny.zip");
    CHECK_ERR(rc, IFLOW_EFORMAT, "tiny.zip", "too short");
    free(zip.p);
}

int main(void)
{
    RUN(test_xs_ckpt);
    RUN(test_xs_ckpt_truncated);
    RUN(test_views);
    RUN(test_bad_views);
    RUN(test_no_calls);
    RUN(test_structures);
    RUN(test_bad_pickles);
    RUN(test_zip);
    return check_summary("test_pickle");
}
