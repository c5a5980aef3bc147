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
    .../v1/models/NAME/versions/N[/metadata|:predict]   one version's (the policy's)

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
with its own (`queue`). The ONNX engine runs them in
translate_steered.onnx (an export without it answers 400 naming it);
CTranslate2 takes all but `"seed"` (400 naming the engine).

Errors come as TF Serving's, `{"error": "..."}`, one line naming the
problem, for every status the application answers: 400 for a request
that is malformed, of a wrong type or range, or over a limit (each
`requests.Limits` field is a flag); 403 for a Host or Origin not
allowed (`access`); 404 for another model, version or path; 408
for a body slower than `--body-timeout`; 413 over `--max-body-bytes`
(checked before the body is read); 503 with `Retry-After` when the queue
or the client's share of it is full or when the worker translating the
request died; 504 at `--timeout`. docs/serving.md, "Running it in
production", lists the limits and what belongs to a proxy in front.

Once the first version has loaded and the server listens, it prints
`Serving on http://HOST:PORT` on stdout, its first line there (the access
log's JSON lines follow); `--port 0` takes a free port, which that line names.

`--workers` processes translate batches side by side, each with its own
translator and `--threads` (`workers`, `versions`); one queue, bounded in
sentences, feeds them (`queue`); a folder of version folders is
watched and served by `--version-policy` (TF Serving's policies); SIGTERM
or Ctrl-C drains (every request received is answered) and exits 0. Neither
TensorFlow nor Keras is imported (the ONNX translator refuses a process
that has TensorFlow).
"""

import argparse
import dataclasses
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
from keras_transformer.serving.app import (  # noqa: F401 - the old module's names too
    METRICS_PATH,
    RETRY_AFTER_SECONDS,
    make_app,
)
from keras_transformer.serving.engines import DEVICES, ENGINES, PRECISIONS, EngineConfig
from keras_transformer.serving.page import PAGE  # noqa: F401 - the old module's name
from keras_transformer.serving.requests import Limits

logger = logging.getLogger("keras_transformer.serve")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="keras-transformer-serve",
        description="Serve an export over HTTP with TF Serving's REST API (localhost by default).",
    )
    parser.add_argument("export_dir", help="an export's folder of versions (saved_models/NAME/"
                        "onnx: the versions of --version-policy are served, and the folder is "
                        "watched for changes) or one version (saved_models/NAME/onnx/1); "
                        "CTranslate2's with --engine ctranslate2")  # fmt: skip
    _engine_flags(parser)
    _network_flags(parser)
    _limit_flags(parser)
    _version_flags(parser)
    parser.add_argument("--no-access-log", dest="access_log", action="store_false",
                        help="no JSON line per request on stdout")  # fmt: skip
    add_debug_flag(parser)
    add_verbose_flag(parser)
    return parser.parse_args(argv)


def _engine_flags(parser):
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
                        help="translation processes per version, each with its own translator "
                        "and --threads (default: one per usable core)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1,
                        help="inference threads of each worker (0: the runtime's "
                        "default)")  # fmt: skip
    parser.add_argument("--model-name", default=None,
                        help="the NAME in /v1/models/NAME (default: the export's)")  # fmt: skip
    parser.add_argument("--max-batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--max-wait-ms", type=float, default=5.0,
                        help="how long a request waits for others to batch with")  # fmt: skip


def _network_flags(parser):
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on; 0.0.0.0 or :: (every address) needs "
                        "--allowed-hosts")  # fmt: skip
    parser.add_argument("--port", type=int, default=8501,
                        help="0: a free port, which the line 'Serving on http://HOST:PORT' "
                        "(stdout, once the model is loaded) names")  # fmt: skip
    parser.add_argument("--allowed-hosts", nargs="+", default=None, metavar="NAME",
                        help="the names a request's Host header may give (403 otherwise; "
                        "default: localhost, 127.0.0.1, ::1 and --host; '*': any)")  # fmt: skip
    parser.add_argument("--allowed-origins", nargs="+", default=None, metavar="ORIGIN",
                        help="web origins (https://app.example.com) allowed to call from a "
                        "browser, with CORS headers (default: none but the server's own page; "
                        "requests without an Origin header, as curl's, are not "
                        "affected)")  # fmt: skip
    parser.add_argument("--trusted-proxies", nargs="+", default=None, metavar="ADDRESS",
                        help="addresses (or networks) of proxies whose X-Forwarded-For names "
                        "the client (uvicorn's forwarded_allow_ips; default: none, the peer "
                        "is the client)")  # fmt: skip
    parser.add_argument("--max-connections", type=int, default=512,
                        help="open connections and requests at most (uvicorn's "
                        "limit_concurrency: it answers 503 beyond, in plain text)")  # fmt: skip
    parser.add_argument("--keep-alive-seconds", type=int, default=5,
                        help="an idle keep-alive connection is closed after this")  # fmt: skip
    parser.add_argument("--max-header-bytes", type=int, default=16384,
                        help="the request line and headers at most (h11's "
                        "max_incomplete_event_size; uvicorn closes the connection "
                        "beyond)")  # fmt: skip
    parser.add_argument("--drain-seconds", type=float, default=None,
                        help="on SIGTERM or Ctrl-C, how long the requests in flight may take "
                        "before the server exits (default: --timeout)")  # fmt: skip


def _limit_flags(parser):
    """One flag per field of `requests.Limits`, its default and help from there."""
    helps = {
        "max_body_bytes": "the request body (413 beyond, checked before it is read)",
        "max_sentences": "sentences per request",
        "max_characters": "characters per sentence (and per prefix)",
        "max_work": "per request: the characters of its sentences times the beam size",
        "max_banned": "banned words or phrases per request",
        "max_glossary": "glossary entries per request",
        "max_term_words": "words of one banned phrase or glossary term",
        "max_term_characters": "characters of one banned phrase or glossary term",
        "max_queue": "sentences waiting for a worker at most, per version; beyond, 503 "
                     "with Retry-After",
        "max_client_queue": "sentences of one client (its address) waiting at most, so "
                            "that one client cannot fill the queue; beyond, 503 with "
                            "Retry-After (default: a quarter of --max-queue, at least "
                            "--max-sentences)",
        "timeout_seconds": "seconds per request from its first byte (504 after; a request "
                           "still queued then is never translated)",
        "body_seconds": "seconds to receive a request's body (408 after)",
    }  # fmt: skip
    for field in dataclasses.fields(Limits):
        parser.add_argument(
            Limits.flag(field.name), dest=field.name, default=field.default,
            type=float if field.type is float else int,
            help=helps[field.name] + ("" if field.default is None else
                                      f" (default: {field.default})"),
        )  # fmt: skip


def _version_flags(parser):
    parser.add_argument("--version-policy", choices=("latest", "specific", "all"),
                        default="latest",
                        help="which version folders are served (TF Serving's "
                        "model_version_policy): the latest --latest-versions, the --versions "
                        "listed, or all")  # fmt: skip
    parser.add_argument("--latest-versions", type=int, default=1, metavar="N",
                        help="with --version-policy latest: how many")  # fmt: skip
    parser.add_argument("--versions", type=int, nargs="+", default=(), metavar="N",
                        help="with --version-policy specific: the version numbers")  # fmt: skip
    parser.add_argument("--poll-seconds", type=float, default=1.0,
                        help="how often a folder of versions is looked at for changes "
                        "(TF Serving's --file_system_poll_wait_seconds)")  # fmt: skip


def _model_name(export_dir):
    """NAME of `saved_models/NAME/onnx/1` (the SavedModel's name in TF Serving's
    models.config), else "transformer"."""
    from keras_transformer.serving.frontend import newest_version

    parts = os.path.abspath(newest_version(export_dir)).split(os.sep)
    if len(parts) >= 3 and parts[-2] in ("onnx", "ctranslate2"):
        return parts[-3]
    return "transformer"


def _usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def build_app(args, factory=None, on_fatal=None):
    """`(application, model name, ModelServer)` of the command line's arguments; raises
    `ValueError` for a flag the engine cannot honour (nothing is loaded yet).

    `factory`: `engines.EngineConfig.factory` (a stand-in translator)."""
    from keras_transformer.serving.access import Access
    from keras_transformer.serving.engines import check_engine
    from keras_transformer.serving.metrics import Metrics
    from keras_transformer.serving.queue import RequestQueue
    from keras_transformer.serving.versions import ModelServer, VersionPolicy, version_folders

    config = EngineConfig(args.engine, args.precision, args.threads, args.device, factory)
    check_engine(config)
    workers = _usable_cores() if args.workers is None else args.workers
    limits = Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)})
    limits = limits.resolved()
    _check_numbers(args, workers, limits)
    access = Access.of_flags(args.host, args.allowed_hosts, args.allowed_origins)
    policy = VersionPolicy(args.version_policy, args.latest_versions, tuple(args.versions))
    found, _ = version_folders(args.export_dir)  # FileNotFoundError for a missing folder
    if not found:
        raise FileNotFoundError(
            f"{args.export_dir!r} is neither an export nor a folder of integer version folders."
        )
    metrics = Metrics()

    def queue():
        return RequestQueue(args.max_batch, args.max_wait_ms, limits.max_queue, metrics,
                            limits.max_client_queue)  # fmt: skip

    server = ModelServer(args.export_dir, config, workers, queue, metrics, args.poll_seconds,
                         on_fatal, policy)  # fmt: skip
    name = args.model_name or _model_name(args.export_dir)
    app = make_app(name, server, limits, args.engine, metrics, args.access_log, access)
    return app, name, server


def _check_numbers(args, workers, limits):
    """`ValueError` naming the flag of a count that must be positive, or of two limits
    that cannot hold together."""
    counts = [("--workers", workers), ("--max-batch", args.max_batch),
              ("--max-connections", args.max_connections),
              ("--max-header-bytes", args.max_header_bytes)]  # fmt: skip
    counts += [(Limits.flag(f.name), getattr(limits, f.name)) for f in dataclasses.fields(limits)]
    for flag, value in counts:
        if not value > 0:
            raise ValueError(f"{flag} must be positive. Received: {value}")
    pairs = (("max_sentences", "max_queue"), ("max_client_queue", "max_queue"),
             ("max_sentences", "max_client_queue"))  # fmt: skip
    for small, large in pairs:
        if getattr(limits, small) > getattr(limits, large):
            raise ValueError(
                f"{Limits.flag(small)} {getattr(limits, small)} exceeds {Limits.flag(large)} "
                f"{getattr(limits, large)}: such a request could never be queued."
            )


class _JsonLines(logging.Formatter):
    """The access log: each record's message is a JSON object; the time is added."""

    def format(self, record):
        entry = json.loads(record.getMessage())
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        return json.dumps({"time": stamp.isoformat(timespec="milliseconds"), **entry},
                          ensure_ascii=False)  # fmt: skip


def _configure_logging(verbose):
    from keras_transformer.serving.metrics import ACCESS_LOGGER

    configure_logging(verbose, "%(asctime)s %(levelname)s %(message)s")
    access = logging.getLogger(ACCESS_LOGGER)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_JsonLines())
    access.addHandler(handler)
    access.propagate = False


def _announcing_server(uvicorn, config, model_server):
    """A `uvicorn.Server` that prints `Serving on http://HOST:PORT` on stdout once it
    listens (after the first version has loaded), with the port the OS bound (`--port
    0` takes a free one, and a script reads it from this line), and that drains on
    SIGTERM and SIGINT: it stops accepting connections, answers every request it has
    received (up to `--drain-seconds`), starts no worker meanwhile, and exits 0."""

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:  # should_exit: the model did not load
                port = self.servers[0].sockets[0].getsockname()[1]
                host = f"[{config.host}]" if ":" in config.host else config.host
                print(f"Serving on http://{host}:{port}", flush=True)

        def handle_exit(self, sig, frame):
            model_server.drain()
            super().handle_exit(sig, frame)
            # uvicorn raises the signal again once it has shut down, which would end the
            # process with -SIGTERM: a drained server exits 0 instead.
            self._captured_signals.clear()

    return Server(config)


def _uvicorn_config(uvicorn, app, args):
    """uvicorn's settings of the command line: connection limits and timeouts
    (docs/serving.md, "Running it in production", says what uvicorn answers itself)."""
    drain = args.timeout_seconds if args.drain_seconds is None else args.drain_seconds
    return uvicorn.Config(
        app, host=args.host, port=args.port,
        log_level="info" if args.verbose else "warning",
        timeout_graceful_shutdown=max(1, round(drain)),
        limit_concurrency=args.max_connections,
        timeout_keep_alive=args.keep_alive_seconds,
        h11_max_incomplete_event_size=args.max_header_bytes,
        proxy_headers=args.trusted_proxies is not None,
        forwarded_allow_ips=args.trusted_proxies or [],
        server_header=False,
    )  # fmt: skip


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

    app, name, model_server = run_main(
        "keras-transformer-serve", args.debug, lambda: build_app(args, factory, on_fatal)
    )
    logger.info(
        "Loading %s (%s, %s) to serve as /v1/models/%s",
        args.export_dir, args.engine, args.precision, name,
    )  # fmt: skip
    config = _uvicorn_config(uvicorn, app, args)
    held["server"] = _announcing_server(uvicorn, config, model_server)
    held["server"].run()
    if fatal:
        raise SystemExit(f"keras-transformer-serve: error: {fatal[0]}")


if __name__ == "__main__":
    main()
