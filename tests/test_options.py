"""Every option of the Kconfig tree as a typed value, from the tree itself (lib/config/options.py): an option
added to a kconfigs/ file is readable as config.options.<name> with nothing written for it in lib/config/, a
validator beside it states what Kconfig cannot, and the checked-in stub editors read is never stale."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lib import config as kc
from lib.config import kconfig as kconfig_module
from lib.config.kconfig import new_kconfig
from lib.config.options import fields, stub
from lib.config.rules import VALIDATORS
from lib.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_the_stub_is_generated_from_the_tree_as_it_is():
    """lib/config/options.pyi is what `make genoptions` writes now: run it after changing a kconfigs/ file."""
    assert (ROOT / "lib" / "config" / "options.pyi").read_text() == stub(new_kconfig()), \
        "lib/config/options.pyi is stale: run 'make genoptions'"


def test_every_field_is_one_option_and_no_two_share_a_name():
    names = [name for name, *_ in fields(new_kconfig())]
    assert len(names) == len(set(names)) > 100


@pytest.mark.parametrize("name", kc.defconfig_names())
def test_each_option_reads_as_its_kconfig_type(name):
    config = kc.defconfig_config(name)
    kinds = {field: kind for field, kind, *_ in fields(new_kconfig())}
    for field, value in config.options.as_dict().items():
        kind = kinds[field]
        if value is None:
            continue
        if kind.startswith("Literal"):
            assert f'"{value}"' in kind, (field, value)
        else:
            assert type(value).__name__ == kind.split(" |")[0], (field, value, kind)
    # the hand-typed fields agree with the tree's
    assert config.options.model == config.model and config.options.float8 == config.float8
    assert config.options.epochs == config.epochs and config.options.max_steps == config.max_steps


NEW_OPTION = '''
config TOY_SPLIT_PERCENT
\tint "Share of the data held out (toy option added by a test)"
\tdefault 10
\trange 0 90
\thelp
\t  A test's new option: nothing in lib/config/ names it.

choice
\tprompt "Toy schedule (added by a test)"
\tdefault TOY_SCHEDULE_SLOW

config TOY_SCHEDULE_SLOW
\tbool "slow"

config TOY_SCHEDULE_FAST
\tbool "fast"

endchoice
'''


@pytest.fixture
def tree_with_a_new_option(tmp_path, monkeypatch):
    """A copy of the Kconfig tree with two options added to one kconfigs/ file, and kfit reading it."""
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(ROOT / "Kconfig", tree / "Kconfig")
    shutil.copytree(ROOT / "kconfigs", tree / "kconfigs")
    with open(tree / "kconfigs" / "Kconfig.training", "a") as area:
        area.write(NEW_OPTION)
    monkeypatch.setattr(kconfig_module, "KCONFIG", tree / "Kconfig")
    return tree


def test_an_option_added_to_the_tree_is_read_with_nothing_written_for_it(tree_with_a_new_option, tmp_path,
                                                                          monkeypatch):
    """The worked example of docs/architecture.md: a Kconfig entry and the code that reads it."""
    config = kc.make_defconfig("lenet5", out=tmp_path / ".config")
    assert config.options.toy_split_percent == 10 and config.options.toy_schedule == "slow"
    fragment = tmp_path / "fragment"
    fragment.write_text("CONFIG_TOY_SPLIT_PERCENT=40\nCONFIG_TOY_SCHEDULE_FAST=y\n")
    config = kc.make_defconfig("lenet5", [str(fragment)], out=tmp_path / ".config")
    assert config.options.toy_split_percent == 40 and config.options.toy_schedule == "fast"
    # strict as every option: a value that does not take is an error naming it
    fragment.write_text("CONFIG_TOY_SPLIT_PERCENT=95\n")
    with pytest.raises(ConfigError, match="TOY_SPLIT_PERCENT"):
        kc.make_defconfig("lenet5", [str(fragment)], out=tmp_path / ".config")
    # a rule Kconfig cannot state: a validator beside the option
    def even(value, options):
        if value % 2:
            raise ConfigError(f"CONFIG_TOY_SPLIT_PERCENT={value} must be even: choose {value + 1}")
    monkeypatch.setitem(VALIDATORS, "toy_split_percent", even)
    fragment.write_text("CONFIG_TOY_SPLIT_PERCENT=41\n")
    with pytest.raises(ConfigError, match="must be even: choose 42"):
        kc.make_defconfig("lenet5", [str(fragment)], out=tmp_path / ".config")
    # the stub editors read names it once regenerated (make genoptions), with its help text
    assert "toy_split_percent: int | None" in stub(new_kconfig())
    assert 'toy_schedule: Literal["slow", "fast"] | None' in stub(new_kconfig())


def test_a_hidden_option_reads_as_none_and_options_do_not_change_equality():
    lenet = kc.defconfig_config("lenet5")
    assert lenet.options.gpt2_preset is None and lenet.options.llama_block_size is None
    again = kc.defconfig_config("lenet5")
    assert again == lenet and again.options == lenet.options
    with pytest.raises(AttributeError, match="no option 'NO_SUCH_OPTION'"):
        lenet.options.no_such_option
