#!/usr/bin/env bash
# Throughput of backups and restores to a loopback S3 server (versitygw),
# as ratios to the same data on a local repository and to the server's raw
# PUT/GET throughput of 4 MiB objects through the same client stack
# (the engine's example s3-raw: PUTs from as many threads as the backup's container
# writers, GETs from as many as the restore's container readers: both
# --connections), all measured in this run: median of RUNS (default 3) runs
# each, with min–max spread. Beside each throughput, the client's processor
# time (user + system seconds per GiB) and the server's (when its PID is known), which
# a machine shared with other work disturbs less than the wall clock.
#
#   scripts/s3-benchmark.sh [SIZE_MIB] [RUNS]      # default 512 MiB, 3 runs
#
# CONNECTIONS=N sets `--connections` of the backups and restores and the raw
# baseline's threads (default: Tessera's default, twice the processors
# from 4 to 16).
# TESSERA_BIN=path uses that binary instead of building the release one;
# RAW=path the raw baseline (else the engine's example s3-raw is built);
# with TESSERA_TEST_S3 set (scripts/s3-server.sh start), that server is used
# instead of a new one.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MIB=${1:-512}
RUNS=${2:-3}
CONNECTIONS=${CONNECTIONS:-}
conn=()
[[ -n $CONNECTIONS ]] && conn=(--connections "$CONNECTIONS")
export PATH=$PATH:/usr/local/go/bin
if [[ -n ${TESSERA_BIN:-} ]]; then
    T=$(realpath "$TESSERA_BIN")
else
    cargo build --release -q -p tessera-cli
    T=$PWD/target/release/tessera
fi
# The raw baseline is an example of the engine crate (not installed with
# the CLI): built here unless RAW names one.
if [[ -z ${RAW:-} ]]; then
    cargo build --release -q -p tessera --example s3-raw
    RAW=$PWD/target/release/examples/s3-raw
fi
WORK=$(mktemp -d)
if [[ -n ${TESSERA_TEST_S3:-} ]]; then
    # A server is running already (its environment is set): use it.
    trap 'rm -rf "$WORK"' EXIT
else
    # Stopped at the end only if this run started it (a server already
    # running, say for tests, makes `start` fail and is left alone).
    trap 'rm -rf "$WORK"' EXIT
    env=$(scripts/s3-server.sh start)
    trap 'scripts/s3-server.sh stop; rm -rf "$WORK"' EXIT
    eval "$env"
fi
export TESSERA_PASSWORD=bench TESSERA_KDF_MEMORY=64 TESSERA_KDF_ITERATIONS=1 TESSERA_INSECURE_KDF=1

head -c $((SIZE_MIB << 20)) /dev/urandom >"$WORK/data"

# Runs a command; writes its wall-clock seconds and its processor seconds
# (user + system, its children included) to the file $1.
TIMER='import resource, subprocess, sys, time
start = time.monotonic()
code = subprocess.run(sys.argv[2:]).returncode
wall = time.monotonic() - start
u = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write(f"{wall} {u.ru_utime + u.ru_stime}\n")
sys.exit(code)'
timed() { python3 -c "$TIMER" "$@"; }
rate() { python3 -c "print(f'{$SIZE_MIB * 1.048576 / $1:.1f}')"; }
per_gib() { python3 -c "print(f'{$1 * 1024 / $SIZE_MIB:.2f}')"; }

# The server's processor seconds so far (user + system, all its threads),
# or nothing when its PID is unknown (a server this script did not start
# and scripts/s3-server.sh does not know).
SERVER_PID=$(cat .tools/s3/pid 2>/dev/null || true)
server_cpu() {
    [[ -n $SERVER_PID && -r /proc/$SERVER_PID/stat ]] || return 0
    python3 -c "import os,sys; f=open('/proc/$SERVER_PID/stat').read().rsplit(')',1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf('SC_CLK_TCK'))"
}
# Adds the server's processor seconds per GiB since $2 to the column $1.
server_since() {
    local now
    now=$(server_cpu)
    [[ -n $now && -n $2 ]] && S[$1]+="$(per_gib "$(python3 -c "print($now - $2)")") "
    return 0
}

# The repositories on the store go below a prefix of this run's own (a
# server already running may hold an earlier run's).
PREFIX=bench-$(date +%s)-$$
declare -A R C S
for run in $(seq "$RUNS"); do
    # Raw PUT / GET of as many bytes as 4 MiB objects (the containers'
    # size) through the same client stack (the engine's example s3-raw: the S3 backend
    # on OpenDAL), from --connections threads each (0: the default), as
    # the backup's container writers and the restore's container readers.
    s0=$(server_cpu)
    raw=$("$RAW" "$TESSERA_TEST_S3/$PREFIX/raw$run" "$SIZE_MIB" 4 "${CONNECTIONS:-0}" "${CONNECTIONS:-0}")
    for op in put get; do
        read -r mbs cpu < <(sed -n "s/^$op //p" <<<"$raw")
        R[raw_$op]+="$mbs "
        C[raw_$op]+="$cpu "
    done
    # PUTs and GETs of one run together (halved: a GiB each way).
    now=$(server_cpu)
    [[ -n $now && -n $s0 ]] && S[raw_put_get]+="$(per_gib "$(python3 -c "print(($now - $s0) / 2)")") "
    for kind in local s3; do
        case $kind in
            local) repo=$WORK/repo$run ;;
            s3) repo=$TESSERA_TEST_S3/$PREFIX/repo$run ;;
        esac
        "$T" init --encryption none "$repo" >/dev/null
        s0=$(server_cpu)
        timed "$WORK/t" "$T" "${conn[@]}" backup "$repo" - <"$WORK/data" >/dev/null
        [[ $kind == s3 ]] && server_since s3_backup "$s0"
        read -r wall cpu <"$WORK/t"
        R[${kind}_backup]+="$(rate "$wall") "
        C[${kind}_backup]+="$(per_gib "$cpu") "
        sync
        s0=$(server_cpu)
        timed "$WORK/t" "$T" "${conn[@]}" restore "$repo" latest - | cat >/dev/null
        [[ $kind == s3 ]] && server_since s3_restore "$s0"
        read -r wall cpu <"$WORK/t"
        R[${kind}_restore]+="$(rate "$wall") "
        C[${kind}_restore]+="$(per_gib "$cpu") "
    done
    rm -rf "$WORK/repo$run"
done

# The median (min-max) of the numbers read, printed with format $1.
median() { tr ' ' '\n' | grep . | sort -g | awk -v f="${1:-%.1f}" '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf f " (" f "-" f ")", m, a[1], a[NR]}'; }
med() { echo "${R[$1]}" | median | cut -d' ' -f1; }
echo "$SIZE_MIB MiB of random data, $RUNS runs, --connections ${CONNECTIONS:-default}; median (min-max); CPU: $(lscpu | sed -n 's/Model name: *//p') ($(nproc) processors), load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-14s %-22s %-22s %s\n' "" "MB/s" "client CPU s/GiB" "server CPU s/GiB"
for k in raw_put raw_get local_backup local_restore s3_backup s3_restore; do
    srv=${S[$k]:-}
    [[ $k == raw_put || $k == raw_get ]] && srv=${S[raw_put_get]:-}
    [[ -n $srv ]] && srv="$(echo "$srv" | median %.2f)"
    [[ $k == raw_* && -n $srv ]] && srv="$srv (PUT+GET)/2"
    printf '%-14s %-22s %-22s %s\n' "$k" "$(echo "${R[$k]}" | median)" "$(echo "${C[$k]}" | median %.2f)" "$srv"
done
ratio() { python3 -c "print(f'{$(med "$1") / $(med "$2"):.2f}')"; }
echo "S3 backup  / raw PUT:       $(ratio s3_backup raw_put)   (target >= 0.7)"
echo "S3 restore / raw GET:       $(ratio s3_restore raw_get)   (target >= 0.7)"
echo "S3 backup  / local backup:  $(ratio s3_backup local_backup)"
echo "S3 restore / local restore: $(ratio s3_restore local_restore)"
# Where client and server share the processors, a transfer cannot run
# faster than all of them busy with its processor seconds: the restore's
# bound as a ratio to raw GET's measured speed.
if [[ -n ${S[s3_restore]:-} ]]; then
    cmed() { echo "$1" | median %.4f | cut -d' ' -f1; }
    echo "S3 restore bound by CPU:    $(python3 -c "print(f'{$(nproc) * 1073.741824 / ($(cmed "${C[s3_restore]}") + $(cmed "${S[s3_restore]}")) / $(med raw_get):.2f}')")   (all $(nproc) processors busy with the restore's client + server seconds per GiB, over raw GET)"
fi
