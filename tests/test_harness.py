"""The test suite's own machinery does what the suite relies on, and fails without it:
the shared trained fixture seeds itself, a timed-out test leaves no process behind,
a server's port is held until the test ends, and the skip for the two logical CPU
devices fails under `make test`."""

import os
import socket
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from ports import HeldPort

TESTS = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------ the shared fixture's seed


def _fixture_start(tmp_path, monkeypatch, seed, seed_before):
    """What `export_fixtures.make_work_dir` starts training from (its vocabulary, the
    model's weights and a draw of each random generator fit uses), after other tests
    left the generators at `seed(seed_before)`. Training itself is skipped: it adds
    nothing here."""
    import random

    import export_fixtures
    import keras
    import tensorflow as tf

    seed(seed_before)
    start = {}

    def record(model, processor, steps):
        model.build()  # the initial weights, which fit would build
        start["vocabulary"] = processor.serialized_model_proto()
        start["weights"] = [np.array(w) for w in model.get_weights()]
        start["draws"] = [random.random(), np.random.rand(), float(tf.random.uniform(()))]
        start["draws"].append(float(keras.random.uniform(())))

    monkeypatch.setattr(export_fixtures, "_fit_copy_task", record)
    export_fixtures.make_work_dir(str(tmp_path / f"after_{seed_before}"))
    return start


def _same_start(a, b):
    return (
        a["draws"] == b["draws"]
        and a["vocabulary"] == b["vocabulary"]
        and len(a["weights"]) == len(b["weights"]) > 10
        and all(np.array_equal(x, y) for x, y in zip(a["weights"], b["weights"], strict=True))
    )


def test_the_shared_trained_fixture_does_not_depend_on_the_tests_before_it(tmp_path, monkeypatch):
    """Module fixtures are set up before conftest's per-test seed: the fixture seeds
    itself, so its weights are the same whichever tests ran first."""
    import keras

    seed = keras.utils.set_random_seed
    one, two = (_fixture_start(tmp_path, monkeypatch, seed, n) for n in (1, 2))
    assert _same_start(one, two)
    # The mutation: without its own seed, the fixture starts where the tests before it
    # left: other weights, other draws.
    monkeypatch.setattr(keras.utils, "set_random_seed", lambda seed: None)
    one, two = (_fixture_start(tmp_path, monkeypatch, seed, n) for n in (1, 2))
    assert not any(
        np.array_equal(x, y)
        for x, y in zip(one["weights"], two["weights"], strict=True)
        if x.std() > 0
    )
    assert one["draws"] != two["draws"]


# ------------------------------------------------------------ processes after a timeout

HANGS = """
import subprocess, time


def test_hangs():
    child = subprocess.Popen(["bash", "-c", "sleep 300 & echo $! > grandchild.pid; wait"])
    with open("child.pid", "w") as f:
        f.write(str(child.pid))
    time.sleep(60)
"""


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("cleanup", [True, False], ids=["timeout_cleanup", "without"])
def test_a_timed_out_tests_processes_are_killed(tmp_path, cleanup):
    """pytest-timeout stops a test whose child started a grandchild: with
    timeout_cleanup.py (what conftest.py registers) neither is left running; without
    it (the mutation) both are."""
    (tmp_path / "test_hangs.py").write_text(HANGS)
    plugins = ["-p", "timeout_cleanup"] if cleanup else []
    path = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugins,
         "--timeout", "3", "test_hangs.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 1 and "Timeout" in completed.stdout, completed.stdout[-2000:]
    pids = [int((tmp_path / name).read_text()) for name in ("child.pid", "grandchild.pid")]
    try:
        deadline = time.time() + 10
        while cleanup and any(map(_alive, pids)) and time.time() < deadline:
            time.sleep(0.1)
        assert [_alive(pid) for pid in pids] == [not cleanup] * 2
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, 9)


# ----------------------------------------------------------------------------- ports


def _exchange(port):
    """A server on `port` bound as uvicorn binds it (asyncio's `create_server`, which
    sets SO_REUSEADDR), then a client's message to it and the server's echo."""
    import asyncio

    async def echo(reader, writer):
        writer.write(await reader.read(4))
        await writer.drain()
        writer.close()

    async def exchange():
        server = await asyncio.start_server(echo, "127.0.0.1", port)
        async with server:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"ping")
            await writer.drain()
            answer = await reader.read(4)
            writer.close()
            return answer

    return asyncio.run(exchange())


def test_a_held_port_goes_to_the_server_and_to_no_one_else():
    """The server binds a `HeldPort` and alone answers there; a program binding it as
    most do is refused, and no bind to port 0 gets it. Released (the mutation: the old
    bind, close and hand over the number), it is anyone's."""
    held = HeldPort()
    try:
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", held.port))
        others = [socket.socket() for _ in range(50)]
        for s in others:
            s.bind(("127.0.0.1", 0))
        assert held.port not in {s.getsockname()[1] for s in others}
        for s in others:
            s.close()
        assert _exchange(held.port) == b"ping"
    finally:
        held.close()
    released = HeldPort()
    released.close()
    with socket.socket() as other:
        other.bind(("127.0.0.1", released.port))


# ------------------------------------------------------- skips that fail under make test


def test_the_two_device_skip_fails_under_make_test(monkeypatch):
    """test_distribution.py skips when the two logical CPU devices conftest.py sets up
    are missing: a broken set-up, which `make test` (KERAS_TRANSFORMER_REQUIRE_EXTRAS=1)
    fails, while a skip for another backend stays a skip."""
    import conftest
    import tensorflow as tf
    import test_distribution

    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: ["CPU:0"])
    with pytest.raises(pytest.skip.Exception) as skipped:
        test_distribution._strategy()
    report = types.SimpleNamespace(
        skipped=True, longrepr=("test_distribution.py", 43, f"Skipped: {skipped.value}")
    )
    backend = types.SimpleNamespace(
        skipped=True,
        longrepr=("test_distribution.py", 15, "Skipped: tf.distribute.MirroredStrategy"),
    )
    monkeypatch.setattr(conftest, "REQUIRE_EXTRAS", True)
    assert conftest._fails_under_make_test(report)
    assert not conftest._fails_under_make_test(backend)
    monkeypatch.setattr(conftest, "REQUIRE_EXTRAS", False)
    assert not conftest._fails_under_make_test(report)
