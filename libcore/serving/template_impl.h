/*
 * template_impl.h -- the chat template renderer's insides (template.h), shared by its five
 * files only:
 *   template.c        the arena, text buffers, values (truth, equality, order), printing them
 *                     as Python's str() and repr() and as json.dumps(), vars from JSON, the API
 *   template_parse.c  the lexer (jinja2's rules for tags and whitespace) and the parser (to a tree)
 *   template_eval.c   the evaluator: scopes, expressions, statements, macros, loops
 *   template_lib.c    the built-ins: filters, tests, methods of str and dict, global functions
 *   template_text.c   case mapping (Unicode's full mappings) and formatting (str.format, %)
 *
 * Values (tval) are small tagged structs passed by value. Strings are (pointer, length) slices
 * that are never written once made: a literal points into the tree, a substring into its
 * string. Lists, dicts and everything else a render makes live in the render's arena and die
 * with it, so nothing is reference counted (a namespace is the one value that changes).
 */
#ifndef IFLOW_TEMPLATE_IMPL_H
#define IFLOW_TEMPLATE_IMPL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "template.h"

/* ---- arena ---------------------------------------------------------------------------------- */

typedef struct tpl_chunk tpl_chunk;
typedef struct {
    tpl_chunk *head;
    size_t total, limit; /* bytes taken from malloc, and the most allowed */
    int over;            /* the last failure was the limit, not malloc */
} tpl_arena;

void *tpl_arena_alloc(tpl_arena *a, size_t n); /* 16-byte aligned; NULL when out of memory */
void  tpl_arena_free(tpl_arena *a);

/* ---- values --------------------------------------------------------------------------------- */

enum {
    TV_UNDEF,  /* s: the name that was looked up (may be empty)                          */
    TV_NONE, TV_BOOL, TV_INT, TV_FLOAT, TV_STR,
    TV_LIST, TV_TUPLE, /* l                                                              */
    TV_DICT, TV_NS,    /* d (a namespace's attributes)                                    */
    TV_LOOP,           /* loop                                                            */
    TV_MACRO,          /* m                                                               */
    TV_FUNC,           /* fn: a global function (G_*)                                     */
    TV_METHOD,         /* meth: a method bound to its object                              */
    TV_NOARG           /* an argument not given (never seen by a template)               */
};

typedef struct tval tval;
typedef struct {
    size_t n, cap;
    tval *v;
    const char *view;         /* range() and dict.items()...: their Python type (NULL: a list) */
    const long long *range;   /* range(): start, stop, step */
} tv_list;
typedef struct { size_t n, cap; tval *k, *v; } tv_dict;
typedef struct tpl_loop tpl_loop;
typedef struct tpl_macro tpl_macro;
typedef struct tpl_method tpl_method;

struct tval {
    uint8_t t;
    union {
        int b;
        long long i;
        double f;
        struct { const char *p; size_t n; } s;
        tv_list *l;
        tv_dict *d;
        tpl_loop *loop;
        tpl_macro *m;
        int fn;
        tpl_method *meth;
    };
};

static inline tval tv_undef(const char *name, size_t n) { tval v = {.t = TV_UNDEF}; v.s.p = name; v.s.n = n; return v; }
static inline tval tv_none(void) { return (tval){.t = TV_NONE}; }
static inline tval tv_bool(int b) { tval v = {.t = TV_BOOL}; v.b = !!b; return v; }
static inline tval tv_int(long long i) { tval v = {.t = TV_INT}; v.i = i; return v; }
static inline tval tv_float(double f) { tval v = {.t = TV_FLOAT}; v.f = f; return v; }
static inline tval tv_str(const char *p, size_t n) { tval v = {.t = TV_STR}; v.s.p = p; v.s.n = n; return v; }
static inline tval tv_noarg(void) { return (tval){.t = TV_NOARG}; }

/* ---- the tree ------------------------------------------------------------------------------- */

enum {
    /* expressions */
    N_CONST, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_KW, N_FILTER, N_TEST, N_NEG, N_POS, N_NOT,
    N_BIN, N_CONCAT, N_CMP, N_OPERAND, N_AND, N_OR, N_COND, N_LIST, N_TUPLE, N_DICT, N_NSREF, N_HOLE,
    /* statements */
    N_BODY, N_DATA, N_EMIT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_PARAM, N_WITH, N_FILTERBLOCK,
    N_CALLBLOCK, N_BREAK, N_CONTINUE
};

/* N_BIN and N_OPERAND operators */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE,
       OP_IN, OP_NOTIN };

/*
 * Node shapes (kid[i]; NULL where optional):
 *   N_CONST lit | N_NAME lit.s | N_ATTR obj, name lit.s | N_ITEM obj, index | N_SLICE start, stop, step
 *   N_CALL callee, args... (N_KW name lit.s: value) | N_FILTER, N_TEST obj (N_HOLE in a filter block
 *   or set block), name lit.s, id (-1: unknown), args... | N_NEG, N_POS, N_NOT x | N_BIN op a, b
 *   N_CONCAT parts... | N_CMP first, N_OPERAND op x... | N_AND, N_OR a, b | N_COND then, test, else
 *   N_LIST, N_TUPLE items... | N_DICT key, value, key, value... | N_NSREF lit.s attr of kid[0] name
 *   N_BODY statements... | N_DATA lit | N_EMIT expr | N_IF test, body, else (N_IF for an elif)
 *   N_FOR target, iter, cond, body, else | N_SET target, value | N_SETBLOCK target, body, filters
 *   N_MACRO name lit.s, body, N_PARAM (lit.s, default)... | N_WITH body, target, value, ...
 *   N_FILTERBLOCK filters, body | N_CALLBLOCK call, N_MACRO "caller" (the body)
 */
typedef struct tnode tnode;
struct tnode {
    uint8_t kind, op;
    int16_t id;      /* a filter's or test's (-1: unknown) */
    uint16_t depth;  /* 1 + the deepest kid's */
    uint8_t konst;   /* an expression of constants only, which jinja2 computes when it compiles */
    uint32_t pos;    /* byte offset in the template's normalized text */
    uint32_t n;
    tnode **kid;
    tval lit;
};

struct iflow_template {
    char *name;
    char *src; /* the text, newlines normalized (messages count lines and columns in it) */
    size_t len;
    tpl_arena a; /* the tree and its strings */
    tnode *root;
};

/* "line L, column C" of a byte offset */
void tpl_where(const iflow_template *t, size_t pos, int *line, int *col);
int  tpl_parse(iflow_template *t);

/* ---- rendering ------------------------------------------------------------------------------ */

typedef struct { char *p; size_t n, cap; } tpl_buf; /* malloc'd text */

typedef struct tpl_scope tpl_scope;
struct tpl_scope {
    tpl_scope *parent;
    int captured; /* a macro defined here keeps it (a loop makes a new one for its next turn) */
    size_t n, cap;
    const char **name;
    size_t *nlen;
    tval *val;
};

typedef struct {
    const iflow_template *t;
    tpl_arena a;
    tv_dict *vars;   /* the caller's variables */
    tpl_buf *out;    /* where text goes now (a macro or set block captures its own) */
    tpl_buf *main;   /* the output */
    size_t bufmem;   /* bytes held by text buffers (counted with the arena's) */
    tpl_scope *scope; /* the innermost scope */
    long steps;
    int depth;
    const tnode *at; /* the node whose operation runs, for messages */
    int rc;          /* the code of the last failure (after a NULL from tpl_alloc) */
    int has_now;
    long long now;
    tval hole;       /* what N_HOLE stands for */
    int folding;     /* computing constants as jinja2 does while it compiles (template_eval.c) */
} tpl_render;

/* An argument list: positional, then named. */
typedef struct {
    int n, nkw;
    tval *v, *kw;
    const tnode **kwname; /* N_KW nodes, for their names */
} tpl_args;

struct tpl_loop {
    tv_list *items;
    size_t i;
    int depth;
};
struct tpl_macro {
    const tnode *def;
    tpl_scope *scope; /* where it was defined */
};
struct tpl_method {
    int id;
    tval self;
};

/* Failures: the message names the template, and the line and column of r->at. */
int   tpl_fail(tpl_render *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void *tpl_alloc(tpl_render *r, size_t n); /* sets the message and r->rc when it returns NULL */
int   tpl_spend(tpl_render *r, size_t steps);
int   tpl_type_error(tpl_render *r, const char *what, tval a, tval b);

int   tpl_buf_put(tpl_render *r, tpl_buf *b, const char *p, size_t n);
int   tpl_buf_putc(tpl_render *r, tpl_buf *b, char c);
int   tpl_buf_take(tpl_render *r, tpl_buf *b, tval *out); /* into the arena as a string; frees b */
void  tpl_buf_free(tpl_render *r, tpl_buf *b);

int   tpl_str_copy(tpl_render *r, const char *p, size_t n, tval *out);
tv_list *tpl_list_new(tpl_render *r, size_t cap);
int   tpl_list_push(tpl_render *r, tv_list *l, tval v);
int   tpl_range_view(tpl_render *r, tv_list *l, const long long *params, tval *out); /* marks l a range */
tv_dict *tpl_dict_new(tpl_render *r, size_t cap);
int   tpl_dict_set(tpl_render *r, tv_dict *d, tval k, tval v);
int   tpl_dict_find(tpl_render *r, const tv_dict *d, tval k, tval **slot); /* *slot NULL: absent */
tval *tpl_dict_find_str(tpl_render *r, const tv_dict *d, const char *p, size_t n);
static inline tval tv_seq(tv_list *l, int tuple)
{
    tval v = {.t = (uint8_t)(tuple ? TV_TUPLE : TV_LIST)};
    v.l = l;
    return v;
}
static inline tval tv_map(tv_dict *d)
{
    tval v = {.t = TV_DICT};
    v.d = d;
    return v;
}

/* The index of a named argument, -1 when it was not given. */
static inline int tpl_kwarg(const tpl_args *a, const char *p, size_t n)
{
    for (int k = 0; k < a->nkw; k++)
        if (a->kwname[k]->lit.s.n == n && memcmp(a->kwname[k]->lit.s.p, p, n) == 0)
            return k;
    return -1;
}

const char *tpl_type_name(tval v);
int   tpl_truthy(tval v);
int   tpl_equal(tpl_render *r, tval a, tval b); /* 1, 0, or a negative code (values nested too deep) */
int   tpl_compare(tpl_render *r, const char *op, tval a, tval b, int *sign); /* for <, <=, >, >=, sorting */
int   tpl_hashable(tpl_render *r, tval k);

int   tpl_print(tpl_render *r, tpl_buf *b, tval v, int repr); /* str(v) or repr(v) */
int   tpl_to_str(tpl_render *r, tval v, tval *out);             /* str(v) as a string value */
int   tpl_float_repr(double d, char buf[40]);

typedef struct {
    const char *indent; /* NULL: none */
    size_t indent_n;
    const char *item_sep, *key_sep;
    size_t item_sep_n, key_sep_n;
    int sort_keys, ascii;
} tpl_json_opts;
int   tpl_json(tpl_render *r, tpl_buf *b, tval v, const tpl_json_opts *o, int level);

/* template_eval.c */
int   tpl_render_tree(tpl_render *r);
int   tpl_call(tpl_render *r, tval fn, tpl_args *a, tval *out);
int   tpl_getattr(tpl_render *r, tval obj, const char *name, size_t n, tval *out);
int   tpl_pyattr(tpl_render *r, tval obj, const char *name, size_t n, tval *out); /* 1 found, 0 not, <0 */
int   tpl_getitem(tpl_render *r, tval obj, tval key, tval *out);
int   tpl_items(tpl_render *r, tval v, tv_list **out); /* what `for` iterates */

/* template_lib.c: ids are indices in the name tables; -1 for a name jinja2 lacks */
int   tpl_filter_id(const char *p, size_t n);
int   tpl_test_id(const char *p, size_t n);
int   tpl_global_id(const char *p, size_t n);
int   tpl_method_find(tval obj, const char *p, size_t n); /* -1: none */
int   tpl_filter(tpl_render *r, int id, const char *name, tval v, tpl_args *a, tval *out);
int   tpl_test(tpl_render *r, int id, const char *name, tval v, tpl_args *a, int *res);
int   tpl_call_global(tpl_render *r, int fn, tpl_args *a, tval *out);
int   tpl_call_method(tpl_render *r, const tpl_method *m, tpl_args *a, tval *out);
int   tpl_binop(tpl_render *r, int op, tval a, tval b, tval *out);
int   tpl_contains(tpl_render *r, tval hay, tval needle, int *res);

/* template_text.c: case mapping and formatting */
enum { TPL_UPPER, TPL_LOWER, TPL_CAPITALIZE, TPL_TITLE, TPL_JINJA_TITLE };
int   tpl_change_case(tpl_render *r, tval s, int how, tval *out);
int   tpl_str_format(tpl_render *r, tval fmt, tpl_args *a, tval *out);     /* str.format() */
int   tpl_percent_format(tpl_render *r, tval fmt, tval arg, tval *out);     /* fmt % arg */

/* UTF-8 (template.c): the code point at p and its length (an invalid byte: -1, length 1) */
int32_t tpl_utf8_next(const char *p, size_t n, size_t *len);
size_t  tpl_utf8_put(int32_t cp, char *out); /* 1 to 4 bytes */
size_t  tpl_utf8_len(tpl_render *r, const char *p, size_t n); /* code points (a step per 64 bytes) */
int     tpl_is_space(int32_t c);             /* Python's str.isspace() */

#endif
