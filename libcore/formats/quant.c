/* quant.c -- the quantization policy and the streaming shard transform. See quant.h. */
#include "quant.h"
#include "imatrix.h"
#include "libcore/base/error.h"
#include "libcore/base/jsonutil.h"
#include "libcore/engine/model.h"
#include "libcore/base/quote.h"
#include "shard.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/quant.h"

#include <fnmatch.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ===================================================================== the types ========== */

int iflow_qtype_describe(int dt, iflow_qtype_info *info)
{
    /* Table 3 of the paper, "Actual bits/weight"; its Q8 column (9/8.5) is our two 8-bit types. */
    static const double paper[IFLOW_DT_QEND_ - IFLOW_DT_QFIRST] = {9, 8.5, 6.5, 5.5, 5, 4.5, 4, 4, 0};
    if (dt == IFLOW_DT_F16 || dt == IFLOW_DT_BF16) { /* float targets: every matrix rounded once */
        *info = (iflow_qtype_info){.dtype = dt, .name = iflow_dtype_name(dt), .bits = 16, .block = 1, .levels = 65536,
                                   .block_bytes = 2, .bits_per_weight = 16};
        return 0;
    }
    const ifk_qtype_info *q = ifk_qtype(dt);
    if (!iflow_dtype_is_quant(dt) || !q)
        return iflow_seterr(IFLOW_EINVAL, "type code %d is not a quantized type, f16 or bf16", dt);
    *info = (iflow_qtype_info){
        .dtype = dt,
        .name = iflow_dtype_name(dt),
        .bits = q->bits,
        .block = q->block,
        .levels = q->levels,
        .block_bytes = q->block_bytes,
        .bits_per_weight = q->block_bytes * 8.0 / q->block,
        .paper_bits = paper[dt - IFLOW_DT_QFIRST],
    };
    return 0;
}

int iflow_quant_quality(const char *table, const char *type_name, char *out, size_t cap)
{
    size_t n = strlen(type_name);
    for (const char *line = table; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (*line == '#' || strncmp(line, type_name, n) != 0 || line[n] != '\t')
            continue;
        const char *text = line + n + 1;
        size_t len = strcspn(text, "\r\n");
        if (cap) {
            len = len < cap - 1 ? len : cap - 1;
            memcpy(out, text, len);
            out[len] = 0;
        }
        return 1;
    }
    return 0;
}

/* ===================================================================== the policy ========= */

static int push_rule(iflow_quant_policy *p, const char *pattern, size_t len, int dtype, int is_default)
{
    iflow_quant_rule *r = realloc(p->rules, (p->n_rules + 1) * sizeof *r);
    if (!r)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    p->rules = r;
    r = &p->rules[p->n_rules];
    if (!(r->pattern = strndup(pattern, len)))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    r->dtype = dtype;
    r->is_default = is_default;
    p->n_rules++;
    return 0;
}

int iflow_quant_policy_init(iflow_quant_policy *p, int target)
{
    iflow_qtype_info info;
    memset(p, 0, sizeof *p);
    if (iflow_qtype_describe(target, &info) < 0)
        return iflow_seterr(IFLOW_EINVAL, "%s is not a quantized type, f16 or bf16",
                            iflow_dtype_name(target) ? iflow_dtype_name(target) : "?");
    p->target = target;
    if (info.bits < 6) {
        int rc;
        if ((rc = push_rule(p, "embed", 5, IFLOW_DT_Q6_B64, 1)) < 0 || (rc = push_rule(p, "output", 6, IFLOW_DT_Q6_B64, 1)) < 0) {
            iflow_quant_policy_free(p);
            return rc;
        }
    }
    return 0;
}

void iflow_quant_policy_free(iflow_quant_policy *p)
{
    for (size_t i = 0; i < p->n_rules; i++)
        free(p->rules[i].pattern);
    free(p->rules);
    p->rules = NULL;
    p->n_rules = 0;
}

/* The type after '=' in one --keep entry: a quantized type or a float type. */
static int parse_rule_type(const char *type, size_t len, const char *entry, size_t elen, int *dt)
{
    char name[32];
    if (len == 0 || len >= sizeof name)
        return iflow_seterr(IFLOW_EINVAL, "bad --keep entry '%s': %s type after '='", iflow_quoten(entry, elen),
                            len ? "unknown" : "no");
    memcpy(name, type, len);
    name[len] = 0;
    const char *choices = iflow_dtype_ambiguity(name);
    if (choices)
        return iflow_seterr(IFLOW_EINVAL, "ambiguous type '%s' in --keep entry '%s': say %s", name,
                            iflow_quoten(entry, elen), choices);
    *dt = iflow_dtype_from_name(name);
    if (*dt < 0)
        return iflow_seterr(IFLOW_EINVAL, "unknown type '%s' in --keep entry '%s'", iflow_quote(name),
                            iflow_quoten(entry, elen));
    if (!iflow_dtype_is_quant(*dt) && !iflow_dtype_is_float(*dt))
        return iflow_seterr(IFLOW_EINVAL, "type '%s' in --keep entry '%s' cannot hold weights (a quantized type, f32, f16 or bf16)",
                            name, iflow_quoten(entry, elen));
    return 0;
}

/* Length of the n bytes at s without trailing blanks; *s moved past leading ones. */
static size_t trim(const char **s, size_t n)
{
    while (n && (**s == ' ' || **s == '\t'))
        (*s)++, n--;
    while (n && ((*s)[n - 1] == ' ' || (*s)[n - 1] == '\t'))
        n--;
    return n;
}

int iflow_quant_policy_add_keep(iflow_quant_policy *p, const char *list)
{
    size_t n0 = p->n_rules;
    int rc = 0;
    for (const char *e = list;; e++) {
        size_t elen = strcspn(e, ","), plen = strcspn(e, "=,");
        const char *pat = e, *type = e + plen + 1;
        size_t pl = trim(&pat, plen);
        int dt = IFLOW_QUANT_KEEP_SOURCE;
        if (trim(&(const char *){e}, elen) == 0)
            rc = iflow_seterr(IFLOW_EINVAL, "bad --keep list '%s': empty entry", iflow_quote(list));
        else if (pl == 0)
            rc = iflow_seterr(IFLOW_EINVAL, "bad --keep entry '%s': no pattern before '='", iflow_quoten(e, elen));
        else if (plen < elen)
            rc = parse_rule_type(type, trim(&type, elen - plen - 1), e, elen, &dt);
        if (rc == 0)
            rc = push_rule(p, pat, pl, dt, 0);
        e += elen;
        if (rc < 0 || !*e)
            break;
    }
    if (rc < 0) /* leave the policy as it was */
        while (p->n_rules > n0)
            free(p->rules[--p->n_rules].pattern);
    return rc;
}

int iflow_quant_rule_matches(const iflow_quant_rule *r, const char *name, int tied)
{
    if (strcmp(r->pattern, "embed") == 0)
        return strcmp(name, "tok_embd") == 0;
    if (strcmp(r->pattern, "output") == 0)
        return strcmp(name, "output") == 0 || (tied && strcmp(name, "tok_embd") == 0);
    return fnmatch(r->pattern, name, 0) == 0;
}

/* May a tensor of type src be written as dt? */
static int check_change(const iflow_quant_policy *p, const char *name, int src, int dt)
{
    if (dt == src)
        return dt;
    if (!iflow_dtype_is_float(src) && !iflow_dtype_is_quant(src))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "cannot quantize tensor '%s': type %s is not a weight type (keep it with --keep '%s')",
                            iflow_quote(name), iflow_dtype_name(src) ? iflow_dtype_name(src) : "?", iflow_quote(name));
    if (iflow_dtype_is_quant(src) && iflow_dtype_is_quant(dt) && !p->requantize)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "cannot quantize tensor '%s': it is already %s (use --requantize)",
                            iflow_quote(name), iflow_dtype_name(src));
    return dt;
}

int iflow_quant_choose(const iflow_quant_policy *p, const char *name, int n_dims, int src_dt, int tied)
{
    int dt = n_dims >= 2 ? p->target : IFLOW_DT_F32;
    for (size_t i = 0; i < p->n_rules; i++) {
        const iflow_quant_rule *r = &p->rules[i];
        if (!iflow_quant_rule_matches(r, name, tied))
            continue;
        if (r->dtype == IFLOW_QUANT_KEEP_SOURCE)
            dt = src_dt;
        else if (n_dims >= 2)
            dt = r->dtype;
    }
    return check_change(p, name, src_dt, dt);
}

int iflow_quant_check_rules(const iflow_quant_policy *p, const char *const *names, size_t n, int tied,
                            const char *where)
{
    for (size_t i = 0; i < p->n_rules; i++) {
        size_t k = 0;
        if (p->rules[i].is_default)
            continue;
        while (k < n && !iflow_quant_rule_matches(&p->rules[i], names[k], tied))
            k++;
        if (k == n)
            return iflow_seterr(IFLOW_EINVAL, "--keep pattern '%s' matches no tensor in '%s'",
                                iflow_quote(p->rules[i].pattern), where);
    }
    return 0;
}

/* ===================================================================== the stream ========= */

typedef struct {
    const iflow_quant_policy *p;
    const char *in_name;       /* for messages: the path, or "<stdin>"          */
    iflow_shard_reader *r;
    iflow_shard_writer *w;
    int tied;
    void *buf;                 /* the output tensor                             */
    size_t cap;
    float *imp;                /* [imp_cap] importances of the tensor's columns   */
    size_t imp_cap;
    iflow_quant_stats st;
    size_t n_model_tensors;    /* the tensors the model has (read from its meta) */
    iflow_tensor_req *reqs;    /* [n_model_tensors] their names, shapes, and which stay F32 */
    iflow_progress_fn progress;
    void *progress_user;
} qjob;

/* Bytes of one row of K elements of type dt. */
static size_t row_bytes(int dt, int K)
{
    int64_t k = K;
    return iflow_tensor_nbytes(dt, 1, &k);
}

/* (ifk_get_row: the kernels' SIMD widening of F16/BF16, exact like iflow_dtype_convert.) */
static void row_to_f32(float *dst, const void *src, int src_dt, int K)
{
    if (iflow_dtype_is_quant(src_dt))
        ifk_dequantize_row(dst, src_dt, src, K);
    else
        ifk_get_row(dst, src, src_dt, 0, K);
}

/* imp: [K] importances of the columns, or NULL. */
static void row_from_f32(void *dst, int dst_dt, const float *src, int K, int method, const float *imp)
{
    if (iflow_dtype_is_quant(dst_dt) && method == IFLOW_QUANT_MINMAX)
        ifk_quantize_row(dst, dst_dt, src, K);
    else if (iflow_dtype_is_quant(dst_dt))
        ifk_quantize_row_search(dst, dst_dt, src, imp, K);
    else
        iflow_dtype_convert(dst, dst_dt, src, IFLOW_DT_F32, (size_t)K);
}

/* rows x K elements of src_dt -> dst_dt through F32, one row at a time; threads split rows.
 * Both types are float or quantized (checked by the policy). imp: [K] or NULL. */
static int convert_rows(void *dst, int dst_dt, const void *src, int src_dt, size_t rows, int K, int method,
                        const float *imp, const char *name)
{
    size_t in_row = row_bytes(src_dt, K), out_row = row_bytes(dst_dt, K);
    int failed = 0;
#pragma omp parallel if (rows * (size_t)K >= (1u << 16))
    {
        float *tmp = malloc((size_t)K * sizeof *tmp + 1);
        if (!tmp) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (size_t i = 0; i < rows; i++)
            if (tmp) {
                row_to_f32(tmp, (const char *)src + i * in_row, src_dt, K);
                row_from_f32((char *)dst + i * out_row, dst_dt, tmp, K, method, imp);
            }
        free(tmp);
    }
    return failed ? iflow_seterr(IFLOW_ENOMEM, "out of memory converting '%s'", iflow_quote(name)) : 0;
}

/* The importances of tensor `name`'s K columns when it is quantized to dt with an imatrix
 * (quant.h), else *imp = NULL. */
static int importances(qjob *j, const char *name, int dt, int K, const float **imp)
{
    const iflow_imatrix_entry *e = j->p->imatrix ? iflow_imatrix_find(j->p->imatrix, name) : NULL;
    *imp = NULL;
    if (!e || !iflow_dtype_is_quant(dt) || j->p->method != IFLOW_QUANT_SEARCH)
        return 0;
    if (e->K != K) /* iflow_imatrix_check_model saw to this; a shard may still lie about shapes */
        return iflow_seterr(IFLOW_ESHAPE, "imatrix '%s' has %d columns for tensor '%s', '%s' has %d", j->p->imatrix_name,
                            e->K, iflow_quote(name), j->in_name, K);
    if ((size_t)K > j->imp_cap) {
        free(j->imp);
        j->imp_cap = 0;
        if (!(j->imp = malloc((size_t)K * sizeof *j->imp)))
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        j->imp_cap = (size_t)K;
    }
    double mean = 0.0;
    for (int k = 0; k < K; k++)
        mean += e->mean_sq[k];
    mean /= K;
    for (int k = 0; k < K; k++)
        j->imp[k] = (float)(e->mean_sq[k] + 1e-3 * mean);
    *imp = j->imp;
    return 0;
}

/* The dimensions tensor `name` counts as for the policy: 1 for a table the engine keeps F32 like
 * a vector (T5's relative position bias [buckets][heads], a logits bias [1][vocab]). */
static int policy_dims(const qjob *j, const char *name, int n_dims)
{
    for (size_t i = 0; i < j->n_model_tensors; i++)
        if (j->reqs[i].is_vector && strcmp(j->reqs[i].name, name) == 0)
            return 1;
    return n_dims;
}

/* The output payload of one tensor record: rows of the last dimension. */
static int write_tensor(qjob *j, const iflow_shard_rec *rec)
{
    int dt = iflow_quant_choose(j->p, rec->name, policy_dims(j, rec->name, rec->n_dims), rec->dtype, j->tied);
    if (dt < 0)
        return dt;
    const void *data = rec->data;
    size_t nbytes = rec->nbytes, rows = 1;
    int64_t K = rec->shape[rec->n_dims - 1];
    if (dt != rec->dtype) {
        for (int d = 0; d < rec->n_dims - 1; d++)
            rows *= (size_t)rec->shape[d];
        nbytes = iflow_tensor_nbytes(dt, rec->n_dims, rec->shape);
        if (K > INT_MAX || nbytes == SIZE_MAX)
            return iflow_seterr(IFLOW_ERANGE, "tensor '%s' in '%s' is too large to convert", iflow_quote(rec->name),
                                j->in_name);
        if (nbytes > j->cap) {
            free(j->buf);
            j->cap = 0;
            if (!(j->buf = malloc(nbytes)))
                return iflow_seterr(IFLOW_ENOMEM, "out of memory converting '%s' (%zu bytes)", iflow_quote(rec->name),
                                    nbytes);
            j->cap = nbytes;
        }
        const float *imp = NULL;
        int rc = importances(j, rec->name, dt, (int)K, &imp);
        if (rc == 0)
            rc = convert_rows(j->buf, dt, rec->data, rec->dtype, rows, (int)K, j->p->method, imp, rec->name);
        if (rc < 0)
            return rc;
        data = j->buf;
    }
    j->st.n_tensors++;
    j->st.n_by_type[dt]++;
    j->st.in_bytes += rec->nbytes;
    j->st.out_bytes += nbytes;
    return iflow_shard_write_tensor(j->w, rec->name, dt, rec->n_dims, rec->shape, data, nbytes);
}

/* The "quantization" object of the output's meta. */
static json_t *quant_object(const iflow_quant_policy *p, const json_t *previous)
{
    json_t *rules = json_array();
    for (size_t i = 0; i < p->n_rules; i++) {
        const iflow_quant_rule *r = &p->rules[i];
        const char *type = r->dtype == IFLOW_QUANT_KEEP_SOURCE ? "source" : iflow_dtype_name(r->dtype);
        json_t *o = json_pack("{s:s, s:s}", "pattern", r->pattern, "type", type);
        if (o && r->is_default)
            json_object_set_new(o, "default", json_true());
        json_array_append_new(rules, o);
    }
    json_t *o = json_pack("{s:s, s:s, s:o, s:b, s:O?}", "type", iflow_dtype_name(p->target), "method",
                          p->method == IFLOW_QUANT_MINMAX ? "minmax" : "search", "overrides", rules, "requantize",
                          p->requantize, "source", previous);
    if (o && p->imatrix)
        json_object_set_new(o, "imatrix", json_pack("{s:s, s:I}", "file", p->imatrix_name ? p->imatrix_name : "",
                                                    "tokens", (json_int_t)p->imatrix->n_tokens));
    return o;
}

/* Learn what the policy needs from the model description (tied embeddings; the tensor names
 * its rules must match). */
static int read_model(qjob *j, const json_t *meta)
{
    iflow_hparams hp;
    iflow_tensor_req *reqs = NULL;
    size_t n = 0;
    int rc = iflow_hparams_from_json(&hp, meta, j->in_name);
    if (rc == 0)
        rc = iflow_model_tensors(&hp, &reqs, &n);
    if (rc < 0)
        return rc;
    const char **names = malloc((n ? n : 1) * sizeof *names);
    if (!names) {
        free(reqs);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        names[i] = reqs[i].name;
    j->tied = hp.tie_embeddings;
    j->n_model_tensors = n;
    rc = iflow_quant_check_rules(j->p, names, n, j->tied, j->in_name);
    if (rc == 0 && j->p->imatrix) {
        int64_t *cols = malloc((n ? n : 1) * sizeof *cols);
        int *mult = malloc((n ? n : 1) * sizeof *mult);
        for (size_t i = 0; cols && mult && i < n; i++) {
            cols[i] = reqs[i].shape[1];
            mult[i] = !reqs[i].is_vector && (j->tied || strcmp(names[i], "tok_embd") != 0);
            mult[i] *= iflow_tensor_expert(names[i]) >= 0 ? 2 : 1; /* an expert may have seen no row */
        }
        rc = cols && mult ? iflow_imatrix_check_model(j->p->imatrix, names, cols, mult, n,
                                                      j->p->imatrix_name ? j->p->imatrix_name : "?", j->in_name)
                          : iflow_seterr(IFLOW_ENOMEM, "out of memory");
        free(cols);
        free(mult);
    }
    free(names);
    j->reqs = reqs; /* kept: write_tensor asks which tensors stay F32 */
    return rc;
}


/* The first record: the input's meta, written back with the "quantization" object. */
static int write_meta(qjob *j, const iflow_shard_rec *rec)
{
    json_t *meta = NULL;
    if (rec->kind != IFLOW_REC_BLOB || strcmp(rec->name, "meta") != 0)
        return iflow_seterr(IFLOW_EFORMAT, "shard '%s' does not start with its 'meta' record", j->in_name);
    int rc = iflow_json_load_buf(&meta, rec->data, rec->nbytes, j->in_name);
    if (rc == 0 && !json_is_object(meta))
        rc = iflow_seterr(IFLOW_EFORMAT, "the meta record of '%s' is not a JSON object", j->in_name);
    if (rc == 0)
        rc = read_model(j, meta);
    if (rc == 0) {
        json_t *q = quant_object(j->p, json_object_get(meta, "quantization"));
        char *text = q && json_object_set_new(meta, "quantization", q) == 0
                         ? json_dumps(meta, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
        rc = text ? iflow_shard_write_blob(j->w, "meta", text, strlen(text)) : iflow_seterr(IFLOW_ENOMEM, "out of memory");
        free(text);
    }
    json_decref(meta);
    return rc;
}

static int copy_records(qjob *j)
{
    iflow_shard_rec rec;
    int rc, first = 1;
    while ((rc = iflow_shard_reader_next(j->r, &rec)) == 1) {
        if (first)
            rc = write_meta(j, &rec);
        else if (rec.kind == IFLOW_REC_BLOB)
            rc = iflow_shard_write_blob(j->w, rec.name, rec.data, rec.nbytes);
        else
            rc = write_tensor(j, &rec);
        if (rc < 0)
            return rc;
        if (j->progress && !first && rec.kind != IFLOW_REC_BLOB) {
            iflow_progress pr = {.done = j->st.n_tensors, .total = j->n_model_tensors, .bytes = j->st.in_bytes,
                                 .item = rec.name};
            j->progress(j->progress_user, &pr);
        }
        first = 0;
    }
    if (rc == 0 && first)
        return iflow_seterr(IFLOW_EFORMAT, "shard '%s' does not start with its 'meta' record", j->in_name);
    return rc;
}

int iflow_quantize_shard(const char *in_path, const char *out_path, const iflow_quant_policy *p, int flags,
                         iflow_quant_stats *stats)
{
    return iflow_quantize_shard_progress(in_path, out_path, p, flags, stats, NULL, NULL);
}

int iflow_quantize_shard_progress(const char *in_path, const char *out_path, const iflow_quant_policy *p, int flags,
                                  iflow_quant_stats *stats, iflow_progress_fn progress, void *user)
{
    qjob j = {.p = p, .in_name = strcmp(in_path, "-") == 0 ? "<stdin>" : in_path, .progress = progress,
              .progress_user = user};
    int rc = iflow_shard_reader_open(&j.r, in_path);
    if (rc == 0)
        rc = iflow_shard_writer_open(&j.w, out_path, (flags & IFLOW_QUANT_ZSTD) ? IFLOW_SHARD_ZSTD : 0);
    if (rc == 0)
        rc = copy_records(&j);
    if (j.w && rc == 0)
        rc = iflow_shard_writer_close(j.w);
    else if (j.w)
        iflow_shard_writer_abort(j.w);
    iflow_shard_reader_close(j.r);
    free(j.buf);
    free(j.reqs);
    free(j.imp);
    if (stats)
        *stats = j.st;
    return rc;
}
