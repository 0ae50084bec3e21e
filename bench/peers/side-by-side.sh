#!/usr/bin/env bash
# bench/peers/side-by-side.sh -- iflow against ik_llama.cpp in the same minutes (docs/PERFORMANCE.md,
# "Against ik_llama.cpp"); by hand: ik_llama.cpp built with -DGGML_NATIVE=ON, the models made by
# mk_tinyllama_gguf.py, iflow-convert / iflow-quant and ik's llama-quantize --pure. JSON lines on stdout.
# Side by side on the same minutes: iflow (main, and the two helper branches where they apply) and
# ik_llama.cpp (built from ik-llama-cpp-python 0.1.5's vendored source, GGML_NATIVE=ON, -rtr 1),
# TinyLlama-1.1B shape, the same random weights (F16 GGUF -> iflow shard; Q8_0/Q4_0 --pure vs
# q8_b64/q4_b64 --keep '*=TYPE'), prefill 128 and 512, decode 16, 1 and 2 threads.
set -u
M=${PEER_MODELS:?dir with tl-f16.ifs/.gguf, tl-q8_b64.ifs, tl-q8_0.gguf, tl-q4_b64.ifs, tl-q4_0.gguf}; IK=${IK_LLAMA_BENCH:?path of ik_llama.cpp llama-bench}
MAIN=${IFLOW_BUILD:-build/rel-nocuda}; BP=${IFLOW_BUILD_BF16PACK:-/nonexistent}; Q8=$MAIN
membw() { OMP_NUM_THREADS=$1 OMP_PROC_BIND=close OMP_PLACES=cores $MAIN/membw 1 5 2>/dev/null | sed -nE 's/^read-only sum : *([0-9.]+) GB\/s/\1/p'; }
fl() { # engine-name bench-binary file [env]
  local r128 r512
  r128=$(env ${4:-X=1} $2 $3 128 16 1 2) r512=$(env ${4:-X=1} $2 $3 512 1 1 2)
  jq -c -n --arg e "$1" --arg f "$3" --argjson a "$r128" --argjson b "$r512" --arg load "$(cut -d' ' -f1 /proc/loadavg)" \
    '[$a.runs[] as $r | {engine: $e, file: $f, load: $load, threads: $r.threads, pp128: $r.prefill_tok_s, tg16: $r.decode_tok_s,
       pp512: ($b.runs[] | select(.threads == $r.threads) | .prefill_tok_s)}][]'
}
ik() { # gguf
  $IK -m $1 -p 128,512 -n 16 -t 1,2 -r ${IKR:-2} -rtr 1 -o json 2>/dev/null | jq -c --arg f "$1" --arg load "$(cut -d' ' -f1 /proc/loadavg)" '
    group_by(.n_threads)[] | {engine: "ik_llama.cpp", file: $f, load: $load, threads: .[0].n_threads,
     pp128: (map(select(.test == "pp128")) | .[0].samples_ts | max), pp512: (map(select(.test == "pp512")) | .[0].samples_ts | max),
     tg16: (map(select(.test == "tg16")) | .[0].samples_ts | max)}'
}
for round in $(seq ${ROUNDS:-2}); do
  echo "{\"round\":$round,\"bw1\":$(membw 1),\"bw2\":$(membw 2),\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
  for t in ${TYPES:-f16 q8 q4}; do
    case $t in
      f16) fl iflow-main $MAIN/iflow-bench $M/tl-f16.ifs
           [ -x $BP/iflow-bench ] && fl iflow-bf16pack $BP/iflow-bench $M/tl-f16.ifs
           ik $M/tl-f16.gguf ;;
      q8)  fl iflow-main $MAIN/iflow-bench $M/tl-q8_b64.ifs
           [ -x $Q8/iflow-bench ] && fl iflow-int8x $Q8/iflow-bench $M/tl-q8_b64.ifs IFLOW_BENCH_ACTIVATIONS=int8
           ik $M/tl-q8_0.gguf ;;
      q4)  fl iflow-main $MAIN/iflow-bench $M/tl-q4_b64.ifs
           ik $M/tl-q4_0.gguf ;;
    esac
  done
done
