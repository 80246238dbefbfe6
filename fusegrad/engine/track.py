"""Observability: what each launched kernel was, how long it ran, how fast.

`with fusegrad.track() as t:` records every kernel launched inside the block in `t.kernels`;
FUSEGRAD_DEBUG=1 prints each launch, FUSEGRAD_DEBUG=2 adds its source.
A tracker sees the kernels its own thread launches (another thread's realize is not part of its block).
"""
from __future__ import annotations
import contextlib
import threading
from dataclasses import dataclass, field
from fusegrad import config


@dataclass
class KernelRecord:
  name: str
  device: str
  source: str
  global_size: tuple
  local_size: tuple | None
  time_s: float
  flops: int
  bytes: int
  opts: tuple = ()     # the optimizer's actions applied to the kernel (codegen/opt.Opt records)

  @property
  def gflops(self) -> float: return self.flops / self.time_s / 1e9 if self.time_s > 0 else 0.0
  @property
  def gbps(self) -> float: return self.bytes / self.time_s / 1e9 if self.time_s > 0 else 0.0


@dataclass
class Tracker:
  kernels: list = field(default_factory=list)
  copies: int = 0


_local = threading.local()


def _active() -> list[Tracker]:
  a = getattr(_local, "active", None)
  if a is None: a = _local.active = []
  return a


@contextlib.contextmanager
def track():
  t = Tracker()
  active = _active()
  active.append(t)
  try:
    yield t
  finally:
    active.remove(t)


def wants_timing() -> bool: return bool(getattr(_local, "active", None)) or config.DEBUG >= 1


def record(rec: KernelRecord) -> None:
  for t in _active(): t.kernels.append(rec)
  if config.DEBUG >= 1:
    print(f"fusegrad: {rec.device:7s} {rec.name:32s} gsize {str(rec.global_size):>12s} {rec.time_s*1e6:10.1f} us "
          f"{rec.gflops:8.2f} GFLOP/s {rec.gbps:8.2f} GB/s")
    if config.DEBUG >= 2 and rec.source: print(rec.source)


def record_copy() -> None:
  for t in _active(): t.copies += 1
