/* loragen.c -- write a seeded random LoRA adapter in PEFT's form for a Llama-shaped config.json,
 * for the benchmarks (bench/bench.sh: what an adapter applied at run time costs).
 *
 *   loragen CONFIG_JSON RANK OUTDIR
 *
 * OUTDIR/adapter_config.json (r RANK, lora_alpha 2 RANK) and OUTDIR/adapter_model.safetensors:
 * A [RANK][in] and B [out][RANK], F32, for q, k, v, o, gate, up and down of every layer (Hugging
 * Face Llama names), values of a fixed linear congruential sequence scaled to change little. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t state = 0x9e3779b97f4a7c15ull;

static float next(float scale)
{
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return scale * ((float)(state >> 40) / (float)(1 << 24) - 0.5f);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: loragen CONFIG_JSON RANK OUTDIR\n");
        return 2;
    }
    json_error_t e;
    json_t *c = json_load_file(argv[1], 0, &e);
    if (!c) {
        fprintf(stderr, "loragen: %s: %s\n", argv[1], e.text);
        return 1;
    }
    const long D = (long)json_integer_value(json_object_get(c, "hidden_size")),
               F = (long)json_integer_value(json_object_get(c, "intermediate_size")),
               L = (long)json_integer_value(json_object_get(c, "num_hidden_layers")),
               H = (long)json_integer_value(json_object_get(c, "num_attention_heads")),
               KVH = (long)json_integer_value(json_object_get(c, "num_key_value_heads")), R = atol(argv[2]);
    const long KV = D / H * (KVH ? KVH : H);
    const struct { const char *name; long out, in; } mods[] = {
        {"self_attn.q_proj", D, D}, {"self_attn.k_proj", KV, D}, {"self_attn.v_proj", KV, D},
        {"self_attn.o_proj", D, D}, {"mlp.gate_proj", F, D},     {"mlp.up_proj", F, D}, {"mlp.down_proj", D, F},
    };
    if (D <= 0 || F <= 0 || L <= 0 || H <= 0 || R <= 0) {
        fprintf(stderr, "loragen: %s is not a Llama config, or RANK is not positive\n", argv[1]);
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", argv[3]);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "{\"peft_type\": \"LORA\", \"r\": %ld, \"lora_alpha\": %ld}\n", R, 2 * R) < 0 || fclose(f)) {
        fprintf(stderr, "loragen: cannot write %s\n", path);
        return 1;
    }
    /* the header: every tensor's entry, offsets in write order */
    json_t *h = json_object();
    size_t off = 0;
    for (long l = 0; l < L; l++)
        for (size_t m = 0; m < sizeof mods / sizeof mods[0]; m++)
            for (int b = 0; b < 2; b++) {
                char key[256];
                long rows = b ? mods[m].out : R, cols = b ? R : mods[m].in;
                snprintf(key, sizeof key, "base_model.model.model.layers.%ld.%s.lora_%c.weight", l, mods[m].name,
                         b ? 'B' : 'A');
                size_t n = (size_t)rows * (size_t)cols * 4;
                json_object_set_new(h, key, json_pack("{s:s, s:[I,I], s:[I,I]}", "dtype", "F32", "shape",
                                                      (json_int_t)rows, (json_int_t)cols, "data_offsets",
                                                      (json_int_t)off, (json_int_t)(off + n)));
                off += n;
            }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    size_t hn = strlen(text), pad = (8 - hn % 8) % 8;
    uint64_t hl = hn + pad;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", argv[3]);
    if (!(f = fopen(path, "wb"))) {
        fprintf(stderr, "loragen: cannot write %s\n", path);
        return 1;
    }
    fwrite(&hl, 8, 1, f);
    fwrite(text, 1, hn, f);
    fwrite("        ", 1, pad, f);
    for (long l = 0; l < L; l++)
        for (size_t m = 0; m < sizeof mods / sizeof mods[0]; m++)
            for (int b = 0; b < 2; b++) {
                long rows = b ? mods[m].out : R, cols = b ? R : mods[m].in;
                for (long i = 0; i < rows * cols; i++) {
                    float v = next(b ? 0.02f : 0.1f);
                    fwrite(&v, 4, 1, f);
                }
            }
    int bad = ferror(f) | fclose(f);
    free(text);
    json_decref(h);
    json_decref(c);
    if (bad)
        fprintf(stderr, "loragen: cannot write %s\n", path);
    return bad ? 1 : 0;
}
