/*
 * test_grammar_schema.c -- JSON Schema to GBNF (iflow_grammar_from_json_schema, grammar.h) against
 * Python's jsonschema (Draft202012Validator with the date, time, date-time and uuid checkers):
 *   - tests/fixtures/grammar/schema.jsonl (tests/fixtures/gen_grammar_schema.py): hand-written
 *     schemas (people, nested objects, tuples, enums, recursion through $defs and "#", integer and
 *     number ranges, lengths, formats, patterns, Pydantic and OpenAI schemas) each with its texts,
 *     compact and indented, labelled by the reference; "strict" texts the reference accepts and the
 *     converter's documented choices refuse (property order, unlisted keys, whitespace around the
 *     value) must not match. Every prefix of a valid text must be a prefix of a sentence (what
 *     decoding needs); the refusals must fail with IFLOW_EINVAL and their message;
 *   - here: NULL, {} and true (any value), the message's shape, the limits (a schema over
 *     IFLOW_GRAMMAR_MAX_TEXT, nesting, a grammar that would be too big, merges that multiply out).
 * On a failed match the schema, the text and the grammar are printed.
 */
#include "tests/unit/check.h"
#include "tests/unit/jsonl.h"
#include "libcore/base/error.h"
#include "libcore/serving/grammar.h"

#include <jansson.h>

/* The schema text of a fixture line: "schema_text", or "schema" written out. malloc'd. */
static char *schema_text(const json_t *line)
{
    const json_t *raw = json_object_get(line, "schema_text");
    if (raw)
        return strdup(json_string_value(raw));
    return json_dumps(json_object_get(line, "schema"), JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
}

/* Convert and open; NULL (with a failed check) when either fails. *gbnf is malloc'd. */
static iflow_grammar *convert_open(const char *name, const char *schema, char **gbnf)
{
    *gbnf = NULL;
    int rc = iflow_grammar_from_json_schema(schema, strlen(schema), gbnf);
    CHECK(rc == 0 && *gbnf, "%s: convert %s: rc %d: %s", name, schema, rc, iflow_errmsg());
    if (rc < 0)
        return NULL;
    iflow_grammar *g = NULL;
    rc = iflow_grammar_open(&g, *gbnf, strlen(*gbnf), NULL);
    CHECK(rc == 0, "%s: open the grammar of %s: %s\n%s", name, schema, iflow_errmsg(), *gbnf);
    return rc == 0 ? g : NULL;
}

/* 1 if every proper prefix of text [n] is a prefix of a sentence of g. */
static int prefixes_ok(const iflow_grammar *g, const char *text, size_t n, size_t *bad)
{
    for (size_t i = 0; i < n; i++) {
        int prefix = 0;
        if (iflow_grammar_match(g, text, i, &prefix) < 0 || !prefix) {
            *bad = i;
            return 0;
        }
    }
    return 1;
}

/* One schema line: every case's match is its label (strict cases: no match). */
static void check_schema_line(const json_t *line, int *n_cases, int *n_strict)
{
    const char *name = json_string_value(json_object_get(line, "name"));
    char *schema = schema_text(line), *gbnf = NULL;
    iflow_grammar *g = convert_open(name, schema, &gbnf);
    int shown = 0;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(line, "cases"), i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t n = json_string_length(json_object_get(c, "text"));
        int want = json_is_true(json_object_get(c, "valid")), strict = json_is_true(json_object_get(c, "strict"));
        (*n_cases)++;
        *n_strict += strict;
        if (!g)
            continue;
        int prefix = 0, got = iflow_grammar_match(g, text, n, &prefix);
        size_t bad = 0;
        int ok = got == want && (!want || prefixes_ok(g, text, n, &bad));
        const char *why = strict ? json_string_value(json_object_get(c, "why")) : NULL;
        CHECK(got == want, "%s: match %d (prefix %d), want %d%s%s%s; text %s\n  schema %s%s%s", name, got, prefix, want,
              why ? " (strict: " : "", why ? why : "", why ? ")" : "", text, schema, shown ? "" : "\n  grammar:\n",
              shown ? "" : gbnf);
        CHECK(ok || got != want, "%s: the first %zu bytes of %s are no prefix\n  schema %s%s%s", name, bad, text,
              schema, shown ? "" : "\n  grammar:\n", shown ? "" : gbnf);
        shown |= !ok;
    }
    iflow_grammar_close(g);
    free(gbnf);
    free(schema);
}

/* One refusal line: IFLOW_EINVAL, one line, "json schema: ", containing the expected words. */
static void check_refusal(const json_t *line)
{
    const char *name = json_string_value(json_object_get(line, "name"));
    const char *want = json_string_value(json_object_get(line, "error"));
    char *schema = schema_text(line), *gbnf = (char *)"untouched";
    int rc = iflow_grammar_from_json_schema(schema, strlen(schema), &gbnf);
    const char *msg = iflow_errmsg();
    CHECK(rc == IFLOW_EINVAL && !gbnf, "%s: rc %d, want a refusal; schema %s\n%s", name, rc, schema, rc ? "" : gbnf);
    CHECK(strstr(msg, want) && !strncmp(msg, "json schema: ", 13) && !strchr(msg, '\n'),
          "%s: message '%s' lacks '%s'", name, msg, want);
    if (getenv("SHOW_ERRORS"))
        fprintf(stderr, "  %s\n", msg);
    if (rc == 0)
        free(gbnf);
    free(schema);
}

static void test_fixture_cases(void)
{
    size_t n;
    json_t **lines = test_read_jsonl("grammar/schema.jsonl", 0, &n);
    if (!lines)
        SKIP("tests/fixtures/grammar/schema.jsonl is missing");
    int n_schemas = 0, n_refused = 0, n_cases = 0, n_strict = 0;
    for (size_t i = 0; i < n; i++) {
        if (json_object_get(lines[i], "error")) {
            check_refusal(lines[i]);
            n_refused++;
        } else {
            check_schema_line(lines[i], &n_cases, &n_strict);
            n_schemas++;
        }
    }
    CHECK(n_schemas >= 50 && n_cases >= 1000 && n_strict >= 20 && n_refused >= 40,
          "schema.jsonl: %d schemas, %d cases (%d strict), %d refusals", n_schemas, n_cases, n_strict, n_refused);
    test_free_jsonl(lines, n);
}

/* Texts any JSON value's grammar must accept, and reject. */
static const char *const ANY_OK[] = {"0", "-1.5e+3", "\"\"", "\"\\u00e9\\n\"", "null", "true", "[]", "{}",
                                     "[1,{\"a\":[null,false]}]", "{\n  \"a\": 1\n}", "\"\xc3\xa9\""};
static const char *const ANY_BAD[] = {"", " 1", "01", "[1,]", "{\"a\"}", "nul", "\"\x01\"", "\"\xff\"", "1 2"};

static void check_any(const char *what, const char *schema, size_t len)
{
    char *gbnf = NULL;
    int rc = iflow_grammar_from_json_schema(schema, len, &gbnf);
    CHECK(rc == 0 && gbnf && !strncmp(gbnf, "root ::= ", 9), "%s: rc %d: %s", what, rc, iflow_errmsg());
    if (rc < 0)
        return;
    iflow_grammar *g = NULL;
    CHECK(iflow_grammar_open(&g, gbnf, strlen(gbnf), NULL) == 0, "%s: open: %s\n%s", what, iflow_errmsg(), gbnf);
    for (size_t i = 0; g && i < sizeof ANY_OK / sizeof *ANY_OK; i++)
        CHECK(iflow_grammar_match(g, ANY_OK[i], strlen(ANY_OK[i]), NULL) == 1, "%s: %s rejected", what, ANY_OK[i]);
    for (size_t i = 0; g && i < sizeof ANY_BAD / sizeof *ANY_BAD; i++)
        CHECK(iflow_grammar_match(g, ANY_BAD[i], strlen(ANY_BAD[i]), NULL) == 0, "%s: %s accepted", what, ANY_BAD[i]);
    iflow_grammar_close(g);
    free(gbnf);
}

static void test_any_value(void)
{
    check_any("NULL", NULL, 0);
    check_any("{}", "{}", 2);
    check_any("true", "true", 4);
    const char *annotated = " { \"title\": \"x\", \"description\": \"y\" } ";
    check_any("{} with spaces and annotations", annotated, strlen(annotated));
    char *gbnf = NULL;
    int rc = iflow_grammar_from_json_schema("{\"type\":\"object\"}", 17, &gbnf);
    iflow_grammar *g = NULL;
    CHECK(rc == 0 && iflow_grammar_open(&g, gbnf, strlen(gbnf), NULL) == 0, "json_object mode: %s", iflow_errmsg());
    CHECK(g && iflow_grammar_match(g, "{\"x\":[1,{}]}", 12, NULL) == 1, "json_object mode: an object rejected");
    CHECK(g && iflow_grammar_match(g, "[1]", 3, NULL) == 0, "json_object mode: an array accepted");
    iflow_grammar_close(g);
    free(gbnf);
}

/* A converted schema's grammar text holds needle. */
static int grammar_has(const char *schema, const char *needle)
{
    char *gbnf = NULL;
    int ok = iflow_grammar_from_json_schema(schema, strlen(schema), &gbnf) == 0 && strstr(gbnf, needle);
    free(gbnf);
    return ok;
}

static void test_messages(void)
{
    char *gbnf = (char *)"untouched";
    const char *deep = "{\"properties\":{\"a/b~\\n\":{\"not\":{}}}}";
    int rc = iflow_grammar_from_json_schema(deep, strlen(deep), &gbnf);
    CHECK_ERR(rc, IFLOW_EINVAL, "at /properties/a~1b~0\\x0a", "keyword 'not' is not supported");
    CHECK(gbnf == NULL, "*out is not NULL after a failure");
    rc = iflow_grammar_from_json_schema("{\"type\": }", 10, &gbnf);
    CHECK_ERR(rc, IFLOW_EINVAL, "line 1 column", "json schema: not valid JSON");
    rc = iflow_grammar_from_json_schema("{}", 2, NULL);
    CHECK(rc == IFLOW_EINVAL, "NULL out: rc %d", rc);
    /* the rules: "root" first, the schema's parts "root-...", readable names */
    CHECK(grammar_has("{\"type\":\"object\",\"properties\":{\"first name\":{\"type\":\"array\"}},"
                      "\"required\":[\"first name\"]}",
                      "root ::= root-object\n"),
          "the root rule does not come first");
    CHECK(grammar_has("{\"$defs\":{\"Node\":{\"type\":\"object\",\"properties\":{\"n\":{\"$ref\":\"#/$defs/Node\"}}}},"
                      "\"$ref\":\"#/$defs/Node\"}", "root-Node ::="), "a $defs target's rule is not named after it");
}

/* Objects nested n deep: {"type":"object","properties":{"a":{...}}} */
static char *nested_schema(int n)
{
    size_t cap = (size_t)n * 64 + 64, k = 0;
    char *s = malloc(cap);
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(s + k, cap - k, "{\"type\":\"object\",\"properties\":{\"a\":");
    k += (size_t)snprintf(s + k, cap - k, "{}");
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(s + k, cap - k, "}}");
    return s;
}

static void test_limits(void)
{
    char *gbnf = NULL;
    /* a schema text over the limit */
    size_t big = IFLOW_GRAMMAR_MAX_TEXT + 1;
    char *text = malloc(big);
    memset(text, ' ', big);
    text[0] = '{', text[big - 1] = '}';
    int rc = iflow_grammar_from_json_schema(text, big, &gbnf);
    CHECK_ERR(rc, IFLOW_EINVAL, "json schema:", "over the limit");
    free(text);

    /* nesting: 40 levels convert and open, 100 are refused */
    char *s = nested_schema(40);
    iflow_grammar *g = convert_open("40 nested objects", s, &gbnf);
    iflow_grammar_close(g);
    free(gbnf), free(s);
    s = nested_schema(100);
    rc = iflow_grammar_from_json_schema(s, strlen(s), &gbnf);
    CHECK_ERR(rc, IFLOW_EINVAL, "at /properties/a/properties/a", "nested deeper than");
    free(s);

    /* an enum whose grammar would be over IFLOW_GRAMMAR_MAX_TEXT */
    size_t n = 300000, cap = n * 16 + 16, k = 0;
    text = malloc(cap);
    k += (size_t)snprintf(text, cap, "{\"enum\":[");
    for (size_t i = 0; i < n; i++)
        k += (size_t)snprintf(text + k, cap - k, "%s\"v%zu\"", i ? "," : "", i);
    snprintf(text + k, cap - k, "]}");
    rc = iflow_grammar_from_json_schema(text, strlen(text), &gbnf);
    CHECK((rc == IFLOW_ERANGE || rc == IFLOW_EINVAL) && !gbnf && !strchr(iflow_errmsg(), '\n'),
          "a huge enum: rc %d: %s", rc, iflow_errmsg());
    free(text);

    /* allOf of anyOfs that multiply out: refused, not converted forever */
    text = malloc(20000);
    k = (size_t)snprintf(text, 20000, "{\"allOf\":[");
    for (int i = 0; i < 12; i++)
        k += (size_t)snprintf(text + k, 20000 - k, "%s{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"},"
                                                   "{\"type\":\"null\"}]}", i ? "," : "");
    snprintf(text + k, 20000 - k, "]}");
    rc = iflow_grammar_from_json_schema(text, strlen(text), &gbnf);
    CHECK((rc == IFLOW_ERANGE || rc == IFLOW_EINVAL) && !gbnf && !strchr(iflow_errmsg(), '\n'),
          "anyOfs multiplied out: rc %d: %s", rc, iflow_errmsg());
    free(text);

    /* repetition bounds at the limit are fine */
    g = convert_open("maxItems 10000", "{\"type\":\"array\",\"maxItems\":10000,\"items\":{\"type\":\"integer\"}}",
                     &gbnf);
    CHECK(g && iflow_grammar_match(g, "[1,2,3]", 7, NULL) == 1, "maxItems 10000: [1,2,3] rejected");
    iflow_grammar_close(g);
    free(gbnf);
}

int main(void)
{
    RUN(test_fixture_cases);
    RUN(test_any_value);
    RUN(test_messages);
    RUN(test_limits);
    return check_summary("test_grammar_schema");
}
