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
    """

    use_threefry = False

    def call(self, inputs, training=False):
        if not (training and self.rate > 0 and self.use_threefry):
            return super().call(inputs, training=training)
        import tensorflow as tf

        seed = ops.cast(self.seed_generator.next(), "int32")
        uniform = tf.random.stateless_uniform(tf.shape(inputs), seed=seed, alg="threefry")
        keep = uniform >= self.rate
        return ops.where(keep, inputs / ops.cast(1.0 - self.rate, inputs.dtype), 0)
