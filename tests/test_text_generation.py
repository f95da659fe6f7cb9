"""The byte-level Transformer is causal, and generate and its export continue text as specified."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from loops.core.mixed_precision import dtype_policy_scope
from loops.core.text_generation import decode, encode, generate
from loops.model_dir.lm_export import export_text_generator
from loops.vocabulary.errors import NonFiniteWeightsError
from loops_models.lm import transformer_lm

SEQUENCE_LENGTH = 8


def small_lm(seed=0):
    return transformer_lm(
        sequence_length=SEQUENCE_LENGTH, width=32, num_layers=2, num_heads=4, seed=seed
    )


def random_tokens(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=shape).astype(np.int32)


def reference_continuation(model, prompt, length, temperature=0.0, seed=None):
    """One eager model call per token on the last SEQUENCE_LENGTH tokens, choosing in numpy."""
    tokens = np.array(prompt)
    for index in range(length):
        logits = model(tokens[:, -SEQUENCE_LENGTH:]).numpy()[:, -1, :]
        if temperature == 0:
            chosen = np.argmax(logits, axis=-1)[:, None]
        else:
            token_seed = tf.random.experimental.stateless_fold_in(seed, index)
            chosen = tf.random.stateless_categorical(logits / temperature, 1, seed=token_seed)
        tokens = np.concatenate([tokens, np.asarray(chosen, np.int32)], axis=1)
    return tokens


def test_the_model_maps_any_length_up_to_its_sequence_length_to_float32_logits():
    model = small_lm()
    for length in (1, 5, SEQUENCE_LENGTH):
        logits = model(random_tokens((3, length)))
        assert logits.shape == (3, length, 256) and logits.dtype == tf.float32
    with pytest.raises(ValueError, match="takes at most 8 tokens, got 9; pass the last 8"):
        model(random_tokens((1, SEQUENCE_LENGTH + 1)))
    with dtype_policy_scope("mixed_bfloat16"):
        mixed = small_lm()
    assert mixed.get_layer("block_0_attention").compute_dtype == "bfloat16"
    assert mixed(random_tokens((2, 5))).dtype == tf.float32


def test_the_model_refuses_a_width_its_heads_cannot_share():
    with pytest.raises(ValueError, match="width 30 is not a multiple of num_heads 4"):
        transformer_lm(width=30, num_heads=4)
    with pytest.raises(ValueError, match="needs num_layers >= 1, got 0"):
        transformer_lm(num_layers=0)


def test_initial_weights_are_a_function_of_the_seed_and_the_projections_start_apart():
    first, again, other = small_lm(seed=3), small_lm(seed=3), small_lm(seed=4)
    for a, b in zip(first.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert any(
        np.any(a != b) for a, b in zip(first.get_weights(), other.get_weights()) if a.std() > 0
    )
    # One seed per projection: the query, key and value kernels differ.
    kernel = first.get_layer("block_0_attention").query_key_value.kernel.numpy()
    query, key, value = np.split(kernel, 3, axis=1)
    assert np.abs(query - key).max() > 0.1
    assert np.abs(key - value).max() > 0.1


def test_a_clone_of_the_model_computes_the_same_logits():
    model = small_lm()
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    tokens = random_tokens((2, SEQUENCE_LENGTH))
    np.testing.assert_array_equal(clone(tokens).numpy(), model(tokens).numpy())


def test_a_token_changes_no_logits_before_it():
    model = small_lm()
    tokens = random_tokens((2, SEQUENCE_LENGTH))
    changed = tokens.copy()
    position = 5
    changed[:, position] = (changed[:, position] + 1) % 256
    before, after = model(tokens).numpy(), model(changed).numpy()
    np.testing.assert_array_equal(after[:, :position], before[:, :position])
    assert np.abs(after[:, position:] - before[:, position:]).min(axis=-1).max() > 0
    assert np.abs(after[:, position:] - before[:, position:]).max() > 1e-3


def test_greedy_generate_equals_a_step_by_step_argmax_eagerly_and_traced():
    model = small_lm()
    prompt = random_tokens((2, 3), seed=1)
    expected = reference_continuation(model, prompt, 7)
    eager = generate(model, prompt, 7, sequence_length=SEQUENCE_LENGTH)
    assert eager.dtype == tf.int32 and eager.shape == (2, 10)
    np.testing.assert_array_equal(eager.numpy(), expected)

    traced = tf.function(
        lambda prompt, length: generate(model, prompt, length, sequence_length=SEQUENCE_LENGTH),
        input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.int32)],
    )
    np.testing.assert_array_equal(traced(prompt, tf.constant(7)).numpy(), expected)
    np.testing.assert_array_equal(traced(prompt, tf.constant(0)).numpy(), prompt)


def test_a_prompt_longer_than_the_window_is_continued_from_its_last_tokens():
    model = small_lm()
    prompt = random_tokens((1, 3 * SEQUENCE_LENGTH), seed=2)
    tokens = generate(model, prompt, 2 * SEQUENCE_LENGTH, sequence_length=SEQUENCE_LENGTH).numpy()
    np.testing.assert_array_equal(
        tokens, reference_continuation(model, prompt, 2 * SEQUENCE_LENGTH)
    )
    # Only the window counts: the last SEQUENCE_LENGTH prompt tokens give the same continuation.
    window_only = generate(
        model, prompt[:, -SEQUENCE_LENGTH:], 2 * SEQUENCE_LENGTH, sequence_length=SEQUENCE_LENGTH
    ).numpy()
    np.testing.assert_array_equal(
        window_only[:, SEQUENCE_LENGTH:], tokens[:, 3 * SEQUENCE_LENGTH :]
    )


def test_sampling_follows_the_seed_folded_with_each_token_index():
    model = small_lm()
    prompt = random_tokens((2, 4), seed=3)

    def sample(seed, length=10):
        return generate(
            model,
            prompt,
            length,
            sequence_length=SEQUENCE_LENGTH,
            temperature=0.7,
            seed=tf.constant(seed),
        ).numpy()

    first = sample([1, 2])
    np.testing.assert_array_equal(
        first, reference_continuation(model, prompt, 10, temperature=0.7, seed=tf.constant([1, 2]))
    )
    np.testing.assert_array_equal(sample([1, 2]), first)
    assert np.mean(sample([1, 3])[:, 4:] != first[:, 4:]) > 0.5
    traced = tf.function(
        lambda seed: generate(
            model, prompt, 10, sequence_length=SEQUENCE_LENGTH, temperature=0.7, seed=seed
        )
    )
    np.testing.assert_array_equal(traced(tf.constant([1, 2])).numpy(), first)


def test_generate_names_the_bad_argument():
    model = small_lm()
    prompt = random_tokens((1, 2))
    with pytest.raises(ValueError, match=r"temperature 0.5\) needs a seed"):
        generate(model, prompt, 3, sequence_length=SEQUENCE_LENGTH, temperature=0.5)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0, got -1.0"):
        generate(model, prompt, 3, sequence_length=SEQUENCE_LENGTH, temperature=-1.0)
    with pytest.raises(ValueError, match=r"seed must be a shape \[2\] integer tensor"):
        generate(
            model,
            prompt,
            3,
            sequence_length=SEQUENCE_LENGTH,
            temperature=1.0,
            seed=tf.constant([1]),
        )
    with pytest.raises(ValueError, match=r"shape \(batch, prompt_length\), got int32 of shape"):
        generate(model, encode("abc"), 3, sequence_length=SEQUENCE_LENGTH)
    with pytest.raises(ValueError, match="prompt_tokens is empty"):
        generate(model, np.zeros((1, 0), np.int32), 3, sequence_length=SEQUENCE_LENGTH)
    with pytest.raises(ValueError, match="length must be >= 0 new tokens, got -1"):
        generate(model, prompt, -1, sequence_length=SEQUENCE_LENGTH)
    with pytest.raises(tf.errors.InvalidArgumentError, match="length must be >= 0"):
        generate(model, prompt, tf.constant(-1), sequence_length=SEQUENCE_LENGTH)


def test_encode_and_decode_are_utf8_bytes():
    text = "Grüße, 世界\n"
    tokens = encode(text)
    assert tokens.dtype == np.int32 and tokens.tolist() == list(text.encode("utf-8"))
    np.testing.assert_array_equal(encode(text.encode("utf-8")), tokens)
    assert decode(tokens) == text
    assert decode(tf.constant([104, 105, 0xC3])) == "hi\ufffd"
    with pytest.raises(ValueError, match="one sequence of tokens, got shape"):
        decode(tokens[None])
    with pytest.raises(ValueError, match="Byte tokens are 0-255, got 256"):
        decode([104, 256])


def greedy_and_sampled(model, prompt):
    """Greedy tokens eagerly and sampled tokens in a tf.function, both 9 past the prompt."""
    greedy = generate(model, prompt, 9, sequence_length=SEQUENCE_LENGTH)
    sampled = tf.function(
        lambda: generate(
            model,
            prompt,
            9,
            sequence_length=SEQUENCE_LENGTH,
            temperature=0.8,
            seed=tf.constant([5, 6]),
        )
    )()
    return greedy.numpy(), sampled.numpy()


def test_two_replicas_generate_what_one_does_from_the_same_seed():
    prompt = random_tokens((3, 5), seed=4)
    results = {}
    for num_replicas in (1, 2):
        strategy = loops.testing.replica_strategy(num_replicas)
        with strategy.scope():
            model = small_lm(seed=7)
        kernel = model.get_layer("logits").kernel.value
        assert len(strategy.experimental_local_results(kernel)) == num_replicas
        results[num_replicas] = greedy_and_sampled(model, prompt)
    for one, two in zip(results[1], results[2]):
        np.testing.assert_array_equal(two, one)
    # The sampled continuation is not the greedy one, so the comparison covers sampling.
    greedy, sampled = results[1]
    assert np.mean(greedy[:, 5:] != sampled[:, 5:]) > 0.5


# Runs with TensorFlow alone: the framework and the example models cannot be imported.
SERVE_WITHOUT_THE_PROJECT = """
import json, sys
sys.modules.update(loops=None, loops_models=None, loops_data=None)
try:
    import loops
except ImportError:
    pass
else:
    raise SystemExit("loops is importable")
import tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
texts = [
    list(serve(prompt=tf.constant(prompt.encode("utf-8")), length=tf.constant(length))["text"]
         .numpy())
    for prompt, length in json.loads(sys.argv[2])
]
print(json.dumps(texts))
"""


def test_the_exported_generator_serves_greedy_text_with_tensorflow_alone(tmp_path):
    model = small_lm(seed=5)
    path = export_text_generator(model, str(tmp_path / "export"), sequence_length=SEQUENCE_LENGTH)
    requests = [("Grüße, ", 12), ("a prompt longer than the window", 5), ("", 6), ("x", 0)]
    done = subprocess.run(
        [sys.executable, "-I", "-c", SERVE_WITHOUT_THE_PROJECT, path, json.dumps(requests)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    served = [bytes(text) for text in json.loads(done.stdout.splitlines()[-1])]
    for (prompt, length), text in zip(requests, served):
        # An empty prompt is continued from a newline, which the served text leaves out.
        tokens = generate(
            model, encode(prompt or "\n")[None], length, sequence_length=SEQUENCE_LENGTH
        ).numpy()[0]
        expected = tokens if prompt else tokens[1:]
        assert text == expected.astype(np.uint8).tobytes()
        assert text.decode("utf-8", errors="replace") == decode(expected)
    assert len(served[0]) == len("Grüße, ".encode()) + 12 and len(served[2]) == 6
    assert served[3] == b"x"


def test_a_non_finite_weight_stops_the_export(tmp_path):
    model = small_lm()
    kernel = model.get_layer("block_1_mlp").kernel
    weights = kernel.numpy()
    weights[0, 0] = np.nan
    kernel.assign(weights)
    with pytest.raises(NonFiniteWeightsError, match="Refusing to export.*not finite"):
        export_text_generator(model, str(tmp_path / "export"), sequence_length=SEQUENCE_LENGTH)
    assert not (tmp_path / "export").exists()
