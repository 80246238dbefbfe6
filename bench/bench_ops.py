"""fusegrad vs numpy vs PyTorch (CPU, eager) on a few common ops, side by side in one process.

Prints a markdown table of median wall times (each library's best of 3 rounds, the rounds alternated) and ratios
(numpy/fusegrad and torch/fusegrad: above 1 means fusegrad is faster), the number of kernels fusegrad launched per
case, and a PASS/FAIL check of each fusegrad result against numpy.

What is timed, for fusegrad: building the lazy graph from already-realized inputs plus `.realize()`
(so the schedule, Python launch overhead and the kernels themselves), after one warm-up run that
compiles the kernels. numpy and torch are timed on the same float32 data, eagerly.

    python bench/bench_ops.py            # full sizes (about a minute on 2 cores)
    python bench/bench_ops.py --quick    # small sizes (seconds)
    python bench/bench_ops.py --threads 1  # every library on one thread
    python bench/bench_ops.py --beam 4   # plus rows for the sum and matmuls with BEAM-searched kernels
"""
from __future__ import annotations
import argparse
import datetime
import os
import platform
import statistics
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--quick", action="store_true", help="small sizes, a few seconds in all")
  ap.add_argument("--budget", type=float, default=None, help="seconds of timed runs per library per case "
                  "(default 1.5, or 0.3 with --quick); always at least one run after the warm-up")
  ap.add_argument("--threads", type=int, default=0, help="threads for every library (fusegrad, numpy's BLAS, "
                  "torch); default: each library's own default (all cores)")
  ap.add_argument("--compile", action="store_true", help="also time torch.compile on the elementwise, softmax, "
                  "layernorm and sum cases (its inductor C++ backend; slow to start)")
  ap.add_argument("--beam", type=int, default=0, help="also time the sum and matmul cases with kernels chosen by "
                  "a BEAM search of this width (fusegrad.beam; results are kept in the disk cache)")
  return ap.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else parse_args([])
if ARGS.threads > 0:   # before numpy/torch/fusegrad are imported: their thread pools read these once
  for var in ("FUSEGRAD_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fusegrad as fg  # noqa: E402
from machine import describe  # noqa: E402

try:
  import torch
except ImportError:   # the table still has fusegrad and numpy; `make bench` installs torch
  torch = None

EPS = 1e-5


# ---- the cases: (name, fusegrad fn, numpy fn, torch fn, tolerance) --------------------------------------------

def fg_chain(x): return (((x.exp() * 2 + 1).sqrt()) * x).relu()
def np_chain(x): return np.maximum(np.sqrt(np.exp(x) * 2 + 1) * x, np.float32(0))
def th_chain(x): return torch.relu(torch.sqrt(torch.exp(x) * 2 + 1) * x)


def fg_softmax(x): return x.softmax(-1)
def np_softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)
def th_softmax(x): return torch.softmax(x, -1)


def fg_layernorm(x):
  m = x.mean(-1, keepdim=True)
  c = x - m
  return c * ((c * c).mean(-1, keepdim=True) + EPS).rsqrt()
def np_layernorm(x):
  c = x - x.mean(-1, keepdims=True)
  return c / np.sqrt((c * c).mean(-1, keepdims=True) + np.float32(EPS))
def th_layernorm(x): return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=EPS)


def fg_sum(x): return x.sum()
def np_sum(x): return x.sum()
def th_sum(x): return x.sum()


def fg_matmul(a, b): return a @ b
def np_matmul(a, b): return a @ b
def th_matmul(a, b): return a @ b


def fg_conv(x, w): return fg.nn.functional.conv2d(x, w, padding=1)
def np_conv(x, w):
  win = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
  return np.einsum("nchwij,ocij->nohw", win, w, optimize=True)
def th_conv(x, w): return torch.nn.functional.conv2d(x, w, padding=1)


def fg_conv_train(x, w, g):
  """forward and backward: the gradients of sum(conv(x, w) * g) for x and w, flattened into one result"""
  x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
  (fg.nn.functional.conv2d(x, w, padding=1) * g).sum().backward()
  return fg.cat([x.grad.flatten(), w.grad.flatten()])
def th_conv_train(x, w, g):
  x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
  (torch.nn.functional.conv2d(x, w, padding=1) * g).sum().backward()
  return torch.cat([x.grad.flatten(), w.grad.flatten()])


def fg_embed_train(w, idx, g):
  """the gradient of sum(embedding(idx, w) * g) for w: a language model's token table"""
  w = w.detach().requires_grad_()
  (fg.nn.functional.embedding(idx, w) * g).sum().backward()
  return w.grad
def th_embed_train(w, idx, g):
  w = w.detach().requires_grad_()
  (torch.nn.functional.embedding(idx, w) * g).sum().backward()
  return w.grad


def fg_embed(w, idx): return fg.nn.functional.embedding(idx, w)   # a language model's token lookup
def np_embed(w, idx): return w[idx]
def th_embed(w, idx): return torch.nn.functional.embedding(idx, w)


def fg_weight_grad(g, x): return g.T @ x   # a Linear layer's weight gradient over a batch of tokens
def np_weight_grad(g, x): return g.T @ x
def th_weight_grad(g, x): return g.T @ x


def fg_xent_train(z, y):
  """forward and backward of cross_entropy over a vocabulary: the loss and the logits' gradient made together (a
  training step reads both), the gradient returned"""
  z = z.detach().requires_grad_()
  loss = fg.nn.functional.cross_entropy(z, y)
  loss.backward()
  fg.realize(loss, z.grad)
  return z.grad
def th_xent_train(z, y):
  z = z.detach().requires_grad_()
  torch.nn.functional.cross_entropy(z, y).backward()
  return z.grad


# the cases --compile also times under torch.compile (a matmul or convolution compiles to the same library call)
COMPILED = ("relu", "softmax", "layernorm", "sum")


def cases(quick: bool):
  n_ew = 1 << (20 if quick else 24)
  n_sm = 1024 if quick else 4096
  mms = (256, 512) if quick else (1024, 2048)
  rng = np.random.default_rng(0)
  r = lambda *s: rng.standard_normal(s, dtype=np.float32)   # noqa: E731
  e = n_ew.bit_length() - 1
  out = [
    (f"relu(sqrt(exp(x)*2+1)*x), 2^{e}", (fg_chain, np_chain, th_chain), (r(n_ew),), dict(rtol=1e-5, atol=1e-6)),
    (f"softmax(-1), {n_sm}x{n_sm}", (fg_softmax, np_softmax, th_softmax), (r(n_sm, n_sm),), dict(rtol=1e-4, atol=1e-7)),
    (f"layernorm(-1), {n_sm}x{n_sm}", (fg_layernorm, np_layernorm, th_layernorm), (r(n_sm, n_sm),),
     dict(rtol=1e-4, atol=1e-5)),
  ]
  rows, cls = (1024, 1000) if quick else (4096, 1000)    # an ImageNet classifier's 1000 classes: no multiple of vectors
  out.append((f"softmax(-1), {rows}x{cls}", (fg_softmax, np_softmax, th_softmax), (r(rows, cls),),
              dict(rtol=1e-4, atol=1e-7)))
  rows, cls = (2048, 100) if quick else (8192, 100)   # attention over 100 positions, a 100-class head: short rows
  out.append((f"softmax(-1), {rows}x{cls}", (fg_softmax, np_softmax, th_softmax), (r(rows, cls),),
              dict(rtol=1e-4, atol=1e-7)))
  x = r(n_ew)
  # float32 sums of 2^24 terms differ by summation order; scale the tolerance by sum(|x|)
  out.append((f"sum, 2^{e}", (fg_sum, np_sum, th_sum), (x,), dict(rtol=0, atol=1e-7 * float(np.abs(x).sum()))))
  for n in mms:
    out.append((f"matmul {n}x{n} @ {n}x{n}", (fg_matmul, np_matmul, th_matmul), (r(n, n), r(n, n)),
                dict(rtol=1e-4, atol=1e-4 * n ** 0.5)))
  b, c, hw = (2, 16, 28) if quick else (8, 64, 56)
  out.append((f"conv2d 3x3 {c}->{c}, {hw}x{hw}, batch {b}", (fg_conv, np_conv, th_conv),
              (r(b, c, hw, hw), r(c, c, 3, 3) / 24), dict(rtol=1e-4, atol=1e-4)))
  # numpy has no autograd: checked against torch's gradients
  if torch is not None:
    out.append((f"conv2d 3x3 {c}->{c}, {hw}x{hw}, batch {b}, forward+backward", (fg_conv_train, None, th_conv_train),
                (r(b, c, hw, hw), r(c, c, 3, 3) / 24, r(b, c, hw, hw)), dict(rtol=1e-3, atol=1e-2)))
    T, D = (512, 256) if quick else (4096, 768)   # GPT-2's MLP over 8 x 512 tokens: g [T, 4D], x [T, D]
    out.append((f"weight gradient g.T @ x, [{T}x{4 * D}].T @ [{T}x{D}]", (fg_weight_grad, np_weight_grad,
                th_weight_grad), (r(T, 4 * D), r(T, D)), dict(rtol=1e-4, atol=1e-4 * T ** 0.5)))
    N, V = (256, 5000) if quick else (1024, 50257)   # GPT-2's vocabulary
    out.append((f"cross_entropy {N}x{V}, forward+backward", (fg_xent_train, None, th_xent_train),
                (r(N, V), rng.integers(0, V, N)), dict(rtol=1e-4, atol=1e-6)))
    V, T, D = (5000, 256, 64) if quick else (50257, 2048, 768)   # GPT-2's vocabulary and width
    out.append((f"embedding {V}x{D} over {T} tokens", (fg_embed, np_embed, th_embed), (r(V, D), rng.integers(0, V, T)),
                dict(rtol=0, atol=0)))
    out.append((f"embedding {V}x{D} over {T} tokens, backward", (fg_embed_train, None, th_embed_train),
                (r(V, D), rng.integers(0, V, T), r(T, D)), dict(rtol=1e-4, atol=1e-4)))
  return out


# ---- timing ---------------------------------------------------------------------------------------------

# Each library's timed runs start after this pause. A library's worker threads spin for a while after its calls
# (torch's OpenMP pool, OpenBLAS's, fusegrad's); on a 2-core machine they take the cores from whoever runs next.
# Measured: fusegrad's sum 2^24 took 2.1 ms per call for all 15 runs right after a block of torch calls, 1.7 ms after
# a 0.1 s pause.
SETTLE_S = 0.25


def median_ms(fn, budget_s: float, max_runs: int = 1000) -> tuple[float, int]:
  """Median wall time of fn() over as many runs as fit in budget_s (at least one, at most max_runs), after
  SETTLE_S of quiet."""
  time.sleep(SETTLE_S)
  times = []
  start = time.perf_counter()
  while len(times) < max_runs and (not times or time.perf_counter() - start < budget_s):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times) * 1e3, len(times)


ROUNDS = 3


def rounds(timed: dict, budget_s: float) -> dict:
  """{name: (ms, runs)}: each library's best median over ROUNDS rounds of budget_s / ROUNDS each, every round
  starting with the next library. The memory bandwidth this VM gets moves with its neighbours' load by 2x within a
  minute (torch's sum 2^24: 1.49 ms, then 0.76 ms a few seconds later, same process); rounds spread over the case's
  time see each library under the same spells."""
  names, best = list(timed), {}
  for r in range(ROUNDS):
    for name in names[r % len(names):] + names[:r % len(names)]:
      ms, n = median_ms(timed[name], budget_s / ROUNDS)
      prev_ms, prev_n = best.get(name, (float("inf"), 0))
      best[name] = (min(ms, prev_ms), n + prev_n)
  return best


def blas_name() -> str:
  try:
    cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    return f"{cfg.get('name', '?')} {cfg.get('version', '')}".strip()
  except Exception:
    return "unknown BLAS"


def fg_version() -> str:
  """The commit fusegrad was loaded from, and whether its tree had uncommitted changes."""
  import subprocess
  root = os.path.dirname(os.path.dirname(os.path.abspath(fg.__file__)))
  try:
    head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          timeout=10).stdout.strip()
    dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "fusegrad"], capture_output=True,
                           text=True, timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown commit"
  return f"commit {head}{' + uncommitted changes' if dirty else ''}" if head else "not a git checkout"


def fg_threads() -> str:
  from fusegrad.runtime import device
  return str(getattr(device.get("CPU"), "threads", "?"))


def main() -> int:
  args = ARGS
  budget = args.budget if args.budget is not None else (0.3 if args.quick else 1.5)

  print(f"machine: {describe()}")
  blas_threads = os.environ.get("OPENBLAS_NUM_THREADS", "default")
  print(f"python {platform.python_version()}, numpy {np.__version__} ({blas_name()}, {blas_threads} threads), "
        f"torch {torch.__version__ + f' ({torch.get_num_threads()} threads)' if torch else 'not installed'}, "
        f"fusegrad {fg_version()}, CPU device ({fg_threads()} threads)")
  print(f"date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}"
        f"{', --quick sizes' if args.quick else ''}")
  if hasattr(os, "getloadavg"):   # other processes on the machine skew every column: say how busy it was
    print("load average before: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
  print()

  rows, failed = [], 0
  t_start = time.perf_counter()
  todo = []
  for case in cases(args.quick):
    todo.append((case, 0))
    if args.beam > 0 and case[0].startswith(("sum", "matmul")): todo.append((case, args.beam))
  for (name, (f_fg, f_np, f_th), arrays, tol), beam in todo:
    if beam: name = f"{name}, BEAM {beam}"
    xs = [fg.tensor(a, device="CPU").realize() for a in arrays]
    # warm-up: compiles the kernels (searching them with --beam); each timed run rebuilds the graph and realizes it
    with fg.beam(beam), fg.track() as tr:
      got = f_fg(*xs).realize().numpy()
    if beam: print(f"  {name}: " + "; ".join(f"{k.name} {list(k.opts)}" for k in tr.kernels), file=sys.stderr)
    kernels, kernel_s = len(tr.kernels), []

    def run_fg():
      with fg.beam(beam), fg.track() as t:   # on the CPU device tracking only reads the clock around each launch
        f_fg(*xs).realize()
      kernel_s.append(sum(k.time_s for k in t.kernels))
    timed = {"fusegrad": run_fg}

    if f_np is not None:
      ref = f_np(*arrays)
      timed["numpy"] = lambda: f_np(*arrays)
    else:
      ref = f_th(*[torch.from_numpy(a) for a in arrays]).detach().numpy()
    ok = got.shape == np.shape(ref) and np.allclose(got, ref, **tol)
    err = float(np.max(np.abs(got.astype(np.float64) - ref))) if got.shape == np.shape(ref) else float("nan")
    failed += not ok

    if torch is not None:
      ts = [torch.from_numpy(a) for a in arrays]
      f_th(*ts)   # warm-up
      timed["torch"] = lambda: f_th(*ts)
      if args.compile and not beam and name.startswith(COMPILED):
        f_tc = torch.compile(f_th)
        f_tc(*ts)   # compiles
        timed["torch.compile"] = lambda: f_tc(*ts)
    best = rounds(timed, budget)
    fg_ms, runs = best["fusegrad"]
    np_ms, th_ms, tc_ms = (best.get(k, (float("nan"), 0))[0] for k in ("numpy", "torch", "torch.compile"))
    kernel_ms = statistics.median(kernel_s) * 1e3
    rows.append((name, fg_ms, np_ms, th_ms, tc_ms, kernels, kernel_ms, runs,
                 "PASS" if ok else f"FAIL (max err {err:.3g})"))
    print(f"  {name}: fusegrad {fg_ms:.2f} ms ({runs} runs), numpy {np_ms:.2f} ms, torch {th_ms:.2f} ms"
          + (f", torch.compile {tc_ms:.2f} ms" if tc_ms == tc_ms else "") + f", max abs err {err:.2g}", file=sys.stderr)

  def fmt(ms): return "n/a" if ms != ms else (f"{ms:.3f}" if ms < 1 else f"{ms:.1f}" if ms < 1000 else f"{ms:.0f}")
  def ratio(a, b): return "n/a" if a != a else f"{a / b:.2f}x"
  tc = args.compile and torch is not None
  print("| case | fusegrad ms | numpy ms | torch ms | " + ("torch.compile ms | " if tc else "") + "numpy/fusegrad | "
        "torch/fusegrad | " + ("torch.compile/fusegrad | " if tc else "") + "kernels | fusegrad kernel ms | check |")
  print("|---|" + "---:|" * (8 if tc else 7) + "---|")
  for name, f, n, t, c, k, kms, runs, check in rows:
    print(f"| {name} | {fmt(f)} | {fmt(n)} | {fmt(t)} | " + (f"{fmt(c)} | " if tc else "") + f"{ratio(n, f)} | "
          f"{ratio(t, f)} | " + (f"{ratio(c, f)} | " if tc else "") + f"{k} | {fmt(kms)} | {check} |")
  print(f"\nmedian wall time per call, each library's best of {ROUNDS} rounds; ratios above 1x mean fusegrad is "
        f"faster. 'fusegrad kernel ms' is the "
        f"median time inside the kernels themselves (fusegrad.track()); the rest of 'fusegrad ms' is graph building, "
        f"scheduling and launch overhead. Total bench time {time.perf_counter() - t_start:.0f} s"
        + (f", load average after: {os.getloadavg()[0]:.2f}." if hasattr(os, "getloadavg") else "."))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
