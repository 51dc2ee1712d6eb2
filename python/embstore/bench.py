"""python3 -m embstore.bench: embstore-bench's client loop, from Python.

    python3 -m embstore.bench --servers HOST:PORT[,...] [--rows N] [--dim N]
        [--batch N] [--dist uniform|zipf:S] [--op pull|push|step]
        [--duration S | --batches N] [--json] [--optimizer SPEC] [--seed N]
        [--table NAME] [--transport T] [--no-preload]

It does what `embstore-bench --servers` does with one thread (docs/bench.md):
create the table (the same spec, so both tools can share one), preload its
rows with pulls, then time each batch's pull, push or both. The ids are the
same stream as the C tool's thread 0 (splitmix64, Zipf by
rejection-inversion, rank -> row -> emb_id_hash), drawn outside the clock.
rows_per_s is ids sent / time inside the calls, so comparing it with the C
tool's figure against the same servers gives the cost of the binding. The
JSON line has embstore-bench's keys (threads is 1, cache_mode "none").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from . import connect
from .errors import Error

GOLDEN = np.uint64(0x9e3779b97f4a7c15)
_U = np.uint64
CHUNK = 64  # batches drawn per call of the id stream


def id_hash(x):
    """emb_id_hash() (src/common/hash.h) over uint64 arrays or scalars."""
    x = np.asarray(x, dtype=np.uint64).copy()
    x ^= x >> _U(33)
    x *= _U(0xff51afd7ed558ccd)
    x ^= x >> _U(33)
    x *= _U(0xc4ceb9fe1a85ec53)
    x ^= x >> _U(33)
    return x


class IdStream:
    """tools/bench_ids.c's emb_idgen for one stream, vectorized: the draws
    of splitmix64 depend only on the state's start and their index, so a
    block of them is one array expression."""

    def __init__(self, dist: str, rows: int, seed: int, stream: int = 0):
        if not 1 <= rows <= 2**32:
            raise ValueError("rows must be 1..2^32")
        self.rows = rows
        with np.errstate(over="ignore"):
            self.state = int(id_hash(_U(seed % 2**64) ^ id_hash(
                _U(stream + 1))))
        m = max(int(rows * 0.6180339887498949), 1)
        while math.gcd(m, rows) != 1:
            m += 1
        self.mult = m % rows or 1
        if dist == "uniform":
            self.s = None
        elif dist.startswith("zipf:"):
            self.s = float(dist[5:])
            if not 0 < self.s <= 10:
                raise ValueError("zipf exponent must be in (0, 10]")
            self.h_x1 = self._hint(1.5) - 1.0
            self.h_n = self._hint(rows + 0.5)
            self.s_accept = 2.0 - self._hint_inv(self._hint(2.5) -
                                                 self._h(2.0))
        else:
            raise ValueError(f"bad --dist {dist!r}: uniform or zipf:S")

    def _units(self, n: int) -> np.ndarray:
        """The next n splitmix64 outputs, as raw uint64."""
        with np.errstate(over="ignore"):
            z = _U(self.state) + GOLDEN * np.arange(1, n + 1, dtype=_U)
            self.state = (self.state + n * int(GOLDEN)) % 2**64
            z = (z ^ (z >> _U(30))) * _U(0xbf58476d1ce4e5b9)
            z = (z ^ (z >> _U(27))) * _U(0x94d049bb133111eb)
            return z ^ (z >> _U(31))

    def _h(self, x):
        return np.exp(-self.s * np.log(x))

    @staticmethod
    def _helper1(x):
        x = np.asarray(x, dtype=np.float64)
        small = np.abs(x) <= 1e-8
        safe = np.where(small, 1.0, x)
        return np.where(small, 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x)),
                        np.log1p(safe) / safe)

    @staticmethod
    def _helper2(x):
        x = np.asarray(x, dtype=np.float64)
        small = np.abs(x) <= 1e-8
        safe = np.where(small, 1.0, x)
        return np.where(small, 1.0 + x * 0.5 * (1.0 + x / 3.0 *
                                                (1.0 + 0.25 * x)),
                        np.expm1(safe) / safe)

    def _hint(self, x):
        lx = np.log(x)
        return self._helper2((1.0 - self.s) * lx) * lx

    def _hint_inv(self, x):
        t = np.maximum(x * (1.0 - self.s), -1.0)
        return np.exp(self._helper1(t) * x)

    def ranks(self, n: int) -> np.ndarray:
        if self.s is None:
            r = self._units(n)
            return ((r >> _U(32)) * _U(self.rows)) >> _U(32)
        out = np.empty(0, dtype=_U)
        while len(out) < n:
            # Candidates are consumed in order, one draw each, so taking
            # the first accepted ones and rewinding past the rest keeps the
            # C tool's exact sequence.
            want = n - len(out)
            start = self.state
            cand = int(want * 1.3) + 16
            u01 = (self._units(cand) >> _U(11)).astype(np.float64) \
                * 2.0**-53
            u = self.h_n + u01 * (self.h_x1 - self.h_n)
            x = self._hint_inv(u)
            kd = np.clip(np.floor(x + 0.5), 1.0, float(self.rows))
            ok = (kd - x <= self.s_accept) | \
                (u >= self._hint(kd + 0.5) - self._h(kd))
            idx = np.flatnonzero(ok)[:want]
            if len(idx) == want:
                used = int(idx[-1]) + 1
                self.state = (start + used * int(GOLDEN)) % 2**64
            out = np.concatenate([out, kd[idx].astype(_U) - _U(1)])
        return out

    def batch(self, n: int) -> np.ndarray:
        """n feature ids: emb_id_hash(rank * mult mod rows)."""
        with np.errstate(over="ignore"):
            rows = (self.ranks(n) * _U(self.mult)) % _U(self.rows)
            return id_hash(rows)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _percentile(lat_ns: np.ndarray, p: float) -> float:
    return float(np.percentile(lat_ns, p)) / 1e3 if len(lat_ns) else 0.0


def run(args) -> dict:
    client = connect(servers=args.servers, transport=args.transport,
                     name="embstore-bench-py", timeout_ms=60000)
    try:
        return _run(args, client)
    finally:
        client.close()


def _run(args, client) -> dict:
    # The spec of embstore-bench's client backend (default initializer),
    # so both tools open the same table.
    t = client.table(args.table, args.dim, optimizer=args.optimizer,
                     init="uniform:-0.05,0.05", seed=args.seed)
    n, dim = args.batch, args.dim
    out = np.empty((n, dim), dtype=np.float32)
    pre_s = pre_cpu_s = 0.0
    if args.preload:
        t0, c0 = time.perf_counter(), time.thread_time()
        for lo in range(0, args.rows, n):
            ids = id_hash(np.arange(lo, min(lo + n, args.rows), dtype=_U))
            t.pull(ids, out[:len(ids)])
        pre_s = time.perf_counter() - t0
        pre_cpu_s = time.thread_time() - c0
    rss = _rss_bytes()
    st = t.stats()
    # Small gradients in [-1e-3, 1e-3] keep weights finite for any run.
    grads = ((np.random.default_rng(args.seed).integers(0, 2001, (n, dim))
              - 1000) * 1e-6).astype(np.float32)
    gen = IdStream(args.dist, args.rows, args.seed)
    do_pull = args.op in ("pull", "step")
    do_push = args.op in ("push", "step")
    lat = []
    uniq_sum = 0
    busy = 0
    # Batches are drawn CHUNK at a time: numpy's fixed cost per call is
    # then shared, and fewer temporaries pass through the caches between
    # two timed calls.
    chunk: list = []
    sent0 = client.stats()
    wall0 = time.perf_counter()
    deadline = time.monotonic() + args.duration
    while (len(lat) < args.batches) if args.batches else \
            (time.monotonic() < deadline):
        if not chunk:
            block = gen.batch(n * CHUNK).reshape(CHUNK, n)
            chunk = [block[i] for i in range(CHUNK - 1, -1, -1)]
            uniq_sum += sum(len(np.unique(b)) for b in chunk)
        ids = chunk.pop()
        t0 = time.perf_counter_ns()
        if do_pull:
            t.pull(ids, out)
        if do_push:
            t.push(ids, grads)
        t1 = time.perf_counter_ns()
        lat.append(t1 - t0)
        busy += t1 - t0
    elapsed = time.perf_counter() - wall0
    # Batches drawn but not timed do not count in unique_per_batch.
    for b in chunk:
        uniq_sum -= len(np.unique(b))
    sent1 = client.stats()
    lat_ns = np.array(lat, dtype=np.float64)
    batches = len(lat)
    rows_per_s = batches * n / (busy / 1e9) if busy else 0.0
    fetched = (sent1["ids_sent"] - sent0["ids_sent"]) * dim * 4 \
        if do_pull and not do_push else 0
    res = {
        "op": args.op, "backend": "client", "transport": client.transport,
        "dist": args.dist, "table": args.table, "optimizer": t.optimizer,
        "rows": args.rows, "dim": dim, "batch": n, "threads": 1,
        "seed": args.seed, "batches": batches,
        "elapsed_s": round(elapsed, 3), "rows_per_s": round(rows_per_s),
        "mb_per_s": round(rows_per_s * dim * 4 * (2 if args.op == "step"
                                                  else 1) / 1e6, 1),
        "p50_us": round(_percentile(lat_ns, 50), 1),
        "p90_us": round(_percentile(lat_ns, 90), 1),
        "p99_us": round(_percentile(lat_ns, 99), 1),
        "max_us": round(float(lat_ns.max()) / 1e3 if batches else 0.0, 1),
        "mean_us": round(float(lat_ns.mean()) / 1e3 if batches else 0.0, 1),
        "unique_per_batch": round(uniq_sum / batches if batches else 0.0, 1),
        "preload_rows_per_s": round(args.rows / pre_s) if pre_s else 0,
        "preload_cpu_rows_per_s": round(args.rows / pre_cpu_s)
        if pre_cpu_s else 0,
        "bytes_per_row": round(st["bytes"] / st["rows"], 1)
        if st["rows"] else 0.0,
        "rss_bytes": rss, "rss_bytes_per_row": round(rss / args.rows, 1),
        "cache_mode": "none", "cache_rows": 0, "prefetch": 0,
        "staleness": 0, "compute_us": 0, "cache_hit_ratio": 0.0,
        "bytes_fetched": fetched,
        "bytes_fetched_per_batch": round(fetched / batches) if batches
        else 0,
        "wire_bytes_in": sent1["bytes_in"] - sent0["bytes_in"],
        "wire_bytes_out": sent1["bytes_out"] - sent0["bytes_out"],
    }
    t.close()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m embstore.bench",
        description="embstore-bench's client loop from Python")
    ap.add_argument("--servers", required=True, help="host:port,...")
    ap.add_argument("--transport", default="tcp", help="tcp, rdma or auto")
    ap.add_argument("--rows", type=int, default=1000000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--dist", default="zipf:1.05")
    ap.add_argument("--op", default="pull", choices=("pull", "push", "step"))
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--batches", type=int, default=0,
                    help="exactly N timed batches instead of --duration")
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--table", default="bench")
    ap.add_argument("--no-preload", dest="preload", action="store_false")
    ap.add_argument("--json", action="store_true",
                    help="one JSON line on stdout; the summary to stderr")
    args = ap.parse_args(argv)
    if not 1 <= args.rows <= 2**32 or args.batch < 1 or args.dim < 1:
        ap.error("--rows must be 1..2^32, --batch and --dim positive")
    try:
        IdStream(args.dist, args.rows, args.seed)
        r = run(args)
    except (Error, ValueError) as e:
        print(f"embstore.bench: {e}", file=sys.stderr)
        return 1
    summary = (f"embstore.bench: {r['op']} on table \"{r['table']}\": "
               f"{r['rows']} rows x {r['dim']} floats, batch {r['batch']}, "
               f"{r['dist']}, {r['transport']}\n"
               f"  rate     {r['rows_per_s'] / 1e6:.2f} M rows/s, "
               f"{r['mb_per_s']:.0f} MB/s, {r['unique_per_batch']:.0f} "
               f"distinct ids/batch\n"
               f"  latency  p50 {r['p50_us']:.1f} us, p90 {r['p90_us']:.1f} "
               f"us, p99 {r['p99_us']:.1f} us, max {r['max_us']:.1f} us")
    print(summary, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(r, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
