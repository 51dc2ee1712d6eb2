"""What the package checks about the library at import: every mirrored
struct has the library's size (and a wrong mirror stops the import), sized
structs carry their size, and the package's version is the build's and the
library's (and a library that cannot serve it stops the import)."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
import warnings

import pytest

import embstore
from embstore import _lib

from conftest import BUILD, ROOT

PKG = ROOT / "python" / "embstore"


def _project_version() -> str:
    text = (ROOT / "meson.build").read_text()
    return re.search(r"version\s*:\s*'([^']+)'", text).group(1)


def _import_copy(tmp_path, edit=None, version=None):
    """Imports a copy of the package in a fresh interpreter, with edit(text)
    applied to its _lib.py and a _version.py saying version; returns the
    finished process."""
    pkg = tmp_path / "pkg" / "embstore"
    shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    if edit:
        lib_py = pkg / "_lib.py"
        lib_py.write_text(edit(lib_py.read_text()))
    if version:
        (pkg / "_version.py").write_text(f'VERSION = "{version}"\n')
    env = {"PYTHONPATH": str(pkg.parent), "EMBSTORE_LIB": _lib.path,
           "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-c", "import embstore; "
         "print(embstore.__version__, embstore.library_version)"],
        env=env, capture_output=True, text=True, timeout=60)


# ---- struct sizes -------------------------------------------------------

def test_every_mirror_has_the_librarys_size():
    names = {cls._c_name_ for cls in _lib.STRUCTS}
    assert names == {"emb_optim_cfg", "emb_init_cfg", "emb_lifecycle_cfg",
                     "emb_client_opts", "emb_table_spec",
                     "emb_client_table_stats", "emb_client_stats",
                     "emb_cached_table_opts", "emb_cached_table_stats",
                     "emb_table_batch"}
    for cls in _lib.STRUCTS:
        assert ctypes.sizeof(cls) == \
            _lib.lib.emb_struct_size(cls._c_name_.encode()), cls._c_name_
    assert _lib.lib.emb_struct_size(b"emb_no_such_struct") == 0


def test_a_wrong_mirror_raises_naming_the_struct_and_both_sizes():
    class ShortOpts(_lib.CStruct):
        _c_name_ = "emb_cached_table_opts"
        _fields_ = _lib.CachedOpts._fields_[:-1]  # rank left out

    with pytest.raises(ImportError) as e:
        _lib.check_struct_sizes(_lib.lib, [_lib.ClientOpts, ShortOpts])
    msg = str(e.value)
    assert "emb_cached_table_opts" in msg
    assert "is 28 bytes in the package" in msg and "but 32 bytes" in msg

    class Unknown(_lib.CStruct):
        _c_name_ = "emb_not_a_struct"
        _fields_ = [("x", ctypes.c_uint32)]

    with pytest.raises(ImportError, match="emb_not_a_struct.*unknown"):
        _lib.check_struct_sizes(_lib.lib, [Unknown])


def test_importing_a_package_with_a_wrong_mirror_fails(tmp_path):
    def drop_rank(text):
        # CachedOpts ends with rank; the copy's mirror leaves it out.
        out = text.replace('        ("policy", c_uint32),\n'
                           '        ("rank", c_uint32),\n',
                           '        ("policy", c_uint32),\n', 1)
        assert out != text
        return out

    r = _import_copy(tmp_path, edit=drop_rank)
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert "struct emb_cached_table_opts is 28 bytes" in r.stderr
    assert "but 32 bytes" in r.stderr


def test_sized_structs_carry_their_size():
    sized = [cls for cls in _lib.STRUCTS
             if cls._fields_[0][0] == "struct_size"]
    assert {cls._c_name_ for cls in sized} == {
        "emb_client_opts", "emb_table_spec", "emb_client_table_stats",
        "emb_client_stats", "emb_cached_table_opts",
        "emb_cached_table_stats", "emb_table_batch"}
    for cls in sized:
        assert cls().struct_size == ctypes.sizeof(cls)
        assert cls(struct_size=5).struct_size == ctypes.sizeof(cls)


def test_the_library_refuses_a_struct_without_its_size(servers, name):
    """Why the package sets struct_size: without it the call fails."""
    with embstore.connect(servers=servers, transport="tcp") as c:
        c.table(name, 4).pull([1, 2])
        s = _lib.ClientStats()
        s.struct_size = 0
        assert _lib.lib.emb_client_stats(c._h, ctypes.byref(s)) < 0
        s = _lib.ClientStats()
        assert _lib.lib.emb_client_stats(c._h, ctypes.byref(s)) == 0
        assert s.struct_size == ctypes.sizeof(s) and s.requests > 0


# ---- versions -----------------------------------------------------------

def test_version_is_the_builds_and_the_librarys():
    want = _project_version()
    assert embstore.__version__ == want
    assert embstore.library_version == want
    assert _lib.lib.emb_version().decode() == want
    major, minor, patch = (int(x) for x in want.split("."))
    assert _lib.lib.emb_version_number() == \
        major * 10000 + minor * 100 + patch
    # meson writes the installed package's _version.py from the same
    # project version.
    written = BUILD / "python" / "_version.py"
    assert f'VERSION = "{want}"' in written.read_text()


def test_installed_layout_takes_the_built_version(tmp_path):
    r = _import_copy(tmp_path, version=_project_version())
    assert r.returncode == 0, r.stderr
    v = _project_version()
    assert r.stdout.split() == [v, v]


def test_version_rule():
    _lib.check_version("1.2.3", "1.2.3", "L")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="newer 1.3.0"):
            _lib.check_version("1.2.3", "1.3.0", "L")
        with pytest.raises(RuntimeWarning):
            _lib.check_version("1.2.3", "1.2.4", "L")
    for running in ("1.2.2", "1.1.9", "2.2.3", "0.9.9"):
        with pytest.raises(ImportError) as e:
            _lib.check_version("1.2.3", running, "at L")
        assert f"version 1.2.3 but the library at L is {running}" in \
            str(e.value)
    with pytest.raises(ImportError, match="bad version"):
        _lib.check_version("1.2", "1.2.0", "L")


def test_importing_against_an_older_library_fails(tmp_path):
    major, minor, patch = (int(x) for x in _project_version().split("."))
    newer = f"{major}.{minor + 1}.{patch}"
    r = _import_copy(tmp_path, version=newer)
    assert r.returncode != 0
    assert f"the package is version {newer} but the library" in r.stderr
