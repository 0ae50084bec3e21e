/* fuzz_toolcall.c -- tool calls (toolcall.h). The first byte picks the format (its value mod IFLOW_TOOLS_COUNT, 6) and
 * the mode (bit 3: the grammar, else parsing; bit 4: parallel calls; bit 5: the first tool by name).
 *   Parsing: the rest is a reply. The count returned is the array's; no call gives the whole text
 *   back as content, calls give at most its length; every call has a nine-character id of letters
 *   and digits, "type": "function", a non-empty name and arguments that read as a JSON object.
 *   The grammar: the rest is a tools list (JSON), then optionally "\n%%\n" and a text. The tools
 *   are refused with a one-line message and no grammar, or the grammar opens (or meets a limit);
 *   a text it accepts whole reads back (parsed bare) as at least one call with no content, unless
 *   it holds a number the JSON reader refuses (16 digits or more, or an exponent). */
#include <ctype.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "libcore/base/error.h"
#include "tests/fuzz/gfuzz.h"
#include "libcore/serving/toolcall.h"

static void check_calls(const json_t *calls, int n, const char *text, size_t len, const char *content, size_t clen)
{
    if (!json_is_array(calls) || (int)json_array_size(calls) != n || !content || content[clen] != 0)
        abort();
    if (n == 0 && (clen != len || memcmp(content, text, len) != 0))
        abort();
    if (clen > len)
        abort();
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c)
    {
        const char *id = json_string_value(json_object_get(c, "id"));
        const char *type = json_string_value(json_object_get(c, "type"));
        const json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        if (!id || strlen(id) != 9 || !type || strcmp(type, "function") != 0 || !name || !name[0] || !args)
            abort();
        for (int k = 0; k < 9; k++)
            if (!isalnum((unsigned char)id[k]))
                abort();
        json_error_t e;
        json_t *a = json_loads(args, 0, &e);
        if (!json_is_object(a))
            abort();
        json_decref(a);
    }
}

static void parse(int fmt, int bare, const char *text, size_t len, int want_calls)
{
    json_t *calls;
    char *content;
    size_t clen;
    int n = iflow_tool_parse(fmt, text, len, bare, "fuzz", &calls, &content, &clen);
    if (n < 0) {
        if (n != IFLOW_ENOMEM)
            abort();
        return;
    }
    check_calls(calls, n, text, len, content, clen);
    if (want_calls && (n < 1 || clen != 0))
        abort(); /* a sentence of the call grammar that does not read back */
    json_decref(calls);
    free(content);
}

/* A number the JSON reader refuses may be in text: a run of 16 digits, or an exponent. */
static int odd_numbers(const char *s, size_t n)
{
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        run = isdigit((unsigned char)s[i]) ? run + 1 : 0;
        if (run >= 16 || (i > 0 && (s[i] == 'e' || s[i] == 'E') && isdigit((unsigned char)s[i - 1])))
            return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int fmt = data[0] % IFLOW_TOOLS_COUNT, grammar = data[0] & 8, parallel = !!(data[0] & 16), named = data[0] & 32;
    const char *in = (const char *)data + 1;
    size_t n = size - 1;
    if (!grammar) {
        parse(fmt, (data[0] >> 6) & 1, in, n, 0);
        return 0;
    }
    const char *text;
    size_t tlen, len;
    two_parts(in, n, &tlen, &text, &len);
    json_error_t e;
    json_t *tools = json_loadb(in, tlen, 0, &e);
    if (!tools)
        return 0;
    const char *name = named ? json_string_value(json_object_get(json_object_get(json_array_get(tools, 0), "function"),
                                                                 "name"))
                             : NULL;
    iflow_grammar *g = (iflow_grammar *)&e; /* must be set to NULL on failure */
    int rc = iflow_tool_grammar(&g, fmt, tools, name, parallel);
    if (rc < 0) {
        if (g)
            abort();
        one_line();
    } else if (text) {
        int m = iflow_grammar_match(g, text, len, NULL);
        if (m < 0 && m != IFLOW_ERANGE)
            abort();
        if (m == 1)
            parse(fmt, 1, text, len, !odd_numbers(text, len));
    }
    iflow_grammar_close(rc == 0 ? g : NULL);
    json_decref(tools);
    return 0;
}
