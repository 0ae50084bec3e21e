#!/usr/bin/env bash
# Every JSON output of every program against its schema in docs/JSON.md: the tables there are
# read by this script and each output checked with jq (documented fields present when
# "always", of their type, nothing undocumented, "schema": 1). The checker itself is checked
# on objects that break each rule.
. "$(dirname "$0")/lib.sh"
DOC=docs/JSON.md
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" 2>/dev/null || { bad "convert"; summary; exit 1; }

# spec TITLE: the rows of section "## TITLE" as a JSON array of {path, type, req}
spec() {
    awk -F'|' -v h="## $1" '
        $0 == h { on = 1; next }
        on && /^## / { exit }
        on && /^\| / { f = $2; t = $3; w = $4; gsub(/^ +| +$/, "", f); gsub(/^ +| +$/, "", t); gsub(/^ +| +$/, "", w)
                       if (f != "field" && f !~ /^-+$/) print f "\t" t "\t" w }' "$DOC" |
        jq -R -s -c 'split("\n") | map(select(length > 0) | split("\t") | {path: .[0], type: .[1], req: (.[2] == "always")})'
}

# The checker: for one JSON value, the list of what is wrong with it under $spec.
read -r -d '' CHECK <<'JQ'
def typeok($t): type as $vt | ($t | split("/")) | any(. == "any" or . == $vt);
def parse: if test("\\[\\]\\.") then {parent: split("[].")[0], arr: true, name: split("[].")[1]}
           elif test("\\.") then {parent: split(".")[0], arr: false, name: split(".")[1]}
           else {parent: null, arr: false, name: .} end;
def containers($doc; $p; $arr):
    if $p == null then $doc elif $arr then ($doc[$p] // [])[] else ($doc[$p] | select(type == "object")) end;
. as $doc
| ($spec | map(. + (.path | parse))) as $rows
| [ if $doc.schema != 1 then "schema: \($doc.schema | tojson), expected 1" else empty end ]
+ [ $rows[] as $r | containers($doc; $r.parent; $r.arr) as $c
    | if ($c | has($r.name)) then
          (if ($c[$r.name] | typeok($r.type)) then empty else "\($r.path): \($c[$r.name] | type), expected \($r.type)" end)
      elif $r.req then "\($r.path): missing" else empty end ]
+ [ ($rows | map(.parent) | unique)[] as $p
    | ($rows | map(select(.parent == $p) | .name)) as $known
    | ($rows | map(select(.parent == $p)) | .[0].arr) as $arr
    | containers($doc; $p; $arr) as $c
    | ($c | keys[]) as $k | select(($known | index($k)) == null)
    | "\(if $p then $p + "." else "" end)\($k): not in docs/JSON.md" ]
| .[]
JQ

# check TITLE WHAT: every JSON value on standard input against section TITLE
declare -A CHECKED # the sections some output was checked against
check() {
    local s problems n
    CHECKED[$1]=1
    s=$(spec "$1")
    [ "$(jq length <<<"$s")" -gt 1 ] || { bad "$2: no schema '$1' in $DOC"; return; }
    input=$(cat)
    n=$(jq -s length <<<"$input" 2>/dev/null)
    [ "${n:-0}" -gt 0 ] || { bad "$2: no JSON in the output: $input"; return; }
    problems=$(jq -r --argjson spec "$s" "$CHECK" <<<"$input" 2>&1 | sort -u)
    [ -z "$problems" ] && ok || bad "$2 against '$1': $(tr '\n' ';' <<<"$problems")"
}

# ---- the checker catches what it should ----
s=$(spec "iflow-run --json")
got=$(jq -r --argjson spec "$s" "$CHECK" <<<'{"schema":2,"prompt":"x","prompt_ids":[],"gen_ids":[],"text":5,"extra":1}' | sort | tr '\n' ';')
expect_eq "$got" "extra: not in docs/JSON.md;schema: 2, expected 1;stop: missing;text: number, expected string;" "the checker's findings"
s=$(spec "iflow-convert --info FILE --json")
got=$(jq -r --argjson spec "$s" "$CHECK" <<<'{"schema":1,"file":"f","meta":null,"bytes":1,"records":[{"name":"a","kind":"blob","type":"u8","shape":[1],"offset":0,"bytes":1},{"name":"b","kind":"tensor","type":"f32","shape":[1],"offset":1,"bytes":4,"xxh64":"0","more":true}]}' | sort | tr '\n' ';')
expect_eq "$got" "records.more: not in docs/JSON.md;records[].xxh64: missing;" "the checker looks into arrays"

# ---- iflow-convert ----
check "iflow-convert --info FILE --json" "convert --info" < <($BIN/iflow-convert --info "$TMP/s.ifs" --json)
$BIN/iflow-quant -t q4_b64 -i "$TMP/s.ifs" -o "$TMP/q.ifs" 2>/dev/null
check "iflow-convert --info FILE --json" "convert --info, quantized" < <($BIN/iflow-convert --info "$TMP/q.ifs" --json)

M=$DATA/models/stories260K
for src in "$M/hf" "$M/gguf/stories260K.gguf" "$M/llama2c/stories260K.bin --tokenizer $M/llama2c/tok512.bin" \
    "$M/hf --lora tests/fixtures/lora/stories260K-q-k-up.gguf"; do
    # shellcheck disable=SC2086 # the llama2.c source is the checkpoint and its --tokenizer
    out=$($BIN/iflow-convert --info $src --json)
    check "iflow-convert --info SOURCE --json" "convert --info on a source: ${src%% *}" <<<"$out"
    # the tensors listed are those a conversion writes, in its order
    $BIN/iflow-convert $src -o "$TMP/src.ifs" 2>/dev/null
    expect_eq "$(jq -r '.tensors[] | .name + " " + .type' <<<"$out")" \
        "$($BIN/iflow-convert --info "$TMP/src.ifs" --json | jq -r '.records[] | select(.kind == "tensor") | .name + " " + .type')" \
        "convert --info on a source: the tensors of its conversion (${src%% *})"
done

# ---- iflow-quant ----
check "iflow-quant --list-types --json" "quant --list-types" < <($BIN/iflow-quant --list-types --json)
check "iflow-quant --list-types --json" "quant --list-types without the quality table" < <(IFLOW_QUANT_QUALITY=/nonexistent $BIN/iflow-quant --list-types --json)

# ---- iflow-run ----
check "iflow-run --json" "run --json" < <(printf 'Hi\nLily and Tom\n' | $BIN/iflow-run -m "$TMP/s.ifs" -n 8 --temp 0 --json)
out=$($BIN/iflow-run -m "$TMP/s.ifs" -p Hi -n 16 --temp 0 --stop and --json)
expect_eq "$(jq -r .stop_string <<<"$out")" "and" "a stop string matched (its field is exercised)"
check "iflow-run --json" "run --json with a stop string" <<<"$out"
{
    echo '{"id":"a","prompt":"Hi","max_tokens":4,"temperature":0}'
    echo '{"id":{"k":[1]},"prompt":"Lily","max_tokens":3,"stop":["and"]}'
    echo '{"prompt":"Tom","max_tokens":12,"temperature":0,"stop":"the"}'
    echo '{"id":"beams","prompt":"Tom","max_tokens":6,"beams":2}'
    echo '{"id":"lp","prompt":"Once upon","max_tokens":5,"temperature":0.7,"logprobs":2,"prompt_logprobs":0}'
    echo '{"id":"cont","prompt":"Once upon","continuation":" a time","prompt_logprobs":1}'
    echo '{"id":"n","prompt":"Tom","max_tokens":4,"n":2,"logprobs":1,"stop":"the"}'
    echo '{"id":"bad","prompt":5}'
    echo 'not json'
} >"$TMP/req.jsonl"
$BIN/iflow-quant -t q4_b32 -i "$TMP/s.ifs" -o "$TMP/draft.ifs" 2>/dev/null
out=$($BIN/iflow-run -m "$TMP/s.ifs" --batch --draft "$TMP/draft.ifs" --metrics "$TMP/m.json" -v <"$TMP/req.jsonl" 2>"$TMP/err")
expect_eq "$(wc -l <<<"$out")" 9 "one line per request"
expect_eq "$(jq -c 'select(.id == "n") | [(.choices | length), .choices[0].text == .text, (.choices[1].logprobs | length)
    == .choices[1].completion_tokens]' <<<"$out")" "[2,true,true]" "\"n\": the completions listed"
expect_eq "$(jq -c 'select(.id == "lp") | [(.logprobs | length), (.logprobs[0].top | length), .prompt_logprobs[0].logprob,
    (.prompt_logprobs | length) == .prompt_tokens, (.prompt_logprobs[1] | has("top"))]' <<<"$out")" \
    "[5,2,null,true,false]" "log-probabilities in a result"
expect_eq "$(jq -c 'select(.id == "beams") | .beams | length' <<<"$out")" 2 "a beam request's result lists its beams"
expect_eq "$(jq -c 'has("draft")' "$TMP/m.json")" true "--draft: the metrics say what the draft did"
check "iflow-run --json" "run --json with --beams" < <($BIN/iflow-run -m "$TMP/s.ifs" -p "Hi" -n 6 --beams 3 --json)
check "iflow-run --json" "run --json with --logprobs" < <($BIN/iflow-run -m "$TMP/s.ifs" -p "Hi" -n 6 --logprobs 2 \
    --prompt-logprobs 1 --json)
check "iflow-run --batch: results" "batch results" < <(jq -c 'select(has("error") | not)' <<<"$out")
expect_eq "$(jq -c 'select(has("error"))' <<<"$out" | wc -l)" 2 "two error results"
check "iflow-run --batch: error results" "batch error results" < <(jq -c 'select(has("error"))' <<<"$out")
check "iflow-run --batch --metrics FILE" "--metrics" <"$TMP/m.json"
check "iflow-run --batch --metrics FILE" "the -v metrics line" < <(sed -n 's/^iflow-run: {/{/p' "$TMP/err")
check "iflow-run --dry-run --json" "--dry-run" < <($BIN/iflow-run -m "$TMP/s.ifs" --dry-run --parallel 8 --json)
check "iflow-run --list-devices --json" "--list-devices" < <($BIN/iflow-run --list-devices --json)
for flags in "" "--bos"; do
    # shellcheck disable=SC2086
    out=$(printf 'Lily and Tom' | $BIN/iflow-run -m "$TMP/s.ifs" --tokenize $flags --json)
    check "iflow-run --tokenize --json" "--tokenize $flags" <<<"$out"
    # shellcheck disable=SC2086
    expect_eq "$(jq -r '.ids | map(tostring) | join(" ")' <<<"$out")" "$(printf 'Lily and Tom' | $BIN/iflow-run -m "$TMP/s.ifs" --tokenize $flags)" \
        "--tokenize $flags --json: the ids of the plain form"
    expect_eq "$(jq -c '[.tokens == (.ids | length), .bytes]' <<<"$out")" "[true,12]" "--tokenize $flags --json: its counts"
done
out=$(printf 'Hello world' | $BIN/iflow-run -m "$DATA/tokenizer-tests/ggml-vocab-gpt-2.gguf" --tokenize --json)
check "iflow-run --tokenize --json" "--tokenize with a GGUF vocabulary" <<<"$out"
expect_eq "$(jq -c '[.tokenizer, .ids]' <<<"$out")" '["bpe-bytelevel/gpt-2",[15496,995]]' "--tokenize --json with a GGUF vocabulary"
$BIN/iflow-convert tests/fixtures/families/bert -o "$TMP/bert.ifs" 2>/dev/null
check "iflow-run --embed" "--embed" < <(printf 'the cat\nsat on the mat .\n' | $BIN/iflow-run -m "$TMP/bert.ifs" --embed)
$BIN/iflow-convert tests/fixtures/families/t5 -o "$TMP/t5.ifs" 2>/dev/null
check "iflow-run --translate" "--translate --json" < <(printf 'the cat\nsat on the mat .\n' | $BIN/iflow-run -m "$TMP/t5.ifs" --translate -n 6 --json)
check "iflow-run --translate" "--translate --beams --json" < <($BIN/iflow-run -m "$TMP/t5.ifs" --translate -n 6 --beams 3 --json -p "the cat")

# ---- iflow-ppl ----
TXT=$DATA/data/wikitext-2-raw/wiki.test.raw
check "iflow-ppl --json" "ppl" < <($BIN/iflow-ppl -m "$TMP/s.ifs" -f "$TXT" -c 64 --chunks 2 --json)
check "iflow-ppl --json" "ppl --kl-base" < <($BIN/iflow-ppl -m "$TMP/q.ifs" --kl-base "$TMP/s.ifs" -f "$TXT" -c 64 --chunks 2 --json)

# ---- iflow-partition ----
CFG=$DATA/models/synthetic/tinyllama-1.1b
check "iflow-partition --json" "partition --compare" < <($BIN/iflow-partition --config "$CFG" --devices 4xH100-80G --compare --json)
check "iflow-partition --json" "partition --compare with a strategy that cannot be planned" < <($BIN/iflow-partition --config "$CFG" --devices 2xH100-80G --compare --json)
check "iflow-partition --json" "partition -o --json" < <($BIN/iflow-partition --config "$CFG" --devices 2xH100-80G --strategy layer -o "$TMP/plan.ini" --json)

# ---- every --json output mode of every program has its schema, and each schema was checked ----
# A program's JSON modes are what its --help says prints JSON: the options --json's own line
# names ("with --info"), and every other option whose line mentions JSON ("--list-devices ...
# (with --json: JSON Lines)", "--metrics FILE ... as JSON"; not a file name like config.json).
# Each must be named in one of the program's sections of docs/JSON.md (in its title, or in a
# row: "with `--beams`"), and every section must have had an output checked against it above,
# so a new mode fails here until it has its table and its check.
sections=$(sed -n 's/^## //p' "$DOC")
while IFS= read -r title; do
    [ -n "${CHECKED[$title]:-}" ] && ok || bad "'$title' in $DOC: no output was checked against it"
done <<<"$sections"
for t in $BIN/iflow-*; do
    n=$(basename "$t")
    help=$("$t" --help)
    grep -qE -- '^ +--json ' <<<"$help" || continue
    mine=$(awk -v p="## $n " 'index($0, "## ") == 1 { on = index($0, p) == 1 } on' "$DOC")
    [ -n "$mine" ] || { bad "$n has --json but no schema in $DOC"; continue; }
    modes=$({
        grep -E -- '^ +--json ' <<<"$help" | sed 's/^ *--json *//' | grep -oE -- '--[a-z][a-z-]+'
        grep -iE -- '^ +(-[a-zA-Z], )?--[a-z][a-z-]+ .*[^.a-z]json' <<<"$help" | grep -vE -- '^ +--json ' |
            sed -E 's/^ +(-[a-zA-Z], )?(--[a-z][a-z-]+).*/\2/'
    } | sort -u)
    [ -n "$modes" ] || modes=--json # --json alone is the mode (iflow-ppl)
    for m in $modes; do
        grep -qE -- "(^|[ \`])$m([ \`:,]|\$)" <<<"$mine" && ok || bad "$n $m prints JSON, but no section of $DOC for $n names it"
    done
done
summary
