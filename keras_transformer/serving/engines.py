"""What one `keras-transformer-serve` worker process runs: an engine, its precision,
threads and device, checked before any process starts.

    config = EngineConfig("ctranslate2", precision="int8", threads=1)
    check_engine(config)                  # ValueError naming the engine for a flag it lacks
    loaded = load_engine("saved_models/transformer_de_en/ctranslate2/1", config)
    loaded.translate(["Das Haus ist klein."], {"beam_size": 4})
    loaded.translate(["Das Haus ist klein."], {"beam_size": 4, "target_prefix": ["The"]})

The server (`workers.Worker`) calls `worker_load` and `worker_translate`
in a process of its own: each worker holds one translator, with `threads`
inference threads, and nothing else. Neither TensorFlow nor Keras is imported.
"""

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable

from keras_transformer import terminology

ENGINES = ("onnx", "ctranslate2")
# --precision per engine: the ONNX export's two graphs; CTranslate2's compute types.
PRECISIONS = {
    "onnx": ("float32", "int8"),
    "ctranslate2": (
        "float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "float16", "bfloat16"
    ),
}  # fmt: skip
DEVICES = ("cpu", "cuda")
CTRANSLATE2_BEAM_SIZES = tuple(range(1, 17))  # CTranslate2 searches with any beam
# The steering a request may carry (keras-transformer-serve's fields): what
# translate_steered.onnx takes, and CTranslate2 less per-sentence seeds (its sampling
# draws from its own generator, `ctranslate2.set_random_seed`).
STEERING = ("prefix", "banned", "sampling_topk", "sampling_temperature", "seed")
CTRANSLATE2_STEERING = ("prefix", "banned", "sampling_topk", "sampling_temperature")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """How each worker loads its translator.

    Args:
        engine: "onnx" (`OnnxTranslator`, translate.onnx) or "ctranslate2"
            (`CTranslate2Translator`).
        precision: "float32" or "int8" on both engines (ONNX: translate_int8.onnx;
            CTranslate2: `compute_type="int8"`); CTranslate2's other compute types
            ("int8_float32", "float16", ...) on CTranslate2 only.
        threads: inference threads of one worker (ONNX Runtime's
            `intra_op_num_threads`, CTranslate2's `intra_threads`); 0: the runtime's
            default (one per core).
        device: "cpu" or "cuda" (ONNX Runtime's CUDA provider, CTranslate2's
            `device="cuda"`).
        factory: `(version_dir, config) -> LoadedTranslator`, importable by name (it
            is pickled into the worker processes); None loads `engine`. Tests serve
            a stand-in translator with it.
    """

    engine: str = "onnx"
    precision: str = "float32"
    threads: int = 1
    device: str = "cpu"
    factory: Callable | None = None


@dataclasses.dataclass
class LoadedTranslator:
    """A translator as a worker serves it.

    Args:
        translate: `(sentences, settings dict) -> translations`; settings are
            `beam_size`, optional `alpha` and (CTranslate2) `num_hypotheses`, and the
            steering it takes: `sampling_topk`, `sampling_temperature`, and one value
            per sentence of `target_prefix`, `banned` and `seed` (the translators'
            arguments).
        beam_sizes: the beam sizes a request may ask for.
        default_beam: the export's beam size.
        runtime: what the runtime reports it runs (compute type, threads,
            providers), shown in `/metadata`.
        glossary: whether its vocabulary holds the glossary tags (a model trained
            with `--terminology`), so that a request may carry a glossary.
        steering: the steering fields a request may carry (of `STEERING`): all of
            them for an ONNX export with translate_steered.onnx, none for an older
            one, `CTRANSLATE2_STEERING` for CTranslate2.
    """

    translate: Callable
    beam_sizes: tuple
    default_beam: int
    runtime: dict
    glossary: bool = False
    steering: tuple = ()


def check_engine(config):
    """Raises `ValueError` naming the engine for a flag it cannot honour, and for
    `--device cuda` where the runtime sees no GPU; nothing is loaded."""
    if config.factory is not None:
        return
    engine = config.engine
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {ENGINES}. Received: {engine!r}")
    if config.precision not in PRECISIONS[engine]:
        raise ValueError(
            f"--precision {config.precision} does not apply to --engine {engine}, which "
            f"serves {' or '.join(PRECISIONS[engine])}."
        )
    if not isinstance(config.threads, int) or config.threads < 0:
        raise ValueError(f"--threads must be an integer >= 0. Received: {config.threads!r}")
    if config.device not in DEVICES:
        raise ValueError(f"--device must be one of {DEVICES}. Received: {config.device!r}")
    if engine == "onnx" and config.device == "cuda":
        import onnxruntime

        providers = onnxruntime.get_available_providers()
        if "CUDAExecutionProvider" not in providers:
            raise ValueError(
                "--device cuda: this ONNX Runtime has no CUDAExecutionProvider (it has "
                f"{', '.join(providers)}); install the [onnx-gpu] extra on a machine with "
                "an NVIDIA GPU, or serve with --device cpu."
            )
    if engine == "ctranslate2":
        from keras_transformer.translators.ctranslate2_translator import import_ctranslate2

        ctranslate2 = import_ctranslate2()

        if config.device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
            raise ValueError(
                "--device cuda: CTranslate2 sees no CUDA device "
                "(ctranslate2.get_cuda_device_count() is 0); serve with --device cpu."
            )
        supported = ctranslate2.get_supported_compute_types(config.device)
        if config.precision not in supported:
            raise ValueError(
                f"--precision {config.precision}: --engine ctranslate2 on {config.device} "
                f"computes in {', '.join(sorted(supported))} only."
            )


def load_engine(version_dir, config):
    """The `LoadedTranslator` of an export's version folder, as `config` says."""
    if config.engine == "ctranslate2":
        from keras_transformer.translators.ctranslate2_translator import CTranslate2Translator

        translator = CTranslate2Translator(
            version_dir, compute_type=config.precision, intra_threads=config.threads,
            device=config.device,
        )  # fmt: skip
        runtime = {
            "compute_type": translator.translator.compute_type,
            "device": translator.translator.device,
            "intra_threads": config.threads,
        }
        beam_sizes = CTRANSLATE2_BEAM_SIZES
        tags = translator.processor.encode(list(terminology.TAGS))
        glossary = terminology.tokenizer_has_tags(tags)
        steering = CTRANSLATE2_STEERING
    else:
        from keras_transformer.translators.onnx_translator import OnnxTranslator

        providers = ["CPUExecutionProvider"]
        if config.device == "cuda":
            providers.insert(0, "CUDAExecutionProvider")
        translator = OnnxTranslator(
            version_dir, precision=config.precision, intra_op_num_threads=config.threads,
            providers=providers,
        )  # fmt: skip
        options = translator.session.get_session_options()
        runtime = {
            "precision": translator.precision,
            "providers": translator.session.get_providers(),
            "intra_op_num_threads": options.intra_op_num_threads,
        }
        beam_sizes = tuple(translator.beam_sizes)
        glossary = terminology.file_has_tags(translator.vocabulary)
        steering = STEERING if translator.steering is not None else ()

    def translate(sentences, settings):
        return translator.translate(sentences, **settings)

    runtime["warmup_ms"] = _warm_up(translator, config.engine)

    return LoadedTranslator(
        translate, beam_sizes, translator.search.beam_size, runtime, glossary, steering
    )


WARMUP_SENTENCES = ["Warm-up.", "Das ist ein Satz zum Aufwärmen."]


def _warm_up(translator, engine):
    """Runs each search once before the version takes traffic (TF Serving's warm-up
    requests), so that the first requests do not pay for the runtime's first-call
    allocations; the steered graph's session is created now, while the version's
    files are there (a version folder removed later no longer matters). Returns
    the milliseconds it took."""
    start = time.perf_counter()
    if engine == "onnx" and translator.steering is not None:
        translator.steered_session()
    for beam_size in sorted({1, translator.search.beam_size}):
        translator.translate(WARMUP_SENTENCES, beam_size=beam_size)
    return round((time.perf_counter() - start) * 1000, 1)


# ----------------------------------------------------------------- in the worker process

_LOADED = None  # this worker process's LoadedTranslator


def _exit_with(server_pid, seconds=0.5):
    """Ends this worker once the server that started it is gone (this process then has
    another parent): a server killed with SIGKILL, or crashed, cannot stop its workers,
    which would otherwise keep their model's memory and cores until the machine restarts."""
    while os.getppid() == server_pid:
        time.sleep(seconds)
    os._exit(0)


def worker_load(version_dir, config):
    """Loads the worker's translator; returns what the server needs to know of it."""
    global _LOADED
    # Ctrl-C and a service manager's SIGTERM reach the whole process group: the server
    # stops its workers itself, after the batches in flight (SIGKILL still ends one).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True,
                     name="exit-with-server").start()  # fmt: skip
    factory = config.factory or load_engine
    _LOADED = factory(version_dir, config)
    return {
        "pid": os.getpid(),
        "beam_sizes": list(_LOADED.beam_sizes),
        "default_beam": _LOADED.default_beam,
        "runtime": _LOADED.runtime,
        "glossary": _LOADED.glossary,
        "steering": list(_LOADED.steering),
    }


def worker_translate(sentences, settings):
    """One batch on this worker's translator."""
    return _LOADED.translate(sentences, settings)
