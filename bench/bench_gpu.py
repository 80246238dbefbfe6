"""fusegrad on a GPU (the OPENCL device, on NVIDIA's OpenCL driver) vs PyTorch CUDA, side by side in one process.

For each case: fusegrad's time per call (graph building, schedule and launch included, the device synchronized),
its time per call of the same function under fusegrad.jit (a captured call replayed: the counterpart of
torch.compile) and the device time of its kernels (fusegrad.track), PyTorch's time per call (CUDA, synchronized;
torch.compile where it applies), the ratios torch/fusegrad eager and torch.compile/fusegrad.jit (above 1: fusegrad
is faster) and the achieved bandwidth or FLOP rate.
Each result is checked against PyTorch's (relative error of the norm). Matmuls run with TF32 off on both sides.

    python bench/bench_gpu.py            # full sizes (the issue's: 2^28 elements, 8192^2, 4096^3)
    python bench/bench_gpu.py --quick    # small sizes
    python bench/bench_gpu.py --beam 4   # also with kernels chosen by a BEAM search
    python bench/bench_gpu.py --compile --only softmax,layernorm   # some cases, beside torch.compile
"""
from __future__ import annotations
import argparse
import statistics
import time
import numpy as np


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true")
  ap.add_argument("--runs", type=int, default=20)
  ap.add_argument("--compile", action="store_true", help="also time torch.compile (slow to start)")
  ap.add_argument("--beam", type=int, default=0, help="also time each case (but bf16) with kernels chosen by a BEAM "
                  "search of this width (FUSEGRAD_BEAM_BUDGET bounds each kernel's search)")
  ap.add_argument("--only", default="", help="comma-separated words: the cases whose name starts with one of them "
                  "(e.g. softmax,layernorm)")
  return ap.parse_args(argv)


def _median_time(fn, sync, runs: int) -> float:
  fn(); sync()
  ts = []
  for _ in range(runs):
    t0 = time.perf_counter()
    fn()
    sync()
    ts.append(time.perf_counter() - t0)
  return statistics.median(ts)


def main(argv=None) -> None:
  args = parse_args(argv)
  import torch
  import fusegrad as fg
  from fusegrad.runtime import device as rd
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  dev = rd.get("OPENCL")
  print(f"fusegrad OPENCL on {dev.cl_device.name} ({dev.cl_device.platform.name}); torch {torch.__version__} on "
        f"{torch.cuda.get_device_name()}")
  e, n2, mm = (20, 1024, 512) if args.quick else (28, 8192, 4096)
  rng = np.random.default_rng(0)
  F = fg.nn.functional
  cases = [
    # name, inputs' shapes, fusegrad fn, torch fn, bytes moved (each input read once, the output written once), flops
    (f"sum 2^{e}", [(2 ** e,)], lambda x: x.sum(), lambda x: x.sum(), 4 * 2 ** e, 0),
    (f"softmax {n2}x{n2}", [(n2, n2)], lambda x: x.softmax(-1), lambda x: torch.softmax(x, -1), 8 * n2 * n2, 0),
    (f"layernorm {n2}x{n2}", [(n2, n2)], lambda x: F.layer_norm(x, (n2,)),
     lambda x: torch.nn.functional.layer_norm(x, (n2,)), 8 * n2 * n2, 0),
    (f"relu(sqrt(exp(x)*2+1)*x) 2^{e}", [(2 ** e,)], lambda x: (((x.exp() * 2 + 1).sqrt()) * x).relu(),
     lambda x: torch.relu(torch.sqrt(torch.exp(x) * 2 + 1) * x), 8 * 2 ** e, 0),
    (f"matmul f32 {mm}^3", [(mm, mm), (mm, mm)], lambda a, b: a @ b, lambda a, b: a @ b, 12 * mm * mm, 2 * mm ** 3),
    # 16-bit inputs: tensor cores on both sides (fusegrad: mma.sync through OpenCL's inline PTX where the GPU has them)
    (f"matmul bf16 {mm}^3", [(mm, mm), (mm, mm)], lambda a, b: a @ b, lambda a, b: a @ b, 6 * mm * mm, 2 * mm ** 3,
     "bfloat16"),
  ]
  if args.only: cases = [c for c in cases if c[0].startswith(tuple(w.strip() for w in args.only.split(",")))]
  rows = []
  todo = [(c, 0) for c in cases] + ([(c, args.beam) for c in cases if len(c) == 6] if args.beam else [])
  for (name, shapes, f_fg, f_th, nbytes, flops, *dtype), beam in todo:
    if beam: name = f"{name}, BEAM {beam}"
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    fx = [fg.tensor(x, device="OPENCL").to(getattr(fg, dtype[0]) if dtype else fg.float32).realize() for x in xs]
    tx = [torch.tensor(x, device="cuda").to(getattr(torch, dtype[0]) if dtype else torch.float32) for x in xs]
    with fg.beam(beam):   # the search runs on the first call; its choices are reused after
      got = f_fg(*fx).float().numpy()
    want = f_th(*tx).double().cpu().numpy()
    err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    with fg.beam(beam):
      t_fg = _median_time(lambda: f_fg(*fx).realize(), dev.synchronize, args.runs)
      with fg.track() as tr:
        f_fg(*fx).realize()
    k_time = sum(k.time_s for k in tr.kernels)
    with fg.beam(beam):
      jf = fg.jit(f_fg)
      jerr = float(np.linalg.norm(jf(*fx).float().numpy() - want) / max(np.linalg.norm(want), 1e-30))
      t_jit = _median_time(lambda: jf(*fx), dev.synchronize, args.runs)
    err = max(err, jerr)
    t_th = _median_time(lambda: f_th(*tx), torch.cuda.synchronize, args.runs)
    if beam: print(f"  {name}: " + "; ".join(f"{k.name} {list(k.opts)}" for k in tr.kernels), flush=True)
    t_tc = None
    if args.compile:
      cf = torch.compile(f_th)
      t_tc = _median_time(lambda: cf(*tx), torch.cuda.synchronize, args.runs)
    rate = (f"{flops / k_time / 1e12:.2f} TFLOP/s" if flops else f"{nbytes / k_time / 1e9:.0f} GB/s") if k_time else "-"
    rows.append((name, t_fg * 1e3, t_jit * 1e3, k_time * 1e3, len(tr.kernels), rate, t_th * 1e3,
                 None if t_tc is None else t_tc * 1e3, t_th / t_fg, None if t_tc is None else t_tc / t_jit, err))
  print("\n| case | fusegrad ms/call | fusegrad.jit ms/call | its kernels ms (n) | kernel rate | torch ms | "
        "torch.compile ms | torch/fusegrad | torch.compile/fusegrad.jit | rel. error |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for name, a, j, k, n, rate, t, tc, ratio, cratio, err in rows:
    print(f"| {name} | {a:.3f} | {j:.3f} | {k:.3f} ({n}) | {rate} | {t:.3f} | {'-' if tc is None else f'{tc:.3f}'} | "
          f"{ratio:.2f}x | {'-' if cratio is None else f'{cratio:.2f}x'} | {err:.1e} |")


if __name__ == "__main__":
  main()
