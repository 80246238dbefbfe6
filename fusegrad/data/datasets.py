"""Small datasets shipped with fusegrad.

digits.csv.gz is scikit-learn's copy (BSD-3-Clause) of the UCI Optical Recognition of Handwritten Digits test set
(E. Alpaydin, C. Kaynak, 1998).
"""
from __future__ import annotations
import functools
import gzip
from pathlib import Path
import numpy as np

__all__ = ["load_digits"]

_DIGITS = Path(__file__).with_name("digits.csv.gz")


@functools.lru_cache(maxsize=1)
def _digits_table() -> np.ndarray:
  with gzip.open(_DIGITS, "rt") as f: table = np.loadtxt(f, delimiter=",", dtype=np.int64)
  if table.shape != (1797, 65): raise RuntimeError(f"{_DIGITS}: expected a 1797 x 65 table, got {table.shape}")
  table.setflags(write=False)
  return table


def load_digits(split: str | None = None, seed: int = 0, test_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
  """scikit-learn's 8x8 handwritten digits as numpy arrays `(images, labels)`.

  images: float32 [n, 8, 8] with the raw pixel counts 0..16 (as sklearn returns them; divide by 16 for [0, 1]);
  labels: int64 [n] in 0..9. `split=None` gives all 1797 samples in file order. `split='train'` / `'test'`
  give a fixed held-out split: a permutation of range(1797) from `numpy.random.default_rng(seed)`, whose first
  `round(test_fraction * 1797)` entries (359 by default) are the test set and the rest the training set;
  each split is returned in file order. The same (seed, test_fraction) always gives the same split, and the
  two splits are disjoint and cover every sample.
  """
  if split not in (None, "train", "test"): raise ValueError(f"split must be None, 'train' or 'test', got {split!r}")
  if not 0 < test_fraction < 1: raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
  table = _digits_table()
  if split is not None:
    n = table.shape[0]
    perm = np.random.default_rng(seed).permutation(n)
    n_test = round(test_fraction * n)
    if not 0 < n_test < n: raise ValueError(f"test_fraction={test_fraction} leaves an empty split of {n} samples")
    table = table[np.sort(perm[:n_test] if split == "test" else perm[n_test:])]
  return table[:, :64].astype(np.float32).reshape(-1, 8, 8), table[:, 64].copy()
