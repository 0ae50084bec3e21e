/* fuzz_lora.c -- libFuzzer target: LoRA adapters (libcore/formats/lora.h) on arbitrary bytes.
 *
 * The first byte picks the form: even, PEFT's (adapter_config.json's text, a line "%%", then
 * adapter_model.safetensors' bytes: gfuzz.h's two parts); odd, llama.cpp's GGUF (the rest is
 * the file). Whatever the input, opening either fails with a one-line message and no handle,
 * or gives deltas that are paired and well-shaped (rank 1 .. IFLOW_LORA_MAX_RANK, positive
 * sizes), each found again by its target, in target order, whose every value is read by
 * merging its first and last rows into zeros (ASan checks the reads). */
#include "libcore/base/error.h"
#include "libcore/formats/lora.h"
#include "tests/fuzz/gfuzz.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile float sink;

static void check(const iflow_lora *l)
{
    const char *prev = NULL;
    for (size_t i = 0; i < iflow_lora_n_deltas(l); i++) {
        const iflow_lora_delta *d = iflow_lora_delta_at(l, i);
        if (!d || d->rank < 1 || d->rank > IFLOW_LORA_MAX_RANK || d->in < 1 || d->out < 1 || !d->a || !d->b)
            abort();
        if (iflow_lora_find(l, d->target) != d || (prev && strcmp(prev, d->target) >= 0))
            abort();
        prev = d->target;
        float *w = calloc((size_t)d->in, sizeof *w);
        if (!w)
            continue;
        iflow_lora_add(d, w, 0, 1);
        iflow_lora_add(d, w, d->out - 1, 1);
        sink += w[0] + w[d->in - 1];
        free(w);
    }
    if (iflow_lora_delta_at(l, iflow_lora_n_deltas(l)) != NULL)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *in = (const char *)data + 1;
    size_t n = size - 1;
    iflow_lora *l = (iflow_lora *)&n; /* must be set to NULL on failure */
    int rc;
    if (data[0] & 1) {
        rc = iflow_lora_open_gguf_mem(&l, in, n, "fuzz.gguf", 1);
    } else {
        const char *st;
        size_t clen, slen;
        two_parts(in, n, &clen, &st, &slen);
        if (!st)
            return 0;
        rc = iflow_lora_open_peft_mem(&l, in, clen, st, slen, "fuzz-adapter", 0.5);
    }
    if (rc < 0) {
        if (l)
            abort();
        one_line();
        return 0;
    }
    check(l);
    iflow_lora_close(l);
    return 0;
}
