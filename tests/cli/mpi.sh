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

# ---- refusals ----
$BIN/iflow-partition -m "$TMP/s.ifs" --devices cpu:2 --strategy layer -o "$TMP/plan2.ini" >/dev/null
run $MPIRUN -np 3 $BIN/iflow-run -m "$TMP/s.ifs" --plan "$TMP/plan2.ini" -p "Once" -n 4
expect_match "$err" "iflow-run: 3 processes for a placement of 2 devices: run one process per device" "process count must match the plan"
run $MPIRUN -np 2 $BIN/iflow-run -m "$TMP/s.ifs" -p "Once" -n 4
expect_match "$err" "iflow-run: under mpirun, --plan gives each process its device" "--plan is needed"

summary
