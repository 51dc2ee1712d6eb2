#!/usr/bin/env python3
"""tools/bench-sched-bytes.py - the scheduler's control-plane bytes, read
from its TCP connections: heartbeats in steady state, and the map broadcast a
server's death sets off in a replicated job.

Runs `embstore launch --server_num S --worker_num W --replicas R --
embstore-bench --op push ...` with EMB_HEARTBEAT_TIMEOUT=T and samples the
TCP payload bytes received and sent on the scheduler's port (`ss -ti`,
summed over its connections) about every 50 ms. Steady state is
the span from 1.5 s after `cluster ready` to the kill; then server.1 is
SIGKILLed, and the bytes sent in the WINDOW seconds after it (5 by
default: the nodes hear of the new epoch within T / 5 on an idle machine,
later on a loaded one), less the steady rate over that span, are the
failover's burst. Prints one JSON
object per run with the measured rates and burst beside what docs/scale.md
computes for them:

    heartbeats in:  N * 48 / (T / 5) bytes/s     (HEARTBEAT request)
    heartbeats out: N * 40 / (T / 5) bytes/s     (response, no death yet)
    burst:          (N - 1) * (32 + 8 + 8192 + 264 S + 24 + 8192 R)
                    (every live node fetches the new map once)

where N = S + W. Needs R >= 2, so that the job survives the kill, and
ss (iproute2).

usage: bench-sched-bytes.py [--build DIR] [--servers S] [--workers W]
                            [--replicas R] [--timeout T] [--kill-at SEC]
                            [--window SEC] [--reps N]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time


class Sockets:
    """TCP payload bytes through the scheduler's port, summed over every
    connection ever seen (ss -ti: bytes_received, bytes_sent): a
    connection that closed keeps the last count it had."""

    def __init__(self, port):
        self.port = port
        self.seen = {}

    def read(self):
        """(received, sent) so far, or None when ss fails."""
        r = subprocess.run(["ss", "-tinH", "state", "established",
                            "( sport = :%d )" % self.port],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return None
        peer = None
        for line in r.stdout.splitlines():
            f = line.split()
            if not f:
                continue
            if not line[0].isspace() and len(f) >= 4:
                peer = f[3]
                continue
            got = dict(re.findall(r"(bytes_received|bytes_sent):(\d+)",
                                  line))
            if peer and got:
                self.seen[peer] = (int(got.get("bytes_received", 0)),
                                   int(got.get("bytes_sent", 0)))
                peer = None
        return (sum(v[0] for v in self.seen.values()),
                sum(v[1] for v in self.seen.values()))


def map_bytes(S, R):
    """A CLUSTER_MAP response frame (tests/tools/test_scale_wire.c)."""
    b = 32 + 8 + 2 * 4096 + 264 * S
    if R > 1:
        b += 24 + 2 * R * 4096
    return b


def rate(samples, t0, t1, k):
    """Bytes/s of field k (0 received, 1 sent) between times t0 and t1."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    return (b[1][k] - a[1][k]) / (b[0] - a[0])


def at(samples, t, k):
    """Field k of the last sample at or before t."""
    v = None
    for s in samples:
        if s[0] > t:
            break
        v = s[1][k]
    return v


def run(a, rep, logd):
    tools = os.path.join(a.build, "tools")
    T = a.timeout
    duration = a.kill_at + a.window + 4
    cmd = [os.path.join(tools, "embstore"), "launch",
           "--server_num", str(a.servers), "--worker_num", str(a.workers),
           "--replicas", str(a.replicas), "--log-dir", logd, "--",
           os.path.join(tools, "embstore-bench"), "--op", "push",
           "--rows", "20000", "--dim", "8", "--batch", "256",
           "--duration", str(duration)]
    env = dict(os.environ, EMB_HEARTBEAT_TIMEOUT=str(T),
               EMB_LOG_LEVEL="info")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    pids = {}
    port = []
    epoch = []  # when the scheduler's "map epoch N" lines were read
    ready = threading.Event()
    lines = []

    def reader():
        for line in p.stdout:
            lines.append(line)
            m = re.match(r"\[launch\] scheduler on \S+:(\d+),", line)
            if m:
                port.append(int(m.group(1)))
            m = re.match(r"\[launch\] started (\S+), pid (\d+)", line)
            if m:
                pids[m.group(1)] = int(m.group(2))
            if "cluster ready" in line:
                ready.set()
            # A new map is "map epoch N: ..."; a node that rejoined
            # ("... rejoined with map epoch N (ours N)") made none: a
            # loaded machine's agents may lose the scheduler for a
            # moment before the kill.
            if (line.startswith("[scheduler]") and
                    re.search(r"\bmap epoch \d+: ", line)):
                epoch.append(time.monotonic())
    th = threading.Thread(target=reader, daemon=True)
    th.start()
    samples = []
    socks = None
    t_ready = t_kill = None
    try:
        while p.poll() is None:
            if socks is None and port:
                socks = Sockets(port[0])
            v = socks.read() if socks else None
            now = time.monotonic()
            if v:
                samples.append((now, v))
            if t_ready is None and ready.is_set():
                t_ready = now
            if (t_kill is None and t_ready is not None and
                    now >= t_ready + a.kill_at):
                os.kill(pids["server.1"], signal.SIGKILL)
                t_kill = time.monotonic()
            time.sleep(0.05)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        p.wait()
        th.join(timeout=5)
    if p.returncode != 0 or t_kill is None:
        sys.exit("launch exited %d (kill %s); its output:\n%s"
                 % (p.returncode, "sent" if t_kill else "never sent",
                    "".join(lines[-30:])))
    S, W, R = a.servers, a.workers, a.replicas
    N = S + W
    steady_in = rate(samples, t_ready + 1.5, t_kill, 0)
    steady_out = rate(samples, t_ready + 1.5, t_kill, 1)
    if not epoch or epoch[0] < t_kill:
        sys.exit("the scheduler logged no new map epoch after the kill "
                 "(or one before it); its lines:\n%s"
                 % "".join(l for l in lines if l.startswith("[scheduler]")))
    # Every node's next heartbeat answer comes T / 5 after the new map,
    # on an idle machine; the window is longer because a loaded one
    # starves agents for seconds, and the maps are far more bytes than
    # the heartbeats whose estimate is taken out.
    t_end = t_kill + a.window
    w0, w1 = at(samples, t_kill, 1), at(samples, t_end, 1)
    if None in (steady_in, steady_out, w0, w1) or samples[-1][0] < t_end:
        sys.exit("too few samples: the steady span or the burst was "
                 "not seen")
    span = t_end - t_kill
    return {"fig": "sched-bytes", "rep": rep, "servers": S, "workers": W,
            "replicas": R, "timeout_s": T,
            "hb_in_bytes_per_s": round(steady_in),
            "hb_in_formula": round(N * 48 / (T / 5)),
            "hb_out_bytes_per_s": round(steady_out),
            "hb_out_formula": round(N * 40 / (T / 5)),
            "failover_burst_bytes": round(w1 - w0 - steady_out * span),
            "kill_to_epoch_ms": round((epoch[0] - t_kill) * 1000),
            "failover_burst_formula": (N - 1) * map_bytes(S, R),
            "load": os.getloadavg()[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--servers", type=int, default=8)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1.0,
                    help="EMB_HEARTBEAT_TIMEOUT, seconds")
    ap.add_argument("--kill-at", type=float, default=5.0,
                    help="seconds after the cluster formed")
    ap.add_argument("--window", type=float, default=5.0,
                    help="seconds after the kill counted as its burst")
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    if a.replicas < 2 or a.servers < 2:
        sys.exit("needs --replicas >= 2 and at least 2 servers, so that "
                 "the job survives the kill")
    if a.kill_at < 2.5:
        sys.exit("--kill-at must leave 1 s of steady state after 1.5 s")
    for rep in range(1, a.reps + 1):
        with tempfile.TemporaryDirectory(prefix="emb-sched-bytes-") as d:
            print(json.dumps(run(a, rep, d)), flush=True)


if __name__ == "__main__":
    main()
