"""float8 training through torchao: a model's linear layers converted to compute their matrix multiplies in
float8 (`convert_to_float8_training`), with torchao's tensorwise or rowwise recipe.

Which layers: every nn.Linear whose two dimensions are multiples of 16 (float8 tensor cores need them), but
the output layer (the vocabulary's logits, whose precision the loss feels most; torchtitan leaves it too) and
any layer whose weight another module shares. Under FSDP the tensorwise recipe all-gathers the parameters in
float8. The state dict keeps nn.Linear's names and shapes, so checkpoints, export and INIT_FROM are as without.
torchao is imported only here, when a plan trains in float8 (lib/planning/decisions.py decides where it can).
"""

from __future__ import annotations

import dataclasses

import torch

RECIPES = ("tensorwise", "rowwise")
ALIGNMENT = 16  # float8 matrix multiplies need both dimensions a multiple of 16


def eligible(model: torch.nn.Module) -> set[str]:
    """The names of the linear layers float8 converts (see the module's docstring)."""
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    counts: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    last = linears[-1][0] if linears else None
    return {name for name, m in linears
            if name != last and m.in_features % ALIGNMENT == 0 and m.out_features % ALIGNMENT == 0
            and counts.get(id(m.weight), 0) == 1}


def convert(model: torch.nn.Module, recipe: str, *, sharded: bool = False) -> int:
    """Convert `model`'s eligible linear layers in place (before sharding and compile); how many were."""
    if recipe not in RECIPES:
        raise ValueError(f"float8 recipe {recipe!r}: choose one of {', '.join(RECIPES)}")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    if sharded and recipe == "tensorwise":  # the only recipe whose scales allow a float8 all-gather
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    names = eligible(model)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda module, fqn: fqn in names)
    return len(names)
