"""The documentation against the code: docs/flags.md is what docs/flags.py writes now, every
relative link in README.md and docs/*.md reaches a file (and a heading, for an anchor into a page),
every --flag they name is a flag of the script they name it for, --help prints the docstrings'
commands as written and its defaults as they read, and every command the pages and the docstrings
show runs as shown: parsed by the program's own parser from the folder it runs in, naming files that
exist (a command shown for a CPU sized to end in minutes). The figures guide.md quotes are those of
the report in comparing.md, and no page kills processes by a name every user shares. All in this
process, from the parsers the scripts use: no script is started."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import io
import re
import shlex
import tempfile
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
GENERATED = "docs/flags.md"


@functools.cache
def generator():
    """docs/flags.py as a module (docs/ is no package)."""
    spec = importlib.util.spec_from_file_location("docs_flags", REPO / "docs" / "flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def where(page: Path, line: int) -> str:
    return f"{page.relative_to(REPO) if page.is_relative_to(REPO) else page}:{line}"


# ----------------------------------------------------------------------------------------- markdown
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)((?:(?!\n[ \t]*\n)[\s\S])*?[^`])\1(?!`)")  # never across a blank line
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*"
                  r"(<[^>\n]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)"
                  r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
DEFINITION = re.compile(r"^ {0,3}\[[^\]\n]+\]:[ \t]*(<[^>\n]*>|\S+)", re.MULTILINE)
ATX = re.compile(r"^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(?:=+|-+)[ \t]*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:name|id)=[\"']([^\"']+)[\"']", re.IGNORECASE)
# http:, https:, mailto:, any scheme; //host
EXTERNAL = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:|//)")


def fenced(lines: list[str]) -> list[bool]:
    """For each line, whether it belongs to a fenced code block (its fences included)."""
    inside, opener, flags = False, "", []
    for line in lines:
        match = FENCE.match(line)
        if not inside and match:
            inside, opener = True, match.group(1)
            flags.append(True)
        elif inside:
            flags.append(True)
            fence = line.strip()
            if fence and set(fence) == {opener[0]} and len(fence) >= len(opener):
                inside = False
        else:
            flags.append(False)
    return flags


def prose(text: str) -> str:
    """`text` with fenced code blocks and inline code spans blanked out, every character at its
    place (a newline stays a newline), so that offsets still give line numbers."""
    lines = text.split("\n")
    kept = "\n".join(" " * len(line) if code else line for line, code in zip(lines, fenced(lines)))
    return CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), kept)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: lowercased, every character but letters, digits, _, -
    and spaces dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or an image: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors a page's headings (ATX and setext, outside code) and HTML anchors give, as GitHub
    numbers repeated ones (x, x-1, x-2, ...)."""
    lines = text.split("\n")
    code, seen, found = fenced(lines), {}, set()
    for i, line in enumerate(lines):
        if code[i]:
            continue
        atx = ATX.match(line)
        if atx:
            heading = atx.group(1) or ""
        elif (SETEXT.match(line) and i > 0 and lines[i - 1].strip() and not code[i - 1]
              and not ATX.match(lines[i - 1]) and not SETEXT.match(lines[i - 1])):
            heading = lines[i - 1]
        else:
            found.update(HTML_ANCHOR.findall(line))
            continue
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every inline link, image and link definition outside code."""
    blank = prose(text)
    found = [(m.start(), m.group(2)) for m in LINK.finditer(blank)]
    found += [(m.start(1), m.group(1)) for m in DEFINITION.finditer(blank)]
    return [(blank.count("\n", 0, offset) + 1, target.strip("<>"))
            for offset, target in sorted(found)]


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """'file:line: target (why)' for each relative link of `page` that
    reaches nothing under `root`."""
    problems = []
    for line, target in links(page.read_text()):
        if not target or EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        path = unquote(path)
        file = (page if not path else (root / path.lstrip("/")) if path.startswith("/")
                else page.parent / path)
        file = Path(file).resolve()
        if not file.is_relative_to(root.resolve()):
            problems.append(f"{where(page, line)}: {target} (outside the repository)")
        elif not file.exists():
            problems.append(f"{where(page, line)}: {target} (no such file)")
        elif (anchor and file.suffix == ".md" and file.is_file()
              and unquote(anchor) not in anchors(file.read_text())):
            problems.append(f"{where(page, line)}: {target} (no heading of {file.name} has "
                            f"the anchor #{anchor})")
    return problems


# -------------------------------------------------------------------------------------------- flags
SCRIPTS = ("single_gpu/train.py", "data_parallel/train.py", "dist_parallel/train.py",
           "fsdp/train.py", "pipeline_parallel/train.py", "compare.py", "benchmarks/fast.py",
           "benchmarks/profile_step.py", "benchmarks/roofline.py")
# A line that names a script checks its flags against that script's (several named: any of theirs).
MENTIONS = {
    "single_gpu/train.py": re.compile(r"(?<![\w-])single_gpu/"),
    "data_parallel/train.py": re.compile(r"(?<![\w-])data_parallel/"),
    "dist_parallel/train.py": re.compile(r"(?<![\w-])dist_parallel/"),
    "fsdp/train.py": re.compile(r"(?<![\w-])fsdp/"),
    "pipeline_parallel/train.py": re.compile(r"(?<![\w-])pipeline_parallel/"),
    "compare.py": re.compile(r"(?<![\w-])compare\.py\b"),
    "benchmarks/fast.py": re.compile(r"(?<![\w-])fast\.py\b"),
    "benchmarks/profile_step.py": re.compile(r"(?<![\w-])profile_step\.py\b"),
    "benchmarks/roofline.py": re.compile(r"(?<![\w-])roofline\.py\b"),
}
# Other tools' flags that the documentation names, wherever it names them.
OTHER_TOOLS = {
    # torchrun (torch.distributed.run)
    "--standalone", "--nproc_per_node", "--nnodes", "--node_rank", "--rdzv_backend",
    "--rdzv_endpoint", "--rdzv_id", "--max-restarts", "--local_addr", "--master_addr",
    "--master_port", "--signals-to-handle",
    # torch.distributed.launch, the launcher before torchrun: named
    # as what these scripts do not take
    "--local_rank",
    # pytest and pytest-xdist
    "--durations", "--dist",
    # sbatch, srun, scontrol and scancel (SLURM)
    "--nodes", "--gres", "--gpus-per-node", "--ntasks", "--ntasks-per-node", "--time", "--signal",
    "--requeue", "--kill-on-bad-exit", "--wait",
    # tensorboard
    "--logdir",
    # py-spy
    "--pid",
    # no tool's: a flag in general, as prose names one ("every `--flag` they name")
    "--flag",
}
FLAG = re.compile(r"(?<![\w-])--([A-Za-z][\w-]*)")  # not `--`, `---`, `-->`, a--b, nor an em dash
URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://\S*")


# The scripts that pass the flags they do not take to train files: whose flags they take too
# (the first four train files: neither compare.py nor fast.py runs pipeline_parallel yet).
PASSED_ON = {"compare.py": SCRIPTS[:4], "benchmarks/fast.py": SCRIPTS[:4],
             "benchmarks/profile_step.py": SCRIPTS[:1]}


@functools.cache
def script_flags() -> dict[str, frozenset[str]]:
    """Each script's --flags, from the parser it reads its command line with, and those of the
    train files it passes the rest to."""
    def own(script: str) -> frozenset[str]:
        return frozenset(option for action in generator().parser_of(script)._actions
                         for option in action.option_strings if option.startswith("--"))

    return {script: own(script).union(*map(own, PASSED_ON.get(script, ())))
            for script in SCRIPTS}


def named_flags(line: str) -> list[str]:
    """The --flags a line names (--name=value as --name)."""
    return ["--" + name.rstrip("-") for name in FLAG.findall(URL.sub(" ", line))]


def logical_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, line, context) of every line: the context is the line itself, or in a code
    block the whole command it continues (lines joined by a trailing backslash)."""
    lines = text.split("\n")
    code, result, i = fenced(lines), [], 0
    while i < len(lines):
        j = i
        while code[j] and lines[j].rstrip().endswith("\\") and j + 1 < len(lines) and code[j + 1]:
            j += 1
        context = " ".join(lines[i:j + 1])
        result += [(k + 1, lines[k], context) for k in range(i, j + 1)]
        i = j + 1
    return result


def is_flag_of(flag: str, flags: frozenset[str] | set[str]) -> bool:
    """Whether `flag` is one of `flags`: as it is, as the --no_ form of one, or as the setting a
    --no_ flag turns off (--reshard_after_forward for --no_reshard_after_forward); written with
    hyphens too (--batch-size), as the scripts' parsers take it."""
    return any(spelling in flags
               or (spelling.startswith("--no_") and "--" + spelling[len("--no_"):] in flags)
               or "--no_" + spelling[2:] in flags
               for spelling in (flag, "--" + flag[2:].replace("-", "_")))


def unknown_flags(page: Path) -> list[str]:
    """'file:line: --flag (why)' for each --flag of `page` that neither the script its line names
    nor, where it names none, any script or OTHER_TOOLS has."""
    per_script = script_flags()
    every = frozenset().union(*per_script.values())
    problems = []
    for number, line, context in logical_lines(page.read_text()):
        named = [script for script, mention in MENTIONS.items() if mention.search(context)]
        allowed = frozenset().union(*(per_script[s] for s in named)) if named else every
        for flag in named_flags(line):
            if not is_flag_of(flag, allowed | OTHER_TOOLS):
                whose = (f"not a flag of {' or '.join(named)}" if named
                         else "no script has it, nor another tool listed")
                problems.append(f"{where(page, number)}: {flag} ({whose})")
    return problems


# -------------------------------------------------------------------------------------------- tests
def test_flags_page_is_what_the_generator_writes():
    expected = generator().render()
    page = REPO / GENERATED
    actual = page.read_text() if page.exists() else ""
    if actual != expected:
        old, new = actual.split("\n"), expected.split("\n")
        first = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b),
                     min(len(old), len(new)))
        pytest.fail(f"{GENERATED} is stale (first difference at line {first + 1}): run "
                    "`python docs/flags.py`",
                    pytrace=False)


def test_relative_links_resolve():
    problems = [problem for page in pages() for problem in broken_links(page)]
    assert not problems, "links that reach nothing:\n" + "\n".join(problems)


def test_named_flags_exist():
    problems = [problem for page in pages() if page != REPO / GENERATED
                for problem in unknown_flags(page)]
    assert not problems, "flags that no script named takes:\n" + "\n".join(problems)


# -------------------------------------------------------------------------- the checkers themselves
def test_flag_finder_skips_dashes_that_are_no_flags():
    for text in ("a -- b", "|---|---|", "<!-- a comment -->", "a --- b", "word--word", "a — b – c",
                 "``--``", "torchrun ... -- python", "https://example.com/--path", "-n auto",
                 "x---y"):
        assert named_flags(text) == [], text
    assert named_flags("python train.py --batch_size 4 --no_shuffle") == \
        ["--batch_size", "--no_shuffle"]
    assert named_flags("`--gres=gpu:8`, (--max-restarts), --lr.") == \
        ["--gres", "--max-restarts", "--lr"]


def test_flag_checker_reads_the_script_a_line_names(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "python compare.py --repeat 3 --sync_bn on",           # 1: compare.py's
        "python compare.py --verify_sync",  # 2: a train.py flag compare.py does not pass on
        "torchrun --standalone dist_parallel/train.py --sync_bn",  # 3: torchrun's, then script's
        "python fsdp/train.py --sync_bn",                      # 4: DDP's only
        "python fsdp/train.py --reshard_after_forward --no_compile",  # 5: the setting, --no_ form
        "python train.py --bucket_cap_mb 50 --no_such_flag",   # 6: no script named: any script's
        "```bash",
        "torchrun --nnodes 2 \\",
        "    fsdp/train.py --bucket_cap_mb 50",                # 9: the command of line 8 names fsdp
        "```",
    ]))
    assert unknown_flags(page) == [f"{page}:2: --verify_sync (not a flag of compare.py)",
                                   f"{page}:4: --sync_bn (not a flag of fsdp/train.py)",
                                   f"{page}:6: --no_such_flag (no script has it, "
                                   "nor another tool listed)",
                                   f"{page}:9: --bucket_cap_mb (not a flag of fsdp/train.py)"]


def test_link_checker_finds_missing_files_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Title\n\n## DDP or FSDP: `set_epoch` — "
                                                "when?\n\n## Title\n\nSetext "
                                                "heading\n--------------\n\n```\n# not a "
                                                "heading\n```\n")
    page = tmp_path / "README.md"
    page.write_text("\n".join([
        # 1
        "[ok](docs/other.md) [ok](docs/other.md#ddp-or-fsdp-set_epoch--when) ![img](docs/other.md)",
        "[ok](docs/other.md#title-1) [ok](docs/other.md#setext-heading) [ok](#own) "
        "[ok](https://x.org/a.md)",
        "[missing](docs/none.md) [bad anchor](docs/other.md#not-a-heading) "
        "[out](../../elsewhere.md)",  # 3
        "`[in code](nowhere.md)` and [self](#nothing-here)",  # 4
        "```",
        "[in a block](nowhere.md)",
        "```",
        "## Own",
        "[a link whose text",
        "spans lines](docs/gone.md)",  # 10
    ]))
    assert broken_links(page, root=tmp_path) == [
        f"{page}:3: docs/none.md (no such file)",
        f"{page}:3: docs/other.md#not-a-heading (no heading of other.md has the "
        "anchor #not-a-heading)",
        f"{page}:3: ../../elsewhere.md (outside the repository)",
        f"{page}:4: #nothing-here (no heading of README.md has the anchor #nothing-here)",
        f"{page}:9: docs/gone.md (no such file)",
    ]


# -------------------------------------------------------------------------------------------------
# --help
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_docstrings_command_lines_as_written(script):
    """argparse's default formatter ran the docstring's example
    commands together into one paragraph."""
    text = generator().help_text(script)
    examples = [line.rstrip() for line in generator()._docstring(script).splitlines()
                if line.startswith("    ") and line.split()[0] in ("python", "torchrun", "RANK=R",
                                                                   "bash")]
    if script == "compare.py":  # its --help gives the docstring's first paragraph alone
        examples = []
    assert all(line in text.splitlines() for line in examples), \
        [line for line in examples if line not in text]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_default_shown_reads_right(script):
    """`--no_nesterov ... (default: True)` read backwards, and `(default: None)`
    said nothing the help did not."""
    parser = generator().parser_of(script)
    text = " ".join(generator().help_text(script).split())
    for wrong in ("(default: True)", "(default: False)", "(default: None)", "(default: ('",
                  "turn off:"):
        assert wrong not in text, wrong
    for action in parser._actions:  # a --no_ switch that says what it does says it right
        if (isinstance(action, argparse._StoreFalseAction) and action.help
                and action.default is not argparse.SUPPRESS):
            help_text = " ".join(parser._get_formatter()._expand_help(action).split())
            assert help_text.startswith("turn off ") \
                and help_text.endswith(" (on by default)"), help_text
            assert f"{action.option_strings[0]} {help_text}" in text


# ----------------------------------------------------------------------------------------- commands
# What the docs show is run as shown: every command of README.md's and docs/*.md's code blocks,
# every inline code span that runs a script by its path, and the example commands of the scripts'
# docstrings (what --help prints) are parsed here as the program would parse them, from the folder
# they run in, and the files they name must exist. Nothing is started: a command's flags go through
# the script's own parser (train.py's through its get_args, which checks every value and the rules
# between them; benchmarks/fast.py's through its own, then its mode's), torchrun's through
# torch.distributed.run's.
PROGRAMS = ("python", "torchrun", "bash", "sbatch", "cd", "pip")
DOCSTRINGS = {"single_gpu/train.py": "single_gpu", "data_parallel/train.py": "data_parallel",
              "dist_parallel/train.py": "dist_parallel", "fsdp/train.py": "fsdp",
              "pipeline_parallel/train.py": "pipeline_parallel", "compare.py": ".",
              "benchmarks/fast.py": ".", "benchmarks/profile_step.py": ".",
              "benchmarks/roofline.py": "."}
PLACEHOLDER = re.compile(r"<[^<>\n]*>")  # <run>, <a dist_parallel run>: one word for the shell
# a command shown for a CPU trains at most this many images (30-100 images/s here)
CPU_IMAGES = 10_000


@dataclasses.dataclass
class Shown:
    where: str  # page:line
    folder: Path  # where it runs: the repository root, or where a `cd` in its block moved
    text: str  # the command as the page shows it, its lines joined


def commands_of_block(lines: list[str], first: int, page: str, folder: Path) -> list[Shown]:
    """The commands of a code block's `lines` (the block's first line is line `first` of `page`),
    each with the folder it runs in: a `cd` moves the commands after it."""
    shown, i = [], 0
    while i < len(lines):
        start, text = i, lines[i]
        while text.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text.rstrip()[:-1] + " " + lines[i].strip()
        i += 1
        words = words_of(text)
        if words and words[0] in PROGRAMS or words and "=" in words[0]:
            shown.append(Shown(f"{page}:{first + start}", folder, text.strip()))
        # `cd X && ...` is a line of its own: it moves nothing after it
        if words[:1] == ["cd"] and len(words) == 2:
            folder = (folder / words[1]).resolve()
    return shown


def words_of(text: str) -> list[str]:
    """`text` as a shell splits it, its comment left out, a <placeholder> one word; prose in a
    code span (`the rate's schedule`) at its spaces."""
    try:
        return shlex.split(PLACEHOLDER.sub("X", text), comments=True)
    except ValueError:  # no closing quotation: an apostrophe
        return PLACEHOLDER.sub("X", text).split()


def split_commands(words: list[str]) -> list[list[str]]:
    """The commands of `a && b`, each without its VAR=value prefix."""
    commands, current = [], []
    for word in [*words, "&&"]:
        if word == "&&":
            while current and re.fullmatch(r"[A-Za-z_]\w*=.*", current[0]):
                current = current[1:]
            commands += [current] if current else []
            current = []
        else:
            current.append(word)
    return commands


def shown_commands() -> list[Shown]:
    shown = []
    for page in pages():
        if page == REPO / GENERATED:
            continue
        lines = page.read_text().split("\n")
        code, name, i = fenced(lines), page.relative_to(REPO).as_posix(), 0
        while i < len(lines):  # the fenced blocks, each from the repository root
            if code[i] and FENCE.match(lines[i]):
                j = i + 1
                while j < len(lines) and code[j] and not FENCE.match(lines[j]):
                    j += 1
                shown += commands_of_block(lines[i + 1:j], i + 2, name, REPO)
                i = j + 1
            else:
                i += 1
        kept = "\n".join("" if c else line for line, c in zip(lines, code))
        for match in CODE_SPAN.finditer(kept):  # spans that run a script by its path, from the root
            text = " ".join(match.group(2).split())
            words = words_of(text)
            script = next((w for w in words[1:] if re.search(r"\.(py|sh|sbatch)$", w)), "")
            if words and words[0] in PROGRAMS[:4] and "/" in script or script == "compare.py" or \
                    words[:2] == ["pip", "install"]:
                shown.append(Shown(f"{name}:{kept.count(chr(10), 0, match.start()) + 1}", REPO,
                                   text))
    for script, folder in DOCSTRINGS.items():  # what --help prints
        lines = generator()._docstring(script).split("\n")
        examples = [i for i, line in enumerate(lines)
                    if line.startswith("    ") and line.split()[0] in PROGRAMS
                    or line.startswith("    RANK=")]
        for i in examples:
            end = i
            while lines[end].rstrip().endswith("\\"):
                end += 1
            shown += commands_of_block(lines[i:end + 1], i + 1, f"{script} (docstring)",
                                       REPO / folder)
    return shown


@functools.cache
def image_folder_standing_in() -> Path:
    """An image folder of two classes (a classifier needs two), one image each in train/ and val/,
    for commands that show a placeholder folder."""
    from PIL import Image

    root = Path(tempfile.mkdtemp(prefix="docs-imagefolder-"))
    for split in ("train", "val"):
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(root / split / name / "0.png")
    return root


def parse_script(script: str, args: list[str], folder: Path) -> str | None:
    """Why `python script args` (from `folder`) would not run as shown, or None."""
    import runkit
    from comparison.errors import UsageError
    from comparison.train_files import train_file

    path = (folder / script).resolve()
    if not path.is_file():
        return f"{script}: no such file in {folder.relative_to(REPO.parent)}"
    relative = path.relative_to(REPO).as_posix()
    args = [arg for arg in args if arg != "..."]
    # a placeholder folder: an image folder stands in for it
    if "imagefolder" in args and "--data_dir" in args:
        args[args.index("--data_dir") + 1] = str(image_folder_standing_in())
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            if relative.endswith("/train.py"):
                cfg = train_file(relative.split("/")[0]).get_args(args)
            elif relative == "benchmarks/fast.py":  # its own flags, then the mode's train.py's
                options, train_args = importlib.import_module("benchmarks.fast").parse(args)
                cfg = train_file(options.mode).get_args(train_args)
            elif relative in ("compare.py", "benchmarks/profile_step.py"):  # the train.py's too
                importlib.import_module(relative[:-3].replace("/", ".")).parse(args)
                return None
            elif relative in SCRIPTS:
                generator().parser_of(relative).parse_args(args)
                return None
            else:
                # a script without flags to check (docs/flags.py, benchmarks/*.sh): it exists
                return None
    except SystemExit as exit_:  # --help, 0
        return f"{relative} refuses it: {exit_}" if exit_.code else None
    except (runkit.UsageError, UsageError) as error:
        return f"{relative} refuses it: {error}"
    log_dir = (folder / cfg.log_dir).resolve()
    # a file of a run: in the runs' folder, seen from where it runs
    for name in ("resume", "evaluate"):
        value = getattr(cfg, name)
        if value not in (None, "auto") and not (folder / value).resolve().is_relative_to(log_dir):
            return f"--{name} {value} is not under --log_dir {log_dir} when run from {folder}"
    return None


def problems_of(command: Shown) -> list[str]:
    from torch.distributed.run import get_args_parser

    problems, folder, words = [], command.folder, words_of(command.text)
    env = dict(word.split("=", 1) for word in words if re.fullmatch(r"[A-Za-z_]\w*=.*", word))
    for argv in split_commands(words):
        program, args = argv[0], argv[1:]
        if program == "cd":
            folder = (folder / args[0]).resolve()
            if not folder.is_dir():
                problems.append(f"cd {args[0]}: no such folder")
            continue
        if program == "python" and args[:1] == ["-m"]:
            if args[1:2] != ["torch.distributed.run"]:
                continue  # pytest and the like
            program, args = "torchrun", args[2:]
        if program == "torchrun":
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    launch = get_args_parser().parse_args(args)
            except SystemExit:
                problems.append("torchrun refuses its flags")
                continue
            several_nodes = not launch.standalone and launch.nnodes != "1"
            if several_nodes and launch.rdzv_id == "none":
                problems.append("several nodes without --rdzv_id: the agents of "
                                "one job must share one")
            if several_nodes and launch.rdzv_backend == "c10d" and "--node_rank" in args:
                problems.append("--node_rank with the c10d rendezvous, which "
                                "gives the ranks itself")
            program, args = "python", [launch.training_script, *launch.training_script_args]
        if program == "python" and args:
            why = parse_script(args[0], args[1:], folder)
            problems += [why] if why else []
        elif program in ("bash", "sbatch"):
            script = next((arg for arg in args if re.search(r"\.(sh|sbatch)$", arg)), None)
            if script is None or not (folder / script).is_file():
                problems.append(f"{program}: no script {script} in {folder}")
            elif program == "sbatch" and "TRAIN_ARGS" in env:
                why = parse_script(f"{env.get('MODE', 'dist_parallel')}/train.py",
                                   shlex.split(env["TRAIN_ARGS"]), REPO)
                problems += [f"TRAIN_ARGS: {why}"] if why else []
        elif program == "pip" and args[:1] == ["install"]:
            if args[1:2] == ["-r"]:
                problems += [] if (folder / args[2]).is_file() else [f"pip: no {args[2]}"]
            required = {re.split(r"[<>=\s#]", line)[0].lower()
                        for line in (REPO / "requirements.txt").read_text() .splitlines()
                        if line.strip() and not line.startswith("#")}
            problems += [f"pip install {name}: requirements.txt installs it already"
                         for name in args[1:] if name.lower() in required]
    return problems


def test_every_command_the_docs_show_runs_as_shown():
    shown = shown_commands()
    assert len(shown) > 60 and any("docstring" in command.where for command in shown)
    problems = [f"{c.where}: {c.text}\n    {why}" for c in shown for why in problems_of(c)]
    assert not problems, "commands that would not run as shown:\n" + "\n".join(problems)


def test_a_command_shown_for_a_cpu_ends_in_minutes():
    """The README's offline command trained 50,000 images, 5-20 minutes on a CPU, for a
    comment that said minutes: a command whose comment says CPU or offline gives
    --synthetic_size and --epochs to fit."""
    from comparison.train_files import train_file

    for command in shown_commands():
        comment = command.text.split(" #", 1)[1] if " #" in command.text else ""
        *before, argv = split_commands(words_of(command.text))
        if not re.search(r"\b(CPU|offline)\b", comment) or "train.py" not in " ".join(argv):
            continue
        folder = command.folder
        for cd in (words for words in before if words[0] == "cd"):  # `cd X && python train.py`
            folder = (folder / cd[1]).resolve()
        script = next(arg for arg in argv if arg.endswith("train.py"))
        mode = (folder / script).resolve().parent.name
        cfg = train_file(mode).get_args([a for a in argv[argv.index(script) + 1:] if a != "..."])
        if cfg.dataset == "synthetic":
            assert "--epochs" in argv and cfg.epochs * cfg.synthetic_size <= CPU_IMAGES, \
                command.where


def test_the_docs_quote_each_measured_figure_as_its_source_does():
    """guide.md quoted the CPU comparison from one run (1.68 ± 0.07×, 84 ± 4 %) and
    comparing.md's report from another (1.68 ± 0.10×, 84 ± 5 %): every spread guide.md quotes is
    one the report in comparing.md shows."""
    report = (REPO / "docs" / "comparing.md").read_text()
    quoted = re.findall(r"\d+(?:\.\d+)? ± \d+(?:\.\d+)?\s?[×%]",
                        prose((REPO / "docs" / "guide.md").read_text()))
    assert quoted and [figure for figure in quoted if figure not in report] == []


def test_no_page_kills_processes_by_a_name_every_user_shares():
    """`pkill -f dist_parallel/train.py` on a shared node ends other users' runs: no page shows a
    command that kills by a process's name (pkill, killall)."""
    for page in pages():
        text = page.read_text()
        for match in re.finditer(r"(?:`|^)\s*(?:pkill|killall)\b([^`\n]*)", text, re.MULTILINE):
            named = [word for word in match.group(1).split() if not word.startswith("-")]
            assert not named, (f"{where(page, text.count(chr(10), 0, match.start()) + 1)}: "
                               f"{match.group(0)}")


def test_the_command_checker_finds_what_the_docs_got_wrong(tmp_path):
    """Each mistake the docs made, caught."""
    wrong = {
        "cd single_gpu && python train.py ... --resume "
        "runs/exp1/checkpoint.pt": "not under --log_dir",
        "torchrun --nnodes 2 --node_rank 1 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint "
        "H:1 dist_parallel/train.py": "--rdzv_id",
        "python train.py --epochs 1": "no such file",
        "cd fsdp && sbatch slurm/multi_node.sbatch": "no script",
        # docs/interruptions.md had it, in a code span
        "pip install tensorboard": "installs it already",
        "python compare.py --repeat 0": "refuses it",
        "cd single_gpu && python train.py --resume auto": "refuses it",
    }
    for text, why in wrong.items():
        problems = problems_of(Shown("page:1", REPO, text))
        assert any(why in problem for problem in problems), (text, problems)
    assert problems_of(Shown("page:1", REPO, "cd fsdp && torchrun --nnodes 2 --nproc_per_node 8 "
                                             "--rdzv_id J --rdzv_backend c10d --rdzv_endpoint H:1 "
                                             "train.py --batch_size 16 --evaluate "
                                             "../runs/<run>/model.pt")) == []


# ---------------------------------------------------------------------------------- the floors
def test_the_oldest_versions_ci_installs_are_the_floors_requirements_declare():
    """constraints-oldest.txt pins each requirement to its floor, and nothing else: CI's second
    environment (.ci/run) is then the oldest install requirements.txt allows, and a floor moved in
    one file without the other fails here."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    def lines(name: str) -> list[Requirement]:
        text = (REPO / name).read_text()
        return [Requirement(line.split("#")[0]) for line in text.splitlines()
                if line.split("#")[0].strip()]

    floors = {}
    for requirement in lines("requirements.txt"):
        (floor,) = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        floors[requirement.name] = Version(floor)
    pins = {}
    for requirement in lines("constraints-oldest.txt"):
        (spec,) = requirement.specifier
        assert spec.operator == "==", requirement
        pins[requirement.name] = Version(spec.version)
    assert pins == floors
    assert "-c constraints-oldest.txt" in (REPO / ".ci" / "run").read_text()
