/*
 * model_impl.h -- the model's insides, shared by the five files of the engine and nothing
 * else: model.c (hyperparameters, binding a shard's tensors, or a split model's files), place.c (putting weights on
 * devices, by layer or by head and column ranges), forward.c (contexts, the forward pass), moe.c (a
 * mixture-of-experts FFN),
 * seq2seq.c (an encoder-decoder's forward pass, over forward.c's layer pieces) and lora_bind.c
 * (LoRA adapters' deltas bound to the layers' matrices).
 */
#ifndef IFLOW_MODEL_IMPL_H
#define IFLOW_MODEL_IMPL_H

#include "model.h"

/* Floats of a model's rope_scale table: a multiplier a pair, twice over with longrope (short, long). */
static inline size_t rope_scale_count(const iflow_hparams *hp)
{
    return (size_t)hp->rope_dim / 2 * (hp->rope_scaling == IFLOW_ROPE_SCALING_LONGROPE ? 2 : 1);
}

#define MAX_BATCH IFLOW_MAX_STEP /* tokens of one step (iflow_ctx_eval's passes: iflow_model.pass) */
#define MAX_PACKED 12            /* a layer's matrices: 7, and 4 of cross-attention */

typedef struct { const void *data; int type; } weight;   /* a matrix [rows][cols] of type */

/* A matrix's low-rank delta added at run time (LoRA adapters, iflow_model_add_lora): W x + b (a x),
 * F16 on the host (IFLOW_DT_F16: half the bytes a decode step reads), the adapters' scales
 * folded into b, which is kept in the column tiles the device's lowrank_up op reads
 * (kernels/cpu/kernels.h's ifk_lowrank_up; several adapters stacked: more ranks); rank 0: none.
 * A model's layers own theirs (lora_bind.c frees them); a part's are views of its layer's. */
typedef struct {
    const uint16_t *a;  /* [rank][cols] */
    const uint16_t *bt; /* b [rows][rank] in tiles of IFK_LR_TILE rows (ifk_lr_at) */
    int rank;
} low_rank;

/* The matrices a low-rank delta may change, in layer_weights.lr. */
enum { LR_Q, LR_K, LR_V, LR_O, LR_GATE, LR_UP, LR_DOWN, LR_COUNT };

/* One expert of a mixture-of-experts FFN (hparams n_experts): a gated FFN of expert_ffn_dim
 * columns, no biases. */
typedef struct {
    weight gate, up, down;                                   /* [Fe][dim] [Fe][dim] [dim][Fe] */
    const float *gate_b, *up_b, *down_b;                     /* [Fe] [Fe] [dim] or NULL (expert_bias) */
} expert_weights;

typedef struct {
    const float *attn_norm, *ffn_norm;                       /* [dim]                       */
    const float *attn_norm_b, *ffn_norm_b;                   /* [dim] or NULL (norm = layer) */
    const float *attn_post_norm, *ffn_post_norm;             /* [dim] or NULL (post_norms)   */
    const float *q_norm, *k_norm;                            /* [head_dim] or NULL (qk_norm) */
    weight wq, wk, wv, wo;                                   /* [Q][dim] [KV][dim] x2 [dim][Q] */
    const float *bq, *bk, *bv, *bo;                          /* [Q] [KV] [KV] [dim] or NULL  */
    weight gate, up, down;                                   /* [F][dim] [F][dim] [dim][F]  */
    const float *gate_b, *up_b, *down_b;                     /* [F] [F] [dim] or NULL        */
    /* a mixture of experts (n_experts > 0); gate, up and down above are then its shared expert,
     * or empty */
    const float *router;                                     /* [E][dim] F32                 */
    const float *shexp_gate;                                 /* [dim] F32 or NULL            */
    const float *router_bias;                                /* [E] F32 or NULL (router_bias) */
    const float *router_b;                                   /* [E] F32 or NULL (router_logit_bias) */
    const float *sinks;                                      /* [heads] or NULL (attn_sinks; a part's heads) */
    expert_weights *experts;                                 /* [E] (the model's allocation) */
    /* an encoder-decoder's decoder layer: cross-attention over the encoder's output, between
     * the self-attention and the FFN (NULL / empty otherwise) */
    const float *xattn_norm, *xattn_norm_b;                  /* [dim]; [dim] or NULL         */
    weight xq, xk, xv, xo;                                   /* [Q][dim] [KV][dim] x2 [dim][Q] */
    const float *xbq, *xbk, *xbv, *xbo;                      /* [Q] [KV] [KV] [dim] or NULL  */
    /* multi-head latent attention (kv_lora_rank > 0): wq is [H * (nope + rope)][q_lora_rank or dim]
     * and wo [dim][H * v_head_dim]; wk, wv and their biases are empty */
    weight wq_a, wkv_a;                                      /* [q_lora_rank][dim] [R + rope][dim] */
    const float *q_a_norm, *kv_a_norm;                       /* [q_lora_rank] [R]              */
    weight wk_b, wv_b;                                       /* [H * R][nope] [H * v_head_dim][R]: a
                                                                head's rows in turn (the model's) */
    const weight *mla_heads;                                 /* a part's: [2 * H] each head's wk_b
                                                                [R][nope], then each head's wv_b */
    low_rank lr[LR_COUNT];                                   /* deltas of wq .. down (rank 0: none) */
} layer_weights;

/* One device's share of one layer: query heads q0..q1-1 (and the kv heads kv0..kv1-1 they
 * read), FFN columns f0..f1-1. Its weights are slices, valid on its device:
 *   wq [(q1-q0)*hd][dim]   wk, wv [(kv1-kv0)*hd][dim]   wo [dim][(q1-q0)*hd]   (columns)
 *   gate, up [f1-f0][dim]  down [dim][f1-f0]            (columns)
 * A whole layer is one part with the full ranges. bo and down_b are added by part 0 only. */
typedef struct {
    int dev;                      /* index into the model's devices */
    int q0, q1, kv0, kv1, f0, f1;
    layer_weights w;
    const void *dev_copy[32];     /* what was put on a device that is not the host (freed at unplace) */
    void *host_copy[2];           /* column slices built on the host for a host device (freed at unplace) */
    void *packed[MAX_PACKED];     /* matrices the device packed (its pack op; freed at unplace) */
    expert_weights *own_experts;  /* [n_experts] a mixture's experts as the part reads them (w.experts
                                   * points here): packed by the device, or the mapping's (freed at unplace) */
    void **packed_experts;        /* [3 * n_experts] the packed copies, NULL where none (freed at unplace) */
    weight *own_mla;              /* [2 * n_heads] latent attention's per-head matrices (w.mla_heads
                                   * points here): packed by the device, or the mapping's (freed at unplace) */
    void **packed_mla;            /* [2 * n_heads] their packed copies, NULL where none (freed at unplace) */
} layer_part;

struct iflow_model {
    iflow_shard *shard;
    iflow_hparams hp;
    iflow_tokenizer *tok;         /* the source side's (encoding), or NULL */
    iflow_tokenizer *tgt_tok;     /* an encoder-decoder's target side's (decoding) when it differs, or NULL */
    weight tok_embd;              /* [vocab][dim], in the mapping, never placed */
    weight output;                /* [vocab][dim] in the mapping (tok_embd when tied) */
    const float *output_norm;     /* [dim] in the mapping */
    const float *output_norm_b;   /* [dim] in the mapping, or NULL (norm = layer) */
    weight pos_embd;              /* [max_seq][dim] (position = learned), in the mapping, never placed */
    weight tok_type_embd;         /* [token_types][dim] (encoders with segments), likewise */
    const float *embd_norm;       /* [dim] (embed_norm), in the mapping, used on the host */
    const float *embd_norm_b;     /* [dim] or NULL */
    layer_weights *layers;        /* [n_layers] in the mapping */
    expert_weights *experts;      /* [n_layers][n_experts]: each layer's experts (layers[l].experts) */
    /* an encoder-decoder's encoder (layers is its decoder), in the mapping, never placed */
    layer_weights *enc_layers;    /* [n_enc_layers] */
    const float *enc_output_norm, *enc_output_norm_b; /* [dim] (final_norm); [dim] or NULL */
    const float *enc_rel_bias;    /* [rel_buckets][n_heads] (position = relative): the encoder's */
    const float *rel_bias;        /* [rel_buckets][n_heads]: the decoder's */
    const float *output_b;        /* [vocab] (logits_bias), added to the logits */
    const float *rope_freqs;      /* [rope_dim/2] (hparam rope_freqs) or NULL, in the mapping */
    const float *rope_short, *rope_long; /* [rope_dim/2] (hparam rope_factor_tensors) or NULL, in the mapping */
    float *rope_scale;            /* [rope_scale_count] or NULL, on the host: [rope_dim/2], or with
                                     longrope the short factors' then the long ones' */
    uint64_t decode_bytes;

    /* placement (place.c) */
    int n_devs;
    iflow_device *devs[IFLOW_MAX_DEVICES];    /* borrowed; NULL: the context's CPU */
    int output_dev;
    int *part0;                   /* [n_layers + 1]: layer l's parts are parts[part0[l] .. part0[l+1]) */
    layer_part *parts;
    weight output_w;              /* on devs[output_dev] */
    void *output_packed;          /* output_w.data when that device packed it, else NULL */
    const float *output_norm_w;
    const float *output_norm_b_w;
    const float *output_b_w;      /* output_b on devs[output_dev] (a decoder's logits_bias), or NULL */
    const float *rope_scale_w[IFLOW_MAX_DEVICES];
    int split;                    /* some layer has several parts */
    int own_dev;                  /* one process per device (comm.h): the plan device whose parts this
                                   * process places and computes; -1: all of them */
    int pass;                     /* rows of one forward pass of iflow_ctx_eval, >= MAX_BATCH (place.c's pass_rows) */

    /* a split model (a directory of iflow-partition --split, split.h): layers is NULL, and each
     * plan device's slices come from its own file */
    struct iflow_plan_s *split_plan;                 /* NULL for a model from one shard        */
    char *split_dir;
    iflow_shard *split_shards[IFLOW_MAX_DEVICES];    /* [plan devices] (only own_dev's when set); the first is also shard */
    layer_weights *split_layers;                     /* [plan devices][n_layers]: device i's slices of layer l */

    /* adapters a step's sequence may ask for (iflow_model_add_adapter; lora_bind.c owns them) */
    int n_adapters;
    low_rank *adapters;           /* [n_adapters][n_layers][LR_COUNT]: adapter a (from 1) at a - 1 */
};

/* The delta of matrix i (LR_*) of layer L for adapter a (1 .. n_adapters): rank 0 for none. */
static inline const low_rank *iflow_adapter_delta(const iflow_model *m, int a, int L, int i)
{
    return &m->adapters[((size_t)(a - 1) * (size_t)m->hp.n_layers + (size_t)L) * LR_COUNT + (size_t)i];
}

/* Every low-rank delta of layer L with a rank, its own (iflow_model_add_lora) and each
 * adapter's: fn(user, i, delta) with i its matrix (LR_*), when fn is not NULL. Returns how many
 * there are (lora_bind.c). */
int iflow_layer_deltas(const iflow_model *m, int L, void (*fn)(void *user, int i, const low_rank *d), void *user);

/* forward.c: the pieces of a layer, shared with seq2seq.c (an encoder-decoder's forward pass).
 * Each runs on device d over T rows and returns 0 or a negative IFLOW_E* code. */
/* The block norm of T rows of n: RMSNorm, or LayerNorm with its bias b. */
int iflow_norm_rows(const iflow_model *m, iflow_device *d, float *y, const float *x, const float *w, const float *b, int T,
                    int n);
/* y[t] = W x[t] (+ b) for T rows: W [N][K], x at stride ldx, y at stride ldy. */
int iflow_linear_rows(iflow_device *d, float *y, int ldy, weight W, const float *b, const float *x, int ldx, int T, int N,
                      int K);
/* A sub-block's input: the norm (w, b) of x into xb, or, with post_ln, x itself: *in. */
int iflow_block_in(const iflow_model *m, iflow_device *d, float *x, float *xb, const float *w, const float *b, int T,
                   const float **in);
/* A sub-block's output xb added into x and, with post_ln, the norm (w, b) of the sum. */
int iflow_block_out(const iflow_model *m, iflow_device *d, float *x, const float *xb, const float *w, const float *b, int T);
/* The FFN's hidden rows of F columns: gated, act(gate(in)) * up(in) into gate (up: scratch);
 * plain, act(up(in)) into gate; activation silu, gelu_tanh, gelu or relu. iflow_ffn_hidden() is
 * iflow_ffn_linears() then iflow_ffn_act() (or one fused op where the device has it), the two
 * halves apart for what goes between them (a run-time LoRA delta). */
int iflow_ffn_hidden(const iflow_hparams *hp, iflow_device *d, const layer_weights *w, const float *in, int T, int F,
                     float *gate, float *up);
/* gated: gate(in) into gate, up(in) into up; plain: up(in) into gate. */
int iflow_ffn_linears(const iflow_hparams *hp, iflow_device *d, const layer_weights *w, const float *in, int T, int F,
                      float *gate, float *up);
/* act(gate) * up into gate (gated), act(gate) into gate (plain; up unused). */
int iflow_ffn_act(const iflow_hparams *hp, iflow_device *d, float *gate, float *up, int T, int F);

/* moe.c: a mixture-of-experts FFN (n_experts > 0) of T rows in (normed) into out [T][dim]
 * (which may be in): the router's choice of experts, each expert over the rows that chose it,
 * their outputs weighted and summed, and the shared expert's (w's gate, up and down) added. On a
 * device whose memory is the host's; *scratch is the caller's, grown on demand (NULL at first,
 * freed with iflow_moe_scratch_free). The experts' inputs go to context c's observer as layer
 * `layer`'s (observe.h). */
typedef struct iflow_moe_scratch iflow_moe_scratch;
int  iflow_moe_ffn(const iflow_hparams *hp, const iflow_ctx *c, int layer, iflow_device *d,
                   iflow_moe_scratch **scratch, const layer_weights *w, const float *in, int T, float *out);
void iflow_moe_scratch_free(iflow_moe_scratch *s);

/* 1 if this process computes the parts of (plan) device dev: the others' parts of a model opened
 * for one device (iflow_model_open_device) are described but hold no weights and never run. */
static inline int iflow_dev_is_mine(const iflow_model *m, int dev) { return m->own_dev < 0 || dev == m->own_dev; }

/* model.c: what every process of a plan must agree on (comm.h): a digest of the source of a split
 * model's files, or of a whole model's meta record. */
uint64_t iflow_model_identity(const iflow_model *m);

/* place.c: the placement every model starts with (every layer whole on the context's CPU). */
int  iflow_place_on_host(iflow_model *m);
void iflow_model_free_lora(iflow_model *m); /* lora_bind.c: the layers' low_rank arrays, at close */
void iflow_unplace(iflow_model *m);

#endif
