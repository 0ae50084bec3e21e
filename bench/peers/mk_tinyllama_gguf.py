#!/usr/bin/env python3
# bench/peers/mk_tinyllama_gguf.py OUT.gguf -- (needs numpy and the gguf package; by hand, not in make check)
# A random-weight TinyLlama-1.1B-shaped model as an F16 GGUF (llama arch), with the vocabulary of
# ../shared/models/synthetic/tinyllama-1.1b/tokenizer.gguf: the peer engines' side of a speed
# comparison on models of the same shape (weights' values do not matter for speed).
import json, sys, numpy as np, gguf
import os
src = os.path.join(os.environ.get('IFLOW_TEST_DATA', '../shared'), 'models/synthetic/tinyllama-1.1b')
cfg = json.load(open(src + '/config.json'))
tok = gguf.GGUFReader(src + '/tokenizer.gguf')
w = gguf.GGUFWriter(sys.argv[1], 'llama')
H, F, L = cfg['hidden_size'], cfg['intermediate_size'], cfg['num_hidden_layers']
nh, nkv, V = cfg['num_attention_heads'], cfg['num_key_value_heads'], cfg['vocab_size']
hd = H // nh
w.add_name('tinyllama-shape-random')
w.add_block_count(L); w.add_context_length(2048); w.add_embedding_length(H)
w.add_feed_forward_length(F); w.add_head_count(nh); w.add_head_count_kv(nkv)
w.add_layer_norm_rms_eps(1e-5); w.add_rope_dimension_count(hd); w.add_rope_freq_base(10000.0)
w.add_vocab_size(V); w.add_file_type(1)
def field(k):
    f = tok.fields[k]
    return f
toks = [bytes(tok.fields['tokenizer.ggml.tokens'].parts[i]).decode('utf-8', 'replace') for i in tok.fields['tokenizer.ggml.tokens'].data]
scores = [float(tok.fields['tokenizer.ggml.scores'].parts[i][0]) for i in tok.fields['tokenizer.ggml.scores'].data]
types = [int(tok.fields['tokenizer.ggml.token_type'].parts[i][0]) for i in tok.fields['tokenizer.ggml.token_type'].data]
w.add_tokenizer_model('llama'); w.add_token_list(toks); w.add_token_scores(scores); w.add_token_types(types)
w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0)
rng = np.random.default_rng(0)
def t(name, shape):
    a = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
    w.add_tensor(name, a)
def norm(name, n):
    w.add_tensor(name, np.ones(n, dtype=np.float32))
t('token_embd.weight', (V, H))
for i in range(L):
    p = f'blk.{i}.'
    norm(p + 'attn_norm.weight', H)
    t(p + 'attn_q.weight', (H, H)); t(p + 'attn_k.weight', (nkv * hd, H)); t(p + 'attn_v.weight', (nkv * hd, H))
    t(p + 'attn_output.weight', (H, H))
    norm(p + 'ffn_norm.weight', H)
    t(p + 'ffn_gate.weight', (F, H)); t(p + 'ffn_up.weight', (F, H)); t(p + 'ffn_down.weight', (H, F))
norm('output_norm.weight', H)
t('output.weight', (V, H))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
