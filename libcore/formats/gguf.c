/* gguf.c -- see gguf.h. */
#include "gguf.h"
#include "libcore/base/error.h"
#include "libcore/base/strmap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
#define GGUF_HEADER_BYTES 24 /* magic, version, n_tensors, n_kv */

typedef struct {
    char *key;
    uint64_t offset;    /* where the value starts in the file */
    int type;
    int arr_type;       /* -1 unless type == ARR */
    uint64_t count;     /* array elements */
    union {
        uint64_t u;
        int64_t i;
        double f;
    } num;              /* scalars: numbers and bool */
    char *str;          /* STR scalar: NUL-terminated copy */
    uint64_t str_len;
    void *arr;          /* numeric array: aligned copy; string array: iflow_gguf_str[count] */
} gguf_kv;

struct iflow_gguf {
    const uint8_t *buf;
    size_t size;
    void *map;          /* non-NULL when iflow_gguf_open() mapped the file */
    size_t map_len;
    char *name;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t kv_end;    /* byte just past the last key-value entry */
    int64_t n_kv;
    gguf_kv *kv;
    int64_t n_tensors;
    iflow_gguf_tensor *tensors;
    iflow_strmap keys;
    iflow_strmap tensor_names;
};

/* A read position in the buffer; every read checks what is left. */
typedef struct {
    const uint8_t *p;
    size_t size;
    size_t off;
    const char *name;
} cursor;

/* ---- ggml types ------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    uint32_t block;
    uint32_t size;
} ggml_type_info;

static const ggml_type_info ggml_types[] = {
    [0] = {"f32", 1, 4},        [1] = {"f16", 1, 2},         [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},     [6] = {"q5_0", 32, 22},      [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},     [9] = {"q8_1", 32, 36},      [10] = {"q2_k", 256, 84},
    [11] = {"q3_k", 256, 110},  [12] = {"q4_k", 256, 144},   [13] = {"q5_k", 256, 176},
    [14] = {"q6_k", 256, 210},  [15] = {"q8_k", 256, 292},   [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74}, [18] = {"iq3_xxs", 256, 98}, [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},  [21] = {"iq3_s", 256, 110},  [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136},[24] = {"i8", 1, 1},         [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},       [27] = {"i64", 1, 8},        [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},  [30] = {"bf16", 1, 2},       [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},  [39] = {"mxfp4", 32, 17},
};

static const ggml_type_info *ggml_type(uint32_t type)
{
    if (type >= sizeof ggml_types / sizeof ggml_types[0] || !ggml_types[type].name)
        return NULL;
    return &ggml_types[type];
}

const char *iflow_ggml_type_name(uint32_t type)
{
    const ggml_type_info *t = ggml_type(type);
    return t ? t->name : NULL;
}

uint64_t iflow_ggml_nbytes(uint32_t type, uint64_t n)
{
    const ggml_type_info *t = ggml_type(type);
    if (!t || n % t->block)
        return 0;
    uint64_t blocks = n / t->block;
    if (blocks > UINT64_MAX / t->size)
        return UINT64_MAX;
    return blocks * t->size;
}

/* ---- value types -------------------------------------------------------------------------- */

static const char *const type_names[IFLOW_GGUF_TYPE_COUNT_] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64",
};
static const uint8_t type_size[IFLOW_GGUF_TYPE_COUNT_] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *iflow_gguf_type_name(int type)
{
    return type >= 0 && type < IFLOW_GGUF_TYPE_COUNT_ ? type_names[type] : "?";
}

static int is_int_type(int t)
{
    return t == IFLOW_GGUF_U8 || t == IFLOW_GGUF_I8 || t == IFLOW_GGUF_U16 || t == IFLOW_GGUF_I16 ||
           t == IFLOW_GGUF_U32 || t == IFLOW_GGUF_I32 || t == IFLOW_GGUF_U64 || t == IFLOW_GGUF_I64;
}

static int is_signed_type(int t)
{
    return t == IFLOW_GGUF_I8 || t == IFLOW_GGUF_I16 || t == IFLOW_GGUF_I32 || t == IFLOW_GGUF_I64;
}

/* ---- cursor reads ------------------------------------------------------------------------- */

static size_t left(const cursor *c)
{
    return c->size - c->off;
}

static int need(const cursor *c, uint64_t n, const char *what)
{
    if (n <= left(c))
        return 0;
    return iflow_seterr(IFLOW_ETRUNC, "truncated gguf %s at byte %zu in '%s' (need %llu bytes, %zu left)",
                        what, c->off, c->name, (unsigned long long)n, left(c));
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static int rd_uint(cursor *c, int nbytes, uint64_t *v, const char *what)
{
    int rc = need(c, (uint64_t)nbytes, what);
    if (rc < 0)
        return rc;
    *v = le(c->p + c->off, nbytes);
    c->off += (size_t)nbytes;
    return 0;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what)
{
    uint64_t x = 0;
    int rc = rd_uint(c, 4, &x, what);
    *v = (uint32_t)x;
    return rc;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what)
{
    return rd_uint(c, 8, v, what);
}

/* A length-prefixed string: points into the buffer. */
static int rd_str(cursor *c, iflow_gguf_str *s, const char *what)
{
    size_t at = c->off;
    uint64_t len;
    int rc = rd_u64(c, &len, what);
    if (rc < 0)
        return rc;
    if (len > left(c))
        return iflow_seterr(IFLOW_ETRUNC, "truncated gguf %s at byte %zu in '%s' (length %llu, %zu bytes left)",
                            what, at, c->name, (unsigned long long)len, left(c));
    s->ptr = (const char *)c->p + c->off;
    s->len = len;
    c->off += (size_t)len;
    return 0;
}

static char *dup_str(const iflow_gguf_str *s)
{
    char *d = malloc((size_t)s->len + 1);
    if (d) {
        if (s->len)
            memcpy(d, s->ptr, (size_t)s->len);
        d[s->len] = 0;
    }
    return d;
}

static int nomem(const cursor *c, const char *what)
{
    return iflow_seterr(IFLOW_ENOMEM, "out of memory for gguf %s at byte %zu in '%s'", what, c->off, c->name);
}

/* ---- key-value pairs ---------------------------------------------------------------------- */

static int rd_scalar(cursor *c, gguf_kv *kv)
{
    int sz = type_size[kv->type];
    uint64_t v;
    int rc = rd_uint(c, sz, &v, "value");
    if (rc < 0)
        return rc;
    if (kv->type == IFLOW_GGUF_F32) {
        float f;
        uint32_t u = (uint32_t)v;
        memcpy(&f, &u, 4);
        kv->num.f = f;
    } else if (kv->type == IFLOW_GGUF_F64) {
        memcpy(&kv->num.f, &v, 8);
    } else if (is_signed_type(kv->type)) {
        int shift = 64 - 8 * sz;
        kv->num.i = (int64_t)(v << shift) >> shift;
    } else {
        kv->num.u = v;
    }
    return 0;
}

static int rd_string_value(cursor *c, gguf_kv *kv)
{
    iflow_gguf_str s;
    int rc = rd_str(c, &s, "string");
    if (rc < 0)
        return rc;
    kv->str = dup_str(&s);
    kv->str_len = s.len;
    return kv->str ? 0 : nomem(c, "string");
}

static int rd_string_array(cursor *c, gguf_kv *kv)
{
    /* each element takes at least its 8-byte length */
    if (kv->count > left(c) / 8)
        return iflow_seterr(IFLOW_ETRUNC, "truncated gguf array at byte %zu in '%s' (%llu strings, %zu bytes left)",
                            c->off, c->name, (unsigned long long)kv->count, left(c));
    iflow_gguf_str *items = malloc(kv->count ? (size_t)kv->count * sizeof *items : 1);
    if (!items)
        return nomem(c, "string array");
    kv->arr = items;
    for (uint64_t i = 0; i < kv->count; i++) {
        int rc = rd_str(c, &items[i], "string");
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int rd_numeric_array(cursor *c, gguf_kv *kv)
{
    uint64_t esz = type_size[kv->arr_type];
    if (kv->count > left(c) / esz)
        return iflow_seterr(IFLOW_ETRUNC, "truncated gguf array at byte %zu in '%s' (%llu x %llu bytes, %zu left)",
                            c->off, c->name, (unsigned long long)kv->count, (unsigned long long)esz, left(c));
    size_t n = (size_t)(kv->count * esz);
    kv->arr = malloc(n ? n : 1);
    if (!kv->arr)
        return nomem(c, "array");
    if (n)
        memcpy(kv->arr, c->p + c->off, n);
    c->off += n;
    return 0;
}

static int rd_array(cursor *c, gguf_kv *kv)
{
    size_t at = c->off;
    uint32_t et;
    int rc = rd_u32(c, &et, "array type");
    if (rc < 0 || (rc = rd_u64(c, &kv->count, "array count")) < 0)
        return rc;
    if (et >= IFLOW_GGUF_TYPE_COUNT_)
        return iflow_seterr(IFLOW_EFORMAT, "bad gguf array element type %u at byte %zu in '%s'", et, at, c->name);
    if (et == IFLOW_GGUF_ARR)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "nested gguf array at byte %zu in '%s'", at, c->name);
    kv->arr_type = (int)et;
    return et == IFLOW_GGUF_STR ? rd_string_array(c, kv) : rd_numeric_array(c, kv);
}

static int rd_value(cursor *c, gguf_kv *kv)
{
    kv->offset = c->off;
    if (kv->type == IFLOW_GGUF_STR)
        return rd_string_value(c, kv);
    if (kv->type == IFLOW_GGUF_ARR)
        return rd_array(c, kv);
    return rd_scalar(c, kv);
}

static int rd_kv(iflow_gguf *g, cursor *c, gguf_kv *kv)
{
    size_t at = c->off;
    iflow_gguf_str key;
    uint32_t type;
    int rc = rd_str(c, &key, "key");
    if (rc < 0)
        return rc;
    if (!(kv->key = dup_str(&key)))
        return nomem(c, "key");
    if (strlen(kv->key) != key.len)
        return iflow_seterr(IFLOW_EFORMAT, "gguf key with a NUL byte at byte %zu in '%s'", at, c->name);
    if (iflow_strmap_get(&g->keys, kv->key, key.len) >= 0)
        return iflow_seterr(IFLOW_EFORMAT, "duplicate gguf key '%s' at byte %zu in '%s'", kv->key, at, c->name);
    if ((rc = rd_u32(c, &type, "value type")) < 0)
        return rc;
    if (type >= IFLOW_GGUF_TYPE_COUNT_)
        return iflow_seterr(IFLOW_EFORMAT, "bad gguf value type %u for key '%s' at byte %zu in '%s'", type, kv->key,
                            c->off - 4, c->name);
    kv->type = (int)type;
    kv->arr_type = -1;
    if ((rc = rd_value(c, kv)) < 0)
        return rc;
    return iflow_strmap_put(&g->keys, kv->key, key.len, (int32_t)(kv - g->kv)) < 0 ? IFLOW_ENOMEM : 0;
}

static int rd_kvs(iflow_gguf *g, cursor *c)
{
    /* each pair takes at least 8 (key length) + 4 (type) + 1 bytes */
    if ((uint64_t)g->n_kv > left(c) / 13)
        return iflow_seterr(IFLOW_ETRUNC, "truncated gguf header in '%s': %lld key-value pairs cannot fit in %zu bytes",
                            c->name, (long long)g->n_kv, left(c));
    g->kv = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kv);
    if (!g->kv)
        return nomem(c, "key-value table");
    for (int64_t i = 0; i < g->n_kv; i++) {
        int rc = rd_kv(g, c, &g->kv[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- tensor table ------------------------------------------------------------------------- */

static int rd_dims(cursor *c, iflow_gguf_tensor *t, uint64_t *nelem)
{
    size_t at = c->off;
    int rc = rd_u32(c, &t->n_dims, "tensor dims");
    if (rc < 0)
        return rc;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return iflow_seterr(IFLOW_EFORMAT, "bad gguf tensor rank %u for '%s' at byte %zu in '%s'", t->n_dims, t->name,
                            at, c->name);
    *nelem = 1;
    uint64_t bound = 1; /* the product of the nonzero dimensions: so that any product of some fits too */
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if ((uint32_t)d < t->n_dims && (rc = rd_u64(c, &t->ne[d], "tensor shape")) < 0)
            return rc;
        if (t->ne[d] > INT64_MAX || (t->ne[d] && bound > (uint64_t)INT64_MAX / t->ne[d]))
            return iflow_seterr(IFLOW_EFORMAT, "gguf tensor '%s' is too large at byte %zu in '%s'", t->name, at, c->name);
        bound *= t->ne[d] ? t->ne[d] : 1;
        *nelem *= t->ne[d];
    }
    return 0;
}

static int rd_tensor_type(cursor *c, iflow_gguf_tensor *t, uint64_t nelem)
{
    size_t at = c->off;
    int rc = rd_u32(c, &t->type, "tensor type");
    if (rc < 0)
        return rc;
    const ggml_type_info *ti = ggml_type(t->type);
    if (!ti)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "unknown ggml type %u for tensor '%s' at byte %zu in '%s'", t->type,
                            t->name, at, c->name);
    if (t->ne[0] % ti->block)
        return iflow_seterr(IFLOW_EFORMAT, "tensor '%s' row of %llu is not a multiple of the %s block (%u) in '%s'",
                            t->name, (unsigned long long)t->ne[0], ti->name, ti->block, c->name);
    t->nbytes = iflow_ggml_nbytes(t->type, nelem);
    return 0;
}

static int rd_tensor(iflow_gguf *g, cursor *c, iflow_gguf_tensor *t)
{
    size_t at = c->off;
    iflow_gguf_str name;
    uint64_t nelem = 0;
    int rc = rd_str(c, &name, "tensor name");
    if (rc < 0)
        return rc;
    if (!(t->name = dup_str(&name)))
        return nomem(c, "tensor name");
    if (iflow_strmap_get(&g->tensor_names, t->name, name.len) >= 0)
        return iflow_seterr(IFLOW_EFORMAT, "duplicate gguf tensor '%s' at byte %zu in '%s'", t->name, at, c->name);
    if ((rc = rd_dims(c, t, &nelem)) < 0 || (rc = rd_tensor_type(c, t, nelem)) < 0)
        return rc;
    if ((rc = rd_u64(c, &t->offset, "tensor offset")) < 0)
        return rc;
    if (t->offset % g->alignment)
        return iflow_seterr(IFLOW_EFORMAT, "gguf tensor '%s' offset %llu is not a multiple of %llu in '%s'", t->name,
                            (unsigned long long)t->offset, (unsigned long long)g->alignment, c->name);
    return iflow_strmap_put(&g->tensor_names, t->name, name.len, (int32_t)(t - g->tensors)) < 0 ? IFLOW_ENOMEM : 0;
}

static int rd_tensors(iflow_gguf *g, cursor *c)
{
    /* each entry takes at least 8 (name) + 4 (n_dims) + 8 (ne[0]) + 4 (type) + 8 (offset) */
    if ((uint64_t)g->n_tensors > left(c) / 32)
        return iflow_seterr(IFLOW_ETRUNC, "truncated gguf header in '%s': %lld tensors cannot fit in %zu bytes",
                            c->name, (long long)g->n_tensors, left(c));
    g->tensors = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof *g->tensors);
    if (!g->tensors)
        return nomem(c, "tensor table");
    for (int64_t i = 0; i < g->n_tensors; i++) {
        int rc = rd_tensor(g, c, &g->tensors[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Tensor data must lie inside the file; only checked when there are tensors. */
static int check_extents(const iflow_gguf *g)
{
    if (g->n_tensors == 0)
        return 0;
    if (g->data_offset > g->size)
        return iflow_seterr(IFLOW_ETRUNC, "truncated gguf data: section starts at byte %llu past the end (%zu) of '%s'",
                            (unsigned long long)g->data_offset, g->size, g->name);
    uint64_t room = g->size - g->data_offset;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const iflow_gguf_tensor *t = &g->tensors[i];
        if (t->offset > room || t->nbytes > room - t->offset)
            return iflow_seterr(IFLOW_ETRUNC,
                                "truncated tensor data: '%s' in '%s' at byte %llu (need %llu bytes, have %llu)",
                                t->name, g->name, (unsigned long long)(g->data_offset + t->offset),
                                (unsigned long long)t->nbytes,
                                (unsigned long long)(t->offset > room ? 0 : room - t->offset));
    }
    return 0;
}

/* ---- header ------------------------------------------------------------------------------- */

static int rd_header(iflow_gguf *g, cursor *c)
{
    uint64_t nt, nkv;
    if (c->size < 4 || memcmp(c->p, "GGUF", 4) != 0)
        return c->size < 4 ? need(c, 24, "header") :
                             iflow_seterr(IFLOW_EFORMAT, "bad gguf magic at byte 0 in '%s'", c->name);
    c->off = 4;
    int rc = rd_u32(c, &g->version, "version");
    if (rc < 0)
        return rc;
    if (g->version == 0x02000000u || g->version == 0x03000000u)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "big-endian gguf at byte 4 in '%s'", c->name);
    if (g->version != 2 && g->version != 3)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "unsupported gguf version %u at byte 4 in '%s'", g->version, c->name);
    if ((rc = rd_u64(c, &nt, "tensor count")) < 0 || (rc = rd_u64(c, &nkv, "key-value count")) < 0)
        return rc;
    if (nt > INT32_MAX || nkv > INT32_MAX)
        return iflow_seterr(IFLOW_EFORMAT, "bad gguf counts at byte 8 in '%s'", c->name);
    g->n_tensors = (int64_t)nt;
    g->n_kv = (int64_t)nkv;
    return 0;
}

static int read_alignment(iflow_gguf *g)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = iflow_gguf_find_key(g, "general.alignment");
    if (i < 0)
        return 0;
    const gguf_kv *kv = &g->kv[i];
    if (kv->type != IFLOW_GGUF_U32 || kv->num.u == 0 || (kv->num.u & (kv->num.u - 1)))
        return iflow_seterr(IFLOW_EFORMAT, "bad general.alignment at byte %llu in '%s' (a power-of-two u32 is needed)",
                            (unsigned long long)kv->offset, g->name);
    g->alignment = kv->num.u;
    return 0;
}

static int parse(iflow_gguf *g)
{
    cursor c = {g->buf, g->size, 0, g->name};
    int rc;
    if ((rc = rd_header(g, &c)) < 0 || (rc = rd_kvs(g, &c)) < 0)
        return rc;
    g->kv_end = c.off;
    if ((rc = read_alignment(g)) < 0 || (rc = rd_tensors(g, &c)) < 0)
        return rc;
    uint64_t pad = (g->alignment - c.off % g->alignment) % g->alignment;
    g->data_offset = (uint64_t)c.off + pad;
    return check_extents(g);
}

/* ---- open / close ------------------------------------------------------------------------- */

static int gguf_new(iflow_gguf **out, const void *buf, size_t len, const char *name)
{
    iflow_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->name = strdup(name ? name : "<memory>"))) {
        free(g);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory opening '%s'", name ? name : "<memory>");
    }
    g->buf = buf;
    g->size = len;
    *out = g;
    return 0;
}

int iflow_gguf_open_mem(iflow_gguf **out, const void *buf, size_t len, const char *name)
{
    iflow_gguf *g;
    if (!out || (!buf && len))
        return iflow_seterr(IFLOW_EINVAL, "iflow_gguf_open_mem: null argument");
    *out = NULL;
    int rc = gguf_new(&g, buf, len, name);
    if (rc < 0)
        return rc;
    if ((rc = parse(g)) < 0) {
        iflow_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

int iflow_gguf_open_mapped(iflow_gguf **out, void *map, size_t len, const char *name)
{
    iflow_gguf *g;
    *out = NULL;
    int rc = gguf_new(&g, map, len, name);
    if (rc < 0) {
        if (map)
            munmap(map, len);
        return rc;
    }
    g->map = map;
    g->map_len = len;
    if ((rc = parse(g)) < 0) {
        iflow_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

static int map_file(const char *path, void **map, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return iflow_seterr(IFLOW_EIO, "cannot open '%s': %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return iflow_seterr(IFLOW_EIO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return iflow_seterr(IFLOW_EIO, "cannot map '%s': not a regular file", path);
    }
    *len = (size_t)st.st_size;
    *map = NULL;
    if (*len) {
        *map = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (*map == MAP_FAILED) {
            int e = errno;
            close(fd);
            *map = NULL;
            return iflow_seterr(IFLOW_EIO, "cannot map '%s': %s", path, strerror(e));
        }
    }
    close(fd);
    return 0;
}

int iflow_gguf_open(iflow_gguf **out, const char *path)
{
    void *map = NULL;
    size_t len = 0;
    if (!out || !path)
        return iflow_seterr(IFLOW_EINVAL, "iflow_gguf_open: null argument");
    *out = NULL;
    int rc = map_file(path, &map, &len);
    return rc < 0 ? rc : iflow_gguf_open_mapped(out, map, len, path);
}

void iflow_gguf_close(iflow_gguf *g)
{
    if (!g)
        return;
    for (int64_t i = 0; g->kv && i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].str);
        free(g->kv[i].arr);
    }
    for (int64_t i = 0; g->tensors && i < g->n_tensors; i++)
        free((char *)g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    iflow_strmap_free(&g->keys);
    iflow_strmap_free(&g->tensor_names);
    if (g->map)
        munmap(g->map, g->map_len);
    free(g->name);
    free(g);
}

/* ---- accessors ---------------------------------------------------------------------------- */

uint32_t iflow_gguf_version(const iflow_gguf *g) { return g->version; }
const char *iflow_gguf_name(const iflow_gguf *g) { return g->name; }
int64_t iflow_gguf_n_kv(const iflow_gguf *g) { return g->n_kv; }
int64_t iflow_gguf_n_tensors(const iflow_gguf *g) { return g->n_tensors; }
uint64_t iflow_gguf_data_offset(const iflow_gguf *g) { return g->data_offset; }

const void *iflow_gguf_kv_bytes(const iflow_gguf *g, size_t *len)
{
    *len = (size_t)(g->kv_end - GGUF_HEADER_BYTES);
    return g->buf + GGUF_HEADER_BYTES;
}

const void *iflow_gguf_data(const iflow_gguf *g, size_t *len)
{
    if (len)
        *len = g->size;
    return g->buf;
}

int64_t iflow_gguf_find_key(const iflow_gguf *g, const char *key)
{
    return key ? iflow_strmap_get(&g->keys, key, strlen(key)) : -1;
}

static const gguf_kv *kv_at(const iflow_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const char *iflow_gguf_key(const iflow_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv ? kv->key : NULL;
}

int iflow_gguf_kv_type(const iflow_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv ? kv->type : -1;
}

int iflow_gguf_arr_type(const iflow_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv ? kv->arr_type : -1;
}

uint64_t iflow_gguf_arr_count(const iflow_gguf *g, int64_t i)
{
    const gguf_kv *kv = kv_at(g, i);
    return kv && kv->type == IFLOW_GGUF_ARR ? kv->count : 0;
}

/* The entry for key, or NULL with the message set. */
static const gguf_kv *lookup(const iflow_gguf *g, const char *key, int *rc)
{
    const gguf_kv *kv = kv_at(g, iflow_gguf_find_key(g, key));
    if (!kv)
        *rc = iflow_seterr(IFLOW_ENOTFOUND, "missing key '%s' in '%s'", key ? key : "(null)", g->name);
    return kv;
}

static int wrong_type(const iflow_gguf *g, const gguf_kv *kv, const char *want)
{
    const char *have = iflow_gguf_type_name(kv->type);
    if (kv->type == IFLOW_GGUF_ARR)
        return iflow_seterr(IFLOW_EFORMAT, "key '%s' is an array of %s, not %s, in '%s'", kv->key,
                            iflow_gguf_type_name(kv->arr_type), want, g->name);
    return iflow_seterr(IFLOW_EFORMAT, "key '%s' is %s, not %s, in '%s'", kv->key, have, want, g->name);
}

int iflow_gguf_get_str(const iflow_gguf *g, const char *key, const char **s, size_t *len)
{
    int rc = 0;
    const gguf_kv *kv = lookup(g, key, &rc);
    if (!kv)
        return rc;
    if (kv->type != IFLOW_GGUF_STR)
        return wrong_type(g, kv, "str");
    *s = kv->str;
    if (len)
        *len = (size_t)kv->str_len;
    return 0;
}

/* Integer value of kv in [lo, hi]. */
static int get_int(const iflow_gguf *g, const char *key, int64_t lo, uint64_t hi, int64_t *si, uint64_t *ui)
{
    int rc = 0;
    const gguf_kv *kv = lookup(g, key, &rc);
    if (!kv)
        return rc;
    if (!is_int_type(kv->type))
        return wrong_type(g, kv, "an integer");
    int neg = is_signed_type(kv->type) && kv->num.i < 0;
    if (neg && kv->num.i < lo)
        return iflow_seterr(IFLOW_ERANGE, "key '%s' value %lld is out of range in '%s'", key, (long long)kv->num.i, g->name);
    if (!neg && kv->num.u > hi)
        return iflow_seterr(IFLOW_ERANGE, "key '%s' value %llu is out of range in '%s'", key,
                            (unsigned long long)kv->num.u, g->name);
    *si = kv->num.i;
    *ui = kv->num.u;
    return 0;
}

int iflow_gguf_get_u32(const iflow_gguf *g, const char *key, uint32_t *v)
{
    int64_t si;
    uint64_t ui;
    int rc = get_int(g, key, 0, UINT32_MAX, &si, &ui);
    if (rc == 0)
        *v = (uint32_t)ui;
    return rc;
}

int iflow_gguf_get_i32(const iflow_gguf *g, const char *key, int32_t *v)
{
    int64_t si;
    uint64_t ui;
    int rc = get_int(g, key, INT32_MIN, INT32_MAX, &si, &ui);
    if (rc == 0)
        *v = (int32_t)si;
    return rc;
}

int iflow_gguf_get_u64(const iflow_gguf *g, const char *key, uint64_t *v)
{
    int64_t si;
    uint64_t ui;
    int rc = get_int(g, key, 0, UINT64_MAX, &si, &ui);
    if (rc == 0)
        *v = ui;
    return rc;
}

int iflow_gguf_get_f32(const iflow_gguf *g, const char *key, float *v)
{
    int rc = 0;
    const gguf_kv *kv = lookup(g, key, &rc);
    if (!kv)
        return rc;
    if (kv->type != IFLOW_GGUF_F32 && kv->type != IFLOW_GGUF_F64)
        return wrong_type(g, kv, "f32");
    *v = (float)kv->num.f;
    return 0;
}

int iflow_gguf_get_bool(const iflow_gguf *g, const char *key, int *v)
{
    int rc = 0;
    const gguf_kv *kv = lookup(g, key, &rc);
    if (!kv)
        return rc;
    if (kv->type != IFLOW_GGUF_BOOL)
        return wrong_type(g, kv, "bool");
    *v = kv->num.u != 0;
    return 0;
}

static const gguf_kv *lookup_arr(const iflow_gguf *g, const char *key, int elem, const char *want, int *rc)
{
    const gguf_kv *kv = lookup(g, key, rc);
    if (kv && (kv->type != IFLOW_GGUF_ARR || (elem >= 0 && kv->arr_type != elem))) {
        *rc = wrong_type(g, kv, want);
        return NULL;
    }
    return kv;
}

int iflow_gguf_get_arr_str(const iflow_gguf *g, const char *key, const iflow_gguf_str **items, size_t *n)
{
    int rc = 0;
    const gguf_kv *kv = lookup_arr(g, key, IFLOW_GGUF_STR, "an array of str", &rc);
    if (!kv)
        return rc;
    *items = kv->arr;
    *n = (size_t)kv->count;
    return 0;
}

int iflow_gguf_get_arr_i32(const iflow_gguf *g, const char *key, const int32_t **v, size_t *n)
{
    int rc = 0;
    const gguf_kv *kv = lookup_arr(g, key, IFLOW_GGUF_I32, "an array of i32", &rc);
    if (!kv)
        return rc;
    *v = kv->arr;
    *n = (size_t)kv->count;
    return 0;
}

int iflow_gguf_get_arr_f32(const iflow_gguf *g, const char *key, const float **v, size_t *n)
{
    int rc = 0;
    const gguf_kv *kv = lookup_arr(g, key, IFLOW_GGUF_F32, "an array of f32", &rc);
    if (!kv)
        return rc;
    *v = kv->arr;
    *n = (size_t)kv->count;
    return 0;
}

int iflow_gguf_get_arr(const iflow_gguf *g, const char *key, int *elem_type, const void **data, size_t *n)
{
    int rc = 0;
    const gguf_kv *kv = lookup_arr(g, key, -1, "an array", &rc);
    if (!kv)
        return rc;
    if (kv->arr_type == IFLOW_GGUF_STR)
        return wrong_type(g, kv, "a numeric array");
    *elem_type = kv->arr_type;
    *data = kv->arr;
    *n = (size_t)kv->count;
    return 0;
}

const iflow_gguf_tensor *iflow_gguf_tensor_at(const iflow_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

int64_t iflow_gguf_find_tensor(const iflow_gguf *g, const char *name)
{
    return name ? iflow_strmap_get(&g->tensor_names, name, strlen(name)) : -1;
}

const void *iflow_gguf_tensor_data(const iflow_gguf *g, int64_t i)
{
    const iflow_gguf_tensor *t = iflow_gguf_tensor_at(g, i);
    return t ? g->buf + g->data_offset + t->offset : NULL;
}
