/*
 * metrics.h -- what a batch run reports: throughput, latency distributions, occupancy.
 *
 * Contract
 *   An iflow_metrics collects finished results (iflow_metrics_add) and errors; the batch's
 *   counters (iflow_batch_stats) come in at the end. iflow_metrics_json() builds the report,
 *   one JSON object, the same for iflow-run --metrics and the benchmarks:
 *     requests, errors, wall_s, requests_per_s, prompt_tokens, prompt_tokens_cached (of
 *     those, the ones taken from the prefix cache instead of evaluated), generated_tokens,
 *     generated_tokens_per_s, ttft_ms and token_latency_ms ({mean, p50, p90, p99}), parallel,
 *     steps, tokens_per_step, batch_occupancy (mean running / parallel), kv_blocks {type,
 *     block_positions, block_bytes, blocks_total, blocks_peak, blocks_idle (cached, held by
 *     no request, at the end)}.
 *   Time to first token runs from iflow_batch_add() to the first generated token; token
 *   latency is (t_done - t_first) / (tokens - 1) per request. Percentiles are nearest-rank.
 *   Memory: two doubles per request.
 */
#ifndef IFLOW_METRICS_H
#define IFLOW_METRICS_H

#include <jansson.h>

#include "libcore/serving/batch.h"

typedef struct {
    double *ttft, *tpot;           /* [n_ok] seconds (tpot NAN for single-token results) */
    long n_ok, n_err, cap;
    uint64_t gen_tokens, prompt_tokens;
} iflow_metrics;

/* 0, or IFLOW_ENOMEM (the result is then not counted). */
int  iflow_metrics_add(iflow_metrics *m, const iflow_result *r);
void iflow_metrics_add_error(iflow_metrics *m);
void iflow_metrics_free(iflow_metrics *m);
/* The report for a batch run of `wall` seconds (new reference; NULL when out of memory). */
json_t *iflow_metrics_json(iflow_metrics *m, const iflow_model *model, const iflow_batch *b, double wall);

#endif
