/* iflow-bench -- load, prefill and decode speed of one shard file, as one JSON object.
 *
 *   iflow-bench MODEL [PREFILL_TOKENS=128] [DECODE_TOKENS=32] [THREADS...]
 *
 * Token ids are fixed pseudo-random ids (speed does not depend on them). For each thread count
 * it times one prefill of PREFILL_TOKENS tokens and DECODE_TOKENS single-token steps after it,
 * best of 2 runs. decode_weight_gbps = bytes of weights read per token (all matrices but the
 * embedding table) x tokens/s, the figure to compare with the memory bandwidth.
 * pool_items_taken_back / pool_worker_moves: what the thread pool (kernels/cpu/pool.h) did to
 * keep going on a busy machine during that thread count's runs.
 * IFLOW_BENCH_ISA=scalar|avx2|avx512|avx512gfni forces a kernel path (to compare paths).
 * IFLOW_BENCH_ACTIVATIONS=f32 makes the CPU's products meet x in F32, unrounded (iflow-ppl
 * --activations f32: the reference products, to compare); =int8 rounds x to int8 for every
 * quantized type, Q6 and Q5 included (iflow-ppl --activations int8); =int16 rounds Q8's to int16
 * (iflow-ppl --activations int16; by default Q8 takes int8 x less each token's outliers). bf16_dot: whether F16 and BF16
 * matrices ran on the BF16 dot product (kernels.h's ifk_bf16_dot), whose roof is twice FMA's.
 * IFLOW_BENCH_DEVICE=cuda|cuda:N places every layer and the output on that GPU; decode is then
 * timed as greedy decoding runs it (iflow_ctx_eval_argmax: only the id comes back), and the
 * thread count only matters for the CPU's share (the embedding lookup). Decode steps run as
 * iflow-run runs them by default (recorded once, run again at each next position:
 * IFLOW_GRAPHS_REPLAY); IFLOW_BENCH_GRAPHS=0 runs them op by op, =1 records every step
 * (iflow_ctx_set_graphs);
 * graph_launches / graph_instantiations / graph_aborts / graph_replays: iflow_device_graph_stats over
 * the run (replays: steps run again from a recording at the next position, not recorded).
 * IFLOW_BENCH_KV=f32|f16|q8: the KV cache's type (iflow-run --kv-type; default f32). Decode at a
 * depth: PREFILL_TOKENS is the context the DECODE_TOKENS steps attend to, and
 * decode_kv_bytes_per_token the cache each of them reads there (K and V of every layer, a latent
 * attention's one row; the steps' own positions aside).
 * IFLOW_BENCH_PLAN=FILE places the model as a partition plan says (plan.h; cpu:N devices get the
 * plan's thread counts, or the cores shared out), to compare with iflow-partition's estimates. */
#include "bench/bench.h"
#include "libcore/base/error.h"
#include "libcore/engine/model.h"
#include "libcore/engine/plan.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/kvcache.h"
#include "kernels/cpu/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: iflow-bench MODEL [PREFILL_TOKENS] [DECODE_TOKENS] [THREADS...]\n");
        return 2;
    }
    const char *isa = getenv("IFLOW_BENCH_ISA");
    if (isa && *isa) {
        const int want = ifk_isa_by_name(isa);
        if (want == -2 || ifk_set_isa(want) != want) {
            fprintf(stderr, "iflow-bench: kernel path '%s' is unknown or not supported here\n", isa);
            return 2;
        }
    }
    const char *act = getenv("IFLOW_BENCH_ACTIVATIONS");
    if (act && *act && iflow_kernel_set_activations(act) < 0) {
        fprintf(stderr, "iflow-bench: IFLOW_BENCH_ACTIVATIONS='%s' is not int, int8, int16 or f32\n", act);
        return 2;
    }
    const char *kv = getenv("IFLOW_BENCH_KV");
    const int kv_type = kv && *kv ? ifk_kv_type_from_name(kv) : IFK_KV_F32;
    if (kv_type < 0) {
        fprintf(stderr, "iflow-bench: IFLOW_BENCH_KV='%s' is not f32, f16 or q8\n", kv);
        return 2;
    }
    int n_prefill = argc > 2 ? atoi(argv[2]) : 128, n_decode = argc > 3 ? atoi(argv[3]) : 32;
    double t0 = bench_now();
    iflow_model *m;
    if (iflow_model_open(&m, argv[1], 0) < 0) {
        fprintf(stderr, "iflow-bench: %s\n", iflow_errmsg());
        return 1;
    }
    const char *devname = getenv("IFLOW_BENCH_DEVICE"), *plan_path = getenv("IFLOW_BENCH_PLAN");
    iflow_device *dev = NULL, *plan_devs[IFLOW_PLAN_MAX_DEVICES] = {0};
    iflow_plan plan = {0};
    int *layer_dev = NULL;
    if (plan_path && *plan_path) {
        int rc = iflow_plan_load(&plan, plan_path);
        if (rc == 0)
            rc = iflow_plan_open_devices(&plan, -1, plan_devs);
        int n_ctx = (argc > 2 ? atoi(argv[2]) : 128) + (argc > 3 ? atoi(argv[3]) : 32) + 1;
        if (rc < 0 || iflow_model_place_plan(m, &plan, plan_devs, n_ctx) < 0) {
            fprintf(stderr, "iflow-bench: %s\n", iflow_errmsg());
            return 1;
        }
        devname = NULL;
    }
    if (devname && *devname && strcmp(devname, "cpu") != 0) {
        iflow_placement p;
        int L = iflow_model_hparams(m)->n_layers;
        layer_dev = malloc(sizeof(int) * (size_t)L);
        int n_ctx = (argc > 2 ? atoi(argv[2]) : 128) + (argc > 3 ? atoi(argv[3]) : 32) + 1;
        if (!layer_dev || iflow_device_open(&dev, devname, 0) < 0) {
            fprintf(stderr, "iflow-bench: %s\n", layer_dev ? iflow_errmsg() : "out of memory");
            return 1;
        }
        iflow_placement_first_n(&p, layer_dev, L, dev, L, NULL);
        if (iflow_model_place(m, &p, n_ctx) < 0) {
            fprintf(stderr, "iflow-bench: %s\n", iflow_errmsg());
            return 1;
        }
    }
    double t_load = bench_now() - t0;
    const iflow_hparams *hp = iflow_model_hparams(m);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n_prefill + n_decode));
    uint32_t s = 12345;
    for (int i = 0; i < n_prefill + n_decode; i++)
        ids[i] = (int32_t)((s = s * 1664525u + 1013904223u) >> 8) % hp->vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)hp->vocab_size);
    /* the cache a decode step reads at the prompt's length: K and V of every layer */
    const ifk_kv_layout kvl = {.type = kv_type, .block = 1, .n_kv_heads = hp->n_kv_heads, .head_dim = hp->head_dim,
                               .group = ifk_kv_group(hp->head_dim), .n_blocks = 1};
    /* latent attention (kv_lora_rank) reads its one row a position as keys and values */
    const double kv_bytes = (hp->kv_lora_rank ? 1.0 : 2.0) * hp->n_layers * n_prefill * (double)ifk_kv_row_bytes(&kvl);
    printf("{\"model\": \"%s\", \"device\": \"%s\", \"kernel_path\": \"%s\", \"bf16_dot\": %s, \"kv_type\": \"%s\", "
           "\"load_s\": %.4f, \"decode_bytes_per_token\": %llu, \"decode_kv_bytes_per_token\": %.0f, \"runs\": [",
           argv[1], dev ? dev->info.name : plan.n_devices ? plan_path : "cpu", ifk_isa_name(ifk_isa_current()),
           ifk_bf16_dot(IFK_BF16) ? "true" : "false", ifk_kv_type_name(kv_type), t_load,
           (unsigned long long)iflow_model_decode_bytes(m), kv_bytes);
    int n_threads_args = argc > 4 ? argc - 4 : 2;
    for (int a = 0; a < n_threads_args; a++) {
        int threads = argc > 4 ? atoi(argv[4 + a]) : a + 1;
        double best_pre = 1e30, best_dec = 1e30;
        long taken0 = ifk_pool_taken_back(), moves0 = ifk_pool_moves();
        for (int rep = 0; rep < 2; rep++) {
            iflow_ctx *c;
            if (iflow_ctx_open_kv(&c, m, n_prefill + n_decode + 1, threads, kv_type) < 0) {
                fprintf(stderr, "iflow-bench: %s\n", iflow_errmsg());
                return 1;
            }
            const char *graphs = getenv("IFLOW_BENCH_GRAPHS"); /* iflow-run's default, or 0 / 1 */
            iflow_ctx_set_graphs(c, !graphs || !*graphs     ? IFLOW_GRAPHS_REPLAY
                                    : strcmp(graphs, "1") == 0 ? IFLOW_GRAPHS_ALL
                                                               : IFLOW_GRAPHS_OFF);
            double a0 = bench_now();
            int rc = iflow_ctx_eval(c, ids, n_prefill, logits, 0);
            double a1 = bench_now();
            for (int i = 0; i < n_decode && rc == 0; i++) {
                int32_t next;
                rc = dev ? iflow_ctx_eval_argmax(c, ids + n_prefill + i, 1, &next)
                         : iflow_ctx_eval(c, ids + n_prefill + i, 1, logits, 0);
            }
            double a2 = bench_now();
            if (rc < 0) {
                fprintf(stderr, "iflow-bench: %s\n", iflow_errmsg());
                return 1;
            }
            best_pre = a1 - a0 < best_pre ? a1 - a0 : best_pre;
            best_dec = a2 - a1 < best_dec ? a2 - a1 : best_dec;
            iflow_ctx_close(c);
        }
        double dec_tps = n_decode / best_dec;
        printf("%s{\"threads\": %d, \"prefill_tokens\": %d, \"prefill_tok_s\": %.2f, \"decode_tokens\": %d, "
               "\"decode_tok_s\": %.3f, \"decode_weight_gbps\": %.3f, \"pool_items_taken_back\": %ld, "
               "\"pool_worker_moves\": %ld}",
               a ? ", " : "", threads, n_prefill, n_prefill / best_pre, n_decode, dec_tps,
               dec_tps * (double)iflow_model_decode_bytes(m) / 1e9, ifk_pool_taken_back() - taken0,
               ifk_pool_moves() - moves0);
    }
    iflow_graph_stats gs;
    iflow_device_graph_stats(dev, &gs);
    printf("], \"graph_launches\": %ld, \"graph_instantiations\": %ld, \"graph_aborts\": %ld, \"graph_replays\": %ld}\n",
           gs.launches, gs.instantiations, gs.aborts, gs.replays);
    free(ids);
    free(logits);
    iflow_model_close(m);
    iflow_device_close(dev);
    iflow_plan_close_devices(&plan, plan_devs);
    free(layer_dev);
    return 0;
}
