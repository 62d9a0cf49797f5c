#!/usr/bin/env python3
"""No function of the comparator (src/diff) is longer than 80 lines, signature to closing brace.

A long function there has been where two rules met and the last one won: issue 80 split them.
The code is clang-formatted, so a function at namespace scope opens on a line at column 0 and
closes with a `}` alone at column 0. Exit 1 with one line per function over the limit:

    tests/check_function_length.py [--root DIR] [--self-test]
"""
import argparse
import glob
import os
import sys

DIRS = ["src/diff"]
LIMIT = 80


def long_functions(text, limit=LIMIT):
    """(first line, lines, signature) of each function in TEXT longer than LIMIT lines."""
    lines = text.split("\n")
    found = []
    for end, line in enumerate(lines):
        if line != "}":
            continue
        start = end - 1
        while start >= 0 and (not lines[start] or lines[start][0] in " \t#/}"):
            start -= 1
        if start < 0 or lines[start].startswith(("namespace", "extern")):
            continue
        if end - start + 1 > limit:
            found.append((start + 1, end - start + 1, lines[start].strip()))
    return found


def self_test():
    body = "\n".join(f"  x += {i};" for i in range(LIMIT))
    text = ("namespace a {\n\nint short_one() {\n  return 1;\n}\n\n"
            "int long_one(int x,\n             int y) {\n" + body + "\n  return x;\n}\n\n"
            "}  // namespace a\n")
    found = long_functions(text)
    assert [(f[0], f[2]) for f in found] == [(7, "int long_one(int x,")], found
    assert found[0][1] == LIMIT + 4, found
    assert long_functions(text, limit=LIMIT + 4) == []


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    p.add_argument("--self-test", action="store_true", help="first check the check")
    args = p.parse_args()
    if args.self_test:
        self_test()
    bad = 0
    for d in DIRS:
        for path in sorted(glob.glob(os.path.join(args.root, d, "*.cpp"))):
            with open(path) as f:
                for line, length, signature in long_functions(f.read()):
                    print(f"function length: {os.path.relpath(path, args.root)}:{line}: "
                          f"{signature} is {length} lines (at most {LIMIT}): split it",
                          file=sys.stderr)
                    bad += 1
    if bad:
        sys.exit(1)
    print(f"function length: every function of {', '.join(DIRS)} is at most {LIMIT} lines")


if __name__ == "__main__":
    main()
