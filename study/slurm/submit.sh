#!/bin/bash
# submit.sh — run a latentq study on a Slurm cluster: a job array of N shards, then a merge job.
#
# Usage:  study/slurm/submit.sh CONFIG OUTDIR N [sbatch args...] [-- latentq run args...]
#
#   1. sbatch --parsable --array=0-(N-1) latentq_array.sbatch CONFIG OUTDIR [run args]
#        task i runs  $LATENTQ_BIN run CONFIG --shard i/N --out OUTDIR/shards/shard_<i, 4 digits>.h5 [run args]
#   2. sbatch --parsable --dependency=afterok:<array job id> --kill-on-invalid-dep=yes \
#             latentq_merge.sbatch MERGED OUTDIR N
#        runs  $LATENTQ_BIN merge MERGED OUTDIR/shards/shard_0000.h5 ... shard_<N-1>.h5, which also runs
#        the e2e step on MERGED when the config has [e2e] enabled (as an unsharded `latentq run`)
#      It starts only when every array task exited 0; if one fails, Slurm cancels it
#      (--kill-on-invalid-dep) instead of leaving it pending forever.
# Prints "array_job_id=<id>" and "merge_job_id=<id>" on stdout (everything else goes to stderr).
# Job logs: OUTDIR/logs/shard_<i>.out and OUTDIR/logs/merge.out.
#
# Arguments:
#   CONFIG   study config (TOML); must exist
#   OUTDIR   output directory (created); the jobs write OUTDIR/shards/, OUTDIR/logs/ and MERGED
#   N        number of shards (array tasks), >= 1
#   sbatch args   given to BOTH jobs, after the defaults here (so they override them): partition,
#                 account, QoS, time limit, ...
#   -- run args   appended to `latentq run` in every array task, e.g. -- --device cuda
# Environment:
#   LATENTQ_BIN                the latentq binary (default: build/latentq in this repository);
#                              made absolute and exported to the jobs
#   LATENTQ_MERGED             the merged results file (default: OUTDIR/<config name without .toml>.h5)
#   LATENTQ_ARRAY_SBATCH_ARGS  extra sbatch args for the array only (word-split), e.g. "--gres=gpu:1"
#   LATENTQ_MERGE_SBATCH_ARGS  extra sbatch args for the merge job only (word-split)
#   LATENTQ_MAX_RUNNING        run at most this many array tasks at once (sbatch --array=0-(N-1)%K)
#   SBATCH                     the sbatch command (default: sbatch); SLURM_CONF etc. pass through
#
# Examples:
#   # a workstation-sized cluster, CPU only, 8 shards
#   study/slurm/submit.sh study/config/default.toml results/default 8
#
#   # a real GPU cluster: one GPU per shard, merge on a CPU partition
#   LATENTQ_ARRAY_SBATCH_ARGS="--partition=gpu --gres=gpu:1 --cpus-per-task=4 --mem=32G" \
#   LATENTQ_MERGE_SBATCH_ARGS="--partition=cpu --mem=8G" \
#   study/slurm/submit.sh study.toml /scratch/$USER/study 16 --account=myproj --time=02:00:00 \
#       -- --device cuda
#
#   # at most 4 shards running at once (--array=0-15%4)
#   LATENTQ_MAX_RUNNING=4 study/slurm/submit.sh study.toml out/study 16
#
# If some array tasks fail, the merge job is cancelled; resubmit only those tasks and a new merge:
#   LATENTQ_BIN=... LATENTQ_SHARDS=16 sbatch --array=3,7 --output=OUTDIR/logs/shard_%a.out \
#       study/slurm/latentq_array.sbatch CONFIG OUTDIR        (prints JOBID)
#   LATENTQ_BIN=... sbatch --dependency=afterok:JOBID study/slurm/latentq_merge.sbatch MERGED OUTDIR 16
#
# Exit status: 0 when both jobs were queued; 2 for bad arguments or a missing file; otherwise the
# failing sbatch's status (if the merge job cannot be queued, the array is cancelled again).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

usage() { sed -n 's/^# Usage: */usage: /p' "${BASH_SOURCE[0]}" >&2; }
die() { echo "submit.sh: $*" >&2; exit 2; }

if [[ $# -lt 3 ]]; then usage; exit 2; fi
config=$1 outdir=$2 n=$3
shift 3
sbatch_args=()
run_args=()
while [[ $# -gt 0 ]]; do
  if [[ $1 == -- ]]; then shift; run_args=("$@"); break; fi
  sbatch_args+=("$1"); shift
done

[[ $n =~ ^[1-9][0-9]*$ ]] || die "N '$n' is not a positive integer"
[[ -f $config ]] || die "config '$config' does not exist"
config=$(realpath -e -- "$config")
outdir=$(realpath -m -- "$outdir")
bin=${LATENTQ_BIN:-$repo/build/latentq}
bin=$(realpath -m -- "$bin")
[[ -x $bin ]] || die "latentq binary '$bin' is missing or not executable (set LATENTQ_BIN)"
name=$(basename -- "$config"); name=${name%.toml}
merged=$(realpath -m -- "${LATENTQ_MERGED:-$outdir/$name.h5}")
sbatch_cmd=${SBATCH:-sbatch}
command -v "$sbatch_cmd" >/dev/null || die "'$sbatch_cmd' not found: is this a Slurm login node?"

mkdir -p "$outdir/shards" "$outdir/logs" "$(dirname -- "$merged")"
export LATENTQ_BIN=$bin
unset LATENTQ_SHARDS   # the array derives N from SLURM_ARRAY_TASK_COUNT

# shellcheck disable=SC2206  # word splitting of the *_SBATCH_ARGS variables is intended
array_extra=(${LATENTQ_ARRAY_SBATCH_ARGS:-})
# shellcheck disable=SC2206
merge_extra=(${LATENTQ_MERGE_SBATCH_ARGS:-})

# --parsable prints "jobid" or "jobid;cluster".
jobid() { local out; out=$("$@") || return $?; printf '%s\n' "${out%%;*}"; }

array_spec="0-$((n - 1))"
if [[ -n ${LATENTQ_MAX_RUNNING:-} ]]; then
  [[ $LATENTQ_MAX_RUNNING =~ ^[1-9][0-9]*$ ]] || die "LATENTQ_MAX_RUNNING '$LATENTQ_MAX_RUNNING' is not a positive integer"
  array_spec+="%$LATENTQ_MAX_RUNNING"
fi

array_id=$(jobid "$sbatch_cmd" --parsable --array="$array_spec" \
  --job-name="latentq-$name" --output="$outdir/logs/shard_%a.out" --chdir="$outdir" \
  "${sbatch_args[@]}" "${array_extra[@]}" \
  "$here/latentq_array.sbatch" "$config" "$outdir" "${run_args[@]}") || {
  rc=$?; echo "submit.sh: submitting the array failed (sbatch exit $rc)" >&2; exit "$rc"; }
[[ $array_id =~ ^[0-9]+$ ]] || die "sbatch printed '$array_id' instead of a job id"

merge_id=$(jobid "$sbatch_cmd" --parsable --dependency="afterok:$array_id" --kill-on-invalid-dep=yes \
  --job-name="latentq-$name-merge" --output="$outdir/logs/merge.out" --chdir="$outdir" \
  "${sbatch_args[@]}" "${merge_extra[@]}" \
  "$here/latentq_merge.sbatch" "$merged" "$outdir" "$n") || {
  rc=$?
  echo "submit.sh: submitting the merge job failed (sbatch exit $rc); cancelling array job $array_id" >&2
  scancel "$array_id" || true
  exit "$rc"; }

echo "submit.sh: ${n} shards of ${config} -> ${merged} (logs in ${outdir}/logs)" >&2
echo "array_job_id=$array_id"
echo "merge_job_id=$merge_id"
