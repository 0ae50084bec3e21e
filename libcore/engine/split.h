/*
 * split.h -- a model split into one shard file per device of a partition plan
 * (iflow-partition --split DIR), so that each device loads only what it computes.
 *
 * The directory holds DIR/plan.ini (the plan, man iflow-plan.5) and DIR/device-N.ifs for the
 * plan's device N (0-based, in plan order). Each file is a whole shard (man iflow-shard.5) and
 * describes itself: its meta record is the whole model's (spec, blocks, hyperparameters,
 * tokenizer, quantization) with a "shard" object saying which device of which plan it is:
 *   {"index": N, "count": devices, "device": "cpu:1", "layers": [l0, l1], "heads": [h0, h1],
 *    "kv_heads": [k0, k1], "ffn": [f0, f1], "embeddings": bool, "output": bool,
 *    "model": XXH64 of the source's meta record (hex), "plan": the partition (below)}
 * ranges half-open. Its tensors keep their whole-model names, with the shapes of the device's
 * slices (l in l0..l1-1, hd = head_dim):
 *   blk.l.wq [(h1-h0)*hd][dim]  .wk .wv [(k1-k0)*hd][dim]  .wo [dim][(h1-h0)*hd] (columns)
 *   .ffn_gate .ffn_up [f1-f0][dim]  .ffn_down [dim][f1-f0] (columns)  norms whole
 *   .bq .bk .bv .ffn_gate_b .ffn_up_b sliced; .bo .ffn_down_b only on the device with head 0
 *   (the layer's first part, which adds them)
 *   tok_embd (and pos_embd, tok_type_embd, embd_norm as the blocks ask) on the device computing
 *   layer 0's first part (embeddings); output_norm, output and output_b as the blocks ask on the
 *   plan's output device (output; tok_embd there too when the embeddings are tied; none for an
 *   encoder); rope_freqs (when the model has it) in every file.
 * After the tensors, the blob "split" ({"source": hex}) carries an XXH64 digest of every
 * record of the source (names and payload checksums), known only once the source has been
 * read: files of one split carry the same digest, files of another model do not.
 * "plan" is {"layers", "heads", "kv_heads", "ffn", "output", "parts": [[l0, l1, h0, h1, f0,
 * f1] per device]}: the partition without device names or threads, which may be changed in
 * DIR/plan.ini (to run the files on other devices) without touching the files.
 *
 * Contract
 *   iflow_split_write() reads a whole-model shard record by record (a file, or "-": standard
 *   input; memory: one record, plus one column slice being written) and writes every device's
 *   file at once through iflow_shard_writer (temporary + rename), then DIR/plan.ini. On failure
 *   no file is left half-written (the temporaries are removed); files finished before the
 *   failure keep their new contents, and the loader refuses a mixed directory by its digests.
 *   The engine opens such a directory with iflow_model_open(DIR) (model.h).
 */
#ifndef IFLOW_SPLIT_H
#define IFLOW_SPLIT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "libcore/engine/model.h"
#include "libcore/engine/plan.h"
#include "libcore/formats/shard.h"

#define IFLOW_SPLIT_PLAN "plan.ini"

/* DIR/device-N.ifs, into buf. */
void iflow_split_path(char *buf, size_t cap, const char *dir, int device);

/* One tensor of a device's file: its name and shape there, and the slice of the whole-model
 * tensor it is: rows (vectors: elements) or columns a0..a1-1. */
typedef struct {
    iflow_tensor_req req;
    int cols;
    int64_t a0, a1;
} iflow_split_tensor;

/* The tensors of device dev's file, in file order. *out is malloc'd. */
int iflow_split_tensors(const iflow_hparams *hp, const iflow_plan *p, int dev, iflow_split_tensor **out, size_t *n);

/* The device whose file holds the embedding table: the one computing layer 0's first part (head 0,
 * the least FFN column), which embeds a step's tokens when each device is a process (forward.c). */
int iflow_split_embed_device(const iflow_plan *p);

/* Split shard `in` (path or "-") as plan p says into directory dir (created if absent). */
int iflow_split_write(const char *in, const iflow_plan *p, const char *dir);

/* Loading: check that the meta of `path` says it is device dev of the split whose plan is p
 * (read from plan_path), and that it belongs with device 0's file (meta0 and path0; NULL when
 * dev is 0): IFLOW_EINVAL naming the file and what differs. */
int iflow_split_check_meta(const json_t *meta, const char *path, const iflow_plan *p, const char *plan_path, int dev,
                           const json_t *meta0, const char *path0);

/* Files sh and sh0 (device 0's) were cut from the same source: their "split" records agree;
 * else IFLOW_EINVAL naming sh (or IFLOW_ENOTFOUND when one has no such record). */
int iflow_split_check_source(const iflow_shard *sh, const iflow_shard *sh0);

/* A split file's "shard" object says it is one device of several: 1 and its index and count. */
int iflow_split_is_part(const json_t *meta, int *index, int *count);

#endif
