/* hfdir.c -- see hfdir.h. */
#include "hfdir.h"
#include "libcore/base/error.h"
#include "libcore/base/jsonutil.h"
#include "libcore/base/quote.h"
#include "pickle.h"
#include "safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

/* A weight file: safetensors, or a PyTorch zip checkpoint (pytorch_model*.bin). */
typedef struct {
    iflow_st *st;
    iflow_pt *pt;
} wfile;

static const char *wfile_path(const wfile *w) { return w->st ? iflow_st_path(w->st) : iflow_pt_path(w->pt); }
static size_t wfile_n_tensors(const wfile *w) { return w->st ? iflow_st_n_tensors(w->st) : iflow_pt_n_tensors(w->pt); }

static void wfile_close(wfile *w)
{
    iflow_st_close(w->st);
    iflow_pt_close(w->pt);
}

struct iflow_hfdir {
    char *path;
    json_t *config, *gen_config, *tok_config;
    wfile *files;
    size_t n_files;
    iflow_src_tensor *t; /* flat list over all files */
    size_t n;
    size_t *slots;       /* open-addressing hash of names: index + 1, 0 = empty */
    size_t n_slots;      /* a power of two */
};

/* ---- paths ---------------------------------------------------------------------------------- */

/* "dir/name" (malloc'd), or NULL with the message set. */
static char *join(const char *dir, const char *name)
{
    size_t ld = strlen(dir), ln = strlen(name);
    int slash = ld > 0 && dir[ld - 1] != '/';
    char *p = malloc(ld + slash + ln + 1);
    if (!p) {
        iflow_seterr(IFLOW_ENOMEM, "out of memory joining '%s' and '%s'", dir, name);
        return NULL;
    }
    memcpy(p, dir, ld);
    if (slash)
        p[ld] = '/';
    memcpy(p + ld + slash, name, ln + 1);
    return p;
}

static int is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int has_file(const iflow_hfdir *h, const char *name)
{
    char *p = join(h->path, name);
    int yes = p && is_file(p);
    free(p);
    return yes;
}

static int check_dir(const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) < 0)
        return iflow_seterr(errno == ENOENT ? IFLOW_ENOTFOUND : IFLOW_EIO,
                            "cannot open model directory '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return iflow_seterr(IFLOW_EINVAL, "model path '%s' is not a directory", dir);
    return 0;
}

/* ---- JSON files ----------------------------------------------------------------------------- */

/* Load dir/name as an object into *out; a missing file is 0 with *out NULL unless required. */
static int load_json(const iflow_hfdir *h, const char *name, int required, json_t **out)
{
    char *p = join(h->path, name);
    if (!p)
        return IFLOW_ENOMEM;
    int rc = 0;
    if (is_file(p))
        rc = iflow_json_load_object(out, p);
    else if (required)
        rc = iflow_seterr(IFLOW_ENOTFOUND, "no %s in model directory '%s'", name, h->path);
    free(p);
    return rc;
}

/* ---- weights -------------------------------------------------------------------------------- */

static size_t hash_name(const char *name)
{
    return (size_t)XXH3_64bits(name, strlen(name));
}

/* The slot holding `name`, or the empty slot where it would go. */
static size_t *slot_for(const iflow_hfdir *h, const char *name)
{
    size_t mask = h->n_slots - 1;
    for (size_t i = hash_name(name) & mask;; i = (i + 1) & mask)
        if (h->slots[i] == 0 || strcmp(h->t[h->slots[i] - 1].name, name) == 0)
            return &h->slots[i];
}

static int build_index(iflow_hfdir *h)
{
    h->n_slots = 16;
    while (h->n_slots < 2 * h->n)
        h->n_slots *= 2;
    h->slots = calloc(h->n_slots, sizeof *h->slots);
    if (!h->slots)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory indexing %zu tensors in '%s'", h->n,
                            h->path);
    for (size_t i = 0; i < h->n; i++) {
        size_t *s = slot_for(h, h->t[i].name);
        if (*s)
            return iflow_seterr(IFLOW_EFORMAT, "tensor '%s' is in both '%s' and '%s'",
                                iflow_quote(h->t[i].name), wfile_path(&h->files[h->t[*s - 1].file]),
                                wfile_path(&h->files[h->t[i].file]));
        *s = i + 1;
    }
    return 0;
}

/* Copy every file's tensors into one list, tagged with their file index. A PyTorch tensor
 * must be contiguous (a state dict's are): the list describes bytes in place. */
static int flatten(iflow_hfdir *h)
{
    size_t n = 0;
    for (size_t f = 0; f < h->n_files; f++)
        n += wfile_n_tensors(&h->files[f]);
    h->t = malloc((n ? n : 1) * sizeof *h->t);
    if (!h->t)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory listing %zu tensors in '%s'", n,
                            h->path);
    for (size_t f = 0; f < h->n_files; f++)
        for (size_t i = 0; i < wfile_n_tensors(&h->files[f]); i++) {
            const wfile *w = &h->files[f];
            if (w->pt && !iflow_pt_tensor(w->pt, i)->contiguous)
                return iflow_seterr(IFLOW_EUNSUPPORTED, "tensor '%s' in '%s' is a strided view; iflow reads "
                                    "contiguous tensors", iflow_quote(iflow_pt_tensor(w->pt, i)->t.name),
                                    wfile_path(w));
            h->t[h->n] = w->st ? *iflow_st_tensor(w->st, i) : iflow_pt_tensor(w->pt, i)->t;
            h->t[h->n++].file = (int)f;
        }
    return build_index(h);
}

/* Open dir/name as weight file number h->n_files: safetensors, or PyTorch's zip checkpoint
 * when the name does not end in .safetensors. */
static int open_weights(iflow_hfdir *h, const char *name)
{
    char *p = join(h->path, name);
    if (!p)
        return IFLOW_ENOMEM;
    size_t n = strlen(name);
    wfile *w = &h->files[h->n_files];
    int rc = n > 12 && strcmp(name + n - 12, ".safetensors") == 0 ? iflow_st_open(&w->st, p) : iflow_pt_open(&w->pt, p);
    free(p);
    if (rc == 0)
        h->n_files++;
    return rc;
}

static int open_single(iflow_hfdir *h, const char *name)
{
    h->files = calloc(1, sizeof *h->files);
    if (!h->files)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory opening '%s'", h->path);
    int rc = open_weights(h, name);
    return rc < 0 ? rc : flatten(h);
}

static int by_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name from the index must be a plain file name inside the directory. */
static int check_shard_name(const char *name, const char *tensor, const char *index)
{
    if (!*name || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return iflow_seterr(IFLOW_EFORMAT, "tensor '%s' is mapped to '%s', not a file name in "
                            "the model directory, by '%s'", iflow_quote(tensor), iflow_quote(name), index);
    return 0;
}

/* The distinct file names of weight_map, sorted, into *names (borrowed strings). */
static int shard_names(const json_t *map, const char *index, const char ***names, size_t *n)
{
    *n = 0;
    *names = malloc((json_object_size(map) ? json_object_size(map) : 1) * sizeof **names);
    if (!*names)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory reading '%s'", index);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)map, key, v) {
        if (!json_is_string(v))
            return iflow_seterr(IFLOW_EFORMAT, "tensor '%s' is mapped to %s, not a file name, "
                                "by '%s'", iflow_quote(key), iflow_json_type_name(v), index);
        int rc = check_shard_name(json_string_value(v), key, index);
        if (rc < 0)
            return rc;
        (*names)[(*n)++] = json_string_value(v);
    }
    qsort(*names, *n, sizeof **names, by_str);
    size_t u = 0;
    for (size_t i = 0; i < *n; i++)
        if (u == 0 || strcmp((*names)[u - 1], (*names)[i]) != 0)
            (*names)[u++] = (*names)[i];
    *n = u;
    return 0;
}

static int open_shards(iflow_hfdir *h, const char **names, size_t n, const char *index)
{
    h->files = calloc(n ? n : 1, sizeof *h->files);
    if (!h->files)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory opening %zu shards of '%s'", n, h->path);
    for (size_t i = 0; i < n; i++) {
        if (!has_file(h, names[i]))
            return iflow_seterr(IFLOW_ENOTFOUND, "shard '%s' listed in '%s' not found",
                                iflow_quote(names[i]), index);
        int rc = open_weights(h, names[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Every weight_map entry names the file that holds the tensor. */
static int check_weight_map(const iflow_hfdir *h, const json_t *map, const char *index)
{
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)map, key, v) {
        const iflow_src_tensor *t = iflow_hfdir_find(h, key);
        const char *want = json_string_value(v);
        if (!t)
            return iflow_seterr(IFLOW_ENOTFOUND, "tensor '%s' mapped to '%s' by '%s' is not in "
                                "that file", iflow_quote(key), iflow_quote(want), index);
        const char *have = wfile_path(&h->files[t->file]);
        size_t lh = strlen(have), lw = strlen(want);
        if (lh < lw + 1 || have[lh - lw - 1] != '/' || strcmp(have + lh - lw, want) != 0)
            return iflow_seterr(IFLOW_EFORMAT, "tensor '%s' mapped to '%s' by '%s' is in '%s' "
                                "instead", iflow_quote(key), iflow_quote(want), index, have);
    }
    return 0;
}

static int open_sharded(iflow_hfdir *h, const char *index)
{
    json_t *idx;
    int rc = iflow_json_load_object(&idx, index);
    if (rc < 0)
        return rc;
    const json_t *map = json_object_get(idx, "weight_map");
    const char **names = NULL;
    size_t n = 0;
    if (!json_is_object(map))
        rc = iflow_seterr(IFLOW_EFORMAT, "no weight_map object in '%s'", index);
    else if (json_object_size(map) == 0)
        rc = iflow_seterr(IFLOW_ENOTFOUND, "empty weight_map in '%s'", index);
    if (rc == 0)
        rc = shard_names(map, index, &names, &n);
    if (rc == 0)
        rc = open_shards(h, names, n, index);
    if (rc == 0)
        rc = flatten(h);
    if (rc == 0)
        rc = check_weight_map(h, map, index);
    free(names);
    json_decref(idx);
    return rc;
}

/* safetensors first (single, then sharded), then PyTorch's pytorch_model.bin (likewise). */
static int open_weights_any(iflow_hfdir *h)
{
    static const char *const single[2] = {"model.safetensors", "pytorch_model.bin"};
    static const char *const index[2] = {"model.safetensors.index.json", "pytorch_model.bin.index.json"};
    for (int k = 0; k < 2; k++) {
        if (has_file(h, single[k]))
            return open_single(h, single[k]);
        char *p = join(h->path, index[k]);
        if (!p)
            return IFLOW_ENOMEM;
        int rc = is_file(p) ? open_sharded(h, p) : 1;
        free(p);
        if (rc <= 0)
            return rc;
    }
    return iflow_seterr(IFLOW_ENOTFOUND, "no weights in model directory '%s' (no model.safetensors, "
                        "pytorch_model.bin or their .index.json)", h->path);
}

/* ---- sentence-transformers ---------------------------------------------------------------- *
 * A sentence-transformers folder lists its modules in modules.json: the transformer, a Pooling
 * module (its folder's config.json says which pooling) and optionally Normalize. What they say
 * goes into the config as "sentence_transformers": {"pooling": "mean" | "cls" | "max" |
 * "mean_sqrt_len", "normalize": true | false}, for specs to read like any config key. */
static int sentence_transformers(iflow_hfdir *h)
{
    json_t *mods = NULL, *pool = NULL;
    char *p = join(h->path, "modules.json");
    if (!p)
        return IFLOW_ENOMEM;
    int rc = is_file(p) ? iflow_json_load_file(&mods, p) : 1;
    if (rc != 0) {
        free(p);
        return rc < 0 ? rc : 0;
    }
    const char *pooling = NULL;
    int normalize = 0;
    size_t i;
    json_t *m;
    if (!json_is_array(mods))
        rc = iflow_seterr(IFLOW_EFORMAT, "'%s' is not a list of modules", p);
    json_array_foreach(json_is_array(mods) ? mods : NULL, i, m) {
        const char *type = json_string_value(json_object_get(m, "type")), *dir = json_string_value(json_object_get(m, "path"));
        size_t n = type ? strlen(type) : 0;
        if (rc || !type)
            continue;
        if (n >= 10 && strcmp(type + n - 10, ".Normalize") == 0)
            normalize = 1;
        if (n < 8 || strcmp(type + n - 8, ".Pooling") != 0)
            continue;
        if (!dir || !*dir || strspn(dir, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != strlen(dir)) {
            rc = iflow_seterr(IFLOW_EFORMAT, "module %zu of '%s' has no plain folder name", i, p);
            continue;
        }
        char cfg[300];
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        if ((rc = load_json(h, cfg, 1, &pool)) < 0)
            continue;
        static const char *const modes[][2] = {{"pooling_mode_mean_tokens", "mean"}, {"pooling_mode_cls_token", "cls"},
                                               {"pooling_mode_max_tokens", "max"},
                                               {"pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"}};
        for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++)
            if (json_is_true(json_object_get(pool, modes[k][0])))
                pooling = pooling ? "several" : modes[k][1];
        json_decref(pool);
        pool = NULL;
    }
    if (rc == 0 && pooling) {
        json_t *st = json_pack("{s:s, s:b}", "pooling", pooling, "normalize", normalize);
        rc = st && json_object_set_new(h->config, "sentence_transformers", st) == 0 ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    json_decref(mods);
    free(p);
    return rc;
}

/* ---- open / close --------------------------------------------------------------------------- */

static int open_all(iflow_hfdir *h, int flags)
{
    int rc = check_dir(h->path);
    if (rc == 0)
        rc = load_json(h, "config.json", 1, &h->config);
    if (rc == 0)
        rc = sentence_transformers(h);
    if (rc == 0)
        rc = load_json(h, "generation_config.json", 0, &h->gen_config);
    if (rc == 0)
        rc = load_json(h, "tokenizer_config.json", 0, &h->tok_config);
    if (rc == 0 && !(flags & IFLOW_HFDIR_CONFIG_ONLY))
        rc = open_weights_any(h);
    return rc;
}

int iflow_hfdir_open(iflow_hfdir **out, const char *dir, int flags)
{
    *out = NULL;
    iflow_hfdir *h = calloc(1, sizeof *h);
    if (!h || !(h->path = strdup(dir))) {
        free(h);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory opening '%s'", dir);
    }
    int rc = open_all(h, flags);
    if (rc < 0) {
        iflow_hfdir_close(h);
        return rc;
    }
    *out = h;
    return 0;
}

void iflow_hfdir_close(iflow_hfdir *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->n_files; i++)
        wfile_close(&h->files[i]);
    free(h->files);
    free(h->t);
    free(h->slots);
    json_decref(h->config);
    json_decref(h->gen_config);
    json_decref(h->tok_config);
    free(h->path);
    free(h);
}

/* ---- queries -------------------------------------------------------------------------------- */

const char *iflow_hfdir_path(const iflow_hfdir *h) { return h->path; }
const json_t *iflow_hfdir_config(const iflow_hfdir *h) { return h->config; }
const json_t *iflow_hfdir_generation_config(const iflow_hfdir *h) { return h->gen_config; }
const json_t *iflow_hfdir_tokenizer_config(const iflow_hfdir *h) { return h->tok_config; }
size_t iflow_hfdir_n_files(const iflow_hfdir *h) { return h->n_files; }
size_t iflow_hfdir_n_tensors(const iflow_hfdir *h) { return h->n; }

const char *iflow_hfdir_file_path(const iflow_hfdir *h, size_t i)
{
    return i < h->n_files ? wfile_path(&h->files[i]) : NULL;
}

const iflow_src_tensor *iflow_hfdir_tensor(const iflow_hfdir *h, size_t i)
{
    return i < h->n ? &h->t[i] : NULL;
}

const iflow_src_tensor *iflow_hfdir_find(const iflow_hfdir *h, const char *name)
{
    if (!h->slots)
        return NULL;
    size_t s = *slot_for(h, name);
    return s ? &h->t[s - 1] : NULL;
}

void iflow_hfdir_release(iflow_hfdir *h, const iflow_src_tensor *t)
{
    if (!t || t->file < 0 || (size_t)t->file >= h->n_files)
        return;
    const wfile *w = &h->files[t->file];
    if (w->st)
        iflow_st_release(w->st, t);
    else
        iflow_pt_release(w->pt, iflow_pt_find(w->pt, t->name));
}
