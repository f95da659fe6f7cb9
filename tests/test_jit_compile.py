"""jit_compile: each replica's pass through the model compiled, exact on any replica count."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
import test_lm
from test_parity import classifier_builder

import loops
from conftest import ROOT, SUBPROCESS_ENV, read_results
from loops import placement
from loops.core import compilation


def classifier(model="mlp", *, jit_compile=True, dropout=0.0, **loop_args):
    # 21 examples: the partial step of 5 is split [3, 2]; no replica is empty (an empty
    # replica needs the Eigen convolutions, BUILD.md fact 17, jit or not).
    return classifier_builder(
        "adam",
        model=model,
        batch_norm=False,
        dropout=dropout,
        examples=21,
        jit_compile=jit_compile,
        **loop_args,
    )


def lm(*, jit_compile=True):
    return lambda strategy: test_lm.build(strategy, jit_compile=jit_compile)


@pytest.mark.parametrize("model, dropout", [("mlp", 0.3), ("cnn", 0.0)])
def test_the_classifier_compiled_keeps_replica_parity(model, dropout):
    runs = loops.testing.assert_replica_parity(
        classifier(model, dropout=dropout), num_steps=5, replica_counts=(1, 2), rtol=1e-5
    )
    np.testing.assert_array_equal(runs[2]["logs"]["num_examples"], [8, 8, 5, 8, 8])


def test_the_language_model_compiled_keeps_replica_parity():
    runs = loops.testing.assert_replica_parity(lm(), num_steps=6, replica_counts=(1, 2), rtol=1e-5)
    assert runs[2]["logs"]["tokens"].tolist() == [53, 60, 25, 53, 60, 25]


# Each model's runs with jit_compile on and off.
BUILDERS = {
    "mlp": lambda jit_compile: classifier("mlp", jit_compile=jit_compile),
    "cnn": lambda jit_compile: classifier("cnn", jit_compile=jit_compile),
    "lm": lambda jit_compile: lm(jit_compile=jit_compile),
}


@pytest.mark.parametrize("model", sorted(BUILDERS))
def test_compiled_and_plain_agree_to_rounding(model):
    # XLA fuses and orders the sums its own way: measured 2e-7 to 1.2e-6 relative on
    # these runs' weights and logs (TF 2.21, oneDNN on); 1e-5 leaves 8x room.
    strategy = loops.testing.replica_strategy(2)
    compiled = loops.testing.train_run(BUILDERS[model](True), strategy, num_steps=5)
    plain = loops.testing.train_run(BUILDERS[model](False), strategy, num_steps=5)
    loops.testing.assert_runs_agree(compiled, plain, rtol=1e-5, label=f"{model}: jit vs plain")


def test_each_replica_runs_its_forward_and_backward_pass_through_xla():
    trainer = classifier()(loops.testing.replica_strategy(2))
    trainer.train(2)
    library = trainer.executor._train_call.graph.as_graph_def().library.function
    compiled = sorted(
        function.signature.name.split("_call")[0]
        for function in library
        if function.attr["_XlaMustCompile"].b
    )
    # Per replica: the forward call (traced once plain for the tape, once with its
    # intermediates as outputs) and its gradient.
    assert compiled == ["__forward"] * 2 + ["__inference"] * 2 + ["__inference___backward"] * 2


def test_dropout_draws_xlas_random_stream():
    # Run by XLA, the stateless uniform draws its own Philox stream (not TensorFlow's
    # kernel's), so the masks differ from plain ones: the ops really ran compiled.
    strategy = loops.testing.replica_strategy(1)
    compiled = loops.testing.train_run(classifier(dropout=0.3), strategy, num_steps=2)
    plain = loops.testing.train_run(
        classifier(dropout=0.3, jit_compile=False), strategy, num_steps=2
    )
    assert abs(compiled["logs"]["loss"][1] - plain["logs"]["loss"][1]) > 1e-3


def test_the_binary_flag_compiles_with_xla(tmp_path, digits_dir):
    model_dir, dump = str(tmp_path / "run"), tmp_path / "xla"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loops.bin.classifier",
            f"--model_dir={model_dir}",
            f"--data_dir={digits_dir}",
            "--jit_compile",
            "--train_steps=4",
            "--steps_per_loop=2",
            "--global_batch_size=32",
        ],
        capture_output=True,
        text=True,
        env=dict(SUBPROCESS_ENV, XLA_FLAGS=f"--xla_dump_to={dump}"),
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(model_dir)
    assert results["config"]["jit_compile"] is True and results["num_replicas"] == 2
    # XLA's own record of what it compiled: each replica's forward pass and its gradient.
    modules = sorted(
        name.split(".")[1].split("_call")[0]
        for name in os.listdir(dump)
        if name.endswith(".before_optimizations.txt")
    )
    assert modules == ["a_forward"] * 2 + ["a_inference___backward"] * 2, modules


def test_synchronized_batch_norm_on_two_replicas_is_refused():
    build = classifier_builder("adam", batch_norm=True, jit_compile=True)
    with pytest.raises(ValueError) as refused:
        build(loops.testing.replica_strategy(2))
    assert "synchronized=True" in str(refused.value)
    assert "all-reduces across the 2 replicas" in str(refused.value)
    assert "--batch_norm=false" in str(refused.value)
    # One replica has nothing to all-reduce: it compiles.
    build(loops.testing.replica_strategy(1)).train(1)


def test_central_storage_is_refused():
    with pytest.raises(ValueError, match="CentralStorageStrategy keeps the variables"):
        classifier()(loops.testing.replica_strategy(2, "central_storage"))


def test_run_eagerly_is_refused():
    with pytest.raises(ValueError, match="run_eagerly=True runs the steps without one"):
        classifier(run_eagerly=True)(loops.testing.replica_strategy(1))


def test_a_layer_keras_does_not_jit_is_refused():
    class Host(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.supports_jit = False

        def call(self, inputs):
            return inputs

    model = keras.Sequential([keras.Input((3,)), Host(), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"supports_jit=False\). Replace the layer"):
        compilation.check_can_compile(
            model, placement.Placement.of(tf.distribute.get_strategy(), "exact")
        )


def test_an_update_of_a_function_is_refused():
    with pytest.raises(ValueError, match="a function returning variables"):
        compilation.check_can_compile(
            lambda: [], placement.Placement.of(tf.distribute.get_strategy(), "exact")
        )
