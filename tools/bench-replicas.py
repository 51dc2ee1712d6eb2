#!/usr/bin/env python3
"""tools/bench-replicas.py - push rows/s with R = 1 against R = 2, and the
CPU each process spent per row pushed.

Runs `embstore launch --server_num S --worker_num 1 --replicas R --
embstore-bench --op push ...` for R = 1 and R = 2 in turn, PAIRS times, and
reads every server's and the bench's CPU time (utime + stime in
/proc/PID/stat) every 100 ms. The CPU per row is taken inside the timed
phase only (its last DURATION seconds, trimmed by 0.4 s at the start and
0.3 s at the end), divided by the rows the bench says it pushed per second
over the same span. Prints one JSON object per run, then medians and
ranges, then the R = 2 / R = 1 rate ratio per pair (docs/replication.md).

usage: bench-replicas.py [--build DIR] [--pairs N] [--servers S]
                         [--duration SEC] [--warmup SEC] [-- BENCH_ARGS...]
BENCH_ARGS replace the default W1 arguments (--rows 1000000 --dim 64
--batch 4096 --dist zipf:1.05 --optimizer sgd).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HZ = os.sysconf("SC_CLK_TCK")
W1 = ["--rows", "1000000", "--dim", "64", "--batch", "4096",
      "--dist", "zipf:1.05", "--optimizer", "sgd"]


def children(ppid):
    """comm -> summed CPU seconds of ppid's children."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                s = f.read()
        except OSError:
            continue
        r = s.rfind(")")
        f = s[r + 2:].split()
        if int(f[1]) != ppid:
            continue
        comm = s[s.find("(") + 1:r]
        out[comm] = out.get(comm, 0.0) + (int(f[11]) + int(f[12])) / HZ
    return out


def run(a, replicas, logd):
    tools = os.path.join(a.build, "tools")
    cmd = [os.path.join(tools, "embstore"), "launch",
           "--server_num", str(a.servers), "--worker_num", "1",
           "--replicas", str(replicas), "--log-dir", logd, "--",
           os.path.join(tools, "embstore-bench"), "--op", "push",
           "--duration", str(a.duration), "--warmup", str(a.warmup)]
    cmd += a.bench_args or W1
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    samples = []
    while p.poll() is None:
        samples.append((time.monotonic(), children(p.pid)))
        time.sleep(0.1)
    if p.returncode != 0:
        sys.exit("launch with --replicas %d exited %d (logs in %s)"
                 % (replicas, p.returncode, logd))
    seen = [t for t, c in samples if "embstore-bench" in c]
    if not seen:
        sys.exit("the bench ran too briefly to be sampled")
    end = max(seen)

    def at(t0):
        for t, c in samples:
            if t >= t0:
                return t, c
        return samples[-1]

    ta, ca = at(end - a.duration + 0.4)
    tb, cb = at(end - 0.3)
    with open(os.path.join(logd, "worker.0.log")) as f:
        m = re.search(r"rate\s+([\d.]+) M rows/s", f.read())
    if not m or tb <= ta:
        sys.exit("no rate in %s/worker.0.log" % logd)
    rate = float(m.group(1)) * 1e6
    rows = rate * (tb - ta)

    def cpu(c, comm):
        return c.get(comm, 0.0)

    srv = cpu(cb, "embstore-server") - cpu(ca, "embstore-server")
    cli = cpu(cb, "embstore-bench") - cpu(ca, "embstore-bench")
    return {"R": replicas, "rows_per_s": rate,
            "server_cores": round(srv / (tb - ta), 3),
            "client_cores": round(cli / (tb - ta), 3),
            "server_ns_per_row": round(srv / rows * 1e9, 1),
            "client_ns_per_row": round(cli / rows * 1e9, 1)}


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("--build", default="build")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=6.0)
    ap.add_argument("bench_args", nargs="*")
    a = ap.parse_args()
    if a.duration < 1.0:
        sys.exit("--duration must be at least 1 s")
    tmp = tempfile.mkdtemp(prefix="emb-replicas-")
    res = []
    try:
        for i in range(a.pairs):
            for r in (1, 2):
                x = run(a, r, os.path.join(tmp, "%d-%d" % (i, r)))
                res.append(x)
                print(json.dumps(x), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for r in (1, 2):
        rs = [x for x in res if x["R"] == r]
        for k in ("rows_per_s", "server_cores", "client_cores",
                  "server_ns_per_row", "client_ns_per_row"):
            v = [x[k] for x in rs]
            print("R=%d %s: median %.4g (%.4g-%.4g)"
                  % (r, k, statistics.median(v), min(v), max(v)))
    ratio = [res[2 * i + 1]["rows_per_s"] / res[2 * i]["rows_per_s"]
             for i in range(a.pairs)]
    print("R=2/R=1 rows/s per pair: median %.2fx (%.2f-%.2fx)"
          % (statistics.median(ratio), min(ratio), max(ratio)))


if __name__ == "__main__":
    main()
