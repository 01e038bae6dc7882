# One-command entry points (each installs its own Debian dependencies first).
#   make demo   - install, build, and run the main job on the embedded default workload
#   make test   - install, build (release + ASan/UBSan debug), and run every test
#   make bench  - install, build, and run the Google Benchmark suite
JOBS ?= $(shell nproc)
BUILD ?= build/release

.PHONY: deps build build-debug demo test test-release test-debug bench format clean

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

test: test-release test-debug

bench: build
	$(BUILD)/bench/cobalt_bench --benchmark_counters_tabular=true

format:
	find include src cli tests bench -name '*.hpp' -o -name '*.cpp' -o -name '*.cu' | xargs clang-format -i

clean:
	rm -rf build
