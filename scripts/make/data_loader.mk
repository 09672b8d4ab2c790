# --- data loader throughput (lib/trainer/windows.py, CONFIG_DATA_PREFETCH_FACTOR) ----------

.PHONY: bench-data

bench-data: $(ENV_STAMP) ## Data loader batches/s across worker counts and prefetch depths (variables: WORKERS, PREFETCH, BATCH, BATCHES, ROUNDS)
	$(Q)$(RUN_PY) $(call q,$(ROOT))/scripts/bench_data.py
