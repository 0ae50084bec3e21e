/* shard.c -- the shard file format: reader (mmap or stream), writer. See shard.h. */
#include "shard.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/base/util.h"
#include "kernels/cpu/pool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#define FILE_HDR   64
#define REC_FIXED  64          /* fixed part of a record header, before the name length */
#define MAX_NAME   4096
#define MAX_HDR    8192
static const char MAGIC[8] = {'I', 'F', 'L', 'O', 'W', 'S', 'H', 'D'};
static const unsigned char ZSTD_MAGIC[4] = {0x28, 0xb5, 0x2f, 0xfd};

static uint64_t align_up(uint64_t n) { return (n + IFLOW_SHARD_ALIGN - 1) & ~(uint64_t)(IFLOW_SHARD_ALIGN - 1); }

/* ===================================================================== record headers ===== */

static int kind_of_tag(const unsigned char *tag)
{
    if (memcmp(tag, "BLOB", 4) == 0) return IFLOW_REC_BLOB;
    if (memcmp(tag, "TNSR", 4) == 0) return IFLOW_REC_TENSOR;
    if (memcmp(tag, "END!", 4) == 0) return IFLOW_REC_END;
    return 0;
}

/* Check the start of a file: n bytes at h. Wrong magic first (a file that is no shard at all),
 * then a header cut short, then the header itself. */
static int check_file_header(const unsigned char *h, size_t n, const char *path)
{
    if (n == 0 || memcmp(h, MAGIC, n < 8 ? n : 8) != 0)
        return iflow_seterr(IFLOW_EFORMAT, "not an iflow shard (bad magic at byte 0): '%s'", path);
    if (n < FILE_HDR)
        return iflow_seterr(IFLOW_ETRUNC, "truncated shard: file header needs 64 bytes, file has %zu in '%s'", n, path);
    if (rd_u32(h + 60) != XXH32(h, 60, 0))
        return iflow_seterr(IFLOW_ECHECKSUM, "corrupt shard file header (checksum mismatch at byte 60) in '%s'", path);
    uint32_t version = rd_u32(h + 8);
    if (version != IFLOW_SHARD_VERSION)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "unsupported shard version %u (this iflow reads %d) in '%s'",
                            version, IFLOW_SHARD_VERSION, path);
    if (rd_u32(h + 12) != FILE_HDR || rd_u32(h + 16) != IFLOW_SHARD_ALIGN)
        return iflow_seterr(IFLOW_EFORMAT, "bad shard header size or alignment at byte 12 in '%s'", path);
    return 0;
}

/* Size of the record header that starts with these 64 bytes, after sanity checks. */
static int rec_header_size(const unsigned char *fixed, uint64_t at, const char *path, uint32_t *size)
{
    uint32_t hs = rd_u32(fixed + 4);
    if (!kind_of_tag(fixed))
        return iflow_seterr(IFLOW_EFORMAT, "bad record tag at byte %llu in '%s'", (unsigned long long)at, path);
    if (hs < REC_FIXED + 8 || hs > MAX_HDR || hs % IFLOW_SHARD_ALIGN)
        return iflow_seterr(IFLOW_EFORMAT, "bad record header size %u at byte %llu in '%s'", hs,
                            (unsigned long long)at, path);
    *size = hs;
    return 0;
}

/* Parse a complete record header (hdr_size bytes at `at`). name is copied into namebuf. */
static int parse_rec_header(const unsigned char *h, uint32_t hs, uint64_t at, const char *path,
                            iflow_shard_rec *rec, char namebuf[MAX_NAME + 1])
{
    if (rd_u32(h + hs - 4) != XXH32(h, hs - 4, 0))
        return iflow_seterr(IFLOW_ECHECKSUM, "corrupt record header at byte %llu in '%s' (checksum mismatch)",
                            (unsigned long long)at, path);
    uint32_t name_len = rd_u32(h + REC_FIXED);
    if (name_len > MAX_NAME || REC_FIXED + 4 + (uint64_t)name_len > hs - 4)
        return iflow_seterr(IFLOW_EFORMAT, "bad name length %u in record at byte %llu in '%s'", name_len,
                            (unsigned long long)at, path);
    memcpy(namebuf, h + REC_FIXED + 4, name_len);
    namebuf[name_len] = 0;
    memset(rec, 0, sizeof *rec);
    rec->name = namebuf;
    rec->kind = kind_of_tag(h);
    rec->nbytes = (size_t)rd_u64(h + 8);
    rec->xxh64 = rd_u64(h + 16);
    rec->dtype = (int)rd_u32(h + 24);
    rec->n_dims = (int)rd_u32(h + 28);
    rec->offset = at + hs;
    if (rd_u64(h + 8) > (uint64_t)SIZE_MAX / 2 || rec->n_dims < 0 || rec->n_dims > IFLOW_SHARD_MAX_DIMS)
        return iflow_seterr(IFLOW_EFORMAT, "bad size or rank in record '%s' at byte %llu in '%s'", namebuf,
                            (unsigned long long)at, path);
    for (int d = 0; d < IFLOW_SHARD_MAX_DIMS; d++) {
        uint64_t v = rd_u64(h + 32 + 8 * d);
        if (v > INT64_MAX / 2)
            return iflow_seterr(IFLOW_EFORMAT, "bad shape in record '%s' at byte %llu in '%s'", namebuf,
                                (unsigned long long)at, path);
        rec->shape[d] = (int64_t)v;
    }
    if (rec->kind == IFLOW_REC_TENSOR) {
        size_t want = iflow_tensor_nbytes(rec->dtype, rec->n_dims, rec->shape);
        if (want == 0 || want == SIZE_MAX || want != rec->nbytes)
            return iflow_seterr(IFLOW_EFORMAT,
                                "tensor '%s' at byte %llu in '%s': %zu data bytes do not fit its type and shape",
                                namebuf, (unsigned long long)at, path, rec->nbytes);
    } else if (rec->kind == IFLOW_REC_END && rec->nbytes != 0) {
        return iflow_seterr(IFLOW_EFORMAT, "end record at byte %llu in '%s' has a payload", (unsigned long long)at, path);
    }
    return 0;
}

static int verify_payload(const iflow_shard_rec *rec, const char *path)
{
    if (XXH64(rec->data, rec->nbytes, 0) != rec->xxh64)
        return iflow_seterr(IFLOW_ECHECKSUM, "checksum mismatch in %s '%s' (data at byte %llu) in '%s'",
                            rec->kind == IFLOW_REC_TENSOR ? "tensor" : "blob", rec->name,
                            (unsigned long long)rec->offset, path);
    return 0;
}

static int check_end(const iflow_shard_rec *end, size_t n_records, const char *path)
{
    if ((uint64_t)end->shape[0] != n_records)
        return iflow_seterr(IFLOW_EFORMAT, "end record of '%s' counts %lld records, found %zu", path,
                            (long long)end->shape[0], n_records);
    return 0;
}

/* ===================================================================== input streams ====== */

/* A sequential byte source: a file descriptor, optionally a zstd stream. */
typedef struct {
    int fd, own_fd, zstd;
    const char *path;
    ZSTD_DCtx *dctx;
    unsigned char *zbuf;
    size_t zlen, zpos;
    int zeof;
    uint64_t pos; /* uncompressed bytes consumed */
    unsigned char head[4];
    size_t nhead, head_pos; /* sniffed bytes not yet consumed (plain streams) */
} instream;

static ssize_t raw_read(instream *in, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(in->fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return iflow_seterr(IFLOW_EIO, "cannot read '%s': %s", in->path, strerror(errno));
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static int in_open(instream *in, const char *path)
{
    memset(in, 0, sizeof *in);
    in->path = path;
    if (strcmp(path, "-") == 0) {
        in->fd = 0;
        in->path = "<stdin>";
    } else {
        in->fd = open(path, O_RDONLY | O_CLOEXEC);
        if (in->fd < 0)
            return iflow_seterr(errno == ENOENT ? IFLOW_ENOTFOUND : IFLOW_EIO, "cannot open '%s': %s", path,
                                strerror(errno));
        in->own_fd = 1;
    }
    ssize_t r = raw_read(in, in->head, 4);
    if (r < 0)
        return (int)r;
    in->nhead = (size_t)r;
    if (r == 4 && memcmp(in->head, ZSTD_MAGIC, 4) == 0) {
        in->zstd = 1;
        in->dctx = ZSTD_createDCtx();
        in->zbuf = malloc(ZSTD_DStreamInSize());
        if (!in->dctx || !in->zbuf)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory opening '%s'", in->path);
        memcpy(in->zbuf, in->head, 4);
        in->zlen = 4;
        in->nhead = 0;
    }
    return 0;
}

static void in_close(instream *in)
{
    if (in->own_fd && in->fd >= 0)
        close(in->fd);
    ZSTD_freeDCtx(in->dctx);
    free(in->zbuf);
    memset(in, 0, sizeof *in);
    in->fd = -1;
}

/* Read up to n bytes; fewer only at end of stream. Returns bytes read or <0. */
static ssize_t in_read(instream *in, void *buf, size_t n)
{
    size_t got = 0;
    if (!in->zstd) {
        while (got < n && in->head_pos < in->nhead)
            ((unsigned char *)buf)[got++] = in->head[in->head_pos++];
        ssize_t r = raw_read(in, (char *)buf + got, n - got);
        if (r < 0)
            return r;
        got += (size_t)r;
        in->pos += got;
        return (ssize_t)got;
    }
    ZSTD_outBuffer out = {buf, n, 0};
    while (out.pos < out.size) {
        if (in->zpos == in->zlen && !in->zeof) {
            ssize_t r = raw_read(in, in->zbuf, ZSTD_DStreamInSize());
            if (r < 0)
                return r;
            in->zlen = (size_t)r;
            in->zpos = 0;
            in->zeof = r == 0;
        }
        size_t before = out.pos;
        ZSTD_inBuffer zin = {in->zbuf, in->zlen, in->zpos};
        size_t ret = ZSTD_decompressStream(in->dctx, &out, &zin);
        in->zpos = zin.pos;
        if (ZSTD_isError(ret))
            return iflow_seterr(IFLOW_EFORMAT, "corrupt zstd stream in '%s' after byte %llu: %s", in->path,
                                (unsigned long long)(in->pos + out.pos), ZSTD_getErrorName(ret));
        if (in->zeof && out.pos == before)
            break; /* no input left and nothing more to flush: the stream ends here */
    }
    in->pos += out.pos;
    return (ssize_t)out.pos;
}

/* Read exactly n bytes or fail with a truncation message naming `what` and the offset. */
static int in_need(instream *in, void *buf, size_t n, const char *what)
{
    uint64_t at = in->pos;
    ssize_t r = in_read(in, buf, n);
    if (r < 0)
        return (int)r;
    if ((size_t)r < n)
        return iflow_seterr(IFLOW_ETRUNC, "truncated shard: %s at byte %llu needs %zu bytes, stream ends at byte %llu in '%s'",
                            what, (unsigned long long)at, n, (unsigned long long)(at + (uint64_t)r), in->path);
    return 0;
}

/* Padding after a payload must be zero: then every byte of a shard is covered by a check. */
static int check_padding(const unsigned char *pad, size_t n, uint64_t at, const char *path)
{
    for (size_t i = 0; i < n; i++)
        if (pad[i])
            return iflow_seterr(IFLOW_EFORMAT, "nonzero padding at byte %llu in '%s'", (unsigned long long)(at + i), path);
    return 0;
}

/* Read and check n bytes of padding. */
static int in_skip(instream *in, size_t n, const char *what)
{
    unsigned char pad[IFLOW_SHARD_ALIGN];
    uint64_t at = in->pos;
    int rc = n ? in_need(in, pad, n, what) : 0;
    return rc ? rc : check_padding(pad, n, at, in->path);
}

/* ===================================================================== streaming reader === */

struct iflow_shard_reader {
    instream in;
    char *path;
    char name[MAX_NAME + 1];
    unsigned char hdr[MAX_HDR];
    void *buf;
    size_t cap;
    size_t n_records;
    int done;
};

int iflow_shard_reader_open(iflow_shard_reader **out, const char *path)
{
    *out = NULL;
    iflow_shard_reader *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path)))
        return free(r), iflow_seterr(IFLOW_ENOMEM, "out of memory opening '%s'", path);
    int rc = in_open(&r->in, r->path);
    unsigned char h[FILE_HDR];
    ssize_t got = rc == 0 ? in_read(&r->in, h, FILE_HDR) : 0;
    if (rc == 0)
        rc = got < 0 ? (int)got : check_file_header(h, (size_t)got, r->in.path);
    if (rc < 0) {
        iflow_shard_reader_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

/* r->buf with room for n bytes (aligned), keeping its first `keep`. */
static int reader_room(iflow_shard_reader *r, size_t n, size_t keep, const iflow_shard_rec *rec)
{
    if (n <= r->cap)
        return 0;
    void *b = aligned_alloc(IFLOW_SHARD_ALIGN, (size_t)align_up(n));
    if (!b)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory reading '%s' (%zu bytes) from '%s'", rec->name, n, r->in.path);
    if (keep)
        memcpy(b, r->buf, keep);
    free(r->buf);
    r->buf = b;
    r->cap = (size_t)align_up(n);
    return 0;
}

#define READ_STEP ((size_t)64 << 20)

/* rec's payload into r->buf, which grows as the bytes arrive (at most doubling, in steps of
 * READ_STEP): a size in a record header, unchecked on a stream of unknown length, cannot make
 * the reader allocate much more than the stream really holds. Room for `padded` at the end. */
static int read_payload(iflow_shard_reader *r, const iflow_shard_rec *rec, size_t padded, const char *what)
{
    size_t have = 0;
    int rc;
    while (have < rec->nbytes) {
        size_t step = rec->nbytes - have < READ_STEP ? rec->nbytes - have : READ_STEP;
        size_t want = have + step;
        if (want > r->cap && want < rec->nbytes && want < 2 * r->cap)
            want = 2 * r->cap < rec->nbytes ? 2 * r->cap : rec->nbytes;
        if ((rc = reader_room(r, want, have, rec)) < 0 || (rc = in_need(&r->in, (char *)r->buf + have, step, what)) < 0)
            return rc;
        have += step;
    }
    return reader_room(r, padded, have, rec);
}

int iflow_shard_reader_next(iflow_shard_reader *r, iflow_shard_rec *rec)
{
    if (r->done)
        return 0;
    uint64_t at = r->in.pos;
    uint32_t hs;
    int rc = in_need(&r->in, r->hdr, REC_FIXED, "record header");
    if (rc == IFLOW_ETRUNC && r->in.pos == at) /* clean end of stream without END! */
        return iflow_seterr(IFLOW_ETRUNC, "truncated shard: no end record after %zu records (stream ends at byte %llu) in '%s'",
                            r->n_records, (unsigned long long)at, r->in.path);
    if (rc == 0)
        rc = rec_header_size(r->hdr, at, r->in.path, &hs);
    if (rc == 0)
        rc = in_need(&r->in, r->hdr + REC_FIXED, hs - REC_FIXED, "record header");
    if (rc == 0)
        rc = parse_rec_header(r->hdr, hs, at, r->in.path, rec, r->name);
    if (rc < 0)
        return rc;
    if (rec->kind == IFLOW_REC_END) {
        r->done = 1;
        return check_end(rec, r->n_records, r->in.path) ? IFLOW_EFORMAT : 0;
    }
    size_t padded = (size_t)align_up(rec->nbytes);
    char what[MAX_NAME + 32];
    snprintf(what, sizeof what, "data of '%s'", rec->name);
    if ((rc = read_payload(r, rec, padded, what)) < 0 || (rc = in_skip(&r->in, padded - rec->nbytes, what)) < 0)
        return rc;
    rec->data = r->buf;
    if ((rc = verify_payload(rec, r->in.path)) < 0)
        return rc;
    r->n_records++;
    return 1;
}

void iflow_shard_reader_close(iflow_shard_reader *r)
{
    if (!r)
        return;
    in_close(&r->in);
    free(r->buf);
    free(r->path);
    free(r);
}

/* ===================================================================== whole-shard reader = */

struct iflow_shard {
    char *path;
    iflow_shard_rec *recs;
    size_t n, cap;
    void *map;          /* mmap of the file, or NULL */
    size_t map_len;
    char *meta;         /* NUL-terminated copy of the meta blob */
};

static int push_rec(iflow_shard *sh, const iflow_shard_rec *rec, const void *data)
{
    if (sh->n == sh->cap) {
        size_t nc = sh->cap ? sh->cap * 2 : 64;
        iflow_shard_rec *nr = realloc(sh->recs, nc * sizeof *nr);
        if (!nr)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory reading '%s'", sh->path);
        sh->recs = nr;
        sh->cap = nc;
    }
    iflow_shard_rec *d = &sh->recs[sh->n];
    *d = *rec;
    d->data = data;
    if (!(d->name = strdup(rec->name)))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory reading '%s'", sh->path);
    sh->n++;
    return 0;
}

/* Walk the records of a mapped file. */
static int open_mapped(iflow_shard *sh, const unsigned char *p, size_t len, int flags)
{
    char name[MAX_NAME + 1];
    iflow_shard_rec rec;
    int rc;
    if ((rc = check_file_header(p, len < FILE_HDR ? len : FILE_HDR, sh->path)) < 0)
        return rc;
    uint64_t at = FILE_HDR;
    for (;;) {
        uint32_t hs;
        if (len - at < REC_FIXED)
            return iflow_seterr(IFLOW_ETRUNC, at == len
                                ? "truncated shard: no end record after %zu records (file ends at byte %llu) in '%s'"
                                : "truncated shard: %zu records, then a partial record header at byte %llu in '%s'",
                                sh->n, (unsigned long long)at, sh->path);
        if ((rc = rec_header_size(p + at, at, sh->path, &hs)) < 0)
            return rc;
        if (len - at < hs)
            return iflow_seterr(IFLOW_ETRUNC, "truncated shard: record header at byte %llu needs %u bytes, file ends at byte %zu in '%s'",
                                (unsigned long long)at, hs, len, sh->path);
        if ((rc = parse_rec_header(p + at, hs, at, sh->path, &rec, name)) < 0)
            return rc;
        if (rec.kind == IFLOW_REC_END) {
            if ((rc = check_end(&rec, sh->n, sh->path)) < 0)
                return rc;
            if (at + hs != len)
                return iflow_seterr(IFLOW_EFORMAT, "trailing bytes after the end record (byte %llu of %zu) in '%s'",
                                    (unsigned long long)(at + hs), len, sh->path);
            return 0;
        }
        if (rec.nbytes > len - rec.offset)
            return iflow_seterr(IFLOW_ETRUNC, "truncated shard: %s '%s' needs %zu bytes at byte %llu, file ends at byte %zu in '%s'",
                                rec.kind == IFLOW_REC_TENSOR ? "tensor" : "blob", rec.name, rec.nbytes,
                                (unsigned long long)rec.offset, len, sh->path);
        rec.data = p + rec.offset;
        if (!(flags & IFLOW_SHARD_NO_VERIFY) && (rc = verify_payload(&rec, sh->path)) < 0)
            return rc;
        if ((rc = push_rec(sh, &rec, rec.data)) < 0)
            return rc;
        at = rec.offset + align_up(rec.nbytes);
        if (at > len)
            return iflow_seterr(IFLOW_ETRUNC, "truncated shard: padding after '%s' runs past the end of '%s'", rec.name, sh->path);
        if ((rc = check_padding(p + rec.offset + rec.nbytes, (size_t)(at - rec.offset - rec.nbytes), rec.offset + rec.nbytes, sh->path)) < 0)
            return rc;
    }
}

/* Read every record of a stream into owned memory. */
static int open_streamed(iflow_shard *sh)
{
    iflow_shard_reader *r;
    iflow_shard_rec rec;
    int rc = iflow_shard_reader_open(&r, sh->path);
    if (rc < 0)
        return rc;
    while ((rc = iflow_shard_reader_next(r, &rec)) == 1) {
        /* Take the reader's buffer; it allocates a fresh one for the next record. */
        void *data = r->buf;
        r->buf = NULL;
        r->cap = 0;
        if ((rc = push_rec(sh, &rec, data)) < 0) {
            free(data);
            break;
        }
    }
    iflow_shard_reader_close(r);
    return rc;
}

static int load_meta(iflow_shard *sh)
{
    const iflow_shard_rec *m = sh->n ? &sh->recs[0] : NULL;
    if (!m || m->kind != IFLOW_REC_BLOB || strcmp(m->name, "meta") != 0)
        return iflow_seterr(IFLOW_EFORMAT, "shard '%s' does not start with its 'meta' record", sh->path);
    if (!(sh->meta = malloc(m->nbytes + 1)))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory reading '%s'", sh->path);
    memcpy(sh->meta, m->data, m->nbytes);
    sh->meta[m->nbytes] = 0;
    return 0;
}

int iflow_shard_open(iflow_shard **out, const char *path, int flags)
{
    *out = NULL;
    iflow_shard *sh = calloc(1, sizeof *sh);
    if (!sh || !(sh->path = strdup(path)))
        return free(sh), iflow_seterr(IFLOW_ENOMEM, "out of memory opening '%s'", path);
    int rc = 0, mapped = 0;
    if (strcmp(path, "-") != 0) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        unsigned char head[4] = {0};
        if (fd < 0) {
            rc = iflow_seterr(errno == ENOENT ? IFLOW_ENOTFOUND : IFLOW_EIO, "cannot open '%s': %s", path, strerror(errno));
        } else if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && pread(fd, head, 4, 0) >= 0 &&
                   memcmp(head, ZSTD_MAGIC, 4) != 0) {
            mapped = 1;
            sh->map_len = (size_t)st.st_size;
            sh->map = st.st_size ? mmap(NULL, sh->map_len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
            if (sh->map == MAP_FAILED) {
                sh->map = NULL;
                rc = iflow_seterr(IFLOW_EIO, "cannot map '%s': %s", path, strerror(errno));
            } else {
                rc = open_mapped(sh, sh->map, sh->map_len, flags);
            }
        }
        if (fd >= 0)
            close(fd);
    }
    if (rc == 0 && !mapped)
        rc = open_streamed(sh);
    if (rc == 0)
        rc = load_meta(sh);
    if (rc < 0) {
        iflow_shard_close(sh);
        return rc;
    }
    *out = sh;
    return 0;
}

void iflow_shard_close(iflow_shard *sh)
{
    if (!sh)
        return;
    for (size_t i = 0; i < sh->n; i++) {
        free((char *)sh->recs[i].name);
        if (!sh->map)
            free((void *)sh->recs[i].data);
    }
    if (sh->map) {
        ifk_pool_quiesce(); /* no kernel thread is still reading the weights (pool.h) */
        munmap(sh->map, sh->map_len);
    }
    free(sh->recs);
    free(sh->meta);
    free(sh->path);
    free(sh);
}

const char *iflow_shard_path(const iflow_shard *sh) { return sh->path; }
const char *iflow_shard_meta(const iflow_shard *sh) { return sh->meta; }
size_t iflow_shard_n_records(const iflow_shard *sh) { return sh->n; }
int iflow_shard_is_mapped(const iflow_shard *sh) { return sh->map != NULL; }

void iflow_shard_release(const iflow_shard *sh, const void *p, size_t n)
{
    if (!sh)
        return;
    const uintptr_t m0 = (uintptr_t)sh->map, m1 = m0 + sh->map_len, pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(pg - 1), b = ((uintptr_t)p + n) & ~(pg - 1);
    if (!sh->map || (uintptr_t)p < m0 || (uintptr_t)p + n > m1 || b <= a)
        return;
    madvise((void *)a, b - a, MADV_DONTNEED); /* read-only and private: nothing is lost */
}

const iflow_shard_rec *iflow_shard_rec_at(const iflow_shard *sh, size_t i)
{
    return i < sh->n ? &sh->recs[i] : NULL;
}

const iflow_shard_rec *iflow_shard_find(const iflow_shard *sh, const char *name)
{
    for (size_t i = 0; i < sh->n; i++)
        if (strcmp(sh->recs[i].name, name) == 0)
            return &sh->recs[i];
    return NULL;
}

/* ===================================================================== writer ============= */

struct iflow_shard_writer {
    int fd;
    char *path;      /* target name ("-" for stdout) */
    char *tmp;       /* temporary file, renamed to path at close; NULL for stdout */
    int direct;      /* fd is path itself, opened as it is (a device or a FIFO: never renamed over) */
    ZSTD_CCtx *cctx;
    unsigned char *zout;
    size_t zout_cap;
    uint64_t pos;    /* uncompressed bytes written */
    size_t n_records;
    int failed;
};

static int raw_write(iflow_shard_writer *w, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t r = write(w->fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            w->failed = 1;
            return iflow_seterr(IFLOW_EIO, "cannot write '%s': %s", w->path, strerror(errno));
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int zstd_pump(iflow_shard_writer *w, const void *buf, size_t n, ZSTD_EndDirective mode)
{
    ZSTD_inBuffer in = {buf, n, 0};
    for (;;) {
        ZSTD_outBuffer out = {w->zout, w->zout_cap, 0};
        size_t left = ZSTD_compressStream2(w->cctx, &out, &in, mode);
        if (ZSTD_isError(left)) {
            w->failed = 1;
            return iflow_seterr(IFLOW_EIO, "zstd compression failed for '%s': %s", w->path, ZSTD_getErrorName(left));
        }
        int rc = raw_write(w, w->zout, out.pos);
        if (rc < 0)
            return rc;
        if (mode == ZSTD_e_continue ? in.pos == in.size : left == 0)
            return 0;
    }
}

static int wbytes(iflow_shard_writer *w, const void *buf, size_t n)
{
    if (w->failed)
        return IFLOW_EIO;
    w->pos += n;
    return w->cctx ? zstd_pump(w, buf, n, ZSTD_e_continue) : raw_write(w, buf, n);
}

static int wpad(iflow_shard_writer *w)
{
    static const unsigned char zeros[IFLOW_SHARD_ALIGN];
    size_t pad = (size_t)(align_up(w->pos) - w->pos);
    return pad ? wbytes(w, zeros, pad) : 0;
}

int iflow_shard_writer_open(iflow_shard_writer **out, const char *path, int flags)
{
    *out = NULL;
    if (!path)
        path = "-";
    iflow_shard_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path)))
        return free(w), iflow_seterr(IFLOW_ENOMEM, "out of memory opening '%s'", path);
    w->fd = 1;
    struct stat st;
    if (strcmp(path, "-") != 0 && stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        /* /dev/null, a FIFO, a terminal: written in place; renaming a temporary file over it
         * would replace the device with a regular file */
        if ((w->fd = open(path, O_WRONLY)) < 0) {
            int e = errno;
            iflow_shard_writer_abort(w);
            return iflow_seterr(IFLOW_EIO, "cannot open '%s': %s", path, strerror(e));
        }
        w->direct = 1;
    } else if (strcmp(path, "-") != 0) {
        size_t n = strlen(path) + 16;
        w->tmp = malloc(n);
        if (!w->tmp)
            return iflow_shard_writer_abort(w), iflow_seterr(IFLOW_ENOMEM, "out of memory opening '%s'", path);
        snprintf(w->tmp, n, "%s.tmp.XXXXXX", path);
        w->fd = mkstemp(w->tmp);
        if (w->fd < 0) {
            int e = errno;
            free(w->tmp);
            w->tmp = NULL;
            iflow_shard_writer_abort(w);
            return iflow_seterr(IFLOW_EIO, "cannot create '%s': %s", path, strerror(e));
        }
        fchmod(w->fd, 0644);
    }
    if (flags & IFLOW_SHARD_ZSTD) {
        w->cctx = ZSTD_createCCtx();
        w->zout_cap = ZSTD_CStreamOutSize();
        w->zout = malloc(w->zout_cap);
        if (!w->cctx || !w->zout)
            return iflow_shard_writer_abort(w), iflow_seterr(IFLOW_ENOMEM, "out of memory opening '%s'", path);
        ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, 3);
    }
    unsigned char h[FILE_HDR] = {0};
    memcpy(h, MAGIC, 8);
    wr_u32(h + 8, IFLOW_SHARD_VERSION);
    wr_u32(h + 12, FILE_HDR);
    wr_u32(h + 16, IFLOW_SHARD_ALIGN);
    wr_u32(h + 60, XXH32(h, 60, 0));
    int rc = wbytes(w, h, FILE_HDR);
    if (rc < 0) {
        iflow_shard_writer_abort(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* Build a record header in h (MAX_HDR bytes); returns its size or <0. */
static int build_header(unsigned char *h, const char *tag, const char *name, int dtype, int n_dims,
                        const int64_t *shape, size_t nbytes, uint64_t xxh)
{
    size_t name_len = strlen(name);
    if (name_len > MAX_NAME)
        return iflow_seterr(IFLOW_EINVAL, "record name too long (%zu bytes): '%.40s...'", name_len, name);
    if (n_dims < 0 || n_dims > IFLOW_SHARD_MAX_DIMS)
        return iflow_seterr(IFLOW_EINVAL, "tensor '%s' has %d dimensions (at most %d)", name, n_dims, IFLOW_SHARD_MAX_DIMS);
    uint32_t hs = (uint32_t)align_up(REC_FIXED + 4 + name_len + 4);
    memset(h, 0, hs);
    memcpy(h, tag, 4);
    wr_u32(h + 4, hs);
    wr_u64(h + 8, nbytes);
    wr_u64(h + 16, xxh);
    wr_u32(h + 24, (uint32_t)dtype);
    wr_u32(h + 28, (uint32_t)n_dims);
    for (int d = 0; d < n_dims; d++)
        wr_u64(h + 32 + 8 * d, (uint64_t)shape[d]);
    wr_u32(h + REC_FIXED, (uint32_t)name_len);
    memcpy(h + REC_FIXED + 4, name, name_len);
    wr_u32(h + hs - 4, XXH32(h, hs - 4, 0));
    return (int)hs;
}

static int write_record(iflow_shard_writer *w, const char *tag, const char *name, int dtype, int n_dims,
                        const int64_t *shape, const void *data, size_t nbytes)
{
    unsigned char h[MAX_HDR];
    int hs = build_header(h, tag, name, dtype, n_dims, shape, nbytes, data ? XXH64(data, nbytes, 0) : XXH64("", 0, 0));
    int rc;
    if (hs < 0)
        return hs;
    if ((rc = wbytes(w, h, (size_t)hs)) < 0 || (nbytes && (rc = wbytes(w, data, nbytes)) < 0) || (rc = wpad(w)) < 0)
        return rc;
    return 0;
}

int iflow_shard_write_blob(iflow_shard_writer *w, const char *name, const void *data, size_t n)
{
    int64_t shape[1] = {(int64_t)n};
    int rc = write_record(w, "BLOB", name, IFLOW_DT_U8, 1, shape, data, n);
    if (rc == 0)
        w->n_records++;
    return rc;
}

int iflow_shard_write_tensor(iflow_shard_writer *w, const char *name, int dtype, int n_dims,
                             const int64_t *shape, const void *data, size_t nbytes)
{
    size_t want = iflow_tensor_nbytes(dtype, n_dims, shape);
    if (want != nbytes)
        return iflow_seterr(IFLOW_EINVAL, "tensor '%s': %zu bytes given, its type and shape need %zu", name, nbytes, want);
    int rc = write_record(w, "TNSR", name, dtype, n_dims, shape, data, nbytes);
    if (rc == 0)
        w->n_records++;
    return rc;
}

int iflow_shard_writer_close(iflow_shard_writer *w)
{
    int64_t count[1] = {(int64_t)w->n_records};
    int rc = write_record(w, "END!", "", IFLOW_DT_U8, 1, count, NULL, 0);
    if (rc == 0 && w->cctx)
        rc = zstd_pump(w, NULL, 0, ZSTD_e_end);
    if (rc == 0 && w->direct) {
        if (close(w->fd) != 0)
            rc = iflow_seterr(IFLOW_EIO, "cannot write '%s': %s", w->path, strerror(errno));
        w->fd = -1;
    }
    if (rc == 0 && w->tmp) {
        if (close(w->fd) != 0)
            rc = iflow_seterr(IFLOW_EIO, "cannot write '%s': %s", w->path, strerror(errno));
        w->fd = -1;
        if (rc == 0 && rename(w->tmp, w->path) != 0)
            rc = iflow_seterr(IFLOW_EIO, "cannot rename '%s' to '%s': %s", w->tmp, w->path, strerror(errno));
        if (rc == 0) {
            free(w->tmp);
            w->tmp = NULL;
        }
    }
    iflow_shard_writer_abort(w); /* frees; removes the temporary if it is still there */
    return rc;
}

void iflow_shard_writer_abort(iflow_shard_writer *w)
{
    if (!w)
        return;
    if (w->direct && w->fd >= 0)
        close(w->fd);
    if (w->tmp) {
        if (w->fd >= 0)
            close(w->fd);
        unlink(w->tmp);
        free(w->tmp);
    }
    ZSTD_freeCCtx(w->cctx);
    free(w->zout);
    free(w->path);
    free(w);
}
