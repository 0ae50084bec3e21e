/*
 * grammar_schema.c -- a JSON Schema made into a GBNF grammar (iflow_grammar_from_json_schema, grammar.h):
 * the grammar of the JSON texts that a model may write under llama.cpp's --json-schema, vLLM's
 * guided_json or OpenAI's response_format.
 *
 * Contract
 *   The schema is JSON text (jansson, duplicate keys refused), JSON Schema draft 2020-12. NULL, {}
 *   and true give any JSON value; {"type":"object"} alone any JSON object (OpenAI's json_object).
 *   The grammar never accepts a text whose value the schema rejects: where a keyword cannot be
 *   rendered exactly, the schema is refused (IFLOW_EINVAL, "json schema: <what>, at <pointer>"), or
 *   the grammar accepts a documented subset of the valid texts (below). The result is a whole
 *   grammar whose rule "root" is the value; the other rules are named "root-..." (the schema's parts),
 *   "pattern<N>..." (regular expressions, grammar_regex.c) and fixed helpers (value, string, ws, ...).
 *
 *   Text. RFC 8259 JSON with no whitespace before or after the value; between tokens up to 32 bytes of
 *   [ \t\n\r] (WS_MAX: compact text and json.dumps(indent=2) to nesting depth 15 both match, while a
 *   model cannot write whitespace forever).
 *   Strings: any code point but '"', '\' and U+0000-U+001F, or the escapes \" \\ \/ \b \f \n \r \t
 *   \uXXXX (a surrogate only as a high-low pair: a lone one is refused). minLength/maxLength count
 *   code points as Python does (a character, an escape or a surrogate pair is one).
 *   "pattern": the string's value (its characters after unescaping) must match the regular expression
 *   as re.search would (in grammar_regex.c's dialect, which refuses what it cannot render): anywhere,
 *   unless it starts with '^' / ends with '$', which are taken off and anchor that end (so "abc$"
 *   does not accept "abc\n", which Python's '$' would). Such a string is
 *   written the one way json.dumps(ensure_ascii=False) writes it: escapes only for '"', '\' and
 *   U+0000-U+001F (\" \\ \b \f \n \r \t, else \u00xx). "pattern" with minLength/maxLength is refused.
 *   "format": date, time, date-time (RFC 3339 as Python's jsonschema checks them: calendar days and
 *   leap years, 'T' and 'Z' upper case, fractions of 1-9 digits, no leap second) and uuid (8-4-4-4-12
 *   hex digits); other formats are ignored (any string), as JSON Schema does by default. A format
 *   with min/maxLength or pattern is refused unless the lengths hold for every text of the format.
 *   Numbers: "integer" is -?(0|[1-9][0-9]*) ("1.0", an integer to JSON Schema, is not accepted);
 *   minimum/maximum/exclusiveMinimum/exclusiveMaximum exactly, by digit ranges, for bounds up to
 *   9e18 in magnitude ("-0" too where 0 is in range). "number" adds a fraction and an exponent;
 *   bounds on a number must be whole numbers up to 1e15 in magnitude, and a bounded number is
 *   written without an exponent (and with at most 15 significant digits next to an exclusive bound,
 *   so that Python's rounding to a double cannot land on the bound). Other bounds on numbers are
 *   refused.
 *   boolean, null; enum and const: each value's JSON text, compact but for whitespace between the
 *   tokens of an array or object value, keys in the schema's order; numbers in Python's repr (1.0
 *   also as 1). enum/const with other constraints than "type" is refused.
 *   type as a list; anyOf and oneOf as alternatives (oneOf's exclusivity is NOT enforced: a text
 *   that two branches accept is accepted); their sibling keywords are merged into each branch.
 *   allOf (and $ref with constraining siblings) is merged when that is exact: types intersected,
 *   properties united (a name listed in one branch takes the others' additionalProperties), required
 *   united, items and prefixItems position by position, bounds tightened, enum intersected, anyOf
 *   multiplied out; two different patterns or formats are refused.
 *   Objects: the properties in the order the schema lists them; required ones must appear, optional
 *   ones may be left out, those present keep the schema's order; keys written as json.dumps writes
 *   them. additionalProperties absent or false: no other keys when the schema has "properties" (even
 *   {}) or "required" (unlike JSON Schema, like llama.cpp's converter and OpenAI's strict mode; an
 *   object schema with neither accepts any object). additionalProperties true or a schema: other
 *   keys after the listed ones, each a string of unescaped characters (no escapes: so that none
 *   can spell a listed name another way) other than the listed names. A required name that is not
 *   listed is a property of the additionalProperties schema. minProperties/maxProperties are refused
 *   unless every object the grammar allows satisfies them.
 *   Arrays: prefixItems (the array may stop before the end of the tuple, as JSON Schema says, unless
 *   minItems), items (absent: any values), minItems/maxItems up to IFLOW_GRAMMAR_MAX_REPEAT;
 *   uniqueItems false. "items" as an array (draft 7 tuples) is refused.
 *   $ref: "#", "#/$defs/NAME", "#/definitions/NAME" or any JSON pointer into the document (~0 ~1 and
 *   %-escapes); a rule per referenced schema, emitted once, so recursion works; a cycle of $refs
 *   that matches no text in between (left recursion) is refused, so is any other $ref. A $ref to a
 *   schema that matches no value matches nothing (found after the fact: the conversion starts over,
 *   up to MAX_RETRY times), so that an optional property or an anyOf branch of it drops out.
 *   Ignored: annotations (title, description, default, examples, deprecated, readOnly, writeOnly,
 *   $schema, $id at the root, $anchor, $dynamicAnchor, $comment, $defs, definitions, $vocabulary,
 *   contentEncoding, contentMediaType, contentSchema) and keywords JSON Schema does not define
 *   (nullable, discriminator, x-...), as validators do.
 *   Refused, naming the keyword and where: not, if, then, else, patternProperties, propertyNames,
 *   dependentRequired, dependentSchemas, dependencies, contains, minContains, maxContains,
 *   multipleOf, unevaluatedProperties, unevaluatedItems, additionalItems, uniqueItems true,
 *   $dynamicRef, $recursiveRef, $id below the root; a schema that matches no value at all.
 *   Limits (the schema is untrusted): IFLOW_GRAMMAR_MAX_TEXT bytes of schema (IFLOW_EINVAL) and of
 *   grammar (IFLOW_ERANGE); MAX_DEPTH nested schemas; MAX_WORK conversion steps (IFLOW_ERANGE: a
 *   schema whose merges multiply out). Never prints, never exits; IFLOW_ENOMEM when memory runs out.
 */
#include "libcore/base/error.h"
#include "libcore/base/quote.h"
#include "libcore/base/utf8.h"
#include "libcore/serving/grammar.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WS_MAX 32           /* bytes of whitespace between two tokens                    */
#define MAX_DEPTH 64        /* schemas nested in a schema (and $ref/allOf chains)         */
#define MAX_WORK 200000     /* conversion steps                                           */
#define MAX_PREFIX 64       /* prefixItems (each nests the grammar one level deeper)      */
#define MAX_ALTS 1024       /* anyOf branches after multiplying out                       */
#define MAX_INT 9e18        /* |bound| of an integer                                      */
#define MAX_NUM_BOUND 1e15  /* |bound| of a number                                        */
#define INLINE_MAX 48       /* a property's value longer than this gets a rule of its own */
#define MAX_RETRY 16        /* $ref targets found to match nothing, each costing one more attempt */

/* ---- growing text ------------------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t n, cap;
    int bad; /* IFLOW_ENOMEM or IFLOW_ERANGE once an append failed; later ones do nothing */
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n)
{
    if (b->bad)
        return;
    if (n >= IFLOW_GRAMMAR_MAX_TEXT - b->n) {
        b->bad = IFLOW_ERANGE;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->bad = IFLOW_ENOMEM;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

static void __attribute__((format(printf, 2, 3))) sb_printf(sbuf *b, const char *fmt, ...)
{
    char t[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    sb_putn(b, t, n < 0 ? 0 : (size_t)n < sizeof t ? (size_t)n : sizeof t - 1);
}

static int oom(void) { return iflow_seterr(IFLOW_ENOMEM, "out of memory"); }

/* 0, or the failure of an append as an error code with its message. */
static int sb_err(const sbuf *b)
{
    if (b->bad == IFLOW_ENOMEM)
        return oom();
    if (b->bad)
        return iflow_seterr(IFLOW_ERANGE, "json schema: the grammar would be over %u bytes",
                            (unsigned)IFLOW_GRAMMAR_MAX_TEXT);
    return 0;
}

/* The text (malloc'd, "" when empty), the buffer emptied; NULL and an error when it failed. */
static int sb_take(sbuf *b, char **out)
{
    *out = NULL;
    int rc = sb_err(b);
    if (rc == 0 && !b->p)
        sb_putn(b, "", 0), rc = b->p ? 0 : oom();
    if (rc == 0)
        *out = b->p;
    else
        free(b->p);
    memset(b, 0, sizeof *b);
    return rc;
}

/* ---- the converter's state ------------------------------------------------------------------ */

enum { KW_IGNORED, KW_HANDLED, KW_REFUSED };

enum { /* fixed helper rules, emitted when used */
    H_WS = 1 << 0, H_VALUE = 1 << 1, H_OBJECT = 1 << 2, H_ARRAY = 1 << 3, H_STRING = 1 << 4,
    H_CHAR = 1 << 5, H_HEX = 1 << 6, H_NUMBER = 1 << 7, H_INTEGER = 1 << 8, H_KEYCHAR = 1 << 9,
    H_DATE = 1 << 10, H_TIME = 1 << 11, H_DATETIME = 1 << 12, H_UUID = 1 << 13, H_COUNT = 14
};

enum { /* JSON types, as a set */
    T_NULL = 1, T_BOOL = 2, T_OBJECT = 4, T_ARRAY = 8, T_STRING = 16, T_NUMBER = 32, T_INTEGER = 64,
    T_ALL = 127
};

typedef struct {
    char *ref;     /* the $ref text ("#" for the root) */
    char *ptr;     /* its JSON pointer, decoded, for messages */
    char *name;    /* its rule */
    json_t *target;
} ref_rule;

typedef struct {
    json_t *doc;
    sbuf top;          /* the rules of the root and of $ref targets, root first */
    sbuf more;         /* rules made on the way (objects, their tails, keys, patterns) */
    sbuf path;         /* JSON pointer of the schema being converted */
    json_t *names;     /* rule names in use (a set) */
    json_t *suffix;    /* a name's base -> the next number to try after it */
    json_t *ref_index; /* $ref text -> index in refs */
    ref_rule *refs;
    int n_refs, cap_refs;
    int *edges; /* pairs (a, b): refs[a]'s rule can start with refs[b]'s */
    int n_edges, cap_edges;
    int cur;     /* the ref being converted */
    int at_head; /* nothing consumed yet in that rule */
    unsigned helpers;
    int n_patterns;
    int depth;
    long work;
    json_t *flattening; /* $ref targets being merged (an array), to catch a cycle */
    json_t *never;      /* $ref texts whose schemas match nothing (a set kept across attempts) */
    int never_ref;      /* the ref convert_all found matching nothing */
} conv;

/* "json schema: <what>, at <where>", IFLOW_EINVAL. */
static int __attribute__((format(printf, 2, 3))) fail(conv *cv, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *at = cv->path.n ? iflow_quoten(cv->path.p, cv->path.n) : "the root";
    return iflow_seterr(IFLOW_EINVAL, "json schema: %s, at %s", what, at);
}

static int grow(void **p, int *cap, int need, size_t size)
{
    if (need <= *cap)
        return 0;
    int c = *cap ? *cap * 2 : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q)
        return oom();
    *p = q;
    *cap = c;
    return 0;
}

/* Count one step; IFLOW_ERANGE past MAX_WORK. */
static int step(conv *cv, long n)
{
    cv->work += n;
    if (cv->work > MAX_WORK)
        return iflow_seterr(IFLOW_ERANGE, "json schema: too complex to convert (over %d steps), at %s", MAX_WORK,
                            cv->path.n ? iflow_quoten(cv->path.p, cv->path.n) : "the root");
    return 0;
}

/* Push one segment on the path (escaped as a JSON pointer); returns the length to pop back to. */
static size_t path_push(conv *cv, const char *seg)
{
    size_t was = cv->path.n;
    sb_putn(&cv->path, "/", 1);
    for (const char *s = seg; *s; s++)
        sb_puts(&cv->path, *s == '~' ? "~0" : *s == '/' ? "~1" : (char[2]){*s, 0});
    return was;
}

static size_t path_push_index(conv *cv, size_t i)
{
    char t[32];
    snprintf(t, sizeof t, "%zu", i);
    return path_push(cv, t);
}

static void path_pop(conv *cv, size_t was)
{
    cv->path.n = was;
    if (cv->path.p)
        cv->path.p[was] = 0;
}

/* ---- names ------------------------------------------------------------------------------- */

/* A fresh rule name: "root-" and the hint's letters and digits (others made '-'), made unique by a
 * number. */
static int new_name(conv *cv, const char *hint, char **out)
{
    char base[64] = "root-";
    size_t n = 5;
    for (const char *s = hint; *s && n < 40; s++) {
        int ok = (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9');
        if (ok)
            base[n++] = *s;
        else if (base[n - 1] != '-')
            base[n++] = '-';
    }
    while (n > 5 && base[n - 1] == '-')
        n--;
    if (n == 5)
        memcpy(base + n, "x", 2), n++;
    base[n] = 0;
    char name[80];
    snprintf(name, sizeof name, "%s", base);
    json_t *count = json_object_get(cv->suffix, base); /* the next number to try for this base */
    json_int_t i = count ? json_integer_value(count) : 2;
    while (json_object_get(cv->names, name))
        snprintf(name, sizeof name, "%s-%lld", base, (long long)i++);
    if (json_object_set_new(cv->suffix, base, json_integer(i)) < 0 ||
        json_object_set_new(cv->names, name, json_true()) < 0 || !(*out = strdup(name)))
        return oom();
    return 0;
}

/* A hint for a rule's name: the last segment of the path that is not a keyword or an index. */
static void path_hint(const conv *cv, const char *dflt, char *out, size_t cap)
{
    static const char *const skip[] = {"properties", "$defs", "definitions", "anyOf", "oneOf", "allOf",
                                       "prefixItems", "additionalProperties", NULL};
    const char *p = cv->path.p ? cv->path.p : "";
    size_t end = cv->path.n;
    snprintf(out, cap, "%s", dflt);
    while (end > 0) {
        size_t start = end;
        while (start > 0 && p[start - 1] != '/')
            start--;
        size_t len = end - start;
        int keyword = len == 0 || strspn(p + start, "0123456789") >= len;
        for (int i = 0; skip[i] && !keyword; i++)
            keyword = strlen(skip[i]) == len && !memcmp(skip[i], p + start, len);
        if (!keyword) {
            int items = len == 5 && !memcmp(p + start, "items", 5);
            snprintf(out, cap, "%.*s", items ? 4 : (int)len, p + start);
            return;
        }
        end = start ? start - 1 : 0;
    }
}

/* "name ::= body" among the made rules; *name is the new name. */
static int make_rule(conv *cv, const char *hint, const char *body, char **name)
{
    IFLOW_TRY(new_name(cv, hint, name));
    sb_puts(&cv->more, *name);
    sb_puts(&cv->more, " ::= ");
    sb_puts(&cv->more, body);
    sb_puts(&cv->more, "\n");
    return sb_err(&cv->more);
}

/* A fixed helper's name, marking it used. */
static char *helper(conv *cv, unsigned h, const char *name)
{
    cv->helpers |= h;
    return strdup(name);
}

/* ---- text of code points ------------------------------------------------------------------- */

/* The code point at s [n] from *i (valid UTF-8 expected); UINT32_MAX on a bad sequence, then
 * past its maximal invalid subpart. */
static uint32_t utf8_next(const char *s, size_t n, size_t *i)
{
    uint32_t cp;
    int len = iflow_utf8_decode(s + *i, n - *i, &cp);
    *i += (size_t)(len > 0 ? len : -len);
    return len > 0 ? cp : UINT32_MAX;
}

static void utf8_put(sbuf *b, uint32_t cp)
{
    char t[4];
    size_t n;
    if (cp < 0x80)
        t[0] = (char)cp, n = 1;
    else if (cp < 0x800)
        t[0] = (char)(0xC0 | cp >> 6), t[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000)
        t[0] = (char)(0xE0 | cp >> 12), t[1] = (char)(0x80 | (cp >> 6 & 0x3F)), t[2] = (char)(0x80 | (cp & 0x3F)),
        n = 3;
    else
        t[0] = (char)(0xF0 | cp >> 18), t[1] = (char)(0x80 | (cp >> 12 & 0x3F)),
        t[2] = (char)(0x80 | (cp >> 6 & 0x3F)), t[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    sb_putn(b, t, n);
}

/* A code point inside a GBNF literal (in_class 0) or class (1): ASCII letters, digits and plain
 * punctuation as themselves, everything else escaped. */
static void gbnf_cp(sbuf *b, uint32_t cp, int in_class)
{
    int plain = cp >= 0x20 && cp < 0x7F && cp != '"' && cp != '\\' &&
                (!in_class || (cp != ']' && cp != '[' && cp != '-' && cp != '^'));
    if (plain)
        sb_putn(b, (char[1]){(char)cp}, 1);
    else if (!in_class && (cp == '"' || cp == '\\'))
        sb_putn(b, (char[2]){'\\', (char)cp}, 2);
    else if (cp < 0x100)
        sb_printf(b, "\\x%02X", (unsigned)cp);
    else if (cp < 0x10000)
        sb_printf(b, "\\u%04X", (unsigned)cp);
    else
        sb_printf(b, "\\U%08X", (unsigned)cp);
}

/* A GBNF literal matching exactly the UTF-8 text s [n]. */
static int gbnf_literal(sbuf *b, const char *s, size_t n)
{
    sb_putn(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint32_t cp = utf8_next(s, n, &i);
        if (cp == UINT32_MAX)
            return -1;
        gbnf_cp(b, cp, 0);
    }
    sb_putn(b, "\"", 1);
    return 0;
}

/* One code point as json.dumps(ensure_ascii=False) writes it inside a string. */
static void json_cp(sbuf *b, uint32_t cp)
{
    static const char short_esc[] = "btn\0fr"; /* 0x08..0x0D */
    if (cp == '"' || cp == '\\')
        sb_putn(b, (char[2]){'\\', (char)cp}, 2);
    else if (cp >= 0x08 && cp <= 0x0D && short_esc[cp - 8])
        sb_putn(b, (char[2]){'\\', short_esc[cp - 8]}, 2);
    else if (cp < 0x20)
        sb_printf(b, "\\u%04x", (unsigned)cp);
    else
        utf8_put(b, cp);
}

/* The JSON text of string s [n] (quotes included). */
static int json_string_text(sbuf *b, const char *s, size_t n)
{
    sb_putn(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint32_t cp = utf8_next(s, n, &i);
        if (cp == UINT32_MAX)
            return -1;
        json_cp(b, cp);
    }
    sb_putn(b, "\"", 1);
    return 0;
}

/* A GBNF literal of the JSON text of string s [n]. */
static int literal_of_string(conv *cv, sbuf *b, const char *s, size_t n)
{
    sbuf t = {0};
    int bad = json_string_text(&t, s, n);
    if (!bad && !t.bad)
        bad = gbnf_literal(b, t.p, t.n);
    int rc = t.bad ? sb_err(&t) : bad ? fail(cv, "a string is not valid UTF-8") : 0;
    free(t.p);
    return rc;
}

/* A finite double as Python's repr writes it (shortest round trip; exponent below 1e-4 and from
 * 1e16 on). */
static void python_float(sbuf *b, double v)
{
    char t[48];
    for (int p = 1; p <= 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, v);
        if (strtod(t, NULL) == v)
            break;
    }
    char digits[24];
    int nd = 0, neg = t[0] == '-';
    const char *s = t + neg;
    for (; *s && *s != 'e'; s++)
        if (*s != '.')
            digits[nd++] = *s;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int e = atoi(s + 1);
    if (neg)
        sb_putn(b, "-", 1);
    if (e < -4 || e >= 16) {
        sb_putn(b, digits, 1);
        if (nd > 1)
            sb_putn(b, ".", 1), sb_putn(b, digits + 1, (size_t)nd - 1);
        sb_printf(b, "e%c%02d", e < 0 ? '-' : '+', abs(e));
    } else if (e >= 0) {
        for (int i = 0; i <= e; i++)
            sb_putn(b, i < nd ? digits + i : "0", 1);
        sb_putn(b, ".", 1);
        if (nd > e + 1)
            sb_putn(b, digits + e + 1, (size_t)(nd - e - 1));
        else
            sb_putn(b, "0", 1);
    } else {
        sb_putn(b, "0.", 2);
        for (int i = 0; i < -e - 1; i++)
            sb_putn(b, "0", 1);
        sb_putn(b, digits, (size_t)nd);
    }
}

/* ---- keywords -------------------------------------------------------------------------------- */

static int kw_class(const char *k)
{
    static const char *const handled[] = {
        "type", "enum", "const", "properties", "required", "additionalProperties", "minProperties",
        "maxProperties", "items", "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern",
        "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "allOf", "anyOf", "oneOf",
        "$ref", "uniqueItems", NULL};
    static const char *const refused[] = {
        "not", "if", "then", "else", "patternProperties", "propertyNames", "dependentRequired",
        "dependentSchemas", "dependencies", "contains", "minContains", "maxContains", "multipleOf",
        "unevaluatedProperties", "unevaluatedItems", "additionalItems", "$dynamicRef", "$recursiveRef", NULL};
    for (int i = 0; handled[i]; i++)
        if (!strcmp(k, handled[i]))
            return KW_HANDLED;
    for (int i = 0; refused[i]; i++)
        if (!strcmp(k, refused[i]))
            return KW_REFUSED;
    return KW_IGNORED;
}

/* Refuse what this converter does not render; check the shapes of the keywords it does. */
static int check_keywords(conv *cv, json_t *s)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (kw_class(k) == KW_REFUSED)
            return fail(cv, "keyword '%s' is not supported", k);
        if (!strcmp(k, "uniqueItems") && !json_is_false(v))
            return fail(cv, "keyword 'uniqueItems' is not supported (only false)");
        if (!strcmp(k, "$id") && s != cv->doc)
            return fail(cv, "keyword '$id' is not supported below the root");
        if (!strcmp(k, "items") && !json_is_object(v) && !json_is_boolean(v))
            return fail(cv, "'items' must be a schema (draft 7's array of schemas is 'prefixItems' now)");
        if ((!strcmp(k, "allOf") || !strcmp(k, "anyOf") || !strcmp(k, "oneOf") || !strcmp(k, "prefixItems")) &&
            (!json_is_array(v) || json_array_size(v) == 0))
            return fail(cv, "'%s' must be a non-empty array of schemas", k);
        if ((!strcmp(k, "properties") && !json_is_object(v)) || (!strcmp(k, "$ref") && !json_is_string(v)) ||
            (!strcmp(k, "enum") && !json_is_array(v)) || (!strcmp(k, "pattern") && !json_is_string(v)) ||
            (!strcmp(k, "format") && !json_is_string(v)) || (!strcmp(k, "required") && !json_is_array(v)))
            return fail(cv, "'%s' has the wrong type", k);
        if (!strcmp(k, "additionalProperties") && !json_is_object(v) && !json_is_boolean(v))
            return fail(cv, "'additionalProperties' must be a schema");
    }
    json_t *req = json_object_get(s, "required");
    for (size_t i = 0; i < json_array_size(req); i++)
        if (!json_is_string(json_array_get(req, i)))
            return fail(cv, "'required' must be an array of strings");
    return 0;
}

/* 1 if s has a keyword that constrains (or is refused) other than those named in `except`
 * (NULL-terminated). */
static int has_constraints(json_t *s, const char *const *except)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        int skip = kw_class(k) == KW_IGNORED || (!strcmp(k, "uniqueItems") && json_is_false(v));
        for (int i = 0; except && except[i] && !skip; i++)
            skip = !strcmp(k, except[i]);
        if (!skip)
            return 1;
    }
    return 0;
}

/* 1 for true or a schema without constraints ({}, {"description": ...}). */
static int is_any(json_t *s) { return json_is_true(s) || (json_is_object(s) && !has_constraints(s, NULL)); }

/* A non-negative whole count: 1 and *v when present, 0 when absent, < 0 on a bad value. */
static int get_count(conv *cv, json_t *s, const char *key, long long *v)
{
    json_t *x = json_object_get(s, key);
    if (!x)
        return 0;
    double d = json_number_value(x);
    if (!json_is_number(x) || d < 0 || d != floor(d))
        return fail(cv, "'%s' must be a non-negative integer", key);
    *v = json_is_integer(x) ? json_integer_value(x) : d > 9e18 ? (long long)9e18 : (long long)d;
    return 1;
}

/* The type set of a "type" value; < 0 on a bad one. */
static int type_set(conv *cv, json_t *t)
{
    static const char *const names[] = {"null", "boolean", "object", "array", "string", "number", "integer"};
    int set = 0;
    for (size_t i = 0; i < (json_is_array(t) ? json_array_size(t) : 1); i++) {
        json_t *x = json_is_array(t) ? json_array_get(t, i) : t;
        int bit = 0;
        for (int j = 0; j < 7 && json_is_string(x); j++)
            if (!strcmp(json_string_value(x), names[j]))
                bit = 1 << j;
        if (!bit)
            return json_is_string(x) ? fail(cv, "unknown type '%s'", iflow_quote(json_string_value(x)))
                                     : fail(cv, "'type' must be a type name or an array of them");
        set |= bit;
    }
    return set;
}

/* ---- $ref ------------------------------------------------------------------------------------ */

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                                                    : -1;
}

/* The schema that a JSON pointer (%-escapes and ~0 ~1 decoded) names in doc; NULL if none. The
 * decoded pointer goes to *ptr (malloc'd). */
static json_t *resolve_pointer(json_t *doc, const char *frag, char **ptr)
{
    sbuf d = {0};
    for (const char *s = frag; *s; s++) {
        int h, l;
        if (*s == '%' && (h = hexval(s[1])) >= 0 && (l = hexval(s[2])) >= 0) {
            char c = (char)(h * 16 + l);
            sb_putn(&d, &c, 1);
            s += 2;
        } else
            sb_putn(&d, s, 1);
    }
    if (d.bad || !d.p) {
        *ptr = d.bad ? NULL : strdup("");
        free(d.p);
        return d.bad ? NULL : doc;
    }
    *ptr = d.p;
    json_t *at = doc;
    const char *s = d.p;
    char seg[1024];
    while (at && *s == '/') {
        size_t n = 0;
        for (s++; *s && *s != '/'; s++) {
            if (n + 1 >= sizeof seg)
                return NULL;
            if (*s == '~' && (s[1] == '0' || s[1] == '1'))
                seg[n++] = s[1] == '0' ? '~' : '/', s++;
            else
                seg[n++] = *s;
        }
        seg[n] = 0;
        if (json_is_object(at))
            at = json_object_get(at, seg);
        else if (json_is_array(at) && n > 0 && n < 10 && strspn(seg, "0123456789") == n && (seg[0] != '0' || n == 1))
            at = json_array_get(at, (size_t)atol(seg));
        else
            at = NULL;
    }
    return *s ? NULL : at;
}

/* The index of the rule for $ref text ref, registering it (to convert later) on first sight. */
static int ref_lookup(conv *cv, const char *ref, int *idx)
{
    json_t *known = json_object_get(cv->ref_index, ref);
    if (known) {
        *idx = (int)json_integer_value(known);
        return 0;
    }
    if (ref[0] != '#' || (ref[1] && ref[1] != '/'))
        return fail(cv, "$ref '%s' is not supported (only '#' and '#/...' within the schema)", iflow_quote(ref));
    char *ptr = NULL;
    json_t *target = resolve_pointer(cv->doc, ref + 1, &ptr);
    if (!ptr)
        return oom();
    if (!target) {
        free(ptr);
        return fail(cv, "$ref '%s' points to nothing", iflow_quote(ref));
    }
    if (grow((void **)&cv->refs, &cv->cap_refs, cv->n_refs + 1, sizeof *cv->refs) < 0) {
        free(ptr);
        return IFLOW_ENOMEM;
    }
    ref_rule *r = &cv->refs[cv->n_refs];
    memset(r, 0, sizeof *r);
    r->ptr = ptr;
    r->target = target;
    int rc = 0;
    if (cv->n_refs == 0) {
        r->name = strdup("root");
        rc = r->name && json_object_set_new(cv->names, "root", json_true()) == 0 ? 0 : oom();
    } else {
        const char *last = strrchr(ptr, '/');
        rc = new_name(cv, last ? last + 1 : ptr, &r->name);
    }
    if (rc == 0 && !(r->ref = strdup(ref)))
        rc = oom();
    if (rc == 0 && json_object_set_new(cv->ref_index, ref, json_integer(cv->n_refs)) < 0)
        rc = oom();
    cv->n_refs++; /* freed with the others even when it failed */
    *idx = cv->n_refs - 1;
    return rc;
}

static int conv_ref(conv *cv, const char *ref, char **out)
{
    *out = NULL;
    if (json_object_get(cv->never, ref)) /* a schema that matches nothing (an earlier attempt found) */
        return 0;
    int idx;
    IFLOW_TRY(ref_lookup(cv, ref, &idx));
    if (cv->at_head) {
        IFLOW_TRY(grow((void **)&cv->edges, &cv->cap_edges, cv->n_edges * 2 + 2, sizeof *cv->edges));
        cv->edges[cv->n_edges * 2] = cv->cur;
        cv->edges[cv->n_edges * 2 + 1] = idx;
        cv->n_edges++;
    }
    return (*out = strdup(cv->refs[idx].name)) ? 0 : oom();
}

static int cmp_edge(const void *a, const void *b)
{
    const int *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* A cycle among the head references (a $ref target that can start with itself): an iterative
 * depth-first search over the edges sorted by their source. The index + 1 of a ref on the cycle,
 * or 0; < 0 on failure. */
static int head_cycle(conv *cv)
{
    int n = cv->n_refs, found = 0;
    if (cv->n_edges)
        qsort(cv->edges, (size_t)cv->n_edges, 2 * sizeof *cv->edges, cmp_edge);
    int *first = calloc((size_t)n + 1, sizeof *first), *stack = malloc(((size_t)n + 1) * sizeof *stack);
    int *next = malloc(((size_t)n + 1) * sizeof *next);
    char *color = calloc((size_t)n + 1, 1); /* 0 new, 1 on the stack, 2 done */
    if (!first || !stack || !next || !color) {
        free(first), free(stack), free(next), free(color);
        return oom();
    }
    for (int i = 0, a = 0; a <= n; a++) { /* edges of a: first[a] .. first[a + 1] - 1 */
        while (i < cv->n_edges && cv->edges[2 * i] < a)
            i++;
        first[a] = i;
    }
    for (int root = 0; root < n && !found; root++) {
        if (color[root])
            continue;
        int top = 0;
        stack[0] = root, next[0] = first[root], color[root] = 1;
        while (top >= 0 && !found) {
            int a = stack[top];
            if (next[top] >= first[a + 1]) {
                color[a] = 2, top--;
                continue;
            }
            int b = cv->edges[2 * next[top]++ + 1];
            if (color[b] == 1)
                found = b + 1;
            else if (color[b] == 0)
                top++, stack[top] = b, next[top] = first[b], color[b] = 1;
        }
    }
    free(first), free(stack), free(next), free(color);
    return found;
}

static int check_left_recursion(conv *cv)
{
    int bad = head_cycle(cv);
    if (bad <= 0)
        return bad;
    path_pop(cv, 0);
    return fail(cv, "$ref '%s' comes back to itself before any text (left recursion)",
                iflow_quote(cv->refs[bad - 1].ref));
}

/* ---- merging (allOf, $ref with siblings, anyOf with siblings) ------------------------------------ */

static int jset(json_t *o, const char *k, json_t *v) { return json_object_set_new(o, k, v) < 0 ? oom() : 0; }
static int jpush(json_t *a, json_t *v) { return json_array_append_new(a, v) < 0 ? oom() : 0; }

/* {"allOf": list} of the schemas in list (a new reference), or the one schema, or true. */
static json_t *all_of(json_t *list)
{
    size_t n = json_array_size(list);
    if (n == 0)
        return json_true();
    if (n == 1)
        return json_incref(json_array_get(list, 0));
    return json_pack("{sO}", "allOf", list);
}

/* A copy of s's constraining keywords but those in except (NULL-terminated). */
static json_t *constraints_copy(json_t *s, const char *const *except)
{
    json_t *c = json_object();
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        int skip = kw_class(k) != KW_HANDLED;
        for (int i = 0; except && except[i] && !skip; i++)
            skip = !strcmp(k, except[i]);
        if (c && !skip && json_object_set(c, k, v) < 0)
            json_decref(c), c = NULL;
    }
    return c;
}

static int flatten(conv *cv, json_t *s, json_t *branches);

/* The schema that $ref text ref names, merged into branches. */
static int flatten_ref(conv *cv, const char *ref, json_t *branches)
{
    if (ref[0] != '#' || (ref[1] && ref[1] != '/'))
        return fail(cv, "$ref '%s' is not supported (only '#' and '#/...' within the schema)", iflow_quote(ref));
    char *ptr = NULL;
    json_t *target = resolve_pointer(cv->doc, ref + 1, &ptr);
    if (!ptr)
        return oom();
    int rc = 0;
    for (size_t i = 0; target && i < json_array_size(cv->flattening); i++)
        if (json_array_get(cv->flattening, i) == target)
            rc = fail(cv, "$ref '%s' comes back to itself through allOf", iflow_quote(ref));
    if (rc == 0 && !target)
        rc = fail(cv, "$ref '%s' points to nothing", iflow_quote(ref));
    if (rc == 0) {
        sbuf saved = cv->path;
        memset(&cv->path, 0, sizeof cv->path);
        sb_puts(&cv->path, ptr);
        rc = json_array_append(cv->flattening, target) < 0 ? oom() : flatten(cv, target, branches);
        json_array_remove(cv->flattening, json_array_size(cv->flattening) - 1);
        free(cv->path.p);
        cv->path = saved;
    }
    free(ptr);
    return rc;
}

/* s as a list of schemas without allOf or $ref (their conjunction is s), appended to branches. */
static int flatten(conv *cv, json_t *s, json_t *branches)
{
    IFLOW_TRY(step(cv, 1));
    if (json_is_true(s))
        return 0;
    if (json_is_false(s))
        return jpush(branches, json_pack("{s[]}", "type"));
    if (!json_is_object(s))
        return fail(cv, "a schema must be an object or a boolean");
    if (cv->depth >= MAX_DEPTH)
        return fail(cv, "schemas nested deeper than %d", MAX_DEPTH);
    IFLOW_TRY(check_keywords(cv, s));
    static const char *const nested[] = {"allOf", "$ref", NULL};
    IFLOW_TRY(jpush(branches, constraints_copy(s, nested)));
    cv->depth++;
    int rc = 0;
    json_t *ref = json_object_get(s, "$ref");
    if (ref)
        rc = flatten_ref(cv, json_string_value(ref), branches);
    json_t *all = json_object_get(s, "allOf");
    for (size_t i = 0; rc == 0 && i < json_array_size(all); i++) {
        size_t was = path_push(cv, "allOf");
        path_push_index(cv, i);
        rc = flatten(cv, json_array_get(all, i), branches);
        path_pop(cv, was);
    }
    cv->depth--;
    return rc;
}

/* -1, 0, 1 as a < b, a == b, a > b (two JSON numbers; whole ones exactly). */
static int num_cmp(json_t *a, json_t *b)
{
    if (json_is_integer(a) && json_is_integer(b))
        return json_integer_value(a) < json_integer_value(b) ? -1 : json_integer_value(a) > json_integer_value(b);
    double x = json_number_value(a), y = json_number_value(b);
    return x < y ? -1 : x > y;
}

/* Values in both arrays a and b (a new array). */
static json_t *intersect_values(json_t *a, json_t *b)
{
    json_t *r = json_array();
    for (size_t i = 0; r && i < json_array_size(a); i++)
        for (size_t j = 0; j < json_array_size(b); j++)
            if (json_equal(json_array_get(a, i), json_array_get(b, j))) {
                if (json_array_append(r, json_array_get(a, i)) < 0)
                    json_decref(r), r = NULL;
                break;
            }
    return r;
}

/* The type set written as "type": a list of names ("number" standing for "integer" too). */
static json_t *type_json(int set)
{
    static const char *const names[] = {"null", "boolean", "object", "array", "string", "number", "integer"};
    json_t *a = json_array();
    for (int j = 0; a && j < 7; j++)
        if ((set & 1 << j) && !(j == 6 && (set & T_NUMBER)) && json_array_append_new(a, json_string(names[j])) < 0)
            json_decref(a), a = NULL;
    return a;
}

/* One keyword of a branch merged into m (the keywords that merge on their own). */
static int merge_keyword(conv *cv, json_t *m, const char *k, json_t *v, int *types)
{
    json_t *have = json_object_get(m, k);
    static const char *const lower[] = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", NULL};
    static const char *const upper[] = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", NULL};
    if (!strcmp(k, "type")) {
        int t = type_set(cv, v);
        if (t < 0)
            return t;
        int wide = *types | (*types & T_NUMBER ? T_INTEGER : 0), add = t | (t & T_NUMBER ? T_INTEGER : 0);
        *types = wide & add;
        return 0;
    }
    if (!strcmp(k, "required")) {
        if (!have)
            return jset(m, k, json_copy(v));
        for (size_t i = 0; i < json_array_size(v); i++)
            if (json_array_append(have, json_array_get(v, i)) < 0)
                return oom();
        return 0;
    }
    if (!strcmp(k, "enum") || !strcmp(k, "const")) {
        json_t *vals = !strcmp(k, "const") ? json_pack("[O]", v) : json_incref(v);
        json_t *prev = json_object_get(m, "enum");
        json_t *r = !vals ? NULL : prev ? intersect_values(prev, vals) : json_incref(vals);
        json_decref(vals);
        return jset(m, "enum", r);
    }
    for (int i = 0; lower[i] || upper[i]; i++)
        if ((lower[i] && !strcmp(k, lower[i])) || (upper[i] && !strcmp(k, upper[i]))) {
            if (!json_is_number(v))
                return fail(cv, "'%s' must be a number", k);
            int want = lower[i] && !strcmp(k, lower[i]) ? 1 : -1;
            return have && num_cmp(have, v) * want >= 0 ? 0 : jset(m, k, json_incref(v));
        }
    if (!strcmp(k, "anyOf") || !strcmp(k, "oneOf")) {
        json_t *prev = json_object_get(m, "anyOf"), *r = prev ? json_array() : json_copy(v);
        for (size_t i = 0; prev && r && i < json_array_size(prev); i++)
            for (size_t j = 0; r && j < json_array_size(v); j++)
                if (json_array_append_new(r, json_pack("{s[OO]}", "allOf", json_array_get(prev, i),
                                                       json_array_get(v, j))) < 0)
                    json_decref(r), r = NULL;
        if (json_array_size(r) > MAX_ALTS) {
            json_decref(r);
            return fail(cv, "anyOf/oneOf in allOf multiply out to over %d branches", MAX_ALTS);
        }
        IFLOW_TRY(step(cv, (long)json_array_size(r)));
        return jset(m, "anyOf", r);
    }
    if (have && !json_equal(have, v))
        return fail(cv, "two different '%s' in allOf are not supported", k);
    return have ? 0 : jset(m, k, json_incref(v));
}

/* The properties of the merged branches: each name with every branch's word on it. */
static int merge_properties(json_t *branches, json_t *m)
{
    json_t *props = json_object(), *addl = json_array();
    int any_props = 0, explicit = 0, forbid = 0, rc = props && addl ? 0 : oom();
    size_t i;
    json_t *b;
    json_array_foreach(branches, i, b) {
        json_t *p = json_object_get(b, "properties"), *a = json_object_get(b, "additionalProperties");
        const char *k;
        json_t *v;
        any_props |= p != NULL;
        json_object_foreach(p, k, v) {
            if (rc || json_object_get(props, k))
                continue;
            json_t *list = json_array();
            size_t j;
            json_t *c;
            json_array_foreach(branches, j, c) {
                json_t *cp = json_object_get(json_object_get(c, "properties"), k);
                json_t *ca = json_object_get(c, "additionalProperties");
                json_t *add = cp ? cp : ca && !is_any(ca) ? ca : NULL;
                if (list && add && json_array_append(list, add) < 0)
                    json_decref(list), list = NULL;
            }
            rc = list ? jset(props, k, all_of(list)) : oom();
            json_decref(list);
        }
        if (a && !rc) { /* other names must satisfy every additionalProperties said */
            explicit = 1;
            forbid |= json_is_false(a);
            if (!is_any(a) && !json_is_false(a))
                rc = jpush(addl, json_incref(a));
        }
    }
    if (!rc && any_props)
        rc = jset(m, "properties", json_incref(props));
    if (!rc && explicit)
        rc = jset(m, "additionalProperties", forbid ? json_false() : all_of(addl));
    json_decref(props);
    json_decref(addl);
    return rc;
}

/* items and prefixItems of the merged branches, position by position. */
static int merge_items(json_t *branches, json_t *m)
{
    size_t longest = 0, i;
    json_t *b, *items = json_array();
    if (!items)
        return oom();
    json_array_foreach(branches, i, b) {
        size_t n = json_array_size(json_object_get(b, "prefixItems"));
        longest = n > longest ? n : longest;
        json_t *it = json_object_get(b, "items");
        if (it && json_array_append(items, it) < 0)
            return json_decref(items), oom();
    }
    int rc = json_array_size(items) ? jset(m, "items", all_of(items)) : 0;
    json_decref(items);
    json_t *prefix = longest && !rc ? json_array() : NULL;
    if (longest && !rc && !prefix)
        return oom();
    for (size_t p = 0; p < longest && !rc; p++) {
        json_t *list = json_array();
        json_array_foreach(branches, i, b) {
            json_t *pi = json_object_get(b, "prefixItems");
            json_t *at = p < json_array_size(pi) ? json_array_get(pi, p) : json_object_get(b, "items");
            if (list && at && json_array_append(list, at) < 0)
                json_decref(list), list = NULL;
        }
        rc = list ? jpush(prefix, all_of(list)) : oom();
        json_decref(list);
    }
    if (prefix && !rc)
        rc = jset(m, "prefixItems", json_incref(prefix));
    json_decref(prefix);
    return rc;
}

/* The conjunction of flat schemas (no allOf, no $ref) as one schema (*out, a new reference). */
static int merge_all(conv *cv, json_t *branches, json_t **out)
{
    json_t *m = json_object();
    if (!(*out = m))
        return oom();
    int types = T_ALL, typed = 0, rc = 0;
    size_t i;
    json_t *b;
    json_array_foreach(branches, i, b) {
        const char *k;
        json_t *v;
        IFLOW_TRY(step(cv, (long)json_object_size(b)));
        json_object_foreach(b, k, v) {
            int later = !strcmp(k, "properties") || !strcmp(k, "additionalProperties") || !strcmp(k, "items") ||
                        !strcmp(k, "prefixItems") || !strcmp(k, "uniqueItems");
            typed |= !strcmp(k, "type");
            if (rc == 0 && !later && kw_class(k) == KW_HANDLED)
                rc = merge_keyword(cv, m, k, v, &types);
        }
    }
    if (rc == 0 && typed)
        rc = jset(m, "type", type_json(types));
    if (rc == 0)
        rc = merge_properties(branches, m);
    if (rc == 0)
        rc = merge_items(branches, m);
    return rc;
}

/* ---- the conversion -------------------------------------------------------------------------- */

static int conv_schema(conv *cv, json_t *s, char **out);

/* Alternatives joined: NULL for none (matches nothing), the one, or "( a | b )". */
typedef struct {
    sbuf b;
    int n;
} alts;

static void alt_add(alts *a, const char *e)
{
    if (a->n++)
        sb_puts(&a->b, " | ");
    sb_puts(&a->b, e);
}

static int alt_done(alts *a, char **out)
{
    *out = NULL;
    if (a->n == 0) {
        int rc = sb_err(&a->b);
        free(a->b.p);
        return rc;
    }
    if (a->n > 1) {
        sbuf w = {0};
        sb_puts(&w, "( ");
        sb_puts(&w, a->b.p);
        sb_puts(&w, " )");
        free(a->b.p);
        a->b = w;
    }
    return sb_take(&a->b, out);
}

/* x repeated min..max times (max < 0: no bound) after b; x must not match the empty text. */
static int put_repeat(conv *cv, sbuf *b, const char *x, long long min, long long max, const char *what)
{
    if (min > IFLOW_GRAMMAR_MAX_REPEAT || max > IFLOW_GRAMMAR_MAX_REPEAT)
        return fail(cv, "%s %lld is over the limit of %d", what, max > IFLOW_GRAMMAR_MAX_REPEAT ? max : min,
                    IFLOW_GRAMMAR_MAX_REPEAT);
    if (max == 0)
        return 0;
    sb_puts(b, x);
    if (min == 0 && max < 0)
        sb_puts(b, "*");
    else if (min == 1 && max < 0)
        sb_puts(b, "+");
    else if (max < 0)
        sb_printf(b, "{%lld,}", min);
    else if (min == 0 && max == 1)
        sb_puts(b, "?");
    else if (min == max)
        sb_printf(b, "{%lld}", min);
    else
        sb_printf(b, "{%lld,%lld}", min, max);
    return 0;
}

/* ---- enum and const ---- */

/* The grammar of one JSON value's text (whitespace allowed between the tokens of containers). */
static int value_literal(conv *cv, sbuf *b, json_t *v, int depth)
{
    if (depth > MAX_DEPTH)
        return fail(cv, "an enum value nested deeper than %d", MAX_DEPTH);
    IFLOW_TRY(step(cv, 1));
    char t[32];
    switch (json_typeof(v)) {
    case JSON_STRING:
        return literal_of_string(cv, b, json_string_value(v), json_string_length(v));
    case JSON_INTEGER:
        sb_printf(b, "\"%lld\"", (long long)json_integer_value(v));
        return 0;
    case JSON_REAL: {
        double d = json_real_value(v);
        int whole = d == floor(d) && fabs(d) < 1e16;
        if (whole)
            sb_printf(b, "( \"%.0f\" | ", d == 0 ? 0.0 : d);
        sb_puts(b, "\"");
        python_float(b, d);
        sb_puts(b, whole ? "\" )" : "\"");
        return 0;
    }
    case JSON_TRUE:
    case JSON_FALSE:
    case JSON_NULL:
        snprintf(t, sizeof t, "\"%s\"", json_is_true(v) ? "true" : json_is_false(v) ? "false" : "null");
        sb_puts(b, t);
        return 0;
    case JSON_ARRAY: {
        cv->helpers |= H_WS;
        sb_puts(b, "\"[\" ws");
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            sb_puts(b, i ? " \",\" ws " : " ");
            IFLOW_TRY(value_literal(cv, b, x, depth + 1));
            sb_puts(b, " ws");
        }
        sb_puts(b, " \"]\"");
        return 0;
    }
    case JSON_OBJECT: {
        cv->helpers |= H_WS;
        sb_puts(b, "\"{\" ws");
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach(v, k, x) {
            sb_puts(b, first ? " " : " \",\" ws ");
            first = 0;
            IFLOW_TRY(literal_of_string(cv, b, k, strlen(k)));
            sb_puts(b, " ws \":\" ws ");
            IFLOW_TRY(value_literal(cv, b, x, depth + 1));
            sb_puts(b, " ws");
        }
        sb_puts(b, " \"}\"");
        return 0;
    }
    }
    return 0;
}

/* 1 if value v has one of the types in set (a whole real counts as an integer, as in Python). */
static int value_has_type(json_t *v, int set)
{
    switch (json_typeof(v)) {
    case JSON_NULL: return (set & T_NULL) != 0;
    case JSON_TRUE:
    case JSON_FALSE: return (set & T_BOOL) != 0;
    case JSON_OBJECT: return (set & T_OBJECT) != 0;
    case JSON_ARRAY: return (set & T_ARRAY) != 0;
    case JSON_STRING: return (set & T_STRING) != 0;
    case JSON_INTEGER: return (set & (T_NUMBER | T_INTEGER)) != 0;
    case JSON_REAL:
        return (set & T_NUMBER) || ((set & T_INTEGER) && json_real_value(v) == floor(json_real_value(v)));
    }
    return 0;
}

static int conv_enum(conv *cv, json_t *s, char **out)
{
    json_t *e = json_object_get(s, "enum"), *c = json_object_get(s, "const"), *t = json_object_get(s, "type");
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        int other = kw_class(k) == KW_HANDLED && strcmp(k, "enum") && strcmp(k, "const") && strcmp(k, "type") &&
                    strcmp(k, "uniqueItems");
        if (other)
            return fail(cv, "'%s' together with '%s' is not supported", e ? "enum" : "const", k);
    }
    int set = t ? type_set(cv, t) : T_ALL;
    if (set < 0)
        return set;
    alts a = {0};
    for (size_t i = 0; i < (e ? json_array_size(e) : 1); i++) {
        json_t *v = e ? json_array_get(e, i) : c;
        if ((c && e && !json_equal(v, c)) || !value_has_type(v, set))
            continue;
        sbuf one = {0};
        int rc = value_literal(cv, &one, v, 0);
        if (rc == 0 && !one.bad)
            alt_add(&a, one.p);
        rc = rc ? rc : sb_err(&one);
        free(one.p);
        if (rc) {
            free(a.b.p);
            return rc;
        }
    }
    return alt_done(&a, out);
}

/* ---- numbers ---- */

/* Digits of x, most significant first, in t [24]; the count. */
static int digits_of(uint64_t x, char *t) { return snprintf(t, 24, "%llu", (unsigned long long)x); }

/* One alternative: the digits pre [np] as a literal, then class (may be "") and `rest` digits. */
static void digit_alt(alts *a, const char *pre, int np, const char *cls, int rest)
{
    sbuf q = {0};
    if (np)
        sb_printf(&q, "\"%.*s\"", np, pre);
    if (*cls)
        sb_puts(&q, np ? " " : ""), sb_puts(&q, cls);
    if (rest == 1)
        sb_puts(&q, " [0-9]");
    else if (rest > 1)
        sb_printf(&q, " [0-9]{%d}", rest);
    alt_add(a, q.p ? q.p : "");
    if (q.bad)
        a->b.bad = q.bad;
    free(q.p);
}

/* Digit strings from x to y (x <= y), both n digits long after the np digits of pre [24], as
 * alternatives appended to a. */
static void digit_range(alts *a, char *pre, int np, const char *x, const char *y, int n)
{
    int i = 0;
    while (i < n && x[i] == y[i])
        pre[np++] = x[i++];
    if (i == n) {
        digit_alt(a, pre, np, "", 0);
        return;
    }
    int rest = n - i - 1, lo = x[i], hi = y[i];
    int x_zeros = (int)strspn(x + i + 1, "0") >= rest, y_nines = (int)strspn(y + i + 1, "9") >= rest;
    char nines[24], zeros[24], cls[8];
    memset(nines, '9', (size_t)rest);
    memset(zeros, '0', (size_t)rest);
    nines[rest] = zeros[rest] = 0;
    if (!x_zeros) {
        pre[np] = (char)lo++;
        digit_range(a, pre, np + 1, x + i + 1, nines, rest);
    }
    int top = y_nines ? hi : hi - 1;
    if (lo == top) {
        pre[np] = (char)lo;
        digit_alt(a, pre, np + 1, "", rest);
    } else if (lo < top) {
        snprintf(cls, sizeof cls, "[%c-%c]", lo, top);
        digit_alt(a, pre, np, cls, rest);
    }
    if (!y_nines) {
        pre[np] = (char)hi;
        digit_range(a, pre, np + 1, zeros, y + i + 1, rest);
    }
}

/* Whole numbers lo..hi written without leading zeros (hi_inf: no upper bound), as alternatives. */
static void nat_range(alts *a, uint64_t lo, uint64_t hi, int hi_inf)
{
    char x[24], y[24];
    int nl = digits_of(lo, x), nh = hi_inf ? nl : digits_of(hi, y);
    int full_from = 0; /* lengths full_from..len-1 hold every number of their length (0: none yet) */
    for (int len = nl; len <= nh + 1; len++) {
        char from[24], to[24];
        if (len == nl)
            memcpy(from, x, sizeof x);
        else
            from[0] = '1', memset(from + 1, '0', (size_t)len - 1), from[len] = 0;
        if (len == nh && !hi_inf)
            memcpy(to, y, sizeof y);
        else
            memset(to, '9', (size_t)len), to[len] = 0;
        int full = len <= nh && from[0] == '1' && (int)strspn(from + 1, "0") == len - 1 && (int)strspn(to, "9") == len;
        if (full && !full_from)
            full_from = len;
        if (full)
            continue;
        if (full_from) { /* [1-9] [0-9]{full_from-1, len-2} */
            sbuf q = {0};
            int m = full_from - 1, M = len - 2;
            sb_puts(&q, "[1-9]");
            if (M == 1 && m == 1)
                sb_puts(&q, " [0-9]");
            else if (M == m && M > 0)
                sb_printf(&q, " [0-9]{%d}", M);
            else if (M > m)
                sb_printf(&q, " [0-9]{%d,%d}", m, M);
            alt_add(a, q.p ? q.p : "");
            if (q.bad)
                a->b.bad = q.bad;
            free(q.p);
            full_from = 0;
        }
        char pre[24];
        if (len <= nh)
            digit_range(a, pre, 0, from, to, len);
    }
    if (hi_inf) {
        sbuf q = {0};
        sb_printf(&q, "[1-9] [0-9]{%d,}", nl);
        alt_add(a, q.p ? q.p : "");
        if (q.bad)
            a->b.bad = q.bad;
        free(q.p);
    }
}

/* Integers lo..hi (each bound optional) as alternatives. */
static void int_range(alts *a, long long lo, int has_lo, long long hi, int has_hi)
{
    if (!has_lo || lo < 0) { /* negative: magnitudes max(1, -hi)..-lo */
        uint64_t mlo = has_hi && hi < 0 ? (uint64_t)(-(hi + 1)) + 1 : 1;
        uint64_t mhi = has_lo ? (uint64_t)(-(lo + 1)) + 1 : 0;
        alts neg = {0};
        nat_range(&neg, mlo, mhi, !has_lo);
        char *e = NULL;
        if (alt_done(&neg, &e) == 0 && e) {
            sbuf q = {0};
            sb_puts(&q, "\"-\" ");
            sb_puts(&q, e);
            alt_add(a, q.p ? q.p : "");
            free(q.p);
        } else
            a->b.bad = a->b.bad ? a->b.bad : IFLOW_ENOMEM;
        free(e);
    }
    if (!has_hi || hi >= 0)
        nat_range(a, has_lo && lo > 0 ? (uint64_t)lo : 0, has_hi ? (uint64_t)hi : 0, !has_hi);
}

/* A bound read from s: 1 and *v when present, 0 when absent, < 0 when it is not a number. */
static int get_bound(conv *cv, json_t *s, const char *key, json_t **v)
{
    *v = json_object_get(s, key);
    if (!*v)
        return 0;
    return json_is_number(*v) ? 1 : fail(cv, "'%s' must be a number", key);
}

/* The integer bounds (inclusive) of s; *empty when no integer satisfies them. */
static int integer_bounds(conv *cv, json_t *s, long long *lo, int *has_lo, long long *hi, int *has_hi)
{
    static const char *const keys[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    *has_lo = *has_hi = 0;
    for (int i = 0; i < 4; i++) {
        json_t *v;
        int rc = get_bound(cv, s, keys[i], &v);
        if (rc <= 0) {
            if (rc < 0)
                return rc;
            continue;
        }
        double d = json_number_value(v);
        if (fabs(d) > MAX_INT)
            return fail(cv, "'%s' %g is out of range (at most %g in magnitude)", keys[i], d, MAX_INT);
        long long x = json_is_integer(v) ? json_integer_value(v) : 0;
        if (i < 2) {
            if (json_is_real(v))
                x = i == 0 ? (long long)ceil(d) : (long long)floor(d) + 1;
            else if (i == 1)
                x++;
            if (!*has_lo || x > *lo)
                *lo = x, *has_lo = 1;
        } else {
            if (json_is_real(v))
                x = i == 2 ? (long long)floor(d) : (long long)ceil(d) - 1;
            else if (i == 3)
                x--;
            if (!*has_hi || x < *hi)
                *hi = x, *has_hi = 1;
        }
    }
    return 0;
}

static int conv_integer(conv *cv, json_t *s, char **out)
{
    long long lo = 0, hi = 0;
    int has_lo, has_hi;
    IFLOW_TRY(integer_bounds(cv, s, &lo, &has_lo, &hi, &has_hi));
    *out = NULL;
    if (!has_lo && !has_hi)
        return (*out = helper(cv, H_INTEGER, "integer")) ? 0 : oom();
    if (has_lo && has_hi && lo > hi)
        return 0;
    alts a = {0};
    int_range(&a, lo, has_lo, hi, has_hi);
    if ((!has_lo || lo <= 0) && (!has_hi || hi >= 0))
        alt_add(&a, "\"-0\""); /* 0 too */
    return alt_done(&a, out);
}

/* What may follow the whole part I of a bounded number (no exponent). */
enum { F_NONE, F_ANY, F_ZERO, F_LIM, F_NZ, F_NZ_FREE };
typedef struct {
    int kind, k; /* F_LIM, F_NZ: at most k significant fraction digits */
} frac;

static frac frac_and(frac a, frac b)
{
    if (a.kind == F_ANY)
        return b;
    if (b.kind == F_ANY)
        return a;
    if (a.kind == F_NONE || b.kind == F_NONE)
        return (frac){F_NONE, 0};
    int nz = a.kind == F_NZ || a.kind == F_NZ_FREE || b.kind == F_NZ || b.kind == F_NZ_FREE;
    int zero = a.kind == F_ZERO || b.kind == F_ZERO;
    if (nz && zero)
        return (frac){F_NONE, 0};
    if (zero)
        return (frac){F_ZERO, 0};
    int ka = a.kind == F_NZ_FREE ? 1 << 30 : a.k, kb = b.kind == F_NZ_FREE ? 1 << 30 : b.k;
    int k = ka < kb ? ka : kb;
    if (nz && k < 1)
        return (frac){F_NONE, 0};
    return (frac){nz ? (k >= 1 << 30 ? F_NZ_FREE : F_NZ) : F_LIM, k};
}

static void put_frac(sbuf *b, frac f)
{
    if (f.kind == F_ANY)
        sb_puts(b, " ( \".\" [0-9]+ )?");
    else if (f.kind == F_ZERO || (f.kind == F_LIM && f.k <= 0))
        sb_puts(b, " ( \".\" \"0\"+ )?");
    else if (f.kind == F_LIM)
        sb_printf(b, " ( \".\" [0-9]{1,%d} \"0\"* )?", f.k);
    else if (f.kind == F_NZ && f.k > 1)
        sb_printf(b, " \".\" [0-9]{0,%d} [1-9] \"0\"*", f.k - 1);
    else if (f.kind == F_NZ)
        sb_puts(b, " \".\" [1-9] \"0\"*");
    else
        sb_puts(b, " \".\" \"0\"* [1-9] [0-9]*");
}

/* One row: whole parts lo..hi (hi_inf: no bound) followed by fraction f, as an alternative. */
static void number_row(alts *a, const char *sign, uint64_t lo, uint64_t hi, int hi_inf, frac f)
{
    if (f.kind == F_NONE || (!hi_inf && hi < lo))
        return;
    alts whole = {0};
    nat_range(&whole, lo, hi, hi_inf);
    char *e = NULL;
    if (alt_done(&whole, &e) < 0 || !e) {
        a->b.bad = a->b.bad ? a->b.bad : IFLOW_ENOMEM;
        return;
    }
    sbuf q = {0};
    sb_puts(&q, sign);
    sb_puts(&q, e);
    put_frac(&q, f);
    free(e);
    alt_add(a, q.p ? q.p : "");
    if (q.bad)
        a->b.bad = q.bad;
    free(q.p);
}

/* Magnitudes m (the text after the sign) with m > lo or m >= lo, m < hi or m <= hi (hi_inf: none). */
static void magnitude_rows(alts *a, const char *sign, uint64_t lo, frac lo_f, uint64_t hi, int hi_excl, int hi_inf)
{
    uint64_t top = hi;
    frac top_f = {F_ANY, 0};
    if (!hi_inf && hi_excl) {
        char t[24];
        if (hi == 0)
            return;
        top = hi - 1;
        top_f = (frac){F_LIM, 15 - digits_of(hi, t)};
    } else if (!hi_inf)
        top_f = (frac){F_ZERO, 0};
    if (!hi_inf && top < lo)
        return;
    if (!hi_inf && top == lo) {
        number_row(a, sign, lo, lo, 0, frac_and(lo_f, top_f));
        return;
    }
    uint64_t mid_lo = lo;
    if (lo_f.kind != F_ANY) {
        number_row(a, sign, lo, lo, 0, lo_f);
        mid_lo = lo + 1;
    }
    if (hi_inf) {
        number_row(a, sign, mid_lo, 0, 1, (frac){F_ANY, 0});
        return;
    }
    if (top_f.kind == F_ANY) {
        number_row(a, sign, mid_lo, top, 0, top_f);
        return;
    }
    if (top > mid_lo)
        number_row(a, sign, mid_lo, top - 1, 0, (frac){F_ANY, 0});
    number_row(a, sign, top, top, 0, top_f);
}

/* A whole-number bound on a number: 1 when present (*v, *excl), 0 when absent, < 0 when not usable. */
static int number_bound(conv *cv, json_t *s, const char *incl_key, const char *excl_key, int lower, double *v,
                        int *excl)
{
    int have = 0;
    for (int i = 0; i < 2; i++) {
        json_t *x;
        const char *key = i ? excl_key : incl_key;
        int rc = get_bound(cv, s, key, &x);
        if (rc < 0)
            return rc;
        if (!rc)
            continue;
        double d = json_number_value(x);
        if (d != floor(d) || fabs(d) > MAX_NUM_BOUND)
            return fail(cv, "'%s' %g on a number is not supported (only whole bounds up to %g)", key, d,
                        MAX_NUM_BOUND);
        int tighter = !have || (lower ? d > *v || (d == *v && i) : d < *v || (d == *v && i));
        if (tighter)
            *v = d, *excl = i, have = 1;
    }
    return have;
}

static int conv_number(conv *cv, json_t *s, char **out)
{
    double lo = 0, hi = 0;
    int lo_x = 0, hi_x = 0;
    int has_lo = number_bound(cv, s, "minimum", "exclusiveMinimum", 1, &lo, &lo_x);
    if (has_lo < 0)
        return has_lo;
    int has_hi = number_bound(cv, s, "maximum", "exclusiveMaximum", 0, &hi, &hi_x);
    if (has_hi < 0)
        return has_hi;
    *out = NULL;
    if (!has_lo && !has_hi)
        return (*out = helper(cv, H_NUMBER, "number")) ? 0 : oom();
    alts a = {0};
    char t[24];
    if (!has_lo || lo < 0) { /* "-" m with m > 0: m >= -hi / m > -hi when hi <= 0 */
        frac lo_f = {F_NZ_FREE, 0};
        uint64_t mlo = 0;
        if (has_hi && hi <= 0) {
            mlo = (uint64_t)-hi;
            lo_f = hi_x ? (frac){F_NZ, 15 - (hi == 0 ? 0 : digits_of(mlo, t))} : (frac){F_ANY, 0};
            if (!hi_x && mlo == 0)
                lo_f = (frac){F_NZ_FREE, 0};
        }
        magnitude_rows(&a, "\"-\" ", mlo, lo_f, has_lo ? (uint64_t)-lo : 0, lo_x, !has_lo);
    }
    if (!has_hi || hi > 0 || (hi == 0 && !hi_x)) { /* m >= 0 */
        uint64_t mlo = has_lo && lo > 0 ? (uint64_t)lo : 0;
        frac lo_f = has_lo && lo >= 0 && lo_x ? (frac){F_NZ, 15 - (lo == 0 ? 0 : digits_of(mlo, t))}
                                              : (frac){F_ANY, 0};
        magnitude_rows(&a, "", mlo, lo_f, has_hi ? (uint64_t)hi : 0, hi_x, !has_hi);
    }
    if ((!has_lo || lo < 0 || (lo == 0 && !lo_x)) && (!has_hi || hi > 0 || (hi == 0 && !hi_x)))
        alt_add(&a, "\"-0\" ( \".\" \"0\"+ )?"); /* 0 too */
    return alt_done(&a, out);
}

/* ---- strings ---- */

/* Shortest and longest text of a known format (-1 for an unknown one) and its rule. */
static int format_info(const char *f, int *min, int *max, unsigned *h, const char **rule)
{
    static const struct {
        const char *name, *rule;
        int min, max;
        unsigned h;
    } known[] = {{"date", "fmt-date", 10, 10, H_DATE},
                 {"time", "fmt-time", 9, 24, H_TIME},
                 {"date-time", "fmt-date-time", 20, 35, H_DATETIME},
                 {"uuid", "fmt-uuid", 36, 36, H_UUID}};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (!strcmp(f, known[i].name)) {
            *min = known[i].min, *max = known[i].max, *h = known[i].h, *rule = known[i].rule;
            return 0;
        }
    return -1;
}

static int conv_pattern(conv *cv, const char *re, size_t n, char **out);

static int conv_string(conv *cv, json_t *s, char **out)
{
    long long min = 0, max = -1;
    int rc = get_count(cv, s, "minLength", &min);
    if (rc >= 0)
        rc = get_count(cv, s, "maxLength", &max);
    if (rc < 0)
        return rc;
    *out = NULL;
    if (max >= 0 && min > max)
        return 0;
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    int fmin, fmax;
    unsigned h;
    const char *rule;
    if (fmt && format_info(json_string_value(fmt), &fmin, &fmax, &h, &rule) == 0) {
        if (pat)
            return fail(cv, "'format' together with 'pattern' is not supported");
        if (min > fmin || (max >= 0 && max < fmax))
            return fail(cv, "'format' '%s' together with 'minLength'/'maxLength' is not supported",
                        json_string_value(fmt));
        sbuf b = {0};
        sb_printf(&b, "\"\\\"\" %s \"\\\"\"", rule);
        cv->helpers |= h;
        return sb_take(&b, out);
    }
    if (pat) {
        if (min > 0 || max >= 0)
            return fail(cv, "'pattern' together with 'minLength'/'maxLength' is not supported");
        return conv_pattern(cv, json_string_value(pat), json_string_length(pat), out);
    }
    if (min == 0 && max < 0)
        return (*out = helper(cv, H_STRING, "string")) ? 0 : oom();
    sbuf b = {0};
    cv->helpers |= H_CHAR;
    sb_puts(&b, "\"\\\"\" ");
    rc = put_repeat(cv, &b, "char", min, max, min > IFLOW_GRAMMAR_MAX_REPEAT ? "minLength" : "maxLength");
    sb_puts(&b, " \"\\\"\"");
    if (rc) {
        free(b.p);
        return rc;
    }
    return sb_take(&b, out);
}

/* ---- patterns: the regex's grammar with each character written as JSON writes it ---- */

typedef struct {
    uint32_t lo, hi;
} cprange;

static int cmp_cprange(const void *a, const void *b)
{
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Read one GBNF character (raw UTF-8 or an escape) at *s; UINT32_MAX when bad. */
static uint32_t gbnf_char(const char **s, const char *end)
{
    const char *p = *s;
    if (*p != '\\') {
        size_t i = 0;
        uint32_t cp = utf8_next(p, (size_t)(end - p), &i);
        *s = p + i;
        return cp;
    }
    if (end - p < 2)
        return UINT32_MAX;
    char c = p[1];
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (!digits) {
        *s = p + 2;
        return c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : strchr("\\\"'[]-/^", c) ? (uint32_t)c
                                                                                              : UINT32_MAX;
    }
    if (end - p < 2 + digits)
        return UINT32_MAX;
    uint32_t cp = 0;
    for (int i = 0; i < digits; i++) {
        int h = hexval(p[2 + i]);
        if (h < 0)
            return UINT32_MAX;
        cp = cp * 16 + (uint32_t)h;
    }
    *s = p + 2 + digits;
    return cp <= 0x10FFFF ? cp : UINT32_MAX;
}

/* A class's code points, sorted and merged (complemented when negate); *n of them. */
static int class_ranges(const char **s, const char *end, cprange **out, int *n)
{
    const char *p = *s + 1;
    int negate = p < end && *p == '^', cap = 0, m = 0;
    cprange *rg = NULL;
    p += negate;
    while (p < end && *p != ']') {
        uint32_t lo = gbnf_char(&p, end), hi = lo;
        if (p + 1 < end && *p == '-' && p[1] != ']') {
            p++;
            hi = gbnf_char(&p, end);
        }
        if (lo == UINT32_MAX || hi == UINT32_MAX || hi < lo || grow((void **)&rg, &cap, m + 2, sizeof *rg) < 0) {
            free(rg);
            return -1;
        }
        rg[m++] = (cprange){lo, hi};
    }
    if (p >= end) {
        free(rg);
        return -1;
    }
    *s = p + 1;
    if (m)
        qsort(rg, (size_t)m, sizeof *rg, cmp_cprange);
    int k = 0;
    for (int i = 0; i < m; i++)
        if (k && rg[i].lo <= rg[k - 1].hi + 1)
            rg[k - 1].hi = rg[i].hi > rg[k - 1].hi ? rg[i].hi : rg[k - 1].hi;
        else
            rg[k++] = rg[i];
    if (negate) {
        cprange *c = malloc(sizeof *c * (size_t)(k + 1));
        int j = 0;
        uint32_t next = 0;
        for (int i = 0; c && i < k; i++) {
            if (rg[i].lo > next)
                c[j++] = (cprange){next, rg[i].lo - 1};
            next = rg[i].hi + 1;
        }
        if (c && next <= 0x10FFFF)
            c[j++] = (cprange){next, 0x10FFFF};
        free(rg);
        if (!c)
            return -1;
        rg = c, k = j;
    }
    int m2 = 0; /* no range may start or end on a surrogate (GBNF cannot name one) */
    for (int i = 0; i < k; i++) {
        uint32_t lo = rg[i].lo >= 0xD800 && rg[i].lo <= 0xDFFF ? 0xE000 : rg[i].lo;
        uint32_t hi = rg[i].hi >= 0xD800 && rg[i].hi <= 0xDFFF ? 0xD7FF : rg[i].hi;
        if (lo <= hi)
            rg[m2++] = (cprange){lo, hi};
    }
    *out = rg;
    *n = m2;
    return 0;
}

/* The escapes JSON writes for the code points in `need` (bit c for U+00c, bit 32 for '"', bit 33
 * for '\'), as one alternative: "\\" then the letter, or u00 and two hex digits. */
static void alt_escapes(alts *a, uint64_t need)
{
    static const char letter[] = "\0\0\0\0\0\0\0\0btn\0fr"; /* 0x08..0x0D */
    sbuf b = {0}, shorts = {0}, longs = {0};
    int n_long = 0;
    for (int c = 0; c < 34; c++) {
        if (!(need >> c & 1))
            continue;
        if (c == 32 || c == 33)
            sb_puts(&shorts, c == 32 ? "\\x22" : "\\x5C");
        else if (c < 14 && letter[c])
            sb_putn(&shorts, &letter[c], 1);
        else
            sb_printf(&longs, "%s\"%02x\"", n_long++ ? " | " : "", c);
    }
    uint32_t all_long = 0xFFFFC0FFu & ~(1u << 12 | 1u << 13 | 1u << 8 | 1u << 9 | 1u << 10); /* no b t n f r */
    if (((uint32_t)need & all_long) == all_long) { /* every control: the hex digits as classes */
        free(longs.p);
        memset(&longs, 0, sizeof longs);
        sb_puts(&longs, "\"0\" [0-7bef] | \"1\" [0-9a-f]");
        n_long = 2;
    }
    sb_puts(&b, "\"\\\\\" ");
    if (shorts.n && n_long)
        sb_puts(&b, "( ");
    if (shorts.n)
        sb_printf(&b, "[%s]", shorts.p);
    if (shorts.n && n_long)
        sb_puts(&b, " | ");
    if (n_long)
        sb_puts(&b, "\"u00\" ( "), sb_putn(&b, longs.p, longs.n), sb_puts(&b, " )");
    if (shorts.n && n_long)
        sb_puts(&b, " )");
    alt_add(a, b.p ? b.p : "");
    if (b.bad || shorts.bad || longs.bad)
        a->b.bad = IFLOW_ENOMEM;
    free(b.p);
    free(shorts.p);
    free(longs.p);
}

static void put_cprange(sbuf *b, uint32_t lo, uint32_t hi)
{
    gbnf_cp(b, lo, 1);
    if (hi > lo) {
        sb_putn(b, "-", 1);
        gbnf_cp(b, hi, 1);
    }
}

/* A class of code points rewritten: those JSON writes as they are stay a class; '"', '\' and the
 * controls become their escapes. */
static int rewrite_class(sbuf *b, const char **s, const char *end)
{
    static const uint32_t special[2] = {'"', '\\'};
    cprange *rg = NULL;
    int n = 0;
    if (class_ranges(s, end, &rg, &n) < 0 || n == 0) {
        free(rg);
        return -1;
    }
    alts a = {0};
    sbuf plain = {0};
    uint64_t need = 0;
    for (int i = 0; i < n; i++) {
        uint32_t lo = rg[i].lo, hi = rg[i].hi;
        for (uint32_t c = lo; c <= hi && c < 0x20; c++)
            need |= 1ull << c;
        lo = lo < 0x20 ? 0x20 : lo;
        for (int j = 0; j < 2 && lo <= hi; j++) {
            if (special[j] < lo || special[j] > hi)
                continue;
            need |= 1ull << (32 + j);
            if (lo < special[j])
                put_cprange(&plain, lo, special[j] - 1);
            lo = special[j] + 1;
        }
        if (lo <= hi)
            put_cprange(&plain, lo, hi);
    }
    free(rg);
    if (need)
        alt_escapes(&a, need);
    if (plain.n) {
        sbuf c = {0};
        sb_puts(&c, "[");
        sb_putn(&c, plain.p, plain.n);
        sb_puts(&c, "]");
        alt_add(&a, c.p ? c.p : "");
        if (c.bad)
            a.b.bad = c.bad;
        free(c.p);
    }
    int bad = plain.bad;
    free(plain.p);
    char *e = NULL;
    if (bad) {
        free(a.b.p);
        return -1;
    }
    if (alt_done(&a, &e) < 0 || !e)
        return -1;
    sb_puts(b, e);
    free(e);
    return 0;
}

/* A literal rewritten: its characters as JSON writes them. */
static int rewrite_literal(sbuf *b, const char **s, const char *end)
{
    const char *p = *s + 1;
    sbuf json = {0};
    while (p < end && *p != '"') {
        uint32_t cp = gbnf_char(&p, end);
        if (cp == UINT32_MAX) {
            free(json.p);
            return -1;
        }
        json_cp(&json, cp);
    }
    if (p >= end) {
        free(json.p);
        return -1;
    }
    *s = p + 1;
    int rc = gbnf_literal(b, json.p ? json.p : "", json.n);
    rc = rc || json.bad ? -1 : 0;
    free(json.p);
    return rc;
}

/* The regex's GBNF with every terminal rewritten so that it matches the JSON text of what it matched. */
static int rewrite_regex_grammar(conv *cv, const char *g, sbuf *b)
{
    const char *s = g, *end = g + strlen(g);
    while (s < end) {
        int rc = 0;
        if (*s == '#') {
            while (s < end && *s != '\n')
                s++;
        } else if (*s == '"') {
            rc = rewrite_literal(b, &s, end);
        } else if (*s == '[') {
            rc = rewrite_class(b, &s, end);
        } else if (*s == '.') {
            cv->helpers |= H_CHAR;
            sb_puts(b, "char");
            s++;
        } else {
            sb_putn(b, s, 1);
            s++;
        }
        if (rc < 0)
            return b->bad ? sb_err(b)
                          : fail(cv, "cannot read the grammar of 'pattern' (near byte %zu)", (size_t)(s - g));
    }
    sb_puts(b, "\n");
    return sb_err(b);
}

static int conv_pattern(conv *cv, const char *re, size_t n, char **out)
{
    int start = n > 0 && re[0] == '^';
    size_t bs = 0;
    while (bs + 1 < n && re[n - 2 - bs] == '\\')
        bs++;
    int end = n > (size_t)start && re[n - 1] == '$' && bs % 2 == 0;
    char name[32];
    snprintf(name, sizeof name, "pattern%d", ++cv->n_patterns);
    char *g = NULL;
    int rc = iflow_grammar_from_regex(re + start, n - (size_t)start - (size_t)end, name, &g);
    if (rc < 0) {
        free(g);
        return iflow_preperr(rc, "json schema: 'pattern' at %s",
                             cv->path.n ? iflow_quoten(cv->path.p, cv->path.n) : "the root");
    }
    rc = rewrite_regex_grammar(cv, g, &cv->more);
    free(g);
    if (rc < 0)
        return rc;
    sbuf b = {0};
    if (!start || !end)
        cv->helpers |= H_CHAR;
    sb_printf(&b, "\"\\\"\" %s%s%s \"\\\"\"", start ? "" : "char* ", name, end ? "" : " char*");
    return sb_take(&b, out);
}

/* ---- objects ---- */

typedef struct {
    const char *name;
    json_t *schema;
    int required;
    char *text; /* the member: key, colon, value, whitespace after */
} member;

/* Sorted names (as byte strings) for the key trie. */
static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Keys of unescaped characters other than names [lo, hi) with the common prefix of `depth` bytes
 * (sorted): a rule's name (or the expression) in *out. */
static int key_rule(conv *cv, const char **names, int lo, int hi, size_t depth, const char *hint, char **out)
{
    IFLOW_TRY(step(cv, 1));
    if (depth > 256)
        return fail(cv, "a property name over 256 bytes with additionalProperties is not supported");
    int children = 0;
    for (int i = lo; i < hi; i++)
        children |= strlen(names[i]) > depth;
    if (!children) { /* a whole name: one more character at least */
        cv->helpers |= H_KEYCHAR;
        return (*out = strdup("keychar+")) ? 0 : oom();
    }
    int terminal = 0;
    alts a = {0};
    sbuf except = {0};
    sb_puts(&except, "[^\\x22\\x5C\\x00-\\x1F");
    int rc = 0;
    for (int i = lo; i < hi && rc == 0;) {
        if (strlen(names[i]) == depth) {
            terminal = 1, i++;
            continue;
        }
        size_t at = depth;
        uint32_t cp = utf8_next(names[i], strlen(names[i]), &at);
        int j = i + 1;
        while (j < hi && strlen(names[j]) >= at && !memcmp(names[j] + depth, names[i] + depth, at - depth))
            j++;
        gbnf_cp(&except, cp, 1);
        char *sub = NULL;
        rc = key_rule(cv, names, i, j, at, hint, &sub);
        sbuf one = {0};
        sb_puts(&one, "\"");
        gbnf_cp(&one, cp, 0);
        sb_puts(&one, "\" ");
        sb_puts(&one, sub ? sub : "");
        alt_add(&a, one.p ? one.p : "");
        if (one.bad)
            a.b.bad = one.bad;
        free(one.p), free(sub);
        i = j;
    }
    sb_puts(&except, "] keychar*");
    cv->helpers |= H_KEYCHAR;
    alt_add(&a, except.p ? except.p : "");
    if (except.bad)
        a.b.bad = except.bad;
    free(except.p);
    if (!terminal)
        alt_add(&a, "\"\"");
    char *body = NULL;
    if (rc == 0)
        rc = alt_done(&a, &body);
    else
        free(a.b.p);
    if (rc == 0)
        rc = make_rule(cv, hint, body, out);
    free(body);
    return rc;
}

/* The key of an additional property: unescaped characters, none of the listed names. */
static int extra_key(conv *cv, member *m, int n, const char *hint, char **out)
{
    const char **names = malloc(sizeof *names * (size_t)(n + 1));
    if (!names)
        return oom();
    int k = 0;
    for (int i = 0; i < n; i++) {
        int plain = 1; /* a name JSON must escape is never a plain key */
        for (const unsigned char *c = (const unsigned char *)m[i].name; *c; c++)
            plain &= *c >= 0x20 && *c != '"' && *c != '\\';
        if (plain)
            names[k++] = m[i].name;
    }
    int rc;
    if (k == 0) {
        cv->helpers |= H_KEYCHAR;
        rc = (*out = strdup("keychar*")) ? 0 : oom();
    } else {
        qsort(names, (size_t)k, sizeof *names, cmp_str);
        char h[80];
        snprintf(h, sizeof h, "%s-key", hint);
        rc = key_rule(cv, names, 0, k, 0, h, out);
    }
    free(names);
    return rc;
}

/* A property's value: the schema's expression, made a rule of its own when long. */
static int member_value(conv *cv, json_t *schema, const char *hint, char **out)
{
    IFLOW_TRY(conv_schema(cv, schema, out));
    if (!*out || strlen(*out) <= INLINE_MAX)
        return 0;
    char *name = NULL;
    int rc = make_rule(cv, hint, *out, &name);
    free(*out);
    *out = name;
    return rc;
}

/* One member's text: key, colon, value, the whitespace after it. */
static int member_text(const char *key_expr, const char *value, char **out)
{
    sbuf b = {0};
    sb_puts(&b, key_expr);
    sb_puts(&b, " ws \":\" ws ");
    sb_puts(&b, value);
    sb_puts(&b, " ws");
    return sb_take(&b, out);
}

/* Members [from, n) after one already written, then the additional ones (extra may be NULL). */
static void members_after(sbuf *b, member *m, int from, int n, const char *extra)
{
    for (int j = from; j < n; j++) {
        sb_puts(b, m[j].required ? " \",\" ws " : " ( \",\" ws ");
        sb_puts(b, m[j].text);
        if (!m[j].required)
            sb_puts(b, " )?");
    }
    if (extra) {
        sb_puts(b, " ( \",\" ws ");
        sb_puts(b, extra);
        sb_puts(b, " )*");
    }
}

/* The members of an object in order: the required ones, the optional ones or not, then the
 * additional ones; "{" ws ... "}" in *out. */
static int object_body(conv *cv, member *m, int n, const char *extra, const char *hint, char **out)
{
    int k = 0;
    while (k < n && !m[k].required)
        k++;
    sbuf b = {0};
    sb_puts(&b, "\"{\" ws ");
    if (k == 0 && n > 0) { /* the first member is required: a plain sequence */
        sb_puts(&b, m[0].text);
        members_after(&b, m, 1, n, extra);
        sb_puts(&b, " \"}\"");
        return sb_take(&b, out);
    }
    /* leading optional members: rest[j] ::= what may follow once member j-1 was written */
    int upto = k < n ? k : n, rc = 0;
    char **rest = calloc((size_t)upto + 2, sizeof *rest);
    if (!rest)
        return free(b.p), oom();
    for (int j = upto; j >= 1 && rc == 0; j--) {
        sbuf r = {0};
        if (j == n) {
            members_after(&r, m, n, n, extra);
        } else if (j == k) { /* member k is required */
            sb_puts(&r, "\",\" ws ");
            sb_puts(&r, m[k].text);
            members_after(&r, m, k + 1, n, extra);
        } else {
            sb_puts(&r, "( \",\" ws ");
            sb_puts(&r, m[j].text);
            sb_puts(&r, " )?");
            if (rest[j + 1])
                sb_puts(&r, " "), sb_puts(&r, rest[j + 1]);
        }
        char *body = NULL;
        rc = sb_take(&r, &body);
        char h[80];
        snprintf(h, sizeof h, "%s-rest", hint);
        if (rc == 0 && body[0])
            rc = make_rule(cv, h, body, &rest[j]);
        free(body);
    }
    alts a = {0};
    for (int i = 0; i <= k && i < n && rc == 0; i++) {
        sbuf one = {0};
        sb_puts(&one, m[i].text);
        if (i == k)
            members_after(&one, m, k + 1, n, extra);
        else if (rest[i + 1])
            sb_puts(&one, " "), sb_puts(&one, rest[i + 1]);
        alt_add(&a, one.p ? one.p : "");
        if (one.bad)
            a.b.bad = one.bad;
        free(one.p);
    }
    if (k == n && extra) {
        sbuf one = {0};
        sb_puts(&one, extra);
        members_after(&one, m, n, n, extra);
        alt_add(&a, one.p ? one.p : "");
        if (one.bad)
            a.b.bad = one.bad;
        free(one.p);
    }
    char *inner = NULL;
    if (rc == 0)
        rc = alt_done(&a, &inner);
    else
        free(a.b.p);
    for (int j = 0; j <= upto; j++)
        free(rest[j]);
    free(rest);
    if (rc == 0 && inner) /* no required member: all of it may be left out */
        sb_puts(&b, k == n ? "( " : ""), sb_puts(&b, inner), sb_puts(&b, k == n ? " )? " : " ");
    free(inner);
    sb_puts(&b, "\"}\"");
    if (rc) {
        free(b.p);
        return rc;
    }
    return sb_take(&b, out);
}

/* The names and schemas of the members: listed properties, then required names not listed. */
static int object_members(json_t *s, json_t *addl, member **out, int *n)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    size_t cap = json_object_size(props) + json_array_size(req);
    member *m = calloc(cap + 1, sizeof *m);
    if (!m)
        return oom();
    int k = 0;
    const char *name;
    json_t *v;
    json_object_foreach(props, name, v) {
        m[k] = (member){.name = name, .schema = v};
        for (size_t i = 0; i < json_array_size(req); i++)
            m[k].required |= !strcmp(json_string_value(json_array_get(req, i)), name);
        k++;
    }
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *r = json_string_value(json_array_get(req, i));
        int seen = 0;
        for (int j = 0; j < k && !seen; j++)
            seen = !strcmp(m[j].name, r);
        if (!seen)
            m[k++] = (member){.name = r, .schema = addl, .required = 1}; /* NULL: any value */
    }
    *out = m;
    *n = k;
    return 0;
}

static void members_free(member *m, int n)
{
    for (int i = 0; i < n; i++)
        free(m[i].text);
    free(m);
}

/* Every member's text (*never when a required member matches nothing; optional ones that match
 * nothing are dropped). */
static int member_texts(conv *cv, member *m, int *n, int *never)
{
    int k = 0;
    *never = 0;
    for (int i = 0; i < *n; i++) {
        size_t was = path_push(cv, "properties");
        path_push(cv, m[i].name);
        char *value = NULL, *key = NULL;
        sbuf kb = {0};
        int rc = member_value(cv, m[i].schema ? m[i].schema : json_true(), m[i].name, &value);
        if (rc == 0 && value)
            rc = literal_of_string(cv, &kb, m[i].name, strlen(m[i].name));
        if (rc == 0 && value)
            rc = sb_take(&kb, &key);
        if (rc == 0 && value)
            rc = member_text(key, value, &m[i].text);
        free(kb.p), free(key), free(value);
        path_pop(cv, was);
        if (rc < 0)
            return rc;
        if (m[i].text) { /* moved down, never two owners of one text */
            member t = m[i];
            m[i].text = NULL;
            m[k++] = t;
        } else if (m[i].required)
            *never = 1;
    }
    *n = k;
    return 0;
}

/* minProperties/maxProperties: allowed only when every object of the grammar satisfies them. */
static int check_property_counts(conv *cv, json_t *s, member *m, int n, int extras)
{
    long long min = 0, max = -1;
    int rc = get_count(cv, s, "minProperties", &min);
    if (rc >= 0)
        rc = get_count(cv, s, "maxProperties", &max);
    if (rc < 0)
        return rc;
    int required = 0;
    for (int i = 0; i < n; i++)
        required += m[i].required;
    if (min > required)
        return fail(cv, "'minProperties' is not supported (only where the required properties make it)");
    if (max >= 0 && (extras || max < n))
        return fail(cv, "'maxProperties' is not supported (only where the listed properties cannot pass it)");
    return 0;
}

/* The additional member (key, colon, value) when addl allows some: *out, or NULL. The key excludes
 * every listed name m [n]. */
static int extra_member(conv *cv, json_t *addl, member *m, int n, const char *hint, char **out)
{
    *out = NULL;
    if (!addl || json_is_false(addl))
        return 0;
    char *value = NULL, *key = NULL;
    size_t was = path_push(cv, "additionalProperties");
    int rc = member_value(cv, addl, "value", &value);
    path_pop(cv, was);
    if (rc == 0 && value)
        rc = extra_key(cv, m, n, hint, &key);
    if (rc == 0 && value) {
        sbuf kb = {0};
        sb_puts(&kb, "\"\\\"\" ");
        sb_puts(&kb, key);
        sb_puts(&kb, " \"\\\"\"");
        char *quoted = NULL;
        rc = sb_take(&kb, &quoted);
        if (rc == 0)
            rc = member_text(quoted, value, out);
        free(quoted);
    }
    free(value);
    free(key);
    return rc;
}

static int conv_object(conv *cv, json_t *s, char **out)
{
    *out = NULL;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (!props && !req && (!addl || is_any(addl))) {
        IFLOW_TRY(check_property_counts(cv, s, NULL, 0, 1));
        return (*out = helper(cv, H_OBJECT, "object")) ? 0 : oom();
    }
    char hint[64];
    path_hint(cv, "object", hint, sizeof hint);
    cv->helpers |= H_WS;
    member *m = NULL;
    int n = 0, never = 0;
    IFLOW_TRY(object_members(s, addl, &m, &n));
    char *extra = NULL, *body = NULL;
    int rc = extra_member(cv, addl, m, n, hint, &extra); /* before member_texts drops names */
    if (rc == 0)
        rc = member_texts(cv, m, &n, &never);
    if (rc == 0 && !never)
        rc = check_property_counts(cv, s, m, n, extra != NULL);
    if (rc == 0 && !never)
        rc = object_body(cv, m, n, extra, hint, &body);
    if (rc == 0 && body)
        rc = make_rule(cv, hint, body, out);
    free(body);
    free(extra);
    members_free(m, n);
    return rc;
}

/* ---- arrays ---- */

static int conv_array(conv *cv, json_t *s, char **out)
{
    *out = NULL;
    long long min = 0, max = -1;
    int rc = get_count(cv, s, "minItems", &min);
    if (rc >= 0)
        rc = get_count(cv, s, "maxItems", &max);
    if (rc < 0)
        return rc;
    rc = 0;
    json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    if (!prefix && (!items || is_any(items)) && min == 0 && max < 0)
        return (*out = helper(cv, H_ARRAY, "array")) ? 0 : oom();
    if (min > IFLOW_GRAMMAR_MAX_REPEAT || max > IFLOW_GRAMMAR_MAX_REPEAT)
        return fail(cv, "%s %lld is over the limit of %d", max > IFLOW_GRAMMAR_MAX_REPEAT ? "maxItems" : "minItems",
                    max > IFLOW_GRAMMAR_MAX_REPEAT ? max : min, IFLOW_GRAMMAR_MAX_REPEAT);
    int k = (int)json_array_size(prefix);
    if (k > MAX_PREFIX)
        return fail(cv, "'prefixItems' with over %d schemas is not supported", MAX_PREFIX);
    char *el[MAX_PREFIX + 1] = {0};
    int usable = 0;
    for (; usable < k && rc == 0; usable++) {
        size_t was = path_push(cv, "prefixItems");
        path_push_index(cv, (size_t)usable);
        rc = member_value(cv, json_array_get(prefix, (size_t)usable), "item", &el[usable]);
        path_pop(cv, was);
        if (rc == 0 && !el[usable])
            break;
    }
    if (rc == 0 && usable < k)
        max = max < 0 || max > usable ? usable : max;
    else if (rc == 0 && items) {
        size_t was = path_push(cv, "items");
        rc = member_value(cv, items, "item", &el[k]);
        path_pop(cv, was);
        if (rc == 0 && !el[k])
            max = max < 0 || max > k ? k : max;
    } else if (rc == 0)
        el[k] = helper(cv, H_VALUE, "value"), rc = el[k] ? 0 : oom();
    if (rc == 0 && max >= 0 && min > max) {
        for (int i = 0; i <= k; i++)
            free(el[i]);
        return 0;
    }
    cv->helpers |= H_WS;
    sbuf tail = {0};
    if (rc == 0 && (max < 0 || max > k) && k > 0) { /* after the tuple: items, with their commas */
        sbuf x = {0};
        sb_puts(&x, "( \",\" ws ");
        sb_puts(&x, el[k] ? el[k] : "");
        sb_puts(&x, " ws )");
        rc = sb_err(&x);
        if (rc == 0)
            rc = put_repeat(cv, &tail, x.p, min > k ? min - k : 0, max < 0 ? -1 : max - k,
                            max > IFLOW_GRAMMAR_MAX_REPEAT ? "maxItems" : "minItems");
        free(x.p);
    } else if (rc == 0 && k == 0 && max != 0) { /* items only */
        sbuf x = {0};
        sb_puts(&x, "( \",\" ws ");
        sb_puts(&x, el[0]);
        sb_puts(&x, " ws )");
        rc = sb_err(&x);
        sb_puts(&tail, el[0]);
        sb_puts(&tail, " ws ");
        if (rc == 0)
            rc = put_repeat(cv, &tail, x.p, min > 1 ? min - 1 : 0, max < 0 ? -1 : max - 1,
                            max > IFLOW_GRAMMAR_MAX_REPEAT ? "maxItems" : "minItems");
        free(x.p);
        if (min == 0 && rc == 0) {
            sbuf w = {0};
            sb_puts(&w, "( ");
            sb_putn(&w, tail.p ? tail.p : "", tail.n);
            sb_puts(&w, " )?");
            free(tail.p);
            tail = w;
        }
    }
    int top = k < max || max < 0 ? k : (int)max;
    for (int i = top - 1; i >= 0 && rc == 0; i--) { /* the tuple, from its end */
        sbuf w = {0};
        if (i >= min)
            sb_puts(&w, "( ");
        sb_puts(&w, i ? "\",\" ws " : "");
        sb_puts(&w, el[i]);
        sb_puts(&w, " ws");
        if (tail.n)
            sb_puts(&w, " "), sb_putn(&w, tail.p, tail.n);
        if (i >= min)
            sb_puts(&w, " )?");
        free(tail.p);
        tail = w;
    }
    for (int i = 0; i <= k; i++)
        free(el[i]);
    if (rc) {
        free(tail.p);
        return rc;
    }
    sbuf b = {0};
    sb_puts(&b, "\"[\" ws ");
    if (tail.n)
        sb_putn(&b, tail.p, tail.n), sb_puts(&b, " ");
    sb_puts(&b, "\"]\"");
    free(tail.p);
    char hint[64], *body = NULL;
    path_hint(cv, "array", hint, sizeof hint);
    rc = sb_take(&b, &body);
    if (rc == 0)
        rc = make_rule(cv, hint, body, out);
    free(body);
    return rc;
}

/* ---- types, alternatives, the dispatch ---- */

/* The types s may have: "type", else those whose keywords s uses, else all. */
static int schema_types(conv *cv, json_t *s)
{
    json_t *t = json_object_get(s, "type");
    if (t)
        return type_set(cv, t);
    static const struct {
        const char *k;
        int t;
    } kw[] = {{"properties", T_OBJECT}, {"required", T_OBJECT}, {"additionalProperties", T_OBJECT},
              {"minProperties", T_OBJECT}, {"maxProperties", T_OBJECT}, {"items", T_ARRAY},
              {"prefixItems", T_ARRAY}, {"minItems", T_ARRAY}, {"maxItems", T_ARRAY}, {"minLength", T_STRING},
              {"maxLength", T_STRING}, {"pattern", T_STRING}, {"format", T_STRING}, {"minimum", T_NUMBER},
              {"maximum", T_NUMBER}, {"exclusiveMinimum", T_NUMBER}, {"exclusiveMaximum", T_NUMBER}};
    int set = 0;
    for (size_t i = 0; i < sizeof kw / sizeof *kw; i++)
        if (json_object_get(s, kw[i].k))
            set |= kw[i].t;
    return set ? set : T_ALL;
}

static int conv_types(conv *cv, json_t *s, char **out)
{
    int set = schema_types(cv, s);
    if (set < 0)
        return set;
    if (set == T_ALL && !has_constraints(s, NULL))
        return (*out = helper(cv, H_VALUE, "value")) ? 0 : oom();
    int (*const fn[])(conv *, json_t *, char **) = {conv_object, conv_array, conv_string, conv_number, conv_integer};
    const int bit[] = {T_OBJECT, T_ARRAY, T_STRING, T_NUMBER, T_INTEGER};
    alts a = {0};
    int rc = 0;
    int was_head = cv->at_head;
    for (int i = 0; i < 5 && rc == 0; i++) {
        if (!(set & bit[i]) || (bit[i] == T_INTEGER && (set & T_NUMBER)))
            continue;
        char *e = NULL;
        cv->at_head = 0; /* each of these starts with a byte of its own */
        rc = fn[i](cv, s, &e);
        cv->at_head = was_head;
        if (rc == 0 && e)
            alt_add(&a, e);
        free(e);
    }
    if (set & T_BOOL)
        alt_add(&a, "( \"true\" | \"false\" )");
    if (set & T_NULL)
        alt_add(&a, "\"null\"");
    if (rc) {
        free(a.b.p);
        return rc;
    }
    return alt_done(&a, out);
}

static int conv_alternatives(conv *cv, json_t *s, const char *key, char **out)
{
    json_t *list = json_object_get(s, key);
    const char *own[] = {key, NULL};
    json_t *siblings = has_constraints(s, own) ? constraints_copy(s, own) : NULL;
    if (has_constraints(s, own) && !siblings)
        return oom();
    alts a = {0};
    int rc = 0;
    for (size_t i = 0; i < json_array_size(list) && rc == 0; i++) {
        size_t was = path_push(cv, key);
        path_push_index(cv, i);
        json_t *b = json_array_get(list, i), *both = siblings ? json_pack("{s[OO]}", "allOf", siblings, b) : NULL;
        char *e = NULL;
        rc = siblings && !both ? oom() : conv_schema(cv, both ? both : b, &e);
        json_decref(both);
        path_pop(cv, was);
        if (rc == 0 && e)
            alt_add(&a, e);
        free(e);
    }
    json_decref(siblings);
    if (rc) {
        free(a.b.p);
        return rc;
    }
    return alt_done(&a, out);
}

/* allOf, or $ref with other constraints, or anyOf with oneOf: one merged schema, converted. */
static int conv_merged(conv *cv, json_t *s, char **out)
{
    json_t *branches = json_array(), *merged = NULL;
    if (!branches)
        return oom();
    int rc = flatten(cv, s, branches);
    if (rc == 0)
        rc = merge_all(cv, branches, &merged);
    json_decref(branches);
    if (rc == 0) {
        cv->depth++;
        rc = conv_schema(cv, merged, out);
        cv->depth--;
    }
    json_decref(merged);
    return rc;
}

static int conv_object_schema(conv *cv, json_t *s, char **out)
{
    IFLOW_TRY(check_keywords(cv, s));
    json_t *ref = json_object_get(s, "$ref"), *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    static const char *const just_ref[] = {"$ref", NULL};
    if (json_object_get(s, "allOf") || (ref && has_constraints(s, just_ref)) || (any && one))
        return conv_merged(cv, s, out);
    if (ref)
        return conv_ref(cv, json_string_value(ref), out);
    if (any || one)
        return conv_alternatives(cv, s, any ? "anyOf" : "oneOf", out);
    if (json_object_get(s, "enum") || json_object_get(s, "const"))
        return conv_enum(cv, s, out);
    return conv_types(cv, s, out);
}

/* The expression for schema s (at cv->path); *out NULL when s matches no value. */
static int conv_schema(conv *cv, json_t *s, char **out)
{
    *out = NULL;
    IFLOW_TRY(step(cv, 1));
    if (json_is_true(s))
        return (*out = helper(cv, H_VALUE, "value")) ? 0 : oom();
    if (json_is_false(s))
        return 0;
    if (!json_is_object(s))
        return fail(cv, "a schema must be an object or a boolean");
    if (cv->depth >= MAX_DEPTH)
        return fail(cv, "schemas nested deeper than %d", MAX_DEPTH);
    cv->depth++;
    int rc = conv_object_schema(cv, s, out);
    cv->depth--;
    return rc;
}

/* ---- the whole grammar ------------------------------------------------------------------------- */

static const struct {
    unsigned h, needs;
    const char *text;
} helpers[H_COUNT] = {
    {H_WS, 0, "ws ::= [ \\t\\n\\r]{0,32}\n"},
    {H_VALUE, H_OBJECT | H_ARRAY | H_STRING | H_NUMBER,
     "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"},
    {H_OBJECT, H_WS | H_STRING | H_VALUE,
     "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n"},
    {H_ARRAY, H_WS | H_VALUE, "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"},
    {H_STRING, H_CHAR, "string ::= \"\\\"\" char* \"\\\"\"\n"},
    {H_CHAR, H_HEX,
     "char ::= [^\\x22\\x5C\\x00-\\x1F] | \"\\\\\" ( [\\x22\\x5C/bfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] hex{3} | "
     "[dD] [0-7] hex{2} ) ) | \"\\\\u\" [dD] [89abAB] hex{2} \"\\\\u\" [dD] [c-fC-F] hex{2}\n"},
    {H_HEX, 0, "hex ::= [0-9a-fA-F]\n"},
    {H_NUMBER, H_INTEGER, "number ::= integer ( \".\" [0-9]+ )? ( [eE] [\\-+]? [0-9]+ )?\n"},
    {H_INTEGER, 0, "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]* )\n"},
    {H_KEYCHAR, 0, "keychar ::= [^\\x22\\x5C\\x00-\\x1F]\n"},
    {H_DATE, 0,
     "fmt-date ::= fmt-year \"-\" ( ( \"01\" | \"03\" | \"05\" | \"07\" | \"08\" | \"10\" | \"12\" ) \"-\" "
     "( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | ( \"04\" | \"06\" | \"09\" | \"11\" ) \"-\" "
     "( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) ) | "
     "fmt-leap-year \"-02-29\"\n"
     "fmt-year ::= \"000\" [1-9] | \"00\" [1-9] [0-9] | \"0\" [1-9] [0-9]{2} | [1-9] [0-9]{3}\n"
     "fmt-leap-year ::= [0-9]{2} fmt-leap4 | fmt-leap4 \"00\"\n"
     "fmt-leap4 ::= \"0\" [48] | [2468] [048] | [13579] [26]\n"},
    {H_TIME, 0,
     "fmt-time ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? "
     "( \"Z\" | [+\\-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n"},
    {H_DATETIME, H_DATE | H_TIME, "fmt-date-time ::= fmt-date \"T\" fmt-time\n"},
    {H_UUID, H_HEX, "fmt-uuid ::= hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}\n"},
};

static void put_helpers(conv *cv, sbuf *b)
{
    for (int pass = 0; pass < H_COUNT; pass++)
        for (int i = 0; i < H_COUNT; i++)
            if (cv->helpers & helpers[i].h)
                cv->helpers |= helpers[i].needs;
    for (int i = 0; i < H_COUNT; i++)
        if (cv->helpers & helpers[i].h)
            sb_puts(b, helpers[i].text);
}

/* Convert the root and every $ref target (each once, in the order first referenced); 1 when a
 * target matches nothing (cv->never_ref), to be tried again without it. */
static int convert_all(conv *cv)
{
    int idx;
    IFLOW_TRY(ref_lookup(cv, "#", &idx));
    for (int i = 0; i < cv->n_refs; i++) {
        sbuf saved = cv->path;
        memset(&cv->path, 0, sizeof cv->path);
        sb_puts(&cv->path, cv->refs[i].ptr);
        cv->cur = i;
        cv->at_head = 1;
        cv->depth = 0;
        char *e = NULL;
        int rc = sb_err(&cv->path);
        if (rc == 0)
            rc = conv_schema(cv, cv->refs[i].target, &e);
        if (rc == 0 && !e && i) { /* try again with that $ref matching nothing */
            cv->never_ref = i;
            rc = 1;
        } else if (rc == 0 && !e)
            rc = fail(cv, "the schema matches no value");
        free(cv->path.p);
        cv->path = saved;
        if (rc == 0) {
            sb_puts(&cv->top, cv->refs[i].name);
            sb_puts(&cv->top, " ::= ");
            sb_puts(&cv->top, e);
            sb_puts(&cv->top, "\n");
            rc = sb_err(&cv->top);
        }
        free(e);
        if (rc)
            return rc;
    }
    return check_left_recursion(cv);
}

static void conv_free(conv *cv)
{
    for (int i = 0; i < cv->n_refs; i++) {
        free(cv->refs[i].ref);
        free(cv->refs[i].ptr);
        free(cv->refs[i].name);
    }
    free(cv->refs);
    free(cv->edges);
    free(cv->top.p);
    free(cv->more.p);
    free(cv->path.p);
    json_decref(cv->names);
    json_decref(cv->suffix);
    json_decref(cv->ref_index);
    json_decref(cv->flattening);
}

/* One attempt at the whole grammar; 1 when a $ref's target turned out to match nothing (added to
 * `never` for the next attempt). */
static int attempt(json_t *doc, json_t *never, char **out)
{
    conv cv = {.doc = doc, .never = never};
    cv.names = json_object();
    cv.suffix = json_object();
    cv.ref_index = json_object();
    cv.flattening = json_array();
    int rc = cv.names && cv.suffix && cv.ref_index && cv.flattening ? convert_all(&cv) : oom();
    if (rc == 1 && json_object_set_new(never, cv.refs[cv.never_ref].ref, json_true()) < 0)
        rc = oom();
    if (rc == 1 && json_object_size(never) > MAX_RETRY) {
        path_pop(&cv, 0);
        rc = fail(&cv, "the schema that $ref '%s' names matches no value (and %d others)",
                  iflow_quote(cv.refs[cv.never_ref].ref), MAX_RETRY);
    }
    sbuf b = {0};
    if (rc == 0) {
        sb_putn(&b, cv.top.p, cv.top.n);
        sb_putn(&b, cv.more.p ? cv.more.p : "", cv.more.n);
        put_helpers(&cv, &b);
        rc = sb_take(&b, out);
    }
    conv_free(&cv);
    return rc;
}

int iflow_grammar_from_json_schema(const char *schema, size_t len, char **out)
{
    if (!out)
        return iflow_seterr(IFLOW_EINVAL, "json schema: no place for the grammar");
    *out = NULL;
    if (schema && len > IFLOW_GRAMMAR_MAX_TEXT)
        return iflow_seterr(IFLOW_EINVAL, "json schema: %zu bytes is over the limit of %u", len,
                            (unsigned)IFLOW_GRAMMAR_MAX_TEXT);
    json_error_t jerr;
    json_t *doc = schema ? json_loadb(schema, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr) : json_true();
    if (!doc)
        return iflow_seterr(IFLOW_EINVAL, "json schema: not valid JSON: %s, line %d column %d",
                            iflow_quote(jerr.text), jerr.line, jerr.column);
    json_t *never = json_object();
    int rc = never ? 1 : oom();
    while (rc == 1)
        rc = attempt(doc, never, out);
    json_decref(never);
    json_decref(doc);
    return rc;
}
