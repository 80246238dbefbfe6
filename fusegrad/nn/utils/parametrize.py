"""torch.nn.utils.parametrize: a module's tensor computed from other tensors on each access.

As torch's: register_parametrization moves the tensor to `module.parametrizations[name]` (a ParametrizationList
holding `original` or `original0`, `original1`, ... and the parametrization modules), and gives the module a
subclass of its class with a property `name` that runs the list. So state_dict keys, parameter names and the
recomputation on each forward are torch's, and a parametrized module stays a plain lazy graph (no hooks).
"""
from __future__ import annotations
from collections.abc import Sequence
from contextlib import contextmanager
import fusegrad as fg
from fusegrad.tensor import Tensor
from fusegrad.nn.module import Module, ModuleList, ModuleDict, Parameter, _set_value

__all__ = ["cached", "ParametrizationList", "register_parametrization", "is_parametrized", "remove_parametrizations",
           "type_before_parametrizations", "transfer_parametrizations_and_params"]

_cache_enabled = 0
_cache: dict = {}


@contextmanager
def cached():
  """Within it, each parametrized tensor is computed once (at its first access) and reused."""
  global _cache_enabled, _cache
  _cache_enabled += 1
  try:
    yield
  finally:
    _cache_enabled -= 1
    if not _cache_enabled: _cache = {}


def _register_parameter_or_buffer(module: Module, name: str, x: Tensor) -> None:
  if isinstance(x, Parameter): module.register_parameter(name, x)
  else: module.register_buffer(name, x)


def _maybe_set(dest: Tensor, src: Tensor) -> None:
  """torch's dest.set_(src): dest keeps its identity (optimizers hold it) and takes src's value, shape included."""
  _set_value(dest, src.detach(), same_storage=False)


class ParametrizationList(ModuleList):
  """The parametrizations of one tensor, applied in order to `original` (or to original0, original1, ... when the
  first one's right_inverse returns several tensors)."""

  def __init__(self, modules, original: Tensor, unsafe: bool = False):
    if len(modules) == 0: raise ValueError("ParametrizationList requires one or more modules.")
    super().__init__(modules)
    self.unsafe = unsafe
    original_shape, original_dtype = original.shape, original.dtype
    with fg.no_grad():
      new = original
      for m in reversed(self):
        if hasattr(m, "right_inverse"):
          try: new = m.right_inverse(new)
          except NotImplementedError: pass
    if not isinstance(new, (Tensor, Sequence)):
      raise ValueError(f"'right_inverse' must return a Tensor or a Sequence of tensors (list, tuple...). "
                       f"Got {type(new).__name__}")
    self.is_tensor = isinstance(new, Tensor)
    self.ntensors = 1 if self.is_tensor else len(new)
    if self.is_tensor:
      if original.dtype != new.dtype:
        raise ValueError(f"When `right_inverse` outputs one tensor, it may not change the dtype.\n"
                         f"original.dtype: {original.dtype}\nright_inverse(original).dtype: {new.dtype}")
      if new is not original:
        with fg.no_grad(): _maybe_set(original, new)
      _register_parameter_or_buffer(self, "original", original)
    else:
      for i, orig in enumerate(new):
        if not isinstance(orig, Tensor):
          raise ValueError(f"'right_inverse' must return a Tensor or a Sequence of tensors (list, tuple...). Got "
                           f"element {i} of the sequence with type {type(orig).__name__}.")
        if isinstance(original, Parameter): orig = Parameter(orig.detach(), original.requires_grad)
        _register_parameter_or_buffer(self, f"original{i}", orig)
    if not self.unsafe:
      z = self()
      if not isinstance(z, Tensor): raise ValueError(f"A parametrization must return a tensor. Got {type(z).__name__}.")
      if z.dtype != original_dtype:
        raise ValueError(f"Registering a parametrization may not change the dtype of the tensor, unless `unsafe` flag "
                         f"is enabled.\nunparametrized dtype: {original_dtype}\nparametrized dtype: {z.dtype}")
      if z.shape != original_shape:
        raise ValueError(f"Registering a parametrization may not change the shape of the tensor, unless `unsafe` flag "
                         f"is enabled.\nunparametrized shape: {original_shape}\nparametrized shape: {z.shape}")

  def right_inverse(self, value: Tensor) -> None:
    """Set the originals so that the parametrized tensor is `value` (the property's setter)."""
    with fg.no_grad():
      for m in reversed(self):
        if not hasattr(m, "right_inverse"):
          raise RuntimeError(f"parametrization {type(m).__name__} does not implement right_inverse.")
        value = m.right_inverse(value)
      if self.is_tensor:
        if not isinstance(value, Tensor):
          raise ValueError(f"`right_inverse` should return a tensor. Got {type(value).__name__}")
        if value.dtype != self.original.dtype:
          raise ValueError(f"The tensor returned by `right_inverse` has dtype {value.dtype} while `original` has "
                           f"dtype {self.original.dtype}")
        _maybe_set(self.original, value)
      else:
        if not isinstance(value, Sequence):
          raise ValueError(f"'right_inverse' must return a sequence of tensors. Got {type(value).__name__}.")
        if len(value) != self.ntensors:
          raise ValueError(f"'right_inverse' must return a sequence of tensors of length {self.ntensors}. Got a "
                           f"sequence of length {len(value)}.")
        for i, t in enumerate(value):
          orig = getattr(self, f"original{i}")
          if not isinstance(t, Tensor):
            raise ValueError(f"`right_inverse` must return a sequence of tensors. Got element {i} of type "
                             f"{type(t).__name__}")
          if orig.dtype != t.dtype:
            raise ValueError(f"Tensor {i} returned by `right_inverse` has dtype {t.dtype} while `original{i}` has "
                             f"dtype {orig.dtype}")
          _maybe_set(orig, t)

  def forward(self) -> Tensor:
    if self.is_tensor: x = self[0](self.original)
    else: x = self[0](*(getattr(self, f"original{i}") for i in range(self.ntensors)))
    for m in list(self)[1:]: x = m(x)
    return x


def _inject_new_class(module: Module) -> None:
  """Give module a class of its own (a subclass of its class) to hold the parametrized properties."""
  cls = module.__class__
  module.__class__ = type(f"Parametrized{cls.__name__}", (cls,), {"__module__": cls.__module__})


def _inject_property(module: Module, tensor_name: str) -> None:
  if hasattr(module, tensor_name): raise AssertionError(f"Module already has an attribute named '{tensor_name}'")

  def get_parametrized(self) -> Tensor:
    p = self.parametrizations[tensor_name]
    if not _cache_enabled: return p()
    key = (id(self), tensor_name)
    t = _cache.get(key)
    if t is None: t = _cache[key] = p()
    return t

  def set_original(self, value: Tensor) -> None: self.parametrizations[tensor_name].right_inverse(value)
  setattr(module.__class__, tensor_name, property(get_parametrized, set_original))


def register_parametrization(module: Module, tensor_name: str, parametrization: Module, *,
                             unsafe: bool = False) -> Module:
  """module.<tensor_name> becomes parametrization(original); a second one on the same tensor is applied after."""
  parametrization.train(module.training)
  if is_parametrized(module, tensor_name):
    if not unsafe:
      y = getattr(module, tensor_name)
      x = parametrization(y)
      if not isinstance(x, Tensor): raise ValueError(f"A parametrization must return a tensor. Got {type(x).__name__}.")
      if x.dtype != y.dtype:
        raise ValueError(f"Registering a parametrization may not change the dtype of the tensor, unless the `unsafe` "
                         f"flag is enabled.\nmodule.{tensor_name}.dtype: {y.dtype}\nparametrization(module."
                         f"{tensor_name}).dtype: {x.dtype}")
      if x.shape != y.shape:
        raise ValueError(f"Registering a parametrization may not change the shape of the tensor, unless the `unsafe` "
                         f"flag is enabled.\nmodule.{tensor_name}.shape: {y.shape}\nparametrization(module."
                         f"{tensor_name}).shape: {x.shape}")
      if hasattr(parametrization, "right_inverse"):
        try: z = parametrization.right_inverse(x)
        except NotImplementedError: pass
        else:
          if not isinstance(z, Tensor):
            raise ValueError(f"parametrization.right_inverse must return a tensor. Got: {type(z).__name__}")
          if z.dtype != y.dtype or z.shape != y.shape:
            raise ValueError(f"The tensor returned by parametrization.right_inverse must have the same dtype and "
                             f"shape as module.{tensor_name}, unless the `unsafe` flag is enabled.")
    module.parametrizations[tensor_name].append(parametrization)
    module.parametrizations[tensor_name].unsafe |= unsafe
  elif tensor_name in module._buffers or tensor_name in module._parameters:
    original = getattr(module, tensor_name)
    plist = ParametrizationList([parametrization], original, unsafe=unsafe)
    delattr(module, tensor_name)
    if not is_parametrized(module):
      _inject_new_class(module)
      module.parametrizations = ModuleDict()
    module.parametrizations[tensor_name] = plist
    _inject_property(module, tensor_name)
  else:
    raise ValueError(f"Module '{module}' does not have a parameter, a buffer, or a parametrized element with name "
                     f"'{tensor_name}'")
  return module


def is_parametrized(module: Module, tensor_name: str | None = None) -> bool:
  p = module.__dict__.get("_modules", {}).get("parametrizations")
  if p is None or not isinstance(p, ModuleDict): return False
  return len(p) > 0 if tensor_name is None else tensor_name in p


def remove_parametrizations(module: Module, tensor_name: str, leave_parametrized: bool = True) -> Module:
  """Undo register_parametrization: the tensor becomes a plain parameter (or buffer) again, holding its current
  parametrized value (leave_parametrized) or its original."""
  if not is_parametrized(module, tensor_name):
    raise ValueError(f"Module {module} does not have a parametrization on {tensor_name}")
  plist = module.parametrizations[tensor_name]
  if plist.is_tensor:
    original = plist.original
    if leave_parametrized:
      with fg.no_grad():
        t = getattr(module, tensor_name)
        _maybe_set(original, t)
  else:
    if not leave_parametrized:
      raise ValueError("Cannot leave unparametrized (`leave_parametrized=False`) a tensor that is parametrized in "
                       "terms of a sequence of tensors.")
    with fg.no_grad(): t = getattr(module, tensor_name)
    first = plist.original0
    original = Parameter(t.detach(), first.requires_grad) if isinstance(first, Parameter) else t.detach()
  delattr(module.__class__, tensor_name)
  del module.parametrizations[tensor_name]
  _register_parameter_or_buffer(module, tensor_name, original)
  if not is_parametrized(module):
    delattr(module, "parametrizations")
    module.__class__ = module.__class__.__bases__[0]
  return module


def type_before_parametrizations(module: Module) -> type:
  return module.__class__.__bases__[0] if is_parametrized(module) else type(module)


def transfer_parametrizations_and_params(from_module: Module, to_module: Module,
                                         tensor_name: str | None = None) -> Module:
  """Register from_module's parametrizations (all, or tensor_name's) on to_module, sharing their originals."""
  if not is_parametrized(from_module): return to_module
  for name in (list(from_module.parametrizations) if tensor_name is None else [tensor_name]):
    if not hasattr(to_module, name): setattr(to_module, name, Parameter(getattr(from_module, name)))
    for fn in from_module.parametrizations[name]: register_parametrization(to_module, name, fn)
    src, dst = from_module.parametrizations[name], to_module.parametrizations[name]
    if hasattr(src, "original"): dst.original = src.original
    else:
      i = 0
      while hasattr(src, f"original{i}"):
        setattr(dst, f"original{i}", getattr(src, f"original{i}"))
        i += 1
  return to_module
