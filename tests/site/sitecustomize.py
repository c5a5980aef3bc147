"""Loaded by every Python process a test starts with this folder on PYTHONPATH; it
changes nothing unless one of these environment variables is set:

    KT_TEST_RECORD_BATCHES=FILE  appends the pair indices of each training batch
                                 assembled (`data.Batches.assemble`) to FILE, one
                                 JSON list per line: which pairs training read
                                 (test_mixing.py).
    KT_TEST_MUTATION=NAME        plants the defect NAME of `MUTATIONS` in the
                                 package; tests/mutations.py runs NAME's test so
                                 and expects it to fail. Each process it is
                                 planted in appends "NAME PID" to
                                 KT_TEST_MUTATION_LOG, where that is set.

A patch is applied right after its module is first imported (an import hook), so
a process that never imports the module is unchanged, and a process that
re-executes itself (train.py, to set up its allocator) is patched again.
"""

import dataclasses
import importlib.abc
import json
import os
import sys


def after_import(module_name, patch):
    """Calls `patch(module)` right after `module_name` is imported, in this process."""

    class Hook(importlib.abc.MetaPathFinder):
        searching = False  # the package's own finder asks the others too: no loop

        def find_spec(self, fullname, path, target=None):
            if fullname != module_name or self.searching:
                return None
            self.searching = True
            try:
                spec = None
                for finder in sys.meta_path:
                    if finder is not self and hasattr(finder, "find_spec"):
                        spec = finder.find_spec(fullname, path, target)
                        if spec is not None:
                            break
            finally:
                self.searching = False
            if spec is None or not hasattr(spec.loader, "exec_module"):
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                patch(module)

            spec.loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, Hook())


def _record_batches(pipeline):
    """`Batches.assemble` also writes each training batch's pair indices to a file."""
    path = os.environ["KT_TEST_RECORD_BATCHES"]
    assemble = pipeline.Batches.assemble

    def recording(self, planned, split=None):
        if self.training:
            pairs = planned[1].pairs if self.pack else planned  # (width, PackedRows) or ids
            with open(path, "a") as f:
                f.write(json.dumps([int(i) for i in pairs]) + "\n")
        return assemble(self, planned, split)

    pipeline.Batches.assemble = recording


# ------------------------------------------------------------------ the mutations


def _mix_ignores_weights(inputs):
    """Training reads the mixed corpora as one, without their weights (run.json's
    shares, computed from the weights, are unchanged)."""
    batches = inputs.Batches

    def unweighted(split, *args, weights=None, **kwargs):
        return batches(split, *args, **kwargs)

    inputs.Batches = unweighted


def _ema_keeps_the_worse(finishing):
    """With --ema, the candidate with the higher validation loss is kept and named."""
    choose = finishing.average_by_validation

    def keep_the_worse(model, work_dir, batches, pad_id, average_last, ema=False):
        moving_average = model.get_weights()
        result = choose(model, work_dir, batches, pad_id, average_last, ema=ema)
        losses = result["val_loss"]
        if ema and "last_checkpoint" in losses:
            from keras_transformer.averaging import average_checkpoints, checkpoint_paths

            worse = max(("1", "last_checkpoint"), key=losses.get)
            if worse == "1":
                model.set_weights(moving_average)
                result["chosen"] = 1
            else:
                average_checkpoints(model, checkpoint_paths(work_dir)[-1:])
                result["chosen"] = worse
        return result

    finishing.average_by_validation = keep_the_worse


def _server_echoes(engines):
    """keras-transformer-serve answers each sentence with the sentence itself."""
    load = engines.load_engine

    def load_echo(version_dir, config):
        loaded = load(version_dir, config)
        return dataclasses.replace(loaded, translate=lambda sentences, settings: list(sentences))

    engines.load_engine = load_echo


# name: (module patched, patch, the test that must fail with it)
MUTATIONS = {
    "mix_ignores_weights": (
        "keras_transformer.training.inputs", _mix_ignores_weights,
        "tests/test_mixing.py::"
        "test_prepared_mixed_corpora_train_in_proportion_to_their_weights[True]",
    ),
    "ema_keeps_the_worse": (
        "keras_transformer.training.finishing", _ema_keeps_the_worse,
        "tests/test_own_data.py::"
        "test_with_ema_the_saved_model_is_the_moving_average_or_the_better_candidate",
    ),
    "server_echoes": (
        "keras_transformer.serving.engines", _server_echoes,
        "tests/test_start_to_finish.py::test_every_command_of_the_start_to_finish_page_runs",
    ),
}  # fmt: skip


def _plant(name):
    module_name, patch, _ = MUTATIONS[name]

    def planted(module):
        patch(module)
        log = os.environ.get("KT_TEST_MUTATION_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{name} {os.getpid()}\n")

    after_import(module_name, planted)


if os.environ.get("KT_TEST_RECORD_BATCHES"):
    after_import("keras_transformer.data.pipeline", _record_batches)
if os.environ.get("KT_TEST_MUTATION"):
    _plant(os.environ["KT_TEST_MUTATION"])
