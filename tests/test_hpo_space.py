"""CONFIG_HPO_SPACE, CONFIG_HPO_OBJECTIVE and CONFIG_HPO_FOLDS: the space parsed and checked against the Kconfig
symbols, the objective's direction, the study keeping both, and a real search through make hpo."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
import torch

from lib import config as kc
from lib import hpo
from tests.test_hpo import assert_refused, kfit_cli


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("space")
    fragment = tmp / "fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp}/runs"\nCONFIG_DEVICE_CPU=y\nCONFIG_HPO_STUDY_NAME="space"\n'
                        'CONFIG_HPO_MIN_RESOURCE=1\nCONFIG_HPO_MAX_RESOURCE=1\nCONFIG_HPO_PATIENCE=0\n')
    return kc.make_defconfig("lenet5", [str(fragment)], out=tmp / "config")


def test_the_default_space_is_the_fixed_one(lenet):
    space = hpo.search_space(lenet)
    assert list(space) == ["learning_rate", "weight_decay", "optimizer", "effective_batch"]
    assert space["learning_rate"] == optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)
    assert lenet.hpo_objective == "eval_loss" and lenet.hpo_folds == 1


def test_a_space_names_int_number_and_choice_symbols(lenet):
    cfg = kc.derive(lenet, {"HPO_SPACE": "LEARNING_RATE=1e-5..1e-1:log WARMUP_STEPS=0..500 OPTIMIZER=ADAMW|SGD "
                                         "TARGET_EFFECTIVE_BATCH=32|64"})
    space = hpo.search_space(cfg)
    assert space["LEARNING_RATE"] == optuna.distributions.FloatDistribution(1e-5, 1e-1, log=True)
    assert space["WARMUP_STEPS"] == optuna.distributions.IntDistribution(0, 500)
    assert space["OPTIMIZER"].choices == ("ADAMW", "SGD")
    assert space["TARGET_EFFECTIVE_BATCH"].choices == (32, 64)
    assert hpo.space_text(space) == ("LEARNING_RATE=1e-05..0.1:log WARMUP_STEPS=0..500 OPTIMIZER=ADAMW|SGD "
                                     "TARGET_EFFECTIVE_BATCH=32|64")
    trial = kc.derive(cfg, hpo.assignments({"LEARNING_RATE": 0.01, "WARMUP_STEPS": 7, "OPTIMIZER": "SGD",
                                            "TARGET_EFFECTIVE_BATCH": 64}))
    assert (trial.learning_rate, trial.warmup_steps, trial.optimizer, trial.target_effective_batch) == \
        (0.01, 7, "sgd", 64)
    gpt2 = kc.derive(kc.defconfig_config("gpt2-tiny"), {"HPO_SPACE": "GPT2_DROPOUT=0..0.3 WARMUP_STEPS=0..500"})
    assert hpo.search_space(gpt2)["GPT2_DROPOUT"] == optuna.distributions.FloatDistribution(0.0, 0.3)
    assert hpo.search_space(kc.derive(lenet, {"HPO_SPACE": "DROPOUT=0..0.5"}))["DROPOUT"] == \
        optuna.distributions.FloatDistribution(0.0, 0.5)
    with pytest.raises(hpo.KfitError, match="CONFIG_DROPOUT.*depends on MODEL_LENET5"):  # a symbol GPT-2 hides
        hpo.search_space(kc.derive(gpt2, {"HPO_SPACE": "DROPOUT=0..0.5"}))


@pytest.mark.parametrize("entry, needle", [
    ("FOO=1..2", "CONFIG_FOO is not a kfit option"),
    ("LEARNING_RATE", "write NAME=LOW..HIGH"),
    ("OPTIMIZER=ADAMW|LION", "choose among SGD|ADAM|ADAMW"),
    ("OPTIMIZER=1..2", "list its members"),
    ("WARMUP_STEPS=0..2000000", "takes 0..1000000"),
    ("WARMUP_STEPS=a..b", "takes whole numbers"),
    ("LEARNING_RATE=0..1:log", "log scale needs a low end above 0"),
    ("LEARNING_RATE=-1..1", "out of range"),
    ("LEARNING_RATE=1..0.1", "must be below"),
    ("LEARNING_RATE=1e-3..1:cube", "no scale"),
    ("GPT2_DROPOUT=0..0.3", "depends on MODEL_GPT2"),  # a symbol lenet5 hides
    ("DROPOUT=0..1", 'CONFIG_DROPOUT="1" is out of range: it must be in [0, 1)'),
    ("RUN_NAME=1..2", "not searched"),
    ("EPOCHS=1..3", "HPO_MAX_RESOURCE"),
    ("DEVICE_CPU=1..2", "yes/no option"),
    ("WARMUP_STEPS=0..5 WARMUP_STEPS=1..2", "searched twice"),
])
def test_a_bad_entry_is_one_error_naming_it(lenet, entry, needle):
    with pytest.raises(hpo.KfitError) as err:
        hpo.search_space(kc.derive(lenet, {"HPO_SPACE": entry}))
    message = str(err.value)
    assert "\n" not in message and "CONFIG_HPO_SPACE entry" in message and needle in message, message


def test_the_objective_sets_the_direction_and_a_study_keeps_it(lenet, tmp_path):
    url = f"sqlite:///{tmp_path}/o.db"
    accuracy = kc.derive(lenet, {"HPO_OBJECTIVE_ACCURACY": True})
    study = hpo.open_study(accuracy, url)
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    study.set_user_attr("objective", "accuracy")
    hpo.check_objective(study, accuracy, url)
    with pytest.raises(hpo.KfitError, match="scores trials by accuracy.*CONFIG_HPO_OBJECTIVE_EVAL_LOSS.*HPO_STUDY="):
        hpo.check_objective(study, lenet, url)


def test_macro_f1_weighs_every_class_alike():
    # labels 0,0,0,1; predictions 0,0,0,0: class 0 F1 = 6/7, class 1 F1 = 0
    # (class 2 occurs nowhere: it does not count)
    from lib.data import DatasetInfo
    from lib.metrics import builtin

    metrics = builtin(DatasetInfo("t", "image", 3, 1, 1, 0, 0, 4, 4, ""))
    running = metrics.fresh(torch.device("cpu"))
    running["macro_f1"].update(torch.tensor([[1.0, 0, 0]] * 4), torch.tensor([0, 0, 0, 1]))
    assert metrics.finish({"macro_f1": running["macro_f1"]}, 0.0)["macro_f1"] == pytest.approx((6 / 7 + 0) / 2)


def test_folds_split_the_training_set(lenet):
    from lib.task import load_task

    task = load_task(lenet)
    parts = [hpo.fold_task(task, 3, f, 0) for f in range(3)]
    n = len(task.train)
    assert sum(len(p.eval) for p in parts) == n and all(len(p.train) + len(p.eval) == n for p in parts)
    x, y = parts[0].eval[[0, 1]]
    assert x.shape[0] == 2 and y.shape == (2,)


@pytest.mark.slow
def test_make_hpo_searches_the_kconfig_space_for_accuracy_over_folds(lenet, tmp_path):
    # LeNet-5's classifier dropout and the warm-up, for accuracy over 3 folds
    config = tmp_path / ".config"
    config.write_text(Path(lenet.source).read_text())
    kc.apply_assignments(config, {"HPO_SPACE": "DROPOUT=0..0.5 WARMUP_STEPS=0..50",
                                  "HPO_OBJECTIVE_ACCURACY": True, "HPO_FOLDS": 3})
    run = kfit_cli("hpo", tmp_path, KCONFIG_CONFIG=str(config), TRIALS="3")
    print(run.stdout)
    assert run.returncode == 0, run.stdout
    assert "Space: DROPOUT=0..0.5 WARMUP_STEPS=0..50; objective accuracy (maximised); 3-fold cross-validation" \
        in run.stdout
    assert run.stdout.count("(mean of 3 folds)") == 3
    drawn = [float(m) for m in re.findall(r"^trial \d+: DROPOUT=(\S+) WARMUP_STEPS=\d+ ", run.stdout, re.M)]
    assert len(drawn) == 3 and all(0 <= d <= 0.5 for d in drawn), run.stdout
    # each fold trained with its trial's dropout
    fold = Path(lenet.output_dir) / "hpo-space" / "trial-0000" / "fold-3" / "config"
    [value] = re.findall(r'^CONFIG_DROPOUT="(.+)"$', fold.read_text(), re.M)
    assert float(value) == pytest.approx(drawn[0], abs=1e-3)
    status = kfit_cli("hpo-status", tmp_path, KCONFIG_CONFIG=str(config))
    print(status.stdout)
    assert status.returncode == 0, status.stdout
    assert "3 trials: 3 complete" in status.stdout
    assert "space: DROPOUT=0..0.5 WARMUP_STEPS=0..50" in status.stdout
    assert "objective: accuracy (maximised), mean over 3 cross-validation folds" in status.stdout
    assert "best: trial" in status.stdout and ", accuracy " in status.stdout
    assert re.search(r"^ +DROPOUT=\S+ WARMUP_STEPS=\d+$", status.stdout, re.M), status.stdout
    # another objective for the same study: one error line, before any trial
    kc.apply_assignments(config, {"HPO_OBJECTIVE_EVAL_LOSS": True})
    assert_refused(kfit_cli("hpo", tmp_path, KCONFIG_CONFIG=str(config), TRIALS="1"), "objective changed")
    kc.apply_assignments(config, {"HPO_OBJECTIVE_ACCURACY": True, "HPO_SPACE": "FOO=1..2"})
    assert_refused(kfit_cli("hpo", tmp_path, KCONFIG_CONFIG=str(config), TRIALS="1"), "FOO=1..2")


def test_a_text_model_refuses_accuracy(tmp_path):
    gpt2 = kc.derive(kc.defconfig_config("gpt2-tiny"), {"HPO_OBJECTIVE_MACRO_F1": True,
                                                         "OUTPUT_DIR": str(tmp_path)})

    from lib.metrics import Metrics

    class Info:
        kind = "text"

    class Task:
        info = Info()
        metrics = Metrics("text", {})

    with pytest.raises(hpo.KfitError, match="reports no macro-F1.*eval_loss, perplexity.*CONFIG_HPO_OBJECTIVE_EVAL_LOSS"):
        from lib.hpo.runner import check_metric
        check_metric(gpt2, Task())
