/* fuzz_llama2c.c -- libFuzzer target: llama2.c checkpoints and tokenizers (llama2c.h) on
 * arbitrary bytes. The input is u32 k, a checkpoint of k bytes (clamped to what is there) and
 * a tokenizer.bin (the rest). The parsers run alone; then a checkpoint they accept is opened as
 * the GGUF llama2c.c makes of it, walked through ggufsrc (every tensor's payload, first and
 * last byte) and its vocabulary loaded and used to encode and decode. */
#include "libcore/formats/ggufsrc.h"
#include "libcore/formats/llama2c.h"
#include "libcore/tokenizers/tokenizer.h"
#include "tests/fuzz/memfile.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;

static void walk(iflow_gguf *g)
{
    iflow_ggufsrc *s;
    if (iflow_ggufsrc_from(&s, g) < 0)
        return;
    for (size_t i = 0; i < iflow_ggufsrc_n_tensors(s); i++) {
        const iflow_src_tensor *t = iflow_ggufsrc_tensor(s, i);
        const void *data;
        if (t->nbytes && iflow_ggufsrc_payload(s, t, t->dtype, &data, NULL) == 0)
            sink += ((const uint8_t *)data)[0] + ((const uint8_t *)data)[t->nbytes - 1];
    }
    void *blob;
    size_t len;
    iflow_tokenizer *tok;
    if (iflow_ggufsrc_tokenizer(s, &blob, &len) == 0) {
        if (iflow_tokenizer_from_gguf(&tok, blob, len, "fuzz") == 0) {
            int32_t *ids;
            size_t n;
            if (iflow_tokenizer_encode(tok, "Once upon a b c", 15, IFLOW_TOK_ADD_BOS, &ids, &n) == 0) {
                char buf[256];
                for (size_t k = 0; k < n; k++)
                    sink += (uint64_t)iflow_tokenizer_piece(tok, ids[k], k == 0, buf, sizeof buf);
                free(ids);
            }
            iflow_tokenizer_close(tok);
        }
        free(blob);
    }
    iflow_ggufsrc_close(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    uint32_t k;
    memcpy(&k, data, 4);
    data += 4, size -= 4;
    if (k > size)
        k = (uint32_t)size;
    sink += (uint64_t)iflow_llama2c_check_header(data, k, "fuzz");
    sink += (uint64_t)iflow_llama2c_check_tokenizer(data + k, size - k, 6, "fuzz");
    char ck[64], tk[64];
    int fc = memfile(data, k, ck, sizeof ck), ft = memfile(data + k, size - k, tk, sizeof tk);
    iflow_gguf *g;
    if (fc >= 0 && ft >= 0 && iflow_is_llama2c_file(ck) && iflow_llama2c_open(&g, ck, tk) == 0)
        walk(g);
    if (fc >= 0)
        close(fc);
    if (ft >= 0)
        close(ft);
    return 0;
}
