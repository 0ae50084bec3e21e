/* tokrun.h -- the fuzz targets that build a tokenizer: encode a text with every flag, decode
 * the ids and take each piece, folding the results into a sink the optimizer must keep. */
#ifndef IFLOW_FUZZ_TOKRUN_H
#define IFLOW_FUZZ_TOKRUN_H

#include "libcore/tokenizers/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>

static volatile uint64_t sink;

static void tok_exercise(const iflow_tokenizer *t, const char *text, size_t len)
{
    for (int flags = 0; flags < 4; flags++) {
        int32_t *ids;
        size_t n, dl;
        char *out, buf[16];
        if (iflow_tokenizer_encode(t, text, len, flags, &ids, &n) != 0)
            continue;
        if (iflow_tokenizer_decode(t, ids, n, &out, &dl) == 0) {
            sink += dl;
            free(out);
        }
        for (size_t i = 0; i < n; i++)
            sink += (uint64_t)iflow_tokenizer_piece(t, ids[i], i == 0, buf, sizeof buf);
        free(ids);
    }
}

#endif
