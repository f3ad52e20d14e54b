#!/usr/bin/env bash
# Peak RSS and cost per GiB of the lifecycle arranging and of `check` of a
# lifecycle repository (issue 25): a trace repository (lifecycle layout,
# manual arranging) gets two generated versions of SIZE each, then
# `tessera arrange` runs on fresh copies of it (round 2 splits version 1's
# category with version 2's NDF table), RUNS times per sort budget
# (`--sort-memory`), each under `/usr/bin/time -f %M`. The raw baseline,
# measured in the same run, is reading the objects the round reads (the
# category parts and the NDF table, `cat > /dev/null`, page cache warm as
# for the arranging). Every run's lifecycle objects must be byte-identical
# to the first run's (`diff -r`). With BASELINE (another `tessera` binary,
# e.g. one built from an older commit) its arranging runs too, without
# `--sort-memory`, for a before/after comparison.
#
# With `COMMANDS="arrange check"` (or `check` alone), `tessera check` then
# runs RUNS times per budget (and BASELINE) on the arranged repository
# (version 1 in a volume, version 2 in the active category: check reads
# every object, and both recipes), its cost per GiB of logical data in
# the repository (both versions); its raw baseline is reading the whole
# repository. Every check must find the repository healthy.
#
# With `COMMANDS=backup` (alone or with the others), the backup of version
# 2 runs RUNS times per budget (and BASELINE) on fresh copies of the
# repository holding version 1 only: its lookup of version 1's NDF table
# is what `--sort-memory` bounds; its cost per GiB of version 2. Its raw
# baseline is reading what it reads (version 2's trace and version 1's
# NDF table). Every run's lifecycle objects must be byte-identical to the
# first run's (the baseline's too: the same chunks are stored).
#
# Usage: scripts/arrange-memory.sh
# Environment: SIZE (one version, default 32GiB), RUNS (default 3), BUDGETS
# (default "32MiB 1MiB"), COMMANDS (default "arrange"; any of "backup
# arrange check"), TESSERA (default
# target/release/tessera, built if absent), BASELINE (optional), WORK
# (scratch directory, default a new one under /tmp; removed at the end
# unless KEEP=1).
set -euo pipefail

cd "$(dirname "$0")/.."
TESSERA=${TESSERA:-target/release/tessera}
SIZE=${SIZE:-32GiB}
RUNS=${RUNS:-3}
BUDGETS=${BUDGETS:-"32MiB 1MiB"}
COMMANDS=${COMMANDS:-arrange}
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
[ -x "$TESSERA" ] || cargo build --release -p tessera-cli
WORK=${WORK:-$(mktemp -d /tmp/tessera-arrange-memory.XXXXXX)}
mkdir -p "$WORK"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT

"$TESSERA" gen --trace --versions 2 --size "$SIZE" "$WORK/gen" >/dev/null
"$TESSERA" init --trace --layout lifecycle --arrange manual --encryption none "$WORK/template" >/dev/null
for v in 1 2; do
    "$TESSERA" backup "$WORK/template" --trace "$WORK/gen/v000$v.trace" --source s --json >"$WORK/backup$v.json"
    [ $v = 2 ] || [[ " $COMMANDS " != *" backup "* ]] || cp -a "$WORK/template" "$WORK/version1"
done
[[ " $COMMANDS " == *" backup "* ]] || rm -rf "$WORK/gen"
gib_of() { python3 -c 'import json,sys; print(sum(json.load(open(f))["logical_bytes"] for f in sys.argv[1:]) / 2**30)' "$@"; }
gib=$(gib_of "$WORK/backup2.json")
gib_all=$(gib_of "$WORK/backup1.json" "$WORK/backup2.json")

median() { sort -g | awk '{ a[NR] = $1 } END { printf "%.2f %.2f %.2f\n", a[int((NR + 1) / 2)], a[1], a[NR] }'; }

# raw_read FILES...: RUNS timed reads of FILES; prints median min max.
raw_read() {
    for ((r = 0; r < RUNS; r++)); do
        /usr/bin/time -f '%e' -o "$WORK/raw.time" cat "$@" >/dev/null
        tail -1 "$WORK/raw.time"
    done | median
}

# row NAME RAW GIB: a table row from the runs in $WORK/rss and $WORK/secs.
row() {
    local name=$1 raw_s=$2 gib=$3
    read -r rss rss_lo rss_hi < <(median <"$WORK/rss")
    read -r s s_lo s_hi < <(median <"$WORK/secs")
    awk -v n="$name" -v m="$rss" -v ml="$rss_lo" -v mh="$rss_hi" -v s="$s" -v sl="$s_lo" -v sh="$s_hi" -v g="$gib" -v raw="$raw_s" \
        'BEGIN { vs = raw + 0 > 0 ? sprintf("%.1f×", s / raw) : "(raw read under 10 ms)"; printf "| %s | %.1f (%.1f–%.1f) | %.2f (%.2f–%.2f) | %.3f | %s |\n", n, m, ml, mh, s, sl, sh, s / g, vs }'
}

# timed BINARY ARGS...: one run under /usr/bin/time, appended to rss and secs.
timed() {
    /usr/bin/time -f '%M %e' -o "$WORK/run.time" "$@" --json >"$WORK/run.json"
    read -r kib s < <(tail -1 "$WORK/run.time")
    echo "$kib" | awk '{ print $1 / 1024 }' >>"$WORK/rss"
    echo "$s" >>"$WORK/secs"
}

# on_copies NAME FROM FIRST COMMAND...: RUNS timed runs of COMMAND, each
# on a fresh copy of the repository FROM at $WORK/copy; every run's
# lifecycle objects must equal those of the first run kept in FIRST.
on_copies() {
    local name=$1 from=$2 first=$3
    shift 3
    : >"$WORK/rss" && : >"$WORK/secs"
    for ((r = 0; r < RUNS; r++)); do
        rm -rf "$WORK/copy" && cp -a "$from" "$WORK/copy"
        timed "$@"
        if [ -d "$first" ]; then
            diff -rq "$first" "$WORK/copy/lifecycle" >/dev/null || { echo "$name: lifecycle objects differ from the first run's" >&2; exit 1; }
        else
            cp -a "$WORK/copy/lifecycle" "$first"
        fi
    done
}

# arrange NAME BINARY [ARGS]: RUNS arrangings on fresh copies; prints a table row.
arrange() {
    local name=$1 bin=$2
    shift 2
    on_copies "$name" "$WORK/template" "$WORK/first" "$bin" arrange "$WORK/copy" "$@"
    row "$name" "$raw" "$gib"
}

# backup NAME BINARY [ARGS]: RUNS backups of version 2 on fresh copies of
# the repository holding version 1; prints a table row.
backup() {
    local name=$1 bin=$2
    shift 2
    on_copies "$name" "$WORK/version1" "$WORK/first-backup" "$bin" backup "$WORK/copy" --trace "$WORK/gen/v0002.trace" --source s "$@"
    rm -rf "$WORK/copy"
    row "$name" "$raw" "$gib"
}

# check NAME BINARY [ARGS]: RUNS checks of the arranged copy; prints a table row.
check() {
    local name=$1 bin=$2
    shift 2
    : >"$WORK/rss" && : >"$WORK/secs"
    for ((r = 0; r < RUNS; r++)); do
        timed "$bin" check "$WORK/copy" "$@"
        python3 -c 'import json,sys; r = json.load(open(sys.argv[1])); sys.exit(1 if r["problems"] else 0)' "$WORK/run.json" \
            || { echo "$name: check found problems" >&2; exit 1; }
    done
    row "$name" "$raw" "$gib_all"
}

# rows COMMAND: COMMAND's table rows (backup, arrange or check) for
# BASELINE, if set, and each budget.
rows() {
    local run=$1
    [ -z "${BASELINE:-}" ] || "$run" "baseline" "$BASELINE"
    for b in $BUDGETS; do
        "$run" "--sort-memory $b" "$TESSERA" --sort-memory "$b"
    done
}

if [[ " $COMMANDS " == *" backup "* ]]; then
    # The raw baseline: reading what the backup reads.
    raw=$(raw_read "$WORK/gen/v0002.trace" "$WORK"/version1/lifecycle/*/ndf/*)
    echo "version 2: $(printf '%.2f' "$gib") GiB logical, $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["chunks"])' "$WORK/backup2.json") chunks; raw read of the trace and version 1's NDF table: median $raw s (min max); medians of $RUNS runs (min–max); load average $(cut -d' ' -f1-3 /proc/loadavg)"
    printf '| backup of version 2 | peak RSS MiB | s | s per GiB of version | vs raw read |\n|---|---:|---:|---:|---:|\n'
    rows backup
    echo "every run's lifecycle objects byte-identical; load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
    rm -rf "$WORK/gen" "$WORK/version1"
fi

if [[ " $COMMANDS " == *" arrange "* ]]; then
    # The raw baseline: reading what the round reads.
    raw=$(raw_read "$WORK"/template/lifecycle/*/cat/* "$WORK"/template/lifecycle/*/ndf/*)
    echo "version 2: $(printf '%.2f' "$gib") GiB logical; $(du -sh "$WORK/template" | cut -f1) repository; raw read of the round's inputs: median $raw s (min max); medians of $RUNS runs (min–max)"
    printf '| arranging | peak RSS MiB | s | s per GiB of version | vs raw read |\n|---|---:|---:|---:|---:|\n'
    rows arrange
    echo "every run's lifecycle objects byte-identical"
elif [[ " $COMMANDS " == *" check "* ]]; then
    cp -a "$WORK/template" "$WORK/copy"
    "$TESSERA" arrange "$WORK/copy" >/dev/null
fi

if [[ " $COMMANDS " == *" check "* ]]; then
    # The raw baseline: reading the whole (arranged) repository.
    mapfile -t all < <(find "$WORK/copy" -type f)
    raw=$(raw_read "${all[@]}")
    echo "check of the arranged repository ($(du -sh "$WORK/copy" | cut -f1)): raw read of every object: median $raw s (min max); $(printf '%.2f' "$gib_all") GiB logical in both versions; medians of $RUNS runs (min–max)"
    printf '| check | peak RSS MiB | s | s per GiB of repository | vs raw read |\n|---|---:|---:|---:|---:|\n'
    rows check
    echo "every check found the repository healthy"
fi
