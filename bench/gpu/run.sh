#!/usr/bin/env bash
# GPU check and benchmark of Cobalt's CUDA kernels (docs/gpu.md): every kernel against its CPU
# reference (bitwise, poisoned outputs) on random, synthetic-preset and real traces, then timed
# (CUDA events, 3 warm-ups, median of 20; and replayed from a CUDA graph) against the
# memory-bandwidth floor; one table.
#
#   bash bench/gpu/run.sh --bundle [JOBS=n]   on a machine with nvcc (no GPU needed): build
#                                            cobalt_gpu_check and pack it, the shared libraries it
#                                            needs beyond libc/libstdc++, and the real traces into
#                                            build/gpu-bundle (about 12 MB)
#   bash bench/gpu/run.sh [check options]    on the GPU machine: run the bundle when it is there
#                                            (carry build/gpu-bundle; refused with exit 5 when it
#                                            was built from other sources than this tree's), else
#                                            build with the `cuda` preset first (needs the
#                                            project's build dependencies)
#
# Check options go to cobalt_gpu_check: --quick, --reps N, --tokens N (default 10^6).
# With $OUT set (the device tool), the log and a CSV of the table are also written there.
# With COBALT_GPU_SANITIZE=1, when the check program reached the device (exit 0, 1 or 3: after a
# failure the tools may say why), compute-sanitizer's memcheck and then racecheck also run the
# quick check on 20000 tokens, each case checked once and nothing timed (--no-timing; not yet
# timed on a GPU; at most 150 s each): exit 8 when either reports an error, fails a check under
# the tool, times out or exits 0 without the program's summary line (a failed main run keeps its
# own status); a tool that cannot run on this machine (e.g. "Device not supported") is reported
# and does not fail the run. Their logs in $OUT/sanitizer_*.txt (/tmp without $OUT). Worst case 240 + 2 x 160 s:
# give the device call timeout_s=600.
# Designed to finish in well under 3 minutes of device time with the bundle (no build there)
# without COBALT_GPU_SANITIZE.
# With COBALT_GPU_PROFILE=1, after the checks (and the sanitizers, if asked for), Nsight Compute
# profiles the first launch of each kernel of the check (SpeedOfLight, Occupancy, LaunchStats,
# MemoryWorkloadAnalysis; at most 180 s) into $OUT/ncu_profile.txt: where the time goes, for the
# session that tunes the kernels. Written without ncu at hand (the development machines have
# none): its failure is reported and changes no exit status.
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

build() {
  cmake --preset cuda -DCOBALT_BUILD_TESTS=OFF -DCOBALT_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build --preset cuda --target cobalt_gpu_check -j "${JOBS:-$(nproc)}"
}

if [[ ${1:-} == --bundle ]]; then
  shift
  build
  rm -rf "$bundle"
  mkdir -p "$bundle/lib" "$bundle/traces"
  cp build/cuda/bin/cobalt_gpu_check "$bundle/"
  # Shared libraries other than the C/C++ runtime (libfmt today); the CUDA runtime is static and
  # the driver (libcuda.so) comes from the GPU machine.
  ldd build/cuda/bin/cobalt_gpu_check | awk '/=> \// {print $3}' |
    grep -vE '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so' |
    xargs -r cp -L -t "$bundle/lib/"
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
  build
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
set +e
timeout 240 "$bin" --traces "$traces" "${csv[@]}" "$@" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
set -e
echo "run.sh: cobalt_gpu_check exit status $status" \
  "(0 all checks passed, 1 a check failed, 2 no GPU, 3 a CUDA error outside a check," \
  "124 timeout)" | tee -a "$log"
# Optional: Nsight Compute on one launch of each kernel (COBALT_GPU_PROFILE=1; see the header).
profile() {
  [[ -n ${COBALT_GPU_PROFILE:-} && ($status -eq 0 || $status -eq 1) ]] || return 0
  local ncu
  ncu=$(command -v ncu || true)
  [[ -z $ncu && -x /usr/local/cuda/bin/ncu ]] && ncu=/usr/local/cuda/bin/ncu
  if [[ -z $ncu ]]; then
    echo "run.sh: COBALT_GPU_PROFILE set but ncu not found" | tee -a "$log"
    return 0
  fi
  local out=${OUT:-/tmp}/ncu_profile.txt
  set +e
  # The first launch of each kernel (--kernel-id ::regex:NAME:1 profiles each match's first
  # invocation): the first cases of each kind are the large ones (10^6 tokens, E = 640).
  timeout -k 10 180 "$ncu" --kernel-name-base function \
    --kernel-id '::regex:^(assign_kernel|assign_deferred_kernel|count_kernel|finalize_kernel|dispatch_count_kernel|dispatch_scan_kernel|dispatch_slot_kernel|place_kernel|route_kernel|refine_kernel|emit_kernel|write_kernel|slots_kernel)$:1' \
    --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis \
    "$bin" --traces "$traces" --no-timing >"$out" 2>&1
  local ncu_status=$?
  set -e
  echo "run.sh: ncu exit status $ncu_status (profile in $out; not part of the verdict)" |
    tee -a "$log"
}

# Sanitizers only where the check program reached the device (0 passed, 1 a check failed, 3 a CUDA
# error outside a check: memcheck may say which access).
if [[ -z ${COBALT_GPU_SANITIZE:-} || ($status -ne 0 && $status -ne 1 && $status -ne 3) ]]; then
  profile
  exit "$status"
fi

# What the host emulation cannot see: out-of-bounds or misaligned device accesses (memcheck),
# shared-memory races (racecheck). (Unwritten outputs are caught by the poisoned outputs.)
sanitizer=$(command -v compute-sanitizer || true)
[[ -z $sanitizer && -x /usr/local/cuda/bin/compute-sanitizer ]] &&
  sanitizer=/usr/local/cuda/bin/compute-sanitizer
if [[ -z $sanitizer ]]; then
  echo "run.sh: COBALT_GPU_SANITIZE set but compute-sanitizer not found" | tee -a "$log"
  profile
  exit "$status"
fi
found=0
for tool in memcheck racecheck; do
  tool_log=${OUT:-/tmp}/sanitizer_$tool.txt
  set +e
  timeout -k 10 150 "$sanitizer" --tool "$tool" --error-exitcode 9 --print-limit 100 "$bin" \
    --traces "$traces" --quick --no-timing --tokens 20000 >"$tool_log" 2>&1
  tool_status=$?
  set -e
  tail -3 "$tool_log" 2>/dev/null | sed "s/^/  $tool: /" | tee -a "$log"
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
    *)
      # The tool's own lines start with '========='; a CUDA error of the program does not.
      if grep -E '^=========' "$tool_log" |
        grep -qiE 'not supported|unable to (start|attach)|failed to initiali[sz]e'; then
        verdict="the tool could not run here (not a kernel error; see $tool_log)"
      else
        verdict="the check program failed under the tool"; found=1
      fi
      ;;
  esac
  echo "run.sh: compute-sanitizer --tool $tool exit status $tool_status: $verdict" | tee -a "$log"
done
profile
if [[ $status -ne 0 ]]; then exit "$status"; fi
if [[ $found -ne 0 ]]; then exit 8; fi
exit 0
