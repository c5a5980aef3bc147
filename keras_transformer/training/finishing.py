"""What a run does after `fit`: the float32 model, checkpoint averaging chosen by
validation loss, the test decode, and the exports."""

import dataclasses
import logging
import time

from keras_transformer.averaging import average_by_validation
from keras_transformer.evaluation import make_translate_fn, score_test
from keras_transformer.hardware import importable
from keras_transformer.model import Transformer

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Evaluated:
    """The finished model's checkpoint averaging and test decode, for the run record."""

    averaging: dict | None  # `averaging.average_by_validation`'s; None where not run
    test_metrics: dict  # `evaluation.score_test`'s; {} without a test decode
    samples: list
    test_seconds: float


def finish(model, config, work, inputs, is_chief):
    """`(model, Evaluated)`: the trained model as a plain float32 `Transformer`,
    averaged over the last checkpoints where that lowers the validation loss
    (on the chief, with `--average-last` >= 1), and its test decode."""
    model = plain_float32(model)
    averaging = None
    # Early stopping on chrF or BLEU kept the best weights by that metric; averaging
    # chooses by validation loss, which would overrule the user's choice.
    by_decoding = config.early_stopping and config.early_stopping_metric != "loss"
    if by_decoding:
        logger.info("No checkpoint averaging: early stopping kept the best weights by chrF/BLEU")
    if config.average_last >= 1 and is_chief and not by_decoding:
        averaging = average_by_validation(
            model, work.path, inputs.val_ds.evaluation(), inputs.model_config.pad_id,
            config.average_last, ema=bool(config.ema),
        )  # fmt: skip
    data = inputs.data
    if not config.test or not data.splits["test"]:
        return model, Evaluated(averaging, {}, [], 0.0)
    pairs = data.pairs("test", limit=config.test_samples or None)
    translate = make_translate_fn(model, inputs.tokenizer, config.search)
    start = time.time()
    hypotheses = translate([source for source, _ in pairs])
    seconds = time.time() - start
    metrics, samples = score_test(pairs, hypotheses, data.info["name"], config.ding_path)
    return model, Evaluated(averaging, metrics, samples, seconds)


def plain_float32(model):
    """The trained model as a plain float32 `Transformer` (same config and weights),
    for evaluation, saving and export; `model` itself when it already is one.

    Where several JAX processes trained it, the copy is this process's own: the
    weights, replicated on every device, are read here, and the distribution is
    left (`keras.distribution.set_distribution(None)`), so that what follows
    (averaging, the test decode, saving) runs in each process alone instead
    of waiting for the others at every computation.
    """
    from keras_transformer.distribution import process_share

    processes = process_share()[1]
    if type(model) is Transformer and model.dtype_policy.name == "float32" and processes == 1:
        return model
    weights = model.get_weights()
    if processes > 1:
        import keras

        keras.distribution.set_distribution(None)
    plain = Transformer.from_config(dict(model.get_config(), dtype="float32"))
    plain.build()
    plain.set_weights(weights)
    return plain


def export(work, run_info, started, name=None):
    """SavedModel, ONNX and (where installed) CTranslate2 exports of the finished run
    (`export.export_after_training`); the export time goes into run.json.

    Args:
        started: `time.time()` when the run began (run.json's `wall_seconds`).
    """
    from keras_transformer.export import export_after_training

    if not (importable("tensorflow") and importable("tensorflow_text")):
        logger.warning(
            "No export: the SavedModel and ONNX exporters trace the model with TensorFlow "
            "and TensorFlow Text, which are not installed here. On a machine that has them: "
            "python -m keras_transformer.export --work-dir %s", work.path,
        )  # fmt: skip
        return
    export_start = time.time()
    export_after_training(work.path, run_info, name=name)
    run_info["timing"]["export_seconds"] = time.time() - export_start
    run_info["metrics"]["wall_seconds"] = time.time() - started
    work.write_run_record(run_info)
