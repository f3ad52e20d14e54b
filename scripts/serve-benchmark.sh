#!/usr/bin/env bash
# Request latency of `tessera serve`'s API: `tree` on a directory of
# TESSERA_BENCH_ENTRIES entries (default 100,000) and `backups` on
# TESSERA_BENCH_BACKUPS backups (default 2,000), over loopback HTTP, in
# the profile given as $1 (default: release). Prints median and slowest.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-release}
flag=()
[ "$profile" = release ] && flag=(--release)
cargo test -p tessera-serve "${flag[@]}" --test latency -- --ignored --nocapture 2>&1 \
  | grep -E '^(repository|tree|backups|stats)'
