/* fuzz_grammar_schema.c -- a JSON Schema made into GBNF (iflow_grammar_from_json_schema, grammar.h):
 * the input is the schema, then optionally a line "%%" and a JSON text. When the schema converts, its
 * grammar must open (unless IFLOW_ERANGE, a limit) with the root rule first, and a few fixed JSON texts
 * and the input's text are matched (1, 0 or IFLOW_ERANGE; a whole match is a prefix too). When it
 * does not convert, *out is NULL and the message one line. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "libcore/base/error.h"
#include "tests/fuzz/gfuzz.h"
#include "libcore/serving/grammar.h"

static const char *const TEXTS[] = {
    "null", "true", "0", "-12.5e3", "\"\"", "\"a\\u00e9\\n\"", "[]", "[1,\"x\",null]", "{}",
    "{\"a\":1}", "{\n  \"name\": \"Ann\",\n  \"age\": 30,\n  \"tags\": [\n    \"x\"\n  ]\n}", "2024-07-26",
    "\"2024-07-26T12:00:00Z\"", "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}", "[[1,2],[3,4]]",
};

/* A match's result must be 0 or 1 (then a prefix), or a limit. */
static void match(const iflow_grammar *g, const char *text, size_t n)
{
    int prefix = -1, whole = iflow_grammar_match(g, text, n, &prefix);
    if (whole < 0 && whole != IFLOW_ERANGE)
        abort();
    if (whole < 0)
        one_line();
    if (whole == 1 && prefix != 1)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *in = (const char *)data, *text;
    size_t slen, tlen;
    two_parts(in, size, &slen, &text, &tlen);
    char *gbnf = (char *)"untouched";
    int rc = iflow_grammar_from_json_schema(in, slen, &gbnf);
    if (rc < 0) {
        if (gbnf)
            abort();
        one_line();
        return 0;
    }
    if (rc != 0 || !gbnf || strncmp(gbnf, "root ::= ", 9) != 0)
        abort();
    iflow_grammar *g;
    rc = iflow_grammar_open(&g, gbnf, strlen(gbnf), NULL);
    if (rc < 0 && rc != IFLOW_ERANGE)
        abort(); /* the converter wrote a grammar that does not open */
    if (rc == 0) {
        for (size_t i = 0; i < sizeof TEXTS / sizeof *TEXTS; i++)
            match(g, TEXTS[i], strlen(TEXTS[i]));
        if (text)
            match(g, text, tlen);
        iflow_grammar_close(g);
    }
    free(gbnf);
    return 0;
}
