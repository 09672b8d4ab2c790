# --- the training loop's own cost (lib/trainer/) ----------------------------

.PHONY: bench-loop

bench-loop: $(ENV_STAMP) ## kfit's training loop vs a minimal hand-written one: samples/s and kfit's overhead
	$(Q)$(RUN_PY) $(call q,$(ROOT))/scripts/bench_loop.py
