#!/usr/bin/env bash
# iflow-run --draft: speculative decoding. Greedy text with a draft (the q4 and q2 of the model)
# equals the text without one, in the plain mode and in --batch; -v and --metrics report the
# proposals and the acceptance; with a context shift (the draft's cache shifted too) greedy text
# still equals the text without a draft; bad combinations are usage errors naming the option.
. "$(dirname "$0")/lib.sh"
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" || { bad "convert"; summary; exit 1; }
$BIN/iflow-quant -t q4_b32 -i "$TMP/s.ifs" -o "$TMP/s.q4.ifs" 2>/dev/null || bad "quantize q4"
$BIN/iflow-quant -t q2_b32 -i "$TMP/s.ifs" -o "$TMP/s.q2.ifs" 2>/dev/null || bad "quantize q2"
$BIN/iflow-convert "$DATA/models/xs-ckpt/hf" -o "$TMP/xs.ifs" || bad "convert xs-ckpt"

printf '%s\n' "Once upon a time" "Lily saw a big dog" "The sun was hot" >"$TMP/prompts.txt"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' -n 80 --temp 0 <'$TMP/prompts.txt'"
plain=$out
for d in q4 q2; do
    for n in 1 5 16; do
        run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --draft '$TMP/s.$d.ifs' --draft-n $n -n 80 --temp 0 <'$TMP/prompts.txt'"
        expect_rc 0 "draft $d, $n a step"
        expect_eq "$out" "$plain" "greedy with the $d draft, $n a step: the same text"
    done
done
# another model of the same tokenizer as the draft: stories260K for xs-ckpt
run bash -c "$BIN/iflow-run -m '$TMP/xs.ifs' -n 80 --temp 0 <'$TMP/prompts.txt'"
xplain=$out
run bash -c "$BIN/iflow-run -m '$TMP/xs.ifs' --draft '$TMP/s.ifs' -n 80 --temp 0 <'$TMP/prompts.txt'"
expect_eq "$out" "$xplain" "xs-ckpt greedy with stories260K as the draft: the same text"
run $BIN/iflow-run -m "$TMP/s.ifs" --draft "$TMP/s.q4.ifs" -p "Once upon a time" -n 80 --temp 0 -v
expect_match "$err" "iflow-run: draft: [0-9]+ tokens proposed, [0-9]+ accepted \([0-9.]+ %\), [0-9.]+ tokens a step, [0-9.]+ tok/s generated" "-v reports the draft and the speed"
# sampled: runs, and a seed repeats itself
run $BIN/iflow-run -m "$TMP/s.ifs" --draft "$TMP/s.q4.ifs" -p "Once upon a time" -n 60 --temp 0.9 --seed 5
a=$out
run $BIN/iflow-run -m "$TMP/s.ifs" --draft "$TMP/s.q4.ifs" -p "Once upon a time" -n 60 --temp 0.9 --seed 5
expect_eq "$out" "$a" "sampled with a draft: the same seed, the same text"
run $BIN/iflow-run -m "$TMP/s.ifs" --draft "$TMP/s.q4.ifs" --draft-top-k 3 -p "Once upon a time" -n 60 --temp 0.9
expect_rc 0 "--draft-top-k"
run $BIN/iflow-run -m "$TMP/s.ifs" --draft "$TMP/s.q4.ifs" --draft-top-p 0.8 -p "Once upon a time" -n 60 --temp 0.9
expect_rc 0 "--draft-top-p"

# with a context shift: far past a context of 64, greedy text equals the shifted run's without a draft
for mode in rope recompute; do
    run $BIN/iflow-run -m "$TMP/s.ifs" -c 64 --keep 4 --context-shift $mode -n 400 --temp 0 -p "Once upon a time" --json
    expect_rc 0 "shift $mode without a draft"
    noshift=$out
    expect_eq "$(jq -c '[(.gen_ids | length), .stop]' <<<"$out")" '[400,"length"]' "shift $mode: 400 tokens in a context of 64"
    run $BIN/iflow-run -m "$TMP/s.ifs" --draft "$TMP/s.q2.ifs" -c 64 --keep 4 --context-shift $mode -n 400 --temp 0 \
        -p "Once upon a time" --json -v
    expect_rc 0 "shift $mode with a draft"
    expect_eq "$out" "$noshift" "shift $mode: greedy with the q2 draft, the same tokens and text"
    expect_match "$err" "[0-9]+ accepted" "shift $mode with a draft: -v reports the draft"
done

# ---- --batch ----
jq -Rc '{id: ., prompt: ., max_tokens: 80, temperature: 0}' "$TMP/prompts.txt" >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch <'$TMP/req.jsonl' | jq -r '[.id, .text] | @tsv' | sort"
b0=$out
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --draft '$TMP/s.q4.ifs' --metrics '$TMP/m.json' <'$TMP/req.jsonl' | jq -r '[.id, .text] | @tsv' | sort"
expect_eq "$out" "$b0" "--batch greedy with a draft: the same texts"
expect_eq "$(jq -c '[(.draft.proposed > 0), (.draft.accepted <= .draft.proposed), (.draft.acceptance_rate <= 1)]' "$TMP/m.json")" \
    "[true,true,true]" "--metrics: the draft's proposals and acceptance"
jq -Rc '{id: ., prompt: ., max_tokens: 300, temperature: 0, context_shift: "rope", keep: 4}' "$TMP/prompts.txt" >"$TMP/shift.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' -c 64 --batch <'$TMP/shift.jsonl' | jq -r '[.id, .text] | @tsv' | sort"
b0=$out
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' -c 64 --batch --draft '$TMP/s.q4.ifs' <'$TMP/shift.jsonl' | jq -r '[.id, .text] | @tsv' | sort"
expect_eq "$out" "$b0" "--batch greedy with a draft and a context shift: the same texts"

# ---- errors ----
run $BIN/iflow-run -m "$TMP/s.ifs" -p hi --draft-n 3
expect_rc 2 "--draft-n without --draft"
expect_eq "$(head -n 1 <<<"$err")" "iflow-run: --draft-n, --draft-top-k and --draft-top-p go with --draft" "--draft-n without --draft: message"
run $BIN/iflow-run -m "$TMP/s.ifs" -p hi --draft "$TMP/s.q4.ifs" --draft-n 17
expect_rc 2 "--draft-n 17"
run $BIN/iflow-run -m "$TMP/s.ifs" -p hi --draft "$TMP/xs.ifs"
expect_rc 1 "a draft with a shorter context"
expect_eq "$err" "iflow-run: the draft model holds 256 positions, the context is 512" "a shorter draft: message"
summary
