"""Skill libraries: the privileged context of SDAR's teacher. Format and version (``library``), rule-based
extraction, evidence and merging (``extract``), LLM-written skills (``llm``), retrieval strategies and the ucb
strategy's statistics (``retrieve``)."""
