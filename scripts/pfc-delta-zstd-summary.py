#!/usr/bin/env python3
"""Summarises a PFC-delta-with-compression experiment
(experiments/pfc-delta-zstd*.toml): per rewriting policy the four cells —
neither (NAME), delta alone (NAME-pfc), zstd alone (NAME.auto), delta then
zstd (NAME-pfc.auto) — by their total ratio after the last version (retained
logical bytes / physical bytes), then PFC-delta's gain in stored size without
and with compression (the ratio of the total ratios), the restores of the
retained backups at the end (mean modelled restore seconds under the
experiment's disk model, mean containers read) and backup throughput
(paired: per version, the policy's seconds / the PFC system's, median over
every version but the first; the same load falls on both).

Usage: scripts/pfc-delta-zstd-summary.py RESULTS_DIR [RESULTS_DIR ...]"""
import json
import statistics
import sys


def summarise(path):
    r = json.load(open(f"{path}/results.json"))
    recs = {}
    for x in r["records"]:
        if x["repeat"] == 1:
            recs.setdefault(x["system"], []).append(x)
    finals = {f["system"]: f for f in r["final_restores"] if f["repeat"] == 1}
    last = {k: max(v, key=lambda x: x["version"]) for k, v in recs.items()}
    seconds = {k: {x["version"]: x["backup_seconds"] for x in v} for k, v in recs.items()}

    def paired(a, b):
        ratios = [seconds[a][v] / seconds[b][v] for v in seconds[b] if v > 1 and seconds[b][v] > 0]
        return statistics.median(ratios) if ratios else float("nan")

    print(f"\n{r['config']['name']} ({len(r['versions'])} versions; "
          f"{r['provenance']['cpu_model']}, {r['seconds']:.0f} s)\n")
    print("| policy | total ratio: plain | PFC | zstd | PFC + zstd | PFC gain plain | "
          "PFC gain with zstd | delta saved MB (plain / zstd) | modelled restore s "
          "(4 cells) | backup time × (PFC, plain / zstd) |")
    print("|---" * 10 + "|")
    policies = [s["name"] for s in r["config"]["systems"]
                if "." not in s["name"] and not s["name"].endswith("-pfc")]
    for p in policies:
        cells = [p, f"{p}-pfc", f"{p}.auto", f"{p}-pfc.auto"]
        if not all(c in last for c in cells):
            continue
        t = [last[c]["total_ratio"] for c in cells]
        saved = [sum(x["delta"]["bytes_saved"] for x in recs[c]) / 1e6 for c in cells[1::2]]
        restore = " / ".join(f"{finals[c]['mean_modelled_seconds']:.3f}"
                             if c in finals else "–" for c in cells)
        print(f"| {p} | {t[0]:.3f} | {t[1]:.3f} | {t[2]:.3f} | {t[3]:.3f} | "
              f"{t[1] / t[0]:.3f} | {t[3] / t[2]:.3f} | {saved[0]:.1f} / {saved[1]:.1f} | "
              f"{restore} | {paired(cells[1], cells[0]):.2f} / {paired(cells[3], cells[2]):.2f} |")


for p in sys.argv[1:]:
    summarise(p)
