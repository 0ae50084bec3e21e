/*
 * template_lib.c -- chat templates (template.h): the built-ins. Arithmetic and `in` with
 * Python's rules, str methods, dict methods, jinja2's filters and tests (with transformers'
 * tojson), and the global functions. Each is looked up by name in a table; a name jinja2 has
 * and this file does not has a NULL function (a render error when it is used).
 */
#include "template_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <utf8proc.h>

#include "libcore/base/error.h"
#include "libcore/base/quote.h"

#define MAX_RANGE 100000 /* jinja2's sandbox refuses longer ranges */

/* ---- arguments ------------------------------------------------------------------------------ */

static int name_is(const char *name, const char *p, size_t n)
{
    return strlen(name) == n && memcmp(name, p, n) == 0;
}

/* Bind a call's arguments to parameter names, positional first, then by name; a parameter not
 * given is TV_NOARG. */
static int bind(tpl_render *r, const char *fn, const tpl_args *a, const char *const *names, int n, tval *slot)
{
    if (a->n > n)
        return tpl_fail(r, IFLOW_EINVAL, "%s() takes at most %d argument(s) (%d given)", fn, n, a->n);
    for (int i = 0; i < n; i++)
        slot[i] = i < a->n ? a->v[i] : tv_noarg();
    for (int k = 0; k < a->nkw; k++) {
        const tval *kw = &a->kwname[k]->lit;
        int i = 0;
        while (i < n && !name_is(names[i], kw->s.p, kw->s.n))
            i++;
        if (i == n)
            return tpl_fail(r, IFLOW_EINVAL, "%s() got an unexpected keyword argument '%s'", fn,
                            iflow_quoten(kw->s.p, kw->s.n));
        if (slot[i].t != TV_NOARG)
            return tpl_fail(r, IFLOW_EINVAL, "%s() got multiple values for argument '%s'", fn, names[i]);
        slot[i] = a->kw[k];
    }
    return 0;
}

static int given(tval v) { return v.t != TV_NOARG; }

static int int_arg(tpl_render *r, const char *fn, tval v, long long def, long long *out)
{
    if (!given(v) || v.t == TV_NONE) {
        *out = def;
        return 0;
    }
    if (v.t == TV_INT || v.t == TV_BOOL) {
        *out = v.t == TV_INT ? v.i : v.b;
        return 0;
    }
    return tpl_fail(r, IFLOW_EINVAL, "%s(): '%s' object cannot be interpreted as an integer", fn, tpl_type_name(v));
}

static int str_arg(tpl_render *r, const char *fn, tval v, tval *out)
{
    if (v.t != TV_STR)
        return tpl_fail(r, IFLOW_EINVAL, "%s(): expected a string, got '%s'", fn, tpl_type_name(v));
    *out = v;
    return 0;
}

/* ---- text ----------------------------------------------------------------------------------- */

static int str_from_buf(tpl_render *r, tpl_buf *b, int rc, tval *out)
{
    if (rc < 0) {
        tpl_buf_free(r, b);
        return rc;
    }
    return tpl_buf_take(r, b, out);
}

/* Whether c is in the set of code points `chars` (NULL: whitespace). */
static int in_set(int32_t c, const tval *chars)
{
    if (!chars)
        return c >= 0 && tpl_is_space(c);
    for (size_t i = 0, len; i < chars->s.n; i += len)
        if (tpl_utf8_next(chars->s.p + i, chars->s.n - i, &len) == c && c >= 0)
            return 1;
    return 0;
}

/* The start of the code point that ends at `end` (> start). */
static size_t prev_cp(const char *p, size_t start, size_t end)
{
    size_t k = end - 1, len;
    while (k > start && end - k < 4 && ((unsigned char)p[k] & 0xc0) == 0x80)
        k--;
    tpl_utf8_next(p + k, end - k, &len);
    return k + len == end ? k : end - 1;
}

/* str.strip(chars) (NULL: whitespace); a step per 64 bytes looked at, times the characters tried */
static tval strip(tpl_render *r, tval s, const tval *chars, int left, int right)
{
    size_t b = 0, e = s.s.n, len;
    tpl_spend(r, (s.s.n / 64 + 1) * (chars ? chars->s.n / 16 + 1 : 1) - 1); /* an overrun shows at the next step */
    while (left && b < e && in_set(tpl_utf8_next(s.s.p + b, e - b, &len), chars))
        b += len;
    while (right && e > b) {
        size_t k = prev_cp(s.s.p, b, e);
        if (!in_set(tpl_utf8_next(s.s.p + k, e - k, &len), chars))
            break;
        e = k;
    }
    return tv_str(s.s.p + b, e - b);
}

/* The first needle in hay, NULL if none (a step per 64 bytes). */
static const char *find_bytes(tpl_render *r, const char *hay, size_t n, const char *needle, size_t m)
{
    tpl_spend(r, n / 64); /* an overrun shows at the next step */
    if (m == 0)
        return hay;
    return m <= n ? memmem(hay, n, needle, m) : NULL;
}

/* The last needle in hay (m > 0 bytes long), NULL if none; compared at each place from the end. */
static const char *rfind_bytes(tpl_render *r, const char *hay, size_t n, const char *needle, size_t m)
{
    tpl_spend(r, (n / 64 + 1) * (m / 64 + 1) - 1);
    for (size_t k = n; k >= m && m > 0; k--)
        if (memcmp(hay + k - m, needle, m) == 0)
            return hay + k - m;
    return m == 0 ? hay + n : NULL;
}

/* Byte offset of code point index i (negative from the end, clamped as Python's str methods). */
static size_t cp_offset(tpl_render *r, tval s, long long i)
{
    long long len = (long long)tpl_utf8_len(r, s.s.p, s.s.n);
    if (i < 0)
        i = i + len < 0 ? 0 : i + len;
    if (i > len)
        i = len;
    size_t at = 0, l;
    for (long long k = 0; k < i; k++, at += l)
        tpl_utf8_next(s.s.p + at, s.s.n - at, &l);
    return at;
}

/* The part of s that [start:end] arguments select (as str.find, count, startswith take them). */
static int sub_range(tpl_render *r, const char *fn, tval s, tval start, tval end, size_t *b, size_t *e)
{
    long long st = 0, en = 0;
    IFLOW_TRY(int_arg(r, fn, start, 0, &st));
    IFLOW_TRY(int_arg(r, fn, end, 1LL << 62, &en));
    *b = given(start) && start.t != TV_NONE ? cp_offset(r, s, st) : 0;
    *e = given(end) && end.t != TV_NONE ? cp_offset(r, s, en) : s.s.n;
    if (*e < *b)
        *e = *b;
    return 0;
}

static int split(tpl_render *r, tval s, tval sep, long long maxsplit, int from_right, tval *out)
{
    IFLOW_TRY(tpl_spend(r, s.s.n / 64));
    tv_list *l = tpl_list_new(r, 0);
    if (!l)
        return r->rc;
    if (sep.t == TV_STR && sep.s.n == 0)
        return tpl_fail(r, IFLOW_EINVAL, "empty separator");
    const char *p = s.s.p;
    size_t b = 0, e = s.s.n, len;
    tv_list *parts = l;
    if (sep.t == TV_STR) {
        while (maxsplit != 0) {
            const char *hit = from_right ? rfind_bytes(r, p + b, e - b, sep.s.p, sep.s.n)
                                         : find_bytes(r, p + b, e - b, sep.s.p, sep.s.n);
            if (!hit)
                break;
            size_t at = (size_t)(hit - p);
            IFLOW_TRY(tpl_list_push(r, parts, from_right ? tv_str(p + at + sep.s.n, e - at - sep.s.n)
                                                         : tv_str(p + b, at - b)));
            if (from_right)
                e = at;
            else
                b = at + sep.s.n;
            maxsplit--;
        }
        IFLOW_TRY(tpl_list_push(r, parts, tv_str(p + b, e - b)));
    } else { /* runs of whitespace, none at the ends */
        for (;;) {
            if (!from_right) {
                while (b < e && tpl_is_space(tpl_utf8_next(p + b, e - b, &len)))
                    b += len;
            } else {
                while (e > b && tpl_is_space(tpl_utf8_next(p + prev_cp(p, b, e), e - prev_cp(p, b, e), &len)))
                    e = prev_cp(p, b, e);
            }
            if (b == e)
                break;
            if (maxsplit == 0) {
                IFLOW_TRY(tpl_list_push(r, parts, tv_str(p + b, e - b)));
                break;
            }
            size_t k;
            if (!from_right) {
                for (k = b; k < e && !tpl_is_space(tpl_utf8_next(p + k, e - k, &len)); k += len)
                    ;
                IFLOW_TRY(tpl_list_push(r, parts, tv_str(p + b, k - b)));
                b = k;
            } else {
                for (k = e; k > b && !tpl_is_space(tpl_utf8_next(p + prev_cp(p, b, k), k - prev_cp(p, b, k), &len));)
                    k = prev_cp(p, b, k);
                IFLOW_TRY(tpl_list_push(r, parts, tv_str(p + k, e - k)));
                e = k;
            }
            maxsplit--;
        }
    }
    if (from_right) /* gathered from the end */
        for (size_t i = 0; i < l->n / 2; i++) {
            tval t = l->v[i];
            l->v[i] = l->v[l->n - 1 - i];
            l->v[l->n - 1 - i] = t;
        }
    *out = tv_seq(l, 0);
    return 0;
}

/* Length of the line break at p (\r\n, \n, \r, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029), or 0. */
static size_t line_break(const char *p, size_t n)
{
    size_t len;
    int32_t c = tpl_utf8_next(p, n, &len);
    if (c == '\r' && n > 1 && p[1] == '\n')
        return 2;
    if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e) || c == 0x85 || c == 0x2028 ||
        c == 0x2029)
        return len;
    return 0;
}

static int splitlines(tpl_render *r, tval s, int keepends, tv_list **out)
{
    IFLOW_TRY(tpl_spend(r, s.s.n / 64));
    tv_list *l = tpl_list_new(r, 0);
    if (!l)
        return r->rc;
    size_t start = 0, len;
    for (size_t i = 0; i < s.s.n;) {
        size_t br = line_break(s.s.p + i, s.s.n - i);
        if (!br) {
            tpl_utf8_next(s.s.p + i, s.s.n - i, &len);
            i += len;
            continue;
        }
        IFLOW_TRY(tpl_list_push(r, l, tv_str(s.s.p + start, i - start + (keepends ? br : 0))));
        i += br;
        start = i;
    }
    if (start < s.s.n)
        IFLOW_TRY(tpl_list_push(r, l, tv_str(s.s.p + start, s.s.n - start)));
    *out = l;
    return 0;
}

static int replace(tpl_render *r, tval s, tval old, tval new, long long count, tval *out)
{
    tpl_buf b = {0};
    int rc = 0;
    size_t at = 0, len;
    if (old.s.n == 0) { /* new before every character and at the end */
        for (; rc == 0 && count != 0; count--) {
            rc = tpl_buf_put(r, &b, new.s.p, new.s.n);
            if (at == s.s.n)
                break;
            tpl_utf8_next(s.s.p + at, s.s.n - at, &len);
            if (rc == 0)
                rc = tpl_buf_put(r, &b, s.s.p + at, len);
            at += len;
        }
    } else {
        const char *hit;
        for (; rc == 0 && count != 0 && (hit = find_bytes(r, s.s.p + at, s.s.n - at, old.s.p, old.s.n)); count--) {
            size_t k = (size_t)(hit - s.s.p);
            rc = tpl_buf_put(r, &b, s.s.p + at, k - at);
            if (rc == 0)
                rc = tpl_buf_put(r, &b, new.s.p, new.s.n);
            at = k + old.s.n;
        }
    }
    if (rc == 0)
        rc = tpl_buf_put(r, &b, s.s.p + at, s.s.n - at);
    return str_from_buf(r, &b, rc, out);
}

/* ---- arithmetic and `in` -------------------------------------------------------------------- */

static int is_num(tval v) { return v.t == TV_BOOL || v.t == TV_INT || v.t == TV_FLOAT; }
static int is_intlike(tval v) { return v.t == TV_BOOL || v.t == TV_INT; }
static long long ival(tval v) { return v.t == TV_BOOL ? v.b : v.i; }
static double fval(tval v) { return v.t == TV_FLOAT ? v.f : (double)ival(v); }

static const char *op_name(int op)
{
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    return op >= 0 && op <= OP_POW ? names[op] : "?";
}

static int overflow(tpl_render *r)
{
    return tpl_fail(r, IFLOW_ERANGE, "integer overflow (integers are 64-bit here)");
}

static int int_pow(tpl_render *r, long long base, long long exp, tval *out)
{
    long long result = 1;
    while (exp > 0) {
        if ((exp & 1) && __builtin_mul_overflow(result, base, &result))
            return overflow(r);
        exp >>= 1;
        if (exp && __builtin_mul_overflow(base, base, &base))
            return overflow(r);
    }
    *out = tv_int(result);
    return 0;
}

static int int_op(tpl_render *r, int op, long long x, long long y, tval *out)
{
    long long z;
    switch (op) {
    case OP_ADD: if (__builtin_add_overflow(x, y, &z)) return overflow(r); break;
    case OP_SUB: if (__builtin_sub_overflow(x, y, &z)) return overflow(r); break;
    case OP_MUL: if (__builtin_mul_overflow(x, y, &z)) return overflow(r); break;
    case OP_DIV:
        if (y == 0)
            return tpl_fail(r, IFLOW_EINVAL, "division by zero");
        *out = tv_float((double)x / (double)y);
        return 0;
    case OP_FLOORDIV: case OP_MOD:
        if (y == 0)
            return tpl_fail(r, IFLOW_EINVAL, "integer division or modulo by zero");
        if (x == -9223372036854775807LL - 1 && y == -1) {
            if (op == OP_FLOORDIV)
                return overflow(r);
            z = 0;
            break;
        }
        z = op == OP_FLOORDIV ? x / y : x % y; /* C truncates; Python floors */
        if (x % y != 0 && (x < 0) != (y < 0))
            z = op == OP_FLOORDIV ? z - 1 : z + y;
        break;
    default: /* OP_POW */
        if (y < 0) {
            if (x == 0)
                return tpl_fail(r, IFLOW_EINVAL, "0.0 cannot be raised to a negative power");
            *out = tv_float(pow((double)x, (double)y));
            return 0;
        }
        return int_pow(r, x, y, out);
    }
    *out = tv_int(z);
    return 0;
}

static int float_op(tpl_render *r, int op, double x, double y, tval *out)
{
    double z;
    switch (op) {
    case OP_ADD: z = x + y; break;
    case OP_SUB: z = x - y; break;
    case OP_MUL: z = x * y; break;
    case OP_DIV:
        if (y == 0)
            return tpl_fail(r, IFLOW_EINVAL, "float division by zero");
        z = x / y;
        break;
    case OP_FLOORDIV: case OP_MOD: { /* Python's float_divmod */
        if (y == 0)
            return tpl_fail(r, IFLOW_EINVAL, "float modulo or floor division by zero");
        double mod = fmod(x, y), div = (x - mod) / y;
        if (mod != 0) {
            if ((y < 0) != (mod < 0)) {
                mod += y;
                div -= 1.0;
            }
        } else {
            mod = copysign(0.0, y);
        }
        double fl;
        if (div != 0) {
            fl = floor(div);
            if (div - fl > 0.5)
                fl += 1.0;
        } else {
            fl = copysign(0.0, x / y);
        }
        z = op == OP_MOD ? mod : fl;
        break;
    }
    default:
        if (x == 0 && y < 0)
            return tpl_fail(r, IFLOW_EINVAL, "0.0 cannot be raised to a negative power");
        if (x < 0 && y != floor(y))
            return tpl_fail(r, IFLOW_EINVAL, "a negative number raised to a fractional power is complex");
        z = pow(x, y);
        if (isinf(z) && isfinite(x) && isfinite(y))
            return tpl_fail(r, IFLOW_ERANGE, "numerical result out of range");
    }
    *out = tv_float(z);
    return 0;
}

static int repeat(tpl_render *r, tval seq, long long times, tval *out)
{
    size_t unit = seq.t == TV_STR ? seq.s.n : seq.l->n;
    if (times <= 0 || unit == 0) {
        *out = seq.t == TV_STR ? tv_str("", 0) : tv_seq(tpl_list_new(r, 0), seq.t == TV_TUPLE);
        return seq.t == TV_STR || out->l ? 0 : r->rc;
    }
    if ((unsigned long long)times > IFLOW_TEMPLATE_MAX_OUTPUT / unit)
        return tpl_fail(r, IFLOW_ERANGE, "a repetition longer than %zu MiB", IFLOW_TEMPLATE_MAX_OUTPUT >> 20);
    if (seq.t == TV_STR) {
        tpl_buf b = {0};
        int rc = 0;
        for (long long k = 0; k < times && rc == 0; k++)
            rc = tpl_buf_put(r, &b, seq.s.p, seq.s.n);
        return str_from_buf(r, &b, rc, out);
    }
    tv_list *l = tpl_list_new(r, unit * (size_t)times);
    if (!l)
        return r->rc;
    for (long long k = 0; k < times; k++)
        for (size_t i = 0; i < unit; i++)
            IFLOW_TRY(tpl_list_push(r, l, seq.l->v[i]));
    *out = tv_seq(l, seq.t == TV_TUPLE);
    return 0;
}

static int concat(tpl_render *r, tval a, tval b, tval *out)
{
    if (a.t == TV_STR) {
        tpl_buf buf = {0};
        int rc = tpl_buf_put(r, &buf, a.s.p, a.s.n);
        if (rc == 0)
            rc = tpl_buf_put(r, &buf, b.s.p, b.s.n);
        return str_from_buf(r, &buf, rc, out);
    }
    tv_list *l = tpl_list_new(r, a.l->n + b.l->n);
    if (!l)
        return r->rc;
    for (size_t i = 0; i < a.l->n; i++)
        IFLOW_TRY(tpl_list_push(r, l, a.l->v[i]));
    for (size_t i = 0; i < b.l->n; i++)
        IFLOW_TRY(tpl_list_push(r, l, b.l->v[i]));
    *out = tv_seq(l, a.t == TV_TUPLE);
    return 0;
}

int tpl_binop(tpl_render *r, int op, tval a, tval b, tval *out)
{
    if (is_num(a) && is_num(b)) {
        if (a.t != TV_FLOAT && b.t != TV_FLOAT)
            return int_op(r, op, ival(a), ival(b), out);
        return float_op(r, op, fval(a), fval(b), out);
    }
    if (op == OP_MOD && a.t == TV_STR)
        return tpl_percent_format(r, a, b, out);
    if ((a.t == TV_LIST && a.l->view) || (b.t == TV_LIST && b.l->view)) /* range(), dict.items() */
        return tpl_type_error(r, op_name(op), a, b);
    if (op == OP_ADD && a.t == b.t && (a.t == TV_STR || a.t == TV_LIST || a.t == TV_TUPLE))
        return concat(r, a, b, out);
    if (op == OP_MUL && (a.t == TV_STR || a.t == TV_LIST || a.t == TV_TUPLE) && is_intlike(b))
        return repeat(r, a, ival(b), out);
    if (op == OP_MUL && (b.t == TV_STR || b.t == TV_LIST || b.t == TV_TUPLE) && is_intlike(a))
        return repeat(r, b, ival(a), out);
    return tpl_type_error(r, op_name(op), a, b);
}

int tpl_contains(tpl_render *r, tval hay, tval needle, int *res)
{
    *res = 0;
    switch (hay.t) {
    case TV_STR:
        if (needle.t != TV_STR)
            return tpl_fail(r, IFLOW_EINVAL, "'in <string>' requires string as left operand, not %s",
                            tpl_type_name(needle));
        *res = find_bytes(r, hay.s.p, hay.s.n, needle.s.p, needle.s.n) != NULL;
        return tpl_spend(r, hay.s.n / 64);
    case TV_LIST: case TV_TUPLE:
        IFLOW_TRY(tpl_spend(r, hay.l->n / 16));
        for (size_t i = 0; i < hay.l->n && !*res; i++) {
            int eq = tpl_equal(r, hay.l->v[i], needle);
            if (eq < 0)
                return eq;
            *res = eq;
        }
        return 0;
    case TV_DICT: {
        tval *slot;
        IFLOW_TRY(tpl_hashable(r, needle));
        IFLOW_TRY(tpl_dict_find(r, hay.d, needle, &slot));
        *res = slot != NULL;
        return 0;
    }
    case TV_UNDEF:
        return 0;
    default:
        return tpl_fail(r, IFLOW_EINVAL, "argument of type '%s' is not iterable", tpl_type_name(hay));
    }
}

/* ---- helpers of the filters ----------------------------------------------------------------- */

/* jinja2's make_attrgetter: item.a.b (dotted; integer parts are indices), through getitem. */
static int attr_path(tpl_render *r, tval item, tval attr, tval *out)
{
    if (attr.t != TV_STR)
        return tpl_getitem(r, item, attr, out);
    const char *p = attr.s.p, *end = p + attr.s.n;
    *out = item;
    for (;;) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t n = dot ? (size_t)(dot - p) : (size_t)(end - p);
        tval key = tv_str(p, n);
        int digits = n > 0 && n < 19;
        for (size_t i = 0; i < n && digits; i++)
            digits = p[i] >= '0' && p[i] <= '9';
        if (digits)
            key = tv_int(strtoll(p, NULL, 10));
        IFLOW_TRY(tpl_getitem(r, *out, key, out));
        if (!dot)
            return 0;
        p = dot + 1;
    }
}

/* jinja2's ignore_case: strings lowered for sorting and comparing. */
static int fold(tpl_render *r, tval v, int case_sensitive, tval *out)
{
    if (v.t != TV_STR || case_sensitive) {
        *out = v;
        return 0;
    }
    return tpl_change_case(r, v, TPL_LOWER, out);
}

/* A stable merge sort of v by keys (reverse: by descending keys, equal ones still in order). */
/* The tuple (k, v): a dict's item. */
static int item_pair(tpl_render *r, tval k, tval v, tval *out)
{
    tv_list *pair = tpl_list_new(r, 2);
    if (!pair)
        return r->rc;
    IFLOW_TRY(tpl_list_push(r, pair, k));
    IFLOW_TRY(tpl_list_push(r, pair, v));
    *out = tv_seq(pair, 1);
    return 0;
}

static int sort_by(tpl_render *r, tval *v, tval *keys, size_t n, int reverse)
{
    if (n < 2)
        return 0;
    tval *tv = tpl_alloc(r, n * sizeof *tv), *tk = tv ? tpl_alloc(r, n * sizeof *tk) : NULL;
    if (!tk)
        return r->rc;
    for (size_t width = 1; width < n; width *= 2) {
        IFLOW_TRY(tpl_spend(r, n));
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int sign = 0, eq = tpl_equal(r, keys[j], keys[i]); /* equal first, as Python's lists */
                if (eq < 0)
                    return eq;
                if (!eq) /* take from the right only when it must come first */
                    IFLOW_TRY(tpl_compare(r, "<", keys[j], keys[i], &sign));
                int right_first = reverse ? sign > 0 : sign < 0;
                tv[k] = right_first ? v[j] : v[i];
                tk[k++] = right_first ? keys[j++] : keys[i++];
            }
            while (i < mid) {
                tv[k] = v[i];
                tk[k++] = keys[i++];
            }
            while (j < hi) {
                tv[k] = v[j];
                tk[k++] = keys[j++];
            }
        }
        memcpy(v, tv, n * sizeof *v);
        memcpy(keys, tk, n * sizeof *keys);
    }
    return 0;
}

/* A copy of the items of v with their sort keys (attribute, then folded case). */
static int keyed_items(tpl_render *r, tval v, tval attribute, int case_sensitive, tv_list **items, tval **keys)
{
    tv_list *src;
    IFLOW_TRY(tpl_items(r, v, &src));
    tv_list *l = tpl_list_new(r, src->n);
    tval *k = l ? tpl_alloc(r, (src->n ? src->n : 1) * sizeof *k) : NULL;
    if (!k)
        return r->rc;
    for (size_t i = 0; i < src->n; i++) {
        IFLOW_TRY(tpl_list_push(r, l, src->v[i]));
        k[i] = src->v[i];
        if (given(attribute) && attribute.t != TV_NONE)
            IFLOW_TRY(attr_path(r, src->v[i], attribute, &k[i]));
        IFLOW_TRY(fold(r, k[i], case_sensitive, &k[i]));
    }
    *items = l;
    *keys = k;
    return 0;
}

/* ---- filters -------------------------------------------------------------------------------- */

typedef int (*filter_fn)(tpl_render *r, tval v, tpl_args *a, tval *out);

#define FILTER(name) static int f_##name(tpl_render *r, tval v, tpl_args *a, tval *out)
#define PARAMS(fn, ...)                                                                            \
    static const char *const names_[] = {__VA_ARGS__};                                            \
    tval p[sizeof names_ / sizeof *names_];                                                       \
    IFLOW_TRY(bind(r, fn, a, names_, (int)(sizeof names_ / sizeof *names_), p))
#define NO_PARAMS(fn)                                                                              \
    do {                                                                                         \
        if (a->n || a->nkw)                                                                      \
            return tpl_fail(r, IFLOW_EINVAL, "%s() takes no arguments", fn);                   \
    } while (0)

FILTER(abs)
{
    NO_PARAMS("abs");
    if (is_intlike(v)) {
        if (ival(v) == -9223372036854775807LL - 1)
            return overflow(r);
        *out = tv_int(ival(v) < 0 ? -ival(v) : ival(v));
        return 0;
    }
    if (v.t == TV_FLOAT) {
        *out = tv_float(fabs(v.f));
        return 0;
    }
    return tpl_fail(r, IFLOW_EINVAL, "bad operand type for abs(): '%s'", tpl_type_name(v));
}

FILTER(attr)
{
    PARAMS("attr", "name");
    if (p[0].t != TV_STR)
        return tpl_fail(r, IFLOW_EINVAL, "attr(): the name must be a string");
    if (v.t == TV_UNDEF)
        return tpl_getattr(r, v, p[0].s.p, p[0].s.n, out);
    int found = tpl_pyattr(r, v, p[0].s.p, p[0].s.n, out);
    if (found < 0)
        return found;
    if (!found)
        *out = tv_undef(p[0].s.p, p[0].s.n);
    return 0;
}

static int case_filter(tpl_render *r, tval v, tpl_args *a, int how, const char *fn, tval *out)
{
    NO_PARAMS(fn);
    IFLOW_TRY(tpl_to_str(r, v, &v));
    return tpl_change_case(r, v, how, out);
}

FILTER(capitalize) { return case_filter(r, v, a, TPL_CAPITALIZE, "capitalize", out); }
FILTER(lower) { return case_filter(r, v, a, TPL_LOWER, "lower", out); }
FILTER(upper) { return case_filter(r, v, a, TPL_UPPER, "upper", out); }
FILTER(title) { return case_filter(r, v, a, TPL_JINJA_TITLE, "title", out); }

FILTER(center)
{
    PARAMS("center", "width");
    long long width = 80;
    IFLOW_TRY(int_arg(r, "center", p[0], 80, &width));
    IFLOW_TRY(tpl_to_str(r, v, &v));
    long long len = (long long)tpl_utf8_len(r, v.s.p, v.s.n);
    if (width <= len) {
        *out = v;
        return 0;
    }
    if (width - len > (long long)IFLOW_TEMPLATE_MAX_OUTPUT)
        return tpl_fail(r, IFLOW_ERANGE, "center(): a width over %zu MiB", IFLOW_TEMPLATE_MAX_OUTPUT >> 20);
    long long marg = width - len, left = marg / 2 + (marg & width & 1);
    tpl_buf b = {0};
    int rc = 0;
    for (long long i = 0; i < marg && rc == 0; i++) {
        if (i == left)
            rc = tpl_buf_put(r, &b, v.s.p, v.s.n);
        if (rc == 0)
            rc = tpl_buf_putc(r, &b, ' ');
    }
    if (rc == 0 && left == marg)
        rc = tpl_buf_put(r, &b, v.s.p, v.s.n);
    return str_from_buf(r, &b, rc, out);
}

FILTER(default)
{
    PARAMS("default", "default_value", "boolean");
    if (v.t == TV_UNDEF || (given(p[1]) && tpl_truthy(p[1]) && !tpl_truthy(v)))
        *out = given(p[0]) ? p[0] : tv_str("", 0);
    else
        *out = v;
    return 0;
}

FILTER(dictsort)
{
    PARAMS("dictsort", "case_sensitive", "by", "reverse");
    if (v.t != TV_DICT)
        return tpl_fail(r, IFLOW_EINVAL, "dictsort(): '%s' object is not a mapping", tpl_type_name(v));
    int by_value = 0;
    if (given(p[1])) {
        int key = p[1].t == TV_STR && p[1].s.n == 3 && memcmp(p[1].s.p, "key", 3) == 0;
        by_value = p[1].t == TV_STR && p[1].s.n == 5 && memcmp(p[1].s.p, "value", 5) == 0;
        if (!key && !by_value)
            return tpl_fail(r, IFLOW_EINVAL, "you can only sort by either 'key' or 'value'");
    }
    tv_list *l = tpl_list_new(r, v.d->n);
    tval *keys = l ? tpl_alloc(r, (v.d->n ? v.d->n : 1) * sizeof *keys) : NULL;
    if (!keys)
        return r->rc;
    for (size_t i = 0; i < v.d->n; i++) {
        tval pair;
        IFLOW_TRY(item_pair(r, v.d->k[i], v.d->v[i], &pair));
        IFLOW_TRY(tpl_list_push(r, l, pair));
        IFLOW_TRY(fold(r, by_value ? v.d->v[i] : v.d->k[i], given(p[0]) && tpl_truthy(p[0]), &keys[i]));
    }
    IFLOW_TRY(sort_by(r, l->v, keys, l->n, given(p[2]) && tpl_truthy(p[2])));
    *out = tv_seq(l, 0);
    return 0;
}

FILTER(escape)
{
    NO_PARAMS("escape");
    IFLOW_TRY(tpl_to_str(r, v, &v));
    tpl_buf b = {0};
    int rc = 0;
    size_t run = 0;
    for (size_t i = 0; i < v.s.n && rc == 0; i++) {
        const char *esc = NULL;
        switch (v.s.p[i]) {
        case '&': esc = "&amp;"; break;
        case '<': esc = "&lt;"; break;
        case '>': esc = "&gt;"; break;
        case '"': esc = "&#34;"; break;
        case '\'': esc = "&#39;"; break;
        default: run++; continue;
        }
        rc = tpl_buf_put(r, &b, v.s.p + i - run, run);
        run = 0;
        if (rc == 0)
            rc = tpl_buf_put(r, &b, esc, strlen(esc));
    }
    if (rc == 0)
        rc = tpl_buf_put(r, &b, v.s.p + v.s.n - run, run);
    return str_from_buf(r, &b, rc, out);
}

static int first_or_last(tpl_render *r, tval v, tpl_args *a, int last, tval *out)
{
    NO_PARAMS(last ? "last" : "first");
    tv_list *items;
    IFLOW_TRY(tpl_items(r, v, &items));
    *out = items->n ? items->v[last ? items->n - 1 : 0] : tv_undef("", 0);
    return 0;
}

FILTER(first) { return first_or_last(r, v, a, 0, out); }
FILTER(last) { return first_or_last(r, v, a, 1, out); }

/* Python's float(str): surrounding whitespace allowed, underscores between digits, inf, nan. */
static int parse_float(tpl_render *r, tval s, double *out)
{
    char buf[400];
    tval t = strip(r, s, NULL, 1, 1);
    size_t k = 0;
    if (t.s.n == 0 || t.s.n >= sizeof buf)
        return -1;
    for (size_t i = 0; i < t.s.n; i++) {
        char c = t.s.p[i];
        if (c == '_' && i > 0 && i + 1 < t.s.n && t.s.p[i - 1] >= '0' &&
            t.s.p[i - 1] <= '9' && t.s.p[i + 1] >= '0' && t.s.p[i + 1] <= '9')
            continue;
        if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' || (c | 32) == 'i' ||
              (c | 32) == 'n' || (c | 32) == 'f' || (c | 32) == 't' || (c | 32) == 'y' || (c | 32) == 'a'))
            return -1;
        buf[k++] = c;
    }
    buf[k] = 0;
    char *end;
    errno = 0;
    *out = strtod(buf, &end);
    if (*end || end == buf)
        return -1;
    size_t digits = strspn(buf + (buf[0] == '+' || buf[0] == '-'), "0123456789.eE+-");
    int named = k > digits + (buf[0] == '+' || buf[0] == '-');
    if (named) { /* only inf, infinity and nan, in any case */
        const char *w = buf + (buf[0] == '+' || buf[0] == '-');
        if (strcasecmp(w, "inf") && strcasecmp(w, "infinity") && strcasecmp(w, "nan"))
            return -1;
    }
    return 0;
}

/* Python's int(str, base): whitespace around, a sign, underscores between digits, a prefix
 * matching the base (or any with base 0). */
static int parse_int(tpl_render *r, tval s, long long base, long long *out)
{
    tval t = strip(r, s, NULL, 1, 1);
    const char *p = t.s.p, *end = p + t.s.n;
    int neg = 0;
    if (p < end && (*p == '+' || *p == '-'))
        neg = *p++ == '-';
    if (end - p >= 2 && p[0] == '0') {
        char x = (char)(p[1] | 32);
        int pb = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
        if (pb && (base == pb || base == 0)) {
            base = pb;
            p += 2;
            if (p < end && *p == '_')
                p++;
        }
    }
    if (base == 0)
        base = 10;
    if (base < 2 || base > 36 || p == end)
        return -1;
    unsigned long long v = 0;
    for (const char *q = p; q < end; q++) {
        if (*q == '_' && q > p && q + 1 < end && q[1] != '_')
            continue;
        char c = (char)(*q | 32);
        int d = *q >= '0' && *q <= '9' ? *q - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : 99;
        if (d >= base)
            return -1;
        if (__builtin_mul_overflow(v, (unsigned long long)base, &v) || __builtin_add_overflow(v, (unsigned)d, &v) ||
            v > 9223372036854775808ULL)
            return -2;
    }
    if (!neg && v > 9223372036854775807ULL)
        return -2;
    *out = neg ? (long long)(0 - v) : (long long)v;
    return 0;
}

FILTER(float)
{
    PARAMS("float", "default");
    double d;
    if (v.t == TV_UNDEF) /* Python's float() of an Undefined fails */
        return tpl_type_error(r, "float", v, v);
    if (v.t == TV_FLOAT || is_intlike(v))
        *out = tv_float(fval(v));
    else if (v.t == TV_STR && parse_float(r, v, &d) == 0)
        *out = tv_float(d);
    else
        *out = given(p[0]) ? p[0] : tv_float(0.0);
    return 0;
}

FILTER(int)
{
    PARAMS("int", "default", "base");
    long long base = 10, i = 0;
    double d;
    IFLOW_TRY(int_arg(r, "int", p[1], 10, &base));
    tval def = given(p[0]) ? p[0] : tv_int(0);
    if (v.t == TV_UNDEF) /* Python's int() of an Undefined fails */
        return tpl_type_error(r, "int", v, v);
    if (is_intlike(v)) {
        *out = tv_int(ival(v));
    } else if (v.t == TV_FLOAT || (v.t == TV_STR && parse_int(r, v, base, &i) == -1 && parse_float(r, v, &d) == 0)) {
        d = v.t == TV_FLOAT ? v.f : d;
        if (isnan(d))
            *out = def;
        else if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
            return isinf(d) ? tpl_fail(r, IFLOW_EINVAL, "cannot convert float infinity to integer") : overflow(r);
        else
            *out = tv_int((long long)d);
    } else if (v.t == TV_STR) {
        int rc = parse_int(r, v, base, &i);
        if (rc == -2)
            return overflow(r);
        *out = rc == 0 ? tv_int(i) : def;
    } else {
        *out = def;
    }
    return 0;
}

static int g_dict(tpl_render *r, tpl_args *a, int ns, tval *out);

/* jinja2's format filter: printf-style, value % args (or % kwargs, as a dict) */
FILTER(format)
{
    if (a->n && a->nkw)
        return tpl_fail(r, IFLOW_EINVAL, "format() can't handle positional and keyword arguments at the same time");
    IFLOW_TRY(tpl_to_str(r, v, &v));
    tval arg;
    if (a->nkw) {
        IFLOW_TRY(g_dict(r, a, 0, &arg));
    } else {
        tv_list *l = tpl_list_new(r, (size_t)a->n);
        if (!l)
            return r->rc;
        for (int i = 0; i < a->n; i++)
            IFLOW_TRY(tpl_list_push(r, l, a->v[i]));
        arg = tv_seq(l, 1);
    }
    return tpl_percent_format(r, v, arg, out);
}

FILTER(indent)
{
    PARAMS("indent", "width", "first", "blank");
    tval ind = tv_str("    ", 4);
    if (p[0].t == TV_STR) {
        ind = p[0];
    } else if (given(p[0])) {
        long long w = 4;
        IFLOW_TRY(int_arg(r, "indent", p[0], 4, &w));
        IFLOW_TRY(repeat(r, tv_str(" ", 1), w, &ind));
    }
    int first = given(p[1]) && tpl_truthy(p[1]), blank = given(p[2]) && tpl_truthy(p[2]);
    if (v.t != TV_STR) /* jinja2 appends "\n" to the value itself */
        return v.t == TV_UNDEF ? tpl_type_error(r, "indent", v, v)
                               : tpl_fail(r, IFLOW_EINVAL, "indent(): '%s' is not a string", tpl_type_name(v));
    tv_list *lines;
    tval s;
    IFLOW_TRY(concat(r, v, tv_str("\n", 1), &s)); /* jinja2's quirk for splitlines */
    IFLOW_TRY(splitlines(r, s, 0, &lines));
    tpl_buf b = {0};
    int rc = first ? tpl_buf_put(r, &b, ind.s.p, ind.s.n) : 0;
    for (size_t i = 0; i < lines->n && rc == 0; i++) {
        tval line = lines->v[i];
        if (i)
            rc = tpl_buf_putc(r, &b, '\n');
        if (rc == 0 && i && (blank || line.s.n))
            rc = tpl_buf_put(r, &b, ind.s.p, ind.s.n);
        if (rc == 0)
            rc = tpl_buf_put(r, &b, line.s.p, line.s.n);
    }
    return str_from_buf(r, &b, rc, out);
}

FILTER(items)
{
    NO_PARAMS("items");
    if (v.t == TV_UNDEF)
        return (out->l = tpl_list_new(r, 0)) ? (out->t = TV_LIST, 0) : r->rc;
    if (v.t != TV_DICT)
        return tpl_fail(r, IFLOW_EINVAL, "can only get item pairs from a mapping");
    tv_list *l = tpl_list_new(r, v.d->n);
    if (!l)
        return r->rc;
    for (size_t i = 0; i < v.d->n; i++) {
        tval pair;
        IFLOW_TRY(item_pair(r, v.d->k[i], v.d->v[i], &pair));
        IFLOW_TRY(tpl_list_push(r, l, pair));
    }
    *out = tv_seq(l, 0);
    return 0;
}

FILTER(join)
{
    PARAMS("join", "d", "attribute");
    tv_list *items;
    IFLOW_TRY(tpl_items(r, v, &items));
    tval sep = given(p[0]) ? p[0] : tv_str("", 0);
    IFLOW_TRY(tpl_to_str(r, sep, &sep));
    tpl_buf b = {0};
    int rc = 0;
    for (size_t i = 0; i < items->n && rc == 0; i++) {
        tval item = items->v[i];
        if (i)
            rc = tpl_buf_put(r, &b, sep.s.p, sep.s.n);
        if (rc == 0 && given(p[1]) && p[1].t != TV_NONE)
            rc = attr_path(r, item, p[1], &item);
        if (rc == 0)
            rc = tpl_print(r, &b, item, 0);
    }
    return str_from_buf(r, &b, rc, out);
}

FILTER(length)
{
    NO_PARAMS("length");
    switch (v.t) {
    case TV_STR: *out = tv_int((long long)tpl_utf8_len(r, v.s.p, v.s.n)); return 0;
    case TV_LIST: case TV_TUPLE: *out = tv_int((long long)v.l->n); return 0;
    case TV_DICT: *out = tv_int((long long)v.d->n); return 0;
    case TV_UNDEF: *out = tv_int(0); return 0;
    default: return tpl_fail(r, IFLOW_EINVAL, "object of type '%s' has no len()", tpl_type_name(v));
    }
}

FILTER(list)
{
    NO_PARAMS("list");
    tv_list *items, *l;
    IFLOW_TRY(tpl_items(r, v, &items));
    if (!items->view) {
        *out = tv_seq(items, 0);
        return 0;
    }
    if (!(l = tpl_list_new(r, items->n)))
        return r->rc;
    for (size_t i = 0; i < items->n; i++)
        IFLOW_TRY(tpl_list_push(r, l, items->v[i]));
    *out = tv_seq(l, 0);
    return 0;
}

int tpl_filter(tpl_render *r, int id, const char *name, tval v, tpl_args *a, tval *out);
int tpl_test(tpl_render *r, int id, const char *name, tval v, tpl_args *a, int *res);

/* The arguments from the k-th positional on (the ones a filter or test named by a string gets). */
static tpl_args args_from(const tpl_args *a, int k)
{
    tpl_args rest = *a;
    rest.n = a->n > k ? a->n - k : 0;
    rest.v = a->n > k ? a->v + k : NULL;
    return rest;
}

/* The start of map, select and the like: *out = a new empty list *l, *items = v's items; 0 when
 * v is falsy (the result stays empty: jinja2 looks at nothing else then), < 0 on failure. */
static int list_filter_start(tpl_render *r, tval v, tv_list **l, tv_list **items, tval *out)
{
    if (!(*l = tpl_list_new(r, 0)))
        return r->rc;
    *out = tv_seq(*l, 0);
    if (!tpl_truthy(v))
        return 0;
    IFLOW_TRY(tpl_items(r, v, items));
    return 1;
}

FILTER(map)
{
    tv_list *items, *l;
    int started = list_filter_start(r, v, &l, &items, out);
    if (started <= 0)
        return started;
    if (a->n == 0) { /* map(attribute=..., default=...) */
        PARAMS("map", "attribute", "default");
        if (!given(p[0]))
            return tpl_fail(r, IFLOW_EINVAL, "map() needs a filter name or attribute=");
        for (size_t i = 0; i < items->n; i++) {
            tval x;
            IFLOW_TRY(attr_path(r, items->v[i], p[0], &x));
            if (x.t == TV_UNDEF && given(p[1]))
                x = p[1];
            IFLOW_TRY(tpl_list_push(r, l, x));
        }
    } else {
        if (a->v[0].t != TV_STR)
            return tpl_fail(r, IFLOW_EINVAL, "map(): the filter name must be a string");
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)a->v[0].s.n, a->v[0].s.p);
        int id = tpl_filter_id(a->v[0].s.p, a->v[0].s.n);
        if (id < 0)
            return tpl_fail(r, IFLOW_EINVAL, "no filter named '%s'", iflow_quoten(a->v[0].s.p, a->v[0].s.n));
        tpl_args rest = args_from(a, 1);
        for (size_t i = 0; i < items->n; i++) {
            tval x;
            IFLOW_TRY(tpl_filter(r, id, name, items->v[i], &rest, &x));
            IFLOW_TRY(tpl_list_push(r, l, x));
        }
    }
    *out = tv_seq(l, 0);
    return 0;
}

static int min_or_max(tpl_render *r, tval v, tpl_args *a, int want, tval *out)
{
    PARAMS(want > 0 ? "max" : "min", "case_sensitive", "attribute");
    tv_list *items;
    tval *keys;
    IFLOW_TRY(keyed_items(r, v, p[1], given(p[0]) && tpl_truthy(p[0]), &items, &keys));
    *out = tv_undef("", 0);
    size_t best = 0;
    for (size_t i = 1; i < items->n; i++) {
        int sign;
        IFLOW_TRY(tpl_compare(r, want > 0 ? ">" : "<", keys[i], keys[best], &sign));
        if (sign == want)
            best = i;
    }
    if (items->n)
        *out = items->v[best];
    return 0;
}

FILTER(max) { return min_or_max(r, v, a, 1, out); }
FILTER(min) { return min_or_max(r, v, a, -1, out); }

/* select, reject, selectattr, rejectattr: items whose (attribute's) test is `keep` */
static int select_items(tpl_render *r, tval v, tpl_args *a, int attr, int keep, tval *out)
{
    tv_list *items, *l;
    int started = list_filter_start(r, v, &l, &items, out);
    if (started <= 0)
        return started;
    if (attr && (a->n < 1 || a->v[0].t != TV_STR))
        return tpl_fail(r, IFLOW_EINVAL, "%s() needs an attribute name", keep ? "selectattr" : "rejectattr");
    int id = -1;
    char name[64] = "";
    if (a->n > attr) {
        tval t = a->v[attr];
        if (t.t != TV_STR)
            return tpl_fail(r, IFLOW_EINVAL, "the test name must be a string");
        snprintf(name, sizeof name, "%.*s", (int)t.s.n, t.s.p);
        if ((id = tpl_test_id(t.s.p, t.s.n)) < 0)
            return tpl_fail(r, IFLOW_EINVAL, "no test named '%s'", iflow_quoten(t.s.p, t.s.n));
    }
    tpl_args rest = args_from(a, attr + 1);
    for (size_t i = 0; i < items->n; i++) {
        tval x = items->v[i];
        int res;
        if (attr)
            IFLOW_TRY(attr_path(r, x, a->v[0], &x));
        if (id >= 0)
            IFLOW_TRY(tpl_test(r, id, name, x, &rest, &res));
        else
            res = tpl_truthy(x);
        if (res == keep)
            IFLOW_TRY(tpl_list_push(r, l, items->v[i]));
    }
    *out = tv_seq(l, 0);
    return 0;
}

FILTER(select) { return select_items(r, v, a, 0, 1, out); }
FILTER(reject) { return select_items(r, v, a, 0, 0, out); }
FILTER(selectattr) { return select_items(r, v, a, 1, 1, out); }
FILTER(rejectattr) { return select_items(r, v, a, 1, 0, out); }

FILTER(replace)
{
    PARAMS("replace", "old", "new", "count");
    long long count = -1;
    if (!given(p[0]) || !given(p[1]))
        return tpl_fail(r, IFLOW_EINVAL, "replace() needs the old and the new text");
    IFLOW_TRY(int_arg(r, "replace", p[2], -1, &count));
    IFLOW_TRY(tpl_to_str(r, v, &v));
    IFLOW_TRY(tpl_to_str(r, p[0], &p[0]));
    IFLOW_TRY(tpl_to_str(r, p[1], &p[1]));
    return replace(r, v, p[0], p[1], count, out);
}

FILTER(reverse)
{
    NO_PARAMS("reverse");
    tv_list *items;
    if (v.t == TV_STR) {
        tpl_buf b = {0};
        int rc = 0;
        for (size_t e = v.s.n; e > 0 && rc == 0;) {
            size_t k = prev_cp(v.s.p, 0, e);
            rc = tpl_buf_put(r, &b, v.s.p + k, e - k);
            e = k;
        }
        return str_from_buf(r, &b, rc, out);
    }
    IFLOW_TRY(tpl_items(r, v, &items));
    tv_list *l = tpl_list_new(r, items->n);
    if (!l)
        return r->rc;
    for (size_t i = items->n; i-- > 0;)
        IFLOW_TRY(tpl_list_push(r, l, items->v[i]));
    *out = tv_seq(l, 0);
    return 0;
}

FILTER(round)
{
    PARAMS("round", "precision", "method");
    long long prec = 0;
    IFLOW_TRY(int_arg(r, "round", p[0], 0, &prec));
    int method = 0; /* common, ceil, floor */
    if (given(p[1])) {
        tval m = p[1];
        method = m.t != TV_STR                 ? -1
                 : name_is("common", m.s.p, m.s.n) ? 0
                 : name_is("ceil", m.s.p, m.s.n)   ? 1
                 : name_is("floor", m.s.p, m.s.n)  ? 2
                                                   : -1;
        if (method < 0)
            return tpl_fail(r, IFLOW_EINVAL, "method must be common, ceil or floor");
    }
    if (!is_num(v))
        return tpl_fail(r, IFLOW_EINVAL, "round(): '%s' is not a number", tpl_type_name(v));
    if (prec > 300)
        prec = 300;
    if (prec < -300)
        prec = -300;
    if (method == 0 && is_intlike(v) && prec >= 0) {
        *out = tv_int(ival(v));
        return 0;
    }
    double x = fval(v), scale = pow(10.0, (double)prec);
    if (method == 1 || method == 2) {
        *out = tv_float((method == 1 ? ceil(x * scale) : floor(x * scale)) / scale);
        return 0;
    }
    if (!isfinite(x)) {
        *out = tv_float(x);
        return 0;
    }
    if (prec >= 0) { /* correctly rounded, ties to even, as Python's round() */
        char buf[420];
        snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
        *out = tv_float(strtod(buf, NULL));
    } else {
        *out = tv_float(nearbyint(x / pow(10.0, (double)-prec)) * pow(10.0, (double)-prec));
    }
    if (is_intlike(v))
        *out = tv_int((long long)out->f);
    return 0;
}

FILTER(safe)
{
    NO_PARAMS("safe");
    *out = v;
    return 0;
}

FILTER(sort)
{
    PARAMS("sort", "reverse", "case_sensitive", "attribute");
    tv_list *items;
    tval *keys;
    IFLOW_TRY(keyed_items(r, v, p[2], given(p[1]) && tpl_truthy(p[1]), &items, &keys));
    IFLOW_TRY(sort_by(r, items->v, keys, items->n, given(p[0]) && tpl_truthy(p[0])));
    *out = tv_seq(items, 0);
    return 0;
}

FILTER(string)
{
    NO_PARAMS("string");
    return tpl_to_str(r, v, out);
}

FILTER(sum)
{
    PARAMS("sum", "attribute", "start");
    tv_list *items;
    IFLOW_TRY(tpl_items(r, v, &items));
    *out = given(p[1]) ? p[1] : tv_int(0);
    for (size_t i = 0; i < items->n; i++) {
        tval x = items->v[i];
        if (given(p[0]) && p[0].t != TV_NONE)
            IFLOW_TRY(attr_path(r, x, p[0], &x));
        if (x.t == TV_STR)
            return tpl_fail(r, IFLOW_EINVAL, "unsupported operand types for +: '%s' and 'str'", tpl_type_name(*out));
        IFLOW_TRY(tpl_binop(r, OP_ADD, *out, x, out));
    }
    return 0;
}

/* transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
FILTER(tojson)
{
    PARAMS("tojson", "ensure_ascii", "indent", "separators", "sort_keys");
    tpl_json_opts o = {.item_sep = ", ", .item_sep_n = 2, .key_sep = ": ", .key_sep_n = 2};
    o.ascii = given(p[0]) && tpl_truthy(p[0]);
    o.sort_keys = given(p[3]) && tpl_truthy(p[3]);
    if (given(p[1]) && p[1].t != TV_NONE) {
        tval ind = p[1];
        if (ind.t != TV_STR) {
            long long w = 0;
            IFLOW_TRY(int_arg(r, "tojson", ind, 0, &w));
            IFLOW_TRY(repeat(r, tv_str(" ", 1), w, &ind));
        }
        o.indent = ind.s.p;
        o.indent_n = ind.s.n;
        o.item_sep = ",";
        o.item_sep_n = 1;
    }
    if (given(p[2]) && p[2].t != TV_NONE) {
        tval s = p[2];
        if ((s.t != TV_LIST && s.t != TV_TUPLE) || s.l->n != 2 || s.l->v[0].t != TV_STR || s.l->v[1].t != TV_STR)
            return tpl_fail(r, IFLOW_EINVAL, "tojson(): separators must be two strings");
        o.item_sep = s.l->v[0].s.p;
        o.item_sep_n = s.l->v[0].s.n;
        o.key_sep = s.l->v[1].s.p;
        o.key_sep_n = s.l->v[1].s.n;
    }
    tpl_buf b = {0};
    return str_from_buf(r, &b, tpl_json(r, &b, v, &o, 0), out);
}

FILTER(trim)
{
    PARAMS("trim", "chars");
    IFLOW_TRY(tpl_to_str(r, v, &v));
    if (given(p[0]) && p[0].t != TV_NONE && p[0].t != TV_STR)
        return tpl_fail(r, IFLOW_EINVAL, "trim(): chars must be a string");
    *out = strip(r, v, p[0].t == TV_STR ? &p[0] : NULL, 1, 1);
    return 0;
}

FILTER(unique)
{
    PARAMS("unique", "case_sensitive", "attribute");
    tv_list *items, *l;
    tval *keys;
    IFLOW_TRY(keyed_items(r, v, p[1], given(p[0]) && tpl_truthy(p[0]), &items, &keys));
    if (!(l = tpl_list_new(r, 0)))
        return r->rc;
    tval *seen = tpl_alloc(r, (items->n ? items->n : 1) * sizeof *seen);
    if (!seen)
        return r->rc;
    size_t n_seen = 0;
    for (size_t i = 0; i < items->n; i++) {
        int dup = 0;
        IFLOW_TRY(tpl_hashable(r, keys[i]));
        IFLOW_TRY(tpl_spend(r, n_seen / 16));
        for (size_t j = 0; j < n_seen && !dup; j++)
            if ((dup = tpl_equal(r, seen[j], keys[i])) < 0)
                return dup;
        if (!dup) {
            seen[n_seen++] = keys[i];
            IFLOW_TRY(tpl_list_push(r, l, items->v[i]));
        }
    }
    *out = tv_seq(l, 0);
    return 0;
}

FILTER(wordcount)
{
    NO_PARAMS("wordcount");
    IFLOW_TRY(tpl_to_str(r, v, &v));
    IFLOW_TRY(tpl_spend(r, v.s.n / 64));
    long long words = 0;
    int in_word = 0;
    for (size_t i = 0, len; i < v.s.n; i += len) {
        int32_t c = tpl_utf8_next(v.s.p + i, v.s.n - i, &len);
        int k = c < 0 ? 0 : utf8proc_category(c);
        int w = c == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
                (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
        words += w && !in_word;
        in_word = w;
    }
    *out = tv_int(words);
    return 0;
}

static const struct {
    const char *name;
    filter_fn fn;
} filters[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"batch", NULL}, {"capitalize", f_capitalize}, {"center", f_center},
    {"count", f_length}, {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape},
    {"escape", f_escape}, {"filesizeformat", NULL}, {"first", f_first}, {"float", f_float},
    {"forceescape", f_escape}, {"format", f_format}, {"groupby", NULL}, {"indent", f_indent}, {"int", f_int},
    {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length}, {"list", f_list},
    {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min}, {"pprint", NULL}, {"random", NULL},
    {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
    {"round", f_round}, {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr}, {"slice", NULL},
    {"sort", f_sort}, {"string", f_string}, {"striptags", NULL}, {"sum", f_sum}, {"title", f_title},
    {"tojson", f_tojson}, {"trim", f_trim}, {"truncate", NULL}, {"unique", f_unique}, {"upper", f_upper},
    {"urlencode", NULL}, {"urlize", NULL}, {"wordcount", f_wordcount}, {"wordwrap", NULL}, {"xmlattr", NULL},
};
#define N_FILTERS ((int)(sizeof filters / sizeof *filters))

int tpl_filter_id(const char *p, size_t n)
{
    for (int i = 0; i < N_FILTERS; i++)
        if (name_is(filters[i].name, p, n))
            return i;
    return -1;
}

int tpl_filter(tpl_render *r, int id, const char *name, tval v, tpl_args *a, tval *out)
{
    if (id < 0 || id >= N_FILTERS || !filters[id].fn)
        return tpl_fail(r, IFLOW_EUNSUPPORTED, "the filter '%s' is not supported", name);
    return filters[id].fn(r, v, a, out);
}

/* ---- tests ---------------------------------------------------------------------------------- */

enum {
    T_BOOLEAN, T_CALLABLE, T_DEFINED, T_DIVISIBLEBY, T_EQ, T_ESCAPED, T_EVEN, T_FALSE, T_FILTER, T_FLOAT, T_GE, T_GT,
    T_IN, T_INTEGER, T_ITERABLE, T_LE, T_LOWER, T_LT, T_MAPPING, T_NE, T_NONE, T_NUMBER, T_ODD, T_SAMEAS,
    T_SEQUENCE, T_STRING, T_TEST, T_TRUE, T_UNDEFINED, T_UPPER
};

static const struct {
    const char *name;
    int id;
} tests[] = {
    {"boolean", T_BOOLEAN}, {"callable", T_CALLABLE}, {"defined", T_DEFINED}, {"divisibleby", T_DIVISIBLEBY},
    {"eq", T_EQ}, {"equalto", T_EQ}, {"==", T_EQ}, {"escaped", T_ESCAPED}, {"even", T_EVEN}, {"false", T_FALSE},
    {"filter", T_FILTER}, {"float", T_FLOAT}, {"ge", T_GE}, {">=", T_GE}, {"gt", T_GT}, {"greaterthan", T_GT},
    {">", T_GT}, {"in", T_IN}, {"integer", T_INTEGER}, {"iterable", T_ITERABLE}, {"le", T_LE}, {"<=", T_LE},
    {"lower", T_LOWER}, {"lt", T_LT}, {"lessthan", T_LT}, {"<", T_LT}, {"mapping", T_MAPPING}, {"ne", T_NE},
    {"!=", T_NE}, {"none", T_NONE}, {"number", T_NUMBER}, {"odd", T_ODD}, {"sameas", T_SAMEAS},
    {"sequence", T_SEQUENCE}, {"string", T_STRING}, {"test", T_TEST}, {"true", T_TRUE},
    {"undefined", T_UNDEFINED}, {"upper", T_UPPER},
};
#define N_TESTS ((int)(sizeof tests / sizeof *tests))

int tpl_test_id(const char *p, size_t n)
{
    for (int i = 0; i < N_TESTS; i++)
        if (name_is(tests[i].name, p, n))
            return tests[i].id;
    return -1;
}

/* value % k == want, with Python's arithmetic (so a string fails as in jinja2) */
static int mod_test(tpl_render *r, tval v, tval k, long long want, int *res)
{
    tval m;
    IFLOW_TRY(tpl_binop(r, OP_MOD, v, k, &m));
    int eq = tpl_equal(r, m, tv_int(want));
    if (eq < 0)
        return eq;
    *res = eq;
    return 0;
}

/* str.islower()/isupper(): some cased character, and none of the other case */
static int case_test(tval s, int upper)
{
    int cased = 0;
    for (size_t i = 0, len; i < s.s.n; i += len) {
        int32_t c = tpl_utf8_next(s.s.p + i, s.s.n - i, &len);
        int k = c < 0 ? 0 : utf8proc_category(c);
        if (k == UTF8PROC_CATEGORY_LT || k == (upper ? UTF8PROC_CATEGORY_LL : UTF8PROC_CATEGORY_LU))
            return 0;
        cased |= k == (upper ? UTF8PROC_CATEGORY_LU : UTF8PROC_CATEGORY_LL);
    }
    return cased;
}

int tpl_test(tpl_render *r, int id, const char *name, tval v, tpl_args *a, int *res)
{
    static const char *const one[] = {"other"};
    tval p[1] = {tv_noarg()};
    int takes_one = id == T_DIVISIBLEBY || id == T_EQ || id == T_NE || id == T_LT || id == T_LE || id == T_GT ||
                    id == T_GE || id == T_IN || id == T_SAMEAS;
    if (takes_one) {
        IFLOW_TRY(bind(r, name, a, one, 1, p));
        if (!given(p[0]))
            return tpl_fail(r, IFLOW_EINVAL, "the test '%s' needs an argument", name);
    } else if (a->n || a->nkw) {
        return tpl_fail(r, IFLOW_EINVAL, "the test '%s' takes no arguments", name);
    }
    int sign;
    switch (id) {
    case T_BOOLEAN: *res = v.t == TV_BOOL; return 0;
    case T_CALLABLE: *res = v.t == TV_FUNC || v.t == TV_METHOD || v.t == TV_MACRO || v.t == TV_UNDEF; return 0;
    case T_DEFINED: *res = v.t != TV_UNDEF; return 0;
    case T_UNDEFINED: *res = v.t == TV_UNDEF; return 0;
    case T_DIVISIBLEBY: return mod_test(r, v, p[0], 0, res);
    case T_EVEN: return mod_test(r, v, tv_int(2), 0, res);
    case T_ODD: return mod_test(r, v, tv_int(2), 1, res);
    case T_EQ: case T_NE:
        if ((sign = tpl_equal(r, v, p[0])) < 0)
            return sign;
        *res = id == T_EQ ? sign : !sign;
        return 0;
    case T_LT: case T_LE: case T_GT: case T_GE:
        IFLOW_TRY(tpl_compare(r, name, v, p[0], &sign));
        *res = id == T_LT ? sign < 0 : id == T_LE ? sign <= 0 : id == T_GT ? sign > 0 : sign >= 0;
        return 0;
    case T_IN: return tpl_contains(r, p[0], v, res);
    case T_ESCAPED: *res = 0; return 0;
    case T_FALSE: *res = v.t == TV_BOOL && !v.b; return 0;
    case T_TRUE: *res = v.t == TV_BOOL && v.b; return 0;
    case T_FILTER: *res = v.t == TV_STR && tpl_filter_id(v.s.p, v.s.n) >= 0; return 0;
    case T_TEST: *res = v.t == TV_STR && tpl_test_id(v.s.p, v.s.n) >= 0; return 0;
    case T_FLOAT: *res = v.t == TV_FLOAT; return 0;
    case T_INTEGER: *res = v.t == TV_INT; return 0;
    case T_NUMBER: *res = is_num(v); return 0;
    case T_STRING: *res = v.t == TV_STR; return 0;
    case T_MAPPING: *res = v.t == TV_DICT; return 0;
    case T_NONE: *res = v.t == TV_NONE; return 0;
    case T_ITERABLE: case T_SEQUENCE:
        *res = v.t == TV_STR || v.t == TV_LIST || v.t == TV_TUPLE || v.t == TV_DICT || v.t == TV_UNDEF;
        return 0;
    case T_LOWER: case T_UPPER:
        IFLOW_TRY(tpl_to_str(r, v, &v));
        IFLOW_TRY(tpl_spend(r, v.s.n / 64));
        *res = case_test(v, id == T_UPPER);
        return 0;
    case T_SAMEAS:
        if (v.t != p[0].t)
            *res = 0;
        else if (v.t == TV_NONE || v.t == TV_UNDEF)
            *res = 1;
        else if (v.t == TV_BOOL)
            *res = v.b == p[0].b;
        else if (v.t == TV_INT) /* Python keeps one object for each small int */
            *res = v.i == p[0].i && v.i >= -5 && v.i <= 256;
        else if (v.t == TV_STR)
            *res = v.s.p == p[0].s.p && v.s.n == p[0].s.n;
        else
            *res = v.l == p[0].l;
        return 0;
    default:
        return tpl_fail(r, IFLOW_EUNSUPPORTED, "the test '%s' is not supported", name);
    }
}

/* ---- methods -------------------------------------------------------------------------------- */

enum {
    M_CAPITALIZE, M_COUNT, M_ENDSWITH, M_FIND, M_FORMAT, M_ISALNUM, M_ISALPHA, M_ISDIGIT, M_ISLOWER, M_ISSPACE,
    M_ISUPPER,
    M_JOIN, M_LOWER, M_LSTRIP, M_REPLACE, M_RFIND, M_RSPLIT, M_RSTRIP, M_SPLIT, M_SPLITLINES, M_STARTSWITH,
    M_STRIP, M_TITLE, M_UPPER, M_STR_END_,
    M_GET = M_STR_END_, M_ITEMS, M_KEYS, M_VALUES, M_DICT_END_,
    M_LIST_COUNT = M_DICT_END_, M_LIST_INDEX, M_LIST_END_,
    M_CYCLE = M_LIST_END_
};
static const char *const method_names[] = {
    "capitalize", "count", "endswith", "find", "format", "isalnum", "isalpha", "isdigit", "islower", "isspace",
    "isupper",
    "join", "lower", "lstrip", "replace", "rfind", "rsplit", "rstrip", "split", "splitlines", "startswith",
    "strip", "title", "upper", "get", "items", "keys", "values", "count", "index", "cycle"};

int tpl_method_find(tval obj, const char *p, size_t n)
{
    int list = obj.t == TV_LIST || obj.t == TV_TUPLE;
    int lo = obj.t == TV_STR ? 0 : obj.t == TV_DICT ? M_STR_END_ : list ? M_DICT_END_ : obj.t == TV_LOOP ? M_CYCLE : -1;
    int hi = obj.t == TV_STR ? M_STR_END_ : obj.t == TV_DICT ? M_DICT_END_ : list ? M_LIST_END_ : M_CYCLE + 1;
    for (int i = lo; lo >= 0 && i < hi; i++)
        if (name_is(method_names[i], p, n))
            return i;
    return -1;
}

/* isalnum, isalpha, isdigit, isspace: not empty, and every character of the class */
static int char_class(tval s, int id)
{
    if (!s.s.n)
        return 0;
    for (size_t i = 0, len; i < s.s.n; i += len) {
        int32_t c = tpl_utf8_next(s.s.p + i, s.s.n - i, &len);
        int k = c < 0 ? 0 : utf8proc_category(c);
        int alpha = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        int digit = k == UTF8PROC_CATEGORY_ND;
        int ok = id == M_ISALPHA ? alpha : id == M_ISDIGIT ? digit : id == M_ISSPACE ? c >= 0 && tpl_is_space(c)
                 : alpha || (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
        if (!ok)
            return 0;
    }
    return 1;
}

/* startswith/endswith: a prefix, or a tuple of them */
static int affix(tpl_render *r, tval s, tval *p, int end, int *res)
{
    size_t b, e;
    IFLOW_TRY(sub_range(r, end ? "endswith" : "startswith", s, p[1], p[2], &b, &e));
    tval one[1] = {p[0]}, *cand = one;
    size_t n = 1;
    if (p[0].t == TV_TUPLE) {
        cand = p[0].l->v;
        n = p[0].l->n;
    }
    *res = 0;
    for (size_t i = 0; i < n && !*res; i++) {
        if (cand[i].t != TV_STR)
            return tpl_fail(r, IFLOW_EINVAL, "%s first arg must be str or a tuple of str, not %s",
                            end ? "endswith" : "startswith", tpl_type_name(cand[i]));
        size_t m = cand[i].s.n;
        *res = m <= e - b && memcmp(s.s.p + (end ? e - m : b), cand[i].s.p, m) == 0;
    }
    return 0;
}

static int find_method(tpl_render *r, tval s, tval *p, int id, tval *out)
{
    size_t b = 0, e = 0;
    tval sub = tv_str("", 0);
    IFLOW_TRY(str_arg(r, method_names[id], p[0], &sub));
    IFLOW_TRY(sub_range(r, method_names[id], s, p[1], p[2], &b, &e));
    if (id == M_COUNT) {
        long long count = 0;
        if (!sub.s.n) {
            count = (long long)tpl_utf8_len(r, s.s.p + b, e - b) + 1;
        } else {
            const char *hit;
            for (size_t at = b; (hit = find_bytes(r, s.s.p + at, e - at, sub.s.p, sub.s.n)); count++)
                at = (size_t)(hit - s.s.p) + sub.s.n;
        }
        *out = tv_int(count);
        return 0;
    }
    const char *hit = id == M_FIND ? find_bytes(r, s.s.p + b, e - b, sub.s.p, sub.s.n)
                                   : rfind_bytes(r, s.s.p + b, e - b, sub.s.p, sub.s.n);
    *out = tv_int(hit ? (long long)tpl_utf8_len(r, s.s.p, (size_t)(hit - s.s.p)) : -1);
    return 0;
}

static int join_method(tpl_render *r, tval sep, tval items_v, tval *out)
{
    tv_list *items;
    IFLOW_TRY(tpl_items(r, items_v, &items));
    tpl_buf b = {0};
    int rc = 0;
    for (size_t i = 0; i < items->n && rc == 0; i++) {
        if (items->v[i].t != TV_STR) {
            rc = tpl_fail(r, IFLOW_EINVAL, "sequence item %zu: expected str instance, %s found", i,
                          tpl_type_name(items->v[i]));
            break;
        }
        if (i)
            rc = tpl_buf_put(r, &b, sep.s.p, sep.s.n);
        if (rc == 0)
            rc = tpl_buf_put(r, &b, items->v[i].s.p, items->v[i].s.n);
    }
    return str_from_buf(r, &b, rc, out);
}

static int dict_method(tpl_render *r, const tv_dict *d, int id, tval *p, tval *out)
{
    if (id == M_GET) {
        tval *slot = NULL;
        if (!given(p[0]))
            return tpl_fail(r, IFLOW_EINVAL, "get() needs a key");
        if (p[0].t != TV_LIST && p[0].t != TV_DICT)
            IFLOW_TRY(tpl_dict_find(r, d, p[0], &slot));
        else
            IFLOW_TRY(tpl_hashable(r, p[0]));
        *out = slot ? *slot : given(p[1]) ? p[1] : tv_none();
        return 0;
    }
    tv_list *l = tpl_list_new(r, d->n);
    if (!l)
        return r->rc;
    for (size_t i = 0; i < d->n; i++) {
        tval x = id == M_KEYS ? d->k[i] : d->v[i];
        if (id == M_ITEMS)
            IFLOW_TRY(item_pair(r, d->k[i], d->v[i], &x));
        IFLOW_TRY(tpl_list_push(r, l, x));
    }
    l->view = id == M_KEYS ? "dict_keys" : id == M_VALUES ? "dict_values" : "dict_items";
    *out = tv_seq(l, 0);
    return 0;
}

/* list.count(x), list.index(x) */
static int list_method(tpl_render *r, const tv_list *l, int id, tval x, tval *out)
{
    long long count = 0;
    IFLOW_TRY(tpl_spend(r, l->n / 16));
    for (size_t i = 0; i < l->n; i++) {
        int eq = tpl_equal(r, l->v[i], x);
        if (eq < 0)
            return eq;
        if (eq && id == M_LIST_INDEX) {
            *out = tv_int((long long)i);
            return 0;
        }
        count += eq;
    }
    if (id == M_LIST_INDEX)
        return tpl_fail(r, IFLOW_EINVAL, "index(): the value is not in the list");
    *out = tv_int(count);
    return 0;
}

static int str_method(tpl_render *r, tval s, int id, tval *p, tval *out)
{
    const char *fn = method_names[id];
    long long n = -1;
    int res;
    switch (id) {
    case M_CAPITALIZE: return tpl_change_case(r, s, TPL_CAPITALIZE, out);
    case M_LOWER: return tpl_change_case(r, s, TPL_LOWER, out);
    case M_UPPER: return tpl_change_case(r, s, TPL_UPPER, out);
    case M_TITLE: return tpl_change_case(r, s, TPL_TITLE, out);
    case M_STRIP: case M_LSTRIP: case M_RSTRIP:
        if (given(p[0]) && p[0].t != TV_NONE && p[0].t != TV_STR)
            return tpl_fail(r, IFLOW_EINVAL, "%s arg must be None or str", fn);
        *out = strip(r, s, p[0].t == TV_STR ? &p[0] : NULL, id != M_RSTRIP, id != M_LSTRIP);
        return 0;
    case M_SPLIT: case M_RSPLIT:
        if (given(p[0]) && p[0].t != TV_NONE && p[0].t != TV_STR)
            return tpl_fail(r, IFLOW_EINVAL, "must be str or None, not %s", tpl_type_name(p[0]));
        IFLOW_TRY(int_arg(r, fn, p[1], -1, &n));
        return split(r, s, p[0], n, id == M_RSPLIT, out);
    case M_SPLITLINES: {
        tv_list *l;
        IFLOW_TRY(splitlines(r, s, given(p[0]) && tpl_truthy(p[0]), &l));
        *out = tv_seq(l, 0);
        return 0;
    }
    case M_STARTSWITH: case M_ENDSWITH:
        IFLOW_TRY(affix(r, s, p, id == M_ENDSWITH, &res));
        *out = tv_bool(res);
        return 0;
    case M_FIND: case M_RFIND: case M_COUNT: return find_method(r, s, p, id, out);
    case M_REPLACE:
        IFLOW_TRY(str_arg(r, fn, p[0], &p[0]));
        IFLOW_TRY(str_arg(r, fn, p[1], &p[1]));
        IFLOW_TRY(int_arg(r, fn, p[2], -1, &n));
        return replace(r, s, p[0], p[1], n, out);
    case M_JOIN: return join_method(r, s, p[0], out);
    case M_ISLOWER: case M_ISUPPER:
        IFLOW_TRY(tpl_spend(r, s.s.n / 64));
        *out = tv_bool(case_test(s, id == M_ISUPPER));
        return 0;
    default:
        IFLOW_TRY(tpl_spend(r, s.s.n / 64));
        *out = tv_bool(char_class(s, id));
        return 0;
    }
}

/* The parameters of each method (by name too, though Python takes most only by position). */
static const struct {
    const char *params[3];
    int min;
} method_params[] = {
    [M_STRIP] = {{"chars"}, 0}, [M_LSTRIP] = {{"chars"}, 0}, [M_RSTRIP] = {{"chars"}, 0},
    [M_SPLIT] = {{"sep", "maxsplit"}, 0}, [M_RSPLIT] = {{"sep", "maxsplit"}, 0}, [M_SPLITLINES] = {{"keepends"}, 0},
    [M_STARTSWITH] = {{"prefix", "start", "end"}, 1}, [M_ENDSWITH] = {{"suffix", "start", "end"}, 1},
    [M_FIND] = {{"sub", "start", "end"}, 1}, [M_RFIND] = {{"sub", "start", "end"}, 1},
    [M_COUNT] = {{"sub", "start", "end"}, 1}, [M_REPLACE] = {{"old", "new", "count"}, 2},
    [M_JOIN] = {{"iterable"}, 1}, [M_GET] = {{"key", "default"}, 1}, [M_LIST_COUNT] = {{"value"}, 1},
    [M_LIST_INDEX] = {{"value"}, 1},
};

int tpl_call_method(tpl_render *r, const tpl_method *m, tpl_args *a, tval *out)
{
    int id = m->id;
    if (id == M_CYCLE) {
        if (!a->n || a->nkw)
            return tpl_fail(r, IFLOW_EINVAL, "cycle() needs the items to cycle through");
        *out = a->v[m->self.loop->i % (size_t)a->n];
        return 0;
    }
    if (id == M_FORMAT)
        return tpl_str_format(r, m->self, a, out);
    tval p[3] = {tv_noarg(), tv_noarg(), tv_noarg()};
    int n = 0, min = 0;
    if (id < (int)(sizeof method_params / sizeof *method_params)) {
        while (n < 3 && method_params[id].params[n])
            n++;
        min = method_params[id].min;
    }
    IFLOW_TRY(bind(r, method_names[id], a, method_params[id < (int)(sizeof method_params / sizeof *method_params)
                                                             ? id : 0].params, n, p));
    for (int i = 0; i < min; i++)
        if (!given(p[i]))
            return tpl_fail(r, IFLOW_EINVAL, "%s() needs at least %d argument(s)", method_names[id], min);
    if (id >= M_DICT_END_)
        return list_method(r, m->self.l, id, p[0], out);
    if (id >= M_STR_END_)
        return dict_method(r, m->self.d, id, p, out);
    return str_method(r, m->self, id, p, out);
}

/* ---- global functions ----------------------------------------------------------------------- */

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME, G_CYCLER, G_JOINER, G_LIPSUM };
static const char *const global_names[] = {"range", "namespace", "dict", "raise_exception", "strftime_now",
                                           "cycler", "joiner", "lipsum"};

int tpl_global_id(const char *p, size_t n)
{
    for (int i = 0; i < (int)(sizeof global_names / sizeof *global_names); i++)
        if (name_is(global_names[i], p, n))
            return i;
    return -1;
}

static int g_range(tpl_render *r, tpl_args *a, tval *out)
{
    long long v[3] = {0, 0, 1};
    if (a->nkw || a->n < 1 || a->n > 3)
        return tpl_fail(r, IFLOW_EINVAL, "range() takes 1 to 3 positional arguments");
    for (int i = 0; i < a->n; i++)
        IFLOW_TRY(int_arg(r, "range", a->v[i], 0, &v[a->n == 1 ? 1 : i]));
    if (v[2] == 0)
        return tpl_fail(r, IFLOW_EINVAL, "range() arg 3 must not be zero");
    long double span = v[2] > 0 ? (long double)v[1] - v[0] : (long double)v[0] - v[1];
    long double step = v[2] > 0 ? (long double)v[2] : -(long double)v[2];
    long double count = span > 0 ? (span - 1) / step + 1 : 0;
    if (count > MAX_RANGE)
        return tpl_fail(r, IFLOW_ERANGE, "range too big: the sandbox allows at most %d items", MAX_RANGE);
    tv_list *l = tpl_list_new(r, (size_t)count);
    if (!l)
        return r->rc;
    unsigned long long first = (unsigned long long)v[0], step_u = (unsigned long long)v[2];
    for (unsigned long long k = 0; k < (unsigned long long)count; k++) /* between start and stop: no wrap left */
        IFLOW_TRY(tpl_list_push(r, l, tv_int((long long)(first + k * step_u))));
    return tpl_range_view(r, l, v, out);
}

/* dict(mapping or pairs, name=value...), as namespace() takes them too */
static int g_dict(tpl_render *r, tpl_args *a, int ns, tval *out)
{
    tv_dict *d = tpl_dict_new(r, 0);
    if (!d)
        return r->rc;
    if (a->n > 1)
        return tpl_fail(r, IFLOW_EINVAL, "%s expected at most 1 argument, got %d", ns ? "namespace" : "dict", a->n);
    if (a->n == 1 && a->v[0].t == TV_DICT) {
        for (size_t i = 0; i < a->v[0].d->n; i++)
            IFLOW_TRY(tpl_dict_set(r, d, a->v[0].d->k[i], a->v[0].d->v[i]));
    } else if (a->n == 1) {
        tv_list *pairs;
        IFLOW_TRY(tpl_items(r, a->v[0], &pairs));
        for (size_t i = 0; i < pairs->n; i++) {
            tval pr = pairs->v[i];
            if ((pr.t != TV_LIST && pr.t != TV_TUPLE) || pr.l->n != 2)
                return tpl_fail(r, IFLOW_EINVAL, "dictionary update sequence element #%zu is not a pair", i);
            IFLOW_TRY(tpl_dict_set(r, d, pr.l->v[0], pr.l->v[1]));
        }
    }
    for (int k = 0; k < a->nkw; k++)
        IFLOW_TRY(tpl_dict_set(r, d, a->kwname[k]->lit, a->kw[k]));
    *out = tv_map(d);
    if (ns)
        out->t = TV_NS;
    return 0;
}

static int g_strftime(tpl_render *r, tpl_args *a, tval *out)
{
    static const char *const names[] = {"format"};
    tval p[1];
    IFLOW_TRY(bind(r, "strftime_now", a, names, 1, p));
    if (p[0].t != TV_STR)
        return tpl_fail(r, IFLOW_EINVAL, "strftime_now() needs a format string");
    char *fmt = tpl_alloc(r, p[0].s.n + 1);
    if (!fmt)
        return r->rc;
    memcpy(fmt, p[0].s.p, p[0].s.n);
    fmt[p[0].s.n] = 0;
    time_t now = r->has_now ? (time_t)r->now : time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm))
        return tpl_fail(r, IFLOW_EINVAL, "strftime_now(): the time %lld cannot be represented", (long long)now);
    for (size_t cap = 256; cap <= ((size_t)1 << 20); cap *= 4) {
        char *buf = tpl_alloc(r, cap);
        if (!buf)
            return r->rc;
        size_t n = strftime(buf, cap, fmt, &tm);
        if (n > 0 || !*fmt || cap * 4 > ((size_t)1 << 20)) {
            *out = tv_str(buf, n);
            return 0;
        }
    }
    *out = tv_str("", 0);
    return 0;
}

int tpl_call_global(tpl_render *r, int fn, tpl_args *a, tval *out)
{
    switch (fn) {
    case G_RANGE: return g_range(r, a, out);
    case G_NAMESPACE: return g_dict(r, a, 1, out);
    case G_DICT: return g_dict(r, a, 0, out);
    case G_STRFTIME: return g_strftime(r, a, out);
    case G_RAISE: {
        tval msg = a->n ? a->v[0] : tv_str("", 0);
        IFLOW_TRY(tpl_to_str(r, msg, &msg));
        r->rc = IFLOW_EINVAL;
        return iflow_seterr(IFLOW_EINVAL, "%s: %.*s", r->t->name, (int)(msg.s.n > 800 ? 800 : msg.s.n), msg.s.p);
    }
    default:
        return tpl_fail(r, IFLOW_EUNSUPPORTED, "the function '%s' is not supported", global_names[fn]);
    }
}
