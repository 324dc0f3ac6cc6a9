#!/usr/bin/env bash
# fuzz/run.sh HARNESS|all SECONDS: run libFuzzer harnesses of the fuzz build, one after the other (one
# process, one thread each), each for SECONDS with its corpus, and print per harness: executions per
# second, total executions, coverage (cov: edges, ft: features), corpus size and the findings (crash,
# leak, timeout, oom and slow-unit files). HARNESS: spec, thresholds, config, dump, dump_schema.
#
# Environment: BUILD_DIR (default build-fuzz: the build configured with -DLATENTQ_FUZZ=ON, see
# fuzz/README.md); FUZZ_ARGS (more libFuzzer flags). Per harness, under BUILD_DIR/fuzz/:
#   seeds/<h>/      the seeds (make_corpus.py, run here when missing)
#   corpus/<h>/     the working corpus (new inputs are added here; kept between runs)
#   artifacts/<h>/  crash-*, leak-*, timeout-*, oom-*, slow-unit-* (the findings; reproduce one with
#                   BUILD_DIR/fuzz/fuzz_<h> FILE)
#   logs/<h>.log    the libFuzzer output
# The findings are counted by owner: "ours" (in latentq), "hdf5" (libhdf5's own faults on corrupt
# files, see README.md) and "n/r" (not reproduced on its own).
# Exit status: 0 when no harness has a finding of ours in this run, 1 otherwise, 2 for a usage error.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
all=(spec thresholds config dump dump_schema)
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -eq 2 ]] || usage
[[ $2 =~ ^[0-9]+$ && $2 -gt 0 ]] || { echo "run.sh: SECONDS must be a positive integer, got '$2'" >&2; exit 2; }
if [[ $1 == all ]]; then
  harnesses=("${all[@]}")
elif [[ " ${all[*]} " == *" $1 "* ]]; then
  harnesses=("$1")
else
  echo "run.sh: unknown harness '$1' (expected all or one of: ${all[*]})" >&2
  exit 2
fi
seconds=$2
build=$(cd "${BUILD_DIR:-$root/build-fuzz}" 2>/dev/null && pwd) || {
  echo "run.sh: no build folder ${BUILD_DIR:-$root/build-fuzz} (configure it as fuzz/README.md says)" >&2
  exit 2
}
out=$build/fuzz
for h in "${harnesses[@]}"; do
  [[ -x $out/fuzz_$h ]] || { echo "run.sh: $out/fuzz_$h is not built (ninja -C $build fuzz/all)" >&2; exit 2; }
done
[[ -d $out/seeds ]] || python3 "$here/make_corpus.py" "$build"

declare -A dict=([spec]=spec.dict [thresholds]=toml.dict [config]=toml.dict)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

status=0
rows=()
for h in "${harnesses[@]}"; do
  corpus=$out/corpus/$h artifacts=$out/artifacts/$h log=$out/logs/$h.log
  mkdir -p "$corpus" "$artifacts" "$out/logs"
  before=$(find "$artifacts" -type f | wc -l)
  touch "$log.start"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$artifacts/")
  [[ -n ${dict[$h]:-} ]] && args+=(-dict="$here/dict/${dict[$h]}")
  lsan=${LSAN_OPTIONS:-}
  if [[ $h == dump ]]; then
    # Corrupt HDF5 files meet libhdf5's own hangs and leaks (README.md, lsan_dump.supp): fork mode, one
    # worker, records each finding and goes on.
    lsan=${lsan:+$lsan:}suppressions=$here/lsan_dump.supp
    args+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  fi
  echo "== fuzz_$h: ${seconds}s (log: $log)" >&2
  # shellcheck disable=SC2086
  LSAN_OPTIONS=$lsan "$out/fuzz_$h" "${args[@]}" ${FUZZ_ARGS:-} "$corpus" "$out/seeds/$h" >"$log" 2>&1 && rc=0 || rc=$?
  stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  execs=$(stat number_of_executed_units) eps=$(stat average_exec_per_sec)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  if [[ -z $execs ]]; then  # fork mode: "#N: cov: .. ft: .. corp: .. exec/s: .. oom/timeout/crash: .. time: Ts"
    execs=$(sed -n 's/^#\([0-9]*\):.*/\1/p' <<<"$last")
    t=$(sed -n 's/.* time: \([0-9]*\)s.*/\1/p' <<<"$last")
    [[ -n $execs && -n $t && $t -gt 0 ]] && eps=$((execs / t))
  fi
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last") ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9/a-zA-Z]*\).*/\1/p' <<<"$last")
  new=$(find "$artifacts" -type f | wc -l)
  findings=$((new - before))
  # Whose finding: rerun each new one; "hdf5" when the innermost frame of its stack that is latentq's
  # (latentq::, lqfuzz::, a source file of the tree) or libhdf5's is libhdf5's (README.md: libhdf5
  # 1.10.8's own faults on corrupt files), "n/r" when the rerun passes (fork mode: an input that failed
  # only after others), else "ours".
  ours=0 hdf5=0 unrepro=0
  while IFS= read -r f; do
    trace=$(LSAN_OPTIONS=$lsan timeout 60 "$out/fuzz_$h" -runs=1 -timeout=5 "$f" 2>&1) && { unrepro=$((unrepro + 1)); continue; }
    owner=$(grep -E '^ *#[0-9]+ ' <<<"$trace" |
            grep -m1 -oE 'in (latentq|lqfuzz)::|'"$root"'/[^ ]*\.(cpp|h):[0-9]+|libhdf5' || true)
    if [[ $owner == libhdf5 ]]; then hdf5=$((hdf5 + 1)); else ours=$((ours + 1)); fi
  done < <(find "$artifacts" -type f -newer "$log.start")
  note=""
  if ((ours > 0 || (rc != 0 && hdf5 == 0))); then
    note=$(grep -m1 -oE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer): [a-z -]+|runtime error: .*|fuzz: property violated.*|terminate called.*' "$log" || echo "exit $rc")
  fi
  ((ours > 0)) && status=1
  rows+=("$(printf '%-12s %6s %12s %8s %6s %7s %12s %5s %5s %4s  %s' "$h" "$seconds" "${execs:-?}" "${eps:-?}" \
            "${cov:-?}" "${ft:-?}" "${corp:-?}" "$ours" "$hdf5" "$unrepro" "$note")")
done
printf '%-12s %6s %12s %8s %6s %7s %12s %5s %5s %4s  %s\n' harness seconds execs exec/s cov ft corpus ours hdf5 n/r note
printf '%s\n' "${rows[@]}"
exit $status
