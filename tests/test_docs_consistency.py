"""The docs agree with the code: their flags, paths, install lines and links.

Four checks over README.md, docs/*.md, benchmarks/README.md,
saved_models/README.md and export/serving/README.md, each a function of a
page's text that returns its problems (empty: none):

- `flag_problems`: every `--flag` of a command line exists in that
  command's parser. Command lines are the lines of ```bash blocks, the
  lines of other code blocks (indented or fenced) and the inline code spans
  that begin with a command. `python train.py`, the console scripts of
  pyproject.toml and the export commands (`python export/*.py`, `python -m
  keras_transformer.export`) are checked against their real parsers
  (`command_line.command_parser`, which builds them without running
  anything); their command lines must parse, and `train.py`'s must make a
  valid `TrainingConfig` (`--early-stopping` with the `cpu` preset needs
  `--validation-bleu-every`). `python benchmarks/X.py` and the other
  scripts are checked against the `add_argument` calls of their source
  (read with `ast`: importing a benchmark may import TensorFlow); `make
  train TRAIN_ARGS="..."` against train.py. The programs of other projects
  (curl, pip, docker, ...) are skipped only where `EXTERNAL` names them: a
  command of a bash block that is neither ours nor listed there is a problem.
- `path_problems`: every path under the repository's own folders
  (`benchmarks/`, `docs/`, `export/`, `keras_transformer/`, `tests/`) or
  `train.py` named on a page exists.
- `pip_problems`: every `pip install` installs this project as
  pyproject.toml names it and only with extras it defines: from the clone
  (`pip install -e ".[serve]"`) or from a wheel built from it, never by a
  name from a package index (the distribution is not on one, and
  `keras-transformer` there is another project). Checked in the pages and
  in the messages of the package, the scripts, pyproject.toml and the
  Makefile; `make ... EXTRAS=x` must name extras too.
- `link_problems`: every relative link names a file and its `#anchor` a
  heading of that file (GitHub's anchors); a section named in the text as
  `docs/x.md, "Heading"` is the beginning of a heading of that page.

The `test_*_checker_reports_*` tests plant a defect in a copy of a page's
text and expect the checker to report it, so that each check can be seen to
fail (and the mutation reruns with the tests).
"""

import ast
import contextlib
import functools
import glob
import io
import os
import re
import shlex

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [
    "README.md", "benchmarks/README.md", "saved_models/README.md", "export/serving/README.md"
] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
    if name.endswith(".md")
)  # fmt: skip
# Where a `pip install` line may also be written: messages, docstrings, comments.
MESSAGE_FILES = sorted(
    os.path.relpath(path, ROOT)
    for pattern in ("keras_transformer/**/*.py", "export/**/*.py", "benchmarks/*.py")
    for path in glob.glob(os.path.join(ROOT, pattern), recursive=True)
) + ["train.py", "pyproject.toml", "Makefile"]  # fmt: skip

with open(os.path.join(ROOT, "pyproject.toml"), "rb") as _f:
    PROJECT = tomllib.load(_f)["project"]
DISTRIBUTION = PROJECT["name"]
VERSION = PROJECT["version"]
EXTRAS = frozenset(PROJECT["optional-dependencies"])

# Programs of other projects, whose flags are theirs: their command lines are
# not checked. Add a program here only if it is not this repository's.
EXTERNAL = frozenset({
    "apt-get", "cat", "cd", "curl", "docker", "echo", "git", "iconv", "kill", "ls", "nvidia-smi",
    "pip", "pip3", "pytest", "ruff", "sacrebleu", "sleep", "source", "tensorboard",
    "tensorflow_model_server", "wc",
})  # fmt: skip
# `python -m MODULE` of other projects, likewise.
EXTERNAL_MODULES = frozenset({"json.tool", "pip", "pytest", "venv"})
# Flags of other projects named alone in a sentence (`--file_system_poll_wait_seconds`).
EXTERNAL_FLAGS = frozenset(
    {  # tensorflow_model_server
        "--file_system_poll_wait_seconds",
        "--tensorflow_intra_op_parallelism",
    }
)
# Words that run the command after them (`sudo apt-get ...`, `until curl ...; do`), and
# the shell's words that end a loop or a condition.
PREFIXES = frozenset({"!", "do", "done", "else", "env", "exec", "fi", "if", "nohup", "sudo", "then",
                      "time", "until", "while"})  # fmt: skip
SEPARATORS = frozenset({"|", "||", "&", "&&", ";", ";;", "(", ")"})
SHELL_BLOCKS = frozenset({"bash", "sh", "shell", "console"})


# --------------------------------------------------------------------------- Markdown


def fenced_blocks(text):
    """`[(line number of the first line, language, lines)]` of the ``` blocks of `text`."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        match = re.match(r"\s*```(\w*)\s*$", lines[i])
        if match:
            end = next(
                (j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), len(lines)
            )
            blocks.append((i + 2, match[1], lines[i + 1 : end]))
            i = end
        i += 1
    return blocks


def prose(text):
    """`text` with its fenced blocks blanked, line numbers kept."""
    lines = text.split("\n")
    for start, _, block in fenced_blocks(text):
        for j in range(start - 2, min(start + len(block), len(lines))):  # fences and inside
            lines[j] = ""
    return "\n".join(lines)


def inline_code(text):
    """`[(line number, span)]` of the inline code of `text` outside fenced blocks; a span
    written over two lines is joined with a space."""
    outside = prose(text)
    return [
        (outside.count("\n", 0, m.start()) + 1, " ".join(m[1].split()))
        for m in re.finditer(r"`([^`]+)`", outside)
        if "\n\n" not in m[1]
    ]


def _joined(numbered_lines):
    """`[(line number, line)]` with lines that end in `\\` joined to the next."""
    joined, pending = [], None
    for number, line in numbered_lines:
        if pending:
            pending = (pending[0], pending[1][:-1] + " " + line.strip())
        else:
            pending = (number, line.strip())
        if not pending[1].endswith("\\"):
            joined.append(pending)
            pending = None
    return joined + ([pending] if pending else [])


def command_lines(text):
    """`[(line number, command line, kind)]` of a page: the lines of its shell blocks
    (kind "shell": each must begin with a known program), the lines of its other code
    blocks and indented blocks ("code"), and its inline code spans ("inline": a
    mention in a sentence, which may leave out required arguments or write `...`)."""
    found = []
    for start, language, block in fenced_blocks(text):
        if language in SHELL_BLOCKS or language == "":
            kind = "shell" if language in SHELL_BLOCKS else "code"
            lines = _joined([(start + k, line) for k, line in enumerate(block)])
            found += [(n, line, kind) for n, line in lines if line and line[0] != "#"]
    indented = [
        (k + 1, line) for k, line in enumerate(prose(text).split("\n"))
        if line.startswith("    ") and line.strip()
    ]  # fmt: skip
    found += [(n, line, "code") for n, line in _joined(indented)]
    found += [(n, span, "inline") for n, span in inline_code(text)]
    return found


# --------------------------------------------------------------------------- commands


def _tokens(line):
    # File descriptors of redirections (`2>&1`, `2>/dev/null`) out before shlex splits them.
    line = re.sub(r"(?<!\S)\d*>&\d+", " ", line)
    line = re.sub(r"(?<!\S)\d+(?=>)", "", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: a span cut by the Markdown
        return line.split()


def simple_commands(line):
    """The commands of a shell line, each a list of words, split at `|`, `&&`, `;`, `&`
    and parentheses, with leading `VAR=value` words and `sudo`-like prefixes dropped."""
    commands, current = [], []
    for token in _tokens(line) + [";"]:
        if token in SEPARATORS:
            while current and (
                current[0] in PREFIXES or re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", current[0], re.S)
            ):
                current = current[1:]
            if current:
                commands.append(current)
            current = []
        else:
            current.append(token)
    return commands


def command_key(words):
    """`(key, arguments)` of a command: `train.py`, `benchmarks/decode.py`,
    `keras-transformer-serve`, `-m keras_transformer.export`, `make`, or the
    program's own name (`curl`); `.venv/bin/` and `python` are looked through. A
    script named alone (`quality.py --minutes 10`) is `bare:quality.py`."""
    program = words[0]
    if "/bin/" in program or program.startswith("bin/"):
        program = program.rsplit("/", 1)[1]
    arguments = words[1:]
    if re.fullmatch(r"python(3(\.\d+)?)?", program):
        if arguments[:1] == ["-m"] and len(arguments) > 1:
            return "-m " + arguments[1], arguments[2:]
        if arguments[:1] == ["-c"]:
            return "python -c", []
        if arguments and arguments[0].endswith(".py"):
            return os.path.normpath(arguments[0]), arguments[1:]
        return "python", arguments
    if program in ("bash", "sh") and arguments and arguments[0].endswith(".sh"):
        return os.path.normpath(arguments[0]), arguments[1:]
    if program.endswith((".py", ".sh")):
        if program.startswith("./"):
            return os.path.normpath(program), arguments
        return "bare:" + os.path.normpath(program), arguments
    return program, arguments


@functools.cache
def package_commands():
    """`{key: parser target}` of this package's commands (their real parsers)."""
    from keras_transformer.command_line import COMMANDS

    targets = {}
    for typed, target, _ in COMMANDS:
        targets[command_key(typed.split())[0]] = target
    for script, entry in PROJECT["scripts"].items():
        module = entry.split(":")[0]
        targets[script] = targets["-m " + module] = module
    for path in glob.glob(os.path.join(ROOT, "export", "*.py")):
        with open(path, encoding="utf-8") as f:
            if "from keras_transformer.export.cli import main" in f.read():
                targets[os.path.relpath(path, ROOT)] = "keras_transformer.export.cli"
    targets["-m keras_transformer.export"] = "keras_transformer.export.cli"
    return targets


@functools.cache
def package_parser(target):
    from keras_transformer.command_line import command_parser

    return command_parser(target, ROOT)


def _flags_of_calls(tree):
    """The option strings of the `add_argument` calls under `tree` (with the `--no-`
    forms of a `BooleanOptionalAction`), and the `module.function` calls in it."""
    flags, calls = set(), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr == "add_argument":
            names = [
                a.value for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value[:1] == "-"
            ]  # fmt: skip
            flags.update(names)
            if any("BooleanOptionalAction" in ast.dump(k.value) for k in node.keywords):
                flags.update("--no-" + n[2:] for n in names if n.startswith("--"))
        elif isinstance(node.func.value, ast.Name):
            calls.append((node.func.value.id, node.func.attr))
    return flags, calls


@functools.cache
def script_flags(path, root=ROOT):
    """The option strings a script's parser has, read from its source: its
    `add_argument` calls and those of the functions it calls in a module beside it
    (`_common.add_batch_arguments(parser)`)."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        flags, calls = _flags_of_calls(ast.parse(f.read()))
    for module, function in calls:
        beside = os.path.join(os.path.dirname(path), module + ".py")
        if module != os.path.basename(path)[:-3] and os.path.isfile(os.path.join(root, beside)):
            with open(os.path.join(root, beside), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in tree.body:
                if isinstance(node, ast.FunctionDef) and node.name == function:
                    flags |= _flags_of_calls(node)[0]
    return flags | {"-h", "--help"}


@functools.cache
def every_flag(root=ROOT):
    """The options of every command of the repository: the package's parsers and the
    `add_argument` calls of every script and module."""
    flags = set()
    for target in set(package_commands().values()):
        flags |= set(package_parser(target)._option_string_actions)
    for folder in ("benchmarks", "export", "keras_transformer"):
        for path in glob.glob(os.path.join(root, folder, "**", "*.py"), recursive=True):
            flags |= script_flags(os.path.relpath(path, root), root)
    return frozenset(flags)


def _flags(arguments):
    """The `--flag` words of `arguments` (`--flag=value` gives `--flag`; `[--flag`, an
    optional flag in a usage line, gives `--flag`; a quoted value with spaces, as
    `--train-args "--dropout 0.1"`, is a value)."""
    words = (a.strip("[]") for a in arguments)
    return [w.split("=", 1)[0] for w in words if re.match(r"--[a-z][\w-]*(=|$)", w)]


def _parse_problems(target, arguments, sentence):
    """What a package command's parser says of `arguments` (and, for train.py,
    `TrainingConfig`), or None. A command named in a sentence (`sentence`) may
    leave out its required arguments and write `...` for the rest."""
    if "-h" in arguments or "--help" in arguments:
        return None
    parser = package_parser(target)
    try:
        with contextlib.redirect_stderr(io.StringIO()) as stderr:
            args = parser.parse_args([a for a in arguments if not (sentence and a == "...")])
    except SystemExit:
        said = stderr.getvalue().strip().splitlines()[-1].split("error: ", 1)[-1]
        return None if sentence and said.startswith("the following arguments are") else said
    if target == "train.py":
        from keras_transformer.training.options import TrainingConfig

        options = {k: v for k, v in vars(args).items() if k not in ("debug", "verbose")}
        try:
            TrainingConfig(**options).resolved()
        except ValueError as error:
            return str(error)
    return None


def _redirections_out(arguments):
    """`arguments` without shell redirections and their files (`> out.en`)."""
    kept, i = [], 0
    while i < len(arguments):
        if arguments[i] in (">", ">>", "<"):
            i += 2
        else:
            kept.append(arguments[i])
            i += 1
    return kept


def flag_problems(text, page="README.md", root=ROOT):
    """Each command of `text` (the page `page`) whose flags its parser does not have
    or whose line its parser refuses, and each command of a shell block that is
    neither this repository's nor in `EXTERNAL`."""
    problems = []
    for number, line, kind in command_lines(text):
        for words in simple_commands(line):
            where = f"line {number}: `{' '.join(words)}`"
            problems += _problems_of_command(words, kind, where, page, root)
    return problems


def _problems_of_command(words, kind, where, page, root):
    if kind == "inline" and words[0].startswith("--"):  # `--preset small`: flags named alone
        unknown = [f for f in _flags(words) if f not in every_flag(root) | EXTERNAL_FLAGS]
        return [f"{where}: no command of this repository has {f}" for f in unknown]
    key, arguments = command_key(words)
    arguments = _redirections_out(arguments)
    parse = True  # the whole line through the command's parser
    if key.startswith("bare:"):  # `quality.py --minutes 10`: a script named in a sentence
        if not _flags(arguments):
            return []
        key = next(
            (p for p in (key[5:], os.path.join(os.path.dirname(page), key[5:]))
             if os.path.isfile(os.path.join(root, p))), key[5:],
        )  # fmt: skip
        parse = False
    if key == "make":  # make train TRAIN_ARGS="--max-train-minutes 75"
        return [
            problem for word in arguments if word.startswith("TRAIN_ARGS=")
            for problem in _command_problems(
                "train.py", shlex.split(word[len("TRAIN_ARGS="):]), where, kind
            )
        ]  # fmt: skip
    if key in package_commands():
        return _command_problems(key, arguments, where, kind, parse)
    if key.startswith("-m keras_transformer"):
        module = key[3:].replace(".", "/")
        key = next(
            (p for p in (module + "/__main__.py", module + ".py")
             if os.path.isfile(os.path.join(root, p))), module + ".py",
        )  # fmt: skip
    if key.endswith((".py", ".sh")):
        if not os.path.isfile(os.path.join(root, key)):
            return [f"{where}: there is no script {key}"]
        if key.endswith(".sh"):
            return []  # a shell script's variables are its options
        missing = [f for f in _flags(arguments) if f not in script_flags(key, root)]
        return [f"{where}: {key} has no option {f}" for f in missing]
    if kind == "shell" and not (
        key in EXTERNAL or key == "python -c"
        or (key.startswith("-m ") and key[3:] in EXTERNAL_MODULES)
    ):  # fmt: skip
        return [
            f"{where}: {key} is not a command of this repository; if it is another "
            "project's, add it to EXTERNAL in tests/test_docs_consistency.py"
        ]
    return []


def _command_problems(key, arguments, where, kind, parse=True):
    """A package command's unknown flags; with `parse`, what its parser (and
    `TrainingConfig`) says of the whole line."""
    target = package_commands()[key]
    options = package_parser(target)._option_string_actions
    missing = [f for f in _flags(arguments) if f not in options]
    if missing:
        return [f"{where}: {key} has no option {f}" for f in missing]
    said = parse and _parse_problems(target, arguments, sentence=kind == "inline")
    return [f"{where}: {said}"] if said else []


# --------------------------------------------------------------------------- paths

PATH = re.compile(
    r"(?<![\w./-])((?:benchmarks|docs|export|keras_transformer|tests)/[\w./<>*{}-]*|train\.py)"
)


def path_problems(text, root=ROOT):
    """Each path of the repository's own folders named in `text` that does not exist
    (a path with a placeholder, `<name>` or `*`, is not checked)."""
    problems = []
    for number, line in enumerate(text.split("\n"), 1):
        for path in PATH.findall(line):
            path = path.rstrip(".,:;")
            if re.search(r"[<>*{}]|\.\.\.", path):
                continue
            if not os.path.exists(os.path.join(root, path)):
                problems.append(f"line {number}: {path} does not exist")
    return problems


# --------------------------------------------------------------------------- pip install


def _canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_problems(requirement):
    """What is wrong with one `pip install` argument (quotes stripped), or None."""
    match = re.fullmatch(r"(?P<base>[^\[\]]+)(\[(?P<extras>[^\]]*)\])?", requirement)
    if not match:
        return None
    base, extras = match["base"], match["extras"]
    if base in (".", "./") or base.endswith(".whl"):
        if base.endswith(".whl"):
            if "*" in os.path.basename(base):
                return None  # a folder of wheels (benchmarks/gpu.sh's .whl/*.whl)
            name, version = os.path.basename(base).split("-")[:2]
            if _canonical(name) != _canonical(DISTRIBUTION) or version != VERSION:
                return (
                    f"{requirement}: the wheel built from this clone is "
                    f"{DISTRIBUTION.replace('-', '_')}-{VERSION}-py3-none-any.whl"
                )
        unknown = [
            e for e in (extras or "").split(",")
            if e.strip() and not re.fullmatch(r"[A-Z_]+|\{.*\}|\.\.\.|\$.*", e.strip())
            and e.strip() not in EXTRAS
        ]  # fmt: skip
        if unknown:
            return f"{requirement}: pyproject.toml has no extra {', '.join(unknown)}"
        return None
    if _canonical(base) in (_canonical(DISTRIBUTION), "keras-transformer"):
        return (
            f"{requirement}: {base} is not this project on a package index; from the clone: "
            f'pip install -e ".[{extras or "EXTRA"}]"'
        )
    return None


# pip's options whose value is the next word (`-r FILE`, `-w DIR`), not a requirement.
PIP_VALUE_OPTIONS = frozenset({
    "-r", "-c", "-i", "-f", "-t", "-w", "--index-url", "--extra-index-url", "--find-links",
    "--target",
})  # fmt: skip


def pip_problems(text):
    """Each `pip install` of `text` that names this project other than as
    pyproject.toml does, or an extra it does not define; and each `EXTRAS=` of a
    `make` command that names an unknown extra."""
    problems = []
    flat = text.replace("\n", " ")  # an inline span may go over two lines; positions kept
    for match in re.finditer(r"pip3?\s+install\b(?P<rest>[^\n`#;|&)]*)", flat):
        number = text.count("\n", 0, match.start()) + 1
        words = re.findall(r"[^\s\"'`]+", match["rest"])
        skip = False
        for word in words:
            if skip or word.startswith("-"):
                skip = not skip and word in PIP_VALUE_OPTIONS
                continue
            said = _requirement_problems(word.rstrip(".,:;"))
            if said:
                problems.append(f"line {number}: pip install {said}")
    for match in re.finditer(r"\bEXTRAS=([\w,.-]+)", flat):
        unknown = [e for e in match[1].split(",") if e not in EXTRAS and e != "..."]
        if unknown:
            number = text.count("\n", 0, match.start()) + 1
            problems.append(f"line {number}: EXTRAS={match[1]}: no extra {', '.join(unknown)}")
    return problems


# --------------------------------------------------------------------------- links

LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
SECTION = re.compile(r"(?P<path>[\w./-]+\.md)`?,? \"(?P<title>[^\"]+)\"")


def anchors(text):
    """GitHub's anchors of the headings of `text`: lower case, punctuation dropped,
    spaces to hyphens, repeats numbered."""
    seen, result = {}, set()
    for heading in headings(text):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def headings(text):
    return [m[1].strip() for m in re.finditer(r"(?m)^#{1,6} (.*)$", prose(text))]


def _outside_code(text):
    return re.sub(r"`[^`\n]*`", "", prose(text))


def link_problems(text, page, read=None):
    """Each relative link of `text` (the page `page`, a repository path) whose file or
    `#anchor` does not exist, and each `path.md, "Heading"` whose page has no heading
    that begins so. `read(path)` gives a page's text (default: the repository's)."""
    read = read or _read
    problems = []
    for _, target in LINK.findall(_outside_code(text)):
        if re.match(r"[a-z]+:", target):
            continue  # another site: not fetched (CI has no internet)
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if path and not os.path.exists(os.path.join(ROOT, resolved)):
            problems.append(f"{target}: no file {resolved}")
        elif anchor and resolved.endswith(".md"):
            if anchor not in anchors(text if resolved == page else read(resolved)):
                problems.append(f"{target}: no heading #{anchor} in {resolved}")
    for match in SECTION.finditer(text.replace("\n", " ")):
        path, title = match["path"], match["title"]
        candidates = [path, os.path.normpath(os.path.join(os.path.dirname(page), path))]
        found = next((p for p in candidates if os.path.isfile(os.path.join(ROOT, p))), None)
        if found is None:
            problems.append(f'{path}, "{title}": no file {path}')
            continue
        titles = [h.replace("`", "").lower() for h in headings(read(found))]
        if not any(h.startswith(title.lower()) for h in titles):
            problems.append(f'{path}, "{title}": no heading that begins so in {found}')
    return problems


# --------------------------------------------------------------------------- the tests


def _read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("page", PAGES)
def test_every_flag_of_a_command_line_is_in_its_parser(page):
    problems = flag_problems(_read(page), page)
    assert not problems, f"{page}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES)
def test_every_repository_path_named_exists(page):
    problems = path_problems(_read(page))
    assert not problems, f"{page}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", PAGES + MESSAGE_FILES)
def test_every_pip_install_names_this_distribution_and_its_extras(path):
    problems = pip_problems(_read(path))
    assert not problems, f"{path}:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_and_named_section_resolves(page):
    problems = link_problems(_read(page), page)
    assert not problems, f"{page}:\n" + "\n".join(problems)


def test_the_model_config_is_read_where_the_compose_file_mounts_it():
    """export/serving/models.config says how TF Serving reads it; docker-compose.yml
    mounts it and passes the flag: the three paths are one."""
    config = re.findall(r"--model_config_file=(\S+)", _read("export/serving/models.config"))
    compose = _read("export/serving/docker-compose.yml")
    (passed,) = re.findall(r"--model_config_file=(\S+)", compose)
    (mounted,) = re.findall(r"\./models\.config:([^:\s]+)", compose)
    assert config and set(config) == {passed} == {mounted}, (config, passed, mounted)


def _planted(page, old, new):
    """`page`'s text with `old` (which must be there) replaced by `new`."""
    text = _read(page)
    assert old in text, f"{page} no longer holds {old!r}: plant the defect elsewhere"
    return text.replace(old, new, 1)


def test_the_flag_checker_reports_a_planted_wrong_flag():
    line = "python train.py --data-dir corpus --work-dir work_mine --max-train-minutes 60"
    assert not flag_problems(_read("README.md"))
    wrong = _planted("README.md", line, line + " --max-train-minute 90")
    (problem,) = flag_problems(wrong)
    assert problem.endswith("`: train.py has no option --max-train-minute"), problem
    # The defects this check was written for: a benchmark flag that its script does not
    # have (read from its source), early stopping on chrF that the `cpu` preset refuses.
    benchmark = _planted(
        "docs/translating.md", "`python benchmarks/decode.py --preset small",
        "`python benchmarks/decode.py --jit-compile --preset small",
    )  # fmt: skip
    (problem,) = flag_problems(benchmark, "docs/translating.md")
    assert problem.endswith("benchmarks/decode.py has no option --jit-compile"), problem
    page = "docs/start_to_finish.md"
    assert not flag_problems(_read(page), page)
    refused = _planted(page, "--early-stopping 5 --validation-bleu-every 1`", "--early-stopping 5`")
    (problem,) = flag_problems(refused, page)
    assert "needs validation_bleu_every >= 1" in problem, problem
    # A value its parser refuses, the export command's flags, a script named alone,
    # make's TRAIN_ARGS, a flag named alone in a sentence, a program of no one.
    choice = "```bash\nkeras-transformer-serve saved_models/m/onnx --engine ct2\n```\n"
    assert "invalid choice: 'ct2'" in flag_problems(choice)[0]
    export = "`python -m keras_transformer.export --work-dir work --precision int8`"
    assert flag_problems(export)[0].endswith("has no option --precision")
    bare = "(`quality.py --minute 10`)"
    assert flag_problems(bare, "benchmarks/README.md")[0].endswith(
        "benchmarks/quality.py has no option --minute"
    )  # fmt: skip
    make = 'Give it more time (`make train TRAIN_ARGS="--max-train-minuts 75"`).'
    assert flag_problems(make)[0].endswith("train.py has no option --max-train-minuts")
    alone = "`--byte-fallback` turns it off"
    assert flag_problems(alone)[0].endswith("no command of this repository has --byte-fallback")
    unknown = "```bash\nkeras-transformer-train --work-dir work\n```\n"
    assert "is not a command of this repository" in flag_problems(unknown)[0]
    external = "```bash\ncurl -s --max-time 5 localhost:8501/v1/models/m > status.json\n```\n"
    assert flag_problems(external) == []  # curl's flags are curl's


def test_the_path_checker_reports_a_planted_path():
    assert not path_problems(_read("docs/translating.md"))
    wrong = _planted("docs/translating.md", "benchmarks/decode.py", "benchmarks/decoding.py")
    assert any("benchmarks/decoding.py does not exist" in p for p in path_problems(wrong))
    assert path_problems("see `tests/test_nothing.py`.") == [
        "line 1: tests/test_nothing.py does not exist"
    ]
    assert path_problems("writes `benchmarks/results/<name>/` and `docs/*.md`") == []


def test_the_pip_checker_reports_a_planted_install_name():
    text = _read("README.md")
    assert not pip_problems(text)
    registry = _planted("README.md", 'pip install -e ".[tensorflow,onnx,serve]"',
                        "pip install 'keras-transformer-nmt[serve]'")  # fmt: skip
    assert any("keras-transformer-nmt is not this project on a package index" in p
               for p in pip_problems(registry))  # fmt: skip
    extra = _planted("README.md", '".[tensorflow,onnx,serve]"', '".[tensorflow,onnx,serving]"')
    assert any("no extra serving" in p for p in pip_problems(extra))
    wheel = _planted("README.md", "keras_transformer_nmt-0.1.0-", "keras_transformer-0.1.0-")
    assert any("the wheel built from this clone" in p for p in pip_problems(wheel))
    other = "`pip install --no-deps keras-transformer` then the extra's packages"
    assert "keras-transformer is not this project" in pip_problems(other)[0]
    message = "raise SystemExit('needs the server extra: pip install -e \".[sever]\"')"
    assert "no extra sever" in pip_problems(message)[0]
    make = "`KERAS_BACKEND=jax make train EXTRAS=jax-cuda14`"
    assert "no extra jax-cuda14" in pip_problems(make)[0]
    fine = "`pip install tensorboard`, `pip install -e \".[EXTRA]\"`, `pip install 'jax[cuda13]'`"
    assert pip_problems(fine) == []


def test_the_link_checker_reports_a_planted_broken_link():
    page = "README.md"
    assert not link_problems(_read(page), page)
    anchor = _planted(page, "(docs/training.md#on-a-gpu)", "(docs/training.md#on-a-tpu)")
    assert link_problems(anchor, page) == [
        "docs/training.md#on-a-tpu: no heading #on-a-tpu in docs/training.md"
    ]
    missing = _planted(page, "(docs/serving.md)", "(docs/serve.md)")
    assert link_problems(missing, page) == ["docs/serve.md: no file docs/serve.md"]
    section = _planted(page, '[docs/training.md, "On a GPU"]', '[docs/training.md, "On a TPU"]')
    assert link_problems(section, page) == [
        'docs/training.md, "On a TPU": no heading that begins so in docs/training.md'
    ]
    own = "# Top\n\n[up](#top) [down](#bottom)\n"
    assert link_problems(own, "docs/x.md") == ["#bottom: no heading #bottom in docs/x.md"]
