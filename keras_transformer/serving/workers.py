"""`keras-transformer-serve`'s worker processes: one translator each, in a process of its
own, and how the server stops them.

    worker = Worker(0, version, "saved_models/m/onnx/1", EngineConfig("onnx"), on_exit)
    await worker.start()                       # loads the translator (errors raised)
    await worker.translate(sentences, settings, kill_at)   # WorkerLost if it dies
    worker.close()                              # after its batch; close(kill=True): now
    wait_or_kill([worker.pid], STOP_SECONDS)   # no worker outlives the server

Each worker is a `concurrent.futures.ProcessPoolExecutor` of one process holding
one translator with its own threads (`engines.EngineConfig.threads`). When its
process dies (a native crash, the OOM killer, a SIGKILL) the executor reports
`BrokenProcessPool`: `translate` raises `WorkerLost` and the version it serves
replaces it (`versions.ServedVersion`). A batch still running when every one
of its requests has passed its deadline is killed the same way, since a native
call cannot be interrupted otherwise. Workers ignore SIGINT and SIGTERM (sent to
the whole process group by Ctrl-C and by service managers): the server stops
them itself once the requests in flight are answered.
"""

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
import select
import signal
import time

from keras_transformer.serving.engines import worker_load, worker_translate

logger = logging.getLogger("keras_transformer.serve")
STOP_SECONDS = 5.0  # how long stopping waits for an idle worker to exit before killing it


class WorkerLost(RuntimeError):
    """The worker process translating a request died: answered 503 with Retry-After."""


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
