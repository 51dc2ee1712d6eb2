"""Fixtures for the Python package's tests: real embstore-server processes
on loopback (free ports, temp dirs), and a scheduler for cluster tests.

Run by `meson test --suite python` (./run.sh test) with PYTHONPATH,
EMBSTORE_LIB and EMB_BUILD_ROOT set; by hand, from the checkout:

    PYTHONPATH=python /usr/bin/python3 -m pytest tests/python
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("EMB_BUILD_ROOT", ROOT / "build")).resolve()


def tool(name: str) -> str:
    """Path of a built program: tools/NAME or examples/ctr/NAME."""
    for sub in ("tools", "examples/ctr"):
        p = BUILD / sub / name
        if p.exists():
            return str(p)
    raise FileNotFoundError(f"{name} not built under {BUILD}")


class Server:
    """One embstore-server child; stop() or kill() it."""

    def __init__(self, tmp: Path, args: tuple = (), env: Optional[dict] = None,
                 role: str = "server") -> None:
        self.log = tmp / f"{role}.{time.monotonic_ns()}.log"
        full_env = dict(os.environ, **(env or {}))
        cmd = [tool("embstore-server"), "--log-level", "info", *args]
        if role == "server" and "EMB_LISTEN" not in (env or {}):
            cmd += ["--listen", "127.0.0.1:0"]
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=f,
                                         env=full_env)
        self.port = self._wait_port()
        self.addr = f"127.0.0.1:{self.port}"

    def _wait_port(self) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)",
                          self.log.read_text())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError("embstore-server did not start:\n" +
                           self.log.read_text())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator:
    """A factory: start_server(*args, env=...) -> Server; all are stopped
    at the end of the test."""
    started = []

    def start(*args, env=None, role="server"):
        s = Server(tmp_path, args, env, role)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[str]:
    """Two servers shared by a test module: "127.0.0.1:P1,127.0.0.1:P2"."""
    tmp = tmp_path_factory.mktemp("servers")
    ss = [Server(tmp) for _ in range(2)]
    yield ",".join(s.addr for s in ss)
    for s in ss:
        s.stop()


_names = iter(range(1 << 30))


@pytest.fixture
def name() -> str:
    """A table name no other test of the module uses."""
    return f"t{os.getpid()}_{next(_names)}"
