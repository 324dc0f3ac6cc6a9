#!/bin/sh
# The stand-in study: the embedded default study (study/config/default.toml: the same quantizers, probes
# and attention scope as on tiny-mla) on the calibrated DeepSeek-V2-Lite stand-in, without e2e (there is
# no model to run). The dump is the calibration's (docs/latents.md, "The calibrated stand-in": 4 layers x
# 4 sequences x 1,024 tokens, seed 0) with 128 query rows per layer for the attention probes.
#   scripts/standin_study.sh [OUT_DIR]     writes OUT_DIR/standin_dump.h5 and OUT_DIR/standin.h5
#                                          (default OUT_DIR: results/)
# Then the findings side by side (docs/findings.md):
#   build/latentq run --no-e2e --out results/tiny_no_e2e.h5
#   .venv/bin/python -m latentq.report.findings results/tiny_no_e2e.h5 results/standin.h5 \
#     --labels "tiny-mla,V2-Lite stand-in"
# Environment: LATENTQ (default build/latentq), THREADS (default 2). Exit codes: latentq's (2: input error).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
lq=${LATENTQ:-$root/build/latentq}
out=${1:-$root/results}
mkdir -p "$out"
"$lq" synth --preset deepseek-v2-lite --layers 4 --seqs 4 --seq-len 1024 --query-rows 128 --seed 0 \
  --out "$out/standin_dump.h5"
"$lq" run --input "$out/standin_dump.h5" --out "$out/standin.h5" --threads "${THREADS:-2}" --no-e2e
