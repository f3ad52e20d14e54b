#!/usr/bin/env bash
# Demo of Tessera's main job on a local repository: create a repository, back up
# several versions of generated data with edits, restore every version, verify
# the repository, print statistics. Usage: scripts/demo.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p tessera-cli
T=$PWD/target/release/tessera
W=${1:-$(mktemp -d -t tessera-demo.XXXXXX)}
mkdir -p "$W"
REPO=$W/repo
rm -rf "$REPO" "$W/data"
mkdir -p "$W/data"

echo "== generating 8 versions of a 32 MiB file with scattered edits in $W/data"
head -c $((32 << 20)) /dev/urandom >"$W/data/v1"
for v in 2 3 4 5 6 7 8; do
  prev=$W/data/v$((v - 1)); cur=$W/data/v$v
  cp "$prev" "$cur"
  size=$(stat -c %s "$cur")
  for _ in 1 2 3 4 5 6 7 8; do # overwrite 4 KiB at random offsets
    dd if=/dev/urandom of="$cur" bs=4096 count=1 seek=$((RANDOM * 32768 % (size / 4096))) conv=notrunc status=none
  done
  cut=$(((RANDOM * 997) % size)) # insert 10 KiB somewhere
  { head -c "$cut" "$cur"; head -c 10240 /dev/urandom; tail -c +$((cut + 1)) "$cur"; } >"$cur.new"
  mv "$cur.new" "$cur"
done

echo "== tessera init $REPO"
"$T" init "$REPO"
for v in 1 2 3 4 5 6 7 8; do
  "$T" backup "$REPO" "$W/data/v$v" --label "v$v"
done
echo "== tessera list"
"$T" list "$REPO"
echo "== restoring every version and comparing"
for v in 1 2 3 4 5 6 7 8; do
  "$T" restore "$REPO" "$v" "$W/restored"
  cmp "$W/data/v$v" "$W/restored"
done
rm -f "$W/restored"
echo "all 8 versions restored byte-identical"
echo "== tessera check --read-data"
"$T" check "$REPO" --read-data
echo "== tessera stats"
"$T" stats "$REPO"
