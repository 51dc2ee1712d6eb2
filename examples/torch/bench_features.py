#!/usr/bin/python3
"""Step latency of a model with many sparse features: one
EmbeddingBagCollection against one EmbeddingBag module per table.

    bench_features.py --servers HOST:PORT[,...] [--features 26] [--dim 16]
        [--batch 512] [--bag 4] [--vocab 100000] [--steps 50] [--warmup 5]
        [--transport T] [--json]

Both models have --features categorical features, each with its own table
(--dim floats, sum pooling, Adagrad on the servers), and the same dense
head (a linear layer, torch SGD). A step is forward, backward and the
optimizers' steps (the dense one, and embstore.torch.SparseOptimizer's,
which pushes the embeddings' gradients), timed with the batch (a
KeyedJaggedTensor of bags of 1 to 2 * --bag - 1 ids drawn uniformly from
--vocab) built outside the clock. The two models take turns step by
step, so load on the machine falls on both alike.

- ebc: embstore.torch.EmbeddingBagCollection: all tables of a step in one
  Client.pull_many and one push_many.
- single: one embstore.torch.EmbeddingBag per table: a pull per table
  (their gradients still go in SparseOptimizer.step()'s one push_many).

Prints, per model, the median and 90th percentile step time in ms and the
client's requests per step (the servers' round trips, from
Client.stats()); --json prints one JSON line instead. Tables are named
bf_ebc_<i> and bf_one_<i> (reused, so runs against one server compare).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from torch import nn

import embstore
import embstore.torch as et


class SingleTables(nn.Module):
    """The per-table way: a list of EmbeddingBag modules, each called with
    its feature's bags."""

    def __init__(self, tables):
        super().__init__()
        self.bags = nn.ModuleList(et.EmbeddingBag(t) for t in tables)
        self.names = [f"c{i}" for i in range(len(tables))]

    def forward(self, kjt):
        d = kjt.to_dict()
        return torch.cat([bag(d[n].values(), d[n].offsets()[:-1])
                          for bag, n in zip(self.bags, self.names)], 1)


def _batch(rng, nf, batch, bag, vocab):
    lengths = torch.from_numpy(rng.integers(1, 2 * bag, nf * batch))
    values = torch.from_numpy(rng.integers(0, vocab, int(lengths.sum())))
    return et.KeyedJaggedTensor.from_lengths_sync(
        [f"c{i}" for i in range(nf)], values, lengths)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", required=True)
    ap.add_argument("--features", type=int, default=26)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--bag", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=100000)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    for what in ("features", "dim", "batch", "bag", "vocab", "steps"):
        if getattr(a, what) < 1:
            ap.error(f"--{what} must be >= 1")
    if a.warmup < 0:
        ap.error("--warmup must be >= 0")
    torch.manual_seed(0)
    nf = a.features
    opt = "adagrad:lr=0.05"
    with embstore.connect(servers=a.servers, transport=a.transport) as c:
        ebc = et.EmbeddingBagCollection(tables=[et.EmbeddingBagConfig(
            name=f"bf_ebc_{i}", embedding_dim=a.dim, num_embeddings=a.vocab,
            feature_names=[f"c{i}"], optimizer=opt, init="normal:0,0.01")
            for i in range(nf)], client=c)
        single = SingleTables([c.table(f"bf_one_{i}", a.dim, optimizer=opt,
                                       init="normal:0,0.01")
                               for i in range(nf)])
        models = {"ebc": (ebc, lambda kt: kt.values()),
                  "single": (single, lambda t: t)}
        heads = {k: nn.Linear(nf * a.dim, 1) for k in models}
        dense = {k: torch.optim.SGD(h.parameters(), lr=0.01)
                 for k, h in heads.items()}
        sparse = {k: et.SparseOptimizer(m) for k, (m, _) in models.items()}
        times = {k: [] for k in models}
        reqs = {k: 0 for k in models}
        rng = np.random.default_rng(1)
        for step in range(a.warmup + a.steps):
            kjt = _batch(rng, nf, a.batch, a.bag, a.vocab)
            label = torch.from_numpy(rng.integers(0, 2, a.batch)).float()
            for k, (model, dense_of) in models.items():
                before = c.stats()["requests"]
                t0 = time.perf_counter()
                logit = heads[k](dense_of(model(kjt))).squeeze(1)
                loss = nn.functional.binary_cross_entropy_with_logits(
                    logit, label)
                dense[k].zero_grad()
                loss.backward()  # records the sparse gradients
                dense[k].step()
                sparse[k].step()  # pushes them
                dt = time.perf_counter() - t0
                if step >= a.warmup:
                    times[k].append(dt)
                    reqs[k] += c.stats()["requests"] - before
        out = {"features": nf, "dim": a.dim, "batch": a.batch,
               "bag": a.bag, "servers": c.num_servers, "steps": a.steps}
        for k in models:
            ms = np.array(times[k]) * 1e3
            out[f"{k}_median_ms"] = round(float(np.median(ms)), 3)
            out[f"{k}_p90_ms"] = round(float(np.percentile(ms, 90)), 3)
            out[f"{k}_requests_per_step"] = round(reqs[k] / a.steps, 2)
        out["speedup"] = round(out["single_median_ms"] /
                               out["ebc_median_ms"], 3)
    if a.json:
        print(json.dumps(out))
    else:
        for k in models:
            print(f"{k}: median {out[f'{k}_median_ms']} ms, p90 "
                  f"{out[f'{k}_p90_ms']} ms, "
                  f"{out[f'{k}_requests_per_step']} requests/step")
        print(f"speedup {out['speedup']}x ({nf} features, batch {a.batch},"
              f" {out['servers']} servers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
