"""One declaration per setting (loops/vocabulary/settings.py): one default, one check for a
Python value and a flag's, a section of the typed configuration, and whether a resume may
change it."""

import dataclasses
import json
import re
import sys

import pytest

import loops
from conftest import Counter, read_results, run_module, run_python
from loops.bin import config_source
from loops.cli import config_json
from loops.model_dir import run_config
from loops.run.controller_options import ControllerOptions
from loops.vocabulary import run_config_tree, settings
from loops.vocabulary.recorded_settings import RecordedSettingsError, read_recorded_settings

# What a resumed run could change without a warning before the declarations said it.
FREE_TO_CHANGE_BEFORE = {
    "parameter_server_mode",  # exact or async: either continues a run's checkpoint
    "mode",
    "evaluator_timeout",
    "find_lr_steps",
    "find_lr_min_rate",
    "find_lr_max_rate",
    "find_lr_stop_factor",
    "find_lr_loss",
    "find_lr_dir",
    "train_steps",
    "model_dir",
    "export_dir",
    "replace_export",  # since issue 64: which export the run may replace
    "verbosity",
    "eval_every",
    "checkpoint_every",
    "steps_per_loop",
    "max_checkpoints",
    "health_every",
    "max_recoveries",
    "on_loss_spike",
    "loss_spike_factor",
    "loss_spike_steps",
    "loss_spike_window",
    "strategy",
    "num_replicas",
    "cluster",
    "cluster_port",
    "cluster_num_ps",
    "cluster_timeout",
    "allow_batch_size_change",
}


@pytest.mark.parametrize("setting", settings.SETTINGS, ids=lambda setting: setting.name)
def test_the_one_default_passes_the_one_check_as_a_value_and_as_a_flag(setting):
    assert setting.checked(setting.default) == setting.default
    # The flag's default is the same default, spelled as the flag spells it (0 for None).
    assert setting.value_of_flag(setting.flag_default) == setting.default
    if setting.flag_default is not None:
        setting.checked(setting.value_of_flag(setting.flag_default), flag=True)


@pytest.mark.parametrize(
    "setting",
    [setting for setting in settings.SETTINGS if setting.kind == "bool"],
    ids=lambda setting: setting.name,
)
def test_every_bool_setting_refuses_what_is_not_a_bool(setting):
    with pytest.raises(ValueError) as refused:
        setting.checked("no")
    assert str(refused.value) == f"{setting.name} must be True or False, got 'no'."


def test_an_async_checkpoints_that_is_no_bool_is_refused_by_the_run_options():
    with pytest.raises(ValueError, match="async_checkpoints must be True or False, got 'no'"):
        ControllerOptions(async_checkpoints="no")


@pytest.mark.parametrize(
    "name, flag_value, python_value",
    [("ema_decay", 0.0, None), ("health_every", 0, None), ("progress_every_seconds", 0.0, None)],
)
def test_a_flags_off_value_is_the_python_none_not_a_second_default(name, flag_value, python_value):
    setting = settings.BY_NAME[name]
    assert setting.default is None and setting.flag_default == flag_value
    assert setting.value_of_flag(flag_value) is python_value


def test_one_check_words_its_sentence_for_a_flag_and_for_a_keyword():
    decay = settings.BY_NAME["ema_decay"]
    with pytest.raises(ValueError, match=r"^--ema_decay must be in \[0, 1\), e\.g\. 0\.999"):
        decay.checked(decay.value_of_flag(1.0), flag=True)
    with pytest.raises(ValueError, match=r"^ema_decay must be in \(0, 1\).*got 1\.0"):
        decay.checked(1.0)
    port = settings.BY_NAME["cluster_port"]  # bounds, checked by the kind's check
    with pytest.raises(ValueError, match=r"^--cluster_port must be <= 65535, got 70000\.$"):
        port.checked(70000, flag=True)
    with pytest.raises(ValueError, match=r"^cluster_port must be a whole number >= 1, got 0\.$"):
        port.checked(0)


def test_what_a_resume_may_change_is_the_resumable_declarations():
    resumable = {setting.name for setting in settings.SETTINGS if setting.resumable}
    assert run_config.CONFIG_FREE_TO_CHANGE == resumable | {
        "export_dir",
        "replace_export",
        "verbosity",
    }
    assert run_config.CONFIG_FREE_TO_CHANGE == FREE_TO_CHANGE_BEFORE


def test_every_shared_setting_names_a_documented_section():
    assert {setting.section for setting in settings.SETTINGS} == set(settings.SECTIONS)


def quiet():
    return loops.testing.quiet_progress()


# ---- The typed tree, generated from the declarations, and the Trainer that takes it. ----


def test_the_checked_in_tree_is_what_the_declarations_generate():
    with open(config_source.TARGET, encoding="utf-8") as file:
        assert file.read() == config_source.source(), (
            f"loops/vocabulary/run_config_tree.py is stale: run {config_source.COMMAND}"
        )


def test_the_tree_holds_every_shared_setting_typed_in_its_section():
    config = loops.RunConfig()
    assert list(config.sections()) == list(settings.SECTIONS)
    assert config.flat() == {setting.name: setting.default for setting in settings.SETTINGS}
    for setting in settings.SETTINGS:
        section = getattr(config, setting.section)
        field = {field.name: field for field in dataclasses.fields(section)}[setting.name]
        assert field.type == setting.annotation, setting.name
    assert config.update.mixed_precision == "none" and config.controller.steps_per_loop == 100


def test_from_flat_flat_and_replace_check_by_the_declarations():
    config = loops.RunConfig.from_flat({"steps_per_loop": 4, "profile_steps": [2, 3]})
    assert config.controller.steps_per_loop == 4 and config.controller.profile_steps == (2, 3)
    assert loops.RunConfig.from_flat(config.flat()) == config
    replaced = config.replace(ema_decay=0.5)
    assert replaced.update.ema_decay == 0.5 and config.update.ema_decay is None
    with pytest.raises(ValueError, match="^ema_decay must be in \\(0, 1\\)"):
        config.replace(ema_decay=1.0)
    with pytest.raises(ValueError, match="has no setting 'steps_per_lop'; did you mean 'steps_"):
        loops.RunConfig.from_flat({"steps_per_lop": 4})


def test_async_checkpoints_no_is_refused_by_the_trainer_and_the_tree():
    with pytest.raises(ValueError) as refused:
        loops.Trainer(Counter(), async_checkpoints="no")
    assert str(refused.value) == "async_checkpoints must be True or False, got 'no'."
    with pytest.raises(ValueError, match="async_checkpoints must be True or False, got 'no'"):
        loops.RunConfig().replace(async_checkpoints="no")


def test_the_trainer_takes_a_config_and_keyword_overrides_checked_alike(tmp_path):
    config = loops.RunConfig().replace(steps_per_loop=3, seed=7, model_dir=str(tmp_path))
    trainer = loops.Trainer(Counter(), config, max_checkpoints=2, progress=quiet())
    assert trainer.run_config == config.replace(max_checkpoints=2)
    assert trainer.step_options.seed == 7
    options = trainer.controller.options
    assert (options.steps_per_loop, options.max_checkpoints, options.model_dir) == (
        3,
        2,
        str(tmp_path),
    )
    trainer.train(6)
    assert trainer.state.step == 6
    trainer.close()
    with pytest.raises(TypeError, match="has no setting 'steps_per_lop'; did you mean 'steps_per_"):
        loops.Trainer(Counter(), steps_per_lop=3)
    with pytest.raises(TypeError, match="a mapping of your hyperparameters .* is record="):
        loops.Trainer(Counter(), {"learning_rate": 0.1})


def test_a_run_restarts_from_its_config_json(tmp_path):
    # A binary's config.json: flag values (0 for off, START,END), its own flags, the items.
    recorded = {
        "steps_per_loop": 5,
        "ema_decay": 0.0,
        "health_every": 0,
        "profile_steps": "2,3",
        "mixed_precision": "mixed_bfloat16",
        "dataset": "digits",
        "checkpoint.model": "Functional",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(recorded))
    config = loops.RunConfig.from_json(str(path))
    assert config == loops.RunConfig().replace(
        steps_per_loop=5, profile_steps=(2, 3), mixed_precision="mixed_bfloat16"
    )
    # A Python run's: its settings as values; the Trainer's own record is read back too.
    trainer = loops.Trainer(
        Counter(), config.replace(model_dir=str(tmp_path / "run")), progress=quiet()
    )
    trainer.train(5)
    trainer.close()
    again = loops.RunConfig.from_json(str(tmp_path / "run" / "config.json"))
    assert again.update.mixed_precision == "mixed_bfloat16" and again.step.seed == 0
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds no JSON object of settings"):
        loops.RunConfig.from_json(str(path))


def test_config_json_on_a_command_line_is_the_flags_of_the_recorded_settings(tmp_path):
    path = tmp_path / "config.json"
    recorded = {"steps_per_loop": 5, "jit_compile": True, "model_dir": None, "dataset": "x"}
    path.write_text(json.dumps(recorded) + "\n")
    defined = {"steps_per_loop", "jit_compile", "model_dir"}
    argv = ["prog", "--seed=1", f"--config_json={path}", "--steps_per_loop=2"]
    assert config_json.expanded(argv, defined) == [
        "prog",
        "--seed=1",
        "--steps_per_loop=5",
        "--jit_compile=true",
        "--steps_per_loop=2",  # after it: overrides
    ]
    with pytest.raises(ValueError, match="--config_json=.* does not read as a run's settings"):
        config_json.expanded(["prog", f"--config_json={tmp_path / 'missing.json'}"], defined)


def test_one_reader_reads_config_json_and_each_caller_words_its_own_sentence(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"seed": 3, "dataset": "x"}')
    assert read_recorded_settings(str(path)) == {"seed": 3, "dataset": "x"}
    missing, not_json, a_list = tmp_path / "missing.json", tmp_path / "text.json", tmp_path / "l"
    not_json.write_text("{seed")
    a_list.write_text("[1, 2]")
    with pytest.raises(RecordedSettingsError) as raised:
        read_recorded_settings(str(missing))
    assert raised.value.unreadable and isinstance(raised.value.cause, FileNotFoundError)
    with pytest.raises(RecordedSettingsError) as raised:
        read_recorded_settings(str(not_json))
    assert not raised.value.unreadable and isinstance(raised.value.cause, json.JSONDecodeError)
    with pytest.raises(RecordedSettingsError) as raised:
        read_recorded_settings(str(a_list))
    assert (raised.value.cause, raised.value.found, raised.value.detail) == (None, [1, 2], [1, 2])
    assert isinstance(raised.value, ValueError)
    # --config_json, RunConfig.from_json and the evaluator's read: their own sentences.
    no_object = f"--config_json={a_list} holds no JSON object; pass a run's config.json."
    with pytest.raises(ValueError, match=f"^{re.escape(no_object)}$"):
        config_json.expanded(["prog", f"--config_json={a_list}"], {"seed"})
    with pytest.raises(ValueError, match=f"^--config_json={not_json} does not read as a run's"):
        config_json.expanded(["prog", f"--config_json={not_json}"], {"seed"})
    no_settings = f"{a_list} holds no JSON object of settings; pass a run's config.json."
    with pytest.raises(ValueError, match=f"^{re.escape(no_settings)}$"):
        loops.RunConfig.from_json(str(a_list))
    with pytest.raises(ValueError, match=f"^Cannot read the run's settings from {missing} "):
        loops.RunConfig.from_json(str(missing))
    assert run_config.read(str(tmp_path / "no_run")) is None
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{seed")
    with pytest.raises(ValueError, match=r"config.json holds no JSON object of settings \(Expe"):
        run_config.read(str(tmp_path / "run"))
    (tmp_path / "run" / "config.json").unlink()
    (tmp_path / "run" / "config.json").mkdir()  # a directory: read, but not as a file
    with pytest.raises(ValueError, match=r"^Cannot read .*/run/config.json, the settings of the"):
        run_config.read(str(tmp_path / "run"))


# ---- The proof: a new setting is its declaration plus the regenerate command. ----

# Declares a scratch setting beside the shared ones and regenerates loops.RunConfig from
# them, as `python -m loops.bin.config_source --write` would: nothing else is edited.
SCRATCH = """
import sys, types
from loops.vocabulary import settings
from loops.vocabulary.declarations import Setting, satisfies
from loops.bin import config_source

scratch = Setting(
    "scratch_ratio", "training", "A scratch setting of the proof test: a ratio in (0, 1].",
    "float", default=0.5, section="run", elsewhere="the proof test's binary reads it",
    check=satisfies(lambda value: 0 < value <= 1, "{name} must lie in (0, 1], e.g. {name}=0.5."),
)
settings.SETTINGS = (*settings.SETTINGS, scratch)
settings.BY_NAME = {setting.name: setting for setting in settings.SETTINGS}
tree = types.ModuleType("loops.vocabulary.run_config_tree")
sys.modules[tree.__name__] = tree
exec(compile(config_source.source(), "run_config_tree.py", "exec"), tree.__dict__)
"""


def test_a_declared_setting_is_in_the_typed_config_with_its_check():
    namespace = {}
    exec(SCRATCH, namespace)  # in this process: undone below
    scratch = namespace["scratch"]
    tree = namespace["tree"]
    try:
        config = tree.RunConfig()
        assert config.run.scratch_ratio == 0.5 and config.flat()["scratch_ratio"] == 0.5
        assert "scratch_ratio: float = 0.5" in config_source.source()
        assert config.replace(scratch_ratio=0.25).run.scratch_ratio == 0.25
        with pytest.raises(ValueError, match=r"^scratch_ratio must lie in \(0, 1\], e.g."):
            config.replace(scratch_ratio=2.0)
        assert scratch.checked(1.0) == 1.0
    finally:
        settings.SETTINGS = settings.SETTINGS[:-1]
        settings.BY_NAME = {setting.name: setting for setting in settings.SETTINGS}
        sys.modules["loops.vocabulary.run_config_tree"] = run_config_tree
    assert "scratch_ratio" not in loops.RunConfig.names()


def test_a_declared_setting_reaches_the_flags_help_results_and_config_json(tmp_path, digits_dir):
    binary = SCRATCH + "from loops.bin import classifier\nclassifier.run()\n"
    helped = run_python(binary, "--help")
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "  --scratch_ratio (float, default: 0.5)\n" in helped.stdout
    refused = run_python(binary, "--scratch_ratio=2", f"--model_dir={tmp_path / 'bad'}")
    assert refused.returncode == 1
    assert "flag --scratch_ratio=2.0: --scratch_ratio must lie in (0, 1]" in refused.stderr
    model_dir = tmp_path / "run"
    run = ("--train_steps=2", "--steps_per_loop=1", "--global_batch_size=16")
    done = run_python(
        binary, *run, f"--data_dir={digits_dir}", f"--model_dir={model_dir}", "--scratch_ratio=0.25"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_results(str(model_dir))["config"]["scratch_ratio"] == 0.25
    recorded = json.loads((model_dir / "config.json").read_text())
    assert recorded["scratch_ratio"] == 0.25
    # And the typed config the binary built: restarted from config.json, it reads it back.
    check = SCRATCH + (
        "print(sys.modules['loops.vocabulary.run_config_tree'].RunConfig"
        f".from_json({str(model_dir / 'config.json')!r}).run.scratch_ratio)"
    )
    read_back = run_python(check)
    assert read_back.returncode == 0, read_back.stderr[-2000:]
    assert read_back.stdout.strip().splitlines()[-1] == "0.25"


def test_a_binary_restarts_from_a_runs_config_json(tmp_path, digits_dir):
    first = tmp_path / "first"
    run = ("--train_steps=2", "--steps_per_loop=1", "--global_batch_size=16", "--seed=5")
    done = run_module(
        "loops.bin.classifier", *run, f"--data_dir={digits_dir}", f"--model_dir={first}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    second = tmp_path / "second"
    again = run_module(
        "loops.bin.classifier",
        f"--config_json={first / 'config.json'}",
        f"--model_dir={second}",
        "--train_steps=3",
    )
    assert again.returncode == 0, again.stderr[-3000:]
    was, now = read_results(str(first))["config"], read_results(str(second))["config"]
    assert now == {**was, "model_dir": str(second), "train_steps": 3}
    assert read_results(str(second))["global_step"] == 3
