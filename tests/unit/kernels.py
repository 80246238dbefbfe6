"""Canonical kernels of common shapes for the optimizer's tests, and running one with chosen actions."""
from __future__ import annotations
import numpy as np
import fusegrad as fg
from fusegrad.graph import dims
from fusegrad.runtime import device as rd
from fusegrad.schedule.schedule import create_schedule


def one_kernel(out: fg.Tensor):
  """The ScheduleItem of the one kernel computing out (its inputs already realized)."""
  items = [it for it in create_schedule([out.node]) if it.kind == "KERNEL"]
  assert len(items) == 1, f"expected one kernel, got {len(items)}"
  return items[0]


def run(item, opts, device: str = "PYTHON", caps=None) -> np.ndarray:
  """The kernel of item run with the given actions on device; its first output as numpy (at its logical shape: an
  output with a runtime size, graph/dims.BoundDim, is stored at its bound and read back through from_storage).
  caps: what the actions are checked against, default the device's (a tile chosen for gcc on AVX-512 compiles with
  clang, or on an AVX2 machine, under its own caps)."""
  dev = rd.get(device)
  c = dev.compile_with(item.kernel, opts, caps)
  outs = [rd.Buffer(dev, dims.storage_numel(o.shape), o.dtype) for o in item.outputs]
  handles = [b.handle for b in outs] + [i.buffer.handle for i in item.inputs]
  if item.kernel.params: handles += dev.param_handles(item.kernel, item.param_values())
  dev.launch(c.program, c.kernel, handles)
  return dims.from_storage(outs[0].numpy(), item.outputs[0].shape)


def make(name: str, rng: np.random.Generator, device: str = "PYTHON") -> fg.Tensor:
  """A lazy tensor whose final kernel has a known structure."""
  t = lambda *s: fg.Tensor(rng.standard_normal(s).astype(np.float32), device=device)
  if name == "matmul": return t(32, 24) @ t(24, 48)
  if name == "matmul_big": return t(64, 8) @ t(8, 64)
  if name == "matmul_gpu": return t(128, 16) @ t(16, 64)
  if name == "elementwise_big": return (t(64, 128) * 2 + 1) * t(64, 128)
  if name == "bmm": return t(2, 16, 12) @ t(2, 12, 32)
  if name == "sum_rows": return t(40, 64).sum(1)
  if name == "sum_cols": return t(64, 48).sum(0)
  if name == "sum_all": return t(8, 256).sum()
  if name == "softmax": return t(24, 40).softmax(-1)
  if name == "softmax_wide": return t(6, 256).softmax(-1)
  if name == "layernorm_wide": return fg.nn.functional.layer_norm(t(4, 128), (128,), t(128), t(128))
  if name == "layernorm": return fg.nn.functional.layer_norm(t(16, 32), (32,))
  if name == "elementwise": return (t(48, 32) * 2 + 1).exp().log() - t(48, 32).abs()
  if name == "max_rows": return t(32, 48).max(1)[0] if isinstance(t(1, 2).max(1), tuple) else t(32, 48).amax(1)
  if name == "conv": return fg.nn.functional.conv2d(t(2, 3, 10, 10), t(8, 3, 3, 3), padding=1)
  if name == "int_sum": return fg.Tensor(rng.integers(-50, 50, (16, 64)).astype(np.int32), device=device).sum(1)
  if name == "where_pad": return fg.nn.functional.pad(t(20, 30), (1, 2, 3, 0)).relu() * 2
  raise KeyError(name)


NAMES = ["matmul", "bmm", "sum_rows", "sum_cols", "sum_all", "softmax", "layernorm", "elementwise", "max_rows", "conv",
         "int_sum", "where_pad"]
