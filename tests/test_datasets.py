"""Custom models fed by a map-style dataset (a torch Dataset, a Hugging Face one from local files) instead of
make_batch: read item by item from a temporary directory, planned and trained through the one loop."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from lib import config as kc
from lib.errors import ConfigError
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, TierPolicy, resolve
from lib.task import load_task

FACTORY = textwrap.dedent('''
    import os

    import numpy as np
    import torch

    DATA = os.environ["KFIT_TEST_DATA"]  # the test writes a .npy there; items are read from it lazily

    class OnDisk(torch.utils.data.Dataset):
        """(x, sum of x) rows of a memory-mapped file: nothing is loaded until an item is asked for."""

        def __init__(self, start, stop, as_dict=False):
            self.start, self.stop, self.as_dict = start, stop, as_dict

        def __len__(self):
            return self.stop - self.start

        def __getitem__(self, i):
            x = torch.from_numpy(np.array(np.load(DATA, mmap_mode="r")[self.start + i]))
            y = x.sum(dim=0, keepdim=True)
            return {"inputs": x, "labels": y} if self.as_dict else (x, y)

    def mse(out, y):
        return torch.nn.functional.mse_loss(out, y)

    def pair():
        return torch.nn.Linear(4, 1), (OnDisk(0, 96), OnDisk(96, 128)), mse

    def single_dicts():
        return torch.nn.Linear(4, 1), OnDisk(0, 100, as_dict=True), mse

    def streaming():
        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                yield torch.zeros(4), torch.zeros(1)
        return torch.nn.Linear(4, 1), Stream(), mse

    def empty_eval():
        return torch.nn.Linear(4, 1), (OnDisk(0, 96), OnDisk(0, 0)), mse

    def ragged():
        class Ragged(torch.utils.data.Dataset):
            def __len__(self):
                return 10
            def __getitem__(self, i):
                return torch.zeros(i + 1), torch.zeros(1)
        return torch.nn.Linear(4, 1), Ragged(), mse

    def hugging_face():
        import datasets

        csv = os.path.join(os.path.dirname(DATA), "rows.csv")
        ds = datasets.load_dataset("csv", data_files=csv, split="train")
        ds = ds.map(lambda r: {"inputs": [r["a"], r["b"], r["c"], r["d"]], "labels": [r["a"] + r["b"] + r["c"] + r["d"]]},
                    remove_columns=["a", "b", "c", "d"]).with_format("torch")
        return torch.nn.Linear(4, 1), ds, mse
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    import numpy as np

    rows = torch.randn(128, 4, generator=torch.Generator().manual_seed(0)).numpy()
    np.save(tmp_path / "rows.npy", rows)
    (tmp_path / "rows.csv").write_text("a,b,c,d\n" + "\n".join(",".join(f"{v:.6f}" for v in r) for r in rows) + "\n")
    monkeypatch.setenv("KFIT_TEST_DATA", str(tmp_path / "rows.npy"))
    (tmp_path / "my_data.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    yield "my_data"
    sys.modules.pop("my_data", None)
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def custom_config(tmp_path, factory: str, **extra):
    lines = ["CONFIG_MODEL_CUSTOM=y", f'CONFIG_CUSTOM_MODEL_FACTORY="{factory}"', "CONFIG_DEVICE_CPU=y"]
    lines += [f"CONFIG_{k}={v}" for k, v in extra.items()]
    (tmp_path / "defconfig").write_text("\n".join(lines) + "\n")
    return kc.make_defconfig(str(tmp_path / "defconfig"), out=tmp_path / ".config")


def train(tmp_path, config):
    from lib.trainer import train as fit

    hardware = resolve_hardware(gpu="cpu")
    plan = resolve(config, hardware, ModelDescription.from_config(config), 1, TierPolicy())
    losses = []
    result = fit(config, plan, hardware, run_dir=tmp_path / "run", log=lambda _: None,
                 on_eval=lambda step, epoch, metrics: losses.append(metrics["eval_loss"]))
    return plan, result, losses


TRAINING = dict(EPOCHS=5, TARGET_EFFECTIVE_BATCH=32, WARMUP_STEPS=0, LEARNING_RATE='"0.1"', OUTPUT_DIR='"runs"',
                LOG_INTERVAL=100)


def test_a_dataset_on_disk_is_planned_and_trained_like_built_in_data(tmp_path, user_module):
    config = custom_config(tmp_path, f"{user_module}:pair", **TRAINING)
    task = load_task(config)
    assert (len(task.train), len(task.eval)) == (96, 32) and "OnDisk" in task.info.description
    x, y = task.eval[[0, 3]]
    assert x.shape == (2, 4) and torch.allclose(y, x.sum(dim=1, keepdim=True))
    plan, result, losses = train(tmp_path, config)
    assert plan.effective_batch == 32 and result.steps == 15  # 96 samples / 32 x 5 epochs
    assert losses[-1] < losses[0] / 2  # a linear model learns a sum


def test_one_dataset_gives_its_tail_to_evaluation_and_dict_items_work(tmp_path, user_module):
    task = load_task(custom_config(tmp_path, f"{user_module}:single_dicts"))
    assert (len(task.train), len(task.eval)) == (90, 10)
    x, y = task.eval[[0]]
    whole = load_task(custom_config(tmp_path, f"{user_module}:pair")).train[[90]]  # the same file row
    assert torch.equal(x, whole[0]) and torch.equal(y, whole[1])


def test_a_hugging_face_dataset_from_local_files_trains_through_the_same_path(tmp_path, user_module):
    pytest.importorskip("datasets")
    config = custom_config(tmp_path, f"{user_module}:hugging_face", **TRAINING)
    task = load_task(config)
    assert (len(task.train), len(task.eval)) == (116, 12) and "Dataset" in task.info.description
    _, result, losses = train(tmp_path, config)
    assert result.steps > 0 and losses[-1] < losses[0] / 2


@pytest.mark.parametrize("factory, message", [
    ("streaming", "the training data is a stream .*set CONFIG_MAX_STEPS"),
    ("empty_eval", "the evaluation dataset is empty"),
    ("ragged", "collating the dataset's first 2 items"),
])
def test_datasets_kfit_cannot_use_are_one_error(tmp_path, user_module, factory, message):
    with pytest.raises(ConfigError, match=message):
        load_task(custom_config(tmp_path, f"{user_module}:{factory}"))
