#!/usr/bin/env bash
# Demo of Tessera's main job on a local repository: create a repository, back up
# several versions of generated data with edits, restore every version, verify
# the repository, print statistics. Usage: scripts/demo.sh [WORKDIR]
# Without WORKDIR it works in a temporary directory that it removes when it
# ends (however it ends); with WORKDIR, the data and repository stay there.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p tessera-cli
T=$PWD/target/release/tessera
if [ $# -ge 1 ]; then
  W=$1
else
  W=$(mktemp -d -t tessera-demo.XXXXXX)
  trap 'rm -rf "$W"' EXIT
fi
mkdir -p "$W"
REPO=$W/repo
rm -rf "$REPO" "$W/data"
mkdir -p "$W/data"

echo "== generating 8 versions (~32 MiB each) of a file tree aged by edits, packed as tar, in $W/data"
"$T" gen "$W/data" --versions 8 --size 32MiB --change-rate 0.1
for v in 1 2 3 4 5 6 7 8; do mv "$W/data/v000$v.tar" "$W/data/v$v"; done

# The repository is encrypted and compressed (the defaults: xchacha20poly1305,
# compression auto); a real user types the password
# at the prompt or keeps it in a file (--password-file). The demo sets it in
# the environment, as a cron job might.
export TESSERA_PASSWORD=${TESSERA_PASSWORD:-demo-password}
echo "== tessera init $REPO (encrypted, compression auto; password from TESSERA_PASSWORD)"
"$T" init "$REPO" --compression auto
for v in 1 2 3 4 5 6 7 8; do
  # Standard input: each version is a stream, restored into a file below.
  "$T" backup "$REPO" - --label "v$v" <"$W/data/v$v"
done
echo "== tessera list"
"$T" list "$REPO"
echo "== restoring every version and comparing"
for v in 1 2 3 4 5 6 7 8; do
  "$T" restore "$REPO" "$v" "$W/restored" --overwrite
  cmp "$W/data/v$v" "$W/restored"
done
rm -f "$W/restored"
echo "all 8 versions restored byte-identical"
echo "== tessera check --read-data"
"$T" check "$REPO" --read-data
echo "== tessera stats"
"$T" stats "$REPO"
