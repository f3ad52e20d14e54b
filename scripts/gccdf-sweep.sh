#!/usr/bin/env bash
# GCCDF away from the paper's setting (issue #43): for each KEEP:EVERY given,
# an experiment keeping the newest KEEP backups and deleting + collecting
# garbage every EVERY backups, 4 MiB containers, perfect GC, plain and
# compressed (the compression axis' default), with the systems naive,
# gccdf (segments of 100 containers), gccdf-seg25, gccdf-seg400,
# gccdf-nofill (no container fill) and fill (container fill in container
# order); the retained backups are restored at the end and the ownership
# counters are on. Then scripts/gccdf-summary.py over all the runs.
#
# Usage: scripts/gccdf-sweep.sh DATASET_DIR OUT_DIR KEEP:EVERY [KEEP:EVERY ...]
#   e.g. scripts/gccdf-sweep.sh target/data/code-redis-wc /tmp/sweep-redis 25:1 25:10 10:5 50:5
# DATASET_DIR holds the versions (v0001.tar, ...: a `dir` dataset).
# Runs `nice -n 10 target/release/tessera` (build it first); each run takes
# ~5 min on Redis, ~15-25 min on SQLite on 2 shared cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
data=$(cd "${1:?usage: gccdf-sweep.sh DATASET_DIR OUT_DIR KEEP:EVERY ...}" && pwd)
out=${2:?usage: gccdf-sweep.sh DATASET_DIR OUT_DIR KEEP:EVERY ...}
shift 2
mkdir -p "$out"
dirs=()
for setting in "$@"; do
    keep=${setting%%:*}
    every=${setting##*:}
    name="gccdf-sweep-$(basename "$data")-keep$keep-gc$every"
    toml="$out/$name.toml"
    cat > "$toml" <<TOML
name = "$name"
expected_run_time = "5-25 min on 2 shared cores (estimate)"

[dataset]
dir = "$data"

[retention]
keep_last = $keep
gc_every = $every
gc_threshold = 0
ownership = true

[restore]
every = 0
retained_at_end = true

[[systems]]
name = "naive"

[[systems]]
name = "gccdf"
defrag = "gccdf"

[[systems]]
name = "gccdf-seg25"
defrag = "gccdf"
gc_segment = 25

[[systems]]
name = "gccdf-seg400"
defrag = "gccdf"
gc_segment = 400

[[systems]]
name = "gccdf-nofill"
defrag = "gccdf"
gc_fill = false

[[systems]]
name = "fill"
defrag = "fill"
TOML
    echo "== $name ($(uptime))"
    nice -n 10 "$root/target/release/tessera" experiment "$toml" --out "$out/$name" 2> "$out/$name.log" | tail -1
    dirs+=("$out/$name")
done
"$root/scripts/gccdf-summary.py" "${dirs[@]}"
