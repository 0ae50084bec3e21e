/* openai.c -- OpenAI batch output lines. See openai.h. */
#include "cmd/openai.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* iflow's finish reason as OpenAI's. */
static const char *finish_reason(const json_t *c)
{
    const char *why = json_string_value(json_object_get(c, "finish_reason"));
    if (!why)
        return "stop";
    if (strcmp(why, "length") == 0 || strcmp(why, "context") == 0)
        return "length";
    return strcmp(why, "tool_calls") == 0 ? "tool_calls" : "stop";
}

/* A token entry's text (iflow's "token", or its "bytes" with U+FFFD for each byte past ASCII
 * when they are not UTF-8 alone) and its bytes. */
static void token_parts(const json_t *e, json_t **text, json_t **bytes)
{
    const json_t *t = json_object_get(e, "token"), *b = json_object_get(e, "bytes");
    *bytes = json_array();
    if (json_is_string(t)) {
        const unsigned char *s = (const unsigned char *)json_string_value(t);
        for (size_t i = 0; i < json_string_length(t); i++)
            json_array_append_new(*bytes, json_integer(s[i]));
        *text = json_incref((json_t *)t);
        return;
    }
    char buf[1024];
    size_t n = 0, i;
    json_t *x;
    json_array_foreach(b, i, x)
    {
        int c = (int)json_integer_value(x);
        json_array_append_new(*bytes, json_integer(c));
        const char *put = c < 0x80 ? (char[]){(char)c, 0} : "\xef\xbf\xbd";
        size_t k = c < 0x80 ? 1 : 3;
        if (n + k < sizeof buf)
            memcpy(buf + n, put, k), n += k;
    }
    *text = json_stringn(buf, n);
}

/* The chat API's logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}. */
static json_t *chat_logprobs(const json_t *native)
{
    json_t *content = json_array(), *e, *tp;
    size_t i, k;
    json_array_foreach(native, i, e)
    {
        json_t *text, *bytes, *top = json_array();
        json_array_foreach(json_object_get(e, "top"), k, tp)
        {
            json_t *tt, *tb;
            token_parts(tp, &tt, &tb);
            json_array_append_new(top, json_pack("{s:o, s:O, s:o}", "token", tt, "logprob",
                                                 json_object_get(tp, "logprob"), "bytes", tb));
        }
        token_parts(e, &text, &bytes);
        json_array_append_new(content, json_pack("{s:o, s:O, s:o, s:o}", "token", text, "logprob",
                                                 json_object_get(e, "logprob"), "bytes", bytes, "top_logprobs", top));
    }
    return json_pack("{s:o}", "content", content);
}

/* Characters (code points) of UTF-8 text s[0..len). */
static size_t n_chars(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; s && i < len; i++)
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

/* Characters by which the prompt's tokens' texts exceed the prompt (SentencePiece's dummy prefix:
 * the first token reads " Once" where the prompt reads "Once"), 0 when they do not. */
static size_t prompt_skew(const json_t *prompt_lps, const char *text, size_t len)
{
    size_t i, tokens = 0, chars = n_chars(text, len);
    json_t *e, *t, *b;
    json_array_foreach(prompt_lps, i, e)
    {
        token_parts(e, &t, &b);
        tokens += n_chars(json_string_value(t), json_string_length(t));
        json_decref(t), json_decref(b);
    }
    return tokens > chars ? tokens - chars : 0;
}

/* The completions API's logprobs: {"tokens", "token_logprobs", "top_logprobs" (an object of
 * token text to logprob a position), "text_offset" (in characters, from the text's start)}, of
 * the prompt's tokens (echo: iflow's prompt_logprobs of prompt_text, or NULL) and then the
 * completion's. With echo an offset indexes the echoed text: characters the prompt's tokens add
 * to it (a dummy prefix) are taken off, the first token's at 0. */
static json_t *completion_logprobs(const json_t *prompt, const char *prompt_text, size_t prompt_len,
                                   const json_t *native)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offsets = json_array(), *e, *tp;
    json_t *all = json_array();
    size_t i, k, at = 0;
    const size_t skew = prompt ? prompt_skew(prompt, prompt_text, prompt_len) : 0;
    if (prompt)
        json_array_extend(all, (json_t *)prompt);
    json_array_extend(all, (json_t *)native);
    json_array_foreach(all, i, e)
    {
        json_t *text, *bytes, *top = json_object();
        token_parts(e, &text, &bytes);
        json_decref(bytes);
        json_array_foreach(json_object_get(e, "top"), k, tp)
        {
            json_t *tt, *tb;
            token_parts(tp, &tt, &tb);
            json_object_set(top, json_string_value(tt), json_object_get(tp, "logprob"));
            json_decref(tt), json_decref(tb);
        }
        json_array_append_new(offsets, json_integer((json_int_t)(at > skew ? at - skew : 0)));
        at += n_chars(json_string_value(text), json_string_length(text));
        json_array_append_new(tokens, text);
        json_array_append(lps, json_object_get(e, "logprob"));
        json_array_append_new(tops, top);
    }
    json_decref(all);
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offsets);
}

/* A completion's text, after the prompt's with echo. */
static json_t *completion_text(const json_t *c, const iflow_request_fields *f)
{
    const json_t *text = json_object_get(c, "text");
    if (!f->echo || !f->prompt)
        return json_incref((json_t *)text);
    size_t n = json_string_length(text);
    char *s = malloc(f->prompt_len + n + 1);
    if (!s)
        return NULL;
    memcpy(s, f->prompt, f->prompt_len);
    memcpy(s + f->prompt_len, json_string_value(text), n + 1);
    json_t *out = json_stringn(s, f->prompt_len + n);
    free(s);
    return out;
}

/* One choice of the body from iflow's completion c (native: the line's result, whose
 * prompt_logprobs an echo's logprobs begin with). */
static json_t *choice(const json_t *c, int index, const iflow_request_fields *f, const json_t *native)
{
    const int api = f->api;
    const json_t *lp = json_object_get(c, "logprobs");
    json_t *o = json_pack("{s:i}", "index", index);
    if (api == IFLOW_API_CHAT) {
        const json_t *content = json_object_get(c, "content"), *calls = json_object_get(c, "tool_calls");
        if (!content)
            content = json_object_get(c, "text");
        if (json_array_size(calls) > 0 && json_string_length(content) == 0) /* OpenAI's: calls and no text */
            content = json_null();
        json_t *msg = json_pack("{s:s, s:O}", "role", "assistant", "content", content);
        if (json_object_get(c, "reasoning_content"))
            json_object_set(msg, "reasoning_content", json_object_get(c, "reasoning_content"));
        if (json_array_size(calls) > 0)
            json_object_set(msg, "tool_calls", (json_t *)calls);
        json_object_set_new(o, "message", msg);
        json_object_set_new(o, "logprobs", lp ? chat_logprobs(lp) : json_null());
    } else {
        json_object_set_new(o, "text", completion_text(c, f));
        const json_t *plp = f->echo ? json_object_get(native, "prompt_logprobs") : NULL;
        json_object_set_new(o, "logprobs", lp ? completion_logprobs(plp, f->prompt, f->prompt_len, lp) : json_null());
    }
    json_object_set_new(o, "finish_reason", json_string(finish_reason(c)));
    return o;
}

/* The body of a refused line. */
static json_t *error_body(const char *message)
{
    return json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", message, "type", "invalid_request_error", "param",
                     "code");
}

/* The envelope around body: status 200, or 400 with an error body. */
static json_t *envelope(json_t *custom_id, long line, int status, json_t *body)
{
    char id[64], req[64];
    snprintf(id, sizeof id, "batch_req_%ld", line);
    snprintf(req, sizeof req, "req_%ld", line);
    return json_pack("{s:s, s:o, s:{s:i, s:s, s:o}, s:n}", "id", id, "custom_id", custom_id, "response", "status_code",
                     status, "request_id", req, "body", body, "error");
}

/* n bytes in base64 (RFC 4648, padded). */
static json_t *base64(const unsigned char *b, size_t n)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc(4 * ((n + 2) / 3) + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)b[i] << 16 | (i + 1 < n ? (unsigned)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        *o++ = abc[v >> 18 & 63];
        *o++ = abc[v >> 12 & 63];
        *o++ = i + 1 < n ? abc[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? abc[v & 63] : '=';
    }
    *o = 0;
    json_t *s = json_string(out);
    free(out);
    return s;
}

json_t *openai_embedding(const float *v, int dim, int index, int b64)
{
    json_t *e;
    if (b64) {
        unsigned char *bytes = malloc((size_t)dim * 4);
        for (int d = 0; bytes && d < dim; d++) {
            uint32_t u;
            memcpy(&u, &v[d], 4);
            for (int k = 0; k < 4; k++)
                bytes[4 * d + k] = (unsigned char)(u >> (8 * k));
        }
        e = bytes ? base64(bytes, (size_t)dim * 4) : NULL;
        free(bytes);
    } else {
        e = json_array();
        for (int d = 0; e && d < dim; d++)
            json_array_append_new(e, json_real(v[d]));
    }
    return json_pack("{s:s, s:i, s:o}", "object", "embedding", "index", index, "embedding", e);
}

json_t *openai_embedding_line(const char *custom_id, long line, const char *model, json_t *data, long prompt_tokens,
                              const char *error)
{
    json_error_t e;
    json_t *cid = json_loads(custom_id, JSON_DECODE_ANY, &e);
    if (!cid)
        cid = json_string(custom_id);
    if (error) {
        json_decref(data);
        return envelope(cid, line, 400, error_body(error));
    }
    char body_id[64];
    snprintf(body_id, sizeof body_id, "embd-%ld", line);
    json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:o, s:{s:I, s:I}}", "id", body_id, "object", "list", "created",
                             (json_int_t)time(NULL), "model", model ? model : "", "data", data, "usage",
                             "prompt_tokens", (json_int_t)prompt_tokens, "total_tokens", (json_int_t)prompt_tokens);
    return envelope(cid, line, 200, body);
}

json_t *openai_batch_line(json_t *native, const iflow_request_fields *f, long line, const char *model)
{
    if (!native)
        return NULL;
    char body_id[64];
    snprintf(body_id, sizeof body_id, "%s-%ld", f->api == IFLOW_API_CHAT ? "chatcmpl" : "cmpl", line);
    json_t *body;
    int status = 200;
    if (json_object_get(native, "error")) {
        status = 400;
        body = error_body(json_string_value(json_object_get(native, "error")));
    } else {
        const json_t *many = json_object_get(native, "choices"), *c;
        json_t *choices = json_array();
        json_int_t completion = 0;
        size_t k;
        if (many) {
            json_array_foreach(many, k, c)
            {
                json_array_append_new(choices, choice(c, (int)k, f, native));
                completion += json_integer_value(json_object_get(c, "completion_tokens"));
            }
        } else {
            json_array_append_new(choices, choice(native, 0, f, native));
            completion = json_integer_value(json_object_get(native, "completion_tokens"));
        }
        json_int_t prompt = json_integer_value(json_object_get(native, "prompt_tokens"));
        body = json_pack("{s:s, s:s, s:I, s:s, s:o, s:{s:I, s:I, s:I}}", "id", body_id, "object",
                         f->api == IFLOW_API_CHAT ? "chat.completion" : "text_completion", "created",
                         (json_int_t)time(NULL), "model", f->model ? f->model : model ? model : "", "choices", choices,
                         "usage", "prompt_tokens", prompt, "completion_tokens", completion, "total_tokens",
                         prompt + completion);
    }
    json_t *out = envelope(json_incref(json_object_get(native, "id")), line, status, body);
    json_decref(native);
    return out;
}
