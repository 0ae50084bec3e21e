/* chatref.h -- the chat tests' reference renderings: tests/fixtures/chat/expected.jsonl (jinja2 in
 * transformers' environment, tests/fixtures/gen_chat_refs.py) and conversations.json. Uses only
 * jansson and check.h, so that test_api.c, which sees only the public header, can use it too. */
#ifndef IFLOW_TEST_CHATREF_H
#define IFLOW_TEST_CHATREF_H

#include "check.h"

#include <jansson.h>

/* jinja2's text for template `tmpl` and conversation `conv` without extra variables (malloc'd),
 * or NULL; with `messages` non-NULL, also the conversation's messages (a new reference, or NULL). */
static inline char *chatref_expected(const char *tmpl, const char *conv, int add_generation_prompt, json_t **messages)
{
    size_t n;
    char *all = test_read_file(test_fixture("chat/expected.jsonl"), &n), *line = all, *found = NULL;
    for (char *end; !found && line && (end = strchr(line, '\n')); line = end + 1) {
        json_t *js = json_loadb(line, (size_t)(end - line), 0, NULL);
        if (js && strcmp(json_string_value(json_object_get(js, "template")), tmpl) == 0 &&
            strcmp(json_string_value(json_object_get(js, "conversation")), conv) == 0 &&
            json_is_true(json_object_get(js, "add_generation_prompt")) == add_generation_prompt &&
            !json_object_get(js, "vars") && json_is_string(json_object_get(js, "output")))
            found = strdup(json_string_value(json_object_get(js, "output")));
        json_decref(js);
    }
    free(all);
    if (!messages)
        return found;
    json_t *convs = json_load_file(test_fixture("chat/conversations.json"), 0, NULL);
    *messages = NULL;
    for (size_t i = 0; i < json_array_size(convs); i++)
        if (strcmp(json_string_value(json_object_get(json_array_get(convs, i), "name")), conv) == 0)
            *messages = json_incref(json_object_get(json_array_get(convs, i), "messages"));
    json_decref(convs);
    return found;
}

#endif
