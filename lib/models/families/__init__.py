"""Model families kept in one file each.

A file here (any `*.py` not starting with `_`) is a whole family: the rest of kfit finds it with nothing
written elsewhere. It holds two module-level names:

- `KCONFIG`: a string of Kconfig entries, which the config layer reads from the file's syntax tree (it
  imports no model code) and adds to the Model menu of kconfigs/Kconfig.model. They reopen the model choice
  with the family's member, `choice MODEL` / `config MODEL_<NAME>` / `endchoice`, and declare the family's
  own options under `if MODEL_<NAME>`; code reads those as `config.options.<name>` (lib/config/options.py).
- `FAMILY`: its `ModelSpec` (lib/models/registry.py), named as the member's suffix in lower case: the
  builder, its data and what the planner, the trainer, `make sample` and the trace caches need of it (its
  `shape_key` is its part of every cache key). The registry imports the file when it is imported.

Import torch inside the builder, not at the top of the file, so that reading the registry stays cheap.
`tests/test_families.py` adds a family this way and plans, trains, samples and caches it.
"""
