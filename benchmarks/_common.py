"""Shared pieces of the benchmarks: the three builds, the batch, FLOP counts, timing.

Every benchmark process runs under one Keras backend, chosen by
`KERAS_BACKEND` before `keras` is imported. The parent process never
imports a backend: it re-runs the benchmark script once per backend with
`spawn()` and reads one JSON line back.

The three builds of the same architecture (post-LN encoder-decoder, tied
source/target/output embedding scaled by sqrt(D), sinusoidal positions):

    keras_transformer  this package's `Transformer`
    keras_hub          keras_hub `ReversibleEmbedding` + `SinePositionEncoding`
                       + `TransformerEncoder` / `TransformerDecoder`
                       (`normalize_first=False`)
    keras_mha          `keras.layers.MultiHeadAttention` blocks, below
"""

import importlib.util
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

CANDIDATES = ("keras_transformer", "keras_hub", "keras_mha")
# Also built: "keras_transformer_fused", this package with `use_fused_attention=True`.


# --------------------------------------------------------------------------- processes


def hardware():
    """`keras_transformer.hardware`, loaded alone: the package's `__init__` would import
    a backend (and TensorFlow) before a benchmark process could set its environment."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "keras_transformer", "hardware.py")
    spec = importlib.util.spec_from_file_location("keras_transformer_hardware", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def allocator_env():
    """`keras_transformer.hardware.ALLOCATOR_ENV`, the allocator settings train.py re-runs
    itself with, so that benchmark processes run as users' training does."""
    return dict(hardware().ALLOCATOR_ENV)


def thread_env(threads):
    """Environment that limits every framework to `threads` compute threads (0: their
    defaults and train.py's allocator settings, as users train).

    On a small shared machine this matters more than anything else: with 2
    cores and other processes running, an OpenMP or Eigen pool of 2 threads
    waits at every barrier for a descheduled thread (torch's Adam step went
    from 0.03 s to 0.4 s). One thread per process gives stable, comparable
    numbers; the matmul peak is measured with the same setting.
    """
    if not threads:
        return allocator_env()  # train.py's settings: the allocator's included
    n = str(threads)
    return {
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "TF_NUM_INTRAOP_THREADS": n,
        "TF_NUM_INTEROP_THREADS": "1",
        "XLA_FLAGS": f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} "
        f"intra_op_parallelism_threads={n}",
    }


def set_threads(threads):
    """In a worker, after the backend is imported: the same limit through the framework's API."""
    import keras

    if not threads:
        return
    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
    elif keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def spawn(script, backend, argv, threads=1, timeout=900):
    """Runs `script --worker argv` under `backend`; returns the JSON it prints last."""
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", **thread_env(threads))
    env.setdefault("PYTHONPATH", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run(
        [sys.executable, script, "--worker", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        tail = "\n".join(result.stderr.splitlines()[-25:])
        raise RuntimeError(f"{backend} worker failed (rc={result.returncode}):\n{tail}")
    return json.loads(lines[-1])


def peak_rss_mib():
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def median(values):
    return statistics.median(values)


def load_average():
    return os.getloadavg()


# --------------------------------------------------------------------------- FLOPs


def training_flops(config, batch_size, source_length, target_length, attention=True):
    """Matmul FLOPs of one training step (forward + backward), counted analytically.

    A matmul with a (K, M) weight costs 2*K*M FLOPs per token forward and
    twice that backward (gradients of inputs and of weights): 6*K*M per
    token per step. Per layer, with D = d_model and F = d_ff:

        encoder layer:  4 D^2 (Q, K, V, output) + 2 D F          per source token
        decoder layer:  6 D^2 (self Q/K/V/out, cross Q/out) + 2 D F  per target token
                        + 2 D^2 (cross K/V of the encoder output)   per source token
        logits:         V D (the tied embedding, transposed)      per target token

    The embedding lookup is a gather (no FLOPs), so the shared matrix is
    counted once, through the logits. Cross-attention K/V projections
    act on source tokens, not target tokens, when S != T; we count them
    per source token. Attention itself (Q K^T and weights @ V) costs
    2 * 2 * T * S * D per sequence and layer forward, computed in full
    even where the causal mask zeroes half of it. Biases, LayerNorm,
    softmax, dropout, the loss and Adam are element-wise and left out.
    """
    d, f, v, n = config.d_model, config.d_ff, config.vocab_size, config.num_layers
    s, t, b = source_length, target_length, batch_size
    weights = n * (4 * d * d + 2 * d * f) * s  # encoder
    weights += n * (6 * d * d + 2 * d * f) * t  # decoder: self Q/K/V/out, cross Q/out, FFN
    weights += n * 2 * d * d * s  # decoder cross-attention K/V projections of the source
    weights += v * d * t  # logits
    scores = n * (4 * s * s * d + 4 * t * t * d + 4 * t * s * d)  # enc self, dec self, cross
    return 3 * b * (2 * weights + (scores if attention else 0))


# --------------------------------------------------------------------------- data


def add_batch_arguments(parser):
    """The model, batch and peak flags that train_throughput.py and torch_reference.py share."""
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--length", type=int, default=32, help="source and target length")
    parser.add_argument(
        "--no-padding", action="store_true", help="no padded rows: every position a real token"
    )
    parser.add_argument("--dropout", type=float, help="replaces the preset's dropout")
    parser.add_argument("--matmul-size", type=int, default=2048, help="of the matmul peak")


def make_batch(config, batch_size, source_length, target_length, seed=0, padding=True):
    """A fixed in-memory batch: x = {source_ids, target_ids}, y = next-token labels.

    With `padding`, the last quarter of every other source/target row is
    padding, so the padding masks do real work in all builds; without, every
    position is a real token (as in a packed batch), so tokens/s and model
    FLOPs count only real tokens.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    low = max(config.pad_id, config.bos_id, config.eos_id) + 1
    source = rng.integers(low, config.vocab_size, (batch_size, source_length), dtype="int32")
    labels = rng.integers(low, config.vocab_size, (batch_size, target_length), dtype="int32")
    if padding:
        source[::2, source_length - source_length // 4 :] = config.pad_id
        labels[::2, target_length - target_length // 4 :] = config.pad_id
    target = np.concatenate(
        [np.full((batch_size, 1), config.bos_id, dtype="int32"), labels[:, :-1]], axis=1
    )
    target[labels == config.pad_id] = config.pad_id
    return {"source_ids": source, "target_ids": target}, labels


# --------------------------------------------------------------------------- builds


def build_model(name, config):
    """One of `CANDIDATES`, with the architecture of `config` and the global dtype policy."""
    from keras_transformer import Transformer

    if name in ("keras_transformer", "keras_transformer_fused"):
        import dataclasses

        fused = name.endswith("_fused") or config.use_fused_attention
        return Transformer(**dataclasses.asdict(config) | {"use_fused_attention": fused})
    if name == "keras_hub":
        return _keras_hub_model(config)
    if name == "keras_mha":
        return _keras_mha_model(config)
    raise ValueError(
        f"Unknown candidate {name!r}. Available: {CANDIDATES + ('keras_transformer_fused',)}"
    )


def set_attention_dropout(model, rate):
    """Sets the dropout of the attention probabilities of every Keras `MultiHeadAttention`
    in a built `model`: keras-hub's blocks take one `dropout` for both places. Returns the
    number of layers set."""
    import keras

    layers = [
        layer for layer in model._flatten_layers()
        if isinstance(layer, keras.layers.MultiHeadAttention)
    ]  # fmt: skip
    for layer in layers:
        layer._dropout = rate
        layer._dropout_layer.rate = rate
    return len(layers)


def _keras_hub_model(config):
    import keras
    import keras_hub
    from keras import ops

    class KerasHubTransformer(keras.Model):
        """keras-hub blocks. Note: keras-hub applies `dropout` to attention weights too."""

        def __init__(self, config, **kwargs):
            super().__init__(**kwargs)
            self.config = config
            self.embedding = keras_hub.layers.ReversibleEmbedding(
                config.vocab_size,
                config.d_model,
                tie_weights=True,
                embeddings_initializer=keras.initializers.RandomNormal(stddev=config.d_model**-0.5),
            )
            self.positions = keras_hub.layers.SinePositionEncoding()
            self.embedding_dropout = keras.layers.Dropout(config.dropout)
            block = dict(
                intermediate_dim=config.d_ff,
                num_heads=config.num_heads,
                dropout=config.dropout,
                layer_norm_epsilon=config.layer_norm_epsilon,
                normalize_first=False,
            )
            self.encoder_layers = [
                keras_hub.layers.TransformerEncoder(**block) for _ in range(config.num_layers)
            ]
            self.decoder_layers = [
                keras_hub.layers.TransformerDecoder(**block) for _ in range(config.num_layers)
            ]

        def _embed(self, ids, training):
            x = self.embedding(ids) * math.sqrt(self.config.d_model)
            x = x + self.positions(x)
            return self.embedding_dropout(x, training=training)

        def call(self, inputs, training=None):
            source = ops.cast(inputs["source_ids"], "int32")
            target = ops.cast(inputs["target_ids"], "int32")
            source_mask = ops.not_equal(source, self.config.pad_id)
            target_mask = ops.not_equal(target, self.config.pad_id)
            x = self._embed(source, training)
            for layer in self.encoder_layers:
                x = layer(x, padding_mask=source_mask, training=training)
            y = self._embed(target, training)
            for layer in self.decoder_layers:
                y = layer(
                    y,
                    x,
                    decoder_padding_mask=target_mask,
                    encoder_padding_mask=source_mask,
                    training=training,
                )
            return ops.cast(self.embedding(y, reverse=True), "float32")

    return KerasHubTransformer(config)


def _keras_mha_model(config):
    import keras
    from keras import ops

    from keras_transformer.layers import PositionalEncoding

    d = config.d_model

    def attention():
        return keras.layers.MultiHeadAttention(
            config.num_heads, d // config.num_heads, dropout=config.attention_dropout
        )

    def norm():
        return keras.layers.LayerNormalization(epsilon=config.layer_norm_epsilon)

    class Block(keras.layers.Layer):
        """Post-LN block: self-attention, optional cross-attention, feed-forward."""

        def __init__(self, cross, **kwargs):
            super().__init__(**kwargs)
            self.self_attention, self.norm1 = attention(), norm()
            self.cross_attention = attention() if cross else None
            self.norm2 = norm() if cross else None
            self.inner = keras.layers.Dense(config.d_ff, activation="relu")
            self.outer = keras.layers.Dense(d)
            self.norm3 = norm()
            self.dropout = keras.layers.Dropout(config.dropout)

        def call(self, x, self_mask, memory=None, cross_mask=None, causal=False, training=None):
            h = self.self_attention(
                x, x, attention_mask=self_mask, use_causal_mask=causal, training=training
            )
            x = self.norm1(x + self.dropout(h, training=training))
            if self.cross_attention is not None:
                h = self.cross_attention(x, memory, attention_mask=cross_mask, training=training)
                x = self.norm2(x + self.dropout(h, training=training))
            h = self.outer(self.inner(x))
            return self.norm3(x + self.dropout(h, training=training))

    class KerasMHATransformer(keras.Model):
        def __init__(self, config, **kwargs):
            super().__init__(**kwargs)
            self.config = config
            self.embedding = keras.layers.Embedding(
                config.vocab_size,
                d,
                embeddings_initializer=keras.initializers.RandomNormal(stddev=d**-0.5),
            )
            self.positions = PositionalEncoding()
            self.embedding_dropout = keras.layers.Dropout(config.dropout)
            self.encoder_layers = [Block(False) for _ in range(config.num_layers)]
            self.decoder_layers = [Block(True) for _ in range(config.num_layers)]

        def _embed(self, ids, training):
            x = self.embedding(ids) * math.sqrt(d)
            return self.embedding_dropout(self.positions(x), training=training)

        def call(self, inputs, training=None):
            source = ops.cast(inputs["source_ids"], "int32")
            target = ops.cast(inputs["target_ids"], "int32")
            source_mask = ops.not_equal(source, self.config.pad_id)[:, None, :]  # (B, 1, S)
            target_mask = ops.not_equal(target, self.config.pad_id)[:, None, :]  # (B, 1, T)
            t, s = ops.shape(target)[1], ops.shape(source)[1]
            encoder_mask = ops.broadcast_to(source_mask, (ops.shape(source)[0], s, s))
            decoder_mask = ops.broadcast_to(target_mask, (ops.shape(target)[0], t, t))
            cross_mask = ops.broadcast_to(source_mask, (ops.shape(source)[0], t, s))
            x = self._embed(source, training)
            for layer in self.encoder_layers:
                x = layer(x, encoder_mask, training=training)
            y = self._embed(target, training)
            for layer in self.decoder_layers:
                y = layer(y, decoder_mask, x, cross_mask, causal=True, training=training)
            embeddings = ops.cast(self.embedding.embeddings, y.dtype)
            return ops.cast(ops.matmul(y, ops.transpose(embeddings)), "float32")

    return KerasMHATransformer(config)


def compile_for_training(model, config, jit_compile=False):
    """Adam (beta_2=0.98, eps=1e-9, Section 5.3) + the project's label-smoothed loss."""
    import keras

    from keras_transformer import LabelSmoothedCrossEntropy, TransformerSchedule

    optimizer = keras.optimizers.Adam(
        TransformerSchedule(config.d_model, warmup_steps=4000),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
    )
    model.compile(
        optimizer=optimizer,
        loss=LabelSmoothedCrossEntropy(label_smoothing=0.1, pad_id=config.pad_id),
        jit_compile=jit_compile,
    )
    return model


def count_params(model):
    return int(sum(math.prod(w.shape) for w in model.trainable_weights))


# --------------------------------------------------------------------------- matmul peak


def matmul_seconds(size=2048, dtype="float32", repeats=3):
    """Median seconds of one (size x size) @ (size x size) matmul in the current backend."""
    import keras
    from keras import ops

    a = keras.random.normal((size, size), dtype=dtype, seed=1)
    b = keras.random.normal((size, size), dtype=dtype, seed=2)
    matmul = ops.matmul
    if keras.backend.backend() == "jax":
        import jax

        matmul = jax.jit(ops.matmul)
    elif keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        matmul = tf.function(ops.matmul)
    # NumPy has no bfloat16: read the result back as float32.
    ops.convert_to_numpy(ops.cast(matmul(a, b)[0, 0], "float32"))  # warm-up / compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ops.convert_to_numpy(ops.cast(matmul(a, b)[0, 0], "float32"))
        times.append(time.perf_counter() - start)
    return median(times)
