"""The versions `keras-transformer-serve` serves: each with its workers and its queue.

    server = ModelServer("saved_models/transformer_de_en/onnx", EngineConfig("onnx"),
                         workers=2, queue_factory=lambda: RequestQueue(...),
                         metrics=Metrics(), policy=VersionPolicy("latest", 1))
    await server.start()          # loads the policy's versions (before the server listens)
    served = server.get()         # the newest version served (`get(3)`: version 3)
    request = served.queue.put(sentences, settings, timeout, rows)  # then await its future
    server.status()               # TF Serving's model_version_status
    server.drain()                # SIGTERM: no new workers or versions; batches go on
    await server.stop()

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
import dataclasses
import logging
import os

from keras_transformer.serving.served import ServedVersion
from keras_transformer.serving.workers import (  # noqa: F401 - Worker(Lost): the old module's
    STOP_SECONDS,
    Worker,
    WorkerLost,
    wait_or_kill,
)

logger = logging.getLogger("keras_transformer.serve")


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


class ModelServer:
    """The versions served, and every version's state (TF Serving's
    `model_version_status`).

    Args:
        export_dir: an export, or a folder of its integer version folders (polled).
        config: `engines.EngineConfig`, how each worker loads its translator.
        workers: translation processes per version.
        queue_factory: `() -> serving_queue.RequestQueue`, one per version.
        metrics: `metrics.Metrics`.
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
