"""The grid's JSON files as one table: 1 worker x 2 threads beside 2 workers x 1 thread."""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
rows = {}
for engine in ("onnx", "ctranslate2"):
    for precision in ("float32", "int8"):
        for workers in (1, 2):
            path = os.path.join(HERE, f"grid_{engine}_{precision}_w{workers}.json")
            if not os.path.exists(path):
                continue
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            for r in data["results"]:
                search = "greedy" if r["signature"] == "translate_greedy" else "beam 4"
                key = (engine, precision, search, r["clients"])
                rows.setdefault(key, {})[workers] = r
print("| engine | search | clients | 1 worker x 2 threads: sent/s | p50 | p99 | 2 workers x 1 "
      "thread: sent/s | p50 | p99 | errors | server RSS MiB (1 / 2 workers) | clients' cores |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
for (engine, precision, search, clients), by in rows.items():
    cells = []
    for w in (1, 2):
        r = by.get(w)
        if r is None:
            cells += ["", "", ""]
            continue
        q = r["latency_ms"]
        cells += [f"{r['requests_per_second']:.1f}", f"{q['p50']:.0f} ms", f"{q['p99']:.0f} ms"]
    errors = sum(r["errors"] for r in by.values())
    rss = " / ".join(f"{by[w]['rss_mib_after']:.0f}" for w in (1, 2) if w in by)
    share = max(r["cores_busy"]["clients"] for r in by.values())
    name = {"onnx": "ONNX", "ctranslate2": "CTranslate2"}[engine] + f" {precision}"
    print(f"| {name} | {search} | {clients} | " + " | ".join(cells) +
          f" | {errors} | {rss} | {share:.2f} |")
