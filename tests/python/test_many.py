"""Client.pull_many() and Client.push_many() against two real servers: each
request ends exactly as the single-table call would, in request order, and
bad requests raise the errors the single calls raise."""

from __future__ import annotations

import numpy as np
import pytest

import embstore


@pytest.fixture(scope="module")
def client(servers):
    with embstore.connect(servers=servers, transport="tcp") as c:
        yield c


def _tables(client, name, dims=(4, 16, 33)):
    return [client.table(f"{name}_{i}", d, optimizer="sgd:lr=0.5", seed=i)
            for i, d in enumerate(dims)]


def test_pull_many_returns_what_pull_returns(client, name):
    tabs = _tables(client, name)
    rng = np.random.default_rng(3)
    reqs = [(t, rng.integers(0, 5000, size=50 + i)) for i, t in
            enumerate(tabs)]
    reqs.append((tabs[0], [7, 7, 8]))  # a table twice, duplicate ids
    got = client.pull_many(reqs)
    assert len(got) == len(reqs)
    for (t, ids), rows in zip(reqs, got):
        assert rows.dtype == np.float32
        assert rows.shape == (len(ids), t.dim)
        np.testing.assert_array_equal(rows, t.pull(ids))


def test_pull_many_without_create_reads_zeros(client, name):
    (t,) = _tables(client, name, (8,))
    (rows,) = client.pull_many([(t, [1, 2])], create=False)
    np.testing.assert_array_equal(rows, np.zeros((2, 8), np.float32))
    assert not t.pull([1, 2], create=False, found=np.ones(2, bool)).any()


def test_push_many_applies_as_push(client, name):
    a, b = _tables(client, name, (4, 16)), _tables(client, name + "x",
                                                   (4, 16))
    ids = [[1, 2, 2, 9], [3, 4]]
    grads = [np.full((4, 4), 0.25, np.float32),
             np.full((2, 16), -0.5, np.float32)]
    client.push_many([(a[i], ids[i], grads[i]) for i in range(2)], step=3)
    for i in range(2):
        b[i].push(ids[i], grads[i], step=3)
    for i in range(2):
        np.testing.assert_array_equal(a[i].pull(ids[i]), b[i].pull(ids[i]))


def test_many_empty(client):
    assert client.pull_many([]) == []
    client.push_many([])


def test_bad_requests(client, servers, name):
    (t,) = _tables(client, name, (4,))
    with embstore.connect(servers=servers, transport="tcp") as other:
        (u,) = _tables(other, name + "o", (4,))
        with pytest.raises(ValueError, match="another client"):
            client.pull_many([(t, [1]), (u, [1])])
        with pytest.raises(ValueError, match="another client"):
            client.push_many([(u, [1], np.zeros((1, 4), np.float32))])
    with pytest.raises(TypeError, match="not a Table"):
        client.pull_many([("t", [1])])
    with pytest.raises(TypeError, match="tuple of 2"):
        client.pull_many([(t, [1], None)])
    with pytest.raises(TypeError, match="sequence"):
        client.pull_many(t)
    with pytest.raises(ValueError, match=r"request 0: grads must have shape"):
        client.push_many([(t, [1, 2], np.zeros((2, 5), np.float32))])
    with pytest.raises(TypeError, match="float32"):
        client.push_many([(t, [1], np.zeros((1, 4)))])


def test_nonfinite_push_many(client, name):
    a, b = _tables(client, name, (4, 4))
    before, before_b = a.pull([5]), b.pull([5])
    g = np.ones((1, 4), np.float32)
    bad = g.copy()
    bad[0, 2] = np.nan
    with pytest.raises(embstore.NonFiniteError):
        client.push_many([(a, [5], g), (b, [5], bad)])
    # The finite request was applied, the refused one left its row alone.
    np.testing.assert_array_equal(a.pull([5]), before - 0.5)
    np.testing.assert_array_equal(b.pull([5]), before_b)


def test_dropped_table(client, name):
    a, b = _tables(client, name, (4, 4))
    b.drop()
    with pytest.raises(embstore.TableError, match=f"table {b.name}: "):
        client.pull_many([(a, [1]), (b, [1])])


def test_many_is_one_request_per_server(client, name):
    tabs = _tables(client, name, (4, 8, 16))
    ref = _tables(client, name + "r", (4, 8, 16))
    ids = np.arange(200)  # spread over both servers
    before = client.stats().requests
    got = client.pull_many([(t, ids) for t in tabs])
    assert client.stats().requests - before == 2
    for t, rows in zip(tabs, got):
        np.testing.assert_array_equal(rows, t.pull(ids))
    grads = [np.full((200, t.dim), 0.125 * (i + 1), np.float32)
             for i, t in enumerate(tabs)]
    before = client.stats().requests
    client.push_many([(t, ids, g) for t, g in zip(tabs, grads)], step=1)
    assert client.stats().requests - before == 2
    for t, r, g in zip(tabs, ref, grads):
        r.push(ids, g, step=1)
        np.testing.assert_array_equal(t.pull(ids), r.pull(ids))
