"""Weights on disk as safetensors (https://github.com/huggingface/safetensors), never pickle.

save_file / load_file: a flat `{name: Tensor}` (a Module's state_dict), readable by every safetensors loader.
save / load: any nesting of dicts, lists and tuples (an optimizer's state_dict): Tensors go into the tensor table
under dotted names (`state.0.exp_avg`), and the structure with every other leaf (numbers, bools, None, strings)
is one JSON string in the metadata under `__fusegrad_state__`, so load rebuilds the same object (int keys as
ints, tuples as tuples, one Tensor referenced twice as one Tensor).
read_header / read_metadata: names, shapes and dtypes (or the text metadata) without reading tensor bytes.

Every fusegrad dtype round-trips bit for bit (bfloat16 as raw bits: numpy has no bfloat16). Files are
checked before any tensor is read; a missing file raises FileNotFoundError, anything else wrong with it
StateFileError (a ValueError), naming the path and the problem. Saves go to a temporary file in the same
directory that is renamed over the target, so an interrupted save never leaves a partial file under its name.
"""
from __future__ import annotations
import json
import math
import os
import uuid
import numpy as np
import safetensors
from fusegrad import dtype as dt
from fusegrad.dtype import DType
from fusegrad.tensor import Tensor
from fusegrad.graph.dims import from_storage
from fusegrad.runtime import device as rd
from fusegrad.graph import node as gn

__all__ = ["save_file", "load_file", "save", "load", "read_header", "read_metadata", "StateFileError"]

STATE_KEY = "__fusegrad_state__"
_FORMAT = "fusegrad.state/1"
_MAX_HEADER = 100_000_000     # safetensors' own limit
# nesting of a saved structure (an optimizer's state_dict is 4 deep): deeper is refused on save and on load, where
# it would otherwise end in a RecursionError from the JSON parser or the decoder
MAX_DEPTH = 100

# safetensors' dtype codes -> (itemsize, fusegrad dtype or None where fusegrad has none)
_CODES = {"BOOL": (1, dt.bool_), "U8": (1, dt.uint8), "I8": (1, dt.int8), "I16": (2, dt.int16), "U32": (4, dt.uint32),
          "I32": (4, dt.int32), "I64": (8, dt.int64), "F16": (2, dt.float16), "BF16": (2, dt.bfloat16),
          "F32": (4, dt.float32), "F64": (8, dt.float64), "U16": (2, None), "U64": (8, None), "C64": (8, None),
          "F8_E4M3": (1, None), "F8_E5M2": (1, None), "F8_E4M3FNUZ": (1, None), "F8_E5M2FNUZ": (1, None),
          "F8_E8M0": (1, None)}
_CODE_OF = {d: c for c, (_, d) in _CODES.items() if d is not None}
# numpy dtypes for reading through safe_open (bfloat16 is read as raw uint16 bits)
_NP = {dt.bool_: np.bool_, dt.uint8: np.uint8, dt.int8: np.int8, dt.int16: np.int16, dt.uint32: np.uint32,
       dt.int32: np.int32, dt.int64: np.int64, dt.float16: np.float16, dt.bfloat16: np.uint16, dt.float32: np.float32,
       dt.float64: np.float64}


class StateFileError(ValueError):
  """A file that is not a valid safetensors file (truncated, garbage, a header that does not match its data)."""


# ---- reading the header --------------------------------------------------------------------------------

def _fail(path, what: str):
  raise StateFileError(f"{os.fspath(path)}: {what}")


def _parse(path) -> tuple[dict, dict, int]:
  """Validated header: ({name: (code, shape, (begin, end))} in data order, metadata, offset of the data)."""
  path = os.fspath(path)
  try:
    f = open(path, "rb")
  except FileNotFoundError:
    raise FileNotFoundError(f"{path}: no such file") from None
  except IsADirectoryError:
    raise IsADirectoryError(f"{path}: is a directory, not a safetensors file") from None
  with f:
    size = os.fstat(f.fileno()).st_size
    head = f.read(8)
    if len(head) < 8:
      _fail(path, f"truncated or not a safetensors file: {size} bytes, fewer than the 8-byte header length")
    n = int.from_bytes(head, "little")
    if n > size - 8:
      _fail(path, f"truncated or not a safetensors file: the header length field says {n} bytes but only {size - 8} "
                  f"follow it")
    if n > _MAX_HEADER: _fail(path, f"header of {n} bytes is larger than safetensors' limit of {_MAX_HEADER}")
    raw = f.read(n)
  if len(raw) != n: _fail(path, f"truncated: read {len(raw)} of {n} header bytes")

  def pairs(kv):
    keys = [k for k, _ in kv]
    if len(set(keys)) != len(keys):
      _fail(path, f"header lists a name twice: {sorted({k for k in keys if keys.count(k) > 1})}")
    return dict(kv)
  try:
    hdr = json.loads(raw.decode("utf-8"), object_pairs_hook=pairs)
  except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
    _fail(path, f"not a safetensors file: the {n}-byte header is not JSON ({e})")
  if not isinstance(hdr, dict):
    _fail(path, f"not a safetensors file: the header is a JSON {type(hdr).__name__}, not an object")
  meta = hdr.pop("__metadata__", None) or {}
  if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
    _fail(path, "__metadata__ must map strings to strings")
  entries = {}
  for name, e in hdr.items():
    if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
      _fail(path, f"tensor {name!r}: entry must have exactly dtype, shape and data_offsets, got {e!r}"[:300])
    code, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
    if code not in _CODES: _fail(path, f"tensor {name!r}: unknown dtype {code!r}")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
      _fail(path, f"tensor {name!r}: shape must be a list of non-negative ints, got {shape!r}")
    if (not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs)
        or not 0 <= offs[0] <= offs[1]):
      _fail(path, f"tensor {name!r}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offs!r}")
    need = math.prod(shape) * _CODES[code][0]
    if offs[1] - offs[0] != need:
      _fail(path, f"tensor {name!r}: shape {shape} of {code} needs {need} bytes but its data_offsets {offs} span "
                  f"{offs[1] - offs[0]}")
    entries[name] = (code, tuple(shape), tuple(offs))
  entries = dict(sorted(entries.items(), key=lambda kv: kv[1][2]))
  pos = 0
  for name, (_, _, (b, e)) in entries.items():
    if b != pos:
      _fail(path, f"tensor {name!r}: data starts at byte {b} but the previous tensor ends at {pos} "
                  f"({'overlap' if b < pos else 'gap'} in the data)")
    pos = e
  have = size - 8 - n
  if pos > have: _fail(path, f"truncated: the header describes {pos} bytes of tensor data but the file holds {have}")
  if pos < have:
    _fail(path, f"the header describes {pos} bytes of tensor data but the file holds {have} (trailing bytes)")
  return entries, meta, 8 + n


def read_header(path) -> dict[str, tuple[tuple, DType | str]]:
  """`{name: (shape, dtype)}` of a safetensors file, in data order, reading only its header.

  dtype is a fusegrad DType, or the safetensors code (e.g. 'U16') for the few dtypes fusegrad lacks."""
  entries, _, _ = _parse(path)
  return {k: (shape, _CODES[code][1] or code) for k, (code, shape, _) in entries.items()}


def read_metadata(path) -> dict[str, str]:
  """The text metadata of a safetensors file (its `__metadata__`), reading only its header."""
  return dict(_parse(path)[1])


# ---- tensors <-> host bits -------------------------------------------------------------------------------

def _host_bits(tensors: list[Tensor]) -> list[np.ndarray]:
  """Contiguous host copies of the tensors' storage (bfloat16 as uint16 bits), realized in one schedule."""
  from fusegrad.engine.realize import realize
  from fusegrad.autograd import no_grad
  with no_grad(): xs = [t.detach().contiguous() for t in tensors]
  lazy = [x.node for x in xs if not x.node.realized]
  if lazy: realize(*lazy)
  out = []
  for t, x in zip(tensors, xs):
    a = from_storage(x.node.buffer.numpy(), t.shape)
    out.append(np.asarray(a.view(np.uint16) if t.dtype == dt.bfloat16 else a, order="C"))   # keeps 0-d shapes
  return out


def _from_bits(arr: np.ndarray, d: DType, device: str) -> Tensor:
  """A realized Tensor on device holding exactly these bits (uint16 for bfloat16)."""
  dev = rd.get(device)
  if d not in dev.supported:
    raise RuntimeError(f"device {device} cannot hold dtype {d.name} (supported: "
                       f"{', '.join(sorted(x.name for x in dev.supported))})")
  buf = rd.Buffer(dev, arr.size, d)
  if arr.size: buf.copyin(arr)
  return Tensor(_node=gn.buffer_node(buf, d, arr.shape, device))


# ---- writing ---------------------------------------------------------------------------------------------

def _write(path, named: dict, metadata: dict[str, str] | None) -> None:
  path = os.fspath(path)
  if metadata is not None:
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
      raise TypeError("metadata must be a dict of str -> str")
  for k, v in named.items():
    if not isinstance(k, str): raise TypeError(f"tensor names must be strings, got {k!r}")
    if not isinstance(v, (Tensor, np.ndarray)):
      raise TypeError(f"{k!r}: expected a fusegrad Tensor, got {type(v).__name__}")
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder): raise FileNotFoundError(f"{path}: directory {folder} does not exist")
  ts = [v for v in named.values() if isinstance(v, Tensor)]
  bits = iter(_host_bits(ts))
  arrays, specs = [], {}
  for k, v in named.items():
    if isinstance(v, Tensor): d, a = v.dtype, next(bits)
    else: d, a = dt.from_numpy(v.dtype), np.asarray(v, dtype=v.dtype.newbyteorder("<"), order="C")
    arrays.append(a)   # keeps the data alive while safetensors reads it through the pointer
    specs[k] = safetensors.TensorSpec(dtype=d.name, shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
  tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
  try:
    safetensors.serialize_file(specs, tmp, metadata=metadata)
    with open(tmp, "rb+") as f: os.fsync(f.fileno())
    mask = os.umask(0o022); os.umask(mask)       # the writer creates 0600: give the file the usual mode
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, path)
  except BaseException:
    try:
      os.unlink(tmp)
    except OSError:
      pass
    raise
  del arrays


def save_file(tensors: dict[str, Tensor], path, metadata: dict[str, str] | None = None) -> None:
  """Write `{name: Tensor}` (numpy arrays accepted too) to a safetensors file, with optional text metadata."""
  if not isinstance(tensors, dict):
    raise TypeError(f"save_file expects a dict of name -> Tensor, got {type(tensors).__name__}")
  if metadata and STATE_KEY in metadata:
    raise ValueError(f"metadata key {STATE_KEY!r} is reserved for fusegrad.nn.state.save")
  _write(path, tensors, metadata)


def _encode(obj, prefix: str, named: dict, ids: dict, depth: int = 0):
  """JSON skeleton of obj: scalars as themselves, containers as {"d"|"l"|"t": ...}, tensors as {"T": name}."""
  if depth > MAX_DEPTH:
    raise ValueError(f"cannot save a structure nested deeper than {MAX_DEPTH} levels (at {prefix[:200]!r}; a "
                     f"container that holds itself?)")
  if isinstance(obj, (Tensor, np.ndarray)):
    if id(obj) in ids: return {"T": ids[id(obj)]}
    name = prefix or "_"
    if name in named: raise ValueError(f"two tensors would be saved under the name {name!r}; rename a key")
    named[name], ids[id(obj)] = obj, name
    return {"T": name}
  join = (lambda k: f"{prefix}.{k}") if prefix else str
  if isinstance(obj, dict):
    items = []
    for k, v in obj.items():
      if isinstance(k, bool) or not isinstance(k, (str, int)):
        raise TypeError(f"dict keys must be str or int to be saved, got {k!r} under {prefix or 'the top level'!r}")
      items.append([k, _encode(v, join(k), named, ids, depth + 1)])
    return {"d": items}
  if isinstance(obj, (list, tuple)):
    return {"t" if isinstance(obj, tuple) else "l": [_encode(v, join(i), named, ids, depth + 1)
                                                     for i, v in enumerate(obj)]}
  if isinstance(obj, np.generic): obj = obj.item()
  if obj is None or isinstance(obj, (bool, int, float, str)): return obj
  raise TypeError(f"cannot save a {type(obj).__name__} (at {prefix or 'the top level'!r}): only Tensors, numbers, "
                  f"bools, None, strings, dicts, lists and tuples")


def save(obj, path, metadata: dict[str, str] | None = None) -> None:
  """Write a nested state (dicts with str/int keys, lists, tuples; Tensor and scalar leaves) as safetensors."""
  if metadata and STATE_KEY in metadata: raise ValueError(f"metadata key {STATE_KEY!r} is reserved")
  named: dict[str, Tensor] = {}
  tree = _encode(obj, "", named, {})
  meta = dict(metadata or {})
  meta[STATE_KEY] = json.dumps({"format": _FORMAT, "tree": tree}, allow_nan=True)
  _write(path, named, meta)


# ---- loading ---------------------------------------------------------------------------------------------

def _load_tensors(path, device) -> tuple[dict[str, Tensor], dict]:
  entries, meta, start = _parse(path)
  device = rd.canonical(device)
  for k, (code, _, _) in entries.items():
    if _CODES[code][1] is None:
      raise TypeError(f"{os.fspath(path)}: tensor {k!r} has dtype {code}, which fusegrad lacks")
  out = {}
  try:
    with safetensors.safe_open(os.fspath(path), framework="numpy") as f:
      for k in entries:
        code, shape, (b, e) = entries[k]
        d = _CODES[code][1]
        if d == dt.bfloat16:   # numpy has no bfloat16: read the raw bits at the (checked) offsets
          with open(path, "rb") as fh:
            fh.seek(start + b)
            raw = fh.read(e - b)
          if len(raw) != e - b: _fail(path, f"tensor {k!r}: truncated while reading")
          a = np.frombuffer(raw, dtype="<u2").reshape(shape)
        else:
          a = f.get_tensor(k)
          if a.shape != shape or a.dtype != np.dtype(_NP[d]):
            _fail(path, f"tensor {k!r}: safetensors read {a.dtype} {a.shape}")
          if d == dt.bool_ and a.size and a.view(np.uint8).max() > 1:
            # a bool byte is 0 or 1; any other is a corrupt file (kept, it would compare unequal to True)
            bad = a.view(np.uint8).reshape(-1)
            i = int(np.argmax(bad > 1))
            _fail(path, f"tensor {k!r}: BOOL data holds byte {int(bad[i])} at element {i} (a bool is stored as 0 or 1)")
        out[k] = _from_bits(a, d, device)   # copied onto the device before the next tensor is read
  except safetensors.SafetensorError as e:
    _fail(path, f"safetensors: {e}")
  return out, meta


def load_file(path, device=None) -> dict[str, Tensor]:
  """`{name: Tensor}` from a safetensors file, on device (default: fusegrad's default device), in data order.

  The header is checked first; tensors are then read one at a time."""
  return _load_tensors(path, device)[0]


def _decode(x, tensors: dict, path, depth: int = 0):
  if depth > MAX_DEPTH: _fail(path, f"{STATE_KEY}: structure nested deeper than {MAX_DEPTH} levels")
  if isinstance(x, dict):
    if len(x) != 1: _fail(path, f"{STATE_KEY}: malformed node {x!r}"[:300])
    (tag, v), = x.items()
    if tag == "T":
      if v not in tensors: _fail(path, f"{STATE_KEY}: refers to tensor {v!r}, which the file does not hold")
      return tensors[v]
    if tag == "d": return {k: _decode(val, tensors, path, depth + 1) for k, val in v}
    if tag in ("l", "t"):
      items = [_decode(val, tensors, path, depth + 1) for val in v]
      return tuple(items) if tag == "t" else items
    _fail(path, f"{STATE_KEY}: unknown node tag {tag!r}")
  return x


def load(path, device=None):
  """The object `save` wrote; for a plain safetensors file (no fusegrad structure), `{name: Tensor}`."""
  tensors, meta = _load_tensors(path, device)
  if STATE_KEY not in meta: return tensors
  try:
    doc = json.loads(meta[STATE_KEY])
  except json.JSONDecodeError as e:
    _fail(path, f"{STATE_KEY} metadata is not JSON ({e})")
  except RecursionError:
    _fail(path, f"{STATE_KEY}: structure nested deeper than {MAX_DEPTH} levels")
  if not isinstance(doc, dict) or doc.get("format") != _FORMAT or "tree" not in doc:
    _fail(path, f"{STATE_KEY} metadata is not a {_FORMAT} document")
  try:
    return _decode(doc["tree"], tensors, path)
  except (TypeError, ValueError) as e:
    if isinstance(e, StateFileError): raise
    _fail(path, f"{STATE_KEY}: malformed structure ({e})")
