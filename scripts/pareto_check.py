#!/usr/bin/env python3
"""Reads markdown tables made by scripts/results_table.py and reports, per (workload, cluster),
whether `cobalt` and `cobalt+` are on the Pareto front (cross-node tokens vs mean imbalance) of all
policies: not dominated by any peer (a peer with <= both and < one).

Usage: scripts/pareto_check.py FILE.md [FILE.md ...]
"""
import sys

OURS = ("cobalt", "cobalt+")


def main() -> int:
    rows = {}
    for path in sys.argv[1:]:
        for line in open(path):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 8 and cells[3].isdigit():
                rows.setdefault((cells[0], cells[1]), []).append(
                    (cells[2], int(cells[3]), float(cells[5])))
    if not rows:
        print("no result rows found", file=sys.stderr)
        return 2
    all_on_front = True
    for (workload, cluster), entries in rows.items():
        peers = [e for e in entries if e[0] not in OURS]
        verdicts = []
        for name, v, imb in (e for e in entries if e[0] in OURS):
            dominators = [p[0] for p in peers
                          if p[1] <= v and p[2] <= imb and (p[1] < v or p[2] < imb)]
            all_on_front &= not dominators
            verdicts.append(f"{name}: " + ("dominated by " + ", ".join(dominators) if dominators
                                           else "on the front"))
        print(f"{workload} {cluster}: " + "; ".join(verdicts))
    return 0 if all_on_front else 1


if __name__ == "__main__":
    sys.exit(main())
