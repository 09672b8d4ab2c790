"""Text from a trained GPT-2 run: `make sample RUN=<run dir, checkpoint or model.safetensors> PROMPT="..."`.

The model is rebuilt from the run's config (its preset) with the vocabulary and
context its weights hold, so no data needs to be present. Tokens: byte-level
runs (the embedded text, *.txt corpora: vocabulary 256) encode the prompt as
UTF-8 bytes; a nanoGPT-format corpus with GPT-2's vocabulary (50257) needs
tiktoken's "gpt2" encoding (pip install tiktoken); any other vocabulary has no
tokenizer kfit knows, which is said before anything is loaded onto a device.

Sampling is nanoGPT's: the last `block_size` tokens in, the last position's
logits over the temperature, the top k kept, one token drawn (argmax at
temperature 0), from a seeded generator, so a seed repeats a sample.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import KfitError

BYTE_VOCAB = 256
GPT2_BPE_VOCAB = 50257


@dataclass(frozen=True)
class Tokenizer:
    encode: object  # str -> list[int]
    decode: object  # list[int] -> str
    name: str


def tokenizer_for(vocab_size: int) -> Tokenizer:
    if vocab_size == BYTE_VOCAB:
        return Tokenizer(lambda text: list(text.encode("utf-8")),
                         lambda ids: bytes(ids).decode("utf-8", errors="replace"), "bytes (UTF-8)")
    if vocab_size == GPT2_BPE_VOCAB:
        try:
            import tiktoken
        except ImportError:
            raise KfitError("this run's vocabulary is GPT-2's BPE (50257 tokens): sampling needs its tokenizer; "
                            "pip install tiktoken") from None
        enc = tiktoken.get_encoding("gpt2")
        return Tokenizer(lambda text: enc.encode(text, allowed_special={"<|endoftext|>"}), enc.decode, "tiktoken gpt2")
    raise KfitError(f"this run's vocabulary has {vocab_size} tokens, and kfit knows no tokenizer for it (256: bytes, "
                    f"50257: GPT-2's BPE): decode its token ids with the tokenizer that made the corpus")


def load_run_model(run: Path) -> tuple[torch.nn.Module, dict]:
    """The trained GPT-2 of a run directory, checkpoint or exported model.safetensors, with what it came from."""
    from . import config as kconfig
    from .export import checkpoint_of, load_exported, model_state
    from .models import build_model

    run = Path(run)
    if run.suffix == ".safetensors":
        config_file = run.parent / "config"
        if not config_file.is_file():
            raise KfitError(f"{run}: no config beside it ({config_file}); sample from the run directory, or keep "
                            "the files make export wrote together")
        weights, config_text, step = load_exported(run), config_file.read_text(), None
    else:
        path = checkpoint_of(run)
        from . import checkpoint

        meta = checkpoint.load_checkpoint(path)
        weights, config_text, step = model_state(path), meta["config"], meta.get("step")
    with tempfile.TemporaryDirectory(prefix="kfit-sample-") as tmp:
        (Path(tmp) / "config").write_text(config_text)
        config = kconfig.read_config(Path(tmp) / "config")
    if config.model != "gpt2":
        raise KfitError(f"{run} is a {config.model} run: make sample generates text from GPT-2 runs")
    try:
        vocab, block = weights["transformer.wte.weight"].shape[0], weights["transformer.wpe.weight"].shape[0]
    except KeyError as err:
        raise KfitError(f"{run}: no {err.args[0]} in its weights: not a kfit GPT-2 model") from None
    model = build_model("gpt2", gpt2_preset=config.gpt2_preset, block_size=block, vocab_size=vocab)
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        raise KfitError(f"{run}: its weights do not fit the {config.gpt2_preset} preset its config names "
                        f"({' '.join(str(err).split())[:200]})") from None
    return model.eval(), {"preset": config.gpt2_preset, "vocab_size": vocab, "block_size": block, "step": step}


@torch.no_grad()
def generate(model: torch.nn.Module, ids: list[int], *, max_tokens: int, temperature: float, top_k: int | None,
             block_size: int, generator: torch.Generator, device: torch.device) -> list[int]:
    """`max_tokens` new token ids after `ids`."""
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    for _ in range(max_tokens):
        logits = model(idx[:, -block_size:])[:, -1, :].float()
        if temperature == 0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(device)
        idx = torch.cat([idx, nxt], dim=1)
    return idx[0, len(ids):].tolist()


def sample(run: Path, prompt: str, *, max_tokens: int = 200, temperature: float = 0.8, top_k: int | None = 200,
           seed: int = 0, device: str | None = None) -> tuple[str, dict]:
    """(generated text, what it came from): the run's model continuing `prompt`."""
    if temperature < 0:
        raise KfitError(f"TEMPERATURE={temperature}: must be 0 (greedy) or more")
    model, about = load_run_model(run)
    tok = tokenizer_for(about["vocab_size"])
    ids = tok.encode(prompt) or [0 if about["vocab_size"] == BYTE_VOCAB else GPT2_BPE_VOCAB - 1]
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(target)
    generator = torch.Generator().manual_seed(seed)
    new = generate(model, ids, max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                   block_size=about["block_size"], generator=generator, device=target)
    return tok.decode(new), {**about, "tokenizer": tok.name, "device": str(target)}
