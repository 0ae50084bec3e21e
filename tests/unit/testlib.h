/* testlib.h -- unit-test helpers that use libiflow: CHECK_ERR() for an error code and its
 * message, test_convert() for a model of the shared test data (specs from ./specs). */
#ifndef IFLOW_TESTLIB_H
#define IFLOW_TESTLIB_H

#include "check.h"
#include "libcore/formats/convert.h"
#include "libcore/base/error.h"

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

/* Convert $IFLOW_TEST_DATA/rel to `out` with matrices of type dtype (-1: keep). 0, or <0 with a
 * failed check (-1 when the test data is missing). */
static inline int test_convert(const char *rel, const char *out, int dtype)
{
    const char *specs[] = {"specs"};
    iflow_convert_opts o = {.dtype = dtype, .spec_dirs = specs, .n_spec_dirs = 1};
    const char *src = test_data(rel);
    if (!src)
        return -1;
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", src);
    int rc = iflow_convert(copy, out, &o);
    CHECK(rc == 0, "convert %s: %s", rel, iflow_errmsg());
    return rc;
}

#endif
