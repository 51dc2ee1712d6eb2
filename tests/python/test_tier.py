"""tests/python/test_tier.py - a server whose table is ten times its memory
limit (--tier-dir, docs/store.md "The device tier"): pulls, pushes and
whole-row pulls (the write-back cache's) reach every row; embstore stat
shows the tier; a consistent dump holds every row; its checkpoints carry
the rows on the device; killed with SIGKILL and started again on the same
directories it serves every row exactly as it was at its last checkpoint,
and the dead process's tier file is gone. With --remote-read, a tiered
table serves every row as well.
"""
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import embstore
from conftest import tool

DIM = 128
ROWS = 240_000          # 528-byte records (SGD): 127 MB of rows
LIMIT = 12 << 20        # the server's --mem-limit: a tenth of that
BATCH = 2048


def checkpoints(log: Path) -> int:
    return len(re.findall(r"checkpoint \S+: 1 tables", log.read_text()))


def wait_checkpoints(log: Path, n: int) -> None:
    """Until the log holds n checkpoints of the table (60 s at most)."""
    deadline = time.monotonic() + 60
    while checkpoints(log) < n:
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.05)


def whole_rows(t, ids: np.ndarray) -> np.ndarray:
    """Every row of ids with its optimizer state, asserting each exists."""
    out = np.empty((len(ids), t.row_floats), dtype=np.float32)
    found = np.zeros(len(ids), dtype=np.uint8)
    for lo in range(0, len(ids), BATCH):
        hi = min(lo + BATCH, len(ids))
        t.pull(ids[lo:hi], out[lo:hi], create=False, found=found[lo:hi],
               with_state=True)
    assert found.all(), f"{int((found == 0).sum())} rows missing"
    return out


def test_ten_times_memory_survives_sigkill(start_server, tmp_path):
    tier, ck = tmp_path / "tier", tmp_path / "ck"
    tier.mkdir()
    args = ("--mem-limit", str(LIMIT), "--tier-dir", str(tier),
            "--table-shards", "2", "--threads", "2",
            "--checkpoint-dir", str(ck), "--checkpoint-interval", "1",
            "--checkpoint-full-every", "3")
    s = start_server(*args)
    ids = np.arange(ROWS, dtype=np.uint64) * 7919 + 3
    rng = np.random.default_rng(5)
    with embstore.connect(servers=s.addr, transport="tcp") as c:
        t = c.table("big", DIM, optimizer="sgd:lr=0.05")
        for lo in range(0, ROWS, BATCH):
            part = ids[lo:lo + BATCH]
            t.push(part, rng.standard_normal((len(part), DIM),
                                             dtype=np.float32))
        # Random traffic over all of them: rows come back from the device
        # and go again, while checkpoints walk both tiers.
        for _ in range(80):
            part = np.unique(rng.choice(ids, BATCH))
            t.pull(part)
            t.push(part, rng.standard_normal((len(part), DIM),
                                             dtype=np.float32))
        st = t.stats()
        assert st.rows == ROWS
        # Most rows are on the device, and the table's DRAM (slabs,
        # index, the device rows' index) stays near the limit: the cold
        # index (10 bytes a row) is charged past it, never refused.
        assert st.rows_cold > ROWS * 8 // 10, st
        assert st.bytes < 2 * LIMIT, st
        assert st.tier_reads > 0 and st.tier_writes > 0, st
        # embstore stat shows the tier under the table's row.
        out = subprocess.run([tool("embstore"), "stat", "--servers", s.addr,
                              "--interval", "0.5"], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        m = re.search(r"tier: (\d+) rows on the device \((\d+) %\), file "
                      r"[\d.]+ MiB; \S+ reads/s", out.stdout)
        assert m and int(m.group(1)) > ROWS * 8 // 10, out.stdout
        # A consistent dump (a point-in-time view) holds every row.
        run = subprocess.run([tool("embstore"), "dump", "--servers", s.addr,
                              "--table", "big", "--out",
                              str(tmp_path / "dump"), "--consistent",
                              "--quiet"], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr
        run = subprocess.run([tool("embstore"), "inspect",
                              str(tmp_path / "dump")], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0 and f"rows {ROWS} " in run.stdout and \
            "consistent: every row as of one instant" in run.stdout, \
            run.stdout + run.stderr
        # Two checkpoints begun after the last push: the second holds it.
        wait_checkpoints(s.log, checkpoints(s.log) + 2)
        before = whole_rows(t, ids)
    files = list(tier.glob("*.tier"))
    assert len(files) == 1 and files[0].stat().st_size > 100 << 20, files
    # The limit left room for a batch in DRAM beside the device rows'
    # index.
    assert "rows are made past the limit" not in s.log.read_text()
    s.kill()

    s2 = start_server(*args)
    assert re.search(r"loaded: 1 tables, \d+ rows read \(full ",
                     s2.log.read_text()), s2.log.read_text()
    # The killed server's file went; the new one's is there.
    assert [f.name for f in tier.glob("*.tier")] != [files[0].name]
    assert not files[0].exists()
    with embstore.connect(servers=s2.addr, transport="tcp") as c:
        t = c.open_table("big")
        after = whole_rows(t, ids)
        assert t.stats().rows == ROWS
    assert np.array_equal(before, after)


def fill(t, start: int, limit: int, expect: str) -> int:
    """Pushes new rows from id start on, BATCH at a time, until a push
    raises the error named expect (limit rows at most); the rows made."""
    rng = np.random.default_rng(start)
    made = 0
    while made < limit:
        part = np.arange(start + made, start + made + BATCH,
                         dtype=np.uint64)
        try:
            t.push(part, rng.standard_normal((BATCH, t.dim),
                                             dtype=np.float32))
        except embstore.TableError as e:
            assert e.name == expect, e
            return made
        made += BATCH
    raise AssertionError(f"{limit} rows made, no {expect}")


def test_per_table_tier(start_server, tmp_path):
    """A CREATE's own tier: "off" keeps a table in DRAM on a tiered
    server (refused at the limit, never on the device), "on" with
    tier_max bounds its file; a checkpoint keeps both across a restart;
    a server without --tier-dir refuses "on"."""
    tier, ck = tmp_path / "tier", tmp_path / "ck"
    tier.mkdir()
    args = ("--mem-limit", "16M", "--tier-dir", str(tier),
            "--table-shards", "2", "--checkpoint-dir", str(ck),
            "--checkpoint-interval", "3600")
    s = start_server(*args)
    rng = np.random.default_rng(1)
    ids = np.arange(4096, dtype=np.uint64)
    with embstore.connect(servers=s.addr, transport="tcp") as c:
        dense = c.table("dense", 32, optimizer="sgd", tier="off")
        wide = c.table("wide", 32, optimizer="sgd", tier="on",
                       tier_max="4M")
        assert dense.spec()["tier"] == "off"
        assert wide.spec()["tier"] == "on" and \
            wide.spec()["tier_max"] == 4 << 20
        for t in (dense, wide):
            t.push(ids, rng.standard_normal((len(ids), 32),
                                            dtype=np.float32))
        with pytest.raises(ValueError):
            c.table("bad", 8, tier="sometimes")
        with pytest.raises(ValueError):
            c.table("bad", 8, tier_max="4Q")
    assert not list(tier.glob("dense.*.tier"))
    assert len(list(tier.glob("wide.*.tier"))) == 1
    assert s.stop() == 0  # the final checkpoint holds both tables
    [ckpt] = ck.glob("ckpt-*")
    run = subprocess.run([tool("embstore"), "inspect", str(ckpt)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and \
        "device tier off, up to 0 MiB" in run.stdout and \
        "device tier on, up to 4 MiB" in run.stdout, run.stdout + run.stderr

    s = start_server(*args)
    log = s.log.read_text()
    assert re.search(r"table dense \(id \d+\) created: .*no device tier "
                     r"\(off\)", log), log
    assert re.search(r"table wide \(id \d+\) created: .*device tier up to "
                     r"4 MiB", log), log
    with embstore.connect(servers=s.addr, transport="tcp") as c:
        dense, wide = c.open_table("dense"), c.open_table("wide")
        assert dense.stats().rows == wide.stats().rows == len(ids)
        # Still off after the restart: new rows stop at the memory limit
        # and none goes to the device.
        made = fill(dense, 1 << 20, 400_000, "EMB_EMEMLIMIT")
        st = dense.stats()
        # (The refused batch may have made the rows of some shards.)
        assert st.rows_cold == 0 and \
            len(ids) + made <= st.rows < len(ids) + made + BATCH, st
        dense.drop()
        # Still on, with its own bound: the device takes rows until its
        # file is at 4 MiB.
        fill(wide, 1 << 20, 400_000, "EMB_ETIERFULL")
        st = wide.stats()
        assert st.rows_cold > 0 and 3 << 20 < st.tier_bytes <= 4 << 20, st
    assert not list(tier.glob("dense.*.tier"))

    plain = start_server("--mem-limit", "8M")
    with embstore.connect(servers=plain.addr, transport="tcp") as c:
        with pytest.raises(embstore.TableError) as e:
            c.table("wide", 32, tier="on")
        assert e.value.name == "EMB_ENOTIER", e.value
        assert "--tier-dir" in str(e.value), e.value
        # Auto on a server without a tier: an untiered table, as ever.
        t = c.table("auto", 8)
        t.push(ids, np.zeros((len(ids), 8), dtype=np.float32))
        assert t.stats().rows == len(ids)


def test_remote_read_with_tier(start_server, tmp_path):
    """--remote-read beside --tier-dir: the server starts, and a
    remote-readable table with most rows on the device serves every row
    exactly (over TCP a one-sided client pulls two-sided; the READs
    themselves are worker/onesided's, in the Soft-RoCE VM)."""
    tier = tmp_path / "tier"
    tier.mkdir()
    s = start_server("--mem-limit", "8M", "--tier-dir", str(tier),
                     "--remote-read", "--table-shards", "2")
    ids = np.arange(40_000, dtype=np.uint64) * 7919 + 3
    rows = np.repeat(np.arange(len(ids), dtype=np.float32)[:, None], 32,
                     axis=1)
    with embstore.connect(servers=s.addr, transport="tcp",
                          pull_mode="onesided") as c:
        t = c.table("rr", 32, optimizer="sgd")
        for lo in range(0, len(ids), BATCH):
            t.assign(ids[lo:lo + BATCH], rows[lo:lo + BATCH])
        got = np.empty_like(rows)
        for lo in range(0, len(ids), BATCH):
            t.pull(ids[lo:lo + BATCH], got[lo:lo + BATCH], create=False)
        assert np.array_equal(got, rows)
        st = t.stats()
        assert st.rows == len(ids) and st.rows_cold > len(ids) // 2, st


def test_eviction_reaches_the_device(start_server, tmp_path):
    """An eviction policy on a tiered table (docs/store.md, "Eviction on a
    tiered table"): max_rows counts the rows on the device and holds the
    table at its cap after every batch; a ttl set while it serves removes
    the idle rows, most of them on the device, and keeps the used ones."""
    tier = tmp_path / "tier"
    tier.mkdir()
    s = start_server("--mem-limit", str(8 << 20), "--tier-dir", str(tier),
                     "--table-shards", "2", "--threads", "2")
    rows, cap, batch = 60_000, 40_000, 2048
    ids = np.arange(rows, dtype=np.uint64) * 7919 + 3
    rng = np.random.default_rng(7)
    with embstore.connect(servers=s.addr, transport="tcp") as c:
        t = c.table("capped", 64, optimizer="sgd:lr=0.05",
                    evict=f"max_rows:{cap}")
        for lo in range(0, rows, batch):
            part = ids[lo:lo + batch]
            t.push(part, rng.standard_normal((len(part), 64),
                                             dtype=np.float32))
            assert t.stats()["rows"] <= cap
        st = t.stats()
        assert st["rows"] == cap and st["rows_cold"] > cap // 2, st
        assert st["rows_evicted_cap"] == st["rows_evicted"] == rows - cap
        # The newest rows are all there: the cold ones went first.
        found = np.zeros(batch, dtype=np.uint8)
        t.pull(ids[-batch:], create=False, found=found)
        assert found.all()

        t.set_lifecycle(evict="ttl:5")
        hot = ids[-batch:]
        for _ in range(200):
            t.pull(hot)
            t.push(hot, np.zeros((batch, 64), dtype=np.float32))
            if t.stats()["rows"] == batch:
                break
        st = t.stats()
        assert st["rows"] == batch and st["rows_cold"] == 0, st
        assert st["rows_evicted_ttl"] == cap - batch, st
        t.pull(hot, create=False, found=found)
        assert found.all()
