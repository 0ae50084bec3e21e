/* dtype.c -- see dtype.h. */
#include "dtype.h"
#include "error.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/quant.h"

#include <limits.h>
#include <math.h>
#include <string.h>
#include <strings.h>

_Static_assert((int)IFLOW_DT_F32 == (int)IFK_F32 && (int)IFLOW_DT_F16 == (int)IFK_F16 && (int)IFLOW_DT_BF16 == (int)IFK_BF16,
               "dtype codes must match the kernels' weight codes");
#define SAME(a, b) ((int)(a) == (int)(b))
_Static_assert(SAME(IFLOW_DT_Q8_B32, IFK_Q8_B32) && SAME(IFLOW_DT_Q8_B64, IFK_Q8_B64) && SAME(IFLOW_DT_Q6_B64, IFK_Q6_B64) &&
               SAME(IFLOW_DT_Q5_B64, IFK_Q5_B64) && SAME(IFLOW_DT_Q4_B32, IFK_Q4_B32) && SAME(IFLOW_DT_Q4_B64, IFK_Q4_B64) &&
               SAME(IFLOW_DT_Q3H_B64, IFK_Q3H_B64) && SAME(IFLOW_DT_Q3_B32, IFK_Q3_B32) && SAME(IFLOW_DT_Q2_B32, IFK_Q2_B32) &&
               SAME(IFLOW_DT_QEND_, IFK_QTYPE_END_),
               "quantized dtype codes must match kernels/cpu/quant.h");
#undef SAME

static const char *const dt_names[IFLOW_DT_COUNT_] = {"f32", "f16", "bf16", "u8", "i32"};
static const size_t dt_size[IFLOW_DT_COUNT_] = {4, 2, 2, 1, 4};
/* The canonical spellings: the block size is named only where a bit width has two. */
static const char *const q_names[IFLOW_DT_QEND_ - IFLOW_DT_QFIRST] = {
    "q8_b32", "q8_b64", "q6", "q5", "q4_b32", "q4_b64", "q3h", "q3_b32", "q2",
};

const char *iflow_dtype_name(int dt)
{
    if (dt >= 0 && dt < IFLOW_DT_COUNT_)
        return dt_names[dt];
    return iflow_dtype_is_quant(dt) ? q_names[dt - IFLOW_DT_QFIRST] : NULL;
}

int iflow_dtype_from_name(const char *name)
{
    static const struct { const char *alias; int dt; } aliases[] = {
        {"float32", IFLOW_DT_F32}, {"float16", IFLOW_DT_F16},     {"bfloat16", IFLOW_DT_BF16},
        {"fp32", IFLOW_DT_F32},    {"fp16", IFLOW_DT_F16},        {"q8", IFLOW_DT_Q8_B32},
        {"q6_b64", IFLOW_DT_Q6_B64}, {"q5_b64", IFLOW_DT_Q5_B64}, {"q3h_b64", IFLOW_DT_Q3H_B64},
        {"q2_b32", IFLOW_DT_Q2_B32},
    };
    for (int dt = 0; dt < IFLOW_DT_QEND_; dt++)
        if (iflow_dtype_name(dt) && strcasecmp(name, iflow_dtype_name(dt)) == 0)
            return dt;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcasecmp(name, aliases[i].alias) == 0)
            return aliases[i].dt;
    return -1;
}

const char *iflow_dtype_ambiguity(const char *name)
{
    if (strcasecmp(name, "q4") == 0)
        return "q4_b32 or q4_b64";
    if (strcasecmp(name, "q3") == 0)
        return "q3h or q3_b32";
    return NULL;
}

int iflow_dtype_is_quant(int dt)
{
    return dt >= IFLOW_DT_QFIRST && dt < IFLOW_DT_QEND_;
}

size_t iflow_dtype_nbytes(int dt, uint64_t n)
{
    if (dt < 0 || dt >= IFLOW_DT_COUNT_)
        return 0;
    if (n > SIZE_MAX / dt_size[dt])
        return SIZE_MAX;
    return (size_t)n * dt_size[dt];
}

/* Rows of whole blocks: the product of the outer dimensions times the bytes of one row. */
static size_t quant_tensor_nbytes(int dt, int n_dims, const int64_t *shape)
{
    uint64_t rows = 1;
    int64_t K = shape[n_dims - 1];
    if (K < 0 || K > INT_MAX)
        return SIZE_MAX;
    for (int d = 0; d < n_dims - 1; d++) {
        if (shape[d] < 0 || (shape[d] && rows > UINT64_MAX / (uint64_t)shape[d]))
            return SIZE_MAX;
        rows *= (uint64_t)shape[d];
    }
    size_t row = ifk_qrow_bytes(dt, (int)K);
    if (row && rows > SIZE_MAX / row)
        return SIZE_MAX;
    return (size_t)rows * row;
}

size_t iflow_tensor_nbytes(int dt, int n_dims, const int64_t *shape)
{
    uint64_t n = 1;
    if (n_dims < 1)
        return 0;
    if (iflow_dtype_is_quant(dt))
        return quant_tensor_nbytes(dt, n_dims, shape);
    if (dt < 0 || dt >= IFLOW_DT_COUNT_)
        return 0;
    for (int d = 0; d < n_dims; d++) {
        if (shape[d] < 0 || (shape[d] && n > UINT64_MAX / (uint64_t)shape[d]))
            return SIZE_MAX;
        n *= (uint64_t)shape[d];
    }
    return iflow_dtype_nbytes(dt, n);
}

int iflow_dtype_is_float(int dt)
{
    return dt == IFLOW_DT_F32 || dt == IFLOW_DT_F16 || dt == IFLOW_DT_BF16;
}

float iflow_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t iflow_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff);
    uint32_t man = x & 0x7fffff;
    if (exp == 0xff) /* inf or nan (keep a quiet nan) */
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int32_t e = exp - 127 + 15;
    if (e >= 0x1f)
        return (uint16_t)(sign | 0x7c00);
    if (e <= 0) { /* subnormal or zero in f16 */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1)))
        half++; /* a carry into the exponent is the correct rounding, up to inf */
    return (uint16_t)half;
}

float iflow_bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t iflow_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) /* nan: keep it a quiet nan */
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

int iflow_dtype_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n)
{
    if (!iflow_dtype_is_float(dst_dt) || !iflow_dtype_is_float(src_dt))
        return iflow_seterr(IFLOW_EUNSUPPORTED, "cannot convert %s to %s",
                            iflow_dtype_name(src_dt) ? iflow_dtype_name(src_dt) : "?",
                            iflow_dtype_name(dst_dt) ? iflow_dtype_name(dst_dt) : "?");
    if (dst_dt == src_dt) {
        if (dst != src)
            memmove(dst, src, iflow_dtype_nbytes(src_dt, n));
        return 0;
    }
    /* Loads and stores go through memcpy: source data mapped from a file need not be aligned. */
    const unsigned char *sp = src;
    unsigned char *dp = dst;
    size_t ss = src_dt == IFLOW_DT_F32 ? 4 : 2, ds = dst_dt == IFLOW_DT_F32 ? 4 : 2;
    for (size_t i = 0; i < n; i++) {
        float v;
        uint16_t h;
        if (src_dt == IFLOW_DT_F32) {
            memcpy(&v, sp + i * ss, 4);
        } else {
            memcpy(&h, sp + i * ss, 2);
            v = src_dt == IFLOW_DT_F16 ? iflow_f16_to_f32(h) : iflow_bf16_to_f32(h);
        }
        if (dst_dt == IFLOW_DT_F32) {
            memcpy(dp + i * ds, &v, 4);
        } else {
            h = dst_dt == IFLOW_DT_F16 ? iflow_f32_to_f16(v) : iflow_f32_to_bf16(v);
            memcpy(dp + i * ds, &h, 2);
        }
    }
    return 0;
}
