"""Reading an engine's command line: which program it runs, its flags' values, its version's defaults.

Each engine's `cmdline.py` matches its process (`matches`) and turns its argv into its settings
(`parse_settings`); the helpers they share are here. Pure functions of strings: no /proc here
(sources/local/ reads the processes).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Mapping

from oomguard.exporter.model import EngineSetting

Cmdline = tuple[str, ...]
Settings = dict[str, EngineSetting]
# (argv, the engine's version or None, its environment or None) -> its settings by name.
SettingsParser = Callable[[Cmdline, str | None, Mapping[str, str] | None], Settings]
Matcher = Callable[[Cmdline], bool]

_INTERPRETER = re.compile(r"^python[\d.]*$")


def program(argv: Cmdline) -> tuple[str, Cmdline]:
    """The program run (basename) and its arguments, past an interpreter: `python3 /venv/bin/vllm serve` is
    ("vllm", ("serve", ...)); `python -m mod args` is ("-m mod", args)."""
    rest = list(argv)
    if rest and _INTERPRETER.match(os.path.basename(rest[0])):
        rest.pop(0)
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest.pop(0)  # the interpreter's own options (-u, -O)
        if len(rest) >= 2 and rest[0] == "-m":
            return f"-m {rest[1]}", tuple(rest[2:])
    if not rest:
        return "", ()
    return os.path.basename(rest[0]), tuple(rest[1:])


def flag(args: Iterable[str], *names: str) -> str | None:
    """The value of the last of `names` given (`--flag value` or `--flag=value`), None when absent. A long flag
    may be written with underscores (`--max_num_seqs`), as vLLM's parser accepts."""
    found = None
    items = list(args)
    for i, arg in enumerate(items):
        name, eq, inline = arg.partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        if name in names:
            if eq:
                found = inline
            elif i + 1 < len(items):
                found = items[i + 1]
    return found


def number(text: str | None) -> float | None:
    """A flag's value as a number, None when it is not one (a typo the engine itself would refuse)."""
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """ "0.8.5.post1" -> (0, 8, 5); None when there is no leading number."""
    if not version:
        return None
    # Bounded: int() refuses strings of thousands of digits, and no version has a part that long.
    parts = re.match(r"^v?(\d{1,9}(?:\.\d{1,9})*)(?!\d)", version.strip())
    return tuple(int(p) for p in parts.group(1).split(".")) if parts else None


def settings_from(
    args: Cmdline,
    table: Iterable[tuple[str, tuple[str, ...], float | None]],
    environ: Mapping[str, str] | None = None,
    env_names: Mapping[str, str] | None = None,
) -> Settings:
    """Each (setting, its flags, its default or None) of `table`: the flag's value (origin flag), else the
    environment variable named for it in `env_names` (origin flag: the operator set it), else the default."""
    out: Settings = {}
    for name, names, default in table:
        value = number(flag(args, *names))
        if value is None and environ is not None and env_names and name in env_names:
            value = number(environ.get(env_names[name]))
        if value is not None:
            out[name] = EngineSetting(value, "flag")
        elif default is not None:
            out[name] = EngineSetting(default, "default")
    return out
