/* generate.c -- one prompt, one continuation, through the batch engine (include/iflow.h's
 * iflow_generate): the same tokens as the same request in a batch, or in iflow-run. */
#include "include/iflow.h"
#include "libcore/base/error.h"
#include "libcore/serving/batch.h"
#include "libcore/serving/request.h"
#include "libcore/tokenizers/tokenizer.h"

#include <stdlib.h>
#include <string.h>

void iflow_generate_params_default(iflow_generate_params *p)
{
    *p = (iflow_generate_params){.max_tokens = 128, .add_bos = 1};
    iflow_sampler_params_default(&p->sampling);
}

int iflow_generate(const iflow_model *m, const char *prompt, const iflow_generate_params *p, iflow_result **out)
{
    *out = NULL;
    const iflow_tokenizer *tok = iflow_model_tokenizer(m);
    if (!tok)
        return iflow_seterr(IFLOW_EINVAL, "the model has no tokenizer to read the prompt with");
    if (!prompt)
        return iflow_seterr(IFLOW_EINVAL, "no prompt given");
    if (p->max_tokens < 1)
        return iflow_seterr(IFLOW_EINVAL, "max_tokens %d must be at least 1", p->max_tokens);
    if (p->n_stop < 0 || p->n_stop > IFLOW_MAX_STOP)
        return iflow_seterr(IFLOW_EINVAL, "%d stop strings: from 0 to %d are allowed", p->n_stop, IFLOW_MAX_STOP);
    if (p->n_bad_words < 0 || p->n_bad_words > IFLOW_MAX_BAD_WORDS || (p->n_bad_words && !p->bad_words))
        return iflow_seterr(IFLOW_EINVAL, "%d bad words: from 0 to %d are allowed", p->n_bad_words,
                            IFLOW_MAX_BAD_WORDS);
    int32_t bad_ids[IFLOW_MAX_BAD_TOKENS], *ids;
    int bad_lens[IFLOW_MAX_BAD_WORDS], n_bad = 0;
    size_t n_ids;
    int rc = iflow_bad_words_encode(tok, p->bad_words, p->n_bad_words, bad_ids, bad_lens, &n_bad);
    if (rc < 0)
        return rc;
    rc = iflow_tokenizer_encode(tok, prompt, strlen(prompt), p->add_bos ? IFLOW_TOK_ADD_BOS : 0, &ids, &n_ids);
    if (rc < 0)
        return rc;
    if (n_ids == 0)
        return iflow_seterr(IFLOW_EINVAL, "the prompt is empty and no beginning-of-sequence token was added");
    iflow_batch_params bp = {.parallel = 1, .n_ctx = p->n_ctx, .n_threads = p->n_threads};
    iflow_request q = {.prompt = ids, .n_prompt = (int)n_ids, .max_tokens = p->max_tokens, .sampling = p->sampling,
                       .n_stop = p->n_stop, .user = p->user, .on_text = p->on_text, .grammar = p->grammar,
                       .bias_ids = p->bias_ids, .bias_values = p->bias_values, .n_bias = p->n_bias,
                       .min_tokens = p->min_tokens, .ignore_eos = p->ignore_eos, .stop_ids = p->stop_ids,
                       .n_stop_ids = p->n_stop_ids, .include_stop = p->include_stop, .allowed_ids = p->allowed_ids,
                       .n_allowed = p->n_allowed, .bad_ids = bad_ids, .bad_lens = bad_lens, .n_bad = n_bad};
    memcpy(q.stop, p->stop, sizeof q.stop);
    iflow_batch *b = NULL;
    if ((rc = iflow_batch_open(&b, m, &bp)) == 0 && (rc = iflow_batch_add(b, &q)) == 0) {
        while ((rc = iflow_batch_step(b)) > 0)
            ;
        if (rc == 0 && iflow_batch_take(b, out) != 1)
            rc = iflow_seterr(IFLOW_EINVAL, "the engine went idle without a result"); /* cannot happen */
    }
    iflow_batch_close(b);
    free(ids);
    return rc < 0 ? rc : 0;
}
