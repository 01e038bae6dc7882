#!/usr/bin/env bash
# Registers, stack and spills of every kernel for sm_90, from ptxas (-Xptxas -v), without a GPU:
# recompiles each src/cuda/*.cu with the cuda preset's own command line (build/cuda must be
# configured: make test-cuda-compile). Prints "file kernel regs stack spill-stores/spill-loads".
set -euo pipefail
cd "$(dirname "$0")/../../build/cuda"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for cu in ../../src/cuda/*.cu; do
  f=$(basename "$cu" .cu)
  cmd=$(ninja -t commands "src/cuda/CMakeFiles/cobalt_cuda.dir/$f.cu.o" | tail -1)
  cmd=$(echo "$cmd" | sed "s|-o [^ ]*$f.cu.o|-o $tmp/$f.o|; s/-MD -MT [^ ]* -MF [^ ]*//")
  eval "$cmd -Xptxas -v" 2>&1 | F="$f" python3 -c '
import os, re, subprocess, sys
cur = arch = None
spill = ("?", "?", "?")
for line in sys.stdin.read().split("\n"):
    m = re.search(r"Compiling entry function .([^ ]+). for .(sm_\d+).", line)
    if m:
        cur, arch = m.group(1), m.group(2)
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and cur:
        spill = m.groups()
        continue
    m = re.search(r"Used (\d+) registers", line)
    if m and cur and arch == "sm_90":
        name = subprocess.run(["c++filt", cur], capture_output=True, text=True).stdout.strip()
        name = re.sub(r"cobalt::cuda::(\(anonymous namespace\)::)?", "", name)
        name = re.sub(r"\((?:[^()]|\([^()]*\))*\)$", "", name)  # the parameter list
        name = name.replace("(detail::CoverMode)0", "masks").replace("(detail::CoverMode)1", "subset_dp")
        source = os.environ["F"]
        print(f"{source}\t{name}\tregs {m.group(1)}\tstack {spill[0]}\tspill {spill[1]}/{spill[2]}")
        cur = None
'
done | sort -u
