/* grammar.c -- GBNF parsed and compiled to byte-level rules; the recognizer's states. See
 * grammar.h for the language and the contract.
 *
 * Compiled form: one array of elements; an alternative is a run of elements ending in E_END,
 * a rule a list of alternatives (where each run starts). An element matches one byte (E_RANGE:
 * lo..hi; E_SET: one of the grammar's 256-bit sets) or a whole rule (E_RULE). Literals become
 * runs of single-byte ranges (their UTF-8), a class of code points a rule whose alternatives
 * are runs of byte ranges (the UTF-8 encodings of its ranges, split so that each run is a
 * rectangle of byte ranges), and a group or a repetition a rule of its own:
 *     X*      R ::= X R | ""            X+   R ::= X R | X          X?   R ::= X | ""
 *     X{m,n}  m copies of X, then O1 ::= X O2 | "", ..., O(n-m) ::= X | ""
 * so that every alternative is a plain sequence and the recognizer knows two things: bytes and
 * rules. A token reference (<[id]>, <text>; with '!' before it, any token but that one) is one
 * element too (E_TOKEN, E_NTOKEN), which no byte matches: only a whole token, at a token
 * boundary, passes it (iflow_gstate_advance_token); its id is looked up in the vocabulary the
 * state is used with (a text reference: the token spelled so).
 *
 * The recognizer (iflow_gstate): a stack is the list of positions still to match, innermost
 * first, each frame interned as (position, the frame below) so that one integer names a whole
 * stack; frame 0 is the empty stack (a whole sentence). A state is the set of stacks whose top
 * is a byte element, or 0. "Closure" turns a stack whose top is a rule into the stacks of that
 * rule's alternatives (an empty alternative continues with what follows the rule); left
 * recursion would make it endless and is refused at compile time. Advancing a frame by a byte
 * is memoized per (frame, byte), so the vocabulary walk mostly looks results up.
 */
#include "grammar.h"
#include "libcore/base/error.h"
#include "libcore/base/strmap.h"
#include "libcore/base/utf8.h"

#include <xxhash.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- compiled grammar ------------------------------------------------------------------- */

enum { E_END = 0, E_RANGE, E_SET, E_RULE, E_TOKEN, E_NTOKEN };

typedef struct {
    uint8_t kind, lo, hi;
    int32_t arg; /* E_SET: set index; E_RULE: rule index; E_TOKEN, E_NTOKEN: token reference */
} elem;

typedef struct {
    int32_t id;    /* <[id]>, or -1 for a text reference                                    */
    char *text;    /* <text>: the token's vocabulary text, brackets included; NUL-terminated */
    int line, col; /* where it is written, for messages                                     */
} tokref;

typedef struct {
    int32_t *alt;  /* [n_alt] element index where each alternative starts */
    int n_alt, cap_alt;
    int defined;   /* named rules: 1 once "name ::=" was read */
    int line, col; /* named rules: where first used or defined, for messages */
    char *name;    /* NULL for a rule the compiler made */
} rule;

#define MAX_ELEMS (1 << 22)
#define MAX_RULES (1 << 20)
#define MAX_NEST 256
#define GRAMMAR_MASK_CACHE 16 /* masks a state keeps */

struct iflow_grammar {
    elem *e;
    int32_t n_e, cap_e;
    rule *r;
    int32_t n_r, cap_r;
    uint64_t (*sets)[4];
    int32_t n_sets, cap_sets;
    tokref *toks;
    int32_t n_toks, cap_toks;
    int32_t root;
    iflow_u64map set_index; /* while compiling: a set's hash -> its index */
    atomic_int refs; /* owners: a batch's reader thread takes references as the engine drops them */
};

/* ---- parser state ------------------------------------------------------------------------- */

typedef struct {
    elem *v;
    int n, cap;
} seq; /* an alternative being built */

typedef struct {
    iflow_grammar *g;
    const char *text, *s, *end, *line_start;
    int line;
    int depth;
    iflow_strmap names; /* rule name -> rule (keys: the rules' own copies of their names) */
} parser;

static int perr(parser *p, const char *at, const char *what)
{
    const char *ls = p->line_start;
    int line = p->line;
    if (at < ls) { /* a place on an earlier line: count again from the start */
        ls = p->text;
        line = 1;
        for (const char *q = p->text; q < at; q++)
            if (*q == '\n')
                line++, ls = q + 1;
    }
    return iflow_seterr(IFLOW_EINVAL, "grammar: %s, line %d column %d", what, line, (int)(at - ls) + 1);
}

static int grow(void **v, int32_t *cap, int32_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    int32_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *nv = realloc(*v, (size_t)nc * size);
    if (!nv)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    *v = nv;
    *cap = nc;
    return 0;
}

static int seq_push(seq *q, elem x)
{
    if (q->n >= MAX_ELEMS)
        return iflow_seterr(IFLOW_ERANGE, "grammar: too large: more than %d elements", MAX_ELEMS);
    if (grow((void **)&q->v, &q->cap, q->n + 1, sizeof *q->v) < 0)
        return IFLOW_ENOMEM;
    q->v[q->n++] = x;
    return 0;
}

static int new_rule(iflow_grammar *g, const char *name, size_t len)
{
    if (g->n_r >= MAX_RULES)
        return iflow_seterr(IFLOW_ERANGE, "grammar: too large: more than %d rules", MAX_RULES);
    if (grow((void **)&g->r, &g->cap_r, g->n_r + 1, sizeof *g->r) < 0)
        return IFLOW_ENOMEM;
    rule *r = &g->r[g->n_r];
    memset(r, 0, sizeof *r);
    if (name) {
        if (!(r->name = malloc(len + 1)))
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        memcpy(r->name, name, len);
        r->name[len] = 0;
    }
    return g->n_r++;
}

/* Append alternative q (and its E_END) to the grammar as an alternative of rule ri. */
static int add_alt(iflow_grammar *g, int32_t ri, const seq *q)
{
    if ((int64_t)g->n_e + q->n + 1 > MAX_ELEMS)
        return iflow_seterr(IFLOW_ERANGE, "grammar: too large: more than %d elements", MAX_ELEMS);
    if (grow((void **)&g->e, &g->cap_e, g->n_e + q->n + 1, sizeof *g->e) < 0)
        return IFLOW_ENOMEM;
    rule *r = &g->r[ri];
    if (grow((void **)&r->alt, &r->cap_alt, r->n_alt + 1, sizeof *r->alt) < 0)
        return IFLOW_ENOMEM;
    r->alt[r->n_alt++] = g->n_e;
    if (q->n)
        memcpy(g->e + g->n_e, q->v, (size_t)q->n * sizeof *q->v);
    g->n_e += q->n;
    g->e[g->n_e++] = (elem){.kind = E_END};
    return 0;
}

/* ---- code points to UTF-8 byte ranges ---------------------------------------------------- */

typedef struct {
    uint32_t lo, hi;
} cprange;

static int utf8_len(uint32_t c)
{
    return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
}

static int utf8_put(uint32_t c, uint8_t *b)
{
    int n = utf8_len(c);
    if (n == 1)
        b[0] = (uint8_t)c;
    else {
        for (int i = n - 1; i > 0; i--, c >>= 6)
            b[i] = (uint8_t)(0x80 | (c & 0x3F));
        b[0] = (uint8_t)((n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0) | c);
    }
    return n;
}

/* Where the byte-run alternatives of a class go: the single-byte ones merge into one set. */
typedef struct {
    iflow_grammar *g;
    uint64_t ascii[4];
    int any_ascii;
    seq *alts; /* multi-byte runs, each as a seq */
    int n_alts, cap_alts;
} classbuild;

/* Emit the runs for lo..hi, both of one encoded length, splitting until rectangular. */
static int utf8_split(classbuild *cb, uint32_t lo, uint32_t hi)
{
    int n = utf8_len(lo);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) { /* lo is not at the start of its block of 64^i */
                int rc = utf8_split(cb, lo, lo | m);
                return rc < 0 ? rc : utf8_split(cb, (lo | m) + 1, hi);
            }
            if ((hi & m) != m) { /* hi is not at the end of its block */
                int rc = utf8_split(cb, lo, (hi & ~m) - 1);
                return rc < 0 ? rc : utf8_split(cb, hi & ~m, hi);
            }
        }
    }
    uint8_t a[4], b[4];
    utf8_put(lo, a);
    utf8_put(hi, b);
    if (n == 1) {
        for (unsigned c = a[0]; c <= b[0]; c++)
            cb->ascii[c >> 6] |= 1ull << (c & 63);
        cb->any_ascii = 1;
        return 0;
    }
    if (grow((void **)&cb->alts, &cb->cap_alts, cb->n_alts + 1, sizeof *cb->alts) < 0)
        return IFLOW_ENOMEM;
    seq *q = &cb->alts[cb->n_alts++];
    memset(q, 0, sizeof *q);
    for (int i = 0; i < n; i++)
        if (seq_push(q, (elem){.kind = E_RANGE, .lo = a[i], .hi = b[i]}) < 0)
            return IFLOW_ENOMEM;
    return 0;
}

/* lo..hi, any lengths, surrogates left out (UTF-8 never encodes them). */
static int utf8_range(classbuild *cb, uint32_t lo, uint32_t hi)
{
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xD7FF, 0xDFFF, 0xFFFF, 0x10FFFF};
    for (int i = 0; i < 6 && lo <= hi; i++) {
        if (lo > bounds[i])
            continue;
        uint32_t top = hi < bounds[i] ? hi : bounds[i];
        if (bounds[i] != 0xDFFF) { /* 0xD800..0xDFFF: the surrogates, skipped */
            int rc = utf8_split(cb, lo, top);
            if (rc < 0)
                return rc;
        }
        lo = top + 1;
    }
    return 0;
}

/* The index of byte set s, added if new (equal sets are one: found by a hash of their bits). */
static int add_set(iflow_grammar *g, const uint64_t s[4])
{
    uint64_t h = XXH3_64bits(s, 4 * sizeof *s);
    h = h == UINT64_MAX ? 0 : h;
    int32_t at, unused;
    if (iflow_u64map_get(&g->set_index, h, &at, &unused) && !memcmp(g->sets[at], s, sizeof g->sets[at]))
        return at;
    if (grow((void **)&g->sets, &g->cap_sets, g->n_sets + 1, sizeof *g->sets) < 0 ||
        iflow_u64map_put(&g->set_index, h, g->n_sets, 0) < 0) /* a collision: the newer set named */
        return IFLOW_ENOMEM;
    memcpy(g->sets[g->n_sets], s, sizeof g->sets[0]);
    return g->n_sets++;
}

static void classbuild_free(classbuild *cb)
{
    for (int i = 0; i < cb->n_alts; i++)
        free(cb->alts[i].v);
    free(cb->alts);
}

/* ranges [n] (sorted, disjoint) made into one element of q: a byte element when they are all
 * single bytes, else a rule of byte runs. */
static int emit_class(iflow_grammar *g, const cprange *rg, int n, seq *q)
{
    classbuild cb = {.g = g};
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = utf8_range(&cb, rg[i].lo, rg[i].hi);
    if (rc == 0 && cb.n_alts == 0 && cb.any_ascii) {
        int si = add_set(g, cb.ascii);
        rc = si < 0 ? si : seq_push(q, (elem){.kind = E_SET, .arg = si});
    } else if (rc == 0) {
        int ri = new_rule(g, NULL, 0);
        rc = ri;
        if (ri >= 0 && cb.any_ascii) {
            int si = add_set(g, cb.ascii);
            seq one = {0};
            rc = si < 0 ? si : seq_push(&one, (elem){.kind = E_SET, .arg = si});
            if (rc == 0)
                rc = add_alt(g, ri, &one);
            free(one.v);
        }
        for (int i = 0; i < cb.n_alts && rc >= 0; i++)
            rc = add_alt(g, ri, &cb.alts[i]);
        if (rc >= 0)
            rc = seq_push(q, (elem){.kind = E_RULE, .arg = ri});
    }
    classbuild_free(&cb);
    return rc < 0 ? rc : 0;
}

/* ---- lexing ------------------------------------------------------------------------------- */

static int is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skip spaces, newlines and comments. */
static void skip_space(parser *p)
{
    while (p->s < p->end) {
        char c = *p->s;
        if (c == '#') {
            while (p->s < p->end && *p->s != '\n')
                p->s++;
        } else if (c == '\n') {
            p->s++;
            p->line++;
            p->line_start = p->s;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            p->s++;
        } else
            break;
    }
}

/* 1 if a rule definition "name ::=" starts at p->s (after spaces). */
static int at_definition(parser *p)
{
    const char *q = p->s;
    while (q < p->end && is_name_char(*q))
        q++;
    if (q == p->s)
        return 0;
    while (q < p->end && (*q == ' ' || *q == '\t' || *q == '\r'))
        q++;
    return p->end - q >= 3 && !memcmp(q, "::=", 3);
}

/* One UTF-8 character of the grammar text at p->s. */
static int read_utf8(parser *p, uint32_t *cp)
{
    int n = iflow_utf8_decode(p->s, (size_t)(p->end - p->s), cp);
    if (n < 0)
        return perr(p, p->s, "invalid UTF-8");
    p->s += n;
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One character of a literal or class, escapes read. */
static int read_char(parser *p, uint32_t *cp)
{
    if (p->s >= p->end)
        return perr(p, p->s, "unexpected end of the grammar");
    if (*p->s == '\n')
        return perr(p, p->s, "a literal or class is not closed on its line");
    if (*p->s != '\\')
        return read_utf8(p, cp);
    const char *at = p->s++;
    if (p->s >= p->end)
        return perr(p, at, "unexpected end of the grammar after '\\'");
    char c = *p->s++;
    int nhex = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (nhex) {
        uint32_t v = 0;
        for (int i = 0; i < nhex; i++) {
            int h = p->s < p->end ? hexval(*p->s) : -1;
            if (h < 0)
                return perr(p, at, "bad hexadecimal escape");
            v = v << 4 | (uint32_t)h;
            p->s++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            return perr(p, at, "escape names no Unicode scalar value");
        *cp = v;
        return 0;
    }
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '/': case '^':
        *cp = (uint32_t)c;
        return 0;
    default:
        return perr(p, at, "unknown escape");
    }
}

/* ---- items -------------------------------------------------------------------------------- */

static int parse_alts(parser *p, int32_t ri);

static int parse_literal(parser *p, seq *q)
{
    p->s++; /* the opening quote */
    while (p->s < p->end && *p->s != '"') {
        uint32_t c;
        uint8_t b[4];
        if (read_char(p, &c) < 0)
            return IFLOW_EINVAL;
        int n = utf8_put(c, b);
        for (int i = 0; i < n; i++)
            if (seq_push(q, (elem){.kind = E_RANGE, .lo = b[i], .hi = b[i]}) < 0)
                return IFLOW_ENOMEM;
    }
    if (p->s >= p->end)
        return perr(p, p->s, "a literal is not closed");
    p->s++;
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sort and merge; with `negate`, the complement over U+0000..U+10FFFF (rg has room for n + 1).
 * Returns the count, or IFLOW_ENOMEM. */
static int normalize_ranges(cprange *rg, int n, int negate)
{
    if (n > 1)
        qsort(rg, (size_t)n, sizeof *rg, cmp_range);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && rg[i].lo <= rg[m - 1].hi + 1) {
            if (rg[i].hi > rg[m - 1].hi)
                rg[m - 1].hi = rg[i].hi;
        } else
            rg[m++] = rg[i];
    }
    if (!negate)
        return m;
    cprange *tmp = malloc(((size_t)m + 1) * sizeof *tmp); /* m + 1 gaps at most */
    if (!tmp)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    int k = 0;
    uint32_t next = 0;
    for (int i = 0; i < m; i++) {
        if (rg[i].lo > next)
            tmp[k++] = (cprange){next, rg[i].lo - 1};
        next = rg[i].hi + 1;
    }
    if (next <= 0x10FFFF)
        tmp[k++] = (cprange){next, 0x10FFFF};
    memcpy(rg, tmp, (size_t)k * sizeof *rg);
    free(tmp);
    return k;
}

static int parse_class(parser *p, seq *q)
{
    const char *at = p->s++;
    int negate = p->s < p->end && *p->s == '^';
    if (negate)
        p->s++;
    cprange *rg = NULL;
    int32_t n = 0, cap = 0;
    int rc = 0;
    while (rc == 0 && p->s < p->end && *p->s != ']') {
        uint32_t lo, hi;
        if ((rc = read_char(p, &lo)) < 0)
            break;
        hi = lo;
        if (p->end - p->s >= 2 && p->s[0] == '-' && p->s[1] != ']') {
            p->s++;
            if ((rc = read_char(p, &hi)) < 0)
                break;
            if (hi < lo) {
                rc = perr(p, at, "a class range runs backwards");
                break;
            }
        }
        if ((rc = grow((void **)&rg, &cap, n + 2, sizeof *rg)) == 0)
            rg[n++] = (cprange){lo, hi};
    }
    if (rc == 0 && p->s >= p->end)
        rc = perr(p, at, "a class is not closed");
    if (rc == 0) /* the complement has one range more at most */
        rc = grow((void **)&rg, &cap, n + 1, sizeof *rg);
    if (rc == 0) {
        p->s++;
        int m = normalize_ranges(rg, n, negate);
        rc = m < 0 ? m : m == 0 ? perr(p, at, "a class matches no character") : emit_class(p->g, rg, m, q);
    }
    free(rg);
    return rc;
}

/* A name's rule, made (undefined yet) on first use. */
static int rule_of_name(parser *p, const char *name, size_t len, const char *at)
{
    iflow_grammar *g = p->g;
    int32_t known = iflow_strmap_get(&p->names, name, len);
    if (known >= 0)
        return known;
    int ri = new_rule(g, name, len);
    if (ri >= 0 && iflow_strmap_put(&p->names, g->r[ri].name, len, ri) < 0)
        return IFLOW_ENOMEM;
    if (ri >= 0) {
        g->r[ri].line = p->line;
        g->r[ri].col = (int)(at - p->line_start) + 1;
    }
    return ri;
}

/* Make the last `from`.. elements of q one element: themselves if one, else a rule. */
static int as_one(parser *p, seq *q, int from, elem *out)
{
    if (q->n - from == 1) {
        *out = q->v[from];
        q->n = from;
        return 0;
    }
    int ri = new_rule(p->g, NULL, 0);
    if (ri < 0)
        return ri;
    seq tail = {.v = q->v + from, .n = q->n - from};
    int rc = add_alt(p->g, ri, &tail);
    q->n = from;
    *out = (elem){.kind = E_RULE, .arg = ri};
    return rc;
}

/* A rule of two alternatives: [a...] and [b...] (each given by up to two elements; n 0 = ""). */
static int rule2(iflow_grammar *g, const elem *a, int na, const elem *b, int nb)
{
    int ri = new_rule(g, NULL, 0);
    if (ri < 0)
        return ri;
    seq x = {.v = (elem *)a, .n = na}, y = {.v = (elem *)b, .n = nb};
    int rc = add_alt(g, ri, &x);
    if (rc == 0)
        rc = add_alt(g, ri, &y);
    return rc < 0 ? rc : ri;
}

/* x repeated min..max times (max -1: no bound), appended to q. */
static int repeat(parser *p, seq *q, elem x, long min, long max)
{
    iflow_grammar *g = p->g;
    for (long i = 0; i < min; i++) {
        int rc = seq_push(q, x);
        if (rc < 0)
            return rc;
    }
    if (max < 0) { /* R ::= x R | "" */
        int ri = new_rule(g, NULL, 0);
        if (ri < 0)
            return ri;
        elem self = {.kind = E_RULE, .arg = ri}, two[2] = {x, self};
        seq a = {.v = two, .n = 2}, empty = {0};
        int rc = add_alt(g, ri, &a);
        if (rc == 0)
            rc = add_alt(g, ri, &empty);
        return rc < 0 ? rc : seq_push(q, self);
    }
    /* O(k) ::= x O(k-1) | "", built from the innermost out */
    int inner = -1;
    for (long k = 1; k <= max - min; k++) {
        elem two[2] = {x, {.kind = E_RULE, .arg = inner}};
        inner = rule2(g, two, inner < 0 ? 1 : 2, NULL, 0);
        if (inner < 0)
            return inner;
    }
    return inner < 0 ? 0 : seq_push(q, (elem){.kind = E_RULE, .arg = inner});
}

static int read_count(parser *p, long *v)
{
    const char *at = p->s;
    long x = 0;
    if (p->s >= p->end || *p->s < '0' || *p->s > '9')
        return perr(p, at, "a repetition count is missing");
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        x = x * 10 + (*p->s++ - '0');
        if (x > IFLOW_GRAMMAR_MAX_REPEAT)
            return perr(p, at, "a repetition count is over " "10000");
    }
    *v = x;
    return 0;
}

/* Postfix operators on the item that starts at q->v[from]. */
static int parse_postfix(parser *p, seq *q, int from)
{
    for (;;) {
        skip_space(p);
        if (p->s >= p->end)
            return 0;
        char c = *p->s;
        long min, max;
        const char *at = p->s;
        if (c == '*' || c == '+' || c == '?') {
            p->s++;
            min = c == '+';
            max = c == '?' ? 1 : -1;
        } else if (c == '{') {
            p->s++;
            skip_space(p);
            if (read_count(p, &min) < 0)
                return IFLOW_EINVAL;
            skip_space(p);
            max = min;
            if (p->s < p->end && *p->s == ',') {
                p->s++;
                skip_space(p);
                max = -1;
                if (p->s < p->end && *p->s != '}' && read_count(p, &max) < 0)
                    return IFLOW_EINVAL;
                skip_space(p);
            }
            if (p->s >= p->end || *p->s != '}')
                return perr(p, at, "a repetition is not closed by '}'");
            p->s++;
            if (max >= 0 && max < min)
                return perr(p, at, "a repetition's maximum is below its minimum");
        } else
            return 0;
        if (q->n == from)
            return perr(p, at, "a repetition has nothing to repeat");
        elem x;
        int rc = as_one(p, q, from, &x);
        if (rc == 0)
            rc = repeat(p, q, x, min, max);
        if (rc < 0)
            return rc;
    }
}

/* A token reference at p->s: <[id]> or <text>, '!' before it for any token but that one. */
static int parse_token(parser *p, seq *q)
{
    const char *at = p->s;
    int neg = *p->s == '!';
    p->s += neg;
    const char *open = p->s, *close = open + 1;
    while (close < p->end && *close != '>' && *close != '\n')
        close++;
    if (close >= p->end || *close != '>')
        return perr(p, at, "a token reference is not closed by '>'");
    tokref t = {.id = -1, .line = p->line, .col = (int)(at - p->line_start) + 1};
    if (open[1] == '[') { /* <[id]> */
        const char *d = open + 2;
        long long id = 0;
        if (d >= close - 1 || close[-1] != ']')
            return perr(p, at, "a token id must be written <[digits]>");
        for (; d < close - 1; d++) {
            if (*d < '0' || *d > '9')
                return perr(p, at, "a token id must be written <[digits]>");
            if ((id = id * 10 + (*d - '0')) > INT32_MAX)
                return perr(p, at, "a token id is too large");
        }
        t.id = (int32_t)id;
    } else if (close == open + 1) {
        return perr(p, at, "an empty token reference '<>'");
    } else {
        size_t n = (size_t)(close - open) + 1;
        if (!(t.text = malloc(n + 1)))
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        memcpy(t.text, open, n);
        t.text[n] = 0;
    }
    iflow_grammar *g = p->g;
    if (grow((void **)&g->toks, &g->cap_toks, g->n_toks + 1, sizeof *g->toks) < 0) {
        free(t.text);
        return IFLOW_ENOMEM;
    }
    g->toks[g->n_toks] = t;
    p->s = close + 1;
    return seq_push(q, (elem){.kind = neg ? E_NTOKEN : E_TOKEN, .arg = g->n_toks++});
}

/* One item and its postfix operators; 0 if there is none here (the sequence ends). */
static int parse_item(parser *p, seq *q)
{
    skip_space(p);
    if (p->s >= p->end)
        return 0;
    const char *at = p->s;
    int from = q->n, rc = 0;
    char c = *p->s;
    if (c == '"') {
        rc = parse_literal(p, q); /* "" adds nothing: a repetition after it has nothing to repeat */
    } else if (c == '[') {
        rc = parse_class(p, q);
    } else if (c == '<' || (c == '!' && p->end - p->s > 1 && p->s[1] == '<')) {
        rc = parse_token(p, q);
    } else if (c == '.') {
        p->s++;
        cprange any = {0, 0x10FFFF};
        rc = emit_class(p->g, &any, 1, q);
    } else if (c == '(') {
        if (++p->depth > MAX_NEST)
            return perr(p, at, "groups nest deeper than 256");
        p->s++;
        int ri = new_rule(p->g, NULL, 0);
        if (ri < 0)
            return ri;
        if ((rc = parse_alts(p, ri)) < 0)
            return rc;
        skip_space(p);
        if (p->s >= p->end || *p->s != ')')
            return perr(p, at, "a group is not closed by ')'");
        p->s++;
        p->depth--;
        rc = seq_push(q, (elem){.kind = E_RULE, .arg = ri});
    } else if (is_name_char(c)) {
        if (at_definition(p))
            return 0;
        const char *name = p->s;
        while (p->s < p->end && is_name_char(*p->s))
            p->s++;
        int ri = rule_of_name(p, name, (size_t)(p->s - name), name);
        rc = ri < 0 ? ri : seq_push(q, (elem){.kind = E_RULE, .arg = ri});
    } else
        return 0;
    if (rc < 0)
        return rc;
    rc = parse_postfix(p, q, from);
    return rc < 0 ? rc : 1;
}

/* Alternatives of rule ri, up to ')' or the end of the rule. */
static int parse_alts(parser *p, int32_t ri)
{
    seq q = {0};
    int rc;
    for (;;) {
        q.n = 0;
        while ((rc = parse_item(p, &q)) > 0)
            ;
        if (rc < 0 || (rc = add_alt(p->g, ri, &q)) < 0)
            break;
        skip_space(p);
        if (p->s < p->end && *p->s == '|') {
            p->s++;
            continue;
        }
        break;
    }
    free(q.v);
    return rc;
}

static int parse_rule(parser *p)
{
    const char *name = p->s;
    while (p->s < p->end && is_name_char(*p->s))
        p->s++;
    if (p->s == name)
        return perr(p, name, "a rule name is expected");
    size_t len = (size_t)(p->s - name);
    skip_space(p);
    if (p->end - p->s < 3 || memcmp(p->s, "::=", 3) != 0)
        return perr(p, p->s, "'::=' is expected after a rule name");
    int ri = rule_of_name(p, name, len, name);
    if (ri < 0)
        return ri;
    if (p->g->r[ri].defined) {
        char what[300];
        snprintf(what, sizeof what, "rule '%.*s' is defined twice", (int)(len < 200 ? len : 200), name);
        return perr(p, name, what);
    }
    p->g->r[ri].defined = 1;
    p->g->r[ri].line = p->line;
    p->g->r[ri].col = (int)(name - p->line_start) + 1;
    p->s += 3;
    int rc = parse_alts(p, ri);
    if (rc < 0)
        return rc;
    skip_space(p);
    if (p->s < p->end && !at_definition(p))
        return perr(p, p->s, *p->s == ')' ? "a ')' closes no group" : "unexpected character");
    return 0;
}

/* ---- checks after parsing ----------------------------------------------------------------- */

/* nullable [n_r]: the rules that can match "". */
static void find_nullable(const iflow_grammar *g, uint8_t *nullable)
{
    memset(nullable, 0, (size_t)g->n_r);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t i = 0; i < g->n_r; i++) {
            if (nullable[i])
                continue;
            for (int a = 0; a < g->r[i].n_alt && !nullable[i]; a++) {
                const elem *e = g->e + g->r[i].alt[a];
                while (e->kind == E_RULE && nullable[e->arg])
                    e++;
                if (e->kind == E_END)
                    nullable[i] = 1, changed = 1;
            }
        }
    }
}

/* Left recursion: a rule reaching itself through the rules each alternative can start with
 * (those before them all nullable). Iterative depth-first search, colours 0 new, 1 on the
 * path, 2 done. */
static int check_left_recursion(iflow_grammar *g)
{
    uint8_t *nullable = malloc((size_t)g->n_r + 1), *colour = calloc((size_t)g->n_r + 1, 1);
    int32_t *stack = malloc(((size_t)g->n_r + 1) * sizeof *stack);
    int32_t *next_alt = malloc(((size_t)g->n_r + 1) * sizeof *next_alt); /* per rule: alt, elem */
    int32_t *next_el = malloc(((size_t)g->n_r + 1) * sizeof *next_el);
    int rc = 0;
    if (!nullable || !colour || !stack || !next_alt || !next_el)
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    if (rc == 0)
        find_nullable(g, nullable);
    for (int32_t s = 0; rc == 0 && s < g->n_r; s++) {
        if (colour[s])
            continue;
        int top = 0;
        stack[top++] = s;
        colour[s] = 1;
        next_alt[s] = 0;
        next_el[s] = -1;
        while (top > 0 && rc == 0) {
            int32_t r = stack[top - 1];
            /* the next rule r can start with */
            int32_t child = -1;
            while (child < 0 && next_alt[r] < g->r[r].n_alt) {
                const elem *e = g->e + g->r[r].alt[next_alt[r]];
                int32_t k = next_el[r] + 1; /* continue after the last one examined */
                if (k > 0 && !(e[k - 1].kind == E_RULE && nullable[e[k - 1].arg]))
                    k = -1; /* the last one was not nullable: this alternative is done */
                if (k >= 0 && e[k].kind == E_RULE) {
                    child = e[k].arg;
                    next_el[r] = k;
                } else {
                    next_alt[r]++;
                    next_el[r] = -1;
                }
            }
            if (child < 0) {
                colour[r] = 2;
                top--;
            } else if (colour[child] == 1) {
                const rule *c = &g->r[child];
                rc = c->name ? iflow_seterr(IFLOW_EINVAL, "grammar: left recursion: rule '%s' can reach itself "
                                            "before matching a character, line %d column %d", c->name, c->line, c->col)
                             : iflow_seterr(IFLOW_EINVAL, "grammar: left recursion: a group or repetition can reach "
                                            "itself before matching a character (an empty item repeated?)");
            } else if (colour[child] == 0) {
                colour[child] = 1;
                next_alt[child] = 0;
                next_el[child] = -1;
                stack[top++] = child;
            }
        }
    }
    free(nullable);
    free(colour);
    free(stack);
    free(next_alt);
    free(next_el);
    return rc;
}

void iflow_grammar_close(iflow_grammar *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1)
        return;
    for (int32_t i = 0; i < g->n_r; i++) {
        free(g->r[i].alt);
        free(g->r[i].name);
    }
    free(g->r);
    free(g->e);
    free(g->sets);
    for (int32_t i = 0; i < g->n_toks; i++)
        free(g->toks[i].text);
    free(g->toks);
    iflow_u64map_free(&g->set_index);
    free(g);
}

iflow_grammar *iflow_grammar_ref(iflow_grammar *g)
{
    if (g)
        atomic_fetch_add(&g->refs, 1);
    return g;
}

int iflow_grammar_open(iflow_grammar **out, const char *text, size_t len, const char *root)
{
    *out = NULL;
    if (len > IFLOW_GRAMMAR_MAX_TEXT)
        return iflow_seterr(IFLOW_ERANGE, "grammar: %zu bytes, over the limit of %u", len, IFLOW_GRAMMAR_MAX_TEXT);
    iflow_grammar *g = calloc(1, sizeof *g);
    if (!g)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    atomic_init(&g->refs, 1);
    parser p = {.g = g, .text = text, .s = text, .end = text + len, .line_start = text, .line = 1};
    int rc = 0;
    skip_space(&p);
    if (p.s >= p.end)
        rc = iflow_seterr(IFLOW_EINVAL, "grammar: no rules");
    while (rc == 0 && p.s < p.end) {
        rc = parse_rule(&p);
        skip_space(&p);
    }
    for (int32_t i = 0; rc == 0 && i < g->n_r; i++)
        if (g->r[i].name && !g->r[i].defined)
            rc = iflow_seterr(IFLOW_EINVAL, "grammar: rule '%s' is used but never defined, line %d column %d",
                              g->r[i].name, g->r[i].line, g->r[i].col);
    if (rc == 0) {
        const char *rn = root ? root : "root";
        if ((g->root = iflow_strmap_get(&p.names, rn, strlen(rn))) < 0)
            rc = iflow_seterr(IFLOW_EINVAL, "grammar: no rule '%s' to start from", rn);
    }
    iflow_strmap_free(&p.names);
    iflow_u64map_free(&g->set_index);
    if (rc == 0)
        rc = check_left_recursion(g);
    if (rc < 0) {
        iflow_grammar_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* ---- the recognizer ------------------------------------------------------------------------ */

typedef struct {
    int32_t pos, parent;
} frame;

typedef struct {
    uint64_t key;   /* frame << 8 | byte, + 1 (0: empty slot) */
    uint32_t off, n; /* results in the pool */
} memo_slot;

struct iflow_gstate {
    const iflow_grammar *g;
    frame *fr;            /* [n_fr] interned frames; 0 is the empty stack            */
    int32_t n_fr, cap_fr;
    uint32_t *itab;       /* intern hash table: frame id, or 0 for empty             */
    uint32_t itab_cap;    /* a power of two                                          */
    uint32_t *mark;       /* [cap_fr] a closure's visited marks (stamp)              */
    uint32_t *omark;      /* [cap_fr] a set's members (ostamp)                       */
    uint32_t stamp, ostamp;
    memo_slot *memo;      /* advance(frame, byte) -> frames                           */
    uint32_t memo_cap, memo_n;
    int32_t *pool;        /* the memo's results                                      */
    int32_t n_pool, cap_pool;
    int32_t *work;        /* a closure's worklist                                    */
    int32_t cap_work;
    int32_t *cur;         /* the state: frames whose top is a byte, or 0             */
    int32_t n_cur, cap_cur;
    int32_t *buf;         /* sets of the vocabulary walk, by depth                   */
    int32_t n_buf, cap_buf;
    /* masks made, by state: the state after each character inside a string, say, is the same
     * set of stacks again, and its mask is then copied instead of walked */
    struct mask_entry {
        int32_t *set;     /* the state's stacks, sorted                              */
        int32_t n_set;
        uint64_t hash;
        uint64_t *bits;   /* [n_vocab / 64 rounded up] the mask                      */
        int count;
        uint64_t used;    /* when last used, for eviction                            */
    } mcache[GRAMMAR_MASK_CACHE];
    const void *mcache_vocab;
    uint64_t mcache_clock;
    /* the vocabulary walk's sets of stacks, interned (sorted members in spool), and its steps:
     * (set, byte) -> set, so that nodes whose parents hold the same set share one step */
    struct iset {
        uint32_t off, n;
        uint64_t hash;
    } *isets;
    int32_t n_isets, cap_isets;
    int32_t *spool;
    int32_t n_spool, cap_spool;
    uint32_t *iset_tab;   /* hash table of set ids + 1 */
    uint32_t iset_tab_cap;
    memo_slot *trans;     /* key (set << 8 | byte) + 1 -> off = the next set + 1 (0: none) */
    uint32_t trans_cap, trans_n;
};

static uint32_t hash2(uint32_t a, uint32_t b)
{
    uint64_t h = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32);
}

static int itab_grow(iflow_gstate *s)
{
    uint32_t nc = s->itab_cap ? s->itab_cap * 2 : 1024;
    uint32_t *t = calloc(nc, sizeof *t);
    if (!t)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int32_t id = 1; id < s->n_fr; id++) {
        uint32_t h = hash2((uint32_t)s->fr[id].pos, (uint32_t)s->fr[id].parent) & (nc - 1);
        while (t[h])
            h = (h + 1) & (nc - 1);
        t[h] = (uint32_t)id;
    }
    free(s->itab);
    s->itab = t;
    s->itab_cap = nc;
    return 0;
}

/* The id of frame (pos, parent), made if new; < 0 on error. */
static int32_t intern(iflow_gstate *s, int32_t pos, int32_t parent)
{
    if ((uint32_t)s->n_fr * 2 >= s->itab_cap && itab_grow(s) < 0)
        return IFLOW_ENOMEM;
    uint32_t h = hash2((uint32_t)pos, (uint32_t)parent) & (s->itab_cap - 1);
    for (; s->itab[h]; h = (h + 1) & (s->itab_cap - 1)) {
        const frame *f = &s->fr[s->itab[h]];
        if (f->pos == pos && f->parent == parent)
            return (int32_t)s->itab[h];
    }
    if ((uint32_t)s->n_fr >= IFLOW_GRAMMAR_MAX_FRAMES)
        return iflow_seterr(IFLOW_ERANGE, "grammar: the parse holds more than %u stack frames "
                            "(IFLOW_GRAMMAR_MAX_FRAMES): too deep or too ambiguous", IFLOW_GRAMMAR_MAX_FRAMES);
    if (s->n_fr >= s->cap_fr) {
        int32_t nc = s->cap_fr * 2;
        frame *f = realloc(s->fr, (size_t)nc * sizeof *f);
        uint32_t *m = f ? realloc(s->mark, (size_t)nc * sizeof *m) : NULL;
        if (f)
            s->fr = f;
        if (m)
            s->mark = m;
        uint32_t *o = m ? realloc(s->omark, (size_t)nc * sizeof *o) : NULL;
        if (!o)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        s->omark = o;
        memset(s->mark + s->cap_fr, 0, (size_t)(nc - s->cap_fr) * sizeof *m);
        memset(s->omark + s->cap_fr, 0, (size_t)(nc - s->cap_fr) * sizeof *o);
        s->cap_fr = nc;
    }
    int32_t id = s->n_fr++;
    s->fr[id] = (frame){pos, parent};
    s->itab[h] = (uint32_t)id;
    return id;
}

/* The stack after the top element of frame f is matched: the next position, or the frame below
 * when the alternative ends there. */
static int32_t next_of(iflow_gstate *s, int32_t f)
{
    int32_t p = s->fr[f].pos + 1;
    return s->g->e[p].kind == E_END ? s->fr[f].parent : intern(s, p, s->fr[f].parent);
}

/* The first element of alternative `start` pushed on `cont` (or cont itself when it is empty). */
static int32_t push_alt(iflow_gstate *s, int32_t start, int32_t cont)
{
    return s->g->e[start].kind == E_END ? cont : intern(s, start, cont);
}

static int push_work(iflow_gstate *s, int32_t *n, int32_t f)
{
    if (f < 0)
        return f;
    if (s->mark[f] == s->stamp)
        return 0;
    s->mark[f] = s->stamp;
    if (grow((void **)&s->work, &s->cap_work, *n + 1, sizeof *s->work) < 0)
        return IFLOW_ENOMEM;
    s->work[(*n)++] = f;
    return 0;
}

/* Add to *set the closure of stack f: the stacks whose top is a byte (or 0) it expands to.
 * Members are deduplicated by omark == ostamp. */
static int closure(iflow_gstate *s, int32_t f, int32_t **set, int32_t *n, int32_t *cap)
{
    int32_t nw = 0;
    if (++s->stamp == 0) { /* wrapped: clear the marks */
        memset(s->mark, 0, (size_t)s->cap_fr * sizeof *s->mark);
        s->stamp = 1;
    }
    int rc = push_work(s, &nw, f);
    while (rc == 0 && nw > 0) {
        int32_t x = s->work[--nw];
        const elem *e = x ? &s->g->e[s->fr[x].pos] : NULL;
        if (!e || e->kind != E_RULE) { /* a byte or a token on top, or the empty stack */
            if (s->omark[x] != s->ostamp) {
                s->omark[x] = s->ostamp;
                if ((rc = grow((void **)set, cap, *n + 1, sizeof **set)) < 0)
                    break;
                (*set)[(*n)++] = x;
            }
            continue;
        }
        const rule *r = &s->g->r[e->arg];
        int32_t cont = next_of(s, x);
        for (int a = 0; a < r->n_alt && rc == 0; a++)
            rc = cont < 0 ? cont : push_work(s, &nw, push_alt(s, r->alt[a], cont));
    }
    return rc;
}

static int new_ostamp(iflow_gstate *s)
{
    if (++s->ostamp == 0) {
        memset(s->omark, 0, (size_t)s->cap_fr * sizeof *s->omark);
        s->ostamp = 1;
    }
    return 0;
}

static int byte_ok(const iflow_grammar *g, const elem *e, uint8_t b)
{
    if (e->kind == E_RANGE)
        return b >= e->lo && b <= e->hi;
    return e->kind == E_SET && (g->sets[e->arg][b >> 6] >> (b & 63)) & 1; /* no byte passes a token */
}

/* Double a table of memo slots keyed by 64 bits (*tab [*cap], a power of two; 0 at first). */
static int memo_table_grow(memo_slot **tab, uint32_t *cap)
{
    uint32_t nc = *cap ? *cap * 2 : 4096;
    memo_slot *t = calloc(nc, sizeof *t);
    if (!t)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < *cap; i++) {
        const memo_slot *x = &(*tab)[i];
        if (!x->key)
            continue;
        uint32_t h = hash2((uint32_t)(x->key >> 32), (uint32_t)x->key) & (nc - 1);
        while (t[h].key)
            h = (h + 1) & (nc - 1);
        t[h] = *x;
    }
    free(*tab);
    *tab = t;
    *cap = nc;
    return 0;
}

/* The stacks frame f becomes after byte b (memoized): *res points into the pool (valid until
 * the next call), *n of them. */
static int advance_frame(iflow_gstate *s, int32_t f, uint8_t b, const int32_t **res, int32_t *n)
{
    const elem *e = &s->g->e[s->fr[f].pos];
    if (!byte_ok(s->g, e, b)) {
        *n = 0;
        return 0;
    }
    if (s->memo_n * 2 >= s->memo_cap && memo_table_grow(&s->memo, &s->memo_cap) < 0)
        return IFLOW_ENOMEM;
    uint64_t key = ((uint64_t)(uint32_t)f << 8 | b) + 1;
    uint32_t h = hash2((uint32_t)(key >> 32), (uint32_t)key) & (s->memo_cap - 1);
    for (; s->memo[h].key; h = (h + 1) & (s->memo_cap - 1))
        if (s->memo[h].key == key) {
            *res = s->pool + s->memo[h].off;
            *n = (int32_t)s->memo[h].n;
            return 0;
        }
    int32_t off = s->n_pool, nxt = next_of(s, f);
    new_ostamp(s);
    int rc = nxt < 0 ? nxt : closure(s, nxt, &s->pool, &s->n_pool, &s->cap_pool);
    if (rc < 0)
        return rc;
    s->memo[h] = (memo_slot){.key = key, .off = (uint32_t)off, .n = (uint32_t)(s->n_pool - off)};
    s->memo_n++;
    *res = s->pool + off;
    *n = s->n_pool - off;
    return 0;
}

/* out = the stacks of set in [n_in] after byte b, appended to *buf at *n_buf. Returns the count
 * (0: the byte is rejected by every stack) or < 0. `in` may point into *buf: it is read by
 * offset. */
static int advance_set(iflow_gstate *s, int32_t in_off, int32_t n_in, int32_t **buf, int32_t *n_buf, int32_t *cap,
                       uint8_t b)
{
    int32_t start = *n_buf;
    uint32_t stamp_out;
    /* the memo's own closures use ostamp; collect first, then deduplicate with a fresh stamp */
    for (int32_t i = 0; i < n_in; i++) {
        int32_t f = (*buf)[in_off + i];
        if (f == 0)
            continue;
        const int32_t *res;
        int32_t nr;
        int rc = advance_frame(s, f, b, &res, &nr);
        if (rc < 0)
            return rc;
        if (nr == 0)
            continue;
        int32_t roff = (int32_t)(res - s->pool);
        if (grow((void **)buf, cap, *n_buf + nr, sizeof **buf) < 0)
            return IFLOW_ENOMEM;
        memcpy(*buf + *n_buf, s->pool + roff, (size_t)nr * sizeof **buf);
        *n_buf += nr;
    }
    int32_t m = *n_buf;
    if (n_in > 1) { /* one frame's results are distinct already */
        new_ostamp(s);
        stamp_out = s->ostamp;
        m = start;
        for (int32_t i = start; i < *n_buf; i++) {
            int32_t f = (*buf)[i];
            if (s->omark[f] != stamp_out) {
                s->omark[f] = stamp_out;
                (*buf)[m++] = f;
            }
        }
        *n_buf = m;
    }
    if (m - start > IFLOW_GRAMMAR_MAX_STACKS)
        return iflow_seterr(IFLOW_ERANGE, "grammar: more than %d parses alive at once (IFLOW_GRAMMAR_MAX_STACKS): "
                            "an ambiguous grammar, or that many alternatives open at once", IFLOW_GRAMMAR_MAX_STACKS);
    return m - start;
}

void iflow_gstate_close(iflow_gstate *s)
{
    if (!s)
        return;
    free(s->fr);
    free(s->itab);
    free(s->mark);
    free(s->omark);
    free(s->memo);
    free(s->pool);
    free(s->work);
    free(s->cur);
    free(s->buf);
    for (int i = 0; i < GRAMMAR_MASK_CACHE; i++) {
        free(s->mcache[i].set);
        free(s->mcache[i].bits);
    }
    free(s->isets);
    free(s->spool);
    free(s->iset_tab);
    free(s->trans);
    free(s);
}

int iflow_gstate_open(iflow_gstate **out, const iflow_grammar *g)
{
    *out = NULL;
    iflow_gstate *s = calloc(1, sizeof *s);
    if (!s)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    s->g = g;
    s->cap_fr = 1024;
    s->fr = malloc((size_t)s->cap_fr * sizeof *s->fr);
    s->mark = calloc((size_t)s->cap_fr, sizeof *s->mark);
    s->omark = calloc((size_t)s->cap_fr, sizeof *s->omark);
    int rc = s->fr && s->mark && s->omark ? itab_grow(s) : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    s->n_fr = 1;
    if (s->fr)
        s->fr[0] = (frame){-1, -1};
    new_ostamp(s);
    const rule *root = &g->r[g->root];
    for (int a = 0; a < root->n_alt && rc == 0; a++) {
        int32_t f = push_alt(s, root->alt[a], 0);
        rc = f < 0 ? f : closure(s, f, &s->cur, &s->n_cur, &s->cap_cur);
    }
    if (rc < 0) {
        iflow_gstate_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* The state after bytes [n], into s->buf from offset 0; returns the count (0: rejected). */
static int run_bytes(iflow_gstate *s, const uint8_t *bytes, size_t n)
{
    s->n_buf = 0;
    if (grow((void **)&s->buf, &s->cap_buf, s->n_cur, sizeof *s->buf) < 0)
        return IFLOW_ENOMEM;
    memcpy(s->buf, s->cur, (size_t)s->n_cur * sizeof *s->buf);
    int32_t off = 0, cnt = s->n_cur;
    s->n_buf = cnt;
    for (size_t i = 0; i < n && cnt > 0; i++) {
        int32_t at = s->n_buf;
        int rc = advance_set(s, off, cnt, &s->buf, &s->n_buf, &s->cap_buf, bytes[i]);
        if (rc < 0)
            return rc;
        /* keep only the newest set: move it to the front */
        memmove(s->buf, s->buf + at, (size_t)rc * sizeof *s->buf);
        s->n_buf = rc;
        off = 0;
        cnt = rc;
    }
    return cnt;
}

/* The state becomes the cnt stacks run_bytes() or run_token() left in s->buf: 0, or cnt itself
 * when < 0, or IFLOW_EINVAL when 0 (they were rejected; the state stays). */
static int take_buf(iflow_gstate *s, int cnt)
{
    if (cnt <= 0)
        return cnt < 0 ? cnt : IFLOW_EINVAL;
    int32_t c = s->cap_cur;
    if (grow((void **)&s->cur, &c, cnt, sizeof *s->cur) < 0)
        return IFLOW_ENOMEM;
    s->cap_cur = c;
    memcpy(s->cur, s->buf, (size_t)cnt * sizeof *s->cur);
    s->n_cur = cnt;
    return 0;
}

int iflow_gstate_advance(iflow_gstate *s, const char *bytes, size_t n)
{
    int rc = take_buf(s, run_bytes(s, (const uint8_t *)bytes, n));
    return rc == IFLOW_EINVAL ? iflow_seterr(rc, "grammar: the text does not follow the grammar") : rc;
}

int iflow_gstate_test(iflow_gstate *s, const char *bytes, size_t n)
{
    int cnt = run_bytes(s, (const uint8_t *)bytes, n);
    return cnt < 0 ? cnt : cnt > 0;
}

int iflow_gstate_can_end(const iflow_gstate *s)
{
    for (int32_t i = 0; i < s->n_cur; i++)
        if (s->cur[i] == 0)
            return 1;
    return 0;
}

int iflow_gstate_is_done(const iflow_gstate *s)
{
    return s->n_cur == 1 && s->cur[0] == 0;
}

int iflow_grammar_match(const iflow_grammar *g, const char *text, size_t n, int *prefix)
{
    iflow_gstate *s;
    int rc = iflow_gstate_open(&s, g);
    if (rc < 0)
        return rc;
    int cnt = run_bytes(s, (const uint8_t *)text, n), whole = 0;
    for (int i = 0; i < cnt && !whole; i++)
        whole = s->buf[i] == 0;
    iflow_gstate_close(s);
    if (cnt < 0)
        return cnt;
    if (prefix)
        *prefix = cnt > 0;
    return whole;
}

/* ---- token references ---------------------------------------------------------------------- */

/* The id reference k names in vocabulary v, or -1 (not one of its tokens). */
static int32_t tokref_id(const iflow_grammar *g, const iflow_gvocab *v, int32_t k);

/* The token element on top of stack f, or NULL (a byte, or the empty stack). */
static const elem *token_top(const iflow_gstate *s, int32_t f)
{
    const elem *e = f ? &s->g->e[s->fr[f].pos] : NULL;
    return e && (e->kind == E_TOKEN || e->kind == E_NTOKEN) ? e : NULL;
}

/* Does token element e let token id pass? */
static int token_passes(const iflow_gstate *s, const iflow_gvocab *v, const elem *e, int32_t id)
{
    int32_t want = tokref_id(s->g, v, e->arg);
    return e->kind == E_TOKEN ? id == want : want >= 0 && id != want;
}

int iflow_gstate_token_allows(const iflow_gstate *s, const iflow_gvocab *v, int32_t id)
{
    for (int32_t i = 0; i < s->n_cur; i++) {
        const elem *e = token_top(s, s->cur[i]);
        if (e && token_passes(s, v, e, id))
            return 1;
    }
    return 0;
}

/* The state after token id, whose bytes are [n], into s->buf from offset 0: the stacks its bytes
 * lead to (none when it has no bytes) and those a token reference on top lets it pass. Returns
 * the count (0: rejected). */
static int run_token(iflow_gstate *s, const iflow_gvocab *v, int32_t id, const char *bytes, size_t n)
{
    int cnt = n > 0 ? run_bytes(s, (const uint8_t *)bytes, n) : 0;
    if (cnt < 0)
        return cnt;
    s->n_buf = cnt;
    int marked = 0;
    for (int32_t i = 0; i < s->n_cur; i++) {
        const elem *e = token_top(s, s->cur[i]);
        if (!e || !token_passes(s, v, e, id))
            continue;
        if (!marked) { /* the stacks so far, so that closure() adds each once */
            new_ostamp(s);
            for (int32_t k = 0; k < s->n_buf; k++)
                s->omark[s->buf[k]] = s->ostamp;
            marked = 1;
        }
        int32_t nxt = next_of(s, s->cur[i]);
        int rc = nxt < 0 ? nxt : closure(s, nxt, &s->buf, &s->n_buf, &s->cap_buf);
        if (rc < 0)
            return rc;
    }
    if (s->n_buf > IFLOW_GRAMMAR_MAX_STACKS)
        return iflow_seterr(IFLOW_ERANGE, "grammar: more than %d parses alive at once (IFLOW_GRAMMAR_MAX_STACKS): "
                            "an ambiguous grammar, or that many alternatives open at once", IFLOW_GRAMMAR_MAX_STACKS);
    return s->n_buf;
}

int iflow_gstate_advance_token(iflow_gstate *s, const iflow_gvocab *v, int32_t id, const char *bytes, size_t n)
{
    int rc = take_buf(s, run_token(s, v, id, bytes, n));
    return rc == IFLOW_EINVAL ? iflow_seterr(rc, "grammar: token %d does not follow the grammar", id) : rc;
}

int iflow_gstate_test_token(iflow_gstate *s, const iflow_gvocab *v, int32_t id, const char *bytes, size_t n)
{
    int cnt = run_token(s, v, id, bytes, n);
    return cnt < 0 ? cnt : cnt > 0;
}

/* allowed [n_vocab] |= the tokens a token reference on top of a stack lets pass; returns how
 * many were added. */
static int token_mask(const iflow_gstate *s, const iflow_gvocab *v, uint8_t *allowed)
{
    int added = 0;
    for (int32_t i = 0; i < s->n_cur; i++) {
        const elem *e = token_top(s, s->cur[i]);
        int32_t want = e ? tokref_id(s->g, v, e->arg) : -1;
        if (want < 0)
            continue;
        const int32_t lo = e->kind == E_TOKEN ? want : 0, hi = e->kind == E_TOKEN ? want + 1 : iflow_gvocab_n(v);
        for (int32_t id = lo; id < hi; id++)
            if (!allowed[id] && id != (e->kind == E_NTOKEN ? want : -1)) {
                allowed[id] = 1;
                added++;
            }
    }
    return added;
}

/* ---- the vocabulary ------------------------------------------------------------------------ */

typedef struct {
    int32_t child, sibling; /* first child, next sibling (-1: none)                      */
    int32_t tok, n_tok;     /* tokens whose bytes end here: v->ids[tok .. tok + n_tok)    */
    uint8_t byte;
} tnode;

struct iflow_gvocab {
    int32_t n_vocab;
    tnode *node;            /* [n_node]; node 0 is the root (no byte)                     */
    int32_t n_node, cap_node;
    int32_t *ids;           /* token ids in trie order                                    */
    char **piece;           /* [n_vocab] each token's bytes (NULL: none)                  */
    uint32_t *plen;         /* [n_vocab]                                                  */
    int32_t max_len;
    iflow_strmap texts;     /* a token's vocabulary text ("<|im_end|>") -> its id          */
    char *arena;            /* the texts' bytes (the map's keys)                          */
};

void iflow_gvocab_close(iflow_gvocab *v)
{
    if (!v)
        return;
    if (v->piece)
        for (int32_t i = 0; i < v->n_vocab; i++)
            free(v->piece[i]);
    free(v->piece);
    free(v->plen);
    free(v->node);
    free(v->ids);
    iflow_strmap_free(&v->texts);
    free(v->arena);
    free(v);
}

/* texts: each token's vocabulary text -> its id (the first id when two share a text). */
static int index_texts(iflow_gvocab *v, const iflow_tokenizer *tok)
{
    size_t total = 0, len, at = 0;
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (iflow_tokenizer_token_text(tok, id, &len))
            total += len;
    if (!(v->arena = malloc(total + 1)) || iflow_strmap_reserve(&v->texts, (size_t)v->n_vocab) < 0)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int32_t id = 0; id < v->n_vocab; id++) {
        const char *s = iflow_tokenizer_token_text(tok, id, &len);
        if (!s || !len || iflow_strmap_get(&v->texts, s, len) >= 0)
            continue;
        memcpy(v->arena + at, s, len);
        if (iflow_strmap_put(&v->texts, v->arena + at, len, id) < 0)
            return IFLOW_ENOMEM;
        at += len;
    }
    return 0;
}

int32_t iflow_gvocab_n(const iflow_gvocab *v)
{
    return v->n_vocab;
}

static int32_t tokref_id(const iflow_grammar *g, const iflow_gvocab *v, int32_t k)
{
    const tokref *t = &g->toks[k];
    int32_t id = t->text ? iflow_strmap_get(&v->texts, t->text, strlen(t->text)) : t->id;
    return id >= 0 && id < v->n_vocab ? id : -1;
}

int iflow_grammar_check_vocab(const iflow_grammar *g, const iflow_gvocab *v)
{
    for (int32_t k = 0; k < g->n_toks; k++) {
        const tokref *t = &g->toks[k];
        if (tokref_id(g, v, k) >= 0)
            continue;
        if (t->text)
            return iflow_seterr(IFLOW_EINVAL, "grammar: %s is not a token of the vocabulary, line %d column %d",
                                t->text, t->line, t->col);
        return iflow_seterr(IFLOW_EINVAL, "grammar: token id %d is outside the vocabulary of %d, line %d column %d",
                            t->id, v->n_vocab, t->line, t->col);
    }
    return 0;
}

static const iflow_gvocab *sort_v; /* qsort's context: set only inside iflow_gvocab_open */

static int cmp_piece(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = sort_v->plen[x], ly = sort_v->plen[y];
    int c = memcmp(sort_v->piece[x], sort_v->piece[y], lx < ly ? lx : ly);
    return c ? c : lx < ly ? -1 : lx > ly ? 1 : x < y ? -1 : x > y;
}

static int32_t new_node(iflow_gvocab *v, uint8_t byte)
{
    if (grow((void **)&v->node, &v->cap_node, v->n_node + 1, sizeof *v->node) < 0)
        return IFLOW_ENOMEM;
    v->node[v->n_node] = (tnode){.child = -1, .sibling = -1, .tok = 0, .n_tok = 0, .byte = byte};
    return v->n_node++;
}

/* The trie of ids [n] sorted by their bytes: one path per distinct prefix; siblings come in
 * increasing byte order, so each new node is its parent's last child. */
static int build_trie(iflow_gvocab *v, int32_t n)
{
    int32_t *path = malloc(((size_t)v->max_len + 1) * sizeof *path), *last = NULL;
    last = malloc(((size_t)v->max_len + 1) * sizeof *last); /* per depth: the last child made */
    int rc = path && last ? new_node(v, 0) : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    if (rc >= 0) {
        path[0] = 0;
        last[0] = -1;
    }
    int32_t depth = 0, prev = -1;
    for (int32_t i = 0; i < n && rc >= 0; i++) {
        int32_t id = v->ids[i];
        const uint8_t *b = (const uint8_t *)v->piece[id];
        uint32_t len = v->plen[id], common = 0;
        if (prev >= 0) {
            const uint8_t *pb = (const uint8_t *)v->piece[prev];
            uint32_t pl = v->plen[prev];
            while (common < len && common < pl && b[common] == pb[common])
                common++;
        }
        if ((int32_t)common > depth)
            common = (uint32_t)depth;
        depth = (int32_t)common;
        for (uint32_t d = common; d < len && rc >= 0; d++) {
            int32_t nd = new_node(v, b[d]);
            if ((rc = nd) < 0)
                break;
            if (last[d] >= 0 && d == common) /* the previous path's node at this depth is a sibling */
                v->node[last[d]].sibling = nd;
            else
                v->node[path[d]].child = nd;
            last[d] = nd;
            path[d + 1] = nd;
            last[d + 1] = -1;
            depth = (int32_t)d + 1;
        }
        if (rc < 0)
            break;
        tnode *end = &v->node[path[len]];
        if (end->n_tok == 0)
            end->tok = i;
        end->n_tok++;
        prev = id;
    }
    free(path);
    free(last);
    return rc < 0 ? rc : 0;
}

int iflow_gvocab_open(iflow_gvocab **out, const iflow_tokenizer *tok)
{
    *out = NULL;
    iflow_gvocab *v = calloc(1, sizeof *v);
    if (!v)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    v->n_vocab = iflow_tokenizer_n_vocab(tok);
    v->piece = calloc((size_t)v->n_vocab + 1, sizeof *v->piece);
    v->plen = calloc((size_t)v->n_vocab + 1, sizeof *v->plen);
    v->ids = malloc(((size_t)v->n_vocab + 1) * sizeof *v->ids);
    int rc = v->piece && v->plen && v->ids ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    int32_t n = 0;
    const size_t cap = iflow_tokenizer_max_piece(tok);
    char *buf = malloc(cap);
    if (rc == 0 && !buf)
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int32_t id = 0; id < v->n_vocab && rc == 0; id++) {
        int len = iflow_tokenizer_piece(tok, id, 0, buf, cap);
        if (len < 0) {
            rc = len;
            break;
        }
        if (len == 0)
            continue; /* control tokens: never allowed */
        if (!(v->piece[id] = malloc((size_t)len))) {
            rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
            break;
        }
        memcpy(v->piece[id], buf, (size_t)len);
        v->plen[id] = (uint32_t)len;
        if (len > v->max_len)
            v->max_len = len;
        v->ids[n++] = id;
    }
    free(buf);
    if (rc == 0)
        rc = index_texts(v, tok);
    if (rc == 0) {
        sort_v = v;
        qsort(v->ids, (size_t)n, sizeof *v->ids, cmp_piece);
        sort_v = NULL;
        rc = build_trie(v, n);
    }
    if (rc < 0) {
        iflow_gvocab_close(v);
        return rc;
    }
    *out = v;
    return 0;
}

/* ---- masks ---------------------------------------------------------------------------------- */

typedef struct {
    int32_t node, set; /* a trie node whose children are next, and the interned set at it */
} walk_item;

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* The cache entry of the current state (sorted into s->cur), or of the least recently used one
 * to replace (*hit 0). */
static struct mask_entry *mask_slot(iflow_gstate *s, const iflow_gvocab *v, int *hit)
{
    if (s->mcache_vocab != v) { /* another vocabulary: forget every mask */
        for (int i = 0; i < GRAMMAR_MASK_CACHE; i++)
            s->mcache[i].n_set = -1;
        s->mcache_vocab = v;
    }
    qsort(s->cur, (size_t)s->n_cur, sizeof *s->cur, cmp_i32);
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int32_t i = 0; i < s->n_cur; i++)
        h = (h ^ (uint32_t)s->cur[i]) * 0x100000001B3ull;
    struct mask_entry *lru = &s->mcache[0];
    s->mcache_clock++;
    for (int i = 0; i < GRAMMAR_MASK_CACHE; i++) {
        struct mask_entry *e = &s->mcache[i];
        if (e->bits && e->hash == h && e->n_set == s->n_cur && !memcmp(e->set, s->cur, (size_t)s->n_cur * 4)) {
            e->used = s->mcache_clock;
            *hit = 1;
            return e;
        }
        if (e->used < lru->used)
            lru = e;
    }
    *hit = 0;
    lru->hash = h;
    lru->used = s->mcache_clock;
    return lru;
}

static int mask_walk(iflow_gstate *s, const iflow_gvocab *v, uint8_t *allowed);

int iflow_gstate_mask(iflow_gstate *s, const iflow_gvocab *v, uint8_t *allowed)
{
    int hit;
    struct mask_entry *e = mask_slot(s, v, &hit);
    const int32_t nw = (v->n_vocab + 63) / 64;
    if (hit) {
        for (int32_t i = 0; i < v->n_vocab; i++)
            allowed[i] = (uint8_t)(e->bits[i >> 6] >> (i & 63) & 1);
        return e->count;
    }
    int count = mask_walk(s, v, allowed);
    if (count < 0)
        return count;
    count += token_mask(s, v, allowed);
    /* keep it (when memory allows: the cache is an optimization) */
    int32_t *set = realloc(e->set, ((size_t)s->n_cur + 1) * sizeof *set);
    if (set)
        e->set = set;
    uint64_t *bits = e->bits ? e->bits : malloc((size_t)nw * sizeof *bits);
    if (!set || !bits) {
        free(bits);
        e->bits = NULL;
        e->n_set = -1;
        return count;
    }
    e->bits = bits;
    memcpy(e->set, s->cur, (size_t)s->n_cur * sizeof *set);
    e->n_set = s->n_cur;
    e->count = count;
    memset(bits, 0, (size_t)nw * sizeof *bits);
    for (int32_t i = 0; i < v->n_vocab; i++)
        bits[i >> 6] |= (uint64_t)(allowed[i] != 0) << (i & 63);
    return count;
}

/* ---- the walk's sets, interned ---- */

#define ISET_LIMIT (1 << 22) /* members held by the interned sets before they are all forgotten */

static uint64_t set_hash(const int32_t *m, int32_t n)
{
    return XXH3_64bits(m, (size_t)n * sizeof *m);
}

/* Forget every interned set and step (they are caches of what the frames say). */
static void iset_clear(iflow_gstate *s)
{
    s->n_isets = 0;
    s->n_spool = 0;
    if (s->iset_tab)
        memset(s->iset_tab, 0, (size_t)s->iset_tab_cap * sizeof *s->iset_tab);
    if (s->trans)
        memset(s->trans, 0, (size_t)s->trans_cap * sizeof *s->trans);
    s->trans_n = 0;
}

static int iset_tab_grow(iflow_gstate *s)
{
    uint32_t nc = s->iset_tab_cap ? s->iset_tab_cap * 2 : 1024;
    uint32_t *t = calloc(nc, sizeof *t);
    if (!t)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int32_t id = 0; id < s->n_isets; id++) {
        uint32_t h = (uint32_t)s->isets[id].hash & (nc - 1);
        while (t[h])
            h = (h + 1) & (nc - 1);
        t[h] = (uint32_t)id + 1;
    }
    free(s->iset_tab);
    s->iset_tab = t;
    s->iset_tab_cap = nc;
    return 0;
}

/* The id of the set m [n] (sorted, distinct), interned if new; < 0 on error. */
static int32_t iset_intern(iflow_gstate *s, const int32_t *m, int32_t n)
{
    if ((uint32_t)s->n_isets * 2 >= s->iset_tab_cap && iset_tab_grow(s) < 0)
        return IFLOW_ENOMEM;
    uint64_t h = set_hash(m, n);
    uint32_t at = (uint32_t)h & (s->iset_tab_cap - 1);
    for (; s->iset_tab[at]; at = (at + 1) & (s->iset_tab_cap - 1)) {
        const struct iset *x = &s->isets[s->iset_tab[at] - 1];
        if (x->hash == h && (int32_t)x->n == n && !memcmp(s->spool + x->off, m, (size_t)n * sizeof *m))
            return (int32_t)s->iset_tab[at] - 1;
    }
    if (grow((void **)&s->isets, &s->cap_isets, s->n_isets + 1, sizeof *s->isets) < 0 ||
        grow((void **)&s->spool, &s->cap_spool, s->n_spool + n, sizeof *s->spool) < 0)
        return IFLOW_ENOMEM;
    memcpy(s->spool + s->n_spool, m, (size_t)n * sizeof *m);
    s->isets[s->n_isets] = (struct iset){.off = (uint32_t)s->n_spool, .n = (uint32_t)n, .hash = h};
    s->n_spool += n;
    s->iset_tab[at] = (uint32_t)s->n_isets + 1;
    return s->n_isets++;
}

/* *next = the set that set `id` becomes after byte b (its id), or -1 when no stack takes b.
 * 0, or < 0 on error. */
static int iset_step(iflow_gstate *s, int32_t id, uint8_t b, int32_t *next)
{
    if (s->trans_n * 2 >= s->trans_cap && memo_table_grow(&s->trans, &s->trans_cap) < 0)
        return IFLOW_ENOMEM;
    uint64_t key = ((uint64_t)(uint32_t)id << 8 | b) + 1;
    uint32_t h = hash2((uint32_t)(key >> 32), (uint32_t)key) & (s->trans_cap - 1);
    for (; s->trans[h].key; h = (h + 1) & (s->trans_cap - 1))
        if (s->trans[h].key == key) {
            *next = (int32_t)s->trans[h].off - 1;
            return 0;
        }
    /* the members into buf, then advanced after them */
    const struct iset x = s->isets[id];
    s->n_buf = 0;
    if (grow((void **)&s->buf, &s->cap_buf, (int32_t)x.n, sizeof *s->buf) < 0)
        return IFLOW_ENOMEM;
    memcpy(s->buf, s->spool + x.off, (size_t)x.n * sizeof *s->buf);
    s->n_buf = (int32_t)x.n;
    int cnt = advance_set(s, 0, (int32_t)x.n, &s->buf, &s->n_buf, &s->cap_buf, b);
    if (cnt < 0)
        return cnt;
    *next = -1;
    if (cnt > 0) {
        int32_t *m = s->buf + x.n;
        qsort(m, (size_t)cnt, sizeof *m, cmp_i32);
        if ((*next = iset_intern(s, m, cnt)) < 0)
            return *next;
    }
    s->trans[h] = (memo_slot){.key = key, .off = (uint32_t)(*next + 1)};
    s->trans_n++;
    return 0;
}

/* The mask by the trie: a child's set is its parent's stepped by the child's byte (looked up
 * when the same set met the same byte before); a subtree whose set is empty is skipped whole. */
static int mask_walk(iflow_gstate *s, const iflow_gvocab *v, uint8_t *allowed)
{
    memset(allowed, 0, (size_t)v->n_vocab);
    if (s->n_spool > ISET_LIMIT)
        iset_clear(s);
    walk_item *stack = malloc(((size_t)v->max_len + 2) * sizeof *stack);
    int32_t *child_of = malloc(((size_t)v->max_len + 2) * sizeof *child_of); /* per depth: next child */
    int rc = stack && child_of ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    int32_t root = rc == 0 ? iset_intern(s, s->cur, s->n_cur) : -1; /* s->cur is sorted (mask_slot) */
    if (rc == 0 && root < 0)
        rc = root;
    int count = 0, top = 0;
    if (rc == 0) {
        stack[top] = (walk_item){.node = 0, .set = root};
        child_of[top++] = v->node[0].child;
    }
    while (rc == 0 && top > 0) {
        int32_t c = child_of[top - 1];
        if (c < 0) { /* every child done */
            top--;
            continue;
        }
        child_of[top - 1] = v->node[c].sibling;
        int32_t next;
        if ((rc = iset_step(s, stack[top - 1].set, v->node[c].byte, &next)) < 0)
            break;
        if (next < 0)
            continue;
        for (int32_t k = 0; k < v->node[c].n_tok; k++)
            allowed[v->ids[v->node[c].tok + k]] = 1;
        count += v->node[c].n_tok;
        if (v->node[c].child >= 0) {
            stack[top] = (walk_item){.node = c, .set = next};
            child_of[top++] = v->node[c].child;
        }
    }
    free(stack);
    free(child_of);
    return rc < 0 ? rc : count;
}

int iflow_gstate_allows(iflow_gstate *s, const iflow_gvocab *v, int32_t id)
{
    if (id < 0 || id >= v->n_vocab)
        return iflow_seterr(IFLOW_ERANGE, "grammar: token %d is outside the vocabulary of %d", id, v->n_vocab);
    if (iflow_gstate_token_allows(s, v, id))
        return 1;
    return v->piece[id] ? iflow_gstate_test(s, v->piece[id], v->plen[id]) : 0;
}

/* ---- grammars from other texts ----------------------------------------------------------- */

/* Room for n more bytes (and a NUL) in *out. */
static int reserve(char **out, size_t len, size_t *cap, size_t n)
{
    if (len + n + 1 <= *cap)
        return 0;
    size_t nc = (len + n + 1) * 2;
    char *o = realloc(*out, nc);
    if (!o)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    *out = o;
    *cap = nc;
    return 0;
}

/* Append text [n] to *out as a GBNF literal; IFLOW_EINVAL when it is not UTF-8. */
static int put_literal(char **out, size_t *len, size_t *cap, const char *text, size_t n)
{
    if (reserve(out, *len, cap, 4 * n + 2) < 0) /* \xHH is the longest: 4 bytes for 1 */
        return IFLOW_ENOMEM;
    parser p = {.text = text, .s = text, .end = text + n, .line_start = text, .line = 1};
    (*out)[(*len)++] = '"';
    while (p.s < p.end) {
        const char *at = p.s;
        uint32_t c;
        if (read_utf8(&p, &c) < 0)
            return iflow_seterr(IFLOW_EINVAL, "choice '%.*s' is not valid UTF-8 at byte %td", (int)(n < 40 ? n : 40),
                                text, at - text);
        if (c == '"' || c == '\\')
            *len += (size_t)sprintf(*out + *len, "\\%c", (char)c);
        else if (c < 0x20 || c == 0x7F)
            *len += (size_t)sprintf(*out + *len, "\\x%02X", c);
        else {
            memcpy(*out + *len, at, (size_t)(p.s - at));
            *len += (size_t)(p.s - at);
        }
    }
    (*out)[(*len)++] = '"';
    (*out)[*len] = 0;
    return 0;
}

int iflow_grammar_from_choices(const char *const *choices, const size_t *lens, int n, char **out)
{
    *out = NULL;
    if (n < 1)
        return iflow_seterr(IFLOW_EINVAL, "no choices given");
    size_t len = 0, cap = 0, total = 0;
    char *o = NULL;
    int rc = reserve(&o, len, &cap, 16);
    if (rc == 0)
        len = (size_t)sprintf(o, "root ::= ");
    for (int i = 0; i < n && rc == 0; i++) {
        if ((total += lens[i]) > IFLOW_GRAMMAR_MAX_TEXT / 4)
            rc = iflow_seterr(IFLOW_EINVAL, "the choices are over %u bytes", IFLOW_GRAMMAR_MAX_TEXT / 4);
        else if (i > 0 && (rc = reserve(&o, len, &cap, 3)) == 0)
            len += (size_t)sprintf(o + len, " | ");
        if (rc == 0)
            rc = put_literal(&o, &len, &cap, choices[i], lens[i]);
    }
    if (rc < 0) {
        free(o);
        return rc;
    }
    *out = o;
    return 0;
}

int iflow_grammar_open_choices(iflow_grammar **out, const char *const *choices, const size_t *lens, int n)
{
    *out = NULL;
    char *gbnf = NULL;
    int rc = iflow_grammar_from_choices(choices, lens, n, &gbnf);
    if (rc == 0)
        rc = iflow_grammar_open(out, gbnf, strlen(gbnf), NULL);
    free(gbnf);
    return rc;
}

int iflow_grammar_open_as(iflow_grammar **out, int kind, const char *text, size_t len)
{
    *out = NULL;
    char *gbnf = NULL;
    int rc = 0;
    if (kind == IFLOW_GRAMMAR_JSON_SCHEMA)
        rc = iflow_grammar_from_json_schema(text, len, &gbnf);
    else if (kind == IFLOW_GRAMMAR_REGEX)
        rc = iflow_grammar_from_regex(text, len, "root", &gbnf);
    else if (kind != IFLOW_GRAMMAR_GBNF)
        return iflow_seterr(IFLOW_EINVAL, "grammar kind %d: not gbnf, json schema or regex", kind);
    if (rc < 0)
        return rc;
    rc = gbnf ? iflow_grammar_open(out, gbnf, strlen(gbnf), NULL) : iflow_grammar_open(out, text, len, NULL);
    if (rc < 0 && gbnf) /* the converter's output refused: iflow's own fault, say so */
        iflow_preperr(rc, "the grammar made from the %s", kind == IFLOW_GRAMMAR_REGEX ? "regex" : "json schema");
    free(gbnf);
    return rc;
}
