#!/usr/bin/env bash
# tests/cli/openai.sh -- iflow-run --batch reading OpenAI batch lines (the Batch API's input, vLLM's
# run-batch: {"custom_id", "method", "url", "body"}) and answering in that API's output format
# (cmd/openai.h). Each reply is checked against iflow's own result of the same request (the body
# as an iflow request line, same seed): texts, finish reasons, usage, log-probabilities (the
# same numbers, reshaped), choices of "n"; a prompt of token ids gives what its text gives; "echo"
# (the prompt's text and logprobs first); chat replies on SmolLM2-135M-Instruct, tool calls
# against tools.sh's independent reference; refused lines and their messages pinned.
. "$(dirname "$0")/lib.sh"
SMOL=$DATA/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$SMOL" ] || { bad "missing $SMOL"; summary; exit 1; }
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" || { bad "convert stories260K"; summary; exit 1; }
$BIN/iflow-convert "$SMOL" -o "$TMP/smol.ifs" || { bad "convert smollm2"; summary; exit 1; }
B() { run bash -c "$BIN/iflow-run -m '$1' --batch ${3:-} <'$2'"; }
native() { jq -c --arg i "$1" 'select(.id == $i)' <<<"$out"; }
reply() { jq -c --arg i "$1" 'select(.custom_id == $i)' <<<"$out"; }

# ---- completions: the same request as an iflow line and as an OpenAI line ----
body='{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "logprobs": 3}'
jq -c -n --argjson b "$body" '($b + {id: "n1"}), {custom_id: "o1", method: "POST", url: "/v1/completions",
    body: ($b + {model: "tiny"})}' >"$TMP/c.jsonl"
jq -c -n --argjson b "$body" '{custom_id: "o3", url: "/v1/completions", body: ($b + {model: "tiny", store: false,
    metadata: {k: "v"}, service_tier: "auto", stream_options: null, user: "u", seed: null, stop: null, suffix: null})}' \
    >>"$TMP/c.jsonl"
jq -c -n '{id: "n2", prompt: "Once", max_tokens: 6, n: 3, seed: 7, temperature: 1.2},
    {custom_id: "o2", url: "/v1/completions", body: {prompt: "Once", max_tokens: 6, n: 3, seed: 7, temperature: 1.2}}' \
    >>"$TMP/c.jsonl"
B "$TMP/s.ifs" "$TMP/c.jsonl"
expect_rc 0 "a batch of OpenAI and iflow lines"
n=$(native n1) o=$(reply o1)
expect_eq "$(jq -c '[.id, .response.status_code, .response.request_id, .error]' <<<"$o")" '["batch_req_2",200,"req_2",null]' \
    "the envelope: its line's ids, status 200, no error"
expect_eq "$(jq -c '.response.body | [.id, .object, .model, (.created | type)]' <<<"$o")" '["cmpl-2","text_completion","tiny","number"]' \
    "the body: cmpl id, text_completion, the body's model, created"
expect_eq "$(jq -r '.response.body.choices[0].text' <<<"$o")" "$(jq -r .text <<<"$n")" "the text: iflow's"
expect_eq "$(jq -c '.response.body.choices' <<<"$(reply o3)")" "$(jq -c '.response.body.choices' <<<"$o")" \
    "nulls and fields that change nothing (store, metadata, service_tier, user, ...): as if absent"
expect_eq "$(jq -c '.response.body | [.choices[0].finish_reason, .usage]' <<<"$o")" \
    "$(jq -c '["length", {prompt_tokens, completion_tokens, total_tokens: (.prompt_tokens + .completion_tokens)}]' <<<"$n")" \
    "finish length, usage: iflow's counts"
lp=$(jq -c '.response.body.choices[0].logprobs' <<<"$o")
expect_eq "$(jq -c '[.tokens, .token_logprobs]' <<<"$lp")" "$(jq -c '[[.logprobs[].token], [.logprobs[].logprob]]' <<<"$n")" \
    "logprobs: iflow's tokens and log-probabilities"
expect_eq "$(jq -c '.top_logprobs | map(to_entries | map([.key, .value]))' <<<"$lp")" \
    "$(jq -c '[.logprobs[].top | map([.token, .logprob])]' <<<"$n")" "top_logprobs: iflow's top 3, as objects"
expect_eq "$(jq -r '.tokens | join("")' <<<"$lp")" "$(jq -r .text <<<"$n")" "the tokens make the text"
expect_eq "$(jq -c '[.text_offset, ([.tokens[] | length] | [foreach .[] as $l (0; . + $l)] | [0] + .[:-1])] | .[0] == .[1]' <<<"$lp")" \
    true "text_offset: where each token starts, in characters"
expect_eq "$(jq -c '[.response.body.choices[] | [.index, .text, .finish_reason]]' <<<"$(reply o2)")" \
    "$(jq -c '[.choices[] | [.index, .text, "length"]]' <<<"$(native n2)")" "n 3: iflow's choices, in order"
expect_eq "$(jq -c '.response.body.usage.completion_tokens' <<<"$(reply o2)")" 18 "n 3: usage counts every choice"

# ---- a prompt of token ids (OpenAI's completions take them): as the text's tokens give ----
printf '%s\n' '{"id": "text", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}' \
    '{"id": "ids", "prompt": [1, 403, 407, 261, 378], "max_tokens": 16, "temperature": 0}' \
    '{"custom_id": "oids", "url": "/v1/completions", "body": {"prompt": [1, 403, 407, 261, 378], "max_tokens": 16, "temperature": 0}}' \
    '{"id": "strs", "prompt": ["a", "b"]}' '{"id": "empty", "prompt": []}' '{"id": "neg", "prompt": [1, -2]}' \
    '{"id": "far", "prompt": [1, 512]}' '{"id": "cont", "prompt": [1, 403], "continuation": " upon"}' >"$TMP/ids.jsonl"
B "$TMP/s.ifs" "$TMP/ids.jsonl"
expect_eq "$(jq -c '[.text, .prompt_tokens]' <<<"$(native ids)")" "$(jq -c '[.text, .prompt_tokens]' <<<"$(native text)")" \
    "prompt [1 403 407 261 378]: the text of 'Once upon a time' (its tokens, BOS included)"
expect_eq "$(jq -r '.response.body.choices[0].text' <<<"$(reply oids)")" "$(jq -r .text <<<"$(native text)")" \
    "token ids in an OpenAI completions body"
e() { jq -r --arg i "$1" 'select(.id == $i) | .error' <<<"$out"; }
expect_eq "$(e strs)" \
    "field 'prompt': a list of prompts goes in an OpenAI /v1/completions line, at most 2048 of them (else one prompt a line)" \
    "a list of texts in an iflow line"
expect_eq "$(e empty)" "field 'prompt' must be a string or a list of 1 to 16777216 token ids" "an empty list"
expect_eq "$(e neg)" "field 'prompt' must hold token ids (integers from 0)" "a negative id"
expect_eq "$(e far)" "prompt token 1 is id 512, outside the vocabulary (512)" "an id the model lacks"
expect_eq "$(e cont)" "field 'continuation' goes with a text prompt, not token ids" "a continuation after ids"

# ---- a list of prompts in one completions body (OpenAI's): one reply, the choices prompt by
# prompt (prompt j's choice k at index j * n + k), each as its prompt alone gives it, usage summed;
# a list of id lists too; one bad prompt refuses the line; written in order with --ordered too ----
printf '%s\n' \
    '{"custom_id": "l2", "url": "/v1/completions", "body": {"prompt": ["Once upon", "The dog"], "max_tokens": 5, "n": 2, "temperature": 0}}' \
    '{"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "Once upon", "max_tokens": 5, "temperature": 0}}' \
    '{"custom_id": "b", "url": "/v1/completions", "body": {"prompt": "The dog", "max_tokens": 5, "temperature": 0}}' \
    '{"custom_id": "lids", "url": "/v1/completions", "body": {"prompt": [[1, 403], [1, 500]], "max_tokens": 3, "temperature": 0}}' \
    '{"custom_id": "one", "url": "/v1/completions", "body": {"prompt": ["Once upon"], "max_tokens": 5, "temperature": 0}}' \
    '{"custom_id": "lbad", "url": "/v1/completions", "body": {"prompt": ["Once", [1, -2]], "max_tokens": 2}}' \
    >"$TMP/list.jsonl"
for mode in "" --ordered; do
    B "$TMP/s.ifs" "$TMP/list.jsonl" "$mode"
    expect_rc 0 "a list of prompts $mode"
    expect_eq "$(jq -c '[.response.body.choices[] | [.index, .text]]' <<<"$(reply l2)")" \
        "$(jq -c -n --argjson a "$(reply a)" --argjson b "$(reply b)" \
            '[$a, $a, $b, $b] | to_entries | map([.key, .value.response.body.choices[0].text])')" \
        "two prompts, n 2: four choices, each as its prompt alone $mode"
    expect_eq "$(jq -c '.response.body.usage' <<<"$(reply l2)")" \
        "$(jq -c -n --argjson a "$(reply a)" --argjson b "$(reply b)" '$a.response.body.usage as $x |
            $b.response.body.usage as $y | {prompt_tokens: ($x.prompt_tokens + $y.prompt_tokens),
            completion_tokens: (2 * ($x.completion_tokens + $y.completion_tokens)),
            total_tokens: ($x.prompt_tokens + $y.prompt_tokens + 2 * ($x.completion_tokens + $y.completion_tokens))}')" \
        "two prompts, n 2: usage, the prompts once each $mode"
    expect_eq "$(jq -c '[.response.body.choices[] | .index]' <<<"$(reply lids)")" '[0,1]' "a list of id lists $mode"
    expect_eq "$(jq -r '.response.body.choices[0].text' <<<"$(reply one)")" \
        "$(jq -r '.response.body.choices[0].text' <<<"$(reply a)")" "a list of one prompt $mode"
    expect_eq "$(jq -c '[.response.status_code, .response.body.error.message]' <<<"$(reply lbad)")" \
        '[400,"field '"'"'prompt'"'"' must hold token ids (integers from 0)"]' "a bad prompt in a list refuses the line $mode"
    expect_eq "$(jq -s -c 'map(.custom_id)' <<<"$out" | jq -c 'length')" 6 "one reply a line $mode"
done
[ -z "$mode" ] || expect_eq "$(jq -s -c 'map(.custom_id)' <<<"$out")" '["l2","a","b","lids","one","lbad"]' \
    "--ordered: the lines' replies in input order"

# ---- chat: SmolLM2's own template; logprobs true with top_logprobs ----
msgs='[{"role": "user", "content": "What is the capital of France?"}]'
jq -c -n --argjson m "$msgs" '{id: "n", messages: $m, max_tokens: 10, temperature: 0, logprobs: 2},
    {custom_id: "o", method: "POST", url: "/v1/chat/completions", body: {messages: $m, max_completion_tokens: 10,
    temperature: 0, logprobs: true, top_logprobs: 2, stream: false, user: "u1"}}' >"$TMP/chat.jsonl"
B "$TMP/smol.ifs" "$TMP/chat.jsonl"
n=$(native n) o=$(reply o)
expect_eq "$(jq -c '.response.body | [.id, .object, .model]' <<<"$o")" "[\"chatcmpl-2\",\"chat.completion\",\"$TMP/smol.ifs\"]" \
    "chat: chatcmpl id, chat.completion, the -m argument as the model"
expect_eq "$(jq -c '.response.body.choices[0].message' <<<"$o")" "$(jq -c '{role: "assistant", content: .text}' <<<"$n")" \
    "chat: the assistant's message is iflow's text"
lp=$(jq -c '.response.body.choices[0].logprobs.content' <<<"$o")
expect_eq "$(jq -c '[.[] | [.token, .logprob, (.top_logprobs | map([.token, .logprob]))]]' <<<"$lp")" \
    "$(jq -c '[.logprobs[] | [.token, .logprob, (.top | map([.token, .logprob]))]]' <<<"$n")" \
    "chat logprobs: iflow's tokens, log-probabilities and top 2"
expect_eq "$(jq -c 'map(select(.token | test("^[ -~]*$")) | .bytes == (.token | explode)) | all' <<<"$lp")" true \
    "chat logprobs: an ASCII token's bytes are its characters"
expect_eq "$(jq -c 'map(.bytes | length) == map(.token | @uri | gsub("%[0-9A-F]{2}"; "x") | length)' <<<"$lp")" true \
    "chat logprobs: one byte per UTF-8 byte of the token"

# ---- tool calls: the reference reply's calls (tools.sh), in the message ----
ref=$(head -n 1 tests/fixtures/tools/smollm2.ref.jsonl)
jq -c --argjson tools "$(jq -c . tests/fixtures/tools/tools.json)" '{custom_id: .name, url: "/v1/chat/completions",
    body: {messages: [{role: "user", content: .question}], tools: $tools, tool_choice, parallel_tool_calls: false,
    temperature: 0, max_tokens: 96}}' <<<"$ref" >"$TMP/tools.jsonl"
B "$TMP/smol.ifs" "$TMP/tools.jsonl" "--activations f32 --chat-template tests/fixtures/chat/templates/qwen25.jinja --tool-parser $(jq -r .format <<<"$ref")"
c=$(jq -c '.response.body.choices[0]' <<<"$out")
expect_eq "$(jq -c '[.finish_reason, .message.content, [.message.tool_calls[] | [.type, .function.name, (.function.arguments | fromjson)]]]' <<<"$c")" \
    "$(jq -c '["tool_calls", null, [.calls[] | ["function"] + .]]' <<<"$ref")" "tool calls: the reference's, in OpenAI's message (content null)"

# ---- refused lines: status 400 and the message; the others run ----
cat >"$TMP/bad.jsonl" <<'EOF'
{"custom_id": "e1", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}
{"custom_id": "e2", "method": "GET", "url": "/v1/completions", "body": {"prompt": "x"}}
{"custom_id": "e3", "url": "/v1/completions", "body": {"prompt": "x", "stream": true}}
{"custom_id": "e4", "url": "/v1/completions", "body": {"messages": [{"role": "user", "content": "x"}]}}
{"custom_id": "e5", "url": "/v1/chat/completions", "body": {"prompt": "x"}}
{"custom_id": "e6", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}}
{"custom_id": "e7", "url": "/v1/completions", "body": {"prompt": "x", "continuation": "y"}}
{"custom_id": "e8", "url": "/v1/completions", "body": {"prompt": "x"}, "priority": 1}
{"custom_id": 9, "url": "/v1/completions", "body": {"prompt": "x"}}
{"custom_id": "e10", "url": "/v1/completions", "body": "x"}
{"custom_id": "e11", "url": "/v1/completions", "body": {"prompt": "x", "temprature": 1}}
{"custom_id": "ok", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 2}}
{"custom_id": "e12", "url": "/v1/moderations", "body": {"input": "x"}}
EOF
B "$TMP/smol.ifs" "$TMP/bad.jsonl"
expect_rc 0 "refused lines"
err_of() { jq -r --arg i "$1" 'select(.custom_id == $i) | [.response.status_code, .response.body.error.type,
    .response.body.error.message] | @tsv' <<<"$out"; }
E=$'400\tinvalid_request_error\t'
expect_eq "$(err_of e1)" "${E}url '/v1/embeddings' needs an encoder model (a BERT-like one) and iflow-run --embed --batch" \
    "embeddings from a decoder"
expect_eq "$(err_of e12)" "${E}field 'url' must be \"/v1/chat/completions\", \"/v1/completions\" or \"/v1/embeddings\"" \
    "an API iflow has not"
expect_eq "$(err_of e2)" "${E}field 'method' must be \"POST\"" "method GET"
expect_eq "$(err_of e3)" "${E}field 'stream': a batch line's reply is not streamed (false or absent)" "stream true"
expect_eq "$(err_of e4)" "${E}url '/v1/completions': the body needs 'prompt' (a string or token ids)" "completions with messages"
expect_eq "$(err_of e5)" "${E}url '/v1/chat/completions': the body needs 'messages'" "chat with a prompt"
expect_eq "$(err_of e6)" "${E}field 'top_logprobs' goes with 'logprobs': true" "top_logprobs alone"
expect_eq "$(err_of e7)" "${E}field 'continuation' is iflow's own: give it in an iflow request line, not an OpenAI batch line" \
    "continuation"
expect_eq "$(err_of e8)" "${E}unknown field 'priority' of an OpenAI batch line (custom_id, method, url, body)" "an unknown envelope field"
expect_eq "$(jq -r 'select(.custom_id == 9) | .response.body.error.message' <<<"$out")" \
    "an OpenAI batch line needs a string 'custom_id'" "custom_id not a string"
expect_eq "$(err_of e10)" "${E}field 'body' must be an object: the request" "body not an object"
expect_eq "$(err_of e11)" "${E}unknown field 'temprature' (see iflow-run(1), BATCH GENERATION)" "a misspelt body field"
expect_eq "$(jq -c 'select(.custom_id == "ok") | [.response.status_code, .response.body.usage.completion_tokens]' <<<"$out")" \
    '[200,2]' "the good line ran"

# ---- echo (completions): the prompt first, in the text and in the logprobs ----
# lm-eval's loglikelihood asks max_tokens 0, echo and logprobs: the prompt's tokens' logprobs are
# iflow's prompt_logprobs of the same prompt (the first null); with generation, the text is the
# prompt then what the same request generates without echo
cat >"$TMP/echo.jsonl" <<'EOF'
{"custom_id": "score", "url": "/v1/completions", "body": {"prompt": "Once upon a time", "max_tokens": 0, "echo": true, "logprobs": 1}}
{"id": "n-score", "prompt": "Once upon a time", "max_tokens": 1, "prompt_logprobs": 1, "temperature": 0}
{"custom_id": "gen", "url": "/v1/completions", "body": {"prompt": "Once upon a time", "max_tokens": 6, "echo": true, "logprobs": 0, "temperature": 0}}
{"id": "n-gen", "prompt": "Once upon a time", "max_tokens": 6, "logprobs": 1, "temperature": 0}
{"custom_id": "e-ids", "url": "/v1/completions", "body": {"prompt": [1, 403], "echo": true}}
{"custom_id": "e-zero", "url": "/v1/completions", "body": {"prompt": "Once", "max_tokens": 0}}
EOF
B "$TMP/s.ifs" "$TMP/echo.jsonl"
expect_rc 0 "echo lines"
sc=$(reply score) ns=$(native n-score) g=$(reply gen) ng=$(native n-gen)
expect_eq "$(jq -c '.response.body.choices[0] | [.text, .finish_reason]' <<<"$sc")" '["Once upon a time","length"]' \
    "echo, max_tokens 0: the prompt alone"
expect_eq "$(jq -c '.response.body.choices[0].logprobs.token_logprobs' <<<"$sc")" \
    "$(jq -c '[.prompt_logprobs[].logprob]' <<<"$ns")" "echo: the prompt's logprobs are iflow's prompt_logprobs"
expect_eq "$(jq -c '.response.body.choices[0].logprobs.tokens' <<<"$sc")" "$(jq -c '[.prompt_logprobs[].token]' <<<"$ns")" \
    "echo: the prompt's tokens"
expect_eq "$(jq -c '.response.body.usage' <<<"$sc")" '{"prompt_tokens":5,"completion_tokens":0,"total_tokens":5}' \
    "echo, max_tokens 0: usage"
expect_eq "$(jq -r '.response.body.choices[0].text' <<<"$g")" "Once upon a time$(jq -r .text <<<"$ng")" \
    "echo with generation: the prompt, then the text"
expect_eq "$(jq -c '.response.body.choices[0].logprobs.token_logprobs[5:]' <<<"$g")" "$(jq -c '[.logprobs[].logprob]' <<<"$ng")" \
    "echo with generation: the completion's logprobs after the prompt's"
expect_eq "$(jq -c '.response.body.choices[0].logprobs.token_logprobs | length' <<<"$g")" 11 "5 prompt and 6 new tokens"
# text_offset indexes the echoed text: SentencePiece's dummy prefix (" Once" for "Once") is not in
# it, so every token after the first starts where its text is, and the first at 0
expect_eq "$(jq -c '.response.body.choices[0] | .text as $t | .logprobs | [.tokens, .text_offset] | transpose
    | [.[2:][] | .[0] as $k | $t[.[1]:.[1] + ($k | length)] == $k] | all' <<<"$g")" true \
    "echo: each token's text_offset is where its text starts in the echoed text"
expect_eq "$(jq -c '.response.body.choices[0].logprobs.text_offset[:4]' <<<"$g")" '[0,0,4,9]' \
    "echo: text_offset of <s>, \" Once\", \" upon\", \" a\" in \"Once upon a time\""
expect_eq "$(jq -r '.response.body.error.message' <<<"$(reply e-ids)")" "field 'echo' goes with a text prompt, not token ids" \
    "echo of token ids: refused"
expect_eq "$(jq -r '.response.body.error.message' <<<"$(reply e-zero)")" \
    "max_tokens is 0; it must be at least 1 (0 only to score a prompt)" "max_tokens 0 without echo: refused"
summary
