"""--config_json=MODEL_DIR/config.json on a binary's command line: the settings a run recorded,
as the flags that give them, so that a run restarts from its config.json.

Each recorded key that is a flag of this binary becomes `--name=value` where the option
stood (flags after it override, as after a --flagfile); unset (null) values and the
checkpoint's records are left out. Nothing here imports TensorFlow.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Sequence
from typing import Any

from loops.vocabulary.recorded_settings import RecordedSettingsError, read_recorded_settings

OPTION = "--config_json"


def expanded(argv: Sequence[str], defined: Container[str]) -> list[str]:
    """`argv` with each --config_json=PATH replaced by the flags of the settings in PATH.

    Raises:
        ValueError: PATH does not read as a JSON object, naming it and the fix.
    """
    result: list[str] = []
    for index, option in enumerate(argv):
        if index == 0 or not option.startswith(OPTION + "="):
            result.append(option)
            continue
        result.extend(_flags_of(option.partition("=")[2], defined))
    return result


def _flags_of(path: str, defined: Container[str]) -> Iterator[str]:
    try:
        recorded = read_recorded_settings(path)
    except RecordedSettingsError as error:
        if error.cause is None:
            raise ValueError(
                f"{OPTION}={path} holds no JSON object; pass a run's config.json."
            ) from None
        raise ValueError(
            f"{OPTION}={path} does not read as a run's settings ({error.cause}); pass the "
            "config.json a run wrote into its --model_dir."
        ) from None
    for name, value in recorded.items():
        if name in defined and value is not None:
            yield f"--{name}={_as_flag(value)}"


def _as_flag(value: Any) -> str:
    """A recorded value as its flag's text: true/false, comma-joined lists."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value)
    return str(value)
