"""Every model kfit can train, by name, and what the rest of kfit needs to know about it.

The one answer to "which models support gradient checkpointing" (`checkpointing_for`, `can_checkpoint`), "what data does it train on" and "how many
samples per step does the tier policy give it": the config's choices, the planner, the out-of-memory ladder,
the reports and lib/task.py all read a `ModelSpec` from here. Importing this module imports no torch: the
builders import their model modules when called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..config import Config
    from .checkpointing import Checkpointing
    from ..data import DatasetInfo


@dataclass(frozen=True)
class TensorParallel:
    """What the planner needs of a family that states a tensor-parallel plan (its module's
    tensor_parallel_plan(), which lib/parallel.py applies)."""

    problem: "Callable[[Config, int], str | None]"  # (config, N) -> why CONFIG_TP=N cannot split it, or None
    # (config, checkpointed) -> the activation elements per sample that one micro-batch's tensor-parallel
    # collectives carry, forward and backward (and forward again where checkpointed blocks recompute)
    traffic: "Callable[[Config, bool], int]"


@dataclass(frozen=True)
class ContextParallel:
    """What the planner needs of a family that context parallelism can split (lib/context_parallel.py): its
    attention torch's scaled_dot_product_attention (which torch's ring replaces), its positions computed from
    the tokens' places, not learned (so a process's chunks take theirs from the whole sequence's)."""

    # config -> (tokens of context, blocks, key and value elements per token in each block's attention)
    shape: "Callable[[Config], tuple[int, int, int]]"
    local: "Callable[[Config, int], Config]"  # (config, CP) -> the config at a process's share of the context


@dataclass(frozen=True)
class Depth:
    """What the memory tracer needs of a family of repeated blocks to trace it shallow and scale it by the
    depth (lib/memory/depth.py): its blocks, and the same model at another number of them."""

    layers: "Callable[[Config], int]"
    at: "Callable[[Config, int], Config]"  # (config, blocks) -> the config with that many, all else as it was


@dataclass(frozen=True)
class ModelSpec:
    name: str
    data: str  # images | text | custom (the factory brings its own)
    # whether the builder takes a gradient-checkpointing switch; a custom model's answer comes from the module
    # its factory builds (lib/models/checkpointing.py: its own switch, or its repeated blocks; checkpointing_for)
    supports_checkpointing: bool
    tier_scale: float | None  # the tier policy's samples per step relative to GPT-2; None: planned as GPT-2
    builder: Callable[..., object] | None = None  # (**build arguments) -> torch.nn.Module; None: custom
    # the config's and the data's say in the build: (config, DatasetInfo) -> lib.models.build_model's keywords
    build_args: "Callable[[Config, DatasetInfo], dict] | None" = None
    block_size: "Callable[[Config], int | None] | None" = None  # a text model's context, as configured
    smaller: str | None = None  # what makes the model itself smaller, for the advice when it does not fit
    # the size the config picks ("124m", "8b"; None for a model of one size): names runs, studies and traces
    preset: "Callable[[Config], str | None] | None" = None
    # the config fields that decide the model's shapes (and so its traces and its probe's result), beside its
    # name: every family says its own, so no two families' configs can share a cache key
    shape_key: "Callable[[Config], dict] | None" = None
    # a text model rebuilt from a run's weights (make sample): (config, state dict) -> (module, vocab, context);
    # a KeyError names a tensor the weights lack
    from_weights: "Callable[[Config, dict], tuple[object, int, int]] | None" = None
    title: str | None = None  # how messages name the family ("GPT-2"); None: its name
    # the defconfig a script's apply_hyperparams(model_type=<name>) starts from; None: the defconfig of its name
    defconfig: str | None = None
    tensor_parallel: TensorParallel | None = None  # None: the family states no tensor-parallel plan
    # config -> (blocks, tied output layer, activation elements a stage sends the next per sample): what
    # lib/pipeline.py cuts into stages (the module's pipeline_parts and forward(stage=)); None: it cannot be cut
    pipeline: "Callable[[Config], tuple[int, bool, int]] | None" = None
    context_parallel: ContextParallel | None = None  # None: CONFIG_CP cannot split its sequences
    depth: Depth | None = None  # None: traced with every block
    # the family's sizes for make recommend: () -> its presets (CONFIG_<NAME>_PRESET_<preset>), and
    # (config, preset, vocabulary rows) -> the model at that size (built where torch's default device is)
    presets: "Callable[[], tuple[str, ...]] | None" = None
    sized: "Callable[[Config, str, int], object] | None" = None

    @property
    def named(self) -> str:
        """How messages name the family: its title, else its name."""
        return self.title or self.name

    @property
    def text(self) -> bool:
        """Whether it trains on text (tokens in, a token's logits out) rather than images."""
        return self.data == "text"


def _lenet5(num_classes: int = 10, in_channels: int = 1, image_size: int = 32, grad_checkpointing: bool = False,
            dropout: float = 0.0, **_):
    from .lenet import LeNet5

    return LeNet5(num_classes, in_channels, image_size, dropout)  # too small to need checkpointing


def _resnet(depth: int):
    def build(num_classes: int = 10, in_channels: int = 1, image_size: int = 32, grad_checkpointing: bool = False,
              dropout: float = 0.0, **_):
        from . import resnet

        factory = resnet.resnet18 if depth == 18 else resnet.resnet50
        return factory(num_classes, in_channels, image_size, grad_checkpointing, dropout)
    return build


def _gpt2(gpt2_preset="124m", block_size: int = 1024, vocab_size: int = 50257, dropout: float = 0.0,
          grad_checkpointing: bool = False, recompute=None, **_):
    """`gpt2_preset`: a preset's name, or a GPT2Config whose shape is taken (CONFIG_GPT2_PRESET_CUSTOM)."""
    from dataclasses import replace

    from .checkpointing import Recompute
    from .gpt2 import GPT2, GPT2_PRESETS, GPT2Config

    if not isinstance(gpt2_preset, GPT2Config):
        if gpt2_preset not in GPT2_PRESETS:
            raise ValueError(f"unknown gpt2 preset {gpt2_preset!r}; choose one of {', '.join(GPT2_PRESETS)}")
        gpt2_preset = GPT2_PRESETS[gpt2_preset]
    shape = replace(gpt2_preset, block_size=block_size, vocab_size=vocab_size, dropout=dropout)
    return GPT2(shape, grad_checkpointing, recompute or Recompute())


def _llama(llama_preset="125m", block_size: int = 1024, vocab_size: int = 50257, tie_embeddings: bool = True,
           grad_checkpointing: bool = False, recompute=None, context_parallel: bool = False, **_):
    """`llama_preset`: a preset's name, or a LlamaConfig whose shape is taken (CONFIG_LLAMA_PRESET_CUSTOM)."""
    from dataclasses import replace

    from .checkpointing import Recompute
    from .llama import LLAMA_PRESETS, Llama, LlamaConfig

    if not isinstance(llama_preset, LlamaConfig):
        if llama_preset not in LLAMA_PRESETS:
            raise ValueError(f"unknown llama preset {llama_preset!r}; choose one of {', '.join(LLAMA_PRESETS)}")
        llama_preset = LLAMA_PRESETS[llama_preset]
    shape = replace(llama_preset, block_size=block_size, vocab_size=vocab_size, tie_embeddings=tie_embeddings)
    return Llama(shape, grad_checkpointing, recompute or Recompute(), expand_kv=context_parallel)


def _image_args(config: "Config", info: "DatasetInfo") -> dict:
    # CONFIG_DROPOUT: before the classifier's last Linear (the Kconfig shows it for the image models only)
    return dict(num_classes=info.num_classes, in_channels=info.channels, image_size=info.image_size,
                dropout=config.dropout or 0.0)


VOCAB_MULTIPLE = 64  # CONFIG_PAD_VOCAB: the embedding's and output layer's rows a multiple of 64 tokens


def vocab_rows(vocab_size: int, pad: bool | None) -> int:
    """The rows a text model's embedding and output layer get for a vocabulary (CONFIG_PAD_VOCAB: rounded up
    to VOCAB_MULTIPLE, so the output layer's matmuls have no dimension a GPU runs with slower kernels)."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE if pad else vocab_size


def vocabulary(config: "Config", info: "DatasetInfo") -> int:
    """A text model's tokens: CONFIG_VOCAB_SIZE where set (a model planned at its real size before its corpus
    exists), else the data's (a tokenized corpus's, or 256 bytes). Data whose ids reach a set size cannot train
    on the model: a ConfigError naming both and the fix."""
    if not config.vocab_size:
        return info.vocab_size
    if info.vocab_size > config.vocab_size:
        raise ConfigError(f"CONFIG_VOCAB_SIZE={config.vocab_size} is smaller than the data's vocabulary "
                          f"({info.vocab_size} tokens, {info.name}): train on a corpus tokenized with the model's "
                          "tokenizer (make data), or set CONFIG_VOCAB_SIZE=0 to take the data's")
    return config.vocab_size


def recompute_of(config: "Config"):
    """What a checkpointed GPT-2 or Llama block keeps (CONFIG_ACTIVATION_CHECKPOINT_*: checkpointing.Recompute)."""
    from .checkpointing import Recompute

    return Recompute(config.recompute_policy or "full", config.recompute_every or 2)


def gpt2_shape(config: "Config"):
    """The configured GPT-2's GPT2Config without its context and vocabulary: a preset's, or
    GPT2_PRESET_CUSTOM's dimensions. Every place that builds a GPT-2 from a Config asks here."""
    from .gpt2 import GPT2_PRESETS, GPT2Config

    if config.gpt2_preset != "custom":
        return GPT2_PRESETS[config.gpt2_preset]
    options = config.options
    return GPT2Config(n_layer=options.gpt2_layers, n_head=options.gpt2_heads, n_embd=options.gpt2_width)


def _gpt2_at_depth(config: "Config", layers: int) -> "Config":
    from ..config import derive

    shape = gpt2_shape(config)
    return derive(config, {"GPT2_PRESET_CUSTOM": True, "GPT2_LAYERS": layers, "GPT2_HEADS": shape.n_head,
                           "GPT2_WIDTH": shape.n_embd})


def _gpt2_args(config: "Config", info: "DatasetInfo") -> dict:
    return dict(gpt2_preset=gpt2_shape(config), block_size=info.block_size,
                vocab_size=vocab_rows(vocabulary(config, info), config.pad_vocab), dropout=config.gpt2_dropout or 0.0,
                recompute=recompute_of(config))


def llama_shape(config: "Config"):
    """The configured Llama's LlamaConfig without its context and vocabulary: a preset's published shape, or
    LLAMA_PRESET_CUSTOM's dimensions. Every place that builds a Llama from a Config asks here."""
    from .llama import LLAMA_PRESETS, LlamaConfig

    if config.llama_preset != "custom":
        return LLAMA_PRESETS[config.llama_preset]
    dim, n_layer, n_head, n_kv_head, hidden_dim = config.llama_dims
    return LlamaConfig(dim=dim, n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head, hidden_dim=hidden_dim,
                       rope_theta=config.llama_rope_theta or 500000.0)


def _llama_tensor_problem(config: "Config", degree: int) -> str | None:
    from .llama import tensor_parallel_problem

    return tensor_parallel_problem(llama_shape(config), degree, config.llama_block_size)


def _llama_tensor_traffic(config: "Config", checkpointed: bool) -> int:
    from .llama import tensor_parallel_traffic

    return tensor_parallel_traffic(llama_shape(config), config.llama_block_size, checkpointed)


def _llama_pipeline(config: "Config") -> tuple[int, bool, int]:
    shape = llama_shape(config)
    return shape.n_layer, config.llama_tie_embeddings is not False, config.llama_block_size * shape.dim


def _llama_context(config: "Config") -> tuple[int, int, int]:
    shape = llama_shape(config)
    # Attention.expand_kv: a context-parallel step gathers every query head's keys and values
    return config.llama_block_size, shape.n_layer, 2 * shape.n_head * shape.head_dim


def _llama_local(config: "Config", degree: int) -> "Config":
    """The config at 1/degree of the context, its text too (the memory tracer's shallow configs are derived from
    the text: lib/memory/depth.py), and every field the planner set on it kept."""
    from dataclasses import fields, replace

    from ..config import derive

    local = derive(config, {"LLAMA_BLOCK_SIZE": config.llama_block_size // degree, "CP": degree})
    kept = {f.name: getattr(config, f.name) for f in fields(config)
            if f.name not in ("llama_block_size", "context_parallel", "text", "source")}
    return replace(local, **kept)


def _llama_at_depth(config: "Config", layers: int) -> "Config":
    from ..config import derive

    shape = llama_shape(config)
    return derive(config, {"LLAMA_PRESET_CUSTOM": True, "LLAMA_DIM": shape.dim, "LLAMA_LAYERS": layers,
                           "LLAMA_HEADS": shape.n_head, "LLAMA_KV_HEADS": shape.n_kv_head,
                           "LLAMA_FFN_DIM": shape.hidden_dim, "LLAMA_ROPE_THETA": f"{shape.rope_theta:g}",
                           "LLAMA_TIE_EMBEDDINGS": config.llama_tie_embeddings is not False})


def _llama_args(config: "Config", info: "DatasetInfo") -> dict:
    return dict(llama_preset=llama_shape(config), block_size=info.block_size,
                vocab_size=vocab_rows(vocabulary(config, info), config.pad_vocab),
                tie_embeddings=config.llama_tie_embeddings is not False, recompute=recompute_of(config),
                context_parallel=config.context_parallel > 1)


def _text_key(block_size: "Callable[[Config], int | None]", preset: "Callable[[Config], str | None]"):
    """A text family's shape key: its preset and context, and what every text model shares (the vocabulary as
    the data or CONFIG_VOCAB_SIZE gives it, its padding, dropout's masks, what a checkpointed block keeps)."""
    from pathlib import Path

    def key(config: "Config") -> dict:
        from ..fileio import content_hash

        fp: dict = dict(preset=preset(config), block_size=block_size(config),
                        dropout=bool(config.gpt2_dropout),  # masks are saved for backward only when > 0
                        # the vocabulary: 256 bytes for the embedded text, meta.json (or GPT-2's) for a corpus
                        corpus=(None if config.dataset != "dir" else
                                content_hash(Path(config.data_dir or "") / "meta.json") or "gpt2-vocab"))
        return fp
    return key


def _text_extras(config: "Config", fp: dict) -> dict:
    if config.recompute_policy not in (None, "full"):  # what a checkpointed block keeps
        fp.update(recompute=[config.recompute_policy, config.recompute_every or 0])
    if config.vocab_size:  # CONFIG_VOCAB_SIZE in place of the data's (left out at 0: keys stay as they were)
        fp.update(vocab=config.vocab_size)
    if config.pad_vocab and (config.dataset == "dir" or config.vocab_size):  # 256 bytes need no padding
        fp.update(pad_vocab=True)
    return fp


def _gpt2_key(config: "Config") -> dict:
    fp = _text_key(lambda c: c.gpt2_block_size, lambda c: c.gpt2_preset)(config)
    if config.gpt2_preset == "custom":  # CONFIG_GPT2_PRESET_CUSTOM's shape
        shape = gpt2_shape(config)
        fp.update(dims=[shape.n_layer, shape.n_head, shape.n_embd])
    return _text_extras(config, fp)


def _llama_key(config: "Config") -> dict:
    fp = _text_key(lambda c: c.llama_block_size, lambda c: c.llama_preset)(config)
    fp.update(tied=config.llama_tie_embeddings)
    if config.context_parallel > 1:  # its attention's key/value heads expanded (left out at 1: the keys as they were)
        fp.update(expand_kv=True)
    if config.llama_dims:  # CONFIG_LLAMA_PRESET_CUSTOM's shape
        fp.update(dims=list(config.llama_dims))
    return _text_extras(config, fp)


def _image_key(config: "Config") -> dict:
    # channels and classes come from the data set's format
    fp: dict = dict(image_size=config.image_size, data=config.dataset_format if config.dataset == "dir" else "digits")
    if config.dropout:  # its masks are saved for backward (left out at 0: the keys stay as they were)
        fp.update(dropout=True)
    return fp


def _custom_key(config: "Config") -> dict:
    from ..fileio import content_hash
    from .custom import load_factory, source_file

    fp: dict = dict(factory=config.custom_model_factory,
                    source=content_hash(source_file(load_factory(config.custom_model_factory))))
    if config.checkpoint_modules:  # which blocks a checkpointed step recomputes
        fp.update(checkpoint_modules=list(config.checkpoint_modules))
    return fp


def _gpt2_from_weights(config: "Config", weights: dict) -> tuple[object, int, int]:
    from . import build_model

    vocab, block = weights["transformer.wte.weight"].shape[0], weights["transformer.wpe.weight"].shape[0]
    return build_model("gpt2", gpt2_preset=gpt2_shape(config), block_size=block, vocab_size=vocab), vocab, block


def _llama_from_weights(config: "Config", weights: dict) -> tuple[object, int, int]:
    from . import build_model

    vocab, block = weights["embed.weight"].shape[0], config.llama_block_size
    return build_model("llama", llama_preset=llama_shape(config), block_size=block, vocab_size=vocab,
                       tie_embeddings=config.llama_tie_embeddings is not False), vocab, block


def _gpt2_presets() -> tuple[str, ...]:
    from .gpt2 import GPT2_PRESETS

    return tuple(GPT2_PRESETS)


def _gpt2_sized(config: "Config", preset: str, vocab: int):
    from . import build_model

    return build_model("gpt2", gpt2_preset=preset, block_size=1024, vocab_size=vocab)


def _llama_presets() -> tuple[str, ...]:
    from .llama import LLAMA_PRESETS

    return tuple(LLAMA_PRESETS)


def _llama_sized(config: "Config", preset: str, vocab: int):
    from . import build_model

    return build_model("llama", llama_preset=preset, block_size=1024, vocab_size=vocab,
                       tie_embeddings=config.llama_tie_embeddings is not False)


def _smaller(family: str) -> str:
    return f"a smaller preset (CONFIG_{family}_PRESET_*) or a shorter CONFIG_{family}_BLOCK_SIZE"


MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (
    ModelSpec("lenet5", "images", supports_checkpointing=False, tier_scale=4.0, builder=_lenet5,
              build_args=_image_args, shape_key=_image_key, title="LeNet-5"),
    ModelSpec("resnet18", "images", supports_checkpointing=True, tier_scale=2.0, builder=_resnet(18),
              build_args=_image_args, shape_key=_image_key, title="ResNet-18"),
    ModelSpec("resnet50", "images", supports_checkpointing=True, tier_scale=1.5, builder=_resnet(50),
              build_args=_image_args, shape_key=_image_key, title="ResNet-50"),
    ModelSpec("gpt2", "text", supports_checkpointing=True, tier_scale=1.0, builder=_gpt2, build_args=_gpt2_args,
              block_size=lambda config: config.gpt2_block_size, smaller=_smaller("GPT2"),
              preset=lambda config: config.gpt2_preset, shape_key=_gpt2_key, from_weights=_gpt2_from_weights,
              title="GPT-2", depth=Depth(lambda config: gpt2_shape(config).n_layer, _gpt2_at_depth),
              presets=_gpt2_presets, sized=_gpt2_sized),
    ModelSpec("llama", "text", supports_checkpointing=True, tier_scale=None, builder=_llama, build_args=_llama_args,
              block_size=lambda config: config.llama_block_size, smaller=_smaller("LLAMA"),
              preset=lambda config: config.llama_preset, shape_key=_llama_key, from_weights=_llama_from_weights,
              title="Llama", defconfig="llama-tiny", tensor_parallel=TensorParallel(_llama_tensor_problem, _llama_tensor_traffic),
              pipeline=_llama_pipeline, context_parallel=ContextParallel(_llama_context, _llama_local),
              depth=Depth(lambda config: llama_shape(config).n_layer, _llama_at_depth),
              presets=_llama_presets, sized=_llama_sized),
    # a model from the user's factory (CONFIG_MODEL_CUSTOM): planned as conservatively as GPT-2
    ModelSpec("custom", "custom", supports_checkpointing=False, tier_scale=None, shape_key=_custom_key,
              defconfig="custom-transformer"),
)}



def families() -> dict[str, ModelSpec]:
    """The families kept in one file each (lib/models/families/, resources.FAMILY_DIRS): each file's FAMILY,
    by name; the file is imported once (a second call returns the module already loaded)."""
    import importlib.util
    import sys

    from .. import resources
    from . import families as package

    found: dict[str, ModelSpec] = {}
    for folder in resources.FAMILY_DIRS:
        for path in sorted(folder.glob("*.py")) if folder.is_dir() else ():
            if path.name.startswith("_"):
                continue
            name = f"{package.__name__}.{path.stem}"
            module = sys.modules.get(name)
            if module is None or getattr(module, "__file__", None) != str(path):
                loader = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(loader)
                sys.modules[name] = module
                loader.loader.exec_module(module)
            spec = getattr(module, "FAMILY", None)
            if not isinstance(spec, ModelSpec) or spec.name != path.stem.lower():
                raise ConfigError(f"{path}: a model family's file declares FAMILY, a ModelSpec named {path.stem!r} "
                                  "(lib/models/families/__init__.py)")
            found[spec.name] = spec
    return found


MODELS.update(families())
BUILT_IN = tuple(name for name, spec in MODELS.items() if spec.builder is not None)


def spec_for(name: str) -> ModelSpec:
    """The model called `name`; a ConfigError naming the choices for another name."""
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}") from None


def preset_of(config: "Config") -> str | None:
    """The size the config's model is built at (its family's preset), or None for a model of one size."""
    spec = MODELS.get(config.model)
    return spec.preset(config) if spec is not None and spec.preset is not None else None


def label(config: "Config") -> str:
    """The model as runs, studies, traces and start lines name it: 'gpt2-124m', 'llama-8b', 'lenet5'."""
    preset = preset_of(config)
    return f"{config.model}-{preset}" if preset else config.model


def shape_key(config: "Config") -> dict:
    """The config fields that decide the model's shapes, its name first: the model part of every cache key
    (traces, probe results). A model without a shape_key cannot be planned from a cache: a ConfigError."""
    spec = spec_for(config.model)
    if spec.shape_key is None:
        raise ConfigError(f"model {config.model!r} declares no shape_key in lib/models/registry.py: its traces "
                          "could share another model's cache key")
    return {"model": config.model, **spec.shape_key(config)}


def checkpointing_for(model_or_config: "str | Config", model: object | None = None) -> "Checkpointing | None":
    """How gradient checkpointing is switched on for this model (lib/models/checkpointing.py), or None where it
    cannot be: a built-in model's own switch where its spec supports it; a custom model's from the module its
    factory builds (`model`, one built already, or the config's factory: lib/models/custom.py), or from the
    built `model` alone where given no Config. Every "can this model checkpoint" in kfit asks here."""
    config = None if isinstance(model_or_config, str) else model_or_config
    spec = MODELS.get(model_or_config if config is None else config.model)
    if spec is None:
        return None
    from .checkpointing import Checkpointing, find

    if spec.builder is not None:
        return Checkpointing("own") if spec.supports_checkpointing else None
    if config is not None:
        from .custom import checkpointing_of

        return checkpointing_of(config, model)
    return find(model) if model is not None else None


def can_checkpoint(model_or_config: "str | Config", model: object | None = None) -> bool:
    """Whether gradient checkpointing can be switched on for this model (`checkpointing_for`): given a name,
    a built-in that supports it or a built custom `model` that has a way; given the Config, any model."""
    return checkpointing_for(model_or_config, model) is not None
