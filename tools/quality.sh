#!/usr/bin/env bash
# tools/quality.sh -- measure every weight type against the unquantized model (make quality).
#
# For stories260K and xs-ckpt (converted from their HF folders, F32), each type quantizes every
# weight matrix (--keep '*=TYPE': the type's own effect, no higher-precision embeddings), then
# iflow-ppl scores WikiText-2 windows (protocol windows, c = 256, the first $CHUNKS windows)
# with --kl-base against the F32 model: perplexity, delta perplexity, mean and max KL divergence,
# and the share of positions whose top-1 token is unchanged.
# Writes docs/quant-quality.md (tables) and docs/quant-quality.tsv (the column iflow-quant
# --list-types shows); prints progress on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${IFLOW_TEST_DATA:-../shared}
CHUNKS=${CHUNKS:-100}
WIKI=$DATA/data/wikitext-2-raw/wiki.test.raw
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
types="f16 bf16 q8_b32 q8_b64 q6 q5 q4_b32 q4_b64 q3h q3_b32 q2"

measure() { # model-name hf-dir -> TSV rows: model type bits ppl dppl mean_kld max_kld top1
    local name=$1 hf=$2
    bin/iflow-convert "$hf" -o "$work/$name.ifs"
    for t in $types; do
        echo "quality: $name $t" >&2
        case $t in
            f16|bf16) bin/iflow-convert "$hf" -t "$t" -o "$work/q.ifs" ;;
            *) bin/iflow-quant -t "$t" --keep "*=$t" -i "$work/$name.ifs" -o "$work/q.ifs" ;;
        esac
        bits=$(case $t in f16|bf16) echo 16 ;; *) bin/iflow-quant --list-types --json | jq -r --arg t "$t" 'select(.type == $t) | .bits_per_weight' ;; esac)
        bin/iflow-ppl -m "$work/q.ifs" --kl-base "$work/$name.ifs" -f "$WIKI" -c 256 --chunks "$CHUNKS" --json |
            jq -r --arg m "$name" --arg t "$t" --arg b "$bits" \
                '[$m, $t, $b, .ppl, .delta_ppl, .mean_kld, .max_kld, .top1_agreement, .base_ppl, .tokens_scored] | @tsv'
    done
}

{ measure stories260K "$DATA/models/stories260K/hf"; measure xs-ckpt "$DATA/models/xs-ckpt/hf"; } >"$work/all.tsv"

{
    echo "<!-- written by tools/quality.sh (make quality); do not edit -->"
    for m in stories260K xs-ckpt; do
        awk -F'\t' -v m="$m" '$1 == m { printf "\n### %s: F32 perplexity %.4f over %d WikiText-2 tokens\n\n", m, $9, $10; exit }' "$work/all.tsv"
        echo "| type | bits/weight | perplexity | delta ppl | mean KLD | max KLD | top-1 same |"
        echo "|---|---|---|---|---|---|---|"
        awk -F'\t' -v m="$m" '$1 == m { printf "| %s | %s | %.4f | %+.4f | %.6f | %.4f | %.2f %% |\n", $2, $3, $4, $5, $6, $7, 100 * $8 }' "$work/all.tsv"
    done
} >docs/quant-quality.md

{
    echo "# type<TAB>measured quality (tools/quality.sh, make quality): mean KL divergence from F32 on WikiText-2"
    awk -F'\t' '$2 != "f16" && $2 != "bf16" { k[$2] = k[$2] sprintf("%s%s KLD %.4f", k[$2] ? ", " : "", $1, $6) }
        END { for (t in k) print t "\t" k[t] }' "$work/all.tsv" | sort
} >docs/quant-quality.tsv
cat docs/quant-quality.md
