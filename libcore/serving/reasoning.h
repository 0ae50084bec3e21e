/*
 * reasoning.h -- a reasoning model's reply split into its reasoning and its answer (vLLM's
 * --reasoning-parser deepseek_r1 / qwen3, llama.cpp's --reasoning-format deepseek): the text
 * between <think> and </think> is the reasoning, what follows the answer.
 *
 * Contract
 *   iflow_reasoning_detect(): 1 when a chat template's text names <think> (DeepSeek-R1 and its
 *   distillations, Qwen3, QwQ), else 0.
 *   iflow_reasoning_split(): the reply text [len] to a prompt whose text is prompt [plen]. The
 *   reply starts inside the reasoning when the prompt ends with <think> (whitespace after it
 *   aside: DeepSeek-R1's template opens the block itself), or when the reply starts with
 *   <think> (after whitespace; the tag is not part of the reasoning). Inside, the reasoning runs
 *   to the first </think> and the answer starts after it; without one (the reply was cut short)
 *   it is all reasoning. A reply that does not start inside the reasoning is all answer (a
 *   prompt that closed the block, as Qwen3's does with enable_thinking false, gives that too).
 *   *r_off and *r_len: the reasoning's span, whitespace at both ends left out; *c_off: where the
 *   answer starts, whitespace after </think> left out. Returns 1 when there is a reasoning
 *   block (possibly empty), 0 when not (*r_len 0, *c_off 0). Pure: no allocation, no error.
 *   iflow_reasoning_closed(): whether the prompt closed the block itself (a constraint then holds
 *   from the reply's first token; otherwise a batch waits for </think>: iflow_request's
 *   grammar_after).
 */
#ifndef IFLOW_REASONING_H
#define IFLOW_REASONING_H

#include <stddef.h>

int iflow_reasoning_detect(const char *template_text, size_t len);
/* 1 when prompt [plen] ends with </think> (whitespace after it aside): the reply is all answer. */
int iflow_reasoning_closed(const char *prompt, size_t plen);
int iflow_reasoning_split(const char *prompt, size_t plen, const char *text, size_t len, size_t *r_off, size_t *r_len,
                          size_t *c_off);

#endif
