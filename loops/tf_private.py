"""The places where loops reaches into TensorFlow through a private name, each in one function,
because TensorFlow leaves no public way; `tests/test_tf_private.py` fails when a TensorFlow
release renames what they rely on. It imports nothing of the framework: it stands on the
ground floor, under `loops.topology` and every layer above it. No other module of loops names
a private TensorFlow name (`tests/test_private_names.py` checks)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

# What each adapter relies on, checked by the test.
# A class attribute of MirroredStrategy: where its collective group and instance keys start.
COLLECTIVE_KEY_BASE = "_collective_key_base"
# A MirroredStrategy's `extended`: the (host, compute devices) its input pipelines run for.
INPUT_WORKER_DEVICES = "_input_workers_devices"
# A tf.data iterator's resource tensor, which `tf.raw_ops.IteratorGetNextSync` reads.
ITERATOR_RESOURCE = "_iterator_resource"
# The class name of the strategy in force outside every `strategy.scope()`.
DEFAULT_STRATEGY_CLASS = "_DefaultDistributionStrategy"
# Where a ParameterServerStrategy counts the `worker` tasks of its cluster when it connects
# (`ParameterServerStrategyV2._connect_to_cluster`): it keeps its resolver private, and its
# public `cluster_resolver` is None.
PARAMETER_SERVER_WORKERS = "_num_workers"
# A ParameterServerStrategy's `extended`: whether it runs `strategy.run` outside a function
# its ClusterCoordinator schedules without a warning.
RUN_WITHOUT_COORDINATOR = "_allow_run_without_coordinator"
# TensorFlow's own answer to whether its oneDNN kernels are on: (module, function).
ONEDNN_ENABLED = ("tensorflow.python.util._pywrap_util_port", "IsMklEnabled")
# The class of a variable a ParameterServerStrategy's partitioner splits over the servers.
SHARDED_VARIABLE = ("__internal__", "distribute", "ShardedVariable")
# The variable class whose constructor makes one variable where it is called, past every
# variable creator in force: inside a MirroredStrategy's scope a tf.Variable is mirrored.
PLAIN_VARIABLE = ("tensorflow.python.ops.resource_variable_ops", "ResourceVariable")
# AutoGraph's rules of which modules it converts, read front to back, and the two kinds of
# rule: (module, rules, convert, do not convert).
AUTOGRAPH_RULES = (
    "tensorflow.python.autograph.core.config",
    "CONVERSION_RULES",
    "Convert",
    "DoNotConvert",
)
# What TensorFlow's own higher-order functions (strategy.run, tf.data's map) call to convert
# a function they are given only where their caller's code is converted.
AUTOGRAPH_AS_CALLER = ("__internal__", "autograph", ("tf_convert", "control_status_ctx"))


def _attribute(path: tuple[str, ...]) -> Any:
    """The attribute of `tf` at `path` (a private name's place, held by a test)."""
    found: Any = tf
    for name in path:
        found = getattr(found, name)
    return found


def _module_attribute(path: tuple[str, str]) -> Any:
    """The attribute `path[1]` of TensorFlow's module `path[0]`."""
    import importlib

    module, name = path
    return getattr(importlib.import_module(module), name)


def start_collective_keys_at(base: int) -> None:
    """Makes the MirroredStrategy made next key its collectives from `base` on.

    Its keys start from a class-wide base (0), so a second MirroredStrategy in
    one process (a notebook, a parity test) reuses the first one's keys and
    its collectives abort ("joining a group with size 4, but that group has
    size 2"). A strategy copies the base when it is made; TensorFlow's own
    tests give each a range of its own the same way.
    """
    setattr(tf.distribute.MirroredStrategy, COLLECTIVE_KEY_BASE, base)


@contextlib.contextmanager
def input_workers_kept(strategy: tf.distribute.Strategy) -> Iterator[None]:
    """Inside, `strategy` may change its input-worker devices; after, they are as before.

    TF 2.21's MirroredStrategy overwrites them for good when asked for
    per-replica pipelines (`distribute_datasets_from_function` with
    `experimental_replication_mode` PER_REPLICA), and every later
    `experimental_distribute_dataset` on it then fails ("Could not apply FILE
    based sharding"). A strategy without them is left as it is.
    """
    extended = strategy.extended
    saved = getattr(extended, INPUT_WORKER_DEVICES, None)
    try:
        yield
    finally:
        if saved is not None:
            setattr(extended, INPUT_WORKER_DEVICES, saved)


def iterator_resource(iterator: Any) -> tf.Tensor | None:
    """The resource tensor of a plain tf.data iterator, which `tf.raw_ops.IteratorGetNextSync`
    reads (without the asynchronous kernel of `next`); None for another iterator (a
    distributed one)."""
    if not isinstance(iterator, tf.data.Iterator):
        return None
    return getattr(iterator, ITERATOR_RESOURCE, None)


def parameter_server_workers(strategy: tf.distribute.Strategy) -> int:
    """The `worker` tasks of a connected ParameterServerStrategy's cluster (its chief not
    counted)."""
    return int(getattr(strategy, PARAMETER_SERVER_WORKERS))


def run_without_coordinator(strategy: tf.distribute.Strategy) -> None:
    """Lets a ParameterServerStrategy's chief call `strategy.run` itself, without the warning
    TensorFlow logs on every such call (its ops then run on the servers that hold the
    variables, on purpose)."""
    setattr(strategy.extended, RUN_WITHOUT_COORDINATOR, True)


def onednn_enabled() -> bool:
    """Whether TensorFlow runs its oneDNN CPU kernels, as TensorFlow decided when imported."""
    return bool(_module_attribute(ONEDNN_ENABLED)())


def leave_unconverted_by_autograph(package: str, *, except_in: tuple[str, ...] = ()) -> None:
    """Makes AutoGraph call the functions of `package` as written, as it calls TensorFlow's,
    and convert those of the subpackages `except_in` as it converts a user's.

    AutoGraph rewrites every function a traced function calls, once per process,
    and for loops' own code (which has no Python control flow on tensors below
    its traced entry points) that rewriting was over half the tracing time of a
    run. Functions of `package` a traced function calls then run as written;
    the code of a user they call is converted only through
    `converted_as_the_caller_is`. Called again, it adds nothing.
    """
    import importlib

    module, rules, convert, do_not_convert = AUTOGRAPH_RULES
    config = importlib.import_module(module)
    wanted = [getattr(config, convert)(name) for name in except_in]
    wanted.append(getattr(config, do_not_convert)(package))
    current = getattr(config, rules)
    added = tuple(rule for rule in wanted if str(rule) not in {str(each) for each in current})
    setattr(config, rules, (*added, *current))


def converted_as_the_caller_is(function: Any) -> Any:
    """`function` rewritten by AutoGraph where the code calling it is, else `function`.

    A user's step or loss called from loops' own (unconverted) code keeps its
    Python control flow on tensors, as it would called from converted code;
    a function of a package AutoGraph leaves alone stays as it is.
    """
    internal: Any = tf
    *path, (convert, status) = AUTOGRAPH_AS_CALLER
    for name in path:
        internal = getattr(internal, name)
    return getattr(internal, convert)(function, getattr(internal, status)())


def variable_parts(variable: Any) -> list[Any]:
    """The shards of a variable split over the parameter servers; `[variable]` for another."""
    if isinstance(variable, _attribute(SHARDED_VARIABLE)):
        return list(variable.variables)
    return [variable]


def variable_on_device(device: str, **arguments: Any) -> tf.Variable:
    """One variable on `device` (tf.Variable's arguments), not mirrored, inside a strategy's
    scope too: a block of a table that only the replica on `device` holds."""
    with tf.device(device):
        return _module_attribute(PLAIN_VARIABLE)(**arguments)


def sharded_variable(parts: list[Any], name: str) -> Any:
    """`parts` (blocks of rows, in row order) as one ShardedVariable: a checkpoint saves it
    as one tensor, which restores into any other split or into one variable."""
    return _attribute(SHARDED_VARIABLE)(parts, name=name)


# The base class of what a tf.train.Checkpoint saves, and the two methods through which a
# checkpoint asks an object for the tensors it saves and hands back those it restores.
TRACKABLE = ("__internal__", "tracking", "Trackable")
SAVE_AND_RESTORE = ("_serialize_to_tensors", "_restore_from_tensors")
# The key under which a variable saves its value (after its object's path): (module, name).
VARIABLE_VALUE_KEY = ("tensorflow.python.trackable.base", "VARIABLE_VALUE_KEY")
# A tensor a checkpoint saves, which may be a function it calls only as it saves: (module, class).
SAVE_SPEC = ("tensorflow.python.training.saving.saveable_object", "SaveSpec")


class SavedAsOneValue(_attribute(TRACKABLE)):  # type: ignore[misc]
    """What a checkpoint saves as a variable would be saved: one tensor under the variable's
    key, so that it restores into a variable (a ShardedVariable too) and one restores into it.

    A subclass gives `dtype`, `device` (where the value is read) and `checkpoint_name`, and
    the two halves: `whole_value()`, called only as a checkpoint saves (it may run
    collectives that every worker's save runs alike), and `restore_whole(value)`.
    """

    dtype: tf.DType
    device: str
    checkpoint_name: str

    def whole_value(self) -> tf.Tensor:
        raise NotImplementedError

    def restore_whole(self, value: tf.Tensor) -> Any:
        raise NotImplementedError

    def _serialize_to_tensors(self) -> dict[str, Any]:
        spec = _module_attribute(SAVE_SPEC)(
            self.whole_value, "", self.checkpoint_name, dtype=self.dtype, device=self.device
        )
        return {_module_attribute(VARIABLE_VALUE_KEY): spec}

    def _restore_from_tensors(self, restored_tensors: dict[str, tf.Tensor]) -> Any:
        return self.restore_whole(restored_tensors[_module_attribute(VARIABLE_VALUE_KEY)])
