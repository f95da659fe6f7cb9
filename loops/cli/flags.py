"""A loop binary's flags (from `loops.vocabulary.settings.Setting` declarations), its
--help, and the `loops.RunConfig` and Trainer arguments their values give; the one place
their values change after parsing (`set_values`). The runner is `loops.cli.application`.

Nothing here imports TensorFlow when loaded: a binary answers --help or a bad
flag before TensorFlow's seconds-long import.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import itertools
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from absl import flags

from loops.cli import config_json, flagfiles
from loops.core import own_files
from loops.model_dir import run_config, run_outputs
from loops.vocabulary import settings
from loops.vocabulary.choices import LOCAL_REPLICA_STRATEGIES, ONE_PROCESS_STRATEGIES

# The headings of a binary's --help, in order; each of its flags is defined under one.
HEADINGS = ("mode", "strategy", "data", "model", "training", "outputs", "faults")
# The headings whose every flag changes the numbers an evaluator reports (the model and
# its eval data; also train-only data flags, which adopting costs nothing).
EVALUATED_HEADINGS = ("data", "model")
TRAIN = settings.TRAIN
EVALUATE_CHECKPOINTS = settings.EVALUATE_CHECKPOINTS
FIND_LR = settings.FIND_LR
EVALUATOR_TASK = settings.EVALUATOR_TASK
DEFAULT_EVALUATIONS = settings.DEFAULT_EVALUATIONS
DEFAULT_CPU_REPLICAS = settings.DEFAULT_CPU_REPLICAS
# The largest finite float32: a larger flag value becomes inf once TensorFlow holds it.
FLOAT32_MAX = 3.4028234663852886e38
# The largest int64: TensorFlow counts a run's steps (and holds its sizes and seeds) in int64,
# which a larger integer flag does not fit.
INT64_MAX = 2**63 - 1
_HELP_ARGUMENTS = ("-h", "-?", "--help", "-help", "--helpshort", "-helpshort")

# Flag name -> its --help heading, for every flag of the running binary (one per process).
_heading_of: dict[str, str] = {}


@contextlib.contextmanager
def heading(name: str) -> Iterator[None]:
    """Files the flags defined inside under `name`: in --help, in results.json's config."""
    if name not in HEADINGS:
        raise ValueError(f"Unknown flag heading {name!r}; use one of {', '.join(HEADINGS)}.")
    before = set(flags.FLAGS)
    yield
    for key in flags.FLAGS:
        flag = flags.FLAGS[key]
        if key not in before and flag.name not in _heading_of:
            _heading_of[flag.name] = name


def _require_finite(flag: flags.Flag, flag_values: flags.FlagValues) -> None:
    """A float flag must also be finite as a float32 (TensorFlow's number): inf, nan and
    numbers beyond float32's range are flag errors."""
    example = (
        f"e.g. --{flag.name}={flag.default}" if flag.default is not None else "or leave it unset"
    )

    def check(value):
        if value is not None and not math.isfinite(value):
            raise flags.ValidationError(
                f"{value} is not a finite number; pass a finite --{flag.name}, {example}."
            )
        if value is not None and abs(value) > FLOAT32_MAX:
            raise flags.ValidationError(
                f"{value} is beyond float32's range (up to {FLOAT32_MAX:.4g} in magnitude): "
                f"TensorFlow computes in float32, where it is infinite; pass a smaller "
                f"--{flag.name}, {example}."
            )
        return True

    flags.register_validator(flag.name, check, flag_values=flag_values)


def _require_int64(flag: flags.Flag, flag_values: flags.FlagValues) -> None:
    """An integer flag must fit TensorFlow's int64: a larger one is a flag error (a step
    count, a size or a seed TensorFlow cannot hold, and no run could reach)."""

    def check(value):
        if value is not None and not -INT64_MAX - 1 <= value <= INT64_MAX:
            bound = f"<={INT64_MAX}" if value > 0 else f">={-INT64_MAX - 1}"
            raise flags.ValidationError(
                f"{value} is beyond the 64-bit integers TensorFlow counts steps and sizes in; "
                f"pass --{flag.name}{bound}."
            )
        return True

    flags.register_validator(flag.name, check, flag_values=flag_values)


def binary_flag_names() -> list[str]:
    """The running binary's own flags (the ones its --help lists), in definition order."""
    return list(_heading_of)


# The binaries' default of a shared setting whose Python default is another: a run on the
# command line shows a progress line at least every 10 s (a Trainer, none unless asked).
BINARY_DEFAULTS = {"progress_every_seconds": 10.0}


def define_settings(declarations: Iterable[settings.Setting], **binary_defaults: Any) -> None:
    """Defines a flag for each of `declarations`, under its heading, checked by its declaration.

    Args:
        declarations: the settings the binary takes, in --help order within each heading.
        **binary_defaults: setting name -> this binary's default, instead of the declared
            one (`Setting.flag_default`). None for a default the binary fills in after
            parsing (the RL algorithm's).

    Raises:
        ValueError: a default for a setting not in `declarations`.
    """
    declarations = tuple(declarations)
    unknown = set(binary_defaults) - {setting.name for setting in declarations}
    if unknown:
        raise ValueError(f"Defaults for undeclared settings: {', '.join(sorted(unknown))}.")
    for setting in declarations:
        with heading(setting.heading):
            define_setting_flag(setting, binary_defaults.get(setting.name, setting.flag_default))


def define_setting_flag(
    setting: settings.Setting, default: Any, flag_values: flags.FlagValues = flags.FLAGS
) -> None:
    """Defines `setting`'s flag in `flag_values` (absl's one registry, or a test's own), of
    its declared type with `default`: a float finite as a float32 (`_require_finite`), an
    integer within int64 (`_require_int64`), then checked by its declaration (`_check_flag`)."""
    _define_flag(setting, default, flag_values)
    if setting.kind == "float":
        _require_finite(flag_values[setting.name], flag_values)
    if setting.kind == "integer":
        _require_int64(flag_values[setting.name], flag_values)
    # After the finiteness check, so that nan is called not finite.
    flags.register_validator(
        setting.name, functools.partial(_check_flag, setting), flag_values=flag_values
    )


def _check_flag(setting: settings.Setting, value: Any) -> bool:
    """A flag's validator: its value, made Python's (`Setting.value_of_flag`), goes through
    the declaration's one check; unset (None) is the binary's to fill in."""
    if value is None:
        return True
    try:
        setting.checked(setting.value_of_flag(value), flag=True)
    except ValueError as error:
        raise flags.ValidationError(str(error)) from error
    return True


def define_binary_flags(
    own: Iterable[Iterable[settings.Setting]], *, export: str | None = None, **defaults: Any
) -> None:
    """Defines a binary's flags: the shared settings, then its `own` declarations.

    Args:
        own: the declaration tuples of the binary's own settings (data, model, training).
        export: what the binary exports at the end of training (`define_export_dir_flag`);
            None: it exports nothing.
        **defaults: this binary's defaults (`define_settings`), over `BINARY_DEFAULTS`.
    """
    define_settings(
        (*settings.SETTINGS, *itertools.chain.from_iterable(own)), **BINARY_DEFAULTS, **defaults
    )
    if export is not None:
        define_export_dir_flag(export)


class _PathParser(flags.ArgumentParser):
    """A path flag's parser: its text with a leading ~ expanded (`os.path.expanduser`), so
    that --data=~/ratings.csv names the file a shell would have found."""

    def parse(self, argument: str) -> str:
        return os.path.expanduser(str(super().parse(argument)))


def _define_flag(setting: settings.Setting, default: Any, flag_values: flags.FlagValues) -> None:
    """One absl flag of the type and choices `setting` declares (its check: `_check_flag`).

    The declared bounds go to absl's parser too, so that a value out of them is refused
    while parsing, in absl's words ("0 is not a positive integer"), as before 5.0.
    """
    name, help_text = setting.name, setting.help
    lower, upper = setting.lower_bound, setting.upper_bound
    if setting.kind == "enum":
        flags.DEFINE_enum(name, default, list(setting.choices), help_text, flag_values=flag_values)
    elif setting.kind == "bool":
        flags.DEFINE_bool(name, default, help_text, flag_values=flag_values)
    elif setting.kind == "integer":
        flags.DEFINE_integer(
            name,
            default,
            help_text,
            lower_bound=None if lower is None else int(lower),
            upper_bound=None if upper is None else int(upper),
            flag_values=flag_values,
        )
    elif setting.kind == "float":
        flags.DEFINE_float(
            name, default, help_text, lower_bound=lower, upper_bound=upper, flag_values=flag_values
        )
    elif setting.kind == "list":
        flags.DEFINE_list(name, default, help_text, flag_values=flag_values)
    elif setting.path:
        serializer = flags.ArgumentSerializer[str]()
        flags.DEFINE(_PathParser(), name, default, help_text, flag_values, serializer)
    else:
        flags.DEFINE_string(name, default, help_text, flag_values=flag_values)


def setting_values(declarations: Iterable[settings.Setting]) -> dict[str, Any]:
    """Each declared setting's value from its flag (`Setting.value_of_flag`), by name.

    Raises:
        ValueError: a `from_flag` refuses its flag's value.
    """
    return {
        setting.name: setting.value_of_flag(flags.FLAGS[setting.name].value)
        for setting in declarations
    }


def define_export_dir_flag(what: str) -> None:
    """Defines --export_dir (and --replace_export) for a binary that exports `what` at the
    end of training."""
    define_settings(settings.export_settings(what))


def resolve_export_dir(model_dir: str) -> str:
    """--export_dir, or model_dir/export."""
    return flags.FLAGS.export_dir or os.path.join(model_dir, "export")


def help_text(description: str) -> str:
    """The binary's --help: `description`, then each of its flags under its heading."""
    lines = [description.strip(), ""]
    for name in HEADINGS:
        names = [flag for flag, flag_heading in _heading_of.items() if flag_heading == name]
        if not names:
            continue
        lines.append(f"{name}:")
        for flag_name in names:
            flag = flags.FLAGS[flag_name]
            default = "unset" if flag.default is None else str(flag.default_as_str).strip("'")
            lines.append(f"  --{flag_name} ({flag.flag_type()}, default: {default})")
            lines.append(flags.text_wrap(flag.help, length=80, indent="      "))
        lines.append("")
    lines.append(
        "logging:\n  -v N, --verbosity=N\n      Also show TensorFlow's own log lines "
        "(as does setting TF_CPP_MIN_LOG_LEVEL);\n      N >= 0 adds absl INFO lines.\n"
        "\nsettings from a file (the flags after it override them):\n"
        "      --flagfile=FILE: FILE's lines, one --flag=value a line.\n"
        "      --config_json=MODEL_DIR/config.json: every setting a run recorded."
    )
    return "\n".join(lines)


def parse_flags(argv: list[str], *, description: str) -> list[str]:
    """Parses argv for `app.run`: --help prints `help_text` and exits 0; a bad flag exits 1.

    Returns what is left of argv (the program name and any stray argument).
    """
    options = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
    if any(option in _HELP_ARGUMENTS for option in options):
        print(help_text(description))
        sys.exit(0)
    try:
        flagfiles.check_flagfiles(options)
        argv = config_json.expanded(argv, set(flags.FLAGS))
    except ValueError as error:
        sys.exit(f"error: {error}")
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        sys.exit(f"error: {error}\nPass --help to see every flag of this binary.")


def resolve_model_dir(name: str) -> str:
    """--model_dir (with a warning line when another user owns where it lies), or a new
    timestamped directory in the temp dir's private `loops` directory (`default_output_dir`).

    Raises:
        ValueError: the default's parent is a link or another user's directory.
    """
    if flags.FLAGS.model_dir:
        owner = own_files.foreign_owner(flags.FLAGS.model_dir)
        if owner is not None:
            print(
                f"warning: --model_dir={flags.FLAGS.model_dir} lies where {owner}, who can "
                "replace or link the files the run writes there; pass a --model_dir in a "
                "directory of your own.",
                file=sys.stderr,
            )
        return flags.FLAGS.model_dir
    return default_output_dir(name)


def default_output_dir(name: str) -> str:
    """TEMP/loops/NAME-TIMESTAMP, with TEMP/loops made private to this user (mode 0700).

    Anyone may make TEMP/loops first and plant links in it, so one that is a
    link or another user's is refused rather than written into.

    Raises:
        ValueError: TEMP/loops is a link, no directory, or another user's.
    """
    parent = os.path.join(tempfile.gettempdir(), "loops")
    own_files.private_directory(
        parent,
        fix=f"Pass --model_dir (and --find_lr_dir) in a directory of your own, or remove {parent}.",
    )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join(parent, f"{name}-{stamp}")


def num_replicas() -> int:
    """--num_replicas, or what --strategy implies when it is unset (see its help)."""
    if flags.FLAGS.num_replicas is not None:
        return flags.FLAGS.num_replicas
    if flags.FLAGS.strategy not in LOCAL_REPLICA_STRATEGIES:
        return 1
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU")) or DEFAULT_CPU_REPLICAS


def say(line: str) -> None:
    """Prints a binary's line now (e.g. the data check's progress, before the loop exists)."""
    print(line, flush=True)


def strategy_name() -> str:
    """--strategy, but `default` for an evaluator or a range test given a cluster's (each
    runs on its own)."""
    name = flags.FLAGS.strategy
    if mode() in (EVALUATE_CHECKPOINTS, FIND_LR) and name not in ONE_PROCESS_STRATEGIES:
        return "default"
    return name


def make_strategy():
    """The tf.distribute strategy --strategy and --num_replicas ask for (see `strategy_name`)."""
    from loops.cluster import strategies

    return strategies.make_strategy(
        strategy_name(), num_replicas(), cluster_timeout=flags.FLAGS.cluster_timeout
    )


def tf_config_task_type() -> str | None:
    """The task type TF_CONFIG gives this process; None without one (or an unreadable one)."""
    try:
        task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}
        return task.get("type")
    except (ValueError, AttributeError):
        return None  # make_strategy names what is wrong with it, where it matters


def mode() -> str:
    """--mode, or evaluate_checkpoints on a task TF_CONFIG names `evaluator`, else train."""
    if flags.FLAGS.mode is not None:
        return flags.FLAGS.mode
    return EVALUATE_CHECKPOINTS if tf_config_task_type() == EVALUATOR_TASK else TRAIN


def check_batch_fits_replicas(strategy) -> None:
    """Raises ValueError when the global batch cannot give every replica an example, or
    every micro-batch of a replica a row (`check_micro_batches`)."""
    batch, replicas = flags.FLAGS.global_batch_size, strategy.num_replicas_in_sync
    if batch < replicas:
        raise ValueError(
            f"--global_batch_size={batch} is smaller than the {replicas} replicas, so some "
            f"replicas would never get an example; pass --global_batch_size>={replicas}."
        )
    check_micro_batches(flags.FLAGS.grad_accum_steps, batch, replicas)


def check_micro_batches(grad_accum_steps: int, global_batch_size: int, replicas: int) -> None:
    """Raises ValueError when --grad_accum_steps is more than the rows some replica holds.

    A replica's share of a step is cut into --grad_accum_steps micro-batches;
    with fewer rows than that, some are empty and the step is mostly wasted
    work. The fewest rows a replica holds is global_batch_size // replicas
    (the first global_batch_size % replicas hold one more). Before the
    strategy exists, `replicas` 1 checks against the whole batch, which bounds
    every replica's share.

    Raises:
        ValueError: the flag, the rows it is more than, and the most it may be.
    """
    rows = global_batch_size // replicas
    if grad_accum_steps <= rows:
        return
    held = (
        f"the {global_batch_size} rows of --global_batch_size={global_batch_size}"
        if replicas == 1
        else f"the {rows} rows a replica holds (--global_batch_size={global_batch_size} "
        f"over {replicas} replicas)"
    )
    raise ValueError(
        f"--grad_accum_steps={grad_accum_steps} cuts a replica's share of each step into more "
        f"micro-batches than {held}, so some would hold no example; pass "
        f"--grad_accum_steps<={rows} or a larger --global_batch_size."
    )


def eval_every() -> int | None:
    """--eval_every (0: None, only at the end), or the default cadence when it is unset.

    The default rounds train_steps / DEFAULT_EVALUATIONS to whole inner loops,
    so evaluating never shortens a tf.function call.
    """
    values = flags.FLAGS
    if values.eval_every is not None:
        return values.eval_every or None
    loops_per_evaluation = round(values.train_steps / DEFAULT_EVALUATIONS / values.steps_per_loop)
    return max(1, loops_per_evaluation) * values.steps_per_loop


def flag_values() -> dict[str, Any]:
    """The running binary's own flags and their values, for results.json's config."""
    return {name: flags.FLAGS[name].value for name in _heading_of}


def evaluated_settings() -> list[str]:
    """The binary's flags whose value changes the numbers its evaluator reports.

    Those under the data and model headings, and the step settings every
    evaluation depends on (`run_config.EVALUATION_SETTINGS`). Not the others: the
    strategy, replica count and batch size only change the order in which
    the per-example sums of an evaluation are added (their metrics are sums
    over the whole eval set), and the rest are about training or outputs.
    """
    return [
        name
        for name, flag_heading in _heading_of.items()
        if flag_heading in EVALUATED_HEADINGS or name in run_config.EVALUATION_SETTINGS
    ]


def flags_config():
    """The `loops.RunConfig` of the shared flags (`Setting.value_of_flag` each), with the
    model_dir and eval_every the binary resolves; for an evaluator or a range test, none of
    the training-only settings (see `loop_arguments`).

    Raises:
        ValueError: a flag value its declaration refuses (absl checked it already).
    """
    from loops.vocabulary.run_config_tree import RunConfig

    values = flags.FLAGS
    config = RunConfig.from_flat(
        {
            name: settings.BY_NAME[name].value_of_flag(values[name].value)
            for name in RunConfig.names()
        }
    )
    if mode() in (EVALUATE_CHECKPOINTS, FIND_LR):
        # The evaluator trains nothing, the range test only for itself: a recovery
        # (which needs a model_dir of its own), a profile of train steps, early stopping
        # and keeping the best do not apply to them. They keep ema_decay: the checkpoints
        # hold the averages the evaluator evaluates with.
        # Every built-in bad-step rule at its declared default (stop, or off).
        reactions = {name: settings.BY_NAME[name].default for name in settings.REACTIONS}
        return config.replace(
            model_dir=None,
            eval_every=eval_every(),
            **reactions,
            max_recoveries=None,
            profile_steps=None,
            early_stopping_metric=None,
            keep_best_metric=None,
        )
    return config


def loop_arguments(strategy, model_dir: str | None, *, actions: Sequence = ()) -> dict[str, Any]:
    """The `Trainer` arguments: the `flags_config` of the flags with `model_dir`, less the
    settings the binary acts on itself (`RunConfig.for_trainer`), and the strategy, the
    binary's own actions (the Trainer makes those the flags ask for: early stopping,
    keeping the best) and the flag values to record in results.json.

    Reads --train_steps and --steps_per_loop, which a binary with
    algorithm-dependent defaults fills in before. An evaluator's loop
    (--mode=evaluate_checkpoints) gets no model_dir and no actions: it
    evaluates the run's checkpoints and writes only into MODEL_DIR/evaluator
    (loops/run/sidecar.py). Nor does a range test's (--mode=find_lr), which
    writes nothing into --model_dir (loops/run/lr_finder.py).
    """
    config = flags_config()
    if mode() not in (EVALUATE_CHECKPOINTS, FIND_LR):
        config = config.replace(model_dir=model_dir, eval_every=eval_every())
    else:
        actions = []
    # The settings the binary acts on itself (the mode, the strategy's, ...) stay here; the
    # Trainer reads the rest, early stopping and keeping the best among them.
    return dict(
        config=config.for_trainer(), strategy=strategy, actions=actions, record=flag_values()
    )


def binary_arguments(
    run_name: str,
    *,
    export: Callable[[Any, str], str] | None = None,
    signature: str = "",
    check_batch: bool = True,
    actions: Sequence = (),
    deltas_from: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments every binary gives its `loops.Trainer`, from the shared flags.

    The strategy (made first: it sets up the devices before any other
    TensorFlow work) and `loop_arguments` with the default model_dir named
    after `run_name`. (--clip_norm is the definition's: `clip_norm_argument`.)

    Args:
        run_name: names the default --model_dir (`resolve_model_dir`).
        export: (the trained definition, --export_dir or MODEL_DIR/export) -> the
            path it wrote; exported
            when training ends (`loops.ExportOnEnd`), marked as the model_dir's
            (`run_outputs.exports_of`). None: no export.
        signature: what the export's serving_default signature takes and gives.
        check_batch: refuse a --global_batch_size smaller than the replica count
            (`check_batch_fits_replicas`).
        actions: the binary's own actions when it trains (none in the other modes).
        deltas_from: an earlier export of the model, the first link's base of the run's
            delta chain (`loops.model_dir.delta_chain`): after each evaluation that keeps a
            best (`loops.run.delta_exports.DeltasOnBest`) and after the export, what changed
            from the chain's last export is written into MODEL_DIR/deltas.

    Raises:
        ValueError: the batch does not fit the replicas.
    """
    strategy = make_strategy()
    if check_batch:
        check_batch_fits_replicas(strategy)
    actions = list(actions)
    model_dir = resolve_model_dir(run_name)
    if export is not None:
        from loops.run.actions import ExportOnEnd

        export_dir = resolve_export_dir(model_dir)

        chain = None
        if deltas_from is not None:
            from loops.model_dir.delta_chain import DeltaChain
            from loops.run.delta_exports import DeltasOnBest

            chain = DeltaChain(model_dir, deltas_from)
            actions.append(DeltasOnBest(export, chain))

        def export_marked(definition) -> str:
            # The marker says this model_dir wrote it: a later run may replace it unasked.
            with run_outputs.exports_of(model_dir):
                path = export(definition, export_dir)
            if chain is not None:
                base = chain.tip()
                delta = chain.extend(path)
                print(f"delta export from {base}: {delta or 'none (nothing changed)'}", flush=True)
            return path

        actions.append(
            ExportOnEnd(export_marked, description=f"signature serving_default: {signature}")
        )
    return loop_arguments(strategy, model_dir, actions=actions)


def clip_norm_argument() -> dict[str, Any]:
    """{"clip_norm": --clip_norm} where it is given; else {} (the definition's own default)."""
    clip_norm = flags.FLAGS.clip_norm
    return {} if clip_norm is None else {"clip_norm": clip_norm}


def set_values(values: Mapping[str, Any]) -> None:
    """The one place a binary's flags change after parsing: each of `values` (flag name ->
    value) set, as a binary's `prepare` fills in a default that depends on other flags or
    an evaluator takes the settings of the run it evaluates (`application`)."""
    for name, value in values.items():
        flags.FLAGS[name].value = value
