"""Training: the RL update (GRPO + the method's auxiliary loss) with interleaved SFT steps, the SFT warm start,
engines (torch, DeepSpeed), schedules, atomic checkpoints and resume, multi-GPU launch, and the training report.

Modules: ``trainer`` (the loop), ``engine``, ``schedule``, ``checkpoint``, ``launch``, ``sft``, ``report`` (the
run's records, report and published artifact), ``warmstart`` (the demo base model), ``rl_setup`` (an RL round's
inputs, with the reference scripts' per-environment presets).
"""
