/*
 * fuzz_safetensors.c -- libFuzzer target: iflow_st_open_mem() on arbitrary bytes.
 *
 * Whatever the input, opening must either fail with a message or give tensors whose every
 * byte lies inside the input (ASan checks the reads below), whose sizes agree with their
 * shapes, that do not overlap, and that iflow_st_find() finds again.
 */
#include "libcore/base/error.h"
#include "libcore/formats/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_tensor(iflow_st *st, const iflow_src_tensor *t, const uint8_t *data,
                         size_t size, uint64_t *prev_end)
{
    /* Inside the input. */
    if (t->nbytes && ((const uint8_t *)t->data < data ||
                      (const uint8_t *)t->data + t->nbytes > data + size))
        abort();
    /* Size agrees with shape and dtype. */
    uint64_t n = 1;
    for (int d = 0; d < t->n_dims; d++)
        n *= (uint64_t)t->shape[d];
    int bits = iflow_st_dtype_bits(t->dtype_name);
    if (bits == 0 || n * (uint64_t)bits / 8 != t->nbytes || t->n_dims > IFLOW_SRC_MAX_DIMS)
        abort();
    /* Offset order, no overlap. */
    if (t->nbytes) {
        if (t->file_offset < *prev_end)
            abort();
        *prev_end = t->file_offset + t->nbytes;
    }
    if (iflow_st_find(st, t->name) != t)
        abort();
    /* Touch every byte. */
    volatile uint8_t sum = 0;
    for (size_t i = 0; i < t->nbytes; i++)
        sum += ((const uint8_t *)t->data)[i];
    (void)sum;
    iflow_st_release(st, t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    iflow_st *st;
    if (iflow_st_open_mem(&st, data, size, "fuzz.safetensors") < 0) {
        if (st != NULL || iflow_errmsg()[0] == '\0' || strchr(iflow_errmsg(), '\n'))
            abort();
        return 0;
    }
    uint64_t prev_end = 0;
    for (size_t i = 0; i < iflow_st_n_tensors(st); i++)
        check_tensor(st, iflow_st_tensor(st, i), data, size, &prev_end);
    if (iflow_st_tensor(st, iflow_st_n_tensors(st)) != NULL)
        abort();
    const json_t *md = iflow_st_metadata(st);
    if (md && !json_is_object(md))
        abort();
    iflow_st_close(st);
    return 0;
}
