/*
 * grammar_regex.c -- iflow_grammar_from_regex (grammar.h): a regular expression to GBNF rules.
 *
 * The dialect is Python's `re` with re.ASCII, matched whole (re.fullmatch), over UTF-8 text:
 *   - literal characters (the regex is UTF-8; invalid UTF-8 is refused naming its byte offset);
 *     escaped punctuation (\. \* \\ \( \{ \- ...; \ before a non-ASCII character: that character);
 *     \a \f \n \r \t \v, \0 and octal \0oo \ooo (<= 0o377), \xHH, \uHHHH, \UHHHHHHHH;
 *   - `.`: any character but \n (no DOTALL);
 *   - classes [...] with ranges, [^...] (over code points: [^a] takes any non-ASCII character
 *     too), escapes inside (\b there is backspace); ']' first or after '^' and '-' first or last
 *     are literal, as in Python;
 *   - \d \w \s and \D \W \S, ASCII only as with re.ASCII (\d = [0-9], \w = [A-Za-z0-9_],
 *     \s = [ \t\n\r\f\v]; \W, \D, \S take every non-ASCII character), in or out of classes;
 *   - groups ( ), (?: ), (?P<name> ) and (?<name> ) (ECMAScript's spelling; the name is not
 *     checked for duplicates), all plain groups; comments (?#...); alternation | with empty
 *     alternatives;
 *   - quantifiers * + ? {m} {m,} {,n} {m,n} {,} and their lazy forms (*? +? ?? {m,n}?: the same
 *     language); n <= IFLOW_GRAMMAR_MAX_REPEAT; `{` that does not start a quantifier is a
 *     literal, as in Python; a quantifier applies to the item before it (a comment in between
 *     is skipped);
 *   - ^ as the first byte and $ as the last byte (a whole match needs neither).
 * Refused with IFLOW_EINVAL and "regex: <what>, at byte N" (N the construct's offset):
 * backreferences (\1, (?P=name)), lookaround ((?= (?! (?<= (?<!), inline flags ((?i) (?s:...)
 * ...), atomic groups (?>, conditionals (?(, \b \B \A \Z, \N{name}, possessive quantifiers
 * (*+ ++ ?+ {m,n}+), ^ and $ anywhere else, a quantifier with nothing to repeat or after
 * another one, {m,n} with m > n or a count over IFLOW_GRAMMAR_MAX_REPEAT, unbalanced
 * parentheses, an unterminated class, a reversed range, a bad or incomplete escape, a lone
 * surrogate \uD800..\uDFFF outside a class (UTF-8 text never holds one; in a class range they
 * are dropped), groups nested deeper than RX_MAX_DEPTH, a regex longer than
 * IFLOW_GRAMMAR_MAX_TEXT (IFLOW_ERANGE) and a bad rule name. A regex that can match nothing
 * at all ([^\s\S]) is refused too: GBNF has no terminal for the empty language.
 *
 * Output: `name ::= ...` first, then helper rules `name-1`, `name-2`, ... one per line;
 * quantifiers stay GBNF quantifiers (the grammar compiler expands them), so the output grows
 * linearly with the regex (at most IFLOW_GRAMMAR_MAX_TEXT bytes, else IFLOW_ERANGE).
 *
 * How: a recursive-descent parser builds a graph of nodes (a set of code points, a sequence,
 * an alternation, a repetition, the empty string, the empty language); the constructors keep
 * it simplified and keep one invariant: what a repetition repeats never matches "" (the GBNF
 * compiler expands x* into a rule that calls itself after x, which is left recursion when x can
 * be empty). x{m,n} with a nullable x is rewritten as (x less ""){0,n}, the same language; "x
 * less """ is built structurally (nonempty() below) and may share nodes with x. The graph is
 * then printed: a node reached from two places, or nested deeper than RX_MAX_INLINE in one
 * rule, becomes a helper rule of its own. The parser's recursion and nonempty()'s follow the
 * regex's nesting of groups, bounded by RX_MAX_DEPTH; printing never recurses deeper than
 * RX_MAX_INLINE, and counting uses an explicit stack.
 */
#include "grammar.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libcore/base/error.h"
#include "libcore/base/quote.h"
#include "libcore/base/utf8.h"

#define RX_MAX_DEPTH  256      /* groups nested deeper are refused */
#define RX_MAX_INLINE 8        /* ( ) nesting printed inside one rule; deeper parts become rules */
#define RX_MAX_NAME   200      /* bytes of a rule name */
#define RX_UNBOUNDED  (-1)     /* max of an open repetition */
#define CP_LAST       0x10FFFFu

enum { N_EMPTY, N_NONE, N_CHAR, N_SET, N_SEQ, N_ALT, N_REP };
enum { ID_EMPTY = 0, ID_NONE = 1 }; /* made first by every conversion */

typedef struct {
    uint32_t lo, hi;
} rrange;

typedef struct {
    uint8_t kind, nullable;
    int32_t min, max; /* N_REP: the counts, max RX_UNBOUNDED for none */
    uint32_t at, n;   /* N_CHAR: at is the code point; N_SET: ranges [at, at + n); N_SEQ, N_ALT: kids
                         [at, at + n); N_REP: at is the repeated node */
    int32_t ne;       /* the node for this language less "", -1 until asked */
} rnode;

/* A growable array: items of `size` bytes. */
typedef struct {
    void *p;
    size_t n, cap;
} rvec;

typedef struct {
    const char *s; /* the regex [n] */
    size_t n, i;   /* i: the next byte to read */
    int depth;     /* groups open around i */
    rvec node;     /* rnode */
    rvec kid;      /* uint32_t: children of sequences and alternations */
    rvec rng;      /* rrange: ranges of sets */
    rvec stk;      /* uint32_t: items of the sequences and alternations being built */
    rvec cls;      /* rrange: the set being built (not reentrant) */
} rx;

#define NODES(P) ((rnode *)(P)->node.p)
#define KIDS(P)  ((uint32_t *)(P)->kid.p)
#define RNGS(P)  ((rrange *)(P)->rng.p)
#define STK(P)   ((uint32_t *)(P)->stk.p)
#define CLS(P)   ((rrange *)(P)->cls.p)

/* ---- errors and memory ------------------------------------------------------------------- */

static int rx_err(size_t at, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int rx_err(size_t at, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return iflow_seterr(IFLOW_EINVAL, "regex: %s, at byte %zu", msg, at);
}

static int nomem(void)
{
    return iflow_seterr(IFLOW_ENOMEM, "regex: out of memory");
}

/* Room for `more` items of `size` bytes in v. */
static int vec_reserve(rvec *v, size_t more, size_t size)
{
    if (v->n + more <= v->cap)
        return 0;
    size_t cap = v->cap ? v->cap : 16;
    while (cap < v->n + more)
        cap *= 2;
    void *p = realloc(v->p, cap * size);
    if (!p)
        return nomem();
    v->p = p;
    v->cap = cap;
    return 0;
}

static int push_u32(rvec *v, uint32_t x)
{
    IFLOW_TRY(vec_reserve(v, 1, sizeof x));
    ((uint32_t *)v->p)[v->n++] = x;
    return 0;
}

static int push_range(rvec *v, uint32_t lo, uint32_t hi)
{
    IFLOW_TRY(vec_reserve(v, 1, sizeof(rrange)));
    ((rrange *)v->p)[v->n++] = (rrange){lo, hi};
    return 0;
}

/* ---- UTF-8 ----------------------------------------------------------------------------------- */

/* Length of the well-formed UTF-8 character at s [n] (its code point in *cp), or 0. */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    int len = iflow_utf8_decode((const char *)s, n, cp);
    return len > 0 ? (size_t)len : 0;
}

static int check_utf8(const char *s, size_t n)
{
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!len)
            return rx_err(i, "invalid utf-8 (byte 0x%02x)", (unsigned char)s[i]);
        i += len;
    }
    return 0;
}

/* The character at P->i (the regex is valid UTF-8); advances past it. */
static uint32_t next_char(rx *P)
{
    uint32_t cp = 0;
    P->i += utf8_decode((const unsigned char *)P->s + P->i, P->n - P->i, &cp);
    return cp;
}

/* ---- sets of code points --------------------------------------------------------------- */

static int range_cmp(const void *a, const void *b)
{
    const rrange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sort and merge the ranges of P->cls, and drop the surrogates (never in UTF-8 text). */
static int set_normalize(rx *P)
{
    rrange *r = CLS(P);
    size_t n = P->cls.n, k = 0;
    qsort(r, n, sizeof *r, range_cmp);
    for (size_t i = 0; i < n; i++) {
        if (k && r[i].lo <= r[k - 1].hi + 1) {
            if (r[i].hi > r[k - 1].hi)
                r[k - 1].hi = r[i].hi;
        } else {
            r[k++] = r[i];
        }
    }
    P->cls.n = k;
    for (size_t i = 0; i < P->cls.n; i++) { /* cut [D800, DFFF] out of range i */
        r = CLS(P);
        if (r[i].hi < 0xd800 || r[i].lo > 0xdfff)
            continue;
        if (r[i].lo < 0xd800 && r[i].hi > 0xdfff) {
            IFLOW_TRY(vec_reserve(&P->cls, 1, sizeof *r));
            r = CLS(P);
            memmove(r + i + 2, r + i + 1, (P->cls.n - i - 1) * sizeof *r);
            r[i + 1] = (rrange){0xe000, r[i].hi};
            r[i].hi = 0xd7ff;
            P->cls.n++;
        } else if (r[i].lo < 0xd800) {
            r[i].hi = 0xd7ff;
        } else if (r[i].hi > 0xdfff) {
            r[i].lo = 0xe000;
        } else {
            memmove(r + i, r + i + 1, (P->cls.n - i - 1) * sizeof *r);
            P->cls.n--;
            i--;
        }
    }
    return 0;
}

/* Append the complement (in [0, CP_LAST]) of the sorted, merged ranges r [n] to v. */
static int add_complement(rvec *v, const rrange *r, size_t n)
{
    uint32_t next = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].lo > next)
            IFLOW_TRY(push_range(v, next, r[i].lo - 1));
        next = r[i].hi + 1;
    }
    if (next <= CP_LAST)
        IFLOW_TRY(push_range(v, next, CP_LAST));
    return 0;
}

/* Replace the normalized P->cls with its complement. */
static int set_negate(rx *P)
{
    rvec tmp = {0};
    int rc = add_complement(&tmp, CLS(P), P->cls.n);
    free(P->cls.p);
    P->cls = tmp;
    return rc < 0 ? rc : set_normalize(P);
}

/* Add the shorthand class \d \w \s (lowercase) or its complement (uppercase) to P->cls. */
static int add_shorthand(rx *P, char c)
{
    static const rrange digit[] = {{'0', '9'}};
    static const rrange word[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    static const rrange space[] = {{'\t', '\r'}, {' ', ' '}};
    const rrange *r = c == 'd' || c == 'D' ? digit : c == 'w' || c == 'W' ? word : space;
    size_t n = r == digit ? 1 : r == word ? 4 : 2;
    if (c >= 'A' && c <= 'Z')
        return add_complement(&P->cls, r, n);
    for (size_t i = 0; i < n; i++)
        IFLOW_TRY(push_range(&P->cls, r[i].lo, r[i].hi));
    return 0;
}

/* ---- nodes ------------------------------------------------------------------------------- */

static int node_new(rx *P, int kind, int nullable, uint32_t at, uint32_t n, uint32_t *id)
{
    if (P->node.n >= INT32_MAX)
        return iflow_seterr(IFLOW_ERANGE, "regex: too many nodes");
    IFLOW_TRY(vec_reserve(&P->node, 1, sizeof(rnode)));
    *id = (uint32_t)P->node.n++;
    NODES(P)[*id] = (rnode){.kind = (uint8_t)kind, .nullable = (uint8_t)nullable, .at = at, .n = n, .ne = -1};
    return 0;
}

static int mk_char(rx *P, uint32_t cp, uint32_t *id)
{
    return node_new(P, N_CHAR, 0, cp, 1, id);
}

/* A node for the normalized ranges of P->cls (then emptied): NONE, a character or a set. */
static int mk_set(rx *P, uint32_t *id)
{
    size_t n = P->cls.n;
    P->cls.n = 0;
    if (n == 0) {
        *id = ID_NONE;
        return 0;
    }
    if (n == 1 && CLS(P)[0].lo == CLS(P)[0].hi)
        return mk_char(P, CLS(P)[0].lo, id);
    IFLOW_TRY(vec_reserve(&P->rng, n, sizeof(rrange)));
    memcpy(RNGS(P) + P->rng.n, CLS(P), n * sizeof(rrange));
    IFLOW_TRY(node_new(P, N_SET, 0, (uint32_t)P->rng.n, (uint32_t)n, id));
    P->rng.n += n;
    return 0;
}

/* Add what node id matches (a character or a set) to P->cls. */
static int add_node_chars(rx *P, uint32_t id)
{
    rnode x = NODES(P)[id];
    if (x.kind == N_CHAR)
        return push_range(&P->cls, x.at, x.at);
    for (uint32_t k = 0; k < x.n; k++)
        IFLOW_TRY(push_range(&P->cls, RNGS(P)[x.at + k].lo, RNGS(P)[x.at + k].hi));
    return 0;
}

static int is_charlike(const rx *P, uint32_t id)
{
    int k = NODES(P)[id].kind;
    return k == N_CHAR || k == N_SET;
}

/* A sequence of the items STK[mark..] (popped): EMPTY items dropped, nested sequences
 * flattened, NONE if any item is NONE. */
static int mk_seq(rx *P, size_t mark, uint32_t *id)
{
    size_t total = 0;
    int nullable = 1;
    for (size_t i = mark; i < P->stk.n; i++) {
        rnode x = NODES(P)[STK(P)[i]];
        if (x.kind == N_NONE) {
            P->stk.n = mark;
            *id = ID_NONE;
            return 0;
        }
        total += x.kind == N_SEQ ? x.n : x.kind != N_EMPTY;
        nullable &= x.nullable;
    }
    if (total <= 1) {
        *id = ID_EMPTY;
        for (size_t i = mark; i < P->stk.n; i++)
            if (NODES(P)[STK(P)[i]].kind != N_EMPTY)
                *id = STK(P)[i];
        P->stk.n = mark;
        return 0;
    }
    IFLOW_TRY(vec_reserve(&P->kid, total, sizeof(uint32_t)));
    size_t at = P->kid.n;
    for (size_t i = mark; i < P->stk.n; i++) {
        rnode x = NODES(P)[STK(P)[i]];
        if (x.kind == N_SEQ)
            for (uint32_t k = 0; k < x.n; k++)
                KIDS(P)[P->kid.n++] = KIDS(P)[x.at + k];
        else if (x.kind != N_EMPTY)
            KIDS(P)[P->kid.n++] = STK(P)[i];
    }
    P->stk.n = mark;
    return node_new(P, N_SEQ, nullable, (uint32_t)at, (uint32_t)total, id);
}

/* The items a and b one after the other, without flattening (nonempty()'s shared suffixes). */
static int mk_pair(rx *P, uint32_t a, uint32_t b, uint32_t *id)
{
    int ka = NODES(P)[a].kind, kb = NODES(P)[b].kind;
    if (ka == N_NONE || kb == N_NONE || ka == N_EMPTY || kb == N_EMPTY) {
        *id = ka == N_NONE || kb == N_NONE ? ID_NONE : ka == N_EMPTY ? b : a;
        return 0;
    }
    IFLOW_TRY(vec_reserve(&P->kid, 2, sizeof(uint32_t)));
    size_t at = P->kid.n;
    KIDS(P)[P->kid.n++] = a;
    KIDS(P)[P->kid.n++] = b;
    return node_new(P, N_SEQ, NODES(P)[a].nullable && NODES(P)[b].nullable, (uint32_t)at, 2, id);
}

/* Gather the character-like alternatives of STK[mark..] into one set, left where the first of
 * them was. */
static int merge_charlike(rx *P, size_t mark)
{
    size_t first = SIZE_MAX, n = 0;
    for (size_t i = mark; i < P->stk.n; i++)
        if (is_charlike(P, STK(P)[i])) {
            n++;
            first = first == SIZE_MAX ? i : first;
        }
    if (n < 2)
        return 0;
    P->cls.n = 0;
    size_t k = mark;
    for (size_t i = mark; i < P->stk.n; i++) {
        uint32_t x = STK(P)[i];
        if (is_charlike(P, x))
            IFLOW_TRY(add_node_chars(P, x));
        if (!is_charlike(P, x) || i == first)
            STK(P)[k++] = x;
    }
    P->stk.n = k;
    IFLOW_TRY(set_normalize(P));
    uint32_t set;
    IFLOW_TRY(mk_set(P, &set));
    for (size_t i = mark; i < P->stk.n; i++)
        if (is_charlike(P, STK(P)[i]))
            STK(P)[i] = set;
    return 0;
}

/* An alternation of the items STK[mark..] (popped): NONE items dropped, nested alternations
 * flattened, single characters and sets merged into one set. */
static int mk_alt(rx *P, size_t mark, uint32_t *id)
{
    size_t k = mark;
    int has_empty = 0;
    for (size_t i = mark; i < P->stk.n; i++) { /* NONE dropped, EMPTY kept once */
        int kind = NODES(P)[STK(P)[i]].kind;
        if (kind == N_NONE || (kind == N_EMPTY && has_empty))
            continue;
        has_empty |= kind == N_EMPTY;
        STK(P)[k++] = STK(P)[i];
    }
    P->stk.n = k;
    IFLOW_TRY(merge_charlike(P, mark));
    size_t total = 0;
    int nullable = 0;
    for (size_t i = mark; i < P->stk.n; i++) {
        rnode x = NODES(P)[STK(P)[i]];
        total += x.kind == N_ALT ? x.n : 1;
        nullable |= x.nullable;
    }
    if (total <= 1) {
        *id = P->stk.n > mark ? STK(P)[mark] : ID_NONE;
        P->stk.n = mark;
        return 0;
    }
    IFLOW_TRY(vec_reserve(&P->kid, total, sizeof(uint32_t)));
    size_t at = P->kid.n;
    for (size_t i = mark; i < P->stk.n; i++) {
        rnode x = NODES(P)[STK(P)[i]];
        if (x.kind == N_ALT)
            for (uint32_t j = 0; j < x.n; j++)
                KIDS(P)[P->kid.n++] = KIDS(P)[x.at + j];
        else
            KIDS(P)[P->kid.n++] = STK(P)[i];
    }
    P->stk.n = mark;
    return node_new(P, N_ALT, nullable, (uint32_t)at, (uint32_t)total, id);
}

static int nonempty(rx *P, uint32_t id, uint32_t *out);

/* x{min,max} (max RX_UNBOUNDED: no bound), with x never nullable inside. */
static int mk_rep(rx *P, uint32_t x, int32_t min, int32_t max, uint32_t *id)
{
    int kind = NODES(P)[x].kind;
    if (max == 0 || kind == N_EMPTY || kind == N_NONE) {
        *id = kind == N_NONE && min > 0 ? ID_NONE : ID_EMPTY;
        return 0;
    }
    if (NODES(P)[x].nullable) { /* x{m,n} = (x less ""){0,n} */
        IFLOW_TRY(nonempty(P, x, &x));
        min = 0;
        if (NODES(P)[x].kind == N_NONE) {
            *id = ID_EMPTY;
            return 0;
        }
    }
    if (min == 1 && max == 1) {
        *id = x;
        return 0;
    }
    rnode y = NODES(P)[x];
    if (y.kind == N_REP && y.min == 1 && y.max == RX_UNBOUNDED) { /* (y+){m,n} = y{m,} */
        x = y.at;
        max = RX_UNBOUNDED;
    }
    IFLOW_TRY(node_new(P, N_REP, min == 0, x, 1, id));
    NODES(P)[*id].min = min;
    NODES(P)[*id].max = max;
    return 0;
}

/* The sequence x1 .. xn (all nullable) less "": x1' S2 | x2' S3 | ... | xn', where xi' is xi
 * less "" and Si = xi .. xn is built as a chain of pairs that the alternatives share. */
static int nonempty_seq(rx *P, uint32_t id, uint32_t *out)
{
    rnode x = NODES(P)[id];
    size_t mark = P->stk.n;
    uint32_t suffix = ID_EMPTY;
    for (uint32_t k = x.n; k-- > 0;) {
        uint32_t item = KIDS(P)[x.at + k], ne, alt;
        IFLOW_TRY(nonempty(P, item, &ne));
        IFLOW_TRY(mk_pair(P, ne, suffix, &alt));
        IFLOW_TRY(push_u32(&P->stk, alt));
        IFLOW_TRY(mk_pair(P, item, suffix, &suffix));
    }
    return mk_alt(P, mark, out);
}

/* *out = a node for the language of id less the empty string (id itself when it is not
 * nullable), remembered in the node. */
static int nonempty(rx *P, uint32_t id, uint32_t *out)
{
    rnode x = NODES(P)[id];
    if (!x.nullable) {
        *out = id;
        return 0;
    }
    if (x.ne >= 0) {
        *out = (uint32_t)x.ne;
        return 0;
    }
    if (x.kind == N_EMPTY) {
        *out = ID_NONE;
    } else if (x.kind == N_REP) { /* x.min == 0 and the repeated node is not nullable */
        IFLOW_TRY(mk_rep(P, x.at, 1, x.max, out));
    } else if (x.kind == N_SEQ) {
        IFLOW_TRY(nonempty_seq(P, id, out));
    } else { /* N_ALT */
        size_t mark = P->stk.n;
        for (uint32_t k = 0; k < x.n; k++) {
            uint32_t ne;
            IFLOW_TRY(nonempty(P, KIDS(P)[x.at + k], &ne));
            IFLOW_TRY(push_u32(&P->stk, ne));
        }
        IFLOW_TRY(mk_alt(P, mark, out));
    }
    NODES(P)[id].ne = (int32_t)*out;
    return 0;
}

/* ---- the parser ---------------------------------------------------------------------------- */

static int parse_alt(rx *P, uint32_t *id);

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int is_octal(char c)
{
    return c >= '0' && c <= '7';
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int is_ascii_letter(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* What an escape stands for: a character, or a shorthand class (\d \D \w \W \s \S). */
typedef struct {
    uint32_t cp;
    char shorthand; /* 0 for a character */
} resc;

/* \xHH, \uHHHH or \UHHHHHHHH at P->i (the backslash): exactly `digits` hex digits. */
static int parse_hex_escape(rx *P, int digits, resc *e)
{
    size_t at = P->i;
    uint32_t v = 0;
    int k = 0;
    for (; k < digits && P->i + 2 + k < P->n && is_hex(P->s[P->i + 2 + k]); k++) {
        char c = P->s[P->i + 2 + k];
        v = v << 4 | (uint32_t)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    if (k < digits)
        return rx_err(at, "incomplete escape '%s'", iflow_quoten(P->s + at, 2 + (size_t)k));
    if (v > CP_LAST)
        return rx_err(at, "escape '%s' is past U+10FFFF", iflow_quoten(P->s + at, 2 + (size_t)k));
    P->i += 2 + (size_t)k;
    e->cp = v;
    e->shorthand = 0;
    return 0;
}

/* Up to `max` octal digits at P->s[from] as a character escape; the value must be <= 0o377. */
static int parse_octal(rx *P, size_t from, int max, resc *e)
{
    size_t at = P->i, j = from;
    uint32_t v = 0;
    for (; j < P->n && j < from + (size_t)max && is_octal(P->s[j]); j++)
        v = v * 8 + (uint32_t)(P->s[j] - '0');
    if (v > 0377)
        return rx_err(at, "octal escape '%s' is out of range 0-0o377", iflow_quoten(P->s + at, j - at));
    P->i = j;
    e->cp = v;
    e->shorthand = 0;
    return 0;
}

/* The escapes that mean the same in and out of classes; *done = 0 when c is none of them. */
static int parse_common_escape(rx *P, char c, resc *e, int *done)
{
    static const char simple[] = "afnrtv", value[] = "\a\f\n\r\t\v";
    const char *p = c ? strchr(simple, c) : NULL;
    *done = 1;
    e->shorthand = 0;
    if (p) {
        e->cp = (uint32_t)(unsigned char)value[p - simple];
        P->i += 2;
    } else if (c && strchr("dDwWsS", c)) {
        e->shorthand = c;
        P->i += 2;
    } else if (c == 'x' || c == 'u' || c == 'U') {
        return parse_hex_escape(P, c == 'x' ? 2 : c == 'u' ? 4 : 8, e);
    } else if (c == 'N') {
        return rx_err(P->i, "named character escape '\\N' is not supported");
    } else {
        *done = 0;
    }
    return 0;
}

/* A backslash at P->i (the last byte): Python's "bad escape (end of pattern)". */
static int check_escape_end(rx *P)
{
    if (P->i + 1 >= P->n)
        return rx_err(P->i, "bad escape (end of pattern)");
    return 0;
}

/* An escape outside a class, at P->i (the backslash). */
static int parse_escape(rx *P, resc *e)
{
    size_t at = P->i;
    IFLOW_TRY(check_escape_end(P));
    char c = P->s[at + 1];
    int done;
    IFLOW_TRY(parse_common_escape(P, c, e, &done));
    if (done)
        return 0;
    if (c == 'b' || c == 'B' || c == 'A' || c == 'Z')
        return rx_err(at, "anchor '\\%c' is not supported", c);
    if (c == '0')
        return parse_octal(P, at + 1, 3, e);
    if (is_digit(c)) { /* \ooo (three octal digits) is a character, else a group reference */
        if (at + 3 < P->n && is_octal(c) && is_octal(P->s[at + 2]) && is_octal(P->s[at + 3]))
            return parse_octal(P, at + 1, 3, e);
        size_t end = at + 2 < P->n && is_digit(P->s[at + 2]) ? at + 3 : at + 2;
        return rx_err(at, "backreference '%s' is not supported", iflow_quoten(P->s + at, end - at));
    }
    if (is_ascii_letter(c))
        return rx_err(at, "bad escape '\\%c'", c);
    P->i++; /* any other character stands for itself */
    e->cp = next_char(P);
    e->shorthand = 0;
    return 0;
}

/* An escape inside a class, at P->i (the backslash). */
static int parse_class_escape(rx *P, resc *e)
{
    size_t at = P->i;
    IFLOW_TRY(check_escape_end(P));
    char c = P->s[at + 1];
    int done;
    IFLOW_TRY(parse_common_escape(P, c, e, &done));
    if (done)
        return 0;
    if (c == 'b') {
        P->i += 2;
        e->cp = '\b';
        return 0;
    }
    if (is_octal(c))
        return parse_octal(P, at + 1, 3, e);
    if (is_digit(c) || is_ascii_letter(c))
        return rx_err(at, "bad escape '\\%c' in a character class", c);
    P->i++;
    e->cp = next_char(P);
    e->shorthand = 0;
    return 0;
}

/* One class item at P->i: an escape or a character. */
static int parse_class_atom(rx *P, resc *e)
{
    if (P->s[P->i] == '\\')
        return parse_class_escape(P, e);
    e->cp = next_char(P);
    e->shorthand = 0;
    return 0;
}

static int add_class_atom(rx *P, const resc *e)
{
    return e->shorthand ? add_shorthand(P, e->shorthand) : push_range(&P->cls, e->cp, e->cp);
}

/* The range e1-? after its '-' at P->i - 1 (not followed by ']'). */
static int parse_class_range(rx *P, const resc *e1, size_t at1)
{
    resc e2;
    IFLOW_TRY(parse_class_atom(P, &e2));
    if (e1->shorthand || e2.shorthand || e2.cp < e1->cp)
        return rx_err(at1, "bad character range '%s'", iflow_quoten(P->s + at1, P->i - at1));
    return push_range(&P->cls, e1->cp, e2.cp);
}

/* [...] at P->i, Python's way: ']' first is a literal, '-' first or last is a literal. */
static int parse_class(rx *P, uint32_t *id)
{
    size_t start = P->i++;
    int negate = P->i < P->n && P->s[P->i] == '^', first = 1;
    P->i += negate;
    P->cls.n = 0;
    for (;; first = 0) {
        if (P->i >= P->n)
            return rx_err(start, "unterminated character set");
        if (P->s[P->i] == ']' && !first) {
            P->i++;
            break;
        }
        size_t at1 = P->i;
        resc e1;
        IFLOW_TRY(parse_class_atom(P, &e1));
        if (P->i < P->n && P->s[P->i] == '-') {
            P->i++;
            if (P->i >= P->n)
                return rx_err(start, "unterminated character set");
            if (P->s[P->i] == ']') {
                P->i++;
                IFLOW_TRY(add_class_atom(P, &e1));
                IFLOW_TRY(push_range(&P->cls, '-', '-'));
                break;
            }
            IFLOW_TRY(parse_class_range(P, &e1, at1));
        } else {
            IFLOW_TRY(add_class_atom(P, &e1));
        }
    }
    IFLOW_TRY(set_normalize(P));
    if (negate)
        IFLOW_TRY(set_negate(P));
    return mk_set(P, id);
}

/* A name up to `end` at P->i, for (?P<name> and (?<name>: a Python identifier (ASCII or not);
 * P->i ends after `end`. */
static int parse_group_name(rx *P, size_t at)
{
    size_t from = P->i;
    while (P->i < P->n && P->s[P->i] != '>')
        P->i++;
    if (P->i >= P->n)
        return rx_err(at, "missing '>' after the group name");
    size_t len = P->i - from;
    int ok = len > 0 && !is_digit(P->s[from]);
    for (size_t k = from; k < P->i && ok; k++) {
        unsigned char c = (unsigned char)P->s[k];
        ok = c >= 0x80 || c == '_' || is_ascii_letter((char)c) || is_digit((char)c);
    }
    if (!ok)
        return rx_err(from, "bad group name '%s'", iflow_quoten(P->s + from, len));
    P->i++;
    return 0;
}

/* The constructs after "(?" that are refused; P->i at the byte after '?'. */
static int refuse_extension(rx *P, size_t at)
{
    const char *s = P->s + P->i;
    size_t left = P->n - P->i;
    if (left == 0)
        return rx_err(at, "unexpected end of pattern after '(?'");
    if (s[0] == '=' || s[0] == '!')
        return rx_err(at, "%s '(?%c' is not supported", s[0] == '=' ? "lookahead" : "negative lookahead", s[0]);
    if (s[0] == '<' && left > 1 && (s[1] == '=' || s[1] == '!'))
        return rx_err(at, "%s '(?<%c' is not supported", s[1] == '=' ? "lookbehind" : "negative lookbehind", s[1]);
    if (s[0] == '>')
        return rx_err(at, "atomic group '(?>' is not supported");
    if (s[0] == '(')
        return rx_err(at, "conditional group '(?(' is not supported");
    if (s[0] == 'P' && left > 1 && s[1] == '=')
        return rx_err(at, "named backreference '(?P=' is not supported");
    if (s[0] && strchr("aiLmsux-", s[0])) {
        size_t k = 0;
        while (k < left && k < 16 && s[k] != ')' && s[k] != ':')
            k++;
        return rx_err(at, "inline flags '(?%s' are not supported", iflow_quoten(s, k < left ? k + 1 : k));
    }
    size_t len = ((unsigned char)s[0] < 0x80 ? 1 : 0);
    if (!len) { /* quote the whole character */
        uint32_t cp;
        len = utf8_decode((const unsigned char *)s, left, &cp);
    }
    if (s[0] == 'P' && left > 1)
        len = 2;
    return rx_err(at, "unknown extension '(?%s'", iflow_quoten(s, len));
}

/* (?#...) at P->i (the '('): skipped up to the first ')' not escaped. */
static int skip_comment(rx *P)
{
    size_t at = P->i;
    for (P->i += 3; P->i < P->n && P->s[P->i] != ')'; P->i++)
        P->i += P->s[P->i] == '\\';
    if (P->i >= P->n)
        return rx_err(at, "missing ')', unterminated comment");
    P->i++;
    return 0;
}

/* A group at P->i (the '('): what it holds, as a node. */
static int parse_group(rx *P, uint32_t *id)
{
    size_t at = P->i++;
    if (P->i < P->n && P->s[P->i] == '?') {
        P->i++;
        if (P->i < P->n && P->s[P->i] == ':') {
            P->i++;
        } else if (P->i + 1 < P->n && P->s[P->i] == 'P' && P->s[P->i + 1] == '<') {
            P->i += 2;
            IFLOW_TRY(parse_group_name(P, at));
        } else if (P->i + 1 < P->n && P->s[P->i] == '<' && P->s[P->i + 1] != '=' && P->s[P->i + 1] != '!') {
            P->i += 1;
            IFLOW_TRY(parse_group_name(P, at));
        } else {
            return refuse_extension(P, at);
        }
    }
    if (++P->depth > RX_MAX_DEPTH)
        return rx_err(at, "groups nested deeper than %d", RX_MAX_DEPTH);
    IFLOW_TRY(parse_alt(P, id));
    P->depth--;
    if (P->i >= P->n)
        return rx_err(at, "unbalanced parenthesis: '(' is never closed");
    P->i++; /* ')' */
    return 0;
}

/* A quantifier at P->i: 1 with its counts (and *end after it), or 0 when there is none
 * ('{' that does not make one is a literal). Counts over the limit are refused here. */
static int quantifier_at(rx *P, int32_t *min, int32_t *max, size_t *end, int *rc)
{
    size_t i = P->i;
    char c = P->s[i];
    *rc = 0;
    if (c == '*' || c == '+' || c == '?') {
        *min = c == '+';
        *max = c == '?' ? 1 : RX_UNBOUNDED;
        *end = i + 1;
        return 1;
    }
    if (c != '{' || i + 1 >= P->n || P->s[i + 1] == '}')
        return 0;
    size_t j = i + 1;
    size_t from[2] = {j, 0}, to[2];
    while (j < P->n && is_digit(P->s[j]))
        j++;
    to[0] = j;
    if (j < P->n && P->s[j] == ',') { /* {m,n}, {m,}, {,n}, {,} */
        from[1] = ++j;
        while (j < P->n && is_digit(P->s[j]))
            j++;
        to[1] = j;
    } else { /* {m}: n is m */
        from[1] = from[0];
        to[1] = to[0];
    }
    if (j >= P->n || P->s[j] != '}')
        return 0;
    int32_t v[2] = {0, RX_UNBOUNDED};
    for (int k = 0; k < 2; k++) {
        if (from[k] == to[k])
            continue;
        long long x = 0;
        for (size_t d = from[k]; d < to[k] && x <= IFLOW_GRAMMAR_MAX_REPEAT; d++)
            x = x * 10 + (P->s[d] - '0');
        if (x > IFLOW_GRAMMAR_MAX_REPEAT) {
            *rc = rx_err(i, "repeat count in '%s' is over the limit %d", iflow_quoten(P->s + i, j + 1 - i),
                         IFLOW_GRAMMAR_MAX_REPEAT);
            return 1;
        }
        v[k] = (int32_t)x;
    }
    if (v[1] != RX_UNBOUNDED && v[1] < v[0]) {
        *rc = rx_err(i, "bad repeat '%s': min is greater than max", iflow_quoten(P->s + i, j + 1 - i));
        return 1;
    }
    *min = v[0];
    *max = v[1];
    *end = j + 1;
    return 1;
}

enum { LAST_NONE, LAST_ITEM, LAST_REPEAT, LAST_ANCHOR };

/* Apply the quantifier at P->i (ending at end) to the last item of the sequence STK[mark..]. */
static int apply_quantifier(rx *P, size_t mark, int last, int32_t min, int32_t max, size_t end)
{
    size_t at = P->i;
    const char *what = iflow_quoten(P->s + at, end - at);
    if (last == LAST_NONE || last == LAST_ANCHOR || P->stk.n == mark)
        return rx_err(at, "nothing to repeat before '%s'", what);
    if (last == LAST_REPEAT)
        return rx_err(at, "multiple repeat '%s'", what);
    P->i = end;
    if (P->i < P->n && P->s[P->i] == '?') {
        P->i++; /* lazy: the same language */
    } else if (P->i < P->n && P->s[P->i] == '+') {
        return rx_err(at, "possessive quantifier '%s+' is not supported", what);
    }
    uint32_t x;
    IFLOW_TRY(mk_rep(P, STK(P)[P->stk.n - 1], min, max, &x));
    STK(P)[P->stk.n - 1] = x; /* mk_rep may have moved STK: no pointer kept across it */
    return 0;
}

/* One item at P->i that is not a quantifier, an anchor or a comment. */
static int parse_atom(rx *P, uint32_t *id)
{
    char c = P->s[P->i];
    if (c == '(')
        return parse_group(P, id);
    if (c == '[')
        return parse_class(P, id);
    if (c == '.') {
        P->i++;
        P->cls.n = 0;
        IFLOW_TRY(push_range(&P->cls, 0, '\n' - 1));
        IFLOW_TRY(push_range(&P->cls, '\n' + 1, CP_LAST));
        IFLOW_TRY(set_normalize(P));
        return mk_set(P, id);
    }
    if (c == '^' || c == '$')
        return rx_err(P->i, "anchor '%c' is supported only as the %s byte", c, c == '^' ? "first" : "last");
    size_t at = P->i;
    resc e = {.cp = 0, .shorthand = 0};
    if (c == '\\')
        IFLOW_TRY(parse_escape(P, &e));
    else
        e.cp = next_char(P);
    if (e.shorthand) {
        P->cls.n = 0;
        IFLOW_TRY(add_shorthand(P, e.shorthand));
        IFLOW_TRY(set_normalize(P));
        return mk_set(P, id);
    }
    if (e.cp >= 0xd800 && e.cp <= 0xdfff)
        return rx_err(at, "surrogate '%s' never matches utf-8 text", iflow_quoten(P->s + at, P->i - at));
    return mk_char(P, e.cp, id);
}

/* Items up to '|', ')' or the end, as one sequence. */
static int parse_seq(rx *P, uint32_t *id)
{
    size_t mark = P->stk.n;
    int last = LAST_NONE;
    while (P->i < P->n && P->s[P->i] != '|' && P->s[P->i] != ')') {
        int32_t min = 0, max = 0;
        size_t end = P->i;
        int rc;
        char c = P->s[P->i];
        if (quantifier_at(P, &min, &max, &end, &rc)) {
            IFLOW_TRY(rc);
            IFLOW_TRY(apply_quantifier(P, mark, last, min, max, end));
            last = LAST_REPEAT;
        } else if (c == '(' && P->i + 2 < P->n && P->s[P->i + 1] == '?' && P->s[P->i + 2] == '#') {
            IFLOW_TRY(skip_comment(P));
        } else if ((c == '^' && P->i == 0) || (c == '$' && P->i == P->n - 1)) {
            P->i++;
            last = LAST_ANCHOR;
        } else {
            uint32_t x;
            IFLOW_TRY(parse_atom(P, &x));
            IFLOW_TRY(push_u32(&P->stk, x));
            last = LAST_ITEM;
        }
    }
    return mk_seq(P, mark, id);
}

/* Alternatives up to ')' or the end. */
static int parse_alt(rx *P, uint32_t *id)
{
    size_t mark = P->stk.n;
    for (;;) {
        uint32_t x;
        IFLOW_TRY(parse_seq(P, &x));
        IFLOW_TRY(push_u32(&P->stk, x));
        if (P->i >= P->n || P->s[P->i] != '|')
            break;
        P->i++;
    }
    return mk_alt(P, mark, id);
}

/* ---- printing GBNF ------------------------------------------------------------------------ */

typedef struct {
    rx *P;
    const char *name;
    char *buf;
    size_t len, cap;
    uint32_t *refs;    /* [node] how many places use it */
    uint32_t *rule;    /* [node] its rule number + 1, 0 if printed in place */
    uint32_t *queue;   /* rule number -> node */
    size_t n_rules;
} rout;

enum { CTX_TOP, CTX_SEQ, CTX_ALT, CTX_REP };

static int put(rout *O, const char *s, size_t n)
{
    if (O->len + n > IFLOW_GRAMMAR_MAX_TEXT)
        return iflow_seterr(IFLOW_ERANGE, "regex: the grammar would be over %u bytes", IFLOW_GRAMMAR_MAX_TEXT);
    if (O->len + n + 1 > O->cap) {
        size_t cap = O->cap ? O->cap : 256;
        while (cap < O->len + n + 1)
            cap *= 2;
        char *p = realloc(O->buf, cap);
        if (!p)
            return nomem();
        O->buf = p;
        O->cap = cap;
    }
    memcpy(O->buf + O->len, s, n);
    O->len += n;
    O->buf[O->len] = 0;
    return 0;
}

static int puts_(rout *O, const char *s)
{
    return put(O, s, strlen(s));
}

/* One code point inside "..." (in_class 0) or [...] (in_class 1), escaped where GBNF needs it. */
static int put_cp(rout *O, uint32_t c, int in_class)
{
    char b[16];
    int n;
    if (c == '\n' || c == '\r' || c == '\t')
        n = snprintf(b, sizeof b, "\\%c", c == '\n' ? 'n' : c == '\r' ? 'r' : 't');
    else if (c < 0x20 || (c >= 0x7f && c < 0xa0))
        n = snprintf(b, sizeof b, "\\x%02X", (unsigned)c);
    else if (c == '\\' || (!in_class && c == '"') || (in_class && (c == ']' || c == '[' || c == '-')))
        n = snprintf(b, sizeof b, "\\%c", (char)c);
    else if (in_class && c == '^')
        n = snprintf(b, sizeof b, "\\x5E");
    else if (c < 0x80)
        n = snprintf(b, sizeof b, "%c", (char)c);
    else if (c < 0x800)
        n = snprintf(b, sizeof b, "%c%c", 0xc0 | c >> 6, 0x80 | (c & 0x3f));
    else if (c < 0x10000)
        n = snprintf(b, sizeof b, "%c%c%c", 0xe0 | c >> 12, 0x80 | (c >> 6 & 0x3f), 0x80 | (c & 0x3f));
    else
        n = snprintf(b, sizeof b, "%c%c%c%c", 0xf0 | c >> 18, 0x80 | (c >> 12 & 0x3f), 0x80 | (c >> 6 & 0x3f),
                     0x80 | (c & 0x3f));
    return put(O, b, (size_t)n);
}

static int put_ranges(rout *O, const rrange *r, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        IFLOW_TRY(put_cp(O, r[i].lo, 1));
        if (r[i].hi > r[i].lo + 1)
            IFLOW_TRY(puts_(O, "-"));
        if (r[i].hi > r[i].lo)
            IFLOW_TRY(put_cp(O, r[i].hi, 1));
    }
    return 0;
}

/* A set as `.` (every character), [...] or [^...], whichever is shorter. */
static int put_set(rout *O, uint32_t id)
{
    rx *P = O->P;
    rnode x = NODES(P)[id];
    rvec comp = {0};
    IFLOW_TRY(add_complement(&comp, RNGS(P) + x.at, x.n));
    const rrange *c = comp.p;
    size_t nc = comp.n; /* the surrogates alone left out: every character */
    if (nc == 1 && c[0].lo == 0xd800 && c[0].hi == 0xdfff)
        nc = 0;
    int rc = 0;
    if (nc == 0) {
        rc = puts_(O, ".");
    } else if (nc < x.n) {
        rc = puts_(O, "[^");
        for (size_t i = 0; i < nc && rc == 0; i++) /* the surrogates need no mention */
            if (!(c[i].lo == 0xd800 && c[i].hi == 0xdfff))
                rc = put_ranges(O, c + i, 1);
        rc = rc ? rc : puts_(O, "]");
    } else {
        rc = puts_(O, "[");
        rc = rc ? rc : put_ranges(O, RNGS(P) + x.at, x.n);
        rc = rc ? rc : puts_(O, "]");
    }
    free(comp.p);
    return rc;
}

/* The name of rule r: `name` or `name-r`. */
static int put_rule_name(rout *O, size_t r)
{
    char b[32];
    IFLOW_TRY(puts_(O, O->name));
    if (r == 0)
        return 0;
    int n = snprintf(b, sizeof b, "-%zu", r);
    return put(O, b, (size_t)n);
}

/* A reference to node id's rule, made (and queued for printing) on first use. */
static int put_ref(rout *O, uint32_t id)
{
    if (!O->rule[id]) {
        O->queue[O->n_rules] = id;
        O->rule[id] = (uint32_t)++O->n_rules;
    }
    return put_rule_name(O, O->rule[id] - 1);
}

static int put_node(rout *O, uint32_t id, int ctx, int depth);

static int put_quantifier(rout *O, int32_t min, int32_t max)
{
    char b[40];
    int n;
    if (max == RX_UNBOUNDED)
        n = min == 0 ? snprintf(b, sizeof b, "*") : min == 1 ? snprintf(b, sizeof b, "+")
                                                               : snprintf(b, sizeof b, "{%d,}", (int)min);
    else if (min == 0 && max == 1)
        n = snprintf(b, sizeof b, "?");
    else if (min == max)
        n = snprintf(b, sizeof b, "{%d}", (int)min);
    else
        n = snprintf(b, sizeof b, "{%d,%d}", (int)min, (int)max);
    return put(O, b, (size_t)n);
}

/* A sequence: runs of characters as one "literal", the rest space-separated. */
static int put_seq(rout *O, rnode x, int depth)
{
    rx *P = O->P;
    int in_literal = 0;
    for (uint32_t k = 0; k < x.n; k++) {
        uint32_t kid = KIDS(P)[x.at + k];
        int is_char = NODES(P)[kid].kind == N_CHAR;
        if (in_literal && !is_char)
            IFLOW_TRY(puts_(O, "\""));
        if (k && !(in_literal && is_char))
            IFLOW_TRY(puts_(O, " "));
        if (is_char) {
            if (!in_literal)
                IFLOW_TRY(puts_(O, "\""));
            IFLOW_TRY(put_cp(O, NODES(P)[kid].at, 0));
        } else {
            IFLOW_TRY(put_node(O, kid, CTX_SEQ, depth + 1));
        }
        in_literal = is_char;
    }
    return in_literal ? puts_(O, "\"") : 0;
}

static int seq_is_literal(const rx *P, rnode x)
{
    for (uint32_t k = 0; k < x.n; k++)
        if (NODES(P)[KIDS(P)[x.at + k]].kind != N_CHAR)
            return 0;
    return 1;
}

static int seq_is_literal(const rx *P, rnode x);

/* A short literal, or a repetition of one, of a character or of a small set: printed in place
 * even where it is shared. */
static int is_small(const rx *P, rnode x)
{
    if (x.kind == N_SEQ)
        return x.n <= 16 && seq_is_literal(P, x);
    if (x.kind != N_REP)
        return 0;
    rnode y = NODES(P)[x.at];
    return y.kind == N_CHAR || (y.kind == N_SET && y.n <= 4) || (y.kind == N_SEQ && is_small(P, y));
}

/* Node id in place; ctx says what surrounds it (parentheses where GBNF needs them). A shared
 * node, or one nested too deep, is printed as a reference to a rule of its own. */
static int put_node(rout *O, uint32_t id, int ctx, int depth)
{
    rx *P = O->P;
    rnode x = NODES(P)[id];
    int composite = x.kind == N_SEQ || x.kind == N_ALT || x.kind == N_REP;
    int shared = O->refs[id] > 1 && !is_small(P, x);
    if (ctx != CTX_TOP && composite && (O->rule[id] || shared || depth > RX_MAX_INLINE))
        return put_ref(O, id);
    switch (x.kind) {
    case N_EMPTY:
        return puts_(O, "\"\"");
    case N_CHAR:
        IFLOW_TRY(puts_(O, "\""));
        IFLOW_TRY(put_cp(O, x.at, 0));
        return puts_(O, "\"");
    case N_SET:
        return put_set(O, id);
    case N_REP:
        if (ctx == CTX_REP)
            IFLOW_TRY(puts_(O, "("));
        IFLOW_TRY(put_node(O, x.at, CTX_REP, depth + 1));
        IFLOW_TRY(put_quantifier(O, x.min, x.max));
        return ctx == CTX_REP ? puts_(O, ")") : 0;
    case N_SEQ: {
        int parens = ctx == CTX_REP && !seq_is_literal(P, x);
        if (parens)
            IFLOW_TRY(puts_(O, "("));
        IFLOW_TRY(put_seq(O, x, depth));
        return parens ? puts_(O, ")") : 0;
    }
    default: /* N_ALT */
        if (ctx != CTX_TOP)
            IFLOW_TRY(puts_(O, "("));
        for (uint32_t k = 0; k < x.n; k++) {
            if (k)
                IFLOW_TRY(puts_(O, " | "));
            IFLOW_TRY(put_node(O, KIDS(P)[x.at + k], CTX_ALT, depth + 1));
        }
        return ctx != CTX_TOP ? puts_(O, ")") : 0;
    }
}

/* refs[node] for the nodes reachable from root (an explicit stack: suffix chains are long). */
static int count_refs(rout *O, uint32_t root)
{
    rx *P = O->P;
    rvec todo = {0};
    int rc = push_u32(&todo, root);
    O->refs[root] = 1;
    while (rc == 0 && todo.n) {
        rnode x = NODES(P)[((uint32_t *)todo.p)[--todo.n]];
        uint32_t n = x.kind == N_REP ? 1 : x.kind == N_SEQ || x.kind == N_ALT ? x.n : 0;
        for (uint32_t k = 0; k < n && rc == 0; k++) {
            uint32_t kid = x.kind == N_REP ? x.at : KIDS(P)[x.at + k];
            if (O->refs[kid]++ == 0)
                rc = push_u32(&todo, kid);
        }
    }
    free(todo.p);
    return rc;
}

/* Every rule, the root's first, one a line. */
static int print_rules(rout *O, uint32_t root)
{
    size_t n = O->P->node.n;
    O->refs = calloc(n, sizeof *O->refs);
    O->rule = calloc(n, sizeof *O->rule);
    O->queue = calloc(n + 1, sizeof *O->queue);
    if (!O->refs || !O->rule || !O->queue)
        return nomem();
    IFLOW_TRY(count_refs(O, root));
    O->queue[0] = root;
    O->rule[root] = 1;
    O->n_rules = 1;
    for (size_t r = 0; r < O->n_rules; r++) {
        IFLOW_TRY(put_rule_name(O, r));
        IFLOW_TRY(puts_(O, " ::= "));
        IFLOW_TRY(put_node(O, O->queue[r], CTX_TOP, 0));
        IFLOW_TRY(puts_(O, "\n"));
    }
    return 0;
}

/* ---- the entry point ---------------------------------------------------------------------- */

static int check_name(const char *name)
{
    size_t n = strlen(name);
    int ok = n > 0 && n <= RX_MAX_NAME;
    for (size_t i = 0; i < n && ok; i++)
        ok = is_ascii_letter(name[i]) || is_digit(name[i]) || name[i] == '-' || name[i] == '_';
    return ok ? 0 : iflow_seterr(IFLOW_EINVAL, "regex: bad rule name '%s'", iflow_quote(name));
}

/* Parse re [len] into *root (a node of P). */
static int parse_regex(rx *P, uint32_t *root)
{
    uint32_t id;
    IFLOW_TRY(check_utf8(P->s, P->n));
    IFLOW_TRY(node_new(P, N_EMPTY, 1, 0, 0, &id)); /* ID_EMPTY */
    IFLOW_TRY(node_new(P, N_NONE, 0, 0, 0, &id));  /* ID_NONE */
    IFLOW_TRY(parse_alt(P, root));
    if (P->i < P->n) /* only ')' stops the top level early */
        return rx_err(P->i, "unbalanced parenthesis: ')' without '('");
    if (NODES(P)[*root].kind == N_NONE)
        return rx_err(0, "the pattern can never match");
    return 0;
}

int iflow_grammar_from_regex(const char *re, size_t len, const char *name, char **out)
{
    if (!out)
        return iflow_seterr(IFLOW_EINVAL, "regex: no place for the grammar (out is NULL)");
    *out = NULL;
    if (!re && len)
        return iflow_seterr(IFLOW_EINVAL, "regex: the pattern is NULL");
    if (len > IFLOW_GRAMMAR_MAX_TEXT)
        return iflow_seterr(IFLOW_ERANGE, "regex: too long: %zu bytes, over the limit of %u", len,
                            IFLOW_GRAMMAR_MAX_TEXT);
    name = name ? name : "root";
    IFLOW_TRY(check_name(name));
    rx P = {.s = re ? re : "", .n = len};
    rout O = {.P = &P, .name = name};
    uint32_t root;
    int rc = parse_regex(&P, &root);
    if (rc == 0)
        rc = print_rules(&O, root);
    free(P.node.p);
    free(P.kid.p);
    free(P.rng.p);
    free(P.stk.p);
    free(P.cls.p);
    free(O.refs);
    free(O.rule);
    free(O.queue);
    if (rc < 0) {
        free(O.buf);
        return rc;
    }
    *out = O.buf;
    return 0;
}
