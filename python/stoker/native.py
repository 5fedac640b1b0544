"""The native producer: a Stoker dataset's batches, made by the C++ engine's threads
(``_native.engine.Engine``) straight into pooled batch buffers and handed over without a copy."""

from __future__ import annotations

import functools
import gc
import warnings

import numpy as np

from . import _native, _options, _state, balance
from ._producer import Producer
from .errors import MemoryBudgetError
from .gpu import feed as _feed
from .sources.base import StokerDataset
from .sources.mixture import Mixture


def _budget_blocks(epoch, start, sizes):
    """The blocks (shards of ``sizes`` samples) that batches ``start..`` of a BudgetEpoch read,
    in order of first use."""
    batches = [epoch.batch(b) for b in range(start, epoch.num_batches)]
    if not batches or not len(sizes):
        return []
    samples = np.concatenate(batches).astype(np.int64)
    used = np.searchsorted(np.cumsum(np.asarray(sizes, dtype=np.int64)), samples, side="right")
    _, first = np.unique(used, return_index=True)
    return [int(b) for b in used[np.sort(first)]]


class EngineOrdered(Producer):
    """What a producer whose samples the engine orders (native, Ray) tells the front: the
    shuffle, the class-balanced plan's classes and weights, a mixture, and torch's attributes."""

    def __init__(self, dataset, options):
        o = options
        self.dataset = dataset
        self.options = o
        self._seed = o.seed
        self.shuffle = False if o.shuffle is None else o.shuffle
        # A dataset in remote shards declares default_shuffle = "shards": shuffle=True then
        # means its shard order (but for batches by a budget, whose plan shuffles its buckets).
        if self.shuffle is True and isinstance(dataset, StokerDataset) and \
                dataset.default_shuffle == "shards" and o.order != "budget":
            self.shuffle = "shards"
        if o.shard_window != "auto" and self.shuffle != "shards":
            raise ValueError(f'shard_window is for shuffle="shards", and this loader\'s order is '
                             f"shuffle={self.shuffle!r}")
        # Shards each rank keeps open (the engine's shard_window); 0: no shard order.
        self.shard_window = _options.shard_window(o) if self.shuffle == "shards" else 0
        self.mixture = dataset if o.order == "mixture" else None
        if self.shuffle == "shards" and self.mixture is not None:
            raise ValueError('shuffle="shards" is not supported with a Mixture yet: pass '
                             "shuffle=True")
        self.classes = balance.class_groups(dataset, o.labels) if o.stratified else None
        self.weights = balance.weights_for(self.classes, o.class_weights) \
            if o.stratified else []
        self.order_kind = o.order

    @property
    def seed(self):
        return self._seed

    def attributes(self):
        o = self.options
        return {"dataset": self.dataset, "batch_size": o.batch_size, "shuffle": self.shuffle,
                "drop_last": o.drop_last, "rank": o.rank, "world_size": o.world_size,
                "sampler": None, "batch_sampler": None, "persistent_workers": False}

    def plan(self, start=0):
        """The engine's BatchPlan of this rank from global position ``start`` on."""
        o = self.options
        return _state.batch_plan(self.dataset, o.batch_size, o.drop_last, o.rank, o.world_size,
                                 start, o.repeats)


class NativeProducer(EngineOrdered):
    """Batches of a Stoker dataset, made by the engine's threads (_producer.py states the
    protocol)."""

    def __init__(self, dataset, options):
        if not isinstance(dataset, StokerDataset) or not dataset._native:
            raise TypeError(
                f"stoker.DataLoader needs a dataset: a Stoker dataset (ArrayDataset, "
                f"TokenDataset, ImageFolder, TarShards, TableDataset), or a Python one with "
                f"__getitem__, got {type(dataset).__name__}")
        if dataset._source is None:
            raise ValueError(dataset._unbatchable)  # e.g. an ImageFolder without a transform
        o = options
        pin = {"auto": "auto", True: "on", False: "off"}[o.pin_memory]
        cpu_budget = 0 if o.cpu_budget is None else o.cpu_budget
        # A dataset that decodes on the GPU (decode="cuda") brings its own copy stage.
        if dataset._decodes_on_gpu and o.device is None:
            raise ValueError(f"{type(dataset).__name__}(decode=\"cuda\") decodes into GPU "
                             f"batches: pass device=\"cuda\" to the DataLoader")
        if o.device is not None and _native.gpu.cuda_available():
            _native.gpu.cuda_set_host_device(o.device.index)  # pin with the device's own context
        super().__init__(dataset, o)
        source = dataset._source_for(self.shuffle is not False)
        # device="cuda": an image transform that ends in a float ToTensor (and Normalize) has
        # the workers write uint8 and converts on the GPU after the copy (gpu/output.py).
        if o.device is not None and not dataset._decodes_on_gpu:
            variant = dataset._device_output()
            if variant is not None:
                source, self.device_output = variant
        mixing = None
        if o.batch_transform is not None:  # the images it mixes, on the CPU
            images = dataset._mixing_source(o.batch_transform)
            mixing = o.batch_transform.native(images.image_layout)
        if mixing is not None and o.device is not None:
            from .gpu.batch_transform import DeviceMixing
            self.device_mixing = DeviceMixing(
                mixing, o.seed, images.image_layout, tuple(images.image_shape),
                lambda cursor: self.plan(cursor.start))
            mixing = None
        budget = o.budget
        if budget is not None:  # the plan of the dataset's lengths (budget.py)
            from .budget import BudgetOrder
            self.budget_order = BudgetOrder(budget, dataset, o.seed, self.shuffle is not False,
                                            o.rank, o.world_size, o.on_error, source.path)
        self.engine = _native.engine.Engine(
            source, 1 if budget else o.batch_size, self.shuffle is not False, o.seed, o.drop_last,
            _options.auto(o.num_workers), _options.auto(o.prefetch_factor), pin,
            o.memory_budget, o.rank, o.world_size, o.on_error, cpu_budget=cpu_budget,
            classes=self.classes, class_weights=self.weights, repeats=o.repeats,
            batch_transform=mixing, shard_window=self.shard_window,
            budget=None if budget is None else self.budget_order.plan,
            pad_to_multiple_of=1 if budget is None else budget.pad_to_multiple_of,
            **self._mixture_order())
        if self.engine.pin_unavailable:  # fell back to pageable memory (stoker/engine.h)
            warnings.warn("pin_memory=True but no CUDA device was found; using pageable memory",
                          stacklevel=4)
        if self.engine.pinned:
            _feed.install_fence_provider()
        self.torch = o.torch_output
        # A batch as the dataset makes it from the engine's fields (a table's dict of columns).
        self.assemble = dataset._assemble_batch
        if mixing is not None:  # the engine appends the soft labels to the source's fields
            names = list(source.field_names)
            self.assemble = functools.partial(_mixed_batch, names.index("image"), len(names))

    def _mixture_order(self):
        """The engine's mixture order: the sizes, and the schedule of epoch 0's first step (the
        front gives every iteration a plan of its own, _state.mixture_plan)."""
        if self.mixture is None:
            return {}
        return {"mixture_sizes": self.mixture.sizes,
                "mixture_schedule": self.mixture.phases(0, 1)[:1]}

    def knobs(self):
        return {"num_workers": self.engine.num_workers,
                "prefetch_factor": self.engine.prefetch_factor,
                "pin_memory": self.engine.pinned, "memory_budget": self.engine.memory_budget}

    def num_batches(self):
        if self.budget_order is not None:  # the first epoch's; len(loader) asks _state for its own
            return self.budget_order.epoch(0).num_batches
        return len(self.engine)

    @property
    def block_window(self):
        """Blocks (shards, row groups) a rank keeps open a window in the engine's block order;
        0 when the samples are not ordered by blocks."""
        return self.engine.shard_window

    def epoch_source(self, epoch, start_batch, plan=None, stripes=0):
        """The engine's iterator over one epoch's batches (``plan``: a BatchPlan, or None for
        the loader's own; ``stripes``: the world size a block order's epoch is arranged for, 0
        for the loader's)."""
        return self.engine.iterate(epoch, start_batch, plan, stripes)

    def block_schedule(self, cursor):
        """The blocks (shards) the iteration that ``cursor`` starts reads, in first-use order (a
        uint64 array; empty without a block order): what a remote fetcher downloads."""
        plan = self.plan(cursor.start) if cursor.start else None
        return self.engine.block_schedule(cursor.epoch, cursor.batch, plan, cursor.stripes or 0)

    def _schedule_remote(self, cursor):
        """Tells a remote dataset's shard cache which shards this iteration reads, in order of
        first use, so that they are fetched ahead (sources/remote.py)."""
        remote = self.dataset._remote
        if remote is None:
            return
        block_shards = self.dataset._block_shards
        if cursor.budget is not None:  # the budget's batches' shards, in first-use order
            blocks = _budget_blocks(cursor.budget, cursor.batch, self.dataset._source.shards())
        else:
            blocks = [int(b) for b in self.block_schedule(cursor)]
        if not blocks:  # no shard order: every shard, in order
            blocks = range(len(block_shards))
        seen, order = set(), []
        for b in blocks:
            for s in block_shards[b]:
                if s not in seen:
                    seen.add(s)
                    order.append(s)
        remote.schedule(order)

    def batches(self, cursor):
        self._schedule_remote(cursor)
        if cursor.budget is not None:
            native = self.engine.iterate_budget(cursor.budget, cursor.batch)
        elif cursor.mixture is not None:
            native = self.engine.iterate_mixture(cursor.mixture, cursor.batch)
        else:
            plan = self.plan(cursor.start) if cursor.start else None
            native = self.epoch_source(cursor.epoch, cursor.batch, plan, cursor.stripes or 0)
        return NativeBatches(native, cursor, self.torch, self.assemble)

    def copy_stage(self, device):
        return self.dataset._copy_stage(device, self.options.on_error)

    def stats(self):
        s = self.engine.stats()
        if self.device_output is not None:
            s["device_output"] = self.device_output.describe()
        return s


def _mixed_batch(image, soft_label, fields):
    """A mixed batch as the loader yields it: (images, soft labels)."""
    return fields[image], fields[soft_label]


class NativeBatches:
    """One iteration's batches from the engine; it owns ``cursor`` and keeps ``cursor.batch`` at
    the batches delivered."""

    __slots__ = ("_native", "_cursor", "_torch", "_assemble")

    def __init__(self, native, cursor, torch, assemble):
        self._native = native
        self._cursor = cursor
        self._torch = torch
        self._assemble = assemble

    def __iter__(self):
        return self

    def __len__(self):
        return self._cursor.num_batches - self._cursor.batch

    def __next__(self):
        if self._native is None:
            raise StopIteration
        try:
            try:
                fields = self._native.next(self._torch)
            except MemoryBudgetError:
                # Batches the consumer dropped may still sit in reference cycles: collect, retry.
                gc.collect()
                fields = self._native.next(self._torch)
        except StopIteration:
            self._native = None  # joins the worker threads now, not at garbage collection
            raise
        finally:
            if self._native is not None:
                self._cursor.batch = self._native.position  # a failed batch counts as consumed
        return self._assemble(fields)
