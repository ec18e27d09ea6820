# whittle's entry points. `make test` and `make demo` work on a fresh Debian 12 machine: they
# install what is missing (scripts/setup.sh), configure and build, then act.

SHELL := /bin/bash
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_ARGS ?=
CTEST_ARGS ?=

.PHONY: all setup configure build test demo format install clean

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

demo: build
	@scripts/demo.sh $(BUILD_DIR)

install: build
	@cmake --install $(BUILD_DIR) --prefix $(or $(PREFIX),install)

format:
	@git ls-files '*.cpp' '*.h' | xargs clang-format -i
	@echo "[make] formatted $$(git ls-files '*.cpp' '*.h' | wc -l) files"

clean:
	rm -rf $(BUILD_DIR)
