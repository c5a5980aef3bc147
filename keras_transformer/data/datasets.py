"""The batches of `pipeline.Batches` as `model.fit` reads them, on each backend.

One pipeline, two thin wrappers over it: `PyDataset` (any backend; what
JAX and torch train from) and `to_tf_dataset` (TensorFlow: a
`tf.distribute` strategy splits a `tf.data.Dataset` over its replicas and
workers). Both give the same batches in the same order (tests/test_data.py).
"""

from keras_transformer.data.pipeline import Batches


def make_dataset(batches):
    """The dataset `model.fit` reads on this backend: `to_tf_dataset` under
    TensorFlow, `PyDataset` elsewhere. Evaluation datasets carry `num_batches`."""
    import keras

    if keras.backend.backend() == "tensorflow":
        return to_tf_dataset(batches)
    return PyDataset(batches)


def _py_dataset_base():
    import keras

    return keras.utils.PyDataset


class PyDataset(_py_dataset_base()):
    """`keras.utils.PyDataset` of `Batches`: training endless (batch i is the
    i-th of the stream), evaluation one pass.

    One worker, no thread of its own: under JAX and torch on a GPU the step
    runs asynchronously while Python assembles the next batch, and with more
    workers Keras's enqueuer drops and refetches indices between epochs,
    which would break the one stream of batches.
    """

    def __init__(self, batches):
        super().__init__(workers=1, use_multiprocessing=False)
        self.batches = batches
        self.tokenized = batches.tokenized
        self._evaluation = None if batches.training else batches.evaluation()

    @property
    def num_batches(self):
        return None if self._evaluation is None else len(self._evaluation)

    def __len__(self):
        if self._evaluation is None:
            raise TypeError("A training PyDataset is endless: it has no length.")
        return len(self._evaluation)

    def __getitem__(self, index):
        if self._evaluation is not None:
            return self._evaluation[index]
        return self.batches.batch(index)

    def evaluation(self):
        """One evaluation pass as a list of batches."""
        return list(self._evaluation)


def to_tf_dataset(batches):
    """A `tf.data.Dataset` of `Batches`: training from a generator of the
    stream, prefetched on a `tf.data` thread; evaluation one pass held in
    memory, repeated (pass `validation_steps=ds.num_batches`)."""
    import tensorflow as tf

    ids = tf.TensorSpec((None, None), tf.int32)
    signature = ({name: ids for name in batches.feature_names}, ids)
    if batches.training:
        ds = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=signature)
        ds = ds.prefetch(tf.data.AUTOTUNE)
        evaluation = None
    else:
        # In memory, not a generator: Keras discards the validation iterator
        # before every evaluation (`EpochIterator.reset`), and destroying one
        # whose prefetch thread sat in the Python generator stalled `fit` for
        # about 50 s in most epochs (benchmarks/README.md, "Settled questions").
        evaluation = batches.evaluation()
        ds = _from_batches(evaluation).repeat()
    options = tf.data.Options()
    if not batches.training:
        # No autotuning thread: destroying an iterator joins it, and Keras drops
        # the validation iterator before every evaluation. py-spy found `fit`
        # waiting there (`EpochIterator.reset` -> `~IteratorResource` -> the
        # thread pool's join) about 13 s per epoch, a sixth of a 5-minute run
        # (benchmarks/README.md, "Settled questions"). Batches held in
        # memory have nothing to tune.
        options.autotune.enabled = False
    # Multi-worker: training batches are dealt out to the workers; every worker
    # evaluates the whole validation split, so all run the same number of steps.
    policy = tf.data.experimental.AutoShardPolicy
    training = batches.training
    options.experimental_distribute.auto_shard_policy = policy.DATA if training else policy.OFF
    ds = ds.with_options(options)
    ds.tokenized = batches.tokenized
    if evaluation is not None:
        ds.num_batches = len(evaluation)
        ds.evaluation = lambda: list(evaluation)
    return ds


def _from_batches(batches):
    """A dataset of the given `(features, labels)` numpy batches, in order, held in memory."""
    import tensorflow as tf

    datasets = [tf.data.Dataset.from_tensors(batch) for batch in batches]
    while len(datasets) > 1:  # a balanced tree of concatenations, not a chain
        pairs = [a.concatenate(b) for a, b in zip(datasets[::2], datasets[1::2], strict=False)]
        datasets = pairs + datasets[len(pairs) * 2 :]
    return datasets[0]


__all__ = ["Batches", "PyDataset", "make_dataset", "to_tf_dataset"]
