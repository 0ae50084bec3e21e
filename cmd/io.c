/* io.c -- see io.h. */
#include "io.h"
#include "libcore/base/error.h"
#include "libcore/base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define MAX_TEXT ((size_t)1 << 32)

int slurp(const char *path, char **data, size_t *len)
{
    if (strcmp(path, "-") != 0)
        return iflow_read_file(path, MAX_TEXT, data, len);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, stdin)) > 0;) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb)
                free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    if (!buf)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory reading standard input");
    if (ferror(stdin)) {
        free(buf);
        return iflow_seterr(IFLOW_EIO, "cannot read standard input");
    }
    buf[n] = 0;
    *data = buf;
    *len = n;
    return 0;
}

void each_line(FILE *f, void (*fn)(void *user, const char *line, size_t len), void *user)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        if (len && line[len - 1] == '\n')
            line[--len] = 0;
        if (len && line[len - 1] == '\r')
            line[--len] = 0;
        fn(user, line, (size_t)len);
    }
    free(line);
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double peak_rss_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

json_t *json_schema(json_t *o)
{
    json_t *j = json_pack("{s:i}", "schema", IFLOW_JSON_SCHEMA);
    if (j && o)
        json_object_update(j, o);
    json_decref(o);
    return j;
}

/* A token as JSON: {"id", "token" (its text; null, with "bytes", when that is not valid UTF-8),
 * "logprob"}. */
static json_t *token_json(const iflow_tokenizer *tok, int32_t id, float logprob)
{
    const size_t cap = iflow_tokenizer_max_piece(tok);
    char *piece = malloc(cap);
    int n = piece ? iflow_tokenizer_piece(tok, id, 0, piece, cap) : 0;
    json_t *o = json_object(), *t = json_stringn(piece ? piece : "", n > 0 ? (size_t)n : 0);
    json_object_set_new(o, "id", json_integer(id));
    if (t) {
        json_object_set_new(o, "token", t);
    } else {
        json_t *a = json_array();
        for (int i = 0; i < n; i++)
            json_array_append_new(a, json_integer((unsigned char)piece[i]));
        json_object_set_new(o, "token", json_null());
        json_object_set_new(o, "bytes", a);
    }
    json_object_set_new(o, "logprob", isnan(logprob) ? json_null() : json_real(logprob));
    free(piece);
    return o;
}

json_t *logprobs_json(const iflow_tokenizer *tok, const iflow_token_logprob *e, int n, int with_top)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        json_t *o = token_json(tok, e[i].id, e[i].logprob), *top = json_array();
        for (int k = 0; k < e[i].n_top; k++)
            json_array_append_new(top, token_json(tok, e[i].top_id[k], e[i].top_logprob[k]));
        if (with_top)
            json_object_set_new(o, "top", top);
        else
            json_decref(top);
        json_array_append_new(a, o);
    }
    return a;
}
