#!/usr/bin/env bash
# The MFDedup issue's "must show" figures, on generated data (tessera gen):
#
#  1. experiments/mfdedup.toml (one lineage, 60 versions, keep the last 20):
#     actual dedup ratio (ADR) of the lifecycle layout against exact dedup
#     (container layout, exact index, perfect GC) after every version; read
#     amplification and read extents of every restore (newest and oldest
#     after every version, every retained backup at the end); arranging time
#     per version beside container GC time per version (arrange-vs-gc.csv).
#  2. experiments/mfdedup-mix.toml (two interleaved lineages, 2 x 50
#     versions, keep the last 40 = 20 per lineage), then each lineage's same
#     version files alone in its own repository (keep the last 20): ADR of
#     the interleaved repository against the two separate ones together
#     (sum of retained logical bytes / sum of physical bytes) after every
#     pair of versions.
#  3. `tessera check --read-data` of the final repositories.
#  4. crates/tessera/benches/lifecycle.rs: deleting the oldest backup with 10
#     and 100 versions stored; restore of the oldest and newest retained
#     version against a sequential read of the files it reads.
#
# Usage: scripts/mfdedup-measurements.sh [OUT]   (default: a new temporary
# directory; the datasets take about 3.5 GB, keep them out of the work tree)
# Exits non-zero if a criterion fails (after printing every figure).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p tessera-cli
T=$PWD/target/release/tessera
OUT=${1:-$(mktemp -d -t tessera-mfdedup.XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
status=0

echo "== tessera experiment experiments/mfdedup.toml --out $OUT/single"
"$T" experiment experiments/mfdedup.toml --out "$OUT/single" 2>"$OUT/single.progress.log"
echo "== tessera experiment experiments/mfdedup-mix.toml --out $OUT/mix"
"$T" experiment experiments/mfdedup-mix.toml --out "$OUT/mix" 2>"$OUT/mix.progress.log"

# Each MIX lineage alone: the same version files, in the same order.
python3 - "$OUT" <<'EOF'
import csv, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/mix/dataset/MANIFEST.tsv"), delimiter="\t"))
for src in sorted({r["source"] for r in rows}):
    files = [f'"{out}/mix/dataset/{r["version_file"]}"' for r in rows if r["source"] == src]
    with open(f"{out}/sep-{src}.toml", "w") as f:
        f.write(f'''# Lineage {src} of {out}/mix alone (written by scripts/mfdedup-measurements.sh).
name = "mfdedup-mix-{src}-alone"

[dataset]
files = [{", ".join(files)}]

[retention]
keep_last = 20
gc_every = 1
gc_threshold = 0

[restore]
every = 0

[[systems]]
name = "lifecycle"
layout = "lifecycle"
''')
    print(src)
EOF
for cfg in "$OUT"/sep-*.toml; do
  name=$(basename "$cfg" .toml)
  echo "== tessera experiment $cfg --out $OUT/$name"
  "$T" experiment "$cfg" --out "$OUT/$name" 2>"$OUT/$name.progress.log"
done

for repo in "$OUT"/single/repos/* "$OUT"/mix/repos/* "$OUT"/sep-*/repos/*; do
  if [ -d "$repo" ]; then
    if "$T" check --read-data "$repo" >"$repo.check.txt" 2>&1; then
      echo "check --read-data $repo: clean"
    else
      echo "check --read-data $repo: PROBLEMS (see $repo.check.txt)"
      status=1
    fi
  fi
done

echo "== figures"
python3 - "$OUT" <<'EOF' || status=1
import glob, json, sys
out = sys.argv[1]
ok = True
def verdict(cond):
    global ok
    ok &= cond
    return "yes" if cond else "NO"

single = json.load(open(f"{out}/single/results.json"))
keep = single["config"]["retention"]["keep_last"]
by = {}
for r in single["records"]:
    by.setdefault(r["system"], {})[r["version"]] = r
lc, ex = by["lifecycle"], by["exact"]
n = max(lc)
ratios = {v: lc[v]["actual_dedup_ratio"] / ex[v]["actual_dedup_ratio"] for v in lc}
vmin = min(ratios, key=ratios.get)
print(f"[single] {n} versions of ~{lc[n]['logical_bytes']/1e6:.0f} MB, keeping {keep}")
print(f"[single] ADR after version {n}: lifecycle {lc[n]['actual_dedup_ratio']:.3f}, exact {ex[n]['actual_dedup_ratio']:.3f}, "
      f"ratio {ratios[n]:.4f}; lowest ratio {ratios[vmin]:.4f} (version {vmin}); >= 0.97 at every version: {verdict(min(ratios.values()) >= 0.97)}")
finals = {f["system"]: f for f in single["final_restores"]}
fl = finals["lifecycle"]["restores"]
during = [x for v in lc for x in lc[v]["restores"]]
ra = max(x["read_amplification"] for x in fl)
ra_d = max(x["read_amplification"] for x in during)
print(f"[single] read amplification (bytes read incl. headers and metadata / restored), all {len(fl)} retained at the end: "
      f"oldest {fl[0]['read_amplification']:.4f}, newest {fl[-1]['read_amplification']:.4f}, max {ra:.4f}; "
      f"max over the {len(during)} restores during the run {ra_d:.4f}; <= 1.0: {verdict(max(ra, ra_d) <= 1.0)}")
ext = max(x["extents"] for x in fl)
ext_d = max(x["extents"] for x in during)
print(f"[single] read extents per restore, retained at the end: oldest {fl[0]['extents']}, newest {fl[-1]['extents']}, max {ext}; "
      f"max during the run {ext_d}; retained versions {len(fl)}; <= {len(fl)}: {verdict(max(ext, ext_d) <= len(fl))}")
fe = finals["exact"]["restores"]
print(f"[single] (exact, for reference: read amplification oldest {fe[0]['read_amplification']:.3f}, newest {fe[-1]['read_amplification']:.3f}; "
      f"containers read oldest {fe[0]['extents']}, newest {fe[-1]['extents']})")
# Arranging vs container GC, per version.
with open(f"{out}/arrange-vs-gc.csv", "w") as f:
    f.write("version,lifecycle_arrange_seconds,lifecycle_delete_seconds,exact_gc_seconds,exact_gc_bytes_moved\n")
    for v in sorted(lc):
        a = lc[v]["arrange"]["seconds"] if lc[v]["arrange"] else 0.0
        d = lc[v]["gc"]["seconds"] if lc[v]["gc"] else 0.0
        g = ex[v]["gc"]
        f.write(f"{v},{a:.6f},{d:.6f},{g['seconds'] if g else 0:.6f},{(g['bytes_read'] + g['bytes_written']) if g else 0}\n")
steady = [v for v in lc if v > keep]
mean = lambda xs: sum(xs) / max(len(xs), 1)
arr = [lc[v]["arrange"]["seconds"] for v in steady]
dele = [lc[v]["gc"]["seconds"] for v in steady]
gcs = [ex[v]["gc"]["seconds"] for v in steady]
print(f"[single] per version after version {keep} (steady state, {len(steady)} versions): lifecycle arranging mean {mean(arr)*1e3:.1f} ms "
      f"(min {min(arr)*1e3:.1f}, max {max(arr)*1e3:.1f}) + deletion {mean(dele)*1e3:.1f} ms; exact GC mean {mean(gcs)*1e3:.1f} ms "
      f"(min {min(gcs)*1e3:.1f}, max {max(gcs)*1e3:.1f}); arranging+deletion / GC = {(sum(arr)+sum(dele))/sum(gcs):.2f} "
      f"(per version: {out}/arrange-vs-gc.csv)")

mix = json.load(open(f"{out}/mix/results.json"))
mlc = {r["version"]: r for r in mix["records"] if r["system"] == "lifecycle"}
mex = {r["version"]: r for r in mix["records"] if r["system"] == "exact"}
seps = []
for path in sorted(glob.glob(f"{out}/sep-*/results.json")):
    s = json.load(open(path))
    seps.append({r["version"]: r for r in s["records"]})
k = len(seps)
worst, last = None, None
for v in sorted(mlc):
    if v % k:
        continue
    m = v // k
    logical = sum(s[m]["retained_logical_bytes"] for s in seps)
    physical = sum(s[m]["physical_bytes"] for s in seps)
    sep_adr = logical / physical
    r = mlc[v]["actual_dedup_ratio"] / sep_adr
    last = (v, mlc[v]["actual_dedup_ratio"], sep_adr, r, mlc[v]["retained_logical_bytes"], logical)
    if worst is None or r < worst[3]:
        worst = last
v, a, b, r, l1, l2 = last
print(f"[mix] {k} lineages x {max(seps[0])} versions interleaved, keeping {mix['config']['retention']['keep_last']}: after backup {v}: "
      f"ADR interleaved {a:.3f}, separate {b:.3f} (retained logical {l1} vs {l2} bytes), ratio {r:.4f}; "
      f"lowest ratio {worst[3]:.4f} (after backup {worst[0]}); >= 0.95 after every pair: {verdict(worst[3] >= 0.95)}")
print(f"[mix] (exact in the interleaved repository, for reference: ADR {mex[max(mex)]['actual_dedup_ratio']:.3f})")
mf = {f["system"]: f for f in mix["final_restores"]}["lifecycle"]["restores"]
print(f"[mix] lifecycle, all {len(mf)} retained restored at the end: max read amplification "
      f"{max(x['read_amplification'] for x in mf):.4f}, max extents {max(x['extents'] for x in mf)}")
sys.exit(0 if ok else 1)
EOF

echo "== cargo bench -p tessera --bench lifecycle"
cargo bench -q -p tessera --bench lifecycle 2>&1 | grep -v '^$' || status=1
exit $status
