/*
 * test_kvattn.c -- paged attention (kernels/cpu/kvcache.h's ifk_attention_paged) against a
 * double-precision reference, and its batch invariance.
 *
 * Reference: for each query row and head, softmax(scale * q . k_j) over the keys the row sees
 * (causal, a sliding window, or the whole step for an encoder), optionally soft-capped, in
 * double precision over the pool's stored values read back (ifk_kv_load_row: F16 and Q8 pools
 * hold rounded values, which both sides then use; over a Q8 pool the query is rounded too, as
 * kvcache.h specifies: to int8, a scale maxabs / 127 a group). Tolerance: 2e-5 absolute (the values
 * are O(1); F32 sums of up to 200 terms).
 * Shapes on purpose: head_dim 8, 40 (not a multiple of 16), 64, 80 and 128; 1, 3, 8 and 9 query
 * heads per kv head (the kernel takes heads 8, 4 and 1 at a time); rows that end a chunk of 64
 * keys, start one, or straddle one; blocks of 7 and 16 positions (rows of a chunk in several
 * blocks); a block table out of order; F32, F16 and Q8 pools.
 * Rows whose keys span parts of IFK_KV_PART (merged in order): rows that end a part, start one or
 * straddle one, a window wider than a part, an encoder's step of more than a part.
 * Invariance: the rows of one call at 1 thread (which shares each chunk's keys among up to 16 rows,
 * fewer when there are many threads, and takes a row's parts in turn) must memcmp-equal the same
 * rows at 7 threads, computed one per call at 1 and 2 threads (2: long rows' parts are units of
 * their own, in the work ifk_attention_work asks for), and in a call with another sequence before
 * them at 2 threads; and a Q8 pool's must
 * memcmp-equal them on the AVX2 path (ifk_set_isa), which sums the int8 products as floats where
 * a CPU with AVX512_VNNI sums them with vpdpbusd (the same path twice on a CPU without).
 */
#include "check.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/kvcache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int type, hd, n_kv, nh, block, pos0, T, window, bidir;
    float softcap;
    int swap; /* block table: odd blocks swapped in pairs (1 <-> 3, ...), the others in place */
} shape;

/* A pool of n positions filled with random rows through ifk_kv_store, its block table reversed. */
typedef struct {
    ifk_kv_layout L;
    void *k, *v;
    int32_t *table;
} pool;

static void pool_make(pool *p, const shape *s, int n)
{
    int nb = (n + s->block - 1) / s->block, KV = s->n_kv * s->hd;
    p->L = (ifk_kv_layout){.type = s->type, .block = s->block, .n_kv_heads = s->n_kv, .head_dim = s->hd,
                           .group = ifk_kv_group(s->hd), .n_blocks = nb, .window = s->window,
                           .softcap = s->softcap, .bidirectional = s->bidir};
    size_t bytes = ifk_kv_pool_bytes(&p->L);
    p->k = calloc(1, bytes);
    p->v = calloc(1, bytes);
    p->table = malloc(sizeof(int32_t) * (size_t)nb);
    for (int b = 0; b < nb; b++)
        p->table[b] = !s->swap ? nb - 1 - b : b % 2 && (b ^ 2) < nb ? b ^ 2 : b;
    float *x = malloc(sizeof(float) * (size_t)n * KV);
    ifk_kv_seq seq = {.row0 = 0, .n_rows = n, .pos0 = 0, .table = p->table};
    for (int w = 0; w < 2; w++) {
        for (size_t i = 0; i < (size_t)n * KV; i++)
            x[i] = (float)rnd_normal();
        ifk_kv_store(w ? p->v : p->k, &p->L, &seq, 1, x, (size_t)KV, 1);
    }
    free(x);
}

static void pool_free(pool *p)
{
    free(p->k);
    free(p->v);
    free(p->table);
}

/* Query row qr [H * hd] as a Q8 pool's attention takes it: each group of G values of a head
 * rounded to int8 with the scale maxabs / 127 (F32, as kvcache.h says), then multiplied back out. */
static void round_query(double *qd, const float *qr, int H, int hd, int G)
{
    for (int i0 = 0; i0 < H * hd; i0 += G) {
        float amax = 0.0f;
        for (int i = i0; i < i0 + G; i++)
            amax = fmaxf(amax, fabsf(qr[i]));
        const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int i = i0; i < i0 + G; i++)
            qd[i] = (double)fminf(fmaxf(nearbyintf(qr[i] * id), -127.0f), 127.0f) * d;
    }
}

/* The double-precision output of query row i (at position pos0 + i). */
static void reference(double *out, const float *qr, const pool *p, const shape *s, int i, float scale)
{
    const int H = s->n_kv * s->nh, KV = s->n_kv * s->hd, pos = s->pos0 + i;
    double *q = malloc(sizeof(double) * (size_t)H * s->hd);
    if (s->type == IFK_KV_Q8)
        round_query(q, qr, H, s->hd, p->L.group);
    else
        for (int e = 0; e < H * s->hd; e++)
            q[e] = qr[e];
    int last = s->bidir ? s->pos0 + s->T - 1 : pos, first = 0;
    if (s->window > 0 && last + 1 > s->window)
        first = last + 1 - s->window;
    float *kr = malloc(sizeof(float) * KV), *vr = malloc(sizeof(float) * KV);
    double *w = malloc(sizeof(double) * (size_t)(last + 1));
    for (int h = 0; h < H; h++) {
        const int g = h / s->nh;
        double mx = -INFINITY, sum = 0;
        for (int j = first; j <= last; j++) {
            ifk_kv_load_row(kr, p->k, &p->L, p->table, j);
            double d = 0;
            for (int e = 0; e < s->hd; e++)
                d += q[(size_t)h * s->hd + e] * kr[(size_t)g * s->hd + e];
            d *= scale;
            if (s->softcap > 0)
                d = s->softcap * tanh(d / s->softcap);
            w[j] = d;
            mx = d > mx ? d : mx;
        }
        for (int j = first; j <= last; j++)
            sum += (w[j] = exp(w[j] - mx));
        for (int e = 0; e < s->hd; e++)
            out[(size_t)h * s->hd + e] = 0;
        for (int j = first; j <= last; j++) {
            ifk_kv_load_row(vr, p->v, &p->L, p->table, j);
            for (int e = 0; e < s->hd; e++)
                out[(size_t)h * s->hd + e] += w[j] / sum * vr[(size_t)g * s->hd + e];
        }
    }
    free(q);
    free(kr);
    free(vr);
    free(w);
}

/* ifk_attention_paged with the work ifk_attention_work asks for (none when it asks for none);
 * returns the floats it asked for. */
static size_t attend(float *out, const float *q, size_t ld, const pool *p, const ifk_kv_seq *seqs, int n_seqs, int H,
                     float scale, int nt)
{
    size_t n = ifk_attention_work(&p->L, seqs, n_seqs, H, nt);
    float *work = n ? malloc(sizeof(float) * n) : NULL;
    ifk_attention_paged(out, q, ld, p->k, p->v, &p->L, seqs, n_seqs, H, scale, nt, work, n);
    free(work);
    return n;
}

static void run_shape(const shape *s)
{
    const int H = s->n_kv * s->nh, D = H * s->hd, n = s->pos0 + s->T;
    const float scale = 1.0f / sqrtf((float)s->hd);
    char what[160];
    snprintf(what, sizeof what, "%s hd %d, %d x %d heads, block %d, rows %d..%d%s%s", ifk_kv_type_name(s->type), s->hd,
             s->n_kv, s->nh, s->block, s->pos0, n - 1, s->window ? ", window" : s->bidir ? ", bidirectional" : "",
             s->softcap > 0 ? ", softcap" : "");
    pool p;
    pool_make(&p, s, n);
    float *q = malloc(sizeof(float) * (size_t)s->T * D), *all = malloc(sizeof(float) * (size_t)s->T * D),
          *one = malloc(sizeof(float) * D), *mixed = malloc(sizeof(float) * (size_t)(s->T + 3) * D);
    double *ref = malloc(sizeof(double) * D);
    for (size_t i = 0; i < (size_t)s->T * D; i++)
        q[i] = (float)rnd_normal();
    ifk_kv_seq seq = {.row0 = 0, .n_rows = s->T, .pos0 = s->pos0, .table = p.table};
    CHECK(attend(all, q, (size_t)D, &p, &seq, 1, H, scale, 1) == 0, "%s: no work at 1 thread", what);
    double worst = 0;
    for (int i = 0; i < s->T; i++) {
        reference(ref, q + (size_t)i * D, &p, s, i, scale);
        for (int e = 0; e < D; e++)
            worst = fmax(worst, fabs(all[(size_t)i * D + e] - ref[e]));
    }
    CHECK(worst <= 2e-5, "%s: max |out - float64 reference| = %g > 2e-5", what, worst);
    /* at 7 threads the call cuts its rows into smaller units (a unit's rows share their keys) */
    attend(mixed, q, (size_t)D, &p, &seq, 1, H, scale, 7);
    CHECK(memcmp(mixed, all, sizeof(float) * (size_t)s->T * D) == 0, "%s: the call at 7 threads = at 1", what);
    /* each row alone (an encoder's rows see the whole step, so they run as one step only) */
    for (int i = 0; i < s->T && !s->bidir; i++) {
        ifk_kv_seq alone = {.row0 = 0, .n_rows = 1, .pos0 = s->pos0 + i, .table = p.table};
        size_t w = attend(one, q + (size_t)i * D, (size_t)D, &p, &alone, 1, H, scale, 1 + i % 2);
        CHECK(memcmp(one, all + (size_t)i * D, sizeof(float) * D) == 0, "%s: row %d alone = row %d of the call", what,
              s->pos0 + i, s->pos0 + i);
        /* a decoding row over more than a part, at 2 threads, takes its parts as units of their own */
        const int span = s->window && s->pos0 + i + 1 > s->window ? s->window : s->pos0 + i + 1;
        if (i % 2 && span > IFK_KV_PART)
            CHECK(w > 0, "%s: row %d at 2 threads asks for work", what, s->pos0 + i);
    }
    /* a Q8 pool's products summed as floats (the AVX2 path) where this CPU may use vpdpbusd */
    if (s->type == IFK_KV_Q8 && ifk_isa_detect() >= IFK_ISA_AVX2) {
        CHECK(ifk_set_isa(IFK_ISA_AVX2) == IFK_ISA_AVX2, "the AVX2 path can be chosen");
        attend(mixed, q, (size_t)D, &p, &seq, 1, H, scale, 2);
        ifk_set_isa(IFK_ISA_AUTO);
        CHECK(memcmp(mixed, all, sizeof(float) * (size_t)s->T * D) == 0, "%s: the AVX2 path = this CPU's", what);
    }
    /* behind 3 rows of another sequence (the same pool, positions 0..2), at 2 threads */
    float *q2 = malloc(sizeof(float) * (size_t)(s->T + 3) * D);
    for (size_t i = 0; i < (size_t)3 * D; i++)
        q2[i] = (float)rnd_normal();
    memcpy(q2 + (size_t)3 * D, q, sizeof(float) * (size_t)s->T * D);
    ifk_kv_seq two[2] = {{.row0 = 0, .n_rows = 3, .pos0 = 0, .table = p.table},
                         {.row0 = 3, .n_rows = s->T, .pos0 = s->pos0, .table = p.table}};
    attend(mixed, q2, (size_t)D, &p, two, s->bidir ? 1 : 2, H, scale, 2);
    if (!s->bidir)
        CHECK(memcmp(mixed + (size_t)3 * D, all, sizeof(float) * (size_t)s->T * D) == 0,
              "%s: the rows behind another sequence, at 2 threads, = the rows alone", what);
    free(q2);
    free(q);
    free(all);
    free(one);
    free(mixed);
    free(ref);
    pool_free(&p);
}

static void test_shapes(void)
{
    static const int hds[] = {8, 40, 64, 80, 128};
    static const int nhs[] = {1, 3, 8, 9};
    static const int rows[][2] = {{0, 1}, {0, 40}, {17, 5}, {60, 9}, {63, 2}, {100, 33}, {130, 1}};
    int k = 0;
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
        for (size_t b = 0; b < sizeof nhs / sizeof nhs[0]; b++)
            for (size_t c = 0; c < sizeof rows / sizeof rows[0]; c++, k++) {
                shape s = {.type = k % 3, .hd = hds[a], .n_kv = 1 + k % 2, .nh = nhs[b], .block = k % 2 ? 7 : 16,
                           .pos0 = rows[c][0], .T = rows[c][1]};
                run_shape(&s);
            }
}

/* A sliding window (each row its own first key), soft-capped scores, an encoder's step; a Q8 pool
 * whose keys' scales look adjacent and are not. */
static void test_variants(void)
{
    shape w = {.type = IFK_KV_F32, .hd = 64, .n_kv = 2, .nh = 4, .block = 16, .pos0 = 50, .T = 40, .window = 37};
    run_shape(&w);
    shape c = {.type = IFK_KV_F16, .hd = 64, .n_kv = 1, .nh = 8, .block = 16, .pos0 = 70, .T = 20, .softcap = 2.0f};
    run_shape(&c);
    shape e = {.type = IFK_KV_F32, .hd = 40, .n_kv = 2, .nh = 3, .block = 7, .pos0 = 0, .T = 90, .bidir = 1};
    run_shape(&e);
    /* a Q8 pool whose 16 keys' scales (one group a row) end 30 bytes after they start over three
     * blocks, the middle one elsewhere in the pool: not adjacent */
    shape q = {.type = IFK_KV_Q8, .hd = 40, .n_kv = 1, .nh = 8, .block = 7, .pos0 = 60, .T = 9, .swap = 1};
    run_shape(&q);
}

/* Rows over more than a part of keys (IFK_KV_PART): each kind of pool, rows around part ends,
 * decoding rows (one a call), a window of more than a part, an encoder's step over two parts. */
static void test_parts(void)
{
    const int P = IFK_KV_PART;
    shape a = {.type = IFK_KV_F32, .hd = 64, .n_kv = 2, .nh = 4, .block = 16, .pos0 = 2 * P - 20, .T = 40};
    run_shape(&a);
    shape b = {.type = IFK_KV_F16, .hd = 128, .n_kv = 1, .nh = 1, .block = 7, .pos0 = 3 * P - 3, .T = 5};
    run_shape(&b);
    shape c = {.type = IFK_KV_Q8, .hd = 64, .n_kv = 4, .nh = 8, .block = 16, .pos0 = P - 2, .T = 4};
    run_shape(&c);
    shape d = {.type = IFK_KV_Q8, .hd = 80, .n_kv = 1, .nh = 3, .block = 7, .pos0 = 2 * P + 60, .T = 20};
    run_shape(&d);
    shape w = {.type = IFK_KV_F16, .hd = 64, .n_kv = 2, .nh = 2, .block = 16, .pos0 = 2 * P, .T = 8, .window = P + 70};
    run_shape(&w);
    shape e = {.type = IFK_KV_F32, .hd = 40, .n_kv = 1, .nh = 2, .block = 16, .pos0 = 0, .T = P + 30, .bidir = 1};
    run_shape(&e);
}

int main(void)
{
    RUN(test_shapes);
    RUN(test_variants);
    RUN(test_parts);
    return check_summary("test_kvattn");
}
