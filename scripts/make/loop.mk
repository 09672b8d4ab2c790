# --- the training loop's own cost (lib/trainer/) ----------------------------
SCRIPT_TARGETS += bench-loop
help-bench-loop := kfit's training loop vs a minimal hand-written one: samples/s and kfit's overhead
