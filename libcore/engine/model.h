/*
 * model.h -- a transformer (decoder-only, an encoder, or an encoder-decoder: block layout) assembled
 * from atomic blocks, and its inference context (an encoder-decoder's is seq2seq.h's).
 *
 * The engine branches on blocks (norm, activation, ffn, position, rope layout, biases, tied
 * output), never on a model's name. The blocks and hyperparameters come from the resolved spec
 * stored in a shard's meta record (see spec.h); iflow_model_tensors() lists the tensors those
 * blocks need, so the converter checks a checkpoint against the same list the engine binds.
 *
 * Contract
 *   iflow_model_open() opens a shard (path or "-"), parses its meta, binds every tensor it needs
 *   (checking names, shapes and types: the error names the tensor) and loads the tokenizer (an
 *   encoder-decoder's two when its shard carries a target side: tokenizer.h). The
 *   model owns the shard; weights are used in place (mmap) and never copied. Given a directory
 *   written by iflow-partition --split (split.h), it opens one file per device of the plan in
 *   it, checks that they belong together (a missing or foreign file is refused, named), and
 *   binds each device's slices from its own file: such a model runs only as its plan places it
 *   (iflow_model_split_plan()), and until placed each plan device is the context's CPU.
 *   iflow_model_place() puts the weights on devices (libcore/device); without it everything
 *   runs on the CPU as the mapping holds it.
 *   An iflow_ctx owns a KV cache of n_ctx positions and scratch for one batch of tokens, on the
 *   devices of the model's placement; many contexts may share one model placed on the CPU
 *   (each on its own thread); a device other than the CPU serves one thread at a time. iflow_ctx_eval() runs tokens at the
 *   next positions: T > 1 is a prefill (matrix products over the whole batch), T == 1 a decode
 *   step. Arithmetic is F32 over F32/F16/BF16 weights, or block-quantized ones
 *   (kernels/cpu/quant.h) used in place without dequantizing the model.
 */
#ifndef IFLOW_MODEL_H
#define IFLOW_MODEL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "include/iflow.h"
#include "libcore/device/device.h"
#include "libcore/formats/shard.h"
#include "libcore/tokenizers/tokenizer.h"

enum {
    IFLOW_ROPE_SCALING_NONE = 0,
    IFLOW_ROPE_SCALING_LINEAR = 1,
    IFLOW_ROPE_SCALING_LLAMA3 = 2,
    IFLOW_ROPE_SCALING_YARN = 3,
    IFLOW_ROPE_SCALING_LONGROPE = 4
};

#define IFLOW_MAX_ROPE_PAIRS 256 /* longrope's factor lists: rope_dim / 2 at most this */
#define IFLOW_MAX_EOS 8
#define IFLOW_MAX_BANNED 8
#define IFLOW_MAX_EXPERTS 256     /* hparams n_experts */

/* GELU: the exact (erf) form; RELU2: relu(x)^2 (Arcee's), plain FFNs only */
enum {
    IFLOW_ACT_SILU = 0,
    IFLOW_ACT_GELU_TANH = 1,
    IFLOW_ACT_GELU = 2,
    IFLOW_ACT_RELU = 3,
    IFLOW_ACT_RELU2 = 4,
    IFLOW_ACT_SWIGLU_OAI = 5 /* gpt-oss: (min(u, L) .. clamped to +-L + 1) * g' sigmoid(alpha g'), g' = min(g, L) */
};
enum { IFLOW_NORM_RMS = 0, IFLOW_NORM_LAYER = 1 };   /* block norm */
enum { IFLOW_FFN_GATED = 0, IFLOW_FFN_PLAIN = 1 };   /* block ffn: down(act(gate) * up), down(act(up)) */
/* block position: rope; learned rows; a sinusoidal table (sin in the first half of a row, cos in
 * the second); relative position buckets with a learned bias per head (T5) */
enum { IFLOW_POS_ROPE = 0, IFLOW_POS_LEARNED = 1, IFLOW_POS_SINUSOIDAL = 2, IFLOW_POS_RELATIVE = 3 };
/* block layout: decoder-only; an encoder alone (pooled embeddings); an encoder-decoder (a source
 * encoded once, a target decoded against it through cross-attention: seq2seq.h) */
enum { IFLOW_LAYOUT_DECODER = 0, IFLOW_LAYOUT_ENCODER = 1, IFLOW_LAYOUT_ENCODER_DECODER = 2 };
enum { IFLOW_POOL_CLS = 0, IFLOW_POOL_MEAN = 1 };      /* hyperparameter pooling (encoders) */

typedef struct {
    /* shape */
    int dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size, max_seq;
    /* blocks */
    int rope_layout;          /* IFK_ROPE_HALF or IFK_ROPE_INTERLEAVED */
    int activation;           /* IFLOW_ACT_*: of the gated FFN's gate (the plain FFN's up) */
    int norm, ffn, position;  /* IFLOW_NORM_*, IFLOW_FFN_*, IFLOW_POS_* */
    float embed_scale;        /* embedding rows are multiplied by it (block embedding = scaled:
                                 sqrt(dim), Gemma's; else 1), times the hyperparameter
                                 embed_multiplier (Granite's embedding_multiplier) */
    int attn_bias, mlp_bias, tie_embeddings;
    int qkv_bias;             /* biases on q, k and v (attn_bias adds the output's: o too) */
    int sliding_window;       /* a query attends to the last sliding_window positions; 0: all */
    int window_pattern;       /* > 1: layer l is windowed unless (l + 1) % window_pattern == 0
                                 (Gemma 2 and 3's local/global layers); else every layer */
    float attn_scale;         /* scores are q.k * attn_scale: 1/sqrt(query_pre_attn_scalar, or
                                 head_dim when that hyperparameter is 0), or the hyperparameter
                                 attn_multiplier itself when > 0 (Granite's) */
    float attn_softcap;       /* > 0: scores become cap * tanh(score / cap) (Gemma 2) */
    float logit_softcap;      /* > 0: the output logits likewise */
    int post_norms;           /* an RMSNorm on the attention's and the FFN's output before the
                                 residual add (attn_post_norm, ffn_post_norm; Gemma 2) */
    int qk_norm;              /* an RMSNorm over each head of q and of k before rope (q_norm,
                                 k_norm [head_dim]; Gemma 3) */
    int qk_norm_late;         /* with qk_norm: after the rotary embedding instead of before it
                                 (the hyperparameter qk_norm_after_rope: Hunyuan's) */
    int qk_norm_full;         /* with qk_norm: over the whole projection instead (q_norm
                                 [n_heads * head_dim], k_norm [n_kv_heads * head_dim]; OLMoE) */
    float rope_theta_local;   /* > 0: the rope base of windowed layers (Gemma 3) */
    int parallel_residual;    /* x + attn(n1(x)) + ffn(n2(x)), both reading the layer's input
                                 (GPT-NeoX, GPT-J); else the FFN reads x + attn(n1(x)) */
    int norm_no_bias;         /* the hyperparameter norm_bias = false: LayerNorms without a bias
                                 (Cohere's); see iflow_norm_biased */
    int norm_no_weight;       /* the hyperparameter norm_weight = false: LayerNorms without
                                 parameters at all (OLMo's): no attn_norm, ffn_norm, output_norm */
    float clip_qkv;           /* > 0: q, k and v clamped to [-clip_qkv, clip_qkv] after their
                                 projections (and q/k norms): OLMo's, OLMoE's */
    int nope_pattern;         /* N > 0: layer l has no rotary positions when (l + 1) % N == 0
                                 (SmolLM3's NoPE layers, Cohere 2's global ones); 0: every layer */
    int post_norms_only;      /* the hyperparameter pre_norms = false: each sub-block reads x
                                 itself, not a norm of it (no attn_norm, ffn_norm), and post_norms
                                 normalize its output (OLMo 2) */
    float residual_scale;     /* each sub-block's output times it before the residual add
                                 (Granite's residual_multiplier; 0 or 1: none) */
    float logit_scale;        /* the output logits times it (Cohere's logit_scale, 1 / Granite's
                                 logits_scaling; 0 or 1: none) */
    /* a mixture of experts (Mixtral, Qwen2/3-MoE): each layer's FFN is n_experts FFNs of
       expert_ffn_dim columns (ffn_gate.E, ffn_up.E, ffn_down.E) and a router [n_experts][dim]
       (ffn_router); a row goes through the n_experts_used experts of largest softmax(router x),
       their outputs weighted by those probabilities (renormalized to sum 1 with expert_norm) */
    int n_experts;            /* 0: a dense FFN */
    int n_experts_used;
    int expert_ffn_dim;
    int expert_norm;
    int shared_expert;        /* the layer's dense FFN (ffn_gate, ffn_up, ffn_down of ffn_dim
                                 columns) runs beside the experts, added to their sum (Qwen2-MoE) */
    int shared_expert_gate;   /* its output scaled by sigmoid(ffn_shexp_gate . x) (ffn_shexp_gate
                                 [1][dim]) */
    int shared_ffn_dim;       /* the shared expert's columns (GLM-4.5, DeepSeek: n_shared_experts x
                                 moe_intermediate_size); ffn_dim unless the spec says */
    int moe_dense_first;      /* the first layers that have a dense FFN of ffn_dim instead
                                 (DeepSeek's and GLM-4.5's first_k_dense_replace); see iflow_layer_moe */
    int router_sigmoid;       /* the experts' scores are sigmoid(router x), not its softmax */
    int router_bias;          /* a bias ffn_router_bias [E] added to the scores for the choice
                                 only (DeepSeek-V3's e_score_correction_bias) */
    int router_groups, router_topk_groups; /* experts in router_groups groups: the choice is
                                 among the router_topk_groups groups of largest score: the sum of
                                 their router_group_top best choice scores (DeepSeek-V3: 2; V2: 1) */
    int router_group_top;
    float expert_scale;       /* the chosen experts' weights times it (routed_scaling_factor; 0: 1) */
    int expert_bias;          /* each expert's gate, up and down have biases (ffn_gate_b.E,
                                 ffn_up_b.E [expert_ffn_dim], ffn_down_b.E [dim]: gpt-oss) */
    int router_logit_bias;    /* ffn_router_b [n_experts] is added to the router's logits (gpt-oss),
                                 choice and weights alike (router_bias is the choice's alone) */
    int attn_sinks;           /* attn_sinks [n_heads]: a logit each head's softmax counts, with no
                                 value (gpt-oss's sinks; CPU only) */
    float swiglu_alpha, swiglu_limit; /* activation swiglu_oai: 1.702 and 7 in gpt-oss */
    /* multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi K2), kv_lora_rank R > 0: one latent
     * row a position, c = norm(wkv_a x)[R] beside a shared rotated key k_pe [rope_dim], is what
     * the cache keeps (n_kv_heads 1, head_dim R + rope_dim, stored [k_pe | c]; values are its
     * last R), each head's query reads it through wk_b (absorbed: q_nope wk_b[h] -> [R]) and
     * its output leaves through wv_b[h] ([R] -> [v_head_dim]). The scores' scale is
     * (qk_nope_dim + rope_dim)^-1/2, as the expanded heads' would be. */
    int kv_lora_rank;         /* R (0: plain attention) */
    int q_lora_rank;          /* the queries' low-rank width (wq_a, q_a_norm; 0: wq reads x) */
    int qk_nope_dim;          /* each query head's unrotated dimensions (then rope_dim rotated) */
    int v_head_dim;           /* each head's value width (wo reads n_heads * v_head_dim) */
    /* encoders (block layout = encoder: every position of the input attends to every other, the
       output is the last hidden states pooled into one vector, there is no LM head) */
    int layout;               /* IFLOW_LAYOUT_* */
    int post_ln;              /* x = n(x + sub(x)) after each sub-block (BERT), not x + sub(n(x)) */
    int embed_norm;           /* a norm of the embedding rows (embd_norm, embd_norm_b) */
    int token_types;          /* rows of tok_type_embd (BERT's segments; row 0 is added); 0: none */
    int pooling;              /* IFLOW_POOL_*: the first position's state, or the mean of all */
    int normalize;            /* the pooled vector is scaled to unit length */
    /* encoder-decoders (block layout = encoder-decoder: n_layers is the decoder's) */
    int n_enc_layers;         /* the encoder's layers (enc.blk.L.*; same shape as the decoder's) */
    int final_norm;           /* a norm after each stack (enc.output_norm, output_norm); decoders
                                 always have output_norm; off for post-LN stacks (Marian) */
    int decoder_start;        /* the first token of every target (-1: none) */
    int pad;                  /* the padding token (-1: none) */
    int pos_offset;           /* position p reads sinusoidal row p + pos_offset (M2M100: 2) */
    int pos_endpoint;         /* sinusoidal frequencies theta^-j for j evenly spaced over [0, 1]
                                 (fairseq, M2M100) rather than [0, 1) (Marian, Vaswani et al.) */
    int rel_buckets, rel_max_distance; /* position = relative: T5's buckets */
    int output_rescale;       /* the final hidden states times dim^-1/2 before the output matrix
                                 (T5 with tied embeddings) */
    int logits_bias;          /* a bias row added to the logits (output_b [1][vocab]: Marian's
                                 final_logits_bias, Phi-2's lm_head.bias) */
    /* numbers */
    float norm_eps, rope_theta;
    int rope_dim;             /* rotated dimensions per head (head_dim unless partial; a spec's
                                 rope_dim 0 means head_dim * rope_fraction, rounded down) */
    int rope_scaling;         /* IFLOW_ROPE_SCALING_* */
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_ctx;
    float rope_beta_fast, rope_beta_slow; /* yarn: the ramp between extrapolated (fast) and
                                 interpolated (slow) pairs, in rotations over rope_orig_ctx */
    int rope_truncate;        /* yarn: the ramp's ends rounded outward to whole pairs */
    int rope_n_factors;       /* longrope (Phi-3.5, Phi-4-mini): each pair's frequency divided by
                                 rope_short[i], or by rope_long[i] in a cache whose context exceeds
                                 rope_orig_ctx (iflow_kv_set_context); rope_dim / 2 of each */
    int rope_factor_tensors;  /* longrope's factors are the tensors rope_short and rope_long
                                 [rope_dim / 2] (a GGUF's rope_factors_short/long), not lists */
    float rope_short[IFLOW_MAX_ROPE_PAIRS], rope_long[IFLOW_MAX_ROPE_PAIRS];
    float rope_rot_scale;     /* the rotated dimensions of q and k times it after the rotation: a
                                 yarn or longrope attention factor on a partial rotation (1: none;
                                 on a whole head it is folded into attn_scale instead) */
    int rope_freqs;           /* a tensor rope_freqs [rope_dim/2] divides each pair's frequency,
                                 after rope_scaling (llama.cpp's rope_freqs.weight: a Llama 3.1
                                 GGUF's llama3 scaling, which its metadata does not carry) */
    /* special tokens (-1: none) */
    int bos, eos[IFLOW_MAX_EOS], n_eos;
    /* tokens generation never picks (hyperparameter banned_tokens: a list of one-token lists, as
       transformers' bad_words_ids; Marian's [[pad]]): their logits are -inf before the softmax of
       an encoder-decoder's greedy and beam search */
    int banned[IFLOW_MAX_BANNED], n_banned;
    /* the token forced as the last one the length limit allows (hyperparameter forced_eos:
       transformers' forced_eos_token_id, Marian's </s>; -1: none), in an encoder-decoder's greedy
       and beam search */
    int forced_eos;
} iflow_hparams;

/* 1 when layer l's FFN is a mixture of experts (n_experts > 0, past the moe_dense_first dense ones). */
static inline int iflow_layer_moe(const iflow_hparams *hp, int l)
{
    return hp->n_experts > 0 && l >= hp->moe_dense_first;
}
/* 1 when the blocks' norms have biases (norm = layer, unless norm_bias = false). */
static inline int iflow_norm_biased(const iflow_hparams *hp)
{
    return hp->norm == IFLOW_NORM_LAYER && !hp->norm_no_bias && !hp->norm_no_weight;
}
/* 1 when layer l rotates q and k (position = rope, and not one of nope_pattern's layers). */
static inline int iflow_layer_rotates(const iflow_hparams *hp, int l)
{
    return hp->position == IFLOW_POS_ROPE && !(hp->nope_pattern > 0 && (l + 1) % hp->nope_pattern == 0);
}

/* Read {"blocks": {...}, "hparams": {...}} (a resolved spec). A block choice the engine lacks
 * gives IFLOW_EUNSUPPORTED naming the block; `what` names the source in messages. */
int iflow_hparams_from_json(iflow_hparams *hp, const json_t *resolved, const char *what);

typedef struct {
    char    name[48];
    int     n_dims;
    int64_t shape[2];
    int     is_vector;   /* norms and biases: kept F32 by the converter */
} iflow_tensor_req;

/* The expert of tensor `name` (blk.L.ffn_gate.E, ffn_up.E, ffn_down.E: E), or -1 for a tensor
 * that is no expert's. */
int iflow_tensor_expert(const char *name);

/* The tensors the engine needs for hp, in file order. *reqs is malloc'd; caller frees. */
int iflow_model_tensors(const iflow_hparams *hp, iflow_tensor_req **reqs, size_t *n);

/* Tensor record t (of file `path`) has the shape r asks for and a type the engine can use
 * there; else IFLOW_ESHAPE naming the tensor and the file. */
int iflow_tensor_check(const iflow_tensor_req *r, const iflow_shard_rec *t, const char *path);

typedef struct iflow_model iflow_model;

/* flags: IFLOW_MODEL_NO_VERIFY (include/iflow.h) skips payload checksums at open */

int  iflow_model_open(iflow_model **out, const char *path, int flags);
/* A model for the process that computes plan device dev, one of a plan's processes (comm.h;
 * dev < 0: iflow_model_open()). Given a split directory, it opens DIR/plan.ini and DIR/device-dev.ifs
 * only, so that a machine needs only its own file; that the processes' files belong together is
 * checked when the context joins them (iflow_ctx_set_comm). Given one shard, it binds the whole
 * model (the mapping reads only what is used). Either way placement puts only device dev's parts
 * (and the output, when it is dev's) on their device; the other parts stay empty, and such a model
 * runs only as process dev of a comm. */
int  iflow_model_open_device(iflow_model **out, const char *path, int flags, int dev);
/* The plan device a model was opened for (iflow_model_open_device), or -1. */
int  iflow_model_own_device(const iflow_model *m);
void iflow_model_close(iflow_model *m);

/* Apply LoRA adapter l (libcore/formats/lora.h) at run time: each matrix it changes computes
 * W x + s B (A x), W as the shard holds it (quantized or not), A and s B in F16 on the host.
 * Its tensor names are read through the spec the shard was converted with (meta.spec, found as
 * NAME.ini in spec_dirs), in the adapter's naming (a PEFT adapter's Hugging Face names or a
 * GGUF adapter's), q/k rows permuted where that naming's rotary order is not the shard's.
 * Matrices that may change: q, k, v, o, gate, up, down of a decoder-only model; several
 * adapters add up. Every delta must find its matrix with its shape, else nothing changes and
 * the error names the delta. The model is placed on the host again: a placement that puts a
 * layer with a delta elsewhere than on a host device, or splits it, is refused afterwards. */
struct iflow_lora;
int iflow_model_add_lora(iflow_model *m, const struct iflow_lora *l, const char *const *spec_dirs, size_t n_dirs);
/* Adapter l, the same way, but for the sequences that ask for it only (iflow_step_seq.adapter:
 * multi-LoRA serving, one model and many adapters in one batch): returns its number (1, 2, ...,
 * in the order added; at most IFLOW_MAX_ADAPTERS), or < 0 with nothing changed. A sequence's
 * adapter adds to those of iflow_model_add_lora, which every sequence has. */
#define IFLOW_MAX_ADAPTERS 64
int iflow_model_add_adapter(iflow_model *m, const struct iflow_lora *l, const char *const *spec_dirs, size_t n_dirs);
int iflow_model_n_adapters(const iflow_model *m);
/* Bytes the run-time adapters' deltas take (every sequence's and the numbered ones: a and b in
 * F16), for memory plans; 0 without any. */
uint64_t iflow_model_lora_bytes(const iflow_model *m);
/* 1 when an adapter was applied at run time, or added for sequences to ask for (the model then
 * runs on the CPU). */
int iflow_model_has_lora(const iflow_model *m);
const iflow_hparams *iflow_model_hparams(const iflow_model *m);
/* The tokenizer that encodes text for the model (an encoder-decoder's source side), or NULL
 * when the shard has none. */
const iflow_tokenizer *iflow_model_tokenizer(const iflow_model *m);
/* The tokenizer of the ids the model generates: an encoder-decoder's target side when the shard
 * carries one of its own (Marian's target.spm), else iflow_model_tokenizer()'s. */
const iflow_tokenizer *iflow_model_target_tokenizer(const iflow_model *m);
const iflow_shard *iflow_model_shard(const iflow_model *m);
/* The plan a split model was cut by (its directory's plan.ini), or NULL for a model from one
 * shard. iflow_model_place_plan() takes only a plan of the same partition (device names and
 * threads may differ); iflow_model_place() refuses a split model. */
struct iflow_plan_s;
const struct iflow_plan_s *iflow_model_split_plan(const iflow_model *m);
/* 1 if id is one of the model's end-of-sequence tokens. */
int iflow_model_is_eos(const iflow_model *m, int32_t id);
/* logits [vocab] of one position with the model's banned tokens (hyperparameter banned_tokens)
 * set to -inf, so that no search picks them. */
void iflow_model_ban(const iflow_model *m, float *logits);
/* logits [vocab] of the last token a length limit allows: with the hyperparameter forced_eos,
 * -inf for every token but that one (0), as transformers' ForcedEOSTokenLogitsProcessor; 1 then,
 * 0 (logits untouched) for a model without one. */
int iflow_model_force_eos(const iflow_model *m, float *logits);
/* The shape and special tokens, for API users (include/iflow.h). */
void iflow_model_get_info(const iflow_model *m, iflow_model_info *info);
/* Bytes of weights read per decoded token (all matrices but the embedding table, each expert of
 * a mixture as n_experts_used / n_experts of its bytes; for a split model, what its devices
 * hold, KV heads replicated on several devices counted on each). */
uint64_t iflow_model_decode_bytes(const iflow_model *m);
/* The CPU kernel path this process computes with, chosen from cpuid: "scalar", "avx2",
 * "avx512" or "avx512gfni" (kernels/cpu/kernels.h). A static string. */
const char *iflow_kernel_path(void);
/* on: the CPU's matrix products meet the activations in F32 instead of rounding them per token
 * (to int8 / int16 for quantized weights, kernels/cpu/quant.h's ifk_set_qx_f32; to BF16 for F16
 * and BF16 weights on CPUs with AVX512_BF16, kernels.h's ifk_bf16_dot): the reference the fast
 * paths are measured against, slower. Process-wide; set it before computing. */
void iflow_kernel_set_f32_activations(int on);
/* How the CPU's quantized products meet the activations (kernels/cpu/quant.h's modes), by name:
 *   "int"   the default: rounded per token to int8, or to int16 for Q6 and Q5 (and for Q8 on
 *           CPUs without AVX512_VNNI); Q8 on int8 after each token's 8 largest were taken out and
 *           multiplied in F32: within 0.2 % of F32 activations' perplexity on the models
 *           measured (docs/QUANTIZATION.md);
 *   "int8"  as "int", and int8 for Q6 and Q5 too (on CPUs with AVX512_VNNI): faster prefill, up
 *           to 0.6 % off F32 activations' perplexity for them;
 *   "int16" as "int", but int16 for Q8 too (the default until 2026-11-28): Q8 closer to F32
 *           activations (KL divergence ~2 times lower), prefill ~0.7 times as fast;
 *   "f32"   iflow_kernel_set_f32_activations(1).
 * Returns 0, or -1 (nothing changed) for another name. Process-wide; set it before computing. */
int iflow_kernel_set_activations(const char *mode);

/* ---- placement: which device computes what ------------------------------------------------
 *
 * A placement is data: a list of devices, the device of each layer, and the device of the
 * output (final norm and output matrix). Token embeddings are looked up on the host and the
 * rows sent to the first layer's device (only T x dim floats cross, and the table, often the
 * largest matrix, never takes device memory). The hidden state crosses between devices once
 * per boundary. A NULL device is "the context's CPU": each context runs those layers on its
 * own CPU device with the thread count given to iflow_ctx_open(). A model that was never
 * placed runs everything there. (Head-group placement within a layer will extend this.) */
#define IFLOW_MAX_DEVICES 16

typedef struct {
    int           n_devices;
    iflow_device *devices[IFLOW_MAX_DEVICES]; /* borrowed (NULL: the context's CPU); close after the model */
    const int    *layer_device;               /* [n_layers]: an index into devices                       */
    int           output_device;              /* index of the device computing the logits               */
} iflow_placement;

/* Bytes a placement needs on each device for one context of n_ctx positions. Weights on a
 * host-memory device are used in place from the mapping and count as 0 there. */
typedef struct {
    uint64_t weights, kv, scratch;
} iflow_device_bytes;

/* Fill need[0..p->n_devices) for a context of n_ctx (<= 0: the model's max_seq) positions; check
 * that the placement matches the model (layer count, device indices) and that every weight has
 * a kernel on its device (IFLOW_EUNSUPPORTED naming the tensor, its type and the device). */
int iflow_placement_bytes(const iflow_model *m, const iflow_placement *p, int n_ctx, iflow_device_bytes *need);

/* Put the model on the devices of p: check it as iflow_placement_bytes does, check that each
 * device has the memory (IFLOW_ENOMEM naming the device, what it needs and what it lacks,
 * before anything is copied), then copy each weight to its device. Call before opening
 * contexts; a previous placement is released. On failure the model is left as it was. */
int iflow_model_place(iflow_model *m, const iflow_placement *p, int n_ctx);

/* Place m as a partition plan says (plan.h): devices[i] is the opened device of the plan's
 * device i (NULL: the context's CPU). Checked as iflow_model_place (and the plan against the
 * model: iflow_plan_check); a layer split over several devices sums its parts' attention
 * outputs and FFN outputs across them (an all-reduce through host memory, in part order). */
struct iflow_plan_s;
int iflow_model_place_plan(iflow_model *m, const struct iflow_plan_s *plan, iflow_device *const *devices, int n_ctx);
/* 0 if every layer the plan splits over several devices has blocks that can be split (no post
 * norms, no parallel residual), else IFLOW_EUNSUPPORTED naming the first layer that cannot: what
 * placement would refuse, for the partition tool to refuse first. */
int iflow_plan_splittable(const struct iflow_plan_s *plan, const iflow_hparams *hp);

/* 1 if every device of m's placement computes in host memory (the CPU). */
int iflow_model_host_only(const iflow_model *m);

/* A placement of the first n_first layers on device 0 and the rest on device 1, the output on
 * device 0 when every layer is there (llama.cpp's --gpu-layers). layer_device: [n_layers]. */
void iflow_placement_first_n(iflow_placement *p, int *layer_device, int n_layers, iflow_device *first,
                             int n_first, iflow_device *rest);

typedef struct iflow_ctx iflow_ctx;

/* n_ctx <= 0: the model's max_seq. n_threads <= 0: all cores. The cache is IFK_KV_F32;
 * iflow_ctx_open_kv takes its type (IFK_KV_F32, IFK_KV_F16 or IFK_KV_Q8, kernels/cpu/kvcache.h). */
int  iflow_ctx_open(iflow_ctx **out, const iflow_model *m, int n_ctx, int n_threads);
int  iflow_ctx_open_kv(iflow_ctx **out, const iflow_model *m, int n_ctx, int n_threads, int kv_type);
void iflow_ctx_close(iflow_ctx *c);
/* Forget every position (the cache is reused). */
void iflow_ctx_reset(iflow_ctx *c);
int  iflow_ctx_n_past(const iflow_ctx *c);
int  iflow_ctx_n_ctx(const iflow_ctx *c);
int  iflow_ctx_n_vocab(const iflow_ctx *c);
/* Run n tokens at positions n_past .. n_past+n-1. logits: NULL; or [vocab] for the last token;
 * or, with all_logits, [n][vocab]. IFLOW_ERANGE if the cache would overflow or an id is out of
 * the vocabulary. A context over several processes (iflow_ctx_set_comm) runs it as steps of its
 * own sequence, every process calling it alike and receiving the logits. */
int  iflow_ctx_eval(iflow_ctx *c, const int32_t *ids, int n, float *logits, int all_logits);
/* An encoder (block layout = encoder) over one input of n <= IFLOW_MAX_STEP tokens, every
 * position seeing every other: out [dim] = its last hidden states pooled (the first position's,
 * or their mean) and, with hyperparameter normalize, scaled to unit length. Each call is on
 * its own (the context's positions are reset). A decoder gives IFLOW_EUNSUPPORTED, as does
 * iflow_ctx_eval on an encoder. */
int  iflow_ctx_embed(iflow_ctx *c, const int32_t *ids, int n, float *out);
/* ---- steps of many sequences over a paged KV cache (the batch engine, libcore/serving) -----
 *
 * An iflow_kv is a paged KV cache on the devices of the model's placement (open it after
 * placing the model): per layer part, pools of n_blocks blocks of `block` positions, of type
 * IFK_KV_F32, IFK_KV_F16 or IFK_KV_Q8 (kernels/cpu/kvcache.h has the layout). Which blocks a
 * sequence uses is its block table, kept by the caller. iflow_ctx_step runs one forward step
 * for several sequences at once: all their tokens go through each matrix product together
 * (the weights are read once per step), attention runs per sequence over its own blocks.
 * A sequence's results do not depend on the other sequences of the step (the kernels are
 * batch-invariant), so a request gives the same tokens alone or in any batch. */
typedef struct iflow_kv iflow_kv;

/* Tokens in one step and in one forward pass of iflow_ctx_eval: a context's pass,
 * IFLOW_MAX_STEP (include/iflow.h), or 512 where no layer and not the output runs in host
 * memory (a GPU placement; over several processes IFLOW_MAX_STEP); IFLOW_PASS asks for another. */
int  iflow_ctx_step_tokens(const iflow_ctx *c);

int  iflow_kv_open(iflow_kv **out, const iflow_model *m, int type, int block, int n_blocks);
void iflow_kv_close(iflow_kv *kv);
/* Bytes one block takes over all layers (K and V) for this model's placement. */
uint64_t iflow_kv_block_bytes(const iflow_model *m, int type, int block);
/* Context shift of one sequence (block table `table`, n_past positions cached), in every
 * layer: keep positions 0 .. keep - 1, drop the next `discard`, move the rest down by discard
 * with their keys rotated back (kernels/cpu/kvcache.h's ifk_kv_shift). The sequence then has
 * n_past - discard positions. IFLOW_EUNSUPPORTED on a device without the operation. */
int iflow_kv_shift(iflow_kv *kv, const int32_t *table, int n_past, int keep, int discard);
/* Block dst = block src in every layer (K and V): a sequence that forks (beam search) gets its
 * own copy of a partly filled block it shares. */
int iflow_kv_copy_block(iflow_kv *kv, int dst, int src);
/* The context one sequence of cache kv may reach: with longrope scaling, a context past the
 * model's original one (rope_orig_ctx) rotates by the long factors, else by the short ones, as
 * llama.cpp chooses by its n_ctx per sequence (iflow_kv_open takes the cache's whole capacity).
 * Set it before anything is stored. */
void iflow_kv_set_context(iflow_kv *kv, int n_ctx);
/* Tests: out [n_kv_heads * head_dim] = layer's K (value 0) or V (value 1) row at position pos of
 * the sequence with block table `table`, as F32 (latent attention: its one row either way). Host
 * pools only (else IFLOW_EUNSUPPORTED). */
int iflow_kv_read_row(const iflow_kv *kv, int layer, int value, const int32_t *table, int pos, float *out);
/* 1 if every device of kv can shift; else 0 and *device (if not NULL) names one that cannot. */
int iflow_kv_can_shift(const iflow_kv *kv, const char **device);

typedef struct {
    const int32_t *ids;      /* [n] tokens at positions pos0 .. pos0 + n - 1               */
    int n, pos0;
    const int32_t *table;    /* block ids covering positions 0 .. pos0 + n - 1 (host)       */
    float *logits;           /* [n_out][vocab] host: the logits after each of the last n_out
                              * tokens; NULL: none                                          */
    int32_t *next;           /* or, with logits NULL: [n_out] the most likely next token (the
                              * lowest id among equal logits) after each of them, found on the
                              * output device so that only the ids are copied back; NULL: none */
    int n_out;               /* rows of output (<= n): 0 means 1, the last token's           */
    int adapter;             /* the model's adapter this sequence computes with (1 ..
                              * iflow_model_n_adapters), or 0: none                          */
} iflow_step_seq;

/* A context with scratch but no cache of its own, for iflow_ctx_step. */
int  iflow_ctx_open_steps(iflow_ctx **out, const iflow_model *m, int n_threads);
/* One step: at most iflow_ctx_step_tokens(c) tokens in all; positions before each sequence's
 * pos0 must be in its blocks already. */
int  iflow_ctx_step(iflow_ctx *c, iflow_kv *kv, const iflow_step_seq *seqs, int n_seqs);

/* Run c's steps as process comm->rank of comm->size, one per device of the model's placement
 * (comm.h; NULL: this process computes everything). IFLOW_EINVAL when the counts differ. */
struct iflow_comm;
int  iflow_ctx_set_comm(iflow_ctx *c, struct iflow_comm *comm);

/* Run n tokens as iflow_ctx_eval and set *next to the most likely token after the last one
 * (the lowest id among equal logits), found on the output device: only the id is copied back. */
int  iflow_ctx_eval_argmax(iflow_ctx *c, const int32_t *ids, int n, int32_t *next);

/* How decode steps run when the whole model is on one device that records (CUDA graphs); the
 * results are the same in every mode (the same operations, launched otherwise):
 *   IFLOW_GRAPHS_OFF     op by op (the default);
 *   IFLOW_GRAPHS_REPLAY  a step of one sequence bringing one token (iflow_ctx_step, and
 *                        iflow_ctx_eval / iflow_ctx_eval_argmax with n = 1) is recorded once
 *                        and run again at each next position, one launch a step (the device
 *                        reads the position itself); iflow-run's default on a GPU;
 *   IFLOW_GRAPHS_ALL     that, and steps of several sequences of one token each recorded and
 *                        run as one graph each time (recording a step costs about what
 *                        launching it at once saves).
 * docs/PERFORMANCE.md, "On a GPU: decode steps recorded once, fused ops". */
enum { IFLOW_GRAPHS_OFF = 0, IFLOW_GRAPHS_ALL = 1, IFLOW_GRAPHS_REPLAY = 2 };
void iflow_ctx_set_graphs(iflow_ctx *c, int mode);

#endif
