#!/usr/bin/env bash
# kernels/tools/pack_prebuilt.sh — copy the GPU check's binaries of a CUDA build, and the shared
# libraries they load that a bare CUDA machine may lack, into one folder for
# `LQ_PREBUILT=<folder> bash kernels/gpu_check.sh` on another x86-64 Linux machine with a GPU
# (glibc >= this machine's; the C library with libm and libmvec, libstdc++, libgcc and the CUDA driver are
# the target's).
#
# Usage:  kernels/tools/pack_prebuilt.sh BUILD_DIR OUT_DIR
#   BUILD_DIR  a build of this project with -DLATENTQ_CUDA=ON (targets latentq latentq_cuda_info test_gpu
#              test_gpu_emu latentq_bench lq_results_equal built; missing ones are skipped with a note)
#   OUT_DIR    written: bin/ (the binaries), lib/ (their non-system shared libraries, from ldd),
#              BUILD_INFO (commit, CUDA architectures, compiler)
# Exit: 0 written · 2 bad arguments or no binary found.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR OUT_DIR" >&2; exit 2; }
BUILD=$1 OUT=$2
[ -f "$BUILD/CMakeCache.txt" ] || { echo "pack_prebuilt: $BUILD is not a CMake build folder" >&2; exit 2; }
rm -rf "$OUT"; mkdir -p "$OUT/bin" "$OUT/lib"
n=0
for t in latentq latentq_cuda_info test_gpu test_gpu_emu latentq_bench lq_results_equal; do
  f=$(find "$BUILD" -type f -name "$t" -perm -u+x | head -1)
  if [ -z "$f" ]; then echo "pack_prebuilt: $t not built in $BUILD (skipped)" >&2; continue; fi
  cp "$f" "$OUT/bin/"; n=$((n + 1))
done
[ $n -gt 0 ] || { echo "pack_prebuilt: no binary found in $BUILD" >&2; exit 2; }
# Every resolved library except the C runtime and the driver (those must be the target's own) and cuBLAS
# (libcublasLt is ~0.5 GB: gpu_check.sh finds the target's own, or a pip wheel's).
ldd "$OUT"/bin/* 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libmvec|libdl|libpthread|librt|libresolv|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt)\.so' |
  while read -r lib; do cp -L "$lib" "$OUT/lib/"; done
root=$(cd "$(dirname "$0")/../.." && pwd)
{
  echo -n "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  # the machine code in the binaries (the project sets CMAKE_CUDA_ARCHITECTURES in CMakeLists.txt, not the cache)
  archs=$(for f in "$OUT"/bin/*; do cuobjdump --list-elf "$f" 2>/dev/null || true; done |
          grep -oE 'sm_[0-9]+[a-z]?' | sort -u | tr '\n' ' ' || true)
  # without cuobjdump: the targets the build compiled for (its -gencode / --generate-code flags)
  [ -n "$archs" ] || archs=$(grep -ohE 'code=\[?[a-z_0-9,]*sm_[0-9]+[a-z]?' "$BUILD"/build.ninja \
    "$BUILD"/CMakeFiles/*/flags.make 2>/dev/null | grep -oE 'sm_[0-9]+[a-z]?' | sort -u | tr '\n' ' ' || true)
  echo -n "; CUDA architectures ${archs:-unknown}"
  echo "; $(grep -E '^CMAKE_CUDA_COMPILER:' "$BUILD/CMakeCache.txt" | cut -d= -f2) on $(uname -m)"
} > "$OUT/BUILD_INFO"
echo "pack_prebuilt: $n binaries, $(ls "$OUT/lib" | wc -l) libraries, $(du -sh "$OUT" | cut -f1) in $OUT"
