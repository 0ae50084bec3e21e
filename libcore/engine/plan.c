/* plan.c -- partition plans: the ini form, and checking a plan against a model. See plan.h. */
#include "plan.h"
#include "libcore/base/error.h"
#include "libcore/device/device.h"

#include <errno.h>
#include <omp.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- reading ---- */

typedef struct {
    iflow_plan *p;
    const char *path;
    int rc;              /* first error */
    int cur;             /* device section being read (-1: [plan] or none) */
    int lineno;
    int have_output;
    char output[32];
} load_state;

static int fail(load_state *st, int code, const char *fmt, const char *a, const char *b)
{
    if (st->rc == 0) {
        char what[256];
        snprintf(what, sizeof what, fmt, a, b);
        st->rc = iflow_seterr(code, "%s in plan '%s' at line %d", what, st->path, st->lineno);
    }
    return 0; /* stop inih */
}

/* A non-negative integer, the whole value. */
static int number(const char *v, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < 0 || x > (1 << 30))
        return -1;
    *out = (int)x;
    return 0;
}

/* "a-b" (inclusive) -> [a, b+1); "a" -> [a, a+1); "all" -> [0, INT_MAX) resolved later; "none". */
static int range(const char *v, int *lo, int *hi)
{
    char buf[64];
    if (strcmp(v, "all") == 0) {
        *lo = 0, *hi = -1; /* the whole range, filled in from the model's shape */
        return 0;
    }
    if (strcmp(v, "none") == 0) {
        *lo = *hi = 0;
        return 0;
    }
    snprintf(buf, sizeof buf, "%s", v);
    char *dash = strchr(buf, '-');
    int a, b;
    if (!dash)
        return number(buf, &a) ? -1 : (*lo = a, *hi = a + 1, 0);
    *dash = 0;
    if (number(buf, &a) || number(dash + 1, &b) || b < a)
        return -1;
    *lo = a, *hi = b + 1;
    return 0;
}

/* inih's reader: fgets that counts lines, so messages can name the line being handled. */
typedef struct {
    FILE *f;
    load_state *st;
} line_reader;

static int device_section(load_state *st, const char *name, int is_header);

static char *read_line(char *buf, int n, void *stream)
{
    line_reader *r = stream;
    char *s = fgets(buf, n, r->f);
    if (s) {
        r->st->lineno++;
        /* inih calls the handler for keys only: note "[device NAME]" sections here, so that a
         * device section with no keys (the whole model) counts too */
        const char *t = s + strspn(s, " \t");
        if (strncmp(t, "[device ", 8) == 0 && r->st->rc == 0) {
            char name[64];
            size_t k = strcspn(t + 8, "]\n");
            if (t[8 + k] == ']' && k < sizeof name) {
                memcpy(name, t + 8, k);
                name[k] = 0;
                device_section(r->st, name, 1);
            }
        }
    }
    return s;
}

/* The device of section "device NAME": registered at its header line (a second header of the
 * same name is an error), looked up for its keys. -1 (and st->rc set) if bad. */
static int device_section(load_state *st, const char *name, int is_header)
{
    iflow_plan *p = st->p;
    for (int i = 0; i < p->n_devices; i++)
        if (strcmp(p->devices[i].name, name) == 0) {
            if (is_header)
                return fail(st, IFLOW_EFORMAT, "device '%s' appears twice%s", name, ""), -1;
            return st->cur = i;
        }
    if (p->n_devices == IFLOW_PLAN_MAX_DEVICES)
        return fail(st, IFLOW_EFORMAT, "more than 16 devices (at '%s')%s", name, ""), -1;
    if (strlen(name) >= sizeof p->devices[0].name || !*name)
        return fail(st, IFLOW_EFORMAT, "bad device name '%s'%s", name, ""), -1;
    st->cur = p->n_devices++;
    iflow_plan_device *d = &p->devices[st->cur];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->layer1 = d->head1 = d->ffn1 = -1; /* all, unless given */
    return st->cur;
}

static int handler(void *user, const char *section, const char *key, const char *value)
{
    load_state *st = user;
    iflow_plan *p = st->p;
    if (st->rc)
        return 0;
    if (strcmp(section, "plan") == 0) {
        int *dst = strcmp(key, "layers") == 0     ? &p->n_layers
                   : strcmp(key, "heads") == 0    ? &p->n_heads
                   : strcmp(key, "kv_heads") == 0 ? &p->n_kv_heads
                   : strcmp(key, "ffn") == 0      ? &p->ffn_dim
                                                  : NULL;
        if (dst)
            return number(value, dst) ? fail(st, IFLOW_EFORMAT, "bad %s = '%s'", key, value) : 1;
        if (strcmp(key, "strategy") == 0) {
            snprintf(p->strategy, sizeof p->strategy, "%s", value);
            return 1;
        }
        if (strcmp(key, "output") == 0) {
            snprintf(st->output, sizeof st->output, "%s", value);
            st->have_output = 1;
            return 1;
        }
        return fail(st, IFLOW_EFORMAT, "unknown key '%s'%s", key, "");
    }
    if (strncmp(section, "device ", 7) == 0) {
        if (device_section(st, section + 7, 0) < 0)
            return 0;
        iflow_plan_device *d = &p->devices[st->cur];
        if (strcmp(key, "threads") == 0)
            return number(value, &d->threads) ? fail(st, IFLOW_EFORMAT, "bad threads = '%s'%s", value, "") : 1;
        int *lo = strcmp(key, "layers") == 0 ? &d->layer0 : strcmp(key, "heads") == 0 ? &d->head0
                  : strcmp(key, "ffn") == 0 ? &d->ffn0 : NULL;
        if (!lo)
            return fail(st, IFLOW_EFORMAT, "unknown key '%s'%s", key, "");
        return range(value, lo, lo + 1) ? fail(st, IFLOW_EFORMAT, "bad range %s = '%s' (expected A-B, A, all or none)", key, value) : 1;
    }
    return fail(st, IFLOW_EFORMAT, "unknown section [%s]%s", section, "");
}

/* "all" ranges take the model's whole extent. */
static void resolve_all(iflow_plan *p)
{
    for (int i = 0; i < p->n_devices; i++) {
        iflow_plan_device *d = &p->devices[i];
        if (d->layer1 < 0)
            d->layer1 = p->n_layers;
        if (d->head1 < 0)
            d->head1 = p->n_heads;
        if (d->ffn1 < 0)
            d->ffn1 = p->ffn_dim;
    }
}

int iflow_plan_load(iflow_plan *p, const char *path)
{
    memset(p, 0, sizeof *p);
    load_state st = {.p = p, .path = path, .cur = -1};
    FILE *f = fopen(path, "r");
    if (!f)
        return iflow_seterr(IFLOW_EIO, "cannot open plan '%s': %s", path, strerror(errno));
    line_reader r = {f, &st};
    int line = ini_parse_stream(read_line, &r, handler, &st);
    fclose(f);
    if (st.rc)
        return st.rc;
    if (line > 0)
        return iflow_seterr(IFLOW_EFORMAT, "malformed line in plan '%s' at line %d", path, line);
    if (!p->n_layers || !p->n_heads || !p->n_kv_heads || !p->ffn_dim)
        return iflow_seterr(IFLOW_EFORMAT, "plan '%s' lacks the model shape ([plan] layers, heads, kv_heads, ffn)", path);
    if (!p->n_devices)
        return iflow_seterr(IFLOW_EFORMAT, "plan '%s' names no device ([device NAME] sections)", path);
    p->output_device = 0;
    if (st.have_output) {
        p->output_device = -1;
        for (int i = 0; i < p->n_devices; i++)
            if (strcmp(p->devices[i].name, st.output) == 0)
                p->output_device = i;
        if (p->output_device < 0)
            return iflow_seterr(IFLOW_EFORMAT, "plan '%s': output = %s is not one of its devices", path, st.output);
    }
    resolve_all(p);
    return 0;
}

/* ---- writing ---- */

static void put_range(FILE *f, const char *key, int lo, int hi, int whole)
{
    if (hi <= lo)
        fprintf(f, "%s = none\n", key);
    else if (lo == 0 && hi == whole)
        fprintf(f, "%s = all\n", key);
    else
        fprintf(f, "%s = %d-%d\n", key, lo, hi - 1);
}

static void write_plan(FILE *f, const iflow_plan *p)
{
    fprintf(f, "# iflow partition plan (man iflow-plan.5)\n[plan]\n");
    if (p->strategy[0])
        fprintf(f, "strategy = %s\n", p->strategy);
    fprintf(f, "layers = %d\nheads = %d\nkv_heads = %d\nffn = %d\noutput = %s\n", p->n_layers, p->n_heads,
            p->n_kv_heads, p->ffn_dim, p->devices[p->output_device].name);
    for (int i = 0; i < p->n_devices; i++) {
        const iflow_plan_device *d = &p->devices[i];
        fprintf(f, "\n[device %s]\n", d->name);
        if (d->threads)
            fprintf(f, "threads = %d\n", d->threads);
        put_range(f, "layers", d->layer0, d->layer1, p->n_layers);
        put_range(f, "heads", d->head0, d->head1, p->n_heads);
        put_range(f, "ffn", d->ffn0, d->ffn1, p->ffn_dim);
    }
}

int iflow_plan_save(const iflow_plan *p, const char *path)
{
    if (strcmp(path, "-") == 0) {
        write_plan(stdout, p);
        return fflush(stdout) == 0 ? 0 : iflow_seterr(IFLOW_EIO, "cannot write the plan to standard output");
    }
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        /* /dev/null, a FIFO: written in place; a rename over it would replace the device */
        FILE *f = fopen(path, "w");
        if (!f)
            return iflow_seterr(IFLOW_EIO, "cannot open plan '%s': %s", path, strerror(errno));
        write_plan(f, p);
        int bad = ferror(f) | (fclose(f) != 0);
        return bad ? iflow_seterr(IFLOW_EIO, "cannot write plan '%s'", path) : 0;
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return iflow_seterr(IFLOW_EIO, "cannot create plan '%s': %s", path, strerror(errno));
    write_plan(f, p);
    int bad = ferror(f) | (fclose(f) != 0);
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return iflow_seterr(IFLOW_EIO, "cannot write plan '%s': %s", path, strerror(errno));
    }
    return 0;
}

/* ---- comparing ---- */

static void part_str(char *buf, size_t cap, const iflow_plan_device *d)
{
    if (d->layer1 > d->layer0)
        snprintf(buf, cap, "layers %d-%d, heads %d-%d, ffn %d-%d", d->layer0, d->layer1 - 1, d->head0, d->head1 - 1,
                 d->ffn0, d->ffn1 - 1);
    else
        snprintf(buf, cap, "no layers");
}

int iflow_plan_same_partition(const iflow_plan *a, const iflow_plan *b, const char *b_name)
{
    if (a->n_devices != b->n_devices)
        return iflow_seterr(IFLOW_EINVAL, "a plan of %d devices, %s has %d", a->n_devices, b_name, b->n_devices);
    for (int i = 0; i < a->n_devices; i++) {
        char x[128], y[128];
        part_str(x, sizeof x, &a->devices[i]);
        part_str(y, sizeof y, &b->devices[i]);
        if (strcmp(x, y) != 0)
            return iflow_seterr(IFLOW_EINVAL, "device %d (%s) holds %s, but %s in %s", i, a->devices[i].name, x, y,
                                b_name);
    }
    if (a->output_device != b->output_device)
        return iflow_seterr(IFLOW_EINVAL, "the output is on device %d (%s), but on device %d in %s", a->output_device,
                            a->devices[a->output_device].name, b->output_device, b_name);
    return 0;
}

/* ---- devices ---- */

static int is_cpu_name(const char *name) { return strcmp(name, "cpu") == 0 || strncmp(name, "cpu:", 4) == 0; }

int iflow_plan_open_devices(const iflow_plan *p, int only, iflow_device **devs)
{
    int n_cpu = 0, rc = 0;
    for (int i = 0; i < p->n_devices; i++) {
        n_cpu += is_cpu_name(p->devices[i].name);
        devs[i] = NULL;
    }
    for (int i = 0; i < p->n_devices && rc == 0; i++) {
        const iflow_plan_device *d = &p->devices[i];
        if (only >= 0 && i != only)
            continue;
        int cpu = is_cpu_name(d->name), threads = d->threads ? d->threads : cpu ? omp_get_num_procs() / n_cpu : 0;
        rc = iflow_device_open(&devs[i], cpu ? "cpu" : d->name, threads > 0 ? threads : 1);
    }
    if (rc < 0)
        iflow_plan_close_devices(p, devs);
    return rc;
}

void iflow_plan_close_devices(const iflow_plan *p, iflow_device **devs)
{
    for (int i = 0; i < p->n_devices; i++) {
        iflow_device_close(devs[i]);
        devs[i] = NULL;
    }
}

/* ---- checking ---- */

int iflow_plan_layer_devices(const iflow_plan *p, int l, int *idx)
{
    int n = 0;
    for (int i = 0; i < p->n_devices; i++)
        if (l >= p->devices[i].layer0 && l < p->devices[i].layer1)
            idx[n++] = i;
    return n;
}

/* In each layer, the parts' ranges [lo, hi) must tile [0, whole) exactly once. */
static int check_cover(const iflow_plan *p, int l, const int *idx, int n, int whole, int is_heads)
{
    const char *what = is_heads ? "query head" : "FFN column";
#define LO(k) (is_heads ? p->devices[idx[k]].head0 : p->devices[idx[k]].ffn0)
#define HI(k) (is_heads ? p->devices[idx[k]].head1 : p->devices[idx[k]].ffn1)
    for (int a = 0; a < n; a++) {
        if (HI(a) > whole || LO(a) >= HI(a))
            return iflow_seterr(IFLOW_EINVAL, "plan: %s's %s range %d-%d is empty or outside layer %d's 0-%d",
                                p->devices[idx[a]].name, is_heads ? "head" : "ffn", LO(a), HI(a) - 1, l, whole - 1);
        for (int b = 0; b < a; b++)
            if (LO(a) < HI(b) && LO(b) < HI(a))
                return iflow_seterr(IFLOW_EINVAL, "plan: %s %d of layer %d is on both %s and %s", what,
                                    LO(a) > LO(b) ? LO(a) : LO(b), l, p->devices[idx[b]].name, p->devices[idx[a]].name);
    }
    /* no overlaps: walk the ranges from 0 and report the first gap */
    for (int x = 0; x < whole;) {
        int next = -1;
        for (int k = 0; k < n; k++)
            if (LO(k) == x)
                next = HI(k);
        if (next < 0)
            return iflow_seterr(IFLOW_EINVAL, "plan: %s %d of layer %d is on no device", what, x, l);
        x = next;
    }
#undef LO
#undef HI
    return 0;
}

int iflow_plan_check(const iflow_plan *p, int n_layers, int n_heads, int n_kv_heads, int ffn_dim)
{
    if (p->n_layers != n_layers || p->n_heads != n_heads || p->n_kv_heads != n_kv_heads || p->ffn_dim != ffn_dim)
        return iflow_seterr(IFLOW_ESHAPE,
                            "plan is for a model of %d layers, %d heads, %d kv heads, ffn %d; this model has %d, %d, %d, %d",
                            p->n_layers, p->n_heads, p->n_kv_heads, p->ffn_dim, n_layers, n_heads, n_kv_heads, ffn_dim);
    if (p->output_device < 0 || p->output_device >= p->n_devices)
        return iflow_seterr(IFLOW_EINVAL, "plan: output device %d is not one of its %d devices", p->output_device,
                            p->n_devices);
    if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads || n_layers < 1 || ffn_dim < 1)
        return iflow_seterr(IFLOW_ESHAPE, "plan: a model of %d layers, %d heads, %d kv heads, ffn %d cannot be partitioned",
                            n_layers, n_heads, n_kv_heads, ffn_dim);
    int group = n_heads / n_kv_heads;
    for (int i = 0; i < p->n_devices; i++) {
        const iflow_plan_device *d = &p->devices[i];
        if (d->layer1 > n_layers)
            return iflow_seterr(IFLOW_EINVAL, "plan: %s's layers %d-%d go past the model's %d", d->name, d->layer0,
                                d->layer1 - 1, n_layers);
        int whole_groups = d->head0 % group == 0 && d->head1 % group == 0;
        int one_group = d->head1 > d->head0 && d->head0 / group == (d->head1 - 1) / group;
        if (d->layer1 > d->layer0 && !whole_groups && !one_group)
            return iflow_seterr(IFLOW_EINVAL,
                                "plan: %s's heads %d-%d split a group of %d query heads sharing a kv head and span several",
                                d->name, d->head0, d->head1 - 1, group);
    }
    for (int l = 0; l < n_layers; l++) {
        int idx[IFLOW_PLAN_MAX_DEVICES], n = iflow_plan_layer_devices(p, l, idx), rc;
        if (n == 0)
            return iflow_seterr(IFLOW_EINVAL, "plan: layer %d is on no device", l);
        if ((rc = check_cover(p, l, idx, n, n_heads, 1)) || (rc = check_cover(p, l, idx, n, ffn_dim, 0)))
            return rc;
    }
    return 0;
}
