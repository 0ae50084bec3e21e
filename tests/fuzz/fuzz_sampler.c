/* fuzz_sampler.c -- request sampling fields (untrusted text) through iflow_sampler_params_set,
 * then a sampler built from whatever was accepted, run on logits and tokens from the input;
 * and the stop-string matcher fed the input in pieces.
 *
 * Input: lines "name=value" up to a line "--"; the rest is bytes: logits (int8 / 8), tokens
 * (byte % 16) and the text the stop matcher sees (stop strings: the first two 3-byte runs).
 * When the first byte is odd the sampler allows four tokens (bytes 0-3 % 16) and bans a
 * sequence (bytes 4-5, one or two tokens): a token drawn must be allowed and not banned where
 * another is. The matcher is disarmed for the pieces whose length byte is >= 0x80. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "libcore/engine/sampler.h"
#include "libcore/engine/stop.h"

enum { NV = 16 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    iflow_sampler_params p;
    iflow_sampler_params_default(&p);
    char *line = text, *rest = text + size;
    while (line < text + size) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        if (strcmp(line, "--") == 0) {
            rest = nl ? nl + 1 : text + size;
            break;
        }
        char *eq = strchr(line, '=');
        if (eq) {
            *eq = 0;
            iflow_sampler_params_set(&p, line, eq + 1);
        }
        if (!nl)
            break;
        line = nl + 1;
    }
    size_t n = (size_t)(text + size - rest);
    const uint8_t *b = (const uint8_t *)rest;
    iflow_sampler *s;
    if (iflow_sampler_open(&s, &p, NV) == 0) {
        float logits[NV];
        const int limit = n >= 6 && (b[0] & 1);
        int32_t allow[4] = {0}, ban[2] = {0}, last = -1;
        const int ban_len = n >= 6 ? 1 + (b[1] & 1) : 0;
        for (int j = 0; limit && j < 4; j++)
            allow[j] = b[j] % NV;
        for (int j = 0; limit && j < 2; j++)
            ban[j] = b[4 + j] % NV;
        if (limit && (iflow_sampler_allow(s, allow, 4) < 0 || iflow_sampler_ban_sequence(s, ban, ban_len) < 0))
            abort();
        for (size_t i = 0; i + NV <= n && i < 64 * NV; i += NV) {
            for (int j = 0; j < NV; j++)
                logits[j] = (float)(int8_t)b[i + (size_t)j] / 8.0f;
            int32_t t = iflow_sampler_sample(s, logits);
            if (t < 0 || t >= NV)
                abort();
            /* the token the sequence bans now (the accepted tokens end with its head), or -1 */
            int32_t banned = limit && (ban_len == 1 || last == ban[0]) ? ban[ban_len - 1] : -1, ok = 0, open = 0;
            for (int j = 0; limit && j < 4; j++) {
                ok |= t == allow[j] && t != banned;
                open |= allow[j] != banned;
            }
            if (limit && open && !ok)
                abort();
            last = b[i] % NV;
            iflow_sampler_accept(s, t);
            iflow_sampler_accept(s, b[i] % NV);
        }
        char desc[256];
        iflow_sampler_describe(s, desc, sizeof desc);
        iflow_sampler_close(s);
    }
    if (n >= 6) {
        char st[2][4] = {{(char)b[0], (char)b[1], (char)b[2], 0}, {(char)b[3], (char)b[4], (char)b[5], 0}};
        const char *stops[2] = {st[0], st[1]};
        iflow_stop *m;
        if (st[0][0] && st[1][0] && iflow_stop_open(&m, stops, 2) == 0) {
            size_t at = 6, emitted = 0;
            int done = 0;
            while (at < n && !done) {
                size_t k = 1 + b[at] % 5;
                if (k > n - at)
                    k = n - at;
                const char *e;
                size_t ne;
                iflow_stop_arm(m, b[at] < 0x80);
                done = iflow_stop_feed(m, rest + at, k, &e, &ne) == 1;
                emitted += ne;
                at += k;
            }
            if (emitted > n)
                abort();
            iflow_stop_close(m);
        }
    }
    free(text);
    return 0;
}
