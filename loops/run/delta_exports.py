"""Delta exports as a run trains (`--export_deltas`): after each evaluation that keeps a best,
the model as it is then exported and added to the run's delta chain
(`loops.model_dir.delta_chain`), so that serving gets each better model as it comes, not only
the run's last."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from loops.definition.run_context import RunContext
from loops.model_dir.delta_chain import DeltaChain
from loops.run.actions import Action
from loops.run.best_checkpoint import best_record
from loops.tables import embedding_tables


class DeltasOnBest(Action):
    """After each evaluation at which a `loops.KeepBest` kept a best (its best.json names the
    step: give this action after it), the chief exports the model (its moving average, when
    the run keeps one, as the run's export does) and adds the delta to `chain`.

    A run whose tables are split over several workers sends its delta at the end alone: its
    export gathers the tables on every worker, and a worker other than the chief cannot tell
    from its own files that this evaluation kept a best.
    """

    def __init__(self, export: Callable[[Any, str], str], chain: DeltaChain):
        """
        Args:
            export: (the trained definition, a directory to create) -> the path it wrote:
                the run's export (`loops.cli.flags.binary_arguments`' `export`).
            chain: the run's delta chain.
        """
        self.export = export
        self.chain = chain

    def after_eval(self, run: RunContext, step: int, eval_metrics: Mapping[str, float]) -> None:
        if not run.is_chief or run.model_dir is None:
            return
        if embedding_tables.split_over_workers(run.definition.checkpoint_items()):
            return
        best = best_record(os.path.join(run.model_dir, "best"))
        if best is None or int(best["step"]) != step:
            return
        staging = self.chain.staging()
        with run.averaged_weights():
            path = self.export(run.definition, staging)
        link = self.chain.extend(path)
        if link is not None:
            run.progress.line(f"delta export at step {step} (a best kept): {link}")
