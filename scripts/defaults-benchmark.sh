#!/usr/bin/env bash
# Defaults vs plain on one synced working copy (issue 41, item 4).
#
# Unpacks the first VERSIONS versions of a packed working-copy series (by
# default the Redis releases of ../shared/data/code-redis-wc.tar.zst: one
# tar per version), and for two repositories — `defaults` (plain `tessera
# init`: encrypted, compressed, default key derivation) and `plain`
# (`init --encryption none --compression off`) — syncs the versions one
# after another into one directory (`rsync -a --delete`, so unchanged files
# keep their times, as in a real checkout) and backs up that directory
# after each. Then, on each repository: RUNS unchanged re-backups, full
# restores of the last backup, one-file restores (`--include`) and `list`s.
# Prints per configuration: stored bytes (`du -sb` of the repository), the
# total of all VERSIONS backups, the medians (and min–max) of the repeated
# commands and of FIRST_RUNS first backups of the first version (each into
# a new repository), timed to the millisecond, every command's peak RSS, and the
# ratios defaults/plain; and the CPU time (user + system) of each, which a
# loaded machine distorts less than wall time.
#
# Usage: scripts/defaults-benchmark.sh
# Environment:
#   TESSERA      the binary (default target/release/tessera, built if absent)
#   ARCHIVE      the packed series (default ../shared/data/code-redis-wc.tar.zst
#                beside the workspace, or /work/shared/data/…)
#   VERSIONS     how many versions to sync and back up (default 12)
#   RUNS         repeats of the re-backup, restores and list (default 5)
#   FIRST_RUNS   first backups of the first version, each into a new
#                repository, for the first backup's median (default RUNS)
#   ONE_FILE     glob of the one file to restore (default */src/server.c)
#   DROP_CACHES  1: `sync; echo 3 > /proc/sys/vm/drop_caches` before every
#                timed command (cold cache; needs root; slows everyone on the
#                machine). Default 0 (warm cache).
#   NODICT       1 (default): also a `--compression-dictionary off`
#                repository, and a table of dictionary vs no dictionary
#   BASELINE     binary for the `nodict` repository (default TESSERA): e.g.
#                a build of an earlier commit, to compare stored bytes with
#                what per-chunk compression stored then
#   LOGIN        1 (default): also a `login` configuration: defaults after
#                `tessera login` (sessions in $WORK/sessions), every command
#                run without the password; a table of login vs plain
#   RESTORE_DIR  where restores write (default WORK). A tmpfs (e.g. a
#                directory in /dev/shm) leaves out the file system's cost of
#                creating files, which on ext4 varies up to 3x with how
#                recently files were deleted (see run_config), and so
#                compares what the configurations themselves cost
#   WORK         scratch directory (default a new one under /tmp; removed at
#                the end unless given)
set -euo pipefail

cd "$(dirname "$0")/.."
TESSERA=${TESSERA:-target/release/tessera}
[ -x "$TESSERA" ] || cargo build --release -p tessera-cli
TESSERA=$(realpath "$TESSERA")
for tool in rsync zstd tar /usr/bin/time; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
ARCHIVE=${ARCHIVE:-}
if [ -z "$ARCHIVE" ]; then
    for a in ../shared/data/code-redis-wc.tar.zst /work/shared/data/code-redis-wc.tar.zst; do
        [ -f "$a" ] && { ARCHIVE=$a; break; }
    done
fi
[ -f "$ARCHIVE" ] || { echo "no series archive (set ARCHIVE)" >&2; exit 1; }
VERSIONS=${VERSIONS:-12}
RUNS=${RUNS:-5}
FIRST_RUNS=${FIRST_RUNS:-$RUNS}
ONE_FILE=${ONE_FILE:-'*/src/server.c'}
DROP_CACHES=${DROP_CACHES:-0}
KEEP_WORK=${WORK:+1}
RESTORE_DIR_GIVEN=${RESTORE_DIR:+1}
WORK=${WORK:-$(mktemp -d /tmp/tessera-defaults.XXXXXX)}
mkdir -p "$WORK"
RESTORE_DIR=${RESTORE_DIR:-$WORK}
mkdir -p "$RESTORE_DIR"
[ -n "$KEEP_WORK" ] || trap 'rm -rf "$WORK"' EXIT
[ -z "$RESTORE_DIR_GIVEN" ] || trap 'rm -rf "$RESTORE_DIR"/out-* "$RESTORE_DIR"/one-*; [ -n "$KEEP_WORK" ] || rm -rf "$WORK"' EXIT
# Real key derivation for `defaults`: no cheap test settings inherited.
unset TESSERA_KDF_MEMORY TESSERA_KDF_ITERATIONS TESSERA_INSECURE_KDF TESSERA_REPOSITORY
export TESSERA_PASSWORD=defaults-benchmark
# Sessions of the `login` configuration: never the user's runtime directory.
export TESSERA_SESSION_DIR=$WORK/sessions
BASELINE=${BASELINE:-$TESSERA}
BIN=$TESSERA
# Prefix of every command of the configuration being run.
PREFIX=()

# The versions, each unpacked once into $WORK/src/NNNN.
if [ ! -d "$WORK/src" ]; then
    mkdir -p "$WORK/packed" "$WORK/src"
    zstd -dc --long=31 "$ARCHIVE" | tar xf - -C "$WORK/packed"
    mapfile -t tars < <(find "$WORK/packed" -name 'v*.tar' | sort | head -n "$VERSIONS")
    i=0
    for t in "${tars[@]}"; do
        i=$((i + 1))
        mkdir -p "$WORK/src/$i"
        tar xf "$t" -C "$WORK/src/$i"
    done
    rm -rf "$WORK/packed"
fi
VERSIONS=$(find "$WORK/src" -mindepth 1 -maxdepth 1 | wc -l)

cold() {
    if [ "$DROP_CACHES" = 1 ]; then
        sync
        echo 3 >/proc/sys/vm/drop_caches
    fi
}

# timed NAME CMD...: runs CMD (output discarded), appends "seconds rss_kib
# cpu_seconds" to $WORK/m/$config.NAME. The wall time is taken to the
# microsecond around the command (/usr/bin/time gives hundredths, too
# coarse for commands of 0.05 s).
timed() {
    local name=$1 t0 t1
    shift
    cold
    t0=$EPOCHREALTIME
    /usr/bin/time -f '%e %M %U %S' -o "$WORK/t" "${PREFIX[@]}" "$@" >/dev/null 2>"$WORK/err" </dev/null ||
        { cat "$WORK/err" >&2; echo "failed: $*" >&2; exit 1; }
    t1=$EPOCHREALTIME
    # seconds, peak RSS KiB, CPU seconds (user + system)
    tail -1 "$WORK/t" | awk -v t0="$t0" -v t1="$t1" '{ printf "%.3f %s %s\n", t1 - t0, $2, $3 + $4 }' \
        >>"$WORK/m/$config.$name"
}

run_config() {
    local config=$1
    shift
    # Nothing is deleted until every configuration has run: on ext4 every
    # file created within a minute or so of many deletions pays a scan of
    # the freed inodes (fs/ext4/ialloc.c, recently_deleted), which made the
    # restores of whichever configuration ran after another's clean-up up
    # to 3x slower (scripts/tree-benchmark.py explains it).
    local repo=$WORK/repo-$config wc=$WORK/wc-$config
    "$BIN" init "$repo" "$@" >/dev/null
    if [ "$config" = login ]; then
        "$BIN" login "$repo" >/dev/null
        PREFIX=(env -u TESSERA_PASSWORD)
    fi
    mkdir -p "$wc"
    for i in $(seq 1 "$VERSIONS"); do
        rsync -a --delete "$WORK/src/$i/" "$wc/"
        timed backup "$BIN" backup "$repo" "$wc"
    done
    du -sb "$repo" | cut -f1 >"$WORK/m/$config.stored"
    for _ in $(seq 1 "$RUNS"); do
        timed rebackup "$BIN" backup "$repo" "$wc"
    done
    for r in $(seq 1 "$RUNS"); do
        timed restore "$BIN" restore "$repo" latest "$RESTORE_DIR/out-$config-$r"
    done
    # The restored tree holds the working copy's files (restore verifies
    # every chunk; this checks that the whole tree came back).
    [ "$(find "$RESTORE_DIR/out-$config-1" -type f | wc -l)" = "$(find "$wc" -type f | wc -l)" ] ||
        { echo "$config: the full restore has not the working copy's file count" >&2; exit 1; }
    for r in $(seq 1 "$RUNS"); do
        timed onefile "$BIN" restore "$repo" latest "$RESTORE_DIR/one-$config-$r" --include "$ONE_FILE"
        [ -n "$(find "$RESTORE_DIR/one-$config-$r" -type f -path "$ONE_FILE")" ] ||
            { echo "$config: one-file restore wrote no $ONE_FILE" >&2; exit 1; }
    done
    for _ in $(seq 1 "$RUNS"); do
        timed list "$BIN" list "$repo"
        timed ls "$BIN" ls "$repo" latest
    done
    PREFIX=()
    # First backups again, each of the first version into a new
    # repository: the first backup's median and spread.
    for r in $(seq 1 "$FIRST_RUNS"); do
        "$BIN" init "$WORK/first-$config-$r" "$@" >/dev/null
        if [ "$config" = login ]; then
            "$BIN" login "$WORK/first-$config-$r" >/dev/null
            PREFIX=(env -u TESSERA_PASSWORD)
        fi
        timed first "$BIN" backup "$WORK/first-$config-$r" "$WORK/src/1"
        PREFIX=()
    done
}

# A reused WORK's outputs of an earlier run (see run_config on deleting).
rm -rf "$WORK/m" "$WORK"/repo-* "$WORK"/first-* "$WORK"/wc-* "$RESTORE_DIR"/out-* "$RESTORE_DIR"/one-*
mkdir -p "$WORK/m"
run_config plain --encryption none --compression off
run_config defaults
# Defaults without the compression dictionary (FORMAT.md §7.8): what the
# dictionary saves, and what it costs in backup and restore time.
if [ "${NODICT:-1}" = 1 ]; then
    BIN=$BASELINE run_config nodict --compression-dictionary off
    BIN=$TESSERA
fi
if [ "${LOGIN:-1}" = 1 ]; then
    run_config login
fi

# stat FILE COLUMN: "median min max" of column COLUMN (1 seconds, 2 KiB,
# 3 CPU seconds).
stat() {
    awk -v c="$2" '{ print $c }' "$1" | sort -g |
        awk '{ a[NR] = $1 } END { m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; print m, a[1], a[NR] }'
}
total() { awk '{ s += $1 } END { print s }' "$1"; }
peak() { awk 'BEGIN { m = 0 } { if ($2 > m) m = $2 } END { printf "%.1f", m / 1024 }' "$1"; }

row() { # LABEL PLAIN DEFAULTS [SPREAD_PLAIN SPREAD_DEFAULTS]
    awk -v l="$1" -v p="$2" -v d="$3" -v sp="${4:-}" -v sd="${5:-}" \
        'BEGIN { printf "%-26s %12s %-15s %12s %-15s %7.2f\n", l, p, sp, d, sd, (p > 0 ? d / p : 0) }'
}
spread() { echo "$1" | awk '{ printf "(%s-%s)", $2, $3 }'; }
med() { echo "$1" | awk '{ print $1 }'; }

load=$(cut -d' ' -f1-3 /proc/loadavg)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
echo "series: $(basename "$ARCHIVE"), $VERSIONS versions, $(du -sb "$WORK/src" | cut -f1) bytes unpacked; RUNS=$RUNS; DROP_CACHES=$DROP_CACHES"
echo "machine: $cpu, $(nproc) CPUs, load $load; binary $TESSERA; restores into $RESTORE_DIR"
printf '%-26s %12s %-15s %12s %-15s %7s\n' "" "plain" "" "defaults" "" "d/p"
row "stored MiB" "$(awk '{ printf "%.2f", $1 / 1048576 }' "$WORK/m/plain.stored")" \
    "$(awk '{ printf "%.2f", $1 / 1048576 }' "$WORK/m/defaults.stored")"
p=$(stat "$WORK/m/plain.first" 1)
d=$(stat "$WORK/m/defaults.first" 1)
row "first backup s" "$(med "$p")" "$(med "$d")" "$(spread "$p")" "$(spread "$d")"
row "all $VERSIONS backups s" "$(total "$WORK/m/plain.backup")" "$(total "$WORK/m/defaults.backup")"
for name in rebackup restore onefile list ls; do
    case $name in
        rebackup) label="unchanged re-backup s" ;;
        restore) label="full restore s" ;;
        onefile) label="one-file restore s" ;;
        list) label="list s" ;;
        ls) label="ls s" ;;
    esac
    p=$(stat "$WORK/m/plain.$name" 1)
    d=$(stat "$WORK/m/defaults.$name" 1)
    row "$label" "$(med "$p")" "$(med "$d")" "$(spread "$p")" "$(spread "$d")"
done
# CPU time (user + system): what the commands cost when the machine is
# shared, where wall times mostly measure the wait for a core.
for name in rebackup restore onefile list ls; do
    p=$(stat "$WORK/m/plain.$name" 3)
    d=$(stat "$WORK/m/defaults.$name" 3)
    row "CPU s, $name" "$(med "$p")" "$(med "$d")" "$(spread "$p")" "$(spread "$d")"
done
p=$(stat "$WORK/m/plain.first" 3)
d=$(stat "$WORK/m/defaults.first" 3)
row "CPU s, first backup" "$(med "$p")" "$(med "$d")" "$(spread "$p")" "$(spread "$d")"
row "CPU s, all backups" "$(awk '{ s += $3 } END { print s }' "$WORK/m/plain.backup")" \
    "$(awk '{ s += $3 } END { print s }' "$WORK/m/defaults.backup")"
for name in backup rebackup restore onefile list ls; do
    row "peak RSS MiB, $name" "$(peak "$WORK/m/plain.$name")" "$(peak "$WORK/m/defaults.$name")"
done
if [ -f "$WORK/m/nodict.stored" ]; then
    echo
    echo "compression dictionary: defaults (dictionary) vs --compression-dictionary off, same run"
    printf '%-26s %12s %-15s %12s %-15s %7s\n' "" "no dict" "" "dict" "" "d/n"
    row "stored MiB" "$(awk '{ printf "%.2f", $1 / 1048576 }' "$WORK/m/nodict.stored")" \
        "$(awk '{ printf "%.2f", $1 / 1048576 }' "$WORK/m/defaults.stored")"
    n=$(stat "$WORK/m/nodict.first" 1)
    d=$(stat "$WORK/m/defaults.first" 1)
    row "first backup s" "$(med "$n")" "$(med "$d")" "$(spread "$n")" "$(spread "$d")"
    row "all $VERSIONS backups s" "$(total "$WORK/m/nodict.backup")" "$(total "$WORK/m/defaults.backup")"
    for name in rebackup restore onefile; do
        n=$(stat "$WORK/m/nodict.$name" 1)
        d=$(stat "$WORK/m/defaults.$name" 1)
        row "$name s" "$(med "$n")" "$(med "$d")" "$(spread "$n")" "$(spread "$d")"
    done
fi
if [ -f "$WORK/m/login.stored" ]; then
    echo
    echo "defaults after \`tessera login\` (no key derivation per command) vs plain, same run"
    printf '%-26s %12s %-15s %12s %-15s %7s\n' "" "plain" "" "login" "" "l/p"
    for name in first rebackup restore onefile list ls; do
        p=$(stat "$WORK/m/plain.$name" 1)
        d=$(stat "$WORK/m/login.$name" 1)
        row "${name/first/first backup} s" "$(med "$p")" "$(med "$d")" "$(spread "$p")" "$(spread "$d")"
    done
    for name in first rebackup restore onefile list; do
        p=$(stat "$WORK/m/plain.$name" 3)
        d=$(stat "$WORK/m/login.$name" 3)
        row "CPU s, ${name/first/first backup}" "$(med "$p")" "$(med "$d")" "$(spread "$p")" "$(spread "$d")"
    done
    for name in backup rebackup restore onefile list ls; do
        row "peak RSS MiB, $name" "$(peak "$WORK/m/plain.$name")" "$(peak "$WORK/m/login.$name")"
    done
    echo "one-file restore, login - plain: $(awk -v d="$(med "$(stat "$WORK/m/login.onefile" 1)")" \
        -v p="$(med "$(stat "$WORK/m/plain.onefile" 1)")" 'BEGIN { printf "%+.3f s", d - p }')"
fi
echo "one-file restore, defaults - plain: $(awk -v d="$(med "$(stat "$WORK/m/defaults.onefile" 1)")" \
    -v p="$(med "$(stat "$WORK/m/plain.onefile" 1)")" 'BEGIN { printf "%+.3f s", d - p }')"
