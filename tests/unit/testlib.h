/* testlib.h -- unit-test helpers that use libiflow's internal headers: test_convert() for a
 * model of the shared test data (specs from ./specs), test_ids() for a JSON array of token
 * ids, test_generate_steps() for greedy steps, test_run_processes() for a plan's processes as
 * threads, test_greedy_match() against golden tokens, test_same_tensors() to compare two shards'
 * tensors byte for byte. (CHECK_ERR() is check.h's.) */
#ifndef IFLOW_TESTLIB_H
#define IFLOW_TESTLIB_H

#include "check.h"
#include "libcore/formats/convert.h"
#include "libcore/base/error.h"
#include "libcore/engine/comm.h"
#include "libcore/engine/model.h"
#include "libcore/engine/plan.h"
#include "libcore/engine/sampler.h"
#include "kernels/cpu/kvcache.h"
#include "libcore/formats/shard.h"

#include <jansson.h>
#include <pthread.h>

/* Convert $IFLOW_TEST_DATA/rel to `out` with matrices of type dtype (-1: keep). 0, or <0 with a
 * failed check (-1 when the test data is missing). */
static inline int test_convert(const char *rel, const char *out, int dtype)
{
    const char *specs[] = {"specs"};
    iflow_convert_opts o = {.dtype = dtype, .spec_dirs = specs, .n_spec_dirs = 1};
    const char *src = test_data(rel);
    if (!src)
        return -1;
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", src);
    int rc = iflow_convert(copy, out, &o);
    CHECK(rc == 0, "convert %s: %s", rel, iflow_errmsg());
    return rc;
}

/* A JSON array of integers as token ids (malloc'd; *n of them). */
static inline int32_t *test_ids(const json_t *a, size_t *n)
{
    *n = json_array_size(a);
    int32_t *ids = malloc(sizeof(int32_t) * (*n ? *n : 1));
    for (size_t i = 0; i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return ids;
}

/* Greedy generation by iflow_ctx_step over kv (one block covering every position): the logits
 * after each prompt token and after each of n_gen generated tokens into out ([np + n_gen][V]),
 * the generated ids (each the argmax of the logits before it) into gen. As a context of a plan's
 * processes runs (iflow_ctx_set_comm: steps only). */
static inline int test_generate_steps(iflow_ctx *c, iflow_kv *kv, const int32_t *prompt, int np, int n_gen, int V,
                                      float *out, int32_t *gen)
{
    const int32_t table[1] = {0};
    iflow_step_seq q = {.ids = prompt, .n = np, .pos0 = 0, .table = table, .logits = out, .n_out = np};
    int rc = iflow_ctx_step(c, kv, &q, 1);
    for (int s = 0; s < n_gen && rc == 0; s++) {
        gen[s] = iflow_argmax(out + (size_t)(np - 1 + s) * V, V);
        q = (iflow_step_seq){.ids = &gen[s], .n = 1, .pos0 = np + s, .table = table, .logits = out + (size_t)(np + s) * V};
        rc = iflow_ctx_step(c, kv, &q, 1);
    }
    return rc;
}

/* One process of a plan (comm.h), played by a thread: the model opened for its plan device
 * (iflow_model_open_device: of a split directory, its own file only), placed by the plan on its
 * device, generating greedily by steps with the others (test_generate_steps), or (eval)
 * evaluating the prompt with iflow_ctx_eval. */
typedef struct {
    iflow_comm *comm;
    const char *model;          /* a shard, or a split directory                            */
    const char *plan;           /* a plan file, or NULL: the split's own                    */
    iflow_device *dev;          /* this process's device, or NULL: its plan device opened   */
    const int32_t *prompt;
    int np, n_gen;
    float *out;                 /* [np + n_gen][vocab]                                      */
    int32_t *gen;               /* [n_gen]                                                  */
    int eval;                   /* instead: iflow_ctx_eval of the prompt, its logits in out [np][vocab] */
    int rc;
    char err[512];
} test_process;

static inline void *test_process_run(void *arg)
{
    test_process *j = arg;
    const int me = j->comm->rank, n_ctx = j->np + j->n_gen + 1;
    iflow_model *m = NULL;
    iflow_ctx *c = NULL;
    iflow_kv *kv = NULL;
    iflow_device *devs[IFLOW_PLAN_MAX_DEVICES] = {0};
    iflow_plan plan = {0};
    int rc = iflow_model_open_device(&m, j->model, 0, me), opened = 0;
    if (rc == 0 && j->plan)
        rc = iflow_plan_load(&plan, j->plan);
    else if (rc == 0)
        plan = *iflow_model_split_plan(m);
    if (rc == 0 && j->dev)
        devs[me] = j->dev;
    else if (rc == 0)
        opened = (rc = iflow_plan_open_devices(&plan, me, devs)) == 0;
    if (rc == 0)
        rc = iflow_model_place_plan(m, &plan, devs, n_ctx);
    if (rc == 0 && j->eval) { /* a context with its own cache, evaluated as one process of several */
        if ((rc = iflow_ctx_open(&c, m, n_ctx, 1)) == 0 && (rc = iflow_ctx_set_comm(c, j->comm)) == 0)
            rc = iflow_ctx_eval(c, j->prompt, j->np, j->out, 1);
    } else if (rc == 0) {
        rc = iflow_ctx_open_steps(&c, m, 1);
        if (rc == 0)
            rc = iflow_kv_open(&kv, m, IFK_KV_F32, n_ctx, 1);
        if (rc == 0)
            rc = iflow_ctx_set_comm(c, j->comm);
        if (rc == 0)
            rc = test_generate_steps(c, kv, j->prompt, j->np, j->n_gen, iflow_model_hparams(m)->vocab_size, j->out,
                                     j->gen);
    }
    if ((j->rc = rc) < 0)
        snprintf(j->err, sizeof j->err, "%s", iflow_errmsg());
    iflow_kv_close(kv);
    iflow_ctx_close(c);
    iflow_model_close(m);
    if (opened)
        iflow_plan_close_devices(&plan, devs);
    return NULL;
}

/* Run procs[0 .. n) as the ranks of one plan (threads over iflow_comm_local_open); each job's
 * comm is set here. 0, or -1 when the threads could not start (checked). */
static inline int test_run_processes(test_process *procs, int n)
{
    iflow_comm *comms[IFLOW_PLAN_MAX_DEVICES];
    pthread_t th[IFLOW_PLAN_MAX_DEVICES];
    int started = 0;
    if (iflow_comm_local_open(comms, n) < 0) {
        CHECK(0, "local comm: %s", iflow_errmsg());
        return -1;
    }
    for (int r = 0; r < n; r++)
        procs[r].comm = comms[r];
    for (int r = 0; r < n; r++)
        started += pthread_create(&th[r], NULL, test_process_run, &procs[r]) == 0;
    CHECK(started == n, "%d of %d process threads started", started, n);
    for (int r = 0; r < started; r++) /* (a missing thread leaves the others waiting: not here) */
        pthread_join(th[r], NULL);
    iflow_comm_local_close(comms, n);
    return started == n ? 0 : -1;
}

/* Greedy continuation of prompt ids; returns how many of `want` match in order (-1 when the
 * context cannot be opened or the prompt evaluated). */
static inline int test_greedy_match(iflow_model *m, int threads, const int32_t *prompt, size_t n_prompt,
                                    const int32_t *want, size_t n_want)
{
    iflow_ctx *c;
    int vocab = iflow_model_hparams(m)->vocab_size, matched = 0;
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    if (iflow_ctx_open(&c, m, (int)(n_prompt + n_want + 1), threads) < 0) {
        free(logits);
        return -1;
    }
    if (iflow_ctx_eval(c, prompt, (int)n_prompt, logits, 0) < 0)
        matched = -1;
    for (size_t i = 0; matched >= 0 && i < n_want; i++) {
        int32_t next = iflow_argmax(logits, vocab);
        if (next != want[i])
            break;
        matched++;
        if (iflow_ctx_eval(c, &next, 1, logits, 0) < 0)
            break;
    }
    iflow_ctx_close(c);
    free(logits);
    return matched;
}

/* Every tensor of shard a is in shard b with the same type, shape and bytes: how many there
 * are, or -1 when one differs (named on stderr) or a shard cannot be opened. *n_b, when not
 * NULL, receives b's tensor count. */
static inline int test_same_tensors(const char *a, const char *b, int *n_b)
{
    iflow_shard *sa, *sb;
    if (iflow_shard_open(&sa, a, 0) < 0)
        return -1;
    if (iflow_shard_open(&sb, b, 0) < 0) {
        iflow_shard_close(sa);
        return -1;
    }
    int n = 0, nb = 0, bad = 0;
    for (size_t i = 0; i < iflow_shard_n_records(sa); i++) {
        const iflow_shard_rec *r = iflow_shard_rec_at(sa, i), *q = iflow_shard_find(sb, r->name);
        if (r->kind != IFLOW_REC_TENSOR)
            continue;
        n++;
        if (!q || q->dtype != r->dtype || q->nbytes != r->nbytes || memcmp(q->data, r->data, r->nbytes)) {
            bad++;
            fprintf(stderr, "  tensor %s differs\n", r->name);
        }
    }
    for (size_t i = 0; i < iflow_shard_n_records(sb); i++)
        nb += iflow_shard_rec_at(sb, i)->kind == IFLOW_REC_TENSOR;
    iflow_shard_close(sa);
    iflow_shard_close(sb);
    if (n_b)
        *n_b = nb;
    return bad ? -1 : n;
}

#endif
