"""Training: the RL update (GRPO + the method's auxiliary loss) on LoRA, and the SFT warm start."""
