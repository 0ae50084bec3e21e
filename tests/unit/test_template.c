/*
 * test_template.c -- the chat template renderer (libcore/serving/template.h) against Python's
 * jinja2 3.1.6 in transformers' environment (ImmutableSandboxedEnvironment, trim_blocks,
 * lstrip_blocks, loopcontrols, transformers' tojson, raise_exception, strftime_now):
 *   - tests/fixtures/chat/features.jsonl: one Jinja feature a line (tests/fixtures/gen_chat_refs.py)
 *   - tests/fixtures/chat/expected.jsonl: 16 real chat templates over 14 conversations
 *   - this file's cases (their outputs rendered by jinja2 when written): corners the fixtures leave
 *     out, and errors (jinja2 fails on each: to compile, or to render)
 *   - messages (line and column), the limits (each fails cleanly), odd bytes, concurrent renders
 * strftime_now's clock is pinned with "__now__" to 2024-07-26 00:00 in TZ=UTC, the fixtures' date.
 */
#include "tests/unit/check.h"
#include "tests/unit/jsonl.h"
#include "libcore/base/error.h"
#include "libcore/serving/template.h"

#include <jansson.h>
#include <pthread.h>

#define NOW 1721952000 /* 2024-07-26 00:00:00 UTC */

/* Open and render; *out is malloc'd on success. The open's or the render's code. */
static int render(const char *text, size_t len, const json_t *vars, char **out, size_t *n, int *syntax)
{
    iflow_template *t;
    *out = NULL;
    *n = 0;
    int rc = iflow_template_open(&t, text, len, "T");
    if (syntax)
        *syntax = rc < 0;
    if (rc < 0)
        return rc;
    rc = iflow_template_render(t, vars, out, n);
    iflow_template_close(t);
    return rc;
}

static int render_str(const char *text, const char *vars_json, char **out, size_t *n)
{
    json_t *vars = json_loads(vars_json ? vars_json : "{}", 0, NULL);
    json_object_set_new(vars, "__now__", json_integer(NOW));
    int rc = render(text, strlen(text), vars, out, n, NULL);
    json_decref(vars);
    return rc;
}

/* One fixture case: the output, "syntax" (the template does not compile), or a render error
 * (a TemplateError's message must be the template's). */
static void check_case(const char *what, const char *text, size_t len, json_t *vars, const json_t *want)
{
    char *out;
    size_t n;
    int syntax;
    json_object_set_new(vars, "__now__", json_integer(NOW));
    int rc = render(text, len, vars, &out, &n, &syntax);
    const json_t *output = json_object_get(want, "output"), *error = json_object_get(want, "error");
    const char *type = json_string_value(json_object_get(want, "error_type"));
    if (output) {
        CHECK(rc == 0 && n == json_string_length(output) && memcmp(out, json_string_value(output), n) == 0,
              "%s: rc %d (%s)\n  got  %.*s\n  want %s", what, rc, rc ? iflow_errmsg() : "", (int)n, out ? out : "",
              json_string_value(output));
    } else if (json_is_string(error) && !strcmp(json_string_value(error), "syntax")) {
        CHECK(rc == IFLOW_EFORMAT && syntax, "%s: compiled (rc %d) though jinja2 refuses it", what, rc);
    } else {
        CHECK(rc < 0 && !syntax, "%s: rc %d, syntax %d, though jinja2 fails to render it", what, rc, syntax);
        char msg[1100];
        snprintf(msg, sizeof msg, "T: %s", json_string_value(error));
        if (type && !strcmp(type, "TemplateError"))
            CHECK(rc == IFLOW_EINVAL && !strcmp(iflow_errmsg(), msg), "%s: message '%s', want '%s'", what,
                  iflow_errmsg(), msg);
    }
    free(out);
}

static void test_features(void)
{
    size_t n;
    json_t **lines = test_read_jsonl("chat/features.jsonl", 0, &n);
    if (!lines)
        SKIP("tests/fixtures/chat/features.jsonl is missing");
    CHECK(n >= 150, "features.jsonl has %zu cases", n);
    for (size_t i = 0; i < n; i++) {
        const json_t *tpl = json_object_get(lines[i], "template");
        json_t *vars = json_deep_copy(json_object_get(lines[i], "vars"));
        if (!vars)
            vars = json_object();
        check_case(json_string_value(json_object_get(lines[i], "name")), json_string_value(tpl),
                   json_string_length(tpl), vars, lines[i]);
        json_decref(vars);
    }
    test_free_jsonl(lines, n);
}

static void test_real_templates(void)
{
    size_t n, len;
    json_t **lines = test_read_jsonl("chat/expected.jsonl", 0, &n);
    const char *path = test_fixture("chat/conversations.json");
    json_t *convs = path ? json_load_file(path, 0, NULL) : NULL;
    if (!lines || !convs) {
        test_free_jsonl(lines, lines ? n : 0);
        json_decref(convs);
        SKIP("tests/fixtures/chat/expected.jsonl or conversations.json is missing");
    }
    CHECK(n >= 400, "expected.jsonl has %zu cases", n);
    for (size_t i = 0; i < n; i++) {
        const json_t *c = lines[i];
        const char *tname = json_string_value(json_object_get(c, "template"));
        const char *cname = json_string_value(json_object_get(c, "conversation"));
        char rel[256], what[300];
        snprintf(rel, sizeof rel, "chat/templates/%s.jinja", tname);
        snprintf(what, sizeof what, "%s / %s / %s", tname, cname,
                 json_is_true(json_object_get(c, "add_generation_prompt")) ? "generation prompt" : "none");
        const json_t *messages = NULL, *conv;
        size_t k;
        json_array_foreach(convs, k, conv) if (!strcmp(json_string_value(json_object_get(conv, "name")), cname))
            messages = json_object_get(conv, "messages");
        const char *tpath = test_fixture(rel);
        char *text = tpath ? test_read_file(tpath, &len) : NULL;
        CHECK(text && messages, "%s: template or conversation missing", what);
        if (!text || !messages) {
            free(text);
            continue;
        }
        json_t *vars = json_deep_copy(json_object_get(c, "vars"));
        if (!vars)
            vars = json_object();
        json_object_set(vars, "messages", (json_t *)messages);
        json_object_set(vars, "add_generation_prompt", json_object_get(c, "add_generation_prompt"));
        if (json_is_string(json_object_get(c, "bos_token"))) /* null: the model has none, left undefined */
            json_object_set(vars, "bos_token", json_object_get(c, "bos_token"));
        if (json_is_string(json_object_get(c, "eos_token")))
            json_object_set(vars, "eos_token", json_object_get(c, "eos_token"));
        check_case(what, text, len, vars, c);
        json_decref(vars);
        free(text);
    }
    json_decref(convs);
    test_free_jsonl(lines, n);
}

/* The variables of this file's cases. */
static const char *const own_vars =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"  Be nice.  \"}, {\"role\": \"user\", \"co"
    "ntent\": \"Hi\\nthere \\u00e9 \\u00df\"}, {\"role\": \"assistant\", \"content\": \"Yo\", \"tool_"
    "calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [1.5, null, true]}}}"
    "]}], \"x\": {\"y\": null, \"n\": 3, \"f\": 2.5, \"s\": \"abc\", \"l\": [3, 1, 2], \"d\": {\"b\":"
    " 2, \"a\": 1}}, \"u\": \"\\u00c4\\u00d6\\u00fc \\u01c5x\"}";

static const struct {
    const char *name, *text, *want;
} own_cases[] = {
    {"numbers",
     "{{ 0b101 }}|{{ 0o17 }}|{{ 0x1F }}|{{ 1_000 }}|{{ 1_0.5 }}|{{ 3e2 }}|{{ 00 }}|{{ 1e-5 }}|{{ 0.000"
     "1 }}|{{ 1.5e300*1e10 }}|{{ 2**0.5 }}",
     "5|15|31|1000|10.5|300.0|0|1e-05|0.0001|inf|1.4142135623730951"},
    {"escapes",
     "{{ \"\\u00e9\\x41\\101\" }}|{{ \"\\z\" }}|{{ 'it\\'s' }}",
     "\303\251AA|\\z|it's"},
    {"repr_strings",
     "{{ [\"it's\", 'say \"x\"', 'both \\' \"', \"\\n\\t\\x01\\x7f\", \"\\u00e9\\u200b\\u00a0\"] }}",
     "[\"it's\", 'say \"x\"', 'both \\' \"', '\\n\\t\\x01\\x7f', '\303\251\\u200b\\xa0']"},
    {"repr_vars",
     "{{ x }}|{{ messages[0] }}",
     "{'y': None, 'n': 3, 'f': 2.5, 's': 'abc', 'l': [3, 1, 2], 'd': {'b': 2, 'a': 1}}|{'role': 'syste"
     "m', 'content': '  Be nice.  '}"},
    {"items_and_indices",
     "{{ x.l[-1] }}|{{ x.l[5] }}|{{ x.l.0 }}|{{ x.s[-1] }}|{{ u[1] }}|{{ u[-2] }}|{{ x.zz }}|{{ none.a"
     " }}",
     "2||3|c|\303\226|\307\205||"},
    {"slices",
     "{{ x.l[::-1] }}|{{ x.l[::2] }}|{{ u[1:4] }}|{{ u[::-1] }}|{{ x.l[-10:2] }}|{{ u[::2] }}|{{ x.s[5"
     ":] }}",
     "[2, 1, 3]|[3, 2]|\303\226\303\274 |x\307\205 \303\274\303\226\303\204|[3, 1]|\303\204\303\274"
     "\307\205|"},
    {"arith",
     "{{ -7 // 2 }}|{{ 7 % -3 }}|{{ -7.5 // 2 }}|{{ 7.5 % 2 }}|{{ 2 ** -2 }}|{{ 10 / 5 }}|{{ true + tr"
     "ue }}|{{ [0] * 3 }}|{{ 2 * 'yz' }}|{{ 'x' * -1 }}|{{ (1,) + (2,) }}",
     "-4|-2|-4.0|1.5|0.25|2.0|2|[0, 0, 0]|yzyz||(1, 2)"},
    {"compare",
     "{{ [1, 2] < [1, 3] }}|{{ 3 > 2 > 2 }}|{{ 1 == 1.0 }}|{{ (1, 2) == [1, 2] }}|{{ foo == none }}|{{"
     " 'a' in {'a': 1} }}",
     "True|False|True|False|False|True"},
    {"unary",
     "{{ -x.n }}|{{ +x.f }}|{{ - - 3 }}|{{ -x.n|abs }}|{{ not x.n is none }}",
     "-3|2.5|3|3|True"},
    {"lstrip_unicode_space",
     "\343\200\200{% if 1 %}x{% endif %}\n\t {% if 1 %}y{% endif %}",
     "xy"},
    {"plus_signs",
     "a\n  {%+ if true %}b{% endif +%}\nc",
     "a\n  b\nc"},
    {"comments_ws",
     "{# c #}\n  {# d #}\nx  {#- e -#}  y {#+ f +#}\nz",
     "xy \nz"},
    {"raw_ws",
     "{% raw -%}  \n{{ y }}  {%- endraw %}\nz|  {% raw %}\n  a\n  {% endraw %}\n  b",
     "{{ y }}z|  \n  a\n  b"},
    {"trailing_newline",
     "{{- 'a' -}}\n\n  {{ 'b' }}\n",
     "ab"},
    {"loop_attrs",
     "{% for m in messages %}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.depth }}{{ loop.depth0 }},"
     "{% endfor %}",
     "3210,2110,1010,"},
    {"loop_string",
     "{% for c in 'h\303\251' %}{{ c }}.{% endfor %}",
     "h.\303\251."},
    {"loop_else_after_break",
     "{% for x in [1,2] %}{% if x == 1 %}{% break %}{% endif %}{{x}}{% else %}E{% endfor %}",
     "E"},
    {"loop_else_after_continue",
     "{% for x in [1,2] %}{{x}}{% continue %}{% else %}E{% endfor %}",
     "12E"},
    {"loop_filter_index",
     "{% for i in range(5) if i is odd %}{{ i }}{{ loop.index }}{{ loop.length }}{% endfor %}",
     "112322"},
    {"loop_set_fresh",
     "{% set t = 1 %}{% for i in range(2) %}[{{ t }}]{% set t = t + 10 %}{{ t }}{% endfor %}{{ t }}",
     "[1]11[1]111"},
    {"loop_object",
     "{% for x in [1,2] %}{{ loop }}{% endfor %}",
     "<LoopContext 1/2><LoopContext 2/2>"},
    {"set_tuple",
     "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, %}{{ c }}{% for k, v in x.d.items() %}{{ k }}{{"
     " v }}{% endfor %}",
     "12(1,)b2a1"},
    {"macro_closure",
     "{% set z = 1 %}{% macro f() %}{{ z }}{% endmacro %}{% set z = 5 %}{{ f() }}",
     "5"},
    {"macro_in_loop",
     "{% for i in range(2) %}{% set z = i %}{% macro f() %}{{ z }}{% endmacro %}{{ f() }}{% endfor %}",
     "01"},
    {"macro_recursion",
     "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}",
     "54321"},
    {"macro_default_from_param",
     "{% macro f(a, b=a) %}{{ a }}{{ b }}{% endmacro %}{{ f(1) }}{{ f(1, b=2) }}",
     "1112"},
    {"macro_repr",
     "{% macro f() %}x{% endmacro %}{{ f }}",
     "<Macro 'f'>"},
    {"call_with_args",
     "{% macro l(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(v) l([1, 2]) "
     "%}[{{ v }}]{% endcall %}",
     "[1][2]"},
    {"print_and_generation",
     "{% print 1, 'a' %}|{% generation %}gen {{ 1 }}{% endgeneration %}",
     "1a|gen 1"},
    {"filter_with_if",
     "{% if 0 %}{{ x|nofilter }}{% endif %}ok{{ 1 if 1 else x|nofilter }}",
     "ok1"},
    {"filters_text",
     "{{ 'xxhixx'|trim('x') }}|{{ u|upper }}|{{ u|lower }}|{{ '\307\206a'|capitalize }}|{{ 'abc'|cente"
     "r(8) }}|{{ 'a\nb'|indent('> ') }}|{{ '<&>'|e }}",
     "hi|\303\204\303\226\303\234 \307\204X|\303\244\303\266\303\274 \307\206x|\307\205a|  abc   |a\n>"
     " b|&lt;&amp;&gt;"},
    {"filters_unicode_case",
     "{{ '\307\205 \303\237 \305\211 \357\254\201 \304\260 \316\243\316\221\316\243'|upper }}|{{ '\316"
     "\243\316\221\316\243 \316\243\316\221\316\243. \316\243'|lower }}|{{ '\303\237'.capitalize() }}|"
     "{{ '\304\260stanbul'|lower }}",
     "\307\204 SS \312\274N FI \304\260 \316\243\316\221\316\243|\317\203\316\261\317\202 \317\203\316"
     "\261\317\202. \317\203|Ss|i\314\207stanbul"},
    {"filters_seq",
     "{{ ['b', 'A', 'c']|sort(case_sensitive=true) }}|{{ x.d|dictsort(by='value', reverse=true) }}|{{ "
     "['a', 'A']|unique(case_sensitive=true)|list }}|{{ x.l|sort(attribute='zz') }}|{{ ['b', 'A']|max "
     "}}",
     "['A', 'b', 'c']|[('b', 2), ('a', 1)]|['a', 'A']|[3, 1, 2]|b"},
    {"filters_numbers",
     "{{ '0x10'|int(base=16) }}|{{ '0x10'|int(base=0) }}|{{ ' 1_000 '|int }}|{{ '3.9'|int }}|{{ 'a'|fl"
     "oat }}|{{ 2.675|round(2) }}|{{ 2.1|round(0, 'ceil') }}|{{ 1234.5|round(-2) }}|{{ 7|round }}",
     "16|16|1000|3|0.0|2.67|3.0|1200.0|7"},
    {"filters_map_select",
     "{{ messages|map(attribute='nope', default='D')|list }}|{{ ['a,b']|map('replace', ',', ';')|list "
     "}}|{{ [1, 2, 3]|select('in', [2, 3])|list }}|{{ [0, 1, '', 'a']|select|list }}|{{ messages|selec"
     "tattr('tool_calls')|list|length }}",
     "['D', 'D', 'D']|['a;b']|[2, 3]|[1, 'a']|1"},
    {"tojson_options",
     "{{ x.d|tojson(sort_keys=true) }}|{{ x.d|tojson(separators=(',', ':')) }}|{{ '\303\251\360\237"
     "\230\200'|tojson(ensure_ascii=true) }}|{{ {'a': []}|tojson(indent=1) }}|{{ [1.0, 1e20, none]|toj"
     "son }}|{{ {1: 2, none: 3}|tojson }}",
     "{\"a\": 1, \"b\": 2}|{\"b\":2,\"a\":1}|\"\\u00e9\\ud83d\\ude00\"|{\n \"a\": []\n}|[1.0, 1e+20, n"
     "ull]|{\"1\": 2, \"null\": 3}"},
    {"tests",
     "{{ 9 is divisibleby 3 }}{{ 'a' is in 'abc' }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 1 is true "
     "}}{{ range is callable }}{{ x.n is iterable }}{{ x.s is sequence }}{{ 1 is sameas 1 }}{{ 'upper'"
     " is filter }}",
     "TrueTrueTrueTrueFalseTrueFalseTrueTrueTrue"},
    {"str_methods",
     "{{ 'a b c'.rsplit(' ', 1) }}|{{ ' a  b c '.split(none, 1) }}|{{ 'abc'.startswith(('x', 'ab')) }}"
     "|{{ \"they're bill's\".title() }}|{{ 'ab'.replace('', '.') }}|{{ 'h\303\251llo'.find('l') }}|{{ "
     "'hello'.rfind('l') }}",
     "['a b', 'c']|['a', 'b c ']|True|They'Re Bill'S|.a.b.|2|3"},
    {"str_predicates",
     "{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ 'a1'.isalnum() }}{{ ''.isspace() }}|{{ 'a\nb\015\nc'."
     "splitlines() }}|{{ 'a\nb'.splitlines(true) }}",
     "TrueTrueTrueFalse|['a', 'b', 'c']|['a\\n', 'b']"},
    {"dict_methods",
     "{{ x.d.get('z', 5) }}|{{ x.d.items() }}|{{ x.d.keys() }}|{{ x['d']['items'] is defined }}|{{ ran"
     "ge(1, 10, 3) }}|{{ dict([('a', 1)]) }}|{{ namespace({'q': 1}).q }}",
     "5|dict_items([('b', 2), ('a', 1)])|dict_keys(['b', 'a'])|True|range(1, 10, 3)|{'a': 1}|1"},
    {"str_format",
     "{{ '{:>8}|{:*^9}|{:08.3f}|{:,}|{:#b}|{:.2%}|{!r}|{:.3}|{:=+8}'.format('ab', 'ab', 3.14159, 12345"
     "67, 5, 0.256, 'x', 2.0, -3) }}|{{ '{0[a]} {0.b} {1[1]} {{}}'.format({'a': 1, 'b': 2}, [5, 6]) }}",
     "      ab|***ab****|0003.142|1,234,567|0b101|25.60%|'x'|2.0|-      3|1 2 6 {}"},
    {"percent_format",
     "{{ '%5.1f|%-5d|%05d|%+d|%#x|%e|%g|%c|%r|%.2s'|format(3.14159, 42, 42, 42, 255, 12345.678, 0.0000"
     "1234, 65, 'a', 'abc') }}|{{ '%(a)s=%(b)05.1f'|format(a='x', b=2.25) }}",
     "  3.1|42   |00042|+42|0xff|1.234568e+04|1.234e-05|A|'a'|ab|x=002.2"},
    {"undefined_uses",
     "{{ foo|length }}|{% for a in foo %}x{% endfor %}|{{ foo ~ 'a' }}|{{ [foo] }}|{{ x.s.zz }}|{{ 1 i"
     "n foo }}",
     "0||a|[Undefined]||False"},
    {"strftime",
     "{{ strftime_now('%Y-%m-%d %H:%M %A') }}",
     "2024-07-26 00:00 Friday"},
    {"str_percent",
     "{{ '%s-%s' % (1, 2) }}|{{ '%(a)s' % {'a': 3} }}|{{ '%s' % [1, 2] }}|{{ 'x' % foo }}|{{ '%d' % 2."
     "7 }}|{{ 'x' % [1] }}",
     "1-2|3|[1, 2]|x|2|x"},
    {"range_views",
     "{{ range(3)[::-1] }}|{{ range(10)[2:8:2] }}|{{ range(5, 0, -2)[1:] }}|{{ range(3)[1] }}|{{ {1: 2"
     "}.items()[0] }}|{{ range(3) is sequence }}",
     "range(2, -1, -1)|range(2, 8, 2)|range(3, -1, -2)|1||True"},
    {"select_falsy",
     "{{ 0|selectattr('role', 'eq', 'user')|list }}|{{ none|map('upper')|list }}|{{ ''|select|list }}",
     "[]|[]|[]"},
    {"list_methods",
     "{{ x.l.index(2) }}|{{ x.l.count(3) }}|{{ (1, 2, 1).count(1) }}",
     "2|1|2"},
    {"folded_slices",
     "{{ (1)[1:] }}|{{ (none)[1:] is defined }}|{% set q = (1e3)[:2] is defined %}{{ q }}|{% if (true)"
     "[::-1] is upper %}U{% endif %}|{{ ([1, 2]|first)[1:]|length }}",
     "|False|False||0"},
    {"break_in_set_block",
     "{% for i in [1, 2] %}{% set x %}a{% break %}{% endset %}[{{ x }}]{% endfor %}end",
     "end"},
    {"trim_blocks_plus",
     "{% for i in [1, 2] +%}\n{{ i }}{% endfor %}|{% if true -%}\n  a\n{%- endif %}",
     "\n1\n2|a"},
};

static void test_own_cases(void)
{
    for (size_t i = 0; i < sizeof own_cases / sizeof *own_cases; i++) {
        char *out;
        size_t n;
        int rc = render_str(own_cases[i].text, own_vars, &out, &n);
        CHECK(rc == 0 && n == strlen(own_cases[i].want) && !memcmp(out, own_cases[i].want, n),
              "%s: rc %d (%s)\n  got  %.*s\n  want %s", own_cases[i].name, rc, rc ? iflow_errmsg() : "", (int)n,
              out ? out : "", own_cases[i].want);
        free(out);
    }
}

/* Templates jinja2 refuses to compile (syntax) or fails to render. */
static const struct {
    const char *name, *text;
    int syntax;
} own_errors[] = {
    {"err_undefined_attr", "{{ foo.bar }}", 0},
    {"err_call_undefined", "{{ foo() }}", 0},
    {"err_not_callable", "{{ x.s() }}", 0},
    {"err_compare_types", "{{ 'a' < 1 }}", 0},
    {"err_div_zero", "{{ 1 // 0 }}", 0},
    {"err_none_plus", "{{ none + 1 }}", 0},
    {"err_unpack", "{% set a, b = [1] %}", 0},
    {"err_ns_assign", "{% set x.a = 1 %}", 0},
    {"err_range_big", "{{ range(200000)|length }}", 0},
    {"err_tojson_undefined", "{{ foo|tojson }}", 0},
    {"err_unhashable", "{{ {[1]: 2} }}", 0},
    {"err_slice_step", "{{ x.l[::0] }}", 0},
    {"err_slice_dict", "{{ x.d[1:2] }}", 0},
    {"err_join_types", "{{ '-'.join([1, 2]) }}", 0},
    {"err_in_int", "{{ 1 in 5 }}", 0},
    {"err_macro_args", "{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", 0},
    {"err_append", "{{ messages.append(1) }}", 0},
    {"err_format_args", "{{ 'x'|format(1) }}", 0},
    {"err_unknown_filter_in_if", "{% if x %}{{ x|nofilter }}{% endif %}", 0},
    {"syn_unknown_filter", "{{ x|nofilter }}", 1},
    {"syn_unknown_test", "{{ x is notest }}", 1},
    {"syn_break", "{% break %}", 1},
    {"syn_continue_in_macro", "{% for i in x.l %}{% macro f() %}{% continue %}{% endmacro %}{% endfor %}", 1},
    {"syn_default_order", "{% macro f(a=1, b) %}{% endmacro %}", 1},
    {"syn_dup_param", "{% macro f(a, a) %}{% endmacro %}", 1},
    {"syn_kw_then_pos", "{{ f(a=1, 2) }}", 1},
    {"syn_bad_bracket", "{{ (1 }}", 1},
    {"syn_chain_is", "{{ x is defined is defined }}", 1},
    {"syn_bad_escape", "{{ '\\x4' }}", 1},
    {"syn_wrong_end", "{% for x in y %}{% endif %}", 1},
    {"syn_assign_const", "{% set 1 = 2 %}", 1},
    {"err_int_undefined", "{{ foo|int }}", 0},
    {"err_indent_list", "{{ x.l|indent }}", 0},
    {"err_slice_var", "{% set a = 1 %}{{ a[1:] }}", 0},
    {"err_set_folded_slice", "{% set q = (1)[1:] %}", 0},
    {"err_range_add", "{{ range(3) + [1] }}", 0},
    {"err_percent_args", "{{ '%s %s' % [1, 2] }}", 0},
    {"err_list_index", "{{ x.l.index(9) }}", 0},
    {"syn_unclosed_comment", "{# a", 1},
    {"syn_unclosed_raw", "{% raw %}x", 1},
    {"syn_endset", "{% set x = 1 %}{% endset %}", 1},
};

static void test_own_errors(void)
{
    json_t *vars = json_loads(own_vars, 0, NULL);
    for (size_t i = 0; i < sizeof own_errors / sizeof *own_errors; i++) {
        char *out;
        size_t n;
        int syntax, rc = render(own_errors[i].text, strlen(own_errors[i].text), vars, &out, &n, &syntax);
        CHECK(rc < 0 && syntax == own_errors[i].syntax && (!syntax || rc == IFLOW_EFORMAT),
              "%s: rc %d, syntax error %d (want %d): %s", own_errors[i].name, rc, syntax, own_errors[i].syntax,
              rc < 0 ? iflow_errmsg() : out);
        CHECK(rc == 0 || (!strncmp(iflow_errmsg(), "T line ", 7) && !strchr(iflow_errmsg(), '\n')),
              "%s: the message names no line: %s", own_errors[i].name, iflow_errmsg());
        free(out);
    }
    json_decref(vars);
}

static void expect_error(const char *text, int code, const char *where, const char *what)
{
    char *out;
    size_t n;
    int rc = render_str(text, NULL, &out, &n);
    CHECK_ERR(rc, code, where, what);
    CHECK(!out && !n, "a failed render returns no text");
    free(out);
}

static void test_messages(void)
{
    expect_error("{% if x %}\n  {{ 1 + }}\n{% endif %}", IFLOW_EFORMAT, "T line 2, column 10:",
                 "end of print statement");
    expect_error("{% for m in messages %}\n{% endif %}", IFLOW_EFORMAT, "T line 2, column 4:", "expected 'endfor'");
    expect_error("{% for i in [1] %}\n{{ i|frob }}{% endfor %}", IFLOW_EFORMAT, "T line 2, column 6:", "'frob'");
    expect_error("{% if x %}", IFLOW_EFORMAT, "T line 1, column 11:", "unexpected end of template");
    expect_error("{{ 'abc }}", IFLOW_EFORMAT, "T line 1, column 4:", "unterminated string");
    expect_error("a\r\nb\r\n  {{ foo.bar }}", IFLOW_EINVAL, "T line 3, column 9:", "'foo' is undefined");
    expect_error("\n\n{{ nothing() }}", IFLOW_EINVAL, "T line 3,", "'nothing' is undefined");
    expect_error("{% if 1 %}{{ 1 < 'a' }}{% endif %}", IFLOW_EINVAL, "T line 1, column 16:", "'<' not supported");
    expect_error("{{ [1]|batch(2) }}", IFLOW_EUNSUPPORTED, "T line 1, column 8:", "'batch' is not supported");
    /* raise_exception: "NAME: message" and nothing else, the message's case kept */
    char *out;
    size_t n;
    int rc = render_str("{{ raise_exception('Roles must ALTERNATE: ' ~ 3) }}", NULL, &out, &n);
    CHECK(rc == IFLOW_EINVAL && !strcmp(iflow_errmsg(), "T: Roles must ALTERNATE: 3"), "rc %d: %s", rc,
          iflow_errmsg());
    /* the variables must be an object */
    iflow_template *t;
    json_t *arr = json_array();
    CHECK(iflow_template_open(&t, "x", 1, "T") == 0, "open");
    CHECK_ERR(iflow_template_render(t, arr, &out, &n), IFLOW_EINVAL, "T:", "must be a JSON object");
    iflow_template_close(t);
    json_decref(arr);
}

/* Each limit fails cleanly, with the code of a limit. */
static void test_limits(void)
{
    char *big = malloc(4096);
    strcpy(big, "{{ ");
    for (int i = 0; i < 300; i++)
        strcat(big, "(");
    strcat(big, "1");
    for (int i = 0; i < 300; i++)
        strcat(big, ")");
    strcat(big, " }}");
    expect_error(big, IFLOW_EFORMAT, "T line 1,", "nests more than 256 deep");
    big[0] = 0;
    for (int i = 0; i < 300; i++)
        strcat(big, "{% if 1 %}");
    expect_error(big, IFLOW_EFORMAT, "T line 1,", "nests more than 256 deep");
    strcpy(big, "{{ 1");
    for (int i = 0; i < 300; i++)
        strcat(big, " + 1");
    strcat(big, " }}");
    expect_error(big, IFLOW_EFORMAT, "T line 1,", "nests more than 256 deep");
    free(big);
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", IFLOW_ERANGE,
                 "T line 1,", "more than 10000000 steps");
    expect_error("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", IFLOW_ERANGE, "T line 1,",
                 "the output would be longer than 64 MiB");
    expect_error("{{ 'ab' * 40000000 }}", IFLOW_ERANGE, "T line 1,", "longer than 64 MiB");
    expect_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", IFLOW_ERANGE, "T line 1,",
                 "nests more than 512 deep");
    expect_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", IFLOW_ERANGE, "T line 1,",
                 "nested more than 512 deep");
    expect_error("{% set ns = namespace(l=[]) %}{% for i in range(2000) %}{% set ns.l = [ns.l] %}{% endfor %}"
                 "{{ ns.l|tojson }}", IFLOW_ERANGE, "T line 1,", "nested more than 512 deep");
    expect_error("{{ range(1000000) }}", IFLOW_ERANGE, "T line 1,", "range too big");
    expect_error("{% set s = 'x' * 60000000 %}{% set ns = namespace(l=[]) %}{% for i in range(10) %}"
                 "{% set ns.l = ns.l + [s ~ i] %}{% endfor %}", IFLOW_ERANGE, "T line 1,", "MiB of memory");
    if (!SANITIZED) /* quadratic: a list rebuilt 20000 times */
        expect_error("{% set ns = namespace(l=[]) %}{% for i in range(20000) %}{% set ns.l = ns.l + [i] %}"
                     "{% endfor %}", IFLOW_ERANGE, "T line 1,", "steps");
}

/* Bytes jinja2 would never see (NULs, invalid UTF-8) pass through; nothing is read past the end. */
static void test_odd_bytes(void)
{
    const char text[] = "a\0b{{ '\377' ~ 'c'[0] }}\376{{ 'caf\303\251'[3] }}{{ '\377x'|upper }}{# no end";
    char *out;
    size_t n;
    json_t *vars = json_object();
    int syntax, rc = render(text, sizeof text - 10, vars, &out, &n, &syntax); /* cut before the comment */
    CHECK(rc == 0 && n == 10 && !memcmp(out, "a\0b\377c\376\303\251\377X", 10) && out[n] == 0,
          "rc %d (%s), %zu bytes", rc, rc ? iflow_errmsg() : "", n);
    free(out);
    rc = render(text, sizeof text - 1, vars, &out, &n, &syntax);
    CHECK(rc == IFLOW_EFORMAT && syntax, "the comment without an end: rc %d", rc);
    rc = render("", 0, vars, &out, &n, &syntax);
    CHECK(rc == 0 && n == 0 && out && out[0] == 0, "an empty template gives an empty text: rc %d", rc);
    free(out);
    json_decref(vars);
}

typedef struct {
    const iflow_template *t;
    const json_t *vars;
    const char *want;
    int failures;
} renderer;

static void *render_many(void *arg)
{
    renderer *w = arg;
    for (int i = 0; i < 40; i++) {
        char *out;
        size_t n;
        if (iflow_template_render(w->t, w->vars, &out, &n) != 0 || strcmp(out, w->want) != 0)
            w->failures++;
        free(out);
    }
    return NULL;
}

/* One template rendered by four threads at once gives the same text everywhere. */
static void test_threads(void)
{
    const char *text = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                       "{{ m.role|upper }}:{{ m.content|trim }}|{{ '{:03d}'.format(ns.n) }}\n{% endfor %}"
                       "{{ messages|map(attribute='role')|unique|list|tojson }}";
    iflow_template *t;
    json_t *vars = json_loads(own_vars, 0, NULL);
    char *want;
    size_t n;
    CHECK(iflow_template_open(&t, text, strlen(text), "T") == 0, "open: %s", iflow_errmsg());
    CHECK(iflow_template_render(t, vars, &want, &n) == 0, "render: %s", iflow_errmsg());
    renderer w[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (renderer){t, vars, want, 0};
        pthread_create(&th[i], NULL, render_many, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(w[i].failures == 0, "thread %d: %d renders differ", i, w[i].failures);
    }
    free(want);
    iflow_template_close(t);
    json_decref(vars);
}

int main(void)
{
    setenv("TZ", "UTC", 1); /* strftime_now's local time is the fixtures' */
    RUN(test_features);
    RUN(test_real_templates);
    RUN(test_own_cases);
    RUN(test_own_errors);
    RUN(test_messages);
    RUN(test_limits);
    RUN(test_odd_bytes);
    RUN(test_threads);
    return check_summary("test_template");
}
