"""The Llama-style decoder (lib/models/llama.py): shapes, grouped-query attention, checkpointing, tying, and
the config, planner, sharding and step-time paths every built-in model goes through."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lib import config as kc
from lib.hardware import resolve_hardware
from lib.hyperparams import ModelDescription, resolve
from lib.models import LLAMA_PRESETS, Llama, build_model, count_parameters, spec_for
from lib.models.llama import Attention, LlamaConfig
from lib.models.registry import can_checkpoint
from lib.parallel import shard_units

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**kw) -> Llama:
    torch.manual_seed(0)
    return build_model("llama", llama_preset="tiny", block_size=32, vocab_size=300, **kw)


def test_shapes_and_no_biases():
    model = tiny()
    logits = model(torch.randint(0, 300, (2, 32)))
    assert logits.shape == (2, 32, 300)
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    assert all(isinstance(m, torch.nn.RMSNorm) for m in (model.norm, model.layers[0].attn_norm))
    with pytest.raises(ValueError, match="exceeds block_size"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_grouped_query_attention_heads():
    config = LLAMA_PRESETS["tiny"]
    attn = tiny().layers[0].attn
    assert (attn.n_head, attn.n_kv_head) == (4, 2)
    assert attn.q_proj.out_features == 128 and attn.k_proj.out_features == attn.v_proj.out_features == 64
    # GQA equals full attention with each key/value head repeated for its group of query heads
    full = Attention(LlamaConfig(dim=128, n_head=4, n_kv_head=4, hidden_dim=384))
    with torch.no_grad():
        full.q_proj.weight.copy_(attn.q_proj.weight)
        full.o_proj.weight.copy_(attn.o_proj.weight)
        for name in ("k_proj", "v_proj"):
            w = getattr(attn, name).weight.view(2, config.head_dim, 128)
            getattr(full, name).weight.copy_(w.repeat_interleave(2, dim=0).reshape(128, 128))
    from lib.models.llama import rotary

    x = torch.randn(2, 16, 128)
    cos, sin = rotary(16, 32, 10000.0, x.device)
    torch.testing.assert_close(attn(x, cos, sin), full(x, cos, sin), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="multiple of n_kv_head"):
        LlamaConfig(dim=128, n_head=4, n_kv_head=3)


def test_causal():
    model = tiny().eval()
    x = torch.randint(0, 300, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 300
    torch.testing.assert_close(model(x)[:, :10], model(y)[:, :10])


def test_checkpointing_gives_the_same_gradients():
    x, y = torch.randint(0, 300, (2, 32)), torch.randint(0, 300, (2, 32))
    grads = []
    for checkpointing in (False, True):
        model = tiny(grad_checkpointing=checkpointing)
        assert model.grad_checkpointing is checkpointing
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)
    assert spec_for("llama").supports_checkpointing and can_checkpoint("llama")


def test_tied_and_untied_embeddings():
    tied, untied = tiny(), tiny(tie_embeddings=False)
    assert tied.lm_head.weight is tied.embed.weight
    assert untied.lm_head.weight is not untied.embed.weight
    assert count_parameters(untied) - count_parameters(tied) == 300 * 128
    assert set(tied.state_dict()) == set(untied.state_dict())  # an export loads into either


def test_presets_span_20m_to_405b():
    counts = {}
    for name in LLAMA_PRESETS:
        with torch.device("meta"):
            counts[name] = count_parameters(build_model("llama", llama_preset=name, vocab_size=32000))
    assert 15e6 < counts["20m"] < 25e6 and 0.95e9 < counts["1b"] < 1.1e9 and counts["405b"] > 4e11
    assert list(counts.values()) == sorted(counts.values())


# Published parameter counts with Llama 3's 128,256-token vocabulary (Meta's model cards), tied as each is.
PUBLISHED = {"llama3.2-1b": ("1b", 1.24e9), "llama3.2-3b": ("3b", 3.21e9), "llama3-8b": ("8b", 8.03e9),
             "llama3-70b": ("70b", 70.6e9), "llama3-405b": ("405b", 405.9e9)}


@pytest.mark.parametrize("name", PUBLISHED)
def test_llama3_defconfigs_are_the_published_shapes(name, tmp_path):
    """make <name>-defconfig gives the published model, planned at its real vocabulary without a corpus."""
    from lib.models.registry import llama_shape

    config = kc.make_defconfig(name, out=tmp_path / ".config")
    preset, published = PUBLISHED[name]
    assert (config.llama_preset, config.vocab_size, config.llama_block_size) == (preset, 128256, 8192)
    assert config.llama_tie_embeddings == (preset in ("1b", "3b")) and not config.weight_decay_embeddings
    assert llama_shape(config).rope_theta == 500000.0
    with torch.device("meta"):  # nothing allocated: a 405B model is 1.6 TB in fp32
        model = build_model("llama", llama_preset=llama_shape(config), vocab_size=config.vocab_size,
                            tie_embeddings=config.llama_tie_embeddings)
    assert abs(count_parameters(model) / published - 1) < 0.005


def custom_text(dim, layers, heads, kv, ffn, theta="500000") -> str:
    return (f"CONFIG_LLAMA_PRESET_CUSTOM=y\nCONFIG_LLAMA_DIM={dim}\nCONFIG_LLAMA_LAYERS={layers}\n"
            f"CONFIG_LLAMA_HEADS={heads}\nCONFIG_LLAMA_KV_HEADS={kv}\nCONFIG_LLAMA_FFN_DIM={ffn}\n"
            f'CONFIG_LLAMA_ROPE_THETA="{theta}"\n')


def test_a_custom_size_is_built_from_its_settings(make_config):
    from lib.task import load_task

    config = make_config(custom_text(96, 3, 6, 2, 256, "10000") + "CONFIG_VOCAB_SIZE=1000\n", "llama-tiny")
    model = load_task(config).build(False)
    assert (len(model.layers), model.config.dim, model.config.n_head, model.config.n_kv_head,
            model.config.hidden_dim, model.config.rope_theta) == (3, 96, 6, 2, 256, 10000.0)
    assert model.embed.weight.shape == (1024, 96)  # 1000 tokens padded to a multiple of 64


@settings(max_examples=60, deadline=None)
@given(dim=st.integers(16, 600), heads=st.integers(1, 40), kv=st.integers(1, 40))
def test_the_config_refuses_exactly_the_shapes_the_model_refuses(dim, heads, kv, tmp_path_factory):
    """Every dimension the menu accepts either builds or is refused when the config is read, in one line
    naming the settings; never a model that fails later."""
    from lib.errors import ConfigError

    tmp = tmp_path_factory.mktemp("custom")
    fragment = tmp / "fragment"
    fragment.write_text(custom_text(dim, 2, heads, kv, 64))
    try:
        LlamaConfig(dim=dim, n_layer=2, n_head=heads, n_kv_head=kv, hidden_dim=64)
        builds = True
    except ValueError:
        builds = False
    try:
        config = kc.make_defconfig("llama-tiny", [str(fragment)], out=tmp / ".config")
    except ConfigError as err:
        assert not builds and "\n" not in str(err) and "CONFIG_LLAMA_" in str(err), str(err)
        return
    assert builds and config.llama_dims == (dim, 2, heads, kv, 64)


def test_vocab_size_plans_without_a_corpus_and_training_refuses_larger_data(make_config):
    """CONFIG_VOCAB_SIZE sizes the model; data whose ids reach it is refused in one line naming the fix."""
    from lib.errors import ConfigError
    from lib.task import load_task

    big = load_task(make_config("CONFIG_VOCAB_SIZE=128256\n", "llama-tiny"))
    with torch.device("meta"):
        assert big.build(False).embed.weight.shape[0] == 128256
    with pytest.raises(ConfigError, match=r"CONFIG_VOCAB_SIZE=100 is smaller than the data's vocabulary \(256"):
        load_task(make_config("CONFIG_VOCAB_SIZE=100\n", "llama-tiny"))
    gpt2 = load_task(make_config("CONFIG_VOCAB_SIZE=50257\n", "gpt2-tiny"))
    with torch.device("meta"):
        assert gpt2.build(False).lm_head.weight.shape[0] == 50304


def test_fsdp_shards_every_block():
    model = tiny()
    assert shard_units(model) == list(model.layers)


def test_kconfig_typed_fields(make_config):
    config = make_config("", "llama-tiny")
    assert (config.model, config.llama_preset, config.llama_block_size, config.llama_tie_embeddings) == (
        "llama", "tiny", 128, True)
    big = kc.read_config(kc.DEFCONFIG_DIR / "llama-125m")
    assert (big.llama_preset, big.llama_block_size, big.gpt2_preset) == ("125m", 1024, None)
    untied = make_config("CONFIG_LLAMA_PRESET_1B=y\nCONFIG_LLAMA_TIE_EMBEDDINGS=n\n", "llama-tiny")
    assert (untied.llama_preset, untied.llama_tie_embeddings, untied.llama_block_size) == ("1b", False, 1024)


def test_planner_traces_it_on_the_cpu(make_config):
    config = make_config("CONFIG_MAX_STEPS=2\n", "llama-tiny")
    plan = resolve(config, resolve_hardware(gpu="cpu"), ModelDescription.from_config(config))
    assert plan.model == "llama" and plan.micro_batch >= 1 and plan.predicted_peak_bytes > 0
    breakdown = plan.memory_breakdown
    params = count_parameters(build_model("llama", llama_preset="tiny", block_size=128, vocab_size=256))
    assert breakdown["parameters"] >= params * 4


def gpu_config(tmp_path, text: str = ""):
    fragment = tmp_path / "gpu-fragment"
    fragment.write_text(f'CONFIG_OUTPUT_DIR="{tmp_path}/runs"\n' + text)
    return kc.make_defconfig("llama-tiny", [str(fragment)], out=tmp_path / "gpu-config")


def test_planner_plans_it_for_an_h100(tmp_path):
    config = gpu_config(tmp_path)
    plan = resolve(config, resolve_hardware(gpu="h100"), ModelDescription.from_config(config))
    assert plan.device_type == "cuda" and plan.precision == "bf16" and plan.predicted_peak_bytes > 0


@pytest.mark.slow
def test_the_1b_preset_plans_on_h100(tmp_path, monkeypatch):
    from lib.planning import resolver

    # memory only: the step-time counts of a 1B model (two batch sizes, each checkpointing setting) cost most
    # of a minute here and are the counter's business (test_step_time_counter_counts_it)
    monkeypatch.setattr(resolver, "choose_fastest", lambda *a, **k: None)
    monkeypatch.setattr(resolver, "with_predictions", lambda config, hardware, plan, speed_model=None: plan)
    # planned in the same process after the tiny preset: the memory cache's key must tell them apart
    config = gpu_config(tmp_path, "CONFIG_LLAMA_PRESET_1B=y\nCONFIG_TARGET_EFFECTIVE_BATCH=64\n")
    plan = resolve(config, resolve_hardware(gpu="h100"), ModelDescription.from_config(config))
    assert plan.device_type == "cuda" and plan.micro_batch >= 1
    # the parameters the trace saw are the 1B model's (bf16 autocast keeps fp32 master weights)
    assert plan.memory_breakdown["parameters"] > 0.9e9 * 4


def test_step_time_counter_counts_it(make_config):
    from lib.steptime.count import count_step
    from lib.task import load_task

    config = make_config("", "llama-tiny")
    phases, parameters = count_step(load_task(config), config, batch=2, precision="fp32", device_type="cpu",
                                    gradient_checkpointing=False)
    assert parameters == count_parameters(load_task(config).build(False))
    # at least 6 x parameters x tokens (forward 2, backward 4), plus attention
    tokens = 2 * 128
    assert phases["forward"].flops + phases["backward"].flops >= 6 * parameters * tokens * 0.9
