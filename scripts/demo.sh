#!/usr/bin/env bash
# The main job on the embedded default: generate the GLM-4.5-Air-like workload (128 experts, top-8,
# 32 source ranks) and compare every policy on a 4 nodes x 8 GPUs cluster; writes out/demo.json.
set -euo pipefail
cobalt=${1:-build/release/bin/cobalt}
mkdir -p out
"$cobalt" simulate --preset paper-glm45air-ep32 --cluster 4x8 --rho 0.5 --eps 0.15 --json out/demo.json
echo "wrote out/demo.json"
