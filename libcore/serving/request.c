/* request.c -- a batch request line. See request.h. */
#include "libcore/serving/request.h"
#include "libcore/base/error.h"
#include "libcore/base/quote.h"
#include "libcore/serving/beam.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void iflow_request_fields_free(iflow_request_fields *f)
{
    free(f->id);
    free(f->prompt);
    free(f->prompt_ids);
    free(f->continuation);
    free(f->bias_ids);
    free(f->bias_values);
    free(f->allowed_ids);
    free(f->model);
    for (int i = 0; i < f->n_bad_words; i++)
        free(f->bad_words[i]);
    free(f->bad_words);
    free(f->bad_ids);
    free(f->bad_lens);
    json_decref(f->messages);
    json_decref(f->chat_vars);
    iflow_grammar_close(f->grammar);
    for (int i = 0; i < f->n_stop; i++)
        free(f->stop[i]);
    memset(f, 0, sizeof *f);
}

static int oom(void) { return iflow_seterr(IFLOW_ENOMEM, "out of memory"); }

/* Field `key`'s value v as true or false into *out. */
static int field_bool(const char *key, const json_t *v, int *out)
{
    if (!json_is_boolean(v))
        return iflow_seterr(IFLOW_EINVAL, "field '%s' must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

/* Field `key`'s value v as an integer from lo to hi into *out. */
static int field_int(const char *key, const json_t *v, int lo, int hi, int *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return iflow_seterr(IFLOW_EINVAL, "field '%s' must be an integer from %d to %d", key, lo, hi);
    *out = (int)json_integer_value(v);
    return 0;
}

/* A template variable of the request's chat ("tools", or one of chat_template_kwargs). */
static int chat_var(iflow_request_fields *f, const char *key, json_t *v)
{
    if (!f->chat_vars && !(f->chat_vars = json_object()))
        return oom();
    if (json_object_get(f->chat_vars, key))
        return iflow_seterr(IFLOW_EINVAL, "template variable '%s' given twice", key);
    return json_object_set(f->chat_vars, key, v) < 0 ? oom() : 0;
}

/* What a request asks of its tools. */
typedef struct {
    int given;            /* "tool_choice" was given                  */
    int choice;           /* IFLOW_TOOL_CHOICE_*                      */
    const char *name;     /* NAMED: the function (in the request's JSON) */
    int parallel;         /* "parallel_tool_calls" (default 1)        */
    int parallel_given;
} tool_ask;

/* "tool_choice": a string or {"type": "function", "function": {"name": N}}. */
static int parse_tool_choice(tool_ask *t, const json_t *v)
{
    static const char *const names[] = {"auto", "none", "required"};
    t->given = 1;
    for (int i = 0; json_is_string(v) && i < 3; i++)
        if (strcmp(json_string_value(v), names[i]) == 0) {
            t->choice = i; /* IFLOW_TOOL_CHOICE_AUTO, _NONE, _REQUIRED */
            return 0;
        }
    const char *type = json_string_value(json_object_get(v, "type"));
    const json_t *name = json_object_get(json_object_get(v, "function"), "name");
    if (!type || strcmp(type, "function") != 0 || !json_is_string(name))
        return iflow_seterr(IFLOW_EINVAL, "field 'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                          "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    t->choice = IFLOW_TOOL_CHOICE_NAMED;
    t->name = json_string_value(name);
    return 0;
}

/* After every field: whether the reply's calls are read, and the grammar of a required one. */
static int tools_settle(iflow_request_fields *f, const tool_ask *t, int grammar_given, int fmt)
{
    const json_t *tools = json_object_get(f->chat_vars, "tools");
    if ((t->given || t->parallel_given) && !tools)
        return iflow_seterr(IFLOW_EINVAL, "fields 'tool_choice' and 'parallel_tool_calls' go with 'tools'");
    if (!tools || t->choice == IFLOW_TOOL_CHOICE_NONE || (!fmt && !t->given))
        return 0; /* tools the template may show; no calls read */
    if (!fmt)
        return iflow_seterr(IFLOW_EINVAL, "field 'tool_choice': the chat template names no tool-call format; give "
                                          "one with --tool-parser (hermes, llama3_json, mistral, granite, pythonic)");
    f->tool_format = fmt;
    if (t->choice == IFLOW_TOOL_CHOICE_AUTO)
        return 0;
    if (grammar_given || f->beams)
        return iflow_seterr(IFLOW_EINVAL, "field 'tool_choice' \"required\" or a function constrains the reply: "
                                          "it does not go with %s",
                            f->beams ? "'beams'" : "another constraint");
    iflow_grammar_close(f->grammar); /* the command line's constraint is for the other requests */
    f->grammar = NULL;
    f->tool_bare = 1;
    int rc = iflow_tool_grammar(&f->grammar, fmt, tools, t->name, t->parallel);
    return rc < 0 ? iflow_preperr(rc, "field 'tool_choice'") : 0;
}

/* "messages", "add_generation_prompt", "tools", "chat_template_kwargs"; 1 when key is none of them.
 * *chat_given is set by the three that go with "messages". */
static int parse_chat_field(iflow_request_fields *f, const char *key, json_t *v, int *chat_given)
{
    if (strcmp(key, "messages") == 0) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return iflow_seterr(IFLOW_EINVAL, "field 'messages' must be a non-empty list of messages");
        f->messages = json_incref(v);
        return 0;
    }
    int rc = 0;
    if (strcmp(key, "add_generation_prompt") == 0) {
        rc = field_bool(key, v, &f->add_generation_prompt);
    } else if (strcmp(key, "tools") == 0) {
        if (!json_is_array(v))
            return iflow_seterr(IFLOW_EINVAL, "field 'tools' must be a list");
        rc = chat_var(f, key, v);
    } else if (strcmp(key, "chat_template_kwargs") == 0) {
        if (!json_is_object(v))
            return iflow_seterr(IFLOW_EINVAL, "field 'chat_template_kwargs' must be an object");
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x)
        {
            if ((rc = chat_var(f, k, x)) < 0)
                break;
        }
    } else
        return 1;
    *chat_given = 1;
    return rc;
}

static int parse_stop(iflow_request_fields *f, const json_t *v)
{
    if (json_is_string(v) && json_string_length(v) > 0) {
        if (!(f->stop[f->n_stop] = strdup(json_string_value(v))))
            return oom();
        f->n_stop++;
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) > IFLOW_MAX_STOP)
        return iflow_seterr(IFLOW_EINVAL, "field 'stop' must be a non-empty string or an array of at most %d",
                            IFLOW_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s)
    {
        if (!json_is_string(s) || json_string_length(s) == 0 || strlen(json_string_value(s)) != json_string_length(s))
            return iflow_seterr(IFLOW_EINVAL, "field 'stop' must hold non-empty strings");
        if (!(f->stop[f->n_stop] = strdup(json_string_value(s))))
            return oom();
        f->n_stop++;
    }
    return 0;
}

/* schema (a JSON Schema: an object or true) made the request's grammar. */
static int schema_grammar(iflow_request_fields *f, const json_t *schema)
{
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text)
        return oom();
    int rc = iflow_grammar_open_as(&f->grammar, IFLOW_GRAMMAR_JSON_SCHEMA, text, strlen(text));
    free(text);
    return rc;
}

/* Any JSON object (OpenAI's json_object). */
static int json_object_grammar(iflow_request_fields *f)
{
    return iflow_grammar_open_as(&f->grammar, IFLOW_GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\"}", 17);
}

/* OpenAI's response_format. */
static int response_format_grammar(iflow_request_fields *f, const json_t *v)
{
    const char *type = json_string_value(json_object_get(v, "type"));
    if (!json_is_object(v) || !type)
        return iflow_seterr(IFLOW_EINVAL, "it must be an object with a string \"type\"");
    if (strcmp(type, "text") == 0)
        return 0;
    if (strcmp(type, "json_object") == 0)
        return json_object_grammar(f);
    const json_t *schema = json_object_get(json_object_get(v, "json_schema"), "schema");
    if (strcmp(type, "json_schema") != 0)
        return iflow_seterr(IFLOW_EINVAL, "type '%s' is not \"text\", \"json_object\" or \"json_schema\"", type);
    if (!json_is_object(schema) && !json_is_boolean(schema))
        return iflow_seterr(IFLOW_EINVAL, "type \"json_schema\" needs \"json_schema\": {\"schema\": {...}}");
    return schema_grammar(f, schema);
}

/* "choice": the text is one of a list of strings. */
static int choice_grammar(iflow_request_fields *f, const json_t *v)
{
    size_t n = json_array_size(v), i;
    const char **texts = malloc((n ? n : 1) * sizeof *texts);
    size_t *lens = malloc((n ? n : 1) * sizeof *lens);
    int rc = texts && lens ? 0 : oom();
    if (rc == 0 && (!json_is_array(v) || n == 0 || n > 65536))
        rc = iflow_seterr(IFLOW_EINVAL, "it must be a list of 1 to 65536 strings");
    json_t *x;
    json_array_foreach(v, i, x)
    {
        if (rc < 0)
            break;
        if (!json_is_string(x) || json_string_length(x) == 0)
            rc = iflow_seterr(IFLOW_EINVAL, "choice %zu is not a non-empty string", i + 1);
        else {
            texts[i] = json_string_value(x);
            lens[i] = json_string_length(x);
        }
    }
    if (rc == 0)
        rc = iflow_grammar_open_choices(&f->grammar, texts, lens, (int)n);
    free(texts);
    free(lens);
    return rc;
}

enum { C_GRAMMAR, C_SCHEMA, C_REGEX, C_CHOICE, C_FORMAT, C_JSON_OBJECT, C_STRUCTURED, C_KINDS };

/* The constraint a field names: iflow's names, then vLLM's older guided_* ones and its newer
 * structured_outputs object; C_KINDS for another field. */
static int constraint_kind(const char *key)
{
    static const char *const keys[] = {"grammar", "json_schema", "regex", "choice", "response_format"};
    static const char *const guided[] = {"guided_grammar", "guided_json", "guided_regex", "guided_choice"};
    for (int k = 0; k < 5; k++)
        if (strcmp(key, keys[k]) == 0)
            return k;
    for (int k = 0; k < 4; k++)
        if (strcmp(key, guided[k]) == 0)
            return k;
    return strcmp(key, "structured_outputs") == 0 ? C_STRUCTURED : C_KINDS;
}

/* vLLM's structured_outputs: an object of one member, "grammar", "json", "regex", "choice" or
 * "json_object" (true); *k, *inner: which, and its value. */
static int structured_outputs(const json_t *v, int *k, const json_t **inner)
{
    static const char *const names[] = {"grammar", "json", "regex", "choice", "", "json_object"};
    const int one = json_is_object(v) && json_object_size(v) == 1;
    const char *key = one ? json_object_iter_key(json_object_iter((json_t *)v)) : NULL;
    for (int i = 0; key && i < 6; i++)
        if (strcmp(key, names[i]) == 0 && (i != C_JSON_OBJECT || json_is_true(json_object_get(v, key)))) {
            *k = i;
            *inner = json_object_get(v, key);
            return 0;
        }
    return iflow_seterr(IFLOW_EINVAL, "it must be an object of one of \"grammar\", \"json\", \"regex\", \"choice\" "
                                      "or \"json_object\": true");
}

/* The constraint fields ("grammar", "json_schema", "regex", "choice", "response_format", and
 * vLLM's names for them): the request's grammar instead of the default one. 1 when key is none
 * of them. */
static int parse_grammar_field(iflow_request_fields *f, const char *key, const json_t *v, int *given)
{
    int k = constraint_kind(key), rc = 0;
    if (k == C_KINDS)
        return 1;
    if ((*given)++)
        return iflow_seterr(IFLOW_EINVAL, "fields 'grammar', 'json_schema', 'regex', 'choice' and 'response_format' "
                                          "(or vLLM's names for them): one at most");
    iflow_grammar_close(f->grammar); /* the default's reference */
    f->grammar = NULL;
    if (k == C_STRUCTURED && (rc = structured_outputs(v, &k, &v)) < 0)
        return iflow_preperr(rc, "field '%s'", key);
    int text = k == C_GRAMMAR || k == C_REGEX;
    if (k == C_JSON_OBJECT)
        rc = json_object_grammar(f);
    else if (text && (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)))
        rc = iflow_seterr(IFLOW_EINVAL, "it must be a string");
    else if (text)
        rc = iflow_grammar_open_as(&f->grammar, k == C_GRAMMAR ? IFLOW_GRAMMAR_GBNF : IFLOW_GRAMMAR_REGEX,
                                   json_string_value(v), json_string_length(v));
    else if (k == C_SCHEMA && json_is_string(v)) /* the schema's JSON text */
        rc = iflow_grammar_open_as(&f->grammar, IFLOW_GRAMMAR_JSON_SCHEMA, json_string_value(v),
                                   json_string_length(v));
    else if (k == C_SCHEMA)
        rc = json_is_object(v) || json_is_boolean(v) ? schema_grammar(f, v)
                                                     : iflow_seterr(IFLOW_EINVAL, "it must be an object");
    else
        rc = k == C_CHOICE ? choice_grammar(f, v) : response_format_grammar(f, v);
    return rc < 0 ? iflow_preperr(rc, "field '%s'", key) : 0;
}

/* A sampling field's value as the text iflow_sampler_params_set() reads. */
static int value_text(const char *key, const json_t *v, char *buf, size_t cap)
{
    if (json_is_integer(v))
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, cap, "%.17g", json_real_value(v));
    else if (json_is_string(v) && json_string_length(v) < cap && strlen(json_string_value(v)) == json_string_length(v))
        snprintf(buf, cap, "%s", json_string_value(v));
    else
        return iflow_seterr(IFLOW_EINVAL, "field '%s' must be a number%s", key,
                            strcmp(key, "sampler") == 0 ? " or a sampler's name" : "");
    return 0;
}

/* Biases ids[0..n), values[0..n) as f's own (replacing what it had). */
static int set_bias(iflow_request_fields *f, const int32_t *ids, const float *values, int n)
{
    free(f->bias_ids);
    free(f->bias_values);
    f->bias_ids = NULL, f->bias_values = NULL, f->n_bias = 0;
    if (n == 0)
        return 0;
    if (!(f->bias_ids = malloc((size_t)n * sizeof *ids)) || !(f->bias_values = malloc((size_t)n * sizeof *values)))
        return oom();
    memcpy(f->bias_ids, ids, (size_t)n * sizeof *ids);
    memcpy(f->bias_values, values, (size_t)n * sizeof *values);
    f->n_bias = n;
    return 0;
}

/* "logit_bias": OpenAI's object of token ids (decimal strings) to biases from -100 to 100. */
static int parse_logit_bias(iflow_request_fields *f, const json_t *v)
{
    if (!json_is_object(v) || json_object_size(v) > IFLOW_MAX_BIAS)
        return iflow_seterr(IFLOW_EINVAL, "field 'logit_bias' must be an object of at most %d token ids",
                            IFLOW_MAX_BIAS);
    int32_t ids[IFLOW_MAX_BIAS];
    float values[IFLOW_MAX_BIAS];
    int n = 0;
    const char *key;
    json_t *b;
    json_object_foreach((json_t *)v, key, b)
    {
        char *end;
        errno = 0;
        long id = strtol(key, &end, 10);
        if (!*key || *end || errno || id < 0 || id > INT32_MAX || !(key[0] >= '0' && key[0] <= '9'))
            return iflow_seterr(IFLOW_EINVAL, "field 'logit_bias': key '%s' is no token id", iflow_quote(key));
        if (!json_is_number(b) || !(fabs(json_number_value(b)) <= 100))
            return iflow_seterr(IFLOW_EINVAL, "field 'logit_bias': the bias of token %ld must be a number from -100 "
                                "to 100", id);
        ids[n] = (int32_t)id;
        values[n++] = (float)json_number_value(b);
    }
    return set_bias(f, ids, values, n);
}

/* Field key's list v of token ids (integers from 0) into out [json_array_size(v)], *n of them. */
static int read_ids(const char *key, const json_t *v, int32_t *out, int *n)
{
    size_t i;
    json_t *e;
    *n = 0;
    json_array_foreach(v, i, e)
    {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return iflow_seterr(IFLOW_EINVAL, "field '%s' must hold token ids (integers from 0)", key);
        out[(*n)++] = (int32_t)json_integer_value(e);
    }
    return 0;
}

/* "stop_token_ids": vLLM's list of token ids that end the text. */
static int parse_stop_ids(iflow_request_fields *f, const json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) > IFLOW_MAX_STOP_IDS)
        return iflow_seterr(IFLOW_EINVAL, "field 'stop_token_ids' must be a list of at most %d token ids",
                            IFLOW_MAX_STOP_IDS);
    return read_ids("stop_token_ids", v, f->stop_ids, &f->n_stop_ids);
}

/* "prompt" as token ids (OpenAI's completions take them; vLLM's prompt_token_ids): a non-empty
 * list, used as it is (no BOS added). A list of prompts (texts or id lists) is refused here:
 * iflow-run --batch splits an OpenAI completions line's list into one request a prompt. */
static int parse_prompt_ids(iflow_request_fields *f, const json_t *v)
{
    enum { MAX_IDS = 1 << 24 };
    if (json_array_size(v) == 0 || json_array_size(v) > MAX_IDS)
        return iflow_seterr(IFLOW_EINVAL, "field 'prompt' must be a string or a list of 1 to %d token ids", MAX_IDS);
    if (json_is_string(json_array_get(v, 0)))
        return iflow_seterr(IFLOW_EINVAL, "field 'prompt': a list of prompts goes in an OpenAI /v1/completions "
                            "line, at most 2048 of them (else one prompt a line)");
    if (!(f->prompt_ids = malloc(json_array_size(v) * sizeof *f->prompt_ids)))
        return oom();
    return read_ids("prompt", v, f->prompt_ids, &f->n_prompt_ids);
}

/* "allowed_token_ids": vLLM's non-empty list of the only token ids generated. */
static int parse_allowed(iflow_request_fields *f, const json_t *v)
{
    enum { MAX_ALLOWED = 1 << 20 };
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > MAX_ALLOWED)
        return iflow_seterr(IFLOW_EINVAL, "field 'allowed_token_ids' must be a list of 1 to %d token ids", MAX_ALLOWED);
    if (!(f->allowed_ids = malloc(json_array_size(v) * sizeof *f->allowed_ids)))
        return oom();
    return read_ids("allowed_token_ids", v, f->allowed_ids, &f->n_allowed);
}

/* "bad_words": vLLM's list of texts never generated (tokenized later: iflow_request_bad_words). */
static int parse_bad_words(iflow_request_fields *f, const json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) > IFLOW_MAX_BAD_WORDS)
        return iflow_seterr(IFLOW_EINVAL, "field 'bad_words' must be a list of at most %d strings",
                            IFLOW_MAX_BAD_WORDS);
    if (!(f->bad_words = calloc(json_array_size(v) + 1, sizeof *f->bad_words)))
        return oom();
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        const char *w = json_string_value(e);
        if (!w || strlen(w) != json_string_length(e) || !w[strspn(w, " \t\n\r\f\v")])
            return iflow_seterr(IFLOW_EINVAL, "field 'bad_words': word %zu must be a string with more than white "
                                "space", i + 1);
        if (!(f->bad_words[f->n_bad_words] = strdup(w)))
            return oom();
        f->n_bad_words++;
    }
    return 0;
}

/* ids [n] as the next banned sequence of seqs [*n_seqs] (lens) in out, within the bounds. */
static int add_bad_sequence(const int32_t *ids, size_t n, const char *word, int32_t *out, int *lens, int *n_seqs,
                            int *total)
{
    if (*n_seqs == IFLOW_MAX_BAD_WORDS || n > (size_t)(IFLOW_MAX_BAD_TOKENS - *total))
        return iflow_seterr(IFLOW_EINVAL, "the bad words make more than %d token sequences or %d tokens (at '%s')",
                            IFLOW_MAX_BAD_WORDS, IFLOW_MAX_BAD_TOKENS, iflow_quote(word));
    memcpy(out + *total, ids, n * sizeof *ids);
    lens[(*n_seqs)++] = (int)n;
    *total += (int)n;
    return 0;
}

int iflow_bad_words_encode(const iflow_tokenizer *t, const char *const *words, int n_words, int32_t *ids, int *lens,
                           int *n)
{
    *n = 0;
    for (int w = 0, total = 0; w < n_words; w++) {
        const char *word = words[w] + strspn(words[w], " \t\n\r\f\v"); /* Python's lstrip() */
        size_t len = strlen(word);
        char *spaced = malloc(len + 2);
        int32_t *plain = NULL, *inside = NULL;
        size_t n_plain = 0, n_inside = 0;
        int rc = spaced ? iflow_tokenizer_encode(t, word, len, 0, &plain, &n_plain) : oom();
        if (rc == 0) {
            spaced[0] = ' ';
            memcpy(spaced + 1, word, len + 1);
            rc = iflow_tokenizer_encode(t, spaced, len + 1, 0, &inside, &n_inside);
        }
        if (rc == 0 && n_plain == 0)
            rc = iflow_seterr(IFLOW_EINVAL, "bad word '%s' makes no tokens", iflow_quote(word));
        if (rc == 0)
            rc = add_bad_sequence(plain, n_plain, word, ids, lens, n, &total);
        if (rc == 0 && n_inside == n_plain && inside[0] != plain[0])
            rc = add_bad_sequence(inside, n_inside, word, ids, lens, n, &total);
        free(spaced);
        free(plain);
        free(inside);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int iflow_request_bad_words(iflow_request_fields *f, const iflow_tokenizer *t)
{
    if (!f->n_bad_words)
        return 0;
    free(f->bad_ids);
    free(f->bad_lens);
    f->n_bad = 0;
    f->bad_ids = malloc(IFLOW_MAX_BAD_TOKENS * sizeof *f->bad_ids);
    f->bad_lens = malloc(IFLOW_MAX_BAD_WORDS * sizeof *f->bad_lens);
    if (!f->bad_ids || !f->bad_lens)
        return oom();
    int rc = iflow_bad_words_encode(t, (const char *const *)f->bad_words, f->n_bad_words, f->bad_ids, f->bad_lens,
                                    &f->n_bad);
    return rc < 0 ? iflow_preperr(rc, "field 'bad_words'") : 0;
}

/* "lora": the name of one of d's adapters, or "" (none). */
static int parse_adapter(iflow_request_fields *f, const json_t *v, const iflow_request_defaults *d)
{
    const char *name = json_string_value(v);
    if (!name)
        return iflow_seterr(IFLOW_EINVAL, "field 'lora' must be a string: an adapter's name");
    f->adapter = 0;
    for (int i = 0; name[0] && i < d->n_adapters && !f->adapter; i++)
        if (strcmp(name, d->adapters[i]) == 0)
            f->adapter = i + 1;
    if (!name[0] || f->adapter)
        return 0;
    char known[256] = "";
    for (int i = 0; i < d->n_adapters; i++) { /* the names there are, as many as fit */
        size_t at = strlen(known);
        snprintf(known + at, sizeof known - at, "%s'%s'", i ? ", " : "", d->adapters[i]);
    }
    return iflow_seterr(IFLOW_EINVAL, "field 'lora': no adapter '%s' (%s%s)", iflow_quote(name),
                        d->n_adapters ? "there are " : "none was given", known);
}

/* What an OpenAI body says that an iflow request does not: "model" (kept for the reply),
 * "stream" (false), the fields that change nothing in a reply ("user", "store", "metadata",
 * "service_tier", "stream_options", "safety_identifier", "prompt_cache_key": ignored), a null
 * (an optional field unset: absent), and the chat API's "logprobs" (true or false) with its
 * "top_logprobs" (into *top: -1 absent). 1 when key is none of them. */
/* An OpenAI body's field that changes nothing in a reply, or a null (an optional field left
 * unset, as SDKs write them): read as absent. */
static int openai_ignored(const char *key, const json_t *v)
{
    static const char *const no_effect[] = {"user", "store", "metadata", "service_tier", "stream_options",
                                            "safety_identifier", "prompt_cache_key"};
    for (size_t i = 0; i < sizeof no_effect / sizeof *no_effect; i++)
        if (strcmp(key, no_effect[i]) == 0)
            return 1;
    return json_is_null(v);
}

/* An OpenAI body's "model" (a string) into *model (its own copy). */
static int read_model(const json_t *v, char **model)
{
    if (!json_is_string(v))
        return iflow_seterr(IFLOW_EINVAL, "field 'model' must be a string");
    free(*model);
    return (*model = strdup(json_string_value(v))) ? 0 : oom();
}

static int parse_openai_field(iflow_request_fields *f, const char *key, const json_t *v, int *chat_lp, int *top)
{
    if (openai_ignored(key, v))
        return 0;
    if (strcmp(key, "model") == 0)
        return read_model(v, &f->model);
    if (strcmp(key, "stream") == 0)
        return json_is_false(v) ? 0 : iflow_seterr(IFLOW_EINVAL, "field 'stream': a batch line's reply is not "
                                                                 "streamed (false or absent)");
    if (f->api == IFLOW_API_CHAT && strcmp(key, "logprobs") == 0)
        return field_bool(key, v, chat_lp);
    if (f->api == IFLOW_API_CHAT && strcmp(key, "top_logprobs") == 0)
        return field_int(key, v, 0, IFLOW_MAX_TOP_LOGPROBS, top);
    if (f->api == IFLOW_API_COMPLETIONS && strcmp(key, "echo") == 0)
        return field_bool(key, v, &f->echo);
    if (strcmp(key, "continuation") == 0 || strcmp(key, "prompt_logprobs") == 0)
        return iflow_seterr(IFLOW_EINVAL, "field '%s' is iflow's own: give it in an iflow request line, not an "
                            "OpenAI batch line", key);
    return 1;
}

/* The fields of an object, checked; f->id is set already (f->api: an OpenAI batch line's body). */
static int parse_object(iflow_request_fields *f, const json_t *js, const iflow_request_defaults *d)
{
    tool_ask ta = {.parallel = 1};
    enum { MAX_SAMPLING = 32 };
    const char *names[MAX_SAMPLING];
    char values[MAX_SAMPLING][64];
    const char *vals[MAX_SAMPLING];
    int n = 0, rc, lp_given = 0, max_given = 0, logprobs_given = 0, chat_given = 0, grammar_given = 0, eos_given = 0,
        include_given = 0, chat_lp = 0, top = -1, lora_given = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)js, key, v)
    {
        if (strcmp(key, "id") == 0 && !f->api)
            continue;
        if (f->api && (rc = parse_openai_field(f, key, v, &chat_lp, &top)) <= 0) {
            if (rc < 0)
                return rc;
        } else if ((rc = parse_chat_field(f, key, v, &chat_given)) <= 0) {
            if (rc < 0)
                return rc;
        } else if ((rc = parse_grammar_field(f, key, v, &grammar_given)) <= 0) {
            if (rc < 0)
                return rc;
        } else if (strcmp(key, "prompt") == 0 && json_is_array(v)) {
            if ((rc = parse_prompt_ids(f, v)) < 0)
                return rc;
        } else if (strcmp(key, "prompt") == 0) {
            if (!json_is_string(v))
                return iflow_seterr(IFLOW_EINVAL, "field 'prompt' must be a string or a list of token ids");
            if (!(f->prompt = malloc(json_string_length(v) + 1)))
                return oom();
            memcpy(f->prompt, json_string_value(v), json_string_length(v) + 1);
            f->prompt_len = json_string_length(v);
        } else if (strcmp(key, "max_tokens") == 0 || strcmp(key, "max_completion_tokens") == 0) {
            if (max_given)
                return iflow_seterr(IFLOW_EINVAL, "fields 'max_tokens' and 'max_completion_tokens': one at most");
            /* 0 (the prompt scored, nothing generated) in OpenAI's completions bodies: lm-eval's
             * loglikelihood asks so, with echo and logprobs */
            IFLOW_TRY(field_int(key, v, f->api == IFLOW_API_COMPLETIONS ? 0 : 1, 1 << 24, &f->max_tokens));
            max_given = 1;
        } else if (strcmp(key, "continuation") == 0) {
            if (!json_is_string(v) || json_string_length(v) == 0)
                return iflow_seterr(IFLOW_EINVAL, "field 'continuation' must be a string, not empty");
            if (!(f->continuation = malloc(json_string_length(v) + 1)))
                return oom();
            memcpy(f->continuation, json_string_value(v), json_string_length(v) + 1);
            f->continuation_len = json_string_length(v);
        } else if (strcmp(key, "beams") == 0) {
            IFLOW_TRY(field_int(key, v, 1, IFLOW_MAX_BEAMS, &f->beams));
        } else if (strcmp(key, "length_penalty") == 0) {
            if (!json_is_number(v) || !(fabs(json_number_value(v)) <= 100))
                return iflow_seterr(IFLOW_EINVAL, "field 'length_penalty' must be a number from -100 to 100");
            f->length_penalty = (float)json_number_value(v);
            lp_given = 1;
        } else if (strcmp(key, "logprobs") == 0 || strcmp(key, "prompt_logprobs") == 0) {
            int *lp = key[0] == 'l' ? &f->logprobs : &f->prompt_logprobs;
            IFLOW_TRY(field_int(key, v, 0, IFLOW_MAX_TOP_LOGPROBS, lp));
            *lp += 1; /* 0: absent */
            logprobs_given = 1;
        } else if (strcmp(key, "keep") == 0) {
            IFLOW_TRY(field_int(key, v, -1, 1 << 24, &f->keep));
        } else if (strcmp(key, "context_shift") == 0) {
            if (!json_is_string(v) || (f->context_shift = iflow_shift_from_name(json_string_value(v))) < 0)
                return iflow_seterr(IFLOW_EINVAL, "field 'context_shift' must be \"none\", \"rope\" or \"recompute\"");
        } else if (strcmp(key, "stop") == 0) {
            if ((rc = parse_stop(f, v)) < 0)
                return rc;
        } else if (strcmp(key, "logit_bias") == 0) {
            if ((rc = parse_logit_bias(f, v)) < 0)
                return rc;
            eos_given = 1;
        } else if (strcmp(key, "min_tokens") == 0) {
            IFLOW_TRY(field_int(key, v, 0, 1 << 24, &f->min_tokens));
            eos_given = 1;
        } else if (strcmp(key, "ignore_eos") == 0) {
            IFLOW_TRY(field_bool(key, v, &f->ignore_eos));
            eos_given = 1;
        } else if (strcmp(key, "stop_token_ids") == 0) {
            if ((rc = parse_stop_ids(f, v)) < 0)
                return rc;
            eos_given = 1;
        } else if (strcmp(key, "include_stop_str_in_output") == 0) {
            IFLOW_TRY(field_bool(key, v, &f->include_stop));
            include_given = f->include_stop;
        } else if (strcmp(key, "allowed_token_ids") == 0) {
            if ((rc = parse_allowed(f, v)) < 0)
                return rc;
        } else if (strcmp(key, "bad_words") == 0) {
            if ((rc = parse_bad_words(f, v)) < 0)
                return rc;
        } else if (strcmp(key, "truncate_prompt_tokens") == 0) {
            IFLOW_TRY(field_int(key, v, -1, 1 << 24, &f->truncate_prompt_tokens));
            if (f->truncate_prompt_tokens == 0)
                return iflow_seterr(IFLOW_EINVAL, "field 'truncate_prompt_tokens' must be -1 or at least 1");
        } else if (strcmp(key, "lora") == 0) {
            if ((rc = parse_adapter(f, v, d)) < 0)
                return rc;
            lora_given = 1;
        } else if (strcmp(key, "n") == 0) {
            IFLOW_TRY(field_int(key, v, 1, IFLOW_MAX_CHOICES, &f->n));
        } else if (strcmp(key, "tool_choice") == 0) {
            if ((rc = parse_tool_choice(&ta, v)) < 0)
                return rc;
        } else if (strcmp(key, "parallel_tool_calls") == 0) {
            IFLOW_TRY(field_bool(key, v, &ta.parallel));
            ta.parallel_given = 1;
        } else {
            if (!iflow_sampler_param_known(key))
                return iflow_seterr(IFLOW_EINVAL, "unknown field '%s' (see iflow-run(1), BATCH GENERATION)", key);
            if (n == MAX_SAMPLING)
                return iflow_seterr(IFLOW_EINVAL, "too many fields");
            if ((rc = value_text(key, v, values[n], sizeof values[n])) < 0)
                return rc;
            names[n] = key;
            vals[n] = values[n];
            n++;
        }
    }
    if (top >= 0 && !chat_lp)
        return iflow_seterr(IFLOW_EINVAL, "field 'top_logprobs' goes with 'logprobs': true");
    for (int i = 0; f->model && !lora_given && i < d->n_adapters; i++) /* vLLM's: "model" names an adapter */
        if (strcmp(f->model, d->adapters[i]) == 0)
            f->adapter = i + 1;
    if (chat_lp) {
        f->logprobs = 1 + (top > 0 ? top : 0);
        logprobs_given = 1;
    }
    if (f->echo && f->prompt_ids)
        return iflow_seterr(IFLOW_EINVAL, "field 'echo' goes with a text prompt, not token ids");
    if (f->echo) /* the prompt's tokens begin the reply's logprobs (the first, BOS or not, has none) */
        f->prompt_logprobs = f->logprobs;
    if (f->api == IFLOW_API_CHAT && !f->messages)
        return iflow_seterr(IFLOW_EINVAL, "url '/v1/chat/completions': the body needs 'messages'");
    const int prompt = f->prompt || f->prompt_ids;
    if (f->api == IFLOW_API_COMPLETIONS && !prompt)
        return iflow_seterr(IFLOW_EINVAL, "url '/v1/completions': the body needs 'prompt' (a string or token ids)");
    if (!prompt && !f->messages)
        return iflow_seterr(IFLOW_EINVAL, "field 'prompt' (a string or token ids) or 'messages' (a chat) is missing");
    if (prompt && f->messages)
        return iflow_seterr(IFLOW_EINVAL, "fields 'prompt' and 'messages' do not go together");
    if (f->prompt_ids && f->continuation)
        return iflow_seterr(IFLOW_EINVAL, "field 'continuation' goes with a text prompt, not token ids");
    if (chat_given && !f->messages)
        return iflow_seterr(IFLOW_EINVAL, "fields 'add_generation_prompt', 'tools' and 'chat_template_kwargs' go with "
                                          "'messages'");
    if (lp_given && !f->beams)
        return iflow_seterr(IFLOW_EINVAL, "field 'length_penalty' goes with 'beams'");
    if ((rc = tools_settle(f, &ta, grammar_given, d->tool_format)) < 0)
        return rc;
    if (f->n > 1 && (f->beams || f->continuation))
        return iflow_seterr(IFLOW_EINVAL, "field 'n' does not go with '%s' (%s)", f->beams ? "beams" : "continuation",
                            f->beams ? "a beam search gives its beams" : "a score is the same every time");
    if (f->beams && (logprobs_given || f->continuation))
        return iflow_seterr(IFLOW_EINVAL, "fields 'logprobs', 'prompt_logprobs' and 'continuation' do not go with "
                                          "'beams' (a beam's result has its log-probability)");
    if (f->beams && f->grammar) /* the command line's too: a search that ignored it would mislead */
        return iflow_seterr(IFLOW_EINVAL, "a constraint (%s) does not go with 'beams'",
                            grammar_given ? "'grammar', 'json_schema', 'regex', 'choice' or 'response_format'"
                                          : "the command line's");
    if (f->beams && eos_given && (f->n_bias || f->min_tokens || f->ignore_eos || f->n_stop_ids))
        return iflow_seterr(IFLOW_EINVAL, "fields 'logit_bias', 'min_tokens', 'ignore_eos' and 'stop_token_ids' do not "
                                          "go with 'beams' (a search ranks the model's own log-probabilities)");
    if (f->beams && (f->n_allowed || f->n_bad_words))
        return iflow_seterr(IFLOW_EINVAL, "fields 'allowed_token_ids' and 'bad_words' do not go with 'beams' (a "
                                          "search ranks the model's own log-probabilities)");
    if (f->truncate_prompt_tokens && f->continuation)
        return iflow_seterr(IFLOW_EINVAL, "field 'truncate_prompt_tokens' does not go with 'continuation' (the "
                                          "text scored follows the whole prompt)");
    if (f->beams && include_given)
        return iflow_seterr(IFLOW_EINVAL, "field 'include_stop_str_in_output' does not go with 'beams'");
    if (f->beams) { /* the command line's defaults are for the other requests */
        f->include_stop = 0;
        f->logprobs = f->prompt_logprobs = 0;
        f->min_tokens = f->ignore_eos = f->n_stop_ids = 0;
        IFLOW_TRY(set_bias(f, NULL, NULL, 0));
    }
    if (f->continuation && !max_given)
        f->max_tokens = 0; /* score only */
    if (f->min_tokens > f->max_tokens) {
        if (eos_given)
            return iflow_seterr(IFLOW_EINVAL, "field 'min_tokens' (%d) is more than max_tokens (%d)", f->min_tokens,
                                f->max_tokens);
        f->min_tokens = f->max_tokens; /* the command line's, for a request that asks for fewer */
    }
    if (f->beams && f->context_shift)
        return iflow_seterr(IFLOW_EINVAL, "field 'beams' does not go with a context shift (beams end at the context; "
                                          "set 'context_shift' to \"none\")");
    return iflow_sampler_params_set_all(&f->sp, names, vals, n);
}

/* A line's id as compact JSON text: id's, or the line number when id is NULL (NULL: out of
 * memory). */
static char *id_text(const json_t *id, long line_no)
{
    if (id)
        return json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY);
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", line_no);
    return strdup(buf);
}

/* An OpenAI batch line (the Batch API's input, vLLM's run-batch): {"custom_id": a string,
 * "method": "POST", "url": "/v1/chat/completions" or "/v1/completions", "body": the request}.
 * f->api says which API; *body: the request's object. */
static int parse_envelope(const json_t *js, int *api, const json_t **body)
{
    static const char *const urls[] = {"", "/v1/chat/completions", "/v1/completions", "/v1/embeddings"};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)js, key, v)
    {
        if (strcmp(key, "custom_id") != 0 && strcmp(key, "method") != 0 && strcmp(key, "url") != 0 &&
            strcmp(key, "body") != 0)
            return iflow_seterr(IFLOW_EINVAL, "unknown field '%s' of an OpenAI batch line (custom_id, method, url, "
                                "body)", key);
    }
    const char *method = json_string_value(json_object_get(js, "method"));
    const char *url = json_string_value(json_object_get(js, "url"));
    if (!json_is_string(json_object_get(js, "custom_id")))
        return iflow_seterr(IFLOW_EINVAL, "an OpenAI batch line needs a string 'custom_id'");
    if (json_object_get(js, "method") && (!method || strcmp(method, "POST") != 0))
        return iflow_seterr(IFLOW_EINVAL, "field 'method' must be \"POST\"");
    for (*api = IFLOW_API_CHAT; url && *api <= IFLOW_API_EMBEDDINGS && strcmp(url, urls[*api]) != 0; ++*api)
        ;
    if (!url || *api > IFLOW_API_EMBEDDINGS)
        return iflow_seterr(IFLOW_EINVAL, "field 'url' must be \"/v1/chat/completions\", \"/v1/completions\" or "
                                          "\"/v1/embeddings\"");
    *body = json_object_get(js, "body");
    return json_is_object(*body) ? 0 : iflow_seterr(IFLOW_EINVAL, "field 'body' must be an object: the request");
}

uint64_t iflow_request_choice_seed(uint64_t seed, int k)
{
    if (k == 0)
        return seed;
    uint64_t z = seed + (uint64_t)k * 0x9e3779b97f4a7c15ull; /* splitmix64's step and finalizer */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int iflow_request_parse(iflow_request_fields *f, const char *line, size_t len, long line_no,
                        const iflow_request_defaults *d)
{
    memset(f, 0, sizeof *f);
    f->max_tokens = d->max_tokens;
    f->context_shift = d->context_shift;
    f->keep = d->keep;
    f->logprobs = d->logprobs;
    f->prompt_logprobs = d->prompt_logprobs;
    f->length_penalty = 1.0f;
    f->add_generation_prompt = 1;
    f->n = 1;
    f->sp = d->sp;
    f->grammar = iflow_grammar_ref(d->grammar);
    f->min_tokens = d->min_tokens;
    f->ignore_eos = d->ignore_eos;
    f->include_stop = d->include_stop;
    f->n_stop_ids = d->n_stop_ids > IFLOW_MAX_STOP_IDS ? IFLOW_MAX_STOP_IDS : d->n_stop_ids;
    if (f->n_stop_ids)
        memcpy(f->stop_ids, d->stop_ids, (size_t)f->n_stop_ids * sizeof *f->stop_ids);
    f->sp.seed = d->sp.seed + (uint64_t)(line_no - 1); /* line 1: the seed itself; a "seed" field overrides */
    json_error_t jerr;
    json_t *js = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    const json_t *body = js;
    f->api = json_object_get(js, "body") || json_object_get(js, "custom_id") ? IFLOW_API_CHAT : IFLOW_API_NATIVE;
    const json_t *id = json_object_get(js, f->api ? "custom_id" : "id");
    f->id = id_text(json_is_string(id) || !f->api ? id : NULL, line_no);
    int rc = f->id ? set_bias(f, d->bias_ids, d->bias_values, d->n_bias) : oom();
    if (rc == 0 && !js)
        rc = iflow_seterr(IFLOW_EINVAL, "not JSON: %s (column %d)", jerr.text, jerr.column);
    else if (rc == 0 && !json_is_object(js))
        rc = iflow_seterr(IFLOW_EINVAL, "a request must be a JSON object");
    else if (rc == 0 && f->api && (rc = parse_envelope(js, &f->api, &body)) == 0 && f->api == IFLOW_API_EMBEDDINGS)
        rc = iflow_seterr(IFLOW_EINVAL, "url '/v1/embeddings' needs an encoder model (a BERT-like one) and "
                                        "iflow-run --embed --batch");
    if (rc == 0)
        rc = parse_object(f, body, d);
    json_decref(js);
    return rc;
}

/* ---- embeddings: OpenAI batch lines for /v1/embeddings ---------------------------------------- */

void iflow_embed_fields_free(iflow_embed_fields *f)
{
    for (int i = 0; i < f->n_inputs; i++) {
        free(f->texts ? f->texts[i] : NULL);
        free(f->ids ? f->ids[i] : NULL);
    }
    free(f->id);
    free(f->model);
    free(f->texts);
    free(f->lens);
    free(f->ids);
    free(f->n_ids);
    memset(f, 0, sizeof *f);
}

/* Input k of f: a text (a non-empty string) or token ids (a non-empty list of integers). */
static int embed_input(iflow_embed_fields *f, int k, const json_t *v)
{
    if (json_is_string(v)) {
        if (json_string_length(v) == 0)
            return iflow_seterr(IFLOW_EINVAL, "field 'input': input %d is empty", k + 1);
        if (!(f->texts[k] = malloc(json_string_length(v) + 1)))
            return oom();
        memcpy(f->texts[k], json_string_value(v), json_string_length(v) + 1);
        f->lens[k] = json_string_length(v);
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > (1u << 20))
        return iflow_seterr(IFLOW_EINVAL, "field 'input': input %d must be a non-empty string or list of token ids",
                            k + 1);
    if (!(f->ids[k] = malloc(json_array_size(v) * sizeof *f->ids[k])))
        return oom();
    return read_ids("input", v, f->ids[k], &f->n_ids[k]);
}

/* "input": a string, a list of strings, a list of token ids (one input), or a list of lists. */
static int embed_inputs(iflow_embed_fields *f, const json_t *v)
{
    const json_t *first = json_array_get(v, 0);
    int many = json_is_array(v) && (json_is_string(first) || json_is_array(first));
    size_t n = many ? json_array_size(v) : 1;
    if (json_is_array(v) && (json_array_size(v) == 0 || n > IFLOW_MAX_EMBED_INPUTS))
        return iflow_seterr(IFLOW_EINVAL, "field 'input' must hold 1 to %d inputs", IFLOW_MAX_EMBED_INPUTS);
    f->texts = calloc(n, sizeof *f->texts);
    f->lens = calloc(n, sizeof *f->lens);
    f->ids = calloc(n, sizeof *f->ids);
    f->n_ids = calloc(n, sizeof *f->n_ids);
    if (!f->texts || !f->lens || !f->ids || !f->n_ids)
        return oom();
    f->n_inputs = (int)n;
    for (size_t k = 0; k < n; k++)
        IFLOW_TRY(embed_input(f, (int)k, many ? json_array_get(v, k) : v));
    return 0;
}

static int embed_body(iflow_embed_fields *f, const json_t *body)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)body, key, v)
    {
        if (openai_ignored(key, v))
            continue;
        if (strcmp(key, "input") == 0) {
            IFLOW_TRY(embed_inputs(f, v));
        } else if (strcmp(key, "model") == 0) {
            IFLOW_TRY(read_model(v, &f->model));
        } else if (strcmp(key, "encoding_format") == 0) {
            const char *e = json_string_value(v);
            if (!e || (strcmp(e, "float") != 0 && strcmp(e, "base64") != 0))
                return iflow_seterr(IFLOW_EINVAL, "field 'encoding_format' must be \"float\" or \"base64\"");
            f->base64 = strcmp(e, "base64") == 0;
        } else if (strcmp(key, "dimensions") == 0) {
            IFLOW_TRY(field_int(key, v, 1, 1 << 20, &f->dimensions));
        } else
            return iflow_seterr(IFLOW_EINVAL, "unknown field '%s' of an embeddings request (input, model, "
                                "encoding_format, dimensions, user)", key);
    }
    return f->n_inputs ? 0 : iflow_seterr(IFLOW_EINVAL, "field 'input' is missing");
}

int iflow_embed_request_parse(iflow_embed_fields *f, const char *line, size_t len, long line_no)
{
    memset(f, 0, sizeof *f);
    json_error_t jerr;
    json_t *js = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    const json_t *id = json_object_get(js, "custom_id"), *body = NULL;
    int api = 0, rc = 0;
    f->id = id_text(json_is_string(id) ? id : NULL, line_no);
    if (!f->id)
        rc = oom();
    else if (!js)
        rc = iflow_seterr(IFLOW_EINVAL, "not JSON: %s (column %d)", jerr.text, jerr.column);
    else if (!json_is_object(js))
        rc = iflow_seterr(IFLOW_EINVAL, "a request must be a JSON object");
    else if ((rc = parse_envelope(js, &api, &body)) == 0 && api != IFLOW_API_EMBEDDINGS)
        rc = iflow_seterr(IFLOW_EINVAL, "an encoder answers '/v1/embeddings' lines, not '%s'",
                          json_string_value(json_object_get(js, "url")));
    if (rc == 0)
        rc = embed_body(f, body);
    json_decref(js);
    return rc;
}
