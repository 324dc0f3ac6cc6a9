#!/usr/bin/env bash
# The default study on a DeepSeek-V2-Lite-shaped synthetic dump (27 layers x 4 sequences x 2,048 tokens,
# 16 heads, 256 query rows: the V2-Lite study shape), end to end through `latentq run`, timed with
# /usr/bin/time -v (wall clock and peak RSS).
#
#   bench/study_v2lite.sh stages [THREADS]   the latent, SVD and cross-layer stages only: the embedded
#                                            default config with [attention] off and no [decode_order]
#   bench/study_v2lite.sh full [THREADS]     the whole default study without e2e
#
# THREADS defaults to 2. Environment: BUILD_DIR (default build), WORK (default /tmp/latentq-v2lite: the
# dump, 880 MB, is written there once and reused; the configs and results too).
set -euo pipefail
mode="${1:-}"
threads="${2:-2}"
case "$mode" in stages|full) ;; *) echo "usage: $0 stages|full [THREADS]" >&2; exit 2 ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
work="${WORK:-/tmp/latentq-v2lite}"
mkdir -p "$work"
dump="$work/v2lite.h5"
if [ ! -f "$dump" ]; then
  "$build/latentq" synth --preset deepseek-v2-lite --seqs 4 --seq-len 2048 --query-rows 256 --out "$dump"
fi
config="$work/$mode.toml"
if [ "$mode" = stages ]; then
  # [attention] enabled = false; the [decode_order] section removed (its probe reads the attention data).
  awk '
    /^\[/ { section = $0; skip = (section == "[decode_order]") }
    section == "[attention]" && /^enabled *=/ { print "enabled = false"; next }
    !skip { print }
  ' "$root/study/config/default.toml" > "$config"
else
  cp "$root/study/config/default.toml" "$config"
fi
# The copied config's relative paths point into study/config/: --input and --out override both.
/usr/bin/time -v "$build/latentq" run "$config" --input "$dump" --out "$work/$mode.h5" --no-e2e --threads "$threads" \
  > "$work/$mode.log" 2> "$work/$mode.time"
grep -E "Elapsed \(wall clock\)|Maximum resident set size" "$work/$mode.time"
echo "results: $work/$mode.h5; log: $work/$mode.log"
