#!/usr/bin/env bash
# tests/cli/grammar.sh -- constrained decoding: iflow-run --grammar, --grammar-file, --json-schema,
# --json-schema-file, --regex, --choice and the batch fields "grammar", "json_schema", "regex",
# "choice", "response_format". SmolLM2-135M-Instruct end to end against an independent reference
# (tests/fixtures/grammar/smollm2.ref.jsonl, tests/fixtures/gen_grammar_smollm2.py: the float64
# forward of gen_chat_smollm2.py, each step's allowed tokens found by Python's `regex` module with
# partial matching over the tokens' byte-level strings): the reply's tokens up to the first step
# whose top-two allowed logits are closer than 0.02 (the F32 path, --activations f32, keeps
# logits within 2e-3 of float64 here), and where every step was compared, the reply's text and
# finish reason. Token references (<|im_end|>, <[2]>, !<x>) end or shape a reply. Sampled replies
# follow their constraint; errors are pinned.
. "$(dirname "$0")/lib.sh"
F=tests/fixtures/grammar
SMOL=$DATA/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$SMOL" ] || { bad "missing $SMOL"; summary; exit 1; }
$BIN/iflow-convert "$SMOL" -o "$TMP/smol.ifs" || { bad "convert smollm2"; summary; exit 1; }
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" || { bad "convert stories260K"; summary; exit 1; }

# [steps compared, equal, all compared]: our ids against the reference's, up to the first step
# whose margin is below 0.02
agree() {
    jq -cn --argjson got "$1" --argjson ref "$2" \
        '$ref.greedy_ids as $want
         | ([($ref.margin | to_entries | map(select(.value < 0.02)) | .[0].key // 1e9), ($want | length)] | min) as $n
         | [$n, ($got[:$n] == $want[:$n]), ($n == ($want | length))]'
}

# ---- --regex and --choice: the greedy reply of the reference ----
while IFS= read -r ref; do
    name=$(jq -r .name <<<"$ref") q=$(jq -r .question <<<"$ref") re=$(jq -r .regex <<<"$ref")
    run $BIN/iflow-run -m "$TMP/smol.ifs" --chat -p "$q" --regex "$re" --temp 0 -n 32 --activations f32 --json
    expect_rc 0 "--regex $name"
    expect_eq "$(jq -c .prompt_ids <<<"$out")" "$(jq -c .ids <<<"$ref")" "$name: the prompt's ids"
    a=$(agree "$(jq -c .gen_ids <<<"$out")" "$ref")
    expect_match "$a" '^\[[0-9]+,true,(true|false)\]$' "$name: the reference's greedy reply under $re ($a)"
    if [[ $a == *,true] ]]; then
        expect_eq "$(jq -r '[.text, .stop] | @tsv' <<<"$out")" "$(jq -r '[.text, .finish] | @tsv' <<<"$ref")" \
            "$name: the reply and why it ended"
    fi
    # the same request in a batch
    jq -c --arg q "$q" --arg re "$re" -n '{id: 1, messages: [{role: "user", content: $q}], regex: $re,
        temperature: 0, max_tokens: 32, logprobs: 0}' >"$TMP/req.jsonl"
    run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --activations f32 <'$TMP/req.jsonl'"
    a=$(agree "$(jq -c '[.logprobs[].id]' <<<"$out")" "$ref")
    expect_match "$a" '^\[[0-9]+,true,(true|false)\]$' "batch $name: the reference's greedy reply ($a)"
done <$F/smollm2.ref.jsonl
expect_eq "$(jq -r 'select(.name == "yesno") | .text' $F/smollm2.ref.jsonl)" "no" "the reference's yes/no reply"
run $BIN/iflow-run -m "$TMP/smol.ifs" --chat -p "Is the sky blue? Answer yes or no." --choice yes --choice no \
    --temp 0 --json
expect_eq "$(jq -r '[.text, .stop] | @tsv' <<<"$out")" "no	grammar" "--choice: the reference's choice, then done"
jq -c -n '{id: "c", messages: [{role: "user", content: "Is the sky blue? Answer yes or no."}],
    choice: ["yes", "no"], temperature: 0}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch <'$TMP/req.jsonl'"
expect_eq "$(jq -r '[.text, .finish_reason] | @tsv' <<<"$out")" "no	grammar" "\"choice\": the same"

# ---- token references: the end-of-turn token named in the grammar (a control token, no text):
# the reference's choice, ended by that token; !<x> any token but x ----
for ref in '<|im_end|>' '<[2]>'; do
    run $BIN/iflow-run -m "$TMP/smol.ifs" --chat -p "Is the sky blue? Answer yes or no." --temp 0 --json \
        --grammar "root ::= (\"yes\" | \"no\") $ref"
    expect_eq "$(jq -r '[.text, .stop] | @tsv' <<<"$out")" "no	eos" "$ref: the reference's choice, then the end token"
done
for seed in 1 2 3; do
    run $BIN/iflow-run -m "$TMP/smol.ifs" --chat -p "Tell me a story." --grammar 'root ::= (!<|im_end|>){3} <[2]>' \
        --temp 1 --seed $seed --json
    expect_eq "$(jq -c '[(.gen_ids | length), (.gen_ids | index(2)), .stop]' <<<"$out")" '[3,null,"eos"]' \
        "seed $seed: three tokens but <|im_end|>, then it"
done
run $BIN/iflow-run -m "$TMP/smol.ifs" -p x --grammar $'root ::= "a"\n  <|nope|>'
expect_rc 1 "a token the vocabulary lacks"
expect_eq "$err" "iflow-run: --grammar: grammar: <|nope|> is not a token of the vocabulary, line 2 column 3" \
    "a token the vocabulary lacks: named, with its place"
echo '{"id": "t", "prompt": "x", "grammar": "root ::= <[99999]>"}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch <'$TMP/req.jsonl'"
expect_eq "$(jq -r .error <<<"$out")" "grammar: token id 99999 is outside the vocabulary of 49152, line 1 column 10" \
    "a token id outside the vocabulary: the request's error"

# ---- sampled replies follow their constraint ----
for seed in 1 2 3 4 5; do
    run $BIN/iflow-run -m "$TMP/smol.ifs" --chat -p "Tell me a date." --regex '[0-9]{4}-(0[1-9]|1[0-2])-[0-3][0-9]' \
        --temp 1.5 --seed $seed -n 32 --json
    t=$(jq -r .text <<<"$out")
    [[ $t =~ ^[0-9]{4}-(0[1-9]|1[0-2])-[0-3][0-9]$ ]] && ok || bad "seed $seed: '$t' is not a date"
    expect_eq "$(jq -r .stop <<<"$out")" "grammar" "seed $seed: the date is complete"
done
# stories260K, a SentencePiece vocabulary with byte fallback; a prompt of BOS alone (the first piece
# loses its leading space): the text itself follows the grammar
run $BIN/iflow-run -m "$TMP/s.ifs" -p "" --grammar 'root ::= [A-Z] [a-z]+ (" " [a-z]+){3,6} "."' --temp 0.9 \
    --seed 3 -n 48 --json
t=$(jq -r .text <<<"$out")
[[ $t =~ ^[A-Z][a-z]+( [a-z]+){3,6}\.$ ]] && ok || bad "stories260K from BOS: '$t' does not follow the grammar"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" --grammar-file /dev/stdin --temp 0 -n 24 <<<'
# a comment, then the rules over several lines
root ::= (" " word){2,}
  "."
word ::= [a-z]+'
expect_rc 0 "--grammar-file"
expect_match "$out" '^( [a-z]+){2,}\.$' "--grammar-file: the text follows it"

# ---- --json-schema: the reply is JSON of the schema's shape; the batch's forms of it ----
cat >"$TMP/person.json" <<'EOF'
{"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
 "age": {"type": "integer", "minimum": 0, "maximum": 120}, "tags": {"type": "array", "items": {"enum": ["a", "b"]},
 "maxItems": 2}}, "required": ["name", "age"]}
EOF
for seed in 1 2 3; do
    run $BIN/iflow-run -m "$TMP/smol.ifs" --chat -p "Describe a person as JSON." --json-schema-file "$TMP/person.json" \
        --temp 1 --seed $seed -n 96 --json
    t=$(jq -r .text <<<"$out")
    expect_eq "$(jq -r .stop <<<"$out")" "grammar" "--json-schema-file, seed $seed: a whole value"
    expect_eq "$(jq -c '[(keys_unsorted - ["tags"]), (.name | type), (.name | length <= 20), (.age | type),
        (.age >= 0 and .age <= 120), ((.tags // []) - ["a", "b"] | length)]' <<<"$t" 2>/dev/null)" \
        '[["name","age"],"string",true,"number",true,0]' "seed $seed: '$t' is valid under the schema"
done
schema=$(jq -c . "$TMP/person.json")
jq -c -n --argjson s "$schema" '{id: "js", messages: [{role: "user", content: "A person as JSON."}], json_schema: $s,
    temperature: 0},
    {id: "jstext", messages: [{role: "user", content: "A person as JSON."}], json_schema: ($s | tojson), temperature: 0},
    {id: "rf", messages: [{role: "user", content: "A person as JSON."}], temperature: 0,
     response_format: {type: "json_schema", json_schema: {name: "person", strict: true, schema: $s}}},
    {id: "obj", messages: [{role: "user", content: "Any JSON object."}], temperature: 0, max_tokens: 64,
     response_format: {type: "json_object"}}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch <'$TMP/req.jsonl'"
expect_rc 0 "a batch of JSON requests"
t=$(jq -r 'select(.id == "js") | .text' <<<"$out")
expect_eq "$(jq -c 'keys_unsorted[:2]' <<<"$t" 2>/dev/null)" '["name","age"]' "\"json_schema\": '$t'"
expect_eq "$(jq -r 'select(.id == "jstext") | .text' <<<"$out")" "$t" "\"json_schema\" as JSON text: the same"
expect_eq "$(jq -r 'select(.id == "rf") | .text' <<<"$out")" "$t" "\"response_format\" json_schema: the same"
t=$(jq -r 'select(.id == "obj") | .text' <<<"$out")
r=$(jq -r 'select(.id == "obj") | .finish_reason' <<<"$out")
[ "$r" = length ] || expect_eq "$(jq -r type <<<"$t" 2>/dev/null)" "object" "json_object: '$t' is an object"
[ "$r" != length ] || expect_match "$t" '^\{' "json_object, cut by max_tokens: '$t' opens an object"

# ---- a reply cut inside a character (hiragana are two byte-level tokens here): --json's text is
# still a string, the partial character U+FFFD (Python's decode with errors="replace") ----
for n in 4 5; do
    run $BIN/iflow-run -m "$TMP/smol.ifs" --chat -p "Write in Japanese." --grammar 'root ::= [ぁ-ゟ]+' --temp 0 -n $n --json
    t=$(jq -r .text <<<"$out")
    plain=$($BIN/iflow-run -m "$TMP/smol.ifs" --chat -p "Write in Japanese." --grammar 'root ::= [ぁ-ゟ]+' --temp 0 -n $n)
    if [ $n = 4 ]; then
        expect_eq "$t" "$plain" "-n $n: whole characters, the plain text"
    else
        head=$(jq -r '.text | .[:-1]' <<<"$out")
        expect_eq "$(jq -r '.text | endswith("\ufffd")' <<<"$out")" true "-n $n: cut inside a character, U+FFFD last"
        [ -n "$head" ] && [ "$(printf '%s' "$plain" | head -c "$(printf '%s' "$head" | wc -c)")" = "$head" ] && ok ||
            bad "-n $n: '$head' does not begin the plain text"
    fi
done

# ---- errors: said before the model is read ----
run $BIN/iflow-run -m "$TMP/nonexistent.ifs" -p x --grammar 'root ::= x'
expect_rc 1 "a grammar with an undefined rule"
expect_eq "$err" "iflow-run: --grammar: grammar: rule 'x' is used but never defined, line 1 column 10" \
    "the grammar's error, line and column"
printf 'root ::= "a"\n  | [b-a]\n' >"$TMP/bad.gbnf"
run $BIN/iflow-run -m "$TMP/nonexistent.ifs" -p x --grammar-file "$TMP/bad.gbnf"
expect_eq "$err" "iflow-run: --grammar-file '$TMP/bad.gbnf': grammar: a class range runs backwards, line 2 column 5" \
    "--grammar-file: names the file"
run $BIN/iflow-run -m "$TMP/nonexistent.ifs" -p x --json-schema '{"type":"object","properties":{"a":{"not":{}}}}'
expect_eq "$err" "iflow-run: --json-schema: json schema: keyword 'not' is not supported, at /properties/a" \
    "a schema keyword that is not supported: named with where it is"
run $BIN/iflow-run -m "$TMP/nonexistent.ifs" -p x --regex '(a)\1'
expect_eq "$err" "iflow-run: --regex: regex: backreference '\\1' is not supported, at byte 3" "a regex backreference"
run $BIN/iflow-run -m "$TMP/s.ifs" -p x --regex 'a' --choice b
expect_rc 2 "two constraints"
expect_eq "$(head -n 1 <<<"$err")" "iflow-run: --grammar, --grammar-file, --json-schema, --json-schema-file, --regex and --choice: one at most (--choice may be repeated)" \
    "two constraints: the message"
run $BIN/iflow-run -m "$TMP/s.ifs" -p x --choice b --beams 2
expect_rc 2 "a constraint with --beams"
expect_eq "$(head -n 1 <<<"$err")" "iflow-run: a constraint (--grammar, --json-schema, --regex, --choice) goes with none of --beams, --embed, --translate, --tokenize" \
    "a constraint with --beams: the message"
run $BIN/iflow-run -m "$TMP/s.ifs" -p x --choice $'\xff'
expect_eq "$err" "iflow-run: --choice: choice '"$'\xff'"' is not valid UTF-8 at byte 0" "--choice not UTF-8"

# in a batch: each request's error names its field; the others run
cat >"$TMP/bad.jsonl" <<'EOF'
{"id":"ok","prompt":"Once","grammar":"root ::= \" a\"","max_tokens":4}
{"id":"undef","prompt":"Once","grammar":"root ::= x"}
{"id":"type","prompt":"Once","regex":5}
{"id":"two","prompt":"Once","regex":"a","choice":["b"]}
{"id":"beams","prompt":"Once","choice":["b"],"beams":2}
{"id":"choice","prompt":"Once","choice":[]}
{"id":"rf","prompt":"Once","response_format":{"type":"xml"}}
{"id":"rfs","prompt":"Once","response_format":{"type":"json_schema"}}
{"id":"text","prompt":"Once","response_format":{"type":"text"},"max_tokens":2}
{"id":"schema","prompt":"Once","json_schema":{"type":"integer","multipleOf":2}}
{"id":"schematype","prompt":"Once","json_schema":[1]}
EOF
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch <'$TMP/bad.jsonl'"
expect_rc 0 "a batch with bad constraints"
e() { jq -r --arg i "$1" 'select(.id == $i) | .error // ([.text, .finish_reason] | @tsv)' <<<"$out"; }
expect_eq "$(e ok)" " a	grammar" "a grammar request: its text, then done"
expect_eq "$(e undef)" "field 'grammar': grammar: rule 'x' is used but never defined, line 1 column 10" "undefined rule"
expect_eq "$(e type)" "field 'regex': it must be a string" "regex not a string"
expect_eq "$(e two)" "fields 'grammar', 'json_schema', 'regex', 'choice' and 'response_format' (or vLLM's names for them): one at most" \
    "two constraints in a request"
expect_eq "$(e beams)" "a constraint ('grammar', 'json_schema', 'regex', 'choice' or 'response_format') does not go with 'beams'" \
    "a constraint with beams"
expect_eq "$(e choice)" "field 'choice': it must be a list of 1 to 65536 strings" "no choices"
expect_eq "$(e rf)" "field 'response_format': type 'xml' is not \"text\", \"json_object\" or \"json_schema\"" \
    "response_format of another type"
expect_eq "$(e rfs)" "field 'response_format': type \"json_schema\" needs \"json_schema\": {\"schema\": {...}}" \
    "response_format without its schema"
expect_match "$(e text)" $'\tlength$' "response_format text: no constraint"
expect_eq "$(e schema)" "field 'json_schema': json schema: keyword 'multipleOf' is not supported, at the root" \
    "a schema keyword that is not supported"
expect_eq "$(e schematype)" "field 'json_schema': it must be an object" "a schema that is not an object"
# the command line's constraint is every request's default; a request's own replaces it
printf '%s\n' '{"id":"d","prompt":"Once","max_tokens":8}' '{"id":"own","prompt":"Once","choice":[" b"]}' \
    '{"id":"beams","prompt":"Once","beams":2}' >"$TMP/d.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --choice ' upon' <'$TMP/d.jsonl'"
expect_eq "$(e d)" " upon	grammar" "the command line's constraint"
expect_eq "$(e own)" " b	grammar" "a request's own"
expect_eq "$(e beams)" "a constraint (the command line's) does not go with 'beams'" "the command line's with beams"

# vLLM's names: guided_* (older) and structured_outputs give the same constraint as ours
cat >"$TMP/vllm.jsonl" <<'EOF'
{"id":"choice","prompt":"Once","choice":[" upon", " b"]}
{"id":"guided_choice","prompt":"Once","guided_choice":[" upon", " b"]}
{"id":"so_choice","prompt":"Once","structured_outputs":{"choice":[" upon", " b"]}}
{"id":"regex","prompt":"Once","regex":" [a-z]+ [a-z]+","max_tokens":12}
{"id":"guided_regex","prompt":"Once","guided_regex":" [a-z]+ [a-z]+","max_tokens":12}
{"id":"so_regex","prompt":"Once","structured_outputs":{"regex":" [a-z]+ [a-z]+"},"max_tokens":12}
{"id":"json_schema","prompt":"Once","json_schema":{"type":"integer"},"max_completion_tokens":6}
{"id":"guided_json","prompt":"Once","guided_json":{"type":"integer"},"max_tokens":6}
{"id":"so_json","prompt":"Once","structured_outputs":{"json":{"type":"integer"}},"max_tokens":6}
{"id":"grammar","prompt":"Once","grammar":"root ::= \" a\" | \" upon\"","max_tokens":4}
{"id":"guided_grammar","prompt":"Once","guided_grammar":"root ::= \" a\" | \" upon\"","max_tokens":4}
{"id":"so_grammar","prompt":"Once","structured_outputs":{"grammar":"root ::= \" a\" | \" upon\""},"max_tokens":4}
{"id":"so_object","prompt":"Once","structured_outputs":{"json_object":true},"max_tokens":3}
{"id":"so_bad","prompt":"Once","structured_outputs":{"json_object":false}}
{"id":"so_two","prompt":"Once","structured_outputs":{"regex":"a","choice":["b"]}}
{"id":"two_names","prompt":"Once","guided_regex":"a","regex":"b"}
{"id":"two_max","prompt":"Once","max_tokens":3,"max_completion_tokens":4}
EOF
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --temp 0 <'$TMP/vllm.jsonl'"
for pair in choice:guided_choice choice:so_choice regex:guided_regex regex:so_regex json_schema:guided_json \
    json_schema:so_json grammar:guided_grammar grammar:so_grammar; do
    expect_eq "$(e "${pair#*:}")" "$(e "${pair%%:*}")" "${pair#*:}: as ${pair%%:*}"
done
expect_match "$(e choice)" $'\tgrammar$' "a choice request: done under its grammar"
expect_eq "$(jq -c 'select(.id == "so_object") | .completion_tokens' <<<"$out")" 3 "structured_outputs json_object: runs"
expect_eq "$(e so_bad)" "field 'structured_outputs': it must be an object of one of \"grammar\", \"json\", \"regex\", \"choice\" or \"json_object\": true" \
    "structured_outputs json_object false"
expect_match "$(e so_two)" "^field 'structured_outputs': it must be an object of one of" "structured_outputs with two members"
expect_match "$(e two_names)" "\\(or vLLM's names for them\\): one at most$" "guided_regex and regex"
expect_eq "$(e two_max)" "fields 'max_tokens' and 'max_completion_tokens': one at most" "max_tokens twice over"
summary
