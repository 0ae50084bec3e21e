/* cpu.c -- the CPU device: today's kernels (kernels/cpu) behind the device vtable. See device.h.
 *
 * Memory is the host's, so weights are used in place from the model's mapping and upload /
 * download are memcpy. Every operation runs to completion before it returns and never fails.
 */
#include "device_impl.h"
#include "libcore/base/error.h"
#include "kernels/cpu/bigmem.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/quant.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Freeing waits for any pool worker still inside an item it was too late for (pool.h): such
 * an item may be reading this memory. */
static void cpu_close(iflow_device *d)
{
    ifk_pool_quiesce();
    free(d);
}

static int cpu_alloc(iflow_device *d, void **p, size_t nbytes)
{
    /* Zero pages until first touched (a large KV cache costs nothing until the context grows
     * into it); large blocks in huge pages, which stream faster (bigmem.h). */
    *p = ifk_bigmem_alloc(nbytes);
    if (!*p) {
        char h[32];
        return iflow_seterr(IFLOW_ENOMEM, "out of memory allocating %s on the cpu", iflow_bytes_str(h, sizeof h, nbytes));
    }
    return 0;
}

void iflow_cpu_free(iflow_device *d, void *p)
{
    ifk_pool_quiesce();
    ifk_bigmem_free(p);
}

static int cpu_copy(iflow_device *d, void *dst, const void *src, size_t nbytes)
{
    if (dst != src)
        memmove(dst, src, nbytes);
    return 0;
}

static int cpu_supports(const iflow_device *d, int wtype) { return 1; /* every type has a CPU kernel */ }

/* Quantized matrices into 16-row tiles (qpack.h), where this CPU's product has a kernel for
 * them (every type on AVX-512 with VNNI, GFNI and VBMI; Q4 and Q8 with VNNI alone, and on AVX2);
 * the copy is d's memory (its alloc op), the host's for d NULL. */
int iflow_cpu_pack(iflow_device *d, void **out, int *out_type, const void *W, int wtype, int N, int K)
{
    *out = NULL;
    int ptype = ifk_qpack_type(wtype);
    if (!ptype)
        return 0;
    size_t n = ifk_qpack_bytes(wtype, N, K);
    void *p;
    int rc = d ? d->ops->alloc(d, &p, n) : cpu_alloc(NULL, &p, n); /* d: a CPU device, or one built on it (tests) */
    if (rc < 0)
        return rc;
    ifk_qpack(p, W, wtype, N, K);
    *out = p;
    *out_type = ptype;
    return 0;
}

/* Items of a product may be taken back from a preempted worker (pool.h): every weight this
 * device multiplies by is freed only after ifk_pool_quiesce() (cpu_free, the shard mapping,
 * model close). */
static int cpu_matmul(iflow_device *d, float *y, size_t ldy, const void *W, int wtype, const float *x, size_t ldx,
                      int T, int N, int K)
{
    int was = ifk_pool_set_take_back(1);
    ifk_matmul(y, ldy, W, wtype, x, ldx, T, N, K, d->n_threads);
    ifk_pool_set_take_back(was);
    return 0;
}

/* ---- row-wise and element-wise operations on the device's threads -------------------------
 *
 * A prefill's norms, RoPE, SiLU and residual adds ran on the submitting thread alone while the
 * other threads waited for the next product (2-3 % of a 2-thread prefill). They are split into
 * pieces on the pool (pool.h) when the work is large enough to pay for a job: rows for the norm
 * and RoPE, runs of elements starting at multiples of 16 (where every SIMD path's lanes start)
 * for SiLU and add, so every element gets the operations it gets on one thread. Pieces may be
 * taken back from a preempted worker: a worker computes its piece into its scratch (a copy of
 * the piece's input first, for the in-place operations) and span_commit copies it in. */
enum { SPAN_RMSNORM, SPAN_ROPE, SPAN_SILU_MUL, SPAN_ADD };
enum { SPAN_MIN = 32768 }; /* elements below which one thread does it */
/* After a piece was taken back from a late worker, the next SPAN_BACKOFF operations run on one
 * thread: pieces this small gain less than waiting for a worker that shares its core costs. */
enum { SPAN_BACKOFF = 256 };
static _Atomic int span_serial;

typedef struct {
    int op, pieces, rows; /* SPAN_RMSNORM, SPAN_ROPE: `rows` rows of n (ld apart); else n elements */
    size_t n, ld, per;    /* per: rows or elements a piece (elements: a multiple of 16) */
    float *y;             /* the result (in place: also the input, but for the norm's x) */
    const float *x, *w;   /* rmsnorm: x, w; silu_mul: u in x; add: x */
    float eps;
    int n_heads, head_dim, rot_dim, pos0, layout; /* rope */
    float theta;
    const float *freq_scale;
} span_args;

static int span_by_rows(const span_args *a) { return a->op == SPAN_RMSNORM || a->op == SPAN_ROPE; }

static void span_range(const span_args *a, int i, size_t *i0, size_t *i1)
{
    size_t total = span_by_rows(a) ? (size_t)a->rows : a->n;
    *i0 = (size_t)i * a->per;
    *i1 = *i0 + a->per < total ? *i0 + a->per : total;
}

static void span_run(const void *args, const void *in, int i, float *out)
{
    const span_args *a = args;
    size_t i0, i1;
    span_range(a, i, &i0, &i1);
    switch (a->op) {
    case SPAN_RMSNORM:
        for (size_t t = i0; t < i1; t++)
            ifk_rmsnorm(out ? out + (t - i0) * a->n : a->y + t * a->ld, a->x + t * a->ld, a->w, (int)a->n, a->eps);
        break;
    case SPAN_ROPE:
        for (size_t t = i0; t < i1; t++) {
            float *r = a->y + t * a->ld;
            if (out)
                r = memcpy(out + (t - i0) * a->n, r, a->n * sizeof(float));
            ifk_rope(r, a->n_heads, a->head_dim, a->rot_dim, a->pos0 + (int)t, a->theta, a->freq_scale, a->layout);
        }
        break;
    case SPAN_SILU_MUL:
    case SPAN_ADD: {
        float *g = a->y + i0;
        if (out)
            g = memcpy(out, g, (i1 - i0) * sizeof(float));
        if (a->op == SPAN_ADD)
            ifk_add(g, a->x + i0, (int)(i1 - i0));
        else
            ifk_silu_mul(g, a->x + i0, (int)(i1 - i0));
        break;
    }
    }
}

static void span_commit(const void *args, int i, const float *out)
{
    const span_args *a = args;
    size_t i0, i1;
    span_range(a, i, &i0, &i1);
    if (span_by_rows(a))
        ifk_pool_copy_rows(a->y + i0 * a->ld, a->ld, 0, out, (int)(i1 - i0), (int)a->n);
    else
        memcpy(a->y + i0, out, (i1 - i0) * sizeof(float));
}

/* Runs a on d's threads (a->op and its operands set; rows or n given): in pieces when the work
 * has at least SPAN_MIN elements and d has threads to share it, else here in one piece. */
static void span(iflow_device *d, span_args *a)
{
    const int by_rows = span_by_rows(a);
    const size_t elems = by_rows ? (size_t)a->rows * a->n : a->n;
    const size_t units = by_rows ? (size_t)a->rows : (a->n + 15) / 16; /* rows, or groups of 16 */
    if (elems == 0)
        return;
    /* the thread count only for work that may be split: decode's ops do not ask for it */
    const int nt = elems < SPAN_MIN ? 1 : d->n_threads > 0 ? d->n_threads : omp_get_num_procs();
    size_t pieces = nt > 1 ? 4 * (size_t)nt : 1;
    if (pieces > 1 && atomic_load_explicit(&span_serial, memory_order_relaxed) > 0) {
        atomic_fetch_sub_explicit(&span_serial, 1, memory_order_relaxed);
        pieces = 1;
    }
    pieces = pieces < units ? pieces : units;
    a->per = (units + pieces - 1) / pieces;
    a->pieces = (int)((units + a->per - 1) / a->per);
    if (!by_rows)
        a->per *= 16;
    if (a->pieces <= 1) {
        span_run(a, NULL, 0, NULL);
        return;
    }
    int was = ifk_pool_set_take_back(1);
    long taken = ifk_pool_taken_back();
    ifk_pool_run(&(ifk_pool_job){.run = span_run, .commit = span_commit, .args = a, .args_size = sizeof *a,
                                 .scratch_floats = by_rows ? a->per * a->n : a->per, .n_items = a->pieces,
                                 .max_threads = nt});
    ifk_pool_set_take_back(was);
    if (ifk_pool_taken_back() != taken) /* a worker was late: another process holds its core */
        atomic_store_explicit(&span_serial, SPAN_BACKOFF, memory_order_relaxed);
}

void iflow_cpu_span_reset(void)
{
    atomic_store_explicit(&span_serial, 0, memory_order_relaxed);
}

static int cpu_rmsnorm(iflow_device *d, float *y, const float *x, const float *w, int T, int n, float eps)
{
    span(d, &(span_args){.op = SPAN_RMSNORM, .rows = T, .n = (size_t)n, .ld = (size_t)n, .y = y, .x = x, .w = w,
                         .eps = eps});
    return 0;
}

static int cpu_rope(iflow_device *d, float *x, size_t ld, int T, int n_heads, int head_dim, int rot_dim, int pos0,
                    float theta, const float *freq_scale, int layout)
{
    span(d, &(span_args){.op = SPAN_ROPE, .rows = T, .n = (size_t)n_heads * (size_t)head_dim, .ld = ld, .y = x,
                         .n_heads = n_heads, .head_dim = head_dim, .rot_dim = rot_dim, .pos0 = pos0,
                         .layout = layout, .theta = theta, .freq_scale = freq_scale});
    return 0;
}

static int cpu_attention(iflow_device *d, float *out, const float *q, const float *k, const float *v, size_t kv_ld,
                         int T, int pos0, int n_heads, int n_kv_heads, int head_dim, float scale)
{
    ifk_attention(out, q, k, v, kv_ld, T, pos0, n_heads, n_kv_heads, head_dim, scale, d->n_threads);
    return 0;
}

static int cpu_gelu_mul(iflow_device *d, float *g, const float *u, size_t n, int exact)
{
    ifk_gelu_mul(g, u, (int)n, exact);
    return 0;
}

static int cpu_layernorm(iflow_device *d, float *y, const float *x, const float *w, const float *b, int T, int n, float eps)
{
    for (int t = 0; t < T; t++)
        ifk_layernorm(y + (size_t)t * n, x + (size_t)t * n, w, b, n, eps);
    return 0;
}

static int cpu_silu_mul(iflow_device *d, float *g, const float *u, size_t n)
{
    if (u) {
        span(d, &(span_args){.op = SPAN_SILU_MUL, .n = n, .y = g, .x = u});
        return 0;
    }
    for (size_t i = 0; i < n; i++) /* a plain FFN's (Marian's swish) */
        g[i] = g[i] / (1.0f + expf(-g[i]));
    return 0;
}

static int cpu_add(iflow_device *d, float *y, const float *x, size_t n)
{
    span(d, &(span_args){.op = SPAN_ADD, .n = n, .y = y, .x = x});
    return 0;
}

static int cpu_add_bias(iflow_device *d, float *y, size_t ldy, const float *b, int T, int n)
{
    for (int t = 0; t < T; t++)
        ifk_add(y + (size_t)t * ldy, b, n);
    return 0;
}

static int cpu_argmax(iflow_device *d, int32_t *out, const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    *out = best;
    return 0;
}

static int cpu_kv_store(iflow_device *d, void *pool, const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs,
                        const float *x, size_t ldx)
{
    ifk_kv_store(pool, L, seqs, n_seqs, x, ldx, d->n_threads);
    return 0;
}

static int cpu_kv_shift(iflow_device *d, void *k, void *v, const ifk_kv_layout *L, const int32_t *table, int n_past,
                        int keep, int discard, const ifk_rope_params *rp)
{
    float *tmp = malloc((size_t)L->n_kv_heads * L->head_dim * sizeof(float));
    if (!tmp)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    ifk_kv_shift(k, v, L, table, n_past, keep, discard, rp, tmp);
    free(tmp);
    return 0;
}

/* The work of an attention whose parts of keys run as units of their own (kvcache.h: a decoding
 * step deep in its context): a buffer for each calling thread (contexts on their own threads
 * share this device), grown as a call asks and freed when the thread ends. Without it (out of
 * memory) the parts are taken in turn, to the same bits. */
typedef struct {
    float *p;
    size_t n;
} attn_work;
static pthread_key_t work_key;
static pthread_once_t work_once = PTHREAD_ONCE_INIT;
static int work_key_ok;

static void work_free(void *w)
{
    free(((attn_work *)w)->p);
    free(w);
}

static void work_key_make(void) { work_key_ok = pthread_key_create(&work_key, work_free) == 0; }

/* This thread's work of at least n floats, or NULL. */
static float *work_of(size_t n)
{
    pthread_once(&work_once, work_key_make);
    if (!work_key_ok)
        return NULL;
    attn_work *w = pthread_getspecific(work_key);
    if (!w && (!(w = calloc(1, sizeof *w)) || pthread_setspecific(work_key, w))) {
        free(w);
        return NULL;
    }
    if (w->n < n) {
        float *p = malloc(n * sizeof(float));
        if (!p)
            return NULL;
        free(w->p);
        w->p = p;
        w->n = n;
    }
    return w->p;
}

static int cpu_attention_paged(iflow_device *d, float *out, const float *q, size_t ld, const void *k, const void *v,
                               const ifk_kv_layout *L, const ifk_kv_seq *seqs, int n_seqs, int n_heads, float scale)
{
    size_t n = ifk_attention_work(L, seqs, n_seqs, n_heads, d->n_threads);
    float *work = n ? work_of(n) : NULL;
    ifk_attention_paged(out, q, ld, k, v, L, seqs, n_seqs, n_heads, scale, d->n_threads, work, work ? n : 0);
    return 0;
}

/* Scaled score of query row qh against key row kh (+ the bias), in double. */
static double score(const float *qh, const float *kh, int hd, float scale, const float *bias)
{
    double dot = 0;
    for (int i = 0; i < hd; i++)
        dot += (double)qh[i] * kh[i];
    return dot * scale + (bias ? *bias : 0.0);
}

/* One query head over its visible keys 0 .. n - 1: a softmax in double (max first, then the
 * weighted values), so each (row, head) depends on nothing else (batch invariance). */
static void attend_head(float *oh, const float *qh, const float *k, const float *v, size_t kv_ld, int n, int hd,
                        float scale, const float *bias)
{
    double mx = -INFINITY, sum = 0, acc[hd];
    for (int j = 0; j < n; j++) {
        double s = score(qh, k + (size_t)j * kv_ld, hd, scale, bias ? bias + j : NULL);
        mx = s > mx ? s : mx;
    }
    for (int i = 0; i < hd; i++)
        acc[i] = 0;
    for (int j = 0; j < n; j++) {
        double w = exp(score(qh, k + (size_t)j * kv_ld, hd, scale, bias ? bias + j : NULL) - mx);
        const float *vh = v + (size_t)j * kv_ld;
        sum += w;
        for (int i = 0; i < hd; i++)
            acc[i] += w * vh[i];
    }
    for (int i = 0; i < hd; i++)
        oh[i] = (float)(acc[i] / sum);
}

/* An attention_bias call, dealt to the pool in items of (row, head) units. */
typedef struct {
    float *out;
    const float *q, *k, *v, *bias;
    size_t ld, kv_ld;
    int T, S, causal0, n_heads, group, head_dim, n_items;
    float scale;
} attn_bias_job;

static void attn_bias_item(const void *args, const void *in, int item, float *scratch)
{
    const attn_bias_job *j = args;
    const int units = j->T * j->n_heads, u0 = (int)((long)units * item / j->n_items),
              u1 = (int)((long)units * (item + 1) / j->n_items);
    for (int u = u0; u < u1; u++) {
        const int t = u / j->n_heads, h = u % j->n_heads;
        const int n = j->causal0 >= 0 && j->causal0 + t + 1 < j->S ? j->causal0 + t + 1 : j->S;
        const size_t kvo = (size_t)(h / j->group) * j->head_dim, qo = (size_t)t * j->ld + (size_t)h * j->head_dim;
        attend_head(j->out + qo, j->q + qo, j->k + kvo, j->v + kvo, j->kv_ld, n, j->head_dim, j->scale,
                    j->bias ? j->bias + ((size_t)h * j->T + t) * j->S : NULL);
    }
}

static int cpu_attention_bias(iflow_device *d, float *out, const float *q, size_t ld, const float *k, const float *v,
                              size_t kv_ld, int T, int S, int causal0, int n_heads, int n_kv_heads, int head_dim,
                              float scale, const float *bias)
{
    const int units = T * n_heads;
    attn_bias_job j = {out, q, k, v, bias, ld, kv_ld, T, S, causal0, n_heads, n_heads / n_kv_heads, head_dim,
                       units < IFK_POOL_MAX_ITEMS ? units : IFK_POOL_MAX_ITEMS, scale};
    ifk_pool_job job = {.run = attn_bias_item, .args = &j, .args_size = sizeof j, .n_items = j.n_items,
                        .max_threads = d->n_threads > 0 ? d->n_threads : omp_get_num_procs()};
    ifk_pool_run(&job);
    return 0;
}

static int cpu_relu_mul(iflow_device *d, float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++)
        g[i] = (g[i] > 0 ? g[i] : 0.0f) * (u ? u[i] : 1.0f);
    return 0;
}

static int cpu_query(const iflow_device *d, iflow_device_info *info)
{
    iflow_cpu_info(info);
    return 0;
}

static int cpu_lowrank_up(iflow_device *d, float *y, size_t ldy, const uint16_t *bt, const float *t, size_t ldt, int T,
                          int N, int r)
{
    int was = ifk_pool_set_take_back(1); /* bt lives until the model closes, after ifk_pool_quiesce */
    ifk_lowrank_up(y, ldy, bt, t, ldt, T, N, r, d->n_threads);
    ifk_pool_set_take_back(was);
    return 0;
}

static const iflow_device_ops cpu_ops = {
    cpu_close, cpu_query, cpu_alloc, iflow_cpu_free, cpu_copy, cpu_copy, cpu_supports, cpu_matmul, cpu_rmsnorm,
    cpu_rope, cpu_attention, cpu_silu_mul, cpu_add, cpu_add_bias, cpu_argmax, cpu_kv_store, cpu_attention_paged, cpu_kv_shift,
    cpu_gelu_mul, cpu_layernorm, iflow_cpu_pack, cpu_attention_bias, cpu_relu_mul,
    NULL, NULL, NULL, NULL, NULL, /* record_begin .. replay: every op runs as it comes */
    NULL, NULL, NULL, NULL, /* add_rmsnorm, rope_store, glu, qkv: the engine runs the ops they stand for */
    cpu_lowrank_up,
};

/* The CPU's brand string, from /proc/cpuinfo ("" if unreadable). */
static void cpu_model(char *buf, size_t n)
{
    char line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    buf[0] = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            char *v = strchr(line, ':');
            if (v) {
                v += 1 + (v[1] == ' ');
                v[strcspn(v, "\n")] = 0;
                snprintf(buf, n, "%s", v);
            }
            break;
        }
    if (f)
        fclose(f);
}

/* MemTotal and MemAvailable from /proc/meminfo (0 if unreadable). */
static void cpu_memory(uint64_t *total, uint64_t *avail)
{
    char line[256];
    unsigned long long kb;
    FILE *f = fopen("/proc/meminfo", "r");
    *total = *avail = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
            *total = kb * 1024;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            *avail = kb * 1024;
    }
    if (f)
        fclose(f);
}

void iflow_cpu_info(iflow_device_info *info)
{
    memset(info, 0, sizeof *info);
    info->kind = IFLOW_DEVICE_CPU;
    snprintf(info->name, sizeof info->name, "cpu");
    cpu_model(info->model, sizeof info->model);
    cpu_memory(&info->mem_total, &info->mem_free);
    info->units = omp_get_num_procs();
    snprintf(info->detail, sizeof info->detail, "kernels %s", ifk_isa_name(ifk_isa_current()));
}

int iflow_cpu_open(iflow_device **out, int n_threads)
{
    iflow_device *d = calloc(1, sizeof *d);
    *out = NULL;
    if (!d)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    d->ops = &cpu_ops;
    d->host_memory = 1;
    d->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
    iflow_cpu_info(&d->info);
    *out = d;
    return 0;
}
