#!/usr/bin/env bash
# Build the Python extensions cobalt._core and cobalt._cuda for another interpreter than the one
# they were built for here (the GPU machine's python3 is 3.12 with a CUDA torch; this project's
# machines have Debian's 3.11), from the GPU bundle's prebuilt static libraries (docs/gpu.md).
#
#   bash bench/gpu/build_python.sh [--bundle DIR] [--out DIR] [--bundle-libs-only]
#                                  [--print-pybind11]
#
# Needs: `bash bench/gpu/run.sh --bundle` run here first (DIR, default build/gpu-bundle, then holds
# libcobalt.a, libcobalt_cuda.a, the static CUDA runtime, fmt's and pybind11's headers and the
# shared libraries the extensions need, e.g. fmt and METIS); on the machine it runs on: the
# interpreter $PYTHON (default python3) with its C headers, and a C++20 compiler $CXX (default c++).
# Only the binding sources (python/src, python/src_cuda) are compiled there, against the first
# pybind11 of: PYBIND11_INCLUDE=DIR; the interpreter's own (pip); the one a pip torch wheel ships
# in torch/include/pybind11 (only that directory is put on the include path: torch/include also
# holds its own fmt); the bundle's (Debian's 2.10). numpy 2 needs pybind11 >= 2.12: the log warns
# when the choice is older and numpy is 2.x. --print-pybind11 prints the choice (where from, then
# the include directory) and exits.
#
# Writes OUT (default build/gpu-python): OUT/cobalt/ is a copy of python/cobalt's Python files with
# the two extensions, OUT/lib/ the bundle's shared libraries that this machine does not already
# have (the extensions find them through their RUNPATH, $ORIGIN/../lib; a library this machine has
# under the same soname is taken from the machine). Put OUT first on sys.path, or set
# COBALT_PYTHON_PACKAGE_DIR=OUT for python/tests. --bundle-libs-only takes every shared library
# from the bundle, as on a machine that has none of them (how this project's test covers that path).
#
# Exit status: 0 built and imported; 2 something it needs is missing (the message says what);
# 3 compiling or linking failed; 4 the built modules do not import.
set -euo pipefail
cd "$(dirname "$0")/../.."

bundle=build/gpu-bundle
out=build/gpu-python
bundle_libs_only=0
print_pybind11=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --bundle) bundle=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --bundle-libs-only) bundle_libs_only=1; shift ;;
    --print-pybind11) print_pybind11=1; shift ;;
    *)
      echo "build_python.sh: unknown argument '$1' (valid: --bundle DIR, --out DIR, --bundle-libs-only, --print-pybind11)" >&2
      exit 2
      ;;
  esac
done

missing() { echo "build_python.sh: $*" >&2; exit 2; }

parts=$bundle/python
for f in lib/libcobalt.a lib/libcobalt_cuda.a lib/libcudart_static.a include/fmt/format.h; do
  [[ -f $parts/$f ]] ||
    missing "$parts/$f not found: make the bundle with 'bash bench/gpu/run.sh --bundle' first"
done

py=${PYTHON:-python3}
command -v "$py" >/dev/null || missing "Python interpreter '$py' not found (set PYTHON)"
py_info=$("$py" -c 'import sys, sysconfig
print(f"{sys.version_info[0]}.{sys.version_info[1]}", sysconfig.get_paths()["include"],
      sysconfig.get_config_var("EXT_SUFFIX"))') || missing "'$py' could not report its version and paths"
read -r py_version py_include ext_suffix <<<"$py_info"
[[ -n $ext_suffix ]] || missing "'$py' reported no extension suffix (got: $py_info)"
[[ -f $py_include/Python.h ]] ||
  missing "$py (Python $py_version) has no C headers at $py_include (Python.h); install its -dev package"

# pybind11: see the header. (Version of the headers under an include directory: its macros.)
pybind11_version() {
  local header=$1/pybind11/detail/common.h
  [[ -f $header ]] || { echo '?'; return; }
  awk '$1 == "#define" && $2 ~ /^PYBIND11_VERSION_(MAJOR|MINOR|PATCH)$/ {v[$2] = $3}
    END {print v["PYBIND11_VERSION_MAJOR"] "." v["PYBIND11_VERSION_MINOR"] "." v["PYBIND11_VERSION_PATCH"]}' \
    "$header"
}
torch_pybind11=  # torch/include/pybind11 when that is the choice (linked into OUT below)
if [[ -n ${PYBIND11_INCLUDE:-} ]]; then
  [[ -f $PYBIND11_INCLUDE/pybind11/pybind11.h ]] ||
    missing "PYBIND11_INCLUDE=$PYBIND11_INCLUDE has no pybind11/pybind11.h"
  pybind_include=$PYBIND11_INCLUDE
  pybind_from="pybind11 $(pybind11_version "$pybind_include") from PYBIND11_INCLUDE"
elif pybind_include=$("$py" -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null) &&
  [[ -f $pybind_include/pybind11/pybind11.h ]]; then
  pybind_from="$py's pybind11 $("$py" -c 'import pybind11; print(pybind11.__version__)')"
elif torch_include=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))' 2>/dev/null) &&
  [[ -f $torch_include/pybind11/pybind11.h ]]; then
  torch_pybind11=$torch_include/pybind11
  pybind_include=$torch_include
  pybind_from="torch's pybind11 $(pybind11_version "$torch_include") ($torch_pybind11)"
elif [[ -f $parts/pybind11/pybind11/pybind11.h ]]; then
  pybind_include=$parts/pybind11
  pybind_from="the bundle's pybind11 ($(cat "$parts/pybind11/VERSION" 2>/dev/null || echo '?'))"
else
  missing "no pybind11: not PYBIND11_INCLUDE, '$py -c \"import pybind11\"', torch/include/pybind11 or $parts/pybind11"
fi
# numpy 2 needs pybind11 >= 2.12: say so when the choice is older (the bundle's Debian 2.10, or an
# old torch's).
pybind_version=$(pybind11_version "$pybind_include")
numpy_major=$("$py" -c 'import numpy; print(numpy.__version__.split(".")[0])' 2>/dev/null || true)
if [[ $numpy_major =~ ^[0-9]+$ && $numpy_major -ge 2 && $pybind_version =~ ^([0-9]+)\.([0-9]+) ]] &&
  ((BASH_REMATCH[1] < 2 || (BASH_REMATCH[1] == 2 && BASH_REMATCH[2] < 12))); then
  echo "build_python.sh: warning: $py has numpy $numpy_major.x, and $pybind_from predates" \
    "numpy 2 (pybind11 >= 2.12 needed: pip install pybind11, or set PYBIND11_INCLUDE)" >&2
fi
if [[ $print_pybind11 -eq 1 ]]; then
  echo "$pybind_from"
  echo "${torch_pybind11:-$pybind_include/pybind11}"
  exit 0
fi

cxx=${CXX:-$(command -v c++ || command -v g++ || true)}
[[ -n $cxx ]] && command -v "$cxx" >/dev/null || missing "no C++ compiler (c++ or g++; set CXX)"
jobs=${JOBS:-$(nproc)}
echo "build_python.sh: Python $py_version ($py, $ext_suffix), $pybind_from, $("$cxx" --version | head -1)"

rm -rf "$out"
mkdir -p "$out/obj/core" "$out/obj/cuda" "$out/lib"
out=$(cd "$out" && pwd)
if [[ -n $torch_pybind11 ]]; then
  # Only torch's pybind11 on the include path, not the rest of torch/include (its fmt would shadow
  # the bundle's, which the extensions link against).
  mkdir -p "$out/pybind11-include"
  ln -s "$torch_pybind11" "$out/pybind11-include/pybind11"
  pybind_include=$out/pybind11-include
fi
cp -r python/cobalt "$out/"
find "$out/cobalt" \( -name '*.so' -o -name __pycache__ \) -prune -exec rm -rf {} +

# The bundle's shared libraries, except those this machine's loader already knows by soname: a
# second copy of e.g. libz in the process would shadow the machine's own for every later import.
link_libs=()
while IFS= read -r lib; do
  soname=$(basename "$lib")
  system_path=
  if [[ $bundle_libs_only -eq 0 ]]; then
    system_path=$({ ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true; } |
      awk -v so="$soname" '$1 == so && /x86-64/ && !found {print $NF; found = 1}')
  fi
  if [[ -n $system_path ]]; then
    link_libs+=("$system_path")
  else
    cp "$lib" "$out/lib/"
    link_libs+=("$out/lib/$soname")
  fi
done < <(find "$parts/deps" -maxdepth 1 -type f -name 'lib*.so*' | LC_ALL=C sort)
echo "build_python.sh: from the bundle: $(ls "$out/lib" | tr '\n' ' ')"

flags=(-std=c++20 -O2 -DNDEBUG -DFMT_SHARED -fPIC -fvisibility=hidden -Iinclude -Ipython/src
  -isystem "$pybind_include" -isystem "$py_include" -isystem "$parts/include")
compile() {  # SOURCE OBJECT
  "$cxx" "${flags[@]}" -c "$1" -o "$2" ||
    { echo "build_python.sh: compiling $1 failed" >&2; return 1; }
}
sources=(python/src/*.cpp python/src_cuda/module.cpp)
status=0
for ((first = 0; first < ${#sources[@]}; first += jobs)); do  # batches of $jobs compilers
  pids=()
  for src in "${sources[@]:first:jobs}"; do
    kind=core
    [[ $src == python/src_cuda/* ]] && kind=cuda
    compile "$src" "$out/obj/$kind/$(basename "$src" .cpp).o" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=3; done
done
[[ $status -eq 0 ]] || exit 3

# --no-as-needed: every library is a direct dependency, loaded through this RUNPATH before the
# bundle's libraries ask for each other (their own dependencies resolve to those loaded copies).
link=(-shared -Wl,--no-as-needed "-Wl,-rpath,\$ORIGIN/../lib" -pthread)
"$cxx" "${link[@]}" -o "$out/cobalt/_core$ext_suffix" "$out"/obj/core/*.o "$parts/lib/libcobalt.a" \
  "${link_libs[@]}" -lm || { echo "build_python.sh: linking _core failed" >&2; exit 3; }
"$cxx" "${link[@]}" -o "$out/cobalt/_cuda$ext_suffix" "$out/obj/cuda/module.o" \
  "$parts/lib/libcobalt_cuda.a" "$parts/lib/libcobalt.a" "$parts/lib/libcudart_static.a" \
  "${link_libs[@]}" -ldl -lrt -lm || { echo "build_python.sh: linking _cuda failed" >&2; exit 3; }

# A shared object may keep undefined symbols until it is loaded, and a function's is looked up at
# its first call: a library missing from the bundle would fail a test, not this build. Every
# undefined symbol but the interpreter's own (Py*, _Py*) must resolve now.
for module in "$out/cobalt/_core$ext_suffix" "$out/cobalt/_cuda$ext_suffix"; do
  unresolved=$(ldd -r "$module" 2>&1 | grep 'undefined symbol' | grep -vE 'undefined symbol: _?Py' ||
    true)
  if [[ -n $unresolved ]]; then
    echo "build_python.sh: $(basename "$module") has symbols no library provides:" >&2
    echo "$unresolved" | head -20 >&2
    exit 3
  fi
done

if ! (cd "$out" && "$py" -c 'import cobalt, cobalt._cuda as c; print("build_python.sh: imported",
      cobalt.__file__, "and cobalt._cuda; device_available:", bool(c.device_available()))'); then
  echo "build_python.sh: the built modules do not import (ldd $out/cobalt/_core$ext_suffix)" >&2
  exit 4
fi
echo "build_python.sh: done: COBALT_PYTHON_PACKAGE_DIR=$out python3 -m pytest python/tests/test_cuda.py"
