"""Training that goes on, day by day, on a generated drifting click log: `loops-recommender
--continue_from` each day against a model of days 1-3 only and against a model trained from
scratch each day on every day so far, by next-day AUC (the temporal protocol of MLPerf DLRMv4
and Monolith: train days 1..k, evaluate day k+1), and the delta exports of the day-by-day
chain (`--export_deltas`) against full exports, in one run.

    python -m benchmarks.day_by_day            # 10 days of 20,000 clicks (about 15 minutes)
    python -m benchmarks.day_by_day --quick    # 10 days of 4,000 clicks (about 7 minutes)
    python -m benchmarks.day_by_day --kind=ctr # the same log, loops-ctr over its columns

With --kind=ctr every run is `loops-ctr --model=wide_and_deep --placed_tables
--table_optimizer=adagrad` over the log's user and item as categorical columns (a spec of
their own beside the logs): its vocabularies grow day by day (`--continue_from`), an id the
model has not seen reads row 0, and the next day is scored through the export's
serving_default (the raw columns); the temporal evaluation each continued run records
(results.json's `warm_start.temporal`: the day before's model on the day's own test rows) is
reported beside it.

The log (numpy, a function of --seed): --users users, each active over a window of days (a
start uniform over [-3, days), a length log-uniform in [1, days]) so new users arrive every
day and others leave; --items items of a Zipf popularity over a ranking that moves each day
(each day a tenth of the ranks swap), half the items there from day 1 and the others
entering throughout. Each user
and item has hidden factors (dimension 4) and a propensity; a click ~ Bernoulli(sigmoid(-1 +
user + item propensity + factors' dot)). Each day is one CSV log (user, item, click,
timestamp).

Every run is `loops-recommender --model=rating --rows_by_id --placed_tables
--table_optimizer=adagrad`, a process of its own, --steps_per_day steps a day of rows it trains
(about 2 passes over a day; a run over k days trains k x that), 2% of each log held out as its
own test rows:
- continued: day 1 from scratch, day d `--continue_from` day d-1 with `--export_deltas`;
- first 3 days: one run over days 1-3 (the days' logs concatenated), never updated;
- from scratch: for each k in 3..days-1, one run over days 1..k.
Next-day AUC: day k+1's clicks scored by each regime's export of day k through its
`score_pairs` signature, a pair with an id the model does not know scored with the
training days' click rate (exact AUC, ties averaged), averaged over days 4..days. Compute:
the training steps each regime spent for those evaluations.

Deltas: for each day d >= 2, the continued run's delta (MODEL_DIR/deltas/000001) against its
full export: bytes of each, the delta's rows, whole variables and files, the rows it sends,
and the seconds `loops.model_dir.export_deltas.apply_deltas` takes to patch day d-1's export
against copying the full export; day 1's export patched by every delta has day `days`'
export's fingerprint.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np

from benchmarks import movielens, report
from benchmarks.dynamic_tables import auc

QUICK = dict(rows_per_day=4_000, steps_per_day=30, users=1_500, items=400)
FULL = dict(rows_per_day=20_000, steps_per_day=150, users=6_000, items=1_500)
FACTORS, BIAS = 4, -1.0
# Both kinds' runs: tables of their own row-wise Adagrad, 2% of each log its test rows.
COMMON = (
    "--placed_tables",
    "--table_optimizer=adagrad",
    "--table_learning_rate=0.1",
    "--validation_fraction=0",
    "--test_fraction=0.02",
    "--global_batch_size=256",
    "--embedding_dim=16",
)
RUN = ("--model=rating", "--rows_by_id", *COMMON)
CTR_RUN = ("--model=wide_and_deep", *COMMON, "--hidden_units=32", "--hidden_layers=1")
CTR_SPEC = {
    "label": "click",
    "columns": [{"name": "user", "kind": "categorical"}, {"name": "item", "kind": "categorical"}],
}
BINARIES = {"recommender": "loops.bin.recommender", "ctr": "loops.bin.ctr"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small sizes (QUICK)")
    parser.add_argument("--days", type=int, default=10)
    for name in FULL:
        parser.add_argument(f"--{name}", type=int, default=None, help=f"default {FULL[name]}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", choices=sorted(BINARIES), default="recommender")
    parser.add_argument("--work_dir", default=None, help="where the logs and runs go (temp)")
    parser.add_argument("--output", default="day_by_day.json")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.days < 5:
        parser.error(f"--days={args.days}: the protocol evaluates days 4..days; pass >= 5")
    return args


def day_logs(args) -> list[np.ndarray]:
    """Each day's rows: (user, item, click) int64 columns."""
    rng = np.random.default_rng(args.seed)
    start = rng.uniform(-3, args.days, args.users)
    length = np.exp(rng.uniform(0, np.log(args.days), args.users))
    activity = rng.pareto(1.5, args.users) + 1
    user_factors = rng.normal(0, 0.6, (args.users, FACTORS))
    item_factors = rng.normal(0, 0.6, (args.items, FACTORS))
    user_bias, item_bias = rng.normal(0, 0.7, args.users), rng.normal(0, 0.7, args.items)
    ranking = rng.permutation(args.items)
    # Half the items are there from day 1, the others enter over the days.
    entry = np.maximum(rng.integers(-args.days, args.days, args.items), 0)
    days = []
    for day in range(args.days):
        swaps = rng.choice(args.items, size=(args.items // 20, 2), replace=False)
        ranking[swaps[:, 0]], ranking[swaps[:, 1]] = ranking[swaps[:, 1]], ranking[swaps[:, 0]]
        alive = (start <= day) & (day < start + length)
        users = rng.choice(
            np.flatnonzero(alive), args.rows_per_day, p=activity[alive] / activity[alive].sum()
        )
        popularity = 1.0 / (1 + np.argsort(ranking))
        popularity[entry > day] = 0
        items = rng.choice(args.items, args.rows_per_day, p=popularity / popularity.sum())
        logit = (
            BIAS
            + user_bias[users]
            + item_bias[items]
            + np.sum(user_factors[users] * item_factors[items], axis=1)
        )
        clicks = (rng.random(args.rows_per_day) < 1 / (1 + np.exp(-logit))).astype(np.int64)
        days.append(np.stack([users + 100_000, items + 900_000, clicks], axis=1))
    return days


def write_log(path: str, days: list[np.ndarray]) -> str:
    rows = np.concatenate(days)
    with open(path, "w") as stream:
        stream.write("user,item,click,timestamp\n")
        for number, (user, item, click) in enumerate(rows.tolist()):
            stream.write(f"{user},{item},{click},{number}\n")
    return path


def train(
    work: str, name: str, log: str, steps: int, *extra: str, kind: str = "recommender"
) -> tuple[str, float]:
    """One run of loops-recommender (or loops-ctr, `kind`): (its model_dir, its seconds)."""
    model_dir = os.path.join(work, name)
    flags = [f"--data={log}", f"--train_steps={steps}", f"--eval_every={steps}", *extra]
    if kind == "ctr":
        spec = os.path.join(work, "spec.json")
        if not os.path.exists(spec):
            with open(spec, "w") as stream:
                json.dump(CTR_SPEC, stream)
        flags = [*CTR_RUN, f"--spec={spec}", *flags]
    else:
        flags = [*RUN, *flags]
    _, seconds = movielens.run_recommender(flags, model_dir, module=BINARIES[kind])
    return model_dir, seconds


def next_day_auc(
    model_dir: str, trained: list[np.ndarray], day: np.ndarray, kind: str = "recommender"
) -> float:
    """The AUC of `day`'s clicks scored by the run's export: a recommender's `score_pairs`,
    an unknown pair scored with the `trained` days' click rate; a click model's
    serving_default on the raw columns (an unknown id reads its column's row 0)."""
    import tensorflow as tf

    model = tf.saved_model.load(os.path.join(model_dir, "export"))
    if kind == "ctr":
        got = model.signatures["serving_default"](
            user=tf.constant(day[:, 0].astype(str)), item=tf.constant(day[:, 1].astype(str))
        )
        return auc(got["logits"].numpy().astype(np.float64), day[:, 2].astype(np.float64))
    got = model.signatures["score_pairs"](
        users=tf.constant(day[:, 0]), items=tf.constant(day[:, 1])
    )
    scores = got["scores"].numpy().astype(np.float64)
    rate = float(np.concatenate(trained)[:, 2].mean())
    scores[~np.isfinite(scores)] = rate
    return auc(scores, day[:, 2].astype(np.float64))


def bytes_under(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )


def delta_figures(work: str, runs: dict[int, str]) -> list[dict]:
    """Each continued day's delta against its full export, and the chain's check."""
    from loops.model_dir import export_deltas

    rows = []
    for day in sorted(runs)[1:]:
        delta = os.path.join(runs[day], "deltas", "000001")
        manifest = export_deltas.read_delta(delta)
        export = os.path.join(runs[day], "export")
        started = time.perf_counter()
        export_deltas.apply_deltas(
            os.path.join(runs[day - 1], "export"), [delta], os.path.join(work, f"patched{day}")
        )
        applied = time.perf_counter() - started
        started = time.perf_counter()
        shutil.copytree(export, os.path.join(work, f"copied{day}"))
        copied = time.perf_counter() - started
        rows.append(
            {
                "day": day,
                "export_bytes": bytes_under(export),
                "delta_bytes": bytes_under(delta),
                **{f"delta_{k}_bytes": v for k, v in manifest["bytes"].items()},
                "rows_sent": manifest["touched_rows"],
                "whole_variables": sum(1 for e in manifest["variables"].values() if e.get("whole")),
                "apply_seconds": round(applied, 3),
                "copy_seconds": round(copied, 3),
            }
        )
    first, last = min(runs), max(runs)
    chain = [os.path.join(runs[day], "deltas") for day in sorted(runs)[1:]]
    patched = os.path.join(work, "patched_chain")
    done = export_deltas.apply_deltas(os.path.join(runs[first], "export"), chain, patched)
    equal = done["fingerprint"] == export_deltas.fingerprint(os.path.join(runs[last], "export"))
    return rows, {"chain_deltas": len(done["applied"]), "chain_equals_last_export": equal}


def measure(args, work: str) -> dict:
    days = day_logs(args)
    logs = [write_log(os.path.join(work, f"day{d + 1}.csv"), [days[d]]) for d in range(args.days)]
    steps, kind = args.steps_per_day, args.kind
    continued, seconds = {}, {"continued": 0.0, "first_3_days": 0.0, "from_scratch": 0.0}
    for day in range(1, args.days + 1):
        extra = ()
        if day > 1:
            extra = (f"--continue_from={continued[day - 1]}", "--export_deltas")
        continued[day], spent = train(
            work, f"continued{day}", logs[day - 1], steps * day, *extra, kind=kind
        )
        seconds["continued"] += spent if day < args.days else 0.0
    both = write_log(os.path.join(work, "days1-3.csv"), days[:3])
    first3, seconds["first_3_days"] = train(work, "first3", both, 3 * steps, kind=kind)
    table = []
    for k in range(3, args.days):
        log = write_log(os.path.join(work, f"days1-{k}.csv"), days[:k])
        scratch, spent = train(work, f"scratch{k}", log, k * steps, kind=kind)
        seconds["from_scratch"] += spent
        table.append(
            {
                "evaluated_day": k + 1,
                "continued": next_day_auc(continued[k], days[:k], days[k], kind),
                "first_3_days": next_day_auc(first3, days[:3], days[k], kind),
                "from_scratch": next_day_auc(scratch, days[:k], days[k], kind),
            }
        )
    # Each continued run's own temporal evaluation (the day before's model on its test rows).
    with open(os.path.join(continued[args.days], "results.json")) as stream:
        temporal = json.load(stream)["warm_start"]["temporal"]
    regimes = ("continued", "first_3_days", "from_scratch")
    mean = {name: float(np.mean([row[name] for row in table])) for name in regimes}
    compute = {
        "continued": steps * (args.days - 1),
        "first_3_days": steps * 3,
        "from_scratch": steps * sum(range(3, args.days)),
    }
    deltas, chain = delta_figures(work, continued)
    return {
        "next_day_auc": table,
        "mean_next_day_auc": mean,
        "training_steps": compute,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "deltas": deltas,
        **chain,
        "temporal_auc": [round(entry["auc"], 4) for entry in temporal if "auc" in entry],
        "clicks": int(sum(int(d[:, 2].sum()) for d in days)),
        "rows": int(sum(len(d) for d in days)),
    }


def format_figures(figures: dict) -> str:
    lines = [
        "| evaluated day | continued | first 3 days | from scratch |",
        "| --- | --- | --- | --- |",
    ]
    for row in figures["next_day_auc"]:
        lines.append(
            f"| {row['evaluated_day']} | {row['continued']:.4f} | {row['first_3_days']:.4f} | "
            f"{row['from_scratch']:.4f} |"
        )
    mean, steps = figures["mean_next_day_auc"], figures["training_steps"]
    lines.append(
        f"| mean | {mean['continued']:.4f} | {mean['first_3_days']:.4f} | "
        f"{mean['from_scratch']:.4f} |"
    )
    lines.append(
        f"| training steps | {steps['continued']} | {steps['first_3_days']} | "
        f"{steps['from_scratch']} |"
    )
    lines += [
        "",
        "| day | export bytes | delta bytes | rows / whole / files bytes | rows sent | "
        "apply s | copy s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in figures["deltas"]:
        lines.append(
            f"| {row['day']} | {row['export_bytes']} | {row['delta_bytes']} | "
            f"{row['delta_rows_bytes']} / {row['delta_whole_bytes']} / "
            f"{row['delta_files_bytes']} | {row['rows_sent']} | {row['apply_seconds']} | "
            f"{row['copy_seconds']} |"
        )
    lines.append(
        f"day 1's export patched by {figures['chain_deltas']} deltas equals the last day's "
        f"export (fingerprint): {figures['chain_equals_last_export']}"
    )
    if figures.get("temporal_auc"):
        lines.append(
            "the last run's temporal evaluation (results.json, each day's test rows by the "
            f"model of the days before), days 2..: {figures['temporal_auc']}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    work = args.work_dir or tempfile.mkdtemp(prefix="loops-day-by-day-")
    os.makedirs(work, exist_ok=True)
    try:
        figures = measure(args, work)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(format_figures(figures))
    report.write(args, **figures)
    print(json.dumps(figures["mean_next_day_auc"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
