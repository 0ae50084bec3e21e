/* fuzz_tokenizer_json.c -- libFuzzer target: the tokenizer.json loader, then encoding and
 * decoding. Input: JSON text, optionally followed by "\xff\xff" and a text to encode (JSON
 * text never contains 0xFF bytes, so the split is unambiguous). */
#include "libcore/tokenizers/tokenizer.h"
#include "tokrun.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char dflt[] = "Hello, y'all! 3333 caf\xc3\xa9 \xe4\xb8\xad <s> [CLS] \t\n \xff end";
    const uint8_t *sep = memmem(data, size, "\xff\xff", 2);
    size_t jlen = sep ? (size_t)(sep - data) : size;
    const char *text = sep ? (const char *)sep + 2 : dflt;
    size_t tlen = sep ? size - jlen - 2 : sizeof dflt - 1;
    iflow_tokenizer *t;
    if (iflow_tokenizer_from_hf_json(&t, (const char *)data, jlen, "fuzz.json") != 0)
        return 0;
    tok_exercise(t, text, tlen);
    sink += (uint64_t)iflow_tokenizer_n_vocab(t) + (uint64_t)iflow_tokenizer_bos(t) + (uint64_t)iflow_tokenizer_eos(t) +
            strlen(iflow_tokenizer_kind(t));
    for (int32_t id = -1; id <= iflow_tokenizer_n_vocab(t) && id < 300; id++) {
        char buf[8];
        sink += (uint64_t)iflow_tokenizer_piece(t, id, 1, buf, sizeof buf);
    }
    iflow_tokenizer_close(t);
    return 0;
}
