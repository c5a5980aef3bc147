"""What a run does after `fit`: the float32 model, checkpoint averaging chosen by
validation loss, the test decode, and the exports."""

import dataclasses
import logging
import time

from keras_transformer.averaging import average_by_validation
from keras_transformer.evaluation import make_translator, score_test
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
    search: object  # the `SearchConfig` of the test decode: the exports' default


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
    search = fitted_search(config, inputs.train_batches.tokenized)
    if not config.test or not data.splits["test"]:
        return model, Evaluated(averaging, {}, [], 0.0, search)
    pairs = data.pairs("test", limit=config.test_samples or None)
    translator = make_translator(model, inputs.tokenizer, search)
    start = time.time()
    source_ids = translator.encode([source for source, _ in pairs])
    output_ids = translator.translate_ids(source_ids)
    hypotheses = translator.decode(output_ids)
    seconds = time.time() - start
    metrics, samples = score_test(pairs, hypotheses, data.info["name"], config.ding_path)
    metrics["outputs_at_limit"] = outputs_at_limit(source_ids, output_ids, search, translator)
    return model, Evaluated(averaging, metrics, samples, seconds, search)


def fitted_search(config, train_split):
    """`config.search` with the output limit fitted on the training pairs'
    token lengths (`search.fit_output_limit`) where `--length-ratio` and
    `--max-extra-length` leave it open; logged."""
    import numpy as np

    from keras_transformer.search import fit_output_limit

    search = config.search
    if config.length_ratio is not None and config.max_extra_length is not None:
        return search
    source = np.diff(train_split.source_offsets)  # with EOS
    output = np.diff(train_split.target_offsets) + 1  # generated tokens: EOS too
    ratio, extra = fit_output_limit(source, output)
    search = search.replace(
        length_ratio=ratio if config.length_ratio is None else None,
        max_extra_length=extra if config.max_extra_length is None else None,
    )
    logger.info(
        "Output limit ceil(%g x source tokens) + %d (fitted on the %d training pairs: "
        "the tightest that holds 99.99%% of them; --length-ratio, --max-extra-length)",
        search.length_ratio, search.max_extra_length, len(source),
    )  # fmt: skip
    return search


def outputs_at_limit(source_ids, output_ids, search, translator):
    """Outputs that ended at their length limit (`search.output_limit`, at most the
    model's `max_length`) instead of at EOS: cut, or as long as allowed."""
    from keras_transformer.search import output_limit

    config = translator.config
    count = 0
    for source, output in zip(source_ids, output_ids, strict=True):
        if not source:
            continue
        limit = output_limit(len(source), search.length_ratio, search.max_extra_length)
        generated = [t for t in output if t != config.pad_id]
        count += config.eos_id not in generated and len(generated) >= min(limit, config.max_length)
    return count


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
