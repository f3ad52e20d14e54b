#!/usr/bin/env python3
"""File-level import cycles (pairs a->b and b->a) from `use crate::` / `crate::` paths in a crate's src."""
import os, re, sys
root = sys.argv[1]  # e.g. crates/tessera/src
files = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p = os.path.join(d, f); rel = os.path.relpath(p, root)
            mod = rel[:-3].replace('/mod', '').replace('lib', '') if rel != 'lib.rs' else ''
            mod = rel[:-3]
            if mod.endswith('/mod'): mod = mod[:-4]
            if mod == 'lib': mod = ''
            files[mod.replace('/', '::')] = p
def resolve(path):
    parts = path.split('::')
    for n in range(len(parts), 0, -1):
        m = '::'.join(parts[:n])
        if m in files: return m
    return None
edges = {}
for m, p in files.items():
    src = open(p, errors='replace').read()
    src = re.split(r'#\[cfg\(test\)\]\s*mod tests', src)[0]
    src = '\n'.join(l.split('//')[0] for l in src.split('\n'))
    deps = set()
    for u in re.findall(r'crate::([A-Za-z_][A-Za-z0-9_:]*)', src):
        r = resolve(u.rstrip(':'))
        if r is not None and r != m and r != '': deps.add(r)
    # use super::x  (relative) 
    for u in re.findall(r'\bsuper::([A-Za-z_][A-Za-z0-9_:]*)', src):
        base = m.split('::')[:-1] if not p.endswith('mod.rs') else m.split('::')[:-1]
        cand = '::'.join(base + [u.rstrip(':')]) if base else u
        r = resolve(cand)
        if r is None and base: r = '::'.join(base) if '::'.join(base) in files else None
        if r and r != m: deps.add(r)
    edges[m] = deps
pairs = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in edges.get(b, ()) })
# parent mod.rs <-> child is common (mod declares child; child uses parent items); report separately
def is_parent(a, b): return b.startswith(a + '::') or a.startswith(b + '::')
direct = [p for p in pairs if not is_parent(*p)]
print(f"{len(pairs)} mutual pairs ({len(direct)} between siblings/unrelated files):")
for a, b in direct: print(f"  {a} <-> {b}")
