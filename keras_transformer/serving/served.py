"""One version served by `keras-transformer-serve`: its queue, its workers, and the
batches between them.

    served = ServedVersion(3, "saved_models/m/onnx/3", model_server)
    await served.load()            # its workers, warmed up; then it takes requests
    served.queue.put(sentences, settings, timeout, rows)
    await served.retire()          # takes no more, answers what it has, stops

A batch is formed whenever a worker of the version is free (`_dispatch`), so under
load batches grow towards `--max-batch`. A batch in which the translator raises
is retried request by request on the same worker, so only a request that fails
by itself gets the error; a worker that dies is replaced (0.5 s, doubling to 30 s
between tries while it does not start), except while the server drains.
"""

import asyncio
import logging

from keras_transformer.serving.queue import batch_settings
from keras_transformer.serving.workers import Worker, WorkerLost

logger = logging.getLogger("keras_transformer.serve")


class ServedVersion:
    """One version's workers and the queue they take batches from.

    States (TF Serving's): LOADING, AVAILABLE (takes requests), UNLOADING (takes
    none, finishes those it has), END. `queue` is this version's `RequestQueue`.
    """

    def __init__(self, version, folder, server):
        self.version = version
        self.folder = folder
        self.server = server  # the ModelServer: config, metrics, draining
        self.queue = server.queue_factory()
        self.workers = []
        self.info = None  # worker_load's answer (beam sizes, glossary, steering)
        self.state = "LOADING"
        self._idle = asyncio.Queue()
        self._dispatcher = None

    async def load(self):
        """Starts the workers (their translators warmed up by `load_engine`); raises the
        first error of any, after stopping them all."""
        config, count = self.server.config, self.server.worker_count
        self.workers = [
            Worker(i, self.version, self.folder, config, self._worker_exited) for i in range(count)
        ]
        try:
            results = await asyncio.gather(
                *(w.start() for w in self.workers), return_exceptions=True
            )
        except asyncio.CancelledError:  # the server stops
            self.close(kill=True)
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self.close(kill=True)
            raise errors[0]
        self.info = self.workers[0].info
        for worker in self.workers:
            self._idle.put_nowait(worker)
        self.state = "AVAILABLE"
        self._dispatcher = self.server.spawn(self._dispatch())

    async def retire(self):
        """Takes no more requests, answers those queued and running, then stops."""
        self.state = "UNLOADING"
        while self.queue.sentences or any(w.state == "busy" for w in self.workers):
            await asyncio.sleep(0.05)
        self.close()
        self.state = "END"

    def close(self, kill=False):
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        for worker in self.workers:
            if worker.state != "stopped":
                worker.close(kill=kill or worker.state in ("busy", "loading"))

    def pids(self):
        return [w.pid for w in self.workers if w.pid is not None]

    # ---------------------------------------------------------------- batches

    async def _dispatch(self):
        """Forms a batch whenever a worker is free and sends it there."""
        while True:
            await self.queue.ready()
            worker = await self._idle.get()
            if worker.state != "idle" or worker not in self.workers:
                continue  # lost while idle (being replaced)
            batch = self.queue.take()
            if not batch:  # every waiting request left meanwhile
                self._idle.put_nowait(worker)
                continue
            worker.state = "busy"
            self.server.count_workers()
            self.server.spawn(self._run(worker, batch))

    async def _run(self, worker, batch):
        try:
            await self._attempt(worker, batch)
        except WorkerLost as lost:
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(lost)
            self._replace(worker)
            return
        if worker.state == "lost":  # its process ended right after the batch
            self._replace(worker)
        elif worker.state == "busy":
            worker.state = "idle"
            self._idle.put_nowait(worker)
        self.server.count_workers()

    async def _attempt(self, worker, batch):
        """Translates `batch` in one call; if the translator raises, each request
        alone, so that only a request that fails by itself gets the error."""
        batch = [r for r in batch if not r.future.done()]  # answered 504 meanwhile
        if not batch:
            return
        metrics = self.server.metrics
        sentences = [s for request in batch for s in request.sentences]
        kill_at = max(request.deadline for request in batch)
        metrics.batch_size.observe(len(sentences))
        self.server.batches += 1
        try:
            translations = await worker.translate(sentences, batch_settings(batch), kill_at)
        except WorkerLost:
            metrics.batches.labels("worker_lost").inc()
            raise
        except Exception as error:  # noqa: BLE001 - answered to the requests, not raised
            metrics.batches.labels("error").inc()
            if len(batch) == 1:
                if not batch[0].future.done():
                    batch[0].future.set_exception(error)
                return
            for request in batch:
                await self._attempt(worker, [request])
            return
        metrics.batches.labels("ok").inc()
        metrics.sentences.inc(len(sentences))
        at = 0
        for request in batch:
            if not request.future.done():
                request.future.set_result(translations[at : at + len(request.sentences)])
            at += len(request.sentences)

    # ---------------------------------------------------------------- replacement

    def _worker_exited(self, worker, was):
        """A worker's process ended by itself. An idle one is replaced now; a busy
        one's batch sees `BrokenProcessPool` and `_run` replaces it."""
        if was == "idle":
            self._replace(worker)

    def _replace(self, worker):
        if worker.replaced:
            return
        worker.replaced = True
        reason = "hung" if worker.hung else "crashed"
        worker.close()
        self.server.metrics.worker_restarts.labels(reason).inc()
        if self.server.draining or self.state not in ("AVAILABLE", "UNLOADING"):
            self.server.count_workers()
            return
        logger.error(
            "Worker %d (pid %s) of version %d %s; starting a new one", worker.index, worker.pid,
            self.version, "was killed: its batch hung" if worker.hung else "died",
        )  # fmt: skip
        self.server.spawn(self._restart(worker.index))

    async def _restart(self, index, delay=0.5):
        """A new worker in place of worker `index`, tried again with a backoff (0.5 s,
        doubling to 30 s) while it does not start."""
        while not self.server.draining and self.state in ("AVAILABLE", "UNLOADING"):
            worker = Worker(index, self.version, self.folder, self.server.config,
                            self._worker_exited)  # fmt: skip
            self.workers[index] = worker
            self.server.count_workers()
            try:
                await worker.start()
            except asyncio.CancelledError:
                worker.close(kill=True)
                raise
            except Exception:  # noqa: BLE001 - logged, tried again
                logger.exception("Worker %d did not restart; trying again in %.1fs", index, delay)
                worker.close(kill=True)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 30.0)
                continue
            self._idle.put_nowait(worker)
            self.server.count_workers()
            return
