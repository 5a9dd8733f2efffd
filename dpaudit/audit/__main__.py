"""``python -m dpaudit.audit``: print the ceilings table of docs/ceilings.md (markdown)."""

from __future__ import annotations

import argparse

from dpaudit.audit.ceilings import ceiling_table, format_ceiling_table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m dpaudit.audit", description="Print the largest bound each method can give (markdown)."
    )
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--significance", type=float, default=0.05)
    parser.add_argument("--ms", type=int, nargs="+", default=[100, 1000, 10000])
    args = parser.parse_args(argv)
    rows = ceiling_table(ms=args.ms, delta=args.delta, significance=args.significance)
    print(f"delta={args.delta:g}, significance={args.significance:g}; best case [default strategy]\n")
    print(format_ceiling_table(rows))
    print()
    for r in rows:
        print(
            f"m={r.m}: best number of guesses (all correct): one-run {r.one_run_best_guesses}, "
            f"f-DP {r.one_run_fdp_best_guesses}"
        )


if __name__ == "__main__":
    main()
