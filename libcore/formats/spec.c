/* spec.c -- model specs (the .ini files in specs/). See spec.h. */
#include "spec.h"
#include "libcore/base/error.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    iflow_spec *spec;
    int err;          /* error code set by the handler */
} load_state;

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = 0;
    return s;
}

static int push_kv(iflow_spec_kv **arr, size_t *n, const char *key, const char *value)
{
    for (size_t i = 0; i < *n; i++)
        if (strcmp((*arr)[i].key, key) == 0)
            return iflow_seterr(IFLOW_ESPEC, "duplicate key '%s'", key);
    iflow_spec_kv *na = realloc(*arr, (*n + 1) * sizeof *na);
    if (!na)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    *arr = na;
    na[*n].key = strdup(key);
    na[*n].value = strdup(value);
    (*n)++;
    return na[*n - 1].key && na[*n - 1].value ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
}

static int push_str(char ***arr, size_t *n, const char *s)
{
    char **na = realloc(*arr, (*n + 1) * sizeof *na);
    if (!na)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    *arr = na;
    na[(*n)++] = strdup(s);
    return na[*n - 1] ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
}

/* architectures = A, B, C */
static int push_list(char ***arr, size_t *n, const char *value)
{
    char *copy = strdup(value), *save = NULL;
    int rc = copy ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok && rc == 0; tok = strtok_r(NULL, ",", &save))
        if (*trim(tok))
            rc = push_str(arr, n, trim(tok));
    free(copy);
    return rc;
}

static int model_key(iflow_spec *s, const char *name, const char *value)
{
    char **slot = strcmp(name, "name") == 0          ? &s->name
                  : strcmp(name, "description") == 0 ? &s->description
                  : strcmp(name, "base") == 0        ? &s->base
                                                     : NULL;
    if (strcmp(name, "architectures") == 0)
        return push_list(&s->architectures, &s->n_architectures, value);
    if (!slot)
        return iflow_seterr(IFLOW_ESPEC, "unknown key '%s' in [model]", name);
    if (*slot)
        return iflow_seterr(IFLOW_ESPEC, "duplicate key '%s' in [model]", name);
    return (*slot = strdup(value)) ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
}

/* Source formats that may have a variant section ([gguf], [gguf.hparams], ...). */
static const char *const source_formats[] = {"gguf", NULL};

/* The variant for a format (created on first use). */
static iflow_spec_variant *variant_for(iflow_spec *s, const char *format)
{
    for (size_t i = 0; i < s->n_variants; i++)
        if (strcmp(s->variants[i].format, format) == 0)
            return &s->variants[i];
    iflow_spec_variant *nv = realloc(s->variants, (s->n_variants + 1) * sizeof *nv);
    if (!nv)
        return NULL;
    s->variants = nv;
    memset(&nv[s->n_variants], 0, sizeof *nv);
    if (!(nv[s->n_variants].format = strdup(format)))
        return NULL;
    return &nv[s->n_variants++];
}

/* [FORMAT] or [FORMAT.part]: the format's index in source_formats, the part after the dot in
 * *part ("" for the bare section); -1 when section names no source format. */
static int source_section(const char *section, const char **part)
{
    for (int i = 0; source_formats[i]; i++) {
        size_t n = strlen(source_formats[i]);
        if (strncmp(section, source_formats[i], n) == 0 && (section[n] == 0 || section[n] == '.')) {
            *part = section[n] ? section + n + 1 : "";
            return i;
        }
    }
    return -1;
}

/* [blocks.KEY=VALUE] (hparams 0) or [hparams.KEY=VALUE] (1), cond = "KEY=VALUE": its entry in
 * (*arr, *n), created on first use, gets name = value. */
static int when_key(iflow_spec_when **arr, size_t *n, const char *section, const char *cond, int hparams,
                    const char *name, const char *value)
{
    const char *eq = strchr(cond, '=');
    if (!eq || eq == cond || !eq[1])
        return iflow_seterr(IFLOW_ESPEC, "bad section [%s]: want [%s.KEY=VALUE]", section, hparams ? "hparams" : "blocks");
    size_t nk = (size_t)(eq - cond);
    iflow_spec_when *w = NULL;
    for (size_t i = 0; i < *n && !w; i++)
        if ((*arr)[i].hparams == hparams && strlen((*arr)[i].key) == nk && strncmp((*arr)[i].key, cond, nk) == 0 &&
            strcmp((*arr)[i].value, eq + 1) == 0)
            w = &(*arr)[i];
    if (!w) {
        iflow_spec_when *nw = realloc(*arr, (*n + 1) * sizeof *nw);
        if (!nw)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        *arr = nw;
        w = memset(&nw[(*n)++], 0, sizeof *nw);
        w->hparams = hparams;
        w->key = strndup(cond, nk);
        w->value = strdup(eq + 1);
        if (!w->key || !w->value)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    return push_kv(&w->blocks, &w->n_blocks, name, value);
}

/* "blocks.KEY=VALUE" or "hparams.KEY=VALUE" (the section's name after any format): its when;
 * 1 when part is neither. */
static int cond_key(iflow_spec_when **arr, size_t *n, const char *section, const char *part, const char *name,
                    const char *value)
{
    if (strncmp(part, "blocks.", 7) == 0)
        return when_key(arr, n, section, part + 7, 0, name, value);
    if (strncmp(part, "hparams.", 8) == 0)
        return when_key(arr, n, section, part + 8, 1, name, value);
    return 1;
}

static int variant_key(iflow_spec *s, const char *section, const char *name, const char *value)
{
    const char *part;
    int f = source_section(section, &part);
    iflow_spec_variant *v = f < 0 ? NULL : variant_for(s, source_formats[f]);
    if (f < 0)
        return iflow_seterr(IFLOW_ESPEC, "unknown section [%s]", section);
    if (!v)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    if (!*part)
        return strcmp(name, "architectures") == 0
                   ? push_list(&v->architectures, &v->n_architectures, value)
                   : iflow_seterr(IFLOW_ESPEC, "unknown key '%s' in [%s] (use 'architectures')", name, section);
    if (strcmp(part, "blocks") == 0)
        return push_kv(&v->blocks, &v->n_blocks, name, value);
    if (strcmp(part, "hparams") == 0)
        return push_kv(&v->hparams, &v->n_hparams, name, value);
    if (strcmp(part, "tensors") == 0)
        return push_kv(&v->tensors, &v->n_tensors, name, value);
    if (strcmp(part, "ignore") == 0) {
        v->has_ignore = 1;
        return strcmp(name, "pattern") == 0 ? push_str(&v->ignore, &v->n_ignore, value)
                                            : iflow_seterr(IFLOW_ESPEC, "unknown key '%s' in [%s] (use 'pattern')", name, section);
    }
    int rc = cond_key(&v->whens, &v->n_whens, section, part, name, value);
    return rc <= 0 ? rc : iflow_seterr(IFLOW_ESPEC, "unknown section [%s]", section);
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
    load_state *st = user;
    iflow_spec *s = st->spec;
    int rc;
    if (strcmp(section, "model") == 0)
        rc = model_key(s, name, value);
    else if (strcmp(section, "blocks") == 0)
        rc = push_kv(&s->blocks, &s->n_blocks, name, value);
    else if (strcmp(section, "hparams") == 0)
        rc = push_kv(&s->hparams, &s->n_hparams, name, value);
    else if (strcmp(section, "tensors") == 0)
        rc = push_kv(&s->tensors, &s->n_tensors, name, value);
    else if (strcmp(section, "ignore") == 0)
        rc = strcmp(name, "pattern") == 0 ? push_str(&s->ignore, &s->n_ignore, value)
                                          : iflow_seterr(IFLOW_ESPEC, "unknown key '%s' in [ignore] (use 'pattern')", name);
    else if ((rc = cond_key(&s->whens, &s->n_whens, section, section, name, value)) == 1)
        rc = variant_key(s, section, name, value);
    st->err = rc;
    return rc == 0;
}

static int spec_load(iflow_spec **out, const char *path, int depth);
static void free_strs(char **a, size_t n);
static int override_kv(iflow_spec_kv **arr, size_t *n, const iflow_spec_kv *kv);
static int override_all(iflow_spec_kv **arr, size_t *n, const iflow_spec_kv *src, size_t n_src);

/* Append (*src, *ns) to (*dst, *nd), moving the entries: *src is left empty. */
static int move_whens(iflow_spec_when **dst, size_t *nd, iflow_spec_when **src, size_t *ns)
{
    if (!*ns)
        return 0;
    iflow_spec_when *nw = realloc(*dst, (*nd + *ns) * sizeof *nw);
    if (!nw)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    memcpy(nw + *nd, *src, *ns * sizeof *nw);
    *dst = nw, *nd += *ns;
    free(*src);
    *src = NULL, *ns = 0;
    return 0;
}

/* The child's keys over its base's (both loaded): base takes the child's name, description (when
 * it has one), architectures and path; the child's [blocks], [hparams], [tensors] keys override
 * the base's and its [ignore] patterns add to them. A variant keeps the base's keys under the
 * child's, but serves only the architectures the child lists in it: a spec never inherits
 * which GGUF architectures it serves. */
static int merge_child(iflow_spec *b, iflow_spec *c)
{
    int rc = 0;
    if ((rc = override_all(&b->blocks, &b->n_blocks, c->blocks, c->n_blocks)) < 0 ||
        (rc = override_all(&b->hparams, &b->n_hparams, c->hparams, c->n_hparams)) < 0 ||
        (rc = override_all(&b->tensors, &b->n_tensors, c->tensors, c->n_tensors)) < 0)
        return rc;
    for (size_t i = 0; i < c->n_ignore && rc == 0; i++)
        rc = push_str(&b->ignore, &b->n_ignore, c->ignore[i]);
    if (rc == 0) /* the child's conditional sections after the base's: they win */
        rc = move_whens(&b->whens, &b->n_whens, &c->whens, &c->n_whens);
    for (size_t i = 0; i < b->n_variants; i++) {
        free_strs(b->variants[i].architectures, b->variants[i].n_architectures);
        b->variants[i].architectures = NULL, b->variants[i].n_architectures = 0;
    }
    for (size_t k = 0; k < c->n_variants && rc == 0; k++) {
        const iflow_spec_variant *cv = &c->variants[k];
        iflow_spec_variant *bv = variant_for(b, cv->format);
        if (!bv)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        for (size_t i = 0; i < cv->n_architectures && rc == 0; i++)
            rc = push_str(&bv->architectures, &bv->n_architectures, cv->architectures[i]);
        if (rc == 0 && (rc = override_all(&bv->blocks, &bv->n_blocks, cv->blocks, cv->n_blocks)) == 0 &&
            (rc = override_all(&bv->hparams, &bv->n_hparams, cv->hparams, cv->n_hparams)) == 0)
            rc = override_all(&bv->tensors, &bv->n_tensors, cv->tensors, cv->n_tensors);
        for (size_t i = 0; i < cv->n_ignore && rc == 0; i++)
            rc = push_str(&bv->ignore, &bv->n_ignore, cv->ignore[i]);
        bv->has_ignore |= cv->has_ignore;
        if (rc == 0)
            rc = move_whens(&bv->whens, &bv->n_whens, &c->variants[k].whens, &c->variants[k].n_whens);
    }
    if (rc < 0)
        return rc;
    /* identity: the child's */
#define TAKE(field) (free(b->field), b->field = c->field, c->field = NULL)
    TAKE(path), TAKE(name), TAKE(base);
    if (c->description)
        TAKE(description);
#undef TAKE
    free_strs(b->architectures, b->n_architectures);
    b->architectures = c->architectures, b->n_architectures = c->n_architectures;
    c->architectures = NULL, c->n_architectures = 0;
    return 0;
}

/* dir(path)/NAME.ini */
static char *sibling(const char *path, const char *name)
{
    const char *slash = strrchr(path, '/');
    size_t nd = slash ? (size_t)(slash - path) + 1 : 0, n = nd + strlen(name) + 5;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%.*s%s.ini", (int)nd, path, name);
    return p;
}

static int spec_load(iflow_spec **out, const char *path, int depth)
{
    *out = NULL;
    iflow_spec *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path)))
        return free(s), iflow_seterr(IFLOW_ENOMEM, "out of memory");
    load_state st = {s, 0};
    iflow_seterr(IFLOW_ESPEC, "syntax error");
    int line = ini_parse(path, handler, &st);
    int rc = 0;
    if (line == -1)
        rc = iflow_seterr(IFLOW_ENOTFOUND, "cannot open spec '%s': %s", path, strerror(errno));
    else if (line == -2)
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory reading spec '%s'", path);
    else if (line > 0)
        rc = iflow_preperr(st.err ? st.err : IFLOW_ESPEC, "%s:%d", path, line);
    else if (!s->name || !s->n_architectures)
        rc = iflow_seterr(IFLOW_ESPEC, "spec '%s' lacks [model] name or architectures", path);
    if (rc == 0 && s->base) {
        /* [model] base = NAME: NAME.ini beside this file, then this file's keys over it */
        iflow_spec *b = NULL;
        char *bp = sibling(path, s->base);
        if (!bp)
            rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
        else if (depth >= 8)
            rc = iflow_seterr(IFLOW_ESPEC, "spec '%s': base '%s' nests too deep (a cycle?)", path, s->base);
        else if ((rc = spec_load(&b, bp, depth + 1)) < 0 && depth == 0)
            rc = iflow_preperr(rc, "spec '%s', base '%s'", path, s->base);
        else if (rc == 0 && (rc = merge_child(b, s)) == 0)
            iflow_spec_close(s), s = b, b = NULL;
        free(bp);
        iflow_spec_close(b);
    }
    if (rc < 0) {
        iflow_spec_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

int iflow_spec_load(iflow_spec **out, const char *path)
{
    return spec_load(out, path, 0);
}

static void free_kvs(iflow_spec_kv *kv, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(kv[i].key);
        free(kv[i].value);
    }
    free(kv);
}

static void free_strs(char **a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(a[i]);
    free(a);
}

static void free_whens(iflow_spec_when *w, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(w[i].key);
        free(w[i].value);
        free_kvs(w[i].blocks, w[i].n_blocks);
    }
    free(w);
}

void iflow_spec_close(iflow_spec *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_variants; i++) {
        iflow_spec_variant *v = &s->variants[i];
        free(v->format);
        free_strs(v->architectures, v->n_architectures);
        free_kvs(v->blocks, v->n_blocks);
        free_kvs(v->hparams, v->n_hparams);
        free_kvs(v->tensors, v->n_tensors);
        free_strs(v->ignore, v->n_ignore);
        free_whens(v->whens, v->n_whens);
    }
    free(s->variants);
    free_whens(s->whens, s->n_whens);
    free_kvs(s->blocks, s->n_blocks);
    free_kvs(s->hparams, s->n_hparams);
    free_kvs(s->tensors, s->n_tensors);
    free_strs(s->architectures, s->n_architectures);
    free_strs(s->ignore, s->n_ignore);
    free(s->name);
    free(s->description);
    free(s->base);
    free(s->path);
    free(s);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Try every *.ini of one directory, in name order. 1 = found, 0 = not here, <0 = error. */
#define DEVICES_INI "devices.ini"

/* The architectures a spec serves from a source format (NULL: [model]'s). */
static int serves(const iflow_spec *s, const char *format, const char *arch)
{
    char *const *archs = s->architectures;
    size_t n = s->n_architectures;
    for (size_t i = 0; format && i < s->n_variants; i++)
        if (strcmp(s->variants[i].format, format) == 0)
            archs = s->variants[i].architectures, n = s->variants[i].n_architectures;
    if (format && archs == s->architectures)
        return 0;
    for (size_t a = 0; a < n; a++)
        if (strcmp(archs[a], arch) == 0)
            return 1;
    return 0;
}

static int find_in_dir(iflow_spec **out, const char *dir, const char *format, const char *arch)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    char **names = NULL;
    size_t n = 0;
    int rc = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && rc == 0;) {
        size_t len = strlen(e->d_name);
        /* devices.ini shares the directory (it describes devices for iflow-partition: partition.h) */
        if (len > 4 && strcmp(e->d_name + len - 4, ".ini") == 0 && strcmp(e->d_name, DEVICES_INI) != 0)
            rc = push_str(&names, &n, e->d_name);
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && rc == 0; i++) {
        char path[4096];
        iflow_spec *s;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if ((rc = iflow_spec_load(&s, path)) < 0)
            break;
        if (serves(s, format, arch))
            *out = s, rc = 1;
        else
            iflow_spec_close(s);
    }
    free_strs(names, n);
    return rc;
}

static int find_spec(iflow_spec **out, const char *const *dirs, size_t n_dirs, const char *format,
                     const char *architecture)
{
    *out = NULL;
    char searched[1024] = "";
    for (size_t i = 0; i < n_dirs; i++) {
        int rc = find_in_dir(out, dirs[i], format, architecture);
        if (rc != 0)
            return rc < 0 ? rc : 0;
        size_t len = strlen(searched);
        snprintf(searched + len, sizeof searched - len, "%s%s", len ? ", " : "", dirs[i]);
    }
    return iflow_seterr(IFLOW_ENOTFOUND, "unknown %s%sarchitecture '%s': no spec serves it (searched %s)",
                        format ? format : "", format ? " " : "", architecture, n_dirs ? searched : "nowhere");
}

int iflow_spec_find(iflow_spec **out, const char *const *dirs, size_t n_dirs, const char *architecture)
{
    return find_spec(out, dirs, n_dirs, NULL, architecture);
}

int iflow_spec_find_source(iflow_spec **out, const char *const *dirs, size_t n_dirs, const char *format,
                           const char *architecture)
{
    int rc = find_spec(out, dirs, n_dirs, format, architecture);
    if (rc == 0 && (rc = iflow_spec_use_source(*out, format)) < 0) {
        iflow_spec_close(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- variants ---- */

/* Set key = value in (*arr, *n): replace the value of an existing key, else append. */
static int override_kv(iflow_spec_kv **arr, size_t *n, const iflow_spec_kv *kv)
{
    for (size_t i = 0; i < *n; i++)
        if (strcmp((*arr)[i].key, kv->key) == 0) {
            char *v = strdup(kv->value);
            if (!v)
                return iflow_seterr(IFLOW_ENOMEM, "out of memory");
            free((*arr)[i].value);
            (*arr)[i].value = v;
            return 0;
        }
    return push_kv(arr, n, kv->key, kv->value);
}

/* Each of src's keys over arr's. */
static int override_all(iflow_spec_kv **arr, size_t *n, const iflow_spec_kv *src, size_t n_src)
{
    int rc = 0;
    for (size_t i = 0; i < n_src && rc == 0; i++)
        rc = override_kv(arr, n, &src[i]);
    return rc;
}

int iflow_spec_use_source(iflow_spec *s, const char *format)
{
    iflow_spec_variant *v = NULL;
    for (size_t i = 0; i < s->n_variants; i++)
        if (strcmp(s->variants[i].format, format) == 0)
            v = &s->variants[i];
    if (s->source && strcmp(s->source, format) == 0)
        return 0;
    if (!v || s->source)
        return iflow_seterr(IFLOW_ESPEC, "spec '%s' has no [%s] section: it does not read %s files", s->path, format,
                            format);
    int rc = override_all(&s->blocks, &s->n_blocks, v->blocks, v->n_blocks);
    if (rc == 0 && (rc = override_all(&s->hparams, &s->n_hparams, v->hparams, v->n_hparams)) == 0)
        rc = override_all(&s->tensors, &s->n_tensors, v->tensors, v->n_tensors);
    if (rc == 0) /* the variant's conditional sections after the spec's: they win */
        rc = move_whens(&s->whens, &s->n_whens, &v->whens, &v->n_whens);
    if (rc == 0 && v->has_ignore) {
        free_strs(s->ignore, s->n_ignore);
        s->ignore = v->ignore, s->n_ignore = v->n_ignore;
        v->ignore = NULL, v->n_ignore = 0; /* moved */
    }
    if (rc == 0)
        s->source = v->format;
    return rc;
}

/* ---- resolving against config.json ---- */

/* config["a"]["b"] for the dotted key "a.b"; NULL if any part is missing or null. */
static const json_t *lookup(const json_t *config, const char *dotted)
{
    char key[256];
    const json_t *v = config;
    const char *p = dotted;
    while (v && *p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof key || !json_is_object(v))
            return NULL;
        memcpy(key, p, n);
        key[n] = 0;
        v = json_object_get(v, key);
        p = dot ? dot + 1 : p + n;
    }
    return v && !json_is_null(v) ? v : NULL;
}

/* A literal: number, true/false, or a quoted string ("mean"). NULL if the alternative looks
 * like a config key instead (a bare word is a string only as a last alternative: see below). */
static json_t *literal(const char *alt)
{
    char *end;
    size_t n = strlen(alt);
    if (n >= 2 && alt[0] == '"' && alt[n - 1] == '"') return json_stringn(alt + 1, n - 2); /* "mean" */
    if (strcmp(alt, "true") == 0) return json_true();
    if (strcmp(alt, "false") == 0) return json_false();
    long long iv = strtoll(alt, &end, 10);
    if (*alt && !*end) return json_integer(iv);
    double dv = strtod(alt, &end);
    if (*alt && !*end) return json_real(dv);
    return NULL;
}

/* A key with each "{K}" replaced by the config's string value of key K (GGUF's metadata keys
 * start with the architecture: {general.architecture}.block_count), into buf. 0, or -1 when a
 * K is absent, not a string or unterminated, or the result does not fit: no such key. */
static int expand_key(const json_t *config, const char *key, char *buf, size_t cap)
{
    size_t n = 0;
    for (const char *p = key; *p;) {
        const char *open = strchr(p, '{'), *close = open ? strchr(open, '}') : NULL;
        size_t lit = open ? (size_t)(open - p) : strlen(p);
        if (n + lit >= cap || (open && !close))
            return -1;
        memcpy(buf + n, p, lit);
        n += lit;
        if (!open)
            break;
        char inner[256];
        if ((size_t)(close - open - 1) >= sizeof inner)
            return -1;
        memcpy(inner, open + 1, (size_t)(close - open - 1));
        inner[close - open - 1] = 0;
        const char *v = json_string_value(lookup(config, inner));
        if (!v || n + strlen(v) >= cap)
            return -1;
        memcpy(buf + n, v, strlen(v));
        n += strlen(v);
        p = close + 1;
    }
    buf[n] = 0;
    return 0;
}

/* config's value at an alternative's key ({K} expanded), or NULL when absent. */
static const json_t *lookup_alt(const json_t *config, const char *key)
{
    char buf[512];
    if (!strchr(key, '{'))
        return lookup(config, key);
    return expand_key(config, key, buf, sizeof buf) == 0 ? lookup(config, buf) : NULL;
}

/* ?key: key's value when present, the string "none" when present as null (transformers' None:
 * a value set to nothing, not left to its default), NULL when absent. */
static json_t *lookup_nullable(const json_t *config, const char *key)
{
    char buf[512];
    if (strchr(key, '{') && expand_key(config, key, buf, sizeof buf) < 0)
        return NULL;
    const char *k = strchr(key, '{') ? buf : key, *dot = strrchr(k, '.');
    const json_t *v = lookup_alt(config, key), *parent = config;
    if (v)
        return json_deep_copy(v);
    if (dot) {
        char head[512];
        snprintf(head, sizeof head, "%.*s", (int)(dot - k), k);
        parent = lookup(config, head);
    }
    v = json_object_get(parent, dot ? dot + 1 : k);
    return v && json_is_null(v) ? json_string("none") : NULL;
}

/* Evaluate "a, b, 10000": alternatives left to right; a number or true/false is a literal, a
 * word is a config.json key (dotted for nested keys, {K} standing for the string at key K)
 * taken when present, ?key the same but "none" when the key is there as null. When none is
 * present and there are several alternatives, a last one without a dot is a string literal
 * ("none"). */
static int eval_alternatives(const iflow_spec *s, const iflow_spec_kv *kv, const json_t *config, json_t **value)
{
    char *copy = strdup(kv->value), *save = NULL, *last = NULL;
    int n_alt = 0;
    *value = NULL;
    if (!copy)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (char *tok = strtok_r(copy, ",", &save); tok && !*value; tok = strtok_r(NULL, ",", &save)) {
        last = trim(tok);
        n_alt++;
        const json_t *v;
        if (last[0] == '!')
            *value = json_boolean(lookup_alt(config, last + 1) == NULL);
        else if (last[0] == '?')
            *value = lookup_nullable(config, last + 1);
        else if (!(*value = literal(last)) && (v = lookup_alt(config, last)))
            *value = json_deep_copy(v);
    }
    int rc = 0;
    if (!*value && n_alt > 1 && last && *last && !strchr(last, '.') && !strchr(last, '{'))
        *value = json_string(last);
    else if (!*value) { /* the keys as looked up ({K} expanded where K is there) */
        char shown[512];
        if (expand_key(config, kv->value, shown, sizeof shown) < 0)
            snprintf(shown, sizeof shown, "%s", kv->value);
        rc = iflow_seterr(IFLOW_ESPEC, "%s%s lacks '%s', needed for hyperparameter '%s' (spec '%s')",
                          s->source ? s->source : "config.json", s->source ? " metadata" : "", shown, kv->key, s->path);
    }
    free(copy);
    return rc;
}

/* 1 if config value v reads as `text` (a string equal to it; true/false; an integer). */
static int value_is(const json_t *v, const char *text)
{
    char buf[32];
    if (json_is_string(v))
        return strcmp(json_string_value(v), text) == 0;
    if (json_is_boolean(v))
        return strcmp(json_is_true(v) ? "true" : "false", text) == 0;
    if (json_is_integer(v)) {
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        return strcmp(buf, text) == 0;
    }
    return 0;
}

/* [blocks.KEY=VALUE] over blocks where the config has KEY = VALUE; a present KEY whose value no
 * section names is refused (the spec would otherwise pick blocks for another value). */
static int apply_whens(const iflow_spec *s, const json_t *config, json_t *blocks)
{
    for (size_t i = 0; i < s->n_whens; i++) {
        const iflow_spec_when *w = &s->whens[i];
        const json_t *v = w->hparams ? NULL : lookup(config, w->key);
        int named = 0;
        char values[256] = "";
        for (size_t j = 0; v && j < s->n_whens; j++)
            if (!s->whens[j].hparams && strcmp(s->whens[j].key, w->key) == 0) {
                named |= value_is(v, s->whens[j].value);
                size_t n = strlen(values);
                snprintf(values + n, sizeof values - n, "%s%s", n ? ", " : "", s->whens[j].value);
            }
        if (v && !named) {
            char *text = json_dumps(v, JSON_ENCODE_ANY);
            int rc = iflow_seterr(IFLOW_ESPEC, "config.json's %s = %s is not one spec '%s' has blocks for (%s)", w->key,
                                  text ? text : "?", s->path, values);
            free(text);
            return rc;
        }
        for (size_t k = 0; v && value_is(v, w->value) && k < w->n_blocks; k++)
            if (json_object_set_new(blocks, w->blocks[k].key, json_string(w->blocks[k].value)))
                return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    return 0;
}

int iflow_spec_resolve(const iflow_spec *s, const json_t *config, json_t **resolved)
{
    *resolved = NULL;
    json_t *out = json_object(), *blocks = json_object(), *hp = json_object();
    int rc = out && blocks && hp ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (size_t i = 0; i < s->n_blocks && rc == 0; i++)
        rc = json_object_set_new(blocks, s->blocks[i].key, json_string(s->blocks[i].value)) ? IFLOW_ENOMEM : 0;
    if (rc == 0)
        rc = apply_whens(s, config, blocks);
    for (size_t i = 0; i < s->n_hparams && rc == 0; i++) {
        json_t *v;
        rc = eval_alternatives(s, &s->hparams[i], config, &v);
        if (rc == 0)
            json_object_set_new(hp, s->hparams[i].key, v);
    }
    /* [hparams.KEY=VALUE] over them, in file order, where the config has KEY = VALUE */
    for (size_t i = 0; i < s->n_whens && rc == 0; i++) {
        const iflow_spec_when *w = &s->whens[i];
        const json_t *c = w->hparams ? lookup(config, w->key) : NULL;
        for (size_t k = 0; c && value_is(c, w->value) && k < w->n_blocks && rc == 0; k++) {
            json_t *v;
            if ((rc = eval_alternatives(s, &w->blocks[k], config, &v)) == 0)
                json_object_set_new(hp, w->blocks[k].key, v);
        }
    }
    if (rc == 0) {
        json_object_set_new(out, "spec", json_string(s->name));
        json_object_set(out, "blocks", blocks);
        json_object_set(out, "hparams", hp);
        *resolved = out;
        out = NULL;
    }
    json_decref(blocks);
    json_decref(hp);
    json_decref(out);
    return rc;
}

/* The index placeholders of a tensor-name pattern: {L} the layer, {E} the expert (a mixture of
 * experts' FFN). */
static const char *const placeholders[2] = {"{L}", "{E}"};

/* The next placeholder in p at or after it (its kind in *which), or NULL. */
static const char *next_placeholder(const char *p, int *which)
{
    const char *best = NULL;
    for (int i = 0; i < 2; i++) {
        const char *b = strstr(p, placeholders[i]);
        if (b && (!best || b < best))
            best = b, *which = i;
    }
    return best;
}

/* Match `name` against `pattern` where "{L}" and "{E}" stand for decimal indices: idx[0] the
 * layer, idx[1] the expert. */
static int match_indices(const char *pattern, const char *name, long idx[2])
{
    int which;
    for (const char *brace; (brace = next_placeholder(pattern, &which)); pattern = brace + 3) {
        size_t pre = (size_t)(brace - pattern);
        if (strncmp(pattern, name, pre) != 0)
            return 0;
        char *end;
        const char *num = name + pre;
        if (*num < '0' || *num > '9')
            return 0;
        idx[which] = strtol(num, &end, 10);
        name = end;
    }
    return strcmp(pattern, name) == 0;
}

/* pattern with every "{L}" and "{E}" replaced by its index (alternatives "A | B" name them in each). */
static void subst_indices(const char *pattern, const long idx[2], char *buf, size_t cap)
{
    size_t n = 0;
    int which;
    buf[0] = 0;
    for (const char *p = pattern, *brace; n < cap; p = brace + 3) {
        if (!(brace = next_placeholder(p, &which))) {
            snprintf(buf + n, cap - n, "%s", p);
            return;
        }
        n += (size_t)snprintf(buf + n, cap - n, "%.*s%ld", (int)(brace - p), p, idx[which]);
    }
}

int iflow_spec_source_name(const iflow_spec *s, const char *iflow_name, char *buf, size_t cap)
{
    for (size_t i = 0; i < s->n_tensors; i++) {
        long idx[2] = {0, 0};
        if (match_indices(s->tensors[i].key, iflow_name, idx)) {
            subst_indices(s->tensors[i].value, idx, buf, cap);
            return 0;
        }
    }
    return iflow_seterr(IFLOW_ENOTFOUND, "spec '%s' does not map tensor '%s'", s->path, iflow_name);
}

int iflow_spec_ignored(const iflow_spec *s, const char *source_name)
{
    for (size_t i = 0; i < s->n_ignore; i++)
        if (fnmatch(s->ignore[i], source_name, 0) == 0)
            return 1;
    return 0;
}

const char *iflow_spec_block(const iflow_spec *s, const char *key)
{
    const char *v = NULL;
    for (size_t i = 0; i < s->n_blocks; i++)
        if (strcmp(s->blocks[i].key, key) == 0)
            v = s->blocks[i].value;
    return v;
}
