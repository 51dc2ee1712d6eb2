"""embstore: embedding tables on parameter servers, from Python.

A thin layer over the C client library libembstore (loaded with ctypes):

    import numpy as np
    import embstore

    with embstore.connect(servers="127.0.0.1:7164") as client:
        emb = client.table("emb", dim=16, optimizer="adagrad:lr=0.05")
        rows = emb.pull(np.array([1, 2, 3], dtype=np.uint64))  # [3, 16]
        emb.push([1, 2, 3], np.ones((3, 16), dtype=np.float32))

`embstore.torch` (imported on its own, so this package works without
PyTorch) has Embedding and EmbeddingBag modules over tables. docs/python.md
has the whole story.

Importing the package loads the library and checks it (embstore/_lib.py):
its version against the package's, and the size of every C struct the
package mirrors; a mismatch raises ImportError.
"""

from .client import (CachedTable, Client, Future, Table, as_ids, connect,
                     initial_rows, set_log_level)
from .client import DistributedEnv, distributed_env
from .errors import (AuthError, CacheError, ConnectionError, Error,
                     NonFiniteError, TableError, TimeoutError, code_name)
from .stats import CachedTableStats, ClientStats, TableStats
from . import _lib

__version__: str = _lib.version
"""The project version meson built the package with (the library's
emb_version() when run from a source checkout)."""
library_path: str = _lib.path
"""The libembstore that was loaded."""
library_version: str = _lib.library_version
"""emb_version() of that library."""

__all__ = ["connect", "set_log_level", "Client", "Table", "CachedTable",
           "Future", "Error", "ConnectionError", "TimeoutError", "TableError",
           "NonFiniteError", "AuthError", "CacheError", "ClientStats", "TableStats",
           "CachedTableStats", "as_ids", "initial_rows", "code_name",
           "library_path", "library_version", "distributed_env",
           "DistributedEnv"]
