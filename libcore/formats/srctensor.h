/*
 * srctensor.h -- a tensor as a model-source reader (safetensors, HF directory) presents it.
 *
 * Contract
 *   A plain description of bytes that the reader owns (usually a read-only mmap of the source
 *   file): every pointer in it, name and data included, stays valid until the reader that
 *   returned it is closed. The caller never frees anything here.
 *
 *   data points at the tensor's bytes exactly as stored: little-endian, row-major (C order),
 *   contiguous, nbytes long. It is aligned to the element size only when the file makes it so
 *   (the safetensors library pads its header to 8 bytes, so its files do; a hand-made file
 *   need not): check ((uintptr_t)data % element size) before casting it to float *, and
 *   memcpy it to an aligned buffer otherwise.
 */
#ifndef IFLOW_SRCTENSOR_H
#define IFLOW_SRCTENSOR_H

#include <stddef.h>
#include <stdint.h>

#define IFLOW_SRC_MAX_DIMS 8

typedef struct {
    const char *name;       /* as in the source, e.g. "model.layers.0.mlp.up_proj.weight"     */
    int dtype;              /* IFLOW_DT_* (F32, F16, BF16), or -1 when iflow has no such type  */
    const char *dtype_name; /* the source's own name for it: "F32", "BF16", "I64", "F8_E4M3"  */
    int n_dims;             /* 0 (a scalar) .. IFLOW_SRC_MAX_DIMS                              */
    int64_t shape[IFLOW_SRC_MAX_DIMS]; /* outermost first; entries past n_dims are 1        */
    const void *data;       /* nbytes of tensor data (see the contract on alignment)           */
    size_t nbytes;
    uint64_t file_offset;   /* where data starts in its file, for messages                    */
    int file;               /* which file of a multi-file source holds it (0 for one file)     */
} iflow_src_tensor;

#endif
