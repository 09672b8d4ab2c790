"""The train subcommand."""

from __future__ import annotations

import sys

from kfit_env import ensure_config, hardware_from_env, plan_for
from lib.errors import KfitError


def cmd_train(args) -> int:
    from lib.hyperparams import compile_line, summary_line
    from lib.trainer import train

    from lib.hyperparams import world_size_from_env

    hardware = hardware_from_env(allow_simulated=False)
    if world_size_from_env() > 1:
        raise KfitError(f"WORLD_SIZE={world_size_from_env()}: this version trains in one process; multi-process "
                        "training (torchrun, DDP) is not built yet. Unset WORLD_SIZE; 'make plan WORLD_SIZE=N' "
                        "shows what N processes would run.")
    config = ensure_config()
    model, plan = plan_for(config, hardware)
    print(summary_line(plan, hardware, model))
    print(compile_line(plan))
    for note in plan.notes:
        print(f"Note: {note}")
    try:
        result = train(config, plan, hardware)
    except FloatingPointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    final = result.final_eval
    metric = (f"accuracy {final['accuracy']:.2%}" if "accuracy" in final else
              f"perplexity {final['perplexity']:.2f}" if "perplexity" in final else
              f"eval loss {final['eval_loss']:.4f}")
    print(f"Done: {result.steps} steps, {result.epochs:.1f} epochs in {result.seconds:.1f}s; {metric}; "
          f"run in {result.run_dir}")
    return 0



def register(sub) -> None:
    sub.add_parser("train", help="train as configured").set_defaults(func=cmd_train)
