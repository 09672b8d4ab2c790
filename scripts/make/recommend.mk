# Recommended configurations (lib/recommend.py).
KFIT_TARGETS += recommend
help-recommend := Three configurations for this machine: conservative, balanced, extreme (GPU=, GPUS=, HW=, WRITE=1 [OUT=dir], OUT=page.html, FORMAT=json)
