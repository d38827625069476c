"""What the rank-layout tests (ranks.sh, tp_ranks.sh, pp_ranks.sh) hold every run to, against the
one-rank run of the same global batch: `memwall run --json`'s summary lines, read with `summary`.

compare(ref, run, label, keys): each step's values of `keys` (the loss; also the gradient norm when
clipping) within 1e-5 relative of the reference's (fp32: the layouts add the same numbers in
another order at most), and every rank's bytes per link class equal to its own schedule's. Returns
the worst relative difference and appends what failed to `bad`.
"""
import json


def summary(path):
    return json.loads(open(path).read().splitlines()[-1])


def compare(ref, run, label, bad, keys=("loss",), tol=1e-5):
    worst = 0.0
    for key in keys:
        mine = [s[key] for s in run["steps"]]
        theirs = [s[key] for s in ref["steps"]]
        rel = max(abs(a - b) / abs(b) for a, b in zip(mine, theirs))
        worst = max(worst, rel)
        if rel > tol:
            bad.append(f"{label}: {key} differs from the one-rank run's by {rel:.2e} relative")
    for rank, links in enumerate(run["ranks"]):
        for link, v in links.items():
            if v["moved_bytes"] != v["schedule_bytes"]:
                bad.append(f"{label} rank {rank} {link}: moved {v['moved_bytes']} != schedule {v['schedule_bytes']}")
    return worst
