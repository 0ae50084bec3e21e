/*
 * chat.h -- a conversation made into a prompt by the model's chat template.
 *
 * Contract
 *   iflow_chat_open() takes the chat template of model m: the shard's "chat_template" record
 *   (shard.h; iflow-convert copies it from the checkpoint: a GGUF's tokenizer.chat_template, a
 *   Hugging Face directory's chat_template.jinja, else its tokenizer_config.json's
 *   "chat_template"), else, for a shard written before templates were stored, the
 *   tokenizer.chat_template key of its GGUF vocabulary record. With template_path non-NULL that
 *   file (a Jinja text, at most 1 MiB) is taken instead. A model without one is IFLOW_ENOTFOUND
 *   ("model 'x' has no chat template: give one with --chat-template"); a template that does not
 *   parse is template.h's error, naming where the template came from.
 *   iflow_chat_render() renders a conversation as transformers' apply_chat_template does (the
 *   environment and the subset of Jinja are template.h's): the variables are messages (a JSON
 *   array of objects, each at least {"role": string, "content": string}), add_generation_prompt,
 *   bos_token and eos_token (the texts of the tokenizer's BOS and EOS; undefined when it has none,
 *   as transformers leaves them), and
 *   every member of `extra` (a JSON object, or NULL: "tools", "documents", a template's own
 *   switches such as "enable_thinking"; a member named like one of the four is refused).
 *   An assistant's tool call whose function "arguments" is JSON text of an object (as OpenAI's
 *   API returns it) reaches the template as that object (templates write it with tojson; vLLM
 *   does the same). A "content" given as a list of parts (OpenAI's [{"type": "text", "text":
 *   ...}]) reaches it as the parts' texts joined by newlines, as vLLM gives it to templates that
 *   read strings (those that read parts take a string too); a part of another type (an image) is
 *   refused, naming the message and the part.
 *   The messages are checked first: an error names the message (its index) and what is wrong.
 *   iflow_chat_encode() tokenizes a rendered conversation as apply_chat_template(tokenize=True)
 *   does: special-token text read as the special token, and nothing added around it (the
 *   template writes the BOS where the model wants one).
 *   Renders of one iflow_chat may run on several threads at once.
 */
#ifndef IFLOW_CHAT_H
#define IFLOW_CHAT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "include/iflow.h"
#include "libcore/engine/model.h"

int  iflow_chat_open(iflow_chat **out, const iflow_model *m, const char *template_path);
/* The same, the model called model_name in messages instead of by its shard's path (a source
 * converted on the fly lives in a temporary file). */
int  iflow_chat_open_as(iflow_chat **out, const iflow_model *m, const char *template_path, const char *model_name);
void iflow_chat_close(iflow_chat *c);
/* Where the template came from, for -v ("the chat template of 'model.ifs'", or the file). */
const char *iflow_chat_source(const iflow_chat *c);
/* The format the template asks tool calls in (toolcall.h's IFLOW_TOOLS_*; NONE: it names none). */
int iflow_chat_tool_format(const iflow_chat *c);
/* 1 when the template names <think>: its model's replies may open with reasoning (reasoning.h). */
int iflow_chat_reasoning(const iflow_chat *c);

/* *text is malloc'd and NUL-terminated; *len excludes the NUL. */
int iflow_chat_render(const iflow_chat *c, const json_t *messages, const json_t *extra, int add_generation_prompt,
                      char **text, size_t *len);
/* *ids is malloc'd (NULL when *n_ids is 0). */
int iflow_chat_encode(const iflow_chat *c, const char *text, size_t len, int32_t **ids, size_t *n_ids);
/* The public header's: render (messages from their JSON text), then encode. */
int iflow_chat_tokens(const iflow_chat *c, const char *messages_json, size_t len, int add_generation_prompt,
                      int32_t **ids, size_t *n_ids);

#endif
