#!/bin/sh
# ctest `study.standin_study`: scripts/standin_study.sh (the default study on the calibrated V2-Lite
# stand-in, without e2e), the same study on the shipped tiny-mla dump without e2e when it is present, then
# `python -m latentq.report.findings --check`: every verdict computed on each source (exit 1 naming an
# n/a one). Skipped (77) when the project Python lacks h5py or pandas.
#   standin_study.sh LATENTQ SOURCE_DIR OUT_DIR PYTHON
set -eu
LATENTQ=$1
SRC=$2
OUT=$3
PY=$4
if ! "$PY" -c "import h5py, pandas" 2>/dev/null; then
  echo "SKIP: $PY lacks h5py or pandas"
  exit 77
fi
mkdir -p "$OUT"
LATENTQ="$LATENTQ" THREADS=2 sh "$SRC/scripts/standin_study.sh" "$OUT" >"$OUT/standin.log"
tail -n 3 "$OUT/standin.log"
set -- "$OUT/standin.h5"
labels="V2-Lite stand-in"
if [ -f "$SRC/data/latents/tiny-mla.h5" ]; then
  "$LATENTQ" run --no-e2e --threads 2 --out "$OUT/tiny.h5" >"$OUT/tiny.log"
  set -- "$OUT/tiny.h5" "$@"
  labels="tiny-mla,$labels"
fi
PYTHONPATH="$SRC/python" "$PY" -m latentq.report.findings "$@" --labels "$labels" --check
