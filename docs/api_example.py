"""kfit from Python, without make: load a config, plan it for another machine and for this one, train it.

    python docs/api_example.py [OUTPUT_DIR]      (from a checkout; installed, `import kfit` is the same)

tests/test_api.py runs this file, so it stays true.
"""

import sys

try:
    import kfit  # installed: pip install <checkout>
except ImportError:  # a checkout: lib/ is the same package
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import lib as kfit


def main(output_dir: str = "runs") -> None:
    # A defconfig by name (or a path to a config file); strictly validated: a value that does not take is a
    # kfit ConfigError naming the symbol.
    config = kfit.load_config("lenet5")

    # Its plan for another machine: an H100 from kfit's catalog with 70 GiB free
    # (kfit plan --gpu h100 --free-gb 70), and for this one.
    for where, plan in (("an H100", kfit.resolve_plan(config, gpu="h100", free_gb=70)),
                        ("this machine", kfit.resolve_plan(config))):
        print(f"on {where}: {plan.device_type}, {plan.precision}, micro-batches {plan.split.text()}, "
              f"predicted peak {plan.predicted_peak_bytes / 2**20:.0f} MiB")

    # A short run here with kfit's loop (what `kfit train` does, in this process): the same defconfig with
    # a fragment merged on top (a few small CPU steps) and overrides, checked as strictly.
    smoke = kfit.load_config("lenet5", fragments=["cpu-smoke"], overrides={"MAX_STEPS": 2, "SEED": 7})
    result = kfit.train(smoke, output_dir=output_dir, log=lambda line: None)  # quiet: the result says it
    print(f"{smoke.source}: {result.steps} steps in {result.seconds:.1f}s, eval loss "
          f"{result.final_eval['eval_loss']:.3f}; run in {result.run_dir}")


if __name__ == "__main__":
    main(*sys.argv[1:])
