/*
 * dispatch.c -- picks an instruction-set path once, and threads the kernels that take n_threads.
 *
 * The paths (ref.c, *_avx2.c, *_avx512.c) are single-threaded; this file splits the work
 * into items on the thread pool (pool.h): ifk_matmul deals out ranges of output rows,
 * ifk_attention blocks of (token, head) pairs that share a kv head. Built with -DIFK_NO_SIMD (the fuzz
 * build, which leaves the SIMD files out), only the scalar path exists. The paths compute each
 * output row (and each attention query) the same way whatever block or range it falls in, so
 * the split (and T) never changes a result (kernels.h's batch invariance).
 */
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/quant.h"

#ifndef IFK_NO_SIMD
#include <cpuid.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

typedef struct {
    IFK_DECL_MATMUL_ROWS((*matmul_rows));
    IFK_DECL_ATTEND((*attend));
    void (*rmsnorm)(float *y, const float *x, const float *w, int n, float eps);
    void (*softmax)(float *x, int n);
    void (*silu_mul)(float *g, const float *u, int n);
    void (*add)(float *y, const float *x, int n);
    void (*get_row)(float *out, const void *W, int wtype, size_t row, int K);
    void (*lowrank_up)(float *y, size_t ldy, const uint16_t *bt, const float *t, size_t ldt, int T, int N, int r,
                       int add);
} ifk_path;

#define IFK_PATH(X)                                                                         \
    { ifk_##X##_matmul_rows, ifk_##X##_attend, ifk_##X##_rmsnorm, ifk_##X##_softmax,        \
      ifk_##X##_silu_mul, ifk_##X##_add, ifk_##X##_get_row, ifk_##X##_lowrank_up }

static const ifk_path path_scalar = IFK_PATH(ref);
#ifndef IFK_NO_SIMD
static const ifk_path path_avx2 = IFK_PATH(avx2);
static const ifk_path path_avx512 = IFK_PATH(avx512);
#endif

/* -1 until first use; then the IFK_ISA_* in use. */
static _Atomic int isa_now = -1;

#ifndef IFK_NO_SIMD
/* AMX tiles: the CPU has AMX-TILE, AMX-BF16 and AMX-INT8 (cpuid 7.0 edx bits 24, 22, 25), the
 * OS has enabled the tile state (XCR0 bits 17 and 18), and Linux grants it to this process
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, 18; asked once, for every thread). */
static int amx_usable(void)
{
    static _Atomic int ok = -1;
    int r = atomic_load_explicit(&ok, memory_order_relaxed);
    if (r >= 0)
        return r;
    r = 0;
#ifdef __linux__
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1) && (d >> 25 & 1) &&
        __get_cpuid(1, &a, &b, &c, &d) && (c & bit_OSXSAVE)) {
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        if ((lo >> 17 & 3) == 3 && __builtin_cpu_supports("avx512bf16"))
            r = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    }
#endif
    atomic_store_explicit(&ok, r, memory_order_relaxed);
    return r;
}
#endif

int ifk_isa_detect(void)
{
#ifdef IFK_NO_SIMD
    return IFK_ISA_SCALAR;
#else
    /* __builtin_cpu_supports also checks that the OS saves the AVX / AVX-512 registers.
     * F16C is read from cpuid directly (clang 14's builtin does not know it). */
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    __builtin_cpu_init();
    if (!f16c || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return IFK_ISA_SCALAR;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return !(__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("gfni")) ? IFK_ISA_AVX512
               : amx_usable()                                                              ? IFK_ISA_AMX
                                                                                           : IFK_ISA_AVX512GFNI;
    return IFK_ISA_AVX2;
#endif
}

int ifk_isa_current(void)
{
    int isa = atomic_load_explicit(&isa_now, memory_order_relaxed);
    if (isa < 0) {
        isa = ifk_isa_detect();
        atomic_store_explicit(&isa_now, isa, memory_order_relaxed);
    }
    return isa;
}

int ifk_set_isa(int isa)
{
    int best = ifk_isa_detect();
    if (isa == IFK_ISA_AUTO)
        isa = best;
    if (isa >= IFK_ISA_SCALAR && isa <= best)
        atomic_store_explicit(&isa_now, isa, memory_order_relaxed);
    return ifk_isa_current();
}

const char *ifk_isa_name(int isa)
{
    switch (isa) {
    case IFK_ISA_SCALAR: return "scalar";
    case IFK_ISA_AVX2: return "avx2";
    case IFK_ISA_AVX512: return "avx512";
    case IFK_ISA_AVX512GFNI: return "avx512gfni";
    case IFK_ISA_AMX: return "amx";
    default: return "unknown";
    }
}

int ifk_isa_by_name(const char *name)
{
    for (int isa = IFK_ISA_SCALAR; isa <= IFK_ISA_AMX; isa++)
        if (!strcmp(name, ifk_isa_name(isa)))
            return isa;
    return -2;
}

static const ifk_path *path(void)
{
#ifndef IFK_NO_SIMD
    switch (ifk_isa_current()) {
    case IFK_ISA_AVX512:
    case IFK_ISA_AVX512GFNI:
    case IFK_ISA_AMX: return &path_avx512;
    case IFK_ISA_AVX2: return &path_avx2;
    default: break;
    }
#endif
    return &path_scalar;
}

/* omp_get_num_procs() costs a system call; the count is read once. */
static int num_procs(void)
{
    static _Atomic int procs = 0;
    int n = atomic_load_explicit(&procs, memory_order_relaxed);
    if (n <= 0) {
        n = omp_get_num_procs();
        n = n > 0 ? n : 1;
        atomic_store_explicit(&procs, n, memory_order_relaxed);
    }
    return n;
}

/* Threads to use for `work` multiply-adds: the request (all cores when <= 0), but no more
 * than one per ~64K multiply-adds, so that tiny products do not pay for waking a team. */
static int threads_for(int n_threads, double work)
{
    double cap = work / 65536.0;
    if (cap < 2.0)
        return 1;
    int nt = n_threads > 0 ? n_threads : num_procs();
    return cap < nt ? (int)cap : nt;
}

/* F16 takes the BF16 product too: the rule and its measurements are kernels.h's. */
int ifk_bf16_dot(int wtype)
{
#ifdef IFK_NO_SIMD
    return 0;
#else
    static _Atomic int has = -1;
    int h = atomic_load_explicit(&has, memory_order_relaxed);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx512bf16") != 0;
        atomic_store_explicit(&has, h, memory_order_relaxed);
    }
    return (wtype == IFK_F16 || wtype == IFK_BF16) && h && ifk_isa_current() >= IFK_ISA_AVX512 && !ifk_qx_f32();
#endif
}

/* The product on the pool (pool.h): items of rpi rows (a multiple of 16, one line of y). A
 * stolen item runs into a worker's scratch ([T][n1 - n0]) with W shifted to its first row and
 * reads the pool's copy of x. x is F32 for rows, or rounded to BF16 for bf16_rows (when set):
 * [T][ldx] either way. */
typedef struct {
    IFK_DECL_MATMUL_ROWS((*rows));
    IFK_DECL_BF16_ROWS((*bf16_rows));
    float *y;
    size_t ldy;
    const char *W; /* [N][row_bytes] */
    size_t row_bytes, ldx;
    int wtype, T, N, K, rpi;
} mm_args;

static void mm_range(const mm_args *a, int i, int *n0, int *n1)
{
    *n0 = i * a->rpi;
    *n1 = *n0 + a->rpi < a->N ? *n0 + a->rpi : a->N;
}

/* Rows n0 <= n < n1 of W (already shifted by the caller, if at all) against x into y. */
static void mm_rows(const mm_args *a, float *y, size_t ldy, const char *W, const void *x, int n0, int n1)
{
    if (a->bf16_rows)
        a->bf16_rows(y, ldy, W, a->wtype, x, a->ldx, a->T, n0, n1, a->K);
    else
        a->rows(y, ldy, W, a->wtype, x, a->ldx, a->T, n0, n1, a->K);
}

static void mm_run(const void *args, const void *in, int i, float *out)
{
    const mm_args *a = args;
    int n0, n1;
    mm_range(a, i, &n0, &n1);
    if (!out)
        mm_rows(a, a->y, a->ldy, a->W, in, n0, n1);
    else
        mm_rows(a, out, (size_t)(n1 - n0), a->W + (size_t)n0 * a->row_bytes, in, 0, n1 - n0);
}

static void mm_commit(const void *args, int i, const float *out)
{
    const mm_args *a = args;
    int n0, n1;
    mm_range(a, i, &n0, &n1);
    ifk_pool_copy_rows(a->y, a->ldy, n0, out, a->T, n1 - n0);
}

IFK_DECL_MATMUL_ROWS(ifk_path_matmul_rows)
{
    path()->matmul_rows(y, ldy, W, wtype, x, ldx, T, n0, n1, K);
}

/* A packed F16 / BF16 matrix (qpack.h) on the exact F32 product: unpacked 16 rows at a time
 * (one at a time, on the stack, without memory for 16) into the row layout and multiplied by
 * the path's product: the reference, used only where the exact product is asked for after the
 * model was packed. */
IFK_DECL_MATMUL_ROWS(fpack_unpacked_rows)
{
    const int base = ifk_fpack_base(wtype);
    uint16_t *buf = malloc((size_t)16 * K * sizeof *buf);
    for (int n = n0; n < n1; n += 16) {
        const int nr = n1 - n < 16 ? n1 - n : 16;
        if (buf) {
            ifk_qunpack_rows(buf, W, wtype, n, n + nr, K);
            path()->matmul_rows(y + n, ldy, buf, base, x, ldx, T, 0, nr, K);
            continue;
        }
        for (int r = 0; r < nr; r++) {
            uint16_t one[K];
            ifk_qunpack_rows(one, W, wtype, n + r, n + r + 1, K);
            path()->matmul_rows(y + n + r, ldy, one, base, x, ldx, T, 0, 1, K);
        }
    }
    free(buf);
}

/* y = x W^T for a matrix of wtype whose rows `rows` multiplies with F32 x, or, when bf16 (the
 * BF16 dot product is on for it) and there is memory for x rounded to BF16, `bf16_rows` does;
 * row_bytes: a row of W (packed matrices: as packed). Split over the pool (mm_run). */
static void mm_product(IFK_DECL_MATMUL_ROWS((*rows)), IFK_DECL_BF16_ROWS((*bf16_rows)), int bf16, size_t row_bytes,
                       float *y, size_t ldy, const void *W, int wtype, const float *x, size_t ldx, int T, int N, int K,
                       int n_threads)
{
    if (T <= 0 || N <= 0)
        return;
    int nt = threads_for(n_threads, (double)T * N * K);
    int blocks = (N + 15) / 16;
    if (nt > blocks)
        nt = blocks;
    mm_args a = {rows, NULL, y, ldy, W, row_bytes, ldx, wtype, T, N, K, 0};
    const void *in = x;
    size_t in_bytes = ((size_t)(T - 1) * ldx + (size_t)K) * sizeof(float);
#ifndef IFK_NO_SIMD
    if (bf16) {
        /* x rounded once per call, each token on its own (so batch invariant); without memory
         * for it the F32 product runs instead. Rows of xb are whole steps of 32 plus 64 bytes,
         * so that the 4 tokens the kernel reads at once do not fall on the same L1 sets (rows
         * 4 KiB apart do: prefill measured 12 % slower). */
        const size_t ldxb = (((size_t)K + 31) & ~(size_t)31) + 32;
        uint16_t *xb = ifk_thread_scratch((size_t)T * ldxb * sizeof *xb);
        if (xb) {
            ifk_avx512bf16_round_x(xb, ldxb, x, ldx, T, K);
            a.bf16_rows = bf16_rows;
            a.ldx = ldxb;
            in = xb;
            in_bytes = (size_t)T * ldxb * sizeof *xb;
        }
    }
#else
    (void)bf16_rows, (void)bf16;
#endif
    if (nt <= 1) {
        mm_rows(&a, y, ldy, W, in, 0, N);
        return;
    }
    a.rpi = ifk_pool_rows_per_item(N, nt);
    ifk_pool_run(&(ifk_pool_job){.run = mm_run, .commit = mm_commit, .args = &a, .args_size = sizeof a,
                                 .input = in, .input_size = in_bytes,
                                 .scratch_floats = (size_t)T * a.rpi, .n_items = (N + a.rpi - 1) / a.rpi,
                                 .max_threads = nt});
}

#ifdef IFK_NO_SIMD /* no BF16 kernels in the build (ifk_bf16_dot is 0 there) */
#define BF16_KERNEL(f) NULL
#else
#define BF16_KERNEL(f) f
#endif

void ifk_matmul(float *y, size_t ldy, const void *W, int wtype, const float *x, size_t ldx,
                int T, int N, int K, int n_threads)
{
    const int fbase = ifk_fpack_base(wtype);
    if (fbase >= 0) { /* packed F16 / BF16 (qpack.h): the packed BF16 product (on AMX tiles on the amx
                       * path), else unpacked 16 rows at a time */
        const int amx = ifk_isa_current() == IFK_ISA_AMX;
        mm_product(fpack_unpacked_rows, amx ? BF16_KERNEL(ifk_amx_fpack_rows) : BF16_KERNEL(ifk_avx512bf16_fpack_rows),
                   ifk_bf16_dot(fbase), (size_t)(K + (K & 1)) * 2, y, ldy, W, wtype, x, ldx, T, N, K, n_threads);
        return;
    }
    if (ifk_qtype(wtype) || ifk_qpack_base(wtype) >= 0) { /* block-quantized weights: quant.h, qpack.h */
        ifk_qmatmul(y, ldy, W, wtype, x, ldx, T, N, K, n_threads);
        return;
    }
    mm_product(path()->matmul_rows, BF16_KERNEL(ifk_avx512bf16_matmul_rows), ifk_bf16_dot(wtype),
               (size_t)K * (wtype == IFK_F32 ? 4 : 2), y, ldy, W, wtype, x, ldx, T, N, K, n_threads);
}

void ifk_get_row(float *out, const void *W, int wtype, size_t row, int K)
{
    if (ifk_qtype(wtype))
        ifk_qget_row(out, W, wtype, row, K);
    else
        path()->get_row(out, W, wtype, row, K);
}

void ifk_rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
    path()->rmsnorm(y, x, w, n, eps);
}

void ifk_rope(float *x, int n_heads, int head_dim, int rot_dim, int pos, float theta,
              const float *freq_scale, int layout)
{
    ifk_ref_rope(x, n_heads, head_dim, rot_dim, pos, theta, freq_scale, layout);
}

void ifk_softmax(float *x, int n)
{
    path()->softmax(x, n);
}

void ifk_gelu_mul(float *g, const float *u, int n, int exact)
{
    const double c = 0.7978845608028654, r = 0.7071067811865476; /* sqrt(2 / pi), 1 / sqrt(2) */
    for (int i = 0; i < n; i++) {
        double x = g[i], e = exact ? erf(x * r) : tanh(c * (x + 0.044715 * x * x * x));
        g[i] = (float)(0.5 * x * (1.0 + e) * (u ? u[i] : 1.0f));
    }
}

void ifk_layernorm(float *y, const float *x, const float *w, const float *b, int n, float eps)
{
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++)
        mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++)
        var += (x[i] - mean) * (x[i] - mean);
    const double inv = 1.0 / sqrt(var / n + eps);
    for (int i = 0; i < n; i++)
        y[i] = (float)((x[i] - mean) * inv * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f));
}

void ifk_silu_mul(float *g, const float *u, int n)
{
    path()->silu_mul(g, u, n);
}

/* ifk_lowrank_up's items: columns n0 .. n1 of y, cpi an item (whole tiles: the last item's
 * tiles are those of a matrix of n1 - n0 columns, so the kernel takes them as one). */
typedef struct {
    float *y;
    size_t ldy;
    const uint16_t *bt;
    int T, N, r, cpi;
} lr_args;

static void lr_range(const lr_args *a, int i, int *n0, int *n1)
{
    *n0 = i * a->cpi;
    *n1 = *n0 + a->cpi < a->N ? *n0 + a->cpi : a->N;
}

/* Item i against t (the job's input, [T][r]): added into y in place, or its sums alone into
 * out [T][n1 - n0], which lr_commit adds (the same one addition). */
static void lr_run(const void *args, const void *in, int i, float *out)
{
    const lr_args *a = args;
    int n0, n1;
    lr_range(a, i, &n0, &n1);
    const uint16_t *bt = a->bt + (size_t)n0 * (size_t)a->r; /* tile n0 / IFK_LR_TILE */
    if (!out)
        path()->lowrank_up(a->y + n0, a->ldy, bt, in, (size_t)a->r, a->T, n1 - n0, a->r, 1);
    else
        path()->lowrank_up(out, (size_t)(n1 - n0), bt, in, (size_t)a->r, a->T, n1 - n0, a->r, 0);
}

static void lr_commit(const void *args, int i, const float *out)
{
    const lr_args *a = args;
    int n0, n1;
    lr_range(a, i, &n0, &n1);
    for (int t = 0; t < a->T; t++)
        path()->add(a->y + (size_t)t * a->ldy + n0, out + (size_t)t * (size_t)(n1 - n0), n1 - n0);
}

void ifk_lowrank_up(float *y, size_t ldy, const uint16_t *bt, const float *t, size_t ldt, int T, int N, int r,
                    int n_threads)
{
    if (T <= 0 || N <= 0)
        return;
    const int tiles = (N + IFK_LR_TILE - 1) / IFK_LR_TILE;
    int nt = threads_for(n_threads, (double)T * N * r);
    if (nt > tiles)
        nt = tiles;
    if (nt <= 1 || ldt != (size_t)r) {
        path()->lowrank_up(y, ldy, bt, t, ldt, T, N, r, 1);
        return;
    }
    const int items = 4 * nt < tiles ? 4 * nt : tiles, cpi = (tiles + items - 1) / items * IFK_LR_TILE;
    const lr_args a = {y, ldy, bt, T, N, r, cpi};
    ifk_pool_run(&(ifk_pool_job){.run = lr_run, .commit = lr_commit, .args = &a, .args_size = sizeof a, .input = t,
                                 .input_size = (size_t)T * (size_t)r * sizeof *t, .scratch_floats = (size_t)T * cpi,
                                 .n_items = (N + cpi - 1) / cpi, .max_threads = nt});
}

void ifk_add(float *y, const float *x, int n)
{
    path()->add(y, x, n);
}

/* Units of tb tokens x hs heads in T tokens x n_kv kv heads x group heads each. */
static int att_units(int T, int tb, int n_kv, int group, int hs)
{
    return ((T + tb - 1) / tb) * n_kv * ((group + hs - 1) / hs);
}

/* Attention on the pool: item i is units [i * upi, (i + 1) * upi), in place. */
typedef struct {
    IFK_DECL_ATTEND((*attend));
    float *out;
    const float *q, *k, *v;
    size_t kv_ld, ld;
    int T, pos0, group, head_dim, tb, hs, n_tb, n_hs, units, upi;
    float scale;
} att_args;

static void att_run(const void *args, const void *in, int i, float *unused)
{
    const att_args *a = args;
    int u1 = (i + 1) * a->upi < a->units ? (i + 1) * a->upi : a->units;
    for (int u = i * a->upi; u < u1; u++) {
        /* unit u: token block u % n_tb (neighbouring units share cache rows), head slice
         * (u / n_tb) % n_hs of kv head u / (n_tb * n_hs) */
        int t0 = (u % a->n_tb) * a->tb, h0 = ((u / a->n_tb) % a->n_hs) * a->hs, g = u / (a->n_tb * a->n_hs);
        int nt_u = a->T - t0 < a->tb ? a->T - t0 : a->tb, nh_u = a->group - h0 < a->hs ? a->group - h0 : a->hs;
        size_t off = (size_t)t0 * a->ld + (size_t)(g * a->group + h0) * a->head_dim;
        a->attend(a->out + off, a->q + off, a->ld, a->k + (size_t)g * a->head_dim, a->v + (size_t)g * a->head_dim,
                  a->kv_ld, nt_u, nh_u, a->pos0 + t0, a->head_dim, a->scale);
    }
}

void ifk_attention(float *out, const float *q, const float *k, const float *v, size_t kv_ld,
                   int T, int pos0, int n_heads, int n_kv_heads, int head_dim, float scale,
                   int n_threads)
{
    /* Shapes outside the contract (heads not a multiple of kv heads) compute nothing. */
    if (T <= 0 || pos0 < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || n_heads % n_kv_heads)
        return;
    const ifk_path *p = path();
    const int group = n_heads / n_kv_heads;
    const size_t ld = (size_t)n_heads * head_dim;
    double work = (double)T * n_heads * (pos0 + (T + 1) / 2.0) * head_dim * 2.0;
    int nt = threads_for(n_threads, work);
    /* A unit of work is a block of tb tokens x hs heads of one kv head's group: the cache rows
     * it reads are shared by all its queries. Up to IFK_ATT_MAXQ queries a unit, but enough
     * units to keep every thread busy (more when T > 1: later tokens see more rows). */
    int hs = group, tb = 1;
    while (hs > IFK_ATT_MAXQ)
        hs = (hs + 1) / 2;
    while (tb * 2 * hs <= IFK_ATT_MAXQ && tb < T)
        tb *= 2;
    const int want = (T > 1 ? 4 : 2) * nt;
    while (att_units(T, tb, n_kv_heads, group, hs) < want && (tb > 1 || hs > 1)) {
        if (tb > 1)
            tb = (tb + 1) / 2;
        else
            hs = (hs + 1) / 2;
    }
    const int n_tb = (T + tb - 1) / tb, n_hs = (group + hs - 1) / hs;
    const int units = att_units(T, tb, n_kv_heads, group, hs);
    if (nt > units)
        nt = units;
    /* Later tokens see more rows, so units are dealt out dynamically. */
    const int upi = (units + IFK_POOL_MAX_ITEMS - 1) / IFK_POOL_MAX_ITEMS;
    att_args a = {p->attend, out, q, k, v, kv_ld, ld, T, pos0, group, head_dim, tb, hs, n_tb, n_hs, units, upi, scale};
    ifk_pool_run(&(ifk_pool_job){.run = att_run, .args = &a, .args_size = sizeof a,
                                 .n_items = (units + upi - 1) / upi, .max_threads = nt});
}
