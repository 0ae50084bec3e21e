/* safetensors.c -- see safetensors.h. */
#include "safetensors.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/base/quote.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct iflow_st {
    char *path;
    const unsigned char *base; /* the whole file */
    size_t size;
    int mapped;                /* base is our mmap (else a borrowed buffer) */
    json_t *header;            /* owns the tensor names */
    const json_t *metadata;
    uint64_t data_start;       /* 8 + N */
    uint64_t data_size;
    iflow_src_tensor *t;       /* in data-offset order */
    size_t n;
    const iflow_src_tensor **by_name; /* into t, sorted by name */
};

/* ---- dtypes ------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    int bits;
    int dt;
} dtypes[] = {
    {"F32", 32, IFLOW_DT_F32},   {"F16", 16, IFLOW_DT_F16},   {"BF16", 16, IFLOW_DT_BF16},
    {"F64", 64, -1},             {"I64", 64, -1},             {"I32", 32, -1},
    {"I16", 16, -1},             {"I8", 8, -1},               {"U64", 64, -1},
    {"U32", 32, -1},             {"U16", 16, -1},             {"U8", 8, -1},
    {"BOOL", 8, -1},             {"F8_E4M3", 8, -1},          {"F8_E5M2", 8, -1},
    {"F8_E8M0", 8, -1},          {"F6_E2M3", 6, -1},          {"F6_E3M2", 6, -1},
    {"F4", 4, -1},               {"C64", 64, -1},
};

static int dtype_index(const char *name)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(name, dtypes[i].name) == 0)
            return (int)i;
    return -1;
}

int iflow_st_dtype_bits(const char *dtype_name)
{
    int i = dtype_name ? dtype_index(dtype_name) : -1;
    return i < 0 ? 0 : dtypes[i].bits;
}

/* ---- small helpers -------------------------------------------------------------------------- */

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* "[512, 64]" into buf. */
static const char *shape_str(char *buf, size_t cap, const iflow_src_tensor *t)
{
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->n_dims && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRId64, d ? ", " : "", t->shape[d]);
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
    return buf;
}

/* A JSON integer >= 0 as uint64, or -1. */
static int get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* ---- header parsing ------------------------------------------------------------------------- */

static int parse_shape(iflow_st *st, iflow_src_tensor *t, const json_t *shape)
{
    if (!json_is_array(shape))
        return iflow_seterr(IFLOW_EFORMAT, "tensor '%s' has no shape array in '%s'",
                            iflow_quote(t->name), st->path);
    size_t nd = json_array_size(shape);
    if (nd > IFLOW_SRC_MAX_DIMS)
        return iflow_seterr(IFLOW_EUNSUPPORTED,
                            "tensor '%s' has %zu dimensions (at most %d supported) in '%s'",
                            iflow_quote(t->name), nd, IFLOW_SRC_MAX_DIMS, st->path);
    t->n_dims = (int)nd;
    for (int d = 0; d < IFLOW_SRC_MAX_DIMS; d++)
        t->shape[d] = 1;
    for (size_t d = 0; d < nd; d++) {
        uint64_t v;
        if (get_u64(json_array_get(shape, d), &v) < 0)
            return iflow_seterr(IFLOW_EFORMAT,
                                "tensor '%s' shape entry %zu is not a non-negative integer in '%s'",
                                iflow_quote(t->name), d, st->path);
        t->shape[d] = (int64_t)v;
    }
    return 0;
}

/* shape product * element size == end - begin, without overflow. */
static int check_size(iflow_st *st, const iflow_src_tensor *t, int bits, uint64_t begin,
                      uint64_t end)
{
    char sh[256];
    uint64_t n = 1, nbits;
    int overflow = 0;
    for (int d = 0; d < t->n_dims; d++)
        overflow |= __builtin_mul_overflow(n, (uint64_t)t->shape[d], &n);
    overflow |= __builtin_mul_overflow(n, (uint64_t)bits, &nbits);
    if (overflow)
        return iflow_seterr(IFLOW_EFORMAT, "tensor '%s' shape %s of %s overflows 64 bits in '%s'",
                            iflow_quote(t->name), shape_str(sh, sizeof sh, t), t->dtype_name,
                            st->path);
    if (nbits % 8)
        return iflow_seterr(IFLOW_EFORMAT,
                            "tensor '%s' shape %s of %s is not a whole number of bytes in '%s'",
                            iflow_quote(t->name), shape_str(sh, sizeof sh, t), t->dtype_name,
                            st->path);
    if (nbits / 8 != end - begin)
        return iflow_seterr(IFLOW_EFORMAT,
                            "tensor '%s' shape %s of %s needs %" PRIu64 " bytes but data_offsets "
                            "[%" PRIu64 ", %" PRIu64 ") hold %" PRIu64 " in '%s'",
                            iflow_quote(t->name), shape_str(sh, sizeof sh, t), t->dtype_name,
                            nbits / 8, begin, end, end - begin, st->path);
    return 0;
}

static int parse_offsets(iflow_st *st, const iflow_src_tensor *t, const json_t *offs,
                         uint64_t *begin, uint64_t *end)
{
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        get_u64(json_array_get(offs, 0), begin) < 0 || get_u64(json_array_get(offs, 1), end) < 0)
        return iflow_seterr(IFLOW_EFORMAT,
                            "tensor '%s' data_offsets is not a pair of non-negative integers "
                            "in '%s'", iflow_quote(t->name), st->path);
    if (*begin > *end)
        return iflow_seterr(IFLOW_EFORMAT,
                            "tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64 ") end before they "
                            "begin in '%s'", iflow_quote(t->name), *begin, *end, st->path);
    if (*end > st->data_size)
        return iflow_seterr(IFLOW_ETRUNC,
                            "tensor '%s' data [%" PRIu64 ", %" PRIu64 ") lies outside the data "
                            "region (%" PRIu64 " bytes) in '%s'",
                            iflow_quote(t->name), *begin, *end, st->data_size, st->path);
    return 0;
}

/* One "name": {dtype, shape, data_offsets} entry into t. */
static int parse_entry(iflow_st *st, iflow_src_tensor *t, const char *name, const json_t *v)
{
    t->name = name;
    if (!json_is_object(v))
        return iflow_seterr(IFLOW_EFORMAT, "tensor '%s' entry is not a json object in '%s'",
                            iflow_quote(name),
                            st->path);
    const json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return iflow_seterr(IFLOW_EFORMAT, "tensor '%s' has no dtype string in '%s'",
                            iflow_quote(name), st->path);
    int di = dtype_index(json_string_value(dt));
    if (di < 0)
        return iflow_seterr(IFLOW_EFORMAT, "tensor '%s' has unknown dtype '%s' in '%s'",
                            iflow_quote(name), iflow_quote(json_string_value(dt)), st->path);
    t->dtype = dtypes[di].dt;
    t->dtype_name = dtypes[di].name;
    int rc = parse_shape(st, t, json_object_get(v, "shape"));
    uint64_t begin = 0, end = 0;
    if (rc == 0)
        rc = parse_offsets(st, t, json_object_get(v, "data_offsets"), &begin, &end);
    if (rc == 0)
        rc = check_size(st, t, dtypes[di].bits, begin, end);
    if (rc < 0)
        return rc;
    t->file_offset = st->data_start + begin;
    t->data = st->base + t->file_offset;
    t->nbytes = (size_t)(end - begin);
    t->file = 0;
    return 0;
}

static int by_offset(const void *a, const void *b)
{
    const iflow_src_tensor *x = a, *y = b;
    if (x->file_offset != y->file_offset)
        return x->file_offset < y->file_offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* After sorting by offset: no non-empty tensor starts before the previous ones end. */
static int check_overlaps(iflow_st *st)
{
    const iflow_src_tensor *last = NULL; /* the non-empty tensor reaching furthest so far */
    for (size_t i = 0; i < st->n; i++) {
        const iflow_src_tensor *t = &st->t[i];
        if (t->nbytes == 0)
            continue;
        if (last && t->file_offset < last->file_offset + last->nbytes) {
            uint64_t b = t->file_offset - st->data_start, lb = last->file_offset - st->data_start;
            return iflow_seterr(IFLOW_EFORMAT,
                                "tensor '%s' data [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%s' "
                                "data [%" PRIu64 ", %" PRIu64 ") in '%s'",
                                iflow_quote(t->name), b, b + t->nbytes, iflow_quote(last->name), lb,
                                lb + last->nbytes, st->path);
        }
        if (!last || t->file_offset + t->nbytes > last->file_offset + last->nbytes)
            last = t;
    }
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const iflow_src_tensor *const *)a)->name,
                  (*(const iflow_src_tensor *const *)b)->name);
}

static int build_name_index(iflow_st *st)
{
    st->by_name = malloc((st->n ? st->n : 1) * sizeof *st->by_name);
    if (!st->by_name)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory indexing %zu tensors of '%s'", st->n,
                            st->path);
    for (size_t i = 0; i < st->n; i++)
        st->by_name[i] = &st->t[i];
    qsort(st->by_name, st->n, sizeof *st->by_name, by_name);
    for (size_t i = 1; i < st->n; i++) /* jansson rejected duplicate keys; keep the invariant */
        if (strcmp(st->by_name[i - 1]->name, st->by_name[i]->name) == 0)
            return iflow_seterr(IFLOW_EFORMAT, "duplicate tensor name '%s' in '%s'",
                                iflow_quote(st->by_name[i]->name), st->path);
    return 0;
}

static int parse_json(iflow_st *st, uint64_t n)
{
    const char *text = (const char *)st->base + 8;
    if (n == 0 || text[0] != '{')
        return iflow_seterr(IFLOW_EFORMAT,
                            "safetensors header does not start with '{' in '%s' at byte 8",
                            st->path);
    json_error_t err;
    st->header = json_loadb(text, (size_t)n, JSON_REJECT_DUPLICATES, &err);
    if (st->header)
        return 0;
    switch (json_error_code(&err)) {
    case json_error_out_of_memory:
        return iflow_seterr(IFLOW_ENOMEM, "out of memory parsing the header of '%s'", st->path);
    case json_error_duplicate_key: {
        /* jansson says: duplicate object key near '"name"' */
        const char *q = strstr(err.text, "near '\"");
        size_t len = q ? strlen(q + 7) : 0;
        if (len >= 2 && q[7 + len - 1] == '\'' && q[7 + len - 2] == '"')
            return iflow_seterr(IFLOW_EFORMAT, "duplicate tensor name '%s' in '%s' at byte "
                                "%" PRIu64, iflow_quoten(q + 7, len - 2), st->path,
                                8 + (uint64_t)err.position);
        return iflow_seterr(IFLOW_EFORMAT, "duplicate tensor name in '%s' at byte %" PRIu64
                            " (%s)", st->path, 8 + (uint64_t)err.position, iflow_quote(err.text));
    }
    default:
        return iflow_seterr(IFLOW_EFORMAT, "malformed json in the header of '%s' at byte "
                            "%" PRIu64 ": %s", st->path, 8 + (uint64_t)err.position,
                            iflow_quote(err.text));
    }
}

static int parse_entries(iflow_st *st)
{
    size_t n = json_object_size(st->header);
    st->t = calloc(n ? n : 1, sizeof *st->t);
    if (!st->t)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory reading %zu tensors of '%s'", n,
                            st->path);
    const char *key;
    json_t *v;
    json_object_foreach(st->header, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(v))
                return iflow_seterr(IFLOW_EFORMAT, "__metadata__ is not a json object in '%s'",
                                    st->path);
            st->metadata = v;
            continue;
        }
        int rc = parse_entry(st, &st->t[st->n], key, v);
        if (rc < 0)
            return rc;
        st->n++;
    }
    return 0;
}

/* Validate base/size as a whole safetensors file. */
static int parse(iflow_st *st)
{
    if (st->size < 8)
        return iflow_seterr(IFLOW_ETRUNC, "truncated safetensors file '%s': %zu bytes, less than "
                            "the 8-byte header length", st->path, st->size);
    uint64_t n = le64(st->base);
    if (n > st->size - 8)
        return iflow_seterr(n > IFLOW_ST_MAX_HEADER ? IFLOW_EFORMAT : IFLOW_ETRUNC,
                            "safetensors header length %" PRIu64 " exceeds file size %zu in '%s'",
                            n, st->size, st->path);
    if (n > IFLOW_ST_MAX_HEADER)
        return iflow_seterr(IFLOW_EFORMAT, "safetensors header length %" PRIu64 " exceeds the "
                            "limit of %" PRIu64 " bytes in '%s'", n, IFLOW_ST_MAX_HEADER,
                            st->path);
    st->data_start = 8 + n;
    st->data_size = st->size - st->data_start;
    int rc = parse_json(st, n);
    if (rc == 0)
        rc = parse_entries(st);
    if (rc < 0)
        return rc;
    qsort(st->t, st->n, sizeof *st->t, by_offset);
    rc = check_overlaps(st);
    return rc < 0 ? rc : build_name_index(st);
}

/* ---- open / close --------------------------------------------------------------------------- */

static iflow_st *st_new(const char *path)
{
    iflow_st *st = calloc(1, sizeof *st);
    if (st && !(st->path = strdup(path))) {
        free(st);
        st = NULL;
    }
    if (!st)
        iflow_seterr(IFLOW_ENOMEM, "out of memory opening '%s'", path);
    return st;
}

/* Parse st; on failure close it. */
static int finish_open(iflow_st **out, iflow_st *st)
{
    int rc = parse(st);
    if (rc < 0) {
        iflow_st_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

int iflow_st_open_mem(iflow_st **out, const void *buf, size_t n, const char *name)
{
    *out = NULL;
    iflow_st *st = st_new(name ? name : "(memory)");
    if (!st)
        return IFLOW_ENOMEM;
    st->base = buf;
    st->size = n;
    return finish_open(out, st);
}

/* mmap the regular file at path into st. */
static int map_file(iflow_st *st)
{
    int fd = open(st->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return iflow_seterr(errno == ENOENT ? IFLOW_ENOTFOUND : IFLOW_EIO, "cannot open '%s': %s",
                            st->path, strerror(errno));
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) < 0)
        rc = iflow_seterr(IFLOW_EIO, "cannot stat '%s': %s", st->path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        rc = iflow_seterr(IFLOW_EINVAL, "'%s' is not a regular file", st->path);
    else if ((uint64_t)sb.st_size > SIZE_MAX)
        rc = iflow_seterr(IFLOW_ERANGE, "'%s' is too large to map", st->path);
    if (rc == 0 && sb.st_size > 0) {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            rc = iflow_seterr(IFLOW_EIO, "cannot map '%s': %s", st->path, strerror(errno));
        } else {
            st->base = p;
            st->size = (size_t)sb.st_size;
            st->mapped = 1;
        }
    }
    close(fd);
    return rc;
}

int iflow_st_open(iflow_st **out, const char *path)
{
    *out = NULL;
    iflow_st *st = st_new(path);
    if (!st)
        return IFLOW_ENOMEM;
    int rc = map_file(st);
    if (rc < 0) {
        iflow_st_close(st);
        return rc;
    }
    return finish_open(out, st);
}

void iflow_st_close(iflow_st *st)
{
    if (!st)
        return;
    if (st->mapped)
        munmap((void *)st->base, st->size);
    json_decref(st->header);
    free(st->t);
    free(st->by_name);
    free(st->path);
    free(st);
}

/* ---- queries -------------------------------------------------------------------------------- */

const char *iflow_st_path(const iflow_st *st) { return st->path; }
size_t iflow_st_n_tensors(const iflow_st *st) { return st->n; }
const json_t *iflow_st_metadata(const iflow_st *st) { return st->metadata; }

const iflow_src_tensor *iflow_st_tensor(const iflow_st *st, size_t i)
{
    return i < st->n ? &st->t[i] : NULL;
}

const iflow_src_tensor *iflow_st_find(const iflow_st *st, const char *name)
{
    size_t lo = 0, hi = st->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const iflow_src_tensor *t = st->by_name[mid];
        int c = strcmp(name, t->name);
        if (c == 0)
            return t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

void iflow_st_release(iflow_st *st, const iflow_src_tensor *t)
{
    if (!st->mapped || !t || t->nbytes == 0)
        return;
    const unsigned char *p = t->data;
    if (p < st->base || p + t->nbytes > st->base + st->size)
        return; /* not ours */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t lo = (size_t)(p - st->base) / page * page;
    size_t hi = (size_t)(p - st->base) + t->nbytes;
    hi = (hi + page - 1) / page * page;
    if (hi > st->size)
        hi = st->size;
    /* Pages shared with neighbouring tensors go too: they are clean file pages, re-read on use. */
    madvise((void *)(st->base + lo), hi - lo, MADV_DONTNEED);
}
