"""Which share of each epoch this process reads: the rank and world size, resolved when an
iteration starts (not when the loader is made), and checked across ranks once.

A trainer often makes the loader before it starts its processes' group (Lightning's DataModule,
a script re-run by each DDP process, Accelerate's ``prepare``), and Lightning's launcher sets
``WORLD_SIZE`` without ``RANK``. So the loader keeps what it was given (:class:`RankSpec`) and
resolves it again when an iteration starts, in this order:

1. ``rank=`` and ``world_size=`` given as integers: those (trusted: no collective);
2. ``rank=`` given as a ``torch.distributed`` process group, a one-dimensional ``DeviceMesh``
   (``mesh["dp"]``), or ``(mesh, "dp")`` / ``(mesh, ("dp_replicate", "dp_shard"))``: this process's
   coordinate in the group or in those mesh dimensions (torchtitan's and FSDP2's data-parallel
   ranks);
3. the initialized default process group;
4. torchrun's ``RANK`` and ``WORLD_SIZE``.

``WORLD_SIZE > 1`` with no rank to be found is an error that names the fix, never a silent rank 0
(two ranks reading the same half of every epoch). Before an iteration starts, ``resolve`` is
lenient (``len()`` before the group exists answers for rank 0 of ``WORLD_SIZE``).

Where the ranks come from a process group, the first iteration of a loader checks with one small
collective (an all-gather of six integers) that every rank agrees on what decides the batches:
the dataset's length, the seed, the batch size, drop_last and the epoch about to start. A rank
that differs is named in the error, raised on every rank (so none waits in a later collective).
Integers given explicitly skip the check: they are the way to read a loader on one rank only.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from ._checks import is_int


def env_int(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


@dataclasses.dataclass(frozen=True)
class Ranks:
    """A resolved share: ``rank`` of ``world_size``; ``groups``: the process groups to check
    agreement over (empty: nothing to check), ``source``: where it came from (for messages)."""
    rank: int
    world_size: int
    groups: tuple = ()
    source: str = "default"
    known: bool = True  # False: WORLD_SIZE > 1 without a rank (lenient resolution only)


def _torch_distributed():
    """torch.distributed, where torch is in use (no process group exists before torch is
    imported, so a NumPy-only job never imports it here)."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist
    return dist if dist.is_available() else None


def _is_mesh(x):
    if "torch" not in sys.modules:
        return False
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:
        return False
    return isinstance(x, DeviceMesh)


def _is_group(x):
    dist = _torch_distributed()
    return dist is not None and isinstance(x, dist.ProcessGroup)


def _mesh_ranks(mesh, dims=None):
    """(rank, world_size, groups) of this process in ``dims`` of ``mesh`` (all its dimensions
    when None), the dimensions raveled in order."""
    if dims is not None:
        mesh = mesh[dims]
    coords = mesh.get_coordinate()
    if coords is None:
        raise ValueError(f"this process is not in the DeviceMesh {mesh}: pass the mesh of the "
                         f"data-parallel ranks it belongs to")
    rank, world = 0, 1
    for c, size in zip(coords, mesh.mesh.shape):
        rank, world = rank * size + c, world * size
    groups = tuple(mesh.get_group(d) for d in range(mesh.ndim))
    return rank, world, groups


class RankSpec:
    """What the loader was given for ``rank`` and ``world_size``, checked when the loader is made
    and resolved at each iteration (the module docstring gives the order)."""

    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size
        self.mesh = self.group = self.dims = None
        if isinstance(rank, tuple) and len(rank) == 2 and _is_mesh(rank[0]):
            self.mesh, self.dims = rank
            if not (isinstance(self.dims, str) or (isinstance(self.dims, tuple) and self.dims
                                                   and all(isinstance(d, str)
                                                           for d in self.dims))):
                raise ValueError(f"rank=(mesh, dims): dims must name the mesh's data-parallel "
                                 f"dimension(s), a str or a tuple of str, got {self.dims!r}")
        elif _is_mesh(rank):
            if rank.ndim != 1:
                raise ValueError(f"rank=DeviceMesh of {rank.ndim} dimensions: pass its "
                                 f'data-parallel part, mesh["dp"] or (mesh, "dp")')
            self.mesh = rank
        elif _is_group(rank):
            self.group = rank
        elif rank is not None and not is_int(rank):
            raise ValueError(f"rank must be an integer, a torch.distributed process group or a "
                             f"DeviceMesh (or (mesh, dims)), got {rank!r}")
        if (self.mesh is not None or self.group is not None) and world_size is not None:
            raise ValueError("rank= is a process group or a DeviceMesh, which gives the world "
                             "size too: leave world_size unset")
        if world_size is not None and (not is_int(world_size) or world_size < 1):
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        if is_int(rank) and world_size is not None and not 0 <= rank < world_size:
            raise ValueError(f"rank must be an integer in [0, {world_size}), got {rank!r}")

    @property
    def explicit(self):
        """Whether both were given as integers (the loader's share is fixed)."""
        return is_int(self.rank) and self.world_size is not None

    def resolve(self, strict):
        """The :class:`Ranks` now. ``strict`` (an iteration starts): ValueError where
        WORLD_SIZE > 1 names no rank; otherwise such a share resolves as rank 0, not known."""
        if self.mesh is not None:
            rank, world, groups = _mesh_ranks(self.mesh, self.dims)
            return Ranks(rank, world, groups, "the DeviceMesh")
        if self.group is not None:
            dist = _torch_distributed()
            return Ranks(dist.get_rank(self.group), dist.get_world_size(self.group),
                         (self.group,), "the process group")
        if self.explicit:
            return Ranks(self.rank, self.world_size, (), "rank= and world_size=")
        dist = _torch_distributed()
        if dist is not None and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
            if self.world_size is not None and self.world_size != world:
                raise ValueError(f"world_size={self.world_size} but the default process group "
                                 f"has {world} ranks: leave world_size unset, or pass the "
                                 f"data-parallel group as rank=")
            if is_int(self.rank) and self.rank != rank:
                raise ValueError(f"rank={self.rank} but this process is rank {rank} of the "
                                 f"default process group: leave rank unset, or pass both "
                                 f"rank= and world_size= to read another share")
            return Ranks(rank, world, (None,), "the default process group")
        world = env_int("WORLD_SIZE", 1) if self.world_size is None else self.world_size
        if world < 1:
            raise ValueError(f"environment variable WORLD_SIZE={world} is not a positive "
                             f"integer")
        rank = self.rank if is_int(self.rank) else env_int("RANK", None)
        if rank is None:
            if world == 1:
                return Ranks(0, 1)
            if strict:
                given = "WORLD_SIZE" if self.world_size is None else "world_size"
                raise ValueError(
                    f"{given}={world} but this process's rank is unknown (no RANK in the "
                    f"environment, no rank=, and torch.distributed is not initialized): reading "
                    f"as rank 0 would give every process the same share. Initialize the process "
                    f"group before the first iteration (torch.distributed.init_process_group, "
                    f"as Lightning, Accelerate and torchrun do), or pass rank=")
            return Ranks(0, world, (), "WORLD_SIZE", known=False)
        if not 0 <= rank < world:
            raise ValueError(f"rank must be an integer in [0, {world}), got {rank!r} "
                             f"(from {'rank=' if is_int(self.rank) else 'RANK'})")
        return Ranks(rank, world, (), "RANK and WORLD_SIZE")


# The values every rank must agree on, in the order the check gathers them.
AGREED = ("dataset length", "seed (low 32 bits)", "seed (high 32 bits)", "batch_size",
          "drop_last", "epoch")


def agreement_values(num_samples, seed, batch_size, drop_last, epoch):
    """The integers the check gathers (-1 for an unknown length or no batch size)."""
    return [-1 if num_samples is None else num_samples, seed & 0xFFFFFFFF, seed >> 32,
            batch_size if is_int(batch_size) else -1, int(bool(drop_last)), epoch]


def check_agreement(ranks, values):
    """Gathers ``values`` (``agreement_values``) from every rank of each of ``ranks.groups`` and
    raises ValueError naming the ranks that differ from the group's first. One all-gather a
    group; on a GPU-only backend (NCCL) the tensor is on the current CUDA device."""
    dist = _torch_distributed()
    import torch
    for group in ranks.groups:
        n = dist.get_world_size(group)
        if n == 1:
            continue
        backend = str(dist.get_backend(group))
        device = "cpu"
        if "gloo" not in backend and "cpu" not in backend and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        mine = torch.tensor(values, dtype=torch.int64, device=device)
        gathered = [torch.empty_like(mine) for _ in range(n)]
        dist.all_gather(gathered, mine, group=group)
        rows = [g.tolist() for g in gathered]

        def global_rank(i):
            return i if group is None else dist.get_global_rank(group, i)

        differ = []
        for i, row in enumerate(rows[1:], 1):
            for name, a, b in zip(AGREED, rows[0], row):
                if a != b:
                    differ.append(f"rank {global_rank(i)} has {name} {b}, rank "
                                  f"{global_rank(0)} has {a}")
        if differ:
            raise ValueError(
                "the ranks of this job do not agree on the data, so their shares would not "
                "partition the epoch: " + "; ".join(differ[:8]) +
                ("; ..." if len(differ) > 8 else "") + ". Every rank must make its loader "
                "with the same dataset, seed and batch_size, and start the same epoch "
                "(set_epoch, load_state_dict) on every rank.")
