"""Skill libraries: the privileged context of SDAR's teacher. Format and version (``library``), rule-based
extraction, evidence and merging (``extract``), LLM-written skills (``llm``), and retrieval strategies
(``retrieve``; the ``ucb`` bandit is ``sdarflow.extensions.skill_bandit``)."""
