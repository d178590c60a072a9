"""Research options beyond SDAR (docs/training.md, "Beyond SDAR"), kept out of the core so the trainer reads as one
recipe. All are off by default, and none has measured better than GRPO yet.

Each plugs into a named extension point of the core, the way env suites do (the core names the built-in ones as
``"module:function"`` strings and imports them on first use):

- credit assigners, ``train --credit`` (:data:`sdarflow.train.samples.CREDIT_ASSIGNERS`): ``scpo``
  (:mod:`.credit`);
- token advantages, ``train --advantage`` (:data:`sdarflow.train.samples.TOKEN_ADVANTAGES`): ``progress``
  (:mod:`.progress`);
- row filters, ``train --filter`` (:data:`sdarflow.train.samples.ROW_FILTERS`): ``negative-value``
  (:mod:`.filters`), on the group's Monte-Carlo value or a learned value head (FORCE, :mod:`.value_head`);
- teacher weights, ``rescore --teacher`` (:data:`sdarflow.teacher.TEACHER_WEIGHTS`): ``ema`` (:mod:`.ema`, whose
  moving average train updates after every step with ``--ema-decay``);
- skill retrieval strategies, ``rescore --retrieval`` (:data:`sdarflow.skills.retrieve.STRATEGIES`): ``ucb``
  (:mod:`.skill_bandit`, whose statistics ``extract-skills --rescored`` updates);
- turn rewards, ``rescore --ppl-delta`` + ``train --reward perplexity-delta`` (:mod:`.ppl_delta`);
- training hooks: the format probe inside a round (``train --format-probe-every``, :mod:`.format_probe`) and the
  format guard's remedy, SFT on the malformed turns an env's repair mends (``train --format-guard repair``,
  :mod:`.format_repair`).

:mod:`.train_round` holds the train stage's per-round calls into the EMA, the value head, the probe and the repair;
:mod:`.options` holds their train flags (``TrainOptions``, which the train stage's config extends) and the
options by name for a study row or the pipeline's ``options`` parameter (``grpo+scpo``).
"""
