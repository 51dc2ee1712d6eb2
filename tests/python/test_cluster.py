"""Joining a cluster from the environment, as `embstore launch` starts
workers: ranks, barriers, finish, and the job winding down."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

import embstore


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def cluster(start_server, monkeypatch):
    """A scheduler waiting for 1 server and 2 workers, and the server."""
    env = {"EMB_SCHED_HOST": "127.0.0.1", "EMB_SCHED_PORT": str(_free_port()),
           "EMB_SERVER_NUM": "1", "EMB_WORKER_NUM": "2",
           "EMB_HEARTBEAT_TIMEOUT": "2", "EMB_CLUSTER_TIMEOUT": "30"}
    sched = start_server(env=dict(env, EMB_ROLE="scheduler"),
                         role="scheduler")
    server = start_server(env=dict(env, EMB_ROLE="server"))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("EMB_ROLE", "worker")
    return sched, server


def test_workers_join_from_the_environment(cluster):
    sched, server = cluster
    seen, errors = {}, []

    def worker() -> None:
        try:
            with embstore.connect(transport="tcp") as c:
                t = c.table("joined", 4, optimizer="sgd:lr=1", init="zeros",
                            mode="sync")
                t.push([7], np.ones((1, 4), np.float32), step=0)
                c.barrier("pushed")
                seen[c.rank] = (c.num_workers, float(t.pull([7])[0, 0]),
                                c.servers)
                c.barrier()
        except Exception as e:  # reported below, from the test's thread
            errors.append(e)

    ths = [threading.Thread(target=worker) for _ in range(2)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    assert not errors, errors
    assert sorted(seen) == [0, 1]
    # Synchronous: the two pushes of step 0 were averaged, applied once.
    assert all(v[:2] == (2, -1.0) for v in seen.values())
    assert seen[0][2] == server.addr
    # Both finished on leaving their with-block: the job winds down.
    assert server.proc.wait(20) == 0
    assert sched.proc.wait(20) == 0


def test_barrier_fails_when_a_node_dies(cluster):
    sched, server = cluster
    result = {}
    joined = threading.Event()

    def lone_worker() -> None:
        try:
            c = embstore.connect(transport="tcp")
        except embstore.Error as e:
            result["connect"] = e
            return
        finally:
            joined.set()
        try:
            c.barrier("never")
        except embstore.Error as e:
            result["barrier"] = e
        c.close()

    th = threading.Thread(target=lone_worker)
    th.start()
    # The second worker joins, then (once the first has its connections)
    # leaves without finish: declared dead.
    c2 = embstore.connect(transport="tcp")
    assert joined.wait(60)
    c2.close()
    th.join(60)
    assert "connect" not in result, result
    assert isinstance(result.get("barrier"), embstore.ConnectionError)
    assert result["barrier"].name == "EMB_ENODEAD"


def test_compact_table_with_admission_moves_to_a_joining_server(
        start_server, monkeypatch):
    """A server that joins a replicated job is given a share of the slots by
    live moves; the move creates each table on it as the others have it, a
    compact one with an admission policy and its own tier request included
    (the CREATE's row-format, tier and lifecycle blocks together), and
    every admitted row reads the same from the new holders."""
    env = {"EMB_SCHED_HOST": "127.0.0.1", "EMB_SCHED_PORT": str(_free_port()),
           "EMB_SERVER_NUM": "2", "EMB_SERVER_MAX": "3", "EMB_REPLICAS": "2",
           "EMB_WORKER_NUM": "1", "EMB_HEARTBEAT_TIMEOUT": "2",
           "EMB_CLUSTER_TIMEOUT": "30"}
    sched = start_server(env=dict(env, EMB_ROLE="scheduler"),
                         role="scheduler")
    for _ in range(2):
        start_server(env=dict(env, EMB_ROLE="server"))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("EMB_ROLE", "worker")
    ids = np.arange(1, 3001, dtype=np.uint64) * 7
    with embstore.connect(transport="tcp") as c:
        t = c.table("small", 8, optimizer="sgd:lr=0.5", init="zeros",
                    row_format="bf16", admit="count:2", tier="off")
        for _ in range(2):      # the second sighting admits
            t.pull(ids)
        t.push(ids, np.ones((len(ids), 8), np.float32))
        before = t.pull(ids)
        assert (before == -0.5).all()
        start_server(env=dict(env, EMB_ROLE="server"))
        deadline = time.monotonic() + 60
        while "server 2 has its share" not in sched.log.read_text():
            assert time.monotonic() < deadline, sched.log.read_text()[-3000:]
            time.sleep(0.1)
        # A third of the slots now have their primary on the new server
        # (the primaries are spread once it has its share): their rows
        # read from there, as they were.
        np.testing.assert_array_equal(t.pull(ids), before)
        assert t.stats().servers == 3
