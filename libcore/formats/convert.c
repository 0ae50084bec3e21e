/* convert.c -- Hugging Face model directory -> shard file. See convert.h. */
#include "convert.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "hfdir.h"
#include "libcore/engine/model.h"
#include "shard.h"
#include "spec.h"
#include "libcore/base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define MAX_TOKENIZER_BYTES (64u << 20)

typedef struct {
    const iflow_convert_opts *o;
    iflow_hfdir *dir;
    iflow_spec *spec;
    iflow_hparams hp;
    json_t *resolved;
    iflow_tensor_req *reqs;
    size_t n_reqs;
    const iflow_src_tensor **src;   /* [n_reqs] source of each required tensor (real models) */
} job;

/* ---- choosing the spec ---- */

static int pick_spec(job *j)
{
    const json_t *archs = json_object_get(iflow_hfdir_config(j->dir), "architectures");
    const char *arch = json_string_value(json_array_get(archs, 0));
    if (j->o->spec_path)
        return iflow_spec_load(&j->spec, j->o->spec_path);
    if (!arch)
        return iflow_seterr(IFLOW_ESPEC, "config.json in '%s' names no architecture (give a spec with --spec)",
                            iflow_hfdir_path(j->dir));
    return iflow_spec_find(&j->spec, j->o->spec_dirs, j->o->n_spec_dirs, arch);
}

/* ---- checking the checkpoint against the engine's tensor list ---- */

static int check_source(job *j, size_t i, const iflow_src_tensor *t, const char *src_name)
{
    const iflow_tensor_req *r = &j->reqs[i];
    const char *dir = iflow_hfdir_path(j->dir);
    if (!t)
        return iflow_seterr(IFLOW_ENOTFOUND, "missing tensor '%s' (iflow '%s') in '%s'", src_name, r->name, dir);
    if (t->dtype < 0)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "tensor '%s' in '%s' has type %s, which iflow cannot convert", src_name,
                            dir, t->dtype_name);
    if (t->n_dims != r->n_dims || t->shape[0] != r->shape[0] || (r->n_dims == 2 && t->shape[1] != r->shape[1]))
        return iflow_seterr(IFLOW_ESHAPE, "tensor '%s' in '%s' has shape [%lld, %lld], the model needs [%lld, %lld]",
                            src_name, dir, (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0),
                            (long long)r->shape[0], (long long)r->shape[1]);
    return 0;
}

static int map_sources(job *j)
{
    size_t n_src = iflow_hfdir_n_tensors(j->dir);
    char *used = calloc(n_src ? n_src : 1, 1);
    j->src = calloc(j->n_reqs, sizeof *j->src);
    int rc = used && j->src ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (size_t i = 0; i < j->n_reqs && rc == 0; i++) {
        char name[512];
        if ((rc = iflow_spec_source_name(j->spec, j->reqs[i].name, name, sizeof name)) < 0)
            break;
        j->src[i] = iflow_hfdir_find(j->dir, name);
        if ((rc = check_source(j, i, j->src[i], name)) < 0)
            break;
        for (size_t s = 0; s < n_src; s++)
            if (iflow_hfdir_tensor(j->dir, s) == j->src[i])
                used[s] = 1;
    }
    for (size_t s = 0; s < n_src && rc == 0; s++) {
        const iflow_src_tensor *t = iflow_hfdir_tensor(j->dir, s);
        if (!used[s] && !iflow_spec_ignored(j->spec, t->name))
            rc = iflow_seterr(IFLOW_ESPEC, "unexpected tensor '%s' in '%s': spec '%s' does not use it", t->name,
                              iflow_hfdir_path(j->dir), j->spec->path);
    }
    free(used);
    return rc;
}

/* ---- the meta record ---- */

static const char *tokenizer_format(const char *path)
{
    size_t n = strlen(path);
    return n >= 5 && strcmp(path + n - 5, ".gguf") == 0 ? "gguf" : "hf-json";
}

static json_t *build_meta(job *j, const char *tok_path)
{
    json_t *meta = json_pack("{s:s, s:i, s:O, s:O, s:O}", "format", "iflow-shard", "version", 1, "spec",
                             json_object_get(j->resolved, "spec"), "blocks", json_object_get(j->resolved, "blocks"),
                             "hparams", json_object_get(j->resolved, "hparams"));
    if (!meta)
        return NULL;
    const json_t *archs = json_object_get(iflow_hfdir_config(j->dir), "architectures");
    json_object_set_new(meta, "source", json_pack("{s:O?}", "architectures", archs));
    if (tok_path)
        json_object_set_new(meta, "tokenizer", json_pack("{s:s, s:s}", "format", tokenizer_format(tok_path), "record", "tokenizer"));
    const json_t *gen = iflow_hfdir_generation_config(j->dir);
    if (gen)
        json_object_set(meta, "generation", (json_t *)gen);
    json_object_set_new(meta, "shard", json_pack("{s:i, s:i, s:[i,i]}", "index", 0, "count", 1, "layers", 0, j->hp.n_layers));
    if (j->o->flags & IFLOW_CONVERT_SYNTHETIC)
        json_object_set_new(meta, "synthetic", json_pack("{s:I}", "seed", (json_int_t)j->o->seed));
    return meta;
}

static int write_header_records(job *j, iflow_shard_writer *w)
{
    const char *tok_path = iflow_hfdir_tokenizer_path(j->dir);
    json_t *meta = build_meta(j, tok_path);
    char *text = meta ? json_dumps(meta, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(meta);
    if (!text)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    int rc = iflow_shard_write_blob(w, "meta", text, strlen(text));
    free(text);
    if (rc == 0 && tok_path) {
        char *data;
        size_t len;
        if ((rc = iflow_read_file(tok_path, MAX_TOKENIZER_BYTES, &data, &len)) == 0) {
            rc = iflow_shard_write_blob(w, "tokenizer", data, len);
            free(data);
        }
    }
    return rc;
}

/* ---- tensors ---- */

static int target_type(const job *j, const iflow_tensor_req *r, int src_type)
{
    if (r->is_vector)
        return IFLOW_DT_F32;
    return j->o->dtype >= 0 ? j->o->dtype : src_type;
}

/* Seeded uniform weights with the spread of a trained matrix of this width; norms are 1. */
static void synth_fill(float *v, size_t n, const iflow_tensor_req *r, uint64_t seed)
{
    uint64_t s = seed ^ XXH64(r->name, strlen(r->name), 0x1f10u);
    float a = r->is_vector ? 0.0f : sqrtf(3.0f / (float)r->shape[1]);
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27; /* xorshift64* */
        float u = (float)((s * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1 << 24); /* [0,1) */
        v[i] = r->is_vector ? 1.0f : (2.0f * u - 1.0f) * a;
    }
}

/* Produce the payload of required tensor i in its target type. *data may point into the source
 * mapping (no copy) or into *buf (grown as needed). */
static int tensor_payload(job *j, size_t i, int dt, const void **data, size_t *nbytes, void **buf, size_t *cap)
{
    const iflow_tensor_req *r = &j->reqs[i];
    size_t n = (size_t)r->shape[0] * (size_t)(r->n_dims > 1 ? r->shape[1] : 1);
    size_t need = iflow_dtype_nbytes(dt, n) + (j->src[i] ? 0 : n * sizeof(float));
    const iflow_src_tensor *t = j->src[i];
    *nbytes = iflow_dtype_nbytes(dt, n);
    if (t && t->dtype == dt) {
        *data = t->data;
        return 0;
    }
    if (need > *cap) {
        free(*buf);
        if (!(*buf = malloc(need)))
            return *cap = 0, iflow_seterr(IFLOW_ENOMEM, "out of memory converting '%s' (%zu bytes)", r->name, need);
        *cap = need;
    }
    if (t)
        return *data = *buf, iflow_dtype_convert(*buf, dt, t->data, t->dtype, n);
    float *tmp = (float *)((char *)*buf + *nbytes); /* synthetic: F32 values, then converted */
    synth_fill(tmp, n, r, j->o->seed);
    *data = *buf;
    return iflow_dtype_convert(*buf, dt, tmp, IFLOW_DT_F32, n);
}

static int write_tensors(job *j, iflow_shard_writer *w)
{
    void *buf = NULL;
    size_t cap = 0;
    int rc = 0;
    iflow_progress pr = {.total = j->n_reqs};
    for (size_t i = 0; i < j->n_reqs; i++) {
        const iflow_tensor_req *r = &j->reqs[i];
        int dt = target_type(j, r, j->src[i] ? j->src[i]->dtype : IFLOW_DT_F32);
        pr.total_bytes += iflow_dtype_nbytes(dt, (size_t)r->shape[0] * (size_t)(r->n_dims > 1 ? r->shape[1] : 1));
    }
    for (size_t i = 0; i < j->n_reqs && rc == 0; i++) {
        const iflow_tensor_req *r = &j->reqs[i];
        int dt = target_type(j, r, j->src[i] ? j->src[i]->dtype : IFLOW_DT_F32);
        const void *data = NULL;
        size_t nbytes = 0;
        if ((rc = tensor_payload(j, i, dt, &data, &nbytes, &buf, &cap)) == 0)
            rc = iflow_shard_write_tensor(w, r->name, dt, r->n_dims, r->shape, data, nbytes);
        if (j->src[i])
            iflow_hfdir_release(j->dir, j->src[i]);
        if (rc == 0 && j->o->progress) {
            pr.done = i + 1, pr.bytes += nbytes, pr.item = r->name;
            j->o->progress(j->o->progress_user, &pr);
        }
    }
    free(buf);
    return rc;
}

/* Synthetic models take their "source" type from config.json's torch_dtype. */
static int synthetic_default_type(job *j)
{
    const char *td = json_string_value(json_object_get(iflow_hfdir_config(j->dir), "torch_dtype"));
    int dt = td ? iflow_dtype_from_name(td) : -1;
    return iflow_dtype_is_float(dt) ? dt : IFLOW_DT_F16;
}

/* Open the directory (hfdir flags), pick its spec and resolve config.json against it. */
static int open_resolved(job *j, const char *src_dir, int hfdir_flags)
{
    int rc;
    if ((rc = iflow_hfdir_open(&j->dir, src_dir, hfdir_flags)) < 0 || (rc = pick_spec(j)) < 0)
        return rc;
    if ((rc = iflow_spec_resolve(j->spec, iflow_hfdir_config(j->dir), &j->resolved)) < 0)
        return iflow_preperr(rc, "%s", src_dir);
    return 0;
}

static int prepare(job *j, const char *src_dir)
{
    int synth = j->o->flags & IFLOW_CONVERT_SYNTHETIC, rc;
    if ((rc = open_resolved(j, src_dir, synth ? IFLOW_HFDIR_CONFIG_ONLY : 0)) < 0)
        return rc;
    if ((rc = iflow_hparams_from_json(&j->hp, j->resolved, src_dir)) < 0 ||
        (rc = iflow_model_tensors(&j->hp, &j->reqs, &j->n_reqs)) < 0)
        return rc;
    if (synth) {
        j->src = calloc(j->n_reqs, sizeof *j->src);
        return j->src ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    return map_sources(j);
}

int iflow_convert(const char *src_dir, const char *out_path, const iflow_convert_opts *opts)
{
    iflow_convert_opts o = *opts;
    job j = {.o = &o};
    iflow_shard_writer *w = NULL;
    int rc = prepare(&j, src_dir);
    if (rc == 0 && (o.flags & IFLOW_CONVERT_SYNTHETIC) && o.dtype < 0)
        o.dtype = synthetic_default_type(&j);
    if (rc == 0)
        rc = iflow_shard_writer_open(&w, out_path, (o.flags & IFLOW_CONVERT_ZSTD) ? IFLOW_SHARD_ZSTD : 0);
    if (rc == 0)
        rc = write_header_records(&j, w);
    if (rc == 0)
        rc = write_tensors(&j, w);
    if (w && rc == 0)
        rc = iflow_shard_writer_close(w);
    else if (w)
        iflow_shard_writer_abort(w);
    free(j.src);
    free(j.reqs);
    json_decref(j.resolved);
    iflow_spec_close(j.spec);
    iflow_hfdir_close(j.dir);
    return rc;
}

int iflow_convert_resolve(const char *src_dir, const iflow_convert_opts *opts, json_t **resolved)
{
    job j = {.o = opts};
    *resolved = NULL;
    int rc = open_resolved(&j, src_dir, IFLOW_HFDIR_CONFIG_ONLY);
    if (rc == 0) {
        *resolved = j.resolved;
        j.resolved = NULL;
    }
    json_decref(j.resolved);
    iflow_spec_close(j.spec);
    iflow_hfdir_close(j.dir);
    return rc;
}
