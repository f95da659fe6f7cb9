"""The settings of the example models, declared once
(`loops.vocabulary.settings.Setting`): a binary's flags.

Nothing here imports TensorFlow or Keras: a binary declares its flags from these
before --help, which answers without them.
"""

from __future__ import annotations

from typing import Any

from loops.vocabulary.settings import Setting

# loops.bin.classifier: `loops_models.classifiers.build_classifier(model, l2=..., ...)`.
CLASSIFIER: tuple[Setting, ...] = (
    Setting(
        "model", "model", "Classifier network.", "enum", flag_default="mlp", choices=("mlp", "cnn")
    ),
    Setting(
        "l2",
        "model",
        "L2 weight regularization factor (>= 0).",
        "float",
        flag_default=0.0,
        lower_bound=0.0,
    ),
    Setting(
        "batch_norm",
        "model",
        "Synchronized batch normalization after hidden layers.",
        "bool",
        flag_default=False,
    ),
    Setting(
        "dropout",
        "model",
        "Dropout rate in [0, 1) after the hidden layers (mlp) or before the head "
        "(cnn); masks differ per replica and per step, and match for any "
        "replica count.",
        "float",
        flag_default=0.0,
        flag_rule=(
            lambda value: 0.0 <= value < 1.0,
            "--dropout must lie in [0, 1), e.g. --dropout=0.2.",
        ),
    ),
)

# loops.bin.lm: `loops_models.lm.transformer_lm(width=..., num_layers=..., num_heads=...)`.
TRANSFORMER_LM: tuple[Setting, ...] = (
    Setting(
        "width",
        "model",
        "Transformer width (a multiple of --num_heads).",
        "integer",
        flag_default=128,
        lower_bound=1,
    ),
    Setting("num_layers", "model", "Transformer blocks.", "integer", flag_default=2, lower_bound=1),
    Setting(
        "num_heads", "model", "Attention heads per block.", "integer", flag_default=4, lower_bound=1
    ),
)


def check_width_fits_heads(values: dict[str, Any]) -> None:
    """Refuses a --width that --num_heads does not divide.

    Raises:
        ValueError: the width, and a width that fits.
    """
    width, num_heads = values["width"], values["num_heads"]
    if width % num_heads:
        raise ValueError(
            f"--width={width} is not a multiple of --num_heads={num_heads}; "
            f"pass e.g. --width={num_heads * max(1, width // num_heads)}."
        )
