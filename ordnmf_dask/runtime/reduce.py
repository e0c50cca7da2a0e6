"""Deterministic tree reductions of futures, performed on the workers.

The pairing order depends only on the order of the inputs, never on which worker finished
first, so results are bit-identical across worker counts.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

import numpy as np

if TYPE_CHECKING:  # a client is a distributed.Client or an in-process one (.inprocess)
    from distributed import Client, Future


PRIORITY = 1  # of combining tasks; Dask's default is 0
# levels of the tree one combining task folds (:func:`tree_reduce`): up to 8 inputs a task, so
# the sums over the user-blocks or item-blocks of grids up to 8 x 8 take one hop, not three
LEVELS = 3

T = TypeVar("T")


def fold(n: int, leaf: Callable[[int], T], combine: Callable[[T, T], T]) -> T:
    """``leaf(0) .. leaf(n - 1)`` combined along the one fixed tree of the package: a run of
    leaves is cut after the largest power of two below its length, halves left first (the
    pairing of neighbours level by level, the odd one out carried up). The tree depends on
    ``n`` only; it is walked depth first, so a node is combined as soon as its halves exist
    and at most one partial per level is held."""
    if n < 1:
        raise ValueError("a reduction of nothing")
    return _node(0, n, leaf, combine)


def _node(lo: int, hi: int, leaf: Callable[[int], T], combine: Callable[[T, T], T]) -> T:
    """The node of :func:`fold`'s tree over leaves [lo, hi). (A module-level function: a nested
    one calling itself is a reference cycle, which would keep the leaves, futures of a fit,
    until the garbage collector runs.)"""
    if hi - lo == 1:
        return leaf(lo)
    mid = lo + (1 << ((hi - lo - 1).bit_length() - 1))
    return combine(_node(lo, mid, leaf, combine), _node(mid, hi, leaf, combine))


Shape: TypeAlias = "int | tuple[Shape, Shape]"
"""The top levels of a node of :func:`fold`'s tree, evaluated in one task: an input's index
among the task's values, or a pair of shapes combined."""

Node: TypeAlias = Callable[[Shape, list[T], Hashable | None], T]
"""``node(shape, values, where)``: the value of one node of :func:`fold_grouped` (a task),
``where`` the one home of all its leaves when it is a task of its own for that reason, else
None."""


@dataclass(frozen=True)
class _Plan(Generic[T]):
    leaf: Callable[[int], T]
    node: Node[T]
    levels: int
    home: Callable[[int], Hashable | None] | None
    local: Callable[[int, int], T | None] | None = None


def fold_grouped(
    n: int,
    leaf: Callable[[int], T],
    node: Node[T],
    levels: int,
    home: Callable[[int], Hashable | None] | None = None,
    local: Callable[[int, int], T | None] | None = None,
) -> T:
    """:func:`fold`'s tree over ``leaf(0) .. leaf(n - 1)``, ``levels`` of its levels per
    ``node(shape, values, where)``: one node (a task) folds up to ``2**levels`` values (leaves,
    or nodes below it) along the same pairing. The same tree as :func:`fold`, walked depth first
    likewise, with ``levels`` times fewer dependent steps.

    ``home(j)``: where leaf j lives (None: unknown). A node of the tree whose leaves all live on
    one worker, below a node whose leaves do not, is a node of its own, ``where`` that worker:
    the partials of one worker are added there before they move, as a task per pair would. The
    tree, and so the sum, is the same whatever the homes.

    ``local(lo, hi)``: the value of such a node of one home over leaves [lo, hi) (the whole tree
    too, when all its leaves share one), where the caller already has it (the sum taken where
    the leaves were made; :func:`own_ranges` names the nodes it may be asked for), or None:
    then it is a node as above.
    """
    if n < 1:
        raise ValueError("a reduction of nothing")
    if n == 1:
        return leaf(0)
    plan = _Plan(leaf, node, levels, home, local)
    if local is not None and _common(0, n, plan) is not None:
        given = local(0, n)
        if given is not None:
            return given
    return _group(0, n, plan, root=True)


def own_ranges(
    n: int, home: Callable[[int], Hashable | None], levels: int
) -> list[tuple[int, int]]:
    """The leaf ranges [lo, hi) that :func:`fold_grouped`'s tree over ``n`` leaves at ``home(j)``
    makes nodes of their own for their one home, the whole tree first when its leaves share one:
    the ranges its ``local`` is asked for."""
    asked: list[tuple[int, int]] = []

    def ask(lo: int, hi: int) -> None:
        asked.append((lo, hi))

    if n > 1:
        fold_grouped(n, lambda j: None, lambda *node: None, levels, home, ask)
    return asked


def _common(lo: int, hi: int, plan: _Plan[Any]) -> Hashable | None:
    """The one home of leaves [lo, hi), or None (several, or unknown)."""
    if plan.home is None:
        return None
    homes = {plan.home(j) for j in range(lo, hi)}
    return homes.pop() if len(homes) == 1 else None


def _group(lo: int, hi: int, plan: _Plan[T], root: bool = False) -> T:
    """The node of :func:`fold_grouped` over leaves [lo, hi) (several leaves)."""
    values: list[T] = []
    common = _common(lo, hi, plan)
    shape = _expand(lo, hi, plan.levels, plan, common is None, values)
    return plan.node(shape, values, None if root else common)


def _expand(lo: int, hi: int, depth: int, plan: _Plan[T], split: bool, values: list[T]) -> Shape:
    """The shape of fold's node [lo, hi) down ``depth`` levels, its inputs appended to
    ``values``: leaves, and the nodes of their own where the depth runs out or (``split``) where
    all leaves below live on one worker."""
    if hi - lo == 1:
        values.append(plan.leaf(lo))
        return len(values) - 1
    if depth == 0 or (split and _common(lo, hi, plan) is not None):
        given = None
        if plan.local is not None and split and _common(lo, hi, plan) is not None:
            given = plan.local(lo, hi)
        values.append(_group(lo, hi, plan) if given is None else given)
        return len(values) - 1
    mid = lo + (1 << ((hi - lo - 1).bit_length() - 1))
    left = _expand(lo, mid, depth - 1, plan, split, values)
    return left, _expand(mid, hi, depth - 1, plan, split, values)


def evaluate(
    combine: Callable[..., Any],
    shape: Shape,
    args: tuple[Any, ...],
    *values: Any,
    lazy: tuple[int, ...] = (),
) -> Any:
    """On a worker: the node ``shape`` of :func:`fold_grouped` over ``values``, combined with
    ``combine(a, b, *args)`` depth first (one partial per level held); the values at the
    indices ``lazy`` are :data:`Lazy` parts, resolved first."""
    if isinstance(shape, int):
        return resolve(values[shape]) if shape in lazy else values[shape]
    a = evaluate(combine, shape[0], args, *values, lazy=lazy)
    return combine(a, evaluate(combine, shape[1], args, *values, lazy=lazy), *args)


def tree_reduce(
    client: Client,
    futures: Sequence[Future],
    combine: Callable[..., Any],
    *args: Any,
    at: dict[str, Any] | None = None,
    homes: Sequence[dict[str, Any]] | None = None,
) -> Future:
    """Reduce with ``combine(a, b, *args)`` along the fixed tree (:func:`fold`) over ``futures``,
    ``LEVELS`` of its levels per task (:func:`fold_grouped`): a reduction of up to
    ``2**LEVELS`` inputs is one task, one hop, where a task per pair would be ``LEVELS``.

    The combining tasks run before any task of normal priority that is ready at the same time,
    so partial results are folded in as soon as a node's inputs exist instead of piling up on
    the workers while the rest of a pass runs (partials are (n, K) arrays: they set a pass's peak
    memory, and a combining task holds at most ``2**LEVELS`` of them and one per level).
    ``at``: ``submit`` keywords of the combining tasks (where the sum is wanted); ``homes``: the
    ``submit`` keywords each input was placed with, so that a subtree of inputs of one worker is
    added there first. Placement only: the tree is the same.
    """
    return _reduce(client, len(futures), futures.__getitem__, combine, args, at, homes, None)


def _reduce(
    client: Client,
    n: int,
    leaf: Callable[[int], Any],
    combine: Callable[..., Any],
    args: tuple[Any, ...],
    at: dict[str, Any] | None,
    homes: Sequence[dict[str, Any]] | None,
    local: Callable[[int, int], Lazy | None] | None,
) -> Any:
    """:func:`tree_reduce` over inputs ``leaf(0) .. leaf(n - 1)``, made when the tree reads
    them; an input may be a :data:`Lazy` part (a strip's result in its worker's task,
    ``engine/cavi.py``), resolved where it is added. ``local``: as in :func:`fold_grouped`, the
    sums of one worker's inputs already taken where they were made (the result may then be such
    a :data:`Lazy` sum)."""

    def home(j: int) -> Hashable | None:
        assert homes is not None
        return tuple(homes[j].get("workers", ())) or None

    def node(shape: Shape, values: list[Any], where: Hashable | None) -> Future:
        assert where is None or isinstance(where, tuple)
        place = at or {}
        if where is not None:  # a subtree of one worker's inputs, added there
            place = {"workers": list(where), "allow_other_workers": True}
        lazy = tuple(j for j, v in enumerate(values) if isinstance(v, tuple))
        return client.submit(
            evaluate, combine, shape, args, *values, lazy=lazy, priority=PRIORITY, **place
        )

    return fold_grouped(n, leaf, node, LEVELS, None if homes is None else home, local)


Field = str | int | tuple[str | int, ...] | list[Any] | None
"""Where a part sits in an object: an attribute name, an item index, or a path of them
(``("sh", j)`` is ``x.sh[j]``); a list of fields is the tuple of those parts
(``["sw", "small"]``); None is the object itself."""


def _part(x: object, field: Field) -> Any:
    if field is None or isinstance(x, np.ndarray):
        return x
    if isinstance(field, list):
        return tuple(_part(x, f) for f in field)
    for step in field if isinstance(field, tuple) else (field,):
        x = x[step] if isinstance(step, int) else getattr(x, step)
    return x


def _add(a: Any, b: Any) -> Any:
    """``a + b`` into a new array (a tuple of arrays is added item by item)."""
    if isinstance(a, tuple):
        return tuple(_add(x, y) for x, y in zip(a, b, strict=True))
    out = np.empty(np.broadcast_shapes(a.shape, b.shape), np.result_type(a, b))
    return np.add(a, b, out=out)


def _pick(a: object, field: Field = None) -> Any:
    return _part(a, field)


def sum_parts(values: Sequence[Any], field: Field) -> Any:
    """The ``field`` of each of ``values`` summed along the fixed tree (:func:`fold`): bitwise
    the value of the node of :func:`tree_sum`'s tree over them."""
    return fold(len(values), lambda j: _part(values[j], field), _add)


Lazy: TypeAlias = "Future | tuple[Future, Field]"


def _steps(field: Field) -> tuple[str | int, ...]:
    """A field that is one part (not a list of parts) as its path of steps."""
    assert not isinstance(field, list)
    return () if field is None else field if isinstance(field, tuple) else (field,)


def within(x: Lazy, field: Field) -> tuple[Future, Field]:
    """``(obj, path)``: the ``field`` of what the :data:`Lazy` ``x`` stands for, as the object
    holding it and its field there (no task)."""
    if not isinstance(x, tuple):
        return x, field
    obj, path = x
    head = _steps(path)
    if isinstance(field, list):
        return obj, [(*head, *_steps(f)) for f in field]
    return obj, (*head, *_steps(field))


def resolve(x: object) -> Any:
    """On a worker: the value of a :data:`Lazy` argument (``(obj, field)`` -> its field)."""
    return _part(x[0], x[1]) if isinstance(x, tuple) else x


def item(x: Lazy, j: int) -> Lazy:
    """Item j of the tuple that the :data:`Lazy` ``x`` stands for, still lazy (no task)."""
    if isinstance(x, tuple):
        obj, field = x
        if isinstance(field, list):  # a tuple of fields: item j is field j
            return (obj, field[j])
        path = () if field is None else field if isinstance(field, tuple) else (field,)
        return (obj, (*path, j))
    return (x, j)


def tree_sum(
    client: Client,
    futures: Sequence[Lazy],
    field: Field = None,
    lazy: bool = False,
    at: dict[str, Any] | None = None,
    homes: Sequence[dict[str, Any]] | None = None,
    local: Callable[[int, int], Lazy | None] | None = None,
) -> Lazy:
    """Sum the ``field`` of each future (or the value itself) with a fixed binary tree: ``"sw"``
    is ``f.sw``, ``("sh", j)`` is ``f.sh[j]``; a field holding a tuple of arrays (``"sh"``) is
    summed item by item (one tree for all of them; :func:`item` refers to one).

    With ``lazy`` and a single input, no task is added: the result is ``(future, field)``, which
    task arguments accept (Dask resolves the future inside the tuple) and :func:`resolve`
    unwraps on the worker. One task hop less on the critical path of every small-grid pass.
    Never gather a lazy result: it would bring the whole object to the client. Otherwise the
    field is taken on the worker holding each input before anything moves, so e.g. the column
    sums of factor chunks move (K + 1,) vectors, not the chunks. ``at`` and ``homes``: as in
    :func:`tree_reduce` (the adds only: a field is taken where its object lives). An input may
    be :data:`Lazy` itself: its field is taken out where the object holding it lives, as is a
    node ``local`` supplies (as in :func:`fold_grouped`; the inputs of a range it supplies are
    never read) below the root: what moves to an add is the part, never the object holding it.
    """
    if len(futures) == 1:
        obj, part = within(futures[0], field)
        if lazy:
            return obj if part is None else (obj, part)
        return client.submit(_pick, obj, part, priority=PRIORITY)

    def leaf(j: int) -> Lazy:  # the field taken where each object lives: only it travels
        if field is None and not isinstance(futures[j], tuple):
            return futures[j]
        return client.submit(_pick, *within(futures[j], field), priority=PRIORITY)

    def given(lo: int, hi: int) -> Lazy | None:  # a node inside the tree: taken out likewise
        x = None if local is None else local(lo, hi)
        if x is None or (lo, hi) == (0, len(futures)):
            return x
        return client.submit(_pick, *within(x, None), priority=PRIORITY)

    out = _reduce(client, len(futures), leaf, _add, (), at, homes, given)
    if isinstance(out, tuple) and not lazy:  # a sum its leaves' task made: taken out of it
        return client.submit(_pick, *out, priority=PRIORITY)
    return out
