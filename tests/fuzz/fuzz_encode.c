/* fuzz_encode.c -- libFuzzer target: arbitrary bytes through real tokenizers, checking the
 * round trip decode(encode(x)) == x where the vocabulary makes it exact (byte-level BPE;
 * SentencePiece with byte fallback, for text without U+2581). The tokenizers are loaded once
 * from $IFLOW_TEST_DATA (default ../shared, as `make fuzz` runs from the repo root); a
 * tokenizer that is missing there is skipped. */
#include "libcore/tokenizers/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    LOSSY,
    EXACT,         /* byte-level BPE with all 256 byte tokens */
    EXACT_NO_META, /* SentencePiece with byte fallback: U+2581 decodes to a space */
    EXACT_UTF8ISH, /* deepseek-llm: the byte tokens for 0xC0, 0xC1, 0xF5..0xFF are user-defined
                      tokens ("\xc3\xbc" for 0xFC, ...) matched in raw text and decoded raw, so
                      those bytes, which never occur in UTF-8, come back as two-byte text */
};

typedef struct {
    const char *rel;
    int lossless;
    iflow_tokenizer *t;
} entry;

static entry tokenizers[] = {
    {"tokenizer-tests/ggml-vocab-gpt-2.gguf", EXACT, NULL},
    {"tokenizer-tests/ggml-vocab-llama-spm.gguf", EXACT_NO_META, NULL},
    {"tokenizer-tests/ggml-vocab-deepseek-llm.gguf", EXACT_UTF8ISH, NULL},
    {"models/tokenizers/smollm2-135m", LOSSY, NULL}, /* no tokens for 0xC0, 0xC1, 0xF5..0xFF */
    {"models/tokenizers/all-minilm-l6-v2", LOSSY, NULL},
    {"models/stories260K/hf", EXACT_NO_META, NULL},
};
#define N_TOK (sizeof tokenizers / sizeof tokenizers[0])

static void load_all(void)
{
    const char *root = getenv("IFLOW_TEST_DATA");
    for (size_t i = 0; i < N_TOK; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", root && *root ? root : "../shared", tokenizers[i].rel);
        if (iflow_tokenizer_open(&tokenizers[i].t, path) != 0)
            tokenizers[i].t = NULL;
    }
}

static int never_utf8(const char *text, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == 0xC0 || c == 0xC1 || c >= 0xF5)
            return 1;
    }
    return 0;
}

static int exact(const entry *e, const char *text, size_t len)
{
    switch (e->lossless) {
    case EXACT: return 1;
    case EXACT_NO_META: return !memmem(text, len, "\xE2\x96\x81", 3);
    case EXACT_UTF8ISH: return !never_utf8(text, len);
    }
    return 0;
}

static void check(const entry *e, const char *text, size_t len)
{
    for (int flags = 0; flags < 4; flags++) {
        int32_t *ids;
        size_t n, dl;
        char *d;
        if (iflow_tokenizer_encode(e->t, text, len, flags, &ids, &n) != 0)
            abort(); /* valid tokenizers accept any bytes */
        if (iflow_tokenizer_decode(e->t, ids, n, &d, &dl) != 0)
            abort();
        if (flags == 0 && exact(e, text, len) && (dl != len || memcmp(d, text, len) != 0)) {
            fprintf(stderr, "round trip failed with %s\n", e->rel);
            abort();
        }
        free(ids);
        free(d);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int loaded;
    if (!loaded) {
        load_all();
        loaded = 1;
    }
    for (size_t i = 0; i < N_TOK; i++)
        if (tokenizers[i].t)
            check(&tokenizers[i], (const char *)data, size);
    return 0;
}
