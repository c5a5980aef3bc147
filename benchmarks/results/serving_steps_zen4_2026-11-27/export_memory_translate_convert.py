import copy, resource, sys, time
import numpy as np
t0 = time.time()
def peak(stage):
    print(f"{stage}: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024:.0f} MiB, {time.time()-t0:.0f} s", flush=True)
from keras_transformer import workdir
from keras_transformer.export import load_work_dir
import onnx, tf2onnx
from keras_transformer.export import onnx_graphs as g
from keras_transformer.export.onnx_passes import simplify
model, tok, info = load_work_dir(sys.argv[1])
search = workdir.search_of(info).to_dict()
peak("loaded")
beam_sizes = (1, 4)
fn = g.search_function(model, beam_sizes, stopping=search["stopping"], patience=search["patience"], length_ratio=search["length_ratio"])
peak("search_function")
cf = fn.get_concrete_function() if hasattr(fn, "get_concrete_function") else fn
peak("traced")
mp, _ = tf2onnx.convert.from_function(fn, input_signature=fn.input_signature, opset=g.TRANSLATE_OPSET,
    custom_op_handlers={"Bitcast": (g._sign_bit_bitcast, []), "SelectV2": (g._select_as_where, [])})
peak("tf2onnx")
raw = copy.deepcopy(mp); peak("deepcopy")
simplify(mp); peak("simplify")
onnx.checker.check_model(mp, full_check=True); peak("check_model full")
defaults = {"beam_size": np.array(4, np.int32), "alpha": np.array(0.6, np.float32), "max_extra_length": np.array(50, np.int32)}
print(g._same_outputs(raw, mp, g._check_feeds(model.config, beam_sizes, defaults))); peak("same_outputs")
