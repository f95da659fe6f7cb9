"""Every setting the binaries share, declared once: its type, defaults, help, heading and check.

The command-line flags and their --help (`loops.cli.flags.define_binary_flags`),
the checks of `loops.Trainer`'s keyword arguments, and the config a run records
(results.json, config.json) all come from the declarations below, so a
setting cannot mean one thing on the command line and another in Python.
Nothing here imports TensorFlow: a binary answers --help before its import.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from loops.vocabulary.choices import (
    CLUSTER_SOURCES,
    LOSS_SPIKE_POLICIES,
    METRIC_MODES,
    NONFINITE_POLICIES,
    PARAMETER_SERVER_MODES,
    PRECISION_POLICIES,
    STRATEGY_NAMES,
)
from loops.vocabulary.whole_numbers import check_whole, is_whole

TRAIN = "train"
EVALUATE_CHECKPOINTS = "evaluate_checkpoints"
FIND_LR = "find_lr"
# The learning-rate finder's defaults (--mode=find_lr, `loops.find_learning_rate`).
DEFAULT_FIND_LR_STEPS = 100
DEFAULT_FIND_LR_MIN_RATE = 1e-7
DEFAULT_FIND_LR_MAX_RATE = 10.0
DEFAULT_FIND_LR_STOP_FACTOR = 4.0
# TF_CONFIG's task type of the process that evaluates beside a cluster (TensorFlow's name).
EVALUATOR_TASK = "evaluator"
# Evaluations a run makes when --eval_every is unset: enough points for a curve.
DEFAULT_EVALUATIONS = 5
# Replicas of a mirrored or central_storage run on a machine without GPUs.
DEFAULT_CPU_REPLICAS = 2
DEFAULT_MAX_RECOVERIES = 3
DEFAULT_LOSS_SCALE_GROWTH_STEPS = 2000
# The health_every the help suggests: ratios one step in ten cost a tenth of what every
# step does (a copy of the weights kept across the update), ten averaged a 100-step loop.
SUGGESTED_HEALTH_EVERY = 10
DEFAULT_HEALTH_LAYERS = 3  # per optimizer: the layers whose update/weight ratios are largest
# The loss-spike rule's defaults (BUILD.md, "Loss spikes", says how they were chosen).
DEFAULT_LOSS_SPIKE_FACTOR = 4.0
DEFAULT_LOSS_SPIKE_STEPS = 3
DEFAULT_LOSS_SPIKE_WINDOW = 100


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def whole_number(
    least: int, note: str = "", *, optional: bool = False
) -> Callable[[str, Any], Any]:
    """A check: a whole number >= least, or None where `optional` (`note` says what None does)."""

    def check(name: str, value: Any) -> Any:
        if value is None and optional:
            return None
        check_whole(name, value, least, note)
        return value

    return check


def positive_number(note: str) -> Callable[[str, Any], Any]:
    """A check: a finite number > 0, or None."""

    def check(name: str, value: Any) -> Any:
        if value is None:
            return None
        if not _is_number(value) or not math.isfinite(value) or not value > 0:
            raise ValueError(f"{name} must be > 0{note}, got {value!r}.")
        return value

    return check


def number_above(least: float, example: str) -> Callable[[str, Any], Any]:
    """A check: a finite number > least (`example` shows a good value)."""

    def check(name: str, value: Any) -> Any:
        if not _is_number(value) or not math.isfinite(value) or not value > least:
            raise ValueError(
                f"{name} must be a finite number > {least:g}, got {value!r}; {example}."
            )
        return value

    return check


def one_of(choices: tuple[str, ...], advice: str = "") -> Callable[[str, Any], Any]:
    """A check: one of `choices`."""

    def check(name: str, value: Any) -> Any:
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}{advice}.")
        return value

    return check


def check_ema_decay(name: str, value: Any) -> Any:
    """None, or a decay in (0, 1)."""
    if value is not None and (not _is_number(value) or not 0 < value < 1):
        raise ValueError(
            f"{name} must be in (0, 1), e.g. 0.999, or None for no average; got {value!r}."
        )
    return value


def check_profile_steps(name: str, value: Any) -> tuple[int, int] | None:
    """None, or (start, end), whole numbers with 1 <= start <= end."""
    if value is None:
        return None
    try:
        start, end = value
    except (TypeError, ValueError):
        start = end = None
    if not (is_whole(start) and is_whole(end)):
        raise ValueError(
            f"{name} must be (start, end), two whole numbers, got {value!r}; "
            "e.g. (10, 20) (--profile_steps=10,20) traces steps 10 to 20."
        )
    if not 1 <= start <= end:
        raise ValueError(
            f"{name} must have 1 <= start <= end, got {value!r}; e.g. (10, 20) "
            "traces steps 10 to 20 (counted from 1)."
        )
    return start, end


def parse_profile_steps(text: str | None) -> tuple[int, int] | None:
    """ "START,END" as (START, END) when 1 <= START <= END; None when unset or malformed."""
    parts = (text or "").split(",")
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        return None
    start, end = (int(part) for part in parts)
    return (start, end) if 1 <= start <= end else None


def _zero_is_none(value: Any) -> Any:
    return value or None


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: a flag of the binaries that declare it, and where `loop` is set a
    `loops.Trainer` keyword.

    Attributes:
        name: the flag's name and the keyword argument's.
        heading: the --help heading it is listed under.
        help: what it does, as --help says it.
        kind: the flag's type: "integer", "float", "bool", "string", "enum" or "list"
            (comma-separated strings).
        flag_default: the flag's default (a binary may pass its own).
        loop: whether `loops.Trainer` takes it as a keyword argument.
        default: the keyword argument's default (where `loop`).
        check: (name, Python value) -> the value; ValueError with a sentence.
        from_flag: the flag's value -> the keyword argument's value.
        choices: the values an "enum" flag takes.
        lower_bound: the flag's lower bound, checked while parsing.
        upper_bound: the flag's upper bound, checked while parsing.
        flag_rule: (a rule the flag's value must meet, the sentence when it does not),
            for flags whose range differs from the keyword's (0 meaning "off").
    """

    name: str
    heading: str
    help: str
    kind: str
    flag_default: Any = None
    loop: bool = False
    default: Any = None
    check: Callable[[str, Any], Any] | None = None
    from_flag: Callable[[Any], Any] = lambda value: value
    choices: tuple[str, ...] = ()
    lower_bound: float | None = None
    upper_bound: float | None = None
    flag_rule: tuple[Callable[[Any], bool], str] | None = None

    def checked(self, value: Any) -> Any:
        """The keyword argument's value, checked; ValueError naming it and the fix."""
        return value if self.check is None else self.check(self.name, value)


_OFF = " (or None to turn it off)"

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "mode",
        "mode",
        f"{TRAIN}: train (and evaluate) the model. {EVALUATE_CHECKPOINTS}: in a process of its "
        "own, evaluate each checkpoint the run in --model_dir writes, once, as it appears, "
        "until the run's last (--train_steps), on this host's devices (a cluster --strategy "
        "becomes default), with the run's model and data settings from MODEL_DIR/config.json; "
        f"results in MODEL_DIR/evaluator. Unset: {TRAIN}, or {EVALUATE_CHECKPOINTS} on a task "
        f"TF_CONFIG names '{EVALUATOR_TASK}' (loops-launch --evaluator). {FIND_LR}: the "
        "learning-rate range test (the --find_lr_* flags), from the newest checkpoint in "
        "--model_dir if it holds one (read only), else from the initial weights; writes only "
        "into --find_lr_dir.",
        "enum",
        choices=(TRAIN, EVALUATE_CHECKPOINTS, FIND_LR),
    ),
    Setting(
        "evaluator_timeout",
        "mode",
        f"--mode={EVALUATE_CHECKPOINTS}: give up (exit 1) when no new checkpoint comes for "
        "this many seconds before the run ends; 0: wait for ever.",
        "float",
        flag_default=3600.0,
        lower_bound=0.0,
    ),
    Setting(
        "find_lr_steps",
        "mode",
        f"--mode={FIND_LR}: train steps of the range test, the rate growing by the same "
        "factor each step from --find_lr_min_rate to --find_lr_max_rate (fewer when the "
        "loss blows up first).",
        "integer",
        flag_default=DEFAULT_FIND_LR_STEPS,
        check=whole_number(2),
        lower_bound=2,
    ),
    Setting(
        "find_lr_min_rate",
        "mode",
        f"--mode={FIND_LR}: the learning rate of the first step.",
        "float",
        flag_default=DEFAULT_FIND_LR_MIN_RATE,
        check=number_above(0, f"e.g. {DEFAULT_FIND_LR_MIN_RATE:g}"),
        flag_rule=(
            lambda value: value > 0,
            "--find_lr_min_rate must be > 0, e.g. "
            f"--find_lr_min_rate={DEFAULT_FIND_LR_MIN_RATE:g}.",
        ),
    ),
    Setting(
        "find_lr_max_rate",
        "mode",
        f"--mode={FIND_LR}: the learning rate of the last step (above --find_lr_min_rate).",
        "float",
        flag_default=DEFAULT_FIND_LR_MAX_RATE,
        check=number_above(0, f"e.g. {DEFAULT_FIND_LR_MAX_RATE:g}"),
        flag_rule=(
            lambda value: value > 0,
            "--find_lr_max_rate must be > 0, e.g. "
            f"--find_lr_max_rate={DEFAULT_FIND_LR_MAX_RATE:g}.",
        ),
    ),
    Setting(
        "find_lr_stop_factor",
        "mode",
        f"--mode={FIND_LR}: stop once the smoothed loss is above this many times its lowest "
        "so far (the loss blew up), or not finite.",
        "float",
        flag_default=DEFAULT_FIND_LR_STOP_FACTOR,
        check=number_above(1, f"e.g. {DEFAULT_FIND_LR_STOP_FACTOR:g}"),
        flag_rule=(
            lambda value: value > 1,
            "--find_lr_stop_factor must be > 1, e.g. "
            f"--find_lr_stop_factor={DEFAULT_FIND_LR_STOP_FACTOR:g}.",
        ),
    ),
    Setting(
        "find_lr_loss",
        "mode",
        f"--mode={FIND_LR}: the train-step output the range test records. Default: loss, "
        "or, for a step with none, the sum of its outputs named *loss (the GAN's d_loss + "
        "g_loss, PPO's policy_loss + value_loss).",
        "string",
    ),
    Setting(
        "find_lr_dir",
        "mode",
        f"--mode={FIND_LR}: where lr_find.json (each step's rate and loss, the suggested "
        "rate and its rule) and lr_find.png (loss against the rate) go; nothing is written "
        "into --model_dir. Default: a new directory under the system temp dir.",
        "string",
    ),
    Setting(
        "strategy",
        "strategy",
        "tf.distribute strategy to train with. central_storage keeps the variables on one "
        "device (the CPU) and computes on --num_replicas devices.",
        "enum",
        flag_default="mirrored",
        choices=tuple(STRATEGY_NAMES),
    ),
    Setting(
        "num_replicas",
        "strategy",
        "Replicas for --strategy=mirrored or central_storage: that many GPUs when present, "
        "else the CPU split into that many logical devices. Default: every GPU, or "
        f"{DEFAULT_CPU_REPLICAS} logical CPUs without GPUs; 1 for the other strategies, which "
        "take their devices from the machine or the cluster.",
        "integer",
        lower_bound=1,
    ),
    Setting(
        "cluster_timeout",
        "strategy",
        "Seconds a task of a TF_CONFIG cluster (multi_worker_mirrored, parameter_server) waits "
        "for the others to come up before it names the missing ones and exits. Default: "
        "$LOOPS_CLUSTER_TIMEOUT_SECONDS, else 600.",
        "float",
        lower_bound=0.0,
    ),
    Setting(
        "cluster",
        "strategy",
        "Where the tasks of multi_worker_mirrored and parameter_server find their cluster: "
        "auto tries TF_CONFIG, then SLURM's srun (SLURM_PROCID, the step's node list and "
        "tasks per node), then a Kubernetes Indexed Job (JOB_COMPLETION_INDEX, "
        "$LOOPS_CLUSTER_TASKS, $LOOPS_CLUSTER_SERVICE), and names what it looked for when "
        "none is there.",
        "enum",
        flag_default="auto",
        choices=CLUSTER_SOURCES,
    ),
    Setting(
        "cluster_port",
        "strategy",
        "--cluster=slurm or kubernetes: the port of each node's first task (a node's next "
        "tasks take the ports after it). Default: Kubernetes 2222; SLURM a port from 20000 "
        "that follows SLURM_JOB_ID, so jobs sharing a node differ.",
        "integer",
        lower_bound=1,
        upper_bound=65535,
    ),
    Setting(
        "cluster_num_ps",
        "strategy",
        "--strategy=parameter_server with --cluster=slurm or kubernetes: how many tasks are "
        "parameter servers. Task 0 is the chief, the next this many the servers, the rest "
        "workers.",
        "integer",
        flag_default=0,
        lower_bound=0,
    ),
    Setting(
        "allow_batch_size_change",
        "training",
        "Resume a run in --model_dir with another --global_batch_size than it was trained "
        "with (refused otherwise: only the same global batch continues exactly, whatever "
        "the workers and replicas). The change is recorded in results.json.",
        "bool",
        flag_default=False,
    ),
    Setting(
        "train_steps",
        "training",
        "Total training steps (a resumed run trains up to this step).",
        "integer",
        lower_bound=1,
    ),
    Setting(
        "global_batch_size",
        "training",
        "Examples per step over all replicas.",
        "integer",
        lower_bound=1,
    ),
    Setting(
        "steps_per_loop",
        "training",
        "Steps per inner loop: a progress line and summaries each; one tf.function call runs "
        "one or, where nothing else comes between them, several.",
        "integer",
        flag_default=100,
        loop=True,
        default=100,
        check=whole_number(1),
        lower_bound=1,
    ),
    Setting(
        "learning_rate",
        "training",
        "Optimizer learning rate (> 0).",
        "float",
        flag_rule=(
            lambda value: value > 0,
            "--learning_rate must be > 0, e.g. --learning_rate=0.001.",
        ),
    ),
    Setting(
        "seed",
        "training",
        "Seed for initial weights, shuffling and noise.",
        "integer",
        flag_default=0,
        loop=True,
        default=0,
        check=whole_number(0),
    ),
    Setting(
        "run_eagerly",
        "training",
        "Run steps eagerly (no tf.function), for debugging.",
        "bool",
        flag_default=False,
        loop=True,
        default=False,
    ),
    Setting(
        "clip_norm",
        "training",
        "Clip each update's gradient, summed over replicas, to this global norm (> 0). "
        "Default: the loop's own (off for the classifier and the GAN, 0.5 for ppo, 10 for dqn).",
        "float",
        flag_rule=(
            lambda value: value is None or value > 0,
            "--clip_norm must be > 0, e.g. --clip_norm=1.0 (or leave it unset).",
        ),
    ),
    Setting(
        "grad_accum_steps",
        "training",
        "Cut each replica's share of a step into this many micro-batches and add up their "
        "gradients into one update: the update of the whole batch, with 1/K of the "
        "activations in memory. The RL loops draw their own minibatches and take only 1.",
        "integer",
        flag_default=1,
        loop=True,
        default=1,
        check=whole_number(1, " (1: no accumulation)"),
        lower_bound=1,
    ),
    Setting(
        "jit_compile",
        "training",
        "Compile each replica's forward and backward pass through the trained model with XLA "
        "(tf.function(jit_compile=True)); the collectives, the optimizer's update and the "
        "rest of the step stay TensorFlow's. Refused, before any step, where it cannot "
        "compile: --run_eagerly, the central_storage and parameter_server strategies, a "
        "layer that all-reduces across replicas (--batch_norm) or one Keras marks as not "
        "jit-compilable. Dropout draws other masks compiled than not.",
        "bool",
        flag_default=False,
        loop=True,
        default=False,
    ),
    Setting(
        "mixed_precision",
        "training",
        "Compute in 16 bits with float32 variables: mixed_bfloat16, or mixed_float16 with a "
        "dynamic loss scale agreed on by all replicas (one per optimizer, checkpointed); "
        "none: float32.",
        "enum",
        flag_default="none",
        loop=True,
        default="none",
        check=one_of(
            tuple(PRECISION_POLICIES),
            "; use 'mixed_bfloat16' or 'mixed_float16' to compute in 16 bits, 'none' for float32",
        ),
        choices=tuple(PRECISION_POLICIES),
    ),
    Setting(
        "loss_scale_growth_steps",
        "training",
        "With --mixed_precision=mixed_float16: finite steps in a row after which the loss "
        f"scale doubles. Default: {DEFAULT_LOSS_SCALE_GROWTH_STEPS}.",
        "integer",
        loop=True,
        check=whole_number(1, " (or None for the default)", optional=True),
        lower_bound=1,
    ),
    Setting(
        "ema_decay",
        "training",
        "Keep a moving average of the trained weights with this decay (e.g. 0.999; lowered "
        "early in training so the average follows the weights), checkpointed beside them; "
        "evaluation, the best checkpoint's metric and the export use it. 0: no average.",
        "float",
        flag_default=0.0,
        loop=True,
        check=check_ema_decay,
        from_flag=_zero_is_none,
        flag_rule=(
            lambda value: 0 <= value < 1,
            "--ema_decay must be in [0, 1), e.g. 0.999 (0: no average).",
        ),
    ),
    Setting(
        "eval_every",
        "training",
        f"Evaluate every this many steps, and always at the end. Default: about "
        f"{DEFAULT_EVALUATIONS} evaluations a run, each after a whole --steps_per_loop; "
        "0: only at the end.",
        "integer",
        loop=True,
        check=whole_number(1, _OFF, optional=True),
        from_flag=_zero_is_none,
        lower_bound=0,
    ),
    Setting(
        "early_stopping_metric",
        "training",
        "Stop training once this eval metric (e.g. loss, accuracy) has not improved for "
        "--early_stopping_patience evaluations in a row. A rerun of a stopped run stops "
        "again at once.",
        "string",
    ),
    Setting(
        "early_stopping_mode",
        "training",
        "min: lower --early_stopping_metric is better (loss); max: higher is better (accuracy).",
        "enum",
        flag_default="min",
        choices=tuple(METRIC_MODES),
    ),
    Setting(
        "early_stopping_patience",
        "training",
        "Evaluations in a row without improvement before stopping.",
        "integer",
        flag_default=3,
        lower_bound=1,
    ),
    Setting(
        "progress_every_seconds",
        "outputs",
        "End inner loops early enough that a progress line comes at least this often (one "
        "process only; 0: --steps_per_loop alone decides).",
        "float",
        flag_default=10.0,
        loop=True,
        check=positive_number(_OFF),
        from_flag=_zero_is_none,
        lower_bound=0.0,
    ),
    Setting(
        "model_dir",
        "outputs",
        "Directory for checkpoints, summaries and results.json. A run pointed at a directory "
        "with a checkpoint resumes from it. Default: a new directory under the system temp dir.",
        "string",
        loop=True,
    ),
    Setting(
        "checkpoint_every",
        "outputs",
        "Checkpoint every this many steps (always at the end).",
        "integer",
        loop=True,
        check=whole_number(1, _OFF, optional=True),
        lower_bound=1,
    ),
    Setting(
        "max_checkpoints",
        "outputs",
        "How many of the newest checkpoints MODEL_DIR/checkpoints keeps.",
        "integer",
        flag_default=3,
        loop=True,
        default=3,
        check=whole_number(1),
        lower_bound=1,
    ),
    Setting(
        "async_checkpoints",
        "outputs",
        "Write checkpoints in a background thread: a save copies the variables and training "
        "goes on while the files are written (one process; a cluster saves synchronously). "
        "Every promise holds: the state file names a checkpoint only once its files are "
        "written, and a run waits for its last save before results.json and its exit. Off "
        "by default: on 2 CPU cores the writer takes the step's cores (benchmarks/RESULTS.md).",
        "bool",
        flag_default=False,
        loop=True,
        default=False,
    ),
    Setting(
        "keep_best_metric",
        "outputs",
        "Keep a checkpoint of the best evaluation by this eval metric in MODEL_DIR/best "
        "(with best.json: its step and value).",
        "string",
    ),
    Setting(
        "keep_best_mode",
        "outputs",
        "min: lower --keep_best_metric is better (loss); max: higher is better (accuracy).",
        "enum",
        flag_default="min",
        choices=tuple(METRIC_MODES),
    ),
    Setting(
        "profile_steps",
        "outputs",
        "START,END: trace train steps START to END (from 1, both included) with TensorFlow's "
        "profiler into MODEL_DIR/summaries/train, for TensorBoard's Profile tab (pip install "
        "tensorboard-plugin-profile). Chief only.",
        "string",
        loop=True,
        check=check_profile_steps,
        from_flag=parse_profile_steps,
        flag_rule=(
            lambda value: value is None or parse_profile_steps(value) is not None,
            "--profile_steps must be START,END with 1 <= START <= END, e.g. --profile_steps=10,20.",
        ),
    ),
    Setting(
        "health_every",
        "outputs",
        "Training health, from every optimizer's update: each step the global norm of the "
        "summed gradient before clipping and whether it was clipped; every this many steps "
        "the update norm over the weight norm of each model and of the "
        f"{DEFAULT_HEALTH_LAYERS} layers where it is largest. TensorBoard under health/, "
        f"results.json's health, grad_norm in progress lines. E.g. {SUGGESTED_HEALTH_EVERY}. "
        "0: none, the default (on several replicas without --clip_norm they cost one more "
        "all-reduce of the gradient a step).",
        "integer",
        flag_default=0,
        loop=True,
        default=None,
        check=whole_number(1, _OFF, optional=True),
        from_flag=_zero_is_none,
        lower_bound=0,
    ),
    Setting(
        "on_nonfinite",
        "faults",
        "After a step whose loss or gradients are not finite on any replica: stop with an "
        "error (nothing saved after it; back to the last checkpoint), skip its update "
        "everywhere and go on, or recover: go back to the last checkpoint, move the train "
        "stream past every batch from there to the bad step, and go on (logged; not for "
        "--parameter_server_mode=async).",
        "enum",
        flag_default="stop",
        loop=True,
        default="stop",
        check=lambda name, value: _check_policy(name, value),
        choices=tuple(NONFINITE_POLICIES),
    ),
    Setting(
        "max_recoveries",
        "faults",
        "With --on_nonfinite=recover or --on_loss_spike=recover: recoveries a run may make "
        "(counted over resumes, both causes together) before the next bad step stops it with "
        f"an error. Default: {DEFAULT_MAX_RECOVERIES}.",
        "integer",
        loop=True,
        lower_bound=1,
    ),
    Setting(
        "on_loss_spike",
        "faults",
        "After a loss spike (a step's loss above --loss_spike_factor times its slow moving "
        "average for --loss_spike_steps steps in a row): ignore it, stop with an error (back "
        "to the last checkpoint), or recover as --on_nonfinite=recover does: back to the "
        "last checkpoint, the train stream moved past every batch from there to the spike.",
        "enum",
        flag_default="ignore",
        loop=True,
        default="ignore",
        check=one_of(LOSS_SPIKE_POLICIES),
        choices=LOSS_SPIKE_POLICIES,
    ),
    Setting(
        "loss_spike_factor",
        "faults",
        "A step's loss is high when above this many times its slow moving average.",
        "float",
        flag_default=DEFAULT_LOSS_SPIKE_FACTOR,
        loop=True,
        default=DEFAULT_LOSS_SPIKE_FACTOR,
        check=lambda name, value: _check_spike_factor(name, value),
        flag_rule=(
            lambda value: value > 1,
            "--loss_spike_factor must be > 1, e.g. --loss_spike_factor=4.",
        ),
    ),
    Setting(
        "loss_spike_steps",
        "faults",
        "High steps in a row that make a spike (one high batch is noise).",
        "integer",
        flag_default=DEFAULT_LOSS_SPIKE_STEPS,
        loop=True,
        default=DEFAULT_LOSS_SPIKE_STEPS,
        check=whole_number(1),
        lower_bound=1,
    ),
    Setting(
        "loss_spike_window",
        "faults",
        "Steps the slow moving average of the loss spans (an exponential average with decay "
        "1 - 1/window, debiased over the first steps); high steps do not enter it.",
        "integer",
        flag_default=DEFAULT_LOSS_SPIKE_WINDOW,
        loop=True,
        default=DEFAULT_LOSS_SPIKE_WINDOW,
        check=whole_number(2),
        lower_bound=2,
    ),
    # ---- h-psexact (issue 44): how parameter-server steps are applied. ----
    Setting(
        "parameter_server_mode",
        "strategy",
        "--strategy=parameter_server: exact (the workers compute the gradients of a step's "
        "slices on the same weights and the chief applies their sum once: the numbers of one "
        "process, resumable mid-stream) or async (each worker applies its own steps as soon "
        "as they are done: faster, not reproducible).",
        "enum",
        flag_default="exact",
        loop=True,
        default="exact",
        check=one_of(PARAMETER_SERVER_MODES),
        choices=PARAMETER_SERVER_MODES,
    ),
    # ---- end h-psexact ----
)

BY_NAME: Mapping[str, Setting] = {setting.name: setting for setting in SETTINGS}
# The `loops.Trainer` keyword arguments that are settings, in declaration order.
LOOP_SETTINGS: tuple[Setting, ...] = tuple(setting for setting in SETTINGS if setting.loop)


def _check_spike_factor(name: str, value: Any) -> float:
    if not _is_number(value) or not math.isfinite(value) or not value > 1:
        raise ValueError(
            f"{name} must be a number > 1 (a loss that many times its moving average is "
            f"high), got {value!r}; e.g. 4.0."
        )
    return value


def _check_policy(name: str, value: Any) -> str:
    if value not in NONFINITE_POLICIES:
        raise ValueError(f"{name} must be one of {NONFINITE_POLICIES}, got {value!r}.")
    return value


def check_loop_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """Each of `loops.Trainer`'s settings in `values`, checked by its declaration.

    Raises:
        ValueError: the first bad value, named with the fix.
    """
    return {name: BY_NAME[name].checked(value) for name, value in values.items()}
