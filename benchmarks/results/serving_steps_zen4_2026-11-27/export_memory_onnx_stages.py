"""Peak RSS after each stage of export_onnx (ru_maxrss is the process's peak so far)."""
import os, resource, sys, tempfile, time
def peak(stage, t0=[time.time()]):
    print(f"{stage}: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024:.0f} MiB, {time.time()-t0[0]:.0f} s", flush=True)
from keras_transformer import workdir
from keras_transformer.export import load_work_dir
import onnx
from keras_transformer.export import onnx_graphs as g
from keras_transformer.export.onnx_int8 import quantize_translate
work = sys.argv[1]
peak("imports")
model, tok, info = load_work_dir(work)
peak("model loaded")
out = tempfile.mkdtemp()
vocab = workdir.WorkDir(work).vocabulary
search = workdir.search_of(info).to_dict()
g.export_translate(model, vocab, os.path.join(out, "translate.onnx"), search)
peak("translate.onnx")
onnx.save(g._convert(g.encoder_function(model), 17), os.path.join(out, "encoder.onnx"))
peak("encoder.onnx")
onnx.save(g._convert(g.decoder_step_function(model), 17), os.path.join(out, "decoder_step.onnx"))
peak("decoder_step.onnx")
quantize_translate(os.path.join(out, "translate.onnx"), os.path.join(out, "translate_int8.onnx"))
peak("translate_int8.onnx")
