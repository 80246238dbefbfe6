"""Shared fixtures: every device the machine has, fresh random inputs, hypothesis settings."""
from __future__ import annotations
import os
import numpy as np
import pytest
from hypothesis import settings, HealthCheck

settings.register_profile("fusegrad", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False)
settings.load_profile("fusegrad")


def _has_opencl() -> bool:
  try:
    from fusegrad.runtime import device
    device.get("OPENCL")
    return True
  except Exception:
    return False


DEVICES = ["CPU", "PYTHON"] + (["OPENCL"] if _has_opencl() else [])
if os.environ.get("CI") and "OPENCL" not in DEVICES:
  raise RuntimeError("CI must test the OPENCL device: pyopencl with PoCL is part of the test set-up")


@pytest.fixture(params=DEVICES)
def device(request) -> str:
  return request.param


@pytest.fixture
def traced(monkeypatch):
  """traced(flag): checked traces (engine/trace.py) on or off for the test, each run without recorded traces."""
  from fusegrad.engine import trace

  def on(flag: bool):
    monkeypatch.setattr(trace, "ENABLED", flag)
    trace._traces.clear()
    trace._dropped.clear()
    trace._seg[0] = None
  yield on
  trace._traces.clear()
  trace._seg[0] = None


@pytest.fixture
def rng() -> np.random.Generator:
  # fresh inputs on every run; the seed is printed on failure so a run can be reproduced (FUSEGRAD_TEST_SEED=N)
  seed = int(os.environ.get("FUSEGRAD_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
  print(f"numpy seed {seed}")
  return np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def _no_runtime_sizes_left():
  """Each test starts as a fresh process does, before any fusegrad.Variable is bound: binding one sets a
  process-wide flag (graph/dims.bound_any) that turns forward templates off and keys nodes by their runtime sizes,
  so a test that counts template hits or kernels would depend on which tests ran before it in its worker. (The
  graphs of earlier tests are dead by then: no shape of a live node holds a runtime size.)"""
  from fusegrad.graph import dims
  dims.bound_any[0] = False
  yield


# files whose OPENCL rows run in `make test-ops` (see below): the per-operator tests, the layers built of many
# operators (nn layers, transformer and recurrent layers: a minute and a half of PoCL compiles on a fresh machine),
# the graph templates' library functions and training steps, and the optimizers' trajectories against torch's
# (their logic is the device's elementwise kernels: the CPU and PYTHON rows cover it)
OPS_FILES = ("test_ops.py", "test_autograd.py", "test_transformer.py", "test_rnn.py", "test_nn_layers.py",
             "test_templates.py", "test_optim.py", "test_numerics.py")


def pytest_collection_modifyitems(config, items):
  """The OPENCL cases of the per-operator tests (forward: tests/test_ops.py, gradients: tests/test_autograd.py) are
  operator-matrix variants (ops_full): on a fresh machine each is a PoCL compile, about half of `make test`'s cold
  time, for cases the CPU and PYTHON rows of the same tests cover in the normal suite; `make test-ops` (CI runs it
  too) runs them, with the OPENCL cases of the nn layers', transformer's and recurrent layers' tests (whole layers
  of those operators, forward and backward) and of the numerics tests (the operators' statistics against float64). The OPENCL device keeps its own tests in the normal suite (fusion,
  vectors, half, jit, ...)."""
  for item in items:
    spec = getattr(item, "callspec", None)
    if item.path.name in OPS_FILES and spec is not None and spec.params.get("device") == "OPENCL":
      item.add_marker(pytest.mark.ops_full)
      item.add_marker(pytest.mark.slow)
