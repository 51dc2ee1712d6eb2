"""The counters that Client.stats(), Table.stats() and CachedTable.stats()
return: small frozen dataclasses, one per C stats struct, with the C
struct's field names (struct_size aside) and Python types.

Each is also a read-only Mapping of those names, so ``stats.rows`` and
``stats["rows"]`` both work, as do ``dict(stats)``, ``set(stats)`` and
``stats.items()`` (code written when stats were dicts keeps working).

Plain values: safe to share between threads.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Mapping
from typing import Any, Iterator, TypeVar

_S = TypeVar("_S", bound="_Stats")


class _Stats(Mapping):
    """What the three share: the Mapping view (its == too, so a stats
    object equals the dict of its fields) and the copy from C."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_struct(cls: type[_S], s: ctypes.Structure) -> _S:
        """A copy of the C struct s, whose fields (struct_size aside) must
        be exactly this class's, in order (tests/python checks it)."""
        return cls(*(getattr(s, n) for n in cls._names()))


@dataclasses.dataclass(frozen=True, eq=False)
class ClientStats(_Stats):
    """struct emb_client_stats: a client's counters since it connected."""

    requests: int
    """requests sent"""
    bytes_out: int
    """bytes sent"""
    bytes_in: int
    """bytes received"""
    errors: int
    """requests that failed"""
    ids_in: int
    """ids given to pull and push"""
    ids_sent: int
    """ids sent after dedup"""
    retries: int
    """requests sent again after a lost connection"""
    reconnects: int
    """connections made again (HELLO included)"""
    resp_copied: int
    """RDMA responses copied out of transport memory (0 while the response
    buffers are registered)"""
    rows_read: int
    """pull_mode="onesided": rows read by RDMA READ whose seal held"""
    rows_fallback: int
    """onesided: rows pulled two-sided instead"""
    seal_failures: int
    """onesided: READs whose row failed the check"""
    read_conn_losses: int
    """onesided: read connections lost"""


@dataclasses.dataclass(frozen=True, eq=False)
class TableStats(_Stats):
    """struct emb_client_table_stats: a table's counters summed over its
    servers (row_bytes and step: the largest of any); the list and its
    meaning are src/common/tabledef.h's, and under replicas
    docs/replication.md's."""

    rows: int
    """live rows"""
    bytes: int
    """bytes the table holds: slabs, index and fixed parts"""
    slab_bytes: int
    """bytes of slabs (row records, live or free)"""
    index_bytes: int
    """bytes of the id index"""
    row_bytes: int
    """bytes of one row record"""
    pulls: int
    """pull requests served"""
    pushes: int
    """push requests applied"""
    rows_pulled: int
    """ids served by pull, duplicates counted"""
    rows_pushed: int
    """distinct ids updated by push"""
    rows_created: int
    """rows made by the initializer"""
    rows_erased: int
    """rows removed by erase"""
    rows_evicted: int
    """rows removed by eviction"""
    misses: int
    """no-create pulls of an absent id"""
    step: int
    """the table clock: push batches applied"""
    extents: int
    """arena extents mapped now"""
    grads_discarded: int
    """pushed rows dropped as too stale (server's)"""
    pulls_unadmitted: int
    """pulled ids not admitted yet (initializer sent)"""
    pushes_unadmitted: int
    """pushed ids dropped: not admitted yet"""
    admit_filter_bytes: int
    """bytes of the admission filter"""
    rows_evicted_ttl: int
    """rows evicted as idle for ttl steps"""
    rows_evicted_l2: int
    """rows evicted for an L2 norm under min_l2"""
    rows_evicted_cap: int
    """rows evicted to stay under max_rows"""
    rows_nonfinite: int
    """rows with a NaN or Inf set aside when loaded"""
    rows_cold: int
    """rows on the device tier"""
    tier_bytes: int
    """bytes of the device tier's file"""
    tier_reads: int
    """4 KiB blocks the device tier read"""
    tier_writes: int
    """4 KiB blocks the device tier wrote"""
    tier_read_us: int
    """microseconds spent waiting on device tier reads"""
    servers: int
    """servers that answered"""


@dataclasses.dataclass(frozen=True, eq=False)
class CachedTableStats(_Stats):
    """struct emb_cached_table_stats: a cached table's counters since it
    was made; hits and misses count distinct ids per batch."""

    lookups: int
    """batches looked up"""
    hits: int
    """distinct ids served from the cache"""
    misses: int
    """distinct ids that had to be fetched"""
    hit_ratio: float
    """hits / (hits + misses); 0 before any"""
    refetches: int
    """write-through: rows older than allowed"""
    evictions: int
    """rows dropped to make room"""
    write_backs: int
    """rows written back (evictions, flushes)"""
    pushes: int
    """gradient pushes sent"""
    fetch_calls: int
    """pulls sent for misses"""
    sync_fetches: int
    """of those, started by lookup itself"""
    rows_fetched: int
    """rows those pulls asked for"""
    bytes_fetched: int
    """row bytes pulled"""
    bytes_written: int
    """gradient and written-back row bytes"""
    stalls: int
    """lookups that waited for rows"""
    wait_ns: int
    """ns lookups spent waiting"""
    rows: int
    """rows cached now"""
    dirty: int
    """write-back: rows not yet written back"""


__all__ = ["ClientStats", "TableStats", "CachedTableStats"]
