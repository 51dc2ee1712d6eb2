#!/usr/bin/python3
"""Trains a wide & deep CTR model in PyTorch with its weights in embstore.

    train.py --data train.tsv --test test.tsv [--epochs N] [--batch B]
             [--local | --servers HOST:PORT,...] [--mode async|sync|stale:K]
             [--cache-rows R] [--prefetch K] [--staleness S] [--seed N]
             [--log-every N] [--transport T] [--after-train CMD]
             [--admit none|count:N|bloom:N] [--evict SPEC]
             [--dense servers|ddp]
    torchrun --nproc_per_node N train.py --servers HOST:PORT,... ...

The model and data are those of examples/ctr (Criteo-format lines as
examples/ctr/gen writes them; the same categorical hashing): an embedding of
16 floats per categorical field, concatenated with the log-normalised
integer features into an MLP (429 -> 64 -> 32 -> 1, ReLU), plus a wide part
(one weight per categorical value, summed, and a bias); logloss.

Where the weights live:
- embstore (default): embeddings in table "ctr_emb" (embstore.torch.
  Embedding), wide weights in "ctr_wide" (EmbeddingBag, sum), both Adagrad
  on the servers (their gradients pushed by embstore.torch.SparseOptimizer), read through the worker cache with prefetch in async
  mode; the MLP and bias in the dense table "ctr_mlp" (DenseParameters,
  Adam on the servers), pulled every step and pushed after backward;
  or, with --dense ddp, the MLP and bias data-parallel in every worker
  (torch's DistributedDataParallel, gloo, gradients all-reduced; torch's
  Adam), the embeddings still on the servers.
  --admit and --evict set the admission and eviction of the two sparse
  tables (docs/store.md).
  Without --servers the worker joins the cluster from the environment
  (`embstore launch` sets it) and trains the lines whose number modulo the
  worker count is its rank.
  Under torchrun (RANK and WORLD_SIZE set; docs/python.md) with --servers,
  the rank and worker count are torchrun's (embstore.distributed_env()),
  dense weights default to --dense ddp, and workers meet in
  torch.distributed barriers: torchrun starts no embstore scheduler.
- --local: the same model with torch.nn.Embedding / EmbeddingBag and
  torch's Adagrad and Adam, in this process: the baseline.

Logs `epoch: N step: M, loss is X` and, after each epoch (the last one once
every worker is done), `epoch: N test auc=A logloss=L` on worker 0. Needs
Debian's python3 (/usr/bin/python3), which sees python3-torch and
python3-numpy; PYTHONPATH must reach python/ of the checkout unless embstore
is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import time
from typing import Optional

import numpy as np
import torch
from torch import nn
from torch.utils.data import (BatchSampler, DataLoader, SequentialSampler,
                              TensorDataset)

NINT, NCAT, EMB_DIM = 13, 26, 16
H1, H2 = 64, 32
DENSE_ROW = 256  # floats per row of the dense table, as examples/ctr


def fmix64(x: np.ndarray) -> np.ndarray:
    """emb_id_hash() of src/common/hash.h (MurmurHash3's fmix64) on uint64
    arrays; numpy's uint64 arithmetic wraps as C's does."""
    x = x.copy()
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xff51afd7ed558ccd)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xc4ceb9fe1a85ec53)
    x ^= x >> np.uint64(33)
    return x


def parse(path: str, shard: int = 0, nshards: int = 1):
    """Reads the lines of path whose number modulo nshards is shard.

    Returns (labels float32 [n], ints float32 [n, 13], ids int64 [n, 26],
    malformed lines skipped). ids are emb_id_hash(field << 56 ^ value), the
    uint64 feature ids of examples/ctr/model.c, held bit for bit in int64.
    """
    labels, ints, cats = [], [], []
    bad = 0
    empty = 0xffffffffff  # an empty field is a value of its own
    with open(path) as f:
        for lineno, line in enumerate(f):
            if lineno % nshards != shard:
                continue
            fs = line.rstrip("\r\n").split("\t")
            try:
                if len(fs) != 1 + NINT + NCAT or fs[0] not in ("0", "1"):
                    raise ValueError
                iv = [int(x) if x else 0 for x in fs[1:1 + NINT]]
                cv = [int(x, 16) if x else empty for x in fs[1 + NINT:]]
                if any(len(x) > 16 for x in fs[1 + NINT:]):
                    raise ValueError
            except ValueError:
                bad += 1
                continue
            labels.append(fs[0] == "1")
            ints.append(iv)
            cats.append(cv)
    n = len(labels)
    iv = np.array(ints, dtype=np.float64).reshape(n, NINT)
    # Criteo's counts span orders of magnitude; negatives occur.
    x = np.where(iv > 0, np.log1p(np.maximum(iv, 0)), 0.0)
    x = (x.astype(np.float32) / np.float32(4.0)).astype(np.float32)
    cv = np.array(cats, dtype=np.uint64).reshape(n, NCAT)
    field = (np.arange(1, NCAT + 1, dtype=np.uint64) << np.uint64(56))
    ids = fmix64(cv ^ field).view(np.int64)
    return np.array(labels, dtype=np.float32), x, ids, bad


class Dense(nn.Module):
    """The MLP and the wide part's bias: the dense parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(NCAT * EMB_DIM + NINT, H1),
                                 nn.ReLU(), nn.Linear(H1, H2), nn.ReLU(),
                                 nn.Linear(H2, 1))
        self.bias = nn.Parameter(torch.zeros(1))
        # He-style uniform weights and zero biases, as examples/ctr.
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                lim = math.sqrt(6.0 / m.in_features)
                nn.init.uniform_(m.weight, -lim, lim)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor, wide: torch.Tensor) -> torch.Tensor:
        """x [B, 429] (embeddings and integer features), wide [B]: the
        wide part's sums; returns logits [B]. A forward of its own so that
        DistributedDataParallel can wrap this part alone."""
        return self.mlp(x).squeeze(1) + wide + self.bias


class WideDeep(nn.Module):
    """deep(ids) -> [B, 26, 16]; wide(ids) -> [B, 1]; returns logits [B]."""

    def __init__(self, deep: nn.Module, wide: nn.Module) -> None:
        super().__init__()
        self.deep = deep
        self.wide = wide
        self.dense = Dense()

    def forward(self, ints: torch.Tensor, ids: torch.Tensor,
                dense: Optional[nn.Module] = None) -> torch.Tensor:
        """dense: what runs self.dense (its DistributedDataParallel
        wrapper while training with --dense ddp)."""
        x = torch.cat([self.deep(ids).flatten(1), ints], dim=1)
        return (dense or self.dense)(x, self.wide(ids).squeeze(1))


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties sharing their mean
    rank), as examples/ctr's ctr_auc()."""
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    starts = np.r_[0, np.flatnonzero(s[1:] != s[:-1]) + 1]
    ends = np.r_[starts[1:], len(s)]
    ranks = np.repeat((starts + 1 + ends) / 2.0, ends - starts)
    npos = y.sum()
    nneg = len(y) - npos
    if npos == 0 or nneg == 0:
        return 0.5
    return float((ranks[y > 0].sum() - npos * (npos + 1) / 2) /
                 (npos * nneg))


def loader(labels, ints, ids, batch: int) -> DataLoader:
    """Batches in file order; a BatchSampler hands whole index lists to the
    dataset, so a batch is three slices rather than B collated samples."""
    ds = TensorDataset(torch.from_numpy(ints), torch.from_numpy(ids),
                       torch.from_numpy(labels))
    return DataLoader(ds, batch_size=None, sampler=BatchSampler(
        SequentialSampler(ds), batch, drop_last=False))


class Local:
    """--local: torch.nn embeddings over a vocabulary of the training ids;
    ids never seen in training read as zeros (row 0), as a no-create pull
    reads them from embstore."""

    def __init__(self, args, train_ids: np.ndarray) -> None:
        self.vocab = np.unique(train_ids.view(np.uint64))
        n = len(self.vocab) + 1
        deep = nn.Embedding(n, EMB_DIM, padding_idx=0, sparse=True)
        wide = nn.EmbeddingBag(n, 1, mode="sum", padding_idx=0, sparse=True)
        with torch.no_grad():
            deep.weight.normal_(0.0, 0.05)
            deep.weight[0].zero_()
            wide.weight.zero_()
        self.model = WideDeep(deep, wide)
        # The servers' optimizers, in torch: same formulas (docs/python.md).
        self.opts = [
            torch.optim.Adagrad(list(deep.parameters()) +
                                list(wide.parameters()), lr=0.05,
                                initial_accumulator_value=0.1, eps=1e-8),
            torch.optim.Adam(self.model.dense.parameters(), lr=0.001)]
        self.rank, self.workers = 0, 1

    def forward(self, xb: torch.Tensor, ib: torch.Tensor) -> torch.Tensor:
        return self.model(xb, ib)

    def joined(self):
        return contextlib.nullcontext()

    def index(self, ids: np.ndarray) -> np.ndarray:
        u = ids.view(np.uint64)
        pos = np.searchsorted(self.vocab, u)
        pos = np.minimum(pos, len(self.vocab) - 1)
        return np.where(self.vocab[pos] == u, pos + 1, 0).astype(np.int64)

    def before_step(self) -> None:
        for o in self.opts:
            o.zero_grad()

    def after_backward(self) -> None:
        for o in self.opts:
            o.step()

    def empty_step(self) -> None:
        pass

    def epoch_end(self) -> None:
        pass

    def barrier(self, name: str) -> None:
        pass

    def close(self, ok: bool) -> None:
        pass


class Remote:
    """The weights in embstore tables (see the module docstring)."""

    def __init__(self, args) -> None:
        import embstore
        import embstore.torch as et

        self.client = embstore.connect(servers=args.servers,
                                       transport=args.transport,
                                       name="ctr-train-torch")
        self.rank = self.client.rank
        self.workers = self.client.num_workers
        c, seed, mode = self.client, args.seed, args.mode
        ada = "adagrad:lr=0.05,acc=0.1"
        life = dict(admit=args.admit, evict=args.evict,
                    row_format=args.row_format)
        emb = c.table("ctr_emb", EMB_DIM, optimizer=ada,
                      init="normal:0,0.05", mode=mode, seed=seed, **life)
        wide = c.table("ctr_wide", 1, optimizer=ada, init="zeros", mode=mode,
                       seed=seed, **life)
        # Caches only for asynchronous training: a synchronous step must
        # read the rows the previous step wrote.
        self.caches = []
        if args.cache_rows and mode != "sync":
            # Write-through: the workers share rows, so each must see the
            # others' updates within the staleness bound.
            self.caches = [t.cached(rows=args.cache_rows, mode="through",
                                    prefetch=args.prefetch,
                                    staleness=args.staleness,
                                    max_batch=args.batch * NCAT)
                           for t in (emb, wide)]
            emb, wide = self.caches
        self.model = WideDeep(et.Embedding(emb),
                              et.EmbeddingBag(wide, mode="sum"))
        # backward records the embeddings' gradients; step() pushes them
        self.sparse = et.SparseOptimizer(self.model)
        self.prefetch = args.prefetch if self.caches else 0
        self.et = et
        self.dense_setup(args)

    def dense_setup(self, args) -> None:
        """The MLP and bias in the dense table "ctr_mlp"."""
        mlp = self.client.table("ctr_mlp", DENSE_ROW,
                                optimizer="adam:lr=0.001", init="zeros",
                                mode=args.mode, seed=args.seed)
        self.dense = self.et.DenseParameters(self.model.dense, mlp)

    def forward(self, xb: torch.Tensor, ib: torch.Tensor) -> torch.Tensor:
        return self.model(xb, ib)

    def joined(self):
        """Context of one epoch's steps (see Hybrid)."""
        return contextlib.nullcontext()

    def batches(self, dl):
        if not self.prefetch:
            return dl
        m = self.model
        return self.et.prefetch(dl, {m.deep: 1, m.wide: 1},
                                depth=self.prefetch)

    def index(self, ids: np.ndarray) -> np.ndarray:
        return ids

    def before_step(self) -> None:
        self.dense.pull()

    def after_backward(self) -> None:
        self.sparse.step()
        self.sparse.zero_grad()
        self.dense.push()

    def empty_step(self) -> None:
        self.model.deep.push_empty()
        self.model.wide.push_empty()
        self.dense.push_empty()

    def epoch_end(self) -> None:
        for ct in self.caches:
            ct.flush()

    def barrier(self, name: str) -> None:
        self.client.barrier(name)

    def close(self, ok: bool) -> None:
        if ok:
            self.client.finish()
        self.client.close()


class Hybrid(Remote):
    """--dense ddp: embeddings on the servers as Remote's, the MLP and bias
    data-parallel in every worker (DistributedDataParallel over gloo: each
    step all-reduces their gradients, so every worker applies the same Adam
    step to the same weights, as for one step over the global batch)."""

    def __init__(self, args) -> None:
        import torch.distributed as dist

        # Rendezvous at MASTER_ADDR:MASTER_PORT as RANK of WORLD_SIZE,
        # which torchrun sets.
        dist.init_process_group("gloo")
        self.dist = dist
        try:
            super().__init__(args)
            if (self.rank, self.workers) != (dist.get_rank(),
                                             dist.get_world_size()):
                raise RuntimeError(
                    f"embstore rank {self.rank} of {self.workers} workers, "
                    f"torch.distributed rank {dist.get_rank()} of "
                    f"{dist.get_world_size()}")
        except BaseException:
            if getattr(self, "client", None) is not None:
                self.client.close()
            dist.destroy_process_group()
            raise

    def dense_setup(self, args) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Broadcasts rank 0's initial weights to every worker.
        self.ddp = DDP(self.model.dense)
        self.opt = torch.optim.Adam(self.model.dense.parameters(), lr=0.001)

    def forward(self, xb: torch.Tensor, ib: torch.Tensor) -> torch.Tensor:
        return self.model(xb, ib, dense=self.ddp)

    def joined(self):
        """Workers whose shard ran out of batches shadow the others'
        all-reduces until every worker's epoch is done."""
        return self.ddp.join()

    def before_step(self) -> None:
        self.opt.zero_grad()

    def after_backward(self) -> None:
        self.sparse.step()
        self.sparse.zero_grad()
        self.opt.step()

    def empty_step(self) -> None:
        self.model.deep.push_empty()
        self.model.wide.push_empty()

    def close(self, ok: bool) -> None:
        try:
            super().close(ok)
        finally:
            self.dist.destroy_process_group()


def evaluate(p, model: WideDeep, path: str) -> tuple[float, float]:
    """Test AUC and logloss of the current weights (nothing is updated or
    created: the modules read the tables without creating rows)."""
    y, x, ids, _ = parse(path)
    model.eval()
    scores = np.empty(len(y), dtype=np.float64)
    loss = 0.0
    with torch.no_grad():
        if isinstance(p, Remote) and not isinstance(p, Hybrid):
            p.dense.pull()
        for i in range(0, len(y), 4096):
            sl = slice(i, i + 4096)
            z = model(torch.from_numpy(x[sl]),
                      torch.from_numpy(p.index(ids[sl])))
            loss += nn.functional.binary_cross_entropy_with_logits(
                z, torch.from_numpy(y[sl]), reduction="sum").item()
            scores[sl] = torch.sigmoid(z).double().numpy()
    model.train()
    return auc(scores, y), loss / max(len(y), 1)


def count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(buf.count(b"\n") for buf in iter(lambda: f.read(1 << 16),
                                                     b""))


def train(args, p) -> int:
    rank, nw = p.rank, p.workers
    y, x, ids, bad = parse(args.data, rank, nw)
    dl = loader(y, x, p.index(ids), args.batch)
    model = p.model
    lossf = nn.functional.binary_cross_entropy_with_logits
    # Synchronous steps need every worker: all take as many steps as the
    # largest shard, a worker short of data sending empty ones.
    sync_steps = 0
    if args.mode == "sync":
        sync_steps = -(-(-(-count_lines(args.data) // nw)) // args.batch)
    samples = 0
    t0 = time.monotonic()
    for epoch in range(1, args.epochs + 1):
        step, loss_sum, loss_n = 0, 0.0, 0
        batches = p.batches(dl) if isinstance(p, Remote) else dl
        with p.joined():
            for xb, ib, yb in batches:
                p.before_step()
                loss = lossf(p.forward(xb, ib), yb)
                loss.backward()
                p.after_backward()
                step += 1
                samples += len(yb)
                loss_sum += loss.item()
                loss_n += 1
                if step % args.log_every == 0:
                    print(f"epoch: {epoch} step: {step}, loss is "
                          f"{loss_sum / loss_n:.4f}", flush=True)
                    loss_sum, loss_n = 0.0, 0
            while step < sync_steps:
                p.empty_step()
                step += 1
        p.epoch_end()
        # The last epoch is scored once every worker is done, so the
        # figure covers all of their updates.
        if epoch == args.epochs:
            p.barrier("trained")
        if args.test and rank == 0:
            a, ll = evaluate(p, model, args.test)
            print(f"epoch: {epoch} test auc={a:.4f} logloss={ll:.4f}",
                  flush=True)
    dt = time.monotonic() - t0
    print(f"worker {rank}: {samples} samples in {dt:.2f} s, "
          f"{samples / dt if dt > 0 else 0.0:.0f} samples/s"
          f"{' (malformed lines skipped)' if bad else ''}", flush=True)
    return 0


def after_train(args, p: Remote) -> int:
    """Worker 0 runs the command (a dump, say) while the servers still
    hold the trained tables; everyone waits for it."""
    rc = 0
    if p.rank == 0:
        env = dict(os.environ, EMB_SERVERS=p.client.servers)
        sys.stdout.flush()
        rc = subprocess.call(args.after_train, shell=True, env=env)
        if rc:
            print(f"train: after-train command failed (status {rc}): "
                  f"{args.after_train}", file=sys.stderr)
    p.barrier("after-train")
    return rc


def dense_placement(args) -> str:
    """"servers" or "ddp" (see --dense); ValueError for a combination that
    cannot run."""
    if args.local:  # embstore need not even be importable
        if args.dense:
            raise ValueError("--dense applies to embstore runs, not --local")
        if os.environ.get("WORLD_SIZE", "1") != "1":
            raise ValueError("--local trains in one process, not in "
                             f"{os.environ['WORLD_SIZE']} torchrun workers")
        return "servers"
    import embstore

    env = embstore.distributed_env()  # ValueError for a malformed one
    dense = args.dense or ("ddp" if env and args.servers else "servers")
    if dense == "ddp":
        if not args.servers:
            raise ValueError("--dense ddp needs --servers: torchrun starts "
                             "no embstore scheduler")
        if env is None or "MASTER_ADDR" not in os.environ:
            raise ValueError("--dense ddp needs torchrun's environment "
                             "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
    return dense


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="training file")
    ap.add_argument("--test", help="held-out file, scored after each epoch")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=512,
                    help="examples per step and worker")
    ap.add_argument("--local", action="store_true",
                    help="torch.nn embeddings in this process, no embstore")
    ap.add_argument("--servers", help="host:port,... (default: join the "
                    "cluster from the environment)")
    ap.add_argument("--transport", help="tcp, rdma or auto (default: "
                    "$EMB_TRANSPORT, else auto)")
    ap.add_argument("--mode", default="async",
                    help="async, sync or stale:K (embstore tables)")
    ap.add_argument("--cache-rows", type=int, default=1 << 18,
                    help="worker cache rows per sparse table (async "
                    "modes); 0 = no cache")
    ap.add_argument("--prefetch", type=int, default=1,
                    help="batches fetched ahead through the cache")
    ap.add_argument("--staleness", type=int, default=2,
                    help="steps a cached row may lag its fetch")
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--admit", default="none",
                    help="admission of the sparse tables: none, count:N or "
                    "bloom:N[:BYTES] (embstore tables)")
    ap.add_argument("--evict", default="none",
                    help="eviction of the sparse tables: none, or ttl:STEPS,"
                    "min_l2:X,max_rows:N[:lru|lfu] (embstore tables)")
    ap.add_argument("--row-format", default="fp32",
                    choices=("fp32", "fp16", "bf16", "int8"),
                    help="how the servers keep the embedding rows (the "
                    "optimizer stays fp32; default fp32)")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--dense", choices=("servers", "ddp"),
                    help="where the MLP and bias train: in the dense "
                    "table on the servers, or data-parallel in the "
                    "workers (DistributedDataParallel; needs torchrun's "
                    "environment); default: ddp under torchrun with "
                    "--servers, else servers")
    ap.add_argument("--after-train", help="once every worker is done, "
                    "worker 0 runs this shell command with EMB_SERVERS set "
                    "to the cluster's servers (e.g. an embstore dump)")
    args = ap.parse_args(argv)
    if args.epochs < 1 or not 1 <= args.batch <= 65536 or args.log_every < 1:
        ap.error("--epochs, --batch (1..65536) and --log-every must be "
                 "positive")
    torch.manual_seed(args.seed)
    # One thread: the trainer shares the machine with servers and workers.
    torch.set_num_threads(int(os.environ.get("EMB_TORCH_THREADS", "1")))
    if args.local and (args.admit != "none" or args.evict != "none" or
                       args.row_format != "fp32"):
        ap.error("--admit, --evict and --row-format apply to embstore "
                 "tables, not --local")
    try:
        dense = dense_placement(args)
    except ValueError as e:
        ap.error(str(e))
    if args.local:
        _, _, ids, _ = parse(args.data)
        p = Local(args, ids)
        return train(args, p)
    p = Hybrid(args) if dense == "ddp" else Remote(args)
    ok = False
    try:
        rc = train(args, p)
        if rc == 0 and args.after_train:
            rc = after_train(args, p)
        ok = rc == 0
        return rc
    finally:
        p.close(ok)


if __name__ == "__main__":
    sys.exit(main())
