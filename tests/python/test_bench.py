"""python3 -m embstore.bench: the same id stream and JSON keys as
embstore-bench --servers."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import tool
from embstore.bench import IdStream, id_hash

ARGS = ["--rows", "20000", "--dim", "8", "--batch", "512", "--batches",
        "30", "--json"]


def _py(servers, *extra):
    out = subprocess.run([sys.executable, "-m", "embstore.bench",
                          "--servers", servers, *ARGS, *extra],
                         capture_output=True, text=True, check=True)
    assert "rows/s" in out.stderr  # the summary goes to stderr with --json
    return json.loads(out.stdout)


def _c(servers, *extra):
    out = subprocess.run([tool("embstore-bench"), "--servers", servers,
                          *ARGS, *extra], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("dist", ["zipf:1.05", "uniform"])
def test_same_ids_and_keys_as_embstore_bench(servers, dist):
    c = _c(servers, "--dist", dist, "--op", "pull")
    py = _py(servers, "--dist", dist, "--op", "pull")
    # The same 30 batches: the same distinct ids per batch.
    assert py["unique_per_batch"] == c["unique_per_batch"]
    assert set(py) <= set(c)
    for k in ("op", "backend", "transport", "dist", "table", "optimizer",
              "rows", "dim", "batch", "threads", "seed", "batches",
              "bytes_fetched_per_batch"):
        assert py[k] == c[k], k
    assert py["rows_per_s"] > 0 and py["p99_us"] >= py["p50_us"] > 0


@pytest.mark.parametrize("op", ["push", "step"])
def test_push_and_step(servers, op):
    r = _py(servers, "--op", op, "--no-preload")
    assert r["op"] == op and r["batches"] == 30 and r["rows_per_s"] > 0


def test_duration_and_bad_arguments(servers):
    r = _py(servers, "--batches", "0", "--duration", "0.3")
    assert r["batches"] > 0 and 0.2 < r["elapsed_s"] < 5
    bad = subprocess.run([sys.executable, "-m", "embstore.bench",
                          "--servers", servers, "--dist", "zipf:0"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "zipf" in bad.stderr


def test_zipf_stream_is_skewed_and_in_range():
    g = IdStream("zipf:1.05", 1000, seed=1)
    ranks = g.ranks(20000)
    assert ranks.max() < 1000
    counts = np.bincount(ranks.astype(np.int64), minlength=1000)
    assert counts[0] > counts[10] > counts[500]
    assert id_hash(np.uint64(0)) == 0


def _c_local(*extra):
    out = subprocess.run([tool("embstore-bench"), "--in-process",
                          "--no-preload", "--op", "step", *ARGS, *extra],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_admission_and_eviction_flags(servers):
    """--admit count:2 stores only the ids seen twice, in process and on
    servers; every distinct id is pulled at least once before admission (over the
    wire as in process: a batch is one sighting); --evict
    max_rows holds the table near its size; bad specs are refused."""
    off = _c_local()
    assert off["admit"] == "none" and off["evict"] == "none"
    assert off["rows_held"] == off["rows_created"] > 0
    assert off["pulls_unadmitted"] == 0 and off["filter_bytes"] == 0
    on = _c_local("--admit", "count:2")
    assert on["admit"] == "count:2"
    assert 0 < on["rows_held"] < off["rows_held"]
    assert on["pulls_unadmitted"] >= off["rows_held"]
    assert on["filter_bytes"] > 0
    net = _c(servers, "--no-preload", "--op", "step", "--table",
             "bench_admit", "--admit", "count:2")
    assert net["rows_held"] == on["rows_held"]
    capped = _c_local("--evict", "max_rows:2000")
    assert capped["rows_held"] <= 2000 + 512
    assert capped["rows_evicted"] == capped["rows_created"] - \
        capped["rows_held"] > 0
    for flag, bad in (("--admit", "count:1"), ("--evict", "ttl:0"),
                      ("--admit", "bloom:2:1k")):
        r = subprocess.run([tool("embstore-bench"), "--in-process", flag,
                            bad], capture_output=True, text=True)
        assert r.returncode != 0 and f"bad {flag}" in r.stderr


def test_policies_under_replicas(tmp_path):
    """A replicated cluster takes admission (the holders apply what the
    primaries admitted: docs/replication.md) and eviction (pushes name
    births; the backups check theirs), and the two together; the same job
    without a policy runs."""
    def job(*extra):
        return subprocess.run(
            [tool("embstore"), "launch", "--server_num", "2",
             "--worker_num", "1", "--replicas", "2", "--log-dir",
             str(tmp_path / ("log" + "".join(extra))), "--",
             tool("embstore-bench"), "--rows", "1000", "--dim", "4",
             "--batch", "64", "--batches", "2", *extra],
            capture_output=True, text=True, timeout=120)
    assert job().returncode == 0
    r = job("--admit", "count:2")
    assert r.returncode == 0, r.stdout + r.stderr
    r = job("--evict", "ttl:5")
    assert r.returncode == 0, r.stdout + r.stderr
    r = job("--admit", "count:2", "--evict", "max_rows:500")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("multi", [False, True])
def test_tables_per_step(servers, multi):
    """--tables N: each batch pulls and pushes N tables, one call per
    table or one pull_many + push_many (--multi); the wire carries N
    tables' rows either way."""
    one = _c(servers, "--op", "step", "--table", "tps")
    extra = ["--multi"] if multi else []
    r = _c(servers, "--op", "step", "--table", "tps", "--tables", "3",
           *extra)
    assert r["tables"] == 3 and r["multi"] is multi and r["batches"] == 30
    assert one["tables"] == 1 and one["multi"] is False
    # Per-batch figures are rounded averages.
    assert abs(r["bytes_fetched_per_batch"] -
               3 * one["bytes_fetched_per_batch"]) <= 3


def test_tables_need_servers():
    bad = subprocess.run([tool("embstore-bench"), "--in-process",
                          "--tables", "2"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--tables" in bad.stderr
    bad = subprocess.run([tool("embstore-bench"), "--tables", "0"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "--tables" in bad.stderr


def test_row_format_through_servers(servers):
    """--row-format through servers: the table is made compact there and
    a pull's rows cross the wire in its format, fp16 half of fp32's bytes,
    decoded back to the same fp32 bytes for the bench."""
    runs = {f: _c(servers, "--op", "pull", "--table", f"bench_{f}",
                  "--row-format", f) for f in ("fp32", "fp16")}
    assert runs["fp16"]["row_format"] == "fp16"
    assert runs["fp16"]["bytes_fetched"] == runs["fp32"]["bytes_fetched"]
    assert runs["fp16"]["wire_bytes_in"] < 0.6 * runs["fp32"]["wire_bytes_in"]
