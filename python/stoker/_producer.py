"""``Producer``: what the ``stoker.DataLoader`` front (loader.py) reads of whatever makes its batches.

Three producers, chosen by the dataset and ``offload`` (loader.py ``_producer_kind``):
``NativeProducer`` (native.py: a Stoker dataset, the engine's threads), ``PythonProducer``
(pydata/producer.py: any Python dataset, worker processes) and ``RayProducer``
(offload/producer.py: either kind, on Ray actors). Each gets the parsed, immutable
``_options.Options`` and implements the abstract members; the others have their defaults here.
The front uses these members and nothing else.
"""

from __future__ import annotations

import abc


class Producer(abc.ABC):
    """A loader's source of CPU batches, made from its dataset and ``_options.Options``."""

    #: who orders the samples: one of ``_options.ORDERS`` (the resume state records it)
    order_kind: str = "engine"
    #: a class-balanced order's ``ClassGroups`` and class weights (``class_plan()``, the state)
    classes = None
    weights: list = []
    #: blocks a rank keeps open in the engine's block order (shards, row groups); 0: none
    block_window = 0
    #: run on the GPU after the copy, for ``device="cuda"``: a batch transform
    #: (gpu/batch_transform.py ``DeviceMixing``) and a dtype conversion (gpu/output.py)
    device_mixing = None
    device_output = None
    #: a Python dataset's ``multiprocessing_context`` (torch's attribute)
    context = None
    #: batches by a stoker.Budget: the loader's budget.BudgetOrder (the plan and its epochs)
    budget_order = None

    @property
    @abc.abstractmethod
    def seed(self):
        """The seed of the order and of per-sample randomness."""

    @abc.abstractmethod
    def attributes(self):
        """The loader's attributes as torch names them (``dataset``, ``batch_size``, ``shuffle``,
        ``drop_last``, ``sampler``, ``batch_sampler``, ``persistent_workers``, ``rank``,
        ``world_size``, and a Python dataset's keywords), set once on the loader."""

    @abc.abstractmethod
    def knobs(self):
        """The resolved ``num_workers``, ``prefetch_factor``, ``pin_memory`` and
        ``memory_budget``."""

    @abc.abstractmethod
    def num_batches(self):
        """``len(loader)``; TypeError where the dataset has no length."""

    @abc.abstractmethod
    def batches(self, cursor):
        """An iterator (with ``__len__``) over the CPU batches of the iteration that ``cursor``
        (an ``_state.Cursor``) starts; it owns the cursor and advances ``cursor.batch`` as it
        delivers."""

    @abc.abstractmethod
    def stats(self):
        """Its counters: at least batches, samples, skipped and skipped_samples."""

    @property
    def auto_collation(self):
        """Whether samples are batched (torch's ``_auto_collation``)."""
        return True

    def copy_stage(self, device):
        """The stage that copies (or decodes) its batches onto ``device``; None: a plain copy
        (gpu/feed.py)."""
        return None

    def iteration_made(self):
        """``iter(loader)`` made an iteration (it starts at its first ``next()``): what torch's
        iterator reads of its loader when made is read now."""

    def own_states(self, cursor):
        """What the loader's state carries of the user's own objects (a Python dataset's and
        sampler's ``state_dict``), given the latest iteration's ``cursor`` (or None): a dict
        merged into ``state_dict()``; {} by default."""
        return {}

    def restore_own_states(self, state, position):
        """Loads what ``own_states`` saved in ``state`` for the iteration that resumes at
        ``position`` (an ``_state.Position``); nothing by default."""

    def persistent_iterator(self):
        """The latest iterator while worker processes persist (torch's ``_iterator``), else
        None."""
        return None

    def stop_workers(self):
        """Stops persistent workers (torch's ``loader._iterator = None``)."""

    def shutdown(self):
        """Stops its workers (processes, Ray actors) now; the next iteration starts new ones."""


class Offload(abc.ABC):
    """What ``DataLoader(offload=...)`` takes (offload/producer.py ``RayOffload``): where batches
    are made elsewhere, it makes the loader's producer."""

    @abc.abstractmethod
    def make_producer(self, dataset, options):
        """The ``Producer`` of a loader of ``dataset`` with ``options`` (``_options.Options``)."""
