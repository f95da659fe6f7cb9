"""Each setting is declared once: the shared ones in loops/vocabulary/settings.py, a
binary's own next to what they configure. The flags of every binary, their --help, the
keyword arguments of loops.Loop and their checks all come from those declarations."""

import ast
import inspect
import os
import re
import subprocess
import sys

import pytest

import loops
from conftest import ROOT, SUBPROCESS_ENV, read_results, run_module
from loops.bin import training_settings
from loops.cli import flags as loop_flags
from loops.run import trainer_arguments
from loops.vocabulary import settings
from loops_data import settings as data_settings
from loops_models import settings as model_settings

BINARIES = ("classifier", "gan", "rl", "lm", "recommender", "ctr")
# Trainer keyword arguments that are objects, not settings a flag could carry.
LOOP_OBJECTS = {
    "strategy", "train_data", "eval_data", "progress", "actions", "record", "table_plan",
    "warm_start",
}  # fmt: skip
# Settings whose flag default each binary gives (`define_binary_flags` keywords).
BINARY_OWN_DEFAULTS = {
    "train_steps",
    "global_batch_size",
    "learning_rate",
    "steps_per_loop",
    "progress_every_seconds",  # the binaries' shared default (flags.BINARY_DEFAULTS)
}
# ... and those only some binaries give (the LM's: tests/test_lm.py DEFAULT_RUN).
OWN_DEFAULTS_OF = {
    "gan": {"ema_decay"},
    "ctr": {"eval_every"},
    "lm": {
        "num_layers",
        "mixed_precision",
        "lr_schedule",
        "lr_warmup_steps",
        "lr_final_fraction",
        "eval_every",
    },
}
KINDS = {
    "integer": "int",
    "float": "float",
    "bool": "bool",
    "enum": "string enum",
    "string": "string",
    "list": "comma separated list of strings",
}
# Each binary's own declarations (what it passes `define_binary_flags`), by binary.
OWN_SETTINGS = {
    "classifier": (
        *data_settings.IMAGE_CLASSIFICATION,
        *model_settings.CLASSIFIER,
        *training_settings.OPTIMIZER,
    ),
    "gan": (*data_settings.GAN_DATA, *training_settings.GAN),
    "rl": (
        *training_settings.ENVIRONMENT_LOOP,
        *training_settings.ACTOR_CRITIC,
        *training_settings.DQN,
    ),
    "lm": (
        *data_settings.PYTHON_TEXT,
        *model_settings.TRANSFORMER_LM,
        *training_settings.OPTIMIZER,
        *training_settings.LANGUAGE_MODEL,
    ),
    "recommender": (
        *data_settings.INTERACTIONS,
        *model_settings.RECOMMENDER,
        *training_settings.OPTIMIZER,
        *training_settings.TABLE_OPTIMIZER,
        *training_settings.WARM_START,
    ),
    "ctr": (
        *data_settings.CTR_DATA,
        *model_settings.CTR,
        *training_settings.OPTIMIZER,
        *training_settings.TABLE_OPTIMIZER,
        *training_settings.WARM_START,
    ),
}
# The binaries that export at the end of training: they also take --export_dir.
EXPORTING = {"classifier", "gan", "lm", "recommender", "ctr"}


def help_entries(binary):
    """--flag -> (its --help heading, its type and default line, its help text unwrapped)."""
    done = run_module(f"loops.bin.{binary}", "--help", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    entries, heading, name = {}, None, None
    for line in done.stdout.splitlines():
        if re.fullmatch(r"[a-z]+:", line):
            heading = line[:-1]
        elif match := re.fullmatch(r"  --(\w+) \((.*)\)", line):
            name = match.group(1)
            entries[name] = [heading, match.group(2), ""]
        elif line.startswith("      ") and name is not None:
            entries[name][2] = (entries[name][2] + " " + line.strip()).strip()
        else:
            name = None
    return entries


def assert_listed_as_declared(entries, setting, *, default_too=True):
    """--help lists `setting` under its heading, with its help, type and (if asked) default."""
    assert setting.name in entries, f"--{setting.name} missing from --help"
    heading, type_and_default, help_text = entries[setting.name]
    assert heading == setting.heading, setting.name
    choices = f"<{'|'.join(setting.choices)}>: " if setting.kind == "enum" else ""
    # Compared without spaces: --help wraps long words (the choices) anywhere.
    expected = choices + setting.help
    assert help_text.replace(" ", "") == expected.replace(" ", ""), setting.name
    kind = KINDS[setting.kind]
    assert type_and_default.startswith(f"{kind}, default: "), (setting.name, type_and_default)
    if not default_too:
        return
    default = "unset" if setting.flag_default is None else str(setting.flag_default)
    if setting.kind == "bool":
        default = default.lower()
    assert type_and_default == f"{kind}, default: {default}", setting.name


@pytest.mark.parametrize("binary", BINARIES)
def test_every_binary_lists_every_setting_under_its_heading_with_its_declared_help(binary):
    entries = help_entries(binary)
    own_defaults = BINARY_OWN_DEFAULTS | OWN_DEFAULTS_OF.get(binary, set())
    for setting in (*settings.SETTINGS, *OWN_SETTINGS[binary]):
        assert_listed_as_declared(entries, setting, default_too=setting.name not in own_defaults)
    # Nothing else: every flag of the binary is a declared setting.
    declared = {setting.name for setting in (*settings.SETTINGS, *OWN_SETTINGS[binary])}
    # A binary that exports declares its two export flags apart (`settings.export_settings`).
    exported = {"export_dir", "replace_export"}
    assert set(entries) - declared == (exported if binary in EXPORTING else set())


@pytest.mark.parametrize("binary", BINARIES)
def test_a_binary_defines_its_flags_only_through_declarations(binary):
    # absl files each flag under the module that defined it: loops.cli.flags, for declared ones.
    code = (
        f"import loops.bin.{binary}\nfrom absl import flags\n"
        "print(sorted(flags.FLAGS.flags_by_module_dict()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    modules = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert [module for module in modules if not module.startswith("absl.")] == ["loops.cli.flags"]


def test_each_setting_is_declared_once_per_binary():
    for binary, own in OWN_SETTINGS.items():
        names = [setting.name for setting in (*settings.SETTINGS, *own)]
        assert len(names) == len(set(names)), binary


def test_a_default_for_an_undeclared_setting_is_refused():
    with pytest.raises(ValueError, match="Defaults for undeclared settings: no_such_setting"):
        loop_flags.define_settings(settings.SETTINGS, no_such_setting=1)


def test_the_loop_takes_exactly_the_declared_loop_settings_with_their_defaults():
    parameters = inspect.signature(loops.Trainer.__init__).parameters
    keywords = {
        name
        for name, parameter in parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    # The objects by name, the settings in a RunConfig or as keyword overrides of it.
    assert keywords == LOOP_OBJECTS
    assert list(parameters)[:3] == ["self", "definition", "config"]
    assert list(parameters.values())[-1].kind is inspect.Parameter.VAR_KEYWORD
    declared = {setting.name for setting in settings.TRAINER_SETTINGS}
    assert set(trainer_arguments.KEYWORDS) == declared
    defaults = loops.RunConfig().flat()
    for setting in settings.TRAINER_SETTINGS:
        assert defaults[setting.name] == setting.default, setting.name


@pytest.mark.parametrize(
    "name, bad",
    [
        ("steps_per_loop", 0),
        ("eval_every", -5),
        ("checkpoint_every", 2.5),
        ("max_checkpoints", 0),
        ("grad_accum_steps", 0),
        ("mixed_precision", "float16"),
        ("ema_decay", 1.0),
        ("progress_every_seconds", -1.0),
        ("profile_steps", (5, 2)),
        ("on_nonfinite", "ignore"),
        ("seed", -1),
        ("loss_scale_growth_steps", 0),
    ],
)
def test_a_bad_keyword_gets_the_sentence_its_declaration_gives(name, bad):
    with pytest.raises(ValueError) as declared:
        settings.BY_NAME[name].checked(bad)
    assert f"{name} must " in str(declared.value) and repr(bad) in str(declared.value)
    with pytest.raises(ValueError) as from_the_loop:
        loops.Trainer(loops.Loop(), **{name: bad})
    assert str(from_the_loop.value) == str(declared.value)


def test_a_run_takes_its_settings_from_a_flagfile_with_command_line_overrides(tmp_path, digits_dir):
    flagfile = tmp_path / "run.flags"
    flagfile.write_text("--train_steps=4\n--steps_per_loop=2\n--global_batch_size=32\n")
    model_dir = str(tmp_path / "run")
    done = run_module(
        "loops.bin.classifier",
        f"--flagfile={flagfile}",
        "--train_steps=6",
        f"--model_dir={model_dir}",
        f"--data_dir={digits_dir}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(model_dir)
    assert results["global_step"] == 6
    config = results["config"]
    assert (config["train_steps"], config["steps_per_loop"], config["global_batch_size"]) == (
        6,
        2,
        32,
    )
    assert os.path.exists(os.path.join(model_dir, "config.json"))
