"""`keras-transformer-serve`'s translation workers and the versions they serve.

    server = ModelServer("saved_models/transformer_de_en/onnx", EngineConfig("onnx"),
                         workers=2, queue=RequestQueue(...), metrics=Metrics())
    await server.start()          # loads the newest version (before the server listens)
    request = server.queue.put(sentences, settings, timeout, rows)  # then await its future
    server.status()               # TF Serving's model_version_status
    await server.stop()

Each worker is a process of its own (`concurrent.futures.ProcessPoolExecutor`
of one process) holding one translator with its own threads
(`serving_engines.EngineConfig.threads`): batches run side by side, one per
worker, and a batch that hangs holds one worker. When a worker's process dies
(a native crash, the OOM killer, a SIGKILL) the executor reports
`BrokenProcessPool`: the requests of its batch are answered 503 and a new
worker replaces it. A batch still running when every one of its requests has
passed its deadline (all answered 504) is killed the same way, since a native
call cannot be interrupted otherwise.

Global, in the main process: the queue and its bound, batching (a batch is
formed when a worker is free, so under load batches grow), the metrics, and
the version served (every worker serves the same one). Per worker: the
translator, its threads, the batch it runs.

Versions follow TF Serving's default policy (the latest): where `export_dir`
is a folder of integer version folders, it is looked at every
`poll_seconds`; a higher version is loaded by a new set of workers while the
old ones serve, then swapped in: the old workers finish their batches and
stop. A version that does not load is logged and reported (state END with
its error) and the old one goes on serving.
"""

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
import select
import signal
import time

from keras_transformer.serving_engines import worker_load, worker_translate
from keras_transformer.serving_queue import batch_settings

logger = logging.getLogger("keras_transformer.serve")
STOP_SECONDS = 5.0  # how long stopping waits for an idle worker to exit before killing it


class WorkerLost(RuntimeError):
    """The worker process translating a request died: answered 503 with Retry-After."""


class NotAvailable(RuntimeError):
    """No version is loaded yet: answered 503 with Retry-After."""


def version_folders(export_dir):
    """`({version: folder}, polled)`: a folder of TF Serving's integer version folders
    (polled for new ones), or one export (its folder name's version, else 1)."""
    markers = ("config.json", "keras_transformer.json", "saved_model.pb")
    if not os.path.isdir(export_dir):
        raise FileNotFoundError(f"{export_dir!r} is not a folder: give an export or its versions.")
    if any(os.path.isfile(os.path.join(export_dir, name)) for name in markers):
        name = os.path.basename(os.path.normpath(export_dir))
        return {int(name) if name.isdigit() else 1: export_dir}, False
    found = {
        int(name): os.path.join(export_dir, name)
        for name in os.listdir(export_dir)
        if name.isdigit() and os.path.isdir(os.path.join(export_dir, name))
    }
    return found, True


class Worker:
    """One translation process and its translator, serving one version.

    States: "loading", "idle", "busy", "lost" (its process died), "stopped".
    """

    def __init__(self, index, version, version_dir, config, on_exit):
        self.index = index
        self.version = version
        self.version_dir = version_dir
        self.config = config
        self.on_exit = on_exit  # called (in the event loop) when the process ends by itself
        self.state = "loading"
        self.pid = None
        self.info = None
        self.batches = 0
        self.hung = False  # killed for running past its batch's deadlines
        self.replaced = False
        self._executor = None
        self._pidfd = None

    async def start(self):
        """Starts the process and loads the translator there (its errors are raised)."""
        context = multiprocessing.get_context("spawn")  # no fork of a threaded server
        self._executor = concurrent.futures.ProcessPoolExecutor(1, mp_context=context)
        future = self._executor.submit(worker_load, self.version_dir, self.config)
        self.info = await asyncio.wrap_future(future)
        self.pid = self.info["pid"]
        # The process's exit, seen by the event loop even while the worker is idle.
        self._pidfd = os.pidfd_open(self.pid)
        asyncio.get_running_loop().add_reader(self._pidfd, self._exited)
        self.state = "idle"

    async def translate(self, sentences, settings, kill_at):
        """One batch in the worker; the process is killed at `kill_at` (loop time) if
        still running. Raises `WorkerLost` if the process dies meanwhile."""
        loop = asyncio.get_running_loop()
        try:
            future = asyncio.wrap_future(
                self._executor.submit(worker_translate, sentences, settings)
            )
            done, _ = await asyncio.wait({future}, timeout=max(0.0, kill_at - loop.time()))
            if not done:
                self.hung = True
                self.kill()
            return await future
        except concurrent.futures.process.BrokenProcessPool as error:
            self.state = "lost"
            raise WorkerLost(
                f"The worker process translating this request (pid {self.pid}) "
                + ("was killed: it ran past the deadline of every request of its batch."
                   if self.hung else "stopped (a native crash, or it was killed).")
                + " It is being replaced; retry."
            ) from error  # fmt: skip
        finally:
            self.batches += 1

    def kill(self):
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self, kill=False):
        """Stops the process: after its current batch, or at once with `kill`."""
        if self.state != "lost":
            self.state = "stopped"
        self._unwatch()
        if kill or self.hung:
            self.kill()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _unwatch(self):
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def _exited(self):
        self._unwatch()
        if self.state in ("idle", "busy"):
            was, self.state = self.state, "lost"
            self.on_exit(self, was)

    def describe(self):
        return {"index": self.index, "pid": self.pid, "state": self.state,
                "version": str(self.version), "batches": self.batches}  # fmt: skip


def wait_or_kill(pids, seconds):
    """Waits up to `seconds` in all for the processes `pids` to exit, then SIGKILLs
    those still running. Waits on pidfds: nothing is reaped (their executors do that)."""
    fds = {}
    for pid in pids:
        try:
            fds[pid] = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone
            continue
    deadline = time.monotonic() + seconds
    try:
        pending = dict(fds)
        while pending and (remaining := deadline - time.monotonic()) > 0:
            exited, _, _ = select.select(list(pending.values()), [], [], remaining)
            pending = {pid: fd for pid, fd in pending.items() if fd not in exited}
        for pid in pending:
            logger.warning("Worker process %d did not exit when stopped: killed.", pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    finally:
        for fd in fds.values():
            os.close(fd)


class ModelServer:
    """The workers of the served version, the queue they take batches from, and the
    versions' states (TF Serving's `model_version_status`).

    Args:
        export_dir: an export, or a folder of its integer version folders (polled).
        config: `serving_engines.EngineConfig`, how each worker loads its translator.
        workers: translation processes.
        queue: the `serving_queue.RequestQueue` batches are taken from.
        metrics: `serving_metrics.Metrics`.
        poll_seconds: how often a folder of versions is looked at for a new one.
        on_fatal: `(message) -> None`, called when the first version does not load.

    Every version seen is in `status()`: a new one is `LOADING` while the old one
    serves. The first is loaded before the server listens (`start`), as TF Serving
    does, so a client that reaches the server finds it `AVAILABLE`.
    """

    def __init__(self, export_dir, config, workers, queue, metrics, poll_seconds=1.0,
                 on_fatal=None):  # fmt: skip
        self.export_dir = export_dir
        self.config = config
        self.worker_count = workers
        self.queue = queue
        self.metrics = metrics
        self.poll_seconds = poll_seconds
        self.on_fatal = on_fatal
        self.version = None  # the version served (None: loading the first)
        self.batches = 0  # translate calls, every attempt (for /metadata and the tests)
        self.info = None  # worker_load's answer of the version served
        self.workers = []  # the served version's
        self.versions = {}  # version -> (state, error message)
        self._idle = asyncio.Queue()
        self._retiring = []  # old versions' workers finishing their batches
        self._tasks = set()
        self._stopping = False

    # ---------------------------------------------------------------- life cycle

    async def start(self):
        """Loads the newest version, then serves it and polls for new versions where
        `export_dir` is a folder of versions. The application awaits it before the
        server listens, as TF Serving's core waits for its initial models; if the
        version does not load, `on_fatal` is called."""
        found, polled = version_folders(self.export_dir)
        if not found:
            self._fatal(f"{self.export_dir!r} holds no export and no integer version folder.")
            return
        newest = max(found)
        if not await self._load_version(newest, found[newest]):
            _, message = self.versions[newest]
            self._fatal(f"Version {newest} of {self.export_dir} did not load: {message}")
            return
        self._spawn(self._dispatch())
        if polled:
            self._spawn(self._poll())

    async def stop(self):
        """After the requests in flight have been answered: stops every worker, and
        waits until each process has exited (killing those still there after
        `STOP_SECONDS`), so that no worker outlives the server."""
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        stopping = [w for w in self.workers + self._retiring if w.state != "stopped"]
        pids = [w.pid for w in stopping if w.pid is not None]
        for worker in stopping:
            worker.close(kill=worker.state in ("busy", "loading"))
        self._count_workers()
        # The executor's own shutdown (`wait=False`) only asks its process to exit; a
        # server that exits first leaves it running, orphaned, holding its model.
        await asyncio.get_running_loop().run_in_executor(None, wait_or_kill, pids, STOP_SECONDS)

    def _spawn(self, coroutine):
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---------------------------------------------------------------- versions

    async def _poll(self):
        while True:
            await asyncio.sleep(self.poll_seconds)
            try:
                found, _ = version_folders(self.export_dir)
            except OSError as error:
                logger.error("Cannot list the versions of %s: %s", self.export_dir, error)
                continue
            new = [v for v in found if v > self.version and v not in self.versions]
            if new:
                await self._load_version(max(new), found[max(new)])

    async def _load_version(self, version, folder):
        """Loads `version` in a new set of workers and swaps it in; False if it fails
        (logged, reported as END with the error; the version served stays)."""
        self.versions[version] = ("LOADING", "")
        logger.info("Loading version %d (%s) in %d workers", version, folder, self.worker_count)
        workers = [
            Worker(i, version, folder, self.config, self._worker_exited)
            for i in range(self.worker_count)
        ]
        try:
            results = await asyncio.gather(*(w.start() for w in workers), return_exceptions=True)
        except asyncio.CancelledError:  # the server stops
            for worker in workers:
                worker.close(kill=True)
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors or self._stopping:
            for worker in workers:
                worker.close(kill=True)
            message = "; ".join(sorted({f"{type(e).__name__}: {e}" for e in errors}))
            self.versions[version] = ("END", message or "the server stopped")
            if self.version is not None:
                logger.error(
                    "Version %d (%s) did not load; version %d goes on serving: %s",
                    version, folder, self.version, message,
                )  # fmt: skip
            return False
        old, old_version = self.workers, self.version
        self.workers, self.version, self.info = workers, version, workers[0].info
        while not self._idle.empty():  # the old version's idle workers leave the line
            self._idle.get_nowait()
        for worker in workers:
            self._idle.put_nowait(worker)
        self.versions[version] = ("AVAILABLE", "")
        self.metrics.version.set(version)
        self._count_workers()
        logger.info("Serving version %d (%s)", version, folder)
        if old_version is not None:
            self.versions[old_version] = ("UNLOADING", "")
            self._retiring.extend(old)
            self._spawn(self._retire(old, old_version))
        return True

    async def _retire(self, workers, version):
        """The old version's workers finish their batches, then stop."""
        while any(w.state == "busy" for w in workers):
            await asyncio.sleep(0.05)
        for worker in workers:
            if worker.state != "stopped":
                worker.close()
            self._retiring.remove(worker)
        self.versions[version] = ("END", "")
        logger.info("Version %d unloaded", version)

    def status(self):
        """TF Serving's `GET /v1/models/NAME` answer: every version seen, newest first."""
        return {"model_version_status": [
            {"version": str(version), "state": state, "status": {
                "error_code": "UNKNOWN" if message and state == "END" else "OK",
                "error_message": message,
            }}
            for version, (state, message) in sorted(self.versions.items(), reverse=True)
        ]}  # fmt: skip

    def _fatal(self, message):
        logger.error("%s", message)
        if self.on_fatal is not None:
            self.on_fatal(message)

    # ---------------------------------------------------------------- batches

    async def _dispatch(self):
        """Forms a batch whenever a worker is free and sends it there."""
        while True:
            await self.queue.ready()
            worker = await self._idle.get()
            if worker.state != "idle" or worker.version != self.version:
                continue  # lost while idle (being replaced), or of an old version
            batch = self.queue.take()
            if not batch:  # every waiting request left meanwhile
                self._idle.put_nowait(worker)
                continue
            worker.state = "busy"
            self._count_workers()
            self._spawn(self._run(worker, batch))

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
            if worker.version == self.version:
                self._idle.put_nowait(worker)
        self._count_workers()

    async def _attempt(self, worker, batch):
        """Translates `batch` in one call; if the translator raises, each request
        alone, so that only a request that fails by itself gets the error."""
        batch = [r for r in batch if not r.future.done()]  # answered 504 meanwhile
        if not batch:
            return
        sentences = [s for request in batch for s in request.sentences]
        kill_at = max(request.deadline for request in batch)
        self.metrics.batch_size.observe(len(sentences))
        self.batches += 1
        try:
            translations = await worker.translate(sentences, batch_settings(batch), kill_at)
        except WorkerLost:
            self.metrics.batches.labels("worker_lost").inc()
            raise
        except Exception as error:  # noqa: BLE001 - answered to the requests, not raised
            self.metrics.batches.labels("error").inc()
            if len(batch) == 1:
                if not batch[0].future.done():
                    batch[0].future.set_exception(error)
                return
            for request in batch:
                await self._attempt(worker, [request])
            return
        self.metrics.batches.labels("ok").inc()
        self.metrics.sentences.inc(len(sentences))
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
        self.metrics.worker_restarts.labels(reason).inc()
        if self._stopping or worker.version != self.version:
            self._count_workers()
            return
        logger.error(
            "Worker %d (pid %s) %s; starting a new one",
            worker.index, worker.pid, "was killed: its batch hung" if worker.hung else "died",
        )  # fmt: skip
        self._spawn(self._restart(worker.index, worker.version, worker.version_dir))

    async def _restart(self, index, version, folder):
        delay = 0.5
        while not self._stopping and version == self.version:
            worker = Worker(index, version, folder, self.config, self._worker_exited)
            self.workers[index] = worker
            self._count_workers()
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
            if version == self.version:
                self._idle.put_nowait(worker)
            else:
                worker.close()
            self._count_workers()
            return

    def _count_workers(self):
        states = {"loading": 0, "idle": 0, "busy": 0, "lost": 0}
        for worker in self.workers:
            if worker.state in states:
                states[worker.state] += 1
        for state, count in states.items():
            self.metrics.workers.labels(state).set(count)
