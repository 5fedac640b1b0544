"""Worker processes and threads that run a Python dataset's ``__getitem__`` (or ``__iter__``).

How a batch travels (process workers):

1. The consumer takes a buffer from the engine's SharedPool (a BatchPool carved from one memfd,
   mapped before the workers are forked, so every worker sees it), resets the batch's claim
   counter (shared memory too) and sends one worker a task: ``(task id, epoch, sample indices,
   buffer offset, buffer bytes, counter)``: a few dozen bytes.
2. The worker, and the consumer while it waits for that batch, claim chunks of the batch from the
   counter (Producer.produce_claimed). Before each ``__getitem__`` they seed ``random``,
   ``numpy.random`` and ``torch`` from (seed, epoch, index) (``_native.SampleFetcher``: adaptive,
   see bindings/seeding.cc). With the default collate and samples
   of one structure (checked in C++), leaf k of a chunk is written with one
   ``torch.stack(..., out=)`` into its rows of the shared buffer. Non-array leaves (numbers,
   strings, other objects) travel pickled, a column per leaf, and are collated by torch's
   ``default_collate`` in the consumer. Samples whose structure or shapes differ: the consumer
   collates the batch with ``default_collate``, values and errors as torch's.
   Without a buffer or a claim counter (a ``collate_fn``, ``batch_size=None``, IterableDataset,
   threads), the worker produces the whole batch: it collates, and every tensor/array of the
   result is copied into the shared buffer; the rest is pickled.
3. The answers carry the structure and the leaves' (offset, dtype, shape): the consumer wraps the
   buffer as tensors without a copy. The buffer returns to the pool when the last of those
   tensors dies. If no buffer is free (the consumer keeps many batches) or a batch does not fit
   in one, the arrays are pickled through the pipe instead (counted in stats).
"""

from __future__ import annotations

import collections.abc
import ctypes
import os
import pickle
import random
import signal
import struct
import sys
import traceback

import numpy as np
import torch
from torch.utils.data._utils import worker as _torch_worker
from torch.utils.data._utils.collate import default_collate

from . import _native

_ALIGN = 64
_torch_cpu_generator = torch.default_generator
_STOP = b""
_PR_SET_PDEATHSIG = 1


_TORCH_STATE_BYTES = 5056  # sizeof(CPUGeneratorImplState): what get_state()/set_state() carry


def _torch_state(key, words, left=1, next_word=0, double_normal=None, float_normal=None):
    """torch's CPU generator state, as get_state() gives it, with MT19937 ``words`` and seed
    ``key`` (the layout of ATen's CPUGeneratorImplState: seed, left, seeded, next, 624 words as
    uint64, the cached double normal, the cached float normal)."""
    b = bytearray(_TORCH_STATE_BYTES)
    struct.pack_into("<QiiQ", b, 0, key, left, 1, next_word)
    b[24:24 + 624 * 8] = np.asarray(words, "<u8").tobytes()
    if double_normal is not None:
        struct.pack_into("<d", b, 5024, double_normal)
        struct.pack_into("<i", b, 5040, 1)
    if float_normal is not None:
        struct.pack_into("<f?", b, 5048, float_normal, True)
    return torch.frombuffer(b, dtype=torch.uint8)


def _seed_slow(seed, epoch, index):
    key = _native.sample_seed(seed, epoch, index)
    random.setstate((3, tuple(_native.mt19937_state(key, "random")) + (624,), None))
    np.random.set_state(("MT19937", np.array(_native.mt19937_state(key, "numpy"), np.uint32),
                         624, 0, 0.0))
    _torch_cpu_generator.set_state(_torch_state(key, _native.mt19937_state(key, "torch")))


def _word_offset(blob, words, fmt):
    """Byte offset of the packed ``words`` in ``blob``, aligned to their size, or -1."""
    needle = struct.pack(f"{len(words)}{fmt}", *words)
    size = struct.calcsize(fmt)
    at = blob.find(needle)
    while at >= 0 and at % size:
        at = blob.find(needle, at + 1)
    return at


def _readable(address, size):
    """Whether [address, address + size) is readable memory of this process (a read through
    /proc/self/mem, which fails instead of faulting)."""
    try:
        fd = os.open("/proc/self/mem", os.O_RDONLY)
    except OSError:
        return False
    try:
        return len(os.pread(fd, size, address)) == size
    except (OSError, OverflowError, ValueError):
        return False
    finally:
        os.close(fd)


def _locate_torch_generator():
    """(engine, float-normal engaged flag, double-normal engaged flag) addresses of torch's
    default CPU generator (a CPUGeneratorImpl: an at::mt19937_data_pod, then two optional cached
    normals), found by giving it a marked state through set_state() and matching its memory.
    None when anything does not match."""
    gen = _torch_cpu_generator
    if type(gen).__basicsize__ < 24 or gen.get_state().numel() != _TORCH_STATE_BYTES:
        return None
    impl = ctypes.c_size_t.from_address(id(gen) + 16).value  # THPGenerator.cdata's impl pointer
    if not impl or not _readable(impl, 512 + 2544):
        return None
    marker = 0x5EED_C0DE_1234_5678
    words = _native.mt19937_state(marker, "torch")
    marked = _torch_state(marker, words, left=7, next_word=617, double_normal=-1.75,
                          float_normal=3.25)
    gen.set_state(marked)
    if gen.get_state().numpy().tobytes() != marked.numpy().tobytes():
        return None
    at = _word_offset(ctypes.string_at(impl, 512), [marker], "Q")
    if at < 0 or struct.unpack("<i?xxxI", ctypes.string_at(impl + at + 8, 12)) != (7, True, 617) \
            or ctypes.string_at(impl + at + 20, 624 * 4) != np.asarray(words, "<u4").tobytes():
        return None
    tail = ctypes.string_at(impl + at + 2516, 28)  # after the engine: the two optionals
    f = tail.find(struct.pack("<f?", 3.25, True))
    d = tail.find(struct.pack("<d?", -1.75, True))
    if f < 0 or d < 0 or (at + 2516 + f) % 4 or (at + 2516 + d) % 8:
        return None
    return impl + at, impl + at + 2516 + f + 4, impl + at + 2516 + d + 8


def _locate_global_rngs():
    """A native seeder writing straight into the state fields of ``random``'s, ``np.random``'s
    and torch's global MT19937 generators, found by matching their memory against
    getstate()/get_state(), and checked by seeding through them. None when anything does not
    match (another interpreter, NumPy or torch layout): seeding then goes through
    setstate()/set_state() with the same states."""
    saved = random.getstate(), np.random.get_state(), _torch_cpu_generator.get_state()
    try:
        inst = random._inst
        base = id(inst)
        random.seed(12345)
        random.random()
        words = random.getstate()[1]  # 624 state words, then the index
        blob = ctypes.string_at(base, type(inst).__basicsize__)
        at = _word_offset(blob, words[:624], "I")
        if at < 4 or struct.unpack_from("i", blob, at - 4)[0] != words[624]:
            return None
        py_state, py_index = base + at, base + at - 4

        rs = np.random.mtrand._rand
        bg = rs._bit_generator
        if type(bg).__name__ != "MT19937":
            return None
        state_addr = bg.ctypes.state_address
        np.random.seed(12345)
        np.random.standard_normal()  # draws two normals, caches one: has_gauss = 1
        _, keys, pos, has_gauss, gauss = rs.get_state(legacy=True)
        if ctypes.string_at(state_addr, 624 * 4) != keys.astype("<u4").tobytes() or \
                ctypes.c_int.from_address(state_addr + 624 * 4).value != pos or has_gauss != 1:
            return None
        rblob = ctypes.string_at(id(rs), type(rs).__basicsize__)
        bitgen = _word_offset(rblob, [state_addr], "Q")  # bitgen_t, whose first field is state
        aug = _word_offset(rblob, [id(rs) + bitgen], "Q") if bitgen >= 0 else -1
        if aug < 0 or struct.unpack_from("i", rblob, aug + 8)[0] != 1 or \
                struct.unpack_from("d", rblob, aug + 16)[0] != gauss:
            return None
        torch_fields = _locate_torch_generator()
        if torch_fields is None:
            return None
        seeder = _native.GlobalSeeder(
            py_index, py_state, inst, state_addr, state_addr + 624 * 4, id(rs) + aug + 8,
            id(rs) + aug + 16, *torch_fields)
        seeder.seed(1, 2, 3)
        key = _native.sample_seed(1, 2, 3)
        got_py, got_np = random.getstate(), rs.get_state(legacy=True)
        if list(got_py[1]) != _native.mt19937_state(key, "random") + [624] or \
                got_py[2] is not None or \
                got_np[1].tolist() != _native.mt19937_state(key, "numpy") or \
                got_np[2:] != (624, 0, 0.0) or \
                _torch_cpu_generator.get_state().numpy().tobytes() != \
                _torch_state(key, _native.mt19937_state(key, "torch")).numpy().tobytes():
            return None
        return seeder
    except Exception:
        return None
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        _torch_cpu_generator.set_state(saved[2])


_native_seeder = None  # a _native.GlobalSeeder, False where the fields could not be located


def _global_seeder():
    global _native_seeder
    if _native_seeder is None:
        _native_seeder = _locate_global_rngs() or False
    return _native_seeder or None


def sample_seeder():
    """The function ``(seed, epoch, index)`` that seeds ``random``, the legacy ``numpy.random``
    and torch's CPU generator for sample ``index`` of ``epoch``. From key = hash_key(seed, epoch,
    index): each gets the MT19937 state ``_native.mt19937_state(key, "random" / "numpy" /
    "torch")``, as their setstate()/set_state() with those words would give (torch's with
    initial_seed() = key and no cached normals). Native (~0.7 us) when the generators' fields
    could be located and checked, else through those calls (~90 us)."""
    native = _global_seeder()
    return native.seed if native is not None else _seed_slow


def sample_fetcher(seed, seed_samples, skip=False, size=0):
    """A ``_native.SampleFetcher``: ``fetch(dataset, epoch, indices)`` runs ``dataset[i]`` for
    chunks of indices (``skip``: on_error="skip", replacing failed samples from range(size)),
    seeded per
    sample as ``seed_samples`` says: True (adaptive: a generator the dataset does not draw from is
    checked instead of written, see bindings/seeding.cc), "always" or False."""
    mode = {True: "adaptive", "always": "always", False: "off"}[seed_samples]
    native = _global_seeder() if mode != "off" else None
    return _native.SampleFetcher(seed, mode, native, _seed_slow if native is None else None,
                                 skip, size)


def global_rng_states():
    """A snapshot of ``random``'s, ``np.random``'s and torch's CPU generator states (~1 us
    native, else through getstate()/get_state(), ~70 us): call the function returned to put
    them back."""
    native = _global_seeder()
    if native is not None:
        saved = native.save()
        return lambda: native.restore(saved)
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())

    def restore():
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
    return restore


# ---------------------------------------------------------------------------------------------
# Structures: a sample (or a collated batch) as a tree of containers with array and object leaves.
# Nodes: ("L", k, torch dtype, shape) tensor; ("A", k, numpy dtype str, shape) ndarray;
# ("O", k, type) anything else; ("M", type, keys, children) mapping; ("N", type, children)
# namedtuple; ("T", children) tuple; ("S", type, children) other list/sequence.


def flatten(obj, arrays, objects):
    if isinstance(obj, torch.Tensor) and obj.layout == torch.strided and not obj.is_nested:
        arrays.append(obj)
        return ("L", len(arrays) - 1, obj.dtype, tuple(obj.shape))
    if type(obj) is np.ndarray and obj.dtype.kind in "biufc" and obj.dtype.isnative:
        arrays.append(obj)
        return ("A", len(arrays) - 1, obj.dtype.str, obj.shape)
    if isinstance(obj, (str, bytes)):
        pass
    elif isinstance(obj, collections.abc.Mapping):
        keys = tuple(obj.keys())
        return ("M", type(obj), keys, tuple(flatten(obj[k], arrays, objects) for k in keys))
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return ("N", type(obj), tuple(flatten(v, arrays, objects) for v in obj))
    elif isinstance(obj, tuple):
        return ("T", tuple(flatten(v, arrays, objects) for v in obj))
    elif isinstance(obj, list):
        return ("S", type(obj), tuple(flatten(v, arrays, objects) for v in obj))
    objects.append(obj)
    return ("O", len(objects) - 1, type(obj))


def rebuild(node, arrays, objects, collated):
    """The structure with its leaves put back. ``collated``: as torch's default_collate shapes a
    batch of samples with this structure (tuples become lists); otherwise exactly as flattened."""
    tag = node[0]
    if tag in ("L", "A"):
        return arrays[node[1]]
    if tag == "O":
        return objects[node[1]]
    if tag == "M":
        _, kind, keys, children = node
        d = {k: rebuild(c, arrays, objects, collated) for k, c in zip(keys, children)}
        if kind is dict:
            return d
        try:
            return kind(d)
        except TypeError:
            return d
    if tag == "N":
        return node[1](*(rebuild(c, arrays, objects, collated) for c in node[2]))
    if tag == "T":
        items = [rebuild(c, arrays, objects, collated) for c in node[1]]
        return items if collated else tuple(items)
    kind, items = node[1], [rebuild(c, arrays, objects, collated) for c in node[2]]
    if kind is list:
        return items
    try:
        return kind(items)
    except TypeError:
        return items


_NP_TO_TORCH = {}
# Below this many elements torch.stack copies on the calling thread (at::internal::GRAIN_SIZE);
# above, the consumer stacks with NumPy so that torch's thread pool does not compete with the
# workers. torch.stack costs ~0.15 us a tensor, NumPy's ~1.2 us (each needs .numpy()).
_SERIAL_STACK_ELEMENTS = 32768
_NOT_IN_NUMPY = (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.complex32)


def torch_dtype(np_dtype_str):
    dt = _NP_TO_TORCH.get(np_dtype_str)
    if dt is None:
        dt = _NP_TO_TORCH[np_dtype_str] = torch.from_numpy(np.empty(0, np_dtype_str)).dtype
    return dt


def _nbytes(a):
    return a.element_size() * a.numel() if isinstance(a, torch.Tensor) else a.nbytes


def _aligned(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _columns(samples):
    """(structure of sample 0, its array leaves, array columns, object columns) of a batch, or
    None when a sample's structure or a leaf's type differs from sample 0's (checked in C++)."""
    arrays0, objects0 = [], []
    struct = flatten(samples[0], arrays0, objects0)
    got = _native.gather_columns(
        struct, samples, tuple(type(a) for a in arrays0), tuple(type(o) for o in objects0),
        tuple(None if isinstance(a, torch.Tensor) else a.dtype for a in arrays0))
    return None if got is None else (struct, arrays0, *got)


class Producer:
    """Produces batches in a worker (process or thread): fetch, seed, collate, publish."""

    def __init__(self, dataset, cfg, pool=None, arena=None, unmap=False):
        self.dataset = dataset
        self.cfg = cfg  # dict: seed, collate_fn (None = default), auto_batch, seed_samples
        self.pool = pool
        self.arena_t = arena
        self.arena_np = arena.numpy() if arena is not None else None
        self.unmap = unmap  # a worker process: drop its mapping of each buffer it wrote
        self.iterator = None
        self.iter_epoch = None
        self.fetcher = sample_fetcher(cfg["seed"], cfg["seed_samples"],
                                      cfg.get("on_error") == "skip", cfg.get("size", 0))

    # -- fetching ---------------------------------------------------------------------------

    def fetch(self, epoch, indices):
        """[dataset[i] for i in indices], seeded per sample; an exception carries the index of
        its sample as ``_stoker_index``."""
        return self.fetcher.fetch(self.dataset, epoch, indices)

    def take_skipped(self):
        """(index, "Type: message") of the samples replaced (on_error="skip") since the last
        call: they travel with the answer that produced them."""
        return self.fetcher.take_skipped()

    def fetch_iterable(self, epoch, count):
        """Up to ``count`` samples of this worker's copy of an IterableDataset; [] at its end."""
        if self.iter_epoch != epoch:
            self.iterator, self.iter_epoch = iter(self.dataset), epoch
        out = []
        for _ in range(count):
            try:
                out.append(next(self.iterator))
            except StopIteration:
                break
        return out

    # -- producing --------------------------------------------------------------------------

    def produce(self, task):
        """The answer to ``task``: ("batch", payload) or raises (index attached as ``_index``)."""
        _, epoch, indices, offset, capacity, counter = task
        if counter is not None:
            return ("batch", self.produce_claimed(epoch, indices, offset, capacity, counter))
        if isinstance(indices, int):  # iterable dataset: `indices` is the batch size
            samples = self.fetch_iterable(epoch, indices if self.cfg["auto_batch"] else 1)
            if not samples or (self.cfg["drop_last"] and len(samples) < indices):
                return ("end", None)
            if not self.cfg["auto_batch"]:
                return ("batch", self.publish_exact(self.collate(samples[0]), offset, capacity))
            return ("batch", self.publish_samples(samples, offset, capacity))
        samples = self.fetch(epoch, indices)
        if not self.cfg["auto_batch"]:
            return ("batch", self.publish_exact(self.collate(samples[0]), offset, capacity))
        return ("batch", self.publish_samples(samples, offset, capacity))

    def produce_claimed(self, epoch, indices, offset, capacity, counter, max_chunks=None,
                        chunk=None):
        """Samples of one batch that this process produces together with others: it claims
        chunks of the batch from the pool's shared ``counter`` until none is left, and writes
        their array leaves straight into their rows of the batch buffer (one stack per leaf and
        chunk); object leaves go back by chunk. The layout follows from the structure and the
        batch size alone, so every producer computes the same one. Returns ("claimed", struct,
        places, [(first row, rows, object columns)]): struct None when this process claimed
        nothing, False when samples differ in structure, leaf types or shapes, or do not fit (the
        consumer then collates the batch as default_collate does). ``max_chunks``: stop after
        claiming that many chunks. ``chunk``: samples a claim (default: 1/8 of the batch; any size
        gives the same bytes)."""
        n = len(indices)
        chunk = chunk or -(-n // 8)
        struct, places, parts = None, None, []
        mismatch = ("claimed", False, None, None)
        while max_chunks is None or len(parts) < max_chunks:
            j0 = self.pool.claim(counter, chunk)
            if j0 >= n:
                break
            rows = range(j0, min(n, j0 + chunk))
            samples = self.fetch(epoch, indices[j0:j0 + chunk])
            got = _columns(samples)
            if got is None:
                return mismatch
            s, arrays0, columns, ocolumns = got
            if struct is None:
                struct, places, pos = s, [], 0
                for a in arrays0:
                    places.append((pos, _nbytes(a)))
                    pos += _aligned(_nbytes(a) * n)
                if pos > capacity:
                    return mismatch
            elif s != struct:
                return mismatch
            for (pos, size), col, a in zip(places, columns, arrays0):
                start = offset + pos + j0 * size
                end = start + size * len(rows)
                try:
                    self._stack_into(col, a, start, end)
                except (RuntimeError, ValueError, TypeError):
                    return mismatch
                if self.unmap:  # a chunk's pages count in this process only while written
                    self.pool.unmap_pages(start, end - start)
            parts.append((j0, len(rows), ocolumns))
        if struct is not None and self.unmap:
            self.pool.unmap_pages(offset, places[-1][0] + places[-1][1] * n if places else 0)
        return ("claimed", struct, places, parts)

    def _stack_into(self, col, a, start, end):
        """Stacks column ``col`` (leaves like ``a``) into arena bytes [start, end)."""
        shape = (len(col), *a.shape)
        if isinstance(a, torch.Tensor) and (self.unmap or a.dtype in _NOT_IN_NUMPY or
                                            len(col) * a.numel() < _SERIAL_STACK_ELEMENTS):
            torch.stack(col, out=self.arena_t[start:end].view(a.dtype).view(shape))
        else:  # the consumer: NumPy stacks on this thread, torch would wake its thread pool
            if isinstance(a, torch.Tensor):
                col = [t.detach().numpy() for t in col]
            np.stack(col, out=self.arena_np[start:end].view(col[0].dtype).reshape(shape))

    def collate(self, x):
        return self.cfg["collate_fn"](x)

    def publish_samples(self, samples, offset, capacity):
        if self.cfg["collate_fn"] is None:
            fast = self.publish_fast(samples, offset, capacity)
            if fast is not None:
                return fast
            return self.publish_exact(default_collate(samples), offset, capacity)
        return self.publish_exact(self.collate(samples), offset, capacity)

    def publish_fast(self, samples, offset, capacity):
        got = _columns(samples)
        if got is None:
            return None  # the structure or a leaf's type differs: default_collate decides
        struct, arrays0, columns, ocolumns = got
        n = len(samples)
        sizes = [_nbytes(a) * n for a in arrays0]
        total = sum(_aligned(b) for b in sizes)
        leaves = []
        if self.arena_t is not None and offset is not None and total <= capacity:
            pos = 0
            for col, a, size in zip(columns, arrays0, sizes):
                start = offset + pos
                try:
                    self._stack_into(col, a, start, start + size)
                except (RuntimeError, ValueError, TypeError):
                    return None  # shapes differ: default_collate raises torch's own error
                dtype = a.dtype if isinstance(a, torch.Tensor) else torch_dtype(a.dtype.str)
                leaves.append(("shm", pos, size, dtype, (n, *a.shape), False))
                pos += _aligned(size)
            if self.unmap:
                self.pool.unmap_pages(offset, pos)
        else:
            leaves = [("col", col) for col in columns]  # collated by the consumer
        return ("fast", struct, leaves, ocolumns)

    def publish_exact(self, batch, offset, capacity):
        arrays, objects = [], []
        struct = flatten(batch, arrays, objects)
        sizes = [_nbytes(a) for a in arrays]
        total = sum(_aligned(b) for b in sizes)
        leaves = []
        if self.arena_t is not None and offset is not None and total <= capacity:
            pos = 0
            for a, size in zip(arrays, sizes):
                start = offset + pos
                if isinstance(a, torch.Tensor):
                    self.arena_t[start:start + size].view(a.dtype).view(a.shape).copy_(a)
                    leaves.append(("shm", pos, size, a.dtype, tuple(a.shape), False))
                else:
                    np.copyto(self.arena_np[start:start + size].view(a.dtype).reshape(a.shape), a)
                    leaves.append(("shm", pos, size, a.dtype.str, a.shape, True))
                pos += _aligned(size)
            if self.unmap:
                self.pool.unmap_pages(offset, pos)
        else:
            leaves = [("obj", a) for a in arrays]
        return ("exact", struct, leaves, objects)


def _leaf_arrays(payload, pool, lease):
    leaves = payload[2]
    shm = [leaf for leaf in leaves if leaf[0] == "shm"]
    views = pool.view(lease, [(leaf[1], leaf[2]) for leaf in shm], True) if shm else []
    arrays, it = [], iter(views)
    for leaf in leaves:
        if leaf[0] == "shm":
            v = next(it)
            _, _, _, dtype, shape, as_numpy = leaf
            arrays.append(v.numpy().view(dtype).reshape(shape) if as_numpy
                          else v.view(dtype).view(shape))
        elif leaf[0] == "col":
            arrays.append(default_collate(leaf[1]))
        else:
            arrays.append(leaf[1])
    return arrays


def _collate_column(col):
    """default_collate of a column of one object leaf. Python ints or floats (gather_columns
    checked that every sample's leaf has sample 0's exact type) go through NumPy: the same int64
    or float64 tensor as torch.tensor(col) gives, 5x faster. Anything else, and ints beyond
    int64 (torch's own overflow error), through default_collate."""
    kind = type(col[0])
    if kind is int or kind is float:
        try:
            return torch.from_numpy(np.array(col, np.int64 if kind is int else np.float64))
        except OverflowError:
            pass
    return default_collate(col)


def collate_samples(samples):
    """default_collate(samples), faster when the samples share one structure and leaf types
    (checked in C++): a torch.stack per array leaf, number columns through NumPy. Otherwise,
    or when shapes differ, default_collate itself decides: values and errors are torch's."""
    got = _columns(samples)
    if got is None:
        return default_collate(samples)
    struct, arrays0, columns, ocolumns = got
    try:
        arrays = [torch.stack(col) if isinstance(a, torch.Tensor) else
                  torch.from_numpy(np.stack(col)) for col, a in zip(columns, arrays0)]
    except (RuntimeError, ValueError, TypeError):
        return default_collate(samples)
    return rebuild(struct, arrays, [_collate_column(col) for col in ocolumns], collated=True)


def assemble(payload, pool, lease):
    """The consumer's half: the batch as tensors viewing the shared buffer (no copy)."""
    mode, struct, _, objects = payload
    arrays = _leaf_arrays(payload, pool, lease)
    if mode == "fast":
        objects = [_collate_column(col) for col in objects]
    return rebuild(struct, arrays, objects, collated=(mode == "fast"))


def _leaf_specs(node, out):
    """{array leaf k: (torch dtype, shape)} of a flatten structure."""
    tag = node[0]
    if tag == "L":
        out[node[1]] = (node[2], node[3])
    elif tag == "A":
        out[node[1]] = (torch_dtype(node[2]), node[3])
    elif tag in ("M", "N", "S", "T"):
        for child in node[-1]:
            _leaf_specs(child, out)
    return out


def merge_claimed(payloads, n):
    """The producers' answers to one claimed batch (Producer.produce_claimed) as one "fast"
    payload over the common buffer, or None when they disagree (the consumer collates)."""
    got = [p for p in payloads if p[1] is not None]
    if not got or any(p[1] is False for p in got):
        return None
    struct, places = got[0][1], got[0][2]
    if any(p[1] != struct or p[2] != places for p in got):
        return None
    parts = sorted((part for p in got for part in p[3]), key=lambda part: part[0])
    row = 0
    for j0, rows, _ in parts:
        if j0 != row:
            return None
        row += rows
    if row != n:
        return None
    specs = _leaf_specs(struct, {})
    leaves = [("shm", pos, size * n, specs[k][0], (n, *specs[k][1]), False)
              for k, (pos, size) in enumerate(places)]
    columns = [[x for _, _, cols in parts for x in cols[k]] for k in range(len(parts[0][2]))]
    return ("fast", struct, leaves, columns)


# ---------------------------------------------------------------------------------------------
# Errors


def pack_error(exc, worker_id):
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:
        blob = None
    return (getattr(exc, "_stoker_index", None), type(exc).__module__, type(exc).__qualname__,
            str(exc), tb, blob, worker_id, os.getpid())


# ---------------------------------------------------------------------------------------------
# The worker process


def _die_with_parent(parent):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def worker_main(worker_id, num_workers, dataset, cfg, pool, arena, task_conn, result_conn,
                parent, close_fds):
    """Runs in the forked child; never returns."""
    code = 0
    try:
        _die_with_parent(parent)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the consumer decides; it stops us
        for fd in close_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        torch.set_num_threads(1)
        wseed = _native.sample_seed(cfg["seed"], 2**63 + worker_id, cfg["base_epoch"])
        _torch_worker._worker_info = _torch_worker.WorkerInfo(
            id=worker_id, num_workers=num_workers, seed=wseed, dataset=dataset)
        random.seed(wseed)
        np.random.seed(wseed & 0xFFFFFFFF)
        torch.manual_seed(wseed)
        producer = Producer(dataset, cfg, pool, arena, unmap=True)
        try:
            if cfg["worker_init_fn"] is not None:
                cfg["worker_init_fn"](worker_id)
        except BaseException as e:
            result_conn.send_bytes(pickle.dumps((-1, "error", pack_error(e, worker_id), []), 5))
            raise SystemExit(1)
        while True:
            raw = task_conn.recv_bytes()
            if raw == _STOP:
                break
            task = pickle.loads(raw)
            try:
                tag, payload = producer.produce(task)
                msg = (task[0], tag, payload, producer.take_skipped())
            except Exception as e:
                msg = (task[0], "error", pack_error(e, worker_id), producer.take_skipped())
            result_conn.send_bytes(pickle.dumps(msg, 5))
    except (EOFError, OSError, KeyboardInterrupt, SystemExit):
        code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
