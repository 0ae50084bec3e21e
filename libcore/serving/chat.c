/* chat.c -- a conversation made into a prompt by the model's chat template. See chat.h. */
#include "chat.h"
#include "template.h"
#include "reasoning.h"
#include "toolcall.h"
#include "libcore/base/error.h"
#include "libcore/base/jsonutil.h"
#include "libcore/base/quote.h"
#include "libcore/base/util.h"
#include "libcore/formats/gguf.h"
#include "libcore/formats/shard.h"
#include "libcore/tokenizers/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct iflow_chat {
    iflow_template *t;
    const iflow_tokenizer *tok;
    int tool_format;   /* IFLOW_TOOLS_*: the calls the template asks for (toolcall.h) */
    int reasoning;     /* the template names <think> (reasoning.h) */
    char source[4200]; /* where the template came from, for messages */
};

/* A shard written before "chat_template" records: the key of its GGUF vocabulary record. The
 * text is copied into *own. */
static int template_of_gguf_vocab(const iflow_shard *sh, char **own, size_t *len)
{
    const iflow_shard_rec *r = iflow_shard_find(sh, "tokenizer");
    if (!r || r->nbytes < 4 || memcmp(r->data, "GGUF", 4) != 0)
        return IFLOW_ENOTFOUND;
    iflow_gguf *g;
    const char *text;
    int rc = iflow_gguf_open_mem(&g, r->data, r->nbytes, iflow_shard_path(sh));
    if (rc < 0)
        return rc;
    rc = iflow_gguf_get_str(g, IFLOW_GGUF_CHAT_TEMPLATE, &text, len);
    if (rc == 0 && !(*own = malloc(*len + 1)))
        rc = iflow_seterr(IFLOW_ENOMEM, "out of memory");
    if (rc == 0) {
        memcpy(*own, text, *len);
        (*own)[*len] = 0;
    }
    iflow_gguf_close(g);
    return rc;
}

/* The model's template (*text points into the shard or into *own), or IFLOW_ENOTFOUND. */
static int template_of_model(const iflow_model *m, const char **text, char **own, size_t *len)
{
    const iflow_shard *sh = iflow_model_shard(m);
    const iflow_shard_rec *r = iflow_shard_find(sh, "chat_template");
    if (r) {
        *text = r->data;
        *len = r->nbytes;
        return 0;
    }
    int rc = template_of_gguf_vocab(sh, own, len);
    *text = *own;
    return rc;
}

int iflow_chat_open(iflow_chat **out, const iflow_model *m, const char *template_path)
{
    return iflow_chat_open_as(out, m, template_path, NULL);
}

int iflow_chat_open_as(iflow_chat **out, const iflow_model *m, const char *template_path, const char *model_name)
{
    *out = NULL;
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    const char *path = model_name ? model_name : iflow_shard_path(iflow_model_shard(m));
    if (!tok)
        return iflow_seterr(IFLOW_ENOTFOUND, "model '%s' has no tokenizer", path);
    iflow_chat *c = calloc(1, sizeof *c);
    if (!c)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    c->tok = tok;
    const char *text = NULL;
    char *own = NULL;
    size_t len = 0;
    int rc;
    if (template_path) {
        snprintf(c->source, sizeof c->source, "chat template '%s'", template_path);
        rc = iflow_read_file(template_path, IFLOW_MAX_CHAT_TEMPLATE, &own, &len);
        text = own;
    } else {
        snprintf(c->source, sizeof c->source, "the chat template of '%s'", path);
        rc = template_of_model(m, &text, &own, &len);
        if (rc == IFLOW_ENOTFOUND)
            rc = iflow_seterr(IFLOW_ENOTFOUND, "model '%s' has no chat template: give one with --chat-template", path);
    }
    if (rc == 0)
        rc = iflow_template_open(&c->t, text, len, c->source);
    if (rc == 0) {
        c->tool_format = iflow_tool_format_detect(text, len);
        c->reasoning = iflow_reasoning_detect(text, len);
    }
    free(own);
    if (rc < 0) {
        iflow_chat_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void iflow_chat_close(iflow_chat *c)
{
    if (!c)
        return;
    iflow_template_close(c->t);
    free(c);
}

const char *iflow_chat_source(const iflow_chat *c) { return c->source; }

int iflow_chat_tool_format(const iflow_chat *c) { return c->tool_format; }

int iflow_chat_reasoning(const iflow_chat *c) { return c->reasoning; }

/* Each message an object with a string "role" and a "content" that is a string, a list (of
 * parts: multimodal requests) or null (an assistant's tool call). */
static int check_messages(const json_t *messages)
{
    if (!json_is_array(messages) || json_array_size(messages) == 0)
        return iflow_seterr(IFLOW_EINVAL, "'messages' must be a list of messages, not empty");
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const json_t *msg = json_array_get(messages, i), *content = json_object_get(msg, "content");
        if (!json_is_object(msg))
            return iflow_seterr(IFLOW_EINVAL, "message %zu is not an object", i);
        if (!json_is_string(json_object_get(msg, "role")))
            return iflow_seterr(IFLOW_EINVAL, "message %zu has no 'role' (a string)", i);
        if (content && !json_is_string(content) && !json_is_array(content) && !json_is_null(content))
            return iflow_seterr(IFLOW_EINVAL, "'content' of message %zu is not a string, a list or null", i);
    }
    return 0;
}

/* vars[name] = the text of the tokenizer's token id, unless it has none (-1): then undefined. */
static int set_token_text(json_t *vars, const char *name, const iflow_tokenizer *tok, int32_t id)
{
    size_t len;
    const char *s = iflow_tokenizer_token_text(tok, id, &len);
    return s ? json_object_set_new(vars, name, json_stringn_nocheck(s, len)) : 0;
}

/* The assistants' tool calls with their "arguments" as objects where they came as JSON text
 * (OpenAI's API gives them so; templates write them with tojson): a new reference to messages
 * itself when none needs it, NULL when out of memory. */
static json_t *arguments_as_objects(const json_t *messages)
{
    json_t *copy = NULL;
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const json_t *calls = json_object_get(json_array_get(messages, i), "tool_calls");
        for (size_t k = 0; k < json_array_size(calls); k++) {
            const json_t *args = json_object_get(json_object_get(json_array_get(calls, k), "function"), "arguments");
            json_error_t e;
            json_t *obj = json_is_string(args) ? json_loadb(json_string_value(args), json_string_length(args), 0, &e)
                                               : NULL;
            if (!json_is_object(obj)) {
                json_decref(obj);
                continue;
            }
            if (!copy && !(copy = json_deep_copy(messages))) {
                json_decref(obj);
                return NULL;
            }
            json_t *fn = json_object_get(json_array_get(json_object_get(json_array_get(copy, i), "tool_calls"), k),
                                         "function");
            if (json_object_set_new(fn, "arguments", obj) < 0) {
                json_decref(copy);
                return NULL;
            }
        }
    }
    return copy ? copy : json_incref((json_t *)messages);
}

/* A content given as a list of parts (OpenAI's newer form: [{"type": "text", "text": ...}]) as
 * the text of its parts joined by newlines, as vLLM gives it to a template that reads strings
 * (every template also takes a string: those that read parts test for one first). iflow reads
 * text only: another part's type is refused, naming the message. Works on messages in place
 * (the caller's copy). */
static int contents_as_text(json_t *messages)
{
    for (size_t i = 0; i < json_array_size(messages); i++) {
        json_t *msg = json_array_get(messages, i), *content = json_object_get(msg, "content"), *part;
        if (!json_is_array(content))
            continue;
        size_t k, n = 0;
        json_array_foreach(content, k, part)
        {
            const char *type = json_string_value(json_object_get(part, "type"));
            const json_t *t = json_object_get(part, "text");
            if (type && strcmp(type, "text") != 0)
                return iflow_seterr(IFLOW_EINVAL, "message %zu: content part %zu is of type '%s': iflow reads text "
                                    "only", i, k, iflow_quote(type));
            if (!type || !json_is_string(t))
                return iflow_seterr(IFLOW_EINVAL, "message %zu: content part %zu is not {\"type\": \"text\", "
                                    "\"text\": a string}", i, k);
            n += json_string_length(t) + 1;
        }
        char *text = malloc(n + 1), *at = text;
        if (!text)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
        json_array_foreach(content, k, part)
        {
            const json_t *t = json_object_get(part, "text");
            if (k)
                *at++ = '\n';
            memcpy(at, json_string_value(t), json_string_length(t));
            at += json_string_length(t);
        }
        int rc = json_object_set_new(msg, "content", json_stringn_nocheck(text, (size_t)(at - text)));
        free(text);
        if (rc < 0)
            return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    return 0;
}

/* *out = messages as the template reads them (arguments_as_objects, contents_as_text): a new
 * reference. */
static int messages_for_template(const json_t *messages, json_t **out)
{
    int parts = 0;
    for (size_t i = 0; i < json_array_size(messages); i++)
        parts |= json_is_array(json_object_get(json_array_get(messages, i), "content"));
    json_t *m = arguments_as_objects(messages), *copy = parts && m ? json_deep_copy(m) : NULL;
    if (parts) {
        json_decref(m);
        m = copy;
    }
    if (!m)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    int rc = parts ? contents_as_text(m) : 0;
    if (rc < 0)
        json_decref(m);
    *out = rc < 0 ? NULL : m;
    return rc;
}

int iflow_chat_render(const iflow_chat *c, const json_t *messages, const json_t *extra, int add_generation_prompt,
                      char **text, size_t *len)
{
    static const char *const own[] = {"messages", "add_generation_prompt", "bos_token", "eos_token"};
    *text = NULL;
    *len = 0;
    IFLOW_TRY(check_messages(messages));
    if (extra && !json_is_object(extra))
        return iflow_seterr(IFLOW_EINVAL, "the template's extra variables must be an object");
    for (size_t i = 0; extra && i < sizeof own / sizeof own[0]; i++)
        if (json_object_get(extra, own[i]))
            return iflow_seterr(IFLOW_EINVAL, "'%s' cannot be an extra template variable: the conversation sets it",
                                own[i]);
    json_t *msgs = NULL;
    IFLOW_TRY(messages_for_template(messages, &msgs));
    json_t *vars = extra ? json_copy((json_t *)extra) : json_object();
    if (!vars || json_object_set_new(vars, "messages", msgs) < 0 ||
        json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt)) < 0 ||
        set_token_text(vars, "bos_token", c->tok, iflow_tokenizer_bos(c->tok)) < 0 ||
        set_token_text(vars, "eos_token", c->tok, iflow_tokenizer_eos(c->tok)) < 0) {
        if (!vars) /* else msgs went to vars, or was dropped by the failed set */
            json_decref(msgs);
        json_decref(vars);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    int rc = iflow_template_render(c->t, vars, text, len);
    json_decref(vars);
    return rc;
}

int iflow_chat_encode(const iflow_chat *c, const char *text, size_t len, int32_t **ids, size_t *n_ids)
{
    return iflow_tokenizer_encode(c->tok, text, len, IFLOW_TOK_PARSE_SPECIAL, ids, n_ids);
}

int iflow_chat_tokens(const iflow_chat *c, const char *messages_json, size_t len, int add_generation_prompt,
                      int32_t **ids, size_t *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    json_t *messages;
    char *text;
    size_t text_len;
    IFLOW_TRY(iflow_json_load_buf(&messages, messages_json, len, "the messages"));
    int rc = iflow_chat_render(c, messages, NULL, add_generation_prompt, &text, &text_len);
    json_decref(messages);
    if (rc == 0)
        rc = iflow_chat_encode(c, text, text_len, ids, n_ids);
    free(text);
    return rc;
}
