/*
 * llama2c.h -- a llama2.c checkpoint (Karpathy's run.c format) and its tokenizer.bin, presented
 * as a GGUF file so that the converter's GGUF path (ggufsrc.h, spec variant [gguf]) takes it.
 *
 * Byte layout (little-endian; F32 weights; hd = dim / n_heads; "x L" = one per layer, layer-major)
 *   checkpoint, legacy (version 0):
 *     7 x i32 {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len}
 *       (vocab_size < 0: the classifier is not the embedding; its weights come last)
 *     tok_embeddings [vocab][dim], rms_att [dim] x L, wq [n_heads*hd][dim] x L,
 *     wk [n_kv_heads*hd][dim] x L, wv [n_kv_heads*hd][dim] x L, wo [dim][n_heads*hd] x L,
 *     rms_ffn [dim] x L, w1 [hidden][dim] x L, w2 [dim][hidden] x L, w3 [hidden][dim] x L,
 *     rms_final [dim], freq_cis_real [seq_len][hd/2], freq_cis_imag [seq_len][hd/2],
 *     then wcls [vocab][dim] when not shared
 *   checkpoint, version 1 (export.py --version 1):
 *     u32 magic 0x616b3432 ("ak42"), i32 version = 1, the 7 i32 above (vocab_size > 0),
 *     u8 shared_classifier, zeros to byte 256; then rms_att x L, rms_ffn x L, rms_final,
 *     tok_embeddings, wq x L, wk x L, wv x L, wo x L, w1 x L, w2 x L, w3 x L, (wcls)
 *   checkpoint, version 2 (export.py --version 2, runq.c's): the version 1 header with i32
 *     group_size at byte 37 (it divides dim); rms_att x L, rms_ffn x L, rms_final in F32; then
 *     each matrix (tok_embeddings, wq x L, wk x L, wv x L, wo x L, w1 x L, w2 x L, w3 x L,
 *     (wcls)) as its int8 values followed by one F32 scale per group: w = q * scale.
 *   q and k rows are in Meta's interleaved RoPE order.
 *   tokenizer.bin: i32 max_token_length, then for each of vocab tokens:
 *     f32 score, i32 length, length bytes (a real space where SentencePiece has U+2581)
 *
 * Contract
 *   iflow_is_llama2c_file() says whether a file looks like a checkpoint: the version 1 magic,
 *   or a legacy header whose sizes give exactly the file's length.
 *   iflow_llama2c_open() checks both files (every header field in range, the checkpoint's
 *   length exactly what its header implies, every token inside the tokenizer file) and returns
 *   a GGUF handle (gguf.h) over a buffer that holds a generated header (architecture "llama",
 *   its hyperparameters, the vocabulary as a "llama" SentencePiece model: pieces with U+2581
 *   for spaces, scores, token types; BOS 1, EOS 2, UNK 0) followed by the checkpoint, mapped
 *   read-only and never copied (version 2: by its weights dequantized to F32, as runq.c does). Closing the handle unmaps both. Errors name the file and the
 *   byte offset or field.
 */
#ifndef IFLOW_LLAMA2C_H
#define IFLOW_LLAMA2C_H

#include "gguf.h"

/* 1 if the file at path looks like a llama2.c checkpoint (see the contract) or is a zip (a
 * PyTorch checkpoint, which iflow_llama2c_open then reads as train.py's ckpt.pt), else 0. */
int iflow_is_llama2c_file(const char *path);

/* tokenizer_path NULL: "tokenizer.bin" in the checkpoint's directory. A zip is llama2.c's
 * PyTorch training checkpoint (train.py's ckpt.pt: {"model": a state dict with llama2.c's
 * names, "model_args": {dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq_len}, the
 * optimizer, ...}, read by pickle.h, which runs nothing): the same GGUF over its tensors used in
 * place (contiguous F32, F16 or BF16), output.weight left out when it is the embedding's
 * storage (tied), the FFN width from layers.0.feed_forward.w1's shape. */
int iflow_llama2c_open(iflow_gguf **out, const char *path, const char *tokenizer_path);

/* The parsers alone, on bytes in memory (fuzz targets): 0 or an error. */
int iflow_llama2c_check_header(const void *buf, size_t len, const char *name);
int iflow_llama2c_check_tokenizer(const void *buf, size_t len, int vocab, const char *name);

#endif
