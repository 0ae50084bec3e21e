/* metrics.c -- a batch run's report. See metrics.h. */
#include "libcore/serving/metrics.h"
#include "libcore/base/error.h"
#include "kernels/cpu/kvcache.h"

#include <math.h>
#include <stdlib.h>

int iflow_metrics_add(iflow_metrics *m, const iflow_result *r)
{
    if (m->n_ok == m->cap) {
        long cap = m->cap ? 2 * m->cap : 1024;
        double *a = realloc(m->ttft, (size_t)cap * sizeof *a);
        if (a)
            m->ttft = a;
        double *b = a ? realloc(m->tpot, (size_t)cap * sizeof *b) : NULL;
        if (!b)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        m->tpot = b;
        m->cap = cap;
    }
    m->ttft[m->n_ok] = r->t_first - r->t_added;
    m->tpot[m->n_ok] = r->n_tokens > 1 ? (r->t_done - r->t_first) / (r->n_tokens - 1) : NAN;
    m->n_ok++;
    m->gen_tokens += (uint64_t)r->n_tokens;
    m->prompt_tokens += (uint64_t)r->n_prompt;
    return 0;
}

void iflow_metrics_add_error(iflow_metrics *m) { m->n_err++; }

void iflow_metrics_free(iflow_metrics *m)
{
    free(m->ttft);
    free(m->tpot);
    *m = (iflow_metrics){0};
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* x rounded to `digits` decimals. */
static json_t *real(double x, int digits)
{
    double s = pow(10, digits);
    return json_real(round(x * s) / s);
}

/* {mean, p50, p90, p99} in milliseconds of the finite values of v[0..n) (sorted in place). */
static json_t *dist_json(double *v, long n)
{
    long k = 0;
    for (long i = 0; i < n; i++)
        if (isfinite(v[i]))
            v[k++] = v[i];
    json_t *o = json_object();
    if (k == 0)
        return o;
    qsort(v, (size_t)k, sizeof *v, cmp_double);
    double sum = 0;
    for (long i = 0; i < k; i++)
        sum += v[i];
    static const double p[] = {0.5, 0.9, 0.99};
    static const char *const names[] = {"p50", "p90", "p99"};
    json_object_set_new(o, "mean", real(sum / k * 1e3, 3));
    for (int i = 0; i < 3; i++) {
        long at = (long)ceil(p[i] * k) - 1;
        json_object_set_new(o, names[i], real(v[at < 0 ? 0 : at] * 1e3, 3));
    }
    return o;
}

json_t *iflow_metrics_json(iflow_metrics *m, const iflow_model *model, const iflow_batch *b, double wall)
{
    const iflow_batch_params *p = iflow_batch_params_of(b);
    iflow_batch_stats st;
    iflow_batch_get_stats(b, &st);
    json_t *js = json_object(), *kv = json_object();
    if (!js || !kv)
        return json_decref(js), json_decref(kv), NULL;
    json_object_set_new(js, "requests", json_integer(m->n_ok));
    json_object_set_new(js, "errors", json_integer(m->n_err));
    json_object_set_new(js, "wall_s", real(wall, 3));
    json_object_set_new(js, "requests_per_s", real(wall > 0 ? m->n_ok / wall : 0, 3));
    json_object_set_new(js, "prompt_tokens", json_integer((json_int_t)m->prompt_tokens));
    json_object_set_new(js, "prompt_tokens_cached", json_integer((json_int_t)st.prompt_cached));
    json_object_set_new(js, "generated_tokens", json_integer((json_int_t)m->gen_tokens));
    json_object_set_new(js, "generated_tokens_per_s", real(wall > 0 ? (double)m->gen_tokens / wall : 0, 2));
    json_object_set_new(js, "ttft_ms", dist_json(m->ttft, m->n_ok));
    json_object_set_new(js, "token_latency_ms", dist_json(m->tpot, m->n_ok));
    json_object_set_new(js, "parallel", json_integer(p->parallel));
    json_object_set_new(js, "steps", json_integer((json_int_t)st.steps));
    json_object_set_new(js, "tokens_per_step", real(st.steps ? (double)st.step_tokens / st.steps : 0, 3));
    json_object_set_new(js, "batch_occupancy", real(st.steps ? (double)st.running_sum / st.steps / p->parallel : 0, 4));
    json_object_set_new(kv, "type", json_string(ifk_kv_type_name(p->kv_type)));
    json_object_set_new(kv, "block_positions", json_integer(p->block));
    json_object_set_new(kv, "block_bytes", json_integer((json_int_t)iflow_batch_block_bytes(model, p->kv_type, p->block)));
    json_object_set_new(kv, "blocks_total", json_integer(st.blocks_total));
    json_object_set_new(kv, "blocks_peak", json_integer(st.blocks_peak));
    json_object_set_new(kv, "blocks_idle", json_integer(st.blocks_idle));
    json_object_set_new(js, "kv_blocks", kv);
    if (st.drafted) /* speculative decoding */
        json_object_set_new(js, "draft", json_pack("{s:I, s:I, s:o}", "proposed", (json_int_t)st.drafted, "accepted",
                                                   (json_int_t)st.accepted, "acceptance_rate",
                                                   real((double)st.accepted / (double)st.drafted, 4)));
    return js;
}
