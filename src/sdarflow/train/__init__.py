"""Training: the RL update (GRPO + the method's auxiliary loss) with interleaved SFT steps, the SFT warm start,
engines (torch, DeepSpeed), schedules, atomic checkpoints and resume, multi-GPU launch, and the training report.

Modules: ``trainer`` (the loop), ``engine``, ``schedule``, ``checkpoint``, ``launch``, ``sft``, ``report``,
``warmstart`` (the demo base model), ``presets`` (the reference scripts' per-environment settings).
"""
