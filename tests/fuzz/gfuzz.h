/* gfuzz.h -- what the grammar fuzz targets share (fuzz_grammar, fuzz_grammar_schema,
 * fuzz_grammar_tokens, fuzz_toolcall): an input in two parts, the first, then a line "%%", then
 * the second (a grammar, schema or tools list, then a text; without that line the whole input is
 * the first part and the second is absent: NULL, 0), and the check that an error message is one
 * line. */
#ifndef IFLOW_FUZZ_GFUZZ_H
#define IFLOW_FUZZ_GFUZZ_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "libcore/base/error.h"

static inline void two_parts(const char *in, size_t size, size_t *first, const char **second, size_t *second_len)
{
    const char *sep = memmem(in, size, "\n%%\n", 4);
    *first = sep ? (size_t)(sep - in) : size;
    *second = sep ? sep + 4 : NULL;
    *second_len = sep ? size - *first - 4 : 0;
}

/* The last error's message holds no newline (else the target fails). */
static inline void one_line(void)
{
    if (strchr(iflow_errmsg(), '\n'))
        abort();
}

#endif
