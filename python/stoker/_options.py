"""The options of a ``stoker.DataLoader``: parsed, defaulted and checked once, into one immutable
:class:`Options`.

``parse`` holds every rule that does not depend on how the batches are made (seed, output,
on_error, pin_memory, memory_budget, rank and world size, batch_size, the knobs, shuffle with
class_weights and drop_last, repeats with the order, the GPU feed, batch_transform), each once,
with one message for every producer. A Python dataset's producer runs torch's own checks first,
with torch's messages (pydata/producer.py ``validate``, called by the loader before ``parse``).
What a producer alone constrains (Python-only keywords, offload's limits) it checks itself, once.
Rules the engine also needs for its C++ users live in the engine (include/stoker/engine.h:
``check_repeats``, ``resolve_memory_budget``, ``resolve_pinned``); ``parse`` and the producers
ask it, and its InvalidArgument reaches the user as ValueError. Here only what is Python's: a
value's type (an int, not a bool or a float) before it crosses.
"""

from __future__ import annotations

import dataclasses
import re

from . import _native, _ranks, balance, batch_transforms
from .budget import Budget, dataset_buckets
from ._checks import is_int
from .gpu import feed as _feed

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

# The options only Python datasets read, with their defaults (torch's keywords, and Stoker's own
# for worker processes).
PYTHON_ONLY = {"sampler": None, "batch_sampler": None, "collate_fn": None,
               "worker_init_fn": None, "timeout": 0, "persistent_workers": False,
               "generator": None, "worker_type": "auto", "seed_samples": True,
               "consumer_helps": None, "multiprocessing_context": None, "in_order": True,
               "pin_memory_device": ""}


def parse_bytes(value, name="memory_budget"):
    """Bytes of ``value``: None (0: the default), a positive int, or a size such as "4GiB"."""
    if value is None:
        return 0
    if is_int(value) and value > 0:
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
            if n > 0:
                return n
    raise ValueError(
        f"{name} must be None, a positive number of bytes, or a size such as '4GiB' or "
        f"'512MB', got {value!r}")


def knob(name, value):
    """None for "auto", else ``value``, an integer (its range is the engine's rule:
    ``check_knobs``)."""
    if value == "auto":
        return None
    if not is_int(value):
        raise ValueError(f'{name} must be "auto" or an integer, got {value!r}')
    return value


def check_knobs(num_workers="auto", prefetch_factor="auto", cpu_budget=None):
    """The knobs as the engine checks them (include/stoker/engine.h ``check_knobs``, its message):
    ValueError naming the first out of its range. cpu_budget None: the usable cores."""
    _native.engine.check_knobs(knob("num_workers", num_workers),
                               knob("prefetch_factor", prefetch_factor),
                               None if cpu_budget is None else knob("cpu_budget", cpu_budget))


def auto(value):
    """A checked knob as the engine takes it: -1 for "auto"."""
    return -1 if value == "auto" else value


def torch_available():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Options:
    """A loader's options, checked; ``python`` holds the Python-only keywords (all of them,
    defaults included). ``rank``/``world_size`` are the share resolved from ``rank_spec``
    (_ranks.py) when the options were made; the loader replaces them when an iteration
    resolves another (a producer that shards nothing ignores them); ``order`` says who orders the samples
    (``ORDERS``)."""
    batch_size: object  # as given: an int, None (Python datasets) or a stoker.Budget
    budget: object  # the stoker.Budget given as batch_size, else None
    shuffle: object  # None (unspecified: no shuffle), True, False, "stratified" or "shards"
    seed: int
    drop_last: bool
    num_workers: object
    prefetch_factor: object
    pin_memory: object  # "auto", True or False
    memory_budget: int  # bytes; 0: half of physical memory
    rank: int
    world_size: int
    rank_spec: object  # _ranks.RankSpec: what was given, resolved again at each iteration
    output: str
    on_error: str
    cpu_budget: object
    device: object  # torch.device("cuda", N) or None
    gpu_prefetch: int
    gpu_prefetch_bytes: int | None
    class_weights: object
    labels: object
    offload: object
    python: dict
    repeats: int  # every sample this many times an epoch (repeated augmentation)
    batch_transform: object  # a batch_transforms.Spec, or None
    stratified: bool  # shuffle="stratified" or class_weights
    order: str  # one of ORDERS
    # shuffle="shards": shards a rank keeps open ("auto" or a positive int; shard_window())
    shard_window: object

    def python_given(self):
        """The Python-only options set to other than their defaults."""
        return {k: v for k, v in self.python.items()
                if v is not PYTHON_ONLY[k] and v != PYTHON_ONLY[k]}

    @property
    def torch_output(self):
        """Whether batches are torch tensors (output="torch" and torch is installed)."""
        return self.output == "torch" and torch_available()


# Who orders a loader's samples: the engine's plain order (EpochOrder + BatchPlan, or a block
# order), its class-stratified or class-weighted order, a Mixture's weights, a Budget's plan
# (budget.py), a sampler or batch_sampler of the user's, or an IterableDataset's own stream.
ORDERS = ("engine", "stratified", "mixture", "budget", "sampler", "iterable")


def order_of(dataset, kind, stratified, python, budget=None):
    """Who orders the samples of ``dataset`` read by producer ``kind`` (``budget``: the
    stoker.Budget given as batch_size, or None). ValueError for a budget with an order of its
    own."""
    from .sources.mixture import Mixture
    iterable = False
    if kind == "python":
        from torch.utils.data import IterableDataset
        iterable = isinstance(dataset, IterableDataset)
    if budget is not None:
        other = ('shuffle="stratified" or class_weights' if stratified else
                 "a Mixture" if isinstance(dataset, Mixture) else
                 "an IterableDataset" if iterable else
                 "a sampler or batch_sampler" if kind == "python" and (
                     python["sampler"] is not None or python["batch_sampler"] is not None)
                 else None)
        if other:
            raise ValueError(f"batch_size={budget!r} plans the epoch's batches by their cost; "
                             f"{other} orders samples by rules of its own: not both")
        return "budget"
    if stratified and isinstance(dataset, Mixture):
        raise ValueError('shuffle="stratified" and class_weights balance classes; a Mixture draws '
                         "its sources by its own weights (Mixture(weights=...)): pass shuffle=True "
                         "or False")
    if stratified:
        return "stratified"
    if isinstance(dataset, Mixture):
        return "mixture"
    if iterable:
        return "iterable"
    if kind == "python" and (python["sampler"] is not None or python["batch_sampler"] is not None):
        return "sampler"
    return "engine"


def parse(dataset, kind, batch_size, shuffle, seed, drop_last, num_workers, prefetch_factor,
          pin_memory, memory_budget, rank, world_size, output, on_error, cpu_budget, device,
          gpu_prefetch, gpu_prefetch_bytes, class_weights, labels, offload, python, repeats,
          batch_transform, shard_window):
    """The :class:`Options` of a loader whose batches producer ``kind`` makes ("native",
    "python" or "offload"); ValueError (TypeError for an unknown keyword) naming the option."""
    for key in python:
        if key not in PYTHON_ONLY:
            raise TypeError(f"DataLoader() got an unexpected keyword argument {key!r}")
    python = {**PYTHON_ONLY, **python}
    if not is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    if python["generator"] is not None and seed != 0:
        raise ValueError("give seed or generator, not both: with a generator, the seed is "
                         "drawn from it")
    if not (isinstance(pin_memory, (bool, str)) and pin_memory in ("auto", True, False)):
        raise ValueError(f'pin_memory must be "auto", True or False, got {pin_memory!r}')
    budget = parse_bytes(memory_budget)
    rank_spec = _ranks.RankSpec(rank, world_size)
    share = rank_spec.resolve(strict=False)  # resolved again when an iteration starts
    if output not in ("torch", "numpy"):
        raise ValueError(f'output must be "torch" or "numpy", got {output!r}')
    if on_error not in ("raise", "skip"):
        raise ValueError(f'on_error must be "raise" or "skip", got {on_error!r}')
    resolved = _feed.resolve_device(device)
    if resolved is not None and output != "torch":
        raise ValueError(f'device={device!r} yields torch tensors: output must be "torch", '
                         f"got {output!r}")
    cap = None if gpu_prefetch_bytes is None else parse_bytes(gpu_prefetch_bytes,
                                                              "gpu_prefetch_bytes")
    if not is_int(repeats) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer (each sample this many times an "
                         f"epoch), got {repeats!r}")
    if shard_window != "auto" and not (is_int(shard_window) and shard_window >= 1):
        raise ValueError(f'shard_window must be "auto" or a positive integer (shards each rank '
                         f'keeps open), got {shard_window!r}')
    spec = None
    if batch_transform is not None:
        spec = batch_transforms.parse(batch_transform)
    if kind != "python":  # a Python dataset's were torch's checks, with torch's messages
        if python_given := {k: v for k, v in python.items()
                            if v is not PYTHON_ONLY[k] and v != PYTHON_ONLY[k]}:
            if kind == "native":
                raise ValueError(f"{next(iter(python_given))} is for Python datasets; native "
                                 f"datasets order, batch and seed samples in the engine")
        if not isinstance(batch_size, Budget) and (not is_int(batch_size) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or a stoker.Budget, got "
                             f"{batch_size!r}")
        if kind == "native":
            check_knobs(num_workers, prefetch_factor, cpu_budget)
        else:
            check_knobs(prefetch_factor=prefetch_factor)
    stratified = balance.check_shuffle(False if shuffle is None else shuffle, class_weights)
    if kind == "python":
        drop_last = bool(drop_last)  # any truth value, as torch takes it
    elif not isinstance(drop_last, bool):
        raise ValueError(f"drop_last must be True or False, got {drop_last!r}")
    budget_given = batch_size if isinstance(batch_size, Budget) else None
    if budget_given is None and kind != "python" and is_int(batch_size) and \
            dataset_buckets(dataset) is not None:  # batches of N from one bucket each
        budget_given = Budget(samples=batch_size)
    order = order_of(dataset, kind, stratified, python, budget_given)
    _native.engine.check_repeats(repeats, order)  # the engine's rule (include/stoker/engine.h)
    return Options(batch_size=batch_size, budget=budget_given, shuffle=shuffle, seed=seed, drop_last=drop_last,
                   num_workers=num_workers, prefetch_factor=prefetch_factor,
                   pin_memory=pin_memory, memory_budget=budget, rank=share.rank,
                   world_size=share.world_size, rank_spec=rank_spec, output=output, on_error=on_error,
                   cpu_budget=cpu_budget, device=resolved,
                   gpu_prefetch=_feed.resolve_prefetch(gpu_prefetch), gpu_prefetch_bytes=cap,
                   class_weights=class_weights, labels=labels, offload=offload,
                   python=python, repeats=repeats, batch_transform=spec,
                   stratified=stratified, order=order, shard_window=shard_window)


# shard_window="auto": shards each rank keeps open at once. Larger mixes more (docs/remote.md,
# "Shuffle quality") at the cost of that many shards in flight per rank.
AUTO_SHARD_WINDOW = 8


def shard_window(options):
    """The shard order's window: ``options.shard_window``, with "auto" resolved."""
    w = options.shard_window
    return AUTO_SHARD_WINDOW if w == "auto" else w
