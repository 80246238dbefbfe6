"""fusegrad.save / fusegrad.load: PyTorch's `torch.save(model.state_dict(), path)` idiom, written as safetensors
through fusegrad.nn.state, never pickle.

What can be saved is what nn/state.py's `save` stores: dicts (str or int keys), lists and tuples nesting Tensors,
numbers, bools, None and strings (a Module's state_dict, an optimizer's, a checkpoint dict of both with the
step count). A flat {name: Tensor} is a plain safetensors file that `safetensors.torch.load_file` reads as is;
any safetensors file (one written by `safetensors.torch.save_file`) loads as {name: Tensor}. Anything else (a
Module object, a function, a custom class) is refused with the reason, and so is a pickled PyTorch file: fusegrad
never unpickles (unpickling runs code the file carries). `load` explains how to convert one.
"""
from __future__ import annotations
import os
import tempfile

__all__ = ["save", "load"]

_CONVERT = ("convert it once with PyTorch: `import torch; from safetensors.torch import save_file; "
            "save_file(torch.load(path, map_location='cpu', weights_only=True), 'model.safetensors')` for a "
            "state dict of tensors (flatten nested objects first), then fusegrad.load('model.safetensors')")


def _target_device(map_location):
  """fusegrad's device name for map_location: None (the default device), a name or a fusegrad.device."""
  if map_location is None: return None
  if callable(map_location) or isinstance(map_location, dict):
    raise TypeError("fusegrad.load: map_location must be None, a device name or a fusegrad.device (a dict or a "
                    "function remaps storages of a pickle, which fusegrad does not read)")
  from fusegrad.runtime import device as rd
  return rd.canonical(map_location)


def save(obj, f, pickle_module=None, pickle_protocol=None, _use_new_zipfile_serialization=True) -> None:
  """Write obj (see the module docstring) to f, a path or a binary file object, as safetensors."""
  from fusegrad.nn.module import Module
  from fusegrad.nn import state as _state   # safetensors is imported on first use, as by fusegrad.nn.state
  if pickle_module is not None: raise TypeError("fusegrad.save writes safetensors; it has no pickle_module")
  if isinstance(obj, Module):
    raise TypeError(f"fusegrad.save cannot store a {type(obj).__name__} module object (that needs pickle); save its "
                    f"weights with fusegrad.save(model.state_dict(), path) and rebuild the model in code")
  try:
    if hasattr(f, "write"):
      with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "state.safetensors")
        _state.save(obj, p)
        with open(p, "rb") as fh: f.write(fh.read())
    else:
      _state.save(obj, f)
  except TypeError as e:
    raise TypeError(f"fusegrad.save stores safetensors, not pickle: {e}") from None


def _check_not_pickle(head: bytes, name: str) -> None:
  from fusegrad.nn import state as _state
  if head[:4] == b"PK\x03\x04":
    raise _state.StateFileError(f"{name}: this is a PyTorch file in torch.save's zip (pickle) format; fusegrad never "
                                f"unpickles (unpickling runs code the file carries). To use it, {_CONVERT}")
  # (a safetensors file starts with its header's length, 8 bytes little-endian, then the header's "{": a length of
  # 128 mod 256 also starts with 0x80, the byte a pickle starts with)
  if head[:1] == b"\x80" and head[8:9] != b"{":
    raise _state.StateFileError(f"{name}: this is a pickle file (legacy torch.save format); fusegrad never unpickles "
                                f"(unpickling runs code the file carries). To use it, {_CONVERT}")


def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **pickle_load_args):
  """The object `save` wrote (or {name: Tensor} of any safetensors file), from a path or a binary file object,
  with its tensors on map_location (default: fusegrad's default device). weights_only is accepted: a
  safetensors file holds nothing but data, so loading is always weights-only."""
  from fusegrad.nn import state as _state
  if pickle_module is not None: raise TypeError("fusegrad.load reads safetensors; it has no pickle_module")
  device = _target_device(map_location)
  if hasattr(f, "read"):
    data = f.read()
    _check_not_pickle(data[:9], getattr(f, "name", "<file object>"))
    with tempfile.TemporaryDirectory() as d:
      p = os.path.join(d, "state.safetensors")
      with open(p, "wb") as fh: fh.write(data)
      return _state.load(p, device=device)
  path = os.fspath(f)
  if os.path.isfile(path):
    with open(path, "rb") as fh: _check_not_pickle(fh.read(9), path)
  return _state.load(path, device=device)
