"""Which flags each binary defines: its own declarations, what it exports, its own defaults.

Data, so that the flag reference (docs/flags.md, by `loops.bin.flag_reference`) is generated
from what the binaries define without importing them (importing a binary defines
its flags in absl's one registry, and a second binary's would clash). Nothing
here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

from loops.bin import training_settings
from loops.cli import flags as loop_flags
from loops.vocabulary import settings
from loops.vocabulary.settings import Setting
from loops_data import settings as data_settings
from loops_models import settings as model_settings


@dataclasses.dataclass(frozen=True)
class BinaryFlags:
    """The flags of one binary beside the shared ones (`loops.vocabulary.settings.SETTINGS`).

    Attributes:
        command: the console script (setup.cfg), e.g. "loops-classifier".
        own: the declaration tuples of its own settings (data, model, training).
        export: what it exports at the end of training (its --export_dir), or None.
        defaults: setting name -> this binary's flag default instead of the declared one.
    """

    command: str
    own: tuple[tuple[Setting, ...], ...]
    export: str | None = None
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def own_settings(self) -> tuple[Setting, ...]:
        """Its own declarations, --export_dir and --replace_export last where it exports."""
        export = () if self.export is None else settings.export_settings(self.export)
        return (*itertools.chain.from_iterable(self.own), *export)

    def define(self) -> None:
        """Defines the binary's flags (once per process: absl has one registry)."""
        loop_flags.define_binary_flags(self.own, export=self.export, **self.defaults)


CLASSIFIER = BinaryFlags(
    "loops-classifier",
    (data_settings.IMAGE_CLASSIFICATION, model_settings.CLASSIFIER, training_settings.OPTIMIZER),
    export="the trained classifier (raw images in, logits and probabilities out)",
    defaults=dict(train_steps=600, global_batch_size=64, learning_rate=2e-3),
)
GAN = BinaryFlags(
    "loops-gan",
    (data_settings.GAN_DATA, training_settings.GAN),
    export="the generator (noise in, samples out; the moving average when --ema_decay > 0)",
    defaults=dict(
        train_steps=8000,
        global_batch_size=512,
        learning_rate=2e-3,
        steps_per_loop=500,
        ema_decay=0.999,
    ),
)
RL = BinaryFlags(
    "loops-rl",
    (training_settings.ENVIRONMENT_LOOP, training_settings.ACTOR_CRITIC, training_settings.DQN),
    # None: the --algorithm's default (training_settings.prepare_rl_flags).
    defaults=dict(
        train_steps=None, global_batch_size=None, learning_rate=1e-3, steps_per_loop=None
    ),
)
LM = BinaryFlags(
    "loops-lm",
    (
        data_settings.PYTHON_TEXT,
        model_settings.TRANSFORMER_LM,
        training_settings.OPTIMIZER,
        training_settings.LANGUAGE_MODEL,
    ),
    export="the trained model as a text generator (serving_default: prompt, length -> text)",
    # The run measured to beat bzip2 -9 on the eval modules within 10 minutes on 2 CPU
    # cores, and the sizes, schedules and precisions tried on the way: benchmarks/RESULTS.md,
    # Language model.
    defaults=dict(
        train_steps=2700,
        global_batch_size=32,
        num_layers=4,
        mixed_precision="mixed_bfloat16",
        learning_rate=3e-3,
        lr_schedule="warmup_cosine",
        lr_warmup_steps=200,
        lr_final_fraction=0.1,
        steps_per_loop=100,
        eval_every=1350,
    ),
)
RECOMMENDER = BinaryFlags(
    "loops-recommender",
    (
        data_settings.INTERACTIONS,
        model_settings.RECOMMENDER,
        training_settings.OPTIMIZER,
        training_settings.TABLE_OPTIMIZER,
        training_settings.WARM_START,
    ),
    export="the trained recommender on the log's own ids (serving_default: users -> their "
    "top-K items, scores and known_user; score_pairs: users, items -> scores, known_user, "
    "known_item)",
    # 1,200 steps: where the MovieLens-100K retrieval run's validation recall peaks (it fell
    # after, so the 1,500 steps before trained 300 for nothing; benchmarks/RESULTS.md).
    defaults=dict(train_steps=1200, global_batch_size=1024, learning_rate=3e-3),
)
CTR = BinaryFlags(
    "loops-ctr",
    (
        data_settings.CTR_DATA,
        model_settings.CTR,
        training_settings.OPTIMIZER,
        training_settings.TABLE_OPTIMIZER,
        training_settings.WARM_START,
    ),
    export="the trained click-through model (serving_default: a table's raw columns, or a "
    "generated log's prepared columns, -> logits and probabilities; serve_prepared: a "
    "table's prepared columns; features.json beside it holds its vocabularies and scales)",
    # The generated log trained in under a minute on 2 CPU cores: benchmarks/RESULTS.md.
    defaults=dict(train_steps=800, global_batch_size=256, learning_rate=2e-3, eval_every=200),
)
# In the order the flag reference (docs/flags.md) lists them.
BINARIES: tuple[BinaryFlags, ...] = (CLASSIFIER, GAN, LM, RL, RECOMMENDER, CTR)
