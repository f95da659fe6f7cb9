"""Every setting the binaries share, declared once (`Setting`): its type, default, help,
heading, check, section and whether a resume may change it.

The command-line flags and their --help (`loops.cli.flags.define_binary_flags`), the
typed `loops.RunConfig` (generated from these into `loops.vocabulary.run_config_tree`
by `python -m loops.bin.config_source --write`), `loops.Trainer`'s keyword overrides
and their checks, the config a binary records (results.json, config.json) and what a
resumed run may change (`resumable`) all come from the declarations below, so a setting
cannot mean one thing on the command line and another in Python. `SECTIONS` says what
each section of the tree holds. Nothing here imports TensorFlow: a binary
answers --help before its import.
"""

from __future__ import annotations

from collections.abc import Mapping
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
from loops.vocabulary.declarations import (
    Setting,
    check_ema_decay,
    check_profile_steps,
    number_above,
    one_of,
    parse_profile_steps,
    positive_number,
    profile_steps_of_flag,
    satisfies,
    whole_number,
)
from loops.vocabulary.whole_numbers import is_whole

__all__ = [
    "SETTINGS",
    "Setting",
    "check_ema_decay",
    "check_profile_steps",
    "parse_profile_steps",
    "satisfies",
]

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
INF = float("inf")
# The sections of `loops.RunConfig`, in its order, each with what its settings decide. The
# last four are the configuration of the part of a run that reads them, as it takes them:
# the run's Placement, the Controller's options, the step options and the Updates' options.
SECTIONS = {
    "mode": "What the process does: train, evaluate a run's checkpoints, or find a learning rate.",
    "strategy": "Where the steps run: the tf.distribute strategy, its replicas, its cluster.",
    "run": "What a binary trains by: its steps, learning rate and clipping, and a resume's batch.",
    "placement": "How the Trainer places the run: the parameter-server mode, the global batch.",
    "controller": "How the run goes: inner loops, evaluations, checkpoints, outputs, stopping.",
    "step": "How a definition's steps compute: the seed, eagerness, bad steps and loss spikes.",
    "update": "How each loops.Update computes: precision, accumulation, XLA, averaging, health.",
}


_OFF = " (or None to turn it off)"
# Where the settings a `loops.Trainer` does not read are read (`Setting.elsewhere`).
_MODE_ELSEWHERE = (
    "the binaries read it (--mode); a Trainer trains, loops.evaluate_checkpoints(trainer, "
    "model_dir) evaluates a run's checkpoints and loops.find_learning_rate(trainer) runs the "
    "learning-rate range test"
)
_MADE_BY_THE_BINARIES = (
    "the binaries make their tf.distribute strategy by it; give a Trainer the strategy it "
    "runs in as strategy= (default: the current one)"
)
_RECORDED = (
    "the resume check reads it from the values given in record= (where a binary records its flags)"
)


def _find_lr_argument(argument: str) -> str:
    """Where a --find_lr_* setting goes in Python: `loops.find_learning_rate`'s `argument`."""
    return f"the binaries' --mode={FIND_LR} reads it; give {argument}= to loops.find_learning_rate"


def _zero_is_none(value: Any) -> Any:
    """--eval_every's 0 (only at the end) as None; unset, it is the binary's cadence."""
    return value or None


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
        section="mode",
        elsewhere=_MODE_ELSEWHERE,
        resumable=True,
        choices=(TRAIN, EVALUATE_CHECKPOINTS, FIND_LR),
    ),
    Setting(
        "evaluator_timeout",
        "mode",
        f"--mode={EVALUATE_CHECKPOINTS}: give up (exit 1) when no new checkpoint comes for "
        "this many seconds before the run ends; 0: wait for ever.",
        "float",
        section="mode",
        elsewhere=(
            "the binaries' --mode=evaluate_checkpoints reads it; give timeout_seconds= to "
            "loops.evaluate_checkpoints"
        ),
        resumable=True,
        default=3600.0,
        lower_bound=0.0,
    ),
    Setting(
        "find_lr_steps",
        "mode",
        f"--mode={FIND_LR}: train steps of the range test, the rate growing by the same "
        "factor each step from --find_lr_min_rate to --find_lr_max_rate (fewer when the "
        "loss blows up first).",
        "integer",
        section="mode",
        elsewhere=_find_lr_argument("steps"),
        resumable=True,
        default=DEFAULT_FIND_LR_STEPS,
        check=whole_number(2),
    ),
    Setting(
        "find_lr_min_rate",
        "mode",
        f"--mode={FIND_LR}: the learning rate of the first step.",
        "float",
        section="mode",
        elsewhere=_find_lr_argument("min_rate"),
        resumable=True,
        default=DEFAULT_FIND_LR_MIN_RATE,
        check=number_above(0, f"e.g. {DEFAULT_FIND_LR_MIN_RATE:g}"),
    ),
    Setting(
        "find_lr_max_rate",
        "mode",
        f"--mode={FIND_LR}: the learning rate of the last step (above --find_lr_min_rate).",
        "float",
        section="mode",
        elsewhere=_find_lr_argument("max_rate"),
        resumable=True,
        default=DEFAULT_FIND_LR_MAX_RATE,
        check=number_above(0, f"e.g. {DEFAULT_FIND_LR_MAX_RATE:g}"),
    ),
    Setting(
        "find_lr_stop_factor",
        "mode",
        f"--mode={FIND_LR}: stop once the smoothed loss is above this many times its lowest "
        "so far (the loss blew up), or not finite.",
        "float",
        section="mode",
        elsewhere=_find_lr_argument("stop_factor"),
        resumable=True,
        default=DEFAULT_FIND_LR_STOP_FACTOR,
        check=number_above(1, f"e.g. {DEFAULT_FIND_LR_STOP_FACTOR:g}"),
    ),
    Setting(
        "find_lr_loss",
        "mode",
        f"--mode={FIND_LR}: the train-step output the range test records. Default: loss, "
        "or, for a step with none, the sum of its outputs named *loss (the GAN's d_loss + "
        "g_loss, PPO's policy_loss + value_loss).",
        "string",
        section="mode",
        elsewhere=_find_lr_argument("loss"),
        resumable=True,
    ),
    Setting(
        "find_lr_dir",
        "mode",
        f"--mode={FIND_LR}: where lr_find.json (each step's rate and loss, the suggested "
        "rate and its rule) and lr_find.png (loss against the rate) go; nothing is written "
        "into --model_dir. Default: a new directory under the system temp dir.",
        "string",
        section="mode",
        elsewhere=_find_lr_argument("output_dir"),
        resumable=True,
        path=True,
    ),
    Setting(
        "strategy",
        "strategy",
        "tf.distribute strategy to train with. central_storage keeps the variables on one "
        "device (the CPU) and computes on --num_replicas devices.",
        "enum",
        section="strategy",
        elsewhere=_MADE_BY_THE_BINARIES,
        resumable=True,
        default="mirrored",
        choices=tuple(STRATEGY_NAMES),
    ),
    Setting(
        "parameter_server_mode",
        "strategy",
        "--strategy=parameter_server: exact (the workers compute the gradients of a step's "
        "slices on the same weights and the chief applies their sum once: the numbers of one "
        "process, resumable mid-stream) or async (each worker applies its own steps as soon "
        "as they are done: faster, not reproducible).",
        "enum",
        section="placement",
        resumable=True,
        default="exact",
        loop=True,
        choices=PARAMETER_SERVER_MODES,
    ),
    Setting(
        "num_replicas",
        "strategy",
        "Replicas for --strategy=mirrored or central_storage: that many GPUs when present, "
        "else the CPU split into that many logical devices. Default: every GPU, or "
        f"{DEFAULT_CPU_REPLICAS} logical CPUs without GPUs; 1 for the other strategies, which "
        "take their devices from the machine or the cluster.",
        "integer",
        section="strategy",
        elsewhere=_MADE_BY_THE_BINARIES,
        resumable=True,
        lower_bound=1,
    ),
    Setting(
        "cluster_timeout",
        "strategy",
        "Seconds a task of a TF_CONFIG cluster (multi_worker_mirrored, parameter_server) waits "
        "for the others to come up before it names the missing ones and exits. Default: "
        "$LOOPS_CLUSTER_TIMEOUT_SECONDS, else 600.",
        "float",
        section="strategy",
        elsewhere=_MADE_BY_THE_BINARIES,
        resumable=True,
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
        section="strategy",
        elsewhere=_MADE_BY_THE_BINARIES,
        resumable=True,
        default="auto",
        choices=CLUSTER_SOURCES,
    ),
    Setting(
        "cluster_port",
        "strategy",
        "--cluster=slurm or kubernetes: the port of each node's first task (a node's next "
        "tasks take the ports after it). Default: Kubernetes 2222; SLURM a port from 20000 "
        "that follows SLURM_JOB_ID, so jobs sharing a node differ.",
        "integer",
        section="strategy",
        elsewhere=_MADE_BY_THE_BINARIES,
        resumable=True,
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
        section="strategy",
        elsewhere=_MADE_BY_THE_BINARIES,
        resumable=True,
        default=0,
        lower_bound=0,
    ),
    Setting(
        "allow_batch_size_change",
        "training",
        "Resume a run in --model_dir with another --global_batch_size than it was trained "
        "with (refused otherwise: only the same global batch continues exactly, whatever "
        "the workers and replicas). The change is recorded in results.json.",
        "bool",
        section="run",
        elsewhere=_RECORDED,
        resumable=True,
        default=False,
    ),
    Setting(
        "train_steps",
        "training",
        "Total training steps (a resumed run trains up to this step).",
        "integer",
        section="run",
        elsewhere="a Trainer trains up to the step given to trainer.train(num_steps)",
        resumable=True,
        lower_bound=1,
    ),
    Setting(
        "global_batch_size",
        "training",
        "Examples per step over all replicas (the binaries batch their data by it). A "
        "Trainer, which takes the global batches of train_data= and eval_data= as they "
        "come, reads it as the most examples a step's batch holds: a table's lookups on "
        "several replicas are sized by its share of it for batches of no static size.",
        "integer",
        section="placement",
        lower_bound=1,
        loop=True,
    ),
    Setting(
        "steps_per_loop",
        "training",
        "Steps per inner loop: a progress line and summaries each; one tf.function call runs "
        "one or, where nothing else comes between them, several.",
        "integer",
        section="controller",
        resumable=True,
        default=100,
        loop=True,
        check=whole_number(1),
    ),
    Setting(
        "learning_rate",
        "training",
        "Optimizer learning rate (> 0).",
        "float",
        section="run",
        elsewhere=(
            "the binaries give it to the optimizer their definition makes; give it to the "
            "optimizer yours makes"
        ),
        check=satisfies(lambda value: value > 0, "{name} must be > 0, e.g. {name}=0.001."),
    ),
    Setting(
        "seed",
        "training",
        "Seed for initial weights, shuffling and noise.",
        "integer",
        section="step",
        default=0,
        loop=True,
        check=whole_number(0),
    ),
    Setting(
        "run_eagerly",
        "training",
        "Run steps eagerly (no tf.function), for debugging.",
        "bool",
        section="step",
        default=False,
        loop=True,
    ),
    Setting(
        "clip_norm",
        "training",
        "Clip each update's gradient, summed over replicas, to this global norm (> 0). "
        "Default: the loop's own (off for the classifier and the GAN, 0.5 for ppo, 10 for dqn).",
        "float",
        section="run",
        elsewhere=(
            "the binaries give it to the definition, whose loops.Update clips by it; give "
            "clip_norm= to the definition or to its loops.Update"
        ),
        check=satisfies(
            lambda value: value > 0, "{name} must be > 0, e.g. {name}=1.0 (or leave it unset)."
        ),
    ),
    Setting(
        "grad_accum_steps",
        "training",
        "Cut each replica's share of a step into this many micro-batches and add up their "
        "gradients into one update: the update of the whole batch, with 1/K of the "
        "activations in memory. The RL loops draw their own minibatches and take only 1.",
        "integer",
        section="update",
        default=1,
        loop=True,
        check=whole_number(1, " (1: no accumulation)"),
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
        section="update",
        default=False,
        loop=True,
    ),
    Setting(
        "mixed_precision",
        "training",
        "Compute in 16 bits with float32 variables: mixed_bfloat16, or mixed_float16 with a "
        "dynamic loss scale agreed on by all replicas (one per optimizer, checkpointed); "
        "none: float32.",
        "enum",
        section="update",
        default="none",
        loop=True,
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
        section="update",
        loop=True,
        check=whole_number(1, " (or None for the default)", optional=True),
    ),
    Setting(
        "ema_decay",
        "training",
        "Keep a moving average of the trained weights with this decay (e.g. 0.999; lowered "
        "early in training so the average follows the weights), checkpointed beside them; "
        "evaluation, the best checkpoint's metric and the export use it. 0: no average.",
        "float",
        section="update",
        loop=True,
        check=check_ema_decay,
        off=0.0,
    ),
    Setting(
        "eval_every",
        "training",
        f"Evaluate every this many steps, and always at the end. Default: about "
        f"{DEFAULT_EVALUATIONS} evaluations a run, each after a whole --steps_per_loop; "
        "0: only at the end.",
        "integer",
        section="controller",
        resumable=True,
        loop=True,
        check=whole_number(1, _OFF, optional=True),
        from_flag=_zero_is_none,
    ),
    Setting(
        "early_stopping_metric",
        "training",
        "Stop training once this eval metric (e.g. loss, accuracy) has not improved for "
        "--early_stopping_patience evaluations in a row. A rerun of a stopped run stops "
        "again at once.",
        "string",
        section="controller",
        loop=True,
    ),
    Setting(
        "early_stopping_mode",
        "training",
        "min: lower --early_stopping_metric is better (loss); max: higher is better (accuracy).",
        "enum",
        section="controller",
        loop=True,
        default="min",
        choices=tuple(METRIC_MODES),
    ),
    Setting(
        "early_stopping_patience",
        "training",
        "Evaluations in a row without improvement before stopping.",
        "integer",
        section="controller",
        loop=True,
        default=3,
        lower_bound=1,
    ),
    Setting(
        "progress_every_seconds",
        "outputs",
        "End inner loops early enough that a progress line comes at least this often (one "
        "process only; 0: --steps_per_loop alone decides).",
        "float",
        section="controller",
        loop=True,
        check=positive_number(_OFF),
        off=0.0,
    ),
    Setting(
        "model_dir",
        "outputs",
        "Directory for checkpoints, summaries and results.json. A run pointed at a directory "
        "with a checkpoint resumes from it. Default: a new directory under the system temp dir.",
        "string",
        section="controller",
        resumable=True,
        loop=True,
        path=True,
    ),
    Setting(
        "checkpoint_every",
        "outputs",
        "Checkpoint every this many steps (always at the end).",
        "integer",
        section="controller",
        resumable=True,
        loop=True,
        check=whole_number(1, _OFF, optional=True),
    ),
    Setting(
        "max_checkpoints",
        "outputs",
        "How many of the newest checkpoints MODEL_DIR/checkpoints keeps.",
        "integer",
        section="controller",
        resumable=True,
        default=3,
        loop=True,
        check=whole_number(1),
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
        section="controller",
        default=False,
        loop=True,
    ),
    Setting(
        "keep_best_metric",
        "outputs",
        "Keep a checkpoint of the best evaluation by this eval metric in MODEL_DIR/best "
        "(with best.json: its step and value).",
        "string",
        section="controller",
        loop=True,
    ),
    Setting(
        "keep_best_mode",
        "outputs",
        "min: lower --keep_best_metric is better (loss); max: higher is better (accuracy).",
        "enum",
        section="controller",
        loop=True,
        default="min",
        choices=tuple(METRIC_MODES),
    ),
    Setting(
        "profile_steps",
        "outputs",
        "START,END (e.g. --profile_steps=10,20): trace train steps START to END (from 1, both "
        "included) with TensorFlow's profiler into MODEL_DIR/summaries/train, for "
        "TensorBoard's Profile tab (pip install tensorboard-plugin-profile). Chief only.",
        "string",
        section="controller",
        loop=True,
        check=check_profile_steps,
        from_flag=profile_steps_of_flag,
        annotation="tuple[int, int] | None",
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
        section="update",
        resumable=True,
        loop=True,
        check=whole_number(1, _OFF, optional=True),
        off=0,
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
        section="step",
        default="stop",
        loop=True,
        check=lambda name, value: _check_policy(name, value),
        choices=tuple(NONFINITE_POLICIES),
        reaction=True,
    ),
    Setting(
        "max_recoveries",
        "faults",
        "With --on_nonfinite=recover or --on_loss_spike=recover: recoveries a run may make "
        "(counted over resumes, both causes together) before the next bad step stops it with "
        f"an error. Default: {DEFAULT_MAX_RECOVERIES}.",
        "integer",
        section="step",
        resumable=True,
        loop=True,
        check=lambda name, value: _check_max_recoveries(name, value),
    ),
    Setting(
        "on_loss_spike",
        "faults",
        "After a loss spike (a step's loss above --loss_spike_factor times its slow moving "
        "average for --loss_spike_steps steps in a row): ignore it, stop with an error (back "
        "to the last checkpoint), or recover as --on_nonfinite=recover does: back to the "
        "last checkpoint, the train stream moved past every batch from there to the spike.",
        "enum",
        section="step",
        resumable=True,
        default="ignore",
        loop=True,
        check=one_of(LOSS_SPIKE_POLICIES),
        choices=LOSS_SPIKE_POLICIES,
        reaction=True,
    ),
    Setting(
        "loss_spike_factor",
        "faults",
        "A step's loss is high when above this many times its slow moving average.",
        "float",
        section="step",
        resumable=True,
        default=DEFAULT_LOSS_SPIKE_FACTOR,
        loop=True,
        check=lambda name, value: _check_spike_factor(name, value),
    ),
    Setting(
        "loss_spike_steps",
        "faults",
        "High steps in a row that make a spike (one high batch is noise).",
        "integer",
        section="step",
        resumable=True,
        default=DEFAULT_LOSS_SPIKE_STEPS,
        loop=True,
        check=whole_number(1),
    ),
    Setting(
        "loss_spike_window",
        "faults",
        "Steps the slow moving average of the loss spans (an exponential average with decay "
        "1 - 1/window, debiased over the first steps); high steps do not enter it.",
        "integer",
        section="step",
        resumable=True,
        default=DEFAULT_LOSS_SPIKE_WINDOW,
        loop=True,
        check=whole_number(2),
    ),
)

BY_NAME: Mapping[str, Setting] = {setting.name: setting for setting in SETTINGS}
# The `loops.Trainer` keyword arguments that are settings, in declaration order.
TRAINER_SETTINGS: tuple[Setting, ...] = tuple(setting for setting in SETTINGS if setting.loop)
# The built-in bad-step rules' reactions ("on_nonfinite", ...), in the order declared.
REACTIONS: tuple[str, ...] = tuple(setting.name for setting in SETTINGS if setting.reaction)
# The flags every binary has that are not declared here: absl's own.
ABSL_FLAGS_FREE_TO_CHANGE = frozenset({"verbosity"})


def export_dir_setting(what: str) -> Setting:
    """The --export_dir of a binary that exports `what` at the end of training."""
    return Setting(
        "export_dir",
        "outputs",
        f"Where to export {what} as a SavedModel at the end of training "
        "(a directory that exists must hold an earlier export: this --model_dir's, or "
        "another's with --replace_export). Default: MODEL_DIR/export.",
        "string",
        resumable=True,
        path=True,
    )


REPLACE_EXPORT = Setting(
    "replace_export",
    "outputs",
    "Let the export at the end of training replace an --export_dir that holds another "
    "run's export (one another --model_dir wrote, or one that does not say which); refused "
    "before any training otherwise.",
    "bool",
    resumable=True,
    default=False,
)


def export_settings(what: str) -> tuple[Setting, Setting]:
    """--export_dir and --replace_export of a binary that exports `what` at the end of
    training."""
    return export_dir_setting(what), REPLACE_EXPORT


def free_to_change() -> frozenset[str]:
    """The config keys a resumed run may change without a warning: the `resumable`
    declarations (of `SETTINGS` as they are now), the export's and absl's --verbosity."""
    declared = (*SETTINGS, *export_settings(""))
    return frozenset(s.name for s in declared if s.resumable) | ABSL_FLAGS_FREE_TO_CHANGE


def _check_spike_factor(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 < value < INF:
        raise ValueError(
            f"{name} must be a number > 1 (a loss that many times its moving average is "
            f"high), got {value!r}; e.g. 4.0."
        )
    return value


def _check_max_recoveries(name: str, value: Any) -> int | None:
    if value is not None and not is_whole(value, 1):
        raise ValueError(
            f"{name} must be a whole number >= 1, got {value!r}; to stop at the first "
            "non-finite step, pass on_nonfinite='stop' instead."
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
