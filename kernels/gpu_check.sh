#!/usr/bin/env bash
# kernels/gpu_check.sh — THE GPU check of latentq's CUDA quantizer. On one H200 (2026-12-04, prebuilt binaries):
# tests and sanitizers 40 s, the three studies 225 s, the benchmarks ≈ 6 min (the CPU verification at T = 262,144 is
# most of it): ≈ 11 minutes in all, more than one 10-minute call: split it in two calls, the first with
# LQ_BENCH_T=0 LQ_FUSED=0 (no benchmarks), the second with LQ_SANITIZE=0 LQ_V2LITE=0 LQ_MODEL_STUDY=0.
#
#   1. configure + build (Release, the GPU's own architecture or 90, only the needed targets,
#      -j$(nproc)): the full project with -DLATENTQ_PYTHON=OFF if its dependencies are there, else
#      kernels/standalone (CUDA toolkit + CMake only; GoogleTest / Google Benchmark optional);
#      or LQ_PREBUILT: binaries built elsewhere (kernels/tools/pack_prebuilt.sh), no build at all;
#   2. latentq_cuda_info: which GPU, or "no NVIDIA GPU found: <reason>" → host-emulator tests, exit 77;
#   3. test_gpu (CPU vs GPU byte for byte, every spec) and test_gpu_emu;
#   4. compute-sanitizer memcheck + racecheck on a few tests (LQ_SANITIZE=0 skips; skipped if absent);
#   4b. the default study on tiny-mla and on a 2-layer DeepSeek-V2-Lite-shaped synthetic dump, --device
#      cuda against --device cpu (the V2-Lite one timed; LQ_V2LITE=0 skips it);
#   4c. `latentq study --model` on a random-init FP8 checkpoint, --device cuda vs cpu, timed (LQ_MODEL_STUDY=0 skips;
#      python3, or LQ_PYTHON, needs torch with CUDA, transformers and h5py);
#   5. latentq_bench: GPU quantize/dequantize + device-to-device copy at T = 262144 and 1048576
#      (151M and 604M elements of D = 576), each result compared with the CPU reference at 262144; and the
#      fused decode-attention per format (gpu/fused_decode/..., batch x heads x context of LQ_FUSED);
#   5b. where python3 has torch with CUDA: bench/decode_torch.py, the same decode step in PyTorch (cuBLAS bmm,
#      SDPA) at the LQ_FUSED shapes, the library baseline of the fused kernel;
#   6. the tables, printed LAST: spec, size, GB/s, ratio to the D2D copy, identical; then the fused decode:
#      spec, B, H, L, splits, time per step and per token, cache GB/s, ratio to the D2D copy; then PyTorch's.
#
# Usage:   bash kernels/gpu_check.sh          (from any directory)
# Env:     LQ_CUDA_ARCH   CUDA architecture (default: nvidia-smi's compute capability, else 90)
#          LQ_BUILD_DIR   build folder (default <repo>/build-gpucheck)
#          LQ_DEPS_DIR    folder with Debian .debs used when GoogleTest / Google Benchmark are missing
#                         (default <repo>/build-gpudeps: libgtest-dev, libbenchmark-dev, libbenchmark1debian;
#                         fetch with `apt-get download libgtest-dev libbenchmark-dev libbenchmark1debian`)
#          LQ_STANDALONE  1: skip the full-project configure
#          LQ_PREBUILT    folder written by kernels/tools/pack_prebuilt.sh (bin/ + lib/): run those
#                         binaries (the full project's, study check included) instead of building
#          LQ_IGNORE_SYSTEM_DEPS  1: use the carried .debs even if the system has the packages (testing)
#          LQ_SANITIZE    0: skip compute-sanitizer
#          LQ_BENCH_T     regex of the benchmarked T (default 262144|1048576; 0 with LQ_FUSED=0: no benchmarks)
#          LQ_FUSED       regex of the fused decode shapes B:<B>/H:<H>/L:<L> (default B:(1|64)/H:(16|128)/L:32768;
#                         0 skips them)
#          OUT            folder for the logs (build, test_gpu, sanitizer, bench) and bench.json
#                         (default <build>/out)
# Exit:    0 everything passed and identical · 1 a test failed or a result differed
#          2 configure/build failed · 77 no NVIDIA GPU (built; host-emulator tests ran)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${LQ_BUILD_DIR:-$ROOT/build-gpucheck}
DEPS=${LQ_DEPS_DIR:-$ROOT/build-gpudeps}
OUTDIR=${OUT:-$BUILD/out}
BENCH_T=${LQ_BENCH_T:-262144|1048576}
FUSED=${LQ_FUSED:-B:(1|64)/H:(16|128)/L:32768}
JOBS=$(nproc 2>/dev/null || echo 4)
T0=$SECONDS
mkdir -p "$BUILD" "$OUTDIR"
rm -f "$OUTDIR"/build.log "$OUTDIR"/test_gpu.log "$OUTDIR"/sanitizer.log.* "$OUTDIR"/bench.log "$OUTDIR"/bench.json
say() { printf '[gpu_check %3ds] %s\n' $((SECONDS - T0)) "$*"; }

# cuBLAS from a pip install (the nvidia-cublas wheel: nvidia/cu13 for CUDA 13, nvidia/cublas for 12), for a
# CUDA toolkit that has none: the folder holding lib/libcublas.so.*, or nothing.
wheel_cublas() {
  command -v python3 >/dev/null || return 1
  python3 - <<'PY' 2>/dev/null
import glob, os, sys
for p in sys.path:
    for d in (os.path.join(p, "nvidia", "cu13"), os.path.join(p, "nvidia", "cublas")):
        if glob.glob(os.path.join(d, "lib", "libcublas.so*")):
            print(d); sys.exit(0)
sys.exit(1)
PY
}
PREBUILT=${LQ_PREBUILT:-}
if [ -n "$PREBUILT" ]; then
  PREBUILT=$(cd "$PREBUILT" 2>/dev/null && pwd) || { say "LQ_PREBUILT=${LQ_PREBUILT}: no such folder"; exit 2; }
  [ -d "$PREBUILT/bin" ] || { say "LQ_PREBUILT=$PREBUILT has no bin/ (write it with kernels/tools/pack_prebuilt.sh)"; exit 2; }
  export LD_LIBRARY_PATH="$PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # cuBLAS is not packed (libcublasLt is ~0.5 GB): the machine's own, else a pip wheel's.
  if CUBLAS_DIR=$(wheel_cublas); then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$CUBLAS_DIR/lib"; fi
  MODE=prebuilt
  B=$PREBUILT/bin
  say "prebuilt binaries: $B ($(cat "$PREBUILT/BUILD_INFO" 2>/dev/null || echo "no BUILD_INFO"))"
else
# ---- tools ------------------------------------------------------------------------------------
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -z "$NVCC" ]; then say "no nvcc found (CUDA toolkit needed to build)"; exit 2; fi
command -v cmake >/dev/null || { say "cmake not found (need >= 3.25)"; exit 2; }
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
say "nvcc: $("$NVCC" --version | tail -1); cmake: $(cmake --version | head -1); $JOBS cores"

ARCH=${LQ_CUDA_ARCH:-}
if [ -z "$ARCH" ] && command -v nvidia-smi >/dev/null; then
  CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [[ "$CAP" =~ ^[0-9]+$ ]] && ARCH=$CAP
fi
ARCH=${ARCH:-90}
say "CUDA architecture: $ARCH"

# ---- GoogleTest / Google Benchmark: system, else the carried Debian packages -------------------
find_cfg() {  # find_cfg <Name>: folder holding <Name>Config.cmake in the usual prefixes
  local d
  [ "${LQ_IGNORE_SYSTEM_DEPS:-0}" = 1 ] && return 1  # testing knob: act as if the system had none
  for d in /usr/lib/*/cmake/"$1" /usr/lib/cmake/"$1" /usr/lib64/cmake/"$1" /usr/local/lib/cmake/"$1" \
           /usr/local/lib64/cmake/"$1" /usr/local/lib/*/cmake/"$1" /usr/share/"$1"/cmake; do
    [ -f "$d/$1Config.cmake" ] && { echo "$d"; return 0; }
  done
  return 1
}
extract_debs() {
  local root=$DEPS/root deb
  mkdir -p "$root"
  for deb in "$DEPS"/*.deb; do
    [ -f "$deb" ] || continue
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$root"
    else  # ar + tar
      local tmp; tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$root")
      rm -rf "$tmp"
    fi
  done
}
DEP_ARGS=()
MISSING=()
for pkg in GTest benchmark; do
  if dir=$(find_cfg $pkg); then
    say "$pkg: system ($dir)"
  else
    [ -d "$DEPS/root" ] || extract_debs
    dir=$(ls -d "$DEPS"/root/usr/lib/*/cmake/$pkg 2>/dev/null | head -1)
    if [ -n "$dir" ] && [ -f "$dir/${pkg}Config.cmake" ]; then
      say "$pkg: carried Debian package ($dir)"
      DEP_ARGS+=("-D${pkg}_DIR=$dir")
    else
      say "$pkg: NOT FOUND (its targets are skipped; put its .debs in $DEPS)"
      MISSING+=("$pkg")
    fi
  fi
done

# ---- configure + build ------------------------------------------------------------------------
COMMON=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_COMPILER="$NVCC" "${DEP_ARGS[@]}")
# cuBLAS for the device attention: the toolkit's if it has one (CMake finds it), else a pip wheel's.
if [ -z "$(ls "$(dirname "$NVCC")"/../lib64/libcublas.so* "$(dirname "$NVCC")"/../lib/libcublas.so* 2>/dev/null)" ] &&
   CUBLAS_DIR=$(wheel_cublas); then
  COMMON+=(-DLATENTQ_CUBLAS_ROOT="$CUBLAS_DIR"); say "cuBLAS: $CUBLAS_DIR (pip wheel)"
fi
MODE=full
if [ "${LQ_STANDALONE:-0}" != 1 ] && [ ${#MISSING[@]} -eq 0 ] &&
   cmake -S "$ROOT" -B "$BUILD/full" "${GEN[@]}" "${COMMON[@]}" -DLATENTQ_CUDA=ON -DLATENTQ_PYTHON=OFF \
         >"$OUTDIR/build.log" 2>&1; then
  B=$BUILD/full
else
  [ "${LQ_STANDALONE:-0}" != 1 ] && [ ${#MISSING[@]} -eq 0 ] &&
    say "full project does not configure here (missing: $(grep -oE 'Could NOT find [A-Za-z0-9_]+|Could not find a package configuration file provided by "[A-Za-z0-9_]+"' "$OUTDIR/build.log" | sed -E 's/.*(find |by ")//; s/"//' | sort -u | tr '\n' ' ')); using kernels/standalone"
  MODE=standalone
  B=$BUILD/standalone
  if ! cmake -S "$ROOT/kernels/standalone" -B "$B" "${GEN[@]}" "${COMMON[@]}" >>"$OUTDIR/build.log" 2>&1; then
    tail -30 "$OUTDIR/build.log"; say "configure FAILED (log: $OUTDIR/build.log)"; exit 2
  fi
fi
TARGETS=(latentq_cuda latentq_cuda_info)
[ "$MODE" = full ] && TARGETS+=(latentq lq_results_equal)
# test_gpu_emu (the host emulator) links the CPU attention engine, which kernels/standalone does not build
[[ " ${MISSING[*]} " != *" GTest "* ]] && TARGETS+=(test_gpu) && [ "$MODE" = full ] && TARGETS+=(test_gpu_emu)
[[ " ${MISSING[*]} " != *" benchmark "* ]] && TARGETS+=(latentq_bench)
say "building ($MODE project in $B): ${TARGETS[*]}"
if ! cmake --build "$B" -j"$JOBS" --target "${TARGETS[@]}" >>"$OUTDIR/build.log" 2>&1; then
  grep -E "error|Error" "$OUTDIR/build.log" | head -30; say "build FAILED (log: $OUTDIR/build.log)"; exit 2
fi
say "built"
fi
bin() { find "$B" -type f -name "$1" -perm -u+x | head -1; }
INFO=$(bin latentq_cuda_info); TEST=$(bin test_gpu); EMU=$(bin test_gpu_emu); BENCH=$(bin latentq_bench)
CLI=$(bin latentq); REQ=$(bin lq_results_equal)
# what the build does with --device cuda: "devices: cpu, cuda (attention on the GPU: cuBLAS)", or on the CPU
# where it has no cuBLAS (none found: no toolkit cuBLAS, no wheel, no LATENTQ_CUBLAS_ROOT)
[ -z "$CLI" ] || say "$("$CLI" --version 2>&1 | tr '\n' ' ')"

# ---- device -----------------------------------------------------------------------------------
DEV=$("$INFO" 2>&1); DEV_RC=$?
echo "$DEV"
if [ $DEV_RC -ne 0 ]; then
  if [ -n "$EMU" ]; then
    say "host-emulator tests (test_gpu_emu)"
    "$EMU" --gtest_brief=1 >"$OUTDIR/test_gpu.log" 2>&1 && say "test_gpu_emu passed" || { tail -20 "$OUTDIR/test_gpu.log"; say "test_gpu_emu FAILED"; }
  fi
  echo "no NVIDIA GPU found: ${DEV#no CUDA device: }"
  exit 77
fi

STATUS=0
# ---- tests ------------------------------------------------------------------------------------
if [ -n "$TEST" ]; then
  say "test_gpu"
  if "$TEST" --gtest_brief=1 >"$OUTDIR/test_gpu.log" 2>&1; then
    say "test_gpu passed: $(grep -oE '[0-9]+ tests? from [0-9]+ test suites? ran' "$OUTDIR/test_gpu.log" | tail -1)"
  else
    STATUS=1; grep -vE '^\[ +(OK|RUN) ' "$OUTDIR/test_gpu.log" | tail -60; say "test_gpu FAILED"
  fi
  [ -z "$EMU" ] || "$EMU" --gtest_brief=1 >>"$OUTDIR/test_gpu.log" 2>&1 ||
    { STATUS=1; tail -20 "$OUTDIR/test_gpu.log"; say "test_gpu_emu FAILED"; }
fi
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "$TEST" ] && [ "${LQ_SANITIZE:-1}" != 0 ] && [ -n "$SAN" ]; then
  F='*GpuFormat.*/int4_asym_channel_g32:*GpuFormat.*/int2_sym_channel:*GpuFormat.*/int4_asym_token_g3:*GpuFormat.*/int8_sym_token_g128:*GpuFormat.*/fp8_e4m3_tile20_pow2:*GpuFormat.*/nvfp4:*GpuFormat.*/q4_1:*GpuFormat.*/flashmla_v41_fp4:*GpuFormat.*/bf16:*GpuFormat.*/int4_asym_tensor:GpuSpecial.DeviceApiReuseAndUnalignedInput:GpuHadamard.*'
  for tool in memcheck racecheck; do
    [ $tool = racecheck ] && F='*GpuFormat.*/int4_asym_token_g32:*GpuFormat.*/int2_sym_token_g128:*GpuFormat.*/fp8_e4m3_tile128_pow2:*GpuFormat.*/mxfp4:*GpuFormat.*/fp8_e4m3_tensor:GpuHadamard.*'
    say "compute-sanitizer --tool $tool (${F//:/ })"
    LQ_GPU_TEST_MAX_T=300 timeout $([ $tool = memcheck ] && echo 120 || echo 90) \
      "$SAN" --tool $tool --error-exitcode 9 "$TEST" --gtest_brief=1 --gtest_filter="$F" \
      >"$OUTDIR/sanitizer.log.$tool" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then say "$tool: clean"
    elif [ $rc -eq 9 ]; then STATUS=1; grep -m 20 -E "=========" "$OUTDIR/sanitizer.log.$tool"; say "$tool: ERRORS"
    else say "$tool: did not run to the end (rc $rc; e.g. unsupported here): $(tail -2 "$OUTDIR/sanitizer.log.$tool" | tr '\n' ' ')"; fi
  done
fi

# ---- the study on the GPU: `latentq run --device cuda` equals the CPU run, the gate passes ------
# Every table bit for bit (the quantizers are byte-identical) except /attention_error and /attention_position,
# whose attention runs on cuBLAS (another summation order; their byte and key-fraction columns come from the same
# host code on both engines, so the group's tolerance hides nothing there): to ATT_RTOL relative + ATT_ATOL
# absolute. The absolute part is float32's noise on a KL near 0: on one H200 (commit 7a8cdef) one /attention_position
# kl_mean of tiny-mla read 8.13e-7 on the CPU and 8.38e-7 on the GPU. The CPU's float32 attention itself is within
# 6.7e-3 (KL), 2.5e-5 (out_rel_fro) of a float64 evaluation on tiny-mla (README "GPU and benchmarks").
# /decision takes its KL from /attention_error (no e2e here): the same tolerance, on its numbers only
# (lq_results_equal --numbers-only): its mixed plan names one of two mixes of the same bytes whose planner objectives
# tie to 1e-4 relative (5.873e-05 on the CPU, 5.874e-05 on the GPU: one H200, commit 54a5c3e); a flip of bytes or KL
# still differs.
# /score_vs_attention ranks that KL by Spearman's rho, over as few as 2 quantizers a band: two KLs near a tie swap in
# their last bits (a rho of 1 on the CPU, -1 on the GPU, one H200, commit eab4ca6), so its values are not compared,
# only its columns and rows (lq_results_equal --shape-only); its inputs are (/latent_error bit for bit, /attention_error
# to the tolerance).
ATT_RTOL=${LQ_ATT_RTOL:-2e-2}
ATT_ATOL=${LQ_ATT_ATOL:-1e-6}
ATT_TOL=(--shape-only score_vs_attention --numbers-only decision)
for g in attention_error attention_position decision; do ATT_TOL+=(--rtol "$g=$ATT_RTOL" --atol "$g=$ATT_ATOL"); done
# The gate on a study without its e2e step: every threshold of results/thresholds.toml but the /e2e* groups'.
GATE=$OUTDIR/thresholds_no_e2e.toml
python3 - "$ROOT/results/thresholds.toml" "$GATE" <<'PY' || GATE=$ROOT/results/thresholds.toml
import re, sys
parts = re.split(r"(?m)^(?=\[\[threshold\]\])", open(sys.argv[1]).read())
open(sys.argv[2], "w").write("".join(p for p in parts if not re.search(r'(?m)^group = "e2e', p)))
PY
if [ -n "$CLI" ] && [ -n "$REQ" ] && [ -f "$ROOT/data/latents/tiny-mla.h5" ]; then
  say "latentq run --device cuda vs --device cpu (default study, no e2e)"
  if "$CLI" run --no-e2e --input "$ROOT/data/latents/tiny-mla.h5" --device cpu --out "$OUTDIR/study_cpu.h5" >"$OUTDIR/study.log" 2>&1 &&
     "$CLI" run --no-e2e --input "$ROOT/data/latents/tiny-mla.h5" --device cuda --out "$OUTDIR/study_cuda.h5" >>"$OUTDIR/study.log" 2>&1 &&
     "$REQ" "$OUTDIR/study_cpu.h5" "$OUTDIR/study_cuda.h5" "${ATT_TOL[@]}" >>"$OUTDIR/study.log" 2>&1 &&
     "$CLI" regress "$OUTDIR/study_cuda.h5" --thresholds "$GATE" >>"$OUTDIR/study.log" 2>&1; then
    say "study: cuda results equal the cpu results (/attention_error to $ATT_RTOL relative); the threshold gate passes on them"
  else
    STATUS=1; tail -20 "$OUTDIR/study.log"; say "study on the GPU FAILED (log: $OUTDIR/study.log)"
  fi
  rm -f "$OUTDIR/study_cpu.h5" "$OUTDIR/study_cuda.h5"
fi

# ---- the study at DeepSeek-V2-Lite shape: a synthetic dump (2 of the 27 layers, 4 x 2048 tokens, 16
# heads, 256 query rows), the default study without e2e on the GPU and on the CPU, timed and compared ----
if [ -n "$CLI" ] && [ -n "$REQ" ] && [ "${LQ_V2LITE:-1}" != 0 ]; then
  say "V2-Lite-shaped synthetic study (2 layers): latentq run --device cuda vs --device cpu"
  V2=$OUTDIR/v2lite.h5
  if "$CLI" synth --preset deepseek-v2-lite --layers 2 --seqs 4 --seq-len 2048 --query-rows 256 --out "$V2" \
       >"$OUTDIR/v2lite.log" 2>&1; then
    t0=$SECONDS
    "$CLI" run --no-e2e --input "$V2" --device cuda --threads "$JOBS" --out "$OUTDIR/v2lite_cuda.h5" >>"$OUTDIR/v2lite.log" 2>&1
    rc_gpu=$?; t_gpu=$((SECONDS - t0)); t0=$SECONDS
    "$CLI" run --no-e2e --input "$V2" --device cpu --threads "$JOBS" --out "$OUTDIR/v2lite_cpu.h5" >>"$OUTDIR/v2lite.log" 2>&1
    rc_cpu=$?; t_cpu=$((SECONDS - t0))
    if [ $rc_gpu -eq 0 ] && [ $rc_cpu -eq 0 ] &&
       "$REQ" "$OUTDIR/v2lite_cpu.h5" "$OUTDIR/v2lite_cuda.h5" "${ATT_TOL[@]}" >>"$OUTDIR/v2lite.log" 2>&1; then
      say "V2-Lite study: cuda ${t_gpu} s, cpu ${t_cpu} s on $JOBS threads; results equal (/attention_error to $ATT_RTOL)"
    else
      STATUS=1; tail -20 "$OUTDIR/v2lite.log"; say "V2-Lite study FAILED (rc cuda $rc_gpu, cpu $rc_cpu; log: $OUTDIR/v2lite.log)"
    fi
  else
    STATUS=1; tail -5 "$OUTDIR/v2lite.log"; say "latentq synth FAILED (log: $OUTDIR/v2lite.log)"
  fi
  rm -f "$V2" "$OUTDIR/v2lite_cpu.h5" "$OUTDIR/v2lite_cuda.h5"
fi
# ---- `latentq study --model` on a random-init FP8 checkpoint (DeepSeek-V3 architecture, V2-Lite's attention shape,
# 2 layers; python -m latentq.random_checkpoint --fp8), --device cuda (the dump and the cells on the GPU) against
# --device cpu: the path a team with a GPU takes. Without e2e (it needs latentq._core built for this python3).
# The two dumps differ by the GPU's float32 matmul order (reported, bound 1e-4 relative), and a count such as
# scale_underflow_groups may then differ by a few groups; so the GPU study's tables are compared with
# `latentq run --device cpu` on the GPU study's own dump (a study's tables are that run's, bit for bit), with the
# attention tolerances above. LQ_MODEL_STUDY=0 skips; LQ_PYTHON: the interpreter with torch (with CUDA),
# transformers and h5py (default python3).
PY=$(command -v "${LQ_PYTHON:-python3}" || true)
if [ -n "$CLI" ] && [ -n "$REQ" ] && [ "${LQ_MODEL_STUDY:-1}" != 0 ] && [ -n "$PY" ] &&
   "$PY" -c "import torch, transformers, h5py, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  say "latentq study --model (random-init FP8 checkpoint) --device cuda vs --device cpu, no e2e"
  M=$OUTDIR/model_study
  rm -rf "$M"; mkdir -p "$M"
  export LATENTQ_PYTHON=$PY LATENTQ_SOURCE_DIR=$ROOT
  if PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m latentq.random_checkpoint --fp8 --out "$M/ckpt" \
       >"$OUTDIR/model_study.log" 2>&1; then
    rc_m=0
    for dev in cuda cpu; do
      t0=$SECONDS
      "$CLI" study --model "$M/ckpt" --text "$ROOT/README.md" --out "$M/$dev" --device $dev --no-e2e --tokenizer bytes \
        --threads "$JOBS" >>"$OUTDIR/model_study.log" 2>&1 || rc_m=1
      eval "t_$dev=$((SECONDS - t0))"
    done
    if [ $rc_m -eq 0 ] &&
       "$PY" - "$M/cpu/dump.h5" "$M/cuda/dump.h5" >>"$OUTDIR/model_study.log" 2>&1 <<'PY' &&
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
worst = 0.0
for l in a["layers"]:
    for d in ("c_kv", "k_pe", "q_nope", "q_pe", "attn_out"):
        x, y = a["layers"][l][d][()].astype(np.float64), b["layers"][l][d][()].astype(np.float64)
        worst = max(worst, float(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30)))
print(f"dump cuda vs cpu: max rel_fro {worst:.3g} over layers x (c_kv, k_pe, q_nope, q_pe, attn_out)")
sys.exit(0 if worst <= 1e-4 else 1)
PY
       "$CLI" run --no-e2e --input "$M/cuda/dump.h5" --device cpu --threads "$JOBS" --out "$M/cpu_on_cuda_dump.h5" \
         >>"$OUTDIR/model_study.log" 2>&1 &&
       "$REQ" "$M/cpu_on_cuda_dump.h5" "$M/cuda/results.h5" "${ATT_TOL[@]}" >>"$OUTDIR/model_study.log" 2>&1; then
      say "model study: cuda ${t_cuda} s, cpu ${t_cpu} s; $(grep -m1 'dump cuda vs cpu' "$OUTDIR/model_study.log"); the cuda study's tables equal the cpu's on its dump (/attention_error to $ATT_RTOL)"
    else
      STATUS=1; tail -20 "$OUTDIR/model_study.log"; say "model study FAILED (log: $OUTDIR/model_study.log)"
    fi
  else
    STATUS=1; tail -20 "$OUTDIR/model_study.log"; say "random_checkpoint FAILED (log: $OUTDIR/model_study.log)"
  fi
  rm -rf "$M"
elif [ "${LQ_MODEL_STUDY:-1}" != 0 ]; then
  say "model study skipped: ${LQ_PYTHON:-python3} has no torch with CUDA, transformers and h5py"
fi
# ---- benchmarks -------------------------------------------------------------------------------
if [ -n "$BENCH" ] && [ "$BENCH_T" = 0 ] && [ "$FUSED" = 0 ]; then
  say "benchmarks skipped (LQ_BENCH_T=0, LQ_FUSED=0)"
elif [ -n "$BENCH" ]; then
  FILTER="^gpu/.*/T:($BENCH_T)/"
  [ "$FUSED" != 0 ] && FILTER="^gpu/(.*/T:($BENCH_T)/|fused_decode/.*/($FUSED)(/|\$))"
  say "latentq_bench (GPU, T = $BENCH_T, D = 576; verify against the CPU at T·D ≤ 2^28; fused decode: ${FUSED})"
  "$BENCH" --benchmark_filter="$FILTER" --benchmark_min_time=0.2 --lq_verify \
    --lq_verify_max_elems=268435456 --benchmark_out="$OUTDIR/bench.json" --benchmark_out_format=json \
    >"$OUTDIR/bench.log" 2>&1 || { STATUS=1; tail -20 "$OUTDIR/bench.log"; say "latentq_bench FAILED"; }
fi
# ---- the library baseline: the same decode step in PyTorch (cuBLAS bmm, SDPA), where torch has CUDA --------
TORCH_TABLE=""
if [ "$FUSED" != 0 ] && command -v python3 >/dev/null &&
   python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  SHAPES=$(python3 - "$FUSED" <<'PY'
import itertools, re, sys
m = re.fullmatch(r"B:\(?([0-9|]+)\)?/H:\(?([0-9|]+)\)?/L:\(?([0-9|]+)\)?", sys.argv[1])
print(",".join(f"B:{b}/H:{h}/L:{l}" for b, h, l in itertools.product(*(g.split("|") for g in m.groups()))) if m else "")
PY
)
  say "PyTorch decode baseline (bench/decode_torch.py ${SHAPES:-its default shapes})"
  TORCH_TABLE=$(timeout 240 python3 "$ROOT/bench/decode_torch.py" ${SHAPES:+--shapes "$SHAPES"} \
                --out "$OUTDIR/decode_torch.json" 2>&1) || say "decode_torch.py did not finish (its output below)"
fi
say "done in $((SECONDS - T0)) s; files in $OUTDIR"

# ---- the table (last) -------------------------------------------------------------------------
if [ -f "$OUTDIR/bench.json" ] && command -v python3 >/dev/null; then
  python3 - "$OUTDIR/bench.json" <<'PY' || STATUS=1
import json, re, sys
runs = json.load(open(sys.argv[1]))["benchmarks"]
rows, d2d, ident, bad = [], {}, {}, 0
for r in runs:
    m = re.match(r"gpu/(quantize|dequantize)/([^/]+)/T:(\d+)/D:(\d+)", r["name"])
    c = re.match(r"gpu/d2d_copy/T:(\d+)/D:(\d+)", r["name"])
    if r.get("error_occurred"):
        print("ERROR", r["name"], r.get("error_message", "")); bad += 1; continue
    if c: d2d[int(c.group(1))] = r["bytes_per_second"] / 1e9
    if m:
        op, spec, T, D = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
        if "identical" in r: ident[(spec, T)] = r["identical"] >= 1
        rows.append((spec, op, T, D, r["bytes_per_second"] / 1e9, r.get("vs_memcpy", 0.0)))
print("\nGPU quantizer vs device-to-device copy (bytes read + written; target ratio >= 0.85 at >= 64M elements)")
print(f"{'spec':<22} {'op':<10} {'T x D':>14} {'Melem':>6} {'GB/s':>8} {'vs D2D':>7}  identical")
for spec, op, T, D, gbs, ratio in rows:
    i = ident.get((spec, T))
    mark = "-" if i is None else ("yes" if i else "NO")
    bad += i is False
    print(f"{spec:<22} {op:<10} {f'{T}x{D}':>14} {T*D/1e6:6.0f} {gbs:8.0f} {ratio:7.2f}  {mark}")
for T, g in sorted(d2d.items()):
    print(f"{'d2d copy':<22} {'memcpy':<10} {f'{T}x576':>14} {T*576/1e6:6.0f} {g:8.0f} {1.0:7.2f}  -")
met = sum(1 for r in rows if r[2] * r[3] >= 64 << 20 and r[5] >= 0.85)
big = sum(1 for r in rows if r[2] * r[3] >= 64 << 20)
print(f"ratio >= 0.85 in {met} of {big} rows at >= 64M elements; identical: "
      f"{sum(ident.values())} of {len(ident)} verified specs")
fused = []
for r in runs:
    m = re.match(r"gpu/fused_decode/([^/]+)/B:(\d+)/H:(\d+)/L:(\d+)(/|$)", r["name"])
    if m and not r.get("error_occurred"):
        us = r["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[r.get("time_unit", "us")]
        fused.append((m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(r.get("splits", 0)), us,
                      r.get("us_per_token", 0.0), r["bytes_per_second"] / 1e9, r.get("vs_memcpy", 0.0)))
if fused:
    print("\nFused decode-attention, one step of one layer (Dc 512 + Dr 64; cache bytes read per second; vs D2D copy)")
    print(f"{'spec':<24} {'B':>3} {'H':>4} {'L':>7} {'splits':>6} {'us/step':>9} {'us/token':>9} {'GB/s':>7} {'vs D2D':>7}")
    for spec, B, H, L, sp, us, ust, gbs, ratio in fused:
        print(f"{spec:<24} {B:>3} {H:>4} {L:>7} {sp:>6} {us:9.1f} {ust:9.2f} {gbs:7.0f} {ratio:7.2f}")
sys.exit(1 if bad else 0)
PY
elif [ -f "$OUTDIR/bench.log" ]; then
  grep -E "^gpu/" "$OUTDIR/bench.log"
fi
if [ -n "$TORCH_TABLE" ]; then
  printf '\nThe same decode step in PyTorch bf16 (the library baseline; cache GB/s; vs a D2D copy):\n%s\n' "$TORCH_TABLE"
fi
exit $STATUS
