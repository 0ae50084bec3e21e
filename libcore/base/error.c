/* error.c -- see error.h. */
#include "error.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char errbuf[1024];

static const char *const names[IFLOW_E_COUNT_] = {
    "ok", "io", "nomem", "format", "truncated", "checksum", "unsupported",
    "invalid", "notfound", "shape", "spec", "range",
};

static const char *const descriptions[IFLOW_E_COUNT_] = {
    "no error",
    "a read, write, open or rename failed",
    "allocation failed",
    "a file is malformed",
    "a file ends before its declared contents",
    "a stored checksum does not match the data",
    "a valid input uses something iflow lacks",
    "a bad argument or option value",
    "a named file, tensor, key or token does not exist",
    "a tensor has the wrong shape or type for its role",
    "a spec file is malformed or does not fit the checkpoint",
    "a value is out of its allowed range",
};

const char *iflow_error_describe(int code)
{
    if (code > 0 || -code >= IFLOW_E_COUNT_)
        return "unknown error code";
    return descriptions[-code];
}

const char *iflow_strerror(int code)
{
    if (code > 0 || -code >= IFLOW_E_COUNT_)
        return "unknown";
    return names[-code];
}

/* Messages are one line: control characters that came from a file (a tensor name with a
 * newline, say) are replaced by '?'. */
static void one_line(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            *s = '?';
}

int iflow_vseterr(int code, const char *fmt, va_list ap)
{
    vsnprintf(errbuf, sizeof errbuf, fmt, ap);
    one_line(errbuf);
    return code;
}

int iflow_seterr(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    iflow_vseterr(code, fmt, ap);
    va_end(ap);
    return code;
}

int iflow_preperr(int code, const char *fmt, ...)
{
    char prefix[512], old[sizeof errbuf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, errbuf, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof errbuf - 3)
        n = sizeof errbuf - 3;
    memcpy(errbuf, prefix, n);
    memcpy(errbuf + n, ": ", 2);
    size_t rest = sizeof errbuf - n - 3;
    strncpy(errbuf + n + 2, old, rest);
    errbuf[sizeof errbuf - 1] = 0;
    one_line(errbuf);
    return code;
}

const char *iflow_errmsg(void)
{
    return errbuf;
}
