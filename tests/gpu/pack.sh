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
# OpenMPI from Debian's packages into BUILD_DIR/worker; run.sh runs it under
# that OpenMPI's orterun; NCCL is the GPU machine's own).
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
BUILD="$ROOT/$NAME"
ARCH=${CUDA_ARCH:-90}
JOBS=${JOBS:-$(nproc)}

mkdir -p "$BUILD"
{
  echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), commit $(git -C "$ROOT" rev-parse HEAD)"
  cmake -S "$ROOT/tests/gpu/standalone" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DSPGATE_BUILD_BENCH=ON -DSPGATE_BUILD_TESTS=ON
  cmake --build "$BUILD" -j "$JOBS"
} > "$BUILD/build-info.txt" 2>&1 || { tail -30 "$BUILD/build-info.txt" >&2; exit 1; }
# Write ctest's per-case lists now: discovering them there would include this
# machine's CMake module path.
(cd "$BUILD" && ctest -N -L gpu > /dev/null)

# The shared libraries the binaries need, less the C/C++ runtime and CUDA's.
mkdir -p "$BUILD/rt"
find "$BUILD/bin" "$BUILD/tests" -maxdepth 1 -type f -perm -u+x -print0 |
  xargs -0 ldd | awk '/=> \//{print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas(Lt)?)\.so' |
  while read -r lib; do cp -L "$lib" "$BUILD/rt/"; done

if [ -n "${WORKER_TEST:-}" ]; then
  W="$BUILD/worker"
  rm -rf "$W"
  mkdir -p "$W/rt" "$W/ompi"
  cp "$WORKER_TEST" "$W/"
  strip -g "$W/$(basename "$WORKER_TEST")"
  # OpenMPI as installed, under ompi/ with the same layout (OPAL_PREFIX=ompi/usr).
  dpkg -L libopenmpi3 openmpi-bin openmpi-common libpmix2 |
    while read -r f; do if [ -f "$f" ]; then echo "$f"; fi; done |
    grep -v -E '/(doc|man)/' | tar -cf - -T - 2>/dev/null | tar -C "$W/ompi" -xf -
  { ldd "$WORKER_TEST"; find "$W/ompi" -name '*.so*' -type f -exec ldd {} \;
    ldd "$W/ompi/usr/bin/orted" "$W/ompi/usr/bin/orterun"; } 2>/dev/null |
    awk '/=> \//{print $3}' | sort -u | grep -v "^$W" |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas(Lt)?|libnccl)\.so' |
    while read -r lib; do cp -Ln "$lib" "$W/rt/"; done
fi

tar -C "$ROOT" -cJf "$OUT/gpu-build.tar.xz" --exclude='*.o' --exclude='*.a' "$NAME"
echo "$OUT/gpu-build.tar.xz: $(du -h "$OUT/gpu-build.tar.xz" | cut -f1) ($(ls "$BUILD/rt" | wc -l) libraries in $NAME/rt)"
