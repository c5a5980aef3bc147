"""Our `MultiHeadAttention` from Keras's: its arguments and weights, copied."""

import keras


class FromKerasAttention:
    """`from_keras` and `copy_weights_from` for `MultiHeadAttention`, whose
    kernels have Keras's shapes."""

    @classmethod
    def from_keras(cls, layer, **kwargs):
        """A `MultiHeadAttention` with the arguments and weights of a built
        `keras.layers.MultiHeadAttention` (or a subclass, e.g. keras-hub's
        `CachedMultiHeadAttention`); `kwargs` override arguments
        (`use_fused_attention=True`, `name=...`).

        The result computes what `layer` computes on `(B, T, D)` inputs,
        masks included. Refused: gated attention (`use_gate`),
        `sliding_window`, attention over other axes than the sequence.
        """
        if not isinstance(layer, keras.layers.MultiHeadAttention):
            raise TypeError(
                "from_keras copies a keras.layers.MultiHeadAttention. "
                f"Received: {type(layer).__name__}"
            )
        if not layer.built:
            raise ValueError(
                f"Keras layer '{layer.name}' has no weights yet: call it once, or build it "
                "with layer.build(query_shape, value_shape)"
            )
        for argument, default in (("_use_gate", False), ("_sliding_window", None)):
            if getattr(layer, argument, default) != default:
                raise ValueError(
                    f"from_keras does not build {argument[1:]}. Received: "
                    f"{argument[1:]}={getattr(layer, argument)}"
                )
        if len(layer.query_dense.kernel.shape) != 3:
            raise ValueError(
                "from_keras copies attention over the sequence of (B, T, D) inputs. Received: "
                f"attention_axes={layer.attention_axes}, query kernel of shape "
                f"{tuple(layer.query_dense.kernel.shape)}"
            )
        arguments = dict(
            num_heads=layer.num_heads,
            key_dim=layer.key_dim,
            value_dim=layer.value_dim,
            dropout=layer.dropout,
            use_bias=layer.use_bias,
            output_shape=getattr(layer, "_output_shape", None) or None,
            kernel_initializer=keras.initializers.serialize(layer._kernel_initializer),
            bias_initializer=keras.initializers.serialize(layer._bias_initializer),
            kernel_regularizer=keras.regularizers.serialize(layer._kernel_regularizer),
            bias_regularizer=keras.regularizers.serialize(layer._bias_regularizer),
            kernel_constraint=keras.constraints.serialize(layer._kernel_constraint),
            bias_constraint=keras.constraints.serialize(layer._bias_constraint),
            seed=getattr(layer, "seed", None),
            dtype=layer.dtype_policy,
            name=layer.name,
        )
        ours = cls(**(arguments | kwargs))
        ours.build(
            (None, None, layer.query_dense.kernel.shape[0]),
            (None, None, layer.value_dense.kernel.shape[0]),
            (None, None, layer.key_dense.kernel.shape[0]),
        )
        ours.copy_weights_from(layer)
        return ours

    def copy_weights_from(self, layer):
        """Copies the four projections of a built `keras.layers.MultiHeadAttention`
        of the same shapes into this built layer."""
        pairs = (
            (self.query_dense, layer.query_dense),
            (self.key_dense, layer.key_dense),
            (self.value_dense, layer.value_dense),
            (self.output_dense, layer.output_dense),
        )
        for mine, theirs in pairs:
            weights = theirs.get_weights()
            expected = [tuple(w.shape) for w in mine.weights]
            if [tuple(w.shape) for w in weights] != expected:
                raise ValueError(
                    f"'{theirs.name}' of '{layer.name}' has weights of shapes "
                    f"{[tuple(w.shape) for w in weights]}; '{mine.name}' of '{self.name}' "
                    f"needs {expected}"
                )
            mine.set_weights(weights)
