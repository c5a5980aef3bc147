"""Greedy and beam search over a step function, with a key/value cache.

Search does not know the model. It drives a step function

    tokens_to_logits(token_ids (B,), cache) -> (logits (B, V), cache)

as flax's WMT example and OpenNMT-tf do. The cache is any nested structure
whose every tensor has the batch on axis 0; beam search tiles it with
`ops.repeat` after its first step and reorders it with `ops.take`, never
looking inside, except for the entries named in `shared` (one row per
sentence, such as the source's cross-attention keys and values), which it
never tiles or reorders.

Everything is `keras.ops` inside one `ops.while_loop`, so the same code
runs under TensorFlow (in a `tf.function` with dynamic batch and source
length), JAX (under `jax.jit`) and torch. Where the loop may change shapes
(`drops_finished()`: TensorFlow, and so the SavedModel and translate.onnx,
and torch) finished rows and stopped sentences leave the loop state, as in
CTranslate2 and fairseq; under JAX and XLA the state keeps its shapes and
finished rows are computed and ignored, with the same outputs. Output
tokens are written with `ops.where` on a one-hot position, never
`ops.slice_update`: that exports as XlaDynamicUpdateSlice, which TF Serving
on CPU cannot run.

Shapes: B batch, K beam size, T longest output (the buffer), V vocabulary.
Output sequences hold the generated tokens without the start token, the
end token included, and `pad_id` after it.

The package, by job: `loop` (the loop's state helpers and the length
penalty), `greedy` and `beam` (the two searches; positive lexical
constraints, by dynamic beam allocation, are rules of the beam's one loop:
`beam.Constraints`; `constrained` keeps their old entry point),
`translate` (a model's source ids to output ids: limits, suppressed
tokens, the steering of `sampling`, the compiled entry points and the
uncached reference).
"""

from keras_transformer.decoding import loop
from keras_transformer.decoding.beam import beam_search, constrained_beam_search
from keras_transformer.decoding.greedy import greedy_search
from keras_transformer.decoding.loop import MIN_LENGTH, drops_finished, length_penalty
from keras_transformer.decoding.translate import (
    compile_translate_ids,
    output_limits,
    suppress_tokens,
    translate_ids,
    uncached_greedy_search,
)
from keras_transformer.search import NEG_INF

__all__ = [
    "MIN_LENGTH",
    "NEG_INF",
    "beam_search",
    "compile_translate_ids",
    "constrained_beam_search",
    "drops_finished",
    "greedy_search",
    "loop",
    "length_penalty",
    "output_limits",
    "suppress_tokens",
    "translate_ids",
    "uncached_greedy_search",
]
