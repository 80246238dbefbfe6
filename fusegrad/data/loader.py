"""Datasets and a batching loader with PyTorch's names.

Arrays keep their numpy dtype when they become Tensors (as `torch.from_numpy` does): int64 labels stay
fusegrad.int64, float64 stays float64; pass float32 arrays for float32 batches. Python numbers collate like
`fusegrad.tensor` builds them (bool -> bool, int -> int64, float -> float32, where torch's default_collate
would give float64).

Threads: with `prefetch=True` a daemon thread makes the next batches (indexing, `Dataset.__getitem__`,
`collate_fn`, the device buffers and the copy into them) while the caller's step runs. fusegrad's engine is
not thread-safe, so that thread never realizes a lazy graph: fusegrad Tensors that a dataset or collate_fn
return, and gathers from a TensorDataset of Tensors, are realized on the consumer's thread as a batch is
handed out.
"""
from __future__ import annotations
import abc
import bisect
import math
import queue
import threading
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Sequence
import numpy as np
from fusegrad import dtype as dt
from fusegrad.tensor import Tensor, stack, tensor
from fusegrad.runtime import device as rd
from fusegrad.graph import node as gn
from fusegrad.engine.realize import realize

__all__ = ["Dataset", "IterableDataset", "ChainDataset", "TensorDataset", "Subset", "ConcatDataset", "random_split",
           "Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler",
           "BatchSampler", "DataLoader", "default_collate"]


class Dataset(metaclass=abc.ABCMeta):
  """A map-style dataset: `len(ds)` samples, `ds[i]` for i in range(len(ds)). Subclass it (as in PyTorch: `ds1 + ds2`
  is a ConcatDataset) or duck-type it: any object with `__len__` and `__getitem__` is an instance."""
  def __getitem__(self, index) -> Any: raise NotImplementedError(f"{type(self).__name__} must define __getitem__")
  def __add__(self, other: "Dataset") -> "ConcatDataset": return ConcatDataset([self, other])

  @classmethod
  def __subclasshook__(cls, C):
    if cls is Dataset and all(any(m in B.__dict__ for B in C.__mro__) for m in ("__len__", "__getitem__")): return True
    return NotImplemented


class IterableDataset(Dataset):
  """A dataset read by iterating it (`__iter__`), in order: the DataLoader batches what it yields; shuffle and
  samplers do not apply, as in PyTorch."""
  def __iter__(self): raise NotImplementedError(f"{type(self).__name__} must define __iter__")
  def __add__(self, other): return ChainDataset([self, other])


class ChainDataset(IterableDataset):
  """Iterable datasets one after the other."""
  def __init__(self, datasets): self.datasets = list(datasets)
  def __iter__(self):
    for d in self.datasets: yield from d


class TensorDataset(Dataset):
  """Samples are the i-th rows of numpy arrays or fusegrad Tensors of one length: `ds[i] == (a[i], b[i], ...)`."""

  def __init__(self, *arrays):
    if not arrays: raise ValueError("TensorDataset needs at least one array or tensor")
    for k, a in enumerate(arrays):
      if not isinstance(a, (np.ndarray, Tensor)):
        raise TypeError(f"TensorDataset: argument {k} is a {type(a).__name__}, expected a numpy array or a fusegrad "
                        f"Tensor")
      if a.ndim == 0:
        raise ValueError(f"TensorDataset: argument {k} is 0-d; every array needs a first (sample) dimension")
    lens = [a.shape[0] for a in arrays]
    if len(set(lens)) != 1:
      raise ValueError(f"TensorDataset: all arrays must have the same length in the first dimension, got "
                       f"{', '.join(map(str, lens))}")
    self.arrays = arrays   # as given; `tensors` is torch's name for it
    self.tensors = arrays

  def __len__(self) -> int: return self.arrays[0].shape[0]
  def __getitem__(self, index) -> tuple: return tuple(a[index] for a in self.arrays)


class Subset(Dataset):
  """The samples of `dataset` at `indices`, in that order."""
  def __init__(self, dataset, indices: Sequence[int]):
    self.dataset, self.indices = dataset, indices
  def __getitem__(self, idx):
    if isinstance(idx, (list, tuple, np.ndarray)): return [self.dataset[self.indices[int(i)]] for i in idx]
    return self.dataset[self.indices[idx]]
  def __len__(self) -> int: return len(self.indices)


class ConcatDataset(Dataset):
  """Map-style datasets one after the other: sample i of the whole is sample i - offset of the one it falls in."""
  def __init__(self, datasets: Iterable):
    self.datasets = list(datasets)
    if not self.datasets: raise ValueError("datasets should not be an empty iterable")
    for d in self.datasets:
      if isinstance(d, IterableDataset): raise TypeError("ConcatDataset does not support IterableDataset")
    self.cumulative_sizes = list(np.cumsum([len(d) for d in self.datasets]).tolist())
  def __len__(self) -> int: return self.cumulative_sizes[-1]
  def __getitem__(self, idx: int):
    if idx < 0:
      if -idx > len(self): raise ValueError("absolute value of index should not exceed dataset length")
      idx += len(self)
    if idx >= len(self): raise IndexError(f"index {idx} is out of range for a ConcatDataset of {len(self)} samples")
    k = bisect.bisect_right(self.cumulative_sizes, idx)
    return self.datasets[k][idx - (self.cumulative_sizes[k - 1] if k else 0)]


def random_split(dataset, lengths: Sequence, generator=None) -> list:
  """Split into non-overlapping Subsets of the given lengths, or of fractions that sum to 1 (floored, the rest
  handed out one by one from the first, as PyTorch does), in an order drawn from `generator` (a
  fusegrad.Generator; default: fusegrad's global generator)."""
  n = len(dataset)
  lengths = list(lengths)
  if lengths and math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
    for i, frac in enumerate(lengths):
      if not 0 <= frac <= 1: raise ValueError(f"Fraction at index {i} is not between 0 and 1")
    counts = [int(math.floor(n * frac)) for frac in lengths]
    for i in range(n - sum(counts)): counts[i % len(counts)] += 1
    lengths = counts
  if any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0 for x in lengths):
    raise ValueError(f"random_split: lengths must be non-negative ints or fractions summing to 1, got {lengths}")
  if sum(lengths) != n:
    raise ValueError(f"Sum of input lengths ({sum(lengths)}) does not equal the length of the input dataset ({n})!")
  perm = np.random.default_rng(_seed_of(generator)).permutation(n).tolist()
  out, start = [], 0
  for k in lengths:
    out.append(Subset(dataset, perm[start:start + k]))
    start += k
  return out


# ---- collation --------------------------------------------------------------------------------------------

def default_collate(samples: list):
  """Stack a list of samples into a batch, as torch's default_collate does.

  numpy arrays -> one stacked array; fusegrad Tensors -> `fusegrad.stack`; Python numbers -> a 1-d array
  (bool, int64 or float32); numpy scalars -> an array of their dtype; strings -> a list; dicts, tuples and
  lists (namedtuples too) -> the same structure (tuples for lists) with each field collated.
  """
  if not samples: raise ValueError("default_collate: empty list of samples")
  e = samples[0]
  if isinstance(e, np.ndarray):
    shapes = {s.shape for s in samples if isinstance(s, np.ndarray)}
    arrays = all(isinstance(s, np.ndarray) for s in samples)
    if len(shapes) != 1 or not arrays:
      raise RuntimeError(f"default_collate: samples must be arrays of one shape to stack, got shapes {sorted(shapes)}"
                         + ("" if arrays else " and non-arrays"))
    return np.stack(samples)
  if isinstance(e, Tensor): return stack(list(samples))
  if isinstance(e, np.generic): return np.array(samples)
  if isinstance(e, (bool, int, float)):
    if not all(isinstance(s, (bool, int, float)) for s in samples):
      raise TypeError("default_collate: a batch mixes numbers with other types")
    if all(isinstance(s, bool) for s in samples): return np.array(samples, dtype=np.bool_)
    if all(isinstance(s, int) and not isinstance(s, bool) for s in samples): return np.array(samples, dtype=np.int64)
    return np.array(samples, dtype=np.float32)
  if isinstance(e, (str, bytes)): return list(samples)
  if isinstance(e, Mapping): return {k: default_collate([s[k] for s in samples]) for k in e}
  if isinstance(e, (tuple, list)):
    n = len(e)
    if any(len(s) != n for s in samples):
      raise RuntimeError("default_collate: each sample in a batch must have the same number of fields")
    fields = [default_collate([s[i] for s in samples]) for i in range(n)]
    return type(e)(*fields) if isinstance(e, tuple) and hasattr(e, "_fields") else tuple(fields)
  raise TypeError(f"default_collate: samples must be numpy arrays, fusegrad Tensors, numbers, strings, dicts, tuples "
                  f"or lists; found {type(e).__name__}")


# ---- host arrays -> device tensors ----------------------------------------------------------------------

def _device_tensor(arr: np.ndarray, device: str) -> Tensor:
  """A realized Tensor holding a copy of arr, with the numpy dtype kept (safe off the main thread: it
  runs no kernel, and the device's buffer pool is locked)."""
  d = dt.from_numpy(arr.dtype)
  dev = rd.get(device)
  if d not in dev.supported:
    raise RuntimeError(f"device {device} cannot hold dtype {d.name} (supported: "
                       f"{', '.join(sorted(x.name for x in dev.supported))})")
  buf = rd.Buffer(dev, arr.size, d)
  if arr.size: buf.copyin(arr.view(np.uint16) if d == dt.bfloat16 else arr)
  return Tensor(_node=gn.buffer_node(buf, d, arr.shape, device))


class _Gather:
  """Rows `idx` of a fusegrad Tensor, gathered on the consumer's thread (it builds and runs a kernel)."""
  __slots__ = ("t", "idx")
  def __init__(self, t: Tensor, idx): self.t, self.idx = t, idx


def _map(x, fn):
  if isinstance(x, dict): return {k: _map(v, fn) for k, v in x.items()}
  if isinstance(x, tuple) and hasattr(x, "_fields"): return type(x)(*[_map(v, fn) for v in x])
  if isinstance(x, (tuple, list)): return type(x)(_map(v, fn) for v in x)
  return fn(x)


def _leaves(x, out: list) -> list:
  if isinstance(x, dict):
    for v in x.values(): _leaves(v, out)
  elif isinstance(x, (tuple, list)):
    for v in x: _leaves(v, out)
  else: out.append(x)
  return out


def _to_device_host(batch, device: str):
  """Prefetch-thread half: numpy arrays become realized device Tensors; everything else passes."""
  return _map(batch, lambda x: _device_tensor(x, device) if isinstance(x, np.ndarray) else x)


def _to_device_consumer(batch, device: str):
  """Consumer-thread half: gathers run, Tensors move to `device`, and every lazy one is realized (one schedule)."""
  def fix(x):
    if isinstance(x, _Gather):
      idx = x.idx
      if isinstance(idx, slice): x = x.t[idx]
      else: x = x.t[tensor(np.asarray(idx, dtype=np.int64), device=x.t.device)]
    if isinstance(x, Tensor): x = x.detach().to(device)
    return x
  batch = _map(batch, fix)
  lazy = [t for t in _leaves(batch, []) if isinstance(t, Tensor) and not t.node.realized]
  if lazy: realize(*[t.node for t in lazy])
  return batch


# ---- the prefetch thread ----------------------------------------------------------------------------------

_END = object()


class _Raised:
  __slots__ = ("exc",)
  def __init__(self, exc: BaseException): self.exc = exc


def _produce(gen, q: queue.Queue, stop: threading.Event) -> None:
  # a plain function: the thread must not hold the iterator object, or dropping it could not stop the thread
  try:
    for item in gen:
      if stop.is_set(): return
      q.put(item)
      if stop.is_set(): return
    q.put(_END)
  except BaseException as e:   # handed to the consumer, re-raised there
    if not stop.is_set(): q.put(_Raised(e))
  finally:
    gen.close()


class _LoaderIter:
  """One epoch of a DataLoader. `close()` (or dropping it, or breaking out of a for loop) stops its thread."""

  def __init__(self, gen, device: str, prefetch: bool):
    self._device, self._gen, self._done = device, gen, False
    self._queue = self._stop = self._thread = None
    if prefetch:
      self._queue, self._stop = queue.Queue(maxsize=2), threading.Event()
      self._thread = threading.Thread(target=_produce, args=(gen, self._queue, self._stop), daemon=True,
                                       name="fusegrad-data-prefetch")
      self._gen = None
      self._thread.start()

  def __iter__(self): return self

  def __next__(self):
    if self._done: raise StopIteration
    if self._thread is None:
      try:
        item = next(self._gen)
      except BaseException:
        self.close()
        raise
    else:
      item = self._queue.get()
      if item is _END:
        self.close()
        raise StopIteration
      if isinstance(item, _Raised):
        self.close()
        raise item.exc
    return _to_device_consumer(item, self._device)

  def close(self) -> None:
    """Stop making batches; the prefetch thread ends after at most the batch it is working on."""
    if self._done: return
    self._done = True
    if self._thread is None:
      self._gen.close()
      return
    self._stop.set()
    try:   # free the queue's slots so a producer blocked in put() wakes up, sees the flag and returns
      while True: self._queue.get_nowait()
    except queue.Empty:
      pass
    if threading.current_thread() is not self._thread: self._thread.join(timeout=60)

  def __del__(self):
    try:
      if not self._done:
        self._done = True
        if self._thread is not None:   # no join from a finalizer: signal and unblock only
          self._stop.set()
          while True: self._queue.get_nowait()
    except Exception:
      pass


# ---- the loader -----------------------------------------------------------------------------------------

def _global_seed() -> int:
  """A seed drawn from fusegrad's global generator (`fusegrad.manual_seed`), advancing it by one draw."""
  from fusegrad.tensor import _RNG
  s = np.random.SeedSequence([_RNG.seed, _RNG.counter, 0x6461746100]).generate_state(2, np.uint64)
  _RNG.counter += 1
  return int(s[0])


def _seed_of(generator) -> int:
  """A numpy seed from a fusegrad.Generator (advancing it by one draw), or from the global generator for None."""
  from fusegrad.tensor import Generator
  if generator is None: return _global_seed()
  if not isinstance(generator, Generator):
    raise TypeError(f"generator must be a fusegrad.Generator, got {type(generator).__name__}")
  st = generator._state
  s = np.random.SeedSequence([st.seed, st.counter, 0x6461746100]).generate_state(2, np.uint64)
  st.counter += 1
  return int(s[0])


def _positive_int(v, what: str) -> int:
  if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
    raise ValueError(f"{what} should be a positive integer value, but got {what}={v!r}")
  return int(v)


# ---- samplers: which indices, in which order ---------------------------------------------------------------

class Sampler:
  """Yields dataset indices; `len()` of them. Subclass it with `__iter__` (and `__len__`)."""
  def __init__(self, data_source=None): pass
  def __iter__(self): raise NotImplementedError
  def __len__(self) -> int: raise TypeError(f"{type(self).__name__} has no len()")


class SequentialSampler(Sampler):
  def __init__(self, data_source): self.data_source = data_source
  def __iter__(self): return iter(range(len(self.data_source)))
  def __len__(self) -> int: return len(self.data_source)


class RandomSampler(Sampler):
  """A new permutation every epoch (or num_samples draws with replacement), from a numpy generator seeded by
  `generator` (a fusegrad.Generator; default: fusegrad's global generator) at each epoch's start."""
  def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None, generator=None):
    if not isinstance(replacement, bool):
      raise TypeError(f"replacement should be a boolean value, but got replacement={replacement}")
    self.data_source, self.replacement, self.generator = data_source, replacement, generator
    self._num_samples = num_samples
    if num_samples is not None: _positive_int(num_samples, "num_samples")
  @property
  def num_samples(self) -> int: return len(self.data_source) if self._num_samples is None else int(self._num_samples)
  def __iter__(self):
    # the seed is drawn here, on the caller's thread (a loader's prefetch thread then only reads the iterator)
    return self._draw(np.random.default_rng(_seed_of(self.generator)))
  def _draw(self, rng):
    # lazily, a chunk at a time: minGPT's trainer asks for num_samples=1e10 with replacement
    n, left = len(self.data_source), self.num_samples
    while left > 0 and n > 0:
      chunk = rng.integers(0, n, min(left, 1 << 16)) if self.replacement else rng.permutation(n)[:left]
      left -= len(chunk)
      yield from chunk.tolist()
  def __len__(self) -> int: return self.num_samples


class SubsetRandomSampler(Sampler):
  """The given indices in a new random order every epoch."""
  def __init__(self, indices: Sequence[int], generator=None): self.indices, self.generator = indices, generator
  def __iter__(self):
    perm = np.random.default_rng(_seed_of(self.generator)).permutation(len(self.indices))
    return iter([self.indices[i] for i in perm.tolist()])
  def __len__(self) -> int: return len(self.indices)


class WeightedRandomSampler(Sampler):
  """num_samples indices in [0, len(weights)) drawn with probability proportional to weights."""
  def __init__(self, weights, num_samples: int, replacement: bool = True, generator=None):
    _positive_int(num_samples, "num_samples")
    if not isinstance(replacement, bool):
      raise TypeError(f"replacement should be a boolean value, but got replacement={replacement}")
    w = np.asarray(weights.numpy() if isinstance(weights, Tensor) else weights, dtype=np.float64)
    if w.ndim != 1: raise ValueError(f"weights should be a 1d sequence but given weights have shape {tuple(w.shape)}")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
      raise RuntimeError("invalid multinomial distribution: weights must be finite, non-negative, with a positive sum")
    if not replacement and num_samples > np.count_nonzero(w):
      raise RuntimeError(f"cannot draw {num_samples} samples without replacement from {np.count_nonzero(w)} "
                         f"categories of non-zero weight")
    self.weights, self.num_samples, self.replacement, self.generator = w, int(num_samples), replacement, generator
  def __iter__(self): return self._draw(np.random.default_rng(_seed_of(self.generator)))   # seeded on this thread
  def _draw(self, rng):
    p = self.weights / self.weights.sum()
    if not self.replacement:
      yield from rng.choice(len(p), self.num_samples, False, p).tolist()
      return
    left = self.num_samples
    while left > 0:   # lazily, a chunk at a time, like RandomSampler
      m = min(left, 1 << 16)
      yield from rng.choice(len(p), m, True, p).tolist()
      left -= m
  def __len__(self) -> int: return self.num_samples


class BatchSampler(Sampler):
  """Lists of batch_size indices from `sampler` (the last one shorter unless drop_last)."""
  def __init__(self, sampler, batch_size: int, drop_last: bool):
    _positive_int(batch_size, "batch_size")
    if not isinstance(drop_last, bool):
      raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
    self.sampler, self.batch_size, self.drop_last = sampler, int(batch_size), drop_last
  def __iter__(self): return self._chunks(iter(self.sampler))   # the sampler starts (draws its seed) here
  def _chunks(self, ids):
    batch = []
    for i in ids:
      batch.append(int(i))
      if len(batch) == self.batch_size:
        yield batch
        batch = []
    if batch and not self.drop_last: yield batch
  def __len__(self) -> int:
    n = len(self.sampler)
    return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class DataLoader:
  """Batches of fusegrad Tensors from a dataset or from numpy arrays.

  `data` is a Dataset (anything with `__len__` and `__getitem__`), an IterableDataset (batches of what it
  yields, in order), one numpy array (batches are single Tensors) or a tuple/list of arrays or Tensors of one
  length (batches are tuples; a list of per-sample arrays is read as fields too, so wrap samples in a
  Dataset). Arrays and TensorDatasets are gathered with one fancy index per array per batch; other datasets are
  read sample by sample and collated by `collate_fn` (default: `default_collate`), which also forces the
  sample-by-sample path when given.

  shuffle: a new permutation each epoch from a `numpy.random.Generator` seeded with `seed` (or drawn from
  `generator`, a fusegrad.Generator); the same seed gives the same sequence of epochs. `seed=None` draws the
  seed from fusegrad's global generator when the loader is made, so `fusegrad.manual_seed(s)` before it makes
  the order reproducible.
  sampler / batch_sampler: the indices (or lists of them) to read, as in PyTorch, with its exclusivity rules.
  device: where batches go (default: fusegrad's default device, `FUSEGRAD_DEVICE`).
  prefetch: prepare the next 2 batches on a background thread (see the module docstring). PyTorch's worker
  arguments (num_workers, pin_memory, persistent_workers, prefetch_factor, timeout, worker_init_fn, ...) are
  accepted and ignored: this one thread is fusegrad's worker.
  """

  def __init__(self, data, batch_size: int | None = 1, shuffle: bool | None = False, drop_last: bool = False,
               seed: int | None = None, device=None, prefetch: bool = True, collate_fn: Callable | None = None, *,
               sampler=None, batch_sampler=None, generator=None, num_workers: int = 0, pin_memory: bool = False,
               timeout: float = 0, worker_init_fn=None, multiprocessing_context=None, prefetch_factor=None,
               persistent_workers: bool = False, pin_memory_device: str = "", in_order: bool = True):
    shuffle = bool(shuffle)
    if batch_sampler is not None:
      if batch_size != 1 or shuffle or sampler is not None or drop_last:
        raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
      batch_size = None
    elif isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
      raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size!r}")
    if sampler is not None and shuffle: raise ValueError("sampler option is mutually exclusive with shuffle")
    self.iterable = isinstance(data, IterableDataset)
    if self.iterable:
      for name, v in (("shuffle", shuffle), ("sampler", sampler), ("batch_sampler", batch_sampler)):
        if v is not None and v is not False: raise ValueError(f"DataLoader with IterableDataset: expected unspecified {name} option, but got "
                               f"{name}={v!r}")
    self.single = isinstance(data, (np.ndarray, Tensor))
    if self.single: data = TensorDataset(data)
    elif isinstance(data, (tuple, list)) and data and all(isinstance(a, (np.ndarray, Tensor)) for a in data):
      data = TensorDataset(*data)
    elif not self.iterable and not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
      raise TypeError(f"DataLoader needs a Dataset (with __len__ and __getitem__), an IterableDataset, a numpy array "
                      f"or a tuple of arrays; got {type(data).__name__}")
    if collate_fn is not None and not callable(collate_fn): raise TypeError("collate_fn must be callable")
    self.dataset, self.shuffle, self.drop_last = data, shuffle, bool(drop_last)
    self.batch_size = None if batch_size is None else int(batch_size)
    self.sampler, self.batch_sampler = sampler, batch_sampler
    self.collate_fn, self.prefetch = collate_fn, bool(prefetch)
    self.device = rd.canonical(device)
    rd.get(self.device)   # open the device here, not first on the prefetch thread
    self.seed = None if not self.shuffle else (int(seed) if seed is not None else _seed_of(generator))
    self._rng = np.random.default_rng(self.seed) if self.shuffle else None

  def __len__(self) -> int:
    if self.batch_sampler is not None: return len(self.batch_sampler)
    if self.iterable and not hasattr(self.dataset, "__len__"):
      raise TypeError(f"object of type {type(self).__name__} over an IterableDataset without __len__ has no len()")
    n = len(self.sampler) if self.sampler is not None else len(self.dataset)
    return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

  def _batch_indices(self):
    """The batches' indices: slices or int64 arrays (an iterator where a sampler gives them: it may be long)."""
    # samplers are started here, on the caller's thread: random ones draw their seed now, in program order
    if self.batch_sampler is not None: return (np.asarray(list(b), dtype=np.int64) for b in iter(self.batch_sampler))
    bs = self.batch_size
    if self.sampler is not None:
      return (np.asarray(b, dtype=np.int64) for b in iter(BatchSampler(self.sampler, bs, self.drop_last)))
    n = len(self.dataset)
    stop = n - n % bs if self.drop_last else n
    if self.shuffle:
      perm = self._rng.permutation(n)
      return [perm[i:i + bs] for i in range(0, stop, bs)]
    return [slice(i, min(i + bs, n)) for i in range(0, stop, bs)]

  def _batches(self, batches):
    ds, device = self.dataset, self.device
    # a TensorDataset (not a subclass with its own __getitem__) is gathered with one index per array
    fast = (isinstance(ds, TensorDataset) and type(ds).__getitem__ is TensorDataset.__getitem__
            and self.collate_fn is None)
    for idx in batches:
      if fast:
        fields = tuple(a[idx] if isinstance(a, np.ndarray) else _Gather(a, idx) for a in ds.arrays)
        batch = fields[0] if self.single else fields
      else:
        ids = range(idx.start, idx.stop) if isinstance(idx, slice) else idx.tolist()
        get = ds.arrays[0].__getitem__ if self.single else ds.__getitem__   # one array: samples are its rows
        batch = (self.collate_fn or default_collate)([get(i) for i in ids])
      yield _to_device_host(batch, device)

  def _iterable_batches(self):
    collate, bs, batch = self.collate_fn or default_collate, self.batch_size, []
    for sample in self.dataset:
      batch.append(sample)
      if len(batch) == bs:
        yield _to_device_host(collate(batch), self.device)
        batch = []
    if batch and not self.drop_last: yield _to_device_host(collate(batch), self.device)

  def __iter__(self) -> _LoaderIter:
    gen = self._iterable_batches() if self.iterable else self._batches(self._batch_indices())
    return _LoaderIter(gen, self.device, self.prefetch)
