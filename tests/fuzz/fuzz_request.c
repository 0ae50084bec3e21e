/* fuzz_request.c -- a batch request line (libcore/serving/request.h): parsed with defaults,
 * then a sampler opened from the fields it set (what iflow-run --batch does before tokenizing). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "libcore/engine/sampler.h"
#include "libcore/serving/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    iflow_request_defaults d = {.max_tokens = 16, .keep = 4};
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
        if (!f.prompt || !f.id || f.max_tokens < 1 || f.keep < -1 || !iflow_shift_name(f.context_shift) ||
            iflow_shift_name(f.context_shift)[0] == '?')
            abort();
    }
    iflow_request_fields_free(&f);
    return 0;
}
