/*
 * test_grammar_regex.c -- iflow_grammar_from_regex (libcore/serving/grammar_regex.c): regexes
 * turned into GBNF, opened with iflow_grammar_open and run by the recognizer, against Python.
 *
 *   - tests/fixtures/grammar/regex.jsonl (tests/fixtures/gen_grammar_regex.py): for each regex
 *     and text, iflow_grammar_match's whole match must be re.fullmatch's (re.ASCII) and its
 *     prefix flag the `regex` module's partial fullmatch; the regexes it lists as refused must
 *     fail with IFLOW_EINVAL and the message given. A mismatch prints the regex, the text and the
 *     GBNF. Every rule of the output is `name` or `name-...`, the first one `name`;
 *   - the output's form on a few regexes (quantifiers stay quantifiers, classes stay classes);
 *   - what JSON cannot carry: invalid UTF-8 in the regex (refused, its offset named) and in the
 *     text (never a match; a prefix when it ends inside a character);
 *   - the arguments (rule names, NULL), the limits (nesting, length, repeat counts) and sizes:
 *     a long regex gives GBNF of a size linear in it, which opens and matches.
 */
#include "tests/unit/check.h"
#include "tests/unit/jsonl.h"
#include "libcore/base/error.h"
#include "libcore/serving/grammar.h"

#include <ctype.h>
#include <jansson.h>

#define NAME "pat"

/* Convert re [n] with rule name NAME and open it; *gbnf is kept for messages. 0 or the code. */
static int open_regex(const char *re, size_t n, char **gbnf, iflow_grammar **g)
{
    *g = NULL;
    int rc = iflow_grammar_from_regex(re, n, NAME, gbnf);
    if (rc < 0)
        return rc;
    return iflow_grammar_open(g, *gbnf, strlen(*gbnf), NAME);
}

/* Each line of the GBNF defines `NAME` (the first) or `NAME-...`. */
static int rules_named(const char *gbnf)
{
    size_t k = strlen(NAME);
    if (strncmp(gbnf, NAME " ::= ", k + 5) != 0)
        return 0;
    for (const char *p = gbnf; *p; p = strchr(p, '\n') + 1) {
        if (strncmp(p, NAME, k) != 0 || (p[k] != ' ' && p[k] != '-'))
            return 0;
        if (!strchr(p, '\n'))
            return 0;
    }
    return 1;
}

/* A refused regex: IFLOW_EINVAL, one line, "regex: " and then `want`. */
static void check_refused(const char *re, size_t n, const char *want)
{
    char *gbnf = NULL;
    int rc = iflow_grammar_from_regex(re, n, NAME, &gbnf);
    const char *m = iflow_errmsg();
    CHECK(rc == IFLOW_EINVAL && !gbnf, "regex /%s/: rc %d (want %d), gbnf %s", re, rc, IFLOW_EINVAL,
          gbnf ? gbnf : "NULL");
    if (rc == IFLOW_EINVAL) {
        CHECK(!strncmp(m, "regex: ", 7) && islower((unsigned char)m[7]), "regex /%s/: message '%s'", re, m);
        CHECK(strstr(m, want) != NULL, "regex /%s/: message '%s' lacks '%s'", re, m, want);
        CHECK(!strchr(m, '\n'), "regex /%s/: message spans lines: %s", re, m);
        if (getenv("SHOW_ERRORS"))
            fprintf(stderr, "  %s\n", m);
    }
    free(gbnf);
}

/* One labelled text against an open grammar. */
static void check_text(const char *re, const char *gbnf, const iflow_grammar *g, const json_t *text, int match,
                       int prefix)
{
    int got_prefix = -1;
    int got = iflow_grammar_match(g, json_string_value(text), json_string_length(text), &got_prefix);
    CHECK(got == match && got_prefix == prefix,
          "regex /%s/ on \"%s\": match %d prefix %d, want %d %d (%s)\n  GBNF:\n%s", re, json_string_value(text),
          got, got_prefix, match, prefix, got < 0 ? iflow_errmsg() : "", gbnf);
}

static void test_fixture_cases(void)
{
    size_t n;
    json_t **lines = test_read_jsonl("grammar/regex.jsonl", JSON_ALLOW_NUL, &n);
    if (!lines)
        SKIP("tests/fixtures/grammar/regex.jsonl is missing");
    CHECK(n >= 5000, "regex.jsonl has %zu lines", n);
    size_t n_match = 0, n_prefix = 0, n_errors = 0, n_regexes = 0;
    const json_t *cur = NULL; /* the regex of g */
    char *gbnf = NULL;
    iflow_grammar *g = NULL;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *re = json_object_get(lines[i], "re"), *error = json_object_get(lines[i], "error");
        const char *res = json_string_value(re);
        if (error) {
            check_refused(res, json_string_length(re), json_string_value(error));
            n_errors++;
            continue;
        }
        if (!cur || !json_equal((json_t *)cur, (json_t *)re)) {
            iflow_grammar_close(g);
            free(gbnf);
            gbnf = NULL;
            cur = re;
            n_regexes++;
            rc = open_regex(res, json_string_length(re), &gbnf, &g);
            CHECK(rc == 0, "regex /%s/: rc %d: %s\n  GBNF:\n%s", res, rc, iflow_errmsg(), gbnf ? gbnf : "");
            CHECK(rc < 0 || rules_named(gbnf), "regex /%s/: rules not named " NAME "...:\n%s", res, gbnf);
        }
        if (rc < 0)
            continue;
        int match = json_is_true(json_object_get(lines[i], "match"));
        int prefix = json_is_true(json_object_get(lines[i], "prefix"));
        n_match += match;
        n_prefix += prefix;
        check_text(res, gbnf, g, json_object_get(lines[i], "text"), match, prefix);
    }
    iflow_grammar_close(g);
    free(gbnf);
    CHECK(n_regexes >= 500 && n_errors >= 80, "%zu regexes, %zu refused", n_regexes, n_errors);
    CHECK(n_match >= 1500 && n_prefix >= n_match + 500 && n - n_errors >= n_prefix + 1500,
          "labels: %zu match, %zu prefix of %zu", n_match, n_prefix, n - n_errors);
    test_free_jsonl(lines, n);
}

/* The GBNF of a few regexes, whole: the form the contract promises. */
static void test_output_form(void)
{
    static const struct {
        const char *re, *gbnf;
    } cases[] = {
        {"abc", NAME " ::= \"abc\"\n"},
        {"", NAME " ::= \"\"\n"},
        {"a|b|c", NAME " ::= [a-c]\n"},
        {"(a|bc)*d", NAME " ::= (\"a\" | \"bc\")* \"d\"\n"},
        {"^\\d{3}-\\d{2,}x{,4}y{1,5}?$", NAME " ::= [0-9]{3} \"-\" [0-9]{2,} \"x\"{0,4} \"y\"{1,5}\n"},
        {"(ab)+|c?", NAME " ::= \"ab\"+ | \"c\"?\n"},
        {".", NAME " ::= [^\\n]\n"},
        {"[\\s\\S]", NAME " ::= .\n"},
        {"[^\\W]", NAME " ::= [0-9A-Z_a-z]\n"},
        {"\\W", NAME " ::= [^0-9A-Z_a-z]\n"},
        {"[\\]\\[\\-^\\\\\"]", NAME " ::= [\"\\-\\[-\\x5E]\n"},
        {"[\\]\\\\]", NAME " ::= [\\\\\\]]\n"},
        {"\"\\\\\\n\\x00\\x85\\u00e9", NAME " ::= \"\\\"\\\\\\n\\x00\\x85\xc3\xa9\"\n"},
        {"(a*)*", NAME " ::= \"a\"*\n"},
        {"(a?b?)*", NAME " ::= (\"b\" | \"a\" \"b\"?)*\n"},
        {"(a?b?c?)+", NAME " ::= (\"c\" | \"b\" \"c\"? | \"a\" \"b\"? \"c\"?)*\n"},
        {"(a?(bc)?d?)+", NAME " ::= (\"d\" | \"bc\" \"d\"? | \"a\" \"bc\"? \"d\"?)*\n"},
        {"(a?(b|cd)?e?)*",
         NAME " ::= (\"e\" | " NAME "-1 \"e\"? | \"a\" " NAME "-1? \"e\"?)*\n" NAME "-1 ::= \"b\" | \"cd\"\n"},
        {"a{0}|b", NAME " ::= \"\" | \"b\"\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out = NULL;
        int rc = iflow_grammar_from_regex(cases[i].re, strlen(cases[i].re), NAME, &out);
        CHECK(rc == 0 && !strcmp(out, cases[i].gbnf), "regex /%s/: rc %d %s\n  got  %s  want %s", cases[i].re, rc,
              rc ? iflow_errmsg() : "", out ? out : "", cases[i].gbnf);
        free(out);
    }
}

/* Whole match and prefix of text [n] under regex re, or -1 on any failure. */
static int match_of(const char *re, size_t re_len, const char *text, size_t n, int *prefix)
{
    char *gbnf = NULL;
    iflow_grammar *g;
    int rc = open_regex(re, re_len, &gbnf, &g);
    if (rc == 0) {
        rc = iflow_grammar_match(g, text, n, prefix);
        iflow_grammar_close(g);
    }
    free(gbnf);
    return rc;
}

static void test_bytes(void)
{
    static const struct {
        const char *re;
        size_t len, at;
    } bad[] = {
        {"a\xff", 2, 1},         /* not a UTF-8 byte */
        {"ab\xc3", 3, 2},        /* cut short */
        {"\xc3(", 2, 0},         /* a lead byte without its continuation */
        {"[\xed\xa0\x80]", 5, 1}, /* an encoded surrogate */
        {"x\xc0\x80", 3, 1},     /* overlong */
        {"\xf4\x90\x80\x80", 4, 0}, /* past U+10FFFF */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char want[64];
        snprintf(want, sizeof want, "invalid utf-8 (byte 0x%02x), at byte %zu", (unsigned char)bad[i].re[bad[i].at],
                 bad[i].at);
        check_refused(bad[i].re, bad[i].len, want);
    }
    static const struct {
        const char *re;
        size_t re_len; /* 0: strlen */
        const char *text;
        size_t n;
        int match, prefix;
    } texts[] = {
        {".", 0, "\xff", 1, 0, 0},
        {".*", 0, "a\xc3", 2, 0, 1},          /* ends inside a character: a prefix */
        {"[^a]", 0, "\xed\xa0\x80", 3, 0, 0}, /* a surrogate's bytes */
        {"[^a]", 0, "\xc3\xa9", 2, 1, 1},
        {"\\W+", 0, "\xc0\x80", 2, 0, 0},     /* overlong NUL */
        {"a\x00" "b", 3, "a\x00" "b", 3, 1, 1}, /* NUL in the regex and in the text */
        {"a\x00" "b", 3, "a", 1, 0, 1},
        {"[\\x00-\\x01]+", 0, "\x00\x01\x00", 3, 1, 1},
        {".", 0, "\n", 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        size_t re_len = texts[i].re_len ? texts[i].re_len : strlen(texts[i].re);
        int prefix = -1, rc = match_of(texts[i].re, re_len, texts[i].text, texts[i].n, &prefix);
        CHECK(rc == texts[i].match && prefix == texts[i].prefix, "regex /%s/ on text %zu: %d %d, want %d %d (%s)",
              texts[i].re, i, rc, prefix, texts[i].match, texts[i].prefix, rc < 0 ? iflow_errmsg() : "");
    }
}

static void test_arguments(void)
{
    char *out = (char *)"junk";
    CHECK(iflow_grammar_from_regex("a", 1, NULL, &out) == 0 && !strcmp(out, "root ::= \"a\"\n"), "NULL name: %s",
          out);
    free(out);
    CHECK(iflow_grammar_from_regex("a", 1, "x-Y_9", &out) == 0 && !strncmp(out, "x-Y_9 ::= ", 10), "name: %s", out);
    free(out);
    CHECK(iflow_grammar_from_regex(NULL, 0, "e", &out) == 0 && !strcmp(out, "e ::= \"\"\n"), "NULL, 0: %s", out);
    free(out);
    const char *bad_names[] = {"", "a b", "a\n", "r\xc3\xa9", "a::="};
    for (size_t i = 0; i < sizeof bad_names / sizeof *bad_names; i++) {
        out = (char *)"junk";
        int rc = iflow_grammar_from_regex("a", 1, bad_names[i], &out);
        CHECK(rc == IFLOW_EINVAL && !out && strstr(iflow_errmsg(), "bad rule name"), "name '%s': rc %d out %p: %s",
              bad_names[i], rc, (void *)out, iflow_errmsg());
    }
    CHECK(iflow_grammar_from_regex("a", 1, "x", NULL) == IFLOW_EINVAL, "out NULL accepted");
    CHECK(iflow_grammar_from_regex(NULL, 3, "x", &out) == IFLOW_EINVAL && !out, "NULL regex accepted");
}

/* "(" x depth, "a", ")" x depth, then `tail`: malloc'd. */
static char *nested(int depth, const char *tail)
{
    char *s = malloc((size_t)depth * 2 + 2 + strlen(tail));
    if (!s)
        return NULL;
    memset(s, '(', (size_t)depth);
    s[depth] = 'a';
    memset(s + depth + 1, ')', (size_t)depth);
    strcpy(s + 2 * depth + 1, tail);
    return s;
}

static void test_limits(void)
{
    char *s = nested(256, "+b");
    int prefix;
    CHECK(s && match_of(s, strlen(s), "aaab", 4, &prefix) == 1 && prefix == 1, "256 groups: %s", iflow_errmsg());
    free(s);
    s = nested(257, "");
    if (s)
        check_refused(s, strlen(s), "groups nested deeper than 256, at byte 256");
    free(s);
    s = nested(5000, "");
    if (s)
        check_refused(s, strlen(s), "groups nested deeper than 256");
    free(s);
    size_t big = IFLOW_GRAMMAR_MAX_TEXT + 1;
    char *re = malloc(big), *out = (char *)"junk";
    if (re) {
        memset(re, 'a', big);
        int rc = iflow_grammar_from_regex(re, big, "r", &out);
        CHECK(rc == IFLOW_ERANGE && !out && strstr(iflow_errmsg(), "regex: too long"), "%zu bytes: rc %d: %s", big, rc,
              iflow_errmsg());
    }
    free(re);
    enum { UNITS = 1 << 20 }; /* "\\W" x 1M: 2 MB of regex, "[^0-9A-Z_a-z] " x 1M: 14 MB of GBNF */
    re = malloc(UNITS * 2);
    if (re) {
        for (size_t i = 0; i < UNITS; i++)
            memcpy(re + 2 * i, "\\W", 2);
        out = (char *)"junk";
        int rc = iflow_grammar_from_regex(re, UNITS * 2, "r", &out);
        CHECK(rc == IFLOW_ERANGE && !out && strstr(iflow_errmsg(), "the grammar would be over"), "long GBNF: rc %d: %s",
              rc, iflow_errmsg());
        rc = iflow_grammar_from_regex(re, UNITS / 4 * 2, "r", &out); /* 3.5 MB of GBNF: fits */
        CHECK(rc == 0 && out && strlen(out) > UNITS / 4 * 14, "shorter GBNF: rc %d: %s", rc, iflow_errmsg());
        free(out);
    }
    free(re);
    check_refused("a{0,10001}", 10, "over the limit 10000");
    CHECK(match_of("(ab){0,10000}c", 14, "ababc", 5, &prefix) == 1, "{0,10000}: %s", iflow_errmsg());
}

/* UTF-8 of code point c at s; its length. */
static size_t put_utf8(char *s, uint32_t c)
{
    s[0] = (char)(0xe0 | c >> 12);
    s[1] = (char)(0x80 | (c >> 6 & 0x3f));
    s[2] = (char)(0x80 | (c & 0x3f));
    return 3; /* U+0800..U+FFFF only */
}

/* Long regexes: the GBNF stays linear in the regex, opens, and matches. */
static void test_sizes(void)
{
    enum { N = 1000 };
    /* (X0? (X1|) X2* (?:X3?){2} X4? ...)*z over distinct CJK characters: every item nullable, so
     * the star repeats the sequence less "" (nonempty()'s chain of shared suffixes). Any of the
     * N may come first: N parses alive at the start, under IFLOW_GRAMMAR_MAX_STACKS. */
    static const char *const form[] = {"%s?", "(%s|)", "%s*", "(?:%s?){2}"};
    char *re = malloc(N * 16 + 65536), *text = malloc(N * 4); /* the words need 40000 bytes */
    if (!re || !text) {
        free(re);
        free(text);
        SKIP("out of memory");
    }
    size_t n = 0, t = 0;
    re[n++] = '(';
    for (int i = 0; i < N; i++) {
        char x[4] = {0};
        put_utf8(x, 0x4e00 + (uint32_t)i);
        n += (size_t)sprintf(re + n, form[i % 4], x);
        if (i % 3)
            t += put_utf8(text + t, 0x4e00 + (uint32_t)i);
    }
    n += (size_t)sprintf(re + n, ")*z");
    text[t++] = 'z';
    char *gbnf = NULL;
    iflow_grammar *g = NULL;
    int rc = open_regex(re, n, &gbnf, &g);
    CHECK(rc == 0 && strlen(gbnf) < 8 * n, "%zu bytes of regex: rc %d (%s), %zu bytes of GBNF", n, rc,
          rc ? iflow_errmsg() : "", gbnf ? strlen(gbnf) : 0);
    if (rc == 0) {
        int prefix = -1;
        rc = iflow_grammar_match(g, text, t, &prefix);
        CHECK(rc == 1 && prefix == 1, "the long text: %d %d (%s)", rc, prefix, rc < 0 ? iflow_errmsg() : "");
        rc = iflow_grammar_match(g, text, t - 2, &prefix); /* cut inside a character */
        CHECK(rc == 0 && prefix == 1, "the long text cut: %d %d", rc, prefix);
        memcpy(text + 30, text + 3, 3); /* a character out of order: starts an iteration again */
        rc = iflow_grammar_match(g, text, t, &prefix);
        CHECK(rc == 1, "a character again: %d", rc);
        memcpy(text + 30, "z", 1);
        rc = iflow_grammar_match(g, text, t, &prefix);
        CHECK(rc == 0 && prefix == 0, "z in the middle: %d %d", rc, prefix);
    }
    iflow_grammar_close(g);
    free(gbnf);
    /* an alternation of many words */
    n = 0;
    for (int i = 0; i < 3000; i++)
        n += (size_t)sprintf(re + n, "%sw%dx", i ? "|" : "", i * 7);
    gbnf = NULL;
    rc = open_regex(re, n, &gbnf, &g);
    CHECK(rc == 0 && strlen(gbnf) < 2 * n, "3000 words: rc %d (%s)", rc, rc ? iflow_errmsg() : "");
    if (rc == 0) {
        int prefix = -1;
        CHECK(iflow_grammar_match(g, "w2093x", 6, &prefix) == 1, "w2093x");
        CHECK(iflow_grammar_match(g, "w2094x", 6, &prefix) == 0 && prefix == 0, "w2094x");
        CHECK(iflow_grammar_match(g, "w209", 4, &prefix) == 0 && prefix == 1, "w209");
    }
    iflow_grammar_close(g);
    free(gbnf);
    free(re);
    free(text);
}

int main(void)
{
    RUN(test_fixture_cases);
    RUN(test_output_form);
    RUN(test_bytes);
    RUN(test_arguments);
    RUN(test_limits);
    RUN(test_sizes);
    return check_summary("test_grammar_regex");
}
