/* fuzz_spec.c -- spec (.ini) parsing and resolution against a fixed config.json (and the
 * resolved form read as hyperparameters), tensor names with layer and expert indices mapped,
 * then its GGUF variant ([gguf] sections) applied and resolved against GGUF-style metadata. */
#include <stdint.h>
#include <stdlib.h>

#include "libcore/engine/model.h"
#include "libcore/formats/spec.h"
#include "memfile.h"

static const char config[] =
    "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"rope_scaling\": "
    "{\"factor\": 2.0, \"rope_type\": \"llama3\"}, \"architectures\": [\"LlamaForCausalLM\"], "
    "\"eos_token_id\": [1, 2], \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"mlp_only_layers\": [], "
    "\"norm_topk_prob\": null, \"kv_lora_rank\": 16, \"q_lora_rank\": null, \"qk_nope_head_dim\": 8, "
    "\"qk_rope_head_dim\": 4, \"v_head_dim\": 6, \"n_routed_experts\": 8, \"moe_intermediate_size\": 16, "
    "\"intermediate_size\": 128, \"vocab_size\": 512}";
static const char gguf_config[] =
    "{\"general\": {\"architecture\": \"llama\"}, \"llama\": {\"embedding_length\": 64, \"block_count\": 2, "
    "\"attention\": {\"head_count\": 8}, \"pooling_type\": 1}, \"tokenizer\": {\"ggml\": {\"tokens\": {\"count\": 512}}}, "
    "\"tensors\": {\"output\": {\"weight\": true}}}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], buf[512];
    int fd = memfile(data, size, path, sizeof path);
    if (fd < 0)
        return 0;
    iflow_spec *s;
    if (iflow_spec_load(&s, path) == 0) {
        json_error_t je;
        json_t *cfg = json_loads(config, 0, &je), *resolved = NULL;
        iflow_hparams hp;
        if (iflow_spec_resolve(s, cfg, &resolved) == 0) {
            iflow_hparams_from_json(&hp, resolved, "fuzz");
            json_decref(resolved);
        }
        const char *names[] = {"tok_embd", "blk.0.wq", "blk.12345678901234567890.wq", "output", "blk.1.ffn_gate.7",
                               "blk.0.ffn_down.12345678901234567890", "blk.3.ffn_up.", "blk.2.ffn_router"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            iflow_spec_source_name(s, names[i], buf, sizeof buf);
        iflow_spec_ignored(s, "model.layers.0.self_attn.rotary_emb.inv_freq");
        json_decref(cfg);
        if (iflow_spec_use_source(s, "gguf") == 0) {
            cfg = json_loads(gguf_config, 0, &je);
            if (iflow_spec_resolve(s, cfg, &resolved) == 0)
                json_decref(resolved);
            for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
                iflow_spec_source_name(s, names[i], buf, sizeof buf);
            iflow_spec_ignored(s, "blk.0.attn_rot_embd");
            json_decref(cfg);
        }
        iflow_spec_close(s);
    }
    close(fd);
    return 0;
}
