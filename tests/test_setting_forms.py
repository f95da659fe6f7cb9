"""Every declared setting of every binary is accepted in its documented form: the example its
help gives (e.g. --image_size=32,32), else a value generated from its declaration, parsed by
the flag the binary defines, passes the one check and is what the run records (results.json's
config, config.json) and restarts from. A new declaration is covered without a new test."""

import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf
from absl import flags

import loops
from conftest import ROOT, SUBPROCESS_ENV, read_results
from loops.bin import binary_flags
from loops.cli import config_json
from loops.cli import flags as loop_flags
from loops.vocabulary import settings

# What a test's HOME holds for the --data example (README's MovieLens command): a log
# of 14 items (user, item, rating, timestamp).
DATA_EXAMPLE = ".cache/loops/movielens/ml-100k.inter"
LOG_ROWS = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"] + [
    f"{user + 1}\t{(user * 5 + item) % 14 + 1}\t{1 + (user + item) % 5}\t{100 + item}"
    for user in range(6)
    for item in range(9)
]


def declared(binary):
    """The settings `binary` defines flags of, each with the binary's default."""
    defaults = {**loop_flags.BINARY_DEFAULTS, **binary.defaults}
    return [
        (setting, defaults.get(setting.name, setting.flag_default))
        for setting in (*settings.SETTINGS, *binary.own_settings())
    ]


def example_in_help(setting):
    """VALUE of the help's "e.g. --name=VALUE", or None."""
    match = re.search(rf"[Ee]\.g\. --{setting.name}=(\S+?)[.,;:)]*(?:\s|$)", setting.help)
    return match and match.group(1)


def documented_forms(setting, default):
    """The flag texts `setting` is documented to take: its help's example, else each choice
    of an enum, both bools, a number in its bounds (not the default), a path under ~, a word.
    """
    example = example_in_help(setting)
    if example is not None:
        return [example]
    if setting.kind == "enum":
        return list(setting.choices)
    if setting.kind == "bool":
        return ["true", "false"]
    if setting.kind == "integer":
        number = (default if default is not None else setting.lower_bound or 0) + 1
        if setting.upper_bound is not None and number > setting.upper_bound:
            number = int(setting.upper_bound) - 1
        return [str(int(number))]
    if setting.kind == "float":
        return [repr(default / 2 if default else 0.5)]
    if setting.path:
        return [f"~/{setting.name}"]
    return [f"given_{setting.name}"]


def binary_flag_values(binary):
    """A registry of the flags `binary` defines, made by the code that defines them."""
    values = flags.FlagValues()
    for setting, default in declared(binary):
        loop_flags.define_setting_flag(setting, default, values)
    return values


@pytest.fixture
def home(tmp_path, monkeypatch):
    """HOME is `tmp_path`, which holds the file the --data example names."""
    monkeypatch.setenv("HOME", str(tmp_path))
    log = tmp_path / DATA_EXAMPLE
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(LOG_ROWS) + "\n")
    return str(tmp_path)


def parsed(values, setting, form):
    """The flag's value after `--name=form` alone, every validator run (absl's parse)."""
    values.unparse_flags()
    values(["binary", f"--{setting.name}={form}"])
    return values[setting.name].value


def refusals(binary, home):
    """Each documented form of each of `binary`'s settings that does not go from the command
    line through the check into the record and back, with what went wrong."""
    values = binary_flag_values(binary)
    wrong = []
    for setting, default in declared(binary):
        for form in documented_forms(setting, default):
            flag = f"--{setting.name}={form}"
            try:
                recorded = parsed(values, setting, form)  # results.json's and config.json's
                python_value = setting.value_of_flag(recorded)
                assert setting.checked(python_value) == python_value, "the Python check"
                if setting.name in loops.RunConfig.names():
                    config = loops.RunConfig.from_flat({setting.name: python_value})
                    assert config.flat()[setting.name] == python_value, "RunConfig"
                # --config_json and the evaluator give the recorded value back as the flag.
                again = config_json._as_flag(json.loads(json.dumps(recorded)))
                assert parsed(values, setting, again) == recorded, f"restarted as {again}"
                if setting.path and form.startswith("~/"):
                    assert recorded == os.path.join(home, form[2:]), "~ not expanded"
            except (flags.Error, ValueError, AssertionError) as error:
                wrong.append(f"{binary.command} {flag}: {error}")
    return wrong


@pytest.mark.parametrize("binary", binary_flags.BINARIES, ids=lambda binary: binary.command)
def test_every_setting_is_accepted_in_its_documented_form_and_recorded(binary, home):
    # A setting no generated value fits needs an example in its help: e.g. --name=VALUE.
    assert refusals(binary, home) == []


def test_the_documented_forms_include_each_help_example():
    image_size = binary_flags.CLASSIFIER.own_settings()
    forms = {setting.name: documented_forms(setting, None) for setting in image_size}
    assert forms["image_size"] == ["32,32"] and forms["image_dir"] == ["~/image_dir"]
    assert documented_forms(settings.BY_NAME["profile_steps"], None) == ["10,20"]
    assert documented_forms(settings.BY_NAME["strategy"], "mirrored")[:2] == [
        "default",
        "one_device",
    ]


def test_every_setting_that_names_a_file_or_folder_expands_a_leading_tilde():
    for binary in binary_flags.BINARIES:
        for setting, _ in declared(binary):
            names_a_path = setting.name.endswith("_dir") or setting.name in (
                "data",
                "spec",
                "warm_start_from",
                "continue_from",
            )
            assert setting.path == names_a_path, (binary.command, setting.name)


# ---- A real run: the classifier given every setting in a documented form at once. ----

# The run's shape (short, on a folder of mixed-size images, the issue's --image_size) and
# settings whose documented form names something this run has not (a metric, a split).
RUN = {
    "train_steps": "8",
    "steps_per_loop": "4",
    "eval_every": "4",
    "global_batch_size": "8",
    "learning_rate": "0.01",
    "image_size": "16,16",
    "input_from": "disk",  # --image_size resizes data read from disk
    "on_nonfinite": "recover",  # what --max_recoveries counts
    "mixed_precision": "mixed_float16",  # what --loss_scale_growth_steps applies to
    # Metrics the classifier reports (their help's generated word is none); checkpoints
    # before the first evaluation then hold the actions' "no best value yet".
    "early_stopping_metric": "loss",
    "keep_best_metric": "loss",
}
# Left at their defaults, each with why: it makes another kind of run, or another test's.
LEFT_OUT = {
    "strategy": "the topology: mirrored on 2 CPU replicas (tests/test_strategies.py)",
    "cluster": "where a multi-process strategy's tasks are (tests/test_scheduler_cluster.py)",
    "cluster_port": "a multi-process strategy's (tests/test_scheduler_cluster.py)",
    "cluster_num_ps": "a multi-process strategy's (tests/test_scheduler_cluster.py)",
    "dataset": "another source of data than --image_dir",
    "data_dir": "another source of data than --image_dir",
    "train_split": "the folder's split names are the defaults",
    "eval_split": "the folder's split names are the defaults",
    "run_eagerly": "refused with --jit_compile; debugging (tests/test_loop.py)",
    "jit_compile": "XLA compilation (tests/test_jit_compile.py)",
    "profile_steps": "traces steps 10-20 of a longer run (tests/test_profiling.py)",
}


def run_forms(values):
    """--name=form for each classifier setting: RUN's, else its first documented form that
    is not its default (none for LEFT_OUT), and the value each must be recorded as."""
    given, recorded = [], {}
    for setting, default in declared(binary_flags.CLASSIFIER):
        if setting.name in LEFT_OUT:
            continue
        forms = [RUN[setting.name]] if setting.name in RUN else documented_forms(setting, default)
        for form in forms:
            value = parsed(values, setting, form)
            if value != default:
                given.append(f"--{setting.name}={form}")
                recorded[setting.name] = value
                break
    return given, recorded


def test_the_classifier_records_every_setting_given_in_its_documented_form(home):
    from test_streaming import write_folder  # its images: 12x16, one here 20x16

    image_dir = write_folder(os.path.join(home, "image_dir"), sizes={("train", "dog", 3): (20, 16)})
    given, recorded = run_forms(binary_flag_values(binary_flags.CLASSIFIER))
    assert "--image_dir=~/image_dir" in given and recorded["image_dir"] == image_dir
    assert len(given) == len(declared(binary_flags.CLASSIFIER)) - len(LEFT_OUT)
    done = subprocess.run(
        [sys.executable, "-m", "loops.bin.classifier", *given],
        capture_output=True,
        text=True,
        env=dict(SUBPROCESS_ENV, HOME=home),
        timeout=900,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    model_dir = recorded["model_dir"]
    results = read_results(model_dir)
    assert results["global_step"] == 8 and results["eval"]["num_examples"] == 12
    assert {name: results["config"][name] for name in recorded} == recorded
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as file:
        config = json.load(file)
    assert {name: config[name] for name in recorded} == recorded
    # The export takes the images at the --image_size the mixed sizes were resized to.
    served = tf.saved_model.load(recorded["export_dir"]).signatures["serving_default"](
        images=tf.zeros([2, 16, 16, 3], tf.uint8)
    )
    assert served["probabilities"].shape == (2, 3)


def test_readmes_movielens_command_reads_data_under_home_and_a_long_top_k_names_the_flag(home):
    model_dir = os.path.join(home, "run")
    done = subprocess.run(
        [sys.executable, "-m", "loops.bin.recommender", f"--data=~/{DATA_EXAMPLE}"]
        + ["--top_k=20", f"--model_dir={model_dir}"],
        capture_output=True,
        text=True,
        env=dict(SUBPROCESS_ENV, HOME=home),
        timeout=900,
        cwd=ROOT,
    )
    # The log under ~ is read (its 14 items), and the cut-off is refused in the flag's words.
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"--top_k=20 is more than the 14 items of the log ({os.path.join(home, DATA_EXAMPLE)}), "
        "and the export returns a user's top K of them; pass --top_k=14 or less."
    )
    assert not os.path.exists(model_dir)
