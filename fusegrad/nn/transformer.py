"""nn.Transformer and its parts with PyTorch's arguments, defaults, submodule names and (non-fast-path) math.

The submodules are named as torch's (self_attn, multihead_attn, linear1/2, norm1..3, dropout1..3, layers.N,
encoder.norm, decoder.norm), so a torch state_dict loads unchanged. TransformerEncoder/Decoder deep-copy the
layer they are given, as torch does: every layer starts with the same weights.

Masks follow PyTorch: a bool mask's True means "may not attend" (-inf), a float mask is added to the scores.
An is_causal hint with no mask applies a causal mask; with a mask, the mask is used (torch's hint promises
the mask is causal). torch's fast path and nested tensors are not reproduced: enable_nested_tensor and
mask_check are accepted and ignored, and padded positions come back computed rather than zeroed.
"""
from __future__ import annotations
import copy
import math
from typing import Callable
import fusegrad as fg
from fusegrad.tensor import Tensor
from fusegrad.nn import functional as F, init
from fusegrad.nn.module import Module, ModuleList
from fusegrad.nn.layers import Dropout, LayerNorm, Linear, MultiheadAttention


def _get_activation_fn(activation: str | Callable) -> Callable:
  if not isinstance(activation, str): return activation
  if activation == "relu": return F.relu
  if activation == "gelu": return F.gelu
  raise RuntimeError(f"activation should be relu/gelu, not {activation}")


def _get_clones(module: Module, n: int) -> ModuleList:
  return ModuleList([copy.deepcopy(module) for _ in range(n)])


def _check_d_model(x: Tensor, d_model: int, name: str) -> None:
  if x.ndim not in (2, 3) or x.shape[-1] != d_model:
    raise RuntimeError(f"expected {name} of shape [seq, d_model], [batch, seq, d_model] or [seq, batch, d_model] "
                       f"with d_model={d_model}, got {name} of shape {list(x.shape)}")


class TransformerEncoderLayer(Module):
  """self-attention then feed-forward, each in a residual branch; norm_first puts LayerNorm before each branch
  (pre-norm) rather than after the residual sum."""

  def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
               activation: str | Callable = F.relu, layer_norm_eps: float = 1e-5, batch_first: bool = False,
               norm_first: bool = False, bias: bool = True, device=None, dtype=None):
    super().__init__()
    kw = {"device": device, "dtype": dtype}
    self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, **kw)
    self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
    self.dropout = Dropout(dropout)
    self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
    self.norm_first = norm_first
    self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
    self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
    self.dropout1 = Dropout(dropout)
    self.dropout2 = Dropout(dropout)
    activation = _get_activation_fn(activation)
    # torch's record of which activation it is (its fast path reads it); kept for code that inspects it
    if activation is F.relu or type(activation).__name__ == "ReLU": self.activation_relu_or_gelu = 1
    elif activation is F.gelu or type(activation).__name__ == "GELU": self.activation_relu_or_gelu = 2
    else: self.activation_relu_or_gelu = 0
    self.activation = activation

  def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
              is_causal: bool = False) -> Tensor:
    _check_d_model(src, self.self_attn.embed_dim, "src")
    x = src
    if self.norm_first:
      x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
      x = x + self._ff_block(self.norm2(x))
    else:
      x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
      x = self.norm2(x + self._ff_block(x))
    return x

  def _sa_block(self, x: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
    x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                       is_causal=bool(is_causal))[0]
    return self.dropout1(x)

  def _ff_block(self, x: Tensor) -> Tensor:
    return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerDecoderLayer(Module):
  """self-attention over tgt, cross-attention to memory, then feed-forward, each in a residual branch."""

  def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
               activation: str | Callable = F.relu, layer_norm_eps: float = 1e-5, batch_first: bool = False,
               norm_first: bool = False, bias: bool = True, device=None, dtype=None):
    super().__init__()
    kw = {"device": device, "dtype": dtype}
    self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=batch_first, bias=bias, **kw)
    self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=batch_first, bias=bias,
                                             **kw)
    self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
    self.dropout = Dropout(dropout)
    self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
    self.norm_first = norm_first
    self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
    self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
    self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
    self.dropout1 = Dropout(dropout)
    self.dropout2 = Dropout(dropout)
    self.dropout3 = Dropout(dropout)
    self.activation = _get_activation_fn(activation)

  def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
              tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
              tgt_is_causal: bool = False, memory_is_causal: bool = False) -> Tensor:
    d = self.self_attn.embed_dim
    _check_d_model(tgt, d, "tgt")
    _check_d_model(memory, d, "memory")
    if memory.ndim != tgt.ndim:
      raise RuntimeError(f"tgt and memory must both be batched (3-D) or both unbatched (2-D), got tgt of shape "
                         f"{list(tgt.shape)} and memory of shape {list(memory.shape)}")
    x = tgt
    if self.norm_first:
      x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
      x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
      x = x + self._ff_block(self.norm3(x))
    else:
      x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
      x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
      x = self.norm3(x + self._ff_block(x))
    return x

  def _sa_block(self, x: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
    x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                       is_causal=bool(is_causal))[0]
    return self.dropout1(x)

  def _mha_block(self, x: Tensor, mem: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
    x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                            is_causal=bool(is_causal))[0]
    return self.dropout2(x)

  def _ff_block(self, x: Tensor) -> Tensor:
    return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoder(Module):
  """num_layers deep copies of encoder_layer, then the optional norm."""

  def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None,
               enable_nested_tensor: bool = True, mask_check: bool = True):
    super().__init__()
    self.layers = _get_clones(encoder_layer, num_layers)
    self.num_layers = num_layers
    self.norm = norm
    # torch's nested-tensor fast path: accepted, not used (outputs at padded positions are computed, not zero)
    self.enable_nested_tensor = self.use_nested_tensor = enable_nested_tensor
    self.mask_check = mask_check

  def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
              is_causal: bool | None = None) -> Tensor:
    output = src
    for mod in self.layers:
      output = mod(output, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
    if self.norm is not None: output = self.norm(output)
    return output


class TransformerDecoder(Module):
  """num_layers deep copies of decoder_layer, then the optional norm."""

  def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: Module | None = None):
    super().__init__()
    self.layers = _get_clones(decoder_layer, num_layers)
    self.num_layers = num_layers
    self.norm = norm

  def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
              tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
              tgt_is_causal: bool | None = None, memory_is_causal: bool = False) -> Tensor:
    output = tgt
    for mod in self.layers:
      output = mod(output, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                   tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                   tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
    if self.norm is not None: output = self.norm(output)
    return output


class Transformer(Module):
  """encoder-decoder Transformer ("Attention Is All You Need"), torch's layout and xavier-uniform init."""

  def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
               dim_feedforward: int = 2048, dropout: float = 0.1, activation: str | Callable = F.relu,
               custom_encoder: Module | None = None, custom_decoder: Module | None = None,
               layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False, bias: bool = True,
               device=None, dtype=None):
    super().__init__()
    kw = {"device": device, "dtype": dtype}
    if custom_encoder is not None: self.encoder = custom_encoder
    else:
      layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                      batch_first, norm_first, bias, **kw)
      self.encoder = TransformerEncoder(layer, num_encoder_layers, LayerNorm(d_model, eps=layer_norm_eps, bias=bias,
                                                                             **kw))
    if custom_decoder is not None: self.decoder = custom_decoder
    else:
      layer = TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                      batch_first, norm_first, bias, **kw)
      self.decoder = TransformerDecoder(layer, num_decoder_layers, LayerNorm(d_model, eps=layer_norm_eps, bias=bias,
                                                                             **kw))
    self._reset_parameters()
    self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

  def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
              memory_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
              tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
              src_is_causal: bool | None = None, tgt_is_causal: bool | None = None,
              memory_is_causal: bool = False) -> Tensor:
    if src.ndim == 3 and tgt.ndim == 3:
      b = 0 if self.batch_first else 1
      if src.shape[b] != tgt.shape[b]:
        raise RuntimeError(f"the batch number of src and tgt must be equal (src of shape {list(src.shape)}, tgt of "
                           f"shape {list(tgt.shape)}, batch_first={self.batch_first})")
    if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
      raise RuntimeError(f"the feature number of src and tgt must be equal to d_model={self.d_model} (src of shape "
                         f"{list(src.shape)}, tgt of shape {list(tgt.shape)})")
    memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
    return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                        tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                        tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

  @staticmethod
  def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> Tensor:
    """[sz, sz] float mask: -inf above the diagonal (future positions), 0 elsewhere."""
    return fg.full((sz, sz), -math.inf, device=device, dtype=dtype).triu(1)

  def _reset_parameters(self) -> None:
    for p in self.parameters():
      if p.ndim > 1: init.xavier_uniform_(p)
