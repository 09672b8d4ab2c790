# --- training throughput (lib/steptime/, lib/threads.py) --------------------

.PHONY: bench-throughput bench-steptime

bench-throughput: $(ENV_STAMP) ## Samples/s at the plan's micro-batch vs a sweep, predicted vs measured step time (LOAD=0|1|2 busy cores)
	$(Q)LOAD=$(LOAD) $(RUN_PY) $(call q,$(ROOT))/scripts/bench_throughput.py

bench-steptime: $(ENV_STAMP) ## Step time calibrated at one micro-batch, predicting another, on this CPU (goal: 10%)
	$(Q)$(RUN_PY) $(call q,$(ROOT))/scripts/bench_steptime.py
