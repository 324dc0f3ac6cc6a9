#!/usr/bin/env bash
# lq_results_equal's tolerances on hand-written results files (lq_results_fixture): a float of 2 against 2.01
# (relative difference 4.98e-3) differs strictly, passes at --rtol GROUP=1e-2 and at '*=1e-2', not at 1e-3, not
# when only another group has a tolerance, and a named group's tolerance wins over '*'; an int64 column (4 vs 5)
# differs at any tolerance; a tolerance <= 0 is a usage error (exit 2); --shape-only GROUP ignores that group's values
# (4 vs 5 passes) but not its row count or columns; --numbers-only GROUP ignores that group's strings (two plans of
# the same bytes pass) but not its numbers (840 vs 864 bytes differ, unless within the group's tolerance); an unknown
# option is a usage error.
# Usage: results_equal_test.sh LQ_RESULTS_FIXTURE LQ_RESULTS_EQUAL WORKDIR
set -u
F=$1 E=$2 W=$3
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
fail=0
expect() {  # expect RC ARGS...: lq_results_equal ARGS exits RC
  local want=$1; shift
  "$E" "$@" >/dev/null 2>&1
  local rc=$?
  if [ "$rc" != "$want" ]; then echo "FAIL: lq_results_equal $* exited $rc, expected $want"; fail=1; fi
}
echo '{"attrs": {}, "groups": {"attention_check": {"values": {"layer": [0, 1], "ref_vs_dump_rel_fro": [1.0, 2.0],
  "tq": [4, 4]}}, "svd": {"values": {"layer": [0]}}}}' > a.json
sed 's/2.0\]/2.01]/' a.json > b.json
sed 's/"tq": \[4, 4\]/"tq": [4, 5]/' a.json > c.json
sed 's/"layer": \[0, 1\], "ref_vs_dump_rel_fro": \[1.0, 2.0\],/"layer": [0], "ref_vs_dump_rel_fro": [1.0],/; s/"tq": \[4, 4\]/"tq": [4]/' a.json > d.json
echo '{"attrs": {}, "groups": {"decision": {"values": {"choice": ["uniform", "plan"],
  "quantizer": ["q4_1", "mixed: bf16 x1, q4_1 x3"], "bytes_per_token_model": [720.0, 840.0]}}}}' > e.json
sed 's/bf16 x1/q8_0 x1/' e.json > f.json
sed 's/bf16 x1/q8_0 x1/; s/840.0/864.0/' e.json > g.json
for f in a b c d e f g; do "$F" $f.json $f.h5 || { echo "FAIL: lq_results_fixture $f.json"; exit 1; }; done
expect 0 a.h5 a.h5
expect 1 a.h5 b.h5
expect 0 a.h5 b.h5 --rtol attention_check=1e-2
expect 0 a.h5 b.h5 --rtol '*=1e-2'
expect 1 a.h5 b.h5 --rtol '*=1e-3'
expect 1 a.h5 b.h5 --rtol svd=1e-2
expect 1 a.h5 b.h5 --rtol attention_check=1e-3 --rtol '*=1e-2'
expect 0 a.h5 b.h5 --atol '*=0.011'
expect 1 a.h5 c.h5 --rtol '*=1e-2'
expect 2 a.h5 a.h5 --rtol '*=0'
expect 0 a.h5 c.h5 --shape-only attention_check
expect 1 a.h5 c.h5 --shape-only svd
expect 1 a.h5 d.h5 --shape-only attention_check
expect 2 a.h5 a.h5 --shape attention_check
expect 1 e.h5 f.h5
expect 0 e.h5 f.h5 --numbers-only decision
expect 1 e.h5 g.h5 --numbers-only decision
expect 0 e.h5 g.h5 --numbers-only decision --rtol decision=3e-2
expect 1 e.h5 f.h5 --numbers-only attention_check
[ $fail = 0 ] && echo "lq_results_equal tolerances: 19 cases pass"
exit $fail
