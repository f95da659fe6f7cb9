"""XLA under a strategy: each replica's pass through a `loops.Update`'s trained model compiled.

With `jit_compile`, the Keras model an Update trains runs its `call` as a
`tf.function(jit_compile=True)` while the Update computes a replica's loss
and gradients; TensorFlow compiles the gradient of that call with it, so
each replica's forward and backward pass through the model is one XLA
computation. The replica's loss function around it (which all-reduces the
step's example count), the sum of the gradients over replicas and the
optimizer's update stay TensorFlow's: under MirroredStrategy on CPU a
cross-replica collective inside an XLA computation fails (BUILD.md fact 14),
so a model holding one (synchronized batch normalization) is refused, as are
strategies that keep the variables on another device (central storage,
parameter servers), before any step runs (`check_can_compile`).
XLA's stateless random numbers are not TensorFlow's kernels' (Philox either
way, other streams): dropout keyed by `loops.replica_random` draws other
masks compiled than not, the same on any replica count.

Each call during tracing makes a new compiled function: what it captures
(the replica's variables, keyed random draws) is that replica's, in that
trace, and no trace is shared across replicas or graphs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import keras
import tensorflow as tf

from loops import keras_private
from loops.placement import Placement

# Set while a replica's loss and gradients are computed: MirroredStrategy runs each
# replica's function in a thread of its own.
_compiling = threading.local()
_COMPILED_CALL = "_loops_compiled_call"


def compile_calls(model: keras.Model) -> None:
    """Makes `model`'s calls inside `compiling()` run through XLA (this model only)."""
    if getattr(model, _COMPILED_CALL, False):
        return
    plain_call = model.call

    def call(*args, **kwargs):
        if not getattr(_compiling, "active", False) or not tf.inside_function():
            return plain_call(*args, **kwargs)
        return tf.function(plain_call, jit_compile=True, autograph=False)(*args, **kwargs)

    # On the instance, not the class: other models (and Keras) are untouched.
    object.__setattr__(model, "call", call)
    object.__setattr__(model, _COMPILED_CALL, True)


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """The calls of models given to `compile_calls` compile, in this thread, inside it."""
    outer = getattr(_compiling, "active", False)
    _compiling.active = True
    try:
        yield
    finally:
        _compiling.active = outer


def check_can_compile(model: object, where: Placement) -> None:
    """Raises ValueError, with the fix, where `jit_compile` cannot compile `model` under `strategy`.

    Args:
        model: what a `loops.Update` trains: a Keras model, or a function
            returning its variables (which has no call to compile).
        where: the placement its replicas run under.
    """
    # Central storage's CPU or parameter servers.
    if where.variables_apart_from_replicas:
        raise ValueError(
            f"jit_compile=True compiles each replica's pass through the model, and "
            f"{type(where.strategy).__name__} keeps the variables on another device than the "
            "replica's computation, which an XLA computation cannot read (TensorFlow: "
            "'Trying to access resource ... located in device ...'). Use "
            "--strategy=mirrored (or one_device, default), or set jit_compile=False "
            "(--jit_compile=false)."
        )
    if not isinstance(model, keras.Model):
        raise ValueError(
            f"jit_compile=True compiles the Keras model a loops.Update trains, and this "
            f"Update trains {model!r}, a function returning variables. Pass the Keras model "
            "to loops.Update, or set jit_compile=False (--jit_compile=false)."
        )
    for layer in keras_private.nested_layers(model, include_self=False):
        if not getattr(layer, "supports_jit", True):
            raise ValueError(
                f"jit_compile=True compiles model {model.name!r}, and its layer "
                f"{layer.name!r} ({type(layer).__name__}) says XLA cannot compile it "
                "(supports_jit=False). Replace the layer, or set jit_compile=False "
                "(--jit_compile=false)."
            )
        if where.num_replicas_in_sync > 1 and getattr(layer, "synchronized", False):
            raise ValueError(
                f"jit_compile=True compiles model {model.name!r} on each replica, and its "
                f"layer {layer.name!r} ({type(layer).__name__}, synchronized=True) "
                f"all-reduces across the {where.num_replicas_in_sync} replicas: "
                "TensorFlow cannot compile a cross-replica collective with XLA under "
                "this strategy. Train without synchronized batch normalization "
                "(--batch_norm=false), on 1 replica, or with jit_compile=False "
                "(--jit_compile=false)."
            )
