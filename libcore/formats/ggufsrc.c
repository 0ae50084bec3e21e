/* ggufsrc.c -- a GGUF model file as a converter source. See ggufsrc.h. */
#include "ggufsrc.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/base/strmap.h"
#include "kernels/cpu/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ggml type codes (ggml.h) */
enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_BF16 = 30,
    GGML_MXFP4 = 39,
};

struct iflow_ggufsrc {
    iflow_gguf *g;
    json_t *config;
    iflow_src_tensor *t;   /* [n] in file order */
    uint32_t *ggml;        /* [n] ggml type of each */
    size_t n;
    iflow_strmap names;
};

/* ---- reading little-endian numbers from unaligned bytes ---- */

static float f16_at(const uint8_t *p) { return iflow_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static uint32_t u32_at(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* ---- ggml blocks ---------------------------------------------------------------------------
 * Each dequantizer decodes one block (x: its bytes) into y, exactly as ggml-quants.c does. */

static void deq_q4_0(float *y, const uint8_t *x) /* f16 d; u8 qs[16] */
{
    float d = f16_at(x);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((x[2 + j] & 15) - 8) * d;
        y[j + 16] = (float)((x[2 + j] >> 4) - 8) * d;
    }
}

static void deq_q4_1(float *y, const uint8_t *x) /* f16 d; f16 m; u8 qs[16] */
{
    float d = f16_at(x), m = f16_at(x + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(x[4 + j] & 15) * d + m;
        y[j + 16] = (float)(x[4 + j] >> 4) * d + m;
    }
}

/* The fifth bits of a Q5 block: element j's is bit j of the little-endian u32 qh. */
static int q5_high(uint32_t qh, int j) { return (int)((qh >> j) & 1) << 4; }

static void deq_q5_0(float *y, const uint8_t *x) /* f16 d; u8 qh[4]; u8 qs[16] */
{
    float d = f16_at(x);
    uint32_t qh = u32_at(x + 2);
    const uint8_t *qs = x + 6;
    for (int j = 0; j < 16; j++) { /* no "+ 0": ggml's -0 (q = 16, d < 0) stays -0 */
        y[j] = (float)(((qs[j] & 15) | q5_high(qh, j)) - 16) * d;
        y[j + 16] = (float)(((qs[j] >> 4) | q5_high(qh, j + 16)) - 16) * d;
    }
}

static void deq_q5_1(float *y, const uint8_t *x) /* f16 d; f16 m; u8 qh[4]; u8 qs[16] */
{
    float d = f16_at(x), m = f16_at(x + 2);
    uint32_t qh = u32_at(x + 4);
    const uint8_t *qs = x + 8;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 15) | q5_high(qh, j)) * d + m;
        y[j + 16] = (float)((qs[j] >> 4) | q5_high(qh, j + 16)) * d + m;
    }
}

static void deq_q8_0(float *y, const uint8_t *x) /* f16 d; i8 qs[32] */
{
    float d = f16_at(x);
    for (int j = 0; j < 32; j++)
        y[j] = (float)(int8_t)x[2 + j] * d;
}

static void deq_q2_k(float *y, const uint8_t *x) /* u8 scales[16]; u8 qs[64]; f16 d; f16 dmin */
{
    const uint8_t *sc = x, *q = x + 16;
    float d = f16_at(x + 80), min = f16_at(x + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128, q += 32)
        for (int j = 0, shift = 0; j < 4; j++, shift += 2)
            for (int half = 0; half < 2; half++) {
                int s = sc[is++];
                float dl = d * (float)(s & 15), ml = min * (float)(s >> 4);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
            }
}

static void deq_q3_k(float *y, const uint8_t *x) /* u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d */
{
    const uint8_t *hm = x, *q = x + 32;
    float d_all = f16_at(x + 108);
    uint32_t a[4], km1 = 0x03030303u, km2 = 0x0f0f0f0fu;
    for (int i = 0; i < 3; i++)
        a[i] = u32_at(x + 96 + 4 * i);
    uint32_t tmp = a[2];
    a[2] = ((a[0] >> 4) & km2) | (((tmp >> 4) & km1) << 4);
    a[3] = ((a[1] >> 4) & km2) | (((tmp >> 6) & km1) << 4);
    a[0] = (a[0] & km2) | (((tmp >> 0) & km1) << 4);
    a[1] = (a[1] & km2) | (((tmp >> 2) & km1) << 4);
    int8_t scales[16];
    for (int i = 0; i < 16; i++)
        scales[i] = (int8_t)(uint8_t)(a[i / 4] >> (8 * (i % 4)));
    int is = 0, m = 1;
    for (int n = 0; n < 256; n += 128, q += 32)
        for (int j = 0, shift = 0; j < 4; j++, shift += 2, m <<= 1)
            for (int half = 0; half < 2; half++) {
                float dl = d_all * (float)(scales[is++] - 32);
                for (int l = 0; l < 16; l++) {
                    int k = l + 16 * half;
                    *y++ = dl * (float)(((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
                }
            }
}

/* The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block. */
static void scale_min_k4(int j, const uint8_t *q, int *d, int *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K: f16 d; f16 dmin; u8 scales[12]; u8 qs[128]. Q5_K adds u8 qh[32] before qs. */
static void deq_q45_k(float *y, const uint8_t *x, int five)
{
    float d = f16_at(x), min = f16_at(x + 2);
    const uint8_t *scales = x + 4, *qh = x + 16, *ql = x + (five ? 48 : 16);
    int u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < 256; j += 64, ql += 32, is += 2, u1 <<= 2, u2 <<= 2) {
        int sc, m;
        scale_min_k4(is, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = min * (float)m;
        scale_min_k4(is + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = min * (float)m;
        for (int l = 0; l < 32; l++)
            *y++ = d1 * (float)((ql[l] & 15) + (five && (qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++)
            *y++ = d2 * (float)((ql[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0)) - m2;
    }
}

static void deq_q6_k(float *y, const uint8_t *x) /* u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d */
{
    const uint8_t *ql = x, *qh = x + 128;
    const int8_t *sc = (const int8_t *)(x + 192);
    float d = f16_at(x + 208);
    for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
}

/* MXFP4 (gpt-oss's experts): u8 e (E8M0); u8 qs[16]: element j the low nibble of qs[j], j + 16
 * the high one, each an E2M1 value (ggml's kvalues_mxfp4, twice the value) times 2^(e - 128). */
static void deq_mxfp4(float *y, const uint8_t *x)
{
    static const int8_t kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    const float d = ldexpf(1.0f, (int)x[0] - 128);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)kv[x[1 + j] & 15] * d;
        y[j + 16] = (float)kv[x[1 + j] >> 4] * d;
    }
}

/* Decode n values (a multiple of the type's block) of ggml type `type` at x into y. 0, or -1 for
 * a type this file cannot decode. */
static int dequantize(float *y, const uint8_t *x, uint32_t type, uint64_t n)
{
    uint64_t bs = type == GGML_F32 || type == GGML_F16 || type == GGML_BF16 ? 1 : type >= GGML_Q2_K && type <= GGML_Q6_K ? 256 : 32;
    uint64_t bb = iflow_ggml_nbytes(type, bs);
    for (uint64_t i = 0; i < n; i += bs, x += bb, y += bs)
        switch (type) {
        case GGML_F32: memcpy(y, x, 4); break;
        case GGML_F16: *y = f16_at(x); break;
        case GGML_BF16: *y = iflow_bf16_to_f32((uint16_t)(x[0] | x[1] << 8)); break;
        case GGML_Q4_0: deq_q4_0(y, x); break;
        case GGML_Q4_1: deq_q4_1(y, x); break;
        case GGML_Q5_0: deq_q5_0(y, x); break;
        case GGML_Q5_1: deq_q5_1(y, x); break;
        case GGML_Q8_0: deq_q8_0(y, x); break;
        case GGML_Q2_K: deq_q2_k(y, x); break;
        case GGML_Q3_K: deq_q3_k(y, x); break;
        case GGML_Q4_K: deq_q45_k(y, x, 0); break;
        case GGML_Q5_K: deq_q45_k(y, x, 1); break;
        case GGML_Q6_K: deq_q6_k(y, x); break;
        case GGML_MXFP4: deq_mxfp4(y, x); break;
        default: return -1;
        }
    return 0;
}

static int can_dequantize(uint32_t type)
{
    float y[256];
    static const uint8_t zero[512];
    return (type <= GGML_BF16 || type == GGML_MXFP4) && iflow_ggml_nbytes(type, 256) &&
           iflow_ggml_nbytes(type, 256) <= sizeof zero &&
           dequantize(y, zero, type, 256) == 0;
}

/* ---- exact re-encoding into iflow blocks ---- */

/* -scale * d as an F16 bit pattern when it is exact and finite (*ok = 0 otherwise). */
static uint16_t exact_min(float d, float scale, int *ok)
{
    float m = -scale * d;
    uint16_t h = iflow_f32_to_f16(m);
    if (!isfinite(d) || !isfinite(m) || iflow_f16_to_f32(h) != m)
        *ok = 0;
    return h;
}

/* Q8_0 (34 bytes) -> Q8_B32 (36): delta = d, min = -128 d, level q + 128. */
static int q8_0_to_q8_b32(uint8_t *dst, const uint8_t *x, uint64_t n_blocks)
{
    int ok = 1;
    for (uint64_t b = 0; b < n_blocks && ok; b++, x += 34, dst += 36) {
        uint16_t m = exact_min(f16_at(x), 128.0f, &ok);
        dst[0] = x[0], dst[1] = x[1], dst[2] = (uint8_t)m, dst[3] = (uint8_t)(m >> 8);
        for (int j = 0; j < 32; j++)
            dst[4 + j] = (uint8_t)((int8_t)x[2 + j] + 128);
    }
    return ok;
}

/* Q4_0 (18 bytes) -> Q4_B32 (20): delta = d, min = -8 d, the same nibbles. */
static int q4_0_to_q4_b32(uint8_t *dst, const uint8_t *x, uint64_t n_blocks)
{
    int ok = 1;
    for (uint64_t b = 0; b < n_blocks && ok; b++, x += 18, dst += 20) {
        uint16_t m = exact_min(f16_at(x), 8.0f, &ok);
        dst[0] = x[0], dst[1] = x[1], dst[2] = (uint8_t)m, dst[3] = (uint8_t)(m >> 8);
        memcpy(dst + 4, x + 2, 16);
    }
    return ok;
}

/* MXFP4 (17 bytes) -> Q8_B32 (36): delta = 2^(e - 128), min = -12 delta, level = code + 12 (ggml's
 * E2M1 codes are twice the value: -12 .. 12); element j and j + 16 from byte j's two nibbles. */
static int mxfp4_to_q8_b32(uint8_t *dst, const uint8_t *x, uint64_t n_blocks)
{
    static const int8_t kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    int ok = 1;
    for (uint64_t b = 0; b < n_blocks && ok; b++, x += 17, dst += 36) {
        const float d = ldexpf(1.0f, (int)x[0] - 128);
        const uint16_t h = iflow_f32_to_f16(d), m = exact_min(d, 12.0f, &ok);
        ok &= iflow_f16_to_f32(h) == d;
        dst[0] = (uint8_t)h, dst[1] = (uint8_t)(h >> 8), dst[2] = (uint8_t)m, dst[3] = (uint8_t)(m >> 8);
        for (int j = 0; j < 16; j++) {
            dst[4 + j] = (uint8_t)(kv[x[1 + j] & 15] + 12);
            dst[4 + j + 16] = (uint8_t)(kv[x[1 + j] >> 4] + 12);
        }
    }
    return ok;
}

/* 1 if every block of a Q8_0 / Q4_0 tensor re-encodes exactly (its -128 d / -8 d fits F16), or
 * of an MXFP4 one (its 2^(e - 128) and -12 times it fit F16). */
static int reencodes_exactly(uint32_t type, const uint8_t *x, uint64_t n_blocks)
{
    int ok = 1;
    if (type == GGML_MXFP4) {
        uint8_t tmp[36];
        for (uint64_t b = 0; b < n_blocks && ok; b++)
            ok = mxfp4_to_q8_b32(tmp, x + b * 17, 1);
        return ok;
    }
    size_t bb = type == GGML_Q8_0 ? 34 : 18;
    float scale = type == GGML_Q8_0 ? 128.0f : 8.0f;
    for (uint64_t b = 0; b < n_blocks && ok; b++)
        exact_min(f16_at(x + b * bb), scale, &ok);
    return ok;
}

/* The iflow type a tensor converts to with no second rounding; -1 if not convertible. */
static int native_dtype(uint32_t type, const uint8_t *data, uint64_t n)
{
    switch (type) {
    case GGML_F32: return IFLOW_DT_F32;
    case GGML_F16: return IFLOW_DT_F16;
    case GGML_BF16: return IFLOW_DT_BF16;
    case GGML_Q4_1: return IFLOW_DT_Q4_B32;
    case GGML_Q4_0: return reencodes_exactly(type, data, n / 32) ? IFLOW_DT_Q4_B32 : IFLOW_DT_F32;
    case GGML_Q8_0: return reencodes_exactly(type, data, n / 32) ? IFLOW_DT_Q8_B32 : IFLOW_DT_F32;
    case GGML_MXFP4: return reencodes_exactly(type, data, n / 32) ? IFLOW_DT_Q8_B32 : IFLOW_DT_F32;
    default: return can_dequantize(type) ? IFLOW_DT_F32 : -1;
    }
}

/* ---- the metadata as a config ---- */

/* Set value v (stolen) at dotted key k under obj, creating objects on the way; a collision
 * with an existing non-object (or an existing key) drops v. */
static void set_dotted(json_t *obj, const char *k, json_t *v)
{
    char part[256];
    for (const char *dot; (dot = strchr(k, '.')) != NULL; k = dot + 1) {
        size_t n = (size_t)(dot - k);
        json_t *sub;
        if (n >= sizeof part)
            return json_decref(v);
        memcpy(part, k, n);
        part[n] = 0;
        if (!(sub = json_object_get(obj, part)) && json_object_set_new(obj, part, sub = json_object()) < 0)
            return json_decref(v);
        if (!json_is_object(sub))
            return json_decref(v);
        obj = sub;
    }
    if (json_object_get(obj, k))
        json_decref(v);
    else
        json_object_set_new(obj, k, v); /* drops v on failure (a key that is not UTF-8) */
}

static json_t *kv_value(const iflow_gguf *g, int64_t i)
{
    const char *key = iflow_gguf_key(g, i);
    int type = iflow_gguf_kv_type(g, i);
    const char *s;
    uint64_t u;
    int32_t i32;
    float f;
    int b;
    const void *data;
    size_t n;
    int elem;
    /* a short list of booleans (a per-layer pattern: OLMo 3's sliding_window_pattern) reads as a
     * list; any other array as {"count": N} (the vocabulary: tokenizer.ggml.tokens.count) */
    if (type == IFLOW_GGUF_ARR && iflow_gguf_arr_type(g, i) == IFLOW_GGUF_BOOL && iflow_gguf_arr_count(g, i) <= 4096 &&
        iflow_gguf_get_arr(g, key, &elem, &data, &n) == 0) {
        json_t *list = json_array();
        for (size_t k = 0; list && k < n; k++)
            json_array_append_new(list, json_boolean(((const uint8_t *)data)[k] != 0));
        return list;
    }
    if (type == IFLOW_GGUF_ARR)
        return json_pack("{s:I}", "count", (json_int_t)iflow_gguf_arr_count(g, i));
    if (type == IFLOW_GGUF_STR && iflow_gguf_get_str(g, key, &s, NULL) == 0)
        return json_string(s); /* NULL for invalid UTF-8: left out */
    if (type == IFLOW_GGUF_BOOL && iflow_gguf_get_bool(g, key, &b) == 0)
        return json_boolean(b);
    if ((type == IFLOW_GGUF_F32 || type == IFLOW_GGUF_F64) && iflow_gguf_get_f32(g, key, &f) == 0)
        return isfinite(f) ? json_real(f) : NULL;
    if (iflow_gguf_get_i32(g, key, &i32) == 0)
        return json_integer(i32);
    if (iflow_gguf_get_u64(g, key, &u) == 0 && u <= (uint64_t)INT64_MAX)
        return json_integer((json_int_t)u);
    return NULL;
}

static int build_config(iflow_ggufsrc *s)
{
    json_t *tensors = json_object();
    if (!(s->config = json_object()) || !tensors)
        return json_decref(tensors), iflow_seterr(IFLOW_ENOMEM, "out of memory reading '%s'", iflow_gguf_name(s->g));
    for (int64_t i = 0; i < iflow_gguf_n_kv(s->g); i++) {
        json_t *v = kv_value(s->g, i);
        const char *key = iflow_gguf_key(s->g, i);
        if (v && strncmp(key, "tensors.", 8) != 0 && strcmp(key, "tensors") != 0)
            set_dotted(s->config, key, v);
        else
            json_decref(v);
    }
    for (size_t i = 0; i < s->n; i++)
        set_dotted(tensors, s->t[i].name, json_true());
    json_object_set_new(s->config, "tensors", tensors);
    return 0;
}

/* ---- tensors ---- */

static int list_tensors(iflow_ggufsrc *s)
{
    s->n = (size_t)iflow_gguf_n_tensors(s->g);
    s->t = calloc(s->n ? s->n : 1, sizeof *s->t);
    s->ggml = calloc(s->n ? s->n : 1, sizeof *s->ggml);
    if (!s->t || !s->ggml)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory listing %zu tensors of '%s'", s->n, iflow_gguf_name(s->g));
    for (size_t i = 0; i < s->n; i++) {
        const iflow_gguf_tensor *gt = iflow_gguf_tensor_at(s->g, (int64_t)i);
        iflow_src_tensor *t = &s->t[i];
        uint64_t n = 1;
        t->name = gt->name;
        t->n_dims = (int)gt->n_dims;
        for (int d = 0; d < t->n_dims; d++) {
            t->shape[d] = (int64_t)gt->ne[t->n_dims - 1 - d]; /* checked <= INT64_MAX by gguf.c */
            n *= gt->ne[d];
        }
        for (int d = t->n_dims; d < IFLOW_SRC_MAX_DIMS; d++)
            t->shape[d] = 1;
        t->data = iflow_gguf_tensor_data(s->g, (int64_t)i);
        t->nbytes = (size_t)gt->nbytes;
        t->file_offset = iflow_gguf_data_offset(s->g) + gt->offset;
        t->dtype_name = iflow_ggml_type_name(gt->type);
        s->ggml[i] = gt->type;
        t->dtype = native_dtype(gt->type, t->data, n);
        if (iflow_strmap_put(&s->names, t->name, strlen(t->name), (int32_t)i) < 0)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory indexing '%s'", iflow_gguf_name(s->g));
    }
    return 0;
}

/* ---- open / close ---- */

int iflow_is_gguf_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    int yes = f && fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
    if (f)
        fclose(f);
    return yes;
}

int iflow_ggufsrc_from(iflow_ggufsrc **out, iflow_gguf *g)
{
    *out = NULL;
    iflow_ggufsrc *s = calloc(1, sizeof *s);
    if (!s)
        return iflow_gguf_close(g), iflow_seterr(IFLOW_ENOMEM, "out of memory opening '%s'", iflow_gguf_name(g));
    s->g = g;
    int rc = list_tensors(s);
    if (rc == 0)
        rc = build_config(s);
    if (rc < 0)
        return iflow_ggufsrc_close(s), rc;
    *out = s;
    return 0;
}

int iflow_ggufsrc_open(iflow_ggufsrc **out, const char *path)
{
    iflow_gguf *g;
    *out = NULL;
    int rc = iflow_gguf_open(&g, path);
    return rc < 0 ? rc : iflow_ggufsrc_from(out, g);
}

void iflow_ggufsrc_close(iflow_ggufsrc *s)
{
    if (!s)
        return;
    json_decref(s->config);
    free(s->t);
    free(s->ggml);
    iflow_strmap_free(&s->names);
    iflow_gguf_close(s->g);
    free(s);
}

/* ---- queries ---- */

const char *iflow_ggufsrc_path(const iflow_ggufsrc *s) { return iflow_gguf_name(s->g); }
const json_t *iflow_ggufsrc_config(const iflow_ggufsrc *s) { return s->config; }
size_t iflow_ggufsrc_n_tensors(const iflow_ggufsrc *s) { return s->n; }

const char *iflow_ggufsrc_architecture(const iflow_ggufsrc *s)
{
    const char *a;
    return iflow_gguf_get_str(s->g, "general.architecture", &a, NULL) == 0 ? a : NULL;
}

const iflow_src_tensor *iflow_ggufsrc_tensor(const iflow_ggufsrc *s, size_t i)
{
    return i < s->n ? &s->t[i] : NULL;
}

const iflow_src_tensor *iflow_ggufsrc_find(const iflow_ggufsrc *s, const char *name)
{
    int32_t i = iflow_strmap_get(&s->names, name, strlen(name));
    return i >= 0 ? &s->t[i] : NULL;
}

int iflow_ggufsrc_tokenizer(const iflow_ggufsrc *s, void **blob, size_t *len)
{
    size_t kv_len;
    const void *kv = iflow_gguf_kv_bytes(s->g, &kv_len);
    uint64_t n_kv = (uint64_t)iflow_gguf_n_kv(s->g), n_tensors = 0;
    uint32_t version = iflow_gguf_version(s->g);
    *blob = NULL;
    if (iflow_gguf_find_key(s->g, "tokenizer.ggml.model") < 0)
        return iflow_seterr(IFLOW_ENOTFOUND, "no tokenizer in '%s' (no tokenizer.ggml.model key)", iflow_gguf_name(s->g));
    uint8_t *b = malloc(24 + kv_len);
    if (!b)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory copying the tokenizer of '%s'", iflow_gguf_name(s->g));
    memcpy(b, "GGUF", 4); /* the numbers little-endian, as the file had them (gguf.c refuses big-endian) */
    for (int i = 0; i < 4; i++)
        b[4 + i] = (uint8_t)(version >> (8 * i));
    for (int i = 0; i < 8; i++)
        b[8 + i] = (uint8_t)(n_tensors >> (8 * i)), b[16 + i] = (uint8_t)(n_kv >> (8 * i));
    memcpy(b + 24, kv, kv_len);
    *blob = b;
    *len = 24 + kv_len;
    return 0;
}

int iflow_ggufsrc_chat_template(const iflow_ggufsrc *s, const char **text, size_t *len)
{
    return iflow_gguf_get_str(s->g, IFLOW_GGUF_CHAT_TEMPLATE, text, len);
}

int iflow_ggufsrc_payload(const iflow_ggufsrc *s, const iflow_src_tensor *t, int dt, const void **data, void *buf)
{
    /* t is one of ours, or a view of rows of one (a spec's NAME[A:B]: same name and type, its
     * data and shape a whole number of rows into ours) */
    int32_t i = iflow_strmap_get(&s->names, t->name, strlen(t->name));
    if (i < 0)
        return iflow_seterr(IFLOW_ENOTFOUND, "no tensor '%s' in '%s'", t->name, iflow_gguf_name(s->g));
    uint32_t type = s->ggml[i];
    uint64_t n = 1, row = (uint64_t)t->shape[t->n_dims - 1];
    for (int d = 0; d < t->n_dims; d++)
        n *= (uint64_t)t->shape[d];
    const uint8_t *x = t->data;
    *data = buf;
    if (n == 0) /* an empty tensor (a zero dimension): nothing to convert, whatever its row */
        return 0;
    if (dt == t->dtype && ((dt == IFLOW_DT_F32 && type == GGML_F32) || (dt == IFLOW_DT_F16 && type == GGML_F16) ||
                           (dt == IFLOW_DT_BF16 && type == GGML_BF16) || (dt == IFLOW_DT_Q4_B32 && type == GGML_Q4_1)))
        return *data = t->data, 0;
    /* (a block that no longer re-encodes exactly means the file changed since it was opened) */
    if (dt == t->dtype && dt == IFLOW_DT_Q8_B32 && type == GGML_Q8_0)
        return q8_0_to_q8_b32(buf, x, n / 32) ? 0 : iflow_seterr(IFLOW_EIO, "tensor '%s' of '%s' changed while converting", t->name, iflow_gguf_name(s->g));
    if (dt == t->dtype && dt == IFLOW_DT_Q8_B32 && type == GGML_MXFP4)
        return mxfp4_to_q8_b32(buf, x, n / 32) ? 0 : iflow_seterr(IFLOW_EIO, "tensor '%s' of '%s' changed while converting", t->name, iflow_gguf_name(s->g));
    if (dt == t->dtype && dt == IFLOW_DT_Q4_B32 && type == GGML_Q4_0)
        return q4_0_to_q4_b32(buf, x, n / 32) ? 0 : iflow_seterr(IFLOW_EIO, "tensor '%s' of '%s' changed while converting", t->name, iflow_gguf_name(s->g));
    if (t->dtype < 0 || !iflow_dtype_is_float(dt))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "cannot convert tensor '%s' of type %s in '%s' to %s", t->name,
                            t->dtype_name ? t->dtype_name : "?", iflow_gguf_name(s->g),
                            iflow_dtype_name(dt) ? iflow_dtype_name(dt) : "?");
    /* dequantize row by row: F32 goes straight into buf, other float types through one row */
    float *tmp = dt == IFLOW_DT_F32 ? NULL : malloc(row * sizeof *tmp);
    if (dt != IFLOW_DT_F32 && !tmp)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory converting '%s'", t->name);
    uint64_t row_bytes = iflow_ggml_nbytes(type, row);
    size_t esz = iflow_dtype_nbytes(dt, 1);
    int rc = 0;
    for (uint64_t r = 0; row && r < n / row && rc == 0; r++) {
        float *y = tmp ? tmp : (float *)buf + r * row;
        dequantize(y, x + r * row_bytes, type, row);
        if (tmp)
            rc = iflow_dtype_convert((uint8_t *)buf + r * row * esz, dt, tmp, IFLOW_DT_F32, row);
    }
    free(tmp);
    return rc;
}
