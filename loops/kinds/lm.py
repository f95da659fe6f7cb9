"""The language-model step: next-token loss normalized by the global count of real tokens."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from loops.core import reduction, reporting, text_generation
from loops.core.replica_random import step_seed
from loops.core.update import check_clip_norm
from loops.definition.eval_reduce import reduced_eval
from loops.definition.loop import Loop, RunContext
from loops.definition.one_update import one_update_train_step
from loops.vocabulary.whole_numbers import check_whole

DEFAULT_PROMPTS = ("def ", "class ", "import ", "    return ")
_SAMPLE_STREAM = 7  # the random stream sampled continuations draw from


def next_token_losses(model: keras.Model, tokens: tf.Tensor, lengths: tf.Tensor):
    """Cross entropy of each next token and which of them are real.

    Args:
        model: tokens [batch, length] -> logits [batch, length, vocab].
        tokens: int32 [batch, sequence_length + 1], right-padded.
        lengths: int32 [batch], the real tokens of each row.

    Returns:
        (losses, mask), both float32 [batch, sequence_length]: the loss of
        predicting token t + 1 from tokens 0..t, and 1.0 where token t + 1 is real.
    """
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    mask = tf.sequence_mask(lengths - 1, tf.shape(targets)[1], dtype=tf.float32)
    logits = tf.cast(model(inputs, training=True), tf.float32)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    return losses * mask, mask


class LanguageModelLoop(Loop):
    """Trains a next-token model on (tokens, lengths) batches of right-padded sequences.

    A replica sums the cross entropy over its real tokens and divides by the
    real tokens of the whole step, all-reduced over the replicas (and, with
    `grad_accum_steps`, weighted over the micro-batches by `loops.Update`):
    the single-device token-weighted loss on any replica count, whatever
    padding each replica holds, also for a replica with no real token. A
    per-replica or per-example mean would weight tokens differently on 1 and
    N replicas.

    Evaluation reports the token-weighted `loss` (nats per token) over the
    whole eval split, `perplexity` = exp(loss), `bits_per_token` and, when
    given, `unigram_perplexity` (the baseline to beat). At each evaluation
    the chief writes continuations of `sample_prompts`, greedy and sampled
    (keyed on the seed and the step, so any replica count writes the same
    text), to TensorBoard's text dashboard and to
    `model_dir/samples/step-<step>.txt`.
    """

    name = "lm"
    throughput_unit = ("tokens", "tokens")  # real (predicted) tokens a step trains on
    supports_parameter_server = True  # its steps are sums over tokens, by loops.Update

    def __init__(
        self,
        *,
        model_fn: Callable[[], keras.Model],
        optimizer_fn: Callable[[], keras.optimizers.Optimizer],
        sequence_length: int,
        clip_norm: float | None = None,
        # Evaluation.
        unigram_perplexity: float | None = None,
        corpus: Mapping[str, Any] | None = None,
        sample_prompts: Sequence[str] = DEFAULT_PROMPTS,
        sample_length: int = 80,
        sample_temperature: float = 0.8,
    ):
        """
        Args:
            model_fn: builds the model (in scope): int32 tokens [batch, length]
                -> logits [batch, length, vocab], causal, for any length up to
                `sequence_length`; e.g. loops_models.lm.transformer_lm.
            optimizer_fn: builds the optimizer (in scope).
            sequence_length: the tokens a window feeds the model; the
                batches' rows hold sequence_length + 1 tokens.
            clip_norm: clip the summed gradient to this global norm; None: no clip.
            unigram_perplexity: the baseline reported beside the perplexity.
            corpus: what the data holds (e.g. its token counts), recorded in
                results.json under "corpus".
            sample_prompts: prompts continued at each evaluation; () for none.
            sample_length: bytes each continuation adds.
            sample_temperature: the sampled continuation's temperature (> 0).

        Raises:
            ValueError: a bad argument, with the fix.
        """
        check_clip_norm(clip_norm)
        for name, value in (("sequence_length", sequence_length), ("sample_length", sample_length)):
            check_whole(name, value)
        if not sample_temperature > 0:
            raise ValueError(
                f"sample_temperature must be > 0 (the greedy continuation is written too), "
                f"got {sample_temperature!r}."
            )
        empty = [prompt for prompt in sample_prompts if not prompt]
        if empty:
            raise ValueError("sample_prompts must not hold an empty prompt; give each a few bytes.")
        self.model_fn = model_fn
        self.optimizer_fn = optimizer_fn
        self.sequence_length = sequence_length
        self.clip_norm = clip_norm
        self.unigram_perplexity = unigram_perplexity
        self.corpus = dict(corpus or {})
        self.sample_prompts = tuple(sample_prompts)
        self.sample_length = sample_length
        self.sample_temperature = float(sample_temperature)
        self.sample_files: list[str] = []

    def build(self) -> None:
        self.build_one_update(self.model_fn(), self.optimizer_fn, clip_norm=self.clip_norm)
        # Traced: eagerly, each generated byte is a Python round trip (14x slower).
        self._continue_prompt = tf.function(
            lambda tokens, *, temperature, seed: text_generation.generate(
                self.model,
                tokens,
                self.sample_length,
                sequence_length=self.sequence_length,
                temperature=temperature,
                seed=seed,
            ),
            reduce_retracing=True,
        )

    def checkpoint_items(self):
        return self.one_update_checkpoint_items()

    def _replica_loss(self, tokens, lengths):
        losses, mask = next_token_losses(self.model, tokens, lengths)
        real = tf.reduce_sum(mask)
        count = reduction.global_count(real)  # real tokens on ALL replicas
        loss = reduction.scale_to_global_batch(tf.reduce_sum(losses, axis=1), count)
        return loss, {"tokens": real}

    def train_step(self, iterator):
        return one_update_train_step(
            self, self._replica_loss, iterator, count="tokens", reported_as="tokens"
        )

    def _replica_eval_sums(self, tokens, lengths):
        losses, mask = next_token_losses(self.model, tokens, lengths)
        return {"loss": tf.reduce_sum(losses), "tokens": tf.reduce_sum(mask)}

    def eval_step(self, batch):
        replica_sums = self.strategy.run(self._replica_eval_sums, args=batch)
        return reduced_eval(self.strategy, replica_sums, count="tokens")

    def run_evaluation(self, run: RunContext) -> dict[str, float]:
        metrics = dict(super().run_evaluation(run))
        if "loss" in metrics:
            metrics["perplexity"] = math.exp(min(metrics["loss"], 700.0))
            metrics["bits_per_token"] = metrics["loss"] / math.log(2.0)
        if self.unigram_perplexity is not None:
            metrics["unigram_perplexity"] = self.unigram_perplexity
        if run.is_chief and self.sample_prompts:
            self._write_samples(run)
        return metrics

    def eval_metric_names(self, run: RunContext) -> set[str] | None:
        names = run.eval_step_output_names()
        if names is None:
            return None
        added = {"perplexity", "bits_per_token"} if "loss" in names else set()
        if self.unigram_perplexity is not None:
            added.add("unigram_perplexity")
        return names | added

    def samples(self) -> dict[str, str]:
        """Prompts continued: "greedy/<i>" and "sampled/<i>" -> the prompt and its continuation."""
        texts = {}
        for index, prompt in enumerate(self.sample_prompts):
            tokens = tf.constant([text_generation.encode(prompt)], tf.int32)
            for kind, temperature in (("greedy", 0.0), ("sampled", self.sample_temperature)):
                continued = self._continue_prompt(
                    tokens,
                    temperature=temperature,
                    seed=step_seed(self.options.seed, self.global_step, index, _SAMPLE_STREAM),
                )
                texts[f"{kind}/{index}"] = text_generation.decode(continued[0].numpy())
        return texts

    def _write_samples(self, run: RunContext) -> None:
        texts = self.samples()
        run.summaries.text(
            "samples", run.step, {key: f"```\n{text}\n```" for key, text in texts.items()}
        )
        if run.model_dir is None:
            return
        path = os.path.join(run.model_dir, "samples", f"step-{run.step:07d}.txt")
        body = "".join(f"--- {key} ---\n{text}\n" for key, text in texts.items())
        reporting.write_text_atomic(path, body)
        if path not in self.sample_files:
            self.sample_files.append(path)

    def results_extra(self):
        extra = {"sequence_length": self.sequence_length, "sample_files": self.sample_files}
        if self.corpus:
            extra["corpus"] = self.corpus
        return extra
