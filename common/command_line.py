"""A config dataclass's fields as command-line flags, and back. A field's default is the flag's
default and its metadata the help text and argparse's extras (its domain is checked by the config
itself: common/domains.py). A bool that defaults to False becomes `--name`; one that defaults to
True becomes `--no_name`, its help naming what it turns off ("turn off the paper's Nesterov
momentum (on by default)"); an optional bool (None: the run decides) gets both. Every long flag is
also accepted with hyphens, and a few with the short form of PyTorch's ImageNet example
(SHORT_FLAGS). A mistake is one line (UsageError), and --help prints the script's docstring as
written (HelpFormatter). `config_argv` writes the flags that set given values: the parser's
inverse. common/config.py's parse_config builds a Config with them."""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

from common.errors import UsageError

# The short forms of PyTorch's ImageNet example (pytorch/examples, imagenet/main.py) whose flag
# means the same here, so that its commands paste: -b the global batch (its total batch of a
# node), -j the loader's worker processes (here each training process's), -a the model by
# torchvision's name (its --arch), -p the steps between two log lines (its --print-freq), -e an
# evaluation only (here of the weights whose path follows it; its -e evaluates the --resume
# checkpoint).
SHORT_FLAGS = {"batch_size": "-b", "num_workers": "-j", "model": "-a", "log_interval": "-p",
               "evaluate": "-e"}


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; here a mistake is one line that says what to do.
    Every long flag is also accepted with hyphens for its underscores (`--batch-size`,
    `--no-nesterov`), as PyTorch's ImageNet example and timm write them; --help shows the
    underscores only."""

    def parse_known_args(self, args=None, namespace=None):
        given = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(self.with_underscores(given), namespace)

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
            written.append(arg)
        return written

    def error(self, message):
        if message.endswith("expected one argument"):  # argparse takes -1e-4 or -inf for a flag
            message += " (a value that starts with - goes after =, as in --flag=-value)"
        raise UsageError(f"{message} (see --help)")


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
