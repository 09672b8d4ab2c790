# Planning targets (lib/planning/, lib/memory/, lib/steptime/, lib/report.py).
.PHONY: plan-matrix plan-report bench-memory bench-plan

plan-matrix: $(ENV_STAMP) ## Plan every defconfig on every catalog GPU and the CPU (FORMAT=json)
	$(Q)$(KFIT) plan-matrix

plan-report: $(ENV_STAMP) ## Write the plan matrix and memory charts as HTML (OUT=plan-report.html, GPU=)
	$(Q)$(KFIT) plan-report

# The benchmark's own packages (requirements-bench.txt: Hugging Face transformers for its outside
# models), installed on first use and never a runtime dependency.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(ROOT)/requirements-bench.txt $(ENV_STAMP)
	@echo "Installing the benchmark's packages (requirements-bench.txt)" >&2
	$(Q)$(call q,$(VENV)/bin/pip) install -q -r $(call q,$(ROOT)/requirements-bench.txt) >&2
	$(Q)touch $(call q,$@)

bench-memory: $(ENV_STAMP) $(BENCH_STAMP) ## Predicted vs measured peak memory of real training steps (DEVICE=cpu|cuda)
	$(Q)$(RUN_PY) $(call q,$(ROOT))/scripts/bench_memory.py

bench-plan: $(ENV_STAMP) ## Planner wall time (cold, cached) and tier vs planner batch per GPU
	$(Q)$(RUN_PY) $(call q,$(ROOT))/scripts/bench_plan.py
