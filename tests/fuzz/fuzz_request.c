/* fuzz_request.c -- a batch request line (libcore/serving/request.h): parsed with defaults,
 * then a sampler opened from the fields it set (what iflow-run --batch does before tokenizing),
 * and a constraint's grammar ("grammar", "json_schema", "regex", "choice", "response_format",
 * "tool_choice") matched against a short text. The chat template's tool-call format is the
 * input's length mod 5, so every format (and none) is met; the adapters "lora" may name are the
 * first (length mod 3) of two. A request's bad_words are tokenized with stories260K's tokenizer
 * (from $IFLOW_TEST_DATA, default ../shared; skipped when missing) into banned sequences within
 * their bounds and the vocabulary. The line is parsed as an embeddings request too. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libcore/engine/sampler.h"
#include "libcore/serving/request.h"

/* stories260K's tokenizer, loaded once; NULL when the test data is not there. */
static const iflow_tokenizer *tokenizer(void)
{
    static iflow_tokenizer *t;
    static int tried;
    if (!tried++) {
        const char *root = getenv("IFLOW_TEST_DATA");
        char path[4096];
        snprintf(path, sizeof path, "%s/models/stories260K/hf", root && *root ? root : "../shared");
        if (iflow_tokenizer_open(&t, path) != 0)
            t = NULL;
    }
    return t;
}

/* f's bad words made banned sequences: each of 1 or more tokens of the vocabulary, at most
 * IFLOW_MAX_BAD_WORDS of IFLOW_MAX_BAD_TOKENS tokens together, two at most for each word. */
static void check_bad_words(iflow_request_fields *f)
{
    const iflow_tokenizer *t = tokenizer();
    if (!t || iflow_request_bad_words(f, t) < 0)
        return;
    if (f->n_bad < 0 || f->n_bad > IFLOW_MAX_BAD_WORDS || f->n_bad > 2 * f->n_bad_words ||
        (f->n_bad_words && f->n_bad < 1))
        abort();
    for (int i = 0, total = 0; i < f->n_bad; total += f->bad_lens[i++]) {
        if (f->bad_lens[i] < 1 || total + f->bad_lens[i] > IFLOW_MAX_BAD_TOKENS)
            abort();
        for (int k = 0; k < f->bad_lens[i]; k++)
            if (f->bad_ids[total + k] < 0 || f->bad_ids[total + k] >= iflow_tokenizer_n_vocab(t))
                abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const adapters[] = {"sql", "chat-v2"};
    static const int32_t bias_ids[] = {2, 7};
    static const float bias_values[] = {-INFINITY, 3.5f};
    iflow_request_defaults d = {.max_tokens = 16, .keep = 4, .tool_format = (int)(size % IFLOW_TOOLS_COUNT),
                                .adapters = adapters, .n_adapters = (int)(size % 3), .bias_ids = bias_ids,
                                .bias_values = bias_values, .n_bias = (int)(size % 3), .min_tokens = (int)(size % 4),
                                .ignore_eos = (int)(size % 2), .stop_ids = bias_ids, .n_stop_ids = (int)(size % 3),
                                .include_stop = (int)(size % 5 == 0)};
    iflow_sampler_params_default(&d.sp);
    iflow_request_fields f;
    if (iflow_request_parse(&f, (const char *)data, size, 7, &d) == 0) {
        iflow_sampler *s;
        if (iflow_sampler_open(&s, &f.sp, 64) == 0) {
            float logits[64];
            for (int i = 0; i < 64; i++)
                logits[i] = (float)((i * 37) % 11) - 5.0f;
            iflow_sampler_sample(s, logits);
            iflow_sampler_close(s);
        }
        /* max_tokens is 0 only for a request that scores a continuation and asked for no tokens, or an
         * OpenAI completions body that asked for none (echo's scoring); echo goes with a text prompt
         * there, and asks for the prompt's logprobs as for the completion's */
        int min_tokens = f.continuation || f.api == IFLOW_API_COMPLETIONS ? 0 : 1;
        int has_prompt = f.prompt || f.prompt_ids;
        if (f.echo && (f.api != IFLOW_API_COMPLETIONS || !f.prompt || f.prompt_logprobs != f.logprobs))
            abort();
        if (!has_prompt == !f.messages || (f.prompt && f.prompt_ids) || (f.prompt_ids && f.n_prompt_ids < 1) ||
            (f.prompt_ids && f.continuation) || !f.id || f.max_tokens < min_tokens || f.keep < -1 ||
            !iflow_shift_name(f.context_shift) || iflow_shift_name(f.context_shift)[0] == '?')
            abort();
        if (f.continuation && (f.continuation_len == 0 || f.beams))
            abort();
        if ((f.chat_vars || !f.add_generation_prompt) && !f.messages)
            abort();
        int lp_max = 1 + IFLOW_MAX_TOP_LOGPROBS; /* 0 absent, else 1 + the field */
        if (f.logprobs < 0 || f.logprobs > lp_max || f.prompt_logprobs < 0 || f.prompt_logprobs > lp_max ||
            (f.beams && (f.logprobs || f.prompt_logprobs)))
            abort();
        /* a constraint never goes with beams; the grammar made matches some text or none */
        if (f.grammar && (f.beams || iflow_grammar_match(f.grammar, "{}", 2, NULL) < 0))
            abort();
        /* calls are read only from a chat with tools, in the template's format; a constrained
         * call has its grammar */
        if (f.tool_format && (f.tool_format != d.tool_format || !json_object_get(f.chat_vars, "tools")))
            abort();
        if (f.tool_bare && (!f.tool_format || !f.grammar))
            abort();
        if (f.n < 1 || f.n > IFLOW_MAX_CHOICES || (f.n > 1 && (f.beams || f.continuation)))
            abort();
        if (f.adapter < 0 || f.adapter > d.n_adapters) /* "lora" names one of the adapters there are */
            abort();
        /* biases: at most IFLOW_MAX_BIAS, ids >= 0, values finite within 100 or the defaults' -inf;
         * min_tokens within max_tokens; none of them with beams */
        if (f.n_bias < 0 || f.n_bias > IFLOW_MAX_BIAS || (f.n_bias && (!f.bias_ids || !f.bias_values)))
            abort();
        for (int i = 0; i < f.n_bias; i++)
            if (f.bias_ids[i] < 0 || isnan(f.bias_values[i]) || f.bias_values[i] > 100)
                abort();
        if (f.min_tokens < 0 || f.min_tokens > f.max_tokens ||
            (f.beams && (f.n_bias || f.min_tokens || f.ignore_eos || f.n_stop_ids)))
            abort();
        if (f.n_stop_ids < 0 || f.n_stop_ids > IFLOW_MAX_STOP_IDS || (f.beams && f.include_stop))
            abort();
        for (int i = 0; i < f.n_stop_ids; i++)
            if (f.stop_ids[i] < 0)
                abort();
        /* allowed tokens: a non-empty list of ids; bad words within their bound, more than white
         * space each; neither with beams; truncation -1 or >= 1, not with a continuation */
        if (f.n_allowed < 0 || (f.n_allowed && !f.allowed_ids) || (f.allowed_ids && !f.n_allowed))
            abort();
        for (int i = 0; i < f.n_allowed; i++)
            if (f.allowed_ids[i] < 0)
                abort();
        if (f.n_bad_words < 0 || f.n_bad_words > IFLOW_MAX_BAD_WORDS || (f.beams && (f.n_allowed || f.n_bad_words)))
            abort();
        for (int i = 0; i < f.n_bad_words; i++)
            if (!f.bad_words[i] || !f.bad_words[i][strspn(f.bad_words[i], " \t\n\r\f\v")])
                abort();
        if (f.truncate_prompt_tokens < -1 || (f.truncate_prompt_tokens && f.continuation))
            abort();
        check_bad_words(&f);
        /* an OpenAI batch line: chat with messages, completions with a prompt, none of iflow's
         * scoring fields (the prompt's logprobs only through echo) */
        if (f.api < IFLOW_API_NATIVE || f.api > IFLOW_API_COMPLETIONS || (f.model && !f.api) ||
            (f.api == IFLOW_API_CHAT && !f.messages) || (f.api == IFLOW_API_COMPLETIONS && !has_prompt) ||
            (f.api && (f.continuation || (f.prompt_logprobs && !f.echo))))
            abort();
    }
    iflow_request_fields_free(&f);
    /* the same line as an embeddings request (iflow-run --embed --batch) */
    iflow_embed_fields e;
    if (iflow_embed_request_parse(&e, (const char *)data, size, 7) == 0) {
        if (e.n_inputs < 1 || e.n_inputs > IFLOW_MAX_EMBED_INPUTS || !e.id || e.dimensions < 0)
            abort();
        for (int k = 0; k < e.n_inputs; k++) {
            if (!e.texts[k] == !e.ids[k] || (e.texts[k] && e.lens[k] == 0) || (e.ids[k] && e.n_ids[k] < 1))
                abort();
            for (int i = 0; e.ids[k] && i < e.n_ids[k]; i++)
                if (e.ids[k][i] < 0)
                    abort();
        }
    }
    iflow_embed_fields_free(&e);
    return 0;
}
