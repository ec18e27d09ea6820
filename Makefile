# whittle's entry points. `make test` and `make demo` work on a fresh Debian 12 machine: they
# install what is missing (scripts/setup.sh), configure and build, then act.

SHELL := /bin/bash
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_ARGS ?=
CTEST_ARGS ?=
# The sanitizer build (clang, AddressSanitizer + UndefinedBehaviorSanitizer, libFuzzer coverage):
# `make test-sanitize` runs the C++ unit tests and the fuzz regression inputs in it; `make fuzz`
# fuzzes every reader for FUZZ_SECONDS each (docs/reliability.md).
SANITIZE_DIR ?= build-sanitize
FUZZ_SECONDS ?= 60
# clang's precompiled header records the folder it was built in, so ccache misses with it in a fresh
# clone: the sanitizer tree goes without (ON builds a tree's cold files faster, in that folder only).
# Read when the tree is first configured; `cmake -B build-sanitize -DWHITTLE_PCH=ON` changes it later.
SANITIZE_PCH ?= OFF
FUZZ_TARGETS ?=
# allocator_may_return_null: a malloc that cannot be met returns NULL, as it does outside the
# sanitizer (libhdf5 asks for what a damaged file declares and reports the failure as an error);
# operator new still aborts with a report, and LibTorch's allocator throws (a fuzz finding).
SANITIZE_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:allocator_may_return_null=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitize/lsan.supp

.PHONY: all setup configure build test demo format install clean test-sanitize fuzz fuzz-build

all: build

setup:
	@scripts/setup.sh

configure: setup
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  echo "[make] configuring $(BUILD_DIR)/ (CMake, Ninja, Release)"; \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS); \
	fi

build: configure
	@echo "[make] building with $(JOBS) jobs"
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@echo "[make] running the test suite (CTest)"
	@# The accuracy summary (per method: seeds, mean, spread, floor) is printed after CTest, then
	@# CTest's closing line again, so that the output still ends with it.
	@cd $(BUILD_DIR) && rm -f testdata/recipe_accuracy/summary.txt && \
	  set -o pipefail && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS) | tee ctest-output.txt; rc=$$?; \
	  if [ -f testdata/recipe_accuracy/summary.txt ]; then echo; cat testdata/recipe_accuracy/summary.txt; echo; \
	    grep -E '^[0-9]+% tests passed' ctest-output.txt | tail -1; fi; exit $$rc

# The unit tests: every GoogleTest suite and the fuzz regression runs; not the Python reference
# checks, the long accuracy runs or the install test (they exercise the same code unsanitized).
test-sanitize: fuzz-build
	@echo "[make] running the unit tests under AddressSanitizer and UndefinedBehaviorSanitizer"
	@cd $(SANITIZE_DIR) && $(SANITIZE_ENV) ctest --output-on-failure -j $(JOBS) -LE 'python|install' $(CTEST_ARGS)

fuzz-build: setup
	@if [ ! -f $(SANITIZE_DIR)/build.ninja ]; then \
	  echo "[make] configuring $(SANITIZE_DIR)/ (clang, ASan + UBSan, libFuzzer)"; \
	  CC=clang CXX=clang++ cmake -S . -B $(SANITIZE_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	    -DCMAKE_CXX_FLAGS=-gline-tables-only -DCMAKE_C_FLAGS=-gline-tables-only \
	    "-DWHITTLE_SANITIZE=address;undefined" -DWHITTLE_FUZZ=ON -DWHITTLE_CUDA=OFF \
	    -DWHITTLE_BUILD_BENCHMARKS=OFF -DWHITTLE_PCH=$(SANITIZE_PCH) $(CMAKE_ARGS); \
	fi
	@echo "[make] building $(SANITIZE_DIR)/ with $(JOBS) jobs"
	@$(SANITIZE_ENV) cmake --build $(SANITIZE_DIR) -j $(JOBS)

fuzz: fuzz-build
	@$(SANITIZE_ENV) scripts/fuzz.sh $(SANITIZE_DIR) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

demo: build
	@scripts/demo.sh $(BUILD_DIR)

install: build
	@cmake --install $(BUILD_DIR) --prefix $(or $(PREFIX),install)

format:
	@git ls-files '*.cpp' '*.h' | xargs clang-format -i
	@echo "[make] formatted $$(git ls-files '*.cpp' '*.h' | wc -l) files"

clean:
	rm -rf $(BUILD_DIR)
