"""Beam size and length penalty on finished 30k-pair trials (validation chrF), no retraining."""
import json, sys, time
from keras_transformer import workdir
from keras_transformer.data import load_translation_data
from keras_transformer.evaluation import make_translator, score
work = sys.argv[1]
model, tokenizer, run_info = workdir.load(work, finished=True)
pairs = load_translation_data(data_dir="/tmp/recipe_study/pairs30k/data", direction="de-en").pairs("validation")
src, ref = [s for s, _ in pairs], [t for _, t in pairs]
own = workdir.search_of(run_info)
for beam, alpha in tuple((4, a) for a in map(float, sys.argv[2:])) or ((4, 1.5), (4, 0.6), (4, 1.0), (8, 1.5), (2, 1.5)):
    t = time.time()
    hyp = make_translator(model, tokenizer, own.replace(beam_size=beam, alpha=alpha))(src)
    s = score(hyp, ref)
    print(json.dumps({"work": work.split("/")[-1], "beam": beam, "alpha": alpha, "chrf": round(s["chrf"], 2), "bleu": round(s["bleu"], 2), "seconds": round(time.time() - t, 1)}), flush=True)
