#!/usr/bin/env bash
# Build the kernels-only project (tests/gpu/standalone) here for one CUDA arch
# and pack it, with the shared libraries a bare CUDA image lacks (Abseil,
# OpenBLAS, gfortran; not the CUDA runtime or cuBLAS, which it has), into
# OUTDIR/gpu-build.tar.xz, for a GPU machine that has nvcc, CMake and a driver
# but none of our dev packages and no network.
# Usage: tests/gpu/pack.sh OUTDIR
# Environment: BUILD_DIR (default build-gpu-kernels, relative to the repository
# root), CUDA_ARCH (default 90), JOBS, WORKER_TEST (optional: a full build's
# tests/worker_runtime_gpu_test, packed with its libraries and a relocatable
# OpenMPI copied from Debian 12's packages libopenmpi3, openmpi-bin,
# openmpi-common and libpmix2 into BUILD_DIR/worker; run.sh runs it under that
# OpenMPI's orterun; NCCL is the GPU machine's own).
# On the GPU machine, from a checkout of the same commit at the same path:
#   tar -xJf OUTDIR/gpu-build.tar.xz
#   LD_LIBRARY_PATH=$PWD/build-gpu-kernels/rt:$LD_LIBRARY_PATH \
#     PREBUILT=1 BUILD_DIR=build-gpu-kernels tests/gpu/run.sh RESULTS
# ctest's files name the build by its absolute path, so the checkout must sit
# where it sat here (a symbolic link to it will do).
set -eu -o pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
NAME=${BUILD_DIR:-build-gpu-kernels}
case "$NAME" in
  /*) echo "BUILD_DIR=$NAME: must be relative to the repository root (the bundle is unpacked there)" >&2
      exit 2 ;;
esac
BUILD="$ROOT/$NAME"
ARCH=${CUDA_ARCH:-90}
JOBS=${JOBS:-$(nproc)}

mkdir -p "$BUILD"
{
  echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), commit $(git -C "$ROOT" rev-parse HEAD)"
  cmake -S "$ROOT/tests/gpu/standalone" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DSPGATE_BUILD_BENCH=ON -DSPGATE_BUILD_TESTS=ON &&
    cmake --build "$BUILD" -j "$JOBS"
} > "$BUILD/build-info.txt" 2>&1 || { tail -30 "$BUILD/build-info.txt" >&2; exit 1; }
# Write ctest's per-case lists now: discovering them there would include this
# machine's CMake module path.
(cd "$BUILD" && ctest -N -L gpu > /dev/null)

# The shared libraries the binaries need, less the C/C++ runtime, CUDA's and
# NCCL (the GPU machine's own). ldd fails on anything not dynamically linked.
SYSTEM_LIBS='/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas(Lt)?|libnccl)\.so'
copy_libs() {  # $1 = destination; file names on stdin, each copied once
  local lib
  while read -r lib; do
    if [ ! -e "$1/$(basename "$lib")" ]; then cp -L "$lib" "$1/"; fi
  done
}
mkdir -p "$BUILD/rt"
{ find "$BUILD/bin" "$BUILD/tests" -maxdepth 1 -type f -perm -u+x -print0 |
    xargs -0 ldd 2>/dev/null || true; } |
  awk '/=> \//{print $3}' | sort -u | { grep -v -E "$SYSTEM_LIBS" || true; } |
  copy_libs "$BUILD/rt"

W="$BUILD/worker"
rm -rf "$W"  # never pack a worker test left from an earlier run
if [ -n "${WORKER_TEST:-}" ]; then
  OMPI_PACKAGES="libopenmpi3 openmpi-bin openmpi-common libpmix2"
  for p in $OMPI_PACKAGES; do
    if ! dpkg -s "$p" > /dev/null 2>&1; then
      echo "WORKER_TEST: packing OpenMPI needs Debian 12's $OMPI_PACKAGES; $p is not installed" >&2
      exit 1
    fi
  done
  mkdir -p "$W/rt" "$W/ompi"
  cp "$WORKER_TEST" "$W/worker_runtime_gpu_test"
  strip -g "$W/worker_runtime_gpu_test"
  # OpenMPI as installed, under ompi/ with the same layout (OPAL_PREFIX=ompi/usr).
  dpkg -L $OMPI_PACKAGES |
    while read -r f; do if [ -f "$f" ]; then echo "$f"; fi; done |
    grep -v -E '/(doc|man)/' | tar -cf - -T - 2>/dev/null | tar -C "$W/ompi" -xf -
  { ldd "$WORKER_TEST"; find "$W/ompi" -name '*.so*' -type f -exec ldd {} \;
    ldd "$W/ompi/usr/bin/orted" "$W/ompi/usr/bin/orterun" || true; } 2>/dev/null |
    awk '/=> \//{print $3}' | sort -u | { grep -v -E "^$W|$SYSTEM_LIBS" || true; } |
    copy_libs "$W/rt"
fi

tar -C "$ROOT" -cJf "$OUT/gpu-build.tar.xz" --exclude='*.o' --exclude='*.a' "$NAME"
echo "$OUT/gpu-build.tar.xz: $(du -h "$OUT/gpu-build.tar.xz" | cut -f1) ($(ls "$BUILD/rt" | wc -l) libraries in $NAME/rt)"
