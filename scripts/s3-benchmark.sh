#!/usr/bin/env bash
# Throughput of backups and restores to a loopback S3 server (versitygw),
# as ratios to the same data on a local repository and to the server's raw
# PUT/GET throughput of 4 MiB objects (curl, as many in parallel as the
# backup's container writers), all measured in this run: median of RUNS
# (default 3) runs each, with min–max spread.
#
#   scripts/s3-benchmark.sh [SIZE_MIB] [RUNS]      # default 512 MiB, 3 runs
#
# TESSERA_BIN=path uses that binary instead of building the release one.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MIB=${1:-512}
RUNS=${2:-3}
PAR=${PAR:-4}
export PATH=$PATH:/usr/local/go/bin
if [[ -n ${TESSERA_BIN:-} ]]; then
    T=$(realpath "$TESSERA_BIN")
else
    cargo build --release -q -p tessera-cli
    T=$PWD/target/release/tessera
fi
WORK=$(mktemp -d)
trap 'scripts/s3-server.sh stop; rm -rf "$WORK"' EXIT
eval "$(scripts/s3-server.sh start)"
PORT=${TESSERA_TEST_S3#s3:http://127.0.0.1:}
PORT=${PORT%%/*}
URL=http://127.0.0.1:$PORT/tessera
export TESSERA_PASSWORD=bench TESSERA_KDF_MEMORY=64 TESSERA_KDF_ITERATIONS=1

head -c $((SIZE_MIB << 20)) /dev/urandom >"$WORK/data"
split -b 4M -d -a 5 "$WORK/data" "$WORK/obj."
ls "$WORK"/obj.* >"$WORK/objects"

now() { date +%s.%N; }
mbps() { python3 -c "print(f'{$SIZE_MIB * 1.048576 / ($2 - $1):.1f}')"; }
put_one() {
    local f=$1 sum
    sum=$(sha256sum "$f" | cut -d' ' -f1)
    curl -sf -X PUT -H "x-amz-content-sha256: $sum" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
        --aws-sigv4 "aws:amz:us-east-1:s3" --data-binary "@$f" "$URL/raw$2/$(basename "$f")" >/dev/null
}
get_one() {
    curl -sf -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
        --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" --aws-sigv4 "aws:amz:us-east-1:s3" \
        "$URL/raw$2/$(basename "$1")" -o /dev/null
}
export -f put_one get_one
export URL

declare -A R
for run in $(seq "$RUNS"); do
    # Raw PUT / GET of the same bytes as 4 MiB objects, PAR at a time.
    s=$(now); xargs -P "$PAR" -I{} bash -c "put_one {} $run" <"$WORK/objects"; e=$(now)
    R[raw_put]+="$(mbps "$s" "$e") "
    s=$(now); xargs -P "$PAR" -I{} bash -c "get_one {} $run" <"$WORK/objects"; e=$(now)
    R[raw_get]+="$(mbps "$s" "$e") "
    for kind in local s3; do
        case $kind in
            local) repo=$WORK/repo$run ;;
            s3) repo=$TESSERA_TEST_S3/repo$run ;;
        esac
        "$T" init --encryption none "$repo" >/dev/null
        s=$(now); "$T" backup "$repo" "$WORK/data" >/dev/null; e=$(now)
        R[${kind}_backup]+="$(mbps "$s" "$e") "
        sync
        s=$(now); "$T" restore "$repo" latest - | cat >/dev/null; e=$(now)
        R[${kind}_restore]+="$(mbps "$s" "$e") "
    done
    rm -rf "$WORK/repo$run"
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.1f (%.1f-%.1f)", m, a[1], a[NR]}'; }
med() { echo "${R[$1]}" | median | cut -d' ' -f1; }
echo "$SIZE_MIB MiB of random data, $RUNS runs, MB/s median (min-max); CPU: $(lscpu | sed -n 's/Model name: *//p')"
for k in raw_put raw_get local_backup local_restore s3_backup s3_restore; do
    printf '%-14s %s\n' "$k" "$(echo "${R[$k]}" | median)"
done
ratio() { python3 -c "print(f'{$(med "$1") / $(med "$2"):.2f}')"; }
echo "S3 backup  / raw PUT:       $(ratio s3_backup raw_put)   (target >= 0.7)"
echo "S3 restore / raw GET:       $(ratio s3_restore raw_get)   (target >= 0.7)"
echo "S3 backup  / local backup:  $(ratio s3_backup local_backup)"
echo "S3 restore / local restore: $(ratio s3_restore local_restore)"
