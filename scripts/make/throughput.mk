# --- training throughput (lib/steptime/, lib/threads.py) --------------------

.PHONY: bench-throughput

bench-throughput: $(ENV_STAMP) ## Samples/s at the plan's micro-batch vs a sweep, predicted vs measured step time
	$(Q)$(RUN_PY) $(call q,$(ROOT))/scripts/bench_throughput.py
