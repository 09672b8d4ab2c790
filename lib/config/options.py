"""Every option of the Kconfig tree as a typed value, derived from the tree itself: `config.options.<name>`.

A symbol's name in lower case is its field (CONFIG_EPOCHS -> `epochs`); its Kconfig type gives the Python type
(bool -> bool, int and hex -> int, string -> str, or float where lib/config/validators.py declares the string a
number with its bounds, `rules.number`, Kconfig having no float type); a choice is one field named by its members' common prefix,
whose value is the selected member's suffix in lower case (CONFIG_FLOAT8_ROWWISE=y -> `float8 == "rowwise"`).
A hidden symbol or choice reads as None. So an option added to a `kconfigs/Kconfig.<area>` file is readable
here as soon as it is in the tree, with nothing written for it in lib/config/: the code that uses it reads
`config.options.<name>`, and a rule Kconfig cannot state (a pattern, an order between two options) is a
validator beside its option in lib/config/validators.py (`rules.validator`).

`options.pyi` beside this module is generated from the tree (`kfit genoptions`, `make genoptions`) so that
editors and type checkers see every field with its help text, as the kernel generates autoconf.h;
tests/test_options.py fails when it is stale.
"""

from __future__ import annotations

import os
import textwrap
from typing import Iterator

import kconfiglib

from ..errors import ConfigError
from . import validators  # noqa: F401  (registers the options' validators)
from .rules import CONVERTERS, VALIDATORS, validator  # noqa: F401  (options.validator: registers one)

# What a value reads as, by Kconfig type
_TYPES = {kconfiglib.BOOL: "bool", kconfiglib.TRISTATE: "bool", kconfiglib.INT: "int", kconfiglib.HEX: "int",
          kconfiglib.STRING: "str"}


def choice_name(choice: kconfiglib.Choice) -> str | None:
    """A choice's option name: its members' common prefix up to its last '_' (MODEL_LENET5, MODEL_GPT2 ->
    "MODEL"); None where the members share none."""
    names = [sym.name for sym in choice.syms]
    prefix = os.path.commonprefix(names)
    prefix = prefix[:prefix.rfind("_")] if "_" in prefix else ""
    return prefix or None


def fields(kconf: kconfiglib.Kconfig) -> Iterator[tuple[str, str, str, str]]:
    """(field, Python type, Kconfig name, help text) of every option of the tree, in the tree's order: a choice's
    Kconfig name is its members' prefix (choice_name)."""
    members = {sym.name for choice in kconf.choices for sym in choice.syms}
    seen: set[str] = set()
    for node in kconf.node_iter():
        item = node.item
        if isinstance(item, kconfiglib.Choice):
            name = choice_name(item)
            if name is None or name in seen:
                continue
            values = ", ".join(f'"{sym.name[len(name) + 1:].lower()}"' for sym in item.syms)
            seen.add(name)
            # AUTO/MANUAL beside the value it switches (NPROC_AUTO, NPROC_MANUAL and NPROC): "nproc_mode"
            field = name.lower() + ("_mode" if name in kconf.syms else "")
            yield field, f"Literal[{values}] | None", name, node.help or (node.prompt or ("", None))[0]
        elif isinstance(item, kconfiglib.Symbol) and item.name not in members and item.orig_type in _TYPES \
                and f"symbol {item.name}" not in seen and node.prompt is not None:
            seen.add(f"symbol {item.name}")
            field = item.name.lower()
            kind = "float" if field in CONVERTERS else _TYPES[item.orig_type]  # a number in a string symbol
            yield field, f"{kind} | None", item.name, node.help or node.prompt[0]


class Options:
    """Every option of the tree, typed (see the module's docstring); read-only."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, object]) -> None:
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> object:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"the Kconfig tree has no option {name.upper()!r} (config.options.{name})") from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a config's options are read-only: derive another config")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Options) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items(), key=lambda kv: kv[0])))

    def __repr__(self) -> str:
        return f"Options({len(self._values)} options)"

    def __reduce__(self):
        return Options, (self._values,)

    def as_dict(self) -> dict[str, object]:
        return dict(self._values)


def options_of(kconf: kconfiglib.Kconfig) -> Options:
    """The tree's options as the loaded config sets them, each registered validator run on its value."""
    choices = {name: choice for choice in kconf.choices if (name := choice_name(choice)) is not None}
    values: dict[str, object] = {}
    for field, kind, name, _ in fields(kconf):
        if kind.startswith("Literal"):
            choice = choices[name]
            selected = choice.selection
            values[field] = (selected.name[len(name) + 1:].lower()
                             if selected is not None and choice.visibility else None)
            continue
        sym = kconf.syms[name]
        if sym.orig_type in (kconfiglib.BOOL, kconfiglib.TRISTATE):
            values[field] = sym.str_value == "y" if sym.visibility else None
        elif not (sym.visibility or sym.str_value) or not sym.str_value:
            values[field] = None
        elif sym.orig_type in (kconfiglib.INT, kconfiglib.HEX):  # base 10 as the C tools read it
            values[field] = int(sym.str_value, 16 if sym.orig_type == kconfiglib.HEX else 10)
        elif "\0" in sym.str_value:  # a path with one reaches the OS as a traceback (embedded null byte)
            raise ConfigError(f"CONFIG_{name} holds a NUL byte (\\0), which no path or name can hold: delete it")
        else:
            values[field] = CONVERTERS[field](sym.str_value) if field in CONVERTERS else sym.str_value
    options = Options(values)
    for name in CONVERTERS:
        if name not in values:
            raise ConfigError(f"a number is declared for {name!r}, which is not an option of the Kconfig tree")
    for name, check in VALIDATORS.items():
        if name not in values:
            raise ConfigError(f"a validator is registered for {name!r}, which is not an option of the Kconfig tree")
        check(values[name], options)
    return options


def stub(kconf: kconfiglib.Kconfig) -> str:
    """options.pyi: the Options class with every option's field, type and help text."""
    lines = ['"""Generated from the Kconfig tree by `kfit genoptions` (make genoptions): do not edit.',
             "Every option of the tree as a typed field of `config.options` (lib/config/options.py)."
             '"""', "", "from typing import Callable, Iterator, Literal", "", "import kconfiglib", "",
             "from .rules import VALIDATORS as VALIDATORS, validator as validator", "",
             "def choice_name(choice: kconfiglib.Choice) -> str | None: ...",
             "def fields(kconf: kconfiglib.Kconfig) -> Iterator[tuple[str, str, str, str]]: ...",
             "def options_of(kconf: kconfiglib.Kconfig) -> Options: ...",
             "def stub(kconf: kconfiglib.Kconfig) -> str: ...", "", "",
             "class Options:",
             '    """Every option of the tree, typed; read-only."""', "",
             "    def __init__(self, values: dict[str, object]) -> None: ...",
             "    def as_dict(self) -> dict[str, object]: ...", ""]
    for field, kind, name, text in fields(kconf):
        lines.append(f"    {field}: {kind}")
        doc = " ".join(text.split()).replace("\\", "\\\\").replace('"""', "'''")
        wrapped = textwrap.wrap(f"CONFIG_{name}{'_*' if kind.startswith('Literal') else ''}: {doc}", 108)
        lines += [f'    """{wrapped[0]}'] + [f"    {line}" for line in wrapped[1:]]
        lines[-1] += '"""'
    return "\n".join(lines) + "\n"

