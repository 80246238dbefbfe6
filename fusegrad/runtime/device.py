"""Devices are plug-ins: an allocator, a renderer, a compiler and a launcher behind one interface.

The registry maps a device name to the module that implements it; the module is imported the
first time the device is used, so nothing above the runtime imports a backend.
"""
from __future__ import annotations
import importlib
import threading
from dataclasses import dataclass, field
import numpy as np
from fusegrad import dtype as dt

BACKENDS = {"CPU": "fusegrad.runtime.cpu", "OPENCL": "fusegrad.runtime.opencl", "PYTHON": "fusegrad.runtime.python"}
_devices: dict = {}


class CompileError(RuntimeError):
  """A kernel failed to compile; the message carries the source and the compiler's words."""


def canonical(name) -> str:
  if name is None:
    from fusegrad import config
    name = config.DEVICE
  if isinstance(name, Device): return name.name
  s = str(name).upper()   # fusegrad.device objects and torch-style names ("cpu", "cuda:0") read as their string
  base = s.split(":")[0]
  if base not in BACKENDS:
    if base in _ELSEWHERE:
      raise RuntimeError(f"{_ELSEWHERE[base]} is not available: fusegrad has no {base} device (asked for {str(name)!r}); "
                         f"fusegrad's devices are {', '.join(BACKENDS)} (fusegrad.device('cpu') is CPU)")
    raise RuntimeError(f"unknown device {name!r}; known devices: {', '.join(BACKENDS)}")
  return base


# PyTorch's device types that fusegrad does not (yet) have: a clear "not available" where one is asked for
_ELSEWHERE = {"CUDA": "CUDA", "MPS": "MPS (Apple Metal)", "XPU": "XPU", "HIP": "HIP", "XLA": "XLA", "META": "the meta device",
              "MTIA": "MTIA", "HPU": "HPU", "IPU": "IPU", "VULKAN": "Vulkan"}


def get(name) -> "Device":
  name = canonical(name)
  d = _devices.get(name)
  if d is None:
    mod = importlib.import_module(BACKENDS[name])
    d = _devices[name] = mod.create()
  return d


class Buffer:
  """Device memory for `size` elements of `dtype`; allocated on first use."""
  __slots__ = ("device", "size", "dtype", "_handle", "__weakref__")

  def __init__(self, device: "Device", size: int, dtype: dt.DType):
    self.device, self.size, self.dtype, self._handle = device, size, dtype, None

  def __del__(self):
    if self._handle is not None:
      try:
        self.device.release(self._handle, self.nbytes)
      except Exception:   # interpreter shutdown: nothing left to reuse it
        pass

  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  @property
  def handle(self):
    if self._handle is None: self._handle = self.device.reuse_or_alloc(self.nbytes)
    return self._handle

  def copyin(self, arr: np.ndarray) -> "Buffer":
    arr = np.ascontiguousarray(arr).reshape(-1)
    if arr.size != self.size: raise ValueError(f"copyin of {arr.size} elements into a buffer of {self.size}")
    self.device.copyin(self.handle, arr.view(np.uint8) if arr.size else arr)
    return self

  def numpy(self) -> np.ndarray:
    out = np.empty(self.size, dtype=self.dtype.np)
    if self.size: self.device.copyout(out.view(np.uint8), self.handle)
    return out


class ExternalBuffer(Buffer):
  """A Buffer over memory that something else owns (the numpy array of `fusegrad.from_numpy`). It is never given
  to the device's reuse pool: a freed handle there would let a later kernel write into the owner's memory."""
  __slots__ = ("owner",)

  def __init__(self, device: "Device", size: int, dtype: dt.DType, handle, owner):
    super().__init__(device, size, dtype)
    self._handle, self.owner = handle, owner

  def __del__(self): pass


@dataclass
class Device:
  """What a backend provides. Subclasses fill in the methods; `renderer` may be None (PYTHON)."""
  name: str
  renderer: object = None
  supported: frozenset = frozenset(dt.ALL)
  programs: dict = field(default_factory=dict)   # source -> compiled program (in-memory cache)
  by_kernel: dict = field(default_factory=dict)  # id(Kernel) -> (Kernel, program, source)
  # freed allocations kept for reuse, by size: fresh memory costs page faults (CPU) or driver calls
  free_lists: dict = field(default_factory=dict)
  free_bytes: int = 0
  max_free_bytes: int = 1 << 30

  # buffers are made and freed on any thread (a data loader's prefetch thread; __del__ runs where the last
  # reference drops): the pool is locked, re-entrantly since a collection inside it may free a buffer
  pool_lock: object = field(default_factory=threading.RLock)

  def reuse_or_alloc(self, nbytes: int):
    with self.pool_lock:
      lst = self.free_lists.get(nbytes)
      if lst:
        self.free_bytes -= nbytes
        return lst.pop()
    return self.alloc(nbytes)

  def release(self, handle, nbytes: int) -> None:
    with self.pool_lock:
      if self.free_bytes + nbytes > self.max_free_bytes: return   # dropped: the allocator frees it
      self.free_lists.setdefault(nbytes, []).append(handle)
      self.free_bytes += nbytes

  def alloc(self, nbytes: int): raise NotImplementedError
  def copyin(self, handle, src: np.ndarray) -> None: raise NotImplementedError
  def copyout(self, dst: np.ndarray, handle) -> None: raise NotImplementedError
  def compile(self, name: str, source: str): raise NotImplementedError
  def launch(self, program, kernel, handles: list) -> None: raise NotImplementedError
  def launch_batch(self, launches: list) -> None:
    """Run [(program, kernel, handles), ...] in order (a replayed step); a device may do it in one call."""
    for program, kernel, handles in launches: self.launch(program, kernel, handles)
  def synchronize(self) -> None: pass

  def kernel_program(self, kernel):
    """(program, source or listing text) for a Kernel object: linearized, rendered and compiled once.
    Compiled programs are also shared by source, so equal kernels from different graphs compile once."""
    hit = self.by_kernel.get(id(kernel))
    if hit is None or hit[0] is not kernel:
      from fusegrad.codegen.linearize import linearize, format_listing
      listing = linearize(kernel)
      if self.renderer is None:   # an interpreter runs the listing itself
        program, src = self.compile_listing(kernel, listing), format_listing(listing)
      else:
        src = self.renderer.render(kernel, listing)
        program = self.programs.get(src)
        if program is None: program = self.programs[src] = self.compile(kernel.name, src)
      hit = self.by_kernel[id(kernel)] = (kernel, program, src)
      if len(self.by_kernel) > 4096: self.by_kernel.pop(next(iter(self.by_kernel)))
    return hit[1], hit[2]

  def compile_listing(self, kernel, listing): raise NotImplementedError
