/*
 * footprint.h -- the bytes the engine keeps on a device: a layer part's weight slices, its KV
 * cache, a device's scratch, the output layer.
 *
 * Contract
 *   One formula for the two places that need it: iflow_model_place() (place.c) checks a
 *   placement against each device's free memory with it, and iflow-partition (partition.c)
 *   estimates plans with it, so an estimate and the check it predicts cannot drift apart.
 *   A part is query heads q0..q1-1 (the KV heads they read come along) and FFN columns
 *   f0..f1-1 of one layer; its slices are
 *       wq [nq*hd][dim]   wk, wv [nkv*hd][dim]   wo [dim][nq*hd]
 *       gate, up [nf][dim]   down [dim][nf]       + the two norms [dim] (+ biases)
 *   Quantized rows are whole blocks (iflow_tensor_nbytes). Pure functions; nothing fails.
 */
#ifndef IFLOW_FOOTPRINT_H
#define IFLOW_FOOTPRINT_H

#include <stdint.h>

#include "libcore/engine/model.h"

/* The matrices of a layer, indexing a types[] array. */
enum { IFLOW_PM_WQ, IFLOW_PM_WK, IFLOW_PM_WV, IFLOW_PM_WO, IFLOW_PM_GATE, IFLOW_PM_UP, IFLOW_PM_DOWN, IFLOW_PM_COUNT };

/* Bytes of `rows` rows of `cols` elements of a weight type; 0 when either is 0 or less. */
uint64_t iflow_matrix_bytes(int type, int64_t rows, int64_t cols);

/* The first KV head query heads q0..q1-1 read, and how many they read (0 for no heads). */
int iflow_part_kv0(const iflow_hparams *hp, int q0);
int iflow_part_kv_heads(const iflow_hparams *hp, int q0, int q1);

typedef struct {
    uint64_t attn;   /* wq, wk, wv, wo slices, the attention norm, the attention biases */
    uint64_t ffn;    /* gate, up, down slices, the FFN norm, the FFN biases             */
} iflow_part_bytes;

/* The bytes of each matrix slice of one part, out[IFLOW_PM_*] (0 for a matrix the layer has not:
 * the gate of a plain FFN); types[IFLOW_PM_*] are the layer's matrix types. */
void iflow_part_matrix_bytes(const iflow_hparams *hp, const int *types, int q0, int q1, int f0, int f1,
                             uint64_t out[IFLOW_PM_COUNT]);

/* Weight bytes of one part: its matrix slices, norms and biases. */
iflow_part_bytes iflow_part_weight_bytes(const iflow_hparams *hp, const int *types, int q0, int q1, int f0, int f1);

/* The F32 KV cache of one part holding n_kv_heads, for n_ctx positions of one sequence. */
uint64_t iflow_part_kv_bytes(const iflow_hparams *hp, int n_kv_heads, int n_ctx);

/* Rows of one forward pass of iflow_ctx_eval when neither a layer nor the output runs in host
 * memory (else IFLOW_MAX_STEP): cuBLAS's products and the prefill attention fill a GPU at 512
 * rows, not at 128. */
#define IFLOW_GPU_PASS 512

/* Floats a row of latent attention's own scratch (forward.c's s->mla): q_lora_rank + the
 * queries before their absorption, n_heads * (qk_nope_dim + rope_dim); 0 without it. */
uint64_t iflow_mla_scratch(const iflow_hparams *hp);

/* Scratch of a device that runs layers: activations of max(IFLOW_MAX_STEP, rows) tokens. */
uint64_t iflow_scratch_bytes(const iflow_hparams *hp, int rows);

/* The output matrix ([vocab][dim] of output_type) and the final norm; 0 for an encoder, which has
 * neither. */
uint64_t iflow_output_bytes(const iflow_hparams *hp, int output_type);

#endif
