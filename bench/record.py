#!/usr/bin/env python3
"""Puts a compare.sh table into BENCHMARKS.md, between its two record markers.

    python3 bench/record.py BENCHMARKS.md bench/results/latest.md

compare.sh --record calls it after a run. Everything outside the markers is left as it is;
the table between them is replaced whole, so the file always shows the last recorded run.
"""
import sys

START = "<!-- compare.sh --record: start -->"
END = "<!-- compare.sh --record: end -->"


def record(benchmarks: str, table: str) -> str:
    i = benchmarks.find(START)
    j = benchmarks.find(END)
    if i < 0 or j < i:
        raise ValueError(f"no '{START}' ... '{END}' block to replace")
    return benchmarks[: i + len(START)] + "\n\n" + table.strip() + "\n\n" + benchmarks[j:]


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, table_path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        benchmarks = f.read()
    with open(table_path) as f:
        table = f.read()
    try:
        updated = record(benchmarks, table)
    except ValueError as e:
        print(f"record.py: {path}: {e}", file=sys.stderr)
        return 1
    with open(path, "w") as f:
        f.write(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
