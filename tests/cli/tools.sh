#!/usr/bin/env bash
# tests/cli/tools.sh -- reading a chat reply's parts in iflow-run --batch: tool calls ("tools",
# "tool_choice", "parallel_tool_calls", --tool-parser, and the results' "content", "tool_calls" and
# finish reason "tool_calls") and reasoning (--reasoning-parser, "reasoning_content"). SmolLM2-135M-Instruct through Qwen2.5's chat template against an independent
# reference (tests/fixtures/tools/smollm2.ref.jsonl, tests/fixtures/gen_tools_smollm2.py: the
# float64 forward of gen_chat_smollm2.py, each step's allowed tokens found by Python's `regex`
# module from a hand-written expression of the call's language): the reply's tokens (every
# margin is above 0.06, so all of them are compared: --activations f32 keeps logits within 2e-3
# of float64 here), why it ended, and its calls, read by jq, equal to the reference's read by
# Python's json. Replies without a constraint are read out when they hold calls; errors are pinned.
. "$(dirname "$0")/lib.sh"
F=tests/fixtures/tools
QWEN=tests/fixtures/chat/templates/qwen25.jinja
SMOL=$DATA/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$SMOL" ] || { bad "missing $SMOL"; summary; exit 1; }
$BIN/iflow-convert "$SMOL" -o "$TMP/smol.ifs" || { bad "convert smollm2"; summary; exit 1; }
TOOLS=$(jq -c . $F/tools.json)

# ---- tool_choice "required" and a named function: the reference's reply and calls ----
while IFS= read -r ref; do
    name=$(jq -r .name <<<"$ref") fmt=$(jq -r .format <<<"$ref")
    jq -c --argjson tools "$TOOLS" '{id: .name, messages: [{role: "user", content: .question}], tools: $tools,
        tool_choice, parallel_tool_calls: false, temperature: 0, max_tokens: 96, logprobs: 0}' <<<"$ref" >"$TMP/req.jsonl"
    run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --activations f32 --chat-template $QWEN \
        --tool-parser $fmt <'$TMP/req.jsonl'"
    expect_rc 0 "$name"
    expect_eq "$(jq -c .prompt_tokens <<<"$out")" "$(jq -c '.ids | length' <<<"$ref")" "$name: the prompt's tokens"
    expect_eq "$(jq -c '[.logprobs[].id]' <<<"$out")" "$(jq -c .greedy_ids <<<"$ref")" "$name: the reference's reply"
    expect_eq "$(jq -r .text <<<"$out")" "$(jq -r .text <<<"$ref")" "$name: its text"
    expect_eq "$(jq -c '[.finish_reason, .content]' <<<"$out")" '["tool_calls",""]' \
        "$name: a call and nothing else (the reference: $(jq -r .finish <<<"$ref"))"
    expect_eq "$(jq -c '[.tool_calls[] | [.function.name, (.function.arguments | fromjson)]]' <<<"$out")" \
        "$(jq -c .calls <<<"$ref")" "$name: the calls"
    expect_eq "$(jq -c '[.tool_calls[] | [.type, (.id | test("^[A-Za-z0-9]{9}$"))]]' <<<"$out")" '[["function",true]]' \
        "$name: OpenAI's shape, a nine-character id"
done <$F/smollm2.ref.jsonl

# ---- several calls: parallel_tool_calls true lets a reply go on after one; the calls stay whole ----
jq -c -n --argjson tools "$TOOLS" '{id: "p", messages: [{role: "user", content: "Weather in Paris and Rome?"}],
    tools: $tools, tool_choice: "required", temperature: 0.7, seed: 3, max_tokens: 400}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --chat-template $QWEN <'$TMP/req.jsonl'"
expect_rc 0 "parallel calls"
r=$(jq -r .finish_reason <<<"$out")
if [ "$r" = tool_calls ]; then
    n=$(jq '.tool_calls | length' <<<"$out")
    expect_eq "$(jq -r '[.text | scan("<tool_call>")] | length' <<<"$out")" "$n" "every block a call ($n)"
    expect_eq "$(jq -c '[.tool_calls[].function | (.arguments | fromjson | type)] | unique' <<<"$out")" '["object"]' \
        "arguments are objects"
else
    expect_eq "$r" length "parallel calls: cut by max_tokens, or calls ($r)"
fi
# a named function is called once, parallel_tool_calls or not (the grammar ends after one call)
jq -c -n --argjson tools "$TOOLS" '{id: "n", messages: [{role: "user", content: "Weather in Paris and Rome?"}],
    tools: $tools, tool_choice: {type: "function", function: {name: "get_weather"}}, parallel_tool_calls: true,
    temperature: 0.7, seed: 3, max_tokens: 400}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --chat-template $QWEN <'$TMP/req.jsonl'"
expect_eq "$(jq -c '[.finish_reason, (.tool_calls | length), .tool_calls[0].function.name]' <<<"$out")" \
    '["tool_calls",1,"get_weather"]' "a named function: one call, then the end"

# ---- tool_choice "auto" (the default): a reply with calls is read, one without is content ----
# The model's replies are its own; the test gives the assistant's turn with a grammar of the two
# shapes instead: a sentence, or a call.
jq -c -n --argjson tools "$TOOLS" '
    {id: "call", messages: [{role: "user", content: "Weather in Oslo?"}], tools: $tools, temperature: 0,
     grammar: "root ::= \"Let me look.\\n<tool_call>\\n{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": {\\\"city\\\": \\\"Oslo\\\"}}\\n</tool_call>\""},
    {id: "text", messages: [{role: "user", content: "Hi!"}], tools: $tools, temperature: 0, grammar: "root ::= \"Hello there.\""},
    {id: "none", messages: [{role: "user", content: "Weather in Oslo?"}], tools: $tools, tool_choice: "none",
     temperature: 0, grammar: "root ::= \"<tool_call>\\n{\\\"name\\\": \\\"get_weather\\\"}\\n</tool_call>\""},
    {id: "cut", messages: [{role: "user", content: "Weather in Oslo?"}], tools: $tools, temperature: 0, max_tokens: 6,
     grammar: "root ::= \"<tool_call>\\n{\\\"name\\\": \\\"get_weather\\\", \\\"arguments\\\": {}}\\n</tool_call>\""},
    {id: "plain", prompt: "Once upon a time", temperature: 0, max_tokens: 4}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --chat-template $QWEN <'$TMP/req.jsonl'"
expect_rc 0 "auto"
expect_eq "$(jq -c 'select(.id == "call") | [.finish_reason, .content, [.tool_calls[].function | [.name, .arguments]]]' <<<"$out")" \
    '["tool_calls","Let me look.",[["get_weather","{\"city\":\"Oslo\"}"]]]' "auto: the call read, the text before it content"
expect_eq "$(jq -c 'select(.id == "text") | [.finish_reason, .content, .tool_calls]' <<<"$out")" \
    '["grammar","Hello there.",[]]' "auto: no call, the whole text content"
expect_eq "$(jq -c 'select(.id == "none") | [.finish_reason, has("content"), has("tool_calls")]' <<<"$out")" \
    '["grammar",false,false]' "\"none\": nothing read"
expect_eq "$(jq -c 'select(.id == "cut") | [.finish_reason, .tool_calls, (.content == .text)]' <<<"$out")" \
    '["length",[],true]' "a call cut by max_tokens: not read, the text is content"
expect_eq "$(jq -c 'select(.id == "plain") | [has("content"), has("tool_calls")]' <<<"$out")" '[false,false]' \
    "a request without tools: no such fields"

# ---- a conversation that goes on after a call: arguments as JSON text (OpenAI's) or as an object
# render alike; the model's own template (SmolLM2's names no format): tools shown, nothing read ----
mk() { # $1: the arguments as JSON
    jq -c -n --argjson tools "$TOOLS" --argjson args "$1" '{messages: [{role: "user", content: "Weather in Oslo?"},
        {role: "assistant", content: null, tool_calls: [{id: "abcdefghi", type: "function",
         function: {name: "get_weather", arguments: $args}}]},
        {role: "tool", tool_call_id: "abcdefghi", content: "{\"temp\": 4}"}], tools: $tools, temperature: 0,
        max_tokens: 8, prompt_logprobs: 0}'
}
{ mk '{"city": "Oslo"}'; mk '"{\"city\": \"Oslo\"}"'; } >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --chat-template $QWEN <'$TMP/req.jsonl'"
expect_rc 0 "history with a call"
expect_eq "$(jq -s -c 'map([.prompt_logprobs[].id]) | (.[0] == .[1])' <<<"$out")" true \
    "arguments as text or as an object: the same prompt"
expect_match "$(jq -s -r '.[0].prompt_logprobs | map(.token // "") | join("")' <<<"$out")" \
    '"arguments": \{"city": "Oslo"\}' "the template wrote the arguments as an object"
jq -c -n --argjson tools "$TOOLS" '{messages: [{role: "user", content: "Weather?"}], tools: $tools,
    temperature: 0, max_tokens: 4}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch -v <'$TMP/req.jsonl'"
expect_eq "$(jq -c '[has("content"), has("tool_calls")]' <<<"$out")" '[false,false]' \
    "a template that names no format: nothing read"
expect_match "$err" "tool calls: none \(the chat template's\); reasoning: none" "-v says which format"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch -v --chat-template $QWEN </dev/null"
expect_match "$err" "tool calls: hermes \(the chat template's\)" "-v: Qwen2.5's template names hermes"

# ---- reasoning: a <think> block is "reasoning_content", the rest "content" (the replies forced by
# grammars, as above) ----
R1=tests/fixtures/chat/templates/deepseek-r1.jinja
g() { jq -c -n --arg t "$1" '"root ::= " + ($t | tojson)'; }
jq -c -n --argjson g1 "$(g $'Let me add. 2+2=4.\n</think>\n\nThe answer is 4.')" '
    {id: "r1", messages: [{role: "user", content: "2+2?"}], temperature: 0, grammar: $g1},
    {id: "cut", messages: [{role: "user", content: "2+2?"}], temperature: 0, max_tokens: 3, grammar: $g1},
    {id: "plain", prompt: "2+2?", temperature: 0, max_tokens: 2}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch -v --grammar-in-reasoning --chat-template $R1 <'$TMP/req.jsonl'"
expect_rc 0 "reasoning"
expect_match "$err" "reasoning: think \(the chat template's\)" "-v: DeepSeek-R1's template names <think>"
expect_eq "$(jq -c 'select(.id == "r1") | [.reasoning_content, .content, .finish_reason]' <<<"$out")" \
    '["Let me add. 2+2=4.","The answer is 4.","grammar"]' "the prompt opened the block: reasoning, then the answer"
expect_eq "$(jq -c 'select(.id == "cut") | [(.reasoning_content | length > 0), .reasoning_content == .text, .content,
    .finish_reason]' <<<"$out")" '[true,true,"","length"]' "cut inside the block: all reasoning, no answer"
expect_eq "$(jq -c 'select(.id == "plain") | [has("reasoning_content"), has("content")]' <<<"$out")" '[false,false]' \
    "a plain prompt: no such fields"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --reasoning-parser none --chat-template $R1 <'$TMP/req.jsonl'"
expect_eq "$(jq -c 'select(.id == "r1") | [has("reasoning_content"), has("content")]' <<<"$out")" '[false,false]' \
    "--reasoning-parser none"
# a template that does not name <think>, the parser asked for; with tools, the calls come from the answer
jq -c -n --argjson tools "$TOOLS" --argjson g1 "$(g $'<think>Paris? The weather tool.</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')" \
    --argjson g2 "$(g 'Four.')" '
    {id: "t", messages: [{role: "user", content: "Weather in Paris?"}], tools: $tools, temperature: 0, grammar: $g1},
    {id: "n", messages: [{role: "user", content: "2+2?"}], temperature: 0, grammar: $g2}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --reasoning-parser qwen3 --grammar-in-reasoning --chat-template $QWEN <'$TMP/req.jsonl'"
expect_eq "$(jq -c 'select(.id == "t") | [.reasoning_content, .content, .finish_reason, [.tool_calls[].function.name]]' <<<"$out")" \
    '["Paris? The weather tool.","","tool_calls",["get_weather"]]' "reasoning, then a call"
expect_eq "$(jq -c 'select(.id == "n") | [.reasoning_content, .content]' <<<"$out")" '[null,"Four."]' \
    "no block: reasoning_content null, the whole reply content"
# by default a constraint waits for </think> (as vLLM's structured outputs do): SmolLM2 never
# closes the block the R1 template opens, so the reply is the free one, all reasoning
jq -c -n --argjson g2 "$(g 'Four.')" '{id: "d", messages: [{role: "user", content: "2+2?"}], temperature: 0,
    max_tokens: 24, grammar: $g2}, {id: "f", messages: [{role: "user", content: "2+2?"}], temperature: 0,
    max_tokens: 24}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --chat-template $R1 <'$TMP/req.jsonl'"
expect_eq "$(jq -s -c 'map(.text) | [.[0] == .[1], (.[0] | length > 5)]' <<<"$out")" '[true,true]' \
    "the constraint waits for </think>: the free reply"
expect_eq "$(jq -c 'select(.id == "d") | [.content, .finish_reason]' <<<"$out")" '["","length"]' \
    "all of it reasoning, no answer yet"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --reasoning-parser none --chat-template $R1 <'$TMP/req.jsonl'"
expect_eq "$(jq -r 'select(.id == "d") | .text' <<<"$out")" "Four." "no reasoning parser: the constraint from the start"
run $BIN/iflow-run -m "$TMP/smol.ifs" -p x --grammar-in-reasoning
expect_rc 2 "--grammar-in-reasoning without --batch"
run $BIN/iflow-run -m "$TMP/smol.ifs" --batch --reasoning-parser o1
expect_eq "$err" "iflow-run: --reasoning-parser must be auto, think, deepseek_r1, qwen3 or none, not 'o1'
Try 'iflow-run --help' for more information." "an unknown --reasoning-parser"
run $BIN/iflow-run -m "$TMP/smol.ifs" -p x --reasoning-parser think
expect_eq "$err" "iflow-run: --reasoning-parser goes with --batch (its requests' \"messages\")
Try 'iflow-run --help' for more information." "--reasoning-parser without --batch"

# ---- errors: one result line each, the others go on ----
jq -c -n --argjson tools "$TOOLS" '
    {id: 1, messages: [{role: "user", content: "x"}], tool_choice: "required"},
    {id: 2, messages: [{role: "user", content: "x"}], tools: $tools, tool_choice: "sometimes"},
    {id: 3, messages: [{role: "user", content: "x"}], tools: $tools, tool_choice: {type: "function", function: {name: "nope"}}},
    {id: 4, messages: [{role: "user", content: "x"}], tools: $tools, tool_choice: "required", regex: "a"},
    {id: 5, messages: [{role: "user", content: "x"}], tools: $tools, tool_choice: "required", beams: 2},
    {id: 6, messages: [{role: "user", content: "x"}], tools: $tools, parallel_tool_calls: 1},
    {id: 7, messages: [{role: "user", content: "x"}], tools: [{type: "function", function: {name: "f",
     parameters: {type: "object", properties: {a: {type: "string", not: {}}}}}}], tool_choice: "required"},
    {id: 8, messages: [{role: "user", content: "x"}], tools: [{type: "code"}], tool_choice: "required"},
    {id: 9, prompt: "x", tool_choice: "auto"},
    {id: 10, messages: [{role: "user", content: "x"}], tools: $tools, tool_choice: "auto", max_tokens: 1}' >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --chat-template $QWEN <'$TMP/req.jsonl'"
expect_rc 0 "a batch with bad requests"
e() { jq -r "select(.id == $1) | .error" <<<"$out"; }
expect_eq "$(e 1)" "fields 'tool_choice' and 'parallel_tool_calls' go with 'tools'" "tool_choice without tools"
expect_eq "$(e 2)" "field 'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}" \
    "an unknown tool_choice"
expect_eq "$(e 3)" "field 'tool_choice': no tool is named 'nope'" "a function that is not a tool"
expect_eq "$(e 4)" "field 'tool_choice' \"required\" or a function constrains the reply: it does not go with another constraint" \
    "with another constraint"
expect_eq "$(e 5)" "field 'tool_choice' \"required\" or a function constrains the reply: it does not go with 'beams'" \
    "with beams"
expect_eq "$(e 6)" "field 'parallel_tool_calls' must be true or false" "parallel_tool_calls not a boolean"
expect_match "$(e 7)" "^field 'tool_choice': tool 0 \('f'\): parameters: json schema: .*at /properties/a$" \
    "parameters that cannot be enforced: the tool and where"
expect_eq "$(e 8)" "field 'tool_choice': tool 0 is not {\"type\": \"function\", \"function\": {...}}" "a tool of another type"
expect_eq "$(e 9)" "fields 'tool_choice' and 'parallel_tool_calls' go with 'tools'" "tool_choice with a prompt"
expect_eq "$(jq -c 'select(.id == 10) | has("tool_calls")' <<<"$out")" true "the good request ran"
jq -c -n --argjson tools "$TOOLS" '{messages: [{role: "user", content: "x"}], tools: $tools, tool_choice: "required",
    parallel_tool_calls: false}' \
    >"$TMP/req.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch <'$TMP/req.jsonl'"
expect_eq "$(jq -r .error <<<"$out")" \
    "field 'tool_choice': the chat template names no tool-call format; give one with --tool-parser (hermes, llama3_json, mistral, granite, pythonic)" \
    "a template without a format: tool_choice asks for --tool-parser"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --tool-parser hermes <'$TMP/req.jsonl'"
expect_eq "$(jq -r .finish_reason <<<"$out")" "tool_calls" "--tool-parser names it"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --tool-parser pythonic <'$TMP/req.jsonl'"
expect_eq "$(jq -r .error <<<"$out")" \
    "field 'tool_choice': a required or named call in format pythonic is not supported yet (tool_choice \"auto\" reads its calls)" \
    "pythonic: no constrained call yet"
run $BIN/iflow-run -m "$TMP/smol.ifs" --batch --tool-parser xml
expect_rc 2 "--tool-parser xml"
expect_eq "$err" "iflow-run: --tool-parser must be auto, hermes, llama3_json, mistral, granite, pythonic or none, not 'xml'
Try 'iflow-run --help' for more information." "an unknown --tool-parser"
run $BIN/iflow-run -m "$TMP/smol.ifs" -p x --tool-parser hermes
expect_rc 2 "--tool-parser without --batch"
expect_eq "$err" "iflow-run: --tool-parser goes with --batch (its requests give \"tools\")
Try 'iflow-run --help' for more information." "--tool-parser without --batch"
summary
