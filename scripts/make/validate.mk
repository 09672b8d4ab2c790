# Validation on a real GPU (lib/validation/, scripts/validate_gpu.py; docs/validation/README.md).
# DEVICE=, OUT=, QUICK= and CHECKS= reach the script as environment.
SCRIPT_TARGETS += validate-gpu
help-validate-gpu := Check kfit against this GPU, write docs/validation/<gpu>-<date>.json (DEVICE=cpu OUT= QUICK=1 CHECKS=memory,fsdp)
