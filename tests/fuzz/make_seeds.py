#!/usr/bin/env python3
"""Write the small seed inputs of the fuzz targets (tests/fuzz/seeds/<target>/); each < 20 KB.

    python3 tests/fuzz/make_seeds.py [--data ../shared]

The committed seeds are this script's output; rerun it only to change them. Except
fuzz_shard/tokenizer.ifs (a shard carrying SentencePiece tokenizer records, source side with a
vocab.json and a target side): tests/unit/test_shardtok writes it when run with
IFLOW_WRITE_SEEDS=tests/fuzz/seeds.
"""
import argparse
import io
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# ---- GGUF -------------------------------------------------------------------------------------
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q",
       F64: "<d"}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gval(et, x) for x in items)
    return struct.pack(FMT[t], v)


def gguf(kvs, tensors=(), data=b"", version=3, align=32):
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + gval(t, v)
    for name, ne, typ, off in tensors:
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", x) for x in ne)
        out += struct.pack("<IQ", typ, off)
    if tensors:
        out += b"\0" * (-len(out) % align) + data
    return out


def byte_chars():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def spm_vocab():
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    toks += ["\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "\u2581the", "he", "<|user|>"]
    types = [2, 3, 3] + [6] * 256 + [1] * 9 + [4]
    scores = [0.0] * 259 + [-1.0, -2.0, -2.0, -3.0, -1.5, -2.5, -1.2, -0.5, -1.8, 0.0]
    return [("general.architecture", STR, "llama"), ("tokenizer.ggml.model", STR, "llama"),
            ("tokenizer.ggml.tokens", ARR, (STR, toks)), ("tokenizer.ggml.scores", ARR, (F32, scores)),
            ("tokenizer.ggml.token_type", ARR, (I32, types)), ("tokenizer.ggml.bos_token_id", U32, 1),
            ("tokenizer.ggml.eos_token_id", U32, 2), ("tokenizer.ggml.unknown_token_id", U32, 0),
            ("tokenizer.ggml.add_bos_token", BOOL, True)]


def bpe_vocab(pre):
    chars = byte_chars()
    merges = ["\u0120 t", "h e", "\u0120t he", "i n", "\u0120 a", "e r", "\u0120 \u0120", "1 2"]
    toks = chars + ["".join(m.split(" ")) for m in merges] + ["<|endoftext|>", "<tool>"]
    types = [1] * (len(toks) - 2) + [3, 4]
    return [("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, pre),
            ("tokenizer.ggml.tokens", ARR, (STR, toks)), ("tokenizer.ggml.token_type", ARR, (I32, types)),
            ("tokenizer.ggml.merges", ARR, (STR, merges)), ("tokenizer.ggml.bos_token_id", U32, len(toks) - 2),
            ("tokenizer.ggml.eos_token_id", U32, len(toks) - 2)]


def bert_vocab():
    """llama.cpp's phantom-space form of a WordPiece vocabulary."""
    toks = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "\u2581hello", "\u2581world", "\u2581fu", "hrer", "s", "\u2581,",
            "\u2581!", "\u2581\u4e2d"]
    types = [3, 3, 3, 3, 3] + [1] * (len(toks) - 5)
    return [("tokenizer.ggml.model", STR, "bert"), ("tokenizer.ggml.tokens", ARR, (STR, toks)),
            ("tokenizer.ggml.token_type", ARR, (I32, types)), ("tokenizer.ggml.cls_token_id", U32, 2),
            ("tokenizer.ggml.seperator_token_id", U32, 3), ("tokenizer.ggml.unknown_token_id", U32, 1)]


def all_types():
    return [("general.alignment", U32, 32), ("a.u8", U8, 7), ("a.i8", I8, -3), ("a.u16", U16, 9), ("a.i16", I16, -9),
            ("a.u32", U32, 4000000000), ("a.i32", I32, -5), ("a.f32", F32, 1.5), ("a.bool", BOOL, True),
            ("a.str", STR, "llama"), ("a.u64", U64, 1 << 40), ("a.i64", I64, -1), ("a.f64", F64, 2.25),
            ("a.arr", ARR, (I32, [1, -2, 3])), ("a.strs", ARR, (STR, ["x", "", "yz"])), ("a.f", ARR, (F32, [0.5]))]


def gguf_seeds():
    tensors = [("f32", [4, 2], 0, 0), ("f16", [8], 1, 32), ("q4_0", [32, 2], 2, 64), ("q6_k", [256], 14, 128)]
    data = bytes(range(256)) * 2
    return {
        "all_types.gguf": gguf(all_types()),
        "tensors.gguf": gguf(all_types()[:3], tensors, data[:128 + 210]),
        "spm_vocab.gguf": gguf(spm_vocab()),
        "bpe_llama3.gguf": gguf(bpe_vocab("llama-bpe")),
        "bpe_deepseek.gguf": gguf(bpe_vocab("deepseek-llm")),
        "bpe_falcon_v2.gguf": gguf(bpe_vocab("falcon"), version=2),
        "truncated.gguf": gguf(spm_vocab())[:300],
        "quant_types.gguf": quant_types(),
        "bert_vocab.gguf": gguf(bert_vocab()),
        **family_seeds(),
    }


def family_seeds():
    """Tiny files of the architectures specs/ serve from GGUF, with the metadata their [gguf]
    sections read ({general.architecture} keys, conditional sections, fused tensors as row ranges,
    rope_freqs): the spec resolution and the engine's hyperparameter checks run on them."""
    vocab = [kv for kv in spm_vocab() if kv[0] != "general.architecture"]

    def model(arch, kvs, tensors=(), data=b""):
        head = [("general.architecture", STR, arch), (arch + ".block_count", U32, 2), (arch + ".embedding_length", U32, 8),
                (arch + ".feed_forward_length", U32, 16), (arch + ".attention.head_count", U32, 2),
                (arch + ".context_length", U32, 64)]
        named = {k for k, _, _ in kvs}
        return gguf([kv for kv in head if kv[0] not in named] + kvs + vocab, tensors, data)
    qkv = [("blk.0.attn_qkv.weight", [8, 24], 0, 0), ("blk.0.ffn_up.weight", [32, 32], 8, 1024),
           ("rope_freqs.weight", [2], 0, 1024 + 32 * 34)]
    data = struct.pack("<192f", *[i / 64 for i in range(192)]) + b"\0" * 256
    data += bytes((i * 13) & 0xFF for i in range(32 * 34)) + struct.pack("<2f", 1.0, 0.0)
    moe = [("blk.0.ffn_gate_exps.weight", [8, 4, 2], 0, 0), ("blk.0.ffn_down_exps.weight", [4, 8, 2], 0, 256),
           ("blk.0.ffn_gate_inp.weight", [8, 2], 0, 512), ("blk.0.ffn_gate_inp_shexp.weight", [8], 0, 576)]
    moe_data = struct.pack("<152f", *[(i % 17) / 16 for i in range(152)])
    return {
        "gemma2_27b.gguf": model("gemma2", [("gemma2.block_count", U32, 46), ("gemma2.attn_logit_softcapping", F32, 50.0),
                                            ("gemma2.attention.sliding_window", U32, 4)]),
        "gemma3_pattern.gguf": model("gemma3", [("gemma3.attention.sliding_window", U32, 4),
                                                ("gemma3.attention.sliding_window_pattern", ARR, (BOOL, [True, False]))]),
        "bert_pooling.gguf": model("bert", [("bert.pooling_type", U32, 1), ("tokenizer.ggml.token_type_count", U32, 2)]),
        "phi3_fused.gguf": model("phi3", [("phi3.attention.sliding_window", U32, 3), ("phi3.rope.dimension_count", U32, 4)],
                                 qkv, data),
        "llama_rope_freqs.gguf": model("llama", [("llama.rope.scaling.type", STR, "linear")], qkv, data),
        # a mixture of experts: 3-D expert tensors [E][F][D] (ggml [D, F, E]) read as row ranges
        "qwen2moe_experts.gguf": model("qwen2moe", [("qwen2moe.expert_count", U32, 2), ("qwen2moe.expert_used_count", U32, 1),
                                                    ("qwen2moe.expert_feed_forward_length", U32, 4),
                                                    ("qwen2moe.expert_shared_feed_forward_length", U32, 4)], moe, moe_data),
        # Granite's multipliers; OLMo 3's windowed layers as a list of booleans (read as a list)
        "granite_scales.gguf": model("granite", [("granite.embedding_scale", F32, 3.0), ("granite.attention.scale", F32, 0.3),
                                                 ("granite.residual_scale", F32, 0.5), ("granite.logit_scale", F32, 4.0)]),
        "olmo3_pattern.gguf": model("olmo2", [("olmo2.attention.sliding_window", U32, 4),
                                              ("olmo2.attention.sliding_window_pattern", ARR, (BOOL, [True, False]))]),
        # DeepSeek's latent attention, yarn with its log multiplier, sigmoid gating in groups
        "deepseek2_mla.gguf": model("deepseek2", [
            ("deepseek2.attention.kv_lora_rank", U32, 4), ("deepseek2.attention.q_lora_rank", U32, 4),
            ("deepseek2.attention.key_length_mla", U32, 6), ("deepseek2.attention.value_length_mla", U32, 2),
            ("deepseek2.rope.dimension_count", U32, 2), ("deepseek2.rope.scaling.type", STR, "yarn"),
            ("deepseek2.rope.scaling.factor", F32, 40.0), ("deepseek2.rope.scaling.original_context_length", U32, 16),
            ("deepseek2.rope.scaling.yarn_log_multiplier", F32, 0.0707), ("deepseek2.expert_count", U32, 4),
            ("deepseek2.expert_used_count", U32, 2), ("deepseek2.expert_feed_forward_length", U32, 4),
            ("deepseek2.expert_shared_count", U32, 1), ("deepseek2.leading_dense_block_count", U32, 1),
            ("deepseek2.expert_group_count", U32, 2), ("deepseek2.expert_group_used_count", U32, 1),
            ("deepseek2.expert_gating_func", U32, 2), ("deepseek2.expert_weights_scale", F32, 2.5)]),
        # gpt-oss: the window, experts' biases as rows of a 2-D tensor, an MXFP4 expert tensor
        "gpt_oss_experts.gguf": model("gpt-oss", [("gpt-oss.attention.sliding_window", U32, 4),
                                                  ("gpt-oss.attention.key_length", U32, 4),
                                                  ("gpt-oss.expert_count", U32, 2), ("gpt-oss.expert_used_count", U32, 1),
                                                  ("gpt-oss.expert_feed_forward_length", U32, 4)],
                                      [("blk.0.ffn_gate_exps.weight", [32, 4, 2], 39, 0),
                                       ("blk.0.ffn_gate_exps.bias", [4, 2], 0, 160)],
                                      bytes((i * 29 + 7) & 0xFF for i in range(17 * 8)) + b"\0" * 24 +
                                      struct.pack("<8f", *range(8))),
        # Phi-3.5's longrope: the factors as tensors, the attention factor as a key
        "phi3_longrope.gguf": model("phi3", [("phi3.rope.dimension_count", U32, 4),
                                             ("phi3.rope.scaling.attn_factor", F32, 1.19),
                                             ("phi3.rope.scaling.original_context_length", U32, 16)],
                                    [("rope_factors_long.weight", [2], 0, 0), ("rope_factors_short.weight", [2], 0, 8)],
                                    struct.pack("<4f", 1.0, 4.0, 1.0, 1.5)),
        # GLM-4.5: block_count counts its multi-token-prediction layer
        "glm4moe_mtp.gguf": model("glm4moe", [
            ("glm4moe.block_count", U32, 3), ("glm4moe.nextn_predict_layers", U32, 1), ("glm4moe.expert_count", U32, 4),
            ("glm4moe.expert_used_count", U32, 2), ("glm4moe.expert_feed_forward_length", U32, 4),
            ("glm4moe.expert_shared_count", U32, 1), ("glm4moe.leading_dense_block_count", U32, 1),
            ("glm4moe.rope.dimension_count", U32, 2)]),
    }


def quant_types():
    """One tensor of each ggml type ggufsrc.c converts (a block or two each), for its decoders."""
    sizes = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
             10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210)}
    tensors, data = [], b""
    for typ, (block, size) in sizes.items():
        n = 256 if block == 256 else 64
        tensors.append(("t%d.weight" % typ, [n, 1], typ, len(data)))
        body = bytes((i * 37 + typ) & 0xFF for i in range(n // block * size))
        data += body + b"\0" * (-len(body) % 32)
    return gguf([("general.architecture", STR, "llama"), ("llama.block_count", U32, 1)], tensors, data)


# ---- tokenizer.json ---------------------------------------------------------------------------

def template(first, last=None):
    single = [{"SpecialToken": {"id": first, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]
    specials = {first: {"id": first, "ids": [0], "tokens": [first]}}
    if last:
        single.append({"SpecialToken": {"id": last, "type_id": 0}})
        specials[last] = {"id": last, "ids": [1], "tokens": [last]}
    return {"type": "TemplateProcessing", "single": single, "pair": single, "special_tokens": specials}


def added(tokens):
    return [{"id": i, "content": c, "single_word": sw, "lstrip": ls, "rstrip": rs, "normalized": False,
             "special": sp} for i, c, sp, ls, rs, sw in tokens]


def bytelevel_json():
    chars = byte_chars()
    vocab = {"<|begin_of_text|>": 0, "<|end_of_text|>": 1, "<tool>": 2}
    for c in chars:
        vocab[c] = len(vocab)
    merges = [["\u0120", "t"], ["h", "e"], ["\u0120t", "he"], ["i", "n"], ["\u0120", "\u0120"], ["1", "2"]]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    llama3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
              "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    return {"version": "1.0", "added_tokens": added([(0, "<|begin_of_text|>", True, False, False, False),
                                                     (1, "<|end_of_text|>", True, False, True, False),
                                                     (2, "<tool>", False, True, False, True)]),
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": llama3}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
            "post_processor": {"type": "Sequence", "processors": [
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
                template("<|begin_of_text|>")]},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                      "vocab": vocab, "merges": [" ".join(m) for m in merges]}}


def metaspace_json():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in list(range(32)) + [0xC3, 0xA9, 0xE2, 0x96, 0x81]:
        vocab["<0x%02X>" % b] = len(vocab)
    for p in ["\u2581", "a", "b", "c", "e", "h", "t", "\u2581t", "he", "\u2581the", "\u2581a", "ab"]:
        vocab[p] = len(vocab)
    merges = [["\u2581", "t"], ["h", "e"], ["\u2581t", "he"], ["\u2581", "a"], ["a", "b"]]
    return {"version": "1.0", "added_tokens": added([(0, "<unk>", True, False, False, False),
                                                     (1, "<s>", True, False, False, False),
                                                     (2, "</s>", True, False, False, False)]),
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "NFKC"}, {"type": "Lowercase"}, {"type": "Strip", "strip_left": False, "strip_right": True},
                {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}, {"type": "StripAccents"},
                {"type": "NFD"}, {"type": "NFC"}, {"type": "NFKD"}]},
            "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
            "post_processor": template("<s>", "</s>"),
            "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
            "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
                      "vocab": vocab, "merges": merges}}


def misc_pretok_json():
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2}
    for w in ["hello", "world", ",", "!", "1", "2", "3", "a", "##b", "##c", "don", "'", "t", "-", "x"]:
        vocab[w] = len(vocab)
    return {"version": "1.0", "added_tokens": added([(0, "[UNK]", True, False, False, False),
                                                     (1, "[CLS]", True, False, False, False),
                                                     (2, "[SEP]", True, False, False, False)]),
            "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "x"}, {"type": "Replace",
                           "pattern": {"String": "--"}, "content": "-"}]},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "WhitespaceSplit"}, {"type": "Whitespace"}, {"type": "Punctuation", "behavior": "Contiguous"},
                {"type": "Digits", "individual_digits": False}, {"type": "CharDelimiterSplit", "delimiter": "-"},
                {"type": "Split", "pattern": {"String": "a"}, "behavior": "MergedWithPrevious", "invert": False},
                {"type": "Split", "pattern": {"String": "b"}, "behavior": "MergedWithNext", "invert": True},
                {"type": "Split", "pattern": {"Regex": "c+"}, "behavior": "Removed", "invert": False}]},
            "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 2], "cls": ["[CLS]", 1]},
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 10, "vocab": vocab}}


def bert_small_json(data):
    full = json.load(open(os.path.join(data, "models/tokenizers/all-minilm-l6-v2/tokenizer.json"), encoding="utf-8"))
    vocab = full["model"]["vocab"]
    keep = {k: v for k, v in vocab.items() if v < 104}  # [PAD], [unused*], [UNK], [CLS], [SEP], [MASK]
    for k, v in sorted(vocab.items(), key=lambda kv: kv[1]):
        if 999 <= v < 1400:
            keep[k] = len(keep)
    for w in ("hello", "world", "##s", "##ing", "un", "##aff", "##able", "cafe", "the"):
        keep.setdefault(w, len(keep))
    full["model"]["vocab"] = keep
    full["truncation"] = full["padding"] = None
    return full


def json_seeds(data):
    sep = b"\xff\xff"
    dump = lambda j: json.dumps(j, ensure_ascii=False).encode()
    seeds = {
        "bytelevel.json": dump(bytelevel_json()) + sep + b"<|begin_of_text|>Hello the 1234 <tool>  \n\n it's",
        "metaspace.json": dump(metaspace_json()) + sep + "  The  \u00c9t\u00e9 ab\u00e9 <s>\tx ".encode(),
        "misc_pretok.json": dump(misc_pretok_json()) + sep + b"hello, world!! don't 123 a-b--c abcabc [CLS]",
        "bert_small.json": dump(bert_small_json(data)) + sep + "Hello WORLD caf\u00e9 \u4e2d\u6587 unaffable".encode(),
    }
    stories = os.path.join(data, "models/stories260K/hf/tokenizer.json")
    seeds["stories260K.json"] = open(stories, "rb").read() + sep + b"Once upon a time <s> \xe4\xb8\xad \xff"
    unigram = os.path.join(HERE, "..", "fixtures", "tokenizers", "uni-plain.json")
    seeds["unigram.json"] = open(unigram, "rb").read().rstrip(b"\n") + sep + "  Hello  \u2581x <unk> \U0001f600 ".encode()
    return seeds


def encode_seeds(data):
    sep = "\n__ggml_vocab_test__\n"
    tests = open(os.path.join(data, "tokenizer-tests/ggml-vocab-gpt-2.gguf.inp"), encoding="utf-8").read().split(sep)
    seeds = {"inp%02d.txt" % i: tests[k].encode() for i, k in enumerate([0, 1, 10, 18, 21, 22, 33, 45])}
    seeds["invalid_utf8.txt"] = b"ok \x80\xbf bad \xc3 tail \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \xff\xfe end\xc3"
    seeds["specials.txt"] = "<s>Hi</s> <|endoftext|> [CLS] x [SEP] <unk> \u2581a".encode()
    return seeds


# ---- importance matrices (iflow-imatrix(5)) -----------------------------------------------------
def imatrix_seeds():
    def entry(name, K, count, vals):
        b = name.encode()
        return struct.pack("<H", len(b)) + b + struct.pack("<IQ", K, count) + struct.pack("<%df" % K, *vals)

    def im(entries, ntok=256):
        return b"IFIMTX01" + struct.pack("<IIQ", len(entries), 0, ntok) + b"".join(entries) + b"IFIMEND!"

    good = im([entry("blk.0.wq", 64, 256, [0.5 + i * 0.01 for i in range(64)]), entry("blk.0.wo", 64, 256, [1.0] * 64),
               entry("blk.0.ffn_down", 172, 256, [0.25] * 172), entry("output", 64, 256, [2.0] * 64)])
    return {"good": good, "wrong_size": im([entry("blk.0.wq", 32, 10, [1.0] * 32)]), "empty": im([]),
            "truncated": good[:100]}


# ---- llama2.c -----------------------------------------------------------------------------------
def llama2c_seeds():
    """fuzz_llama2c input: u32 k, then a checkpoint of k bytes, then a tokenizer.bin."""
    dim, hidden, layers, heads, kv, vocab, seq = 8, 12, 1, 2, 1, 6, 4
    hd = dim // heads
    n = vocab * dim + layers * dim * 2 + layers * dim * dim * 2 + layers * kv * hd * dim * 2 + layers * hidden * dim * 3 + dim
    weights = struct.pack(f"<{n}f", *[((i * 37) % 17 - 8) / 16 for i in range(n)])
    freq = struct.pack(f"<{seq * hd}f", *[0.5] * (seq * hd))
    v0 = struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq) + weights + freq
    v1 = struct.pack("<Ii7iB", 0x616B3432, 1, dim, hidden, layers, heads, kv, vocab, seq, 1).ljust(256, b"\0") + weights
    pieces = [b"<unk>", b"<s>", b"</s>", b"<0x41>", b" a", b"b c"]
    tok = struct.pack("<i", 5) + b"".join(struct.pack("<fi", -i, len(p)) + p for i, p in enumerate(pieces))
    unshared = struct.pack("<7i", dim, hidden, layers, heads, kv, -vocab, seq) + weights + freq + weights[: vocab * dim * 4]
    gs = 4  # version 2: norms in f32, then each matrix as int8 values and one f32 scale per group
    norms = struct.pack(f"<{2 * layers * dim + dim}f", *[1.0] * (2 * layers * dim + dim))
    mats = [vocab * dim] + [dim * dim] * layers + [kv * hd * dim] * 2 * layers + [dim * dim] * layers + [hidden * dim] * 3 * layers
    q8 = b"".join(bytes((i * 7) % 255 for i in range(n)) + struct.pack(f"<{n // gs}f", *[0.01] * (n // gs)) for n in mats)
    v2 = struct.pack("<Ii7iBi", 0x616B3432, 2, dim, hidden, layers, heads, kv, vocab, seq, 1, gs).ljust(256, b"\0") + norms + q8
    return {name: struct.pack("<I", len(ck)) + ck + tok for name, ck in
            (("legacy", v0), ("version1", v1), ("unshared", unshared), ("version2", v2))}


# ---- SentencePiece models (fuzz_spm) -------------------------------------------------------------
SPM_RULES = {0xFF21: [0x41], 0xFF22: [0x42], 0x2460: [0x31], 0x3000: [0x20], 0xA0: [0x20], 0xFB01: [0x66, 0x69],
             0x41: [0x61]}


def spm_seeds():
    """The small committed unigram and BPE models, and one with a few normalization rules of its
    own (a charsmap of a few units; needs the `sentencepiece` package)."""
    import sentencepiece as spm
    import tempfile
    root = os.path.join(HERE, "..", "fixtures", "tokenizers")
    seeds = {n: open(os.path.join(root, n), "rb").read()
             for n in ("uni-plain.model", "uni-bf.model", "bpe-bf.model", "bpe-unused.model")}
    text = ["Hello world, this is a small corpus for a fuzz seed.", "\uff21\uff22 \u2460 e\u0301 caf\u00e9 \ufb01",
            "the cat sat on the mat", "A tiny model with rules"] * 20
    with tempfile.NamedTemporaryFile("w", suffix=".tsv", delete=False) as f:
        for src, dst in SPM_RULES.items():
            f.write("%X\t%s\n" % (src, " ".join("%X" % c for c in dst)))
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=out, model_type="unigram", vocab_size=60,
                                   hard_vocab_limit=False, normalization_rule_tsv=f.name, user_defined_symbols=["<sep>"],
                                   minloglevel=2)
    os.unlink(f.name)
    seeds["rules.model"] = out.getvalue()
    return seeds


def write(target, seeds):
    d = os.path.join(HERE, "seeds", target)
    os.makedirs(d, exist_ok=True)
    for name, blob in seeds.items():
        assert len(blob) < 20 * 1024, (name, len(blob))
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)
        print(f"{target}/{name}: {len(blob)} bytes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("IFLOW_TEST_DATA", os.path.join(HERE, "..", "..", "..", "shared")))
    args = ap.parse_args()
    write("fuzz_gguf", gguf_seeds())
    write("fuzz_tokenizer_json", json_seeds(args.data))
    write("fuzz_encode", encode_seeds(args.data))
    write("fuzz_imatrix", imatrix_seeds())
    write("fuzz_llama2c", llama2c_seeds())
    write("fuzz_spm", spm_seeds())


if __name__ == "__main__":
    main()
