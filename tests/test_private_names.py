"""No module of loops names a private TensorFlow or Keras name except the two adapters that
hold them (`loops.tf_private`, `loops.keras_private`), each held by its own test: a new private
name cannot creep in where no test would see TensorFlow or Keras rename it."""

import ast
import pathlib
import re

from loops import keras_private, tf_private

LOOPS = pathlib.Path(__file__).resolve().parent.parent / "loops"
ADAPTERS = {LOOPS / "tf_private.py", LOOPS / "keras_private.py"}
PRIVATE = re.compile(r"^_[A-Za-z]\w*$")  # `_name`, not a dunder
# Private packages of TensorFlow and Keras, named by an import.
PRIVATE_PACKAGES = ("tensorflow.python", "tensorflow.compiler", "tensorflow.core", "keras.src")
# Private names of the standard library loops calls (os._exit, through ctypes' libc too;
# atexit._run_exitfuncs, which a finished binary runs before os._exit: tests/test_process_exit.py
# sees its handlers run).
STANDARD_LIBRARY = {"_exit", "_run_exitfuncs"}


def sources() -> dict[pathlib.Path, ast.Module]:
    return {path: ast.parse(path.read_text()) for path in sorted(LOOPS.rglob("*.py"))}


def names_loops_defines(trees) -> set[str]:
    """Every name a module of loops defines: functions, classes, arguments, assigned names and
    attributes of its own objects (`self._x = ...`, `_X = ...`)."""
    defined = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if dotted(node.value) in (["self"], ["cls"]):
                    defined.add(node.attr)
            elif isinstance(node, ast.alias):
                defined.add((node.asname or node.name).split(".")[0])
    return defined


def dotted(node: ast.AST) -> list[str]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return parts[::-1]


def is_a_name(constant: ast.Constant, parent: ast.AST) -> bool:
    """Whether a string like "_x" stands for a name, not a piece of one (an f-string's text,
    a suffix cut off or tested)."""
    if isinstance(parent, (ast.JoinedStr, ast.BinOp)):
        return False
    if isinstance(parent, ast.Call) and constant in parent.args:
        function = dotted(parent.func)[-1:]
        return function not in (["len"], ["endswith"], ["startswith"], ["removesuffix"])
    return True


def private_names_in(tree: ast.Module, own: set[str]) -> list[str]:
    """Where `tree` names something private of TensorFlow or Keras: `line: what`. A name
    that starts with `_loops` is loops' own mark on an object of theirs."""
    found = []
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    own = own | STANDARD_LIBRARY
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules.append(node.module)
                modules += [f"{node.module}.{alias.name}" for alias in node.names]
            found += [f"{line}: import {m}" for m in modules if m.startswith(PRIVATE_PACKAGES)]
        elif isinstance(node, ast.Attribute):
            chain = dotted(node)
            if chain[:1] in (["tf"], ["keras"], ["tensorflow"]) and any(
                part.startswith("_") for part in chain[1:]
            ):
                found.append(f"{line}: {'.'.join(chain)}")
            elif PRIVATE.match(node.attr) and node.attr not in own:
                found.append(f"{line}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value
            if PRIVATE.match(name) and name not in own and not name.startswith("_loops"):
                if is_a_name(node, parents[node]):
                    found.append(f"{line}: {name!r}")
    return sorted(found, key=lambda place: int(place.split(":")[0]))


def test_no_module_but_the_adapters_names_a_private_tensorflow_or_keras_name():
    trees = sources()
    own = names_loops_defines(tree for path, tree in trees.items() if path not in ADAPTERS)
    found = {
        str(path.relative_to(LOOPS.parent)): private_names_in(tree, own)
        for path, tree in trees.items()
        if path not in ADAPTERS
    }
    assert {path: names for path, names in found.items() if names} == {}


def test_the_names_the_adapters_hold_appear_in_no_other_module():
    held = [
        tf_private.COLLECTIVE_KEY_BASE,
        tf_private.DEFAULT_STRATEGY_CLASS,
        tf_private.INPUT_WORKER_DEVICES,
        tf_private.ITERATOR_RESOURCE,
        tf_private.PARAMETER_SERVER_WORKERS,
        tf_private.RUN_WITHOUT_COORDINATOR,
        tf_private.ONEDNN_ENABLED[0].rsplit(".", 1)[1],
        ".".join(tf_private.SHARDED_VARIABLE),
        ".".join(tf_private.TRACKABLE),
        *tf_private.SAVE_AND_RESTORE,
        tf_private.VARIABLE_VALUE_KEY[0],
        tf_private.SAVE_SPEC[0],
        tf_private.PLAIN_VARIABLE[0],
        tf_private.AUTOGRAPH_RULES[0],
        ".".join(tf_private.AUTOGRAPH_AS_CALLER[:2]),
        keras_private.KERAS_VARIABLE_COPY[2],
        keras_private.OPTIMIZER_RATE_ATTRIBUTE,
        keras_private.OPTIMIZER_VARIABLE_INDEX,
        keras_private.ADAGRAD_ACCUMULATORS,
        keras_private.LAYER_WALK,
    ]
    assert "_num_workers" in held and "_accumulators" in held
    texts = {
        str(path.relative_to(LOOPS.parent)): path.read_text()
        for path in sorted(LOOPS.rglob("*.py"))
        if path not in ADAPTERS
    }
    named = {
        path: [name for name in held if re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text)]
        for path, text in texts.items()
    }
    assert {path: names for path, names in named.items() if names} == {}


def test_the_check_finds_each_kind_of_private_name():
    source = """
import tensorflow.python.util
from keras.src.backend import core
strategy.extended._allow_run_without_coordinator = True
getattr(optimizer, "_accumulators")
tf.__internal__.distribute.ShardedVariable
self._mine = 1
self._mine.numpy()
os._exit(1)
_MARK = "_loops_mark"
name.endswith("_per_second") and f"{name}_per_second"
{"_DefaultDistributionStrategy": "default"}
"""
    own = names_loops_defines([ast.parse(source)])
    assert private_names_in(ast.parse(source), own) == [
        "2: import tensorflow.python.util",
        "3: import keras.src.backend",
        "3: import keras.src.backend.core",
        "4: ._allow_run_without_coordinator",
        "5: '_accumulators'",
        "6: tf.__internal__.distribute.ShardedVariable",
        "6: tf.__internal__.distribute",
        "6: tf.__internal__",
        "12: '_DefaultDistributionStrategy'",
    ]
