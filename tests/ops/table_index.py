"""Indexing, shape and nn.functional cases for the operator matrix (format: tests/ops/spec.py).

Integer indices are drawn fresh too: `_ix` maps a float input r in [-2, 2) to integers in [0, n) (floor of an
exactly rounded product: the same integers in both libraries), `_perm` takes distinct indices from an argsort of r.
"""
from __future__ import annotations
import numpy as np
from spec import OpCase


def _ix(L, r, n: int):
  return ((r.detach() + 2) * (n / 4)).floor().long().clamp(0, n - 1)


def _perm(L, r, k: int, dim: int = -1):
  return r.detach().argsort(dim).narrow(dim, 0, k)


def _mask(r): return r.detach() > 0


def _unit(rng, shape, dn):   # values in (0.05, 1): for losses whose inputs are probabilities / rates
  return rng.uniform(0.05, 1.0, shape).astype(dn)


F = lambda L: L.nn.functional   # noqa: E731

CASES: list[OpCase] = [
  # ---- masks ----
  OpCase("masked_select", lambda L, x, m: x.masked_select(_mask(m)),
         (((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (2, 4)), ((), ()), ((0, 4), (0, 4))), fast=True),
  OpCase("masked_select_fn", lambda L, x, m: L.masked_select(x, _mask(m)), (((2, 3, 2), (2, 3, 2)),),
         dtypes=("float32", "int32"), grad=False),
  OpCase("masked_fill_scalar", lambda L, x, m: x.masked_fill(_mask(m), 1.5), (((3, 4), (3, 4)), ((3, 4), (4,)), ((), ())),
         fast=True),
  OpCase("masked_fill_tensor_value", lambda L, x, m, v: x.masked_fill(_mask(m), v), (((3, 4), (3, 4), ()),)),
  OpCase("masked_fill_int", lambda L, x, m: x.masked_fill(m > 0, -7), (((5, 2), (5, 2)),), dtypes=("int64",), grad=False),
  OpCase("masked_scatter", lambda L, x, m, s: x.masked_scatter(_mask(m), s),
         (((3, 4), (3, 4), (3, 4)), ((3, 4), (4,), (20,)), ((2, 3), (2, 3), (2, 5)), ((0, 2), (0, 2), (3,))), fast=True),
  OpCase("masked_scatter_too_small", lambda L, x: x.masked_scatter(L.ones(3, 4, dtype=L.bool, device=x.device), L.zeros(5, device=x.device)),
         (((3, 4),),), grad=False),
  OpCase("nonzero", lambda L, x: (x > 0).nonzero(), (((3, 4),), ((5,),), ((),), ((0, 3),), ((2, 2, 3),)), grad=False,
         fast=True),
  OpCase("nonzero_tuple", lambda L, x: L.nonzero(x > 0, as_tuple=True), (((3, 4),), ((),), ((0, 3),)), grad=False),
  OpCase("nonzero_int", lambda L, x: x.nonzero(), (((4, 3),),), dtypes=("int32",), grad=False, low=-1, high=2),
  OpCase("argwhere", lambda L, x: L.argwhere(x > 0), (((3, 4),), ((6,),)), grad=False),
  OpCase("where_scalars", lambda L, c: (L.where(c > 0, 1.0, 0), L.where(c > 0, 2, -3), L.where(c > 0, True, False),
                                        L.where(c > 0, 1.5, 2.5)), (((3, 4),), ((),), ((0,),)), grad=False, fast=True),
  OpCase("where_scalar_tensor", lambda L, c, x: (L.where(c > 0, x, 0.0), L.where(c > 0, -1, x)),
         (((3, 4), (3, 4)), ((4,), (3, 1)), ((), ()))),

  # ---- repeats, rolls, flips, windows ----
  OpCase("repeat_interleave_int", lambda L, x: (x.repeat_interleave(2), x.repeat_interleave(3, dim=-1),
                                                L.repeat_interleave(x, 2, 0)), (((3, 4),), ((2, 1, 3),)), fast=True),
  OpCase("repeat_interleave_0d", lambda L, x: x.repeat_interleave(3), (((),), ((0,),))),
  OpCase("repeat_interleave_tensor", lambda L, x, r: x.repeat_interleave(_ix(L, r, 3), dim=0), (((4, 3), (4,)),)),
  OpCase("repeat_interleave_tensor_dim1", lambda L, x, r: L.repeat_interleave(x, _ix(L, r, 4), dim=1), (((2, 5), (5,)),)),
  OpCase("repeat_interleave_only_repeats", lambda L, r: L.repeat_interleave(_ix(L, r, 4)), (((5,),),), grad=False),
  OpCase("repeat_interleave_bad_dim", lambda L, x: x.repeat_interleave(2, dim=3), (((2, 3),),)),
  OpCase("roll_flat", lambda L, x: (x.roll(1), x.roll(-5)), (((3, 4),), ((),), ((0, 2),))),
  OpCase("roll_dims", lambda L, x: (x.roll(2, 1), L.roll(x, (1, -3), (0, 2)), x.roll((7, 1), (-1, -1))),
         (((3, 4, 5),),), fast=True),
  OpCase("roll_mismatch", lambda L, x: x.roll((1, 2), 0), (((3, 4),),)),
  OpCase("flip", lambda L, x: (x.flip(0), x.flip((0, 2)), L.flip(x, [-1])), (((2, 3, 4),), ((0, 3, 1),)), fast=True),
  OpCase("flip_bad_dim", lambda L, x: x.flip(3), (((2, 3),),)),
  OpCase("unfold", lambda L, x: (x.unfold(1, 2, 1), x.unfold(0, 2, 2), x.unfold(-1, 3, 2)), (((4, 5),), ((3, 6, 5),)),
         fast=True),
  OpCase("unfold_0d", lambda L, x: x.unfold(0, 1, 1), (((),),)),
  OpCase("unfold_too_big", lambda L, x: x.unfold(1, 5, 1), (((3, 4),),)),
  OpCase("unfold_bad_step", lambda L, x: x.unfold(1, 2, 0), (((3, 4),),)),
  OpCase("narrow", lambda L, x: (x.narrow(1, 1, 2), L.narrow(x, 0, -2, 2), x.narrow(-1, 3, 0)), (((3, 4),), ((2, 5, 2),))),
  OpCase("narrow_out_of_range", lambda L, x: x.narrow(1, 3, 2), (((3, 4),),)),
  OpCase("narrow_bad_dim", lambda L, x: x.narrow(2, 0, 1), (((3, 4),),)),

  # ---- splits and dims ----
  OpCase("chunk", lambda L, x: (x.chunk(3, 1), L.chunk(x, 2), x.chunk(4, -1)), (((4, 5),), ((6, 6),), ((2, 0),))),
  OpCase("split", lambda L, x: (x.split(2, 1), L.split(x, [1, 3, 1], 1), x.split(10)), (((3, 5),),), fast=True),
  OpCase("split_bad_sizes", lambda L, x: x.split([1, 2], 1), (((3, 5),),)),
  OpCase("tensor_split", lambda L, x: (x.tensor_split(3, 1), L.tensor_split(x, [1, 3], 1), x.tensor_split([-1, 9]),
                                       x.tensor_split(L.tensor([2, 1], device=x.device), dim=1), x.tensor_split(L.tensor(2, device=x.device))),
         (((4, 5),), ((2, 7),)), fast=True),
  OpCase("tensor_split_zero", lambda L, x: x.tensor_split(0), (((4, 5),),)),
  OpCase("movedim", lambda L, x: (x.movedim(0, -1), L.movedim(x, (0, 1), (2, 0)), x.moveaxis(-1, 0), x.movedim((), ())),
         (((2, 3, 4),), ((0, 1, 2),)), fast=True),
  OpCase("movedim_bad", lambda L, x: x.movedim((0, 1), (1,)), (((2, 3, 4),),)),
  OpCase("movedim_bad_dim", lambda L, x: x.movedim(0, 3), (((2, 3, 4),),)),

  # ---- gather / scatter ----
  OpCase("gather", lambda L, x, r: x.gather(1, _ix(L, r, x.shape[1])), (((3, 4), (3, 6)), ((3, 4), (2, 2)), ((2, 3, 4), (2, 3, 1))),
         fast=True),
  OpCase("gather_dim0", lambda L, x, r: L.gather(x, 0, _ix(L, r, x.shape[0])), (((3, 4), (5, 4)), ((3,), (7,)))),
  OpCase("gather_0d", lambda L, x: x.gather(0, L.tensor(0, device=x.device)), (((),),)),
  OpCase("gather_bad_dim", lambda L, x: x.gather(2, L.zeros(3, 4, dtype=L.long, device=x.device)), (((3, 4),),)),
  OpCase("gather_float_index", lambda L, x: x.gather(0, L.zeros(3, 4, device=x.device)), (((3, 4),),)),
  OpCase("gather_out_of_range", lambda L, x: x.gather(1, L.full((3, 4), 4, dtype=L.long, device=x.device)), (((3, 4),),)),
  # src shaped like index where gradients are compared: torch 2.13's scatter backward refuses a larger src
  OpCase("scatter_src", lambda L, x, r, s: x.scatter(1, _perm(L, r, s.shape[1]), s),
         (((3, 5), (3, 5), (3, 4)), ((4, 5), (2, 5), (2, 2))), fast=True),
  OpCase("scatter_src_larger", lambda L, x, r, s: x.scatter(1, _perm(L, r, 3), s), (((3, 5), (2, 5), (3, 4)),), grad=False),
  OpCase("scatter_dim0", lambda L, x, r, s: L.scatter(x, 0, _perm(L, r, 2, 0), s), (((4, 3), (4, 3), (2, 3)),)),
  OpCase("scatter_value", lambda L, x, r: (x.scatter(1, _perm(L, r, 2), 1.5), x.scatter(1, _perm(L, r, 2), value=-2.0)),
         (((3, 5), (3, 5)),)),
  OpCase("scatter_0d", lambda L, x, s: x.scatter(0, L.tensor(0, device=x.device), s), (((), ()),)),
  OpCase("scatter_empty_index", lambda L, x, s: x.scatter(1, L.zeros(3, 0, dtype=L.long, device=x.device), s), (((3, 4), (3, 0)),)),
  OpCase("scatter_reduce_add_mul", lambda L, x, r, s: (x.scatter(1, _ix(L, r, 5), s, reduce="add"),
                                                       x.scatter(1, _ix(L, r, 5), s, reduce="multiply")),
         (((3, 5), (3, 7), (3, 7)),), grad=False),
  OpCase("scatter_add", lambda L, x, r, s: (x.scatter_add(1, _ix(L, r, 5), s), L.scatter_add(x, 0, _ix(L, r, 3), s)),
         (((3, 5), (3, 7), (3, 7)), ((4, 5), (2, 3), (2, 3))), fast=True),
  OpCase("scatter_add_larger_src", lambda L, x, r, s: x.scatter_add(0, _ix(L, r, 3), s), (((3, 5), (2, 3), (4, 4)),),
         grad=False),
  OpCase("scatter_add_int", lambda L, x, r: x.scatter_add(0, (r.abs() % 3).long(), r), (((3, 4), (5, 4)),),
         dtypes=("int64",), grad=False, low=-9, high=9),
  OpCase("scatter_bad_dtype", lambda L, x: x.scatter(0, L.zeros(1, 4, dtype=L.long, device=x.device), L.ones(1, 4, dtype=L.float64, device=x.device)),
         (((3, 4),),)),
  OpCase("scatter_int32_index", lambda L, x: x.scatter(0, L.zeros(1, 4, dtype=L.int32, device=x.device), x[:1]), (((3, 4),),)),
  OpCase("scatter_bad_index_dtype", lambda L, x: x.scatter(0, L.zeros(1, 4, device=x.device), x), (((3, 4),),)),
  OpCase("scatter_bad_shape", lambda L, x: x.scatter(0, L.zeros(1, 5, dtype=L.long, device=x.device), L.ones(1, 5, device=x.device)), (((3, 4),),)),
  OpCase("scatter_bad_dim", lambda L, x: x.scatter(2, L.zeros(1, 4, dtype=L.long, device=x.device), x), (((3, 4),),)),
  OpCase("scatter_reduce_bad", lambda L, x: x.scatter_reduce(0, L.zeros(1, 4, dtype=L.long, device=x.device), x, "maximum"), (((3, 4),),)),
  *[OpCase(f"scatter_reduce_{red}_{'self' if inc else 'noself'}",
           (lambda red, inc: lambda L, x, r, s: x.scatter_reduce(1, _ix(L, r, 5), s, red, include_self=inc))(red, inc),
           (((3, 5), (3, 7), (3, 7)), ((4, 5), (2, 3), (2, 3))), fast=red == "sum")
    for red in ("sum", "prod", "mean", "amax", "amin") for inc in (True, False)],
  OpCase("scatter_reduce_max_alias", lambda L, x, r, s: (x.scatter_reduce(0, _ix(L, r, 3), s, "max"),
                                                         x.scatter_reduce(0, _ix(L, r, 3), s, "min", include_self=False)),
         (((3, 4), (4, 4), (4, 4)),), grad=False),   # torch's backward refuses "min"
  OpCase("scatter_reduce_int", lambda L, x, r: tuple(x.scatter_reduce(0, (r.abs() % 3).long(), r, red, include_self=False)
                                                    for red in ("sum", "prod", "amax", "amin", "mean")),
         (((3, 4), (5, 4)),), dtypes=("int64",), grad=False, low=-9, high=9),

  # ---- index_* ----
  OpCase("index_select", lambda L, x, r: (x.index_select(1, _ix(L, r, 4)), L.index_select(x, 0, _ix(L, r, 3))),
         (((3, 4), (5,)), ((3, 4, 2), (0,))), fast=True),
  OpCase("index_select_0d", lambda L, x: (x.index_select(0, L.tensor([0], device=x.device)), x.index_select(0, L.tensor(0, device=x.device))), (((),),)),
  OpCase("index_select_0d_two", lambda L, x: x.index_select(0, L.tensor([0, 0], device=x.device)), (((),),)),
  OpCase("index_select_2d_index", lambda L, x: x.index_select(0, L.zeros(2, 2, dtype=L.long, device=x.device)), (((3, 4),),)),
  OpCase("index_add", lambda L, x, r, s: (x.index_add(1, _ix(L, r, 4), s), x.index_add(1, _ix(L, r, 4), s, alpha=-2.5)),
         (((3, 4), (6,), (3, 6)), ((3, 4), (0,), (3, 0))), fast=True),
  OpCase("index_add_dim0", lambda L, x, r, s: L.index_add(x, 0, _ix(L, r, 5), s), (((5, 2, 3), (7,), (7, 2, 3)),)),
  OpCase("index_add_bad_source", lambda L, x: x.index_add(0, L.tensor([0, 1], device=x.device), L.ones(3, 4, device=x.device)), (((3, 4),),)),
  OpCase("index_copy", lambda L, x, r, s: x.index_copy(1, _perm(L, r, 3), s), (((3, 5), (5,), (3, 3)),), fast=True),
  OpCase("index_copy_dim0", lambda L, x, r, s: L.index_copy(x, 0, _perm(L, r, 2), s), (((4, 3), (4,), (2, 3)),)),
  OpCase("index_fill", lambda L, x, r: (x.index_fill(1, _ix(L, r, 4), -1.5), L.index_fill(x, 0, _ix(L, r, 3), 2)),
         (((3, 4), (3,)),)),
  OpCase("index_fill_tensor", lambda L, x, r, v: x.index_fill(0, _ix(L, r, 3), v), (((3, 4), (2,), ()),)),
  OpCase("index_put", lambda L, x, r, v: x.index_put((_ix(L, r, 3), _ix(L, -r, 4)), v), (((3, 4), (2,), (2,)),)),
  OpCase("index_put_accumulate", lambda L, x, r, v: (x.index_put((_ix(L, r, 3),), v, accumulate=True),
                                                     x.index_put((_ix(L, r, 3), _ix(L, r, 4)), v[:, 0], accumulate=True)),
         (((3, 4), (6,), (6, 4)), ((3, 4), (6,), (1, 4))), fast=True),
  OpCase("index_put_inplace", lambda L, x, r, v: x.clone().index_put_((_perm(L, r, 2),), v), (((3, 4), (3,), (4,)),)),
  OpCase("index_put_bool", lambda L, x, m, v: x.index_put((_mask(m),), v), (((3, 4), (3,), ()),)),
  OpCase("index_put_bad_shape", lambda L, x: x.index_put((L.tensor([0, 1], device=x.device),), L.ones(3, device=x.device)), (((3, 4),),)),
  OpCase("take", lambda L, x, r: (x.take(_ix(L, r, x.numel())), L.take(x, _ix(L, r, x.numel()) - x.numel())),
         (((3, 4), (5,)), ((3, 4), (2, 3)), ((), ()), ((3, 4), (0,))), fast=True),
  OpCase("take_out_of_range", lambda L, x: x.take(L.tensor([12], device=x.device)), (((3, 4),),)),
  OpCase("take_along_dim", lambda L, x, r: (x.take_along_dim(_ix(L, r, 4), 1), L.take_along_dim(x, _ix(L, r, 12))),
         (((3, 4), (3, 2)), ((3, 4), (1, 6))), fast=True),
  OpCase("take_along_dim_broadcast", lambda L, x, r: L.take_along_dim(x, _ix(L, r, 4), dim=-1),
         (((2, 1, 4), (1, 3, 5)),)),
  OpCase("take_along_dim_argsort", lambda L, x: L.take_along_dim(x, x.argsort(0), 0), (((5, 3),),)),

  # ---- triangles, one_hot ----
  OpCase("tril_triu", lambda L, x: (x.tril(), x.tril(-1), L.tril(x, 2), x.triu(), x.triu(1), L.triu(x, -2)),
         (((4, 5),), ((2, 3, 3),), ((0, 3),)), fast=True),
  OpCase("tril_int", lambda L, x: (x.tril(1), x.triu(-1)), (((3, 4),),), dtypes=("int32", "bool"), grad=False),
  OpCase("tril_1d", lambda L, x: x.tril(), (((4,),),)),
  OpCase("one_hot", lambda L, r: (F(L).one_hot(_ix(L, r, 5)), F(L).one_hot(_ix(L, r, 5), 7)),
         (((6,),), ((2, 3),), ((),)), grad=False, fast=True),
  OpCase("one_hot_too_small", lambda L, x: F(L).one_hot(L.tensor([0, 3], device=x.device), 3), (((1,),),)),
]
