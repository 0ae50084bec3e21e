/*
 * hfdir.h -- a Hugging Face model directory: config and weights (safetensors or PyTorch
 * checkpoints). Which of its files are the tokenizer is tokenizer.h's iflow_tokenizer_find().
 *
 * Contract
 *   iflow_hfdir_open() reads, from directory `dir`:
 *     config.json             required; must be a JSON object
 *     generation_config.json  optional; a JSON object when present
 *     tokenizer_config.json   optional; a JSON object when present
 *     weights                 model.safetensors, else the shards that
 *                             model.safetensors.index.json lists in its weight_map
 *                             (name -> file; each file opened once, in name order); else
 *                             pytorch_model.bin, else pytorch_model.bin.index.json's shards:
 *                             torch.save zip checkpoints read by pickle.h, which runs no code
 *                             (a tensor must be contiguous, as a state dict's are)
 *   A malformed optional file is an error, not a silent skip. With IFLOW_HFDIR_CONFIG_ONLY
 *   the weights are neither required nor opened (shape-only directories such as
 *   ../shared/models/synthetic/tinyllama-1.1b); the tensor list is then empty.
 *
 *   Sharded weights are checked against the index: every listed file exists (a plain file
 *   name inside `dir`), every mapped tensor is in the file the index names, and no tensor name
 *   occurs in two files. Tensors a shard holds but the index does not list are kept. Each file
 *   is validated as safetensors.h (or pickle.h) describes.
 *
 *   Failures return a negative IFLOW_E* code, leave *out NULL, and set a message naming the
 *   directory or file: a missing config.json or missing weights is IFLOW_ENOTFOUND.
 *
 *   The handle owns everything it returns (JSON objects, paths, tensors, their names and
 *   data); all of it lives until iflow_hfdir_close(). The caller may json_incref() a config to
 *   keep it longer. Tensors form one flat list in file order, then data-offset order within a
 *   file; iflow_hfdir_find() is a hash lookup. iflow_hfdir_release() drops a tensor's pages
 *   from the resident set once the caller is done with it (see iflow_st_release()); the data
 *   stays readable.
 */
#ifndef IFLOW_HFDIR_H
#define IFLOW_HFDIR_H

#include <jansson.h>
#include <stddef.h>

#include "srctensor.h"

typedef struct iflow_hfdir iflow_hfdir;

enum { IFLOW_HFDIR_CONFIG_ONLY = 1 };

int  iflow_hfdir_open(iflow_hfdir **out, const char *dir, int flags);
void iflow_hfdir_close(iflow_hfdir *h); /* NULL is fine */

const char   *iflow_hfdir_path(const iflow_hfdir *h);                /* dir as given        */
const json_t *iflow_hfdir_config(const iflow_hfdir *h);              /* config.json         */
const json_t *iflow_hfdir_generation_config(const iflow_hfdir *h);   /* or NULL             */
const json_t *iflow_hfdir_tokenizer_config(const iflow_hfdir *h);    /* or NULL             */

/* Weight files (0 with IFLOW_HFDIR_CONFIG_ONLY), and the path of the i-th (NULL if none). */
size_t      iflow_hfdir_n_files(const iflow_hfdir *h);
const char *iflow_hfdir_file_path(const iflow_hfdir *h, size_t i);

size_t                  iflow_hfdir_n_tensors(const iflow_hfdir *h);
const iflow_src_tensor *iflow_hfdir_tensor(const iflow_hfdir *h, size_t i); /* NULL past end */
const iflow_src_tensor *iflow_hfdir_find(const iflow_hfdir *h, const char *name); /* or NULL */

/* Drop t's pages from the resident set (t must come from h). */
void iflow_hfdir_release(iflow_hfdir *h, const iflow_src_tensor *t);

#endif
