/*
 * openai.h -- iflow-run --batch's replies to OpenAI batch lines: the output format of OpenAI's
 * Batch API (and of vLLM's run-batch), made from iflow's own result of the line; and
 * iflow-run --embed --batch's replies to embeddings lines.
 *
 * Layout (one JSON object a line):
 *   {"id": "batch_req_<line>", "custom_id": <the line's>, "error": null,
 *    "response": {"status_code": 200, "request_id": "req_<line>", "body": B}}
 *   B for /v1/chat/completions: {"id": "chatcmpl-<line>", "object": "chat.completion",
 *     "created": <unix seconds>, "model": M, "choices": [{"index", "message": {"role":
 *     "assistant", "content" (null for calls alone), and "reasoning_content", "tool_calls" where
 *     the reply has them},
 *     "logprobs": null or {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]},
 *     "finish_reason"}], "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
 *   B for /v1/completions: {"id": "cmpl-<line>", "object": "text_completion", "created", "model",
 *     "choices": [{"index", "text", "logprobs": null or {"tokens", "token_logprobs",
 *     "top_logprobs", "text_offset"}, "finish_reason"}], "usage"}; with "echo" the text begins
 *     with the prompt and the logprobs with the prompt's tokens (iflow's prompt_logprobs: the
 *     first token's logprob null)
 *   A refused line: "status_code": 400 and B {"error": {"message", "type":
 *   "invalid_request_error", "param": null, "code": null}}.
 *   finish_reason: "stop" (an end-of-sequence token, a stop string or token, a complete
 *   constraint), "length" (max_tokens or the context), "tool_calls". M: the body's "model", else
 *   the -m argument. usage.completion_tokens counts every choice.
 */
#ifndef IFLOW_CMD_OPENAI_H
#define IFLOW_CMD_OPENAI_H

#include <jansson.h>

#include "libcore/serving/request.h"

/* The reply to an embeddings line: body {"id": "embd-<line>", "object": "list", "created",
 * "model", "data": [{"object": "embedding", "index", "embedding"}], "usage": {"prompt_tokens",
 * "total_tokens"}} with data (taken over) and prompt_tokens; or, error not NULL, the 400 reply
 * with that message. custom_id: the line's as compact JSON. */
json_t *openai_embedding_line(const char *custom_id, long line, const char *model, json_t *data, long prompt_tokens,
                              const char *error);

/* One embedding v [dim] as an entry of data: {"object": "embedding", "index", "embedding": the
 * floats, or with base64 their little-endian float32 bytes in base64 (OpenAI's
 * encoding_format)}. */
json_t *openai_embedding(const float *v, int dim, int index, int base64);

/* native: the line's iflow result (cmd/batch.c's, docs/JSON.md), taken over (NULL gives NULL);
 * f: the line's fields; line: its number; model: the -m argument. The reply line, or NULL when
 * out of memory. */
json_t *openai_batch_line(json_t *native, const iflow_request_fields *f, long line, const char *model);

#endif
