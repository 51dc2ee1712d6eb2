#!/usr/bin/env python3
"""tests/chaos/chaos.py - a replicated embstore job under faults, for minutes.

Runs `embstore launch --server_num 3 --worker_num 2 --replicas 2 --
embstore-bench --op step --verify --report-interval ...` for the whole
duration and injects one fault every --fault-every seconds, cycling through
every kind in a seeded random order at seeded random moments:

  kill       SIGKILL a server; a replacement embstore-server registers,
             takes the dead rank and is filled (docs/replication.md)
  stop       SIGSTOP a server past the heartbeat timeout, then SIGCONT
  partition  cut a server's link for a few seconds, then heal it: every
             server runs in a network namespace of its own, joined to the
             job's by a veth on a bridge (needs root; skipped otherwise)
  sched      SIGKILL the scheduler; launch restarts it if it does, else
             this script does, at the same port with the same environment
  hog        stress-ng --cpu 2 beside the job, during half of the fault
             slots (an overlay on the slot's fault, counted as a fault)
  drain      `embstore scale --remove RANK` on a live server: its slots
             move to the others while the job trains, it exits 0, and a
             newcomer takes its free rank and is given its share by moves
             (docs/replication.md, "Moving slots"); other faults of later
             slots may land in those moves

Whenever the scheduler removes a server, whatever the cause, or a drained
one leaves, a replacement is started. At the end it checks that every worker exited 0 with a verify
line of 0 mismatched and that the job ran its whole duration, and prints
the faults of each kind, recovery times (fault to "server R is a full
replica" in the scheduler's log, or for the scheduler to `embstore stat`
showing every server live with no slot lost or filling), the workers' step
latency p50/p99 before and during faults (from the bench's interval
lines), and false death verdicts (a server declared dead that no fault
touched). Exit status: 0 when every check held, 1 when one failed, 2 for
bad usage, 77 when the job cannot run here (meson's SKIP).

  chaos.py --bin-dir BUILD/tools [--minutes M | --seconds S] [--json] ...

--self-check exit|mismatch|early makes one worker misbehave (exit 3 after a
clean verify line; a "1 mismatched" verify line with exit 0; stop at half
time) so that a run shows this script catches each failure.
"""

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

NET = "10.79.0"  # the job's /24 inside its own namespaces
SERVERS = 3
WORKERS = 2
REPLICAS = 2

# What the scheduler, launch and the bench print (docs/replication.md).
RE_ASSIGNED = re.compile(r"assigned server rank (\d+) to (\S+) \(pid (\d+)\)")
RE_REPLACES = re.compile(r"server (\d+) \((\S+), pid (\d+)\) replaces a dead")
RE_AGAIN = re.compile(r"server (\d+) \((\S+)\) registered again \(pid (\d+)\)")
RE_JOINS = re.compile(r"server (\d+) \((\S+), pid (\d+)\) joins at a free rank")
RE_DEAD = re.compile(r"server (\d+) \(([^)]*)\) declared dead: (.*)")
RE_REMOVED = re.compile(r"map epoch \d+: server (\d+) removed")
RE_FULL = re.compile(r"map epoch \d+: server (\d+) is a full replica")
RE_LEFT = re.compile(r"server (\d+) left the job")
RE_SHARE = re.compile(r"map epoch \d+: server (\d+) has its share")
RE_LOST = re.compile(r"lost every holder")
RE_INTERVAL = re.compile(
    r"^\[worker\.(\d+)\] interval: ([\d.]+) s, (\d+) batches, "
    r"p50 ([\d.]+) us, p99 ([\d.]+) us, max ([\d.]+) us")
RE_VERIFY = re.compile(
    r"^\[worker\.(\d+)\] verify: (\d+) rows checked, (\d+) mismatched")
RE_EXIT = re.compile(r"^\[launch\] worker\.(\d+) (exited with (\d+)|killed by .*)")
RE_SCHED_PID = re.compile(r"^\[launch\] started scheduler, pid (\d+)")
RE_SERVER_PID = re.compile(r"^\[launch\] started server\.\d+, pid (\d+)")
RE_SCHED_ADDR = re.compile(r"^\[launch\] scheduler on ([^,]+),")
RE_JOINED = re.compile(r"^\[worker\.(\d+)\] .*worker \d+ of \d+ joined")
RE_TROUBLE = re.compile(r"failed|declared dead|lost every|cannot go on|"
                        r"exited with [1-9]|killed by|error")


def log(msg):
    print("[chaos] " + msg, file=sys.stderr, flush=True)


def signal_pid(pid, sig):
    """Sends sig to pid; False when it is gone (the job may have ended and
    taken it meanwhile)."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def sh(*cmd, check=True):
    """Runs a short command; its output is returned, a failure raised."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if check and r.returncode:
        raise RuntimeError("%s: %s" % (" ".join(cmd), r.stdout.strip()))
    return r.stdout


def pct(vals, p):
    """The p-th percentile of vals (nearest rank), None if empty."""
    if not vals:
        return None
    v = sorted(vals)
    return v[min(len(v) - 1, max(0, math.ceil(p / 100 * len(v)) - 1))]


# ---- network namespaces ---------------------------------------------------
#
# launch binds its scheduler to 127.0.0.1 of the namespace it runs in, so
# the whole job runs in a namespace of its own (the hub): launch, the
# scheduler (made to listen on 0.0.0.0 there) and the workers. Each server
# gets a namespace of its own, joined to the hub's bridge by a veth pair;
# cutting the hub end of that pair partitions it from everyone. EMB_SERVER_BIN
# points launch at a small wrapper (this script, "exec-node") that builds
# the server's namespace and then becomes the server, keeping its pid.

def netns_usable():
    return os.geteuid() == 0 and shutil.which("ip") is not None


def netns_hub_up(prefix):
    hub = prefix + "hub"
    sh("ip", "netns", "add", hub)
    sh("ip", "-n", hub, "link", "set", "lo", "up")
    sh("ip", "-n", hub, "link", "add", "name", "br0", "type", "bridge")
    sh("ip", "-n", hub, "addr", "add", NET + ".1/24", "dev", "br0")
    sh("ip", "-n", hub, "link", "set", "br0", "up")
    return hub


def netns_down(prefix):
    # Exactly ours: another run's prefix may begin with this one.
    mine = re.compile(re.escape(prefix) + r"(hub|s\d+)")
    for name in sh("ip", "netns", "list", check=False).split("\n"):
        name = name.split(" ")[0]
        if mine.fullmatch(name):
            sh("ip", "netns", "del", name, check=False)


def exec_node(args):
    """EMB_SERVER_BIN wrapper: becomes the real binary, a server in a
    namespace of its own on the hub's bridge, the scheduler listening on
    every address of the hub. Index k comes from mkdir, atomic across the
    wrappers that launch starts at once."""
    env = dict(os.environ)
    argv = [args.real] + args.rest
    if env.get("EMB_ROLE") == "scheduler" or "scheduler" in args.rest:
        env["EMB_SCHED_HOST"] = "0.0.0.0"
        os.execve(args.real, argv, env)
    for k in range(1, 200):
        try:
            os.mkdir(os.path.join(args.state, "ns%d" % k))
            break
        except FileExistsError:
            continue
    else:
        sys.exit("chaos: no namespace index left")
    ns, veth = "%ss%d" % (args.prefix, k), "%sv%d" % (args.prefix, k)
    sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", "name", veth, "type", "veth", "peer", "name",
       veth + "h")
    sh("ip", "link", "set", veth, "netns", ns)
    sh("ip", "link", "set", veth + "h", "netns", args.hub)
    sh("ip", "-n", args.hub, "link", "set", veth + "h", "master", "br0", "up")
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", ns, "link", "set", veth, "name", "eth0")
    sh("ip", "-n", ns, "addr", "add", "%s.%d/24" % (NET, 10 + k), "dev",
       "eth0")
    sh("ip", "-n", ns, "link", "set", "eth0", "up")
    with open(os.path.join(args.state, "ns%d" % k, "pid"), "w") as f:
        f.write("%d\n" % os.getpid())
    env["EMB_SCHED_HOST"] = NET + ".1"
    env["EMB_LISTEN"] = "0.0.0.0:0"
    env.pop("EMB_METRICS_LISTEN", None)
    os.execvpe("ip", ["ip", "netns", "exec", ns] + argv, env)


# ---- the run --------------------------------------------------------------

class Run:
    def __init__(self, a):
        self.a = a
        self.t0 = time.monotonic()
        self.lines = []  # (t, text), every source, in arrival order
        self.mu = threading.Lock()
        self.cv = threading.Condition(self.mu)
        self.procs = []  # what this script started, killed at the end
        self.readers = []
        self.rng = random.Random(a.seed)
        self.work = a.work or tempfile.mkdtemp(prefix="emb-chaos-")
        os.makedirs(self.work, exist_ok=True)
        self.logf = open(os.path.join(self.work, "chaos.log"), "w")
        self.prefix = "ch%d" % (os.getpid() % 100000)
        self.hub = None
        self.faults = []  # one dict per fault
        self.sched_pid = None
        self.sched_env = None
        self.sched_addr = None
        self.ranks = {}  # rank -> pid of its server
        self.addr_pid = {}  # a server's registered address -> its pid
        self.launch_servers = set()  # pids launch started
        self.replacing = {}  # rank -> time a replacement was started
        self.parsed = 0  # lines consumed by update()
        self.deaths = []  # (t, rank, reason)
        self.removed = []  # (t, rank)
        self.full = []  # (t, rank)
        self.left = []  # (t, rank): drained servers that left
        self.share = []  # (t, rank): joiners given their share
        self.lost = []  # (t, line)
        self.intervals = []  # (t, worker, batches, p50_us, p99_us)
        self.verify = {}  # worker -> (checked, mismatched)
        self.exits = {}  # worker -> exit code (or "killed ...")
        self.exit_t = {}  # worker -> when launch saw it exit
        self.joined = set()  # workers that joined the cluster
        self.joined_t = None  # when the last of them did
        self.excerpts = []  # notable lines, with time
        self.restarts = {"launch": 0, "chaos": 0}

    def now(self):
        return time.monotonic() - self.t0

    # -- processes and their output --

    def reader(self, f, tag):
        for raw in f:
            line = raw.rstrip("\n")
            if tag:
                line = "[%s] %s" % (tag, line)
            with self.cv:
                t = self.now()
                self.lines.append((t, line))
                self.logf.write("%9.3f %s\n" % (t, line))
                self.cv.notify_all()

    def start(self, argv, tag, env=None, keep=True):
        p = subprocess.Popen(argv, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             text=True, errors="replace", env=env,
                             cwd=self.work, start_new_session=True)
        th = threading.Thread(target=self.reader, args=(p.stdout, tag),
                              daemon=True)
        th.start()
        self.readers.append(th)
        if keep:
            self.procs.append(p)
        return p

    def in_hub(self, argv):
        return ["ip", "netns", "exec", self.hub] + argv if self.hub else argv

    def note(self, msg):
        with self.cv:
            t = self.now()
            self.lines.append((t, "[chaos] " + msg))
            self.logf.write("%9.3f [chaos] %s\n" % (t, msg))
        log(msg)

    def update(self):
        """Reads the lines that came since the last call into the state."""
        with self.mu:
            new = self.lines[self.parsed:]
            self.parsed = len(self.lines)
        for t, line in new:
            m = (RE_ASSIGNED.search(line) or RE_REPLACES.search(line) or
                 RE_AGAIN.search(line) or RE_JOINS.search(line))
            if m and line.startswith("[scheduler"):
                self.ranks[int(m.group(1))] = int(m.group(3))
                self.addr_pid[m.group(2)] = int(m.group(3))
                self.replacing.pop(int(m.group(1)), None)
            m = RE_DEAD.search(line)
            if m and line.startswith("[scheduler"):
                self.deaths.append((t, int(m.group(1)), m.group(3),
                                    self.addr_pid.get(m.group(2))))
            m = RE_REMOVED.search(line)
            if m and line.startswith("[scheduler"):
                self.removed.append((t, int(m.group(1))))
                self.ranks.pop(int(m.group(1)), None)
            m = RE_FULL.search(line)
            if m and line.startswith("[scheduler"):
                self.full.append((t, int(m.group(1))))
            m = RE_LEFT.search(line)
            if m and line.startswith("[scheduler"):
                self.left.append((t, int(m.group(1))))
                self.ranks.pop(int(m.group(1)), None)
            m = RE_SHARE.search(line)
            if m and line.startswith("[scheduler"):
                self.share.append((t, int(m.group(1))))
            if RE_LOST.search(line):
                self.lost.append((t, line))
            m = RE_INTERVAL.search(line)
            if m:
                self.intervals.append((t, int(m.group(1)), int(m.group(3)),
                                       float(m.group(4)), float(m.group(5))))
            m = RE_VERIFY.search(line)
            if m:
                self.verify[int(m.group(1))] = (int(m.group(2)),
                                                int(m.group(3)))
            m = RE_EXIT.search(line)
            if m:
                self.exits[int(m.group(1))] = (int(m.group(3)) if m.group(3)
                                               else m.group(2))
                self.exit_t[int(m.group(1))] = t
            m = RE_SCHED_PID.search(line)
            if m:
                if self.sched_pid is not None:
                    self.restarts["launch"] += 1
                self.sched_pid = int(m.group(1))
            m = RE_SERVER_PID.search(line)
            if m:
                self.launch_servers.add(int(m.group(1)))
            m = RE_SCHED_ADDR.search(line)
            if m:
                self.sched_addr = m.group(1)
            m = RE_JOINED.search(line)
            if m:
                self.joined.add(int(m.group(1)))
                if len(self.joined) == WORKERS:
                    self.joined_t = t
            if (RE_TROUBLE.search(line) and "interval:" not in line and
                    len(self.excerpts) < 400):
                self.excerpts.append((t, line))

    def wait_for(self, pred, timeout):
        end = time.monotonic() + timeout
        while True:
            self.update()
            if pred():
                return True
            left = end - time.monotonic()
            if left <= 0:
                return False
            with self.cv:
                self.cv.wait(min(left, 0.2))

    def sleep(self, secs):
        """Sleeps, replacing servers the scheduler removes meanwhile."""
        end = time.monotonic() + secs
        while True:
            self.update()
            self.replace_dead()
            left = end - time.monotonic()
            if left <= 0 or self.launch.poll() is not None:
                return
            time.sleep(min(left, 0.2))

    # -- the job --

    def bench_cmd(self, worker_secs):
        b = os.path.join(self.a.bin_dir, "embstore-bench")
        bench = [b, "--op", "step", "--verify", "--rows", str(self.a.rows),
                 "--dim", "8", "--batch", "256", "--duration",
                 str(worker_secs), "--report-interval",
                 str(self.a.report_interval)]
        sc = self.a.self_check
        if not sc:
            return bench
        # One worker misbehaves: the other runs as usual.
        q = " ".join("'%s'" % x for x in bench)
        half = " ".join("'%s'" % x for x in
                        bench[:bench.index("--duration") + 1] +
                        [str(max(1, worker_secs // 2))] +
                        bench[bench.index("--duration") + 2:])
        bad = {"exit": q + "; exit 3",
               "mismatch": q + " | sed 's/, 0 mismatched/, 1 mismatched/'",
               "early": "exec " + half}[sc]
        # The first worker to make the directory is the one.
        flag = os.path.join(self.work, "self-check")
        return ["sh", "-c", "if mkdir '%s' 2>/dev/null; then %s; "
                "else exec %s; fi" % (flag, bad, q)]

    def start_job(self):
        env = dict(os.environ)
        for k in ("EMB_REPLICAS", "EMB_SCHED_HOST", "EMB_SCHED_PORT",
                  "EMB_ROLE", "EMB_LISTEN", "EMB_SERVER_BIN"):
            env.pop(k, None)
        env["EMB_HEARTBEAT_TIMEOUT"] = str(self.a.hb_timeout)
        env["EMB_CLUSTER_TIMEOUT"] = "60"
        env["PATH"] = self.a.bin_dir + ":" + env.get("PATH", "")
        if self.hub:
            state = os.path.join(self.work, "ns")
            os.makedirs(state, exist_ok=True)
            wrap = os.path.join(self.work, "embstore-server-ns")
            with open(wrap, "w") as f:
                f.write("#!/bin/sh\nexec '%s' '%s' exec-node --real '%s' "
                        "--hub '%s' --prefix '%s' --state '%s' -- \"$@\"\n"
                        % (sys.executable, os.path.abspath(__file__),
                           os.path.join(self.a.bin_dir, "embstore-server"),
                           self.hub, self.prefix, state))
            os.chmod(wrap, 0o755)
            env["EMB_SERVER_BIN"] = wrap
            self.server_bin = wrap
        else:
            self.server_bin = os.path.join(self.a.bin_dir, "embstore-server")
        self.env = env
        cmd = [os.path.join(self.a.bin_dir, "embstore"), "launch",
               "--server_num", str(SERVERS), "--worker_num", str(WORKERS),
               "--replicas", str(REPLICAS), "--log-dir",
               os.path.join(self.work, "log"), "--"]
        # The workers' own clock: the timed phase starts once both joined.
        cmd += self.bench_cmd(self.a.seconds)
        self.launch = self.start(self.in_hub(cmd), None, env=env)
        ok = self.wait_for(lambda: self.sched_addr and self.joined_t and
                           len(self.ranks) == SERVERS, 90)
        if not ok:
            raise RuntimeError("the job did not form")
        with open("/proc/%d/environ" % self.sched_pid, "rb") as f:
            self.sched_env = dict(
                kv.split("=", 1) for kv in
                f.read().decode(errors="replace").split("\0") if "=" in kv)
        self.note("job formed: scheduler %s (pid %d), servers %s" %
                  (self.sched_addr, self.sched_pid, self.ranks))

    def server_env(self):
        env = dict(self.sched_env)
        env["EMB_ROLE"] = "server"
        env["EMB_SCHED_HOST"] = "127.0.0.1"
        env["EMB_SCHED_PORT"] = self.sched_addr.rsplit(":", 1)[1]
        env["EMB_LISTEN"] = "127.0.0.1:0"
        env.pop("EMB_METRICS_LISTEN", None)
        return env

    def replace_dead(self):
        """Starts one replacement per rank the scheduler removed and no
        server took back yet (a kill, a verdict, right or false). A
        replacement that has not registered in 30 s is tried again."""
        if self.launch.poll() is not None:
            return
        dead = ({r for _, r in self.removed} |
                {r for _, r in self.left}) - set(self.ranks)
        now = time.monotonic()
        for r in sorted(dead):
            if now - self.replacing.get(r, -1e9) < 30:
                continue
            self.replacing[r] = now
            n = sum(1 for p in self.procs if getattr(p, "tag", "") ==
                    "server")
            tag = "new.%d" % n
            p = self.start(self.in_hub([self.server_bin]), tag,
                           env=self.server_env())
            p.tag = "server"
            self.note("rank %d removed: replacement %s started (pid %d)" %
                      (r, tag, p.pid))

    def pick_server(self):
        live = sorted(self.ranks.items())
        return self.rng.choice(live) if live else (None, None)

    def ns_of(self, pid):
        state = os.path.join(self.work, "ns")
        for d in os.listdir(state):
            try:
                with open(os.path.join(state, d, "pid")) as f:
                    if int(f.read()) == pid:
                        return "%sv%sh" % (self.prefix, d[2:])
            except (OSError, ValueError):
                pass
        return None

    def stat_whole(self):
        """`embstore stat` shows every server live, nothing lost or
        filling."""
        r = subprocess.run(self.in_hub([os.path.join(self.a.bin_dir,
                                                     "embstore"), "stat",
                                        "--sched", self.sched_addr,
                                        "--interval", "0.2"]),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=20)
        out = r.stdout
        live = len(re.findall(r"^\S+\s+live\s", out, re.M))
        return (r.returncode == 0 and live == SERVERS and
                " 0 lost slots" in out and "filling" not in out)

    # -- faults --

    def fault(self, kind, hog):
        f = {"kind": kind, "t": self.now(), "hog": hog, "target": None,
             "recovery_s": None, "died": False, "ok": True, "note": ""}
        self.faults.append(f)
        if kind in ("kill", "stop", "partition", "drain"):
            rank, pid = self.pick_server()
            if rank is None:
                f["note"] = "no live server"
                return f
            f["target"] = rank
            f["pid"] = pid
        if kind == "kill":
            self.note("fault kill: SIGKILL server %d (pid %d)" % (rank, pid))
            f["t"] = self.now()
            signal_pid(pid, signal.SIGKILL)
        elif kind == "stop":
            hold = self.a.hb_timeout * 3 + self.rng.uniform(0, 2)
            self.note("fault stop: SIGSTOP server %d (pid %d) for %.1f s" %
                      (rank, pid, hold))
            f["t"] = self.now()
            signal_pid(pid, signal.SIGSTOP)
            self.sleep(hold)
            signal_pid(pid, signal.SIGCONT)
            self.note("SIGCONT server %d" % rank)
        elif kind == "partition":
            veth = self.ns_of(pid)
            if not veth:
                f["note"] = "server %d has no namespace" % rank
                return f
            hold = self.rng.uniform(3, 8)
            self.note("fault partition: server %d (pid %d) cut off for "
                      "%.1f s (%s down)" % (rank, pid, hold, veth))
            f["t"] = self.now()
            sh("ip", "-n", self.hub, "link", "set", veth, "down")
            self.sleep(hold)
            sh("ip", "-n", self.hub, "link", "set", veth, "up")
            self.note("partition of server %d healed" % rank)
        elif kind == "sched":
            self.fault_sched(f)
        elif kind == "drain":
            self.note("fault drain: embstore scale --remove %d (pid %d)" %
                      (rank, pid))
            f["t"] = self.now()
            r = subprocess.run(
                self.in_hub([os.path.join(self.a.bin_dir, "embstore"),
                             "scale", "--sched", self.sched_addr,
                             "--remove", str(rank)]),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                timeout=30)
            if r.returncode:
                # Refused (a move or fill under way, a server short):
                # the job goes on as it was.
                f["note"] = "refused: " + r.stdout.strip()[-120:]
        return f

    def fault_sched(self, f):
        old = self.sched_pid
        self.note("fault sched: SIGKILL the scheduler (pid %d)" % old)
        f["t"] = self.now()
        signal_pid(old, signal.SIGKILL)
        # launch may restart it; if it does not within 3 s, we do, at the
        # same port and with the environment it had.
        if self.wait_for(lambda: self.sched_pid != old, 3):
            f["note"] = "restarted by launch"
        elif self.a.restart_scheduler and self.launch.poll() is None:
            argv = [os.path.join(self.a.bin_dir, "embstore-server"),
                    "--role", "scheduler"]
            p = self.start(self.in_hub(argv), "scheduler", env=self.sched_env)
            self.sched_pid = p.pid
            self.restarts["chaos"] += 1
            f["note"] = "restarted by chaos.py"
            self.note("scheduler restarted by chaos.py (pid %d)" % p.pid)
        else:
            f["note"] = "not restarted"
            return
        end = time.monotonic() + 60
        while time.monotonic() < end and self.launch.poll() is None:
            try:
                if self.stat_whole():
                    f["recovery_s"] = self.now() - f["t"]
                    return
            except subprocess.TimeoutExpired:
                pass
            self.sleep(0.5)

    def settle(self, f):
        """Recovery of a server fault: from the fault to "server R is a
        full replica" after its removal; none when it was not removed."""
        if f["target"] is None or f["kind"] == "sched":
            return
        t = f["t"]
        if f["kind"] == "drain":
            # Recovered once the rank's newcomer has its share (a death
            # meanwhile makes it a failover, measured as one).
            gone = [x for x, r in self.left if r == f["target"] and x >= t]
            if gone:
                f["left_s"] = gone[0] - t
                sh_ = [x for x, r in self.share
                       if r == f["target"] and x >= gone[0]]
                if sh_:
                    f["recovery_s"] = sh_[0] - t
                return
        rem = [x for x, r in self.removed if r == f["target"] and x >= t]
        if not rem:
            return
        f["died"] = True
        ful = [x for x, r in self.full if r == f["target"] and x >= rem[0]]
        if ful:
            f["recovery_s"] = ful[0] - t

    def run_faults(self):
        kinds = self.a.kinds
        F = self.a.fault_every
        base = time.monotonic() + self.a.quiet
        # No fault in the last stretch: the job must finish and verify.
        stop_at = time.monotonic() + self.a.seconds - min(F, 30)
        order = []
        slot = 0
        self.sleep(self.a.quiet)
        self.faults_t0 = self.now()
        hog_phase = self.rng.randrange(2)
        while self.launch.poll() is None:
            begin = base + slot * F
            if begin >= stop_at or (self.a.max_faults and
                                    slot >= self.a.max_faults):
                break
            if not order:
                order = list(k for k in kinds if k != "hog")
                self.rng.shuffle(order)
            kind = order.pop(0) if order else None
            hog = "hog" in kinds and slot % 2 == hog_phase
            at = begin + self.rng.uniform(0, F / 3)
            self.sleep(max(0, begin - time.monotonic()))
            hogp = None
            if hog:
                secs = max(5, int(F * 0.9))
                hogp = self.start(["stress-ng", "--cpu", "2", "--timeout",
                                   "%ds" % secs, "--quiet"], "hog")
                self.note("CPU hog: stress-ng --cpu 2 for %d s" % secs)
                self.faults.append({"kind": "hog", "t": self.now(),
                                    "hog": True, "target": None,
                                    "recovery_s": None, "died": False})
            self.sleep(max(0, at - time.monotonic()))
            if kind and self.launch.poll() is None:
                f = self.fault(kind, hog)
                self.sleep(max(0, min(begin + F, stop_at) - time.monotonic()))
                self.settle(f)
            if hogp and hogp.poll() is None:
                hogp.terminate()
            slot += 1
        self.faults_t1 = self.now()

    # -- the report --

    def figures(self, rc_launch, job_s):
        # A drain's newcomer may get its share after the drain's slot.
        self.update()
        for f in self.faults:
            if f["kind"] == "drain" and f.get("recovery_s") is None:
                self.settle(f)
        fig = {"seconds": self.a.seconds, "seed": self.a.seed,
               "fault_every_s": self.a.fault_every,
               "netns": bool(self.hub), "launch_exit": rc_launch,
               "job_s": round(job_s, 1)}
        count = {}
        for f in self.faults:
            count[f["kind"]] = count.get(f["kind"], 0) + 1
        fig["faults"] = count
        rec = [f["recovery_s"] for f in self.faults
               if f.get("recovery_s") is not None]
        fig["recovery_s"] = {
            "n": len(rec),
            "p50": round(pct(rec, 50), 3) if rec else None,
            "max": round(max(rec), 3) if rec else None,
            "each": [{"kind": f["kind"], "target": f["target"],
                      "at_s": round(f["t"], 1), "died": f["died"],
                      "recovery_s": (round(f["recovery_s"], 3)
                                     if f.get("recovery_s") is not None
                                     else None),
                      "note": f.get("note", "")}
                     for f in self.faults]}
        before = [iv for iv in self.intervals if iv[0] < self.faults_t0]
        during = [iv for iv in self.intervals
                  if self.faults_t0 <= iv[0] <= self.faults_t1]

        def lat(ivs):
            # Per-interval p50 and p99, batch-weighted: an interval's
            # percentiles stand for its batches. Intervals of 0 batches
            # (stalls) count apart.
            p50 = [iv[3] for iv in ivs for _ in range(min(iv[2], 1000))]
            p99 = [iv[4] for iv in ivs for _ in range(min(iv[2], 1000))]
            return {"intervals": len(ivs),
                    "stalled": sum(1 for iv in ivs if iv[2] == 0),
                    "batches": sum(iv[2] for iv in ivs),
                    "p50_us": pct(p50, 50), "p99_us": pct(p99, 99)}
        fig["step_latency"] = {"before_faults": lat(before),
                               "during_faults": lat(during)}
        # A verdict is false when no fault touched that server (by pid:
        # a replacement takes the dead one's rank and may die for it).
        hit = {f.get("pid") for f in self.faults}
        false = []
        for t, rank, why, pid in self.deaths:
            if pid not in hit:
                false.append({"at_s": round(t, 1), "rank": rank,
                              "pid": pid, "reason": why})
        fig["death_verdicts"] = len(self.deaths)
        fig["false_death_verdicts"] = false
        fig["workers"] = {str(w): {"exit": self.exits.get(w),
                                   "verify": self.verify.get(w)}
                          for w in range(WORKERS)}
        fig["slots_lost"] = len(self.lost)
        fig["scheduler_restarts"] = self.restarts
        return fig

    def checks(self, fig):
        bad = []
        for w in range(WORKERS):
            e, v = self.exits.get(w), self.verify.get(w)
            if e != 0:
                bad.append("worker.%d exited %s" % (w, e))
            if v is None:
                bad.append("worker.%d printed no verify line" % w)
            elif v[1] != 0:
                bad.append("worker.%d: %d mismatched of %d rows" %
                           (w, v[1], v[0]))
        if fig["launch_exit"] != 0:
            bad.append("launch exited %s" % fig["launch_exit"])
        for w in range(WORKERS):
            # Joined to exit: preload and the verify pass make it a
            # little longer than the timed run, never shorter.
            ran = self.exit_t.get(w, 0) - (self.joined_t or 0)
            if w in self.exit_t and ran < self.a.seconds - 1:
                bad.append("worker.%d ended early: after %.1f s of %d" %
                           (w, ran, self.a.seconds))
        return bad

    def print_human(self, fig, bad):
        out = sys.stdout
        print("chaos: %d s, seed %d, a fault every %d s, partition %s" %
              (fig["seconds"], fig["seed"], fig["fault_every_s"],
               "by namespace" if fig["netns"] else "skipped"), file=out)
        print("faults: %s" % ", ".join("%s %d" % kv for kv in
                                       sorted(fig["faults"].items())),
              file=out)
        for f in fig["recovery_s"]["each"]:
            print("  %7.1f s  %-9s %-8s %s%s" % (
                f["at_s"], f["kind"],
                "" if f["target"] is None else "rank %d" % f["target"],
                "recovered in %.2f s" % f["recovery_s"]
                if f["recovery_s"] is not None else
                ("not recovered" if f["died"] or f["kind"] in
                 ("sched", "drain") else "no failover"),
                (" (%s)" % f["note"]) if f["note"] else ""), file=out)
        r = fig["recovery_s"]
        print("recovery: %d measured, p50 %s s, max %s s" %
              (r["n"], r["p50"], r["max"]), file=out)
        for k, v in fig["step_latency"].items():
            print("step latency %s: p50 %s us, p99 %s us (%d intervals, "
                  "%d stalled, %d batches)" %
                  (k.replace("_", " "), v["p50_us"], v["p99_us"],
                   v["intervals"], v["stalled"], v["batches"]), file=out)
        print("death verdicts: %d, false: %d%s" % (
            fig["death_verdicts"], len(fig["false_death_verdicts"]),
            "".join("\n  %.1f s rank %d (pid %s): %s" % (
                x["at_s"], x["rank"], x["pid"], x["reason"])
                    for x in fig["false_death_verdicts"])), file=out)
        for w, v in sorted(fig["workers"].items()):
            print("worker.%s: exit %s, verify %s" % (w, v["exit"],
                                                     v["verify"]), file=out)
        print("result: %s" % ("ok" if not bad else "FAILED: " +
                              "; ".join(bad)), file=out)

    def cleanup(self):
        launch = getattr(self, "launch", None)
        if launch and launch.poll() is None:
            # launch stops its own children on SIGINT.
            launch.send_signal(signal.SIGINT)
            try:
                launch.wait(20)
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        # Servers of a launch killed outright outlive it: those still
        # registered with this job's scheduler port (a pid may have been
        # reused since, so the environment says whose it is).
        port = "EMB_SCHED_PORT=%s" % (self.sched_addr or "").rsplit(":", 1)[-1]
        for pid in set(self.ranks.values()) | self.launch_servers:
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    if port.encode() + b"\0" in f.read():
                        os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self.hub:
            netns_down(self.prefix)
        self.logf.close()


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", required=True,
                    help="where embstore, embstore-server, embstore-bench are")
    ap.add_argument("--minutes", type=float)
    ap.add_argument("--seconds", type=int, default=180)
    ap.add_argument("--fault-every", type=int, default=60)
    ap.add_argument("--max-faults", type=int, default=0,
                    help="stop injecting after this many slots (0: none)")
    ap.add_argument("--quiet", type=int, default=20,
                    help="seconds without faults first (latency before)")
    ap.add_argument("--kinds", default="kill,stop,partition,sched,drain,hog")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hb-timeout", type=int, default=1,
                    help="EMB_HEARTBEAT_TIMEOUT of the job, seconds")
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--report-interval", type=float, default=2)
    ap.add_argument("--netns", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--no-restart-scheduler", dest="restart_scheduler",
                    action="store_false",
                    help="leave a killed scheduler to launch alone")
    ap.add_argument("--self-check", choices=["exit", "mismatch", "early"])
    ap.add_argument("--work", help="directory for logs (default: a temp)")
    ap.add_argument("--keep", action="store_true", help="keep the logs")
    ap.add_argument("--json", action="store_true",
                    help="the figures as one JSON object on stdout")
    a = ap.parse_args(argv)
    if a.minutes:
        a.seconds = int(a.minutes * 60)
    a.kinds = [k for k in a.kinds.split(",") if k]
    for k in a.kinds:
        if k not in ("kill", "stop", "partition", "sched", "hog", "drain"):
            ap.error("unknown fault kind %r" % k)
    if a.seconds < 10 or a.fault_every < 5:
        ap.error("--seconds must be >= 10 and --fault-every >= 5")
    a.bin_dir = os.path.abspath(a.bin_dir)
    # The job runs with the work directory as its cwd: a relative one
    # would name a directory inside itself.
    if a.work:
        a.work = os.path.abspath(a.work)
    return a


def main(argv):
    if argv[:1] == ["exec-node"]:
        ap = argparse.ArgumentParser()
        for o in ("--real", "--hub", "--prefix", "--state"):
            ap.add_argument(o, required=True)
        ap.add_argument("rest", nargs=argparse.REMAINDER)
        a = ap.parse_args(argv[1:])
        if a.rest[:1] == ["--"]:
            a.rest = a.rest[1:]
        exec_node(a)
        return 1
    a = parse_args(argv)
    for b in ("embstore", "embstore-server", "embstore-bench"):
        if not os.access(os.path.join(a.bin_dir, b), os.X_OK):
            log("no %s in %s" % (b, a.bin_dir))
            return 2
    if "hog" in a.kinds and not shutil.which("stress-ng"):
        log("no stress-ng: CPU hogs left out")
        a.kinds.remove("hog")
    r = Run(a)
    use_ns = a.netns == "on" or (a.netns == "auto" and netns_usable())
    if "partition" in a.kinds and not use_ns:
        log("partition left out: network namespaces need root and ip(8)")
        a.kinds.remove("partition")
    rc = 1
    try:
        if use_ns:
            try:
                r.hub = netns_hub_up(r.prefix)
            except RuntimeError as e:
                if a.netns == "on":
                    raise
                log("partition left out: cannot make namespaces (%s)" % e)
                netns_down(r.prefix)
                if "partition" in a.kinds:
                    a.kinds.remove("partition")
        r.start_job()
        started = r.now()
        r.run_faults()
        # The job's own end, then its verify lines.
        while r.launch.poll() is None and r.now() < started + a.seconds + 150:
            r.sleep(1)
        if r.launch.poll() is None:
            r.note("launch still running %d s past the job's end: stopped" %
                   150)
            r.launch.send_signal(signal.SIGINT)
            r.launch.wait(30)
        job_s = r.now() - r.joined_t
        for th in r.readers[:1]:
            th.join(10)
        r.update()
        fig = r.figures(r.launch.returncode, job_s)
        bad = r.checks(fig)
        fig["failures"] = bad
        fig["excerpts"] = ["%.3f %s" % x for x in r.excerpts[:80]]
        if a.json:
            print(json.dumps(fig))
        else:
            r.print_human(fig, bad)
            if bad:
                print("notable lines (s since start):")
                for t, line in r.excerpts[:60]:
                    print("  %8.3f %s" % (t, line))
        rc = 1 if bad else 0
    except RuntimeError as e:
        log("error: %s" % e)
        r.update()
        for t, line in r.lines[-40:]:
            print("  %8.3f %s" % (t, line), file=sys.stderr)
        rc = 1
    finally:
        r.cleanup()
        if a.keep or a.work:
            log("logs in %s" % r.work)
        else:
            shutil.rmtree(r.work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
