#!/usr/bin/env bash
# tools/quality.sh -- measure every weight type against the unquantized model (make quality).
#
# For stories260K and xs-ckpt (converted from their HF folders, F32) and SmolLM2-135M (its Q4_1
# GGUF dequantized to F32; llama.cpp protocol only), each type is quantized
# three ways: --method minmax (the paper's rule), --method search (the default), and search with
# --imatrix (an importance matrix from the model itself on calibration text: the second half of
# WikiText-2's test file, 100 windows of 256 tokens, disjoint from the scored windows). Each is
# scored by iflow-ppl --kl-base against the F32 model under two protocols:
#   llama.cpp  -c 256, the first $CHUNKS (64) chunks, the second half of each scored (the protocol of
#              llama.cpp's perplexity --kl-divergence); the default policy (below 6 bits the
#              embeddings and the output matrix get q6, as llama.cpp keeps its output matrix);
#              the types of $LTYPES (those with a llama.cpp peer of about the same size).
#   windows    -c 256, the first $WCHUNKS (24) windows, every position scored; every matrix in the
#              type (--keep '*=TYPE': the type's own effect), plus f16 and bf16 for reference (on
#              the exact F32 product; on the default one, BF16 x where the CPU has AVX512_BF16,
#              among the activations rows).
# Reported: perplexity, mean KL divergence, top-1 agreement.
# Also, per model, protocol and type, the int8 path against the F32-activation path on the same
# weights (iflow-ppl --activations int | f32; the default method), and for Q8, Q6 and Q5 their
# other activations as well (--activations int16 for Q8, whose default is int8 x less its
# outliers; --activations int8 for Q6 and Q5): docs/quant-activations.md.
# `tools/quality.sh methods` measures only the methods, `tools/quality.sh activations` only the
# two paths (no importance matrices; minutes instead of an hour); the default is both.
# Writes docs/quant-quality.md (tables) and docs/quant-quality.tsv (the column iflow-quant
# --list-types shows: the default method, windows protocol); prints progress on stderr. The raw
# rows go to $QUALITY_TSV when set; rows already there are kept, not measured again (to resume
# a run). If this build's forward pass does not report activations (iflow-ppl --save-imatrix
# fails), the imatrix columns are "-".
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
case $part in all | methods | activations) ;; *) echo "usage: tools/quality.sh [all | methods | activations]" >&2; exit 2 ;; esac
DATA=${IFLOW_TEST_DATA:-../shared}
CHUNKS=${CHUNKS:-64}
WCHUNKS=${WCHUNKS:-24}
WIKI=$DATA/data/wikitext-2-raw/wiki.test.raw
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
types="q8_b32 q8_b64 q6 q5 q4_b32 q4_b64 q3h q3_b32 q2"
ltypes=${LTYPES:-"q8_b64 q6 q5 q4_b32 q4_b64 q3h"}   # llama.cpp protocol: the types llama.cpp has peers of
raw=${QUALITY_TSV:-$work/all.tsv}
touch "$raw"

# The second half of the text: calibration for the importance matrices. The scored windows
# come from its first 300 KB (about 70,000 tokens, more than either protocol scores; the same
# windows as from the whole file).
tail -c $(($(wc -c <"$WIKI") / 2)) "$WIKI" >"$work/calib.txt"
head -c 300000 "$WIKI" >"$work/text.txt"

have() { # model-name protocol type method: is the row there?
    awk -F'\t' -v m="$1" -v p="$2" -v t="$3" -v k="$4" '$1 == m && $2 == p && $3 == t && $4 == k { f = 1 } END { exit !f }' "$raw"
}

score() { # model-name protocol type method quantized-shard base-shard [iflow-ppl options] -> one TSV row
    local name=$1 proto=$2 t=$3 method=$4 q=$5 base=$6 bits chunks=$CHUNKS
    shift 6
    [ "$proto" = windows ] && chunks=$WCHUNKS
    bits=$(case $t in f16|bf16) echo 16 ;; *) bin/iflow-quant --list-types --json | jq -r --arg t "$t" 'select(.type == $t) | .bits_per_weight' ;; esac)
    bin/iflow-ppl -m "$q" --kl-base "$base" -f "$work/text.txt" -c 256 --chunks "$chunks" --protocol "$proto" "$@" --json |
        jq -r --arg m "$name" --arg p "$proto" --arg t "$t" --arg meth "$method" --arg b "$bits" \
            '[$m, $p, $t, $meth, $b, .ppl, .delta_ppl, .mean_kld, .max_kld, .top1_agreement, .base_ppl, .tokens_scored] | @tsv' >>"$raw"
}

# The int8 path against the F32-activation path (iflow-ppl --activations), on the same weights
# (the default method), in one run: rows of methods act-int and act-f32, and for the types of
# kernels/cpu/qimpl.h's ifk_qx_x16 their other mode: act-int16 for Q8 (int8 x by default, less
# each token's outliers: --activations int16 gives it int16 x), act-int8 for Q6 and Q5 (int16 x
# by default: --activations int8 rounds theirs to int8).
activations() { # model-name protocol type base-shard [iflow-quant --keep]
    local name=$1 proto=$2 t=$3 base=$4 other=""
    shift 4
    case $t in q8_b32 | q8_b64) other=int16 ;; q6 | q5) other=int8 ;; esac
    have "$name" $proto "$t" act-f32 && { [ -z "$other" ] || have "$name" $proto "$t" "act-$other"; } && return
    echo "quality: $name $proto $t activations int / f32" >&2
    bin/iflow-quant -t "$t" "$@" -i "$base" -o "$work/qa.ifs"
    have "$name" $proto "$t" act-f32 || {
        score "$name" $proto "$t" act-int "$work/qa.ifs" "$base" --activations int
        score "$name" $proto "$t" act-f32 "$work/qa.ifs" "$base" --activations f32
    }
    [ -z "$other" ] || score "$name" $proto "$t" "act-$other" "$work/qa.ifs" "$base" --activations "$other"
}

measure() { # model-name source [protocols]: source an HF folder or a GGUF file (dequantized to F32)
    local name=$1 hf=$2 base=$work/$1.ifs im="" protos=${3:-"llama.cpp windows"}
    bin/iflow-convert "$hf" -t f32 -o "$base"
    if [ $part = activations ]; then
        : # no method rows: no importance matrix needed
    elif bin/iflow-ppl -m "$base" -f "$work/calib.txt" -c 256 --chunks 100 --save-imatrix "$work/$name.imatrix" >/dev/null 2>"$work/im.err"; then
        im=$work/$name.imatrix
    else
        echo "quality: $name: no importance matrix ($(cat "$work/im.err")): imatrix columns left out" >&2
    fi
    for proto in $protos; do
        if [ $proto = windows ] && [ $part != activations ]; then
            for t in f16 bf16; do
                have "$name" $proto "$t" - && continue
                bin/iflow-convert "$hf" -t "$t" -o "$work/q.ifs"
                score "$name" $proto "$t" - "$work/q.ifs" "$base" --activations f32
            done
        fi
        # f16 and bf16 meet x in BF16 by default where the CPU has AVX512_BF16 (kernels/cpu/kernels.h)
        if [ $proto = windows ] && [ $part != methods ]; then
            for t in f16 bf16; do
                activations "$name" $proto "$t" "$base" --keep "*=$t"
            done
        fi
        tt=$types; [ $proto = llama.cpp ] && tt=$ltypes
        for t in $tt; do
            keep=(); [ $proto = windows ] && keep=(--keep "*=$t")
            for method in minmax search imatrix; do
                [ $part = activations ] && break
                have "$name" $proto "$t" $method && continue
                echo "quality: $name $proto $t $method" >&2
                case $method in
                    imatrix) [ -n "$im" ] || continue
                             bin/iflow-quant -t "$t" "${keep[@]}" --imatrix "$im" -i "$base" -o "$work/q.ifs" ;;
                    *) bin/iflow-quant -t "$t" "${keep[@]}" --method $method -i "$base" -o "$work/q.ifs" ;;
                esac
                score "$name" $proto "$t" $method "$work/q.ifs" "$base"
            done
            [ $part = methods ] || activations "$name" $proto "$t" "$base" "${keep[@]}"
        done
    done
}

measure xs-ckpt "$DATA/models/xs-ckpt/hf"
measure stories260K "$DATA/models/stories260K/hf"
# The real SmolLM2-135M: no unquantized copy exists here, so its Q4_1 weights dequantized to F32
# are the base (every type is then a requantization of those values); the llama.cpp protocol
# only (the windows protocol's every-matrix-in-the-type rows would take an hour more).
measure smollm2-135m "$DATA/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf" llama.cpp

# One table per model and protocol: a row per type, the three methods side by side.
table() { # model protocol
    awk -F'\t' -v m="$1" -v p="$2" '
        $1 == m && $2 == p {
            if (!seen[$3]++) order[++n] = $3
            bits[$3] = $5; base = $11; tok = $12
            ppl[$3, $4] = sprintf("%.2f", $6); kld[$3, $4] = sprintf("%.4f", $8); top[$3, $4] = sprintf("%.1f", 100 * $10)
        }
        function g(a, t, k) { return ((t, k) in a) ? a[t, k] : "-" }
        END {
            printf "\n### %s, %s protocol: F32 perplexity %.4f over %d scored tokens\n\n", m, p, base, tok
            print "| type | bits/weight | KLD minmax | KLD search | KLD imatrix | ppl minmax | ppl search | ppl imatrix | top-1 % minmax / search / imatrix |"
            print "|---|---|---|---|---|---|---|---|---|"
            for (i = 1; i <= n; i++) {
                t = order[i]
                if (t == "f16" || t == "bf16")
                    printf "| %s | %s | %s (the type itself) | | | %s | | | %s |\n", t, bits[t], g(kld, t, "-"), g(ppl, t, "-"), g(top, t, "-")
                else
                    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s |\n", t, bits[t], g(kld, t, "minmax"), g(kld, t, "search"),
                        g(kld, t, "imatrix"), g(ppl, t, "minmax"), g(ppl, t, "search"), g(ppl, t, "imatrix"),
                        g(top, t, "minmax"), g(top, t, "search"), g(top, t, "imatrix")
            }
        }' "$raw"
}

# The int8 path against the F32-activation path: one row per model, protocol and type.
act_table() {
    echo
    echo "### The int8 path against F32 activations (same weights: the default method)"
    echo
    echo "Perplexity and mean KL divergence from the F32 model, with the quantized products' activations"
    echo "rounded per token (int8, Q8 and Q4 less each token's outliers that stand out, or int16 for Q6 and Q5:"
    echo "kernels/cpu/qimpl.h) and not rounded"
    echo "(iflow-ppl --activations f32). The CPU issue asks the difference to stay within 0.2 % for"
    echo "Q8, Q6, Q5 and Q4. The f16 and bf16 rows: x rounded to BF16 for vdpbf16ps (kernels/cpu/kernels.h,"
    echo "where the CPU has AVX512_BF16; elsewhere both columns are the F32 product)."
    echo
    echo "| model | protocol | type | ppl int8 path | ppl F32 activations | difference | KLD int8 path | KLD F32 activations |"
    echo "|---|---|---|---|---|---|---|---|"
    awk -F'\t' '
        $4 == "act-int" { k = $1 SUBSEP $2 SUBSEP $3; if (!(k in pi)) order[++n] = k; pi[k] = $6; ki[k] = $8 }
        $4 == "act-f32" { k = $1 SUBSEP $2 SUBSEP $3; pf[k] = $6; kf[k] = $8 }
        END {
            for (i = 1; i <= n; i++) {
                k = order[i]
                if (!(k in pf)) continue
                split(k, f, SUBSEP)
                printf "| %s | %s | %s | %.3f | %.3f | %+.3f %% | %.4f | %.4f |\n", f[1], f[2], f[3], pi[k], pf[k],
                    100 * (pi[k] / pf[k] - 1), ki[k], kf[k]
            }
        }' "$raw"
    grep -q "	act-int\(8\|16\)	" "$raw" || return 0
    echo
    echo "### Q8, Q6 and Q5 in their other mode (--activations int16 for Q8, int8 for Q6 and Q5)"
    echo
    echo "The same weights with Q8's x rounded to int16 (vpdpwssd; the default is int8 x less each"
    echo "token's outliers, multiplied in F32), and Q6's and Q5's to int8 (vpdpbusd, as Q4; the"
    echo "residual's correction at the middle level; their default is int16), against the default"
    echo "and F32 activations: what each mode's speed costs in accuracy (docs/QUANTIZATION.md)."
    echo
    echo "| model | protocol | type | other mode | ppl other mode | ppl default | ppl F32 x | other vs F32 x | KLD other mode | KLD default | KLD F32 x |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    awk -F'\t' '
        $4 == "act-int8" || $4 == "act-int16" { k = $1 SUBSEP $2 SUBSEP $3; if (!(k in po)) order[++n] = k; po[k] = $6; ko[k] = $8; mo[k] = substr($4, 5) }
        $4 == "act-int" { k = $1 SUBSEP $2 SUBSEP $3; pi[k] = $6; ki[k] = $8 }
        $4 == "act-f32" { k = $1 SUBSEP $2 SUBSEP $3; pf[k] = $6; kf[k] = $8 }
        END {
            for (i = 1; i <= n; i++) {
                k = order[i]
                if (!(k in pf) || !(k in pi)) continue
                split(k, f, SUBSEP)
                printf "| %s | %s | %s | %s | %.3f | %.3f | %.3f | %+.3f %% | %.4f | %.4f | %.4f |\n", f[1], f[2], f[3], mo[k], po[k], pi[k],
                    pf[k], 100 * (po[k] / pf[k] - 1), ko[k], ki[k], kf[k]
            }
        }' "$raw"
}

if [ $part != activations ]; then
    {
        echo "<!-- written by tools/quality.sh (make quality); do not edit -->"
        for p in llama.cpp windows; do
            for m in xs-ckpt stories260K smollm2-135m; do
                grep -q "^$m	$p	" "$raw" && table $m $p
            done
        done
    } >docs/quant-quality.md
    {
        echo "# type<TAB>measured quality (tools/quality.sh, make quality): mean KL divergence from F32 on WikiText-2, default method"
        awk -F'\t' '$2 == "windows" && $4 == "search" { k[$3] = k[$3] sprintf("%s%s KLD %.4f", k[$3] ? ", " : "", $1, $8) }
            END { for (t in k) print t "\t" k[t] }' "$raw" | sort
    } >docs/quant-quality.tsv
    cat docs/quant-quality.md
fi
if [ $part != methods ]; then
    {
        echo "<!-- written by tools/quality.sh activations (make quality); do not edit -->"
        act_table
    } >docs/quant-activations.md
    cat docs/quant-activations.md
fi
