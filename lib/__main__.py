"""`python -m kfit`: the kfit command line. Also the file torchrun starts in each rank when kfit runs from an
installed package (`.../kfit/__main__.py train`)."""

import sys

if __package__:
    from .cli import main
else:  # run as a file: this folder is sys.path[0], and its modules (config, plan, ...) must not shadow others
    from pathlib import Path

    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    from kfit.cli import main

sys.exit(main())
