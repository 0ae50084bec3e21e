#!/usr/bin/env bash
# iflow-run --tokenize with SentencePiece unigram tokenizers: a .spm file, a Marian directory
# (source.spm + vocab.json: vocab.json's ids, </s> appended with --bos), the T5-style fixture as
# a .model and as its tokenizer.json (the same ids), --parse-special, and the refusals (a cut
# .spm names the field and byte; a directory without a tokenizer). The ids are sentencepiece's,
# MarianTokenizer's and HF tokenizers' (tests/fixtures/gen_unigram_refs.py); every line of those
# references is tests/unit/test_tokenizer.c's.
. "$(dirname "$0")/lib.sh"
OPUS=$DATA/models/tokenizers/opus-mt-en-mg
FX=tests/fixtures/tokenizers

run $BIN/iflow-run -m "$OPUS/source.spm" --tokenize <<<"Hello world"
expect_eq "$out" "18000 117" "source.spm: sentencepiece's ids"
run $BIN/iflow-run -m "$OPUS" --tokenize --bos < <(printf 'Hello world')
expect_eq "$out" "34291 245 0" "a Marian directory: vocab.json's ids and </s>"
run $BIN/iflow-run -m "$OPUS" --tokenize --bos --json < <(printf 'Hello world')
expect_eq "$out" '{"schema":1,"tokenizer":"spm-unigram","bytes":11,"tokens":3,"ids":[34291,245,0]}' "--json"

T5_IDS="100 294 160 132 3 2 3 264 24 75 7 189 58 586 221 1"
run $BIN/iflow-run -m "$FX/uni-t5.model" --tokenize --bos < <(printf 'Tournez \xc3\xa0 gauche, \xef\xbc\xa1\xef\xbc\xa2\xef\xbc\xa3')
expect_eq "$out" "$T5_IDS" "a T5-style .model: nmt_nfkc, unknown characters, </s>"
run $BIN/iflow-run -m "$FX/uni-t5.json" --tokenize --bos < <(printf 'Tournez \xc3\xa0 gauche, \xef\xbc\xa1\xef\xbc\xa2\xef\xbc\xa3')
expect_eq "$out" "$T5_IDS" "its tokenizer.json: the same ids"
run $BIN/iflow-run -m "$FX/uni-t5.model" --tokenize --parse-special < <(printf 'x</s>y')
expect_eq "$out" "3 220 1 3 11" "--parse-special: </s> is one token"

head -c 100 "$FX/uni-plain.model" >"$TMP/cut.model"
run $BIN/iflow-run -m "$TMP/cut.model" --tokenize <<<"x"
expect_rc 1 "a cut .spm"
expect_eq "$err" "iflow-run: protobuf field 1 at byte 92 claims 8 bytes but 6 remain in '$TMP/cut.model'" "the field and byte"
mkdir "$TMP/empty"
run $BIN/iflow-run -m "$TMP/empty" --tokenize <<<"x"
expect_rc 1 "a directory without a tokenizer"
expect_eq "$err" "iflow-run: no tokenizer.json, tokenizer.gguf, source.spm with vocab.json, or spiece.model in directory '$TMP/empty'" \
    "what was looked for"
summary
