"""nn.functional's resampling and rearranging ops: interpolate/upsample, grid_sample, affine_grid, unfold/fold,
pixel_shuffle/unshuffle, channel_shuffle, embedding_bag; and the modules over them (Upsample, Fold, PixelShuffle, ...).

Static sampling positions (interpolate) become constants built on the host: nearest picks rows with one
index_select, linear and cubic modes multiply by a small [out, in] weight matrix per spatial dim (a matmul, whose
gradient is the transposed matmul). grid_sample's positions come from a tensor, so it gathers the corner values
with lazy indices (its input gradient is the gather rule's one-hot scatter). Re-exported by nn.functional.
"""
from __future__ import annotations
import builtins
import math
import numpy as np
import fusegrad as fg
from fusegrad import dtype as dt
from fusegrad.tensor import Tensor, where, _unfold

__all__ = ["interpolate", "upsample", "upsample_nearest", "upsample_bilinear", "grid_sample", "affine_grid", "unfold",
           "fold", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "embedding_bag"]

_MODE_DIMS = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}


def _src_float(scale: float, i: np.ndarray, align_corners: bool, cubic: bool) -> np.ndarray:
  """PyTorch's area_pixel_compute_source_index in float32."""
  f = np.float32
  if align_corners: return f(scale) * i.astype(f)
  src = f(scale) * (i.astype(f) + f(0.5)) - f(0.5)
  return src if cubic else np.maximum(src, f(0))


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
  A = -0.75
  c1 = lambda x: ((A + 2) * x - (A + 3)) * x * x + 1
  c2 = lambda x: ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
  return [c2(t + 1), c1(t), c1(1 - t), c2(2 - t)]


def _resample_matrix(n_in: int, n_out: int, scale, mode: str, align_corners: bool) -> np.ndarray:
  """W[out, in] with out = W @ in along one dim (linear or cubic)."""
  if align_corners: s = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
  else: s = 1.0 / scale if scale is not None and scale > 0 else n_in / n_out
  o = np.arange(n_out)
  W = np.zeros((n_out, n_in), np.float64)
  cubic = mode == "bicubic"
  src = _src_float(s, o, align_corners, cubic)
  if not cubic:
    i0 = np.minimum(src.astype(np.int64), n_in - 1)
    i1 = i0 + (i0 < n_in - 1)
    l1 = (src - i0).astype(np.float32)
    np.add.at(W, (o, i0), 1 - l1)
    np.add.at(W, (o, i1), l1)
  else:
    x0 = np.floor(src).astype(np.int64)
    t = (src - x0).astype(np.float32)
    for k, w in enumerate(_cubic_weights(t)):
      np.add.at(W, (o, np.clip(x0 - 1 + k, 0, n_in - 1)), w)
  return W


def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                recompute_scale_factor=None, antialias: bool = False) -> Tensor:
  if not isinstance(input, Tensor): raise TypeError(f"interpolate(): input must be a Tensor, got {type(input).__name__}")
  nd = input.ndim - 2
  if mode in ("nearest", "nearest-exact", "area"):
    if align_corners is not None:
      raise ValueError("align_corners option can only be set with the interpolating modes: linear | bilinear | "
                       "bicubic | trilinear")
  elif mode in _MODE_DIMS:
    if nd != _MODE_DIMS[mode]:
      raise NotImplementedError(f"Got {input.ndim}D input, but {mode} mode needs {_MODE_DIMS[mode] + 2}D input")
    align_corners = bool(align_corners)
  else:
    raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) for the "
                              f"modes: nearest | linear | bilinear | bicubic | trilinear | area | nearest-exact (got "
                              f"{mode})")
  if nd < 1 or nd > 3:
    raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) for the "
                              f"modes: nearest | linear | bilinear | bicubic | trilinear | area | nearest-exact (got {mode})")
  if antialias: raise NotImplementedError("interpolate(antialias=True) is not supported")
  if (size is None) == (scale_factor is None):
    raise ValueError("only one of size or scale_factor should be defined" if size is not None else
                     "either size or scale_factor should be defined")
  sp = input.shape[2:]
  if size is not None:
    out = tuple(size) if isinstance(size, (tuple, list)) else (size,) * nd
    if len(out) != nd:
      raise ValueError(f"Input and output must have the same number of spatial dimensions, but got input with spatial "
                       f"dimensions of {list(sp)} and output size of {list(out)}. Please provide input tensor in (N, C, "
                       f"d1, d2, ...,dK) format and output size in (o1, o2, ...,oK) format.")
    scales = [None] * nd
  else:
    sf = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * nd
    if len(sf) != nd:
      raise ValueError(f"Input and scale_factor must have the same number of spatial dimensions, but got input with "
                       f"spatial dimensions of {list(sp)} and scale_factor of shape {list(sf)}.")
    out = tuple(int(math.floor(float(s) * f)) for s, f in zip(sp, sf))
    scales = [None] * nd if recompute_scale_factor else [float(f) for f in sf]
  if builtins.any(o <= 0 for o in out) or builtins.any(s <= 0 for s in sp):
    raise RuntimeError(f"Input and output sizes should be greater than 0, but got input {tuple(sp)} and output {out}")
  if mode == "area":   # adaptive average pooling onto the output size
    from fusegrad.nn.functional import _adaptive_avg_poolnd
    return _adaptive_avg_poolnd(input, out, nd, "interpolate")
  x = input
  for i in range(nd):
    d, n_in, n_out = 2 + i, sp[i], out[i]
    if mode in ("nearest", "nearest-exact"):
      s = np.float32(1.0 / scales[i]) if scales[i] is not None and scales[i] > 0 else np.float32(n_in) / np.float32(n_out)
      o = np.arange(n_out).astype(np.float32) + (np.float32(0.5) if mode == "nearest-exact" else np.float32(0))
      idx = np.minimum(np.floor(o * s).astype(np.int64), n_in - 1)
      if n_in == n_out and (idx == np.arange(n_in)).all(): continue
      x = x.index_select(d, fg.tensor(idx, device=x.device))
    else:
      W = _resample_matrix(n_in, n_out, scales[i], mode, align_corners)
      w = fg.tensor(W.T, dtype=x.dtype if x.dtype.is_float else dt.float32, device=x.device)
      x = (x.transpose(d, -1) @ w).transpose(d, -1)
  return x


def upsample(input, size=None, scale_factor=None, mode: str = "nearest", align_corners=None) -> Tensor:
  return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input, size=None, scale_factor=None) -> Tensor: return interpolate(input, size, scale_factor, "nearest")


def upsample_bilinear(input, size=None, scale_factor=None) -> Tensor:
  return interpolate(input, size, scale_factor, "bilinear", align_corners=True)


# ---- grid_sample / affine_grid -------------------------------------------------------------------------------------

def _unnormalize(c: Tensor, n: int, align_corners: bool) -> Tensor:
  return (c + 1) / 2 * (n - 1) if align_corners else ((c + 1) * n - 1) / 2


def _reflect(c: Tensor, twice_low: int, twice_high: int) -> Tensor:
  """PyTorch's reflect_coordinates: fold c into [low, high] by mirror reflections."""
  if twice_low == twice_high: return c * 0
  lo, span = twice_low / 2, (twice_high - twice_low) / 2
  a = (c - lo).abs()
  extra = a.fmod(span)
  flips = (a / span).floor()
  return where(flips.fmod(2) == 0, extra + lo, span - extra + lo)


def _source_coord(c: Tensor, n: int, padding_mode: str, align_corners: bool) -> Tensor:
  x = _unnormalize(c, n, align_corners)
  if padding_mode == "border": return x.clamp(0, n - 1)
  if padding_mode == "reflection":
    x = _reflect(x, 0, 2 * (n - 1)) if align_corners else _reflect(x, -1, 2 * n - 1)
    return x.clamp(0, n - 1)
  return x


def grid_sample(input: Tensor, grid: Tensor, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners=None) -> Tensor:
  """Sample input [N, C, H, W] at grid [N, Ho, Wo, 2] (x, y in [-1, 1]) -> [N, C, Ho, Wo]."""
  if mode not in ("bilinear", "nearest", "bicubic"):
    raise ValueError(f"nn.functional.grid_sample(): expected mode to be 'bilinear', 'nearest' or 'bicubic', but got: '{mode}'")
  if padding_mode not in ("zeros", "border", "reflection"):
    raise ValueError(f"nn.functional.grid_sample(): expected padding_mode to be 'zeros', 'border', or 'reflection', "
                     f"but got: '{padding_mode}'")
  if input.ndim != 4 or mode == "bicubic":
    raise NotImplementedError(f"grid_sample: only 4-D input with bilinear or nearest mode is implemented (got "
                              f"{input.ndim}-D input, mode {mode!r})")
  if grid.ndim != 4 or grid.shape[-1] != 2 or grid.shape[0] != input.shape[0]:
    raise RuntimeError(f"grid_sampler(): expected grid to have size 2 in last dimension and the batch size of input, "
                       f"but got grid with sizes {list(grid.shape)} for input of size {list(input.shape)}")
  if input.dtype != grid.dtype:
    raise RuntimeError(f"grid_sampler(): expected input and grid to have same dtype, but input has {input.dtype.name} "
                       f"and grid has {grid.dtype.name}")
  align_corners = bool(align_corners)
  N, C, H, W = input.shape
  Ho, Wo = grid.shape[1:3]
  ix = _source_coord(grid[..., 0], W, padding_mode, align_corners)     # [N, Ho, Wo]
  iy = _source_coord(grid[..., 1], H, padding_mode, align_corners)
  flat = input.reshape(N, C, H * W)

  def corner(yy: Tensor, xx: Tensor) -> Tensor:   # input at integer (yy, xx) float positions; 0 outside
    inside = (xx >= 0) & (xx <= W - 1) & (yy >= 0) & (yy <= H - 1)
    pos = where(inside, yy * W + xx, 0)._cast(dt.int64).reshape(N, 1, Ho * Wo).expand(N, C, Ho * Wo)
    v = flat.gather(2, pos).reshape(N, C, Ho, Wo)
    return where(inside.unsqueeze(1), v, 0)

  if mode == "nearest":
    return corner(iy.detach().round(), ix.detach().round())
  x0, y0 = ix.detach().floor(), iy.detach().floor()
  x1, y1 = x0 + 1, y0 + 1
  wx1, wy1 = ix - x0, iy - y0
  wx0, wy0 = x1 - ix, y1 - iy
  u = lambda t: t.unsqueeze(1)
  return (corner(y0, x0) * u(wx0 * wy0) + corner(y0, x1) * u(wx1 * wy0) + corner(y1, x0) * u(wx0 * wy1) +
          corner(y1, x1) * u(wx1 * wy1))


def _base_coords(n: int, align_corners: bool, like: Tensor) -> Tensor:
  if n <= 1: return fg.zeros(n, dtype=like.dtype, device=like.device)
  r = fg.linspace(-1, 1, n, dtype=like.dtype, device=like.device)
  return r if align_corners else r * ((n - 1) / n)


def affine_grid(theta: Tensor, size, align_corners=None) -> Tensor:
  """The sampling grid of the affine maps theta [N, 2, 3] (size N, C, H, W) or [N, 3, 4] (size N, C, D, H, W)."""
  if not isinstance(theta, Tensor) or not theta.dtype.is_float:
    raise ValueError(f"Expected theta to have floating point type, but got {getattr(theta, 'dtype', type(theta).__name__)}")
  size = tuple(size)
  align_corners = bool(align_corners)
  if len(size) == 4:
    if theta.ndim != 3 or theta.shape[1:] != (2, 3):
      raise ValueError(f"Expected a batch of 2D affine matrices of shape Nx2x3 for size {list(size)}. Got {list(theta.shape)}.")
    sp = size[2:]
  elif len(size) == 5:
    if theta.ndim != 3 or theta.shape[1:] != (3, 4):
      raise ValueError(f"Expected a batch of 3D affine matrices of shape Nx3x4 for size {list(size)}. Got {list(theta.shape)}.")
    sp = size[2:]
  else:
    raise NotImplementedError(f"affine_grid only supports 4D and 5D sizes, for 2D and 3D affine transforms, "
                              f"respectively. Got size {list(size)}.")
  if builtins.min(size) <= 0: raise ValueError(f"Expected non-zero, positive output size. Got {list(size)}")
  if theta.shape[0] != size[0]:
    raise ValueError(f"Expected theta batch size {theta.shape[0]} to match size[0] = {size[0]}")
  k = len(sp)
  # base[..., :] = (x, y[, z], 1) with x along the last spatial dim
  axes = [_base_coords(n, align_corners, theta) for n in reversed(sp)]      # x, y, (z)
  parts = []
  for j, a in enumerate(axes):
    shp = [1] * k
    shp[k - 1 - j] = a.shape[0]
    parts.append(a.reshape(*shp).expand(*sp))
  parts.append(fg.ones(*sp, dtype=theta.dtype, device=theta.device))
  base = fg.stack(parts, -1).reshape(1, -1, k + 1)                           # [1, prod(sp), k + 1]
  return (base @ theta.transpose(1, 2)).reshape(size[0], *sp, k)


# ---- im2col / col2im --------------------------------------------------------------------------------------------

def _pair(v, name: str) -> tuple:
  t = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
  if len(t) != 2: raise ValueError(f"{name} must be an int or a pair of ints, got {v!r}")
  return tuple(int(i) for i in t)


def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
  """im2col: [N, C, H, W] -> [N, C * kh * kw, L] (a window view, then one copy)."""
  if input.ndim not in (3, 4):
    raise RuntimeError(f"Expected 3D or 4D (batch mode) tensor with possibly 0 batch size and other non-zero "
                       f"dimensions for input, but got: {list(input.shape)}")
  x = input.unsqueeze(0) if input.ndim == 3 else input
  ks, dl, pd, st = _pair(kernel_size, "kernel_size"), _pair(dilation, "dilation"), _pair(padding, "padding"), \
      _pair(stride, "stride")
  if builtins.any(v <= 0 for v in ks + dl + st) or builtins.any(v < 0 for v in pd):
    raise RuntimeError(f"im2col: kernel_size {ks}, dilation {dl} and stride {st} must be positive and padding {pd} "
                       f"non-negative")
  N, C = x.shape[:2]
  xp = x.pad((pd[1], pd[1], pd[0], pd[0])) if builtins.any(pd) else x
  for i in range(2):
    if xp.shape[2 + i] < dl[i] * (ks[i] - 1) + 1:
      raise RuntimeError(f"Given input with spatial size {tuple(x.shape[2:])}, kernel_size={ks}, dilation={dl}, "
                         f"padding={pd}, calculated shape of the array of sliding blocks is non-positive")
  cols = _unfold(xp, ks, st, dl)                                     # [N, C, oh, ow, kh, kw]
  oh, ow = cols.shape[2:4]
  out = cols.permute(0, 1, 4, 5, 2, 3).reshape(N, C * ks[0] * ks[1], oh * ow)
  return out.squeeze(0) if input.ndim == 3 else out


def _spread(x: Tensor, dim: int, s: int) -> Tensor:
  from fusegrad.nn.functional import _spread as sp
  return sp(x, dim, s)


def fold(input: Tensor, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
  """col2im: [N, C * kh * kw, L] -> [N, C, H, W], overlapping blocks summed: one spread and shifted term per
  kernel offset, added in one fused kernel."""
  if input.ndim not in (2, 3):
    raise NotImplementedError(f"Input Error: Only unbatched (2D) or batched (3D) input Tensors are supported (got "
                              f"{input.ndim}D)")
  x = input.unsqueeze(0) if input.ndim == 2 else input
  osz, ks, dl, pd, st = _pair(output_size, "output_size"), _pair(kernel_size, "kernel_size"), \
      _pair(dilation, "dilation"), _pair(padding, "padding"), _pair(stride, "stride")
  K = ks[0] * ks[1]
  N, CK, L = x.shape
  if CK % K:
    raise RuntimeError(f"Expected size of input's dimension 1 to be divisible by the product of kernel_size, but got "
                       f"input.size(1)={CK} and kernel_size={ks}")
  blocks = [(osz[i] + 2 * pd[i] - dl[i] * (ks[i] - 1) - 1) // st[i] + 1 for i in range(2)]
  if blocks[0] <= 0 or blocks[1] <= 0 or blocks[0] * blocks[1] != L:
    raise RuntimeError(f"Given output_size={osz}, kernel_size={ks}, dilation={dl}, padding={pd}, stride={st}, expected "
                       f"size of input's dimension 2 to match the calculated number of sliding blocks {blocks[0]} * "
                       f"{blocks[1]} = {blocks[0] * blocks[1]}, but got input.size(2)={L}.")
  C = CK // K
  cols = x.reshape(N, C, ks[0], ks[1], blocks[0], blocks[1])
  Hp, Wp = osz[0] + 2 * pd[0], osz[1] + 2 * pd[1]
  out = None
  for i in range(ks[0]):
    for j in range(ks[1]):
      b = _spread(_spread(cols[:, :, i, j], 2, st[0]), 3, st[1])     # [N, C, (bh-1)*s+1, (bw-1)*s+1]
      top, left = i * dl[0], j * dl[1]
      t = b.pad((left, Wp - left - b.shape[3], top, Hp - top - b.shape[2]))
      out = t if out is None else out + t
  out = out[:, :, pd[0]:pd[0] + osz[0], pd[1]:pd[1] + osz[1]]
  return out.squeeze(0) if input.ndim == 2 else out


# ---- pixel shuffle -------------------------------------------------------------------------------------------------

def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
  r = int(upscale_factor)
  if input.ndim < 3:
    raise RuntimeError(f"pixel_shuffle expects input to have at least 3 dimensions, but got input with {input.ndim} "
                       f"dimension(s)")
  if r <= 0: raise RuntimeError(f"pixel_shuffle expects a positive upscale_factor, but got {r}")
  *lead, C, H, W = input.shape
  if C % (r * r):
    raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of "
                       f"upscale_factor, but input.size(-3)={C} is not divisible by {r * r}")
  n = len(lead)
  x = input.reshape(*lead, C // (r * r), r, r, H, W)
  x = x.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)
  return x.reshape(*lead, C // (r * r), H * r, W * r)


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
  r = int(downscale_factor)
  if input.ndim < 3:
    raise RuntimeError(f"pixel_unshuffle expects input to have at least 3 dimensions, but got input with {input.ndim} "
                       f"dimension(s)")
  if r <= 0: raise RuntimeError(f"pixel_unshuffle expects a positive downscale_factor, but got {r}")
  *lead, C, H, W = input.shape
  if H % r:
    raise RuntimeError(f"pixel_unshuffle expects height to be divisible by downscale_factor, but input.size(-2)={H} is "
                       f"not divisible by {r}")
  if W % r:
    raise RuntimeError(f"pixel_unshuffle expects width to be divisible by downscale_factor, but input.size(-1)={W} is "
                       f"not divisible by {r}")
  n = len(lead)
  x = input.reshape(*lead, C, H // r, r, W // r, r)
  x = x.permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)
  return x.reshape(*lead, C * r * r, H // r, W // r)


def channel_shuffle(input: Tensor, groups: int) -> Tensor:
  """[N, g * k, *] -> [N, k * g, *]: channel i * k + j moves to j * g + i (a reshape, a transpose, a reshape)."""
  if input.ndim <= 2:
    raise RuntimeError(f"channel_shuffle expects input with > 2 dims, but got input with sizes {list(input.shape)}")
  if groups <= 0:
    raise RuntimeError(f"Number of groups to divide channels in must be positive. Value of groups:{groups}")
  N, C, *sp = input.shape
  if C % groups:
    raise RuntimeError(f"Number of channels must be divisible by groups. Got {C} channels and {groups} groups.")
  return input.reshape(N, groups, C // groups, *sp).transpose(1, 2).reshape(input.shape)


# ---- embedding_bag -------------------------------------------------------------------------------------------------

def embedding_bag(input: Tensor, weight: Tensor, offsets=None, max_norm=None, norm_type: float = 2,
                  scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False, per_sample_weights=None,
                  include_last_offset: bool = False, padding_idx=None) -> Tensor:
  """Sums, means or maxima of bags of embedding rows: bag membership is a [bags, indices] 0/1 matrix (from the
  offsets, lazily), so sum and mean are one matmul and max one masked reduction."""
  from fusegrad.nn.functional import embedding
  if mode not in ("sum", "mean", "max"): raise ValueError("mode has to be one of sum, mean or max")
  if max_norm is not None: raise NotImplementedError("embedding_bag(max_norm=...) is not supported")
  if per_sample_weights is not None and mode != "sum":
    raise NotImplementedError(f"embedding_bag: per_sample_weights was not None. per_sample_weights is only supported "
                              f"for mode='sum' (got mode='{mode}'). Please open a feature request on GitHub.")
  if input.ndim == 2:
    if offsets is not None:
      raise ValueError(f"if input is 2D, then offsets has to be None, as input is treated is a mini-batch of fixed "
                       f"length sequences. However, found offsets of type {type(offsets).__name__}")
    B, n = input.shape
    offsets = fg.arange(0, B * n, builtins.max(n, 1), device=input.device) if n else fg.zeros(B, dtype=dt.int64, device=input.device)
    idx = input.reshape(-1)
    if per_sample_weights is not None: per_sample_weights = per_sample_weights.reshape(-1)
    include_last_offset = False
  elif input.ndim == 1:
    if offsets is None: raise ValueError("offsets has to be a 1D Tensor but got None")
    if offsets.ndim != 1: raise ValueError(f"offsets has to be a 1D Tensor, but got Tensor of dimension {offsets.ndim}")
    idx = input
  else:
    raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {input.ndim}")
  M = idx.shape[0]
  starts = offsets[:-1] if include_last_offset else offsets
  ends = offsets[1:] if include_last_offset else fg.cat([offsets[1:], fg.full((1,), M, dtype=offsets.dtype, device=offsets.device)])
  pos = fg.arange(M, device=input.device).reshape(1, M)
  member = (pos >= starts.reshape(-1, 1)) & (pos < ends.reshape(-1, 1))               # [B, M]
  if padding_idx is not None:
    if padding_idx < 0: padding_idx += weight.shape[0]
    member = member & (idx != padding_idx).reshape(1, M)
  rows = embedding(idx, weight)                                                        # [M, D]
  if per_sample_weights is not None: rows = rows * per_sample_weights.reshape(M, 1)
  cnt = member.sum(1, keepdim=True)
  if mode == "max":
    m = where(member.unsqueeze(-1), rows.unsqueeze(0), -math.inf).amax(1)
    return where(cnt > 0, m, 0)._cast(weight.dtype)
  s = member._cast(weight.dtype) @ rows
  return s if mode == "sum" else (s / cnt.clamp_min(1))._cast(weight.dtype)


# ---- modules -------------------------------------------------------------------------------------------------------

from fusegrad.nn.module import Module  # noqa: E402
from fusegrad.nn import functional as F  # noqa: E402  (the modules call F's traced functions)


class PixelShuffle(Module):
  def __init__(self, upscale_factor: int):
    super().__init__()
    self.upscale_factor = upscale_factor
  def forward(self, input: Tensor) -> Tensor: return F.pixel_shuffle(input, self.upscale_factor)
  def extra_repr(self) -> str: return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
  def __init__(self, downscale_factor: int):
    super().__init__()
    self.downscale_factor = downscale_factor
  def forward(self, input: Tensor) -> Tensor: return F.pixel_unshuffle(input, self.downscale_factor)
  def extra_repr(self) -> str: return f"downscale_factor={self.downscale_factor}"


class ChannelShuffle(Module):
  def __init__(self, groups: int):
    super().__init__()
    self.groups = groups
  def forward(self, input: Tensor) -> Tensor: return F.channel_shuffle(input, self.groups)
  def extra_repr(self) -> str: return f"groups={self.groups}"


class Upsample(Module):
  def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
               recompute_scale_factor=None):
    super().__init__()
    self.name = type(self).__name__
    self.size = size
    if isinstance(scale_factor, tuple): self.scale_factor = tuple(float(f) for f in scale_factor)
    else: self.scale_factor = float(scale_factor) if scale_factor else None
    self.mode, self.align_corners, self.recompute_scale_factor = mode, align_corners, recompute_scale_factor

  def forward(self, input: Tensor) -> Tensor:
    return F.interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners,
                       recompute_scale_factor=self.recompute_scale_factor)

  def extra_repr(self) -> str:
    info = f"scale_factor={self.scale_factor!r}" if self.scale_factor is not None else f"size={self.size!r}"
    return info + f", mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
  def __init__(self, size=None, scale_factor=None): super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
  def __init__(self, size=None, scale_factor=None):
    super().__init__(size, scale_factor, mode="bilinear", align_corners=True)


class Fold(Module):
  def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1):
    super().__init__()
    self.output_size, self.kernel_size = output_size, kernel_size
    self.dilation, self.padding, self.stride = dilation, padding, stride
  def forward(self, input: Tensor) -> Tensor:
    return F.fold(input, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride)
  def extra_repr(self) -> str:
    return (f"output_size={self.output_size}, kernel_size={self.kernel_size}, dilation={self.dilation}, "
            f"padding={self.padding}, stride={self.stride}")


class Unfold(Module):
  def __init__(self, kernel_size, dilation=1, padding=0, stride=1):
    super().__init__()
    self.kernel_size, self.dilation, self.padding, self.stride = kernel_size, dilation, padding, stride
  def forward(self, input: Tensor) -> Tensor:
    return F.unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)
  def extra_repr(self) -> str:
    return f"kernel_size={self.kernel_size}, dilation={self.dilation}, padding={self.padding}, stride={self.stride}"
