#!/usr/bin/env python3
"""The `Drain` handle keeps the lifecycle; its parts are handles of their own (issue 49).

Checks, over every `impl Drain` block in the given source tree (all features counted):
- at most LIMIT public methods on `Drain` (default 15);
- no crate-private method on `Drain` but `core` (the hot block's accessor): an add-on is
  handed a seam of its own when built (`AdminSeam`, `ServeSeam`, `WatchSeam` in `drain/`),
  not a `pub(crate)` method on the handle that every module can call;
- no `inner.driver` chain outside the handle's own module (`drain.rs`, `drain/`): a part is
  reached through the handle that owns it, not through the coordinator's insides;
- one type per name in the tree (structs, enums, traits, unions, type aliases; associated
  types aside): two `Registry` or two `Tasks` read as one thing and are not.

Prints what it counted and every fault; exits 1 on a fault.

Usage: .ci/handle-surface.py [--limit N] SRC_DIR
"""
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location('long_functions', os.path.join(HERE, 'long-functions.py'))
long_functions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(long_functions)

IMPL = re.compile(r'^impl\s+Drain\s*\{')
PUB_FN = re.compile(r'^    pub\s+(const\s+)?(async\s+)?fn\s+(\w+)')
CRATE_FN = re.compile(r'^    pub\((crate|super|in [^)]*)\)\s+(const\s+)?(async\s+)?fn\s+(\w+)')
SEAMS_ALLOWED = {'core'}
CHAIN = re.compile(r'\binner\s*\.\s*driver\b')
TYPE = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(struct|enum|trait|union)\s+(\w+)|^(pub(\([^)]*\))?\s+)?type\s+(\w+)')


def methods_of(path, pattern, group):
    """(name, line) of each method matching `pattern` in the file's `impl Drain` blocks."""
    lines = long_functions.code_only(open(path, encoding='utf-8').read()).split('\n')
    found, i = [], 0
    while i < len(lines):
        if not IMPL.match(lines[i]):
            i += 1
            continue
        depth, j = 0, i
        while j < len(lines):
            m = pattern.match(lines[j])
            if m and depth == 1:
                found.append((m.group(group), j + 1))
            depth += lines[j].count('{') - lines[j].count('}')
            if depth == 0 and j > i:
                break
            j += 1
        i = j + 1
    return found


def main(argv):
    limit = 15
    if argv[:1] == ['--limit']:
        limit, argv = int(argv[1]), argv[2:]
    if len(argv) != 1:
        sys.exit(__doc__)
    src = argv[0]
    methods, seams, chains, types = [], [], [], {}
    for root, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith('.rs'):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src)
            methods += [(m, f'{rel}:{line}') for m, line in methods_of(path, PUB_FN, 3)]
            seams += [(m, f'{rel}:{line}') for m, line in methods_of(path, CRATE_FN, 4)
                      if m not in SEAMS_ALLOWED]
            in_handle = rel == 'drain.rs' or rel.startswith('drain' + os.sep)
            code = long_functions.code_only(open(path, encoding='utf-8').read())
            for k, text in enumerate(code.split('\n')):
                if not in_handle and CHAIN.search(text):
                    chains.append(f'{rel}:{k + 1}')
                m = TYPE.match(text)
                if m:
                    types.setdefault(m.group(4) or m.group(7), []).append(f'{rel}:{k + 1}')
    print(f'Drain: {len(methods)} public methods (limit {limit}): '
          + ', '.join(m for m, _ in sorted(methods)))
    faults = 0
    if len(methods) > limit:
        faults += 1
        print(f'too many public methods on Drain: {len(methods)} > {limit}')
        for m, at in methods:
            print(f'  {m}  {at}')
    for m, at in seams:
        faults += 1
        print(f'crate-private method `{m}` on Drain ({at}): give the add-on a seam of its own')
    for at in chains:
        faults += 1
        print(f'`inner.driver` outside the handle module: {at}')
    print(f'{len(types)} type names')
    for name, where in sorted(types.items()):
        if len(where) > 1:
            faults += 1
            print(f'type name `{name}` defined {len(where)} times: ' + ', '.join(where))
    return 1 if faults else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
