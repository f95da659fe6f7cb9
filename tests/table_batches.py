"""The embedding-table tests' shared case: a 20-row table looked up 3 ids an example, four
global batches of ids and targets (the last two partial), and the initial weights."""

import numpy as np

ROWS, DIM, LOOKUPS = 20, 4, 3
RATE = 0.1
# Two full global batches of 8, then partial ones of 3 and 1: replicas left empty.
IDS = [
    np.array(
        [[1, 1, 2], [3, 1, 5], [2, 2, 2], [7, 1, 3], [5, 6, 7], [1, 9, 9], [2, 3, 4], [1, 1, 1]]
    ),
    np.array(
        [[4, 4, 8], [1, 2, 3], [8, 8, 8], [9, 1, 1], [0, 2, 4], [6, 6, 1], [3, 3, 3], [2, 4, 6]]
    ),
    np.array([[1, 4, 4], [4, 1, 1], [9, 9, 2]]),
    np.array([[9, 4, 4]]),  # on 2 replicas (or 2 workers) one is empty
]
TARGETS = [np.linspace(-1.0, 1.0, len(ids)).astype(np.float32) for ids in IDS]
# The table's rows that no batch looks up: training must leave them as they were.
UNTOUCHED = sorted(set(range(ROWS)) - set(np.concatenate([i.ravel() for i in IDS])))


def initial_weights(seed):
    """float32 (table [ROWS, DIM], Dense kernel [DIM, 1], bias [1]), drawn from `seed`."""
    rng = np.random.default_rng(seed)
    table = rng.normal(0, 0.5, (ROWS, DIM)).astype(np.float32)
    kernel = rng.normal(0, 0.5, (DIM, 1)).astype(np.float32)
    return table, kernel, np.array([0.1], np.float32)
