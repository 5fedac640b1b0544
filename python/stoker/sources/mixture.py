"""``stoker.Mixture``: a dataset made of Stoker datasets, drawn in proportion to weights.

The order is the engine's (``stoker/mixture.h``, docs/mixtures.md): every batch holds
each source within one sample of its weight's share, and each source is walked through an
exactly-once order of its own, starting a new epoch of its own when it runs out. This module
checks the datasets and the weights, and turns a schedule into the phases the engine plans with.
"""

from __future__ import annotations

import collections.abc
import hashlib
import json
import math
import numbers

from .. import _native
from .._checks import is_integral
from .base import StokerDataset


class Mixture(StokerDataset):
    """Stoker datasets of any kind (tokens, arrays, images, tables) as one dataset whose batches
    mix them by weight.

    Args:
        datasets: ``{name: dataset}``; Stoker datasets with the same fields (names, dtypes and
            shapes): ``ArrayDataset``, ``TokenDataset``, ``ImageFolder``, ``TarShards``,
            ``TableDataset``.
        weights: how the batches draw the sources: None (in proportion to their sizes), a dict
            ``{name: weight}`` (every source; weights finite, >= 0, summing to > 0; a source of
            weight 0 is not drawn), a list ``[(step, {name: weight}), ...]`` of phases from
            increasing optimizer steps (the first at step 0), or a callable ``step -> {name:
            weight}`` (called by the loader for every step of an epoch when the epoch starts,
            never per sample). Settable: ``mixture.weights = ...`` before a loader iterates or
            loads a state applies from there on.

    A loader's epoch has the batches of the sources concatenated (``len(loader)`` is the same);
    each source counts its own epochs (``loader.stats()["mixture"]``). Sample ``i`` is sample
    ``i - offset`` of the source whose samples it falls in, the sources end to end in the order
    given (``mixture[i]`` reads it, for inspection).
    """

    def __init__(self, datasets, weights=None):
        if not isinstance(datasets, collections.abc.Mapping) or not datasets:
            raise ValueError(f"Mixture needs a non-empty dict {{name: dataset}}, got "
                             f"{datasets!r}")
        sources = []
        for name, ds in datasets.items():
            if not isinstance(name, str):
                raise ValueError(f"Mixture source names must be strings, got {name!r}")
            if not isinstance(ds, StokerDataset) or (ds._source is None
                                                      and ds._unbatchable is None):
                raise TypeError(f"Mixture source {name!r} must be a Stoker dataset (ArrayDataset, "
                                f"TokenDataset, ImageFolder, TarShards, TableDataset), got "
                                f"{type(ds).__name__}")
            if ds._source is None:
                raise ValueError(f"Mixture source {name!r}: {ds._unbatchable}")
            source = ds._source
            if ds._decodes_on_gpu:
                raise ValueError(f'Mixture source {name!r} decodes on the GPU (decode="cuda"); '
                                 f"a Mixture reads its sources on the CPU")
            if ds._text:
                raise ValueError(f"Mixture source {name!r} has text columns, which a batch looks "
                                 f"up by sample index in its own table; mix tables of tensor "
                                 f"columns")
            sources.append(source)
        self.datasets = dict(datasets)
        self.names = list(datasets)
        self.sizes = [len(s) for s in sources]
        self._source = _native.sources.MixtureSource(sources, self.names)
        # A batch is assembled (and named) as the first source's (a table's dict: the fields
        # are the same).
        first = self.datasets[self.names[0]]
        self._assemble_batch = first._assemble_batch
        self._batch_names = first._batch_names
        self._labels_are_next_tokens = first._labels_are_next_tokens
        self.weights = weights

    def _identity(self):
        return [(name, ds._identity()) for name, ds in self.datasets.items()]

    # -- weights ----------------------------------------------------------------------------------

    @property
    def weights(self):
        """The weights as given (None, a dict, a list of phases or a callable)."""
        return self._weights

    @weights.setter
    def weights(self, weights):
        if weights is None:
            self._phases = [(0, self._vector(dict(zip(self.names, self.sizes)), None))]
            self._function = None
        elif callable(weights) and not isinstance(weights, collections.abc.Mapping):
            self._phases, self._function = None, weights
            self._vector(weights(0), 0)  # a schedule that fails fails now, not at the first batch
        elif isinstance(weights, collections.abc.Mapping):
            self._phases, self._function = [(0, self._vector(weights, None))], None
        elif isinstance(weights, (list, tuple)):
            self._phases, self._function = self._schedule(weights), None
        else:
            raise ValueError(f"Mixture weights must be None, a dict {{name: weight}}, a list of "
                             f"(step, dict) phases or a callable step -> dict, got {weights!r}")
        self._weights = weights

    def _schedule(self, phases):
        out = []
        for i, phase in enumerate(phases):
            if not (isinstance(phase, (list, tuple)) and len(phase) == 2):
                raise ValueError(f"Mixture weights phase {i} must be (step, {{name: weight}}), "
                                 f"got {phase!r}")
            step, weights = phase
            if not is_integral(step) or step < 0:
                raise ValueError(f"Mixture weights phase {i}: the step must be a non-negative "
                                 f"integer, got {step!r}")
            if i == 0 and step != 0:
                raise ValueError(f"Mixture weights: the first phase must start at step 0, got "
                                 f"step {step}")
            if out and step <= out[-1][0]:
                raise ValueError(f"Mixture weights: phases must start at increasing steps, got "
                                 f"step {step} after step {out[-1][0]}")
            out.append((int(step), self._vector(weights, int(step))))
        if not out:
            raise ValueError("Mixture weights: a list of phases needs at least one")
        return out

    def _vector(self, weights, step):
        """``weights`` (a dict of every source's weight) as a list in source order, checked."""
        at = "" if step is None else f" at step {step}"
        if not isinstance(weights, collections.abc.Mapping):
            raise ValueError(f"Mixture weights{at} must be a dict {{name: weight}}, got "
                             f"{weights!r}")
        unknown = [k for k in weights if k not in self.datasets]
        if unknown:
            raise ValueError(f"Mixture weights{at} name unknown source {unknown[0]!r}; the "
                             f"sources are {', '.join(map(repr, self.names))}")
        out = []
        for name, size in zip(self.names, self.sizes):
            if name not in weights:
                raise ValueError(f"Mixture weights{at} have no weight for source {name!r}")
            w = weights[name]
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) \
                    or w < 0:
                raise ValueError(f"Mixture weights{at}: source {name!r} has weight {w!r}; "
                                 f"weights must be finite numbers >= 0")
            if w > 0 and size == 0:
                raise ValueError(f"Mixture weights{at}: source {name!r} has no samples but "
                                 f"weight {w!r}")
            out.append(float(w))
        if not sum(out) > 0:
            raise ValueError(f"Mixture weights{at} sum to {sum(out)!r}; at least one source "
                             f"needs a positive weight")
        return out

    def phases(self, first_step, steps):
        """The schedule over steps [first_step, first_step + steps) as the engine takes it:
        ``[(step, [weight per source]), ...]`` (a callable is called once per step)."""
        if self._function is None:
            return list(self._phases)
        out = []
        for step in range(first_step, first_step + max(steps, 1)):
            w = self._vector(self._function(step), step)
            if not out or w != out[-1][1]:
                out.append((step, w))
        return out

    def weights_at(self, step):
        """``{name: weight}`` in force at ``step``."""
        if self._function is not None:
            w = self._vector(self._function(step), step)
        else:
            w = next(w for s, w in reversed(self._phases) if s <= step)
        return dict(zip(self.names, w))

    def fingerprint(self, first_step, last_step):
        """A short digest of the weights in force over steps [first_step, last_step] (scaled, as
        the engine takes them): a state resumes its saved plan only under the same weights."""
        in_force = []
        for step, w in self.phases(first_step, last_step - first_step + 1):
            top = max(w)
            w = [float(f"{x / top:.9g}") for x in w]
            if step <= first_step:
                in_force = [(first_step, w)]
            elif step <= last_step and w != in_force[-1][1]:
                in_force.append((step, w))
        return hashlib.sha1(json.dumps(in_force).encode()).hexdigest()[:16]

    # -- the dataset ------------------------------------------------------------------------------

    def __len__(self):
        return sum(self.sizes)

    def locate(self, index):
        """``(name, local index)`` of global sample ``index``."""
        c, j = self._source.locate(index)
        return self.names[c], j

    def __getitem__(self, index):
        if not is_integral(index):
            raise TypeError(f"index must be an integer, got {type(index).__name__}")
        if index < 0:
            index += len(self)
        name, j = self.locate(index)
        return self.datasets[name][j]

    def __reduce__(self):  # pickled as its spec: each dataset as its own
        return Mixture, (self.datasets, self._weights)

    def __repr__(self):
        parts = ", ".join(f"{n}: {type(d).__name__}({s})"
                          for n, d, s in zip(self.names, self.datasets.values(), self.sizes))
        return f"Mixture({{{parts}}}, weights={self._weights!r})"
