/* imatrix.c -- importance matrices: building, the file format (iflow-imatrix(5)), checking one
 * against a model. See imatrix.h. */
#include "imatrix.h"
#include "libcore/base/error.h"
#include "libcore/base/quote.h"
#include "libcore/base/util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAGIC     "IFIMTX01"
#define END_MAGIC "IFIMEND!"
#define HEADER    24          /* magic, n_entries, reserved, n_tokens */
#define MAX_NAME  255
#define MAX_FILE  ((size_t)1 << 34)

/* ---- building ---------------------------------------------------------------------------- */

int iflow_imatrix_new(iflow_imatrix **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
}

void iflow_imatrix_free(iflow_imatrix *im)
{
    if (!im)
        return;
    for (size_t i = 0; i < im->n; i++) {
        free(im->e[i].name);
        free(im->e[i].mean_sq);
    }
    free(im->e);
    free(im);
}

const iflow_imatrix_entry *iflow_imatrix_find(const iflow_imatrix *im, const char *name)
{
    for (size_t i = 0; im && i < im->n; i++)
        if (strcmp(im->e[i].name, name) == 0)
            return &im->e[i];
    return NULL;
}

int iflow_imatrix_add(iflow_imatrix *im, const char *name, int K, uint64_t count, const float *mean_sq)
{
    size_t len = strlen(name);
    if (len == 0 || len > MAX_NAME)
        return iflow_seterr(IFLOW_EINVAL, "imatrix entry name '%s' is empty or longer than %d bytes", iflow_quote(name),
                            MAX_NAME);
    if (K < 1 || K > IFLOW_IMATRIX_MAX_K)
        return iflow_seterr(IFLOW_EINVAL, "imatrix entry '%s' has %d columns (1..%d)", iflow_quote(name), K,
                            IFLOW_IMATRIX_MAX_K);
    if (iflow_imatrix_find(im, name))
        return iflow_seterr(IFLOW_EINVAL, "imatrix entry '%s' appears twice", iflow_quote(name));
    iflow_imatrix_entry *e = realloc(im->e, (im->n + 1) * sizeof *e);
    if (!e)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    im->e = e;
    e = &im->e[im->n];
    e->name = strdup(name);
    e->mean_sq = malloc((size_t)K * sizeof *e->mean_sq);
    if (!e->name || !e->mean_sq) {
        free(e->name);
        free(e->mean_sq);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    memcpy(e->mean_sq, mean_sq, (size_t)K * sizeof *e->mean_sq);
    e->K = K;
    e->count = count;
    im->n++;
    return 0;
}

/* ---- reading ----------------------------------------------------------------------------- */

/* Does the file hold `need` more bytes at offset `at`? */
static int have(size_t n, size_t at, size_t need, const char *what, const char *where)
{
    if (at > n || n - at < need)
        return iflow_seterr(IFLOW_ETRUNC, "truncated imatrix: %s at byte %zu needs %zu bytes, file ends at byte %zu in '%s'",
                            what, at, need, n, where);
    return 0;
}

static int printable(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return 0;
    return 1;
}

/* One entry at *at; moves *at past it. */
static int parse_entry(iflow_imatrix *im, const uint8_t *p, size_t n, size_t *at, size_t idx, const char *where)
{
    char what[64], name[MAX_NAME + 1];
    snprintf(what, sizeof what, "entry %zu's name length", idx);
    int rc = have(n, *at, 2, what, where);
    if (rc < 0)
        return rc;
    size_t len = (size_t)(p[*at] | p[*at + 1] << 8);
    *at += 2;
    snprintf(what, sizeof what, "entry %zu's name", idx);
    if ((rc = have(n, *at, len, what, where)) < 0)
        return rc;
    if (len == 0 || len > MAX_NAME || !printable((const char *)p + *at, len))
        return iflow_seterr(IFLOW_EFORMAT, "bad imatrix: entry %zu's name at byte %zu ('%s') is empty, longer than %d bytes or not printable in '%s'",
                            idx, *at, iflow_quoten((const char *)p + *at, len), MAX_NAME, where);
    memcpy(name, p + *at, len);
    name[len] = 0;
    *at += len;
    if ((rc = have(n, *at, 12, "the columns and count of an entry", where)) < 0)
        return iflow_seterr(rc, "truncated imatrix: entry '%s' at byte %zu needs 12 bytes for its columns and count, file ends at byte %zu in '%s'",
                            name, *at, n, where);
    uint32_t K = rd_u32(p + *at);
    uint64_t count = rd_u64(p + *at + 4);
    if (K < 1 || K > IFLOW_IMATRIX_MAX_K)
        return iflow_seterr(IFLOW_EFORMAT, "bad imatrix: entry '%s' has %u columns at byte %zu (1..%d) in '%s'", name, K,
                            *at, IFLOW_IMATRIX_MAX_K, where);
    *at += 12;
    if (at[0] > n || (n - *at) / 4 < K)
        return iflow_seterr(IFLOW_ETRUNC, "truncated imatrix: entry '%s' at byte %zu needs %zu bytes for its %u values, file ends at byte %zu in '%s'",
                            name, *at, (size_t)K * 4, K, n, where);
    float *v = malloc((size_t)K * sizeof *v);
    if (!v)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    memcpy(v, p + *at, (size_t)K * 4);
    for (uint32_t k = 0; k < K; k++)
        if (!isfinite(v[k]) || v[k] < 0.0f) {
            double bad = v[k];
            free(v);
            return iflow_seterr(IFLOW_EFORMAT, "bad imatrix: entry '%s' column %u is %g (a mean square: finite, >= 0) in '%s'", name,
                                k, bad, where);
        }
    *at += (size_t)K * 4;
    if (iflow_imatrix_find(im, name)) {
        free(v);
        return iflow_seterr(IFLOW_EFORMAT, "bad imatrix: entry '%s' appears twice in '%s'", name, where);
    }
    rc = iflow_imatrix_add(im, name, (int)K, count, v);
    free(v);
    return rc;
}

int iflow_imatrix_parse(iflow_imatrix **out, const void *buf, size_t n, const char *where)
{
    const uint8_t *p = buf;
    iflow_imatrix *im = NULL;
    *out = NULL;
    if (n < 8 || memcmp(p, MAGIC, 8) != 0)
        return iflow_seterr(IFLOW_EFORMAT, "not an iflow imatrix (bad magic at byte 0): '%s'", where);
    int rc = have(n, 0, HEADER, "the header", where);
    if (rc < 0)
        return rc;
    uint32_t n_entries = rd_u32(p + 8), reserved = rd_u32(p + 12);
    if (reserved != 0)
        return iflow_seterr(IFLOW_EFORMAT, "bad imatrix: reserved field at byte 12 is %u, not 0, in '%s'", reserved, where);
    if (n_entries > (n - HEADER) / 19) /* an entry takes at least 2 + 1 + 12 + 4 bytes */
        return iflow_seterr(IFLOW_ETRUNC, "truncated imatrix: %u entries cannot fit in %zu bytes of '%s'", n_entries, n, where);
    if ((rc = iflow_imatrix_new(&im)) < 0)
        return rc;
    im->n_tokens = rd_u64(p + 16);
    size_t at = HEADER;
    for (uint32_t i = 0; i < n_entries && rc == 0; i++)
        rc = parse_entry(im, p, n, &at, i, where);
    if (rc == 0 && (rc = have(n, at, 8, "the end marker", where)) == 0) {
        if (memcmp(p + at, END_MAGIC, 8) != 0)
            rc = iflow_seterr(IFLOW_EFORMAT, "bad imatrix: no end marker at byte %zu (after %u entries) in '%s'", at, n_entries,
                              where);
        else if (at + 8 != n)
            rc = iflow_seterr(IFLOW_EFORMAT, "bad imatrix: %zu bytes after the end marker at byte %zu in '%s'", n - at - 8, at,
                              where);
    }
    if (rc < 0) {
        iflow_imatrix_free(im);
        return rc;
    }
    *out = im;
    return 0;
}

int iflow_imatrix_load(iflow_imatrix **out, const char *path)
{
    char *data;
    size_t len;
    *out = NULL;
    int rc = iflow_read_file(path, MAX_FILE, &data, &len);
    if (rc < 0)
        return rc;
    rc = iflow_imatrix_parse(out, data, len, path);
    free(data);
    return rc;
}

/* ---- writing ----------------------------------------------------------------------------- */

static int put(FILE *f, const void *p, size_t n)
{
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

int iflow_imatrix_save(const iflow_imatrix *im, const char *path)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return iflow_seterr(IFLOW_EINVAL, "path '%s' is too long", iflow_quote(path));
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return iflow_seterr(IFLOW_EIO, "cannot create '%s': %s", path, strerror(errno));
    uint8_t h[HEADER];
    memcpy(h, MAGIC, 8);
    wr_u32(h + 8, (uint32_t)im->n);
    wr_u32(h + 12, 0);
    wr_u64(h + 16, im->n_tokens);
    int bad = put(f, h, HEADER);
    for (size_t i = 0; i < im->n && !bad; i++) {
        const iflow_imatrix_entry *e = &im->e[i];
        size_t len = strlen(e->name);
        uint8_t l2[2] = {(uint8_t)len, (uint8_t)(len >> 8)}, kc[12];
        wr_u32(kc, (uint32_t)e->K);
        wr_u64(kc + 4, e->count);
        bad = put(f, l2, 2) || put(f, e->name, len) || put(f, kc, 12) || put(f, e->mean_sq, (size_t)e->K * 4);
    }
    bad = bad || put(f, END_MAGIC, 8);
    int err = errno;
    if (fclose(f) != 0 && !bad)
        bad = 1, err = errno;
    if (!bad && rename(tmp, path) != 0)
        bad = 1, err = errno;
    if (bad) {
        unlink(tmp);
        return iflow_seterr(IFLOW_EIO, "cannot write '%s': %s", path, strerror(err));
    }
    return 0;
}

/* ---- against a model --------------------------------------------------------------------- */

int iflow_imatrix_check_model(const iflow_imatrix *im, const char *const *names, const int64_t *cols,
                              const int *mult, size_t n, const char *im_name, const char *model_name)
{
    for (size_t i = 0; i < im->n; i++) {
        const iflow_imatrix_entry *e = &im->e[i];
        size_t k = 0;
        while (k < n && strcmp(names[k], e->name) != 0)
            k++;
        if (k == n || !mult[k])
            return iflow_seterr(IFLOW_EINVAL, "imatrix '%s' has tensor '%s', which is no matrix product of model '%s' (an imatrix of another model?)",
                                im_name, e->name, model_name);
        if (cols[k] != e->K)
            return iflow_seterr(IFLOW_ESHAPE, "imatrix '%s' has %d columns for tensor '%s', model '%s' has %lld (an imatrix of another model?)",
                                im_name, e->K, e->name, model_name, (long long)cols[k]);
    }
    for (size_t k = 0; k < n; k++)
        if (mult[k] == 1 && !iflow_imatrix_find(im, names[k]))
            return iflow_seterr(IFLOW_EINVAL, "imatrix '%s' has no entry for tensor '%s' of model '%s' (an imatrix of another model?)",
                                im_name, names[k], model_name);
    return 0;
}
