"""What a new user meets first: --help, flag errors before TensorFlow loads, a quiet console,
the installed names, and the defaults and records of the binaries."""

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from absl import app, flags
from absl.testing import flagsaver

from conftest import ROOT, SUBPROCESS_ENV, read_results
from loops.bin import classifier as classifier_binary
from loops.cli import application, tensorflow_logs
from loops.cli import flags as loop_flags
from loops.model_dir import run_outputs
from loops.vocabulary.choices import STRATEGY_NAMES

BINARIES = ("classifier", "gan", "rl", "lm", "recommender", "ctr")
CONSOLE_SCRIPTS = {
    "classifier": "loops-classifier",
    "gan": "loops-gan",
    "rl": "loops-rl",
    "lm": "loops-lm",
    "recommender": "loops-recommender",
    "ctr": "loops-ctr",
}
DEFAULT_LEARNING_RATES = {
    "classifier": 0.002,
    "gan": 0.002,
    "rl": 0.001,
    "lm": 0.003,
    "recommender": 0.003,
    "ctr": 0.002,
}

# Runs in a fresh process: defines a binary's flags, asks its parser for --help
# and for every enum and float flag with a bad value, and reports what each
# answered and whether TensorFlow got imported.
PROBE = textwrap.dedent("""
    import contextlib, io, json, sys
    from absl import flags
    from loops.cli import flags as loop_flags
    import loops.bin.{binary} as binary

    def answer(*argv):
        stdout = io.StringIO()
        try:
            with contextlib.redirect_stdout(stdout):
                loop_flags.parse_flags(["prog", *argv], description=binary.__doc__)
        except SystemExit as exit:
            return {{"code": exit.code, "stdout": stdout.getvalue()}}
        finally:
            flags.FLAGS.unparse_flags()
        return {{"code": None, "stdout": stdout.getvalue()}}

    names = loop_flags.binary_flag_names()
    kinds = {{name: type(flags.FLAGS[name].parser).__name__ for name in names}}
    report = {{
        "names": names,
        "help": answer("--help"),
        "typos": {{name: {{**answer(f"--{{name}}=bogus"),
                         "allowed": list(flags.FLAGS[name].parser.enum_values)}}
                  for name in names if kinds[name] == "EnumParser"}},
        "floats": {{name: {{value: answer(f"--{{name}}={{value}}")
                            for value in ("inf", "-inf", "nan")}}
                   for name in names if kinds[name] == "FloatParser"}},
        "tensorflow_imported": "tensorflow" in sys.modules,
    }}
    print(json.dumps(report))
""")


@pytest.fixture(scope="module", params=BINARIES)
def probe(request):
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(binary=request.param)],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return request.param, json.loads(done.stdout)


def test_help_lists_every_own_flag_under_its_heading_without_tensorflow(probe):
    binary, report = probe
    help_text = report["help"]["stdout"]
    assert report["help"]["code"] == 0
    assert len(report["names"]) >= 25
    for name in report["names"]:
        assert re.search(rf"^  --{name} \([a-z ]+, default: [^)]+\)$", help_text, re.M), name
    assert help_text.count("\n  --") == len(report["names"])  # nothing but its own flags
    headings = re.findall(r"^([a-z]+):$", help_text, re.M)
    assert headings == [
        *(heading for heading in loop_flags.HEADINGS if heading in headings),
        "logging",
    ]
    assert {"strategy", "data", "training", "outputs", "faults"} <= set(headings)
    assert "--test_tmpdir" not in help_text and "--tpu" not in help_text
    assert not report["tensorflow_imported"]


def test_a_typo_in_an_enum_flag_names_the_allowed_values_without_tensorflow(probe):
    binary, report = probe
    assert "strategy" in report["typos"]
    for name, answer in report["typos"].items():
        assert answer["code"].splitlines()[0] == (
            f"error: flag --{name}=bogus: value should be one of <{'|'.join(answer['allowed'])}>"
        )
    assert report["typos"]["strategy"]["allowed"] == list(STRATEGY_NAMES)
    assert not report["tensorflow_imported"]


def test_every_float_flag_refuses_values_that_are_not_finite(probe):
    binary, report = probe
    assert "learning_rate" in report["floats"]
    for name, answers in report["floats"].items():
        for value, answer in answers.items():
            assert answer["code"].startswith(f"error: flag --{name}={value}: "), (name, value)
    assert report["floats"]["learning_rate"]["inf"]["code"].splitlines()[0] == (
        "error: flag --learning_rate=inf: inf is not a finite number; pass a finite "
        f"--learning_rate, e.g. --learning_rate={DEFAULT_LEARNING_RATES[binary]}."
    )
    assert report["floats"]["learning_rate"]["nan"]["code"].startswith(
        "error: flag --learning_rate=nan: nan is not a finite number"
    )


@pytest.mark.parametrize("binary", BINARIES)
def test_console_script_and_module_give_the_same_help(binary):
    script = os.path.join(os.path.dirname(sys.executable), CONSOLE_SCRIPTS[binary])
    by_script = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    by_module = subprocess.run(
        [sys.executable, "-m", f"loops.bin.{binary}", "-h"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert by_script.returncode == by_module.returncode == 0, by_script.stderr + by_module.stderr
    assert by_script.stdout == by_module.stdout
    assert "\n  --train_steps (int, default: " in by_script.stdout


def test_installed_distribution_has_only_the_projects_top_level_names():
    from importlib import metadata

    distribution = metadata.distribution("loops")
    assert sorted(distribution.read_text("top_level.txt").split()) == [
        "loops",
        "loops_data",
        "loops_models",
    ]
    import loops_data
    import loops_models

    assert os.path.dirname(loops_data.__file__) == os.path.join(ROOT, "data")
    assert os.path.dirname(loops_models.__file__) == os.path.join(ROOT, "models")


def test_a_default_run_from_a_directory_with_its_own_data_and_models_is_quiet_and_recorded(
    tmp_path, digits_dir
):
    # A user's own packages with the examples' old names: importing either fails the run.
    for name in ("data", "models"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ImportError('the binary imported the user\\'s own {name} package')\n"
        )
    model_dir = str(tmp_path / "run")
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONPATH")
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loops.bin.classifier",
            "--train_steps=10",
            "--steps_per_loop=2",
            f"--data_dir={digits_dir}",
            f"--model_dir={model_dir}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert not re.search(r"^[IWEF]\d{4} ", output, re.M), output
    for noise in ("oneDNN custom operations", "cuInit", "cpu_feature_guard", "absl::InitializeLog"):
        assert noise not in output
    # Unset --eval_every: 10 steps / 5 evaluations, in whole inner loops of 2.
    evaluations = re.findall(r"^eval at step (\d+) ", done.stdout, re.M)
    assert evaluations == ["2", "4", "6", "8", "10"]
    results = read_results(model_dir)
    assert results["num_replicas"] == 2  # mirrored on a machine without GPUs
    config = results["config"]
    assert sorted(config) == sorted(loop_flags.binary_flag_names())
    assert config["train_steps"] == 10 and config["steps_per_loop"] == 2
    assert config["strategy"] == "mirrored" and config["learning_rate"] == 0.002
    assert config["num_replicas"] is None and config["eval_every"] is None
    assert config["model_dir"] == model_dir and config["batch_norm"] is False


@pytest.mark.parametrize("quiet", [True, False])
def test_importing_tensorflow_quietly_holds_back_only_its_log_lines(quiet):
    env = {key: value for key, value in SUBPROCESS_ENV.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    code = (
        "import sys; from loops.cli import tensorflow_logs; "
        f"tensorflow_logs.import_tensorflow(quiet={quiet}); "
        # Keras skipped its optional integrations; they import as usual afterwards.
        "print('SKIPPED', [n for n in tensorflow_logs.KERAS_OPTIONAL_IMPORTS if n in sys.modules]);"
        "import keras, sklearn.datasets, matplotlib.pyplot; "
        "print('IMPORTED', keras.layers.Dense(2).units, sklearn.datasets.load_digits().data.shape,"
        " matplotlib.pyplot.figure().number); "
        "print('from python', file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    log_lines = re.findall(r"^[IWEF]\d{4} .*$", done.stderr, re.M)
    # This machine has no GPU: TensorFlow logs at least its missing CUDA drivers.
    assert (len(log_lines) == 0) == quiet, done.stderr
    assert done.stderr.splitlines()[-1] == "from python"
    assert done.stdout.splitlines() == ["SKIPPED []", "IMPORTED 2 (1797, 64) 1"]


def test_log_line_filter_keeps_everything_else():
    kept = [
        "step 4/20 | loss 2.256\n",
        "Traceback (most recent call last):\n",
        "  I0000 is not at the start\n",
        "UserWarning: something\n",
    ]
    dropped = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
        "I0000 00:00:1795530023.815669    1325 port.cc:153] oneDNN custom operations are on.\n",
        "E0000 00:00:1795530031.425990    1325 cuda_platform.cc:52] failed call to cuInit\n",
        "W1124 14:26:29.528507 140479367265152 foo.py:423] a warning\n",
    ]
    assert [line for line in kept + dropped if not tensorflow_logs._is_tensorflow_log(line)] == kept


def test_a_lost_parameter_server_worker_is_one_log_line_naming_it():
    import logging

    import tensorflow as tf
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    # The format held here is the one TensorFlow's coordinator logs a lost worker with.
    source = inspect.getsource(cluster_coordinator)
    assert f'"{tensorflow_logs.COORDINATOR_WORKER_FAILED}"' in source
    error = tf.errors.UnavailableError(
        None,
        None,
        "Failed copying input tensor from /job:chief/replica:0/task:0/device:CPU:0\n"
        "Additional GRPC error information from remote target /job:worker/replica:0/task:1\n"
        ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect"}',
    )
    logger = logging.getLogger("test_cli.tensorflow")
    tensorflow_logs.one_line_worker_losses(logger)
    tensorflow_logs.one_line_worker_losses(logger)  # once, however often it is asked
    assert len(logger.filters) == 1
    records = []
    logger.addHandler(type("Keep", (logging.Handler,), {"emit": lambda _, r: records.append(r)})())
    logger.propagate = False
    device = "/job:worker/replica:0/task:1/device:CPU:0"
    logger.error(tensorflow_logs.COORDINATOR_WORKER_FAILED, device, error, error)
    # A worker SIGKILLed mid-closure can surface as any class: the line names none.
    logger.error(tensorflow_logs.COORDINATOR_WORKER_FAILED, device, TypeError("x"), "x")
    logger.error("Another error: %s", "kept as it is")
    lost = (
        "lost worker_1: it stopped answering (its process died or its host went down); "
        "training goes on, its closures run on the other workers"
    )
    assert [record.getMessage() for record in records] == [
        lost,
        lost,
        "Another error: kept as it is",
    ]


def test_a_lost_server_is_said_once_before_the_chiefs_sentence_not_per_closure():
    import logging

    import tensorflow as tf
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    source = inspect.getsource(cluster_coordinator)
    assert tensorflow_logs.COORDINATOR_CLOSURE_FAILED.replace("\n", "\\n") in source
    assert f'"{tensorflow_logs.COORDINATOR_CANCELLING}"' in source
    error = tf.errors.UnavailableError(None, None, "Graph execution error:\n\nGRPC details")
    logger = logging.getLogger("test_cli.tensorflow.servers")
    tensorflow_logs.one_line_worker_losses(logger)
    records = []
    logger.addHandler(type("Keep", (logging.Handler,), {"emit": lambda _, r: records.append(r)})())
    logger.propagate = False
    failed = tensorflow_logs.COORDINATOR_CLOSURE_FAILED + "It is treated as a transient failure."
    for task in (0, 1, 0, 1):  # before: four lines of "UnavailableError(): Graph execution error:"
        logger.error(failed, f"/job:worker/replica:0/task:{task}/device:CPU:0", error, error)
    logger.error(tensorflow_logs.COORDINATOR_CANCELLING, error, error)
    assert [record.getMessage() for record in records] == [
        "worker_0 could not reach a parameter server; its closures are retried (said once: a "
        "server lost for good stops the run at its next step, naming it)"
    ]


@pytest.mark.parametrize(
    "argv, replicas",
    [
        ([], 2),
        (["--strategy=central_storage"], 2),
        (["--strategy=multi_worker_mirrored"], 1),
        (["--strategy=one_device"], 1),
        (["--strategy=parameter_server"], 1),
        (["--num_replicas=3"], 3),
        (["--strategy=default", "--num_replicas=4"], 4),
    ],
)
def test_num_replicas_defaults_by_strategy(argv, replicas):
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["loops-classifier", *argv])
        assert loop_flags.num_replicas() == replicas


@pytest.mark.parametrize(
    "argv, every",
    [
        ([], 100),  # 600 steps, inner loops of 100: 6 evaluations
        (["--train_steps=8000", "--steps_per_loop=500"], 1500),
        (["--train_steps=20"], 100),  # one inner loop: only the end
        (["--train_steps=250", "--steps_per_loop=10"], 50),
        (["--eval_every=7"], 7),
        (["--eval_every=0"], None),
    ],
)
def test_eval_every_defaults_to_about_five_evaluations_of_whole_inner_loops(argv, every):
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["loops-classifier", *argv])
        assert loop_flags.eval_every() == every


def test_an_export_dir_without_a_saved_model_is_refused_before_training(tmp_path):
    export_dir = tmp_path / "results"
    export_dir.mkdir()
    (export_dir / "notes.txt").write_text("keep me")
    model_dir = tmp_path / "run"
    with flagsaver.flagsaver(), pytest.raises(app.UsageError) as raised:
        flags.FLAGS.unparse_flags()
        classifier_binary.main(
            flags.FLAGS(
                ["loops-classifier", f"--export_dir={export_dir}", f"--model_dir={model_dir}"]
            )
        )
    assert str(raised.value) == (
        f"--export_dir={export_dir} exists and holds no SavedModel, so the export at the end "
        "would have to replace it; pass a new directory (or an earlier export) as "
        "--export_dir, or move that one away."
    )
    assert not model_dir.exists()
    assert (export_dir / "notes.txt").read_text() == "keep me"


def test_an_export_dir_holding_an_earlier_export_passes_the_check(tmp_path):
    (tmp_path / "saved_model.pb").write_bytes(b"")
    model_dir = tmp_path / "run"
    # This run's earlier export: its marker names the model_dir.
    (tmp_path / run_outputs.EXPORT_MARKER).write_text(os.path.realpath(model_dir) + "\n")
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        # Parsed in this test alone.
        flags.FLAGS(["loops-classifier", f"--export_dir={tmp_path}", f"--model_dir={model_dir}"])
        application.check_export_dir()
