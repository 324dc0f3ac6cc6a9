#!/usr/bin/env bash
# latentq set-up for a fresh Debian 12 machine, as root. Installs what is missing, then:
#   scripts/setup.sh run    configure + build, then `build/latentq run` (the embedded default study)
#   scripts/setup.sh test   configure + build (CUDA kernels too when nvcc is found), then every test (ctest,
#                           which also runs the Python tests, the default study and the threshold gate)
# Environment: BUILD_DIR (default build), JOBS (default nproc), LATENTQ_CMAKE_ARGS (extra cmake arguments).
# Both modes write the venv's latentq.pth (<root>/python and <root>/<build>/python), so `import latentq`
# works in .venv/bin/python.
set -euo pipefail
mode="${1:-}"
case "$mode" in run|test) ;; *) echo "usage: $0 run|test" >&2; exit 2 ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-build}"
jobs="${JOBS:-$(nproc)}"

# --- Debian packages (C++ dependencies, the KJV text, Python venv support) -------------------
pkgs=(build-essential cmake ninja-build pkg-config git
      libhdf5-dev libeigen3-dev libgtest-dev libbenchmark-dev libcli11-dev libtomlplusplus-dev
      nlohmann-json3-dev libfmt-dev pybind11-dev libssl-dev libopenblas-pthread-dev
      bible-kjv bible-kjv-text python3 python3-venv python3-dev)
# the test command also starts a one-node Slurm cluster (tests/slurm/run_slurm_test.sh)
[ "$mode" = test ] && pkgs+=(slurm-wlm munge)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- the project venv: torch first, pinned (a CPU build; unpinned pulls a multi-GB CUDA build) ---
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import torch, transformers, safetensors, accelerate, h5py, numpy, matplotlib, pandas, pytest, ml_dtypes, gguf, torchao" 2>/dev/null; then
  echo "setup: creating the Python venv in .venv"
  python3 -m venv .venv
  if ! { .venv/bin/pip install --disable-pip-version-check torch==2.13.0 &&
         .venv/bin/pip install --disable-pip-version-check -r requirements.txt; } > .venv/pip.log 2>&1; then
    tail -n 30 .venv/pip.log >&2
    echo "setup: pip failed; the whole log is in .venv/pip.log" >&2
    exit 1
  fi
fi

# --- the latentq package on the venv's path: <root>/python (the Python modules) and <build>/python (where
# the build puts the compiled latentq._core), so `import latentq` works in the venv without path edits ---
case "$build" in /*) build_abs="$build" ;; *) build_abs="$root/$build" ;; esac
site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
printf '%s\n' "$root/python" "$build_abs/python" > "$site/latentq.pth"

# --- cuBLAS for the attention on the GPU, when nvcc is here but its CUDA 13 toolkit has no cuBLAS: NVIDIA's
# wheel into the venv, pinned to CUDA 13.0's cuBLAS (CMakeLists.txt finds it there; without it the kernels
# still build and `--device cuda` keeps the attention probes on the CPU) ---------------------------------
nvcc_bin=$(command -v nvcc || true)
[ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc_bin=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc_bin" ] && "$nvcc_bin" --version | grep -q 'release 13\.' &&
   ! ls "$(dirname "$(readlink -f "$nvcc_bin")")"/../lib64/libcublas.so* >/dev/null 2>&1 &&
   ! ls .venv/lib/python3*/site-packages/nvidia/cu13/lib/libcublas.so.13 >/dev/null 2>&1; then
  echo "setup: installing cuBLAS (nvidia-cublas) into .venv for the CUDA build"
  .venv/bin/pip install --disable-pip-version-check nvidia-cublas==13.0.0.19 >> .venv/pip.log 2>&1 ||
    echo "setup: nvidia-cublas did not install (.venv/pip.log): the attention probes stay on the CPU under --device cuda" >&2
fi

# --- configure + build -----------------------------------------------------------------------
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DLATENTQ_PYTHON_EXECUTABLE="$root/.venv/bin/python" ${LATENTQ_CMAKE_ARGS:-}
fi
cmake --build "$build" -j "$jobs"

if [ "$mode" = run ]; then
  exec "$build/latentq" run
else
  cd "$build"
  set +e
  ctest --output-on-failure -j "$jobs" 2>&1 | tee ctest.log
  rc=${PIPESTATUS[0]}
  # ctest lists the skipped tests (GPU tests without a GPU) after its summary: end on the summary.
  grep -E "tests passed|tests failed" ctest.log | tail -n 1
  exit "$rc"
fi
