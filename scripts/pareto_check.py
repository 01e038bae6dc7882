#!/usr/bin/env python3
"""Reads markdown tables made by scripts/results_table.py and reports, per (workload, cluster)
under each markdown heading (the same workload can be measured in several experiments, e.g. at
another number of tokens per step; the heading is printed when it tells them apart), whether `cobalt` and `cobalt+` are on the Pareto front (cross-node tokens vs mean imbalance) of all
policies: not dominated by any peer (a peer with <= both and < one).

Columns are found by their header names (workload, cluster, policy, cross-node tokens, imbalance
mean), so tables with more or fewer columns read the same.

Usage: scripts/pareto_check.py FILE.md [FILE.md ...]
Exit status: 0 when both are on the front everywhere, 1 when one is dominated somewhere, 2 when no
result rows were found.
"""
import sys

OURS = ("cobalt", "cobalt+")
NEEDED = ("workload", "cluster", "policy", "cross-node tokens", "imbalance mean")


def main() -> int:
    rows = {}
    for path in sys.argv[1:]:
        columns = None  # header name -> cell index of the table being read
        heading = ""
        in_code = False  # inside a ``` block: '#' lines there are comments, not headings
        for line in open(path):
            if not line.startswith("|"):
                columns = None
                if line.startswith("```"):
                    in_code = not in_code
                elif line.startswith("#") and not in_code:
                    heading = line.strip().lstrip("#").strip()
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if all(name in cells for name in NEEDED):
                columns = {name: cells.index(name) for name in NEEDED}
                continue
            if columns is None or not cells[columns["cross-node tokens"]].isdigit():
                continue  # the separator row, or a table of another kind
            key = (heading, cells[columns["workload"]], cells[columns["cluster"]])
            rows.setdefault(key, []).append((cells[columns["policy"]],
                                             int(cells[columns["cross-node tokens"]]),
                                             float(cells[columns["imbalance mean"]])))
    if not rows:
        print("no result rows found", file=sys.stderr)
        return 2
    all_on_front = True
    headings_of = {}
    for heading, workload, cluster in rows:
        headings_of.setdefault((workload, cluster), set()).add(heading)
    for (heading, workload, cluster), entries in rows.items():
        peers = [e for e in entries if e[0] not in OURS]
        verdicts = []
        for name, v, imb in (e for e in entries if e[0] in OURS):
            dominators = [p[0] for p in peers
                          if p[1] <= v and p[2] <= imb and (p[1] < v or p[2] < imb)]
            all_on_front &= not dominators
            verdicts.append(f"{name}: " + ("dominated by " + ", ".join(dominators) if dominators
                                           else "on the front"))
        where = f" [{heading}]" if len(headings_of[(workload, cluster)]) > 1 else ""
        print(f"{workload} {cluster}{where}: " + "; ".join(verdicts))
    return 0 if all_on_front else 1


if __name__ == "__main__":
    sys.exit(main())
