/*
 * test_toolcall.c -- tool calls (libcore/serving/toolcall.h).
 *
 *   - formats: names both ways; the format detected in each of the 16 real chat templates of
 *     tests/fixtures/chat/templates (Qwen2.5 hermes, Llama 3.1 and 3.2 llama3_json, Mistral
 *     v0.3 mistral, Granite 3.1 granite, the other eleven none);
 *   - parsing: hand-labelled replies in each format (several calls, text around them, an
 *     unterminated hermes block, arguments as JSON text, "parameters" for "arguments") and
 *     replies that must give no call and the whole text back (cut JSON, no name, arguments
 *     that are not an object, text after a call where none may be); the ids: nine letters and
 *     digits, the same for the same seed and index;
 *   - the grammar of a required or named call in each format, one call or several: hand-written
 *     texts accepted or refused (another function's name, a missing required argument, an extra
 *     one, the other format's key, two calls where one may be), a function whose parameters hold
 *     their own $defs; each accepted text parses back to its calls; tools refused by name;
 *   - markers hidden by the tokenizer: SmolLM2's tokenizer with a control token renamed
 *     [TOOL_CALLS] hides it in decoded text, and iflow_tool_text() puts it back where it was
 *     (not when a stop string cut the text before it).
 */
#include "tests/unit/check.h"
#include "libcore/base/error.h"
#include "libcore/serving/toolcall.h"

#include <jansson.h>

/* ---- formats ------------------------------------------------------------------------------ */

static void test_formats(void)
{
    for (int f = 0; f < IFLOW_TOOLS_COUNT; f++)
        CHECK(iflow_tool_format_from_name(iflow_tool_format_name(f)) == f, "format %d's name", f);
    CHECK(iflow_tool_format_from_name("hermes2") == -1 && iflow_tool_format_from_name("") == -1, "unknown names");
    CHECK(iflow_tool_format_from_name("llama4_pythonic") == IFLOW_TOOLS_PYTHONIC, "vLLM's Llama 4 name");
    /* pythonic has no marker of its own in Llama 3.2's templates: vLLM's pythonic one shows its
     * form (these words written here, not copied), Llama 4's wraps calls in <|python_start|> */
    static const char *const py_templates[] = {
        "You may call functions as [func_name1(params_name1=params_value1), func_name2(params)]",
        "{%- if message.tool_calls %}<|python_start|>{{ call }}<|python_end|>{%- endif %}",
    };
    for (size_t i = 0; i < 2; i++)
        CHECK(iflow_tool_format_detect(py_templates[i], strlen(py_templates[i])) == IFLOW_TOOLS_PYTHONIC,
              "pythonic template %zu", i);
    static const struct {
        const char *file;
        int fmt;
    } want[] = {
        {"qwen25", IFLOW_TOOLS_HERMES},       {"llama31", IFLOW_TOOLS_LLAMA3_JSON}, {"llama32", IFLOW_TOOLS_LLAMA3_JSON},
        {"mistral-v03", IFLOW_TOOLS_MISTRAL}, {"granite31", IFLOW_TOOLS_GRANITE},   {"smollm2", 0},
        {"llama2", 0},                        {"llama3", 0},                        {"mistral", 0},
        {"gemma", 0},                         {"phi3", 0},                          {"zephyr", 0},
        {"deepseek-r1", 0},                   {"command-r", 0},                     {"falcon", 0},
        {"olmo2", 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "chat/templates/%s.jinja", want[i].file);
        const char *path = test_fixture(rel);
        size_t n;
        char *text = path ? test_read_file(path, &n) : NULL;
        CHECK(text != NULL, "read %s", rel);
        if (!text)
            continue;
        int got = iflow_tool_format_detect(text, n);
        CHECK(got == want[i].fmt, "%s: format %s, want %s", want[i].file, iflow_tool_format_name(got),
              iflow_tool_format_name(want[i].fmt));
        free(text);
    }
}

/* ---- parsing ------------------------------------------------------------------------------ */

/* The calls as [[name, arguments text], ...] (compact), checking each call's shape. */
static char *calls_brief(const json_t *calls)
{
    json_t *a = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c)
    {
        const json_t *fn = json_object_get(c, "function");
        const char *id = json_string_value(json_object_get(c, "id"));
        int id_ok = id && strlen(id) == 9;
        for (int k = 0; id_ok && k < 9; k++)
            id_ok = (id[k] >= 'a' && id[k] <= 'z') || (id[k] >= 'A' && id[k] <= 'Z') || (id[k] >= '0' && id[k] <= '9');
        CHECK(id_ok, "call %zu: id '%s' is not nine letters and digits", i, id ? id : "(none)");
        const char *type = json_string_value(json_object_get(c, "type"));
        CHECK(type && strcmp(type, "function") == 0, "call %zu: type", i);
        json_array_append_new(a, json_pack("[O,O]", json_object_get(fn, "name"), json_object_get(fn, "arguments")));
    }
    char *s = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return s;
}

typedef struct {
    int fmt, bare;
    const char *text;
    int n;
    const char *content; /* NULL: the whole text */
    const char *calls;   /* [[name, arguments], ...] */
} parse_case;

#define F "{\"name\": \"f\", \"arguments\": {\"a\": 1}}"
#define G "{\"name\":\"g\",\"arguments\":{}}"
#define FC "[\"f\",\"{\\\"a\\\":1}\"]"
#define GC "[\"g\",\"{}\"]"

static const parse_case PARSE[] = {
    /* hermes */
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>\n" F "\n</tool_call>", 1, "", "[" FC "]"},
    {IFLOW_TOOLS_HERMES, 0, "Let me check.\n<tool_call>\n" F "\n</tool_call>\n<tool_call>\n" G "\n</tool_call>", 2,
     "Let me check.", "[" FC "," GC "]"},
    {IFLOW_TOOLS_HERMES, 0, "a<tool_call>" F "</tool_call> b <tool_call>" G "</tool_call>c", 2, "a b c",
     "[" FC "," GC "]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>\n" F, 1, "", "[" FC "]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>\n{\"name\": \"f\", \"argu", 0, NULL, "[]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>{\"arguments\": {}}</tool_call>", 0, NULL, "[]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>", 0, NULL, "[]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", 0, NULL, "[]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>" F F "</tool_call>", 0, NULL, "[]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call></tool_call>", 0, NULL, "[]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>" F "</tool_call><tool_call>oops</tool_call>", 0, NULL, "[]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 2}\"}</tool_call>", 1, "",
     "[[\"f\",\"{\\\"x\\\":2}\"]]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>", 0, NULL, "[]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>{\"name\": \"f\", \"parameters\": {\"b\": [true, null]}}</tool_call>", 1, "",
     "[[\"f\",\"{\\\"b\\\":[true,null]}\"]]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>{\"name\": \"f\"}</tool_call>", 1, "", "[[\"f\",\"{}\"]]"},
    {IFLOW_TOOLS_HERMES, 0, "<tool_call>{\"name\": \"f\", \"arguments\": {\"city\": \"Z\xc3\xbcrich\"}}</tool_call>", 1,
     "", "[[\"f\",\"{\\\"city\\\":\\\"Z\xc3\xbcrich\\\"}\"]]"},
    {IFLOW_TOOLS_HERMES, 0, "The answer is 42.", 0, NULL, "[]"},
    {IFLOW_TOOLS_HERMES, 0, "", 0, NULL, "[]"},
    {IFLOW_TOOLS_HERMES, 1, "The answer is 42.", 0, NULL, "[]"},
    /* llama3_json */
    {IFLOW_TOOLS_LLAMA3_JSON, 0, "{\"name\": \"f\", \"parameters\": {\"a\": 1}}", 1, "", "[" FC "]"},
    {IFLOW_TOOLS_LLAMA3_JSON, 0, " <|python_tag|> " F "\n", 1, "", "[" FC "]"},
    {IFLOW_TOOLS_LLAMA3_JSON, 0, F "; " G, 2, "", "[" FC "," GC "]"},
    {IFLOW_TOOLS_LLAMA3_JSON, 0, F ";", 1, "", "[" FC "]"},
    {IFLOW_TOOLS_LLAMA3_JSON, 0, "Sure: " F, 0, NULL, "[]"},
    {IFLOW_TOOLS_LLAMA3_JSON, 0, F " and more", 0, NULL, "[]"},
    {IFLOW_TOOLS_LLAMA3_JSON, 0, "{\"a\": 1}", 0, NULL, "[]"},
    {IFLOW_TOOLS_LLAMA3_JSON, 0, F "; 3", 0, NULL, "[]"},
    {IFLOW_TOOLS_LLAMA3_JSON, 0, "<tool_call>" F "</tool_call>", 0, NULL, "[]"},
    /* mistral */
    {IFLOW_TOOLS_MISTRAL, 0, "[TOOL_CALLS] [" F "]", 1, "", "[" FC "]"},
    {IFLOW_TOOLS_MISTRAL, 0, "ok [TOOL_CALLS][" F ", " G "]", 2, "ok", "[" FC "," GC "]"},
    {IFLOW_TOOLS_MISTRAL, 0, "[TOOL_CALLS]" F, 1, "", "[" FC "]"},
    {IFLOW_TOOLS_MISTRAL, 1, "[" F "]", 1, "", "[" FC "]"},
    /* a constrained (bare) list whose strings hold the marker: the whole text is the list, the
     * marker in it text (fuzz_toolcall found the marker taken for the list's start) */
    {IFLOW_TOOLS_MISTRAL, 1, "[{\"name\": \"f\", \"arguments\": {\"a\": \"x[TOOL_CALLS]\"}}]", 1, "",
     "[[\"f\",\"{\\\"a\\\":\\\"x[TOOL_CALLS]\\\"}\"]]"},
    {IFLOW_TOOLS_MISTRAL, 1, "[TOOL_CALLS][" F "]", 1, "", "[" FC "]"},
    {IFLOW_TOOLS_MISTRAL, 0, "[" F "]", 0, NULL, "[]"},
    {IFLOW_TOOLS_MISTRAL, 0, "[TOOL_CALLS] []", 0, NULL, "[]"},
    {IFLOW_TOOLS_MISTRAL, 0, "[TOOL_CALLS] [" F "] more", 0, NULL, "[]"},
    {IFLOW_TOOLS_MISTRAL, 0, "[TOOL_CALLS] [" F ", 7]", 0, NULL, "[]"},
    /* granite */
    {IFLOW_TOOLS_GRANITE, 0, "<|tool_call|>[" F "]", 1, "", "[" FC "]"},
    {IFLOW_TOOLS_GRANITE, 0, "[TOOL_CALLS] [" F "]", 0, NULL, "[]"},
    {IFLOW_TOOLS_GRANITE, 1, "\n[" G "]\n", 1, "", "[" GC "]"},
    /* pythonic: Python's call syntax and literals, read as data */
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a=1)]", 1, "", "[" FC "]"},
    {IFLOW_TOOLS_PYTHONIC, 0, " [f(a=1), g()] ", 2, "", "[" FC "," GC "]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "<|python_start|>[f(a=1)]<|python_end|>", 1, "", "[" FC "]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[get_weather(city='San Francisco', unit=\"c\", days=3, exact=True, when=None)]", 1,
     "", "[[\"get_weather\",\"{\\\"city\\\":\\\"San Francisco\\\",\\\"unit\\\":\\\"c\\\",\\\"days\\\":3,"
     "\\\"exact\\\":true,\\\"when\\\":null}\"]]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(x=[1, 2.5, -3e2], y=(True, False), z={'k': [\"v\"], \"n\": {}},)]", 1, "",
     "[[\"f\",\"{\\\"x\\\":[1,2.5,-300.0],\\\"y\\\":[true,false],\\\"z\\\":{\\\"k\\\":[\\\"v\\\"],\\\"n\\\":{}}}\"]]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(s='it\\'s \\\"q\\\" \\n \\u00e9 \\x41')]", 1, "",
     "[[\"f\",\"{\\\"s\\\":\\\"it's \\\\\\\"q\\\\\\\" \\\\n \xc3\xa9 A\\\"}\"]]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[tools.search(q='x'), f(a=1,),]", 2, "",
     "[[\"tools.search\",\"{\\\"q\\\":\\\"x\\\"}\"]," FC "]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "Sure: [f(a=1)]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a=1)] done", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a=1, a=2)]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(1)]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a=x)]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a=__import__('os'))]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a=1 b=2)]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a={1: 2})]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a='open)]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a='x\\0y')]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a='C:\\dir')]", 1, "", "[[\"f\",\"{\\\"a\\\":\\\"C:\\\\\\\\dir\\\"}\"]]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a=[1, 2)]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a=1)", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[1f(a=1)]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f.(a=1)]", 0, NULL, "[]"},
    {IFLOW_TOOLS_PYTHONIC, 0, "[f(a=Truex)]", 0, NULL, "[]"},
    /* none */
    {IFLOW_TOOLS_NONE, 0, "<tool_call>" F "</tool_call>", 0, NULL, "[]"},
};

static void test_parse(void)
{
    for (size_t i = 0; i < sizeof PARSE / sizeof PARSE[0]; i++) {
        const parse_case *c = &PARSE[i];
        json_t *calls;
        char *content;
        size_t clen;
        int n = iflow_tool_parse(c->fmt, c->text, strlen(c->text), c->bare, "seed", &calls, &content, &clen);
        CHECK(n == c->n, "case %zu (%s): %d calls, want %d", i, c->text, n, c->n);
        if (n < 0)
            continue;
        const char *want = c->content ? c->content : c->text;
        CHECK(clen == strlen(want) && strcmp(content, want) == 0, "case %zu: content '%s', want '%s'", i, content,
              want);
        char *brief = calls_brief(calls);
        CHECK(brief && strcmp(brief, c->calls) == 0, "case %zu: calls %s, want %s", i, brief, c->calls);
        CHECK((int)json_array_size(calls) == n, "case %zu: the count returned is the array's", i);
        free(brief);
        free(content);
        json_decref(calls);
    }
}

static void test_ids(void)
{
    const char *text = "<tool_call>" F "</tool_call><tool_call>" F "</tool_call>";
    json_t *a, *b, *c;
    char *s;
    iflow_tool_parse(IFLOW_TOOLS_HERMES, text, strlen(text), 0, "7", &a, &s, NULL);
    free(s);
    iflow_tool_parse(IFLOW_TOOLS_HERMES, text, strlen(text), 0, "7", &b, &s, NULL);
    free(s);
    iflow_tool_parse(IFLOW_TOOLS_HERMES, text, strlen(text), 0, "8", &c, &s, NULL);
    free(s);
    const char *a0 = json_string_value(json_object_get(json_array_get(a, 0), "id"));
    const char *a1 = json_string_value(json_object_get(json_array_get(a, 1), "id"));
    const char *b0 = json_string_value(json_object_get(json_array_get(b, 0), "id"));
    const char *c0 = json_string_value(json_object_get(json_array_get(c, 0), "id"));
    CHECK(a0 && a1 && b0 && c0, "ids present");
    if (a0 && a1 && b0 && c0) {
        CHECK(strcmp(a0, b0) == 0, "the same seed and index: the same id (%s, %s)", a0, b0);
        CHECK(strcmp(a0, a1) != 0, "another index: another id (%s, %s)", a0, a1);
        CHECK(strcmp(a0, c0) != 0, "another seed: another id (%s, %s)", a0, c0);
    }
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

/* ---- the grammar of a call ------------------------------------------------------------------ */

static const char *const TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"weather\", \"parameters\":"
    " {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\","
    " \"minimum\": 1, \"maximum\": 7}}, \"required\": [\"city\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"convert\", \"parameters\": {\"$id\": \"x\", \"$defs\":"
    " {\"u\": {\"enum\": [\"c\", \"f\"]}}, \"type\": \"object\", \"properties\": {\"unit\": {\"$ref\": \"#/$defs/u\"},"
    " \"note\": {\"const\": {\"$ref\": \"#/not/a/schema\"}}}, \"required\": [\"unit\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"ping\"}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"loose\", \"parameters\": {\"type\": [\"null\", \"object\"],"
    " \"properties\": {\"k\": {\"type\": \"integer\"}}}}}]";

#define W "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
#define W2 "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}}"
#define CV "{\"name\": \"convert\", \"arguments\": {\"unit\": \"f\"}}"
#define CVN "{\"name\": \"convert\", \"arguments\": {\"unit\": \"c\", \"note\": {\"$ref\": \"#/not/a/schema\"}}}"
#define PING "{\"name\": \"ping\", \"arguments\": {\"any\": [1, 2]}}"
#define WL "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"

typedef struct {
    int fmt;
    const char *name; /* NULL: any tool (required) */
    int parallel;
    const char *text;
    int match;
    const char *calls; /* when it matches: what it parses to */
} gcase;

static const gcase GRAMMAR[] = {
    {IFLOW_TOOLS_HERMES, NULL, 0, "<tool_call>\n" W "\n</tool_call>", 1, "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\"}\"]]"},
    {IFLOW_TOOLS_HERMES, NULL, 0, "<tool_call>\n" W2 "\n</tool_call>", 1,
     "[[\"get_weather\",\"{\\\"city\\\":\\\"Oslo\\\",\\\"days\\\":3}\"]]"},
    {IFLOW_TOOLS_HERMES, NULL, 0, "<tool_call>\n" CV "\n</tool_call>", 1, "[[\"convert\",\"{\\\"unit\\\":\\\"f\\\"}\"]]"},
    {IFLOW_TOOLS_HERMES, NULL, 0, "<tool_call>\n" CVN "\n</tool_call>", 1,
     "[[\"convert\",\"{\\\"unit\\\":\\\"c\\\",\\\"note\\\":{\\\"$ref\\\":\\\"#/not/a/schema\\\"}}\"]]"},
    {IFLOW_TOOLS_HERMES, NULL, 0, "<tool_call>\n" PING "\n</tool_call>", 1, "[[\"ping\",\"{\\\"any\\\":[1,2]}\"]]"},
    {IFLOW_TOOLS_HERMES, NULL, 0, "<tool_call>\n{\"name\": \"convert\", \"arguments\": {\"unit\": \"k\"}}\n</tool_call>", 0, NULL},
    {IFLOW_TOOLS_HERMES, NULL, 0, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>", 0, NULL},
    {IFLOW_TOOLS_HERMES, NULL, 0, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"x\": 1}}\n</tool_call>", 0, NULL},
    {IFLOW_TOOLS_HERMES, NULL, 0, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"days\": 8}}\n</tool_call>", 0, NULL},
    {IFLOW_TOOLS_HERMES, NULL, 0, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", 0, NULL},
    {IFLOW_TOOLS_HERMES, NULL, 0, "<tool_call>\n" WL "\n</tool_call>", 0, NULL},
    {IFLOW_TOOLS_HERMES, NULL, 0, W, 0, NULL},
    {IFLOW_TOOLS_HERMES, NULL, 0, "<tool_call>\n" W "\n</tool_call>\n<tool_call>\n" CV "\n</tool_call>", 0, NULL},
    {IFLOW_TOOLS_HERMES, NULL, 1, "<tool_call>\n" W "\n</tool_call>\n<tool_call>\n" CV "\n</tool_call>", 1,
     "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\"}\"],[\"convert\",\"{\\\"unit\\\":\\\"f\\\"}\"]]"},
    {IFLOW_TOOLS_HERMES, "convert", 0, "<tool_call>\n" CV "\n</tool_call>", 1, "[[\"convert\",\"{\\\"unit\\\":\\\"f\\\"}\"]]"},
    {IFLOW_TOOLS_HERMES, "convert", 0, "<tool_call>\n" W "\n</tool_call>", 0, NULL},
    /* a named function is called once, parallel or not */
    {IFLOW_TOOLS_HERMES, "convert", 1, "<tool_call>\n" CV "\n</tool_call>", 1,
     "[[\"convert\",\"{\\\"unit\\\":\\\"f\\\"}\"]]"},
    {IFLOW_TOOLS_HERMES, "convert", 1, "<tool_call>\n" CV "\n</tool_call>\n<tool_call>\n" CV "\n</tool_call>", 0, NULL},
    {IFLOW_TOOLS_MISTRAL, "convert", 1, "[" CV ", " CV "]", 0, NULL},
    {IFLOW_TOOLS_LLAMA3_JSON, NULL, 0, WL, 1, "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\"}\"]]"},
    {IFLOW_TOOLS_LLAMA3_JSON, NULL, 0, W, 0, NULL},
    {IFLOW_TOOLS_LLAMA3_JSON, NULL, 0, WL "; " WL, 0, NULL},
    {IFLOW_TOOLS_LLAMA3_JSON, NULL, 1, WL "; " WL, 1,
     "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\"}\"],[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\"}\"]]"},
    {IFLOW_TOOLS_MISTRAL, NULL, 0, "[" W "]", 1, "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\"}\"]]"},
    {IFLOW_TOOLS_MISTRAL, NULL, 0, "[ " W ", " CV " ]", 0, NULL},
    {IFLOW_TOOLS_MISTRAL, NULL, 1, "[ " W ", " CV " ]", 1,
     "[[\"get_weather\",\"{\\\"city\\\":\\\"Paris\\\"}\"],[\"convert\",\"{\\\"unit\\\":\\\"f\\\"}\"]]"},
    {IFLOW_TOOLS_MISTRAL, NULL, 1, "[]", 0, NULL},
    {IFLOW_TOOLS_MISTRAL, NULL, 0, W, 0, NULL},
    {IFLOW_TOOLS_MISTRAL, NULL, 0, "[TOOL_CALLS][" W "]", 0, NULL},
    {IFLOW_TOOLS_GRANITE, "ping", 0, "[" PING "]", 1, "[[\"ping\",\"{\\\"any\\\":[1,2]}\"]]"},
    {IFLOW_TOOLS_GRANITE, "ping", 0, "[" W "]", 0, NULL},
    {IFLOW_TOOLS_HERMES, "loose", 0, "<tool_call>\n{\"name\": \"loose\", \"arguments\": 5}\n</tool_call>", 0, NULL},
    {IFLOW_TOOLS_HERMES, "loose", 0, "<tool_call>\n{\"name\": \"loose\", \"arguments\": {\"k\": 1}}\n</tool_call>", 1,
     "[[\"loose\",\"{\\\"k\\\":1}\"]]"},
    {IFLOW_TOOLS_HERMES, "loose", 0, "<tool_call>\n{\"name\": \"loose\", \"arguments\": {\"k\": \"1\"}}\n</tool_call>", 0, NULL},
};

static void test_grammar(void)
{
    json_error_t e;
    json_t *tools = json_loads(TOOLS, 0, &e);
    CHECK(tools != NULL, "tools: %s", e.text);
    for (size_t i = 0; tools && i < sizeof GRAMMAR / sizeof GRAMMAR[0]; i++) {
        const gcase *c = &GRAMMAR[i];
        iflow_grammar *g;
        int rc = iflow_tool_grammar(&g, c->fmt, tools, c->name, c->parallel);
        CHECK(rc == 0, "case %zu: grammar: %s", i, iflow_errmsg());
        if (rc < 0)
            continue;
        int m = iflow_grammar_match(g, c->text, strlen(c->text), NULL);
        CHECK(m == c->match, "case %zu (%s, %s): match %d, want %d: %s", i, iflow_tool_format_name(c->fmt),
              c->name ? c->name : "required", m, c->match, c->text);
        if (m == 1 && c->calls) {
            json_t *calls;
            char *content;
            int n = iflow_tool_parse(c->fmt, c->text, strlen(c->text), 1, "s", &calls, &content, NULL);
            char *brief = calls_brief(calls);
            CHECK(n > 0 && brief && strcmp(brief, c->calls) == 0 && content[0] == 0, "case %zu: parsed %s, want %s",
                  i, brief, c->calls);
            free(brief);
            free(content);
            json_decref(calls);
        }
        iflow_grammar_close(g);
    }
    /* tools refused, by name and field */
    static const struct {
        const char *tools, *name, *msg;
    } bad[] = {
        {"{}", NULL, "'tools' must be a non-empty list"},
        {"[]", NULL, "'tools' must be a non-empty list"},
        {"[1]", NULL, "tool 0 is not {\"type\": \"function\""},
        {"[{\"type\": \"code\"}]", NULL, "tool 0 is not"},
        {"[{\"type\": \"function\"}]", NULL, "tool 0 has no 'function' object"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"\"}}]", NULL, "tool 0: 'function.name' must be"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"a\"}}, {\"type\": \"function\", \"function\": {}}]", NULL,
         "tool 1: 'function.name'"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": []}}]", NULL,
         "tool 0 ('a'): 'function.parameters' must be a JSON Schema object"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"a\"}}]", "b", "no tool is named 'b'"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": {\"type\": [\"string\", \"null\"]}}}]",
         NULL, "tool 0 ('a'): 'function.parameters' must describe an object"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"a\"}}, {\"type\": \"function\", \"function\":"
         " {\"name\": \"b\", \"parameters\": {\"properties\": {\"x\": {\"not\": {}}}}}}]", NULL,
         "tool 1 ('b'): parameters: json schema: keyword 'not' is not supported, at /properties/x"},
        /* a name with a newline is quoted, and the message stays one line */
        {"[{\"type\": \"function\", \"function\": {\"name\": \"a\\nb\", \"parameters\": {\"not\": {}}}}]", NULL,
         "tool 0 ('a\\x0ab'): parameters: json schema: keyword 'not'"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"a\\nb\", \"parameters\": []}}]", NULL,
         "tool 0 ('a\\x0ab'): 'function.parameters' must be"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": {\"not\": {}}}}, "
         "{\"type\": \"function\", \"function\": {\"name\": \"b\"}}]", "b", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *t = json_loads(bad[i].tools, 0, &e);
        iflow_grammar *g = NULL;
        int rc = iflow_tool_grammar(&g, IFLOW_TOOLS_HERMES, t, bad[i].name, 1);
        if (!bad[i].msg) /* a function not asked for is not looked into */
            CHECK(rc == 0 && g, "bad tools %zu: only the function named counts: %s", i, iflow_errmsg());
        else {
            CHECK_ERR(rc, IFLOW_EINVAL, bad[i].msg, bad[i].msg);
            CHECK(g == NULL, "bad tools %zu: no grammar", i);
        }
        iflow_grammar_close(g);
        json_decref(t);
    }
    iflow_grammar *g = NULL;
    CHECK(iflow_tool_grammar(&g, IFLOW_TOOLS_NONE, tools, NULL, 1) == IFLOW_EINVAL && !g, "no format: refused");
    CHECK_ERR(iflow_tool_grammar(&g, IFLOW_TOOLS_PYTHONIC, tools, NULL, 1), IFLOW_EUNSUPPORTED, "pythonic",
              "not supported yet");
    CHECK(!g, "pythonic: no grammar");
    json_decref(tools);
}

/* ---- markers the tokenizer hides ----------------------------------------------------------- */

static void test_hidden_markers(void)
{
    const char *path = test_data("models/tokenizers/smollm2-135m/tokenizer.json");
    if (!path)
        SKIP("no SmolLM2 tokenizer in the test data");
    size_t n = 0;
    char *json = test_read_file(path, &n), *at;
    /* "<repo_name>" (a special token, id 3) becomes "[TOOL_CALLS]": one byte longer */
    char *s = malloc(n * 2 + 64);
    size_t m = 0, from = 0;
    while (json && (at = memmem(json + from, n - from, "<repo_name>", 11)) != NULL) { /* the file has no NUL */
        memcpy(s + m, json + from, (size_t)(at - json) - from);
        m += (size_t)(at - json) - from;
        memcpy(s + m, "[TOOL_CALLS]", 12);
        m += 12;
        from = (size_t)(at - json) + 11;
    }
    memcpy(s + m, json + from, n - from);
    m += n - from;
    iflow_tokenizer *tok = NULL;
    int rc = iflow_tokenizer_from_hf_json(&tok, s, m, "smollm2-with-tool-calls.json");
    CHECK(rc == 0, "tokenizer: %s", iflow_errmsg());
    free(json);
    free(s);
    if (rc < 0)
        return;
    const char *reply = "Sure.[TOOL_CALLS][" F "]";
    int32_t *ids;
    size_t n_ids;
    rc = iflow_tokenizer_encode(tok, reply, strlen(reply), IFLOW_TOK_PARSE_SPECIAL, &ids, &n_ids);
    CHECK(rc == 0, "encode: %s", iflow_errmsg());
    int has = 0;
    for (size_t i = 0; i < n_ids; i++)
        has |= ids[i] == 3;
    CHECK(has, "the marker is one token");
    char *text, *full;
    size_t len, full_len;
    iflow_tokenizer_continuation(tok, ids, n_ids, 0, &text, &len);
    CHECK(strcmp(text, "Sure.[" F "]") == 0, "decoded text hides the marker: %s", text);
    rc = iflow_tool_text(IFLOW_TOOLS_MISTRAL, tok, ids, (int)n_ids, 0, text, len, &full, &full_len);
    CHECK(rc == 0 && strcmp(full, reply) == 0 && full_len == strlen(reply), "marker put back: %s", full);
    json_t *calls;
    char *content;
    CHECK(iflow_tool_parse(IFLOW_TOOLS_MISTRAL, full, full_len, 0, "1", &calls, &content, NULL) == 1 &&
              strcmp(content, "Sure.") == 0,
          "and the call reads");
    free(content);
    json_decref(calls);
    free(full);
    rc = iflow_tool_text(IFLOW_TOOLS_MISTRAL, tok, ids, (int)n_ids, 0, text, 4, &full, &full_len); /* "Sure" */
    CHECK(rc == 0 && strcmp(full, "Sure") == 0 && full_len == 4, "a marker after a stop string's cut: left out (%s)",
          full);
    free(full);
    rc = iflow_tool_text(IFLOW_TOOLS_HERMES, tok, ids, (int)n_ids, 0, text, len, &full, &full_len);
    CHECK(rc == 0 && strcmp(full, text) == 0, "another format's marker: not put back (%s)", full);
    free(full);
    free(text);
    free(ids);
    iflow_tokenizer_close(tok);
}

int main(void)
{
    RUN(test_formats);
    RUN(test_parse);
    RUN(test_ids);
    RUN(test_grammar);
    RUN(test_hidden_markers);
    return check_summary("test_toolcall");
}
