/* convert.c -- a model source (Hugging Face directory, GGUF file) -> shard file. See convert.h. */
#include "convert.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "ggufsrc.h"
#include "llama2c.h"
#include "hfdir.h"
#include "lora.h"
#include "libcore/engine/model.h"
#include "shard.h"
#include "spec.h"
#include "tokrec.h"
#include "libcore/base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

typedef struct {
    const iflow_convert_opts *o;
    iflow_hfdir *dir;               /* the source: a Hugging Face directory, or            */
    iflow_ggufsrc *gguf;            /* a GGUF file (exactly one of the two is open)          */
    int llama2c;                    /* gguf is a llama2.c checkpoint presented as GGUF       */
    iflow_spec *spec;
    iflow_hparams hp;
    json_t *resolved;
    iflow_tensor_req *reqs;
    size_t n_reqs;
    const iflow_src_tensor **src;   /* [n_reqs] source of each required tensor (real models) */
    const iflow_src_tensor **whole; /* [n_reqs] the source tensor src[i] is rows of, or src[i] */
    iflow_src_tensor *rows;         /* [n_reqs] src[i] when the spec names a row range        */
    char *xpose;                    /* [n_reqs] src[i] is rows of whole[i] transposed (NAME^T):
                                       rows[i] then has no data; the payload gathers it       */
    long *row0;                     /* [n_reqs] its first row (in the transposed matrix)      */
    long *period;                   /* [n_reqs] > 0: src[i] is rows row0 .. of every `period`
                                       rows of whole[i] (NAME[A:B/P]); gathered by the payload */
    struct chain {                  /* [n_reqs] NAME[^T][A:B][C:D(/P)] or a 3-D NAME^T[A:B]:  */
        int on, xpose;              /*   rows of whole[i]'s view (3-D [E][R][C] transposed:  */
        long a0, a1, c0, c1, P;     /*   each [R][C] as [C][R]): rows a0 .. a1 - 1, of them   */
                                    /*   rows c0 .. c1 - 1 (of every P: periodic; P 0: once)  */
        const iflow_src_tensor *blocks, *scales; /* NAME(mxfp4): Hugging Face's MXFP4 pair,  */
        iflow_src_tensor mx;        /*   read as mx, F32 [..][G * 32] without data (whole[i]) */
        int q8;                     /*   every block re-encodes exactly as Q8_B32            */
    } *chain;
    iflow_tokrec tok;               /* the tokenizer's files, or a GGUF's vocabulary (vocab)  */
    void *vocab;                    /* malloc'd: a GGUF source's vocabulary, or NULL          */
    char *chat;                     /* malloc'd: the chat template (a Jinja text), or NULL    */
    size_t chat_len;
    const char *chat_from;          /* where it was found (meta's "chat_template.from")      */
    iflow_lora **loras;             /* [o->n_loras] the adapters merged in                    */
    char *merged;                   /* [n_reqs] some adapter changes src[i]                   */
    size_t *lora_used;              /* [o->n_loras] how many of the model's tensors each changes */
    char **xnames;                  /* [n_reqs] the tensor's name in the other naming (Hugging Face's
                                       for a GGUF source, GGUF's for a directory), or NULL: made
                                       when an adapter names the other's tensors               */
    int *xheads;                    /* [n_reqs] the other naming orders this tensor's rotary rows the
                                       other way: its heads, or 0                               */
    int x_interleaved;              /* the source's rotary rows are interleaved (the other's
                                       rotate-half), for xheads                                 */
} job;

/* ---- the source: one of two readers ---- */

static const char *src_path(const job *j) { return j->gguf ? iflow_ggufsrc_path(j->gguf) : iflow_hfdir_path(j->dir); }

static const json_t *src_config(const job *j)
{
    return j->gguf ? iflow_ggufsrc_config(j->gguf) : iflow_hfdir_config(j->dir);
}

static size_t src_n_tensors(const job *j)
{
    return j->gguf ? iflow_ggufsrc_n_tensors(j->gguf) : iflow_hfdir_n_tensors(j->dir);
}

static const iflow_src_tensor *src_tensor(const job *j, size_t i)
{
    return j->gguf ? iflow_ggufsrc_tensor(j->gguf, i) : iflow_hfdir_tensor(j->dir, i);
}

static const iflow_src_tensor *src_find(const job *j, const char *name)
{
    return j->gguf ? iflow_ggufsrc_find(j->gguf, name) : iflow_hfdir_find(j->dir, name);
}

/* A directory is a Hugging Face model; a file is GGUF, or a llama2.c checkpoint, which comes
 * in as a GGUF (llama2c.h). */
static int open_source(job *j, const char *path, int hfdir_flags)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
        if (iflow_is_gguf_file(path) && j->o->tokenizer_path)
            return iflow_seterr(IFLOW_EINVAL,
                                "a tokenizer is for a llama2.c checkpoint or a model directory, not GGUF file '%s' "
                                "(its vocabulary is its tokenizer)",
                                path);
        if (iflow_is_gguf_file(path))
            return iflow_ggufsrc_open(&j->gguf, path);
        if (!iflow_is_llama2c_file(path))
            return iflow_seterr(IFLOW_EFORMAT,
                                "'%s' is not a model directory, a GGUF file or a llama2.c checkpoint (no GGUF magic; "
                                "not a llama2.c header that matches the file's size)",
                                path);
        iflow_gguf *g;
        int rc = iflow_llama2c_open(&g, path, j->o->tokenizer_path);
        if (rc < 0)
            return rc;
        j->llama2c = 1;
        return iflow_ggufsrc_from(&j->gguf, g);
    }
    return iflow_hfdir_open(&j->dir, path, hfdir_flags);
}

/* ---- choosing the spec ---- */

static int pick_spec(job *j)
{
    if (j->gguf) {
        const char *arch = iflow_ggufsrc_architecture(j->gguf);
        int rc;
        if (j->o->spec_path)
            return (rc = iflow_spec_load(&j->spec, j->o->spec_path)) < 0 ? rc : iflow_spec_use_source(j->spec, "gguf");
        if (!arch)
            return iflow_seterr(IFLOW_ESPEC, "'%s' has no general.architecture key (give a spec with --spec)", src_path(j));
        if ((rc = iflow_spec_find_source(&j->spec, j->o->spec_dirs, j->o->n_spec_dirs, "gguf", arch)) < 0)
            return iflow_preperr(rc, "'%s'", src_path(j));
        return 0;
    }
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
    const char *dir = src_path(j);
    if (!t)
        return iflow_seterr(IFLOW_ENOTFOUND, "missing tensor '%s' (iflow '%s') in '%s'", src_name, r->name, dir);
    if (t->dtype < 0)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "tensor '%s' in '%s' has type %s, which iflow cannot convert", src_name,
                            dir, t->dtype_name);
    /* a table of one row [1][N] may be stored as a vector [N] (llama.cpp's ffn_gate_inp_shexp), and a
     * vector [N] come as a row [1][N] (a row of llama.cpp's expert biases [E][N]) */
    const int one_row = (r->n_dims == 2 && r->shape[0] == 1 && t->n_dims == 1 && t->shape[0] == r->shape[1]) ||
                        (r->n_dims == 1 && t->n_dims == 2 && t->shape[0] == 1 && t->shape[1] == r->shape[0]);
    if (!one_row &&
        (t->n_dims != r->n_dims || t->shape[0] != r->shape[0] || (r->n_dims == 2 && t->shape[1] != r->shape[1])))
        return iflow_seterr(IFLOW_ESHAPE, "tensor '%s' in '%s' has shape [%lld, %lld], the model needs [%lld, %lld]",
                            src_name, dir, (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0),
                            (long long)r->shape[0], (long long)r->shape[1]);
    return 0;
}

/* The value of symbol s[0..n) of a row range (see row_expr), -1 for none. */
static long row_sym(const char *s, size_t n, const iflow_hparams *hp)
{
    static const char *const names[] = {"D", "Q", "KV", "F", "FE", "H", "NH", "KR", "NOPE", "VH"};
    const long v[] = {hp->dim, (long)hp->n_heads * hp->head_dim, (long)hp->n_kv_heads * hp->head_dim, hp->ffn_dim,
                      hp->expert_ffn_dim, hp->head_dim, hp->n_heads, hp->kv_lora_rank, hp->qk_nope_dim,
                      hp->v_head_dim};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && !strncmp(s, names[i], n))
            return v[i];
    return -1;
}

/* One bound of a row range: terms joined by '+', each a product of factors joined by '*', each
 * a number N or a symbol SYM: D (dim), Q (n_heads * head_dim), KV (n_kv_heads * head_dim), F
 * (ffn_dim), FE (expert_ffn_dim), H (head_dim), NH (n_heads), KR (kv_lora_rank), NOPE
 * (qk_nope_dim) or VH (v_head_dim). -1 on a syntax error or a value of 2^40 or more. */
static long row_expr(const char *s, size_t n, const iflow_hparams *hp)
{
    long total = 0, term = 1;
    size_t i = 0;
    if (!n)
        return -1;
    while (i < n) {
        long v = 0;
        size_t e = i;
        if (s[i] >= '0' && s[i] <= '9') {
            for (; e < n && s[e] >= '0' && s[e] <= '9'; e++)
                if ((v = v * 10 + (s[e] - '0')) >= (1L << 31))
                    return -1;
        } else {
            while (e < n && s[e] >= 'A' && s[e] <= 'Z')
                e++;
            if (e == i || (v = row_sym(s + i, e - i, hp)) < 0)
                return -1;
        }
        if (v >= (1L << 31) || (v && term >= ((1L << 40) + v - 1) / v)) /* the product would reach 2^40 */
            return -1;
        term *= v;
        i = e;
        if (i < n && s[i] == '*') {
            if (++i == n)
                return -1;
            continue;
        }
        if ((total += term) >= (1L << 40) || (i < n && (s[i] != '+' || i + 1 == n)))
            return -1;
        term = 1;
        i += i < n;
    }
    return total;
}

/* "NAME[A:B]" (a spec's rows A .. B-1 of a fused source tensor, such as Phi-3's qkv_proj),
 * "NAME[A:B/P]" (rows A .. B-1 of every P rows: GPT-NeoX's query_key_value holds q, k and v
 * of each head in turn) and "NAME^T" (a matrix stored transposed, GPT-2's Conv1D weights;
 * "NAME^T[A:B]" for rows of the transposed matrix; "NAME^T[A:B/P]" for rows A .. B-1 of every
 * P, each period's block transposed: DeepSeek's kv_b_proj, each head's key rows [NOPE][KR] as
 * [KR][NOPE]): the name into base, *xpose, and the range; *r1 = -1 when there is none,
 * *period = 0 when it is not periodic. */
static int parse_rows(const job *j, const char *iflow_name, const char *name, char *base, size_t cap, long *r0,
                      long *r1, long *period, int *xpose)
{
    size_t n = strlen(name);
    const char *open = n && name[n - 1] == ']' ? strrchr(name, '[') : NULL, *colon = open ? strchr(open, ':') : NULL;
    const char *slash = colon ? strchr(colon, '/') : NULL, *end = slash ? slash : name + n - 1;
    size_t nb = open ? (size_t)(open - name) : n;
    *xpose = nb >= 2 && name[nb - 2] == '^' && name[nb - 1] == 'T';
    *r0 = 0, *r1 = -1, *period = 0;
    snprintf(base, cap, "%.*s", (int)(nb - (*xpose ? 2 : 0)), name);
    if (*xpose && j->gguf)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "transposed tensors ('%s') are not supported for GGUF sources", name);
    if (!open)
        return 0;
    if (colon)
        *r0 = row_expr(open + 1, (size_t)(colon - open - 1), &j->hp),
        *r1 = row_expr(colon + 1, (size_t)(end - colon - 1), &j->hp);
    if (slash)
        *period = row_expr(slash + 1, (size_t)(name + n - 1 - slash - 1), &j->hp);
    if (!colon || *r0 < 0 || *r1 <= *r0 || *period < 0 || (slash && *r1 > *period))
        return iflow_seterr(IFLOW_ESPEC,
                            "bad row range in '%s' for '%s' (spec '%s'): want [A:B] or [A:B/P], A < B <= P, over N, D, Q, "
                            "KV, F, FE, H, NH, KR, NOPE, VH",
                            name, iflow_name, j->spec->path);
    if (j->gguf && slash) /* plain ranges are rows in place, whatever the ggml type */
        return iflow_seterr(IFLOW_EUNSUPPORTED, "periodic row ranges ('%s') are not supported for GGUF sources", name);
    return 0;
}

/* MXFP4's E2M1 codes as twice their value (ggml's kvalues_mxfp4): value = code * 2^(scale - 128). */
static const int8_t mxfp4_code[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* One MXFP4 group of an HF pair (16 bytes, its scale s) as a Q8_B32 block (36 bytes): delta
 * 2^(s - 128), min -12 delta, level code + 12; a group of zeros with any scale: all zero. 0 when
 * the delta or min does not fit F16 exactly. */
static int mxfp4_q8_block(uint8_t *dst, const uint8_t *b, uint8_t s)
{
    int zeros = 1;
    for (int k = 0; k < 16 && zeros; k++)
        zeros = mxfp4_code[b[k] & 15] == 0 && mxfp4_code[b[k] >> 4] == 0;
    const float d = zeros ? 0.0f : ldexpf(1.0f, (int)s - 128);
    const uint16_t h = iflow_f32_to_f16(d), m = iflow_f32_to_f16(-12.0f * d);
    dst[0] = (uint8_t)h, dst[1] = (uint8_t)(h >> 8), dst[2] = (uint8_t)m, dst[3] = (uint8_t)(m >> 8);
    for (int k = 0; k < 16; k++) {
        dst[4 + 2 * k] = (uint8_t)(mxfp4_code[b[k] & 15] + 12);
        dst[4 + 2 * k + 1] = (uint8_t)(mxfp4_code[b[k] >> 4] + 12);
    }
    return iflow_f16_to_f32(h) == d && iflow_f16_to_f32(m) == -12.0f * d;
}

/* 1 if every group of pair c re-encodes exactly as Q8_B32. */
static int mxfp4_fits_q8(const struct chain *c)
{
    const uint8_t *blk = c->blocks->data, *sc = c->scales->data;
    uint8_t tmp[36];
    for (size_t i = 0; i < c->scales->nbytes; i++)
        if (!mxfp4_q8_block(tmp, blk + i * 16, sc[i]))
            return 0;
    return 1;
}

/* "STEM(mxfp4)": Hugging Face's MXFP4 pair (gpt-oss's released experts) STEM_blocks [..][G][16]
 * and STEM_scales [..][G], U8, into c->mx: a tensor [..][G * 32] of F32 values without data (the
 * payload decodes the rows it takes). 0 when name is no such form, 1, or < 0 when the pair is
 * missing or misshapen. */
static int mxfp4_pair(const job *j, const char *name, struct chain *c,
                      const iflow_src_tensor *(*find)(const job *, const char *))
{
    const size_t n = strlen(name), sfx = strlen("(mxfp4)");
    char stem[512];
    if (n <= sfx || strcmp(name + n - sfx, "(mxfp4)") != 0 || n - sfx + 8 > sizeof stem)
        return 0;
    snprintf(stem, sizeof stem, "%.*s_blocks", (int)(n - sfx), name);
    const iflow_src_tensor *b = find(j, stem);
    snprintf(stem, sizeof stem, "%.*s_scales", (int)(n - sfx), name);
    const iflow_src_tensor *s = find(j, stem);
    int ok = b && s && b->n_dims >= 2 && b->n_dims <= IFLOW_SRC_MAX_DIMS && s->n_dims == b->n_dims - 1 &&
             b->shape[b->n_dims - 1] == 16 && !strcmp(b->dtype_name, "U8") && !strcmp(s->dtype_name, "U8");
    for (int d = 0; ok && d < s->n_dims; d++)
        ok = s->shape[d] == b->shape[d];
    if (!ok)
        return iflow_seterr(IFLOW_EFORMAT,
                            "'%s': no MXFP4 pair %.*s_blocks [..][G][16] and _scales [..][G], U8, in '%s'", name,
                            (int)(n - sfx), name, src_path(j));
    c->blocks = b, c->scales = s;
    c->mx = *b;
    c->mx.dtype = IFLOW_DT_F32, c->mx.dtype_name = "MXFP4", c->mx.data = NULL;
    c->mx.n_dims = b->n_dims - 1;
    c->mx.shape[c->mx.n_dims - 1] = b->shape[b->n_dims - 2] * 32;
    c->mx.shape[b->n_dims - 1] = 1;
    size_t count = 1;
    for (int d = 0; d < c->mx.n_dims; d++)
        count *= (size_t)c->mx.shape[d];
    c->mx.nbytes = count * sizeof(float);
    c->q8 = mxfp4_fits_q8(c);
    return 1;
}

/* Row v of an MXFP4 pair's values (cols of them) into out: byte k of a block holds values 2k
 * (low nibble) and 2k + 1 (high), E2M1 times 2^(scale - 127), as transformers decodes them. */
static void mxfp4_row(float *out, const struct chain *c, size_t v, size_t cols)
{
    static const float lut[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    const uint8_t *blk = c->blocks->data, *sc = c->scales->data;
    const size_t G = cols / 32;
    for (size_t g = 0; g < G; g++) {
        const uint8_t *b = blk + ((v * G + g) * 16);
        const float d = ldexpf(1.0f, (int)sc[v * G + g] - 127);
        for (int k = 0; k < 16; k++) {
            out[g * 32 + 2 * k] = lut[b[k] & 15] * d;
            out[g * 32 + 2 * k + 1] = lut[b[k] >> 4] * d;
        }
    }
}

/* A chained row selection (gpt-oss's experts, stored [E][in][out] with gate and up interleaved):
 * "NAME[A:B][C:D]" or "NAME[A:B][C:D/P]" (rows C .. D-1, of every P, of rows A .. B-1), and
 * "NAME^T[A:B]..." on a 3-D tensor [E][R][C], whose view is each matrix transposed ([E][C][R]:
 * E * C rows of R), or a 2-D one. A vector's rows are its elements. 0 when NAME is none of these
 * (parse_rows reads it), 1 with *c filled and base the source name, < 0 on a bad range. */
static int parse_chain(const job *j, const char *iflow_name, const char *name, char *base, size_t cap,
                       struct chain *c, const iflow_src_tensor *(*find)(const job *, const char *))
{
    const size_t n = strlen(name);
    const char *first = strchr(name, '['), *mid = strstr(name, "][");
    if (!first || name[n - 1] != ']')
        return 0;
    const int xpose = first - name >= 2 && first[-2] == '^' && first[-1] == 'T';
    snprintf(base, cap, "%.*s", (int)(first - name - (xpose ? 2 : 0)), name);
    memset(c, 0, sizeof *c);
    const int mx = mxfp4_pair(j, base, c, find);
    if (mx < 0)
        return mx;
    const iflow_src_tensor *t = mx ? &c->mx : find(j, base);
    if (!mid && !mx && !(xpose && t && t->n_dims == 3))
        return 0;
    if (mx && xpose)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "'%s': an MXFP4 pair is not read transposed (it is [E][out][in])",
                            name);
    c->on = 1, c->xpose = xpose;
    const char *colon = strchr(first, ':');
    const char *end1 = mid ? mid : name + n - 1;
    int bad = !colon || colon > end1;
    if (!bad) {
        c->a0 = row_expr(first + 1, (size_t)(colon - first - 1), &j->hp);
        c->a1 = row_expr(colon + 1, (size_t)(end1 - colon - 1), &j->hp);
    }
    if (!bad && mid) {
        const char *open2 = mid + 1, *colon2 = strchr(open2, ':'), *slash = colon2 ? strchr(colon2, '/') : NULL;
        const char *close2 = name + n - 1, *e2 = slash ? slash : close2;
        bad = !colon2 || strchr(open2 + 1, '[');
        if (!bad) {
            c->c0 = row_expr(open2 + 1, (size_t)(colon2 - open2 - 1), &j->hp);
            c->c1 = row_expr(colon2 + 1, (size_t)(e2 - colon2 - 1), &j->hp);
            c->P = slash ? row_expr(slash + 1, (size_t)(close2 - slash - 1), &j->hp) : 0;
        }
    } else if (!bad) {
        c->c0 = 0, c->c1 = c->a1 - c->a0;
    }
    const long span = c->a1 - c->a0;
    if (bad || c->a0 < 0 || c->a1 <= c->a0 || c->c0 < 0 || c->c1 <= c->c0 || c->P < 0 ||
        (c->P && (c->c1 > c->P || span % c->P)) || (!c->P && c->c1 > span))
        return iflow_seterr(IFLOW_ESPEC,
                            "bad row range in '%s' for '%s' (spec '%s'): want NAME[A:B][C:D] or NAME[A:B][C:D/P] (D <= "
                            "B - A, or D <= P dividing B - A), or NAME^T[A:B] of a 3-D tensor",
                            name, iflow_name, j->spec->path);
    if (j->gguf)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "chained or transposed row ranges ('%s') are not supported for GGUF "
                            "sources", name);
    return 1;
}

/* Rows of a chained selection, and view row k's of them. */
static long chain_rows(const struct chain *c)
{
    return c->P ? (c->a1 - c->a0) / c->P * (c->c1 - c->c0) : c->c1 - c->c0;
}

static long chain_row(const struct chain *c, long k)
{
    const long per = c->c1 - c->c0;
    return c->P ? c->a0 + k / per * c->P + c->c0 + k % per : c->a0 + c->c0 + k;
}

/* A spec's source name may list alternatives, "A | B": the first the source holds (T5's plain
 * FFN stores wi, its gated one wi_0 and wi_1), else the first, for the message. */
static void pick_alternative(const job *j, char *spec_name, size_t cap)
{
    char copy[512], base[512];
    if (!strchr(spec_name, '|'))
        return;
    snprintf(copy, sizeof copy, "%s", spec_name);
    const char *first = NULL, *pick = NULL;
    for (char *save = NULL, *alt = strtok_r(copy, "|", &save); alt && !pick; alt = strtok_r(NULL, "|", &save)) {
        while (*alt == ' ')
            alt++;
        alt[strcspn(alt, " ")] = 0;
        snprintf(base, sizeof base, "%.*s", (int)strcspn(alt, "[^"), alt);
        first = first ? first : alt;
        const size_t nb = strlen(base), sfx = strlen("(mxfp4)");
        if (nb > sfx && strcmp(base + nb - sfx, "(mxfp4)") == 0) /* an MXFP4 pair: its blocks */
            snprintf(base + nb - sfx, sizeof base - (nb - sfx), "_blocks");
        pick = src_find(j, base) ? alt : NULL;
    }
    snprintf(spec_name, cap, "%s", pick ? pick : first ? first : "");
}

/* A source tensor of a layer past the model's n_layers that the hyperparameter extra_layers
 * covers (GLM-4.5's and DeepSeek-V3's multi-token-prediction layers, num_nextn_predict_layers:
 * "model.layers.N." or "blk.N." with n_layers <= N < n_layers + extra_layers): carried by the
 * checkpoint, never run by the engine. */
static int extra_layer(const job *j, const char *name)
{
    const json_t *x = json_object_get(json_object_get(j->resolved, "hparams"), "extra_layers");
    const long extra = json_is_integer(x) ? (long)json_integer_value(x) : 0;
    const char *at = strncmp(name, "blk.", 4) == 0 ? name + 4 : strstr(name, "layers.");
    char *end;
    if (extra <= 0 || !at)
        at = NULL;
    else if (at != name + 4)
        at += 7;
    long l = at ? strtol(at, &end, 10) : -1;
    return at && end != at && *end == '.' && l >= j->hp.n_layers && l < j->hp.n_layers + extra;
}

/* rows[i]: the chained selection of t (see parse_chain). The view: a 3-D tensor [E][R][C]'s
 * E * R rows of C (transposed: E * C rows of R), a matrix's rows (transposed: its columns), and
 * for a vector the model needs, the tensor's elements. */
static int chain_source(job *j, size_t i, const iflow_src_tensor *t, const char *name)
{
    const struct chain *c = &j->chain[i];
    const int es = t->dtype == IFLOW_DT_F32 ? 4 : t->dtype == IFLOW_DT_F16 || t->dtype == IFLOW_DT_BF16 ? 2 : 0;
    const int vec = j->reqs[i].n_dims == 1;
    int64_t view_rows = 0, cols = 1, n = 1;
    for (int d = 0; d < t->n_dims; d++)
        n *= t->shape[d];
    if (es && vec && !c->xpose)
        view_rows = n;
    else if (es && !vec && t->n_dims == 3)
        view_rows = t->shape[0] * t->shape[c->xpose ? 2 : 1], cols = t->shape[c->xpose ? 1 : 2];
    else if (es && !vec && t->n_dims == 2)
        view_rows = t->shape[c->xpose ? 1 : 0], cols = t->shape[c->xpose ? 0 : 1];
    if (!view_rows || c->a1 > view_rows)
        return iflow_seterr(IFLOW_ESHAPE, "tensor '%s' in '%s' (%d dimensions, %s) has no rows %ld..%ld to select for "
                            "'%s' (an F32, F16 or BF16 tensor of that many is needed)",
                            name, src_path(j), t->n_dims, t->dtype_name, c->a0, c->a1 - 1, j->reqs[i].name);
    iflow_src_tensor s = *t;
    s.n_dims = vec ? 1 : 2;
    s.shape[0] = chain_rows(c), s.shape[1] = vec ? 0 : cols, s.shape[2] = 0;
    s.nbytes = (size_t)s.shape[0] * (size_t)cols * (size_t)es;
    s.data = NULL;
    j->rows[i] = s;
    return 0;
}

static int map_sources(job *j)
{
    size_t n_src = src_n_tensors(j);
    char *used = calloc(n_src ? n_src : 1, 1);
    j->src = calloc(j->n_reqs, sizeof *j->src);
    j->whole = calloc(j->n_reqs, sizeof *j->whole);
    j->rows = calloc(j->n_reqs, sizeof *j->rows);
    j->xpose = calloc(j->n_reqs, 1);
    j->row0 = calloc(j->n_reqs, sizeof *j->row0);
    j->period = calloc(j->n_reqs, sizeof *j->period);
    j->chain = calloc(j->n_reqs, sizeof *j->chain);
    int rc = used && j->src && j->whole && j->rows && j->xpose && j->row0 && j->period && j->chain
                 ? 0
                 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (size_t i = 0; i < j->n_reqs && rc == 0; i++) {
        char spec_name[512], name[512];
        long r0, r1, period;
        int xpose;
        if ((rc = iflow_spec_source_name(j->spec, j->reqs[i].name, spec_name, sizeof spec_name)) < 0)
            break;
        pick_alternative(j, spec_name, sizeof spec_name);
        if ((rc = parse_chain(j, j->reqs[i].name, spec_name, name, sizeof name, &j->chain[i], src_find)) < 0)
            break;
        if (rc == 1) { /* rows of a view of the tensor, gathered by the payload */
            rc = 0;
            const iflow_src_tensor *t = j->whole[i] = j->chain[i].blocks ? &j->chain[i].mx : src_find(j, name);
            if (t && (rc = chain_source(j, i, t, name)) < 0)
                break;
            j->src[i] = t ? &j->rows[i] : NULL;
            if ((rc = check_source(j, i, j->src[i], spec_name)) < 0)
                break;
            for (size_t s = 0; s < n_src; s++)
                if (src_tensor(j, s) == j->whole[i] || src_tensor(j, s) == j->chain[i].blocks ||
                    src_tensor(j, s) == j->chain[i].scales)
                    used[s] = 1;
            continue;
        }
        if ((rc = parse_rows(j, j->reqs[i].name, spec_name, name, sizeof name, &r0, &r1, &period, &xpose)) < 0)
            break;
        const iflow_src_tensor *t = j->whole[i] = j->src[i] = src_find(j, name);
        if (t && xpose) { /* the matrix transposed: [cols][rows], gathered at write time */
            int es = t->dtype == IFLOW_DT_F32 ? 4 : t->dtype == IFLOW_DT_F16 || t->dtype == IFLOW_DT_BF16 ? 2 : 0;
            if (t->n_dims != 2 || !es || (period && t->shape[0] % period)) {
                rc = iflow_seterr(IFLOW_EUNSUPPORTED, "tensor '%s' in '%s' cannot be transposed (%d dimensions, %s, "
                                  "%lld rows): a 2-D F32, F16 or BF16 matrix (of whole periods) is needed for '%s'",
                                  name, src_path(j), t->n_dims, t->dtype_name, (long long)t->shape[0],
                                  j->reqs[i].name);
                break;
            }
            if (period) { /* each period's rows r0 .. r1-1 transposed: [N / P * C][r1 - r0] */
                j->rows[i] = *t;
                j->rows[i].shape[0] = t->shape[0] / period * t->shape[1], j->rows[i].shape[1] = r1 - r0;
                j->rows[i].nbytes = (size_t)j->rows[i].shape[0] * (size_t)(r1 - r0) * (size_t)es;
                j->rows[i].data = NULL;
                j->xpose[i] = 1, j->period[i] = period, j->row0[i] = r0;
                j->src[i] = &j->rows[i];
                r1 = -1, t = NULL;
            }
        }
        if (t && xpose) {
            j->rows[i] = *t;
            j->rows[i].shape[0] = t->shape[1], j->rows[i].shape[1] = t->shape[0];
            j->rows[i].data = NULL;
            j->xpose[i] = 1;
            t = j->src[i] = &j->rows[i];
        }
        if (t && r1 >= 0) { /* rows r0 .. r1-1 (of a vector: elements): a tensor of its own, in place */
            /* a 3-D tensor [A][B][C] is A * B rows of C (llama.cpp's experts [E][F][D]: expert e
             * is rows e * F .. e * F + F - 1) */
            int64_t n_rows = t->shape[0];
            if (t->n_dims == 3 && !period && __builtin_mul_overflow(t->shape[0], t->shape[1], &n_rows))
                n_rows = -1;
            if (t->n_dims > (period ? 2 : 3) || r1 > n_rows || (period && t->shape[0] % period) || !n_rows) {
                rc = iflow_seterr(IFLOW_ESHAPE, "tensor '%s' in '%s' has shape [%lld, %lld%s]: no rows %ld..%ld for '%s'",
                                  name, src_path(j), (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0),
                                  t->n_dims > 2 ? ", ..." : "", r0, r1 - 1, j->reqs[i].name);
                break;
            }
            size_t row = t->nbytes / (size_t)n_rows;
            iflow_src_tensor s = *t;
            if (t->n_dims == 3)
                s.n_dims = 2, s.shape[1] = t->shape[2], s.shape[2] = 1;
            s.shape[0] = (r1 - r0) * (period ? t->shape[0] / period : 1);
            s.nbytes = (size_t)s.shape[0] * row;
            if (period) { /* gathered by the payload */
                s.data = NULL;
                j->period[i] = period;
            } else if (!xpose) {
                s.data = (const char *)t->data + (size_t)r0 * row;
                s.file_offset += (uint64_t)r0 * row;
            }
            j->rows[i] = s;
            j->row0[i] = r0;
            j->src[i] = &j->rows[i];
        }
        if ((rc = check_source(j, i, j->src[i], spec_name)) < 0)
            break;
        for (size_t s = 0; s < n_src; s++)
            if (src_tensor(j, s) == j->whole[i])
                used[s] = 1;
    }
    for (size_t s = 0; s < n_src && rc == 0; s++) {
        const iflow_src_tensor *t = src_tensor(j, s);
        if (!used[s] && !iflow_spec_ignored(j->spec, t->name) && !extra_layer(j, t->name))
            rc = iflow_seterr(IFLOW_ESPEC, "unexpected tensor '%s' in '%s': spec '%s' does not use it", t->name,
                              src_path(j), j->spec->path);
    }
    free(used);
    return rc;
}

/* ---- the meta record ---- */

static int target_type(const job *j, const iflow_tensor_req *r, int src_type)
{
    if (r->is_vector)
        return IFLOW_DT_F32;
    return j->o->dtype >= 0 ? j->o->dtype : src_type;
}

/* A matrix an adapter changes keeps a float source type; a quantized one's becomes F32 (an
 * MXFP4 pair's: Q8_B32 when exact, else BF16). */
static int tensor_target(const job *j, size_t i)
{
    int src = j->src[i] ? j->src[i]->dtype : IFLOW_DT_F32;
    if (j->chain && j->chain[i].blocks) /* MXFP4 re-encodes exactly as Q8_B32 where its scales fit F16; */
        src = j->chain[i].q8 ? IFLOW_DT_Q8_B32 : IFLOW_DT_BF16; /* its values are exact in BF16 anyway */
    if (j->merged && j->merged[i] && !iflow_dtype_is_float(src))
        src = IFLOW_DT_F32;
    return target_type(j, &j->reqs[i], src);
}

/* {"SRC -> DST": count}: how the source's types became the shard's (real models only). */
static json_t *conversions(const job *j)
{
    json_t *c = json_object();
    for (size_t i = 0; c && i < j->n_reqs; i++) {
        const iflow_src_tensor *t = j->src[i];
        char key[96];
        if (!t)
            continue;
        const char *dst = iflow_dtype_name(tensor_target(j, i));
        snprintf(key, sizeof key, "%s -> %s", t->dtype_name ? t->dtype_name : "?", dst ? dst : "?");
        json_object_set_new(c, key, json_integer(json_integer_value(json_object_get(c, key)) + 1));
    }
    return c;
}

/* meta.source: the source's format and architecture, and the type conversions. */
static json_t *source_meta(const job *j)
{
    json_t *src;
    if (j->gguf) {
        const char *arch = iflow_ggufsrc_architecture(j->gguf);
        src = json_pack("{s:s, s:s?}", "format", j->llama2c ? "llama2c" : "gguf", "architecture", arch);
    } else {
        const json_t *archs = json_object_get(iflow_hfdir_config(j->dir), "architectures");
        src = json_pack("{s:s, s:O?}", "format", "hf", "architectures", archs);
    }
    if (src && !(j->o->flags & IFLOW_CONVERT_SYNTHETIC))
        json_object_set_new(src, "tensors", conversions(j));
    json_t *lora = j->o->n_loras && src ? json_array() : NULL;
    for (size_t a = 0; lora && a < j->o->n_loras; a++)
        json_array_append_new(lora, json_pack("{s:s, s:f, s:I}", "path", j->o->lora_paths[a], "scale",
                                              j->o->lora_scales ? j->o->lora_scales[a] : 1.0, "tensors",
                                              (json_int_t)j->lora_used[a]));
    if (lora)
        json_object_set_new(src, "lora", lora);
    return src;
}

static json_t *build_meta(job *j)
{
    json_t *meta = json_pack("{s:s, s:i, s:O, s:O, s:O}", "format", "iflow-shard", "version", 1, "spec",
                             json_object_get(j->resolved, "spec"), "blocks", json_object_get(j->resolved, "blocks"),
                             "hparams", json_object_get(j->resolved, "hparams"));
    if (!meta)
        return NULL;
    json_object_set_new(meta, "source", source_meta(j));
    json_t *tok = iflow_tokrec_describe(&j->tok);
    if (tok)
        json_object_set_new(meta, "tokenizer", tok);
    if (j->chat)
        json_object_set_new(meta, "chat_template",
                            json_pack("{s:s, s:s}", "record", "chat_template", "from", j->chat_from));
    const json_t *gen = j->dir ? iflow_hfdir_generation_config(j->dir) : NULL;
    if (gen)
        json_object_set(meta, "generation", (json_t *)gen);
    json_object_set_new(meta, "shard", json_pack("{s:i, s:i, s:[i,i]}", "index", 0, "count", 1, "layers", 0, j->hp.n_layers));
    if (j->o->flags & IFLOW_CONVERT_SYNTHETIC)
        json_object_set_new(meta, "synthetic", json_pack("{s:I}", "seed", (json_int_t)j->o->seed));
    return meta;
}

/* The tokenizer: a GGUF's vocabulary, else the files of --tokenizer's path (required there), else
 * of the model directory (none is no error). */
static int find_tokenizer(job *j)
{
    if (!j->gguf)
        return j->o->tokenizer_path ? iflow_tokrec_find(&j->tok, j->o->tokenizer_path, 1)
                                    : iflow_tokrec_find(&j->tok, iflow_hfdir_path(j->dir), 0);
    size_t len;
    int rc = iflow_ggufsrc_tokenizer(j->gguf, &j->vocab, &len);
    if (rc == IFLOW_ENOTFOUND)
        return 0; /* a GGUF without a vocabulary: a shard without a tokenizer */
    if (rc == 0)
        iflow_tokrec_blob(&j->tok, j->vocab, len);
    return rc;
}

static int keep_chat(job *j, const char *text, size_t len, const char *from)
{
    if (len > IFLOW_MAX_CHAT_TEMPLATE)
        return iflow_seterr(IFLOW_ERANGE, "chat template of '%s' (%s) is %zu bytes, more than %u", src_path(j), from,
                            len, IFLOW_MAX_CHAT_TEMPLATE);
    if (!(j->chat = malloc(len + 1)))
        return iflow_seterr(IFLOW_ENOMEM, "out of memory copying the chat template of '%s'", src_path(j));
    memcpy(j->chat, text, len);
    j->chat[len] = 0;
    j->chat_len = len;
    j->chat_from = from;
    return 0;
}

/* tokenizer_config.json's "chat_template": a string, or a list of {"name", "template"} of which
 * the one named "default" (else the first) is taken, as transformers does without a name. */
static int chat_from_config(job *j, const json_t *tc)
{
    const json_t *v = json_object_get(tc, "chat_template"), *pick = v;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_array(v)) {
        pick = json_object_get(json_array_get(v, 0), "template");
        for (size_t i = 0; i < json_array_size(v); i++) {
            const char *name = json_string_value(json_object_get(json_array_get(v, i), "name"));
            if (name && strcmp(name, "default") == 0) {
                pick = json_object_get(json_array_get(v, i), "template");
                break;
            }
        }
    }
    if (!json_is_string(pick))
        return iflow_seterr(IFLOW_EFORMAT, "'chat_template' in '%s/tokenizer_config.json' is not a string or a list of "
                            "{\"name\", \"template\"}", src_path(j));
    return keep_chat(j, json_string_value(pick), json_string_length(pick), "tokenizer_config.json");
}

/* The chat template, if the source has one: a GGUF's tokenizer.chat_template; a directory's
 * chat_template.jinja, else its tokenizer_config.json's "chat_template". None is no error. */
static int find_chat_template(job *j)
{
    const char *text;
    size_t len;
    if (j->gguf) {
        int rc = iflow_ggufsrc_chat_template(j->gguf, &text, &len);
        return rc == IFLOW_ENOTFOUND ? 0 : rc < 0 ? rc : keep_chat(j, text, len, "tokenizer.chat_template");
    }
    char path[4096], *data;
    snprintf(path, sizeof path, "%s/chat_template.jinja", iflow_hfdir_path(j->dir));
    int rc = iflow_read_file(path, IFLOW_MAX_CHAT_TEMPLATE, &data, &len);
    if (rc == IFLOW_ENOTFOUND)
        return chat_from_config(j, iflow_hfdir_tokenizer_config(j->dir));
    if (rc == 0)
        rc = keep_chat(j, data, len, "chat_template.jinja");
    free(data);
    return rc;
}

static int write_header_records(job *j, iflow_shard_writer *w)
{
    json_t *meta = build_meta(j);
    char *text = meta ? json_dumps(meta, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(meta);
    int rc = text ? iflow_shard_write_blob(w, "meta", text, strlen(text)) : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    if (rc == 0)
        rc = iflow_tokrec_write(&j->tok, w);
    if (rc == 0 && j->chat)
        rc = iflow_shard_write_blob(w, "chat_template", j->chat, j->chat_len);
    free(text);
    return rc;
}

/* ---- tensors ---- */

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

/* The conversion buffer *buf holds at least `need` bytes (its contents are not kept). */
static int grow(void **buf, size_t *cap, size_t need, const char *tensor)
{
    if (need <= *cap)
        return 0;
    free(*buf);
    if (!(*buf = malloc(need)))
        return *cap = 0, iflow_seterr(IFLOW_ENOMEM, "out of memory converting '%s' (%zu bytes)", tensor, need);
    *cap = need;
    return 0;
}

/* Produce the payload of required tensor i in its target type. *data may point into the source
 * mapping (no copy) or into *buf (grown as needed). */
static int tensor_payload(job *j, size_t i, int dt, const void **data, size_t *nbytes, void **buf, size_t *cap)
{
    const iflow_tensor_req *r = &j->reqs[i];
    size_t n = (size_t)r->shape[0] * (size_t)(r->n_dims > 1 ? r->shape[1] : 1);
    const iflow_src_tensor *t = j->src[i];
    *nbytes = iflow_tensor_nbytes(dt, r->n_dims, r->shape);
    size_t need = *nbytes + (t ? 0 : n * sizeof(float));
    if (t && t->dtype == dt && !j->gguf && !j->xpose[i] && !j->period[i] && !j->chain[i].on) {
        *data = t->data;
        return 0;
    }
    if (grow(buf, cap, need, r->name) < 0)
        return IFLOW_ENOMEM;
    *data = *buf;
    if (t && j->gguf)
        return iflow_ggufsrc_payload(j->gguf, t, dt, data, *buf);
    if (t && j->chain[i].blocks && dt == IFLOW_DT_Q8_B32 && j->chain[i].q8) { /* an MXFP4 pair's rows, exactly */
        const struct chain *c = &j->chain[i];
        const size_t cols = (size_t)t->shape[1], G = cols / 32;
        const uint8_t *blk = c->blocks->data, *sc = c->scales->data;
        uint8_t *out = *buf;
        for (size_t k = 0; k < (size_t)t->shape[0]; k++) {
            const size_t v = (size_t)chain_row(c, (long)k);
            for (size_t g = 0; g < G; g++)
                mxfp4_q8_block(out + (k * G + g) * 36, blk + (v * G + g) * 16, sc[v * G + g]);
        }
        return 0;
    }
    if (t && j->chain[i].on) { /* rows of a view of whole (parse_chain), gathered, then converted */
        const iflow_src_tensor *w = j->whole[i];
        const struct chain *c = &j->chain[i];
        const size_t es = w->dtype == IFLOW_DT_F32 ? 4 : 2, rows = (size_t)t->shape[0];
        const size_t cols = t->n_dims > 1 ? (size_t)t->shape[1] : 1;
        const size_t R = w->n_dims == 3 ? (size_t)w->shape[1] : (size_t)w->shape[0];
        const size_t C = (size_t)w->shape[w->n_dims - 1];
        unsigned char *g = malloc(rows * cols * es + 1);
        if (!g)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory gathering rows of '%s'", w->name);
        const unsigned char *src = w->data;
        for (size_t k = 0; k < rows; k++) {
            const size_t v = (size_t)chain_row(c, (long)k);
            unsigned char *out = g + k * cols * es;
            if (c->blocks) { /* an MXFP4 pair's row, decoded (F32) */
                mxfp4_row((float *)(void *)out, c, v, cols);
                continue;
            }
            if (!c->xpose) { /* view row v: cols elements from element v * cols */
                memcpy(out, src + v * cols * es, cols * es);
                continue;
            }
            /* transposed: view row v = (matrix e, column b): element [e][r][b] for r < R */
            const size_t e = w->n_dims == 3 ? v / C : 0, b = w->n_dims == 3 ? v % C : v;
            for (size_t r = 0; r < cols; r++)
                memcpy(out + r * es, src + ((e * R + r) * C + b) * es, es);
        }
        int rc = iflow_dtype_convert(*buf, dt, g, t->dtype, n);
        free(g);
        return rc;
    }
    if (t && j->xpose[i] && j->period[i]) { /* each period's rows row0.. of whole, transposed */
        const iflow_src_tensor *w = j->whole[i];
        const size_t es = w->dtype == IFLOW_DT_F32 ? 4 : 2, C = (size_t)w->shape[1], P = (size_t)j->period[i];
        const size_t take = (size_t)t->shape[1], blocks = (size_t)w->shape[0] / P;
        unsigned char *g = malloc(n * es + 1);
        if (!g)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory transposing '%s'", w->name);
        for (size_t b = 0; b < blocks; b++) /* row b * C + c of the result = column c of block b's rows */
            for (size_t c = 0; c < C; c++)
                for (size_t r = 0; r < take; r++)
                    memcpy(g + ((b * C + c) * take + r) * es,
                           (const unsigned char *)w->data + ((b * P + (size_t)j->row0[i] + r) * C + c) * es, es);
        int rc = iflow_dtype_convert(*buf, dt, g, t->dtype, n);
        free(g);
        return rc;
    }
    if (t && j->xpose[i]) { /* rows row0.. of whole^T: its columns, gathered, then converted */
        const iflow_src_tensor *w = j->whole[i];
        const size_t es = w->dtype == IFLOW_DT_F32 ? 4 : 2, R = (size_t)w->shape[0], C = (size_t)w->shape[1];
        const size_t rows = (size_t)t->shape[0], cols = t->n_dims > 1 ? (size_t)t->shape[1] : 1;
        unsigned char *g = malloc(rows * cols * es + 1);
        if (!g)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory transposing '%s'", w->name);
        for (size_t r = 0; r < rows; r++) /* row r of the result = column row0 + r of w */
            for (size_t c = 0; c < cols && c < R; c++)
                memcpy(g + (r * cols + c) * es, (const unsigned char *)w->data + (c * C + (size_t)j->row0[i] + r) * es, es);
        int rc = iflow_dtype_convert(*buf, dt, g, t->dtype, n);
        free(g);
        return rc;
    }
    if (t && j->period[i]) { /* rows row0 .. of every period rows of whole, gathered, then converted */
        const iflow_src_tensor *w = j->whole[i];
        const size_t row = w->nbytes / (size_t)w->shape[0], P = (size_t)j->period[i];
        const size_t take = (size_t)t->shape[0] / ((size_t)w->shape[0] / P); /* rows a period */
        unsigned char *g = malloc(t->nbytes + 1);
        if (!g)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory gathering rows of '%s'", w->name);
        for (size_t p = 0; p < (size_t)w->shape[0] / P; p++)
            memcpy(g + p * take * row, (const unsigned char *)w->data + (p * P + (size_t)j->row0[i]) * row, take * row);
        int rc = iflow_dtype_convert(*buf, dt, g, t->dtype, n);
        free(g);
        return rc;
    }
    if (t)
        return iflow_dtype_convert(*buf, dt, t->data, t->dtype, n);
    float *tmp = (float *)((char *)*buf + *nbytes); /* synthetic: F32 values, then converted */
    synth_fill(tmp, n, r, j->o->seed);
    return iflow_dtype_convert(*buf, dt, tmp, IFLOW_DT_F32, n);
}

/* Hyperparameter norm_offset (Gemma's RMSNorm scales by 1 + w): added to every norm weight
 * (a vector whose iflow name ends in "_norm", F32 here), so the engine's RMSNorm multiplies
 * by the stored weight as it does for every family. The payload is copied into *buf first
 * when it still points into the source. */
static int apply_norm_offset(job *j, size_t i, const void **data, size_t nbytes, void **buf, size_t *cap)
{
    const iflow_tensor_req *r = &j->reqs[i];
    const json_t *o = json_object_get(json_object_get(j->resolved, "hparams"), "norm_offset");
    double off = json_number_value(o);
    size_t n = strlen(r->name);
    if (off == 0.0 || !r->is_vector || n < 5 || strcmp(r->name + n - 5, "_norm") != 0)
        return 0;
    if (*data != *buf) {
        if (grow(buf, cap, nbytes, r->name) < 0)
            return IFLOW_ENOMEM;
        memcpy(*buf, *data, nbytes);
        *data = *buf;
    }
    float *v = *buf;
    for (size_t k = 0; k < nbytes / sizeof(float); k++)
        v[k] = (float)((double)v[k] + off);
    return 0;
}

/* ---- LoRA adapters (lora.h) ---- */

/* Each tensor's name in the naming the source does not use (the spec's other view: the GGUF
 * variant for a directory, the Hugging Face names for a GGUF source), so that an adapter in that
 * naming finds its tensors; and the q/k projections whose rotary rows that view orders the other
 * way (rope_layout half in one, interleaved in the other: llama.cpp's converter permutes them).
 * A tensor the source reads as rows of another, transposed, strided, or under alternatives is
 * left out (an adapter naming it is then refused as naming what the model does not use). */
static int map_other_naming(job *j)
{
    if (j->xnames)
        return 0;
    iflow_spec *o = NULL;
    int rc = iflow_spec_load(&o, j->spec->path);
    if (rc == 0 && j->dir)
        rc = iflow_spec_use_source(o, "gguf");
    if (rc < 0) {
        iflow_spec_close(o);
        return iflow_preperr(rc, "naming the tensors of '%s' as the other form of checkpoint does", src_path(j));
    }
    j->xnames = calloc(j->n_reqs + 1, sizeof *j->xnames);
    j->xheads = calloc(j->n_reqs + 1, sizeof *j->xheads);
    if (!j->xnames || !j->xheads)
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    const char *mine = iflow_spec_block(j->spec, "rope_layout"), *theirs = iflow_spec_block(o, "rope_layout");
    const int flip = mine && theirs && strcmp(mine, theirs) != 0 && j->hp.position == IFLOW_POS_ROPE;
    j->x_interleaved = flip && strcmp(mine, "interleaved") == 0;
    for (size_t i = 0; rc == 0 && i < j->n_reqs; i++) {
        char name[512];
        const char *n = j->reqs[i].name;
        size_t len = strlen(n);
        if (j->src[i] != j->whole[i] || iflow_spec_source_name(o, n, name, sizeof name) < 0 || strpbrk(name, "|[^"))
            continue;
        if (!(j->xnames[i] = strdup(name)))
            rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
        int q = len > 3 && strcmp(n + len - 3, ".wq") == 0, k = len > 3 && strcmp(n + len - 3, ".wk") == 0;
        if (flip && (q || k)) /* whole heads rotate: refused in map_loras otherwise */
            j->xheads[i] = q ? j->hp.n_heads : j->hp.n_kv_heads;
    }
    iflow_spec_close(o);
    return rc;
}

/* Adapter a names tensors as the other kind of checkpoint does (map_other_naming). */
static int lora_cross(const job *j, size_t a)
{
    return iflow_lora_naming(j->loras[a]) != (j->dir ? IFLOW_LORA_HF : IFLOW_LORA_GGUF);
}

/* The name adapter a gives tensor i, or NULL when it names none. */
static const char *lora_name(const job *j, size_t a, size_t i)
{
    return lora_cross(j, a) ? (j->xnames ? j->xnames[i] : NULL) : j->whole[i] ? j->whole[i]->name : NULL;
}

/* The heads of tensor i whose rotary rows adapter a orders the other way, or 0. */
static int lora_heads(const job *j, size_t a, size_t i) { return lora_cross(j, a) && j->xheads ? j->xheads[i] : 0; }

/* Open the adapters and find the model's tensors their deltas change, checking the shapes. */
static int map_loras(job *j)
{
    const size_t n = j->o->n_loras;
    if (n == 0)
        return 0;
    if (j->o->flags & IFLOW_CONVERT_SYNTHETIC)
        return iflow_seterr(IFLOW_EINVAL, "a LoRA adapter cannot be merged into synthetic weights");
    j->loras = calloc(n, sizeof *j->loras);
    j->merged = calloc(j->n_reqs + 1, 1);
    j->lora_used = calloc(n, sizeof *j->lora_used);
    if (!j->loras || !j->merged || !j->lora_used)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (size_t a = 0; a < n; a++) {
        const char *path = j->o->lora_paths[a];
        IFLOW_TRY(iflow_lora_open(&j->loras[a], path, j->o->lora_scales ? j->o->lora_scales[a] : 1.0));
        const iflow_lora *l = j->loras[a];
        if (lora_cross(j, a))
            IFLOW_TRY(map_other_naming(j));
        for (size_t k = 0; k < iflow_lora_n_deltas(l); k++) {
            const iflow_lora_delta *d = iflow_lora_delta_at(l, k);
            size_t found = 0;
            for (size_t i = 0; i < j->n_reqs; i++) {
                const iflow_src_tensor *w = j->whole[i];
                const char *name = lora_name(j, a, i);
                if (!w || !name || strcmp(name, d->target) != 0)
                    continue;
                found++;
                if (j->reqs[i].is_vector || j->reqs[i].n_dims != 2 || w->n_dims != 2)
                    return iflow_seterr(IFLOW_ESHAPE, "LoRA adapter '%s' changes '%s', which is not a matrix", path,
                                        d->target);
                if (j->xpose[i] || j->period[i] || j->chain[i].on)
                    return iflow_seterr(IFLOW_EUNSUPPORTED, "LoRA adapter '%s' changes '%s', which spec '%s' reads "
                                        "transposed or strided: merging into it is not supported", path, d->target,
                                        j->spec->path);
                if (w->shape[0] != d->out || w->shape[1] != d->in)
                    return iflow_seterr(IFLOW_ESHAPE, "LoRA adapter '%s': the delta of '%s' is [%lld, %lld] and the "
                                        "tensor in '%s' [%lld, %lld]", path, d->target, (long long)d->out,
                                        (long long)d->in, src_path(j), (long long)w->shape[0], (long long)w->shape[1]);
                if (lora_heads(j, a, i) && (j->hp.rope_dim != j->hp.head_dim || j->hp.head_dim % 2))
                    return iflow_seterr(IFLOW_EUNSUPPORTED, "LoRA adapter '%s' changes '%s', whose rotary rows the "
                                        "two namings order differently and not in whole heads: give the adapter in "
                                        "the model's form", path, d->target);
                j->merged[i] = 1;
            }
            if (!found)
                return iflow_seterr(IFLOW_ENOTFOUND, "LoRA adapter '%s' changes '%s', which the model in '%s' does "
                                    "not use", path, d->target, src_path(j));
            j->lora_used[a]++;
        }
    }
    return 0;
}

/* Tensor i with every adapter's delta added, in type dt: computed in F32 in *fbuf, converted
 * into *buf when dt is not F32. */
static int merged_payload(job *j, size_t i, int dt, const void **data, size_t *nbytes, void **buf, size_t *cap,
                          void **fbuf, size_t *fcap)
{
    const iflow_tensor_req *r = &j->reqs[i];
    const void *f;
    size_t fn;
    IFLOW_TRY(tensor_payload(j, i, IFLOW_DT_F32, &f, &fn, fbuf, fcap));
    if (f != *fbuf) { /* still the source's bytes */
        if (grow(fbuf, fcap, fn, r->name) < 0)
            return IFLOW_ENOMEM;
        memcpy(*fbuf, f, fn);
    }
    for (size_t a = 0; a < j->o->n_loras; a++) {
        const char *name = lora_name(j, a, i);
        const iflow_lora_delta *d = name ? iflow_lora_find(j->loras[a], name) : NULL;
        const int h = lora_heads(j, a, i);
        if (d && h) { /* the other naming's rotary order */
            int64_t *rows = malloc((size_t)r->shape[0] * sizeof *rows);
            if (!rows)
                return iflow_seterr(IFLOW_ENOMEM, "out of memory merging into '%s'", r->name);
            iflow_lora_rotary_rows(rows, r->shape[0], h, j->x_interleaved);
            iflow_lora_add_rows(d, *fbuf, rows, r->shape[0]);
            free(rows);
        } else if (d) {
            iflow_lora_add(d, *fbuf, j->row0[i], r->shape[0]);
        }
    }
    *nbytes = iflow_tensor_nbytes(dt, r->n_dims, r->shape);
    if (dt == IFLOW_DT_F32) {
        *data = *fbuf;
        return 0;
    }
    if (grow(buf, cap, *nbytes, r->name) < 0)
        return IFLOW_ENOMEM;
    *data = *buf;
    return iflow_dtype_convert(*buf, dt, *fbuf, IFLOW_DT_F32, (size_t)r->shape[0] * (size_t)r->shape[1]);
}

static int write_tensors(job *j, iflow_shard_writer *w)
{
    void *buf = NULL, *fbuf = NULL;
    size_t cap = 0, fcap = 0;
    int rc = 0;
    iflow_progress pr = {.total = j->n_reqs};
    for (size_t i = 0; i < j->n_reqs; i++) {
        const iflow_tensor_req *r = &j->reqs[i];
        pr.total_bytes += iflow_dtype_nbytes(tensor_target(j, i),
                                             (size_t)r->shape[0] * (size_t)(r->n_dims > 1 ? r->shape[1] : 1));
    }
    for (size_t i = 0; i < j->n_reqs && rc == 0; i++) {
        const iflow_tensor_req *r = &j->reqs[i];
        int dt = tensor_target(j, i);
        const void *data = NULL;
        size_t nbytes = 0;
        if ((rc = j->merged && j->merged[i] ? merged_payload(j, i, dt, &data, &nbytes, &buf, &cap, &fbuf, &fcap)
                                            : tensor_payload(j, i, dt, &data, &nbytes, &buf, &cap)) == 0 &&
            (rc = apply_norm_offset(j, i, &data, nbytes, &buf, &cap)) == 0)
            rc = iflow_shard_write_tensor(w, r->name, dt, r->n_dims, r->shape, data, nbytes);
        if (j->src[i] && j->dir && j->whole[i] == j->src[i]) /* a fused tensor's pages stay for its other rows */
            iflow_hfdir_release(j->dir, j->src[i]);
        if (rc == 0 && j->o->progress) {
            pr.done = i + 1, pr.bytes += nbytes, pr.item = r->name;
            j->o->progress(j->o->progress_user, &pr);
        }
    }
    free(buf);
    free(fbuf);
    return rc;
}

/* Synthetic models take their "source" type from config.json's torch_dtype. */
static int synthetic_default_type(job *j)
{
    const char *td = json_string_value(json_object_get(src_config(j), "torch_dtype"));
    int dt = td ? iflow_dtype_from_name(td) : -1;
    return iflow_dtype_is_float(dt) ? dt : IFLOW_DT_F16;
}

/* What a spec's keys are looked up in: config.json, with a directory's generation_config.json
 * under the key "generation_config" (unless config.json has that key); a GGUF's metadata. A new
 * reference (json_decref it). */
static json_t *spec_config(const job *j)
{
    const json_t *cfg = src_config(j), *gen = j->dir ? iflow_hfdir_generation_config(j->dir) : NULL;
    if (!gen || !json_is_object(cfg) || json_object_get(cfg, "generation_config"))
        return json_incref((json_t *)cfg);
    json_t *view = json_copy((json_t *)cfg);
    if (view)
        json_object_set(view, "generation_config", (json_t *)gen);
    return view;
}

/* Open the source (hfdir flags for a directory), pick its spec and resolve its config. */
static int open_resolved(job *j, const char *src, int hfdir_flags)
{
    int rc;
    if ((rc = open_source(j, src, hfdir_flags)) < 0 || (rc = pick_spec(j)) < 0)
        return rc;
    json_t *cfg = spec_config(j);
    if (!cfg)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    rc = iflow_spec_resolve(j->spec, cfg, &j->resolved);
    json_decref(cfg);
    if (rc < 0)
        return iflow_preperr(rc, "%s", src);
    return 0;
}

static int prepare(job *j, const char *src)
{
    int synth = j->o->flags & IFLOW_CONVERT_SYNTHETIC, rc;
    if ((rc = open_resolved(j, src, synth ? IFLOW_HFDIR_CONFIG_ONLY : 0)) < 0 || (rc = find_tokenizer(j)) < 0 ||
        (rc = find_chat_template(j)) < 0)
        return rc;
    if ((rc = iflow_hparams_from_json(&j->hp, j->resolved, src)) < 0 ||
        (rc = iflow_model_tensors(&j->hp, &j->reqs, &j->n_reqs)) < 0)
        return rc;
    if (synth) {
        j->src = calloc(j->n_reqs, sizeof *j->src);
        return j->src ? map_loras(j) : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    IFLOW_TRY(map_sources(j));
    return map_loras(j);
}

static void job_close(job *j)
{
    for (size_t a = 0; j->loras && a < j->o->n_loras; a++)
        iflow_lora_close(j->loras[a]);
    free(j->loras);
    free(j->merged);
    free(j->lora_used);
    for (size_t i = 0; j->xnames && i < j->n_reqs; i++)
        free(j->xnames[i]);
    free(j->xnames);
    free(j->xheads);
    free(j->src);
    free(j->whole);
    free(j->rows);
    free(j->xpose);
    free(j->row0);
    free(j->period);
    free(j->chain);
    free(j->vocab);
    free(j->chat);
    free(j->reqs);
    json_decref(j->resolved);
    iflow_spec_close(j->spec);
    iflow_hfdir_close(j->dir);
    iflow_ggufsrc_close(j->gguf);
}

int iflow_convert(const char *src, const char *out_path, const iflow_convert_opts *opts)
{
    iflow_convert_opts o = *opts;
    job j = {.o = &o};
    iflow_shard_writer *w = NULL;
    int rc = prepare(&j, src);
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
    job_close(&j);
    return rc;
}

int iflow_convert_resolve(const char *src, const iflow_convert_opts *opts, json_t **resolved)
{
    job j = {.o = opts};
    *resolved = NULL;
    int rc = open_resolved(&j, src, IFLOW_HFDIR_CONFIG_ONLY);
    if (rc == 0) {
        *resolved = j.resolved;
        j.resolved = NULL;
    }
    job_close(&j);
    return rc;
}

int iflow_convert_describe(const char *src, const iflow_convert_opts *opts, json_t **out)
{
    job j = {.o = opts};
    *out = NULL;
    int rc = prepare(&j, src);
    json_t *d = rc == 0 ? json_pack("{s:s, s:o, s:O, s:O, s:O, s:[]}", "path", src, "source", source_meta(&j), "spec",
                                    json_object_get(j.resolved, "spec"), "blocks", json_object_get(j.resolved, "blocks"),
                                    "hparams", json_object_get(j.resolved, "hparams"), "tensors")
                          : NULL;
    if (rc == 0 && !d)
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory describing '%s'", src);
    if (d && j.spec->path)
        json_object_set_new(d, "spec_file", json_string(j.spec->path));
    if (d && j.tok.n_sides)
        json_object_set_new(d, "tokenizer", iflow_tokrec_describe(&j.tok));
    for (size_t i = 0; d && i < j.n_reqs; i++) {
        const iflow_src_tensor *t = j.src[i];
        const iflow_tensor_req *r = &j.reqs[i];
        if (!t)
            continue;
        json_t *shape = json_array();
        for (int k = 0; k < r->n_dims; k++)
            json_array_append_new(shape, json_integer(r->shape[k]));
        json_array_append_new(json_object_get(d, "tensors"),
                              json_pack("{s:s, s:s, s:s, s:s, s:o}", "name", r->name, "source_name", t->name,
                                        "source_type", t->dtype_name ? t->dtype_name : "?", "type",
                                        iflow_dtype_name(tensor_target(&j, i)), "shape", shape));
    }
    *out = d;
    job_close(&j);
    return rc;
}
