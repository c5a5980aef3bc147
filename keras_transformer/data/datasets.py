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
    # Ahead only where a device runs the step: on a CPU the assembling thread takes
    # cores from the step itself (benchmarks/host_overhead.py: 5.7 ms a step against
    # 5.0 inline on 2 cores), as Keras's own look-ahead is off on CPU.
    from keras_transformer.distribution import process_share

    return PyDataset(batches, ahead=2 if _on_accelerator() else 0, process=process_share())


def _on_accelerator():
    """Whether JAX or torch runs on a GPU (or another accelerator) here."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return jax.default_backend() != "cpu"
    if keras.backend.backend() == "torch":
        import torch

        return torch.cuda.is_available()
    return False


def _py_dataset_base():
    import keras

    return keras.utils.PyDataset


class PyDataset(_py_dataset_base()):
    """`keras.utils.PyDataset` of `Batches`: training endless (batch i is the
    i-th of the stream), evaluation one pass.

    Training batches are assembled ahead, `ahead` of them, in one thread of
    its own (`AheadOfStep`; `make_dataset` does so on a GPU): Keras runs a
    `PyDataset` with one worker on its main thread, between steps, where each
    batch's assembly (1.3 ms of numpy and Python at the `small` preset's batch
    on a Zen 5 core) would add to every step while the device waits. Batch
    i depends on i alone (`Batches.batch`), so the stream is the one an
    inline read gives (tests/test_data.py). Keras's own workers are not
    used: with more than one its enqueuer drops and refetches indices
    between epochs, which would break the one stream of batches.

    `process=(index, count)`: where several JAX processes train one model,
    each gives Keras its own contiguous slice of every batch's rows (the
    batch is planned and assembled alike in all of them, from the same
    seed), which `keras.distribution.DataParallel` puts together into the
    global batch.
    """

    def __init__(self, batches, ahead=2, process=(0, 1)):
        super().__init__(workers=1, use_multiprocessing=False)
        self.process = process
        self.batches = batches
        self.tokenized = batches.tokenized
        self._evaluation = None if batches.training else batches.evaluation()
        self._ahead = AheadOfStep(batches.batch, ahead) if batches.training and ahead else None

    @property
    def num_batches(self):
        return None if self._evaluation is None else len(self._evaluation)

    def __len__(self):
        if self._evaluation is None:
            raise TypeError("A training PyDataset is endless: it has no length.")
        return len(self._evaluation)

    def __getitem__(self, index):
        if self._evaluation is not None:
            return self._share(self._evaluation[index])
        if self._ahead is not None:
            return self._share(self._ahead.get(index))
        return self._share(self.batches.batch(index))

    def _share(self, batch):
        """This process's rows of `batch` (all of them in a one-process run)."""
        index, count = self.process
        if count == 1:
            return batch
        features, labels = batch
        rows = len(labels)
        if rows % count:
            raise ValueError(
                f"A batch of {rows} rows does not divide among {count} processes; "
                "use packed batches (the default) or a device count that divides it."
            )
        share = slice(index * rows // count, (index + 1) * rows // count)
        return {name: value[share] for name, value in features.items()}, labels[share]

    @property
    def input_wait_seconds(self):
        """Seconds the training loop waited for batches assembled ahead (None: inline)."""
        return None if self._ahead is None else self._ahead.waited_seconds

    def evaluation(self):
        """One evaluation pass as a list of batches (the whole batches, in every process)."""
        return list(self._evaluation)


class AheadOfStep:
    """`make(i)` for i = 0, 1, ... computed `depth` indices ahead in one thread.

    Every call of `make` runs in that one thread (in index order when read in
    order), so `make` need not be thread-safe; `get(i)` waits only when the
    thread has not finished `i`. `waited_seconds` sums those waits: the time
    the training loop spent waiting for input.
    """

    def __init__(self, make, depth=2):
        if depth < 1:
            raise ValueError(f"depth must be >= 1. Received: depth={depth}")
        import concurrent.futures

        self.make = make
        self.depth = depth
        self.waited_seconds = 0.0
        self._thread = concurrent.futures.ThreadPoolExecutor(1, "batches_ahead")
        self._futures = {}

    def get(self, index):
        import time

        for i in range(index, index + self.depth + 1):
            if i not in self._futures:
                self._futures[i] = self._thread.submit(self.make, i)
        for stale in [i for i in self._futures if i < index]:  # an index skipped
            self._futures.pop(stale).cancel()
        future = self._futures.pop(index)
        start = time.perf_counter()
        batch = future.result()
        self.waited_seconds += time.perf_counter() - start
        return batch


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


__all__ = ["AheadOfStep", "Batches", "PyDataset", "make_dataset", "to_tf_dataset"]
