/* toolcall.c -- tool calls out of a reply, and the grammar of a call. See toolcall.h. */
#include "libcore/serving/toolcall.h"
#include "libcore/base/error.h"
#include "libcore/base/quote.h"
#include "libcore/base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static int oom(void) { return iflow_seterr(IFLOW_ENOMEM, "out of memory"); }

/* ---- formats ------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    const char *open, *close; /* the markers around the calls (close: hermes only)          */
    const char *args;         /* the key the format's calls give their arguments under      */
} FORMATS[IFLOW_TOOLS_COUNT] = {
    [IFLOW_TOOLS_NONE] = {"none", NULL, NULL, "arguments"},
    [IFLOW_TOOLS_HERMES] = {"hermes", "<tool_call>", "</tool_call>", "arguments"},
    [IFLOW_TOOLS_LLAMA3_JSON] = {"llama3_json", "<|python_tag|>", NULL, "parameters"},
    [IFLOW_TOOLS_MISTRAL] = {"mistral", "[TOOL_CALLS]", NULL, "arguments"},
    [IFLOW_TOOLS_GRANITE] = {"granite", "<|tool_call|>", NULL, "arguments"},
    [IFLOW_TOOLS_PYTHONIC] = {"pythonic", "<|python_start|>", "<|python_end|>", "arguments"},
};

const char *iflow_tool_format_name(int fmt)
{
    return fmt >= 0 && fmt < IFLOW_TOOLS_COUNT ? FORMATS[fmt].name : "?";
}

int iflow_tool_format_from_name(const char *name)
{
    for (int f = 0; name && f < IFLOW_TOOLS_COUNT; f++)
        if (strcmp(name, FORMATS[f].name) == 0)
            return f;
    return name && strcmp(name, "llama4_pythonic") == 0 ? IFLOW_TOOLS_PYTHONIC : -1;
}

/* Where s [n] contains the NUL-terminated needle, or NULL. */
static const char *find(const char *s, size_t n, const char *needle)
{
    return memmem(s, n, needle, strlen(needle));
}

/* Past the NUL-terminated tag when s [n] holds it at i, else i. */
static size_t after_tag(const char *s, size_t i, size_t n, const char *tag)
{
    size_t k = strlen(tag);
    return n - i >= k && memcmp(s + i, tag, k) == 0 ? i + k : i;
}

int iflow_tool_format_detect(const char *text, size_t len)
{
    /* Llama 3.1's template names <|python_tag|> only for its built-in tools; what marks its
     * JSON calls is the instruction to answer with "parameters". */
    static const struct {
        const char *marker;
        int fmt;
    } SIGNS[] = {{"[func_name1(", IFLOW_TOOLS_PYTHONIC}, /* vLLM's Llama 3.2 pythonic template */
                 {"<|python_start|>", IFLOW_TOOLS_PYTHONIC},
                 {"<tool_call>", IFLOW_TOOLS_HERMES},
                 {"[TOOL_CALLS]", IFLOW_TOOLS_MISTRAL},
                 {"<|tool_call|>", IFLOW_TOOLS_GRANITE},
                 {"<|python_tag|>", IFLOW_TOOLS_LLAMA3_JSON},
                 {"\"parameters\": dictionary of argument name", IFLOW_TOOLS_LLAMA3_JSON}};
    for (size_t i = 0; text && i < sizeof SIGNS / sizeof SIGNS[0]; i++)
        if (find(text, len, SIGNS[i].marker))
            return SIGNS[i].fmt;
    return IFLOW_TOOLS_NONE;
}

/* ---- tools and their grammar ------------------------------------------------------------- */

/* A schema's "type" (absent, a name or a list of names) allows objects. */
static int type_allows_object(const json_t *type)
{
    if (!type)
        return 1;
    if (json_is_string(type))
        return strcmp(json_string_value(type), "object") == 0;
    for (size_t i = 0; i < json_array_size(type); i++) {
        const char *t = json_string_value(json_array_get(type, i));
        if (t && strcmp(t, "object") == 0)
            return 1;
    }
    return 0;
}

int iflow_tools_check(const json_t *tools, const char *name)
{
    if (!json_is_array(tools) || json_array_size(tools) == 0)
        return iflow_seterr(IFLOW_EINVAL, "'tools' must be a non-empty list");
    int found = 0;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        const json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
        const json_t *fname = json_object_get(fn, "name"), *params = json_object_get(fn, "parameters");
        if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
            return iflow_seterr(IFLOW_EINVAL, "tool %zu is not {\"type\": \"function\", \"function\": {...}}", i);
        if (!json_is_object(fn))
            return iflow_seterr(IFLOW_EINVAL, "tool %zu has no 'function' object", i);
        if (!json_is_string(fname) || json_string_length(fname) == 0 ||
            strlen(json_string_value(fname)) != json_string_length(fname))
            return iflow_seterr(IFLOW_EINVAL, "tool %zu: 'function.name' must be a non-empty string", i);
        if (params && !json_is_object(params))
            return iflow_seterr(IFLOW_EINVAL, "tool %zu ('%s'): 'function.parameters' must be a JSON Schema object", i,
                                iflow_quote(json_string_value(fname)));
        if (params && !type_allows_object(json_object_get(params, "type")))
            return iflow_seterr(IFLOW_EINVAL, "tool %zu ('%s'): 'function.parameters' must describe an object (its "
                                "\"type\" does not allow \"object\")", i,
                                iflow_quote(json_string_value(fname)));
        found |= name && strcmp(name, json_string_value(fname)) == 0;
    }
    if (name && !found)
        return iflow_seterr(IFLOW_EINVAL, "no tool is named '%s'", iflow_quote(name));
    return 0;
}

/* Every "$ref": "#..." below s made relative to the document root, s being placed at `at` (a
 * JSON pointer). The values of const, enum, default and examples are data, not schemas. */
static int rebase_refs(json_t *s, const char *at)
{
    static const char *const DATA[] = {"const", "enum", "default", "examples"};
    if (json_is_array(s)) {
        for (size_t i = 0; i < json_array_size(s); i++)
            if (rebase_refs(json_array_get(s, i), at) < 0)
                return IFLOW_ENOMEM;
        return 0;
    }
    if (!json_is_object(s))
        return 0;
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v)
    {
        int data = 0;
        for (size_t i = 0; i < sizeof DATA / sizeof DATA[0]; i++)
            data |= strcmp(key, DATA[i]) == 0;
        if (strcmp(key, "$ref") == 0 && json_is_string(v) && json_string_value(v)[0] == '#') {
            const char *ref = json_string_value(v);
            size_t n = strlen(at) + strlen(ref) + 2;
            char *r = malloc(n);
            if (!r)
                return oom();
            snprintf(r, n, "#%s%s", at, ref + 1);
            int rc = json_string_set(v, r);
            free(r);
            if (rc < 0)
                return oom();
        } else if (!data && rebase_refs(v, at) < 0)
            return IFLOW_ENOMEM;
    }
    return 0;
}

/* The schema of one call of function fn: {"name": its name, <args>: its parameters}, the
 * parameters' references rebased to `at` + "/properties/<args>". */
static json_t *call_schema(const json_t *fn, const char *args, const char *at)
{
    const json_t *params = json_object_get(fn, "parameters");
    json_t *p = params ? json_deep_copy(params) : json_pack("{s:s}", "type", "object");
    char where[256];
    snprintf(where, sizeof where, "%s/properties/%s", at, args);
    if (!p || rebase_refs(p, where) < 0) {
        json_decref(p);
        return NULL;
    }
    json_object_del(p, "$id"); /* the parameters' own root annotations: no longer a root */
    json_object_del(p, "$schema");
    /* arguments are an object whatever else the schema allows (iflow_tools_check: it allows one) */
    if (json_object_set_new(p, "type", json_string("object")) < 0) {
        json_decref(p);
        return NULL;
    }
    return json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s,s]}", "type", "object", "properties", "name", "const",
                     json_object_get(fn, "name"), args, p, "required", "name", args);
}

/* The JSON Schema of the value a constrained reply holds: one call (hermes, llama3_json) or a
 * list of them (mistral, granite). */
static json_t *calls_schema(int fmt, const json_t *tools, const char *name, int parallel)
{
    const int list = fmt == IFLOW_TOOLS_MISTRAL || fmt == IFLOW_TOOLS_GRANITE;
    json_t *any = json_array();
    size_t i, k = 0;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        const json_t *fn = json_object_get(t, "function");
        if (!any || (name && strcmp(json_string_value(json_object_get(fn, "name")), name) != 0))
            continue;
        char at[64];
        snprintf(at, sizeof at, "%s/anyOf/%zu", list ? "/items" : "", k++);
        json_t *c = call_schema(fn, FORMATS[fmt].args, at);
        if (!c || json_array_append_new(any, c) < 0) {
            json_decref(any);
            any = NULL;
        }
    }
    json_t *one = any ? json_pack("{s:o}", "anyOf", any) : NULL;
    if (!list || !one)
        return one;
    json_t *arr = json_pack("{s:s, s:o, s:i}", "type", "array", "items", one, "minItems", 1);
    if (arr && !parallel && json_object_set_new(arr, "maxItems", json_integer(1)) < 0) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

int iflow_tool_grammar(iflow_grammar **out, int fmt, const json_t *tools, const char *name, int parallel)
{
    *out = NULL;
    if (fmt <= IFLOW_TOOLS_NONE || fmt >= IFLOW_TOOLS_COUNT)
        return iflow_seterr(IFLOW_EINVAL, "no tool-call format to constrain the reply to");
    if (fmt == IFLOW_TOOLS_PYTHONIC)
        return iflow_seterr(IFLOW_EUNSUPPORTED, "a required or named call in format pythonic is not supported yet "
                            "(tool_choice \"auto\" reads its calls)");
    int rc = iflow_tools_check(tools, name);
    if (rc < 0)
        return rc;
    parallel &= !name; /* a named function is called once (OpenAI's forced call, vLLM's) */
    /* each function's parameters alone first, so that an error points into them */
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        const json_t *fn = json_object_get(t, "function"), *params = json_object_get(fn, "parameters");
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (!params || (name && strcmp(fname, name) != 0))
            continue;
        char *ptext = json_dumps(params, JSON_COMPACT | JSON_PRESERVE_ORDER), *pg = NULL;
        rc = ptext ? iflow_grammar_from_json_schema(ptext, strlen(ptext), &pg) : oom();
        free(ptext);
        free(pg);
        if (rc < 0)
            return iflow_preperr(rc, "tool %zu ('%s'): parameters", i, iflow_quote(fname));
    }
    json_t *schema = calls_schema(fmt, tools, name, parallel);
    char *text = schema ? json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL, *gbnf = NULL;
    json_decref(schema);
    if (!text)
        return oom();
    rc = iflow_grammar_from_json_schema(text, strlen(text), &gbnf);
    free(text);
    if (rc < 0)
        return rc;
    /* the schema's rules, then the format's frame around its root */
    static const char *const FRAME[IFLOW_TOOLS_COUNT][2] = {
        [IFLOW_TOOLS_HERMES] = {"tools-one ::= \"<tool_call>\\n\" root \"\\n</tool_call>\"\n"
                                "tools-root ::= tools-one\n",
                                "tools-one ::= \"<tool_call>\\n\" root \"\\n</tool_call>\"\n"
                                "tools-root ::= tools-one (\"\\n\" tools-one)*\n"},
        [IFLOW_TOOLS_LLAMA3_JSON] = {"tools-root ::= root\n", "tools-root ::= root (\"; \" root)*\n"},
        [IFLOW_TOOLS_MISTRAL] = {"tools-root ::= root\n", "tools-root ::= root\n"},
        [IFLOW_TOOLS_GRANITE] = {"tools-root ::= root\n", "tools-root ::= root\n"},
    };
    const char *frame = FRAME[fmt][parallel != 0];
    size_t n = strlen(gbnf), m = strlen(frame);
    char *all = malloc(n + m + 2);
    if (!all) {
        free(gbnf);
        return oom();
    }
    memcpy(all, gbnf, n);
    all[n] = '\n';
    memcpy(all + n + 1, frame, m + 1);
    free(gbnf);
    rc = iflow_grammar_open(out, all, n + 1 + m, "tools-root");
    free(all);
    return rc;
}

/* ---- the markers a tokenizer hides -------------------------------------------------------- */

/* Is id a token that decodes to nothing and is spelled `marker`? */
static int hidden_marker(const iflow_tokenizer *tok, int32_t id, const char *marker)
{
    size_t n;
    char c;
    const char *s = iflow_tokenizer_token_text(tok, id, &n);
    return marker && s && n == strlen(marker) && memcmp(s, marker, n) == 0 &&
           iflow_tokenizer_piece(tok, id, 0, &c, 1) == 0;
}

int iflow_tool_text(int fmt, const iflow_tokenizer *tok, const int32_t *ids, int n, int starts, const char *text,
                    size_t len, char **out, size_t *out_len)
{
    *out = NULL;
    if (fmt < 0 || fmt >= IFLOW_TOOLS_COUNT)
        fmt = IFLOW_TOOLS_NONE;
    const char *marks[2] = {FORMATS[fmt].open, FORMATS[fmt].close};
    size_t cap = len + 1, used = 0, from = 0;
    char *s = malloc(cap);
    if (!s)
        return oom();
    for (int i = 0; i < n && tok; i++) {
        for (int k = 0; k < 2; k++) {
            if (!hidden_marker(tok, ids[i], marks[k]))
                continue;
            char *before;
            size_t at;
            int rc = iflow_tokenizer_continuation(tok, ids, (size_t)i, starts, &before, &at);
            if (rc < 0) {
                free(s);
                return rc;
            }
            free(before);
            if (at > len || at < from)
                break; /* cut off by a stop string (or a tokenizer that trims): left out */
            size_t m = strlen(marks[k]);
            char *t = realloc(s, cap + m);
            if (!t) {
                free(s);
                return oom();
            }
            s = t, cap += m;
            memcpy(s + used, text + from, at - from);
            used += at - from, from = at;
            memcpy(s + used, marks[k], m);
            used += m;
        }
    }
    memcpy(s + used, text + from, len - from);
    used += len - from;
    s[used] = 0;
    *out = s;
    if (out_len)
        *out_len = used;
    return 0;
}

/* ---- reading calls ------------------------------------------------------------------------ */

/* One JSON value at s [n]: the value, *used = the bytes it took; NULL if none reads. */
static json_t *json_at(const char *s, size_t n, size_t *used)
{
    json_error_t e;
    json_t *v = json_loadb(s, n, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &e); /* a key twice: the last */
    *used = v ? (size_t)e.position : 0;
    return v;
}

/* Nine letters and digits from seed and the call's index. */
static void call_id(const char *seed, size_t index, char out[10])
{
    static const char ALNUM[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    XXH64_hash_t h = XXH3_64bits_withSeed(seed ? seed : "", seed ? strlen(seed) : 0, (XXH64_hash_t)index);
    for (int i = 0; i < 9; i++, h /= 62)
        out[i] = ALNUM[h % 62];
    out[9] = 0;
}

/* v (a call as the model wrote it) appended to calls in OpenAI's form: 0, or -1 when v is no
 * call. */
static int add_call(json_t *calls, const json_t *v, const char *seed)
{
    const json_t *name = json_object_get(v, "name"), *args = json_object_get(v, "arguments");
    if (!args)
        args = json_object_get(v, "parameters");
    json_t *parsed = NULL;
    if (json_is_string(args)) { /* arguments as JSON text, as OpenAI's API itself gives them */
        json_error_t e;
        parsed = json_loadb(json_string_value(args), json_string_length(args), 0, &e);
        if (!parsed)
            return -1;
        args = parsed;
    }
    if (!json_is_object(v) || !json_is_string(name) || json_string_length(name) == 0 ||
        (args && !json_is_object(args))) {
        json_decref(parsed);
        return -1;
    }
    char *text = args ? json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER) : strdup("{}"), id[10];
    json_decref(parsed);
    call_id(seed, json_array_size(calls), id);
    json_t *c = text ? json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function", "name", name,
                                 "arguments", text)
                     : NULL;
    free(text);
    return c && json_array_append_new(calls, c) == 0 ? 0 : -1;
}

/* hermes: every <tool_call> block (the last may lack its </tool_call>); *out = the text outside. */
static int parse_hermes(const char *s, size_t n, const char *seed, json_t *calls, char *out, size_t *out_n)
{
    const char *open = FORMATS[IFLOW_TOOLS_HERMES].open, *close = FORMATS[IFLOW_TOOLS_HERMES].close;
    size_t pos = 0, lo = strlen(open), lc = strlen(close);
    *out_n = 0;
    const char *at;
    while ((at = find(s + pos, n - pos, open)) != NULL) {
        size_t start = (size_t)(at - s);
        memcpy(out + *out_n, s + pos, start - pos);
        *out_n += start - pos;
        size_t body = start + lo;
        const char *end = find(s + body, n - body, close);
        size_t stop = end ? (size_t)(end - s) : n, used;
        size_t i = iflow_skip_ws(s, body, stop);
        json_t *v = json_at(s + i, stop - i, &used);
        int bad = !v || iflow_skip_ws(s, i + used, stop) != stop || add_call(calls, v, seed) < 0;
        json_decref(v);
        if (bad)
            return -1;
        pos = end ? stop + lc : n;
    }
    memcpy(out + *out_n, s + pos, n - pos);
    *out_n += n - pos;
    return 0;
}

/* llama3_json: the whole text is calls, after an optional <|python_tag|>, separated by ';'. */
static int parse_llama3(const char *s, size_t n, const char *seed, json_t *calls)
{
    const char *tag = FORMATS[IFLOW_TOOLS_LLAMA3_JSON].open;
    size_t i = iflow_skip_ws(s, after_tag(s, iflow_skip_ws(s, 0, n), n, tag), n), used;
    if (i == n || s[i] != '{')
        return -1;
    while (i < n) {
        json_t *v = json_at(s + i, n - i, &used);
        int bad = !json_is_object(v) || add_call(calls, v, seed) < 0;
        json_decref(v);
        if (bad)
            return -1;
        i = iflow_skip_ws(s, i + used, n);
        if (i < n && s[i] != ';')
            return -1;
        if (i < n)
            i = iflow_skip_ws(s, i + 1, n);
    }
    return 0;
}

/* ---- pythonic: Python call syntax, read as data ---- */

typedef struct {
    const char *s;
    size_t n, i;
    int depth;
} pyread;

static void py_ws(pyread *r) { r->i = iflow_skip_ws(r->s, r->i, r->n); }

static int py_eat(pyread *r, char c)
{
    py_ws(r);
    if (r->i < r->n && r->s[r->i] == c) {
        r->i++;
        return 1;
    }
    return 0;
}

static int py_ident_char(char c, int first)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
}

/* An identifier (dots allowed between parts when `dotted`): its bytes in a new string, or NULL. */
static char *py_ident(pyread *r, int dotted)
{
    py_ws(r);
    size_t a = r->i;
    while (r->i < r->n && (py_ident_char(r->s[r->i], r->i == a || r->s[r->i - 1] == '.') ||
                           (dotted && r->s[r->i] == '.' && r->i > a)))
        r->i++;
    if (r->i == a || r->s[r->i - 1] == '.')
        return NULL;
    return strndup(r->s + a, r->i - a);
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* A string literal in single or double quotes: the escapes \n \t \r \\ \' \" \xNN \uNNNN read, others
 * kept as Python keeps them; a NUL (\0) refuses the string (JSON text cannot carry it here). */
static json_t *py_string(pyread *r)
{
    char q = r->s[r->i++], *out = malloc(r->n - r->i + 1);
    size_t k = 0;
    while (out && r->i < r->n && r->s[r->i] != q && r->s[r->i] != '\n') {
        char c = r->s[r->i++];
        if (c != '\\') {
            out[k++] = c;
            continue;
        }
        if (r->i >= r->n)
            break;
        c = r->s[r->i++];
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : 0;
        if (digits) {
            unsigned v = 0;
            for (int d = 0; d < digits; d++) {
                int h = r->i < r->n ? hexval(r->s[r->i]) : -1;
                if (h < 0) {
                    free(out);
                    return NULL;
                }
                v = v * 16 + (unsigned)h, r->i++;
            }
            if (v >= 0xd800 && v < 0xe000)
                v = 0xfffd; /* a lone surrogate: not UTF-8 */
            if (v < 0x80) /* as UTF-8 */
                out[k++] = (char)v;
            else if (v < 0x800)
                out[k++] = (char)(0xc0 | v >> 6), out[k++] = (char)(0x80 | (v & 0x3f));
            else
                out[k++] = (char)(0xe0 | v >> 12), out[k++] = (char)(0x80 | ((v >> 6) & 0x3f)),
                out[k++] = (char)(0x80 | (v & 0x3f));
            continue;
        }
        if (c == 'n' || c == 't' || c == 'r' || c == '0')
            out[k++] = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : 0; /* NUL: refused below */
        else if (c == '\\' || c == '\'' || c == '"')
            out[k++] = c;
        else if (c != '\n') /* a backslash-newline continues the line */
            out[k++] = '\\', out[k++] = c; /* Python keeps an unknown escape as it is */
    }
    if (!out || r->i >= r->n || r->s[r->i] != q) {
        free(out);
        return NULL;
    }
    r->i++;
    json_t *v = memchr(out, 0, k) ? NULL : json_stringn(out, k); /* NULL when not UTF-8, or holding a NUL */
    free(out);
    return v;
}

static json_t *py_value(pyread *r);

/* Where a comma-separated sequence ending at `close` stands (a trailing comma allowed; `first`:
 * no item read yet): 1 when an item comes next, 0 when the sequence ended (close taken), -1 when
 * neither (two items without a comma). */
static int py_next(pyread *r, char close, int first)
{
    if (py_eat(r, close))
        return 0;
    if (first)
        return 1;
    if (!py_eat(r, ','))
        return -1;
    return py_eat(r, close) ? 0 : 1;
}

/* The items of a list, a tuple or a dict up to `close`. */
static json_t *py_items(pyread *r, char close, int dict)
{
    json_t *v = dict ? json_object() : json_array();
    int more = -1;
    for (int first = 1; v && (more = py_next(r, close, first)) > 0; first = 0) {
        json_t *key = dict ? py_value(r) : NULL;
        json_t *item = !dict || (json_is_string(key) && py_eat(r, ':')) ? py_value(r) : NULL;
        int ok = item && (dict ? json_object_set_new(v, json_string_value(key), item)
                               : json_array_append_new(v, item)) == 0; /* both take item, also on failure */
        json_decref(key);
        if (!ok) {
            more = -1;
            break;
        }
    }
    if (more == 0)
        return v;
    json_decref(v);
    return NULL;
}

/* A Python literal as JSON: strings, numbers, True, False, None, lists, tuples, dicts. */
static json_t *py_value(pyread *r)
{
    py_ws(r);
    if (r->i >= r->n || r->depth >= 64)
        return NULL;
    char c = r->s[r->i];
    if (c == '\'' || c == '"')
        return py_string(r);
    if (c == '[' || c == '(' || c == '{') {
        r->i++, r->depth++;
        json_t *v = py_items(r, c == '[' ? ']' : c == '(' ? ')' : '}', c == '{');
        r->depth--;
        return v;
    }
    static const struct {
        const char *word;
        json_t *(*make)(void);
    } WORDS[] = {{"True", json_true}, {"False", json_false}, {"None", json_null}};
    for (size_t k = 0; k < 3; k++) {
        size_t l = strlen(WORDS[k].word);
        if (r->n - r->i >= l && memcmp(r->s + r->i, WORDS[k].word, l) == 0 &&
            (r->i + l == r->n || !py_ident_char(r->s[r->i + l], 0))) {
            r->i += l;
            return WORDS[k].make();
        }
    }
    size_t used; /* a number as JSON reads it (Python's 1e5, -2, 0.5 alike) */
    if (c != '-' && (c < '0' || c > '9'))
        return NULL;
    json_t *v = json_at(r->s + r->i, r->n - r->i, &used);
    if (!json_is_number(v)) {
        json_decref(v);
        return NULL;
    }
    r->i += used;
    return v;
}

/* One call: NAME(key=value, ...) -> {"name": NAME, "arguments": {...}}; a key twice is refused. */
static json_t *py_call(pyread *r)
{
    char *name = py_ident(r, 1);
    json_t *args = name && py_eat(r, '(') ? json_object() : NULL;
    int more = -1;
    for (int first = 1; args && (more = py_next(r, ')', first)) > 0; first = 0) {
        char *key = py_ident(r, 0);
        json_t *v = key && py_eat(r, '=') && !json_object_get(args, key) ? py_value(r) : NULL;
        int ok = v && json_object_set_new(args, key, v) == 0; /* takes v, also on failure */
        free(key);
        if (!ok) {
            more = -1;
            break;
        }
    }
    json_t *call = more == 0 ? json_pack("{s:s, s:O}", "name", name, "arguments", args) : NULL;
    json_decref(args);
    free(name);
    return call;
}

/* pythonic: the whole text is [call, ...], between an optional <|python_start|> and <|python_end|>. */
static int parse_pythonic(const char *s, size_t n, const char *seed, json_t *calls)
{
    const char *open = FORMATS[IFLOW_TOOLS_PYTHONIC].open, *close = FORMATS[IFLOW_TOOLS_PYTHONIC].close;
    pyread r = {.s = s, .n = n};
    py_ws(&r);
    r.i = after_tag(s, r.i, n, open);
    if (!py_eat(&r, '['))
        return -1;
    int more;
    for (int first = 1; (more = py_next(&r, ']', first)) > 0; first = 0) {
        json_t *c = py_call(&r);
        int bad = !c || add_call(calls, c, seed) < 0;
        json_decref(c);
        if (bad)
            return -1;
    }
    py_ws(&r);
    r.i = after_tag(s, r.i, n, close);
    return more == 0 && iflow_skip_ws(s, r.i, n) == n && json_array_size(calls) ? 0 : -1;
}

/* A list of calls (or one call) from s[i..n), nothing after it, into calls: 0, or -1 (calls
 * then cleared). */
static int read_list(const char *s, size_t i, size_t n, const char *seed, json_t *calls)
{
    size_t used;
    i = iflow_skip_ws(s, i, n);
    json_t *v = json_at(s + i, n - i, &used);
    int bad = !v || iflow_skip_ws(s, i + used, n) != n || (json_is_array(v) && json_array_size(v) == 0);
    if (json_is_array(v))
        for (size_t k = 0; !bad && k < json_array_size(v); k++)
            bad = add_call(calls, json_array_get(v, k), seed) < 0;
    else if (!bad)
        bad = add_call(calls, v, seed) < 0;
    json_decref(v);
    if (bad)
        json_array_clear(calls);
    return bad ? -1 : 0;
}

/* mistral, granite: a list of calls (or one call) after the marker, nothing after it; `bare`:
 * the whole text may be the list (a constrained reply: a marker in its strings is their text,
 * found by fuzz_toolcall). *before = the text before the marker. */
static int parse_list(int fmt, const char *s, size_t n, int bare, const char *seed, json_t *calls, size_t *before)
{
    *before = 0;
    if (bare && read_list(s, 0, n, seed, calls) == 0)
        return 0;
    const char *at = find(s, n, FORMATS[fmt].open);
    if (!at)
        return -1;
    *before = (size_t)(at - s);
    return read_list(s, *before + strlen(FORMATS[fmt].open), n, seed, calls);
}

int iflow_tool_parse(int fmt, const char *text, size_t len, int bare, const char *seed, json_t **calls, char **content,
                     size_t *content_len)
{
    *calls = json_array();
    *content = malloc(len + 1);
    if (!*calls || !*content) {
        json_decref(*calls);
        free(*content);
        *calls = NULL, *content = NULL;
        return oom();
    }
    size_t n_out = 0, before = 0;
    int rc = -1;
    if (fmt == IFLOW_TOOLS_HERMES)
        rc = parse_hermes(text, len, seed, *calls, *content, &n_out);
    else if (fmt == IFLOW_TOOLS_LLAMA3_JSON)
        rc = parse_llama3(text, len, seed, *calls);
    else if (fmt == IFLOW_TOOLS_PYTHONIC)
        rc = parse_pythonic(text, len, seed, *calls);
    else if (fmt == IFLOW_TOOLS_MISTRAL || fmt == IFLOW_TOOLS_GRANITE) {
        rc = parse_list(fmt, text, len, bare, seed, *calls, &before);
        memcpy(*content, text, before);
        n_out = before;
    }
    if (rc < 0 || json_array_size(*calls) == 0) { /* no call, or not all of them read: the text as it is */
        json_array_clear(*calls);
        memcpy(*content, text, len);
        n_out = len;
    } else { /* the text outside the calls, trimmed */
        size_t a = 0;
        iflow_trim_ws(*content, &a, &n_out);
        memmove(*content, *content + a, n_out - a);
        n_out -= a;
    }
    (*content)[n_out] = 0;
    if (content_len)
        *content_len = n_out;
    return (int)json_array_size(*calls);
}
