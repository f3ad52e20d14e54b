#!/usr/bin/env python3
"""Summarises a pfc-delta experiment (experiments/pfc-delta.toml): per system
the compression ratio after the last version (retained logical / physical
bytes), the mean speed factor of the newest backup's restore over the last
20 versions, the median backup throughput, and the delta counters summed
over all versions; then each PFC system against its baseline. The
throughput ratio is paired: the experiment backs up each version on every
system in turn, so each version's ratio (baseline seconds / PFC seconds)
compares two backups made under the same machine load; the figure is the
median of those ratios over every version but the first, of every run.
The modelled backup I/O ratio (baseline / PFC) sums the backups' I/O times
under the experiment's disk model (records' modelled_backup_seconds: a seek
per read request, bandwidth for the bytes read and written) over the same
versions of the first run; it is deterministic, unlike measured time.

Usage: scripts/pfc-delta-summary.py RESULTS_DIR [RESULTS_DIR ...]"""
import json
import statistics
import sys

def summarise(path):
    r = json.load(open(f"{path}/results.json"))
    by = {}
    for rec in r["records"]:
        by.setdefault(rec["system"], []).append(rec)
    out = {}
    for name, recs in by.items():
        recs.sort(key=lambda x: x["version"])
        last20 = recs[-20:]
        sf = [x["restores"][-1]["speed_factor"] for x in last20 if x["restores"]]
        d = [x["delta"] for x in recs]
        total = lambda k: sum(x.get(k, 0) for x in d)
        out[name] = {
            "ratio": recs[-1]["actual_dedup_ratio"],
            "speed_factor": statistics.mean(sf) if sf else float("nan"),
            "backup_mb_s": statistics.median(x["backup_mb_s"] for x in recs[1:]),
            "seconds": {x["version"]: x["backup_seconds"] for x in recs[1:]},
            "modelled_io": sum(x.get("modelled_backup_seconds", float("nan"))
                               for x in recs[1:]),
            "delta_chunks": total("delta_chunks"),
            "hashless": total("hashless"),
            "edelta": total("edelta"),
            "saved_mb": total("bytes_saved") / 1e6,
            "pfcs": total("pfc_chunks"),
            "piggybacked": total("piggybacked_containers"),
            "base_reads": total("base_reads"),
            "restore_base_reads": sum(
                y.get("base_reads", 0) for x in recs for y in x["restores"]),
            "encode_mb_s": statistics.median(
                [x["encode_mb_s"] for x in d if x.get("encode_mb_s")] or [0]),
        }
    return out

runs = [summarise(p) for p in sys.argv[1:]]
names = list(runs[0])
cols = ["ratio", "speed_factor", "backup_mb_s", "delta_chunks", "hashless",
        "edelta", "saved_mb", "pfcs", "piggybacked", "base_reads",
        "restore_base_reads", "encode_mb_s"]
print("| system | " + " | ".join(cols) + " |")
print("|---" * (len(cols) + 1) + "|")
for n in names:
    s = runs[0][n]
    print(f"| {n} | " + " | ".join(
        f"{s[c]:.3f}" if isinstance(s[c], float) else str(s[c]) for c in cols) + " |")
print()
for n in names:
    for suffix in ("-pfc", "-pfc-fc", "-pfc-ref", "-greedy"):
        if n.endswith(suffix):
            base = n[: -len(suffix)]
            if base not in runs[0]:
                continue
            ratio = runs[0][n]["ratio"] / runs[0][base]["ratio"]
            sf = runs[0][n]["speed_factor"] / runs[0][base]["speed_factor"]
            per_run = [[r[base]["seconds"][v] / t for v, t in r[n]["seconds"].items()]
                       for r in runs]
            pooled = [x for ratios in per_run for x in ratios]
            print(f"{n} vs {base}: compression ratio x{ratio:.3f}, speed factor x{sf:.3f}, "
                  f"backup throughput x{statistics.median(pooled):.3f} (paired, median over "
                  f"{len(pooled)} versions of {len(runs)} run(s); per run: "
                  f"{', '.join(f'{statistics.median(x):.3f}' for x in per_run)}); "
                  f"modelled backup I/O x{runs[0][base]['modelled_io'] / runs[0][n]['modelled_io']:.3f}")
