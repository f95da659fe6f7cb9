"""Saves and restores a loop's state: the chief into model_dir, others to scratch."""

from __future__ import annotations

import errno
import glob
import os
import re
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import keras
import tensorflow as tf

from loops import keras_private, topology
from loops.core import own_files
from loops.tables import table_plan
from loops.tables.worker_blocks import WorkerBlocks
from loops.vocabulary.errors import DamagedCheckpointError, NonFiniteWeightsError

# What a CheckpointManager writes for step N: PREFIX.index and PREFIX.data-K-of-M.
_INDEX = re.compile(r"^ckpt-(\d+)\.index$")
_DATA = re.compile(r"^ckpt-(\d+)\.data-(\d+)-of-(\d+)$")
_PREFIX = re.compile(r"^ckpt-(\d+)$")
# A save in progress writes its shards into PREFIX_temp/ first; a kill leaves it behind.
_TEMPORARY = re.compile(r"^ckpt-\d+_temp$")
STATE_FILE = "checkpoint"  # TensorFlow's name for the list of a directory's checkpoints


class Checkpointer:
    """A tf.train.CheckpointManager that every worker calls and only the chief keeps.

    Under MultiWorkerMirroredStrategy every worker must take part in the
    collectives of a save (BUILD.md, fact 11), so non-chief workers save too,
    into a scratch directory that is removed right after.

    It never trusts TensorFlow's state file alone: `restore` looks at the
    checkpoint files themselves, restores the newest one that reads, and says
    which newer ones it passed over and why, so a lost or damaged state file
    or a damaged newest checkpoint never restarts a run from step 0 (where the
    manager would then write over the intact older checkpoints). Every save
    first checks that the variables are finite, so no checkpoint holds a NaN
    or an inf.

    `optional_items` are saved like `items` but restored only when the
    checkpoint holds them, so state added to a run later (an action's, such
    as an early-stopping wait count) starts fresh instead of failing the
    restore.
    """

    def __init__(
        self,
        *,
        strategy: tf.distribute.Strategy,
        directory: str,
        items: Mapping[str, object],
        step_counter: tf.Variable,
        max_to_keep: int,
        optional_items: Mapping[str, object] | None = None,
        say: Callable[[str], None] = print,
        asynchronous: bool = False,
    ):
        """
        Args:
            strategy: the strategy the items live in.
            directory: where the chief keeps the checkpoints.
            items: name -> trackable, saved and restored.
            step_counter: the variable whose value numbers the checkpoints.
            max_to_keep: how many recent checkpoints the chief keeps.
            optional_items: name -> trackable, restored only when present.
            say: where notes about damaged files go (a progress line).
            asynchronous: a save copies the variables and returns; a thread writes
                the files (`wait` for it). Only in one process: under a cluster every
                worker takes part in a save's collectives (BUILD.md, fact 11).
        """
        self._is_chief = topology.is_chief(strategy)
        self._chief_directory = directory
        self.directory = directory
        if not self._is_chief:
            self.directory = os.path.join(directory, f".scratch_{topology.task_name(strategy)}")
        self.items = dict(items)
        self.optional_items = dict(optional_items or {})
        self.checkpoint = tf.train.Checkpoint(**self.items, **self.optional_items)
        self._max_to_keep = max_to_keep
        self._step_counter = step_counter
        self._say = say
        self._finiteness = FinitenessCheck(self.checkpoint)
        self._manager: tf.train.CheckpointManager | None = None
        self._options = None
        if asynchronous:
            keras_private.copy_keras_variables_once()
            self._options = tf.train.CheckpointOptions(enable_async=True)
        self._in_flight: str | None = None  # an asynchronous save's path, until `wait`

    @property
    def latest(self) -> str | None:
        """The newest checkpoint whose files are all there (not read; see `restore`)."""
        return newest_complete(self._chief_directory)

    def restore(self, before_step: int | None = None) -> str | None:
        """Restores the newest checkpoint that reads, if there are checkpoint files; returns it.

        A newer checkpoint that is incomplete or does not read is passed over
        with a note naming it; it is left in place (the run replaces it when
        it saves that step again).

        Args:
            before_step: restore the newest saved before this step, where one is complete,
                and remove those saved at it or later (the chief): a loss spike's rollback,
                whose first high step it is; None: the newest.

        Raises:
            ValueError: a checkpoint reads but does not match the loop's objects.
            DamagedCheckpointError: there are checkpoint files and none reads.
        """
        self.wait()
        found, superseded = self._candidates(before_step)
        if self._is_chief:
            _remove_unfinished_saves(self._chief_directory)
        else:
            shutil.rmtree(self.directory, ignore_errors=True)  # this worker's own scratch
        damaged: list[tuple[str, str]] = []
        restored = None
        for _, prefix in found:
            problem = missing_files(prefix) or restore_checkpoint(
                prefix, self.items, optional_items=self.optional_items
            )
            if problem is None:
                restored = prefix
                break
            damaged.append((prefix, problem))
        if found and restored is None:
            listing = "; ".join(f"{prefix}: {problem}" for prefix, problem in damaged)
            raise DamagedCheckpointError(
                f"{self._chief_directory} holds checkpoint files, but none can be read "
                f"({listing}). Nothing was changed. Move the damaged files out of the "
                "directory to start over there, restore them from a backup, or point "
                "--model_dir at a new directory."
            )
        for prefix, problem in damaged:
            self._say(
                f"checkpoint {prefix} is damaged ({problem}); restoring the newest "
                f"intact one, {restored}, instead. The damaged files are left in place "
                "and replaced when the run saves that step again."
            )
        passed_over = {prefix for prefix, _ in damaged}
        kept = [
            prefix
            for _, prefix in found
            if restored is not None
            and prefix not in passed_over
            and _step_of(prefix) <= _step_of(restored)
            and missing_files(prefix) is None
        ]
        self._open_manager(restored, kept)
        if restored is not None and superseded and self._is_chief:
            self._remove_superseded(superseded, before_step)
        return restored

    def _remove_superseded(self, prefixes: list[str], before_step: int | None) -> None:
        for prefix in prefixes:
            for path in glob.glob(glob.escape(prefix) + ".*"):
                os.remove(path)
        self._say(
            f"removed {', '.join(os.path.basename(prefix) for prefix in prefixes)}: saved "
            f"at step {before_step} or later, they hold the steps gone back over"
        )

    def _candidates(self, before_step: int | None) -> tuple[list, list[str]]:
        """The (step, prefix) to restore from, newest first, and the prefixes `before_step`
        supersedes: none where no complete checkpoint was saved before it (then the newest)."""
        found = _checkpoint_files(self._chief_directory)
        if before_step is None:
            return found, []
        earlier = [(step, prefix) for step, prefix in found if step < before_step]
        if not any(missing_files(prefix) is None for _, prefix in earlier):
            return found, []
        return earlier, [prefix for step, prefix in found if step >= before_step]

    def _open_manager(self, restored: str | None, kept: list[str]) -> None:
        """The manager, with a state file that lists the intact checkpoints up to `restored`.

        TensorFlow's manager rotates (deletes) only the checkpoints its state
        file lists; listing exactly the intact ones it may rotate keeps it
        from trusting a damaged or missing file.
        """
        if self._is_chief and restored is None:
            self._drop_unreadable_state_file()
        if self._is_chief and restored is not None:
            state = read_state_file(self._chief_directory)
            listed = [
                self._in_directory(path)
                for path in (state.all_model_checkpoint_paths if state else [])
            ]
            wanted = sorted(kept, key=_step_of)
            stale = state is None or self._in_directory(state.model_checkpoint_path) != restored
            if stale:
                self._say(
                    f"the checkpoint state file {os.path.join(self._chief_directory, STATE_FILE)} "
                    "was missing, damaged or out of date; rebuilt it from the checkpoint "
                    f"files ({len(wanted)} intact, newest {os.path.basename(restored)})."
                )
            if stale or listed != wanted:
                _write_state_file(self._chief_directory, restored, wanted)
        self._manager = tf.train.CheckpointManager(
            self.checkpoint,
            self.directory,
            max_to_keep=self._max_to_keep,
            step_counter=self._step_counter,
        )

    def _drop_unreadable_state_file(self) -> None:
        """Removes a state file that does not read where no checkpoint file is left to list.

        TensorFlow's manager reads the state file as it opens and fails on one
        that does not read; with no checkpoint there it lists nothing to keep.
        """
        path = os.path.join(self._chief_directory, STATE_FILE)
        if os.path.exists(path) and read_state_file(self._chief_directory) is None:
            os.remove(path)
            self._say(
                f"the checkpoint state file {path} did not read and no checkpoint files are "
                "there; removed it, the run starts at step 0."
            )

    def _in_directory(self, path: str) -> str:
        return os.path.join(self._chief_directory, os.path.basename(path))

    def save(self) -> str | None:
        """Saves at the current step; returns the kept path (None off the chief).

        Raises:
            NonFiniteWeightsError: a variable is not finite; nothing is written.
            own_files.PlantedLinkError: a link is planted at a name the save writes.
            OSError: the directory cannot be written (full disk, read-only);
                the earlier checkpoints are intact.
            tf.errors.OpError: a task of the cluster stopped answering (`lost_peer`);
                raised as it is, for `Trainer.train` to name the task
                (`ClusterTaskLostError`). The earlier checkpoints are intact.
        """
        bad = self._finiteness.nonfinite_names()
        if bad:
            raise NonFiniteWeightsError(
                f"Refusing to save a checkpoint at step {int(self._step_counter.numpy())}: "
                f"{describe_names(bad)} not finite (NaN or inf). The checkpoints already in "
                f"{self._chief_directory} are intact."
            )
        if self._manager is None:
            self._open_manager(None, [])
        assert self._manager is not None  # opened just above
        _refuse_links(self.directory, int(self._step_counter.numpy()))
        try:
            # Asynchronous: this waits for the previous save's files, copies the
            # variables and returns; the error of a failed earlier write comes here.
            path = self._manager.save(checkpoint_number=self._step_counter, options=self._options)
        except (OSError, tf.errors.OpError) as error:
            if lost_peer(error):
                # A server holding the variables (or a peer of the save's collectives)
                # stopped answering: no disk problem; the Trainer names the task.
                raise
            # TensorFlow writes a save's shards into `ckpt-N_temp` first: a failed one
            # would leave it behind, empty or half written.
            step = int(self._step_counter.numpy())
            shutil.rmtree(os.path.join(self.directory, f"ckpt-{step}_temp"), ignore_errors=True)
            raise OSError(_unwritten(self.directory, write_error_reason(error))) from error
        if self._options is not None:
            self._in_flight = path
        if not self._is_chief:
            shutil.rmtree(self.directory, ignore_errors=True)
            return None
        return path

    def wait(self) -> None:
        """Returns once an asynchronous save in flight has written its files.

        Raises:
            OSError: its files were not written (the earlier checkpoints are intact).
        """
        if self._in_flight is None or self._manager is None:
            return
        prefix, self._in_flight = self._in_flight, None
        self._manager.sync()
        problem = missing_files(prefix)
        if problem is not None:
            raise OSError(_unwritten(self.directory, problem))


# What a save raises when a task it reads from or saves with is gone: a parameter server
# holding variables, or a peer of MultiWorkerMirroredStrategy's collectives.
_LOST_PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.DeadlineExceededError,
)
# The same inside a grouped error ("2 root error(s) found. (0) UNAVAILABLE: ..."), whose
# class is that of whichever root error came first: the words by which the Trainer's
# sentence (loops/cluster/lost_task.py) finds the lost task. Not "remote target /job:"
# alone: a parameter server writes its own shard, so its disk errors come from one too.
_LOST_PEER_TEXT = re.compile(
    r"failed to connect|Connection reset|Socket closed|Collective ops is aborted|unhealthy|"
    r"Deadline Exceeded"
)


def lost_peer(error: Exception) -> bool:
    """Whether `error`, raised by a save, says a task of the cluster stopped answering
    (rather than that the directory cannot be written)."""
    if isinstance(error, _LOST_PEER_ERRORS):
        return True
    return isinstance(error, tf.errors.OpError) and bool(_LOST_PEER_TEXT.search(error.message))


def write_error_reason(error: BaseException) -> str:
    """Why a write failed, in a few whole words: the operating system's reason (a full
    disk's "No space left on device" wherever TensorFlow's message holds it), else the
    message's first line, cut at a word."""
    reason = getattr(error, "strerror", None)
    if reason:
        return str(reason)
    text = str(getattr(error, "message", None) or error)
    for known in (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT), os.strerror(errno.EROFS)):
        if known in text:
            return known
    line = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return line if len(line) <= 200 else line[:200].rsplit(" ", 1)[0] + " ..."


def _unwritten(directory: str, reason: str) -> str:
    return (
        f"Could not write a checkpoint into {directory} ({reason}). Free space or make the "
        "directory writable (or pass another --model_dir); the checkpoints already there "
        "are intact."
    )


class FinitenessCheck:
    """Tells, in one traced pass, which floating-point variables of a checkpoint are not finite.

    The variables are the checkpoint's own (models, optimizer slots, moving
    averages), so what is checked is exactly what a save would write.
    """

    def __init__(self, root: tf.train.Checkpoint | tf.Module | keras.Model):
        self._variables = _float_variables(root)
        self._check: Callable | None = None

    def finite_flags(self) -> tf.Tensor:
        """One bool a variable: whether it is finite (callable inside a tf.function)."""
        if not self._variables:
            return tf.ones([0], tf.bool)
        return tf.stack(
            [
                tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(variable)))
                for variable in self._variables
            ]
        )

    def all_finite(self) -> tf.Tensor:
        """Whether every variable is finite: a scalar bool (callable inside a tf.function)."""
        return tf.reduce_all(self.finite_flags())

    def nonfinite_names(self) -> list[str]:
        """Names of the variables holding a NaN or an inf (empty when all are finite)."""
        if not self._variables:
            return []
        if self._check is None:
            self._check = tf.function(self.finite_flags)
        flags = self._check().numpy()
        return [_variable_name(v) for v, finite in zip(self._variables, flags) if not finite]


def describe_names(names: list[str]) -> str:
    """'3 variables (a, b, c) are' style text for an error, with at most five names."""
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return f"{len(names)} variable{'s' if len(names) > 1 else ''} ({shown}) " + (
        "are" if len(names) > 1 else "is"
    )


def restore_checkpoint(
    prefix: str, items: Mapping[str, object], *, optional_items: Mapping[str, object] | None = None
) -> str | None:
    """Restores checkpoint `prefix` into `items`; None when it worked, else why it does not read.

    Objects the checkpoint holds beyond `items` (an action's state) are left
    alone; `optional_items` are restored when the checkpoint holds them.

    Raises:
        ValueError: it reads, but does not match `items` (another model or loop, or a
            `loops.TablePlan` that placed an Embedding in one and not in the other).
    """
    try:
        saved = {name.split("/")[0] for name, _ in tf.train.list_variables(prefix)}
        present = {name: item for name, item in (optional_items or {}).items() if name in saved}
        # What it holds beyond `items` stays unread, without a warning about it.
        status = tf.train.Checkpoint(**items, **present).restore(prefix).expect_partial()
        status.assert_existing_objects_matched()
        return None
    except (AssertionError, ValueError, IndexError, tf.errors.OpError) as error:
        unreadable = _unreadable(prefix)
        if unreadable is not None:
            return unreadable
        changed = table_plan.changed_layout(prefix, dict(tf.train.list_variables(prefix)), items)
        if changed is not None:
            raise ValueError(changed) from error
        reason = str(error).splitlines()[0][:240]
        raise ValueError(
            f"The checkpoint {prefix} does not match this loop ({reason}...). "
            "It comes from a different model or loop: point --model_dir at "
            "a new directory, or rebuild the loop that wrote it."
        ) from error


def checkpoint_prefix(path: str, *, setting: str, otherwise: str) -> str:
    """The checkpoint `path` names: itself (a prefix), or the newest complete one in the
    directory (a run's model_dir, or its checkpoints/).

    Raises:
        ValueError: `path` is neither, naming `setting`=`path` and the fix (`otherwise`: what
            else the setting takes).
    """
    if tf.io.gfile.exists(path + ".index"):
        return path
    for directory in (os.path.join(path, "checkpoints"), path):
        newest = newest_complete(directory)
        if newest is not None:
            return newest
    raise ValueError(
        f"{setting}={path!r} is neither a checkpoint (PREFIX, with PREFIX.index) nor a "
        "directory holding one (a run's model_dir, or its checkpoints/); pass one of "
        f"those, or {otherwise}."
    )


def newest_complete(directory: str) -> str | None:
    """The newest checkpoint in `directory` whose files are all there (not read); None if none."""
    complete = [
        prefix for _, prefix in _checkpoint_files(directory) if missing_files(prefix) is None
    ]
    return complete[0] if complete else None


def listed_checkpoints(directory: str) -> list[tuple[int, str]]:
    """(step, prefix) of the checkpoints TensorFlow's state file lists, oldest first.

    A `CheckpointManager` rewrites the state file (atomically) only after a
    checkpoint's files are all written, so a listed checkpoint is complete;
    its files may still go before they are read (the manager lists the
    newest, deletes the oldest beyond `max_to_keep`, then lists again).
    Empty when there is no state file or it does not parse.
    """
    state = read_state_file(directory)
    paths = state.all_model_checkpoint_paths if state else []
    prefixes = {os.path.join(directory, os.path.basename(path)) for path in paths}
    return sorted(
        (_step_of(prefix), prefix) for prefix in prefixes if _PREFIX.match(os.path.basename(prefix))
    )


def read_state_file(directory: str):
    """TensorFlow's CheckpointState of `directory`; None when there is none or it does not read.

    A damaged state file (binary bytes, not a proto, no newest checkpoint) is
    as good as none: the restore decides from the checkpoint files themselves.
    """
    try:
        return tf.train.get_checkpoint_state(directory)
    except (ValueError, tf.errors.OpError):  # UnicodeDecodeError is a ValueError
        return None


def _float_variables(root) -> list:
    variables: list = []
    seen: set[int] = set()
    for item in tf.train.TrackableView(root).descendants():
        if isinstance(item, WorkerBlocks):  # a table's blocks this worker holds
            variables.extend(part for part in item.variables if id(part) not in seen)
            seen.update(id(part) for part in item.variables)
            continue
        if isinstance(item, tf.Variable):
            floating = item.dtype.is_floating
        elif isinstance(item, keras.Variable):
            floating = tf.as_dtype(item.dtype).is_floating
        else:
            continue
        if floating and id(item) not in seen:
            seen.add(id(item))
            variables.append(item)
    return variables


def _variable_name(variable) -> str:
    return getattr(variable, "path", None) or variable.name


def _step_of(prefix: str) -> int:
    return int(prefix.rsplit("-", 1)[1])


def _checkpoint_files(directory: str) -> list[tuple[int, str]]:
    """(step, prefix) of every checkpoint with any file in `directory`, newest first."""
    steps = set()
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        match = _INDEX.match(name) or _DATA.match(name)
        if match:
            steps.add(int(match.group(1)))
    return [(step, os.path.join(directory, f"ckpt-{step}")) for step in sorted(steps, reverse=True)]


def missing_files(prefix: str) -> str | None:
    """Which of a checkpoint's files are missing; None when all are there."""
    if not os.path.exists(prefix + ".index"):
        return f"{os.path.basename(prefix)}.index is missing"
    shards = glob.glob(glob.escape(prefix) + ".data-*-of-*")
    if not shards:
        return f"{os.path.basename(prefix)}.data-* is missing"
    match = _DATA.match(os.path.basename(shards[0]))
    if match is None:
        return f"{os.path.basename(shards[0])} is not a data shard's name"
    total = int(match.group(3))
    for shard in range(total):
        name = f"{prefix}.data-{shard:05d}-of-{total:05d}"
        if not os.path.exists(name):
            return f"{os.path.basename(name)} is missing"
    return None


def _unreadable(prefix: str) -> str | None:
    """Why a checkpoint's files do not read (every tensor is read); None when they do."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except (IndexError, ValueError, tf.errors.OpError) as error:
        return f"its files do not read: {str(error).splitlines()[0][:160]}"
    return None


def _write_state_file(directory: str, newest: str, kept: list[str]) -> None:
    """Writes TensorFlow's checkpoint state file (a text CheckpointState proto), atomically.

    Each checkpoint gets its index file's time as its timestamp: the manager
    keeps only the entries that have one, and rotates those it keeps.
    """
    times = [os.path.getmtime(prefix + ".index") for prefix in kept]
    lines = [f'model_checkpoint_path: "{os.path.basename(newest)}"']
    lines += [f'all_model_checkpoint_paths: "{os.path.basename(prefix)}"' for prefix in kept]
    lines += [f"all_model_checkpoint_timestamps: {time!r}" for time in times]
    # Older than every entry: the manager treats entries up to it as kept forever.
    lines.append(f"last_preserved_timestamp: {min(times, default=1.0) - 1.0!r}")
    own_files.write_atomic(os.path.join(directory, STATE_FILE), ("\n".join(lines) + "\n").encode())


def _refuse_links(directory: str, step: int) -> None:
    """Raises PlantedLinkError for a link at a name the save of `step` writes.

    TensorFlow writes a checkpoint's .index file through a link planted at its
    name (over the file it points to); its data files and state file it renames.
    """
    prefix = os.path.join(directory, f"ckpt-{step}")
    for path in [prefix + ".index", *glob.glob(glob.escape(prefix) + ".data-*")]:
        own_files.refuse_link(path)


def _remove_unfinished_saves(directory: str) -> None:
    """Removes the temporary shard folders of saves a kill interrupted (chief, holding the lock)."""
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        if _TEMPORARY.match(name):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def write_tensors(prefix: str, tensors: Mapping[str, Any]) -> None:
    """Writes `tensors` (checkpoint key -> value) as one checkpoint bundle at `prefix`, the
    keys sorted: what `tf.train.load_checkpoint(prefix)` reads back, and what a restore of
    those keys takes."""
    keys = sorted(tensors)
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=keys,
        shape_and_slices=[""] * len(keys),
        tensors=[tf.constant(tensors[key]) for key in keys],
    )
