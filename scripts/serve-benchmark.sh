#!/usr/bin/env bash
# Request latency of `tessera serve`'s API: `tree` on a directory of
# TESSERA_BENCH_ENTRIES entries (default 100,000) and `backups` on
# TESSERA_BENCH_BACKUPS backups (default 10,000, the issue's figure), over
# loopback HTTP, in the profile given as $1 (default: release). Prints the
# machine, the setup times, and median and slowest of 15 requests each.
#
# The whole output of the build and the test goes to a log; on failure the
# log's end is printed and the script exits non-zero. A release run builds
# into target/release: delete it afterwards on a shared disk
# (TESSERA_BENCH_CLEAN=1 does it).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-release}
export TESSERA_BENCH_ENTRIES=${TESSERA_BENCH_ENTRIES:-100000}
export TESSERA_BENCH_BACKUPS=${TESSERA_BENCH_BACKUPS:-10000}
flag=()
[ "$profile" = release ] && flag=(--release)
log=$(mktemp "${TMPDIR:-/tmp}/serve-benchmark.XXXXXX.log")
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) processors"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
cargo test -p tessera-serve "${flag[@]}" --test latency -- --ignored --nocapture >"$log" 2>&1 || status=$?
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$status" -ne 0 ]; then
  echo "serve-benchmark: the latency test failed (exit $status); the end of its output ($log):" >&2
  tail -n 60 "$log" >&2
  exit "$status"
fi
grep -E '^(repository|setup|tree|backups|stats)' "$log" || {
  echo "serve-benchmark: the test printed no figures; its output ($log):" >&2
  tail -n 60 "$log" >&2
  exit 1
}
rm -f "$log"
if [ "${TESSERA_BENCH_CLEAN:-0}" = 1 ] && [ "$profile" = release ]; then
  rm -rf target/release
fi
