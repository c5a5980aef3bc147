"""int8 against float32 on the test fixture's export, on this machine's CPU.

    python int8_agreement.py EXPORT_DIR   # MODEL folder: onnx/1 and ctranslate2/1 inside

ONNX: translate_int8.onnx rebuilt from translate.onnx with weight codes of
8 bits (the old scheme) and of 7 (`onnx_int8.WEIGHT_MAX`); CTranslate2: int8
under oneDNN and MKL (CT2_USE_MKL=0/1, a child process each). Each: how many
of the sentences translate as float32 does, and chrF against float32's outputs.
"""

import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def agreement(outputs, expected):
    import sacrebleu

    same = sum(a == b for a, b in zip(outputs, expected, strict=True))
    return f"{same} of {len(expected)} as float32, chrF {sacrebleu.corpus_chrf(outputs, [expected]).score:.1f}"


def onnx_rows(export):
    from export_fixtures import held_out_sentences

    from keras_transformer import OnnxTranslator
    from keras_transformer.export import onnx_int8

    greedy, beam = held_out_sentences(200, seed=7), held_out_sentences(50, seed=11)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "1")
        shutil.copytree(os.path.join(export, "onnx", "1"), folder)
        float32 = OnnxTranslator.load(folder)
        reference = [float32.translate(greedy, beam_size=1), float32.translate(beam, beam_size=4)]
        for bits, limit in ((8, 127), (7, 63)):
            onnx_int8.WEIGHT_MAX = limit
            onnx_int8.quantize_translate(
                os.path.join(folder, "translate.onnx"), os.path.join(folder, "translate_int8.onnx")
            )
            int8 = OnnxTranslator.load(folder, precision="int8")
            print(f"ONNX int8, {bits}-bit weight codes: greedy "
                  f"{agreement(int8.translate(greedy, beam_size=1), reference[0])}; beam 4 "
                  f"{agreement(int8.translate(beam, beam_size=4), reference[1])}")


def ctranslate2_row(export):
    from export_fixtures import held_out_sentences

    from keras_transformer import CTranslate2Translator

    sentences = held_out_sentences(100, seed=17)
    folder = os.path.join(export, "ctranslate2", "1")
    outputs = [CTranslate2Translator.load(folder, compute_type=c).translate(sentences, beam_size=1)
               for c in ("float32", "int8")]
    print(f"CTranslate2 int8, CT2_USE_MKL={os.environ['CT2_USE_MKL']}: greedy "
          f"{agreement(outputs[1], outputs[0])}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ctranslate2"]:
        ctranslate2_row(sys.argv[2])
    else:
        onnx_rows(sys.argv[1])
        for mkl in ("0", "1"):
            subprocess.run([sys.executable, __file__, "--ctranslate2", sys.argv[1]], check=True,
                           env=dict(os.environ, CT2_USE_MKL=mkl))
