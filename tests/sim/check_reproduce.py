#!/usr/bin/env python3
"""Results that cannot drift silently: runs `memwall reproduce` into a temporary folder and checks
every simulated value against the committed results/sim/<figure>.csv within 0.5 %. A change that
moves a figure must regenerate results/sim (memwall reproduce) and say why in its commit.

Usage: check_reproduce.py MEMWALL RESULTS_DIR [FIGURE ...]"""
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

TOLERANCE = 0.005


def rows(path):
    with open(path, newline="") as f:
        return {(r["figure"], r["label"]): r for r in csv.DictReader(f)}


def main():
    memwall, results = sys.argv[1], Path(sys.argv[2])
    figures = sys.argv[3:] or ["fig5a", "fig5b", "fig5c", "fig8", "fig9", "fig10", "seed004"]
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        for fig in figures:
            run = subprocess.run([memwall, "reproduce", "--figure", fig, "-o", tmp], capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{fig}: memwall reproduce failed ({run.returncode}): {run.stderr.strip()}")
                return 1
            want, got = rows(results / f"{fig}.csv"), rows(Path(tmp) / f"{fig}.csv")
            if set(want) != set(got):
                bad.append(f"{fig}: rows differ: committed {sorted(want)} vs now {sorted(got)}")
                continue
            for key, w in want.items():
                g = got[key]
                wv, gv = float(w["value"]), float(g["value"])
                off = abs(gv - wv) / abs(wv) if wv else abs(gv)
                status = "ok" if off <= TOLERANCE else "DRIFTED"
                print(f"{status:8} {fig:6} {key[1]:28} committed {wv:.4g}  now {gv:.4g}  ({100 * off:.3f} %)")
                if off > TOLERANCE or w["strategy"] != g["strategy"]:
                    bad.append(f"{fig} {key[1]}: committed {wv:.6g} ({w['strategy']}), now {gv:.6g} ({g['strategy']})")
    for b in bad:
        print("drift:", b)
    if bad:
        print(f"{len(bad)} value(s) moved more than {100 * TOLERANCE} % from results/sim: regenerate with "
              "`memwall reproduce` and say why in the commit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
