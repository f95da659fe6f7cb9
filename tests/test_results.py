"""results.json and TensorBoard record the run: its configuration, versions and every evaluation."""

import glob
import json
import os

import keras
import tensorflow as tf

import loops
from conftest import read_results, tiny_batches

CONFIG = {"learning_rate": 0.002, "optimizer": "sgd", "global_batch_size": 8, "clip_norm": None}


def make_loop(model_dir):
    def model_fn():
        return keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Rescaling(1 / 255),
                keras.layers.Flatten(),
                keras.layers.Dense(10, kernel_initializer=keras.initializers.GlorotUniform(seed=3)),
            ]
        )

    return loops.Trainer(
        loops.ClassifierLoop(
            model_fn=model_fn, optimizer_fn=lambda: keras.optimizers.SGD(CONFIG["learning_rate"])
        ),
        strategy=loops.testing.replica_strategy(2),
        train_data=tiny_batches(),
        eval_data=tiny_batches(),
        steps_per_loop=2,
        eval_every=2,
        model_dir=model_dir,
        progress=loops.testing.quiet_progress(),
        record=CONFIG,
    )


def test_results_hold_the_config_versions_history_and_plain_numbers(tmp_path):
    loop = make_loop(str(tmp_path))
    loop.train(4)
    loop.close()
    results = read_results(str(tmp_path))
    assert results["config"] == CONFIG
    assert results["versions"]["tensorflow"] == tf.__version__
    assert results["versions"]["keras"] == keras.__version__
    assert {"python", "numpy", "loops"} <= set(results["versions"])
    # Counts are integers and a float32 rate reads as the number it was set to.
    # The last inner loop: the epoch's 5-row tail and a full batch of 8.
    assert results["train"]["num_examples"] == 13 and isinstance(
        results["train"]["num_examples"], int
    )
    assert results["train"]["nonfinite"] == 0 and isinstance(results["train"]["nonfinite"], int)
    assert results["train"]["learning_rate"] == 0.002
    assert [entry["step"] for entry in results["history"]] == [2, 4]
    assert results["history"][-1] == {"step": 4, **results["eval"]}
    assert results["eval"]["num_examples"] == 21

    # A resumed run continues the history.
    loop = make_loop(str(tmp_path))
    loop.train(6)
    loop.close()
    history = read_results(str(tmp_path))["history"]
    assert [entry["step"] for entry in history] == [2, 4, 6]


def test_tensorboard_gets_an_hparams_summary_of_the_config(tmp_path):
    loop = make_loop(str(tmp_path))
    loop.train(2)
    loop.close()
    (events,) = glob.glob(os.path.join(str(tmp_path), "summaries", "events.out.tfevents.*"))
    plugins = {}
    for event in tf.compat.v1.train.summary_iterator(events):
        for value in event.summary.value:
            plugins[value.metadata.plugin_data.plugin_name] = value.metadata.plugin_data.content
    assert "hparams" in plugins
    from tensorboard.plugins.hparams import plugin_data_pb2

    data = plugin_data_pb2.HParamsPluginData.FromString(plugins["hparams"])
    recorded = {
        name: json.loads(
            json.dumps(value.number_value if value.HasField("number_value") else value.string_value)
        )
        for name, value in data.session_start_info.hparams.items()
    }
    assert recorded == {
        "learning_rate": 0.002,
        "optimizer": "sgd",
        "global_batch_size": 8.0,
        "clip_norm": "None",
    }
    assert data.session_start_info.group_name or data.session_start_info.start_time_secs > 0


def test_progress_comes_at_least_every_progress_every_seconds():
    lines = []
    progress = loops.testing.quiet_progress()
    progress.line = lines.append
    loop = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=lambda: keras.Sequential(
                [keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)]
            ),
            optimizer_fn=lambda: keras.optimizers.SGD(0.01),
        ),
        strategy=loops.testing.replica_strategy(1),
        train_data=tiny_batches(),
        steps_per_loop=5,
        progress=progress,
        progress_every_seconds=1e-9,
    )
    loop.train(8)
    # The first inner loop runs its 5 steps; every later one is cut to 1 step, so that
    # a line comes within (an impossibly short) 1e-9 s after each step.
    assert [line.split(" |")[0] for line in lines] == [
        "step 5/8",
        "step 6/8",
        "step 7/8",
        "step 8/8",
    ]
