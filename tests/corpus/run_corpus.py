#!/usr/bin/env python3
"""run_corpus.py MEMWALL BATCH BATCHES: runs every BATCHES-th case of cases.tsv from BATCH on.

Each case runs in its own empty folder ({tmp}), seeded with what a case may point at: a symlink
loop (loop_a.yaml <-> loop_b.yaml), a FIFO (fifo.yaml), a folder named folder.yaml and a file one
byte larger than memwall reads (big.yaml). A case passes when memwall
  - exits 2,
  - writes exactly one line on stderr, matching the case's regex,
  - writes nothing on stdout,
  - leaves nothing behind: its folder holds only the seeds, tests/corpus/files is unchanged and no
    io-bench file (memwall-io-bench-*) remains.
A case whose status is "pending:<file that must change>" is run too: it must not crash (no signal,
exit 0-2, no leftovers); whether it already meets the rest is reported, not failed. A case whose
status is "skip-hangs:<file>" is not run (it would hang until that file changes).
Prints one line per failure and a summary: cases, passed, pending (and of those now passing).
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
FILES = os.path.join(HERE, "files")


def load_cases():
    cases = []
    with open(os.path.join(HERE, "cases.tsv")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, status, regex, args = line.rstrip("\n").split("\t")
            cases.append((name, status, regex, args))
    return cases


def seed(tmp):
    os.symlink("loop_b.yaml", os.path.join(tmp, "loop_a.yaml"))
    os.symlink("loop_a.yaml", os.path.join(tmp, "loop_b.yaml"))
    os.mkfifo(os.path.join(tmp, "fifo.yaml"))
    os.mkdir(os.path.join(tmp, "folder.yaml"))
    with open(os.path.join(tmp, "big.yaml"), "wb") as f:
        f.write(b"#" * ((1 << 20) + 1))
    return sorted(os.listdir(tmp))


def snapshot_files():
    return sorted((n, os.path.getsize(os.path.join(FILES, n)), os.path.getmtime(os.path.join(FILES, n)))
                  for n in os.listdir(FILES))


def run_case(mw, name, status, regex, args):
    tmp = tempfile.mkdtemp(prefix="memwall-corpus-")
    try:
        seeds = seed(tmp)
        words = [w.replace("{files}", FILES).replace("{tmp}", tmp).replace("{src}", SRC).replace("\\n", "\n")
                 for w in shlex.split(args)]
        before = set(os.listdir("/var/tmp"))
        try:
            p = subprocess.run([mw] + words, cwd=tmp, capture_output=True, timeout=120)
        except subprocess.TimeoutExpired:
            return ["timed out after 120 s (a hang)"], True
        problems = []
        crashed = p.returncode < 0 or p.returncode > 2
        if p.returncode != 2:
            problems.append("exit %d, wanted 2" % p.returncode)
        err = p.stderr.decode(errors="replace")
        if err.count("\n") != 1 or not err.endswith("\n"):
            problems.append("stderr is not exactly one line: %r" % err[:300])
        elif not re.search(regex, err.rstrip("\n")):
            problems.append("stderr %r does not match /%s/" % (err.rstrip("\n")[:300], regex))
        if p.stdout:
            problems.append("stdout not empty: %r" % p.stdout[:120])
        left = sorted(set(os.listdir(tmp)) - set(seeds))
        left += [os.path.join("/var/tmp", n) for n in set(os.listdir("/var/tmp")) - before if n.startswith("memwall-io-bench-")]
        if left:
            problems.append("left behind: %s" % ", ".join(left[:5]))
            crashed = True
        return problems, crashed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    mw, batch, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cases = load_cases()[batch::batches]
    files_before = snapshot_files()
    failed = passed = pending = pending_now_ok = 0
    skipped = 0
    for name, status, regex, args in cases:
        if status.startswith("skip"):
            skipped += 1
            print("skipped %s (%s)" % (name, status))
            continue
        problems, crashed = run_case(mw, name, status, regex, args)
        if status == "ok":
            if problems:
                failed += 1
                print("FAIL %s: %s\n  memwall %s" % (name, "; ".join(problems), args))
            else:
                passed += 1
        else:
            pending += 1
            if crashed:
                failed += 1
                print("FAIL %s (%s): crashed or left files: %s" % (name, status, "; ".join(problems)))
            elif not problems:
                pending_now_ok += 1
                print("NOW PASSING %s (%s): mark it ok in make_corpus.py" % (name, status))
            else:
                print("pending %s (%s): %s" % (name, status, "; ".join(problems)))
    if snapshot_files() != files_before:
        failed += 1
        print("FAIL: tests/corpus/files changed while the cases ran")
    print("corpus batch %d of %d: %d cases, %d passed, %d pending (%d of them now passing), %d skipped, %d failed"
          % (batch, batches, len(cases), passed, pending, pending_now_ok, skipped, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
