"""PyTorch's API around the model, as `import fusegrad as torch` programs (nanoGPT, minGPT, the MNIST and VAE
examples) use it, checked against torch (CPU): new_* constructors, multinomial (statistically), from_numpy's
shared memory, fusegrad.device and the CUDA/accelerator queries, save/load as safetensors, utils.data, the grad
mode switches, and a nanoGPT model written once for both libraries (tests/nanogpt_model.py)."""
from __future__ import annotations
import io
import math
import warnings
import numpy as np
import pytest
import torch
import safetensors.torch
import fusegrad as fg
import fusegrad.nn.functional as F
from fusegrad.nn.state import StateFileError
from nanogpt_model import GPTConfig, build


def _chi2_ok(counts: np.ndarray, expected: np.ndarray) -> None:
  """Pearson's statistic within 7 standard deviations of its chi-square mean (fails by chance ~never)."""
  keep = expected > 0
  assert counts[~keep].sum() == 0, f"samples of zero-probability categories: {counts}"
  stat = (((counts - expected) ** 2)[keep] / expected[keep]).sum()
  k = keep.sum() - 1
  assert stat < k + 7 * math.sqrt(2 * k), f"chi-square {stat:.1f} with {k} degrees of freedom: {counts} vs {expected}"


# ---- new_* and *_like -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "int32", "float64"])
def test_new_constructors_like_torch(device, dtype):
  if device == "OPENCL" and dtype == "float64" and fg.float64 not in __import__("fusegrad.runtime.device").runtime.device.get("OPENCL").supported:
    pytest.skip("this OpenCL device has no float64")
  x, tx = fg.ones(2, 3, dtype=getattr(fg, dtype), device=device), torch.ones(2, 3, dtype=getattr(torch, dtype))
  for name, args in (("new_zeros", (4, 5)), ("new_zeros", ((4, 5),)), ("new_ones", (3,)), ("new_ones", ([2, 2],)),
                     ("new_empty", (2, 0)), ("new_full", ((2, 3), 7))):
    ours, theirs = getattr(x, name)(*args), getattr(tx, name)(*args)
    assert ours.shape == tuple(theirs.shape) and ours.dtype.name == str(theirs.dtype)[6:] and ours.device == device
    if name != "new_empty": np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
  t = x.new_tensor([[1, 2], [3, 4]])
  assert t.dtype == x.dtype and t.device == device
  np.testing.assert_array_equal(t.numpy(), tx.new_tensor([[1, 2], [3, 4]]).numpy())
  assert x.new_zeros(2, dtype=fg.int64).dtype == fg.int64 and x.new_full((1,), 2.5, dtype=fg.float32).item() == 2.5
  assert x.new_tensor(fg.tensor([1.5, 2.5], device=device)).dtype == x.dtype
  if dtype != "int32":
    g = x.new_zeros(3, requires_grad=True)
    assert g.requires_grad and g.is_leaf
  else:
    with pytest.raises(RuntimeError, match="floating point"): x.new_zeros(3, requires_grad=True)
  with pytest.raises(TypeError, match="sequence of ints"): x.new_zeros(2.5)


def test_like_constructors(device):
  x = fg.ones(3, 4, dtype=fg.int32, device=device)
  for f in (fg.zeros_like, fg.ones_like, fg.empty_like, fg.rand_like, fg.randn_like):
    y = f(x, dtype=fg.float32) if f in (fg.rand_like, fg.randn_like) else f(x)
    assert y.shape == (3, 4) and y.device == device
  assert fg.full_like(x, 5).numpy().tolist() == [[5] * 4] * 3
  r = fg.randint_like(x, 7)
  assert r.dtype == fg.int32 and r.shape == (3, 4) and 0 <= r.numpy().min() and r.numpy().max() < 7
  r = fg.randint_like(x, 3, 5, dtype=fg.int64).numpy()
  assert r.dtype == np.int64 and set(np.unique(r)) <= {3, 4}


# ---- multinomial --------------------------------------------------------------------------------------------

def test_multinomial_with_replacement_distribution(device, rng):
  fg.manual_seed(int(rng.integers(1 << 31)))
  w = rng.uniform(0.2, 3, 7).astype(np.float32)   # no tiny expected counts: Pearson's statistic needs a few per cell
  w[2] = 0   # unnormalized weights with one impossible category
  n = {"CPU": 20000, "PYTHON": 2000}.get(device, 4000)
  s = fg.multinomial(fg.tensor(w, device=device), n, replacement=True)
  assert s.shape == (n,) and s.dtype == fg.int64 and s.device == device
  _chi2_ok(np.bincount(s.numpy(), minlength=7), n * w / w.sum())
  # 2-D: each row its own distribution; the method spelling
  p = np.array([[0.0, 1.0, 3.0], [5.0, 0.0, 5.0]], np.float32)
  s2 = fg.tensor(p, device=device).multinomial(2000, True).numpy()
  assert s2.shape == (2, 2000)
  for r in range(2): _chi2_ok(np.bincount(s2[r], minlength=3), 2000 * p[r] / p[r].sum())


def test_multinomial_without_replacement(device, rng):
  fg.manual_seed(int(rng.integers(1 << 31)))
  p = np.array([0.5, 0.3, 0.0, 0.2], np.float32)
  rows = 3000 if device == "CPU" else 600
  s = fg.multinomial(fg.tensor(np.tile(p, (rows, 1)), device=device), 3).numpy()
  assert s.shape == (rows, 3) and s.dtype == np.int64
  assert all(len(set(r)) == 3 for r in s) and not (s == 2).any()
  _chi2_ok(np.bincount(s[:, 0], minlength=4), rows * p / p.sum())
  # the second draw of sequential sampling without replacement: P(j) = sum_i p_i p_j / (1 - p_i)
  second = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(4) if i != j) for j in range(4)])
  _chi2_ok(np.bincount(s[:, 1], minlength=4), rows * second)
  # every category once when all are drawn; the zero-weight one comes last, as in PyTorch
  full = fg.multinomial(fg.tensor(p, device=device), 4).numpy()
  assert sorted(full) == [0, 1, 2, 3] and full[-1] == 2


def test_multinomial_large_rows_without_replacement(rng):
  fg.manual_seed(int(rng.integers(1 << 31)))
  w = rng.random((2, 5000)).astype(np.float32)
  w[:, ::2] = 0
  s = fg.multinomial(fg.tensor(w), 6).numpy()   # n above the argsort bound: rounds of arg-min
  assert s.shape == (2, 6) and all(len(set(r)) == 6 for r in s) and (s % 2 == 1).all()
  one = fg.multinomial(fg.tensor(w[0]), 1).numpy()
  assert one.shape == (1,) and one[0] % 2 == 1


def test_multinomial_is_seeded():
  p = fg.tensor([0.2, 0.3, 0.5])
  fg.manual_seed(11); a = fg.multinomial(p, 50, True).numpy()
  fg.manual_seed(11); b = fg.multinomial(p, 50, True).numpy()
  c = fg.multinomial(p, 50, True).numpy()
  np.testing.assert_array_equal(a, b)
  assert (a != c).any()
  g = fg.Generator().manual_seed(5)
  d = fg.multinomial(p, 50, True, generator=g).numpy()
  np.testing.assert_array_equal(d, fg.multinomial(p, 50, True, generator=fg.Generator().manual_seed(5)).numpy())
  assert g.initial_seed() == 5
  with pytest.raises(TypeError, match="fusegrad.Generator"): fg.multinomial(p, 1, generator=torch.Generator())


@pytest.mark.parametrize("probs,k,repl,match", [
  ([1.0, -1.0], 1, True, "inf`, `nan` or element < 0"), ([1.0, math.inf], 1, False, "inf`, `nan` or element < 0"),
  ([1.0, math.nan], 1, True, "inf`, `nan` or element < 0"), ([0.0, 0.0], 1, True, r"sum of probabilities <= 0"),
  ([[1.0, 1.0], [0.0, 0.0]], 1, False, r"sum of probabilities <= 0"), (1.0, 1, True, "1 or 2 dim"),
  ([[[1.0]]], 1, True, "1 or 2 dim"), ([1.0, 1.0, 0.0], 4, False, "n_sample > prob_dist.size"),
  ([1.0, 1.0], 0, True, "n_sample <= 0")])
def test_multinomial_errors_like_torch(probs, k, repl, match):
  with pytest.raises(RuntimeError, match=match): torch.multinomial(torch.tensor(probs), k, repl)
  with pytest.raises(RuntimeError, match=match): fg.multinomial(fg.tensor(probs), k, repl)


def test_multinomial_rejects_integer_weights():
  with pytest.raises(RuntimeError, match="floating-point"): fg.multinomial(fg.tensor([1, 2]), 1)
  with pytest.raises(TypeError, match="num_samples"): fg.multinomial(fg.tensor([1.0, 2.0]), 1.0)


# ---- from_numpy -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("npdt", [np.float32, np.float64, np.float16, np.int64, np.int32, np.int8, np.uint8, np.bool_])
def test_from_numpy_shares_memory(rng, npdt):
  a = (rng.standard_normal((3, 4)) * 10).astype(npdt)
  t, tt = fg.from_numpy(a), torch.from_numpy(a)
  assert t.dtype.name == str(tt.dtype)[6:] and t.shape == (3, 4) and t.device == "CPU"
  np.testing.assert_array_equal(t.numpy(), a)
  lazy = t + 0 if npdt != np.bool_ else t | False
  a[1, 2] = 1   # visible to the tensor and to what is computed from it later, as with torch's shared memory
  assert t.numpy()[1, 2] == 1 and lazy.numpy()[1, 2] == 1 and tt[1, 2].item() == 1


def test_from_numpy_memory_is_never_reused(rng):
  a = rng.standard_normal(4096).astype(np.float32)
  keep = a.copy()
  t = fg.from_numpy(a)
  (t * 2).numpy()
  del t
  for _ in range(3): (fg.rand(4096) + 1).realize()   # buffers of the same size, freed and reused meanwhile
  np.testing.assert_array_equal(a, keep)


def test_from_numpy_copies_what_it_cannot_share(rng):
  a = rng.standard_normal((4, 6)).astype(np.float32)
  for view in (a[:, ::2], a.T, a[::-1]):
    t = fg.from_numpy(view)
    np.testing.assert_array_equal(t.numpy(), view)
  assert fg.from_numpy(np.zeros((0, 3), np.float32)).shape == (0, 3)
  z = fg.from_numpy(np.array(2.5))
  assert z.shape == () and z.item() == 2.5 and z.dtype == fg.float64


def test_from_numpy_errors_and_warnings():
  with pytest.raises(TypeError, match="expected np.ndarray"): fg.from_numpy([1, 2])
  with pytest.raises(ValueError, match="byte order"): torch.from_numpy(np.ones(3, ">f4"))
  with pytest.raises(ValueError, match="byte order"): fg.from_numpy(np.ones(3, ">f4"))
  with pytest.raises(TypeError, match="complex64"): fg.from_numpy(np.ones(3, np.complex64))
  with pytest.raises(TypeError, match="uint16"): fg.from_numpy(np.ones(3, np.uint16))
  ro = np.arange(4, dtype=np.float32)
  ro.flags.writeable = False
  with pytest.warns(UserWarning, match="not writable"): t = fg.from_numpy(ro)
  assert t.sum().item() == 6


# ---- devices and the accelerator queries ------------------------------------------------------------------

@pytest.mark.parametrize("spec", [("cpu",), ("cuda",), ("cuda:1",), ("cuda", 2), ("mps",), ("cpu:0",)])
def test_device_object_like_torch(spec):
  d, td = fg.device(*spec), torch.device(*spec)
  assert (d.type, d.index, str(d), repr(d)) == (td.type, td.index, str(td), repr(td))
  assert d == fg.device(*spec) and hash(d) == hash(fg.device(*spec)) and d != fg.device("python")
  assert fg.device(d) == d


def test_device_errors_and_string_equality():
  with pytest.raises(RuntimeError, match="device type at start of device string: foo"): fg.device("foo")
  with pytest.raises(RuntimeError, match="Invalid device string"): fg.device("cuda:x")
  with pytest.raises(TypeError, match="device"): fg.device(1.5)
  if fg.accelerator.current_accelerator() is None:   # an int names an index on the accelerator
    with pytest.raises(RuntimeError, match="none is available"): fg.device(0)
  else:
    assert fg.device(1) == fg.device(fg.accelerator.current_accelerator().type, 1)
  assert fg.device("cpu") == "cpu" and fg.device("cpu") == "CPU" and fg.device("opencl") == "OPENCL"
  assert fg.device("cpu") != "nonsense"
  with pytest.raises(AttributeError): fg.device("cpu").type = "cuda"


def test_devices_accepted_where_names_are(device):
  d = fg.device(device.lower())
  x = fg.tensor([1.0, 2.0], device=d)
  assert x.device == device and fg.zeros(2, device=d).device == device and fg.arange(3, device=d).device == device
  assert x.to(fg.device("cpu")).device == "CPU" and fg.ones(2).to(d, fg.float64).dtype == fg.float64
  m = fg.nn.Linear(2, 2).to(d)
  assert m.weight.device == device and m(x).device == device


def test_cuda_is_not_available_and_says_so():
  assert fg.cuda.is_available() is False and fg.cuda.device_count() == 0 and not fg.cuda.is_bf16_supported()
  fg.cuda.manual_seed(1); fg.cuda.manual_seed_all(1); fg.cuda.synchronize(); fg.cuda.empty_cache()
  for use in (lambda: fg.ones(2).to("cuda"), lambda: fg.ones(2).to(fg.device("cuda:0")), lambda: fg.ones(2).cuda(),
              lambda: fg.tensor([1.0], device="cuda"), lambda: fg.nn.Linear(2, 2).to("cuda"),
              lambda: fg.zeros(3, device=fg.device("mps")), fg.cuda.current_device):
    with pytest.raises(RuntimeError, match=r"(CUDA|MPS).* is not available.*CPU, OPENCL, PYTHON"): use()
  assert fg.ones(1).is_cuda is False


def test_backend_switches_and_accelerator():
  fg.backends.cudnn.benchmark = True
  fg.backends.cudnn.deterministic = True
  fg.backends.cudnn.allow_tf32 = True
  fg.backends.cuda.matmul.allow_tf32 = True
  assert fg.backends.cudnn.benchmark and fg.backends.cuda.matmul.allow_tf32
  assert fg.backends.mps.is_available() is False and fg.backends.cudnn.is_available() is False
  fg.set_float32_matmul_precision("high")
  assert fg.get_float32_matmul_precision() == "high"
  fg.set_float32_matmul_precision("highest")
  with pytest.raises(RuntimeError, match="Invalid precision"): fg.set_float32_matmul_precision("low")
  # an OpenCL GPU/accelerator makes OPENCL an accelerator; PoCL's CPU driver does not
  try:
    import pyopencl as cl
    gpus = [d for p in cl.get_platforms() for d in p.get_devices()
            if d.type & (cl.device_type.GPU | cl.device_type.ACCELERATOR)]
  except Exception:
    gpus = []
  acc = fg.accelerator.current_accelerator()
  assert (acc == fg.device("opencl")) if gpus else acc is None
  assert fg.accelerator.is_available() == bool(gpus) and fg.accelerator.device_count() == (1 if gpus else 0)


# ---- save / load ---------------------------------------------------------------------------------------------

def test_save_load_state_dict_round_trip(tmp_path, rng):
  m = fg.nn.Sequential(fg.nn.Linear(3, 4), fg.nn.BatchNorm1d(4), fg.nn.Linear(4, 2))
  m(fg.tensor(rng.standard_normal((5, 3)).astype(np.float32)))
  path = tmp_path / "model.pt"
  fg.save(m.state_dict(), path)
  sd = fg.load(path, weights_only=True)
  assert list(sd) == list(m.state_dict())
  for k, v in m.state_dict().items():
    assert sd[k].dtype == v.dtype
    np.testing.assert_array_equal(sd[k].numpy(), v.numpy())
  m2 = fg.nn.Sequential(fg.nn.Linear(3, 4), fg.nn.BatchNorm1d(4), fg.nn.Linear(4, 2))
  m2.load_state_dict(fg.load(str(path), map_location=fg.device("cpu")))
  np.testing.assert_array_equal(m2[2].weight.numpy(), m[2].weight.numpy())
  # a flat state dict is a plain safetensors file for torch
  theirs = safetensors.torch.load_file(str(path))
  np.testing.assert_array_equal(theirs["0.weight"].numpy(), m[0].weight.numpy())
  assert theirs["1.num_batches_tracked"].dtype == torch.int64


def test_save_load_checkpoint_with_optimizer(tmp_path, rng, device):
  m = fg.nn.Linear(3, 2).to(device)
  opt = fg.optim.AdamW(m.parameters(), lr=1e-2)
  m(fg.tensor(rng.standard_normal((4, 3)).astype(np.float32), device=device)).sum().backward()
  opt.step()
  ckpt = {"model": m.state_dict(), "optimizer": opt.state_dict(), "iter_num": 7, "best_val_loss": 1.5,
          "config": {"n_layer": 2, "bias": True, "name": "gpt"}}
  buf = io.BytesIO()
  fg.save(ckpt, buf)
  buf.seek(0)
  back = fg.load(buf, map_location=device)
  assert back["iter_num"] == 7 and back["best_val_loss"] == 1.5 and back["config"] == ckpt["config"]
  assert back["model"]["weight"].device == device
  opt2 = fg.optim.AdamW(m.parameters(), lr=1e-2)
  opt2.load_state_dict(back["optimizer"])
  assert opt2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
  st, st2 = opt.state_dict()["state"][0], opt2.state_dict()["state"][0]
  np.testing.assert_array_equal(st["exp_avg"].numpy(), st2["exp_avg"].numpy())


def test_load_reads_files_torch_writes_and_refuses_pickles(tmp_path):
  w = torch.randn(3, 4)
  safetensors.torch.save_file({"w": w, "b": torch.arange(3)}, str(tmp_path / "t.safetensors"))
  sd = fg.load(tmp_path / "t.safetensors")
  np.testing.assert_array_equal(sd["w"].numpy(), w.numpy())
  assert sd["b"].dtype == fg.int64
  torch.save({"w": w}, tmp_path / "zip.pt")
  with pytest.raises(StateFileError, match=r"zip \(pickle\) format; fusegrad never unpickles.*save_file"):
    fg.load(tmp_path / "zip.pt")
  torch.save({"w": w}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
  with pytest.raises(StateFileError, match="pickle file.*never unpickles"): fg.load(tmp_path / "legacy.pt")
  with open(tmp_path / "zip.pt", "rb") as f:
    with pytest.raises(StateFileError, match="never unpickles"): fg.load(f)
  with pytest.raises(FileNotFoundError): fg.load(tmp_path / "missing.pt")
  with pytest.raises(TypeError, match="map_location"): fg.load(tmp_path / "t.safetensors", map_location=lambda s, l: s)


def test_save_refuses_what_safetensors_cannot_hold(tmp_path):
  with pytest.raises(TypeError, match=r"module object.*state_dict\(\)"): fg.save(fg.nn.Linear(2, 2), tmp_path / "m.pt")
  with pytest.raises(TypeError, match="not pickle: cannot save a function"): fg.save({"f": lambda: 0}, tmp_path / "f.pt")
  with pytest.raises(TypeError, match="not pickle: dict keys"): fg.save({(1, 2): fg.ones(1)}, tmp_path / "k.pt")
  assert not list(tmp_path.iterdir())


# ---- utils.data ------------------------------------------------------------------------------------------

def test_utils_data_is_fusegrad_data():
  import fusegrad.utils.data as ud
  for name in ("Dataset", "IterableDataset", "TensorDataset", "DataLoader", "random_split", "Subset", "ConcatDataset",
               "SequentialSampler", "RandomSampler", "BatchSampler", "SubsetRandomSampler", "WeightedRandomSampler",
               "default_collate"):
    assert getattr(ud, name) is getattr(fg.data, name) and getattr(fg.utils.data, name) is getattr(fg.data, name)


class Squares(fg.utils.data.Dataset):
  def __init__(self, n): self.n = n
  def __len__(self): return self.n
  def __getitem__(self, i): return np.array([i, i * i], np.float32), i


class TSquares(torch.utils.data.Dataset):
  def __init__(self, n): self.n = n
  def __len__(self): return self.n
  def __getitem__(self, i): return np.array([i, i * i], np.float32), i


def test_subset_concat_and_random_split_like_torch():
  ours, theirs = Squares(5) + Squares(3), TSquares(5) + TSquares(3)
  assert isinstance(ours, fg.data.ConcatDataset) and len(ours) == len(theirs) == 8
  for i in (0, 4, 5, 7, -1, -8):
    np.testing.assert_array_equal(ours[i][0], theirs[i][0])
  with pytest.raises(IndexError): ours[8]
  sub = fg.data.Subset(Squares(10), [3, 1, 4])
  assert len(sub) == 3 and sub[2][1] == 4
  for lengths in ([3, 7], [0.3, 0.7], [0.5, 0.25, 0.25], [0.34, 0.33, 0.33]):
    parts, tparts = fg.data.random_split(Squares(10), lengths), torch.utils.data.random_split(TSquares(10), lengths)
    assert [len(p) for p in parts] == [len(p) for p in tparts]
    assert sorted(i for p in parts for i in p.indices) == list(range(10))
  g = fg.Generator().manual_seed(42)
  a = [p.indices for p in fg.data.random_split(range(20), [5, 15], generator=g)]
  b = [p.indices for p in fg.data.random_split(range(20), [5, 15], generator=fg.Generator().manual_seed(42))]
  assert a == b
  with pytest.raises(ValueError, match="does not equal the length"): fg.data.random_split(range(10), [3, 3])


def test_samplers(rng):
  ds = Squares(10)
  assert list(fg.data.SequentialSampler(ds)) == list(range(10))
  perm = list(fg.data.RandomSampler(ds, generator=fg.Generator().manual_seed(1)))
  assert sorted(perm) == list(range(10))
  assert perm == list(fg.data.RandomSampler(ds, generator=fg.Generator().manual_seed(1)))
  r = list(fg.data.RandomSampler(ds, replacement=True, num_samples=25))
  assert len(r) == 25 and all(0 <= i < 10 for i in r)
  assert len(list(fg.data.RandomSampler(ds, num_samples=25))) == 25
  assert sorted(fg.data.SubsetRandomSampler([7, 2, 5])) == [2, 5, 7]
  assert list(fg.data.BatchSampler(range(7), 3, False)) == list(torch.utils.data.BatchSampler(range(7), 3, False))
  assert len(fg.data.BatchSampler(range(7), 3, True)) == 2
  w = np.array([1.0, 0.0, 3.0])
  draws = np.array(list(fg.data.WeightedRandomSampler(w, 4000)))
  _chi2_ok(np.bincount(draws, minlength=3), 4000 * w / w.sum())
  assert sorted(fg.data.WeightedRandomSampler(w, 2, replacement=False)) == [0, 2]
  with pytest.raises(RuntimeError, match="without replacement"): fg.data.WeightedRandomSampler(w, 3, replacement=False)
  with pytest.raises(ValueError, match="num_samples"): fg.data.RandomSampler(ds, num_samples=0)


def test_dataloader_sampler_arguments_like_torch():
  ds, tds = Squares(10), TSquares(10)
  order = [9, 0, 3, 3, 5, 1, 8]
  for kw in (dict(sampler=order, batch_size=3), dict(sampler=order, batch_size=3, drop_last=True),
             dict(batch_sampler=[[1, 2], [9], [0, 4, 7]]), dict(batch_size=4, drop_last=True)):
    ours, theirs = list(fg.utils.data.DataLoader(ds, **kw)), list(torch.utils.data.DataLoader(tds, **kw))
    assert len(ours) == len(theirs) == len(fg.utils.data.DataLoader(ds, **kw))
    for (x, y), (tx, ty) in zip(ours, theirs):
      np.testing.assert_array_equal(x.numpy(), tx.numpy())
      np.testing.assert_array_equal(y.numpy(), ty.numpy())
  # collate_fn, and a TensorDataset read through a sampler (its fast gather path)
  got = list(fg.data.DataLoader(ds, batch_size=4, collate_fn=lambda b: np.array([s[1] for s in b])))
  assert [g.numpy().tolist() for g in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
  x = np.arange(20, dtype=np.float32).reshape(10, 2)
  got = list(fg.data.DataLoader(fg.data.TensorDataset(x), sampler=[4, 2, 0], batch_size=2, num_workers=2,
                                pin_memory=True))
  np.testing.assert_array_equal(got[0][0].numpy(), x[[4, 2]])
  # minGPT's trainer: an endless random sampler, read lazily
  loader = fg.data.DataLoader(ds, sampler=fg.data.RandomSampler(ds, replacement=True, num_samples=int(1e10)),
                              batch_size=4, shuffle=False, pin_memory=True, num_workers=4)
  it = iter(loader)
  for _ in range(3):
    xb, yb = next(it)
    assert xb.shape == (4, 2) and set(yb.numpy().tolist()) <= set(range(10))
  it.close()
  assert len(loader) == int(1e10) // 4
  # shuffle draws from the generator: the same generator seed, the same order
  a = [b[1].numpy().tolist() for b in fg.data.DataLoader(ds, 3, shuffle=True, generator=fg.Generator().manual_seed(3))]
  b = [b[1].numpy().tolist() for b in fg.data.DataLoader(ds, 3, shuffle=True, generator=fg.Generator().manual_seed(3))]
  assert a == b and sorted(sum(a, [])) == list(range(10))


def test_dataloader_argument_errors_like_torch():
  ds = Squares(5)
  for kw, match in ((dict(sampler=[0], shuffle=True), "sampler option is mutually exclusive with shuffle"),
                    (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive"),
                    (dict(batch_sampler=[[0]], drop_last=True), "batch_sampler option is mutually exclusive")):
    with pytest.raises(ValueError, match=match): torch.utils.data.DataLoader(TSquares(5), **kw)
    with pytest.raises(ValueError, match=match): fg.data.DataLoader(ds, **kw)


class Stream(fg.data.IterableDataset):
  def __init__(self, n): self.n = n
  def __iter__(self): return iter([(np.float32(i), i) for i in range(self.n)])


def test_iterable_dataset():
  got = list(fg.data.DataLoader(Stream(7), batch_size=3))
  assert [y.numpy().tolist() for _, y in got] == [[0, 1, 2], [3, 4, 5], [6]]
  assert len(list(fg.data.DataLoader(Stream(7), batch_size=3, drop_last=True))) == 2
  with pytest.raises(ValueError, match="IterableDataset: expected unspecified shuffle"):
    fg.data.DataLoader(Stream(3), shuffle=True)
  with pytest.raises(TypeError, match="no len"): len(fg.data.DataLoader(Stream(3)))
  assert [y.numpy().tolist() for _, y in fg.data.DataLoader(Stream(2) + Stream(2), batch_size=4)] == [[0, 1, 0, 1]]


# ---- grad modes, compile, autocast ---------------------------------------------------------------------------

def test_grad_mode_switches():
  w = fg.ones(2, requires_grad=True)
  with fg.inference_mode():
    assert not fg.is_grad_enabled() and not (w * 2).requires_grad
  assert fg.is_grad_enabled()

  @fg.inference_mode
  def f(): return w * 2

  @fg.inference_mode()
  def g(): return w * 2
  assert not f().requires_grad and not g().requires_grad and fg.is_grad_enabled()

  @fg.inference_mode()
  def depth(n): return w * 2 if n == 0 else depth(n - 1)
  assert not depth(3).requires_grad and fg.is_grad_enabled()   # recursion restores the caller's mode
  with fg.inference_mode(False): assert (w * 2).requires_grad
  fg.set_grad_enabled(False)
  assert not fg.is_grad_enabled() and not (w * 2).requires_grad
  fg.set_grad_enabled(True)
  with fg.set_grad_enabled(False): assert not fg.is_grad_enabled()
  assert fg.is_grad_enabled()
  with fg.no_grad():
    with fg.set_grad_enabled(True): assert (w * 2).requires_grad
    assert not fg.is_grad_enabled()
  with pytest.raises(TypeError, match="bool"): fg.set_grad_enabled(1)


def test_compile_is_a_no_op_and_autocast_refuses_what_it_cannot_do():
  m = fg.nn.Linear(2, 2)
  assert fg.compile(m) is m and fg.compile(mode="max-autotune")(m) is m
  def step(x): return x + 1
  assert fg.compile(step) is step and "no-op" in fg.compile.__doc__
  with fg.autocast("cpu", enabled=False): pass
  with fg.autocast(device_type="cpu", dtype=fg.float32): pass
  with fg.amp.autocast("cuda", enabled=False): pass
  with pytest.raises(RuntimeError, match="mixed precision is not supported.*bfloat16"): fg.autocast("cpu", dtype=fg.bfloat16)
  with pytest.raises(RuntimeError, match="device type"): fg.autocast("tpu")
  scaler = fg.cuda.amp.GradScaler(enabled=False)
  loss = (m(fg.ones(1, 2)) ** 2).sum()
  assert scaler.scale(loss) is loss and not scaler.is_enabled()
  with pytest.raises(RuntimeError, match="loss scaling is not supported"): fg.amp.GradScaler(enabled=True)


# ---- programs written for torch ---------------------------------------------------------------------------

def _twin_gpt(flash: bool, dropout: float = 0.0):
  cfg = GPTConfig(block_size=16, vocab_size=37, n_layer=2, n_head=2, n_embd=16, dropout=dropout, flash=flash)
  tm = build(torch)(cfg)
  fm = build(fg)(GPTConfig(**vars(cfg)))
  fm.load_state_dict({k: fg.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()})
  return tm, fm, cfg


@pytest.mark.parametrize("flash", [True, False])
def test_nanogpt_matches_torch(rng, flash):
  tm, fm, cfg = _twin_gpt(flash)
  assert list(fm.state_dict()) == list(tm.state_dict()) and fm.get_num_params() == tm.get_num_params()
  assert fm.transformer.wte.weight is fm.lm_head.weight
  idx, tgt = rng.integers(0, 37, (3, 11)), rng.integers(0, 37, (3, 11))
  tgt[0, :4] = -1   # ignore_index=-1
  tl, tloss = tm(torch.tensor(idx), torch.tensor(tgt))
  fl, floss = fm(fg.tensor(idx), fg.tensor(tgt))
  np.testing.assert_allclose(fl.numpy(), tl.detach().numpy(), atol=2e-5, rtol=1e-4)
  np.testing.assert_allclose(floss.item(), tloss.item(), rtol=1e-5)
  tloss.backward()
  floss.backward()
  tp, fp = dict(tm.named_parameters()), dict(fm.named_parameters())
  assert list(tp) == list(fp)
  for k in tp: np.testing.assert_allclose(fp[k].grad.numpy(), tp[k].grad.numpy(), atol=1e-6, rtol=1e-4, err_msg=k)
  # inference: the last position only, through x[:, [-1], :]
  tl1, _ = tm(torch.tensor(idx))
  fl1, none = fm(fg.tensor(idx))
  assert none is None and fl1.shape == (3, 1, 37)
  np.testing.assert_allclose(fl1.numpy(), tl1.detach().numpy(), atol=2e-5, rtol=1e-4)
  # one AdamW step through nanoGPT's configure_optimizers (decay and no-decay groups)
  topt = tm.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
  fopt = fm.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
  topt.step()
  fopt.step()
  for k in tp:
    # Adam's first step is lr * g / (|g| + eps): about lr * sign(g), so a gradient near 0 (where float rounding
    # decides its sign) may move its weight by up to lr in either library; elsewhere the steps agree closely
    firm = np.abs(tp[k].grad.numpy()) > 1e-5
    got, want = fp[k].numpy(), tp[k].detach().numpy()
    np.testing.assert_allclose(got[firm], want[firm], atol=1e-6, rtol=1e-5, err_msg=k)
    assert np.abs(got - want).max() <= 2.1e-3, k


def test_nanogpt_generate_samples_with_multinomial(rng):
  _, fm, cfg = _twin_gpt(flash=True)
  fm.eval()
  # a start of 13 and 5 new tokens: past block_size (16) the context is cropped; every length is a new set of kernels
  start = fg.tensor(rng.integers(0, 37, (2, 13)))
  fg.manual_seed(4)
  out = fm.generate(start, max_new_tokens=5)
  assert out.shape == (2, 18) and out.dtype == fg.int64
  o = out.numpy()
  np.testing.assert_array_equal(o[:, :13], start.numpy())
  assert o.min() >= 0 and o.max() < 37
  fg.manual_seed(4)
  np.testing.assert_array_equal(fm.generate(start, max_new_tokens=5).numpy(), o)
  # a sharp distribution (temperature -> 0) samples the arg-max
  greedy = fm.generate(start, max_new_tokens=2, temperature=1e-4).numpy()
  logits, _ = fm(start)
  np.testing.assert_array_equal(greedy[:, 13], logits[:, -1, :].argmax(-1).numpy())


def test_mnist_and_vae_style_pieces_match_torch(rng):
  """The MNIST example's convnet (conv, max_pool2d, dropout in eval, log_softmax + nll_loss, StepLR) and the VAE
  example's loss (binary_cross_entropy with reduction='sum' plus the KL term), written once for both."""
  def net(t):
    class Net(t.nn.Module):
      def __init__(self):
        super().__init__()
        self.conv1 = t.nn.Conv2d(1, 4, 3, 1)
        self.dropout1 = t.nn.Dropout(0.25)
        self.fc1 = t.nn.Linear(4 * 5 * 5, 10)
      def forward(self, x):
        x = t.nn.functional.relu(self.conv1(x))
        x = t.nn.functional.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = t.flatten(x, 1)
        return t.nn.functional.log_softmax(self.fc1(x), dim=1)
    return Net()
  tn, fnet = net(torch), net(fg)
  fnet.load_state_dict({k: fg.tensor(v.detach().numpy()) for k, v in tn.state_dict().items()})
  tn.eval(); fnet.eval()
  x, y = rng.standard_normal((4, 1, 12, 12)).astype(np.float32), rng.integers(0, 10, 4)
  tl = torch.nn.functional.nll_loss(tn(torch.tensor(x)), torch.tensor(y))
  fl = F.nll_loss(fnet(fg.tensor(x)), fg.tensor(y))
  np.testing.assert_allclose(fl.item(), tl.item(), rtol=1e-5)
  tsch = torch.optim.lr_scheduler.StepLR(torch.optim.SGD(tn.parameters(), lr=1.0), step_size=1, gamma=0.7)
  fsch = fg.optim.lr_scheduler.StepLR(fg.optim.SGD(fnet.parameters(), lr=1.0), step_size=1, gamma=0.7)
  for _ in range(3): tsch.optimizer.step(); tsch.step(); fsch.optimizer.step(); fsch.step()
  np.testing.assert_allclose(fsch.get_last_lr(), tsch.get_last_lr())

  def vae_loss(t, recon_x, x, mu, logvar):
    bce = t.nn.functional.binary_cross_entropy(recon_x, x.view(-1, 16), reduction="sum")
    kld = -0.5 * t.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld
  r, xx = rng.uniform(0.05, 0.95, (3, 16)).astype(np.float32), rng.uniform(0, 1, (3, 4, 4)).astype(np.float32)
  mu, lv = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
  want = vae_loss(torch, *map(torch.tensor, (r, xx, mu, lv))).item()
  got = vae_loss(fg, *map(fg.tensor, (r, xx, mu, lv))).item()
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # the reparameterization trick: randn_like of the std's shape
  std = fg.tensor(lv).mul(0.5).exp()
  assert fg.randn_like(std).shape == (3, 2)


def test_torch_semantics_of_a_survey_of_tensor_state(tmp_path):
  """A survey against torch found these: dtype=float is float64; a list of numpy scalars or arrays keeps their
  dtype; arange over 0-d tensors; to(copy=True) copies; a one-element tensor formats as its value; t == None is False;
  half-precision rand never gives 1.0; a safetensors file whose header length is 128 mod 256 loads (its first byte is
  the one a pickle starts with)."""
  import numpy as np
  x = fg.tensor([1.0, 2.0, 3.0])
  assert x.to(float).dtype == fg.float64 and fg.zeros(2, dtype=float).dtype == fg.float64
  assert fg.tensor([0.1], dtype=float).numpy()[0] == 0.1
  for data, want in (([np.float64(1.0), np.float64(2.0)], "float64"), ([np.int32(1)], "int32"),
                     ([np.float16(1)], "float16"), ([np.array([1.0])], "float64"), ([1.0, np.float64(2)], "float64"),
                     ([1, np.int8(2)], "int64"), ([1.5, 2.5], "float32"), ([1, 2], "int64")):
    assert fg.tensor(data).dtype.name == want == str(torch.tensor(data).dtype)[6:], data
  assert fg.arange(fg.tensor(5)).dtype == fg.int64 and fg.arange(0, fg.tensor(3)).numpy().tolist() == [0, 1, 2]
  y = x.to(fg.float32, copy=True)
  y.add_(10)
  assert x.numpy().tolist() == [1.0, 2.0, 3.0]
  loss = fg.tensor(0.123456)
  assert f"{loss:.4f}" == f"{torch.tensor(0.123456):.4f}" == "0.1235"
  assert f"{fg.tensor(7):03d}" == "007"
  assert (x == None) is False and x.clone(memory_format=None).numpy().tolist() == [1.0, 2.0, 3.0]   # noqa: E711
  fg.manual_seed(0)
  for d in ("float16", "bfloat16"):
    u = fg.rand(1 << 18, dtype=d).float().numpy()
    assert u.max() < 1.0 and u.min() >= 0.0 and abs(u.mean() - 0.5) < 0.01
  for n in range(1, 300):   # names of every length mod 256: one makes a header of 128 + 256k bytes
    path = tmp_path / f"s{n}.safetensors"
    fg.save({"w" * n: fg.ones(2)}, str(path))
    if path.read_bytes()[:1] == b"\x80":
      assert fg.load(str(path))["w" * n].numpy().tolist() == [1.0, 1.0]
      break
  else:
    raise AssertionError("no header length of 128 mod 256 among the names tried")
