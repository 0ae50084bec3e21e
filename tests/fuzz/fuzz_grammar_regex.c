/* fuzz_grammar_regex.c -- a regular expression (libcore/serving/grammar.h's
 * iflow_grammar_from_regex): converted to GBNF and, when that succeeds, the GBNF opened and run
 * on a few fixed texts and on the regex's own bytes. A refused regex leaves no output and a
 * one-line "regex: " message; a converted one is NUL-terminated, its rules named after the name
 * given, and it must open (IFLOW_ERANGE, a size limit, excepted); a whole match is a prefix. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libcore/base/error.h"
#include "libcore/serving/grammar.h"

static const char *const texts[] = {
    "", "a", "ab", "abc", "aaaa", "0123", "2024-07-26", "a b", "a\nb", "\xc3\xa9", "\xe4\xb8\xad\xf0\x9f\x98\x80",
    "{\"a\": 1}", "_x-1.5e+3", "\xff", "a\xc3",
};

/* Every line is "fz ::= ..." (the first) or "fz-...". */
static int named(const char *gbnf)
{
    if (strncmp(gbnf, "fz ::= ", 7) != 0)
        return 0;
    for (const char *p = gbnf; *p;) {
        const char *nl = strchr(p, '\n');
        if (!nl || strncmp(p, "fz", 2) != 0 || (p[2] != ' ' && p[2] != '-'))
            return 0;
        p = nl + 1;
    }
    return 1;
}

static void run(const iflow_grammar *g, const char *text, size_t n)
{
    int prefix = -1;
    int m = iflow_grammar_match(g, text, n, &prefix);
    if (m < 0 ? m != IFLOW_ERANGE && m != IFLOW_ENOMEM : (m == 1 && prefix != 1) || (prefix != 0 && prefix != 1))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *gbnf = NULL;
    int rc = iflow_grammar_from_regex((const char *)data, size, "fz", &gbnf);
    if (rc < 0) {
        const char *m = iflow_errmsg();
        if (gbnf || strncmp(m, "regex: ", 7) != 0 || strchr(m, '\n'))
            abort();
        return 0;
    }
    if (!gbnf || !named(gbnf))
        abort();
    iflow_grammar *g;
    rc = iflow_grammar_open(&g, gbnf, strlen(gbnf), "fz");
    if (rc < 0) {
        if (rc != IFLOW_ERANGE) {
            fprintf(stderr, "the GBNF does not open: %s\n%.2000s\n", iflow_errmsg(), gbnf);
            abort();
        }
        free(gbnf);
        return 0;
    }
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        run(g, texts[i], strlen(texts[i]));
    run(g, (const char *)data, size);
    iflow_grammar_close(g);
    free(gbnf);
    return 0;
}
