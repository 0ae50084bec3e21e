/*
 * test_device.c -- the device layer and placement, on the CPU.
 *
 * What a GPU adds is tested by tests/gpu (make check-gpu). Here:
 *   - devices by name, the device list, the CUDA status when there is no GPU (or no CUDA);
 *   - layer placement over several CPU devices gives logits bit-identical to one device (the
 *     same kernels in the same order: only where the hidden state lives changes);
 *   - a "detached" CPU device (host_memory = 0: weights copied to its own memory, activations
 *     crossing by upload/download, logits copied back) exercises every path a GPU device takes
 *     through the engine, also bit-identical;
 *   - iflow_ctx_eval_argmax equals the argmax of the logits;
 *   - iflow_ctx_eval's passes (128 rows, 512 where no layer is in host memory, IFLOW_PASS) give
 *     the same bits on a 700-token prompt, a step holds as many tokens as a pass, and
 *     placements count their scratch;
 *   - a plan's processes (comm.h, threads over iflow_comm_local_open) each on a detached device,
 *     bit-identical to the plan in one process: the GPU's side of one process per device;
 *   - steps recorded as one graph (iflow_ctx_set_graphs) on a device whose record ops this test
 *     provides: the engine's recorded path gives the same bits, and a device that refuses to
 *     record gets each step op by op, until the context stops asking; in replay mode a step of
 *     one sequence is asked to be run again, then recorded at its position under one key;
 *   - placement errors: bad indices, a weight type a device has no kernel for (named), a device
 *     without the memory (named, with the bytes missing), all before anything is copied;
 *   - the CPU device's norms, RoPE, SiLU and adds, split over threads in pieces (cpu.c's span),
 *     give one thread's bits, also when a late worker's piece is taken back, and leave the
 *     padding between rows alone;
 *   - the CPU device's paged attention of a decoding row deep in its context, its parts of keys
 *     over threads in the work of the calling thread (cpu.c's work_of), from the main thread and
 *     from two threads at once, gives one thread's bits.
 */
#include "tests/unit/testlib.h"
#include "libcore/base/dtype.h"
#include "libcore/device/device.h"
#include "libcore/device/device_impl.h"
#include "libcore/engine/comm.h"
#include "libcore/engine/footprint.h"
#include "libcore/engine/model.h"
#include "libcore/engine/plan.h"
#include "libcore/formats/quant.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/kvcache.h"
#include "kernels/cpu/pool.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static char dir[] = "/tmp/iflow-test-device-XXXXXX";
static char s_f32[512], s_q4[512];

/* ---- a CPU device that pretends its memory is not the host's ---- */

static iflow_device_ops detached_ops;
static uint64_t detached_free = 0;    /* 0: as much as the machine has */
static int detached_refuses = -1;     /* a weight type it claims to lack (-1: none) */
static int detached_allocs, detached_frees;

static int detached_alloc(iflow_device *d, void **p, size_t n)
{
    *p = calloc(1, n ? n : 1);
    detached_allocs += *p != NULL;
    return *p ? 0 : iflow_seterr(IFLOW_ENOMEM, "detached: out of memory");
}

static void detached_free_fn(iflow_device *d, void *p)
{
    detached_frees += p != NULL;
    free(p);
}

static int detached_query(const iflow_device *d, iflow_device_info *info)
{
    *info = d->info;
    if (detached_free)
        info->mem_free = detached_free;
    return 0;
}

static int detached_supports(const iflow_device *d, int wtype) { return wtype != detached_refuses; }

/* A CPU device whose memory the engine must treat as foreign. */
static iflow_device *open_detached(const char *name, int threads)
{
    iflow_device *d;
    if (iflow_device_open(&d, "cpu", threads) < 0)
        return NULL;
    detached_ops = *d->ops;
    detached_ops.alloc = detached_alloc;
    detached_ops.free = detached_free_fn;
    detached_ops.query = detached_query;
    detached_ops.supports = detached_supports;
    d->ops = &detached_ops;
    d->host_memory = 0;
    snprintf(d->info.name, sizeof d->info.name, "%s", name);
    return d;
}

/* Record ops for the detached device: "recording" runs each op at once (nothing is deferred,
 * so a recording must not fail half-way here) and counts; with rec_refuse, record_begin fails. */
static int rec_refuse, rec_begins, rec_ends, rec_aborts;

static int rec_begin(iflow_device *d)
{
    rec_begins++;
    return rec_refuse ? iflow_seterr(IFLOW_EIO, "%s: recording refused (test)", d->info.name) : 0;
}
static int rec_end(iflow_device *d) { return rec_ends++, 0; }
static void rec_abort(iflow_device *d) { rec_aborts++; }

/* Positional recording (record_at / replay): this device cannot run a recording again (its ops
 * ran at once), so replay always says "record again"; the test checks what the engine asks:
 * the positions, the most positions, and that one context's steps keep one key. */
static int rec_ats, rec_replays, rec_keys_differ, rec_at_pos[16], rec_at_max;
static uint64_t rec_key;
static int rec_at(iflow_device *d, int pos0, int max_pos, uint64_t key)
{
    if (rec_ats > 0 && key != rec_key)
        rec_keys_differ++;
    rec_key = key;
    if (rec_ats < 16)
        rec_at_pos[rec_ats] = pos0;
    rec_at_max = max_pos;
    rec_ats++;
    return 0;
}
static int rec_replay(iflow_device *d, int pos0, uint64_t key)
{
    rec_replays++;
    if (rec_ats > 0 && key != rec_key)
        rec_keys_differ++;
    return 1;
}

/* ---- helpers ---- */

#define N_PROMPT 9
#define N_DECODE 6
static const int32_t prompt[N_PROMPT] = {1, 403, 407, 261, 378, 432, 383, 286, 261};

static int run_graphs; /* run_model's contexts record their steps (iflow_ctx_set_graphs) */

/* Prefill logits [N_PROMPT][vocab] then N_DECODE greedy steps' logits, into out (malloc'd). */
static float *run_model(iflow_model *m, int *n_out)
{
    int V = iflow_model_hparams(m)->vocab_size, n = (N_PROMPT + N_DECODE) * V;
    float *out = calloc((size_t)n, sizeof(float));
    iflow_ctx *c;
    int rc = iflow_ctx_open(&c, m, 64, 1);
    CHECK(rc == 0, "ctx open: %s", iflow_errmsg());
    if (rc) {
        free(out);
        return NULL;
    }
    iflow_ctx_set_graphs(c, run_graphs);
    CHECK(iflow_ctx_eval(c, prompt, N_PROMPT, out, 1) == 0, "prefill: %s", iflow_errmsg());
    float *last = out + (size_t)(N_PROMPT - 1) * V;
    for (int s = 0; s < N_DECODE; s++) {
        int32_t next = 0;
        for (int i = 1; i < V; i++)
            if (last[i] > last[next])
                next = i;
        float *dst = out + (size_t)(N_PROMPT + s) * V;
        CHECK(iflow_ctx_eval(c, &next, 1, dst, 0) == 0, "decode: %s", iflow_errmsg());
        last = dst;
    }
    iflow_ctx_close(c);
    *n_out = n;
    return out;
}

static int bit_identical(const float *a, const float *b, int n)
{
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* ---- tests ---- */

static void test_names_and_list(void)
{
    iflow_device *d;
    CHECK(iflow_device_open(&d, "cpu", 1) == 0, "cpu opens");
    CHECK(d->host_memory && d->info.kind == IFLOW_DEVICE_CPU && strcmp(d->info.name, "cpu") == 0, "cpu info");
    CHECK(d->info.units >= 1 && d->info.mem_total > 0, "cpu has cores and memory");
    iflow_device_close(d);
    int rc = iflow_device_open(&d, "tpu:0", 1);
    CHECK_ERR(rc, IFLOW_EINVAL, "tpu:0", "unknown device");
    rc = iflow_device_open(&d, "cuda:x", 1);
    CHECK_ERR(rc, IFLOW_EINVAL, "cuda:x", "unknown device");

    iflow_device_info list[8];
    int n = 0;
    CHECK(iflow_device_list(list, 8, &n) == 0 && n >= 1, "list");
    CHECK(list[0].kind == IFLOW_DEVICE_CPU, "the cpu comes first");
    const char *status = iflow_device_cuda_status();
    CHECK(status && *status && !strchr(status, '\n'), "cuda status is one line: '%s'", status);
    if (n == 1) {
        /* No GPU here (or no CUDA in this build): asking for one fails with the reason. */
        rc = iflow_device_open(&d, "cuda", 1);
        CHECK(rc == IFLOW_EUNSUPPORTED || rc == IFLOW_ENOTFOUND, "cuda without a gpu: rc %d", rc);
        CHECK(strstr(iflow_errmsg(), "cuda:0") != NULL, "message names cuda:0: %s", iflow_errmsg());
        const char *why = NULL;
        CHECK(iflow_device_open_auto(&d, 1, &why) == 0 && d->info.kind == IFLOW_DEVICE_CPU, "auto falls back to the cpu");
        CHECK(why && *why, "auto says why: '%s'", why ? why : "(null)");
        iflow_device_close(d);
    }
}

/* Every way of splitting stories260K's 5 layers over 2 and 3 CPU devices gives the same bits. */
static void test_layer_split_identical(void)
{
    iflow_model *m;
    int n_ref, n;
    CHECK(iflow_model_open(&m, s_f32, 0) == 0, "open: %s", iflow_errmsg());
    float *ref = run_model(m, &n_ref);
    int L = iflow_model_hparams(m)->n_layers;
    iflow_device *cpu[3];
    for (int i = 0; i < 3; i++)
        iflow_device_open(&cpu[i], "cpu", i + 1); /* thread counts differ too */
    int splits[][8] = {{0, 0, 0, 1, 1}, {1, 0, 0, 0, 0}, {0, 1, 0, 1, 0}, {0, 1, 2, 2, 1}, {2, 2, 2, 2, 2}};
    int outs[] = {1, 0, 0, 2, 0};
    for (size_t k = 0; k < sizeof splits / sizeof splits[0] && ref; k++) {
        iflow_placement p = {.n_devices = 3, .layer_device = splits[k], .output_device = outs[k]};
        for (int i = 0; i < 3; i++)
            p.devices[i] = cpu[i];
        CHECK(L == 5, "stories260K has 5 layers");
        int rc = iflow_model_place(m, &p, 64);
        CHECK(rc == 0, "place %zu: %s", k, iflow_errmsg());
        float *got = rc ? NULL : run_model(m, &n);
        CHECK(got && n == n_ref && bit_identical(got, ref, n), "split %zu: logits bit-identical to one device", k);
        free(got);
    }
    iflow_model_close(m);
    for (int i = 0; i < 3; i++)
        iflow_device_close(cpu[i]);
    free(ref);
}

/* Weights copied to a device's own memory, the hidden state crossing by upload/download, the
 * logits copied back: the GPU's paths through the engine, on the CPU. F32 and q4_b64. */
static void test_detached_identical(void)
{
    const char *paths[] = {s_f32, s_q4};
    for (int k = 0; k < 2; k++) {
        iflow_model *m;
        int n_ref, n;
        CHECK(iflow_model_open(&m, paths[k], 0) == 0, "open: %s", iflow_errmsg());
        float *ref = run_model(m, &n_ref);
        iflow_device *det = open_detached("det:0", 1);
        int layers[5];
        iflow_placement p;
        /* all on the detached device; then 3 layers there, 2 on the context's CPU (NULL) */
        detached_allocs = detached_frees = 0;
        for (int first = 5; first >= 3; first -= 2) {
            iflow_placement_first_n(&p, layers, 5, det, first, NULL);
            int rc = iflow_model_place(m, &p, 64);
            CHECK(rc == 0, "place: %s", iflow_errmsg());
            CHECK(detached_allocs > 0, "weights were copied to the detached device");
            float *got = rc ? NULL : run_model(m, &n);
            CHECK(got && n == n_ref && bit_identical(got, ref, n), "%s, %d layers detached: bit-identical",
                  k ? "q4_b64" : "f32", first);
            /* greedy on the output device */
            iflow_ctx *c;
            int32_t next = -1;
            if (iflow_ctx_open(&c, m, 64, 1) == 0) {
                CHECK(iflow_ctx_eval_argmax(c, prompt, N_PROMPT, &next) == 0, "argmax: %s", iflow_errmsg());
                const float *last = ref + (size_t)(N_PROMPT - 1) * iflow_model_hparams(m)->vocab_size;
                int32_t want = 0;
                for (int i = 1; i < iflow_model_hparams(m)->vocab_size; i++)
                    if (last[i] > last[want])
                        want = i;
                CHECK(next == want, "eval_argmax %d, argmax of the logits %d", next, want);
                iflow_ctx_close(c);
            }
            free(got);
        }
        iflow_model_close(m);
        CHECK(detached_allocs == detached_frees, "every device allocation freed (%d allocs, %d frees)", detached_allocs,
              detached_frees);
        iflow_device_close(det);
        free(ref);
    }
}

/* All logits of ids [n] in one iflow_ctx_eval (passes of the model's rows), into out [n][vocab]. */
static int eval_all(iflow_model *m, const int32_t *ids, int n, float *out)
{
    iflow_ctx *c;
    int rc = iflow_ctx_open(&c, m, n, 1);
    if (rc == 0)
        rc = iflow_ctx_eval(c, ids, n, out, 1);
    CHECK(rc == 0, "eval of %d tokens: %s", n, iflow_errmsg());
    iflow_ctx_close(c);
    return rc;
}

/* The scratch a placement counts on device i; 0 when the placement is refused. */
static uint64_t scratch_of(iflow_model *m, iflow_placement *p, int n_ctx, int i)
{
    iflow_device_bytes need[IFLOW_MAX_DEVICES];
    int rc = iflow_placement_bytes(m, p, n_ctx, need);
    CHECK(rc == 0, "placement bytes: %s", iflow_errmsg());
    return rc ? 0 : need[i].scratch;
}

/* iflow_ctx_eval's passes: 128 rows where a layer or the output runs in host memory, 512 where
 * none does (a GPU's), IFLOW_PASS's where it asks. A prompt of 700 tokens gives the same bits in
 * passes of 128 (host), 512 (detached device) and 300 (IFLOW_PASS), by the CPU kernels' batch
 * invariance, and each placement counts the scratch of its pass (plus one row of logits). */
static void test_pass_rows(void)
{
    enum { N = 700 };
    iflow_model *m;
    CHECK(iflow_model_open(&m, s_f32, 0) == 0, "open: %s", iflow_errmsg());
    const iflow_hparams hps = *iflow_model_hparams(m), *hp = &hps; /* past the model's close */
    const int V = hp->vocab_size;
    const uint64_t logits_row = (uint64_t)V * sizeof(float);
    int32_t *ids = malloc(N * sizeof *ids);
    float *ref = malloc((size_t)N * V * sizeof(float)), *got = malloc((size_t)N * V * sizeof(float));
    for (int i = 0; i < N; i++)
        ids[i] = 3 + (int)(((uint32_t)i * 2654435761u) >> 9) % (V - 3);
    int layers[5];
    iflow_placement p;
    iflow_device *det = open_detached("det:0", 1);
    if (eval_all(m, ids, N, ref) == 0) {
        iflow_placement_first_n(&p, layers, 5, NULL, 5, NULL);
        CHECK(scratch_of(m, &p, N, 0) == iflow_scratch_bytes(hp, 128) + logits_row, "host: a pass of 128 rows");
        iflow_placement_first_n(&p, layers, 5, det, 3, NULL);
        CHECK(scratch_of(m, &p, N, 0) == iflow_scratch_bytes(hp, 128), "3 of 5 layers detached: 128 rows");
        iflow_placement_first_n(&p, layers, 5, det, 5, NULL);
        CHECK(scratch_of(m, &p, N, 0) == iflow_scratch_bytes(hp, IFLOW_GPU_PASS) + logits_row,
              "every layer and the output detached: %d rows", IFLOW_GPU_PASS);
        CHECK(iflow_model_place(m, &p, N) == 0, "place: %s", iflow_errmsg());
        CHECK(eval_all(m, ids, N, got) == 0 && bit_identical(got, ref, N * V),
              "%d tokens in passes of %d: the bits of passes of 128", N, IFLOW_GPU_PASS);
    }
    iflow_model_close(m);
    setenv("IFLOW_PASS", "300", 1);
    CHECK(iflow_model_open(&m, s_f32, 0) == 0, "open: %s", iflow_errmsg());
    iflow_placement_first_n(&p, layers, 5, NULL, 5, NULL);
    CHECK(scratch_of(m, &p, N, 0) == iflow_scratch_bytes(hp, 300) + logits_row, "IFLOW_PASS=300: 300 rows");
    CHECK(eval_all(m, ids, N, got) == 0 && bit_identical(got, ref, N * V), "passes of 300: the same bits");
    /* a step of a paged cache holds the pass too: 250 tokens in one step give ctx_eval's bits, and
     * 301 are refused */
    iflow_kv *kv = NULL;
    iflow_ctx *sc = NULL;
    if (iflow_kv_open(&kv, m, IFK_KV_F32, N, 1) == 0 && iflow_ctx_open_steps(&sc, m, 1) == 0) {
        CHECK(iflow_ctx_step_tokens(sc) == 300, "steps of %d tokens, not 300", iflow_ctx_step_tokens(sc));
        const int32_t table[1] = {0};
        iflow_step_seq q = {.ids = ids, .n = 250, .pos0 = 0, .table = table, .logits = got, .n_out = 250};
        CHECK(iflow_ctx_step(sc, kv, &q, 1) == 0 && bit_identical(got, ref, 250 * V),
              "a step of 250 tokens: the bits of iflow_ctx_eval (%s)", iflow_errmsg());
        q = (iflow_step_seq){.ids = ids + 250, .n = 301, .pos0 = 250, .table = table};
        int rc = iflow_ctx_step(sc, kv, &q, 1);
        CHECK_ERR(rc, IFLOW_ERANGE, "a step", "at most 300 tokens"); /* of 301 tokens */
    } else {
        CHECK(0, "paged cache and step context: %s", iflow_errmsg());
    }
    iflow_ctx_close(sc);
    iflow_kv_close(kv);
    iflow_model_close(m);
    setenv("IFLOW_PASS", "64", 1); /* below a step: ignored */
    CHECK(iflow_model_open(&m, s_f32, 0) == 0, "open: %s", iflow_errmsg());
    CHECK(scratch_of(m, &p, N, 0) == iflow_scratch_bytes(hp, 128) + logits_row, "IFLOW_PASS=64 is ignored");
    iflow_model_close(m);
    unsetenv("IFLOW_PASS");
    iflow_device_close(det);
    free(ids);
    free(ref);
    free(got);
}

/* Two sequences through iflow_ctx_step: a prefill step (not recorded), then N_DECODE steps of
 * one token each (recorded with graphs on): out [2 * N_DECODE][vocab], their logits. */
static int run_steps(iflow_model *m, int graphs, float *out)
{
    int V = iflow_model_hparams(m)->vocab_size, rc;
    iflow_kv *kv = NULL;
    iflow_ctx *c = NULL;
    if ((rc = iflow_kv_open(&kv, m, IFK_KV_F32, 64, 2)) == 0 && (rc = iflow_ctx_open_steps(&c, m, 1)) == 0) {
        iflow_ctx_set_graphs(c, graphs);
        const int32_t t0[1] = {0}, t1[1] = {1};
        int32_t next[2];
        iflow_step_seq q[2] = {{.ids = prompt, .n = N_PROMPT, .pos0 = 0, .table = t0, .next = &next[0]},
                               {.ids = prompt + 1, .n = N_PROMPT - 1, .pos0 = 0, .table = t1, .next = &next[1]}};
        rc = iflow_ctx_step(c, kv, q, 2);
        for (int s = 0; s < N_DECODE && rc == 0; s++) {
            for (int i = 0; i < 2; i++) {
                q[i].pos0 += q[i].n;
                q[i].ids = &next[i];
                q[i].n = 1;
                q[i].next = NULL;
                q[i].logits = out + (size_t)(2 * s + i) * V;
            }
            rc = iflow_ctx_step(c, kv, q, 2);
            for (int i = 0; i < 2 && rc == 0; i++)
                next[i] = iflow_argmax(q[i].logits, V);
        }
    }
    iflow_ctx_close(c);
    iflow_kv_close(kv);
    return rc;
}

/* The recorded path (forward.c, "steps recorded as one graph") on the detached device. */
static void test_recorded_steps(void)
{
    iflow_model *m;
    int n_ref, n;
    CHECK(iflow_model_open(&m, s_q4, 0) == 0, "open: %s", iflow_errmsg());
    float *ref = run_model(m, &n_ref);
    iflow_device *det = open_detached("det:0", 1);
    detached_ops.record_begin = rec_begin;
    detached_ops.record_end = rec_end;
    detached_ops.record_abort = rec_abort;
    int layers[5];
    iflow_placement p;
    iflow_placement_first_n(&p, layers, 5, det, 5, NULL);
    int rc = iflow_model_place(m, &p, 64);
    CHECK(rc == 0, "place: %s", iflow_errmsg());
    run_graphs = 1;
    for (rec_refuse = 0; rec_refuse <= 1 && rc == 0; rec_refuse++) {
        rec_begins = rec_ends = rec_aborts = 0;
        float *got = run_model(m, &n);
        CHECK(got && n == n_ref && bit_identical(got, ref, n), "recorded steps (%s): bit-identical",
              rec_refuse ? "refused" : "taken");
        /* the decode steps are recorded, the prefill is not */
        CHECK(rec_begins == N_DECODE && rec_ends == (rec_refuse ? 0 : N_DECODE) && rec_aborts == 0,
              "%d recordings begun, %d ended, %d aborted (%d decode steps)", rec_begins, rec_ends, rec_aborts,
              N_DECODE);
        free(got);
    }
    /* steps of several sequences (the batch engine's) */
    int V = iflow_model_hparams(m)->vocab_size;
    float *a = calloc((size_t)2 * N_DECODE * V, sizeof(float)), *b = calloc((size_t)2 * N_DECODE * V, sizeof(float));
    rec_refuse = 0;
    rec_begins = rec_ends = 0;
    CHECK(rc == 0 && run_steps(m, 0, a) == 0 && rec_begins == 0, "two sequences op by op: %s", iflow_errmsg());
    CHECK(rc == 0 && run_steps(m, 1, b) == 0, "two sequences recorded: %s", iflow_errmsg());
    CHECK(rec_ends == N_DECODE, "%d of %d two-sequence decode steps recorded", rec_ends, N_DECODE);
    CHECK(bit_identical(a, b, 2 * N_DECODE * V), "two sequences: recorded steps give the same logits");
    free(a);
    free(b);
    /* IFLOW_GRAPHS_REPLAY: one-token steps of one sequence go through record_at (replay asked
     * first), at their positions, under one key; steps of two sequences run op by op */
    detached_ops.record_at = rec_at;
    detached_ops.replay = rec_replay;
    run_graphs = IFLOW_GRAPHS_REPLAY;
    rec_begins = rec_ends = rec_aborts = rec_ats = rec_replays = rec_keys_differ = 0;
    float *got = run_model(m, &n);
    CHECK(got && n == n_ref && bit_identical(got, ref, n), "replayable steps: bit-identical");
    free(got);
    CHECK(rec_ats == N_DECODE && rec_replays == N_DECODE && rec_ends == N_DECODE && rec_begins == 0,
          "replay mode: %d record_at, %d replays asked, %d ended, %d plain recordings (%d steps)", rec_ats,
          rec_replays, rec_ends, rec_begins, N_DECODE);
    int at_ok = rec_at_max == 64;
    for (int s = 0; s < N_DECODE && s < 16; s++)
        at_ok &= rec_at_pos[s] == N_PROMPT + s;
    CHECK(at_ok && rec_keys_differ == 0, "replay mode: positions %d.., at most %d, %d key changes", rec_at_pos[0],
          rec_at_max, rec_keys_differ);
    a = calloc((size_t)2 * N_DECODE * V, sizeof(float));
    rec_ats = rec_begins = 0;
    CHECK(run_steps(m, IFLOW_GRAPHS_REPLAY, a) == 0 && rec_ats == 0 && rec_begins == 0,
          "replay mode, two sequences: op by op (%d, %d recordings)", rec_ats, rec_begins);
    free(a);
    detached_ops.record_at = NULL;
    detached_ops.replay = NULL;

    /* argmax steps too; after 8 refusals in a row the context stops recording */
    iflow_ctx *c;
    if (rc == 0 && iflow_ctx_open(&c, m, 64, 1) == 0) {
        iflow_ctx_set_graphs(c, 1);
        rec_refuse = 1;
        rec_begins = 0;
        int32_t next = 0;
        CHECK(iflow_ctx_eval(c, prompt, N_PROMPT, NULL, 0) == 0, "prefill: %s", iflow_errmsg());
        for (int i = 0; i < 12; i++) {
            int32_t id = next;
            CHECK(iflow_ctx_eval_argmax(c, &id, 1, &next) == 0, "argmax step %d: %s", i, iflow_errmsg());
        }
        CHECK(rec_begins == 8, "recording asked %d times in 12 refused steps (8, then no more)", rec_begins);
        iflow_ctx_close(c);
    }
    run_graphs = 0;
    rec_refuse = 0;
    iflow_model_close(m);
    iflow_device_close(det);
    free(ref);
}

static void test_place_errors(void)
{
    iflow_model *m;
    CHECK(iflow_model_open(&m, s_q4, 0) == 0, "open: %s", iflow_errmsg());
    iflow_device *det = open_detached("det:0", 1);
    int layers[5] = {0, 0, 0, 0, 7};
    iflow_placement p = {.n_devices = 1, .devices = {det}, .layer_device = layers, .output_device = 0};
    int rc = iflow_model_place(m, &p, 64);
    CHECK_ERR(rc, IFLOW_EINVAL, "layer 4", "device 7");
    layers[4] = 0;
    p.output_device = 3;
    rc = iflow_model_place(m, &p, 64);
    CHECK_ERR(rc, IFLOW_EINVAL, "output device 3", "1 devices");
    p.output_device = 0;

    /* a type the device lacks: named with the tensor, before anything is copied */
    detached_refuses = IFLOW_DT_Q4_B64;
    detached_allocs = 0;
    rc = iflow_model_place(m, &p, 64);
    CHECK_ERR(rc, IFLOW_EUNSUPPORTED, "blk.0.wq", "q4_b64");
    CHECK(strstr(iflow_errmsg(), "det:0") != NULL, "names the device: %s", iflow_errmsg());
    CHECK(detached_allocs == 0, "nothing copied");
    detached_refuses = -1;

    /* too little memory: the device, the bytes missing, before anything is copied */
    iflow_device_bytes need[IFLOW_MAX_DEVICES];
    CHECK(iflow_placement_bytes(m, &p, 64, need) == 0, "bytes: %s", iflow_errmsg());
    uint64_t total = need[0].weights + need[0].kv + need[0].scratch;
    const iflow_hparams *hp = iflow_model_hparams(m);
    uint64_t kv = 2ull * 64 * hp->n_layers * hp->n_kv_heads * hp->head_dim * sizeof(float);
    CHECK(need[0].kv == kv, "kv bytes %llu, want %llu", (unsigned long long)need[0].kv, (unsigned long long)kv);
    CHECK(need[0].weights > iflow_model_decode_bytes(m) / 2, "weights counted: %llu", (unsigned long long)need[0].weights);
    detached_free = total - 1000;
    rc = iflow_model_place(m, &p, 64);
    CHECK_ERR(rc, IFLOW_ENOMEM, "det:0", "lacks 1000 bytes");
    CHECK(detached_allocs == 0, "nothing copied");
    detached_free = total;
    CHECK(iflow_model_place(m, &p, 64) == 0, "exactly enough memory fits: %s", iflow_errmsg());
    detached_free = 0;

    /* a failed placement leaves the previous one working */
    layers[0] = 5;
    rc = iflow_model_place(m, &p, 64);
    CHECK(rc == IFLOW_EINVAL, "bad placement refused");
    iflow_ctx *c;
    int32_t next;
    CHECK(iflow_ctx_open(&c, m, 16, 1) == 0 && iflow_ctx_eval_argmax(c, prompt, 4, &next) == 0, "still runs: %s",
          iflow_errmsg());
    iflow_ctx_close(c);
    iflow_model_close(m);
    iflow_device_close(det);
}

/* ---- a plan's processes on detached devices (comm.h's one process per device, as threads) ---- */

/* Greedy steps of the prompt on a model placed as it is (a plan's whole model here, or process
 * `comm` of one): out [N_PROMPT + N_DECODE][vocab], gen [N_DECODE]. */
static int run_plan_steps(iflow_model *m, iflow_comm *comm, float *out, int32_t *gen)
{
    iflow_ctx *c = NULL;
    iflow_kv *kv = NULL;
    int rc = iflow_ctx_open_steps(&c, m, 1);
    if (rc == 0)
        rc = iflow_kv_open(&kv, m, IFK_KV_F32, 64, 1);
    if (rc == 0 && comm)
        rc = iflow_ctx_set_comm(c, comm);
    if (rc == 0)
        rc = test_generate_steps(c, kv, prompt, N_PROMPT, N_DECODE, iflow_model_hparams(m)->vocab_size, out, gen);
    iflow_kv_close(kv);
    iflow_ctx_close(c);
    return rc;
}

/* A layer plan and a tensor plan over two detached devices, run as two processes (threads over
 * iflow_comm_local_open): every process's logits and tokens are those of the same plan in one
 * process, bit for bit. The processes take the GPU's paths of the several-process forward pass:
 * the state sent from device memory, partial outputs downloaded for the all-reduce, the logits
 * downloaded on the output device's process and broadcast. */
static void test_processes_detached(void)
{
    static const char *const plans[] = {
        "[plan]\nstrategy = layer\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\noutput = cpu:1\n"
        "[device cpu:0]\nlayers = 0-2\n[device cpu:1]\nlayers = 3-4\n",
        "[plan]\nstrategy = tensor\nlayers = 5\nheads = 8\nkv_heads = 4\nffn = 172\noutput = cpu:0\n"
        "[device cpu:0]\nheads = 0-3\nffn = 0-85\n[device cpu:1]\nheads = 4-7\nffn = 86-171\n",
    };
    char path[600];
    snprintf(path, sizeof path, "%s/procs.ini", dir);
    for (size_t k = 0; k < sizeof plans / sizeof plans[0]; k++) {
        test_write_file(path, plans[k], strlen(plans[k]));
        iflow_model *m = NULL;
        iflow_plan plan;
        iflow_device *det[2] = {open_detached("det:0", 1), open_detached("det:1", 1)};
        CHECK(iflow_plan_load(&plan, path) == 0 && iflow_model_open(&m, s_f32, 0) == 0 &&
                  iflow_model_place_plan(m, &plan, det, 64) == 0, "plan %zu in one process: %s", k, iflow_errmsg());
        const int V = iflow_model_hparams(m)->vocab_size;
        const size_t n = (size_t)(N_PROMPT + N_DECODE) * V;
        float *ref = calloc(n, sizeof(float));
        int32_t ref_gen[N_DECODE] = {0};
        CHECK(run_plan_steps(m, NULL, ref, ref_gen) == 0, "plan %zu in one process: %s", k, iflow_errmsg());
        iflow_model_close(m);
        test_process procs[2];
        int32_t gens[2][N_DECODE];
        for (int r = 0; r < 2; r++)
            procs[r] = (test_process){.model = s_f32, .plan = path, .dev = det[r], .prompt = prompt, .np = N_PROMPT,
                                      .n_gen = N_DECODE, .out = calloc(n, sizeof(float)), .gen = gens[r]};
        test_run_processes(procs, 2);
        for (int r = 0; r < 2; r++) {
            CHECK(procs[r].rc == 0, "plan %zu, process %d: %s", k, r, procs[r].err);
            CHECK(bit_identical(procs[r].out, ref, (int)n) && memcmp(gens[r], ref_gen, sizeof ref_gen) == 0,
                  "plan %zu, process %d on its detached device: the logits and tokens of the plan in one process", k,
                  r);
            free(procs[r].out);
        }
        for (int r = 0; r < 2; r++)
            iflow_device_close(det[r]);
        free(ref);
    }
}

/* ---- the CPU device's row-wise and element-wise ops over threads ---- */

static void fill_rand(float *v, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = (float)((int32_t)(seed >> 8) % 20000) / 5000.0f;
    }
}

/* One op on the 1-thread device and on the split one (an in-place op on its own copy of y);
 * every element must be the same bits. */
static void ops_case(iflow_device *one, iflow_device *many, const char *what, int op, size_t n_y, uint32_t seed,
                     int late)
{
    enum { T = 40, DIM = 1000, HEADS = 12, HD = 80, LD = 1003 };
    float *y1 = malloc(n_y * sizeof *y1), *y2 = malloc(n_y * sizeof *y2), *x = malloc(n_y * sizeof *x);
    float *w = malloc(DIM * sizeof *w);
    fill_rand(y1, n_y, seed);
    memcpy(y2, y1, n_y * sizeof *y1);
    fill_rand(x, n_y, seed + 1);
    fill_rand(w, DIM, seed + 2);
    const float fs[HD / 2] = {1.0f, 0.5f, 0.25f};
    long taken = ifk_pool_taken_back();
    for (int k = 0; k < 2; k++) {
        iflow_device *d = k ? many : one;
        iflow_cpu_span_reset();
        float *y = k ? y2 : y1;
        switch (op) {
        case 0: d->ops->rmsnorm(d, y, x, w, T, DIM, 1e-5f); break;          /* y from x */
        case 1: d->ops->rmsnorm(d, y, y, w, T, DIM, 1e-5f); break;          /* in place */
        case 2: d->ops->rope(d, y, LD, T, HEADS, HD, HD, 7, 10000.0f, NULL, IFK_ROPE_HALF); break;
        case 3: d->ops->rope(d, y, LD, T, HEADS, HD, 64, 3, 500000.0f, fs, IFK_ROPE_INTERLEAVED); break;
        case 4: d->ops->silu_mul(d, y, x, n_y); break;
        case 5: d->ops->add(d, y, x, n_y); break;
        }
    }
    iflow_cpu_span_reset();
    size_t bad = 0;
    for (size_t i = 0; i < n_y; i++)
        bad += memcmp(&y1[i], &y2[i], sizeof *y1) != 0;
    CHECK(bad == 0, "%s over threads: %zu of %zu elements differ from one thread's", what, bad, n_y);
    if (late)
        CHECK(ifk_pool_taken_back() > taken, "%s: the late worker's piece was not taken back", what);
    ifk_pool_quiesce(); /* a late worker may still read them */
    free(y1), free(y2), free(x), free(w);
}

static void test_ops_threads(void)
{
    iflow_device *one, *many;
    CHECK(iflow_device_open(&one, "cpu", 1) == 0 && iflow_device_open(&many, "cpu", 3) == 0, "cpu devices open");
    for (int late = 0; late <= 1; late++) {
        ifk_pool_test_delay(late ? 30000 : 0); /* a worker's first piece comes 30 ms late: taken back (2 ms was not
                                                * enough on a loaded machine: the submitter itself was descheduled) */
        ops_case(one, many, "rmsnorm", 0, 40 * 1000, 11, late);
        ops_case(one, many, "rmsnorm in place", 1, 40 * 1000, 12, late);
        ops_case(one, many, "rope, half layout", 2, 40 * 1003, 13, late);
        ops_case(one, many, "rope, interleaved, partial, scaled", 3, 40 * 1003, 14, late);
        ops_case(one, many, "silu_mul", 4, 70001, 15, late);
        ops_case(one, many, "add", 5, 50003, 16, late);
    }
    ifk_pool_test_delay(0);
    float v = 1.0f, u = 2.0f; /* nothing to do: nothing done */
    many->ops->rmsnorm(many, &v, &u, &u, 0, 1, 1e-5f);
    many->ops->rmsnorm(many, &v, &u, &u, 3, 0, 1e-5f);
    many->ops->silu_mul(many, &v, &u, 0);
    many->ops->add(many, &v, &u, 0);
    many->ops->rope(many, &v, 1, 0, 1, 2, 2, 0, 10000.0f, NULL, IFK_ROPE_HALF);
    CHECK(v == 1.0f, "an op over no rows or elements changed its output");
    iflow_device_close(one);
    iflow_device_close(many);
}

/* ---- the CPU device's paged attention over threads ---- */

enum { AT_NKV = 4, AT_NH = 32, AT_HD = 64, AT_N = 1500 }; /* TinyLlama's heads, 3 parts of keys */
typedef struct {
    iflow_device *d;
    const ifk_kv_layout *L;
    const void *k, *v;
    const float *q;
    const int32_t *table;
    float out[AT_NH * AT_HD];
} attend_job;

static void *attend_one(void *arg)
{
    attend_job *j = arg;
    ifk_kv_seq seq = {.row0 = 0, .n_rows = 1, .pos0 = AT_N - 1, .table = j->table};
    j->d->ops->attention_paged(j->d, j->out, j->q, AT_NH * AT_HD, j->k, j->v, j->L, &seq, 1, AT_NH, 0.125f);
    return NULL;
}

static void test_attention_threads(void)
{
    const int KV = AT_NKV * AT_HD;
    ifk_kv_layout L = {.type = IFK_KV_F16, .block = 16, .n_kv_heads = AT_NKV, .head_dim = AT_HD, .group = 32,
                       .n_blocks = (AT_N + 15) / 16};
    void *k = calloc(1, ifk_kv_pool_bytes(&L)), *v = calloc(1, ifk_kv_pool_bytes(&L));
    int32_t table[(AT_N + 15) / 16];
    for (int b = 0; b < (AT_N + 15) / 16; b++)
        table[b] = b;
    float *x = malloc(sizeof(float) * AT_N * KV), q[AT_NH * AT_HD];
    ifk_kv_seq all = {.row0 = 0, .n_rows = AT_N, .pos0 = 0, .table = table};
    fill_rand(x, (size_t)AT_N * KV, 21);
    ifk_kv_store(k, &L, &all, 1, x, KV, 1);
    fill_rand(x, (size_t)AT_N * KV, 22);
    ifk_kv_store(v, &L, &all, 1, x, KV, 1);
    fill_rand(q, AT_NH * AT_HD, 23);
    iflow_device *one, *many;
    CHECK(iflow_device_open(&one, "cpu", 1) == 0 && iflow_device_open(&many, "cpu", 3) == 0, "cpu devices open");
    ifk_kv_seq seq = {.row0 = 0, .n_rows = 1, .pos0 = AT_N - 1, .table = table};
    CHECK(ifk_attention_work(&L, &seq, 1, AT_NH, 3) > 0, "a decoding row over 3 parts at 3 threads asks for work");
    attend_job ref = {.d = one, .L = &L, .k = k, .v = v, .q = q, .table = table}, main_job = ref, th[2] = {ref, ref};
    main_job.d = th[0].d = th[1].d = many;
    attend_one(&ref);
    attend_one(&main_job);
    CHECK(memcmp(ref.out, main_job.out, sizeof ref.out) == 0, "attention at 3 threads = at 1");
    pthread_t t[2];
    int started[2];
    for (int i = 0; i < 2; i++)
        started[i] = pthread_create(&t[i], NULL, attend_one, &th[i]) == 0;
    for (int i = 0; i < 2; i++) {
        if (started[i])
            pthread_join(t[i], NULL);
        CHECK(started[i] && memcmp(ref.out, th[i].out, sizeof ref.out) == 0,
              "attention at 3 threads from thread %d of 2 = at 1", i);
    }
    iflow_device_close(one);
    iflow_device_close(many);
    free(x), free(k), free(v);
}

int main(void)
{
    if (!mkdtemp(dir))
        return perror("mkdtemp"), 1;
    snprintf(s_f32, sizeof s_f32, "%s/s.ifs", dir);
    snprintf(s_q4, sizeof s_q4, "%s/s.q4.ifs", dir);
    iflow_quant_policy qp;
    int qrc = -1;
    if (test_convert("models/stories260K/hf", s_f32, -1) == 0 && iflow_quant_policy_init(&qp, IFLOW_DT_Q4_B64) == 0) {
        qrc = iflow_quantize_shard(s_f32, s_q4, &qp, 0, NULL);
        CHECK(qrc == 0, "quantize: %s", iflow_errmsg());
        iflow_quant_policy_free(&qp);
    }
    if (qrc) {
        fprintf(stderr, "test data missing or conversion failed\n");
        return check_summary("test_device") | 1;
    }
    RUN(test_names_and_list);
    RUN(test_layer_split_identical);
    RUN(test_detached_identical);
    RUN(test_pass_rows);
    RUN(test_recorded_steps);
    RUN(test_processes_detached);
    RUN(test_place_errors);
    RUN(test_ops_threads);
    RUN(test_attention_threads);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_device");
}
