"""A results folder's quiet_{before,after}_threads{1,2}.txt (benchmarks/serving.py, 5
rounds, alone on the machine) as one table of sentences/s (median, min-max) and the
ratios of issue 52's goals:

    python benchmarks/summarize_quiet.py benchmarks/results/serving_nodes_zen4_2026-11-28
"""

import json
import os
import sys


def load(folder, side, threads):
    with open(os.path.join(folder, f"quiet_{side}_threads{threads}.txt"), encoding="utf-8") as f:
        return json.loads([line for line in f if line.startswith("{")][-1])["results"]


def rate(cell):
    low, high = cell["sentences_per_s_min_max"]
    return f"{cell['sentences_per_s']:.1f} ({low:.0f}-{high:.0f})"


print("| threads | search | batch | translate.onnx before | translate.onnx | SavedModel before "
      "| SavedModel | int8 ONNX | CT2 float32 | CT2 int8 | ONNX / CT2 | SavedModel / CT2 "
      "| int8 ONNX / CT2 int8 | ONNX after / before | int8 / float32 ONNX |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
folder = sys.argv[1]
for threads in (1, 2):
    before, after = load(folder, "before", threads), load(folder, "after", threads)
    for key, a in after.items():
        b = before[key]
        search, batch = key.split("|")
        s = {name: cell["sentences_per_s"] for name, cell in a.items()}
        print(f"| {threads} | {search} | {batch} | {rate(b['onnx'])} | {rate(a['onnx'])} | "
              f"{rate(b['saved_model'])} | {rate(a['saved_model'])} | {rate(a['onnx_int8'])} | "
              f"{rate(a['ctranslate2'])} | {rate(a['ctranslate2_int8'])} | "
              f"{s['onnx'] / s['ctranslate2']:.2f}x | {s['saved_model'] / s['ctranslate2']:.2f}x | "
              f"{s['onnx_int8'] / s['ctranslate2_int8']:.2f}x | "
              f"{s['onnx'] / b['onnx']['sentences_per_s']:.2f}x | "
              f"{s['onnx_int8'] / s['onnx']:.2f}x |")  # fmt: skip
