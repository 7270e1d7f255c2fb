#!/usr/bin/env python3
"""No function over LIMIT lines in the given source trees (issue 35's standard).

Counts from a `fn` line to the line of its closing brace, matching braces outside strings,
raw strings, characters and comments. Prints each function over the limit and exits 1 if
there is one.

Usage: .ci/long-functions.py [--limit N] DIR [DIR ...]
"""
import os
import re
import sys

FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"[^"]*"\s+)?fn\s+(\w+)')


def code_only(text):
    """The text with string, raw string, char literal and comment contents blanked (newlines
    kept), so braces are counted in code only."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(''.join(ch if ch == '\n' else ' ' for ch in text[i:j]))
            i = j
            continue
        m = re.match(r'b?r(#*)"', text[i:i + 12])
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == '_')):
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(''.join(ch if ch == '\n' else ' ' for ch in text[i:j]))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(''.join(ch if ch == '\n' else ' ' for ch in text[i:j]))
            i = j
            continue
        if c == "'":
            m = re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'", text[i:i + 12])
            if m:
                out.append(' ' * len(m.group(0)))
                i += len(m.group(0))
                continue
        out.append(c)
        i += 1
    return ''.join(out)


def long_functions(path, limit):
    lines = code_only(open(path, encoding='utf-8').read()).split('\n')
    found = []
    i = 0
    while i < len(lines):
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        depth, started, j = 0, False, i
        while j < len(lines):
            for ch in lines[j]:
                if ch == '{':
                    depth += 1
                    started = True
                elif ch == '}':
                    depth -= 1
            if not started and ';' in lines[j]:
                break
            if started and depth <= 0:
                break
            j += 1
        if started and j - i + 1 > limit:
            found.append((j - i + 1, path, i + 1, m.group(7)))
        i += 1
    return found


def main():
    args = sys.argv[1:]
    limit = 80
    if args[:1] == ['--limit']:
        limit = int(args[1])
        args = args[2:]
    found = []
    for root in args:
        for d, _, files in os.walk(root):
            for f in sorted(files):
                if f.endswith('.rs'):
                    found += long_functions(os.path.join(d, f), limit)
    for n, path, line, name in sorted(found, reverse=True):
        print(f'{path}:{line}: fn {name} is {n} lines (limit {limit})')
    print(f'{len(found)} functions over {limit} lines in {", ".join(args)}')
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main())
