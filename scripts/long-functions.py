#!/usr/bin/env python3
"""List Rust functions longer than N lines (brace matching; skips #[cfg(test)] mod tests)."""
import re, sys, os
root = sys.argv[1]; limit = int(sys.argv[2]) if len(sys.argv) > 2 else 150
res = []
for d, _, fs in os.walk(root):
    if '/target' in d or '/tests' in d: continue
    for f in fs:
        if not f.endswith('.rs'): continue
        p = os.path.join(d, f); lines = open(p, errors='replace').read().split('\n')
        i = 0; test_depth = None
        while i < len(lines):
            l = lines[i]
            if re.match(r'\s*#\[cfg\(test\)\]', l):
                # skip the following item entirely
                j = i + 1; depth = 0; started = False
                while j < len(lines):
                    depth += lines[j].count('{') - lines[j].count('}')
                    if '{' in lines[j]: started = True
                    if started and depth <= 0: break
                    j += 1
                i = j + 1; continue
            m = re.match(r'\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)', l)
            if m:
                j = i; depth = 0; started = False
                while j < len(lines):
                    s = re.sub(r'"([^"\\]|\\.)*"', '""', lines[j]); s = re.sub(r"'([^'\\]|\\.)'", "''", s); s = s.split('//')[0]
                    depth += s.count('{') - s.count('}')
                    if '{' in s: started = True
                    if ';' in s and not started: break
                    if started and depth <= 0: break
                    j += 1
                n = j - i + 1
                if started and n > limit: res.append((n, p, i + 1, m.group(6)))
            i += 1
for n, p, ln, name in sorted(res, reverse=True): print(f"{n:5} {p}:{ln} {name}")
