"""Loads libembstore, declares the C API of embstore.h for ctypes, and
checks at import that the library is the one this package was made for.

Only this module knows C layouts: the structs below mirror the installed
embstore.h field for field, and every function gets its argument and
result types here so that ctypes converts (and checks) them on each call.
At import each mirrored struct's size is compared with the library's own
(emb_struct_size()), and the library's version with the package's
(_version.py, which meson writes from the project version): a mismatch
raises ImportError instead of letting a call read or write past a struct.

Sized structs (those with struct_size first) must have it set to their
size before the library sees them: the constructor of each class here
sets it.

Where the library is looked for, first match wins:

1. ``$EMBSTORE_LIB``: a path to the shared object;
2. the installed layout: the libdir that ``meson install`` wrote into
   ``_install.py`` next to this file, or, installed from a wheel
   (``pip install .``), this package's own directory, where the wheel
   carries the library;
3. a source checkout: ``$EMB_BUILD_DIR`` or ``build/`` at the top of the
   checkout this package sits in (``src/worker/libembstore.so``);
4. ``ctypes.util.find_library("embstore")`` (the loader's search path).

Import-time only; afterwards read-only, so any thread may use it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import warnings
from ctypes import (POINTER, Structure, c_bool, c_char_p, c_double, c_float,
                    c_int, c_size_t, c_uint32, c_uint64, c_void_p)
from pathlib import Path

_SONAME = "libembstore.so"


class CStruct(Structure):
    """A mirror of a public C struct: _c_name_ is its name as
    emb_struct_size() takes it. A struct whose first field is struct_size
    (a sized struct, embstore.h) gets it set here on construction."""

    _c_name_ = ""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self._fields_ and self._fields_[0][0] == "struct_size":
            self.struct_size = ctypes.sizeof(self)


class OptimCfg(CStruct):
    """struct emb_optim_cfg (fixed layout: no struct_size)."""

    _c_name_ = "emb_optim_cfg"
    _fields_ = [
        ("kind", c_uint32),
        ("lr", c_float),
        ("weight_decay", c_float),
        ("initial_accumulator", c_float),
        ("beta1", c_float),
        ("beta2", c_float),
        ("eps", c_float),
        ("ftrl_beta", c_float),
        ("l1", c_float),
        ("l2", c_float),
    ]


class InitCfg(CStruct):
    """struct emb_init_cfg (fixed layout)."""

    _c_name_ = "emb_init_cfg"
    _fields_ = [("kind", c_uint32), ("a", c_float), ("b", c_float)]


class ClientOpts(CStruct):
    """struct emb_client_opts."""

    _c_name_ = "emb_client_opts"
    _fields_ = [
        ("struct_size", c_uint32),
        ("auth_token_len", c_uint32),
        ("servers", c_char_p),
        ("transport", c_char_p),
        ("auth_token", c_char_p),
        ("name", c_char_p),
        ("timeout_ms", c_uint32),
        ("part_ids", c_uint32),
        ("pull_mode", c_uint32),
        ("loc_cache_rows", c_uint32),
    ]


# enum emb_pull_mode
EMB_PULL_MODES = ("twosided", "onesided")


class LifecycleCfg(CStruct):
    """struct emb_lifecycle_cfg (fixed layout)."""

    _c_name_ = "emb_lifecycle_cfg"
    _fields_ = [
        ("admit", c_uint32),
        ("admit_n", c_uint32),
        ("bloom_bytes", c_uint32),
        ("ttl_steps", c_uint32),
        ("min_l2", c_float),
        ("order", c_uint32),
        ("max_rows", c_uint64),
    ]


class TableSpec(CStruct):
    """struct emb_table_spec."""

    _c_name_ = "emb_table_spec"
    _fields_ = [
        ("struct_size", c_uint32),
        ("dim", c_uint32),
        ("name", c_char_p),
        ("optim", OptimCfg),
        ("init", InitCfg),
        ("_pad0", c_uint32),
        ("seed", c_uint64),
        ("life", LifecycleCfg),
        ("row_format", c_uint32),
        ("rounding", c_uint32),
        ("tier", c_uint32),
        ("_pad1", c_uint32),
        ("tier_max", c_uint64),
    ]


# The counters of a table, in EMB_TABLE_STATS order (src/common/tabledef.h).
TABLE_STAT_NAMES = (
    "rows", "bytes", "slab_bytes", "index_bytes", "row_bytes", "pulls",
    "pushes", "rows_pulled", "rows_pushed", "rows_created", "rows_erased",
    "rows_evicted", "misses", "step", "extents", "grads_discarded",
    "pulls_unadmitted", "pushes_unadmitted", "admit_filter_bytes",
    "rows_evicted_ttl", "rows_evicted_l2", "rows_evicted_cap",
    "rows_nonfinite", "rows_cold", "tier_bytes", "tier_reads", "tier_writes",
    "tier_read_us")


class TableStats(CStruct):
    """struct emb_client_table_stats: servers, then EMB_TABLE_STATS."""

    _c_name_ = "emb_client_table_stats"
    _fields_ = [("struct_size", c_uint32), ("servers", c_uint32)] + \
        [(name, c_uint64) for name in TABLE_STAT_NAMES]


class ClientStats(CStruct):
    """struct emb_client_stats."""

    _c_name_ = "emb_client_stats"
    _fields_ = [
        ("struct_size", c_uint32),
        ("_pad0", c_uint32),
        ("requests", c_uint64),
        ("bytes_out", c_uint64),
        ("bytes_in", c_uint64),
        ("errors", c_uint64),
        ("ids_in", c_uint64),
        ("ids_sent", c_uint64),
        ("retries", c_uint64),
        ("reconnects", c_uint64),
        ("resp_copied", c_uint64),
        ("rows_read", c_uint64),
        ("rows_fallback", c_uint64),
        ("seal_failures", c_uint64),
        ("read_conn_losses", c_uint64),
    ]


class CachedOpts(CStruct):
    """struct emb_cached_table_opts."""

    _c_name_ = "emb_cached_table_opts"
    _fields_ = [
        ("struct_size", c_uint32),
        ("capacity", c_uint32),
        ("max_batch", c_uint32),
        ("prefetch_depth", c_uint32),
        ("staleness_steps", c_uint32),
        ("mode", c_uint32),
        ("policy", c_uint32),
        ("rank", c_uint32),
    ]


class CachedStats(CStruct):
    """struct emb_cached_table_stats."""

    _c_name_ = "emb_cached_table_stats"
    _fields_ = [
        ("struct_size", c_uint32),
        ("_pad0", c_uint32),
        ("lookups", c_uint64),
        ("hits", c_uint64),
        ("misses", c_uint64),
        ("hit_ratio", c_double),
        ("refetches", c_uint64),
        ("evictions", c_uint64),
        ("write_backs", c_uint64),
        ("pushes", c_uint64),
        ("fetch_calls", c_uint64),
        ("sync_fetches", c_uint64),
        ("rows_fetched", c_uint64),
        ("bytes_fetched", c_uint64),
        ("bytes_written", c_uint64),
        ("stalls", c_uint64),
        ("wait_ns", c_uint64),
        ("rows", c_uint32),
        ("dirty", c_uint32),
    ]


class TableBatch(CStruct):
    """struct emb_table_batch: one table's part of pull_many/push_many."""

    _c_name_ = "emb_table_batch"
    _fields_ = [
        ("struct_size", c_uint32),
        ("n", c_uint32),
        ("table", c_void_p),
        ("ids", c_void_p),
        ("rows", c_void_p),
        ("found", c_void_p),
    ]


# Every mirror, for the size check at import.
STRUCTS = (OptimCfg, InitCfg, LifecycleCfg, ClientOpts, TableSpec,
           TableStats, ClientStats, CachedOpts, CachedStats, TableBatch)


# Values of the C enums and flags the package passes.
EMB_CLIENT_NOCREATE = 0x1
EMB_CLIENT_WITH_STATE = 0x2
EMB_CLIENT_RAW = 0x4

# enum emb_row_format and enum emb_round (src/common/tabledef.h).
ROW_FORMATS = ("fp32", "fp16", "bf16", "int8")
# enum emb_tier_mode (src/common/tabledef.h), by value.
TIER_MODES = ("auto", "off", "on")
ROUNDINGS = ("stochastic", "nearest")
EMB_MODE_ASYNC, EMB_MODE_SYNC, EMB_MODE_STALE = 0, 1, 2
EMB_CACHED_WRITE_THROUGH, EMB_CACHED_WRITE_BACK = 0, 1
EMB_CACHED_LRU, EMB_CACHED_CLOCK, EMB_CACHED_TINYLFU = 0, 1, 2
EMB_LOG_LEVELS = ("error", "warn", "info", "debug")

_P = c_void_p  # opaque handles and numpy buffers: plain addresses
_U64P = c_void_p
_PROTOS = {
    "emb_version": (c_char_p, []),
    "emb_version_number": (c_uint32, []),
    "emb_struct_size": (c_size_t, [c_char_p]),
    "emb_err_name": (c_char_p, [c_int]),
    "emb_err_codes": (c_int, [POINTER(c_int), c_size_t]),
    "emb_last_error": (c_int, [c_char_p, c_size_t]),
    "emb_strerror": (c_char_p, [c_int]),
    "emb_log_set_level": (None, [c_int]),
    "emb_optim_parse": (c_int, [c_char_p, POINTER(OptimCfg)]),
    "emb_optim_name": (c_char_p, [c_uint32]),
    "emb_init_parse": (c_int, [c_char_p, POINTER(InitCfg)]),
    "emb_admit_parse": (c_int, [c_char_p, POINTER(LifecycleCfg)]),
    "emb_bytes_parse": (c_int, [c_char_p, POINTER(c_uint64)]),
    "emb_evict_parse": (c_int, [c_char_p, POINTER(LifecycleCfg)]),
    "emb_client_table_set_lifecycle": (c_int, [_P, POINTER(LifecycleCfg)]),
    "emb_init_name": (c_char_p, [c_uint32]),
    "emb_init_row": (None, [POINTER(InitCfg), c_uint64, c_uint64, _P,
                            c_uint32]),
    "emb_client_create": (c_int, [POINTER(ClientOpts), POINTER(_P)]),
    "emb_client_from_env": (c_int, [POINTER(ClientOpts), POINTER(_P)]),
    "emb_client_destroy": (None, [_P]),
    "emb_client_nservers": (c_uint32, [_P]),
    "emb_client_transport": (c_char_p, [_P]),
    "emb_client_servers": (c_int, [_P, c_char_p, c_size_t]),
    "emb_client_server_of": (c_uint32, [_P, c_uint64]),
    "emb_client_stats": (c_int, [_P, POINTER(ClientStats)]),
    "emb_client_rank": (c_uint32, [_P]),
    "emb_client_nworkers": (c_uint32, [_P]),
    "emb_client_barrier": (c_int, [_P, c_char_p]),
    "emb_client_finish": (c_int, [_P]),
    "emb_client_table_create": (c_int, [_P, POINTER(TableSpec), POINTER(_P)]),
    "emb_client_table_open": (c_int, [_P, c_char_p, POINTER(_P)]),
    "emb_client_table_close": (None, [_P]),
    "emb_client_table_drop": (c_int, [_P]),
    "emb_client_table_dim": (c_uint32, [_P]),
    "emb_client_table_row_floats": (c_uint32, [_P]),
    "emb_client_table_weight_words": (c_uint32, [_P]),
    "emb_client_table_set_push_format": (c_int, [_P, c_uint32]),
    "emb_client_table_spec": (POINTER(TableSpec), [_P]),
    "emb_client_table_pull": (c_int, [_P, _U64P, c_uint32, _P, c_uint32, _P]),
    "emb_client_table_push": (c_int, [_P, _U64P, c_uint32, _P, c_uint64,
                                      c_uint32]),
    "emb_client_table_assign": (c_int, [_P, _U64P, c_uint32, _P, c_bool]),
    "emb_client_table_erase": (c_int, [_P, _U64P, c_uint32,
                                       POINTER(c_uint64)]),
    "emb_client_table_set_mode": (c_int, [_P, c_uint32, c_uint32, c_uint32]),
    "emb_client_table_stats": (c_int, [_P, POINTER(TableStats)]),
    "emb_client_table_pull_async": (c_int, [_P, _U64P, c_uint32, _P,
                                            c_uint32, _P, POINTER(_P)]),
    "emb_client_table_push_async": (c_int, [_P, _U64P, c_uint32, _P,
                                            c_uint64, c_uint32, POINTER(_P)]),
    "emb_client_pull_many": (c_int, [_P, _P, c_size_t, c_uint32]),
    "emb_client_push_many": (c_int, [_P, _P, c_size_t, c_uint64, c_uint32]),
    "emb_async_wait": (c_int, [_P]),
    "emb_async_done": (c_bool, [_P]),
    "emb_cached_table_create": (c_int, [_P, POINTER(CachedOpts),
                                        POINTER(_P)]),
    "emb_cached_table_destroy": (None, [_P]),
    "emb_cached_table_prefetch": (c_int, [_P, _U64P, c_uint32]),
    "emb_cached_table_lookup": (c_int, [_P, _U64P, c_uint32, _P]),
    "emb_cached_table_push_grads": (c_int, [_P, _P]),
    "emb_cached_table_flush": (c_int, [_P]),
    "emb_cached_table_cancel": (None, [_P]),
    "emb_cached_table_stats": (c_int, [_P, POINTER(CachedStats)]),
}


def _candidates() -> list[str]:
    """Paths to try, in order (see the module docstring)."""
    out = []
    env = os.environ.get("EMBSTORE_LIB")
    if env:
        out.append(env)
    here = Path(__file__).resolve().parent
    try:
        from . import _install  # written by meson install
        # An empty LIBDIR (a wheel) is this directory; join() keeps an
        # absolute one as it is.
        out.append(os.path.join(here, _install.LIBDIR, _SONAME))
    except ImportError:
        pass
    # python/embstore/ in a checkout: the build dir is two levels up.
    top = here.parent.parent
    build = os.environ.get("EMB_BUILD_DIR", "build")
    out.append(str((top / build / "src" / "worker" / _SONAME)))
    found = ctypes.util.find_library("embstore")
    if found:
        out.append(found)
    return out


def _load() -> ctypes.CDLL:
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            # CDLL (not PyDLL): every call releases the GIL while in C.
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError("embstore: cannot load libembstore; set EMBSTORE_LIB "
                      "to its path. Tried: " + "; ".join(tried))


def _declare(lib: ctypes.CDLL, names) -> None:
    for name in names:
        res, args = _PROTOS[name]
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ImportError(f"embstore: {lib._name} has no {name}(): a "
                              "library older than this package") from None
        fn.restype = res
        fn.argtypes = args


def _parse_version(v: str) -> tuple[int, int, int]:
    try:
        major, minor, patch = (int(x) for x in v.split("."))
    except ValueError:
        raise ImportError(f"embstore: bad version {v!r}") from None
    return major, minor, patch


def check_version(built: str, running: str, where: str) -> None:
    """The rule of embstore.h, for this package as a program built against
    release built: a library running X.y.z serves it when X is built's
    major and y.z >= built's minor.patch. ImportError for a library that
    cannot serve it; a RuntimeWarning for a newer one that can (the size
    check then decides)."""
    b, r = _parse_version(built), _parse_version(running)
    if b == r:
        return
    if r[0] != b[0] or r < b:
        raise ImportError(f"embstore: the package is version {built} but "
                          f"the library {where} is {running}; install the "
                          "two from one build (or set EMBSTORE_LIB to the "
                          f"libembstore of {built})")
    warnings.warn(f"embstore: the package is version {built}, the library "
                  f"{where} is the newer {running}", RuntimeWarning,
                  stacklevel=2)


def check_struct_sizes(lib: ctypes.CDLL, structs) -> None:
    """ImportError naming the first mirror in structs whose ctypes size is
    not the library's sizeof of its struct (0: a struct it does not
    know)."""
    for cls in structs:
        want = lib.emb_struct_size(cls._c_name_.encode())
        have = ctypes.sizeof(cls)
        if want != have:
            known = f"{want} bytes" if want else "unknown"
            raise ImportError(
                f"embstore: struct {cls._c_name_} is {have} bytes in the "
                f"package (embstore/_lib.py, {cls.__name__}) but {known} in "
                f"{lib._name}: the package and the library disagree on its "
                "layout")


lib = _load()
path = lib._name
_declare(lib, ("emb_version", "emb_version_number"))
library_version: str = lib.emb_version().decode()
"""emb_version() of the loaded library."""
try:
    from ._version import VERSION as built_version  # written by meson
except ImportError:  # a source checkout: the library's own is the build's
    built_version = None
version: str = built_version or library_version
"""The package's version: the project version meson built it with, or in
a source checkout (no _version.py) the library's."""
check_version(version, library_version, path)
_declare(lib, _PROTOS)
check_struct_sizes(lib, STRUCTS)


def _initial_log_level() -> int:
    """EMB_LOG_LEVEL if set and valid, else warn: the library lives inside
    someone's training job, whose output should not fill with INFO lines."""
    want = os.environ.get("EMB_LOG_LEVEL", "warn").lower()
    return EMB_LOG_LEVELS.index(want) if want in EMB_LOG_LEVELS else 1


lib.emb_log_set_level(_initial_log_level())

__all__ = ["lib", "path", "version", "library_version", "built_version",
           "CStruct", "STRUCTS", "check_version",
           "check_struct_sizes", "OptimCfg", "InitCfg", "LifecycleCfg",
           "ClientOpts", "TableSpec", "TableStats", "ClientStats",
           "CachedOpts", "CachedStats"]
