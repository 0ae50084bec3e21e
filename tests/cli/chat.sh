#!/usr/bin/env bash
# Chat templates: iflow-convert keeps a checkpoint's template in the shard (a GGUF key,
# tokenizer_config.json's string or named list, chat_template.jinja first); iflow-run --chat and
# --batch "messages" render it as transformers does. SmolLM2-135M-Instruct end to end against an
# independent reference (tests/fixtures/chat/smollm2.ref.jsonl, tests/fixtures/gen_chat_smollm2.py:
# jinja2 in transformers' environment, Hugging Face tokenizers, a float64 forward of the GGUF's
# exactly dequantized weights): the rendered prompt and its ids exactly, the greedy reply token by
# token up to the first step whose top-two logit margin is below 0.02 (the F32 path, --activations
# f32, keeps logits within 2e-3 of float64 here: tests/unit/test_gguf_model.c). Llama 2, Mistral
# and Zephyr templates over stories260K's SentencePiece-style vocabulary: the prompt's ids those of
# Hugging Face tokenizers (tests/fixtures/gen_chat_ids.py). Errors: no template,
# a template that does not parse, a template's raise_exception, messages that are not a chat.
# OpenAI's content parts: the texts joined as vLLM joins them (the reference's ids), other parts refused.
. "$(dirname "$0")/lib.sh"
F=tests/fixtures/chat
SMOL=$DATA/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$SMOL" ] || { bad "missing $SMOL"; summary; exit 1; }
$BIN/iflow-convert "$SMOL" -o "$TMP/smol.ifs" || { bad "convert smollm2"; summary; exit 1; }
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" || { bad "convert stories260K"; summary; exit 1; }

# ---- the GGUF's template travels in the shard, byte for byte ----
run $BIN/iflow-convert --info "$TMP/smol.ifs" --json
expect_eq "$(jq -c .meta.chat_template <<<"$out")" '{"record":"chat_template","from":"tokenizer.chat_template"}' \
    "meta names the template and where it came from"
expect_eq "$(jq -r '.records[] | select(.name == "chat_template") | .bytes' <<<"$out")" \
    "$(printf '%s' "$(cat $F/templates/smollm2.jinja)" | wc -c)" "the record holds the template"
run $BIN/iflow-convert --info "$TMP/smol.ifs"
expect_match "$out" $'\nchat template: from tokenizer.chat_template, [0-9]+ bytes\n' "--info says it"

# ---- --chat: the prompt and ids of the reference, then its greedy reply ----
# the reply's ids must equal the reference's up to the first step with a margin below 0.02 (ours
# never hold the ending EOS, the reference's do)
agree() { # $1: our ids (JSON), $2: the reference line
    jq -cn --argjson got "$1" --argjson ref "$2" \
        '($ref.greedy_ids | if .[-1] == 2 then .[:-1] else . end) as $want
         | ([($ref.margin | to_entries | map(select(.value < 0.02)) | .[0].key // 1e9), ($want | length)] | min) as $n
         | [$n, ($got[:$n] == $want[:$n])]'
}
for name in A B; do
    ref=$(jq -c --arg n $name 'select(.name == $n)' $F/smollm2.ref.jsonl)
    user=$(jq -r '.messages[] | select(.role == "user") | .content' <<<"$ref")
    sys=$(jq -r '.messages[] | select(.role == "system") | .content' <<<"$ref")
    run $BIN/iflow-run -m "$TMP/smol.ifs" --chat ${sys:+--system "$sys"} -p "$user" --temp 0 -n 48 \
        --activations f32 --json
    expect_rc 0 "--chat $name"
    expect_eq "$(jq -r .prompt <<<"$out")" "$(jq -r .text <<<"$ref")" "$name: the rendered conversation (jinja2's)"
    expect_eq "$(jq -c .prompt_ids <<<"$out")" "$(jq -c .ids <<<"$ref")" "$name: its ids (Hugging Face tokenizers')"
    a=$(agree "$(jq -c .gen_ids <<<"$out")" "$ref")
    expect_match "$a" '^\[[0-9]+,true\]$' "$name: the greedy reply of the float64 reference ([tokens compared, equal])"
done
expect_eq "$(jq -r .text <<<"$out" | head -c 40)" "The sky is blue because of a process cal" "B: the reply's text"
# A reply ends at the model's end of turn (<|im_end|>, its EOS)
run $BIN/iflow-run -m "$TMP/smol.ifs" --chat -p "What is the capital of France?" --temp 0 -n 48 --json
expect_eq "$(jq -r '[.text, .stop] | @tsv' <<<"$out")" "The capital of France is Paris.	eos" "A: the reply, ended by EOS"
# the GGUF file itself, converted on the fly, has its template too
run $BIN/iflow-run -m "$SMOL" --chat -p "What is the capital of France?" --temp 0 -n 48
expect_eq "$out" "The capital of France is Paris." "--chat straight from the GGUF"

# ---- --batch: whole conversations as "messages" (C has turns of both sides) ----
jq -c '{id: .name, messages, max_tokens: 48, temperature: 0, logprobs: 0}' $F/smollm2.ref.jsonl >"$TMP/chats.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch --activations f32 <'$TMP/chats.jsonl'"
expect_rc 0 "--batch with messages"
for name in A B C; do
    ref=$(jq -c --arg n $name 'select(.name == $n)' $F/smollm2.ref.jsonl)
    res=$(jq -c --arg n $name 'select(.id == $n)' <<<"$out")
    expect_eq "$(jq .prompt_tokens <<<"$res")" "$(jq '.ids | length' <<<"$ref")" "batch $name: the prompt's tokens"
    a=$(agree "$(jq -c '[.logprobs[].id]' <<<"$res")" "$ref")
    expect_match "$a" '^\[[0-9]+,true\]$' "batch $name: the greedy reply of the float64 reference"
done

# ---- OpenAI's content parts: their texts joined by newlines, as vLLM gives them to a template
# that reads strings (SmolLM2's); other parts refused ----
ref=$(jq -c 'select(.name == "A")' $F/smollm2.ref.jsonl)
jq -c '{id: "parts", messages: [.messages[] | .content = [{type: "text", text: .content}]], max_tokens: 1, prompt_logprobs: 0},
    {id: "two", messages: [{role: "user", content: [{type: "text", text: "Why is"}, {type: "text", text: "the sky blue?"}]}],
     max_tokens: 1, prompt_logprobs: 0},
    {id: "joined", messages: [{role: "user", content: "Why is\nthe sky blue?"}], max_tokens: 1, prompt_logprobs: 0},
    {id: "image", messages: [{role: "user", content: [{type: "text", text: "x"}, {type: "image_url", image_url: {url: "y"}}]}]},
    {id: "notext", messages: [{role: "user", content: [{type: "text"}]}]}' <<<"$ref" >"$TMP/parts.jsonl"
run bash -c "$BIN/iflow-run -m '$TMP/smol.ifs' --batch <'$TMP/parts.jsonl'"
expect_eq "$(jq -c 'select(.id == "parts") | [.prompt_logprobs[].id]' <<<"$out")" "$(jq -c .ids <<<"$ref")" \
    "contents as one text part each: the reference's ids"
expect_eq "$(jq -c 'select(.id == "two") | [.prompt_logprobs[].id]' <<<"$out")" \
    "$(jq -c 'select(.id == "joined") | [.prompt_logprobs[].id]' <<<"$out")" "two text parts: the texts joined by a newline"
expect_eq "$(jq -r 'select(.id == "image") | .error' <<<"$out")" "message 0: content part 1 is of type 'image_url': iflow reads text only" \
    "an image part"
expect_eq "$(jq -r 'select(.id == "notext") | .error' <<<"$out")" 'message 0: content part 0 is not {"type": "text", "text": a string}' \
    "a text part without its text"

# ---- templates that write <s> and </s> as text, over a SentencePiece-style vocabulary: the prompt's
# ids are those of Hugging Face tokenizers on jinja2's text (tests/fixtures/gen_chat_ids.py) ----
while IFS= read -r ref; do
    t=$(jq -r .template <<<"$ref") c=$(jq -r .conversation <<<"$ref")
    jq -c --arg c "$c" '.[] | select(.name == $c) | {messages, max_tokens: 1, prompt_logprobs: 0}' \
        $F/conversations.json >"$TMP/req.jsonl"
    run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --chat-template $F/templates/$t.jinja <'$TMP/req.jsonl'"
    expect_eq "$(jq -c '[.prompt_logprobs[].id]' <<<"$out")" "$(jq -c .ids <<<"$ref")" "$t, $c: the ids of HF tokenizers"
done <$F/stories260K.ids.jsonl

# ---- where a Hugging Face directory keeps its template ----
mkdir -p "$TMP/hf"
cp "$DATA"/models/stories260K/hf/* "$TMP/hf/"
tc=$DATA/models/stories260K/hf/tokenizer_config.json
jq '. + {chat_template: "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"}' "$tc" >"$TMP/hf/tokenizer_config.json"
$BIN/iflow-convert "$TMP/hf" -o "$TMP/t1.ifs" || bad "convert with a string template"
run $BIN/iflow-run -m "$TMP/t1.ifs" --chat --system "Be brief." -p "Once upon a time" -n 0 --json
expect_eq "$(jq -c .prompt <<<"$out")" '"[system] Be brief.\n[user] Once upon a time\n"' "tokenizer_config.json's string"
ids=$(jq -j .prompt <<<"$out" | $BIN/iflow-run -m "$TMP/t1.ifs" --tokenize --json | jq -c .ids)
expect_eq "$(jq -c .prompt_ids <<<"$out")" "$ids" "the rendered text's tokens, no BOS added"
jq '. + {chat_template: [{name: "tool_use", template: "T{{ messages | length }}"},
                         {name: "default", template: "D{{ messages[0].content }}"}]}' "$tc" >"$TMP/hf/tokenizer_config.json"
$BIN/iflow-convert "$TMP/hf" -o "$TMP/t2.ifs" || bad "convert with a list of templates"
run $BIN/iflow-run -m "$TMP/t2.ifs" --chat -p "Once" -n 0 --json
expect_eq "$(jq -r .prompt <<<"$out")" "DOnce" "a list of templates: the one named default"
printf '{{ bos_token }}J:{{ messages[-1].content }}' >"$TMP/hf/chat_template.jinja"
$BIN/iflow-convert "$TMP/hf" -o "$TMP/t3.ifs" || bad "convert with chat_template.jinja"
run $BIN/iflow-run -m "$TMP/t3.ifs" --chat -p "Once" -n 0 --json
expect_eq "$(jq -c '[.prompt, .prompt_ids[0]]' <<<"$out")" '["<s>J:Once",1]' \
    "chat_template.jinja before tokenizer_config.json; bos_token is the BOS, read as the special token"
run $BIN/iflow-convert --info "$TMP/t3.ifs" --json
expect_eq "$(jq -r .meta.chat_template.from <<<"$out")" "chat_template.jinja" "meta: from chat_template.jinja"

# ---- errors ----
run $BIN/iflow-run -m "$TMP/s.ifs" --chat -p "Once"
expect_rc 1 "--chat without a template"
expect_eq "$err" "iflow-run: model '$TMP/s.ifs' has no chat template: give one with --chat-template" \
    "--chat without a template: the message"
printf 'Hi {%% if messages %%}\n{{ messages[0].content }' >"$TMP/bad.jinja"
run $BIN/iflow-run -m "$TMP/s.ifs" --chat --chat-template "$TMP/bad.jinja" -p "Once"
expect_rc 1 "a template that does not parse"
expect_match "$err" "^iflow-run: chat template '$TMP/bad.jinja' line 2, column [0-9]+: " "its message names the line"
expect_one_line "a template that does not parse"
run $BIN/iflow-run -m "$TMP/t1.ifs" --chat --system $'bad \xff' -p "Once"
expect_rc 1 "--system text that is not UTF-8"
expect_eq "$err" "iflow-run: --system's text is not valid UTF-8, so it cannot be a chat message" \
    "--system text that is not UTF-8: refused, not dropped"
run $BIN/iflow-run -m "$TMP/s.ifs" --system "x" -p "Once"
expect_rc 2 "--system without --chat"
expect_eq "$(head -n 1 <<<"$err")" "iflow-run: --system goes with --chat" "--system without --chat: the message"

# in a batch: a model without a template, a template's raise_exception, messages that are not a
# chat; the other requests go on
cat >"$TMP/bad.jsonl" <<'EOF'
{"id":"ok","messages":[{"role":"user","content":"Once"}],"max_tokens":2}
{"id":"alt","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}],"max_tokens":2}
{"id":"norole","messages":[{"content":"a"}],"max_tokens":2}
{"id":"both","prompt":"x","messages":[{"role":"user","content":"a"}]}
{"id":"agp","prompt":"x","add_generation_prompt":false}
{"id":"plain","prompt":"Once","max_tokens":2}
EOF
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch <'$TMP/bad.jsonl'"
expect_rc 0 "a batch of chats without a template"
expect_eq "$(jq -r 'select(.id == "ok") | .error' <<<"$out")" \
    "field 'messages' needs a chat template: model '$TMP/s.ifs' has no chat template: give one with --chat-template" \
    "messages without a template"
expect_eq "$(jq -r 'select(.id == "plain") | .finish_reason' <<<"$out")" "length" "a prompt runs on"
run bash -c "$BIN/iflow-run -m '$TMP/s.ifs' --batch --chat-template $F/templates/mistral.jinja <'$TMP/bad.jsonl'"
expect_rc 0 "a batch of chats with --chat-template"
expect_eq "$(jq -r 'select(.id == "ok") | .completion_tokens' <<<"$out")" "2" "a chat request"
expect_eq "$(jq -r 'select(.id == "alt") | .error' <<<"$out")" \
    "chat template '$F/templates/mistral.jinja': After the optional system message, conversation roles must alternate user/assistant/user/assistant/..." \
    "the template's raise_exception"
expect_eq "$(jq -r 'select(.id == "norole") | .error' <<<"$out")" "message 0 has no 'role' (a string)" "a message without a role"
expect_eq "$(jq -r 'select(.id == "both") | .error' <<<"$out")" "fields 'prompt' and 'messages' do not go together" \
    "prompt and messages"
expect_eq "$(jq -r 'select(.id == "agp") | .error' <<<"$out")" \
    "fields 'add_generation_prompt', 'tools' and 'chat_template_kwargs' go with 'messages'" "a chat field without messages"
summary
