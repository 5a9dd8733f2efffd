"""Compare two ``report.json`` files value by value, apart from what names a build.

    python scripts/compare_reports.py RUN_A/report.json RUN_B/report.json

Prints every path where the two differ (numbers compared exactly, unless ``--rtol`` is
given) and exits 1 when any does. Left out: the manifest's creation time, command, git
commit and hardware, the toolkit's version, and the title (it names the run directory).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

IGNORED = {("manifest", "created"), ("manifest", "command"), ("manifest", "git_commit"), ("manifest", "hardware"),
           ("manifest", "packages", "dpaudit"), ("dpaudit_version",), ("title",)}


def differences(a, b, path=(), rtol: float = 0.0):
    if path in IGNORED:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                yield path + (key,), a.get(key, "<missing>"), b.get(key, "<missing>")
            else:
                yield from differences(a[key], b[key], path + (key,), rtol)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from differences(x, y, path + (i,), rtol)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if not (a == b or (rtol and math.isclose(a, b, rel_tol=rtol))):
            yield path, a, b
    elif a != b:
        yield path, a, b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rtol", type=float, default=0.0, help="relative tolerance on numbers (default: exact)")
    args = parser.parse_args()
    with open(args.a, encoding="utf-8") as fa, open(args.b, encoding="utf-8") as fb:
        found = list(differences(json.load(fa), json.load(fb), rtol=args.rtol))
    for path, x, y in found:
        print(f"{'/'.join(map(str, path))}: {x!r} != {y!r}")
    print(f"{len(found)} difference(s)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
