# fiattn - build, test, install.  GNU make.
#
#   make            library (shared + static), fiplan, tests, benches; nvcc compiles the
#                   executor for sm_90a in every build (CI proves it compiles and links)
#   make run        plan + execute + check the embedded default batch (README Quick start)
#   make test       CPU test suite (cmocka); no GPU needed
#   make gpu-test   GPU test suite (skips cleanly without a GPU), then the Python GPU tests
#   make pytest     Python layer tests (python/tests; run by make test when pytest is there)
#   make asan       ASan + UBSan build of the CPU tests (jemalloc off), then run them
#   make lint       cppcheck on the C sources
#   make fuzz       libFuzzer harness (clang, ASan + UBSan) for FUZZ_SECONDS (default 60)
#   make install / uninstall   PREFIX=/usr/local DESTDIR=
#
# Knobs: CC, NVCC, CUDA_HOME, OPT, SANITIZE=1, NO_JEMALLOC=1, GPU_ARCH, WERROR=1 (C warnings
# are errors; CI sets it and checks the whole log with scripts/check-build-log.sh).

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CC        ?= gcc
PREFIX    ?= /usr/local
DESTDIR   ?=
OPT       ?= -O2
GPU_ARCH  ?= -gencode=arch=compute_90a,code=sm_90a
PKG_CONFIG ?= pkg-config

# The version lives in include/fiattn.h (FIATTN_VERSION_MAJOR / _MINOR / _PATCH).
VERSION := $(shell for k in MAJOR MINOR PATCH; do \
               sed -n "s/^\#define FIATTN_VERSION_$$k  *\([0-9][0-9]*\).*/\1/p" include/fiattn.h; \
           done | paste -sd.)
# The soname carries the major version.
SOVER   := $(firstword $(subst ., ,$(VERSION)))

BUILD := build
ifeq ($(PROFILE),1)
BUILD := build-prof
PROF_FLAGS := -DFI_PROFILE
endif
ifeq ($(SANITIZE),1)
BUILD := build-asan
NO_JEMALLOC := 1
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif

INCLUDES := -Iinclude -I. -I$(CUDA_HOME)/include
CFLAGS   := -std=c11 $(OPT) -g -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter \
            -fPIC -D_POSIX_C_SOURCE=200809L -MMD -MP $(INCLUDES) $(SAN_FLAGS) $(PROF_FLAGS)
NVFLAGS  := -std=c++17 $(OPT) $(GPU_ARCH) -Xcompiler -fPIC -MMD -MP $(INCLUDES) \
            --expt-relaxed-constexpr -Xptxas --warn-on-spills -lineinfo $(PROF_FLAGS)
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++
LDLIBS   := -lm $(SAN_FLAGS)
ifeq ($(WERROR),1)
CFLAGS   += -Werror
endif

ifeq ($(NO_JEMALLOC),1)
TOOL_CFLAGS := -DFI_NO_JEMALLOC
TOOL_LIBS   :=
else
TOOL_CFLAGS :=
TOOL_LIBS   := -ljemalloc
endif
GV_CFLAGS := $(shell $(PKG_CONFIG) --cflags libgvc libcgraph 2>/dev/null)
GV_LIBS   := $(shell $(PKG_CONFIG) --libs libgvc libcgraph 2>/dev/null || echo -lgvc -lcgraph -lcdt)
# The plugins live in <libdir>/graphviz/, off the linker's and the loader's default paths.
GV_PLUGIN_DIR := $(shell $(PKG_CONFIG) --variable=libdir libgvc 2>/dev/null || echo /usr/lib/x86_64-linux-gnu)/graphviz
GV_PLUGIN_LIBS := $(shell ls $(GV_PLUGIN_DIR)/libgvplugin_dot_layout.so* >/dev/null 2>&1 && echo -L$(GV_PLUGIN_DIR) -Wl,-rpath,$(GV_PLUGIN_DIR) -Wl,--no-as-needed -lgvplugin_dot_layout -lgvplugin_core)
CMOCKA_LIBS := -lcmocka

# ---- sources ---------------------------------------------------------------------------
LIB_C   := $(wildcard plan/*.c planner/*.c workspace/*.c executor/core/*.c executor/cpu/*.c executor/*/*_host.c)
LIB_CU  := $(wildcard executor/*/*.cu planner/device/*.cu)
LIB_OBJ := $(LIB_C:%.c=$(BUILD)/%.o) $(LIB_CU:%.cu=$(BUILD)/%.cu.o)
COMMON_C := $(wildcard tests/common/*.c)
COMMON_OBJ := $(COMMON_C:%.c=$(BUILD)/%.o)
TRACE_C := $(wildcard viz/trace*.c viz/batch*.c)
TRACE_OBJ := $(TRACE_C:%.c=$(BUILD)/%.o)
VIZ_C   := $(filter-out $(TRACE_C),$(wildcard viz/*.c))
VIZ_OBJ := $(VIZ_C:%.c=$(BUILD)/%.o)
TEST_C  := $(wildcard tests/test_*.c)
TESTS   := $(TEST_C:tests/%.c=$(BUILD)/tests/%)
GPU_TEST_C := $(wildcard tests/gpu/test_*.c)
GPU_TESTS  := $(GPU_TEST_C:tests/gpu/%.c=$(BUILD)/tests/gpu/%)
BENCH_C := $(wildcard bench/*.c)
BENCH_CU := $(wildcard bench/*.cu)
BENCHES := $(BENCH_C:bench/%.c=$(BUILD)/bench/%) $(BENCH_CU:bench/%.cu=$(BUILD)/bench/%)
# Device code the C benches link (bench/support: the L2 flush).
BENCH_SUPPORT_CU := $(wildcard bench/support/*.cu)
BENCH_SUPPORT_OBJ := $(BENCH_SUPPORT_CU:%.cu=$(BUILD)/%.cu.o)
# Stand-alone CUDA reproducers (scripts/README.md): built so that CI compiles every GPU source.
SCRIPT_CU := $(wildcard scripts/*.cu)
SCRIPT_BINS := $(SCRIPT_CU:scripts/%.cu=$(BUILD)/scripts/%)

LIB_A  := $(BUILD)/libfiattn.a
LIB_SO := $(BUILD)/libfiattn.so.$(VERSION)
FIPLAN := $(BUILD)/fiplan

# Objects built on the way to a program (tests/common, viz/trace*) are kept, not deleted as
# intermediates (no stray `rm` at the end of `make test`, no rebuild on the next run).
.SECONDARY:

.PHONY: all lib test pytest gpu-test gpu-pytest asan profile lint install uninstall clean run bench fuzz print-version
all: lib $(FIPLAN) $(TESTS) $(GPU_TESTS) $(BENCHES) $(SCRIPT_BINS)
lib: $(LIB_A) $(LIB_SO)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(LIB_A): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIB_SO): $(LIB_OBJ) fiattn.map
	$(CC) -shared -Wl,-soname,libfiattn.so.$(SOVER) -Wl,--version-script=fiattn.map \
	    -o $@ $(LIB_OBJ) $(CUDA_LIBS) $(LDLIBS)
	ln -sf libfiattn.so.$(VERSION) $(BUILD)/libfiattn.so.$(SOVER)
	ln -sf libfiattn.so.$(VERSION) $(BUILD)/libfiattn.so

# Programs link the static library (no rpath games, one binary to carry).
$(FIPLAN): $(VIZ_OBJ) $(TRACE_OBJ) $(LIB_A)
	$(CC) $(CFLAGS) -o $@ $(VIZ_OBJ) $(TRACE_OBJ) $(LIB_A) $(GV_LIBS) $(GV_PLUGIN_LIBS) $(TOOL_LIBS) $(CUDA_LIBS) $(LDLIBS)
$(VIZ_OBJ) $(TRACE_OBJ): CFLAGS += $(TOOL_CFLAGS) $(GV_CFLAGS)
# The bundled trace excerpt is pulled in by .incbin (not seen by -MMD).
$(BUILD)/viz/trace_embed.o: data/azure_conv_2048.csv

$(BUILD)/tests/%: tests/%.c $(COMMON_OBJ) $(TRACE_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TOOL_CFLAGS) -Itests -o $@ $< $(COMMON_OBJ) $(TRACE_OBJ) $(LIB_A) $(CMOCKA_LIBS) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/tests/gpu/%: tests/gpu/%.c $(COMMON_OBJ) $(TRACE_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TOOL_CFLAGS) -Itests -o $@ $< $(COMMON_OBJ) $(TRACE_OBJ) $(LIB_A) $(CMOCKA_LIBS) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(COMMON_OBJ) $(TRACE_OBJ) $(BENCH_SUPPORT_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TOOL_CFLAGS) -Itests -o $@ $< $(COMMON_OBJ) $(TRACE_OBJ) $(BENCH_SUPPORT_OBJ) $(LIB_A) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/bench/%: bench/%.cu $(LIB_A)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -o $@ $< $(LIB_A) -lcublas -lcublasLt

$(BUILD)/scripts/%: scripts/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -o $@ $<

# ---- running ---------------------------------------------------------------------------
# The main job: plan a realistic decode step (128 requests of the bundled Azure trace at
# step 100, MLA with 16 heads as DeepSeek-V3 under tensor parallelism 8: bench_mla's
# trace128 case), print each figure with one line on what it means, write plan.svg (CTAs
# wrapped 8 a row), execute on the GPU when there is one (time and GB/s over 10 runs) or
# else on the CPU reference executor, and check against the fp64 naive reference.
run: $(FIPLAN)
	$(FIPLAN) --batch 128 --step 100 --heads 16 --execute --explain --svg plan.svg

test: $(TESTS) $(FIPLAN) $(LIB_SO)
	@fail=0; for t in $(TESTS); do echo "== $$t"; $$t || fail=1; done; \
	  if [ -x tests/cli_test.sh ]; then echo "== tests/cli_test.sh"; FIPLAN=$(FIPLAN) sh tests/cli_test.sh || fail=1; fi; \
	  echo "== tests/build_log_test.sh"; sh tests/build_log_test.sh || fail=1; \
	  if [ "$(SANITIZE)" = 1 ]; then echo "== python/tests skipped in the sanitizer build (python cannot load an ASan library without its runtime)"; \
	  elif $(PYTHON) -c 'import pytest' 2>/dev/null; then echo "== python/tests"; \
	    $(MAKE) --no-print-directory pytest || fail=1; \
	  else echo "== python/tests skipped: no pytest (scripts/install-python-deps.sh)"; fi; \
	  exit $$fail

# The Python layer (python/fiattn over $(BUILD)/libfiattn.so): CPU tests; GPU ones skip.
PYTHON ?= python3
pytest: $(LIB_SO)
	cd python && FIATTN_LIBRARY=$(CURDIR)/$(BUILD)/libfiattn.so $(PYTHON) -m pytest -q --ignore=tests/gpu tests

# The MLA suite runs four times: the default rows (the mma.sync body below 32 heads, the
# wgmma body from 32 on), then every case on each body (FI_MLA_TEST_VARIANT 4: mma.sync,
# 3: wgmma, 6: the 64-token wgmma body; tests/gpu/mla_gpu_case.h).  Every tests/gpu/test_*.c is in GPU_TESTS (e.g.
# test_mla_fp8_gpu: fp8 caches and sparse top-k plans, which only the wgmma body runs).
gpu-test: $(GPU_TESTS)
	@fail=0; for t in $(GPU_TESTS); do echo "== $$t"; $$t || fail=1; done; \
	  for v in 4 3 6 9; do echo "== $(BUILD)/tests/gpu/test_mla_gpu, FI_MLA_TEST_VARIANT=$$v"; \
	    FI_MLA_TEST_VARIANT=$$v $(BUILD)/tests/gpu/test_mla_gpu || fail=1; done; \
	  echo "== python/tests/gpu"; $(MAKE) --no-print-directory gpu-pytest || fail=1; exit $$fail

# Python GPU tests (fp64 references, CUDA graphs, FlashInfer side by side when importable);
# skip cleanly without torch + CUDA.
gpu-pytest: $(LIB_SO)
	@if $(PYTHON) -c 'import pytest, torch' 2>/dev/null; then \
	  cd python && FIATTN_LIBRARY=$(CURDIR)/$(BUILD)/libfiattn.so $(PYTHON) -m pytest -q -rs tests/gpu; \
	else echo "python GPU tests skipped: no pytest / torch (scripts/install-python-deps.sh)"; fi

bench: $(BENCHES)

asan:
	$(MAKE) SANITIZE=1 test

# The one profiling build (-DFI_PROFILE: per-CTA %globaltimer stamps, executor/cuda/common/
# profile.cuh) into build-prof/: library and benches; bench_mla and bench_gqa print the stamps.
profile:
	$(MAKE) PROFILE=1 lib bench

# (FI_PLANNER_DEVICE_TU is the device planner's .cu build of the planner sources, which
# cppcheck does not read: its configuration is left out.)
lint:
	cppcheck --std=c11 --enable=warning,performance,portability --error-exitcode=1 \
	    --inline-suppr --suppress=missingIncludeSystem -UFI_PLANNER_DEVICE_TU -Iinclude -I. \
	    plan planner workspace executor/*.c executor/core executor/cpu viz tests bench
	$(PYTHON) -m pyflakes python examples bench scripts

# ---- fuzzing ---------------------------------------------------------------------------
# libFuzzer harness over batch validation + fi_plan_update on host-only plans
# (tests/fuzz/README.md): the library's C sources, the harness and tests/common rebuilt
# with clang, ASan + UBSan and coverage.  make fuzz FUZZ_SECONDS=N (default 60).
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_BUILD   := build-fuzz
FUZZ_FLAGS   := -std=c11 -O2 -g -Wall -Wextra -Wno-unused-parameter -D_POSIX_C_SOURCE=200809L \
                -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined \
                $(INCLUDES) -Itests
FUZZ_OBJ     := $(LIB_C:%.c=$(FUZZ_BUILD)/%.o)
FUZZ_LIB     := $(FUZZ_BUILD)/libfiattn_host.a
FUZZ_BIN     := $(FUZZ_BUILD)/fuzz_plan_update

FUZZ_TEST_OBJ := $(FUZZ_BUILD)/tests/fuzz/fuzz_plan_update.o $(FUZZ_BUILD)/tests/common/plan_check.o

# Coverage feedback from the library only: the harness and the checker (test code, where
# most of the time goes) get the sanitizers without the coverage hooks.
$(FUZZ_OBJ): $(FUZZ_BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
$(FUZZ_TEST_OBJ): $(FUZZ_BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -MMD -MP -c $< -o $@

# An archive, so only what a host-only plan reaches is linked.  The registration table
# names the GPU families, so their launchers come along: the nvcc objects of the normal
# build, linked as they are (no sanitizer in device code; never called here).
$(FUZZ_LIB): $(FUZZ_OBJ)
	rm -f $@ && ar rcs $@ $^

FUZZ_CU_OBJ := $(LIB_CU:%.cu=$(BUILD)/%.cu.o)
$(FUZZ_BIN): $(FUZZ_TEST_OBJ) $(FUZZ_LIB) $(FUZZ_CU_OBJ)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -o $@ $^ $(CUDA_LIBS) -lm

fuzz: $(FUZZ_BIN)
	@mkdir -p $(FUZZ_BUILD)/corpus
	$(FUZZ_BIN) -max_total_time=$(FUZZ_SECONDS) -timeout=20 -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_BUILD)/ $(FUZZ_BUILD)/corpus
-include $(shell find $(FUZZ_BUILD) -name '*.d' 2>/dev/null)

# ---- install ---------------------------------------------------------------------------
LIBDIR := $(PREFIX)/lib
INCDIR := $(PREFIX)/include
BINDIR := $(PREFIX)/bin

$(BUILD)/fiattn.pc: fiattn.pc.in
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@CUDA_HOME@|$(CUDA_HOME)|' $< > $@

install: lib $(FIPLAN) $(BUILD)/fiattn.pc
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCDIR) $(DESTDIR)$(BINDIR)
	install -m 644 include/fiattn*.h $(DESTDIR)$(INCDIR)/
	install -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/
	ln -sf libfiattn.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libfiattn.so.$(SOVER)
	ln -sf libfiattn.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libfiattn.so
	install -m 644 $(BUILD)/fiattn.pc $(DESTDIR)$(LIBDIR)/pkgconfig/
	install -m 755 $(FIPLAN) $(DESTDIR)$(BINDIR)/

print-version:
	@echo $(VERSION)

uninstall:
	rm -f $(DESTDIR)$(INCDIR)/fiattn.h $(DESTDIR)$(INCDIR)/fiattn_work.h \
	      $(DESTDIR)$(INCDIR)/fiattn_run.h $(DESTDIR)$(INCDIR)/fiattn_ref.h \
	      $(DESTDIR)$(LIBDIR)/libfiattn.a $(DESTDIR)$(LIBDIR)/libfiattn.so* \
	      $(DESTDIR)$(LIBDIR)/pkgconfig/fiattn.pc $(DESTDIR)$(BINDIR)/fiplan

clean:
	rm -rf build build-asan build-fuzz plan.svg

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
