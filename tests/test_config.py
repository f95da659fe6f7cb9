"""One declaration per setting (loops/vocabulary/settings.py): one default, one check for a
Python value and a flag's, a section of the typed configuration, and whether a resume may
change it."""

import pytest

from loops.model_dir import run_config
from loops.run.run_options import RunOptions
from loops.vocabulary import settings

# What a resumed run could change without a warning before the declarations said it.
FREE_TO_CHANGE_BEFORE = {
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
        RunOptions(async_checkpoints="no")


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
    assert run_config.CONFIG_FREE_TO_CHANGE == resumable | {"export_dir", "verbosity"}
    assert run_config.CONFIG_FREE_TO_CHANGE == FREE_TO_CHANGE_BEFORE


def test_every_shared_setting_names_a_documented_section():
    assert {setting.section for setting in settings.SETTINGS} == set(settings.SECTIONS)
