"""The CPU device: C rendered by codegen/renderer/cstyle.py, compiled by the system's C compiler
into a shared library, loaded with ctypes and run over all cores by a pool of threads (ctypes
releases the GIL during the call, so the threads run in parallel).
"""
from __future__ import annotations
import atexit
import ctypes
import itertools
import functools
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
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
    self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="fusegrad-cpu") if self.threads > 1 else None
    self.compiles = 0         # compiler invocations in this process (tests read it)
    self._lock = threading.Lock()
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
    fn = getattr(lib, name)
    fn.restype = None
    fn._lib = lib  # keep the library loaded as long as the function lives
    return fn

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
    ptrs = [ctypes.c_void_p(h.ctypes.data) for h in handles]
    n = kernel.global_size
    if self.pool is None or n < 2 or kernel.cost < PARALLEL_MIN_WORK:
      program(*ptrs, ctypes.c_longlong(0), ctypes.c_longlong(n))
      return
    # the range is cut into a few chunks per thread that whoever is free claims: a worker that wakes late
    # (a hand-off costs tens of microseconds) finds less or nothing left, and nobody waits for it
    parts = min(self.threads * CHUNKS_PER_THREAD, n)
    bounds = [ctypes.c_longlong(n * i // parts) for i in range(parts + 1)]
    claim, lock, done, finished, errors = itertools.count(), threading.Lock(), [0], threading.Event(), []
    def work():
      while (i := next(claim)) < parts:
        try:
          program(*ptrs, bounds[i], bounds[i + 1])
        except BaseException as e:   # noqa: BLE001 (re-raised on the launching thread)
          errors.append(e)
        with lock:
          done[0] += 1
          if done[0] == parts: finished.set()
    for _ in range(min(self.threads, parts) - 1): self.pool.submit(work)
    work()
    finished.wait()
    if errors: raise errors[0]


def create() -> Device: return CPUDevice()
