"""The CPU device: C rendered by codegen/renderer/cstyle.py, compiled by the system's C compiler
into a shared library, loaded with ctypes and run over all cores by the native launcher in
runtime/cpu_pool.c (pthreads; ctypes releases the GIL during the call).

Each compiled kernel is a shared library of its own, held by a CPUProgram: the library is unloaded
(dlclose) when the last program object referring to it goes, so the bounded program cache
(Device.programs) bounds the libraries loaded, while a capture (fusegrad.jit) that still holds an
evicted program keeps it loaded.
"""
from __future__ import annotations
import _ctypes
import atexit
import ctypes
import functools
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import replace
import numpy as np
from fusegrad import config
from fusegrad.runtime import cache
from fusegrad.runtime.device import Device, CompileError, Mem, clip_log
from fusegrad.codegen.renderer.cstyle import CRenderer

FLAGS = ["-O2", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fwrapv", "-std=gnu11"]
# gcc's -O2 vectorizes only loops its "very cheap" model accepts, which rejects most kernels' loops
# (they need an epilogue); clang's -O2 vectorizes them already.
# -fno-thread-jumps: gcc 12.2 with AVX-512 miscompiles a loop where jump threading has duplicated the paths of
# several selects on one condition and if-conversion then vectorizes them: `m ? 0 : p + (m ? p : 0)` with p loop
# invariant (a kernel argument) came out wrong for some lanes (binary_cross_entropy_with_logits' gradient;
# tests/test_params.py). Threading buys nothing in a kernel's straight-line body.
GCC_FLAGS = ["-ftree-vectorize", "-fvect-cost-model=dynamic", "-fno-thread-jumps"]
# below this much estimated work (Kernel.cost) a kernel runs on the calling thread: a hand-off costs more (the
# workers spin a while before they sleep, so in a stream of kernels it is a few us). 2-core Xeon, kernel times with
# 2^18 against 2^20: a + b over 2^17 floats 43 -> 28 us, exp(a) * tanh(b) over 2^15 49 -> 39 and 2^16 85 -> 57, 2^14
# and 2^15 adds alike (2^17 made a 2^15 add slower); the word LM's jitted step 56 -> 51 ms, the VAE's 2.39 -> 2.11
PARALLEL_MIN_WORK = 1 << 18
CHUNKS_PER_THREAD = 4
# a long kernel is cut into chunks of about this much work (a few milliseconds): the launcher returns to
# Python between chunks to let a KeyboardInterrupt in, and a cancelled kernel stops after the chunks running
CHUNK_WORK = 1 << 25
MAX_PARTS = 1 << 20
# a register tile's work items run row blocks fastest (codegen/opt/heuristic: neighbouring items share a panel of
# columns); its chunks are whole runs of them (_parts: as few a chunk as keep it under this much work): no two threads
# then stream the same panel at once. 2048^2 matmul on a 2-core Xeon, its kernel alone: 291-297 -> 309-317 GFLOP/s
# (256 chunks of 43 of a panel's 342 row blocks before; 16 chunks of 2 panels now)
BLOCK_CHUNK_WORK = 1 << 31
# how long one native call runs before it returns to Python (which then checks for signals) and goes on
SLICE_NS = 50_000_000
ALIGN = 64


class _Batch:
  """Kernels made ready to launch (CPUDevice.prepare_batch): the native block's template (entries, sizes, parts,
  the buffer lists' offsets, the addresses), the patches' places in it and which handle each takes, and the
  launches (their programs and fixed handles stay alive while the batch does)."""
  __slots__ = ("count", "tmpl", "pos", "src", "keep")

  def __init__(self, count, tmpl, pos, src, keep):
    self.count, self.tmpl, self.pos, self.src, self.keep = count, tmpl, pos, src, keep


class LoadError(RuntimeError):
  """A compiled kernel library could not be loaded (dlopen failed): the message says why."""


class _Job(ctypes.Structure):
  """fg_job of runtime/cpu_pool.c: one launch's kernels and how far it got (each caller has its own)."""
  # the arrays' addresses are in one block that run_prepared keeps alive for the call
  _fields_ = [("count", ctypes.c_longlong), ("entries", ctypes.c_void_p), ("bufs", ctypes.c_void_p),
              ("n", ctypes.c_void_p), ("parts", ctypes.c_void_p), ("slice_ns", ctypes.c_longlong),
              ("k", ctypes.c_longlong), ("chunk", ctypes.c_longlong), ("pooled", ctypes.c_longlong)]


class _Library:
  """A loaded shared library, unloaded (dlclose) when this object goes: nothing can run its code by then,
  since every launch holds its programs (and so their libraries) until its kernels have finished."""
  __slots__ = ("dll", "__weakref__")
  loaded = 0    # libraries loaded now, in this process

  def __init__(self, dll: ctypes.CDLL):
    self.dll = dll
    _Library.loaded += 1

  def __del__(self):
    try:
      _Library.loaded -= 1
      _ctypes.dlclose(self.dll._handle)
    except Exception:   # interpreter shutdown
      pass


class CPUProgram:
  """A compiled kernel: its entry point's address (what the launcher calls) and the library it lives in."""
  __slots__ = ("name", "lib", "_entry")

  def __init__(self, name: str, lib: _Library):
    self.name, self.lib = name, lib
    self._entry = ctypes.cast(getattr(lib.dll, name + "_entry"), ctypes.c_void_p).value


@functools.lru_cache(None)
def find_compiler() -> tuple[str, str]:
  """(path, version line) of the C compiler: FUSEGRAD_CC, else clang, gcc or cc from PATH."""
  names = [config.CC] if config.CC else ["clang", "gcc", "cc"]
  for n in names:
    path = shutil.which(n)
    if path:
      try:
        ver = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()
      except (OSError, subprocess.SubprocessError):
        continue
      return path, (ver[0] if ver else n)
  raise RuntimeError("the CPU device needs a C compiler and found none "
                     f"(looked for {', '.join(names)} on PATH); install clang or gcc, or set FUSEGRAD_CC")


def is_clang() -> bool:
  """Whether the C compiler (find_compiler) is clang; False where there is none (compiling says why)."""
  try:
    return "clang" in find_compiler()[1].lower()
  except RuntimeError:
    return False


@functools.lru_cache(None)
def compiler_flags() -> list:
  find_compiler()   # (raises, saying why, where there is none)
  return FLAGS + ISA_FLAGS[config.CPU_ISA] + ([] if is_clang() else GCC_FLAGS)


# what each value of FUSEGRAD_CPU_ISA (config.CPU_ISA) adds to -march=native
ISA_FLAGS = {"native": [], "avx2": ["-mno-avx512f"]}


# a register tile leaves at least this many work items per thread (Caps.tile_items; at most the heuristic's own 64):
# on 2 threads a [20, 800] @ [800, 200] product (an LSTM's step gradient) takes 4 rows x 16 columns with partial sums,
# not 2 rows x 16, 175 -> 90 us on one core of a Xeon (AVX-512)
TILE_ITEMS_PER_THREAD = 8


def tile_caps(regs: int, lanes: int, clang: bool | None = None) -> dict:
  """Caps.tile_registers, tile_columns, max_registers and tile_items for this machine's compiler (also with no
  compiler: compiling says why) and threads (TILE_ITEMS_PER_THREAD). clang: half the registers and 16 columns. gcc with AVX-512: 4 vectors of 16 columns (6 rows
  of them in the 32 registers: fewer loads per multiply-add than 8 rows x 2 vectors; on a 2-core Intel Xeon (Granite
  Rapids, two 512-bit FMA units a core) 1024^3 148 -> 163 GFLOP/s a core, torch 165), the work item's expanded
  values up to that tile's 384 (not the register file's 512: a fold of 512 accumulators, a chain of 511 ops, recursed
  past Python's limit in the passes that walk it). Otherwise the heuristic's defaults. clang: whether the compiler is
  clang (default: whether find_compiler's is)."""
  if clang is None: clang = is_clang()
  items = {"tile_items": min(64, TILE_ITEMS_PER_THREAD * (config.THREADS or os.cpu_count() or 1))}
  if clang: return {"tile_registers": regs // 2, "tile_columns": 16, **items}
  if lanes == 16: return {"tile_columns": 64, "max_registers": 6 * 64, **items}
  return items


def host_vector_widths(widths: tuple) -> tuple:
  """Of a renderer's vector widths, those this CPU holds in one register: a wider vector type is several, and gcc
  keeps such values (a register tile's accumulators, comparison masks) in memory, shuffling them through the stack
  on every use (an AVX2 build's matmul with 16-lane vectors ran 10x slower than with 8-lane ones)."""
  lanes = host_vectors()[1]
  return tuple(w for w in widths if w <= lanes) or widths[:1]


@functools.lru_cache(None)
def _host_id() -> str:
  """-march=native binaries belong to this CPU: key the cache by its model and flags."""
  info = ""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith(("model name", "flags")): info += line
        if line.strip() == "": break
  except OSError:
    pass
  return platform.machine() + platform.system() + info + ("" if config.CPU_ISA == "native" else f"isa {config.CPU_ISA}\n")


@functools.lru_cache(None)
def host_vectors() -> tuple[int, int, str]:
  """(vector registers, float32 lanes in one, the ISA's name) of this CPU, which -march=native compiles for."""
  flags = set()
  for line in _host_id().splitlines():
    if line.startswith(("flags", "Features")): flags |= set(line.split(":", 1)[1].split())
  if config.CPU_ISA == "avx2" and "avx2" not in flags:
    raise ValueError("FUSEGRAD_CPU_ISA=avx2: this CPU has no AVX2")
  if "avx512f" in flags and config.CPU_ISA != "avx2": return 32, 16, "AVX-512"
  if "avx2" in flags: return 16, 8, "AVX2"
  if "asimd" in flags or platform.machine() in ("aarch64", "arm64"): return 32, 4, "NEON"
  return 16, 4, "SSE"


def _parts(kernel, n: int, threads: int) -> int:
  """How many chunks a parallel kernel of n work items is cut into: a few per thread, more for a long kernel
  (CHUNK_WORK); a register tile's, whole runs of its innermost work-item axis (the row blocks of one panel) where the
  usual count would cut them: the fewest runs a chunk that keep a chunk under BLOCK_CHUNK_WORK, and at least
  CHUNKS_PER_THREAD chunks a thread (a count that divides the runs evenly)."""
  parts = min(n, MAX_PARTS, max(threads * CHUNKS_PER_THREAD, kernel.cost // CHUNK_WORK))
  d = kernel.global_dims[-1] if kernel.tiled and kernel.global_dims else 1
  if d < 2 or n % d or parts <= n // d: return parts
  blocks = n // d
  per = max(1, BLOCK_CHUNK_WORK // max(1, kernel.cost // blocks))   # runs a chunk may hold
  least = max(-(-blocks // per), threads * CHUNKS_PER_THREAD)
  return next((c for c in range(least, blocks + 1) if blocks % c == 0), parts)


class CPUDevice(Device):
  def __init__(self):
    super().__init__("CPU", CRenderer())
    regs, lanes, _ = host_vectors()
    self._caps = replace(self.renderer.caps, vector_registers=regs, native_lanes=lanes,
                         vector_widths=host_vector_widths(self.renderer.caps.vector_widths),
                         **tile_caps(regs, lanes))
    self.threads = config.THREADS or os.cpu_count() or 1
    self._run = None          # the native launcher, built on first use
    self.compiles = 0         # compiler invocations in this process (tests read it)
    self._lock = threading.Lock()
    self._launcher_lock = threading.Lock()
    self._tmp = tempfile.mkdtemp(prefix="fusegrad-")
    atexit.register(shutil.rmtree, self._tmp, True)

  @property
  def caps(self): return self._caps

  def alloc(self, nbytes: int):
    # 64-byte aligned (a cache line, an AVX-512 vector): misaligned vector loads measured 1.5x slower
    raw = np.empty(max(nbytes, 1) + ALIGN, dtype=np.uint8)
    base = raw.ctypes.data
    off = -base % ALIGN
    m = raw[off:off + max(nbytes, 1)].view(Mem)
    m.addr = base + off
    return m
  def copyin(self, handle, src: np.ndarray) -> None: handle[:src.nbytes] = src
  def copyout(self, dst: np.ndarray, handle) -> None: dst[:] = handle[:dst.nbytes]

  def compile(self, name: str, source: str) -> CPUProgram:
    return CPUProgram(name, _Library(self.compile_library(name, source)))

  def compile_library(self, name: str, source: str) -> ctypes.CDLL:
    """The shared library built from source (through the on-disk cache)."""
    cc, ver = find_compiler()
    flags = compiler_flags()
    key = cache.key_of(source, cc, ver, " ".join(flags), _host_id())
    binary = cache.programs.get(key)
    if binary is not None:
      try:
        return self._load(binary)
      except OSError:   # an authenticated entry of this user's can still fail to load (memory short): rebuild it
        pass
    binary = self._build(cc, flags, source)
    cache.programs.put(key, binary)
    try:
      return self._load(binary)
    except OSError as e:
      # the compiler was content: what failed is loading (mappings or memory exhausted, a noexec temp dir)
      raise LoadError(f"the CPU device could not load the compiled kernel {name}: {e} ({_Library.loaded} kernel "
                      f"libraries loaded in this process; FUSEGRAD_MAX_PROGRAMS bounds how many are kept)") from None

  def _load(self, binary: bytes) -> ctypes.CDLL:
    # a name of its own: another thread may be loading the same binary
    fd, path = tempfile.mkstemp(suffix=".so", dir=self._tmp)
    try:
      with os.fdopen(fd, "wb") as f: f.write(binary)
      return ctypes.CDLL(path)
    finally:
      os.unlink(path)

  def _build(self, cc: str, flags: list, source: str) -> bytes:
    with self._lock: self.compiles += 1
    with tempfile.TemporaryDirectory(dir=self._tmp) as d:
      out = os.path.join(d, "k.so")
      try:
        r = subprocess.run([cc, *flags, "-x", "c", "-", "-o", out, "-lm"], input=source, capture_output=True,
                           text=True, timeout=300)
      except (OSError, subprocess.SubprocessError) as e:
        raise CompileError(f"running the C compiler {cc} failed: {e}\n--- source ---\n{source}") from None
      if r.returncode != 0:
        raise CompileError(f"the C compiler ({cc}) rejected a kernel:\n{clip_log(r.stderr)}\n--- source ---\n{source}")
      try:
        with open(out, "rb") as f: binary = f.read()
      except OSError:
        binary = b""
      if not binary:
        said = clip_log(r.stderr + r.stdout)
        raise CompileError(f"the C compiler ({cc}) exited with status 0 but wrote no shared library "
                           f"({out} is missing or empty)" + (f":\n{said}" if said else "") + f"\n--- source ---\n{source}")
      return binary

  def launch(self, program, kernel, handles: list) -> None:
    self.launch_batch([(program, kernel, handles)])

  def launch_batch(self, launches: list) -> None:
    """Run kernels in order through the native launcher (runtime/cpu_pool.c): a kernel whose estimated cost
    (Kernel.cost) is small runs on the calling thread, a larger one in chunks (a few per thread, more for a
    long kernel) that whoever is free claims (a worker that wakes late finds less or nothing left)."""
    self.run_prepared(self.prepare_batch(launches, ()), ())

  def prepare_batch(self, launches: list, patches) -> "_Batch":
    """launches made ready to run (Device.prepare_batch): one native array of the job's fields and every
    kernel's buffer addresses (a few numpy calls per batch, not ctypes objects per kernel: a replayed step launches
    hundreds of small kernels; numpy's .ctypes costs 2 us), with where each patch's address goes. The batch holds
    its programs and fixed handles (argument blocks, buffers) alive."""
    addrs, starts, entries, sizes, parts = [], [], [], [], []
    small, threads = PARALLEL_MIN_WORK, self.threads
    for program, kernel, handles in launches:
      starts.append(len(addrs))
      addrs += [0 if h is None else h.addr if type(h) is Mem else h.ctypes.data for h in handles]
      entries.append(program._entry)
      n = kernel.global_size
      sizes.append(n)
      parts.append(1 if n < 2 or kernel.cost < small else _parts(kernel, n, threads))
    c = len(launches)
    # the kernels' buffer lists as offsets from the block's start: a run adds the address of its copy
    tmpl = np.array(entries + sizes + parts + [8 * (4 * c + i) for i in starts] + addrs, dtype=np.int64)
    pos = np.array([4 * c + starts[i] + j for i, j, _k in patches], dtype=np.intp)
    src = np.array([k for _i, _j, k in patches], dtype=np.intp)
    return _Batch(c, tmpl, pos, src, launches)

  def run_prepared(self, batch: "_Batch", handles) -> None:
    """Run a prepared batch, its patches' addresses taken from handles (by each patch's index). The native call
    returns every SLICE_NS and is called again, so a KeyboardInterrupt reaches the main thread within about that
    plus one chunk; the job is then cancelled, and this returns (raises) only when no worker runs its kernels any
    more, since the buffers may be freed right after."""
    run, cancel = self._launcher()
    c = batch.count
    block = batch.tmpl.copy()
    base = block.ctypes.data
    block[3 * c:4 * c] += base
    if len(batch.pos):   # (a buffer over a user's numpy array, fusegrad.from_numpy: its handle is that array)
      block[batch.pos] = np.array([h.addr if type(h) is Mem else h.ctypes.data for h in handles],
                                  dtype=np.int64)[batch.src]
    job = _Job(c, base, base + 8 * 3 * c, base + 8 * c, base + 16 * c, SLICE_NS, 0, 0, 0)
    ref = ctypes.byref(job)
    try:
      while run(ref): pass
    except BaseException:
      cancel(ref)   # first, before anything can free the buffers its chunks write
      raise

  def _launcher(self):
    """(fg_run, fg_cancel) from runtime/cpu_pool.c, compiled (and cached) like a kernel on first use; its workers
    start then. The library stays loaded for the life of the process (its workers run its code)."""
    if self._run is None:
      with self._launcher_lock:
        if self._run is None:
          with open(os.path.join(os.path.dirname(__file__), "cpu_pool.c")) as f: src = f.read()
          lib = self.compile_library("fg_pool", src)
          lib.fg_pool_start.restype = ctypes.c_int
          lib.fg_pool_start.argtypes = [ctypes.c_int]
          lib.fg_pool_start(self.threads)
          run, cancel = lib.fg_run, lib.fg_cancel
          run.restype, run.argtypes = ctypes.c_int, [ctypes.POINTER(_Job)]
          cancel.restype, cancel.argtypes = None, [ctypes.POINTER(_Job)]
          self._pool_lib = lib
          self._run = (run, cancel)
    return self._run


def create() -> Device: return CPUDevice()
