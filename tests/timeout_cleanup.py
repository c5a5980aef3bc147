"""A test's child processes are killed when pytest-timeout stops the test.

pytest-timeout (its `signal` method, the default on Linux) fails a test that runs
past `timeout` by raising in the test. `subprocess.run` then kills its own child,
but not that child's children (train.py's planning process, an exporter's
subprocess), and a `Popen` the test holds (two training processes, a server) is
not killed at all: they would go on using the machine's two cores for the rest
of the session. Here, just before the timeout's failure is raised, every process
descended from pytest that was not there when the test began is killed with
SIGKILL; the whole tree is read from /proc first, so a killed parent's children
cannot escape by being re-parented. Processes that were running before the
test (a module's server) are left alone.

conftest.py registers it (`register`); `pytest -p timeout_cleanup` does too.
pytest-timeout's `thread` method (used off the main thread) ends pytest itself
with `os._exit`, which this does not cover.
"""

import os
import signal

import pytest


def _parents():
    """`{pid: parent pid}` of the living processes, from /proc."""
    processes = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        # "pid (command) state ppid ...": the command may hold ") ".
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":  # a zombie is dead already
            processes[int(name)] = int(fields[1])
    return processes


def descendants(pid=None):
    """Pids of the living processes descended from `pid` (default: this process)."""
    children = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, stack = set(), [os.getpid() if pid is None else pid]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def kill_descendants(spare=()):
    """SIGKILLs this process's descendants but those in `spare`; returns their pids.
    Twice: a process forked between reading the tree and the kills is caught the second time."""
    killed = set()
    for _ in range(2):
        for pid in descendants() - set(spare) - killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            killed.add(pid)
    return killed


class KillChildrenOnTimeout:
    """Wraps the SIGALRM handler pytest-timeout installs for each test."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_timeout_set_timer(self, item, settings):
        running = descendants()  # before the test: not its own
        yield  # pytest-timeout's own implementation sets the timer
        handler = signal.getsignal(signal.SIGALRM)
        if not callable(handler):  # the thread method: no signal handler to wrap
            return

        def kill_then_fail(signum, frame):
            killed = kill_descendants(spare=running)
            if killed:
                item.config.get_terminal_writer().line(
                    f"timeout_cleanup: killed the test's processes {sorted(killed)}"
                )
            handler(signum, frame)

        signal.signal(signal.SIGALRM, kill_then_fail)


def register(config):
    """Registers the plugin where pytest-timeout is installed and /proc can be read."""
    if config.pluginmanager.hasplugin("timeout") and os.path.isdir("/proc/self"):
        if not config.pluginmanager.hasplugin("kill-children-on-timeout"):
            config.pluginmanager.register(KillChildrenOnTimeout(), "kill-children-on-timeout")


def pytest_configure(config):  # `pytest -p timeout_cleanup`
    register(config)
