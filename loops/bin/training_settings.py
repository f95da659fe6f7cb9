"""The binaries' own training settings (`loops.vocabulary.settings.Setting`): what each kind
of loop takes.

The optimizer and learning-rate schedule of the classifier, and the keywords of
the GAN, RL and LM loops that a binary exposes as flags. Nothing here imports
TensorFlow: a binary declares its flags from these before --help.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from absl import app, flags

from loops.cli import flags as loop_flags
from loops.vocabulary.host_memory import in_units, memory_bytes
from loops.vocabulary.settings import Setting, satisfies

# loops.bin.classifier: `optimizer_fn`.
OPTIMIZER: tuple[Setting, ...] = (
    Setting(
        "optimizer",
        "training",
        "Optimizer: Adam, plain SGD, or SGD with momentum 0.9.",
        "enum",
        default="adam",
        choices=("adam", "sgd", "momentum"),
    ),
    Setting(
        "lr_schedule",
        "training",
        "Learning-rate schedule over the run (peak: --learning_rate).",
        "enum",
        default="constant",
        choices=("constant", "step", "cosine", "warmup_cosine"),
    ),
    Setting(
        "lr_warmup_steps",
        "training",
        "warmup_cosine: linear warm-up steps.",
        "integer",
        default=0,
        lower_bound=0,
    ),
    Setting(
        "lr_step_size",
        "training",
        "step: steps between rate drops.",
        "integer",
        default=1000,
        lower_bound=1,
    ),
    Setting(
        "lr_step_factor",
        "training",
        "step: factor of each drop, in (0, 1].",
        "float",
        default=0.1,
        check=satisfies(
            lambda value: 0 < value <= 1,
            "{name} must lie in (0, 1]: each drop multiplies the rate by it; e.g. {name}=0.1.",
        ),
    ),
    Setting(
        "lr_final_fraction",
        "training",
        "cosine, warmup_cosine: final rate as a fraction of --learning_rate, in [0, 1].",
        "float",
        default=0.0,
        check=satisfies(
            lambda value: 0 <= value <= 1,
            "{name} must lie in [0, 1]: the rate decays to that fraction of "
            "--learning_rate; e.g. {name}=0.1.",
        ),
    ),
)


def optimizer_fn(
    values: dict[str, Any], *, learning_rate: float, total_steps: int
) -> Callable[[], Any]:
    """() -> the optimizer the OPTIMIZER settings name (Adam, SGD or SGD with momentum 0.9),
    at the learning rate of their schedule.

    Raises:
        ValueError: a schedule setting out of its range (`loops.core.schedules`).
    """
    import keras

    from loops.core import schedules

    rate = schedules.make_schedule(
        values["lr_schedule"],
        learning_rate=learning_rate,
        total_steps=total_steps,
        warmup_steps=values["lr_warmup_steps"],
        step_size=values["lr_step_size"],
        step_factor=values["lr_step_factor"],
        final_fraction=values["lr_final_fraction"],
    )
    if values["optimizer"] == "adam":
        return adam_fn(rate)
    return lambda: keras.optimizers.SGD(
        rate, momentum=0.9 if values["optimizer"] == "momentum" else 0.0
    )


# loops.bin.ctr and loops.bin.recommender: the embedding tables' own optimizer
# (`loops.Update`'s table_optimizer), and where the tables live.
TABLE_OPTIMIZER: tuple[Setting, ...] = (
    Setting(
        "table_optimizer",
        "training",
        "Optimizer of the embedding tables: 'same' trains them with --optimizer (Adam's "
        "update reads and writes every row of a table each step); 'rowwise_adagrad' (one "
        "accumulator a row), 'adagrad' and 'sgd' update only the rows a step looks up, "
        "exactly as their dense update would, while --optimizer trains the other weights.",
        "enum",
        default="same",
        choices=("same", "rowwise_adagrad", "adagrad", "sgd"),
    ),
    Setting(
        "table_learning_rate",
        "training",
        "Learning rate of a --table_optimizer of the tables' own, constant over the run "
        "(Adagrad's accumulators already decay each row's steps); 0: --learning_rate's.",
        "float",
        default=0.0,
        lower_bound=0.0,
    ),
    Setting(
        "placed_tables",
        "training",
        "Make the embedding tables loops.EmbeddingTables placed by the strategy: split by "
        "rows over the replicas of --strategy=mirrored and multi_worker_mirrored (each "
        "replica holding only its block and its slots) and over the servers of "
        "parameter_server, trained by --table_optimizer, which must then name one. false: "
        "keras Embeddings, a whole copy on every replica (README, 'Where a table lives').",
        "bool",
        default=False,
    ),
)


# Where a click-through or recommender run starts (`loops.WarmStart`, docs/library.md).
WARM_START: tuple[Setting, ...] = (
    Setting(
        "warm_start_from",
        "training",
        "Start a new run from another run's model_dir (its newest checkpoint) instead of the "
        "initial values: the variables --warm_start_variables names are taken, each user, "
        "item or column table's rows remapped through the two runs' ids so that an id keeps "
        "its row (a new id starts as it would), the rest as built; results.json's warm_start "
        "says what was taken, remapped and left. Applied once: a resume goes on from its own "
        "checkpoints. Empty: the initial values.",
        "string",
        default=None,
        path=True,
        resumable=True,
    ),
    Setting(
        "warm_start_variables",
        "training",
        "With --warm_start_from: a regular expression of the variable names to take, "
        "matching each whole name (alternatives joined by |; docs/library.md, 'Warm "
        "starts'); 'model/.*' takes the model's weights and its tables' row-rule slots, not "
        "--optimizer's slots, the step or any learning rate (this run's flags).",
        "string",
        default="model/.*",
        resumable=True,
    ),
    Setting(
        "continue_from",
        "training",
        "Go on from another run of this model on a new log (the next day's): its newest "
        "checkpoint's every variable taken (weights, optimizer and row-rule slots, the step "
        "counter: --train_steps is the step to reach, past that run's), the ids growing by "
        "the new log's (a recommender's ids.json, a click model's vocabularies in "
        "features.json: that run's first, each keeping its row, then the new ones; a click "
        "model's scales kept), the learning rate this run's flags'. results.json's "
        "warm_start keeps the lineage of runs. Applied once: a resume goes on from its own "
        "checkpoints. Empty: the initial values.",
        "string",
        default=None,
        path=True,
    ),
    Setting(
        "export_deltas",
        "training",
        "With --continue_from: after each evaluation that keeps a best and after this run's "
        "export, write MODEL_DIR/deltas/NNNNNN, what changed from the export before it (the "
        "first: the export of the run continued from, its --export_dir, else its "
        "MODEL_DIR/export): each table's rows that differ, the dense weights, the files that "
        "differ. loops-apply-deltas patches that export into this run's bit for bit "
        "(docs/recommenders.md, 'Delta exports'). Without --continue_from the export is a "
        "chain's first and no delta is written.",
        "bool",
        default=False,
        resumable=True,
    ),
)


def delta_base(values: dict[str, Any]) -> str | None:
    """The export a run's delta follows: with --export_deltas and --continue_from, the export
    of the run continued from (the --export_dir its config.json records, else its
    MODEL_DIR/export); None otherwise.

    Raises:
        ValueError: that export holds no SavedModel, naming it and the fix.
    """
    from loops.model_dir import run_config

    source = values["continue_from"]
    if not (values["export_deltas"] and source):
        return None
    recorded = (run_config.read_if_intact(source) or {}).get("export_dir")
    base = recorded or os.path.join(source, "export")
    if not os.path.isfile(os.path.join(base, "saved_model.pb")):
        raise ValueError(
            f"--export_deltas writes what changed from the export of --continue_from="
            f"{source!r}, and {base} holds no SavedModel: export that run first (rerun its "
            "command: it exports without training), or drop --export_deltas."
        )
    return base


def check_warm_start(values: dict[str, Any], model_dir: str | None) -> None:
    """Refuses a --warm_start_from or --continue_from that is no directory or is the run's
    own --model_dir, and the two together, before TensorFlow loads.

    Raises:
        ValueError: naming the value and the fix.
    """
    given = [name for name in ("warm_start_from", "continue_from") if values[name] is not None]
    if len(given) == 2:
        raise ValueError(
            f"--warm_start_from={values['warm_start_from']!r} and "
            f"--continue_from={values['continue_from']!r} are two starts of one run: pass "
            "--continue_from to go on from a run of this model (every variable and its step), "
            "or --warm_start_from to take some variables of another."
        )
    for name in given:
        source = values[name]
        if not os.path.isdir(source):
            raise ValueError(
                f"--{name}={source!r} is no directory; pass the model_dir of the run to "
                "start from, or leave it empty to start from the initial values."
            )
        if model_dir and os.path.realpath(source) == os.path.realpath(model_dir):
            raise ValueError(
                f"--{name}={source!r} is this run's own --model_dir, which a run resumes "
                f"from as it is: drop --{name} to resume, or pass a new --model_dir to "
                "start a new run from it."
            )


def check_steps_past(start: Any, train_steps: int) -> None:
    """Refuses a --train_steps that a --continue_from run (`start`, a continuation's
    `loops.WarmStart`) has reached already: the step counter goes on from that run's.

    Raises:
        ValueError: naming both steps and the fix.
    """
    step = start.source_step()
    if step is not None and train_steps <= step:
        raise ValueError(
            f"--train_steps={train_steps} is a step the run --continue_from={start.checkpoint!r}"
            f" reached already (step {step}): its step counter goes on, and --train_steps is "
            f"the step to reach; pass --train_steps={step + train_steps} to train "
            f"{train_steps} steps more."
        )


def check_continued_steps(start: Any, train_steps: int) -> None:
    """Refuses a --train_steps that a --continue_from run (`start`, the run's
    `loops.WarmStart`, or None without a start) reached already (`check_steps_past`).

    Raises:
        ValueError: as `check_steps_past`.
    """
    if start is not None and start.continues:
        check_steps_past(start, train_steps)


def check_placed_tables(values: dict[str, Any]) -> None:
    """Refuses --placed_tables without a table optimizer of their own, before TensorFlow loads.

    Raises:
        ValueError: --placed_tables with --table_optimizer=same.
    """
    if values["placed_tables"] and values["table_optimizer"] == "same":
        raise ValueError(
            "--placed_tables makes each table a loops.EmbeddingTable, which trains by an "
            "exact row update of its own, and --table_optimizer=same would train it with "
            "--optimizer: pass --table_optimizer=rowwise_adagrad, adagrad or sgd (with "
            "--table_learning_rate), or drop --placed_tables."
        )


def table_optimizer_fn(values: dict[str, Any], *, learning_rate: float) -> Callable[[], Any] | None:
    """() -> the tables' optimizer the TABLE_OPTIMIZER settings name (at their rate, else at
    `learning_rate`), or None for 'same' (the Update's optimizer trains the tables)."""
    name = values["table_optimizer"]
    if name == "same":
        return None
    rate = values["table_learning_rate"] or learning_rate

    def optimizer():
        import keras

        import loops

        if name == "rowwise_adagrad":
            return loops.RowwiseAdagrad(rate)
        if name == "adagrad":
            return keras.optimizers.Adagrad(rate)
        return keras.optimizers.SGD(rate)

    return optimizer


def table_optimizer_fns(
    values: dict[str, Any], *, learning_rate: float
) -> tuple[Callable[[], Any] | None, Callable[[], Any] | None]:
    """(the Update's table optimizer for keras Embeddings, the optimizer of each placed
    `loops.EmbeddingTable`): the TABLE_OPTIMIZER settings' one in its place, None in the other
    (both None for 'same')."""
    optimizer = table_optimizer_fn(values, learning_rate=learning_rate)
    return (None, optimizer) if values["placed_tables"] else (optimizer, None)


def flag_optimizers() -> Callable[[], tuple[Callable[[], Any], tuple]]:
    """() -> (the optimizer function, the table optimizer functions: `table_optimizer_fns`) of
    the OPTIMIZER and TABLE_OPTIMIZER flags, --learning_rate and --train_steps, read now and
    made when called (a binary makes them once its data is read and checked)."""
    optimizer, tables = (
        loop_flags.setting_values(OPTIMIZER),
        loop_flags.setting_values(TABLE_OPTIMIZER),
    )
    rate, steps = flags.FLAGS.learning_rate, flags.FLAGS.train_steps
    return lambda: (
        optimizer_fn(optimizer, learning_rate=rate, total_steps=steps),
        table_optimizer_fns(tables, learning_rate=rate),
    )


# The full-size slots each optimizer keeps beside the weights: Adam's two moments, momentum's
# velocity, none for plain SGD.
_SLOTS = {"adam": 2, "momentum": 1, "sgd": 0}


def weight_copies(values: dict[str, Any]) -> int:
    """How many copies of every weight training under the OPTIMIZER settings holds: the
    weights and the optimizer's slots (for the checks of a model's size against memory)."""
    return 1 + _SLOTS[values["optimizer"]]


# The full-size slots a table optimizer of its own keeps beside a table: Adagrad's accumulator;
# none for SGD, nor for rowwise Adagrad (one number a row).
_TABLE_SLOTS = {"adagrad": 1, "rowwise_adagrad": 0, "sgd": 0}


def table_weight_copies(optimizer: dict[str, Any], tables: dict[str, Any]) -> int:
    """How many copies of every embedding-table weight training holds under the OPTIMIZER and
    TABLE_OPTIMIZER settings (--table_optimizer=same: `weight_copies`)."""
    name = tables["table_optimizer"]
    return weight_copies(optimizer) if name == "same" else 1 + _TABLE_SLOTS[name]


def ppo_learning_rate(decay: str, learning_rate: float, *, updates: int) -> Any:
    """loops-rl's PPO rate under --ppo_lr_decay: `learning_rate` decayed by a cosine to 0 at
    the run's last update (`updates` Adam steps), or constant.

    A constant rate keeps moving a policy that has found the top return, and where it ends
    depends on the CPU's rounding (README, "Reinforcement learning"); decayed, it settles.
    """
    from loops.core import schedules

    if decay == "constant":
        return learning_rate
    return schedules.make_schedule("cosine", learning_rate=learning_rate, total_steps=updates)


def adam_fn(learning_rate: Any, **options: Any) -> Callable[[], Any]:
    """() -> a new Adam optimizer at `learning_rate` (a float or a schedule) with `options`."""

    def optimizer():
        import keras

        return keras.optimizers.Adam(learning_rate, **options)

    return optimizer


# loops.bin.gan: `loops.GANLoop`'s keywords, and its optimizers' beta_1.
GAN: tuple[Setting, ...] = (
    Setting(
        "gan_loss",
        "training",
        "'non_saturating': the DCGAN loss; 'wgan_gp': Wasserstein loss with a "
        "gradient penalty, usually with --n_critic=5 (on the ring it covers the "
        "modes but sharpens them more slowly than the default).",
        "enum",
        default="non_saturating",
        choices=("non_saturating", "wgan_gp"),
    ),
    Setting(
        "n_critic",
        "training",
        "Discriminator updates per generator update, each on its own batch.",
        "integer",
        default=1,
        lower_bound=1,
    ),
    Setting(
        "gp_weight",
        "training",
        "Gradient penalty weight for --gan_loss=wgan_gp.",
        "float",
        default=10.0,
        lower_bound=0.0,
    ),
    Setting(
        "beta_1",
        "training",
        "Adam's first-moment decay for both optimizers.",
        "float",
        default=0.5,
        check=satisfies(lambda value: 0 <= value < 1, "{name} must be in [0, 1), e.g. 0.5."),
    ),
)

# loops.bin.lm: `loops.LanguageModelLoop`'s samples.
LANGUAGE_MODEL: tuple[Setting, ...] = (
    Setting(
        "sample_length",
        "outputs",
        "Bytes each sample continues its prompt by, at every evaluation "
        "(TensorBoard text and MODEL_DIR/samples).",
        "integer",
        default=80,
        lower_bound=1,
    ),
)

# loops.bin.rl: shared settings whose best value depends on --algorithm; unset, they take
# these (the other knobs' defaults are the loop classes' own).
ALGORITHM_DEFAULTS = {
    # 250 rollouts of 16 x 64 steps; the mean return passes 195 after about 50
    # of them and reaches 500 after about 200.
    "ppo": {"train_steps": 250, "steps_per_loop": 10},
    # 1500 steps of 8 x 4 transitions, each followed by 2 updates.
    "dqn": {"train_steps": 1500, "steps_per_loop": 100},
}


def prepare_rl_flags() -> None:
    """Refuses an RL evaluator that plays no episodes; gives the unset shared flags of
    ALGORITHM_DEFAULTS the --algorithm's values; refuses sizes no machine holds.

    Raises:
        app.UsageError: --mode=evaluate_checkpoints with --eval_episodes=0, or a rollout or
            replay buffer this machine cannot hold (`check_rl_fits`).
    """
    values = flags.FLAGS
    if loop_flags.mode() == loop_flags.EVALUATE_CHECKPOINTS and not values.eval_episodes:
        raise app.UsageError(
            "loops-rl evaluates a checkpoint by playing greedy episodes, and "
            "--eval_episodes is 0: pass e.g. --eval_episodes=10 (to the trainer too, "
            "for the same evaluation there)."
        )
    defaults = ALGORITHM_DEFAULTS[values.algorithm].items()
    loop_flags.set_values({name: value for name, value in defaults if values[name].value is None})
    try:
        check_rl_fits(
            algorithm=values.algorithm,
            num_envs=values.num_envs,
            rollout_length=values.rollout_length,
            buffer_capacity=values.buffer_capacity,
        )
    except ValueError as error:
        raise app.UsageError(str(error)) from error


# What the RL loops hold of CartPole's (`loops_data.cartpole`, whose module imports
# TensorFlow) steps: 4 float32 numbers an observation, 4 bytes each of an action, a reward and
# an end. A rollout holds each environment step's observation and those three; the replay
# buffer each transition's observation and final observation and those three.
_OBSERVATION_BYTES = 4 * 4
ROLLOUT_STEP_BYTES = _OBSERVATION_BYTES + 3 * 4
TRANSITION_BYTES = 2 * _OBSERVATION_BYTES + 3 * 4


def check_rl_fits(
    *,
    algorithm: str,
    num_envs: int | None,
    rollout_length: int | None,
    buffer_capacity: int,
    memory: int | None = None,
) -> None:
    """Refuses a rollout (--num_envs x --rollout_length; unset, each counted as 1) or a dqn
    replay buffer (--buffer_capacity) that cannot fit in `memory` bytes (default: this
    machine's; 0 checks nothing): a lower bound of what the loop holds.

    Raises:
        ValueError: the sizes, the bytes they need, and the largest that fits.
    """
    memory = memory_bytes() if memory is None else memory
    if not memory:
        return
    envs, length = num_envs or 1, rollout_length or 1
    needed = envs * length * ROLLOUT_STEP_BYTES
    if needed > memory:
        given = {"num_envs": num_envs, "rollout_length": rollout_length}
        largest = {"num_envs": memory // (length * ROLLOUT_STEP_BYTES)}
        largest["rollout_length"] = memory // (envs * ROLLOUT_STEP_BYTES)
        sizes = [name for name, value in given.items() if value is not None]
        fixes = [f"--{name}<={largest[name]}" for name in sizes if largest[name] >= 1]
        raise ValueError(
            f"{' '.join(f'--{name}={given[name]}' for name in sizes)} is more than this "
            f"machine can hold: a rollout of {envs * length:,} environment steps at "
            f"{ROLLOUT_STEP_BYTES} bytes each (an observation, action, reward and end) needs "
            f"{in_units(needed)}, and it has {in_units(memory)} of memory; pass "
            f"{' or '.join(fixes) or 'a smaller --num_envs and --rollout_length'}."
        )
    needed = buffer_capacity * TRANSITION_BYTES
    if algorithm == "dqn" and needed > memory:
        raise ValueError(
            f"--buffer_capacity={buffer_capacity} is more than this machine can hold: the "
            f"replay buffer's {TRANSITION_BYTES} bytes a transition (two observations, an "
            f"action, reward and end) need {in_units(needed)}, and it has {in_units(memory)} "
            f"of memory; pass --buffer_capacity<={memory // TRANSITION_BYTES}."
        )


# The environment loop's keywords (None: the loop's default).
ENVIRONMENT_LOOP: tuple[Setting, ...] = (
    Setting(
        "algorithm",
        "training",
        "ppo: actor-critic (PPO with GAE); dqn: double DQN with a replay buffer. "
        "Unset shared flags take the algorithm's defaults: --train_steps 250 (ppo) "
        "or 1500 (dqn), --steps_per_loop 10 or 100, --global_batch_size (samples "
        "per update) 256 or 128.",
        "enum",
        default="ppo",
        choices=tuple(ALGORITHM_DEFAULTS),
    ),
    Setting(
        "num_envs",
        "data",
        "Environments stepped in parallel over all replicas (a multiple of the "
        "replica count). Default 16 (ppo), 8 (dqn).",
        "integer",
        lower_bound=1,
    ),
    Setting(
        "rollout_length",
        "data",
        "Steps of every environment per train step. Default 64 (ppo), 4 (dqn).",
        "integer",
        lower_bound=1,
    ),
    Setting(
        "eval_episodes",
        "outputs",
        "Episodes each evaluation plays with the greedy policy, from the same "
        "seeded starts every time (eval metrics mean_return, min_return, e.g. "
        "for --keep_best_metric=mean_return --keep_best_mode=max); 0: no "
        "evaluation. Needed by --mode=evaluate_checkpoints.",
        "integer",
        default=0,
        lower_bound=0,
    ),
    Setting(
        "gamma",
        "training",
        "Discount factor in [0, 1].",
        "float",
        default=0.99,
        lower_bound=0.0,
        upper_bound=1.0,
    ),
)
# `loops.ActorCriticLoop`'s keywords (--ppo_epochs is its `epochs`).
ACTOR_CRITIC: tuple[Setting, ...] = (
    Setting(
        "ppo_lr_decay",
        "training",
        "ppo: the learning rate over the run. cosine: from --learning_rate down to 0 at the "
        "run's last update (--train_steps x --ppo_epochs x the minibatches of a rollout), "
        "which settles the policy it has found; constant: --learning_rate throughout.",
        "enum",
        default="cosine",
        choices=("cosine", "constant"),
    ),
    Setting(
        "gae_lambda",
        "training",
        "ppo: GAE lambda in [0, 1].",
        "float",
        default=0.95,
        lower_bound=0.0,
        upper_bound=1.0,
    ),
    Setting(
        "ppo_epochs",
        "training",
        "ppo: passes over each rollout (1 with "
        "--global_batch_size=num_envs*rollout_length is A2C).",
        "integer",
        default=4,
        lower_bound=1,
    ),
    Setting(
        "clip_ratio",
        "training",
        "ppo: probability-ratio clip epsilon (> 0).",
        "float",
        default=0.2,
        check=satisfies(lambda value: value > 0, "{name} must be > 0, e.g. {name}=0.2."),
    ),
    Setting(
        "value_coefficient",
        "training",
        "ppo: weight of the value loss.",
        "float",
        default=0.5,
        lower_bound=0.0,
    ),
    Setting(
        "entropy_coefficient",
        "training",
        "ppo: weight of the entropy bonus.",
        "float",
        default=0.01,
        lower_bound=0.0,
    ),
)
# `loops.DQNLoop`'s keywords.
DQN: tuple[Setting, ...] = (
    Setting(
        "buffer_capacity",
        "training",
        "dqn: transitions the replay buffer keeps.",
        "integer",
        default=50_000,
        lower_bound=1,
    ),
    Setting(
        "learning_starts",
        "training",
        "dqn: transitions collected before the first update.",
        "integer",
        default=1_000,
        lower_bound=0,
    ),
    Setting(
        "updates_per_step",
        "training",
        "dqn: gradient updates per train step.",
        "integer",
        default=2,
        lower_bound=1,
    ),
    Setting(
        "epsilon_start",
        "training",
        "dqn: exploration rate at the start.",
        "float",
        default=1.0,
        lower_bound=0.0,
        upper_bound=1.0,
    ),
    Setting(
        "epsilon_end",
        "training",
        "dqn: exploration rate after --exploration_steps.",
        "float",
        default=0.05,
        lower_bound=0.0,
        upper_bound=1.0,
    ),
    Setting(
        "exploration_steps",
        "training",
        "dqn: environment steps over which epsilon falls linearly.",
        "integer",
        default=10_000,
        lower_bound=1,
    ),
    Setting(
        "target_update_every",
        "training",
        "dqn: copy the online net into the "
        "target every this many train steps (default 50, unless --target_tau "
        "is set).",
        "integer",
        lower_bound=1,
    ),
    Setting(
        "target_tau",
        "training",
        "dqn: instead of copies, move the target towards "
        "the online net by this fraction every train step (in (0, 1], e.g. "
        "0.005).",
        "float",
        check=satisfies(
            lambda value: 0 < value <= 1, "{name} must be in (0, 1], e.g. {name}=0.005."
        ),
    ),
)
