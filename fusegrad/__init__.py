"""fusegrad: lazy tensors that fuse into compiled kernels.

    import fusegrad as fg
    x = fg.randn(1024, 1024)
    y = (x @ x.T).relu().sum(1)     # nothing has run yet
    print(y.numpy())                # one schedule, a few fused kernels, compiled and cached
"""
from fusegrad.dtype import (DType, bool_ as bool, uint8, int8, int16, uint32, int32, int64, float16, bfloat16, float32,
                            float64, half, double, short, long, promote_types, result_type as _result_type)
from fusegrad.dtype import float32 as float, int32 as int   # noqa: A001 (PyTorch spells them so)
from fusegrad.tensor import (Tensor, tensor, full, zeros, ones, empty, zeros_like, ones_like, empty_like, full_like,
                             rand_like, randn_like, arange, linspace, eye, manual_seed, seed, rand, randn, randint,
                             randperm, cat, stack, einsum, where, broadcast_shapes, Generator, multinomial, randint_like)
from fusegrad.indexing import *  # noqa: F401,F403 (scatter, index_*, take, masks, roll, tensor_split)
from fusegrad.engine.track import track
from fusegrad.engine.jit import jit
from fusegrad.autograd import no_grad, enable_grad, grad, grad_enabled as is_grad_enabled
from fusegrad.runtime.device import CompileError
from fusegrad.codegen.opt.search import beam
from fusegrad.graph.dims import Variable

concatenate = cat
concat = cat


def result_type(a, b): return _result_type(a, b)


def _method_function(name):
  def f(input, *args, **kwargs): return getattr(input, name)(*args, **kwargs)
  f.__name__ = name
  f.__doc__ = f"fusegrad.{name}(input, ...) is input.{name}(...)."
  return f


# module-level functions for the Tensor methods PyTorch also offers as functions
for _name in ("neg exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan tanh erf abs sign reciprocal relu "
              "sigmoid floor ceil round trunc frac isnan isinf isfinite logical_not bitwise_not add sub mul div "
              "true_divide floor_divide remainder fmod pow maximum minimum fmax fmin eq ne lt le gt ge logical_and "
              "logical_or logical_xor bitwise_and bitwise_or bitwise_xor bitwise_left_shift bitwise_right_shift clamp "
              "clip lerp sum prod max min amax amin mean var std var_mean std_mean argmax argmin any all logsumexp softmax log_softmax "
              "cumsum cumprod reshape permute transpose swapaxes squeeze unsqueeze flatten unflatten flip narrow split "
              "chunk unbind select tile tril triu matmul mm bmm dot outer movedim moveaxis argsort sort msort topk kthvalue square numel "
              "addcmul addcdiv").split():
  globals()[_name] = _method_function(_name)
del _name

# the math ops of ops_math.py (Tensor methods once it is imported) and torch.linalg's basics
from fusegrad import ops_math as _ops_math  # noqa: E402
from fusegrad import linalg  # noqa: E402
from fusegrad.ops_math import tensordot, meshgrid, searchsorted, bucketize, cdist  # noqa: E402
from fusegrad.ops_math import (as_tensor, asarray, logspace, set_default_dtype, get_default_dtype,  # noqa: E402
                                normal, poisson, initial_seed, get_rng_state, set_rng_state, scalar_tensor,
                                empty_strided, clone, adjoint)
for _name in _ops_math.METHODS: globals()[_name] = _method_function(_name)
del _name
bernoulli = _method_function("bernoulli")
det, inverse, cholesky = linalg.det, linalg.inv, linalg.cholesky
Tensor.det, Tensor.inverse, Tensor.cholesky = linalg.det, linalg.inv, linalg.cholesky


def is_tensor(x) -> bool: return isinstance(x, Tensor)


def realize(*tensors: Tensor) -> None:
  """Realize several tensors in one schedule."""
  from fusegrad.engine.realize import realize as _r
  if _trace._seg[0] is not None and _trace.on_realize(tensors=tensors): return
  _r(*[t.node for t in tensors])

from fusegrad import optim  # noqa: E402  (optimizers use the names above)
from fusegrad import nn  # noqa: E402

# PyTorch's names around the model (docs/porting.md): devices, the CUDA/accelerator queries, save/load as
# safetensors, utils.data, compile/autocast/inference_mode
from fusegrad.devices import device  # noqa: E402
from fusegrad.compat import (compile, inference_mode, is_inference_mode_enabled, set_grad_enabled,  # noqa: E402,A004
                             set_float32_matmul_precision, get_float32_matmul_precision, from_numpy)
from fusegrad.serialization import save, load  # noqa: E402
from fusegrad.amp import autocast  # noqa: E402
from fusegrad import cuda, backends, accelerator, amp, utils, data  # noqa: E402,F401
from fusegrad.engine import trace as _trace  # noqa: E402
_trace.install()
