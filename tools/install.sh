#!/usr/bin/env bash
# tools/install.sh BUILD DESTDIR PREFIX -- install iflow (what `make install` runs).
#
#   PREFIX/bin/iflow-*                         the programs (from bin/)
#   PREFIX/lib/libiflow.a, libiflow.so.X.Y.Z   the library (BUILD/), with the links
#        libiflow.so.X (the soname) and libiflow.so (for -liflow)
#   PREFIX/lib/pkgconfig/iflow.pc              for `pkg-config --cflags --libs iflow`
#   PREFIX/include/iflow.h                     the public header
#   PREFIX/share/man/man{1,5,7}/               the manual pages (man finds them from PATH's bin)
#   PREFIX/share/bash-completion/completions/, share/zsh/site-functions/,
#        share/fish/vendor_completions.d/      the completions, where each shell looks
#   PREFIX/share/iflow/specs/                  the model specs (spec_dirs() in cmd/opt.h)
#   PREFIX/share/doc/iflow/examples/           examples/
#
# DESTDIR (may be empty) is prepended to every path, for staging a package; the paths written
# into iflow.pc are PREFIX's. LIBDIR (environment) overrides PREFIX/lib.
set -eu
build=${1:?usage: tools/install.sh BUILD DESTDIR PREFIX}
destdir=${2-}
prefix=${3:?usage: tools/install.sh BUILD DESTDIR PREFIX}
libdir=${LIBDIR:-$prefix/lib}
cd "$(dirname "$0")/.."

so=$(cd "$build" && ls libiflow.so.*.*.* 2>/dev/null | head -n 1)
[ -n "$so" ] && [ -f "$build/libiflow.a" ] && [ -f "$build/iflow.pc.in" ] ||
    { echo "tools/install.sh: no library in '$build' (run make first)" >&2; exit 1; }
soname=${so%.*.*}   # libiflow.so.X

d=$destdir$prefix l=$destdir$libdir
install -d "$d/bin" "$l/pkgconfig" "$d/include" "$d/share/man/man1" "$d/share/man/man5" "$d/share/man/man7" \
    "$d/share/bash-completion/completions" "$d/share/zsh/site-functions" "$d/share/fish/vendor_completions.d" \
    "$d/share/iflow/specs" "$d/share/doc/iflow/examples"
for t in bin/iflow-*; do install -m 755 "$t" "$d/bin/"; done
install -m 644 "$build/libiflow.a" "$l/"
install -m 755 "$build/$so" "$l/"
ln -sf "$so" "$l/$soname"
ln -sf "$soname" "$l/libiflow.so"
sed -e "s|@PREFIX@|$prefix|" -e "s|@LIBDIR@|$libdir|" "$build/iflow.pc.in" > "$l/pkgconfig/iflow.pc"
chmod 644 "$l/pkgconfig/iflow.pc"
install -m 644 include/iflow.h "$d/include/"
for s in 1 5 7; do
    for p in man/*.$s; do [ -f "$p" ] && install -m 644 "$p" "$d/share/man/man$s/"; done
done
install -m 644 specs/*.ini "$d/share/iflow/specs/"
[ ! -f docs/quant-quality.tsv ] || install -m 644 docs/quant-quality.tsv "$d/share/iflow/"
for t in bin/iflow-*; do
    t=$(basename "$t")
    [ -f "completions/bash/$t" ] && install -m 644 "completions/bash/$t" "$d/share/bash-completion/completions/$t"
    [ -f "completions/zsh/_$t" ] && install -m 644 "completions/zsh/_$t" "$d/share/zsh/site-functions/_$t"
    [ -f "completions/fish/$t.fish" ] && install -m 644 "completions/fish/$t.fish" "$d/share/fish/vendor_completions.d/$t.fish"
done
for e in examples/*; do
    [ -f "$e" ] || continue
    if [ -x "$e" ]; then install -m 755 "$e" "$d/share/doc/iflow/examples/"; else install -m 644 "$e" "$d/share/doc/iflow/examples/"; fi
done
exit 0
