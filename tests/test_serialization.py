"""Config round-trips, `.keras` save/load, and loading a TensorFlow-saved model under JAX/torch."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    LabelSmoothedCrossEntropy,
    MaskedAccuracy,
    MultiHeadAttention,
    PositionalEncoding,
    TokenEmbedding,
    Transformer,
    TransformerSchedule,
)

SOURCE = np.array([[5, 6, 7, 3, 0], [8, 9, 10, 11, 3]], "int32")
TARGET = np.array([[2, 12, 13, 0], [2, 14, 15, 16]], "int32")

# Non-default values wherever there is one, so a dropped argument shows.
LAYERS = [
    MultiHeadAttention(
        d_model=16,
        num_heads=2,
        dropout=0.2,
        use_fused_attention=True,
        kernel_initializer="he_normal",
        bias_initializer="ones",
        name="attention",
    ),
    MultiHeadAttention(  # Keras's arguments
        num_heads=3,
        key_dim=5,
        value_dim=6,
        dropout=0.1,
        use_bias=False,
        output_shape=(2, 7),
        attention_axes=1,
        flash_attention=False,
        kernel_regularizer="l2",
        bias_regularizer="l1",
        kernel_constraint="non_neg",
        bias_constraint="unit_norm",
        seed=7,
        name="keras_attention",
    ),
    PositionalEncoding(max_wavelength=500.0, name="positions"),
    TokenEmbedding(vocab_size=30, d_model=8, pad_id=None, embeddings_initializer="uniform"),
    FeedForward(
        d_model=8, d_ff=24, activation="gelu", dropout=0.3, kernel_initializer="he_uniform"
    ),
    EncoderLayer(
        d_model=16,
        num_heads=4,
        d_ff=32,
        dropout=0.2,
        attention_dropout=0.1,
        norm_first=True,
        layer_norm_epsilon=1e-5,
        use_fused_attention=True,
    ),
    DecoderLayer(
        d_model=16,
        num_heads=4,
        d_ff=32,
        dropout=0.2,
        attention_dropout=0.1,
        norm_first=True,
        layer_norm_epsilon=1e-5,
        use_fused_attention=True,
    ),
    Transformer.from_preset(
        "tiny", norm_first=True, dropout=0.2, vocab_size=500, name="translator"
    ),
]


def _np(x):
    return ops.convert_to_numpy(x)


@pytest.mark.multibackend
@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: type(layer).__name__)
def test_layer_config_round_trips(layer):
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    # And through the registered, serialized form that `.keras` files hold.
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer)
    assert restored.get_config() == config


# `MultiHeadAttention(d_model=16, num_heads=4, ...).get_config()` before Keras's
# arguments (issue 51): what `.keras` files saved then hold.
OLD_ATTENTION_CONFIG = {
    "name": "a",
    "trainable": True,
    "dtype": {
        "module": "keras",
        "class_name": "DTypePolicy",
        "config": {"name": "float32"},
        "registered_name": None,
    },
    "d_model": 16,
    "num_heads": 4,
    "dropout": 0.1,
    "use_fused_attention": True,
    "kernel_initializer": {
        "module": "keras.initializers",
        "class_name": "GlorotUniform",
        "config": {"seed": None, "input_axes": None, "output_axes": None},
        "registered_name": None,
    },
    "bias_initializer": {
        "module": "keras.initializers",
        "class_name": "Zeros",
        "config": {},
        "registered_name": None,
    },
}


@pytest.mark.multibackend
def test_an_old_attention_config_loads_as_the_short_form():
    layer = MultiHeadAttention.from_config(OLD_ATTENTION_CONFIG)
    expected = MultiHeadAttention(
        d_model=16, num_heads=4, dropout=0.1, use_fused_attention=True, name="a"
    )
    assert layer.get_config() == expected.get_config()
    assert (layer.key_dim, layer.value_dim) == (4, 4)
    layer.build((None, None, 16))  # the weights (and their paths) of a file saved then
    assert [w.path for w in layer.weights] == [
        f"a/{dense}/{weight}"
        for dense in ("query", "key", "value", "attention_output")
        for weight in ("kernel", "bias")
    ]


@pytest.mark.multibackend
def test_schedule_loss_and_metric_configs_round_trip():
    schedule = TransformerSchedule(d_model=256, warmup_steps=123, scale=2.0)
    assert schedule.get_config() == {
        "d_model": 256,
        "warmup_steps": 123,
        "scale": 2.0,
        "batches_per_update": 1,
    }
    assert (
        TransformerSchedule.from_config(schedule.get_config()).get_config() == schedule.get_config()
    )
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.2, pad_id=1, name="ls")
    assert (
        LabelSmoothedCrossEntropy.from_config(loss.get_config()).get_config() == loss.get_config()
    )
    assert loss.get_config()["label_smoothing"] == 0.2 and loss.get_config()["pad_id"] == 1
    metric = MaskedAccuracy(pad_id=1, name="acc")
    assert MaskedAccuracy.from_config(metric.get_config()).get_config() == metric.get_config()
    for obj in (schedule, loss, metric):
        restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(obj))
        assert type(restored) is type(obj)
        assert restored.get_config() == obj.get_config()


@pytest.mark.multibackend
def test_transformer_keras_file_round_trip(tmp_path):
    model = Transformer.from_preset("tiny", vocab_size=100)
    inputs = {"source_ids": SOURCE, "target_ids": TARGET}
    expected = _np(model(inputs))
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    assert isinstance(restored, Transformer)
    assert restored.config == model.config
    np.testing.assert_array_equal(_np(restored(inputs)), expected)
    # Incremental decoding works on the restored model.
    cache = restored.init_cache(SOURCE, 4)
    step_logits, _ = restored.decode_step(TARGET[:, 0], cache)
    np.testing.assert_allclose(_np(step_logits), expected[:, 0], atol=1e-5)


@pytest.mark.multibackend
def test_functional_classifier_with_encoder_layer_round_trip(tmp_path):
    inputs = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(50, 16, mask_zero=True)(inputs)
    x = EncoderLayer(d_model=16, num_heads=2, d_ff=32)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    classifier = keras.Model(inputs, keras.layers.Dense(3)(x))
    ids = np.array([[4, 5, 6, 0, 0], [7, 8, 9, 10, 11]], "int32")
    expected = _np(classifier(ids))
    path = str(tmp_path / "classifier.keras")
    classifier.save(path)
    restored = keras.saving.load_model(path)
    np.testing.assert_array_equal(_np(restored(ids)), expected)
    # The restored classifier still ignores padding: dropping the pad columns changes nothing.
    np.testing.assert_allclose(_np(restored(ids[:1, :3])), expected[:1], atol=1e-5)


_SAVE = """
import numpy as np, keras
from keras_transformer import Transformer
model = Transformer.from_preset("tiny", vocab_size=100)
inputs = {"source_ids": np.load("{dir}/source.npy"), "target_ids": np.load("{dir}/target.npy")}
np.save("{dir}/tensorflow.npy", keras.ops.convert_to_numpy(model(inputs)))
model.save("{dir}/model.keras")
"""

_LOAD = """
import numpy as np, keras
import keras_transformer
keras_transformer.register_keras_classes()
model = keras.saving.load_model("{dir}/model.keras", compile=False)
inputs = {"source_ids": np.load("{dir}/source.npy"), "target_ids": np.load("{dir}/target.npy")}
# predict() compiles the forward pass: eager JAX would compile op by op, far slower.
np.save("{dir}/{backend}.npy", model.predict(inputs, batch_size=2, verbose=0))
"""


def _start(code, backend, directory):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    script = textwrap.dedent(code).replace("{dir}", str(directory)).replace("{backend}", backend)
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(process, backend):
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, f"{backend} subprocess failed:\n{output[-3000:]}"


def test_keras_file_saved_under_tensorflow_loads_under_jax_and_torch(tmp_path):
    np.save(tmp_path / "source.npy", SOURCE)
    np.save(tmp_path / "target.npy", TARGET)
    _finish(_start(_SAVE, "tensorflow", tmp_path), "tensorflow")
    loaders = {backend: _start(_LOAD, backend, tmp_path) for backend in ("jax", "torch")}
    for backend, process in loaders.items():
        _finish(process, backend)
    expected = np.load(tmp_path / "tensorflow.npy")
    assert expected.shape == (2, 4, 100)
    for backend in loaders:
        np.testing.assert_allclose(np.load(tmp_path / f"{backend}.npy"), expected, atol=1e-5)


_SAVE_USER_MODEL = """
import numpy as np, keras
from keras_transformer.layers import DecoderLayer, EncoderLayer, PositionalEncoding
source = keras.Input((None,), dtype="int32")
target = keras.Input((None,), dtype="int32")
embed = keras.layers.Embedding(50, 16)
encoded = EncoderLayer(d_model=16, num_heads=2, d_ff=32)(PositionalEncoding()(embed(source)))
decoded = DecoderLayer(d_model=16, num_heads=2, d_ff=32)(PositionalEncoding()(embed(target)), encoded)
model = keras.Model([source, target], keras.layers.Dense(50)(decoded))
ids = np.array([[4, 5, 6, 7], [8, 9, 10, 11]], "int32")
np.save("{dir}/expected_{backend}.npy", keras.ops.convert_to_numpy(model([ids, ids[:, :3]])))
model.save("{dir}/user_{backend}.keras")
"""

# Only `import keras_transformer`, as a user would: before Keras, or after it.
_LOAD_USER_MODEL = """
import numpy as np
{imports}
model = keras.saving.load_model("{dir}/user_{backend}.keras")
ids = np.array([[4, 5, 6, 7], [8, 9, 10, 11]], "int32")
np.save("{dir}/reloaded_{backend}.npy", keras.ops.convert_to_numpy(model([ids, ids[:, :3]])))
"""


@pytest.mark.parametrize(
    "backend, imports",
    [
        ("tensorflow", "import keras_transformer\nimport keras"),
        ("jax", "import keras\nimport keras_transformer"),
        ("torch", "import keras_transformer\nimport keras"),
    ],
)
def test_a_model_of_the_public_layers_reloads_after_import_keras_transformer(
    tmp_path, backend, imports
):
    """A user's functional model of `EncoderLayer`, `DecoderLayer` and
    `PositionalEncoding`, saved in one process, reloads in a fresh one that
    imports only `keras_transformer` (and Keras), on every backend."""
    _finish(_start(_SAVE_USER_MODEL, backend, tmp_path), backend)
    _finish(_start(_LOAD_USER_MODEL.replace("{imports}", imports), backend, tmp_path), backend)
    np.testing.assert_allclose(
        np.load(tmp_path / f"reloaded_{backend}.npy"),
        np.load(tmp_path / f"expected_{backend}.npy"),
        atol=1e-6,
    )
