"""What loops' own table optimizers (`loops.RowwiseAdagrad`, `loops.LazyAdam`) share: they
train tables of rows, 2-D variables, alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def check_tables(optimizer: Any, variables: Sequence[Any]) -> None:
    """Refuses, naming it and the fix, a variable of `variables` that is no table of rows.

    Raises:
        ValueError: a variable that is not 2-D.
    """
    kind = type(optimizer).__name__
    for variable in variables:
        if len(variable.shape) != 2:
            name = getattr(variable, "path", None) or variable.name
            raise ValueError(
                f"{kind} trains tables of rows (2-D variables); {name} has shape "
                f"{tuple(variable.shape)}: train it with another optimizer "
                f"(loops.Update(..., table_optimizer={kind}()) trains only the tables with it)."
            )
