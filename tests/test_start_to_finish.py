"""docs/start_to_finish.md runs: every command of its bash blocks, in order, in a
fresh folder holding `my_corpus/` (a tiny number corpus), with `train.py` given a
tiny model and budget. A command that fails, or whose output is not what the page
says it makes, fails the test: the server's answer, to curl and to client_rest.py, is
the ONNX export's own translation (`OnnxTranslator`), not the sentence sent
(`tests/mutations.py server_echoes`)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from export_fixtures import onnx_jobs
from ports import HeldPort
from translation_fixtures import number_pairs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "start_to_finish.md")
# What the page's `python train.py` gets here: the tiny preset with one encoder and one
# decoder layer for a few steps, and no export at the end (the SavedModel and
# CTranslate2 exports of a trained run have their own tests; the page's export command
# writes the ONNX version it serves). The test's time is that export's: tf2onnx
# converts a one-layer search graph in 55 s, a two-layer one in 91 s (2-core CPU), and
# nothing checked here depends on depth.
TINY = (
    "--preset tiny --encoder-layers 1 --decoder-layers 1 --vocab-size 64 --batch-tokens 256 "
    "--epochs 2 --steps 10 --dtype-policy float32 --no-jit-compile --validation-bleu-every 0 "
    "--no-export"
)

pytestmark = pytest.mark.slow


def bash_commands(text):
    """The commands of the ```bash blocks, in order (comments and blank lines out)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        commands += [line for line in block.splitlines() if line.strip() and line[0] != "#"]
    return commands


def _write(folder, split, pairs):
    for side, language in ((0, "de"), (1, "en")):
        text = "".join(pair[side] + "\n" for pair in pairs)
        (folder / f"{split}.{language}").write_text(text, encoding="utf-8")


@pytest.fixture
def port():
    """The server's port, held until the test ends (ports.py)."""
    with HeldPort() as number:
        yield str(number)


def test_every_command_of_the_start_to_finish_page_runs(tmp_path, port):
    corpus = tmp_path / "my_corpus"
    corpus.mkdir()
    for split, count, seed in (("train", 600, 1), ("valid", 30, 2), ("test", 20, 3)):
        _write(corpus, split, number_pairs(count, seed=seed))
    os.symlink(os.path.join(ROOT, "train.py"), tmp_path / "train.py")
    os.symlink(os.path.join(ROOT, "export"), tmp_path / "export")
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], PYTHONUNBUFFERED="1")
    env.update(KERAS_BACKEND="tensorflow")
    env.pop("TF_CONFIG", None)

    with open(PAGE, encoding="utf-8") as f:
        commands = bash_commands(f.read())
    assert len(commands) >= 10, commands
    server, outputs = None, {}
    try:
        for command in commands:
            run = command.replace("python train.py", f"python train.py {TINY}")
            run = run.replace("8601", port)
            if run.endswith("&"):  # the server: started, then waited for
                server = subprocess.Popen(
                    ["bash", "-c", f"exec {run[:-1]}"], cwd=tmp_path, env=env,
                    stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
                _wait_for(port, server)
                continue
            result = subprocess.run(
                ["bash", "-c", run], cwd=tmp_path, env=env, capture_output=True, text=True,
                timeout=900,
            )  # fmt: skip
            assert result.returncode == 0, f"{command}\n{result.stderr[-3000:]}"
            outputs[command] = result.stdout
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)

    report = json.loads((tmp_path / "runs/mine/corpus.json").read_text())["report"]
    assert report["train"]["pairs"] == 600 and "warnings" in report
    info = json.loads((tmp_path / "runs/mine/run.json").read_text())
    assert info["metrics"]["test"]["segments"] == 20
    for name in ("hypotheses.en", "greedy.en"):
        assert len((tmp_path / name).read_text().splitlines()) == 20, name
    sacrebleu = next(out for cmd, out in outputs.items() if cmd.startswith("sacrebleu"))
    assert '"name": "BLEU"' in sacrebleu and '"name": "chrF2"' in sacrebleu
    # The export command wrote one version (here the first: training did not export).
    assert sorted(os.listdir(tmp_path / "saved_models/mine/onnx")) == ["1"]
    served = json.loads(next(out for cmd, out in outputs.items() if cmd.startswith("curl")))
    (translation,) = served["predictions"]
    client = next(out for cmd, out in outputs.items() if "client_rest.py" in cmd)
    assert client.strip() == f"haus katze\n  -> {translation}"
    # Both are the served export's translation, which is not the sentence itself.
    onnx = str(tmp_path / "saved_models/mine/onnx/1")
    job = {"name": "haus katze", "call": "translate", "sentences": ["haus katze"]}
    assert onnx_jobs(onnx, [job])["haus katze"] == {"value": [translation]}
    assert translation.strip() and translation != "haus katze", translation


def _wait_for(port, process):
    deadline = time.time() + 180
    while time.time() < deadline:
        assert process.poll() is None, "the server exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/mine", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError("the server did not start in 180 s")
