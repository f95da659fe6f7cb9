"""One worker of the 2-worker continuation of tests/test_continuation.py.

    python tests/continuation_workers.py OUT_DIR DAY1_MODEL_DIR

Under MultiWorkerMirroredStrategy (one replica a worker), goes on from DAY1_MODEL_DIR's
checkpoint (day 1, trained by one process) on day 2's rows with the grown vocabularies, as
the one-process continuation does, and writes OUT_DIR/<task>.npz: each table's rows and slots
by raw id (`table|variable|id`), the dense weights (`dense_<i>`) and day 2's step losses.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import test_continuation as case  # noqa: E402
from test_warm_start import table_rows  # noqa: E402

import loops  # noqa: E402
from loops import topology  # noqa: E402


def main(out_dir, day1):
    strategy = loops.make_strategy("multi_worker_mirrored")
    users, items, _ = case.grown_vocabularies()
    trainer = case.continued_day2(strategy, os.path.dirname(day1), os.path.join(out_dir, "day2"))
    loss = trainer.train(case.DAY1_STEPS + case.DAY2_STEPS)["loss"]
    rows = case.by_raw_id(table_rows(trainer), users, items)
    np.savez(
        os.path.join(out_dir, f"{topology.task_name(strategy)}.npz"),
        loss=loss,
        **{"|".join(map(str, key)): value for key, value in rows.items()},
        **{f"dense_{i}": w.numpy() for i, w in enumerate(trainer.definition.model.weights)},
    )
    trainer.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
