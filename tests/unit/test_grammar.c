/*
 * test_grammar.c -- the GBNF grammar and its recognizer (libcore/serving/grammar.h), and
 * constrained decoding in the batch engine.
 *
 *   - errors: each malformed grammar refused with its message, line and column pinned;
 *   - whole-string and prefix matches of hand-labelled strings over the language's parts
 *     (literals and escapes, classes over code points in UTF-8, repetitions, recursion, empty
 *     alternatives); the regex and JSON Schema tests (test_grammar_regex.c,
 *     test_grammar_schema.c) check the recognizer against Python's re and jsonschema besides;
 *   - masks: for a JSON grammar over SmolLM2's 49152-token vocabulary, at every prefix of a JSON
 *     text, the trie walk's mask equals each token tested alone (its bytes run through the
 *     state), and a mask taken again from the state's cache equals a fresh walk; the same for a
 *     JSON Schema's bounded strings (every position a state of its own) over UTF-8 text;
 *   - limits: an ambiguous grammar whose parses double with each byte is stopped at
 *     IFLOW_GRAMMAR_MAX_STACKS with IFLOW_ERANGE; nesting and repetition bounds;
 *   - choices: texts with quotes, backslashes, control characters and UTF-8 match themselves
 *     and nothing else;
 *   - the batch engine on stories260K (SentencePiece, byte fallback) and xs-ckpt: greedy and
 *     sampled requests under grammars (one with a prompt of BOS alone, whose first piece loses
 *     its leading space) produce text that the grammar accepts (whole when the finish reason is
 *     "eos" or "grammar", a prefix when "length"), and a greedy request's tokens are the same
 *     alone and beside others.
 */
#include "tests/unit/testlib.h"
#include "libcore/serving/batch.h"
#include "libcore/serving/grammar.h"
#include "libcore/tokenizers/tokenizer.h"

static char dir[] = "/tmp/iflow-test-grammar-XXXXXX";

/* An error code and a message that holds text. */
#define ERR(rc, want, text) CHECK_ERR(rc, want, text, text)

static const char *const JSON_GBNF =
    "root   ::= value\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws (\",\" ws string ws \":\" ws value ws)* )? \"}\"\n"
    "array  ::= \"[\" ws ( value ws (\",\" ws value ws)* )? \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\"\n"
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n"
    "ws     ::= [ \\t\\n]{0,20}\n";

static iflow_grammar *open_ok(const char *gbnf)
{
    iflow_grammar *g = NULL;
    int rc = iflow_grammar_open(&g, gbnf, strlen(gbnf), NULL);
    CHECK(rc == 0, "open %s: %s", gbnf, iflow_errmsg());
    return rc == 0 ? g : NULL;
}

/* ---- errors ------------------------------------------------------------------------------ */

static void test_errors(void)
{
    static const struct {
        const char *gbnf, *msg;
    } cases[] = {
        {"", "grammar: no rules"},
        {"# only a comment\n", "grammar: no rules"},
        {"root ::= x", "grammar: rule 'x' is used but never defined, line 1 column 10"},
        {"a ::= \"x\"", "grammar: no rule 'root' to start from"},
        {"root ::= \"a\"\nroot ::= \"b\"", "grammar: rule 'root' is defined twice, line 2 column 1"},
        {"root ::= x\nx ::= x \"a\" | \"b\"", "grammar: left recursion: rule 'x' can reach itself before matching "
                                              "a character, line 2 column 1"},
        {"root ::= e \"a\"\ne ::= \"\" | root", "grammar: left recursion: rule 'root'"},
        {"root ::= (\"\")*", "grammar: left recursion: a group or repetition can reach itself"},
        {"root ::= \"a\" (\"b\"", "grammar: a group is not closed by ')', line 1 column 14"},
        {"root ::= \"a\" )", "grammar: a ')' closes no group, line 1 column 14"},
        {"root ::= [z-a]", "grammar: a class range runs backwards, line 1 column 10"},
        {"root ::= [^\\x00-\\U0010FFFF]", "grammar: a class matches no character, line 1 column 10"},
        {"# c\nroot ::= \"\\q\"", "grammar: unknown escape, line 2 column 11"},
        {"root ::= \"\\xZZ\"", "grammar: bad hexadecimal escape, line 1 column 11"},
        {"root ::= \"\\uD800\"", "grammar: escape names no Unicode scalar value, line 1 column 11"},
        {"root ::= \"abc", "grammar: a literal is not closed, line 1 column 14"},
        {"root ::= \"ab\nc\"", "grammar: a literal or class is not closed on its line, line 1 column 13"},
        {"root ::= [abc", "grammar: a class is not closed, line 1 column 10"},
        {"root ::= \"a\"{3,2}", "grammar: a repetition's maximum is below its minimum, line 1 column 13"},
        {"root ::= \"a\"{10001}", "grammar: a repetition count is over 10000, line 1 column 14"},
        {"root ::= \"a\"{2", "grammar: a repetition is not closed by '}', line 1 column 13"},
        {"root ::= *", "grammar: unexpected character, line 1 column 10"},
        {"root ::= \"a\" \"\"* \"b\"", "grammar: a repetition has nothing to repeat, line 1 column 16"},
        {"root = \"a\"", "grammar: '::=' is expected after a rule name, line 1 column 6"},
        {"root ::= \"\xC3\x28\"", "grammar: invalid UTF-8, line 1 column 11"},
        {"::= \"a\"", "grammar: a rule name is expected, line 1 column 1"},
        {"root ::= \"a\" <|end|", "grammar: a token reference is not closed by '>', line 1 column 14"},
        {"root ::= <|end\n|>", "grammar: a token reference is not closed by '>', line 1 column 10"},
        {"root ::= <>", "grammar: an empty token reference '<>', line 1 column 10"},
        {"root ::= <[]>", "grammar: a token id must be written <[digits]>, line 1 column 10"},
        {"root ::= <[1a]>", "grammar: a token id must be written <[digits]>, line 1 column 10"},
        {"root ::= !<[12>", "grammar: a token id must be written <[digits]>, line 1 column 10"},
        {"root ::= <[99999999999]>", "grammar: a token id is too large, line 1 column 10"},
        {"root ::= !\"a\"", "grammar: unexpected character, line 1 column 10"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        iflow_grammar *g = NULL;
        int rc = iflow_grammar_open(&g, cases[i].gbnf, strlen(cases[i].gbnf), NULL);
        CHECK(rc == IFLOW_EINVAL && !g && strstr(iflow_errmsg(), cases[i].msg), "%s: got %d '%s', want '%s'",
              cases[i].gbnf, rc, iflow_errmsg(), cases[i].msg);
    }
    /* groups nested deeper than 256 */
    char deep[2000];
    int n = 0;
    n += sprintf(deep, "root ::= ");
    for (int i = 0; i < 300; i++)
        deep[n++] = '(';
    deep[n++] = '"', deep[n++] = 'a', deep[n++] = '"';
    for (int i = 0; i < 300; i++)
        deep[n++] = ')';
    deep[n] = 0;
    iflow_grammar *g = NULL;
    ERR(iflow_grammar_open(&g, deep, strlen(deep), NULL), IFLOW_EINVAL, "grammar: groups nest deeper than 256");
    /* another start rule */
    const char *two = "a ::= \"x\" b\nb ::= \"y\"";
    CHECK(iflow_grammar_open(&g, two, strlen(two), "a") == 0 && iflow_grammar_match(g, "xy", 2, NULL) == 1,
          "root 'a': %s", iflow_errmsg());
    iflow_grammar_close(g);
}

/* ---- matches ------------------------------------------------------------------------------ */

static void test_matches(void)
{
    static const struct {
        const char *gbnf, *text;
        int match, prefix;
    } cases[] = {
        {"root ::= \"ab\" | \"c\"", "ab", 1, 1},
        {"root ::= \"ab\" | \"c\"", "a", 0, 1},
        {"root ::= \"ab\" | \"c\"", "abc", 0, 0},
        {"root ::= \"ab\" | \"c\"", "", 0, 1},
        {"root ::= \"\"", "", 1, 1},
        {"root ::= \"\"", "x", 0, 0},
        {"root ::= [a-z]+", "hello", 1, 1},
        {"root ::= [a-z]+", "", 0, 1},
        {"root ::= [a-z]+", "hEllo", 0, 0},
        {"root ::= [a-z]*", "", 1, 1},
        {"root ::= [a-z]?", "ab", 0, 0},
        {"root ::= \"(\" root \")\" | \"\"", "((()))", 1, 1},
        {"root ::= \"(\" root \")\" | \"\"", "(()", 0, 1},
        {"root ::= \"(\" root \")\" | \"\"", "())", 0, 0},
        {"root ::= [^\"]*", "h\xC3\xA9llo", 1, 1},
        {"root ::= [^\"]*", "h\xC3", 0, 1},       /* inside a character */
        {"root ::= [^\"]*", "h\xC3\x28", 0, 0},   /* not UTF-8 */
        {"root ::= [^\"]*", "a\"", 0, 0},
        {"root ::= [^a]", "\xED\xA0\x80", 0, 0},  /* a surrogate's encoding is not UTF-8 */
        {"root ::= [^a]", "\xF4\x8F\xBF\xBF", 1, 1},
        {"root ::= [^a]", "\xF4\x90\x80\x80", 0, 0}, /* past U+10FFFF */
        {"root ::= [^a]", "\xC0\x80", 0, 0},      /* overlong */
        {"root ::= \"x\"{2,4}", "xxx", 1, 1},
        {"root ::= \"x\"{2,4}", "xxxxx", 0, 0},
        {"root ::= \"x\"{2,4}", "x", 0, 1},
        {"root ::= \"x\"{3}", "xxx", 1, 1},
        {"root ::= \"x\"{3}", "xx", 0, 1},
        {"root ::= \"x\"{2,}", "xxxxxxx", 1, 1},
        {"root ::= \"x\"{0}", "", 1, 1},
        {"root ::= (\"ab\"){2,}", "ababab", 1, 1},
        {"root ::= (\"ab\"){2,}", "ab", 0, 1},
        {"root ::= \"ab\"+", "abab", 1, 1},
        {"root ::= \"ab\"+ \"c\"", "ababc", 1, 1},
        {"root ::= a b\na ::= \"a\"?\nb ::= \"b\"", "b", 1, 1},
        {"root ::= a b\na ::= \"a\"?\nb ::= \"b\"", "ab", 1, 1},
        {"root ::= [\\u4e00-\\u9fff]+", "\xE4\xB8\xAD\xE6\x96\x87", 1, 1},
        {"root ::= [\\u4e00-\\u9fff]+", "\xE3\x81\x82", 0, 0},
        {"root ::= .", "\xF0\x9F\x98\x80", 1, 1},
        {"root ::= .", "\n", 1, 1},
        {"root ::= . .", "\xE2\x82\xAC" "a", 1, 1},
        {"root ::= \"\\x41\\u00e9\\U0001F600\\n\\t\\\\\\\"\"", "A\xC3\xA9\xF0\x9F\x98\x80\n\t\\\"", 1, 1},
        {"root ::= [\\]\\[\\-]+", "]-[", 1, 1},
        {"root ::= [a-]+", "a-a", 1, 1},
        {"root ::= [-a]+", "-a-", 1, 1},
        /* comments, rules over lines, names with - and _ */
        {"root ::= # the start\n  item-one\n  | item_two # done\nitem-one ::= \"1\"\nitem_two ::= \"2\"", "2", 1, 1},
        {"root ::= (\n  \"a\"\n  | \"b\"\n) \"c\"", "bc", 1, 1},
        /* right recursion: arithmetic */
        {"root ::= expr\nexpr ::= term ([-+] term)*\nterm ::= num | \"(\" expr \")\"\nnum ::= [0-9]+",
         "12+(3-4)+5", 1, 1},
        {"root ::= expr\nexpr ::= term ([-+] term)*\nterm ::= num | \"(\" expr \")\"\nnum ::= [0-9]+", "1+(2", 0, 1},
        {"root ::= expr\nexpr ::= term ([-+] term)*\nterm ::= num | \"(\" expr \")\"\nnum ::= [0-9]+", "1+)", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        iflow_grammar *g = open_ok(cases[i].gbnf);
        if (!g)
            continue;
        int prefix = -1, m = iflow_grammar_match(g, cases[i].text, strlen(cases[i].text), &prefix);
        CHECK(m == cases[i].match && prefix == cases[i].prefix, "%s on '%s': match %d prefix %d, want %d %d",
              cases[i].gbnf, cases[i].text, m, prefix, cases[i].match, cases[i].prefix);
        iflow_grammar_close(g);
    }
    /* JSON */
    iflow_grammar *g = open_ok(JSON_GBNF);
    static const struct {
        const char *text;
        int match;
    } js[] = {
        {"{\"a\": [1, -2.5e+3, true, null, \"x\\u00e9\\n\"], \"b\": {}}", 1},
        {"[]", 1}, {"0", 1}, {"-0.5", 1}, {"\"\"", 1},
        {"01", 0}, {"[1,]", 0}, {"{\"a\" 1}", 0}, {"\"\\x\"", 0}, {"\"a\nb\"", 0}, {"tru", 0},
    };
    for (size_t i = 0; g && i < sizeof js / sizeof *js; i++)
        CHECK(iflow_grammar_match(g, js[i].text, strlen(js[i].text), NULL) == js[i].match, "json '%s'", js[i].text);
    /* a state: advance all or nothing */
    iflow_gstate *s = NULL;
    CHECK(g && iflow_gstate_open(&s, g) == 0, "state");
    if (s) {
        CHECK(iflow_gstate_advance(s, "{\"k\"", 4) == 0 && !iflow_gstate_can_end(s), "advance");
        ERR(iflow_gstate_advance(s, ": 1}x", 5), IFLOW_EINVAL, "grammar: the text does not follow the grammar");
        CHECK(iflow_gstate_test(s, ": ", 2) == 1 && iflow_gstate_test(s, "x", 1) == 0, "test");
        CHECK(iflow_gstate_advance(s, ": 1}", 4) == 0 && iflow_gstate_can_end(s) && iflow_gstate_is_done(s),
              "the state was left as it was; the object ends the value, nothing may follow");
        iflow_gstate_close(s);
    }
    /* references: the last close frees */
    if (g) {
        iflow_grammar_ref(g);
        iflow_grammar_close(g);
        CHECK(iflow_grammar_match(g, "1", 1, NULL) == 1, "alive after one close of two");
    }
    iflow_grammar_close(g);
}

/* ---- masks ------------------------------------------------------------------------------------ */

/* The tokenizer of the test data's rel and its vocabulary for grammars: 0; 1 when the file is
 * missing (the caller skips); -1 after a failed check. */
static int open_vocab(const char *rel, iflow_tokenizer **tok, iflow_gvocab **v)
{
    const char *path = test_data(rel);
    *tok = NULL, *v = NULL;
    if (!path)
        return 1;
    if (iflow_tokenizer_open(tok, path) < 0 || iflow_gvocab_open(v, *tok) < 0) {
        CHECK(0, "%s: %s", rel, iflow_errmsg());
        iflow_tokenizer_close(*tok);
        *tok = NULL;
        return -1;
    }
    return 0;
}

static void test_masks(void)
{
    iflow_tokenizer *tok;
    iflow_gvocab *v;
    int opened = open_vocab("models/tokenizers/smollm2-135m/tokenizer.json", &tok, &v);
    if (opened > 0)
        SKIP("no SmolLM2 tokenizer in the test data");
    if (opened < 0)
        return;
    const int V = iflow_gvocab_n(v);
    iflow_grammar *g = open_ok(JSON_GBNF);
    iflow_gstate *s = NULL;
    CHECK(g && iflow_gstate_open(&s, g) == 0, "state");
    uint8_t *mask = malloc((size_t)V), *again = malloc((size_t)V);
    const char *text = "{\"name\": \"Ada L\xC3\xB6velace\", \"n\": [36, -1.5e3, true], \"x\": {\"y\": null}}";
    size_t len = strlen(text);
    int agree = 1, cached = 1, counted = 1, some = 0, all_but = 0;
    for (size_t i = 0; s && i <= len && agree; i++) {
        int n = iflow_gstate_mask(s, v, mask), m2 = iflow_gstate_mask(s, v, again);
        int nb = 0;
        for (int32_t id = 0; id < V; id++) {
            int a = iflow_gstate_allows(s, v, id);
            nb += a == 1;
            if (a != mask[id]) {
                agree = 0;
                CHECK(0, "at byte %zu: token %d: mask %d, alone %d", i, id, mask[id], a);
                break;
            }
        }
        counted &= n == nb && m2 == n;
        cached &= memcmp(mask, again, (size_t)V) == 0;
        some += n > 0 && n < 1000;
        all_but += n > V - 1000;
        if (i < len)
            CHECK(iflow_gstate_advance(s, text + i, 1) == 0, "advance at %zu: %s", i, iflow_errmsg());
    }
    CHECK(agree && counted, "the trie's mask is each token tested alone, at all %zu prefixes", len + 1);
    CHECK(cached, "a mask from the cache equals the walk's");
    CHECK(some > 10 && all_but > 10, "masks both narrow (%d prefixes) and wide (%d: inside strings)", some, all_but);
    CHECK(s && iflow_gstate_can_end(s) && iflow_gstate_is_done(s) == 1, "the whole text: a sentence, complete");
    /* a control token has no bytes: never allowed */
    int32_t eos = iflow_tokenizer_eos(tok);
    CHECK(eos >= 0 && s && iflow_gstate_allows(s, v, eos) == 0, "eos %d is never a grammar's", eos);
    ERR(s ? iflow_gstate_allows(s, v, V) : 0, IFLOW_ERANGE, "outside the vocabulary");
    free(mask);
    free(again);
    iflow_gstate_close(s);
    iflow_grammar_close(g);
    /* a JSON Schema's bounded strings: every position a state of its own (no mask from the cache) */
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
                         "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":2,"
                         "\"maxLength\":4},\"maxItems\":3}},\"required\":[\"name\",\"tags\"]}";
    const char *doc = "{\"name\": \"Z\u00e9 \\\"Q\\\" \u4e2d\", \"tags\": [\"ab\", \"\u00e9\u00e9\u00e9\u00e9\"]}";
    g = NULL;
    CHECK(iflow_grammar_open_as(&g, IFLOW_GRAMMAR_JSON_SCHEMA, schema, strlen(schema)) == 0, "schema: %s",
          iflow_errmsg());
    mask = malloc((size_t)V);
    s = NULL;
    CHECK(g && iflow_gstate_open(&s, g) == 0, "schema state");
    len = strlen(doc);
    agree = 1;
    for (size_t i = 0; s && i <= len && agree; i++) {
        iflow_gstate_mask(s, v, mask);
        for (int32_t id = 0; id < V && agree; id++)
            if (iflow_gstate_allows(s, v, id) != mask[id]) {
                agree = 0;
                CHECK(0, "schema, at byte %zu: token %d: mask %d", i, id, mask[id]);
            }
        if (i < len)
            CHECK(iflow_gstate_advance(s, doc + i, 1) == 0, "schema: advance at %zu: %s", i, iflow_errmsg());
    }
    CHECK(agree && s && iflow_gstate_is_done(s), "a schema's masks: each token tested alone, at all %zu prefixes",
          len + 1);
    free(mask);
    iflow_gstate_close(s);
    iflow_grammar_close(g);
    iflow_gvocab_close(v);
    iflow_tokenizer_close(tok);
}

/* ---- limits ----------------------------------------------------------------------------------- */

static void test_limits(void)
{
    /* after n a's, every sequence of n pending b's and c's is a stack of its own: 2^n of them */
    iflow_grammar *g = open_ok("root ::= \"a\" root \"b\" | \"a\" root \"c\" | \"\"");
    char as[64];
    memset(as, 'a', sizeof as);
    int prefix;
    CHECK(g && iflow_grammar_match(g, "aabc", 4, &prefix) == 1 && iflow_grammar_match(g, as, 8, &prefix) == 0 &&
          prefix == 1, "a's then b's and c's");
    ERR(g ? iflow_grammar_match(g, as, 40, &prefix) : 0, IFLOW_ERANGE, "more than 65536 parses alive at once");
    iflow_grammar_close(g);
    /* a long repetition is fine: {0,10000} of a class */
    g = open_ok("root ::= [a-z]{0,10000} \"!\"");
    char *t = malloc(10002);
    memset(t, 'q', 10000);
    t[10000] = '!';
    CHECK(g && iflow_grammar_match(g, t, 10001, NULL) == 1, "10000 repeats");
    t[10000] = 'q';
    CHECK(g && iflow_grammar_match(g, t, 10001, &prefix) == 0 && prefix == 0, "10001 repeats: no");
    free(t);
    iflow_grammar_close(g);
    /* the compiled size is bounded: 10000 copies of 10000 copies */
    const char *huge = "root ::= ((\"ab\"{10000}){10000}){10000}";
    iflow_grammar *h = NULL;
    int rc = iflow_grammar_open(&h, huge, strlen(huge), NULL);
    CHECK(rc == 0 || (rc == IFLOW_ERANGE && strstr(iflow_errmsg(), "too large")), "huge: %d %s", rc, iflow_errmsg());
    iflow_grammar_close(h);
}

/* ---- a vocabulary: token references, long tokens --------------------------------------- */

/* Token references (<[id]>, <text>, !<...>) over SmolLM2's vocabulary, whose <|im_start|> (1) and
 * <|im_end|> (2) are control tokens that decode to no text: they are allowed exactly where a
 * reference names them; text matches around them as bytes; the mask is each token tested alone;
 * references the vocabulary lacks are refused with their place. */
static void test_tokens(void)
{
    iflow_tokenizer *tok;
    iflow_gvocab *v;
    int opened = open_vocab("models/tokenizers/smollm2-135m/tokenizer.json", &tok, &v);
    if (opened > 0)
        SKIP("no SmolLM2 tokenizer in the test data");
    if (opened < 0)
        return;
    const int V = iflow_gvocab_n(v);
    uint8_t *mask = malloc((size_t)V);
    char piece[64];
    int32_t *ids = NULL;
    size_t n_ids = 0;
    CHECK(iflow_tokenizer_encode(tok, "yes", 3, 0, &ids, &n_ids) == 0 && n_ids == 1, "'yes' is one token");
    const int32_t yes = ids ? ids[0] : -1;
    free(ids);
    /* a byte-only text never passes a reference; a whole-string match cannot either */
    iflow_grammar *g = open_ok("root ::= (\"yes\" | \"no\") <|im_end|>");
    CHECK(g && iflow_grammar_match(g, "yes", 3, NULL) == 0, "bytes alone: not a sentence");
    CHECK(g && iflow_grammar_check_vocab(g, v) == 0, "<|im_end|> is in the vocabulary");
    iflow_gstate *s = NULL;
    CHECK(g && iflow_gstate_open(&s, g) == 0, "state");
    if (s) {
        int n = iflow_gstate_mask(s, v, mask);
        CHECK(n > 0 && mask[yes] && !mask[2] && !mask[1], "first: the words, not the end token (%d)", n);
        int pl = iflow_tokenizer_piece(tok, yes, 0, piece, sizeof piece);
        CHECK(iflow_gstate_advance_token(s, v, yes, piece, (size_t)pl) == 0, "yes: %s", iflow_errmsg());
        n = iflow_gstate_mask(s, v, mask);
        CHECK(n == 1 && mask[2], "then <|im_end|> alone (%d allowed)", n);
        CHECK(iflow_gstate_token_allows(s, v, 2) == 1 && iflow_gstate_token_allows(s, v, 1) == 0 &&
                  iflow_gstate_allows(s, v, 2) == 1 && iflow_gstate_can_end(s) == 0,
              "<|im_end|> passes by reference; the text is not whole before it");
        CHECK(iflow_gstate_advance_token(s, v, 1, "", 0) == IFLOW_EINVAL, "another control token is refused");
        CHECK(iflow_gstate_advance(s, "x", 1) == IFLOW_EINVAL, "bytes are refused");
        CHECK(iflow_gstate_advance_token(s, v, 2, "", 0) == 0 && iflow_gstate_is_done(s) == 1, "then done");
    }
    iflow_gstate_close(s);
    iflow_grammar_close(g);
    /* <[id]> is the same as <text>; !<x> passes every token but x, control tokens included */
    g = open_ok("root ::= <[1]> (!<|im_end|>){2} <[2]>");
    s = NULL;
    CHECK(g && iflow_grammar_check_vocab(g, v) == 0 && iflow_gstate_open(&s, g) == 0, "state 2");
    if (s) {
        CHECK(iflow_gstate_mask(s, v, mask) == 1 && mask[1], "<[1]> first");
        CHECK(iflow_gstate_advance_token(s, v, 1, "", 0) == 0, "advance <[1]>");
        for (int k = 0; k < 2; k++) {
            int n = iflow_gstate_mask(s, v, mask), agree = 1;
            for (int32_t id = 0; id < V && agree; id++)
                agree = mask[id] == (uint8_t)iflow_gstate_allows(s, v, id);
            CHECK(n == V - 1 && !mask[2] && mask[1] && mask[yes], "step %d: all but <|im_end|> (%d of %d)", k, n, V);
            CHECK(agree, "step %d: the mask is each token tested alone", k);
            int pl = iflow_tokenizer_piece(tok, yes, 0, piece, sizeof piece);
            CHECK(iflow_gstate_advance_token(s, v, k ? 1 : yes, piece, k ? 0 : (size_t)pl) == 0, "step %d", k);
        }
        CHECK(iflow_gstate_mask(s, v, mask) == 1 && mask[2], "then <[2]> alone");
    }
    iflow_gstate_close(s);
    iflow_grammar_close(g);
    /* text and a reference at one place: either passes */
    g = open_ok("root ::= \"yes\" | <|im_start|> \"x\"");
    s = NULL;
    CHECK(g && iflow_gstate_open(&s, g) == 0, "state 3");
    if (s) {
        CHECK(iflow_gstate_test_token(s, v, 1, "", 0) == 1 && iflow_gstate_test_token(s, v, yes, "yes", 3) == 1 &&
                  iflow_gstate_test_token(s, v, 2, "", 0) == 0,
              "both branches, and nothing else");
        CHECK(iflow_gstate_advance_token(s, v, 1, "", 0) == 0 && iflow_gstate_test(s, "x", 1) == 1,
              "the reference's branch");
    }
    iflow_gstate_close(s);
    iflow_grammar_close(g);
    /* references the vocabulary does not have */
    static const struct {
        const char *gbnf, *msg;
    } bad[] = {
        {"root ::= \"a\"\n  <|nope|>", "grammar: <|nope|> is not a token of the vocabulary, line 2 column 3"},
        {"root ::= !<[49152]>", "grammar: token id 49152 is outside the vocabulary of 49152, line 1 column 10"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g = open_ok(bad[i].gbnf);
        int rc = g ? iflow_grammar_check_vocab(g, v) : 0;
        CHECK(rc == IFLOW_EINVAL && strcmp(iflow_errmsg(), bad[i].msg) == 0, "%s: '%s'", bad[i].gbnf, iflow_errmsg());
        iflow_grammar_close(g);
    }
    free(mask);
    iflow_gvocab_close(v);
    iflow_tokenizer_close(tok);
}

/* A vocabulary with long tokens (GPT-NeoX's: pieces of 512 bytes) builds, and its longest
 * token is allowed by a grammar of exactly its text. */
static void test_long_tokens(void)
{
    iflow_tokenizer *t;
    iflow_gvocab *v;
    int rc = open_vocab("tokenizer-tests/ggml-vocab-gpt-neox.gguf", &t, &v);
    if (rc > 0)
        SKIP("no GPT-NeoX vocabulary");
    if (rc < 0)
        return; /* the vocabulary's trie could not be built: checked */
    size_t cap = iflow_tokenizer_max_piece(t);
    char *piece = malloc(cap), *best = malloc(cap);
    int32_t best_id = -1;
    int best_n = 0;
    for (int32_t id = 0; id < iflow_tokenizer_n_vocab(t); id++) {
        int n = iflow_tokenizer_piece(t, id, 0, piece, cap);
        if (n > best_n)
            best_n = n, best_id = id, memcpy(best, piece, (size_t)n);
    }
    CHECK(best_n > 256, "the longest piece is %d bytes", best_n);
    const char *texts[] = {best};
    size_t lens[] = {(size_t)best_n};
    char *gbnf = NULL;
    iflow_grammar *g = NULL;
    iflow_gstate *st = NULL;
    if (rc == 0 && iflow_grammar_from_choices(texts, lens, 1, &gbnf) == 0 &&
        iflow_grammar_open(&g, gbnf, strlen(gbnf), NULL) == 0 && iflow_gstate_open(&st, g) == 0)
        CHECK(iflow_gstate_allows(st, v, best_id) == 1, "token %d (%d bytes) allowed", best_id, best_n);
    else
        CHECK(0, "a grammar of the longest piece: %s", iflow_errmsg());
    iflow_gstate_close(st);
    iflow_grammar_close(g);
    free(gbnf);
    free(piece);
    free(best);
    iflow_gvocab_close(v);
    iflow_tokenizer_close(t);
}

/* ---- choices ---------------------------------------------------------------------------------- */

static void test_choices(void)
{
    const char *c[] = {"yes", "no", "a \"quoted\" \\ word", "tab\there\nnewline", "caf\xC3\xA9 \xE2\x82\xAC", "y"};
    size_t lens[6];
    for (int i = 0; i < 6; i++)
        lens[i] = strlen(c[i]);
    char *gbnf = NULL;
    CHECK(iflow_grammar_from_choices(c, lens, 6, &gbnf) == 0, "choices: %s", iflow_errmsg());
    iflow_grammar *g = gbnf ? open_ok(gbnf) : NULL;
    for (int i = 0; g && i < 6; i++)
        CHECK(iflow_grammar_match(g, c[i], lens[i], NULL) == 1, "choice '%s' in %s", c[i], gbnf);
    const char *not[] = {"ye", "yesno", "", "a \"quoted\" \\\\ word", "Yes"};
    for (int i = 0; g && i < 5; i++)
        CHECK(iflow_grammar_match(g, not[i], strlen(not[i]), NULL) == 0, "not a choice: '%s'", not[i]);
    iflow_grammar_close(g);
    free(gbnf);
    const char *bad[] = {"ok", "\xFF"};
    size_t bl[] = {2, 1};
    ERR(iflow_grammar_from_choices(bad, bl, 2, &gbnf), IFLOW_EINVAL, "is not valid UTF-8 at byte 0");
    ERR(iflow_grammar_from_choices(bad, bl, 0, &gbnf), IFLOW_EINVAL, "no choices given");
}

/* ---- the batch engine ------------------------------------------------------------------------- */

typedef struct {
    const char *gbnf;
    const char *prompt; /* NULL: BOS alone */
    float temp;
    uint64_t seed;
} gen_case;

/* Runs the cases in one batch (or each alone), checks each text against its grammar, and
 * returns the tokens of case `keep` in *ids (malloc'd). */
static void run_cases(iflow_model *m, const gen_case *cs, int n, int together, int keep, int32_t **ids, int *n_ids)
{
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    iflow_grammar *g[8] = {0};
    for (int i = 0; i < n; i++)
        g[i] = open_ok(cs[i].gbnf);
    int runs = together ? 1 : n;
    for (int r = 0; r < runs; r++) {
        iflow_batch_params bp = {.parallel = 4, .n_ctx = 256};
        iflow_batch *b;
        if (iflow_batch_open(&b, m, &bp) < 0) {
            CHECK(0, "batch: %s", iflow_errmsg());
            return;
        }
        for (int i = together ? 0 : r; i < (together ? n : r + 1); i++) {
            int32_t *p = NULL;
            size_t np = 0;
            if (cs[i].prompt)
                iflow_tokenizer_encode(tok, cs[i].prompt, strlen(cs[i].prompt), IFLOW_TOK_ADD_BOS, &p, &np);
            int32_t bos = iflow_model_hparams(m)->bos;
            iflow_request q = {.prompt = p ? p : &bos, .n_prompt = p ? (int)np : 1, .max_tokens = 40,
                               .grammar = g[i], .user = (void *)(intptr_t)i};
            q.sampling.temp = cs[i].temp;
            q.sampling.seed = cs[i].seed;
            CHECK(iflow_batch_add(b, &q) == 0, "add: %s", iflow_errmsg());
            free(p);
        }
        int rc;
        while ((rc = iflow_batch_step(b)) > 0)
            ;
        CHECK(rc == 0, "step: %s", iflow_errmsg());
        iflow_result *res;
        while (iflow_batch_take(b, &res) == 1) {
            int i = (int)(intptr_t)res->user, prefix = 0;
            int whole = iflow_grammar_match(g[i], res->text, res->text_len, &prefix);
            if (res->finish == IFLOW_FINISH_LENGTH)
                CHECK(prefix == 1, "case %d: '%s' (length) is a prefix of a sentence of %s", i, res->text,
                      cs[i].gbnf);
            else
                CHECK(whole == 1 && (res->finish == IFLOW_FINISH_EOS || res->finish == IFLOW_FINISH_GRAMMAR),
                      "case %d: '%s' (%s) is a sentence of %s", i, res->text, iflow_finish_name(res->finish),
                      cs[i].gbnf);
            if (getenv("GRAMMAR_SHOW"))
                fprintf(stderr, "case %d (%s, %d tokens): '%s'\n", i, iflow_finish_name(res->finish), res->n_tokens,
                        res->text);
            if (i == keep) {
                *n_ids = res->n_tokens;
                *ids = malloc(sizeof **ids * (size_t)(res->n_tokens + 1));
                memcpy(*ids, res->tokens, sizeof **ids * (size_t)res->n_tokens);
            }
            iflow_result_free(res);
        }
        iflow_batch_close(b);
    }
    for (int i = 0; i < n; i++)
        iflow_grammar_close(g[i]);
}

static void test_batch(const char *path)
{
    iflow_model *m;
    if (iflow_model_open(&m, path, 0) < 0) {
        CHECK(0, "open %s: %s", path, iflow_errmsg());
        return;
    }
    static const gen_case cs[] = {
        {"root ::= \" \"? [A-Z] [a-z]+ (\" \" [a-z]+){2,5} \".\"", "Once upon a time", 0, 0},
        {"root ::= [A-Za-z ]+ \"!\"", NULL, 0, 0}, /* BOS alone: the first piece loses its space */
        {"root ::= \" \"? (\"yes\" | \"no\" | \"maybe\")", "Lily said", 0.9f, 7},
        {"root ::= (\" \" [a-z]+)+ \",\" [0-9]{1,3}", "The cat", 1.2f, 11},
        {"root ::= \" \"? \"{\\\"n\\\": \" [0-9]+ \"}\"", "Tom", 0.7f, 3},
    };
    const int n = (int)(sizeof cs / sizeof *cs);
    int32_t *alone = NULL, *together = NULL;
    int na = 0, nt = 0;
    run_cases(m, cs, n, 0, 0, &alone, &na);
    run_cases(m, cs, n, 1, 0, &together, &nt);
    CHECK(alone && together && na == nt && na > 0 && !memcmp(alone, together, sizeof *alone * (size_t)na),
          "%s: a greedy constrained request's tokens alone and in a batch (%d, %d)", path, na, nt);
    free(alone);
    free(together);
    iflow_model_close(m);
}

int main(void)
{
    RUN(test_errors);
    RUN(test_matches);
    RUN(test_masks);
    RUN(test_limits);
    RUN(test_choices);
    RUN(test_long_tokens);
    RUN(test_tokens);
    if (!mkdtemp(dir))
        return 1;
    char s260[600], xs[600];
    snprintf(s260, sizeof s260, "%s/s260.ifs", dir);
    snprintf(xs, sizeof xs, "%s/xs.ifs", dir);
    if (test_convert("models/stories260K/hf", s260, -1) == 0)
        test_batch(s260);
    if (test_convert("models/xs-ckpt/hf", xs, -1) == 0)
        test_batch(xs);
    unlink(s260);
    unlink(xs);
    rmdir(dir);
    return check_summary("test_grammar");
}
