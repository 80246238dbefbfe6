"""fusegrad.nn.init: PyTorch's initialisers. Each fills a tensor in place (under no_grad) from the
in-kernel random generator, so `fusegrad.manual_seed` makes them reproducible on every device."""
from __future__ import annotations
import math
import fusegrad as fg
from fusegrad.tensor import Tensor


def calculate_gain(nonlinearity: str, param=None) -> float:
  linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "sigmoid")
  if nonlinearity in linear: return 1.0
  if nonlinearity == "tanh": return 5.0 / 3
  if nonlinearity == "relu": return math.sqrt(2.0)
  if nonlinearity == "leaky_relu":
    slope = 0.01 if param is None else param
    if isinstance(slope, bool) or not isinstance(slope, (int, float)): raise ValueError(f"negative_slope {slope} not a valid number")
    return math.sqrt(2.0 / (1 + slope ** 2))
  if nonlinearity == "selu": return 3.0 / 4
  raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
  if tensor.ndim < 2:
    raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
  receptive = math.prod(tensor.shape[2:])
  return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor: Tensor, mode: str) -> int:
  if mode not in ("fan_in", "fan_out"): raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
  fi, fo = _calculate_fan_in_and_fan_out(tensor)
  return fi if mode == "fan_in" else fo


def _fill(tensor: Tensor, value: Tensor) -> Tensor:
  with fg.no_grad(): return tensor.copy_(value)


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
  return _fill(tensor, fg.rand(*tensor.shape, device=tensor.device) * (b - a) + a)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
  return _fill(tensor, fg.randn(*tensor.shape, device=tensor.device) * std + mean)


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0) -> Tensor:
  """Normal(mean, std) truncated to [a, b], by the inverse CDF of a uniform draw (as PyTorch does)."""
  cdf = lambda x: (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0
  lo, hi = cdf((a - mean) / std), cdf((b - mean) / std)
  u = fg.rand(*tensor.shape, device=tensor.device) * (2 * hi - 2 * lo) + (2 * lo - 1)
  u = u.clamp(-1 + 1e-7, 1 - 1e-7)
  # erfinv by Newton steps on erf (erf is a primitive): from a good start, three steps reach float32 precision
  x = _erfinv(u)
  return _fill(tensor, (x * (std * math.sqrt(2.0)) + mean).clamp(a, b))


def _erfinv(y: Tensor) -> Tensor:
  # Winitzki's approximation, with w = -log(1 - y^2) >= 0: sign(y) sqrt(sqrt(t^2 + w/a) - t), t = 2/(pi a) - w/2
  w = -((1 - y) * (1 + y)).log()
  t = 2 / (math.pi * 0.147) - w / 2
  x = y.sign() * ((t * t + w / 0.147).sqrt() - t).sqrt()
  for _ in range(3):
    x = x - (x.erf() - y) / (2 / math.sqrt(math.pi) * (-x * x).exp())
  return x


def constant_(tensor: Tensor, val: float) -> Tensor:
  with fg.no_grad(): return tensor.fill_(val)


def zeros_(tensor: Tensor) -> Tensor: return constant_(tensor, 0.0)
def ones_(tensor: Tensor) -> Tensor: return constant_(tensor, 1.0)


def eye_(tensor: Tensor) -> Tensor:
  if tensor.ndim != 2: raise ValueError("Only tensors with 2 dimensions are supported")
  return _fill(tensor, fg.eye(*tensor.shape, dtype=tensor.dtype, device=tensor.device))


def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> Tensor:
  fi, fo = _calculate_fan_in_and_fan_out(tensor)
  a = gain * math.sqrt(6.0 / (fi + fo))
  return uniform_(tensor, -a, a)


def xavier_normal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
  fi, fo = _calculate_fan_in_and_fan_out(tensor)
  return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fi + fo)))


def kaiming_uniform_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
  if 0 in tensor.shape: return tensor
  bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
  return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
  if 0 in tensor.shape: return tensor
  return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode)))


def orthogonal_(tensor: Tensor, gain: float = 1, generator=None) -> Tensor:
  """A (semi-)orthogonal matrix (tensor viewed as rows x rest): Q of the QR of a normal draw, its columns' signs fixed
  by R's diagonal (torch's). The QR runs on the host (numpy), once per call."""
  import numpy as np
  if tensor.ndim < 2: raise ValueError("Only tensors with 2 or more dimensions are supported")
  if tensor.numel() == 0: return tensor
  rows = tensor.shape[0]
  cols = tensor.numel() // rows
  a = fg.randn(rows, cols, generator=generator).numpy().astype(np.float64)
  if rows < cols: a = a.T
  q, r = np.linalg.qr(a)
  q = q * np.sign(np.diag(r))
  if rows < cols: q = q.T
  q = fg.tensor((q * gain).reshape(tensor.shape), dtype=tensor.dtype, device=tensor.device)
  return _fill(tensor, q)


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
  """The identity of a convolution: 1 at the kernel's centre from input channel d to output channel d of each group."""
  import numpy as np
  nd = tensor.ndim
  if nd not in (3, 4, 5): raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
  sizes = tensor.shape
  if sizes[0] % groups != 0: raise ValueError("dim 0 must be divisible by groups")
  per = sizes[0] // groups
  a = np.zeros(sizes, dtype=np.float32)
  centre = tuple(s // 2 for s in sizes[2:])
  for g in range(groups):
    for d in range(min(per, sizes[1])): a[(g * per + d, d) + centre] = 1
  return _fill(tensor, fg.tensor(a, dtype=tensor.dtype, device=tensor.device))


def sparse_(tensor: Tensor, sparsity: float, std: float = 0.01, generator=None) -> Tensor:
  """Normal(0, std) entries, of which ceil(sparsity * rows) in every column (at random rows) are zero."""
  import numpy as np
  if tensor.ndim != 2: raise ValueError("Only tensors with 2 dimensions are supported")
  rows, cols = tensor.shape
  num_zeros = int(math.ceil(sparsity * rows))
  values = fg.randn(rows, cols, generator=generator, device=tensor.device) * std
  # each column's zero rows: the first num_zeros of a random permutation (ranks of uniform draws, on the host)
  ranks = np.argsort(np.argsort(fg.rand(rows, cols, generator=generator).numpy(), axis=0, kind="stable"), axis=0)
  keep = fg.tensor(ranks >= num_zeros, device=tensor.device)
  return _fill(tensor, fg.where(keep, values, 0.0))
