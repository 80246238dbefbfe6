"""A first look at fusegrad: a small model is built lazily, then runs as a few fused, compiled kernels.

    python examples/demo.py                   # the CPU device (C, compiled by your C compiler)
    python examples/demo.py --device PYTHON   # or OPENCL; FUSEGRAD_DEVICE=... works too
"""
from __future__ import annotations
import argparse
import os
import sys
import time
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fusegrad as fg  # noqa: E402
from fusegrad import config  # noqa: E402


def layernorm(x, eps=1e-5):
  """LayerNorm over the last axis, no affine; PyTorch's Tensor methods, composed."""
  c = x - x.mean(-1, keepdim=True)
  return c * ((c * c).mean(-1, keepdim=True) + eps).rsqrt()


def kernel_body(source: str, name: str) -> str:
  """The kernel function itself, without the helper preamble every kernel's source starts with."""
  lines = source.splitlines()
  start = next((i for i, line in enumerate(lines) if f"{name}(" in line), 0)
  return "\n".join(lines[start:])


def main() -> int:
  ap = argparse.ArgumentParser(description="fusegrad in ten seconds")
  ap.add_argument("--device", default=config.DEVICE, help="CPU (default, or $FUSEGRAD_DEVICE), OPENCL or PYTHON")
  dev = ap.parse_args().device.upper()

  # 1. Inputs: a batch of 64 vectors and the weights of a 2-layer MLP (from numpy, so we can check later).
  rng = np.random.default_rng(0)
  x_np = rng.standard_normal((64, 128), dtype=np.float32)
  w1_np = rng.standard_normal((128, 256), dtype=np.float32) / np.sqrt(128, dtype=np.float32)
  b1_np = rng.standard_normal(256, dtype=np.float32) * np.float32(0.1)
  w2_np = rng.standard_normal((256, 10), dtype=np.float32) / np.sqrt(256, dtype=np.float32)
  x, w1, b1, w2 = (fg.tensor(a, device=dev) for a in (x_np, w1_np, b1_np, w2_np))
  print(f"fusegrad on device {dev}: layernorm -> linear -> relu -> linear -> softmax on a {tuple(x.shape)} batch\n")

  # 2. Build the model. Each op only records a node in a graph: nothing is computed here.
  with fg.track() as building:
    h = (layernorm(x) @ w1 + b1).relu()
    probs = (h @ w2).softmax(-1)
  print(f"built `probs` {tuple(probs.shape)} {probs.dtype}: {len(building.kernels)} kernels ran so far (it is lazy)")

  # 3. Realize: the graph is cut into fused kernels, each rendered to source, compiled (and cached on
  #    disk, so the next run skips the compiler) and launched.
  t0 = time.perf_counter()
  with fg.track() as run:
    probs.realize()
  wall = time.perf_counter() - t0
  print(f"probs.realize() ran {len(run.kernels)} kernels in {wall * 1e3:.0f} ms "
        f"(that includes compiling them, or loading them from the disk cache):")
  for k in run.kernels:
    print(f"  {k.name:16s} {k.time_s * 1e6:9.1f} us  {k.flops:>11,} FLOPs  {k.bytes:>9,} bytes")

  # 4. The softmax (max, exp, sum and divide) is one kernel: here is what the device runs for it.
  sm = next((k for k in run.kernels if "exp" in kernel_body(k.source, k.name)), run.kernels[-1])
  print(f"\nthe fused softmax kernel `{sm.name}` ({dev} source, helper preamble left out):\n")
  print(kernel_body(sm.source, sm.name))

  # 5. Check against numpy.
  xc = x_np - x_np.mean(-1, keepdims=True)
  xn = xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + np.float32(1e-5))
  logits = np.maximum(xn @ w1_np + b1_np, 0) @ w2_np
  e = np.exp(logits - logits.max(-1, keepdims=True))
  ref = e / e.sum(-1, keepdims=True)
  err = float(np.abs(probs.numpy() - ref).max())
  ok = err < 1e-5
  print(f"\nmax abs error vs numpy: {err:.2e}  {'OK' if ok else 'MISMATCH'}")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
