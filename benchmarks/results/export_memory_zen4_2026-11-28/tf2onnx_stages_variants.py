"""`../export_memory_zen4_2026-11-27/tf2onnx_stages.py` with two in-process variants:

    python tf2onnx_stages_variants.py WORK_DIR --consumers-only [--fewer] [--collect]

--fewer    five of tf2onnx's optimizers left out (the four `onnx_convert.UNUSED_OPTIMIZERS`
           and the global-pool one, which the shipped list keeps: it does act)
--collect  a full garbage collection after each optimizer and before `Graph.make_model`
"""

import collections
import gc
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "export_memory_zen4_2026-11-27"))
import tf2onnx_stages  # noqa: E402


def patch():
    import tf2onnx.optimizer as optimizer
    import tf2onnx.optimizer.optimizer_base as optimizer_base
    from tf2onnx.graph import Graph

    if "--fewer" in sys.argv:
        drop = {"remove_redundant_upsample", "const_dequantize_optimizer",
                "global_pool_optimizer", "q_dq_optimizer", "einsum_optimizer"}
        every = optimizer._get_optimizers
        optimizer._get_optimizers = lambda: collections.OrderedDict(
            (k, v) for k, v in every().items() if k not in drop)
    if "--collect" in sys.argv:
        optimize, make_model = optimizer_base.GraphOptimizerBase.optimize, Graph.make_model

        def collected_optimize(self, graph, iteration):
            out = optimize(self, graph, iteration)
            gc.collect()
            return out

        def collected_make_model(self, *args, **kwargs):
            gc.collect()
            return make_model(self, *args, **kwargs)

        optimizer_base.GraphOptimizerBase.optimize = collected_optimize
        Graph.make_model = collected_make_model


if __name__ == "__main__":
    patch()
    tf2onnx_stages.main(sys.argv[1], catch_errors="--no-catch-errors" not in sys.argv,
                        consumers_only="--consumers-only" in sys.argv)
