"""fusegrad.nn.functional: PyTorch's functional layers and losses, written with Tensor ops.

Everything here is a composition of the frontend's primitives, so it is lazy, fuses with its
neighbours and differentiates through the autograd rule table. Convolutions and pools read their
input through a window view (`tensor._unfold`: strides, no copy); a convolution is then one
reduction kernel. Its input gradient is two: the gradient in the window layout, then one kernel that
sums the kernel's offsets back onto the input.
"""
from __future__ import annotations
import builtins
import math
import warnings
import numpy as np
import fusegrad as fg
from fusegrad import dtype as dt
from fusegrad.engine import trace as _trace
from fusegrad.tensor import Tensor, _index_in_range, _norm_dim, _moments, _take_rows, _unfold, _unfold_flat, embed_positions, where, HALF_FLOATS, _result_type
from fusegrad.templates import templated

# ---- activations (the Tensor methods, as functions) ----------------------------------------------------------

def relu(input: Tensor, inplace: bool = False) -> Tensor: return input.relu()
def relu6(input: Tensor, inplace: bool = False) -> Tensor: return input.relu6()
def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
  return input.leaky_relu(negative_slope)
def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor: return input.elu(alpha)
def gelu(input: Tensor, approximate: str = "none") -> Tensor: return input.gelu(approximate)
def _elu_family(input: Tensor, name: str) -> None:
  if not isinstance(input, Tensor): raise TypeError(f"{name}(): argument 'input' must be Tensor, not {type(input).__name__}")
  if not input.dtype.is_float: raise NotImplementedError(f"\"elu_cpu\" not implemented for '{dt.scalar_name(input.dtype)}'")
def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
  """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)): alpha * elu(x / alpha) (float16/bfloat16 in float32)."""
  _elu_family(input, "celu")
  if alpha == 0: raise RuntimeError("ZeroDivisionError: alpha cannot be 0 for CELU")
  if input.dtype in HALF_FLOATS: return celu(input._cast(dt.float32), alpha)._cast(input.dtype)
  return (input * (1.0 / alpha)).elu(1.0) * alpha
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
def selu(input: Tensor, inplace: bool = False) -> Tensor:
  """scale * elu(x, alpha) with SELU's constants (float16/bfloat16 in float32)."""
  _elu_family(input, "selu")
  if input.dtype in HALF_FLOATS: return selu(input._cast(dt.float32))._cast(input.dtype)
  return input.elu(_SELU_ALPHA) * _SELU_SCALE
def silu(input: Tensor, inplace: bool = False) -> Tensor: return input.silu()
def mish(input: Tensor, inplace: bool = False) -> Tensor: return input.mish()
def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor: return input.softplus(beta, threshold)
def sigmoid(input: Tensor) -> Tensor: return input.sigmoid()
def tanh(input: Tensor) -> Tensor: return input.tanh()
def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
  return input.hardtanh(min_val, max_val)
def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor: return input.hardsigmoid()
def hardswish(input: Tensor, inplace: bool = False) -> Tensor: return input.hardswish()
def logsigmoid(input: Tensor) -> Tensor: return -(-input).softplus()
def glu(input: Tensor, dim: int = -1) -> Tensor:
  """The gated linear unit a * sigmoid(b), a and b the halves of input along dim (float16/bfloat16 computed in
  float32 and rounded once, as torch's kernel)."""
  _check_tensor(input, "glu")
  if input.ndim == 0: raise RuntimeError("glu does not support scalars because halving size must be even")
  if not input.dtype.is_float: raise NotImplementedError(f"\"glu_cpu\" not implemented for '{dt.scalar_name(input.dtype)}'")
  d = _norm_dim(dim, input.ndim)
  n = input.shape[d]
  if n % 2: raise RuntimeError(f"Halving dimension must be even, but dimension {d} is size {n}")
  if input.dtype in HALF_FLOATS: return glu(input._cast(dt.float32), d)._cast(input.dtype)
  return input.narrow(d, 0, n // 2) * input.narrow(d, n // 2, n // 2).sigmoid()


def _softmax_dim(input: Tensor, dim, name: str) -> int:
  """PyTorch 2.x: no dim picks one from the rank (0 for 0-, 1- and 3-D input, else 1) with a deprecation warning."""
  if dim is not None: return dim
  warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X as an "
                f"argument.", UserWarning, stacklevel=3)
  return 0 if input.ndim in (0, 1, 3) else 1
def softmax(input: Tensor, dim: int | None = None, dtype=None) -> Tensor:
  return input.softmax(_softmax_dim(input, dim, "softmax"), dtype=dtype)
def log_softmax(input: Tensor, dim: int | None = None, dtype=None) -> Tensor:
  return input.log_softmax(_softmax_dim(input, dim, "log_softmax"), dtype=dtype)
def softmin(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype=None) -> Tensor:
  """softmax(-input) along dim (cast to dtype first when given, as torch's)."""
  dim = _softmax_dim(input, dim, "softmin")
  x = input._cast(dt.to_dtype(dtype)) if dtype is not None else input
  return (-x).softmax(dim)
def pad(input: Tensor, pad, mode: str = "constant", value=None) -> Tensor:
  _check_tensor(input, "pad")
  if mode not in ("constant", "reflect", "replicate", "circular"):
    raise NotImplementedError(f"Unrecognised padding mode {mode}")
  k = len(pad) // 2
  if mode != "constant" and len(pad) % 2 == 0 and 1 <= k <= 3 and input.ndim not in (k + 1, k + 2):
    # PyTorch pads the last 1-3 dims of a batched or unbatched input in these modes (Tensor.pad takes any)
    raise NotImplementedError(f"Padding size {len(pad)} is not supported for {input.ndim}D input tensor. Non-constant "
                              f"padding of size {len(pad)} needs a {k + 1}D or {k + 2}D input")
  return input.pad(pad, 0.0 if value is None else value, mode)


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
  """input / max(||input||_p, eps) along dim; a zero vector stays zero with a finite gradient (the norm's gradient
  at 0 is taken as 0, as PyTorch's)."""
  _check_tensor(input, "normalize")
  if input.ndim == 0: dim = 0 if dim in (0, -1) else dim
  s = input.square().sum(dim, keepdim=True) if p == 2 else input.abs().pow(p).sum(dim, keepdim=True)
  zero = s == 0
  n = where(zero, 0.0, where(zero, 1.0, s).pow(0.5 if p == 2 else 1 / p))
  return input / n.clamp_min(eps)


# ---- linear and convolution ------------------------------------------------------------------------------------

def _check_tensor(x, name: str, arg: str = "input") -> None:
  if not isinstance(x, Tensor):
    raise TypeError(f"{name}(): argument '{arg}' must be Tensor, not {type(x).__name__}")


@templated
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
  _check_tensor(input, "linear")
  _check_tensor(weight, "linear", "weight")
  if input.shape[-1:] != weight.shape[-1:]:
    raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({'x'.join(map(str, input.shape))} and "
                       f"{'x'.join(map(str, weight.shape[::-1]))})")
  # leading dims fold into the rows: one matmul (and one weight-gradient reduction over all rows)
  x = input.reshape(-1, input.shape[-1]) if input.ndim > 2 else input
  out = x @ weight.T
  if bias is not None: out = out + bias
  return out.reshape(*input.shape[:-1], weight.shape[0]) if input.ndim > 2 else out


def _tuple(v, n: int, name: str) -> tuple:
  t = tuple(v) if isinstance(v, (tuple, list)) else (v,) * n
  if len(t) != n or not builtins.all(isinstance(i, (int, np.integer)) for i in t):
    raise ValueError(f"{name} must be an int or a tuple of {n} ints, got {v!r}")
  return tuple(int(i) for i in t)


def _batched(input: Tensor, nd: int, name: str) -> tuple[Tensor, bool]:
  """Accept [N, C, *spatial] or unbatched [C, *spatial] like PyTorch; returns the batched view."""
  _check_tensor(input, name)
  if input.ndim == nd + 1: return input.unsqueeze(0), True
  if input.ndim != nd + 2:
    raise RuntimeError(f"{name}: Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input, but got input of "
                       f"size: {list(input.shape)}")
  return input, False


def _conv_padding(padding, ks: tuple, dilation: tuple, stride: tuple, nd: int) -> list[tuple[int, int]]:
  if isinstance(padding, str):
    if padding == "valid": return [(0, 0)] * nd
    if padding != "same": raise ValueError(f"Invalid padding string {padding!r}, should be one of ['valid', 'same']")
    if builtins.any(s != 1 for s in stride): raise ValueError("padding='same' is not supported for strided convolutions")
    tot = [d * (k - 1) for k, d in zip(ks, dilation)]
    return [(t // 2, t - t // 2) for t in tot]
  p = _tuple(padding, nd, "padding")
  if builtins.any(v < 0 for v in p): raise RuntimeError(f"negative padding is not supported, got {p}")
  return [(v, v) for v in p]


def _pad_spatial(x: Tensor, pads: list[tuple[int, int]], value=0.0) -> Tensor:
  if builtins.all(p == (0, 0) for p in pads): return x
  return x.pad(tuple(v for lo_hi in reversed(pads) for v in lo_hi), value=value)


@templated   # (the graph of a convolution: dozens of frontend ops, made again directly for inputs of one structure)
def _convnd(input: Tensor, weight: Tensor, bias, stride, padding, dilation, groups: int, nd: int, name: str) -> Tensor:
  x, unbatched = _batched(input, nd, name)
  if weight.ndim != nd + 2:
    raise RuntimeError(f"{name}: Expected {nd + 2}D weight, got weight of size {list(weight.shape)}")
  ks = weight.shape[2:]
  stride, dilation = _tuple(stride, nd, "stride"), _tuple(dilation, nd, "dilation")
  if builtins.any(s <= 0 for s in stride): raise RuntimeError(f"non-positive stride is not supported, got {stride}")
  if builtins.any(d <= 0 for d in dilation): raise RuntimeError(f"dilation should be greater than zero, got {dilation}")
  N, C = x.shape[:2]
  O, Cg = weight.shape[:2]
  if groups <= 0: raise RuntimeError("non-positive groups is not supported")
  if C != Cg * groups or O % groups:
    raise RuntimeError(f"Given groups={groups}, weight of size {list(weight.shape)}, expected input{list(x.shape)} to "
                       f"have {Cg * groups} channels, but got {C} channels instead")
  if bias is not None and bias.shape != (O,):
    raise RuntimeError(f"{name}: bias of shape {list(bias.shape)} does not match {O} output channels")
  xp = _pad_spatial(x, _conv_padding(padding, ks, dilation, stride, nd))
  for i in range(nd):
    if xp.shape[2 + i] < dilation[i] * (ks[i] - 1) + 1:
      raise RuntimeError(f"Calculated padded input size per channel: {tuple(xp.shape[2:])}. Kernel size: {tuple(ks)}. "
                         f"Kernel size can't be greater than actual input size")
  G, Og = groups, O // groups
  rows = _conv_rows(xp, weight, bias, ks, stride, dilation, G)
  if rows is None: rows = _conv_im2col(xp, weight, bias, ks, stride, dilation, G)
  if rows is not None: return rows.squeeze(0) if unbatched else rows
  cols = _unfold(xp, ks, stride, dilation)                    # [N, C, *out, *ks]
  out = cols.shape[2:2 + nd]
  cols = cols.reshape(N, G, Cg, *out, *ks)
  cols = cols.permute(0, 1, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd)).unsqueeze(2)   # [N,G,1,*out,Cg,*ks]
  w = weight.reshape(1, G, Og, *(1,) * nd, Cg, *ks)
  y = (cols * w).sum(tuple(range(-(nd + 1), 0))).reshape(N, O, *out)
  if bias is not None: y = y + bias.reshape(1, O, *(1,) * nd)
  return y.squeeze(0) if unbatched else y


# a row-flattened convolution computes outputs for whole padded rows, the extra columns thrown away: it is used
# while they are at most this fraction of the outputs kept
ROWS_WASTE = 0.25
# ...and its flat output length is rounded up to a multiple of this (the CPU's register tile is 2 vectors of 16)
ROWS_MULTIPLE = 32
# its output map is computed as dims of their own (rows_matmul's positions: no padded row's extra columns computed,
# no copy that crops them) where the map's last dim is whole vectors of this many lanes (the widest a register tile
# takes), or at least 3 of them with at most MAP_PAD_WASTE more (a masked last vector). Otherwise flat: a map of 24
# columns padded to 32 ran 7x slower than its flat rows of 26 (no tile takes a third more), one of 28 as 32 and one
# of 14 as 16 about 10% slower than flat with the crop's copy (2-core Xeon, AVX-512). 0: whole vectors only. The
# masked map of 56 columns (4 vectors of 16, 1/7 more) beat flat rows of 58 when the crop's copy cost 1.1 ms (8.9
# against 8.4 + 1.1 ms, 3x3 64->64 batch 8, 2-core Xeon); since elementwise rows take several vectors per work item
# the crop costs 0.2-0.6 ms and flat wins: 9.3-9.6 against 10.1 ms on a 2-core Zen 4 (torch 8.2-8.4)
MAP_LANES = 16
MAP_PAD_WASTE = 0.0


def _conv_rows(xp: Tensor, weight: Tensor, bias, ks: tuple, stride: tuple, dilation: tuple, G: int):
  """A stride-1 convolution of 2 or more spatial dims as a matmul over rows flattened whole, or None when it does
  not pay. The padded input is stored contiguous and read flat (`tensor._unfold_flat`), so each output position
  p = o_0 * (row length) + o_1 * ... is one index that every kernel offset reads at p + offset: the reduction is a
  matmul of the weights [O, Cg * math.prod(ks)] by those windows, with stride-1 loads along p and no padding
  conditions (a register tile of output channels by vectors of positions, as a matmul's). Outputs are computed
  for the whole padded rows (positions past a row's end read the next row: garbage, cut away by the final view)
  and stored with the bias added; the result is a view of that store. A map whose rows fill vectors (MAP_LANES) is
  computed at its own positions instead, as dims: the kernel stores the result itself."""
  nd = len(ks)
  if nd < 2 or builtins.any(s != 1 for s in stride): return None
  N, C, *sp = xp.shape
  O, Cg = weight.shape[:2]
  cs = [math.prod(sp[i + 1:]) for i in range(nd)]
  out = [s - d * (k - 1) for s, k, d in zip(sp, ks, dilation)]
  length = out[0] * cs[0]
  padded = -(-length // ROWS_MULTIPLE) * ROWS_MULTIPLE
  if padded > (1 + ROWS_WASTE) * math.prod(out): return None
  steps = tuple(d * c for d, c in zip(dilation, cs))
  L = padded + builtins.sum((k - 1) * s for k, s in zip(ks, steps))
  # the positions past the input's end that the windows read are whole zero rows appended to the first spatial dim:
  # the copy then loops over rows and columns (a flat pad would divide every position by the row length)
  more = -(-L // cs[0]) - sp[0]
  if more > 0: xp = xp.pad((0, 0) * (nd - 1) + (0, more))
  flat = xp.contiguous().reshape(N * C, -1)
  w = out[-1]
  if w % MAP_LANES == 0 or (w >= 3 * MAP_LANES and (-w) % MAP_LANES <= w * MAP_PAD_WASTE):
    y = rows_matmul(flat, weight, N, G, ks, steps, padded, tuple(zip(out, cs)))
    return y if bias is None else y + bias.reshape(1, O, *(1,) * nd)
  y = rows_matmul(flat, weight, N, G, ks, steps, padded)
  if bias is not None: y = y + bias.reshape(1, O, 1)
  y = y.contiguous()
  # whole padded rows, then one crop of every spatial dim (its gradient is then one padding and a reshape: simple
  # index math for the kernel that stores it)
  rows = -(-padded // cs[0])
  y = y.pad((0, rows * cs[0] - padded)).reshape(N, O, rows, *sp[1:])
  return y[(slice(None), slice(None)) + tuple(slice(0, o) for o in out)]


# a convolution the row path does not take stores its windows as a matrix (im2col) while that holds at most this
# many elements
IM2COL_MAX = 1 << 24
# ...and it has at least this many multiply-adds (below, one kernel reading the windows in place beats three launches)
IM2COL_MIN_WORK = 1 << 20


def _conv_im2col(xp: Tensor, weight: Tensor, bias, ks: tuple, stride: tuple, dilation: tuple, G: int):
  """A convolution as a matmul of its windows stored as rows (im2col: [N * positions, Cg * prod(ks)] per group) by
  the weights transposed, or None (a 1x1 stride-1 convolution is a matmul in place; windows too large to store keep
  the window path). It serves what the row path does not take: strided convolutions, and small maps (a ResNet's
  8x8 .. 1x1 layers, where whole padded rows would waste most of the work). Read in place through the window view,
  such a reduction has padding conditions in its loads and output axes no vector divides (8x8 3x3 64->64 batch 8:
  24 ms of kernels); stored, it is a plain matmul, and so are both its gradients (windows' = g @ w, weights' =
  g.T @ windows: a register tile each, the operands packed by the matmul's rules). The copy costs prod(ks) times
  the input, once; a small convolution (under IM2COL_MIN_WORK) stays one kernel. The product is stored as the
  matmul makes it ([N * positions, O], channels in vector lanes), then copied channels-first ([N, O, *out]), which
  batch norms, activations and the next layer's windows read with plain indices (through the transposing view,
  their indices divided every position back into dims)."""
  nd = len(ks)
  if builtins.all(k == 1 for k in ks) and builtins.all(s == 1 for s in stride): return None
  N, C = xp.shape[:2]
  O, Cg = weight.shape[:2]
  out = [(s - d * (k - 1) - 1) // st + 1 for s, k, st, d in zip(xp.shape[2:], ks, stride, dilation)]
  P, K, Og = math.prod(out), Cg * math.prod(ks), O // G
  if N * P * C * math.prod(ks) > IM2COL_MAX or N * P * O * K < IM2COL_MIN_WORK: return None
  # a padded input that is computed (not stored) is stored padded first: its windows' copy then reads a buffer by
  # strides. Read through the pad (a window over a padded view is no box a mask describes: every index a flat
  # position divided back into dims, and every element's computation, a batch norm and relu, done once per window it
  # falls in), ResNet-18's copies ran at 0.4-1.3 GB/s: its step's kernels 61 -> 53 ms, for one more small kernel per
  # convolution
  n = xp.node
  if n.op == "VIEW" and n.arg.mask is not None and n.src and not n.src[0].realized and n.src[0].op != "BUFFER":
    xp = xp.contiguous()
  cols = _unfold(xp, ks, stride, dilation).reshape(N, G, Cg, *out, *ks)           # [N, G, Cg, *out, *ks]
  # stored in these dims (its copy then indexes each by a stride: reshaped first, every index was a flat position
  # divided back into them), read as rows after
  cols = cols.permute(1, 0, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd)).contiguous()   # [G, N, *out, Cg, *ks]
  cols = cols.reshape(G, N * P, K)
  wt = weight.reshape(G, Og, K).transpose(1, 2)                                    # [G, K, Og]
  y = ((cols[0] @ wt[0]).unsqueeze(0) if G == 1 else cols @ wt).contiguous()      # [G, N * P, Og]
  y = y.reshape(G, N, *out, Og).permute(1, 0, nd + 2, *range(2, 2 + nd)).reshape(N, O, *out)
  if bias is not None: y = y + bias.reshape(1, O, *(1,) * nd)
  return y.contiguous()


def rows_matmul(flat: Tensor, weight: Tensor, N: int, G: int, ks: tuple, steps: tuple, length: int,
                positions: tuple | None = None) -> Tensor:
  """y[n, o, p] = sum over ci, k of weight[o, ci, k] * flat[n, group(o), ci, p + sum(k_i * steps_i)] for p below
  length (flat: [N * C, L], weight: [O, Cg, *ks]): the core of _conv_rows, recorded as one op (CONV_ROWS) whose
  gradients are computed the fast way (autograd's rule below) rather than through the window view's rule. With
  `positions` ((n_0, s_0), .., (n_m, 1)) only the flat positions sum(o_i * s_i) are computed, as dims: y[n, o, o_0,
  .., o_m] (a convolution's output map, with no padded row's extra columns to cut away: the kernel stores the result
  itself, masked where the vectors overrun a row, instead of a store of whole rows and a copy of the crop: 3x3
  64->64 56x56 batch 8, 8.4 + 1.1 ms -> 8.9 ms); the gradient rule embeds its gradient back into the flat layout."""
  from fusegrad import autograd
  nd, (O, Cg) = len(ks), weight.shape[:2]
  dims = (length,) if positions is None else tuple(n for n, _ in positions)
  m = len(dims)
  with autograd.no_grad():
    cols = _unfold_flat(flat, ks, steps, length if positions is None else positions)   # [N*C, *P, *ks]
    cols = cols.reshape(N, G, Cg, *dims, *ks).permute(0, 1, *range(3, 3 + m), 2, *range(3 + m, 3 + m + nd))
    cols = cols.unsqueeze(2)                                                            # [N, G, 1, *P, Cg, *ks]
    w = weight.reshape(1, G, O // G, *(1,) * m, Cg, *ks)
    y = (cols * w).sum(tuple(range(-(nd + 1), 0))).reshape(N, O, *dims)
  return flat._prim("CONV_ROWS", (N, G, tuple(ks), tuple(steps), length, positions), y.node, flat, weight)


def rows_matmul_grad(arg, inputs, out, g):
  """The gradients of rows_matmul. The output gradient is stored once (both reductions then read it with
  unconditional stride-1 loads). The input's is the same operation on the gradient padded in front by the largest
  offset, with the weights flipped and transposed within each group: dflat[ci, q] = sum over o, k of
  g[o, q - off(k)] w[o, ci, k], and q - off(k) = q + off(flip(k)) - max offset. The weights' is a reduction over
  the batch and the positions of the gradient times the windows."""
  N, G, ks, steps, length, positions = arg
  flat, weight = inputs
  nd, (O, Cg), L = len(ks), weight.shape[:2], flat.shape[1]
  Og = O // G
  if positions is not None: g = embed_positions(g, 2, positions, length)   # (0 at the positions not computed)
  g = g.contiguous()
  most = builtins.sum((k - 1) * s for k, s in zip(ks, steps))
  span = -(-L // ROWS_MULTIPLE) * ROWS_MULTIPLE
  gp = g.pad((most, span - length)).reshape(N * O, span + most).contiguous()
  wt = weight.flip(*range(2, 2 + nd)).reshape(G, Og, Cg, *ks).transpose(1, 2).reshape(G * Cg, Og, *ks)
  dflat = rows_matmul(gp, wt, N, G, ks, steps, span).contiguous().narrow(2, 0, L).reshape(N * G * Cg, L)
  # dw[o, ci, k] = sum over n, p of g[n, o, p] * flat[n, ci, p + off(k)], computed as [o, *k, ci] over the input
  # transposed first (channels last): the windows then read the input channels consecutively, and the reduction is a
  # matmul whose columns are those channels (a register tile of output by input channels; in place each output was a
  # dot product along p, at half the machine's rate: 3x3 64->64 56x56 batch 8, 18.9 -> 8.8 ms and a 0.6 ms copy)
  ft = flat.reshape(N * G, Cg, L).transpose(1, 2).contiguous().reshape(N * G, L * Cg)
  cols = _unfold_flat(ft, ks, steps, length, Cg).reshape(N, G, 1, length, *ks, Cg)
  dw = (cols * g.reshape(N, G, Og, length, *(1,) * nd, 1)).sum((0, 3)).reshape(O, *ks, Cg)
  return dflat, dw.permute(0, nd + 1, *range(1, nd + 1))


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
  return _convnd(input, weight, bias, stride, padding, dilation, groups, 1, "conv1d")


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
  return _convnd(input, weight, bias, stride, padding, dilation, groups, 2, "conv2d")


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
  return _convnd(input, weight, bias, stride, padding, dilation, groups, 3, "conv3d")


def _spread(x: Tensor, dim: int, s: int) -> Tensor:
  """Insert s-1 zeros between neighbouring elements along dim (movement ops only)."""
  if s == 1: return x
  n = x.shape[dim]
  after = x.ndim - dim - 1
  y = x.unsqueeze(dim + 1).pad((0, 0) * after + (0, s - 1)).flatten(dim, dim + 1)
  return y.narrow(dim, 0, (n - 1) * s + 1)


def _conv_transposend(input, weight, bias, stride, padding, output_padding, groups, dilation, nd, name) -> Tensor:
  x, unbatched = _batched(input, nd, name)
  if weight.ndim != nd + 2:
    raise RuntimeError(f"{name}: Expected {nd + 2}D weight, got weight of size {list(weight.shape)}")
  stride, dilation = _tuple(stride, nd, "stride"), _tuple(dilation, nd, "dilation")
  padding, output_padding = _tuple(padding, nd, "padding"), _tuple(output_padding, nd, "output_padding")
  for op, s, d in zip(output_padding, stride, dilation):
    if op >= s and op >= d:
      raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got "
                         f"output_padding={output_padding}, stride={stride}, dilation={dilation}")
  C = x.shape[1]
  Cin, Og = weight.shape[:2]
  ks = weight.shape[2:]
  if C != Cin or Cin % groups:
    raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected input{list(x.shape)} to have "
                       f"{Cin} channels, but got {C} channels instead")
  for i in range(nd): x = _spread(x, 2 + i, stride[i])
  pads = []
  for i in range(nd):
    lo = dilation[i] * (ks[i] - 1) - padding[i]
    pads.append((lo, lo + output_padding[i]))
  x = x.pad(tuple(v for lo_hi in reversed(pads) for v in lo_hi))     # negative padding crops
  G = groups
  w = weight.reshape(G, Cin // G, Og, *ks).transpose(1, 2).reshape(G * Og, Cin // G, *ks).flip(*range(2, 2 + nd))
  y = _convnd(x, w, bias, 1, 0, dilation, groups, nd, name)
  return y.squeeze(0) if unbatched else y


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1):
  return _conv_transposend(input, weight, bias, stride, padding, output_padding, groups, dilation, 1, "conv_transpose1d")


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1):
  return _conv_transposend(input, weight, bias, stride, padding, output_padding, groups, dilation, 2, "conv_transpose2d")


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1):
  return _conv_transposend(input, weight, bias, stride, padding, output_padding, groups, dilation, 3, "conv_transpose3d")


# ---- pooling ---------------------------------------------------------------------------------------------------

def _pool_geometry(x: Tensor, nd: int, kernel_size, stride, padding, dilation, ceil_mode: bool):
  ks = _tuple(kernel_size, nd, "kernel_size")
  st = ks if stride is None or stride == [] or stride == () else _tuple(stride, nd, "stride")
  pd, dl = _tuple(padding, nd, "padding"), _tuple(dilation, nd, "dilation")
  if builtins.any(k <= 0 for k in ks) or builtins.any(s <= 0 for s in st):
    raise RuntimeError(f"kernel_size {ks} and stride {st} must be greater than zero")
  for p, k in zip(pd, ks):
    if p > k // 2:
      raise RuntimeError(f"pad should be at most half of effective kernel size, but got pad={p}, kernel_size={k}")
  sp = x.shape[-nd:]
  out, extra = [], []
  for L, k, s, p, d in zip(sp, ks, st, pd, dl):
    eff = d * (k - 1) + 1
    num = L + 2 * p - eff
    o = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (o - 1) * s >= L + p: o -= 1     # the last window must start inside the input or left pad
    if o <= 0:
      raise RuntimeError(f"Given input size: {tuple(x.shape)}. Calculated output size is too small (kernel {ks}, "
                         f"stride {st}, padding {pd}, dilation {dl})")
    out.append(o)
    extra.append(builtins.max(0, (o - 1) * s + eff - (L + 2 * p)))   # right-hand overhang of ceil_mode windows
  return ks, st, pd, dl, out, extra


def _max_poolnd(input, nd, kernel_size, stride, padding, dilation, ceil_mode, return_indices, name):
  x, unbatched = _batched(input, nd, name)
  ks, st, pd, dl, out, extra = _pool_geometry(x, nd, kernel_size, stride, padding, dilation, ceil_mode)
  fill = -math.inf if x.dtype.is_float else int(np.iinfo(x.dtype.np).min)
  xp = _pad_spatial(x, [(p, p + e) for p, e in zip(pd, extra)], value=fill)
  cols = _unfold(xp, ks, st, dl)
  K = math.prod(ks)
  cols = cols.reshape(*cols.shape[:2 + nd], K)
  # the gradient goes to the first maximum of each window, as PyTorch's max_pool routes it
  first = cols.detach().argmax(-1, keepdim=True)
  pick = fg.arange(K, device=x.device) == first
  y = where(pick, cols, 0).sum(-1)
  if not return_indices: return y.squeeze(0) if unbatched else y
  # flat index into the (unpadded) input plane of each window's maximum
  idx = first.squeeze(-1)
  flat = None
  rem = idx
  for i in range(nd):
    inner = math.prod(ks[i + 1:])
    ki = rem // inner
    rem = rem - ki * inner
    o = fg.arange(out[i], device=x.device).reshape(*[out[i] if j == i else 1 for j in range(nd)])
    pos = o * st[i] - pd[i] + ki * dl[i]
    flat = pos if flat is None else flat * x.shape[2 + i] + pos
  if unbatched: return y.squeeze(0), flat.squeeze(0)
  return y, flat


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
  return _max_poolnd(input, 1, kernel_size, stride, padding, dilation, ceil_mode, return_indices, "max_pool1d")


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
  return _max_poolnd(input, 2, kernel_size, stride, padding, dilation, ceil_mode, return_indices, "max_pool2d")


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
  return _max_poolnd(input, 3, kernel_size, stride, padding, dilation, ceil_mode, return_indices, "max_pool3d")


def _avg_poolnd(input, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, name):
  x, unbatched = _batched(input, nd, name)
  ks, st, pd, dl, out, extra = _pool_geometry(x, nd, kernel_size, stride, padding, 1, ceil_mode)
  xp = _pad_spatial(x, [(p, p + e) for p, e in zip(pd, extra)])
  axes = tuple(range(-nd, 0))
  s = _unfold(xp, ks, st, dl).sum(axes)
  if divisor_override:
    div = divisor_override
  elif (count_include_pad or not builtins.any(pd)) and not builtins.any(extra):
    div = math.prod(ks)
  else:   # count the positions each window covers: padding counts if asked, the ceil_mode overhang never does
    ones = fg.ones(*x.shape[-nd:], device=x.device)
    ones = _pad_spatial(ones, [(p, p) for p in pd], value=1.0 if count_include_pad else 0.0)
    ones = _pad_spatial(ones, [(0, e) for e in extra])
    div = _unfold(ones, ks, st, dl).sum(axes)
  y = (s / div)._cast(x.dtype) if x.dtype.is_float else s // div
  return y.squeeze(0) if unbatched else y


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
  return _avg_poolnd(input, 1, kernel_size, stride, padding, ceil_mode, count_include_pad, None, "avg_pool1d")


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
  return _avg_poolnd(input, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
                     "avg_pool2d")


def _adaptive_avg_poolnd(input: Tensor, output_size, nd: int, name: str) -> Tensor:
  x, unbatched = _batched(input, nd, name)
  osz = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * nd
  if len(osz) != nd: raise ValueError(f"{name}: output_size must have {nd} elements, got {output_size!r}")
  for i in range(nd):
    L, o = x.shape[2 + i], osz[i] if osz[i] is not None else x.shape[2 + i]
    if o <= 0: raise RuntimeError(f"{name}: output size must be positive, got {tuple(osz)}")
    dim = 2 + i
    if L % o == 0:   # equal bins: a reshape and a mean
      y = x.unflatten(dim, (o, L // o)).mean(dim + 1)
    else:            # PyTorch's bins [floor(j*L/o), ceil((j+1)*L/o)): an averaging matrix
      a = np.zeros((o, L), np.float32)
      for j in range(o):
        lo, hi = (j * L) // o, -(-((j + 1) * L) // o)
        a[j, lo:hi] = 1.0 / (hi - lo)
      m = fg.tensor(a, dtype=x.dtype, device=x.device)
      y = (x.transpose(dim, -1) @ m.T).transpose(dim, -1)
    x = y
  return x.squeeze(0) if unbatched else x


def adaptive_avg_pool1d(input, output_size): return _adaptive_avg_poolnd(input, output_size, 1, "adaptive_avg_pool1d")
def adaptive_avg_pool2d(input, output_size): return _adaptive_avg_poolnd(input, output_size, 2, "adaptive_avg_pool2d")


def _adaptive_max_poolnd(input: Tensor, output_size, return_indices: bool, nd: int, name: str):
  """Max over torch's adaptive bins [floor(j*L/o), ceil((j+1)*L/o)) of each spatial dim. Each dim's bins become a
  window axis: a reshape where they tile (L % o == 0), else a gather of host-built positions padded to the widest bin
  by repeating the bin's last element (a repeat changes neither the max nor which element is first). The windows'
  first maximum takes the value and the gradient (one-hot select, as max_pool's) and gives the flat index."""
  _check_tensor(input, name)
  if nd == 1 and input.ndim not in (2, 3):
    raise RuntimeError(f"Expected 2 to 3 dimensions, but got {input.ndim}-dimensional tensor for argument #1 'self' "
                       f"(while checking arguments for adaptive_max_pool1d)")
  if nd == 2 and input.ndim not in (3, 4):
    raise RuntimeError(f"adaptive_max_pool2d(): Expected 3D or 4D tensor, but got: {list(input.shape)}")
  osz = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,) * nd
  if len(osz) != nd:
    if nd == 1: raise RuntimeError(f"adaptive_max_pool1d() argument 'output_size' should contain one int (got {len(osz)})")
    raise ValueError(f"{name}: output_size must have {nd} elements, got {output_size!r}")
  if not input.dtype.is_float:
    raise NotImplementedError(f"\"adaptive_max_pool2d\" not implemented for '{dt.scalar_name(input.dtype)}'")
  for i in range(1, input.ndim):
    if input.shape[i] == 0:
      raise RuntimeError(f"{name}(): Expected input to have non-zero size for non-batch dimensions, but input has "
                         f"sizes {list(input.shape)} with dimension {i} being empty")
  x, unbatched = _batched(input, nd, name)
  sp = x.shape[2:]
  osz = tuple(sp[i] if o is None else int(o) for i, o in enumerate(osz))
  if builtins.any(o < 0 for o in osz):
    raise RuntimeError(f"Trying to create tensor with negative dimension: {list(x.shape[:2]) + list(osz)}")
  out_shape = x.shape[:2] + osz
  if math.prod(out_shape) == 0:
    y, idx = fg.zeros(*out_shape, dtype=x.dtype, device=x.device), fg.zeros(*out_shape, dtype=dt.int64, device=x.device)
    if x.requires_grad: y = y + x.sum() * 0   # (connected to the input, as torch's empty result is)
  else:
    cols, tables = x, []
    for i, (L, o) in enumerate(zip(sp, osz)):
      lo = [(j * L) // o for j in range(o)]
      hi = [-(-((j + 1) * L) // o) for j in range(o)]
      k = builtins.max(h - l for l, h in zip(lo, hi))
      tbl = np.array([[builtins.min(l + t, h - 1) for t in range(k)] for l, h in zip(lo, hi)], np.int64)   # [o, k]
      tables.append(tbl)
      dim = 2 + i
      if L % o == 0: cols = cols.unflatten(dim, (o, k))
      else: cols = cols.index_select(dim, fg.tensor(tbl.reshape(-1), device=x.device)).unflatten(dim, (o, k))
      cols = cols.movedim(dim + 1, -1)                       # [N, C, o_0..o_i, rest of the input, k_0..k_i]
    K = math.prod(t.shape[1] for t in tables)
    cols = cols.reshape(*out_shape, K)
    first = cols.detach().argmax(-1, keepdim=True)
    pick = fg.arange(K, device=x.device) == first
    y = where(pick, cols, 0).sum(-1)
    # the flat input position of every window element, [*out, K], on the host (it depends on shapes only)
    pos = np.zeros((), np.int64)
    for i, tbl in enumerate(tables):
      o, k = tbl.shape
      shape = [1] * (2 * nd)
      shape[i], shape[nd + i] = o, k
      pos = pos * sp[i] + tbl.reshape(shape)
    idx = where(pick, fg.tensor(pos.reshape(*osz, K), device=x.device), 0).sum(-1)
  if unbatched: y, idx = y.squeeze(0), idx.squeeze(0)
  return (y, idx) if return_indices else y


def adaptive_max_pool1d(input, output_size, return_indices: bool = False):
  return _adaptive_max_poolnd(input, output_size, return_indices, 1, "adaptive_max_pool1d")


def adaptive_max_pool2d(input, output_size, return_indices: bool = False):
  return _adaptive_max_poolnd(input, output_size, return_indices, 2, "adaptive_max_pool2d")


# ---- normalization -----------------------------------------------------------------------------------------------

def _affine_shape(x: Tensor, c: int) -> tuple: return (1, c) + (1,) * (x.ndim - 2)


def batch_norm(input: Tensor, running_mean, running_var, weight=None, bias=None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
  _check_tensor(input, "batch_norm")
  if input.ndim < 2:
    raise ValueError(f"batch_norm: expected 2D or more input (N, C, ...), got input of size {list(input.shape)}")
  C = input.shape[1]
  for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
    if t is not None and t.shape != (C,):
      raise RuntimeError(f"batch_norm: {name} should contain {C} elements not {t.numel()}")
  if training:
    if input.numel() // C <= 1:
      raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(input.shape)}")
    if running_mean is None and running_var is None:
      return _batch_norm(input, None, None, weight, bias, True, None, eps)
    # the pure part is one templated call, which also returns the new running statistics; writing them stays
    # here (a templated function writes no input). A momentum that is a constant tensor (a cumulative average's
    # 1 / num_batches_tracked, whose count folds to a new constant every step) would key a new template every
    # call (a constant's value is in the key): that call runs the function itself
    core = _batch_norm.__wrapped__ if isinstance(momentum, Tensor) and momentum.node.op == "CONST" else _batch_norm
    y, *new = core(input, running_mean, running_var, weight, bias, True, momentum, eps)
    with fg.no_grad():
      if running_mean is not None: running_mean._assign(new.pop(0))
      if running_var is not None: running_var._assign(new.pop(0))
    return y
  if running_mean is None or running_var is None:
    raise RuntimeError("batch_norm in eval mode needs running_mean and running_var")
  return _batch_norm(input, running_mean, running_var, weight, bias, False, None, eps)


@templated   # (a training call is ~40 frontend ops: made again directly for inputs of one structure)
def _batch_norm(input: Tensor, running_mean, running_var, weight, bias, training: bool, momentum, eps: float):
  """batch_norm's graph: y, and in training with running statistics also their new values, as a tuple
  (y, new running_mean if given, new running_var if given); momentum: a number or a tensor (a cumulative average's
  1 / num_batches_tracked)."""
  C = input.shape[1]
  axes = (0,) + tuple(range(2, input.ndim))
  shp = _affine_shape(input, C)
  new = []
  if training:
    n = input.numel() // C
    mean, xc, var = _moments(input, axes)   # shifted two-pass statistics (tensor._moments says why)
    if running_mean is not None:
      with fg.no_grad():
        new.append(((1 - momentum) * running_mean + momentum * mean.detach().reshape(C))._cast(running_mean.dtype))
    if running_var is not None:
      with fg.no_grad():
        unbiased = var.detach().reshape(C) * (n / (n - 1))
        new.append(((1 - momentum) * running_var + momentum * unbiased)._cast(running_var.dtype))
  else:
    mean, var = running_mean.reshape(shp), running_var.reshape(shp)
    xc = input - mean
  y = xc * (var + eps).rsqrt()
  if weight is not None: y = y * weight.reshape(shp)
  if bias is not None: y = y + bias.reshape(shp)
  return (y, *new) if new else y


def _check_normalized_shape(input: Tensor, normalized_shape, name: str) -> tuple:
  _check_tensor(input, name)
  ns = (normalized_shape,) if isinstance(normalized_shape, (int, np.integer)) else tuple(normalized_shape)
  if len(ns) == 0 or tuple(input.shape[-len(ns):]) != ns or input.ndim < len(ns):
    raise RuntimeError(f"{name}: Given normalized_shape={list(ns)}, expected input with shape [*, "
                       f"{', '.join(map(str, ns))}], but got input of size {list(input.shape)}")
  return ns


def _norm_in_float32(fn, input: Tensor, *params):
  """A normalization of float16/bfloat16 values in float32, rounded once at the end, as PyTorch's kernels
  compute it (the result keeps the dtype the 16-bit computation would have)."""
  d = _result_type(input, *[p for p in params if p is not None])
  if d not in HALF_FLOATS: return None
  return fn(input._cast(dt.float32), *[p._cast(dt.float32) if p is not None else None for p in params])._cast(d)


@templated
def layer_norm(input: Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
  ns = _check_normalized_shape(input, normalized_shape, "layer_norm")
  y = _norm_in_float32(lambda x, w, b: layer_norm(x, normalized_shape, w, b, eps), input, weight, bias)
  if y is not None: return y
  axes = tuple(range(input.ndim - len(ns), input.ndim))
  _, xc, var = _moments(input, axes)
  y = xc * (var + eps).rsqrt()
  if weight is not None: y = y * weight
  if bias is not None: y = y + bias
  return y


@templated
def rms_norm(input: Tensor, normalized_shape, weight=None, eps: float | None = None) -> Tensor:
  ns = _check_normalized_shape(input, normalized_shape, "rms_norm")
  # torch.finfo(...).eps of the compute dtype: float32's for float16/bfloat16 inputs (measured with torch 2.13)
  if eps is None: eps = 2.220446049250313e-16 if input.dtype == dt.float64 else 1.1920928955078125e-07
  y = _norm_in_float32(lambda x, w: rms_norm(x, normalized_shape, w, eps), input, weight)
  if y is not None: return y
  axes = tuple(range(-len(ns), 0))
  y = input * (input.square().mean(axes, keepdim=True) + eps).rsqrt()
  return y * weight if weight is not None else y


@templated   # (its checks raise before any node is made; a float16 call runs its float32 one, itself templated)
def group_norm(input: Tensor, num_groups: int, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
  _check_tensor(input, "group_norm")
  if input.ndim < 2: raise RuntimeError(f"group_norm: expected at least 2D input, got {list(input.shape)}")
  N, C = input.shape[:2]
  if num_groups <= 0 or C % num_groups:
    raise RuntimeError(f"Expected number of channels in input to be divisible by num_groups, but got input of shape "
                       f"{list(input.shape)} and num_groups={num_groups}")
  y = _norm_in_float32(lambda x, w, b: group_norm(x, num_groups, w, b, eps), input, weight, bias)
  if y is not None: return y
  x = input.reshape(N, num_groups, -1)
  _, xc, var = _moments(x, (2,))
  y = (xc * (var + eps).rsqrt()).reshape(input.shape)
  shp = _affine_shape(input, C)
  if weight is not None: y = y * weight.reshape(shp)
  if bias is not None: y = y + bias.reshape(shp)
  return y


def instance_norm(input: Tensor, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
  """Each (sample, channel) plane normalized over its spatial dims. With running statistics and use_input_stats they
  move towards the batch's average of the per-instance mean and unbiased variance, as torch's (its batch norm over
  [1, N * C, ...] whose N copies of the running values are averaged back); without use_input_stats they normalize,
  as batch_norm's eval mode."""
  _check_tensor(input, "instance_norm")
  if input.ndim < 2:
    raise ValueError(f"instance_norm: expected 2D or more input (N, C, ...), got input of size {list(input.shape)}")
  N, C = input.shape[:2]
  if use_input_stats and math.prod(input.shape[2:]) == 1:
    raise ValueError(f"Expected more than 1 spatial element when training, got input size torch.Size({list(input.shape)})")
  for pname, t in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
    if t is not None and t.numel() != C:
      raise RuntimeError(f"{pname} should contain {N * C} elements not {N * t.numel()}")
  if not use_input_stats:
    if running_mean is None or running_var is None:
      raise RuntimeError("Expected running_mean and running_var to be defined when use_input_stats is false")
    return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
  d = _result_type(input, *[p for p in (weight, bias) if p is not None])
  x = input._cast(dt.float32) if d in HALF_FLOATS else input
  axes = tuple(range(2, input.ndim))
  mean, xc, var = _moments(x, axes)
  y = xc * (var + eps).rsqrt()
  shp = _affine_shape(input, C)
  if weight is not None: y = y * weight._cast(x.dtype).reshape(shp)
  if bias is not None: y = y + bias._cast(x.dtype).reshape(shp)
  if d in HALF_FLOATS: y = y._cast(d)
  n = math.prod(input.shape[2:])
  with fg.no_grad():
    if running_mean is not None:
      new = (1 - momentum) * running_mean + momentum * mean.detach().reshape(N, C).mean(0)
      running_mean._assign(new._cast(running_mean.dtype))
    if running_var is not None:
      unbiased = var.detach().reshape(N, C) * (n / (n - 1))
      running_var._assign(((1 - momentum) * running_var + momentum * unbiased.mean(0))._cast(running_var.dtype))
  return y


# ---- embedding, dropout, attention -------------------------------------------------------------------------------

def _check_index(t: Tensor, name: str) -> None:
  if not isinstance(t, Tensor) or t.dtype.is_float or t.dtype.is_bool:
    raise RuntimeError(f"{name}: Expected tensor for argument #1 'indices' to have one of the following scalar types: "
                       f"Long, Int; but got {getattr(t, 'dtype', type(t).__name__)} instead")


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:
  _check_index(input, "embedding")
  if not isinstance(weight, Tensor) or weight.ndim != 2:
    raise RuntimeError(f"embedding: weight must be a 2-D tensor, got {getattr(weight, 'shape', type(weight).__name__)}")
  # negative indices do not wrap here (PyTorch refuses them); a lazy out-of-range index gives a zero row
  input = _index_in_range(input, weight.shape[0], IndexError,
                          lambda v: f"index out of range in self (index {v}, {weight.shape[0]} embeddings)")
  out = _take_rows(weight, input)
  if padding_idx is not None:   # that row gets no gradient
    if padding_idx < 0: padding_idx += weight.shape[0]
    out = where((input == padding_idx).unsqueeze(-1), out.detach(), out)
  return out


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
  if not 0.0 <= p <= 1.0: raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
  if not training or p == 0.0: return input
  if p == 1.0: return input * 0
  keep = fg.rand(*input.shape, device=input.device) >= p
  return where(keep, input * (1.0 / (1.0 - p)), 0)._cast(input.dtype)


_causal_masks: dict = {}


def _causal_mask(L: int, S: int, device: str) -> Tensor:
  """A realized lower-triangular bool mask, made once per (L, S, device): read from memory it fuses into
  the softmax kernel, where a mask computed from indices would be recomputed for every batch and head."""
  key = (L, S, device)
  m = _causal_masks.get(key)
  if m is None:
    if len(_causal_masks) > 64: _causal_masks.clear()
    m = _causal_masks[key] = fg.ones(L, S, dtype=fg.bool, device=device).tril().realize()
  return m


@templated
def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
  """softmax(q @ k^T * scale + mask) @ v over [..., L, E] x [..., S, E] x [..., S, Ev]."""
  if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
    raise RuntimeError(f"scaled_dot_product_attention: expected at least 2D query/key/value, got {list(query.shape)}, "
                       f"{list(key.shape)}, {list(value.shape)}")
  if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
    raise RuntimeError(f"scaled_dot_product_attention: shapes do not fit: query {list(query.shape)}, key "
                       f"{list(key.shape)}, value {list(value.shape)}")
  if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
    hq, hk = query.shape[-3], key.shape[-3]
    if hq % hk: raise RuntimeError(f"number of query heads {hq} must be a multiple of key/value heads {hk}")
    key = key.unsqueeze(-3).expand(*key.shape[:-2], hq // hk, *key.shape[-2:]).flatten(-4, -3)
    value = value.unsqueeze(-3).expand(*value.shape[:-2], hq // hk, *value.shape[-2:]).flatten(-4, -3)
  L, S = query.shape[-2], key.shape[-2]
  s = (query @ key.transpose(-2, -1)) * (scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]))
  if is_causal:
    if attn_mask is not None: raise RuntimeError("scaled_dot_product_attention: pass either attn_mask or is_causal")
    attn_mask = _causal_mask(L, S, query.device)
  if attn_mask is not None:
    s = s.masked_fill(attn_mask.logical_not(), -math.inf) if attn_mask.dtype.is_bool else s + attn_mask
  p = s.softmax(-1)
  if dropout_p > 0: p = dropout(p, dropout_p)
  return p @ value


# ---- losses ------------------------------------------------------------------------------------------------------

def _reduce(loss: Tensor, reduction: str) -> Tensor:
  if reduction == "mean": return loss.mean()
  if reduction == "sum": return loss.sum()
  if reduction == "none": return loss
  raise ValueError(f"{reduction} is not a valid value for reduction")


def _check_same(input: Tensor, target: Tensor, name: str) -> tuple[Tensor, Tensor]:
  _check_tensor(input, name)
  if not isinstance(target, Tensor): raise TypeError(f"{name}: target must be a Tensor, got {type(target).__name__}")
  if input.shape != target.shape: fg.broadcast_shapes(input.shape, target.shape)   # raises naming both shapes
  return input, target


@templated
def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
  input, target = _check_same(input, target, "mse_loss")
  return _reduce((input - target).square(), reduction)


def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
  input, target = _check_same(input, target, "l1_loss")
  return _reduce((input - target).abs(), reduction)


def smooth_l1_loss(input: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
  input, target = _check_same(input, target, "smooth_l1_loss")
  if beta < 0: raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
  d = (input - target).abs()
  if beta == 0: return _reduce(d, reduction)
  return _reduce(where(d < beta, 0.5 * d.square() / beta, d - 0.5 * beta), reduction)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
  input, target = _check_same(input, target, "huber_loss")
  d = (input - target).abs()
  return _reduce(where(d < delta, 0.5 * d.square(), delta * (d - 0.5 * delta)), reduction)


@_trace.check
def _check_target_values(target: Tensor, C: int, ignore_index: int) -> None:
  """Class indices that already exist are checked here (a lazy target cannot be checked without running it)."""
  if target.node.realized or target.node.op == "BUFFER":
    v = target.numpy()
    bad = v[(v != ignore_index) & ((v < 0) | (v >= C))]
    if bad.size: raise IndexError(f"Target {bad.flat[0]} is out of bounds (number of classes {C}).")


def _check_class_target(input: Tensor, target: Tensor, weight, ignore_index: int, name: str) -> None:
  """The checks of class-index targets for scores input [N, C, *] (or [C]): shapes, then the indices' values where
  the target exists already. Made before the templated loss (a value check reads the target on the host, which a
  template cannot record)."""
  _check_index(target, name)
  if input.ndim < 1: raise ValueError(f"{name}: expected 1D or more input, got {list(input.shape)}")
  shape, tshape = input.shape, target.shape
  if input.ndim == 1:   # unbatched: scores [C] and one class index (as the loss sees them: a batch of one)
    shape, tshape = (1,) + shape, (1,) if target.numel() == 1 else tshape
  N, C = shape[:2]
  if tshape != (N,) + shape[2:]:
    if len(tshape) and tshape[0] != N:
      raise ValueError(f"Expected input batch_size ({N}) to match target batch_size ({tshape[0]}).")
    raise RuntimeError(f"{name}: expected target of size {[N] + list(shape[2:])}, got {list(target.shape)}")
  if weight is not None and weight.shape != (C,):
    raise RuntimeError(f"{name}: weight tensor should be defined either for all {C} classes or no classes but got "
                       f"weight tensor of shape: {list(weight.shape)}")
  _check_target_values(target, C, ignore_index)


# cross_entropy over at least this many classes (unweighted, float32/float64 logits) picks each target's logit by a
# gather from the logits instead of a one-hot select: the select is a pass over all N x C logits of its own (a GPT-2
# vocabulary of 50257 on 1024 rows: 85 of its 110 ms), the gather reads N of them
PICK_GATHER_MIN = 1024


@templated
def _class_loss(logp: Tensor, target: Tensor, weight, ignore_index: int, reduction: str,
                label_smoothing: float, picked: Tensor | None = None) -> Tensor:
  """The nll of class-index targets over log-probabilities logp [N, C, *] (or [C]), with PyTorch's weighting,
  ignore_index and label smoothing; one-hot selects (no gather) so it fuses with the log_softmax, or `picked`, the
  target's log-probability [N, *] computed by the caller (unweighted). The arguments are checked
  (_check_class_target)."""
  unbatched = logp.ndim == 1
  if unbatched: logp, target = logp.unsqueeze(0), target.reshape(1)
  C = logp.shape[1]
  extra = (1,) * (logp.ndim - 2)
  valid = target != ignore_index
  cls = fg.arange(C, device=logp.device).reshape(1, C, *extra)
  onehot = target.unsqueeze(1) == cls                                     # [N, C, *]
  wc = weight.reshape(1, C, *extra)._cast(logp.dtype) if weight is not None else None
  # (an ignored target's terms are selected away, not multiplied by 0: with every target ignored the mean is 0 / 0,
  # NaN as PyTorch's, and the division's infinite derivative times 0 made every logit's gradient NaN where PyTorch's
  # is 0)
  if picked is not None:
    nll = where(valid, -picked, 0)
  else:
    picked = where(onehot, logp, 0)
    if wc is not None: picked = picked * wc
    nll = where(valid, -picked.sum(1), 0)                                 # [N, *]
  wt = (where(onehot, wc, 0).sum(1) * valid) if wc is not None else valid._cast(logp.dtype)
  if label_smoothing > 0:
    sm = where(valid, -((logp * wc) if wc is not None else logp).sum(1), 0)
    if reduction == "mean": out = (1 - label_smoothing) * nll.sum() / wt.sum() + label_smoothing / C * sm.sum() / wt.sum()
    elif reduction == "sum": out = (1 - label_smoothing) * nll.sum() + label_smoothing / C * sm.sum()
    else: out = (1 - label_smoothing) * nll + label_smoothing / C * sm
  elif reduction == "mean": out = nll.sum() / wt.sum()
  else: out = _reduce(nll, reduction)
  return out.squeeze(0) if unbatched and reduction == "none" else out


def nll_loss(input: Tensor, target: Tensor, weight=None, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
  if reduction not in ("mean", "sum", "none"): raise ValueError(f"{reduction} is not a valid value for reduction")
  _check_class_target(input, target, weight, ignore_index, "nll_loss")
  return _class_loss(input, target, weight, ignore_index, reduction, 0.0)


def cross_entropy(input: Tensor, target: Tensor, weight=None, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
  if not 0.0 <= label_smoothing <= 1.0:
    raise ValueError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
  if reduction not in ("mean", "sum", "none"): raise ValueError(f"{reduction} is not a valid value for reduction")
  if input.ndim < 1: raise ValueError(f"cross_entropy: expected 1D or more input, got {list(input.shape)}")
  if isinstance(target, Tensor) and target.dtype.is_float:     # class probabilities
    if target.shape != input.shape:
      raise RuntimeError(f"cross_entropy: probability target of size {list(target.shape)} must match input size "
                         f"{list(input.shape)}")
  else: _check_class_target(input, target, weight, ignore_index, "cross_entropy")
  return _cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing)


@templated
def _cross_entropy(input: Tensor, target: Tensor, weight, ignore_index: int, reduction: str,
                   label_smoothing: float) -> Tensor:
  """cross_entropy of checked arguments."""
  cdim = 0 if input.ndim == 1 else 1
  if target.dtype.is_float:     # class probabilities
    logp = input.log_softmax(cdim)
    C = input.shape[cdim]
    t = target * (1 - label_smoothing) + label_smoothing / C if label_smoothing > 0 else target
    terms = logp * t
    if weight is not None: terms = terms * weight.reshape(C, *(1,) * (input.ndim - cdim - 1))
    loss = -terms.sum(cdim)
    if reduction == "mean": return loss.sum() / builtins.max(1, input.numel() // C)
    return _reduce(loss, reduction)
  picked = None
  if weight is None and input.ndim > 1 and input.shape[1] >= PICK_GATHER_MIN and input.dtype in (dt.float32, dt.float64):
    # log_softmax's value at each target (the same steps: x - max - log(sum(exp(x - max)))), the logit gathered
    m = Tensor(_node=input._reduce("MAX", 1, True).node)   # detached, as log_softmax's
    lse = (input - m).exp().sum(1, keepdim=True).log()
    t = where(target != ignore_index, target, 0).unsqueeze(1)
    picked = ((input.gather(1, t) - m) - lse).squeeze(1)
    logp = (input - m) - lse   # (read by label smoothing's sum only)
  else:
    logp = input.log_softmax(cdim)
  return _class_loss(logp, target, weight, ignore_index, reduction, label_smoothing, picked)


@templated
def binary_cross_entropy(input: Tensor, target: Tensor, weight=None, reduction: str = "mean") -> Tensor:
  if target.shape != input.shape:
    raise ValueError(f"Using a target size ({tuple(target.shape)}) that is different to the input size "
                     f"({tuple(input.shape)}) is deprecated. Please ensure they have the same size.")
  # PyTorch clamps the logs at -100 so that 0 * log(0) stays finite
  loss = -(target * input.log().clamp_min(-100) + (1 - target) * (1 - input).log().clamp_min(-100))
  if weight is not None: loss = loss * weight
  return _reduce(loss, reduction)


@templated
def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight=None, reduction: str = "mean",
                                     pos_weight=None) -> Tensor:
  if target.shape != input.shape:
    raise ValueError(f"Target size ({tuple(target.shape)}) must be the same as input size ({tuple(input.shape)})")
  # sp = log(1 + exp(-x)) = log(1 + exp(-|x|)) + max(-x, 0) without overflow; selects rather than abs and relu,
  # whose gradients at 0 would both be 0 (the right one there is -1/2, PyTorch's sigmoid(x) - 1)
  neg = input <= 0
  lg = where(neg, input, -input).exp().log1p()
  sp = where(neg, lg - input, lg)
  if pos_weight is not None:
    loss = (1 - target) * input + ((pos_weight - 1) * target + 1) * sp
  else:
    loss = (1 - target) * input + sp
  if weight is not None: loss = loss * weight
  return _reduce(loss, reduction)


def kl_div(input: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
  if log_target: loss = target.exp() * (target - input)
  else: loss = where(target > 0, target * where(target > 0, target, 1).log(), 0) - target * input
  if reduction == "batchmean": return loss.sum() / (input.shape[0] if input.ndim else 1)
  return _reduce(loss, reduction)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
  if not isinstance(tensor, Tensor) or tensor.dtype != dt.int64:
    raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
  if num_classes == -1:
    if tensor.numel() == 0: raise RuntimeError("Can not infer total number of classes from empty tensor.")
    num_classes = int(tensor.max().item()) + 1
  if tensor.node.realized or tensor.node.op == "BUFFER":
    v = tensor.numpy()
    if v.size and (v.min() < 0 or v.max() >= num_classes): raise RuntimeError("Class values must be smaller than num_classes.")
  return (tensor.unsqueeze(-1) == fg.arange(num_classes, device=tensor.device))._cast(dt.int64)


# resampling, rearranging and the further losses live in their own modules; they are part of this namespace
from fusegrad.nn.sampling import *  # noqa: E402,F401,F403
from fusegrad.nn.losses import *  # noqa: E402,F401,F403
from fusegrad.nn.activation import *  # noqa: E402,F401,F403
from fusegrad.nn.dropout import *  # noqa: E402,F401,F403


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
  """y[..., o] = sum_ij input1[..., i] weight[o, i, j] input2[..., j] + bias[o]: one matmul against weight laid out
  [in1, out * in2], then a product with input2 reduced over in2."""
  if input1.ndim != input2.ndim:
    raise RuntimeError(f"bilinear(): input dimensions do not match: got {input1.ndim} and {input2.ndim}")
  for i in range(input1.ndim - 1):
    if input1.shape[i] != input2.shape[i]:
      raise RuntimeError(f"bilinear(): input batch dimensions do not match at dim {i}: got {input1.shape[i]} and "
                         f"{input2.shape[i]}")
  for k, x in ((1, input1), (2, input2)):
    if weight.ndim > k and x.shape[-1] != weight.shape[k]:
      raise RuntimeError(f"bilinear(): input{k} size does not match weight size: got {x.shape[-1]} but expected "
                         f"{weight.shape[k]}")
  if weight.ndim != 3: raise RuntimeError(f"bilinear(): weight must be 3-D, got {weight.ndim}-D")
  O, I, J = weight.shape
  if bias is not None and bias.shape[0] != O:
    raise RuntimeError(f"bilinear(): bias size does not match weight size: got {bias.shape[0]} but expected {O}")
  x1, x2 = input1.reshape(-1, I), input2.reshape(-1, 1, J)
  out = ((x1 @ weight.permute(1, 0, 2).reshape(I, O * J)).reshape(-1, O, J) * x2).sum(-1)
  if bias is not None: out = out + bias
  return out.reshape(*input1.shape[:-1], O)


def local_response_norm(input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> Tensor:
  """input / (k + alpha * mean of the squares over a window of `size` channels, zero-padded)^beta, as torch's."""
  if input.ndim < 3:
    raise ValueError(f"Expected 3D or higher dimensionality                          input (got {input.ndim} "
                     f"dimensions)")   # (torch's spaces)
  if input.numel() == 0: return input
  C = input.shape[1]
  sq = input.square().pad((0, 0) * (input.ndim - 2) + (size // 2, (size - 1) // 2))
  div = sq.narrow(1, 0, C)
  for i in range(1, size): div = div + sq.narrow(1, i, C)
  return input / (div / size * alpha + k).pow(beta)
