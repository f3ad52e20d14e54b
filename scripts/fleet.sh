#!/usr/bin/env bash
# The fleet scenario of issue 40 (docs/FORMAT.md §13.3): N clients (one
# process each) back up at once into ONE repository, their data sharing a
# part (an OS and toolchains) and each having its own. Prints
#   - bytes stored by the N clients in one repository beside the sum of N
#     separate repositories (one per client) of the same data;
#   - aggregate throughput of the N concurrent clients beside one client's;
# and verifies every committed backup (restore byte for byte, check --read-data).
#
#   scripts/fleet.sh [CLIENTS] [MB_PER_CLIENT] [SHARED_PERCENT]
#       defaults: 8 clients, 32 MB each, 60 % shared
#   FLEET_REPO=s3:http://HOST:PORT/BUCKET/prefix scripts/fleet.sh   # the shared
#       repository on an S3 server (scripts/s3-server.sh; the separate
#       repositories stay local)
#   TESSERA=path/to/tessera   (default: the newer of target/release/tessera and target/debug/tessera)
#
# Not run in CI: a measurement. Figures depend on the machine's load.
set -euo pipefail
cd "$(dirname "$0")/.."
CLIENTS=${1:-8}
MB=${2:-32}
SHARED=${3:-60}
BIN=${TESSERA:-}
if [[ -z $BIN ]]; then
    # The newer of the release and debug builds.
    BIN=$(ls -t target/release/tessera target/debug/tessera 2>/dev/null | head -1)
fi
[[ -x $BIN ]] || { echo "build tessera first (cargo build --release -p tessera-cli)" >&2; exit 1; }
export TESSERA_PASSWORD=${TESSERA_PASSWORD:-fleet-password}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Client data: the shared part (same seed for everyone) then its own part.
bytes=$((MB * 1000000))
shared=$((bytes * SHARED / 100))
for c in $(seq 0 $((CLIENTS - 1))); do
    python3 - "$WORK/client$c" "$shared" "$((bytes - shared))" "$c" <<'EOF'
import random, sys
path, shared, own, client = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with open(path, "wb") as f:
    f.write(random.Random(1).randbytes(shared))
    f.write(random.Random(1000 + client).randbytes(own))
EOF
done

now() { date +%s.%N; }
stored() { # bytes of containers of the repository $1 (stats --json)
    "$BIN" stats --json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["physical_bytes"])'
}

# One client alone, into a fresh repository.
"$BIN" init -q "$WORK/alone" >/dev/null
t0=$(now)
"$BIN" backup -q "$WORK/alone" - <"$WORK/client0" >/dev/null
t1=$(now)
one=$(python3 -c "print($bytes / 1e6 / ($t1 - $t0))")

# N separate repositories, one client each.
separate=0
for c in $(seq 0 $((CLIENTS - 1))); do
    "$BIN" init -q "$WORK/sep$c" >/dev/null
    "$BIN" backup -q "$WORK/sep$c" - <"$WORK/client$c" >/dev/null
    separate=$((separate + $(stored "$WORK/sep$c")))
done

# N clients at once into one repository.
REPO=${FLEET_REPO:-$WORK/fleet}
"$BIN" init -q "$REPO" >/dev/null
t0=$(now)
pids=()
for c in $(seq 0 $((CLIENTS - 1))); do
    "$BIN" backup --json "$REPO" - <"$WORK/client$c" >"$WORK/out$c" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
t1=$(now)
aggregate=$(python3 -c "print($CLIENTS * $bytes / 1e6 / ($t1 - $t0))")
together=$(stored "$REPO")

# Every committed backup restores byte for byte; the repository is clean.
for c in $(seq 0 $((CLIENTS - 1))); do
    id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$WORK/out$c")
    "$BIN" restore -q "$REPO" "$id" - | cmp - "$WORK/client$c"
done
"$BIN" check -q --read-data "$REPO"
# Clients that stored the same new chunk at once each stored a copy; gc
# folds them (FORMAT.md §16.2 step 1b). Every backup must still restore.
duplicates=$("$BIN" check --json "$REPO" | python3 -c 'import json,sys; print(json.load(sys.stdin)["duplicate_bytes"])')
"$BIN" gc -q "$REPO" >/dev/null
folded=$(stored "$REPO")
left=$("$BIN" check --json --read-data "$REPO" | python3 -c 'import json,sys; print(json.load(sys.stdin)["duplicate_chunks"])')
for c in $(seq 0 $((CLIENTS - 1))); do
    id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$WORK/out$c")
    "$BIN" restore -q "$REPO" "$id" - | cmp - "$WORK/client$c"
done

python3 - "$CLIENTS" "$MB" "$SHARED" "$together" "$separate" "$aggregate" "$one" "$duplicates" "$folded" "$left" <<'EOF'
import sys
n, mb, sh, together, separate, aggregate, one, duplicates, folded, left = sys.argv[1:]
together, separate, aggregate, one = int(together), int(separate), float(aggregate), float(one)
duplicates, folded = int(duplicates), int(folded)
print(f"fleet: {n} clients x {mb} MB, {sh} % shared")
print(f"stored in one repository: {together/1e6:.1f} MB; sum of {n} separate repositories: "
      f"{separate/1e6:.1f} MB; ratio {together/separate:.3f} (goal <= 0.5)")
print(f"after gc (folds {duplicates/1e6:.1f} MB of copies clients stored at once; {left} left): "
      f"{folded/1e6:.1f} MB; ratio {folded/separate:.3f} (goal <= 0.5)")
print(f"aggregate throughput of {n} concurrent clients: {aggregate:.1f} MB/s; one client alone: "
      f"{one:.1f} MB/s; ratio {aggregate/one:.2f} (goal >= 0.9)")
print(f"verified: {n} backups restored byte for byte, check --read-data clean")
EOF
