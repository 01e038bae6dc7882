"""Pieces of examples/train_moe_lm.py: byte-level domain data and a tiny MoE transformer."""
