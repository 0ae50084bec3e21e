/*
 * kbench.c -- micro-benchmark of the CPU kernels; one JSON object per line on stdout.
 *
 *   kbench [--isa scalar|avx2|avx512|avx512gfni] [--threads N] [--only decode|prefill|attention|attention_decode]
 *          [--type f32|f16|bf16] [--exact] [--packed] [--no-split] [--quick]
 *
 * "product": how ifk_matmul multiplies the weight type here: "bf16_dot" (vdpbf16ps against x
 * rounded to BF16, kernels.h's ifk_bf16_dot) or "f32" (FMA); --exact forces the F32 product
 * (ifk_set_qx_f32), to compare the two in one run.
 * decode:    ifk_matmul with T = 1 on TinyLlama-sized weights, F32 / F16 / BF16, at 1 thread
 *            and at --threads (default: all cores). GBps = bytes of weights / time. Each call
 *            reads the next of several copies of the matrix (>= 256 MiB in all), so weights
 *            come from DRAM as they do in a real model, not from the last-level cache.
 * prefill:   ifk_matmul with T = 64 and 256 (one matrix, reused: this is compute-bound);
 *            GFLOPs = 2 T N K / time. --packed: F16 / BF16 in the layout the model loads them in
 *            (qpack.h's float pairs), where this CPU packs them.
 * attention: ifk_attention for one decode token (T = 1) and a 64-token prefill chunk over a
 *            2048-position cache, 32 query heads over 4 kv heads of 64 (TinyLlama); then the
 *            engine's paged attention (ifk_attention_paged, an F32 pool) for a decode step at
 *            2048 positions and a whole 512-token prefill.
 * attention_decode: the engine's paged attention for one decode step over 1k, 4k and 16k cached
 *            positions, F32, F16 and Q8 caches, TinyLlama's heads and Llama-2-7B's, the cache
 *            read from DRAM (several layers' pools in turn); GBps = bytes of cache / time.
 *            "split": whether the call's parts of keys ran as units of their own (the work
 *            ifk_attention_work asks for was given); --no-split gives none (parts in turn).
 *
 * Times: the best and the median of rounds (a decode round reads every copy once).
 *
 * Built by `make bench` (build/rel/kbench, linked with libiflow.a).
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench.h"
#include "kernels/cpu/bigmem.h"
#include "kernels/cpu/kvcache.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/qpack.h"
#include "kernels/cpu/quant.h"

/* 64-byte aligned, or exit (bench.h). */
static void *alloc64(size_t bytes)
{
    return bench_alloc64("kbench", bytes);
}

static const char *wname(int wt)
{
    return wt == IFK_F32 ? "f32" : wt == IFK_F16 ? "f16" : "bf16";
}

static const char *product(int wt)
{
    return ifk_bf16_dot(wt) ? "bf16_dot" : "f32";
}

/* Small random values that are valid in every weight type (F16/BF16 as bit patterns). */
static void fill_w(void *W, int wt, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        uint32_t r = seed >> 8;
        if (wt == IFK_F32)
            ((float *)W)[i] = ((float)(r & 0xffff) - 32768.0f) / 65536.0f;
        else if (wt == IFK_F16)
            ((uint16_t *)W)[i] = (uint16_t)(((r & 1) << 15) | ((9 + (r >> 1) % 6) << 10) | ((r >> 4) & 0x3ff));
        else
            ((uint16_t *)W)[i] = (uint16_t)(((r & 1) << 15) | ((121 + (r >> 1) % 6) << 7) | ((r >> 4) & 0x7f));
    }
}

static void fill_x(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
}

static void bench_decode(int N, int K, int wt, int threads, double min_s)
{
    size_t bytes = (size_t)N * K * (wt == IFK_F32 ? 4 : 2);
    int copies = (int)((256u << 20) / bytes) + 1;
    char **W = alloc64((size_t)copies * sizeof *W);
    for (int c = 0; c < copies; c++) {
        W[c] = alloc64(bytes);
        fill_w(W[c], wt, (size_t)N * K, (uint32_t)c + 1);
    }
    float *x = alloc64((size_t)K * 4);
    float *y = alloc64((size_t)N * 4);
    fill_x(x, (size_t)K);
    for (int c = 0; c < copies; c++) /* warm-up: page faults, thread team */
        ifk_matmul(y, (size_t)N, W[c], wt, x, (size_t)K, 1, N, K, threads);
    /* rounds of one call per copy; report the best and the median round */
    double best, med;
    BENCH_ROUNDS(min_s, &best, &med,
                 for (int c = 0; c < copies; c++)
                     ifk_matmul(y, (size_t)N, W[c], wt, x, (size_t)K, 1, N, K, threads));
    best /= copies; /* per call */
    med /= copies;
    printf("{\"bench\":\"decode\",\"isa\":\"%s\",\"wtype\":\"%s\",\"product\":\"%s\",\"N\":%d,\"K\":%d,"
           "\"threads\":%d,\"us\":%.2f,\"GBps\":%.2f,\"GBps_median\":%.2f}\n",
           ifk_isa_name(ifk_isa_current()), wname(wt), product(wt), N, K, threads, best * 1e6, bytes / best * 1e-9,
           bytes / med * 1e-9);
    fflush(stdout);
    for (int c = 0; c < copies; c++)
        free(W[c]);
    free(W);
    free(x);
    free(y);
}

/* packed: the weights in the layout the model loads them in (qpack.h's float pairs, when this
 * CPU packs the type; else the row layout, and "layout" says so). */
static void bench_prefill(int T, int N, int K, int wt, int threads, int packed, double min_s)
{
    size_t bytes = (size_t)N * K * (wt == IFK_F32 ? 4 : 2);
    void *W = alloc64(bytes);
    float *x = alloc64((size_t)T * K * 4);
    float *y = alloc64((size_t)T * N * 4);
    fill_w(W, wt, (size_t)N * K, 7);
    fill_x(x, (size_t)T * K);
    int mt = packed && wt != IFK_F32 ? ifk_qpack_type(wt) : 0;
    if (mt) {
        void *P = alloc64(ifk_qpack_bytes(wt, N, K));
        ifk_qpack(P, W, wt, N, K);
        free(W);
        W = P;
    } else {
        mt = wt;
    }
    ifk_matmul(y, (size_t)N, W, mt, x, (size_t)K, T, N, K, threads);
    double best, med, flop = 2.0 * T * N * K;
    BENCH_ROUNDS(min_s, &best, &med,
                 ifk_matmul(y, (size_t)N, W, mt, x, (size_t)K, T, N, K, threads));
    printf("{\"bench\":\"prefill\",\"isa\":\"%s\",\"wtype\":\"%s\",\"layout\":\"%s\",\"product\":\"%s\",\"T\":%d,"
           "\"N\":%d,\"K\":%d,\"threads\":%d,\"us\":%.1f,\"GFLOPs\":%.1f,\"GFLOPs_median\":%.1f}\n",
           ifk_isa_name(ifk_isa_current()), wname(wt), mt != wt ? "packed" : "rows", product(wt), T, N, K, threads,
           best * 1e6, flop / best * 1e-9, flop / med * 1e-9);
    fflush(stdout);
    free(W);
    free(x);
    free(y);
}

static void bench_attention(int T, int n_ctx, int threads, double min_s)
{
    const int NH = 32, NKV = 4, HD = 64;
    size_t kv_ld = (size_t)NKV * HD;
    float *q = alloc64((size_t)T * NH * HD * 4), *out = alloc64((size_t)T * NH * HD * 4);
    float *k = alloc64((size_t)n_ctx * kv_ld * 4), *v = alloc64((size_t)n_ctx * kv_ld * 4);
    fill_x(q, (size_t)T * NH * HD);
    fill_x(k, (size_t)n_ctx * kv_ld);
    fill_x(v, (size_t)n_ctx * kv_ld);
    int pos0 = n_ctx - T;
    ifk_attention(out, q, k, v, kv_ld, T, pos0, NH, NKV, HD, 0.125f, threads);
    double best, med;
    BENCH_ROUNDS(min_s, &best, &med,
                 ifk_attention(out, q, k, v, kv_ld, T, pos0, NH, NKV, HD, 0.125f, threads));
    double flop = 0;
    for (int i = 0; i < T; i++)
        flop += 4.0 * NH * HD * (pos0 + i + 1);
    printf("{\"bench\":\"attention\",\"isa\":\"%s\",\"T\":%d,\"pos0\":%d,\"heads\":%d,\"kv_heads\":%d,"
           "\"head_dim\":%d,\"threads\":%d,\"us\":%.1f,\"GFLOPs\":%.2f,\"GFLOPs_median\":%.2f}\n",
           ifk_isa_name(ifk_isa_current()), T, pos0, NH, NKV, HD, threads, best * 1e6, flop / best * 1e-9,
           flop / med * 1e-9);
    fflush(stdout);
    free(q);
    free(out);
    free(k);
    free(v);
}

/* ifk_attention_paged with the work it asks for (none with --no-split); returns whether it had some. */
static int split_attn = 1;
static int paged(float *out, const float *q, size_t ld, const void *k, const void *v, const ifk_kv_layout *L,
                 const ifk_kv_seq *seq, int NH, int threads)
{
    static float *work;
    static size_t have;
    size_t n = split_attn ? ifk_attention_work(L, seq, 1, NH, threads) : 0;
    if (n > have) {
        free(work);
        work = bench_need("kbench", malloc(n * sizeof(float)), n * sizeof(float));
        have = n;
    }
    ifk_attention_paged(out, q, ld, k, v, L, seq, 1, NH, 0.125f, threads, n ? work : NULL, n);
    return n > 0;
}

/* The engine's attention (kvcache.h's ifk_attention_paged): T query rows at positions pos0 ..
 * over an F32 pool of one block, TinyLlama's heads; GFLOPs counts a multiply and an add per
 * (head, key, element) for the scores and again for the values. */
static void bench_attention_paged(int T, int pos0, int threads, double min_s)
{
    const int NH = 32, NKV = 4, HD = 64, n = pos0 + T;
    ifk_kv_layout L = {.type = IFK_KV_F32, .block = n, .n_kv_heads = NKV, .head_dim = HD, .group = 32, .n_blocks = 1};
    const size_t ld = (size_t)NH * HD, kv = (size_t)n * NKV * HD;
    float *q = alloc64((size_t)T * ld * 4), *out = alloc64((size_t)T * ld * 4), *x = alloc64(kv * 4);
    void *k = alloc64(ifk_kv_pool_bytes(&L)), *v = alloc64(ifk_kv_pool_bytes(&L));
    const int32_t table[1] = {0};
    ifk_kv_seq all = {.row0 = 0, .n_rows = n, .pos0 = 0, .table = table}, seq = {.row0 = 0, .n_rows = T, .pos0 = pos0, .table = table};
    fill_x(q, (size_t)T * ld);
    fill_x(x, kv);
    ifk_kv_store(k, &L, &all, 1, x, (size_t)NKV * HD, threads);
    fill_x(x, kv);
    ifk_kv_store(v, &L, &all, 1, x, (size_t)NKV * HD, threads);
    double best, med;
    BENCH_ROUNDS(min_s, &best, &med, paged(out, q, ld, k, v, &L, &seq, NH, threads));
    double flop = 0;
    for (int i = 0; i < T; i++)
        flop += 4.0 * NH * HD * (pos0 + i + 1);
    printf("{\"bench\":\"attention_paged\",\"T\":%d,\"pos0\":%d,\"heads\":%d,\"kv_heads\":%d,\"head_dim\":%d,"
           "\"threads\":%d,\"us\":%.1f,\"GFLOPs\":%.2f,\"GFLOPs_median\":%.2f}\n",
           T, pos0, NH, NKV, HD, threads, best * 1e6, flop / best * 1e-9, flop / med * 1e-9);
    fflush(stdout);
    free(q);
    free(out);
    free(x);
    free(k);
    free(v);
}

/* Decoding attention (ifk_attention_paged, one query row) over an n_ctx-position cache of kv type
 * kvt, as a model's decode step meets it: several layers' pools (>= 256 MiB in all, so that the
 * cache comes from DRAM, not the last-level cache), one call each in turn. shape 0: TinyLlama's
 * heads (32 over 4 kv heads of 64), 1: Llama-2-7B's (32 of 128, no grouping). GBps = bytes of the
 * cache read (values and Q8's scales, K and V) / time. */
static void bench_attention_decode(int shape, int kvt, int n_ctx, int threads, double min_s)
{
    const int NH = 32, NKV = shape ? 32 : 4, HD = shape ? 128 : 64;
    ifk_kv_layout L = {.type = kvt, .block = n_ctx, .n_kv_heads = NKV, .head_dim = HD, .group = ifk_kv_group(HD),
                       .n_blocks = 1};
    const size_t ld = (size_t)NH * HD, KV = (size_t)NKV * HD, pool = ifk_kv_pool_bytes(&L);
    const size_t bytes = 2 * (size_t)n_ctx * ifk_kv_row_bytes(&L);
    int copies = (int)((256u << 20) / bytes) + 1;
    float *q = alloc64(ld * 4), *out = alloc64(ld * 4), *x = alloc64((size_t)n_ctx * KV * 4);
    char **k = alloc64((size_t)copies * sizeof *k), **v = alloc64((size_t)copies * sizeof *v);
    const int32_t table[1] = {0};
    ifk_kv_seq all = {.row0 = 0, .n_rows = n_ctx, .pos0 = 0, .table = table};
    ifk_kv_seq seq = {.row0 = 0, .n_rows = 1, .pos0 = n_ctx - 1, .table = table};
    fill_x(q, ld);
    fill_x(x, (size_t)n_ctx * KV);
    for (int c = 0; c < copies; c++) {
        k[c] = bench_need("kbench", ifk_bigmem_alloc(pool), pool); /* as the engine allocates a cache */
        v[c] = bench_need("kbench", ifk_bigmem_alloc(pool), pool);
        ifk_kv_store(k[c], &L, &all, 1, x, KV, threads);
        ifk_kv_store(v[c], &L, &all, 1, x, KV, threads);
    }
    int split = 0;
    for (int c = 0; c < copies; c++) /* warm-up */
        split = paged(out, q, ld, k[c], v[c], &L, &seq, NH, threads);
    double best, med;
    BENCH_ROUNDS(min_s, &best, &med,
                 for (int c = 0; c < copies; c++)
                     paged(out, q, ld, k[c], v[c], &L, &seq, NH, threads));
    best /= copies;
    med /= copies;
    printf("{\"bench\":\"attention_decode\",\"isa\":\"%s\",\"kv_type\":\"%s\",\"n_ctx\":%d,\"heads\":%d,"
           "\"kv_heads\":%d,\"head_dim\":%d,\"threads\":%d,\"split\":%d,\"us\":%.1f,\"GBps\":%.2f,"
           "\"GBps_median\":%.2f}\n",
           ifk_isa_name(ifk_isa_current()), ifk_kv_type_name(kvt), n_ctx, NH, NKV, HD, threads, split, best * 1e6,
           bytes / best * 1e-9, bytes / med * 1e-9);
    fflush(stdout);
    for (int c = 0; c < copies; c++) {
        ifk_bigmem_free(k[c]);
        ifk_bigmem_free(v[c]);
    }
    free(k);
    free(v);
    free(q);
    free(out);
    free(x);
}

int main(int argc, char **argv)
{
    int threads = omp_get_num_procs(), quick = 0, packed = 0, wt0 = IFK_F32, wt1 = IFK_BF16;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
            const char *s = argv[++i];
            const int want = ifk_isa_by_name(s);
            if (want == -2) {
                fprintf(stderr, "kbench: unknown --isa '%s' (scalar, avx2, avx512, avx512gfni, amx)\n", s);
                return 2;
            }
            if (ifk_set_isa(want) != want) {
                fprintf(stderr, "kbench: this CPU lacks %s\n", s);
                return 1;
            }
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            only = argv[++i];
        } else if (!strcmp(argv[i], "--type") && i + 1 < argc) {
            const char *s = argv[++i];
            wt0 = wt1 = !strcmp(s, "f32") ? IFK_F32 : !strcmp(s, "f16") ? IFK_F16 : !strcmp(s, "bf16") ? IFK_BF16 : -1;
            if (wt0 < 0) {
                fprintf(stderr, "kbench: unknown --type '%s' (f32, f16, bf16)\n", s);
                return 2;
            }
        } else if (!strcmp(argv[i], "--exact")) {
            ifk_set_qx_f32(1);
        } else if (!strcmp(argv[i], "--no-split")) {
            split_attn = 0;
        } else if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--packed")) {
            packed = 1;
        } else {
            fprintf(stderr, "usage: kbench [--isa scalar|avx2|avx512] [--threads N] "
                            "[--only decode|prefill|attention|attention_decode] [--type f32|f16|bf16] [--exact] "
                            "[--packed] [--no-split] [--quick]\n");
            return 2;
        }
    }
    double min_s = quick ? 0.1 : 0.5;
    static const int shapes[][2] = {{2048, 2048}, {5632, 2048}, {2048, 5632}, {32000, 2048}, {256, 2048}};
    const int n_shapes = 5;
    int tl[2] = {1, threads};
    int n_tl = threads > 1 ? 2 : 1;
    for (int s = 0; s < n_shapes && (!only || !strcmp(only, "decode")); s++)
        for (int wt = wt0; wt <= wt1; wt++)
            for (int ti = 0; ti < n_tl; ti++)
                bench_decode(shapes[s][0], shapes[s][1], wt, tl[ti], min_s);
    static const int Ts[] = {64, 256};
    for (int s = 0; s < n_shapes && (!only || !strcmp(only, "prefill")); s++)
        for (int wt = wt0; wt <= wt1; wt++)
            for (int ti = 0; ti < 2; ti++)
                for (int tj = 0; tj < n_tl; tj++)
                    bench_prefill(Ts[ti], shapes[s][0], shapes[s][1], wt, tl[tj], packed, min_s);
    for (int tj = 0; tj < n_tl && (!only || !strcmp(only, "attention")); tj++) {
        bench_attention(1, 2048, tl[tj], min_s);
        bench_attention(64, 2048, tl[tj], min_s);
        bench_attention_paged(1, 2047, tl[tj], min_s);  /* a decode step at 2k */
        bench_attention_paged(512, 0, tl[tj], min_s);   /* a 512-token prefill */
    }
    static const int ctxs[] = {1024, 4096, 16384};
    for (int shape = 0; shape < 2 && (!only || !strcmp(only, "attention") || !strcmp(only, "attention_decode")); shape++)
        for (int ci = 0; ci < 3; ci++)
            for (int kvt = IFK_KV_F32; kvt <= IFK_KV_Q8; kvt++)
                for (int tj = 0; tj < n_tl; tj++)
                    bench_attention_decode(shape, kvt, ctxs[ci], tl[tj], min_s);
    return 0;
}
