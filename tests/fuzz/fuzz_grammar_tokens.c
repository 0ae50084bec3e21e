/* fuzz_grammar_tokens.c -- a GBNF grammar (token references included) over a real vocabulary
 * (tests/fixtures/tokenizers/bpe-bf.model: SentencePiece BPE with byte fallback and control tokens
 * <s>, </s>): the input is the grammar, then a line "%%", then a text tokenized with special
 * tokens read as such. When the grammar opens and its references name tokens of the vocabulary,
 * the tokens are fed to a state one by one, and before each the three views must agree: the
 * mask's bit, _allows() and _test_token() for that token; a token they take advances the state,
 * one they refuse is refused by _advance_token() with the state unchanged (its mask the same).
 * Errors are one line; the limits (IFLOW_ERANGE) may stop it, never a crash. Run from the
 * repository's root (make fuzz does). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "libcore/base/error.h"
#include "tests/fuzz/gfuzz.h"
#include "libcore/serving/grammar.h"
#include "libcore/tokenizers/tokenizer.h"

#define MAX_TOKENS 48

static iflow_tokenizer *tok;
static iflow_gvocab *voc;
static uint8_t *mask, *again;
static char *piece;
static size_t cap;

static int setup(void)
{
    if (voc)
        return 0;
    if (iflow_tokenizer_open(&tok, "tests/fixtures/tokenizers/bpe-bf.model") < 0 || iflow_gvocab_open(&voc, tok) < 0)
        abort(); /* run from the repository's root */
    mask = malloc((size_t)iflow_gvocab_n(voc));
    again = malloc((size_t)iflow_gvocab_n(voc));
    cap = iflow_tokenizer_max_piece(tok);
    piece = malloc(cap);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    const char *in = (const char *)data, *text;
    size_t glen, tlen;
    two_parts(in, size, &glen, &text, &tlen);
    if (!text)
        text = "";
    iflow_grammar *g;
    if (iflow_grammar_open(&g, in, glen, NULL) < 0) {
        one_line();
        return 0;
    }
    iflow_gstate *s = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (iflow_grammar_check_vocab(g, voc) < 0 || iflow_gstate_open(&s, g) < 0 ||
        iflow_tokenizer_encode(tok, text, tlen, IFLOW_TOK_PARSE_SPECIAL, &ids, &n_ids) < 0) {
        one_line();
        goto done;
    }
    const int32_t V = iflow_gvocab_n(voc);
    for (size_t i = 0; i < n_ids && i < MAX_TOKENS; i++) {
        int32_t id = ids[i];
        int n = iflow_tokenizer_piece(tok, id, i == 0, piece, cap);
        int m = iflow_gstate_mask(s, voc, mask);
        if (n < 0 || m == IFLOW_ERANGE)
            break;
        if (m < 0)
            abort();
        int a = iflow_gstate_allows(s, voc, id), t = iflow_gstate_test_token(s, voc, id, piece, (size_t)n);
        if (a == IFLOW_ERANGE || t == IFLOW_ERANGE)
            break;
        if (i > 0 && (a != t || mask[id] != (uint8_t)t)) /* the first piece may lose its leading space */
            abort();
        int count = 0;
        for (int32_t k = 0; k < V; k++)
            count += mask[k];
        if (count != m)
            abort();
        int rc = iflow_gstate_advance_token(s, voc, id, piece, (size_t)n);
        if (rc == IFLOW_ERANGE)
            break;
        if ((rc == 0) != (t == 1) || (rc < 0 && rc != IFLOW_EINVAL))
            abort();
        if (rc < 0) { /* refused: the state is as it was */
            if (iflow_gstate_mask(s, voc, again) != m || memcmp(mask, again, (size_t)V) != 0)
                abort();
            one_line();
            break;
        }
    }
done:
    free(ids);
    iflow_gstate_close(s);
    iflow_grammar_close(g);
    return 0;
}
