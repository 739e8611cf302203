"""Distributed checkpoints (torch.distributed.checkpoint, DCP): save, exact resume, resharding.

On disk, under ``{dump_folder}/{[checkpoint] folder}``::

    step-N/           a complete checkpoint: DCP's .metadata and __<rank>_0.distcp files,
                      checksums.json (the CRC-32 of every stored item, checksums.py), plus
                      checkpoint.json (step, what it holds, the layout and data it came from)
    step-N.damaged/   a checkpoint found damaged and set aside ([checkpoint] fallback_on_damage)
    step-N.partial/   a save in progress, or one cut short; never loaded, removed at start-up
                      (``step-N.replica_<i>.partial`` when replica group i of a fault-tolerant
                      job writes it: each group removes only its own at start-up)

**Atomic saves.** Every rank writes into ``step-N.partial``. DCP ends a save by gathering every
rank's write results at the coordinator (rank 0), which then writes .metadata; so once rank 0's
save has returned (or its async future completed), every rank's files are on disk (fsynced).
Only then does rank 0 write checkpoint.json and rename the folder to ``step-N``. The rename is
atomic: a checkpoint is either complete and visible, or invisible. A job killed mid-save leaves
a ``.partial`` folder, and its restart resumes from the previous complete checkpoint. Replacing
an existing ``step-N`` (after resuming from an earlier ``load_step``) moves the old folder to
``step-N.old`` first and deletes it only after the new one is in place.

**What a checkpoint holds.** The DCP state dict has one flat entry per state:

- ``model``: ``get_model_state_dict`` of each model part, merged. Its keys are the plain
  model's FQNs whatever the layout (FSDP/TP DTensors are saved as shards of the global tensors;
  activation-checkpoint wrappers and ``Module.compile`` leave no trace in the names), so DCP
  reshards between any two layouts at load time.
- ``optimizer``: ``get_optimizer_state_dict`` flattened (``state.<param FQN>.exp_avg``, ...):
  the same keys under every layout, pipeline stages included.
- ``lr_scheduler``: the schedule's state (identical for every model part), as JSON.
- ``dataloader``: the position in the token stream, as JSON. At a step boundary every rank's
  position is the same (components/data/datasets.py), so rank 0 saves it and every rank of any
  data-parallel degree loads it: a resumed run continues the stream where it stopped, never
  repeating or skipping a token. With the same global batch and seq_len the batches equal those
  of an uninterrupted run; with others the stream continues, cut into the new shapes.
- ``train_state``: step, tokens seen, and each rank's RNG states (under the same world size each
  rank gets its own back; otherwise rank 0's, which every rank's equals unless the model draws
  rank-dependent random numbers).

**Async saves.** ``async``: a blocking copy of the state to CPU memory, then DCP writes it from a
thread. ``async_with_pinned_mem``: the copy into pinned shared memory runs in the background
(the loop waits for it only before the next optimizer step, which would modify the copied
tensors) and a separate writer process writes it; on CPU, pinning and non-blocking copies need
an accelerator, so shared memory without pinning is used. The copy starts only after the
optimizer step's kernels finished, and the first one is checked against the free space in
/dev/shm (staging.py). Async saves use their own gloo
process group, so their collectives never interleave with training's. At most one save is in
flight: a new save first waits for the previous one. Old checkpoints are deleted
(``keep_latest_k``) in the background, only after a newer save is complete.

**Which checkpoint loads.** ``load_step`` if set, else the newest complete checkpoint that
holds a train state. Model-only checkpoints (``step-0`` written by ``create_seed_checkpoint`` or
scripts/convert_hf.py, and ``last_save_model_only`` exports) cannot resume training: a seed
gives the initial weights when nothing else is there, an export is loaded only when named by
``load_step``; neither is ever purged. With no checkpoint at all, ``initial_load_path`` (DCP or
HuggingFace) gives the initial weights.

**Loading.** Before anything is read, every rank checks the checkpoint: checkpoint.json and
.metadata readable, every data file present and long enough, every stored item covered by a
checksum, every expected key present with the same global shape, the data source unchanged.
Any failure stops the run with a message that says what differs and what to do; DCP itself
plans all reads before reading, so nothing is loaded from an incompatible checkpoint. While
reading, each rank checks the CRC-32 of every item it reads (checksums.py): damage is one line
naming the step, the file, the bytes and the state, or, with ``fallback_on_damage``, a resume
from the newest earlier checkpoint (loading.py).

**Modules.** validate.py: the start-up checks, CheckpointError and CheckpointDamaged;
states.py: the Stateful wrappers; folder.py: the folder protocol (discovery, publication,
clean-up, load checks); checksums.py: the checksum writer and reader of DCP items;
hf_checksums.py: the same for safetensors files; staging.py: the pinned stager; manager.py:
CheckpointManager, which saves and hands loading to loading.py (which checkpoint, the checks,
the fallback); failure.py: a failed save or load said in one line (the cause, the file, the
step).
"""

from torchtitan_like.components.checkpoint.manager import CheckpointManager, SaveRecord
from torchtitan_like.components.checkpoint.validate import CheckpointError, validate_checkpoint

__all__ = ["CheckpointError", "CheckpointManager", "SaveRecord", "validate_checkpoint"]
