/* util.c -- see util.h. */
#include "util.h"
#include "error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int iflow_read_file(const char *path, size_t max_bytes, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return iflow_seterr(errno == ENOENT ? IFLOW_ENOTFOUND : IFLOW_EIO, "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap)
            break;
        if (cap >= max_bytes) {
            free(buf);
            fclose(f);
            return iflow_seterr(IFLOW_ERANGE, "file '%s' is larger than %zu bytes", path, max_bytes);
        }
        cap = cap * 2 > max_bytes ? max_bytes : cap * 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb)
            free(buf);
        buf = nb;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory reading '%s'", path);
    if (err) {
        free(buf);
        return iflow_seterr(IFLOW_EIO, "cannot read '%s'", path);
    }
    buf[n] = 0;
    *data = buf;
    *len = n;
    return 0;
}
