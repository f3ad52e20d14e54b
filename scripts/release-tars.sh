#!/usr/bin/env bash
# Turns a directory of working-copy tars (v0001.tar, v0002.tar, ...: a file's
# mtime changes only when the file does) into release tarballs as `git
# archive` makes them: every entry of a version carries that version's
# newest mtime, so every tar header changes from one version to the next,
# as in the packed datasets of the PFC-delta paper (successive source releases).
# Usage: scripts/release-tars.sh SRC_DIR OUT_DIR
set -euo pipefail
src=${1:?usage: release-tars.sh SRC_DIR OUT_DIR}
out=${2:?usage: release-tars.sh SRC_DIR OUT_DIR}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for t in "$src"/v*.tar; do
  name=$(basename "$t")
  rm -rf "$work/x" && mkdir "$work/x"
  tar xf "$t" -C "$work/x"
  newest=$(find "$work/x" -type f -printf '%T@\n' | sort -n | tail -1)
  tar cf "$out/$name" --sort=name --mtime="@${newest%.*}" --owner=0 --group=0 \
    --numeric-owner -C "$work/x" .
done
echo "$(ls "$out" | wc -l) release tarballs in $out"
