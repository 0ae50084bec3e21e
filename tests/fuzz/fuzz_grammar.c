/* fuzz_grammar.c -- a GBNF grammar (libcore/serving/grammar.h) and a text: the input is the
 * grammar, then a line "%%", then the text. When the grammar opens, the text is matched whole and
 * fed to a state byte by byte; the two must agree: the state takes exactly the bytes of the
 * longest prefix of the text that is a prefix of a sentence, and can end after the whole text
 * exactly when the text is a sentence. Errors are one line; the limits (IFLOW_ERANGE) may stop
 * either, never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "libcore/base/error.h"
#include "tests/fuzz/gfuzz.h"
#include "libcore/serving/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
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
    int prefix = -1, whole = iflow_grammar_match(g, text, tlen, &prefix);
    if (whole < 0) {
        if (whole != IFLOW_ERANGE)
            abort();
        one_line();
        iflow_grammar_close(g);
        return 0;
    }
    if (whole == 1 && prefix != 1)
        abort();
    iflow_gstate *s;
    if (iflow_gstate_open(&s, g) < 0)
        abort();
    size_t k = 0;
    int rc = 0;
    while (k < tlen && (rc = iflow_gstate_advance(s, text + k, 1)) == 0)
        k++;
    if (rc < 0 && rc != IFLOW_EINVAL && rc != IFLOW_ERANGE)
        abort();
    if (rc != IFLOW_ERANGE) {
        if ((k == tlen) != (prefix == 1)) /* the whole text taken exactly when it is a prefix */
            abort();
        if (k == tlen && iflow_gstate_can_end(s) != whole)
            abort();
        if (iflow_gstate_is_done(s) && !iflow_gstate_can_end(s))
            abort();
    }
    iflow_gstate_close(s);
    iflow_grammar_close(g);
    return 0;
}
