#!/usr/bin/env bash
# tools/gendocs.sh [OUTDIR] -- write, from each program's option table (bin/iflow-* --iflow-doc),
# the OPTIONS section of man/iflow-X.1 (between the BEGIN/END OPTIONS markers) and its bash, zsh
# and fish completions. Without OUTDIR it updates the tree (`make docs`); with one it writes
# there, which is how tests/cli/docs.sh checks that the committed files have not drifted.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.}
mkdir -p "$out/man" "$out/completions/bash" "$out/completions/zsh" "$out/completions/fish"
for bin in bin/iflow-*; do
    name=$(basename "$bin")
    page=man/$name.1
    [ -f "$page" ] || { echo "gendocs: no man page $page for $name" >&2; exit 1; }
    OPTS=$("$bin" --iflow-doc=man) awk '
        /^\.\\" BEGIN OPTIONS/ { print; print ENVIRON["OPTS"]; skip = 1; next }
        /^\.\\" END OPTIONS/   { skip = 0 }
        !skip' "$page" >"$out/man/$name.1.tmp"
    mv "$out/man/$name.1.tmp" "$out/man/$name.1"
    "$bin" --iflow-doc=bash >"$out/completions/bash/$name"
    "$bin" --iflow-doc=zsh >"$out/completions/zsh/_$name"
    "$bin" --iflow-doc=fish >"$out/completions/fish/$name.fish"
done
