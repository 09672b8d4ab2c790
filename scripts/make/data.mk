# Data: a corpus tokenized into train.bin / val.bin / meta.json / tokenizer.json (lib/data/tokenized.py).
# Command-line variables (CORPUS=, TOKENIZER=, VOCAB=, OUT=) reach kfit as environment.
KFIT_TARGETS += data
help-data := Tokenize a corpus for training (CORPUS=file|dir|glob TOKENIZER=json VOCAB=4096 OUT=data/<name>)
