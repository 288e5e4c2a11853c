"""An ``Annotation`` as the policies read it: the shared ``SysAnnotations`` value.

The gRPC adapter puts it on the wire (``clairvoyant.core.wire``); the simulator hands it to the
scheduler's core as it is.
"""

from __future__ import annotations

from clairvoyant.core.annotations import Confidence, LengthInterval, NextAgent, ProjectedCalls, SysAnnotations
from clairvoyant.profiler.core.confidence import Tier
from clairvoyant.profiler.core.profile_types import Annotation

CONFIDENCE: dict[Tier, Confidence] = {
    Tier.NONE: Confidence.NONE,
    Tier.SHADOW: Confidence.SHADOW,
    Tier.LOW: Confidence.LOW,
    Tier.HIGH: Confidence.HIGH,
}


def sys_annotations(annotation: Annotation) -> SysAnnotations:
    p50, p99 = annotation.output_len_p50, annotation.output_len_p99
    return SysAnnotations(
        confidence=CONFIDENCE[annotation.confidence],
        predicted_output_len=LengthInterval(p50, p99) if p50 is not None and p99 is not None else None,
        predicted_path_regex=annotation.path_expression,
        expected_remaining_steps=annotation.expected_remaining_steps,
        expected_remaining_time_s=annotation.expected_remaining_time_s,
        next_agents=tuple(NextAgent(agent_id, probability) for agent_id, probability in annotation.next_agents),
        prompt_composition=annotation.next_prompt_template,
        kairos_rank=float(annotation.kairos_rank) if annotation.kairos_rank is not None else None,
        projection=tuple(
            ProjectedCalls(step, agent_id, expected_calls)
            for step, calls in enumerate(annotation.projection, start=1)
            for agent_id, expected_calls in calls
        ),
        remaining_gittins_index=annotation.remaining_gittins_index,
    )
