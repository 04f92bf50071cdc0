"""Training the shipped tiny pair: corpus (stdlib sources), BPE tokenizer, target, EAGLE heads.

`python -m nwor_lab.train corpus --out runs/corpus`, then
`python -m nwor_lab.train pair --data runs/corpus --out DIR --device cuda` (target + EAGLE-1) and
`python -m nwor_lab.train eagle3 --data runs/corpus --out DIR --device cuda` (EAGLE-3 for a trained
target); see TRAINING.md of `nwor_lab/checkpoints/tiny` for the exact commands and results.
"""
