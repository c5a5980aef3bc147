"""The projections of multi-head attention: into heads and back, one matmul each."""

import math

import keras
from keras import ops


class HeadDense(keras.layers.EinsumDense):
    """`EinsumDense` that splits `(B, T, D) -> (B, T, N, H)` or merges heads back.

    Same weights (kernel `(D, N, H)` or `(N, H, D)`) and math as
    `EinsumDense("btd,dnh->btnh")` / `("btnh,nhd->btd")`, computed as one
    matmul over flattened head axes. Under TensorFlow with static shapes,
    Keras runs those einsums as a `BatchMatMulV2` that broadcasts the kernel
    over the batch, whose kernel gradient builds a `(B, D, N * H)` tensor and
    sums it; `ops.matmul` of a 3-D input and a 2-D kernel is one `MatMul`
    forward and backward: 1.75x to 2.07x faster forward + backward
    (`benchmarks/README.md`, "Components").
    """

    def __init__(self, merge_heads, **kwargs):
        super().__init__(**kwargs)
        self.merge_heads = merge_heads

    def call(self, inputs, training=None):
        kernel = self.kernel
        if self.merge_heads:  # (B, T, N, H) @ (N, H, *O), O = (D,) unless `output_shape` says
            num_heads, head_dim, *units = kernel.shape
            inputs = ops.reshape(inputs, (*ops.shape(inputs)[:-2], num_heads * head_dim))
            kernel = ops.reshape(kernel, (num_heads * head_dim, math.prod(units)))
            outputs = ops.matmul(inputs, kernel)
            if len(units) != 1:  # (B, T, prod(O)) -> (B, T, *O)
                outputs = ops.reshape(outputs, (*ops.shape(inputs)[:-1], *units))
        else:  # (B, T, D) @ (D, N, H)
            units, num_heads, head_dim = kernel.shape
            outputs = ops.matmul(inputs, ops.reshape(kernel, (units, num_heads * head_dim)))
            # The shape comes from `inputs`: read from `outputs` (a tf.tensordot), tf2onnx
            # folds the two reshapes into one with the wrong target shape.
            outputs = ops.reshape(outputs, (*ops.shape(inputs)[:-1], num_heads, head_dim))
        if self.bias is not None:
            outputs = ops.add(outputs, self.bias)
        return outputs

    def get_config(self):
        return {**super().get_config(), "merge_heads": self.merge_heads}
