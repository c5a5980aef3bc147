"""The requests waiting for a worker in `keras-transformer-serve`: one queue for the
whole server, bounded in sentences, from which batches are taken.

    queue = RequestQueue(max_batch=64, max_wait_ms=5, max_queue=2048, metrics=Metrics())
    request = queue.put(["Das Haus ist klein."], {"beam_size": 4}, timeout=30)  # QueueFull
    queue.put(["Guten Morgen."], {"beam_size": 4}, 30, rows={"target_prefix": ["Good"]})
    await queue.ready()    # a batch is worth taking (full, or its first request waited)
    batch = queue.take()   # the oldest request and those with its settings that fit
    batch_settings(batch)  # the translate call's settings, per-sentence rows joined
    queue.abandon(request, "expired")  # its client stopped waiting: out of the queue

Two kinds of request settings: `settings` are the batch's (the search's beam
size and alpha, sampling's top-k and temperature: the graph takes one value
per call), so only requests with equal settings share a batch; `rows` are per
sentence (a forced prefix, banned words, sampling seeds: the steered graph
takes them per row), so requests with different rows share one. A request
with rows (a steered one) never shares a batch with one without: the two run
different graphs (translate_steered.onnx is float32 also where the server
serves int8), and a plain request must get the same answer in any batch.

A request whose deadline passes or whose client disconnects is taken out of the
queue at that moment (counted by reason), so no worker translates it; a request
already in a batch runs to the end of that batch.
"""

import asyncio
import collections
import dataclasses

# Per-sentence steering (`Request.rows`) and the value of a sentence whose request
# does not give it, in a batch with others that do: "" forces no prefix, [] bans
# nothing. "seed" has none: requests that sample share their settings (top-k and
# temperature), and each of them has its seeds.
ROW_DEFAULTS = {"target_prefix": "", "banned": []}


class QueueFull(Exception):
    """The queue holds `--max-queue` sentences: answered 503 with Retry-After."""


@dataclasses.dataclass(eq=False)
class Request:
    """One predict request's sentences on their way through the queue.

    `future` gets the translations (or the error); `queued` is False once the
    request is in a batch or dropped; `deadline` is in the event loop's clock."""

    sentences: list
    settings: dict
    key: tuple  # requests with equal keys (settings, steered or not) share batches
    arrived: float
    deadline: float
    future: asyncio.Future
    queued: bool = True
    rows: dict | None = None  # per-sentence steering: name -> one value per sentence
    client: str | None = None  # who sent it (`RequestQueue.put`)


class RequestQueue:
    """Requests waiting for a worker, at most `max_queue` sentences in all.

    Args:
        max_batch: sentences at most in one batch (a single request may have more).
        max_wait_ms: how long the oldest request waits for others to batch with.
        max_queue: sentences waiting at most; `put` raises `QueueFull` beyond.
        max_client_queue: sentences of one client waiting at most (default `max_queue`).
        metrics: a `metrics.Metrics` (queue depth, dropped and rejected requests).
    """

    def __init__(self, max_batch, max_wait_ms, max_queue, metrics, max_client_queue=None):
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.max_client_queue = max_queue if max_client_queue is None else max_client_queue
        self.metrics = metrics
        self.sentences = 0  # waiting, all settings together
        # Waiting sentences per settings key and per client: only keys with waiting
        # sentences are kept, so client-chosen values (alpha, addresses) cannot grow them.
        self._counts = collections.Counter()
        self._clients = collections.Counter()
        self._items = collections.deque()
        self._arrival = asyncio.Event()

    def put(self, sentences, settings, timeout, rows=None, client=None, deadline=None):
        """Queues a request; its `future` gets the translations. Raises `QueueFull`.

        `rows`: per-sentence steering, `{name: [one value per sentence]}` (`ROW_DEFAULTS`'
        names), or None. `client`: who sent it (its address), held to `max_client_queue`
        waiting sentences so that one client cannot fill the queue for the others.
        `deadline`: in the event loop's clock (default: now + `timeout`), for a request
        whose clock started when its first byte arrived."""
        if self.sentences + len(sentences) > self.max_queue:
            self.metrics.rejected.inc()
            raise QueueFull(
                f"The server is overloaded: {self.sentences} sentences are waiting and it "
                f"queues at most {self.max_queue} (--max-queue). Retry later."
            )
        waiting = self._clients[client]
        if client is not None and waiting + len(sentences) > self.max_client_queue:
            self.metrics.rejected.inc()
            raise QueueFull(
                f"This client has {waiting} sentences waiting and may queue at most "
                f"{self.max_client_queue} (--max-client-queue). Retry later."
            )
        loop = asyncio.get_running_loop()
        now = loop.time()
        # Batches are keyed on the settings and on whether the request is steered, not on
        # its rows.
        key = (tuple(sorted(settings.items())), rows is not None)
        request = Request(
            sentences, settings, key, now, now + timeout if deadline is None else deadline,
            loop.create_future(), rows=rows, client=client,
        )  # fmt: skip
        self._items.append(request)
        self._count(request, +1)
        self._arrival.set()
        return request

    def abandon(self, request, reason):
        """The client stopped waiting (`reason`: "expired" or "disconnected"): the
        request leaves the queue, counted, if no batch has taken it yet."""
        if not request.future.done():
            request.future.cancel()
        if request.queued:
            self._items.remove(request)
            self._drop(request, reason)

    async def ready(self):
        """Returns once a batch is worth taking: `max_batch` sentences with the oldest
        request's settings are waiting, or the oldest has waited `max_wait_ms`."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._items:
                self._arrival.clear()
                await self._arrival.wait()
                continue
            head = self._items[0]
            remaining = head.arrived + self.max_wait - loop.time()
            if self._counts[head.key] >= self.max_batch or remaining <= 0:
                return
            self._arrival.clear()
            try:
                await asyncio.wait_for(self._arrival.wait(), remaining)
            except asyncio.TimeoutError:  # TimeoutError from Python 3.11 on, not before
                return

    def take(self):
        """The next batch: the oldest request and the later ones with its settings, in
        order, while they fit in `max_batch` sentences; expired ones are dropped."""
        now = asyncio.get_running_loop().time()
        batch, kept, count = [], collections.deque(), 0
        while self._items:
            request = self._items.popleft()
            if now >= request.deadline:
                if not request.future.done():
                    request.future.set_exception(TimeoutError("expired in the queue"))
                self._drop(request, "expired")
                continue
            fits = count + len(request.sentences) <= self.max_batch
            if not batch or (request.key == batch[0].key and fits):
                request.queued = False
                self._count(request, -1)
                batch.append(request)
                count += len(request.sentences)
                if count >= self.max_batch:
                    break
            else:
                kept.append(request)
        kept.extend(self._items)
        self._items = kept
        return batch

    def _count(self, request, sign):
        n = sign * len(request.sentences)
        self.sentences += n
        for counts, key in ((self._counts, request.key), (self._clients, request.client)):
            counts[key] += n
            if counts[key] <= 0:
                del counts[key]
        self.metrics.queue.inc(n)  # the gauge sums the queues of every version served

    def _drop(self, request, reason):
        request.queued = False
        self._count(request, -1)
        self.metrics.dropped.labels(reason).inc()


def batch_settings(batch):
    """The translate call's settings for `batch` (requests with one key): the
    requests' shared settings, and each per-sentence row name any of them gives,
    joined in the batch's sentence order (`ROW_DEFAULTS` for a request without it)."""
    settings = dict(batch[0].settings)
    names = {name for request in batch for name in request.rows or {}}
    for name in sorted(names):
        joined = []
        for request in batch:
            given = (request.rows or {}).get(name)
            if given is None:
                given = [ROW_DEFAULTS[name]] * len(request.sentences)
            joined.extend(given)
        settings[name] = joined
    return settings
