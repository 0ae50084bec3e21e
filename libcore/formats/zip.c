/* zip.c -- see zip.h. Layout: PKWARE APPNOTE.TXT sections 4.3.7 (local header), 4.3.12
 * (central directory header), 4.3.14-16 (zip64 end record and locator, end record), 4.5.3
 * (zip64 extra field). */
#include "zip.h"
#include "libcore/base/error.h"
#include "libcore/base/quote.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum {
    SIG_LOCAL = 0x04034b50, SIG_CENTRAL = 0x02014b50, SIG_END = 0x06054b50,
    SIG_END64 = 0x06064b50, SIG_LOC64 = 0x07064b50,
    LOCAL_LEN = 30, CENTRAL_LEN = 46, END_LEN = 22, END64_LEN = 56, LOC64_LEN = 20,
};

static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const unsigned char *p) { return (uint32_t)rd16(p) | (uint32_t)rd16(p + 2) << 16; }
static uint64_t rd64(const unsigned char *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* The central directory's place and entry count. */
typedef struct {
    uint64_t offset, size, entries;
} cdir;

/* Offset of the end-of-central-directory record: the last signature whose comment reaches
 * exactly to the end of the buffer. */
static int find_end(const iflow_zip *z, size_t *pos)
{
    if (z->size < END_LEN)
        return iflow_seterr(IFLOW_EFORMAT, "not a zip archive: '%s' is %zu bytes, too short for "
                            "the end record", z->name, z->size);
    size_t lo = z->size - END_LEN > 0xffff ? z->size - END_LEN - 0xffff : 0;
    for (size_t p = z->size - END_LEN + 1; p-- > lo;)
        if (rd32(z->base + p) == SIG_END && p + END_LEN + rd16(z->base + p + 20) == z->size) {
            *pos = p;
            return 0;
        }
    return iflow_seterr(IFLOW_EFORMAT, "not a zip archive: no end of central directory record "
                        "in '%s'", z->name);
}

/* Zip64: the locator just before the end record points at the zip64 end record. */
static int read_end64(const iflow_zip *z, size_t end, cdir *cd)
{
    if (end < LOC64_LEN || rd32(z->base + end - LOC64_LEN) != SIG_LOC64)
        return 1; /* none */
    uint64_t off = rd64(z->base + end - LOC64_LEN + 8);
    if (off > end - LOC64_LEN || end - LOC64_LEN - off < END64_LEN ||
        rd32(z->base + off) != SIG_END64)
        return iflow_seterr(IFLOW_EFORMAT, "bad zip64 end record at byte %" PRIu64 " in '%s'", off,
                            z->name);
    const unsigned char *p = z->base + off;
    cdir c64 = {rd64(p + 48), rd64(p + 40), rd64(p + 32)};
    /* A 32-bit field that is not the 0xff.. escape must agree with its zip64 value. */
    if ((cd->offset != 0xffffffffu && cd->offset != c64.offset) ||
        (cd->size != 0xffffffffu && cd->size != c64.size) ||
        (cd->entries != 0xffffu && cd->entries != c64.entries))
        return iflow_seterr(IFLOW_EFORMAT, "zip end record and zip64 end record at byte %" PRIu64
                            " disagree in '%s'", off, z->name);
    *cd = c64;
    return 0;
}

static int read_cdir(const iflow_zip *z, cdir *cd, size_t *cd_end)
{
    size_t end = 0;
    int rc = find_end(z, &end);
    if (rc < 0)
        return rc;
    const unsigned char *p = z->base + end;
    if (rd16(p + 4) != 0 || rd16(p + 6) != 0)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "multi-disk zip archive '%s'", z->name);
    cd->entries = rd16(p + 10);
    cd->size = rd32(p + 12);
    cd->offset = rd32(p + 16);
    *cd_end = end;
    if ((rc = read_end64(z, end, cd)) < 0)
        return rc;
    if (rc == 0)
        *cd_end = end - LOC64_LEN; /* the zip64 end record sits between; bound loosely */
    if (cd->offset > *cd_end || cd->size > *cd_end - cd->offset)
        return iflow_seterr(IFLOW_EFORMAT, "zip central directory [%" PRIu64 ", +%" PRIu64 ") lies "
                            "outside '%s' (%zu bytes)", cd->offset, cd->size, z->name, z->size);
    if (cd->entries > cd->size / CENTRAL_LEN)
        return iflow_seterr(IFLOW_EFORMAT, "zip central directory of %" PRIu64 " bytes cannot "
                            "hold %" PRIu64 " entries in '%s'", cd->size, cd->entries, z->name);
    return 0;
}

/* Replace 0xffffffff sizes/offset with their values from the zip64 extra field. */
static int read_zip64_extra(const iflow_zip *z, const unsigned char *extra, size_t len,
                            uint64_t *usize, uint64_t *size, uint64_t *loc, uint64_t at)
{
    while (len >= 4) {
        uint16_t id = rd16(extra), n = rd16(extra + 2);
        if (n > len - 4)
            break;
        if (id == 0x0001) {
            const unsigned char *f = extra + 4;
            uint64_t *fields[3] = {usize, size, loc};
            for (int i = 0; i < 3; i++) {
                if (*fields[i] != 0xffffffffu)
                    continue;
                if (f + 8 > extra + 4 + n)
                    return iflow_seterr(IFLOW_EFORMAT, "short zip64 extra field at byte %" PRIu64
                                        " in '%s'", at, z->name);
                *fields[i] = rd64(f);
                f += 8;
            }
            return 0;
        }
        extra += 4 + n;
        len -= 4 + (size_t)n;
    }
    return 0;
}

/* The local header at m->data_offset (still the header's offset): same name, data inside. */
static int read_local(const iflow_zip *z, iflow_zip_member *m, uint64_t data_end)
{
    uint64_t off = m->data_offset;
    if (off > data_end || data_end - off < LOCAL_LEN || rd32(z->base + off) != SIG_LOCAL)
        return iflow_seterr(IFLOW_EFORMAT, "zip member '%s' has no local header at byte %" PRIu64
                            " in '%s'", iflow_quoten(m->name, m->name_len), off, z->name);
    const unsigned char *p = z->base + off;
    uint64_t start = off + LOCAL_LEN + rd16(p + 26) + rd16(p + 28);
    if (rd16(p + 26) != m->name_len || start > data_end ||
        memcmp(p + LOCAL_LEN, m->name, m->name_len) != 0)
        return iflow_seterr(IFLOW_EFORMAT, "zip member '%s': local header at byte %" PRIu64
                            " does not match the central directory in '%s'",
                            iflow_quoten(m->name, m->name_len), off, z->name);
    if (m->size > data_end - start)
        return iflow_seterr(IFLOW_ETRUNC, "zip member '%s' data [%" PRIu64 ", +%" PRIu64 ") "
                            "runs past the central directory at byte %" PRIu64 " in '%s'",
                            iflow_quoten(m->name, m->name_len), start, m->size, data_end, z->name);
    m->data_offset = start;
    return 0;
}

/* One central directory entry at *pos into m; *pos moves past it. */
static int read_entry(const iflow_zip *z, uint64_t *pos, uint64_t cd_end, iflow_zip_member *m)
{
    uint64_t at = *pos;
    if (cd_end - at < CENTRAL_LEN || rd32(z->base + at) != SIG_CENTRAL)
        return iflow_seterr(IFLOW_EFORMAT, "bad zip central directory entry at byte %" PRIu64
                            " in '%s'", at, z->name);
    const unsigned char *p = z->base + at;
    size_t nl = rd16(p + 28), el = rd16(p + 30), cl = rd16(p + 32);
    if (cd_end - at - CENTRAL_LEN < nl + el + cl)
        return iflow_seterr(IFLOW_EFORMAT, "zip central directory entry at byte %" PRIu64
                            " runs past the directory in '%s'", at, z->name);
    m->name = (const char *)p + CENTRAL_LEN;
    m->name_len = nl;
    m->method = rd16(p + 10);
    m->encrypted = rd16(p + 8) & 1;
    m->size = rd32(p + 20);
    m->usize = rd32(p + 24);
    m->data_offset = rd32(p + 42);
    *pos = at + CENTRAL_LEN + nl + el + cl;
    return read_zip64_extra(z, p + CENTRAL_LEN + nl, el, &m->usize, &m->size, &m->data_offset, at);
}

static int cmp_name(const char *a, size_t la, const char *b, size_t lb)
{
    int c = memcmp(a, b, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

static int by_name(const void *a, const void *b)
{
    const iflow_zip_member *x = a, *y = b;
    return cmp_name(x->name, x->name_len, y->name, y->name_len);
}

static int read_members(iflow_zip *z, const cdir *cd)
{
    z->m = calloc(cd->entries ? cd->entries : 1, sizeof *z->m);
    if (!z->m)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory reading %" PRIu64 " zip entries of '%s'",
                            cd->entries, z->name);
    uint64_t pos = cd->offset, end = cd->offset + cd->size;
    for (uint64_t i = 0; i < cd->entries; i++) {
        int rc = read_entry(z, &pos, end, &z->m[i]);
        if (rc == 0)
            rc = read_local(z, &z->m[i], cd->offset);
        if (rc < 0)
            return rc;
        z->n++;
    }
    qsort(z->m, z->n, sizeof *z->m, by_name);
    for (size_t i = 1; i < z->n; i++)
        if (by_name(&z->m[i - 1], &z->m[i]) == 0)
            return iflow_seterr(IFLOW_EFORMAT, "duplicate zip member '%s' in '%s'",
                                iflow_quoten(z->m[i].name, z->m[i].name_len), z->name);
    return 0;
}

int iflow_zip_parse(iflow_zip *z, const void *buf, size_t n, const char *name)
{
    memset(z, 0, sizeof *z);
    z->name = name;
    z->base = buf;
    z->size = n;
    cdir cd = {0, 0, 0};
    size_t cd_end = 0;
    int rc = read_cdir(z, &cd, &cd_end);
    if (rc == 0)
        rc = read_members(z, &cd);
    if (rc < 0)
        iflow_zip_free(z);
    return rc;
}

void iflow_zip_free(iflow_zip *z)
{
    free(z->m);
    z->m = NULL;
    z->n = 0;
}

const iflow_zip_member *iflow_zip_find(const iflow_zip *z, const char *name)
{
    size_t lo = 0, hi = z->n, len = strlen(name);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = cmp_name(name, len, z->m[mid].name, z->m[mid].name_len);
        if (c == 0)
            return &z->m[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

int iflow_zip_find_stored(const iflow_zip *z, const char *name, const void **data, size_t *size)
{
    const iflow_zip_member *m = iflow_zip_find(z, name);
    if (!m)
        return iflow_seterr(IFLOW_ENOTFOUND, "no member '%s' in zip archive '%s'",
                            iflow_quote(name), z->name);
    if (m->method != 0 || m->encrypted)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "zip member '%s' is %s (method %d) in '%s'; only "
                            "stored members can be read in place", iflow_quote(name),
                            m->encrypted ? "encrypted" : "compressed", m->method, z->name);
    if (m->usize != m->size)
        return iflow_seterr(IFLOW_EFORMAT, "stored zip member '%s' has sizes %" PRIu64 " and %"
                            PRIu64 " in '%s'", iflow_quote(name), m->size, m->usize, z->name);
    *data = z->base + m->data_offset;
    *size = (size_t)m->size;
    return 0;
}
