#!/usr/bin/env bash
# Runs every `$ ` command of docs/GUIDE.md, in order and exactly as written,
# in a scratch home directory (removed at the end) with a copy of this
# repository's crates/ and docs/ as ~/project, and writes what they printed
# to docs/GUIDE-TRANSCRIPT.md. Fails at the first command that fails.
# Usage: scripts/guide-transcript.sh   (TESSERA_BIN=path uses that binary
# instead of building the release one)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${TESSERA_BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release -q -p tessera-cli
  BIN=$ROOT/target/release/tessera
fi
SCRATCH=$(mktemp -d -t tessera-guide.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
mkdir -p "$SCRATCH/bin" "$SCRATCH/project"
ln -s "$(realpath "$BIN")" "$SCRATCH/bin/tessera"
cp -r "$ROOT/crates" "$ROOT/docs" "$ROOT/README.md" "$SCRATCH/project/"
OUT=$ROOT/docs/GUIDE-TRANSCRIPT.md
{
  echo "# Transcript of the user guide"
  echo
  echo "Produced by \`scripts/guide-transcript.sh\` on $(date -u +%Y-%m-%d), commit"
  echo "\`$(git rev-parse --short HEAD)\`: every \`\$ \` line of [GUIDE.md](GUIDE.md), run as written."
  echo
  echo '```console'
} > "$OUT.tmp"
# One shell runs the whole guide, so exports carry over as they would for a reader.
sed -n 's/^\$ //p' docs/GUIDE.md > "$SCRATCH/commands"
(
  export HOME=$SCRATCH PATH="$SCRATCH/bin:$PATH"
  cd "$HOME"
  unset TESSERA_PASSWORD TESSERA_PASSWORD_FILE TESSERA_REPOSITORY
  set +e
  while IFS= read -r line; do
    echo "\$ $line"
    eval "$line" > "$SCRATCH/output" 2>&1 < /dev/null
    status=$?
    sed "s|$SCRATCH|~|g" "$SCRATCH/output"
    if [ $status -ne 0 ]; then
      echo "guide command failed (exit $status): $line" >&2
      exit 1
    fi
  done < "$SCRATCH/commands"
) >> "$OUT.tmp"
echo '```' >> "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "wrote $OUT"
