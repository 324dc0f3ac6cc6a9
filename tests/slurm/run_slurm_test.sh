#!/bin/bash
# run_slurm_test.sh — end-to-end test of study/slurm/ on a real one-node Slurm cluster.
#
# Usage:  tests/slurm/run_slurm_test.sh BUILD_DIR CONFIG
#   BUILD_DIR  build tree holding the latentq binary (BUILD_DIR/latentq or BUILD_DIR/study/latentq);
#              LATENTQ_BIN, if set, names the binary instead
#   CONFIG     a small study config (TOML) that `latentq run` can run in seconds
#
# What it does (as root, without systemd; everything lives in a fresh temp dir, loopback only):
#   1. installs Debian's slurm-wlm and munge if a daemon or client is missing (apt-get; set
#      LATENTQ_SLURM_INSTALL=0 to skip instead);
#   2. starts munged (own key and socket), slurmctld and slurmd in the foreground in the background,
#      with a minimal slurm.conf (one node "lqnode" = this machine at 127.0.0.1, partition debug,
#      proctrack/linuxproc, task/none, select/cons_tres, no accounting, free ports), each under
#      `timeout` so that they die even if this script is killed;
#   3. waits for the node to be idle (sinfo), submits the study with study/slurm/submit.sh
#      (N = LATENTQ_SLURM_SHARDS array tasks, default 3, then the merge job with afterok), and
#      meanwhile runs the unsharded reference `latentq run CONFIG --out ref.h5` directly;
#   4. waits until squeue is empty, checks that every array task and the merge job COMPLETED with
#      exit code 0 (scontrol, jobcomp/filetxt log), that the merged file has /e2e when the config
#      enables the e2e step (the merge job runs it; shards never do), and compares the merged file with
#      the reference using tests/slurm/compare_results.py (the project venv's python with h5py; the groups
#      computed from the model's logits within rtol 1e-4, atol 1e-7 (--logits-tol), every other group exactly);
#   5. always tears down: scancel, stop slurmd, slurmctld, munged, remove the temp dir
#      (LATENTQ_SLURM_KEEP=1 keeps it).
# Exit status: 0 pass; 1 fail (a job failed, the results differ, a timeout once the cluster ran);
# 2 usage error; 77 skipped because Slurm cannot be installed or started here (the reason and the
# daemon log tail are printed). Total time is bounded by LATENTQ_SLURM_TIMEOUT (default 150 s).
#
# Environment: LATENTQ_BIN, LATENTQ_PYTHON (default: <repo>/.venv/bin/python),
#              LATENTQ_SLURM_SHARDS (3), LATENTQ_SLURM_TIMEOUT (150), LATENTQ_SLURM_INSTALL (1),
#              LATENTQ_SLURM_KEEP (0), LATENTQ_SLURM_RUN_ARGS (extra `latentq run` args, word-split).
set -uo pipefail

SKIP=77
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
t0=$SECONDS

log() { printf '[slurm-test %3ds] %s\n' "$((SECONDS - t0))" "$*"; }
usage() { echo "usage: $0 BUILD_DIR CONFIG" >&2; exit 2; }

[[ $# -eq 2 ]] || usage
build_dir=$1
config=$2
shards=${LATENTQ_SLURM_SHARDS:-3}
budget=${LATENTQ_SLURM_TIMEOUT:-150}
python=${LATENTQ_PYTHON:-$repo/.venv/bin/python}
# shellcheck disable=SC2206  # intended word splitting
run_args=(${LATENTQ_SLURM_RUN_ARGS:-})
[[ $shards =~ ^[1-9][0-9]*$ ]] || { echo "LATENTQ_SLURM_SHARDS='$shards' is not a positive integer" >&2; exit 2; }
[[ -f $config ]] || { echo "config '$config' does not exist" >&2; exit 2; }
config=$(realpath -e -- "$config")

if [[ -n ${LATENTQ_BIN:-} ]]; then
  bin=$LATENTQ_BIN
elif [[ -x $build_dir/latentq ]]; then
  bin=$build_dir/latentq
else
  bin=$build_dir/study/latentq
fi
[[ -x $bin && -f $bin ]] || { echo "FAIL: latentq binary not found (looked for $bin; build it or set LATENTQ_BIN)" >&2; exit 1; }
bin=$(realpath -e -- "$bin")
[[ -x $python ]] || { echo "FAIL: python '$python' not found (set LATENTQ_PYTHON)" >&2; exit 1; }
"$python" -c 'import h5py, numpy' 2>/dev/null || { echo "FAIL: $python cannot import h5py and numpy" >&2; exit 1; }

# Never talk to an outer cluster: drop the Slurm variables of a surrounding job or login shell.
while IFS= read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(SLURM_|SBATCH_|SALLOC_|SRUN_|SQUEUE_|SINFO_)')

tmp=""
pids=()
job_ids=()
daemons_started=0

tail_logs() {  # print the last lines of every daemon and job log
  local f
  for f in "$tmp"/log/*.log "$tmp"/log/*.stderr "$tmp"/out/*/logs/*.out; do
    [[ -s $f ]] || continue
    echo "----- tail of $f"
    tail -n "${1:-15}" "$f"
  done
}

skip() {
  echo "SKIP: Slurm cannot run here: $*"
  [[ -n $tmp ]] && tail_logs 20
  exit "$SKIP"
}

fail() {
  echo "FAIL: $*"
  [[ -n $tmp ]] && tail_logs 30
  exit 1
}

# shellcheck disable=SC2317  # called through the EXIT trap
cleanup() {
  local rc=$? pid i
  trap - EXIT INT TERM
  log "tearing down (exit $rc)"
  if (( daemons_started )) && [[ ${#job_ids[@]} -gt 0 ]]; then
    scancel "${job_ids[@]}" 2>/dev/null
    for ((i = 0; i < 20; ++i)); do  # let slurmd kill the job processes before it goes
      [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.5
    done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; --i)); do  # reverse start order: slurmd, slurmctld, munged
    kill -TERM "${pids[i]}" 2>/dev/null
  done
  for pid in "${pids[@]}"; do
    for ((i = 0; i < 20; ++i)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if [[ -n $tmp ]]; then
    if [[ ${LATENTQ_SLURM_KEEP:-0} == 1 ]]; then
      echo "kept $tmp"
    else
      rm -rf -- "$tmp"
    fi
  fi
  log "done (exit $rc)"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- 1. Slurm and munge installed? ------------------------------------------------------------
need=(munged munge unmunge slurmctld slurmd sbatch squeue sinfo scontrol scancel)
missing() { local c; for c in "${need[@]}"; do command -v "$c" >/dev/null || echo "$c"; done; }
if [[ -n $(missing) ]]; then
  [[ $(id -u) -eq 0 ]] || skip "not installed ($(missing | tr '\n' ' ')) and not root, cannot apt-get install slurm-wlm munge"
  [[ ${LATENTQ_SLURM_INSTALL:-1} == 1 ]] || skip "not installed ($(missing | tr '\n' ' ')) and LATENTQ_SLURM_INSTALL=0"
  command -v apt-get >/dev/null || skip "not installed and no apt-get"
  log "installing slurm-wlm and munge (apt-get)"
  apt_log=$(mktemp)
  apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge >>"$apt_log" 2>&1; }
  if ! apt_install; then
    DEBIAN_FRONTEND=noninteractive apt-get update >>"$apt_log" 2>&1
    apt_install || { tail -n 20 "$apt_log"; rm -f "$apt_log"; skip "apt-get install slurm-wlm munge failed (log tail above)"; }
  fi
  rm -f "$apt_log"
  [[ -z $(missing) ]] || skip "still missing after apt-get install: $(missing | tr '\n' ' ')"
fi
[[ $(id -u) -eq 0 ]] || skip "this test starts slurmd, which must run as root (uid is $(id -u))"
log "$(slurmctld -V), $(munged -V 2>&1 | head -n1 | awk '{print $1}')"

# ---- 2. start munged, slurmctld, slurmd ---------------------------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/latentq-slurm.XXXXXX") || fail "mktemp failed"
chmod 0711 "$tmp"
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/log" "$tmp/out"
chmod 0711 "$tmp/munge"
lifetime=$((budget + 60))  # the daemons stop by themselves even if this script is SIGKILLed

port_free() { ! (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
ctld_port=""
for ((try = 0; try < 50; ++try)); do
  p=$((20000 + RANDOM % 40000))
  if port_free "$p" && port_free "$((p + 1))"; then ctld_port=$p; break; fi
done
[[ -n $ctld_port ]] || skip "no two free consecutive TCP ports found on 127.0.0.1"
slurmd_port=$((ctld_port + 1))

# munge: own key, socket, log, pid and seed files; --force because it runs as root in /tmp.
sock=$tmp/munge/munge.socket
head -c 1024 /dev/urandom >"$tmp/munge/munge.key"
chmod 0400 "$tmp/munge/munge.key"
timeout -k 5 "$lifetime" munged -F --force --socket="$sock" --key-file="$tmp/munge/munge.key" \
  --log-file="$tmp/munge/munged.log" --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munged.seed" \
  >"$tmp/log/munged.stderr" 2>&1 &
pids+=($!)
daemons_started=1
for ((i = 0; i < 40; ++i)); do
  munge -n -S "$sock" 2>/dev/null | unmunge -S "$sock" >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || skip "munged exited"
  sleep 0.25
done
munge -n -S "$sock" 2>/dev/null | unmunge -S "$sock" >/dev/null 2>&1 || skip "munge credentials do not round-trip through $sock"

host=$(hostname -s 2>/dev/null || hostname)
[[ -n $host ]] || skip "hostname is empty (slurmctld must match SlurmctldHost against it)"
cpus=$(nproc)
mem_mb=$(free -m | awk '/^Mem:/ {print $2}')
export SLURM_CONF=$tmp/slurm.conf
cat >"$SLURM_CONF" <<EOF
# one-node test cluster written by tests/slurm/run_slurm_test.sh
ClusterName=lqtest
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${ctld_port}
SlurmdPort=${slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${sock}
SlurmUser=root
SlurmdUser=root
StateSaveLocation=${tmp}/state
SlurmdSpoolDir=${tmp}/spool
SlurmctldPidFile=${tmp}/slurmctld.pid
SlurmdPidFile=${tmp}/slurmd.pid
SlurmdLogFile=${tmp}/log/slurmd.log  # slurmstepd logs only here
SlurmctldDebug=info  # no SlurmctldLogFile: with -D slurmctld logs to stderr (log/slurmctld.stderr)
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=${tmp}/log/jobcomp.txt
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
KillWait=5
InactiveLimit=0
MinJobAge=300
NodeName=lqnode NodeAddr=127.0.0.1 NodeHostname=${host} CPUs=${cpus} RealMemory=${mem_mb} State=UNKNOWN
PartitionName=debug Nodes=lqnode Default=YES MaxTime=INFINITE State=UP
EOF

timeout -k 5 "$lifetime" slurmctld -D -f "$SLURM_CONF" >"$tmp/log/slurmctld.stderr" 2>&1 &
pids+=($!)
timeout -k 5 "$lifetime" slurmd -D -f "$SLURM_CONF" -N lqnode >"$tmp/log/slurmd.stderr" 2>&1 &
pids+=($!)
log "started munged, slurmctld (port $ctld_port), slurmd (port $slurmd_port) for node lqnode=$host, CPUs=$cpus; conf $SLURM_CONF"

state=""
for ((i = 0; i < 120; ++i)); do  # up to 30 s
  state=$(sinfo -h -n lqnode -o %T 2>/dev/null)
  [[ $state == idle ]] && break
  kill -0 "${pids[1]}" 2>/dev/null || skip "slurmctld exited"
  kill -0 "${pids[2]}" 2>/dev/null || skip "slurmd exited"
  sleep 0.25
done
[[ $state == idle ]] || skip "node lqnode did not become idle within 30 s (sinfo state: '${state:-no answer}')"
log "cluster up:"
sinfo -N -o '%N %P %T %c %m'

# ---- 3. submit the array + merge, run the reference meanwhile ------------------------------------
outdir=$tmp/out/study
name=$(basename -- "$config"); name=${name%.toml}
merged=$outdir/$name.h5
submit_out=$(LATENTQ_BIN=$bin "$repo/study/slurm/submit.sh" "$config" "$outdir" "$shards" \
  --time=5 -- "${run_args[@]}" 2>"$tmp/log/submit.stderr")
rc=$?
cat "$tmp/log/submit.stderr"
echo "$submit_out"
[[ $rc -eq 0 ]] || fail "submit.sh exited $rc"
array_id=$(sed -n 's/^array_job_id=\([0-9]\+\)$/\1/p' <<<"$submit_out")
merge_id=$(sed -n 's/^merge_job_id=\([0-9]\+\)$/\1/p' <<<"$submit_out")
[[ -n $array_id && -n $merge_id ]] || fail "submit.sh did not print array_job_id=<id> and merge_job_id=<id>"
job_ids=("$array_id" "$merge_id")
log "submitted array job $array_id (${shards} tasks) and merge job $merge_id"

ref=$tmp/out/reference.h5
log "reference: $bin run $config --out $ref ${run_args[*]}"
left=$((budget - (SECONDS - t0)))
(( left > 0 )) || left=1
timeout -k 5 "$left" "$bin" run "$config" --out "$ref" "${run_args[@]}" >"$tmp/log/reference.stdout" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then
  cat "$tmp/log/reference.stdout"
  [[ $rc -eq 124 || $rc -eq 137 ]] && fail "the unsharded reference run did not finish within the ${budget} s budget"
  fail "the unsharded reference run exited $rc"
fi

# ---- 4. wait, check job states, compare ----------------------------------------------------------
while :; do
  queue=$(squeue -h -o '%i %j %T %r' 2>&1) || fail "squeue failed: $queue"
  [[ -z $queue ]] && break
  if (( SECONDS - t0 > budget )); then
    echo "$queue"
    fail "jobs still queued after ${budget} s (LATENTQ_SLURM_TIMEOUT)"
  fi
  sleep 1
done
log "queue empty; job records:"
records=$(scontrol -o show job "$array_id" 2>&1; scontrol -o show job "$merge_id" 2>&1)
while IFS= read -r line; do
  echo "  $(grep -oE '\<(JobId|ArrayJobId|ArrayTaskId|JobName|JobState|Reason|ExitCode|RunTime|NodeList)=[^ ]*' <<<"$line" | tr '\n' ' ')"
done <<<"$records"
echo "jobcomp log ($tmp/log/jobcomp.txt):"
sed -E 's/^(JobId=[0-9]+).*(Name=[^ ]+).*(JobState=[A-Z_]+).*NodeList=([^ ]+).*$/  \1 \2 \3 NodeList=\4/' "$tmp/log/jobcomp.txt" 2>/dev/null
echo "(sacct is not available: no slurmdbd, AccountingStorageType=accounting_storage/none)"

n_done=$(grep -c 'JobState=COMPLETED .*ExitCode=0:0' <<<"$(scontrol -o show job "$array_id")")
[[ $n_done -eq $shards ]] || fail "${n_done} of ${shards} array tasks of job $array_id COMPLETED with exit 0"
grep -q 'JobState=COMPLETED .*ExitCode=0:0' <<<"$(scontrol -o show job "$merge_id")" ||
  fail "merge job $merge_id did not complete: $(scontrol -o show job "$merge_id" | grep -o 'JobState=[^ ]* Reason=[^ ]*')"
for ((i = 0; i < shards; ++i)); do
  f=$(printf '%s/shards/shard_%04d.h5' "$outdir" "$i")
  [[ -f $f ]] || fail "shard file $f missing"
done
[[ -f $merged ]] || fail "merged file $merged missing"
log "all ${shards} shards and the merge COMPLETED; comparing $merged with the reference"
# Every group of the unsharded run, /e2e included when the config enables it: the merge job runs the
# e2e step (torch logits: a tolerance for the last bits, the merge job may use another thread count).
if grep -q '^e2e: skipped: ' "$tmp/log/reference.stdout"; then
  log "note: the e2e step was skipped here ($(grep -m1 '^e2e: skipped: ' "$tmp/log/reference.stdout")): /e2e not checked"
elif grep -q '^\[e2e\]' "$config" && grep -A3 '^\[e2e\]' "$config" | grep -q '^enabled *= *true'; then
  "$python" - "$ref" "$merged" <<'PYEOF' || fail "the merge job did not write /e2e"
import sys
import h5py
for path in sys.argv[1:]:
    with h5py.File(path, "r") as f:
        assert "e2e" in f and len(f["e2e/quantizer"]) > 0, f"{path}: no /e2e group (groups: {list(f)})"
print("/e2e in the reference and in the merged file")
PYEOF
fi
"$python" "$here/compare_results.py" "$ref" "$merged" --logits-tol 1e-4:1e-7 ||
  fail "the merged results differ from the unsharded run"
log "PASS: ${shards}-shard Slurm run of $name equals the unsharded run"
exit 0
