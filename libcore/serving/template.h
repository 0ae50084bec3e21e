/*
 * template.h -- chat templates: the Jinja2 templates Hugging Face models carry (`chat_template`
 * in tokenizer_config.json, GGUF's `tokenizer.chat_template`), rendered as transformers'
 * apply_chat_template renders them (untrusted input: tests/fuzz/fuzz_template.c).
 *
 * Contract
 *   iflow_template_open() parses a template into a tree; iflow_template_render() runs it over a
 *   JSON object of variables and returns the text, malloc'd (the caller frees it);
 *   iflow_template_close() frees the template. A template is read-only once open: any number of
 *   threads may render one at the same time.
 *
 *   The environment is transformers': Python jinja2 3.x's ImmutableSandboxedEnvironment with
 *   trim_blocks and lstrip_blocks on, autoescape off, the loopcontrols extension, a `tojson`
 *   filter that is json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=) and the
 *   globals raise_exception(msg) and strftime_now(fmt). The output is meant to be that of
 *   jinja2 byte for byte. As in jinja2, the source's newlines (\r\n, \r, \n) become \n and one
 *   trailing newline is dropped.
 *
 *   Supported
 *     text, {{ expr }}, {% stmt %}, {# comment #}, `-` and `+` whitespace control, {% raw %}.
 *     Statements: if/elif/else, for/else (`loop`: index, index0, revindex, revindex0, first,
 *     last, length, depth, depth0, previtem, nextitem, cycle(...); tuple targets; the
 *     `for x in xs if cond` filter; dicts give their keys, strings their characters), break,
 *     continue, set (names, tuples, `ns.attr`, and the block form with optional filters), macro
 *     (defaults; positional and keyword arguments), call blocks (`caller`, with arguments), with,
 *     filter blocks, print, and transformers' generation/endgeneration (its body is rendered).
 *     Scoping is jinja2's: every loop turn, macro call, with and set block has its own scope; `if`
 *     has none; macros see the scope they were defined in; namespace() carries state out of loops.
 *     Expressions: literals (strings with Python's escapes, 64-bit integers in any base,
 *     floats, true/false/none in either case, lists, tuples, dicts), variables, .attr and
 *     [key] (a dict's methods come first for .attr, its keys first for [key]), slices with
 *     steps, calls with positional and keyword arguments, filters, tests, + - * / // % ** ~,
 *     str % args, chained comparisons, in, not in, and, or, not (Python's truthiness; `or`
 *     returns a value), `a if c else b` (without else: undefined), unary - and +.
 *     Globals: range (at most 100000 items, as jinja2's sandbox), namespace, dict,
 *     raise_exception, strftime_now. Methods: str's capitalize count endswith find format isalnum
 *     isalpha isdigit islower isspace isupper join lower lstrip replace rfind rsplit rstrip split
 *     splitlines startswith strip title upper; dict's get items keys values; list's count index;
 *     loop.cycle. Lists and dicts cannot be changed (append is undefined), as in the sandbox.
 *     Filters: abs attr capitalize center count d default dictsort e escape first float
 *     forceescape format indent int items join last length list lower map max min reject
 *     rejectattr replace reverse round safe select selectattr sort string sum title tojson trim
 *     unique upper wordcount. Tests: boolean callable defined divisibleby eq equalto escaped
 *     even false filter float ge gt greaterthan in integer iterable le lessthan lower lt mapping
 *     ne none number odd sameas sequence string test true undefined upper == != < <= > >=.
 *     A filter or test that jinja2 lacks is a syntax error where jinja2 reports it at compile
 *     time (outside if statements and conditional expressions), a render error elsewhere; one
 *     that jinja2 has and this file does not (batch, groupby, slice, truncate, ...) is
 *     IFLOW_EUNSUPPORTED when used.
 *   Not supported: template inheritance and inclusion (extends, block, include, import),
 *     macros' varargs/kwargs, `*args`/`**kwargs` in calls, recursive loops, loop.changed,
 *     cycler/joiner/lipsum, integers beyond 64 bits (overflow is a render error), Markup (safe
 *     strings are strings: `escape` gives a plain string, and `+` does not escape). Filters that
 *     jinja2 makes lazily (map, select, reverse ...) give lists at once.
 *
 *   Values. JSON strings, integers, reals, true/false/null, arrays and objects become str,
 *   int, float, bool, None, list and dict; objects keep their insertion order (jansson
 *   iterates an object in insertion order since 2.8). Strings are UTF-8, and length, indexing,
 *   slicing and iteration count code points as Python does; case mapping is Unicode's, with
 *   the mappings to several characters ('ß'.upper() is 'SS') and the final sigma. {{ x }}
 *   prints Python's str(x): None, True, False, ints, floats as repr (1.0, 1e+20, 0.1), lists,
 *   tuples and dicts as Python's repr (['a', 1, None], {'a': 1}), range(0, 3),
 *   dict_items([...]); undefined prints nothing. Comparing values of unrelated
 *   types with <, arithmetic on the wrong types, division by zero, using an undefined value in
 *   arithmetic or an attribute of an undefined value are render errors, as in Python.
 *
 *   strftime_now(fmt) formats the current local time with strftime(3). A "__now__" key in
 *   vars (an integer: seconds since the epoch) replaces the clock, so tests are repeatable.
 *
 *   Errors. A syntax error is IFLOW_EFORMAT: "NAME line L, column C: what was expected" (NAME
 *   is the name given to iflow_template_open, e.g. "the chat template of 'model.ifs'"; the
 *   column counts bytes from 1). raise_exception("msg") fails the render with IFLOW_EINVAL and
 *   "NAME: msg" (control characters in msg become '?'). Other render errors are
 *   "NAME line L, column C: what failed": IFLOW_EINVAL (an undefined function, a type error),
 *   IFLOW_ERANGE (a limit), IFLOW_EUNSUPPORTED (a built-in of jinja2's that this file lacks),
 *   IFLOW_ENOMEM (an allocation failed). Nothing is printed, nothing crashes, whatever the
 *   template.
 *
 *   Limits (untrusted templates). Nesting of expressions and blocks: IFLOW_TEMPLATE_MAX_DEPTH
 *   (a syntax error beyond); nesting while rendering (macros calling macros):
 *   IFLOW_TEMPLATE_MAX_CALL_DEPTH; work per render: IFLOW_TEMPLATE_MAX_STEPS (an expression or
 *   statement evaluated, a loop iteration, an item or 64 bytes copied: one step each); output
 *   and any one string: IFLOW_TEMPLATE_MAX_OUTPUT bytes; memory per render:
 *   IFLOW_TEMPLATE_MAX_MEMORY bytes. At its deepest a parse or a render needs less than 512 KiB
 *   of stack (2 MiB with AddressSanitizer).
 */
#ifndef IFLOW_TEMPLATE_H
#define IFLOW_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>

#define IFLOW_TEMPLATE_MAX_DEPTH      256
#define IFLOW_TEMPLATE_MAX_CALL_DEPTH 512
#define IFLOW_TEMPLATE_MAX_STEPS      10000000L
#define IFLOW_TEMPLATE_MAX_OUTPUT     ((size_t)64 << 20)
#define IFLOW_TEMPLATE_MAX_MEMORY     ((size_t)256 << 20)

typedef struct iflow_template iflow_template;

/* Parse a template (text of len bytes, any bytes; need not be NUL-terminated). name is used in
 * error messages (e.g. "the chat template of 'model.ifs'"). Syntax errors: IFLOW_EFORMAT with
 * "NAME line L, column C: what was expected". */
int iflow_template_open(iflow_template **t, const char *text, size_t len, const char *name);

/* Render with the variables of `vars` (a JSON object: strings, numbers, true/false/null, arrays,
 * objects; e.g. {"messages": [...], "add_generation_prompt": true, "bos_token": "<s>", ...}).
 * *out: malloc'd, NUL-terminated, *out_len bytes (the text may hold NULs). On failure *out is
 * NULL. */
int iflow_template_render(const iflow_template *t, const json_t *vars, char **out, size_t *out_len);

void iflow_template_close(iflow_template *t);

#endif
