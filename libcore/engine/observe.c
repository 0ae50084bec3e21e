/* observe.c -- the activation hook and the importance-matrix collector. See observe.h. */
#include "observe.h"
#include "libcore/base/error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the hook ---------------------------------------------------------------------------- */

static struct {
    const iflow_ctx  *ctx;
    iflow_observer_fn fn;
    void             *user;
} observers[IFLOW_MAX_OBSERVERS];
static atomic_int n_observers;
static pthread_mutex_t obs_lock = PTHREAD_MUTEX_INITIALIZER;

int iflow_ctx_set_observer(const iflow_ctx *ctx, iflow_observer_fn fn, void *user)
{
    int rc = 0, i, free_slot = -1;
    pthread_mutex_lock(&obs_lock);
    for (i = 0; i < IFLOW_MAX_OBSERVERS && observers[i].ctx != ctx; i++)
        if (!observers[i].ctx && free_slot < 0)
            free_slot = i;
    if (i < IFLOW_MAX_OBSERVERS) { /* ctx is observed: replace or remove */
        observers[i].fn = fn;
        observers[i].user = user;
        if (!fn) {
            observers[i].ctx = NULL;
            atomic_fetch_sub(&n_observers, 1);
        }
    } else if (fn && free_slot < 0) {
        rc = iflow_seterr(IFLOW_ERANGE, "cannot observe more than %d contexts at a time", IFLOW_MAX_OBSERVERS);
    } else if (fn) {
        observers[free_slot].ctx = ctx;
        observers[free_slot].fn = fn;
        observers[free_slot].user = user;
        atomic_fetch_add(&n_observers, 1);
    }
    pthread_mutex_unlock(&obs_lock);
    return rc;
}

void iflow_observe(const iflow_ctx *ctx, int layer, int site, int col0, const float *x, size_t ldx, int T, int K)
{
    if (atomic_load_explicit(&n_observers, memory_order_relaxed) == 0)
        return;
    iflow_observer_fn fn = NULL;
    void *user = NULL;
    pthread_mutex_lock(&obs_lock);
    for (int i = 0; i < IFLOW_MAX_OBSERVERS; i++)
        if (observers[i].ctx == ctx) {
            fn = observers[i].fn;
            user = observers[i].user;
        }
    pthread_mutex_unlock(&obs_lock);
    if (fn)
        fn(user, layer, site, col0, x, ldx, T, K);
}

/* ---- the collector ----------------------------------------------------------------------- */

/* One site of one layer (or the output): the sums of its input columns. */
typedef struct {
    double   *sum_sq;    /* [K] */
    uint64_t  count;     /* rows given with col0 == 0 */
    int       K;
} site_acc;

struct iflow_imatrix_collector {
    iflow_hparams hp;
    int per_layer;       /* sites of a layer: the 4 dense ones, then 2 per expert (in, mid)      */
    site_acc *acc;       /* [n_layers * per_layer + 1]: layer l's at per_layer l .., the output last */
    uint64_t  n_bad;     /* calls outside the model */
    pthread_mutex_t lock;
};

static int site_K(const iflow_hparams *hp, int site)
{
    if (site >= IFLOW_OBS_N_) /* an expert's: in or mid */
        return (site - IFLOW_OBS_N_) % 2 ? hp->expert_ffn_dim : hp->dim;
    switch (site) {
    case IFLOW_OBS_ATTN_OUT: return hp->n_heads * (hp->kv_lora_rank ? hp->v_head_dim : hp->head_dim);
    case IFLOW_OBS_FFN_MID: return hp->ffn_dim;
    default: return hp->dim;
    }
}

/* The site of a layer's accumulator j (0 .. per_layer - 1), and back. */
static int site_of(int j) { return j < 4 ? j : IFLOW_OBS_N_ + (j - 4); }
static int slot_of(int site) { return site < 4 ? site : 4 + (site - IFLOW_OBS_N_); }

int iflow_imatrix_collector_open(iflow_imatrix_collector **out, const iflow_hparams *hp)
{
    iflow_imatrix_collector *c = calloc(1, sizeof *c);
    const int per_layer = 4 + 2 * hp->n_experts;
    size_t n = (size_t)hp->n_layers * (size_t)per_layer + 1;
    if (!c || !(c->acc = calloc(n, sizeof *c->acc))) {
        free(c);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    c->hp = *hp;
    c->per_layer = per_layer;
    pthread_mutex_init(&c->lock, NULL);
    for (size_t i = 0; i < n; i++) {
        int site = i + 1 == n ? IFLOW_OBS_OUTPUT_IN : site_of((int)(i % (size_t)per_layer));
        c->acc[i].K = site_K(hp, site);
        if (!(c->acc[i].sum_sq = calloc((size_t)c->acc[i].K, sizeof(double)))) {
            *out = c;
            iflow_imatrix_collector_close(c);
            *out = NULL;
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        }
    }
    *out = c;
    return 0;
}

void iflow_imatrix_collector_close(iflow_imatrix_collector *c)
{
    if (!c)
        return;
    for (size_t i = 0; c->acc && i < (size_t)c->hp.n_layers * (size_t)c->per_layer + 1; i++)
        free(c->acc[i].sum_sq);
    free(c->acc);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

void iflow_imatrix_collector_observe(void *user, int layer, int site, int col0, const float *x, size_t ldx, int T,
                                     int K)
{
    iflow_imatrix_collector *c = user;
    site_acc *a = NULL;
    const int known = (site >= 0 && site < IFLOW_OBS_OUTPUT_IN) ||
                      (site >= IFLOW_OBS_N_ && site < IFLOW_OBS_N_ + 2 * c->hp.n_experts);
    if (site == IFLOW_OBS_OUTPUT_IN)
        a = &c->acc[(size_t)c->hp.n_layers * (size_t)c->per_layer];
    else if (known && layer >= 0 && layer < c->hp.n_layers)
        a = &c->acc[(size_t)layer * (size_t)c->per_layer + (size_t)slot_of(site)];
    pthread_mutex_lock(&c->lock);
    if (!a || col0 < 0 || K < 1 || T < 0 || col0 > a->K - K) {
        c->n_bad++;
    } else {
        for (int t = 0; t < T; t++) {
            const float *row = x + (size_t)t * ldx;
            for (int k = 0; k < K; k++)
                a->sum_sq[col0 + k] += (double)row[k] * row[k];
        }
        if (col0 == 0)
            a->count += (uint64_t)T;
    }
    pthread_mutex_unlock(&c->lock);
}

/* Add the entry of matrix `name` from accumulator a (if it saw rows). */
static int add_entry(iflow_imatrix *im, const char *name, const site_acc *a, float *tmp)
{
    if (a->count == 0)
        return 0;
    for (int k = 0; k < a->K; k++)
        tmp[k] = (float)(a->sum_sq[k] / (double)a->count);
    return iflow_imatrix_add(im, name, a->K, a->count, tmp);
}

int iflow_imatrix_collector_result(iflow_imatrix_collector *c, iflow_imatrix **out)
{
    /* the matrices each site feeds; a latent attention's input feeds wq (or wq_a) and wkv_a (its
     * inner products, wq after wq_a, wk_b and wv_b, get no entries) */
    const int mla = c->hp.kv_lora_rank > 0;
    const char *const names[4][3] = {{mla ? (c->hp.q_lora_rank ? "wq_a" : "wq") : "wq", mla ? "wkv_a" : "wk",
                                      mla ? NULL : "wv"},
                                     {"wo", NULL, NULL}, {"ffn_gate", "ffn_up", NULL}, {"ffn_down", NULL, NULL}};
    iflow_imatrix *im = NULL;
    int Kmax = c->hp.dim, rc;
    *out = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->n_bad) {
        rc = iflow_seterr(IFLOW_EINVAL, "imatrix collector: %llu observations outside the model (layer, site or columns)",
                          (unsigned long long)c->n_bad);
        goto out;
    }
    Kmax = Kmax > c->hp.ffn_dim ? Kmax : c->hp.ffn_dim;
    Kmax = Kmax > c->hp.expert_ffn_dim ? Kmax : c->hp.expert_ffn_dim;
    Kmax = Kmax > c->hp.n_heads * c->hp.head_dim ? Kmax : c->hp.n_heads * c->hp.head_dim;
    float *tmp = malloc((size_t)Kmax * sizeof *tmp);
    if (!tmp || (rc = iflow_imatrix_new(&im)) < 0) {
        free(tmp);
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
        goto out;
    }
    im->n_tokens = c->acc[0].count; /* layer 0 ATTN_IN, or the output in a model of no layers */
    char name[64];
    for (int l = 0; l < c->hp.n_layers && rc == 0; l++) {
        const site_acc *layer = &c->acc[(size_t)l * (size_t)c->per_layer];
        for (int s = 0; s < 4 && rc == 0; s++)
            for (int j = 0; j < 3 && names[s][j] && rc == 0; j++) {
                snprintf(name, sizeof name, "blk.%d.%s", l, names[s][j]);
                rc = add_entry(im, name, &layer[s], tmp);
            }
        static const char *const experts[3] = {"ffn_gate", "ffn_up", "ffn_down"};
        for (int e = 0; e < c->hp.n_experts && rc == 0; e++)
            for (int j = 0; j < 3 && rc == 0; j++) { /* gate.e and up.e read the expert's input, down.e its mid */
                const int site = j < 2 ? IFLOW_OBS_EXPERT_IN(e) : IFLOW_OBS_EXPERT_MID(e);
                snprintf(name, sizeof name, "blk.%d.%s.%d", l, experts[j], e);
                rc = add_entry(im, name, &layer[slot_of(site)], tmp);
            }
    }
    if (rc == 0)
        rc = add_entry(im, c->hp.tie_embeddings ? "tok_embd" : "output",
                       &c->acc[(size_t)c->hp.n_layers * (size_t)c->per_layer], tmp);
    free(tmp);
    if (rc < 0) {
        iflow_imatrix_free(im);
        im = NULL;
    }
out:
    pthread_mutex_unlock(&c->lock);
    *out = im;
    return rc;
}
