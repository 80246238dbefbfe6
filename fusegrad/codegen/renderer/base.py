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
  tensor_cores: tuple = ()       # tensor-core shapes (codegen/opt/tc.py), none yet
  max_registers: int = 256       # values a work item may hold expanded in registers (product of UPCAST/UNROLL)
  vector_registers: int = 16     # the machine's vector registers (a register tile's accumulators must fit)...
  native_lanes: int = 4          # ...and the float32 lanes of one (a wider vector type takes several)
  prefers_blocking: bool = True  # register tiles and reduction lanes pay (CPUs; kept for GPUs until measured)
