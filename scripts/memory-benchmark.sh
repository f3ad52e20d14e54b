#!/usr/bin/env bash
# Peak memory of a backup against its size (issue 19, point 4).
#
# For each index (exact, ddfs, lazy, ehid; container layout) and the
# lifecycle layout, backs up 1, 4 and 16 GiB of fresh pseudo-random data
# (AES-128-CTR keystream of a fixed seed, generated on the fly and piped to
# `tessera backup REPO -`, never stored) into a new repository, records the
# backup's peak RSS (`/usr/bin/time -f %M`) and the index memory it reports
# (`index.memory_bytes` of `backup --json`), deletes the repository, and
# prints a table with each configuration's 16 GiB / 1 GiB peak ratio.
#
# Usage: scripts/memory-benchmark.sh [SIZES...]   (default: 1 4 16, in GiB)
# Environment: TESSERA (binary; default target/release/tessera, built if
# absent), WORK (scratch directory for the repositories; default a new
# directory under /tmp), CONFIGS (space-separated subset of
# "exact ddfs lazy ehid lifecycle").
set -euo pipefail

cd "$(dirname "$0")/.."
TESSERA=${TESSERA:-target/release/tessera}
[ -x "$TESSERA" ] || cargo build --release -p tessera-cli
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
command -v openssl >/dev/null || { echo "needs openssl" >&2; exit 1; }
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(1 4 16)
CONFIGS=${CONFIGS:-"exact ddfs lazy ehid lifecycle"}
WORK=${WORK:-$(mktemp -d /tmp/tessera-membench.XXXXXX)}
mkdir -p "$WORK"
trap 'rm -rf "$WORK/repo"' EXIT

# $1 GiB of deterministic incompressible bytes on stdout.
generate() {
    # openssl ends on SIGPIPE when head has enough: not a failure.
    { openssl enc -aes-128-ctr -nosalt -pbkdf2 -pass pass:tessera-membench </dev/zero 2>/dev/null || true; } |
        head -c "$(($1 << 30))"
}

# Unencrypted repositories (as measured before encryption existed; init
# would otherwise ask for a password).
init_args() {
    case $1 in
        lifecycle) echo "--encryption none --layout lifecycle" ;;
        *) echo "--encryption none --index $1" ;;
    esac
}

printf '%-10s %8s %14s %16s %10s\n' "config" "GiB" "peak RSS MiB" "index memory MiB" "ratio/1GiB"
for config in $CONFIGS; do
    first=""
    for size in "${SIZES[@]}"; do
        rm -rf "$WORK/repo"
        # shellcheck disable=SC2046
        "$TESSERA" init "$WORK/repo" $(init_args "$config") >/dev/null
        generate "$size" |
            /usr/bin/time -f %M -o "$WORK/rss" "$TESSERA" backup "$WORK/repo" - --json >"$WORK/out.json"
        rm -rf "$WORK/repo"
        rss_kib=$(tail -1 "$WORK/rss")
        index_bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["index"]["memory_bytes"])' "$WORK/out.json")
        [ -n "$first" ] || first=$rss_kib
        awk -v c="$config" -v s="$size" -v r="$rss_kib" -v i="$index_bytes" -v f="$first" \
            'BEGIN { printf "%-10s %8s %14.1f %16.1f %10.3f\n", c, s, r / 1024, i / 1048576, r / f }'
    done
done
rm -rf "$WORK"
