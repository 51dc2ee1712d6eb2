"""pip install . and a wheel, as a user outside Debian's python would do it:
the ```bash blocks of docs/python.md's "Installing with pip" run line by
line in a copy of the checkout, which meson-python builds
by meson-python into a venv, and the installed package then finds its
library, and its programs run, with no PYTHONPATH, LD_LIBRARY_PATH or
EMBSTORE_LIB, from a directory that is not the checkout.

Each build compiles the library and the programs again (ccache makes the
second time cheap): about 30 s to 3 min."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

pytest.importorskip("mesonpy")

# What the installed package must do by itself: load its own library (not
# a build tree's) and make a round trip to a server.
ROUND_TRIP = textwrap.dedent("""
    import sys
    import numpy as np
    import embstore
    lib = embstore.library_path
    assert lib.startswith(sys.prefix), (lib, sys.prefix)
    with embstore.connect(servers=sys.argv[1]) as c:
        t = c.table("pip", dim=4, optimizer="sgd:lr=1", init="zeros")
        t.push([7, 9], np.ones((2, 4), dtype=np.float32))
        rows = t.pull([7, 9, 11])
        assert (rows[:2] == -1).all() and (rows[2] == 0).all(), rows
    print("round trip ok", embstore.__version__, lib)
""")


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "EMBSTORE_LIB",
                        "EMB_BUILD_DIR", "EMB_BUILD_ROOT")}
    env["PIP_NO_INDEX"] = "1"  # offline: nothing comes from an index
    return env


def _run(cmd, cwd, timeout=900, shell=False):
    r = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True,
                       text=True, timeout=timeout, shell=shell)
    assert r.returncode == 0, (cmd, r.stdout[-4000:], r.stderr[-4000:])
    return r.stdout


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The checkout's files as git sees them (committed or not), without
    any build directory, as a fresh clone would have them."""
    dst = tmp_path_factory.mktemp("src") / "embstore"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True).stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        src = ROOT / os.fsdecode(f)
        if not src.is_file():
            continue  # deleted in the work tree
        out = dst / os.fsdecode(f)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)
    return dst


def _doc_blocks() -> list[str]:
    """The bash blocks of docs/python.md: the pip install commands."""
    text = (ROOT / "docs" / "python.md").read_text()
    return re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S)


def _run_block(block: str, source: Path, home: Path) -> None:
    """Runs a doc block's lines in the source copy, with ~ as home."""
    for line in block.splitlines():
        if not line.strip():
            continue
        cmd = line.replace("~/", f"{home}/").replace(
            "/usr/bin/python3", shlex.quote(sys.executable))
        _run(cmd, cwd=source, shell=True)


def _round_trip(bindir: Path, tmp: Path) -> str:
    """Starts the venv's own embstore-server and runs ROUND_TRIP with the
    venv's python from an empty directory."""
    work = tmp / "elsewhere"
    work.mkdir()
    log = tmp / "server.log"
    with open(log, "w") as f:
        srv = subprocess.Popen([str(bindir / "embstore-server"),
                                "--listen", "127.0.0.1:0"],
                               stdout=f, stderr=f, env=_clean_env())
    try:
        deadline = time.monotonic() + 30
        port = None
        while port is None and time.monotonic() < deadline:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read_text())
            if m:
                port = m.group(1)
            elif srv.poll() is not None:
                break
            else:
                time.sleep(0.05)
        assert port, log.read_text()
        (work / "rt.py").write_text(ROUND_TRIP)
        return _run([str(bindir / "python"), "rt.py", f"127.0.0.1:{port}"],
                    cwd=work, timeout=120)
    finally:
        srv.terminate()
        srv.wait(10)


def test_docs_have_both_ways():
    blocks = _doc_blocks()
    assert len(blocks) == 2, blocks
    assert "pip install --no-build-isolation ." in blocks[0]
    assert "-m build --wheel --no-isolation" in blocks[1]


def test_pip_install_dot(source, tmp_path):
    _run_block(_doc_blocks()[0], source, tmp_path)
    out = _round_trip(tmp_path / "emb-venv" / "bin", tmp_path)
    assert "round trip ok" in out
    assert str(tmp_path / "emb-venv") in out


def test_wheel_installs_into_another_venv(source, tmp_path):
    _run_block(_doc_blocks()[1], source, tmp_path)
    wheels = list((source / "dist").glob("embstore-*.whl"))
    assert len(wheels) == 1, wheels
    names = zipfile.ZipFile(wheels[0]).namelist()
    # The package, its library inside it, and the programs as scripts.
    for want in ("embstore/__init__.py", "embstore/_lib.py",
                 "embstore/libembstore.so"):
        assert want in names, names
    for prog in ("embstore", "embstore-server", "embstore-bench"):
        assert any(n.endswith(".data/scripts/" + prog) for n in names), names
    out = _round_trip(tmp_path / "emb-venv2" / "bin", tmp_path)
    assert "round trip ok" in out
    assert str(tmp_path / "emb-venv2") in out
