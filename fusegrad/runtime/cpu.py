"""The CPU device: C rendered by codegen/renderer/cstyle.py, compiled by the system's C compiler
into a shared library, loaded with ctypes and run over all cores by the native launcher in
runtime/cpu_pool.c (pthreads; ctypes releases the GIL during the call).
"""
from __future__ import annotations
import atexit
import ctypes
import functools
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import numpy as np
from fusegrad import config
from fusegrad.runtime import cache
from fusegrad.runtime.device import Device, CompileError
from fusegrad.codegen.renderer.cstyle import CRenderer

FLAGS = ["-O2", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fwrapv", "-std=gnu11"]
# gcc's -O2 vectorizes only loops its "very cheap" model accepts, which rejects most kernels' loops
# (they need an epilogue); clang's -O2 vectorizes them already.
GCC_FLAGS = ["-ftree-vectorize", "-fvect-cost-model=dynamic"]
# below this much estimated work (Kernel.cost) a kernel runs on the calling thread: a hand-off costs more
# (measured on 2 cores: a memory-bound add gains from a second thread from about 2^19 elements)
PARALLEL_MIN_WORK = 1 << 20
CHUNKS_PER_THREAD = 4
ALIGN = 64


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


@functools.lru_cache(None)
def compiler_flags() -> list:
  _, ver = find_compiler()
  return FLAGS + ([] if "clang" in ver.lower() else GCC_FLAGS)


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
  return platform.machine() + platform.system() + info


class CPUDevice(Device):
  def __init__(self):
    super().__init__("CPU", CRenderer())
    self.threads = config.THREADS or os.cpu_count() or 1
    self._run = None          # the native launcher, built on first use
    self.compiles = 0         # compiler invocations in this process (tests read it)
    self._lock = threading.Lock()
    self._launcher_lock = threading.Lock()
    self._tmp = tempfile.mkdtemp(prefix="fusegrad-")
    atexit.register(shutil.rmtree, self._tmp, True)

  def alloc(self, nbytes: int):
    # 64-byte aligned (a cache line, an AVX-512 vector): misaligned vector loads measured 1.5x slower
    raw = np.empty(max(nbytes, 1) + ALIGN, dtype=np.uint8)
    off = -raw.ctypes.data % ALIGN
    return raw[off:off + max(nbytes, 1)]
  def copyin(self, handle, src: np.ndarray) -> None: handle[:src.nbytes] = src
  def copyout(self, dst: np.ndarray, handle) -> None: dst[:] = handle[:dst.nbytes]

  def compile(self, name: str, source: str):
    lib = self.compile_library(name, source)
    fn = getattr(lib, name)
    fn.restype = None
    fn._lib = lib  # keep the library loaded as long as the function lives
    fn._entry = ctypes.cast(getattr(lib, name + "_entry"), ctypes.c_void_p).value
    return fn

  def compile_library(self, name: str, source: str):
    """The shared library built from source (through the on-disk cache)."""
    cc, ver = find_compiler()
    flags = compiler_flags()
    key = cache.key_of(source, cc, ver, " ".join(flags), _host_id())
    binary = cache.get(key)
    lib = self._load(binary, key) if binary is not None else None   # a checksummed entry can still be foreign
    if lib is None:
      binary = self._build(cc, flags, source)
      cache.put(key, binary)
      lib = self._load(binary, key)
      if lib is None: raise CompileError(f"could not load the freshly compiled kernel {name}\n--- source ---\n{source}")
    return lib

  def _load(self, binary: bytes, key: str):
    path = os.path.join(self._tmp, key + ".so")
    with open(path, "wb") as f: f.write(binary)
    try:
      return ctypes.CDLL(path)
    except OSError:
      return None
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
        raise CompileError(f"the C compiler ({cc}) rejected a kernel:\n{r.stderr.strip()}\n--- source ---\n{source}")
      with open(out, "rb") as f: return f.read()

  def launch(self, program, kernel, handles: list) -> None:
    self.launch_batch([(program, kernel, handles)])

  def launch_batch(self, launches: list) -> None:
    """Run kernels in order with one call into the native launcher (runtime/cpu_pool.c): a kernel whose
    estimated cost (Kernel.cost) is small runs on the calling thread, a larger one in a few chunks per thread
    that whoever is free claims (a worker that wakes late finds less or nothing left)."""
    count = len(launches)
    run = self._launcher()
    entries = (ctypes.c_void_p * count)()
    bufs = (ctypes.POINTER(ctypes.c_void_p) * count)()
    sizes = (ctypes.c_longlong * count)()
    parts = (ctypes.c_int * count)()
    keep = []
    for i, (program, kernel, handles) in enumerate(launches):
      arr = (ctypes.c_void_p * max(len(handles), 1))(*[h.ctypes.data for h in handles])
      keep.append(arr)
      entries[i] = program._entry
      bufs[i] = ctypes.cast(arr, ctypes.POINTER(ctypes.c_void_p))
      n = kernel.global_size
      sizes[i] = n
      parts[i] = 1 if self.threads < 2 or n < 2 or kernel.cost < PARALLEL_MIN_WORK else \
          min(self.threads * CHUNKS_PER_THREAD, n)
    run(count, entries, bufs, sizes, parts)

  def _launcher(self):
    """fg_run from runtime/cpu_pool.c, compiled (and cached) like a kernel on first use; its workers start then."""
    if self._run is None:
      with self._launcher_lock:
        if self._run is None:
          with open(os.path.join(os.path.dirname(__file__), "cpu_pool.c")) as f: src = f.read()
          lib = self.compile_library("fg_pool", src)
          lib.fg_pool_start.restype = ctypes.c_int
          lib.fg_pool_start.argtypes = [ctypes.c_int]
          lib.fg_pool_start(self.threads)
          fn = lib.fg_run
          fn.restype = None
          fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p)),
                         ctypes.POINTER(ctypes.c_longlong), ctypes.POINTER(ctypes.c_int)]
          fn._lib = lib
          self._run = fn
    return self._run


def create() -> Device: return CPUDevice()
