# --- monitoring ------------------------------------------------------------

.PHONY: bench-monitor

bench-monitor: $(ENV_STAMP) ## Measure the live monitor's cost per training step (STEPS=, REPEATS=, BATCH=)
	$(Q)$(PY) $(ROOT)/scripts/bench_monitor.py
