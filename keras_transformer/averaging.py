"""Checkpoint averaging: the mean of the last N epoch checkpoints as one model.

Vaswani et al. (2017, Section 6.1) average the last 5 (base) or 20 (big)
checkpoints; fairseq (`scripts/average_checkpoints.py`), OpenNMT-tf
(`average_checkpoints`) and tensor2tensor (`avg_checkpoints`) do the same.

    python -m keras_transformer.averaging --work-dir work --last 5
    keras-transformer-average --work-dir work --last 5 --output work/model.avg.keras

reads `<work_dir>/checkpoints/epoch_NNN.weights.h5` (one per epoch, written by
`keras.callbacks.ModelCheckpoint(save_weights_only=True)` during training) and
`<work_dir>/model.keras`, and writes the averaged model: by default over
`model.keras`, after keeping the unaveraged one as `model.last.keras` (once:
a second run does not overwrite it).
"""

import argparse
import collections
import logging
import os
import shutil
import tempfile
import time
import warnings

import numpy as np

from keras_transformer import workdir

logger = logging.getLogger(__name__)


def checkpoint_paths(work_dir, last=None):
    """The epoch checkpoints of a work directory, oldest first.

    Files are sorted by the epoch number in their name (`epoch_100` after
    `epoch_010`), not lexically.

    Args:
        work_dir: directory written by training; its checkpoints are in
            `<work_dir>/checkpoints/epoch_NNN.weights.h5`.
        last: positive int, return only the last `last` checkpoints; None: all.

    Returns:
        list of str: paths of the checkpoint files, in epoch order.

    Raises:
        FileNotFoundError: there is no checkpoint in `work_dir`.
        ValueError: `last` is not a positive integer, or there are fewer than
            `last` checkpoints.
    """
    if last is not None and (isinstance(last, bool) or not isinstance(last, int) or last <= 0):
        raise ValueError(f"last must be a positive integer or None. Received: last={last!r}")
    directory = workdir.WorkDir(work_dir).checkpoints
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"No checkpoint directory {directory!r}: training writes one "
            "`epoch_NNN.weights.h5` per epoch there."
        )
    names = sorted(os.listdir(directory))
    epochs = []
    for name in names:
        match = workdir.CHECKPOINT_NAME.match(name)
        if match:
            epochs.append((int(match.group(1)), name))
    if not epochs:
        found = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        raise FileNotFoundError(
            f"No `epoch_NNN.weights.h5` checkpoint in {directory!r}; "
            f"it holds {len(names)} other entries{': ' + found if names else ''}."
        )
    epochs.sort()
    if last is not None and last > len(epochs):
        raise ValueError(
            f"Asked for the last {last} checkpoints, but {directory!r} holds only "
            f"{len(epochs)}: {', '.join(name for _, name in epochs)}. Received: last={last}"
        )
    selected = epochs if last is None else epochs[-last:]
    return [os.path.join(directory, name) for _, name in selected]


def _check_layout(model, path):
    """Raises an error naming `path` when its weight arrays are not the model's.

    `model.load_weights` fails on missing or misshapen variables, but silently
    ignores extra ones (a checkpoint of a deeper model loads into a shallower
    one), so the count and shapes of the file's arrays are compared first.
    """
    import h5py

    if not os.path.isfile(path):
        raise FileNotFoundError(f"No weights file {path!r}")
    try:
        with h5py.File(path, "r") as f:
            shapes = []

            def add_shape(_, item):
                if isinstance(item, h5py.Dataset):
                    shapes.append(tuple(item.shape))

            # A checkpoint written during training also holds the optimizer's
            # state (`optimizer/vars`): not model weights, and not averaged.
            for name in f:
                if name != "optimizer":
                    item = f[name]
                    if isinstance(item, h5py.Dataset):
                        add_shape(name, item)
                    else:
                        item.visititems(add_shape)
    except OSError as error:
        raise ValueError(f"{path!r} is not a Keras weights file: {error}") from error
    expected = collections.Counter(tuple(weight.shape) for weight in model.weights)
    found = collections.Counter(shapes)
    if found != expected:
        missing = sorted((expected - found).items())
        unexpected = sorted((found - expected).items())
        raise ValueError(
            f"Weights file {path!r} does not match the model: it holds {found.total()} arrays, "
            f"the model {expected.total()}; shapes the file lacks (shape: count): "
            f"{dict(missing[:5])}, shapes the model lacks: {dict(unexpected[:5])}."
        )


def average_checkpoints(model, paths):
    """Sets `model`'s weights to the mean of the weights files `paths`.

    Each file is loaded into `model` in turn (`model.load_weights`) and added
    to one float64 running sum per weight; the mean is then cast back to each
    weight's dtype. Weights that are not floats (none in a `Transformer`) take
    the value of the last file instead of a mean. Memory: the model plus one
    float64 copy of its weights, whatever the number of files.

    Args:
        model: a built `keras.Model`, e.g. the `Transformer` of `model.keras`;
            its weights are overwritten.
        paths: list of `.weights.h5` files saved from a model of the same
            architecture (`model.save_weights`, `ModelCheckpoint`).

    Returns:
        `model`, holding the averaged weights.

    Raises:
        ValueError: `paths` is empty, or a file (named in the message) does not
            hold this model's weights. Every file's layout is checked before
            any is loaded.
        FileNotFoundError: a file does not exist.
    """
    import keras

    paths = [os.fspath(path) for path in paths]
    if not paths:
        raise ValueError(f"No weights files to average. Received: paths={paths!r}")
    if not model.built:
        raise ValueError(f"Build the model before averaging into it. Received: model={model!r}")
    for path in paths:
        _check_layout(model, path)

    weights = model.weights
    sums = [
        np.zeros(weight.shape, dtype="float64") if keras.backend.is_float_dtype(weight.dtype)
        else None  # not averaged: keeps the last file's value
        for weight in weights
    ]  # fmt: skip
    for path in paths:
        try:
            with warnings.catch_warnings():
                # The optimizer state in a training checkpoint is not averaged.
                warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
                model.load_weights(path)
        except Exception as error:  # Keras raises ValueError, h5py KeyError or OSError
            raise ValueError(f"Weights file {path!r} does not match the model: {error}") from error
        for total, weight in zip(sums, weights, strict=True):
            if total is not None:
                total += keras.ops.convert_to_numpy(weight.value)  # in place: one running sum
    model.set_weights(
        [
            (total / len(paths)).astype(weight.dtype)
            if total is not None
            else keras.ops.convert_to_numpy(weight.value)  # the last file's value
            for total, weight in zip(sums, weights, strict=True)
        ]
    )
    return model


def average_by_validation(model, work_dir, batches, pad_id, average_last, ema=False):
    """Averages the last k checkpoints into `model` for the k with the lowest validation loss.

    k runs over 1, 2, 3, 5, 8, 13, 21 up to `average_last` and the checkpoints
    there are (k = 1: the last weights, whose validation loss per real token
    `benchmarks/quality.py` compares).

    With `ema` the model holds the moving average of the weights (`--ema`):
    k = 1 is that average, and the last checkpoint's own weights
    (`"last_checkpoint"`) are a candidate too (a run too short for the
    average to forget its first weights keeps them).

    Args:
        batches: whole validation passes (`val_ds.evaluation()`).

    Returns:
        dict: `chosen` k, `val_loss` of every k tried, `seconds`.
    """
    from keras_transformer.evaluation import validation_loss

    start = time.time()
    try:
        paths = checkpoint_paths(work_dir)
    except (FileNotFoundError, ValueError):
        paths = []
    results = {1: validation_loss(model, batches, pad_id)}
    best_k, best_weights = 1, model.get_weights()
    if ema and paths:
        average_checkpoints(model, paths[-1:])
        results["last_checkpoint"] = validation_loss(model, batches, pad_id)
        if results["last_checkpoint"] < results[1]:
            best_k, best_weights = "last_checkpoint", model.get_weights()
    for k in (2, 3, 5, 8, 13, 21):
        if k > min(average_last, len(paths)):
            break
        average_checkpoints(model, paths[-k:])
        results[k] = validation_loss(model, batches, pad_id)
        if results[k] < results[best_k]:
            best_k, best_weights = k, model.get_weights()
    model.set_weights(best_weights)
    logger.info(
        "Checkpoint averaging: validation loss by number of last checkpoints averaged %s; "
        "keeping %s", {k: round(v, 4) for k, v in results.items()}, best_k,
    )  # fmt: skip
    return {
        "chosen": best_k,
        "val_loss": {str(k): v for k, v in results.items()},
        "seconds": time.time() - start,
    }


def _write_atomically(path, write):
    """Calls `write(tmp)` on a temporary `.keras` path in `path`'s directory, then
    `os.replace(tmp, path)`: `path` is always either the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(
        prefix=".tmp-", suffix=".keras", dir=os.path.dirname(os.path.abspath(path))
    )
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def average_work_dir(work_dir, last=5, output=None):
    """Averages the last `last` checkpoints of a work directory into its model.

    Args:
        work_dir: directory written by training (`model.keras`, `checkpoints/`).
        last: number of most recent epoch checkpoints to average.
        output: where to write the averaged model (a `.keras` path). None:
            over `<work_dir>/model.keras`, after copying the unaveraged model to
            `<work_dir>/model.last.keras` unless that file already exists.

    Returns:
        dict: `checkpoints` (the averaged files), `output` (the written model)
        and `unaveraged` (the kept `model.last.keras`, or None when `output`
        was given).
    """
    if output is not None and not str(output).endswith(".keras"):
        raise ValueError(f"output must be a `.keras` file. Received: output={output!r}")
    work = workdir.WorkDir(work_dir)
    model_path = work.model
    if not os.path.isfile(model_path):
        raise FileNotFoundError(
            f"No trained model at {model_path}; run `python train.py --work-dir {work_dir}`."
        )
    paths = checkpoint_paths(work_dir, last=last)  # before loading: fails fast
    model = workdir.load_model(work_dir)
    average_checkpoints(model, paths)
    unaveraged = None
    if output is None:
        output = model_path
        unaveraged = work.unaveraged_model
        if not os.path.exists(unaveraged):
            _write_atomically(unaveraged, lambda tmp: shutil.copyfile(model_path, tmp))
    _write_atomically(output, model.save)
    return {"checkpoints": paths, "output": os.fspath(output), "unaveraged": unaveraged}


def parse_args(argv=None):
    from keras_transformer.command_line import add_debug_flag, add_verbose_flag

    parser = argparse.ArgumentParser(
        prog="keras-transformer-average", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--work-dir", required=True, help="directory written by train.py")
    parser.add_argument(
        "--last", type=int, default=5, help="average the last N epoch checkpoints (default 5)"
    )
    parser.add_argument(
        "--output",
        default=None,
        help="where to write the averaged .keras model (default: over <work_dir>/model.keras, "
        "keeping the unaveraged one as <work_dir>/model.last.keras)",
    )
    add_debug_flag(parser)
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    if args.last <= 0:
        parser.error(f"--last must be a positive integer. Received: --last {args.last}")
    if args.output is not None and not args.output.endswith(".keras"):
        parser.error(f"--output must end with .keras. Received: --output {args.output}")
    return args


def main(argv=None):
    from keras_transformer.command_line import run_main

    args = parse_args(argv)
    run_main("keras-transformer-average", args.debug, lambda: _main(args))


def _main(args):
    from keras_transformer.command_line import configure_logging

    # Warnings only, before TensorFlow loads: the line printed below is the result.
    configure_logging(args.verbose, "%(levelname)s: %(message)s", level=logging.WARNING)
    result = average_work_dir(args.work_dir, last=args.last, output=args.output)
    names = [os.path.basename(path).removesuffix(".weights.h5") for path in result["checkpoints"]]
    kept = f" (unaveraged model: {result['unaveraged']})" if result["unaveraged"] else ""
    print(
        f"Averaged {len(names)} checkpoints ({', '.join(names)}) into {result['output']}{kept}",
        flush=True,
    )


if __name__ == "__main__":
    main()
