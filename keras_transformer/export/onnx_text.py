"""Text in, text out around an ONNX search graph: SentencePiece and the SavedModel's rules as nodes.

`text_to_text(search, vocab_model, ...)` wraps a search graph

    source_ids  int32 (B, S)  ids ending with EOS, 0-padded  ->  target_ids  int32 (B, T)

(`onnx_graphs.search_function`, converted by tf2onnx) into one graph

    sentences     string (B,)   UTF-8 text
    [beam_size, alpha, max_extra_length: the search graph's other inputs, with defaults]
    [target_prefix string (B,), banned string (B, N), seeds int32 (B,): where the search
     graph takes `prefix_ids`, `banned_ids` and `sentence_seeds` (`_steering`)]
 -> translations  string (B,)

with the input and output rules of the SavedModel (`export/saved_model.py`):

- tokenize with onnxruntime-extensions' `SentencepieceTokenizer` (the
  `vocab.model` bytes are an attribute of the node; same ids as TF Text);
- keep at most `max_length - 1` pieces, append EOS, pad with `pad_id` to
  the longest row, at least one column (an empty batch is `(0, 1)`);
- detokenize each output row up to its first EOS with
  `SentencepieceDecoder` (one row per call, so in a `Loop` over the batch);
- a blank sentence (empty or only characters for which Python's
  `str.isspace()` is True, matched with the SavedModel's RE2 pattern)
  translates to "".

Every node is a standard ONNX op or an `ai.onnx.contrib` op of
onnxruntime-extensions; only `onnx` is imported here.
"""

import numpy as np
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from keras_transformer.serving import frontend

CONTRIB = "ai.onnx.contrib"
# The SavedModel's pattern, anchored: RE2 is the engine of TensorFlow's regex ops and of this op.
BLANK_PATTERN = r"\A" + frontend.BLANK_CHARACTERS + r"*\z"
INT64_MAX = np.iinfo(np.int64).max


class _Nodes:
    """Collects nodes and constants under one name prefix (no clash with tf2onnx's names)."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.nodes = []
        self.initializers = []
        self._count = 0

    def name(self, hint):
        self._count += 1
        return f"{self.prefix}/{hint}_{self._count}"

    def const(self, value, dtype, hint="const"):
        name = self.name(hint)
        if dtype == TensorProto.STRING:
            values = [v.encode() if isinstance(v, str) else v for v in np.ravel(value)]
            tensor = helper.make_tensor(name, dtype, np.shape(value), values)
        else:
            array = np.asarray(value, helper.tensor_dtype_to_np_dtype(dtype))
            tensor = numpy_helper.from_array(array)
            tensor.name = name
        self.initializers.append(tensor)
        return name

    def op(self, op_type, inputs, outputs=1, domain="", **attrs):
        """Adds a node; returns its output name, or a list of names for `outputs > 1`."""
        names = outputs if isinstance(outputs, list) else [
            self.name(op_type.lower()) for _ in range(outputs)
        ]  # fmt: skip
        name = self.name(op_type)
        self.nodes.append(
            helper.make_node(op_type, inputs, names, name=name, domain=domain, **attrs)
        )
        return names[0] if len(names) == 1 else names


def _source_ids(n, sentences, vocab_model, max_length, eos_id, pad_id, output):
    """`(B,)` strings -> `(B, S)` int32 ids: pieces (at most max_length - 1), EOS, padding."""
    i64, i32 = TensorProto.INT64, TensorProto.INT32
    pieces, row_splits, _ = n.op(
        "SentencepieceTokenizer",
        [sentences,
         n.const([0], i64, "nbest_size"), n.const([0.0], TensorProto.FLOAT, "sampling_alpha"),
         n.const([False], TensorProto.BOOL, "add_bos"),
         n.const([False], TensorProto.BOOL, "add_eos"),
         n.const([False], TensorProto.BOOL, "reverse")],
        outputs=3, domain=CONTRIB, model=vocab_model,
    )  # fmt: skip  # pieces: int32 (N,) all rows one after the other; row_splits: int64 (B + 1,)
    starts = n.op("Slice", [row_splits, n.const([0], i64), n.const([-1], i64)])  # (B,)
    ends = n.op("Slice", [row_splits, n.const([1], i64), n.const([INT64_MAX], i64)])  # (B,)
    kept = frontend.max_source_pieces(max_length)
    lengths = n.op("Min", [n.op("Sub", [ends, starts]), n.const(kept, i64)])  # (B,)
    # S = longest kept row + 1 for EOS; at least 1, also for an empty batch.
    longest = n.op("ReduceMax", [n.op("Concat", [lengths, n.const([0], i64)], axis=0)], keepdims=0)
    width = n.op("Add", [longest, n.const(1, i64)])
    positions = n.op("Range", [n.const(0, i64), width, n.const(1, i64)])  # (S,)
    rows = n.op("Unsqueeze", [starts, n.const([1], i64)])  # (B, 1)
    index = n.op("Add", [rows, n.op("Unsqueeze", [positions, n.const([0], i64)])])  # (B, S)
    # Positions past a row's end read one extra element (PAD) appended to the pieces.
    padded_pieces = n.op("Concat", [pieces, n.const([pad_id], i32)], axis=0)  # (N + 1,)
    index = n.op("Min", [index, n.op("Size", [pieces])])
    gathered = n.op("Gather", [padded_pieces, index], axis=0)  # (B, S)
    lengths = n.op("Unsqueeze", [lengths, n.const([1], i64)])  # (B, 1)
    tail = n.op("Where", [n.op("Equal", [positions, lengths]), n.const(eos_id, i32),
                          n.const(pad_id, i32)])  # fmt: skip
    return n.op("Where", [n.op("Less", [positions, lengths]), gathered, tail], outputs=[output])


# The search graph's steering inputs made here -> translate.onnx's inputs they come from.
STEERING = {"prefix_ids": "target_prefix", "banned_ids": "banned", "sentence_seeds": "seeds"}
_UNLIMITED = 1 << 40  # pieces kept of a prefix or a banned word: all (as `Translator`)


def _per_sentence(n, values, filler, batch):
    """`values (R,)` cut or filled with `filler` (a 1-element constant) to `batch (1,)`
    rows: an input left out (its empty default) gives `filler` for every sentence."""
    i64 = TensorProto.INT64
    zeros = n.op("ConstantOfShape", [batch], value=helper.make_tensor("zero", i64, [1], [0]))
    fillers = n.op("Gather", [filler, zeros], axis=0)  # (B,)
    both = n.op("Concat", [values, fillers], axis=0)  # (R + B,)
    return n.op("Slice", [both, n.const([0], i64), batch])  # (B,)


def _phrases(n, strings, vocab_model, pad_id, output):
    """`(R,)` strings -> `(R, L)` int32 pieces, `pad_id` after each, L >= 1: as
    `saved_model.encode_phrases` (blank: no pieces; nothing cut)."""
    empty = n.const([""], TensorProto.STRING, "empty_phrase")
    strings = n.op("Where", [_is_blank(n, strings), empty, strings])
    # `_source_ids` with EOS = PAD: the pieces, then at least one PAD column.
    return _source_ids(n, strings, vocab_model, _UNLIMITED, pad_id, pad_id, output=output)


def _steering(n, vocab_model, pad_id):
    """translate.onnx's `target_prefix`, `banned` and `seeds` -> the search graph's
    `prefix_ids (B, P)`, `banned_ids (B, N, L)` and `sentence_seeds (B,)`."""
    i64 = TensorProto.INT64
    batch = n.op("Shape", ["sentences"])  # (1,) B
    prefixes = _per_sentence(n, "target_prefix", n.const([""], TensorProto.STRING), batch)
    _phrases(n, prefixes, vocab_model, pad_id, output="prefix_ids")
    words = n.op("Reshape", ["banned", n.const([-1], i64)])  # (B * N,)
    ids = _phrases(n, words, vocab_model, pad_id, output=n.name("banned_flat"))  # (B * N, L)
    count = n.op("Slice", [n.op("Shape", ["banned"]), n.const([1], i64), n.const([2], i64)])
    width = n.op("Slice", [n.op("Shape", [ids]), n.const([1], i64), n.const([2], i64)])
    shape = n.op("Concat", [batch, count, width], axis=0)  # (B, N, L)
    banned = n.op("Reshape", [ids, shape], allowzero=1)  # N (or B) may be 0
    # One more row of PAD (bans nothing), so that N >= 1: tf2onnx's reshapes in the
    # search read a 0 in a shape as "copy this dimension".
    one = n.const([1], i64)
    pad = n.op("ConstantOfShape", [n.op("Concat", [batch, one, width], axis=0)],
               value=helper.make_tensor("pad", TensorProto.INT32, [1], [pad_id]))  # fmt: skip
    n.op("Concat", [banned, pad], outputs=["banned_ids"], axis=1)  # (B, N + 1, L)
    n.op("Identity", [_per_sentence(n, "seeds", n.const([0], TensorProto.INT32), batch)],
         outputs=["sentence_seeds"])  # fmt: skip


def _steering_inputs():
    """translate.onnx's steering inputs and their defaults: empty, so that a caller
    may leave each out (it then steers nothing)."""
    string, i32 = TensorProto.STRING, TensorProto.INT32
    inputs = [
        helper.make_tensor_value_info("target_prefix", string, ["prefix_batch"]),
        helper.make_tensor_value_info("banned", string, ["banned_batch", "banned_count"]),
        helper.make_tensor_value_info("seeds", i32, ["seeds_batch"]),
    ]
    defaults = [
        helper.make_tensor("target_prefix", string, [0], []),
        helper.make_tensor("banned", string, [0, 0], []),
        helper.make_tensor("seeds", i32, [0], []),
    ]
    return inputs, defaults


def _detokenize(n, target_ids, vocab_model, eos_id):
    """`(B, T)` int32 output ids -> `(B,)` strings: each row up to its first EOS, detokenized."""
    i64 = TensorProto.INT64
    body = _Nodes(n.prefix + "/row")
    index, condition = body.name("index"), body.name("condition")
    row = body.op("Gather", [target_ids, index], axis=0)  # (T,)
    is_eos = body.op("Cast", [body.op("Equal", [row, body.const(eos_id, TensorProto.INT32)])],
                     to=TensorProto.INT32)  # fmt: skip
    # The first EOS, or T when there is none (the appended 1).
    stop = body.op("ArgMax", [body.op("Concat", [is_eos, body.const([1], TensorProto.INT32)],
                                      axis=0)], keepdims=1)  # fmt: skip  # (1,)
    pieces = body.op("Slice", [row, body.const([0], i64), stop])
    text = body.op("SentencepieceDecoder", [body.op("Cast", [pieces], to=i64)], domain=CONTRIB,
                   model=vocab_model)  # fmt: skip  # (1,)
    condition_out = body.op("Identity", [condition])
    graph = helper.make_graph(
        body.nodes, "detokenize_row",
        [helper.make_tensor_value_info(index, i64, []),
         helper.make_tensor_value_info(condition, TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(condition_out, TensorProto.BOOL, []),
         helper.make_tensor_value_info(text, TensorProto.STRING, [1])],
        body.initializers,
    )  # fmt: skip
    batch = n.op("Gather", [n.op("Shape", [target_ids]), n.const(0, i64)], axis=0)
    texts = n.op("Loop", [batch, ""], body=graph)  # (B, 1)
    return n.op("Reshape", [texts, n.const([-1], i64)])  # (B,)


def _is_blank(n, sentences):
    """`(B,)` bool: empty or whitespace-only, as `saved_model.is_blank`."""
    stripped = n.op(
        "StringRegexReplace",
        [sentences, n.const([BLANK_PATTERN], TensorProto.STRING, "blank_pattern"),
         n.const([""], TensorProto.STRING, "empty")],
        domain=CONTRIB,
    )  # fmt: skip
    length = n.op("StringLength", [stripped], domain=CONTRIB)
    return n.op("Equal", [length, n.const(0, TensorProto.INT64)])


def _graphs(graph):
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == AttributeProto.GRAPH:
                yield from _graphs(attribute.g)


def text_to_text(search, vocab_model, max_length, eos_id, pad_id=0, defaults=None):
    """Wraps a search graph into `sentences (B,) string -> translations (B,) string`.

    Args:
        search: `onnx.ModelProto` with input `source_ids` int32 (B, S),
            output `target_ids` int32 (B, T), and optionally more scalar
            inputs (beam size, alpha, ...), which stay inputs of the result.
        vocab_model: bytes of the SentencePiece `vocab.model`.
        max_length: the model's positional range; sources keep at most
            `max_length - 1` pieces before EOS.
        eos_id, pad_id: ids of EOS and padding.
        defaults: dict input name -> numpy value: a default for each of
            the search graph's other inputs (stored as an initializer of the
            same name, so callers may leave the input out).

    Returns:
        `onnx.ModelProto` with the search graph's opsets and `ai.onnx.contrib`.
    """
    defaults = dict(defaults or {})
    graph = search.graph
    steered = _check_search_graph(graph, defaults)
    n = _Nodes("text")
    blank = _is_blank(n, "sentences")
    head = n.nodes
    n.nodes = []
    _source_ids(n, "sentences", vocab_model, max_length, eos_id, pad_id, output="source_ids")
    if steered:
        _steering(n, vocab_model, pad_id)
    head += n.nodes
    n.nodes = []
    translations = _detokenize(n, "target_ids", vocab_model, eos_id)
    n.op("Where", [blank, n.const("", TensorProto.STRING, "empty_text"), translations],
         outputs=["translations"])  # fmt: skip
    inputs = [helper.make_tensor_value_info("sentences", TensorProto.STRING, ["batch"])]
    inputs += [i for i in graph.input if i.name != "source_ids" and i.name not in STEERING]
    default_tensors = [
        numpy_helper.from_array(np.asarray(value), name) for name, value in defaults.items()
    ]
    if steered:
        steering_inputs, steering_defaults = _steering_inputs()
        inputs += steering_inputs
        default_tensors += steering_defaults
    outputs = [helper.make_tensor_value_info("translations", TensorProto.STRING, ["batch"])]
    wrapped = helper.make_graph(
        head + list(graph.node) + n.nodes,
        "translate",
        inputs,
        outputs,
        list(graph.initializer) + n.initializers + default_tensors,
        value_info=list(graph.value_info),
    )
    return _model(wrapped, search)


def _check_search_graph(graph, defaults):
    """Whether the search graph takes the steering inputs; `ValueError` naming what is
    wrong with its inputs and outputs."""
    names = [i.name for i in graph.input]
    if "source_ids" not in names or [o.name for o in graph.output] != ["target_ids"]:
        raise ValueError(
            "search must map `source_ids` to `target_ids`. Received: inputs="
            f"{names}, outputs={[o.name for o in graph.output]}"
        )
    steered = [name for name in names if name in STEERING]
    if steered and len(steered) != len(STEERING):
        raise ValueError(f"search must take all of {sorted(STEERING)} or none. Received: {names}")
    missing = sorted(set(names) - {"source_ids"} - set(STEERING) - set(defaults))
    if missing:
        raise ValueError(f"defaults must give a value for every other input. Missing: {missing}")
    return bool(steered)


def _model(wrapped, search):
    """The `ModelProto` of the wrapped graph, with the opsets its nodes use."""
    # The domains the nodes use (tf2onnx also declares ai.onnx.ml, which none uses).
    used = {node.domain for g in _graphs(wrapped) for node in g.node} | {""}
    opsets = {o.domain: o.version for o in search.opset_import if o.domain in used}
    opsets[CONTRIB] = 1
    return helper.make_model(
        wrapped,
        opset_imports=[helper.make_opsetid(domain, version) for domain, version in opsets.items()],
        producer_name="keras_transformer",
        ir_version=search.ir_version,
    )
