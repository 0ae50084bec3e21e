/* fuzz_spm.c -- libFuzzer target: the SentencePiece model reader (unigram and BPE models;
 * protobuf wire format, precompiled_charsmap) without a vocab.json, with Marian's and with
 * M2M100's (language tokens after it), then encoding and decoding. The text is a fixed string
 * and the last 64 bytes of the input. */
#include "libcore/tokenizers/tokenizer.h"
#include "tokrun.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char dflt[] = "  Hello,\tWORLD  \xef\xbc\xa1\xef\xbc\xa2 \xe2\x91\xa0 e\xcc\x81 \xe4\xb8\xad <s> </s> <unk> >>fr<< "
                               "<sep> \xe2\x96\x81x \xff end __fr__ <pad>";
    static const char vocab[] = "{\"</s>\": 0, \"<unk>\": 1, \"\\u2581\": 2, \"e\": 3, \"\\u2581H\": 4, \"<pad>\": 5}";
    static const char *const langs[] = {"__en__", "__fr__"};
    const iflow_tok_added m2m100 = {langs, 2, 2, "__fr__"}; /* M2M100's layout: languages after vocab.json */
    size_t tail = size < 64 ? size : 64;
    for (int mapped = 0; mapped < 3; mapped++) {
        iflow_tokenizer *t;
        if (iflow_tokenizer_from_spm(&t, data, size, "fuzz.spm", mapped ? vocab : NULL, mapped ? sizeof vocab - 1 : 0,
                                     "vocab.json", mapped == 2 ? &m2m100 : NULL) != 0)
            return 0;
        tok_exercise(t, dflt, sizeof dflt - 1);
        tok_exercise(t, (const char *)data + size - tail, tail);
        sink += (uint64_t)iflow_tokenizer_n_vocab(t) + (uint64_t)iflow_tokenizer_bos(t) + (uint64_t)iflow_tokenizer_eos(t) +
                strlen(iflow_tokenizer_kind(t));
        iflow_tokenizer_close(t);
    }
    return 0;
}
