#!/usr/bin/env bash
# The lazy-deduplication issue's "must show" figures: experiments/lazy.toml
# (50 generated versions of ~1 GB as fingerprint traces, 4 MiB index budget,
# far below the ~0.3M-entry index) run RUNS times (default 3) with Bloom
# filters sized for 1% false positives, and RUNS times with a fixed Bloom
# filter 16x smaller than the final 1% one (24 KiB); prints, per system, the
# median over the runs of the totals over all versions: on-disk table reads,
# metadata-log prefetches, cache lookups, pre/postlookup hits, Bloom false
# positives, forced flushes, seconds reading the table and the log, and
# backup wall time (sum of the 50 backups).
#
# Usage: scripts/lazy-measurements.sh [OUT] (default: a new temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p tessera-cli
T=$PWD/target/release/tessera
OUT=${1:-$(mktemp -d -t tessera-lazy.XXXXXX)}
RUNS=${RUNS:-3}
mkdir -p "$OUT"
sed -e '0,/^name = "lazy"/s//name = "lazy-bloom16"/' \
    -e 's/^\(index_memory = .*\)$/\1\nbloom_size = "24KiB"/' \
    experiments/lazy.toml > "$OUT/lazy-bloom16.toml"
for run in $(seq 1 "$RUNS"); do
  for cfg in experiments/lazy.toml "$OUT/lazy-bloom16.toml"; do
    name=$(basename "$cfg" .toml)
    "$T" experiment "$cfg" --out "$OUT/$name-$run" > "$OUT/$name-$run.log" 2>&1
  done
done
python3 - "$OUT" "$RUNS" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
keys = ['disk_lookups', 'prefetches', 'log_reads', 'cache_lookups', 'prelookup_hits',
        'postlookup_hits', 'bloom_false_positives', 'forced_flushes', 'disk_seconds',
        'prefetch_seconds']
for name in ['lazy', 'lazy-bloom16']:
    print(f"== {name} (median of {runs} runs; totals over all versions)")
    per = {}
    for run in range(1, runs + 1):
        d = json.load(open(f"{out}/{name}-{run}/results.json"))
        for system in sorted({r['system'] for r in d['records']}):
            recs = [r for r in d['records'] if r['system'] == system]
            t = {k: sum(r['index'][k] for r in recs) for k in keys}
            t['backup_seconds'] = sum(r['backup_seconds'] for r in recs)
            t['bloom_bytes_end'] = recs[-1]['index']['bloom_bytes']
            t['entries_end'] = recs[-1]['index']['entries']
            t['buffer_peak_bytes'] = max(r['index']['buffer_peak_bytes'] for r in recs)
            per.setdefault(system, []).append(t)
    for s, ts in per.items():
        print(f"{s} backup wall time per run:", ' '.join(f"{t['backup_seconds']:.2f}" for t in ts))
    med = {s: {k: statistics.median(t[k] for t in ts) for k in ts[0]} for s, ts in per.items()}
    for s, m in med.items():
        print(s, ' '.join(f"{k}={round(v, 3)}" for k, v in m.items()))
    e, l = med['eager'], med['lazy']
    print(f"lazy/eager: table reads {l['disk_lookups'] / e['disk_lookups']:.3f}, "
          f"prefetches {l['prefetches'] / e['prefetches']:.3f}, "
          f"all index reads {(l['disk_lookups'] + l['prefetches'] + l['log_reads']) / (e['disk_lookups'] + e['prefetches'] + e['log_reads']):.3f}, "
          f"backup wall time {l['backup_seconds'] / e['backup_seconds']:.3f}")
PY
