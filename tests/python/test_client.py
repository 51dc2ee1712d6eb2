"""embstore's Python API against two real servers: every call, dtypes and
shapes, zero copies, futures, cached tables, stats objects."""

from __future__ import annotations

import collections.abc
import dataclasses
import typing

import numpy as np
import pytest

import embstore
from embstore import _lib

DIM = 8


@pytest.fixture(scope="module")
def client(servers):
    with embstore.connect(servers=servers, transport="tcp") as c:
        yield c


def test_connect_properties(client, servers):
    assert client.rank == 0
    assert client.num_workers == 1
    assert client.num_servers == 2
    assert client.servers == servers
    assert client.transport == "tcp"
    assert client.server_of(12345) in (0, 1)
    assert set(client.stats()) == {"requests", "bytes_out", "bytes_in",
                                   "errors", "ids_in", "ids_sent",
                                   "retries", "reconnects",
                                   "resp_copied", "rows_read",
                                   "rows_fallback", "seal_failures",
                                   "read_conn_losses"}


def test_stats_are_typed_read_only_mappings(client, name):
    t = client.table(name, DIM, optimizer="sgd:lr=1", init="zeros")
    t.pull([1, 2, 3])
    t.push([1], np.ones((1, DIM), np.float32))
    ct = t.cached(rows=8, max_batch=4)
    ct.lookup([1, 2])
    for st, cls, mirror in (
            (client.stats(), embstore.ClientStats, _lib.ClientStats),
            (t.stats(), embstore.TableStats, _lib.TableStats),
            (ct.stats(), embstore.CachedTableStats, _lib.CachedStats)):
        assert type(st) is cls
        assert isinstance(st, collections.abc.Mapping)
        # the C struct's fields, its size and padding aside
        assert set(st) == {f for f, _ in mirror._fields_
                           if f != "struct_size" and not f.startswith("_")}
        assert len(st) == len(dataclasses.fields(cls))
        assert dict(st) == dataclasses.asdict(st) == dict(st.items())
        assert st == dict(st)  # compares as the dict it used to be
        for k in st:
            assert st[k] == getattr(st, k)
        hints = typing.get_type_hints(cls)
        assert {hints[k] for k in st} <= {int, float}
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(st, next(iter(st)), 1)
        with pytest.raises(KeyError):
            st["struct_size"]
        assert st.get("nope", 7) == 7
    st = t.stats()
    assert st.rows == st["rows"] == 3 and st.servers == 2
    assert st.rows_pushed == 1
    cs = ct.stats()
    assert cs.lookups == 1 and cs.misses == 2
    assert type(cs.hit_ratio) is float and type(cs.rows) is int
    assert client.stats().ids_in >= 4


def test_auto_transport_falls_back_to_tcp(servers):
    with embstore.connect(servers=servers) as c:
        assert c.transport in ("tcp", "rdma")


def test_onesided_pull_mode_is_ignored_over_tcp(servers, name):
    with embstore.connect(servers=servers, transport="tcp",
                          pull_mode="onesided") as c:
        t = c.table(name, DIM, init="normal:0,0.1", seed=4)
        ids = np.arange(64, dtype=np.uint64)
        np.testing.assert_array_equal(
            t.pull(ids), embstore.initial_rows("normal:0,0.1", 4, ids, DIM))
        st = c.stats()
        assert st["rows_read"] == 0 and st["rows_fallback"] == 0
    with pytest.raises(ValueError):
        embstore.connect(servers=servers, transport="tcp", pull_mode="rdma")
    with pytest.raises(ValueError):
        embstore.connect(servers=servers, loc_cache_rows=-1)


def test_pull_creates_rows_from_the_initializer(client, name):
    t = client.table(name, DIM, init="normal:0,0.01", seed=7)
    ids = np.array([1, 2, 3, 2**63 + 5], dtype=np.uint64)
    rows = t.pull(ids)
    assert rows.dtype == np.float32 and rows.shape == (4, DIM)
    np.testing.assert_array_equal(
        rows, embstore.initial_rows("normal:0,0.01", 7, ids, DIM))
    assert t.stats()["rows"] == 4
    assert t.name == name and t.dim == DIM and t.optimizer == "adagrad"


def test_push_applies_the_optimizer_on_the_servers(client, name):
    t = client.table(name, DIM, optimizer="sgd:lr=0.5", init="zeros")
    ids = np.array([4, 4, 9], dtype=np.uint64)
    g = np.ones((3, DIM), dtype=np.float32)
    t.push(ids, g)
    rows = t.pull([4, 9])
    # duplicates are summed: id 4 got 2 * lr
    np.testing.assert_allclose(rows[0], -1.0)
    np.testing.assert_allclose(rows[1], -0.5)
    st = t.stats()
    assert st["pushes"] >= 1 and st["rows_pushed"] == 2


def test_adagrad_matches_its_formula(client, name):
    t = client.table(name, 2, optimizer="adagrad:lr=0.1,acc=0.1",
                     init="constant:1")
    g = np.array([[0.5, -2.0]], dtype=np.float32)
    t.push([3], g)
    acc = 0.1 + g[0] ** 2
    want = 1.0 - 0.1 * g[0] / (np.sqrt(acc) + 1e-8)
    np.testing.assert_allclose(t.pull([3])[0], want, rtol=1e-6)


def _rowwise_adagrad(w, acc, g, lr, wd):
    """rowwise_adagrad in float64, a row per line of w: g' = g + wd * w,
    acc += the mean of g'^2 over the row, w -= lr * g' / (sqrt(acc) + eps)
    with eps 1e-8."""
    gp = g.astype(np.float64) + wd * w
    acc = acc + (gp ** 2).mean(axis=1)
    return w - lr * gp / (np.sqrt(acc) + 1e-8)[:, None], acc


def test_rowwise_adagrad_end_to_end(client, name):
    """A rowwise_adagrad table keeps one accumulator a row on both servers,
    pushes apply its formula, its spec opens it again, and a write-back
    cache applies the same update on the worker."""
    dim, lr, wd = 7, 0.1, 0.01
    t = client.table(name, dim,
                     optimizer=f"rowwise_adagrad:lr={lr},wd={wd},acc=0.25",
                     init="constant:0.5")
    assert t.optimizer == "rowwise_adagrad"
    assert t.row_floats == dim + 1
    ids = np.arange(1, 41, dtype=np.uint64)
    assert {client.server_of(int(i)) for i in ids} == {0, 1}
    w, acc = np.full((40, dim), 0.5), np.full(40, 0.25)
    rng = np.random.default_rng(3)
    for _ in range(3):
        g = rng.standard_normal((40, dim)).astype(np.float32)
        t.push(ids, g)
        w, acc = _rowwise_adagrad(w, acc, g, lr, wd)
    rows = t.pull(ids, with_state=True)
    assert rows.shape == (40, dim + 1)
    np.testing.assert_allclose(rows[:, :dim], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rows[:, dim], acc, rtol=1e-5)

    spec = t.spec()
    assert spec["optimizer"].startswith("rowwise_adagrad:lr=0.1")
    assert client.table(**spec).row_floats == dim + 1

    ct = t.cached(rows=64, prefetch=0, mode="back", max_batch=64)
    np.testing.assert_allclose(ct.lookup(ids), w, rtol=1e-5, atol=1e-6)
    g = rng.standard_normal((40, dim)).astype(np.float32)
    ct.push_grads(g)
    ct.flush()
    ct.close()
    w, acc = _rowwise_adagrad(w, acc, g, lr, wd)
    rows = t.pull(ids, with_state=True)
    np.testing.assert_allclose(rows[:, :dim], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rows[:, dim], acc, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.uint64, np.int64, np.int32,
                                   np.uint32, np.int16, np.uint8])
def test_ids_of_any_integer_dtype(client, name, dtype):
    t = client.table(name, DIM, init="uniform:-1,1", seed=1)
    ids = np.array([0, 5, 100], dtype=dtype)
    np.testing.assert_array_equal(t.pull(ids), t.pull(ids.astype(np.uint64)))
    np.testing.assert_array_equal(t.pull(list(ids)), t.pull(ids))


def test_int64_ids_are_reinterpreted_bit_for_bit(client, name):
    t = client.table(name, DIM, init="uniform:-1,1", seed=1)
    a = t.pull(np.array([-1], dtype=np.int64))
    b = t.pull(np.array([2**64 - 1], dtype=np.uint64))
    np.testing.assert_array_equal(a, b)
    assert embstore.as_ids(np.array([-1], np.int64))[0] == 2**64 - 1


def test_pull_fills_out_without_a_copy(client, name):
    t = client.table(name, DIM)
    ids = np.arange(10, dtype=np.uint64)
    out = np.zeros((10, DIM), dtype=np.float32)
    got = t.pull(ids, out=out)
    assert got is out and out.any()
    assert embstore.as_ids(ids) is ids


def test_strided_ids_are_copied_once(client, name):
    t = client.table(name, DIM)
    ids = np.arange(20, dtype=np.uint64)[::2]
    np.testing.assert_array_equal(t.pull(ids), t.pull(ids.copy()))


def _requests(client):
    return client.stats()["requests"]


@pytest.mark.parametrize("bad, exc", [
    (np.array([1.0, 2.0]), TypeError),
    (np.array([True, False]), TypeError),
    (np.array(["a"]), TypeError),
    (np.zeros((2, 2), dtype=np.uint64), ValueError),
    (np.uint64(3), ValueError),
])
def test_bad_ids_raise_before_sending(client, name, bad, exc):
    t = client.table(name, DIM)
    before = _requests(client)
    with pytest.raises(exc):
        t.pull(bad)
    with pytest.raises(exc):
        t.push(bad, np.zeros((2, DIM), np.float32))
    assert _requests(client) == before


@pytest.mark.parametrize("out, exc", [
    (np.zeros((3, DIM), dtype=np.float64), TypeError),
    (np.zeros((3, DIM), dtype=np.float16), TypeError),
    (np.zeros((3, DIM + 1), dtype=np.float32), ValueError),
    (np.zeros((4, DIM), dtype=np.float32), ValueError),
    (np.zeros(3 * DIM, dtype=np.float32), ValueError),
    (np.zeros((DIM, 3), dtype=np.float32).T, ValueError),
    ([[0.0] * DIM] * 3, TypeError),
])
def test_bad_buffers_raise_before_sending(client, name, out, exc):
    t = client.table(name, DIM)
    ids = np.array([1, 2, 3], dtype=np.uint64)
    before = _requests(client)
    with pytest.raises(exc):
        t.pull(ids, out=out)
    with pytest.raises(exc):
        t.push(ids, out)
    with pytest.raises(exc):
        t.pull_async(ids, out=out)
    with pytest.raises(exc):
        t.push_async(ids, out)
    with pytest.raises(exc):
        t.assign(ids, out)
    assert _requests(client) == before


def test_read_only_out_is_refused(client, name):
    t = client.table(name, DIM)
    out = np.zeros((1, DIM), dtype=np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError):
        t.pull([1], out=out)


def test_no_create_pull_reports_found(client, name):
    t = client.table(name, DIM, init="constant:3")
    t.pull([1])
    found = np.zeros(2, dtype=np.bool_)
    rows = t.pull([1, 2], create=False, found=found)
    assert found.tolist() == [True, False]
    np.testing.assert_array_equal(rows[1], 0.0)
    np.testing.assert_array_equal(rows[0], 3.0)
    assert t.stats()["rows"] == 1
    with pytest.raises(TypeError):
        t.pull([1, 2], create=False, found=np.zeros(2, np.int32))
    with pytest.raises(ValueError):
        t.pull([1, 2], create=False, found=np.zeros(3, np.uint8))


def test_assign_erase_drop_open(client, name):
    t = client.table(name, DIM, optimizer="sgd", init="zeros", seed=3)
    rows = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM)
    t.assign([10, 11], rows)
    np.testing.assert_array_equal(t.pull([11, 10]), rows[::-1])
    same = client.open_table(name)
    assert same.dim == DIM and same.optimizer == "sgd"
    np.testing.assert_array_equal(same.pull([10]), rows[:1])
    assert t.erase([10, 12]) == 1
    assert t.stats()["rows"] == 1
    t.drop()
    t.close()
    same.close()
    with pytest.raises(embstore.TableError) as e:
        client.open_table(name)
    assert e.value.name == "EMB_ENOTABLE"
    with pytest.raises(ValueError):
        t.pull([1])


def test_futures(client, name):
    t = client.table(name, DIM, optimizer="sgd:lr=1", init="zeros")
    ids = np.arange(1000, dtype=np.uint64)
    g = np.ones((1000, DIM), dtype=np.float32)
    pushes = [t.push_async(ids, g, step=s) for s in range(4)]
    for f in pushes:
        assert f.result() is None
        assert f.done()
    out = np.empty((1000, DIM), dtype=np.float32)
    f = t.pull_async(ids, out=out)
    assert f.result() is out
    np.testing.assert_array_equal(out, -4.0)
    # A future dropped unfinished waits for its buffers to be released.
    t.pull_async(np.arange(5000, dtype=np.uint64))
    assert t.pull([0])[0, 0] == -4.0


def test_table_spec_checks(client, name):
    with pytest.raises(ValueError):
        client.table(name, 0)
    with pytest.raises(ValueError):
        client.table(name, 4097)
    with pytest.raises(ValueError):
        client.table(name, 4, optimizer="rmsprop")
    with pytest.raises(ValueError):
        client.table(name, 4, init="normal:0")
    with pytest.raises(ValueError):
        client.table(name, 4, mode="stale:x")
    with pytest.raises(embstore.TableError) as e:
        client.table("bad name!", 4)
    assert e.value.name == "EMB_EBADNAME"
    client.table(name, 4, seed=1)
    with pytest.raises(embstore.TableError) as e:
        client.table(name, 4, seed=2)
    assert e.value.code == embstore.errors.EMB_ETABLEEXISTS
    assert "exists with seed 1; this CREATE asks seed 2" in str(e.value)


def test_modes(client, name):
    t = client.table(name, DIM, mode="sync", optimizer="sgd:lr=1",
                     init="zeros")
    assert t.mode == "sync"
    t.push([1], np.ones((1, DIM), np.float32), step=0)
    np.testing.assert_array_equal(t.pull([1]), -1.0)
    t.push([], np.empty((0, DIM), np.float32), step=1)
    t.set_mode("stale:3")
    assert t.mode == "stale:3"
    t.set_mode("async")
    with pytest.raises(ValueError):
        t.set_mode("fast")


def test_admission_count(client, name):
    """count:2: the first pull answers initial values without a row, a push
    before admission is dropped, the second pull makes the row."""
    t = client.table(name, DIM, optimizer="sgd:lr=1", init="uniform:-1,1",
                     seed=3, admit="count:2")
    ids = np.arange(100, 200, dtype=np.uint64)
    want = embstore.initial_rows("uniform:-1,1", 3, ids, DIM)
    np.testing.assert_array_equal(t.pull(ids), want)
    t.push(ids, np.ones((100, DIM), np.float32))
    st = t.stats()
    assert (st["rows"], st["pulls_unadmitted"], st["pushes_unadmitted"]) \
        == (0, 100, 100)
    assert st["admit_filter_bytes"] > 0
    np.testing.assert_array_equal(t.pull(ids), want)
    assert t.stats()["rows"] == 100
    t.push(ids, np.ones((100, DIM), np.float32))
    np.testing.assert_allclose(t.pull(ids), want - 1.0)


def test_eviction_and_online_change(client, name):
    """max_rows holds the table near its size; set_lifecycle changes the
    policy while the table serves (the servers have no admin token)."""
    t = client.table(name, DIM, optimizer="sgd:lr=1", init="zeros",
                     evict="max_rows:300:lru")
    for b in range(20):
        ids = np.arange(b * 100, (b + 1) * 100, dtype=np.uint64)
        t.push(ids, np.zeros((100, DIM), np.float32))
    st = t.stats()
    assert 200 <= st["rows"] <= 300 + 100
    assert st["rows_evicted_cap"] == st["rows_evicted"] > 0
    t.set_lifecycle(admit="bloom:3:1m", evict="ttl:1000")
    t.pull([10**9])
    assert t.stats()["pulls_unadmitted"] == 1
    t.set_lifecycle()
    t.pull([10**9 + 1])
    assert t.stats()["pulls_unadmitted"] == 1
    with pytest.raises(ValueError):
        t.set_lifecycle(admit="count:1")
    with pytest.raises(ValueError):
        t.set_lifecycle(evict="max_rows:5:mru")
    with pytest.raises(ValueError):
        client.table(name + "x", DIM, admit="bloom")


@pytest.mark.parametrize("mode", ["through", "back"])
def test_cached_table(client, name, mode):
    t = client.table(name, DIM, optimizer="adagrad:lr=0.1", init="zeros")
    ct = t.cached(rows=64, prefetch=2, mode=mode, staleness=2, max_batch=16)
    assert ct.prefetch([1, 2, 3]) is True
    assert ct.prefetch([3, 4]) is True
    assert ct.prefetch([5]) is False  # two batches queued already
    np.testing.assert_array_equal(ct.lookup([1, 2, 3]), 0.0)
    ct.push_grads(np.ones((3, DIM), np.float32))
    rows = ct.lookup([3, 4])
    assert rows.shape == (2, DIM)
    ct.push_grads(np.zeros((2, DIM), np.float32))
    ct.flush()
    want = -0.1 * 1.0 / (np.sqrt(0.1 + 1.0) + 1e-8)
    np.testing.assert_allclose(t.pull([1, 2, 3]), want, rtol=1e-5)
    st = ct.stats()
    assert st["lookups"] == 2 and st["rows"] == 4
    assert st["pushes"] == (2 if mode == "through" else 0)
    with pytest.raises(ValueError):
        ct.push_grads(np.zeros((2, DIM), np.float32))  # no current batch
    out = np.empty((1, DIM), np.float32)
    assert ct.lookup([9], out=out) is out
    with pytest.raises(ValueError):
        ct.push_grads(np.zeros((2, DIM), np.float32))  # 1 position, not 2
    ct.cancel()
    with pytest.raises(ValueError):
        ct.lookup(np.arange(17))  # > max_batch
    ct.close()
    with pytest.raises(ValueError):
        ct.lookup([1])


def test_cached_table_checks(client, name):
    t = client.table(name, DIM)
    for kw in ({"rows": 0}, {"rows": 8, "prefetch": 65},
               {"rows": 8, "mode": "around"}, {"rows": 8, "policy": "mru"}):
        with pytest.raises(ValueError):
            t.cached(**kw)
    assert t.cached(rows=8, policy="clock").stats()["rows"] == 0
    assert t.cached(rows=8, policy="tinylfu").stats()["rows"] == 0


def test_cached_defaults_are_write_back(client, name):
    """Like C: write-back and TinyLFU, so the worker's own updates hit."""
    t = client.table(name, DIM, optimizer="sgd:lr=0.5", init="zeros")
    ct = t.cached(rows=64, max_batch=16)
    ids = np.array([1, 2, 3], dtype=np.uint64)
    for _ in range(3):
        ct.lookup(ids)
        ct.push_grads(np.ones((3, DIM), dtype=np.float32))
    s = ct.stats()
    assert s["hits"] == 6 and s["misses"] == 3
    # Nothing reached the servers before the flush.
    assert np.all(t.pull(ids) == 0)
    ct.flush()
    assert np.allclose(t.pull(ids), -1.5)


def test_close_and_context_manager(servers, name):
    with embstore.connect(servers=servers, transport="tcp") as c:
        t = c.table(name, DIM)
        ct = t.cached(rows=8)
    with pytest.raises(ValueError):
        t.pull([1])
    with pytest.raises(ValueError):
        ct.lookup([1])
    with pytest.raises(ValueError):
        c.stats()
    c.close()  # idempotent


def test_connect_argument_checks(servers, tmp_path):
    with pytest.raises(ValueError):
        embstore.connect(servers=servers, transport="udp")
    with pytest.raises(ValueError):
        embstore.connect(servers=servers, timeout_ms=0)
    empty = tmp_path / "token"
    empty.write_text("\n")
    with pytest.raises(ValueError):
        embstore.connect(servers=servers, auth_token_file=empty)


def test_log_level():
    embstore.set_log_level("error")
    embstore.set_log_level("warn")
    with pytest.raises(ValueError):
        embstore.set_log_level("loud")
