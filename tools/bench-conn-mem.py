#!/usr/bin/env python3
"""tools/bench-conn-mem.py - memory and threads per TCP connection, on both
ends: an embstore-server holding many idle clients, and one worker's client
connected to many servers.

Server side: starts `embstore-server --listen 127.0.0.1:0 --threads T
--max-conns N+64`, then opens connections from this process in steps (0,
100, 500, 1000 by default). Each connection logs in as a client does, with
a HELLO (docs/protocol.md) whose answer is read before the next one opens,
then stays idle. After each step, and a settle time past the server's idle
trim (2 s, src/transport/tcp.c), it reads the server's VmRSS, RssAnon and
Threads from /proc/PID/status.

Client side: one embstore client (the Python package over libembstore)
connected to S servers, for S in the client steps (1, 10, 100 by default),
each in a fresh Python process: its RSS and threads just before and after
emb_client_create() (a first client, connected before and kept open, takes
the library's one-time allocations out of the figure). The
S addresses are one server's, repeated: the client opens one connection
per entry, as it does to distinct servers, so one server process stands
for S (the script checks that S sockets were opened); --client-distinct
starts one server per connection instead.

Busy (--busy BYTES): after the last server step, every connection sends
one PING of BYTES (a request of that size: 8192 is a small one, 1048576
a push of 4096 rows of dim 64) and the server's RSS is read while the
echoes are still unread, so that every connection holds its request at
once (the highest RSS, once it has not grown for a second); then the
echoes are read and RSS is read again after --settle.

Storm (--storm N): N connections opened at once to a fresh server, the
way a job's workers all connect to each server as it starts; prints how
long each connect() took (p50, p99, max) and how many took 1 s or more:
a SYN dropped because the server's accept queue (listen backlog) was
full is sent again after the kernel's initial 1 s timeout.

Kernel side: the socket's kernel objects are not in any RSS; when
/proc/slabinfo is readable (root) the object sizes of one TCP socket's
caches are printed (TCP, sock_inode_cache, filp, dentry, eventpoll_epi).

Prints one JSON object per measurement, then a summary: bytes per
connection as the least-squares slope of RSS over connections.

usage: bench-conn-mem.py [--build DIR] [--server-conns 0,100,500,1000]
                         [--client-servers 1,10,100] [--threads T]
                         [--settle SEC] [--reps N] [--storm N]
                         [--client-distinct] [--busy BYTES]
"""
import argparse
import json
import os
import re
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

MAGIC = 0x31424d45  # "EMB1"
OP_HELLO = 1
OP_PING = 2
HDR = struct.Struct("<IBBHQIIIi")  # docs/protocol.md, frame header
SLAB_CACHES = ("TCP", "sock_inode_cache", "filp", "dentry", "eventpoll_epi")


def status(pid):
    """VmRSS and RssAnon in bytes, and Threads, of pid."""
    out = {}
    with open("/proc/%s/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon"):
                out[k] = int(v.split()[0]) * 1024
            elif k == "Threads":
                out[k] = int(v)
    return out


def sockets(pid):
    """Sockets pid holds open."""
    n = 0
    d = "/proc/%s/fd" % pid
    for fd in os.listdir(d):
        try:
            if os.readlink(os.path.join(d, fd)).startswith("socket:"):
                n += 1
        except OSError:
            pass
    return n


def recv_all(s, n):
    buf = b""
    while len(buf) < n:
        b = s.recv(n - len(buf))
        if not b:
            raise ConnectionError("server closed the connection")
        buf += b
    return buf


def hello(port, req_id):
    """A connection logged in with a HELLO, as a client opens one."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    name = b"bench-conn-mem/tcp"
    payload = struct.pack("<IHH", 1, 0, len(name)) + name
    s.sendall(HDR.pack(MAGIC, 1, OP_HELLO, 0, req_id, 0, 0, len(payload), 0)
              + payload)
    h = HDR.unpack(recv_all(s, HDR.size))
    body = recv_all(s, h[7])
    if h[2] != OP_HELLO | 0x80 or h[8] != 0:
        msg = body[4:].decode(errors="replace") if h[8] < 0 else ""
        raise ConnectionError("HELLO refused: status %d %s" % (h[8], msg))
    return s


def ping_send(s, req_id, nbytes):
    """Sends one PING of nbytes on s, as a busy connection's request."""
    s.sendall(HDR.pack(MAGIC, 1, OP_PING, 0, req_id, 0, 0, nbytes, 0)
              + bytes(nbytes))


def ping_recv(s, nbytes):
    """Reads the echo of ping_send()."""
    h = HDR.unpack(recv_all(s, HDR.size))
    body = recv_all(s, h[7])
    if h[2] != OP_PING | 0x80 or h[8] != 0 or len(body) != nbytes:
        raise ConnectionError("PING refused: status %d" % h[8])


def start_server(build, threads, max_conns, log):
    cmd = [os.path.join(build, "tools", "embstore-server"), "--listen",
           "127.0.0.1:0", "--threads", str(threads), "--transport", "tcp",
           "--max-conns", str(max_conns), "--idle-timeout", "0"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                         stderr=open(log, "w"))
    for _ in range(200):
        with open(log) as f:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", f.read())
        if m:
            return p, int(m.group(1))
        if p.poll() is not None:
            break
        time.sleep(0.05)
    p.kill()
    p.wait()
    sys.exit("embstore-server did not start:\n" + open(log).read())


def slope(points):
    """Least-squares bytes per connection over (conns, bytes) points."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


def server_side(a, tmp, rep):
    steps = a.server_conns
    p, port = start_server(a.build, a.threads, max(steps) + 64,
                           os.path.join(tmp, "server.log"))
    conns = []
    rows = []
    try:
        for n in steps:
            while len(conns) < n:
                conns.append(hello(port, len(conns) + 1))
            time.sleep(a.settle)
            if p.poll() is not None:
                sys.exit("embstore-server exited %d" % p.returncode)
            st = status(p.pid)
            row = {"fig": "conn-mem", "side": "server", "rep": rep,
                   "conns": n, "server_threads": a.threads,
                   "rss_bytes": st["VmRSS"], "rss_anon_bytes": st["RssAnon"],
                   "threads": st["Threads"],
                   "load": os.getloadavg()[0]}
            print(json.dumps(row), flush=True)
            rows.append(row)
        # Every connection busy at once: a PING of a.busy bytes sent on
        # each, RSS read while their echoes are still unread (the server
        # holds each request until its reply is out), then again once
        # every echo was read and the idle trim ran.
        if a.busy:
            for i, s in enumerate(conns):
                ping_send(s, 1 << 20 | i, a.busy)
            # The server reads them at its own pace: its RSS at the
            # highest, once it has grown no more for a second (30 s at
            # most).
            busy = status(p.pid)
            still, t_end = 0, time.monotonic() + 30
            while still < 4 and time.monotonic() < t_end:
                time.sleep(0.25)
                st = status(p.pid)
                still = still + 1 if st["VmRSS"] <= busy["VmRSS"] else 0
                if st["VmRSS"] > busy["VmRSS"]:
                    busy = st
            for s in conns:
                ping_recv(s, a.busy)
            time.sleep(a.settle)
            for when, st in (("busy", busy), ("after", status(p.pid))):
                row = {"fig": "conn-mem", "side": "server", "rep": rep,
                       "conns": len(conns), "state": when,
                       "ping_bytes": a.busy,
                       "server_threads": a.threads,
                       "rss_bytes": st["VmRSS"],
                       "rss_anon_bytes": st["RssAnon"],
                       "threads": st["Threads"],
                       "load": os.getloadavg()[0]}
                print(json.dumps(row), flush=True)
    finally:
        for s in conns:
            s.close()
        p.terminate()
        p.wait()
    return rows


def client_child(a):
    """In a fresh process: RSS, anonymous RSS and threads this process
    gained by connecting one client to a.child_conns servers, the first
    of a.child_ports (or the one port repeated); one JSON line on
    stdout."""
    sys.path.insert(0, os.path.join(a.src, "python"))
    os.environ.setdefault("EMBSTORE_LIB", os.path.join(
        a.build, "src", "worker", "libembstore.so"))
    import embstore  # noqa: E402 (needs the path set above)

    n = a.child_conns
    ports = a.child_ports if len(a.child_ports) > 1 else a.child_ports * n
    servers = ",".join("127.0.0.1:%d" % p for p in ports[:n])
    # A first client to one server, kept open: the library's one-time
    # allocations (logging, the allocator's arenas) are not per connection,
    # and nothing freed is there for the measured client to reuse.
    first = embstore.connect("127.0.0.1:%d" % ports[0], transport="tcp")
    before = status(os.getpid())
    socks = sockets(os.getpid())
    c = embstore.connect(servers, transport="tcp", timeout_ms=30000)
    time.sleep(a.settle)
    after = status(os.getpid())
    opened = sockets(os.getpid()) - socks
    c.close()
    first.close()
    print(json.dumps({"opened": opened,
                      "rss_bytes": after["VmRSS"] - before["VmRSS"],
                      "rss_anon_bytes": after["RssAnon"] - before["RssAnon"],
                      "threads": after["Threads"] - before["Threads"]}))


def client_side(a, tmp, rep):
    steps = a.client_servers
    # One server taking every connection, or (--client-distinct) one
    # server per connection, as in a job.
    procs, ports = [], []
    for i in range(max(steps) if a.client_distinct else 1):
        p, port = start_server(a.build, 1, max(steps) + 64,
                               os.path.join(tmp, "server-c%d.log" % i))
        procs.append(p)
        ports.append(port)
    rows = []
    try:
        for n in steps:
            r = subprocess.run([sys.executable, os.path.abspath(__file__),
                                "--build", a.build, "--settle",
                                str(a.settle), "--client-child", str(n),
                                ",".join(map(str, ports))],
                               capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                sys.exit("client to %d servers failed:\n%s"
                         % (n, r.stderr[-2000:]))
            got = json.loads(r.stdout.splitlines()[-1])
            if got["opened"] != n:
                sys.exit("client to %d servers opened %d sockets"
                         % (n, got["opened"]))
            row = {"fig": "conn-mem", "side": "client", "rep": rep,
                   "conns": n, "distinct": a.client_distinct,
                   "rss_bytes": got["rss_bytes"],
                   "rss_anon_bytes": got["rss_anon_bytes"],
                   "threads": got["threads"], "load": os.getloadavg()[0]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        for p in procs:
            p.terminate()
            p.wait()
    return rows


def storm(a, tmp, rep):
    """a.storm connections opened at once to a fresh server, as a job's
    workers open theirs to each server when it starts: how long each
    connect() took to complete. A SYN the server's full accept queue
    dropped is sent again after the kernel's initial 1 s timeout, so the
    connects that took 1 s or more are the ones the queue turned away."""
    n = a.storm
    p, port = start_server(a.build, a.threads, n + 64,
                           os.path.join(tmp, "server-s.log"))
    sel = selectors.DefaultSelector()
    socks, took = [], []
    try:
        t_open = {}
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            t_open[s] = time.monotonic()
            socks.append(s)
            sel.register(s, selectors.EVENT_WRITE)
        deadline = time.monotonic() + 30
        while len(took) < n and time.monotonic() < deadline:
            for k, _ in sel.select(1):
                s = k.fileobj
                took.append(time.monotonic() - t_open[s])
                sel.unregister(s)
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    sys.exit("a connect failed: %s" % os.strerror(
                        s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
    finally:
        for s in socks:
            s.close()
        p.terminate()
        p.wait()
    if len(took) < n:
        sys.exit("%d of %d connects did not complete in 30 s"
                 % (n - len(took), n))
    took.sort()
    row = {"fig": "conn-storm", "rep": rep, "conns": n,
           "server_threads": a.threads,
           "p50_ms": round(took[n // 2] * 1000, 1),
           "p99_ms": round(took[min(n - 1, n * 99 // 100)] * 1000, 1),
           "max_ms": round(took[-1] * 1000, 1),
           "over_1s": sum(t >= 1.0 for t in took),
           "load": os.getloadavg()[0]}
    print(json.dumps(row), flush=True)
    return row


def slab_sizes():
    """objsize of each cache a TCP socket takes, or None (not root)."""
    try:
        with open("/proc/slabinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        f = line.split()
        if f and f[0] in SLAB_CACHES and f[0] not in out:
            out[f[0]] = int(f[3])
    return out


def ints(s):
    return [int(x) for x in s.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--server-conns", type=ints, default=[0, 100, 500, 1000])
    ap.add_argument("--client-servers", type=ints, default=[1, 10, 100])
    ap.add_argument("--threads", type=int, default=2,
                    help="the server's event loop threads")
    ap.add_argument("--settle", type=float, default=2.5,
                    help="seconds between a step and its reading")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--storm", type=int, default=0, metavar="N",
                    help="also open N connections at once to a fresh "
                    "server and time each connect")
    ap.add_argument("--busy", type=int, default=0, metavar="BYTES",
                    help="after the last server step, one PING of BYTES "
                    "on every connection, RSS read at once and after "
                    "--settle")
    ap.add_argument("--client-distinct", action="store_true",
                    help="one server process per client connection")
    ap.add_argument("--client-child", nargs=2, metavar=("CONNS", "PORTS"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    a.src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if a.client_child:
        a.child_conns = int(a.client_child[0])
        a.child_ports = ints(a.client_child[1])
        client_child(a)
        return
    if len(a.server_conns) < 2 or len(a.client_servers) < 2:
        sys.exit("give at least two steps on each side")

    with tempfile.TemporaryDirectory(prefix="emb-conn-mem-") as tmp:
        srv, cli = [], []
        for rep in range(1, a.reps + 1):
            srv.append(server_side(a, tmp, rep))
            cli.append(client_side(a, tmp, rep))
            if a.storm:
                storm(a, tmp, rep)

    def per_conn(runs, key):
        v = [slope([(r["conns"], r[key]) for r in run]) for run in runs]
        return {"median": statistics.median(v), "min": min(v), "max": max(v)}

    summary = {"fig": "conn-mem-summary",
               "server_bytes_per_conn": per_conn(srv, "rss_bytes"),
               "server_anon_bytes_per_conn": per_conn(srv, "rss_anon_bytes"),
               "server_threads": sorted({r["threads"] for run in srv
                                         for r in run}),
               "client_bytes_per_conn": per_conn(cli, "rss_bytes"),
               "client_anon_bytes_per_conn": per_conn(cli, "rss_anon_bytes"),
               "client_threads_added": sorted({r["threads"] for run in cli
                                               for r in run}),
               "kernel_slab_objsize": slab_sizes()}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
