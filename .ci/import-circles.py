#!/usr/bin/env python3
"""Fails when modules of a crate import each other in a circle.

Usage: .ci/import-circles.py [--top] SRC_DIR...   (e.g. src probe/src testbed/src)

The graph is file-level: one node per module file reached from lib.rs (or main.rs) through
`mod` declarations; an edge for every `crate::…` or `super::…` path in the file's code (use
lines and inline paths; comment lines and `#[cfg(test)]` sections skipped), to the longest
module path it names. Edges between a module and its own ancestors or descendants are left out:
a child using its parent's items, and a parent declaring its children, is how Rust nests
modules. A circle is a strongly connected component of more than one file; each is printed
with its edges. Exit status 1 when there is one.

`--top` also fails on circles between top-level modules (each with all its descendants): the
coarser view, where a child's import of a sibling's ancestor counts.

`--parts FILE` also fails on an arrow the design forbids between parts (top-level modules):
each line of FILE is `from: never to1 to2 …` (a part must never import those), or
`from: only to1 to2 …` (it may import only those, besides itself); `#` starts a comment. Test
code is left out, as for circles.
"""
import os
import re
import sys

MOD_RE = re.compile(
    r'(?:#\[path\s*=\s*"([^"]+)"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;')
ALIAS_RE = re.compile(r'use self::(\w+) as (\w+);')
CRATE_RE = re.compile(r'\bcrate::((?:\w+::)*\w+)')
SUPER_RE = re.compile(r'\bsuper::((?:\w+::)*\w+)')


def modules(root):
    """Module path (tuple) -> file, and `use self::x as y` aliases at any level."""
    mods, aliases = {}, {}

    def walk(path, modpath):
        mods[modpath] = path
        base = os.path.basename(path)
        if base == 'tests.rs':
            return
        text = open(path, encoding='utf-8').read()
        here = os.path.dirname(path)
        sub = here if base in ('lib.rs', 'main.rs', 'mod.rs') else os.path.join(here, base[:-3])
        for m in MOD_RE.finditer(text):
            given, name = m.group(1), m.group(2)
            if given:
                f = os.path.join(sub if base not in ('lib.rs', 'main.rs', 'mod.rs') else here, given)
            else:
                f = os.path.join(sub, name + '.rs')
                if not os.path.exists(f):
                    f = os.path.join(sub, name, 'mod.rs')
            if os.path.exists(f) and name != 'tests':
                walk(f, modpath + (name,))
        for m in ALIAS_RE.finditer(text):
            aliases[m.group(2)] = m.group(1)

    top = os.path.join(root, 'lib.rs')
    if not os.path.exists(top):
        top = os.path.join(root, 'main.rs')
    walk(top, ())
    return mods, aliases


def related(a, b):
    return a[:len(b)] == b or b[:len(a)] == a


def longest(mods, start, parts):
    best = None
    for i in range(1, len(parts) + 1):
        if start + tuple(parts[:i]) in mods:
            best = start + tuple(parts[:i])
        else:
            break
    return best


def edges_of(mods, aliases):
    edges = {m: set() for m in mods}
    for mp, path in mods.items():
        in_tests = False
        for line in open(path, encoding='utf-8'):
            s = line.strip()
            if s.startswith('#[cfg(test)]') or s.startswith('#[cfg(all(test'):
                in_tests = True
            if in_tests or s.startswith('//'):
                continue
            # Paths in string literals (doc attributes' links) are not imports.
            s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', s)
            for m in CRATE_RE.finditer(s):
                parts = m.group(1).split('::')
                parts[0] = aliases.get(parts[0], parts[0])
                to = longest(mods, (), parts)
                if to is not None and not related(mp, to):
                    edges[mp].add(to)
            for m in SUPER_RE.finditer(s):
                parts, start = m.group(1).split('::'), mp[:-1]
                while parts and parts[0] == 'super':
                    start, parts = start[:-1], parts[1:]
                to = longest(mods, start, parts) or start
                if not related(mp, to):
                    edges[mp].add(to)
    return edges


def circles(edges):
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = n
        n += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n
                    n += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def top_level(edges):
    """The same graph with every module folded into its top-level module."""
    folded = {}
    for a, targets in edges.items():
        folded.setdefault(a[:1], set())
        for b in targets:
            if a[:1] != b[:1]:
                folded[a[:1]].add(b[:1])
    return folded


def read_parts(path):
    """`from -> (kind, set of parts)` from a parts file (see the module docs)."""
    rules = {}
    for line in open(path, encoding='utf-8'):
        line = line.split('#', 1)[0].strip()
        if not line:
            continue
        head, rest = line.split(':', 1)
        kind, *names = rest.split()
        if kind not in ('never', 'only'):
            sys.exit(f'{path}: {line!r}: expected "never" or "only" after the colon')
        rules[head.strip()] = (kind, set(names))
    return rules


def broken_arrows(mods, edges, rules):
    """Every file-level import that breaks a rule: (from file, to module, rule)."""
    out = []
    for a in sorted(edges):
        if not a:
            continue
        rule = rules.get(a[0])
        if rule is None:
            continue
        kind, names = rule
        for b in sorted(edges[a]):
            if not b or b[0] == a[0]:
                continue
            bad = b[0] in names if kind == 'never' else b[0] not in names
            if bad:
                out.append((mods[a], '::'.join(b), f'{a[0]}: {kind} {" ".join(sorted(names))}'))
    return out


def main():
    failed = False
    args = sys.argv[1:]
    top = '--top' in args
    parts = None
    if '--parts' in args:
        i = args.index('--parts')
        parts = read_parts(args[i + 1])
        del args[i:i + 2]
    for root in [a for a in args if a != '--top']:
        mods, aliases = modules(root)
        edges = edges_of(mods, aliases)
        if parts is not None and root == 'src':
            arrows = broken_arrows(mods, edges, parts)
            for f, to, rule in arrows:
                failed = True
                print(f'{root}: forbidden arrow: {f} -> {to}  ({rule})')
            print(f'{root}: {len(arrows)} forbidden arrows')
        if top:
            for comp in circles(top_level(edges)):
                failed = True
                print(f'{root}: top-level import circle: '
                      f'{", ".join(sorted("::".join(m) for m in comp))}')
        found = circles(edges)
        name = lambda m: '::'.join(m) or 'crate'
        for comp in found:
            failed = True
            members = set(comp)
            print(f'{root}: import circle: {", ".join(sorted(name(m) for m in comp))}')
            for a in sorted(comp):
                for b in sorted(edges[a] & members):
                    print(f'    {name(a)} -> {name(b)}  ({mods[a]})')
        print(f'{root}: {len(mods)} module files, {len(found)} import circles')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
