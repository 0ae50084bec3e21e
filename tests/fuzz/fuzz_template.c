/* fuzz_template.c -- a chat template (libcore/serving/template.h): parsed, and when it parses,
 * rendered with a small conversation (system, user, an assistant tool call, a tool answer), a
 * generation prompt, BOS/EOS, one tool and a pinned clock. Whatever the template does, the render
 * succeeds with a NUL-terminated text or fails with a one-line message. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "libcore/base/error.h"
#include "libcore/serving/template.h"

static const char vars_json[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are helpful.\"},"
    "{\"role\": \"user\", \"content\": \"What's the weather in Paris? \\u00e9\\u00df\\n\"},"
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call12345\", \"type\": \"function\","
    " \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"call12345\", \"content\": \"{\\\"temp\\\": 21.5}\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>warm</think>It is 21.5 degrees.\"}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}},"
    " \"required\": [\"city\"]}}}],"
    " \"__now__\": 1721952000}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *vars;
    if (!vars && !(vars = json_loads(vars_json, 0, NULL)))
        abort();
    iflow_template *t;
    if (iflow_template_open(&t, (const char *)data, size, "the fuzzed template") < 0) {
        if (strchr(iflow_errmsg(), '\n'))
            abort();
        return 0;
    }
    char *out;
    size_t n;
    int rc = iflow_template_render(t, vars, &out, &n);
    if (rc == 0 && (!out || out[n] != 0))
        abort();
    if (rc < 0 && (out || strchr(iflow_errmsg(), '\n')))
        abort();
    free(out);
    iflow_template_close(t);
    return 0;
}
