#!/usr/bin/env python3
"""tests/callgraph.py BUILD_DIR - no call circle between the files of a module.

For each module's static library under BUILD_DIR/src, a file (object) calls
another when it references a symbol the other defines (nm). A circle is a
set of files that reach each other through such calls: a.c calls b.c and
b.c calls back into a.c, directly or through others. Calls back up through
function pointers (vtables, hooks) are not references and are fine.
docs/architecture.md, "Files", says why. Prints each circle; exits 1 if
there is any.
"""
import glob
import os
import subprocess
import sys


def nm(archive):
    out = subprocess.run(['nm', '-A', archive], check=True,
                         capture_output=True, text=True).stdout
    defs, uses = {}, {}
    for line in out.splitlines():
        # "lib.a:obj.o:                 U name" or "...: 0000 T name"
        head, _, rest = line.rpartition(':')
        obj = os.path.basename(head.split(':')[-1]) if ':' in head else head
        parts = rest.split()
        if len(parts) < 2:
            continue
        kind, name = parts[-2], parts[-1]
        uses.setdefault(obj, set())
        if kind == 'U':
            uses[obj].add(name)
        elif kind in 'TDBRVW' and kind.isupper():
            defs[name] = obj
    return defs, uses


def circles(edges):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def main():
    build = sys.argv[1]
    archives = sorted(glob.glob(os.path.join(build, 'src', '*', 'libemb_*.a')))
    if not archives:
        print(f'callgraph: no module libraries under {build}/src',
              file=sys.stderr)
        return 1
    bad = 0
    for a in archives:
        defs, uses = nm(a)
        edges = {}
        for obj, names in uses.items():
            edges[obj] = {defs[n] for n in names
                          if n in defs and defs[n] != obj}
        for comp in circles(edges):
            bad = 1
            lib = os.path.basename(a)
            calls = '; '.join(f'{o} -> {", ".join(sorted(edges[o] & set(comp)))}'
                              for o in comp)
            print(f'{lib}: call circle between {", ".join(comp)} ({calls})')
    print(f'callgraph: {len(archives)} module libraries, '
          f'{"circles found" if bad else "no call circle"}')
    return bad


if __name__ == '__main__':
    sys.exit(main())
