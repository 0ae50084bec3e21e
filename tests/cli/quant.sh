#!/usr/bin/env bash
# iflow-quant: every type on stories260K and xs-ckpt through a file and a pipe, the sizes the
# padding rule gives (rows x ceil(K/B) x block bytes), the default and --keep choices,
# requantizing, --list-types, and bad input: exact messages and exit codes, nothing left behind.
. "$(dirname "$0")/lib.sh"
Q=$BIN/iflow-quant
run $BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs"
expect_rc 0 "convert stories260K"
run $BIN/iflow-convert "$DATA/models/xs-ckpt/hf" -o "$TMP/xs.ifs"
expect_rc 0 "convert xs-ckpt"

# the contract (kernels/cpu/quant.h): block size and block bytes of each type
TYPES="q8_b32 q8_b64 q6 q5 q4_b32 q4_b64 q3h q3_b32 q2"
declare -A B=([q8_b32]=32 [q8_b64]=64 [q6]=64 [q5]=64 [q4_b32]=32 [q4_b64]=64 [q3h]=64 [q3_b32]=32 [q2]=32)
declare -A BB=([q8_b32]=36 [q8_b64]=68 [q6]=52 [q5]=44 [q4_b32]=20 [q4_b64]=36 [q3h]=32 [q3_b32]=16 [q2]=12)
low() { case $1 in q8_b32 | q8_b64 | q6) return 1 ;; esac; }   # fewer than 6 bits

# "type shape bytes" of tensor $2 in shard $1, from --info's table
row() { $BIN/iflow-convert --info "$1" | awk -v n="$2" '$1 == "tensor" && $2 == n { print $3, $4, $6 }'; }
# name, type, bytes and checksum of every tensor (offsets left out)
tensors() { $BIN/iflow-convert --info "$1" | awk '$1 == "tensor" { print $2, $3, $6, $7 }'; }

# ---- every type, both models, file and pipe ----
for m in s xs; do
    F=$([ $m = s ] && echo 172 || echo 192)   # FFN width: 172 is not a multiple of any block
    for t in $TYPES; do
        dst=$TMP/$m.$t.ifs
        run $Q -t $t -i "$TMP/$m.ifs" -o "$dst"
        expect_rc 0 "$m -t $t"
        expect_eq "$err" "" "$m -t $t: quiet"
        $Q -t $t <"$TMP/$m.ifs" >"$TMP/pipe.ifs"
        cmp -s "$dst" "$TMP/pipe.ifs" && ok || bad "$m -t $t: the pipe's output differs from -i/-o files"
        info=$($BIN/iflow-convert --info "$dst")
        expect_match "$info" $'\n'"quantization: $t" "$m -t $t: --info names the quantization"
        emb=$t; low $t && emb=q6
        expect_eq "$(row "$dst" tok_embd)" "$emb 512x64 $((512 * 64 / B[$emb] * BB[$emb]))" "$m -t $t: tok_embd"
        expect_eq "$(row "$dst" blk.0.wq)" "$t 64x64 $((64 * 64 / B[$t] * BB[$t]))" "$m -t $t: blk.0.wq"
        expect_eq "$(row "$dst" blk.4.wk)" "$t 32x64 $((32 * 64 / B[$t] * BB[$t]))" "$m -t $t: blk.4.wk"
        expect_eq "$(row "$dst" blk.2.ffn_up)" "$t ${F}x64 $((F * 64 / B[$t] * BB[$t]))" "$m -t $t: ffn_up [$F][64]"
        blocks=$(((F + B[$t] - 1) / B[$t]))
        expect_eq "$(row "$dst" blk.3.ffn_down)" "$t 64x$F $((64 * blocks * BB[$t]))" "$m -t $t: ffn_down [64][$F], padded rows"
        expect_eq "$(row "$dst" blk.0.attn_norm)" "f32 64 256" "$m -t $t: norms stay f32"
        expect_eq "$(row "$dst" output_norm)" "f32 64 256" "$m -t $t: output_norm"
        expect_eq "$(grep -c '^tensor ' <<<"$info")" 47 "$m -t $t: 47 tensors"
    done
done
# the shape of a 172-wide q4_b64 row: 3 blocks of 36 bytes (the man page's example)
expect_eq "$(row "$TMP/s.q4_b64.ifs" blk.0.ffn_down)" "q4_b64 64x172 6912" "q4_b64 [64][172] is 6912 bytes"
# the tokenizer is copied unchanged
expect_eq "$($BIN/iflow-convert --info "$TMP/s.q3h.ifs" | awk '$2 == "tokenizer" { print $6, $7 }')" \
    "$($BIN/iflow-convert --info "$TMP/s.ifs" | awk '$2 == "tokenizer" { print $6, $7 }')" "tokenizer unchanged"

# a whole pipeline; a zstd output; -v
run bash -c "$BIN/iflow-convert '$DATA/models/stories260K/hf' | $Q -t q8_b32 | $BIN/iflow-convert --info -"
expect_rc 0 "convert | quant | --info -"
expect_match "$out" "tensor +blk\.4\.ffn_down +q8_b32 +64x172 " "pipeline: ffn_down is q8_b32"
run $Q -t q4_b64 --zstd -i "$TMP/s.ifs" -o "$TMP/z.ifs.zst"
expect_rc 0 "--zstd"
expect_eq "$(tensors "$TMP/z.ifs.zst")" "$(tensors "$TMP/s.q4_b64.ifs")" "--zstd holds the same tensors"
run $Q -t q4_b64 -v -i "$TMP/s.ifs" -o "$TMP/v.ifs"
expect_match "$err" "^iflow-quant: wrote $TMP/v\.ifs: 47 tensors \(11 f32, 1 q6, 35 q4_b64\), 0\.99 MiB of tensors -> 0\.15 MiB, in [0-9.]+ s, peak RSS [0-9.]+ MiB$" "-v"

# ---- --method: search (the default) and minmax; the thread count does not change the bytes ----
for t in q8_b64 q4_b64 q3h; do
    run env OMP_NUM_THREADS=1 $Q -t $t -i "$TMP/xs.ifs" -o "$TMP/t1.ifs"
    expect_rc 0 "$t, 1 thread"
    run env OMP_NUM_THREADS=3 $Q -t $t --method search -i "$TMP/xs.ifs" -o "$TMP/t3.ifs"
    expect_rc 0 "$t, 3 threads"
    cmp -s "$TMP/t1.ifs" "$TMP/t3.ifs" && ok || bad "$t: 1 and 3 threads give different bytes"
    cmp -s "$TMP/t1.ifs" "$TMP/xs.$t.ifs" && ok || bad "$t: --method search is not the default"
    run env OMP_NUM_THREADS=3 $Q -t $t --method minmax -i "$TMP/xs.ifs" -o "$TMP/m3.ifs"
    $Q -t $t --method minmax -i "$TMP/xs.ifs" -o "$TMP/m1.ifs"
    cmp -s "$TMP/m1.ifs" "$TMP/m3.ifs" && ok || bad "$t --method minmax: runs differ"
    cmp -s "$TMP/m1.ifs" "$TMP/t1.ifs" && bad "$t: minmax and search give the same bytes" || ok
    expect_eq "$($BIN/iflow-convert --json --info "$TMP/m1.ifs" | jq -r .meta.quantization.method) $($BIN/iflow-convert \
        --json --info "$TMP/t1.ifs" | jq -r .meta.quantization.method)" "minmax search" "$t: the meta names the method"
done
usage_m=$($Q -t q4_b64 --method best -i "$TMP/s.ifs" -o "$TMP/out.ifs" 2>&1)
expect_eq "$usage_m" "iflow-quant: unknown method 'best' for --method (search, minmax)
Try 'iflow-quant --help' for more information." "--method best"

# ---- --imatrix: a bad or foreign importance matrix is refused naming the tensor, nothing written ----
printf 'IFIMTX01\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0IFIMEND!' >"$TMP/empty.imatrix"
run $Q -t q4_b64 --imatrix "$TMP/empty.imatrix" -i "$TMP/xs.ifs" -o "$TMP/out.ifs"
expect_eq "$rc $err" "1 iflow-quant: imatrix '$TMP/empty.imatrix' has no entry for tensor 'tok_embd' of model '$TMP/xs.ifs' (an imatrix of another model?)" \
    "--imatrix without the model's tensors"
expect_no_file "$TMP/out.ifs*" "a foreign imatrix"
head -c 20 "$TMP/empty.imatrix" >"$TMP/cut.imatrix"
run $Q -t q4_b64 --imatrix "$TMP/cut.imatrix" -i "$TMP/xs.ifs" -o "$TMP/out.ifs"
expect_eq "$rc $err" "1 iflow-quant: truncated imatrix: the header at byte 0 needs 24 bytes, file ends at byte 20 in '$TMP/cut.imatrix'" \
    "a truncated imatrix"
run $Q -t q4_b64 --method minmax --imatrix "$TMP/empty.imatrix" -i "$TMP/xs.ifs" -o "$TMP/out.ifs"
expect_eq "$rc $err" "2 iflow-quant: --imatrix needs --method search (minmax takes no weights)
Try 'iflow-quant --help' for more information." "--imatrix with minmax"
# an importance matrix of the model itself (iflow-ppl --save-imatrix), then used
run $BIN/iflow-ppl -m "$TMP/xs.ifs" -f "$DATA/data/wikitext-2-raw/wiki.test.raw" -c 64 --chunks 4 --save-imatrix "$TMP/xs.imatrix"
expect_rc 0 "iflow-ppl --save-imatrix"
run $Q -t q4_b64 --imatrix "$TMP/xs.imatrix" -i "$TMP/xs.ifs" -o "$TMP/im.ifs"
expect_rc 0 "--imatrix of the model itself"
expect_eq "$($BIN/iflow-convert --json --info "$TMP/im.ifs" | jq -c .meta.quantization.imatrix)" \
    "{\"file\":\"$TMP/xs.imatrix\",\"tokens\":256}" "the meta names the imatrix and its tokens"
cmp -s "$TMP/im.ifs" "$TMP/xs.q4_b64.ifs" && bad "--imatrix changed nothing" || ok
run $Q -t q4_b64 --imatrix "$TMP/xs.imatrix" -i "$TMP/s.ifs" -o "$TMP/out.ifs"
expect_match "$err" "^iflow-quant: imatrix '$TMP/xs\.imatrix' has [0-9]+ columns for tensor '[a-z0-9_.]+', model '$TMP/s\.ifs' has [0-9]+ \(an imatrix of another model\?\)$" \
    "another model's imatrix"
run $BIN/iflow-ppl -m "$TMP/xs.ifs" -f "$DATA/data/wikitext-2-raw/wiki.test.raw" --device cuda --save-imatrix "$TMP/x.imatrix"
expect_eq "$rc $err" "2 iflow-ppl: --save-imatrix computes on the CPU: leave out --device, --plan and --gpu-layers
Try 'iflow-ppl --help' for more information." "--save-imatrix on a GPU"

# ---- --keep ----
keep_rows() { # options... -> the types of tok_embd, blk.0.wq, blk.0.ffn_down, blk.1.wq, blk.1.ffn_down
    $Q "$@" -i "$TMP/s.ifs" -o "$TMP/k.ifs" || { bad "iflow-quant $*"; return; }
    for n in tok_embd blk.0.wq blk.0.ffn_down blk.1.wq blk.1.ffn_down; do row "$TMP/k.ifs" $n | cut -d' ' -f1; done | paste -sd' '
}
expect_eq "$(keep_rows -t q4_b64 --keep 'embed,output=q8')" "q8_b32 q4_b64 q4_b64 q4_b64 q4_b64" \
    "--keep 'embed,output=q8' on a tied model: output is tok_embd, the later entry wins"
expect_eq "$(keep_rows -t q4_b64 --keep 'output=q8,embed')" "f32 q4_b64 q4_b64 q4_b64 q4_b64" "a bare entry keeps the source"
expect_eq "$(keep_rows -t q4_b64 --keep 'blk.0.*,blk.*.ffn_down=q8_b64')" "q6 f32 q8_b64 q4_b64 q8_b64" "patterns, last wins"
expect_eq "$(keep_rows -t q3h --keep 'blk.?.wq = q5' --keep 'embed=q2')" "q2 q5 q3h q5 q3h" "repeated --keep, blanks"
expect_eq "$(keep_rows -t q2 --keep 'blk.1.*=f16')" "q6 q2 q2 f16 f16" "a float type"
expect_eq "$(row "$TMP/k.ifs" blk.1.attn_norm)" "f32 64 256" "typed entries leave vectors f32"
expect_match "$($BIN/iflow-convert --info "$TMP/k.ifs")" $'\n'"quantization: q2 \(embed=q6, output=q6, blk\.1\.\*=f16\)"$'\n' \
    "--info lists the overrides"
run $Q -t q4_b64 --keep 'embd=q8' -i "$TMP/s.ifs" -o "$TMP/out.ifs"
expect_rc 1 "a pattern that matches nothing"
expect_eq "$err" "iflow-quant: --keep pattern 'embd' matches no tensor in '$TMP/s.ifs'" "unmatched pattern: message"
expect_no_file "$TMP/out.ifs*" "unmatched pattern"

# ---- quantized input ----
run $Q -t q8_b32 -i "$TMP/s.q4_b64.ifs" -o "$TMP/out.ifs"
expect_rc 1 "requantizing without --requantize"
expect_eq "$err" "iflow-quant: cannot quantize tensor 'tok_embd': it is already q6 (use --requantize)" "requantize refusal: message"
expect_no_file "$TMP/out.ifs*" "requantize refusal"
run $Q -t q8_b32 --requantize -i "$TMP/s.q4_b64.ifs" -o "$TMP/rq.ifs"
expect_rc 0 "--requantize"
expect_eq "$(row "$TMP/rq.ifs" blk.0.wq) $(row "$TMP/rq.ifs" tok_embd | cut -d' ' -f1)" "q8_b32 64x64 4608 q8_b32" "--requantize: types"
run $Q -t q4_b64 -i "$TMP/s.q4_b64.ifs" -o "$TMP/same.ifs"
expect_rc 0 "the same type again"
expect_eq "$(tensors "$TMP/same.ifs")" "$(tensors "$TMP/s.q4_b64.ifs")" "the same type again copies every tensor"
run $Q -t q4_b64 --keep 'blk.*=f32' -i "$TMP/s.q4_b64.ifs" -o "$TMP/deq.ifs"
expect_rc 0 "dequantizing to f32 needs no --requantize"
expect_eq "$(row "$TMP/deq.ifs" blk.2.ffn_down)" "f32 64x172 44032" "dequantized to f32"

# ---- an unsupported source type (tests/fixtures/gen_quant_fixtures.py) ----
I32=tests/fixtures/quant/i32.ifs
run $Q -t q4_b64 -i $I32 -o "$TMP/out.ifs"
expect_rc 1 "an i32 matrix"
expect_eq "$err" "iflow-quant: cannot quantize tensor 'tok_embd': type i32 is not a weight type (keep it with --keep 'tok_embd')" \
    "i32: message"
expect_no_file "$TMP/out.ifs*" "i32"
run $Q -t q4_b64 --keep tok_embd -i $I32 -o "$TMP/i32.ifs"
expect_rc 0 "an i32 matrix kept"
expect_eq "$(row "$TMP/i32.ifs" tok_embd)" "i32 2x4 32" "i32 kept unchanged"

# ---- truncated and foreign input ----
head -c 300000 "$TMP/s.ifs" >"$TMP/cut.ifs"
run bash -c "$Q -t q8_b32 -o '$TMP/out.ifs' <'$TMP/cut.ifs'"
expect_rc 1 "a truncated stream"
expect_one_line "a truncated stream"
expect_match "$err" "^iflow-quant: truncated shard: data of 'blk\.0\.ffn_down' at byte [0-9]+ needs 44032 bytes, stream ends at byte 300000 in '<stdin>'$" \
    "a truncated stream: names the tensor and the byte offset"
expect_no_file "$TMP/out.ifs*" "a truncated stream"
run $Q -t q8_b32 -i "$TMP/cut.ifs" -o "$TMP/out.ifs"
expect_rc 1 "a truncated file"
expect_match "$err" "^iflow-quant: truncated shard: .* in '$TMP/cut\.ifs'$" "a truncated file: message"
expect_no_file "$TMP/out.ifs*" "a truncated file"
head -c 100 "$TMP/s.ifs" >"$TMP/cut2.ifs"
run $Q -t q8_b32 -i "$TMP/cut2.ifs" -o "$TMP/out.ifs"
expect_eq "$rc $err" "1 iflow-quant: truncated shard: record header at byte 64 needs 64 bytes, stream ends at byte 100 in '$TMP/cut2.ifs'" \
    "cut inside the first record header"
# a stream to stdout that fails ends without its END! record: the reader downstream says so
run bash -c "$Q -t q8_b32 <'$TMP/cut.ifs' | $BIN/iflow-convert --info -"
expect_match "$err" "iflow-convert: truncated shard: no end record after [0-9]+ records" "a failed stream is seen as truncated"
printf 'not a shard' >"$TMP/junk.ifs"
run $Q -t q8_b32 -i "$TMP/junk.ifs" -o "$TMP/out.ifs"
expect_eq "$rc $err" "1 iflow-quant: not an iflow shard (bad magic at byte 0): '$TMP/junk.ifs'" "not a shard"
run $Q -t q8_b32 -i "$TMP/nope.ifs" -o "$TMP/out.ifs"
expect_eq "$rc $err" "1 iflow-quant: cannot open '$TMP/nope.ifs': No such file or directory" "no such input"
expect_no_file "$TMP/out.ifs*" "bad inputs"
run $Q -t q8_b32 -i "$TMP/s.ifs" -o "$TMP/no/such/dir/x.ifs"
expect_eq "$rc $err" "1 iflow-quant: cannot create '$TMP/no/such/dir/x.ifs': No such file or directory" "unwritable output"

# ---- usage errors ----
usage() { # expected message, args...
    local msg=$1; shift
    run $Q "$@"
    expect_rc 2 "iflow-quant $*"
    expect_eq "$err" "iflow-quant: $msg
Try 'iflow-quant --help' for more information." "iflow-quant $*: message"
}
usage "unknown type 'q7' for --type (see iflow-quant --list-types)" -t q7 -i "$TMP/s.ifs"
usage "ambiguous type 'q4' for --type: say q4_b32 or q4_b64" -t q4 -i "$TMP/s.ifs"
usage "ambiguous type 'Q3' for --type: say q3h or q3_b32" -t Q3 -i "$TMP/s.ifs"
usage "type 'f32' for --type is not a quantized type, f16 or bf16 (see iflow-quant --list-types)" -t f32 -i "$TMP/s.ifs"
usage "no type: give -t TYPE (iflow-quant --list-types lists them)" -i "$TMP/s.ifs"
usage "unknown type 'q7' in --keep entry 'embed=q7'" -t q4_b64 --keep 'embed=q7' -i "$TMP/s.ifs"
usage "ambiguous type 'q4' in --keep entry 'output=q4': say q4_b32 or q4_b64" -t q8 --keep 'embed,output=q4' -i "$TMP/s.ifs"
usage "bad --keep list 'embed,,output': empty entry" -t q4_b64 --keep 'embed,,output' -i "$TMP/s.ifs"
usage "bad --keep entry '=q8': no pattern before '='" -t q4_b64 --keep '=q8' -i "$TMP/s.ifs"
usage "type 'i32' in --keep entry 'embed=i32' cannot hold weights (a quantized type, f32, f16 or bf16)" \
    -t q4_b64 --keep 'embed=i32' -i "$TMP/s.ifs"
usage "unexpected operand '$TMP/s.ifs' (give the input with -i FILE)" -t q4_b64 "$TMP/s.ifs"
usage "--json goes with --list-types" -t q4_b64 --json -i "$TMP/s.ifs"
expect_no_file "$TMP/*.tmp.*" "usage errors leave no temporary file"
run $BIN/iflow-convert "$DATA/models/stories260K/hf" -t q4_b64 -o "$TMP/out.ifs"
expect_eq "$rc $err" "2 iflow-convert: type 'q4_b64' is a quantized type: pipe the shard through iflow-quant
Try 'iflow-convert --help' for more information." "iflow-convert -t q4_b64 points to iflow-quant"
# never reads a terminal, never writes a binary shard to one (script gives the program a pty)
if command -v script >/dev/null; then
    run timeout 10 script -qec "$Q -t q8_b32 -o $TMP/out.ifs" /dev/null
    expect_match "$out" "iflow-quant: no input: give -i FILE or pipe a shard to standard input" "stdin is a terminal"
    run timeout 10 script -qec "$Q -t q8_b32 -i $TMP/s.ifs" /dev/null
    expect_match "$out" "iflow-quant: refusing to write a binary shard to a terminal \(use -o FILE or a pipe\)" "stdout is a terminal"
fi

# ---- --list-types ----
run env IFLOW_QUANT_QUALITY="$TMP/none.tsv" $Q --list-types
expect_rc 0 "--list-types"
expect_eq "$out" "type     bits block bits/weight paper  measured quality
q8_b32      8    32        9.00     9  -
q8_b64      8    64        8.50   8.5  -
q6          6    64        6.50   6.5  -
q5          5    64        5.50   5.5  -
q4_b32      4    32        5.00     5  -
q4_b64      4    64        4.50   4.5  -
q3h       3.5    64        4.00     4  -
q3_b32      3    32        4.00     4  -
q2          2    32        3.00     -  -
f16        16     1       16.00     -  -
bf16       16     1       16.00     -  -" "--list-types without a quality table"
printf '# type\tquality\nq8_b32\tKLD 0.0001, top-1 99.9%% (stories260K)\nq2\tpoor\n' >"$TMP/quality.tsv"
run env IFLOW_QUANT_QUALITY="$TMP/quality.tsv" $Q --list-types
expect_eq "$(sed -n '2p;10p' <<<"$out")" "q8_b32      8    32        9.00     9  KLD 0.0001, top-1 99.9% (stories260K)
q2          2    32        3.00     -  poor" "--list-types reads the quality table"
expect_eq "$(sed -n 4p <<<"$out")" "q6          6    64        6.50   6.5  -" "a type the table lacks"
run env IFLOW_QUANT_QUALITY="$TMP/quality.tsv" $Q --list-types --json
expect_eq "$(sed -n '1p;9p' <<<"$out")" '{"schema":1,"type":"q8_b32","code":16,"bits":8.0,"block":32,"block_bytes":36,"bits_per_weight":9.0,"paper_bits_per_weight":9.0,"quality":"KLD 0.0001, top-1 99.9% (stories260K)"}
{"schema":1,"type":"q2","code":24,"bits":2.0,"block":32,"block_bytes":12,"bits_per_weight":3.0,"paper_bits_per_weight":null,"quality":"poor"}' \
    "--list-types --json"
expect_eq "$(jq -r .type <<<"$out" | paste -sd' ')" "$TYPES f16 bf16" "--list-types --json: one line per type"

# ---- f16 and bf16 targets: the bytes iflow-convert --dtype writes (one rounding, to nearest even) ----
for t in f16 bf16; do
    run $Q -t $t -i "$TMP/s.ifs" -o "$TMP/s.q$t.ifs"
    expect_rc 0 "iflow-quant -t $t"
    $BIN/iflow-convert "$DATA/models/stories260K/hf" -t $t -o "$TMP/s.c$t.ifs"
    expect_eq "$($BIN/iflow-convert --info "$TMP/s.q$t.ifs" | awk '/^tensor/ {print $2, $3, $NF}')" \
        "$($BIN/iflow-convert --info "$TMP/s.c$t.ifs" | awk '/^tensor/ {print $2, $3, $NF}')" \
        "iflow-quant -t $t: every tensor as iflow-convert -t $t writes it"
    expect_match "$($BIN/iflow-convert --info "$TMP/s.q$t.ifs")" "quantization: $t" "meta records the $t target"
done
run bash -c "$Q -t q8_b32 -i '$TMP/s.ifs' | $Q -t bf16 | $BIN/iflow-convert --info -"
expect_match "$(grep -c "^tensor.* bf16 " <<<"$out")" "^36$" "q8_b32 -> bf16: the 36 matrices dequantized and rounded"

# ---- a Q8 model still writes the golden stories (issue 3: >= 16 tokens identical to F32) ----
G=$DATA/golden
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/g32.ifs"
$BIN/iflow-quant -t q8_b32 -i "$TMP/g32.ifs" -o "$TMP/g8.ifs"
$BIN/iflow-quant -t q8_b32 --keep '*=f32' -i "$TMP/g8.ifs" -o "$TMP/g8deq.ifs"
same_prefix() { jq -n --argjson a "$1" --argjson b "$2" \
    'first(range(0; [$a, $b] | map(length) | min) as $i | select($a[$i] != $b[$i]) | $i) // ([$a, $b] | map(length) | min)'; }
seen=""
while read -r rec; do
    prompt=$(jq -r .prompt <<<"$rec")
    want=$(jq -c .gen_ids <<<"$rec")
    q8=$($BIN/iflow-run -m "$TMP/g8.ifs" -p "$prompt" -n 64 --temp 0 --json | jq -c .gen_ids)
    deq=$($BIN/iflow-run -m "$TMP/g8deq.ifs" -p "$prompt" -n 64 --temp 0 --json | jq -c .gen_ids)
    n=$(same_prefix "$q8" "$want")
    seen="$seen $n"
    [ "$n" -ge 16 ] && ok || bad "q8_b32 greedy for '$prompt' leaves the F32 text after $n tokens"
    expect_eq "$deq" "$want" "q8_b32 weights dequantized to f32: greedy for '$prompt' is the golden one"
done <"$G/stories260K.greedy64.jsonl"
echo "q8_b32 greedy tokens identical to F32 on the 5 golden prompts:$seen (of 64)"

summary
