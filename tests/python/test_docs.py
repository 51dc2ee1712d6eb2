"""Runs every command of docs/python.md, in order, as a reader would: the
```python blocks are written to the files their first line names, the
```sh lines run from a temp dir (a line ending in & stays in the
background). Paths into the checkout and the build are made absolute, the
server port is a free one, and data sizes and durations are cut so the
whole page runs in seconds."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import BUILD, ROOT

pytest.importorskip("torch")
DOC = ROOT / "docs" / "python.md"
SMALLER = [("--rows 200000", "--rows 20000"), ("--rows 1000000",
                                                "--rows 20000"),
           ("--duration 5", "--duration 0.5")]


def _blocks():
    return re.findall(r"^```(sh|python)\n(.*?)^```", DOC.read_text(),
                      re.M | re.S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _localize(cmd: str, port: int, tmp) -> str:
    for a, b in SMALLER:
        cmd = cmd.replace(a, b)
    cmd = cmd.replace("7164", str(port))
    # Checkout-relative words (at a line start, after a space or an =)
    # become absolute, in one pass so a replaced path is not rewritten.
    cmd = re.sub(r"(?:^|(?<=[\s=]))(build|examples|tests|python)(?=/|\s|$)",
                 lambda m: str(BUILD) if m.group(1) == "build"
                 else f"{ROOT}/{m.group(1)}", cmd)
    cmd = cmd.replace("out/ctr", f"{tmp}/ctr")
    return cmd.replace("/usr/bin/python3", shlex.quote(sys.executable))


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def test_every_command_of_python_md(tmp_path):
    blocks = _blocks()
    assert sum(kind == "sh" for kind, _ in blocks) >= 5
    port = _free_port()
    env = dict(os.environ, EMB_LOG_LEVEL="warn", EMB_BUILD_ROOT=str(BUILD))
    env.pop("EMB_SERVERS", None)  # the examples' default address is the doc's
    background = []
    outputs = {}
    try:
        for kind, body in blocks:
            if kind == "python":
                first = body.splitlines()[0]
                assert first.startswith("# ") and first.endswith(".py")
                (tmp_path / first[2:]).write_text(body.replace("7164",
                                                               str(port)))
                continue
            for line in body.splitlines():
                if not line.strip():
                    continue
                cmd = _localize(line, port, tmp_path)
                if cmd.rstrip().endswith("&"):
                    background.append(subprocess.Popen(
                        cmd.rstrip()[:-1], shell=True, cwd=tmp_path, env=env,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        start_new_session=True))
                    _wait_listening(port)
                    continue
                r = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env,
                                   capture_output=True, text=True,
                                   timeout=240)
                assert r.returncode == 0, (line, r.stdout[-2000:],
                                           r.stderr[-2000:])
                outputs[line] = r.stdout
    finally:
        for p in background:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait()
    quick = next(v for k, v in outputs.items() if "quickstart.py" in k)
    assert "rows: (5, 8) live rows: 4" in quick
    assert "refused: EMB_ETABLEEXISTS" in quick
    torch_out = next(v for k, v in outputs.items() if "torch_quickstart" in k)
    assert "steps: 20 loss:" in torch_out
    aucs = [v for k, v in outputs.items() if "train.py" in k]
    assert len(aucs) == 3 and all("test auc=" in v for v in aucs)
    trec = next(v for k, v in outputs.items() if "torchrec_quickstart" in k)
    assert "['user', 'friend', 'item'] (2, 20) (2, 4)" in trec
