/*
 * template_parse.c -- chat templates (template.h): the lexer and the parser.
 *
 * The lexer follows jinja2's (lexer.py) with trim_blocks and lstrip_blocks on: text up to the
 * first {{, {% or {#; `-` after an opening strips the whitespace before it, `+` keeps it,
 * otherwise a block or comment tag alone on its line takes the line's indentation with it;
 * `-` before a closing strips the whitespace after it, otherwise %} and #} take one newline
 * ({% raw %} excepted). Inside a tag: names, numbers, strings with Python's escapes, operators
 * (an end of tag counts only outside brackets). It makes a list of tokens.
 * The parser follows jinja2's (parser.py), with its precedence: conditional, or, and, not,
 * comparisons, + -, ~, * / // %, **, unary - +, then postfix (.attr, [item], calls), filters
 * and tests. It builds the tree of template_impl.h in the template's arena, every node no
 * deeper than IFLOW_TEMPLATE_MAX_DEPTH, and then checks filter and test names where jinja2 does.
 */
#include "template_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libcore/base/error.h"
#include "libcore/base/quote.h"

/* ---- tokens --------------------------------------------------------------------------------- */

enum { K_DATA, K_VBEGIN, K_VEND, K_BBEGIN, K_BEND, K_NAME, K_STR, K_INT, K_FLOAT, K_OP, K_EOF };

enum {
    O_FLOORDIV, O_POW, O_EQ, O_NE, O_GE, O_LE, /* two characters, first */
    O_ADD, O_SUB, O_DIV, O_MUL, O_MOD, O_TILDE, O_LBRACKET, O_RBRACKET, O_LPAREN, O_RPAREN, O_LBRACE,
    O_RBRACE, O_GT, O_LT, O_ASSIGN, O_DOT, O_COLON, O_PIPE, O_COMMA, O_SEMI
};
static const char *const op_text[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                      "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
#define N_OPS ((int)(sizeof op_text / sizeof *op_text))

typedef struct {
    uint8_t kind, op;
    uint32_t pos;
    tval v; /* K_DATA, K_STR: the text; K_NAME: the name; K_INT, K_FLOAT: the number */
} ttok;

typedef struct {
    iflow_template *t;
    const char *s;
    size_t n;
    ttok *tok;
    size_t ntok, cap;
    size_t i;  /* the current token */
    int depth; /* the parser's own recursion */
    int loops; /* loops around the statement being parsed (break and continue) */
    const char *const *ends; /* the end tags the innermost body waits for */
    int rc;
} tparser;

static int perr(tparser *P, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int perr(tparser *P, size_t pos, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    tpl_where(P->t, pos, &line, &col);
    return P->rc = iflow_seterr(IFLOW_EFORMAT, "%s line %d, column %d: %s", P->t->name, line, col, msg);
}

static void *palloc(tparser *P, size_t n)
{
    void *p = tpl_arena_alloc(&P->t->a, n);
    if (!p)
        P->rc = iflow_seterr(IFLOW_ENOMEM, "%s: out of memory", P->t->name);
    return p;
}

static int emit(tparser *P, int kind, int op, size_t pos, tval v)
{
    if (P->ntok == P->cap) {
        size_t cap = P->cap ? 2 * P->cap : 256;
        ttok *nt = realloc(P->tok, cap * sizeof *nt);
        if (!nt)
            return P->rc = iflow_seterr(IFLOW_ENOMEM, "%s: out of memory", P->t->name);
        P->tok = nt;
        P->cap = cap;
    }
    P->tok[P->ntok++] = (ttok){.kind = (uint8_t)kind, .op = (uint8_t)op, .pos = (uint32_t)pos, .v = v};
    return 0;
}

/* ---- lexer: whitespace ---------------------------------------------------------------------- */

/* Length of the Python whitespace character at s[i], 0 if there is none. */
static size_t space_at(const char *s, size_t n, size_t i)
{
    size_t len;
    int32_t c = tpl_utf8_next(s + i, n - i, &len);
    return c >= 0 && tpl_is_space(c) ? len : 0;
}

static size_t skip_space(const char *s, size_t n, size_t i)
{
    for (size_t k; i < n && (k = space_at(s, n, i)); i += k)
        ;
    return i;
}

/* Where the whitespace that ends s[start, end) begins (Python's rstrip). */
static size_t rstrip_space(const char *s, size_t start, size_t end)
{
    while (end > start) {
        size_t back = 1; /* the start of the character that ends here */
        while (back < 4 && end - back > start && ((unsigned char)s[end - back] & 0xc0) == 0x80)
            back++;
        if (space_at(s, end, end - back) != back)
            break;
        end -= back;
    }
    return end;
}

/* lstrip_blocks: the text before a block or comment tag loses the indentation of the tag's line
 * when only whitespace stands between the line's start (or a line that began the text) and the tag. */
static size_t lstrip_line(const char *s, size_t start, size_t end, int line_starting)
{
    size_t l = end;
    while (l > start && s[l - 1] != '\n')
        l--;
    if (l == start && !line_starting)
        return end;
    if (l == end || skip_space(s, end, l) != end)
        return end;
    return l;
}

/* ---- lexer: inside tags --------------------------------------------------------------------- */

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_name_start(unsigned char c) { return c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z') || c >= 0x80; }

/* (\d+_)*\d+ from i: its end, or i */
static size_t digits_us(const char *s, size_t n, size_t i)
{
    size_t j = i;
    while (j < n && is_digit(s[j])) {
        while (j < n && is_digit(s[j]))
            j++;
        if (j + 1 < n && s[j] == '_' && is_digit(s[j + 1]))
            j++;
    }
    return j;
}

/* jinja2's float_re at i: the end of the float, or i */
static size_t float_end(const char *s, size_t n, size_t i)
{
    if (i > 0 && s[i - 1] == '.')
        return i;
    size_t a = digits_us(s, n, i);
    if (a == i)
        return i;
    size_t b = a;
    if (a + 1 < n && s[a] == '.' && is_digit(s[a + 1]))
        b = digits_us(s, n, a + 1);
    if (b < n && (s[b] | 32) == 'e') {
        size_t e = b + 1;
        if (e < n && (s[e] == '+' || s[e] == '-'))
            e++;
        size_t f = digits_us(s, n, e);
        if (f > e)
            return f;
    }
    return b > a ? b : i;
}

static int digit_value(char c)
{
    char l = (char)(c | 32);
    return is_digit(c) ? c - '0' : l >= 'a' && l <= 'z' ? l - 'a' + 10 : 99;
}

/* (_?D)* in the base from i: its end */
static size_t int_digits(const char *s, size_t n, size_t i, int base)
{
    for (;;) {
        size_t k = i < n && s[i] == '_' ? i + 1 : i;
        if (k >= n || digit_value(s[k]) >= base)
            return i;
        i = k + 1;
    }
}

/* A number at *pos: jinja2's float_re first, then its integer_re (0b, 0o, 0x, decimal, zeros). */
static int lex_number(tparser *P, size_t *pos)
{
    const char *s = P->s;
    size_t n = P->n, i = *pos, end = float_end(s, n, i), k = 0;
    if (end > i) {
        char buf[128];
        for (size_t j = i; j < end && k + 1 < sizeof buf; j++)
            if (s[j] != '_')
                buf[k++] = s[j];
        buf[k] = 0;
        *pos = end;
        return emit(P, K_FLOAT, 0, i, tv_float(strtod(buf, NULL)));
    }
    int base = 10;
    size_t from = i;
    char x = i + 1 < n && s[i] == '0' ? (char)(s[i + 1] | 32) : 0;
    if (x == 'b' || x == 'o' || x == 'x') {
        base = x == 'b' ? 2 : x == 'o' ? 8 : 16;
        end = int_digits(s, n, i + 2, base);
        if (end > i + 2)
            from = i + 2;
        else
            base = 10;
    }
    if (base == 10 && s[i] != '0') {
        end = int_digits(s, n, i + 1, 10);
    } else if (base == 10) { /* 0(_?0)* */
        for (end = i + 1; end < n && (s[end] == '0' || (s[end] == '_' && end + 1 < n && s[end + 1] == '0'));)
            end += s[end] == '_' ? 2 : 1;
    }
    unsigned long long v = 0;
    for (size_t j = from; j < end; j++) {
        if (s[j] == '_')
            continue;
        if (__builtin_mul_overflow(v, (unsigned)base, &v) ||
            __builtin_add_overflow(v, (unsigned)digit_value(s[j]), &v) || v > 9223372036854775807ULL)
            return perr(P, i, "integer %s is too large (integers are 64-bit here)", iflow_quoten(s + i, end - i));
    }
    *pos = end;
    return emit(P, K_INT, 0, i, tv_int((long long)v));
}

static int hexval(const char *s, size_t n, int digits, int32_t *out)
{
    int32_t v = 0;
    if ((size_t)digits > n)
        return -1;
    for (int i = 0; i < digits; i++) {
        char c = (char)(s[i] | 32);
        int d = is_digit(s[i]) ? s[i] - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

/* The value of a string literal's body s[0, n): Python's escapes (decode("unicode-escape") of the
 * text with its non-ASCII characters written as \x, \u or \U escapes, as jinja2 does). */
static int unescape(tparser *P, size_t at, const char *s, size_t n, tval *out)
{
    char *o = palloc(P, 2 * n + 16), *q = o; /* "\" and a character of k bytes can become 2k + 2 */
    if (!o)
        return P->rc;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\' || i + 1 == n) {
            *q++ = s[i++];
            continue;
        }
        char c = s[i + 1];
        int32_t cp = -1;
        size_t used = 2;
        switch (c) {
        case '\n': break;
        case '\\': case '\'': case '"': cp = c; break;
        case 'a': cp = 7; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        case 'v': cp = 11; break;
        case 'x': case 'u': case 'U': {
            int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            if (hexval(s + i + 2, n - i - 2, digits, &cp) < 0)
                return perr(P, at, "truncated \\%cXX escape in a string", c);
            if (cp > 0x10ffff || cp < 0)
                return perr(P, at, "illegal Unicode character in a string");
            used = 2 + (size_t)digits;
            break;
        }
        case 'N':
            return perr(P, at, "\\N{...} escapes are not supported");
        default:
            if (c >= '0' && c <= '7') {
                cp = 0;
                for (used = 1; used < 4 && i + used < n && s[i + used] >= '0' && s[i + used] <= '7'; used++)
                    cp = cp * 8 + (s[i + used] - '0');
            } else if ((unsigned char)c >= 0x80) { /* a backslash before an escape Python wrote itself */
                size_t len;
                int32_t u = tpl_utf8_next(s + i + 1, n - i - 1, &len);
                *q++ = '\\';
                if (u < 0)
                    u = (unsigned char)c;
                q += sprintf(q, u < 0x100 ? "x%02x" : u < 0x10000 ? "u%04x" : "U%08x", (unsigned)u);
                i += 1 + len;
                continue;
            } else { /* unknown escape: kept as it is */
                *q++ = '\\';
                *q++ = c;
            }
        }
        if (cp >= 0)
            q += tpl_utf8_put(cp, q);
        i += used;
    }
    *out = tv_str(o, (size_t)(q - o));
    return 0;
}

static int lex_string(tparser *P, size_t *pos)
{
    const char *s = P->s;
    size_t i = *pos, j = i + 1;
    while (j < P->n && s[j] != s[i])
        j += s[j] == '\\' ? 2 : 1;
    if (j >= P->n)
        return perr(P, i, "unterminated string");
    tval v;
    IFLOW_TRY(unescape(P, i, s + i + 1, j - i - 1, &v));
    *pos = j + 1;
    return emit(P, K_STR, 0, i, v);
}

/* The tokens of a {{ or {% tag from *pos to its end; *line_starting: whether the end took a newline. */
static int lex_tag(tparser *P, size_t *pos, int block, size_t open, int *line_starting)
{
    const char *s = P->s;
    size_t n = P->n, i = *pos;
    char stack[IFLOW_TEMPLATE_MAX_DEPTH];
    int depth = 0;
    for (;;) {
        if (depth == 0) { /* the end of the tag, only outside brackets */
            const char *close = block ? "%}" : "}}";
            size_t end = 0;
            if (i + 2 < n && block && s[i] == '+' && memcmp(s + i + 1, close, 2) == 0)
                end = i + 3;
            else if (i + 2 < n && s[i] == '-' && memcmp(s + i + 1, close, 2) == 0)
                end = skip_space(s, n, i + 3);
            else if (i + 1 < n && memcmp(s + i, close, 2) == 0)
                end = i + 2 + (block && i + 2 < n && s[i + 2] == '\n');
            if (end) {
                *line_starting = s[end - 1] == '\n';
                *pos = end;
                return emit(P, block ? K_BEND : K_VEND, 0, i, tv_none());
            }
        }
        if (i >= n)
            return perr(P, open, "missing '%s' to close the tag", block ? "%}" : "}}");
        size_t k = space_at(s, n, i);
        if (k) {
            i += k;
            continue;
        }
        if (is_digit(s[i])) {
            IFLOW_TRY(lex_number(P, &i));
            continue;
        }
        if (is_name_start((unsigned char)s[i])) {
            size_t j = i + 1;
            while (j < n && (is_name_start((unsigned char)s[j]) || is_digit(s[j])) && !space_at(s, n, j))
                j++;
            IFLOW_TRY(emit(P, K_NAME, 0, i, tv_str(s + i, j - i)));
            i = j;
            continue;
        }
        if (s[i] == '\'' || s[i] == '"') {
            IFLOW_TRY(lex_string(P, &i));
            continue;
        }
        int op = 0;
        for (; op < N_OPS; op++)
            if (strncmp(s + i, op_text[op], strlen(op_text[op])) == 0 && i + strlen(op_text[op]) <= n)
                break;
        if (op == N_OPS)
        {
            size_t len;
            tpl_utf8_next(s + i, n - i, &len);
            return perr(P, i, "unexpected character '%s'", iflow_quoten(s + i, len));
        }
        if (op == O_LPAREN || op == O_LBRACKET || op == O_LBRACE) {
            if (depth == (int)sizeof stack)
                return perr(P, i, "the template nests more than %d deep", IFLOW_TEMPLATE_MAX_DEPTH);
            stack[depth++] = op == O_LPAREN ? ')' : op == O_LBRACKET ? ']' : '}';
        } else if (op == O_RPAREN || op == O_RBRACKET || op == O_RBRACE) {
            if (!depth)
                return perr(P, i, "unexpected '%c'", s[i]);
            if (stack[--depth] != s[i])
                return perr(P, i, "unexpected '%c', expected '%c'", s[i], stack[depth]);
        }
        IFLOW_TRY(emit(P, K_OP, op, i, tv_none()));
        i += strlen(op_text[op]);
    }
}

/* ---- lexer: text, comments, raw blocks ------------------------------------------------------ */

static int emit_text(tparser *P, size_t start, size_t end)
{
    return end > start ? emit(P, K_DATA, 0, start, tv_str(P->s + start, end - start)) : 0;
}

/* After a closing `-` strips whitespace, `+` keeps all, and a plain %} or #} takes one newline. */
static size_t after_close(const char *s, size_t n, char sign, size_t end, int trim)
{
    if (sign == '-')
        return skip_space(s, n, end);
    if (sign != '+' && trim && end < n && s[end] == '\n')
        return end + 1;
    return end;
}

/* {%(-|+|)\s*raw\s*(-%}\s*|%}) at `open`: the end of the tag, or 0 */
static size_t raw_begin(const char *s, size_t n, size_t after)
{
    size_t i = skip_space(s, n, after);
    if (i + 3 > n || memcmp(s + i, "raw", 3) != 0)
        return 0;
    i = skip_space(s, n, i + 3);
    if (i + 3 <= n && memcmp(s + i, "-%}", 3) == 0)
        return skip_space(s, n, i + 3);
    if (i + 2 <= n && memcmp(s + i, "%}", 2) == 0)
        return i + 2;
    return 0;
}

/* The body of a raw block from `from`, its text handled like the text before any block tag. */
static int lex_raw(tparser *P, size_t open, size_t from, size_t *pos, int *line_starting)
{
    const char *s = P->s;
    size_t n = P->n;
    for (size_t k = from; k + 1 < n; k++) {
        if (s[k] != '{' || s[k + 1] != '%')
            continue;
        size_t i = k + 2;
        char sign = i < n && (s[i] == '-' || s[i] == '+') ? s[i++] : 0;
        i = skip_space(s, n, i);
        if (i + 6 > n || memcmp(s + i, "endraw", 6) != 0)
            continue;
        i = skip_space(s, n, i + 6);
        char close = i < n && (s[i] == '-' || s[i] == '+') ? s[i] : 0;
        size_t c = i + (close != 0);
        if (c + 2 > n || memcmp(s + c, "%}", 2) != 0)
            continue;
        size_t text_end = sign == '-'   ? rstrip_space(s, from, k)
                          : sign == '+' ? k
                                        : lstrip_line(s, from, k, *line_starting);
        IFLOW_TRY(emit_text(P, from, text_end));
        *pos = after_close(s, n, close, c + 2, 1);
        *line_starting = s[*pos - 1] == '\n';
        return 0;
    }
    return perr(P, open, "missing end of raw directive");
}

static int lex(tparser *P)
{
    const char *s = P->s;
    size_t n = P->n, pos = 0;
    int line_starting = 1;
    while (pos < n) {
        size_t tag = pos;
        while (tag + 1 < n && !(s[tag] == '{' && (s[tag + 1] == '{' || s[tag + 1] == '%' || s[tag + 1] == '#')))
            tag++;
        if (tag + 1 >= n) {
            IFLOW_TRY(emit_text(P, pos, n));
            break;
        }
        char kind = s[tag + 1];
        size_t after = tag + 2;
        char sign = after < n && (s[after] == '-' || s[after] == '+') ? s[after++] : 0;
        size_t raw = kind == '%' ? raw_begin(s, n, after) : 0;
        size_t text_end = tag;
        if (sign == '-')
            text_end = rstrip_space(s, pos, tag);
        else if (sign != '+' && kind != '{')
            text_end = lstrip_line(s, pos, tag, line_starting);
        IFLOW_TRY(emit_text(P, pos, text_end));
        if (raw) {
            line_starting = s[raw - 1] == '\n';
            IFLOW_TRY(lex_raw(P, tag, raw, &pos, &line_starting));
        } else if (kind == '#') {
            const char *end = after < n ? memmem(s + after, n - after, "#}", 2) : NULL;
            if (!end)
                return perr(P, tag, "missing end of comment tag");
            size_t j = (size_t)(end - s);
            char close = j > after && (s[j - 1] == '-' || s[j - 1] == '+') ? s[j - 1] : 0;
            pos = after_close(s, n, close, j + 2, 1);
            line_starting = s[pos - 1] == '\n';
        } else {
            IFLOW_TRY(emit(P, kind == '%' ? K_BBEGIN : K_VBEGIN, 0, tag, tv_none()));
            pos = after;
            IFLOW_TRY(lex_tag(P, &pos, kind == '%', tag, &line_starting));
        }
    }
    return emit(P, K_EOF, 0, n, tv_none());
}

/* ---- parser: tokens and nodes --------------------------------------------------------------- */

static ttok *cur(tparser *P) { return &P->tok[P->i]; }
static ttok *look(tparser *P) { return &P->tok[P->i + 1 < P->ntok ? P->i + 1 : P->i]; }
static void adv(tparser *P)
{
    if (P->i + 1 < P->ntok)
        P->i++;
}

static int tok_text_is(tval v, const char *text)
{
    return v.s.n == strlen(text) && memcmp(v.s.p, text, v.s.n) == 0;
}

static int tok_is_name(const ttok *k, const char *name)
{
    return k->kind == K_NAME && tok_text_is(k->v, name);
}
static int is_name(tparser *P, const char *name) { return tok_is_name(cur(P), name); }
static int is_op(tparser *P, int op) { return cur(P)->kind == K_OP && cur(P)->op == op; }

/* How a token reads in a message. */
static const char *describe(const ttok *k)
{
    static _Thread_local char buf[IFLOW_QUOTE_MAX + 8];
    switch (k->kind) {
    case K_DATA: return "template text";
    case K_VBEGIN: return "'{{'";
    case K_VEND: return "end of print statement ('}}')";
    case K_BBEGIN: return "'{%'";
    case K_BEND: return "end of statement block ('%}')";
    case K_NAME: snprintf(buf, sizeof buf, "'%s'", iflow_quoten(k->v.s.p, k->v.s.n)); return buf;
    case K_STR: return "a string";
    case K_INT: return "an integer";
    case K_FLOAT: return "a float";
    case K_OP: snprintf(buf, sizeof buf, "'%s'", op_text[k->op]); return buf;
    default: return "end of template";
    }
}

static int expected(tparser *P, const char *what)
{
    return perr(P, cur(P)->pos, "expected %s, got %s", what, describe(cur(P)));
}

static int expect_op(tparser *P, int op)
{
    if (!is_op(P, op)) {
        char what[8];
        snprintf(what, sizeof what, "'%s'", op_text[op]);
        return expected(P, what);
    }
    adv(P);
    return 0;
}

static tnode *mk(tparser *P, int kind, size_t pos, uint32_t n)
{
    tnode *x = palloc(P, sizeof *x + n * sizeof(tnode *));
    if (!x)
        return NULL;
    memset(x, 0, sizeof *x);
    x->kind = (uint8_t)kind;
    x->pos = (uint32_t)pos;
    x->n = n;
    x->kid = (tnode **)(x + 1);
    memset(x->kid, 0, n * sizeof(tnode *));
    return x;
}

/* Whether jinja2 tries to compute x when it compiles (constants, and operations on them), which
 * shows in slices: see template_eval.c's eval_folded. */
static int foldable(const tnode *x)
{
    static const uint8_t kinds[] = {N_LIST, N_TUPLE, N_DICT, N_BIN, N_NEG, N_POS, N_NOT, N_AND, N_OR, N_CONCAT, N_CMP,
                                    N_OPERAND, N_COND, N_SLICE, N_ITEM, N_ATTR, N_FILTER, N_TEST, N_KW};
    static const char *const context_filters[] = {"map", "select", "reject", "selectattr", "rejectattr"};
    if (x->kind == N_CONST)
        return 1;
    if (!memchr(kinds, x->kind, sizeof kinds) || ((x->kind == N_FILTER || x->kind == N_TEST) && x->id < 0))
        return 0;
    for (size_t i = 0; x->kind == N_FILTER && i < sizeof context_filters / sizeof *context_filters; i++)
        if (tok_text_is(x->lit, context_filters[i])) /* they take jinja2's context: never folded */
            return 0;
    if (x->kind == N_AND || x->kind == N_OR) /* the right side only when it is needed */
        return x->kid[0]->konst;
    if (x->kind == N_COND) /* the test, and the side it picks */
        return x->kid[1]->konst && (x->kid[0]->konst || !x->kid[2] || x->kid[2]->konst);
    for (uint32_t i = 0; i < x->n; i++)
        if (x->kid[i] && !x->kid[i]->konst)
            return 0;
    return 1;
}

/* A node is done: its depth (one more than its deepest kid's) must stay within the limit, so
 * that everything walking the tree recurses a bounded number of times. */
static tnode *fin(tparser *P, tnode *x)
{
    if (!x)
        return NULL;
    int d = 0;
    for (uint32_t i = 0; i < x->n; i++)
        if (x->kid[i] && x->kid[i]->depth > d)
            d = x->kid[i]->depth;
    x->depth = (uint16_t)(d + 1);
    x->konst = foldable(x);
    if (d + 1 > IFLOW_TEMPLATE_MAX_DEPTH) {
        perr(P, x->pos, "the template nests more than %d deep", IFLOW_TEMPLATE_MAX_DEPTH);
        return NULL;
    }
    return x;
}

static tnode *mk1(tparser *P, int kind, size_t pos, tnode *a)
{
    tnode *x = a ? mk(P, kind, pos, 1) : NULL;
    if (!x)
        return NULL;
    x->kid[0] = a;
    return fin(P, x);
}

static tnode *mk2(tparser *P, int kind, int op, size_t pos, tnode *a, tnode *b)
{
    tnode *x = a && b ? mk(P, kind, pos, 2) : NULL;
    if (!x)
        return NULL;
    x->op = (uint8_t)op;
    x->kid[0] = a;
    x->kid[1] = b;
    return fin(P, x);
}

/* A list of nodes being gathered (in the arena: what a longer copy leaves behind is small). */
typedef struct {
    tnode **v;
    uint32_t n, cap;
} nvec;

static int push(tparser *P, nvec *a, tnode *x)
{
    if (!x)
        return P->rc;
    if (a->n == a->cap) {
        uint32_t cap = a->cap ? 2 * a->cap : 8;
        tnode **nv = palloc(P, cap * sizeof *nv);
        if (!nv)
            return P->rc;
        if (a->n)
            memcpy(nv, a->v, a->n * sizeof *nv);
        a->v = nv;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* A node whose kids are `first` (when not NULL) then the gathered ones. */
static tnode *mkv(tparser *P, int kind, size_t pos, tnode *first, const nvec *a)
{
    uint32_t k = first != NULL;
    tnode *x = mk(P, kind, pos, a->n + k);
    if (!x)
        return NULL;
    x->kid[0] = first;
    if (a->n)
        memcpy(x->kid + k, a->v, a->n * sizeof *a->v);
    return fin(P, x);
}

#define ENTER(P, pos)                                                                               \
    do {                                                                                          \
        if (++(P)->depth > IFLOW_TEMPLATE_MAX_DEPTH) {                                           \
            perr(P, pos, "the template nests more than %d deep", IFLOW_TEMPLATE_MAX_DEPTH);      \
            return NULL;                                                                          \
        }                                                                                         \
    } while (0)

/* ---- parser: expressions -------------------------------------------------------------------- */

static tnode *parse_expression(tparser *P, int with_condexpr);
static tnode *parse_tuple(tparser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_parens,
                          int with_ns);
static tnode *parse_unary(tparser *P, int with_filter);
static tnode *parse_primary(tparser *P, int with_ns);
static tnode *parse_postfix(tparser *P, tnode *x);

static tnode *parse_condexpr(tparser *P)
{
    size_t pos = cur(P)->pos;
    ENTER(P, pos);
    tnode *x = parse_expression(P, 0);
    while (x && is_name(P, "if")) {
        adv(P);
        tnode *test = parse_expression(P, 0), *other = NULL;
        if (test && is_name(P, "else")) {
            adv(P);
            if (!(other = parse_condexpr(P)))
                return NULL;
        }
        tnode *c = test ? mk(P, N_COND, pos, 3) : NULL;
        if (!c)
            return NULL;
        c->kid[0] = x;
        c->kid[1] = test;
        c->kid[2] = other;
        x = fin(P, c);
        pos = cur(P)->pos;
    }
    P->depth--;
    return x;
}

static tnode *parse_not(tparser *P);

static tnode *parse_and(tparser *P)
{
    tnode *x = parse_not(P);
    while (x && is_name(P, "and")) {
        size_t pos = cur(P)->pos;
        adv(P);
        x = mk2(P, N_AND, 0, pos, x, parse_not(P));
    }
    return x;
}

static tnode *parse_or(tparser *P)
{
    tnode *x = parse_and(P);
    while (x && is_name(P, "or")) {
        size_t pos = cur(P)->pos;
        adv(P);
        x = mk2(P, N_OR, 0, pos, x, parse_and(P));
    }
    return x;
}

static tnode *parse_math1(tparser *P);

static tnode *parse_compare(tparser *P)
{
    size_t pos = cur(P)->pos;
    tnode *x = parse_math1(P);
    nvec ops = {0};
    static const int cmp_ops[][2] = {{O_EQ, OP_EQ}, {O_NE, OP_NE}, {O_LT, OP_LT}, {O_LE, OP_LE}, {O_GT, OP_GT},
                                     {O_GE, OP_GE}};
    while (x) {
        int op = -1;
        for (int k = 0; k < 6; k++)
            if (is_op(P, cmp_ops[k][0]))
                op = cmp_ops[k][1];
        if (op < 0 && is_name(P, "in"))
            op = OP_IN;
        else if (op < 0 && is_name(P, "not") && tok_is_name(look(P), "in"))
            op = OP_NOTIN;
        if (op < 0)
            break;
        size_t at = cur(P)->pos;
        adv(P);
        if (op == OP_NOTIN)
            adv(P);
        tnode *y = mk1(P, N_OPERAND, at, parse_math1(P));
        if (!y || push(P, &ops, y) < 0)
            return NULL;
        y->op = (uint8_t)op;
    }
    return x && ops.n ? mkv(P, N_CMP, pos, x, &ops) : x;
}

static tnode *parse_not(tparser *P)
{
    if (!is_name(P, "not"))
        return parse_compare(P);
    size_t pos = cur(P)->pos;
    ENTER(P, pos);
    adv(P);
    tnode *x = mk1(P, N_NOT, pos, parse_not(P));
    P->depth--;
    return x;
}

static tnode *parse_concat(tparser *P);

static tnode *parse_math1(tparser *P)
{
    tnode *x = parse_concat(P);
    while (x && (is_op(P, O_ADD) || is_op(P, O_SUB))) {
        int op = is_op(P, O_ADD) ? OP_ADD : OP_SUB;
        size_t pos = cur(P)->pos;
        adv(P);
        x = mk2(P, N_BIN, op, pos, x, parse_concat(P));
    }
    return x;
}

static tnode *parse_pow(tparser *P)
{
    tnode *x = parse_unary(P, 1);
    while (x && is_op(P, O_POW)) {
        size_t pos = cur(P)->pos;
        adv(P);
        x = mk2(P, N_BIN, OP_POW, pos, x, parse_unary(P, 1));
    }
    return x;
}

static tnode *parse_math2(tparser *P)
{
    tnode *x = parse_pow(P);
    while (x && (is_op(P, O_MUL) || is_op(P, O_DIV) || is_op(P, O_FLOORDIV) || is_op(P, O_MOD))) {
        int op = is_op(P, O_MUL) ? OP_MUL : is_op(P, O_DIV) ? OP_DIV : is_op(P, O_FLOORDIV) ? OP_FLOORDIV : OP_MOD;
        size_t pos = cur(P)->pos;
        adv(P);
        x = mk2(P, N_BIN, op, pos, x, parse_pow(P));
    }
    return x;
}

static tnode *parse_concat(tparser *P)
{
    size_t pos = cur(P)->pos;
    tnode *x = parse_math2(P);
    if (!x || !is_op(P, O_TILDE))
        return x;
    nvec parts = {0};
    while (is_op(P, O_TILDE)) {
        adv(P);
        if (push(P, &parts, parse_math2(P)) < 0)
            return NULL;
    }
    return mkv(P, N_CONCAT, pos, x, &parts);
}

/* (args, name=value, ...) after a callee, a filter or a test: positional kids, then N_KW kids */
static int parse_call_args(tparser *P, nvec *args)
{
    size_t open = cur(P)->pos;
    IFLOW_TRY(expect_op(P, O_LPAREN));
    int kw = 0;
    while (!is_op(P, O_RPAREN)) {
        if (args->n) {
            IFLOW_TRY(expect_op(P, O_COMMA));
            if (is_op(P, O_RPAREN))
                break;
        }
        if (is_op(P, O_MUL) || is_op(P, O_POW))
            return perr(P, cur(P)->pos, "*args and **kwargs in calls are not supported");
        if (cur(P)->kind == K_NAME && look(P)->kind == K_OP && look(P)->op == O_ASSIGN) {
            ttok *name = cur(P);
            adv(P);
            adv(P);
            tnode *k = mk1(P, N_KW, name->pos, parse_expression(P, 1));
            IFLOW_TRY(push(P, args, k));
            k->lit = name->v;
            kw = 1;
        } else {
            if (kw)
                return perr(P, open, "invalid syntax for function call expression (an argument after a keyword)");
            IFLOW_TRY(push(P, args, parse_expression(P, 1)));
        }
    }
    adv(P);
    return 0;
}

/* name(.name)* of a filter or test */
static int parse_dotted(tparser *P, tval *name)
{
    if (cur(P)->kind != K_NAME)
        return expected(P, "a name");
    *name = cur(P)->v;
    adv(P);
    while (is_op(P, O_DOT)) {
        adv(P);
        if (cur(P)->kind != K_NAME)
            return expected(P, "a name");
        name->s.n = (size_t)(cur(P)->v.s.p + cur(P)->v.s.n - name->s.p);
        adv(P);
    }
    return 0;
}

/* x|f|g(args)... (with start_inline, the first filter has no '|': a filter block's) */
static tnode *parse_filter(tparser *P, tnode *x, int start_inline)
{
    while (x && (is_op(P, O_PIPE) || start_inline)) {
        if (!start_inline)
            adv(P);
        start_inline = 0;
        size_t pos = cur(P)->pos;
        tval name;
        nvec args = {0};
        if (parse_dotted(P, &name) < 0 || (is_op(P, O_LPAREN) && parse_call_args(P, &args) < 0))
            return NULL;
        x = mkv(P, N_FILTER, pos, x, &args);
        if (x) {
            x->lit = name;
            x->id = (int16_t)tpl_filter_id(name.s.p, name.s.n);
            x->konst = foldable(x);
        }
    }
    return x;
}

static tnode *parse_test(tparser *P, tnode *x)
{
    size_t pos = cur(P)->pos;
    adv(P); /* is */
    int negated = is_name(P, "not");
    if (negated)
        adv(P);
    tval name;
    nvec args = {0};
    if (parse_dotted(P, &name) < 0)
        return NULL;
    ttok *k = cur(P);
    if (is_op(P, O_LPAREN)) {
        if (parse_call_args(P, &args) < 0)
            return NULL;
    } else if ((k->kind == K_NAME || k->kind == K_STR || k->kind == K_INT || k->kind == K_FLOAT ||
                (k->kind == K_OP && (k->op == O_LBRACKET || k->op == O_LBRACE))) &&
               !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
        if (is_name(P, "is")) {
            perr(P, k->pos, "you cannot chain multiple tests with is");
            return NULL;
        }
        if (push(P, &args, parse_postfix(P, parse_primary(P, 0))) < 0)
            return NULL;
    }
    x = mkv(P, N_TEST, pos, x, &args);
    if (!x)
        return NULL;
    x->lit = name;
    x->id = (int16_t)tpl_test_id(name.s.p, name.s.n);
    x->konst = foldable(x);
    return negated ? mk1(P, N_NOT, pos, x) : x;
}

/* [a:b:c] inside brackets: a slice, or the expression itself */
static tnode *parse_subscribed(tparser *P)
{
    size_t pos = cur(P)->pos;
    tnode *part[3] = {0};
    if (!is_op(P, O_COLON)) {
        part[0] = parse_expression(P, 1);
        if (!part[0] || !is_op(P, O_COLON))
            return part[0];
    }
    adv(P);
    if (!is_op(P, O_COLON) && !is_op(P, O_RBRACKET) && !is_op(P, O_COMMA) && !(part[1] = parse_expression(P, 1)))
        return NULL;
    if (is_op(P, O_COLON)) {
        adv(P);
        if (!is_op(P, O_RBRACKET) && !is_op(P, O_COMMA) && !(part[2] = parse_expression(P, 1)))
            return NULL;
    }
    tnode *x = mk(P, N_SLICE, pos, 3);
    if (!x)
        return NULL;
    memcpy(x->kid, part, sizeof part);
    return fin(P, x);
}

static tnode *parse_subscript(tparser *P, tnode *x)
{
    size_t pos = cur(P)->pos;
    if (is_op(P, O_DOT)) {
        adv(P);
        ttok *k = cur(P);
        if (k->kind == K_NAME) {
            adv(P);
            tnode *a = mk1(P, N_ATTR, pos, x);
            if (a)
                a->lit = k->v;
            return a;
        }
        if (k->kind != K_INT) {
            expected(P, "a name or number");
            return NULL;
        }
        adv(P);
        tnode *c = mk(P, N_CONST, k->pos, 0);
        if (!c)
            return NULL;
        c->lit = k->v;
        return mk2(P, N_ITEM, 0, pos, x, fin(P, c));
    }
    adv(P); /* [ */
    nvec args = {0};
    while (!is_op(P, O_RBRACKET)) {
        if (args.n && expect_op(P, O_COMMA) < 0)
            return NULL;
        if (push(P, &args, parse_subscribed(P)) < 0)
            return NULL;
    }
    adv(P);
    tnode *key = args.n == 1 ? args.v[0] : mkv(P, N_TUPLE, pos, NULL, &args);
    return mk2(P, N_ITEM, 0, pos, x, key);
}

/* x(args...) */
static tnode *parse_call(tparser *P, tnode *x)
{
    size_t pos = cur(P)->pos;
    nvec args = {0};
    if (parse_call_args(P, &args) < 0)
        return NULL;
    return mkv(P, N_CALL, pos, x, &args);
}

static tnode *parse_postfix(tparser *P, tnode *x)
{
    while (x) {
        if (is_op(P, O_DOT) || is_op(P, O_LBRACKET)) {
            x = parse_subscript(P, x);
        } else if (is_op(P, O_LPAREN)) {
            x = parse_call(P, x);
        } else {
            break;
        }
    }
    return x;
}

static tnode *parse_filter_expr(tparser *P, tnode *x)
{
    while (x) {
        if (is_op(P, O_PIPE)) {
            x = parse_filter(P, x, 0);
        } else if (is_name(P, "is")) {
            x = parse_test(P, x);
        } else if (is_op(P, O_LPAREN)) {
            x = parse_call(P, x);
        } else {
            break;
        }
    }
    return x;
}

static tnode *parse_unary(tparser *P, int with_filter)
{
    size_t pos = cur(P)->pos;
    ENTER(P, pos);
    tnode *x;
    if (is_op(P, O_SUB) || is_op(P, O_ADD)) {
        int kind = is_op(P, O_SUB) ? N_NEG : N_POS;
        adv(P);
        x = mk1(P, kind, pos, parse_unary(P, 0));
    } else {
        x = parse_primary(P, 0);
    }
    x = parse_postfix(P, x);
    if (with_filter)
        x = parse_filter_expr(P, x);
    P->depth--;
    return x;
}

static tnode *constant(tparser *P, size_t pos, tval v)
{
    tnode *c = mk(P, N_CONST, pos, 0);
    if (c)
        c->lit = v;
    return fin(P, c);
}

static tnode *parse_list_or_dict(tparser *P, int dict)
{
    size_t pos = cur(P)->pos;
    int close = dict ? O_RBRACE : O_RBRACKET;
    adv(P);
    nvec items = {0};
    while (!is_op(P, close)) {
        if (items.n && expect_op(P, O_COMMA) < 0)
            return NULL;
        if (is_op(P, close))
            break;
        if (push(P, &items, parse_expression(P, 1)) < 0)
            return NULL;
        if (dict && (expect_op(P, O_COLON) < 0 || push(P, &items, parse_expression(P, 1)) < 0))
            return NULL;
    }
    adv(P);
    return mkv(P, dict ? N_DICT : N_LIST, pos, NULL, &items);
}

static tnode *parse_primary(tparser *P, int with_ns)
{
    ttok *k = cur(P);
    if (k->kind == K_NAME) {
        adv(P);
        if (tok_is_name(k, "true") || tok_is_name(k, "True") || tok_is_name(k, "false") || tok_is_name(k, "False"))
            return constant(P, k->pos, tv_bool(k->v.s.p[0] == 't' || k->v.s.p[0] == 'T'));
        if (tok_is_name(k, "none") || tok_is_name(k, "None"))
            return constant(P, k->pos, tv_none());
        tnode *x = mk(P, N_NAME, k->pos, 0);
        if (!x)
            return NULL;
        x->lit = k->v;
        if (with_ns && is_op(P, O_DOT)) {
            adv(P);
            if (cur(P)->kind != K_NAME) {
                expected(P, "a name");
                return NULL;
            }
            tnode *ref = mk1(P, N_NSREF, k->pos, fin(P, x));
            if (ref)
                ref->lit = cur(P)->v;
            adv(P);
            return ref;
        }
        return fin(P, x);
    }
    if (k->kind == K_STR) {
        tval v = k->v;
        adv(P);
        if (cur(P)->kind == K_STR) { /* adjacent strings are one */
            size_t total = 0, i;
            for (i = P->i - 1; P->tok[i].kind == K_STR; i++)
                total += P->tok[i].v.s.n;
            char *p = palloc(P, total ? total : 1), *q = p;
            if (!p)
                return NULL;
            for (i = P->i - 1; P->tok[i].kind == K_STR; i++) {
                memcpy(q, P->tok[i].v.s.p, P->tok[i].v.s.n);
                q += P->tok[i].v.s.n;
            }
            P->i = i;
            v = tv_str(p, total);
        }
        return constant(P, k->pos, v);
    }
    if (k->kind == K_INT || k->kind == K_FLOAT) {
        adv(P);
        return constant(P, k->pos, k->v);
    }
    if (is_op(P, O_LPAREN)) {
        adv(P);
        tnode *x = parse_tuple(P, 0, 1, NULL, 1, 0);
        return x && expect_op(P, O_RPAREN) == 0 ? x : NULL;
    }
    if (is_op(P, O_LBRACKET) || is_op(P, O_LBRACE))
        return parse_list_or_dict(P, is_op(P, O_LBRACE));
    perr(P, k->pos, "unexpected %s", describe(k));
    return NULL;
}

static int tuple_end(tparser *P, const char *extra_end)
{
    ttok *k = cur(P);
    return k->kind == K_VEND || k->kind == K_BEND || (k->kind == K_OP && k->op == O_RPAREN) ||
           (extra_end && tok_is_name(k, extra_end));
}

/* Expressions separated by commas: one alone is itself, several (or a trailing comma) a tuple. */
static tnode *parse_tuple(tparser *P, int simplified, int with_condexpr, const char *extra_end, int explicit_parens,
                          int with_ns)
{
    size_t pos = cur(P)->pos;
    nvec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n && expect_op(P, O_COMMA) < 0)
            return NULL;
        if (tuple_end(P, extra_end))
            break;
        tnode *x = simplified ? parse_primary(P, with_ns) : parse_expression(P, with_condexpr);
        if (push(P, &items, x) < 0)
            return NULL;
        if (!is_op(P, O_COMMA))
            break;
        is_tuple = 1;
    }
    if (!is_tuple) {
        if (items.n)
            return items.v[0];
        if (!explicit_parens) {
            expected(P, "an expression");
            return NULL;
        }
    }
    return mkv(P, N_TUPLE, pos, NULL, &items);
}

static tnode *parse_expression(tparser *P, int with_condexpr)
{
    return with_condexpr ? parse_condexpr(P) : parse_or(P);
}

/* ---- parser: statements --------------------------------------------------------------------- */

static int assignable(const tnode *x)
{
    if (x->kind == N_NAME || x->kind == N_NSREF)
        return 1;
    if (x->kind != N_TUPLE)
        return 0;
    for (uint32_t i = 0; i < x->n; i++)
        if (!assignable(x->kid[i]))
            return 0;
    return 1;
}

static tnode *parse_target(tparser *P, const char *extra_end, int with_ns)
{
    size_t pos = cur(P)->pos;
    tnode *x = parse_tuple(P, 1, 1, extra_end, 0, with_ns);
    if (x && !assignable(x)) {
        perr(P, pos, "can't assign to this expression");
        return NULL;
    }
    return x;
}

static tnode *subparse(tparser *P, const char *const *ends);

/* The body of a block tag up to one of `ends` (the end's name is the current token after). */
static tnode *parse_body(tparser *P, const char *const *ends)
{
    if (is_op(P, O_COLON))
        adv(P);
    if (cur(P)->kind != K_BEND) {
        expected(P, "end of statement block ('%}')");
        return NULL;
    }
    adv(P);
    return subparse(P, ends);
}

/* {% endX %} after a body: the name was checked by subparse */
static int end_tag(tparser *P)
{
    adv(P);
    return 0;
}

static tnode *parse_for(tparser *P)
{
    size_t pos = cur(P)->pos;
    adv(P);
    tnode *target = parse_target(P, "in", 0);
    if (!target)
        return NULL;
    if (!is_name(P, "in")) {
        expected(P, "'in'");
        return NULL;
    }
    adv(P);
    tnode *iter = parse_tuple(P, 0, 0, "recursive", 0, 0), *cond = NULL, *other = NULL;
    if (!iter)
        return NULL;
    if (is_name(P, "if")) {
        adv(P);
        if (!(cond = parse_expression(P, 1)))
            return NULL;
    }
    if (is_name(P, "recursive")) {
        perr(P, cur(P)->pos, "recursive loops are not supported");
        return NULL;
    }
    static const char *const ends[] = {"endfor", "else", NULL}, *const endfor[] = {"endfor", NULL};
    P->loops++;
    tnode *body = parse_body(P, ends);
    P->loops--;
    if (!body)
        return NULL;
    if (is_name(P, "else")) {
        adv(P);
        if (!(other = parse_body(P, endfor)))
            return NULL;
    }
    end_tag(P);
    tnode *x = mk(P, N_FOR, pos, 5);
    if (!x)
        return NULL;
    x->kid[0] = target;
    x->kid[1] = iter;
    x->kid[2] = cond;
    x->kid[3] = body;
    x->kid[4] = other;
    return fin(P, x);
}

/* if/elif/else as one node: test, body, test, body, ..., and an else body when the count is odd */
static tnode *parse_if(tparser *P)
{
    size_t pos = cur(P)->pos;
    static const char *const ends[] = {"elif", "else", "endif", NULL}, *const endif[] = {"endif", NULL};
    nvec parts = {0};
    for (;;) {
        adv(P); /* if or elif */
        if (push(P, &parts, parse_tuple(P, 0, 0, NULL, 0, 0)) < 0 || push(P, &parts, parse_body(P, ends)) < 0)
            return NULL;
        if (is_name(P, "elif"))
            continue;
        if (is_name(P, "else")) {
            adv(P);
            if (push(P, &parts, parse_body(P, endif)) < 0)
                return NULL;
        }
        break;
    }
    end_tag(P);
    return mkv(P, N_IF, pos, NULL, &parts);
}

static tnode *parse_set(tparser *P)
{
    size_t pos = cur(P)->pos;
    adv(P);
    tnode *target = parse_target(P, NULL, 1);
    if (!target)
        return NULL;
    if (is_op(P, O_ASSIGN)) {
        adv(P);
        return mk2(P, N_SET, 0, pos, target, parse_tuple(P, 0, 1, NULL, 0, 0));
    }
    tnode *filters = NULL;
    if (is_op(P, O_PIPE)) {
        tnode *hole = fin(P, mk(P, N_HOLE, cur(P)->pos, 0));
        if (!(filters = parse_filter(P, hole, 0)))
            return NULL;
    }
    static const char *const ends[] = {"endset", NULL};
    tnode *body = parse_body(P, ends);
    tnode *x = body ? mk(P, N_SETBLOCK, pos, 3) : NULL;
    if (!x)
        return NULL;
    end_tag(P);
    x->kid[0] = target;
    x->kid[1] = body;
    x->kid[2] = filters;
    return fin(P, x);
}

/* (a, b=default, ...) of a macro or a call block; the current token is '(' */
static int parse_params(tparser *P, nvec *params)
{
    if (expect_op(P, O_LPAREN) < 0)
        return P->rc;
    int defaults = 0;
    while (!is_op(P, O_RPAREN)) {
        if (params->n && expect_op(P, O_COMMA) < 0)
            return P->rc;
        ttok *k = cur(P);
        if (k->kind != K_NAME)
            return expected(P, "a parameter name");
        for (uint32_t i = 0; i < params->n; i++)
            if (params->v[i]->lit.s.n == k->v.s.n && memcmp(params->v[i]->lit.s.p, k->v.s.p, k->v.s.n) == 0)
                return perr(P, k->pos, "duplicate argument '%s' in macro definition", iflow_quoten(k->v.s.p, k->v.s.n));
        adv(P);
        tnode *p = mk(P, N_PARAM, k->pos, 1);
        if (!p)
            return P->rc;
        p->lit = k->v;
        if (is_op(P, O_ASSIGN)) {
            adv(P);
            if (!(p->kid[0] = parse_expression(P, 1)))
                return P->rc;
            defaults = 1;
        } else if (defaults) {
            return perr(P, k->pos, "non-default argument follows default argument");
        }
        IFLOW_TRY(push(P, params, fin(P, p)));
    }
    adv(P);
    return 0;
}

/* The body of a macro (or a call block's caller) up to `end`, break and continue not reaching out. */
static tnode *macro_body(tparser *P, size_t pos, tval name, const nvec *params, const char *end)
{
    const char *const ends[] = {end, NULL};
    int loops = P->loops;
    P->loops = 0;
    tnode *body = parse_body(P, ends);
    P->loops = loops;
    if (!body)
        return NULL;
    end_tag(P);
    tnode *x = mkv(P, N_MACRO, pos, body, params);
    if (x)
        x->lit = name;
    return x;
}

static tnode *parse_macro(tparser *P)
{
    size_t pos = cur(P)->pos;
    adv(P);
    if (cur(P)->kind != K_NAME) {
        expected(P, "a macro name");
        return NULL;
    }
    tval name = cur(P)->v;
    adv(P);
    nvec params = {0};
    if (parse_params(P, &params) < 0)
        return NULL;
    return macro_body(P, pos, name, &params, "endmacro");
}

/* {% call [(params)] macro(args) %}body{% endcall %}: the macro called with the body as `caller` */
static tnode *parse_call_block(tparser *P)
{
    size_t pos = cur(P)->pos;
    adv(P);
    nvec params = {0};
    if (is_op(P, O_LPAREN) && parse_params(P, &params) < 0)
        return NULL;
    size_t at = cur(P)->pos;
    tnode *call = parse_expression(P, 1);
    if (call && call->kind != N_CALL) {
        perr(P, at, "expected a call");
        return NULL;
    }
    return call ? mk2(P, N_CALLBLOCK, 0, pos, call, macro_body(P, pos, tv_str("caller", 6), &params, "endcall")) : NULL;
}

static tnode *parse_with(tparser *P)
{
    size_t pos = cur(P)->pos;
    adv(P);
    nvec parts = {0};
    while (cur(P)->kind != K_BEND) {
        if (parts.n && expect_op(P, O_COMMA) < 0)
            return NULL;
        if (push(P, &parts, parse_target(P, NULL, 0)) < 0 || expect_op(P, O_ASSIGN) < 0 ||
            push(P, &parts, parse_expression(P, 1)) < 0)
            return NULL;
    }
    static const char *const ends[] = {"endwith", NULL};
    tnode *body = parse_body(P, ends);
    if (!body)
        return NULL;
    end_tag(P);
    return mkv(P, N_WITH, pos, body, &parts);
}

static tnode *parse_filter_block(tparser *P)
{
    size_t pos = cur(P)->pos;
    adv(P);
    tnode *hole = fin(P, mk(P, N_HOLE, cur(P)->pos, 0));
    tnode *filters = hole ? parse_filter(P, hole, 1) : NULL;
    static const char *const ends[] = {"endfilter", NULL};
    tnode *body = filters ? parse_body(P, ends) : NULL;
    if (!body)
        return NULL;
    end_tag(P);
    return mk2(P, N_FILTERBLOCK, 0, pos, filters, body);
}

/* {% print a, b %}: what {{ a }}{{ b }} is */
static tnode *parse_print(tparser *P)
{
    size_t pos = cur(P)->pos;
    adv(P);
    nvec outs = {0};
    while (cur(P)->kind != K_BEND) {
        if (outs.n && expect_op(P, O_COMMA) < 0)
            return NULL;
        size_t at = cur(P)->pos;
        if (push(P, &outs, mk1(P, N_EMIT, at, parse_expression(P, 1))) < 0)
            return NULL;
    }
    return mkv(P, N_BODY, pos, NULL, &outs);
}

/* 'endfor' or 'else' */
static const char *ends_text(const char *const *ends, char *buf, size_t size)
{
    buf[0] = 0;
    for (size_t i = 0; ends[i]; i++)
        snprintf(buf + strlen(buf), size - strlen(buf), "%s'%s'", i ? " or " : "", ends[i]);
    return buf;
}

static tnode *parse_statement(tparser *P)
{
    ttok *k = cur(P);
    if (k->kind != K_NAME) {
        perr(P, k->pos, "expected a tag name, got %s", describe(k));
        return NULL;
    }
    if (tok_is_name(k, "for"))
        return parse_for(P);
    if (tok_is_name(k, "if"))
        return parse_if(P);
    if (tok_is_name(k, "set"))
        return parse_set(P);
    if (tok_is_name(k, "macro"))
        return parse_macro(P);
    if (tok_is_name(k, "with"))
        return parse_with(P);
    if (tok_is_name(k, "call"))
        return parse_call_block(P);
    if (tok_is_name(k, "filter"))
        return parse_filter_block(P);
    if (tok_is_name(k, "print"))
        return parse_print(P);
    if (tok_is_name(k, "break") || tok_is_name(k, "continue")) {
        if (!P->loops) {
            perr(P, k->pos, "'%s' outside loop", k->v.s.p[0] == 'b' ? "break" : "continue");
            return NULL;
        }
        adv(P);
        return fin(P, mk(P, k->v.s.p[0] == 'b' ? N_BREAK : N_CONTINUE, k->pos, 0));
    }
    if (tok_is_name(k, "generation")) { /* transformers' extension: the body, marked for its tracker */
        static const char *const ends[] = {"endgeneration", NULL};
        adv(P);
        tnode *body = parse_body(P, ends);
        if (body)
            end_tag(P);
        return body;
    }
    static const char *const unsupported[] = {"block", "extends", "include", "import", "from", "autoescape", "raw"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
        if (tok_is_name(k, unsupported[i])) {
            perr(P, k->pos, "the tag '%s' is not supported", unsupported[i]);
            return NULL;
        }
    char want[200];
    if (P->ends)
        perr(P, k->pos, "unknown tag %s (expected %s)", describe(k), ends_text(P->ends, want, sizeof want));
    else
        perr(P, k->pos, "unknown tag %s", describe(k));
    return NULL;
}

static int is_end(tparser *P, const char *const *ends)
{
    for (; ends && *ends; ends++)
        if (is_name(P, *ends))
            return 1;
    return 0;
}

/* Text, {{ }} and statements up to {% one-of-ends %} (or the end of the template without ends). */
static tnode *subparse(tparser *P, const char *const *ends)
{
    size_t pos = cur(P)->pos;
    ENTER(P, pos);
    const char *const *outer_ends = P->ends;
    P->ends = ends;
    nvec body = {0};
    for (;;) {
        ttok *k = cur(P);
        if (k->kind == K_EOF) {
            if (ends) {
                char want[200];
                perr(P, k->pos, "unexpected end of template: expected %s", ends_text(ends, want, sizeof want));
                return NULL;
            }
            break;
        }
        if (k->kind == K_DATA) {
            tnode *d = mk(P, N_DATA, k->pos, 0);
            if (push(P, &body, fin(P, d)) < 0)
                return NULL;
            d->lit = k->v;
            adv(P);
        } else if (k->kind == K_VBEGIN) {
            adv(P);
            if (push(P, &body, mk1(P, N_EMIT, k->pos, parse_tuple(P, 0, 1, NULL, 0, 0))) < 0)
                return NULL;
            if (cur(P)->kind != K_VEND) {
                expected(P, "end of print statement ('}}')");
                return NULL;
            }
            adv(P);
        } else if (k->kind == K_BBEGIN) {
            adv(P);
            if (is_end(P, ends))
                break;
            if (push(P, &body, parse_statement(P)) < 0)
                return NULL;
            if (cur(P)->kind != K_BEND) {
                expected(P, "end of statement block ('%}')");
                return NULL;
            }
            adv(P);
        } else {
            perr(P, k->pos, "unexpected %s", describe(k));
            return NULL;
        }
    }
    P->depth--;
    P->ends = outer_ends;
    return mkv(P, N_BODY, pos, NULL, &body);
}

/* ---- checks --------------------------------------------------------------------------------- */

/* jinja2 reports an unknown filter or test when it compiles the template, except inside if
 * statements and conditional expressions (a "soft" frame), where only using it fails. */
static int check_names(tparser *P, const tnode *x, int soft)
{
    if (!x)
        return 0;
    if ((x->kind == N_FILTER || x->kind == N_TEST) && x->id < 0 && !soft)
        return perr(P, x->pos, "no %s named '%s'", x->kind == N_FILTER ? "filter" : "test",
                    iflow_quoten(x->lit.s.p, x->lit.s.n));
    for (uint32_t i = 0; i < x->n; i++) {
        int s = soft;
        if (x->kind == N_IF || x->kind == N_COND)
            s = 1;
        else if (x->kind == N_FOR)
            s = i == 1 ? soft : 0;
        else if (x->kind == N_MACRO || x->kind == N_SETBLOCK || x->kind == N_FILTERBLOCK)
            s = 0;
        else if (x->kind == N_CALLBLOCK)
            s = i == 0 ? soft : 0;
        else if (x->kind == N_WITH)
            s = i == 0 ? 0 : soft;
        IFLOW_TRY(check_names(P, x->kid[i], s));
    }
    return 0;
}

int tpl_parse(iflow_template *t)
{
    tparser P = {.t = t, .s = t->src, .n = t->len};
    int rc = lex(&P);
    if (rc == 0) {
        t->root = subparse(&P, NULL);
        rc = t->root ? check_names(&P, t->root, 0) : P.rc;
    }
    free(P.tok);
    return rc;
}
