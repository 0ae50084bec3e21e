/* jsonutil.c -- see jsonutil.h. */
#include "jsonutil.h"
#include "error.h"
#include "quote.h"
#include "utf8.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Read a whole file into a malloc'd buffer (not NUL-terminated). */
static int read_file(const char *path, char **buf_out, size_t *n_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return iflow_seterr(errno == ENOENT ? IFLOW_ENOTFOUND : IFLOW_EIO,
                            "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            char *bigger = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    if (!buf) {
        fclose(f);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory reading '%s' (%zu bytes so far)", path, n);
    }
    if (ferror(f)) {
        int e = errno;
        free(buf);
        fclose(f);
        return iflow_seterr(IFLOW_EIO, "cannot read '%s': %s", path, strerror(e));
    }
    fclose(f);
    *buf_out = buf;
    *n_out = n;
    return 0;
}

json_t *iflow_json_text(const char *text, size_t n)
{
    json_t *j = json_stringn(text, n);
    if (j || !text)
        return j;
    char *o = malloc(3 * n + 1); /* a byte becomes 3 at most */
    size_t k = 0;
    for (size_t i = 0; o && i < n;) {
        uint32_t cp;
        int step = iflow_utf8_decode(text + i, n - i, &cp);
        if (step > 0) {
            memcpy(o + k, text + i, (size_t)step);
            k += (size_t)step;
            i += (size_t)step;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i += (size_t)-step;
        }
    }
    j = o ? json_stringn(o, k) : NULL;
    free(o);
    return j;
}

int iflow_json_load_buf(json_t **out, const void *buf, size_t n, const char *name)
{
    json_error_t err;
    *out = json_loadb(buf, n, JSON_DECODE_ANY, &err);
    if (*out)
        return 0;
    if (json_error_code(&err) == json_error_out_of_memory)
        return iflow_seterr(IFLOW_ENOMEM, "%s: out of memory parsing json", name);
    return iflow_seterr(IFLOW_EFORMAT, "%s:%d:%d: invalid json: %s", name, err.line,
                        err.column, iflow_quote(err.text));
}

int iflow_json_load_file(json_t **out, const char *path)
{
    char *buf;
    size_t n;
    *out = NULL;
    int rc = read_file(path, &buf, &n);
    if (rc < 0)
        return rc;
    rc = iflow_json_load_buf(out, buf, n, path);
    free(buf);
    return rc;
}

int iflow_json_load_object(json_t **out, const char *path)
{
    int rc = iflow_json_load_file(out, path);
    if (rc < 0)
        return rc;
    if (!json_is_object(*out)) {
        rc = iflow_seterr(IFLOW_EFORMAT, "%s:1:1: expected a json object, found %s", path,
                          iflow_json_type_name(*out));
        json_decref(*out);
        *out = NULL;
    }
    return rc;
}

const char *iflow_json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:  return "object";
    case JSON_ARRAY:   return "array";
    case JSON_STRING:  return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL:    return "real";
    case JSON_TRUE:    return "true";
    case JSON_FALSE:   return "false";
    case JSON_NULL:    return "null";
    }
    return "unknown";
}

const json_t *iflow_json_lookup(const json_t *obj, const char *path)
{
    if (!json_is_object(obj) || !path)
        return NULL;
    const json_t *v = json_object_get(obj, path);
    if (v)
        return v;
    const char *dot = strchr(path, '.');
    while (dot) {
        /* Try every split point, so "a.b.c" finds {"a.b": {"c": 1}} as well as {"a": {"b.c": 1}}. */
        const json_t *head = json_object_getn(obj, path, (size_t)(dot - path));
        if (json_is_object(head)) {
            v = iflow_json_lookup(head, dot + 1);
            if (v)
                return v;
        }
        dot = strchr(dot + 1, '.');
    }
    return NULL;
}

/* An integral double inside int64's range, as int64. */
static int real_to_int(double d, int64_t *out)
{
    if (!isfinite(d) || d != floor(d) || d < -9223372036854775808.0 || d >= 9223372036854775808.0)
        return -1;
    *out = (int64_t)d;
    return 0;
}

static int as_int(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 0;
    }
    return json_is_real(v) ? real_to_int(json_real_value(v), out) : -1;
}

int64_t iflow_json_int(const json_t *obj, const char *path, int64_t def)
{
    int64_t v;
    return as_int(iflow_json_lookup(obj, path), &v) == 0 ? v : def;
}

double iflow_json_number(const json_t *obj, const char *path, double def)
{
    const json_t *v = iflow_json_lookup(obj, path);
    return json_is_number(v) ? json_number_value(v) : def;
}

int iflow_json_bool(const json_t *obj, const char *path, int def)
{
    const json_t *v = iflow_json_lookup(obj, path);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

const char *iflow_json_string(const json_t *obj, const char *path, const char *def)
{
    const json_t *v = iflow_json_lookup(obj, path);
    return json_is_string(v) ? json_string_value(v) : def;
}

/* The value at path for a strict getter: NULL (with the ENOTFOUND message set) if absent. */
static const json_t *lookup_present(const json_t *obj, const char *path, const char *where)
{
    const json_t *v = iflow_json_lookup(obj, path);
    if (!v || json_is_null(v)) {
        iflow_seterr(IFLOW_ENOTFOUND, "missing key '%s' in '%s'", iflow_quote(path),
                     where ? where : "json");
        return NULL;
    }
    return v;
}

static int wrong_type(const json_t *v, const char *path, const char *want, const char *where)
{
    const char *article = json_is_integer(v) || json_is_array(v) || json_is_object(v) ? "an "
                          : json_is_string(v) || json_is_real(v)                     ? "a "
                                                                                     : "";
    return iflow_seterr(IFLOW_EFORMAT, "key '%s' is %s%s, expected %s in '%s'", iflow_quote(path), article,
                        iflow_json_type_name(v), want, where ? where : "json");
}

int iflow_json_get_int(const json_t *obj, const char *path, int64_t *out, const char *where)
{
    const json_t *v = lookup_present(obj, path, where);
    if (!v)
        return IFLOW_ENOTFOUND;
    int64_t x;
    if (as_int(v, &x) < 0)
        return json_is_real(v) ? iflow_seterr(IFLOW_EFORMAT,
                                              "key '%s' is %g, expected an integer in '%s'", iflow_quote(path),
                                              json_real_value(v), where ? where : "json")
                               : wrong_type(v, path, "an integer", where);
    *out = x;
    return 0;
}

int iflow_json_get_number(const json_t *obj, const char *path, double *out, const char *where)
{
    const json_t *v = lookup_present(obj, path, where);
    if (!v)
        return IFLOW_ENOTFOUND;
    if (!json_is_number(v))
        return wrong_type(v, path, "a number", where);
    *out = json_number_value(v);
    return 0;
}

int iflow_json_get_bool(const json_t *obj, const char *path, int *out, const char *where)
{
    const json_t *v = lookup_present(obj, path, where);
    if (!v)
        return IFLOW_ENOTFOUND;
    if (!json_is_boolean(v))
        return wrong_type(v, path, "true or false", where);
    *out = json_is_true(v);
    return 0;
}

int iflow_json_get_string(const json_t *obj, const char *path, const char **out,
                          const char *where)
{
    const json_t *v = lookup_present(obj, path, where);
    if (!v)
        return IFLOW_ENOTFOUND;
    if (!json_is_string(v))
        return wrong_type(v, path, "a string", where);
    *out = json_string_value(v);
    return 0;
}
