#!/usr/bin/env python3
"""Summarises GCCDF experiments (experiments/gccdf-paper*.toml and the runs of
scripts/gccdf-sweep.sh): one Markdown row per system of each results
directory, from the restores of every retained backup after the last version
(`final_restores` of results.json) and the last GC's ownership counters.

Columns: stored MB (physical bytes after the last version) and its ratio to
the naive system of the same compression setting (`naive`, `naive.auto`);
mean containers read per restore, mean containers referenced (distinct
containers of the backup's chunks), mean copy-forward bound (the fewest
containers any order of the same copy-forward could leave: the containers
backups wrote plus the backup's chunks in GC-written containers packed
full); read amplification and speed factor on stored bytes; modelled restore
seconds (7200 rpm model: a seek per container, 150 MB/s) and the restore
speed-up over naive (naive's modelled seconds / the system's); "best order"
= the system's modelled seconds / its bound's, the most any reordering of
its copy-forward could gain; mixed-ownership share of the retained bytes
before / after the last GC; distinct owner sets (ownership clusters) of
the retained chunks against the containers holding them, and the mean bytes
per owner set, after the last GC; mean containers per restore written by
GC's copy-forward; GC MiB read + written over the run.

Usage: scripts/gccdf-summary.py RESULTS_DIR [RESULTS_DIR ...]"""
import json
import sys


def base_of(name):
    """The naive system of the same compression setting."""
    _, dot, setting = name.partition(".")
    return "naive" + (dot + setting if dot else "")


def last_ownership(records, system):
    own = [r["gc"] for r in records
           if r["system"] == system and r.get("gc") and r["gc"].get("ownership_after")]
    if not own:
        return "– | – | –"
    g = own[-1]
    share = lambda o: o["mixed_bytes"] / o["live_bytes"] if o["live_bytes"] else 0.0
    a = g["ownership_after"]
    cluster = a["live_bytes"] / max(a["owner_sets"], 1) / 1024
    return (f"{share(g['ownership_before']):.2f} / {share(a):.2f} | "
            f"{a['owner_sets']} / {a['containers']} | {cluster:.0f}")


def from_gc(f):
    """Mean containers per restore that GC's copy-forward wrote."""
    xs = [x["stored"]["containers_from_gc"] for x in f["restores"] if x.get("stored")]
    return sum(xs) / len(xs) if xs else float("nan")


def summarise(path):
    r = json.load(open(f"{path}/results.json"))
    finals = {f["system"]: f for f in r["final_restores"] if f["repeat"] == 1}
    c = r["config"]
    keep, every = c["retention"]["keep_last"], c["retention"]["gc_every"]
    print(f"\n{c['name']} ({len(r['versions'])} versions, keep {keep}, GC every {every}; "
          f"{r['provenance']['cpu_model']}, {r['seconds']:.0f} s)\n")
    print("| system | stored MB | × naive | containers read | referenced | bound | "
          "read amp. | speed factor | modelled s | speed-up vs naive | best order | "
          "mixed before / after GC | owner sets / containers | KiB per owner set | "
          "from GC | GC MiB moved |")
    print("|---" * 16 + "|")
    for s in c["systems"]:
        f = finals.get(s["name"])
        if f is None:
            continue
        b = finals.get(base_of(s["name"]), f)
        print(f"| {s['name']} | {f['physical_bytes'] / 1e6:.1f} | "
              f"{f['physical_bytes'] / b['physical_bytes']:.3f} | "
              f"{f['mean_containers_read']:.1f} | {f['mean_containers_referenced']:.1f} | "
              f"{f['mean_containers_bound']:.1f} | {f['mean_read_amplification']:.3f} | "
              f"{f['mean_speed_factor']:.3f} | {f['mean_modelled_seconds']:.3f} | "
              f"{b['mean_modelled_seconds'] / f['mean_modelled_seconds']:.3f} | "
              f"{f['mean_modelled_seconds'] / f['mean_modelled_bound_seconds']:.3f} | "
              f"{last_ownership(r['records'], s['name'])} | "
              f"{from_gc(f):.1f} | {f['gc_bytes_moved'] / 1048576:.0f} |")


for p in sys.argv[1:]:
    summarise(p)
