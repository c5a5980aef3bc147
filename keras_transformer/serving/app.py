"""`keras-transformer-serve`'s HTTP application: TF Serving's REST routes over a
`versions.ModelServer`, each a small handler, and TF Serving's JSON error for every
status the application answers.

    app = make_app("transformer_de_en", model_server, Limits(), "onnx", Metrics())

A predict request is read (`read_body`: its size checked before a byte is read,
its pace bounded), parsed and checked whole (`requests.parse_request`),
annotated with its glossary off the event loop (`annotated`), then queued on
the version it asks for and awaited (`_wait`); `cli` builds the application
from the command line. The routes and error statuses: the command's docstring
(`keras_transformer.serving.cli`) and docs/serving.md.
"""

import asyncio
import contextlib
import dataclasses
import logging

from keras_transformer.serving.page import PAGE
from keras_transformer.serving.requests import (
    DEFAULT_SIGNATURE,
    GREEDY_SIGNATURE,
    BadRequest,
    parse_body,
    parse_request,
)

logger = logging.getLogger("keras_transformer.serve")

METRICS_PATH = "/monitoring/prometheus/metrics"  # TF Serving's --rest_api monitoring path
RETRY_AFTER_SECONDS = 1


def error_response(message, status=400, retry=False):
    """TF Serving's error shape, `{"error": "..."}`, for every status this app answers.
    408 and 413 close the connection: the rest of that body is never read."""
    from starlette.responses import JSONResponse

    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if retry else {}
    if status in (408, 413):
        headers["Connection"] = "close"
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class Handlers:
    """The routes of `make_app`, each a small handler over a `ModelServer`."""

    def __init__(self, model_name, server, limits, engine, metrics):
        self.model_name = model_name
        self.server = server
        self.limits = limits
        self.engine = engine
        self.metrics = metrics

    def routes(self):
        from starlette.routing import Route

        return [
            Route("/", self.page),
            Route(METRICS_PATH, self.metrics_page),
            Route("/v1/models/{name}", self.status),
            Route("/v1/models/{name}/versions/{version}", self.status),
            Route("/v1/models/{name}/metadata", self.metadata),
            Route("/v1/models/{name}/versions/{version}/metadata", self.metadata),
            Route("/v1/models/{name_verb}", self.predict, methods=["POST"]),
            Route("/v1/models/{name}/versions/{version_verb}", self.predict, methods=["POST"]),
        ]

    def _version(self, request):
        """`(version or None, error response or None)` of a request's path: the model's
        name checked, and `/versions/N` read (404 for another name or a bad N)."""
        name = request.path_params["name"]
        if name != self.model_name:
            return None, error_response(f"Servable not found for request: Latest({name:.80})", 404)
        text = request.path_params.get("version")
        if text is None:
            return None, None
        if not (text.isascii() and text.isdigit() and len(text) <= 18):
            return None, error_response(f"Version {text[:40]!r} is not a version number.", 404)
        return int(text), None

    async def status(self, request):
        version, refused = self._version(request)
        if refused:
            return refused
        answer = self.server.status(version)
        if version is not None and not answer["model_version_status"]:
            return error_response(f"Servable not found for request: Specific({version})", 404)
        return _json(answer)

    async def metadata(self, request):
        version, refused = self._version(request)
        if refused:
            return refused
        from keras_transformer.serving.versions import NotAvailable

        try:
            served = self.server.get(version)
        except NotAvailable as e:
            return error_response(str(e), 404 if version is not None else 503, retry=True)
        strings = {"dtype": "DT_STRING", "tensor_shape": {"dim": [{"size": "-1"}]}}
        signature = {
            "inputs": {"sentences": dict(strings, name="sentences:0")},
            "outputs": {"translations": dict(strings, name="translations:0")},
            "method_name": "tensorflow/serving/predict",
        }
        info, config = served.info, self.server.config
        return _json({
            "model_spec": {"name": self.model_name, "signature_name": "",
                           "version": str(served.version)},
            "metadata": {"signature_def": {"signature_def": {
                DEFAULT_SIGNATURE: signature, GREEDY_SIGNATURE: signature,
            }}},
            "server": {"engine": self.engine, "precision": config.precision,
                       "threads": config.threads, "device": config.device,
                       "runtime": info.get("runtime"), "beam_sizes": info.get("beam_sizes"),
                       "default_beam_size": info.get("default_beam"),
                       "limits": dataclasses.asdict(self.limits),
                       "glossary": info.get("glossary"), "steering": info.get("steering"),
                       "version_policy": dataclasses.asdict(self.server.policy),
                       "batches": self.server.batches,
                       "worker_processes": [w.describe() for w in self.server.workers]},
        })  # fmt: skip

    async def metrics_page(self, request):
        from starlette.responses import Response

        body, content_type = self.metrics.exposition()
        return Response(body, headers={"Content-Type": content_type})

    async def page(self, request):
        from starlette.responses import HTMLResponse

        shown = "" if self.engine == "ctranslate2" else "display:none"  # n-best: CTranslate2's
        page = PAGE.replace("MODEL_NAME", self.model_name).replace("NBEST_STYLE", shown)
        return HTMLResponse(page)

    def _predict_target(self, request):
        """`(version or None, error response or None)` of a predict path:
        `/v1/models/NAME:predict` or `/v1/models/NAME/versions/N:predict`."""
        params = request.path_params
        if "name_verb" in params:
            name, _, verb = params["name_verb"].partition(":")
            request.path_params.update(name=name)
        else:
            text, _, verb = params["version_verb"].partition(":")
            request.path_params.update(version=text)
        if verb != "predict":
            return None, error_response(
                f"Unsupported verb {verb[:40]!r}: this server answers ':predict'.", 404
            )
        return self._version(request)

    async def predict(self, request):
        from keras_transformer.serving.queue import QueueFull
        from keras_transformer.serving.versions import NotAvailable

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.timeout_seconds  # from the first byte on
        version, refused = self._predict_target(request)
        if refused:
            return refused
        try:
            raw = await read_body(request, self.limits, deadline)
            body = parse_body(raw)
            served = self.server.get(version)
            parsed = parse_request(body, served.info, self.limits, self.engine)
            sentences = await annotated(parsed, deadline, self.limits)
            if served.state != "AVAILABLE":  # retired while the glossary was matched
                served = self.server.get(version)
            request.state.log = {"sentences": len(sentences), "version": str(served.version)}
            queued = served.queue.put(
                sentences, parsed.settings, self.limits.timeout_seconds, parsed.rows,
                client=_client(request), deadline=deadline,
            )  # fmt: skip
        except BadRequest as e:
            return error_response(str(e), e.status)
        except NotAvailable as e:
            return error_response(str(e), 404 if version is not None else 503, retry=True)
        except QueueFull as e:
            return error_response(str(e), 503, retry=True)
        except asyncio.TimeoutError:  # TimeoutError from Python 3.11 on, not before
            return self._timed_out()
        answer = await _wait(request, queued, served.queue)
        return self._answer(answer, parsed)

    def _timed_out(self):
        return error_response(
            f"The translation took longer than {self.limits.timeout_seconds:g} s (--timeout).",
            504,
        )

    def _answer(self, answer, parsed):
        from keras_transformer.serving.workers import WorkerLost

        if answer == "disconnected":
            return error_response("The client closed the connection before the answer.", 499)
        if answer == "expired" or isinstance(answer, asyncio.TimeoutError):
            return self._timed_out()
        if isinstance(answer, WorkerLost):
            return error_response(str(answer), 503, retry=True)
        if isinstance(answer, BaseException):  # the server lives on; this request fails
            logger.error("A request failed: %s: %s", type(answer).__name__, answer)
            return error_response(f"{type(answer).__name__}: {answer}", 500)
        if "num_hypotheses" in parsed.settings:
            answer = [
                {"translations": [t for t, _ in n_best], "scores": [s for _, s in n_best]}
                for n_best in answer
            ]
        return _json({"outputs" if parsed.columnar else "predictions": answer})


def _json(content):
    from starlette.responses import JSONResponse

    return JSONResponse(content)


async def read_body(request, limits, deadline):
    """The request body, read as it arrives: refused with 413 as soon as it is over
    `max_body_bytes` (its `Content-Length` checked before a byte is read, a chunked
    body as it grows), and with 408 when it has not all arrived within
    `body_seconds` (or the request's deadline, whichever comes first)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit():
        if int(declared) > limits.max_body_bytes:
            raise _too_large(limits, f"Content-Length {declared.strip()[:20]}")
    loop = asyncio.get_running_loop()
    seconds = max(0.0, min(limits.body_seconds, deadline - loop.time()))
    chunks, size = [], 0

    async def receive():
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise _too_large(limits, f"{size} bytes so far")
            chunks.append(chunk)

    from starlette.requests import ClientDisconnect

    try:
        await asyncio.wait_for(receive(), seconds)
    except ClientDisconnect:  # nobody is there to read an answer: logged as 499
        raise BadRequest("The client closed the connection while sending the body.", 499) from None
    except asyncio.TimeoutError:
        raise BadRequest(
            f"The request body did not arrive within {seconds:g} s (--body-timeout); "
            f"{size} bytes came.", 408,
        ) from None  # fmt: skip
    return b"".join(chunks)


def _too_large(limits, what):
    return BadRequest(
        f"The request body is too large ({what}); this server takes at most "
        f"{limits.max_body_bytes} bytes (--max-body-bytes).", 413,
    )  # fmt: skip


async def annotated(parsed, deadline, limits):
    """The request's sentences with its glossary's terms annotated: in a thread, so
    that the event loop (health checks, other requests) goes on meanwhile, and within
    the request's deadline (`asyncio.TimeoutError` after; the matching itself, bounded
    by the glossary's limits, ends in the thread). The annotated sentences are held to
    `--max-work` again: terms written into a sentence make it longer."""
    if parsed.glossary is None:
        return parsed.sentences
    from keras_transformer.terminology import annotate_all

    seconds = max(0.0, deadline - asyncio.get_running_loop().time())
    work = asyncio.to_thread(annotate_all, parsed.sentences, parsed.glossary)
    sentences = await asyncio.wait_for(work, seconds)
    beam = parsed.settings["beam_size"]
    total = sum(len(s) for s in sentences) * beam
    if total > limits.max_work:
        raise limits.over(
            "max_work",
            "The request with its glossary's terms",
            f"{total} characters x beam ({beam})",
        )
    return sentences


def _client(request):
    """Who sent `request`, for its share of the queue: its address (bounded: behind
    `--trusted-proxies` it is what X-Forwarded-For says)."""
    return request.client.host[:64] if request.client else None


def make_app(model_name, server, limits, engine, metrics, access_log=True, access=None):
    """The Starlette application over a `versions.ModelServer` (`build_app`
    makes both from the command line's arguments): the routes, TF Serving's JSON
    error for every status the app answers, and the `Access` checks (Host, Origin)
    before any route; `limits`: a `requests.Limits`."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException

    from keras_transformer.serving.access import Access, AccessCheck
    from keras_transformer.serving.metrics import AccessLog

    async def http_error(request, exc):
        return error_response(f"{exc.detail} ({request.method} {request.url.path[:200]})",
                              exc.status_code)  # fmt: skip

    async def server_error(request, exc):
        logger.error("Unhandled: %s: %s", type(exc).__name__, exc)
        return error_response("Internal server error.", 500)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await server.start()  # the versions load before uvicorn listens
        yield
        await server.stop()  # after the requests in flight (uvicorn's graceful shutdown)

    handlers = Handlers(model_name, server, limits, engine, metrics)
    app = Starlette(
        routes=handlers.routes(), lifespan=lifespan,
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )  # fmt: skip
    checked = AccessCheck(app, access or Access.local(), error_response)
    return AccessLog(checked, metrics, enabled=access_log)


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
