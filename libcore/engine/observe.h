/*
 * observe.h -- watching the activations that enter a model's weight matrices, and collecting
 * an importance matrix from them (iflow-ppl --save-imatrix; the file is imatrix.h's).
 *
 * The hook. The forward pass calls iflow_observe() once per matrix-product input, with the
 * rows of activations x: [T][K] at stride ldx, on the host, before the product:
 *     site                  x                           the matrices that read it
 *     IFLOW_OBS_ATTN_IN     attention-norm output       blk.L.wq, blk.L.wk, blk.L.wv
 *     IFLOW_OBS_ATTN_OUT    attention output (heads)    blk.L.wo
 *     IFLOW_OBS_FFN_IN      FFN-norm output             blk.L.ffn_gate, blk.L.ffn_up
 *     IFLOW_OBS_FFN_MID     silu(gate) * up             blk.L.ffn_down
 *     IFLOW_OBS_OUTPUT_IN   final-norm output           output (tok_embd when tied); layer -1
 *     IFLOW_OBS_EXPERT_IN(e)  the rows routed to expert e (FFN-norm output)  blk.L.ffn_gate.e, blk.L.ffn_up.e
 *     IFLOW_OBS_EXPERT_MID(e) their silu(gate) * up                          blk.L.ffn_down.e
 * (a mixture of experts: FFN_IN and FFN_MID are then its shared expert's, when it has one)
 * col0 is the first of these K columns within the matrix's full input: 0 for a whole layer,
 * q0 * head_dim or f0 for a part of a split layer. Every part of a split layer normalizes the
 * same x, so ATTN_IN and FFN_IN are reported once per layer: by the part with q0 == 0 (f0 == 0). Only activations in host memory may be
 * passed (a device with host_memory); iflow-ppl --save-imatrix computes on the CPU.
 * iflow_observe() costs one atomic load when no observer is set on any context.
 *
 * Observers are per context; iflow_ctx_set_observer(ctx, NULL, NULL) removes one (do so before
 * closing the context). At most IFLOW_MAX_OBSERVERS contexts are observed at a time. Parts of
 * a split layer run on threads of their own, so an observer may be called concurrently; the
 * collector below locks.
 *
 * The collector accumulates, per matrix and input column, the sum of x^2 over every row it is
 * given and the row count, in double; iflow_imatrix_collector_result() gives the means (an
 * expert's over the rows routed to it; an expert no row chose has no entry).
 */
#ifndef IFLOW_OBSERVE_H
#define IFLOW_OBSERVE_H

#include <stddef.h>

#include "libcore/engine/model.h"
#include "libcore/formats/imatrix.h"

enum { IFLOW_OBS_ATTN_IN, IFLOW_OBS_ATTN_OUT, IFLOW_OBS_FFN_IN, IFLOW_OBS_FFN_MID, IFLOW_OBS_OUTPUT_IN, IFLOW_OBS_N_ };
#define IFLOW_OBS_EXPERT_IN(e)  (IFLOW_OBS_N_ + 2 * (e))
#define IFLOW_OBS_EXPERT_MID(e) (IFLOW_OBS_N_ + 2 * (e) + 1)

#define IFLOW_MAX_OBSERVERS 16

/* x: [T][K] at stride ldx (floats). */
typedef void (*iflow_observer_fn)(void *user, int layer, int site, int col0, const float *x, size_t ldx, int T, int K);

/* Set (fn non-NULL) or remove (fn NULL) the observer of ctx. IFLOW_ERANGE when
 * IFLOW_MAX_OBSERVERS contexts are observed already. */
int  iflow_ctx_set_observer(const iflow_ctx *ctx, iflow_observer_fn fn, void *user);
/* Called by the forward pass (see above). */
void iflow_observe(const iflow_ctx *ctx, int layer, int site, int col0, const float *x, size_t ldx, int T, int K);

typedef struct iflow_imatrix_collector iflow_imatrix_collector;

/* A collector for a model of hyperparameters hp. */
int  iflow_imatrix_collector_open(iflow_imatrix_collector **out, const iflow_hparams *hp);
void iflow_imatrix_collector_close(iflow_imatrix_collector *c);   /* NULL is fine */
/* An iflow_observer_fn: user is the collector. Sites, layers or columns outside the model are
 * counted as errors (iflow_imatrix_collector_result reports them), not stored. */
void iflow_imatrix_collector_observe(void *user, int layer, int site, int col0, const float *x, size_t ldx, int T,
                                     int K);
/* The importance matrix so far: one entry per matrix that saw activations, in the model's
 * tensor order (wq wk wv wo ffn_gate ffn_up ffn_down, then each expert's ffn_gate.E ffn_up.E
 * ffn_down.E, per layer, then the output); its n_tokens
 * is the rows layer 0's attention saw (every token evaluated). */
int  iflow_imatrix_collector_result(iflow_imatrix_collector *c, iflow_imatrix **out);

#endif
