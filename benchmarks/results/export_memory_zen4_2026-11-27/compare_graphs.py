"""Whether two ONNX graphs hold the same nodes and constants up to names and order:
`python compare_graphs.py A.onnx B.onnx` prints, for each, the number of nodes per
op type over every (sub)graph and a digest of the sorted initializer/constant bytes."""

import collections
import hashlib
import sys

import onnx
from onnx import AttributeProto


def summary(path):
    model = onnx.load(path)
    ops = collections.Counter()
    tensors = []

    def unnamed(tensor):
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        copy.ClearField("name")
        return copy.SerializeToString()

    def visit(graph, depth):
        tensors.extend(unnamed(t) for t in graph.initializer)
        for node in graph.node:
            ops[(depth, node.op_type)] += 1
            for a in node.attribute:
                if a.type == AttributeProto.TENSOR:
                    tensors.append(unnamed(a.t))
                if a.type == AttributeProto.GRAPH:
                    visit(a.g, depth + 1)

    visit(model.graph, 0)
    digest = hashlib.sha256(b"".join(sorted(tensors))).hexdigest()[:16]
    return ops, digest, len(tensors)


if __name__ == "__main__":
    (a, da, na), (b, db, nb) = summary(sys.argv[1]), summary(sys.argv[2])
    print(f"nodes: {sum(a.values())} vs {sum(b.values())}; constants: {na} vs {nb}, "
          f"digest {da} vs {db}")
    print("op counts (depth, op) that differ:", {k: (a[k], b[k]) for k in a | b if a[k] != b[k]})
