/*
 * pickle.h -- a safe reader of PyTorch checkpoints (the zip files torch.save writes: ckpt.pt,
 * pytorch_model.bin).
 *
 * Layout
 *   A stored (uncompressed) zip archive whose members share a prefix "<archive>/":
 *     <archive>/data.pkl     the object tree, a pickle (protocols 2..5)
 *     <archive>/data/<key>   one member per storage: raw little-endian elements
 *     <archive>/version, <archive>/byteorder ("little"; absent in older files)
 *   In the pickle a tensor is  torch._utils._rebuild_tensor_v2(storage, storage_offset, size,
 *   stride, requires_grad, backward_hooks[, metadata])  where storage is a persistent id
 *   ("storage", torch.<Type>Storage, key, location, numel).
 *
 * Contract
 *   Nothing in the file is ever imported or called. The pickle is run by a small interpreter
 *   that only builds data: GLOBAL is recorded as a (module, name) pair; REDUCE of
 *   torch._utils._rebuild_tensor_v2 / _rebuild_tensor on a persistent-id storage is recognised
 *   structurally and becomes a tensor; _rebuild_parameter returns its tensor argument;
 *   collections.OrderedDict() becomes a dict; any other REDUCE, NEWOBJ or BUILD becomes an
 *   opaque object. Unknown opcodes are refused (IFLOW_EUNSUPPORTED) with the byte offset.
 *
 *   Every tensor is checked at open: its storage member exists, is stored, and holds exactly
 *   numel * element size bytes; size and stride have the same 0..8 non-negative entries; every
 *   element the view can reach (storage_offset + sum (size_i - 1) * stride_i) lies inside the
 *   storage, all without overflow.
 *
 *   Tensors are named by the path of keys leading to them from the pickle's root, joined by
 *   dots: string keys as they are, integer keys and list/tuple positions in decimal. So
 *   ckpt.pt's state dict entries are "model.tok_embeddings.weight", its optimizer moments
 *   "optimizer.state.0.exp_avg". A tensor reachable by two paths is listed under both; two
 *   tensors sharing one storage (tied weights) point at the same data. Tensors are listed in
 *   the order the walk meets them (depth first, dict insertion order).
 *
 *   iflow_pt_data() gives the rest of the tree as JSON (owned by the handle): dicts with
 *   string or integer keys become objects, lists and tuples arrays, None/bools/ints/floats/
 *   strings themselves; a tensor becomes {"__tensor__": "<name>"}, an opaque object
 *   {"__object__": "module.name"}, bytes {"__bytes__": length}; cycles and integers beyond
 *   64 bits become null.
 *
 *   The handle owns the mapping, the zip table, the tensors and their names; all live until
 *   iflow_pt_close(). Failures return a negative IFLOW_E* code, leave *out NULL and set one
 *   message naming the file and the place (member, byte offset in data.pkl, tensor).
 */
#ifndef IFLOW_PICKLE_H
#define IFLOW_PICKLE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "srctensor.h"

typedef struct {
    iflow_src_tensor t;          /* name, dtype (-1 if not F32/F16/BF16), dtype_name ("F32",
                                    "I64", ...), shape; data/nbytes: the tensor's own bytes
                                    when contiguous, else NULL and 0 (use the storage);
                                    file_offset: of the storage in the file; file = 0       */
    int64_t stride[IFLOW_SRC_MAX_DIMS]; /* in elements; 1 past n_dims                        */
    int64_t storage_offset;      /* in elements                                               */
    int contiguous;              /* row-major dense, so data..data+nbytes is the tensor       */
    const char *storage;         /* the zip member, e.g. "ckpt/data/0"                        */
    const void *storage_data;    /* the whole storage ...                                     */
    size_t storage_nbytes;       /* ... and its size                                          */
} iflow_strided_tensor;

typedef struct iflow_pt iflow_pt;

int  iflow_pt_open(iflow_pt **out, const char *path);
/* buf is borrowed: it must outlive the handle. `name` stands in for the path in messages. */
int  iflow_pt_open_mem(iflow_pt **out, const void *buf, size_t n, const char *name);
void iflow_pt_close(iflow_pt *pt); /* NULL is fine */

const char *iflow_pt_path(const iflow_pt *pt);
size_t iflow_pt_n_tensors(const iflow_pt *pt);
const iflow_strided_tensor *iflow_pt_tensor(const iflow_pt *pt, size_t i); /* NULL past the end */
const iflow_strided_tensor *iflow_pt_find(const iflow_pt *pt, const char *name); /* or NULL */
const json_t *iflow_pt_data(const iflow_pt *pt);

/* Drop the pages of t's storage from the resident set (see iflow_st_release()). */
void iflow_pt_release(iflow_pt *pt, const iflow_strided_tensor *t);

#endif
