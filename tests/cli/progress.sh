#!/usr/bin/env bash
# The status line on long work: shown only when standard error is a terminal (run under a
# pseudo-terminal with script(1)), never in a pipe or a file unless --progress, never with
# --no-progress; one line rewritten with \r, cut to the terminal's width, erased at the end
# (so -v lines and errors start on a clean line, and results written to the same terminal start
# on a line of their own); the programs' output is the same either way.
. "$(dirname "$0")/lib.sh"
command -v script >/dev/null || { bad "script(1) is missing (make deps installs bsdutils)"; summary; exit 1; }
HF=$DATA/models/stories260K/hf
TXT=$DATA/data/wikitext-2-raw/wiki.test.raw
CR=$'\r' ESC=$'\033'

# tty CMD: run CMD (a shell string) with standard error on a pseudo-terminal of 100 columns;
# sets $tty to what the terminal received (standard output goes where CMD sends it)
tty() {
    tty=$(script -qec "stty cols ${COLS:-100} 2>/dev/null; $1" /dev/null </dev/null)
    rc=$?
}
# the status lines drawn: the pieces between carriage returns that start with the program's name
lines() { tr '\r' '\n' <<<"$tty" | sed "s/${ESC}\\[K//g" | grep -E "^$1: " ; }

# ---- iflow-convert ----
$BIN/iflow-convert "$HF" -o "$TMP/plain.ifs" 2>"$TMP/err"
expect_eq "$(cat "$TMP/err")" "" "convert into a file: stderr is not a terminal, no status line"
tty "$BIN/iflow-convert '$HF' -o '$TMP/s.ifs'"
expect_rc 0 "convert on a terminal"
n=$(lines iflow-convert | wc -l)
[ "$n" -ge 2 ] && ok || bad "convert drew $n status lines, expected a line per tensor drawn at least twice"
expect_match "$(lines iflow-convert | tail -n 1)" "^iflow-convert: 47/47 tensors, 1\.0 MB of 1\.0 MB, .*output_norm$" \
    "convert's last status line: tensors and bytes of the totals"
expect_match "$(lines iflow-convert | head -n 1)" "^iflow-convert: 1/47 tensors, .* of 1\.0 MB, .*tok_embd$" "convert's first status line"
[[ $tty == *"${CR}${ESC}[K" ]] && ok || bad "convert erases its status line at the end: $(printf %q "${tty: -20}")"
cmp -s "$TMP/s.ifs" "$TMP/plain.ifs" && ok || bad "the shard is the same with a status line"
$BIN/iflow-convert "$HF" -o "$TMP/p.ifs" --progress 2>"$TMP/err"
expect_match "$(tr '\r' '\n' <"$TMP/err")" "iflow-convert: 47/47 tensors" "--progress draws into a file"
tty "$BIN/iflow-convert '$HF' -o '$TMP/p.ifs' --no-progress"
expect_eq "$(lines iflow-convert)" "" "--no-progress on a terminal draws nothing"
# the width: a 40-column terminal gets lines of at most 39 columns
COLS=40 tty "$BIN/iflow-convert '$HF' -o '$TMP/p.ifs'"
long=$(lines iflow-convert | awk 'length($0) > 39' | head -n 1)
expect_eq "$long" "" "status lines fit a 40-column terminal"
expect_match "$(lines iflow-convert | tail -n 1)" "^iflow-convert: 47/47 tensors, 1\.0 MB of$" "cut at 39 columns"

# ---- iflow-quant ----
tty "$BIN/iflow-quant -t q8_b32 -i '$TMP/plain.ifs' -o '$TMP/q.ifs'"
expect_rc 0 "quant on a terminal"
expect_match "$(lines iflow-quant | tail -n 1)" "^iflow-quant: 47/47 tensors, 1\.0 MB of 1\.[01] MB, .*output_norm$" "quant's last line (of the file's size)"
$BIN/iflow-quant -t q8_b32 -i "$TMP/plain.ifs" -o "$TMP/q2.ifs" 2>"$TMP/err"
expect_eq "$(cat "$TMP/err")" "" "quant into a file: no status line"
cmp -s "$TMP/q.ifs" "$TMP/q2.ifs" && ok || bad "the quantized shard is the same with a status line"
# from a pipe the input's size is not known: tensors only
tty "cat '$TMP/plain.ifs' | $BIN/iflow-quant -t q8_b32 -o '$TMP/q3.ifs'"
expect_match "$(lines iflow-quant | tail -n 1)" "^iflow-quant: 47/47 tensors, 1\.0 MB, .*output_norm$" "quant from a pipe"
$BIN/iflow-quant -t q8_b32 -i "$TMP/plain.ifs" -o "$TMP/q4.ifs" --progress 2>"$TMP/err"
expect_match "$(tr '\r' '\n' <"$TMP/err")" "iflow-quant: 47/47 tensors" "quant --progress draws into a file"
cmp -s "$TMP/q.ifs" "$TMP/q4.ifs" && ok || bad "quant --progress: the same shard"
tty "$BIN/iflow-quant -t q8_b32 -i '$TMP/plain.ifs' -o '$TMP/q5.ifs' --no-progress"
expect_rc 0 "quant --no-progress on a terminal"
expect_eq "$(lines iflow-quant)" "" "quant --no-progress on a terminal draws nothing"

# ---- iflow-ppl: windows, the running perplexity; -v stays on lines of its own ----
want=$($BIN/iflow-ppl -m "$TMP/plain.ifs" -f "$TXT" -c 64 --chunks 6 2>"$TMP/err")
expect_eq "$(cat "$TMP/err")" "" "ppl into a pipe: no status line"
tty "$BIN/iflow-ppl -m '$TMP/plain.ifs' -f '$TXT' -c 64 --chunks 6 -v >'$TMP/ppl.out'"
expect_rc 0 "ppl on a terminal"
expect_eq "$(cat "$TMP/ppl.out")" "$want" "ppl's output is the same"
expect_match "$(lines iflow-ppl | grep window | tail -n 1)" "^iflow-ppl: window 6/6, ppl [0-9]+\.[0-9]{4}, [0-9]+ tok/s" "ppl's last line"
expect_match "$(lines iflow-ppl | grep window | head -n 1)" "^iflow-ppl: window 1/6, ppl " "ppl's first line"
[[ $tty == *"${CR}${ESC}[Kiflow-ppl: load+tokenize"* ]] && ok || bad "the -v line starts after the status line is erased"
# the running perplexity at the last window is the perplexity of the scored positions before it
last=$(lines iflow-ppl | grep -o 'window 6/6, ppl [0-9.]*' | tail -n 1 | awk '{print $4}')
final=$(sed -n 's/^perplexity: //p' <<<"$want")
expect_close "$last" "$final" 0.2 "the running perplexity is near the final one"
got=$($BIN/iflow-ppl -m "$TMP/plain.ifs" -f "$TXT" -c 64 --chunks 6 --progress 2>"$TMP/err")
expect_eq "$got" "$want" "ppl --progress: the same output"
expect_match "$(tr '\r' '\n' <"$TMP/err")" "iflow-ppl: window 6/6, ppl " "ppl --progress draws into a file"
tty "$BIN/iflow-ppl -m '$TMP/plain.ifs' -f '$TXT' -c 64 --chunks 6 --no-progress >'$TMP/ppl.out'"
expect_rc 0 "ppl --no-progress on a terminal"
expect_eq "$(lines iflow-ppl)" "" "ppl --no-progress on a terminal draws nothing"
expect_eq "$(cat "$TMP/ppl.out")" "$want" "ppl --no-progress: the same output"

# ---- iflow-run --batch: requests done, tokens/s ----
for i in $(seq 1 12); do echo "{\"id\":$i,\"prompt\":\"Lily saw a $i\",\"max_tokens\":24,\"temperature\":0}"; done >"$TMP/req.jsonl"
same() { jq -c '{id, text, finish_reason}' "$@" | sort; }   # without the timings
$BIN/iflow-run -m "$TMP/plain.ifs" --batch --parallel 4 <"$TMP/req.jsonl" 2>"$TMP/err" | same >"$TMP/want.jsonl"
expect_eq "$(cat "$TMP/err")" "" "batch into a pipe: no status line"
tty "$BIN/iflow-run -m '$TMP/plain.ifs' --batch --parallel 4 <'$TMP/req.jsonl' >'$TMP/got.jsonl'"
expect_rc 0 "batch on a terminal"
expect_eq "$(same "$TMP/got.jsonl")" "$(cat "$TMP/want.jsonl")" "the batch's results are the same"
expect_match "$(lines iflow-run | tail -n 1)" "^iflow-run: [0-9]+ requests done, [0-9]+ running, [0-9]+ queued, [0-9]+ tokens, [0-9.]+ tok/s$" \
    "batch's status line"
[[ $tty == *"${CR}${ESC}[K" ]] && ok || bad "batch erases its status line"
$BIN/iflow-run -m "$TMP/plain.ifs" --batch --parallel 4 --progress <"$TMP/req.jsonl" 2>"$TMP/err" >"$TMP/got.jsonl"
expect_eq "$(same "$TMP/got.jsonl")" "$(cat "$TMP/want.jsonl")" "batch --progress: the same results"
expect_match "$(tr '\r' '\n' <"$TMP/err")" "iflow-run: [0-9]+ requests done, " "batch --progress draws into a file"
tty "$BIN/iflow-run -m '$TMP/plain.ifs' --batch --parallel 4 --no-progress <'$TMP/req.jsonl' >'$TMP/got.jsonl'"
expect_rc 0 "batch --no-progress on a terminal"
expect_eq "$(lines iflow-run)" "" "batch --no-progress on a terminal draws nothing"
expect_eq "$(same "$TMP/got.jsonl")" "$(cat "$TMP/want.jsonl")" "batch --no-progress: the same results"
# results on the terminal the status line is drawn on: each starts on a line of its own (the
# status line is erased before it and drawn again after), none lands after the status text
tty "$BIN/iflow-run -m '$TMP/plain.ifs' --batch --parallel 4 <'$TMP/req.jsonl'"
expect_rc 0 "batch on a terminal, results too"
pieces=$(tr '\r' '\n' <<<"$tty" | sed "s/${ESC}\\[K//g")
expect_eq "$(grep -F '"schema"' <<<"$pieces" | grep -vc '^{"schema"')" 0 "no result after the status text: $(grep -F '"schema"' <<<"$pieces" | grep -v '^{"schema"' | head -n 1)"
expect_eq "$(grep '^{"schema"' <<<"$pieces" | same)" "$(cat "$TMP/want.jsonl")" "every result whole, on the terminal"
# the status line was there before the first result and is drawn again after one
expect_match "$(sed -n '/^{"schema"/,$p' <<<"$pieces" | sed 1d | grep -m 1 '^iflow-run: ')" "^iflow-run: [0-9]+ requests done" \
    "the status line is drawn again after a result"
summary
