"""Every environment variable fusegrad reads, in one place (the README lists them too)."""
from __future__ import annotations
import os


def _int(name: str, default: int) -> int:
  v = os.environ.get(name, "")
  try:
    return int(v) if v.strip() else default
  except ValueError:
    raise ValueError(f"environment variable {name} must be an integer, got {v!r}") from None


def _float(name: str, default: float) -> float:
  v = os.environ.get(name, "")
  try:
    return float(v) if v.strip() else default
  except ValueError:
    raise ValueError(f"environment variable {name} must be a number, got {v!r}") from None


DEBUG = _int("FUSEGRAD_DEBUG", 0)                       # 1: each kernel launched; 2: plus its source; 3: plus why each cut
DEVICE = os.environ.get("FUSEGRAD_DEVICE", "CPU").upper()   # default device
DEFAULT_CACHE_DIR = os.path.join(
  os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fusegrad")
# the kernel cache; one that other users could write is refused (runtime/cache.py) for DEFAULT_CACHE_DIR or a
# private temporary directory
CACHE_DIR = os.environ.get("FUSEGRAD_CACHE_DIR") or DEFAULT_CACHE_DIR
DISABLE_DISK_CACHE = _int("FUSEGRAD_NO_DISK_CACHE", 0)  # 1: compile everything afresh
MAX_CACHE_ENTRY_BYTES = 64 << 20                        # larger cache entries are neither written nor read
CC = os.environ.get("FUSEGRAD_CC", "")                  # C compiler for the CPU device (default: clang, gcc, cc)
# the CPU device's instruction set: "native" (-march=native) or "avx2" (an AVX-512 host compiles as an AVX2-only
# one would: the code, vector widths and register tiles of a Zen 3; for testing and measuring that path)
CPU_ISA = (os.environ.get("FUSEGRAD_CPU_ISA", "") or "native").lower()
if CPU_ISA not in ("native", "avx2"):
  raise ValueError(f"FUSEGRAD_CPU_ISA must be one of native, avx2, got {CPU_ISA!r}")
THREADS = _int("FUSEGRAD_THREADS", 0)                   # CPU worker threads (0: one per core)
MAX_PROGRAMS = _int("FUSEGRAD_MAX_PROGRAMS", 2048)      # compiled programs kept in memory per device (LRU)
EAGER_REPLAY = bool(_int("FUSEGRAD_EAGER_REPLAY", 1))  # 0: realize schedules step by step (no replay of cached plans)
# 0: every backward runs its gradient rules and every library function its frontend ops (no graph templates:
# graph/template.py, autograd.py, templates.py)
TEMPLATES = bool(_int("FUSEGRAD_TEMPLATES", 1))
TRACE = bool(_int("FUSEGRAD_TRACE", 1))             # 0: build every eager step's graph (no replay of its recorded calls: engine/trace.py)
FUZZ_EXAMPLES = _int("FUSEGRAD_FUZZ_EXAMPLES", 0)       # tests/fuzz: examples per device (0: the quick default)
BEAM = _int("FUSEGRAD_BEAM", 0)                         # >0: search each new kernel's actions with this beam width (codegen/opt/search.py)
BEAM_BUDGET = _float("FUSEGRAD_BEAM_BUDGET", 60.0)      # seconds one kernel's search may take at most
TENSOR_CORES = bool(_int("FUSEGRAD_TENSOR_CORES", 1)) # 0: leave out tensor cores (an NVIDIA GPU's mma.sync through OPENCL)
