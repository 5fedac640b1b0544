"""Hugging Face ``Trainer`` (and the trainers built on it, TRL's ``SFTTrainer`` included) reading
through ``stoker.DataLoader``, and resuming exactly where a checkpoint stopped::

    from stoker.integrations.transformers import StokerTrainer, StokerTrainerMixin

    trainer = StokerTrainer(model=model, args=args, train_dataset=stoker.TokenDataset(...))
    class MySFTTrainer(StokerTrainerMixin, trl.SFTTrainer): ...   # the mixin first

The loaders (``stoker_options`` says it in code, and is the place to change it):

- ``train_dataset``, ``eval_dataset`` (a dict of them too) and ``predict``'s dataset: a Stoker
  dataset, read by the engine (its batches are made by it: Trainer's data collator is not used),
  or any Python dataset (map-style, or an IterableDataset), read in worker processes with
  Trainer's data collator as ``collate_fn``, less the columns the model does not take (Trainer's
  own helpers: a ``datasets.Dataset`` loses them, any other's collator drops them).
- batch_size: Trainer's (``per_device_train_batch_size``, ``per_device_eval_batch_size``, times
  the GPUs of DataParallel); shuffle for training (``train_sampling_strategy="sequential"``:
  not; ``"group_by_length"`` and ``"batch_rebalance"`` raise: Stoker does not group by length),
  never for eval and predict; seed: ``data_seed``, else ``seed``; drop_last:
  ``dataloader_drop_last``; num_workers: ``dataloader_num_workers`` unless 0 (its default), then
  "auto" (threads of the engine, or worker processes); prefetch_factor likewise;
  ``dataloader_pin_memory=False`` turns pinning off; ``dataloader_persistent_workers`` and
  ``dataloader_multiprocessing_context`` for Python datasets. Trainer's ``worker_init_fn`` is not
  passed: Stoker seeds every sample itself, whatever worker reads it.
- Every process reads its share of each epoch (Stoker's rank and world size: torchrun's). Tensor,
  context or sequence parallelism (ranks that share a batch) and accelerate's ``split_batches``
  raise. Distributed evaluation pads the last batches as Stoker does (metrics then count the few
  repeated samples: accelerate's ``gather_for_metrics`` knows only its own loaders' padding).

Batches reach the model as ``model(**batch)``, so every batch is a dict, keyed by the names
the dataset declares for its fields (sources/base.py ``_batch_names``):

- ``TableDataset``, ``LeRobotDataset`` and ``TokenDataset(pack="document"/"best_fit")`` yield
  dicts already;
- ``ArrayDataset``: keyed by its names (``ArrayDataset(ids, mask, names=["input_ids",
  "attention_mask"])``). One without names raises ValueError when the loader is made: a tuple
  cannot be passed as keywords (Trainer itself fails at the first step, "argument after ** must
  be a mapping"), and names guessed from positions would feed a tensor to the wrong argument;
- ``ImageFolder``, ``TarShards``, ``TableDataset(image=...)``, ``VideoDataset``:
  ``pixel_values`` and ``labels`` (transformers' vision and video models' names; a video's
  ``timestamps`` too where it has them); ``TokenDataset(pack="concat")``: ``input_ids`` and
  ``labels``; a ``Mixture``: its first source's.

A TokenDataset's labels are the next tokens already (``labels[t]`` is position t's target),
while transformers' causal-LM losses shift ``labels`` once more. Its batches therefore also carry
``shift_labels`` (the same tensor), which those losses take as the targets as they are (and from
which Trainer counts ``num_items_in_batch``), when the model's forward takes ``**kwargs``; a
model without them gets the labels as they are (nanoGPT's convention). ``label_smoothing_factor``,
which shifts labels again, raises with a TokenDataset.

Packs (``TokenDataset(pack="document"/"best_fit")``, ``TextDataset(pack=...)``,
``VLMDataset(pack="best_fit")``) carry ``position_ids`` that restart at each sequence and no
``attention_mask``: transformers then masks the sequences apart (eager and SDPA attention;
flash attention reads the same positions), but only when the forward has no cache, and a model
in training makes one whenever its config's ``use_cache`` is on (the default). Their batches
therefore also carry ``use_cache=False`` when the forward takes it; without it each sequence
of a pack would attend to the ones before it. With ``remove_unused_columns`` (Trainer's
default) the keys that the model's forward does not name are dropped, as Trainer drops them from
any dataset (``shift_labels`` kept for a forward with ``**kwargs``).

Resume. Every checkpoint folder holds ``stoker_loader.json``, the train loader's
``state_dict()`` (written by the saving process before Trainer's own files, so that a checkpoint
with ``trainer_state.json`` has it); ``train(resume_from_checkpoint=...)`` loads it and the
loader continues from the next batch, whatever its num_workers, and on another world size
(Stoker's elastic resume). The loader's state is authoritative: Trainer's epoch loop starts at
the loader's epoch (not at ``global_step // steps per epoch``, which differs on another world
size), the resumed epoch runs over the batches the loader has left with Trainer's
gradient-accumulation arithmetic, and ``state.epoch`` counts the batches before the resume as an
uninterrupted run does. Accelerate's ``skip_first_batches`` (which would rebuild the loader as a
torch DataLoader and read the skipped batches) is never reached. ``ignore_data_skip=True``: the
state is not loaded, the loader starts Trainer's epoch from its beginning. A checkpoint without
the file raises FileNotFoundError (``ignore_data_skip=True`` starts that epoch over).
``auto_find_batch_size`` cannot resume a state after it lowered the batch size (a state resumes
only with its batch size: ValueError).

Trainer methods overridden, all private (there is no public hook for the epoch loop): they are
checked when this module is imported, which raises ImportError on a transformers whose Trainer
changed them. ``_get_dataloader`` (the one place train, eval and predict loaders are made),
``_init_training_state`` (loads the state, starts the epoch loop at its epoch),
``_run_epoch`` (the resumed epoch's batch counts) and ``_save_checkpoint`` (writes the state).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
from collections.abc import Mapping

import torch
import transformers
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..loader import DataLoader
from ..sources.base import StokerDataset, is_native

STATE_FILE = "stoker_loader.json"

logger = logging.getLogger(__name__)

# The private Trainer methods this module overrides or calls, with the parameters it passes.
_TRAINER_METHODS = {
    "_get_dataloader": ("dataset", "description", "batch_size", "is_training", "dataloader_key"),
    "_init_training_state": ("max_steps", "num_update_steps_per_epoch", "num_train_epochs",
                             "resume_from_checkpoint", "trial"),
    "_run_epoch": ("epoch", "train_dataloader", "steps_in_epoch", "num_update_steps_per_epoch",
                   "epochs_trained", "steps_trained_in_current_epoch"),
    "_save_checkpoint": ("model", "trial"),
    "_get_output_dir": ("trial",),
    "_remove_unused_columns": ("dataset", "description"),
    "_get_collator_with_removed_columns": ("data_collator", "description"),
    "_set_signature_columns_if_needed": (),
}


def _check_trainer():
    changed = []
    for name, params in _TRAINER_METHODS.items():
        method = getattr(Trainer, name, None)
        if method is None or not set(params) <= set(inspect.signature(method).parameters):
            changed.append(f"{name}({', '.join(params)})")
    if changed:
        raise ImportError(f"stoker.integrations.transformers overrides Trainer methods that "
                          f"transformers {transformers.__version__} does not have as expected: "
                          f"{'; '.join(changed)}")


_check_trainer()


class StokerTrainerMixin:
    """Makes a ``transformers.Trainer`` subclass read through ``stoker.DataLoader`` and resume its
    data exactly (module docstring). List it before the trainer:
    ``class MyTrainer(StokerTrainerMixin, SFTTrainer)``."""

    _stoker_train_loader = None  # the loader of the running train()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        mro = cls.__mro__
        if Trainer in mro and mro.index(Trainer) < mro.index(StokerTrainerMixin):
            # Trainer's methods would come first: the mixin would change nothing, silently
            raise TypeError(f"{cls.__name__}: StokerTrainerMixin goes before the Trainer class "
                            f"it changes, as in class {cls.__name__}(StokerTrainerMixin, "
                            f"{mro[1].__name__})")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stoker_epoch = _EpochCount()
        self.add_callback(self._stoker_epoch)

    def stoker_options(self, dataset, batch_size, is_training):
        """The ``stoker.DataLoader`` keywords for ``dataset`` (not ``collate_fn``). Override to
        change or add options (``memory_budget``, ``device``...): call this and update the
        dict."""
        args = self.args
        options = {
            "batch_size": batch_size,
            "shuffle": self._stoker_shuffle(dataset, is_training),
            "seed": args.data_seed if args.data_seed is not None else args.seed,
            "drop_last": args.dataloader_drop_last,
            "num_workers": args.dataloader_num_workers or "auto",
            "pin_memory": "auto" if args.dataloader_pin_memory else False,
        }
        if args.dataloader_prefetch_factor is not None:
            options["prefetch_factor"] = args.dataloader_prefetch_factor
        if not is_native(dataset):  # read in worker processes: torch's keywords
            if args.dataloader_persistent_workers:
                options["persistent_workers"] = True
            if args.dataloader_multiprocessing_context is not None:
                options["multiprocessing_context"] = args.dataloader_multiprocessing_context
        return options

    def _stoker_shuffle(self, dataset, is_training):
        if isinstance(dataset, torch.utils.data.IterableDataset):
            return None  # the dataset's own order
        if not is_training:
            return False
        strategy = getattr(self.args, "train_sampling_strategy", "random")
        if strategy not in ("random", "sequential"):
            raise ValueError(f"train_sampling_strategy={strategy!r}: Stoker does not group "
                             f"samples by length; use \"random\" or \"sequential\"")
        return strategy == "random"

    def _get_dataloader(self, dataset, description, batch_size, sampler_fn=None,
                        is_training=False, dataloader_key=None):
        self._check_data_parallel()
        options = self.stoker_options(dataset, batch_size, is_training)
        if isinstance(dataset, StokerDataset):
            loader = _ModelInputLoader(dataset, self._model_inputs(dataset), **options)
        else:
            hf = sys.modules.get("datasets")
            if hf is not None and isinstance(dataset, hf.Dataset):
                dataset = self._remove_unused_columns(dataset, description=description)
                collate = self.data_collator
            else:
                collate = self._get_collator_with_removed_columns(self.data_collator,
                                                                  description=description)
            loader = DataLoader(dataset, collate_fn=collate, **options)
        if is_training:
            self._stoker_train_loader = loader
        if dataloader_key is not None and self.args.dataloader_persistent_workers:
            if not hasattr(self, "_eval_dataloaders"):  # Trainer's cache of eval loaders
                self._eval_dataloaders = {}
            self._eval_dataloaders[dataloader_key] = loader
        return loader

    def _check_data_parallel(self):
        shared = 1
        for name in ("get_tp_size", "get_cp_size", "get_sp_size"):
            size = getattr(self, name, None)
            shared *= size() if size is not None else 1
        if shared > 1:
            raise NotImplementedError("StokerTrainer gives every process its own share of the "
                                      "data; with tensor, context or sequence parallelism ranks "
                                      "share batches, which it does not arrange")
        if getattr(self.accelerator, "split_batches", False):
            raise ValueError("StokerTrainer: accelerate's split_batches is not supported; every "
                             "process reads per_device_train_batch_size samples a batch")

    def _model_inputs(self, dataset):
        """The _ModelInputs that turns ``dataset``'s batches into the model's keywords."""
        names = dataset._batch_names()  # the model's keywords, in the batch's order
        tokens = dataset._labels_are_next_tokens
        if tokens and self.args.label_smoothing_factor:
            raise ValueError(f"label_smoothing_factor shifts labels by one, and a "
                             f"{type(dataset).__name__}'s labels are the next tokens already")
        shift = tokens and self._forward_takes("shift_labels")
        keep = None
        if self.args.remove_unused_columns:
            self._set_signature_columns_if_needed()
            keep = set(self._signature_columns) | ({"shift_labels"} if shift else set())
        return _ModelInputs(type(dataset).__name__, names, shift, keep,
                            self._forward_takes("use_cache"))

    def _forward_takes(self, name):
        """Whether the model's forward takes the keyword ``name`` (by name or ``**kwargs``)."""
        model = self.model
        if hasattr(model, "get_base_model"):  # a PEFT model: its base model's forward
            model = model.get_base_model()
        params = inspect.signature(model.forward).parameters.values()
        return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs,
                             resume_from_checkpoint, trial):
        epochs_trained, steps_trained = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint,
            trial)
        loader = self._stoker_train_loader
        if loader is None or resume_from_checkpoint is None or self.args.ignore_data_skip:
            return epochs_trained, steps_trained
        path = os.path.join(resume_from_checkpoint, STATE_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{resume_from_checkpoint} has no {STATE_FILE} (saved without Stoker?): the data "
                f"position cannot be resumed; ignore_data_skip=True starts epoch "
                f"{epochs_trained} over")
        with open(path) as f:
            loader.load_state_dict(json.load(f))
        epoch = loader.state_dict()["epoch"]
        if _batches_left(loader) == 0:  # a state at the very end of its epoch
            epoch += 1
            loader.set_epoch(epoch)
        return epoch, 0

    def _run_epoch(self, *args, **kwargs):
        call = inspect.signature(super()._run_epoch).bind(*args, **kwargs)
        a = call.arguments
        loader = a["train_dataloader"]
        self._stoker_epoch.begin(a["epoch"])
        if loader is None or loader is not self._stoker_train_loader:
            return super()._run_epoch(**a)
        # Trainer skips batches with accelerate's skip_first_batches when it counts some trained
        # in this epoch: the loader is positioned already, so it counts none, and runs the epoch
        # over the batches the loader has left.
        a["steps_trained_in_current_epoch"] = 0
        loader.set_epoch(a["epoch"])  # keeps a loaded position inside this epoch
        left, total = _batches_left(loader), a["steps_in_epoch"]
        if left is not None and left != total:
            gas = self.args.gradient_accumulation_steps
            a["steps_in_epoch"] = left
            a["num_update_steps_per_epoch"] = -(-left // gas)
            self._stoker_epoch.begin(a["epoch"], before=max(total - left, 0), left=left,
                                     total=total)
        return super()._run_epoch(**a)

    def _save_checkpoint(self, model, trial):
        loader = self._stoker_train_loader
        if loader is not None and self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial),
                                  f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            _write_json(os.path.join(folder, STATE_FILE), loader.state_dict())
        super()._save_checkpoint(model, trial)


class StokerTrainer(StokerTrainerMixin, Trainer):
    """``transformers.Trainer`` reading through ``stoker.DataLoader`` (module docstring)."""


class _ModelInputLoader(DataLoader):
    """A ``stoker.DataLoader`` of a Stoker dataset whose batches are made model keywords."""

    def __init__(self, dataset, inputs, **options):
        super().__init__(dataset, **options)
        self._inputs = inputs

    def __iter__(self):
        return map(self._inputs, super().__iter__())


class _ModelInputs:
    """A batch as the dict ``model(**batch)`` takes: a tuple batch zipped with ``names``,
    ``shift_labels`` added (a TokenDataset's labels, already the next tokens), the keys outside
    ``keep`` dropped (None: none), and ``use_cache=False`` for packs (``no_cache``: the model
    takes it)."""

    def __init__(self, dataset_name, names, shift_labels, keep, no_cache=False):
        self.dataset_name = dataset_name
        self.names = names
        self.shift_labels = shift_labels
        self.keep = keep
        self.no_cache = no_cache
        self._told = False

    def __call__(self, batch):
        if isinstance(batch, Mapping):
            inputs = dict(batch)
        else:
            fields = batch if isinstance(batch, tuple) else (batch,)
            if len(fields) != len(self.names):
                raise TypeError(f"{self.dataset_name} yields batches of {len(fields)} fields, "
                                f"named {list(self.names)}: model(**batch) needs every field "
                                f"named")
            inputs = dict(zip(self.names, fields))
        if self.shift_labels and "labels" in inputs:
            inputs["shift_labels"] = inputs["labels"]
        if self.keep is not None:
            dropped = [k for k in inputs if k not in self.keep]
            if dropped and not self._told:
                logger.info("%s: the model's forward does not take %s; dropped "
                            "(remove_unused_columns)", self.dataset_name, ", ".join(dropped))
                self._told = True
            for k in dropped:
                del inputs[k]
        if self.no_cache and "position_ids" in inputs and "attention_mask" not in inputs:
            # transformers masks packed sequences apart (from where position_ids restart) only
            # when the forward has no cache, and a model in training makes one when its
            # config's use_cache is on (the default): each sequence would see the ones before
            inputs["use_cache"] = False
        return inputs


class _EpochCount(TrainerCallback):
    """Trainer sets ``state.epoch`` from the batches of the running ``_run_epoch``, which in an
    epoch resumed mid-way are the rest of it only: this adds back the ``before`` batches, so that
    state.epoch (logs, trainer_state.json) reads as in an uninterrupted run."""

    def __init__(self):
        self.begin(0)

    def begin(self, epoch, before=0, left=1, total=1):
        self.epoch, self.before, self.left, self.total = epoch, before, left, total

    def on_step_end(self, args, state, control, **kwargs):
        if self.before:
            done = round((state.epoch - self.epoch) * self.left)  # Trainer's (step + 1)
            state.epoch = self.epoch + (self.before + done) / self.total


def _batches_left(loader):
    """Batches the loader's next iteration delivers from its pending position (None: unknown,
    an IterableDataset)."""
    try:
        # An iteration starts at its first next(): its len() reads the pending position only.
        return len(DataLoader.__iter__(loader))  # the loader's own (not the dict wrapper's)
    except TypeError:
        return None


def _write_json(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        json.dump(value, f)
    os.replace(partial, path)  # a reader never sees half a file
