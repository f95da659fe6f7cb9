"""The typed tree of a run's settings, generated from loops/vocabulary/settings.py
by `python -m loops.bin.config_source --write`: edit the declarations there, not this file.

`RunConfig` holds a section per `settings.SECTIONS`, each field a setting with its
declared default and type, checked by its declaration when made (`ConfigSection`).
"""

from __future__ import annotations

import dataclasses

from loops.vocabulary.config_tree import ConfigSection, ConfigTree


@dataclasses.dataclass(frozen=True)
class ModeSettings(ConfigSection):
    """mode: What the process does: train, evaluate a run's checkpoints, or find a learning rate."""

    mode: str | None = None
    """train: train (and evaluate) the model. evaluate_checkpoints: in a process of its own,
    evaluate each checkpoint the run in --model_dir writes, once, as it appears, until the
    run's last (--train_steps), on this host's devices (a cluster --strategy becomes
    default), with the run's model and data settings from MODEL_DIR/config.json; results in
    MODEL_DIR/evaluator. Unset: train, or evaluate_checkpoints on a task TF_CONFIG names
    'evaluator' (loops-launch --evaluator). find_lr: the learning-rate range test (the
    --find_lr_* flags), from the newest checkpoint in --model_dir if it holds one (read
    only), else from the initial weights; writes only into --find_lr_dir.
    """

    evaluator_timeout: float = 3600.0
    """--mode=evaluate_checkpoints: give up (exit 1) when no new checkpoint comes for this many
    seconds before the run ends; 0: wait for ever.
    """

    find_lr_steps: int = 100
    """--mode=find_lr: train steps of the range test, the rate growing by the same factor each
    step from --find_lr_min_rate to --find_lr_max_rate (fewer when the loss blows up first).
    """

    find_lr_min_rate: float = 1e-07
    """--mode=find_lr: the learning rate of the first step."""

    find_lr_max_rate: float = 10.0
    """--mode=find_lr: the learning rate of the last step (above --find_lr_min_rate)."""

    find_lr_stop_factor: float = 4.0
    """--mode=find_lr: stop once the smoothed loss is above this many times its lowest so far
    (the loss blew up), or not finite.
    """

    find_lr_loss: str | None = None
    """--mode=find_lr: the train-step output the range test records. Default: loss, or, for a
    step with none, the sum of its outputs named *loss (the GAN's d_loss + g_loss, PPO's
    policy_loss + value_loss).
    """

    find_lr_dir: str | None = None
    """--mode=find_lr: where lr_find.json (each step's rate and loss, the suggested rate and its
    rule) and lr_find.png (loss against the rate) go; nothing is written into --model_dir.
    Default: a new directory under the system temp dir.
    """


@dataclasses.dataclass(frozen=True)
class StrategySettings(ConfigSection):
    """strategy: Where the steps run: the tf.distribute strategy, its replicas, its cluster."""

    strategy: str = "mirrored"
    """tf.distribute strategy to train with. central_storage keeps the variables on one device
    (the CPU) and computes on --num_replicas devices.
    """

    num_replicas: int | None = None
    """Replicas for --strategy=mirrored or central_storage: that many GPUs when present, else
    the CPU split into that many logical devices. Default: every GPU, or 2 logical CPUs
    without GPUs; 1 for the other strategies, which take their devices from the machine or
    the cluster.
    """

    cluster_timeout: float | None = None
    """Seconds a task of a TF_CONFIG cluster (multi_worker_mirrored, parameter_server) waits for
    the others to come up before it names the missing ones and exits. Default:
    $LOOPS_CLUSTER_TIMEOUT_SECONDS, else 600.
    """

    cluster: str = "auto"
    """Where the tasks of multi_worker_mirrored and parameter_server find their cluster: auto
    tries TF_CONFIG, then SLURM's srun (SLURM_PROCID, the step's node list and tasks per
    node), then a Kubernetes Indexed Job (JOB_COMPLETION_INDEX, $LOOPS_CLUSTER_TASKS,
    $LOOPS_CLUSTER_SERVICE), and names what it looked for when none is there.
    """

    cluster_port: int | None = None
    """--cluster=slurm or kubernetes: the port of each node's first task (a node's next tasks
    take the ports after it). Default: Kubernetes 2222; SLURM a port from 20000 that follows
    SLURM_JOB_ID, so jobs sharing a node differ.
    """

    cluster_num_ps: int = 0
    """--strategy=parameter_server with --cluster=slurm or kubernetes: how many tasks are
    parameter servers. Task 0 is the chief, the next this many the servers, the rest workers.
    """


@dataclasses.dataclass(frozen=True)
class RunSettings(ConfigSection):
    """run: What a binary trains by: its steps, learning rate and clipping, and a resume's batch."""

    allow_batch_size_change: bool = False
    """Resume a run in --model_dir with another --global_batch_size than it was trained with
    (refused otherwise: only the same global batch continues exactly, whatever the workers
    and replicas). The change is recorded in results.json.
    """

    train_steps: int | None = None
    """Total training steps (a resumed run trains up to this step)."""

    learning_rate: float | None = None
    """Optimizer learning rate (> 0)."""

    clip_norm: float | None = None
    """Clip each update's gradient, summed over replicas, to this global norm (> 0). Default:
    the loop's own (off for the classifier and the GAN, 0.5 for ppo, 10 for dqn).
    """


@dataclasses.dataclass(frozen=True)
class PlacementSettings(ConfigSection):
    """placement: How the Trainer places the run: the parameter-server mode, the global batch."""

    parameter_server_mode: str = "exact"
    """--strategy=parameter_server: exact (the workers compute the gradients of a step's slices
    on the same weights and the chief applies their sum once: the numbers of one process,
    resumable mid-stream) or async (each worker applies its own steps as soon as they are
    done: faster, not reproducible).
    """

    global_batch_size: int | None = None
    """Examples per step over all replicas (the binaries batch their data by it). A Trainer,
    which takes the global batches of train_data= and eval_data= as they come, reads it as
    the most examples a step's batch holds: a table's lookups on several replicas are sized
    by its share of it for batches of no static size.
    """


@dataclasses.dataclass(frozen=True)
class ControllerSettings(ConfigSection):
    """controller: How the run goes: inner loops, evaluations, checkpoints, outputs, stopping."""

    steps_per_loop: int = 100
    """Steps per inner loop: a progress line and summaries each; one tf.function call runs one
    or, where nothing else comes between them, several.
    """

    eval_every: int | None = None
    """Evaluate every this many steps, and always at the end. Default: about 5 evaluations a
    run, each after a whole --steps_per_loop; 0: only at the end.
    """

    early_stopping_metric: str | None = None
    """Stop training once this eval metric (e.g. loss, accuracy) has not improved for
    --early_stopping_patience evaluations in a row. A rerun of a stopped run stops again at
    once.
    """

    early_stopping_mode: str = "min"
    """min: lower --early_stopping_metric is better (loss); max: higher is better (accuracy)."""

    early_stopping_patience: int = 3
    """Evaluations in a row without improvement before stopping."""

    progress_every_seconds: float | None = None
    """End inner loops early enough that a progress line comes at least this often (one process
    only; 0: --steps_per_loop alone decides).
    """

    model_dir: str | None = None
    """Directory for checkpoints, summaries and results.json. A run pointed at a directory with
    a checkpoint resumes from it. Default: a new directory under the system temp dir.
    """

    checkpoint_every: int | None = None
    """Checkpoint every this many steps (always at the end)."""

    max_checkpoints: int = 3
    """How many of the newest checkpoints MODEL_DIR/checkpoints keeps."""

    async_checkpoints: bool = False
    """Write checkpoints in a background thread: a save copies the variables and training goes
    on while the files are written (one process; a cluster saves synchronously). Every
    promise holds: the state file names a checkpoint only once its files are written, and a
    run waits for its last save before results.json and its exit. Off by default: on 2 CPU
    cores the writer takes the step's cores (benchmarks/RESULTS.md).
    """

    keep_best_metric: str | None = None
    """Keep a checkpoint of the best evaluation by this eval metric in MODEL_DIR/best (with
    best.json: its step and value).
    """

    keep_best_mode: str = "min"
    """min: lower --keep_best_metric is better (loss); max: higher is better (accuracy)."""

    profile_steps: tuple[int, int] | None = None
    """START,END (e.g. --profile_steps=10,20): trace train steps START to END (from 1, both
    included) with TensorFlow's profiler into MODEL_DIR/summaries/train, for TensorBoard's
    Profile tab (pip install tensorboard-plugin-profile). Chief only.
    """


@dataclasses.dataclass(frozen=True)
class StepSettings(ConfigSection):
    """step: How a definition's steps compute: the seed, eagerness, bad steps and loss spikes."""

    seed: int = 0
    """Seed for initial weights, shuffling and noise."""

    run_eagerly: bool = False
    """Run steps eagerly (no tf.function), for debugging."""

    on_nonfinite: str = "stop"
    """After a step whose loss or gradients are not finite on any replica: stop with an error
    (nothing saved after it; back to the last checkpoint), skip its update everywhere and go
    on, or recover: go back to the last checkpoint, move the train stream past every batch
    from there to the bad step, and go on (logged; not for --parameter_server_mode=async).
    """

    max_recoveries: int | None = None
    """With --on_nonfinite=recover or --on_loss_spike=recover: recoveries a run may make
    (counted over resumes, both causes together) before the next bad step stops it with an
    error. Default: 3.
    """

    on_loss_spike: str = "ignore"
    """After a loss spike (a step's loss above --loss_spike_factor times its slow moving average
    for --loss_spike_steps steps in a row): ignore it, stop with an error (back to the last
    checkpoint), or recover as --on_nonfinite=recover does: back to the last checkpoint, the
    train stream moved past every batch from there to the spike.
    """

    loss_spike_factor: float = 4.0
    """A step's loss is high when above this many times its slow moving average."""

    loss_spike_steps: int = 3
    """High steps in a row that make a spike (one high batch is noise)."""

    loss_spike_window: int = 100
    """Steps the slow moving average of the loss spans (an exponential average with decay 1 -
    1/window, debiased over the first steps); high steps do not enter it.
    """


@dataclasses.dataclass(frozen=True)
class UpdateSettings(ConfigSection):
    """update: How each loops.Update computes: precision, accumulation, XLA, averaging, health."""

    grad_accum_steps: int = 1
    """Cut each replica's share of a step into this many micro-batches and add up their
    gradients into one update: the update of the whole batch, with 1/K of the activations in
    memory. The RL loops draw their own minibatches and take only 1.
    """

    jit_compile: bool = False
    """Compile each replica's forward and backward pass through the trained model with XLA
    (tf.function(jit_compile=True)); the collectives, the optimizer's update and the rest of
    the step stay TensorFlow's. Refused, before any step, where it cannot compile:
    --run_eagerly, the central_storage and parameter_server strategies, a layer that
    all-reduces across replicas (--batch_norm) or one Keras marks as not jit-compilable.
    Dropout draws other masks compiled than not.
    """

    mixed_precision: str = "none"
    """Compute in 16 bits with float32 variables: mixed_bfloat16, or mixed_float16 with a
    dynamic loss scale agreed on by all replicas (one per optimizer, checkpointed); none:
    float32.
    """

    loss_scale_growth_steps: int | None = None
    """With --mixed_precision=mixed_float16: finite steps in a row after which the loss scale
    doubles. Default: 2000.
    """

    ema_decay: float | None = None
    """Keep a moving average of the trained weights with this decay (e.g. 0.999; lowered early
    in training so the average follows the weights), checkpointed beside them; evaluation,
    the best checkpoint's metric and the export use it. 0: no average.
    """

    health_every: int | None = None
    """Training health, from every optimizer's update: each step the global norm of the summed
    gradient before clipping and whether it was clipped; every this many steps the update
    norm over the weight norm of each model and of the 3 layers where it is largest.
    TensorBoard under health/, results.json's health, grad_norm in progress lines. E.g. 10.
    0: none, the default (on several replicas without --clip_norm they cost one more
    all-reduce of the gradient a step).
    """


@dataclasses.dataclass(frozen=True)
class RunConfig(ConfigTree):
    """A run's settings, section by section.

    Made by `RunConfig.from_flat({...})`, `RunConfig().replace(steps_per_loop=10)` or
    `RunConfig.from_json(MODEL_DIR/config.json)`; `loops.Trainer(definition, config)`
    reads the sections it runs by."""

    mode: ModeSettings = dataclasses.field(default_factory=ModeSettings)

    strategy: StrategySettings = dataclasses.field(default_factory=StrategySettings)

    run: RunSettings = dataclasses.field(default_factory=RunSettings)

    placement: PlacementSettings = dataclasses.field(default_factory=PlacementSettings)

    controller: ControllerSettings = dataclasses.field(default_factory=ControllerSettings)

    step: StepSettings = dataclasses.field(default_factory=StepSettings)

    update: UpdateSettings = dataclasses.field(default_factory=UpdateSettings)
