#!/bin/sh
# ctest `study.default_study_sharded`: the embedded default study run as 3
# shards + `latentq merge` has every group of the unsharded run (OUT_DIR/default_study.h5, written by
# ctest study.default_study_and_gate), /e2e included: the shards never run the e2e step, the
# merge runs it on the merged file (--e2e all, as the reference). Compared with tests/slurm/compare_results.py: every group exactly,
# but those computed from the model's logits within rtol 1e-4, atol 1e-7 (compare_results.py --logits-tol: the two
# e2e steps run in other ctest processes, and torch's float32 GEMMs may split their sums otherwise). Skipped (77)
# without the dump, the reference or Python.
#   default_study_sharded.sh LATENTQ SOURCE_DIR OUT_DIR PYTHON
set -eu
LATENTQ=$1
SRC=$2
OUT=$3
PY=$4
REF="$OUT/default_study.h5"
if [ ! -f "$SRC/data/latents/tiny-mla.h5" ]; then echo "SKIP: the shipped dump is missing"; exit 77; fi
if [ ! -f "$REF" ]; then echo "SKIP: no unsharded reference $REF (ctest study.default_study_and_gate)"; exit 77; fi
if [ ! -x "$PY" ]; then echo "SKIP: no project Python at $PY"; exit 77; fi
rm -rf "$OUT/sharded"
mkdir -p "$OUT/sharded"
for i in 0 1 2; do
  "$LATENTQ" run --shard "$i/3" --out "$OUT/sharded/shard_$i.h5" --threads 2 >"$OUT/sharded/shard_$i.log"
  grep -q '^e2e: skipped: a shard; `latentq merge` runs it on the merged file' "$OUT/sharded/shard_$i.log"
done
"$LATENTQ" merge "$OUT/sharded/merged.h5" "$OUT/sharded/shard_0.h5" "$OUT/sharded/shard_1.h5" \
  "$OUT/sharded/shard_2.h5" --threads 2 --e2e all >"$OUT/sharded/merge.log"
cat "$OUT/sharded/merge.log"
if grep -q '^e2e: skipped: ' "$OUT/sharded/merge.log"; then
  echo "note: the e2e step was skipped (above); the reference has no /e2e either"
else
  grep -q '^End to end' "$OUT/sharded/merge.log"
fi
"$PY" - "$REF" "$OUT/sharded/merged.h5" <<'PYEOF'
import sys
import h5py
groups = []
for path in sys.argv[1:]:
    with h5py.File(path, "r") as f:
        groups.append(sorted(f))
assert groups[0] == groups[1], f"groups differ: {groups[0]} (unsharded) vs {groups[1]} (merged)"
print("the same groups:", ", ".join(groups[0]))
PYEOF
"$PY" "$SRC/tests/slurm/compare_results.py" "$REF" "$OUT/sharded/merged.h5" --logits-tol 1e-4:1e-7
