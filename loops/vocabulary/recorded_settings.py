"""The one reader of the settings a run recorded in its config.json; each caller words its own
sentence for a file that does not give them (`RecordedSettingsError`). No TensorFlow."""

from __future__ import annotations

import json
from typing import Any


class RecordedSettingsError(ValueError):
    """A file that does not give a run's settings: unreadable, not JSON, or not a JSON object.

    Attributes:
        path: the file.
        cause: the OSError that kept it from being read, or the ValueError of text that is
            not JSON (or not UTF-8); None when it is JSON but not an object.
        found: that JSON value, when it is not an object.
    """

    def __init__(self, path: str, *, cause: Exception | None = None, found: Any = None):
        self.path = path
        self.cause = cause
        self.found = found
        super().__init__(f"{path} does not give a run's settings: {self.detail}")

    @property
    def unreadable(self) -> bool:
        """Whether the file could not be read at all (missing, a directory, no permission)."""
        return isinstance(self.cause, OSError)

    @property
    def detail(self) -> Any:
        """What went wrong: the error reading or parsing it, else the value it holds."""
        return self.found if self.cause is None else self.cause


def read_recorded_settings(path: str) -> dict[str, Any]:
    """The settings recorded in `path` (a run's MODEL_DIR/config.json): its JSON object.

    Raises:
        RecordedSettingsError: it cannot be read, is not JSON, or holds no JSON object;
            the caller words the sentence (a ValueError).
    """
    try:
        with open(path, encoding="utf-8") as stream:
            recorded = json.load(stream)
    except (OSError, ValueError) as error:
        raise RecordedSettingsError(path, cause=error) from error
    if not isinstance(recorded, dict):
        raise RecordedSettingsError(path, found=recorded)
    return recorded
