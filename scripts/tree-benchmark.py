#!/usr/bin/env python3
"""Tree backups against the read ceiling (issue 21, "Must show").

Unpacks the Redis working-directory versions of ../shared/data/code-redis-wc
(78 versions, 79,871 files) COPIES times side by side (default 2: 159,742
files, 1.8 GB) and, RUNS times (default 3), times on that tree:

  ceiling   tar cf - TREE | cat > /dev/null   (GNU tar skips reading the files
            when its archive is /dev/null itself, hence the pipe)
  first     backup into a new repository
  unchanged backup again (nothing changed)
  1%        backup after appending a line to every 100th file
  restore   full restore into an empty directory (a new one each run: the
            restored trees are removed only after the last run, see below)
  one file  restore --include of one file (containers read: the file's own vs
            the catalog's), against `cat FILE > /dev/null`

and prints medians with their spread (min-max) of the times and of the five
ratios of each run, as the issue targets them: first backup >= 0.8 x the
ceiling's speed (ceiling time / backup time), unchanged re-backup <= 0.1 x
the first backup's time, the 1 % re-backup against the first, full restore
speed against the ceiling, single-file restore against reading the file.

Then (unless --skip-dedup) the dedup comparison: every version extracted in
turn into one working directory and backed up natively, against the same
versions' tar files backed up as streams (stored bytes of each), and (unless
--skip-million) the peak RSS (/usr/bin/time) of backing up a generated tree
of --million (default 1,000,000) empty files in 1,000 directories.

Each run restores into a directory of its own, and the restored trees
(1.8 GB each) are removed together at the end: removing one just before the
next restore made that restore 6 times slower, and not because of Tessera.
On an ext4 file system without a journal (as on the machine these figures
come from: /sys/fs/ext4/DEV/journal_task is "<none>"), the inode allocator
skips the inodes freed in the last 60 s (360 s while their inode table
block is dirty) and checks each of them, one by one, for every inode it
allocates (fs/ext4/ialloc.c, find_inode_bit and recently_deleted): 160,000
files just deleted cost every new file a scan of them, all system time
inside open(O_CREAT) and mkdir (perf: 60 % of the restore's samples in
recently_deleted and the buffer lookups under it).

Usage: scripts/tree-benchmark.py [--runs N] [--copies N] [--versions N]
       [--million N] [--skip-dedup] [--skip-million] [--work DIR]
Environment: TESSERA (binary; default target/release/tessera).
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCHIVE = os.path.join(ROOT, "..", "shared", "data", "code-redis-wc.tar.zst")
TESSERA = os.environ.get("TESSERA", os.path.join(ROOT, "target", "release", "tessera"))


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, check=True, **kw)


def tessera(*args, rss=None, stdin=None):
    """Runs tessera (with the file `stdin` on standard input); its JSON
    output (and peak RSS in KiB when `rss`)."""
    cmd = [TESSERA, *args]
    if rss is not None:
        cmd = ["/usr/bin/time", "-f", "%M", "-o", rss] + cmd
    with open(stdin or os.devnull, "rb") as input:
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, stdin=input)
    if out.returncode not in (0, 3):
        sys.exit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr}")
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    return json.loads(last) if last.startswith("{") else {}


def cpu_of_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(fn, cpu=None):
    """Wall time of `fn` and its result; appends the CPU time (user + system)
    of the processes it ran to `cpu` if given (a shared machine's load
    changes wall times far more than CPU times)."""
    start, cpu_start = time.monotonic(), cpu_of_children()
    result = fn()
    if cpu is not None:
        cpu.append(cpu_of_children() - cpu_start)
    return time.monotonic() - start, result


def summary(values, unit=" s", digits=2):
    med = statistics.median(values)
    return f"{med:8.{digits}f}{unit}  (spread {min(values):.{digits}f}-{max(values):.{digits}f})"


def unpack(work, versions, copies):
    """The version tars, and the tree of `copies` x `versions` unpacked versions."""
    tars = os.path.join(work, "tars")
    if not os.path.isdir(tars):
        os.makedirs(tars)
        sh(f"zstd -dc --long=31 {ARCHIVE} | tar xf - -C {tars}")
    tars = os.path.join(tars, "code-redis-wc")
    names = sorted(n for n in os.listdir(tars) if n.endswith(".tar"))[:versions]
    tree = os.path.join(work, "tree")
    if not os.path.isdir(tree):
        for c in range(copies):
            for n in names:
                d = os.path.join(tree, f"copy{c}", n[:-4])
                os.makedirs(d)
                sh(f"tar xf {os.path.join(tars, n)} -C {d}")
    files = sum(len(f) for _, _, f in os.walk(tree))
    return tars, names, tree, files


def edit_one_percent(tree):
    """Appends a line to every 100th file (sorted); returns how to undo it."""
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(tree) for f in fs)[::100]
    sizes = [(p, os.path.getsize(p)) for p in paths]
    for p, _ in sizes:
        with open(p, "ab") as f:
            f.write(b"/* edited */\n")
    return sizes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--versions", type=int, default=78)
    ap.add_argument("--million", type=int, default=1_000_000)
    ap.add_argument("--skip-dedup", action="store_true")
    ap.add_argument("--skip-million", action="store_true")
    ap.add_argument("--work")
    a = ap.parse_args()
    if "TESSERA" not in os.environ:
        # Built every time (nothing to do when up to date): a binary left
        # from an older checkout would measure old code.
        sh(f"cd {ROOT} && cargo build --release -p tessera-cli")
    work = os.path.abspath(a.work or tempfile.mkdtemp(prefix="tessera-treebench."))
    os.makedirs(work, exist_ok=True)
    tars, names, tree, files = unpack(work, a.versions, a.copies)
    print(f"tree: {tree}, {files} files ({a.copies} x {len(names)} Redis versions)")
    repo, one_out = os.path.join(work, "repo"), os.path.join(work, "one")
    outs = [os.path.join(work, f"out{run}") for run in range(a.runs)]
    # A file in the middle of the tree, for the single-file restore.
    one = os.path.join(tree, "copy0", names[len(names) // 2][:-4], "redis", "src", "server.c")
    t = {k: [] for k in ["ceiling", "first", "unchanged", "edited", "restore", "one", "cat"]}
    one_stats = []
    cpu = {"first": [], "unchanged": [], "restore": []}
    sh(f"tar cf - {tree} | cat > /dev/null")  # warm the page cache
    for run in range(a.runs):
        out = outs[run]
        shutil.rmtree(repo, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(one_out, ignore_errors=True)
        tessera("init", repo, "--encryption", "none")
        t["ceiling"].append(timed(lambda: sh(f"tar cf - {tree} | cat > /dev/null"))[0])
        s, b = timed(lambda: tessera("backup", "--json", repo, tree), cpu["first"])
        t["first"].append(s)
        s, u = timed(lambda: tessera("backup", "--json", repo, tree), cpu["unchanged"])
        t["unchanged"].append(s)
        assert u["tree"]["bytes_read"] == 0, u["tree"]
        undo = edit_one_percent(tree)
        s, e = timed(lambda: tessera("backup", "--json", repo, tree))
        t["edited"].append(s)
        for p, size in undo:
            os.truncate(p, size)
        s, r = timed(lambda: tessera("restore", "--json", repo, "1", out), cpu["restore"])
        t["restore"].append(s)
        # Kept until the last run is done (see the top of this file).
        s, o = timed(lambda: tessera("restore", "--json", "--include", one, repo, "1", one_out))
        t["one"].append(s)
        t["cat"].append(timed(lambda: sh(f"cat {one} > /dev/null"))[0])
        one_stats.append(o)
        shutil.rmtree(one_out)
        print(
            f"run {run + 1}: first {t['first'][-1]:.2f} s ({b['stored_bytes']} B stored), "
            f"unchanged {t['unchanged'][-1]:.2f} s, 1% {t['edited'][-1]:.2f} s "
            f"({e['tree']['files_changed']} changed, {e['tree']['bytes_read']} B read), "
            f"restore {t['restore'][-1]:.2f} s, one file {t['one'][-1]:.2f} s",
            flush=True,
        )
    print()
    for k, label in [
        ("ceiling", "tar cf - | cat (read ceiling)"),
        ("first", "first backup"),
        ("unchanged", "unchanged re-backup"),
        ("edited", "re-backup, 1% of files changed"),
        ("restore", "full restore"),
        ("one", "single-file restore"),
    ]:
        print(f"{label:34} {summary(t[k])}")
    for k, label in [("first", "first backup"), ("unchanged", "unchanged re-backup"), ("restore", "full restore")]:
        print(f"{label + ', CPU (user+sys)':34} {summary(cpu[k])}")
    print()
    # Ratios of each run (the times of one run share the machine's load).
    runs = range(a.runs)
    for label, values, target in [
        ("first backup speed / read ceiling", [t["ceiling"][i] / t["first"][i] for i in runs], "x  (target >= 0.80)"),
        ("unchanged re-backup / first backup", [t["unchanged"][i] / t["first"][i] for i in runs], "   (target <= 0.10)"),
        ("  the same in CPU time (user+sys)", [cpu["unchanged"][i] / cpu["first"][i] for i in runs], ""),
        ("1% re-backup / first backup", [t["edited"][i] / t["first"][i] for i in runs], ""),
        ("full restore speed / read ceiling", [t["ceiling"][i] / t["restore"][i] for i in runs], "x"),
        ("single-file restore / cat of it", [t["one"][i] / t["cat"][i] for i in runs], "x"),
    ]:
        print(f"{label:36} {summary(values, unit='', digits=3)}{target}")
    o = one_stats[-1]
    data = o["containers_read"] - o["catalog_containers_read"]
    print(
        f"single-file restore: {o['bytes_restored']} B, {data} container(s) for the file, "
        f"{o['catalog_containers_read']} read for the catalog and its index in "
        f"{o.get('catalog_extents_read', '?')} ranged read(s) (extents), "
        f"{o['bytes_read']} B read (target: <= 2 beyond the file's own)"
    )
    shutil.rmtree(repo, ignore_errors=True)
    for out in outs:
        shutil.rmtree(out, ignore_errors=True)

    if not a.skip_dedup:
        print()
        native, streams = os.path.join(work, "native"), os.path.join(work, "streams")
        wc = os.path.join(work, "wc")
        for r in (native, streams):
            shutil.rmtree(r, ignore_errors=True)
            tessera("init", r, "--encryption", "none")
        stored_native = stored_tar = logical_tar = 0
        for n in names:
            shutil.rmtree(wc, ignore_errors=True)
            os.makedirs(wc)
            sh(f"tar xf {os.path.join(tars, n)} -C {wc}")
            bn = tessera("backup", "--json", "--source", "redis-wc", native, wc)
            bt = tessera("backup", "--json", streams, "-", stdin=os.path.join(tars, n))
            stored_native += bn["stored_bytes"]
            stored_tar += bt["stored_bytes"]
            logical_tar += bt["logical_bytes"]
        print(
            f"dedup on trees, {len(names)} versions ({logical_tar} B as tar): "
            f"native tree backups store {stored_native} B, tar streams {stored_tar} B "
            f"(native / tar = {stored_native / stored_tar:.3f})"
        )
        for r in (native, streams, wc):
            shutil.rmtree(r, ignore_errors=True)

    if not a.skip_million:
        print()
        big = os.path.join(work, f"files-{a.million}")
        if not os.path.isdir(big):
            per = 1000
            for d in range((a.million + per - 1) // per):
                dd = os.path.join(big, f"d{d:04}")
                os.makedirs(dd)
                for i in range(min(per, a.million - d * per)):
                    open(os.path.join(dd, f"f{i:04}"), "wb").close()
        shutil.rmtree(repo, ignore_errors=True)
        tessera("init", repo, "--encryption", "none")
        rss = os.path.join(work, "rss")
        s, b = timed(lambda: tessera("backup", "--json", repo, big, rss=rss))
        kib = int(open(rss).read().split()[-1])
        print(
            f"{a.million} generated empty files: backup {s:.1f} s, catalog "
            f"{b['tree']['catalog_bytes']} B, peak RSS {kib / 1024:.0f} MiB (target <= 256 MiB)"
        )
        shutil.rmtree(repo, ignore_errors=True)
        shutil.rmtree(big, ignore_errors=True)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
