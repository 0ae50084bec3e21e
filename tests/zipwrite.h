/*
 * zipwrite.h -- test helpers: a stored-zip writer and a pickle assembler, so unit tests and
 * fuzz targets can build torch.save-like checkpoints in memory. Header-only (static), because
 * each test and fuzz program is built from one source file.
 *
 * zbuf is a growable byte buffer the caller frees (free(b.p)). CRCs are written as 0: iflow's
 * reader does not check them.
 */
#ifndef IFLOW_TESTS_ZIPWRITE_H
#define IFLOW_TESTS_ZIPWRITE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    unsigned char *p;
    size_t n, cap;
} zbuf;

static inline void zb_put(zbuf *b, const void *data, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            abort();
    }
    if (n)
        memcpy(b->p + b->n, data, n);
    b->n += n;
}

static inline void zb_le(zbuf *b, uint64_t x, int k)
{
    unsigned char t[8];
    for (int i = 0; i < k; i++)
        t[i] = (unsigned char)(x >> (8 * i));
    zb_put(b, t, (size_t)k);
}

/* ---- zip ------------------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    const void *data;
    size_t n;
    int method; /* 0 stored; anything else is only labelled so */
} zmember;

static inline void zip_write(zbuf *b, const zmember *m, size_t n)
{
    size_t *off = calloc(n ? n : 1, sizeof *off);
    for (size_t i = 0; i < n; i++) {
        off[i] = b->n;
        zb_le(b, 0x04034b50, 4);
        zb_le(b, 20, 2), zb_le(b, 0, 2), zb_le(b, (uint64_t)m[i].method, 2);
        zb_le(b, 0, 2), zb_le(b, 0, 2), zb_le(b, 0, 4);
        zb_le(b, m[i].n, 4), zb_le(b, m[i].n, 4);
        zb_le(b, strlen(m[i].name), 2), zb_le(b, 0, 2);
        zb_put(b, m[i].name, strlen(m[i].name));
        zb_put(b, m[i].data, m[i].n);
    }
    size_t cd = b->n;
    for (size_t i = 0; i < n; i++) {
        zb_le(b, 0x02014b50, 4);
        zb_le(b, 20, 2), zb_le(b, 20, 2), zb_le(b, 0, 2), zb_le(b, (uint64_t)m[i].method, 2);
        zb_le(b, 0, 2), zb_le(b, 0, 2), zb_le(b, 0, 4);
        zb_le(b, m[i].n, 4), zb_le(b, m[i].n, 4);
        zb_le(b, strlen(m[i].name), 2), zb_le(b, 0, 2), zb_le(b, 0, 2);
        zb_le(b, 0, 2), zb_le(b, 0, 2), zb_le(b, 0, 4), zb_le(b, off[i], 4);
        zb_put(b, m[i].name, strlen(m[i].name));
    }
    size_t cd_size = b->n - cd;
    zb_le(b, 0x06054b50, 4);
    zb_le(b, 0, 2), zb_le(b, 0, 2), zb_le(b, n, 2), zb_le(b, n, 2);
    zb_le(b, cd_size, 4), zb_le(b, cd, 4), zb_le(b, 0, 2);
    free(off);
}

/* ---- pickle --------------------------------------------------------------------------------- */

static inline void pk_op(zbuf *b, int op) { unsigned char c = (unsigned char)op; zb_put(b, &c, 1); }

static inline void pk_str(zbuf *b, const char *s) /* BINUNICODE */
{
    pk_op(b, 'X');
    zb_le(b, strlen(s), 4);
    zb_put(b, s, strlen(s));
}

static inline void pk_int(zbuf *b, int32_t x) /* BININT */
{
    pk_op(b, 'J');
    zb_le(b, (uint32_t)x, 4);
}

static inline void pk_global(zbuf *b, const char *module, const char *name) /* GLOBAL */
{
    pk_op(b, 'c');
    zb_put(b, module, strlen(module));
    pk_op(b, '\n');
    zb_put(b, name, strlen(name));
    pk_op(b, '\n');
}

static inline void pk_ints(zbuf *b, const int32_t *x, int n) /* a tuple of ints */
{
    pk_op(b, '(');
    for (int i = 0; i < n; i++)
        pk_int(b, x[i]);
    pk_op(b, 't');
}

/* _rebuild_tensor_v2(storage(type, key, numel), offset, size, stride, False, OrderedDict()),
 * with n_size and n_stride entries */
static inline void pk_tensor2(zbuf *b, const char *storage_type, const char *key, int32_t numel,
                       int32_t offset, const int32_t *size, int n_size, const int32_t *stride,
                       int n_stride)
{
    pk_global(b, "torch._utils", "_rebuild_tensor_v2");
    pk_op(b, '(');
    pk_op(b, '(');
    pk_str(b, "storage");
    pk_global(b, "torch", storage_type);
    pk_str(b, key);
    pk_str(b, "cpu");
    pk_int(b, numel);
    pk_op(b, 't');
    pk_op(b, 'Q');
    pk_int(b, offset);
    pk_ints(b, size, n_size);
    pk_ints(b, stride, n_stride);
    pk_op(b, 0x89);
    pk_global(b, "collections", "OrderedDict");
    pk_op(b, ')');
    pk_op(b, 'R');
    pk_op(b, 't');
    pk_op(b, 'R');
}

static inline void pk_tensor(zbuf *b, const char *storage_type, const char *key, int32_t numel,
                      int32_t offset, const int32_t *size, const int32_t *stride, int n_dims)
{
    pk_tensor2(b, storage_type, key, numel, offset, size, n_dims, stride, n_dims);
}

#endif
