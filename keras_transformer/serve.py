"""`keras-transformer-serve`: an export served over HTTP with TF Serving's REST contract.

    pip install -e ".[serve,server]"          # in the clone
    keras-transformer-serve saved_models/transformer_de_en/onnx --port 8501
    python export/serving/client_rest.py "Das Haus ist klein."

The SavedModel is what TF Serving serves; this server serves the ONNX
export (float32 or int8, `OnnxTranslator`) or the CTranslate2 one
(`CTranslate2Translator`, any compute type) with the same REST API, so that
`export/serving/client_rest.py` and any TF Serving REST client work
against it unchanged (https://www.tensorflow.org/tfx/serving/api_rest):

    GET  /v1/models/NAME                 status (`model_version_status`: LOADING,
                                         AVAILABLE, UNLOADING, END per version)
    GET  /v1/models/NAME/metadata        the signatures (`serving_default`: the
                                         export's beam search; `translate_greedy`)
    POST /v1/models/NAME:predict         {"instances": [...]} -> {"predictions": [...]}
                                         {"inputs": {"sentences": [...]}} or
                                         {"inputs": [...]} -> {"outputs": [...]}
    GET  /monitoring/prometheus/metrics  Prometheus metrics (TF Serving's path)
    GET  /                               a page to type a sentence into

Extra request fields, this server's own: `"beam_size"` (one the export
has), `"alpha"`, with `--engine ctranslate2` `"num_hypotheses": N`
(<= the beam), which makes each prediction `{"translations": [N best],
"scores": [N scores]}` (CTranslate2's; translate.onnx returns the best
hypothesis only), and `"glossary": {"source term": "target term", ...}`
(a model trained with `--terminology`: the terms are annotated in the
sentences, `keras_transformer.terminology`, before they are queued).

Steering fields (`Translator.translate`'s arguments): `"prefix"`, the start
forced on each output (a string for every sentence or a list of one per
sentence; in the row format also a row's named input, `{"sentences": "...",
"prefix": "..."}`, and in the columnar one `"inputs": {"sentences": [...],
"prefix": [...]}`), `"banned"` (a list of words or phrases no output holds),
`"sampling_topk"` (0 or K > 1 samples; 1, the default, searches),
`"sampling_temperature"` and `"seed"` (an int, from which each sentence's
seed is drawn as `OnnxTranslator` draws them, or one int per sentence). A
batch is keyed on the settings its graph takes once (`beam_size`, `alpha`,
`num_hypotheses`, top-k, temperature) and on whether it is steered:
requests with different prefixes, bans and seeds share one, each sentence
with its own (`serving_queue`). The ONNX engine runs them in
translate_steered.onnx (an export without it answers 400 naming it);
CTranslate2 takes all but `"seed"` (400 naming the engine).

Errors come as TF Serving's, `{"error": "..."}` with status 400 (404 for
another model name), one line naming the problem; 503 with `Retry-After`
when the queue is full (`--max-queue`) or when the worker translating the
request died; 504 at `--timeout`.

Once the first version has loaded and the server listens, it prints
`Serving on http://HOST:PORT` on stdout, its first line there (the access
log's JSON lines follow); `--port 0` takes a free port, which that line names.

`--workers` processes translate batches side by side, each with its own
translator and `--threads` (`serving_workers`); one queue, bounded in
sentences, feeds them (`serving_queue`); a folder of version folders is
watched for new versions (TF Serving's "latest" policy). Neither
TensorFlow nor Keras is imported (the ONNX translator refuses a process
that has TensorFlow).
"""

import argparse
import asyncio
import contextlib
import datetime
import json
import logging
import os
import sys

from keras_transformer.command_line import (
    add_debug_flag,
    add_verbose_flag,
    configure_logging,
    run_main,
)
from keras_transformer.serving_engines import DEVICES, ENGINES, PRECISIONS, EngineConfig
from keras_transformer.serving_requests import (
    DEFAULT_SIGNATURE,
    GREEDY_SIGNATURE,
    BadRequest,
    parse_glossary,
    parse_sentences,
    parse_settings,
    parse_steering,
)

logger = logging.getLogger("keras_transformer.serve")

METRICS_PATH = "/monitoring/prometheus/metrics"  # TF Serving's --rest_api monitoring path
RETRY_AFTER_SECONDS = 1


def make_app(model_name, server, limits, engine, metrics, access_log=True):
    """The Starlette application over a `serving_workers.ModelServer` (`build_app`
    makes both from the command line's arguments)."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    from keras_transformer.serving_metrics import AccessLog
    from keras_transformer.serving_queue import QueueFull
    from keras_transformer.serving_workers import WorkerLost

    def error(message, status=400, retry=False):
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if retry else None
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    def check_name(request):
        name = request.path_params["name"]
        if name != model_name:
            return error(f"Servable not found for request: Latest({name})", 404)
        return None

    async def status(request):
        return check_name(request) or JSONResponse(server.status())

    async def metadata(request):
        strings = {"dtype": "DT_STRING", "tensor_shape": {"dim": [{"size": "-1"}]}}
        signature = {
            "inputs": {"sentences": dict(strings, name="sentences:0")},
            "outputs": {"translations": dict(strings, name="translations:0")},
            "method_name": "tensorflow/serving/predict",
        }
        info = server.info or {}
        config = server.config
        return check_name(request) or JSONResponse({
            "model_spec": {"name": model_name, "signature_name": "",
                           "version": str(server.version or "")},
            "metadata": {"signature_def": {"signature_def": {
                DEFAULT_SIGNATURE: signature, GREEDY_SIGNATURE: signature,
            }}},
            "server": {"engine": engine, "precision": config.precision,
                       "threads": config.threads, "device": config.device,
                       "runtime": info.get("runtime"), "beam_sizes": info.get("beam_sizes"),
                       "default_beam_size": info.get("default_beam"), "limits": limits,
                       "glossary": info.get("glossary"),
                       "steering": info.get("steering"),
                       "batches": server.batches,
                       "worker_processes": [w.describe() for w in server.workers]},
        })  # fmt: skip

    async def metrics_page(request):
        body, content_type = metrics.exposition()
        return Response(body, headers={"Content-Type": content_type})

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
        info = server.info  # set before the server listens (the lifespan loads it)
        try:
            sentences, columnar, prefix = parse_sentences(
                body, limits["max_sentences"], limits["max_characters"]
            )
            settings = parse_settings(
                body, info["beam_sizes"], info["default_beam"], engine == "ctranslate2"
            )
            glossary = parse_glossary(body, info.get("glossary", False))
            sampling, rows = parse_steering(
                body, prefix, len(sentences), info.get("steering", ()), engine,
                limits["max_characters"],
            )  # fmt: skip
            if sampling and settings.get("num_hypotheses", 1) > 1:
                raise BadRequest(
                    "num_hypotheses must be 1 with sampling (one sample per sentence)."
                )
            settings.update(sampling)
        except BadRequest as e:
            return error(str(e))
        if glossary is not None:  # in the text, here: requests batch whatever their glossary
            from keras_transformer.terminology import annotate_all

            sentences = annotate_all(sentences, glossary)
        request.state.log = {"sentences": len(sentences), "version": str(server.version)}
        try:
            queued = server.queue.put(sentences, settings, limits["timeout_seconds"], rows)
        except QueueFull as e:
            return error(str(e), 503, retry=True)
        answer = await _wait(request, queued, server.queue)
        if answer == "disconnected":
            return error("The client closed the connection before the answer.", 499)
        if answer == "expired" or isinstance(answer, TimeoutError):
            return error(
                f"The translation took longer than {limits['timeout_seconds']:g} s "
                "(--timeout).", 504,
            )  # fmt: skip
        if isinstance(answer, WorkerLost):
            return error(str(answer), 503, retry=True)
        if isinstance(answer, BaseException):  # the server lives on; this request fails
            logger.error("A request failed: %s: %s", type(answer).__name__, answer)
            return error(f"{type(answer).__name__}: {answer}", 500)
        key = "outputs" if columnar else "predictions"
        if "num_hypotheses" in settings:
            answer = [
                {"translations": [t for t, _ in n_best], "scores": [s for _, s in n_best]}
                for n_best in answer
            ]
        return JSONResponse({key: answer})

    async def page(request):
        shown = "" if engine == "ctranslate2" else "display:none"  # n-best: CTranslate2's
        return HTMLResponse(PAGE.replace("MODEL_NAME", model_name).replace("NBEST_STYLE", shown))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await server.start()  # the first version loads before uvicorn listens
        yield
        await server.stop()  # after the requests in flight (uvicorn's graceful shutdown)

    routes = [
        Route("/", page),
        Route(METRICS_PATH, metrics_page),
        Route("/v1/models/{name}", status),
        Route("/v1/models/{name}/metadata", metadata),
        Route("/v1/models/{name_verb}", predict, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    return AccessLog(app, metrics, enabled=access_log)


async def _wait(request, queued, queue):
    """The translations of a queued request, or its error, or "expired" at its
    deadline or "disconnected" if the client leaves first (the request then
    leaves the queue: a batch not yet formed never translates it)."""
    loop = asyncio.get_running_loop()
    watcher = asyncio.create_task(_disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {queued.future, watcher}, timeout=max(0.0, queued.deadline - loop.time()),
            return_when=asyncio.FIRST_COMPLETED,
        )  # fmt: skip
    except asyncio.CancelledError:
        queue.abandon(queued, "disconnected")
        raise
    finally:
        watcher.cancel()
    if not queued.future.done():
        reason = "disconnected" if watcher in done else "expired"
        queue.abandon(queued, reason)
        return reason
    return queued.future.exception() or queued.future.result()


async def _disconnected(request):
    """Returns when the client closes the connection (ASGI's `http.disconnect`, which
    the server sends once the body has been read and the client goes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="keras-transformer-serve",
        description="Serve an export over HTTP with TF Serving's REST API (localhost by default).",
    )
    parser.add_argument("export_dir", help="an export's folder of versions (saved_models/NAME/"
                        "onnx: the newest version is served, and a newer one that appears is "
                        "loaded and swapped in) or one version (saved_models/NAME/onnx/1); "
                        "CTranslate2's with --engine ctranslate2")  # fmt: skip
    parser.add_argument("--engine", choices=ENGINES, default="onnx")
    precisions = sorted(set(PRECISIONS["onnx"] + PRECISIONS["ctranslate2"]))
    parser.add_argument("--precision", choices=precisions, default="float32",
                        help="float32 or int8 (onnx: translate_int8.onnx; ctranslate2: "
                        "its compute_type); ctranslate2 also takes its other compute "
                        "types")  # fmt: skip
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="cuda: ONNX Runtime's CUDA provider ([onnx-gpu]) or CTranslate2 on "
                        "the GPU; an error where none is present")  # fmt: skip
    parser.add_argument("--workers", type=int, default=None,
                        help="translation processes, each with its own translator and "
                        "--threads (default: one per usable core)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1,
                        help="inference threads of each worker (0: the runtime's "
                        "default)")  # fmt: skip
    parser.add_argument("--model-name", default=None,
                        help="the NAME in /v1/models/NAME (default: the export's)")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8501,
                        help="0: a free port, which the line 'Serving on http://HOST:PORT' "
                        "(stdout, once the model is loaded) names")  # fmt: skip
    parser.add_argument("--max-batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--max-wait-ms", type=float, default=5.0,
                        help="how long a request waits for others to batch with")  # fmt: skip
    parser.add_argument("--max-queue", type=int, default=2048,
                        help="sentences waiting for a worker at most; beyond, 503 with "
                        "Retry-After")  # fmt: skip
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--max-sentences", type=int, default=256, help="per request")
    parser.add_argument("--max-characters", type=int, default=2000, help="per sentence")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds per request (504 after; a request still queued then "
                        "is never translated)")  # fmt: skip
    parser.add_argument("--poll-seconds", type=float, default=1.0,
                        help="how often a folder of versions is looked at for a new one "
                        "(TF Serving's --file_system_poll_wait_seconds)")  # fmt: skip
    parser.add_argument("--no-access-log", dest="access_log", action="store_false",
                        help="no JSON line per request on stdout")  # fmt: skip
    add_debug_flag(parser)
    add_verbose_flag(parser)
    return parser.parse_args(argv)


def _model_name(export_dir):
    """NAME of `saved_models/NAME/onnx/1` (the SavedModel's name in TF Serving's
    models.config), else "transformer"."""
    from keras_transformer.frontend import newest_version

    parts = os.path.abspath(newest_version(export_dir)).split(os.sep)
    if len(parts) >= 3 and parts[-2] in ("onnx", "ctranslate2"):
        return parts[-3]
    return "transformer"


def _usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def build_app(args, factory=None, on_fatal=None):
    """`(application, model name)` of the command line's arguments; raises
    `ValueError` for a flag the engine cannot honour (nothing is loaded yet).

    `factory`: `serving_engines.EngineConfig.factory` (a stand-in translator)."""
    from keras_transformer.serving_engines import check_engine
    from keras_transformer.serving_metrics import Metrics
    from keras_transformer.serving_queue import RequestQueue
    from keras_transformer.serving_workers import ModelServer, version_folders

    config = EngineConfig(args.engine, args.precision, args.threads, args.device, factory)
    check_engine(config)
    workers = _usable_cores() if args.workers is None else args.workers
    for flag, value in (("--workers", workers), ("--max-batch", args.max_batch),
                        ("--max-queue", args.max_queue)):  # fmt: skip
        if value < 1:
            raise ValueError(f"{flag} must be at least 1. Received: {value}")
    if args.max_sentences > args.max_queue:
        raise ValueError(
            f"--max-sentences {args.max_sentences} exceeds --max-queue {args.max_queue}: "
            "such a request could never be queued."
        )
    found, _ = version_folders(args.export_dir)  # FileNotFoundError for a missing folder
    if not found:
        raise FileNotFoundError(
            f"{args.export_dir!r} is neither an export nor a folder of integer version folders."
        )
    limits = {
        "max_body_bytes": args.max_body_bytes,
        "max_sentences": args.max_sentences,
        "max_characters": args.max_characters,
        "max_queue": args.max_queue,
        "timeout_seconds": args.timeout,
    }
    metrics = Metrics()
    queue = RequestQueue(args.max_batch, args.max_wait_ms, args.max_queue, metrics)
    server = ModelServer(
        args.export_dir, config, workers, queue, metrics, args.poll_seconds, on_fatal
    )
    name = args.model_name or _model_name(args.export_dir)
    app = make_app(name, server, limits, args.engine, metrics, args.access_log)
    return app, name


class _JsonLines(logging.Formatter):
    """The access log: each record's message is a JSON object; the time is added."""

    def format(self, record):
        entry = json.loads(record.getMessage())
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        return json.dumps({"time": stamp.isoformat(timespec="milliseconds"), **entry},
                          ensure_ascii=False)  # fmt: skip


def _configure_logging(verbose):
    from keras_transformer.serving_metrics import ACCESS_LOGGER

    configure_logging(verbose, "%(asctime)s %(levelname)s %(message)s")
    access = logging.getLogger(ACCESS_LOGGER)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_JsonLines())
    access.addHandler(handler)
    access.propagate = False


def _announcing_server(uvicorn, config):
    """A `uvicorn.Server` that prints `Serving on http://HOST:PORT` on stdout once it
    listens (after the first version has loaded), with the port the OS bound: `--port 0`
    takes a free one, and a script reads it from this line."""

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:  # should_exit: the model did not load
                port = self.servers[0].sockets[0].getsockname()[1]
                host = f"[{config.host}]" if ":" in config.host else config.host
                print(f"Serving on http://{host}:{port}", flush=True)

    return Server(config)


def main(argv=None, factory=None):
    """The command: parses the flags, checks them, serves until SIGTERM or Ctrl-C.

    `factory`: a stand-in translator for the workers (tests; see `build_app`)."""
    args = parse_args(argv)
    _configure_logging(args.verbose)
    try:
        import uvicorn
    except ImportError:
        raise SystemExit(
            "keras-transformer-serve needs the server extra: "
            'pip install -e ".[server]" in the clone'
        ) from None
    fatal, held = [], {}

    def on_fatal(message):  # the first version did not load: stop serving, exit 1
        fatal.append(message)
        held["server"].should_exit = True

    app, name = run_main(
        "keras-transformer-serve", args.debug, lambda: build_app(args, factory, on_fatal)
    )
    logger.info(
        "Loading %s (%s, %s) to serve as /v1/models/%s",
        args.export_dir, args.engine, args.precision, name,
    )  # fmt: skip
    # uvicorn finishes the requests in flight on SIGINT/SIGTERM, then runs `shutdown`.
    config = uvicorn.Config(app, host=args.host, port=args.port,
                            log_level="info" if args.verbose else "warning",
                            timeout_graceful_shutdown=args.timeout)  # fmt: skip
    held["server"] = _announcing_server(uvicorn, config)
    held["server"].run()
    if fatal:
        raise SystemExit(f"keras-transformer-serve: error: {fatal[0]}")


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
