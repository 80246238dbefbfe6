"""The operator test matrix's table format: one OpCase per op form, written once for both libraries.

`fn(L, *inputs)` is called with L = fusegrad and with L = torch (and their tensors), so one lambda states the
op for both; the runner (tests/ops/test_matrix.py) draws fresh random inputs for every shape variant and dtype,
compares values, shapes and dtypes with PyTorch, and the gradients of the float inputs. Tables live in
tests/ops/table_*.py, each a module-level `CASES: list[OpCase]`.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class OpCase:
  name: str                      # unique id, e.g. "roll_dims"
  fn: Callable                   # fn(L, *inputs) with L = fusegrad or torch
  shapes: tuple                  # variants; each a tuple of input shapes: (((3, 4),), ((),), ((0, 4),))
  dtypes: tuple = ("float32",)   # dtype names to test
  grad: bool = True              # also compare the gradients of the float inputs (of a random-weighted sum)
  low: float = -2.0              # inputs are drawn uniformly from [low, high) (ints: integers in that range)
  high: float = 2.0
  gen: Callable | None = None    # gen(rng, shape, dtype_name) -> np.ndarray, replacing the uniform draw
  rtol: float | None = None      # None: the dtype's default tolerance
  atol: float | None = None
  fast: bool = False             # in the fast subset that `make test` runs (the rest is marked slow)
