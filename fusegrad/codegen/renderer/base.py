"""What a renderer (and so its device) can do, as data the optimizer reads: codegen/opt never asks which device
it optimizes for, only what the device has."""
from __future__ import annotations
from dataclasses import dataclass


@dataclass(frozen=True)
class Caps:
  has_local: bool = False        # work-groups with local memory and barriers
  max_local: int = 0             # work items per work-group
  local_bytes: int = 0           # local (shared) memory per work-group
  vector_widths: tuple = ()      # float32 vector widths the renderer spells as vector types
  # vector loads and stores of a contiguous range of their lanes (ir.Load.lanes, ir.Store.lanes: a padded axis's
  # last vector), which touch no memory outside it; without them such lanes are read and written one by one
  masked_vectors: bool = False
  # the tensor cores (codegen/opt/tc.TensorCore records) the renderer spells as warp-level matrix multiply-accumulates
  # (ir.Mma): the TC action is legal only with one of them. The OPENCL renderer of an NVIDIA GPU declares its
  # architecture's entries of tc.TENSOR_CORES (inline PTX: runtime/opencl.py); C cannot spell an Mma; the PYTHON
  # interpreter emulates any entry it is asked to (runtime/python.PythonDevice.emulate)
  tensor_cores: tuple = ()
  max_registers: int = 256       # values a work item may hold expanded in registers (product of UPCAST/UNROLL)
  vector_registers: int = 16     # the machine's vector registers (a register tile's accumulators must fit)...
  native_lanes: int = 4          # ...and the float32 lanes of one (a wider vector type takes several)
  # a register tile's accumulators: the registers they may take (0: all but a few, codegen/opt/heuristic.
  # SPARE_REGISTERS) and its columns (0: heuristic.TILE_COLUMNS). The CPU device sets them from its C compiler: clang
  # 14 ran gcc 12's tiles (AVX-512 8 x 2 vectors, AVX2 6 x 2) 1.4x slower, and 16 columns in half the registers at
  # the machine's peak (AVX-512 8 x 1, AVX2 4 x 2)
  tile_registers: int = 0
  tile_columns: int = 0
  # the fewest work items a register tile leaves (0: heuristic.MIN_PARALLEL); a CPU of few threads sets fewer, so a
  # small product takes a tile with enough accumulators to hide its multiply-adds' latency
  tile_items: int = 0
  prefers_blocking: bool = True  # register tiles and reduction lanes pay (CPUs; kept for GPUs until measured)


class RenderError(NotImplementedError):
  """A listing holds a value the renderer cannot spell (an earlier stage let through what the device's caps refuse)."""


def check_spellable(renderer, listing: list) -> None:
  """Raise RenderError when the listing holds a tensor core's Mma that the renderer does not declare in its caps:
  such a renderer must never see one (the TC action is illegal without the tensor core; this catches caps that
  were swapped under a device)."""
  from fusegrad.codegen.ir import Mma
  from fusegrad.codegen.linearize import Let
  have = getattr(renderer, "caps", Caps()).tensor_cores
  for st in listing:
    if isinstance(st, Let) and isinstance(st.val, Mma) and st.val.tc not in have:
      name = getattr(renderer, "name", type(renderer).__name__)
      raise RenderError(f"the {name} renderer cannot spell a tensor core's warp-level matrix multiply-accumulate "
                        f"({st.val.tc.name}): it declares no such tensor core (Caps.tensor_cores); optimize the kernel "
                        f"for this device's caps (no TC action)")
