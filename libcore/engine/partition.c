/* partition.c -- device descriptions, machines, model shapes, partition strategies and their
 * cost model. See partition.h; the formulas are in docs/PARTITION.md. */
#include "partition.h"
#include "libcore/base/dtype.h"
#include "libcore/base/error.h"
#include "libcore/base/jsonutil.h"
#include "libcore/base/strmap.h"
#include "libcore/device/device.h"
#include "libcore/formats/convert.h"
#include "libcore/formats/shard.h"
#include "kernels/cpu/quant.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define DEFAULT_CTX 4096

/* ===================================================================== device descriptions == */

struct iflow_devdb {
    int n;
    iflow_devdesc *d;
    double *eff_any;  /* [n] while reading: each description's `*` efficiency (UNSET_EFF: none) */
};

enum { K_KIND = 1, K_MEMORY = 2, K_BW = 4, K_FLOPS = 8, K_LINK = 16, K_LAT = 32, K_ALL = 63 };
static const char *const key_names[] = {"kind", "memory", "bandwidth", "flops", "link", "latency"};

typedef struct {
    iflow_devdb *db;
    const char *path;
    int rc, lineno, section_line;
    unsigned have;          /* K_* of the current section */
} db_state;

/* While the file is read: not given. iflow_devdb_load() resolves them (resolve_measured). */
#define UNSET_OVERHEAD (-1.0)
#define UNSET_EFF 0.0

typedef struct { const char *unit; double scale; } unit_t;

static const unit_t byte_units[] = {{"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
                                    {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
                                    {"TiB", 1099511627776.0}, {NULL, 0}};
static const unit_t rate_units[] = {{"B/s", 1}, {"KB/s", 1e3}, {"MB/s", 1e6}, {"GB/s", 1e9}, {"TB/s", 1e12},
                                    {"GiB/s", 1073741824.0}, {NULL, 0}};
static const unit_t flop_units[] = {{"FLOP/s", 1}, {"GFLOP/s", 1e9}, {"TFLOP/s", 1e12}, {"PFLOP/s", 1e15}, {NULL, 0}};
static const unit_t time_units[] = {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}, {NULL, 0}};

/* "3350 GB/s" -> 3.35e12. -1 if the number or the unit is bad. */
static int with_unit(const char *v, const unit_t *units, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || errno || !isfinite(x) || x < 0)
        return -1;
    while (*end == ' ' || *end == '\t')
        end++;
    for (const unit_t *u = units; u->unit; u++)
        if (strcmp(end, u->unit) == 0) {
            *out = x * u->scale;
            return 0;
        }
    return -1;
}

static int db_fail(db_state *st, int line, const char *fmt, const char *a, const char *b)
{
    if (st->rc == 0) {
        char what[256];
        snprintf(what, sizeof what, fmt, a, b);
        st->rc = iflow_seterr(IFLOW_EFORMAT, "%s in device file '%s' at line %d", what, st->path, line);
    }
    return 0;
}

/* The section just read has every key it needs. */
static int db_close_section(db_state *st)
{
    if (st->rc || st->db->n == 0 || st->have == K_ALL)
        return st->rc;
    for (int k = 0; k < 6; k++)
        if (!(st->have & (1u << k)))
            return db_fail(st, st->section_line, "device '%s' lacks '%s'", st->db->d[st->db->n - 1].name, key_names[k]),
                   st->rc;
    return 0;
}

typedef struct {
    FILE *f;
    db_state *st;
} db_reader;

static char *db_read_line(char *buf, int n, void *stream)
{
    db_reader *r = stream;
    char *s = fgets(buf, n, r->f);
    if (s)
        r->st->lineno++;
    return s;
}

/* "f16 0.82, q8_b64 0.49, * 0.39": a weight type (or * for the others) and the fraction of
 * the bandwidth decode reads it at, in (0, 4] (above 1 where the stated bandwidth is a loop's
 * that the engine's reads beat). eff_any keeps *'s until resolve_measured(). */
static int parse_efficiency(db_state *st, iflow_devdesc *d, const char *value)
{
    char buf[512];
    if (strlen(value) >= sizeof buf)
        return db_fail(st, st->lineno, "efficiency = '%.64s...' is too long%s", value, "");
    snprintf(buf, sizeof buf, "%s", value);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char name[32], extra;
        double f;
        if (sscanf(item, " %31s %lf %c", name, &f, &extra) != 2 || !isfinite(f) || f <= 0 || f > 4)
            return db_fail(st, st->lineno,
                           "bad efficiency item '%s'%s (a weight type and a fraction, such as f16 0.82)", item, "");
        int t = strcmp(name, "*") == 0 ? -1 : iflow_dtype_from_name(name);
        if (t != -1 && !iflow_dtype_is_float(t) && !iflow_dtype_is_quant(t))
            t = -2;
        if (t == -2 || (t == -1 && strcmp(name, "*") != 0))
            return db_fail(st, st->lineno, "efficiency names '%s', not a weight type%s", name, "");
        double *slot = t < 0 ? &st->db->eff_any[st->db->n - 1] : &d->eff[t];
        if (*slot != UNSET_EFF)
            return db_fail(st, st->lineno, "efficiency gives '%s' twice%s", name, "");
        *slot = f;
    }
    return 1;
}

static int db_handler(void *user, const char *section, const char *key, const char *value)
{
    db_state *st = user;
    iflow_devdb *db = st->db;
    if (st->rc)
        return 0;
    if (strncmp(section, "device ", 7) != 0 || !section[7])
        return db_fail(st, st->lineno, "unknown section [%s]%s (expected [device NAME])", section, "");
    const char *name = section + 7;
    if (db->n == 0 || strcmp(db->d[db->n - 1].name, name) != 0) {
        if (db_close_section(st))
            return 0;
        if (strlen(name) >= sizeof db->d[0].name)
            return db_fail(st, st->lineno, "device name '%s' is too long%s", name, "");
        for (int i = 0; i < db->n; i++)
            if (strcasecmp(db->d[i].name, name) == 0)
                return db_fail(st, st->lineno, "device '%s' appears twice%s", name, "");
        iflow_devdesc *d = realloc(db->d, (size_t)(db->n + 1) * sizeof *d);
        if (!d) {
            st->rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
            return 0;
        }
        db->d = d;
        double *any = realloc(db->eff_any, (size_t)(db->n + 1) * sizeof *any);
        if (!any) {
            st->rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
            return 0;
        }
        db->eff_any = any;
        any[db->n] = UNSET_EFF;
        memset(&d[db->n], 0, sizeof *d);
        snprintf(d[db->n].name, sizeof d[db->n].name, "%s", name);
        d[db->n].overhead = UNSET_OVERHEAD;
        db->n++;
        st->have = 0;
        st->section_line = st->lineno;
    }
    iflow_devdesc *d = &db->d[db->n - 1];
    double x;
    unsigned bit = 0;
    if (strcmp(key, "kind") == 0) {
        if (strcmp(value, "gpu") && strcmp(value, "cpu"))
            return db_fail(st, st->lineno, "bad kind = '%s'%s (gpu or cpu)", value, "");
        d->is_cpu = strcmp(value, "cpu") == 0;
        bit = K_KIND;
    } else if (strcmp(key, "memory") == 0) {
        if (strcmp(value, "host") == 0 || strcmp(value, "live") == 0)
            x = 0;
        else if (with_unit(value, byte_units, &x) || x < 1 || x > 1e18)
            return db_fail(st, st->lineno, "bad memory = '%s'%s (a size such as 80 GiB, or host)", value, "");
        d->memory = (uint64_t)x;
        bit = K_MEMORY;
    } else if (strcmp(key, "bandwidth") == 0 || strcmp(key, "link") == 0) {
        if (with_unit(value, rate_units, &x) || x <= 0)
            return db_fail(st, st->lineno, "bad %s = '%s' (a rate such as 3350 GB/s)", key, value);
        *(strcmp(key, "link") == 0 ? &d->link_bw : &d->mem_bw) = x;
        bit = strcmp(key, "link") == 0 ? K_LINK : K_BW;
    } else if (strcmp(key, "flops") == 0) {
        if (with_unit(value, flop_units, &x))
            return db_fail(st, st->lineno, "bad flops = '%s'%s (such as 989 TFLOP/s)", value, "");
        d->flops = x;
        bit = K_FLOPS;
    } else if (strcmp(key, "latency") == 0) {
        if (with_unit(value, time_units, &x) || x > 1)
            return db_fail(st, st->lineno, "bad latency = '%s'%s (such as 2 us)", value, "");
        d->link_lat = x;
        bit = K_LAT;
    } else if (strcmp(key, "match") == 0) {
        snprintf(d->match, sizeof d->match, "%s", value);
        return 1;
    } else if (strcmp(key, "overhead") == 0) {
        if (d->overhead != UNSET_OVERHEAD)
            return db_fail(st, st->lineno, "'%s' given twice for device '%s'", key, d->name);
        if (with_unit(value, time_units, &x) || x > 1)
            return db_fail(st, st->lineno, "bad overhead = '%s'%s (such as 36 us)", value, "");
        d->overhead = x;
        return 1;
    } else if (strcmp(key, "host_bandwidth") == 0) {
        if (d->host_bw > 0)
            return db_fail(st, st->lineno, "'%s' given twice for device '%s'", key, d->name);
        if (with_unit(value, rate_units, &x) || x <= 0)
            return db_fail(st, st->lineno, "bad host_bandwidth = '%s'%s (a rate such as 40 GB/s)", value, "");
        d->host_bw = x;
        return 1;
    } else if (strcmp(key, "efficiency") == 0) {
        return parse_efficiency(st, d, value);
    } else {
        return db_fail(st, st->lineno, "unknown key '%s'%s", key, "");
    }
    if (st->have & bit)
        return db_fail(st, st->lineno, "'%s' given twice for device '%s'", key, d->name);
    st->have |= bit;
    return 1;
}

/* Fill what a description left unset: its own `*`, else its kind's template's ("cpu", "cuda"),
 * else overhead 0, efficiency 1, no host limit. Templates first, so a template's `*` counts. */
static int resolve_measured(iflow_devdb *db, const char *path)
{
    const char *templates[2] = {"cpu", "cuda"};
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < db->n; i++) {
            iflow_devdesc *d = &db->d[i];
            int is_template = strcmp(d->name, templates[0]) == 0 || strcmp(d->name, templates[1]) == 0;
            if (is_template != (pass == 0))
                continue;
            const iflow_devdesc *t = is_template ? NULL : iflow_devdb_find(db, templates[d->is_cpu ? 0 : 1]);
            if (t && t->is_cpu != d->is_cpu)
                return iflow_seterr(IFLOW_EFORMAT, "device file '%s': template '%s' is not of kind %s", path, t->name,
                                    d->is_cpu ? "cpu" : "gpu");
            if (d->host_bw > 0 && !d->is_cpu)
                return iflow_seterr(IFLOW_EFORMAT, "device file '%s': host_bandwidth of '%s', which is not a cpu", path,
                                    d->name);
            if (d->overhead == UNSET_OVERHEAD)
                d->overhead = t ? t->overhead : 0;
            if (d->host_bw <= 0 && t)
                d->host_bw = t->host_bw;
            for (int k = 0; k < IFLOW_DT_QEND_; k++)
                if (d->eff[k] == UNSET_EFF)
                    d->eff[k] = db->eff_any[i] != UNSET_EFF ? db->eff_any[i] : t ? t->eff[k] : 1.0;
        }
    return 0;
}

int iflow_devdb_load(iflow_devdb **out, const char *path)
{
    *out = NULL;
    iflow_devdb *db = calloc(1, sizeof *db);
    if (!db)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    FILE *f = fopen(path, "r");
    if (!f) {
        free(db);
        return iflow_seterr(IFLOW_EIO, "cannot open device file '%s': %s", path, strerror(errno));
    }
    db_state st = {.db = db, .path = path};
    db_reader r = {f, &st};
    int line = ini_parse_stream(db_read_line, &r, db_handler, &st);
    fclose(f);
    if (st.rc == 0 && line > 0)
        st.rc = iflow_seterr(IFLOW_EFORMAT, "malformed line in device file '%s' at line %d", path, line);
    if (st.rc == 0)
        db_close_section(&st);
    if (st.rc == 0 && db->n == 0)
        st.rc = iflow_seterr(IFLOW_EFORMAT, "device file '%s' describes no device ([device NAME] sections)", path);
    if (st.rc == 0)
        st.rc = resolve_measured(db, path);
    if (st.rc) {
        iflow_devdb_free(db);
        return st.rc;
    }
    *out = db;
    return 0;
}

void iflow_devdb_free(iflow_devdb *db)
{
    if (!db)
        return;
    free(db->d);
    free(db->eff_any);
    free(db);
}

int iflow_devdb_count(const iflow_devdb *db) { return db->n; }
const iflow_devdesc *iflow_devdb_at(const iflow_devdb *db, int i) { return i >= 0 && i < db->n ? &db->d[i] : NULL; }

const iflow_devdesc *iflow_devdb_find(const iflow_devdb *db, const char *name)
{
    for (int i = 0; i < db->n; i++)
        if (strcasecmp(db->d[i].name, name) == 0)
            return &db->d[i];
    return NULL;
}

/* ===================================================================== machines ============= */

static int parse_count(const char *s, size_t n, int *out)
{
    if (n == 0 || n > 3)
        return -1;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

static int add_device(iflow_machine *m, const char *spec, const iflow_devdesc *d, const char *name)
{
    if (m->n == IFLOW_PLAN_MAX_DEVICES)
        return iflow_seterr(IFLOW_EINVAL, "devices '%s': more than %d devices", spec, IFLOW_PLAN_MAX_DEVICES);
    iflow_pdevice *p = &m->dev[m->n++];
    p->d = *d;
    snprintf(p->name, sizeof p->name, "%s", name ? name : "");
    return 0;
}

static void known_names(const iflow_devdb *db, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < db->n && len + 2 < cap; i++) {
        if (strcmp(db->d[i].name, "cuda") == 0)
            continue;
        int w = snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", db->d[i].name);
        len = w > 0 && (size_t)w < cap - len ? len + (size_t)w : cap - 1;
    }
}

/* A live GPU: its memory and peak bandwidth; FLOP/s from the matching description; link PCIe. */
static int add_live(iflow_machine *m, const char *spec, const char *item, int index, const iflow_devdb *db)
{
    iflow_device_info info[IFLOW_PLAN_MAX_DEVICES + 1];
    int n = 0;
    int rc = iflow_device_list(info, IFLOW_PLAN_MAX_DEVICES + 1, &n);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++) {
        if (info[i].kind != IFLOW_DEVICE_CUDA || info[i].index != index)
            continue;
        const iflow_devdesc *tmpl = iflow_devdb_find(db, "cuda"), *match = NULL;
        for (int k = 0; k < db->n && !match; k++)
            if (db->d[k].match[0] && strstr(info[i].model, db->d[k].match))
                match = &db->d[k];
        iflow_devdesc d = {0};
        if (match || tmpl) /* what decode measured there: overhead, efficiency */
            d = match ? *match : *tmpl;
        d.match[0] = 0;
        snprintf(d.name, sizeof d.name, "%s", match ? match->name : info[i].model);
        d.memory = info[i].mem_total;
        d.mem_bw = info[i].mem_bw_peak > 0 ? info[i].mem_bw_peak : match ? match->mem_bw : tmpl ? tmpl->mem_bw : 0;
        d.flops = match ? match->flops : tmpl ? tmpl->flops : 0;
        d.link_bw = tmpl ? tmpl->link_bw : 0;
        d.link_lat = tmpl ? tmpl->link_lat : 0;
        if (d.mem_bw <= 0 || d.link_bw <= 0)
            return iflow_seterr(IFLOW_ENOTFOUND,
                                "devices '%s': no bandwidth known for %s (%s): describe it, or add a [device cuda] "
                                "template to the device file",
                                spec, item, info[i].model);
        return add_device(m, spec, &d, item);
    }
    return iflow_seterr(IFLOW_ENOTFOUND, "devices '%s': this machine has no %s (%s)", spec, item,
                        iflow_device_cuda_status());
}

int iflow_machine_parse(iflow_machine *m, const char *spec, const iflow_devdb *db, const iflow_machine_opts *o)
{
    memset(m, 0, sizeof *m);
    snprintf(m->label, sizeof m->label, "%s", spec);
    char buf[512];
    if (strlen(spec) >= sizeof buf || !*spec)
        return iflow_seterr(IFLOW_EINVAL, "bad devices '%s'", spec);
    snprintf(buf, sizeof buf, "%s", spec);
    int n_cpu = 0, rc;
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ')
            item++;
        size_t len = strlen(item);
        while (len && item[len - 1] == ' ')
            item[--len] = 0;
        if (!len)
            return iflow_seterr(IFLOW_EINVAL, "devices '%s': an empty item", spec);
        int count = 1, index;
        if (strncmp(item, "cuda:", 5) == 0) {
            if (parse_count(item + 5, strlen(item + 5), &index))
                return iflow_seterr(IFLOW_EINVAL, "devices '%s': bad device '%s' (cuda:N)", spec, item);
            if ((rc = add_live(m, spec, item, index, db)))
                return rc;
            continue;
        }
        const char *name = item, *x = strchr(item, 'x');
        if (x && x > item && parse_count(item, (size_t)(x - item), &count) == 0)
            name = x + 1;
        else if (strncmp(item, "cpu:", 4) == 0) {
            if (parse_count(item + 4, strlen(item + 4), &count))
                return iflow_seterr(IFLOW_EINVAL, "devices '%s': bad item '%s' (cpu:N, N CPU devices)", spec, item);
            name = "cpu";
        }
        if (count < 1 || count > IFLOW_PLAN_MAX_DEVICES)
            return iflow_seterr(IFLOW_EINVAL, "devices '%s': bad count in '%s' (1 to %d)", spec, item, IFLOW_PLAN_MAX_DEVICES);
        const iflow_devdesc *d = iflow_devdb_find(db, name);
        if (!d || strcmp(d->name, "cuda") == 0) {
            char known[512];
            known_names(db, known, sizeof known);
            return iflow_seterr(IFLOW_ENOTFOUND, "unknown device description '%s' in devices '%s' (known: %s; or cuda:N, cpu:N)",
                                name, spec, known);
        }
        if (!d->is_cpu && d->memory == 0)
            return iflow_seterr(IFLOW_EINVAL, "devices '%s': description '%s' has no memory figure", spec, d->name);
        for (int k = 0; k < count; k++)
            if ((rc = add_device(m, spec, d, NULL)))
                return rc;
        if (d->is_cpu)
            n_cpu += count;
    }
    /* names: described GPUs cuda:0.. after the live ones' indices; CPU devices share the host */
    uint64_t host_mem = o ? o->host_memory : 0;
    int host_cores = o ? o->host_cores : 0;
    if (n_cpu && (!host_mem || !host_cores)) {
        iflow_device_info info[IFLOW_PLAN_MAX_DEVICES + 1];
        int n = 0;
        if ((rc = iflow_device_list(info, IFLOW_PLAN_MAX_DEVICES + 1, &n)))
            return rc;
        for (int i = 0; i < n; i++)
            if (info[i].kind == IFLOW_DEVICE_CPU) {
                host_mem = host_mem ? host_mem : info[i].mem_total;
                host_cores = host_cores ? host_cores : info[i].units;
                break;
            }
        if (!host_mem || host_cores < 1)
            return iflow_seterr(IFLOW_ENOTFOUND, "devices '%s': cannot tell this machine's memory and cores", spec);
    }
    int next_gpu = 0, next_cpu = 0;
    for (int i = 0; i < m->n; i++) {
        iflow_pdevice *p = &m->dev[i];
        if (p->d.is_cpu) {
            snprintf(p->name, sizeof p->name, "cpu:%d", next_cpu++);
            p->d.memory = p->d.memory ? p->d.memory : host_mem / (uint64_t)n_cpu;
            p->d.flops = p->d.flops * host_cores / n_cpu;
            if (o && o->cpu_bw > 0)
                p->d.mem_bw = o->cpu_bw;
            if (o && o->host_bw > 0)
                p->d.host_bw = o->host_bw;
        } else if (!p->name[0]) {
            for (int taken = 1; taken;) {
                char name[32];
                snprintf(name, sizeof name, "cuda:%d", next_gpu++);
                taken = 0;
                for (int k = 0; k < m->n; k++)
                    taken |= strcmp(m->dev[k].name, name) == 0;
                if (!taken)
                    snprintf(p->name, sizeof p->name, "%s", name);
            }
        }
        if (o && o->link_bw > 0)
            p->d.link_bw = o->link_bw;
    }
    for (int i = 0; i < m->n; i++)
        for (int k = i + 1; k < m->n; k++)
            if (strcmp(m->dev[i].name, m->dev[k].name) == 0)
                return iflow_seterr(IFLOW_EINVAL, "devices '%s': device '%s' appears twice", spec, m->dev[i].name);
    return 0;
}

/* ===================================================================== model shapes ========= */

static const char *const mat_names[IFLOW_PM_COUNT] = {"wq", "wk", "wv", "wo", "ffn_gate", "ffn_up", "ffn_down"};

void iflow_model_shape_free(iflow_model_shape *s)
{
    free(s->types);
    s->types = NULL;
}

/* Fill types[] from per-tensor types (reqs order) by name. */
static int shape_assign(iflow_model_shape *s, const iflow_tensor_req *reqs, const int *dt, size_t n)
{
    const iflow_hparams *hp = &s->hp;
    s->types = calloc((size_t)hp->n_layers * IFLOW_PM_COUNT, sizeof *s->types);
    if (!s->types)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    s->total_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const iflow_tensor_req *r = &reqs[i];
        size_t b = iflow_tensor_nbytes(dt[i], r->n_dims, r->shape);
        if (b == SIZE_MAX || b == 0)
            return iflow_seterr(IFLOW_ESHAPE, "tensor '%s' in '%s' has a size that cannot be computed", r->name, s->source);
        s->total_bytes += b;
        int l, used = 0;
        char rest[48];
        if (strcmp(r->name, "tok_embd") == 0) {
            s->embed_type = dt[i];
            if (hp->tie_embeddings)
                s->output_type = dt[i];
        } else if (strcmp(r->name, "output") == 0) {
            s->output_type = dt[i];
        } else if (sscanf(r->name, "blk.%d.%47s%n", &l, rest, &used) == 2 && l >= 0 && l < hp->n_layers) {
            for (int k = 0; k < IFLOW_PM_COUNT; k++)
                if (strcmp(rest, mat_names[k]) == 0)
                    s->types[l * IFLOW_PM_COUNT + k] = dt[i];
        }
    }
    return 0;
}

static int shape_check_hp(const iflow_model_shape *s)
{
    const iflow_hparams *hp = &s->hp;
    if (hp->layout == IFLOW_LAYOUT_ENCODER_DECODER) /* its encoder and cross-attention are not in the cost model */
        return iflow_seterr(IFLOW_EUNSUPPORTED, "'%s' is an encoder-decoder: partitioning one is not implemented (it runs "
                            "on the cpu)", s->source);
    if (hp->n_experts) /* its experts are not in the cost model, nor in the plans' ranges */
        return iflow_seterr(IFLOW_EUNSUPPORTED, "'%s' is a mixture of experts: partitioning one is not implemented yet "
                            "(it runs on the cpu)", s->source);
    if (hp->kv_lora_rank) /* its latent matrices are not in the cost model; its layers run on host memory */
        return iflow_seterr(IFLOW_EUNSUPPORTED, "'%s' has latent attention (kv_lora_rank): partitioning it is not "
                            "implemented yet (it runs on the cpu)", s->source);
    if (hp->n_layers < 1 || hp->n_heads < 1 || hp->n_kv_heads < 1 || hp->n_heads % hp->n_kv_heads || hp->ffn_dim < 1 ||
        hp->dim < 1 || hp->head_dim < 1)
        return iflow_seterr(IFLOW_ESHAPE, "'%s': a model of %d layers, %d heads, %d kv heads, ffn %d cannot be partitioned",
                            s->source, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->ffn_dim);
    return 0;
}

int iflow_model_shape_from_config(iflow_model_shape *s, const char *dir, int dtype, const char *spec_path,
                                  const char *const *spec_dirs, size_t n_spec_dirs)
{
    memset(s, 0, sizeof *s);
    snprintf(s->source, sizeof s->source, "%s", dir);
    if (!iflow_dtype_is_float(dtype) && !iflow_dtype_is_quant(dtype))
        return iflow_seterr(IFLOW_EINVAL, "type %d is not a type for weight matrices", dtype);
    iflow_convert_opts co = {.dtype = dtype, .spec_path = spec_path, .spec_dirs = spec_dirs, .n_spec_dirs = n_spec_dirs};
    json_t *resolved = NULL;
    iflow_tensor_req *reqs = NULL;
    int *dt = NULL;
    size_t n = 0;
    int rc = iflow_convert_resolve(dir, &co, &resolved);
    if (rc == 0)
        rc = iflow_hparams_from_json(&s->hp, resolved, dir);
    if (rc == 0)
        rc = shape_check_hp(s);
    if (rc == 0)
        rc = iflow_model_tensors(&s->hp, &reqs, &n);
    if (rc == 0 && !(dt = malloc(n * sizeof *dt)))
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++)
        dt[i] = reqs[i].is_vector ? IFLOW_DT_F32 : dtype;
    if (rc == 0)
        rc = shape_assign(s, reqs, dt, n);
    json_decref(resolved);
    free(reqs);
    free(dt);
    if (rc)
        iflow_model_shape_free(s);
    return rc;
}

int iflow_model_shape_from_shard(iflow_model_shape *s, const char *path)
{
    memset(s, 0, sizeof *s);
    snprintf(s->source, sizeof s->source, "%s", strcmp(path, "-") ? path : "<stdin>");
    iflow_shard_reader *r = NULL;
    iflow_shard_rec rec;
    iflow_tensor_req *reqs = NULL;
    int *dt = NULL;
    size_t n = 0;
    iflow_strmap idx = {0};
    json_t *meta = NULL;
    int rc = iflow_shard_reader_open(&r, path);
    if (rc == 0 && (rc = iflow_shard_reader_next(r, &rec)) >= 0) {
        if (rc == 0 || rec.kind != IFLOW_REC_BLOB || strcmp(rec.name, "meta") != 0)
            rc = iflow_seterr(IFLOW_EFORMAT, "'%s' does not start with a meta record", s->source);
        else
            rc = iflow_json_load_buf(&meta, rec.data, rec.nbytes, s->source);
    }
    if (rc == 0 && iflow_json_int(meta, "shard.count", 1) > 1)
        rc = iflow_seterr(IFLOW_EUNSUPPORTED, "'%s' is one shard of %d: give the whole model", s->source,
                          (int)iflow_json_int(meta, "shard.count", 1));
    if (rc == 0)
        rc = iflow_hparams_from_json(&s->hp, meta, s->source);
    if (rc == 0)
        rc = shape_check_hp(s);
    if (rc == 0)
        rc = iflow_model_tensors(&s->hp, &reqs, &n);
    if (rc == 0 && !(dt = malloc(n * sizeof *dt)))
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        dt[i] = -1;
        rc = iflow_strmap_put(&idx, reqs[i].name, strlen(reqs[i].name), (int32_t)i);
        rc = rc > 0 ? 0 : rc;
    }
    while (rc == 0 && (rc = iflow_shard_reader_next(r, &rec)) > 0) {
        rc = 0;
        if (rec.kind != IFLOW_REC_TENSOR)
            continue;
        int32_t i = iflow_strmap_get(&idx, rec.name, strlen(rec.name));
        if (i < 0)
            continue;
        const iflow_tensor_req *q = &reqs[i];
        if (rec.n_dims != q->n_dims || rec.shape[0] != q->shape[0] || (q->n_dims == 2 && rec.shape[1] != q->shape[1]))
            rc = iflow_seterr(IFLOW_ESHAPE, "tensor '%s' in '%s' has shape [%lld, %lld], expected [%lld, %lld]", q->name,
                              s->source, (long long)rec.shape[0], (long long)(rec.n_dims > 1 ? rec.shape[1] : 0),
                              (long long)q->shape[0], (long long)q->shape[1]);
        else if (!iflow_dtype_is_float(rec.dtype) && !iflow_dtype_is_quant(rec.dtype))
            rc = iflow_seterr(IFLOW_ESHAPE, "tensor '%s' in '%s' has type %d, which the engine cannot use", q->name,
                              s->source, rec.dtype);
        else
            dt[i] = rec.dtype;
    }
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (dt[i] < 0)
            rc = iflow_seterr(IFLOW_ENOTFOUND, "missing tensor '%s' in '%s'", reqs[i].name, s->source);
    if (rc == 0)
        rc = shape_assign(s, reqs, dt, n);
    iflow_shard_reader_close(r);
    iflow_strmap_free(&idx);
    json_decref(meta);
    free(reqs);
    free(dt);
    if (rc)
        iflow_model_shape_free(s);
    return rc < 0 ? rc : 0;
}

/* ===================================================================== bytes of a plan ====== */

typedef struct {
    uint64_t attn_w, ffn_w;        /* weight bytes of the part's attention and FFN slices */
    uint64_t mb[IFLOW_PM_COUNT];   /* of them, each matrix slice's                         */
    const int *types;              /* the layer's matrix types [IFLOW_PM_COUNT]             */
    double attn_flop, ffn_flop;    /* per token: 2 x elements                              */
    int nq, nkv, nf;               /* heads, kv heads, FFN columns                         */
} part_size;

/* One device's part of layer l: heads q0..q1-1 (and the kv heads they read), columns f0..f1-1.
 * The same slices place.c puts on a device. */
static part_size part_of(const iflow_model_shape *m, int l, int q0, int q1, int f0, int f1)
{
    const iflow_hparams *hp = &m->hp;
    const int *t = &m->types[l * IFLOW_PM_COUNT];
    part_size p = {0};
    p.nq = q1 - q0;
    p.nkv = iflow_part_kv_heads(hp, q0, q1);
    p.nf = f1 - f0;
    int64_t D = hp->dim, hd = hp->head_dim, nq = (int64_t)p.nq * hd, nkv = (int64_t)p.nkv * hd, nf = p.nf;
    iflow_part_bytes b = iflow_part_weight_bytes(hp, t, q0, q1, f0, f1); /* footprint.h, as place.c */
    p.attn_w = b.attn;
    p.ffn_w = b.ffn;
    iflow_part_matrix_bytes(hp, t, q0, q1, f0, f1, p.mb);
    p.types = t;
    p.attn_flop = 2.0 * (double)D * (double)(2 * nq + 2 * nkv);
    p.ffn_flop = 2.0 * (double)D * (double)((hp->ffn == IFLOW_FFN_GATED ? 3 : 2) * nf);
    return p;
}

/* KV cache of one layer part: K and V rows (F32, as the engine keeps them) for n_ctx positions. */
static uint64_t kv_part(const iflow_model_shape *m, int nkv, int n_ctx, int seqs)
{
    return (uint64_t)seqs * iflow_part_kv_bytes(&m->hp, nkv, n_ctx);
}

static uint64_t output_bytes(const iflow_model_shape *m) { return iflow_output_bytes(&m->hp, m->output_type); }

/* A row of logits per sequence (F32) on the output device; an encoder computes none. */
static uint64_t logits_bytes(const iflow_model_shape *m, int seqs)
{
    return m->hp.layout == IFLOW_LAYOUT_ENCODER ? 0 : (uint64_t)m->hp.vocab_size * 4 * (uint64_t)seqs;
}

/* Scratch of a device that runs layers (forward.c: one pass of activations; a GPU's as if the
 * plan ran in one process with no layer on a CPU, the larger pass); the output device also
 * holds a row of logits per sequence, counted where the output is placed. */
static uint64_t scratch_bytes(const iflow_model_shape *m, int batch, int is_cpu)
{
    return iflow_scratch_bytes(&m->hp, !is_cpu && batch < IFLOW_GPU_PASS ? IFLOW_GPU_PASS : batch);
}

/* ===================================================================== the cost model ====== */

static int opt_ctx(const iflow_partition_opts *o) { return o && o->n_ctx > 0 ? o->n_ctx : DEFAULT_CTX; }
static int opt_batch(const iflow_partition_opts *o) { return o && o->batch > 0 ? o->batch : 1; }

/* Time of reading `bytes` and computing `flop` on one device: whichever bounds it. */
static double dev_time(const iflow_devdesc *d, double bytes, double flop)
{
    double t = bytes / d->mem_bw;
    if (d->flops > 0 && flop / d->flops > t)
        t = flop / d->flops;
    return t;
}

/* The bytes of part s as decode reads them on device d: each matrix slice's bytes over the
 * fraction of the bandwidth its type is read at there, the vectors' over F32's. */
typedef struct { double attn, ffn; } part_read;

static part_read part_effective(const iflow_devdesc *d, const part_size *s)
{
    const uint64_t *mb = s->mb;
    double mat_a = (double)(mb[IFLOW_PM_WQ] + mb[IFLOW_PM_WK] + mb[IFLOW_PM_WV] + mb[IFLOW_PM_WO]);
    double mat_f = (double)(mb[IFLOW_PM_GATE] + mb[IFLOW_PM_UP] + mb[IFLOW_PM_DOWN]);
    double f32 = d->eff[IFLOW_DT_F32];
    part_read r = {((double)s->attn_w - mat_a) / f32, ((double)s->ffn_w - mat_f) / f32};
    for (int k = 0; k < IFLOW_PM_COUNT; k++)
        if (mb[k]) /* a plain FFN has no gate */
            *(k <= IFLOW_PM_WO ? &r.attn : &r.ffn) += (double)mb[k] / d->eff[s->types[k]];
    return r;
}

/* Ring all-reduce of `bytes` over n devices: 2(n-1)/n x bytes / link + 2(n-1) x latency. */
static double allreduce_time(int n, double bytes, double link_bw, double lat)
{
    if (n < 2)
        return 0;
    return 2.0 * (n - 1) / n * bytes / link_bw + 2.0 * (n - 1) * lat;
}

typedef uint32_t devmask;

static devmask layer_mask(const iflow_plan *p, int l)
{
    devmask mk = 0;
    for (int i = 0; i < p->n_devices; i++)
        if (l >= p->devices[i].layer0 && l < p->devices[i].layer1)
            mk |= 1u << i;
    return mk;
}

/* The slowest link among the devices of a mask, and its latency. */
static void mask_link(const iflow_pdevice *const *dev, devmask mk, double *bw, double *lat)
{
    *bw = 0, *lat = 0;
    for (int i = 0; i < IFLOW_PLAN_MAX_DEVICES; i++)
        if (mk & (1u << i)) {
            if (*bw == 0 || dev[i]->d.link_bw < *bw)
                *bw = dev[i]->d.link_bw;
            if (dev[i]->d.link_lat > *lat)
                *lat = dev[i]->d.link_lat;
        }
}

static int count_stages(const iflow_plan *p)
{
    int n = 0;
    devmask prev = 0;
    for (int l = 0; l < p->n_layers; l++) {
        devmask mk = layer_mask(p, l);
        n += mk != prev;
        prev = mk;
    }
    return n;
}

int iflow_partition_cost_of(iflow_partition_cost *c, const iflow_plan *p, const iflow_model_shape *m,
                            const iflow_machine *mc, const iflow_partition_opts *o)
{
    const iflow_hparams *hp = &m->hp;
    memset(c, 0, sizeof *c);
    int rc = iflow_plan_check(p, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->ffn_dim);
    if (rc == 0)
        rc = iflow_plan_splittable(p, hp);
    if (rc)
        return rc;
    const iflow_pdevice *dev[IFLOW_PLAN_MAX_DEVICES];
    for (int i = 0; i < p->n_devices; i++) {
        dev[i] = NULL;
        for (int k = 0; k < mc->n && !dev[i]; k++)
            if (strcmp(mc->dev[k].name, p->devices[i].name) == 0)
                dev[i] = &mc->dev[k];
        if (!dev[i])
            return iflow_seterr(IFLOW_EINVAL, "plan device '%s' is not one of the devices '%s'", p->devices[i].name,
                                mc->label);
        snprintf(c->device[i], sizeof c->device[i], "%s", dev[i]->d.name);
    }
    int n_ctx = opt_ctx(o), B = opt_batch(o);
    c->n_devices = p->n_devices;
    c->n_stages = count_stages(p);
    c->sequences = B * (o && o->objective == IFLOW_OBJ_THROUGHPUT ? c->n_stages : 1);
    /* layout: layer groups x the most parts of a layer */
    for (int l = 0; l < hp->n_layers; l++) {
        int idx[IFLOW_PLAN_MAX_DEVICES], k = iflow_plan_layer_devices(p, l, idx);
        if (k > c->heads_split)
            c->heads_split = k;
    }
    c->groups = c->n_stages;

    /* memory */
    int used[IFLOW_PLAN_MAX_DEVICES] = {0};
    for (int i = 0; i < p->n_devices; i++) {
        const iflow_plan_device *d = &p->devices[i];
        for (int l = d->layer0; l < d->layer1; l++) {
            part_size s = part_of(m, l, d->head0, d->head1, d->ffn0, d->ffn1);
            c->mem[i].weights += s.attn_w + s.ffn_w;
            c->mem[i].kv += kv_part(m, s.nkv, n_ctx, c->sequences);
            used[i] = 1;
        }
    }
    c->mem[p->output_device].weights += output_bytes(m);
    c->mem[p->output_device].scratch += logits_bytes(m, B);
    used[p->output_device] = 1;
    c->short_device = -1;
    c->fits = 1;
    for (int i = 0; i < p->n_devices; i++) {
        iflow_partition_mem *x = &c->mem[i];
        if (used[i])
            x->scratch += scratch_bytes(m, B, dev[i]->d.is_cpu);
        x->total = x->weights + x->kv + x->scratch;
        x->capacity = dev[i]->d.memory;
        if (x->total > c->mem_max)
            c->mem_max = x->total;
        if (x->total > x->capacity && c->fits) {
            c->fits = 0;
            c->short_device = i;
            c->short_bytes = x->total - x->capacity;
        }
    }

    /* time of one decode step: B tokens, KV read at the mean position n_ctx / 2 */
    double act = (double)hp->dim * B * 4, stage = 0;
    devmask prev = 0;
    for (int l = 0; l < hp->n_layers; l++) {
        int idx[IFLOW_PLAN_MAX_DEVICES], k = iflow_plan_layer_devices(p, l, idx);
        devmask mk = layer_mask(p, l);
        double bw, lat;
        if (l > 0 && mk != prev) {
            mask_link(dev, mk | prev, &bw, &lat);
            double t = act / bw + lat;
            c->t_transfer += t;
            stage += t;
            if (stage > c->stage_max)
                c->stage_max = stage;
            stage = 0;
        }
        prev = mk;
        double ta = 0, tf = 0, fixed = 0, host_a = 0, host_f = 0, host_bw = 0;
        for (int a = 0; a < k; a++) {
            const iflow_plan_device *d = &p->devices[idx[a]];
            const iflow_devdesc *dd = &dev[idx[a]]->d;
            part_size s = part_of(m, l, d->head0, d->head1, d->ffn0, d->ffn1);
            part_read r = part_effective(dd, &s);
            /* 2 x (n_ctx/2) rows of K and V, F32, read at F32's efficiency */
            double kv_read = (double)B * n_ctx * s.nkv * hp->head_dim * 4 / dd->eff[IFLOW_DT_F32];
            double att_flop = (double)B * 2.0 * s.nq * hp->head_dim * n_ctx; /* q.k and p.v over n_ctx/2     */
            double t1 = dev_time(dd, r.attn + kv_read, B * s.attn_flop + att_flop);
            double t2 = dev_time(dd, r.ffn, B * s.ffn_flop);
            ta = t1 > ta ? t1 : ta;
            tf = t2 > tf ? t2 : tf;
            fixed = dd->overhead > fixed ? dd->overhead : fixed;
            if (dd->is_cpu && dd->host_bw > 0) { /* CPU devices read one host's memory together */
                host_a += r.attn + kv_read, host_f += r.ffn;
                host_bw = host_bw == 0 || dd->host_bw < host_bw ? dd->host_bw : host_bw;
            }
        }
        if (host_bw > 0) {
            ta = host_a / host_bw > ta ? host_a / host_bw : ta;
            tf = host_f / host_bw > tf ? host_f / host_bw : tf;
        }
        mask_link(dev, mk, &bw, &lat);
        double tr = 2 * allreduce_time(k, act, bw, lat);
        c->t_read += ta + tf;
        c->t_fixed += fixed;
        c->t_allreduce += tr;
        stage += ta + tf + fixed + tr;
    }
    /* the output: from the last layer's devices to the output device, then norm and matrix */
    if (!(prev & (1u << p->output_device))) {
        double bw, lat;
        mask_link(dev, prev | (1u << p->output_device), &bw, &lat);
        c->t_transfer += act / bw + lat;
        stage += act / bw + lat;
    }
    const iflow_devdesc *od = &dev[p->output_device]->d;
    c->t_output = hp->layout == IFLOW_LAYOUT_ENCODER ? 0.0 /* no output matrix */
                                                     : dev_time(od, (double)output_bytes(m) / od->eff[m->output_type],
                                                                2.0 * B * (double)hp->vocab_size * hp->dim);
    stage += c->t_output;
    if (stage > c->stage_max)
        c->stage_max = stage;
    c->latency = c->t_read + c->t_fixed + c->t_allreduce + c->t_transfer + c->t_output;
    c->tokens_per_s = B / c->stage_max;
    return 0;
}

/* ===================================================================== strategies ========== */

const char *iflow_strategy_name(int s)
{
    static const char *const names[] = {"layer", "tensor", "hybrid", "gpu-cpu", "auto"};
    return s >= 0 && s <= IFLOW_STRAT_AUTO ? names[s] : NULL;
}

int iflow_strategy_from_name(const char *name)
{
    for (int s = 0; s <= IFLOW_STRAT_AUTO; s++)
        if (strcmp(name, iflow_strategy_name(s)) == 0)
            return s;
    return -1;
}

/* Split `units` into n counts, each >= 1, proportional to w (largest remainder). units >= n. */
static void apportion(int units, int n, const double *w, int *count)
{
    double sum = 0, ideal[IFLOW_PLAN_MAX_DEVICES];
    for (int i = 0; i < n; i++)
        sum += w[i] > 0 ? w[i] : 0;
    int total = 0;
    for (int i = 0; i < n; i++) {
        ideal[i] = sum > 0 ? units * (w[i] > 0 ? w[i] : 0) / sum : (double)units / n;
        count[i] = (int)ideal[i];
        if (count[i] < 1)
            count[i] = 1;
        total += count[i];
    }
    while (total < units) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (ideal[i] - count[i] > ideal[best] - count[best])
                best = i;
        count[best]++, total++;
    }
    while (total > units) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (count[i] > 1 && (best < 0 || ideal[i] - count[i] < ideal[best] - count[best]))
                best = i;
        count[best]--, total--;
    }
}

/* Query-head ranges of n parts of a layer, obeying plan.h's GQA rule: whole KV-head groups when
 * n <= kv heads, else each part inside one group (the group's KV head replicated). */
static int split_heads(const iflow_model_shape *m, int n, const double *w, int *h0, int *h1)
{
    int H = m->hp.n_heads, K = m->hp.n_kv_heads, g = H / K, cnt[IFLOW_PLAN_MAX_DEVICES];
    if (n > H)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "cannot split %d query heads over %d devices: more devices than heads", H, n);
    if (n <= K) {
        apportion(K, n, w, cnt);
        for (int i = 0, at = 0; i < n; i++) {
            h0[i] = at * g;
            at += cnt[i];
            h1[i] = at * g;
        }
        return 0;
    }
    double ones[IFLOW_PLAN_MAX_DEVICES];
    for (int i = 0; i < K && i < IFLOW_PLAN_MAX_DEVICES; i++)
        ones[i] = 1;
    apportion(n, K, ones, cnt); /* devices per KV-head group: n > K, so at most 16 groups matter */
    for (int k = 0, dev = 0; k < K; k++) {
        int per[IFLOW_PLAN_MAX_DEVICES];
        apportion(g, cnt[k], w + dev, per);
        for (int j = 0, at = k * g; j < cnt[k]; j++, dev++) {
            h0[dev] = at;
            at += per[j];
            h1[dev] = at;
        }
    }
    return 0;
}

/* The block size FFN and head splits must respect: ffn_down and wo column slices of a
 * quantized type fall on whole blocks (place.c refuses others). */
static int column_block(const iflow_model_shape *m, int k)
{
    int b = 1;
    for (int l = 0; l < m->hp.n_layers; l++) {
        const ifk_qtype_info *q = ifk_qtype(m->types[l * IFLOW_PM_COUNT + k]);
        if (q && q->block > b)
            b = q->block;
    }
    return b;
}

static int split_ffn(const iflow_model_shape *m, int n, const double *w, int *f0, int *f1)
{
    int F = m->hp.ffn_dim, q = column_block(m, IFLOW_PM_DOWN), units = (F + q - 1) / q, cnt[IFLOW_PLAN_MAX_DEVICES];
    if (units < n)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "cannot split %d FFN columns (%d blocks of %d) over %d devices", F,
                            units, q, n);
    apportion(units, n, w, cnt);
    for (int i = 0, at = 0; i < n; i++) {
        f0[i] = at * q < F ? at * q : F;
        at += cnt[i];
        f1[i] = at * q < F ? at * q : F;
    }
    return 0;
}

static int check_wo_split(const iflow_model_shape *m, int h0)
{
    int b = column_block(m, IFLOW_PM_WO), c0 = h0 * m->hp.head_dim;
    if (b > 1 && c0 % b)
        return iflow_seterr(IFLOW_EUNSUPPORTED,
                            "cannot split the heads at head %d: column %d of 'wo' is inside a block of %d of its "
                            "quantized type (head_dim %d)",
                            h0, c0, b, m->hp.head_dim);
    return 0;
}

/* Bytes of whole layer l with its KV cache, and the fixed needs of a device. */
static double layer_need(const iflow_model_shape *m, int l, int n_ctx, int seqs)
{
    part_size s = part_of(m, l, 0, m->hp.n_heads, 0, m->hp.ffn_dim);
    return (double)(s.attn_w + s.ffn_w) + (double)kv_part(m, s.nkv, n_ctx, seqs);
}

/* Layer ranges of G groups, sized to each group's capacity (bounds[0..G], bounds[0] = 0). */
static void split_layers(const iflow_model_shape *m, int G, const double *cap, int n_ctx, int seqs, int *bounds)
{
    int L = m->hp.n_layers;
    double total = 0, sum_cap = 0;
    for (int l = 0; l < L; l++)
        total += layer_need(m, l, n_ctx, seqs);
    for (int j = 0; j < G; j++)
        sum_cap += cap[j] > 1 ? cap[j] : 1;
    double end = 0, cum = 0;
    int l = 0;
    bounds[0] = 0;
    for (int j = 0; j < G - 1; j++) {
        end += total * (cap[j] > 1 ? cap[j] : 1) / sum_cap;
        int first = l;
        while (l < L - (G - 1 - j)) {
            double c = layer_need(m, l, n_ctx, seqs);
            if (l > first && cum + c / 2 > end)
                break;
            cum += c;
            l++;
        }
        bounds[j + 1] = l;
    }
    bounds[G] = L;
}

/* Fill plan devices: G layer groups of T devices (devs[j*T + t]), output on the last group's
 * first device. */
static int build_grouped(iflow_plan *p, const iflow_model_shape *m, const iflow_machine *mc, const int *devs, int G,
                         int T, const char *strategy, const iflow_partition_opts *o)
{
    const iflow_hparams *hp = &m->hp;
    int n_ctx = opt_ctx(o), B = opt_batch(o), rc;
    int seqs = B * (o && o->objective == IFLOW_OBJ_THROUGHPUT ? G : 1);
    double w[IFLOW_PLAN_MAX_DEVICES], cap[IFLOW_PLAN_MAX_DEVICES];
    int h0[IFLOW_PLAN_MAX_DEVICES], h1[IFLOW_PLAN_MAX_DEVICES], f0[IFLOW_PLAN_MAX_DEVICES], f1[IFLOW_PLAN_MAX_DEVICES];
    int bounds[IFLOW_PLAN_MAX_DEVICES + 1];
    if (G > hp->n_layers)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "cannot split %d layers into %d layer groups", hp->n_layers, G);
    for (int j = 0; j < G; j++) {
        cap[j] = 0;
        for (int t = 0; t < T; t++)
            cap[j] += (double)mc->dev[devs[j * T + t]].d.memory -
                      (double)scratch_bytes(m, B, mc->dev[devs[j * T + t]].d.is_cpu);
        if (j == G - 1)
            cap[j] -= (double)output_bytes(m) + (double)logits_bytes(m, B);
    }
    split_layers(m, G, cap, n_ctx, seqs, bounds);
    memset(p, 0, sizeof *p);
    snprintf(p->strategy, sizeof p->strategy, "%s", strategy);
    p->n_layers = hp->n_layers, p->n_heads = hp->n_heads, p->n_kv_heads = hp->n_kv_heads, p->ffn_dim = hp->ffn_dim;
    for (int j = 0; j < G; j++) {
        for (int t = 0; t < T; t++)
            w[t] = mc->dev[devs[j * T + t]].d.mem_bw;
        if ((rc = split_heads(m, T, w, h0, h1)) || (rc = split_ffn(m, T, w, f0, f1)))
            return rc;
        for (int t = 0; t < T; t++) {
            if ((rc = check_wo_split(m, h0[t])))
                return rc;
            iflow_plan_device *d = &p->devices[p->n_devices++];
            snprintf(d->name, sizeof d->name, "%s", mc->dev[devs[j * T + t]].name);
            d->layer0 = bounds[j], d->layer1 = bounds[j + 1];
            d->head0 = h0[t], d->head1 = h1[t], d->ffn0 = f0[t], d->ffn1 = f1[t];
        }
    }
    p->output_device = (G - 1) * T;
    return 0;
}

/* The first N layers on the GPU, N as large as fits; the rest on the CPU. */
static int build_gpu_cpu(iflow_plan *p, const iflow_model_shape *m, const iflow_machine *mc, const iflow_partition_opts *o)
{
    const iflow_hparams *hp = &m->hp;
    int gpu = -1, cpu = -1, n_ctx = opt_ctx(o), B = opt_batch(o);
    for (int i = 0; i < mc->n; i++) {
        if (mc->dev[i].d.is_cpu && cpu < 0)
            cpu = i;
        if (!mc->dev[i].d.is_cpu && gpu < 0)
            gpu = i;
    }
    if (gpu < 0 || cpu < 0)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "gpu-cpu needs a GPU and a CPU among the devices '%s' (such as H100-80G,cpu)",
                            mc->label);
    int seqs = B * (o && o->objective == IFLOW_OBJ_THROUGHPUT ? 2 : 1);
    double room = (double)mc->dev[gpu].d.memory - (double)scratch_bytes(m, B, 0), used = 0;
    int N = 0;
    while (N < hp->n_layers && used + layer_need(m, N, n_ctx, seqs) <= room)
        used += layer_need(m, N++, n_ctx, seqs);
    if (N == hp->n_layers && used + (double)output_bytes(m) + (double)logits_bytes(m, B) > room)
        N--; /* all layers but not the output: leave the last layer to the CPU */
    memset(p, 0, sizeof *p);
    snprintf(p->strategy, sizeof p->strategy, "gpu-cpu");
    p->n_layers = hp->n_layers, p->n_heads = hp->n_heads, p->n_kv_heads = hp->n_kv_heads, p->ffn_dim = hp->ffn_dim;
    if (N > 0) {
        iflow_plan_device *d = &p->devices[p->n_devices++];
        snprintf(d->name, sizeof d->name, "%s", mc->dev[gpu].name);
        d->layer0 = 0, d->layer1 = N, d->head1 = hp->n_heads, d->ffn1 = hp->ffn_dim;
    }
    if (N < hp->n_layers) {
        iflow_plan_device *d = &p->devices[p->n_devices++];
        snprintf(d->name, sizeof d->name, "%s", mc->dev[cpu].name);
        d->layer0 = N, d->layer1 = hp->n_layers, d->head1 = hp->n_heads, d->ffn1 = hp->ffn_dim;
    }
    p->output_device = p->n_devices - 1;
    return 0;
}

/* a is better than b for the objective */
static int better(const iflow_partition_cost *a, const iflow_partition_cost *b, int objective)
{
    if (a->fits != b->fits)
        return a->fits;
    if (!a->fits)
        return a->short_bytes < b->short_bytes;
    if (objective == IFLOW_OBJ_THROUGHPUT)
        return a->tokens_per_s > b->tokens_per_s * (1 + 1e-9) ||
               (a->tokens_per_s >= b->tokens_per_s * (1 - 1e-9) && a->latency < b->latency * (1 - 1e-9));
    return a->latency < b->latency * (1 - 1e-9) ||
           (a->latency <= b->latency * (1 + 1e-9) && a->tokens_per_s > b->tokens_per_s * (1 + 1e-9));
}

static int refuse(const iflow_plan *p, const iflow_partition_cost *c, const iflow_partition_opts *o)
{
    if (c->fits)
        return 0;
    int i = c->short_device;
    const iflow_partition_mem *x = &c->mem[i];
    char a[32], b[32], w[32], k[32], s[32], h[32];
    return iflow_seterr(IFLOW_ENOMEM,
                        "%s (%s) lacks %s (%llu bytes) for the %s plan: it needs %s (weights %s, KV cache %s for %d "
                        "positions x %d sequence%s, scratch %s) and has %s",
                        p->devices[i].name, c->device[i], iflow_bytes_str(a, sizeof a, c->short_bytes),
                        (unsigned long long)c->short_bytes, p->strategy, iflow_bytes_str(b, sizeof b, x->total),
                        iflow_bytes_str(w, sizeof w, x->weights), iflow_bytes_str(k, sizeof k, x->kv), opt_ctx(o),
                        c->sequences, c->sequences == 1 ? "" : "s", iflow_bytes_str(s, sizeof s, x->scratch),
                        iflow_bytes_str(h, sizeof h, x->capacity));
}

static int make_one(iflow_plan *p, iflow_partition_cost *c, const iflow_model_shape *m, const iflow_machine *mc,
                    int strategy, const iflow_partition_opts *o)
{
    const iflow_hparams *hp = &m->hp;
    int devs[IFLOW_PLAN_MAX_DEVICES], n = mc->n, rc;
    for (int i = 0; i < n; i++)
        devs[i] = i;
    if (n < 1)
        return iflow_seterr(IFLOW_EINVAL, "no devices to partition over");
    switch (strategy) {
    case IFLOW_STRAT_LAYER:
        rc = build_grouped(p, m, mc, devs, n < hp->n_layers ? n : hp->n_layers, 1, "layer", o);
        break;
    case IFLOW_STRAT_TENSOR:
        rc = build_grouped(p, m, mc, devs, 1, n, "tensor", o);
        break;
    case IFLOW_STRAT_HYBRID: {
        rc = 1;
        iflow_plan cand;
        iflow_partition_cost cc;
        for (int G = 2; G < n; G++) {
            if (n % G || G > hp->n_layers)
                continue;
            if (build_grouped(&cand, m, mc, devs, G, n / G, "hybrid", o) || iflow_partition_cost_of(&cc, &cand, m, mc, o))
                continue;
            if (rc || better(&cc, c, o ? o->objective : 0)) {
                *p = cand, *c = cc;
                rc = 0;
            }
        }
        if (rc)
            return iflow_seterr(IFLOW_EUNSUPPORTED,
                                "hybrid needs a device count G x T with G, T > 1, G layer groups of at most %d layers and T "
                                "head groups of at most %d heads: %d devices have none",
                                hp->n_layers, hp->n_heads, n);
        return refuse(p, c, o);
    }
    case IFLOW_STRAT_GPU_CPU:
        rc = build_gpu_cpu(p, m, mc, o);
        break;
    default:
        return iflow_seterr(IFLOW_EINVAL, "unknown strategy %d", strategy);
    }
    if (rc || (rc = iflow_partition_cost_of(c, p, m, mc, o)))
        return rc;
    return refuse(p, c, o);
}

int iflow_partition_make(iflow_plan *p, iflow_partition_cost *c, const iflow_model_shape *m, const iflow_machine *mc,
                         int strategy, const iflow_partition_opts *o)
{
    if (strategy != IFLOW_STRAT_AUTO)
        return make_one(p, c, m, mc, strategy, o);
    int best = -1, best_rc = 0;
    char best_msg[1024] = "";
    iflow_plan cand;
    iflow_partition_cost cc;
    for (int s = 0; s < IFLOW_STRAT_COUNT; s++) {
        int rc = make_one(&cand, &cc, m, mc, s, o);
        if (rc && rc != IFLOW_ENOMEM) {
            if (best < 0 && !best_msg[0])
                snprintf(best_msg, sizeof best_msg, "%s", iflow_errmsg()), best_rc = rc;
            continue;
        }
        if (best < 0 || better(&cc, c, o ? o->objective : 0)) {
            best = s, best_rc = rc;
            *p = cand, *c = cc;
            snprintf(best_msg, sizeof best_msg, "%s", rc ? iflow_errmsg() : "");
        }
    }
    if (best_rc)
        return iflow_seterr(best_rc, "no strategy fits: %s", best_msg);
    return 0;
}
