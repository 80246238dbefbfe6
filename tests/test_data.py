"""fusegrad.data: DataLoader batches (values, dtypes, order, seeds, drop_last, len) against numpy and torch's
DataLoader, dataset objects and collation, the prefetch thread (errors, early exit, interpreter exit), and the
bundled digits data."""
from __future__ import annotations
import gc
import gzip
import hashlib
import base64
import subprocess
import sys
import threading
from collections import namedtuple
from pathlib import Path
import numpy as np
import pytest
import torch
import torch.utils.data
import fusegrad as fg
from fusegrad.data import DataLoader, Dataset, TensorDataset, default_collate, load_digits
from fusegrad.runtime import device as rd

ROOT = Path(__file__).resolve().parents[1]


def _arr(t) -> np.ndarray:
  assert isinstance(t, fg.Tensor)
  return t.numpy()


def _prefetch_threads() -> list:
  return [t for t in threading.enumerate() if t.name == "fusegrad-data-prefetch"]


def _wait_no_prefetch_threads():
  gc.collect()
  for t in _prefetch_threads(): t.join(timeout=60)   # a bound against hangs, not a timing check
  assert _prefetch_threads() == []


# ---- arrays: values, order, dtypes -------------------------------------------------------------------------

@pytest.mark.parametrize("prefetch", [True, False])
def test_arrays_in_order(device, rng, prefetch):
  n, bs = int(rng.integers(20, 60)), int(rng.integers(1, 9))
  x = rng.standard_normal((n, 3, 2)).astype(np.float32)
  y = rng.integers(0, 10, n)
  loader = DataLoader((x, y), batch_size=bs, device=device, prefetch=prefetch)
  batches = list(loader)
  assert len(batches) == len(loader) == -(-n // bs)
  for i, (xb, yb) in enumerate(batches):
    assert isinstance(xb, fg.Tensor) and xb.device == device and yb.device == device
    assert xb.dtype == fg.float32 and yb.dtype == fg.int64
    assert xb.node.realized and yb.node.realized
    np.testing.assert_array_equal(_arr(xb), x[i * bs:(i + 1) * bs])
    np.testing.assert_array_equal(_arr(yb), y[i * bs:(i + 1) * bs])
  _wait_no_prefetch_threads()


@pytest.mark.parametrize("npdt,fgdt", [(np.float32, fg.float32), (np.float64, fg.float64), (np.int64, fg.int64),
                                       (np.int32, fg.int32), (np.uint8, fg.uint8), (np.bool_, fg.bool),
                                       (np.float16, fg.float16), (np.int16, fg.int16)])
def test_dtypes_are_kept_like_torch_from_numpy(rng, npdt, fgdt):
  a = (rng.standard_normal((10, 3)) * 50).astype(npdt)
  assert str(torch.from_numpy(a).dtype) == "torch." + fgdt.name
  (b,) = list(DataLoader(a, batch_size=10))
  assert b.dtype == fgdt and b.shape == (10, 3)
  np.testing.assert_array_equal(b.numpy(), a)


def test_unsupported_dtype_raises_in_consumer(rng):
  with pytest.raises(TypeError, match="uint16"):
    list(DataLoader(rng.integers(0, 5, 10).astype(np.uint16), batch_size=4))
  _wait_no_prefetch_threads()


def test_single_array_gives_tensors_and_list_gives_tuples(rng):
  x = rng.standard_normal((7, 2)).astype(np.float32)
  y = rng.integers(0, 3, 7)
  b = next(iter(DataLoader(x, batch_size=4)))
  assert isinstance(b, fg.Tensor) and b.shape == (4, 2)
  b = next(iter(DataLoader([x, y], batch_size=4)))
  assert isinstance(b, tuple) and len(b) == 2
  b = next(iter(DataLoader(TensorDataset(x), batch_size=4)))
  assert isinstance(b, tuple) and len(b) == 1
  np.testing.assert_array_equal(b[0].numpy(), x[:4])


def test_non_contiguous_arrays(rng):
  base = rng.standard_normal((6, 10)).astype(np.float32)
  x = base.T[:, ::2]                                      # 10 samples of 3, strided both ways
  got = np.concatenate([b.numpy() for b in DataLoader(x, batch_size=3, shuffle=True, seed=1)])
  order = np.random.default_rng(1).permutation(10)
  np.testing.assert_array_equal(got, x[order])


@pytest.mark.parametrize("drop_last", [False, True])
def test_len_and_batch_sizes_match_torch(rng, drop_last):
  for _ in range(10):
    n, bs = int(rng.integers(1, 40)), int(rng.integers(1, 12))
    x = np.arange(n, dtype=np.float32)
    ours = DataLoader(x, batch_size=bs, drop_last=drop_last)
    theirs = torch.utils.data.DataLoader(torch.from_numpy(x), batch_size=bs, drop_last=drop_last)
    assert len(ours) == len(theirs)
    got = [b.numpy().tolist() for b in ours]
    want = [b.numpy().tolist() for b in theirs]
    assert got == want


def test_drop_last_with_shuffle_drops_a_random_tail(rng):
  n, bs = 23, 5
  y = np.arange(n)
  loader = DataLoader(y, batch_size=bs, shuffle=True, drop_last=True, seed=int(rng.integers(1 << 30)))
  assert len(loader) == 4
  seen = [b.numpy() for b in loader]
  assert [len(s) for s in seen] == [5, 5, 5, 5]
  flat = np.concatenate(seen)
  assert len(set(flat.tolist())) == 20 and set(flat.tolist()) <= set(range(n))


def test_empty_dataset_and_bad_arguments(rng):
  assert list(DataLoader(np.zeros((0, 3), np.float32), batch_size=2)) == [] and len(DataLoader(np.zeros(0), 2)) == 0
  with pytest.raises(ValueError, match="batch_size"): DataLoader(np.zeros(3), batch_size=0)
  with pytest.raises(ValueError, match="batch_size"): DataLoader(np.zeros(3), batch_size=True)
  with pytest.raises(TypeError, match="Dataset"): DataLoader(42)
  with pytest.raises(TypeError, match="callable"): DataLoader(np.zeros(3), collate_fn=3)
  with pytest.raises(RuntimeError, match="unknown device"): DataLoader(np.zeros(3), device="TPU")


def test_tensor_dataset_checks_lengths(rng):
  with pytest.raises(ValueError, match=r"same length.*got 5, 5, 4"):
    TensorDataset(np.zeros(5), np.zeros((5, 2)), np.zeros(4))
  with pytest.raises(ValueError, match="same length.*got 3, 4"): DataLoader((np.zeros(3), np.zeros(4)))
  with pytest.raises(TypeError, match="numpy array"): TensorDataset(np.zeros(3), [1, 2, 3])
  with pytest.raises(ValueError, match="0-d"): TensorDataset(np.zeros(()))
  with pytest.raises(ValueError, match="at least one"): TensorDataset()
  x, y = rng.standard_normal((4, 2)), rng.integers(0, 3, 4)
  ds = TensorDataset(x, y)
  assert len(ds) == 4 and isinstance(ds, Dataset)
  a, b = ds[2]
  np.testing.assert_array_equal(a, x[2])
  assert b == y[2]


# ---- shuffling and seeds ----------------------------------------------------------------------------------

def _epoch(loader) -> list:
  return np.concatenate([yb.numpy() for _, yb in loader]).tolist()


def test_shuffle_is_a_new_permutation_each_epoch_and_keeps_rows_aligned(rng):
  n = 50
  x = rng.standard_normal((n, 4)).astype(np.float32)
  idx = np.arange(n)
  seed = int(rng.integers(1 << 30))
  loader = DataLoader((x, idx), batch_size=8, shuffle=True, seed=seed)
  epochs = []
  for _ in range(3):
    xs, ids = [], []
    for xb, ib in loader:
      xs.append(xb.numpy())
      ids.append(ib.numpy())
    xs, ids = np.concatenate(xs), np.concatenate(ids)
    assert sorted(ids.tolist()) == list(range(n))        # every sample once
    np.testing.assert_array_equal(xs, x[ids])             # rows of x and y stay together
    epochs.append(ids.tolist())
  assert epochs[0] != epochs[1] != epochs[2] and epochs[0] != list(range(n))
  # the order is numpy's Generator: one permutation per epoch
  g = np.random.default_rng(seed)
  assert epochs == [g.permutation(n).tolist() for _ in range(3)]


def test_same_seed_same_sequence_other_seed_other(rng):
  y = np.arange(40)
  s = int(rng.integers(1 << 30))
  a = DataLoader((y, y), batch_size=7, shuffle=True, seed=s)
  b = DataLoader((y, y), batch_size=7, shuffle=True, seed=s)
  c = DataLoader((y, y), batch_size=7, shuffle=True, seed=s + 1)
  ea, eb, ec = [_epoch(a) for _ in range(2)], [_epoch(b) for _ in range(2)], [_epoch(c) for _ in range(2)]
  assert ea == eb and ea != ec


def test_seed_none_follows_fusegrad_manual_seed(rng):
  y = np.arange(40)
  s = int(rng.integers(1 << 30))
  fg.manual_seed(s)
  a = DataLoader((y, y), batch_size=5, shuffle=True)
  fg.manual_seed(s)
  b = DataLoader((y, y), batch_size=5, shuffle=True)
  c = DataLoader((y, y), batch_size=5, shuffle=True)      # the global generator moved on
  assert a.seed == b.seed != c.seed
  assert _epoch(a) == _epoch(b) != _epoch(c)


def test_no_shuffle_needs_no_seed():
  assert DataLoader(np.arange(4)).seed is None


# ---- tensors and dataset objects -------------------------------------------------------------------------

def test_tensor_dataset_of_fusegrad_tensors(device, rng):
  x = rng.standard_normal((30, 3)).astype(np.float32)
  y = rng.integers(0, 5, 30)
  seed = int(rng.integers(1 << 30))
  src = (fg.tensor(x, device="PYTHON"), y)                 # a tensor on another device, mixed with an array
  ids = np.random.default_rng(seed).permutation(30)
  got_x, got_y = [], []
  for xb, yb in DataLoader(src, batch_size=8, shuffle=True, seed=seed, device=device):
    assert xb.device == device and yb.device == device and xb.node.realized and xb.dtype == fg.float32
    got_x.append(xb.numpy())
    got_y.append(yb.numpy())
  np.testing.assert_array_equal(np.concatenate(got_x), x[ids])
  np.testing.assert_array_equal(np.concatenate(got_y), y[ids])
  unshuffled = [b.numpy() for b in DataLoader(fg.tensor(x), batch_size=8, device=device)]
  np.testing.assert_array_equal(np.concatenate(unshuffled), x)


class Squares:
  """A dataset object: (features, label, weight) with Python numbers among them."""
  def __init__(self, n, rng):
    self.x = rng.standard_normal((n, 2)).astype(np.float32)
    self.calls = []
  def __len__(self): return len(self.x)
  def __getitem__(self, i):
    assert isinstance(i, int)
    self.calls.append(i)
    return self.x[i], i * i, float(i) / 2, bool(i % 2)


def test_dataset_object_is_collated_like_torch(device, rng):
  ds = Squares(11, rng)
  assert isinstance(ds, Dataset)
  batches = list(DataLoader(ds, batch_size=4, device=device))
  tb = list(torch.utils.data.DataLoader(ds, batch_size=4))
  assert len(batches) == len(tb) == 3
  for ours, theirs in zip(batches, tb):
    assert isinstance(ours, tuple) and len(ours) == 4
    for o, t in zip(ours, theirs):
      assert o.device == device
      np.testing.assert_array_equal(o.numpy(), t.numpy().astype(o.dtype.np))
    assert ours[0].dtype == fg.float32 and ours[1].dtype == fg.int64 and ours[3].dtype == fg.bool
    assert ours[2].dtype == fg.float32                     # torch: float64; fusegrad's default float
  assert sorted(ds.calls) == sorted(list(range(11)) * 2)   # one __getitem__ per sample (ours, then torch's)


def test_dataset_samples_of_dicts_namedtuples_strings_and_numpy_scalars(rng):
  P = namedtuple("P", "a b")
  data = rng.standard_normal((6, 3)).astype(np.float32)

  class DS:
    def __len__(self): return 6
    def __getitem__(self, i):
      return {"p": P(data[i], np.int32(i)), "name": f"s{i}", "h": np.float16(i / 4)}
  (b,) = list(DataLoader(DS(), batch_size=6))
  assert isinstance(b["p"], P)
  np.testing.assert_array_equal(b["p"].a.numpy(), data)
  assert b["p"].b.dtype == fg.int32 and b["p"].b.numpy().tolist() == list(range(6))
  assert b["name"] == [f"s{i}" for i in range(6)]
  assert b["h"].dtype == fg.float16
  ref = torch.utils.data.default_collate([DS()[i] for i in range(6)])
  np.testing.assert_array_equal(b["h"].numpy(), ref["h"].numpy())
  assert ref["name"] == b["name"]


def test_default_collate_errors_and_tensors(rng):
  with pytest.raises(RuntimeError, match="shape"): default_collate([np.zeros(2), np.zeros(3)])
  with pytest.raises(RuntimeError, match="same number of fields"): default_collate([(1, 2), (3,)])
  with pytest.raises(TypeError, match="found object"): default_collate([object()])
  with pytest.raises(ValueError, match="empty"): default_collate([])
  t = [fg.tensor(rng.standard_normal(3).astype(np.float32)) for _ in range(4)]
  out = default_collate(t)
  np.testing.assert_array_equal(out.numpy(), np.stack([a.numpy() for a in t]))


def test_dataset_returning_fusegrad_tensors(device, rng):
  x = rng.standard_normal((9, 2)).astype(np.float32)
  xt = fg.tensor(x)

  class DS:
    def __len__(self): return 9
    def __getitem__(self, i): return xt[i] * 2, i
  got = [(a, b) for a, b in DataLoader(DS(), batch_size=4, device=device)]
  assert all(a.device == device and a.node.realized for a, _ in got)
  np.testing.assert_array_equal(np.concatenate([a.numpy() for a, _ in got]), x * 2)


def test_custom_collate_fn(rng):
  x = rng.standard_normal((10, 2)).astype(np.float32)
  seen = []

  def collate(samples):
    seen.append(len(samples))
    xs = np.stack([s[0] for s in samples])
    return {"x": xs, "sum": xs.sum(), "n": len(samples)}
  out = list(DataLoader((x, np.arange(10)), batch_size=4, collate_fn=collate))
  assert seen == [4, 4, 2]
  assert [o["n"] for o in out] == [4, 4, 2]
  np.testing.assert_array_equal(out[2]["x"].numpy(), x[8:])
  assert isinstance(out[0]["sum"], np.floating)          # numpy scalars are not arrays: left as they are
  (b,) = list(DataLoader(x, batch_size=10, collate_fn=lambda rows: np.stack(rows)[::-1] * 2))   # rows of one array
  np.testing.assert_array_equal(b.numpy(), x[::-1] * 2)


def test_default_device():
  (b,) = list(DataLoader(np.zeros((2, 2), np.float32), batch_size=2))
  assert b.device == rd.canonical(None) == DataLoader(np.zeros(1)).device


# ---- the prefetch thread ----------------------------------------------------------------------------------

class Failing:
  def __init__(self, n, bad): self.n, self.bad = n, bad
  def __len__(self): return self.n
  def __getitem__(self, i):
    if i == self.bad: raise KeyError(f"sample {i} is broken")
    return np.float32(i)


@pytest.mark.parametrize("prefetch", [True, False])
def test_errors_reach_the_consumer(rng, prefetch):
  bad = int(rng.integers(8, 20))
  it = iter(DataLoader(Failing(20, bad), batch_size=4, prefetch=prefetch))
  got = []
  with pytest.raises(KeyError, match=f"sample {bad} is broken") as e:
    for b in it: got.extend(b.numpy().tolist())
  assert got == list(range(bad // 4 * 4))                  # every batch before the broken one arrived
  assert any(f.name == "__getitem__" for f in __import__("traceback").extract_tb(e.value.__traceback__))
  with pytest.raises(StopIteration): next(it)              # the iterator is finished, not stuck
  _wait_no_prefetch_threads()


def test_collate_errors_reach_the_consumer(rng):
  def collate(samples): raise ValueError("collate says no")
  with pytest.raises(ValueError, match="collate says no"):
    list(DataLoader(np.zeros(5), batch_size=2, collate_fn=collate))
  _wait_no_prefetch_threads()


class Recording:
  """Counts the samples read; __getitem__ of sample `gate` waits for the consumer's go."""
  def __init__(self, n, bs):
    self.n, self.bs, self.read, self.reached = n, bs, [], threading.Event()
  def __len__(self): return self.n
  def __getitem__(self, i):
    self.read.append(i)
    if i == 3 * self.bs: self.reached.set()
    return np.full(2, i, np.float32)


def test_prefetch_runs_ahead_but_only_two_batches(rng):
  bs = 4
  ds = Recording(100, bs)
  it = iter(DataLoader(ds, batch_size=bs))
  first = next(it)
  np.testing.assert_array_equal(first.numpy()[:, 0], np.arange(4))
  assert ds.reached.wait(timeout=60)                        # batches 1, 2 queued and 3 started while we idle
  # at most: batch 0 (taken), 1 and 2 (queued), 3 (blocked waiting for room), so nothing past sample 16
  assert max(ds.read) < 4 * bs
  rest = [b.numpy()[:, 0] for b in it]
  np.testing.assert_array_equal(np.concatenate([first.numpy()[:, 0]] + rest), np.arange(100))
  _wait_no_prefetch_threads()


def test_early_break_stops_the_thread(rng):
  ds = Recording(400, 2)
  for i, b in enumerate(DataLoader(ds, batch_size=2)):
    if i == 3: break
  _wait_no_prefetch_threads()                               # the dropped iterator signalled its thread
  assert max(ds.read) < 2 * 8
  it = iter(DataLoader(ds, batch_size=2))
  next(it)
  it.close()                                                # explicit close joins the thread
  assert _prefetch_threads() == []
  with pytest.raises(StopIteration): next(it)


def test_many_loaders_abandoned_mid_epoch(rng):
  x = rng.standard_normal((64, 3)).astype(np.float32)
  its = [iter(DataLoader(x, batch_size=2)) for _ in range(5)]
  for it in its: next(it)
  del it, its
  _wait_no_prefetch_threads()


@pytest.mark.parametrize("how", ["break", "held", "error"])
def test_interpreter_exits_with_a_live_loader(tmp_path, how):
  script = f"""
import numpy as np
from fusegrad.data import DataLoader
x = np.arange(4000, dtype=np.float32).reshape(1000, 4)
loader = DataLoader(x, batch_size=3, shuffle=True, seed=0)
it = iter(loader)
if "{how}" == "break":
  for i, b in enumerate(loader):
    if i == 2: break
elif "{how}" == "held":
  first = next(it)   # the thread is now blocked on a full queue, and the iterator is still referenced
else:
  next(it)
  raise SystemExit(3)
print("done")
"""
  r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert r.returncode == (3 if how == "error" else 0), r.stderr
  assert (r.stdout.strip() == "done") == (how != "error")
  assert "Traceback" not in r.stderr


# ---- digits ---------------------------------------------------------------------------------------------------

def test_digits_file_is_sklearns():
  data = (ROOT / "fusegrad" / "data" / "digits.csv.gz").read_bytes()
  digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
  assert digest == "CfZubeve4s0rWuWeDWq7tz_CsOAYXS4ZV-nrtR4jqiI"   # RECORD of scikit-learn 1.9.1's wheel


def test_digits_values():
  x, y = load_digits()
  assert x.shape == (1797, 8, 8) and x.dtype == np.float32 and y.shape == (1797,) and y.dtype == np.int64
  assert x.min() == 0 and x.max() == 16 and np.array_equal(x, np.round(x))
  assert sorted(set(y.tolist())) == list(range(10)) and np.bincount(y).min() >= 170
  with gzip.open(ROOT / "fusegrad" / "data" / "digits.csv.gz", "rt") as f:   # independent parse of the file
    rows = [[int(float(v)) for v in line.split(",")] for line in f if line.strip()]
  ref = np.array(rows)
  np.testing.assert_array_equal(x.reshape(1797, 64), ref[:, :64])
  np.testing.assert_array_equal(y, ref[:, 64])
  x[0, 0, 0] = 99                                           # callers get their own copy
  assert load_digits()[0][0, 0, 0] != 99


def _rows(x, y) -> list:
  return sorted(map(tuple, np.concatenate([x.reshape(len(x), 64), y[:, None]], 1).astype(int).tolist()))


def test_digits_split(rng):
  x, y = load_digits()
  xtr, ytr = load_digits(split="train")
  xte, yte = load_digits(split="test")
  assert len(xte) == round(0.2 * 1797) == 359 and len(xtr) == 1797 - 359 and len(ytr) == len(xtr)
  assert _rows(np.concatenate([xtr, xte]), np.concatenate([ytr, yte])) == _rows(x, y)   # a partition of the data
  perm = np.random.default_rng(0).permutation(1797)
  np.testing.assert_array_equal(xte, x[np.sort(perm[:359])])
  assert np.array_equal(load_digits(split="test")[0], xte)                 # deterministic
  s = int(rng.integers(1, 1 << 30))
  xo, yo = load_digits(split="test", seed=s)
  assert not np.array_equal(xo, xte)
  x3, _ = load_digits(split="train", test_fraction=0.5, seed=s)
  assert len(x3) == 1797 - round(0.5 * 1797)
  with pytest.raises(ValueError, match="split"): load_digits(split="val")
  with pytest.raises(ValueError, match="test_fraction"): load_digits(split="test", test_fraction=1.0)
  with pytest.raises(ValueError, match="empty split"): load_digits(split="test", test_fraction=1e-5)


def test_digits_through_a_loader(device):
  x, y = load_digits(split="train")
  seen = 0
  for xb, yb in DataLoader((x / 16, y), batch_size=128, shuffle=True, seed=0, drop_last=True, device=device):
    assert xb.shape == (128, 8, 8) and xb.dtype == fg.float32 and yb.dtype == fg.int64
    assert 0 <= xb.numpy().min() and xb.numpy().max() <= 1
    seen += 128
  assert seen == len(x) // 128 * 128


def test_import_needs_only_numpy():
  code = ("import sys, fusegrad.data; bad = [m for m in ('torch', 'sklearn', 'pandas', 'safetensors', 'tqdm', 'scipy') "
          "if m in sys.modules]; print(bad)")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
