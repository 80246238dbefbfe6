"""fusegrad.accelerator: is there a device other than the host CPU to run on (torch.accelerator)?

Decision: fusegrad's OPENCL device is an accelerator when OpenCL offers a GPU or an ACCELERATOR-type device (the
OPENCL device then runs on it: runtime/opencl.py picks GPUs first). An OpenCL implementation that only offers the
host's CPU (PoCL's CPU driver) is not one: it runs on the same cores as the CPU device. The CPU and PYTHON devices
are never accelerators. The probe lists OpenCL devices through pyopencl without opening fusegrad's device; its
answer is kept for the process.
"""
from __future__ import annotations
import functools
from fusegrad.devices import device


@functools.lru_cache(None)
def _opencl_accelerators() -> int:
  try:
    import pyopencl as cl
    devs = [d for p in cl.get_platforms() for d in p.get_devices()]
  except Exception:   # no pyopencl, no ICD loader, no platform: no OpenCL accelerator
    return 0
  return sum(1 for d in devs if d.type & (cl.device_type.GPU | cl.device_type.ACCELERATOR))


def current_accelerator(check_available: bool = False) -> device | None:
  """device('opencl') when OpenCL has a GPU/accelerator, else None."""
  return device("opencl") if _opencl_accelerators() else None


def is_available() -> bool: return current_accelerator() is not None
def device_count() -> int: return 1 if is_available() else 0   # the OPENCL device runs on one OpenCL device
