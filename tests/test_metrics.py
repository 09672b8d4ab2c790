"""Evaluation metrics through torchmetrics (lib/metrics.py): the built-in classifiers' accuracy, top-5 accuracy
and macro-F1, and a custom model's own Metric objects, which are logged, rank best checkpoints, stop early,
score HPO trials and are computed over the ranks that share an evaluation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch

from lib import config as kc, hpo
from lib.distributed import Rank
from lib.errors import ConfigError
from lib.metrics import Metrics, builtin, higher_is_better, named, snake_name
from lib.data import DatasetInfo
from lib.oom import Injector
from lib.task import load_task
from tests.helpers import CPU, run

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:Fixed parameter:UserWarning")]  # HPO trials enqueued on purpose
ROOT = Path(__file__).resolve().parent.parent

FACTORY = '''
import torch, torch.nn as nn, torch.nn.functional as F
import torchmetrics

def make_batch(n, g):
    x = torch.randn(n, 8, generator=g)
    return x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()  # four classes a linear model can learn

def model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

def classifier():
    return model(), make_batch, F.cross_entropy, {"accuracy": torchmetrics.Accuracy(task="multiclass", num_classes=4)}

def one_metric():
    return model(), make_batch, F.cross_entropy, torchmetrics.F1Score(task="multiclass", num_classes=4, average="macro")

def per_class():
    return model(), make_batch, F.cross_entropy, {"recall": torchmetrics.Recall(task="multiclass", num_classes=4,
                                                                                    average=None)}

def not_a_metric():
    return model(), make_batch, F.cross_entropy, {"accuracy": 0.5}
'''


@pytest.fixture
def factory(tmp_path, monkeypatch):
    (tmp_path / "my_metrics.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_metrics"
    sys.modules.pop("my_metrics", None)


def custom(tmp_path, spec: str, manual: bool = True, **more):
    lines = ["CONFIG_MODEL_CUSTOM=y", f'CONFIG_CUSTOM_MODEL_FACTORY="{spec}"', "CONFIG_DEVICE_CPU=y",
             f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"', "CONFIG_CUSTOM_TRAIN_SAMPLES=512",
             'CONFIG_LEARNING_RATE="3e-2"', "CONFIG_EVAL_INTERVAL=4", "CONFIG_LOG_INTERVAL=4"]
    more.setdefault("CUSTOM_EVAL_SAMPLES", 200)
    if manual:
        lines += ["CONFIG_HYPER_PARAM_MANUAL=y", "CONFIG_BATCH_SIZE=32", "CONFIG_GRADIENT_ACCUMULATION=1"]
    lines += [f"CONFIG_{k}={v}" for k, v in more.items()]
    n = len(list(tmp_path.glob("defconfig*")))
    (tmp_path / f"defconfig{n}").write_text("\n".join(lines) + "\n")
    return kc.make_defconfig(str(tmp_path / f"defconfig{n}"), out=tmp_path / f"config{n}")


def evals(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval_loss" in r]


def reference_accuracy(model: torch.nn.Module, task) -> float:
    """The eval split's accuracy computed here, in one pass, without torchmetrics."""
    x, y = task.eval[list(range(len(task.eval)))]
    with torch.no_grad():
        return (model(x).argmax(-1) == y).double().mean().item()


def test_a_custom_classifiers_accuracy_is_logged_ranks_best_checkpoints_and_stops_early(tmp_path, factory):
    config = custom(tmp_path, f"{factory}:classifier", EPOCHS=2, CHECKPOINT_BEST_KEEP=1,
                    CHECKPOINT_BEST_METRIC='"accuracy"', EARLY_STOP_PATIENCE=50)
    trainer, result = run(config)
    rows = evals(result.run_dir)
    assert len(rows) >= 4 and all(0.0 <= r["accuracy"] <= 1.0 for r in rows)
    assert rows[-1]["accuracy"] == pytest.approx(reference_accuracy(trainer.model, load_task(config)), abs=1e-6)
    assert rows[-1]["accuracy"] > 0.5  # it learned (4 classes: chance is 0.25)
    best = max(rows, key=lambda r: (r["accuracy"], -r["step"]))  # higher is better; ties keep the earlier
    [kept] = result.run_dir.glob("best-*.pt")
    assert kept.name == f"best-{best['step']}.pt"
    # the direction came from the Metric itself
    assert load_task(config).metrics.lower_is_better("accuracy") is False


def test_a_metric_the_custom_model_does_not_return_is_refused_before_training(tmp_path, factory):
    config = custom(tmp_path, f"{factory}:classifier", CHECKPOINT_BEST_KEEP=1, CHECKPOINT_BEST_METRIC='"auroc"')
    with pytest.raises(ConfigError, match='"auroc": the evaluation of custom reports eval_loss, accuracy, not auroc'):
        run(config)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_an_hpo_study_maximises_a_custom_models_accuracy(tmp_path, factory):
    config = custom(tmp_path, f"{factory}:classifier", manual=False, HPO_OBJECTIVE_ACCURACY="y",
                    HPO_MIN_RESOURCE=1, HPO_MAX_RESOURCE=1, HPO_STUDY_NAME='"metrics"', HPO_BATCH_SIZES='"32"',
                    TARGET_EFFECTIVE_BATCH=32)
    study = hpo.open_study(config)
    for optimizer, rate in (("sgd", 1e-4), ("adamw", 3e-2)):  # one that barely moves, one that learns
        study.enqueue_trial({"optimizer": optimizer, "learning_rate": rate, "weight_decay": 1e-4,
                             "effective_batch": 32})
    study = hpo.run_study(config, CPU, trials=2, log=lambda line: None)
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    slow, fast = study.get_trials()
    assert fast.value > slow.value and hpo.best_trial(study).number == fast.number


def test_a_single_metric_is_named_after_its_class_and_a_bad_one_is_one_error(tmp_path, factory):
    assert load_task(custom(tmp_path, f"{factory}:one_metric")).metrics.names == ("eval_loss", "f1_score")
    with pytest.raises(ConfigError, match=r'"my_metrics:not_a_metric": the metric accuracy is a float, not a '
                                          "torchmetrics Metric"):
        load_task(custom(tmp_path, f"{factory}:not_a_metric"))
    trainer_config = custom(tmp_path, f"{factory}:per_class", MAX_STEPS=2)
    with pytest.raises(ConfigError, match=r"the metric recall \(MulticlassRecall\) computed Tensor of shape \[4\], "
                                          "not one number: give it an average="):
        run(trainer_config)


@pytest.mark.parametrize("cls, name", [("MulticlassAccuracy", "accuracy"), ("BinaryF1Score", "f1_score"),
                                       ("MeanSquaredError", "mean_squared_error"), ("AUROC", "auroc"),
                                       ("MultilabelAveragePrecision", "average_precision")])
def test_snake_names(cls, name):
    assert snake_name(type(cls, (), {})()) == name


def test_named_refuses_reserved_and_non_identifier_names():
    import torchmetrics

    acc = torchmetrics.Accuracy(task="binary")
    assert named(acc, "x") == {"accuracy": acc}
    for bad in ({"eval_loss": acc}, {"top-5": acc}, {}, [acc]):
        with pytest.raises(ConfigError, match="^x: "):
            named(bad, "x")
    assert higher_is_better("anything", torchmetrics.MeanSquaredError()) is False


def hand_metrics(logits: np.ndarray, labels: np.ndarray) -> dict:
    """Accuracy, top-5 accuracy and macro-F1 (over the classes among the labels or the predictions), here by
    hand with numpy: the instrument the torchmetrics objects are checked against."""
    guess = logits.argmax(-1)
    top5 = np.argsort(-logits, axis=-1)[:, :5]
    f1 = []
    for c in range(logits.shape[1]):
        tp, predicted, actual = ((guess == c) & (labels == c)).sum(), (guess == c).sum(), (labels == c).sum()
        if predicted + actual:
            f1.append(2 * tp / (predicted + actual))
    return {"accuracy": (guess == labels).mean(), "top5_accuracy": (top5 == labels[:, None]).any(-1).mean(),
            "macro_f1": float(np.mean(f1))}


class Split:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, indices):
        return self.x[indices], self.y[indices]


class Identity(torch.nn.Module):
    def forward(self, x):
        return x


@pytest.mark.parametrize("seed", range(12))
def test_built_in_image_metrics_match_a_hand_count_on_random_predictions(seed):
    """Random logits and labels (some classes absent, ties of batches and remainders), evaluated by the trainer's
    Evaluator with the logits as the "model": its figures are the hand count's, in any eval batch."""
    from lib.trainer.evaluation import Evaluator

    g = torch.Generator().manual_seed(seed)
    k = int(torch.randint(6, 15, (1,), generator=g))
    n = int(torch.randint(1, 300, (1,), generator=g))
    logits = torch.randn(n, k, generator=g)
    labels = torch.randint(0, max(2, k - 3), (n,), generator=g)  # the last classes never occur as labels
    info = DatasetInfo("t", "image", k, 1, 1, 0, 0, n, n, "")
    task = type("T", (), {"eval": Split(logits, labels), "loss": staticmethod(torch.nn.functional.cross_entropy),
                          "metrics": builtin(info)})()
    plan = type("P", (), {"num_workers": 0, "prefetch_factor": 0, "pin_memory": False, "precision": "fp32",
                          "device_type": "cpu", "eval_batch": 1 + seed * 7})()
    config = type("C", (), {"oom_recovery": False})()
    got = Evaluator(task, config, torch.device("cpu"), Injector()).measure(Identity(), plan, plan.eval_batch)
    want = hand_metrics(logits.numpy(), labels.numpy())
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=1e-6), name
    assert got["eval_loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item(), rel=1e-5)


@pytest.mark.slow
def test_every_rank_evaluates_its_share_and_the_metrics_are_the_whole_splits(tmp_path, factory):
    """GPUS=2 through the real torchrun (gloo): the accuracy both ranks computed from their halves of the eval
    split (summed by torchmetrics' sync) is the whole split's, as one process evaluates the final weights."""
    config = custom(tmp_path, f"{factory}:classifier", MAX_STEPS=8, CUSTOM_EVAL_SAMPLES=201)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "RESUME", "GPU")}
    env.update({"KCONFIG_CONFIG": str(config.source), "GPUS": "2", "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "kfit.py"), "train"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    [run_dir] = (tmp_path / "runs").iterdir()
    final = evals(run_dir)[-1]
    state = torch.load(next(run_dir.glob("checkpoint*.pt")), weights_only=False)
    task = load_task(config)
    model = task.build(False)
    model.load_state_dict(state["model"])
    assert final["accuracy"] == pytest.approx(reference_accuracy(model, task), abs=1e-6)
    x, y = task.eval[list(range(len(task.eval)))]
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(x), y).item()
    assert final["eval_loss"] == pytest.approx(loss, rel=1e-5)


def test_metrics_of_a_rank_are_summed_with_the_others(tmp_path):
    """The share each rank takes: batches r, r + world, ... ; under FSDP (lockstep) as many forwards each."""
    from lib.trainer.evaluation import Evaluator

    seen = []

    class Counting(torch.nn.Module):
        def forward(self, x):
            seen.append(len(x))
            return x
    n, k = 10, 6
    task = type("T", (), {"eval": Split(torch.randn(n, k), torch.randint(0, k, (n,))),
                          "loss": staticmethod(torch.nn.functional.cross_entropy), "metrics": Metrics("custom", {})})()
    plan = type("P", (), {"num_workers": 0, "prefetch_factor": 0, "pin_memory": False, "precision": "fp32",
                          "device_type": "cpu", "eval_batch": 3})()
    config = type("C", (), {"oom_recovery": False})()
    for rank, lockstep, sizes in ((Rank(1, 1, 3, 3), False, [3]), (Rank(2, 2, 3, 3), False, [3]),
                                  (Rank(0, 0, 3, 3), True, [3, 1]), (Rank(2, 2, 3, 3), True, [3, 3])):
        seen.clear()
        Evaluator(task, config, torch.device("cpu"), Injector(), rank, lockstep).measure(Counting(), plan, 3)
        assert seen == sizes, (rank, lockstep)
