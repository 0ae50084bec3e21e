/* seq2seq.c -- an encoder-decoder's forward pass, over forward.c's layer pieces. See seq2seq.h.
 *
 * Everything is in host memory on one CPU device of the context's own. The encoder's layers come
 * from the mapping (m->enc_layers), the decoder's from their placed parts (whole layers on the
 * host: packed where the CPU packs), the output matrix as placed. Attention is the device's
 * attention_bias op over F32 rows: the encoder's over the source, a sequence's self-attention
 * over its cache, cross-attention over the keys and values the encoder's output gave.
 */
#include "seq2seq.h"
#include "model_impl.h"
#include "libcore/base/error.h"
#include "kernels/cpu/kernels.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

struct iflow_s2s {
    const iflow_model *m;
    iflow_device *dev;          /* the context's own CPU device */
    int max_src, max_tgt, n_seqs, rows;  /* rows: scratch rows, max(max_src, IFLOW_MAX_STEP) */
    int n_src;                  /* the encoded source's tokens (0: none yet) */
    float *ck, *cv;             /* [n_layers][max_src][KV] cross-attention keys, values      */
    float *sk, *sv;             /* [n_seqs][n_layers][max_tgt][KV] each sequence's own       */
    int *n_past;                /* [n_seqs] */
    float *x, *xb;              /* [rows][D] residual stream, sub-block input / output        */
    float *q, *att;             /* [rows][Q] */
    float *kx, *vx;             /* [rows][KV] new keys and values                             */
    float *gate, *up;           /* [rows][F] */
    float *bias;                /* [H][rows][max(max_src, max_tgt)] relative position bias    */
    float *pos_row;             /* [D] a sinusoidal row */
    int pos[IFLOW_MAX_STEP];    /* a step's row positions */
};

/* One attention's weights: a layer's self-attention or its cross-attention. */
typedef struct {
    const float *norm, *norm_b;
    weight q, k, v, o;
    const float *bq, *bk, *bv, *bo;
} attn_weights;

static attn_weights self_attn(const layer_weights *w)
{
    return (attn_weights){w->attn_norm, w->attn_norm_b, w->wq, w->wk, w->wv, w->wo, w->bq, w->bk, w->bv, w->bo};
}

static attn_weights cross_attn(const layer_weights *w)
{
    return (attn_weights){w->xattn_norm, w->xattn_norm_b, w->xq, w->xk, w->xv, w->xo, w->xbq, w->xbk, w->xbv, w->xbo};
}

static const layer_weights *dec_layer(const iflow_s2s *s, int l) { return &s->m->parts[s->m->part0[l]].w; }

static size_t kv_width(const iflow_hparams *hp) { return (size_t)hp->n_kv_heads * hp->head_dim; }

/* Sequence q's cache rows of layer l: keys (value 0) or values (1). */
static float *seq_cache(const iflow_s2s *s, int q, int l, int value)
{
    size_t KV = kv_width(&s->m->hp);
    return (value ? s->sv : s->sk) + (((size_t)q * s->m->hp.n_layers + l) * s->max_tgt) * KV;
}

/* ---- positions ---------------------------------------------------------------------------- */

int iflow_rel_bucket(int rel, int bidirectional, int n_buckets, int max_distance)
{
    int bucket = 0;
    if (bidirectional) {
        n_buckets /= 2;
        bucket = rel > 0 ? n_buckets : 0;
        rel = abs(rel);
    } else {
        rel = rel < 0 ? -rel : 0;
    }
    const int max_exact = n_buckets / 2;
    if (rel < max_exact)
        return bucket + rel;
    /* as transformers: log in F32, the divisor a double rounded to F32, truncated */
    float f = logf((float)rel / (float)max_exact) / (float)log((double)max_distance / max_exact) *
              (float)(n_buckets - max_exact);
    int large = max_exact + (int)f;
    return bucket + (large < n_buckets - 1 ? large : n_buckets - 1);
}

/* bias [H][T][S] for query rows at positions pos0 + t over keys 0 .. S - 1, from a relative bias
 * table [buckets][H]. */
static void fill_bias(const iflow_s2s *s, const float *table, int bidirectional, int T, int pos0, int S)
{
    const iflow_hparams *hp = &s->m->hp;
    const int H = hp->n_heads;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < S; j++) {
            int b = iflow_rel_bucket(j - (pos0 + t), bidirectional, hp->rel_buckets, hp->rel_max_distance);
            for (int h = 0; h < H; h++)
                s->bias[((size_t)h * T + t) * S + j] = table[(size_t)b * H + h];
        }
}

/* The sinusoidal row of position p into s->pos_row: sin in the first half, cos in the second,
 * as Marian (frequencies 10000^(-2i/dim), in double) or fairseq (endpoint: 10000^(-i/(half-1)),
 * in F32) make their tables. */
static void sinusoidal_row(const iflow_s2s *s, int p)
{
    const iflow_hparams *hp = &s->m->hp;
    const int D = hp->dim, half = D / 2, row = p + hp->pos_offset;
    const float step = (float)(-log(10000.0) / (half - 1));
    for (int i = 0; i < half; i++) {
        if (hp->pos_endpoint) {
            float a = (float)row * expf((float)i * step);
            s->pos_row[i] = sinf(a), s->pos_row[half + i] = cosf(a);
        } else {
            double a = row / pow(10000.0, 2.0 * i / D);
            s->pos_row[i] = (float)sin(a), s->pos_row[half + i] = (float)cos(a);
        }
    }
    if (D % 2)
        s->pos_row[D - 1] = 0;
}

/* x[t] = the embedding of ids[t] (times embed_scale), plus its position's sinusoidal row. */
static int embed(iflow_s2s *s, const int32_t *ids, const int *pos, int T)
{
    const iflow_model *m = s->m;
    const iflow_hparams *hp = &m->hp;
    const int D = hp->dim;
    for (int t = 0; t < T; t++) {
        float *row = s->x + (size_t)t * D;
        ifk_get_row(row, m->tok_embd.data, m->tok_embd.type, (size_t)ids[t], D);
        for (int i = 0; i < D && hp->embed_scale != 1.0f; i++)
            row[i] *= hp->embed_scale;
        if (hp->position != IFLOW_POS_SINUSOIDAL)
            continue;
        if (pos[t] >= hp->max_seq)
            return iflow_seterr(IFLOW_ERANGE, "position %d is past the model's %d positions", pos[t], hp->max_seq);
        sinusoidal_row(s, pos[t]);
        ifk_add(row, s->pos_row, D);
    }
    return 0;
}

/* ---- sub-blocks ------------------------------------------------------------------------------ */

/* An attention's input (the norm, or x itself post-LN) and its queries into s->q; *in receives
 * the input, which the keys and values of a self-attention read. */
static int attn_in(iflow_s2s *s, const attn_weights *a, int T, const float **in)
{
    const iflow_hparams *hp = &s->m->hp;
    const int D = hp->dim, Q = hp->n_heads * hp->head_dim;
    IFLOW_TRY(iflow_block_in(s->m, s->dev, s->x, s->xb, a->norm, a->norm_b, T, in));
    return iflow_linear_rows(s->dev, s->q, Q, a->q, a->bq, *in, D, T, Q, D);
}

/* Keys and values of T input rows into k, v [T][KV]. */
static int attn_kv(iflow_s2s *s, const attn_weights *a, const float *in, int T, float *k, float *v)
{
    const iflow_hparams *hp = &s->m->hp;
    const int D = hp->dim, KV = (int)kv_width(hp);
    IFLOW_TRY(iflow_linear_rows(s->dev, k, KV, a->k, a->bk, in, D, T, KV, D));
    return iflow_linear_rows(s->dev, v, KV, a->v, a->bv, in, D, T, KV, D);
}

/* s->att [T] of queries s->q over S rows of k, v (query t sees 0 .. causal0 + t when causal0 >= 0). */
static int attend(iflow_s2s *s, int row0, int T, const float *k, const float *v, int S, int causal0, const float *bias)
{
    const iflow_hparams *hp = &s->m->hp;
    iflow_device *d = s->dev;
    const size_t Q = (size_t)hp->n_heads * hp->head_dim;
    if (!d->ops->attention_bias)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "layout encoder-decoder: its attention is not implemented on %s yet",
                            d->info.name);
    return d->ops->attention_bias(d, s->att + (size_t)row0 * Q, s->q + (size_t)row0 * Q, Q, k, v, kv_width(hp), T, S,
                                  causal0, hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->attn_scale, bias);
}

/* The output projection of s->att into the residual stream. */
static int attn_out(iflow_s2s *s, const attn_weights *a, int T)
{
    const iflow_hparams *hp = &s->m->hp;
    const int D = hp->dim, Q = hp->n_heads * hp->head_dim;
    IFLOW_TRY(iflow_linear_rows(s->dev, s->xb, D, a->o, a->bo, s->att, Q, T, D, Q));
    return iflow_block_out(s->m, s->dev, s->x, s->xb, a->norm, a->norm_b, T);
}

static int ffn(iflow_s2s *s, const layer_weights *w, int T)
{
    const iflow_hparams *hp = &s->m->hp;
    const int D = hp->dim, F = hp->ffn_dim;
    const float *in;
    IFLOW_TRY(iflow_block_in(s->m, s->dev, s->x, s->xb, w->ffn_norm, w->ffn_norm_b, T, &in));
    IFLOW_TRY(iflow_ffn_hidden(hp, s->dev, w, in, T, F, s->gate, s->up));
    IFLOW_TRY(iflow_linear_rows(s->dev, s->xb, D, w->down, w->down_b, s->gate, F, T, D, F));
    return iflow_block_out(s->m, s->dev, s->x, s->xb, w->ffn_norm, w->ffn_norm_b, T);
}

/* A stack's final norm of T rows of x, in place (final_norm; Marian's post-LN stacks have none). */
static int final_norm(iflow_s2s *s, const float *w, const float *b, int T)
{
    return s->m->hp.final_norm ? iflow_norm_rows(s->m, s->dev, s->x, s->x, w, b, T, s->m->hp.dim) : 0;
}

/* ---- open, encode ---------------------------------------------------------------------------- */

int iflow_s2s_open(iflow_s2s **out, const iflow_model *m, int max_src, int max_tgt, int n_seqs, int n_threads)
{
    const iflow_hparams *hp = &m->hp;
    *out = NULL;
    if (hp->layout != IFLOW_LAYOUT_ENCODER_DECODER)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "the model is a %s, not an encoder-decoder",
                            hp->layout == IFLOW_LAYOUT_ENCODER ? "encoder" : "decoder");
    if (!iflow_model_host_only(m) || m->split)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "an encoder-decoder runs on the cpu, as one part per layer");
    if (n_seqs < 1)
        return iflow_seterr(IFLOW_EINVAL, "an encoder-decoder context needs a sequence, not %d", n_seqs);
    iflow_s2s *s = calloc(1, sizeof *s);
    if (!s)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    s->m = m;
    s->max_src = max_src > 0 ? max_src : hp->max_seq;
    s->max_tgt = max_tgt > 0 ? max_tgt : hp->max_seq;
    s->n_seqs = n_seqs;
    s->rows = s->max_src > IFLOW_MAX_STEP ? s->max_src : IFLOW_MAX_STEP;
    const size_t R = (size_t)s->rows, D = (size_t)hp->dim, Q = (size_t)hp->n_heads * hp->head_dim, KV = kv_width(hp),
                 F = (size_t)hp->ffn_dim, L = (size_t)hp->n_layers, S = (size_t)(s->max_src > s->max_tgt ? s->max_src : s->max_tgt);
    s->ck = calloc(L * s->max_src * KV, sizeof(float));
    s->cv = calloc(L * s->max_src * KV, sizeof(float));
    s->sk = calloc((size_t)n_seqs * L * s->max_tgt * KV, sizeof(float));
    s->sv = calloc((size_t)n_seqs * L * s->max_tgt * KV, sizeof(float));
    s->n_past = calloc((size_t)n_seqs, sizeof *s->n_past);
    s->x = malloc(R * D * sizeof(float)), s->xb = malloc(R * D * sizeof(float));
    s->q = malloc(R * Q * sizeof(float)), s->att = malloc(R * Q * sizeof(float));
    s->kx = malloc(R * KV * sizeof(float)), s->vx = malloc(R * KV * sizeof(float));
    s->gate = malloc(R * F * sizeof(float)), s->up = malloc(R * F * sizeof(float));
    s->bias = hp->position == IFLOW_POS_RELATIVE ? malloc((size_t)hp->n_heads * R * S * sizeof(float)) : NULL;
    s->pos_row = malloc(D * sizeof(float));
    int rc = 0;
    if (!s->ck || !s->cv || !s->sk || !s->sv || !s->n_past || !s->x || !s->xb || !s->q || !s->att || !s->kx || !s->vx ||
        !s->gate || !s->up || !s->pos_row || (hp->position == IFLOW_POS_RELATIVE && !s->bias))
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory for an encoder-decoder context (%d source, %d x %d target tokens)",
                          s->max_src, n_seqs, s->max_tgt);
    if (rc == 0)
        rc = iflow_device_open(&s->dev, "cpu", n_threads > 0 ? n_threads : omp_get_num_procs());
    if (rc < 0) {
        iflow_s2s_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void iflow_s2s_close(iflow_s2s *s)
{
    if (!s)
        return;
    float *bufs[] = {s->ck, s->cv, s->sk, s->sv, s->x, s->xb, s->q, s->att, s->kx, s->vx, s->gate, s->up, s->bias, s->pos_row};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(s->n_past);
    iflow_device_close(s->dev);
    free(s);
}

static int check_ids(const iflow_s2s *s, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->m->hp.vocab_size)
            return iflow_seterr(IFLOW_ERANGE, "token id %d is outside the vocabulary (%d)", ids[i], s->m->hp.vocab_size);
    return 0;
}

/* One encoder layer over the whole source of S rows. */
static int encoder_layer(iflow_s2s *s, int l, int S)
{
    const iflow_model *m = s->m;
    const layer_weights *w = &m->enc_layers[l];
    const attn_weights a = self_attn(w);
    const float *in;
    IFLOW_TRY(attn_in(s, &a, S, &in));
    IFLOW_TRY(attn_kv(s, &a, in, S, s->kx, s->vx));
    IFLOW_TRY(attend(s, 0, S, s->kx, s->vx, S, -1, m->enc_rel_bias ? s->bias : NULL));
    IFLOW_TRY(attn_out(s, &a, S));
    return ffn(s, w, S);
}

int iflow_s2s_encode(iflow_s2s *s, const int32_t *src, int n)
{
    const iflow_model *m = s->m;
    const iflow_hparams *hp = &m->hp;
    if (n <= 0)
        return iflow_seterr(IFLOW_EINVAL, "the source has no tokens");
    if (n > s->max_src)
        return iflow_seterr(IFLOW_ERANGE, "a source of %d tokens is longer than the context takes (%d)", n, s->max_src);
    IFLOW_TRY(check_ids(s, src, n));
    s->n_src = 0;
    memset(s->n_past, 0, (size_t)s->n_seqs * sizeof *s->n_past);
    int *pos = malloc((size_t)n * sizeof *pos);
    if (!pos)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        pos[i] = i;
    int rc = embed(s, src, pos, n);
    free(pos);
    IFLOW_TRY(rc);
    if (m->enc_rel_bias) /* shared by every layer (transformers computes it in layer 0) */
        fill_bias(s, m->enc_rel_bias, 1, n, 0, n);
    for (int l = 0; l < hp->n_enc_layers; l++)
        IFLOW_TRY(encoder_layer(s, l, n));
    IFLOW_TRY(final_norm(s, m->enc_output_norm, m->enc_output_norm_b, n));
    /* each decoder layer's cross-attention keys and values of the encoder's output */
    const size_t KV = kv_width(hp);
    for (int l = 0; l < hp->n_layers; l++) {
        const attn_weights a = cross_attn(dec_layer(s, l));
        IFLOW_TRY(attn_kv(s, &a, s->x, n, s->ck + (size_t)l * s->max_src * KV, s->cv + (size_t)l * s->max_src * KV));
    }
    s->n_src = n;
    return 0;
}

/* ---- decoding -------------------------------------------------------------------------------- */

/* A step's rows: positions, sequences and ids checked. */
static int check_step(iflow_s2s *s, const int32_t *ids, const int *seq, int n)
{
    if (!s->n_src)
        return iflow_seterr(IFLOW_EINVAL, "no source is encoded (iflow_s2s_encode)");
    if (n <= 0 || n > IFLOW_MAX_STEP)
        return iflow_seterr(IFLOW_ERANGE, "a step holds 1 to %d rows, not %d", IFLOW_MAX_STEP, n);
    IFLOW_TRY(check_ids(s, ids, n));
    for (int i = 0; i < n; i++) {
        if (seq[i] < 0 || seq[i] >= s->n_seqs)
            return iflow_seterr(IFLOW_EINVAL, "row %d names sequence %d of %d", i, seq[i], s->n_seqs);
        int p = s->n_past[seq[i]];
        for (int j = 0; j < i; j++)
            p += seq[j] == seq[i];
        if (p >= s->max_tgt)
            return iflow_seterr(IFLOW_ERANGE, "sequence %d is full: position %d past the context of %d", seq[i], p,
                                s->max_tgt);
        s->pos[i] = p;
    }
    return 0;
}

/* A decoder layer's self-attention: each row's key and value into its sequence's cache, then
 * the row over its sequence's positions 0 .. its own. */
static int self_attention(iflow_s2s *s, int l, const int *seq, int n)
{
    const iflow_model *m = s->m;
    const attn_weights a = self_attn(dec_layer(s, l));
    const size_t KV = kv_width(&m->hp);
    const float *in;
    IFLOW_TRY(attn_in(s, &a, n, &in));
    IFLOW_TRY(attn_kv(s, &a, in, n, s->kx, s->vx));
    for (int i = 0; i < n; i++) {
        memcpy(seq_cache(s, seq[i], l, 0) + (size_t)s->pos[i] * KV, s->kx + (size_t)i * KV, KV * sizeof(float));
        memcpy(seq_cache(s, seq[i], l, 1) + (size_t)s->pos[i] * KV, s->vx + (size_t)i * KV, KV * sizeof(float));
    }
    for (int i = 0; i < n; i++) {
        const int S = s->pos[i] + 1;
        if (m->rel_bias)
            fill_bias(s, m->rel_bias, 0, 1, s->pos[i], S);
        IFLOW_TRY(attend(s, i, 1, seq_cache(s, seq[i], l, 0), seq_cache(s, seq[i], l, 1), S, -1, m->rel_bias ? s->bias : NULL));
    }
    return attn_out(s, &a, n);
}

/* A decoder layer's cross-attention: every row over the whole source. */
static int cross_attention(iflow_s2s *s, int l, int n)
{
    const attn_weights a = cross_attn(dec_layer(s, l));
    const size_t off = (size_t)l * s->max_src * kv_width(&s->m->hp);
    const float *in;
    IFLOW_TRY(attn_in(s, &a, n, &in));
    IFLOW_TRY(attend(s, 0, n, s->ck + off, s->cv + off, s->n_src, -1, NULL));
    return attn_out(s, &a, n);
}

/* logits [n][vocab] of the final hidden states (output_rescale, the output matrix, logits_bias). */
static int output(iflow_s2s *s, int n, float *logits)
{
    const iflow_model *m = s->m;
    const iflow_hparams *hp = &m->hp;
    const int D = hp->dim, V = hp->vocab_size;
    IFLOW_TRY(final_norm(s, m->output_norm_w, m->output_norm_b_w, n));
    if (hp->output_rescale) /* as transformers: times the Python float dim ** -0.5 */
        for (size_t i = 0; i < (size_t)n * D; i++)
            s->x[i] *= (float)pow((double)D, -0.5);
    IFLOW_TRY(iflow_linear_rows(s->dev, logits, V, m->output_w, NULL, s->x, D, n, V, D));
    for (int t = 0; t < n && m->output_b; t++)
        ifk_add(logits + (size_t)t * V, m->output_b, V);
    return 0;
}

int iflow_s2s_step(iflow_s2s *s, const int32_t *ids, const int *seq, int n, float *logits)
{
    const iflow_hparams *hp = &s->m->hp;
    IFLOW_TRY(check_step(s, ids, seq, n));
    IFLOW_TRY(embed(s, ids, s->pos, n));
    for (int l = 0; l < hp->n_layers; l++) {
        IFLOW_TRY(self_attention(s, l, seq, n));
        IFLOW_TRY(cross_attention(s, l, n));
        IFLOW_TRY(ffn(s, dec_layer(s, l), n));
    }
    for (int i = 0; i < n; i++)
        s->n_past[seq[i]] = s->pos[i] + 1;
    return logits ? output(s, n, logits) : 0;
}

int iflow_s2s_fork(iflow_s2s *s, int dst, int src)
{
    if (dst < 0 || src < 0 || dst >= s->n_seqs || src >= s->n_seqs)
        return iflow_seterr(IFLOW_EINVAL, "cannot copy sequence %d to %d of %d", src, dst, s->n_seqs);
    const size_t n = (size_t)s->n_past[src] * kv_width(&s->m->hp) * sizeof(float);
    for (int l = 0; l < s->m->hp.n_layers && dst != src; l++)
        for (int v = 0; v < 2; v++)
            memcpy(seq_cache(s, dst, l, v), seq_cache(s, src, l, v), n);
    s->n_past[dst] = s->n_past[src];
    return 0;
}

int iflow_s2s_n_past(const iflow_s2s *s, int seq) { return seq >= 0 && seq < s->n_seqs ? s->n_past[seq] : -1; }
int iflow_s2s_n_seqs(const iflow_s2s *s) { return s->n_seqs; }
int iflow_s2s_max_tgt(const iflow_s2s *s) { return s->max_tgt; }

/* The most likely id of logits [V] (the lowest among equals). */
static int32_t argmax(const float *x, int V)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

int iflow_s2s_greedy(iflow_s2s *s, const int32_t *src, int n_src, const int32_t *prefix, int n_prefix, int max_new,
                     iflow_s2s_result *r)
{
    const iflow_model *m = s->m;
    const int V = m->hp.vocab_size, n_first = 1 + n_prefix;
    memset(r, 0, sizeof *r);
    r->eos = -1;
    if (n_prefix < 0 || n_first > IFLOW_MAX_STEP || n_first >= s->max_tgt)
        return iflow_seterr(IFLOW_ERANGE, "a forced prefix of %d tokens does not fit a step or the context", n_prefix);
    int32_t first[IFLOW_MAX_STEP];
    int seq0[IFLOW_MAX_STEP] = {0};
    first[0] = m->hp.decoder_start;
    if (n_prefix > 0)
        memcpy(first + 1, prefix, (size_t)n_prefix * sizeof *prefix);
    float *logits = malloc((size_t)n_first * V * sizeof *logits);
    r->tokens = malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof *r->tokens);
    int rc = logits && r->tokens ? iflow_s2s_encode(s, src, n_src) : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    if (rc == 0)
        rc = iflow_s2s_step(s, first, seq0, n_first, logits);
    float *last = logits ? logits + (size_t)(n_first - 1) * V : NULL;
    r->finish = IFLOW_FINISH_LENGTH;
    while (rc == 0 && r->n_tokens < max_new) {
        iflow_model_ban(m, last);
        int32_t next = argmax(last, V);
        if (iflow_model_is_eos(m, next)) {
            r->finish = IFLOW_FINISH_EOS, r->eos = next;
            break;
        }
        r->tokens[r->n_tokens++] = next;
        if (r->n_tokens == max_new)
            break;
        if (s->n_past[0] >= s->max_tgt) {
            r->finish = IFLOW_FINISH_CONTEXT;
            break;
        }
        rc = iflow_s2s_step(s, &next, seq0, 1, logits);
        last = logits;
    }
    free(logits);
    if (rc < 0) {
        free(r->tokens);
        r->tokens = NULL, r->n_tokens = 0;
    }
    return rc;
}
