"""torchdata's StatefulDataLoader contract, for Python datasets (what Lightning, Accelerate and
torchtitan build on): a dataset's and a sampler's own state_dict are saved and restored, stateful
samplers resume in any epoch, IterableDatasets resume mid-epoch (through their state, else by
replay), and, beyond the peers, a state resumes on another number of workers.

Every check compares a resumed run with an uninterrupted one, sample for sample."""

import io

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset
from torchdata.stateful_dataloader.sampler import RandomSampler, StatefulDistributedSampler

import stoker

N, BATCH = 30, 4


class Items(Dataset):
    """Samples are their ids; a ``level`` (a curriculum, say) the dataset's own state holds."""

    def __init__(self, n=N):
        self.n, self.level = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i, self.level])

    def state_dict(self):
        return {"level": self.level}

    def load_state_dict(self, state):
        self.level = state["level"]


def ids(batch):
    return batch[:, 0].tolist()


def run(make, epochs, stop=None):
    """Batches (as id lists) of ``epochs`` epochs; with ``stop=(epoch, batch)``, also the state
    taken after that many batches of that epoch, and the batches after it."""
    loader = make()
    out, state = [], None
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for b, batch in enumerate(loader):
            out.append(ids(batch))
            if stop == (epoch, b + 1):
                state = saved(loader.state_dict())
                mark = len(out)
    return out, (state, mark) if stop else None


def saved(state):
    """``state`` through a checkpoint file (torch.save, as trainers write it: a torch sampler's
    state holds its generator's state, a tensor)."""
    f = io.BytesIO()
    torch.save(state, f)
    f.seek(0)
    return torch.load(f)


def resume(make, epochs, state, start_epoch):
    loader = make()
    loader.load_state_dict(state)
    out = []
    for epoch in range(start_epoch, epochs):
        loader.set_epoch(epoch)
        out += [ids(b) for b in loader]
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_datasets_own_state_is_saved_and_restored(workers):
    data = Items()
    loader = stoker.DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=workers)
    it = iter(loader)
    next(it)
    data.level = 3  # the curriculum moved on
    state = loader.state_dict()
    assert state["dataset_state"] == {"level": 3}
    fresh = Items()
    again = stoker.DataLoader(fresh, batch_size=BATCH, shuffle=True, num_workers=workers)
    again.load_state_dict(state)
    assert fresh.level == 3
    assert all(b[:, 1].eq(3).all() for b in again)  # workers started after the restore


def torchdata_random(generator_seed):
    def make_sampler(data):
        return RandomSampler(data, generator=torch.Generator().manual_seed(generator_seed))
    return make_sampler


def distributed(data):
    return StatefulDistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=5)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("make_sampler", [torchdata_random(11), distributed],
                         ids=["torchdata-RandomSampler", "StatefulDistributedSampler"])
@pytest.mark.parametrize("stop", [(1, 3), (0, 8)], ids=["epoch-1-mid", "epoch-0-end"])
def test_a_stateful_sampler_resumes_in_any_epoch(workers, make_sampler, stop):
    """Its state as of the last batch delivered (workers fetch ahead of it), in the second
    epoch too, and at an epoch's end (the next epoch follows it)."""
    def make():
        data = Items()
        sampler = make_sampler(data)
        loader = stoker.DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=workers,
                                   prefetch_factor=2 if workers else None)
        if isinstance(sampler, StatefulDistributedSampler):
            real = loader.set_epoch  # a torch loop calls the sampler's set_epoch too
            loader.set_epoch = lambda e: (sampler.set_epoch(e), real(e))
        return loader
    whole, (state, mark) = run(make, 3, stop=stop)
    assert sorted(sum(whole[:8], [])) == list(range(N))  # an epoch: every sample once
    assert "sampler_state" in state
    start_epoch = stop[0] + (stop[1] == 8)
    assert resume(make, 3, state, start_epoch) == whole[mark:]


@pytest.mark.parametrize("saved_workers, loaded_workers", [(0, 2), (2, 0)])
def test_a_state_resumes_on_another_number_of_workers(saved_workers, loaded_workers):
    def make(workers):
        return lambda: stoker.DataLoader(Items(), batch_size=BATCH, shuffle=True, seed=4,
                                         num_workers=workers)
    whole, (state, mark) = run(make(saved_workers), 2, stop=(1, 2))
    assert resume(make(loaded_workers), 2, state, 1) == whole[mark:]


class Stream(IterableDataset):
    """0..n-1 in order; with ``stateful``, its position is its state (torchdata's contract: it
    goes on from a loaded position)."""

    def __init__(self, n=N, stateful=True):
        self.n, self.pos, self.reads = n, 0, 0
        if not stateful:
            self.state_dict = None

    def __iter__(self):
        while self.pos < self.n:
            self.pos += 1
            self.reads += 1
            yield torch.tensor([self.pos - 1, 0])
        self.pos = 0

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


@pytest.mark.parametrize("stateful, workers", [(True, 0), (False, 0), (True, 1)])
def test_an_iterable_dataset_resumes_mid_epoch(stateful, workers):
    """Through its state where it ran in this process; else by replaying the stream (its first
    batches read again and dropped, counted in stats()["replayed_batches"])."""
    def make():
        return stoker.DataLoader(Stream(stateful=stateful), batch_size=BATCH,
                                 num_workers=workers)
    whole, (state, mark) = run(make, 2, stop=(1, 3))
    by_state = stateful and workers == 0
    assert state["stream"] == ("state" if by_state else "replay")
    loader = make()
    loader.load_state_dict(state)
    loader.set_epoch(1)
    rest = [ids(b) for b in loader]
    loader.set_epoch(2)
    assert rest == whole[mark:]
    assert loader.stats().get("replayed_batches", 0) == (0 if by_state else 3)
    if by_state:
        assert loader.dataset.reads == N - 3 * BATCH  # nothing read twice
