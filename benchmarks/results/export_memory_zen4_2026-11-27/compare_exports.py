"""Whether two ONNX exports translate alike: `python compare_exports.py BEFORE AFTER [N]`.

Compares the translate.onnx files byte for byte, then OnnxTranslator's outputs of
both on N (default 300) Ding phrases (benchmarks/serving.py's `ding_sentences`,
seed 1), greedy and at the export's beam size, one thread.
"""

import hashlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))


def main(before, after, count=300):
    from serving import ding_sentences

    from keras_transformer.onnx_translator import OnnxTranslator

    for name in ("translate.onnx", "translate_int8.onnx", "encoder.onnx", "decoder_step.onnx"):
        digests = []
        for root in (before, after):
            with open(os.path.join(root, name), "rb") as f:
                digests.append(hashlib.sha256(f.read()).hexdigest()[:16])
        print(f"{name}: {'identical bytes' if digests[0] == digests[1] else 'bytes differ'} "
              f"{digests}")
    sentences = ding_sentences("/usr/share/trans/de-en", count, seed=1)
    translators = [OnnxTranslator(root, intra_op_num_threads=1) for root in (before, after)]
    for beam_size in sorted({1, translators[0].search.beam_size}):
        outputs = [t.translate(sentences, beam_size=beam_size) for t in translators]
        same = sum(a == b for a, b in zip(*outputs, strict=True))
        print(f"beam {beam_size}: {same}/{len(sentences)} outputs identical")
        for a, b, s in zip(*outputs, sentences, strict=True):
            if a != b:
                print(f"  {s!r}: {a!r} != {b!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))
