"""The config system: the Kconfig tree, shipped defconfigs, and strict validation of every value."""

from __future__ import annotations

import os
from pathlib import Path

import kconfiglib
import pytest

from lib import config as kc
from lib.errors import ConfigError

DEFCONFIGS = kc.defconfig_names()
FRAGMENTS = kc.fragment_names()


def test_kconfig_tree_parses_cleanly_and_every_symbol_has_help():
    kconf = kconfiglib.Kconfig(str(kc.KCONFIG), warn_to_stderr=False)
    assert kconf.warnings == []
    missing = [sym.name for sym in kconf.unique_defined_syms if not any(n.help for n in sym.nodes)]
    assert missing == []
    missing_choices = [c.name_and_loc for c in kconf.unique_choices if not any(n.help for n in c.nodes)]
    assert missing_choices == []


def test_seed_symbol_names_exist():
    kconf = kconfiglib.Kconfig(str(kc.KCONFIG), warn_to_stderr=False)
    for name in ("HYPER_PARAM_AUTO", "HYPER_PARAM_MANUAL", "TARGET_EFFECTIVE_BATCH", "BATCH_SIZE",
                 "COMPILE_AUTO", "COMPILE_MANUAL", "COMPILE_MODEL"):
        assert name in kconf.syms and kconf.syms[name].nodes, name


def test_ships_the_required_defconfigs():
    assert {"lenet5", "resnet18", "resnet50", "gpt2", "gpt2-tiny"} <= set(DEFCONFIGS)
    assert "cpu-smoke" in FRAGMENTS


@pytest.mark.parametrize("name", DEFCONFIGS)
def test_defconfig_loads_every_value_takes_and_is_minimal(name, tmp_path):
    out = tmp_path / ".config"
    config = kc.make_defconfig(name, out=out)
    assert out.is_file()
    # savedefconfig of the result reproduces the shipped file byte for byte
    assert kc.minimal_config_text(out) == (kc.DEFCONFIG_DIR / name).read_bytes().decode()
    assert kc.listnewconfig(out) == []
    assert kc.read_config(out) == config
    assert config.hyperparam_mode == "auto" and config.target_effective_batch


@pytest.mark.parametrize("name", DEFCONFIGS)
def test_cpu_smoke_fragment_merges_onto_every_defconfig(name, tmp_path):
    config = kc.make_defconfig(name, ["cpu-smoke"], out=tmp_path / ".config")
    assert config.device == "cpu" and config.max_steps == 3


def test_typed_values(tmp_path):
    config = kc.make_defconfig("gpt2-tiny", out=tmp_path / ".config")
    assert config.model == "gpt2" and config.gpt2_preset == "tiny"
    assert config.gpt2_block_size == 128 and isinstance(config.learning_rate, float)
    assert config.resnet_image_size is None and config.batch_size is None
    assert config.symbols["MODEL_GPT2"] == "y"
    with pytest.raises(AttributeError):
        config.learning_rate = 1.0  # frozen


def test_fragment_can_switch_a_choice(tmp_path):
    config = kc.make_defconfig("lenet5", ["manual-batch"], out=tmp_path / ".config")
    assert config.hyperparam_mode == "manual"
    assert (config.batch_size, config.gradient_accumulation) == (32, 2)
    assert config.target_effective_batch is None


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


BAD_INPUTS = {
    "undefined symbol": ("CONFIG_NO_SUCH_THING=y\n", "NO_SUCH_THING"),
    "malformed int": ("CONFIG_EPOCHS=ten\n", "EPOCHS"),
    "int out of range": ("CONFIG_EPOCHS=0\n", "EPOCHS"),
    "target out of range": ("CONFIG_TARGET_EFFECTIVE_BATCH=0\n", "TARGET_EFFECTIVE_BATCH"),
    "dependency unmet": ("CONFIG_HYPER_PARAM_AUTO=y\nCONFIG_BATCH_SIZE=128\n", "BATCH_SIZE"),
    "hidden choice member": ("CONFIG_GPT2_PRESET_TINY=y\n", "GPT2_PRESET_TINY"),
    "bad learning rate": ('CONFIG_LEARNING_RATE="fast"\n', "LEARNING_RATE"),
    "zero learning rate": ('CONFIG_LEARNING_RATE="0"\n', "LEARNING_RATE"),
    "negative weight decay": ('CONFIG_WEIGHT_DECAY="-1"\n', "WEIGHT_DECAY"),
    "malformed line": ("CONFIG_EPOCHS 3\n", "CONFIG_EPOCHS 3"),
    "bad bool": ("CONFIG_GRADIENT_CHECKPOINTING=maybe\n", "GRADIENT_CHECKPOINTING"),
    "deselected default": ("# CONFIG_HYPER_PARAM_AUTO is not set\n", "HYPER_PARAM_AUTO"),
    "bad run name": ('CONFIG_RUN_NAME="../escape"\n', "RUN_NAME"),
}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_bad_defconfig_is_an_error_naming_the_symbol_and_writes_nothing(case, tmp_path):
    text, symbol = BAD_INPUTS[case]
    bad = write(tmp_path / "bad", text)
    out = write(tmp_path / ".config", "# the user's file\n")
    before = out.stat().st_mtime_ns
    with pytest.raises(ConfigError) as err:
        kc.make_defconfig(str(bad), out=out)
    assert symbol in str(err.value)
    assert out.read_text() == "# the user's file\n" and out.stat().st_mtime_ns == before
    assert not (tmp_path / ".config.old").exists()


def test_error_says_why(tmp_path):
    with pytest.raises(ConfigError, match=r"outside the allowed range 1\.\.100000"):
        kc.make_defconfig(str(write(tmp_path / "d", "CONFIG_EPOCHS=0\n")), out=tmp_path / ".config")
    with pytest.raises(ConfigError, match=r"depends on HYPER_PARAM_MANUAL"):
        kc.make_defconfig(str(write(tmp_path / "d", "CONFIG_BATCH_SIZE=128\n")), out=tmp_path / ".config")


def test_fragment_whose_value_does_not_take_is_refused(tmp_path):
    out = tmp_path / ".config"
    with pytest.raises(ConfigError, match=r"fragments/grad-checkpointing.*GRADIENT_CHECKPOINTING.*MODEL_LENET5"):
        kc.make_defconfig("lenet5", ["grad-checkpointing"], out=out)
    assert not out.exists()


def test_unknown_defconfig_and_fragment_list_the_choices(tmp_path):
    with pytest.raises(ConfigError, match="lenet5"):
        kc.make_defconfig("nope", out=tmp_path / ".config")
    with pytest.raises(ConfigError, match="cpu-smoke"):
        kc.make_defconfig("lenet5", ["nope"], out=tmp_path / ".config")


def test_hand_edited_config_is_validated_and_left_untouched(tmp_path):
    path = tmp_path / ".config"
    kc.make_defconfig("resnet18", out=path)
    text = path.read_text().replace("CONFIG_HYPER_PARAM_AUTO=y", "CONFIG_HYPER_PARAM_AUTO=y\nCONFIG_BATCH_SIZE=64")
    path.write_text(text)
    for action in (kc.read_config, kc.olddefconfig, kc.listnewconfig):
        with pytest.raises(ConfigError, match="BATCH_SIZE"):
            action(path)
        assert path.read_text() == text
    with pytest.raises(ConfigError, match="BATCH_SIZE"):
        kc.savedefconfig(path, tmp_path / "defconfig")
    assert not (tmp_path / "defconfig").exists()


def test_missing_config_names_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"no such file.*defconfig"):
        kc.read_config(tmp_path / "absent")


def test_olddefconfig_fills_new_symbols_and_keeps_old_copy(tmp_path):
    path = write(tmp_path / ".config", "CONFIG_EPOCHS=7\n")
    assert kc.listnewconfig(path)  # everything else is new
    kc.olddefconfig(path)
    assert kc.listnewconfig(path) == []
    assert kc.read_config(path).epochs == 7
    assert (tmp_path / ".config.old").read_text() == "CONFIG_EPOCHS=7\n"


def test_savedefconfig_round_trip(tmp_path):
    path = tmp_path / ".config"
    kc.make_defconfig("resnet50", ["cpu-smoke"], out=path)
    out = kc.savedefconfig(path, tmp_path / "defconfig")
    again = kc.make_defconfig(str(out), out=tmp_path / "again")
    assert again.to_dict() | {"source": ""} == kc.read_config(path).to_dict() | {"source": ""}


def test_kconfig_config_env_selects_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("KCONFIG_CONFIG", str(tmp_path / "other.config"))
    assert kc.config_path() == tmp_path / "other.config"
    monkeypatch.delenv("KCONFIG_CONFIG")
    assert kc.config_path() == Path(".config")
    assert os.environ.get("KCONFIG_CONFIG") is None


def test_fragment_may_hide_what_the_base_set_and_says_so(tmp_path):
    notes: list[str] = []
    config = kc.make_defconfig("gpt2-tiny", ["manual-batch"], out=tmp_path / ".config", notes=notes)
    assert config.hyperparam_mode == "manual" and config.target_effective_batch is None
    assert len(notes) == 1 and "TARGET_EFFECTIVE_BATCH=64" in notes[0] and "HYPER_PARAM_AUTO" in notes[0]


def test_a_fragment_value_must_take_where_it_is_merged(tmp_path):
    bad = write(tmp_path / "bad", "CONFIG_HYPER_PARAM_MANUAL=y\nCONFIG_TARGET_EFFECTIVE_BATCH=128\n")
    with pytest.raises(ConfigError, match=r"bad: CONFIG_TARGET_EFFECTIVE_BATCH=128 did not take"):
        kc.make_defconfig("lenet5", [str(bad)], out=tmp_path / ".config")


def test_contradictions_within_one_file_are_errors(tmp_path):
    twice = write(tmp_path / "twice", "CONFIG_EPOCHS=0\nCONFIG_EPOCHS=5\n")
    with pytest.raises(ConfigError, match=r"EPOCHS \(defined at .*\) set more than once"):
        kc.make_defconfig(str(twice), out=tmp_path / ".config")
    two = write(tmp_path / "two", "CONFIG_MODEL_RESNET18=y\nCONFIG_MODEL_GPT2=y\n")
    with pytest.raises(ConfigError, match="MODEL_RESNET18=y and CONFIG_MODEL_GPT2=y"):
        kc.make_defconfig(str(two), out=tmp_path / ".config")


def test_numbers_read_as_the_c_tools_do(tmp_path):
    config = kc.make_defconfig(str(write(tmp_path / "d", "CONFIG_EPOCHS=040\n")), out=tmp_path / ".config")
    assert config.epochs == 40
    assert hash(config) == hash(kc.read_config(tmp_path / ".config"))


@pytest.mark.parametrize("value,message", [("-1", "> 0"), ("nan", "finite"), ("inf", "finite"), ("0", "> 0")])
def test_learning_rate_messages(tmp_path, value, message):
    with pytest.raises(ConfigError, match=message):
        kc.make_defconfig(str(write(tmp_path / "d", f'CONFIG_LEARNING_RATE="{value}"\n')), out=tmp_path / ".config")


# --- new areas: planner profile, tuning ranges, programmatic changes -------------


@pytest.mark.parametrize("fragment, share", [
    ("", 0.90),
    ("CONFIG_MEMORY_PROFILE_CONSERVATIVE=y\n", 0.50),
    ("CONFIG_MEMORY_PROFILE_EXTREME=y\n", 0.97),
    ("CONFIG_MEMORY_PROFILE_CUSTOM=y\nCONFIG_MEMORY_PROFILE_PERCENT=60\n", 0.60),
])
def test_memory_profile_is_a_share_of_free_memory(fragment, share, tmp_path):
    frag = write(tmp_path / "frag", fragment)
    config = kc.make_defconfig("lenet5", [str(frag)], out=tmp_path / ".config")
    assert config.hyperparam_policy == "planner" and config.memory_profile == pytest.approx(share)


def test_memory_profile_prompts_state_the_shares_the_reader_gives():
    """lib/config/profiles.py is the one source of the shares; the Kconfig prompts repeat them in words."""
    kconf = kconfiglib.Kconfig(str(kc.KCONFIG), warn=False)
    for name, share in kc.MEMORY_PROFILES.items():
        [node] = kconf.syms["MEMORY_PROFILE_" + name].nodes
        assert f"{share:.0%} of free memory" in node.prompt[0], (name, node.prompt[0])
    assert kconf.syms["MEMORY_PROFILE_PERCENT"].nodes[0].defaults[0][0].str_value == f"{kc.DEFAULT_SHARE * 100:.0f}"
    assert kc.DEFAULT_SHARE == kc.MEMORY_PROFILES["BALANCED"] == 0.90 and kc.MEMORY_PROFILES["EXTREME"] == 0.97


def test_manual_mode_has_no_batch_policy(tmp_path):
    config = kc.make_defconfig("lenet5", ["manual-batch"], out=tmp_path / ".config")
    assert config.hyperparam_policy is None and config.memory_profile is None


@pytest.mark.parametrize("text, symbol", [
    ('CONFIG_LR_FINDER_MIN_LR="1"\nCONFIG_LR_FINDER_MAX_LR="0.1"\n', "LR_FINDER_MIN_LR"),
    ('CONFIG_HPO_LR_MIN="0.1"\nCONFIG_HPO_LR_MAX="0.01"\n', "HPO_LR_MIN"),
    ('CONFIG_HPO_BATCH_SIZES="16 big"\n', "HPO_BATCH_SIZES"),
    ('CONFIG_HPO_BATCH_SIZES="0 16"\n', "HPO_BATCH_SIZES"),
    ("CONFIG_HPO_MIN_RESOURCE=5\nCONFIG_HPO_MAX_RESOURCE=3\n", "HPO_MIN_RESOURCE"),
    ("# CONFIG_HPO_OPTIMIZER_SGD is not set\n# CONFIG_HPO_OPTIMIZER_ADAMW is not set\n", "HPO_OPTIMIZER"),
    ('CONFIG_MODEL_CUSTOM=y\nCONFIG_CUSTOM_MODEL_FACTORY="no colon"\n', "CUSTOM_MODEL_FACTORY"),
    ("CONFIG_THERMAL_PAUSE=y\nCONFIG_THERMAL_PAUSE_AT_C=80\nCONFIG_THERMAL_RESUME_BELOW_C=80\n",
     "THERMAL_RESUME_BELOW_C=80 must be below CONFIG_THERMAL_PAUSE_AT_C=80"),
])
def test_values_kconfig_cannot_range_check_are_checked(text, symbol, tmp_path):
    out = write(tmp_path / ".config", "# the user's file\n")
    with pytest.raises(ConfigError, match=symbol):
        kc.make_defconfig(str(write(tmp_path / "d", text)), out=out)
    assert out.read_text() == "# the user's file\n"


def test_hpo_batch_sizes_are_parsed_sorted_and_unique(tmp_path):
    frag = write(tmp_path / "frag", 'CONFIG_HPO_BATCH_SIZES="64 16 64 32"\n')
    assert kc.make_defconfig("lenet5", [str(frag)], out=tmp_path / ".config").hpo_batch_sizes == (16, 32, 64)


def test_derive_changes_values_through_strict_validation(tmp_path):
    config = kc.make_defconfig("lenet5", out=tmp_path / ".config")
    changed = kc.derive(config, {"LEARNING_RATE": 0.0123, "CONFIG_OPTIMIZER_SGD": True,
                                 "TARGET_EFFECTIVE_BATCH": 64, "RUN_NAME": "trial-1", "RESUME": False})
    assert (changed.learning_rate, changed.optimizer, changed.target_effective_batch) == (0.0123, "sgd", 64)
    assert changed.run_name == "trial-1" and changed.resume is False and changed.sgd_momentum is not None
    assert config.optimizer == "adamw" and config == kc.read_config(tmp_path / ".config")  # untouched
    with pytest.raises(ConfigError, match="BATCH_SIZE=5 did not take: its dependencies are not met"):
        kc.derive(config, {"BATCH_SIZE": 5})
    with pytest.raises(ConfigError, match="CONFIG_NOPE is not a kfit option"):
        kc.derive(config, {"NOPE": 1})
    with pytest.raises(ConfigError) as err:
        kc.derive(config, {"EPOCHS": 0})
    assert "requested change: CONFIG_EPOCHS=0 did not take" in str(err.value)


def test_apply_assignments_writes_only_valid_changes(tmp_path):
    path = tmp_path / ".config"
    kc.make_defconfig("lenet5", out=path)
    before = path.read_text()
    with pytest.raises(ConfigError):
        kc.apply_assignments(path, {"LEARNING_RATE": "fast"})
    assert path.read_text() == before
    kc.apply_assignments(path, {"LEARNING_RATE": "0.2", "HPO_STUDY_NAME": 'a "quoted" name'})
    config = kc.read_config(path)
    assert config.learning_rate == 0.2 and config.hpo_study_name == 'a "quoted" name'
    assert (tmp_path / ".config.old").read_text() == before


# --------------------------------------------------------------------------
# Files that are not UTF-8 text, or not files (issue 16, defects 3 and 16)


def _bytes_everywhere(path: Path) -> dict:
    return {p.name: p.read_bytes() for p in path.parent.iterdir() if p.is_file()}


def test_a_non_utf8_byte_is_refused_with_file_line_and_offset_everywhere(tmp_path):
    config = tmp_path / ".config"
    kc.make_defconfig("lenet5", out=config)
    good = config.read_bytes()
    lines = good.count(b"\n")
    config.write_bytes(good + b"# caf\xe9\n")
    before = _bytes_everywhere(config)
    offset = len(good) + len(b"# caf")
    expected = (f"{config}: line {lines + 1}, byte 6 of the line (offset {offset} in the file): byte 0xe9 is not "
                "UTF-8")
    for call in (lambda: kc.read_config(config), lambda: kc.olddefconfig(config), lambda: kc.listnewconfig(config),
                 lambda: kc.savedefconfig(config, tmp_path / "defconfig"),
                 lambda: kc.apply_assignments(config, {"EPOCHS": 3}), lambda: kc.edit_config(config, print)):
        with pytest.raises(ConfigError) as err:
            call()
        assert str(err.value).startswith(expected) and "the file must be UTF-8 text" in str(err.value)
        assert _bytes_everywhere(config) == before  # nothing written, not even a .old
    fragment = tmp_path / "frag"
    fragment.write_bytes(b"CONFIG_EPOCHS=3\n\xff\n")
    config.write_bytes(good)
    for call in (lambda: kc.merge_fragment(str(fragment), config), lambda: kc.make_defconfig("lenet5", [str(fragment)],
                                                                                              out=config)):
        with pytest.raises(ConfigError, match=rf"^{fragment}: line 2, byte 1 of the line \(offset 16 in the file\): "
                                              r"byte 0xff is not UTF-8 \(invalid start byte\)"):
            call()
        assert config.read_bytes() == good


def test_kconfig_config_naming_a_directory_says_so_and_moves_nothing(tmp_path, monkeypatch):
    directory = tmp_path / "adir"
    directory.mkdir()
    monkeypatch.setenv("KCONFIG_CONFIG", str(directory))
    with pytest.raises(ConfigError, match=rf"KCONFIG_CONFIG={directory} is a directory, not a config file.*"
                                          rf"KCONFIG_CONFIG={directory}/\.config"):
        kc.config_path()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]  # writing used to move it to adir.old
    with pytest.raises(ConfigError, match="is a directory"):
        kc.read_config(directory)  # given directly, not through KCONFIG_CONFIG


def test_defconfig_config_is_built_in_memory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = kc.defconfig_config("lenet5")
    assert config.source == "defconfigs/lenet5" and config.model == "lenet5" and config.text
    assert config.text == kc.make_defconfig("lenet5", out=tmp_path / "written").text
    assert [p.name for p in tmp_path.iterdir()] == ["written"]


def test_checkpoint_control_symbols_are_off_by_default_and_parsed_strictly(tmp_path):
    from lib.metrics import higher_is_better

    config = kc.make_defconfig("lenet5", out=tmp_path / ".config")
    assert (config.checkpoint_best_keep, config.early_stop_patience) == (0, 0)
    assert config.checkpoint_best_metric is None and config.early_stop_min_delta is None  # hidden while off
    frag = write(tmp_path / "frag", 'CONFIG_CHECKPOINT_BEST_KEEP=3\nCONFIG_CHECKPOINT_BEST_METRIC="accuracy"\n'
                                    'CONFIG_EARLY_STOP_PATIENCE=4\nCONFIG_EARLY_STOP_MIN_DELTA="1e-3"\n')
    config = kc.make_defconfig("lenet5", [str(frag)], out=tmp_path / ".config")
    assert (config.checkpoint_best_keep, config.checkpoint_best_metric) == (3, "accuracy")
    assert (config.early_stop_patience, config.early_stop_min_delta) == (4, 1e-3)
    assert [higher_is_better(m, None) for m in ("eval_loss", "perplexity", "accuracy", "macro_f1", "bleu")] == [
        False, False, True, True, None]
    # a name is checked against the model's evaluation when training starts (a custom model's may be "bleu")
    assert kc.make_defconfig(str(write(tmp_path / "d", 'CONFIG_CHECKPOINT_BEST_KEEP=1\nCONFIG_CHECKPOINT_BEST_'
                                       'METRIC="bleu"\n')), out=tmp_path / "b.config").checkpoint_best_metric == "bleu"
    for text, message in [('CONFIG_CHECKPOINT_BEST_KEEP=1\nCONFIG_CHECKPOINT_BEST_METRIC="top-5"\n', "not a metric name"),
                          ('CONFIG_EARLY_STOP_PATIENCE=1\nCONFIG_EARLY_STOP_MIN_DELTA="-0.1"\n', "out of range"),
                          ('CONFIG_EARLY_STOP_MIN_DELTA="0.1"\n', "EARLY_STOP_MIN_DELTA")]:  # while it is off
        with pytest.raises(ConfigError, match=message):
            kc.make_defconfig(str(write(tmp_path / "d", text)), out=tmp_path / "bad.config")
    assert not (tmp_path / "bad.config").exists()


@pytest.mark.parametrize("line", ["Authorization: Bearer S3CRETPW", "S3CRETPW", "machine h login u password S3CRETPW",
                                  "ghp_S3CRETPWxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "export API=S3CRETPW"])
def test_a_line_of_another_file_given_as_a_config_is_never_echoed(line, tmp_path):
    """A credentials file given as a fragment (one CONFIG_ line among its own) had its other lines echoed in
    "ignoring malformed line '...'" (an audit): such a line is named by its number, its text not shown; a
    mistyped CONFIG_ line still is."""
    bad = write(tmp_path / "bad", f"CONFIG_EPOCHS=3\n{line}\n")
    with pytest.raises(ConfigError) as err:
        kc.make_defconfig(str(bad), out=tmp_path / ".config")
    assert "S3CRETPW" not in str(err.value) and "malformed line" in str(err.value) and ":2" in str(err.value)


@pytest.mark.parametrize("name", ["MY_HUB_LOGIN", "HF_TOKEN_VALUE", "DEPLOY_KEY_ID"])
def test_the_value_of_an_unknown_symbol_is_never_shown(name, tmp_path):
    """A fragment assigning CONFIG_HF_TOKEN_VALUE="..." had its value echoed (the name does not end in a
    secret's word; an audit): the name of an unknown symbol is what the message needs, never its value."""
    bad = write(tmp_path / "bad", f'CONFIG_EPOCHS=3\nCONFIG_{name}="S3CRETPW"\n')
    with pytest.raises(ConfigError) as err:
        kc.make_defconfig(str(bad), out=tmp_path / ".config")
    assert name in str(err.value) and "S3CRETPW" not in str(err.value)
