#!/usr/bin/env bash
# The lab's measurements (the lab issue's "must show"):
#
#  (a) realism of the generated dataset: `tessera gen` (50 versions, default
#      size) analysed with FastCDC 2/8/64 KiB + SHA-1, next to the real
#      datasets of /work/shared/data: bytes of internal, adjacent, skip and
#      unique chunks per dataset;
#  (b) experiment overhead: `tessera experiment` (20 versions of 200 MB, one
#      system, no retention, restore newest after every backup) against the
#      summed wall time of the same `tessera backup` + `tessera restore ... -`
#      commands on the same files in a fresh repository (target ratio <= 1.5).
#
# Usage: scripts/lab-measurements.sh [a|b|all]      (default all)
# Environment:
#   WORK        working directory (default: a new temporary directory, kept)
#   REALDATA    directory holding the unpacked real datasets (code-redis-wc/,
#               db-sqlite/); unpacked from /work/shared/data into $WORK when
#               it does not hold them (default /tmp/realdata)
#   DATA_ARCHIVES  directory of the *.tar.zst archives (default /work/shared/data)
#   GEN_VERSIONS (50) GEN_SIZE (default of `tessera gen`)
#   OVH_VERSIONS (20) OVH_SIZE (200MB)
set -euo pipefail

what=${1:-all}
root=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d /tmp/lab-measurements.XXXXXX)}
REALDATA=${REALDATA:-/tmp/realdata}
DATA_ARCHIVES=${DATA_ARCHIVES:-/work/shared/data}
GEN_VERSIONS=${GEN_VERSIONS:-50}
OVH_VERSIONS=${OVH_VERSIONS:-20}
OVH_SIZE=${OVH_SIZE:-200MB}
mkdir -p "$WORK"
for tool in jq zstd tar awk; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

echo "== building tessera (release)"
cargo build --release -q -p tessera-cli --manifest-path "$root/Cargo.toml"
T="$root/target/release/tessera"
echo "working directory: $WORK"

now() { date +%s.%N; }

# ---------------------------------------------------------------- (a)
realism() {
    echo
    echo "== (a) generated dataset realism"
    local gen="$WORK/gen"
    if [ ! -f "$gen/MANIFEST.tsv" ] || [ "$(ls "$gen"/v*.tar 2>/dev/null | wc -l)" -ne "$GEN_VERSIONS" ]; then
        rm -rf "$gen"
        local size_arg=()
        [ -n "${GEN_SIZE:-}" ] && size_arg=(--size "$GEN_SIZE")
        "$T" gen --versions "$GEN_VERSIONS" "${size_arg[@]}" "$gen" >/dev/null
    fi
    local sets=("generated:$gen")
    for name in code-redis-wc db-sqlite; do
        local dir="$REALDATA/$name"
        if ! ls "$dir"/v*.tar >/dev/null 2>&1; then
            dir="$WORK/realdata/$name"
            if ! ls "$dir"/v*.tar >/dev/null 2>&1; then
                echo "unpacking $name into $WORK/realdata"
                mkdir -p "$WORK/realdata"
                zstd -dc --long=31 "$DATA_ARCHIVES/$name.tar.zst" | tar xf - -C "$WORK/realdata"
            fi
        fi
        sets+=("$name:$dir")
    done
    local table="$WORK/realism.tsv"
    printf 'dataset\tversions\tlogical_GB\tinternal%%\tadjacent%%\tskip%%\tunique%%\tadj+int_of_dups%%\texact\tNDF\n' >"$table"
    for entry in "${sets[@]}"; do
        local name=${entry%%:*} dir=${entry#*:}
        local json="$WORK/analyze-$name.json"
        echo "analyzing $name ($dir)"
        # shellcheck disable=SC2046
        "$T" analyze --fingerprint sha1 --json $(ls "$dir"/v*.tar | sort) >"$json"
        jq -r --arg name "$name" '
            def pct(x): (x * 10000 | round) / 100;
            [ $name, (.versions | length), ((.logical_bytes / 1e7 | round) / 100),
              pct(.frac_internal), pct(.frac_adjacent), pct(.frac_skip), pct(.frac_unique),
              pct((.frac_internal + .frac_adjacent) /
                  ([.frac_internal + .frac_adjacent + .frac_skip, 1e-12] | max)),
              ((.exact_dedup_ratio * 100 | round) / 100), ((.ndf_ratio * 100 | round) / 100)
            ] | @tsv' "$json" >>"$table"
    done
    echo
    echo "chunk classes by bytes (FastCDC 2/8/64 KiB, SHA-1), over all versions:"
    column -t -s $'\t' "$table"
    # The claim for generated data: adjacent + internal duplicates dominate
    # the duplicates and skip duplicates stay below 1% of bytes.
    jq -r '
        ((.frac_internal + .frac_adjacent) / (.frac_internal + .frac_adjacent + .frac_skip)) as $share
        | "generated: adjacent+internal = \($share * 100 | . * 100 | round / 100)% of duplicate bytes; skip = \(.frac_skip * 100 | . * 1000 | round / 1000)% of bytes (max per version \([.versions[].frac_skip] | max * 100 | . * 1000 | round / 1000)%) -> "
          + (if $share > 0.5 and .frac_skip < 0.01 then "OK" else "NOT MET" end)' \
        "$WORK/analyze-generated.json"
}

# ---------------------------------------------------------------- (b)
overhead() {
    echo
    echo "== (b) experiment overhead: $OVH_VERSIONS versions of $OVH_SIZE"
    local ds="$WORK/overhead-data"
    if [ "$(ls "$ds"/v*.tar 2>/dev/null | wc -l)" -ne "$OVH_VERSIONS" ]; then
        rm -rf "$ds"
        "$T" gen --versions "$OVH_VERSIONS" --size "$OVH_SIZE" "$ds" >/dev/null
    fi
    # Both runs read the same files: warm the page cache once for both.
    cat "$ds"/v*.tar >/dev/null
    local cfg="$WORK/overhead.toml" out="$WORK/overhead-exp"
    cat >"$cfg" <<EOF
name = "overhead"

[dataset]
dir = "$ds"

[restore]
every = 1

[[systems]]
name = "exact"
EOF
    rm -rf "$out"
    local t0 t1
    t0=$(now)
    "$T" experiment "$cfg" --out "$out" >"$WORK/overhead-experiment.log" 2>&1
    t1=$(now)
    local exp_s
    exp_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')

    local repo="$WORK/overhead-repo" cli_s=0 backup_s=0 restore_s=0 s
    local log="$WORK/overhead-cli.log"
    rm -rf "$repo"
    : >"$log"
    t0=$(now)
    "$T" init "$repo" --encryption none >/dev/null
    t1=$(now)
    cli_s=$(awk -v a="$t0" -v b="$t1" -v c="$cli_s" 'BEGIN { printf "%.6f", c + b - a }')
    for f in $(ls "$ds"/v*.tar | sort); do
        t0=$(now)
        "$T" backup "$repo" - <"$f" >>"$log" 2>&1
        t1=$(now)
        s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f", b - a }')
        backup_s=$(awk -v x="$backup_s" -v s="$s" 'BEGIN { printf "%.6f", x + s }')
        t0=$(now)
        "$T" restore "$repo" latest - >/dev/null 2>>"$log"
        t1=$(now)
        s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f", b - a }')
        restore_s=$(awk -v x="$restore_s" -v s="$s" 'BEGIN { printf "%.6f", x + s }')
    done
    cli_s=$(awk -v c="$cli_s" -v b="$backup_s" -v r="$restore_s" 'BEGIN { printf "%.3f", c + b + r }')
    local logical
    logical=$(du -cb "$ds"/v*.tar | tail -1 | cut -f1)
    echo "dataset: $OVH_VERSIONS versions, $(awk -v b="$logical" 'BEGIN { printf "%.2f GB", b / 1e9 }')"
    printf 'tessera experiment            %8.2f s\n' "$exp_s"
    printf 'tessera backup (sum)          %8.2f s\n' "$backup_s"
    printf 'tessera restore - (sum)       %8.2f s\n' "$restore_s"
    printf 'CLI total (init+backup+restore) %6.2f s\n' "$cli_s"
    echo "(experiment progress: $WORK/overhead-experiment.log, CLI output: $log)"
    awk -v e="$exp_s" -v c="$cli_s" 'BEGIN {
        r = e / c
        printf "ratio experiment / CLI = %.3f (target <= 1.5): %s\n", r, (r <= 1.5 ? "OK" : "NOT MET")
    }'
}

case "$what" in
    a) realism ;;
    b) overhead ;;
    all) realism; overhead ;;
    *) echo "usage: $0 [a|b|all]" >&2; exit 2 ;;
esac
