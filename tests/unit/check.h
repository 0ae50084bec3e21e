/*
 * check.h -- the unit tests' tiny harness.
 *
 * A test file defines  static void test_xxx(void)  functions and a main() that calls
 * RUN(test_xxx) for each, then returns check_summary(). CHECK(cond, fmt, ...) records one
 * assertion; a failed one prints "FAIL file:line: message" to stderr. check_summary() prints
 * "<program>: N passed, N failed" and returns the exit status (0 when nothing failed).
 * SKIP(fmt, ...) inside a test reports why it could not run (missing test data) and returns.
 *
 * rnd_u32(), rnd_unit() and rnd_normal() give the same "random" numbers on every run.
 * test_data(rel) returns the absolute path of "$IFLOW_TEST_DATA/rel" (default ../shared) in a
 * static buffer, or NULL if that file does not exist; test_fixture(rel) the committed
 * tests/fixtures/rel likewise. test_read_file() and test_write_file() move whole files.
 * CHECK_ERR(rc, want, where, text) checks a libiflow error code and its message (where it is
 * used, iflow_errmsg() and iflow_strerror() must be declared: include/iflow.h or
 * libcore/base/error.h). SANITIZED is 1 in an AddressSanitizer build (gcc or clang): for
 * what is too slow there, or a time bound that does not hold there.
 */
#ifndef IFLOW_CHECK_H
#define IFLOW_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static int check_passed_, check_failed_, check_skipped_;
static const char *check_current_ = "";

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (cond) {                                                                        \
            check_passed_++;                                                               \
        } else {                                                                           \
            check_failed_++;                                                               \
            fprintf(stderr, "FAIL %s:%d (%s): ", __FILE__, __LINE__, check_current_);    \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* rc is negative `want`, the message is one line naming `where` and containing `text`.
 * SHOW_ERRORS=1 in the environment prints each message. */
#define CHECK_ERR(rc, want, where, text)                                                         \
    do {                                                                                         \
        const char *m_ = iflow_errmsg();                                                         \
        CHECK((rc) == (want), "rc %d (%s), want %d (%s): %s", (rc), iflow_strerror(rc), (want), \
              iflow_strerror(want), m_);                                                         \
        CHECK(strstr(m_, (where)) != NULL, "message does not name '%s': %s", (where), m_);       \
        CHECK(strstr(m_, (text)) != NULL, "message lacks '%s': %s", (text), m_);                 \
        CHECK(!strchr(m_, '\n'), "message spans lines: %s", m_);                                 \
        if (getenv("SHOW_ERRORS"))                                                               \
            fprintf(stderr, "  %s\n", m_);                                                       \
    } while (0)

/* Skip the rest of the test: SKIP in a void function, SKIP_RET(value, ...) in one returning a value. */
#define SKIP_RET(rv, ...)                                                                  \
    do {                                                                                   \
        check_skipped_++;                                                                  \
        fprintf(stderr, "SKIP %s: ", check_current_);                                     \
        fprintf(stderr, __VA_ARGS__);                                                      \
        fputc('\n', stderr);                                                               \
        return rv;                                                                         \
    } while (0)
#define SKIP(...) SKIP_RET(, __VA_ARGS__)

#define RUN(fn)                                                                            \
    do {                                                                                   \
        check_current_ = #fn;                                                              \
        fn();                                                                              \
    } while (0)

static inline const char *test_data(const char *rel)
{
    static char buf[4096];
    const char *root = getenv("IFLOW_TEST_DATA");
    char rel_path[4096];
    snprintf(rel_path, sizeof rel_path, "%s/%s", root && *root ? root : "../shared", rel);
    /* absolute, so that a link made to it from a temporary directory still points there */
    return access(rel_path, R_OK) == 0 && realpath(rel_path, buf) ? buf : NULL;
}

/* tests/fixtures/<rel> (committed fixtures): beside this header's folder, from the current
 * directory (the repo root), or from the repo root above the binary
 * (<root>/build/<mode>/tests/unit/test_x). A static buffer, or NULL when it is not found. */
static inline const char *test_fixture(const char *rel)
{
    static char buf[4096];
    char exe[2048];
    const char *src = __FILE__, *slash = strrchr(src, '/');
    snprintf(buf, sizeof buf, "%.*s/../fixtures/%s", slash ? (int)(slash - src) : 1, slash ? src : ".", rel);
    if (access(buf, R_OK) == 0)
        return buf;
    snprintf(buf, sizeof buf, "tests/fixtures/%s", rel);
    if (access(buf, R_OK) == 0)
        return buf;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    for (int up = 0; up < 5; up++) { /* test_x, unit, tests, <mode>, build */
        char *cut = strrchr(exe, '/');
        if (cut)
            *cut = 0;
    }
    snprintf(buf, sizeof buf, "%s/tests/fixtures/%s", exe, rel);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

/* The whole file, malloc'd; NULL if it cannot be read. */
static inline void *test_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(*n ? *n : 1);
    if (buf && fread(buf, 1, *n, f) != *n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* Write n bytes to path; a test that cannot write its fixtures cannot go on: exit 2. */
static inline void test_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

/* A fixed-seed xorshift generator: tests see the same "random" data on every run. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static inline uint32_t rnd_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Uniform in (0, 1), and standard normal (Box-Muller), from rnd_u32. */
static inline double rnd_unit(void)
{
    return ((double)(rnd_u32() & 0xffffff) + 0.5) / 16777216.0;
}

static inline float rnd_normal(void)
{
    return (float)(sqrt(-2.0 * log(rnd_unit())) * cos(6.283185307179586 * rnd_unit()));
}

static inline int check_summary(const char *prog)
{
    printf("%s: %d passed, %d failed", prog, check_passed_, check_failed_);
    if (check_skipped_)
        printf(", %d skipped", check_skipped_);
    printf("\n");
    return check_failed_ ? 1 : 0;
}

#endif
