"""The reaction rules shipped in the examples (the defaults) match alerts pdscale generates."""

from __future__ import annotations

import re

from alerts import alert_defs
from pdscale.spec import ReactionAction, ReactionSettings, Spec


def test_examples_spell_out_the_default_reactions(example: tuple[str, Spec]) -> None:
    _, spec = example
    assert spec.reactions == ReactionSettings()


def test_every_reaction_rule_matches_a_generated_critical_alert(example: tuple[str, Spec]
                                                                ) -> None:
    _, spec = example
    names = {d.name for d in alert_defs(spec)}
    for rule in spec.reactions.rules:
        pattern = rule.match_re.get("alertname")
        wanted = rule.match.get("alertname")
        matched = {n for n in names if (wanted is None or n == wanted)
                   and (pattern is None or re.fullmatch(pattern, n))}
        assert matched, f"{rule.action.value} rule matches no generated alert"
    acted = {n for n in names for rule in spec.reactions.rules
             if rule.action is not ReactionAction.NOTIFY_ONLY
             and re.fullmatch(rule.match_re.get("alertname", ".*"), n)
             and rule.match.get("alertname", n) == n}
    # The latency, queue and hardware alerts all have a reaction.
    assert {"LLMTimeToFirstTokenHigh", "LLMInterTokenLatencyHigh", "LLMQueueBacklogHigh",
            "LLMGPUXidError"} <= acted
