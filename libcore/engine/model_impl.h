/*
 * model_impl.h -- the model's insides, shared by the three files of the engine and nothing
 * else: model.c (hyperparameters, binding a shard's tensors, or a split model's files), place.c (putting weights on
 * devices, by layer or by head and column ranges) and forward.c (contexts, the forward pass).
 */
#ifndef IFLOW_MODEL_IMPL_H
#define IFLOW_MODEL_IMPL_H

#include "model.h"

#define MAX_BATCH IFLOW_MAX_STEP /* tokens per forward pass; longer prompts are run in chunks */

typedef struct { const void *data; int type; } weight;   /* a matrix [rows][cols] of type */

typedef struct {
    const float *attn_norm, *ffn_norm;                       /* [dim]                       */
    const float *attn_norm_b, *ffn_norm_b;                   /* [dim] or NULL (norm = layer) */
    const float *attn_post_norm, *ffn_post_norm;             /* [dim] or NULL (post_norms)   */
    const float *q_norm, *k_norm;                            /* [head_dim] or NULL (qk_norm) */
    weight wq, wk, wv, wo;                                   /* [Q][dim] [KV][dim] x2 [dim][Q] */
    const float *bq, *bk, *bv, *bo;                          /* [Q] [KV] [KV] [dim] or NULL  */
    weight gate, up, down;                                   /* [F][dim] [F][dim] [dim][F]  */
    const float *gate_b, *up_b, *down_b;                     /* [F] [F] [dim] or NULL        */
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
    void *packed[8];              /* matrices the device packed (its pack op; freed at unplace) */
} layer_part;

struct iflow_model {
    iflow_shard *shard;
    iflow_hparams hp;
    iflow_tokenizer *tok;
    weight tok_embd;              /* [vocab][dim], in the mapping, never placed */
    weight output;                /* [vocab][dim] in the mapping (tok_embd when tied) */
    const float *output_norm;     /* [dim] in the mapping */
    const float *output_norm_b;   /* [dim] in the mapping, or NULL (norm = layer) */
    weight pos_embd;              /* [max_seq][dim] (position = learned), in the mapping, never placed */
    weight tok_type_embd;         /* [token_types][dim] (encoders with segments), likewise */
    const float *embd_norm;       /* [dim] (embed_norm), in the mapping, used on the host */
    const float *embd_norm_b;     /* [dim] or NULL */
    layer_weights *layers;        /* [n_layers] in the mapping */
    float *rope_scale;            /* [rope_dim/2] or NULL, on the host */
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
    const float *rope_scale_w[IFLOW_MAX_DEVICES];
    int split;                    /* some layer has several parts */

    /* a split model (a directory of iflow-partition --split, split.h): layers is NULL, and each
     * plan device's slices come from its own file */
    struct iflow_plan_s *split_plan;                 /* NULL for a model from one shard        */
    char *split_dir;
    iflow_shard *split_shards[IFLOW_MAX_DEVICES];    /* [plan devices]; [0] is also shard      */
    layer_weights *split_layers;                     /* [plan devices][n_layers]: device i's slices of layer l */
};

/* place.c: the placement every model starts with (every layer whole on the context's CPU). */
int  iflow_place_on_host(iflow_model *m);
void iflow_unplace(iflow_model *m);

#endif
