#!/usr/bin/env bash
# Request latency of `tessera serve`'s API: `tree` on a directory of
# TESSERA_BENCH_ENTRIES entries (default 100,000) and `backups` on
# TESSERA_BENCH_BACKUPS backups (default 10,000, the issue's figure), over
# loopback HTTP, in the profile given as $1 (default: release). Prints
# median and slowest of 15 requests each.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-release}
export TESSERA_BENCH_ENTRIES=${TESSERA_BENCH_ENTRIES:-100000}
export TESSERA_BENCH_BACKUPS=${TESSERA_BENCH_BACKUPS:-10000}
flag=()
[ "$profile" = release ] && flag=(--release)
cargo test -p tessera-serve "${flag[@]}" --test latency -- --ignored --nocapture 2>&1 \
  | grep -E '^(repository|tree|backups|stats)'
