#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (PyTorch + Gloo, CPU/CUDA as torch provides) into the
# project's venv, reproducibly and idempotently.
#
# Why a script: 0.28.1 is the last Horovod release and, as published, does not compile against
# torch >= 2.1, whose headers need C++17 while Horovod's CMakeLists pin C++14. We patch exactly
# the two `set(CMAKE_CXX_STANDARD 14)` lines (top-level CMakeLists.txt and
# horovod/torch/CMakeLists.txt) to 17, verify the patch took, build a wheel against the venv's
# torch (--no-build-isolation, so the build sees that torch and not a fresh one from PyPI), and
# cache the wheel keyed by horovod + torch + python version. A second run installs from the
# cache in seconds; a run with horovod already importable does nothing.
#
# Usage: scripts/build_horovod.sh            (from anywhere; acts on <repo>/.venv)
# Env:   SCALELAB_VENV         venv to build for/install into (default <repo>/.venv)
#        SCALELAB_WHEEL_CACHE  wheel cache (default $HOME/.cache/scalelab/wheels)
#        HOROVOD_BUILD_JOBS    parallel compile jobs (default: nproc)
#        SCALELAB_HOROVOD_FORCE=1  rebuild even when a cached wheel exists
set -euo pipefail

HOROVOD_VERSION=0.28.1
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SCALELAB_VENV:-$REPO/.venv}
PY=$VENV/bin/python
CACHE=${SCALELAB_WHEEL_CACHE:-$HOME/.cache/scalelab/wheels}
CONSTRAINTS=$REPO/constraints.txt

log() { echo "build_horovod: $*" >&2; }
die() { log "error: $*"; exit 1; }

[ -x "$PY" ] || die "no python at $PY (run ./bootstrap.sh first or set SCALELAB_VENV)"
# cmake, the compilers and the venv's console scripts must resolve from the venv first.
export PATH="$VENV/bin:$PATH"

TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) \
  || die "torch is not importable from $PY; Horovod must be built against the installed torch"
PY_TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
# A torch built with CUDA gets Horovod with NCCL operations: without them Horovod reduces CUDA
# tensors through host memory over Gloo. HOROVOD_GPU_OPERATIONS=none builds without anyway.
TORCH_CUDA=$("$PY" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null || true)
if [ -z "${HOROVOD_GPU_OPERATIONS:-}" ] && [ -n "$TORCH_CUDA" ]; then
  export HOROVOD_GPU_OPERATIONS=NCCL
fi
[ "${HOROVOD_GPU_OPERATIONS:-}" = none ] && unset HOROVOD_GPU_OPERATIONS
WANT_NCCL=0
[ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ] && WANT_NCCL=1
# The GPU kernels are compiled for the compute capabilities of the GPUs torch sees here (the
# head node builds for a cluster of its own kind; PTX of the highest rides along), not for every
# architecture nvcc knows; HOROVOD_BUILD_CUDA_CC_LIST=80,90 names them instead.
CC_TAG=
if [ "$WANT_NCCL" = 1 ] && [ -z "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ]; then
  CC_LIST=$("$PY" -c 'import torch
print(",".join(sorted({"%d%d" % torch.cuda.get_device_capability(i)
                       for i in range(torch.cuda.device_count())})))' 2>/dev/null || true)
  [ -n "$CC_LIST" ] && export HOROVOD_BUILD_CUDA_CC_LIST=$CC_LIST
fi
[ "$WANT_NCCL" = 1 ] && [ -n "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ] \
  && CC_TAG=_cc${HOROVOD_BUILD_CUDA_CC_LIST//,/-}
# '+' (torch local version, e.g. 2.13.0+cpu) is legal in a directory name; keep it in the key,
# and the GPU operations with it (a wheel without NCCL never stands in for one with it).
KEY="horovod-${HOROVOD_VERSION}_torch-${TORCH_VERSION}_${PY_TAG}"
[ "$WANT_NCCL" = 1 ] && KEY="${KEY}_nccl${CC_TAG}"
KEY_DIR=$CACHE/$KEY

installed_ok() {
  "$PY" - "$HOROVOD_VERSION" "$WANT_NCCL" <<'EOF' >/dev/null 2>&1
import sys
import horovod
import horovod.torch  # loads the compiled extension: fails if built against another torch
nccl_ok = sys.argv[2] != "1" or bool(horovod.torch.nccl_built())
sys.exit(0 if horovod.__version__ == sys.argv[1] and nccl_ok else 1)
EOF
}

install_wheel() {
  local whl=$1
  log "installing $(basename "$whl")"
  # Constrain torch so horovod's 'torch' extra-free deps can never pull a different build.
  local cargs=()
  [ -f "$CONSTRAINTS" ] && cargs=(-c "$CONSTRAINTS")
  "$PY" -m pip install -q --force-reinstall --no-deps "$whl"
  # Runtime deps (cloudpickle, psutil, pyyaml, packaging, cffi); torch is left untouched.
  "$PY" -m pip install -q "${cargs[@]}" cloudpickle psutil pyyaml packaging 'cffi>=1.4.0'
  installed_ok || die "installed $(basename "$whl") but 'import horovod.torch' fails"
  log "ok: horovod $HOROVOD_VERSION for torch $TORCH_VERSION ($PY_TAG)"
}

if [ "${SCALELAB_HOROVOD_FORCE:-0}" != 1 ] && installed_ok; then
  log "horovod $HOROVOD_VERSION already installed and importable with torch $TORCH_VERSION; nothing to do"
  exit 0
fi

cached=$(ls "$KEY_DIR"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ "${SCALELAB_HOROVOD_FORCE:-0}" != 1 ] && [ -n "$cached" ]; then
  log "using cached wheel $cached"
  install_wheel "$cached"
  exit 0
fi

command -v g++ >/dev/null || die "g++ not found (apt-get install g++ make)"
command -v make >/dev/null || die "make not found (apt-get install make)"
if [ "$WANT_NCCL" = 1 ] && ! command -v nvcc >/dev/null; then
  HOROVOD_CUDA_HOME=${HOROVOD_CUDA_HOME:-/usr/local/cuda}
  [ -x "$HOROVOD_CUDA_HOME/bin/nvcc" ] || die "Horovod's NCCL operations need the CUDA \
toolkit's nvcc, found neither on PATH nor in $HOROVOD_CUDA_HOME/bin: install the toolkit of \
torch's CUDA ($TORCH_CUDA), set HOROVOD_CUDA_HOME, or build without: HOROVOD_GPU_OPERATIONS=none"
  export HOROVOD_CUDA_HOME PATH="$HOROVOD_CUDA_HOME/bin:$PATH"
fi

# Build tools only where missing: a cmake on PATH (the venv's first) and wheel/setuptools for
# the build without isolation. A cmake of 4 or later builds Horovod's third_party, whose
# cmake_minimum_required is below 3.5, only with this policy floor.
if ! command -v cmake >/dev/null || ! "$PY" -c 'import setuptools, wheel' 2>/dev/null; then
  log "installing build tools (cmake<4, wheel, setuptools) into $VENV"
  "$PY" -m pip install -q 'cmake<4' wheel setuptools packaging
fi
export CMAKE_POLICY_VERSION_MINIMUM=${CMAKE_POLICY_VERSION_MINIMUM:-3.5}
cmake --version | head -n1 >&2

WORK=$(mktemp -d "${TMPDIR:-/tmp}/build_horovod.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

log "downloading horovod==$HOROVOD_VERSION sdist"
"$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$WORK/sdist"
SDIST=$(ls "$WORK"/sdist/horovod-"$HOROVOD_VERSION".tar.gz) || die "sdist not downloaded"
tar -xzf "$SDIST" -C "$WORK"
SRC=$WORK/horovod-$HOROVOD_VERSION
[ -f "$SRC/setup.py" ] || die "unexpected sdist layout in $SDIST"

for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
  grep -q 'set(CMAKE_CXX_STANDARD 14)' "$SRC/$f" \
    || die "$f: expected 'set(CMAKE_CXX_STANDARD 14)' not found; sdist changed, review the patch"
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$SRC/$f"
  if grep -q 'set(CMAKE_CXX_STANDARD 14)' "$SRC/$f" || ! grep -q 'set(CMAKE_CXX_STANDARD 17)' "$SRC/$f"; then
    die "$f: C++17 patch did not apply"
  fi
  log "patched $f to C++17"
done

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
export HOROVOD_WITH_GLOO=1
if command -v mpicxx >/dev/null 2>&1; then
  log "MPI found ($(command -v mpicxx)); building with MPI as well as Gloo"
  export HOROVOD_WITH_MPI=1
else
  export HOROVOD_WITHOUT_MPI=1
fi
# NCCL ops only when torch has CUDA and NCCL is wanted explicitly (needs the NCCL headers).
if [ -n "${HOROVOD_GPU_OPERATIONS:-}" ]; then
  log "HOROVOD_GPU_OPERATIONS=$HOROVOD_GPU_OPERATIONS (CUDA archs ${HOROVOD_BUILD_CUDA_CC_LIST:-all nvcc knows})"
fi
# Horovod links the NCCL torch loads: a torch from PyPI carries it in an nvidia package with
# only the versioned library (libnccl.so.2), which CMake's find_library does not take, so a
# directory of links stands in for it. The extension then names libnccl.so.2 and binds to the
# copy torch already loaded: one NCCL per process. HOROVOD_NCCL_HOME (or _INCLUDE and _LIB)
# names another; without either, CMake looks beside the CUDA toolkit.
if [ "$WANT_NCCL" = 1 ] && [ -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_INCLUDE:-}${HOROVOD_NCCL_LIB:-}" ]; then
  if NCCL_DIRS=$("$PY" - <<'EOF'
import glob, os, sys, sysconfig
import torch
roots = [os.path.dirname(os.path.dirname(torch.__file__)), sysconfig.get_paths()["platlib"]]
for root in dict.fromkeys(roots):
    for header in sorted(glob.glob(os.path.join(root, "nvidia", "**", "nccl.h"), recursive=True)):
        lib = os.path.join(os.path.dirname(os.path.dirname(header)), "lib")
        if glob.glob(os.path.join(lib, "libnccl.so*")):
            print(os.path.dirname(header), lib)
            sys.exit(0)
sys.exit(1)
EOF
  ); then
    read -r NCCL_INC NCCL_LIB <<<"$NCCL_DIRS"
    mkdir -p "$WORK/nccl/lib"
    ln -s "$NCCL_INC" "$WORK/nccl/include"
    for f in "$NCCL_LIB"/libnccl.so*; do ln -s "$f" "$WORK/nccl/lib/"; done
    [ -e "$WORK/nccl/lib/libnccl.so" ] \
      || ln -s "$(ls "$NCCL_LIB"/libnccl.so.* | head -n1)" "$WORK/nccl/lib/libnccl.so"
    export HOROVOD_NCCL_INCLUDE=$WORK/nccl/include HOROVOD_NCCL_LIB=$WORK/nccl/lib
    export HOROVOD_NCCL_LINK=SHARED
    log "NCCL: torch's own, $NCCL_LIB"
  fi
fi
# GCC 13 and later no longer include <string>, <cstdint> or <stdexcept> through other headers,
# and Horovod 0.28.1 relies on that: include them in every C++ unit.
export CXXFLAGS="${CXXFLAGS:+$CXXFLAGS }-include cstdint -include string -include stdexcept"
# setup.py passes -j8 to make unless MAKEFLAGS is set; follow the machine instead. -k: a failed
# build names every file that failed, not the first one only.
export MAKEFLAGS="-j${HOROVOD_BUILD_JOBS:-$(nproc)} -k"

log "building wheel (several minutes; MAKEFLAGS=$MAKEFLAGS)"
start=$(date +%s)
"$PY" -m pip wheel -q --no-build-isolation --no-deps "$SRC" -w "$WORK/wheel" \
  > "$WORK/build.log" 2>&1 || {
    KEPT=${TMPDIR:-/tmp}/build_horovod-$KEY.log
    cp "$WORK/build.log" "$KEPT"
    tail -n 40 "$WORK/build.log" >&2
    log "the compiler's errors, first 30:"
    grep -E -m 30 'error:|Error [0-9]|undefined reference|CMake Error' "$WORK/build.log" >&2 || true
    die "wheel build failed; the whole log is $KEPT"; }
log "built in $(( $(date +%s) - start )) s"

WHL=$(ls "$WORK"/wheel/horovod-"$HOROVOD_VERSION"-*.whl) || die "no wheel produced"
mkdir -p "$KEY_DIR"
# Copy then rename, so a concurrent reader never sees a half-written wheel.
cp "$WHL" "$KEY_DIR/.$(basename "$WHL").part"
mv "$KEY_DIR/.$(basename "$WHL").part" "$KEY_DIR/$(basename "$WHL")"
log "cached $KEY_DIR/$(basename "$WHL")"
install_wheel "$KEY_DIR/$(basename "$WHL")"
