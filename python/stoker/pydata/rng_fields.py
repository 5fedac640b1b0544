"""Where the interpreter's three global generators keep their states, for per-sample seeding.

This module and stoker/pydata/global_seeder.h are the only code that touches other libraries'
private memory. ``locate()`` finds the fields listed below in this process by giving each generator
a known state through its public calls and matching the generator's memory; it then seeds through
the fields and checks every generator against its public getstate()/get_state(). When anything
does not match (another interpreter, NumPy or torch layout) it returns None, and seeding goes
through the public setstate()/set_state() calls instead (seeding.py), with the same states.

Layouts relied on (each located and verified here, never assumed):
- ``random``: CPython's RandomObject (Modules/_randommodule.c): ``int index; uint32_t state[624]``
  inside the instance; the cached ``gauss_next`` in the instance's ``__dict__``.
- ``numpy.random`` (legacy, RandomState over MT19937): ``uint32_t key[624]; int pos`` at the bit
  generator's ``ctypes.state_address``; the RandomState's aug_bitgen_t
  ``bitgen_t* bit_generator; int has_gauss; double gauss``.
- torch's default CPU generator (CPUGeneratorImpl, reached through the THPGenerator object's
  impl pointer): at::mt19937_data_pod ``uint64 seed; int left; bool seeded; uint32 next;
  uint32 state[624]``, then ``std::optional<float>`` and ``std::optional<double>`` cached normals.
  Its get_state() blob (``torch_state``) is CPUGeneratorImplState: the same fields, the state as
  624 uint64, then the cached normals.

Why (bench/seed_cost.py, docs/python-datasets.md): the public calls cost ~120x the in-place
writer (~230 against ~1.9 us a sample on the busy 2-core machine), and the adaptive fetcher costs
what no seeding costs for a dataset that draws from no generator.
"""

from __future__ import annotations

import ctypes
import os
import random
import struct

import numpy as np
import torch

from .. import _native

TORCH_STATE_BYTES = 5056  # sizeof(CPUGeneratorImplState): what get_state()/set_state() carry


def torch_state(key, words, left=1, next_word=0, double_normal=None, float_normal=None):
    """torch's CPU generator state as get_state() gives it, with MT19937 ``words`` and initial
    seed ``key`` (CPUGeneratorImplState: seed, left, seeded, next, 624 words as uint64, the cached
    double normal, the cached float normal)."""
    b = bytearray(TORCH_STATE_BYTES)
    struct.pack_into("<QiiQ", b, 0, key, left, 1, next_word)
    b[24:24 + 624 * 8] = np.asarray(words, "<u8").tobytes()
    if double_normal is not None:
        struct.pack_into("<d", b, 5024, double_normal)
        struct.pack_into("<i", b, 5040, 1)
    if float_normal is not None:
        struct.pack_into("<f?", b, 5048, float_normal, True)
    return torch.frombuffer(b, dtype=torch.uint8)


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
    /proc/self/mem fails instead of faulting)."""
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


def _torch_fields():
    """(engine, float-normal engaged flag, double-normal engaged flag) addresses of torch's
    default CPU generator, found through a marked state given by set_state(); None when anything
    does not match."""
    gen = torch.default_generator
    if type(gen).__basicsize__ < 24 or gen.get_state().numel() != TORCH_STATE_BYTES:
        return None
    impl = ctypes.c_size_t.from_address(id(gen) + 16).value  # THPGenerator.cdata's impl pointer
    if not impl or not _readable(impl, 512 + 2544):
        return None
    marker = 0x5EED_C0DE_1234_5678
    words = _native.pydata.mt19937_state(marker, "torch")
    marked = torch_state(marker, words, left=7, next_word=617, double_normal=-1.75,
                         float_normal=3.25)
    gen.set_state(marked)
    if gen.get_state().numpy().tobytes() != marked.numpy().tobytes():
        return None
    at = _word_offset(ctypes.string_at(impl, 512), [marker], "Q")
    if at < 0 or struct.unpack("<i?xxxI", ctypes.string_at(impl + at + 8, 12)) != (7, True, 617) \
            or ctypes.string_at(impl + at + 20, 624 * 4) != np.asarray(words, "<u4").tobytes():
        return None
    tail = ctypes.string_at(impl + at + 2520, 24)  # after the engine: the two optionals
    f = tail.find(struct.pack("<f?", 3.25, True))
    d = tail.find(struct.pack("<d?", -1.75, True))
    if f < 0 or d < 0 or (at + 2520 + f) % 4 or (at + 2520 + d) % 8:
        return None
    return impl + at, impl + at + 2520 + f + 4, impl + at + 2520 + d + 8


def _verify(seeder):
    """Whether seeding through ``seeder`` gives each generator exactly the documented state."""
    key = _native.pydata.sample_key(1, 2, 3)
    seeder.seed(key, ["random", "numpy", "torch"])
    py, nps = random.getstate(), np.random.mtrand._rand.get_state(legacy=True)
    return (list(py[1]) == _native.pydata.mt19937_state(key, "random") + [624] and py[2] is None
            and nps[1].tolist() == _native.pydata.mt19937_state(key, "numpy")
            and nps[2:] == (624, 0, 0.0)
            and torch.default_generator.get_state().numpy().tobytes()
            == torch_state(key, _native.pydata.mt19937_state(key, "torch")).numpy().tobytes())


def locate():
    """A ``_native.pydata.GlobalSeeder`` writing the three generators' fields, or None where they
    cannot be located and verified. The generators' states are put back afterwards."""
    saved = random.getstate(), np.random.get_state(), torch.default_generator.get_state()
    try:
        inst = random._inst
        random.seed(12345)
        random.random()
        words = random.getstate()[1]  # 624 state words, then the index
        blob = ctypes.string_at(id(inst), type(inst).__basicsize__)
        at = _word_offset(blob, words[:624], "I")
        if at < 4 or struct.unpack_from("i", blob, at - 4)[0] != words[624]:
            return None

        rs = np.random.mtrand._rand
        bg = rs._bit_generator
        if type(bg).__name__ != "MT19937":
            return None
        state = bg.ctypes.state_address
        np.random.seed(12345)
        np.random.standard_normal()  # draws two normals, caches one: has_gauss = 1
        _, keys, pos, has_gauss, gauss = rs.get_state(legacy=True)
        if ctypes.string_at(state, 624 * 4) != keys.astype("<u4").tobytes() or \
                ctypes.c_int.from_address(state + 624 * 4).value != pos or has_gauss != 1:
            return None
        rblob = ctypes.string_at(id(rs), type(rs).__basicsize__)
        bitgen = _word_offset(rblob, [state], "Q")  # bitgen_t, whose first field is state
        aug = _word_offset(rblob, [id(rs) + bitgen], "Q") if bitgen >= 0 else -1
        if aug < 0 or struct.unpack_from("i", rblob, aug + 8)[0] != 1 or \
                struct.unpack_from("d", rblob, aug + 16)[0] != gauss:
            return None

        torch_fields = _torch_fields()
        if torch_fields is None:
            return None
        seeder = _native.pydata.GlobalSeeder(
            id(inst) + at - 4, id(inst) + at, inst.__dict__, state, state + 624 * 4,
            id(rs) + aug + 8, id(rs) + aug + 16, *torch_fields)
        return seeder if _verify(seeder) else None
    except Exception:
        return None
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.default_generator.set_state(saved[2])
