#!/usr/bin/env bash
# libiflow as an installed library: tools/install.sh (what `make install` runs) into a temporary
# prefix and into a DESTDIR staging tree; examples/generate.c built against the installed copy
# with `pkg-config --cflags --libs iflow` (libiflow.so) and with --static (libiflow.a and its
# Requires.private/Libs.private), both run on stories260K and compared with iflow-run's greedy
# text; libiflow.so exports exactly include/iflow.h's functions, under soname libiflow.so.MAJOR;
# man finds the installed pages from PATH.
. "$(dirname "$0")/lib.sh"
build=${IFLOW_TEST_BUILD:?run through tests/run.sh (IFLOW_TEST_BUILD)}
CC=${CC:-cc}
san=()
case $build in */san*) san=(-fsanitize=address,undefined) ;; esac   # the library is built with them
$BIN/iflow-convert "$DATA/models/stories260K/hf" -o "$TMP/s.ifs" 2>/dev/null || { bad "convert"; summary; exit 1; }

P=$TMP/prefix
run tools/install.sh "$build" "" "$P"
expect_rc 0 "install into a prefix"
major=$(sed -n 's/^#define IFLOW_VERSION_MAJOR //p' include/iflow.h)
for f in include/iflow.h lib/libiflow.a lib/libiflow.so "lib/libiflow.so.$major" lib/pkgconfig/iflow.pc \
    bin/iflow-run share/man/man1/iflow-run.1 share/man/man5/iflow-shard.5 share/man/man7/iflow.7 \
    share/bash-completion/completions/iflow-run share/zsh/site-functions/_iflow-run \
    share/fish/vendor_completions.d/iflow-run.fish share/iflow/specs/llama.ini share/doc/iflow/examples/generate.c; do
    [ -e "$P/$f" ] && ok || bad "installed $f"
done
expect_eq "$(readlink "$P/lib/libiflow.so")" "libiflow.so.$major" "libiflow.so -> the soname"

export PKG_CONFIG_PATH=$P/lib/pkgconfig
run pkg-config --modversion iflow
expect_eq "$out" "$(sed -n 's/^#define IFLOW_VERSION_\(MAJOR\|MINOR\|PATCH\) //p' include/iflow.h | paste -sd.)" "pkg-config version"
run pkg-config --cflags --libs iflow
# (plus the Cflags of the Requires.private packages, which pkg-config adds: utf8proc's -D)
expect_match "$out" "^-I$P/include .*-L$P/lib -liflow *$" "pkg-config --cflags --libs"

# ---- the example, built against the installed copy only (in a folder of its own) ----
mkdir -p "$TMP/ex" && cp "$P/share/doc/iflow/examples/generate.c" "$TMP/ex/"
want=$($BIN/iflow-run -m "$TMP/s.ifs" -p "Once upon a time" -n 40 --temp 0 2>/dev/null)
run bash -c "cd '$TMP/ex' && $CC -std=c11 -Wall -Wextra -Werror ${san[*]} generate.c -o gen \$(pkg-config --cflags --libs iflow)"
expect_rc 0 "build examples/generate.c with pkg-config"
run readelf -d "$TMP/ex/gen"
expect_match "$out" "NEEDED.*\[libiflow\.so\.$major\]" "the program needs the soname"
run env LD_LIBRARY_PATH="$P/lib" "$TMP/ex/gen" "$TMP/s.ifs" "Once upon a time" 40
expect_rc 0 "run the example (libiflow.so)"
expect_eq "$out" "$want" "the example's greedy text equals iflow-run's"
expect_match "$err" "^5 prompt tokens, 40 generated, finished by length$" "the example's summary line"

# static: libiflow.a with what iflow.pc says a static link needs
libs=$(pkg-config --static --libs iflow | sed "s|-liflow|$P/lib/libiflow.a|")
run bash -c "cd '$TMP/ex' && $CC -std=c11 ${san[*]} generate.c -o gen-static \$(pkg-config --cflags iflow) $libs"
expect_rc 0 "static link with pkg-config --static"
run readelf -d "$TMP/ex/gen-static"
[[ $out != *libiflow* ]] && ok || bad "the static program does not need libiflow.so"
run "$TMP/ex/gen-static" "$TMP/s.ifs" "Once upon a time" 40
expect_eq "$out" "$want" "the static example's text"
run "$TMP/ex/gen-static" "$TMP/s.ifs" "Lily" 24 0.8 7
a=$out
run "$TMP/ex/gen-static" "$TMP/s.ifs" "Lily" 24 0.8 7
expect_eq "$out" "$a" "a seeded run repeats"
expect_eq "$out" "$($BIN/iflow-run -m "$TMP/s.ifs" -p Lily -n 24 --temp 0.8 --top-k 40 --top-p 0.95 --seed 7 2>/dev/null)" \
    "a seeded run equals iflow-run's"
run "$TMP/ex/gen-static" "$TMP/nope.ifs" "x"
expect_rc 1 "a missing model"
expect_match "$err" "gen-static: notfound: cannot open .*nope\.ifs" "the error's name and message"

# ---- exports: exactly the header's functions ----
hdr=$(sed -n 's/^IFLOW_API.*[ *]\(iflow_[a-z0-9_]*\)(.*/\1/p' "$P/include/iflow.h" | sort)
exp=$(nm -D --defined-only "$P/lib/libiflow.so.$major" | awk '{print $3}' | sort)
expect_eq "$exp" "$hdr" "libiflow.so exports include/iflow.h's functions and nothing else"
expect_match "$(readelf -d "$P/lib/libiflow.so")" "SONAME.*\[libiflow\.so\.$major\]" "soname"
run readelf -d "$P/lib/libiflow.so"
[[ $out != *libmpi* ]] && ok || bad "libiflow does not link Open MPI"
# the header alone compiles as C++ too (extern "C"), when a C++ compiler is there
if command -v c++ >/dev/null; then
    printf '#include <iflow.h>\nint main() { return iflow_version_number() == 0; }\n' >"$TMP/ex/t.cc"
    run c++ -Wall -Werror -c "$TMP/ex/t.cc" -o "$TMP/ex/t.o" $(pkg-config --cflags iflow)
    expect_rc 0 "iflow.h compiles as C++"
fi

# ---- man finds the installed pages from PATH ----
run env PATH="$P/bin:$PATH" MANPATH= man -w iflow-run
expect_eq "$out" "$P/share/man/man1/iflow-run.1" "man -w iflow-run from the installed bin"
run env PATH="$P/bin:$PATH" MANPATH= man -w iflow
expect_eq "$out" "$P/share/man/man7/iflow.7" "man -w iflow: the overview"

# ---- the installed bash completion defines the completion ----
run bash -c "source '$P/share/bash-completion/completions/iflow-run' && complete -p iflow-run"
expect_match "$out" "^complete .* iflow-run$" "the installed bash completion loads"
[ -x "$P/share/doc/iflow/examples/batch-parallel.sh" ] && ok || bad "example scripts stay executable"

# ---- DESTDIR: a staging tree, paths in iflow.pc are PREFIX's ----
run tools/install.sh "$build" "$TMP/stage" /usr/local
expect_rc 0 "install into DESTDIR"
expect_match "$(cat "$TMP/stage/usr/local/lib/pkgconfig/iflow.pc")" "prefix=/usr/local" "iflow.pc names PREFIX, not DESTDIR"
[ -f "$TMP/stage/usr/local/include/iflow.h" ] && ok || bad "DESTDIR header"
summary
