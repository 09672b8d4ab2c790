"""Text from a trained GPT-2 or Llama run: `make sample RUN=<run dir, checkpoint or model.safetensors> PROMPT="..."`.

The model is rebuilt from the run's config (its preset) with the vocabulary and
context its weights hold, so no data needs to be present. Tokens: the run's own
tokenizer.json (beside an exported model.safetensors, or in the run directory:
training copies its tokenized corpus's there, with its sha256), else the corpus
directory's its config names, refused when its sha256 is not the one the run
recorded (lib/data/run_tokenizer.py); else byte-level runs (the embedded text,
*.txt corpora: vocabulary 256) encode the prompt as UTF-8 bytes, and a
nanoGPT-format corpus with GPT-2's vocabulary (50257) needs tiktoken's "gpt2"
encoding (pip install tiktoken); any other vocabulary has no tokenizer kfit
knows, which is said before anything is loaded onto a device.

Sampling is nanoGPT's: the last `block_size` tokens in, the last position's
logits over the temperature, the top k kept, one token drawn (argmax at
temperature 0), from a seeded generator, so a seed repeats a sample.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .redact import shown
from . import fileio
from .errors import KfitError

BYTE_VOCAB = 256
GPT2_BPE_VOCAB = 50257


@dataclass(frozen=True)
class Tokenizer:
    encode: object  # str -> list[int]
    decode: object  # list[int] -> str
    name: str
    vocab_size: int  # its ids are below it: the model's rows beyond (CONFIG_PAD_VOCAB) are never sampled


def fits(vocab_size: int, rows: int) -> bool:
    """Whether a tokenizer of `vocab_size` ids is the one of a model with `rows` output rows: the same, or
    padded to them (CONFIG_PAD_VOCAB)."""
    from .models.registry import vocab_rows

    return rows in (vocab_size, vocab_rows(vocab_size, True))


def hf_tokenizer(path: Path, vocab_size: int, data: bytes | None = None) -> Tokenizer | None:
    """The Hugging Face tokenizer.json at `path` (its contents `data`, already read) when it is there and its
    vocabulary is the model's (`vocab_size` rows: its own, or padded to them)."""
    if data is None and not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer as HF
    except ImportError:
        raise KfitError(f"decoding with {path} needs Hugging Face tokenizers: pip install tokenizers") from None
    try:
        tok = HF.from_file(str(path)) if data is None else HF.from_str(data.decode("utf-8"))
    except Exception as err:  # tokenizers raises plain Exception for a malformed file
        raise KfitError(f"{path} is not a tokenizer.json ({shown(str(err), 200)})") from None
    size = tok.get_vocab_size(with_added_tokens=True)
    if not fits(size, vocab_size):
        return None
    return Tokenizer(lambda text: tok.encode(text, add_special_tokens=False).ids,
                     lambda ids: tok.decode(ids, skip_special_tokens=False), f"tokenizer {path}", size)


def tokenizer_for(vocab_size: int, own: tuple[Path, ...] = (), data_dir: Path | None = None,
                  log=lambda line: print(line, file=sys.stderr)) -> Tokenizer:
    """The tokenizer of a run's vocabulary: its own tokenizer.json (the first of the directories `own` holding
    one), else its corpus's in `data_dir` (lib/data/run_tokenizer.py), else bytes or GPT-2's BPE by size."""
    from .data.run_tokenizer import TOKENIZER_FILE, choose_tokenizer

    chosen = choose_tokenizer(list(own), data_dir)
    found = hf_tokenizer(chosen.path, vocab_size, chosen.data) if chosen is not None else None
    if chosen is not None and chosen.own and found is None:
        raise KfitError(f"{chosen.path} is not this model's tokenizer: its vocabulary is not the model's "
                        f"{vocab_size} tokens")
    if found is not None:
        if chosen.warning:
            log(chosen.warning)
        return found
    candidates = [Path(d) / TOKENIZER_FILE for d in own] + ([Path(data_dir) / TOKENIZER_FILE] if data_dir else [])
    if fits(BYTE_VOCAB, vocab_size):
        return Tokenizer(lambda text: list(text.encode("utf-8")),
                         lambda ids: bytes(ids).decode("utf-8", errors="replace"), "bytes (UTF-8)", BYTE_VOCAB)
    if fits(GPT2_BPE_VOCAB, vocab_size):
        try:
            import tiktoken
        except ImportError:
            raise KfitError("this run's vocabulary is GPT-2's BPE (50257 tokens): sampling needs its tokenizer; "
                            "pip install tiktoken") from None
        enc = tiktoken.get_encoding("gpt2")
        return Tokenizer(lambda text: enc.encode(text, allowed_special={"<|endoftext|>"}), enc.decode, "tiktoken gpt2",
                         GPT2_BPE_VOCAB)
    looked = f" (looked for one of that size at {', '.join(map(str, candidates))})" if candidates else ""
    raise KfitError(f"this run's vocabulary has {vocab_size} tokens, and kfit knows no tokenizer for it (256: bytes, "
                    f"50257: GPT-2's BPE, else the corpus's tokenizer.json{looked}): put the tokenizer.json "
                    "that made the corpus beside the run or its model.safetensors")


def load_run_model(run: Path) -> tuple[torch.nn.Module, dict]:
    """The trained model of a run directory, checkpoint or exported model.safetensors, with what it came from."""
    from . import config as kconfig
    from .export import checkpoint_of, load_exported, model_state, read_checkpoint

    run = Path(run)
    if run.suffix == ".safetensors":
        config_file = run.parent / "config"
        if not config_file.is_file():
            raise KfitError(f"{run}: no config beside it ({config_file}); sample from the run directory, or keep "
                            "the files make export wrote together")
        weights, config_text, step = load_exported(run), fileio.read_text(config_file), None
    else:
        try:
            path = checkpoint_of(run)
        except OSError as err:  # a name the OS refuses (too long, a loop of links, no permission)
            raise KfitError(f"RUN={run} cannot be read ({err.strerror or err})") from None
        meta = read_checkpoint(path)  # a file that is not a checkpoint (any pickle): one error naming it
        if not isinstance(meta.get("config"), str):
            raise KfitError(f"{path} is not a kfit checkpoint (it holds no config): name a run directory, a "
                            "checkpoint kfit wrote, or an exported model.safetensors")
        weights, config_text, step = model_state(path, meta), meta["config"], meta.get("step")
    wrong = [name for name, value in weights.items() if not isinstance(value, torch.Tensor)]
    if wrong:
        raise KfitError(f"{run}: its weight {wrong[0]} is a {type(weights[wrong[0]]).__name__}, not a tensor: not "
                        "a checkpoint kfit wrote")
    with tempfile.TemporaryDirectory(prefix="kfit-sample-") as tmp:
        (Path(tmp) / "config").write_text(config_text)
        config = kconfig.read_config(Path(tmp) / "config")
    model, about = _rebuild(run, config, weights)
    places = [run.parent if run.suffix == ".safetensors" or run.is_file() else run]
    if run.is_file() and run.suffix != ".safetensors":
        places.append(run.parent.parent)  # <run>/checkpoints/<file>.pt
    data_dir = Path(config.data_dir).expanduser() if config.dataset == "dir" and config.data_dir else None
    return model, {**about, "step": step, "tokenizers": (tuple(places), data_dir)}


def _rebuild(run: Path, config, weights: dict) -> tuple[torch.nn.Module, dict]:
    """The run's model with its weights loaded, and what it is."""
    from .models.registry import MODELS, label, preset_of

    spec = MODELS.get(config.model)
    if spec is None or spec.from_weights is None:
        samplers = " and ".join(name for name, m in MODELS.items() if m.from_weights is not None)
        raise KfitError(f"{run} is a {config.model} run: make sample generates text from {samplers} runs")
    preset = preset_of(config) or label(config)
    try:
        model, vocab, block = spec.from_weights(config, weights)
    except KeyError as err:
        raise KfitError(f"{run}: no {err.args[0]} in its weights: not a kfit {config.model} model") from None
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        raise KfitError(f"{run}: its weights do not fit the {preset} preset its config names "
                        f"({shown(' '.join(str(err).split()), 200)})") from None
    return model.eval(), {"model": config.model, "preset": preset, "vocab_size": vocab, "block_size": block}


@torch.no_grad()
def generate(model: torch.nn.Module, ids: list[int], *, max_tokens: int, temperature: float, top_k: int | None,
             block_size: int, generator: torch.Generator, device: torch.device,
             vocab_size: int | None = None) -> list[int]:
    """`max_tokens` new token ids after `ids`, below `vocab_size` (the tokenizer's: a padded model's extra
    rows are never picked)."""
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    for _ in range(max_tokens):
        logits = model(idx[:, -block_size:])[:, -1, :vocab_size].float()
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
           seed: int = 0, device: str | None = None,
           log=lambda line: print(line, file=sys.stderr)) -> tuple[str, dict]:
    """(generated text, what it came from): the run's model continuing `prompt`; `log` takes a warning line."""
    if temperature < 0:
        raise KfitError(f"TEMPERATURE={temperature}: must be 0 (greedy) or more")
    model, about = load_run_model(run)
    own, data_dir = about.pop("tokenizers")
    tok = tokenizer_for(about["vocab_size"], own, data_dir, log)
    ids = tok.encode(prompt) or [0 if tok.vocab_size != GPT2_BPE_VOCAB else GPT2_BPE_VOCAB - 1]
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(target)
    generator = torch.Generator().manual_seed(seed)
    new = generate(model, ids, max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                   block_size=about["block_size"], generator=generator, device=target, vocab_size=tok.vocab_size)
    return tok.decode(new), {**about, "tokenizer": tok.name, "device": str(target)}
