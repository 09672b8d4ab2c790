# --- data loader throughput (lib/trainer/windows.py, CONFIG_DATA_PREFETCH_FACTOR) ----------
SCRIPT_TARGETS += bench-data
help-bench-data := Data loader batches/s across worker counts and prefetch depths (variables: WORKERS, PREFETCH, BATCH, BATCHES, ROUNDS)
