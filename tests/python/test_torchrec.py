"""embstore.torch's TorchRec-shaped modules: a KeyedJaggedTensor with
TorchRec's fields (and torchrec's own, duck-typed), EmbeddingBagCollection
pooling exactly the rows its tables hold (sum, mean, max, weighted, shared
tables, empty bags, padding_idx), EmbeddingCollection, gradients equal to
torch.nn.EmbeddingBag's with SGD, pushed by SparseOptimizer.step() in one
push_many, one pull and one push per step for 26 features, and errors
that say what is wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import embstore
from conftest import ROOT

torch = pytest.importorskip("torch")
import embstore.torch as et  # noqa: E402
from torch import nn  # noqa: E402


@pytest.fixture(scope="module")
def client(servers):
    with embstore.connect(servers=servers, transport="tcp") as c:
        yield c


def _kjt(weights=False):
    """3 bags of f1, f2, f3; f1's bag 1 and f3's bag 0 are empty; f1 and
    f2 share ids 5 and 7; -3 is a negative (64-bit hashed) id."""
    values = torch.tensor([5, 7, 2,  7, 9, 5, 5, 11,  -3, 4, 8, 4],
                          dtype=torch.int64)
    lengths = torch.tensor([2, 0, 1,  1, 2, 2,  0, 2, 2])
    w = torch.linspace(0.5, 2.0, values.numel()) if weights else None
    return et.KeyedJaggedTensor.from_lengths_sync(
        keys=["f1", "f2", "f3"], values=values, lengths=lengths, weights=w)


def _pool(rows, lens, mode, w=None):
    """Reference pooling in numpy: rows [n, dim] of a feature's values."""
    out, off = [], 0
    for n in lens:
        r = rows[off:off + n]
        if w is not None:
            r = r * w[off:off + n, None]
        if n == 0:
            out.append(np.zeros(rows.shape[1], np.float32))
        elif mode == "sum":
            out.append(r.sum(0))
        elif mode == "mean":
            out.append(r.sum(0) / n)
        else:
            out.append(r.max(0))
        off += n
    return np.stack(out)


def _expected(kjt, table, feature, mode, weighted=False, pad=None):
    jt = kjt.to_dict()[feature]
    ids = jt.values().numpy()
    lens = jt.lengths().tolist()
    w = jt.weights().numpy() if weighted else None
    if pad is not None:
        keep = ids != pad
        lens = [int(keep[a:a + n].sum())
                for a, n in zip(np.cumsum([0] + lens[:-1]), lens)]
        ids = ids[keep]
        w = None if w is None else w[keep]
    rows = table.pull(ids.view(np.uint64), create=False)
    return _pool(rows, lens, mode, w)


# ---- KeyedJaggedTensor -------------------------------------------------


def test_kjt_fields_as_torchrec():
    kjt = _kjt(weights=True)
    assert kjt.keys() == ["f1", "f2", "f3"]
    assert kjt.stride() == 3
    assert kjt.length_per_key() == [3, 5, 4]
    assert kjt.offset_per_key() == [0, 3, 8, 12]
    assert kjt.offsets().tolist() == [0, 2, 2, 3, 4, 6, 8, 8, 10, 12]
    d = kjt.to_dict()
    assert list(d) == ["f1", "f2", "f3"]
    assert d["f2"].values().tolist() == [7, 9, 5, 5, 11]
    assert d["f2"].lengths().tolist() == [1, 2, 2]
    assert d["f2"].offsets().tolist() == [0, 1, 3, 5]
    assert [t.tolist() for t in d["f1"].to_dense()] == [[5, 7], [], [2]]
    assert torch.equal(d["f3"].weights(), kjt.weights()[8:])
    same = et.KeyedJaggedTensor.from_offsets_sync(
        keys=kjt.keys(), values=kjt.values(), offsets=kjt.offsets(),
        weights=kjt.weights())
    assert torch.equal(same.lengths(), kjt.lengths())
    moved = kjt.to("cpu")
    assert torch.equal(moved.values(), kjt.values())
    assert et.KeyedJaggedTensor.from_lengths_sync(
        ["a"], torch.tensor([1]), torch.tensor([1])).weights_or_none() is None
    back = et.KeyedJaggedTensor.from_jt_dict(d)
    assert torch.equal(back.values(), kjt.values())
    assert torch.equal(back.lengths(), kjt.lengths())


@pytest.mark.parametrize("build, err, text", [
    (lambda: et.KeyedJaggedTensor.from_lengths_sync(
        ["a", "b"], torch.tensor([1, 2, 3]), torch.tensor([1, 1, 0, 0])),
     ValueError, "lengths sum to 2, but there are 3 values"),
    (lambda: et.KeyedJaggedTensor.from_lengths_sync(
        ["a", "b"], torch.tensor([1, 2, 3]), torch.tensor([1, 1, 1])),
     ValueError, "3 lengths, not 2 keys x stride 1"),
    (lambda: et.KeyedJaggedTensor.from_lengths_sync(
        ["a"], torch.tensor([1.0, 2.0]), torch.tensor([1, 1])),
     TypeError, "1-D integer tensor of ids"),
    (lambda: et.KeyedJaggedTensor.from_lengths_sync(
        ["a"], torch.tensor([1, 2]), torch.tensor([3, -1])),
     ValueError, "lengths must be >= 0"),
    (lambda: et.KeyedJaggedTensor.from_lengths_sync(
        ["a"], torch.tensor([1, 2]), torch.tensor([1, 1]),
        weights=torch.tensor([1.0])),
     TypeError, "weights must be a floating tensor of shape (2,)"),
    (lambda: et.KeyedJaggedTensor.from_lengths_sync(
        ["a", "a"], torch.tensor([1, 2]), torch.tensor([1, 1])),
     ValueError, "keys repeat"),
    (lambda: et.KeyedJaggedTensor.from_offsets_sync(
        ["a"], torch.tensor([1, 2]), torch.tensor([1, 2])),
     ValueError, "offsets must be 1-D, starting at 0"),
    (lambda: et.KeyedJaggedTensor(
        ["a"], torch.tensor([1]), lengths=torch.tensor([1]),
        stride_per_key_per_rank=[[1]]),
     ValueError, "stride_per_key_per_rank is not supported"),
])
def test_kjt_refuses_bad_input(build, err, text):
    with pytest.raises(err, match=text.replace("(", r"\(").replace(")",
                                                                  r"\)")):
        build()


# ---- EmbeddingBagCollection: values ------------------------------------


def _ebc(client, name, pooling=et.PoolingType.SUM, **kw):
    """Table A serves f1 and f2 (shared), table B f3."""
    tables = [
        et.EmbeddingBagConfig(name=f"{name}_a", embedding_dim=4,
                              num_embeddings=100, feature_names=["f1", "f2"],
                              pooling=pooling, seed=1),
        et.EmbeddingBagConfig(name=f"{name}_b", embedding_dim=3,
                              num_embeddings=100, feature_names=["f3"],
                              pooling=pooling, seed=2,
                              init="normal:0,1"),
    ]
    return et.EmbeddingBagCollection(tables=tables, client=client, **kw)


@pytest.mark.parametrize("pooling", ["SUM", "MEAN", "MAX"])
def test_ebc_pools_exactly_the_tables_rows(client, name, pooling):
    ebc = _ebc(client, name, et.PoolingType(pooling))
    kjt = _kjt()
    kt = ebc(kjt)
    assert isinstance(kt, et.KeyedTensor)
    assert kt.keys() == ["f1", "f2", "f3"]  # table order, then features
    assert kt.length_per_key() == [4, 4, 3]
    assert kt.offset_per_key() == [0, 4, 8, 11]
    assert kt.values().shape == (3, 11)
    a, b = ebc.tables[f"{name}_a"], ebc.tables[f"{name}_b"]
    # the rows made are the distinct ids of each table
    assert a.stats()["rows"] == 5 and b.stats()["rows"] == 3
    d = kt.to_dict()
    mode = pooling.lower()
    for f, t in (("f1", a), ("f2", a), ("f3", b)):
        np.testing.assert_allclose(d[f].detach().numpy(),
                                   _expected(kjt, t, f, mode), rtol=1e-6,
                                   atol=1e-7)
        assert torch.equal(kt[f], d[f])
    # empty bags (f1's bag 1, f3's bag 0) are zeros, as in TorchRec
    assert not d["f1"][1].any() and not d["f3"][0].any()
    # B's rows come from its own init: normal:0,1 is far from A's uniform
    assert b.pull(np.array([4], np.uint64)).std() > 0.1


@pytest.mark.parametrize("dt,fmt", [("FP16", "fp16"), ("BF16", "bf16"),
                                    ("INT8", "int8")])
def test_ebc_data_type_is_the_row_format(client, name, dt, fmt):
    """TorchRec's data_type picks the servers' row format; the pooled
    output is float32 of the rows as kept, and training pushes into them."""
    ebc = et.EmbeddingBagCollection(tables=[et.EmbeddingBagConfig(
        name=name, embedding_dim=6, num_embeddings=100,
        feature_names=["f1", "f2", "f3"], data_type=et.DataType(dt),
        init="normal:0,1")], client=client)
    t = ebc.tables[name]
    assert t.row_format == fmt
    kjt = _kjt()
    kt = ebc(kjt)
    assert kt.values().dtype == torch.float32
    np.testing.assert_allclose(kt["f1"].detach().numpy(),
                               _expected(kjt, t, "f1", "sum"), rtol=1e-6,
                               atol=1e-6)
    before = t.pull(np.array([5], np.uint64)).copy()
    opt = et.SparseOptimizer(ebc)
    kt.values().sum().backward()
    opt.step()
    assert not np.array_equal(t.pull(np.array([5], np.uint64)), before)


@pytest.mark.parametrize("pooling", ["SUM", "MEAN"])
def test_ebc_weighted(client, name, pooling):
    ebc = _ebc(client, name, et.PoolingType(pooling), is_weighted=True)
    kjt = _kjt(weights=True)
    d = ebc(kjt).to_dict()
    for f, t in (("f1", f"{name}_a"), ("f2", f"{name}_a"),
                 ("f3", f"{name}_b")):
        np.testing.assert_allclose(
            d[f].detach().numpy(),
            _expected(kjt, ebc.tables[t], f, pooling.lower(), True),
            rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="is_weighted=True needs"):
        ebc(_kjt())


def test_ebc_padding_idx(client, name):
    """Rows of padding_idx are left out of their bags (mean counts the
    others only), never pulled, and never pushed."""
    cfg = et.EmbeddingBagConfig(name=name, embedding_dim=4,
                                num_embeddings=100,
                                feature_names=["f1", "f2"],
                                pooling=et.PoolingType.MEAN, padding_idx=5,
                                optimizer="sgd:lr=1")
    ebc = et.EmbeddingBagCollection(tables=[cfg], client=client)
    kjt = _kjt()
    out = ebc(kjt)
    t = ebc.tables[name]
    found = np.zeros(1, np.bool_)
    t.pull(np.array([5], np.uint64), create=False, found=found)
    assert not found[0]
    for f in ("f1", "f2"):
        np.testing.assert_allclose(out[f].detach().numpy(),
                                   _expected(kjt, t, f, "mean", pad=5),
                                   rtol=1e-6, atol=1e-7)
    # f2's bag 2 is [5, 11]: 11 alone
    np.testing.assert_allclose(
        out["f2"][2].detach().numpy(),
        t.pull(np.array([11], np.uint64))[0], rtol=1e-6)
    out.values().sum().backward()
    et.SparseOptimizer(ebc).step()
    t.pull(np.array([5], np.uint64), create=False, found=found)
    assert not found[0]


def test_shared_feature_named_as_torchrec(client, name):
    """A feature read by two tables is "feature@table" in the output."""
    tables = [et.EmbeddingBagConfig(name=f"{name}_{i}", embedding_dim=2,
                                    num_embeddings=10, feature_names=["f1"])
              for i in range(2)]
    kt = et.EmbeddingBagCollection(tables=tables, client=client)(_kjt())
    assert kt.keys() == [f"f1@{name}_0", f"f1@{name}_1"]
    # a config without feature names embeds the feature of its own name
    cfg = et.EmbeddingBagConfig(name=f"{name}_f3", embedding_dim=2,
                                num_embeddings=10)
    with pytest.raises(ValueError, match=f"feature '{name}_f3'"):
        et.EmbeddingBagCollection(tables=[cfg], client=client)(_kjt())


def test_default_init_is_torchrecs_uniform(client, name):
    ebc = et.EmbeddingBagCollection(tables=[et.EmbeddingBagConfig(
        name=name, embedding_dim=16, num_embeddings=10,
        feature_names=["f1"])], client=client)
    ebc(_kjt())
    rows = ebc.tables[name].pull(np.arange(200, dtype=np.uint64))
    assert np.abs(rows).max() <= 0.25 and rows.std() > 0.1  # +-sqrt(1/16)
    assert ebc.tables[name].spec()["init"] == "uniform:-0.25,0.25"


def test_eval_creates_no_rows(client, name):
    ebc = _ebc(client, name)
    ebc.eval()
    out = ebc(_kjt())
    assert not out.values().any()
    assert ebc.tables[f"{name}_a"].stats()["rows"] == 0


# ---- EmbeddingCollection -----------------------------------------------


def test_ec_returns_the_rows_unpooled(client, name):
    tables = [et.EmbeddingConfig(name=f"{name}_a", embedding_dim=4,
                                 num_embeddings=100,
                                 feature_names=["f1", "f2"], padding_idx=7),
              et.EmbeddingConfig(name=f"{name}_b", embedding_dim=2,
                                 num_embeddings=100, feature_names=["f3"])]
    ec = et.EmbeddingCollection(tables=tables, client=client,
                                need_indices=True)
    kjt = _kjt()
    out = ec(kjt)
    assert list(out) == ["f1", "f2", "f3"]
    for f, t in (("f1", f"{name}_a"), ("f2", f"{name}_a"),
                 ("f3", f"{name}_b")):
        jt, src = out[f], kjt[f]
        assert torch.equal(jt.lengths(), src.lengths())
        assert torch.equal(jt.weights(), src.values())  # need_indices
        want = ec.tables[t].pull(src.values().numpy().view(np.uint64),
                                 create=False)
        if f != "f3":
            want[src.values().numpy() == 7] = 0  # padding_idx reads zeros
        assert torch.equal(jt.values(), torch.from_numpy(want))
    (out["f1"].values().sum() + out["f2"].values().sum()).backward()
    et.SparseOptimizer(ec).step()
    found = np.zeros(1, np.bool_)
    ec.tables[f"{name}_a"].pull(np.array([7], np.uint64), create=False,
                                found=found)
    assert not found[0]


# ---- gradients ---------------------------------------------------------


@pytest.mark.parametrize("pooling, weighted", [
    ("SUM", False), ("MEAN", False), ("MAX", False), ("SUM", True)])
def test_training_equals_torch_embedding_bag(client, name, pooling,
                                             weighted):
    """Three steps of the EBC with SGD on the servers leave table A's rows
    where torch.nn.EmbeddingBag (same initial rows, torch's SGD) leaves
    its weights; the push is of the distinct rows only."""
    lr = 0.5
    tables = [et.EmbeddingBagConfig(
        name=f"{name}_{x}", embedding_dim=4, num_embeddings=100,
        feature_names=feats, pooling=et.PoolingType(pooling),
        optimizer=f"sgd:lr={lr}", seed=3)
        for x, feats in (("a", ["f1", "f2"]), ("b", ["f3"]))]
    ebc = et.EmbeddingBagCollection(tables=tables, client=client,
                                    is_weighted=weighted)
    kjt = _kjt(weights=weighted)
    vocab = np.unique(kjt.values().numpy())
    ref = {}
    for x in "ab":
        bag = nn.EmbeddingBag(len(vocab), 4, mode=pooling.lower())
        with torch.no_grad():
            bag.weight.copy_(torch.from_numpy(ebc.tables[f"{name}_{x}"].pull(
                vocab.view(np.uint64))))
        ref[x] = bag
    opt = torch.optim.SGD([b.weight for b in ref.values()], lr=lr)
    target = torch.randn(3, 12, generator=torch.Generator().manual_seed(0))
    pushes = []
    push_many = client.push_many

    def counting(reqs, step=0):
        pushes.append([len(ids) for _, ids, _ in reqs])
        push_many(reqs, step=step)

    client.push_many = counting
    sparse = et.SparseOptimizer(ebc)
    try:
        for i in range(3):
            out = ebc(kjt).values()
            ((out - target) ** 2).sum().backward()
            assert len(pushes) == i  # backward records, step() pushes
            sparse.step()
    finally:
        del client.push_many
    assert pushes == [[5, 3]] * 3  # distinct ids of each table
    for _ in range(3):
        cols = []
        for f, x in (("f1", "a"), ("f2", "a"), ("f3", "b")):
            jt = kjt[f]
            idx = torch.from_numpy(np.searchsorted(vocab, jt.values()))
            cols.append(ref[x](idx, jt.offsets()[:-1],
                               per_sample_weights=jt.weights_or_none()))
        opt.zero_grad()
        ((torch.cat(cols, 1) - target) ** 2).sum().backward()
        opt.step()
    assert ebc.step == 3
    for x in "ab":
        used = np.unique(np.concatenate(
            [kjt[f].values().numpy() for f in
             (["f1", "f2"] if x == "a" else ["f3"])]))
        got = ebc.tables[f"{name}_{x}"].pull(used.view(np.uint64))
        want = ref[x].weight.detach().numpy()[np.searchsorted(vocab, used)]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---- one request per step ------------------------------------------------


class _Counting:
    """Wraps a client's pull_many and push_many, counting calls."""

    def __init__(self, client):
        self.client = client
        self.pulls = []
        self.pushes = []
        self.pull_many = client.pull_many
        self.push_many = client.push_many

        def pull(reqs, *, create=True):
            self.pulls.append(len(reqs))
            return self.pull_many(reqs, create=create)

        def push(reqs, step=0):
            self.pushes.append(len(reqs))
            return self.push_many(reqs, step=step)

        client.pull_many = pull
        client.push_many = push

    def close(self):
        del self.client.pull_many
        del self.client.push_many


def test_26_features_one_pull_and_one_push_per_step(client, name):
    nf, batch = 26, 16
    tables = [et.EmbeddingBagConfig(name=f"{name}_{i}", embedding_dim=4,
                                    num_embeddings=1000,
                                    feature_names=[f"c{i}"])
              for i in range(nf)]
    ebc = et.EmbeddingBagCollection(tables=tables, client=client)
    head = nn.Linear(nf * 4, 1)
    sparse = et.SparseOptimizer(nn.ModuleDict({"ebc": ebc, "head": head}))
    g = torch.Generator().manual_seed(1)
    count = _Counting(client)
    try:
        for step in range(3):
            lengths = torch.randint(0, 4, (nf * batch,), generator=g)
            values = torch.randint(0, 1000, (int(lengths.sum()),),
                                   generator=g)
            kjt = et.KeyedJaggedTensor.from_lengths_sync(
                [f"c{i}" for i in range(nf)], values, lengths)
            sent = client.stats().requests
            out = ebc(kjt)
            # The servers see one request each for all 26 tables' rows.
            pulled = client.stats().requests - sent
            assert 1 <= pulled <= client.num_servers, pulled
            head(out.values()).sum().backward()
            sent = client.stats().requests
            sparse.step()
            # And one each for all 26 tables' gradients (PUSH_MANY).
            pushed = client.stats().requests - sent
            assert 1 <= pushed <= client.num_servers, pushed
    finally:
        count.close()
    assert count.pulls == [nf] * 3  # one call per step, all 26 tables
    assert count.pushes == [nf] * 3


# ---- torchrec's own KeyedJaggedTensor (duck-typed) ------------------------


class _TorchrecLikeKJT:
    """What the collections use of torchrec.sparse.jagged_tensor's
    KeyedJaggedTensor, and nothing else."""

    def __init__(self, keys, values, lengths, weights=None):
        self._k, self._v, self._l, self._w = keys, values, lengths, weights

    def keys(self):
        return self._k

    def values(self):
        return self._v

    def lengths(self):
        return self._l

    def weights_or_none(self):
        return self._w

    def stride(self):
        return len(self._l) // len(self._k)


def test_torchrec_kjt_is_accepted(client, name):
    ebc = _ebc(client, name, is_weighted=True)
    ours = _kjt(weights=True)
    theirs = _TorchrecLikeKJT(ours.keys(), ours.values(),
                              ours.lengths().int(), ours.weights())
    assert torch.equal(ebc(theirs).values(), ebc(ours).values())
    bad = _TorchrecLikeKJT(ours.keys(), ours.values()[:-1], ours.lengths())
    with pytest.raises(ValueError, match="lengths sum to 12, but there are "
                                         "11 values"):
        ebc(bad)
    with pytest.raises(TypeError, match="features must be a "
                                        "KeyedJaggedTensor"):
        ebc({"f1": torch.tensor([1])})


# ---- construction errors and state ---------------------------------------


def test_bad_configs_raise(client, name):
    def cfg(**kw):
        return et.EmbeddingBagConfig(**{"name": name, "embedding_dim": 4,
                                        "num_embeddings": 10, **kw})
    with pytest.raises(TypeError, match="needs client="):
        et.EmbeddingBagCollection(tables=[cfg()])
    with pytest.raises(ValueError, match="Duplicate table name"):
        et.EmbeddingBagCollection(tables=[cfg(), cfg()], client=client)
    with pytest.raises(ValueError, match="init_fn cannot make rows"):
        et.EmbeddingBagCollection(tables=[cfg(init_fn=nn.init.zeros_)],
                                  client=client)
    with pytest.raises(ValueError, match="MAX pooling takes no weights"):
        et.EmbeddingBagCollection(tables=[cfg(pooling=et.PoolingType.MAX)],
                                  client=client, is_weighted=True)
    with pytest.raises(ValueError, match="FP32, FP16, BF16 or INT8"):
        et.EmbeddingBagCollection(
            tables=[cfg(data_type=et.DataType.INT4)], client=client)
    with pytest.raises(ValueError, match="each config needs a name"):
        et.EmbeddingBagCollection(tables=[cfg(name="")], client=client)
    with pytest.raises(TypeError, match="takes EmbeddingConfigs"):
        et.EmbeddingCollection(tables=[cfg()], client=client)
    with pytest.raises(ValueError, match="no meta-device form"):
        et.EmbeddingBagCollection(tables=[cfg()], client=client,
                                  device=torch.device("meta"))
    with pytest.raises(ValueError, match="pooling .* does not pool"):
        et.EmbeddingBagCollection(tables=[cfg(pooling=et.PoolingType.NONE)],
                                  client=client)


def test_state_dict_carries_specs_and_step(client, name):
    ebc = _ebc(client, name)
    ebc(_kjt()).values().sum().backward()
    et.SparseOptimizer(ebc).step()
    state = ebc.state_dict()
    other = _ebc(client, name)
    other.load_state_dict(state)
    assert other.step == 1
    assert [s["name"] for s in state["_extra_state"]["tables"]] == \
        [f"{name}_a", f"{name}_b"]
    with pytest.raises(ValueError, match="state of tables"):
        _ebc(client, name + "x").load_state_dict(state)


def test_bench_features_runs(servers):
    """examples/torch/bench_features.py times both models and reports the
    requests each makes per step (one pull and one push per table for the
    single-table modules)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples/torch/bench_features.py"),
         "--servers", servers, "--features", "3", "--batch", "8",
         "--steps", "2", "--warmup", "1", "--json"],
        capture_output=True, text=True, timeout=120, check=True).stdout
    res = json.loads(out)
    assert res["features"] == 3 and res["servers"] == 2
    for k in ("ebc", "single"):
        assert res[f"{k}_median_ms"] > 0
    # each table's pull and push go to each server holding its ids
    assert 0 < res["ebc_requests_per_step"] <= \
        res["single_requests_per_step"] <= 3 * 2 * 2


def test_table_unused_by_the_loss_gets_no_gradient(client, name):
    """An EmbeddingCollection's table whose rows the loss does not use is
    left as torch leaves a weight whose grad is None: under Adam, zeros
    pushed would still move its rows (the moments of the step before)."""
    tables = [et.EmbeddingConfig(name=f"{name}_{x}", embedding_dim=2,
                                 num_embeddings=100, feature_names=feats,
                                 optimizer="adam:lr=0.1")
              for x, feats in (("a", ["f1", "f2"]), ("b", ["f3"]))]
    ec = et.EmbeddingCollection(tables=tables, client=client)
    sparse = et.SparseOptimizer(ec)
    kjt = _kjt()
    out = ec(kjt)
    (out["f1"].values().sum() + out["f3"].values().sum()).backward()
    sparse.step()
    ids = np.array([5, 7, 2], np.uint64)
    before = ec.tables[f"{name}_a"].pull(ids)
    ec(kjt)["f3"].values().sum().backward()
    sparse.step()
    assert np.array_equal(ec.tables[f"{name}_a"].pull(ids), before)
    assert ec.step == 2


def test_gradients_wait_for_sparse_optimizer(client, name):
    """backward only records; without a SparseOptimizer the next training
    forward says the gradients were never pushed; zero_grad() drops them
    and push_empty() takes a step with none."""
    ebc = _ebc(client, name)
    a = ebc.tables[f"{name}_a"]
    ebc(_kjt()).values().sum().backward()
    ids = np.array([5, 7], np.uint64)
    before = a.pull(ids)
    with pytest.raises(RuntimeError, match="never pushed"):
        ebc(_kjt())
    sparse = et.SparseOptimizer(ebc)
    sparse.zero_grad()
    assert np.array_equal(a.pull(ids), before)
    ebc(_kjt()).values().sum().backward()
    sparse.step()
    assert not np.array_equal(a.pull(ids), before)
    assert ebc.step == 1
    ebc.push_empty()
    assert ebc.step == 2


def test_save_and_load_a_collection(client, name, tmp_path):
    """embstore.torch.save/load find a collection's tables: rows (with
    their optimizer state) and the step come back."""
    ebc = _ebc(client, name)
    sparse = et.SparseOptimizer(ebc)
    for _ in range(2):
        ebc(_kjt()).values().sum().backward()
        sparse.step()
    et.save(ebc, tmp_path / "ck", sparse)
    ids = np.array([5, 7, 2, 9, 11], np.uint64)
    a, b = ebc.tables[f"{name}_a"], ebc.tables[f"{name}_b"]
    rows_a = a.pull(ids, with_state=True)
    rows_b = b.pull(np.array([4, 8], np.uint64), with_state=True)
    ebc(_kjt()).values().sum().backward()
    sparse.step()
    assert not np.array_equal(a.pull(ids, with_state=True), rows_a)
    et.load(ebc, tmp_path / "ck", sparse)
    np.testing.assert_array_equal(a.pull(ids, with_state=True), rows_a)
    np.testing.assert_array_equal(
        b.pull(np.array([4, 8], np.uint64), with_state=True), rows_b)
    assert ebc.step == 2


def test_micro_batches_accumulate_until_step(client, name):
    """Two backward passes, then one SparseOptimizer.step(): the servers
    apply the sum (SGD: the same rows as one pass of twice the loss), in
    one push."""
    kjt = _kjt()
    rows = []
    for x, passes, scale in (("once", 1, 2.0), ("twice", 2, 1.0)):
        ebc = et.EmbeddingBagCollection(tables=[et.EmbeddingBagConfig(
            name=f"{name}_{x}", embedding_dim=4, num_embeddings=100,
            feature_names=["f1", "f2", "f3"], optimizer="sgd:lr=0.1",
            seed=5)], client=client)
        sparse = et.SparseOptimizer(ebc)
        for _ in range(passes):
            (ebc(kjt).values() ** 2).sum().mul(scale).backward()
        sparse.step()
        assert ebc.step == 1
        rows.append(ebc.tables[f"{name}_{x}"].pull(
            np.unique(kjt.values().numpy()).view(np.uint64)))
    np.testing.assert_allclose(rows[0], rows[1], rtol=1e-6, atol=1e-7)
