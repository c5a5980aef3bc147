"""Peak RSS per export stage: python stages.py WORK_DIR OUT"""
import functools, sys, time
t0 = time.time()
def status():
    d = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            d[k] = int(v.split()[0]) // 1024
    return d
def reset():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
def wrap(module, name, label=None):
    fn = getattr(module, name)
    @functools.wraps(fn)
    def inner(*a, **k):
        before = status()["VmRSS"]; reset()
        out = fn(*a, **k)
        s = status()
        print(f"{time.time()-t0:6.0f}s {label or name:28s} start {before:5d} MiB  peak {s['VmHWM']:5d}  end {s['VmRSS']:5d}", flush=True)
        return out
    setattr(module, name, inner)
import tf2onnx, onnx
import keras_transformer.export as ex
from keras_transformer.export import onnx_graphs as g, saved_model as sm, ctranslate2 as c2
wrap(tf2onnx.convert, "from_function", "tf2onnx.from_function")
wrap(g, "simplify"); wrap(g, "fuse"); wrap(onnx.checker, "check_model"); wrap(g, "_same_outputs")
wrap(g, "quantize_translate"); wrap(g, "text_to_text"); wrap(g, "search_function")
wrap(sm, "export_saved_model"); wrap(c2, "export", "ctranslate2.export")
wrap(ex, "load_work_dir")
print("imports", status(), flush=True)
ex.export_all(sys.argv[1], output_dir=sys.argv[2], name="m")
print("end", status(), flush=True)
