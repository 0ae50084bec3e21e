/* fuzz_spm.c -- libFuzzer target: the SentencePiece model reader (protobuf wire format,
 * precompiled_charsmap) with and without a Marian vocab.json, then encoding and decoding. The
 * text is a fixed string and the last 64 bytes of the input. */
#include "libcore/tokenizers/tokenizer.h"
#include "tokrun.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char dflt[] = "  Hello,\tWORLD  \xef\xbc\xa1\xef\xbc\xa2 \xe2\x91\xa0 e\xcc\x81 \xe4\xb8\xad <s> </s> <unk> >>fr<< "
                               "<sep> \xe2\x96\x81x \xff end ";
    static const char vocab[] = "{\"</s>\": 0, \"<unk>\": 1, \"\\u2581\": 2, \"e\": 3, \"\\u2581H\": 4, \"<pad>\": 5}";
    size_t tail = size < 64 ? size : 64;
    for (int mapped = 0; mapped < 2; mapped++) {
        iflow_tokenizer *t;
        if (iflow_tokenizer_from_spm(&t, data, size, "fuzz.spm", mapped ? vocab : NULL, mapped ? sizeof vocab - 1 : 0,
                                     "vocab.json") != 0)
            return 0;
        tok_exercise(t, dflt, sizeof dflt - 1);
        tok_exercise(t, (const char *)data + size - tail, tail);
        sink += (uint64_t)iflow_tokenizer_n_vocab(t) + (uint64_t)iflow_tokenizer_bos(t) + (uint64_t)iflow_tokenizer_eos(t) +
                strlen(iflow_tokenizer_kind(t));
        iflow_tokenizer_close(t);
    }
    return 0;
}
