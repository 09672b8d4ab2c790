# SLURM batch scripts from the plan (lib/cli/sbatch.py, lib/templates/sbatch.sh.j2).
# Command-line variables (NODES=, GPUS=, CPUS=, PARTITION=, TIME=, ACCOUNT=, ARRAY=, OUT=, and GPU=/HW= for the
# cluster's nodes) reach kfit as environment.
KFIT_TARGETS += sbatch
help-sbatch := SLURM batch script from the plan, requeued with resume (NODES=n GPUS=n TIME= PARTITION= ACCOUNT= OUT=; ARRAY=n: HPO workers)
