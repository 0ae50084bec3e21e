/*
 * template_text.c -- chat templates (template.h): text as Python's str makes it.
 *
 * Case mapping: upper, lower, capitalize, title and jinja2's title filter, with Unicode's full
 * mappings where one character becomes several (Python's 'ß'.upper() is 'SS': the table below,
 * SpecialCasing's unconditional mappings as of Unicode 14, Python 3.11's) and Greek capital
 * sigma lowered to final sigma at the end of a word; everything else is utf8proc's mapping.
 * Formatting: str.format() (fields by position, number or name, .attr and [key], !r !s, and
 * the format-spec mini-language) and the printf-style `%` behind jinja2's format filter.
 */
#include "template_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "libcore/base/error.h"
#include "libcore/base/quote.h"

/* ---- case mapping --------------------------------------------------------------------------- */

/* Characters whose upper case is several characters: the upper and (when it differs) the title. */
static const struct {
    int32_t cp;
    const char *upper, *title;
} special[] = {
    {0x00df, "SS", "Ss"}, {0x0149, "\312\274N", NULL}, {0x01f0, "J\314\214", NULL},
    {0x0390, "\316\231\314\210\314\201", NULL}, {0x03b0, "\316\245\314\210\314\201", NULL},
    {0x0587, "\324\265\325\222", "\324\265\326\202"}, {0x1e96, "H\314\261", NULL}, {0x1e97, "T\314\210", NULL},
    {0x1e98, "W\314\212", NULL}, {0x1e99, "Y\314\212", NULL}, {0x1e9a, "A\312\276", NULL},
    {0x1f50, "\316\245\314\223", NULL}, {0x1f52, "\316\245\314\223\314\200", NULL},
    {0x1f54, "\316\245\314\223\314\201", NULL}, {0x1f56, "\316\245\314\223\315\202", NULL},
    {0x1f80, "\341\274\210\316\231", "\341\276\210"}, {0x1f81, "\341\274\211\316\231", "\341\276\211"},
    {0x1f82, "\341\274\212\316\231", "\341\276\212"}, {0x1f83, "\341\274\213\316\231", "\341\276\213"},
    {0x1f84, "\341\274\214\316\231", "\341\276\214"}, {0x1f85, "\341\274\215\316\231", "\341\276\215"},
    {0x1f86, "\341\274\216\316\231", "\341\276\216"}, {0x1f87, "\341\274\217\316\231", "\341\276\217"},
    {0x1f88, "\341\274\210\316\231", "\341\276\210"}, {0x1f89, "\341\274\211\316\231", "\341\276\211"},
    {0x1f8a, "\341\274\212\316\231", "\341\276\212"}, {0x1f8b, "\341\274\213\316\231", "\341\276\213"},
    {0x1f8c, "\341\274\214\316\231", "\341\276\214"}, {0x1f8d, "\341\274\215\316\231", "\341\276\215"},
    {0x1f8e, "\341\274\216\316\231", "\341\276\216"}, {0x1f8f, "\341\274\217\316\231", "\341\276\217"},
    {0x1f90, "\341\274\250\316\231", "\341\276\230"}, {0x1f91, "\341\274\251\316\231", "\341\276\231"},
    {0x1f92, "\341\274\252\316\231", "\341\276\232"}, {0x1f93, "\341\274\253\316\231", "\341\276\233"},
    {0x1f94, "\341\274\254\316\231", "\341\276\234"}, {0x1f95, "\341\274\255\316\231", "\341\276\235"},
    {0x1f96, "\341\274\256\316\231", "\341\276\236"}, {0x1f97, "\341\274\257\316\231", "\341\276\237"},
    {0x1f98, "\341\274\250\316\231", "\341\276\230"}, {0x1f99, "\341\274\251\316\231", "\341\276\231"},
    {0x1f9a, "\341\274\252\316\231", "\341\276\232"}, {0x1f9b, "\341\274\253\316\231", "\341\276\233"},
    {0x1f9c, "\341\274\254\316\231", "\341\276\234"}, {0x1f9d, "\341\274\255\316\231", "\341\276\235"},
    {0x1f9e, "\341\274\256\316\231", "\341\276\236"}, {0x1f9f, "\341\274\257\316\231", "\341\276\237"},
    {0x1fa0, "\341\275\250\316\231", "\341\276\250"}, {0x1fa1, "\341\275\251\316\231", "\341\276\251"},
    {0x1fa2, "\341\275\252\316\231", "\341\276\252"}, {0x1fa3, "\341\275\253\316\231", "\341\276\253"},
    {0x1fa4, "\341\275\254\316\231", "\341\276\254"}, {0x1fa5, "\341\275\255\316\231", "\341\276\255"},
    {0x1fa6, "\341\275\256\316\231", "\341\276\256"}, {0x1fa7, "\341\275\257\316\231", "\341\276\257"},
    {0x1fa8, "\341\275\250\316\231", "\341\276\250"}, {0x1fa9, "\341\275\251\316\231", "\341\276\251"},
    {0x1faa, "\341\275\252\316\231", "\341\276\252"}, {0x1fab, "\341\275\253\316\231", "\341\276\253"},
    {0x1fac, "\341\275\254\316\231", "\341\276\254"}, {0x1fad, "\341\275\255\316\231", "\341\276\255"},
    {0x1fae, "\341\275\256\316\231", "\341\276\256"}, {0x1faf, "\341\275\257\316\231", "\341\276\257"},
    {0x1fb2, "\341\276\272\316\231", "\341\276\272\315\205"}, {0x1fb3, "\316\221\316\231", "\341\276\274"},
    {0x1fb4, "\316\206\316\231", "\316\206\315\205"}, {0x1fb6, "\316\221\315\202", NULL},
    {0x1fb7, "\316\221\315\202\316\231", "\316\221\315\202\315\205"}, {0x1fbc, "\316\221\316\231", "\341\276\274"},
    {0x1fc2, "\341\277\212\316\231", "\341\277\212\315\205"}, {0x1fc3, "\316\227\316\231", "\341\277\214"},
    {0x1fc4, "\316\211\316\231", "\316\211\315\205"}, {0x1fc6, "\316\227\315\202", NULL},
    {0x1fc7, "\316\227\315\202\316\231", "\316\227\315\202\315\205"}, {0x1fcc, "\316\227\316\231", "\341\277\214"},
    {0x1fd2, "\316\231\314\210\314\200", NULL}, {0x1fd3, "\316\231\314\210\314\201", NULL},
    {0x1fd6, "\316\231\315\202", NULL}, {0x1fd7, "\316\231\314\210\315\202", NULL},
    {0x1fe2, "\316\245\314\210\314\200", NULL}, {0x1fe3, "\316\245\314\210\314\201", NULL},
    {0x1fe4, "\316\241\314\223", NULL}, {0x1fe6, "\316\245\315\202", NULL},
    {0x1fe7, "\316\245\314\210\315\202", NULL}, {0x1ff2, "\341\277\272\316\231", "\341\277\272\315\205"},
    {0x1ff3, "\316\251\316\231", "\341\277\274"}, {0x1ff4, "\316\217\316\231", "\316\217\315\205"},
    {0x1ff6, "\316\251\315\202", NULL}, {0x1ff7, "\316\251\315\202\316\231", "\316\251\315\202\315\205"},
    {0x1ffc, "\316\251\316\231", "\341\277\274"}, {0xfb00, "FF", "Ff"}, {0xfb01, "FI", "Fi"}, {0xfb02, "FL", "Fl"},
    {0xfb03, "FFI", "Ffi"}, {0xfb04, "FFL", "Ffl"}, {0xfb05, "ST", "St"}, {0xfb06, "ST", "St"},
    {0xfb13, "\325\204\325\206", "\325\204\325\266"}, {0xfb14, "\325\204\324\265", "\325\204\325\245"},
    {0xfb15, "\325\204\324\273", "\325\204\325\253"}, {0xfb16, "\325\216\325\206", "\325\216\325\266"},
    {0xfb17, "\325\204\324\275", "\325\204\325\255"},
};

static const char *special_case(int32_t c, int title)
{
    size_t lo = 0, hi = sizeof special / sizeof *special;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (special[mid].cp == c)
            return title && special[mid].title ? special[mid].title : special[mid].upper;
        if (special[mid].cp < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int is_cased(int32_t c)
{
    int k = c < 0 ? 0 : utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

/* Unicode's Case_Ignorable, near enough: marks, format characters, modifiers, apostrophes. */
static int is_case_ignorable(int32_t c)
{
    if (c == '\'' || c == '.' || c == ':' || c == '^' || c == '`' || c == 0xb7 || c == 0x2018 || c == 0x2019 ||
        c == 0x2024 || c == 0x2027)
        return 1;
    int k = c < 0 ? 0 : utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_ME || k == UTF8PROC_CATEGORY_CF ||
           k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_SK;
}

/* Capital sigma at byte `at` lowers to final sigma after a cased letter and before none. */
static int32_t lower_sigma(tval s, size_t at, size_t len)
{
    size_t i = at, l;
    int32_t c = -1;
    while (i > 0) {
        size_t k = i - 1;
        while (k > 0 && i - k < 4 && ((unsigned char)s.s.p[k] & 0xc0) == 0x80)
            k--;
        c = tpl_utf8_next(s.s.p + k, s.s.n - k, &l);
        i = k;
        if (!is_case_ignorable(c))
            break;
    }
    if (i == at || !is_cased(c))
        return 0x3c3;
    for (i = at + len; i < s.s.n; i += l) {
        c = tpl_utf8_next(s.s.p + i, s.s.n - i, &l);
        if (!is_case_ignorable(c))
            return is_cased(c) ? 0x3c3 : 0x3c2;
    }
    return 0x3c2;
}

static int put_cp(tpl_render *r, tpl_buf *b, int32_t c)
{
    char u[4];
    return tpl_buf_put(r, b, u, tpl_utf8_put(c, u));
}

static int put_upper(tpl_render *r, tpl_buf *b, int32_t c, int title)
{
    const char *sp = special_case(c, title);
    if (sp)
        return tpl_buf_put(r, b, sp, strlen(sp));
    return put_cp(r, b, title ? utf8proc_totitle(c) : utf8proc_toupper(c));
}

static int put_lower(tpl_render *r, tpl_buf *b, tval s, size_t at, size_t len, int32_t c)
{
    if (c == 0x130) /* İ: i and a combining dot */
        return tpl_buf_put(r, b, "i\314\207", 3);
    return put_cp(r, b, c == 0x3a3 ? lower_sigma(s, at, len) : utf8proc_tolower(c));
}

/* The characters of word-start classes for jinja2's title filter: [-\s({\[<] */
static int title_delim(int32_t c)
{
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || (c >= 0 && tpl_is_space(c));
}

int tpl_change_case(tpl_render *r, tval s, int how, tval *out)
{
    tpl_buf b = {0};
    int rc = 0, prev_cased = 0, prev_delim = -1;
    for (size_t i = 0, len; i < s.s.n && rc == 0; i += len) {
        int32_t c = tpl_utf8_next(s.s.p + i, s.s.n - i, &len);
        if (c < 0) {
            rc = tpl_buf_put(r, &b, s.s.p + i, 1);
            continue;
        }
        int up = 0, title = 0; /* else lower */
        switch (how) {
        case TPL_UPPER: up = 1; break;
        case TPL_LOWER: break;
        case TPL_CAPITALIZE: up = title = i == 0; break;
        case TPL_TITLE: /* str.title(): title case after an uncased character */
            up = title = !prev_cased;
            prev_cased = is_cased(c);
            break;
        default: { /* each run of word or of delimiters: its first character upper, the rest lower */
            int d = title_delim(c);
            up = d != prev_delim;
            prev_delim = d;
        }
        }
        rc = up ? put_upper(r, &b, c, title) : put_lower(r, &b, s, i, len, c);
    }
    if (rc < 0) {
        tpl_buf_free(r, &b);
        return rc;
    }
    return tpl_buf_take(r, &b, out);
}

/* ---- format specs --------------------------------------------------------------------------- */

typedef struct {
    int32_t fill;
    char align, sign, group, type; /* 0 when not given */
    int alt, zero;
    long long width, prec; /* prec -1: not given */
} fspec;

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static const char *read_number(const char *p, const char *end, long long *out)
{
    long long v = 0;
    for (; p < end && is_digit(*p); p++)
        v = v < 100000000 ? v * 10 + (*p - '0') : v;
    *out = v;
    return p;
}

/* [[fill]align][sign][z][#][0][width][,|_][.precision][type] */
static int parse_spec(const char *p, size_t n, fspec *f)
{
    const char *end = p + n;
    *f = (fspec){.fill = ' ', .prec = -1};
    size_t len = 0;
    int32_t c = n ? tpl_utf8_next(p, n, &len) : 0;
    if (n > len && strchr("<>=^", p[len]) && p[len]) {
        f->fill = c;
        f->align = p[len];
        p += len + 1;
    } else if (p < end && strchr("<>=^", *p) && *p) {
        f->align = *p++;
    }
    if (p < end && (*p == '+' || *p == '-' || *p == ' '))
        f->sign = *p++;
    if (p < end && *p == 'z')
        p++;
    if (p < end && *p == '#') {
        f->alt = 1;
        p++;
    }
    if (p < end && *p == '0') {
        f->zero = 1;
        p++;
    }
    p = read_number(p, end, &f->width);
    if (p < end && (*p == ',' || *p == '_'))
        f->group = *p++;
    if (p < end && *p == '.') {
        if (++p == end || !is_digit(*p))
            return -1;
        p = read_number(p, end, &f->prec);
    }
    if (p < end)
        f->type = *p++;
    return p == end ? 0 : -1;
}

static int is_num(tval v) { return v.t == TV_BOOL || v.t == TV_INT || v.t == TV_FLOAT; }

/* The digits of |i| in a base, into buf (at least 72 bytes); their count. */
static int int_digits(long long i, int base, int upper, char *buf)
{
    unsigned long long u = i < 0 ? 0 - (unsigned long long)i : (unsigned long long)i;
    char tmp[72];
    int n = 0;
    do {
        int d = (int)(u % (unsigned)base);
        tmp[n++] = (char)(d < 10 ? '0' + d : (upper ? 'A' : 'a') + d - 10);
        u /= (unsigned)base;
    } while (u);
    for (int k = 0; k < n; k++)
        buf[k] = tmp[n - 1 - k];
    buf[n] = 0;
    return n;
}

/* A float by its type (e f g %, and none: repr, or %g keeping a decimal point). */
static void float_text(double x, const fspec *f, char *buf, size_t size)
{
    double a = fabs(x);
    long long prec = f->prec < 0 ? 6 : f->prec > 300 ? 300 : f->prec;
    char t = f->type ? f->type : 'r';
    if (t == 'r' && f->prec >= 0)
        t = 'q';
    switch (t) {
    case 'r': tpl_float_repr(a, buf); break;
    case '%': snprintf(buf, size - 1, "%.*f", (int)prec, a * 100); strcat(buf, "%"); break;
    case 'q':
        snprintf(buf, size, "%.*g", (int)(prec ? prec : 1), a);
        if (!strpbrk(buf, ".eni"))
            strcat(buf, ".0");
        break;
    default: {
        char fmt[8];
        snprintf(fmt, sizeof fmt, "%%%s.*%c", f->alt ? "#" : "", t == 'n' ? 'g' : t);
        snprintf(buf, size, fmt, (int)prec, a);
    }
    }
}

/* Separators every 3 digits of the integer part (every 4 for binary, octal and hex). */
static void group_digits(char *body, char sep, int every)
{
    size_t n = strspn(body, "0123456789abcdefABCDEF");
    if (strchr(body, 'e') && every == 3)
        n = strspn(body, "0123456789");
    char tmp[1024];
    size_t k = 0;
    for (size_t i = 0; i < n && k + 2 < sizeof tmp; i++) {
        if (i && (n - i) % (size_t)every == 0)
            tmp[k++] = sep;
        tmp[k++] = body[i];
    }
    snprintf(tmp + k, sizeof tmp - k, "%s", body + n);
    strcpy(body, tmp);
}

static int pad(tpl_render *r, tpl_buf *b, const fspec *f, long long n)
{
    char u[4];
    size_t len = tpl_utf8_put(f->fill, u);
    for (long long i = 0; i < n; i++)
        IFLOW_TRY(tpl_buf_put(r, b, u, len));
    return 0;
}

/* prefix (sign, 0x) and body padded to the width as the spec aligns them */
static int put_padded(tpl_render *r, tpl_buf *b, const fspec *f, const char *prefix, const char *body, size_t body_n,
                      char def_align)
{
    long long len = (long long)(strlen(prefix) + tpl_utf8_len(r, body, body_n));
    long long fill = f->width > len ? f->width - len : 0;
    if (fill > (long long)IFLOW_TEMPLATE_MAX_OUTPUT)
        return tpl_fail(r, IFLOW_ERANGE, "a format width over %zu MiB", IFLOW_TEMPLATE_MAX_OUTPUT >> 20);
    char align = f->align ? f->align : def_align;
    long long before = align == '>' ? fill : align == '^' ? fill / 2 : 0, after = align == '=' ? 0 : fill - before;
    IFLOW_TRY(pad(r, b, f, before));
    IFLOW_TRY(tpl_buf_put(r, b, prefix, strlen(prefix)));
    if (align == '=')
        IFLOW_TRY(pad(r, b, f, fill));
    IFLOW_TRY(tpl_buf_put(r, b, body, body_n));
    return pad(r, b, f, after);
}

/* One value by a spec. percent: printf-style rules (%d takes floats, %s is str(), %r repr()). */
static int format_value(tpl_render *r, tpl_buf *b, tval v, fspec f, int percent)
{
    char t = f.type;
    if (f.zero && !f.align) {
        f.fill = '0';
        f.align = '=';
    }
    if (t == 'r' || t == 'a' || t == 's' || (!t && !is_num(v)) || (!t && v.t == TV_BOOL && !f.width && !f.sign)) {
        tval s;
        if (t == 'r' || t == 'a') {
            tpl_buf rb = {0};
            int rc = tpl_print(r, &rb, v, 1);
            if (rc < 0) {
                tpl_buf_free(r, &rb);
                return rc;
            }
            IFLOW_TRY(tpl_buf_take(r, &rb, &s));
        } else {
            IFLOW_TRY(tpl_to_str(r, v, &s));
        }
        size_t n = s.s.n, len;
        if (f.prec >= 0) { /* at most prec characters */
            n = 0;
            for (long long k = 0; k < f.prec && n < s.s.n; k++, n += len)
                tpl_utf8_next(s.s.p + n, s.s.n - n, &len);
        }
        if (f.align == '=')
            return tpl_fail(r, IFLOW_EINVAL, "'=' alignment not allowed in string format specifier");
        return put_padded(r, b, &f, "", s.s.p, n, '<');
    }
    if (t == 'c') {
        char u[4];
        if (v.t == TV_STR && tpl_utf8_len(r, v.s.p, v.s.n) == 1)
            return put_padded(r, b, &f, "", v.s.p, v.s.n, '<');
        if (v.t != TV_INT || v.i < 0 || v.i > 0x10ffff)
            return tpl_fail(r, IFLOW_EINVAL, "%%c requires an int in range(0x110000) or a single character");
        return put_padded(r, b, &f, "", u, tpl_utf8_put((int32_t)v.i, u), '<');
    }
    if (!is_num(v))
        return tpl_fail(r, IFLOW_EINVAL, "format: a number is required, not %s", tpl_type_name(v));
    int int_type = t == 0 || strchr("dinuxXob", t);
    if (!t && v.t == TV_FLOAT)
        int_type = 0;
    char body[1024], prefix[8] = ""; /* %.300f of 1e308 is 610 characters */
    int neg;
    if (int_type) {
        if (v.t == TV_FLOAT && !percent)
            return tpl_fail(r, IFLOW_EINVAL, "unknown format code '%c' for object of type 'float'", t);
        if (v.t == TV_FLOAT && !(v.f > -9.2e18 && v.f < 9.2e18))
            return tpl_fail(r, IFLOW_EINVAL, "cannot convert float %s to integer", isnan(v.f) ? "NaN" : "infinity");
        long long i = v.t == TV_FLOAT ? (long long)v.f : v.t == TV_BOOL ? v.b : v.i;
        int base = t == 'x' || t == 'X' ? 16 : t == 'o' ? 8 : t == 'b' ? 2 : 10;
        neg = i < 0;
        int_digits(i, base, t == 'X', body);
        if (f.group)
            group_digits(body, f.group, base == 10 ? 3 : 4);
        if (f.alt && base != 10)
            snprintf(prefix, sizeof prefix, "0%c", t);
    } else {
        if (!strchr("eEfFgGn%", t ? t : 'e'))
            return tpl_fail(r, IFLOW_EINVAL, "unknown format code '%c' for a number", t);
        double x = v.t == TV_FLOAT ? v.f : v.t == TV_BOOL ? v.b : (double)v.i;
        neg = signbit(x) && !isnan(x);
        float_text(x, &f, body, sizeof body);
        if (f.group)
            group_digits(body, f.group, 3);
    }
    char sign[2] = {neg ? '-' : f.sign == '+' || f.sign == ' ' ? f.sign : 0, 0};
    char full[12];
    snprintf(full, sizeof full, "%s%s", sign, prefix);
    return put_padded(r, b, &f, full, body, strlen(body), '>');
}

/* ---- str.format ----------------------------------------------------------------------------- */

/* The value of a field name: a position (or the next one), a keyword, then .attr and [key]. */
static int field_value(tpl_render *r, const char *p, const char *end, tpl_args *a, int *next, tval *out)
{
    const char *q = p;
    while (q < end && *q != '.' && *q != '[')
        q++;
    if (q == p || is_digit(*p)) {
        long long i = *next;
        if (q == p) {
            if (*next < 0)
                return tpl_fail(r, IFLOW_EINVAL, "cannot switch from manual field numbering to automatic");
            (*next)++;
        } else {
            if (*next > 0)
                return tpl_fail(r, IFLOW_EINVAL, "cannot switch from automatic field numbering to manual");
            *next = -1;
            read_number(p, q, &i);
        }
        if (i >= a->n)
            return tpl_fail(r, IFLOW_EINVAL, "replacement index %lld out of range for positional args tuple", i);
        *out = a->v[i];
    } else {
        int k = tpl_kwarg(a, p, (size_t)(q - p));
        if (k < 0)
            return tpl_fail(r, IFLOW_EINVAL, "no argument named '%s' to format", iflow_quoten(p, (size_t)(q - p)));
        *out = a->kw[k];
    }
    while (q < end) {
        const char *s = ++q;
        if (q[-1] == '.') {
            while (q < end && *q != '.' && *q != '[')
                q++;
            IFLOW_TRY(tpl_getattr(r, *out, s, (size_t)(q - s), out));
            continue;
        }
        while (q < end && *q != ']')
            q++;
        if (q == end)
            return tpl_fail(r, IFLOW_EINVAL, "missing ']' in format string");
        long long i;
        int digits = q > s && read_number(s, q, &i) == q;
        IFLOW_TRY(tpl_getitem(r, *out, digits ? tv_int(i) : tv_str(s, (size_t)(q - s)), out));
        q++;
    }
    return 0;
}

static int format_field(tpl_render *r, tpl_buf *b, const char *p, const char *end, tpl_args *a, int *next)
{
    const char *conv = memchr(p, '!', (size_t)(end - p)), *colon = memchr(p, ':', (size_t)(end - p));
    if (conv && colon && conv > colon)
        conv = NULL;
    const char *name_end = conv ? conv : colon ? colon : end;
    tval v;
    fspec f = {.fill = ' ', .prec = -1};
    IFLOW_TRY(field_value(r, p, name_end, a, next, &v));
    if (conv && (conv + 2 != (colon ? colon : end) || !conv[1] || !strchr("rsa", conv[1])))
        return tpl_fail(r, IFLOW_EINVAL, "a format conversion must be !r, !s or !a");
    if (colon && parse_spec(colon + 1, (size_t)(end - colon - 1), &f) < 0)
        return tpl_fail(r, IFLOW_EINVAL, "invalid format specifier '%s'",
                        iflow_quoten(colon + 1, (size_t)(end - colon - 1)));
    if (conv) {
        tval s;
        fspec sf = {.type = conv[1] == 's' ? 's' : 'r', .fill = ' ', .prec = -1};
        tpl_buf cb = {0};
        int rc = format_value(r, &cb, v, sf, 0);
        if (rc < 0) {
            tpl_buf_free(r, &cb);
            return rc;
        }
        IFLOW_TRY(tpl_buf_take(r, &cb, &s));
        v = s;
    }
    return format_value(r, b, v, f, 0);
}

int tpl_str_format(tpl_render *r, tval fmt, tpl_args *a, tval *out)
{
    tpl_buf b = {0};
    int rc = 0, next = 0;
    const char *p = fmt.s.p, *end = p + fmt.s.n;
    while (p < end && rc == 0) {
        const char *brace = p;
        while (brace < end && *brace != '{' && *brace != '}')
            brace++;
        rc = tpl_buf_put(r, &b, p, (size_t)(brace - p));
        if (rc < 0 || brace == end)
            break;
        if (brace + 1 < end && brace[1] == *brace) { /* {{ or }} */
            rc = tpl_buf_put(r, &b, brace, 1);
            p = brace + 2;
            continue;
        }
        if (*brace == '}') {
            rc = tpl_fail(r, IFLOW_EINVAL, "single '}' encountered in format string");
            break;
        }
        const char *close = brace + 1;
        while (close < end && *close != '}' && *close != '{')
            close++;
        if (close == end || *close == '{') {
            rc = tpl_fail(r, IFLOW_EINVAL, close == end ? "expected '}' before end of string"
                                                        : "nested format fields are not supported");
            break;
        }
        rc = format_field(r, &b, brace + 1, close, a, &next);
        p = close + 1;
    }
    if (rc < 0) {
        tpl_buf_free(r, &b);
        return rc;
    }
    return tpl_buf_take(r, &b, out);
}

/* ---- printf-style % ------------------------------------------------------------------------- */

/* The right side of fmt % x as Python takes it: a tuple's items, or x alone. A dict also gives
 * %(name)s its values; with a value Python sees as a mapping, arguments may be left unused. */
typedef struct {
    const tval *v;
    size_t n, next;
    const tv_dict *map;
    int loose;
} pargs;

/* One %-conversion at p (after the %): its spec, and its value from the arguments. */
static const char *percent_spec(tpl_render *r, const char *p, const char *end, pargs *a, tval *v, fspec *f,
                                int *rc)
{
    *f = (fspec){.fill = ' ', .prec = -1};
    *rc = 0;
    int keyed = p < end && *p == '(';
    if (keyed) { /* %(name)s */
        const char *close = memchr(p, ')', (size_t)(end - p));
        tval *slot = close && a->map ? tpl_dict_find_str(r, a->map, p + 1, (size_t)(close - p - 1)) : NULL;
        if (!slot) {
            *rc = tpl_fail(r, IFLOW_EINVAL, !close ? "incomplete format key" : !a->map ? "format requires a mapping"
                                                                                      : "format key not given");
            return end;
        }
        *v = *slot;
        p = close + 1;
    }
    for (; p < end && *p && strchr("#0- +", *p); p++) {
        if (*p == '#')
            f->alt = 1;
        else if (*p == '0')
            f->zero = 1;
        else if (*p == '-')
            f->align = '<';
        else
            f->sign = *p;
    }
    if (f->align == '<')
        f->zero = 0;
    p = read_number(p, end, &f->width);
    if (p < end && *p == '.')
        p = read_number(p + 1, end, &f->prec);
    if (p == end) {
        *rc = tpl_fail(r, IFLOW_EINVAL, "incomplete format");
        return end;
    }
    f->type = *p == 'i' || *p == 'u' ? 'd' : *p;
    if (!*p || !strchr("diouxXeEfFgGcrsa", f->type)) {
        *rc = tpl_fail(r, IFLOW_EINVAL, "unsupported format character '%c'", *p);
        return end;
    }
    if (!keyed) {
        if (a->next >= a->n) {
            *rc = tpl_fail(r, IFLOW_EINVAL, "not enough arguments for format string");
            return end;
        }
        *v = a->v[a->next++];
    }
    return p + 1;
}

/* fmt % arg */
int tpl_percent_format(tpl_render *r, tval fmt, tval arg, tval *out)
{
    pargs a = {.v = &arg, .n = 1};
    if (arg.t == TV_TUPLE) {
        a.v = arg.l->v;
        a.n = arg.l->n;
    } else {
        a.map = arg.t == TV_DICT ? arg.d : NULL;
        a.loose = arg.t == TV_DICT || arg.t == TV_LIST || arg.t == TV_UNDEF; /* they have __getitem__ */
    }
    tpl_buf b = {0};
    int rc = 0;
    const char *p = fmt.s.p, *end = p + fmt.s.n;
    while (p < end && rc == 0) {
        const char *pc = memchr(p, '%', (size_t)(end - p));
        rc = tpl_buf_put(r, &b, p, pc ? (size_t)(pc - p) : (size_t)(end - p));
        if (!pc || rc < 0)
            break;
        if (pc + 1 < end && pc[1] == '%') {
            rc = tpl_buf_putc(r, &b, '%');
            p = pc + 2;
            continue;
        }
        tval v;
        fspec f;
        p = percent_spec(r, pc + 1, end, &a, &v, &f, &rc);
        if (rc == 0 && (f.type == 'd' || f.type == 'o' || f.type == 'x' || f.type == 'X') && !is_num(v))
            rc = tpl_fail(r, IFLOW_EINVAL, "%%%c format: a number is required, not %s", f.type, tpl_type_name(v));
        if (rc == 0)
            rc = format_value(r, &b, v, f, 1);
    }
    if (rc == 0 && !a.loose && a.next < a.n)
        rc = tpl_fail(r, IFLOW_EINVAL, "not all arguments converted during string formatting");
    if (rc < 0) {
        tpl_buf_free(r, &b);
        return rc;
    }
    return tpl_buf_take(r, &b, out);
}
