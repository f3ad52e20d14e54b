#!/usr/bin/env python3
"""The path of one command through the house, measured on a run.

    valgrind --tool=callgrind --callgrind-out-file=OUT target/debug/tessera backup REPO DIR
    python3 scripts/backup-path.py OUT

Reads the call graph callgrind recorded and prints, for the workspace's own
source files (crates/*/src, dependencies and the standard library left out):
  files  - the files whose functions ran;
  climbs - the distinct calls from a file to one of a higher layer (DESIGN.md
           rule 11: the CLI, then the backup entry and the tree's source, the
           front end and chunking, fingerprinting, index and rewriting, the
           layouts (and delta, restore, gc), formats and crypto, the
           backend). The repository handle (`repo/`: configuration, keys,
           the backend, the index it opens) is every layer's context, and
           helpers (`util`, `error`, `progress`, `lib.rs`) serve every
           layer: they belong to none and count in neither direction.
"""
import re, sys
from collections import defaultdict

LAYERS = [
    (r'tessera-cli/', 0), (r'tessera-lab/', 0), (r'tessera-serve/', 0),
    (r'tessera/src/backup/(mod|options)\.rs', 1), (r'tessera/src/backup/tree/', 1),
    (r'tessera/src/tree/', 1), (r'tessera/src/commands/', 1),
    (r'tessera/src/backup/front/', 2), (r'tessera/src/chunker/', 2),
    (r'tessera/src/fingerprint\.rs', 3),
    (r'tessera/src/index/', 4), (r'tessera/src/rewrite/', 4),
    (r'tessera/src/layout/', 5), (r'tessera/src/delta/', 5), (r'tessera/src/restore/', 5),
    (r'tessera/src/gc/', 5),
    (r'tessera/src/format/', 6), (r'tessera/src/crypto/', 6),
    (r'tessera/src/backend/', 8),
]

def layer(path):
    for pat, rank in LAYERS:
        if re.search(pat, path):
            return rank
    return None

def own(path):
    m = re.search(r'(crates/tessera[\w-]*/src/.*\.rs)$', path)
    return m.group(1) if m else None

def main(out):
    names = {'fl': {}, 'fn': {}}
    def name(kind, rest):
        m = re.match(r'\((\d+)\)(?: (.*))?$', rest)
        if not m:
            return rest
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), '?')
    cur_file = callee_file = None
    files, edges = set(), set()
    pending = False
    for line in open(out, errors='replace'):
        line = line.rstrip('\n')
        if line.startswith(('fl=', 'fi=', 'fe=')):
            f = name('fl', line[3:])
            if line.startswith('fl='):
                cur_file = f
            # fi/fe: inlined code of another file runs in this function
            o = own(f)
            if o:
                files.add(o)
        elif line.startswith('fn='):
            o = own(cur_file or '')
            if o:
                files.add(o)
        elif line.startswith(('cfl=', 'cfi=')):
            callee_file = name('fl', line[4:])
        elif line.startswith('cfn='):
            pass
        elif line.startswith('calls='):
            pending = True
        elif pending:
            pending = False
            a, b = own(cur_file or ''), own(callee_file or '')
            if a and b and a != b:
                edges.add((a, b))
            callee_file = None
    climbs = sorted((a, b) for a, b in edges
                    if layer(a) is not None and layer(b) is not None and layer(b) < layer(a))
    print(f"files: {len(files)}")
    print(f"climbs: {len(climbs)}")
    for a, b in climbs:
        print(f"  {a} -> {b}")
    if '-v' in sys.argv:
        for f in sorted(files):
            print('   ', f)

main(sys.argv[1])
