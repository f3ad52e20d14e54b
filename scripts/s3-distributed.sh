#!/usr/bin/env bash
# A distributed S3 deployment on this machine: MinIO in distributed mode,
# 4 server processes x 2 drives each on loopback ports (erasure coding over
# 8 drives), several sources backed up concurrently into one repository
# while one server process is killed mid-backup and later restarted; then
# every committed backup is restored and compared, and `check --read-data`
# must pass. Not part of CI.
#
#   scripts/s3-distributed.sh [ROUNDS]      # default 3 rounds
#   scripts/s3-distributed.sh fleet [CLIENTS] [MB] [SHARED%]
#       the fleet scenario (scripts/fleet.sh, defaults 8 x 32 MB, 60 %
#       shared) on the cluster: the clients back up through nodes 0..2 at
#       once, node 3 is killed FLEET_DURING_AFTER seconds (default 1) after
#       they start and restarted once they end (FLEET_KILL=0: no kill);
#       prints fleet.sh's figures, every committed backup verified
#

# MINIO=path uses that MinIO binary; otherwise .tools/bin/minio, built once
# from the Go module proxy (`go install github.com/minio/minio@latest`,
# several minutes). TESSERA_BIN=path uses that tessera binary instead of
# building the release one. Prints the counts at the end; exits non-zero if
# any committed backup is lost or restores wrong.
set -euo pipefail
cd "$(dirname "$0")/.."
FLEET=
if [[ ${1:-} == fleet ]]; then
    FLEET=1
    shift
fi
ROUNDS=${1:-3}
CLIENTS=${CLIENTS:-4}
export PATH=$PATH:/usr/local/go/bin
TOOLS=$PWD/.tools
MINIO=${MINIO:-$TOOLS/bin/minio}
if [[ ! -x $MINIO ]]; then
    echo "building MinIO into $TOOLS/bin (once; several minutes)" >&2
    GOBIN=$TOOLS/bin go install github.com/minio/minio@latest >&2
fi
if [[ -n ${TESSERA_BIN:-} ]]; then
    T=$(realpath "$TESSERA_BIN")
else
    cargo build --release -q -p tessera-cli
    T=$PWD/target/release/tessera
fi

# The nodes listen on loopback, unless MinIO thinks it runs in a container
# (/.dockerenv, /run/.containerenv, Kubernetes): there it refuses endpoints
# that resolve to loopback (it waits for them "to resolve to a valid IP"),
# so they listen on this machine's first non-loopback IPv4 address.
# MINIO_ADDR=IP chooses the address.
ADDR=${MINIO_ADDR:-127.0.0.1}
if [[ -z ${MINIO_ADDR:-} && (-e /.dockerenv || -e /run/.containerenv || -n ${KUBERNETES_SERVICE_HOST:-}) ]]; then
    ADDR=$(hostname -I | tr ' ' '\n' | grep -m1 -E '^[0-9]+(\.[0-9]+){3}$' || echo 127.0.0.1)
fi
WORK=$(mktemp -d)
declare -a PIDS PORTS
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("'"$ADDR"'", 0)); print(s.getsockname()[1])'
}
for i in 0 1 2 3; do PORTS[i]=$(free_port); done
export MINIO_ROOT_USER=tessera-dist MINIO_ROOT_PASSWORD=tessera-dist-secret
# The drives are directories on the root file system, which MinIO takes
# offline unless it runs in CI/CD mode.
export MINIO_CI_CD=1
# All 8 drives listed one by one: one server pool, one erasure set over the
# 4 nodes (an argument with `{1...2}` would be a pool of its own, which a
# killed node takes down whole).
ENDPOINTS=()
for i in 0 1 2 3; do
    ENDPOINTS+=("http://$ADDR:${PORTS[i]}$WORK/n$i/d1" "http://$ADDR:${PORTS[i]}$WORK/n$i/d2")
done
# Each node is started by a script of its own ($WORK/start<i>.sh, which
# records the PID in $WORK/pid<i>), so that the fleet's hooks can restart one.
for i in 0 1 2 3; do
    mkdir -p "$WORK/n$i/d1" "$WORK/n$i/d2"
    {
        printf '%q ' "$MINIO" server --quiet --address "$ADDR:${PORTS[i]}" "${ENDPOINTS[@]}"
        printf '>>%q 2>&1 &\necho $! >%q\n' "$WORK/minio$i.log" "$WORK/pid$i"
    } >"$WORK/start$i.sh"
done
start_node() {
    bash "$WORK/start$1.sh"
    PIDS[$1]=$(cat "$WORK/pid$1")
}
stop_all() {
    local f
    for f in "$WORK"/pid*; do [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null || true; done
    for f in "$WORK"/pid*; do
        [[ -f $f ]] || continue
        while kill -0 "$(cat "$f")" 2>/dev/null; do sleep 0.1; done
    done
}
trap 'stop_all; rm -rf "$WORK"' EXIT
for i in 0 1 2 3; do start_node "$i"; done

# Wait until the cluster has formed: every node answers its cluster health
# endpoint (200 once it has write quorum), for up to 5 minutes.
cluster_up() {
    local i
    for i in "$@"; do
        curl -sf -o /dev/null "http://$ADDR:${PORTS[i]}/minio/health/cluster" || return 1
    done
}
wait_cluster() {
    local _
    for _ in $(seq 1500); do
        cluster_up "$@" && return 0
        sleep 0.2
    done
    echo "the MinIO cluster did not form (logs in $WORK/minio*.log):" >&2
    tail -5 "$WORK"/minio*.log >&2
    return 1
}
wait_cluster 0 1 2 3
# The bucket (any node serves it).
export AWS_ACCESS_KEY_ID=$MINIO_ROOT_USER AWS_SECRET_ACCESS_KEY=$MINIO_ROOT_PASSWORD
export AWS_DEFAULT_REGION=us-east-1
E=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
curl -sf -X PUT -H "x-amz-content-sha256: $E" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
    --aws-sigv4 "aws:amz:us-east-1:s3" "http://$ADDR:${PORTS[0]}/tessera" >/dev/null
# Clients talk to nodes 0..2; node 3 is the one killed.
REPO_ON() { echo "s3:http://$ADDR:${PORTS[$1]}/tessera/dist"; }
if [[ -n $FLEET ]]; then
    export FLEET_REPOS="$(REPO_ON 0)-fleet $(REPO_ON 1)-fleet $(REPO_ON 2)-fleet" FLEET_MAY_FAIL=1
    if [[ ${FLEET_KILL:-1} != 0 ]]; then
        echo "node 3 is killed ${FLEET_DURING_AFTER:-1} s after the clients start, restarted after them" >&2
        export FLEET_DURING="kill -9 \$(cat $WORK/pid3)"
        health=http://$ADDR:${PORTS[3]}/minio/health/cluster
        export FLEET_AFTER="bash $WORK/start3.sh; for _ in \$(seq 1500); do \
curl -sf -o /dev/null $health && exit 0; sleep 0.2; done; echo node 3 did not rejoin >&2; exit 1"
    fi
    TESSERA=$T scripts/fleet.sh "$@"
    exit
fi
export TESSERA_PASSWORD=dist TESSERA_KDF_MEMORY=64 TESSERA_KDF_ITERATIONS=1 TESSERA_INSECURE_KDF=1
"$T" init "$(REPO_ON 0)" >/dev/null

# Sources: one directory per client, changed a little every round.
head -c $((4 << 20)) /dev/urandom >"$WORK/shared"
for c in $(seq "$CLIENTS"); do
    mkdir -p "$WORK/src$c"
    head -c $((24 << 20)) /dev/urandom >"$WORK/src$c/big"
    cp "$WORK/shared" "$WORK/src$c/shared"
done

committed=0 failed=0
for round in $(seq "$ROUNDS"); do
    for c in $(seq "$CLIENTS"); do
        head -c $((2 << 20)) /dev/urandom >"$WORK/src$c/r$round"
    done
    # The clients back up at once (serialized by the repository's lock:
    # --wait), through different nodes; node 3 dies mid-way.
    pids=()
    for c in $(seq "$CLIENTS"); do
        "$T" backup --wait 10m --json "$(REPO_ON $(((c - 1) % 3)))" "$WORK/src$c" \
            >"$WORK/out.$round.$c" 2>"$WORK/err.$round.$c" &
        pids+=($!)
    done
    sleep 2
    echo "round $round: killing MinIO node 3 (pid ${PIDS[3]}) mid-backup" >&2
    kill -9 "${PIDS[3]}"
    for i in "${!pids[@]}"; do
        if wait "${pids[$i]}"; then
            committed=$((committed + 1))
        else
            failed=$((failed + 1))
            echo "  a backup failed (cleanly, it must): $(tail -1 "$WORK/err.$round.$((i + 1))")" >&2
        fi
    done
    echo "round $round: restarting node 3" >&2
    start_node 3
    wait_cluster 0 1 2 3
done

# Every committed backup restores identically (compared against the
# source's files as they were: each round only added files).
ids=$("$T" list --json "$(REPO_ON 1)" | python3 -c 'import json,sys; print(" ".join(str(b["id"]) for b in json.load(sys.stdin)))')
listed=$(wc -w <<<"$ids")
lost=0
for id in $ids; do
    out=$WORK/restore$id
    "$T" restore "$(REPO_ON 2)" "$id" "$out" >/dev/null
    src=$(find "$out" -mindepth 1 -maxdepth 6 -type d -name 'src*' | head -1)
    name=$(basename "$src")
    for f in "$src"/*; do
        cmp -s "$f" "$WORK/$name/$(basename "$f")" || { echo "backup $id: $f differs" >&2; lost=$((lost + 1)); }
    done
    rm -rf "$out"
done
"$T" check --read-data "$(REPO_ON 0)" >"$WORK/check" || { cat "$WORK/check" >&2; lost=$((lost + 1)); }
echo "distributed MinIO (4 nodes x 2 drives), $ROUNDS rounds x $CLIENTS clients, node 3 killed mid-backup every round:"
echo "  backups committed: $committed, failed cleanly: $failed, listed: $listed, lost or wrong: $lost"
[[ $lost -eq 0 && $listed -eq $committed ]]
