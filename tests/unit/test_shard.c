/* test_shard.c -- the shard format: round trips through a file, a stream and zstd; truncation at
 * every offset and every single-byte corruption are detected; the writer leaves nothing behind. */
#include "check.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/formats/shard.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

static char dir[] = "/tmp/iflow-test-shard-XXXXXX";

static const char *path_of(const char *name)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

/* A small shard: meta, a blob, an f32 matrix, an f16 vector, an odd-sized blob. */
static int write_sample(const char *path, int flags)
{
    iflow_shard_writer *w;
    float m[3 * 5];
    uint16_t h[7];
    for (int i = 0; i < 15; i++)
        m[i] = (float)i * 0.25f - 1.0f;
    for (int i = 0; i < 7; i++)
        h[i] = iflow_f32_to_f16((float)i);
    int rc = iflow_shard_writer_open(&w, path, flags);
    if (rc)
        return rc;
    if ((rc = iflow_shard_write_blob(w, "meta", "{\"format\":\"test\"}", 17)) ||
        (rc = iflow_shard_write_blob(w, "notes", "hello", 5)) ||
        (rc = iflow_shard_write_tensor(w, "m", IFLOW_DT_F32, 2, (int64_t[]){3, 5}, m, sizeof m)) ||
        (rc = iflow_shard_write_tensor(w, "h", IFLOW_DT_F16, 1, (int64_t[]){7}, h, sizeof h)) ||
        (rc = iflow_shard_write_blob(w, "odd", "abc", 3))) {
        iflow_shard_writer_abort(w);
        return rc;
    }
    return iflow_shard_writer_close(w);
}

static void check_contents(iflow_shard *sh, const char *how)
{
    CHECK(iflow_shard_n_records(sh) == 5, "%s: %zu records", how, iflow_shard_n_records(sh));
    CHECK(strcmp(iflow_shard_meta(sh), "{\"format\":\"test\"}") == 0, "%s: meta '%s'", how, iflow_shard_meta(sh));
    const iflow_shard_rec *m = iflow_shard_find(sh, "m"), *h = iflow_shard_find(sh, "h");
    CHECK(m && m->dtype == IFLOW_DT_F32 && m->n_dims == 2 && m->shape[0] == 3 && m->shape[1] == 5, "%s: m header", how);
    CHECK(m && ((const float *)m->data)[7] == 0.75f, "%s: m[7]", how);
    CHECK(m && ((uintptr_t)m->data % IFLOW_SHARD_ALIGN) == 0, "%s: payload aligned", how);
    CHECK(h && iflow_f16_to_f32(((const uint16_t *)h->data)[6]) == 6.0f, "%s: h[6]", how);
    CHECK(iflow_shard_find(sh, "nope") == NULL, "%s: find of a missing name", how);
}

static void test_roundtrip_file(void)
{
    iflow_shard *sh;
    CHECK(write_sample(path_of("a.ifs"), 0) == 0, "write: %s", iflow_errmsg());
    CHECK(iflow_shard_open(&sh, path_of("a.ifs"), 0) == 0, "open: %s", iflow_errmsg());
    if (!sh)
        return;
    CHECK(iflow_shard_is_mapped(sh), "a regular file is mapped");
    check_contents(sh, "file");
    iflow_shard_close(sh);
}

static void test_roundtrip_zstd(void)
{
    iflow_shard *sh;
    CHECK(write_sample(path_of("a.ifs.zst"), IFLOW_SHARD_ZSTD) == 0, "write zstd: %s", iflow_errmsg());
    CHECK(iflow_shard_open(&sh, path_of("a.ifs.zst"), 0) == 0, "open zstd: %s", iflow_errmsg());
    if (!sh)
        return;
    CHECK(!iflow_shard_is_mapped(sh), "a zstd file is streamed");
    check_contents(sh, "zstd");
    iflow_shard_close(sh);
}

static void test_stream_reader(void)
{
    iflow_shard_reader *r;
    iflow_shard_rec rec;
    const char *names[] = {"meta", "notes", "m", "h", "odd"};
    int n = 0, rc;
    CHECK(iflow_shard_reader_open(&r, path_of("a.ifs")) == 0, "reader open: %s", iflow_errmsg());
    while ((rc = iflow_shard_reader_next(r, &rec)) == 1) {
        CHECK(n < 5 && strcmp(rec.name, names[n]) == 0, "record %d is '%s'", n, rec.name);
        n++;
    }
    CHECK(rc == 0 && n == 5, "reader ends cleanly after 5 records (rc %d, n %d): %s", rc, n, iflow_errmsg());
    iflow_shard_reader_close(r);
}

/* Opening through mmap and through the stream reader must both fail. */
static int both_fail(const char *path, int *code)
{
    iflow_shard *sh = NULL;
    iflow_shard_reader *r = NULL;
    iflow_shard_rec rec;
    int a = iflow_shard_open(&sh, path, 0), b = iflow_shard_reader_open(&r, path);
    if (b == 0)
        while ((b = iflow_shard_reader_next(r, &rec)) == 1)
            ;
    iflow_shard_close(sh);
    iflow_shard_reader_close(r);
    *code = a;
    return a < 0 && b < 0;
}

static void test_truncation_everywhere(void)
{
    size_t len;
    unsigned char *b = test_read_file(path_of("a.ifs"), &len);
    CHECK(b != NULL, "read back");
    if (!b)
        return;
    int all = 1, code;
    for (size_t cut = 0; cut < len; cut++) {
        test_write_file(path_of("cut.ifs"), b, cut);
        if (!both_fail(path_of("cut.ifs"), &code) || (cut >= 64 && code != IFLOW_ETRUNC)) {
            CHECK(0, "a file cut at %zu of %zu bytes was accepted or misnamed (%s)", cut, len, iflow_errmsg());
            all = 0;
            break;
        }
    }
    CHECK(all, "every truncation is detected");
    free(b);
}

static void test_every_byte_flip(void)
{
    size_t len;
    unsigned char *b = test_read_file(path_of("a.ifs"), &len);
    if (!b)
        return;
    int code;
    for (size_t i = 0; i < len; i++) {
        b[i] ^= 0x10;
        test_write_file(path_of("flip.ifs"), b, len);
        b[i] ^= 0x10;
        if (!both_fail(path_of("flip.ifs"), &code)) {
            CHECK(0, "a flipped byte at offset %zu was not detected", i);
            break;
        }
    }
    CHECK(1, "flips checked");
    free(b);
}

static void test_messages(void)
{
    iflow_shard *sh;
    size_t len;
    unsigned char *b = test_read_file(path_of("a.ifs"), &len);
    if (!b)
        return;
    test_write_file(path_of("t.ifs"), b, len - 64); /* drop the END! record's last bytes */
    CHECK(iflow_shard_open(&sh, path_of("t.ifs"), 0) == IFLOW_ETRUNC, "cut end record");
    CHECK(strstr(iflow_errmsg(), "truncated shard") && strstr(iflow_errmsg(), "t.ifs"), "message: %s", iflow_errmsg());
    b[len - 200] ^= 1; /* inside the 'odd' payload or the last header */
    test_write_file(path_of("c.ifs"), b, len);
    CHECK(iflow_shard_open(&sh, path_of("c.ifs"), 0) < 0, "corruption near the end");
    CHECK(strstr(iflow_errmsg(), "c.ifs") != NULL, "message names the file: %s", iflow_errmsg());
    free(b);
}

static void test_writer_leaves_nothing(void)
{
    iflow_shard_writer *w;
    struct stat st;
    CHECK(iflow_shard_writer_open(&w, path_of("x.ifs"), 0) == 0, "open writer");
    iflow_shard_write_blob(w, "meta", "{}", 2);
    CHECK(iflow_shard_write_tensor(w, "bad", IFLOW_DT_F32, 1, (int64_t[]){4}, "abc", 3) == IFLOW_EINVAL,
          "a size that does not fit the shape is refused");
    iflow_shard_writer_abort(w);
    CHECK(stat(path_of("x.ifs"), &st) != 0, "abort leaves no target file");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ls %s | grep -q tmp", dir);
    CHECK(system(cmd) != 0, "abort leaves no temporary file");
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    RUN(test_roundtrip_file);
    RUN(test_roundtrip_zstd);
    RUN(test_stream_reader);
    RUN(test_truncation_everywhere);
    RUN(test_every_byte_flip);
    RUN(test_messages);
    RUN(test_writer_leaves_nothing);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (!getenv("IFLOW_KEEP_TMP") && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_shard");
}
