"""Starts a new run from another run's checkpoint: the variables whose checkpoint names match
patterns are taken, each named table's rows remapped through the two runs' ids so that an id
keeps its row, and the rest left as the model built them; a report says which went where."""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from loops import keras_private
from loops.model_dir import checkpoints, id_vocabulary

# A checkpoint key is an object's path, then this for a variable's value.
VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
_SHOWN = 8  # names an error lists before "..."
# An optimizer's learning rate is a variable, and the new run's setting: never taken.
_SETTING = re.compile(rf"(^|/){re.escape(keras_private.OPTIMIZER_RATE_ATTRIBUTE)}$")
_STEP_KEY = "global_step" + VALUE_SUFFIX  # the run's step counter, a root item of its saves


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """Where a new run starts from, as `loops.Trainer(..., warm_start=loops.WarmStart(...))`.

    Args:
        checkpoint: a checkpoint (PREFIX, with PREFIX.index), or a directory holding one (a
            run's model_dir, or its checkpoints/), whose newest complete checkpoint is read.
        variables: regular expressions over variable names; a variable is taken when one
            matches its whole name and the checkpoint holds it. Each must match something.
            An optimizer's learning rate (a variable too) is the new run's setting and is
            never taken.
            A variable's name is its path from the first checkpoint item that holds it (in
            the definition's `checkpoint_items()` order, then the run's: `global_step`),
            each item walked breadth first: "model/_operations/6/kernel" for a dense kernel,
            "optimizer/_variables/3" for one of its slots, "model/_operations/2/embeddings"
            for a table's rows. The report lists every name.
        row_ids: table layer name (or another layer of a row an id) -> (the raw id of each
            of its rows in the checkpoint, the raw id of each of its rows here): every value
            of that layer with a row a row (its rows and slots) is taken row by row, an id in
            both keeps its row, an id new here keeps the row the model built for it, an id
            gone is dropped.
        continues: the new run goes on from the checkpoint's run (`continuation`): every
            variable this model holds must be taken, whole or row by row (a learning rate
            excepted), the step counter and the optimizer's slots and count included, so
            that training goes on where that run stopped; a model that holds anything else
            is refused, naming it. results.json's `warm_start` then records the lineage.
    """

    checkpoint: str
    variables: Sequence[str]
    row_ids: Mapping[str, tuple[Sequence[Any], Sequence[Any]]] = dataclasses.field(
        default_factory=dict
    )
    continues: bool = False

    @classmethod
    def continuation(
        cls,
        checkpoint: str,
        row_ids: Mapping[str, tuple[Sequence[Any], Sequence[Any]]] | None = None,
    ) -> WarmStart:
        """The start of a run that goes on from another on new data: everything `checkpoint`
        holds for this model taken, `row_ids`' tables row by row (`continues`)."""
        return cls(checkpoint, variables=(".*",), row_ids=dict(row_ids or {}), continues=True)

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint, str) or not self.checkpoint:
            raise ValueError(
                f"WarmStart(checkpoint={self.checkpoint!r}): pass the path of a checkpoint "
                "or of a run's model_dir."
            )
        variables = (self.variables,) if isinstance(self.variables, str) else self.variables
        object.__setattr__(self, "variables", tuple(variables))
        if not self.variables:
            raise ValueError(
                "WarmStart(variables=()) takes nothing; pass patterns of checkpoint names, "
                "such as 'model/.*' for every variable of the model."
            )
        for pattern in self.variables:
            try:
                re.compile(pattern)
            except (re.error, TypeError) as error:
                raise ValueError(
                    f"WarmStart variables pattern {pattern!r} is no regular expression "
                    f"({error}); write it as Python's re module reads one."
                ) from None
        row_ids = {}
        for table, pair in dict(self.row_ids).items():
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise ValueError(
                    f"WarmStart row_ids[{table!r}] must be a pair (the ids of the checkpoint's "
                    "rows, the ids of this model's rows), got "
                    f"{type(pair).__name__}."
                )
            old = id_vocabulary.checked_ids(f"row_ids[{table!r}][0]", pair[0])
            new = id_vocabulary.checked_ids(f"row_ids[{table!r}][1]", pair[1])
            if (old.dtype.kind == "U") != (new.dtype.kind == "U"):
                raise ValueError(
                    f"WarmStart row_ids[{table!r}] pairs {old.dtype} ids with {new.dtype} "
                    "ids: an id keeps its row only where both runs name it alike; pass both as "
                    "whole numbers or both as strings."
                )
            row_ids[table] = (old, new)
        object.__setattr__(self, "row_ids", row_ids)

    def prefix(self) -> str:
        """The checkpoint it reads (`checkpoint`, or the newest in that directory).

        Raises:
            ValueError: `checkpoint` names none.
        """
        return checkpoints.checkpoint_prefix(
            self.checkpoint,
            setting="WarmStart(checkpoint=...)",
            otherwise="leave warm_start out to start from the initial weights",
        )

    def source_step(self) -> int | None:
        """The step counter its checkpoint holds (`global_step`), None where it holds none:
        the step a continuation goes on from, read before any model is built.

        Raises:
            ValueError: as `prefix`, or a checkpoint that does not read.
        """
        reader = _reader(self.prefix())
        if not reader.has_tensor(_STEP_KEY):
            return None
        return int(reader.get_tensor(_STEP_KEY))


def warm_start(start: WarmStart, items: Mapping[str, Any]) -> dict[str, Any]:
    """Sets the variables of `items` (what a checkpoint of the run holds) that `start` takes
    from its checkpoint; returns the report (`report` below). Every process of a run calls
    it alike, as every one restores.

    Nothing is changed unless all of it can be: the plan is checked against both
    checkpoints' names and shapes first. The values go in as a restore puts them, through
    a checkpoint of `items` with the taken values in place of the model's: so a table split
    over replicas, workers or servers is set as its own checkpoints set it.

    Raises:
        ValueError: a checkpoint that does not read, a pattern that matches nothing, a
            variable of another shape or dtype (naming it and the fix), or a `row_ids`
            table that is not there or whose rows do not fit its ids.
    """
    prefix = start.prefix()
    source = _reader(prefix)
    root = tf.train.Checkpoint(**items)
    names, tables, slots = _variable_names(root, items, start.row_ids)
    with tempfile.TemporaryDirectory(prefix="loops-warm-start-") as scratch:
        # The model's own values, under the keys its checkpoints use.
        # `save`, not `write`: a restore expects the save counter that `save` adds.
        target = tf.train.load_checkpoint(root.save(os.path.join(scratch, "built")))
        plan = _Plan(start, prefix, (source, target), names, (tables, slots))
        values = {key: target.get_tensor(key) for key in target.get_variable_to_shape_map()}
        for name in plan.taken:
            values[names[name]] = source.get_tensor(names[name])
        for name, table in plan.remapped.items():
            key = names[name]
            values[key] = plan.rows[table].applied(source.get_tensor(key), values[key])
        merged = os.path.join(scratch, "merged")
        checkpoints.write_tensors(merged, values)
        root.restore(merged).assert_existing_objects_matched()
    return plan.report()


def _reader(prefix: str) -> Any:
    """A reader of the checkpoint `prefix`; ValueError naming it where it does not read."""
    try:
        return tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as error:
        raise ValueError(f"WarmStart cannot read the checkpoint {prefix}: {error}") from None


class _RowMap:
    """Where each row of a table here comes from: index[i] is the checkpoint's row of the id
    of row i, or -1 for an id the checkpoint has no row of."""

    def __init__(self, old: Sequence[Any], new: Sequence[Any]):
        position = {value: row for row, value in enumerate(np.asarray(old).tolist())}
        self.index = np.array(
            [position.get(value, -1) for value in np.asarray(new).tolist()], np.int64
        )
        self.old_rows, self.new_rows = len(old), len(new)
        self.kept = int(np.sum(self.index >= 0))

    def fits(self, saved: Sequence[int], built: Sequence[int]) -> bool:
        """Whether a value of these shapes holds a row per row: the checkpoint's and ours."""
        return (
            len(saved) >= 1
            and len(saved) == len(built)
            and saved[0] == self.old_rows
            and built[0] == self.new_rows
            and tuple(saved[1:]) == tuple(built[1:])
        )

    def applied(self, saved: np.ndarray, built: np.ndarray) -> np.ndarray:
        """`built` with each kept id's row from `saved`."""
        out = np.array(built, copy=True)
        kept = self.index >= 0
        out[kept] = saved[self.index[kept]]
        return out


class _Plan:
    """What a warm start takes whole, takes row by row and leaves, checked before any of it."""

    def __init__(
        self,
        start: WarmStart,
        prefix: str,
        readers: tuple[Any, Any],
        names: Mapping[str, str],
        places: tuple[Mapping[str, str], Mapping[str, str]],
    ):
        """`readers`: of the checkpoint and of the model's own values; `names`: variable name
        -> checkpoint key; `places`: (`row_ids` table -> its path, the name of a Keras
        optimizer's slot of a table's variable -> the table)."""
        tables, self.slots = places
        self.prefix, self.patterns = prefix, start.variables
        source, target = readers
        saved_shapes, built_shapes = (
            _named(names, source.get_variable_to_shape_map()),
            _named(names, target.get_variable_to_shape_map()),
        )
        saved_types, built_types = (
            _named(names, source.get_variable_to_dtype_map()),
            _named(names, target.get_variable_to_dtype_map()),
        )
        shared = sorted(set(saved_shapes) & set(built_shapes))
        self._check_patterns(shared)
        self.rows = {table: _RowMap(*start.row_ids[table]) for table in tables}
        self.taken: list[str] = []
        self.remapped: dict[str, str] = {}
        chosen = [
            name
            for name in shared
            if any(re.fullmatch(p, name) for p in self.patterns) and not _SETTING.search(name)
        ]
        for name in chosen:
            if saved_types[name] != built_types[name]:
                raise ValueError(
                    f"WarmStart cannot take {name!r}: {prefix} holds it as "
                    f"{saved_types[name].name}, this model as {built_types[name].name}. Leave "
                    "it out of the variables patterns."
                )
            self._place(name, saved_shapes[name], built_shapes[name], tables)
        for table in tables:
            if table not in self.remapped.values():
                raise ValueError(
                    f"WarmStart row_ids names the table {table!r}, and the variables "
                    f"patterns take none of its rows from {prefix} ({self.rows[table].old_rows}"
                    f" ids there, {self.rows[table].new_rows} here); add a pattern for them, "
                    "or drop the table from row_ids."
                )
        self.left = sorted(set(built_shapes) - set(self.taken) - set(self.remapped))
        self.continues = start.continues
        if self.continues:
            self._check_all_taken()
        key = names.get("global_step")
        self.step = (
            int(source.get_tensor(key)) if key in source.get_variable_to_shape_map() else None
        )

    def _check_all_taken(self) -> None:
        """Refuses a continuation that leaves a variable other than a learning rate."""
        missing = [name for name in self.left if not _SETTING.search(name)]
        if missing:
            raise ValueError(
                f"WarmStart.continuation takes every variable of the model, and "
                f"{self.prefix} holds no value of this model's {_listed(missing)} (or one of "
                "another shape): it was trained by another model. Continue a run of this "
                "model, or take the variables the two share with a warm start's patterns."
            )

    def _check_patterns(self, shared: Sequence[str]) -> None:
        """Refuses a pattern that matches none of the `shared` names."""
        for pattern in self.patterns:
            if not any(re.fullmatch(pattern, name) for name in shared):
                raise ValueError(
                    f"WarmStart variables pattern {pattern!r} matches no variable that both "
                    f"{self.prefix} and this model hold ({_listed(shared)}); fix the "
                    "pattern, matched against each whole name."
                )

    def _place(self, name: str, saved: Sequence[int], built: Sequence[int], tables) -> None:
        """Takes `name` whole, or row by row when it holds a row a row of a `row_ids` table.

        Raises:
            ValueError: its shapes differ otherwise, naming both and the fix.
        """
        table = self.slots.get(name) or next(
            (t for t, path in tables.items() if name.startswith(path + "/")), None
        )
        if table is not None and self.rows[table].fits(saved, built):
            self.remapped[name] = table
            return
        if list(saved) == list(built):
            self.taken.append(name)
            return
        fix = (
            f"its table {table!r} has {self.rows[table].old_rows} ids there and "
            f"{self.rows[table].new_rows} here in row_ids: give each run's ids"
            if table
            else "give row_ids for the table it belongs to"
        )
        raise ValueError(
            f"WarmStart cannot take {name!r}: {self.prefix} holds it of shape {list(saved)}, "
            f"this model of shape {list(built)}; {fix}, or leave it out of the variables "
            "patterns."
        )

    def report(self) -> dict[str, Any]:
        """What results.json records as `warm_start`."""
        remapped = {}
        for table, rows in self.rows.items():
            remapped[table] = {
                "variables": sorted(name for name, t in self.remapped.items() if t == table),
                "rows": rows.new_rows,
                "kept": rows.kept,
                "new": rows.new_rows - rows.kept,
                "dropped": rows.old_rows - rows.kept,
            }
        return {
            "checkpoint": self.prefix,
            "variables": list(self.patterns),
            "taken": sorted(self.taken),
            "remapped": remapped,
            "left": self.left,
            "continues": self.continues,
            "step": self.step,
        }


def _named(names: Mapping[str, str], by_key: Mapping[str, Any]) -> dict[str, Any]:
    """By variable name: the entries of a checkpoint's key map that `names` names."""
    return {name: by_key[key] for name, key in names.items() if key in by_key}


def _variable_names(
    root: tf.train.Checkpoint, items: Mapping[str, Any], row_ids: Mapping[str, Any]
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(variable name -> its checkpoint key, `row_ids` table name -> its path, a Keras
    optimizer slot's name -> the table of its variable: `_slot_tables`).

    A checkpoint keys an object by the first path to it in one breadth-first walk from the
    root over every item at once (so a model's dense kernel is keyed by the optimizer's
    shorter path to it); a name is its path in a walk of each item in turn, breadth first.

    Raises:
        ValueError: a `row_ids` table name that no table has, or two tables have.
    """
    view = tf.train.TrackableView(root)
    keys = _walk(view, [((), root)], {})
    paths: dict[int, tuple[tuple[str, ...], Any]] = {}
    for item in items:
        _walk(view, [((item,), getattr(root, item))], paths)
    names = {
        "/".join(path): "/".join(keys[key][0]) + VALUE_SUFFIX
        for key, (path, _) in paths.items()
        if key in keys
    }
    layers: dict[str, list[str]] = collections.defaultdict(list)
    for path, found in paths.values():
        # A layer of variables with a row an id: a table (loops.EmbeddingTable, a keras
        # Embedding), or a Dense layer over ids (a rating model's implicit factors).
        if _holds_rows(found):
            layers[found.name].append("/".join(path))
    tables = {}
    for table in row_ids:
        where = layers.get(table, [])
        if len(where) != 1:
            raise ValueError(
                f"WarmStart row_ids names the table {table!r}, and "
                + ("no table here has that name" if not where else f"{len(where)} tables have it")
                + f" (the layers of variables: {_listed(sorted(layers))}); name a table of "
                "this model once."
            )
        tables[table] = where[0]
    return names, tables, _slot_tables(paths, tables)


def _slot_tables(
    paths: Mapping[int, tuple[tuple[str, ...], Any]], tables: Mapping[str, str]
) -> dict[str, str]:
    """Each Keras optimizer slot of a `tables` table's variable, by its name: the slot's
    path -> the table, as if it were under the table (a keras Embedding trained by the
    model's optimizer keeps its slots in the optimizer, a row a row all the same)."""
    owners = {}  # the name start of a table variable's slots -> (its shape, its table)
    for path, found in paths.values():
        joined = "/".join(path)
        for table, where in tables.items():
            if joined.startswith(where + "/") and _is_variable(found):
                owners[keras_private.slot_name_start(found)] = (tuple(found.shape), table)
    slots = {}
    for path, found in paths.values():
        name = getattr(found, "name", None)
        if not (_is_variable(found) and isinstance(name, str)):
            continue
        for start, (shape, table) in owners.items():
            if name.startswith(start) and tuple(found.shape) == shape:
                slots["/".join(path)] = table
    return slots


def _is_variable(found: Any) -> bool:
    return isinstance(found, (tf.Variable, keras.Variable))


def _holds_rows(found: Any) -> bool:
    """Whether `row_ids` may name `found`: a layer that holds variables, not a whole model."""
    if not isinstance(found, keras.layers.Layer) or isinstance(found, keras.Model):
        return False
    return hasattr(found, "embeddings") or bool(found.weights)


def _walk(view, starts, paths: dict) -> dict[int, tuple[tuple[str, ...], Any]]:
    """`paths` (object id -> (path, object)) with every object reached from `starts` (pairs
    of a path and an object) that it lacks, each by its first path breadth first."""
    waiting: collections.deque[Any] = collections.deque()
    for path, start in starts:
        if id(start) not in paths:
            paths[id(start)] = (path, start)
            waiting.append(start)
    while waiting:
        parent = waiting.popleft()
        for name, child in view.children(parent).items():
            if id(child) not in paths:
                paths[id(child)] = ((*paths[id(parent)][0], name), child)
                waiting.append(child)
    return paths


def _listed(names: Sequence[str]) -> str:
    """Up to `_SHOWN` of `names`, for an error."""
    if not names:
        return "none"
    shown = ", ".join(names[:_SHOWN])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _SHOWN else "")
