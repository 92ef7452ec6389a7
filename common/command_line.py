"""A config dataclass's fields as command-line flags, and back. A field's default is the flag's
default and its metadata the help text and argparse's extras (its domain is checked by the config
itself: common/domains.py). A bool that defaults to False becomes `--name`; one that defaults to
True becomes `--no_name`, its help naming what it turns off ("turn off the paper's Nesterov
momentum (on by default)"); an optional bool (None: the run decides) gets both. Every long flag is
also accepted with hyphens, and a few with the short form of PyTorch's ImageNet example
(SHORT_FLAGS). A mistake is one line (UsageError) that names each flag as the user typed it, and
--help prints the script's docstring as written (HelpFormatter). `config_argv` writes the flags
that set given values: the parser's inverse. common/config.py's parse_config builds a Config with
them."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import sys
import typing

from common.errors import UsageError

# The short forms of PyTorch's ImageNet example (pytorch/examples, imagenet/main.py) whose flag
# means the same here, so that its commands paste: -b the global batch (its total batch of a
# node), -j the loader's worker processes (here each training process's), -a the model by
# torchvision's name (its --arch), -p the steps between two log lines (its --print-freq), -e an
# evaluation only (here of the weights whose path follows it; its -e is a switch that evaluates
# the --resume checkpoint, and -e alone is refused here saying so: MISSING_VALUES).
SHORT_FLAGS = {"batch_size": "-b", "num_workers": "-j", "model": "-a", "log_interval": "-p",
               "evaluate": "-e"}


# What a flag's missing value is, where that is not plain: -e is a switch in PyTorch's ImageNet
# example and takes the weights' path here
MISSING_VALUES = {
    "evaluate": "the path of the weights to evaluate after {flag}, a model.pt (--save_model) or "
                "a checkpoint.pt, as in {flag} runs/<run>/model.pt (PyTorch's ImageNet example's "
                "-e is a switch that evaluates its --resume checkpoint: here give that checkpoint "
                "after {flag}, without --resume)",
}


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; here a mistake is one line that says what to do, and
    names each flag as the user typed it. Every long flag is also accepted with hyphens for its
    underscores (`--batch-size`, `--no-nesterov`), as PyTorch's ImageNet example and timm write
    them; --help shows the underscores only."""

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)
        self._typed = {}  # a flag as argparse is given it -> as the user typed it
        self._parsed = self.with_underscores(self._given)
        return super().parse_known_args(self._parsed, namespace)

    def with_underscores(self, args: list) -> list:
        """`args` with each hyphenated long flag written as the parser knows it (`--batch-size 64`
        and `--batch-size=64` as `--batch_size`), up to a lone `--`. A flag whose underscored form
        names no flag (nor the start of one, which argparse takes for it) is left as it was typed,
        so that an error names it as the user wrote it."""
        known = list(self._option_string_actions)
        written = []
        for index, arg in enumerate(args):
            if arg == "--":
                return written + list(args[index:])
            name, equals, value = arg.partition("=") if isinstance(arg, str) else ("", "", "")
            if name.startswith("--") and "-" in name[2:]:
                underscored = "--" + name[2:].replace("-", "_")
                if any(option.startswith(underscored) for option in known):
                    arg = underscored + equals + value
                    getattr(self, "_typed", {})[underscored] = name
            written.append(arg)
        return written

    def as_typed(self, message: str) -> str:
        """`message` with every flag the user typed with hyphens named as typed (`--no-flip`, not
        the `--no_flip` argparse and the config know)."""
        for flag, typed in getattr(self, "_typed", {}).items():
            message = re.sub(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", typed, message)
        return message

    @contextlib.contextmanager
    def spelled_as_typed(self):
        """Around what checks the parsed values (a config's domains and rules): a UsageError names
        the flags as the user typed them."""
        try:
            yield
        except UsageError as error:
            raise UsageError(self.as_typed(str(error)), error.rank_specific) from None

    def error(self, message):
        missing = re.fullmatch(r"argument (\S+): expected one argument", message)
        if missing:
            message = self._without_value(missing[1].split("/"), message)
        raise UsageError(f"{self.as_typed(message)} (see --help)")

    def _without_value(self, names: list[str], message: str) -> str:
        """What to say of a flag among `names` given without its value: the value the user gave
        starts with - (-1e-4, -inf), which argparse takes for a flag, or there is none."""
        typed, abbreviated, after = self._flag_and_next(names)
        if after is not None and after.startswith("-") and not self._is_flag(after):
            return (f"{message} ({after} starts with -, which argparse takes for a flag: give it "
                    f"after =, as in {typed}={after})")
        dest = self._option_string_actions[names[0]].dest
        what = MISSING_VALUES.get(dest, "its value after {flag}").format(flag=typed)
        flag = "/".join(names)
        return f"argument {f'{typed} ({flag})' if abbreviated else flag}: give {what}"

    def _flag_and_next(self, names: list[str]) -> tuple[str, bool, str | None]:
        """The flag among `names` as the user typed it, given without a value (none follows, or
        what follows starts with -), whether it is an abbreviation, and what follows it."""
        longs = [name for name in names if name.startswith("--")]
        for index, arg in enumerate(self._parsed):
            if arg == "--":
                break
            if not isinstance(arg, str) or "=" in arg:
                continue
            abbreviated = (arg not in names and arg.startswith("--") and len(arg) > 2
                           and any(name.startswith(arg) for name in longs))
            after = self._given[index + 1] if index + 1 < len(self._given) else None
            if (arg in names or abbreviated) and (after is None or str(after).startswith("-")):
                return str(self._given[index]), abbreviated, None if after is None else str(after)
        return names[0], False, None

    def _is_flag(self, arg: str) -> bool:
        """Whether argparse takes `arg` for one of this parser's flags (or an abbreviation of one,
        or a short flag with its value attached, `-b64`)."""
        if arg.startswith("--"):
            name = "--" + arg.partition("=")[0][2:].replace("-", "_")
            return any(option.startswith(name) for option in self._option_string_actions)
        return arg[:2] in self._option_string_actions


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help as a reader takes it: the script's docstring as it is written (its command lines one a
    line, not run together into a paragraph), and after each flag its default where that says
    something: `(default: 128)`, an on/off flag's as words (`(on by default)`), none for a default
    of None (the run decides, and the flag's help says how)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or not action.option_strings or action.default is argparse.SUPPRESS:
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (off by default)"
        if isinstance(action, argparse._StoreFalseAction):
            return f"{text} (on by default)"
        if action.default is None or isinstance(action, argparse._StoreConstAction):
            return text
        # as it is typed: `on off`, not `('on', 'off')`
        if isinstance(action.default, (tuple, list)):
            return f"{text} (default: {' '.join(map(str, action.default))})"
        return super()._get_help_string(action)


def build_parser(config_class: type, description: str) -> argparse.ArgumentParser:
    parser = _OneLineParser(description=description, formatter_class=HelpFormatter)
    add_flags(parser, config_class)
    return parser


def add_flags(parser: argparse.ArgumentParser, config_class: type, skip=(),
              defaults: bool = True) -> None:
    """One flag per field of `config_class` (except `skip`). With defaults=False a flag that is
    not given is left out of the parsed namespace, so a caller can tell what the user chose
    (compare.py passes only those on)."""
    hints = typing.get_type_hints(config_class)
    for f in dataclasses.fields(config_class):
        if f.name in skip:
            continue
        meta = dict(f.metadata)
        help_text = meta.pop("help")
        meta.pop("domain", None)  # checked by the config itself (check_domains)
        kind = hints[f.name]
        default = f.default if defaults else argparse.SUPPRESS
        short = [SHORT_FLAGS[f.name]] if f.name in SHORT_FLAGS else []  # -b, as ImageNet's
        # a choice with a value that turns it off: --no_<name> stands for --<name> <that value>
        off = meta.pop("no_flag", None)
        if kind is bool:
            name = f"--no_{f.name}" if f.default else f"--{f.name}"
            parser.add_argument(name, *short, dest=f.name,
                                action="store_false" if f.default else "store_true",
                                default=default,
                                help=f"turn off {help_text}" if f.default else help_text)
            continue
        if kind == bool | None:  # on, off, or None: the run decides (from the device)
            parser.add_argument(f"--{f.name}", *short, dest=f.name, action="store_const",
                                const=True, default=default, help=help_text)
            parser.add_argument(f"--no_{f.name}", dest=f.name, action="store_const", const=False,
                                default=default, help=f"turn --{f.name} off")
            continue
        # X | None -> X
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
        if typing.get_origin(base) is tuple:
            base = typing.get_args(base)[0]
        parser.add_argument(f"--{f.name}", *short, type=base, default=default, help=help_text,
                            **meta)
        if off is not None:
            parser.add_argument(f"--no_{f.name}", dest=f.name, action="store_const", const=off,
                                default=default, help=f"the same as --{f.name} {off}")


def config_argv(config_class: type, values: dict) -> list[str]:
    """The flags that set `values` (field name -> value) on the command line: the inverse of the
    parser."""
    hints, argv = typing.get_type_hints(config_class), []
    defaults = {f.name: f.default for f in dataclasses.fields(config_class)}
    for name, value in values.items():
        if hints[name] is bool or hints[name] == bool | None:
            if value is not None and (hints[name] is not bool or value != defaults[name]):
                argv.append(f"--{name}" if value else f"--no_{name}")
        elif value is not None:
            argv += [f"--{name}", *map(str, value if isinstance(value, (tuple, list)) else [value])]
    return argv
