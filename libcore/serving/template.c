/*
 * template.c -- chat templates (template.h): the arena, text buffers, values (truth, equality,
 * order), printing them as Python's str()/repr() and as json.dumps(), the variables from JSON,
 * and the API. The parts are listed in template_impl.h.
 */
#include "template_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "libcore/base/error.h"
#include "libcore/base/quote.h"

#define MAX_VALUE_DEPTH 512 /* nesting of values printed, compared or written as JSON */

/* ---- arena ---------------------------------------------------------------------------------- */

#define CHUNK_BYTES ((size_t)64 << 10)

struct tpl_chunk {
    tpl_chunk *next;
    size_t used, cap, pad_; /* 32 bytes: what follows is 16-byte aligned */
};
_Static_assert(sizeof(tpl_chunk) % 16 == 0, "arena chunk header must keep 16-byte alignment");

void *tpl_arena_alloc(tpl_arena *a, size_t n)
{
    if (n > a->limit) {
        a->over = 1;
        return NULL;
    }
    n = n ? (n + 15) & ~(size_t)15 : 16;
    tpl_chunk *c = a->head;
    if (c && c->cap - c->used >= n) {
        void *p = (char *)(c + 1) + c->used;
        c->used += n;
        return p;
    }
    size_t cap = n > CHUNK_BYTES / 4 ? n : CHUNK_BYTES;
    if (a->total + sizeof *c + cap > a->limit) {
        a->over = 1;
        return NULL;
    }
    tpl_chunk *nc = malloc(sizeof *nc + cap);
    if (!nc) {
        a->over = 0;
        return NULL;
    }
    a->total += sizeof *nc + cap;
    nc->cap = cap;
    nc->used = n;
    if (cap == n && c) { /* a big one: keep filling the current chunk */
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        a->head = nc;
    }
    return nc + 1;
}

void tpl_arena_free(tpl_arena *a)
{
    while (a->head) {
        tpl_chunk *next = a->head->next;
        free(a->head);
        a->head = next;
    }
    a->total = 0;
}

/* ---- failures, allocation, work ------------------------------------------------------------- */

void tpl_where(const iflow_template *t, size_t pos, int *line, int *col)
{
    int l = 1;
    size_t start = 0;
    for (size_t i = 0; i < pos && i < t->len; i++)
        if (t->src[i] == '\n') {
            l++;
            start = i + 1;
        }
    *line = l;
    *col = (int)(pos - start) + 1;
}

int tpl_fail(tpl_render *r, int code, const char *fmt, ...)
{
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->rc = code;
    if (!r->at)
        return iflow_seterr(code, "%s: %s", r->t->name, msg);
    int line, col;
    tpl_where(r->t, r->at->pos, &line, &col);
    return iflow_seterr(code, "%s line %d, column %d: %s", r->t->name, line, col, msg);
}

void *tpl_alloc(tpl_render *r, size_t n)
{
    r->a.limit = IFLOW_TEMPLATE_MAX_MEMORY > r->bufmem ? IFLOW_TEMPLATE_MAX_MEMORY - r->bufmem : 0;
    void *p = tpl_arena_alloc(&r->a, n);
    if (!p) {
        if (r->a.over)
            tpl_fail(r, IFLOW_ERANGE, "rendering needs more than %zu MiB of memory", IFLOW_TEMPLATE_MAX_MEMORY >> 20);
        else
            tpl_fail(r, IFLOW_ENOMEM, "out of memory");
    }
    return p;
}

int tpl_spend(tpl_render *r, size_t steps)
{
    if (steps > (size_t)IFLOW_TEMPLATE_MAX_STEPS)
        steps = (size_t)IFLOW_TEMPLATE_MAX_STEPS + 1;
    r->steps += (long)steps;
    if (r->steps > IFLOW_TEMPLATE_MAX_STEPS)
        return tpl_fail(r, IFLOW_ERANGE, "rendering takes more than %ld steps (a loop too long?)",
                        (long)IFLOW_TEMPLATE_MAX_STEPS);
    return 0;
}

int tpl_type_error(tpl_render *r, const char *what, tval a, tval b)
{
    if (a.t == TV_UNDEF || b.t == TV_UNDEF) {
        tval u = a.t == TV_UNDEF ? a : b;
        return tpl_fail(r, IFLOW_EINVAL, "'%s' is undefined", iflow_quoten(u.s.p, u.s.n));
    }
    return tpl_fail(r, IFLOW_EINVAL, "unsupported operand types for %s: '%s' and '%s'", what, tpl_type_name(a),
                    tpl_type_name(b));
}

/* ---- text buffers --------------------------------------------------------------------------- */

int tpl_buf_put(tpl_render *r, tpl_buf *b, const char *p, size_t n)
{
    if (n == 0)
        return 0;
    if (n > IFLOW_TEMPLATE_MAX_OUTPUT - b->n)
        return tpl_fail(r, IFLOW_ERANGE, "%s would be longer than %zu MiB", b == r->main ? "the output" : "a text",
                        IFLOW_TEMPLATE_MAX_OUTPUT >> 20);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        if (r->a.total + r->bufmem + (cap - b->cap) > IFLOW_TEMPLATE_MAX_MEMORY)
            return tpl_fail(r, IFLOW_ERANGE, "rendering needs more than %zu MiB of memory",
                            IFLOW_TEMPLATE_MAX_MEMORY >> 20);
        char *q = realloc(b->p, cap);
        if (!q)
            return tpl_fail(r, IFLOW_ENOMEM, "out of memory");
        r->bufmem += cap - b->cap;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    return tpl_spend(r, n / 64);
}

int tpl_buf_putc(tpl_render *r, tpl_buf *b, char c)
{
    return tpl_buf_put(r, b, &c, 1);
}

void tpl_buf_free(tpl_render *r, tpl_buf *b)
{
    r->bufmem -= b->cap;
    free(b->p);
    *b = (tpl_buf){0};
}

int tpl_buf_take(tpl_render *r, tpl_buf *b, tval *out)
{
    int rc = tpl_str_copy(r, b->p, b->n, out);
    tpl_buf_free(r, b);
    return rc;
}

/* ---- making values -------------------------------------------------------------------------- */

int tpl_str_copy(tpl_render *r, const char *p, size_t n, tval *out)
{
    char *q = tpl_alloc(r, n ? n : 1);
    if (!q)
        return r->rc;
    if (n)
        memcpy(q, p, n);
    *out = tv_str(q, n);
    return tpl_spend(r, n / 64);
}

tv_list *tpl_list_new(tpl_render *r, size_t cap)
{
    if (cap > IFLOW_TEMPLATE_MAX_MEMORY / sizeof(tval)) {
        tpl_fail(r, IFLOW_ERANGE, "rendering needs more than %zu MiB of memory", IFLOW_TEMPLATE_MAX_MEMORY >> 20);
        return NULL;
    }
    tv_list *l = tpl_alloc(r, sizeof *l);
    if (!l)
        return NULL;
    *l = (tv_list){.cap = cap};
    if (cap && !(l->v = tpl_alloc(r, cap * sizeof *l->v)))
        return NULL;
    return l;
}

int tpl_list_push(tpl_render *r, tv_list *l, tval v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4;
        if (cap > IFLOW_TEMPLATE_MAX_MEMORY / sizeof(tval))
            return tpl_fail(r, IFLOW_ERANGE, "rendering needs more than %zu MiB of memory",
                            IFLOW_TEMPLATE_MAX_MEMORY >> 20);
        tval *nv = tpl_alloc(r, cap * sizeof *nv);
        if (!nv)
            return r->rc;
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return tpl_spend(r, 1);
}

/* range(start, stop, step): the list l of its items, marked as a range */
int tpl_range_view(tpl_render *r, tv_list *l, const long long *params, tval *out)
{
    long long *p = tpl_alloc(r, 3 * sizeof *p);
    if (!p)
        return r->rc;
    memcpy(p, params, 3 * sizeof *p);
    l->range = p;
    l->view = "range";
    *out = tv_seq(l, 0);
    return 0;
}

tv_dict *tpl_dict_new(tpl_render *r, size_t cap)
{
    tv_dict *d = tpl_alloc(r, sizeof *d);
    if (!d)
        return NULL;
    *d = (tv_dict){0};
    (void)cap;
    return d;
}

tval *tpl_dict_find_str(tpl_render *r, const tv_dict *d, const char *p, size_t n)
{
    tpl_spend(r, d->n / 16); /* an overrun shows at the next step */
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == TV_STR && d->k[i].s.n == n && memcmp(d->k[i].s.p, p, n) == 0)
            return &d->v[i];
    return NULL;
}

int tpl_dict_find(tpl_render *r, const tv_dict *d, tval k, tval **slot)
{
    *slot = NULL;
    if (k.t == TV_STR) {
        *slot = tpl_dict_find_str(r, d, k.s.p, k.s.n);
        return 0;
    }
    IFLOW_TRY(tpl_spend(r, d->n / 16));
    for (size_t i = 0; i < d->n; i++) {
        int eq = tpl_equal(r, d->k[i], k);
        if (eq < 0)
            return eq;
        if (eq) {
            *slot = &d->v[i];
            return 0;
        }
    }
    return 0;
}

/* A key known to be new, at the end. */
static int dict_append(tpl_render *r, tv_dict *d, tval k, tval v)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 4;
        if (cap > IFLOW_TEMPLATE_MAX_MEMORY / sizeof(tval))
            return tpl_fail(r, IFLOW_ERANGE, "rendering needs more than %zu MiB of memory",
                            IFLOW_TEMPLATE_MAX_MEMORY >> 20);
        tval *nk = tpl_alloc(r, cap * sizeof *nk), *nv = nk ? tpl_alloc(r, cap * sizeof *nv) : NULL;
        if (!nv)
            return r->rc;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return tpl_spend(r, 1);
}

int tpl_dict_set(tpl_render *r, tv_dict *d, tval k, tval v)
{
    tval *slot;
    IFLOW_TRY(tpl_hashable(r, k));
    IFLOW_TRY(tpl_dict_find(r, d, k, &slot));
    if (slot) {
        *slot = v;
        return 0;
    }
    return dict_append(r, d, k, v);
}

/* ---- what values are ------------------------------------------------------------------------ */

const char *tpl_type_name(tval v)
{
    if (v.t == TV_LIST && v.l->view)
        return v.l->view;
    static const char *const names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "tuple",
                                        "dict", "Namespace", "LoopContext", "Macro", "function",
                                        "builtin_function_or_method", "argument"};
    return v.t < sizeof names / sizeof *names ? names[v.t] : "?";
}

int tpl_truthy(tval v)
{
    switch (v.t) {
    case TV_UNDEF: case TV_NONE: case TV_NOARG: return 0;
    case TV_BOOL: return v.b;
    case TV_INT: return v.i != 0;
    case TV_FLOAT: return v.f != 0;
    case TV_STR: return v.s.n > 0;
    case TV_LIST: case TV_TUPLE: return v.l->n > 0;
    case TV_DICT: return v.d->n > 0;
    default: return 1;
    }
}

static int is_num(tval v) { return v.t == TV_BOOL || v.t == TV_INT || v.t == TV_FLOAT; }
static long long as_int(tval v) { return v.t == TV_BOOL ? v.b : v.i; }

/* An int and a float are equal when the float is exactly that integer (not after rounding). */
static int int_float_eq(long long i, double f)
{
    if (f != floor(f) || !(f >= -9223372036854775808.0 && f < 9223372036854775808.0))
        return 0;
    return (long long)f == i;
}

/* -1, 0 or 1 as Python orders an int and a float (exactly, not through a rounded double) */
static int int_float_cmp(long long i, double f)
{
    if (f >= 9223372036854775808.0)
        return -1;
    if (f < -9223372036854775808.0)
        return 1;
    double fl = floor(f);
    long long k = (long long)fl;
    if (i != k)
        return i < k ? -1 : 1;
    return f > fl ? -1 : 0;
}

static int num_cmp(tval a, tval b)
{
    if (a.t == TV_FLOAT && b.t == TV_FLOAT)
        return (a.f > b.f) - (a.f < b.f);
    if (a.t == TV_FLOAT)
        return isnan(a.f) ? 0 : -int_float_cmp(as_int(b), a.f);
    if (b.t == TV_FLOAT)
        return isnan(b.f) ? 0 : int_float_cmp(as_int(a), b.f);
    long long x = as_int(a), y = as_int(b);
    return (x > y) - (x < y);
}

static int equal_at(tpl_render *r, tval a, tval b, int depth);

static int seq_equal(tpl_render *r, const tv_list *x, const tv_list *y, int depth)
{
    if (x->n != y->n)
        return 0;
    for (size_t i = 0; i < x->n; i++) {
        int eq = equal_at(r, x->v[i], y->v[i], depth + 1);
        if (eq <= 0)
            return eq;
    }
    return 1;
}

static int dict_equal(tpl_render *r, const tv_dict *x, const tv_dict *y, int depth)
{
    if (x->n != y->n)
        return 0;
    for (size_t i = 0; i < x->n; i++) {
        tval *other;
        IFLOW_TRY(tpl_dict_find(r, y, x->k[i], &other));
        if (!other)
            return 0;
        int eq = equal_at(r, x->v[i], *other, depth + 1);
        if (eq <= 0)
            return eq;
    }
    return 1;
}

static int equal_at(tpl_render *r, tval a, tval b, int depth)
{
    if (depth > MAX_VALUE_DEPTH)
        return tpl_fail(r, IFLOW_ERANGE, "values nested more than %d deep", MAX_VALUE_DEPTH);
    if (is_num(a) && is_num(b)) {
        if (a.t == TV_FLOAT && b.t == TV_FLOAT)
            return a.f == b.f;
        if (a.t == TV_FLOAT || b.t == TV_FLOAT)
            return a.t == TV_FLOAT ? int_float_eq(as_int(b), a.f) : int_float_eq(as_int(a), b.f);
        return as_int(a) == as_int(b);
    }
    if (a.t != b.t)
        return 0;
    switch (a.t) {
    case TV_UNDEF: case TV_NONE: return 1;
    case TV_STR:
        IFLOW_TRY(tpl_spend(r, a.s.n / 64));
        return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
    case TV_LIST: case TV_TUPLE:
        IFLOW_TRY(tpl_spend(r, a.l->n / 16));
        return a.l == b.l ? 1 : seq_equal(r, a.l, b.l, depth);
    case TV_DICT: return a.d == b.d ? 1 : dict_equal(r, a.d, b.d, depth);
    case TV_FUNC: return a.fn == b.fn;
    default: return a.m == b.m; /* the same object */
    }
}

int tpl_equal(tpl_render *r, tval a, tval b)
{
    return equal_at(r, a, b, 0);
}

static int compare_at(tpl_render *r, const char *op, tval a, tval b, int *sign, int depth)
{
    if (depth > MAX_VALUE_DEPTH)
        return tpl_fail(r, IFLOW_ERANGE, "values nested more than %d deep", MAX_VALUE_DEPTH);
    if (is_num(a) && is_num(b)) {
        *sign = num_cmp(a, b);
        return 0;
    }
    if (a.t == TV_STR && b.t == TV_STR) {
        IFLOW_TRY(tpl_spend(r, a.s.n / 64));
        int c = memcmp(a.s.p, b.s.p, a.s.n < b.s.n ? a.s.n : b.s.n);
        *sign = c ? (c > 0) - (c < 0) : (a.s.n > b.s.n) - (a.s.n < b.s.n);
        return 0;
    }
    if (a.t == b.t && (a.t == TV_LIST || a.t == TV_TUPLE)) {
        size_t n = a.l->n < b.l->n ? a.l->n : b.l->n;
        for (size_t i = 0; i < n; i++) {
            int eq = equal_at(r, a.l->v[i], b.l->v[i], depth + 1);
            if (eq < 0)
                return eq;
            if (!eq)
                return compare_at(r, op, a.l->v[i], b.l->v[i], sign, depth + 1);
        }
        *sign = (a.l->n > b.l->n) - (a.l->n < b.l->n);
        return 0;
    }
    if (a.t == TV_UNDEF || b.t == TV_UNDEF)
        return tpl_type_error(r, op, a, b);
    return tpl_fail(r, IFLOW_EINVAL, "'%s' not supported between instances of '%s' and '%s'", op, tpl_type_name(a),
                    tpl_type_name(b));
}

int tpl_compare(tpl_render *r, const char *op, tval a, tval b, int *sign)
{
    return compare_at(r, op, a, b, sign, 0);
}

static int hashable_at(tpl_render *r, tval k, int depth)
{
    if (k.t == TV_LIST || k.t == TV_DICT)
        return tpl_fail(r, IFLOW_EINVAL, "unhashable type: '%s'", tpl_type_name(k));
    if (k.t != TV_TUPLE)
        return 0;
    if (depth > MAX_VALUE_DEPTH)
        return tpl_fail(r, IFLOW_ERANGE, "values nested more than %d deep", MAX_VALUE_DEPTH);
    IFLOW_TRY(tpl_spend(r, k.l->n / 16));
    for (size_t i = 0; i < k.l->n; i++)
        IFLOW_TRY(hashable_at(r, k.l->v[i], depth + 1));
    return 0;
}

int tpl_hashable(tpl_render *r, tval k)
{
    return hashable_at(r, k, 0);
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

/* The code point at p (n > 0 bytes left) and its length; an invalid byte is -1, one byte long. */
int32_t tpl_utf8_next(const char *p, size_t n, size_t *len)
{
    const unsigned char *s = (const unsigned char *)p;
    *len = 1;
    if (s[0] < 0x80)
        return s[0];
    int k = s[0] >= 0xf0 ? 3 : s[0] >= 0xe0 ? 2 : s[0] >= 0xc0 ? 1 : 0;
    if (!k || s[0] > 0xf4 || (size_t)k >= n)
        return -1;
    int32_t cp = s[0] & (0x3f >> k);
    for (int i = 1; i <= k; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return -1;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    static const int32_t min[] = {0, 0x80, 0x800, 0x10000};
    if (cp < min[k] || cp > 0x10ffff)
        return -1;
    *len = (size_t)k + 1;
    return cp;
}

size_t tpl_utf8_put(int32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t tpl_utf8_len(tpl_render *r, const char *p, size_t n)
{
    size_t count = 0;
    for (size_t i = 0, len; i < n; i += len, count++)
        tpl_utf8_next(p + i, n - i, &len);
    tpl_spend(r, n / 64); /* an overrun shows at the next step */
    return count;
}

/* Python's str.isspace() for one code point. */
int tpl_is_space(int32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Python's str.isprintable() for one code point. */
static int is_printable(int32_t c)
{
    if (c == ' ')
        return 1;
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default:
        return 1;
    }
}

/* ---- printing: Python's str() and repr() ---------------------------------------------------- */

/* repr(float): the shortest digits that read back the same, fixed notation for exponents
 * -4 to 15, else d.ddde+XX. */
int tpl_float_repr(double d, char buf[40])
{
    if (isnan(d))
        return snprintf(buf, 40, "nan");
    if (isinf(d))
        return snprintf(buf, 40, d < 0 ? "-inf" : "inf");
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    char digits[24];
    int nd = 0, neg = tmp[0] == '-';
    const char *p = tmp + neg;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int e = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int k = 0;
    if (neg)
        buf[k++] = '-';
    if (e >= -4 && e < 16) {
        if (e < 0) {
            k += snprintf(buf + k, 40 - (size_t)k, "0.");
            for (int i = 0; i < -e - 1; i++)
                buf[k++] = '0';
            memcpy(buf + k, digits, (size_t)nd);
            k += nd;
        } else {
            for (int i = 0; i <= e; i++)
                buf[k++] = i < nd ? digits[i] : '0';
            buf[k++] = '.';
            if (nd > e + 1) {
                memcpy(buf + k, digits + e + 1, (size_t)(nd - e - 1));
                k += nd - e - 1;
            } else {
                buf[k++] = '0';
            }
        }
        buf[k] = 0;
        return k;
    }
    buf[k++] = digits[0];
    if (nd > 1) {
        buf[k++] = '.';
        memcpy(buf + k, digits + 1, (size_t)(nd - 1));
        k += nd - 1;
    }
    return k + snprintf(buf + k, 40 - (size_t)k, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
}

static int print_repr_str(tpl_render *r, tpl_buf *b, const char *p, size_t n)
{
    int has_single = memchr(p, '\'', n) != NULL, has_double = memchr(p, '"', n) != NULL;
    char quote = has_single && !has_double ? '"' : '\'';
    IFLOW_TRY(tpl_buf_putc(r, b, quote));
    size_t run = 0; /* bytes copied as they are, written in one go */
    for (size_t i = 0, len; i < n; i += len) {
        int32_t c = tpl_utf8_next(p + i, n - i, &len);
        char esc[16];
        int k = 0;
        if (c == quote || c == '\\')
            k = snprintf(esc, sizeof esc, "\\%c", (char)c);
        else if (c == '\n' || c == '\r' || c == '\t')
            k = snprintf(esc, sizeof esc, "\\%c", c == '\n' ? 'n' : c == '\r' ? 'r' : 't');
        else if (c < 0)
            k = snprintf(esc, sizeof esc, "\\x%02x", (unsigned char)p[i]);
        else if (c < 0x20 || c == 0x7f || (c >= 0x80 && !is_printable(c)))
            k = snprintf(esc, sizeof esc, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)c);
        if (!k) {
            run += len;
            continue;
        }
        IFLOW_TRY(tpl_buf_put(r, b, p + i - run, run));
        run = 0;
        IFLOW_TRY(tpl_buf_put(r, b, esc, (size_t)k));
    }
    IFLOW_TRY(tpl_buf_put(r, b, p + n - run, run));
    return tpl_buf_putc(r, b, quote);
}

static int puts_(tpl_render *r, tpl_buf *b, const char *s)
{
    return tpl_buf_put(r, b, s, strlen(s));
}

static int print_at(tpl_render *r, tpl_buf *b, tval v, int repr, int depth);

static int print_items(tpl_render *r, tpl_buf *b, const tv_list *l, const char *open, const char *close, int depth)
{
    IFLOW_TRY(puts_(r, b, open));
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            IFLOW_TRY(puts_(r, b, ", "));
        IFLOW_TRY(print_at(r, b, l->v[i], 1, depth + 1));
    }
    if (l->n == 1 && strcmp(open, "(") == 0) /* a tuple of one */
        IFLOW_TRY(puts_(r, b, ","));
    return puts_(r, b, close);
}

static int print_dict(tpl_render *r, tpl_buf *b, const tv_dict *d, int depth)
{
    IFLOW_TRY(puts_(r, b, "{"));
    for (size_t i = 0; i < d->n; i++) {
        if (i)
            IFLOW_TRY(puts_(r, b, ", "));
        IFLOW_TRY(print_at(r, b, d->k[i], 1, depth + 1));
        IFLOW_TRY(puts_(r, b, ": "));
        IFLOW_TRY(print_at(r, b, d->v[i], 1, depth + 1));
    }
    return puts_(r, b, "}");
}

static int print_at(tpl_render *r, tpl_buf *b, tval v, int repr, int depth)
{
    char num[80];
    if (depth > MAX_VALUE_DEPTH)
        return tpl_fail(r, IFLOW_ERANGE, "values nested more than %d deep", MAX_VALUE_DEPTH);
    switch (v.t) {
    case TV_UNDEF: return repr ? puts_(r, b, "Undefined") : 0;
    case TV_NONE: return puts_(r, b, "None");
    case TV_BOOL: return puts_(r, b, v.b ? "True" : "False");
    case TV_INT: snprintf(num, sizeof num, "%lld", v.i); return puts_(r, b, num);
    case TV_FLOAT: tpl_float_repr(v.f, num); return puts_(r, b, num);
    case TV_STR: return repr ? print_repr_str(r, b, v.s.p, v.s.n) : tpl_buf_put(r, b, v.s.p, v.s.n);
    case TV_LIST:
        if (v.l->range) {
            if (v.l->range[2] == 1)
                snprintf(num, sizeof num, "range(%lld, %lld)", v.l->range[0], v.l->range[1]);
            else
                snprintf(num, sizeof num, "range(%lld, %lld, %lld)", v.l->range[0], v.l->range[1], v.l->range[2]);
            return puts_(r, b, num);
        }
        if (v.l->view) {
            IFLOW_TRY(puts_(r, b, v.l->view));
            IFLOW_TRY(print_items(r, b, v.l, "([", "])", depth));
            return 0;
        }
        return print_items(r, b, v.l, "[", "]", depth);
    case TV_TUPLE: return print_items(r, b, v.l, "(", ")", depth);
    case TV_DICT: return print_dict(r, b, v.d, depth);
    case TV_NS:
        IFLOW_TRY(puts_(r, b, "<Namespace "));
        IFLOW_TRY(print_dict(r, b, v.d, depth));
        return puts_(r, b, ">");
    case TV_LOOP:
        snprintf(num, sizeof num, "<LoopContext %zu/%zu>", v.loop->i + 1, v.loop->items->n);
        return puts_(r, b, num);
    case TV_MACRO:
        IFLOW_TRY(puts_(r, b, "<Macro "));
        IFLOW_TRY(print_repr_str(r, b, v.m->def->lit.s.p, v.m->def->lit.s.n));
        return puts_(r, b, ">");
    case TV_FUNC: return puts_(r, b, "<function>");
    default: return puts_(r, b, "<built-in method>");
    }
}

int tpl_print(tpl_render *r, tpl_buf *b, tval v, int repr)
{
    return print_at(r, b, v, repr, 0);
}

int tpl_to_str(tpl_render *r, tval v, tval *out)
{
    if (v.t == TV_STR) {
        *out = v;
        return 0;
    }
    if (v.t == TV_UNDEF) {
        *out = tv_str("", 0);
        return 0;
    }
    tpl_buf b = {0};
    int rc = tpl_print(r, &b, v, 0);
    if (rc < 0) {
        tpl_buf_free(r, &b);
        return rc;
    }
    return tpl_buf_take(r, &b, out);
}

/* ---- json.dumps ----------------------------------------------------------------------------- */

/* \n \r \t \b \f: the letter json.dumps writes after the backslash, else 0 */
static char json_short_escape(int32_t c)
{
    switch (c) {
    case '\n': return 'n';
    case '\r': return 'r';
    case '\t': return 't';
    case '\b': return 'b';
    case '\f': return 'f';
    default: return 0;
    }
}

static int json_str(tpl_render *r, tpl_buf *b, const char *p, size_t n, int ascii)
{
    IFLOW_TRY(tpl_buf_putc(r, b, '"'));
    size_t run = 0;
    for (size_t i = 0, len; i < n; i += len) {
        int32_t c = tpl_utf8_next(p + i, n - i, &len);
        char esc[16];
        int k = 0;
        if (c == '"' || c == '\\')
            k = snprintf(esc, sizeof esc, "\\%c", (char)c);
        else if (json_short_escape(c))
            k = snprintf(esc, sizeof esc, "\\%c", json_short_escape(c));
        else if (c >= 0 && c < 0x20)
            k = snprintf(esc, sizeof esc, "\\u%04x", (unsigned)c);
        else if (ascii && c >= 0x10000)
            k = snprintf(esc, sizeof esc, "\\u%04x\\u%04x", (unsigned)(0xd800 + ((c - 0x10000) >> 10)),
                         (unsigned)(0xdc00 + ((c - 0x10000) & 0x3ff)));
        else if (ascii && c >= 0x7f)
            k = snprintf(esc, sizeof esc, "\\u%04x", (unsigned)c);
        else if (ascii && c < 0)
            k = snprintf(esc, sizeof esc, "\\ufffd");
        if (!k) {
            run += len;
            continue;
        }
        IFLOW_TRY(tpl_buf_put(r, b, p + i - run, run));
        run = 0;
        IFLOW_TRY(tpl_buf_put(r, b, esc, (size_t)k));
    }
    IFLOW_TRY(tpl_buf_put(r, b, p + n - run, run));
    return tpl_buf_putc(r, b, '"');
}

static int json_float(tpl_render *r, tpl_buf *b, double f)
{
    char num[40];
    if (isnan(f))
        return puts_(r, b, "NaN");
    if (isinf(f))
        return puts_(r, b, f < 0 ? "-Infinity" : "Infinity");
    tpl_float_repr(f, num);
    return puts_(r, b, num);
}

static int json_newline(tpl_render *r, tpl_buf *b, const tpl_json_opts *o, int level)
{
    if (!o->indent)
        return 0;
    IFLOW_TRY(tpl_buf_putc(r, b, '\n'));
    for (int i = 0; i < level; i++)
        IFLOW_TRY(tpl_buf_put(r, b, o->indent, o->indent_n));
    return 0;
}

/* A dict key as json.dumps writes it: strings as they are, numbers, booleans and None as text. */
static int json_key(tpl_render *r, tpl_buf *b, tval k, const tpl_json_opts *o)
{
    char num[40];
    switch (k.t) {
    case TV_STR: return json_str(r, b, k.s.p, k.s.n, o->ascii);
    case TV_NONE: return puts_(r, b, "\"null\"");
    case TV_BOOL: return puts_(r, b, k.b ? "\"true\"" : "\"false\"");
    case TV_INT: snprintf(num, sizeof num, "\"%lld\"", k.i); return puts_(r, b, num);
    case TV_FLOAT:
        IFLOW_TRY(tpl_buf_putc(r, b, '"'));
        IFLOW_TRY(json_float(r, b, k.f));
        return tpl_buf_putc(r, b, '"');
    default:
        return tpl_fail(r, IFLOW_EINVAL, "keys must be str, int, float, bool or None, not %s", tpl_type_name(k));
    }
}

/* The order json.dumps(sort_keys=True) writes a dict in: a stable sort of the key positions. */
static int sorted_keys(tpl_render *r, const tv_dict *d, size_t **order)
{
    size_t *ix = tpl_alloc(r, (d->n ? d->n : 1) * sizeof *ix);
    if (!ix)
        return r->rc;
    for (size_t i = 0; i < d->n; i++) { /* insertion sort: dicts in templates are small */
        size_t j = i;
        IFLOW_TRY(tpl_spend(r, i));
        while (j > 0) {
            int sign;
            IFLOW_TRY(tpl_compare(r, "<", d->k[ix[j - 1]], d->k[i], &sign));
            if (sign <= 0)
                break;
            ix[j] = ix[j - 1];
            j--;
        }
        ix[j] = i;
    }
    *order = ix;
    return 0;
}

int tpl_json(tpl_render *r, tpl_buf *b, tval v, const tpl_json_opts *o, int level)
{
    char num[40];
    if (level > MAX_VALUE_DEPTH)
        return tpl_fail(r, IFLOW_ERANGE, "values nested more than %d deep", MAX_VALUE_DEPTH);
    switch (v.t) {
    case TV_NONE: return puts_(r, b, "null");
    case TV_BOOL: return puts_(r, b, v.b ? "true" : "false");
    case TV_INT: snprintf(num, sizeof num, "%lld", v.i); return puts_(r, b, num);
    case TV_FLOAT: return json_float(r, b, v.f);
    case TV_STR: return json_str(r, b, v.s.p, v.s.n, o->ascii);
    case TV_LIST: case TV_TUPLE:
        if (v.l->view)
            return tpl_fail(r, IFLOW_EINVAL, "object of type %s is not JSON serializable", v.l->view);
        if (!v.l->n)
            return puts_(r, b, "[]");
        IFLOW_TRY(tpl_buf_putc(r, b, '['));
        for (size_t i = 0; i < v.l->n; i++) {
            if (i)
                IFLOW_TRY(tpl_buf_put(r, b, o->item_sep, o->item_sep_n));
            IFLOW_TRY(json_newline(r, b, o, level + 1));
            IFLOW_TRY(tpl_json(r, b, v.l->v[i], o, level + 1));
        }
        IFLOW_TRY(json_newline(r, b, o, level));
        return tpl_buf_putc(r, b, ']');
    case TV_DICT: {
        if (!v.d->n)
            return puts_(r, b, "{}");
        size_t *order = NULL;
        if (o->sort_keys)
            IFLOW_TRY(sorted_keys(r, v.d, &order));
        IFLOW_TRY(tpl_buf_putc(r, b, '{'));
        for (size_t i = 0; i < v.d->n; i++) {
            size_t j = order ? order[i] : i;
            if (i)
                IFLOW_TRY(tpl_buf_put(r, b, o->item_sep, o->item_sep_n));
            IFLOW_TRY(json_newline(r, b, o, level + 1));
            IFLOW_TRY(json_key(r, b, v.d->k[j], o));
            IFLOW_TRY(tpl_buf_put(r, b, o->key_sep, o->key_sep_n));
            IFLOW_TRY(tpl_json(r, b, v.d->v[j], o, level + 1));
        }
        IFLOW_TRY(json_newline(r, b, o, level));
        return tpl_buf_putc(r, b, '}');
    }
    default:
        return tpl_fail(r, IFLOW_EINVAL, "object of type %s is not JSON serializable", tpl_type_name(v));
    }
}

/* ---- the variables: JSON to values (strings point into the JSON) ---------------------------- */

static int from_json(tpl_render *r, const json_t *j, tval *out, int depth)
{
    if (depth > MAX_VALUE_DEPTH)
        return tpl_fail(r, IFLOW_ERANGE, "the variables are nested more than %d deep", MAX_VALUE_DEPTH);
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        tv_dict *d = tpl_dict_new(r, json_object_size(j));
        if (!d)
            return r->rc;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            tval v;
            IFLOW_TRY(from_json(r, val, &v, depth + 1));
            IFLOW_TRY(dict_append(r, d, tv_str(key, strlen(key)), v));
        }
        *out = tv_map(d);
        return 0;
    }
    case JSON_ARRAY: {
        tv_list *l = tpl_list_new(r, json_array_size(j));
        if (!l)
            return r->rc;
        for (size_t i = 0; i < json_array_size(j); i++) {
            tval v;
            IFLOW_TRY(from_json(r, json_array_get(j, i), &v, depth + 1));
            IFLOW_TRY(tpl_list_push(r, l, v));
        }
        *out = tv_seq(l, 0);
        return 0;
    }
    case JSON_STRING: *out = tv_str(json_string_value(j), json_string_length(j)); return 0;
    case JSON_INTEGER: *out = tv_int((long long)json_integer_value(j)); return 0;
    case JSON_REAL: *out = tv_float(json_real_value(j)); return 0;
    case JSON_TRUE: *out = tv_bool(1); return 0;
    case JSON_FALSE: *out = tv_bool(0); return 0;
    default: *out = tv_none(); return 0;
    }
}

/* ---- the API -------------------------------------------------------------------------------- */

int iflow_template_open(iflow_template **out, const char *text, size_t len, const char *name)
{
    *out = NULL;
    if (!name)
        name = "the chat template";
    if (len > ((size_t)1 << 30))
        return iflow_seterr(IFLOW_ERANGE, "%s: a template longer than 1 GiB", name);
    iflow_template *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(name)) || !(t->src = malloc(len + 1))) {
        iflow_template_close(t);
        return iflow_seterr(IFLOW_ENOMEM, "%s: out of memory", name);
    }
    /* jinja2 reads \r\n and \r as \n and drops one newline at the end */
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\r') {
            t->src[n++] = '\n';
            if (i + 1 < len && text[i + 1] == '\n')
                i++;
        } else {
            t->src[n++] = text[i];
        }
    }
    if (n && t->src[n - 1] == '\n')
        n--;
    t->src[n] = 0;
    t->len = n;
    t->a.limit = (size_t)1 << 40;
    int rc = tpl_parse(t);
    if (rc < 0) {
        iflow_template_close(t);
        return rc;
    }
    *out = t;
    return 0;
}

int iflow_template_render(const iflow_template *t, const json_t *vars, char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    if (!json_is_object(vars))
        return iflow_seterr(IFLOW_EINVAL, "%s: the variables must be a JSON object", t->name);
    tpl_buf text = {0};
    tpl_render r = {.t = t, .out = &text, .main = &text};
    r.a.limit = IFLOW_TEMPLATE_MAX_MEMORY;
    json_t *now = json_object_get(vars, "__now__");
    if (json_is_integer(now)) {
        r.has_now = 1;
        r.now = (long long)json_integer_value(now);
    }
    tval v;
    int rc = from_json(&r, vars, &v, 0);
    if (rc == 0) {
        r.vars = v.d;
        rc = tpl_render_tree(&r);
    }
    if (rc == 0)
        rc = tpl_buf_put(&r, &text, "", 0);
    if (rc == 0 && !text.p && !(text.p = malloc(1)))
        rc = iflow_seterr(IFLOW_ENOMEM, "%s: out of memory", t->name);
    tpl_arena_free(&r.a);
    if (rc < 0) {
        free(text.p);
        return rc;
    }
    text.p[text.n] = 0;
    *out = text.p;
    *out_len = text.n;
    return 0;
}

void iflow_template_close(iflow_template *t)
{
    if (!t)
        return;
    tpl_arena_free(&t->a);
    free(t->name);
    free(t->src);
    free(t);
}
