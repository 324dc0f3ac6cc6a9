#!/bin/sh
# ctest `study.default_study_and_gate`: the embedded default study on the shipped dump (the
# probes and the e2e step run too: OUT_DIR/default_study.h5 is the unsharded reference of ctest
# study.default_study_sharded), then the regression gate with results/thresholds.toml.
# Skipped (exit 77) without the dump.
#   default_study_and_gate.sh LATENTQ SOURCE_DIR OUT_DIR
set -eu
LATENTQ=$1
SRC=$2
OUT=$3
DUMP="$SRC/data/latents/tiny-mla.h5"
if [ ! -f "$DUMP" ]; then
  echo "SKIP: $DUMP is missing: produce it with python -m latentq.dump (see data/README.md)"
  exit 77
fi
mkdir -p "$OUT"
"$LATENTQ" run --out "$OUT/default_study.h5" --threads 2
"$LATENTQ" regress "$OUT/default_study.h5" --thresholds "$SRC/results/thresholds.toml"
