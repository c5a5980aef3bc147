"""`keras-transformer-serve`'s translation workers and the versions they serve.

    server = ModelServer("saved_models/transformer_de_en/onnx", EngineConfig("onnx"),
                         workers=2, queue_factory=lambda: RequestQueue(...),
                         metrics=Metrics(), policy=VersionPolicy("latest", 1))
    await server.start()          # loads the policy's versions (before the server listens)
    served = server.get()         # the newest version served (`get(3)`: version 3)
    request = served.queue.put(sentences, settings, timeout, rows)  # then await its future
    server.status()               # TF Serving's model_version_status
    server.drain()                # SIGTERM: no new workers or versions; batches go on
    await server.stop()

Each worker is a process of its own (`concurrent.futures.ProcessPoolExecutor`
of one process) holding one translator with its own threads
(`serving_engines.EngineConfig.threads`): batches run side by side, one per
worker, and a batch that hangs holds one worker. When a worker's process dies
(a native crash, the OOM killer, a SIGKILL) the executor reports
`BrokenProcessPool`: the requests of its batch are answered 503 and a new
worker replaces it. A batch still running when every one of its requests has
passed its deadline (all answered 504) is killed the same way, since a native
call cannot be interrupted otherwise. Workers ignore SIGINT and SIGTERM (sent
to the whole process group by Ctrl-C and by service managers): the server
stops them itself once the requests in flight are answered.

Per version served (`ServedVersion`): its workers, its queue (bounded in
sentences, `--max-queue`), batching (a batch is formed when a worker is free,
so under load batches grow). Per worker: the translator, its threads, the
batch it runs. In the main process: the metrics and the versions' states.

Versions follow TF Serving's policies (`VersionPolicy`): the latest N (the
default, N = 1), specific versions, or all. Where `export_dir` is a folder
of integer version folders, it is looked at every `poll_seconds`: a version
the policy wants is loaded once its folder has not changed between two looks
(a folder still being copied waits), by a new set of workers while the old
ones serve, then takes traffic; a version the policy no longer wants (a
newer one loaded, its folder removed: the way back to an earlier version)
stops taking requests, finishes those it has, and stops. A version that does
not load is logged and reported (state END with its error), the versions
served go on serving, and it is tried again when its folder changes.
"""

import asyncio
import concurrent.futures
import dataclasses
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
    (polled for new ones; names of ASCII digits only), or one export (its folder name's
    version, else 1)."""
    markers = ("config.json", "keras_transformer.json", "saved_model.pb")
    if not os.path.isdir(export_dir):
        raise FileNotFoundError(f"{export_dir!r} is not a folder: give an export or its versions.")
    if any(os.path.isfile(os.path.join(export_dir, name)) for name in markers):
        name = os.path.basename(os.path.normpath(export_dir))
        return {_version_number(name) or 1: export_dir}, False
    found = {}
    for name in os.listdir(export_dir):
        number = _version_number(name)
        if number is not None and os.path.isdir(os.path.join(export_dir, name)):
            found[number] = os.path.join(export_dir, name)
    return found, True


def _version_number(name):
    """The version of a folder name of ASCII digits ("²" and "٣" are not versions), or
    None."""
    if name.isascii() and name.isdigit() and len(name) <= 18:
        return int(name)
    return None


def folder_state(folder, limit=10_000):
    """What changes when a version folder is written: its files' names, sizes and
    modification times (at most `limit` entries; None if it cannot be read)."""
    entries = []
    try:
        for root, _, files in os.walk(folder):
            for name in files:
                path = os.path.join(root, name)
                stat = os.stat(path)
                entries.append((os.path.relpath(path, folder), stat.st_size, stat.st_mtime_ns))
                if len(entries) >= limit:
                    return tuple(sorted(entries))
    except OSError:
        return None
    return tuple(sorted(entries))


@dataclasses.dataclass(frozen=True)
class VersionPolicy:
    """TF Serving's `model_version_policy`: which of the versions found are served.

    Args:
        kind: "latest" (the `count` highest), "specific" (`versions`, those of them
            found), or "all".
        count: with "latest", how many (TF Serving's `num_versions`, default 1).
        versions: with "specific", the version numbers.
    """

    kind: str = "latest"
    count: int = 1
    versions: tuple = ()

    def __post_init__(self):
        if self.kind not in ("latest", "specific", "all"):
            raise ValueError(
                f"The version policy is latest, specific or all. Received: {self.kind!r}"
            )
        if self.kind == "latest" and self.count < 1:
            raise ValueError(f"--latest-versions must be at least 1. Received: {self.count}")
        if self.kind == "specific" and not self.versions:
            raise ValueError("--versions needs at least one version number.")

    def wanted(self, found):
        """The versions of `found` (numbers) to serve, newest first."""
        found = sorted(found, reverse=True)
        if self.kind == "latest":
            return found[: self.count]
        if self.kind == "specific":
            return [v for v in found if v in self.versions]
        return found


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


class ModelServer:
    """The versions served, and every version's state (TF Serving's
    `model_version_status`).

    Args:
        export_dir: an export, or a folder of its integer version folders (polled).
        config: `serving_engines.EngineConfig`, how each worker loads its translator.
        workers: translation processes per version.
        queue_factory: `() -> serving_queue.RequestQueue`, one per version.
        metrics: `serving_metrics.Metrics`.
        poll_seconds: how often a folder of versions is looked at.
        on_fatal: `(message) -> None`, called when no version loads at start.
        policy: a `VersionPolicy` (default: the latest version).

    The versions are loaded before the server listens (`start`), as TF Serving's
    core waits for its initial models, so a client that reaches the server finds
    them `AVAILABLE`.
    """

    MAX_ENDED = 32  # versions that ended, kept in status() (newest first)

    def __init__(self, export_dir, config, workers, queue_factory, metrics, poll_seconds=1.0,
                 on_fatal=None, policy=VersionPolicy()):  # fmt: skip
        self.export_dir = export_dir
        self.config = config
        self.worker_count = workers
        self.queue_factory = queue_factory
        self.metrics = metrics
        self.poll_seconds = poll_seconds
        self.on_fatal = on_fatal
        self.policy = policy
        self.batches = 0  # translate calls, every attempt (for /metadata and the tests)
        self.served = {}  # version -> ServedVersion, loading or loaded
        self.versions = {}  # version -> (state, error message), every version seen
        self.draining = False
        self._failed = {}  # version -> its folder's state when it did not load
        self._seen = {}  # version -> its folder's state at the last look
        self._tasks = set()

    # ---------------------------------------------------------------- what the app asks

    def get(self, version=None):
        """The `ServedVersion` that takes a request for `version` (None: the newest
        available); raises `NotAvailable` naming why."""
        available = {v: s for v, s in self.served.items() if s.state == "AVAILABLE"}
        if version is None:
            if not available:
                raise NotAvailable("No version of the model is available; retry.")
            return available[max(available)]
        if version in available:
            return available[version]
        state = self.versions.get(version, ("not found", ""))[0]
        raise NotAvailable(
            f"Version {version} is {state}: this server serves "
            f"{sorted(available, reverse=True) or 'none'} (its --version-policy)."
        )

    @property
    def version(self):
        """The newest version available (None before the first loads)."""
        available = [v for v, s in self.served.items() if s.state == "AVAILABLE"]
        return max(available) if available else None

    @property
    def info(self):
        version = self.version
        return self.served[version].info if version is not None else None

    @property
    def workers(self):
        return [w for s in self.served.values() for w in s.workers]

    def status(self, version=None):
        """TF Serving's `GET /v1/models/NAME` answer: every version seen, newest first
        (`version`: that one's only)."""
        return {"model_version_status": [
            {"version": str(v), "state": state, "status": {
                "error_code": "UNKNOWN" if message and state == "END" else "OK",
                "error_message": message,
            }}
            for v, (state, message) in sorted(self.versions.items(), reverse=True)
            if version is None or v == version
        ]}  # fmt: skip

    # ---------------------------------------------------------------- life cycle

    async def start(self):
        """Loads the versions the policy wants (one that fails leaves its place to the
        next the policy takes), then polls for changes where `export_dir` is a folder
        of versions; `on_fatal` if none loads."""
        found, polled = version_folders(self.export_dir)
        self._seen = {v: folder_state(f) for v, f in found.items()}
        tried = []
        while not self.served and (wanted := [v for v in self._wanted(found)
                                              if v not in tried]):  # fmt: skip
            for version in wanted:
                tried.append(version)
                await self._load(version, found[version])
        if self.version is None:
            errors = "; ".join(f"version {v}: {self.versions[v][1]}" for v in tried)
            self._fatal(
                f"No version of {self.export_dir} loaded (version policy {self.policy.kind}; "
                f"found {sorted(found)}): {errors or 'none to load'}"
            )
            return
        if polled:
            self.spawn(self._poll())

    def drain(self):
        """The server stops (SIGTERM, Ctrl-C): no worker is restarted and no version
        loaded any more; the batches queued and running go on."""
        self.draining = True

    async def stop(self):
        """After the requests in flight have been answered: stops every worker, and
        waits until each process has exited (killing those still there after
        `STOP_SECONDS`), so that no worker outlives the server."""
        self.draining = True
        for task in list(self._tasks):
            task.cancel()
        pids = [pid for s in self.served.values() for pid in s.pids()]
        for served in self.served.values():
            served.close()
        self.count_workers()
        # The executor's own shutdown (`wait=False`) only asks its process to exit; a
        # server that exits first leaves it running, orphaned, holding its model.
        await asyncio.get_running_loop().run_in_executor(None, wait_or_kill, pids, STOP_SECONDS)

    def spawn(self, coroutine):
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---------------------------------------------------------------- versions

    async def _poll(self):
        while not self.draining:
            await asyncio.sleep(self.poll_seconds)
            try:
                await self._look()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one bad look must not end the polling
                logger.exception("Looking at the versions of %s failed", self.export_dir)

    async def _look(self):
        """One look at the folder of versions: loads what the policy wants once its
        folder is unchanged since the last look, then retires what it no longer wants.
        The policy chooses among the versions that may load: one that failed is left
        out until its folder changes, so a broken newest version leaves the one before
        it served, and removing a version's folder brings back the one before."""
        try:
            found, _ = version_folders(self.export_dir)
        except OSError as error:
            logger.error("Cannot list the versions of %s: %s", self.export_dir, error)
            return
        seen, self._seen = self._seen, {v: folder_state(f) for v, f in found.items()}
        for version in self._wanted(found):
            state = self._seen[version]
            if version in self.served or state is None or seen.get(version) != state:
                continue  # served, unreadable, or still changing: looked at again next time
            await self._load(version, found[version])
            if self.draining:
                return
        wanted = set(self._wanted(found)) & set(self.served)
        if not any(self.served[v].state == "AVAILABLE" for v in wanted):
            return  # nothing wanted has loaded: what is served goes on serving
        for version, served in list(self.served.items()):
            if version not in wanted and served.state == "AVAILABLE":
                served.state = "UNLOADING"  # takes no request from now on
                self.versions[version] = ("UNLOADING", "")
                self.spawn(self._retire(served))

    def _wanted(self, found):
        """The policy's versions among those of `found` that may load (a version that
        failed is left out while its folder stays as it was)."""
        return self.policy.wanted(
            [v for v in found if v not in self._failed or self._failed[v] != self._seen.get(v)]
        )

    async def _load(self, version, folder):
        """Loads `version` in a new set of workers; False if it fails (logged, reported
        as END with the error; the versions served go on)."""
        self.versions[version] = ("LOADING", "")
        logger.info("Loading version %d (%s) in %d workers", version, folder, self.worker_count)
        served = ServedVersion(version, folder, self)
        self.served[version] = served
        try:
            await served.load()
        except Exception as error:  # noqa: BLE001 - reported, the others serve
            del self.served[version]
            self._failed[version] = folder_state(folder)
            message = f"{type(error).__name__}: {error}"
            self._ended(version, message)
            if self.version is not None:
                logger.error(
                    "Version %d (%s) did not load; version %d goes on serving: %s",
                    version, folder, self.version, message,
                )  # fmt: skip
            return False
        self._failed.pop(version, None)
        self.versions[version] = ("AVAILABLE", "")
        self.metrics.version.set(self.version)
        self.count_workers()
        logger.info("Serving version %d (%s)", version, folder)
        return True

    async def _retire(self, served):
        logger.info("Unloading version %d", served.version)
        await served.retire()
        self.served.pop(served.version, None)
        self._ended(served.version, "")
        self.metrics.version.set(self.version or 0)
        self.count_workers()
        logger.info("Version %d unloaded", served.version)

    def _ended(self, version, message):
        self.versions[version] = ("END", message)
        ended = sorted(v for v, (state, _) in self.versions.items() if state == "END")
        for old in ended[: max(0, len(ended) - self.MAX_ENDED)]:
            del self.versions[old]
            self._failed.pop(old, None)

    def _fatal(self, message):
        logger.error("%s", message)
        if self.on_fatal is not None:
            self.on_fatal(message)

    def count_workers(self):
        states = {"loading": 0, "idle": 0, "busy": 0, "lost": 0}
        for worker in self.workers:
            if worker.state in states:
                states[worker.state] += 1
        for state, count in states.items():
            self.metrics.workers.labels(state).set(count)
