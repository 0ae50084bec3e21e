/*
 * seq2seq.h -- an encoder-decoder (block layout = encoder-decoder: Marian / opus-mt, M2M100, T5
 * through their specs): a source encoded once, target sequences decoded against it.
 *
 * Contract
 *   iflow_s2s_open() takes, on the host, scratch and caches for one source of up to max_src
 *   tokens and n_seqs target sequences of up to max_tgt tokens each (the beams of a search
 *   share the source). The model must be an encoder-decoder placed on the CPU (place.c refuses
 *   any other device for one); IFLOW_EUNSUPPORTED otherwise, naming the layout.
 *   iflow_s2s_encode() runs the encoder over the source (every position sees every other) and
 *   keeps, per decoder layer, the keys and values that cross-attention reads: computed once per
 *   source, shared by every sequence. It empties every sequence.
 *   iflow_s2s_step() runs n rows: row i is token ids[i] of sequence seq[i] at that sequence's
 *   next position (rows of one sequence in order, so one sequence may take several rows, a
 *   prefill). A row's self-attention sees its sequence's positions up to its own (causal; each
 *   sequence keeps its keys and values), its cross-attention the whole source. logits:
 *   [n][vocab] after each row, or NULL. The matrices are read once for all rows.
 *   iflow_s2s_fork(dst, src): sequence dst becomes a copy of src (its positions and cache).
 *   iflow_s2s_greedy() decodes one source greedily (the argmax, the lowest id among equals),
 *   from decoder_start and an optional forced prefix, until an end-of-sequence token or
 *   max_new tokens.
 *   Nothing here allocates after open; nothing prints. Errors: IFLOW_ERANGE for a source or a
 *   sequence past its size (or past max_seq sinusoidal positions) and ids outside the
 *   vocabulary, IFLOW_EINVAL for a step before a source is encoded.
 */
#ifndef IFLOW_SEQ2SEQ_H
#define IFLOW_SEQ2SEQ_H

#include <stdint.h>

#include "model.h"

typedef struct iflow_s2s iflow_s2s;

/* max_src, max_tgt <= 0: the model's max_seq; n_threads <= 0: all cores. */
int  iflow_s2s_open(iflow_s2s **out, const iflow_model *m, int max_src, int max_tgt, int n_seqs, int n_threads);
void iflow_s2s_close(iflow_s2s *s);
int  iflow_s2s_encode(iflow_s2s *s, const int32_t *src, int n);
int  iflow_s2s_step(iflow_s2s *s, const int32_t *ids, const int *seq, int n, float *logits);
int  iflow_s2s_fork(iflow_s2s *s, int dst, int src);
int  iflow_s2s_n_past(const iflow_s2s *s, int seq);
int  iflow_s2s_n_seqs(const iflow_s2s *s);
int  iflow_s2s_max_tgt(const iflow_s2s *s);

/* Why a decoding ended (batch.h's IFLOW_FINISH_* codes, as iflow-run reports them). */
typedef struct {
    int32_t *tokens;       /* [n_tokens] generated (the prefix and an ending EOS not included) */
    int n_tokens;
    int finish;            /* IFLOW_FINISH_EOS, _LENGTH (max_new) or _CONTEXT (max_tgt)       */
    int32_t eos;           /* the end-of-sequence token that ended it, or -1                   */
} iflow_s2s_result;

/* Encode src [n_src], then decode greedily from decoder_start and prefix [n_prefix] (forced
 * tokens, such as M2M100's target language) for at most max_new tokens. r->tokens is malloc'd
 * (free it). */
int iflow_s2s_greedy(iflow_s2s *s, const int32_t *src, int n_src, const int32_t *prefix, int n_prefix, int max_new,
                     iflow_s2s_result *r);

/* T5's relative position bucket of key position - query position `rel` (bidirectional in the
 * encoder, causal in the decoder), computed in F32 as transformers does. For tests. */
int iflow_rel_bucket(int rel, int bidirectional, int n_buckets, int max_distance);

#endif
