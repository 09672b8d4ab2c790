# --- monitoring ------------------------------------------------------------
SCRIPT_TARGETS += bench-monitor
help-bench-monitor := Measure the live monitor's cost per training step (STEPS=, REPEATS=, BATCH=)
