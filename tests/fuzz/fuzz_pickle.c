/*
 * fuzz_pickle.c -- libFuzzer target: iflow_pt_open_mem() on arbitrary bytes.
 *
 * Input starting with "PK" is taken as a whole checkpoint (exercising the zip reader); any
 * other input is taken as data.pkl and wrapped into a stored zip with three storages,
 * a/data/0 (24 bytes), a/data/1 (4 bytes) and a/data/2 (64 bytes), so the fuzzer spends its
 * time in the pickle interpreter. A successful open must give tensors whose every reachable
 * element lies inside their storage and inside the input (ASan checks the reads below).
 */
#include "libcore/base/error.h"
#include "libcore/formats/pickle.h"
#include "libcore/formats/safetensors.h"
#include "tests/zipwrite.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_tensor(iflow_pt *pt, const iflow_strided_tensor *t, const uint8_t *base,
                         size_t size)
{
    const uint8_t *s = t->storage_data;
    if (s < base || s + t->storage_nbytes > base + size || iflow_pt_find(pt, t->t.name) != t)
        abort();
    if (t->t.n_dims < 0 || t->t.n_dims > IFLOW_SRC_MAX_DIMS || t->storage_offset < 0)
        abort();
    uint64_t numel = 1, last = (uint64_t)t->storage_offset;
    for (int d = 0; d < t->t.n_dims; d++)
        numel *= (uint64_t)t->t.shape[d];
    for (int d = 0; d < t->t.n_dims && numel; d++)
        last += ((uint64_t)t->t.shape[d] - 1) * (uint64_t)t->stride[d];
    volatile uint8_t sink = 0;
    uint64_t elsize = (uint64_t)iflow_st_dtype_bits(t->t.dtype_name) / 8; /* 0: not listed there */
    if (numel && elsize) {
        /* The last reachable element, read through the storage. */
        if ((last + 1) * elsize > t->storage_nbytes)
            abort();
        sink += s[last * elsize + elsize - 1];
    }
    if (t->contiguous && t->t.nbytes) {
        const uint8_t *d = t->t.data;
        if (d < s || d + t->t.nbytes > s + t->storage_nbytes)
            abort();
        for (size_t i = 0; i < t->t.nbytes; i++)
            sink += d[i];
    }
    if (!t->contiguous && (t->t.data || t->t.nbytes))
        abort();
    (void)sink;
    iflow_pt_release(pt, t);
}

static void check(const uint8_t *buf, size_t n)
{
    iflow_pt *pt;
    if (iflow_pt_open_mem(&pt, buf, n, "fuzz.pt") < 0) {
        if (pt != NULL || iflow_errmsg()[0] == '\0' || strchr(iflow_errmsg(), '\n'))
            abort();
        return;
    }
    for (size_t i = 0; i < iflow_pt_n_tensors(pt); i++)
        check_tensor(pt, iflow_pt_tensor(pt, i), buf, n);
    char *s = json_dumps(iflow_pt_data(pt), JSON_ENCODE_ANY);
    if (!s)
        abort();
    free(s);
    iflow_pt_close(pt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= 2 && data[0] == 'P' && data[1] == 'K') {
        check(data, size);
        return 0;
    }
    static const unsigned char storage[64] = {1, 2, 3, 4, 5, 6, 7, 8};
    zmember m[] = {
        {"a/data.pkl", data, size, 0},
        {"a/data/0", storage, 24, 0},
        {"a/data/1", storage, 4, 0},
        {"a/data/2", storage, 64, 0},
    };
    zbuf zip = {0};
    zip_write(&zip, m, 4);
    check(zip.p, zip.n);
    free(zip.p);
    return 0;
}
