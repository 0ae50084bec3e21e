/* moe.c -- a mixture-of-experts FFN (hparams n_experts: Mixtral, Qwen2-MoE, Qwen3-MoE) for a
 * step's rows, on a device whose memory is the host's. See model_impl.h.
 *
 * For each row x (the FFN's normed input):
 *   p        = softmax(router x)                      router [E][dim], F32
 *   S        = the n_experts_used experts of largest p (ties: the lower index)
 *   g_e      = p_e, or p_e / sum_{S} p (expert_norm)
 *   y        = sum_{e in S} g_e down_e(act(gate_e x) * up_e x)
 *            + [sigmoid(shexp_gate . x)] down(act(gate x) * up x)   (a shared expert)
 * The rows that chose expert e are gathered and go through its matrices together (one matrix
 * product per expert per step, as a prefill's dense FFN), then scattered back with their
 * weights. Every row's result is its own: the kernels are batch-invariant. Each expert's input
 * rows and hidden rows go to the context's observer (observe.h: importance matrices).
 */
#include "model_impl.h"
#include "observe.h"

#include "libcore/base/dtype.h"
#include "libcore/base/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct iflow_moe_scratch {
    int rows;           /* the rows the buffers hold                                */
    float *x;           /* [rows][dim]   the input, copied (the output may alias it) */
    float *h;           /* [rows][dim]   an expert's rows gathered, then its output  */
    float *gate, *up;   /* [rows][max(ffn_dim, expert_ffn_dim)]  hidden              */
    float *logits;      /* [rows][E]     the router's                                */
    float *wt;          /* [rows][used]  each row's experts' weights                 */
    int *sel;           /* [rows][used]  each row's experts                          */
    int *order;         /* [rows][used]  (row, choice) pairs, grouped by expert      */
    int *start;         /* [E + 1]       each expert's first pair in order           */
};

void iflow_moe_scratch_free(iflow_moe_scratch *s)
{
    if (!s)
        return;
    free(s->x), free(s->h), free(s->gate), free(s->up), free(s->logits);
    free(s->wt), free(s->sel), free(s->order), free(s->start);
    free(s);
}

/* *sp holding buffers for T rows (grown). */
static int scratch_rows(const iflow_hparams *hp, iflow_moe_scratch **sp, int T)
{
    iflow_moe_scratch *s = *sp;
    if (s && s->rows >= T)
        return 0;
    iflow_moe_scratch_free(s);
    *sp = s = calloc(1, sizeof *s);
    if (!s)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    const size_t R = (size_t)T, D = (size_t)hp->dim, E = (size_t)hp->n_experts, K = (size_t)hp->n_experts_used,
                 F = (size_t)(hp->shared_ffn_dim > hp->expert_ffn_dim ? hp->shared_ffn_dim : hp->expert_ffn_dim);
    s->x = malloc(R * D * sizeof *s->x);
    s->h = malloc(R * D * sizeof *s->h);
    s->gate = malloc(R * F * sizeof *s->gate);
    s->up = malloc(R * F * sizeof *s->up);
    s->logits = malloc(R * E * sizeof *s->logits);
    s->wt = malloc(R * K * sizeof *s->wt);
    s->sel = malloc(R * K * sizeof *s->sel);
    s->order = malloc(R * K * sizeof *s->order);
    s->start = malloc((E + 1) * sizeof *s->start);
    if (!s->x || !s->h || !s->gate || !s->up || !s->logits || !s->wt || !s->sel || !s->order || !s->start) {
        iflow_moe_scratch_free(s);
        *sp = NULL;
        return iflow_seterr(IFLOW_ENOMEM, "out of memory for a mixture of experts' %d rows", T);
    }
    s->rows = T;
    return 0;
}

/* The index of the largest of v[0..n) not taken (ties: the lower index), or -1. */
static int best_free(const double *v, const unsigned char *taken, int n)
{
    int best = -1;
    for (int e = 0; e < n; e++)
        if (!taken[e] && (best < 0 || v[e] > v[best]))
            best = e;
    return best;
}

/* One row's experts sel[K] and weights wt[K] from its router logits [E] (descending choice order):
 *   scores p = softmax(logits), or sigmoid(logits) with router_sigmoid;
 *   the choice among p + router_bias (DeepSeek-V3's correction; the weights stay p), within the
 *   router_topk_groups groups whose router_group_top best choice scores sum largest
 *   (router_groups > 1; DeepSeek-V3 sums two, V2 takes the best one);
 *   weights p of the chosen, renormalized to sum 1 with expert_norm, times expert_scale. */
static void route_row(const iflow_hparams *hp, const float *logits, const float *bias, int *sel, float *wt)
{
    const int E = hp->n_experts, K = hp->n_experts_used, G = hp->router_groups, per = E / G;
    double p[IFLOW_MAX_EXPERTS], choice[IFLOW_MAX_EXPERTS], max = logits[0], sum = 0, chosen = 0;
    unsigned char taken[IFLOW_MAX_EXPERTS] = {0};
    for (int e = 1; e < E; e++)
        max = logits[e] > max ? logits[e] : max;
    for (int e = 0; e < E; e++)
        sum += p[e] = hp->router_sigmoid ? 1.0 / (1.0 + exp(-(double)logits[e])) : exp((double)logits[e] - max);
    for (int e = 0; e < E; e++) {
        p[e] = hp->router_sigmoid ? p[e] : p[e] / sum;
        choice[e] = p[e] + (bias ? bias[e] : 0.0);
    }
    if (G > 1) { /* groups outside the best router_topk_groups are not chosen from */
        double gs[IFLOW_MAX_EXPERTS];
        unsigned char gtaken[IFLOW_MAX_EXPERTS] = {0};
        for (int g = 0; g < G; g++) { /* a group's score: its router_group_top best choice scores summed */
            unsigned char t2[IFLOW_MAX_EXPERTS] = {0};
            gs[g] = 0;
            for (int k = 0; k < hp->router_group_top && k < per; k++) {
                const int a = best_free(choice + g * per, t2, per);
                t2[a] = 1;
                gs[g] += choice[g * per + a];
            }
        }
        for (int k = 0; k < hp->router_topk_groups; k++)
            gtaken[best_free(gs, gtaken, G)] = 1;
        for (int e = 0; e < E; e++)
            taken[e] = !gtaken[e / per];
    }
    for (int j = 0; j < K; j++) {
        const int best = best_free(choice, taken, E);
        sel[j] = best;
        taken[best] = 1;
        wt[j] = (float)p[best];
        chosen += p[best];
    }
    const double scale = hp->expert_scale > 0 ? hp->expert_scale : 1.0;
    for (int j = 0; j < K; j++)
        wt[j] = (float)((hp->expert_norm ? (double)wt[j] / chosen : (double)wt[j]) * scale);
}

/* The (row, choice) pairs of the T rows grouped by expert, rows ascending within each. */
static void group_pairs(const iflow_hparams *hp, iflow_moe_scratch *s, int T)
{
    const int E = hp->n_experts, K = hp->n_experts_used;
    memset(s->start, 0, (size_t)(E + 1) * sizeof *s->start);
    for (int i = 0; i < T * K; i++)
        s->start[s->sel[i] + 1]++;
    for (int e = 0; e < E; e++)
        s->start[e + 1] += s->start[e];
    int *fill = s->start; /* advanced while filling, then moved back */
    for (int i = 0; i < T * K; i++)
        s->order[fill[s->sel[i]]++] = i;
    for (int e = E; e > 0; e--)
        s->start[e] = s->start[e - 1];
    s->start[0] = 0;
}

/* Where a mixture's FFN runs: the device, the context (its observer) and the layer. */
typedef struct {
    const iflow_hparams *hp;
    iflow_device *d;
    const iflow_ctx *c;
    int layer;
} moe_site;

/* The shared expert (the layer's dense FFN) of the T rows of s->x into out, scaled by its gate. */
static int shared_expert(const moe_site *at, iflow_moe_scratch *s, const layer_weights *w, int T, float *out)
{
    const iflow_hparams *hp = at->hp;
    iflow_device *d = at->d;
    const int D = hp->dim, F = hp->shared_ffn_dim;
    IFLOW_TRY(iflow_ffn_hidden(hp, d, w, s->x, T, F, s->gate, s->up));
    iflow_observe(at->c, at->layer, IFLOW_OBS_FFN_MID, 0, s->gate, (size_t)F, T, F);
    IFLOW_TRY(iflow_linear_rows(d, out, D, w->down, NULL, s->gate, F, T, D, F));
    for (int t = 0; t < T && w->shexp_gate; t++) {
        const float *x = s->x + (size_t)t * D;
        double z = 0;
        for (int i = 0; i < D; i++)
            z += (double)w->shexp_gate[i] * x[i];
        const float g = (float)(1.0 / (1.0 + exp(-z)));
        for (int i = 0; i < D; i++)
            out[(size_t)t * D + i] *= g;
    }
    return 0;
}

/* Expert e over its pairs: gathered, through its FFN, added into out with each pair's weight. */
static int run_expert(const moe_site *at, iflow_moe_scratch *s, const expert_weights *x, int e, float *out)
{
    const iflow_hparams *hp = at->hp;
    iflow_device *d = at->d;
    const int D = hp->dim, Fe = hp->expert_ffn_dim, K = hp->n_experts_used, n = s->start[e + 1] - s->start[e];
    const int *pairs = s->order + s->start[e];
    for (int j = 0; j < n; j++)
        memcpy(s->h + (size_t)j * D, s->x + (size_t)(pairs[j] / K) * D, (size_t)D * sizeof(float));
    layer_weights ew = {.gate = x->gate, .up = x->up, .gate_b = x->gate_b, .up_b = x->up_b};
    iflow_observe(at->c, at->layer, IFLOW_OBS_EXPERT_IN(e), 0, s->h, (size_t)D, n, D);
    IFLOW_TRY(iflow_ffn_hidden(hp, d, &ew, s->h, n, Fe, s->gate, s->up));
    iflow_observe(at->c, at->layer, IFLOW_OBS_EXPERT_MID(e), 0, s->gate, (size_t)Fe, n, Fe);
    IFLOW_TRY(iflow_linear_rows(d, s->h, D, x->down, x->down_b, s->gate, Fe, n, D, Fe));
    for (int j = 0; j < n; j++) {
        const float g = s->wt[pairs[j]], *y = s->h + (size_t)j * D;
        float *o = out + (size_t)(pairs[j] / K) * D;
        for (int i = 0; i < D; i++)
            o[i] += g * y[i];
    }
    return 0;
}

int iflow_moe_ffn(const iflow_hparams *hp, const iflow_ctx *c, int layer, iflow_device *d, iflow_moe_scratch **sp,
                  const layer_weights *w, const float *in, int T, float *out)
{
    const moe_site at = {hp, d, c, layer};
    if (!d->host_memory)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a mixture of experts is not implemented on %s yet", d->info.name);
    IFLOW_TRY(scratch_rows(hp, sp, T));
    iflow_moe_scratch *s = *sp;
    const int D = hp->dim, E = hp->n_experts, K = hp->n_experts_used;
    memcpy(s->x, in, (size_t)T * D * sizeof(float));
    IFLOW_TRY(d->ops->matmul(d, s->logits, (size_t)E, w->router, IFLOW_DT_F32, s->x, (size_t)D, T, E, D));
    for (int t = 0; t < T && w->router_b; t++) /* gpt-oss's router bias: on the logits, choice and weights */
        for (int e = 0; e < E; e++)
            s->logits[(size_t)t * E + e] += w->router_b[e];
    for (int t = 0; t < T; t++)
        route_row(hp, s->logits + (size_t)t * E, w->router_bias, s->sel + (size_t)t * K, s->wt + (size_t)t * K);
    group_pairs(hp, s, T);
    if (hp->shared_expert)
        IFLOW_TRY(shared_expert(&at, s, w, T, out));
    else
        memset(out, 0, (size_t)T * D * sizeof(float));
    for (int e = 0; e < E; e++)
        if (s->start[e + 1] > s->start[e])
            IFLOW_TRY(run_expert(&at, s, &w->experts[e], e, out));
    return 0;
}
