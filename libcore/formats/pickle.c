/* pickle.c -- see pickle.h. Opcodes: CPython Lib/pickletools.py; torch side:
 * torch/serialization.py (persistent_id) and torch/_utils.py (_rebuild_tensor_v2). */
#include "pickle.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/base/quote.h"
#include "zip.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEPTH 200      /* nesting of the object tree walked for names */
#define MAX_NAME 4096      /* bytes of a tensor name */
#define NIL UINT32_MAX

struct iflow_pt {
    char *path;
    const unsigned char *base;
    size_t size;
    int mapped;
    iflow_zip zip;
    char *prefix;                  /* "<archive>/" */
    iflow_strided_tensor *t;
    size_t n, cap;
    const iflow_strided_tensor **by_name;
    char **strings;                /* names and member names we own */
    size_t n_strings, cap_strings;
    json_t *data;
};

/* ---- storage types -------------------------------------------------------------------------- */

static const struct {
    const char *storage, *dtype_name;
    int size, dt;
} storage_types[] = {
    {"FloatStorage", "F32", 4, IFLOW_DT_F32},         {"HalfStorage", "F16", 2, IFLOW_DT_F16},
    {"BFloat16Storage", "BF16", 2, IFLOW_DT_BF16},    {"DoubleStorage", "F64", 8, -1},
    {"LongStorage", "I64", 8, -1},                    {"IntStorage", "I32", 4, -1},
    {"ShortStorage", "I16", 2, -1},                   {"CharStorage", "I8", 1, -1},
    {"ByteStorage", "U8", 1, -1},                     {"BoolStorage", "BOOL", 1, -1},
    {"ComplexFloatStorage", "C64", 8, -1},            {"ComplexDoubleStorage", "C128", 16, -1},
    {"Float8_e4m3fnStorage", "F8_E4M3", 1, -1},       {"Float8_e5m2Storage", "F8_E5M2", 1, -1},
    {"UntypedStorage", "U8", 1, -1},
};

/* ---- the interpreter's values ----------------------------------------------------------------- */

enum {
    K_NONE, K_BOOL, K_INT, K_BIGINT, K_FLOAT, K_STR, K_BYTES, K_TUPLE, K_LIST, K_DICT, K_SET,
    K_GLOBAL, K_STORAGE, K_TENSOR, K_OBJ,
};

typedef struct {
    uint8_t kind;
    uint8_t visiting;   /* on the walk's current path (cycle guard) */
    uint32_t n, cap;    /* containers: kids (a dict holds key, value, key, value, ...) */
    uint32_t *kid;
    int64_t i;          /* INT, BOOL; STORAGE: numel; TENSOR: index into vm.tensors */
    double f;
    const char *s, *s2; /* STR/BYTES: s; GLOBAL: module s, name s2; STORAGE: key s */
    size_t len, len2;
    uint32_t a;         /* OBJ: the callable (a GLOBAL or anything); STORAGE: storage_types[] */
    const unsigned char *data; /* STORAGE: its bytes */
    const char *member;        /* STORAGE: its zip member (owned by pt->strings) */
} pnode;

typedef struct {
    uint32_t storage;   /* node */
    int n_dims;
    int64_t offset, shape[IFLOW_SRC_MAX_DIMS], stride[IFLOW_SRC_MAX_DIMS];
} tdef;

typedef struct {
    iflow_pt *pt;
    const char *pkl_name;           /* "<archive>/data.pkl" for messages */
    const unsigned char *p;
    size_t n, pos, op_pos;
    pnode *nodes;
    size_t n_nodes, cap_nodes;
    uint32_t *stack;
    size_t sp, cap_stack;
    size_t *marks;
    size_t n_marks, cap_marks;
    uint32_t *memo;                 /* NIL where unset */
    size_t cap_memo, memo_count;
    tdef *tensors;
    size_t n_tensors, cap_tensors;
    size_t visits, max_visits;
    char path[MAX_NAME];
} vm;

/* Grow *arr (of elements `size` bytes, capacity *cap) to hold `need`. */
static int grow(void *arr, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *p = c > SIZE_MAX / size ? NULL : realloc(*(void **)arr, c * size);
    if (!p)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory running a pickle (%zu items)", need);
    *(void **)arr = p;
    *cap = c;
    return 0;
}

static int fail(vm *v, int code, const char *what)
{
    return iflow_seterr(code, "%s at byte %zu of '%s' in '%s'", what, v->op_pos,
                        iflow_quote(v->pkl_name), v->pt->path);
}

static int new_node(vm *v, int kind, uint32_t *out)
{
    if (v->n_nodes >= NIL - 1)
        return fail(v, IFLOW_ERANGE, "too many pickle values");
    int rc = grow(&v->nodes, &v->cap_nodes, v->n_nodes + 1, sizeof *v->nodes);
    if (rc < 0)
        return rc;
    memset(&v->nodes[v->n_nodes], 0, sizeof *v->nodes);
    v->nodes[v->n_nodes].kind = (uint8_t)kind;
    *out = (uint32_t)v->n_nodes++;
    return 0;
}

static int push(vm *v, uint32_t node)
{
    int rc = grow(&v->stack, &v->cap_stack, v->sp + 1, sizeof *v->stack);
    if (rc == 0)
        v->stack[v->sp++] = node;
    return rc;
}

/* Push a new node of `kind`; *out (optional) receives it. */
static int push_new(vm *v, int kind, pnode **out)
{
    uint32_t id;
    int rc = new_node(v, kind, &id);
    if (rc == 0)
        rc = push(v, id);
    if (rc == 0 && out)
        *out = &v->nodes[id];
    return rc;
}

static int pop(vm *v, uint32_t *out)
{
    size_t floor = v->n_marks ? v->marks[v->n_marks - 1] : 0;
    if (v->sp <= floor)
        return fail(v, IFLOW_EFORMAT, "pickle stack underflow");
    *out = v->stack[--v->sp];
    return 0;
}

static int top(vm *v, uint32_t *out)
{
    size_t floor = v->n_marks ? v->marks[v->n_marks - 1] : 0;
    if (v->sp <= floor)
        return fail(v, IFLOW_EFORMAT, "pickle stack underflow");
    *out = v->stack[v->sp - 1];
    return 0;
}

/* The items above the last mark: their count into *k, their start into *from; pops the mark. */
static int pop_mark(vm *v, size_t *from, size_t *k)
{
    if (v->n_marks == 0)
        return fail(v, IFLOW_EFORMAT, "pickle mark missing");
    *from = v->marks[--v->n_marks];
    *k = v->sp - *from;
    return 0;
}

/* Append the k stack items from position `from` to container `node`'s kids. */
static int add_kids(vm *v, uint32_t node, size_t from, size_t k)
{
    if (k == 0)
        return 0;
    const uint32_t *kids = v->stack + from;
    pnode *c = &v->nodes[node];
    size_t cap = c->cap;
    if ((size_t)c->n + k >= NIL)
        return fail(v, IFLOW_ERANGE, "pickle container too large");
    int rc = grow(&c->kid, &cap, c->n + k, sizeof *c->kid);
    if (rc < 0)
        return rc;
    c->cap = (uint32_t)cap;
    memcpy(c->kid + c->n, kids, k * sizeof *kids);
    c->n += (uint32_t)k;
    return 0;
}

/* ---- reading operands ----------------------------------------------------------------------- */

static int need(vm *v, size_t k)
{
    if (v->n - v->pos < k)
        return fail(v, IFLOW_ETRUNC, "pickle ends inside an opcode");
    return 0;
}

static uint64_t le(const unsigned char *p, int k)
{
    uint64_t x = 0;
    for (int i = k - 1; i >= 0; i--)
        x = x << 8 | p[i];
    return x;
}

/* A little-endian unsigned operand of k bytes. */
static int arg_uint(vm *v, int k, uint64_t *out)
{
    int rc = need(v, (size_t)k);
    if (rc == 0) {
        *out = le(v->p + v->pos, k);
        v->pos += (size_t)k;
    }
    return rc;
}

/* A newline-terminated operand (text opcodes). */
static int arg_line(vm *v, const char **s, size_t *len)
{
    const unsigned char *nl = memchr(v->p + v->pos, '\n', v->n - v->pos);
    if (!nl)
        return fail(v, IFLOW_ETRUNC, "pickle ends inside a text operand");
    *s = (const char *)v->p + v->pos;
    *len = (size_t)(nl - (v->p + v->pos));
    v->pos += *len + 1;
    return 0;
}

static int line_int(vm *v, int64_t *out)
{
    const char *s;
    size_t len;
    int rc = arg_line(v, &s, &len);
    if (rc < 0)
        return rc;
    char buf[32];
    if (len == 0 || len >= sizeof buf)
        return fail(v, IFLOW_EFORMAT, "bad integer operand");
    memcpy(buf, s, len);
    buf[len] = 0;
    char *end;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (*end || errno)
        return fail(v, IFLOW_EFORMAT, "bad integer operand");
    *out = x;
    return 0;
}

/* ---- opcodes -------------------------------------------------------------------------------- */

static int op_int(vm *v, int64_t x, int kind)
{
    pnode *n;
    int rc = push_new(v, kind, &n);
    if (rc == 0)
        n->i = x;
    return rc;
}

/* LONG1/LONG4: k bytes of two's complement, little-endian. */
static int op_long(vm *v, int width)
{
    uint64_t k;
    int rc = arg_uint(v, width, &k);
    if (rc == 0)
        rc = need(v, k);
    if (rc < 0)
        return rc;
    const unsigned char *p = v->p + v->pos;
    v->pos += k;
    if (k > 8)
        return op_int(v, 0, K_BIGINT);
    uint64_t x = k ? le(p, (int)k) : 0;
    if (k && k < 8 && (p[k - 1] & 0x80))
        x |= ~(uint64_t)0 << (8 * k); /* sign-extend */
    return op_int(v, (int64_t)x, K_INT);
}

static int op_float(vm *v)
{
    int rc = need(v, 8);
    if (rc < 0)
        return rc;
    uint64_t bits = 0;
    for (int i = 0; i < 8; i++) /* big-endian */
        bits = bits << 8 | v->p[v->pos + i];
    v->pos += 8;
    pnode *n;
    rc = push_new(v, K_FLOAT, &n);
    if (rc == 0)
        memcpy(&n->f, &bits, 8);
    return rc;
}

/* A string or bytes operand with a length of `width` bytes. */
static int op_str(vm *v, int width, int kind)
{
    uint64_t len;
    int rc = arg_uint(v, width, &len);
    if (rc == 0)
        rc = need(v, len);
    if (rc < 0)
        return rc;
    pnode *n;
    rc = push_new(v, kind, &n);
    if (rc == 0) {
        n->s = (const char *)v->p + v->pos;
        n->len = (size_t)len;
    }
    v->pos += len;
    return rc;
}

/* TUPLE (from the mark) and TUPLE1..3 (k items), LIST, DICT, FROZENSET likewise. */
static int op_collect(vm *v, int kind, size_t k, int from_mark)
{
    size_t from = v->sp - k;
    int rc = 0;
    if (from_mark)
        rc = pop_mark(v, &from, &k);
    else if (v->sp < k || (v->n_marks && v->sp - k < v->marks[v->n_marks - 1]))
        rc = fail(v, IFLOW_EFORMAT, "pickle stack underflow");
    if (rc == 0 && kind == K_DICT && k % 2)
        rc = fail(v, IFLOW_EFORMAT, "odd number of items for a pickle dict");
    uint32_t id;
    if (rc == 0)
        rc = new_node(v, kind, &id);
    if (rc == 0)
        rc = add_kids(v, id, from, k);
    if (rc < 0)
        return rc;
    v->sp = from;
    return push(v, id);
}

/* APPEND(S), SETITEM(S), ADDITEMS: add the items above the mark (or the top k) to a container. */
static int op_extend(vm *v, int kind, size_t k, int from_mark)
{
    size_t from = v->sp - k;
    int rc = 0;
    if (from_mark)
        rc = pop_mark(v, &from, &k);
    else if (v->sp < k + 1 || (v->n_marks && v->sp - k - 1 < v->marks[v->n_marks - 1]))
        rc = fail(v, IFLOW_EFORMAT, "pickle stack underflow");
    if (rc == 0 && from == (v->n_marks ? v->marks[v->n_marks - 1] : 0))
        rc = fail(v, IFLOW_EFORMAT, "pickle stack underflow");
    if (rc < 0)
        return rc;
    uint32_t target = v->stack[from - 1];
    int tk = v->nodes[target].kind;
    if (kind == K_DICT && k % 2)
        return fail(v, IFLOW_EFORMAT, "odd number of items for a pickle dict");
    if (tk != kind && !(kind == K_LIST && tk == K_OBJ) && !(kind == K_DICT && tk == K_OBJ))
        return fail(v, IFLOW_EFORMAT, kind == K_LIST  ? "pickle append to a non-list"
                                      : kind == K_DICT ? "pickle setitem on a non-dict"
                                                       : "pickle additems on a non-set");
    if (tk == kind)
        rc = add_kids(v, target, from, k);
    v->sp = from;
    return rc;
}

static int memo_key(vm *v, uint64_t key, int store)
{
    if (key > v->n)
        return fail(v, IFLOW_EUNSUPPORTED, "pickle memo key too large");
    size_t cap = v->cap_memo;
    if (store && key >= cap) {
        int rc = grow(&v->memo, &cap, (size_t)key + 1, sizeof *v->memo);
        if (rc < 0)
            return rc;
        for (size_t i = v->cap_memo; i < cap; i++)
            v->memo[i] = NIL;
        v->cap_memo = cap;
    }
    if (!store && (key >= v->cap_memo || v->memo[key] == NIL))
        return fail(v, IFLOW_EFORMAT, "pickle memo key not set");
    return 0;
}

static int op_put(vm *v, uint64_t key)
{
    uint32_t x = 0;
    int rc = top(v, &x);
    if (rc == 0)
        rc = memo_key(v, key, 1);
    if (rc == 0) {
        v->memo[key] = x;
        v->memo_count++;
    }
    return rc;
}

static int op_get(vm *v, uint64_t key)
{
    int rc = memo_key(v, key, 0);
    return rc < 0 ? rc : push(v, v->memo[key]);
}

static int op_global_text(vm *v)
{
    const char *m = NULL, *n = NULL;
    size_t lm = 0, ln = 0;
    int rc = arg_line(v, &m, &lm);
    if (rc == 0)
        rc = arg_line(v, &n, &ln);
    pnode *g;
    if (rc == 0)
        rc = push_new(v, K_GLOBAL, &g);
    if (rc == 0) {
        g->s = m, g->len = lm, g->s2 = n, g->len2 = ln;
    }
    return rc;
}

static int op_stack_global(vm *v)
{
    uint32_t m, n;
    int rc = pop(v, &n);
    if (rc == 0)
        rc = pop(v, &m);
    if (rc == 0 && (v->nodes[m].kind != K_STR || v->nodes[n].kind != K_STR))
        rc = fail(v, IFLOW_EFORMAT, "pickle STACK_GLOBAL needs two strings");
    pnode *g;
    if (rc == 0)
        rc = push_new(v, K_GLOBAL, &g);
    if (rc == 0) {
        g->s = v->nodes[m].s, g->len = v->nodes[m].len;
        g->s2 = v->nodes[n].s, g->len2 = v->nodes[n].len;
    }
    return rc;
}

static int str_is(const char *s, size_t len, const char *lit)
{
    return len == strlen(lit) && memcmp(s, lit, len) == 0;
}

static int is_global(const pnode *g, const char *module, const char *name)
{
    return g->kind == K_GLOBAL && str_is(g->s, g->len, module) && str_is(g->s2, g->len2, name);
}

static char *own_string(iflow_pt *pt, const char *a, size_t la, const char *b, size_t lb)
{
    if (grow(&pt->strings, &pt->cap_strings, pt->n_strings + 1, sizeof *pt->strings) < 0)
        return NULL;
    char *s = malloc(la + lb + 1);
    if (!s) {
        iflow_seterr(IFLOW_ENOMEM, "out of memory naming a tensor in '%s'", pt->path);
        return NULL;
    }
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    s[la + lb] = 0;
    pt->strings[pt->n_strings++] = s;
    return s;
}

/* BINPERSID: ("storage", torch.<T>Storage, key, location, numel) -> a checked storage. */
static int op_persid(vm *v)
{
    uint32_t id;
    int rc = pop(v, &id);
    if (rc < 0)
        return rc;
    const pnode *pid = &v->nodes[id];
    if (pid->kind != K_TUPLE || pid->n != 5 || v->nodes[pid->kid[0]].kind != K_STR ||
        !str_is(v->nodes[pid->kid[0]].s, v->nodes[pid->kid[0]].len, "storage") ||
        v->nodes[pid->kid[1]].kind != K_GLOBAL || v->nodes[pid->kid[2]].kind != K_STR ||
        v->nodes[pid->kid[4]].kind != K_INT || v->nodes[pid->kid[4]].i < 0)
        return fail(v, IFLOW_EUNSUPPORTED, "persistent id that is not a torch storage");
    const pnode *type = &v->nodes[pid->kid[1]], *key = &v->nodes[pid->kid[2]];
    int64_t numel = v->nodes[pid->kid[4]].i;
    int ti = -1;
    for (size_t i = 0; i < sizeof storage_types / sizeof storage_types[0]; i++)
        if (is_global(type, "torch", storage_types[i].storage))
            ti = (int)i;
    if (ti < 0) {
        char what[300];
        snprintf(what, sizeof what, "unsupported storage type '%s.%s'",
                 iflow_quoten(type->s, type->len > 60 ? 60 : type->len),
                 iflow_quoten(type->s2, type->len2 > 60 ? 60 : type->len2));
        return fail(v, IFLOW_EUNSUPPORTED, what);
    }
    if (key->len > 256 || memchr(key->s, 0, key->len) || memchr(key->s, '/', key->len))
        return fail(v, IFLOW_EFORMAT, "bad storage key");
    char dir[300];
    snprintf(dir, sizeof dir, "%sdata/", v->pt->prefix); /* the prefix has no '/' but its last */
    if (strlen(dir) != strlen(v->pt->prefix) + 5)
        return fail(v, IFLOW_EUNSUPPORTED, "archive name too long");
    char *member = own_string(v->pt, dir, strlen(dir), key->s, key->len);
    if (!member)
        return IFLOW_ENOMEM;
    const void *data;
    size_t size;
    rc = iflow_zip_find_stored(&v->pt->zip, member, &data, &size);
    if (rc < 0)
        return iflow_preperr(rc, "storage '%s' at byte %zu of '%s'",
                             iflow_quoten(key->s, key->len), v->op_pos, iflow_quote(v->pkl_name));
    uint64_t want;
    if (__builtin_mul_overflow((uint64_t)numel, (uint64_t)storage_types[ti].size, &want) ||
        want != size)
        return iflow_seterr(IFLOW_EFORMAT, "storage '%s' holds %zu bytes, not %" PRId64 " x %d "
                            "(%s) in '%s'", iflow_quote(member), size, numel, storage_types[ti].size,
                            storage_types[ti].storage, v->pt->path);
    const char *ks = key->s;
    size_t kl = key->len;
    pnode *s;
    rc = push_new(v, K_STORAGE, &s); /* moves the nodes: key and pid dangle from here */
    if (rc == 0) {
        s->s = ks, s->len = kl, s->i = numel, s->a = (uint32_t)ti;
        s->data = data;
        s->member = member;
    }
    return rc;
}

/* A tuple of at most 8 non-negative ints into out; its length into *n. */
static int int_tuple(vm *v, uint32_t id, int64_t *out, int *n)
{
    const pnode *t = &v->nodes[id];
    if (t->kind != K_TUPLE)
        return -1;
    if (t->n > IFLOW_SRC_MAX_DIMS)
        return -2;
    for (uint32_t i = 0; i < t->n; i++) {
        const pnode *x = &v->nodes[t->kid[i]];
        if (x->kind != K_INT || x->i < 0)
            return -1;
        out[i] = x->i;
    }
    *n = (int)t->n;
    return 0;
}

/* Every element the view reaches lies inside the storage. */
static int check_view(vm *v, const tdef *d)
{
    const pnode *s = &v->nodes[d->storage];
    uint64_t numel = 1, last = (uint64_t)d->offset, step;
    int overflow = 0;
    for (int i = 0; i < d->n_dims; i++)
        overflow |= __builtin_mul_overflow(numel, (uint64_t)d->shape[i], &numel);
    if (numel > 0)
        for (int i = 0; i < d->n_dims; i++) {
            overflow |= __builtin_mul_overflow((uint64_t)d->shape[i] - 1, (uint64_t)d->stride[i],
                                               &step);
            overflow |= __builtin_add_overflow(last, step, &last);
        }
    if (overflow)
        return fail(v, IFLOW_EFORMAT, "tensor size or stride overflows 64 bits");
    if (numel > 0 ? last >= (uint64_t)s->i : last > (uint64_t)s->i) {
        char what[300];
        snprintf(what, sizeof what, "tensor view reaches element %" PRIu64 " of storage '%s' "
                 "(%" PRId64 " elements)", last, iflow_quoten(s->s, s->len > 60 ? 60 : s->len),
                 s->i);
        return fail(v, IFLOW_EFORMAT, what);
    }
    return 0;
}

/* _rebuild_tensor_v2(storage, offset, size, stride, ...) -> a tensor node. */
static int make_tensor(vm *v, const pnode *args)
{
    tdef d;
    int ns = 0, nt = 0;
    if (args->kind != K_TUPLE || args->n < 4 || v->nodes[args->kid[0]].kind != K_STORAGE ||
        v->nodes[args->kid[1]].kind != K_INT || v->nodes[args->kid[1]].i < 0)
        return fail(v, IFLOW_EFORMAT, "malformed _rebuild_tensor arguments");
    d.storage = args->kid[0];
    d.offset = v->nodes[args->kid[1]].i;
    int r1 = int_tuple(v, args->kid[2], d.shape, &ns), r2 = int_tuple(v, args->kid[3], d.stride, &nt);
    if (r1 == -2 || r2 == -2)
        return fail(v, IFLOW_EUNSUPPORTED, "tensor with more than 8 dimensions");
    if (r1 < 0 || r2 < 0 || ns != nt)
        return fail(v, IFLOW_EFORMAT, "tensor size and stride are not matching int tuples");
    d.n_dims = ns;
    int rc = check_view(v, &d);
    if (rc == 0)
        rc = grow(&v->tensors, &v->cap_tensors, v->n_tensors + 1, sizeof *v->tensors);
    pnode *t;
    if (rc == 0)
        rc = push_new(v, K_TENSOR, &t);
    if (rc == 0) {
        v->tensors[v->n_tensors] = d;
        t->i = (int64_t)v->n_tensors++;
    }
    return rc;
}

/* REDUCE: recognise tensors, parameters and OrderedDict(); anything else is opaque. */
static int op_reduce(vm *v)
{
    uint32_t fn, args;
    int rc = pop(v, &args);
    if (rc == 0)
        rc = pop(v, &fn);
    if (rc < 0)
        return rc;
    const pnode *f = &v->nodes[fn], *a = &v->nodes[args];
    if (is_global(f, "torch._utils", "_rebuild_tensor_v2") ||
        is_global(f, "torch._utils", "_rebuild_tensor"))
        return make_tensor(v, a);
    if ((is_global(f, "torch._utils", "_rebuild_parameter") ||
         is_global(f, "torch._utils", "_rebuild_parameter_with_state")) &&
        a->kind == K_TUPLE && a->n >= 1 && v->nodes[a->kid[0]].kind == K_TENSOR)
        return push(v, a->kid[0]);
    if (is_global(f, "collections", "OrderedDict") && a->kind == K_TUPLE && a->n == 0)
        return push_new(v, K_DICT, NULL);
    pnode *o;
    rc = push_new(v, K_OBJ, &o);
    if (rc == 0)
        o->a = fn;
    return rc;
}

/* NEWOBJ / NEWOBJ_EX: an opaque object of class cls. */
static int op_newobj(vm *v, int n_args)
{
    uint32_t x, cls = 0;
    int rc = 0;
    for (int i = 0; i < n_args && rc == 0; i++)
        rc = pop(v, &x);
    if (rc == 0)
        rc = pop(v, &cls);
    pnode *o;
    if (rc == 0)
        rc = push_new(v, K_OBJ, &o);
    if (rc == 0)
        o->a = cls;
    return rc;
}

static int op_build(vm *v)
{
    uint32_t state, obj;
    int rc = pop(v, &state);
    return rc < 0 ? rc : top(v, &obj); /* the state is dropped: names come from keys only */
}

static int op_dup(vm *v)
{
    uint32_t x;
    int rc = top(v, &x);
    return rc < 0 ? rc : push(v, x);
}

static int op_mark(vm *v)
{
    int rc = grow(&v->marks, &v->cap_marks, v->n_marks + 1, sizeof *v->marks);
    if (rc == 0)
        v->marks[v->n_marks++] = v->sp;
    return rc;
}

static int op_pop_mark(vm *v)
{
    size_t from = 0, k;
    int rc = pop_mark(v, &from, &k);
    if (rc == 0)
        v->sp = from;
    return rc;
}

static int op_pop(vm *v)
{
    uint32_t x;
    return pop(v, &x);
}

/* INT: "01" and "00" are True and False (protocol 0 booleans), else a decimal integer. */
static int op_text_int(vm *v)
{
    const unsigned char *line = v->p + v->pos;
    int64_t x;
    int rc = line_int(v, &x);
    if (rc < 0)
        return rc;
    if (line[0] == '0' && line[1] == '1' && line[2] == '\n')
        return op_int(v, 1, K_BOOL);
    if (line[0] == '0' && line[1] == '0' && line[2] == '\n')
        return op_int(v, 0, K_BOOL);
    return op_int(v, x, K_INT);
}

/* GET and PUT with a decimal memo key. */
static int op_text_memo(vm *v, int op)
{
    int64_t x;
    int rc = line_int(v, &x);
    if (rc < 0)
        return rc;
    if (x < 0)
        return fail(v, IFLOW_EFORMAT, "negative pickle memo key");
    return op == 'g' ? op_get(v, (uint64_t)x) : op_put(v, (uint64_t)x);
}

/* Run one opcode. *done is set by STOP. */
static int step(vm *v, int *done)
{
    uint64_t x = 0;
    int rc;
    v->op_pos = v->pos;
    int op = v->p[v->pos++];
    switch (op) {
    case 0x80: /* PROTO */
        rc = arg_uint(v, 1, &x);
        return rc < 0 ? rc : x > 5 ? fail(v, IFLOW_EUNSUPPORTED, "pickle protocol above 5") : 0;
    case 0x95: /* FRAME */
        return arg_uint(v, 8, &x);
    case '.': *done = 1; return 0;
    case '(': return op_mark(v);
    case '0': return op_pop(v);
    case '1': return op_pop_mark(v);
    case '2': return op_dup(v);
    case 'N': return push_new(v, K_NONE, NULL);
    case 0x88: return op_int(v, 1, K_BOOL);
    case 0x89: return op_int(v, 0, K_BOOL);
    case 'I': return op_text_int(v);
    case 'g': case 'p': return op_text_memo(v, op);
    case 'J':
        rc = arg_uint(v, 4, &x);
        return rc < 0 ? rc : op_int(v, (int32_t)(uint32_t)x, K_INT);
    case 'K': rc = arg_uint(v, 1, &x); return rc < 0 ? rc : op_int(v, (int64_t)x, K_INT);
    case 'M': rc = arg_uint(v, 2, &x); return rc < 0 ? rc : op_int(v, (int64_t)x, K_INT);
    case 0x8a: return op_long(v, 1);
    case 0x8b: return op_long(v, 4);
    case 'G': return op_float(v);
    case 'X': return op_str(v, 4, K_STR);
    case 0x8c: return op_str(v, 1, K_STR);
    case 0x8d: return op_str(v, 8, K_STR);
    case 'T': return op_str(v, 4, K_STR);
    case 'U': return op_str(v, 1, K_STR);
    case 'B': return op_str(v, 4, K_BYTES);
    case 'C': return op_str(v, 1, K_BYTES);
    case 0x8e: return op_str(v, 8, K_BYTES);
    case ']': return push_new(v, K_LIST, NULL);
    case ')': return push_new(v, K_TUPLE, NULL);
    case '}': return push_new(v, K_DICT, NULL);
    case 0x8f: return push_new(v, K_SET, NULL);
    case 'l': return op_collect(v, K_LIST, 0, 1);
    case 't': return op_collect(v, K_TUPLE, 0, 1);
    case 'd': return op_collect(v, K_DICT, 0, 1);
    case 0x91: return op_collect(v, K_SET, 0, 1);
    case 0x85: return op_collect(v, K_TUPLE, 1, 0);
    case 0x86: return op_collect(v, K_TUPLE, 2, 0);
    case 0x87: return op_collect(v, K_TUPLE, 3, 0);
    case 'a': return op_extend(v, K_LIST, 1, 0);
    case 'e': return op_extend(v, K_LIST, 0, 1);
    case 's': return op_extend(v, K_DICT, 2, 0);
    case 'u': return op_extend(v, K_DICT, 0, 1);
    case 0x90: return op_extend(v, K_SET, 0, 1);
    case 'h': rc = arg_uint(v, 1, &x); return rc < 0 ? rc : op_get(v, x);
    case 'j': rc = arg_uint(v, 4, &x); return rc < 0 ? rc : op_get(v, x);
    case 'q': rc = arg_uint(v, 1, &x); return rc < 0 ? rc : op_put(v, x);
    case 'r': rc = arg_uint(v, 4, &x); return rc < 0 ? rc : op_put(v, x);
    case 0x94: return op_put(v, v->memo_count);
    case 'c': return op_global_text(v);
    case 0x93: return op_stack_global(v);
    case 'R': return op_reduce(v);
    case 0x81: return op_newobj(v, 1);
    case 0x92: return op_newobj(v, 2);
    case 'b': return op_build(v);
    case 'Q': return op_persid(v);
    default: {
        char what[64];
        snprintf(what, sizeof what, "unsupported pickle opcode 0x%02x", op);
        return fail(v, IFLOW_EUNSUPPORTED, what);
    }
    }
}

static int run(vm *v, uint32_t *root)
{
    int done = 0, rc = 0;
    while (!done && rc == 0) {
        if (v->pos >= v->n) {
            v->op_pos = v->pos;
            return fail(v, IFLOW_ETRUNC, "pickle ends without STOP");
        }
        rc = step(v, &done);
    }
    if (rc < 0)
        return rc;
    if (v->sp != 1 || v->n_marks)
        return fail(v, IFLOW_EFORMAT, "pickle stack not a single value at STOP");
    *root = v->stack[0];
    return 0;
}

/* ---- naming the tensors: a walk from the root --------------------------------------------- */

static int add_tensor(vm *v, const tdef *d, size_t path_len)
{
    iflow_pt *pt = v->pt;
    int rc = grow(&pt->t, &pt->cap, pt->n + 1, sizeof *pt->t);
    char *name = rc < 0 ? NULL : own_string(pt, v->path, path_len, "", 0);
    if (!name)
        return IFLOW_ENOMEM;
    const pnode *s = &v->nodes[d->storage];
    iflow_strided_tensor *t = &pt->t[pt->n++];
    memset(t, 0, sizeof *t);
    int size = storage_types[s->a].size;
    t->t.name = name;
    t->t.dtype = storage_types[s->a].dt;
    t->t.dtype_name = storage_types[s->a].dtype_name;
    t->t.n_dims = d->n_dims;
    t->storage_offset = d->offset;
    t->storage = s->member;
    t->storage_data = s->data;
    t->storage_nbytes = (size_t)s->i * (size_t)size;
    t->t.file_offset = (uint64_t)(s->data - pt->base);
    uint64_t numel = 1;
    for (int i = 0; i < IFLOW_SRC_MAX_DIMS; i++) {
        t->t.shape[i] = i < d->n_dims ? d->shape[i] : 1;
        t->stride[i] = i < d->n_dims ? d->stride[i] : 1;
        numel *= (uint64_t)t->t.shape[i]; /* check_view: no overflow */
    }
    /* Row-major dense (dims of size 1 have any stride). With numel > 0 every partial product
     * is at most numel, which check_view bounded by the storage. */
    uint64_t dense = 1;
    t->contiguous = 1;
    for (int i = d->n_dims - 1; i >= 0 && numel > 0; i--) {
        if (d->shape[i] != 1 && (uint64_t)d->stride[i] != dense)
            t->contiguous = 0;
        dense *= (uint64_t)d->shape[i];
    }
    if (t->contiguous) {
        t->t.data = s->data + (size_t)d->offset * (size_t)size;
        t->t.nbytes = (size_t)numel * (size_t)size;
    }
    return 0;
}

/* Append ".component" (or "component" at the root) to v->path. */
static int path_push(vm *v, size_t len, const char *s, size_t n, size_t *out)
{
    size_t dot = len > 0;
    if (len + dot + n >= MAX_NAME)
        return iflow_seterr(IFLOW_ERANGE, "tensor name longer than %d bytes under '%s' in '%s'",
                            MAX_NAME, iflow_quoten(v->path, len > 64 ? 64 : len), v->pt->path);
    if (dot)
        v->path[len] = '.';
    memcpy(v->path + len + dot, s, n);
    *out = len + dot + n;
    return 0;
}

static int walk(vm *v, uint32_t id, size_t path_len, int depth, json_t **out);

/* The name component of a dict key: a string, or an integer in decimal; 0 if neither. */
static int key_text(const pnode *k, char *buf, size_t cap, const char **s, size_t *n)
{
    if (k->kind == K_STR) {
        *s = k->s;
        *n = k->len;
        return 1;
    }
    if (k->kind == K_INT) {
        *n = (size_t)snprintf(buf, cap, "%" PRId64, k->i);
        *s = buf;
        return 1;
    }
    return 0;
}

static int walk_dict(vm *v, const pnode *d, size_t path_len, int depth, json_t *obj)
{
    for (uint32_t i = 0; i + 1 < d->n; i += 2) {
        char buf[32];
        const char *s;
        size_t n, len = 0;
        if (!key_text(&v->nodes[d->kid[i]], buf, sizeof buf, &s, &n) || memchr(s, 0, n))
            continue; /* keys that cannot name anything */
        int rc = path_push(v, path_len, s, n, &len);
        json_t *val = NULL;
        if (rc == 0)
            rc = walk(v, d->kid[i + 1], len, depth + 1, &val);
        if (rc < 0)
            return rc;
        json_object_setn_new(obj, s, n, val ? val : json_null());
    }
    return 0;
}

static int walk_list(vm *v, const pnode *l, size_t path_len, int depth, json_t *arr)
{
    for (uint32_t i = 0; i < l->n; i++) {
        char buf[16];
        size_t len = 0;
        int rc = path_push(v, path_len, buf, (size_t)snprintf(buf, sizeof buf, "%u", i), &len);
        json_t *val = NULL;
        if (rc == 0)
            rc = walk(v, l->kid[i], len, depth + 1, &val);
        if (rc < 0)
            return rc;
        json_array_append_new(arr, val ? val : json_null());
    }
    return 0;
}

/* A JSON string of n bytes at s, or null when they are not UTF-8. */
static json_t *str_json(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    return j ? j : json_null();
}

/* {"<tag>": "module.name"} for a GLOBAL (or "?" for anything else). */
static json_t *global_json(const char *tag, const pnode *g)
{
    char buf[300];
    int n = g->kind != K_GLOBAL ? snprintf(buf, sizeof buf, "?")
                                : snprintf(buf, sizeof buf, "%.*s.%.*s",
                                           (int)(g->len > 140 ? 140 : g->len), g->s,
                                           (int)(g->len2 > 140 ? 140 : g->len2), g->s2);
    json_t *o = json_object();
    if (o)
        json_object_set_new(o, tag, str_json(buf, (size_t)n));
    return o;
}

static json_t *leaf_json(vm *v, const pnode *x, size_t path_len)
{
    json_t *o;
    switch (x->kind) {
    case K_BOOL: return json_boolean(x->i);
    case K_INT: return json_integer((json_int_t)x->i);
    case K_FLOAT: return json_real(x->f);
    case K_STR: return str_json(x->s, x->len);
    case K_BYTES: return json_pack("{s:I}", "__bytes__", (json_int_t)x->len);
    case K_TENSOR:
        if ((o = json_object()))
            json_object_set_new(o, "__tensor__", str_json(v->path, path_len));
        return o;
    case K_GLOBAL: return global_json("__global__", x);
    case K_OBJ: return global_json("__object__", &v->nodes[x->a]);
    default: return json_null();
    }
}

static int walk(vm *v, uint32_t id, size_t path_len, int depth, json_t **out)
{
    pnode *x = &v->nodes[id];
    *out = NULL;
    if (++v->visits > v->max_visits)
        return iflow_seterr(IFLOW_EFORMAT, "pickle values in '%s' are shared too often (over %zu "
                            "visits from %zu values)", v->pt->path, v->max_visits, v->n_nodes);
    if (depth > MAX_DEPTH)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "pickle data nested deeper than %d under '%s' "
                            "in '%s'", MAX_DEPTH,
                            iflow_quoten(v->path, path_len > 64 ? 64 : path_len), v->pt->path);
    if (x->kind == K_TENSOR) {
        int rc = add_tensor(v, &v->tensors[x->i], path_len);
        if (rc < 0)
            return rc;
    }
    int container = x->kind == K_DICT || x->kind == K_LIST || x->kind == K_TUPLE;
    if (!container || x->visiting) { /* a leaf, or a cycle back to an open container */
        *out = container ? json_null() : leaf_json(v, x, path_len);
        return *out ? 0 : iflow_seterr(IFLOW_ENOMEM, "out of memory in '%s'", v->pt->path);
    }
    *out = x->kind == K_DICT ? json_object() : json_array();
    if (!*out)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory in '%s'", v->pt->path);
    x->visiting = 1;
    int rc = x->kind == K_DICT ? walk_dict(v, x, path_len, depth, *out)
                               : walk_list(v, x, path_len, depth, *out);
    v->nodes[id].visiting = 0;
    if (rc < 0) {
        json_decref(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- open / close --------------------------------------------------------------------------- */

static void vm_free(vm *v)
{
    for (size_t i = 0; i < v->n_nodes; i++)
        free(v->nodes[i].kid);
    free(v->nodes);
    free(v->stack);
    free(v->marks);
    free(v->memo);
    free(v->tensors);
}

/* The pickle member: the one named "<archive>/data.pkl" (or plain "data.pkl"). */
static int find_pickle(iflow_pt *pt, const void **pkl, size_t *n, const char **name)
{
    for (size_t i = 0; i < pt->zip.n; i++) {
        const iflow_zip_member *m = &pt->zip.m[i];
        size_t l = m->name_len;
        if (l >= 8 && memcmp(m->name + l - 8, "data.pkl", 8) == 0 &&
            (l == 8 || (m->name[l - 9] == '/' && !memchr(m->name, '/', l - 9)))) {
            pt->prefix = own_string(pt, m->name, l - 8, "", 0);
            *name = pt->prefix ? own_string(pt, m->name, l, "", 0) : NULL;
            if (!*name)
                return IFLOW_ENOMEM;
            return iflow_zip_find_stored(&pt->zip, *name, pkl, n);
        }
    }
    return iflow_seterr(IFLOW_EFORMAT, "no data.pkl member in '%s': not a torch.save checkpoint",
                        pt->path);
}

static int check_byteorder(iflow_pt *pt)
{
    char *name = own_string(pt, pt->prefix, strlen(pt->prefix), "byteorder", 9);
    if (!name)
        return IFLOW_ENOMEM;
    const void *data;
    size_t n;
    if (!iflow_zip_find(&pt->zip, name))
        return 0; /* older files: little-endian */
    int rc = iflow_zip_find_stored(&pt->zip, name, &data, &n);
    if (rc == 0 && !(n == 6 && memcmp(data, "little", 6) == 0))
        rc = iflow_seterr(IFLOW_EUNSUPPORTED, "checkpoint '%s' is not little-endian (%s says "
                          "'%s')", pt->path, iflow_quote(name),
                          iflow_quoten(data, n > 16 ? 16 : n));
    return rc;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const iflow_strided_tensor *const *)a)->t.name,
                  (*(const iflow_strided_tensor *const *)b)->t.name);
}

/* Sort names for lookup; a name reached by two paths cannot happen, but keep lookups exact. */
static int index_names(iflow_pt *pt)
{
    pt->by_name = malloc((pt->n ? pt->n : 1) * sizeof *pt->by_name);
    if (!pt->by_name)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory indexing '%s'", pt->path);
    for (size_t i = 0; i < pt->n; i++)
        pt->by_name[i] = &pt->t[i];
    qsort(pt->by_name, pt->n, sizeof *pt->by_name, by_name);
    for (size_t i = 1; i < pt->n; i++)
        if (strcmp(pt->by_name[i - 1]->t.name, pt->by_name[i]->t.name) == 0)
            return iflow_seterr(IFLOW_EFORMAT, "duplicate tensor name '%s' in '%s'",
                                iflow_quote(pt->by_name[i]->t.name), pt->path);
    return 0;
}

static int load(iflow_pt *pt)
{
    if (pt->size >= 2 && pt->base[0] == 0x80)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "'%s' is a legacy (pre-1.6, non-zip) torch.save "
                            "file; re-save it with a newer torch", pt->path);
    int rc = iflow_zip_parse(&pt->zip, pt->base, pt->size, pt->path);
    vm v = {.pt = pt};
    const void *pkl = NULL;
    if (rc == 0)
        rc = find_pickle(pt, &pkl, &v.n, &v.pkl_name);
    if (rc == 0)
        rc = check_byteorder(pt);
    if (rc == 0 && v.n >= (size_t)1 << 31)
        rc = iflow_seterr(IFLOW_EUNSUPPORTED, "'%s' in '%s' is larger than 2 GB", v.pkl_name,
                          pt->path);
    v.p = pkl;
    uint32_t root = 0;
    if (rc == 0)
        rc = run(&v, &root);
    if (rc == 0) {
        v.max_visits = 4 * v.n_nodes + 4096;
        rc = walk(&v, root, 0, 0, &pt->data);
    }
    vm_free(&v);
    return rc < 0 ? rc : index_names(pt);
}

static iflow_pt *pt_new(const char *path)
{
    iflow_pt *pt = calloc(1, sizeof *pt);
    if (pt && !(pt->path = strdup(path))) {
        free(pt);
        pt = NULL;
    }
    if (!pt)
        iflow_seterr(IFLOW_ENOMEM, "out of memory opening '%s'", path);
    return pt;
}

static int finish_open(iflow_pt **out, iflow_pt *pt)
{
    int rc = load(pt);
    if (rc < 0) {
        iflow_pt_close(pt);
        return rc;
    }
    *out = pt;
    return 0;
}

int iflow_pt_open_mem(iflow_pt **out, const void *buf, size_t n, const char *name)
{
    *out = NULL;
    iflow_pt *pt = pt_new(name ? name : "(memory)");
    if (!pt)
        return IFLOW_ENOMEM;
    pt->base = buf;
    pt->size = n;
    return finish_open(out, pt);
}

static int map_file(iflow_pt *pt)
{
    int fd = open(pt->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return iflow_seterr(errno == ENOENT ? IFLOW_ENOTFOUND : IFLOW_EIO, "cannot open '%s': %s",
                            pt->path, strerror(errno));
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) < 0)
        rc = iflow_seterr(IFLOW_EIO, "cannot stat '%s': %s", pt->path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        rc = iflow_seterr(IFLOW_EINVAL, "'%s' is not a regular file", pt->path);
    else if ((uint64_t)sb.st_size > SIZE_MAX)
        rc = iflow_seterr(IFLOW_ERANGE, "'%s' is too large to map", pt->path);
    if (rc == 0 && sb.st_size > 0) {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            rc = iflow_seterr(IFLOW_EIO, "cannot map '%s': %s", pt->path, strerror(errno));
        } else {
            pt->base = p;
            pt->size = (size_t)sb.st_size;
            pt->mapped = 1;
        }
    }
    close(fd);
    return rc;
}

int iflow_pt_open(iflow_pt **out, const char *path)
{
    *out = NULL;
    iflow_pt *pt = pt_new(path);
    if (!pt)
        return IFLOW_ENOMEM;
    int rc = map_file(pt);
    if (rc < 0) {
        iflow_pt_close(pt);
        return rc;
    }
    return finish_open(out, pt);
}

void iflow_pt_close(iflow_pt *pt)
{
    if (!pt)
        return;
    if (pt->mapped)
        munmap((void *)pt->base, pt->size);
    iflow_zip_free(&pt->zip);
    for (size_t i = 0; i < pt->n_strings; i++)
        free(pt->strings[i]);
    free(pt->strings);
    free(pt->t);
    free(pt->by_name);
    json_decref(pt->data);
    free(pt->path);
    free(pt);
}

/* ---- queries -------------------------------------------------------------------------------- */

const char *iflow_pt_path(const iflow_pt *pt) { return pt->path; }
size_t iflow_pt_n_tensors(const iflow_pt *pt) { return pt->n; }
const json_t *iflow_pt_data(const iflow_pt *pt) { return pt->data; }

const iflow_strided_tensor *iflow_pt_tensor(const iflow_pt *pt, size_t i)
{
    return i < pt->n ? &pt->t[i] : NULL;
}

const iflow_strided_tensor *iflow_pt_find(const iflow_pt *pt, const char *name)
{
    size_t lo = 0, hi = pt->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, pt->by_name[mid]->t.name);
        if (c == 0)
            return pt->by_name[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

void iflow_pt_release(iflow_pt *pt, const iflow_strided_tensor *t)
{
    if (!pt->mapped || !t || t->storage_nbytes == 0)
        return;
    const unsigned char *p = t->storage_data;
    if (p < pt->base || p + t->storage_nbytes > pt->base + pt->size)
        return;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t lo = (size_t)(p - pt->base) / page * page;
    size_t hi = ((size_t)(p - pt->base) + t->storage_nbytes + page - 1) / page * page;
    if (hi > pt->size)
        hi = pt->size;
    madvise((void *)(pt->base + lo), hi - lo, MADV_DONTNEED);
}
