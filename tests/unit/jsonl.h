/* jsonl.h -- a committed fixture's JSON Lines for the unit tests (header-only; needs check.h
 * and jansson).
 *
 *   test_read_jsonl(rel, flags, &n)  the lines of tests/fixtures/rel parsed as JSON (jansson's
 *                                    decoding flags: JSON_ALLOW_NUL for texts holding NULs),
 *                                    a malloc'd array of n; empty lines skipped, a line that is
 *                                    not JSON dropped (a test counts what it expects); NULL when
 *                                    the file is missing or memory runs out
 *   test_free_jsonl(lines, n)        their release
 */
#ifndef IFLOW_TEST_JSONL_H
#define IFLOW_TEST_JSONL_H

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/check.h"

static inline json_t **test_read_jsonl(const char *rel, size_t flags, size_t *count)
{
    const char *path = test_fixture(rel);
    size_t n;
    char *text = path ? test_read_file(path, &n) : NULL;
    *count = 0;
    if (!text)
        return NULL;
    json_t **lines = calloc(n / 16 + 2, sizeof *lines); /* a JSON line holds 16 bytes at least */
    size_t k = 0;
    for (char *p = text, *end = text + n; lines && p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (len && (lines[k] = json_loadb(p, len, flags, NULL)))
            k++;
        p += len + 1;
    }
    free(text);
    *count = k;
    return lines;
}

static inline void test_free_jsonl(json_t **lines, size_t n)
{
    for (size_t i = 0; lines && i < n; i++)
        json_decref(lines[i]);
    free(lines);
}

#endif
