"""The line each binary ends a run with: what the run reached, for a person reading the log."""

from __future__ import annotations

# CartPole-v1's reward threshold.
SOLVED_RETURN = 475.0
# The bar of the original CartPole (v0): a learner that passes it has clearly learned.
LEARNED_RETURN = 195.0


def gan(trainer) -> str:
    """Steps of each network, and on the ring the modes the generator covers."""
    from loops_data.ring import Ring

    results, metrics = trainer.definition.results_extra(), trainer.state.last_eval_metrics
    summary = f"trained {results['g_steps']} generator and {results['d_steps']} discriminator steps"
    if "modes_covered" in metrics:
        summary += (
            f"; modes covered {metrics['modes_covered']} of {Ring().num_modes}, "
            f"high-quality fraction {metrics['high_quality_fraction']:.3f}"
        )
    return summary


def language_model(trainer) -> str:
    """The eval perplexity, against the train split's byte frequencies and compressors."""
    metrics = trainer.state.last_eval_metrics
    if "perplexity" not in metrics:
        return "no evaluation"
    line = (
        f"eval perplexity {metrics['perplexity']:.2f} per byte "
        f"({metrics['bits_per_token']:.3f} bits), against {metrics['unigram_perplexity']:.2f} "
        "for the train split's byte frequencies"
    )
    corpus = trainer.definition.results_extra().get("corpus", {})
    compressed = corpus.get("compressors_bits_per_byte")
    if compressed:
        figures = ", ".join(f"{name} {bits:.3f}" for name, bits in compressed.items())
        line += f"; compressors given the train split, bits per byte: {figures}"
    return line


def reinforcement_learning(trainer) -> str:
    """The mean return of the last 100 episodes, and whether it solved CartPole."""
    results = trainer.definition.results_extra()
    mean_return = results["mean_return_100"]
    verdict = (
        "solved (>= 475)"
        if mean_return >= SOLVED_RETURN
        else "learned (>= 195)"
        if mean_return >= LEARNED_RETURN
        else "below 195"
    )
    return (
        f"{results['algorithm']}: mean return of the last 100 episodes {mean_return:.1f}, "
        f"{verdict}; {results['episodes']} episodes, {results['env_steps']} environment "
        f"steps at {trainer.state.units_per_second or 0:.0f} per second"
    )
