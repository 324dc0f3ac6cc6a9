#!/bin/bash
# ctest `study.batch_cli`: batch runs of the latentq binary as processes.
#   batch_cli_test.sh LATENTQ LQ_SYNTH_DUMP LQ_RESULTS_EQUAL CONFIG WORKDIR [SOURCE_DIR]
#
#  1. an unsharded reference run of CONFIG on a synthetic dump;
#  2. --shard 0/3, 1/3, 2/3 and `latentq merge` (shards given in shard order and reversed): equal
#     to the reference, group for group and row for row (lq_results_equal: same row order, floats
#     bit for bit);
#  3. LATENTQ_TEST_KILL_AFTER_CELLS=N: the process SIGKILLs itself after N cells (exit 137), leaving
#     OUT.partial and no OUT; `--resume` completes it, equal to the reference; a resume killed
#     again, then resumed; a killed shard resumed and merged;
#  4. with SOURCE_DIR and its data/latents/tiny-mla.h5: the small real study
#     tests/slurm/slurm_study.toml (latent error and every probe group on 2 layers) killed from
#     outside (kill -9) at several moments, each resumed and compared with an uninterrupted run;
#  5. refusals (exit 2, nothing written): merge with a missing shard, shards of two configs, a
#     resume with an edited config (both config hashes shown); regress of a shard and of a
#     checkpoint; merge into one of its inputs, an input given twice;
#  6. LATENTQ_TEST_RAISE_IN_WRITE=SIG (SIGTERM, SIGINT raised after the temporary file is written,
#     before the rename): the process dies of the signal and leaves no file at all.
set -uo pipefail
[[ $# -ge 5 ]] || { echo "usage: $0 LATENTQ LQ_SYNTH_DUMP LQ_RESULTS_EQUAL CONFIG WORKDIR [SOURCE_DIR]" >&2; exit 2; }
lq=$1 synth=$2 equal=$3 config=$4 work=$5 src=${6:-}

fail() { echo "FAIL: $*"; exit 1; }
step() { echo "== $*"; }
rm -rf -- "$work"
mkdir -p "$work"
cd "$work" || exit 1

"$synth" dump.h5 >/dev/null || fail "lq_synth_dump"
run() { "$lq" run "$config" --input dump.h5 "$@"; }

step "reference"
run --out ref.h5 >ref.log || fail "reference run"

step "3 shards + merge"
for i in 0 1 2; do
  run --shard "$i/3" --out "shards/shard_000$i.h5" >"shard$i.log" || fail "shard $i/3"
  grep -q "shard $i/3: " "shard$i.log" || fail "shard $i/3 did not say so: $(cat "shard$i.log")"
done
"$lq" merge merged.h5 shards/shard_0000.h5 shards/shard_0001.h5 shards/shard_0002.h5 >merge.log || fail "merge"
"$equal" ref.h5 merged.h5 || fail "merged != reference"
"$lq" merge merged_rev.h5 shards/shard_0002.h5 shards/shard_0001.h5 shards/shard_0000.h5 >/dev/null || fail "merge (reversed)"
"$equal" ref.h5 merged_rev.h5 || fail "merged (reversed order) != reference"

step "kill after 5 cells, resume"
LATENTQ_TEST_KILL_AFTER_CELLS=5 run --out k.h5 --threads 1 >/dev/null 2>k.err
rc=$?
[[ $rc -eq 137 ]] || fail "expected exit 137 (SIGKILL), got $rc: $(cat k.err)"
[[ ! -e k.h5 && -f k.h5.partial ]] || fail "expected k.h5.partial and no k.h5 after the kill: $(ls -a)"
run --out k.h5 --resume >k.log || fail "resume"
grep -q "5 resumed from $work/k.h5.partial" k.log || fail "resume did not take 5 cells: $(cat k.log)"
[[ ! -e k.h5.partial ]] || fail "k.h5.partial left after the resumed run completed"
"$equal" ref.h5 k.h5 || fail "resumed != reference"

step "kill, resume killed again, resume"
LATENTQ_TEST_KILL_AFTER_CELLS=3 run --out kk.h5 --threads 2 >/dev/null 2>&1
[[ $? -eq 137 ]] || fail "first kill"
LATENTQ_TEST_KILL_AFTER_CELLS=4 run --out kk.h5 --resume --threads 1 >/dev/null 2>&1
[[ $? -eq 137 ]] || fail "second kill"
run --out kk.h5 --resume >/dev/null || fail "final resume"
"$equal" ref.h5 kk.h5 || fail "twice resumed != reference"

step "killed shard resumed, merged"
LATENTQ_TEST_KILL_AFTER_CELLS=2 run --shard 1/3 --out ks/shard_0001.h5 --threads 1 >/dev/null 2>&1
[[ $? -eq 137 ]] || fail "shard kill"
"$lq" merge ks_merged.h5 shards/shard_0000.h5 ks/shard_0001.h5.partial shards/shard_0002.h5 >/dev/null 2>ks.err
[[ $? -eq 2 ]] && grep -q "incomplete shard 1/3" ks.err || fail "merge of a checkpoint not refused: $(cat ks.err)"
run --shard 1/3 --out ks/shard_0001.h5 --resume >/dev/null || fail "shard resume"
"$lq" merge ks_merged.h5 shards/shard_0000.h5 ks/shard_0001.h5 shards/shard_0002.h5 >/dev/null || fail "merge"
"$equal" ref.h5 ks_merged.h5 || fail "merge with a resumed shard != reference"

if [[ -n $src && -f $src/data/latents/tiny-mla.h5 ]]; then
  step "tests/slurm/slurm_study.toml on tiny-mla: kill -9 from outside at several moments, resume"
  real=$src/tests/slurm/slurm_study.toml
  # --no-e2e: the kill -9 moments are about the cells (the e2e step of this config: the Slurm test)
  "$lq" run "$real" --out dref.h5 --threads 1 --no-e2e >/dev/null || fail "reference of $real"
  for delay in 0.1 0.25 0.4 0.55; do
    rm -f d.h5 d.h5.partial
    "$lq" run "$real" --out d.h5 --threads 1 --no-e2e >/dev/null 2>&1 &
    pid=$!
    sleep "$delay"
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    cells=$( [[ -f d.h5.partial ]] && echo partial || echo none)
    [[ -f d.h5 ]] && cells=complete
    "$lq" run "$real" --out d.h5 --resume --threads 2 --no-e2e >d.log || fail "resume after kill -9 at ${delay} s"
    "$equal" dref.h5 d.h5 >/dev/null || fail "resumed after kill -9 at ${delay} s != reference"
    echo "   kill -9 at ${delay} s (state: $cells): $(grep -o '[0-9]* resumed from [^,]*, [0-9]* computed' d.log || echo 'nothing resumed'): equal"
  done
else
  echo "(skipping the kill -9 part: no SOURCE_DIR/data/latents/tiny-mla.h5)"
fi

step "refusals"
"$lq" merge miss.h5 shards/shard_0000.h5 shards/shard_0002.h5 >/dev/null 2>miss.err
[[ $? -eq 2 ]] || fail "merge with a missing shard did not exit 2"
grep -q "1 of 3 shards missing: shard 1" miss.err || fail "missing shard message: $(cat miss.err)"
[[ ! -e miss.h5 ]] || fail "merge wrote miss.h5"
{ cat "$config"; echo "# edited"; } >edited.toml
"$lq" run edited.toml --input dump.h5 --shard 1/3 --out other/shard_0001.h5 >/dev/null || fail "edited shard"
"$lq" merge mix.h5 shards/shard_0000.h5 other/shard_0001.h5 shards/shard_0002.h5 >/dev/null 2>mix.err
[[ $? -eq 2 ]] && grep -q "different configs (config sha256 [0-9a-f]\{64\} vs [0-9a-f]\{64\})" mix.err ||
  fail "merge of two configs not refused with both hashes: $(cat mix.err)"
[[ ! -e mix.h5 ]] || fail "merge wrote mix.h5"
"$lq" run edited.toml --input dump.h5 --out ref.h5 --resume >/dev/null 2>res.err
[[ $? -eq 2 ]] && grep -q "another config (config sha256 [0-9a-f]\{64\} in the file, [0-9a-f]\{64\} now)" res.err ||
  fail "resume with an edited config not refused with both hashes: $(cat res.err)"
"$equal" ref.h5 merged.h5 >/dev/null || fail "the refused resume changed ref.h5"
step "regress refuses a shard and a checkpoint"
printf '[[threshold]]\nquantizer = "bf16"\ntarget = "c_kv"\nmetric = "rel_fro"\nbound = 1\n' >gate.toml
"$lq" regress ref.h5 --thresholds gate.toml >/dev/null || fail "regress of the complete reference"
"$lq" regress shards/shard_0001.h5 --thresholds gate.toml >/dev/null 2>rs.err
[[ $? -eq 2 ]] && grep -q "shards/shard_0001.h5: is shard 1/3 (root attribute shard_count = 3)" rs.err ||
  fail "regress of a shard not refused: $(cat rs.err)"
LATENTQ_TEST_KILL_AFTER_CELLS=2 run --out kp.h5 --threads 1 >/dev/null 2>&1
[[ $? -eq 137 && -f kp.h5.partial ]] || fail "kill for the checkpoint"
"$lq" regress kp.h5.partial --thresholds gate.toml >/dev/null 2>rp.err
[[ $? -eq 2 ]] && grep -q "kp.h5.partial: is an incomplete run (root attribute complete = 0" rp.err ||
  fail "regress of a checkpoint not refused: $(cat rp.err)"

step "merge refuses OUT among the inputs and an input given twice"
cp shards/shard_0000.h5 s0.h5
"$lq" merge s0.h5 s0.h5 shards/shard_0001.h5 shards/shard_0002.h5 >/dev/null 2>mo.err
[[ $? -eq 2 ]] && grep -q "the output s0.h5 is also input 1" mo.err || fail "merge into an input not refused: $(cat mo.err)"
cmp -s s0.h5 shards/shard_0000.h5 || fail "the refused merge changed s0.h5"
"$lq" merge twice.h5 shards/shard_0000.h5 shards/shard_0001.h5 shards/../shards/shard_0000.h5 shards/shard_0002.h5 \
  >/dev/null 2>mt.err
[[ $? -eq 2 ]] && grep -qF "inputs 1 (shards/shard_0000.h5) and 3 (shards/../shards/shard_0000.h5) are the same file" mt.err || fail "an input given twice not refused: $(cat mt.err)"
[[ ! -e twice.h5 ]] || fail "merge wrote twice.h5"

step "SIGTERM / SIGINT while a file is written leave no temporary file"
for sig in 15 2; do
  mkdir -p "sig$sig"
  LATENTQ_TEST_RAISE_IN_WRITE=$sig run --out "sig$sig/s.h5" --threads 1 >/dev/null 2>&1
  rc=$?
  [[ $rc -eq $((128 + sig)) ]] || fail "signal $sig in a write: exit $rc, expected $((128 + sig))"
  left=$(ls -A "sig$sig")
  [[ -z $left ]] || fail "signal $sig in a write left: $left"
done

echo "PASS"
