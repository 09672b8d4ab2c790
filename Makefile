# kfit: Kconfig-driven training. 'make help' lists everything.
#
# Conventions follow the Linux kernel's Kconfig targets: menuconfig, oldconfig,
# olddefconfig, savedefconfig, listnewconfig, alldefconfig, allnoconfig,
# allyesconfig, randconfig (KCONFIG_SEED=), <name>-defconfig, <fragment>.config,
# KCONFIG_CONFIG to use a config file other than .config, and V=1 to show the
# commands make runs.

# Paths are anchored at this file, so 'make -f path/to/Makefile' works from any
# directory (the config, runs and defconfig then live in that directory).
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
PYTHON ?= python3
VENV ?= $(ROOT)/.venv
PY := $(VENV)/bin/python
ENV_STAMP := $(VENV)/.installed
KCONFIG_CONFIG ?= .config
# Test workers (pytest-xdist; a test file stays on one worker): 2 halve the suite's time on 2 cores; 0 runs serially.
PYTEST_JOBS ?= 2
export KCONFIG_CONFIG

# No variable's value is ever part of a shell command: kfit reads the variables from its environment, and make's
# command-line ones also from KFIT_OVERRIDES, make's own escaped list of them, each value exactly as typed (so a
# quote, a backquote or $$(...) in FRAGMENTS= or PROMPT= is text, never a command). A Kconfig symbol set on the
# command line (make train, EPOCHS set to 2) overrides it for that command (docs/configuration.md). The paths make
# itself runs (VENV, PYTHON, the checkout) go through q, a single-quoted shell word; a line break in one is
# refused, since make would cut the command there.
q = '$(subst ','\'',$(1))'
define newline


endef
$(foreach v,VENV PYTHON ROOT KCONFIG_CONFIG PYTEST_JOBS,$(if $(findstring $(newline),$(value $(v))),\
  $(shell printf '%s\n' 'error: $(v)= holds a line break: give it on one line' >&2)$(error refused)))
export KFIT_OVERRIDES = $(MAKEOVERRIDES)
KFIT := $(call q,$(PY)) $(call q,$(ROOT)/scripts/kfit.py)
RUN_PY := $(call q,$(PY))

# Recipe lines start with $(Q): quiet unless V=1 on the command line, as in the kernel. help and the
# benchmark's install note keep '@': they only print text, which V=1 would show twice.
ifeq ("$(origin V)", "command line")
  KFIT_VERBOSE := $(V)
endif
ifeq ($(KFIT_VERBOSE),1)
  Q :=
else
  Q := @
endif

DEFCONFIGS := $(sort $(notdir $(filter-out $(ROOT)/defconfigs/fragments,$(wildcard $(ROOT)/defconfigs/*))))
FRAGMENT_NAMES := $(sort $(notdir $(wildcard $(ROOT)/defconfigs/fragments/*)))
DEFAULT_DEFCONFIG := lenet5

.DEFAULT_GOAL := help
.PHONY: FORCE help version env defconfig test check clean mrproper distclean

# The environment is built on first use and rebuilt when the requirements change, or when a package it needs is
# gone although the stamp is there (a glob per package: no Python starts on every make); install-deps.sh then
# checks the imports, and kfit says 'make env' in one line where one is still missing.
ENV_MODULES := kconfiglib.py torch safetensors optuna sqlalchemy numpy psutil jinja2 tqdm pynvml.py torchmetrics torchao \
  pytest xdist hypothesis __editable__.kfit-*.pth
ENV_MISSING := $(strip $(if $(wildcard $(ENV_STAMP)),$(foreach m,$(ENV_MODULES),\
  $(if $(wildcard $(VENV)/lib/python*/site-packages/$(m)),,$(m)))))
$(ENV_STAMP): $(addprefix $(ROOT)/,requirements.txt requirements-test.txt scripts/install-deps.sh) $(if $(ENV_MISSING),FORCE)
	$(if $(ENV_MISSING),@echo $(call q,note: $(VENV) lacks $(ENV_MISSING): installing again) >&2)
	$(Q)cd $(call q,$(ROOT)) && scripts/install-deps.sh $(call q,$(VENV)) $(call q,$(PYTHON))

help-env := Create .venv and install the dependencies (done automatically)
env: $(ENV_STAMP)

# --- configuration -------------------------------------------------------

# Targets that only run `kfit <target>` (KFIT_TARGETS) or `scripts/<target>.py` with '-' as '_' (SCRIPT_TARGETS)
# are one rule over each list, below the areas' fragments, as the kernel's simple targets are; each area adds its
# own to the lists in scripts/make/<area>.mk, and every target's line in 'make help' is its help-<target>.
KFIT_TARGETS := menuconfig oldconfig olddefconfig savedefconfig listnewconfig alldefconfig allnoconfig allyesconfig \
  randconfig
help-menuconfig := Edit a copy of the config in a terminal menu; kept only if valid
help-oldconfig := Ask only for symbols the config does not set (defaults without a terminal)
help-olddefconfig := Validate the config and fill new symbols with defaults
help-savedefconfig := Write the minimal config to ./defconfig
help-listnewconfig := List symbols the config does not set yet
help-alldefconfig := Write the config with every symbol at its default
help-allnoconfig := Write the config with as many options n as allowed
help-allyesconfig := Write the config with as many options y as allowed
help-randconfig := Write a random valid config (KCONFIG_SEED=n to repeat one; the seed is printed)

help-defconfig := Apply the default defconfig (lenet5)
defconfig: $(DEFAULT_DEFCONFIG)-defconfig

# FRAGMENTS="a b" merges defconfigs/fragments/a and b on top; every value must take.
# FORCE: pattern rules cannot be .PHONY, and a file named like the target must not stop them.
# FRAGMENTS reaches kfit as environment (see q above), never as part of the command.
%-defconfig: FORCE $(ENV_STAMP)
	$(Q)$(KFIT) defconfig $(call q,$*)

defconfig-%: FORCE $(ENV_STAMP)
	$(Q)$(KFIT) defconfig $(call q,$*)

# make fp32.config: merge defconfigs/fragments/fp32 onto the current config, as the kernel's
# 'make kvm_guest.config' (the stem is never empty, so the config file .config itself never matches).
%.config: FORCE $(ENV_STAMP)
	$(Q)$(KFIT) mergeconfig $(call q,$*)

# --- planning and training -----------------------------------------------

KFIT_TARGETS += plan check-hardware train export report sample
help-plan := Show the resolved plan (FORMAT=json, HW=, GPU=, FREE_GB=, GPUS=, WORLD_SIZE=)
help-check-hardware := Report this machine (or HW=/GPU=) and the plan for the config
help-train := Train as configured (default defconfig without a config; RESUME_FROM=<run> INIT_FROM=<weights> EXTEND_EPOCHS=N)
help-export := One model.safetensors from a run, sharded or not (RUN=<run dir or checkpoint>, default the last run; OUT=dir)
help-report := One HTML page of a run: curves against the plan's predictions, events (RUN=, default the last run; OUT=)
help-sample := Text from a trained GPT-2 or Llama run (RUN=, default the last one; PROMPT= MAX_TOKENS= TEMPERATURE= TOP_K= SEED=)

# Two tiers, as larger projects keep them: 'make test' runs every test not marked slow (minutes: run it on every
# change; CI runs it), 'make check' runs them all (the end-to-end torchrun, FSDP, SLURM, PostgreSQL and make
# runs too). PYTEST_ARGS reaches pytest through PYTEST_ADDOPTS after the tier's -m, so -m slow in PYTEST_ARGS with
# 'make check' runs only the slow tier; pytest splits it as a shell would but runs nothing. The suite's own kfit
# commands see none of this make's command line.
test: TEST_TIER := -m 'not slow'
check: TEST_TIER :=
test check: export PYTEST_ADDOPTS += $(TEST_TIER) $(PYTEST_ARGS)
test check: export KFIT_OVERRIDES :=
check: export KFIT_TIER := check
help-test := Run the quick tier of the tests: all but those marked slow (installs chromium for the HTML checks)
test:
help-check := Run every test, the slow end-to-end runs too (before pushing a change they cover)
check:
test check: $(ENV_STAMP)
	$(Q)$(call q,$(ROOT)/scripts/ensure-chromium.sh)
	$(Q)cd $(call q,$(ROOT)) && $(RUN_PY) -m pytest -q -n $(call q,$(PYTEST_JOBS)) --dist loadfile --no-loadscope-reorder

# Each area adds its targets to KFIT_TARGETS / SCRIPT_TARGETS (with their help-<target>) in scripts/make/<area>.mk.
SCRIPT_TARGETS :=
CORE_TARGETS := $(KFIT_TARGETS)
include $(sort $(wildcard $(ROOT)/scripts/make/*.mk))
AREA_TARGETS := $(filter-out $(CORE_TARGETS),$(KFIT_TARGETS)) $(SCRIPT_TARGETS)

.PHONY: $(KFIT_TARGETS) $(SCRIPT_TARGETS)
$(KFIT_TARGETS): $(ENV_STAMP)
	$(Q)$(KFIT) $@

$(SCRIPT_TARGETS): $(ENV_STAMP)
	$(Q)$(RUN_PY) $(call q,$(ROOT)/scripts/$(subst -,_,$@).py)

# --- cleaning --------------------------------------------------------------

help-clean := Remove runs and caches (keeps the config and the environment)
clean:
	rm -rf runs $(call q,$(ROOT)/.pytest_cache)
	find $(call q,$(ROOT)) -path $(call q,$(VENV)) -prune -o -name __pycache__ -type d -exec rm -rf {} +

help-mrproper := Also remove the config files (KCONFIG_CONFIG, its .old, menuconfig's copy, ./defconfig)
mrproper: clean
	rm -f $(foreach f,$(value KCONFIG_CONFIG) $(value KCONFIG_CONFIG).old $(value KCONFIG_CONFIG).menuconfig,$(call q,$(f))) defconfig

help-distclean := Also remove the virtual environment
distclean: mrproper
	rm -rf $(call q,$(VENV))

FORCE:

help-version := Print kfit's, Python's and torch's versions and this machine's device
version: $(ENV_STAMP)
	$(Q)$(KFIT) --version

help-help := List targets, defconfigs and fragments
# Every target with a help-<target>, in the order of the sections above and then the areas'
HELP_TARGETS = env $(CORE_TARGETS) defconfig test check $(AREA_TARGETS) clean mrproper distclean version help
help:
	@echo "kfit: Kconfig-driven training"
	@echo
	@echo "Targets:"
	@{ $(foreach t,$(HELP_TARGETS),printf '  %s\t%s\n' $(call q,$(t)) $(call q,$(help-$(t)));) } | expand -t 20
	@echo "  <name>-defconfig  Write the config from defconfigs/<name> (also defconfig-<name>)"
	@echo "  <fragment>.config Merge defconfigs/fragments/<fragment> onto the current config"
	@echo
	@echo "Defconfigs (make <name>-defconfig):"
	@$(foreach d,$(DEFCONFIGS),echo $(call q,  $(d));)
	@echo
	@echo "Fragments (make <name>-defconfig FRAGMENTS=\"a b\", or make <fragment>.config):"
	@$(foreach f,$(FRAGMENT_NAMES),echo $(call q,  $(f));)
	@echo
	@echo "Variables: KCONFIG_CONFIG=file  FRAGMENTS=\"a b\"  KCONFIG_SEED=n  V=1  FORMAT=json  TORCH_SPEC=\"torch==... --index-url ...\""
	@echo "  plan:    HW=profile.json  GPU=<catalog key> FREE_GB=n GPUS=n  WORLD_SIZE=n  OUT=report.html"
	@echo "  train:   GPUS=n (processes)  NNODES=n NODE_RANK=i MASTER_ADDR=host MASTER_PORT=p  RESUME=0"
	@echo "  tuning:  RUNS=n BATCH=n APPLY=1 (find-lr)  TRIALS=n HPO_STORAGE=url HPO_STUDY=name DEFCONFIG=name (hpo)"
