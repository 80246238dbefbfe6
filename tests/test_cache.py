"""The on-disk program cache, across processes: a second run compiles nothing and agrees with the first; a
cache whose files were damaged in any way is rebuilt, never loaded, and the answers stay right.

Each run is a fresh interpreter (sys.executable -c ...) with FUSEGRAD_CACHE_DIR pointing at a temporary dir.
"""
from __future__ import annotations
import hashlib
import json
import os
import subprocess
import sys
import numpy as np
import pytest
from conftest import DEVICES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# several distinct kernels (elementwise, reduce, matmul, softmax, a view), fixed data, values out as JSON
CHILD = r"""
import json, sys
import numpy as np
import fusegrad as fg
from fusegrad.runtime import device as rd
dev = sys.argv[1]
x = fg.tensor(np.linspace(-2, 2, 48, dtype=np.float32).reshape(6, 8), device=dev)
w = fg.tensor(np.cos(np.arange(40, dtype=np.float32)).reshape(8, 5), device=dev)
outs = [((x + 1) * x).exp(), x.sum(1), (x @ w).relu(), x.softmax(-1), x.permute(1, 0)[::2] * 3, x.amax(0) - x.min(),
        x.flip(0).pad((1, 1)).tanh(), (x * 2).sum(0, keepdim=True) + x, x.argmax(1), x[2:5].abs().sqrt()]
print(json.dumps({"values": [o.numpy().astype(float).ravel().tolist() for o in outs],
                  "compiles": rd.get(dev).compiles}))
"""


def np_expected() -> list:
  x = np.linspace(-2, 2, 48, dtype=np.float32).reshape(6, 8).astype(np.float64)
  w = np.cos(np.arange(40, dtype=np.float32)).reshape(8, 5).astype(np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  outs = [np.exp((x + 1) * x), x.sum(1), np.maximum(x @ w, 0), e / e.sum(-1, keepdims=True), x.T[::2] * 3,
          x.max(0) - x.min(), np.tanh(np.pad(x[::-1], ((0, 0), (1, 1)))), (x * 2).sum(0, keepdims=True) + x,
          x.argmax(1), np.sqrt(np.abs(x[2:5]))]
  return [o.ravel() for o in outs]


CACHE_DEVICES = [d for d in DEVICES if d != "PYTHON"]


def run_child(cache_dir, device: str, **extra_env) -> dict:
  drop = ("FUSEGRAD_CACHE_DIR", "FUSEGRAD_NO_DISK_CACHE", "FUSEGRAD_DEBUG", "FUSEGRAD_DEVICE")
  env = {k: v for k, v in os.environ.items() if k not in drop}
  env.update(FUSEGRAD_CACHE_DIR=str(cache_dir), PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), **extra_env)
  r = subprocess.run([sys.executable, "-c", CHILD, device], capture_output=True, text=True, env=env, cwd=ROOT,
                     timeout=300)
  assert r.returncode == 0, f"child failed:\n{r.stdout}\n{r.stderr}"
  return json.loads(r.stdout.strip().splitlines()[-1])


def check_values(result: dict) -> None:
  for got, ref in zip(result["values"], np_expected(), strict=True):
    np.testing.assert_allclose(np.array(got), ref, rtol=2e-5, atol=1e-5)


def cache_files(cache_dir) -> list[str]:
  return sorted(os.path.join(d, f) for d, _, fs in os.walk(cache_dir) for f in fs if f.endswith(".bin"))


def corrupt_all(files: list[str]) -> None:
  """Damage every entry: six kinds of damage in turn, and one entry renamed onto another key's name."""
  assert len(files) >= 8, files
  # rename: key A's (valid) entry now sits under key B's name, and A's own entry is gone
  os.replace(files[-2], files[-1])
  for i, path in enumerate(files[:-2]):
    with open(path, "rb") as f: data = f.read()
    header, _, payload = data.partition(b"\n")
    kind = i % 6
    if kind == 0: data = data[:len(data) // 2]                                   # truncated
    elif kind == 1: data = b""                                                   # empty
    elif kind == 2:                                                              # flipped bytes in the payload
      p = bytearray(payload)
      for j in range(0, len(p), max(1, len(p) // 16)): p[j] ^= 0xFF
      data = header + b"\n" + bytes(p)
    elif kind == 3:                                                              # header lies about the size
      data = header.replace(b'"size": ', b'"size": 1') + b"\n" + payload
    elif kind == 4: data = b"\x7fELF not a fusegrad cache entry\n" + os.urandom(300)   # foreign content
    else:                                                                        # flipped bytes in the header
      data = bytes(b ^ 0x20 for b in header[:20]) + header[20:] + b"\n" + payload
    assert data != header + b"\n" + payload
    with open(path, "wb") as f: f.write(data)


def forge_all(files: list[str]) -> None:
  """Replace every payload by garbage under a well-formed header (right key, size and checksum)."""
  for path in files:
    with open(path, "rb") as f: header = json.loads(f.readline())
    payload = b"\x7fELF" + os.urandom(4000)
    header.update(size=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    with open(path, "wb") as f: f.write(json.dumps(header).encode() + b"\n" + payload)


@pytest.mark.parametrize("device", CACHE_DEVICES)
def test_disk_cache_across_processes(tmp_path, device):
  cache_dir = tmp_path / "cache"
  first = run_child(cache_dir, device)
  assert first["compiles"] > 0
  check_values(first)
  files = cache_files(cache_dir)
  assert len(files) >= 8, files      # one entry per distinct kernel

  second = run_child(cache_dir, device)
  assert second["compiles"] == 0, "the second process compiled although every kernel was cached"
  assert second["values"] == first["values"]
  assert cache_files(cache_dir) == files

  corrupt_all(files)
  third = run_child(cache_dir, device)
  assert third["compiles"] > 0
  assert third["compiles"] == first["compiles"], "every damaged entry must be rebuilt"
  check_values(third)
  assert third["values"] == first["values"]

  # the rebuilt entries are good again
  fourth = run_child(cache_dir, device)
  assert fourth["compiles"] == 0
  assert fourth["values"] == first["values"]


@pytest.mark.parametrize("device", [
  "CPU",
  *CACHE_DEVICES[1:]])
def test_well_formed_entry_with_bad_binary_is_rebuilt(tmp_path, device):
  # an entry can pass every header check and still hold a binary that does not load (written by another
  # build of the toolchain, a bad disk, a buggy writer): the device must fall back to compiling
  cache_dir = tmp_path / "cache"
  first = run_child(cache_dir, device)
  forge_all(cache_files(cache_dir))
  again = run_child(cache_dir, device)
  assert again["compiles"] == first["compiles"]
  assert again["values"] == first["values"]


def test_cpu_device_leaves_no_temporary_files(tmp_path):
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  check_values(run_child(tmp_path / "cache", "CPU", TMPDIR=str(tmp)))
  assert list(tmp.iterdir()) == []
