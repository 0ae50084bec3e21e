/*
 * template_eval.c -- chat templates (template.h): the evaluator.
 *
 * Statements write to r->out (a macro call and a set or filter block capture their own text).
 * Scopes are jinja2's: the template's own, a new one for every loop turn (so a set inside the
 * body does not outlive the turn), for a macro call (its parent: where the macro was defined)
 * and for with and set/filter blocks; a name not found in the scopes is looked up in the
 * caller's variables, then in the globals, else it is undefined. Every statement and
 * expression evaluated counts one step and one level of nesting (template.h's limits).
 */
#include "template_impl.h"

#include <string.h>

#include "libcore/base/error.h"
#include "libcore/base/quote.h"

enum { FLOW_BREAK = 1, FLOW_CONTINUE = 2 }; /* what exec returns besides 0 and errors */
#define NOT_CONSTANT (-1000)                 /* eval_folded's: jinja2 could not compute it early */

static int eval(tpl_render *r, const tnode *x, tval *out);
static int eval_as(tpl_render *r, const tnode *x, tval *out, int any_value);
static int exec(tpl_render *r, const tnode *x);

static int undefined_error(tpl_render *r, tval u)
{
    if (!u.s.n)
        return tpl_fail(r, IFLOW_EINVAL, "an undefined value was used");
    return tpl_fail(r, IFLOW_EINVAL, "'%s' is undefined", iflow_quoten(u.s.p, u.s.n));
}

/* ---- scopes --------------------------------------------------------------------------------- */

static tpl_scope *scope_new(tpl_render *r, tpl_scope *parent)
{
    tpl_scope *sc = tpl_alloc(r, sizeof *sc);
    if (sc)
        *sc = (tpl_scope){.parent = parent};
    return sc;
}

static int scope_set(tpl_render *r, tpl_scope *sc, const char *p, size_t n, tval v)
{
    for (size_t i = 0; i < sc->n; i++)
        if (sc->nlen[i] == n && memcmp(sc->name[i], p, n) == 0) {
            sc->val[i] = v;
            return 0;
        }
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? 2 * sc->cap : 4;
        const char **nn = tpl_alloc(r, cap * sizeof *nn);
        size_t *nl = nn ? tpl_alloc(r, cap * sizeof *nl) : NULL;
        tval *nv = nl ? tpl_alloc(r, cap * sizeof *nv) : NULL;
        if (!nv)
            return r->rc;
        if (sc->n) {
            memcpy(nn, sc->name, sc->n * sizeof *nn);
            memcpy(nl, sc->nlen, sc->n * sizeof *nl);
            memcpy(nv, sc->val, sc->n * sizeof *nv);
        }
        sc->name = nn;
        sc->nlen = nl;
        sc->val = nv;
        sc->cap = cap;
    }
    sc->name[sc->n] = p;
    sc->nlen[sc->n] = n;
    sc->val[sc->n++] = v;
    return tpl_spend(r, 1);
}

static int lookup(tpl_render *r, const char *p, size_t n, tval *out)
{
    size_t looked = 0;
    for (const tpl_scope *sc = r->scope; sc; sc = sc->parent) {
        looked += sc->n;
        for (size_t i = sc->n; i-- > 0;)
            if (sc->nlen[i] == n && memcmp(sc->name[i], p, n) == 0) {
                *out = sc->val[i];
                return tpl_spend(r, looked / 16);
            }
    }
    IFLOW_TRY(tpl_spend(r, looked / 16));
    tval *v = tpl_dict_find_str(r, r->vars, p, n);
    if (v) {
        *out = *v;
        return 0;
    }
    int g = tpl_global_id(p, n);
    if (g >= 0) {
        *out = (tval){.t = TV_FUNC};
        out->fn = g;
        return 0;
    }
    *out = tv_undef(p, n);
    return 0;
}

/* ---- attributes, items, slices -------------------------------------------------------------- */

static int loop_attr(const tpl_loop *l, const char *p, size_t n, tval *out)
{
    static const char *const names[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                                        "depth", "depth0", "previtem", "nextitem"};
    size_t i = l->i, len = l->items->n;
    int k = 0;
    for (; k < (int)(sizeof names / sizeof *names); k++)
        if (strlen(names[k]) == n && memcmp(names[k], p, n) == 0)
            break;
    switch (k) {
    case 0: *out = tv_int((long long)i + 1); break;
    case 1: *out = tv_int((long long)i); break;
    case 2: *out = tv_int((long long)(len - i)); break;
    case 3: *out = tv_int((long long)(len - i - 1)); break;
    case 4: *out = tv_bool(i == 0); break;
    case 5: *out = tv_bool(i + 1 == len); break;
    case 6: *out = tv_int((long long)len); break;
    case 7: *out = tv_int(l->depth); break;
    case 8: *out = tv_int(l->depth - 1); break;
    case 9: *out = i > 0 ? l->items->v[i - 1] : tv_undef(p, n); break;
    case 10: *out = i + 1 < len ? l->items->v[i + 1] : tv_undef(p, n); break;
    default: return 0;
    }
    return 1;
}

/* What Python's getattr finds: methods, a namespace's attributes, the loop's. 1 when found. */
int tpl_pyattr(tpl_render *r, tval obj, const char *p, size_t n, tval *out)
{
    if (obj.t == TV_NS) {
        tval *v = tpl_dict_find_str(r, obj.d, p, n);
        if (v)
            *out = *v;
        return v != NULL;
    }
    if (obj.t == TV_LOOP && loop_attr(obj.loop, p, n, out))
        return 1;
    int m = tpl_method_find(obj, p, n);
    if (m < 0)
        return 0;
    tpl_method *bound = tpl_alloc(r, sizeof *bound);
    if (!bound)
        return r->rc;
    bound->id = m;
    bound->self = obj;
    *out = (tval){.t = TV_METHOD};
    out->meth = bound;
    return 1;
}

/* x.name: the attribute, else (a dict) the item, else undefined */
int tpl_getattr(tpl_render *r, tval obj, const char *p, size_t n, tval *out)
{
    if (obj.t == TV_UNDEF)
        return undefined_error(r, obj);
    int found = tpl_pyattr(r, obj, p, n, out);
    if (found)
        return found < 0 ? found : 0;
    tval *v = obj.t == TV_DICT ? tpl_dict_find_str(r, obj.d, p, n) : NULL;
    *out = v ? *v : tv_undef(p, n);
    return 0;
}

/* x[key]: the item, else (a string key) the attribute, else undefined */
int tpl_getitem(tpl_render *r, tval obj, tval key, tval *out)
{
    if (obj.t == TV_UNDEF)
        return undefined_error(r, obj);
    int is_int = key.t == TV_INT || key.t == TV_BOOL;
    long long i = key.t == TV_BOOL ? key.b : key.i;
    if (obj.t == TV_DICT && key.t != TV_LIST && key.t != TV_DICT) {
        tval *v;
        IFLOW_TRY(tpl_dict_find(r, obj.d, key, &v));
        if (v) {
            *out = *v;
            return 0;
        }
    } else if ((obj.t == TV_LIST || obj.t == TV_TUPLE) && is_int && (!obj.l->view || obj.l->range)) {
        long long len = (long long)obj.l->n;
        if (i < 0)
            i += len;
        *out = i >= 0 && i < len ? obj.l->v[i] : tv_undef("", 0);
        return 0;
    } else if (obj.t == TV_STR && is_int) {
        long long len = (long long)tpl_utf8_len(r, obj.s.p, obj.s.n);
        if (i < 0)
            i += len;
        *out = tv_undef("", 0);
        if (i < 0 || i >= len)
            return 0;
        size_t at = 0, clen = 0;
        for (long long k = 0; k <= i; k++) {
            at += clen;
            tpl_utf8_next(obj.s.p + at, obj.s.n - at, &clen);
        }
        *out = tv_str(obj.s.p + at, clen);
        return tpl_spend(r, (size_t)i / 64);
    }
    if (key.t == TV_STR) {
        int found = tpl_pyattr(r, obj, key.s.p, key.s.n, out);
        if (found)
            return found < 0 ? found : 0;
        *out = tv_undef(key.s.p, key.s.n);
        return 0;
    }
    *out = tv_undef("", 0);
    return 0;
}

/* One bound of a slice as Python's PySlice_AdjustIndices makes it. */
static long long slice_bound(tval v, long long len, long long step, int is_start)
{
    if (v.t == TV_NONE)
        return step < 0 ? (is_start ? len - 1 : -1) : (is_start ? 0 : len);
    long long b = v.i;
    if (b < 0) {
        b += len;
        if (b < 0)
            b = step < 0 ? -1 : 0;
    } else if (b >= len) {
        b = step < 0 ? len - 1 : len;
    }
    return b;
}

/* Python's slice.indices(): the first index, the step and the count. */
static void slice_indices(long long len, const tval *part, long long *start, long long *step, long long *count)
{
    long long st = part[2].t == TV_NONE ? 1 : part[2].i;
    long long b = slice_bound(part[0], len, st, 1), e = slice_bound(part[1], len, st, 0);
    *start = b;
    *step = st;
    if (st > 0)
        *count = e > b ? (e - b - 1) / st + 1 : 0;
    else
        *count = e < b ? (b - e - 1) / -st + 1 : 0;
}

/* Byte offsets of the code points of a string (NULL when it is ASCII: the offset is the index). */
static int str_offsets(tpl_render *r, tval s, size_t **offs, long long *len)
{
    *offs = NULL;
    *len = (long long)s.s.n;
    size_t i = 0;
    while (i < s.s.n && (unsigned char)s.s.p[i] < 0x80)
        i++;
    if (i == s.s.n)
        return 0;
    size_t count = tpl_utf8_len(r, s.s.p, s.s.n);
    size_t *o = tpl_alloc(r, (count + 1) * sizeof *o);
    if (!o)
        return r->rc;
    size_t k = 0, len1;
    for (i = 0; i < s.s.n; i += len1) {
        o[k++] = i;
        tpl_utf8_next(s.s.p + i, s.s.n - i, &len1);
    }
    o[k] = s.s.n;
    *offs = o;
    *len = (long long)count;
    return tpl_spend(r, count / 16);
}

/* obj[a:b:c]. jinja2 slices with Python's own [a:b:c], not through its getitem, so errors are
 * errors; but when it computes the slice while it compiles (`folded`: see eval_folded), it goes
 * through its getitem, and there the failure is undefined. */
static int slice(tpl_render *r, tval obj, tval *part, int folded, tval *out)
{
    *out = tv_undef("", 0);
    int sliceable = obj.t == TV_TUPLE || obj.t == TV_STR || (obj.t == TV_LIST && (!obj.l->view || obj.l->range));
    if (!sliceable) /* dict views are not */
        return folded ? 0 : tpl_fail(r, IFLOW_EINVAL, "'%s' object cannot be sliced", tpl_type_name(obj));
    for (int k = 0; k < 3; k++) {
        if (part[k].t == TV_BOOL)
            part[k] = tv_int(part[k].b);
        if (part[k].t != TV_NONE && part[k].t != TV_INT)
            return folded ? 0 : tpl_fail(r, IFLOW_EINVAL, "slice indices must be integers or None");
    }
    if (part[2].t == TV_INT && part[2].i == 0)
        return tpl_fail(r, IFLOW_EINVAL, "slice step cannot be zero");
    if (part[2].t == TV_INT && part[2].i == -9223372036854775807LL - 1)
        part[2].i++;
    long long start, step, count;
    if (obj.t == TV_LIST || obj.t == TV_TUPLE) {
        slice_indices((long long)obj.l->n, part, &start, &step, &count);
        tv_list *l = tpl_list_new(r, (size_t)count);
        if (!l)
            return r->rc;
        for (long long k = 0; k < count; k++)
            IFLOW_TRY(tpl_list_push(r, l, obj.l->v[start + k * step]));
        *out = tv_seq(l, obj.t == TV_TUPLE);
        if (!obj.l->range)
            return 0;
        const long long *rg = obj.l->range; /* a range's slice is a range, bounds from slice.indices() */
        long long len = (long long)obj.l->n, end = slice_bound(part[1], len, step, 0);
        unsigned long long b = (unsigned long long)rg[0], s = (unsigned long long)rg[2]; /* wraps, no UB */
        long long params[3] = {(long long)(b + (unsigned long long)start * s),
                               (long long)(b + (unsigned long long)end * s), (long long)(s * (unsigned long long)step)};
        return tpl_range_view(r, l, params, out);
    }
    size_t *offs;
    long long len;
    IFLOW_TRY(str_offsets(r, obj, &offs, &len));
    slice_indices(len, part, &start, &step, &count);
#define OFF(k) (offs ? offs[k] : (size_t)(k))
    if (step == 1 || count == 0) {
        *out = count ? tv_str(obj.s.p + OFF(start), OFF(start + count) - OFF(start)) : tv_str("", 0);
        return 0;
    }
    tpl_buf b = {0};
    int rc = 0;
    for (long long k = 0; k < count && rc == 0; k++) {
        long long c = start + k * step;
        rc = tpl_buf_put(r, &b, obj.s.p + OFF(c), OFF(c + 1) - OFF(c));
    }
#undef OFF
    if (rc < 0) {
        tpl_buf_free(r, &b);
        return rc;
    }
    return tpl_buf_take(r, &b, out);
}

/* ---- iteration ------------------------------------------------------------------------------ */

int tpl_items(tpl_render *r, tval v, tv_list **out)
{
    tv_list *l;
    switch (v.t) {
    case TV_LIST: case TV_TUPLE:
        *out = v.l;
        return 0;
    case TV_UNDEF:
        return (*out = tpl_list_new(r, 0)) ? 0 : r->rc;
    case TV_DICT:
        if (!(l = tpl_list_new(r, v.d->n)))
            return r->rc;
        for (size_t i = 0; i < v.d->n; i++)
            IFLOW_TRY(tpl_list_push(r, l, v.d->k[i]));
        *out = l;
        return 0;
    case TV_STR:
        if (!(l = tpl_list_new(r, 0)))
            return r->rc;
        for (size_t i = 0, len; i < v.s.n; i += len) {
            tpl_utf8_next(v.s.p + i, v.s.n - i, &len);
            IFLOW_TRY(tpl_list_push(r, l, tv_str(v.s.p + i, len)));
        }
        *out = l;
        return 0;
    default:
        return tpl_fail(r, IFLOW_EINVAL, "'%s' object is not iterable", tpl_type_name(v));
    }
}

/* ---- calls ---------------------------------------------------------------------------------- */

/* The arguments of a call, filter or test node from kid[first] on. */
static int eval_args(tpl_render *r, const tnode *x, uint32_t first, tpl_args *a)
{
    uint32_t n = x->n > first ? x->n - first : 0;
    *a = (tpl_args){0};
    if (!n)
        return 0;
    char *mem = tpl_alloc(r, n * (2 * sizeof(tval) + sizeof(tnode *)));
    if (!mem)
        return r->rc;
    a->v = (tval *)mem;
    a->kw = a->v + n;
    a->kwname = (const tnode **)(a->kw + n);
    for (uint32_t i = first; i < x->n; i++) {
        const tnode *k = x->kid[i];
        if (k->kind == N_KW) {
            IFLOW_TRY(eval(r, k->kid[0], &a->kw[a->nkw]));
            a->kwname[a->nkw++] = k;
        } else {
            IFLOW_TRY(eval(r, k, &a->v[a->n++]));
        }
    }
    r->at = x;
    return 0;
}

/* Run a body with its text captured as a string, in a scope of its own. */
static int capture(tpl_render *r, const tnode *body, tpl_scope *parent, tval *out)
{
    tpl_scope *sc = scope_new(r, parent), *saved = r->scope;
    if (!sc)
        return r->rc;
    tpl_buf b = {0}, *saved_out = r->out;
    r->scope = sc;
    r->out = &b;
    int rc = exec(r, body);
    r->scope = saved;
    r->out = saved_out;
    if (rc != 0) {
        tpl_buf_free(r, &b);
        return rc;
    }
    return tpl_buf_take(r, &b, out);
}

static int macro_args(tpl_render *r, const tpl_macro *m, tpl_args *a, tpl_scope *sc)
{
    const tnode *def = m->def;
    uint32_t np = def->n - 1;
    const char *name = iflow_quoten(def->lit.s.p, def->lit.s.n);
    if ((uint32_t)a->n > np)
        return tpl_fail(r, IFLOW_EINVAL, "macro '%s' takes not more than %u argument(s)", name, np);
    tval *given = tpl_alloc(r, (np ? np : 1) * sizeof *given);
    if (!given)
        return r->rc;
    for (uint32_t i = 0; i < np; i++)
        given[i] = i < (uint32_t)a->n ? a->v[i] : tv_noarg();
    for (int k = 0; k < a->nkw; k++) {
        const tnode *kw = a->kwname[k];
        uint32_t i = 0;
        while (i < np && !(def->kid[1 + i]->lit.s.n == kw->lit.s.n &&
                           memcmp(def->kid[1 + i]->lit.s.p, kw->lit.s.p, kw->lit.s.n) == 0))
            i++;
        if (i == np)
            return tpl_fail(r, IFLOW_EINVAL, "macro '%s' takes no keyword argument '%s'", name,
                            iflow_quoten(kw->lit.s.p, kw->lit.s.n));
        if (given[i].t != TV_NOARG)
            return tpl_fail(r, IFLOW_EINVAL, "macro '%s' got multiple values for argument '%s'", name,
                            iflow_quoten(kw->lit.s.p, kw->lit.s.n));
        given[i] = a->kw[k];
    }
    for (uint32_t i = 0; i < np; i++) { /* defaults see the parameters before them */
        const tnode *p = def->kid[1 + i];
        tval v = given[i];
        if (v.t == TV_NOARG && p->kid[0])
            IFLOW_TRY(eval(r, p->kid[0], &v));
        else if (v.t == TV_NOARG)
            v = tv_undef(p->lit.s.p, p->lit.s.n);
        IFLOW_TRY(scope_set(r, sc, p->lit.s.p, p->lit.s.n, v));
    }
    return 0;
}

/* A macro's text; `caller` (unless TV_NOARG) is a call block's body, as a macro. */
static int call_macro(tpl_render *r, const tpl_macro *m, tpl_args *a, tval caller, tval *out)
{
    tpl_scope *sc = scope_new(r, m->scope), *saved = r->scope;
    if (!sc)
        return r->rc;
    r->scope = sc;
    int rc = macro_args(r, m, a, sc);
    if (rc == 0 && caller.t != TV_NOARG)
        rc = scope_set(r, sc, "caller", 6, caller);
    r->scope = saved;
    return rc < 0 ? rc : capture(r, m->def->kid[0], sc, out);
}

int tpl_call(tpl_render *r, tval fn, tpl_args *a, tval *out)
{
    switch (fn.t) {
    case TV_FUNC: return tpl_call_global(r, fn.fn, a, out);
    case TV_METHOD: return tpl_call_method(r, fn.meth, a, out);
    case TV_MACRO: return call_macro(r, fn.m, a, tv_noarg(), out);
    case TV_UNDEF:
        if (!fn.s.n)
            return tpl_fail(r, IFLOW_EINVAL, "an undefined value was called");
        return tpl_fail(r, IFLOW_EINVAL, "'%s' is undefined (called as a function)", iflow_quoten(fn.s.p, fn.s.n));
    default: return tpl_fail(r, IFLOW_EINVAL, "'%s' object is not callable", tpl_type_name(fn));
    }
}

/* ---- expressions ---------------------------------------------------------------------------- */

static int compare_op(tpl_render *r, int op, tval a, tval b, int *res)
{
    static const char *const text[] = {[OP_LT] = "<", [OP_LE] = "<=", [OP_GT] = ">", [OP_GE] = ">="};
    int sign, eq;
    switch (op) {
    case OP_EQ: case OP_NE:
        if ((eq = tpl_equal(r, a, b)) < 0)
            return eq;
        *res = op == OP_EQ ? eq : !eq;
        return 0;
    case OP_IN: case OP_NOTIN:
        IFLOW_TRY(tpl_contains(r, b, a, res));
        if (op == OP_NOTIN)
            *res = !*res;
        return 0;
    default:
        IFLOW_TRY(tpl_compare(r, text[op], a, b, &sign));
        *res = op == OP_LT ? sign < 0 : op == OP_LE ? sign <= 0 : op == OP_GT ? sign > 0 : sign >= 0;
        return 0;
    }
}

static int eval_compare(tpl_render *r, const tnode *x, tval *out)
{
    tval left, right;
    IFLOW_TRY(eval(r, x->kid[0], &left));
    for (uint32_t i = 1; i < x->n; i++) {
        int res;
        IFLOW_TRY(eval(r, x->kid[i]->kid[0], &right));
        r->at = x->kid[i];
        IFLOW_TRY(compare_op(r, x->kid[i]->op, left, right, &res));
        if (!res) {
            *out = tv_bool(0);
            return 0;
        }
        left = right;
    }
    *out = tv_bool(1);
    return 0;
}

static int eval_concat(tpl_render *r, const tnode *x, tval *out)
{
    tpl_buf b = {0};
    int rc = 0;
    for (uint32_t i = 0; i < x->n && rc == 0; i++) {
        tval v;
        rc = eval(r, x->kid[i], &v);
        if (rc == 0)
            rc = tpl_print(r, &b, v, 0);
    }
    if (rc < 0) {
        tpl_buf_free(r, &b);
        return rc;
    }
    return tpl_buf_take(r, &b, out);
}

static int eval_unary(tpl_render *r, const tnode *x, tval *out)
{
    tval v;
    IFLOW_TRY(eval(r, x->kid[0], &v));
    r->at = x;
    int neg = x->kind == N_NEG;
    if (v.t == TV_BOOL)
        v = tv_int(v.b);
    if (v.t == TV_INT) {
        if (neg && v.i == -9223372036854775807LL - 1)
            return tpl_fail(r, IFLOW_ERANGE, "integer overflow (integers are 64-bit here)");
        *out = tv_int(neg ? -v.i : v.i);
        return 0;
    }
    if (v.t == TV_FLOAT) {
        *out = tv_float(neg ? -v.f : v.f);
        return 0;
    }
    if (v.t == TV_UNDEF)
        return undefined_error(r, v);
    return tpl_fail(r, IFLOW_EINVAL, "bad operand type for unary %c: '%s'", neg ? '-' : '+', tpl_type_name(v));
}

static int eval_item(tpl_render *r, const tnode *x, tval *out)
{
    tval obj, key;
    IFLOW_TRY(eval(r, x->kid[0], &obj));
    const tnode *k = x->kid[1];
    if (k->kind != N_SLICE) {
        IFLOW_TRY(eval(r, k, &key));
        r->at = x;
        return tpl_getitem(r, obj, key, out);
    }
    tval part[3];
    for (int i = 0; i < 3; i++) {
        part[i] = tv_none();
        if (k->kid[i])
            IFLOW_TRY(eval(r, k->kid[i], &part[i]));
    }
    r->at = x;
    if (obj.t == TV_UNDEF)
        return undefined_error(r, obj);
    return slice(r, obj, part, r->folding, out);
}

static int eval_seq(tpl_render *r, const tnode *x, tval *out)
{
    if (x->kind == N_DICT) {
        tv_dict *d = tpl_dict_new(r, x->n / 2);
        if (!d)
            return r->rc;
        for (uint32_t i = 0; i + 1 < x->n; i += 2) {
            tval k, v;
            IFLOW_TRY(eval(r, x->kid[i], &k));
            IFLOW_TRY(eval(r, x->kid[i + 1], &v));
            r->at = x->kid[i];
            IFLOW_TRY(tpl_dict_set(r, d, k, v));
        }
        *out = tv_map(d);
        return 0;
    }
    tv_list *l = tpl_list_new(r, x->n);
    if (!l)
        return r->rc;
    for (uint32_t i = 0; i < x->n; i++) {
        tval v;
        IFLOW_TRY(eval(r, x->kid[i], &v));
        IFLOW_TRY(tpl_list_push(r, l, v));
    }
    *out = tv_seq(l, x->kind == N_TUPLE);
    return 0;
}

static int eval_filter_or_test(tpl_render *r, const tnode *x, tval *out)
{
    tval v;
    tpl_args a;
    IFLOW_TRY(eval(r, x->kid[0], &v));
    IFLOW_TRY(eval_args(r, x, 1, &a));
    r->at = x;
    const char *kind = x->kind == N_FILTER ? "filter" : "test";
    if (x->id < 0)
        return tpl_fail(r, IFLOW_EINVAL, "no %s named '%s'", kind, iflow_quoten(x->lit.s.p, x->lit.s.n));
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)x->lit.s.n, x->lit.s.p);
    if (x->kind == N_FILTER)
        return tpl_filter(r, x->id, name, v, &a, out);
    int res;
    IFLOW_TRY(tpl_test(r, x->id, name, v, &a, &res));
    *out = tv_bool(res);
    return 0;
}

static int eval_node(tpl_render *r, const tnode *x, tval *out)
{
    tval a, b;
    tpl_args args;
    switch (x->kind) {
    case N_CONST: *out = x->lit; return 0;
    case N_NAME: return lookup(r, x->lit.s.p, x->lit.s.n, out);
    case N_HOLE: *out = r->hole; return 0;
    case N_ATTR:
        IFLOW_TRY(eval(r, x->kid[0], &a));
        r->at = x;
        return tpl_getattr(r, a, x->lit.s.p, x->lit.s.n, out);
    case N_ITEM: return eval_item(r, x, out);
    case N_CALL:
        IFLOW_TRY(eval(r, x->kid[0], &a));
        IFLOW_TRY(eval_args(r, x, 1, &args));
        r->at = x;
        return tpl_call(r, a, &args, out);
    case N_FILTER: case N_TEST: return eval_filter_or_test(r, x, out);
    case N_NEG: case N_POS: return eval_unary(r, x, out);
    case N_NOT:
        IFLOW_TRY(eval(r, x->kid[0], &a));
        *out = tv_bool(!tpl_truthy(a));
        return 0;
    case N_BIN:
        IFLOW_TRY(eval(r, x->kid[0], &a));
        IFLOW_TRY(eval(r, x->kid[1], &b));
        r->at = x;
        return tpl_binop(r, x->op, a, b, out);
    case N_CONCAT: return eval_concat(r, x, out);
    case N_CMP: return eval_compare(r, x, out);
    case N_AND: case N_OR:
        IFLOW_TRY(eval(r, x->kid[0], &a));
        if (tpl_truthy(a) == (x->kind == N_OR)) {
            *out = a;
            return 0;
        }
        return eval(r, x->kid[1], out);
    case N_COND:
        IFLOW_TRY(eval(r, x->kid[1], &a));
        if (tpl_truthy(a))
            return eval(r, x->kid[0], out);
        if (x->kid[2])
            return eval(r, x->kid[2], out);
        *out = tv_undef("", 0);
        return 0;
    case N_LIST: case N_TUPLE: case N_DICT: return eval_seq(r, x, out);
    default:
        r->at = x;
        return tpl_fail(r, IFLOW_EINVAL, "internal error: node %d is not an expression", x->kind);
    }
}

static int enter(tpl_render *r, const tnode *x)
{
    if (++r->depth > IFLOW_TEMPLATE_MAX_CALL_DEPTH) {
        r->at = x;
        return tpl_fail(r, IFLOW_ERANGE, "rendering nests more than %d deep (a macro calling itself?)",
                        IFLOW_TEMPLATE_MAX_CALL_DEPTH);
    }
    return tpl_spend(r, 1);
}

/* Python's has_safe_repr: what jinja2 accepts as a value computed while it compiles. */
static int safe_repr(tpl_render *r, tval v, int depth)
{
    if (v.t == TV_NONE || v.t == TV_BOOL || v.t == TV_INT || v.t == TV_FLOAT || v.t == TV_STR)
        return 1;
    if (depth > IFLOW_TEMPLATE_MAX_DEPTH || !((v.t == TV_LIST && !v.l->view) || v.t == TV_TUPLE || v.t == TV_DICT))
        return 0;
    size_t n = v.t == TV_DICT ? v.d->n : v.l->n;
    tpl_spend(r, n / 16); /* an overrun shows at the next step */
    for (size_t i = 0; i < n; i++)
        if (v.t == TV_DICT ? !safe_repr(r, v.d->k[i], depth + 1) || !safe_repr(r, v.d->v[i], depth + 1)
                           : !safe_repr(r, v.l->v[i], depth + 1))
            return 0;
    return 1;
}

/* An expression of constants only, as jinja2 computes it: when it compiles, with its getitem
 * even for slices, if that works and gives a value it can write into the code (any value, for
 * the whole of a {{ }}); else at render time, its parts each computed the same way first. */
static int eval_folded(tpl_render *r, const tnode *x, tval *out, int any_value)
{
    r->folding = 1;
    int rc = eval_node(r, x, out);
    r->folding = 0;
    if (rc == 0 && (any_value || safe_repr(r, *out, 0)))
        return 0;
    if (rc == IFLOW_ERANGE || rc == IFLOW_ENOMEM) /* a limit: no second try */
        return rc;
    return eval_node(r, x, out);
}

static int eval_as(tpl_render *r, const tnode *x, tval *out, int any_value)
{
    int rc = enter(r, x);
    if (rc == 0 && r->folding && !x->konst) /* the side of an and, or, if that is not constant */
        rc = NOT_CONSTANT;
    else if (rc == 0)
        rc = x->konst && !r->folding ? eval_folded(r, x, out, any_value) : eval_node(r, x, out);
    r->depth--;
    return rc;
}

static int eval(tpl_render *r, const tnode *x, tval *out)
{
    return eval_as(r, x, out, 0);
}

/* ---- statements ----------------------------------------------------------------------------- */

static int assign(tpl_render *r, const tnode *target, tval v)
{
    if (target->kind == N_NAME)
        return scope_set(r, r->scope, target->lit.s.p, target->lit.s.n, v);
    r->at = target;
    if (target->kind == N_NSREF) {
        tval ns;
        IFLOW_TRY(lookup(r, target->kid[0]->lit.s.p, target->kid[0]->lit.s.n, &ns));
        if (ns.t != TV_NS)
            return tpl_fail(r, IFLOW_EINVAL, "cannot assign attribute on non-namespace object");
        return tpl_dict_set(r, ns.d, target->lit, v);
    }
    if (v.t != TV_LIST && v.t != TV_TUPLE && v.t != TV_STR && v.t != TV_DICT)
        return tpl_fail(r, IFLOW_EINVAL, "cannot unpack non-iterable %s object", tpl_type_name(v));
    tv_list *items;
    IFLOW_TRY(tpl_items(r, v, &items));
    if (items->n < target->n)
        return tpl_fail(r, IFLOW_EINVAL, "not enough values to unpack (expected %u, got %zu)", target->n, items->n);
    if (items->n > target->n)
        return tpl_fail(r, IFLOW_EINVAL, "too many values to unpack (expected %u)", target->n);
    for (uint32_t i = 0; i < target->n; i++)
        IFLOW_TRY(assign(r, target->kid[i], items->v[i]));
    return 0;
}

/* The items a loop runs over: all, or those its `if` keeps (tested with the target bound). */
static int loop_items(tpl_render *r, const tnode *x, tv_list **items)
{
    tval seq;
    IFLOW_TRY(eval(r, x->kid[1], &seq));
    r->at = x->kid[1];
    IFLOW_TRY(tpl_items(r, seq, items));
    if (!x->kid[2])
        return 0;
    tv_list *kept = tpl_list_new(r, 0);
    tpl_scope *outer = r->scope, *sc = scope_new(r, outer);
    if (!kept || !sc)
        return r->rc;
    int rc = 0;
    for (size_t i = 0; i < (*items)->n && rc == 0; i++) {
        tval keep;
        sc->n = 0;
        r->scope = sc;
        rc = assign(r, x->kid[0], (*items)->v[i]);
        if (rc == 0)
            rc = eval(r, x->kid[2], &keep);
        r->scope = outer;
        if (rc == 0 && tpl_truthy(keep))
            rc = tpl_list_push(r, kept, (*items)->v[i]);
    }
    *items = kept;
    return rc;
}

static int exec_for(tpl_render *r, const tnode *x)
{
    tv_list *items;
    IFLOW_TRY(loop_items(r, x, &items));
    tpl_loop *loop = tpl_alloc(r, sizeof *loop);
    if (!loop)
        return r->rc;
    *loop = (tpl_loop){.items = items, .depth = 1};
    tval lv = {.t = TV_LOOP};
    lv.loop = loop;
    tpl_scope *outer = r->scope, *sc = NULL;
    int rc = 0, completed = 0;
    for (size_t i = 0; i < items->n; i++) {
        loop->i = i;
        if (!sc || sc->captured) {
            if (!(sc = scope_new(r, outer))) {
                rc = r->rc;
                break;
            }
        }
        sc->n = 0;
        r->scope = sc;
        if ((rc = scope_set(r, sc, "loop", 4, lv)) < 0 || (rc = assign(r, x->kid[0], items->v[i])) < 0)
            break;
        rc = exec(r, x->kid[3]);
        if (rc < 0 || rc == FLOW_BREAK)
            break;
        completed |= rc == 0; /* jinja2 runs else unless a turn reached the end of the body */
        rc = 0;
    }
    r->scope = outer;
    if (rc < 0)
        return rc;
    if (completed || !x->kid[4])
        return 0;
    if (!(sc = scope_new(r, outer)))
        return r->rc;
    r->scope = sc;
    rc = exec(r, x->kid[4]);
    r->scope = outer;
    return rc;
}

static int exec_if(tpl_render *r, const tnode *x)
{
    uint32_t i = 0;
    for (; i + 1 < x->n; i += 2) {
        tval c;
        IFLOW_TRY(eval(r, x->kid[i], &c));
        if (tpl_truthy(c))
            return exec(r, x->kid[i + 1]);
    }
    return i < x->n ? exec(r, x->kid[i]) : 0;
}

static int exec_with(tpl_render *r, const tnode *x)
{
    uint32_t pairs = (x->n - 1) / 2;
    tval *vals = tpl_alloc(r, (pairs ? pairs : 1) * sizeof *vals);
    if (!vals)
        return r->rc;
    for (uint32_t i = 0; i < pairs; i++) /* all in the outer scope */
        IFLOW_TRY(eval(r, x->kid[2 + 2 * i], &vals[i]));
    tpl_scope *outer = r->scope, *sc = scope_new(r, outer);
    if (!sc)
        return r->rc;
    r->scope = sc;
    int rc = 0;
    for (uint32_t i = 0; i < pairs && rc == 0; i++)
        rc = assign(r, x->kid[1 + 2 * i], vals[i]);
    if (rc == 0)
        rc = exec(r, x->kid[0]);
    r->scope = outer;
    return rc;
}

/* A set block's or filter block's text, through its filters (N_HOLE stands for the text). */
static int filtered_text(tpl_render *r, const tnode *body, const tnode *filters, tval *out)
{
    int rc = capture(r, body, r->scope, out);
    if (rc != 0 || !filters) /* a break or continue in the body leaves the loop around it */
        return rc;
    r->hole = *out;
    return eval(r, filters, out);
}

static tval macro_here(tpl_render *r, const tnode *def, tpl_macro *m)
{
    m->def = def;
    m->scope = r->scope;
    r->scope->captured = 1;
    tval v = {.t = TV_MACRO};
    v.m = m;
    return v;
}

static int exec_call_block(tpl_render *r, const tnode *x)
{
    const tnode *call = x->kid[0];
    tval fn, text;
    tpl_args args;
    IFLOW_TRY(eval(r, call->kid[0], &fn));
    IFLOW_TRY(eval_args(r, call, 1, &args));
    r->at = x;
    if (fn.t != TV_MACRO)
        return tpl_fail(r, IFLOW_EINVAL, "a call block must call a macro, not a %s", tpl_type_name(fn));
    tpl_macro *caller = tpl_alloc(r, sizeof *caller);
    if (!caller)
        return r->rc;
    IFLOW_TRY(call_macro(r, fn.m, &args, macro_here(r, x->kid[1], caller), &text));
    return tpl_print(r, r->out, text, 0);
}

static int exec_node(tpl_render *r, const tnode *x)
{
    tval v;
    int rc;
    switch (x->kind) {
    case N_BODY:
        for (uint32_t i = 0; i < x->n; i++)
            if ((rc = exec(r, x->kid[i])) != 0)
                return rc;
        return 0;
    case N_DATA: return tpl_buf_put(r, r->out, x->lit.s.p, x->lit.s.n);
    case N_EMIT:
        IFLOW_TRY(eval_as(r, x->kid[0], &v, 1));
        r->at = x;
        return tpl_print(r, r->out, v, 0);
    case N_IF: return exec_if(r, x);
    case N_FOR: return exec_for(r, x);
    case N_SET:
        IFLOW_TRY(eval(r, x->kid[1], &v));
        return assign(r, x->kid[0], v);
    case N_SETBLOCK:
        if ((rc = filtered_text(r, x->kid[1], x->kid[2], &v)) != 0)
            return rc;
        return assign(r, x->kid[0], v);
    case N_FILTERBLOCK:
        if ((rc = filtered_text(r, x->kid[1], x->kid[0], &v)) != 0)
            return rc;
        r->at = x;
        return tpl_print(r, r->out, v, 0);
    case N_MACRO: {
        tpl_macro *m = tpl_alloc(r, sizeof *m);
        if (!m)
            return r->rc;
        return scope_set(r, r->scope, x->lit.s.p, x->lit.s.n, macro_here(r, x, m));
    }
    case N_CALLBLOCK: return exec_call_block(r, x);
    case N_WITH: return exec_with(r, x);
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    default:
        r->at = x;
        return tpl_fail(r, IFLOW_EINVAL, "internal error: node %d is not a statement", x->kind);
    }
}

static int exec(tpl_render *r, const tnode *x)
{
    int rc = enter(r, x);
    if (rc == 0)
        rc = exec_node(r, x);
    r->depth--;
    return rc;
}

int tpl_render_tree(tpl_render *r)
{
    if (!(r->scope = scope_new(r, NULL)))
        return r->rc;
    int rc = exec(r, r->t->root);
    return rc > 0 ? 0 : rc;
}
