"""The BEAM search (codegen/opt/search.py): what it picks is legal and computes what the unoptimized kernel does,
a wrong candidate is never picked, results are kept on disk and reused without searching, and FUSEGRAD_BEAM /
fusegrad.beam(n) run searched kernels with the same numbers."""
from __future__ import annotations
import os
import subprocess
import sys
import numpy as np
import pytest
import fusegrad as fg
from fusegrad import config
from fusegrad.codegen.opt import Opt, OptOp, OptError, apply_opts, search, heuristic
from fusegrad.runtime import cache, device as rd
from fusegrad.runtime.python import PythonDevice
from tests.unit.kernels import one_kernel, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICES = ["CPU", "PYTHON"]


def _kernel(name: str, rng, device: str):
  t = lambda *s: fg.Tensor(rng.standard_normal(s).astype(np.float32), device=device)
  a, b = t(64, 64), t(64, 64)
  fg.realize(a, b)
  an, bn = a.numpy().astype(np.float64), b.numpy().astype(np.float64)
  if name == "matmul": return one_kernel(a @ b), an @ bn
  if name == "sum": return one_kernel(a.sum(1)), an.sum(1)
  if name == "elementwise": return one_kernel((a * 2 + 1).exp()), np.exp(an * 2 + 1)
  if name == "int_sum":
    x = fg.Tensor(rng.integers(-50, 50, (16, 64)).astype(np.int32), device=device)
    fg.realize(x)
    return one_kernel(x.sum(1)), x.numpy().sum(1)
  raise KeyError(name)


@pytest.fixture
def fresh(monkeypatch):
  """Search results of this test only (keys of their own, nothing remembered), short searches."""
  monkeypatch.setattr(search, "SEARCH_VERSION", "test-" + os.urandom(8).hex())
  monkeypatch.setattr(search, "MAX_ROUNDS", 2)
  monkeypatch.setattr(search, "MAX_CANDIDATES", 30)
  monkeypatch.setattr(search, "_memo", {})
  yield


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["matmul", "sum", "elementwise", "int_sum"])
def test_search_result_is_legal_and_matches(name, device, rng):
  item, want = _kernel(name, rng, device)
  dev = rd.get(device)
  # the interpreter is slow: fewer candidates there
  opts = search.beam_search(item.kernel, dev, 2, max_rounds=2, max_candidates=60 if device == "CPU" else 30)
  assert all(isinstance(o, Opt) for o in opts)
  apply_opts(item.kernel, opts, dev.caps)   # legal: raises OptError otherwise
  got = run(item, opts, device)
  if want.dtype.kind == "i": np.testing.assert_array_equal(got, want)
  else: np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
  np.testing.assert_allclose(got, run(item, (), device), rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_candidates_are_legal_and_follow_the_device(rng):
  item, _ = _kernel("sum", rng, "PYTHON")
  py, cpu = rd.get("PYTHON").caps, rd.get("CPU").caps
  acts = search.candidate_actions(item.kernel, py)
  ops = {o.op for o in acts}
  assert {OptOp.UPCAST, OptOp.UNROLL, OptOp.LOCAL, OptOp.GROUP} <= ops
  for o in acts: apply_opts(item.kernel, (o,), py)
  assert not {o.op for o in search.candidate_actions(item.kernel, cpu)} & {OptOp.LOCAL, OptOp.GROUP}   # no work-groups


class _Liar(PythonDevice):
  """An interpreter that, for any kernel with an UPCAST, returns at once with a wrong output (the fastest
  candidate by far, and wrong), and fails to run any kernel with an UNROLL."""
  def launch(self, program, kernel, handles):
    if any(o.op is OptOp.UPCAST for o in kernel.opts):
      handles[0][:] = 0x3f
      return
    if any(o.op is OptOp.UNROLL for o in kernel.opts): raise RuntimeError("the device lost this kernel")
    super().launch(program, kernel, handles)


def test_a_wrong_candidate_is_never_chosen(rng):
  item, want = _kernel("sum", rng, "PYTHON")
  liar = _Liar()
  rejected = search.stats["rejected"]
  opts = search.beam_search(item.kernel, liar, 4, max_rounds=3)
  assert search.stats["rejected"] > rejected, "the wrong candidates were not even tried"
  assert not any(o.op in (OptOp.UPCAST, OptOp.UNROLL) for o in opts), opts
  np.testing.assert_allclose(run(item, opts, "PYTHON"), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_matches_checks_values_nan_and_exact_ints():
  from fusegrad.codegen.ir import Kernel, BufferArg
  f32 = Kernel("k", (BufferArg(fg.float32, 3, True),), (), ())
  i32 = Kernel("k", (BufferArg(fg.int32, 3, True),), (), ())
  ref = [np.array([1.0, -2.0, np.nan], np.float32)]
  assert search.matches([np.array([1.00001, -2.0, np.nan], np.float32)], ref, f32)
  assert not search.matches([np.array([1.1, -2.0, np.nan], np.float32)], ref, f32)
  assert not search.matches([np.array([1.0, -2.0, 0.0], np.float32)], ref, f32)
  assert not search.matches([np.array([1, 2, 4], np.int32)], [np.array([1, 2, 3], np.int32)], i32)


def test_disk_cache_round_trip_reuses_results(fresh, rng):
  item, _ = _kernel("sum", rng, "CPU")
  dev = rd.get("CPU")
  s0 = dict(search.stats)
  opts = search.searched_opts(item.kernel, dev, 2)
  assert search.stats["searches"] == s0["searches"] + 1 and search.stats["timed"] > s0["timed"]
  search.forget()   # a new process as far as remembered results go
  s1 = dict(search.stats)
  assert search.searched_opts(item.kernel, dev, 2) == opts
  assert search.stats["searches"] == s1["searches"] and search.stats["timed"] == s1["timed"]
  assert search.stats["disk_hits"] == s1["disk_hits"] + 1
  # another width is another entry
  search.searched_opts(item.kernel, dev, 1)
  assert search.stats["searches"] == s1["searches"] + 1


def test_a_new_heuristic_or_caps_searches_again(fresh, rng, monkeypatch):
  """The search starts from the heuristic's actions: a result found under another heuristic or other caps may be
  slower than today's default, so either is part of the disk key."""
  from dataclasses import replace
  item, _ = _kernel("sum", rng, "PYTHON")
  dev = rd.get("PYTHON")
  key = search.cache_key(item.kernel, dev, 2)
  assert search.cache_key(item.kernel, dev, 2) == key
  monkeypatch.setattr(heuristic, "hand_coded", lambda k, caps: [Opt(OptOp.UNROLL, 1, 2)])
  assert search.cache_key(item.kernel, dev, 2) != key
  monkeypatch.undo()
  monkeypatch.setattr(dev, "_caps", replace(dev.caps, max_registers=dev.caps.max_registers + 1))
  assert search.cache_key(item.kernel, dev, 2) != key


def test_bad_cache_entries_are_ignored(fresh, rng, monkeypatch):
  item, _ = _kernel("sum", rng, "PYTHON")
  dev = rd.get("PYTHON")
  calls = []
  found = (Opt(OptOp.UNROLL, 1, 4),)
  monkeypatch.setattr(search, "beam_search", lambda k, d, w: calls.append(w) or found)
  key = search.cache_key(item.kernel, dev, 2)
  assert search.searched_opts(item.kernel, dev, 2) == found and len(calls) == 1
  path = search.store.path(key)
  assert path is not None and os.path.exists(path)
  search.forget()
  assert search.searched_opts(item.kernel, dev, 2) == found and len(calls) == 1   # a disk hit
  for bad in (b"not json", b'{"opts": [["NOPE", 0, 2]]}', b'{"opts": [["UPCAST", 0]]}', b'{"opts": [["UPCAST", 0, 2.5]]}',
              search.encode((Opt(OptOp.UPCAST, 7, 3),))):   # the last parses but does not apply
    search.store.put(key, bad)
    search.forget()
    n = len(calls)
    assert search.searched_opts(item.kernel, dev, 2) == found and len(calls) == n + 1, bad
  # a corrupted file (its authentication fails) is a miss too
  with open(path, "r+b") as f:
    f.seek(-3, os.SEEK_END)
    f.write(b"xyz")
  search.forget()
  n = len(calls)
  assert search.searched_opts(item.kernel, dev, 2) == found and len(calls) == n + 1


CHILD = """
import numpy as np, fusegrad as fg
from fusegrad.codegen.opt import search
x = fg.Tensor(np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 100, device="PYTHON")
with fg.track() as t: y = x.sum(1).numpy()
print(search.stats["searches"], search.stats["timed"], search.stats["disk_hits"], t.kernels[-1].opts, float(y.sum()))
"""


def test_a_later_process_reuses_results(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ("FUSEGRAD_DEBUG", "FUSEGRAD_NO_DISK_CACHE")}
  env.update(FUSEGRAD_CACHE_DIR=str(tmp_path / "cache"), FUSEGRAD_BEAM="2",
             PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
  outs = []
  for _ in range(2):
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    outs.append(r.stdout.split(maxsplit=3))
  (s1, t1, h1, rest1), (s2, t2, h2, rest2) = outs
  assert (s1, h1) == ("1", "0") and int(t1) > 0
  assert (s2, t2, h2) == ("0", "0", "1")   # no search, no timing: read from disk
  assert rest1 == rest2   # the same actions and the same sum


@pytest.mark.parametrize("device", DEVICES)
def test_beam_api_gives_the_default_numbers_and_track_shows_the_opts(fresh, device, rng, monkeypatch):
  an, bn = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
  f = lambda: fg.Tensor(an, device=device) @ fg.Tensor(bn, device=device)
  default = f().numpy()
  chosen = []
  real = search.searched_opts
  kernels = []
  monkeypatch.setattr(search, "searched_opts", lambda k, d, w: kernels.append(k) or chosen.append(real(k, d, w)) or chosen[-1])
  with fg.beam(2):
    assert config.BEAM == 2
    with fg.track() as t: got = f().numpy()
  assert config.BEAM == 0
  assert len(chosen) == 1, "the matmul kernel was not searched"
  assert [k.opts for k in t.kernels] == [chosen[0]]
  np.testing.assert_allclose(got, default, rtol=1e-4, atol=1e-4 * np.abs(default).max())
  np.testing.assert_allclose(got, an.astype(np.float64) @ bn, rtol=1e-4, atol=1e-3)
  # out of the block the heuristic's kernel runs again
  from fusegrad.codegen.opt import heuristic
  with fg.track() as t: f().numpy()
  assert t.kernels[-1].opts == tuple(heuristic.hand_coded(kernels[0], rd.get(device).caps))


def test_beam_width_must_be_a_count():
  with pytest.raises(ValueError, match="width must be an integer >= 0, got -1"):
    with fg.beam(-1): pass
  with pytest.raises(ValueError, match="beam_width must be >= 1"):
    search.beam_search(None, rd.get("PYTHON"), 0)
