# --- training throughput (lib/steptime/, lib/threads.py); LOAD= reaches the script as environment --------
SCRIPT_TARGETS += bench-throughput bench-steptime
help-bench-throughput := Samples/s at the plan's micro-batch vs a sweep, predicted vs measured step time (LOAD=0|1|2 busy cores)
help-bench-steptime := Step time calibrated at one micro-batch, predicting another, on this CPU (goal: 10%)
