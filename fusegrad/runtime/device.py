"""Devices are plug-ins: an allocator, a renderer, a compiler and a launcher behind one interface.

The registry maps a device name to the module that implements it; the module is imported the
first time the device is used, so nothing above the runtime imports a backend.

Devices are shared by every thread: the registry, the program caches and the buffer pool are locked
(briefly: compiling and launching run outside the locks), and each backend makes its launch safe to call
from several threads (the CPU launcher gives each call its own job; OPENCL locks a kernel's arguments).
"""
from __future__ import annotations
import importlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
import numpy as np
from fusegrad import dtype as dt, config as _config

BACKENDS = {"CPU": "fusegrad.runtime.cpu", "OPENCL": "fusegrad.runtime.opencl", "PYTHON": "fusegrad.runtime.python"}
_devices: dict = {}
_devices_lock = threading.Lock()


def _max_programs() -> int:
  from fusegrad import config
  return config.MAX_PROGRAMS


class CompileError(RuntimeError):
  """A kernel failed to compile; the message carries the source and the compiler's words."""


def clip_log(text: str, max_lines: int = 40, max_chars: int = 4096) -> str:
  """A compiler's output cut to a readable size (its first lines; what caused the rest comes first), with a note
  of how much was cut."""
  text = text.strip()
  lines = text.splitlines()
  kept = "\n".join(lines[:max_lines])[:max_chars]
  if len(kept) == len(text): return text
  cut_lines = len(lines) - len(kept.splitlines())
  return kept + f"\n[... {len(text) - len(kept)} more characters ({cut_lines} more lines) cut]"


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
    with _devices_lock:   # one device per name: two threads' first uses must not make two
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
    h = self._handle
    if h is None:   # allocated on first use; two threads' first uses must agree on one allocation
      h = self.device.reuse_or_alloc(self.nbytes)
      with self.device.pool_lock:
        if self._handle is None: self._handle = h
        else: self.device.release(h, self.nbytes); h = self._handle
    return h

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


class Mem(np.ndarray):
  """Host memory that also knows its address (`addr`): the CPU device's allocations and argument blocks, whose
  addresses every launch hands the native launcher (numpy's `.ctypes.data` costs about 2 us, a few per kernel)."""
  __slots__ = ("addr",)


def param_blocks(kernels: list) -> list:
  """One block of 8-byte slots per (Param dtypes, values) of kernels (a float's as float64, an integer's as int64
  bits), carved from one allocation: what the C entry points and the interpreter read."""
  sizes = [max(len(d), 1) for d, _ in kernels]
  blk = np.empty(sum(sizes), dtype=np.int64)
  f = blk.view(np.float64)
  i = 0
  for dtypes, values in kernels:
    for d, v in zip(dtypes, values):
      if d.is_float: f[i] = v
      else: blk[i] = v if v < (1 << 63) else v - (1 << 64)   # a uint64's bits
      i += 1
    if not dtypes: i += 1
  base, mem = blk.ctypes.data, blk.view(Mem)
  out, at = [], 0
  for n in sizes:
    m = mem[at:at + n]
    m.addr = base + 8 * at
    out.append(m)
    at += n
  return out


def param_block(dtypes: tuple, values: list) -> np.ndarray: return param_blocks([(dtypes, values)])[0]


class Slot(int):
  """A launch argument that each run of a prepared batch takes from its handles (by this place among them)."""


class Batches:
  """Launches made ready to run again and again (a checked trace's plan, a fusegrad.jit capture): each run of
  consecutive launches on one device becomes one prepared batch (Device.prepare_batch); an argument given as a Slot
  is patched in from run_prepared's handles."""

  def __init__(self):
    self.runs: list = []
    self._dev, self._launches, self._patches = None, [], []

  def add(self, dev, program, kernel, args: list) -> None:
    if dev is not self._dev: self._close()
    self._dev = dev
    handles = []
    for a, x in enumerate(args):
      if type(x) is Slot:
        self._patches.append((len(self._launches), a, int(x)))
        x = None
      handles.append(x)
    self._launches.append((program, kernel, handles))

  def _close(self) -> None:
    if self._launches: self.runs.append((self._dev, self._dev.prepare_batch(self._launches, self._patches)))
    self._dev, self._launches, self._patches = None, [], []

  def end(self) -> list:
    """The runs made since the last end, [(device, prepared batch)], the one in progress closed."""
    self._close()
    runs, self.runs = self.runs, []
    return runs


@dataclass(frozen=True)
class Compiled:
  """A canonical kernel made ready for a device: its program, its source (or listing text), the optimized
  kernel that is launched (its global_size, local_size and cost) and the optimizer's actions."""
  program: object
  source: str
  kernel: object
  opts: tuple


@dataclass
class Device:
  """What a backend provides. Subclasses fill in the methods; `renderer` may be None (PYTHON)."""
  name: str
  renderer: object = None
  supported: frozenset = frozenset(dt.ALL)
  # source -> compiled program, least recently used first; at most max_programs (a CPU program is a loaded
  # shared library: ~5 mappings and ~33 KB each, and a process has ~65k mappings). An evicted program is freed
  # (a library unloaded) when nothing else holds it any more: a capture of fusegrad.jit may still run it.
  programs: OrderedDict = field(default_factory=OrderedDict)
  max_programs: int = field(default_factory=lambda: _max_programs())
  # id(Kernel) -> (Kernel, Compiled without its program, the beam width it was made under): a rendered kernel's
  # program is looked up in `programs` by its source, so only `programs` decides which compiled programs stay
  by_kernel: OrderedDict = field(default_factory=OrderedDict)
  cache_lock: object = field(default_factory=threading.Lock)   # programs and by_kernel
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
  def prepare_batch(self, launches: list, patches) -> object:
    """launches ([(program, kernel, handles)]) made ready to run again and again (a checked trace's replays):
    patches are (launch, argument, k): that argument is handles[k] of each run_prepared (None stands for it)."""
    return (launches, tuple(patches))
  def run_prepared(self, batch, handles) -> None:
    launches, patches = batch
    launches = [(p, k, list(h)) for p, k, h in launches]
    for i, j, k in patches: launches[i][2][j] = handles[k]
    self.launch_batch(launches)
  def synchronize(self) -> None: pass

  def param_handles(self, kernel, values: list) -> list:
    """What follows a kernel's buffer handles at launch to bind its Params (codegen/ir.Param) to `values`: here
    one block of 8-byte slots (a float's as float64, an integer's as int64 bits), which the C entry point and
    the interpreter read; a device with scalar kernel arguments passes them one by one instead."""
    return [param_block(kernel.params, values)]

  @property
  def block_params(self) -> bool:
    """Does this device take its Params as param_handles' one block? (a replay then makes the blocks of all its
    kernels from one allocation: param_blocks)"""
    return type(self).param_handles is Device.param_handles

  def current(self, c: "Compiled") -> bool:
    """Is c (from `compiled`) still the program this device keeps for its source? A replay keeps the Compiled it
    launched and uses it while it is (touching it keeps the LRU's order), not asking `compiled` every launch."""
    if self.renderer is None: return False
    with self.cache_lock:
      if self.programs.get(c.source) is not c.program: return False
      self.programs.move_to_end(c.source)
      return True

  @property
  def caps(self):
    """What the optimizer may use on this device (codegen/renderer/base.Caps)."""
    return self.renderer.caps

  def compiled(self, kernel) -> "Compiled":
    """A canonical Kernel optimized by the device's heuristic (or, with FUSEGRAD_BEAM / fusegrad.beam(n), by the
    actions a search found: codegen/opt/search.py), linearized, rendered and compiled once (codegen/pipeline.py).
    Compiled programs are also shared by source, so equal kernels from different graphs compile once. Safe from
    several threads: two that compile one source at once both succeed, the first is kept."""
    width = _config.BEAM
    with self.cache_lock:
      hit = self.by_kernel.get(id(kernel))
      # an entry made under another beam width is made again (fusegrad.beam switches it for a block)
      if hit is not None and hit[0] is kernel and hit[2] == width:
        self.by_kernel.move_to_end(id(kernel))
        c = hit[1]
      else: c = None
    if c is None:
      opts = None
      if width > 0:
        from fusegrad.codegen.opt.search import searched_opts
        opts = searched_opts(kernel, self, width)
      c = self._prepare(kernel, opts)
      with self.cache_lock: self._remember(kernel, c, width)
    return self._with_program(c)

  def compile_with(self, kernel, opts, caps=None) -> "Compiled":
    """A canonical Kernel with the given actions (not the heuristic's) made ready: for tests and the search.
    Programs are shared by source with everything else; the kernel's own entry is left alone. caps: what the actions
    are checked against, default the device's own (a test compiles another machine's or compiler's choice)."""
    return self._with_program(self._prepare(kernel, tuple(opts), caps))

  def _prepare(self, kernel, opts, caps=None) -> "Compiled":
    """Optimized and rendered (an interpreter's listing is its program already)."""
    from fusegrad.codegen.pipeline import prepare
    from fusegrad.codegen.linearize import format_listing
    from fusegrad.codegen.renderer.base import check_spellable
    p = prepare(kernel, caps or self.caps, opts)
    if self.renderer is None:
      return Compiled(self.compile_listing(p.kernel, p.listing), format_listing(p.listing), p.kernel, p.opts)
    check_spellable(self.renderer, p.listing)
    return Compiled(None, self.renderer.render(p.kernel, p.listing), p.kernel, p.opts)

  def _with_program(self, c: "Compiled") -> "Compiled":
    """c with its program: from `programs` by source, else compiled and kept there (least recently used out)."""
    if c.program is not None: return c
    with self.cache_lock: program = self._cached_program(c.source)
    if program is None:
      program = self.compile(c.kernel.name, c.source)
      with self.cache_lock:
        program = self.programs.setdefault(c.source, program)
        self.programs.move_to_end(c.source)
        while len(self.programs) > max(self.max_programs, 1): self.programs.popitem(last=False)
    return Compiled(program, c.source, c.kernel, c.opts)

  def kernel_program(self, kernel) -> tuple:
    """(program, source or listing text) of a canonical Kernel (see compiled)."""
    c = self.compiled(kernel)
    return c.program, c.source

  def _cached_program(self, src: str):
    program = self.programs.get(src)
    if program is not None: self.programs.move_to_end(src)
    return program

  def _remember(self, kernel, c: "Compiled", width: int = 0) -> None:
    # a rendered kernel's entry holds no program (only `programs` decides which compiled programs stay loaded);
    # an interpreter's listing is kept with it; `width`: the beam width its actions were chosen under
    self.by_kernel[id(kernel)] = (kernel, c, width)
    self.by_kernel.move_to_end(id(kernel))
    while len(self.by_kernel) > max(self.max_programs, 1) * 2: self.by_kernel.popitem(last=False)

  def compile_listing(self, kernel, listing): raise NotImplementedError
