"""Errors: the code list is the library's (and src/common/err.h's), each
family raises its class, and a server that dies or hangs raises within the
timeout instead of hanging."""

from __future__ import annotations

import ctypes
import errno
import re
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import embstore
from embstore import _lib, errors

from conftest import BUILD, ROOT


def test_codes_match_err_h():
    text = (ROOT / "src" / "common" / "err.h").read_text()
    in_c = {m.group(1): int(m.group(2))
            for m in re.finditer(r"X\((EMB_E\w+),\s*(-\d+),", text)}
    assert in_c == errors.CODES


def test_codes_and_names_come_from_the_library():
    lib = _lib.lib
    n = lib.emb_err_codes(None, 0)
    buf = (ctypes.c_int * n)()
    assert lib.emb_err_codes(buf, n) == n > 50
    assert errors.CODES == {lib.emb_err_name(c).decode(): c for c in buf}
    assert list(errors.CODES.values()) == list(buf)  # the library's order
    two = (ctypes.c_int * 2)()
    assert lib.emb_err_codes(two, 2) == n and list(two) == list(buf)[:2]
    for name, code in errors.CODES.items():
        assert getattr(errors, name) == code
        assert errors.code_name(code) == name
        assert errors.error_class(code)(code, "m").name == name
    # errno names come from the library too
    assert lib.emb_err_name(-errno.EINVAL) == b"EINVAL"
    assert errors.code_name(-errno.EINVAL) == "EINVAL"
    assert errors.code_name(0) == "0"


def test_every_family_name_is_the_librarys():
    """The families are kept here by name: a code the library renamed or
    dropped would silently fall back to Error, so each name must be one
    the library (or errno) knows, and map to its family."""
    assert set(errors.FAMILIES) == {
        embstore.ConnectionError, embstore.TimeoutError,
        embstore.TableError, embstore.AuthError, embstore.CacheError,
        embstore.NonFiniteError}
    for cls, names in errors.FAMILIES.items():
        for n in names:
            if n.startswith("EMB_"):
                code = errors.CODES[n]
            else:
                code = -getattr(errno, n)
            assert errors.error_class(code) is cls, n
    assert errors.error_class(errors.EMB_EBADDUMP) is embstore.Error
    assert errors.error_class(-errno.ETIMEDOUT) is embstore.TimeoutError


def test_error_attributes_and_names():
    e = errors.error_class(-1202)(-1202, "unknown table")
    assert isinstance(e, embstore.TableError)
    assert (e.code, e.name, e.message) == (-1202, "EMB_ENOTABLE",
                                           "unknown table")
    assert str(e) == "unknown table (EMB_ENOTABLE)"
    assert errors.code_name(-110) == "ETIMEDOUT"
    assert errors.code_name(-99999) == "-99999"
    assert issubclass(embstore.ConnectionError, ConnectionError)
    assert issubclass(embstore.TimeoutError, TimeoutError)
    for cls in (embstore.ConnectionError, embstore.TimeoutError,
                embstore.TableError, embstore.AuthError, embstore.CacheError):
        assert issubclass(cls, embstore.Error)


def test_refused_connection():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    with pytest.raises(embstore.ConnectionError) as e:
        embstore.connect(servers=f"127.0.0.1:{port}", transport="tcp")
    assert e.value.name == "ECONNREFUSED"


def test_bad_server_list():
    with pytest.raises(embstore.Error) as e:
        embstore.connect(servers="no-port-here:x", transport="tcp")
    assert e.value.code < 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nobody listens there


def test_refused_connection_names_the_address():
    port = _free_port()
    with pytest.raises(embstore.ConnectionError) as e:
        embstore.connect(servers=f"127.0.0.1:{port}", transport="tcp")
    assert f"127.0.0.1:{port}" in str(e.value), str(e.value)


@pytest.mark.parametrize("servers, why", [
    ("127.0.0.1", 'entry 1 "127.0.0.1": no port'),
    ("127.0.0.1:70000", 'entry 1 "127.0.0.1:70000": the port is not a '
                        "number in 1..65535"),
    ("127.0.0.1:7000,,127.0.0.1:7001", 'entry 2 "": empty entry'),
    ("127.0.0.1:7000,host:x", 'entry 2 "host:x": the port is not a number'),
    ("fe80::1:7000", "an IPv6 address needs brackets"),
    (":7000", "no host"),
])
def test_bad_server_entry_is_named(servers, why):
    with pytest.raises(embstore.Error) as e:
        embstore.connect(servers=servers, transport="tcp")
    assert e.value.name == "EINVAL"
    assert why in str(e.value), str(e.value)


def test_unknown_host_is_named():
    with pytest.raises(embstore.Error) as e:
        embstore.connect(servers="nosuchhost.invalid:7000", transport="tcp")
    assert "cannot resolve host nosuchhost.invalid" in str(e.value)


def test_connect_without_servers_or_environment(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("EMB_", "MS_", "PADDLE_")):
            monkeypatch.delenv(k)
    with pytest.raises(embstore.Error) as e:
        embstore.connect()
    msg = str(e.value)
    for what in ("servers", "EMB_SCHED_HOST", "EMB_COORDINATOR",
                 "PADDLE_PSERVERS_IP_PORT_LIST"):
        assert what in msg, msg


def test_waiting_for_the_scheduler_is_said(tmp_path):
    """A worker whose scheduler is not there says so on stderr at the
    default log level, within seconds, instead of waiting in silence."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EMB_", "MS_", "PADDLE_"))}
    env.update(EMB_SCHED_HOST="127.0.0.1", EMB_SCHED_PORT=str(port))
    p = subprocess.Popen([sys.executable, "-c",
                          "import embstore; embstore.connect()"],
                         env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = p.stderr.readline()
            if "waiting for the scheduler" in line or not line:
                break
        assert f"waiting for the scheduler at 127.0.0.1:{port}" in line, line
    finally:
        p.kill()
        p.wait()


def test_auth_token_file_from_the_environment(start_server, tmp_path,
                                              monkeypatch):
    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    s = start_server("--auth-token-file", str(tok))
    monkeypatch.setenv("EMB_AUTH_TOKEN_FILE", str(tok))
    with embstore.connect(servers=s.addr, transport="tcp") as c:
        assert c.table("authed_env", 4).pull([1]).shape == (1, 4)


def test_table_spec_mismatch_names_the_field(start_server):
    s = start_server()
    with embstore.connect(servers=s.addr, transport="tcp") as c:
        c.table("spec_mm", 16, optimizer="sgd:lr=0.1", seed=3)
        with pytest.raises(embstore.TableError) as e:
            c.table("spec_mm", 32, optimizer="sgd:lr=0.1", seed=3)
        assert "exists with dim 16; this CREATE asks dim 32" in str(e.value)
        with pytest.raises(embstore.TableError) as e:
            c.table("spec_mm", 16, optimizer="adagrad:lr=0.1", seed=3)
        assert "exists with optimizer sgd:lr=0.1" in str(e.value)
        assert "asks adagrad:lr=0.1" in str(e.value)
        with pytest.raises(embstore.TableError) as e:
            c.table("spec_mm", 16, optimizer="sgd:lr=0.1", seed=4)
        assert "exists with seed 3; this CREATE asks seed 4" in str(e.value)


def test_nan_through_a_cached_table(start_server):
    s = start_server()
    with embstore.connect(servers=s.addr, transport="tcp") as c:
        t = c.table("nan_cached", 4, optimizer="sgd:lr=1", init="zeros")
        for mode in ("back", "through"):
            ct = t.cached(rows=64, mode=mode)
            ct.lookup([1, 2, 3])
            g = np.ones((3, 4), np.float32)
            g[1, 2] = np.nan
            with pytest.raises(embstore.NonFiniteError) as e:
                ct.push_grads(g)
            assert ("table nan_cached: the gradient of id 2 (element 2)"
                    in str(e.value)), str(e.value)
            # Nothing was applied, and the cache trains on.
            ct.lookup([1, 2, 3])
            ct.push_grads(np.ones((3, 4), np.float32))
            ct.flush()
            ct.close()
        assert (t.pull([1, 2, 3]) == -2).all()


@pytest.mark.parametrize("spec, why", [
    ("adagrd:lr=1", "unknown optimizer 'adagrd'"),
    ("adagrad:lrr=1", "unknown key 'lrr': the keys are lr, alpha"),
    ("adagrad:lr", "'lr' is not key=value"),
    ("adagrad:lr=fast", "lr='fast' is not a number"),
    ("adam:beta1=1.5", "a value is out of range"),
])
def test_bad_optimizer_says_which_part(start_server, spec, why):
    s = start_server()
    with embstore.connect(servers=s.addr, transport="tcp") as c:
        with pytest.raises(ValueError) as e:
            c.table("bad_optim", 4, optimizer=spec)
    assert why in str(e.value), str(e.value)


def test_optimizer_table_of_the_docs_is_the_parsers():
    """docs/python.md's table lists every optimizer and key the parser
    takes (so it cannot drift), and each key parses."""
    from embstore import client as cl
    text = (ROOT / "docs" / "python.md").read_text()
    sec = text.split("### Optimizers and initializers", 1)[1]
    sec = sec.split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \|", sec, re.M)
    names = [n for n, _ in rows]
    assert set(cl.OPTIMIZERS) <= set(names), names
    # OPTIMIZERS is every kind the library names (enum emb_optim_kind
    # counts from 1, "?" past the last).
    lib = [cl._L.emb_optim_name(k).decode() for k in range(1, 16)]
    assert tuple(n for n in lib if n != "?") == cl.OPTIMIZERS, lib
    assert "rowwise_adagrad" in names
    keys = set(re.findall(r"`(\w+)=`", sec))
    assert keys == set(cl.OPTIMIZER_KEYS), keys
    for name in cl.OPTIMIZERS:
        for key in cl.OPTIMIZER_KEYS:
            cl._parse_optim(f"{name}:{key}=0.5")
    for init in ("zeros", "constant:0.5", "uniform:-0.1,0.1",
                 "normal:0,0.01"):
        assert f"`{init}`" in sec
        cl._parse_init(init)


def test_auth(start_server, tmp_path):
    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    other = tmp_path / "other"
    other.write_text("guess")
    s = start_server("--auth-token-file", str(tok))
    with embstore.connect(servers=s.addr, transport="tcp",
                          auth_token_file=tok) as c:
        assert c.table("authed", 4).pull([1]).shape == (1, 4)
    with pytest.raises(embstore.AuthError) as e:
        embstore.connect(servers=s.addr, transport="tcp",
                         auth_token_file=other)
    assert e.value.name == "EMB_EAUTH"
    with pytest.raises(embstore.AuthError):
        embstore.connect(servers=s.addr, transport="tcp")


def test_push_that_would_overflow_is_refused_whole(start_server):
    """Finite gradients that would make a row infinite (3e38 at lr 1,
    twice; or one id 64 times in a batch) are refused whole with
    EMB_ENONFINITE naming the table and the id; no row changes, and the
    server keeps serving."""
    s = start_server()
    with embstore.connect(servers=s.addr, transport="tcp") as c:
        t = c.table("huge", 4, optimizer="sgd:lr=1")
        ids = np.arange(100, 164, dtype=np.uint64)
        t.push(ids, np.full((64, 4), 0.5, np.float32))
        before = t.pull(ids).copy()
        big = np.full((64, 4), 3e38, np.float32)
        with pytest.raises(embstore.NonFiniteError) as e:
            t.push(np.full(64, 7, np.uint64), big)
        assert isinstance(e.value, ValueError)
        assert e.value.name == "EMB_ENONFINITE"
        assert "table huge" in e.value.message and "id 7" in e.value.message
        grads = np.full((64, 4), 0.25, np.float32)
        grads[40] = 3e38
        t.push(ids[40:41], grads[40:41])  # -3e38: still finite
        with pytest.raises(embstore.NonFiniteError) as e:
            t.push(ids, grads)
        assert f"id {int(ids[40])}" in e.value.message
        after = t.pull(ids)
        assert np.isfinite(after).all()
        assert np.array_equal(after[:40], before[:40])
        assert np.array_equal(after[41:], before[41:])
        t.push(ids[:2], grads[:2])  # still serving
        assert np.array_equal(t.pull(ids[:2]), before[:2] - 0.25)


def test_silent_server_times_out():
    """A peer that accepts and never answers: HELLO times out."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(4)
    conns = []
    stop = threading.Event()

    def accept():
        lst.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(lst.accept()[0])
            except OSError:
                pass

    th = threading.Thread(target=accept)
    th.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(embstore.TimeoutError):
            embstore.connect(servers="127.0.0.1:%d" % lst.getsockname()[1],
                             transport="tcp", timeout_ms=500)
        assert time.monotonic() - t0 < 10
    finally:
        stop.set()
        th.join()
        for c in conns:
            c.close()
        lst.close()


def _ids_on(client, server, n):
    ids = [i for i in range(10 * n) if client.server_of(i) == server]
    return np.array(ids[:n], dtype=np.uint64)


def test_killed_server_raises_instead_of_hanging(start_server):
    a, b = start_server(), start_server()
    # Each call below waits for b to come back until its deadline.
    c = embstore.connect(servers=f"{a.addr},{b.addr}", transport="tcp",
                         timeout_ms=1500)
    t = c.table("k", 4, optimizer="sgd")
    ct = t.cached(rows=256, prefetch=1, mode="through")
    on_b, fresh_b = np.split(_ids_on(c, 1, 100), 2)
    on_a = _ids_on(c, 0, 50)
    t.pull(np.concatenate([on_a, on_b]))
    b.kill()
    t0 = time.monotonic()
    with pytest.raises(embstore.ConnectionError):
        t.pull(on_b)
    with pytest.raises(embstore.ConnectionError):
        t.push(on_b, np.zeros((50, 4), np.float32))
    with pytest.raises(embstore.ConnectionError):
        t.pull_async(on_b).result()
    with pytest.raises(embstore.CacheError):
        ct.lookup(fresh_b)
    assert time.monotonic() - t0 < 10
    # The live server still serves its ids.
    assert t.pull(on_a).shape == (50, 4)
    c.close()


def _c_fields(text: str, struct: str) -> list[str]:
    """Member names of a struct in a header, EMB_TABLE_STATS expanded."""
    body = re.search(r"struct %s \{(.*?)\n\};" % struct, text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    stats = re.sub(r"/\*.*?\*/", "", (ROOT / "src" / "common" /
                                      "tabledef.h").read_text(), flags=re.S)
    listed = re.findall(r"X\((\w+),", stats)
    names = []
    for line in body.splitlines():
        if "EMB_TABLE_STATS(" in line:
            names += listed
        elif ";" in line:
            names.append(re.search(r"(\w+)(\[\d+\])?;", line).group(1))
    return names


def test_ctypes_structs_match_embstore_h():
    """ctypes learns layouts from _lib.py alone: this keeps them equal to
    the installed header's (one file with every public struct), member by
    member; the import's size check cannot see two fields swapped."""
    from embstore import _lib
    text = (BUILD / "src" / "worker" / "public" / "embstore.h").read_text()
    for cls in _lib.STRUCTS:
        assert _c_fields(text, cls._c_name_) == \
            [f[0] for f in cls._fields_], cls._c_name_
