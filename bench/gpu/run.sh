#!/usr/bin/env bash
# GPU check and benchmark of Cobalt's CUDA kernels (docs/gpu.md): every kernel against its CPU
# reference (bitwise, poisoned outputs) on random, synthetic-preset and real traces, then timed
# (CUDA events, 3 warm-ups, median of 20; and replayed from a CUDA graph) against the
# memory-bandwidth floor; one table.
#
#   bash bench/gpu/run.sh --bundle [JOBS=n]   on a machine with nvcc (no GPU needed): build
#                                            cobalt_gpu_check and pack it, the shared libraries it
#                                            needs beyond libc/libstdc++, the real traces, and the
#                                            parts bench/gpu/build_python.sh builds the Python
#                                            extensions from, into build/gpu-bundle (about 31 MB
#                                            of the 64 MiB a device call may carry)
#   bash bench/gpu/run.sh [check options]    on the GPU machine: run the bundle when it is there
#                                            (carry build/gpu-bundle; refused with exit 5 when it
#                                            was built from other sources than this tree's), else
#                                            build with the `cuda` preset first (needs the
#                                            project's build dependencies)
#
# Check options go to cobalt_gpu_check: --quick, --reps N, --tokens N (default 10^6).
# With $OUT set (the device tool), the log and a CSV of the table are also written there.
# Stages after the main check, each asked for by a variable, in this order:
# - COBALT_GPU_PYTHON=1 (needs the bundle): build cobalt._core and cobalt._cuda for this machine's
#   python3 (bench/gpu/build_python.sh; at most 240 s), run python/tests/test_cuda.py on the GPU
#   with them (the device must be usable, or it fails: the torch integration on CUDA tensors, bit
#   for bit against the CPU paths; at most 90 s), then the quick tests of the rest of the package
#   against that machine's newer Python, numpy and torch (python_tests below; at most 120 s), then
#   bench/gpu/torch_ops_bench.py (at most 90 s; $OUT/torch_ops.txt). Log in $OUT/python_cuda.txt.
#   Exit 10 when a step fails (the build, the import, a test, or an op whose CUDA output differs
#   from its CPU output).
# - COBALT_GPU_SANITIZE=1, when the check program reached the device (exit 0, 1 or 3: after a
#   failure the tools may say why): compute-sanitizer's memcheck, synccheck and racecheck run the
#   quick check on 20000 tokens, each case checked once and nothing timed (--no-timing; not yet
#   timed on a GPU; at most 150 s each), without the check that makes a failing CUDA call on
#   purpose (--no-injected-errors: the tools would report it): exit 8 when one reports an error, fails a check under the
#   tool, times out or exits 0 without the program's summary line (a failed main run keeps its
#   own status); a tool that cannot run on this machine (e.g. "Device not supported") is reported
#   and does not fail the run; one stopped early by the run's time budget is reported as
#   incomplete (exit 11). Their logs in $OUT/sanitizer_*.txt (/tmp without $OUT).
# - COBALT_GPU_PROFILE=1: Nsight Compute profiles the first launch of each kernel of the check
#   (SpeedOfLight, Occupancy, LaunchStats, MemoryWorkloadAnalysis; at most 180 s) into
#   $OUT/ncu_profile.txt: where the time goes, for the session that tunes the kernels. Written
#   without ncu at hand (the development machines have none): its failure is reported and changes
#   no exit status.
# The whole run keeps to COBALT_GPU_BUDGET_S seconds (default 570, for a device call's 600): a
# later stage gets at most what is left, and one with under 30 s left is skipped and reported
# (exit 11 when nothing worse happened). The main check alone is designed to finish in well under
# 3 minutes of device time with the bundle (no build there); give the device call timeout_s=600.
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=build/gpu-bundle

# Digest of every source the check program is built from (kernels, CPU references, headers,
# build files): a bundle built from other sources is refused, so a stale bundle cannot pass old
# kernels against old references.
source_digest() {
  command -v sha256sum >/dev/null || { echo "run.sh: sha256sum not found" >&2; exit 7; }
  find src include cmake CMakeLists.txt CMakePresets.json -type f -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum | sha256sum | cut -c1-16
}

build() {  # TARGETS...
  cmake --preset cuda -DCOBALT_BUILD_TESTS=OFF -DCOBALT_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build --preset cuda --target "$@" -j "${JOBS:-$(nproc)}"
}

# Shared libraries BINARY needs other than the C/C++ runtime, copied into DIR under their sonames.
copy_shared_libs() {  # BINARY DIR
  ldd "$1" | awk '/=> \// {print $3}' |
    grep -vE '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so' |
    xargs -r cp -L -t "$2/"
}

# What bench/gpu/build_python.sh needs to build cobalt._core and cobalt._cuda on a machine without
# this project's dependencies: the static libraries (built with -fPIC, no LTO), the static CUDA
# runtime they were built against, fmt's headers (include/cobalt/core/error.hpp uses fmt), Debian's
# pybind11 headers (used when that machine's Python has no pybind11), and the shared libraries of
# the library's dependencies (CBC, METIS, fmt, ...): read off this machine's cobalt._core when
# `make build-python` has built it (it links exactly what build_python.sh must), else off the CLI
# (built for it; CUDA-linked binaries drop the libraries they do not call).
pack_python_parts() {
  local parts=$bundle/python cudart deps_probe
  deps_probe=$(compgen -G 'python/cobalt/_core.cpython-*.so' | head -1 || true)
  if [[ -z $deps_probe ]]; then
    build cobalt_cli
    deps_probe=build/cuda/bin/cobalt
  fi
  mkdir -p "$parts/lib" "$parts/deps" "$parts/include"
  cp build/cuda/src/libcobalt.a build/cuda/src/cuda/libcobalt_cuda.a "$parts/lib/"
  cudart=$(awk -F= '/^CUDA_cudart_static_LIBRARY:/ {print $2}' build/cuda/CMakeCache.txt)
  [[ -f $cudart ]] || { echo "run.sh: libcudart_static.a not found ('$cudart')" >&2; exit 7; }
  cp "$cudart" "$parts/lib/libcudart_static.a"
  copy_shared_libs "$deps_probe" "$parts/deps"
  echo "run.sh: the Python parts' shared libraries read off $deps_probe"
  cp -r /usr/include/fmt "$parts/include/"
  if [[ -f /usr/include/pybind11/pybind11.h ]]; then
    mkdir -p "$parts/pybind11"
    cp -r /usr/include/pybind11 "$parts/pybind11/"
    dpkg-query -W -f '${Version}\n' pybind11-dev >"$parts/pybind11/VERSION" 2>/dev/null || true
  fi
}

if [[ ${1:-} == --bundle ]]; then
  shift
  # Ignored files under the digest's folders count in the digest here but do not travel to the
  # GPU machine, whose digest would then differ (a stale bundle, exit 5, and a wasted run).
  ignored=$(git status --short --ignored -- src include cmake 2>/dev/null | awk '$1 == "!!" {print $2}')
  if [[ -n $ignored ]]; then
    echo "run.sh: files git ignores under src, include or cmake would make the bundle look" \
      "stale on the GPU machine; remove them first:" $ignored >&2
    exit 7
  fi
  build cobalt_gpu_check cobalt cobalt_cuda
  rm -rf "$bundle"
  mkdir -p "$bundle/lib" "$bundle/traces"
  cp build/cuda/bin/cobalt_gpu_check "$bundle/"
  # The check program's shared libraries (libfmt today); the CUDA runtime is static and the driver
  # (libcuda.so) comes from the GPU machine.
  copy_shared_libs build/cuda/bin/cobalt_gpu_check "$bundle/lib"
  pack_python_parts
  if compgen -G "../shared/data/traces/*.safetensors" >/dev/null; then
    cp ../shared/data/traces/*.safetensors "$bundle/traces/"
  else
    echo "run.sh: no real traces at ../shared/data/traces (the check will skip them)"
  fi
  {
    echo "sources $(source_digest)"
    echo "commit $(git rev-parse HEAD)"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "nvcc: $(/usr/local/cuda/bin/nvcc --version | tail -1)"
    git status --short -- src/cuda include/cobalt/cuda | sed 's/^/uncommitted: /'
  } >"$bundle/BUILD_INFO"
  du -sh "$bundle"
  echo "run.sh: bundle ready; on the GPU machine: bash bench/gpu/run.sh (carry $bundle)"
  exit 0
fi

if [[ -f $bundle/cobalt_gpu_check ]]; then
  bin=$bundle/cobalt_gpu_check
  chmod +x "$bin"  # a carried copy may lose the exec bit
  traces=$bundle/traces
  # For the check program and the tools around it only: the Python stage must not load these.
  orig_library_path=${LD_LIBRARY_PATH-}
  export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "run.sh: using the bundle:"
  sed 's/^/  /' "$bundle/BUILD_INFO"
  built_from=$(awk '$1 == "sources" {print $2}' "$bundle/BUILD_INFO")
  here=$(source_digest)
  if [[ $built_from != "$here" && -z ${COBALT_GPU_ALLOW_STALE:-} ]]; then
    echo "run.sh: stale bundle: built from sources ${built_from:-unknown}, this tree has $here;" \
      "rebuild it with 'bash bench/gpu/run.sh --bundle' (COBALT_GPU_ALLOW_STALE=1 runs it anyway)"
    exit 5
  fi
  missing=$(ldd "$bin" 2>&1 | grep 'not found' || true)
  if [[ -n $missing ]]; then
    echo "run.sh: the bundle's binary misses shared libraries on this machine:"
    echo "$missing"
    exit 6
  fi
else
  echo "run.sh: no bundle at $bundle; building with the cuda preset"
  build cobalt_gpu_check
  orig_library_path=${LD_LIBRARY_PATH-}
  bin=build/cuda/bin/cobalt_gpu_check
  traces=../shared/data/traces
fi

log=/dev/null
csv=()
if [[ -n ${OUT:-} ]]; then
  log=$OUT/gpu_check.txt
  csv=(--csv "$OUT/gpu_check.csv")
fi
{
  echo "date: $(date -u +%Y-%m-%d) ($(date -u +%H:%M) UTC)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv,noheader 2>/dev/null | sed 's/^/nvidia-smi: /' || true
} | tee "$log"
# Time left to a stage: at most CAP seconds and what remains of COBALT_GPU_BUDGET_S minus 15 s
# for the stages' own wrap-up; 0 when under 30 s would be left (the stage is then skipped).
budget=${COBALT_GPU_BUDGET_S:-570}
skipped=0
stage_limit() {  # CAP
  local left=$((budget - SECONDS - 15))
  ((left > $1)) && left=$1
  if ((left < 30)); then echo 0; else echo "$left"; fi
}
skip_stage() {  # NAME
  echo "run.sh: $1 skipped: ${SECONDS} s of the run's ${budget} s budget (COBALT_GPU_BUDGET_S) spent" |
    tee -a "$log"
  skipped=1
}

set +e
timeout -k 10 240 "$bin" --traces "$traces" "${csv[@]}" "$@" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
set -e
echo "run.sh: cobalt_gpu_check exit status $status" \
  "(0 all checks passed, 1 a check failed, 2 no GPU, 3 a CUDA error outside a check," \
  "124 timeout)" | tee -a "$log"
reached_device=0
[[ $status -eq 0 || $status -eq 1 || $status -eq 3 ]] && reached_device=1

# Optional: the Python extensions built for this machine's python3, and the torch integration's
# tests on CUDA tensors (COBALT_GPU_PYTHON=1; see the header).
python_failed=0
# First the CUDA integration, on its own (its verdict must survive whatever the others do); then
# the quick tests of the rest of the package, against that machine's newer Python, numpy and torch
# (79 tests in the eight files, 24 s on this project's 2-core machines); then
# bench/gpu/torch_ops_bench.py: the per-step ops through torch on CUDA against CPU tensors at
# 2^20 tokens, outputs compared (a difference fails the stage), timings in $OUT/torch_ops.txt.
python_tests=(test_ops.py test_bindings.py test_exchange_plan.py test_main_placement.py
  test_recorder.py test_bf16.py test_runtime_robustness.py)
python_step() {  # NAME CAP LOG COMMAND...: one step of the Python stage, 0 when it passed
  local name=$1 cap=$2 step_log=$3 limit step_status
  shift 3
  limit=$(stage_limit "$cap")
  if ((limit == 0)); then skip_stage "$name"; return 1; fi
  set +e
  # The machine's own library path (not the bundle's), the built package first on sys.path, no
  # pytest plugins of that image (none is used; they were never tried with these tests).
  LD_LIBRARY_PATH=$orig_library_path COBALT_PYTHON_PACKAGE_DIR=$PWD/build/gpu-python \
    PYTHONPATH=$PWD/build/gpu-python COBALT_EXPECT_CUDA_MODULE=1 COBALT_EXPECT_CUDA_DEVICE=1 \
    PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \
    timeout -k 10 "$limit" "$@" >>"$step_log" 2>&1
  step_status=$?
  set -e
  tail -8 "$step_log" | sed "s/^/  $name: /" | tee -a "$log"
  echo "run.sh: $name exit status $step_status$( ((step_status == 124 || step_status == 137)) &&
    echo " (stopped after $limit s)") (log $step_log)" | tee -a "$log"
  [[ $step_status -eq 0 ]] || python_failed=1
  return "$step_status"
}
python_stage() {
  [[ -n ${COBALT_GPU_PYTHON:-} ]] || return 0
  if [[ $reached_device -ne 1 ]]; then
    echo "run.sh: the Python stage not run: the check program did not reach the device" |
      tee -a "$log"
    return 0
  fi
  if [[ ! -f $bundle/python/lib/libcobalt.a ]]; then
    echo "run.sh: COBALT_GPU_PYTHON set but $bundle has no Python parts" \
      "(bash bench/gpu/run.sh --bundle)" | tee -a "$log"
    python_failed=1
    return 0
  fi
  local out_dir=${OUT:-/tmp} py=${PYTHON:-python3}
  : >"$out_dir/python_cuda.txt"
  python_step build_python 240 "$out_dir/python_cuda.txt" \
    bash bench/gpu/build_python.sh --bundle "$bundle" --out build/gpu-python || return 0
  python_step test_cuda 90 "$out_dir/python_cuda.txt" \
    "$py" -m pytest -v -p no:cacheprovider -rfEs python/tests/test_cuda.py || true
  python_step package_tests 120 "$out_dir/python_cuda.txt" \
    "$py" -m pytest -v -p no:cacheprovider -rfEs "${python_tests[@]/#/python/tests/}" || true
  : >"$out_dir/torch_ops.txt"
  python_step torch_ops_bench 90 "$out_dir/torch_ops.txt" \
    "$py" bench/gpu/torch_ops_bench.py || true
}

# Optional: Nsight Compute on one launch of each kernel (COBALT_GPU_PROFILE=1; see the header).
profile() {
  [[ -n ${COBALT_GPU_PROFILE:-} && ($status -eq 0 || $status -eq 1) ]] || return 0
  local ncu limit
  ncu=$(command -v ncu || true)
  [[ -z $ncu && -x /usr/local/cuda/bin/ncu ]] && ncu=/usr/local/cuda/bin/ncu
  if [[ -z $ncu ]]; then
    echo "run.sh: COBALT_GPU_PROFILE set but ncu not found" | tee -a "$log"
    return 0
  fi
  limit=$(stage_limit 180)
  if ((limit == 0)); then skip_stage "the profile"; return 0; fi
  local out=${OUT:-/tmp}/ncu_profile.txt
  set +e
  # The first launch of each kernel (--kernel-id ::regex:NAME:1 profiles each match's first
  # invocation): the first cases of each kind are the large ones (10^6 tokens, E = 640). Clocks
  # as the card has them (--clock-control none: never change the card's settings).
  timeout -k 10 "$limit" "$ncu" --clock-control none --kernel-name-base function \
    --kernel-id '::regex:^(assign_kernel|assign_deferred_kernel|count_kernel|finalize_kernel|dispatch_count_kernel|dispatch_scan_kernel|dispatch_slot_kernel|place_kernel|route_kernel|refine_kernel|emit_kernel|write_kernel|slots_kernel)$:1' \
    --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis \
    "$bin" --traces "$traces" --no-timing >"$out" 2>&1
  local ncu_status=$?
  set -e
  echo "run.sh: ncu exit status $ncu_status (profile in $out; not part of the verdict)" |
    tee -a "$log"
}

# What the host emulation cannot see: out-of-bounds or misaligned device accesses (memcheck),
# barriers and warp intrinsics reached by fewer threads than their masks name (synccheck: the
# emulation runs lanes in order, so it cannot see divergence), shared-memory races (racecheck).
# (Unwritten outputs are caught by the poisoned outputs.) Only where the check program reached
# the device (0 passed, 1 a check failed, 3 a CUDA error outside a check: memcheck may say which
# access).
found=0
sanitize() {
  [[ -n ${COBALT_GPU_SANITIZE:-} ]] || return 0
  if [[ $reached_device -ne 1 ]]; then
    echo "run.sh: the sanitizers not run: the check program did not reach the device" |
      tee -a "$log"
    return 0
  fi
  local sanitizer tool tool_log tool_status verdict limit
  sanitizer=$(command -v compute-sanitizer || true)
  [[ -z $sanitizer && -x /usr/local/cuda/bin/compute-sanitizer ]] &&
    sanitizer=/usr/local/cuda/bin/compute-sanitizer
  if [[ -z $sanitizer ]]; then
    echo "run.sh: COBALT_GPU_SANITIZE set but compute-sanitizer not found" | tee -a "$log"
    return 0
  fi
  for tool in memcheck synccheck racecheck; do  # racecheck, the slowest, last
    limit=$(stage_limit 150)
    if ((limit == 0)); then skip_stage "compute-sanitizer --tool $tool"; continue; fi
    tool_log=${OUT:-/tmp}/sanitizer_$tool.txt
    set +e
    timeout -k 10 "$limit" "$sanitizer" --tool "$tool" --error-exitcode 9 --print-limit 100 \
      "$bin" --traces "$traces" --quick --no-timing --no-injected-errors --tokens 20000 \
      >"$tool_log" 2>&1
    tool_status=$?
    set -e
    tail -3 "$tool_log" 2>/dev/null | sed "s/^/  $tool: /" | tee -a "$log"
    # A tool that cannot run on this machine says so in its own lines (they start with
    # '========='; a CUDA error of the program does not), whatever its exit status: e.g. gVisor's
    # "Device not supported", after which the program's first allocation fails (error 999).
    if [[ $tool_status -ne 0 ]] && grep -qiE \
      '^=========.*(device not supported|unable to (start|attach)|failed to initiali[sz]e)' \
      "$tool_log"; then
      verdict="the tool could not run here (not a kernel error; see $tool_log)"
    elif [[ ($tool_status -eq 124 || $tool_status -eq 137) && $limit -lt 150 ]]; then
      # Cut short by the run's budget, not by its own 150 s: unfinished, not failed.
      verdict="stopped after $limit s by the run's time budget: incomplete (rerun it alone)"
      skipped=1
    else
      case $tool_status in
        0)
          # Clean only if the check program ran to its end under the tool (its last line).
          if grep -q 'all checks passed' "$tool_log"; then
            verdict="clean"
          else
            verdict="exit 0 but the check program's summary is missing (see $tool_log)"; found=1
          fi
          ;;
        9) verdict="errors reported"; found=1 ;;
        1) verdict="a check failed under the tool"; found=1 ;;
        124 | 137) verdict="timed out"; found=1 ;;
        *) verdict="the check program failed under the tool (exit $tool_status)"; found=1 ;;
      esac
    fi
    echo "run.sh: compute-sanitizer --tool $tool exit status $tool_status: $verdict" | tee -a "$log"
  done
}

python_stage
sanitize
profile
echo "run.sh: done in ${SECONDS} s" | tee -a "$log"
if [[ $status -ne 0 ]]; then exit "$status"; fi
if [[ $found -ne 0 ]]; then exit 8; fi
if [[ $python_failed -ne 0 ]]; then exit 10; fi
if [[ $skipped -ne 0 ]]; then exit 11; fi
exit 0
