/* testmodel.h -- convert a model of the shared test data for a unit test (specs from ./specs). */
#ifndef IFLOW_TESTMODEL_H
#define IFLOW_TESTMODEL_H

#include "check.h"
#include "libcore/convert.h"
#include "libcore/error.h"

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
