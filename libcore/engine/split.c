/* split.c -- one shard file per device of a plan: writing them (iflow-partition --split), and
 * the checks that a directory's files belong together. See split.h. */
#include "split.h"
#include "footprint.h"
#include "slice.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/formats/shard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

void iflow_split_path(char *buf, size_t cap, const char *dir, int device)
{
    snprintf(buf, cap, "%s/device-%d.ifs", dir, device);
}

static int holds_layers(const iflow_plan_device *d) { return d->layer1 > d->layer0; }

int iflow_split_embed_device(const iflow_plan *p)
{
    int best = -1; /* layer 0's first part, as placement orders parts: head 0, then the least FFN column */
    for (int i = 0; i < p->n_devices; i++) {
        const iflow_plan_device *d = &p->devices[i];
        if (holds_layers(d) && d->layer0 == 0 && d->head0 == 0 && (best < 0 || d->ffn0 < p->devices[best].ffn0))
            best = i;
    }
    return best < 0 ? 0 : best;
}

/* ===================================================================== tensor lists ======= */

static void add(iflow_split_tensor *t, size_t *n, const char *name, int64_t d0, int64_t d1, int cols, int64_t a0,
                int64_t a1)
{
    iflow_split_tensor *x = &t[(*n)++];
    snprintf(x->req.name, sizeof x->req.name, "%s", name);
    x->req.n_dims = d1 ? 2 : 1;
    x->req.shape[0] = d0;
    x->req.shape[1] = d1;
    x->req.is_vector = d1 == 0;
    x->cols = cols;
    x->a0 = a0;
    x->a1 = a1;
}

int iflow_split_tensors(const iflow_hparams *hp, const iflow_plan *p, int dev, iflow_split_tensor **out, size_t *n)
{
    const iflow_plan_device *d = &p->devices[dev];
    int layers = holds_layers(d) ? d->layer1 - d->layer0 : 0, l0 = layers ? d->layer0 : 0, kv0 = iflow_part_kv0(hp, d->head0);
    int64_t D = hp->dim, hd = hp->head_dim, V = hp->vocab_size;
    int64_t q0 = d->head0 * hd, q1 = d->head1 * hd, k0 = kv0 * hd,
            k1 = (kv0 + iflow_part_kv_heads(hp, d->head0, d->head1)) * hd, f0 = d->ffn0, f1 = d->ffn1;
    int embed = iflow_split_embed_device(p) == dev, output = p->output_device == dev, first = d->head0 == 0;
    iflow_split_tensor *t = calloc(12 + (size_t)layers * 16, sizeof *t);
    if (!t)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    char name[48];
    *n = 0;
    if (embed || (output && hp->tie_embeddings))
        add(t, n, "tok_embd", V, D, 0, 0, V);
    if (embed && hp->position == IFLOW_POS_LEARNED)
        add(t, n, "pos_embd", hp->max_seq, D, 0, 0, hp->max_seq);
    if (embed && hp->token_types > 0)
        add(t, n, "tok_type_embd", hp->token_types, D, 0, 0, hp->token_types);
    if (embed && hp->embed_norm) {
        add(t, n, "embd_norm", D, 0, 0, 0, D);
        if (iflow_norm_biased(hp))
            add(t, n, "embd_norm_b", D, 0, 0, 0, D);
    }
    if (hp->rope_freqs && hp->position == IFLOW_POS_ROPE) /* every file: the model's rope_scale, on the host */
        add(t, n, "rope_freqs", hp->rope_dim / 2, 0, 0, 0, hp->rope_dim / 2);
    if (hp->rope_factor_tensors && hp->position == IFLOW_POS_ROPE) { /* longrope's, likewise */
        add(t, n, "rope_short", hp->rope_dim / 2, 0, 0, 0, hp->rope_dim / 2);
        add(t, n, "rope_long", hp->rope_dim / 2, 0, 0, 0, hp->rope_dim / 2);
    }
    for (int l = l0; l < l0 + layers; l++) {
#define L(suffix, d0, d1, cols, a0, a1) (snprintf(name, sizeof name, "blk.%d." suffix, l), add(t, n, name, d0, d1, cols, a0, a1))
        if (!hp->post_norms_only && !hp->norm_no_weight)
            L("attn_norm", D, 0, 0, 0, D);
        if (!hp->post_norms_only && iflow_norm_biased(hp))
            L("attn_norm_b", D, 0, 0, 0, D);
        L("wq", q1 - q0, D, 0, q0, q1);
        L("wk", k1 - k0, D, 0, k0, k1);
        L("wv", k1 - k0, D, 0, k0, k1);
        L("wo", D, q1 - q0, 1, q0, q1);
        if (hp->qkv_bias) {
            L("bq", q1 - q0, 0, 0, q0, q1);
            L("bk", k1 - k0, 0, 0, k0, k1);
            L("bv", k1 - k0, 0, 0, k0, k1);
        }
        if (hp->attn_bias && first)
            L("bo", D, 0, 0, 0, D);
        if (hp->qk_norm) { /* every part: its heads all use them (qk_norm_full: whole layers only) */
            const int64_t nq = hp->qk_norm_full ? (int64_t)hp->n_heads * hp->head_dim : hp->head_dim,
                          nk = hp->qk_norm_full ? (int64_t)hp->n_kv_heads * hp->head_dim : hp->head_dim;
            L("q_norm", nq, 0, 0, 0, nq);
            L("k_norm", nk, 0, 0, 0, nk);
        }
        if (hp->post_norms)
            L("attn_post_norm", D, 0, 0, 0, D);
        if (!hp->post_norms_only && !hp->norm_no_weight)
            L("ffn_norm", D, 0, 0, 0, D);
        if (!hp->post_norms_only && iflow_norm_biased(hp))
            L("ffn_norm_b", D, 0, 0, 0, D);
        if (hp->ffn == IFLOW_FFN_GATED)
            L("ffn_gate", f1 - f0, D, 0, f0, f1);
        L("ffn_up", f1 - f0, D, 0, f0, f1);
        L("ffn_down", D, f1 - f0, 1, f0, f1);
        if (hp->post_norms)
            L("ffn_post_norm", D, 0, 0, 0, D);
        if (hp->mlp_bias) {
            if (hp->ffn == IFLOW_FFN_GATED)
                L("ffn_gate_b", f1 - f0, 0, 0, f0, f1);
            L("ffn_up_b", f1 - f0, 0, 0, f0, f1);
            if (first)
                L("ffn_down_b", D, 0, 0, 0, D);
        }
#undef L
    }
    if (output && hp->layout != IFLOW_LAYOUT_ENCODER) { /* an encoder's output is its hidden states */
        if (hp->final_norm) {
            if (!hp->norm_no_weight)
                add(t, n, "output_norm", D, 0, 0, 0, D);
            if (iflow_norm_biased(hp))
                add(t, n, "output_norm_b", D, 0, 0, 0, D);
        }
        if (!hp->tie_embeddings)
            add(t, n, "output", V, D, 0, 0, V);
        if (hp->logits_bias) { /* a table [1][vocab], F32 on the host like a vector */
            add(t, n, "output_b", 1, V, 0, 0, 1);
            t[*n - 1].req.is_vector = 1;
        }
    }
    *out = t;
    return 0;
}

/* ===================================================================== meta =============== */

/* The partition of p: what must agree between a plan and the files, without names or threads. */
static json_t *partition_json(const iflow_plan *p)
{
    json_t *parts = json_array();
    for (int i = 0; i < p->n_devices; i++) {
        const iflow_plan_device *d = &p->devices[i];
        int has = holds_layers(d);
        json_array_append_new(parts, json_pack("[i,i,i,i,i,i]", has ? d->layer0 : 0, has ? d->layer1 : 0, d->head0,
                                               d->head1, d->ffn0, d->ffn1));
    }
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:o}", "layers", p->n_layers, "heads", p->n_heads, "kv_heads",
                     p->n_kv_heads, "ffn", p->ffn_dim, "output", p->output_device, "parts", parts);
}

static json_t *shard_json(const iflow_hparams *hp, const iflow_plan *p, int dev, uint64_t model)
{
    const iflow_plan_device *d = &p->devices[dev];
    int has = holds_layers(d), kv0 = iflow_part_kv0(hp, d->head0), kv1 = kv0 + iflow_part_kv_heads(hp, d->head0, d->head1);
    char hex[20];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)model);
    return json_pack("{s:i, s:i, s:s, s:[i,i], s:[i,i], s:[i,i], s:[i,i], s:b, s:b, s:s, s:o}", "index", dev, "count",
                     p->n_devices, "device", d->name, "layers", has ? d->layer0 : 0, has ? d->layer1 : 0, "heads",
                     d->head0, d->head1, "kv_heads", kv0, kv1, "ffn", d->ffn0, d->ffn1, "embeddings",
                     iflow_split_embed_device(p) == dev, "output", p->output_device == dev, "model", hex, "plan",
                     partition_json(p));
}

int iflow_split_is_part(const json_t *meta, int *index, int *count)
{
    const json_t *s = json_object_get(meta, "shard");
    *index = (int)json_integer_value(json_object_get(s, "index"));
    *count = (int)json_integer_value(json_object_get(s, "count"));
    return json_is_object(json_object_get(s, "plan"));
}

/* meta without its "shard" object: what every file of one split shares. */
static json_t *model_part(const json_t *meta)
{
    json_t *c = json_deep_copy(meta);
    json_object_del(c, "shard");
    return c;
}

int iflow_split_check_meta(const json_t *meta, const char *path, const iflow_plan *p, const char *plan_path, int dev,
                           const json_t *meta0, const char *path0)
{
    int index, count;
    if (!iflow_split_is_part(meta, &index, &count))
        return iflow_seterr(IFLOW_EINVAL, "'%s' is not a file of a split model (its meta has no shard plan)", path);
    if (index != dev || count != p->n_devices)
        return iflow_seterr(IFLOW_EINVAL, "'%s' is device %d of %d, but plan '%s' expects device %d of %d there", path,
                            index, count, plan_path, dev, p->n_devices);
    json_t *want = partition_json(p);
    int same = json_equal(want, json_object_get(json_object_get(meta, "shard"), "plan"));
    json_decref(want);
    if (!same)
        return iflow_seterr(IFLOW_EINVAL, "'%s' is from another split: its partition differs from plan '%s'", path,
                            plan_path);
    if (!meta0)
        return 0;
    json_t *a = model_part(meta), *b = model_part(meta0);
    same = json_equal(a, b) &&
           json_equal(json_object_get(json_object_get(meta, "shard"), "model"),
                      json_object_get(json_object_get(meta0, "shard"), "model"));
    json_decref(a);
    json_decref(b);
    return same ? 0
                : iflow_seterr(IFLOW_EINVAL, "'%s' is from another split: its model differs from that of '%s'", path,
                               path0);
}

int iflow_split_check_source(const iflow_shard *sh, const iflow_shard *sh0)
{
    const iflow_shard_rec *a = iflow_shard_find(sh, "split"), *b = iflow_shard_find(sh0, "split");
    if (!a || !b)
        return iflow_seterr(IFLOW_ENOTFOUND, "missing record 'split' in '%s'", iflow_shard_path(a ? sh0 : sh));
    if (a->nbytes != b->nbytes || memcmp(a->data, b->data, a->nbytes) != 0)
        return iflow_seterr(IFLOW_EINVAL,
                            "'%s' is from another split: it was cut from another model than '%s' (their 'split' "
                            "records differ)",
                            iflow_shard_path(sh), iflow_shard_path(sh0));
    return 0;
}

/* ===================================================================== writing ============ */

typedef struct {
    const iflow_plan *p;
    const char *in;                        /* for messages */
    iflow_hparams hp;
    iflow_tensor_req *whole;               /* [n_whole]: the whole model's tensors */
    size_t n_whole;
    unsigned char *seen;                   /* [n_whole] */
    iflow_split_tensor *t[IFLOW_PLAN_MAX_DEVICES];
    size_t nt[IFLOW_PLAN_MAX_DEVICES];
    iflow_shard_writer *w[IFLOW_PLAN_MAX_DEVICES];
    uint64_t model, digest;                /* XXH64 of the source's meta; of all its records */
} split_job;

/* The digest covers each record's name and payload checksum, in order. */
static void digest(split_job *j, const iflow_shard_rec *r)
{
    unsigned char x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (unsigned char)(r->xxh64 >> (8 * i));
    j->digest = XXH64(r->name, strlen(r->name), j->digest);
    j->digest = XXH64(x, sizeof x, j->digest);
}

static int read_meta(split_job *j, const iflow_shard_rec *r, json_t **meta)
{
    json_error_t je;
    int index, count, rc;
    if (!(*meta = json_loadb(r->data, r->nbytes, 0, &je)))
        return iflow_seterr(IFLOW_EFORMAT, "bad meta record in '%s': %s at line %d", j->in, je.text, je.line);
    if (iflow_split_is_part(*meta, &index, &count))
        return iflow_seterr(IFLOW_EINVAL, "'%s' is device %d of a split model already: split the whole model", j->in,
                            index);
    if ((rc = iflow_hparams_from_json(&j->hp, *meta, j->in)))
        return rc;
    if (j->hp.n_experts)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "'%s' is a mixture of experts: splitting one is not implemented yet",
                            j->in);
    if (j->hp.kv_lora_rank)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "'%s' has latent attention (kv_lora_rank): splitting it is not "
                            "implemented yet", j->in);
    if ((rc = iflow_plan_check(j->p, j->hp.n_layers, j->hp.n_heads, j->hp.n_kv_heads, j->hp.ffn_dim)) ||
        (rc = iflow_plan_splittable(j->p, &j->hp)) || (rc = iflow_model_tensors(&j->hp, &j->whole, &j->n_whole)))
        return rc;
    if (!(j->seen = calloc(j->n_whole, 1)))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int i = 0; i < j->p->n_devices; i++)
        if ((rc = iflow_split_tensors(&j->hp, j->p, i, &j->t[i], &j->nt[i])))
            return rc;
    j->model = XXH64(r->data, r->nbytes, 0);
    digest(j, r);
    return 0;
}

static int make_dir(const char *dir)
{
    struct stat st;
    if (mkdir(dir, 0777) == 0 || (errno == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)))
        return 0;
    return iflow_seterr(IFLOW_EIO, "cannot create directory '%s': %s", dir, strerror(errno == EEXIST ? ENOTDIR : errno));
}

/* Every device's file, opened, with its meta record. */
static int open_files(split_job *j, const char *dir, const json_t *meta)
{
    int rc = 0;
    for (int i = 0; i < j->p->n_devices && rc == 0; i++) {
        char path[4096];
        iflow_split_path(path, sizeof path, dir, i);
        json_t *m = json_deep_copy(meta);
        json_object_set_new(m, "shard", shard_json(&j->hp, j->p, i, j->model));
        char *text = json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        json_decref(m);
        if (!text)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        if ((rc = iflow_shard_writer_open(&j->w[i], path, 0)) == 0)
            rc = iflow_shard_write_blob(j->w[i], "meta", text, strlen(text));
        free(text);
    }
    return rc;
}

/* Device file w's slice t of tensor record r. */
static int write_slice(iflow_shard_writer *w, const iflow_shard_rec *r, const iflow_split_tensor *t)
{
    int64_t cols = r->n_dims == 1 ? 1 : r->shape[1];
    size_t n = iflow_tensor_nbytes(r->dtype, t->req.n_dims, t->req.shape);
    if (!t->cols)
        return iflow_shard_write_tensor(w, r->name, r->dtype, t->req.n_dims, t->req.shape,
                                        iflow_slice_rows(r->data, r->dtype, t->a0, cols), n);
    int rc = iflow_slice_columns_check(r->dtype, t->a0, t->a1, cols, r->name);
    if (rc)
        return rc;
    void *c = iflow_slice_columns(r->data, r->dtype, r->shape[0], cols, t->a0, t->a1);
    if (!c)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory slicing the columns of '%s'", r->name);
    rc = iflow_shard_write_tensor(w, r->name, r->dtype, t->req.n_dims, t->req.shape, c, n);
    free(c);
    return rc;
}

/* One record of the source: blobs (the tokenizer) to every file, a tensor's slices to the
 * devices that hold one; tensors the engine does not use are not copied. */
static int copy_record(split_job *j, const iflow_shard_rec *r)
{
    int rc = 0;
    digest(j, r);
    if (r->kind == IFLOW_REC_BLOB) {
        if (strcmp(r->name, "meta") == 0 || strcmp(r->name, "split") == 0)
            return iflow_seterr(IFLOW_EFORMAT, "a second '%s' record in '%s'", r->name, j->in);
        for (int i = 0; i < j->p->n_devices && rc == 0; i++)
            rc = iflow_shard_write_blob(j->w[i], r->name, r->data, r->nbytes);
        return rc;
    }
    size_t k = 0;
    while (k < j->n_whole && strcmp(j->whole[k].name, r->name) != 0)
        k++;
    if (k == j->n_whole)
        return 0;
    if (j->seen[k])
        return iflow_seterr(IFLOW_EFORMAT, "tensor '%s' appears twice in '%s'", r->name, j->in);
    j->seen[k] = 1;
    if ((rc = iflow_tensor_check(&j->whole[k], r, j->in)))
        return rc;
    for (int i = 0; i < j->p->n_devices && rc == 0; i++)
        for (size_t x = 0; x < j->nt[i] && rc == 0; x++)
            if (strcmp(j->t[i][x].req.name, r->name) == 0)
                rc = write_slice(j->w[i], r, &j->t[i][x]);
    return rc;
}

/* Every tensor seen: the "split" record, then each file closed (renamed into place). */
static int finish(split_job *j)
{
    int rc = 0;
    for (size_t k = 0; k < j->n_whole; k++)
        if (!j->seen[k])
            return iflow_seterr(IFLOW_ENOTFOUND, "missing tensor '%s' in '%s'", j->whole[k].name, j->in);
    char text[64];
    snprintf(text, sizeof text, "{\"source\": \"%016llx\"}", (unsigned long long)j->digest);
    for (int i = 0; i < j->p->n_devices && rc == 0; i++)
        rc = iflow_shard_write_blob(j->w[i], "split", text, strlen(text));
    for (int i = 0; i < j->p->n_devices && rc == 0; i++) {
        rc = iflow_shard_writer_close(j->w[i]);
        j->w[i] = NULL;
    }
    return rc;
}

int iflow_split_write(const char *in, const iflow_plan *p, const char *dir)
{
    split_job j = {.p = p, .in = strcmp(in, "-") == 0 ? "<stdin>" : in};
    iflow_shard_reader *r = NULL;
    iflow_shard_rec rec;
    json_t *meta = NULL;
    int rc = iflow_shard_reader_open(&r, in), more;
    if (rc == 0 && (more = iflow_shard_reader_next(r, &rec)) <= 0)
        rc = more < 0 ? more : iflow_seterr(IFLOW_EFORMAT, "shard '%s' has no records", j.in);
    if (rc == 0 && (rec.kind != IFLOW_REC_BLOB || strcmp(rec.name, "meta") != 0))
        rc = iflow_seterr(IFLOW_EFORMAT, "shard '%s' does not start with its 'meta' record", j.in);
    if (rc == 0)
        rc = read_meta(&j, &rec, &meta);
    if (rc == 0)
        rc = make_dir(dir);
    if (rc == 0)
        rc = open_files(&j, dir, meta);
    while (rc == 0 && (more = iflow_shard_reader_next(r, &rec)) != 0)
        rc = more < 0 ? more : copy_record(&j, &rec);
    if (rc == 0)
        rc = finish(&j);
    for (int i = 0; i < p->n_devices; i++)
        iflow_shard_writer_abort(j.w[i]);
    if (rc == 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, IFLOW_SPLIT_PLAN);
        rc = iflow_plan_save(p, path);
    }
    iflow_shard_reader_close(r);
    json_decref(meta);
    free(j.whole);
    free(j.seen);
    for (int i = 0; i < IFLOW_PLAN_MAX_DEVICES; i++)
        free(j.t[i]);
    return rc < 0 ? iflow_preperr(rc, "cannot split '%s' into '%s'", j.in, dir) : 0;
}
