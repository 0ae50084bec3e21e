#!/usr/bin/env bash
# mpirun -np N iflow-run --plan PLAN: one process per plan device (cmd/comm_mpi.c over
# libcore/engine/comm.h). The reference is the same plan in one process (and, for the layer
# plan, no plan at all): greedy text and seeded sampling must be the same, for layer, tensor
# and hybrid plans on stories260K and xs-ckpt. Open MPI comes with `make deps`.
. "$(dirname "$0")/lib.sh"
command -v mpirun >/dev/null || { bad "mpirun not found (make deps installs openmpi-bin)"; summary; exit 1; }
if [[ ${IFLOW_TEST_BUILD:-} == *san* ]]; then
    echo "SKIP $NAME: Open MPI under the sanitizers (its own allocations are reported as leaks)" >&2
    summary
    exit 0
fi
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" || { bad "convert"; summary; exit 1; }
$BIN/iflow-convert "$DATA/models/xs-ckpt/hf" -o "$TMP/xs.ifs" || { bad "convert"; summary; exit 1; }

for model in s xs; do
    for case in "layer 2" "tensor 2" "hybrid 4" "layer 3"; do
        set -- $case
        strategy=$1 n=$2
        $BIN/iflow-partition -m "$TMP/$model.ifs" --devices "cpu:$n" --strategy "$strategy" -o "$TMP/plan.ini" >/dev/null ||
            { bad "$model: plan $strategy over cpu:$n"; continue; }
        for args in "--temp 0" "--temp 0.9 --min-p 0.05 --seed 3"; do
            want=$($BIN/iflow-run -m "$TMP/$model.ifs" --plan "$TMP/plan.ini" -p "Once upon a time" -n 48 $args -t 1 2>/dev/null)
            run $MPIRUN -np "$n" $BIN/iflow-run -m "$TMP/$model.ifs" --plan "$TMP/plan.ini" -p "Once upon a time" -n 48 $args -t 1
            expect_rc 0 "$model $strategy over $n processes ($args)"
            expect_eq "$out" "$want" "$model $strategy over $n processes ($args): the text of one process"
        done
        if [ "$strategy" = layer ]; then
            expect_eq "$out" "$($BIN/iflow-run -m "$TMP/$model.ifs" -p "Once upon a time" -n 48 --temp 0.9 --min-p 0.05 --seed 3 -t 1)" \
                "$model layer over $n processes: the text without a plan"
        fi
    done
done

# ---- split files: each process opens its own file only ----
# Each rank gets a directory of its own holding plan.ini and its device's file alone, as one
# machine of several would, and must give the text of the whole model + plan.
printf '#!/bin/sh\nexec "%s" -m "%s/own$OMPI_COMM_WORLD_RANK" "$@"\n' "$BIN/iflow-run" "$TMP" >"$TMP/own.sh"
chmod +x "$TMP/own.sh"
own_dirs() { # own_dirs SPLIT N: own0..own(N-1), each with plan.ini and device-r.ifs of SPLIT
    rm -rf "$TMP"/own[0-9]
    for ((r = 0; r < $2; r++)); do
        mkdir "$TMP/own$r" && cp "$1/plan.ini" "$TMP/own$r/" && ln -s "$1/device-$r.ifs" "$TMP/own$r/"
    done
}
for case in "xs hybrid 4" "s tensor 2" "s layer 3"; do
    set -- $case
    model=$1 strategy=$2 n=$3
    $BIN/iflow-partition -m "$TMP/$model.ifs" --devices "cpu:$n" --strategy "$strategy" -o "$TMP/plan.ini" >/dev/null &&
        $BIN/iflow-partition -m "$TMP/$model.ifs" --plan "$TMP/plan.ini" --split "$TMP/split-$model-$n" >/dev/null ||
        { bad "$model: split $strategy over cpu:$n"; continue; }
    want=$($BIN/iflow-run -m "$TMP/$model.ifs" --plan "$TMP/plan.ini" -p "Once upon a time" -n 48 --temp 0 -t 1 2>/dev/null)
    own_dirs "$TMP/split-$model-$n" "$n"
    run $MPIRUN -np "$n" "$TMP/own.sh" -p "Once upon a time" -n 48 --temp 0 -t 1
    expect_rc 0 "$model $strategy split over $n processes, each with its own file only"
    expect_eq "$out" "$want" "$model $strategy split over $n processes, each with its own file only: the text"
done
# a file of another split (the same shape, weights in Q8_B32) beside process 0's: refused on both
$BIN/iflow-quant -t q8_b32 -i "$TMP/s.ifs" -o "$TMP/s8.ifs" 2>/dev/null
$BIN/iflow-partition -m "$TMP/s.ifs" --devices cpu:2 --strategy layer -o "$TMP/plan.ini" >/dev/null
$BIN/iflow-partition -m "$TMP/s.ifs" --plan "$TMP/plan.ini" --split "$TMP/split-a" >/dev/null
$BIN/iflow-partition -m "$TMP/s8.ifs" --plan "$TMP/plan.ini" --split "$TMP/split-b" >/dev/null
own_dirs "$TMP/split-a" 2
ln -sf "$TMP/split-b/device-1.ifs" "$TMP/own1/device-1.ifs"
run $MPIRUN -np 2 "$TMP/own.sh" -p "Once" -n 4 -t 1
# (mpirun stops the job at the first process that exits, so either message may come first)
expect_match "$err" "iflow-run: ('$TMP/own1/device-1.ifs' is not the model process 0 runs \(a file of a split cut from another model\)|1 of the 2 processes run another model than process 0's)" \
    "a file of another split: refused, named"
own_dirs "$TMP/split-a" 2
mkdir "$TMP/own2" && cp "$TMP/split-a/plan.ini" "$TMP/own2/"
run $MPIRUN -np 3 "$TMP/own.sh" -p "Once" -n 4 -t 1
expect_match "$err" "split model '$TMP/own2' has 2 devices, so there is no device 2 to compute: run one process per device" \
    "a rank beyond the split's devices"

# ---- --comm: auto picks MPI for CPU devices; nccl needs GPUs (tests/gpu/cli.sh runs it) ----
$BIN/iflow-partition -m "$TMP/s.ifs" --devices cpu:2 --strategy tensor -o "$TMP/plan.ini" >/dev/null
want=$($BIN/iflow-run -m "$TMP/s.ifs" --plan "$TMP/plan.ini" -p "Once upon a time" -n 16 --temp 0 -t 1 2>/dev/null)
run $MPIRUN -np 2 $BIN/iflow-run -m "$TMP/s.ifs" --plan "$TMP/plan.ini" -p "Once upon a time" -n 16 --temp 0 -t 1 -v
expect_match "$err" "iflow-run: the processes exchange states over MPI" "--comm auto over CPU devices: MPI, said under -v"
expect_eq "$out" "$want" "--comm auto over CPU devices: the text"
run $MPIRUN -np 2 $BIN/iflow-run -m "$TMP/s.ifs" --plan "$TMP/plan.ini" -p "Once upon a time" -n 16 --temp 0 -t 1 --comm mpi
expect_eq "$out" "$want" "--comm mpi: the text"
run $MPIRUN -np 2 $BIN/iflow-run -m "$TMP/s.ifs" --plan "$TMP/plan.ini" -p "Once" -n 4 -t 1 --comm nccl
expect_match "$err" "iflow-run: (NCCL runs between GPUs: this process's device is cpu|cannot start NCCL: this build has no CUDA)" \
    "--comm nccl over CPU devices: refused"
run $BIN/iflow-run -m "$TMP/s.ifs" -p "Once" -n 4 --comm nccl
expect_match "$err" "iflow-run: under mpirun or --comm nccl, --plan \\(or a split model's own plan\\) gives each process its device" \
    "--comm nccl needs a plan"

# ---- iflow-ppl over several processes: the perplexity of one process, to the last digit ----
WIKI=$DATA/data/wikitext-2-raw/wiki.test.raw
ppl_json() { $BIN/iflow-ppl -f "$WIKI" -c 128 --chunks 3 --json -t 1 "$@" 2>/dev/null | jq .ppl; }
for case in "s layer 2" "xs tensor 2"; do
    set -- $case
    model=$1 strategy=$2 n=$3
    $BIN/iflow-partition -m "$TMP/$model.ifs" --devices "cpu:$n" --strategy "$strategy" -o "$TMP/plan.ini" >/dev/null
    want=$(ppl_json -m "$TMP/$model.ifs" --plan "$TMP/plan.ini")
    run $MPIRUN -np "$n" $BIN/iflow-ppl -m "$TMP/$model.ifs" --plan "$TMP/plan.ini" -f "$WIKI" -c 128 --chunks 3 --json -t 1
    expect_rc 0 "iflow-ppl, $model $strategy over $n processes"
    expect_eq "$(jq .ppl <<<"$out")" "$want" "iflow-ppl, $model $strategy over $n processes: the perplexity of one process"
done
# (a tensor plan sums each layer's halves in another order: within 1e-4 of the whole model's)
expect_close "$want" "$(ppl_json -m "$TMP/xs.ifs")" 1e-4 "iflow-ppl: a tensor plan's perplexity is the model's"
# each process with its own split file only
$BIN/iflow-partition -m "$TMP/s.ifs" --devices cpu:2 --strategy layer -o "$TMP/plan.ini" >/dev/null &&
    $BIN/iflow-partition -m "$TMP/s.ifs" --plan "$TMP/plan.ini" --split "$TMP/split-ppl" >/dev/null
own_dirs "$TMP/split-ppl" 2
printf '#!/bin/sh\nexec "%s" -m "%s/own$OMPI_COMM_WORLD_RANK" "$@"\n' "$BIN/iflow-ppl" "$TMP" >"$TMP/own-ppl.sh"
chmod +x "$TMP/own-ppl.sh"
run $MPIRUN -np 2 "$TMP/own-ppl.sh" -f "$WIKI" -c 128 --chunks 3 --json -t 1
expect_eq "$(jq .ppl <<<"$out")" "$(ppl_json -m "$TMP/s.ifs")" "iflow-ppl from a split, each process its own file: the model's perplexity"
run $MPIRUN -np 2 $BIN/iflow-ppl -m "$TMP/s.ifs" --plan "$TMP/plan.ini" -f "$WIKI" -c 128 --chunks 3 --json -t 1 -v
expect_match "$err" "iflow-ppl: the processes exchange states over MPI" "iflow-ppl --comm auto over CPU devices: MPI, said under -v"
expect_eq "$(jq .ppl <<<"$out")" "$(ppl_json -m "$TMP/s.ifs")" "iflow-ppl --comm auto: the perplexity"
run $MPIRUN -np 2 $BIN/iflow-ppl -m "$TMP/s.ifs" --plan "$TMP/plan.ini" -f "$WIKI" -c 128 --chunks 1 --comm nccl
expect_match "$err" "iflow-ppl: (NCCL runs between GPUs: this process's device is cpu|cannot start NCCL: this build has no CUDA)" \
    "iflow-ppl --comm nccl over CPU devices: refused"
run $MPIRUN -np 2 $BIN/iflow-ppl -m "$TMP/s.ifs" -f "$WIKI" -c 128 --chunks 1
expect_match "$err" "iflow-ppl: under mpirun or --comm nccl, --plan \\(or a split model's own plan\\) gives each process its device" \
    "iflow-ppl under mpirun needs a plan"
run $MPIRUN -np 2 $BIN/iflow-ppl -m "$TMP/s.ifs" --plan "$TMP/plan.ini" -f "$WIKI" -c 128 --chunks 1 --kl-base "$TMP/s.ifs"
expect_match "$err" "iflow-ppl: under mpirun or --comm nccl, --save-imatrix and --kl-base are not available" \
    "iflow-ppl --kl-base under mpirun: refused"
run $BIN/iflow-ppl -m "$TMP/s.ifs" -f "$WIKI" -c 128 --chunks 1 --comm bogus
expect_rc 2 "iflow-ppl --comm bogus: a usage error"

# ---- refusals ----
$BIN/iflow-partition -m "$TMP/s.ifs" --devices cpu:2 --strategy layer -o "$TMP/plan2.ini" >/dev/null
run $MPIRUN -np 3 $BIN/iflow-run -m "$TMP/s.ifs" --plan "$TMP/plan2.ini" -p "Once" -n 4
expect_match "$err" "iflow-run: (3 processes for a placement of 2 devices|this process computes plan device 2, but the plan has 2 devices): run one process per device" \
    "process count must match the plan"
run $MPIRUN -np 2 $BIN/iflow-run -m "$TMP/s.ifs" -p "Once" -n 4
expect_match "$err" "iflow-run: under mpirun or --comm nccl, --plan \\(or a split model's own plan\\) gives each process its device" "--plan is needed"

summary
