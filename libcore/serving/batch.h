/*
 * batch.h -- continuous batching: many requests share every step of the forward pass.
 *
 * The shape of the seeds' engines (Inferflow's AddQuery/Infer, ColossalAI's add_request/step):
 * add a request, run a step, take the finished results.
 *
 * Contract
 *   iflow_batch_open() opens, for a model (placed or not), a paged KV cache of n_blocks
 *   blocks of `block` positions (model.h's iflow_kv) and a step context. iflow_batch_add()
 *   queues a request whose prompt is already tokenized (copied; the caller's memory is not
 *   kept). iflow_batch_step() runs one step:
 *     1. admission, in arrival order: a queued request starts while fewer than `parallel` run
 *        and the unreserved blocks cover its prompt plus max_tokens, which it then reserves
 *        (so a running request never waits for memory: no preemption). Prefix caching
 *        (blocks.h; off with iflow_batch_params.no_prefix_cache): the request first takes the
 *        blocks of the longest run of its prompt's full blocks (before its last token) that
 *        an earlier request named, and evaluates its prompt from there, once those blocks
 *        are written; it names its own, which stay cached (idle) after it ends;
 *     2. every decoding request contributes its next token, and prefilling requests fill the
 *        rest of the step's token budget with chunks of their prompts, so prefill and decode
 *        go through one step together and the weights are read once for all of them;
 *     3. each request whose logits the step computed draws its next token with its own
 *        sampler (sampler.h: it sees the prompt and every kept token; a greedy one takes the
 *        argmax on the device that computed the logits; one with a grammar, grammar.h, draws only
 *        among the tokens the grammar allows next, on the host); one that ends (EOS or a stop token,
 *        max_tokens, a stop string, the context, its grammar complete) gives its blocks
 *        back at once and its result waits for iflow_batch_take().
 *   A request's tokens depend only on the model, its prompt, its sampling parameters and
 *   its adapter (iflow_request.adapter: each row adds its own request's LoRA delta), never on
 *   the other requests, when they joined, or the step budget: the kernels are
 *   batch-invariant (kernels/cpu/kvcache.h, kernels.h) and every request has its own sampler.
 *   Errors: add() refuses a request that can never run (empty, a token outside the
 *   vocabulary, a prompt that fills the context, more blocks than the cache has) with
 *   IFLOW_EINVAL / IFLOW_ERANGE and the reason, and nothing is queued; step() fails only on an
 *   engine error (a device failure), after which the batch must be closed.
 *   Not thread-safe: one thread drives a batch.
 */
#ifndef IFLOW_BATCH_H
#define IFLOW_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "include/iflow.h"
#include "libcore/engine/model.h"
#include "libcore/engine/sampler.h"

/* The types -- iflow_batch_params, IFLOW_FINISH_*, IFLOW_MAX_STOP, IFLOW_SHIFT_* (context
 * shifts), iflow_request, iflow_result, iflow_batch_stats -- are the public header's
 * (include/iflow.h), which documents their fields.
 * iflow_batch_params.block <= 0 is 16 positions, or n_ctx on a GPU placement. */
const char *iflow_finish_name(int finish);

typedef struct iflow_batch iflow_batch;

int  iflow_batch_open(iflow_batch **out, const iflow_model *m, const iflow_batch_params *p);
void iflow_batch_close(iflow_batch *b);
/* The parameters in force (defaults filled in). */
const iflow_batch_params *iflow_batch_params_of(const iflow_batch *b);

int  iflow_batch_add(iflow_batch *b, const iflow_request *r);
/* What add() checks of a grammar against the model's vocabulary (a token it names: <[id]>,
 * <text>), alone: 0, or the error add() would give. For a grammar every request shares (a
 * command line's), checked once before any is added. */
int  iflow_batch_check_grammar(iflow_batch *b, const struct iflow_grammar *g);
/* One step. Returns the number of requests running or queued after it (0: idle), or < 0. */
int  iflow_batch_step(iflow_batch *b);
/* 1 and *out set to a finished result (free it with iflow_result_free), or 0 if none. */
int  iflow_batch_take(iflow_batch *b, iflow_result **out);
void iflow_result_free(iflow_result *r);
/* Requests running or queued. */
int  iflow_batch_pending(const iflow_batch *b);
void iflow_batch_get_stats(const iflow_batch *b, iflow_batch_stats *st);
/* How decode steps run on a GPU (model.h's iflow_ctx_set_graphs: IFLOW_GRAPHS_OFF, _REPLAY,
 * _ALL), the draft's too; off by default. */
void iflow_batch_set_graphs(iflow_batch *b, int mode);
/* Run the batch's steps as one process of several (model.h's iflow_ctx_set_comm): every
 * process must add the same requests in the same order. */
int  iflow_batch_set_comm(iflow_batch *b, struct iflow_comm *comm);

/* ---- speculative decoding ----
 * With a draft model, each step first lets the draft propose up to n_draft tokens for every
 * decoding request (greedily, or drawn from the draft's distribution under the request's
 * sampler settings), then the model evaluates each request's last token and its proposals in
 * the same step (n + 1 rows of logits) and keeps the longest accepted prefix plus one token of
 * its own: greedy requests accept a proposal equal to the model's argmax, so their tokens are
 * exactly those of decoding without a draft; sampled ones use speculative sampling's rule
 * (sampler.h's iflow_spec_verify), so their tokens are distributed as without a draft (the
 * draws differ), or, with accept_top_k > 0 or accept_top_p > 0, the flexible rule. The draft keeps its own paged
 * cache with block tables of its own (never shared: a request that takes its prompt's prefix from
 * the prefix cache has the draft evaluate it). Requests whose sampler draws from no fixed distribution
 * (mirostat, FSD) decode without proposals. With a context shift, the proposals stay inside the
 * context and a shift drops the same positions from the draft's cache (rotated like the model's, or
 * evaluated again from the kept tokens where the draft cannot rotate them).
 * The draft must share the model's vocabulary (the same tokenizer) and hold n_ctx positions.
 * Set it before adding requests. */
#define IFLOW_MAX_DRAFT 16
int iflow_batch_set_draft(iflow_batch *b, const iflow_model *draft, int n_draft, int accept_top_k, float accept_top_p);

/* Bytes of KV cache one block takes over all layers (K and V), for memory plans. */
uint64_t iflow_batch_block_bytes(const iflow_model *m, int kv_type, int block);

#endif
