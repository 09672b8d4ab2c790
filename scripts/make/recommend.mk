# Recommended configurations (lib/recommend.py, seed 002).
.PHONY: recommend

recommend: $(ENV_STAMP) ## Three configurations for this machine: conservative, balanced, extreme (GPU=, GPUS=, HW=, WRITE=1 [OUT=dir], OUT=page.html, FORMAT=json)
	$(Q)$(KFIT) recommend
