#!/usr/bin/env bash
# The man pages' option lists and the completions are generated from the option tables
# (make docs); this fails when a committed file differs from what the tables give now.
. "$(dirname "$0")/lib.sh"
tools/gendocs.sh "$TMP/gen" >/dev/null
for bin in $BIN/iflow-*; do
    name=$(basename "$bin")
    for f in man/$name.1 completions/bash/$name completions/zsh/_$name completions/fish/$name.fish; do
        cmp -s "$f" "$TMP/gen/$f" && ok || bad "$f is out of date with the option table of $name (run make docs)"
    done
    # every option of the table appears in --help, the man page and each completion
    for o in $("$bin" --help | grep -oE -- '--[a-z][a-z-]+' | sort -u); do
        sed 's/\\-/-/g' "man/$name.1" | grep -q -- "$o" && grep -q -- "$o" "completions/bash/$name" &&
            grep -q -- "$o" "completions/zsh/_$name" && grep -q -- "-l ${o#--}" "completions/fish/$name.fish" &&
            ok || bad "$name: option $o missing from a man page or completion"
    done
done
for page in man/*.[157]; do
    run man --warnings -l -Tutf8 "$page"
    [ "$rc" = 0 ] && [ -z "$err" ] && ok || bad "man $page: exit $rc, $err"
done
# iflow(7) is the overview: its SEE ALSO names every other page, and every page names it
see_also() { sed -n '/^\.SH SEE ALSO/,/^\.SH/p' "$1" | sed -n 's/^\.BR \([a-z-]*\) (\([0-9]\)).*/\1.\2/p'; }
for page in man/*.[15]; do
    p=$(basename "$page")
    see_also man/iflow.7 | grep -qx "$p" && ok || bad "iflow(7)'s SEE ALSO does not name $p"
    see_also "$page" | grep -qx iflow.7 && ok || bad "$page's SEE ALSO does not name iflow(7)"
done
summary
