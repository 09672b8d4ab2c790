# --- monitoring ------------------------------------------------------------

.PHONY: bench-monitor

bench-monitor: $(ENV_STAMP) ## Measure the live monitor's cost per training step (STEPS=, REPEATS=, BATCH=)
	$(Q)$(RUN_PY) $(call q,$(ROOT))/scripts/bench_monitor.py
