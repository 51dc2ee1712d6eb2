"""Loads libembstore and declares the C API of embstore.h for ctypes.

Only this module knows C layouts: the structs below mirror
src/worker/embstore.h, src/common/optim.h and src/common/init.h field for
field, and every function gets its argument and result types here so that
ctypes converts (and checks) them on each call.

Where the library is looked for, first match wins:

1. ``$EMBSTORE_LIB``: a path to the shared object;
2. the installed layout: the libdir that ``meson install`` wrote into
   ``_install.py`` next to this file;
3. a source checkout: ``$EMB_BUILD_DIR`` or ``build/`` at the top of the
   checkout this package sits in (``src/worker/libembstore.so``);
4. ``ctypes.util.find_library("embstore")`` (the loader's search path).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_bool, c_char_p, c_double, c_float,
                    c_int, c_size_t, c_uint32, c_uint64, c_void_p)
from pathlib import Path

_SONAME = "libembstore.so"


class OptimCfg(Structure):
    """struct emb_optim_cfg (src/common/optim.h)."""

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


class InitCfg(Structure):
    """struct emb_init_cfg (src/common/init.h)."""

    _fields_ = [("kind", c_uint32), ("a", c_float), ("b", c_float)]


class ClientOpts(Structure):
    """struct emb_client_opts."""

    _fields_ = [
        ("servers", c_char_p),
        ("transport", c_char_p),
        ("auth_token", c_char_p),
        ("auth_token_len", c_uint32),
        ("timeout_ms", c_uint32),
        ("part_ids", c_uint32),
        ("name", c_char_p),
        ("pull_mode", c_uint32),
        ("loc_cache_rows", c_uint32),
    ]


# enum emb_pull_mode
EMB_PULL_MODES = ("twosided", "onesided")


class LifecycleCfg(Structure):
    """struct emb_lifecycle_cfg (src/common/lifecycle.h)."""

    _fields_ = [
        ("admit", c_uint32),
        ("admit_n", c_uint32),
        ("bloom_bytes", c_uint32),
        ("ttl_steps", c_uint32),
        ("min_l2", c_float),
        ("order", c_uint32),
        ("max_rows", c_uint64),
    ]


class TableSpec(Structure):
    """struct emb_table_spec."""

    _fields_ = [
        ("name", c_char_p),
        ("dim", c_uint32),
        ("optim", OptimCfg),
        ("init", InitCfg),
        ("seed", c_uint64),
        ("life", LifecycleCfg),
    ]


class TableStats(Structure):
    """struct emb_client_table_stats: EMB_TABLE_STATS of
    src/common/tabledef.h, in its order, then servers."""

    _fields_ = [(name, c_uint64) for name in (
        "rows", "bytes", "slab_bytes", "index_bytes", "row_bytes", "pulls",
        "pushes", "rows_pulled", "rows_pushed", "rows_created",
        "rows_erased", "rows_evicted", "misses", "step", "extents",
        "grads_discarded", "pulls_unadmitted", "pushes_unadmitted",
        "admit_filter_bytes", "rows_evicted_ttl", "rows_evicted_l2",
        "rows_evicted_cap")] + [("servers", c_uint32)]


class ClientStats(Structure):
    """struct emb_client_stats."""

    _fields_ = [
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


class CachedOpts(Structure):
    """struct emb_cached_table_opts."""

    _fields_ = [
        ("capacity", c_uint32),
        ("max_batch", c_uint32),
        ("prefetch_depth", c_uint32),
        ("staleness_steps", c_uint32),
        ("mode", c_uint32),
        ("policy", c_uint32),
        ("rank", c_uint32),
    ]


class CachedStats(Structure):
    """struct emb_cached_table_stats."""

    _fields_ = [
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


# Values of the C enums and flags the package passes.
EMB_CLIENT_NOCREATE = 0x1
EMB_MODE_ASYNC, EMB_MODE_SYNC, EMB_MODE_STALE = 0, 1, 2
EMB_CACHED_WRITE_THROUGH, EMB_CACHED_WRITE_BACK = 0, 1
EMB_CACHED_LRU, EMB_CACHED_CLOCK, EMB_CACHED_TINYLFU = 0, 1, 2
EMB_LOG_LEVELS = ("error", "warn", "info", "debug")

_P = c_void_p  # opaque handles and numpy buffers: plain addresses
_U64P = c_void_p
_PROTOS = {
    "emb_strerror": (c_char_p, [c_int]),
    "emb_log_set_level": (None, [c_int]),
    "emb_optim_parse": (c_int, [c_char_p, POINTER(OptimCfg)]),
    "emb_optim_name": (c_char_p, [c_uint32]),
    "emb_init_parse": (c_int, [c_char_p, POINTER(InitCfg)]),
    "emb_admit_parse": (c_int, [c_char_p, POINTER(LifecycleCfg)]),
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
    "emb_client_stats": (None, [_P, POINTER(ClientStats)]),
    "emb_client_last_error": (c_int, [_P, c_char_p, c_size_t]),
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
    "emb_cached_table_stats": (None, [_P, POINTER(CachedStats)]),
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
        out.append(os.path.join(_install.LIBDIR, _SONAME))
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


def _declare(lib: ctypes.CDLL) -> None:
    for name, (res, args) in _PROTOS.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


lib = _load()
_declare(lib)
path = lib._name


def _initial_log_level() -> int:
    """EMB_LOG_LEVEL if set and valid, else warn: the library lives inside
    someone's training job, whose output should not fill with INFO lines."""
    want = os.environ.get("EMB_LOG_LEVEL", "warn").lower()
    return EMB_LOG_LEVELS.index(want) if want in EMB_LOG_LEVELS else 1


lib.emb_log_set_level(_initial_log_level())

__all__ = ["lib", "path", "OptimCfg", "InitCfg", "ClientOpts", "TableSpec",
           "TableStats", "ClientStats", "CachedOpts", "CachedStats"]
