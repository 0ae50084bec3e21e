/*
 * toolcall.h -- function calling: the tool calls in a chat model's reply, read out of its text
 * (vLLM's tool parsers, llama.cpp's chat formats), and the grammar that makes a reply a tool
 * call (OpenAI's tool_choice "required" or a named function). Untrusted input:
 * tests/fuzz/fuzz_toolcall.c.
 *
 * The formats (each model family writes its calls its own way, as its chat template tells it;
 * the names are vLLM's --tool-call-parser names):
 *   hermes       <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>, one block a call,
 *                after any text (Qwen2.5, Qwen3, Hermes 2 Pro and 3);
 *   llama3_json  {"name": N, "parameters": {...}} as the whole reply, after an optional
 *                <|python_tag|>; calls separated by ';' (Llama 3.1, 3.2, 3.3);
 *   mistral      [TOOL_CALLS] [{"name": N, "arguments": {...}}, ...] after any text (Mistral
 *                7B Instruct v0.3, Mixtral 8x22B Instruct, Mistral Nemo);
 *   granite      <|tool_call|>[{"name": N, "arguments": {...}}, ...] (Granite 3.x);
 *   pythonic     [N(key=value, ...), ...] as the whole reply, Python call syntax with literal
 *                arguments (strings in either quotes, numbers, True, False, None, lists, tuples,
 *                dicts with string keys), between an optional <|python_start|> and
 *                <|python_end|> (Llama 3.2 with vLLM's pythonic template, Llama 4; also read
 *                as llama4_pythonic). Read, never evaluated; nesting deeper than 64 is refused.
 * iflow_tool_format_detect() names the format a chat template writes in its instructions or its
 * history (the first of the markers above it contains), NONE for a template without one.
 *
 * Contract
 *   iflow_tool_text(): a reply's text with the format's markers put back where the model wrote
 *   them as control tokens, which decode to nothing (tokenizer.h): Mistral's [TOOL_CALLS],
 *   Granite's <|tool_call|>, Llama's <|python_tag|>. A marker after the end of the text (a stop
 *   string cut it) is left out.
 *   iflow_tool_parse(): the calls in such a text, as OpenAI's chat API returns them:
 *     {"id": ID, "type": "function", "function": {"name": N, "arguments": A}}
 *   A is the arguments object as compact JSON text (its keys in the model's order); ID is nine
 *   letters and digits (the length Mistral's templates demand), a hash of the seed given and the
 *   call's index: a rerun gives the same ids. "arguments" and "parameters" are read alike in
 *   every format; absent, the arguments are {}. *content is the text outside the calls, its
 *   whitespace at both ends trimmed (hermes: with every block taken out; mistral, granite: what
 *   is before the marker). A text with no call, or one whose calls do not all read (JSON that is
 *   not an object with a string "name" and an object for arguments, text after a call where
 *   none may be), gives 0 calls and *content the whole text: nothing is made up, nothing half
 *   taken. `bare`: the text is the calls without their marker (mistral, granite: what
 *   iflow_tool_grammar() makes them write); in the other formats it changes nothing.
 *   iflow_tools_check(): tools must be OpenAI's list, each {"type": "function", "function":
 *   {"name": a non-empty string, "parameters": a JSON Schema object whose "type", if any,
 *   allows "object"; optional}}; `name`, when given, must be one of them. Errors name the tool
 *   (its index) and the field.
 *   iflow_tool_grammar(): the grammar of one call (parallel 0) or one or more (parallel 1) of
 *   the functions of tools in the format, or of exactly one call of function `name` when given
 *   (whatever parallel says, as OpenAI's and vLLM's forced call): the arguments follow the
 *   function's parameters, "type": "object" put in (grammar_schema.c's subset: an unenforceable
 *   keyword is refused, named with the tool and its place in the parameters); with no
 *   "parameters", any object. Every text the grammar accepts reads back as its calls (parsed
 *   with `bare`), except where a number in it is out of a double's or an int64's range (the
 *   JSON reader refuses those). pythonic has no such grammar yet (IFLOW_EUNSUPPORTED: use
 *   tool_choice auto). mistral and granite calls are written
 *   without their marker (a control token, which a grammar over text cannot name): parse them
 *   with `bare`. Never prints; errors as iflow_seterr() says.
 */
#ifndef IFLOW_TOOLCALL_H
#define IFLOW_TOOLCALL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "libcore/serving/grammar.h"
#include "libcore/tokenizers/tokenizer.h"

enum { IFLOW_TOOLS_NONE = 0, IFLOW_TOOLS_HERMES, IFLOW_TOOLS_LLAMA3_JSON, IFLOW_TOOLS_MISTRAL, IFLOW_TOOLS_GRANITE,
       IFLOW_TOOLS_PYTHONIC, IFLOW_TOOLS_COUNT };

/* "none", "hermes", "llama3_json", "mistral", "granite"; and back (-1 for another name). */
const char *iflow_tool_format_name(int fmt);
int iflow_tool_format_from_name(const char *name);
/* The format a chat template's text [len] writes calls in, or IFLOW_TOOLS_NONE. */
int iflow_tool_format_detect(const char *template_text, size_t len);

/* OpenAI's tool_choice. */
enum { IFLOW_TOOL_CHOICE_AUTO = 0, IFLOW_TOOL_CHOICE_NONE, IFLOW_TOOL_CHOICE_REQUIRED, IFLOW_TOOL_CHOICE_NAMED };

int iflow_tools_check(const json_t *tools, const char *name);

int iflow_tool_grammar(iflow_grammar **out, int fmt, const json_t *tools, const char *name, int parallel);

/* *out (malloc'd, NUL-terminated, *out_len bytes): text [len], the reply to the prompt whose
 * generated tokens are ids [n], with fmt's hidden markers put back. `starts`: the tokens begin
 * the text (the prompt was at most a BOS), as for iflow_tokenizer_continuation(). */
int iflow_tool_text(int fmt, const iflow_tokenizer *tok, const int32_t *ids, int n, int starts, const char *text,
                    size_t len, char **out, size_t *out_len);

/* *calls: a new JSON array (possibly empty); *content malloc'd, NUL-terminated. Returns the
 * number of calls, or < 0 (IFLOW_ENOMEM; nothing allocated then). */
int iflow_tool_parse(int fmt, const char *text, size_t len, int bare, const char *seed, json_t **calls, char **content,
                     size_t *content_len);

#endif
