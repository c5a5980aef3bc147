"""`keras-transformer-serve`'s Prometheus metrics and structured access log.

Every metric lives in the server's main process (the one that queues and batches
requests), in a registry of its own, and is served at TF Serving's path
`/monitoring/prometheus/metrics` by `prometheus_client`. Sentences per second is
`rate(keras_transformer_serve_sentences_total[1m])`.
"""

import json
import logging
import time

ACCESS_LOGGER = "keras_transformer.serve.access"  # the names of before the package
PREFIX = "keras_transformer_serve_"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MAX_LOGGED_PATH = 200  # characters of a request's path in the access log


class Metrics:
    """The server's metrics (`prometheus_client`), in their own `CollectorRegistry`."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            PREFIX + "requests", "predict requests answered, by HTTP status", ["code"],
            registry=registry,
        )  # fmt: skip
        self.latency = Histogram(
            PREFIX + "request_latency_seconds", "predict requests, arrival to answer",
            buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.batches = Counter(
            PREFIX + "batches", "translate calls (batch attempts) by outcome: ok, error (the "
            "translator raised), worker_lost (the worker process died or was killed)",
            ["outcome"], registry=registry,
        )  # fmt: skip
        self.batch_size = Histogram(
            PREFIX + "batch_size_sentences", "sentences per translate call",
            buckets=BATCH_BUCKETS, registry=registry,
        )  # fmt: skip
        self.sentences = Counter(PREFIX + "sentences", "sentences translated", registry=registry)
        self.queue = Gauge(
            PREFIX + "queue_sentences", "sentences waiting for a worker", registry=registry
        )
        self.dropped = Counter(
            PREFIX + "dropped_requests", "requests taken out of the queue before translation: "
            "expired (their --timeout passed) or disconnected (the client left)",
            ["reason"], registry=registry,
        )  # fmt: skip
        self.rejected = Counter(
            PREFIX + "rejected_requests", "requests answered 503 because the queue was full "
            "(--max-queue)", registry=registry,
        )  # fmt: skip
        self.workers = Gauge(
            PREFIX + "worker_processes", "worker processes by state", ["state"], registry=registry
        )
        self.worker_restarts = Counter(
            PREFIX + "worker_restarts", "workers replaced: crashed (the process died) or hung "
            "(killed after every request of its batch had timed out)", ["reason"],
            registry=registry,
        )  # fmt: skip
        self.version = Gauge(
            PREFIX + "model_version", "the version being served", registry=registry
        )
        for outcome in ("ok", "error", "worker_lost"):
            self.batches.labels(outcome)
        for reason in ("expired", "disconnected"):
            self.dropped.labels(reason)
        for reason in ("crashed", "hung"):
            self.worker_restarts.labels(reason)

    def exposition(self):
        """`(body, content type)` of the metrics in Prometheus' text format."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class AccessLog:
    """ASGI middleware: one JSON line per HTTP request on the `ACCESS_LOGGER` logger
    (method, path, status, duration, client, and `request.state.log`'s fields:
    sentences, version), and the predict requests' metrics."""

    def __init__(self, app, metrics, enabled=True):
        self.app = app
        self.metrics = metrics
        self.enabled = enabled
        self.logger = logging.getLogger(ACCESS_LOGGER)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        answer = {"status": 500}

        async def sending(message):
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            duration = time.perf_counter() - start
            predict = scope["method"] == "POST" and scope["path"].endswith(":predict")
            if predict:
                self.metrics.requests.labels(str(answer["status"])).inc()
                self.metrics.latency.observe(duration)
            if self.enabled:
                entry = {
                    "method": scope["method"][:16],
                    "path": scope["path"][:MAX_LOGGED_PATH],  # a client's choice: bounded
                    "status": answer["status"],
                    "ms": round(duration * 1000, 1),
                    "client": ":".join(map(str, scope["client"])) if scope.get("client") else None,
                    **scope.get("state", {}).get("log", {}),
                }
                self.logger.info(json.dumps(entry, ensure_ascii=False))
