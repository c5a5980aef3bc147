"""Invariants of the full `Transformer`: masking, causality, cached decoding, size."""

import numpy as np
import pytest
from backend_utils import compiled
from keras import ops

from keras_transformer import Transformer, get_preset

ATOL = 1e-5

# Two sources with padding (pad_id=0) and teacher-forced targets starting with BOS=2.
SOURCE = np.array([[5, 6, 7, 8, 3, 0, 0], [9, 10, 11, 12, 13, 14, 3]], "int32")  # (B=2, S=7)
TARGET = np.array([[2, 20, 21, 22, 23], [2, 30, 31, 32, 33]], "int32")  # (B=2, T=5)


def _np(x):
    return ops.convert_to_numpy(x)


def _logits(model, source, target):
    return _np(model.jit_forward(source, target))


def _tiny_model(norm_first=False):
    model = Transformer.from_preset("tiny", dropout=0.0, norm_first=norm_first)
    model.build()
    # Compiled entry points (under JAX only; see `compiled`).
    model.jit_forward = compiled(
        model, lambda source, target: model({"source_ids": source, "target_ids": target})
    )
    model.jit_encode = compiled(model, model.encode)
    model.jit_decode = compiled(model, model.decode)
    model.jit_init_cache = compiled(model, lambda source: model.init_cache(source, 7))
    model.jit_decode_step = compiled(model, model.decode_step)
    return model


@pytest.fixture(scope="module")
def model():
    return _tiny_model()


@pytest.fixture(scope="module")
def logits(model):
    return _logits(model, SOURCE, TARGET)  # (B, T, V)


@pytest.mark.multibackend
def test_output_shape_and_dtype(model, logits):
    assert logits.shape == (2, 5, model.config.vocab_size)
    assert logits.dtype == np.float32
    assert np.isfinite(logits).all()


@pytest.mark.multibackend
def test_padded_source_positions_do_not_change_logits(model, logits):
    """Whatever sits at padded source positions, real logits stay the same."""
    # 1. The encoder output at padded positions, seen by the decoder.
    noisy = _np(model.jit_encode(SOURCE)).copy()
    noisy[0, 5:] = np.random.normal(size=noisy[0, 5:].shape)
    np.testing.assert_allclose(_np(model.jit_decode(TARGET, noisy, SOURCE)), logits, atol=ATOL)
    # 2. The vector the encoder receives there: give the pad embedding (row pad_id) other values.
    # The targets have no padding. The tied pre-softmax logit of the pad token itself moves
    # with that row, so every other vocabulary entry is compared.
    table = model.embedding.embeddings
    original = _np(table)
    try:
        changed_table = original.copy()
        changed_table[model.config.pad_id] = np.random.normal(size=original.shape[1])
        table.assign(changed_table)
        changed = _logits(model, SOURCE, TARGET)
        pad_id = model.config.pad_id
        np.testing.assert_allclose(
            np.delete(changed, pad_id, axis=-1), np.delete(logits, pad_id, axis=-1), atol=ATOL
        )
    finally:
        table.assign(original)
    # Changing a real source token does change the logits (the checks above can fail).
    real = SOURCE.copy()
    real[0, 1] = 50
    assert np.abs(_logits(model, real, TARGET)[0] - logits[0]).max() > 1e-4


@pytest.mark.multibackend
def test_source_padding_length_does_not_change_logits(model, logits):
    """Extra pad columns (a longer padded batch) leave every real logit unchanged."""
    longer = np.concatenate([SOURCE, np.zeros((2, 3), "int32")], axis=1)
    np.testing.assert_allclose(_logits(model, longer, TARGET), logits, atol=ATOL)
    # Sequence 0 alone, without its padding, gives the same logits as in the batch.
    alone = _logits(model, SOURCE[:1, :5], TARGET[:1])
    np.testing.assert_allclose(alone, logits[:1], atol=ATOL)


@pytest.mark.multibackend
def test_future_target_tokens_do_not_change_earlier_logits(model, logits):
    for t in (1, 3):
        target = TARGET.copy()
        target[:, t] = [60, 61]
        changed = _logits(model, SOURCE, target)
        np.testing.assert_allclose(changed[:, :t], logits[:, :t], atol=ATOL)
        assert np.abs(changed[:, t:] - logits[:, t:]).max() > 1e-4


@pytest.mark.multibackend
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_cached_decoding_equals_full_forward(norm_first, model, logits):
    if norm_first:
        model = _tiny_model(norm_first=True)
        logits = _logits(model, SOURCE, TARGET)
    max_length = 7  # a cache longer than the decoded prefix (T=5), as in `jit_init_cache`
    cache = model.jit_init_cache(SOURCE)
    config = model.config
    head_dim = config.d_model // config.num_heads
    assert tuple(cache["self_key"].shape) == (
        2,
        config.num_layers,
        max_length,
        config.num_heads,
        head_dim,
    )
    assert tuple(cache["cross_key"].shape) == (2, config.num_layers, 7, config.num_heads, head_dim)
    steps = []
    for t in range(TARGET.shape[1]):
        step_logits, cache = model.jit_decode_step(TARGET[:, t], cache)
        steps.append(_np(step_logits))
    np.testing.assert_allclose(np.stack(steps, axis=1), logits, atol=ATOL)
    np.testing.assert_array_equal(_np(cache["index"]), [5, 5])


def _expected_parameter_count(config):
    """Counted from the paper's architecture, independently of the code."""
    d, d_ff = config.d_model, config.d_ff
    attention = 4 * (d * d + d)  # W^Q, W^K, W^V, W^O with biases
    feed_forward = d * d_ff + d_ff + d_ff * d + d
    layer_norm = 2 * d
    encoder_layer = attention + feed_forward + 2 * layer_norm
    decoder_layer = 2 * attention + feed_forward + 3 * layer_norm
    final_norms = 2 * layer_norm if config.norm_first else 0
    embedding = config.vocab_size * d  # shared by source, target and pre-softmax
    return embedding + config.num_layers * (encoder_layer + decoder_layer) + final_norms


@pytest.mark.parametrize("preset, paper_millions", [("base", 65), ("big", 213)])
def test_parameter_count_matches_paper_table_3(preset, paper_millions):
    model = Transformer.from_preset(preset, vocab_size=37000)
    model.build()
    count = model.count_params()
    assert count == _expected_parameter_count(model.config)
    assert abs(count / 1e6 - paper_millions) / paper_millions < 0.05, count


def test_norm_first_adds_final_layer_norms():
    config = get_preset("tiny", norm_first=True)
    model = Transformer.from_preset("tiny", norm_first=True)
    model.build()
    assert model.count_params() == _expected_parameter_count(config)


def _packed_batch(model):
    """Pairs of `SOURCE`/`TARGET`-like ids, packed two to a row, and each pair alone."""
    from keras_transformer.data.pipeline import TokenizedSplit, assemble, assemble_packed

    rng = np.random.default_rng(0)
    vocab = model.config.vocab_size
    sources = [np.append(rng.integers(4, vocab, n), 3) for n in (3, 5, 2, 6)]
    targets = [rng.integers(4, vocab, n) for n in (4, 2, 5, 3)]

    def flat(rows):
        offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
        return np.concatenate(rows).astype("int32"), offsets

    source, source_offsets = flat(sources)
    target, target_offsets = flat(targets)
    lengths = np.maximum(np.diff(source_offsets), np.diff(target_offsets) + 1)
    split = TokenizedSplit(source, source_offsets, target, target_offsets, lengths, 0)
    packed = assemble_packed(split, 16, [[0, 1], [2, 3]])
    alone = [assemble(split, np.array([i])) for i in range(4)]
    return packed, alone


@pytest.mark.multibackend
def test_packed_pairs_get_the_logits_they_get_alone(model):
    """Segment masks and positions: no attention crosses pairs packed in one row."""
    (features, _), alone = _packed_batch(model)
    forward = compiled(model, lambda inputs: model(inputs))
    packed = _np(forward(features))  # (2, 16, V)
    for index, (pair, _) in enumerate(alone):
        row, segment = divmod(index, 2)
        at = features["target_segment_ids"][row] == segment + 1
        expected = _np(forward(pair))[0]
        np.testing.assert_allclose(packed[row, at], expected, atol=ATOL)
    # Changing one pair's tokens leaves its row-mate's logits unchanged.
    changed = dict(features)
    changed["source_ids"] = features["source_ids"].copy()
    at = features["source_segment_ids"][0] == 1
    changed["source_ids"][0, at] = (changed["source_ids"][0, at] + 1) % model.config.vocab_size
    other = features["target_segment_ids"][0] == 2
    np.testing.assert_allclose(_np(forward(changed))[0, other], packed[0, other], atol=ATOL)


def test_packed_inputs_need_every_packing_key(model):
    (features, _), _ = _packed_batch(model)
    partial = {k: v for k, v in features.items() if k != "target_positions"}
    with pytest.raises(ValueError, match="missing \\['target_positions'\\]"):
        model(partial)


@pytest.mark.multibackend
@pytest.mark.parametrize("packed", [False, True])
def test_fused_attention_model_equals_the_explicit_one(model, packed):
    """`use_fused_attention` (`keras.ops.dot_product_attention`, cuDNN / flash
    kernels where the backend has them) gives the explicit softmax's logits,
    with padding, causal and packed-row segment masks (`train.py --fused-attention`)."""
    fused = Transformer.from_preset("tiny", dropout=0.0, use_fused_attention=True)
    fused.build()
    fused.set_weights(model.get_weights())
    if packed:
        (features, _), _ = _packed_batch(model)
        real = features["target_segment_ids"] > 0
    else:
        features = {"source_ids": SOURCE, "target_ids": TARGET}
        real = np.ones(TARGET.shape, bool)
    expected = _np(compiled(model, lambda inputs: model(inputs))(features))
    got = _np(compiled(fused, lambda inputs: fused(inputs))(features))
    np.testing.assert_allclose(got[real], expected[real], atol=ATOL)
