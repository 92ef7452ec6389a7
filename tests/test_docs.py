"""The documentation against the code: docs/flags.md is what docs/flags.py writes now, every relative link in
README.md and docs/*.md reaches a file (and a heading, for an anchor into a page), and every --flag they name is a
flag of the script they name it for. All in this process, from the parsers the scripts use: no script is started."""
from __future__ import annotations

import functools
import importlib.util
import re
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


# ---------------------------------------------------------------------------------------------- markdown
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)((?:(?!\n[ \t]*\n)[\s\S])*?[^`])\1(?!`)")  # never across a blank line
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>\n]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)"
                  r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
DEFINITION = re.compile(r"^ {0,3}\[[^\]\n]+\]:[ \t]*(<[^>\n]*>|\S+)", re.MULTILINE)
ATX = re.compile(r"^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(?:=+|-+)[ \t]*$")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:name|id)=[\"']([^\"']+)[\"']", re.IGNORECASE)
EXTERNAL = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:|//)")  # http:, https:, mailto:, any scheme; //host


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
    """`text` with fenced code blocks and inline code spans blanked out, every character at its place (a newline
    stays a newline), so that offsets still give line numbers."""
    lines = text.split("\n")
    kept = "\n".join(" " * len(line) if code else line for line, code in zip(lines, fenced(lines)))
    return CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), kept)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: lowercased, every character but letters, digits, _, - and spaces
    dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or an image: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors a page's headings (ATX and setext, outside code) and HTML anchors give, as GitHub numbers
    repeated ones (x, x-1, x-2, ...)."""
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
    return [(blank.count("\n", 0, offset) + 1, target.strip("<>")) for offset, target in sorted(found)]


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """'file:line: target (why)' for each relative link of `page` that reaches nothing under `root`."""
    problems = []
    for line, target in links(page.read_text()):
        if not target or EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        path = unquote(path)
        file = page if not path else (root / path.lstrip("/")) if path.startswith("/") else page.parent / path
        file = Path(file).resolve()
        if not file.is_relative_to(root.resolve()):
            problems.append(f"{where(page, line)}: {target} (outside the repository)")
        elif not file.exists():
            problems.append(f"{where(page, line)}: {target} (no such file)")
        elif anchor and file.suffix == ".md" and file.is_file() and unquote(anchor) not in anchors(file.read_text()):
            problems.append(f"{where(page, line)}: {target} (no heading of {file.name} has the anchor #{anchor})")
    return problems


# ------------------------------------------------------------------------------------------------- flags
SCRIPTS = ("single_gpu/train.py", "data_parallel/train.py", "dist_parallel/train.py", "fsdp/train.py", "compare.py",
           "benchmarks/profile_step.py", "benchmarks/roofline.py")
# A line that names a script checks its flags against that script's (several named: any of theirs).
MENTIONS = {
    "single_gpu/train.py": re.compile(r"(?<![\w-])single_gpu/"),
    "data_parallel/train.py": re.compile(r"(?<![\w-])data_parallel/"),
    "dist_parallel/train.py": re.compile(r"(?<![\w-])dist_parallel/"),
    "fsdp/train.py": re.compile(r"(?<![\w-])fsdp/"),
    "compare.py": re.compile(r"(?<![\w-])compare\.py\b"),
    "benchmarks/profile_step.py": re.compile(r"(?<![\w-])profile_step\.py\b"),
    "benchmarks/roofline.py": re.compile(r"(?<![\w-])roofline\.py\b"),
}
# Other tools' flags that the documentation names, wherever it names them.
OTHER_TOOLS = {
    # torchrun (torch.distributed.run)
    "--standalone", "--nproc_per_node", "--nnodes", "--node_rank", "--rdzv_backend", "--rdzv_endpoint", "--rdzv_id",
    "--max-restarts", "--local_addr", "--master_addr", "--master_port", "--signals-to-handle",
    # torch.distributed.launch, the launcher before torchrun: named as what these scripts do not take
    "--local_rank",
    # pytest and pytest-xdist
    "--durations", "--dist",
    # sbatch, srun, scontrol and scancel (SLURM)
    "--nodes", "--gres", "--gpus-per-node", "--ntasks", "--ntasks-per-node", "--time", "--signal", "--requeue",
    "--kill-on-bad-exit", "--wait",
    # tensorboard
    "--logdir",
    # py-spy
    "--pid",
    # no tool's: a flag in general, as prose names one ("every `--flag` they name")
    "--flag",
}
FLAG = re.compile(r"(?<![\w-])--([A-Za-z][\w-]*)")  # not `--`, `---`, `-->`, a--b, nor an em dash
URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://\S*")


@functools.cache
def script_flags() -> dict[str, frozenset[str]]:
    """Each script's --flags, from the parser it reads its command line with."""
    return {script: frozenset(option for action in generator().parser_of(script)._actions
                              for option in action.option_strings if option.startswith("--"))
            for script in SCRIPTS}


def named_flags(line: str) -> list[str]:
    """The --flags a line names (--name=value as --name)."""
    return ["--" + name.rstrip("-") for name in FLAG.findall(URL.sub(" ", line))]


def logical_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, line, context) of every line: the context is the line itself, or in a code block the whole
    command it continues (lines joined by a trailing backslash)."""
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
    """Whether `flag` is one of `flags`: as it is, as the --no_ form of one, or as the setting a --no_ flag turns
    off (--reshard_after_forward for --no_reshard_after_forward)."""
    return (flag in flags or (flag.startswith("--no_") and "--" + flag[len("--no_"):] in flags)
            or "--no_" + flag[2:] in flags)


def unknown_flags(page: Path) -> list[str]:
    """'file:line: --flag (why)' for each --flag of `page` that neither the script its line names nor, where it
    names none, any script or OTHER_TOOLS has."""
    per_script = script_flags()
    every = frozenset().union(*per_script.values())
    problems = []
    for number, line, context in logical_lines(page.read_text()):
        named = [script for script, mention in MENTIONS.items() if mention.search(context)]
        allowed = frozenset().union(*(per_script[s] for s in named)) if named else every
        for flag in named_flags(line):
            if not is_flag_of(flag, allowed | OTHER_TOOLS):
                whose = f"not a flag of {' or '.join(named)}" if named else "no script has it, nor another tool listed"
                problems.append(f"{where(page, number)}: {flag} ({whose})")
    return problems


# ------------------------------------------------------------------------------------------------- tests
def test_flags_page_is_what_the_generator_writes():
    expected = generator().render()
    page = REPO / GENERATED
    actual = page.read_text() if page.exists() else ""
    if actual != expected:
        old, new = actual.split("\n"), expected.split("\n")
        first = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        pytest.fail(f"{GENERATED} is stale (first difference at line {first + 1}): run `python docs/flags.py`",
                    pytrace=False)


def test_relative_links_resolve():
    problems = [problem for page in pages() for problem in broken_links(page)]
    assert not problems, "links that reach nothing:\n" + "\n".join(problems)


def test_named_flags_exist():
    problems = [problem for page in pages() if page != REPO / GENERATED for problem in unknown_flags(page)]
    assert not problems, "flags that no script named takes:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------- the checkers themselves
def test_flag_finder_skips_dashes_that_are_no_flags():
    for text in ("a -- b", "|---|---|", "<!-- a comment -->", "a --- b", "word--word", "a — b – c", "``--``",
                 "torchrun ... -- python", "https://example.com/--path", "-n auto", "x---y"):
        assert named_flags(text) == [], text
    assert named_flags("python train.py --batch_size 4 --no_shuffle") == ["--batch_size", "--no_shuffle"]
    assert named_flags("`--gres=gpu:8`, (--max-restarts), --lr.") == ["--gres", "--max-restarts", "--lr"]


def test_flag_checker_reads_the_script_a_line_names(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "python compare.py --repeat 3 --sync_bn on",           # 1: compare.py's
        "python compare.py --verify_sync",                     # 2: a train.py flag compare.py does not pass on
        "torchrun --standalone dist_parallel/train.py --sync_bn",  # 3: torchrun's, then the script's
        "python fsdp/train.py --sync_bn",                      # 4: DDP's only
        "python fsdp/train.py --reshard_after_forward --no_compile",  # 5: the setting; the --no_ form
        "python train.py --bucket_cap_mb 50 --no_such_flag",   # 6: no script named: any script's
        "```bash",
        "torchrun --nnodes 2 \\",
        "    fsdp/train.py --bucket_cap_mb 50",                # 9: the command of line 8 names fsdp
        "```",
    ]))
    assert unknown_flags(page) == [f"{page}:2: --verify_sync (not a flag of compare.py)",
                                   f"{page}:4: --sync_bn (not a flag of fsdp/train.py)",
                                   f"{page}:6: --no_such_flag (no script has it, nor another tool listed)",
                                   f"{page}:9: --bucket_cap_mb (not a flag of fsdp/train.py)"]


def test_link_checker_finds_missing_files_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Title\n\n## DDP or FSDP: `set_epoch` — when?\n\n## Title\n"
                                                "\nSetext heading\n--------------\n\n```\n# not a heading\n```\n")
    page = tmp_path / "README.md"
    page.write_text("\n".join([
        "[ok](docs/other.md) [ok](docs/other.md#ddp-or-fsdp-set_epoch--when) ![img](docs/other.md)",  # 1
        "[ok](docs/other.md#title-1) [ok](docs/other.md#setext-heading) [ok](#own) [ok](https://x.org/a.md)",
        "[missing](docs/none.md) [bad anchor](docs/other.md#not-a-heading) [out](../../elsewhere.md)",  # 3
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
        f"{page}:3: docs/other.md#not-a-heading (no heading of other.md has the anchor #not-a-heading)",
        f"{page}:3: ../../elsewhere.md (outside the repository)",
        f"{page}:4: #nothing-here (no heading of README.md has the anchor #nothing-here)",
        f"{page}:9: docs/gone.md (no such file)",
    ]
