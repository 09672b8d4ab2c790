"""The memory predictor: real fake-tensor traces of real models (LeNet-5 and GPT-2 tiny keep it fast)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lib import config as kc
from lib.hardware import allocator
from lib.memory import (
    MemoryPredictor, default_cache_dir, device_overheads, fingerprint, largest_fitting, step_optimizer,
    trace_step, training_steps,
)
from lib.memory import workspace
from lib.memory.trace import autograd_nodes
from lib.memory.workspace import cpu_conv_path
from lib.step import autocast_for
from lib.task import load_task
from scripts.bench_memory import allocator_peak  # the bench's instrument


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("configs")
    return {name: kc.make_defconfig(name, out=tmp / f"{name}.config")
            for name in ("lenet5", "gpt2-tiny", "resnet18")}


@pytest.fixture(scope="module")
def predictor():
    return MemoryPredictor()  # the session's cache (conftest): warm runs trace nothing


def peak(predictor, config, batch, **kw):
    kw = {"device_type": "cpu", "precision": "fp32", **kw}
    return predictor.predict(config, batch=batch, **kw)


def test_peak_grows_with_batch_and_is_close_to_linear(predictor, configs):
    peaks = [peak(predictor, configs["gpt2-tiny"], b).peak_bytes for b in (1, 8, 16, 32)]
    assert peaks == sorted(peaks) and len(set(peaks)) == 4
    per_sample_low, per_sample_high = (peaks[2] - peaks[1]) / 8, (peaks[3] - peaks[2]) / 16
    assert per_sample_high == pytest.approx(per_sample_low, rel=0.1)


def test_breakdown_sums_to_the_peak_and_names_the_state(predictor, configs):
    p = peak(predictor, configs["lenet5"], 64, device_type="cuda", precision="bf16")
    assert sum(p.breakdown.values()) == p.peak_bytes
    params = p.trace.breakdown["parameters"]
    assert params > 0 and p.trace.breakdown["gradients"] == params
    assert {"blas_workspace", "allocator_fragmentation"} <= set(p.breakdown)


def test_bf16_activations_are_smaller_than_fp32(predictor, configs):
    fp32 = peak(predictor, configs["gpt2-tiny"], 16).trace.breakdown["activations"]
    bf16 = peak(predictor, configs["gpt2-tiny"], 16, precision="bf16").trace.breakdown["activations"]
    assert bf16 < 0.8 * fp32


def test_adamw_keeps_more_optimizer_state_than_sgd(predictor, configs):
    adamw = configs["lenet5"]
    sgd = kc.derive(adamw, {"OPTIMIZER_SGD": True})
    assert adamw.optimizer == "adamw" and sgd.optimizer == "sgd"
    state = lambda c: peak(predictor, c, 16).trace.breakdown["optimizer_state"]  # noqa: E731
    assert state(adamw) > 1.5 * state(sgd) > 0


@pytest.mark.parametrize("name,batch", [("gpt2-tiny", 16), ("resnet18", 16)])
def test_gradient_checkpointing_saves_activations(predictor, configs, name, batch):
    plain = peak(predictor, configs[name], batch).trace.breakdown["activations"]
    ckpt = peak(predictor, configs[name], batch, gradient_checkpointing=True).trace.breakdown["activations"]
    assert ckpt < 0.7 * plain


def test_evaluation_needs_less_than_training(predictor, configs):
    train = peak(predictor, configs["gpt2-tiny"], 16)
    evaluate = peak(predictor, configs["gpt2-tiny"], 16, train=False)
    assert evaluate.peak_bytes < train.peak_bytes
    assert evaluate.trace.breakdown["gradients"] == evaluate.trace.breakdown["optimizer_state"] == 0


def test_cache_hit_skips_tracing_and_survives_the_process(tmp_path, configs):
    first = MemoryPredictor(tmp_path)
    a = peak(first, configs["lenet5"], 8)
    peak(first, configs["lenet5"], 8)
    assert first.traces == 1
    assert list((tmp_path / "memory").glob("*.json"))
    second = MemoryPredictor(tmp_path)  # a new process: reads the JSON cache
    assert peak(second, configs["lenet5"], 8) == a and second.traces == 0
    assert second.cached_batches(configs["lenet5"], device_type="cpu", precision="fp32") == [8]


def test_damaged_cache_file_is_traced_again(tmp_path, configs):
    predictor = MemoryPredictor(tmp_path)
    peak(predictor, configs["lenet5"], 4)
    for path in (tmp_path / "memory").glob("*.json"):
        path.write_text("{not json")
    again = MemoryPredictor(tmp_path)
    assert peak(again, configs["lenet5"], 4).peak_bytes > 0 and again.traces == 1


def test_fingerprint_covers_what_changes_a_trace(configs):
    c = configs["lenet5"]
    key = lambda config=c, **kw: fingerprint(config, **{  # noqa: E731
        "device_type": "cpu", "precision": "fp32", "gradient_checkpointing": False, "train": True, **kw})[0]
    base = key()
    assert base == key()
    assert len({base, key(precision="bf16"), key(device_type="cuda"), key(gradient_checkpointing=True),
                key(config=kc.derive(c, {"OPTIMIZER_SGD": True})), key(config=configs["resnet18"])}) == 6
    # evaluation runs no optimizer: changing it keeps the evaluation traces
    assert key(train=False) == key(config=kc.derive(c, {"OPTIMIZER_SGD": True}), train=False)
    assert key(config=kc.derive(c, {"TARGET_EFFECTIVE_BATCH": 64, "EPOCHS": 2})) == base


@pytest.mark.parametrize("name", ["lenet5", "gpt2-tiny", "resnet18"])
def test_one_half_precision_trace_serves_fp16_and_bf16_on_cuda(configs, name):
    """The trace key merges fp16 and bf16 on CUDA (a plan matrix traces once for every GPU): it may only
    because the two steps hold the same bytes, checked here for every shipped family's step kind."""
    config = configs[name]
    task = load_task(config)
    for train, ckpt in ((True, False), (True, True), (False, False)):
        kw = dict(batch=3, device_type="cuda", gradient_checkpointing=ckpt, train=train)
        fp16, bf16 = ({k: v for k, v in trace_step(task, config, precision=p, **kw).to_json().items()
                       if k != "seconds"} for p in ("fp16", "bf16"))  # all but the time it took
        assert fp16 == bf16, (name, train, ckpt)
    key = lambda **kw: fingerprint(config, gradient_checkpointing=False, train=True, **kw)[0]  # noqa: E731
    assert key(device_type="cuda", precision="fp16") == key(device_type="cuda", precision="bf16")
    assert key(device_type="cpu", precision="fp16") != key(device_type="cpu", precision="bf16")
    assert key(device_type="cuda", precision="fp32") != key(device_type="cuda", precision="bf16")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KFIT_CACHE_DIR", str(tmp_path / "k"))
    assert default_cache_dir() == tmp_path / "k"
    monkeypatch.delenv("KFIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "kfit"


def test_device_overheads_are_named_and_only_the_host_heap_on_cpu(predictor, configs):
    trace = peak(predictor, configs["gpt2-tiny"], 8).trace
    # the C heap grows with the forward's autograd graph (T5's 427 nodes held 0.9 MiB beyond the tensors,
    # 3.5x the fixed 256 KiB it had): the fake trace counts the graph a real forward builds
    task = load_task(configs["gpt2-tiny"])
    x, y = task.example_batch(8)
    real = autograd_nodes(task.loss(task.build(False)(x), y))
    assert trace.autograd_nodes == real > 100
    assert device_overheads(trace, "cpu") == {"host_heap": 1536 * real}
    assert device_overheads(trace, "mps") == {}
    cuda = device_overheads(trace, "cuda")
    assert set(cuda) == {"blas_workspace", "attention_workspace", "allocator_fragmentation"}
    assert "cudagraph_pool" in device_overheads(trace, "cuda", "reduce-overhead")


def test_cuda_terms_follow_the_allocator_setting_and_checkpointing(predictor, configs):
    """Refitted to the H100 runs (lib/memory/allocator_model.py): two cuBLAS workspaces and cuBLASLt's; the
    allocator's pages, holes as shares of activations and temporaries (more with checkpointing's
    recomputation, far more with fixed segments) and autocast's cast cache; cuDNN's benchmark for convolutions."""
    from lib.memory import allocator_model as m

    trace = peak(predictor, configs["gpt2-tiny"], 8).trace
    act, tmp = trace.breakdown["activations"], trace.breakdown["temporaries"]
    terms = {(c, e): device_overheads(trace, "cuda", checkpointed=c, expandable=e)
             for c in (False, True) for e in (False, True)}
    assert all(t["blas_workspace"] == 65 * 2**20 for t in terms.values())
    frag = {k: t["allocator_fragmentation"] for k, t in terms.items()}
    assert frag[False, True] == m.PAGE_SLACK_BYTES + int(0.014 * act + 0.02 * tmp)
    assert frag[True, True] == m.PAGE_SLACK_BYTES + int(0.198 * (act + tmp))
    assert frag[False, False] == frag[True, False] == 32 * 2**20 + int(0.65 * (act + tmp))
    bf16 = device_overheads(trace, "cuda", expandable=True, precision="bf16")
    assert bf16["allocator_fragmentation"] - frag[False, True] == m.AUTOCAST_CACHE_BYTES
    assert "cudnn_benchmark" not in bf16 and terms[False, True]["attention_workspace"] == int(0.01 * act)
    lenet = peak(predictor, configs["lenet5"], 8).trace
    assert "conv" in lenet.features and "attention" not in lenet.features
    batch = lenet.breakdown["batch"]
    assert device_overheads(lenet, "cuda", precision="fp32")["cudnn_benchmark"] == 3 * batch
    assert device_overheads(lenet, "cuda", precision="bf16")["cudnn_benchmark"] == int(1.5 * batch)
    assert set(device_overheads(lenet, "cpu")) == {"host_heap"}  # the CPU path has no device terms


def test_kfit_turns_on_expandable_segments_unless_the_user_set_the_allocator(monkeypatch):
    monkeypatch.setattr(allocator.sys, "platform", "linux")
    env: dict = {}
    assert allocator.use_expandable_segments(env) and env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    assert not allocator.use_expandable_segments(mine) and mine == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    assert allocator.expandable_segments({"PYTORCH_ALLOC_CONF": "max_split_size_mb:64, expandable_segments:True"})
    assert not allocator.expandable_segments({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    monkeypatch.setattr(allocator.sys, "platform", "win32")
    env = {}
    assert not allocator.use_expandable_segments(env) and env == {}  # torch has them on Linux only


def test_largest_fitting_finds_the_boundary_in_few_calls():
    calls = []

    def linear(b):
        calls.append(b)
        return 1000 + 37 * b

    budget = 1000 + 37 * 411 + 5
    assert largest_fitting(linear, budget, 65536) == 411
    assert len(set(calls)) <= 6
    assert largest_fitting(linear, 10**9, 512) == 512
    assert largest_fitting(linear, 999, 512) == 0
    convex = lambda b: b * b  # noqa: E731
    assert largest_fitting(convex, 10_000, 65536) == 100
    assert largest_fitting(convex, 10_000 - 1, 65536) == 99


def test_largest_fitting_low_first_traces_the_same_points_or_fewer():
    """low_first (a deep model's search, predict.StepCurve.deep): 1 before the limit, so a step where not even 1
    fits is never traced at the limit (Llama 3.1 8B at 8k without checkpointing: three pairs of shallow traces
    at 64 saved per cold plan); otherwise the same points and the same answer as limit first."""
    from lib.memory.curve import PeakCurve

    def search(peak, budget, limit, low_first):
        calls = []
        curve = PeakCurve(lambda b: (calls.append(b) or peak(b),))
        return curve.largest_fitting(budget, limit, low_first=low_first), calls

    linear = lambda b: 1000 + 37 * b  # noqa: E731
    assert search(linear, 999, 64, True) == (0, [1])
    assert search(linear, 999, 64, False) == (0, [64, 1])
    for budget in (1000 + 37 * 5 + 3, 1000 + 37 * 63, 1000 + 37 * 64 + 1):
        (got, low), (want, high) = search(linear, budget, 64, True), search(linear, budget, 64, False)
        assert got == want and (set(low) == set(high) or (want == 64 and set(low) == {1, 64}))


# --------------------------------------------------------------------------
# Kernel workspaces against what the CPU kernels really allocate


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")  # mkldnn.flags() sets TF32 too
@pytest.mark.parametrize("onednn,batch", [(True, 8), (False, 8), (False, 16)], ids=["onednn", "im2col", "nnpack"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_lenet5_peak_matches_the_convolution_kernels_torch_runs(configs, onednn, batch, precision, one_thread):
    """oneDNN's blocked reorders, or im2col's column buffers (bf16 on AVX2-only CPUs; here forced by
    turning oneDNN off; fp32 from batch 16 then takes NNPACK), are inside the prediction: training
    step and evaluation forward, against the allocations the CPU allocator really made.
    One thread, so the figures do not depend on the worker: with two, oneDNN's AVX2 weight-gradient kernel
    adds a per-thread reduction buffer the model leaves out (31,168 bytes on LeNet-5's first convolution
    at batch 8, 1.9% of the step's peak, measured on an AVX2-only AMD EPYC)."""
    config = configs["lenet5"]
    task = load_task(config)
    autocast = autocast_for(SimpleNamespace(precision=precision, device_type="cpu"))

    def train():
        model = task.build(False)
        x, y = task.example_batch(batch)
        training_steps(model, step_optimizer(config, model, "cpu"), task.loss, x, y, autocast=autocast,
                       grad_clip=config.grad_clip, foreach=False)

    def evaluate():
        model = task.build(False).eval()
        x, y = task.example_batch(batch)
        with torch.no_grad(), autocast:
            out = model(x)
            task.loss(out, y)
            out.argmax(dim=-1)

    with torch.backends.mkldnn.flags(enabled=onednn):
        for run, is_train in ((train, True), (evaluate, False)):
            traced = trace_step(task, config, batch=batch, precision=precision, device_type="cpu",
                                gradient_checkpointing=False, train=is_train)
            measured = allocator_peak(run)
            assert traced.peak_bytes == pytest.approx(measured, rel=0.02), (is_train, traced.breakdown)
    assert batch > 8 or traced.breakdown["workspace"] > 0


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_cpu_conv_path_decides_as_torch_does(monkeypatch):
    x, w = torch.empty(8, 6, 14, 14), torch.empty(16, 6, 5, 5)
    plain = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1)  # stride, padding, dilation, transposed, output_padding, groups
    assert cpu_conv_path(x, w, *plain) == "onednn"
    with torch.backends.mkldnn.flags(enabled=False):
        assert cpu_conv_path(x, w, *plain) == "im2col"
        nnpack = torch.backends.nnpack.is_available()
        assert cpu_conv_path(torch.empty(16, 6, 14, 14), w, *plain) == ("nnpack" if nnpack else "im2col")
        assert cpu_conv_path(x, w, [1, 1], [0, 0], [2, 2], False, [0, 0], 1) == "dilated"
    monkeypatch.setattr(workspace, "_onednn", lambda: (False, False, 8))  # an AVX2-only CPU: no bf16 in oneDNN
    assert cpu_conv_path(x.bfloat16(), w.bfloat16(), *plain) == "im2col"
    assert cpu_conv_path(x, w, *plain) == "onednn"
    monkeypatch.setattr(workspace, "_onednn", lambda: (True, False, 16))
    assert cpu_conv_path(x.bfloat16(), w.bfloat16(), *plain) == "onednn"
    assert cpu_conv_path(x.half(), w.half(), *plain) == "im2col"
    with torch.backends.mkldnn.flags(enabled=True):  # fp32 1x1 on a single small sample, one thread: native
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            assert cpu_conv_path(torch.empty(1, 6, 4, 4), torch.empty(16, 6, 1, 1), *plain) == "im2col"
        finally:
            torch.set_num_threads(threads)


@pytest.mark.skipif(not (torch.backends.mkldnn.is_available() and workspace._onednn()[0]
                         and workspace._onednn()[2] == 16), reason="measured on oneDNN with AVX-512 and bf16")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("batch,channels,size,kernel,groups,cout", [
    (16, 128, 4, (7, 7), 128, 128), (3, 64, 9, (5, 5), 64, 64), (8, 48, 6, (1, 7), 48, 48), (4, 32, 8, (7, 7), 16, 32),
    (16, 32, 8, (3, 3), 32, 32), (8, 64, 8, (3, 3), 1, 64), (8, 32, 16, (2, 2), 1, 64), (2, 24, 8, (7, 7), 1, 24)])
def test_a_channels_last_convolution_backward_holds_what_the_model_says(dtype, batch, channels, size, kernel, groups,
                                                                      cout, one_thread):
    """ConvNeXt's depthwise 7x7 on channels-last activations: its weight gradient's scratch (9.4 MiB in bf16
    at 128 channels, whatever the batch) was left out, and bench-memory's ConvNeXt at micro-batch 16 came
    out 35% under. Grouped and plain kernels of several widths, against the CPU allocator's peak inside
    the op (its outputs + the scratch)."""
    x = torch.randn(batch, channels, size, size, dtype=dtype).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(cout, channels // groups, *kernel, dtype=dtype)
    padding = [k // 2 for k in kernel]
    out = torch.nn.functional.conv2d(x, weight, None, 1, padding, 1, groups)
    args = (torch.randn_like(out), x, weight, None, [1, 1], padding, [1, 1], False, [0, 0], groups, [True, True, False])
    backward = torch.ops.aten.convolution_backward.default
    backward(*args)  # oneDNN's primitive for these shapes is made once, outside the measured call
    outputs = x.numel() * x.element_size() + weight.numel() * weight.element_size()
    predicted = workspace.cpu_conv_workspace(str(backward), args, None) + outputs
    measured = allocator_peak(lambda: backward(*args))
    # never under by more than 2% (or 64 KiB: a 2x2 kernel on 32 channels in bf16 holds 50 KB more), at most 30% over
    assert measured * 0.98 - 64 * 1024 <= predicted <= measured * 1.3 + 64 * 1024, (predicted, measured)


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_im2col_columns_are_the_workspace_when_onednn_is_off(configs):
    """Without oneDNN, LeNet-5's first convolution unfolds its input: 25 x 28*28 values per sample."""
    task = load_task(configs["lenet5"])
    with torch.backends.mkldnn.flags(enabled=False):
        trace = trace_step(task, configs["lenet5"], batch=64, precision="bf16", device_type="cpu",
                           gradient_checkpointing=False, train=False)
    assert trace.breakdown["workspace"] == 64 * 25 * 28 * 28 * 2


def test_mixed_dtype_pointwise_ops_copy_their_inputs_on_cpu():
    """fp32 + bf16 (autocast's residual adds): the CPU kernel first copies the bf16 input to fp32."""
    a, b = torch.randn(2**16), torch.randn(2**16, dtype=torch.bfloat16)
    add = torch.ops.aten.add.Tensor
    expected = workspace.promotion_workspace(add, (a, b))
    assert expected == 2**16 * 4 and workspace.promotion_workspace(add, (a, b.float())) == 0
    assert workspace.promotion_workspace(torch.ops.aten.mm.default, (a[None], b[:, None])) == 0  # not pointwise
    assert allocator_peak(lambda: add(a, b)) == expected + 2**16 * 4  # the copy, then the output


OUTPUT_MODEL = '''
import torch, torch.nn as nn, torch.nn.functional as F


class Output(dict):  # like transformers' ModelOutput: a dict whose keys are attributes too
    __getattr__ = dict.__getitem__


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(16, 8), nn.Linear(8, 4)

    def forward(self, x):
        return Output(logits=self.head(self.embed(x).mean(dim=1)))


def make_batch(n, generator):
    x = torch.randint(0, 16, (n, 6), generator=generator)
    return x, x[:, 0] % 4


def build():
    return Model(), make_batch, lambda out, y: F.cross_entropy(out.logits, y)
'''


def test_a_model_returning_a_model_output_is_traced_for_training_and_evaluation(tmp_path, monkeypatch):
    (tmp_path / "kfit_output_model.py").write_text(OUTPUT_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    base = kc.make_defconfig("custom-transformer", out=tmp_path / "c.config")
    config = kc.derive(base, {"CUSTOM_MODEL_FACTORY": "kfit_output_model:build"})
    task = load_task(config)
    kw = {"batch": 8, "precision": "fp32", "device_type": "cpu", "gradient_checkpointing": False}
    train, evaluate = trace_step(task, config, **kw), trace_step(task, config, train=False, **kw)
    assert 0 < evaluate.peak_bytes < train.peak_bytes
    assert train.breakdown["gradients"] > 0 == evaluate.breakdown["gradients"]


# --------------------------------------------------------------------------
# The C allocator: freed tensors leave the process (lib/hardware/allocator.py)

RETENTION = '''
import importlib.util, sys
from pathlib import Path
here = Path(sys.argv[1])  # .../<package>/hardware/allocator.py: loaded alone, with the package's light env.py
sys.path.insert(0, str(here.parents[2]))
spec = importlib.util.spec_from_file_location(f"{here.parents[1].name}.hardware.allocator", here)
allocator = importlib.util.module_from_spec(spec)
spec.loader.exec_module(allocator)
calls = {"return": allocator.return_freed_memory, "keep": allocator.keep_freed_memory}
applied = [calls[mode]() for mode in sys.argv[2].split(",") if mode in calls]
rss = lambda: next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")) / 1024
base = rss()
size = int(sys.argv[3])
blocks = [b"x" * size for _ in range(40 * 1024 * 1024 // size)]  # 40 MiB
del blocks[:-1]  # the last one stays, on top of the heap
print(all(applied), rss() - base)
'''


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_the_c_heap_returns_or_keeps_freed_blocks_as_set_on_glibc():
    path = Path(allocator.__file__)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "KFIT_KEEP"))}

    def retained(mode, size):
        out = subprocess.run([sys.executable, "-c", RETENTION, str(path), mode, str(size)], capture_output=True,
                             text=True, env=env, check=True).stdout.split()
        return out[0], float(out[1])

    small, large = 96 * 1024, 1024 * 1024  # under glibc's default 128 KiB mmap threshold, and over it
    (applied, returned), (_, default) = retained("return", small), retained("default", small)
    assert applied == "True"
    assert returned < 4 < 20 < default
    (applied, kept), (_, default_large) = retained("keep", large), retained("default", large)
    assert applied == "True"
    assert default_large < 4 < 30 < kept  # mmapped and unmapped by default; kept on the heap for the next step
    applied, after = retained("keep,return", large)
    assert applied == "True" and after < 4  # keeping first, then returning: return wins and hands it back


def test_return_freed_memory_is_harmless_off_glibc(monkeypatch):
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator, "_mode", None)
    monkeypatch.setattr(allocator, "_glibc", lambda: None)
    assert allocator.return_freed_memory() is False
    assert allocator.keep_freed_memory() is False
    assert allocator.trim() is False
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setenv("KFIT_KEEP_MALLOC", "1")
    assert allocator.return_freed_memory() is False


def test_a_cuda_target_traces_cudas_float32_casts_on_cpu_tensors():
    """CUDA's autocast runs layer_norm, softmax, pow, sum... in fp32, CPU's does not: with bf16 parameters
    (FSDP's MixedPrecisionPolicy) an H100 saved twice the layer-norm bytes the CPU-autocast trace had."""
    import torch.nn.functional as F

    from lib.memory.autocast import TracedAutocast

    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.ones(8, dtype=torch.bfloat16)

    def dtypes(context):
        with context:
            return (F.layer_norm(x, (8,), w, w).dtype, F.softmax(x, -1).dtype, (x ** 3).dtype, x.sum().dtype,
                    F.linear(x.float(), torch.ones(8, 8)).dtype, F.gelu(x).dtype)

    cuda = TracedAutocast("bf16", "cuda")
    fp32, bf16 = torch.float32, torch.bfloat16
    assert dtypes(cuda) == (fp32, fp32, fp32, fp32, bf16, bf16)
    assert dtypes(cuda) == (fp32, fp32, fp32, fp32, bf16, bf16)  # entered once per micro-batch
    assert dtypes(TracedAutocast("bf16", "cpu")) == (bf16, bf16, bf16, bf16, bf16, bf16)
    assert dtypes(TracedAutocast("fp32", "cuda"))[:4] == (bf16, bf16, bf16, bf16)  # no autocast: no casts
    with cuda, torch.autocast("cpu", enabled=False):
        assert F.layer_norm(x, (8,), w, w).dtype == bf16  # autocast switched off inside: CUDA casts nothing


@pytest.mark.parametrize("name,precision", [("llama-tiny", "bf16")] + [  # the rest in the slow tier (a minute)
    pytest.param(n, p, marks=pytest.mark.slow) for n, p in
    (("llama-tiny", "fp16"), ("gpt2-tiny", "bf16"), ("gpt2-tiny", "fp16"), ("resnet18", "bf16"), ("resnet18", "fp16"))])
def test_a_checkpointed_step_traces_for_a_gpu_in_low_precision(tmp_path, name, precision):
    """CUDA's float32 casts reach the recompute in backward: with them on only around the forward, a block
    recomputed its fp32 ops in bf16 wherever its inputs were bf16 (FSDP's bf16 parameters), and
    torch.utils.checkpoint refused the trace: FSDP + bf16 + checkpointing for an H100 could not be planned.
    Every checkpointing family, both low precisions; the one-process trace, the sharded one and the FLOP count."""
    from lib.steptime.count import count_step

    config = kc.make_defconfig(name, out=tmp_path / ".config")
    task = load_task(config)
    kw = dict(batch=2, precision=precision, device_type="cuda")
    checkpointed = trace_step(task, config, gradient_checkpointing=True, **kw)
    assert 0 < checkpointed.peak_bytes <= trace_step(task, config, gradient_checkpointing=False, **kw).peak_bytes
    phases, _ = count_step(task, config, gradient_checkpointing=True, **kw)
    assert phases["backward"].flops > phases["forward"].flops > 0
    predictor = MemoryPredictor(cache_dir=tmp_path / "cache")
    try:
        sharded = predictor.trace(config, strategy="fsdp", world_size=2, gradient_checkpointing=True, **kw)
    finally:
        predictor.close()
    assert 0 < sharded.peak_bytes


def test_the_traced_casts_hold_in_a_recompute_called_any_way():
    """Tensor.backward, torch.autograd.backward with its own gradient: the casts mode is on inside both."""
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    from lib.memory.autocast import TracedAutocast

    traced = TracedAutocast("bf16", "cuda")
    lin = torch.nn.Linear(8, 8).to(torch.bfloat16)
    block = lambda x: lin(F.layer_norm(x, (8,))).softmax(-1)  # noqa: E731
    for run in (lambda y: y.sum().backward(), lambda y: torch.autograd.backward(y, torch.ones_like(y))):
        x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
        with traced.step():
            with traced:
                y = checkpoint(block, x, use_reentrant=False)
            assert y.dtype == torch.float32  # softmax of a bf16 input runs in fp32 under CUDA's autocast
            run(y)
        assert x.grad is not None and x.grad.shape == x.shape


def test_a_cpu_trace_is_keyed_by_the_threads_it_ran_at(configs):
    """A convolution's im2col backward keeps one column buffer per thread: a trace cached at one thread
    under-predicted a step run at two. The threads are in a CPU trace's key (a GPU trace's has no CPU part)."""
    from lib.threads import using_threads

    key = dict(device_type="cpu", precision="bf16", gradient_checkpointing=False, train=True)
    with using_threads(1):
        one = fingerprint(configs["resnet18"], **key)
    with using_threads(2):
        two = fingerprint(configs["resnet18"], **key)
    assert one[0] != two[0] and (one[1]["cpu_kernels"]["threads"], two[1]["cpu_kernels"]["threads"]) == (1, 2)
    assert fingerprint(configs["resnet18"], **{**key, "device_type": "cuda"})[1].get("cpu_kernels") is None
