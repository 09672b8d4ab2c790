# Planning targets (lib/planning/, lib/memory/, lib/steptime/, lib/report.py).
KFIT_TARGETS += plan-matrix plan-report
help-plan-matrix := Plan every defconfig on every catalog GPU and the CPU (FORMAT=json)
help-plan-report := Write the plan matrix and memory charts as HTML (OUT=plan-report.html, GPU=)

SCRIPT_TARGETS += bench-memory bench-plan
help-bench-memory := Predicted vs measured peak memory of real training steps (DEVICE=cpu|cuda)
help-bench-plan := Planner wall time (cold, cached) and tier vs planner batch per GPU

# The benchmark's own packages (requirements-bench.txt: Hugging Face transformers for its outside
# models), installed on first use and never a runtime dependency.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(ROOT)/requirements-bench.txt $(ENV_STAMP)
	@echo "Installing the benchmark's packages (requirements-bench.txt)" >&2
	$(Q)$(call q,$(VENV)/bin/pip) install -q -r $(call q,$(ROOT)/requirements-bench.txt) >&2
	$(Q)touch $(call q,$@)

bench-memory: $(BENCH_STAMP)
