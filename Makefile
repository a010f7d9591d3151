# SPDX-License-Identifier: Apache-2.0
# Thin driver over CMake. `make demo` and `make test` work on a fresh machine: they install the missing
# Debian packages (as root), configure, build, and run the examples or the whole test suite.
BUILD       ?= build
BUILD_ASAN  ?= build-asan
PREFIX      ?= /usr/local
NP          ?= 4
JOBS        ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
PACKAGES    := libopenmpi-dev openmpi-bin libcmocka-dev libopenblas-dev cmake pkg-config
# mpirun as root needs the two OMPI_ALLOW variables; small machines need --oversubscribe for 3+ ranks.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
MPIRUN      := mpirun --oversubscribe --bind-to none --mca btl self,vader

.PHONY: all setup configure build demo test test-fast test-asan bench install clean

all: build

setup:
	@./tools/setup.sh $(PACKAGES)

$(BUILD)/CMakeCache.txt: | setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

configure: setup $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(MPIRUN) -n $(NP) $(BUILD)/examples/collectives
	@for ex in quickstart tp_transformer moe context_parallel; do \
	  if [ -x $(BUILD)/examples/$$ex ]; then echo "== $$ex on $(NP) ranks"; \
	    $(MPIRUN) -n $(NP) $(BUILD)/examples/$$ex || exit 1; fi; done

# The whole suite, then again under AddressSanitizer + UndefinedBehaviorSanitizer (label "sanitize").
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory test-asan

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: setup
	cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DDTL_SANITIZE=ON -DDTL_WITH_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && ctest --output-on-failure -j $(JOBS) -L sanitize

# Speed targets live here, never in timed tests. Each line is one table of the README.
bench: build
	for np in 2 4; do $(MPIRUN) -n $$np $(BUILD)/bench/dtl_coll_perf -b 1K -e 64M -f 4 || exit 1; done
	for np in 2 4; do $(MPIRUN) -n $$np $(BUILD)/bench/dtl_redistribute_perf -b 1K -e 64M -f 4 || exit 1; done
	$(BUILD)/bench/dtl_plan_perf
	for np in 1 2; do $(MPIRUN) -n $$np $(BUILD)/bench/dtl_tp_perf || exit 1; done
	for np in 2 4; do $(MPIRUN) -n $$np $(BUILD)/bench/dtl_moe_perf -b 64 -e 2K -f 2 || exit 1; done

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN)
