"""A tiny trained work directory and its exports, built once per test session.

Shared by test_export_saved_model.py, test_export_onnx.py,
test_onnx_translate.py and test_serving_bad_input.py: a SentencePiece model
on synthetic text, a "tiny" Transformer fitted for a few seconds on a copy task (so greedy and
beam outputs differ from sentence to sentence and end with EOS), and one
`export_all` of it. Results are cached in this module, so every test file
shares one export. `shipped` is a second export of the same weights with the
`cpu` preset's search and a tight output limit recorded in run.json
(test_output_limit.py, test_shipped_search.py).
"""

import dataclasses
import json
import os
import random

import numpy as np

WORDS = (
    "haus katze hund baum auto wasser feuer licht nacht tag garten buch stadt fluss berg see "
    "brot milch kind frau mann schule strasse fenster tisch stuhl"
).split()
VOCAB_SIZE = 400  # 4 special + 256 byte pieces + the letters + merges to whole words
# The fixture seeds itself before it builds and trains: module-scoped fixtures are set
# up before conftest's per-test seed, so without it the weights (and the floors tests
# measured on them) would depend on which tests ran first.
SEED = 1234
_CACHE = {}

# Input every translation path must take: blank, over-long, non-ASCII, emoji, CJK, control
# characters (NUL is removed on every path, the others by SentencePiece's normalizer).
LONG = " ".join(["haus katze"] * 5000)  # 10,000 words
ODD = [
    "",
    "   ",
    " \t\u3000",
    LONG,
    "Müller straße ß é",
    "Das 🏠 ist 小さい.",
    "日本語 テキスト 😀",
    "\x00\x01\x02 haus katze",
    "haus\x00 katze \x7f\x9f baum",
]


def synthetic_sentences(count, seed, min_words=1, max_words=8):
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words)))
        for _ in range(count)
    ]


def _train_vocab(path):
    """The vocabulary `train.py` trains (`train_vocabulary`: BPE, nmt_nfkc, byte fallback),
    small: emoji and CJK become byte pieces, never <unk>."""
    from keras_transformer.data.vocabulary import train_vocabulary

    sentences = synthetic_sentences(3000, seed=0)
    train_vocabulary(
        list(zip(sentences, sentences, strict=True)), path, VOCAB_SIZE, byte_fallback=True
    )


def _fit_copy_task(model, processor, steps):
    """A few Adam steps on `target = source` (ids), enough for varied outputs."""
    import keras

    from keras_transformer.losses import LabelSmoothedCrossEntropy

    sentences = synthetic_sentences(512, seed=1, max_words=5)
    ids = [processor.encode(s)[:14] + [3] for s in sentences]
    length = max(map(len, ids))
    source = np.zeros((len(ids), length), "int32")
    for i, row in enumerate(ids):
        source[i, : len(row)] = row
    target_in = np.concatenate([np.full((len(ids), 1), 2, "int32"), source[:, :-1]], axis=1)
    target_in[target_in == 3] = 0  # the decoder input stops before EOS
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=LabelSmoothedCrossEntropy(0.0))
    model.fit(
        {"source_ids": source, "target_ids": target_in},
        source,
        batch_size=32,
        epochs=max(1, steps // (len(ids) // 32)),
        verbose=0,
    )


def make_work_dir(path, steps=96):
    """Writes vocab.model, model.keras and run.json of a tiny trained model to `path`:
    the same model whatever ran before (it seeds itself, `SEED`)."""
    import keras
    import sentencepiece as spm

    from keras_transformer import Transformer

    keras.utils.set_random_seed(SEED)  # Python's, numpy's and the backend's generators
    os.makedirs(path, exist_ok=True)
    _train_vocab(os.path.join(path, "vocab.model"))
    processor = spm.SentencePieceProcessor(model_file=os.path.join(path, "vocab.model"))
    model = Transformer.from_preset(
        "tiny", vocab_size=processor.get_piece_size(), dropout=0.0, max_length=32
    )
    _fit_copy_task(model, processor, steps)
    model.save(os.path.join(path, "model.keras"))
    run_info = {  # the keys `training.run()` writes that the exporters read
        "config": dataclasses.asdict(model.config),
        "data": {"direction": "de-en"},
        "metrics": {"beam_size": 4, "alpha": 0.6, "note": "copy task, test fixture"},
    }
    with open(os.path.join(path, "run.json"), "w") as f:
        json.dump(run_info, f, indent=2)
    return path


def trained(tmp_path_factory):
    """The tiny trained work dir (`make_work_dir`), built once per session."""
    if "trained" not in _CACHE:
        _CACHE["trained"] = make_work_dir(str(tmp_path_factory.mktemp("trained") / "work"))
    return _CACHE["trained"]


def exported(tmp_path_factory):
    """`(work_dir, paths)`: the tiny work dir and its exports, built once."""
    if "exported" not in _CACHE:
        from keras_transformer.export import export_after_training

        root = tmp_path_factory.mktemp("export")
        work_dir = trained(tmp_path_factory)
        with open(os.path.join(work_dir, "run.json")) as f:
            run_info = json.load(f)
        # What `python train.py` calls at the end of training.
        paths = export_after_training(work_dir, run_info, output_dir=str(root / "saved_models"))
        _CACHE["exported"] = (work_dir, paths)
    return _CACHE["exported"]


# The output limit the `shipped` run records beside the `cpu` preset's search: tighter
# than a copy-task output as long as its source, so many outputs are cut at it (a
# quarter of test_shipped_search.py's) and the rest end before it.
SHIPPED_LIMIT = dict(length_ratio=0.5, max_extra_length=1)


def shipped_search():
    """The `SearchConfig` that `shipped` records: the `cpu` preset's (the default
    training's test decode and exports: its stopping rule, patience and alpha) with
    `SHIPPED_LIMIT`."""
    from keras_transformer.training.options import TrainingConfig

    return TrainingConfig(preset="cpu").resolved().search.replace(**SHIPPED_LIMIT)


def _without_steered_graph(export_translate):
    """`onnx_graphs.export_translate` that writes no translate_steered.onnx (config.json's
    `translate.steering` is then None, as `OnnxTranslator` reads an export without it)."""

    def export(*args, steering=False, **kwargs):
        return None if steering else export_translate(*args, steering=steering, **kwargs)

    return export


def shipped(tmp_path_factory):
    """`(work_dir, paths)`: a copy of the tiny trained run whose run.json records
    `shipped_search()`, as `train.py --preset cpu` records its own, exported to the
    SavedModel, ONNX and CTranslate2 once per session (test_output_limit.py and
    test_shipped_search.py share it).

    The ONNX export has translate.onnx, translate_int8.onnx and the step graphs but no
    translate_steered.onnx: neither test file reads it (test_steering.py checks
    `exported`'s), and its conversion was 232 of the ONNX export's 390 s (2-core CPU)."""
    if "shipped" not in _CACHE:
        import shutil

        import pytest

        from keras_transformer import workdir
        from keras_transformer.export import export_all, onnx_graphs

        work_dir = str(tmp_path_factory.mktemp("shipped") / "work")
        shutil.copytree(trained(tmp_path_factory), work_dir)
        path = os.path.join(work_dir, "run.json")
        with open(path) as f:
            run_info = json.load(f)
        run_info["metrics"].update(shipped_search().to_dict())
        with open(path, "w") as f:
            json.dump(run_info, f)
        root = str(tmp_path_factory.mktemp("shipped_exports"))
        search = workdir.read_search(work_dir)  # what export_after_training and the CLI pass
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(onnx_graphs, "export_translate",
                          _without_steered_graph(onnx_graphs.export_translate))  # fmt: skip
            paths = export_all(work_dir, output_dir=root, formats=("saved_model", "onnx",
                                                                   "ctranslate2"), search=search)  # fmt: skip
        with open(os.path.join(paths["onnx"], "config.json")) as f:
            assert json.load(f)["translate"]["steering"] is None  # the conversion was skipped
        _CACHE["shipped"] = (work_dir, paths)
    return _CACHE["shipped"]


def held_out_sentences(count, seed=7):
    """Held-out sentences: some longer than the training ones, some with unseen words."""
    sentences = synthetic_sentences(count, seed=seed, max_words=10)
    return [s if i % 10 else s + " zebra!" for i, s in enumerate(sentences)]


def loaded_work_dir(work_dir):
    """`(model, tokenizer, run_info)` of `work_dir`, loaded once."""
    key = ("loaded", work_dir)
    if key not in _CACHE:
        from keras_transformer.training import load_trained

        _CACHE[key] = load_trained(work_dir)
    return _CACHE[key]


def keras_translations(work_dir, sentences, beam_size, alpha=0.6, max_extra_length=50):
    """The Keras model's translations (the project's `Translator`), cached per setting."""
    key = ("translations", work_dir, beam_size, alpha, max_extra_length, tuple(sentences))
    if key not in _CACHE:
        model, tokenizer, _ = loaded_work_dir(work_dir)
        from keras_transformer.translators.keras_translator import Translator

        translate = Translator(
            model, tokenizer, beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length
        ).translate
        _CACHE[key] = list(translate(list(sentences)))
    return _CACHE[key]


def onnx_jobs(onnx_dir, jobs):
    """Runs `OnnxTranslator` jobs (see onnx_subprocess.py) in a process without TensorFlow.

    Returns dict job name -> `{"value": ...}` or `{"error": "Type: message"}`,
    plus `"modules"`: the blocked packages that got imported (none, if the
    ONNX path is free of them).
    """
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx_subprocess.py")
    completed = subprocess.run(
        [sys.executable, script, onnx_dir], input=json.dumps(jobs), capture_output=True,
        text=True, timeout=900, cwd="/",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = [x for x in completed.stdout.splitlines() if x.startswith("RESULTS")][-1]
    return json.loads(line[len("RESULTS") :])


def loaded_saved_model(path):
    """`tf.saved_model.load(path)`, loaded once per session."""
    key = ("saved_model", path)
    if key not in _CACHE:
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  registers SentencepieceOp, which the graph holds

        _CACHE[key] = tf.saved_model.load(path)
    return _CACHE[key]
