"""What several test modules share that is not a fixture (the fixtures are in conftest.py): the CPU profile
and tiny in-process runs, the kfit command line, fake NVML, synthetic data sets and problems, a fake plan.

Test modules import from here, never from one another: pytest would also collect what a test module imports
from another, and a module's import would run the other's module-level code on the worker that imports it.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import pickle
import struct
import sys
import types
from pathlib import Path

import numpy as np
import torch

from lib import config as kc
from lib.errors import PlanError
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.plan import Plan
from lib.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent
KFIT = [sys.executable, str(ROOT / "scripts" / "kfit.py")]


def counting_resolves(log: Path) -> dict[str, str]:
    """The environment under which every process started (torchrun's ranks too) logs each plan it resolves to
    `log`, one line "<pid> <model> world_size=<n>" (tests/hooks/sitecustomize.py)."""
    hooks = str(ROOT / "tests" / "hooks")
    path = os.pathsep.join(p for p in (hooks, os.environ.get("PYTHONPATH")) if p)
    return {"KFIT_TEST_RESOLVE_LOG": str(log), "PYTHONPATH": path}


def kfit_script():
    """scripts/kfit.py loaded as a module (its main, as make runs it), apart from any other test's copy."""
    spec = importlib.util.spec_from_file_location("kfit_cli", ROOT / "scripts" / "kfit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------
# Tiny in-process runs on the CPU (the make_config and one_thread fixtures are in conftest.py)

CPU = resolve_hardware(gpu="cpu")


def run(config, **kwargs):
    plan = resolve(config, CPU, ModelDescription.from_config(config))
    trainer = Trainer(config, plan, CPU, log=lambda line: None, **kwargs)
    return trainer, trainer.fit()


def manual(batch: int, accum: int, extra: str = "") -> str:
    return f"CONFIG_HYPER_PARAM_MANUAL=y\nCONFIG_BATCH_SIZE={batch}\nCONFIG_GRADIENT_ACCUMULATION={accum}\n{extra}"


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, atol: float) -> None:
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(p, q, atol=atol, rtol=1e-4, msg=name)



# --------------------------------------------------------------------------
# kfit train in a subprocess on a LeNet-5 config

def write_config(tmp_path: Path, text: str, name: str = ".config") -> Path:
    (tmp_path / "fragment").write_text(text)
    kc.make_defconfig("lenet5", [str(tmp_path / "fragment")], out=tmp_path / name)
    return tmp_path / name


def kfit_env(config: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUS", "WORLD_SIZE", "RESUME", "KFIT_INJECT_OOM")}
    # One thread: beside other test processes on few cores, two spinning OpenMP threads per run were
    # measured 30x slower. All three runs use the same setting, so their losses stay comparable bit for bit.
    return {**env, "KCONFIG_CONFIG": str(config), "OMP_NUM_THREADS": "1", **extra}


# --------------------------------------------------------------------------
# Fake NVML with the API surface lib.hardware uses

class FakeNVMLError(Exception):
    pass


class FakeLibraryNotFound(FakeNVMLError):
    pass


class FakeDriverNotLoaded(FakeNVMLError):
    pass


class FakeLibRmVersionMismatch(FakeNVMLError):
    pass


def fake_pynvml(devices=(), *, init_error=None, cuda_driver=12040, telemetry=None):
    """devices: (name, total_bytes, free_bytes) per GPU, as NVML reports them.

    telemetry: the readings every GPU reports (util, temp, power_mw, reasons);
    change mod.telemetry to change them.  A key left out is NVML_ERROR_NOT_SUPPORTED."""
    calls = []
    mod = types.SimpleNamespace(
        NVMLError=FakeNVMLError,
        NVMLError_LibraryNotFound=FakeLibraryNotFound,
        NVMLError_DriverNotLoaded=FakeDriverNotLoaded,
        NVMLError_LibRmVersionMismatch=FakeLibRmVersionMismatch,
        NVML_TEMPERATURE_GPU=0,
        calls=calls,
        telemetry=dict(telemetry or {}),
    )

    def reading(key, wrap=lambda v: v):
        def query(h, *args):
            calls.append(key)
            if key not in mod.telemetry:
                raise FakeNVMLError("Not Supported")
            return wrap(mod.telemetry[key])
        return query

    mod.nvmlDeviceGetUtilizationRates = reading("util", lambda v: types.SimpleNamespace(gpu=v, memory=v // 2))
    mod.nvmlDeviceGetTemperature = reading("temp")
    mod.nvmlDeviceGetPowerUsage = reading("power_mw")
    mod.nvmlDeviceGetEnforcedPowerLimit = reading("power_limit_mw")
    mod.nvmlDeviceGetCurrentClocksEventReasons = reading("reasons")

    def by_uuid(uuid):
        calls.append(("uuid", uuid))
        for h in range(len(devices)):
            if mod.nvmlDeviceGetUUID(h) == uuid:
                return h
        raise FakeNVMLError("Not Found")

    mod.nvmlDeviceGetHandleByUUID = by_uuid

    def nvmlInit():
        calls.append("init")
        if init_error is not None:
            raise init_error

    def nvmlShutdown():
        calls.append("shutdown")

    mod.nvmlInit = nvmlInit
    mod.nvmlShutdown = nvmlShutdown
    mod.nvmlDeviceGetCount = lambda: len(devices)
    def by_index(i):
        if not 0 <= i < len(devices):
            raise FakeNVMLError("Invalid Argument")
        return i

    mod.nvmlDeviceGetHandleByIndex = by_index
    mod.nvmlDeviceGetName = lambda h: devices[h][0]
    mod.nvmlDeviceGetUUID = lambda h: f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd"
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=devices[h][1], free=devices[h][2], used=devices[h][1] - devices[h][2]
    )
    mod.nvmlSystemGetCudaDriverVersion = lambda: cuda_driver
    return mod


# --------------------------------------------------------------------------
# Synthetic data sets in a directory

MNIST_NAMES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes()


def write(path: Path, data: bytes, gz: bool = False) -> Path:
    if gz:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def make_mnist(root: Path, gz: bool = False, n_train: int = 50, n_test: int = 20) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        images, labels = MNIST_NAMES[split]
        write(root / images, idx_bytes(rng.integers(0, 256, (n, 28, 28)), 0x803), gz)
        write(root / labels, idx_bytes(np.arange(n) % 10, 0x801), gz)
    return root


def make_cifar(root: Path, classes: int, n: int = 12) -> Path:
    rng = np.random.default_rng(1)
    if classes == 10:
        folder, names, key = root / "cifar-10-batches-py", [f"data_batch_{i}" for i in range(
            1, 6)] + ["test_batch"], b"labels"
    else:
        folder, names, key = root / "cifar-100-python", ["train", "test"], b"fine_labels"
    folder.mkdir(parents=True)
    for name in names:
        batch = {b"data": rng.integers(0, 256, (n, 3072)).astype(np.uint8),
                 key: [i % classes for i in range(n)]}
        if classes == 100:
            batch[b"coarse_labels"] = [0] * n
        (folder / name).write_bytes(pickle.dumps(batch))
    return folder


# --------------------------------------------------------------------------
# A least-squares problem with a known best learning rate (lib.lr_finder)

def least_squares(L: float, kappa: float, seed: int, n: int = 4096, d: int = 16, noise: float = 0.5):
    """X, y whose mean-squared-error loss has Hessian eigenvalues spread evenly (in log) over [L/kappa, L].

    For MSE = mean((Xw - y)^2) the Hessian is 2 X^T X / n; X = U diag(s) V^T with orthonormal U, V
    puts its eigenvalues at 2 s^2 / n, so s = sqrt(h n / 2) for the wanted eigenvalues h.
    """
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(n, d, generator=g))
    V, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    h = L / kappa * kappa ** torch.linspace(0, 1, d)
    X = U @ torch.diag((h * n / 2).sqrt()) @ V.T
    y = X @ torch.randn(d, 1, generator=g) + noise * torch.randn(n, 1, generator=g)
    return X, y


def minibatches(X, y, batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(X), generator=g)
        for i in range(0, len(X) - batch + 1, batch):
            yield X[order[i:i + batch]], y[order[i:i + batch]]


# --------------------------------------------------------------------------
# A fixed plan for lib.recommend

def fake_plan(step_seconds=0.1, fail=()):
    def plan(config):
        if config.gpt2_preset in fail:
            raise PlanError(f"{config.gpt2_preset} does not fit. What would help: less")
        return Plan(mode="auto", policy="planner", device_type="cpu", accelerator="cpu", device_name="cpu",
                    world_size=1, micro_batch=8, grad_accum=64, effective_batch=512, target_effective_batch=512,
                    eval_batch=8, compile=False, compile_mode=None, precision="fp32", grad_scaler=False, tf32=False,
                    cudnn_benchmark=False, gradient_checkpointing=False, num_workers=0, cpu_threads=1,
                    pin_memory=False, model="gpt2", predicted_step_seconds=step_seconds, predicted_run_seconds=100.0,
                    predicted_energy_kwh=100.0 * 50 / 3.6e6)
    return plan


# --------------------------------------------------------------------------
# Custom-model mistakes: each is one error naming the factory (issue 16, defect 7)

PARTS = '''
import torch, torch.nn as nn, torch.nn.functional as F

def make_batch(n, g):
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)

def loss_fn(out, y):
    return F.cross_entropy(out, y)
'''

MISTAKES = {
    # module source, factory, what the error must say (beside CONFIG_CUSTOM_MODEL_FACTORY="module:factory")
    "raises": ("def build():\n    raise ValueError('no weights file')\n", "build",
               ("calling", "ValueError: no weights file", "kfit_mistake_raises.py:2)", "takes no arguments")),
    "syntax": ("def build(:\n", "build", ("importing", "SyntaxError: invalid syntax", "kfit_mistake_syntax.py:1)",
                                          "fix the module")),
    "import": ("import kfit_no_such_package\n", "build", ("ModuleNotFoundError", "kfit_no_such_package",
                                                           "kfit_mistake_import.py:1)", "install")),
    "no-parameters": (PARTS + "def build():\n    return nn.Identity(), make_batch, loss_fn\n", "build",
                      ("(Identity) has no trainable parameters", "requires_grad")),
    "vector-loss": (PARTS + "def build():\n    return nn.Linear(8, 4), make_batch, "
                    "lambda out, y: F.cross_entropy(out, y, reduction='none')\n", "build",
                    ("loss_fn returned a tensor of shape [2], not a scalar", "mean")),
    "detached-loss": (PARTS + "def build():\n    return nn.Linear(8, 4), make_batch, "
                      "lambda out, y: F.cross_entropy(out.detach(), y)\n", "build",
                      ("does not depend on the model's parameters", ".detach()")),
    "shapes": (PARTS + "def build():\n    return nn.Linear(5, 4), make_batch, loss_fn\n", "build",
               ("forward (Linear) on inputs of shape [2, 8] (float32)", "RuntimeError: mat1 and mat2 shapes",
                "accept make_batch's inputs")),
    "loss-raises": (PARTS + "def bad_loss(out, y):\n    return out.view(3, -1).sum()\n"
                    "def build():\n    return nn.Linear(8, 4), make_batch, bad_loss\n", "build",
                    ("loss_fn(outputs, targets) raised RuntimeError", "kfit_mistake_loss_raises.py:10)")),
    "batch-raises": (PARTS + "def build():\n    return nn.Linear(8, 4), lambda n, g: 1 / 0, loss_fn\n", "build",
                     ("make_batch(96, generator) raised ZeroDivisionError", "kfit_mistake_batch_raises.py:10)")),
}
