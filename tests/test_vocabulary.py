"""The vocabulary's byte fallback: text outside it survives every tokenizer the project runs.

One 1,000-piece vocabulary is trained on ASCII-only German/English sentences;
the sentences below hold emoji, CJK, accented letters, umlauts, ß and digits,
none of which it has seen. With byte fallback those characters become UTF-8
byte pieces (`<0xF0>` ...), never `<unk>` (id 1, detokenized as " ⁇ "), and
the three implementations of the same model give the same ids and text:

- keras-hub's `SentencePieceTokenizer` (TF Text ops: the SavedModel,
  through `encode_sentences` / `decode_ids`);
- the `sentencepiece` package (training, `Translator`, `onnx_translator.py`);
- onnxruntime-extensions' `SentencepieceTokenizer` / `SentencepieceDecoder`
  custom ops, run in a subprocess that never imports TensorFlow: creating an
  onnxruntime session with those ops in a process that has imported
  TensorFlow 2.21 segfaults (a clash of their bundled protobuf libraries).

Detokenized text equals `unicodedata.normalize("NFKC", sentence)`, not the
sentence: SentencePiece normalizes with `nmt_nfkc` before it tokenizes (the
last sentence is there to show it: "½" becomes "1⁄2" and full-width letters
become ASCII).
"""

import importlib.util
import itertools
import json
import subprocess
import sys
import textwrap
import unicodedata

import pytest
import sentencepiece
import tensorflow as tf
from translation_fixtures import number_pairs

from keras_transformer.data import load_tokenizer, train_vocabulary
from keras_transformer.data.vocabulary import load_keras_hub_tokenizer
from keras_transformer.export.saved_model import decode_ids, encode_sentences

PAD_ID, UNK_ID, EOS_ID = 0, 1, 3

SENTENCES = [
    "Das 🏠 ist 小さい.",
    "Ça coûte 5 €, Straße, naïve",
    "Die Größe: Ärger über Öl, süß",
    "Zoë’s café: “déjà vu” 😀",
    "½ Ｔａｓｓｅ",
]
EXPECTED_TEXT = [unicodedata.normalize("NFKC", s) for s in SENTENCES]

_NOUNS = [
    ("Haus", "house"), ("Hund", "dog"), ("Katze", "cat"), ("Baum", "tree"), ("Garten", "garden"),
    ("Buch", "book"), ("Tisch", "table"), ("Stadt", "city"), ("Fenster", "window"), ("Auto", "car"),
    ("Zimmer", "room"), ("Wagen", "wagon"), ("Vogel", "bird"), ("Berg", "mountain"),
    ("Fluss", "river"), ("Himmel", "sky"), ("Schiff", "ship"), ("Brot", "bread"),
    ("Wasser", "water"), ("Licht", "light"), ("Pferd", "horse"), ("Strand", "beach"),
    ("Kind", "child"), ("Zug", "train"), ("Bild", "picture"), ("Dorf", "village"),
    ("Feld", "field"), ("Meer", "sea"), ("Wald", "forest"), ("Kleid", "dress"),
]  # fmt: skip
_ADJECTIVES = [
    ("klein", "small"), ("gross", "big"), ("alt", "old"), ("neu", "new"), ("rot", "red"),
    ("blau", "blue"), ("schnell", "fast"), ("leise", "quiet"), ("warm", "warm"), ("kalt", "cold"),
    ("dunkel", "dark"), ("hell", "bright"), ("teuer", "expensive"), ("billig", "cheap"),
    ("weit", "far"), ("sauber", "clean"), ("schmutzig", "dirty"), ("wichtig", "important"),
    ("schrecklich", "terrible"), ("wunderbar", "wonderful"),
]  # fmt: skip


def ascii_pairs():
    """600 `("Das Haus ist klein.", "The house is small.")` pairs: ASCII letters, space, '.'.

    Enough distinct words for 1,000 BPE pieces (256 of them bytes) with
    SentencePiece's hard vocabulary limit; with 20 nouns it stops at 795.
    """
    return [
        (f"Das {noun} ist {adjective}.", f"The {english_noun} is {english_adjective}.")
        for (noun, english_noun), (adjective, english_adjective) in itertools.product(
            _NOUNS, _ADJECTIVES
        )
    ]


def as_dataset(pairs):
    return list(pairs)


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory):
    text = "".join(s for pair in ascii_pairs() for s in pair)
    assert text.isascii() and not any(c.isdigit() for c in text)
    path = str(tmp_path_factory.mktemp("vocabulary") / "vocab.model")
    train_vocabulary(as_dataset(ascii_pairs()), path, vocab_size=1000, byte_fallback=True)
    return path


@pytest.fixture(scope="module")
def processor(vocab_path):
    return sentencepiece.SentencePieceProcessor(model_file=vocab_path)


# Runs in a fresh interpreter that imports onnxruntime and onnxruntime-extensions,
# never TensorFlow. Prints `RESULTS` + JSON {"ids": [[...]], "text": [...]}.
_ONNX_PROCESS = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import onnxruntime
    import onnxruntime_extensions
    from onnx import TensorProto, helper

    vocab_path, sentences = sys.argv[1], json.loads(sys.argv[2])
    with open(vocab_path, "rb") as f:
        model = f.read()

    def session(node, inputs, outputs):
        graph = helper.make_graph(
            [node], node.op_type,
            [helper.make_tensor_value_info(n, t, [None]) for n, t in inputs],
            [helper.make_tensor_value_info(n, t, [None]) for n, t in outputs],
        )
        proto = helper.make_model(graph, opset_imports=[
            helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)
        ])
        options = onnxruntime.SessionOptions()
        options.register_custom_ops_library(onnxruntime_extensions.get_library_path())
        return onnxruntime.InferenceSession(
            proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    scalars = [("nbest_size", TensorProto.INT64), ("alpha", TensorProto.FLOAT),
               ("add_bos", TensorProto.BOOL), ("add_eos", TensorProto.BOOL),
               ("reverse", TensorProto.BOOL)]
    outputs = [("tokens", TensorProto.INT32), ("instance_indices", TensorProto.INT64),
               ("token_indices", TensorProto.INT32)]
    tokenizer = session(
        helper.make_node("SentencepieceTokenizer", ["inputs"] + [n for n, _ in scalars],
                         [n for n, _ in outputs], domain="ai.onnx.contrib", model=model),
        [("inputs", TensorProto.STRING)] + scalars, outputs,
    )
    decoder = session(
        helper.make_node("SentencepieceDecoder", ["ids"], ["str"],
                         domain="ai.onnx.contrib", model=model),
        [("ids", TensorProto.INT64)], [("str", TensorProto.STRING)],
    )
    tokens, row_splits, _ = tokenizer.run(None, {
        "inputs": np.array(sentences, dtype=object),
        "nbest_size": np.array([0], np.int64), "alpha": np.array([0.0], np.float32),
        "add_bos": np.array([False]), "add_eos": np.array([False]),
        "reverse": np.array([False]),
    })
    ids = [tokens[a:b].tolist() for a, b in zip(row_splits[:-1], row_splits[1:])]
    text = [decoder.run(None, {"ids": np.array(row, np.int64)})[0][0] for row in ids]
    text = [t.decode() if isinstance(t, bytes) else str(t) for t in text]
    print("RESULTS" + json.dumps({"ids": ids, "text": text}))
    """
)


@pytest.fixture(scope="module")
def onnx_results(vocab_path):
    """Ids and detokenized text of `SENTENCES` from the onnxruntime-extensions ops."""
    if importlib.util.find_spec("onnxruntime_extensions") is None:
        pytest.skip("onnxruntime-extensions is not installed")
    completed = subprocess.run(
        [sys.executable, "-c", _ONNX_PROCESS, vocab_path, json.dumps(SENTENCES)],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = [x for x in completed.stdout.splitlines() if x.startswith("RESULTS")][-1]
    return json.loads(line[len("RESULTS") :])


def test_default_byte_fallback_follows_vocab_size(tmp_path):
    numbers = as_dataset(number_pairs(200))
    small = str(tmp_path / "small.model")
    train_vocabulary(numbers, small, vocab_size=64)  # byte_fallback=None: off below 1,000
    processor = sentencepiece.SentencePieceProcessor(model_file=small)
    assert not any(processor.is_byte(i) for i in range(processor.vocab_size()))
    large = str(tmp_path / "large.model")
    train_vocabulary(as_dataset(ascii_pairs()), large, vocab_size=1000)  # on from 1,000
    processor = sentencepiece.SentencePieceProcessor(model_file=large)
    assert sum(processor.is_byte(i) for i in range(processor.vocab_size())) == 256
    assert processor.encode("小") == [
        processor.piece_to_id(p) for p in ("▁", "<0xE5>", "<0xB0>", "<0x8F>")
    ]


def test_byte_fallback_needs_room_for_256_byte_pieces(tmp_path):
    path = tmp_path / "vocab.model"
    with pytest.raises(ValueError, match="vocab_size=64 is too small for byte_fallback=True"):
        train_vocabulary(as_dataset(number_pairs(200)), str(path), 64, byte_fallback=True)
    assert list(tmp_path.iterdir()) == []  # no half-written model left behind


def test_without_byte_fallback_the_same_sentences_give_unk(tmp_path):
    """The failure the byte pieces fix, so the tests below cannot pass vacuously."""
    path = str(tmp_path / "vocab.model")
    train_vocabulary(as_dataset(ascii_pairs()), path, vocab_size=500, byte_fallback=False)
    processor = sentencepiece.SentencePieceProcessor(model_file=path)
    for ids in processor.encode(SENTENCES):
        assert UNK_ID in ids
        assert "⁇" in processor.decode(ids)


def test_sentencepiece_round_trips_through_byte_pieces(processor):
    ids = processor.encode(SENTENCES)
    for sentence, row in zip(SENTENCES, ids, strict=True):
        assert UNK_ID not in row, sentence
        assert any(processor.is_byte(i) for i in row), sentence  # unseen characters in each
    decoded = processor.decode(ids)
    assert decoded == EXPECTED_TEXT
    assert not any("⁇" in text for text in decoded)


def test_keras_hub_round_trips_in_graph_and_eagerly(vocab_path, processor):
    # The tokenizer is made here, not in a module fixture: the autouse seed
    # fixture resets TensorFlow's eager context, which frees its resource.
    tokenizer = load_keras_hub_tokenizer(vocab_path)
    eager_ids = [list(row) for row in tokenizer(SENTENCES)]
    assert (
        eager_ids == processor.encode(SENTENCES) == load_tokenizer(vocab_path).tokenize(SENTENCES)
    )
    eager_text = [
        t.decode() if isinstance(t, bytes) else t for t in tokenizer.detokenize(eager_ids)
    ]
    assert eager_text == EXPECTED_TEXT

    @tf.function  # as in the SavedModel's signatures
    def round_trip(sentences):
        source_ids = encode_sentences(tokenizer, sentences, 64, EOS_ID, PAD_ID)  # (B, S)
        return source_ids, decode_ids(tokenizer, source_ids, EOS_ID)

    source_ids, text = round_trip(tf.constant(SENTENCES))
    for row, expected in zip(source_ids.numpy().tolist(), processor.encode(SENTENCES), strict=True):
        assert row[: len(expected) + 1] == expected + [EOS_ID]
        assert UNK_ID not in row
    text = [t.decode() for t in text.numpy()]
    assert text == EXPECTED_TEXT
    assert not any("⁇" in t for t in text)


def test_onnxruntime_extensions_round_trip_with_the_same_ids(onnx_results, processor):
    ids = processor.encode(SENTENCES)
    assert onnx_results["ids"] == ids
    assert not any(UNK_ID in row for row in onnx_results["ids"])
    assert onnx_results["text"] == EXPECTED_TEXT
    assert not any("⁇" in text for text in onnx_results["text"])


@pytest.mark.parametrize("count", [0, 1, 7, 8, 10_001])
def test_the_vocabulary_reads_the_first_lines_side_by_side(count):
    """The reader gives the first `count` lines side by side, in order, as UTF-8."""
    from keras_transformer.data.vocabulary import _lines

    pairs = number_pairs(5_000)
    reference = [line.encode() for pair in pairs for line in pair][:count]
    assert list(_lines(pairs, count)) == reference


def test_a_corpus_too_small_for_the_vocabulary_names_the_largest_size_that_fits(tmp_path):
    """Issue 40: 400 short pairs cannot make 1,000 pieces; SentencePiece's own limit
    comes back as one line naming --vocab-size, not its RuntimeError."""
    import re

    from translation_fixtures import number_pairs

    from keras_transformer.data.vocabulary import train_vocabulary

    pairs = number_pairs(400)
    with pytest.raises(ValueError, match=r"use --vocab-size \d+ or less") as error:
        train_vocabulary(pairs, str(tmp_path / "vocab.model"), 1000)
    largest = int(re.search(r"--vocab-size (\d+)", str(error.value)).group(1))
    assert 64 <= largest < 1000
    assert not list(tmp_path.iterdir())  # nothing half-written
    train_vocabulary(pairs, str(tmp_path / "vocab.model"), largest)  # the size it names fits
