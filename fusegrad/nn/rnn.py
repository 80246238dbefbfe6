"""Recurrent layers (RNN, LSTM, GRU and their cells) with PyTorch's arguments, parameter names, shapes, init
and return values, so a torch state_dict loads unchanged.

The time loop is unrolled into one lazy graph: the input projection of every step is one matmul over the
whole sequence before the loop, each step adds only h @ W_hhᵀ and the gate math, and nothing is realized
inside the loop; the caller's realize (or backward) schedules the whole sequence at once.
"""
from __future__ import annotations
import math
import numbers
import warnings
import fusegrad as fg
from fusegrad.tensor import Tensor
from fusegrad.nn import functional as F, init
from fusegrad.nn.module import Module, Parameter
from fusegrad.engine.realize import later as realize_later

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _refuse_packed(input, name: str) -> None:
  # torch.nn.utils.rnn.PackedSequence is a namedtuple (data, batch_sizes, sorted_indices, unsorted_indices)
  if not isinstance(input, Tensor) and hasattr(input, "batch_sizes") and hasattr(input, "data"):
    raise NotImplementedError(f"{name}: packed sequences (PackedSequence) are not supported; pass a padded "
                              f"Tensor of shape (L, N, H_in) (or (N, L, H_in) with batch_first=True) instead")
  if not isinstance(input, Tensor):
    raise TypeError(f"{name}: expected input to be a Tensor, got {type(input).__name__}")


# ---- one step of each kind, on a precomputed input projection -------------------------------------------------
# xp: x @ W_ihᵀ (+ the biases that can be added before the loop), [N, gates * H]; h, c: [N, H_out], [N, H], or
# None for a zero initial state, whose h @ W_hhᵀ (a matmul kernel) and f * c are skipped

def _rnn_step(xp: Tensor, h: Tensor | None, w_hh: Tensor, relu: bool) -> Tensor:
  a = xp if h is None else xp + F.linear(h, w_hh)
  return a.relu() if relu else a.tanh()


def _lstm_step(xp: Tensor, h: Tensor | None, c: Tensor | None, w_hh: Tensor,
               w_hr: Tensor | None) -> tuple[Tensor, Tensor]:
  i, f, g, o = (xp if h is None else xp + F.linear(h, w_hh)).chunk(4, 1)
  c = i.sigmoid() * g.tanh() if c is None else f.sigmoid() * c + i.sigmoid() * g.tanh()
  h = o.sigmoid() * c.tanh()
  return (h if w_hr is None else F.linear(h, w_hr)), c


def _gru_step(xp: Tensor, h: Tensor | None, w_hh: Tensor, b_hh: Tensor | None) -> Tensor:
  # b_hh's n part sits inside r * (...), so it stays in the step
  gh = F.linear(h, w_hh) if h is not None else None
  if b_hh is not None: gh = b_hh if gh is None else gh + b_hh
  xr, xz, xn = xp.chunk(3, 1)
  if gh is None: r, z, n = None, xz.sigmoid(), xn.tanh()
  else:
    hr, hz, hn = gh.chunk(3, -1)
    r, z = (xr + hr).sigmoid(), (xz + hz).sigmoid()
    n = (xn + r * hn).tanh()
  return n - z * n if h is None else n + z * (h - n)


def _input_projection(mode: str, x: Tensor, w_ih: Tensor, b_ih: Tensor | None, b_hh: Tensor | None) -> Tensor:
  """x @ W_ihᵀ with the biases that can be added before the loop: both, except GRU's b_hh. Each weight and bias is
  an argument of a call of its own (F.linear, +), never of a value built from them (b_ih + b_hh, W_hh.T): a checked
  trace (engine/trace.py) keys a call's arguments, so a backward reaching a parameter that only such a value held
  could not be replayed, and every step of a recurrent model ran eagerly."""
  xp = F.linear(x, w_ih, b_ih)
  return xp + b_hh if b_hh is not None and mode != "GRU" else xp


def _stack_states(states: list) -> Tensor:
  # one layer and direction: a view of the last step's state, not a copy kernel
  return states[0].unsqueeze(0) if len(states) == 1 else fg.stack(states, 0)


class RNNBase(Module):
  """Shared by RNN, LSTM and GRU: PyTorch's RNNBase constructor, parameters and checks."""

  def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
               batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
               device=None, dtype=None):
    super().__init__()
    if not isinstance(dropout, numbers.Number) or isinstance(dropout, bool) or not 0 <= dropout <= 1:
      raise ValueError("dropout should be a number in range [0, 1] representing the probability of an element "
                       "being zeroed")
    if dropout > 0 and num_layers == 1:
      warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout expects "
                    f"num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}", stacklevel=3)
    for name, v in (("bias", bias), ("batch_first", batch_first)):
      if not isinstance(v, bool): raise TypeError(f"{name} should be of type bool, got: {type(v).__name__}")
    for name, v in (("input_size", input_size), ("hidden_size", hidden_size)):
      if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{name} should be of type int, got: {type(v).__name__}")
      if v <= 0: raise ValueError(f"{name} must be greater than zero")
    if num_layers <= 0: raise ValueError("num_layers must be greater than zero")
    if proj_size < 0: raise ValueError("proj_size should be a positive integer or zero to disable projections")
    if proj_size >= hidden_size: raise ValueError("proj_size has to be smaller than hidden_size")
    if mode not in _GATES: raise ValueError("Unrecognized RNN mode: " + mode)
    self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
    self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
    self.bidirectional, self.proj_size = bidirectional, proj_size
    gate_size = _GATES[mode] * hidden_size
    real_hidden = proj_size if proj_size > 0 else hidden_size
    dirs = 2 if bidirectional else 1
    self._all_weights = []
    for layer in range(num_layers):
      for d in range(dirs):
        layer_input = input_size if layer == 0 else real_hidden * dirs
        sfx = f"l{layer}" + ("_reverse" if d else "")
        shapes = [(f"weight_ih_{sfx}", (gate_size, layer_input)), (f"weight_hh_{sfx}", (gate_size, real_hidden))]
        if bias: shapes += [(f"bias_ih_{sfx}", (gate_size,)), (f"bias_hh_{sfx}", (gate_size,))]
        if proj_size > 0: shapes += [(f"weight_hr_{sfx}", (proj_size, hidden_size))]
        for name, shape in shapes: setattr(self, name, Parameter(fg.zeros(*shape, device=device, dtype=dtype)))
        self._all_weights.append([n for n, _ in shapes])
    self.reset_parameters()

  def reset_parameters(self) -> None:
    stdv = 1.0 / math.sqrt(self.hidden_size)
    for w in self.parameters(): init.uniform_(w, -stdv, stdv)

  @property
  def all_weights(self) -> list:
    return [[getattr(self, n) for n in names] for names in self._all_weights]

  def flatten_parameters(self) -> None:
    """PyTorch's cuDNN weight packing; nothing to do here (accepted so ported code runs)."""

  def _weights(self, layer: int, d: int) -> tuple:
    sfx = f"l{layer}" + ("_reverse" if d else "")
    g = lambda n: getattr(self, f"{n}_{sfx}") if self.bias or not n.startswith("bias") else None
    return (g("weight_ih"), g("weight_hh"), g("bias_ih"), g("bias_hh"),
            getattr(self, f"weight_hr_{sfx}") if self.proj_size > 0 else None)

  def _name(self) -> str: return "RNN" if self.mode.startswith("RNN") else self.mode

  # ---- checks (PyTorch's messages) ----
  def _check_input(self, input: Tensor) -> None:
    w = self._weights(0, 0)[0]
    if input.dtype != w.dtype:
      raise ValueError(f"RNN input dtype ({input.dtype}) does not match weight dtype ({w.dtype}). Convert input: "
                       f"input.to({w.dtype}), or convert model: model.to({input.dtype})")
    if input.shape[-1] != self.input_size:
      raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, got "
                         f"{input.shape[-1]}")

  def _expected_hidden(self, batch: int, size: int) -> tuple:
    return (self.num_layers * (2 if self.bidirectional else 1), batch, size)

  @staticmethod
  def _check_hidden(hx: Tensor, expected: tuple, msg: str = "Expected hidden size {}, got {}") -> None:
    if tuple(hx.shape) != expected: raise RuntimeError(msg.format(expected, list(hx.shape)))

  def _prepare(self, input, hx):
    """(input as [T, N, H_in] or [N, T, H_in], batched?) after torch's dimension checks"""
    _refuse_packed(input, self._name())
    if input.ndim not in (2, 3):
      raise ValueError(f"{self._name()}: Expected input to be 2D or 3D, got {input.ndim}D"
                       f"{' tensor' if self._name() == 'RNN' else ''} instead")
    batched = input.ndim == 3
    if not batched: input = input.unsqueeze(0 if self.batch_first else 1)
    return input, batched

  # ---- the unrolled sequence ----
  def _run(self, x: Tensor, h0: list, c0: list | None) -> tuple[Tensor, list, list]:
    """x: [T, N, H_in] (or [N, T, H_in] batch_first); h0, c0: one [N, H] state per (layer, direction).
    None is a zero state. Returns the last layer's output and the final states, in PyTorch's (layer, direction)
    order."""
    tdim = 1 if self.batch_first else 0
    T = x.shape[tdim]
    if T == 0: raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
    dirs = 2 if self.bidirectional else 1
    hn, cn = [], []
    for layer in range(self.num_layers):
      outs = []
      for d in range(dirs):
        w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(layer, d)
        xp = _input_projection(self.mode, x, w_ih, b_ih, b_hh)     # every step's projection: one matmul
        k = layer * dirs + d
        h, c = h0[k], (c0[k] if c0 is not None else None)
        if h is None and T == 1:   # W_hh's gradient is zeros (as PyTorch's), not None: give it its matmul
          h = fg.zeros(x.shape[1 - tdim], w_hh.shape[1], dtype=x.dtype, device=x.device)
        hs = [None] * T
        for t in (range(T - 1, -1, -1) if d else range(T)):
          xt = xp[:, t] if tdim else xp[t]
          if self.mode == "LSTM": h, c = _lstm_step(xt, h, c, w_hh, w_hr)
          elif self.mode == "GRU": h = _gru_step(xt, h, w_hh, b_hh)
          else: h = _rnn_step(xt, h, w_hh, self.mode == "RNN_RELU")
          hs[t] = h
        outs.append(fg.stack(hs, tdim))
        hn.append(h); cn.append(c)
      x = outs[0] if dirs == 1 else fg.cat(outs, -1)
      if layer < self.num_layers - 1 and self.dropout > 0 and self.training:
        x = F.dropout(x, self.dropout, True)
    return x, hn, cn

  def extra_repr(self) -> str:
    s = f"{self.input_size}, {self.hidden_size}"
    if self.proj_size != 0: s += f", proj_size={self.proj_size}"
    if self.num_layers != 1: s += f", num_layers={self.num_layers}"
    if self.bias is not True: s += f", bias={self.bias}"
    if self.batch_first is not False: s += f", batch_first={self.batch_first}"
    if self.dropout != 0: s += f", dropout={self.dropout}"
    if self.bidirectional is not False: s += f", bidirectional={self.bidirectional}"
    return s


class _SingleStateRNN(RNNBase):
  """RNN and GRU: one state tensor h."""

  def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
    input, batched = self._prepare(input, hx)
    if hx is not None:
      if not batched:
        if hx.ndim != 2:
          raise RuntimeError(f"For unbatched 2-D input, hx should also be 2-D but got {hx.ndim}-D tensor")
        hx = hx.unsqueeze(1)
      elif hx.ndim != 3:
        raise RuntimeError(f"For batched 3-D input, hx should also be 3-D but got {hx.ndim}-D tensor")
    self._check_input(input)
    N = input.shape[0 if self.batch_first else 1]
    expected = self._expected_hidden(N, self.hidden_size)
    if hx is None: h0 = [None] * expected[0]
    else:
      self._check_hidden(hx, expected)
      h0 = list(hx.unbind(0))
    out, hn, _ = self._run(input, h0, None)
    h_n = _stack_states(hn)
    realize_later(h_n)   # (see LSTM.forward)
    if not batched: out, h_n = out.squeeze(0 if self.batch_first else 1), h_n.squeeze(1)
    return out, h_n


class RNN(_SingleStateRNN):
  """Elman RNN: h_t = tanh(x_t W_ihᵀ + b_ih + h_{t-1} W_hhᵀ + b_hh) (or relu)."""

  def __init__(self, *args, **kwargs):
    if "proj_size" in kwargs: raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
    if len(args) > 3: nonlinearity, args = args[3], args[:3] + args[4:]
    else: nonlinearity = kwargs.pop("nonlinearity", "tanh")
    modes = {"tanh": "RNN_TANH", "relu": "RNN_RELU"}
    if nonlinearity not in modes:
      raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
    super().__init__(modes[nonlinearity], *args, **kwargs)
    self.nonlinearity = nonlinearity


class GRU(_SingleStateRNN):
  """r, z, n gates (PyTorch's order); n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h' = (1 - z) n + z h."""

  def __init__(self, *args, **kwargs):
    if "proj_size" in kwargs: raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
    super().__init__("GRU", *args, **kwargs)


class LSTM(RNNBase):
  """i, f, g, o gates (PyTorch's order); proj_size > 0 projects h by weight_hr (h_t = W_hr (o * tanh(c_t)))."""

  def __init__(self, *args, **kwargs):
    super().__init__("LSTM", *args, **kwargs)

  def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None):
    input, batched = self._prepare(input, hx)
    real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
    N = input.shape[0 if self.batch_first else 1]
    exp_h, exp_c = self._expected_hidden(N, real_hidden), self._expected_hidden(N, self.hidden_size)
    if hx is None:
      self._check_input(input)
      h0 = c0 = [None] * exp_h[0]
    else:
      if not isinstance(hx, (tuple, list)) or len(hx) != 2:
        raise TypeError("LSTM: hx must be a tuple (h_0, c_0) of two Tensors")
      h, c = hx
      want = 3 if batched else 2
      if h.ndim != want or c.ndim != want:
        raise RuntimeError(f"For {'batched 3' if batched else 'unbatched 2'}-D input, hx and cx should also be "
                           f"{want}-D but got ({h.ndim}-D, {c.ndim}-D) tensors")
      if not batched: h, c = h.unsqueeze(1), c.unsqueeze(1)
      self._check_input(input)
      self._check_hidden(h, exp_h, "Expected hidden[0] size {}, got {}")
      self._check_hidden(c, exp_c, "Expected hidden[1] size {}, got {}")
      h0, c0 = list(h.unbind(0)), list(c.unbind(0))
    out, hn, cn = self._run(input, h0, c0)
    h_n, c_n = _stack_states(hn), _stack_states(cn)
    # the final states are computed with the next realize (the loss's), from the values its kernels compute: a
    # language model carries them to the next batch (detached), where, left lazy, they would bring the whole last
    # sequence's graph into every step (a word-level LSTM model's step: 2.6 s instead of tens of ms)
    realize_later(h_n, c_n)
    if not batched: out, h_n, c_n = out.squeeze(0 if self.batch_first else 1), h_n.squeeze(1), c_n.squeeze(1)
    return out, (h_n, c_n)


# ---- cells ----------------------------------------------------------------------------------------------------

class RNNCellBase(Module):
  _chunks = 1

  def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None):
    super().__init__()
    self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
    g = self._chunks * hidden_size
    self.weight_ih = Parameter(fg.zeros(g, input_size, device=device, dtype=dtype))
    self.weight_hh = Parameter(fg.zeros(g, hidden_size, device=device, dtype=dtype))
    if bias:
      self.bias_ih = Parameter(fg.zeros(g, device=device, dtype=dtype))
      self.bias_hh = Parameter(fg.zeros(g, device=device, dtype=dtype))
    else:
      self.register_parameter("bias_ih", None)
      self.register_parameter("bias_hh", None)
    self.reset_parameters()

  def reset_parameters(self) -> None:
    stdv = 1.0 / math.sqrt(self.hidden_size)
    for w in self.parameters(): init.uniform_(w, -stdv, stdv)

  def extra_repr(self) -> str:
    s = f"{self.input_size}, {self.hidden_size}"
    if self.bias is not True: s += f", bias={self.bias}"
    if getattr(self, "nonlinearity", "tanh") != "tanh": s += f", nonlinearity={self.nonlinearity}"
    return s

  def _prepare(self, input, states: list, labels: list) -> tuple[Tensor, list, bool]:
    """(input [N, H_in], states [N, H] (zeros where not given), batched?) after PyTorch's checks and messages"""
    name = type(self).__name__
    _refuse_packed(input, name)
    if input.ndim not in (1, 2): raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.ndim}D instead")
    for s, label in zip(states, labels):
      if s is not None and s.ndim not in (1, 2):
        raise ValueError(f"{name}: Expected {label} to be 1D or 2D, got {s.ndim}D instead")
    batched = input.ndim == 2
    if not batched: input = input.unsqueeze(0)
    if input.shape[1] != self.input_size:
      raise RuntimeError(f"input has inconsistent input_size: got {input.shape[1]} expected {self.input_size}")
    N = input.shape[0]
    out = []
    for i, s in enumerate(states):
      if s is None:   # zeros, not skipped: W_hh's gradient is zeros (as PyTorch's), not None
        out.append(fg.zeros(N, self.hidden_size, dtype=input.dtype, device=input.device))
        continue
      if not batched: s = s.unsqueeze(0)
      if s.ndim != 2 or s.shape[0] != N:
        raise RuntimeError(f"Input batch size {N} doesn't match hidden{i} batch size {s.shape[0]}")
      if s.shape[1] != self.hidden_size:
        raise RuntimeError(f"hidden{i} has inconsistent hidden_size: got {s.shape[1]}, expected {self.hidden_size}")
      out.append(s)
    return input, out, batched


class RNNCell(RNNCellBase):
  def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh", device=None,
               dtype=None):
    super().__init__(input_size, hidden_size, bias, device, dtype)
    self.nonlinearity = nonlinearity

  def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
    if self.nonlinearity not in ("tanh", "relu"): raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
    x, (h,), batched = self._prepare(input, [hx], ["hidden"])
    h = _rnn_step(_input_projection("RNN_TANH", x, self.weight_ih, self.bias_ih, self.bias_hh), h,
                  self.weight_hh, self.nonlinearity == "relu")
    return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
  _chunks = 4

  def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    x, (h, c), batched = self._prepare(input, [None, None] if hx is None else list(hx), ["hx[0]", "hx[1]"])
    h, c = _lstm_step(_input_projection("LSTM", x, self.weight_ih, self.bias_ih, self.bias_hh), h, c,
                      self.weight_hh, None)
    return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
  _chunks = 3

  def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
    x, (h,), batched = self._prepare(input, [hx], ["hidden"])
    h = _gru_step(F.linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh, self.bias_hh)
    return h if batched else h.squeeze(0)
