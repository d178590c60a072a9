"""Skill libraries: the privileged context of SDAR's teacher. Format, extraction from trajectories, retrieval."""

from sdarflow.skills.library import Skill, SkillLibrary

__all__ = ["Skill", "SkillLibrary"]
