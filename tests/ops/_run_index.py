"""A small local runner for table_index.py until tests/ops/test_matrix.py exists: `python tests/ops/_run_index.py [names]`."""
from __future__ import annotations
import sys
import traceback
import numpy as np
import torch
sys.path[:0] = [".", "tests/ops"]
import fusegrad as fg  # noqa: E402
from table_index import CASES  # noqa: E402


def draw(case, rng, shape, dn):
  if case.gen is not None: return case.gen(rng, shape, dn)
  if dn == "bool": return rng.random(shape) < 0.5
  if dn.startswith("int") or dn.startswith("uint"): return rng.integers(int(case.low), int(case.high), shape).astype(dn)
  return rng.uniform(case.low, case.high, shape).astype(dn)


def flat(o): return [x for y in o for x in flat(y)] if isinstance(o, (tuple, list)) else [o]


def run(case, rng, device="CPU"):
  for shapes in case.shapes:
    for dn in case.dtypes:
      arrs = [draw(case, rng, s, dn) for s in shapes]
      tin = [torch.tensor(a, requires_grad=case.grad and a.dtype.kind == "f") for a in arrs]
      fin = [fg.tensor(a, device=device, requires_grad=case.grad and a.dtype.kind == "f") for a in arrs]
      try: tout = flat(case.fn(torch, *tin))
      except Exception as e:
        try: case.fn(fg, *fin)
        except Exception as e2:
          if type(e2) is not type(e) and not isinstance(e2, type(e)):
            raise AssertionError(f"{shapes} {dn}: torch raised {type(e).__name__}: {e}; fusegrad {type(e2).__name__}: {e2}")
          continue
        raise AssertionError(f"{shapes} {dn}: torch raised {type(e).__name__}: {e}; fusegrad did not")
      fout = flat(case.fn(fg, *fin))
      assert len(fout) == len(tout), (len(fout), len(tout))
      tol = dict(rtol=case.rtol if case.rtol is not None else 1e-5, atol=case.atol if case.atol is not None else 1e-5)
      for t, f in zip(tout, fout):
        if not isinstance(t, torch.Tensor): assert t == f, (t, f); continue
        fv = f.numpy()
        assert tuple(t.shape) == fv.shape, f"{shapes} {dn}: shape {fv.shape} vs torch {tuple(t.shape)}"
        assert str(t.dtype).split(".")[1] == f.dtype.name, f"{shapes} {dn}: dtype {f.dtype.name} vs {t.dtype}"
        np.testing.assert_allclose(fv.astype(np.float64), t.detach().numpy().astype(np.float64), **tol,
                                   err_msg=f"{case.name} {shapes} {dn} value")
      if not case.grad: continue
      fl = [(t, f) for t, f in zip(tout, fout) if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.requires_grad]
      if not fl or not any(a.requires_grad for a in tin): continue
      ws = [rng.uniform(-1, 1, tuple(t.shape)).astype(np.float32) for t, _ in fl]
      sum(((t * torch.tensor(w)).sum() for (t, _), w in zip(fl, ws))).backward()
      sum(((f * fg.tensor(w, device=device)).sum() for (_, f), w in zip(fl, ws))).backward()
      for i, (a, b) in enumerate(zip(tin, fin)):
        if not a.requires_grad: continue
        tg = a.grad.numpy() if a.grad is not None else np.zeros(a.shape, a.detach().numpy().dtype)
        fgr = b.grad.numpy() if b.grad is not None else np.zeros(a.shape, a.detach().numpy().dtype)
        np.testing.assert_allclose(fgr, tg, **tol, err_msg=f"{case.name} {shapes} {dn} grad of input {i}")


if __name__ == "__main__":
  names = sys.argv[1:]
  dev = "CPU"
  if names and names[0].startswith("--dev="): dev, names = names[0][6:], names[1:]
  bad = 0
  for c in CASES:
    if names and not any(c.name.startswith(n) for n in names): continue
    try: run(c, np.random.default_rng(), dev)
    except Exception as e:
      bad += 1
      print(f"FAIL {c.name}: {type(e).__name__}: {str(e)[:600]}")
      if "-v" in sys.argv: traceback.print_exc()
  print(f"{bad} failed")
