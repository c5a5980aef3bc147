"""`keras-transformer-serve`: an export served over HTTP with TF Serving's REST contract.

    pip install "keras-transformer-nmt[serve,server]"
    keras-transformer-serve saved_models/transformer_de_en/onnx/1 --port 8501
    python export/serving/client_rest.py "Das Haus ist klein."

The SavedModel is what TF Serving serves; this server serves the ONNX
export (float32 or int8, `OnnxTranslator`) or the CTranslate2 one
(`CTranslate2Translator`) with the same REST API, so that
`export/serving/client_rest.py` and any TF Serving REST client work
against it unchanged (https://www.tensorflow.org/tfx/serving/api_rest):

    GET  /v1/models/NAME                 status (`model_version_status`)
    GET  /v1/models/NAME/metadata        the signatures (`serving_default`: the
                                         export's beam search; `translate_greedy`)
    POST /v1/models/NAME:predict         {"instances": [...]} -> {"predictions": [...]}
                                         {"inputs": {"sentences": [...]}} or
                                         {"inputs": [...]} -> {"outputs": [...]}
    GET  /                               a page to type a sentence into

Extra request fields, this server's own: `"beam_size"` (one the export
has), `"alpha"`, and with `--engine ctranslate2` `"num_hypotheses": N`
(<= the beam), which makes each prediction `{"translations": [N best],
"scores": [N scores]}` (CTranslate2's; translate.onnx returns the best
hypothesis only). Errors come as TF Serving's, `{"error": "..."}` with
status 400 (404 for another model name), one line naming the problem.

Requests are batched dynamically (`DynamicBatcher`): sentences that
arrive within `--max-wait-ms` of each other (or until `--max-batch`
sentences) are translated in one call and split back, as quickmt's
CTranslate2 server and TF Serving's own batching do; a batch that fails
is retried request by request, so one bad request never fails the others.
Limits on the body size, sentences per request and characters per
sentence, and a timeout per request, come from the command line. Neither
TensorFlow nor Keras is imported (the ONNX translator refuses a process
that has TensorFlow).
"""

import argparse
import asyncio
import contextlib
import json
import logging
import os
import time

logger = logging.getLogger(__name__)

GREEDY_SIGNATURE = "translate_greedy"
DEFAULT_SIGNATURE = "serving_default"


class BadRequest(ValueError):
    """A request this server refuses: answered 400 with TF Serving's error shape."""


class DynamicBatcher:
    """Gathers the sentences of concurrent requests into batches for `translate`.

    Args:
        translate: `(sentences, settings dict) -> translations`, run in a worker
            thread (the event loop keeps accepting requests meanwhile).
        max_batch: sentences at most in one call.
        max_wait_ms: how long the first request of a batch waits for others.
        workers: batches translated at the same time (threads).
    """

    def __init__(self, translate, max_batch=64, max_wait_ms=5.0, workers=1):
        self.translate = translate
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.workers = workers
        self.batches = 0  # translate calls made, for /metadata and the tests
        self._queue = None
        self._tasks = []

    async def start(self):
        self._queue = asyncio.Queue()
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.workers)]

    async def stop(self):
        """Finishes the batches in flight, then stops the workers."""
        await self._queue.join()
        for task in self._tasks:
            task.cancel()

    async def submit(self, sentences, settings):
        """The translations of `sentences` (one request's), batched with others'."""
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((sentences, settings, future))
        return await future

    async def _worker(self):
        loop = asyncio.get_running_loop()
        while True:
            first = await self._queue.get()
            group, waiting = [first], []
            count, deadline = len(first[0]), loop.time() + self.max_wait
            while count < self.max_batch:
                try:
                    item = await asyncio.wait_for(self._queue.get(), deadline - loop.time())
                except TimeoutError:
                    break
                if item[1] != first[1] or count + len(item[0]) > self.max_batch:
                    waiting.append(item)  # other settings, or too many: the next batch
                    break
                group.append(item)
                count += len(item[0])
            for item in reversed(waiting):  # back to the front of the line
                self._queue._queue.appendleft(item)  # noqa: SLF001 - asyncio.Queue has no putleft
            await self._run(loop, group)
            for _ in group:
                self._queue.task_done()

    async def _run(self, loop, group):
        """Translates a group of requests in one call; if it fails, each alone, so that
        only a request that fails by itself gets the error."""
        sentences = [s for request, _, _ in group for s in request]
        try:
            translations = await loop.run_in_executor(None, self.translate, sentences, group[0][1])
            self.batches += 1
        except Exception as error:  # noqa: BLE001 - answered to the requests, not raised
            if len(group) > 1:
                for item in group:
                    await self._run(loop, [item])
            elif not group[0][2].done():
                group[0][2].set_exception(error)
            return
        at = 0
        for request, _, future in group:
            if not future.done():  # a request that timed out is gone
                future.set_result(translations[at : at + len(request)])
            at += len(request)


def _sentences(body, max_sentences, max_characters):
    """`(sentences, columnar)` of a predict body, checked: TF Serving's row
    (`instances`) or columnar (`inputs`) format."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object with 'instances' or 'inputs'.")
    if ("instances" in body) == ("inputs" in body):
        raise BadRequest("The request must have exactly one of 'instances' or 'inputs'.")
    columnar = "inputs" in body
    values = body["inputs"] if columnar else body["instances"]
    if columnar and isinstance(values, dict):
        if set(values) != {"sentences"}:
            raise BadRequest(f"'inputs' has one input, 'sentences'; got {sorted(values)}.")
        values = values["sentences"]
    if isinstance(values, str) and columnar:
        values = [values]
    if not isinstance(values, list):
        raise BadRequest(f"Expected a list of strings; got {type(values).__name__}.")
    sentences = []
    for i, value in enumerate(values):
        if isinstance(value, dict) and set(value) == {"sentences"}:
            value = value["sentences"]  # a row of named inputs
        if not isinstance(value, str):
            raise BadRequest(f"Instance {i} is a {type(value).__name__}, not a string.")
        if len(value) > max_characters:
            raise BadRequest(
                f"Instance {i} has {len(value)} characters; this server takes at most "
                f"{max_characters} (--max-characters)."
            )
        sentences.append(value)
    if not sentences:
        raise BadRequest("No sentence to translate: the instances are empty.")
    if len(sentences) > max_sentences:
        raise BadRequest(
            f"{len(sentences)} sentences in one request; this server takes at most "
            f"{max_sentences} (--max-sentences)."
        )
    return sentences, columnar


def _settings(body, beam_sizes, default_beam, n_best=False):
    signature = body.get("signature_name", DEFAULT_SIGNATURE)
    if signature not in (DEFAULT_SIGNATURE, GREEDY_SIGNATURE):
        raise BadRequest(
            f"Unknown signature_name {signature!r}; this model has {DEFAULT_SIGNATURE!r} and "
            f"{GREEDY_SIGNATURE!r}."
        )
    beam = 1 if signature == GREEDY_SIGNATURE else body.get("beam_size", default_beam)
    if beam not in beam_sizes:
        raise BadRequest(f"beam_size must be one of {list(beam_sizes)}; got {beam!r}.")
    settings = {"beam_size": beam}
    if "alpha" in body:
        alpha = body["alpha"]
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha < 0:
            raise BadRequest(f"alpha must be a number >= 0; got {alpha!r}.")
        settings["alpha"] = float(alpha)
    if body.get("num_hypotheses") is not None:
        n = body["num_hypotheses"]
        if not n_best:
            raise BadRequest(
                "num_hypotheses needs the CTranslate2 engine (--engine ctranslate2): "
                "translate.onnx returns the best hypothesis only."
            )
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= beam:
            raise BadRequest(f"num_hypotheses must be an integer in [1, {beam}]; got {n!r}.")
        settings["num_hypotheses"] = n
    return settings


def make_app(model_name, beam_sizes, default_beam, limits, engine, batcher):
    """The Starlette application (`build_app` loads the translator and the batcher)."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse
    from starlette.routing import Route

    def error(message, status=400):
        return JSONResponse({"error": message}, status_code=status)

    def check_name(request):
        name = request.path_params["name"]
        if name != model_name:
            return error(f"Servable not found for request: Latest({name})", 404)
        return None

    async def status(request):
        return check_name(request) or JSONResponse({
            "model_version_status": [{
                "version": "1", "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }]
        })  # fmt: skip

    async def metadata(request):
        strings = {"dtype": "DT_STRING", "tensor_shape": {"dim": [{"size": "-1"}]}}
        signature = {
            "inputs": {"sentences": dict(strings, name="sentences:0")},
            "outputs": {"translations": dict(strings, name="translations:0")},
            "method_name": "tensorflow/serving/predict",
        }
        return check_name(request) or JSONResponse({
            "model_spec": {"name": model_name, "signature_name": "", "version": "1"},
            "metadata": {"signature_def": {"signature_def": {
                DEFAULT_SIGNATURE: signature, GREEDY_SIGNATURE: signature,
            }}},
            "server": {"engine": engine, "beam_sizes": list(beam_sizes),
                       "default_beam_size": default_beam, "limits": limits,
                       "batches": batcher.batches},
        })  # fmt: skip

    async def predict(request):
        name, _, verb = request.path_params["name_verb"].partition(":")
        if verb != "predict":
            return error(f"Unsupported verb {verb!r}: this server answers ':predict'.", 404)
        if name != model_name:
            return error(f"Servable not found for request: Latest({name})", 404)
        raw = await request.body()
        if len(raw) > limits["max_body_bytes"]:
            return error(
                f"The request body has {len(raw)} bytes; this server takes at most "
                f"{limits['max_body_bytes']} (--max-body-bytes).", 413,
            )  # fmt: skip
        try:
            body = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            return error(f"The request body is not valid UTF-8 (byte {e.start}).")
        except ValueError as e:
            return error(f"The request body is not valid JSON: {e}.")
        try:
            sentences, columnar = _sentences(
                body, limits["max_sentences"], limits["max_characters"]
            )
            settings = _settings(body, beam_sizes, default_beam, engine == "ctranslate2")
        except BadRequest as e:
            return error(str(e))
        try:
            translations = await asyncio.wait_for(
                batcher.submit(sentences, settings), limits["timeout_seconds"]
            )
        except TimeoutError:
            return error(
                f"The translation took longer than {limits['timeout_seconds']:g} s "
                "(--timeout).", 504,
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - the server lives on; this request fails
            logger.exception("A request failed")
            return error(f"{type(e).__name__}: {e}", 500)
        key = "outputs" if columnar else "predictions"
        if "num_hypotheses" in settings:
            translations = [
                {"translations": [t for t, _ in n_best], "scores": [s for _, s in n_best]}
                for n_best in translations
            ]
        return JSONResponse({key: translations})

    async def page(request):
        shown = "" if engine == "ctranslate2" else "display:none"  # n-best: CTranslate2's
        return HTMLResponse(PAGE.replace("MODEL_NAME", model_name).replace("NBEST_STYLE", shown))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        yield
        await batcher.stop()  # after the requests in flight (uvicorn's graceful shutdown)

    routes = [
        Route("/", page),
        Route("/v1/models/{name}", status),
        Route("/v1/models/{name}/metadata", metadata),
        Route("/v1/models/{name_verb}", predict, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def load_translator(export_dir, engine, precision, threads):
    """`(translate(sentences, settings), beam sizes, default beam)` of an export."""
    if engine == "ctranslate2":
        from keras_transformer.ctranslate2_translator import CTranslate2Translator

        translator = CTranslate2Translator(export_dir)
        beam_sizes = tuple(range(1, 17))
    else:
        from keras_transformer.onnx_translator import OnnxTranslator

        translator = OnnxTranslator(export_dir, precision=precision, intra_op_num_threads=threads)
        beam_sizes = tuple(translator.beam_sizes)

    def translate(sentences, settings):
        return translator.translate(sentences, **settings)

    return translate, beam_sizes, translator.search.beam_size


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="keras-transformer-serve",
        description="Serve an export over HTTP with TF Serving's REST API (localhost by default).",
    )
    parser.add_argument("export_dir", help="an ONNX export (saved_models/NAME/onnx/1) or a "
                        "CTranslate2 one (with --engine ctranslate2)")  # fmt: skip
    parser.add_argument("--engine", choices=("onnx", "ctranslate2"), default="onnx")
    parser.add_argument("--precision", choices=("float32", "int8"), default="float32",
                        help="the ONNX graph: float32 or its int8 weights")  # fmt: skip
    parser.add_argument("--model-name", default=None,
                        help="the NAME in /v1/models/NAME (default: the export's)")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8501)
    parser.add_argument("--threads", type=int, default=0, help="inference threads (0: all)")
    parser.add_argument("--max-batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--max-wait-ms", type=float, default=5.0,
                        help="how long a request waits for others to batch with")  # fmt: skip
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--max-sentences", type=int, default=256, help="per request")
    parser.add_argument("--max-characters", type=int, default=2000, help="per sentence")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    return parser.parse_args(argv)


def _model_name(export_dir):
    """NAME of `saved_models/NAME/onnx/1` (the SavedModel's name in TF Serving's
    models.config), else "transformer"."""
    from keras_transformer.frontend import newest_version

    parts = os.path.abspath(newest_version(export_dir)).split(os.sep)
    if len(parts) >= 3 and parts[-2] in ("onnx", "ctranslate2"):
        return parts[-3]
    return "transformer"


def build_app(args):
    translate, beam_sizes, default_beam = load_translator(
        args.export_dir, args.engine, args.precision, args.threads
    )
    limits = {
        "max_body_bytes": args.max_body_bytes,
        "max_sentences": args.max_sentences,
        "max_characters": args.max_characters,
        "timeout_seconds": args.timeout,
    }
    batcher = DynamicBatcher(translate, args.max_batch, args.max_wait_ms)
    name = args.model_name or _model_name(args.export_dir)
    return make_app(name, beam_sizes, default_beam, limits, args.engine, batcher), name


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        import uvicorn
    except ImportError:
        raise SystemExit(
            "keras-transformer-serve needs the server extra: "
            'pip install "keras-transformer-nmt[server]"'
        ) from None
    start = time.time()
    app, name = build_app(args)
    logger.info(
        "Serving %s (%s) as /v1/models/%s on http://%s:%d (loaded in %.1fs)",
        args.export_dir, args.engine, name, args.host, args.port, time.time() - start,
    )  # fmt: skip
    # uvicorn finishes the requests in flight on SIGINT/SIGTERM, then runs `shutdown`.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=args.timeout)  # fmt: skip


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>keras_transformer: MODEL_NAME</title>
<style>
body { font-family: sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; }
textarea { width: 100%; height: 6rem; font-size: 1rem; }
#out { white-space: pre-wrap; border: 1px solid #ccc; min-height: 3rem; padding: .5rem; }
.error { color: #a00; }
</style></head>
<body>
<h1>MODEL_NAME</h1>
<p>One sentence per line. Served by keras-transformer-serve (TF Serving's REST API).</p>
<textarea id="src" aria-label="sentences to translate"></textarea>
<p><label>Search <select id="signature">
<option value="serving_default">beam search</option>
<option value="translate_greedy">greedy</option></select></label>
<label style="NBEST_STYLE">N-best <select id="nbest"><option value="">off</option>
<option>2</option><option>4</option></select></label>
<button id="go">Translate</button></p>
<div id="out" aria-live="polite"></div>
<p><small>This export carries no attention weights: no heat map is shown
(keras_transformer.visualize draws them from a trained work directory).</small></p>
<script>
document.getElementById("go").addEventListener("click", async () => {
  const out = document.getElementById("out");
  const lines = document.getElementById("src").value.split("\\n").filter(s => s.trim());
  if (!lines.length) { out.textContent = ""; return; }
  out.className = ""; out.textContent = "...";
  const body = {signature_name: document.getElementById("signature").value, instances: lines};
  const n = document.getElementById("nbest").value;
  if (n && body.signature_name !== "translate_greedy") body.num_hypotheses = Number(n);
  const response = await fetch("/v1/models/MODEL_NAME:predict",
    {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
  const payload = await response.json();
  if (payload.error) { out.className = "error"; out.textContent = payload.error; return; }
  out.textContent = payload.predictions.map(p => typeof p === "string" ? p :
    p.translations.map((t, i) => (i + 1) + ". " + t + "  (" + p.scores[i].toFixed(3) + ")")
      .join("\\n")).join(body.num_hypotheses ? "\\n\\n" : "\\n");
});
</script>
</body></html>
"""


if __name__ == "__main__":
    main()
