# SPDX-License-Identifier: Apache-2.0
# Thin driver over CMake. `make demo` and `make test` work on a fresh machine: they install the missing
# Debian packages (as root), configure, build, and run the examples or the whole test suite. Only setup,
# demo, test and test-mpich install anything; DTL_NO_INSTALL=1 turns that off (setup then only checks).
BUILD       ?= build
BUILD_ASAN  ?= build-asan
BUILD_MPICH ?= build-mpich
BUILD_TSAN  ?= build-tsan
BUILD_FUZZ  ?= build-fuzz
BUILD_RELEASE ?= build-release
PREFIX      ?= /usr/local
NP          ?= 4
JOBS        ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
PACKAGES       := libopenmpi-dev openmpi-bin libcmocka-dev libopenblas-dev libjansson-dev cmake pkg-config clang
MPICH_PACKAGES := libmpich-dev mpich
# Debian's MPICH beside its default OpenMPI: the suffixed wrapper and launcher pick it. CPU-only, because
# the NCCL backend does not depend on the MPI and building it twice costs time.
# MPICH's headers mark MPI_STATUSES_IGNORE ((MPI_Status *)1) as an array gcc then "overflows": a false warning.
MPICH_CMAKE_FLAGS := -DMPI_C_COMPILER=mpicc.mpich -DMPIEXEC_EXECUTABLE=mpiexec.mpich -DDTL_WITH_CUDA=OFF \
  -DCMAKE_C_FLAGS=-Wno-stringop-overflow
# mpiexec with the flags and environment of the MPI that $(BUILD) was configured with (OpenMPI needs
# --oversubscribe and the OMPI_ALLOW_RUN_AS_ROOT variables, MPICH neither); cmake/dtl_targets.cmake writes it.
MPIRUN      ?= $(BUILD)/dtl-mpiexec
SUBMAKE     := $(MAKE) --no-print-directory
export DTL_NO_INSTALL

.PHONY: all setup configure build demo test test-fast test-asan test-tsan test-fuzz test-valgrind test-mpich gpu-check bench
.PHONY: check-release
.PHONY: install clean

all: build

# MPI=mpich adds the MPICH packages (test-mpich asks for them).
setup:
	@./tools/setup.sh $(PACKAGES) $(if $(filter mpich,$(MPI)),$(MPICH_PACKAGES))

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Sub-makes, so that setup has finished before anything is configured, also under make -j. The examples
# run with DTL_CHECK=1 (README, Errors): one rank's bad call fails every rank instead of hanging.
demo:
	@$(SUBMAKE) setup
	@$(SUBMAKE) build
	DTL_CHECK=1 $(MPIRUN) -n $(NP) $(BUILD)/examples/collectives
	@for ex in quickstart tp_transformer quantized moe context_parallel generate pipeline kv_transfer; do \
	  if [ -x $(BUILD)/examples/$$ex ]; then echo "== $$ex on $(NP) ranks"; \
	    DTL_CHECK=1 $(MPIRUN) -n $(NP) $(BUILD)/examples/$$ex || exit 1; fi; done

# The whole suite, then again under AddressSanitizer + UndefinedBehaviorSanitizer (label "sanitize"), the
# thread tests under ThreadSanitizer (label "tsan") and a short run of every fuzz target (label "fuzz").
test:
	@$(SUBMAKE) setup
	@$(SUBMAKE) test-fast
	@$(SUBMAKE) test-asan
	@$(SUBMAKE) test-tsan
	@$(SUBMAKE) test-fuzz

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan:
	cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DDTL_SANITIZE=ON -DDTL_WITH_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && ctest --output-on-failure -j $(JOBS) -L sanitize

# The Release build (-O3, with the CUDA backend when the toolkit is found) with every warning an error: the
# optimiser's flow analysis (-Wmaybe-uninitialized) sees what the RelWithDebInfo build does not.
check-release:
	cmake -S . -B $(BUILD_RELEASE) -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS=-Werror $(CMAKE_FLAGS)
	cmake --build $(BUILD_RELEASE) -j $(JOBS)

# ThreadSanitizer: a CPU-only build of the library and the tests labelled tsan only.
test-tsan:
	cmake -S . -B $(BUILD_TSAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTL_TSAN=ON -DDTL_WITH_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(BUILD_TSAN) -j $(JOBS) --target dtl_tsan_tests
	cd $(BUILD_TSAN) && ctest --output-on-failure -j $(JOBS) -L tsan

# libFuzzer (clang): a CPU-only build of the library with ASan + UBSan + coverage and the targets of
# tests/fuzz, each run for DTL_FUZZ_SECONDS (default 10) from its seed corpus. Skipped without clang.
test-fuzz:
	@if command -v clang >/dev/null 2>&1; then \
	  cmake -S . -B $(BUILD_FUZZ) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTL_FUZZ=ON \
	    -DDTL_WITH_CUDA=OFF $(CMAKE_FLAGS) && \
	  cmake --build $(BUILD_FUZZ) -j $(JOBS) --target dtl_fuzz_targets && \
	  cd $(BUILD_FUZZ) && ctest --output-on-failure -j $(JOBS) -L fuzz; \
	else echo "SKIP test-fuzz: clang not found (make setup installs it)"; fi

# The examples under valgrind's memcheck (2 ranks; quickstart 4) with OpenMPI's suppressions: fails on any
# record whose stack passes through libdtl. Not part of make test (minutes per example).
test-valgrind: build
	./tools/valgrind_examples.sh $(BUILD) 2

# Everything that needs a GPU, in one go (tools/gpu_check.sh): ctest -L gpu, the examples' flows on an NCCL
# communicator of one rank, the pack/copy kernels' bandwidth next to cudaMemcpy; "SKIP: no GPU" without one.
gpu-check: build
	./tools/gpu_check.sh $(BUILD)

# The whole suite against MPICH instead of OpenMPI, in its own build folder.
test-mpich:
	@$(SUBMAKE) setup MPI=mpich
	cmake -S . -B $(BUILD_MPICH) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(MPICH_CMAKE_FLAGS) $(CMAKE_FLAGS)
	cmake --build $(BUILD_MPICH) -j $(JOBS)
	cd $(BUILD_MPICH) && ctest --output-on-failure -j $(JOBS)

# Speed targets live here, never in timed tests. Each line is one table of the README.
bench: build
	for np in 2 4; do $(MPIRUN) -n $$np $(BUILD)/bench/dtl_coll_perf -b 1K -e 64M -f 4 || exit 1; done
	for np in 2 4; do $(MPIRUN) -n $$np $(BUILD)/bench/dtl_redistribute_perf -b 1K -e 64M -f 4 || exit 1; done
	$(MPIRUN) -n 4 $(BUILD)/bench/dtl_exchange_perf -b 1M -e 64M -f 4
	$(MPIRUN) -n 4 $(BUILD)/bench/dtl_qredistribute_perf
	$(BUILD)/bench/dtl_plan_perf
	for np in 1 2; do $(MPIRUN) -n $$np $(BUILD)/bench/dtl_tp_perf || exit 1; done
	for np in 2 4; do $(MPIRUN) -n $$np $(BUILD)/bench/dtl_moe_perf -b 64 -e 2K -f 2 || exit 1; done
	for np in 1 2 4; do $(MPIRUN) -n $$np $(BUILD)/bench/dtl_load_perf -s 256M -n 3 || exit 1; done
	for np in 2 4; do $(MPIRUN) -n $$np $(BUILD)/bench/dtl_cp_perf -T 2048,8192 || exit 1; done
	for np in 1 2 4; do $(MPIRUN) -n $$np $(BUILD)/examples/generate -n 20 -w 2 || exit 1; done

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_MPICH) $(BUILD_TSAN) $(BUILD_FUZZ) $(BUILD_RELEASE)
