# One-command entry points (each installs its own Debian dependencies first).
#   make demo   - install, build, and run the main job on the embedded default workload
#   make test   - install, build (release + ASan/UBSan debug + Python bindings), and run every
#                 test (ctest twice, then pytest python/tests with Debian's /usr/bin/python3),
#                 and check that the C++/CUDA sources are clang-formatted
#   make bench  - install, build, and run the Google Benchmark suite
JOBS ?= $(shell nproc)
BUILD ?= build/release
# Debian's interpreter: python3-torch / python3-numpy / python3-pytest belong to it (not a pyenv
# python3 that may come first on PATH).
PYTHON ?= /usr/bin/python3

.PHONY: deps build build-debug build-python demo test test-release test-debug test-tsan test-python \
	bench format format-check clean

deps:
	bash scripts/install-deps.sh

build: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)

build-debug: deps
	cmake --preset debug >/dev/null
	cmake --build --preset debug -j $(JOBS)

demo: build
	bash scripts/demo.sh $(BUILD)/bin/cobalt

test-release: build
	ctest --preset release -j $(JOBS)

test-debug: build-debug
	ctest --preset debug -j $(JOBS)

# The C++ suite under ThreadSanitizer (the parallel chunks, the asynchronous planning thread).
# Not part of `make test`: about 10 minutes of build and 6 of tests on 2 cores; a report fails it.
test-tsan: deps
	cmake --preset tsan >/dev/null
	cmake --build --preset tsan -j $(JOBS)
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --preset tsan -j $(JOBS)

# The release build with the pybind11 extension python/cobalt/_core*.so (not the ASan build: an
# instrumented extension cannot be imported by an uninstrumented interpreter).
build-python: deps
	cmake --preset release -DCOBALT_BUILD_PYTHON=ON -DPython3_EXECUTABLE=$(PYTHON) >/dev/null
	cmake --build --preset release -j $(JOBS)

# pytest's exit status is make's (5 = no tests collected fails too).
test-python: build-python
	$(PYTHON) -m pytest python/tests -q

test: test-release test-debug test-python test-cuda-compile format-check

# CUDA kernels (docs/gpu.md), when nvcc is present: configure the `cuda` preset and build only the
# CUDA targets (a compile and link check; nothing runs on a GPU): the kernels, cobalt_gpu_check,
# the host emulation and contract tests and the Python module cobalt._cuda. Then run the host
# emulation of the kernel bodies against the CPU references, the launchers' argument checks and
# the Python tests of cobalt.cuda (all need no GPU; the GPU comparisons in test_cuda.py skip
# without one), then test-gpu-bundle. Skipped without nvcc.
NVCC ?= /usr/local/cuda/bin/nvcc
.PHONY: test-cuda-compile
test-cuda-compile: build-python
	@if [ -x $(NVCC) ]; then \
	  cmake --preset cuda -DCMAKE_CUDA_COMPILER=$(NVCC) -DCOBALT_BUILD_TESTS=OFF \
	    -DCOBALT_BUILD_BENCHMARKS=OFF -DCOBALT_BUILD_PYTHON=ON \
	    -DPython3_EXECUTABLE=$(PYTHON) >/dev/null && \
	  cmake --build --preset cuda --target cobalt_cuda_all -j $(JOBS) && \
	  build/cuda/bin/cobalt_cuda_emulation_test --gtest_brief=1 && \
	  build/cuda/bin/cobalt_cuda_contract_test --gtest_brief=1 && \
	  COBALT_EXPECT_CUDA_MODULE=1 $(PYTHON) -m pytest python/tests/test_cuda.py -q && \
	  $(MAKE) --no-print-directory test-gpu-bundle; \
	else \
	  echo "test-cuda-compile: $(NVCC) not found: CUDA kernels not compiled"; \
	fi

# What a GPU run depends on, checked here (no GPU): pack the GPU bundle, build the Python extensions
# from it as bench/gpu/run.sh does on the GPU machine for that machine's Python (every shared
# library from the bundle, as there), and run test_cuda.py and test_ops.py against that build (the
# GPU run adds the package's other quick tests and bench/gpu/torch_ops_bench.py).
.PHONY: test-gpu-bundle
test-gpu-bundle:
	bash bench/gpu/run.sh --bundle
	PYTHON=$(PYTHON) bash bench/gpu/build_python.sh --bundle-libs-only --out build/gpu-python
	COBALT_PYTHON_PACKAGE_DIR=build/gpu-python COBALT_EXPECT_CUDA_MODULE=1 \
	  $(PYTHON) -m pytest -q -p no:cacheprovider python/tests/test_cuda.py python/tests/test_ops.py

bench: build
	$(BUILD)/bench/cobalt_bench --benchmark_counters_tabular=true

FORMAT_SOURCES = find include src cli tests bench python examples \( -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' \) -print0

format:
	$(FORMAT_SOURCES) | xargs -0 clang-format -i

# Fails (listing the files) when a source differs from what `make format` would write.
format-check: deps
	@command -v clang-format >/dev/null || { echo "format-check: clang-format not found" >&2; exit 1; }
	@bad=$$($(FORMAT_SOURCES) | xargs -0 clang-format --dry-run --Werror 2>&1 \
	  | grep -E ':[0-9]+:[0-9]+: error:' | cut -d: -f1 | sort -u); \
	if [ -n "$$bad" ]; then \
	  echo "$$bad" | sed 's/$$/: not clang-formatted (run make format)/' >&2; exit 1; \
	fi; echo "format-check: sources are clang-formatted"

clean:
	rm -rf build
