/*
 * request.h -- one line of a batch's input: a JSON request, parsed and checked (untrusted
 * input: tests/fuzz/fuzz_request.c).
 *
 * Contract
 *   A request is a JSON object on one line. Fields: "prompt" (a string, or a non-empty list of
 *   token ids used as they are, no BOS added: OpenAI's completions take them) or "messages" (a
 *   chat: a non-empty list of objects, each with a string "role"; made into the prompt by the chat
 *   template, chat.h), one of the two required; with "messages": "add_generation_prompt" (true
 *   or false, default true), "tools" (a list, the template's variable tools) and
 *   "chat_template_kwargs" (an object: more template variables, as vLLM's), and with "tools":
 *   "tool_choice" (OpenAI's: "auto", the default: the reply's calls are read out when the
 *   defaults' tool_format is known; "none": never read; "required": the reply is one or more
 *   calls; {"type": "function", "function": {"name": N}}: a call of N; those two constrain
 *   the reply with toolcall.h's grammar and do not go with another constraint or "beams") and
 *   "parallel_tool_calls" (true, the default, or false: one call at most); "id" (any
 *   JSON value, kept as compact JSON text; the line number when absent), "max_tokens" (an
 *   integer >= 1; or "max_completion_tokens", OpenAI's name), "stop" (a string, or an array of
 *   at most IFLOW_MAX_STOP non-empty strings), "context_shift" ("none", "rope" or "recompute":
 *   batch.h), "keep" (an integer >= -1), "beams"
 *   (an integer from 1 to IFLOW_MAX_BEAMS: beam search, beam.h, which honours "stop"; not with a
 *   context shift), "length_penalty" (a number, with "beams"), "n" (an integer from 1 to
 *   IFLOW_MAX_CHOICES: that many completions of the prompt, each with its own sampling stream,
 *   iflow_request_choice_seed(); not with "beams" or "continuation"), "logprobs" and "prompt_logprobs"
 *   (integers from 0 to IFLOW_MAX_TOP_LOGPROBS: the log-probabilities of the generated / the
 *   prompt's tokens with that many most likely alternatives; not with "beams"), "continuation" (a
 *   string scored after the prompt: max_tokens then defaults to 0; not with "beams"), one
 *   constraint on the generated text (grammar.h; not with "beams"): "grammar" (GBNF text),
 *   "json_schema" (a JSON Schema: an object, true, or its JSON text), "regex" (a string),
 *   "choice" (a non-empty list of strings: the text is one of them) or "response_format"
 *   (OpenAI's: {"type": "text"}, {"type": "json_object"} for any JSON object, or
 *   {"type": "json_schema", "json_schema": {"schema": {...}, ...}}) -- or by vLLM's names,
 *   "guided_grammar", "guided_json", "guided_regex", "guided_choice", or "structured_outputs"
 *   (an object of one of "grammar", "json", "regex", "choice" or "json_object": true) --,
 *   "lora" (the name of one of the defaults' adapters, or "" for none: the LoRA adapter the
 *   request computes with),
 *   "logit_bias" (OpenAI's: an object of at most IFLOW_MAX_BIAS token ids, as decimal strings,
 *   to numbers from -100 to 100; it replaces the defaults'), "min_tokens" (an integer from 0 to
 *   max_tokens), "ignore_eos" (true or false) and "stop_token_ids" (vLLM's: a list of at most
 *   IFLOW_MAX_STOP_IDS token ids; it replaces the defaults') (none of these four with "beams"),
 *   "include_stop_str_in_output" (vLLM's: true or false; not with "beams"), "allowed_token_ids"
 *   (vLLM's: a non-empty list of token ids, the only ones generated), "bad_words" (vLLM's: a
 *   list of at most IFLOW_MAX_BAD_WORDS strings, each with more than white space, the texts
 *   never generated: iflow_request_bad_words() tokenizes them) (neither with "beams"),
 *   "truncate_prompt_tokens" (vLLM's: an integer >= 1, the prompt's last that many tokens kept,
 *   or -1, as many as the context holds; the caller cuts; not with "continuation"), and every
 *   sampling parameter of sampler.h's name table ("temperature", "top_k", "top_p",
 *   "min_p", "seed", "sampler", "mirostat", "repeat_penalty", ...: numbers, or a string for
 *   "sampler"). A field that is absent keeps the default given; "seed" defaults to the given
 *   seed plus the line number minus one (iflow-run's plain mode seeds its n-th prompt, from 0,
 *   the same way), so every request has its own stream and a rerun repeats it.
 *   An OpenAI batch line (the Batch API's input, vLLM's run-batch), {"custom_id": a string,
 *   "method": "POST", "url": "/v1/chat/completions" or "/v1/completions", "body": {...}}, is
 *   read as its body, which takes OpenAI's "model" (kept; the name of one of the defaults'
 *   adapters selects it, as vLLM's --lora-modules, unless "lora" is given) and "stream" (false)
 *   besides, reads a null as an absent field and ignores those that change nothing in a reply
 *   ("user", "store", "metadata", "service_tier", "stream_options", ...),
 *   for the chat API "logprobs" as a boolean with "top_logprobs", for the completions API "echo"
 *   (a boolean; with a text prompt: its tokens' log-probabilities are asked for when "logprobs"
 *   is), and needs "messages" (chat) or "prompt" (completions); "continuation" and
 *   "prompt_logprobs" are refused there. f->api says
 *   which API the line is for (its reply's format: cmd/openai.h), f->id is its custom_id.
 *   An unknown field, a value of the wrong type or range, duplicate keys, or a line that is not
 *   one JSON object is IFLOW_EINVAL with a one-line message naming the field; the fields read
 *   so far (the id at least, when it could be read) are kept for the error result.
 *   iflow_request_fields_free() releases what a parse allocated, after success or failure.
 */
#ifndef IFLOW_REQUEST_H
#define IFLOW_REQUEST_H

#include <jansson.h>
#include <stddef.h>

#include "libcore/engine/sampler.h"
#include "libcore/serving/batch.h"
#include "libcore/serving/grammar.h"
#include "libcore/serving/toolcall.h"
#include "libcore/tokenizers/tokenizer.h"

#define IFLOW_MAX_CHOICES 64 /* "n" */

typedef struct {
    char *id;                       /* compact JSON                                        */
    char *prompt;                   /* NUL-terminated (may hold NULs: prompt_len counts), or NULL */
    size_t prompt_len;
    int32_t *prompt_ids;            /* [n_prompt_ids] "prompt" given as token ids, or NULL   */
    int n_prompt_ids;
    int max_tokens;
    iflow_sampler_params sp;
    char *stop[IFLOW_MAX_STOP];
    int n_stop;
    int context_shift, keep;        /* batch.h's iflow_request fields                      */
    int beams;                      /* 0: none; else beam search of that width (beam.h)    */
    int n;                          /* completions of the prompt (1 .. IFLOW_MAX_CHOICES)   */
    float length_penalty;           /* with beams (default 1)                              */
    int logprobs, prompt_logprobs;  /* 0: absent; else 1 + the field (batch.h's iflow_request) */
    char *continuation;             /* NUL-terminated, or NULL: a text to score after the prompt */
    size_t continuation_len;
    json_t *messages;               /* a chat (prompt NULL), or NULL                       */
    json_t *chat_vars;              /* with messages: "tools" and the chat_template_kwargs, or NULL */
    int add_generation_prompt;      /* with messages (default 1)                           */
    int echo;                       /* an OpenAI completions body's "echo": the reply's text and
                                     * logprobs begin with the prompt's (prompt_logprobs set) */
    iflow_grammar *grammar;         /* the text's grammar (a reference of its own), or NULL */
    int tool_format;                /* IFLOW_TOOLS_*: read the reply's tool calls in this format (0: not) */
    int tool_bare;                  /* the calls are written without their marker (a constrained reply) */
    int adapter;                    /* "lora": 1 + its index in the defaults' adapters; 0: none */
    int32_t *bias_ids;              /* [n_bias] "logit_bias" (or the defaults'), its own copy */
    float *bias_values;             /* [n_bias]                                              */
    int n_bias;
    int min_tokens, ignore_eos;     /* batch.h's iflow_request fields                        */
    int32_t stop_ids[IFLOW_MAX_STOP_IDS]; /* "stop_token_ids" (or the defaults')               */
    int n_stop_ids;
    int include_stop;               /* "include_stop_str_in_output" (or the default)         */
    int32_t *allowed_ids;           /* [n_allowed] "allowed_token_ids", or NULL              */
    int n_allowed;
    char **bad_words;               /* [n_bad_words] "bad_words" (NUL-terminated)             */
    int n_bad_words;
    int32_t *bad_ids;               /* iflow_request_bad_words(): iflow_request's bad_ids,    */
    int *bad_lens;                  /* bad_lens and n_bad                                    */
    int n_bad;
    int truncate_prompt_tokens;     /* 0: none; k >= 1: keep the last k; -1: what fits       */
    int api;                        /* IFLOW_API_*: the line's format, and its reply's        */
    char *model;                    /* an OpenAI body's "model", or NULL                     */
} iflow_request_fields;

/* A line's format: iflow's request, or an OpenAI batch line for the chat, completions or
 * embeddings API (the last for an encoder: iflow_embed_request_parse). */
enum { IFLOW_API_NATIVE = 0, IFLOW_API_CHAT, IFLOW_API_COMPLETIONS, IFLOW_API_EMBEDDINGS };

/* What a field that is absent gets. */
typedef struct {
    int max_tokens, context_shift, keep;
    iflow_sampler_params sp;
    int logprobs, prompt_logprobs;  /* as in iflow_request_fields */
    iflow_grammar *grammar;         /* NULL, or for every request that gives none           */
    int tool_format;                /* IFLOW_TOOLS_*: the format of the chat template's tool calls */
    const char *const *adapters;    /* [n_adapters] the names "lora" may give (iflow-run's
                                     * --lora-module NAME=FILE), in the model's adapter order */
    int n_adapters;
    const int32_t *bias_ids;        /* [n_bias] logit biases (--logit-bias; -INFINITY bans) */
    const float *bias_values;
    int n_bias;
    int min_tokens, ignore_eos;
    const int32_t *stop_ids;        /* [n_stop_ids] --stop-token-id */
    int n_stop_ids;
    int include_stop;               /* --include-stop */
} iflow_request_defaults;

int  iflow_request_parse(iflow_request_fields *out, const char *line, size_t len, long line_no,
                         const iflow_request_defaults *defaults);
/* Bad words words [n_words] as banned token sequences (iflow_request's bad_ids, bad_lens), by
 * vLLM's rule: each word without its leading white space, tokenized by t without special tokens,
 * and once more after a space where that gives as many tokens with another first one (the word
 * inside a text). ids: [IFLOW_MAX_BAD_TOKENS], lens: [IFLOW_MAX_BAD_WORDS], *n: the sequences.
 * IFLOW_EINVAL past those bounds, or for a word that makes no tokens. */
int iflow_bad_words_encode(const iflow_tokenizer *t, const char *const *words, int n_words, int32_t *ids, int *lens,
                           int *n);
/* f's bad_words so (f->bad_ids, bad_lens, n_bad); a message names the field. */
int iflow_request_bad_words(iflow_request_fields *f, const iflow_tokenizer *t);
/* An OpenAI batch line for /v1/embeddings (iflow-run --embed --batch; untrusted input, fuzzed
 * with the requests): {"custom_id", "method": "POST", "url": "/v1/embeddings", "body":
 * {"input": a string, a list of strings, a list of token ids or a list of such lists (1 to
 * IFLOW_MAX_EMBED_INPUTS inputs, none empty), "model", "encoding_format": "float" or "base64",
 * "dimensions", "user"}}. An unknown field, another url, or a value of the wrong type is
 * IFLOW_EINVAL naming it; the id is read first (for the error reply). */
#define IFLOW_MAX_EMBED_INPUTS 2048
typedef struct {
    char *id;                       /* custom_id as compact JSON (the line number when absent) */
    char *model;                    /* the body's "model", or NULL                          */
    int n_inputs;
    char **texts;                   /* [n_inputs] a text (NUL-terminated), or NULL for ids   */
    size_t *lens;                   /* [n_inputs] its length                                 */
    int32_t **ids;                  /* [n_inputs] token ids as given, or NULL for a text     */
    int *n_ids;                     /* [n_inputs]                                            */
    int base64;                     /* encoding_format "base64": little-endian float32s      */
    int dimensions;                 /* 0: absent                                             */
} iflow_embed_fields;
int  iflow_embed_request_parse(iflow_embed_fields *f, const char *line, size_t len, long line_no);
void iflow_embed_fields_free(iflow_embed_fields *f);

/* The seed of completion k of a request seeded `seed`: seed itself for k 0 (so "n": 1 changes
 * nothing), else a mix of both (neighbouring lines' seeds differ by one: k must not add). */
uint64_t iflow_request_choice_seed(uint64_t seed, int k);
void iflow_request_fields_free(iflow_request_fields *f);

#endif
