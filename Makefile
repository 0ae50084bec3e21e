# iflow -- build, test, demo, bench, install.
#
#   make              build bin/iflow-* (all dependencies must be installed; with nvcc, kernels/cuda
#                     too: CUDA=0 leaves them out)
#   make deps         install the Debian -dev packages the build needs, if any are missing
#   make demo         deps + build + convert stories260K + generate a story (the main job)
#   make check        deps + build + the whole test suite (SANITIZE=1: under ASan + UBSan)
#   make bench        deps + build + benchmarks, JSON on stdout
#   make check-gpu    the GPU tests (tests/gpu), on a machine with a GPU (CUDA=1)
#   make check-emu    the GPU tests on the CPU emulation of CUDA (tests/cuda-emu; no GPU needed)
#   make bench-gpu    the GPU benchmarks, JSON on stdout (tools/gpu-bundle.sh packs both for a lent GPU)
#   make fuzz         build the libFuzzer targets (clang) and run each for FUZZ_SECONDS
#   make quality      measure every weight type against F32 (writes docs/quant-quality.*)
#   make docs         regenerate the option lists of man/ and completions/ from the option tables
#   make install      PREFIX=/usr/local [DESTDIR=]: programs, libiflow.a/.so, include/iflow.h,
#                     iflow.pc, man pages, completions, specs (tools/install.sh)
#
# Test data (models, goldens, tokenizer vectors) is read in place from $(IFLOW_TEST_DATA),
# default ../shared.

.DEFAULT_GOAL := all
CC       ?= cc
PREFIX   ?= /usr/local
IFLOW_TEST_DATA ?= ../shared
export IFLOW_TEST_DATA

# LIB_PKGS: what libiflow itself links (iflow.pc's Requires.private); Open MPI is cmd/'s only.
LIB_PKGS := libzstd inih jansson libpcre2-8 libutf8proc libxxhash
PKGS     := $(LIB_PKGS) ompi-c
# TOOLS_NEEDED: commands the tests run (man -l for the pages, script for a terminal, GNU parallel
# and a one-node Slurm cluster for the many-machine recipes; the daemons are in /usr/sbin); their
# packages are in DEBS.
DEBS     := libzstd-dev libinih-dev libjansson-dev libpcre2-dev libutf8proc-dev libxxhash-dev pkg-config jq \
            libopenmpi-dev openmpi-bin man-db groff-base bsdutils parallel munge slurmctld slurmd slurm-client
TOOLS_NEEDED := jq man groff script parallel munged slurmctld slurmd sbatch

# CUDA=1 when nvcc is found (see kernels/cuda below); a CUDA=0 build has a folder of its own.
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(CUDA),)
  CUDA := $(if $(NVCC),1,0)
endif
# CUDA=emu: kernels/cuda built with g++ against the CPU emulation of CUDA (tests/cuda-emu), in a
# folder of its own; make check-emu runs the GPU tests there.
NOCUDA_SUFFIX := $(if $(filter 1,$(CUDA)),,$(if $(filter emu,$(CUDA)),-emu,-nocuda))

ifeq ($(SANITIZE),1)
  BUILD  := build/san$(NOCUDA_SUFFIX)
  OPT    := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDSAN  := -fsanitize=address,undefined
else
  BUILD  := build/rel$(NOCUDA_SUFFIX)
  OPT    := -O2 -g
  LDSAN  :=
endif

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

# -fPIC: the same objects make libiflow.a and libiflow.so; -fno-semantic-interposition keeps
# calls inside the library direct (only include/iflow.h's functions are exported).
PIC      ?= -fPIC -fno-semantic-interposition
CFLAGS   += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fopenmp $(PIC) $(OPT) $(PKG_CFLAGS) -I.
LDLIBS   += $(PKG_LIBS) -lm
LDFLAGS  += -fopenmp $(LDSAN)

# Per-ISA flags for the runtime-dispatched kernel files.
AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c
AVX512BF16_FLAGS := $(AVX512_FLAGS) -mavx512bf16
AMX_FLAGS := $(AVX512BF16_FLAGS) -mamx-tile -mamx-bf16

LIB_SRC  := $(wildcard libcore/*/*.c) $(wildcard kernels/cpu/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)

# ---- CUDA (kernels/cuda) -----------------------------------------------------------------------
# Built when nvcc is found (CUDA=1); `make CUDA=0` builds without. The CUDA runtime is linked
# statically (so the programs start on a machine with no driver and say so when asked for a
# GPU); cuBLAS is dlopen()ed when a GPU is first opened (kernels/cuda/blas.cuh: linking it costs
# every start 150 ms), found through the rpath to the toolkit's lib64.
# sm_80 code also runs on sm_86/sm_89; PTX of compute_90 lets newer GPUs JIT it.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
ifeq ($(CUDA),1)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  # CUDA_DEFS: -D options for kernels/cuda (the kernels' macros, e.g. -DIFKC_MV_DP4A=1)
  NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -I. -Xcompiler -Wall,-Wno-unused-parameter,-fPIC $(CUDA_DEFS)
  CUDA_SRC  := $(wildcard kernels/cuda/*.cu)
  CUDA_OBJ  := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
  LIB_OBJ   += $(CUDA_OBJ)
  CFLAGS    += -DIFLOW_HAVE_CUDA=1
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++
  LDLIBS    += $(CUDA_LIBS)
endif

ifeq ($(CUDA),emu)
  # The CPU emulation (tests/cuda-emu/cuda_emu.h): cu2cc.pl turns each .cu's <<<...>>> launches
  # into calls, g++ compiles the result against the emulation's CUDA headers (no FMA contraction:
  # see cuda_emu.h), emu.o stands for the CUDA runtime, and libcublas.so.emu for cuBLAS (found
  # by kernels/cuda/blas.cu's dlopen through the rpath to $(BUILD)/lib).
  EMU_DIR   := tests/cuda-emu
  EMU_HDR   := $(wildcard $(EMU_DIR)/*.h $(EMU_DIR)/include/*.h)
  EMU_CXXFLAGS := -std=c++17 $(OPT) -fPIC -ffp-contract=off -Wall -Wno-unused-parameter -Wno-unknown-pragmas \
                  -Wno-sign-compare -I. -I$(EMU_DIR)/include $(CUDA_DEFS)
  CUDA_SRC  := $(wildcard kernels/cuda/*.cu)
  CUDA_OBJ  := $(CUDA_SRC:%.cu=$(BUILD)/%.o) $(BUILD)/$(EMU_DIR)/emu.o
  LIB_OBJ   += $(CUDA_OBJ)
  CFLAGS    += -DIFLOW_HAVE_CUDA=1
  # DT_RPATH, not RUNPATH: under ASan dlopen() is called from libasan, and only the program's
  # RPATH applies to every object's dlopen. -rdynamic: the kernels' names in the emulator's
  # messages (emu::kernel_name).
  CUDA_LIBS := -rdynamic -Wl,--disable-new-dtags,-rpath,$(abspath $(BUILD))/lib -ldl -lpthread -lstdc++
  LDLIBS    += $(CUDA_LIBS)
  EMU_CUBLAS := $(BUILD)/lib/libcublas.so.emu
$(BUILD)/%.cc: %.cu $(EMU_DIR)/cu2cc.pl
	@mkdir -p $(dir $@)
	$(EMU_DIR)/cu2cc.pl $< $@
.PRECIOUS: $(BUILD)/%.cc
$(BUILD)/kernels/cuda/%.o: $(BUILD)/kernels/cuda/%.cc $(wildcard kernels/cuda/*.h kernels/cuda/*.cuh) kernels/cpu/quant.h kernels/cpu/kernels.h $(EMU_HDR)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
$(BUILD)/$(EMU_DIR)/emu.o: $(EMU_DIR)/emu.cc $(EMU_HDR)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
$(EMU_CUBLAS): $(EMU_DIR)/cublas.cc $(EMU_HDR)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -shared -o $@ $< $(LDSAN)
else
$(BUILD)/kernels/cuda/%.o: kernels/cuda/%.cu $(wildcard kernels/cuda/*.h kernels/cuda/*.cuh) kernels/cpu/quant.h kernels/cpu/kernels.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
endif

# The kernels' variants that wait for a GPU (docs/GPU-RUNS.md: attention on tensor cores, decode
# products on int8 activations) are off by default; make check compiles them too (sm_90 only,
# not in a SANITIZE=1 build), so that no change breaks them unseen.
CUDA_VARIANTS := $(if $(filter 1,$(CUDA)),$(if $(filter 1,$(SANITIZE)),,$(BUILD)/kernels/cuda/variants/attention-tc.o $(BUILD)/kernels/cuda/variants/matmul-i8.o))
$(BUILD)/kernels/cuda/variants/attention-tc.o: kernels/cuda/attention.cu
$(BUILD)/kernels/cuda/variants/attention-tc.o: VDEFS := -DIFKC_PF_TC=1 -DIFKC_DEC_TC=1
$(BUILD)/kernels/cuda/variants/matmul-i8.o: kernels/cuda/matmul.cu
$(BUILD)/kernels/cuda/variants/matmul-i8.o: VDEFS := -DIFKC_MV_DP4A=1
ifeq ($(CUDA),emu)
# On the emulation the variants are also run (make check-emu-variants: the GPU tests linked with
# them, EMU_VARIANT_BINS below).
CUDA_VARIANTS := $(BUILD)/kernels/cuda/variants/attention-tc.o $(BUILD)/kernels/cuda/variants/matmul-i8.o
$(BUILD)/kernels/cuda/variants/attention-tc.o: $(BUILD)/kernels/cuda/attention.cc
$(BUILD)/kernels/cuda/variants/matmul-i8.o: $(BUILD)/kernels/cuda/matmul.cc
$(BUILD)/kernels/cuda/variants/%.o: $(wildcard kernels/cuda/*.h kernels/cuda/*.cuh) kernels/cpu/quant.h kernels/cpu/kernels.h $(EMU_HDR)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(VDEFS) -c $(filter %.cc,$^) -o $@
else
$(BUILD)/kernels/cuda/variants/%.o: $(wildcard kernels/cuda/*.h kernels/cuda/*.cuh) kernels/cpu/quant.h kernels/cpu/kernels.h
	@mkdir -p $(dir $@)
	$(NVCC) $(filter-out $(CUDA_ARCH),$(NVCCFLAGS)) -gencode arch=compute_90,code=sm_90 $(VDEFS) -c $(filter %.cu,$^) -o $@
endif
LIB      := $(BUILD)/libiflow.a

# The shared library: the same objects, only include/iflow.h's functions exported (a version
# script made from its IFLOW_API lines), soname libiflow.so.MAJOR.
V_MAJOR  := $(shell sed -n 's/^\#define IFLOW_VERSION_MAJOR //p' include/iflow.h)
V_MINOR  := $(shell sed -n 's/^\#define IFLOW_VERSION_MINOR //p' include/iflow.h)
V_PATCH  := $(shell sed -n 's/^\#define IFLOW_VERSION_PATCH //p' include/iflow.h)
VERSION  := $(V_MAJOR).$(V_MINOR).$(V_PATCH)
SO       := $(BUILD)/libiflow.so.$(VERSION)
LIB_LIBS := $(shell pkg-config --libs $(LIB_PKGS) 2>/dev/null) -lgomp -lpthread -lm $(CUDA_LIBS)

$(BUILD)/iflow.map: include/iflow.h
	@mkdir -p $(dir $@)
	{ echo '{ global:'; sed -n 's/^IFLOW_API.*[ *]\(iflow_[a-z0-9_]*\)(.*/    \1;/p' $<; echo '  local: *; };'; } > $@

$(SO): $(LIB_OBJ) $(BUILD)/iflow.map
	$(CC) -shared -Wl,-soname,libiflow.so.$(V_MAJOR) -Wl,--version-script=$(BUILD)/iflow.map -Wl,--no-undefined \
	  $(LDFLAGS) -o $@ $(LIB_OBJ) $(LIB_LIBS)

# iflow.pc with @PREFIX@ and @LIBDIR@ left for tools/install.sh. Libs.private: what a static
# link needs besides the Requires.private packages (OpenMP's runtime, CUDA's when built with it,
# the sanitizers' in a SANITIZE=1 build).
$(BUILD)/iflow.pc.in: Makefile include/iflow.h
	@mkdir -p $(dir $@)
	printf '%s\n' 'prefix=@PREFIX@' 'libdir=@LIBDIR@' 'includedir=$${prefix}/include' '' \
	  'Name: iflow' 'Description: run transformer language models (libiflow)' 'Version: $(VERSION)' \
	  'Requires.private: $(LIB_PKGS)' 'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -liflow' \
	  'Libs.private: $(strip $(LDSAN) -lgomp -lpthread -lm $(CUDA_LIBS))' > $@

lib: $(LIB) $(SO) $(BUILD)/iflow.pc.in
.PHONY: lib

CMD_COMMON := $(filter-out cmd/iflow-%.c,$(wildcard cmd/*.c))
CMD_COMMON_OBJ := $(CMD_COMMON:%.c=$(BUILD)/%.o)
TOOLS    := $(patsubst cmd/%.c,%,$(wildcard cmd/iflow-*.c))
BINS     := $(TOOLS:%=bin/%)

UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(UNIT_SRC:%.c=$(BUILD)/%)
UNIT_COMMON := $(filter-out tests/unit/test_%.c,$(wildcard tests/unit/*.c))
UNIT_HDR := $(wildcard tests/unit/*.h)

FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_SECONDS ?= 20

.PHONY: all deps demo check bench quality fuzz fuzz-deps fuzz-build fuzz-run docs install clean
all: $(BINS) lib $(EMU_CUBLAS)

# ---- library and programs -------------------------------------------------------------------

$(BUILD)/%.o: %.c $(BUILD)/.cflags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/kernels/cpu/%_avx2.o: kernels/cpu/%_avx2.c $(BUILD)/.cflags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/kernels/cpu/%_avx512.o: kernels/cpu/%_avx512.c $(BUILD)/.cflags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/kernels/cpu/%_avx512gfni.o: kernels/cpu/%_avx512gfni.c $(BUILD)/.cflags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/kernels/cpu/%_avx512bf16.o: kernels/cpu/%_avx512bf16.c $(BUILD)/.cflags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512BF16_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/kernels/cpu/%_amx.o: kernels/cpu/%_amx.c $(BUILD)/.cflags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AMX_FLAGS) -MMD -MP -c $< -o $@

# Objects are rebuilt when the compiler flags change (a stamp holding them).
$(BUILD)/.cflags: FORCE
	@mkdir -p $(BUILD)
	@echo '$(CC) $(CFLAGS)' | cmp -s - $@ || echo '$(CC) $(CFLAGS)' > $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# bin/ always holds the build of the last `make` (sanitized or not).
bin/%: $(BUILD)/cmd/%.o $(CMD_COMMON_OBJ) $(LIB)
	@mkdir -p bin
	$(CC) $(LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS)

$(BINS): .build-mode
.build-mode: FORCE
	@echo "$(BUILD)" | cmp -s - $@ || echo "$(BUILD)" > $@
FORCE:

# ---- dependencies ----------------------------------------------------------------------------

deps:
	@missing=; for t in $(TOOLS_NEEDED); do command -v $$t >/dev/null || [ -x /usr/sbin/$$t ] || missing=$$t; done; \
	if pkg-config --exists $(PKGS) 2>/dev/null && [ -z "$$missing" ]; then :; else \
	  echo "make deps: installing $(DEBS)"; \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(DEBS) >/dev/null && \
	  pkg-config --exists $(PKGS) || { echo "make deps: still missing: $(PKGS)" >&2; exit 1; }; \
	fi

# Recursive so that the pkg-config flags are computed after deps has installed the packages.
demo: deps
	@$(MAKE) --no-print-directory all
	@mkdir -p build
	bin/iflow-convert $(IFLOW_TEST_DATA)/models/stories260K/hf -o build/stories260K.ifs
	bin/iflow-convert --info build/stories260K.ifs | head -n 12
	bin/iflow-run -m build/stories260K.ifs -p "Once upon a time" -n 96 --temp 0.8 --top-p 0.9 --seed 42 --echo -v
	@echo
	@echo "== a real instruct model (SmolLM2-135M-Instruct), its chat template from the GGUF:"
	bin/iflow-run -m $(IFLOW_TEST_DATA)/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf --chat \
	  -p "What is the capital of France?" -n 64 --temp 0

# ---- tests -----------------------------------------------------------------------------------

$(BUILD)/tests/unit/test_%: tests/unit/test_%.c $(UNIT_COMMON) $(UNIT_HDR) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(UNIT_COMMON) $(LIB) $(LDLIBS)

# GPU tests (tests/gpu): built by `make check` (so CI catches a CUDA change that breaks them),
# run by `make check-gpu` on a machine with a GPU.
GPU_TEST_SRC := $(if $(filter 1 emu,$(CUDA)),$(wildcard tests/gpu/test_*.c))
GPU_TEST_BIN := $(GPU_TEST_SRC:%.c=$(BUILD)/%)
$(BUILD)/tests/gpu/test_%: tests/gpu/test_%.c $(UNIT_COMMON) $(UNIT_HDR) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(UNIT_COMMON) $(LIB) $(LDLIBS)

check-gpu: deps
	@[ "$(CUDA)" = 1 ] || { echo "make check-gpu: this build has no CUDA (nvcc not found)" >&2; exit 2; }
	@$(MAKE) --no-print-directory all gpu-bins
	@tests/run.sh --gpu $(BUILD)

gpu-bins: $(GPU_TEST_BIN)

ifeq ($(CUDA),emu)
# the emulation's own test (tests/cuda-emu/test_emu.cu), run with the GPU tests
gpu-bins: $(BUILD)/tests/gpu/test_emu
$(BUILD)/tests/gpu/test_emu: $(BUILD)/$(EMU_DIR)/test_emu.cc tests/unit/check.h $(EMU_HDR) $(LIB)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)
# the GPU tests linked with the kernel variants (the variant's objects come before the library)
EMU_VARIANT_BINS := $(BUILD)/tests/gpu-variants/test_cuda_ops-tc $(BUILD)/tests/gpu-variants/test_cuda_matmul-i8
$(BUILD)/tests/gpu-variants/test_cuda_ops-tc: tests/gpu/test_cuda_ops.c $(BUILD)/kernels/cuda/variants/attention-tc.o
$(BUILD)/tests/gpu-variants/test_cuda_matmul-i8: tests/gpu/test_cuda_matmul.c $(BUILD)/kernels/cuda/variants/matmul-i8.o
$(EMU_VARIANT_BINS): $(UNIT_COMMON) $(UNIT_HDR) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c %.o,$^) $(LIB) $(LDLIBS)
endif
.PHONY: gpu-bins check-gpu

# The GPU tests on the CPU emulation of CUDA (tests/cuda-emu): the kernels' logic against their
# CPU references on a machine without a GPU (CI), with two emulated GPUs (tests/gpu/cli.sh's
# two-GPU plans). Its own build folder (build/rel-emu, build/san-emu).
EMU_BUILD := build/$(if $(filter 1,$(SANITIZE)),san,rel)-emu
check-emu: deps
	@$(MAKE) --no-print-directory CUDA=emu all gpu-bins
	@IFLOW_EMU=1 IFLOW_EMU_DEVICES=2 tests/run.sh --gpu $(EMU_BUILD)

# The kernel variants that wait for a GPU (tensor-core attention, int8 decode products), each
# with the GPU test of its kernels, on the emulation.
check-emu-variants: deps
	@$(MAKE) --no-print-directory CUDA=emu all emu-variant-bins
	@IFLOW_EMU=1 tests/run.sh --gpu-variants $(EMU_BUILD)
emu-variant-bins: $(EMU_VARIANT_BINS)
.PHONY: check-emu check-emu-variants emu-variant-bins

# check also builds the benchmark programs (not run: speed is measured by make bench), so a
# change that breaks them fails CI.
check: deps
	@$(MAKE) --no-print-directory all unit-bins gpu-bins $(BENCH_BINS) $(CUDA_VARIANTS)
	@tests/run.sh $(BUILD)

unit-bins: $(UNIT_BIN)
.PHONY: unit-bins

# ---- benchmarks ------------------------------------------------------------------------------

bench: deps
	@$(MAKE) --no-print-directory all $(BUILD)/membw $(BENCH_BINS) >&2
	@bench/bench.sh $(BUILD)

BENCH_BINS := $(BUILD)/kbench $(BUILD)/qbench $(BUILD)/iflow-bench $(BUILD)/batchbench $(BUILD)/shiftbench $(BUILD)/grammarbench $(BUILD)/loragen $(if $(filter 1,$(CUDA)),$(BUILD)/gpubench)
$(sort $(BENCH_BINS) $(BUILD)/gpubench): $(BUILD)/%: bench/%.c bench/bench.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# GPU speed (bench/bench-gpu.sh): kernels (bench/gpubench.c) and whole models on cuda:0, JSON.
bench-gpu: deps
	@[ "$(CUDA)" = 1 ] || { echo "make bench-gpu: this build has no CUDA (nvcc not found)" >&2; exit 2; }
	@$(MAKE) --no-print-directory all $(BUILD)/iflow-bench $(BUILD)/gpubench >&2
	@bench/bench-gpu.sh $(BUILD)
.PHONY: bench-gpu

# membw.c is written for AVX-512; on a CPU without it, bench/membw-avx2.h maps its vectors onto
# pairs of AVX ones (the same loads of the same bytes).
$(BUILD)/membw: $(IFLOW_TEST_DATA)/tools/membw.c bench/membw-avx2.h
	@mkdir -p $(dir $@)
	$(CC) -O3 -march=native -fopenmp $$(grep -qw avx512f /proc/cpuinfo || echo -include bench/membw-avx2.h) $< -o $@

# ---- fuzzing (clang + libFuzzer) -------------------------------------------------------------

FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fopenmp $(PKG_CFLAGS) -I. -DIFK_NO_SIMD
FUZZ_LIB_SRC := $(filter-out kernels/cpu/%_avx2.c kernels/cpu/%_avx512.c kernels/cpu/%_avx512gfni.c kernels/cpu/%_avx512bf16.c kernels/cpu/%_amx.c,$(LIB_SRC))
FUZZ_OBJ := $(FUZZ_LIB_SRC:%.c=build/fuzz/obj/%.o)
fuzz-build: $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/%)
.SECONDARY: $(FUZZ_OBJ)
build/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
build/fuzz/%: tests/fuzz/%.c $(FUZZ_OBJ)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJ) $(LDLIBS)

fuzz-deps:
	@command -v clang >/dev/null || { SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq clang >/dev/null; }

fuzz: deps fuzz-deps
	@$(MAKE) --no-print-directory fuzz-build
	@$(MAKE) --no-print-directory fuzz-run

fuzz-run:
	@for f in $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/%); do \
	  n=$$(basename $$f); mkdir -p build/fuzz/corpus-$$n; seeds=tests/fuzz/seeds/$$n; [ -d $$seeds ] || seeds=; \
	  echo "== $$n ($(FUZZ_SECONDS)s)"; \
	  if $$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 build/fuzz/corpus-$$n $$seeds >build/fuzz/$$n.log 2>&1; \
	  then tail -n 1 build/fuzz/$$n.log; else tail -n 40 build/fuzz/$$n.log; echo "fuzz: $$n failed" >&2; exit 1; fi; \
	done

# ---- quantization quality (docs/QUANTIZATION.md) --------------------------------------------

quality: deps
	@$(MAKE) --no-print-directory all
	tools/quality.sh

# ---- docs, install ---------------------------------------------------------------------------

docs: all
	tools/gendocs.sh

install: all
	tools/install.sh "$(BUILD)" "$(DESTDIR)" "$(PREFIX)"

clean:
	rm -rf build bin .build-mode

-include $(FUZZ_OBJ:.o=.d) $(LIB_OBJ:.o=.d) $(CMD_COMMON_OBJ:.o=.d) $(TOOLS:%=$(BUILD)/cmd/%.d)
