/* lora.c -- see lora.h. */
#include "lora.h"
#include "ggufsrc.h"
#include "safetensors.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/base/jsonutil.h"
#include "libcore/base/quote.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct iflow_lora {
    char *path;
    int naming;
    iflow_lora_delta *d; /* [n], sorted by target */
    size_t n;
};

/* One tensor of the file: which delta it is half of, and which half. */
typedef struct {
    char *target;
    int is_b;
    const iflow_src_tensor *t;
} half;

/* What scales an adapter's deltas: s = alpha / r (alpha / sqrt(r) with rslora; 1 when a GGUF
 * adapter's alpha is 0 or absent, as llama.cpp reads it) times the caller's scale; a rank other
 * than `rank` (> 0: the config's r) is refused. */
typedef struct {
    double alpha, scale;
    int rslora;
    int64_t rank;
} scaling;

/* How the halves' data is read: from safetensors (st) or through ggufsrc (gs). */
typedef struct {
    iflow_st *st;
    iflow_ggufsrc *gs;
} reader;

static int oom(const char *path) { return iflow_seterr(IFLOW_ENOMEM, "out of memory reading LoRA adapter '%s'", path); }

/* ---- names ---- */

static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/* PEFT: "base_model.model." X (".lora_A" | ".lora_B") ("" | ".default") ".weight" -> X ".weight". */
static int peft_half(const char *path, const char *name, half *h)
{
    static const char PREFIX[] = "base_model.model.";
    static const char *const KIND[] = {".lora_A.weight", ".lora_B.weight", ".lora_A.default.weight",
                                       ".lora_B.default.weight"};
    size_t n = strlen(name), p = sizeof PREFIX - 1;
    if (strstr(name, "lora_embedding_"))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "LoRA adapter '%s': tensor '%s' adapts an embedding, which iflow "
                            "cannot merge yet", path, iflow_quote(name));
    if (strstr(name, "lora_magnitude_vector"))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "LoRA adapter '%s': tensor '%s' is DoRA's magnitude (use_dora), which "
                            "iflow does not merge", path, iflow_quote(name));
    for (int k = 0; k < 4; k++) {
        size_t kn = strlen(KIND[k]);
        if (n > p + kn && strncmp(name, PREFIX, p) == 0 && ends_with(name, n, KIND[k])) {
            size_t x = n - p - kn;
            h->target = malloc(x + sizeof ".weight");
            if (!h->target)
                return oom(path);
            memcpy(h->target, name + p, x);
            memcpy(h->target + x, ".weight", sizeof ".weight");
            h->is_b = k & 1;
            return 0;
        }
    }
    return iflow_seterr(IFLOW_EUNSUPPORTED, "LoRA adapter '%s': tensor '%s' is not a LoRA matrix "
                        "(base_model.model.NAME.lora_A.weight or .lora_B.weight): a LoRA bias or a module saved whole "
                        "(modules_to_save) cannot be merged", path, iflow_quote(name));
}

/* llama.cpp: X ".lora_a" | X ".lora_b" -> X. */
static int gguf_half(const char *path, const char *name, half *h)
{
    size_t n = strlen(name);
    int b = ends_with(name, n, ".lora_b");
    if (n <= 7 || (!b && !ends_with(name, n, ".lora_a")))
        return iflow_seterr(IFLOW_EFORMAT, "LoRA adapter '%s': tensor '%s' is not a LoRA matrix (NAME.lora_a or "
                            "NAME.lora_b)", path, iflow_quote(name));
    h->target = strndup(name, n - 7);
    h->is_b = b;
    return h->target ? 0 : oom(path);
}

static int by_target(const void *x, const void *y)
{
    const half *a = x, *b = y;
    int c = strcmp(a->target, b->target);
    return c ? c : a->is_b - b->is_b;
}

/* ---- data ---- */

/* Tensor t as n F32 values in a new array *out. */
static int read_f32(const reader *r, const char *path, const iflow_src_tensor *t, size_t n, float **out)
{
    float *v = malloc(n * sizeof *v + 1);
    if (!v)
        return oom(path);
    int rc;
    if (r->gs) {
        const void *data;
        rc = iflow_ggufsrc_payload(r->gs, t, IFLOW_DT_F32, &data, v);
        if (rc == 0 && data != v)
            memcpy(v, data, n * sizeof *v);
    } else if (t->dtype < 0 || !iflow_dtype_is_float(t->dtype)) {
        rc = iflow_seterr(IFLOW_EUNSUPPORTED, "LoRA adapter '%s': tensor '%s' is %s: F32, F16 or BF16 is needed", path,
                          iflow_quote(t->name), t->dtype_name);
    } else {
        void *raw = malloc(t->nbytes + 1); /* aligned for the conversion */
        rc = raw ? 0 : oom(path);
        if (rc == 0) {
            memcpy(raw, t->data, t->nbytes);
            rc = iflow_dtype_convert(v, IFLOW_DT_F32, raw, t->dtype, n);
        }
        free(raw);
    }
    if (rc < 0) {
        free(v);
        return rc;
    }
    *out = v;
    return 0;
}

/* A (shape [r][in]) and B ([out][r]) of one target: checked, then read. */
static int make_delta(iflow_lora *l, const reader *r, const half *a, const half *b, const scaling *sc,
                      uint64_t *floats)
{
    const iflow_src_tensor *ta = a->t, *tb = b->t;
    const char *tn = iflow_quote(a->target);
    if (ta->n_dims != 2 || tb->n_dims != 2)
        return iflow_seterr(IFLOW_EFORMAT, "LoRA adapter '%s': the A and B of '%s' must be matrices (%d and %d "
                            "dimensions)", l->path, tn, ta->n_dims, tb->n_dims);
    int64_t rank = ta->shape[0], in = ta->shape[1], out = tb->shape[0];
    if (rank < 1 || rank > IFLOW_LORA_MAX_RANK || tb->shape[1] != rank || in < 1 || out < 1)
        return iflow_seterr(IFLOW_EFORMAT, "LoRA adapter '%s': '%s' has A [%lld, %lld] and B [%lld, %lld]: the rank "
                            "(A's rows, B's columns) must agree and lie in 1..%d", l->path, tn, (long long)rank,
                            (long long)in, (long long)out, (long long)tb->shape[1], IFLOW_LORA_MAX_RANK);
    if (sc->rank > 0 && sc->rank != rank)
        return iflow_seterr(IFLOW_EFORMAT, "LoRA adapter '%s': '%s' has rank %lld, the config's r is %lld", l->path, tn,
                            (long long)rank, (long long)sc->rank);
    uint64_t nf = (uint64_t)rank * (uint64_t)in + (uint64_t)out * (uint64_t)rank;
    if (nf > IFLOW_LORA_MAX_FLOATS - *floats)
        return iflow_seterr(IFLOW_ERANGE, "LoRA adapter '%s': its deltas hold more than %llu values", l->path,
                            (unsigned long long)IFLOW_LORA_MAX_FLOATS);
    *floats += nf;
    iflow_lora_delta *d = &l->d[l->n];
    d->rank = (int)rank, d->in = in, d->out = out;
    d->scale = sc->scale * (sc->alpha == 0 && l->naming == IFLOW_LORA_GGUF
                                ? 1.0
                                : sc->alpha / (sc->rslora ? sqrt((double)rank) : (double)rank));
    float *fa = NULL, *fb = NULL;
    int rc = read_f32(r, l->path, ta, (size_t)(rank * in), &fa);
    if (rc == 0)
        rc = read_f32(r, l->path, tb, (size_t)(out * rank), &fb);
    if (rc < 0) {
        free(fa);
        return rc;
    }
    d->a = fa, d->b = fb;
    d->target = a->target; /* taken over from the half */
    l->n++;
    return 0;
}

/* Pair the halves of the n tensors (tensor i: at(r, i)), then read each pair. */
static int build(iflow_lora *l, const reader *r, size_t n, const iflow_src_tensor *(*at)(const reader *, size_t),
                 const scaling *sc)
{
    half *h = calloc(n ? n : 1, sizeof *h);
    l->d = calloc(n / 2 + 1, sizeof *l->d);
    int rc = h && l->d ? 0 : oom(l->path);
    size_t got = 0;
    for (; got < n && rc == 0; got++) {
        h[got].t = at(r, got);
        rc = l->naming == IFLOW_LORA_HF ? peft_half(l->path, h[got].t->name, &h[got])
                                        : gguf_half(l->path, h[got].t->name, &h[got]);
        if (rc < 0)
            break;
    }
    if (rc == 0 && n == 0)
        rc = iflow_seterr(IFLOW_EFORMAT, "LoRA adapter '%s' holds no tensors", l->path);
    if (rc == 0)
        qsort(h, n, sizeof *h, by_target);
    uint64_t floats = 0;
    for (size_t i = 0; i < n && rc == 0; i += 2) {
        if (i + 1 >= n || strcmp(h[i].target, h[i + 1].target) != 0 || h[i].is_b == h[i + 1].is_b) {
            const half *x = i + 1 < n && strcmp(h[i].target, h[i + 1].target) == 0 ? &h[i + 1] : &h[i];
            rc = iflow_seterr(IFLOW_EFORMAT, "LoRA adapter '%s': '%s' has %s: each target needs one A and one B",
                              l->path, iflow_quote(x->target), x == &h[i] ? (x->is_b ? "a B and no A" : "an A and no B")
                                                                          : "two of the same half");
            break;
        }
        if ((rc = make_delta(l, r, &h[i], &h[i + 1], sc, &floats)) == 0)
            h[i].target = NULL; /* the delta owns it */
    }
    for (size_t i = 0; i < got; i++)
        free(h[i].target);
    free(h);
    return rc;
}

/* ---- PEFT ---- */

static const iflow_src_tensor *st_at(const reader *r, size_t i) { return iflow_st_tensor(r->st, i); }

/* adapter_config.json: what iflow cannot merge is refused; alpha, rslora and r are read. */
static int peft_config(const char *path, const json_t *c, scaling *sc)
{
    if (!json_is_object(c))
        return iflow_seterr(IFLOW_EFORMAT, "LoRA adapter '%s': adapter_config.json is not a JSON object", path);
    const char *type = iflow_json_string(c, "peft_type", "LORA");
    if (strcmp(type, "LORA") != 0)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "LoRA adapter '%s': peft_type is '%s', not LORA", path,
                            iflow_quote(type));
    static const char *const REFUSED[] = {"fan_in_fan_out", "use_dora", "lora_bias"};
    for (size_t i = 0; i < sizeof REFUSED / sizeof REFUSED[0]; i++)
        if (iflow_json_bool(c, REFUSED[i], 0))
            return iflow_seterr(IFLOW_EUNSUPPORTED, "LoRA adapter '%s': %s is true, which iflow does not merge", path,
                                REFUSED[i]);
    static const char *const PATTERNS[] = {"alpha_pattern", "rank_pattern"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *p = json_object_get(c, PATTERNS[i]);
        if (p && !json_is_null(p) && !(json_is_object(p) && json_object_size(p) == 0))
            return iflow_seterr(IFLOW_EUNSUPPORTED, "LoRA adapter '%s': %s (per-module ranks or alphas) is not "
                                "supported", path, PATTERNS[i]);
    }
    const json_t *mts = json_object_get(c, "modules_to_save");
    if (mts && !json_is_null(mts) && !(json_is_array(mts) && json_array_size(mts) == 0))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "LoRA adapter '%s': modules_to_save (whole modules beside the "
                            "adapter) is not supported", path);
    sc->alpha = iflow_json_number(c, "lora_alpha", 8); /* PEFT's default */
    sc->rslora = iflow_json_bool(c, "use_rslora", 0);
    sc->rank = iflow_json_int(c, "r", 0);
    if (!isfinite(sc->alpha))
        return iflow_seterr(IFLOW_EFORMAT, "LoRA adapter '%s': lora_alpha is not a finite number", path);
    return 0;
}

static int peft_build(iflow_lora *l, const json_t *config, iflow_st *st, double scale)
{
    scaling sc = {.scale = scale};
    IFLOW_TRY(peft_config(l->path, config, &sc));
    reader r = {.st = st};
    return build(l, &r, iflow_st_n_tensors(st), st_at, &sc);
}

static iflow_lora *lora_new(const char *path, int naming)
{
    iflow_lora *l = calloc(1, sizeof *l);
    if (l && !(l->path = strdup(path))) {
        free(l);
        l = NULL;
    }
    if (l)
        l->naming = naming;
    return l;
}

/* The PEFT adapter l from its config c and its safetensors s (both released here), rc what
 * opening them gave. */
static int peft_finish(iflow_lora **out, iflow_lora *l, json_t *c, iflow_st *s, int rc, double scale)
{
    if (rc == 0)
        rc = peft_build(l, c, s, scale);
    json_decref(c);
    iflow_st_close(s);
    if (rc < 0)
        return iflow_lora_close(l), rc;
    *out = l;
    return 0;
}

int iflow_lora_open_peft_mem(iflow_lora **out, const char *config, size_t config_len, const void *st, size_t st_len,
                             const char *name, double scale)
{
    *out = NULL;
    iflow_lora *l = lora_new(name, IFLOW_LORA_HF);
    if (!l)
        return oom(name);
    json_t *c = NULL;
    iflow_st *s = NULL;
    int rc = iflow_json_load_buf(&c, config, config_len, name);
    if (rc == 0)
        rc = iflow_st_open_mem(&s, st, st_len, name);
    return peft_finish(out, l, c, s, rc, scale);
}

static int peft_open(iflow_lora **out, const char *path, double scale)
{
    struct stat sb;
    char cfg[4096], st_path[4096];
    if (stat(path, &sb) != 0)
        return iflow_seterr(IFLOW_ENOTFOUND, "cannot open LoRA adapter '%s': %s", path, strerror(errno));
    int is_dir = S_ISDIR(sb.st_mode);
    const char *slash = strrchr(path, '/');
    int dir_len = is_dir ? (int)strlen(path) : slash ? (int)(slash - path) : 1;
    const char *dir = is_dir || slash ? path : ".";
    if (snprintf(cfg, sizeof cfg, "%.*s/adapter_config.json", dir_len, dir) >= (int)sizeof cfg ||
        snprintf(st_path, sizeof st_path, "%s%s", path, is_dir ? "/adapter_model.safetensors" : "") >=
            (int)sizeof st_path)
        return iflow_seterr(IFLOW_EINVAL, "LoRA adapter path '%s' is too long", path);
    iflow_lora *l = lora_new(path, IFLOW_LORA_HF);
    if (!l)
        return oom(path);
    json_t *c = NULL;
    iflow_st *s = NULL;
    int rc = iflow_json_load_file(&c, cfg);
    if (rc == IFLOW_ENOTFOUND)
        rc = iflow_seterr(rc, "LoRA adapter '%s': no adapter_config.json beside it (%s)", path, cfg);
    if (rc == 0 && (rc = iflow_st_open(&s, st_path)) == IFLOW_ENOTFOUND)
        rc = iflow_seterr(rc, "LoRA adapter '%s': no %s", path, st_path);
    return peft_finish(out, l, c, s, rc, scale);
}

/* ---- GGUF ---- */

static const iflow_src_tensor *gs_at(const reader *r, size_t i) { return iflow_ggufsrc_tensor(r->gs, i); }

static int gguf_build(iflow_lora *l, iflow_ggufsrc *gs, double scale)
{
    const json_t *c = iflow_ggufsrc_config(gs);
    const char *type = iflow_json_string(c, "general.type", "(none)"),
               *kind = iflow_json_string(c, "adapter.type", "(none)");
    if (strcmp(type, "adapter") != 0 || strcmp(kind, "lora") != 0)
        return iflow_seterr(IFLOW_EFORMAT, "'%s' is not a LoRA adapter: its general.type is '%s' and adapter.type "
                            "'%s' (a LoRA adapter says \"adapter\" and \"lora\")", l->path, iflow_quote(type),
                            iflow_quote(kind));
    scaling sc = {.alpha = iflow_json_number(c, "adapter.lora.alpha", 0), .scale = scale};
    if (!isfinite(sc.alpha))
        return iflow_seterr(IFLOW_EFORMAT, "LoRA adapter '%s': adapter.lora.alpha is not a finite number", l->path);
    reader r = {.gs = gs};
    return build(l, &r, iflow_ggufsrc_n_tensors(gs), gs_at, &sc);
}

static int gguf_finish(iflow_lora **out, iflow_lora *l, iflow_ggufsrc *gs, int rc, double scale)
{
    if (rc == 0)
        rc = gguf_build(l, gs, scale);
    iflow_ggufsrc_close(gs);
    if (rc < 0)
        return iflow_lora_close(l), rc;
    *out = l;
    return 0;
}

int iflow_lora_open_gguf_mem(iflow_lora **out, const void *buf, size_t len, const char *name, double scale)
{
    *out = NULL;
    iflow_lora *l = lora_new(name, IFLOW_LORA_GGUF);
    if (!l)
        return oom(name);
    iflow_gguf *g = NULL;
    iflow_ggufsrc *gs = NULL;
    int rc = iflow_gguf_open_mem(&g, buf, len, name);
    if (rc == 0)
        rc = iflow_ggufsrc_from(&gs, g);
    return gguf_finish(out, l, gs, rc, scale);
}

int iflow_lora_open(iflow_lora **out, const char *path, double scale)
{
    *out = NULL;
    if (!isfinite(scale))
        return iflow_seterr(IFLOW_EINVAL, "LoRA adapter '%s': the scale must be a finite number", path);
    if (!iflow_is_gguf_file(path))
        return peft_open(out, path, scale);
    iflow_lora *l = lora_new(path, IFLOW_LORA_GGUF);
    if (!l)
        return oom(path);
    iflow_ggufsrc *gs = NULL;
    return gguf_finish(out, l, gs, iflow_ggufsrc_open(&gs, path), scale);
}

void iflow_lora_close(iflow_lora *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++) {
        free((void *)l->d[i].target);
        free((void *)l->d[i].a);
        free((void *)l->d[i].b);
    }
    free(l->d);
    free(l->path);
    free(l);
}

/* ---- queries ---- */

const char *iflow_lora_path(const iflow_lora *l) { return l->path; }
int iflow_lora_naming(const iflow_lora *l) { return l->naming; }
size_t iflow_lora_n_deltas(const iflow_lora *l) { return l->n; }
const iflow_lora_delta *iflow_lora_delta_at(const iflow_lora *l, size_t i) { return i < l->n ? &l->d[i] : NULL; }

const iflow_lora_delta *iflow_lora_find(const iflow_lora *l, const char *target)
{
    size_t lo = 0, hi = l->n;
    while (lo < hi) { /* the deltas are in target order (build's sort) */
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(l->d[mid].target, target);
        if (c == 0)
            return &l->d[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Row i of w takes d's row rows[i], or r0 + i when rows is NULL. */
static void add_rows(const iflow_lora_delta *d, float *w, int64_t r0, const int64_t *rows, int64_t n)
{
    const int64_t in = d->in;
    const int r = d->rank;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *b = d->b + (size_t)(rows ? rows[i] : r0 + i) * (size_t)r;
        float *row = w + (size_t)i * (size_t)in;
        for (int64_t k = 0; k < in; k++) {
            double s = 0;
            for (int q = 0; q < r; q++)
                s += (double)b[q] * (double)d->a[(size_t)q * (size_t)in + (size_t)k];
            row[k] = (float)((double)row[k] + d->scale * s);
        }
    }
}

void iflow_lora_add(const iflow_lora_delta *d, float *w, int64_t r0, int64_t n) { add_rows(d, w, r0, NULL, n); }

void iflow_lora_add_rows(const iflow_lora_delta *d, float *w, const int64_t *rows, int64_t n)
{
    add_rows(d, w, 0, rows, n);
}

void iflow_lora_rotary_rows(int64_t *rows, int64_t R, int heads, int to_interleaved)
{
    const int64_t hd = R / heads, half = hd / 2;
    for (int64_t t = 0; t < R; t++) {
        int64_t head = t / hd, x = t % hd;
        rows[t] = head * hd + (to_interleaved ? (x % 2) * half + x / 2 : (x % half) * 2 + x / half);
    }
}
