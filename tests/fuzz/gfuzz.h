/* twopart.h -- a fuzz input in two parts: the first, then a line "%%", then the second (the
 * grammar targets: a grammar or schema, then a text). Without that line the whole input is the
 * first part and the second is absent (NULL, 0). */
#ifndef IFLOW_FUZZ_TWOPART_H
#define IFLOW_FUZZ_TWOPART_H

#include <stddef.h>
#include <string.h>

static inline void two_parts(const char *in, size_t size, size_t *first, const char **second, size_t *second_len)
{
    const char *sep = memmem(in, size, "\n%%\n", 4);
    *first = sep ? (size_t)(sep - in) : size;
    *second = sep ? sep + 4 : NULL;
    *second_len = sep ? size - *first - 4 : 0;
}

#endif
