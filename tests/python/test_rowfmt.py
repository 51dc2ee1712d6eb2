"""Compact tables through two real servers: the row format travels with
the table, pulls give float32 (or the table's own halves, untouched),
pushes are applied in fp32 and rounded, whole rows round-trip, and
nothing out of a format's range is stored."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import embstore
from conftest import tool

DIM = 10  # odd words for fp16/bf16 rows: their tail is padding


@pytest.fixture(scope="module")
def client(servers):
    with embstore.connect(servers=servers, transport="tcp") as c:
        yield c


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    b = x.astype(np.float32).view(np.uint32)
    return ((b + 0x7fff + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "int8"])
def test_compact_table_pulls_float32(client, name, fmt):
    t = client.table(name, DIM, optimizer="sgd:lr=0.5", init="normal:0,0.5",
                     row_format=fmt)
    assert t.row_format == fmt
    assert t.spec()["row_format"] == fmt
    ids = np.arange(1, 200, dtype=np.uint64)
    rows = t.pull(ids)
    assert rows.dtype == np.float32 and rows.shape == (len(ids), DIM)
    assert np.all(np.isfinite(rows)) and rows.std() > 0.3
    # The values are the format's: they survive a round trip through it.
    if fmt == "fp16":
        np.testing.assert_array_equal(rows.astype(np.float16).astype(
            np.float32), rows)
    elif fmt == "bf16":
        np.testing.assert_array_equal(from_bf16_bits(to_bf16_bits(rows)),
                                      rows)
    else:
        # int8: at most 256 distinct values per row
        assert max(len(np.unique(r)) for r in rows) <= 256
    # Opened elsewhere, the table has its format.
    assert client.open_table(name).row_format == fmt


def test_fp16_rows_as_they_are(client, name):
    t = client.table(name, DIM, optimizer="sgd", row_format="fp16")
    ids = np.array([3, 1, 3, 77], dtype=np.uint64)
    f32 = t.pull(ids)
    h = t.pull(ids, dtype=np.float16)
    assert h.dtype == np.float16 and h.shape == (4, DIM)
    np.testing.assert_array_equal(h.astype(np.float32), f32)
    b = t.pull(ids, dtype="bfloat16")
    assert b.dtype == np.uint16
    np.testing.assert_array_equal(b, to_bf16_bits(f32))
    with pytest.raises(TypeError):
        t.pull(ids, dtype=np.int32)


def test_bf16_rows_as_they_are(client, name):
    t = client.table(name, DIM, optimizer="sgd", row_format="bf16")
    ids = np.arange(5, dtype=np.uint64)
    b = t.pull(ids, dtype="bfloat16")
    np.testing.assert_array_equal(from_bf16_bits(b), t.pull(ids))


@pytest.mark.parametrize("fmt,tol", [("fp16", 2e-3), ("bf16", 1.6e-2),
                                     ("int8", 2e-2)])
def test_push_is_applied_in_fp32_and_rounded(client, name, fmt, tol):
    t = client.table(name, DIM, optimizer="adagrad:lr=0.1", init="zeros",
                     row_format=fmt)
    ref = client.table(name + "_ref", DIM, optimizer="adagrad:lr=0.1",
                       init="zeros")
    rng = np.random.default_rng(1)
    ids = np.arange(50, dtype=np.uint64)
    for _ in range(20):
        g = rng.normal(size=(len(ids), DIM)).astype(np.float32)
        t.push(ids, g)
        ref.push(ids, g)
    got, want = t.pull(ids), ref.pull(ids)
    scale = np.abs(want).max()
    assert scale > 0.5
    assert np.abs(got - want).max() <= tol * scale * 4


def test_whole_rows_round_trip_bit_for_bit(client, name):
    t = client.table(name, DIM, optimizer="adam", row_format="int8")
    ids = np.arange(30, dtype=np.uint64)
    t.push(ids, np.ones((30, DIM), dtype=np.float32))
    whole = t.pull(ids, with_state=True)
    assert whole.shape == (30, t.row_floats)
    other = client.table(name + "_copy", DIM, optimizer="adam",
                         row_format="int8")
    other.assign(ids, whole, with_state=True)
    back = other.pull(ids, with_state=True)
    assert whole.tobytes() == back.tobytes()
    np.testing.assert_array_equal(other.pull(ids), t.pull(ids))


def test_same_name_other_format_is_refused(client, name):
    client.table(name, DIM, optimizer="sgd", row_format="fp16")
    with pytest.raises(embstore.TableError, match="row format fp16"):
        client.table(name, DIM, optimizer="sgd", row_format="bf16")
    with pytest.raises(ValueError, match="row_format"):
        client.table(name + "x", DIM, row_format="fp8")


def test_out_of_range_is_refused_and_nothing_changes(client, name):
    t = client.table(name, DIM, optimizer="sgd:lr=1", init="zeros",
                     row_format="fp16")
    ids = np.array([1, 2], dtype=np.uint64)
    before = t.pull(ids)
    g = np.zeros((2, DIM), dtype=np.float32)
    g[1, 0] = -70000.0  # weight 0 of id 2 would be 70000 > 65504
    with pytest.raises(embstore.NonFiniteError):
        t.push(ids, g)
    np.testing.assert_array_equal(t.pull(ids), before)
    rows = np.zeros((2, DIM), dtype=np.float32)
    rows[0, 0] = 1e6
    with pytest.raises(embstore.NonFiniteError, match="range"):
        t.assign(ids, rows)
    rows[0, 0] = 65504.0
    t.assign(ids, rows)
    assert t.pull(ids)[0, 0] == 65504.0


_REPLICA_JOB = """
import numpy as np
import embstore

DIM = 16
with embstore.connect() as c:
    t = c.table("rep", DIM, optimizer="adagrad:lr=0.1", row_format="{fmt}")
    # Each worker owns its ids: every copy sees one writer per row.
    ids = np.arange(c.rank, 3000, c.num_workers, dtype=np.uint64)
    rng = np.random.default_rng(c.rank)
    for step in range(15):
        t.pull(ids)
        t.push(ids, rng.normal(size=(len(ids), DIM)).astype(np.float32))
    c.barrier("trained")
    if c.rank == 0:
        every = np.arange(3000, dtype=np.uint64)
        held = []
        for addr in c.servers.split(","):
            # One server alone: its copy of every slot, primary or not.
            with embstore.connect(servers=addr, transport="tcp") as one:
                found = np.zeros(len(every), dtype=np.uint8)
                rows = one.open_table("rep").pull(every, create=False,
                                                  found=found,
                                                  with_state=True)
                assert found.all(), addr
                held.append(rows.tobytes())
        assert len(held) == 2 and held[0] == held[1], "replicas differ"
        print("replicas identical:", len(held[0]), "bytes")
    c.barrier("checked")
"""


@pytest.mark.parametrize("fmt", ["fp16", "int8"])
def test_replicas_hold_identical_bits(tmp_path, fmt):
    """Two servers holding every slot (R = 2), two workers each owning its
    ids: after training, both servers' copies of the table are the same
    bits, although the primaries made their rows at pulls and the backups
    at pushes (the rounding key counts both alike)."""
    job = tmp_path / "job.py"
    job.write_text(_REPLICA_JOB.replace("{fmt}", fmt))
    r = subprocess.run(
        [tool("embstore"), "launch", "--server_num", "2", "--worker_num",
         "2", "--replicas", "2", "--log-dir", str(tmp_path / "log"), "--",
         sys.executable, str(job)],
        capture_output=True, text=True, timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "replicas identical:" in out


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_half_precision_gradients(client, name, fmt):
    """set_push_format: gradients cross the wire in 2 bytes, rounded to
    nearest after the client summed duplicates; the servers apply exactly
    those values."""
    half = client.table(name, DIM, optimizer="sgd:lr=1", init="zeros")
    ref = client.table(name + "_ref", DIM, optimizer="sgd:lr=1",
                       init="zeros")
    half.set_push_format(fmt)
    ids = np.array([1, 2, 1, 3], dtype=np.uint64)
    rng = np.random.default_rng(3)
    g = rng.normal(size=(4, DIM)).astype(np.float32)
    sent = client.stats().bytes_out
    half.push(ids, g)
    half_bytes = client.stats().bytes_out - sent
    summed = np.stack([g[0] + g[2], g[1], g[3]])
    if fmt == "fp16":
        narrowed = summed.astype(np.float16).astype(np.float32)
    else:
        narrowed = from_bf16_bits(to_bf16_bits(summed))
    sent = client.stats().bytes_out
    ref.push(np.array([1, 2, 3], dtype=np.uint64), narrowed)
    full_bytes = client.stats().bytes_out - sent
    u = np.array([1, 2, 3], dtype=np.uint64)
    np.testing.assert_array_equal(half.pull(u), ref.pull(u))
    np.testing.assert_array_equal(half.pull(u), -narrowed)
    assert half_bytes < full_bytes


def test_half_gradients_out_of_range_and_sync(client, name):
    t = client.table(name, DIM, optimizer="sgd", init="zeros")
    t.set_push_format("fp16")
    g = np.zeros((1, DIM), dtype=np.float32)
    g[0, 0] = 1e6
    with pytest.raises(embstore.NonFiniteError, match="range"):
        t.push(np.array([1], np.uint64), g)
    assert t.stats()["rows"] == 0
    with pytest.raises(ValueError):
        t.set_push_format("int8")
    s = client.table(name + "_sync", DIM, optimizer="sgd", mode="sync")
    s.set_push_format("bf16")
    with pytest.raises(embstore.Error, match="synchronous"):
        s.push(np.array([1], np.uint64), np.ones((1, DIM), np.float32))
    s.set_push_format("fp32")
    s.push(np.array([1], np.uint64), np.ones((1, DIM), np.float32))
