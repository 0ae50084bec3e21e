#!/usr/bin/env bash
# --help, --version and usage errors of every program: exact text and exit codes.
. "$(dirname "$0")/lib.sh"
EXP=tests/cli/expected
for t in iflow-convert iflow-quant iflow-run iflow-ppl iflow-partition; do
    run $BIN/$t --help
    expect_rc 0 "$t --help"
    expect_eq "$out" "$(cat $EXP/$t.help)" "$t --help text"
    run $BIN/$t -h
    expect_eq "$out" "$(cat $EXP/$t.help)" "$t -h"
    run $BIN/$t --version
    expect_eq "$out" "$t 0.1.0" "$t --version"
    run $BIN/$t --bogus
    expect_rc 2 "$t --bogus"
    expect_eq "$err" "$t: unknown option '--bogus'
Try '$t --help' for more information." "$t --bogus message"
    run $BIN/$t -Z
    expect_rc 2 "$t -Z"
    expect_eq "$err" "$t: unknown option '-Z'
Try '$t --help' for more information." "$t -Z message"
done
run $BIN/iflow-run -m
expect_rc 2 "iflow-run -m without a value"
expect_eq "$err" "iflow-run: option '-m' needs a value
Try 'iflow-run --help' for more information." "missing value message"
run $BIN/iflow-run -m x -n ten
expect_eq "$err" "iflow-run: invalid value 'ten' for --n-predict (an integer from 0 to 16777216)
Try 'iflow-run --help' for more information." "bad integer message"
run $BIN/iflow-convert
expect_rc 2 "iflow-convert with no operand"
expect_eq "$err" "iflow-convert: expected one model directory, GGUF file or llama2.c checkpoint
Try 'iflow-convert --help' for more information." "no operand message"
run $BIN/iflow-convert "$DATA/models/stories260K/hf" -t f8
expect_rc 2 "unknown dtype"
expect_eq "$err" "iflow-convert: unknown type 'f8' for --dtype (f32, f16, bf16)
Try 'iflow-convert --help' for more information." "unknown dtype message"
# a binary shard is never written to a terminal (script gives the program a pty)
if command -v script >/dev/null; then
    run script -qec "$BIN/iflow-convert $DATA/models/stories260K/hf" /dev/null
    expect_match "$out" "refusing to write a binary shard to a terminal" "terminal refused"
fi
# no prompt and standard input is a terminal: an error, never a wait
if command -v script >/dev/null; then
    run timeout 10 script -qec "$BIN/iflow-run -m x.ifs" /dev/null
    expect_match "$out" "no prompt: give -p TEXT or pipe prompts" "never waits for a terminal"
fi
summary
