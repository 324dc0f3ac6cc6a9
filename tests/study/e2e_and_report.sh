#!/bin/sh
# ctest `study.e2e_and_report`: `latentq run` on the shipped tiny-mla dump with [e2e] enabled
# (tests/study/data/e2e_study.toml, two quantizers): python -m latentq.e2e appends /e2e and
# keeps the other groups, the e2e table is printed; the same study as 3 shards + `latentq merge` (which
# runs the e2e step; `merge --no-e2e` does not) equals it, /e2e included (the groups computed from the model's
# logits within rtol 1e-4, atol 1e-7: compare_results.py --logits-tol); then `latentq report`
# writes report.md.
# Skipped (exit 77) without the dump, the project venv, or the compiled latentq Python module.
#   e2e_and_report.sh LATENTQ SOURCE_DIR OUT_DIR PYTHON
set -eu
LATENTQ=$1
SRC=$2
OUT=$3
PY=$4
DUMP="$SRC/data/latents/tiny-mla.h5"
if [ ! -f "$DUMP" ]; then echo "SKIP: $DUMP is missing"; exit 77; fi
if [ ! -x "$PY" ]; then echo "SKIP: no project Python at $PY"; exit 77; fi
rm -rf "$OUT"
mkdir -p "$OUT"
"$LATENTQ" run "$SRC/tests/study/data/e2e_study.toml" --input "$DUMP" --out "$OUT/e2e.h5" --threads 2 >"$OUT/run.log"
cat "$OUT/run.log"
if grep -q "^e2e: skipped: " "$OUT/run.log"; then echo "SKIP: the e2e step was skipped"; exit 77; fi
grep -q "^End to end" "$OUT/run.log"
grep -q "^int4-asym-channel-g32 " "$OUT/run.log"
"$PY" - "$OUT/e2e.h5" <<'PYEOF'
import sys
import h5py
with h5py.File(sys.argv[1], "r") as f:
    groups = list(f.keys())
    for g in ("latent_error", "summary", "svd", "svd_spectrum", "cross_layer", "cross_layer_sharing",
              "attention_check", "attention_error", "e2e"):
        assert g in groups, (g, groups)
    q = list(f["e2e"]["quantizer"].asstr()[:])
    assert q == ["int4-asym-channel-g32", "bf16"], q
    kl = f["e2e"]["kl_mean"][:]
    assert 0 <= kl[1] < kl[0], kl  # bf16 perturbs the logits less than int4
    assert len(f["attention_error"]["layer"]) == 6 * (2 + 2), len(f["attention_error"]["layer"])
print("ok: /e2e", q, "and the other groups kept")
PYEOF
# Sharded: the shards skip the e2e step, the merge runs it; every group equals the unsharded run.
for i in 0 1 2; do
  "$LATENTQ" run "$SRC/tests/study/data/e2e_study.toml" --input "$DUMP" --shard "$i/3" \
    --out "$OUT/shards/s$i.h5" --threads 2 >"$OUT/shard$i.log"
  grep -q '^e2e: skipped: a shard; `latentq merge` runs it on the merged file' "$OUT/shard$i.log"
done
"$LATENTQ" merge "$OUT/merged.h5" "$OUT/shards/s0.h5" "$OUT/shards/s1.h5" "$OUT/shards/s2.h5" --threads 2 \
  >"$OUT/merge.log"
cat "$OUT/merge.log"
grep -q "^End to end" "$OUT/merge.log"
"$PY" "$SRC/tests/slurm/compare_results.py" "$OUT/e2e.h5" "$OUT/merged.h5" --logits-tol 1e-4:1e-7
"$LATENTQ" merge "$OUT/merged_no_e2e.h5" "$OUT/shards/s0.h5" "$OUT/shards/s1.h5" "$OUT/shards/s2.h5" --no-e2e \
  >"$OUT/merge_no_e2e.log"
if grep -q -e "^e2e:" -e "^End to end" "$OUT/merge_no_e2e.log"; then echo "FAIL: merge --no-e2e ran the e2e step"; exit 1; fi
"$PY" - "$OUT/merged_no_e2e.h5" <<'PYEOF'
import sys
import h5py
with h5py.File(sys.argv[1], "r") as f:
    assert "e2e" not in f and "attention_error" in f, list(f)
print("ok: merge --no-e2e wrote no /e2e")
PYEOF
"$LATENTQ" report "$OUT/e2e.h5" --out "$OUT/report"
test -s "$OUT/report/report.md"
echo "ok: report.md written"
