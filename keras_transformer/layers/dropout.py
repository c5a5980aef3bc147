"""Dropout whose random numbers XLA on CPU generates fast."""

import keras
from keras import ops


class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout`, drawing its mask with ThreeFry when the step is
    compiled with XLA under TensorFlow.

    Keras draws dropout masks with `tf.nn.experimental.stateless_dropout`
    (Philox). Compiled by XLA for CPU, Philox took 40 ms for 15 masks of
    `(32, 32, 256)` against 14 ms without XLA, which left nothing of XLA's gain
    on a training step with dropout 0.3; ThreeFry took 12 ms under XLA
    (`benchmarks/README.md`, "XLA and dropout"). TensorFlow runs ThreeFry only
    inside XLA, so the layer uses it only when `use_threefry` is set:
    `Transformer.compile(jit_compile=True)` sets it on every dropout layer of
    the model. Same rate and scaling as Keras's; another random stream.

    Under JAX, `jax_bits = "rbg"` draws the mask's bits with XLA's
    `RngBitGenerator` (Philox on GPUs) instead of Keras's ThreeFry: on a GPU
    the ThreeFry hash made dropout 13.7% of the `base` step (issue 44); on a
    CPU `RngBitGenerator` is the slower (155 ms against 98 ms for 15 masks of
    48 x 64 x 512 on a Zen 5 core pair), so ThreeFry stays the default until
    `benchmarks/gpu.sh`'s `jax_rbg` step measures the GPU.
    """

    use_threefry = False
    jax_bits = "threefry"  # or "rbg" (class-wide: `Dropout.jax_bits = "rbg"`)

    def call(self, inputs, training=False):
        if training and self.rate > 0 and self.jax_bits == "rbg":
            if keras.backend.backend() == "jax":
                return self._rbg_dropout(inputs)
        if not (training and self.rate > 0 and self.use_threefry):
            return super().call(inputs, training=training)
        import tensorflow as tf

        seed = ops.cast(self.seed_generator.next(), "int32")
        uniform = tf.random.stateless_uniform(tf.shape(inputs), seed=seed, alg="threefry")
        keep = uniform >= self.rate
        return ops.where(keep, inputs / ops.cast(1.0 - self.rate, inputs.dtype), 0)

    def _rbg_dropout(self, inputs):
        import jax
        import jax.numpy as jnp

        seed = self.seed_generator.next()  # 2 uint32 words; an rbg key has 4
        words = jnp.concatenate([seed, seed ^ jnp.uint32(0x9E3779B9)]).astype(jnp.uint32)
        bits = jax.random.bits(jax.random.wrap_key_data(words, impl="rbg"), inputs.shape)
        keep = bits >= jnp.uint32(min(round(self.rate * 2**32), 2**32 - 1))
        return jnp.where(keep, inputs / jnp.asarray(1.0 - self.rate, inputs.dtype), 0)
