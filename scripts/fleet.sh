#!/usr/bin/env bash
# The fleet scenario of issue 40 (docs/FORMAT.md §13.3): N clients (one
# process each) back up at once into ONE repository, their data sharing a
# part (an OS and toolchains) and each having its own. Prints
#   - bytes stored by the N clients in one repository beside the sum of N
#     separate repositories (one per client) of the same data, before and
#     after a gc (which folds the copies clients running at once both stored);
#   - aggregate throughput of the N concurrent clients beside one client's
#     (alone, into a fresh repository of the same kind), with the CPU
#     seconds each run took, the load average, and the clients' own stage
#     timings (`backup --json`: seconds in the commit stage, which includes
#     waiting for the commit lock);
# and verifies every committed backup (restore byte for byte, check
# --read-data). A client that fails (FLEET_MAY_FAIL=1: a server killed under
# it) is counted and its backup not expected; otherwise any failure fails.
#
#   scripts/fleet.sh [CLIENTS] [MB_PER_CLIENT] [SHARED_PERCENT]
#       defaults: 8 clients, 32 MB each, 60 % shared
#   FLEET_REPO=s3:http://HOST:PORT/BUCKET/prefix scripts/fleet.sh
#       the shared repository, and the one client alone (FLEET_REPO-alone),
#       on an S3 server (scripts/s3-server.sh start prints the environment;
#       the N separate repositories stay local: their bytes do not depend
#       on where they are)
#   FLEET_REPOS="s3:… s3:…"   the same repository through several endpoints
#       (the nodes of a cluster): client i uses the (i mod k)-th
#   FLEET_DURING=CMD FLEET_DURING_AFTER=SECONDS   runs CMD (bash -c) that
#       many seconds (default 1) after the N clients started, e.g. kill a
#       server; FLEET_AFTER=CMD runs once they all ended (restart it)
#   TESSERA=path/to/tessera   (default: the newer of target/release/tessera and target/debug/tessera)
#   FLEET_KEEP=1   keeps the work directory (printed)
#
# scripts/s3-distributed.sh fleet runs this on a 4-node MinIO cluster with a
# node killed mid-run and restarted. Not run in CI: a measurement. Figures
# depend on the machine's load, which is printed.
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
BIN=$(realpath "$BIN")
export TESSERA_PASSWORD=${TESSERA_PASSWORD:-fleet-password}
WORK=$(mktemp -d)
if [[ -n ${FLEET_KEEP:-} ]]; then
    echo "work directory: $WORK" >&2
else
    trap 'rm -rf "$WORK"' EXIT
fi

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

stored() { # bytes of containers of the repository $1 (stats --json)
    "$BIN" stats --json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["physical_bytes"])'
}

# Runs `backup --json` of client i's data into repository i mod k of the
# arguments, all clients at once (client 0 only with --one), and writes a
# JSON summary: wall seconds, CPU seconds of the clients (user + system),
# load average before and after, and per client its exit status and output.
cat >"$WORK/run.py" <<'EOF'
import json, os, resource, subprocess, sys, time
bin_, work, clients, during, during_after = sys.argv[1:6]
repos = sys.argv[6:]
clients = int(clients)
load0 = os.getloadavg()
before = resource.getrusage(resource.RUSAGE_CHILDREN)
t0 = time.monotonic()
procs = []
for c in range(clients):
    out = open(f"{work}/out{c}", "wb")
    err = open(f"{work}/err{c}", "wb")
    procs.append(subprocess.Popen([bin_, "backup", "--json", repos[c % len(repos)], "-"],
                                  stdin=open(f"{work}/client{c}", "rb"), stdout=out, stderr=err))
hook = None
if during:
    time.sleep(float(during_after))
    hook = subprocess.run(["bash", "-c", during])
codes = [p.wait() for p in procs]
wall = time.monotonic() - t0
after = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
runs = []
for c, code in enumerate(codes):
    v = None
    if code == 0:
        v = json.load(open(f"{work}/out{c}"))
    runs.append({"client": c, "code": code, "backup": v,
                 "error": open(f"{work}/err{c}").read().strip().splitlines()[-1:]})
if during and hook.returncode != 0:
    print(f"FLEET_DURING failed ({hook.returncode})", file=sys.stderr)
json.dump({"wall": wall, "cpu": cpu, "load": [load0, os.getloadavg()], "runs": runs},
          sys.stdout)
EOF

read -r -a REPOS <<<"${FLEET_REPOS:-${FLEET_REPO:-$WORK/fleet}}"
ALONE=${REPOS[0]}-alone

# One client alone, into a fresh repository of the same kind.
"$BIN" init -q "$ALONE" >/dev/null
python3 "$WORK/run.py" "$BIN" "$WORK" 1 "" 0 "$ALONE" >"$WORK/alone.json"

# N separate repositories, one client each.
separate=0
for c in $(seq 0 $((CLIENTS - 1))); do
    "$BIN" init -q "$WORK/sep$c" >/dev/null
    "$BIN" backup -q "$WORK/sep$c" - <"$WORK/client$c" >/dev/null
    separate=$((separate + $(stored "$WORK/sep$c")))
done

# N clients at once into one repository.
"$BIN" init -q "${REPOS[0]}" >/dev/null
python3 "$WORK/run.py" "$BIN" "$WORK" "$CLIENTS" "${FLEET_DURING:-}" "${FLEET_DURING_AFTER:-1}" \
    "${REPOS[@]}" >"$WORK/fleet.json"
if [[ -n ${FLEET_AFTER:-} ]]; then bash -c "$FLEET_AFTER"; fi
committed=$(python3 -c 'import json,sys; print(" ".join(str(r["client"]) for r in json.load(open(sys.argv[1]))["runs"] if r["code"] == 0))' "$WORK/fleet.json")
failed=$((CLIENTS - $(wc -w <<<"$committed")))
if [[ $failed -gt 0 && -z ${FLEET_MAY_FAIL:-} ]]; then
    for c in $(seq 0 $((CLIENTS - 1))); do
        [[ " $committed " == *" $c "* ]] || echo "client $c failed: $(tail -1 "$WORK/err$c")" >&2
    done
    exit 1
fi
together=$(stored "${REPOS[0]}")

# Every committed backup restores byte for byte (through the endpoints in
# turn); the repository is clean.
verify() {
    local c id
    for c in $committed; do
        id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$WORK/out$c")
        "$BIN" restore -q "${REPOS[$((c % ${#REPOS[@]}))]}" "$id" - | cmp - "$WORK/client$c"
    done
}
verify
"$BIN" check -q --read-data "${REPOS[0]}"
# Clients that stored the same new chunk at once each stored a copy; gc
# folds them (FORMAT.md §16.2 step 1b). Every backup must still restore.
duplicates=$("$BIN" check --json "${REPOS[0]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["duplicate_bytes"])')
"$BIN" gc -q "${REPOS[0]}" >/dev/null
folded=$(stored "${REPOS[0]}")
left=$("$BIN" check --json --read-data "${REPOS[0]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["duplicate_chunks"])')
verify
listed=$("$BIN" list --json "${REPOS[0]}" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')

python3 - "$CLIENTS" "$MB" "$SHARED" "$together" "$separate" "$duplicates" "$folded" "$left" \
    "$WORK/alone.json" "$WORK/fleet.json" "$listed" "${REPOS[*]}" "$BIN" <<'EOF'
import json, statistics, sys
n, mb, sh, together, separate, duplicates, folded, left, alone, fleet, listed, repos, bin_ = sys.argv[1:]
n, together, separate, duplicates, folded = int(n), int(together), int(separate), int(duplicates), int(folded)
alone, fleet = json.load(open(alone)), json.load(open(fleet))
ok = [r for r in fleet["runs"] if r["code"] == 0]
mbytes = int(mb)  # MB per client (10^6 bytes)
one = mbytes / alone["wall"]
aggregate = len(ok) * mbytes / fleet["wall"]
print(f"fleet: {n} clients x {mb} MB, {sh} % shared, into {repos.split()[0]}"
      + (f" through {len(repos.split())} endpoints" if len(repos.split()) > 1 else "")
      + f"; tessera {bin_}")
print(f"stored in one repository: {together/1e6:.1f} MB; sum of {n} separate repositories: "
      f"{separate/1e6:.1f} MB; ratio {together/separate:.3f} (goal <= 0.5)")
print(f"after gc (folds {duplicates/1e6:.1f} MB of copies clients stored at once; {left} left): "
      f"{folded/1e6:.1f} MB; ratio {folded/separate:.3f} (goal <= 0.5)")
print(f"aggregate throughput of {len(ok)} concurrent clients: {aggregate:.1f} MB/s "
      f"({fleet['wall']:.2f} s, {fleet['cpu']:.2f} CPU s); one client alone: {one:.1f} MB/s "
      f"({alone['wall']:.2f} s, {alone['cpu']:.2f} CPU s); ratio {aggregate/one:.2f} (goal >= 0.9)")
print(f"CPU seconds per client: {fleet['cpu']/max(len(ok),1):.2f} of the fleet against "
      f"{alone['cpu']:.2f} alone (ratio {fleet['cpu']/max(len(ok),1)/max(alone['cpu'],1e-9):.2f}); "
      f"load average before/after: alone {alone['load'][0][0]:.2f}/{alone['load'][1][0]:.2f}, "
      f"fleet {fleet['load'][0][0]:.2f}/{fleet['load'][1][0]:.2f}")
def stage(runs, key):
    return [r["backup"]["stage_seconds"].get(key, 0.0) for r in runs]
if ok:
    secs = [r["backup"]["seconds"] for r in ok]
    commit, lock = stage(ok, "commit"), stage(ok, "commit_lock")
    a = alone["runs"][0]["backup"]["stage_seconds"]
    print(f"clients' own seconds (backup --json): median {statistics.median(secs):.2f}, max "
          f"{max(secs):.2f}; commit stage median {statistics.median(commit):.3f}, max "
          f"{max(commit):.3f}; waiting for the commit lock median {statistics.median(lock):.3f}, "
          f"max {max(lock):.3f}, sum {sum(lock):.3f} s (alone: "
          f"{alone['runs'][0]['backup']['seconds']:.2f}, commit {a['commit']:.3f}, lock "
          f"{a.get('commit_lock', 0.0):.3f})")
print(f"clients: {len(ok)} committed, {n - len(ok)} failed"
      + "".join(f"\n  client {r['client']} failed: {' '.join(r['error'])}" for r in fleet["runs"] if r["code"]))
assert int(listed) == len(ok), f"{listed} backups listed, {len(ok)} committed"
print(f"verified: {len(ok)} committed backups listed and restored byte for byte (before and "
      f"after gc), check --read-data clean")
EOF
