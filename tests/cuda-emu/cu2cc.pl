#!/usr/bin/perl
# cu2cc.pl IN.cu OUT.cc -- a kernels/cuda source as C++ for the CPU emulation (cuda_emu.h).
# Two changes, each within a line so that line numbers stay those of IN:
#   kernel<T...><<<grid, block, smem, stream>>>(args)  ->  emu::launcher(grid, block, smem, stream).run("kernel<T...>", kernel<T...>, args)
#   extern __shared__ [__align__(n)] T name[];         ->  T *name = (T *)emu::dyn_smem();
# A launch this does not recognise stays as it is, and g++ stops at its <<<.
use strict;
use warnings;

my ($in, $out) = @ARGV;
die "usage: cu2cc.pl IN.cu OUT.cc\n" unless defined $out;
open(my $fh, '<', $in) or die "cu2cc.pl: cannot read $in: $!\n";
my @lines = <$fh>;
close $fh;
my $n = 0;
for (@lines) {
    $n += s{\b([A-Za-z_]\w*(?:<[^;<>]*(?:<[^;<>]*>[^;<>]*)*>)?)<<<(.*?)>>>\(\s*\)}{emu::launcher($2).run("$1", $1)}g;
    $n += s{\b([A-Za-z_]\w*(?:<[^;<>]*(?:<[^;<>]*>[^;<>]*)*>)?)<<<(.*?)>>>\(}{emu::launcher($2).run("$1", $1, }g;
    s{\bextern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w\s]*?\w)\s+(\w+)\s*\[\s*\]\s*;}{$1 *$2 = ($1 *)emu::dyn_smem();}g;
}
open(my $oh, '>', "$out.tmp") or die "cu2cc.pl: cannot write $out.tmp: $!\n";
print $oh "#line 1 \"$in\"\n", @lines;
close $oh or die "cu2cc.pl: cannot write $out.tmp: $!\n";
rename("$out.tmp", $out) or die "cu2cc.pl: cannot rename $out.tmp: $!\n";
