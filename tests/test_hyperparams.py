"""The resolver: a pure function of (config, hardware, model, world size), checked against the seed's tables."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lib import config as kc
from lib.errors import PlanError
from lib.hardware import from_catalog, gib, resolve_hardware
from lib.hyperparams import (
    ModelDescription, TierPolicy, apply_hyperparams, calculate_gradient_accumulation, resolve, summary_line,
)
from lib.planning.tiers import MEMORY_TIERS, MODEL_SCALE
from lib.planning.decisions import refuse_slow_precision

GIB = 2**30


@pytest.fixture
def make_config(tmp_path):
    def build(text: str = "", base: str = "lenet5"):
        fragment = tmp_path / f"fragment{len(list(tmp_path.iterdir()))}"
        fragment.write_text(text)
        return kc.make_defconfig(base, [str(fragment)], out=tmp_path / ".config")
    return build


def gpu_with(free_gib: float, key: str = "b200", name: str | None = None):
    """A catalog GPU with exactly `free_gib` free (total raised if needed)."""
    hw = from_catalog(key)
    gpu = hw.gpus[0]
    total = max(gpu.total_bytes, int(free_gib * GIB) + GIB)
    gpu = dataclasses.replace(gpu, total_bytes=total, free_bytes=int(free_gib * GIB), name=name or gpu.name)
    return dataclasses.replace(hw, gpus=(gpu,))


CPU = resolve_hardware(gpu="cpu")
TIERS = "CONFIG_HYPER_PARAM_POLICY_TIERS=y\n"  # the seed's tier policy (AUTO's default is the memory planner)


# The primary seed's tables, written out here so the test does not check the code against itself.
SEED_TIERS = [  # (free-memory tier in GB after the 80% margin, batch with compile ON, with compile OFF)
    (128, 256, 128), (64, 128, 64), (32, 32, 16), (16, 16, 8), (8, 8, 4), (4, 4, 2), (0, 2, 1)]
SEED_SCALE = {"gpt2": 1.0, "resnet50": 1.5, "resnet18": 2.0, "lenet5": 4.0}


def test_code_tables_are_the_seed_tables():
    assert list(MEMORY_TIERS) == SEED_TIERS and MODEL_SCALE == SEED_SCALE


@pytest.mark.parametrize("model", sorted(SEED_SCALE))
@pytest.mark.parametrize("compile_on", [True, False])
@pytest.mark.parametrize("tier", SEED_TIERS, ids=lambda t: f"{t[0]}GB+")
def test_tier_policy_matches_the_seed_table(tier, compile_on, model):
    floor, with_compile, without = tier
    # free memory whose 80% lands just inside this tier
    free = (floor + 0.5) / 0.8 if floor else 2.0
    batch, why = TierPolicy().max_micro_batch(hardware=gpu_with(free), model=ModelDescription(model),
                                              device_type="cuda", compile=compile_on, precision="bf16")
    base = with_compile if compile_on else without
    assert batch == int(base * SEED_SCALE[model])
    assert f"base {base}" in why


@pytest.mark.parametrize("model,expected", [("gpt2", 16), ("resnet50", 24), ("resnet18", 32), ("lenet5", 64)])
def test_cpu_mode_uses_base_16_times_scale(model, expected):
    batch, _ = TierPolicy().max_micro_batch(hardware=CPU, model=ModelDescription(model), device_type="cpu",
                                            compile=False, precision="fp32")
    assert batch == expected


def test_tier_boundaries_use_80_percent_of_free_memory():
    policy, model = TierPolicy(), ModelDescription("gpt2")
    at = lambda free: policy.max_micro_batch(hardware=gpu_with(free), model=model, device_type="cuda",  # noqa: E731
                                             compile=True, precision="bf16")[0]
    assert at(40.0) == 32  # 32.0 usable: the 32GB+ tier
    assert at(39.9) == 16  # 31.9 usable: one tier down
    assert at(80.0) == 128 and at(160.0) == 256 and at(4.0) == 2


def test_seed_worked_example_resnet18_on_h100_with_70gb_free(make_config):
    config = make_config(TIERS, base="resnet18")
    hardware = resolve_hardware(gpu="h100", free_gb=70)
    model = ModelDescription.from_config(config)
    plan = resolve(config, hardware, model)
    assert (plan.micro_batch, plan.grad_accum, plan.effective_batch) == (64, 8, 512)
    assert plan.compile and plan.precision == "bf16" and plan.tf32 and plan.device_type == "cuda"
    line = summary_line(plan, hardware, model)
    assert re.fullmatch(r"Hyperparams: AUTO mode - GPU: NVIDIA H100[^(]*\(\d+\.\dGiB total, 70\.0GiB free\) x 1, "
                        r"model=resnet18, compile=ON -> batch=64, grad_acc=8 \(effective=512, target=512\)", line)


def test_world_size_is_processes_not_gpus(make_config):
    config = make_config(TIERS, base="resnet18")
    four_gpus = resolve_hardware(gpu="h100", free_gb=70, gpus=4)
    model = ModelDescription.from_config(config)
    single = resolve(config, four_gpus, model, world_size=1)
    assert (single.micro_batch, single.grad_accum, single.effective_batch) == (64, 8, 512)
    ddp = resolve(config, four_gpus, model, world_size=4)
    assert (ddp.micro_batch, ddp.grad_accum, ddp.world_size, ddp.effective_batch) == (64, 2, 4, 512)
    eight = resolve(config, four_gpus, model, world_size=8)
    assert (eight.micro_batch, eight.grad_accum, eight.effective_batch) == (64, 1, 512)
    assert any("identical GPU" in n for n in eight.notes)


def test_indivisible_target_says_how_far_off(make_config):
    config = make_config(TIERS + "CONFIG_TARGET_EFFECTIVE_BATCH=512\n", base="resnet18")
    plan = resolve(config, resolve_hardware(gpu="h100", free_gb=70, gpus=3), ModelDescription("resnet18"), 3)
    assert plan.micro_batch <= 64
    assert abs(plan.effective_batch - 512) / 512 < 0.01
    assert plan.effective_batch == plan.micro_batch * plan.grad_accum * 3
    assert "not divisible by the world size 3" in plan.reasons["grad_accum"]


def test_largest_divisor_that_fits_keeps_the_target_exact():
    assert calculate_gradient_accumulation(512, 96)[:2] == (64, 8)
    assert calculate_gradient_accumulation(256, 24)[:2] == (16, 16)
    assert calculate_gradient_accumulation(48, 64)[:2] == (48, 1)
    assert calculate_gradient_accumulation(128, 32)[:2] == (32, 4)  # the seed's HPO example
    micro, accum, why = calculate_gradient_accumulation(509, 64)  # a prime: only 1 divides it
    assert (micro, accum) == (1, 509) and "would run faster" in why


@pytest.mark.parametrize("target,cap,ws", [(t, c, w) for t in (1, 7, 64, 100, 512, 1000, 1024)
                                             for c in (1, 3, 16, 64, 384) for w in (1, 2, 3, 8) if t >= w])
def test_accumulation_invariants(target, cap, ws):
    micro, accum, _ = calculate_gradient_accumulation(target, cap, ws)
    assert 1 <= micro <= cap and accum >= 1
    if target % ws == 0:
        assert micro * accum * ws == target


def test_compile_on_doubles_the_tier_batch(make_config):
    model = ModelDescription("gpt2")
    a100 = resolve_hardware(gpu="a100-40gb")  # about 38.5GB free -> 30.8GB usable -> the 16GB+ tier
    on = resolve(make_config(TIERS, base="gpt2"), a100, model)
    off = resolve(make_config(TIERS + "CONFIG_COMPILE_MANUAL=y\n# CONFIG_COMPILE_MODEL is not set\n", base="gpt2"),
                  a100, model)
    assert on.compile and not off.compile
    assert (on.micro_batch, off.micro_batch) == (16, 8)
    assert on.effective_batch == off.effective_batch == 512


@pytest.mark.parametrize("key,compile_on,precision", [
    ("h100", True, "bf16"), ("a10g", True, "bf16"), ("l4", True, "bf16"), ("b200", True, "bf16"),
    ("v100", True, "fp16"), ("t4", True, "fp16"), ("w7900", False, "bf16"), ("mi210", False, "bf16"),
])
def test_compile_and_precision_auto_per_gpu(make_config, key, compile_on, precision):
    plan = resolve(make_config(), resolve_hardware(gpu=key), ModelDescription("lenet5"))
    assert plan.compile is compile_on, plan.reasons["compile"]
    assert plan.precision == precision and plan.grad_scaler is (precision == "fp16")
    if not compile_on:
        assert "deny list" in plan.reasons["compile"]


def test_old_nvidia_gpu_does_not_compile(make_config):
    hw = from_catalog("v100")
    old = dataclasses.replace(hw, gpus=(dataclasses.replace(hw.gpus[0], name="Tesla P100", compute_capability=(6, 0)),))
    plan = resolve(make_config(), old, ModelDescription("lenet5"))
    assert not plan.compile and "7.0" in plan.reasons["compile"]


def test_cpu_plan(make_config):
    plan = resolve(make_config(TIERS), CPU, ModelDescription("lenet5"))
    assert plan.device_type == "cpu" and plan.precision == "fp32" and not plan.compile
    assert (plan.micro_batch, plan.grad_accum, plan.effective_batch) == (64, 8, 512)
    assert plan.num_workers == 0 and not plan.pin_memory and not plan.tf32
    assert "CPU" in plan.reasons["compile"]


def test_device_cpu_on_a_gpu_machine(make_config):
    plan = resolve(make_config(TIERS + "CONFIG_DEVICE_CPU=y\n"), resolve_hardware(gpu="h100"),
                   ModelDescription("lenet5"))
    assert plan.device_type == "cpu" and plan.micro_batch == 64 and plan.precision == "fp32"


def test_manual_mode_uses_the_given_values_and_still_decides_compile(make_config):
    config = make_config("CONFIG_HYPER_PARAM_MANUAL=y\nCONFIG_BATCH_SIZE=128\nCONFIG_GRADIENT_ACCUMULATION=3\n")
    plan = resolve(config, resolve_hardware(gpu="h100"), ModelDescription("lenet5"), world_size=2)
    assert (plan.micro_batch, plan.grad_accum, plan.effective_batch) == (128, 3, 768)
    assert plan.mode == "manual" and plan.policy == "manual" and plan.target_effective_batch is None
    assert plan.compile  # COMPILE_AUTO still decides on an H100
    assert plan.eval_batch == 256


def test_manual_compile_is_obeyed_on_cpu(make_config):
    plan = resolve(make_config("CONFIG_COMPILE_MANUAL=y\nCONFIG_COMPILE_MODEL=y\n"
                               "CONFIG_COMPILE_MODE_MAX_AUTOTUNE=y\n"), CPU, ModelDescription("lenet5"))
    assert plan.compile and plan.compile_mode == "max-autotune"
    assert any("slower" in n for n in plan.notes)


def test_impossible_requests_are_plan_errors(make_config):
    with pytest.raises(PlanError, match="CONFIG_DEVICE_CUDA.*DEVICE_AUTO"):
        resolve(make_config("CONFIG_DEVICE_CUDA=y\n"), CPU, ModelDescription("lenet5"))
    with pytest.raises(PlanError, match="bfloat16.*PRECISION_FP16"):
        resolve(make_config("CONFIG_PRECISION_BF16=y\n"), resolve_hardware(gpu="t4"), ModelDescription("lenet5"))
    with pytest.raises(PlanError, match="smaller than the 8 processes"):
        resolve(make_config("CONFIG_TARGET_EFFECTIVE_BATCH=3\n"), resolve_hardware(gpu="h100", gpus=8),
                ModelDescription("lenet5"), world_size=8)


def test_explicit_precision_and_flags(make_config):
    plan = resolve(make_config("CONFIG_PRECISION_FP16=y\nCONFIG_TF32_OFF=y\nCONFIG_CUDNN_BENCHMARK_OFF=y\n"
                               "CONFIG_DATALOADER_WORKERS_MANUAL=y\nCONFIG_DATALOADER_WORKERS=3\n"),
                   resolve_hardware(gpu="h100"), ModelDescription("lenet5"))
    assert plan.precision == "fp16" and plan.grad_scaler and not plan.tf32 and not plan.cudnn_benchmark
    assert plan.num_workers == 3 and plan.pin_memory


@pytest.mark.parametrize("base", ["lenet5", "resnet18"])
def test_float16_convolutions_on_the_cpu_are_refused_in_one_line(make_config, base):
    # no fast CPU kernel: ResNet-18 fp16 (randcheck seed 1918039788) did not finish two steps in 600 s
    with pytest.raises(PlanError, match=r"CONFIG_PRECISION_FP16 on the CPU: .*convolutions.*"
                                        r"select CONFIG_PRECISION_BF16 or CONFIG_PRECISION_AUTO") as err:
        resolve(make_config("CONFIG_PRECISION_FP16=y\n", base), CPU, ModelDescription(base))
    assert "\n" not in str(err.value)
    # a GPU keeps them, and so does a CPU for models of linear layers (float16 matmuls run at float32's speed)
    refuse_slow_precision(make_config("CONFIG_PRECISION_FP16=y\n", base), "cuda", "fp16")
    refuse_slow_precision(make_config("CONFIG_PRECISION_FP16=y\n", "gpt2-tiny"), "cpu", "fp16")


def test_resolve_is_pure(make_config):
    config, hw, model = make_config(), resolve_hardware(gpu="a10g"), ModelDescription("lenet5")
    assert resolve(config, hw, model) == resolve(config, hw, model)


def test_plan_json_has_the_documented_keys(make_config):
    plan = resolve(make_config(), CPU, ModelDescription("lenet5")).to_dict()
    for key in ("mode", "policy", "device_type", "device_name", "world_size", "micro_batch", "grad_accum",
                "effective_batch", "target_effective_batch", "compile", "precision", "reasons"):
        assert key in plan


def test_apply_hyperparams_refuses_a_model_the_config_does_not_train(make_config):
    with pytest.raises(PlanError, match="model_type='resnet'"):
        apply_hyperparams(make_config(base="resnet18"), model_type="resnet", hardware=CPU, world_size=1)


def test_apply_hyperparams_prints_the_seed_lines(make_config, capsys):
    plan = apply_hyperparams(make_config(TIERS, base="resnet18"), verbose=True, model_type="resnet18",
                             hardware=resolve_hardware(gpu="h100", free_gb=70), world_size=1)
    out = capsys.readouterr().out
    assert "Hyperparams: AUTO mode - GPU:" in out and "batch=64, grad_acc=8 (effective=512, target=512)" in out
    assert "Compile: Enabled (GPU 'NVIDIA H100" in out
    assert plan.micro_batch == 64


def test_gib_formatting_matches_free_memory():
    assert gib(70 * GIB) == 70.0


def budget(mib: float):
    """This CPU with RAM available for a memory budget of `mib` MiB at the default memory profile."""
    available = int(mib * 2**20 / kc.DEFAULT_SHARE)
    return dataclasses.replace(CPU, cpu=dataclasses.replace(CPU.cpu, ram_available_bytes=available))


@pytest.mark.slow
def test_where_nothing_fits_the_plan_takes_the_out_of_memory_ladder_before_training(make_config):
    # gpt2-tiny at micro-batch 1: about 17.8 MiB predicted, 15.0 MiB with gradient checkpointing
    config = make_config("CONFIG_DEVICE_CPU=y\nCONFIG_TARGET_EFFECTIVE_BATCH=8\n", base="gpt2-tiny")
    model = ModelDescription.from_config(config)
    plan = resolve(config, budget(17.0), model)
    assert plan.gradient_checkpointing and plan.precision == "fp32" and plan.effective_batch == 8
    assert plan.predicted_peak_bytes <= plan.budget_bytes
    assert "out-of-memory ladder" in plan.reasons["gradient_checkpointing"]
    assert any("not even micro-batch 1 fits" in note for note in plan.notes)
    forbidden = make_config("CONFIG_DEVICE_CPU=y\nCONFIG_TARGET_EFFECTIVE_BATCH=8\n"
                            "# CONFIG_OOM_LADDER_CHECKPOINTING is not set\n", base="gpt2-tiny")
    with pytest.raises(PlanError, match="does not fit even at micro-batch 1"):
        resolve(forbidden, budget(17.0), model)
    with pytest.raises(PlanError, match="does not fit even at micro-batch 1"):  # no rung is enough
        resolve(config, budget(13.5), model)


def test_a_script_of_another_repository_calls_apply_hyperparams_on_its_own_config(tmp_path, capsys):
    """As a training script elsewhere does: its own config object (symbol names without CONFIG_), one call,
    and the micro-batch, accumulation and compile are set on it, with the start lines printed."""
    script = tmp_path / "train_elsewhere.py"
    script.write_text(
        "import types\n"
        "from lib.hyperparams import apply_hyperparams\n"
        "config = types.SimpleNamespace(HYPER_PARAM_AUTO='y', TARGET_EFFECTIVE_BATCH=256, COMPILE_AUTO='y',\n"
        "                               COMPILE_MODEL='n', BATCH_SIZE=None, EPOCHS=1, LEARNING_RATE='1e-3')\n"
        "plan = apply_hyperparams(config, verbose=True, model_type='lenet5')\n"
        "print('applied', config.BATCH_SIZE, config.GRADIENT_ACCUMULATION, config.COMPILE_MODEL,\n"
        "      config.EFFECTIVE_BATCH, plan.effective_batch)\n")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "KFIT_STEPTIME_MEASURE": "0"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Hyperparams: AUTO mode - CPU: ") and "model=lenet5" in lines[0]
    assert lines[1].startswith("Compile: Disabled (CPU")
    _, micro, accum, compile_on, effective, planned = lines[-1].split()
    assert int(micro) * int(accum) >= 256 and effective == planned == "256"
    assert re.search(rf"batch={micro}( \(last \d+\))?, grad_acc={accum} \(effective=256, target=256", lines[0])
    assert compile_on == "n"  # a .config's 'y'/'n' stays a string


def test_apply_hyperparams_takes_the_scripts_values_strictly(make_config):
    from types import SimpleNamespace

    from lib.errors import ConfigError

    config = SimpleNamespace(TARGET_EFFECTIVE_BATCH=64, HYPER_PARAM_AUTO=True)
    plan = apply_hyperparams(config, verbose=False, model_type="lenet5", hardware=CPU)
    assert plan.effective_batch == 64 and config.BATCH_SIZE * config.GRADIENT_ACCUMULATION >= 64
    assert config.COMPILE_MODEL is False  # a bool where the script had none
    with pytest.raises(ConfigError, match="TARGET_EFFECTIVE_BATCH"):
        apply_hyperparams(SimpleNamespace(TARGET_EFFECTIVE_BATCH=-3), verbose=False, model_type="lenet5",
                          hardware=CPU)
    with pytest.raises(ConfigError, match="name the model"):
        apply_hyperparams(SimpleNamespace(), verbose=False, hardware=CPU)


def test_a_plan_predicts_its_model_flops_utilisation(make_config):
    """predicted_mfu = counted FLOPs per sample x predicted samples/s over the datasheet peak of the plan's
    precision, on every GPU; it is in the plan's JSON and its table."""
    from lib.planning.render import format_plan
    from lib.steptime.device import GPU_COMPUTE_EFFICIENCY, gpu_device

    config = make_config(base="gpt2-tiny")
    model = ModelDescription.from_config(config)
    h100 = from_catalog("h100")
    plan = resolve(config, h100, model, 1)
    per_sample, rate = re.match(r"([\d.,]+) GFLOP per sample x ([\d.,]+) samples/s", plan.reasons["mfu"]).groups()
    peak = gpu_device("h100").flops(plan.precision, plan.tf32) / GPU_COMPUTE_EFFICIENCY
    assert plan.predicted_mfu == pytest.approx(float(per_sample) * 1e9 * plan.predicted_samples_per_second / peak,
                                               rel=1e-2)
    assert 0 < plan.predicted_mfu < 1 and plan.to_dict()["predicted_mfu"] == plan.predicted_mfu
    assert f"MFU   {plan.predicted_mfu:.1%}".replace("   ", " ") in " ".join(format_plan(plan, config, h100, model).split())
    eight = resolve(config, dataclasses.replace(h100, gpus=h100.gpus * 8), model, 8)
    assert "x 8" in eight.reasons["mfu"]  # every device's peak counts


def test_the_summary_line_adds_up_when_the_last_micro_batch_is_short():
    """batch x grad_acc x processes is the effective batch: a short last micro-batch is shown beside the batch."""
    plan = resolve(kc.defconfig_config("lenet5"), CPU, ModelDescription(name="lenet5"))
    short = dataclasses.replace(plan, micro_batch=21, grad_accum=25, effective_batch=512, world_size=1)
    assert short.split.text() == "21 x 24 + 8 x 1 = 512"
    two = dataclasses.replace(short, micro_batch=21, grad_accum=13, world_size=2)
    assert two.split.text() == "(21 x 12 + 4 x 1) x 2 processes = 512"
    exact = dataclasses.replace(plan, micro_batch=64, grad_accum=8, effective_batch=512, world_size=1)
    assert exact.split.text() == "64 x 8 = 512" and exact.split.compact() == "64"
    line = summary_line(short, CPU, ModelDescription(name="lenet5"))
    assert line.endswith("batch=21 (last 8), grad_acc=25 (effective=512, target=512)")


@pytest.mark.slow
def test_the_ladder_is_taken_before_training_when_no_strategy_of_several_fits(tmp_path):
    """World size 2 under CONFIG_PARALLEL_AUTO: DDP and both FSDP strategies refuse for lack of memory, and
    gradient checkpointing lets one fit: the plan takes that rung rather than refusing."""
    (tmp_path / "f").write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\\nCONFIG_DEVICE_CPU=y\\n'
                                "CONFIG_TARGET_EFFECTIVE_BATCH=8\\n")
    config = kc.make_defconfig("gpt2-tiny", [str(tmp_path / "f")], out=tmp_path / "config")
    tight = dataclasses.replace(CPU, cpu=dataclasses.replace(CPU.cpu, ram_available_bytes=15 * 2**20))  # x balanced 90%: 13.5 MiB
    plan = resolve(config, tight, ModelDescription.from_config(config), 2)
    assert plan.gradient_checkpointing and plan.reasons["oom_ladder"] == "before training: gradient checkpointing on"


@pytest.mark.slow  # torchrun
def test_apply_hyperparams_under_torchrun_plans_a_ranks_share(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setenv("WORLD_SIZE", "4")
    config = SimpleNamespace(TARGET_EFFECTIVE_BATCH=64, BATTERY_STOP=None, COMPILE_AUTO=None)  # None: unset
    plan = apply_hyperparams(config, verbose=False, model_type="lenet5", hardware=CPU)
    assert plan.world_size == 4 and config.BATCH_SIZE * config.GRADIENT_ACCUMULATION * 4 >= 64
    prefixed = SimpleNamespace(CONFIG_TARGET_EFFECTIVE_BATCH=32, CONFIG_BATCH_SIZE=1)
    apply_hyperparams(prefixed, verbose=False, model_type="lenet5", hardware=CPU, world_size=1)
    assert prefixed.CONFIG_BATCH_SIZE * prefixed.CONFIG_GRADIENT_ACCUMULATION == 32  # under the object's prefix
    llama = SimpleNamespace(MODEL_LLAMA="y")
    assert apply_hyperparams(llama, verbose=False, hardware=CPU, world_size=1).model == "llama"


@pytest.mark.parametrize("family", sorted(__import__("lib.models.registry", fromlist=["MODELS"]).MODELS))
def test_a_scripts_model_type_starts_from_a_defconfig_of_that_family(family):
    """apply_hyperparams(model_type=<family>) on a script's own object: every family in the registry names a
    defconfig (its own name's, or the one its ModelSpec.defconfig gives) that trains that family."""
    from types import SimpleNamespace

    from lib.hyperparams import as_config

    assert as_config(SimpleNamespace(), model_type=family).model == family
