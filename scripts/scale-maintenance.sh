#!/usr/bin/env bash
# Peak RSS and cost per GiB of `tessera gc` and `tessera check`, each in a
# process of its own (`/usr/bin/time -f %M`), on a repository built by the
# scale benchmark (issue 25): the benchmark backs up the generated versions
# (data mode by default: tar streams piped from the generator, never stored),
# deletes the oldest half and keeps the repository (TESSERA_SCALE_GC=0);
# then gc runs once (with the first sort budget) and check once per sort
# budget (`--sort-memory`), and a table gives each one's peak RSS, time and
# seconds per GiB of repository (its size on disk, `du -sb`).
#
# Usage: scripts/scale-maintenance.sh
# Environment: TESSERA_SCALE_MODE (data or trace; default data),
# TESSERA_SCALE_SIZE, TESSERA_SCALE_VERSIONS (the benchmark's; default 64GiB
# and 20 in data mode), TESSERA_SCALE_REFERENCE (default 0 here: no exact
# pass), BUDGETS (check's sort budgets, default "32MiB 1MiB"; gc runs with
# the first), WORK (scratch directory, default a new one under /tmp),
# KEEP=1 keeps the repository, TESSERA (binary; default target/release/tessera,
# built if absent), BENCH (a built benchmark binary to run instead of
# `cargo bench`, e.g. target/release/deps/trace_scale-*).
set -euo pipefail

cd "$(dirname "$0")/.."
TESSERA=${TESSERA:-target/release/tessera}
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
WORK=${WORK:-$(mktemp -d /tmp/tessera-scale-maint.XXXXXX)}
mkdir -p "$WORK"
BUDGETS=${BUDGETS:-"32MiB 1MiB"}
export TESSERA_SCALE_MODE=${TESSERA_SCALE_MODE:-data}
export TESSERA_SCALE_REFERENCE=${TESSERA_SCALE_REFERENCE:-0}
export TESSERA_SCALE_GC=0 TESSERA_SCALE_DIR="$WORK"

if [ -n "${BENCH:-}" ]; then
    "$BENCH" --bench | tee "$WORK/bench.log"
else
    cargo bench -p tessera-lab --bench trace_scale | tee "$WORK/bench.log"
fi
repo=$(sed -n 's/^repository kept at //p' "$WORK/bench.log")
[ -d "$repo" ] || { echo "the benchmark kept no repository" >&2; exit 1; }
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$(dirname "$repo")"' EXIT

[ -x "$TESSERA" ] || cargo build --release -p tessera-cli
gib() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 2**30:.3f}')" "$1"; }
before=$(du -sb "$repo" | cut -f1)
set -- $BUDGETS
/usr/bin/time -f '%M %e' -o "$WORK/gc.time" "$TESSERA" gc "$repo" --sort-memory "$1" --json >"$WORK/gc.json"
after=$(du -sb "$repo" | cut -f1)
read -r gc_kib gc_s < <(tail -1 "$WORK/gc.time")
moved=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["bytes_moved"], s["chunks_moved"])' "$WORK/gc.json")
echo "---"
echo "repository $(gib "$before") GiB before gc, $(gib "$after") GiB after; gc moved ${moved% *} bytes (${moved#* } chunks)"
printf '| command | sort budget | repository GiB | peak RSS MiB | s | s per GiB |\n|---|---:|---:|---:|---:|---:|\n'
awk -v b="$1" -v k="$gc_kib" -v s="$gc_s" -v g="$before" 'BEGIN { g /= 2^30; printf "| gc | %s | %.2f | %.1f | %.1f | %.2f |\n", b, g, k/1024, s, s/g }'
for budget in "$@"; do
    /usr/bin/time -f '%M %e' -o "$WORK/check.time" "$TESSERA" check "$repo" --sort-memory "$budget" --json >"$WORK/check.json" || true
    read -r kib s < <(tail -1 "$WORK/check.time")
    awk -v b="$budget" -v k="$kib" -v s="$s" -v g="$after" 'BEGIN { g /= 2^30; printf "| check | %s | %.2f | %.1f | %.1f | %.2f |\n", b, g, k/1024, s, s/g }'
done
