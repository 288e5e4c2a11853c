"""The projection annotation: expected calls per agent in each coming step (Pythia Alg. 4's
ProjectGraph), from the path model to the profile's Annotation, SysAnnotations and the wire."""

from __future__ import annotations

import numpy as np
import pytest

from clairvoyant.contracts.v1 import common_pb2, profiler_pb2
from clairvoyant.core.annotations import ProjectedCalls
from clairvoyant.profiler import convert
from clairvoyant.profiler.config import ProfilerSettings
from clairvoyant.profiler.core import PathModel, parse, project, project_steps
from clairvoyant.profiler.core.confidence import ConfidenceConfig, Tier
from clairvoyant.profiler.core.profile import WorkflowProfile
from clairvoyant.profiler.core.profile_types import Annotation, CallRecord, ProfileConfig
from clairvoyant.profiler.core.store import ProfileStore
from clairvoyant.profiler.core.sys_annotations import sys_annotations
from clairvoyant.profiler.core.trace import Step
from clairvoyant.profiler.grpc_api import ProfilerServicer
from tests.profiler.generators import S, timed_calls

pytestmark = pytest.mark.unit

EXPRESSIONS = [
    ("planner -> <explorer>{3,4} -> (engineer){1,2} -> (reviewer | verifier)", ["planner"]),
    ("a -> (b){2,4} -> c -> $", ["a", "b"]),
    ("(a -> (b)?){2,3} -> <c | d>{1,3} -> $", ["a"]),
    ("(a | b -> $){1,3} -> c", []),
]


# ---- the path model ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "prefix"), EXPRESSIONS)
@pytest.mark.parametrize("horizon", [0, 1, 3, 12])
def test_project_is_the_sum_of_project_steps(text: str, prefix: list[str], horizon: int) -> None:
    model = PathModel(parse(text))
    position = model.position(prefix)
    steps = model.project_steps(position, horizon)
    assert len(steps) == horizon
    summed: dict[str, float] = {}
    for step in steps:
        for agent, calls in step.items():
            summed[agent] = summed.get(agent, 0.0) + calls
    assert model.project(position, horizon) == pytest.approx(summed)
    assert list(model.project(position, horizon)) == sorted(summed, key=lambda a: (-summed[a], a))
    # Asked again (from the per-state cache), the answer is the same.
    assert model.project_steps(position, horizon) == steps


def test_a_fixed_fan_out_projects_ten_explorers_in_the_next_step() -> None:
    expr = parse("planner -> <explorer>{10} -> (engineer | reviewer) -> $")
    assert project_steps(expr, ["planner"], 4) == [
        {"explorer": 10.0},
        pytest.approx({"engineer": 0.5, "reviewer": 0.5}),
        {},
        {},
    ]
    assert project(expr, ["planner"], 4) == pytest.approx(
        {"explorer": 10.0, "engineer": 0.5, "reviewer": 0.5}
    )
    # From the start the planner's own step comes first.
    assert project_steps(expr, [], 2) == [{"planner": 1.0}, {"explorer": 10.0}]


def test_an_ambiguous_position_weights_each_reading() -> None:
    """After one ``a`` of ``(a){1,2} -> b``: half the mass repeats ``a``, half goes on to ``b``."""
    model = PathModel(parse("(a){1,2} -> b -> $"))
    position = model.position(["a"])
    assert model.project_steps(position, 3) == [
        pytest.approx({"a": 0.5, "b": 0.5}),
        pytest.approx({"b": 0.5}),
        {},
    ]


# ---- the profile's annotation --------------------------------------------------------------------


def fan_out_of_ten(rng: np.random.Generator) -> list[Step]:
    return [S("planner"), S(*["explorer"] * 10), S("engineer")]


def trained(projection_steps: int = 8, instances: int = 40) -> WorkflowProfile:
    """A profile of ``planner -> <explorer>{10} -> engineer`` past the shadow tier."""
    config = ProfileConfig(projection_steps=projection_steps, confidence=ConfidenceConfig(min_instances=5))
    profile = WorkflowProfile("acme", "fan", config)
    rng = np.random.default_rng(3)
    for i in range(instances):
        calls = timed_calls(f"w{i}", fan_out_of_ten(rng), rng, start=i * 1000.0)
        for j, c in enumerate(calls):
            profile.ingest(
                CallRecord(
                    c.request_id,
                    f"w{i}",
                    c.agent_id,
                    c.start,
                    c.end,
                    c.prompt_tokens,
                    c.output_tokens,
                    workflow_end=j == len(calls) - 1,
                )  # fmt: skip
            )
    return profile


def test_the_annotation_carries_the_projection_of_the_requests_position() -> None:
    profile = trained()
    assert profile.confidence.tier in (Tier.LOW, Tier.HIGH)
    assert profile.expression.startswith("planner -> <explorer>{10}")
    annotation = profile.annotate("planner")
    assert len(annotation.projection) == 8  # CV_PROFILER_PROJECTION_STEPS' default
    assert annotation.projection[0] == (("explorer", 10.0),)
    assert annotation.projection[1] == (("engineer", 1.0),)
    assert all(step == () for step in annotation.projection[2:])
    # The same numbers as the model's, from the same position.
    predicted = profile.predict("planner")
    assert predicted is not None and profile.model is not None
    expected = profile.model.project_steps(predicted.position, 8)
    assert [dict(step) for step in annotation.projection] == [step for step in expected]
    # Further along, the projection moves on.
    at_explorer = profile.annotate("explorer", history=["planner"])
    assert at_explorer.projection[0] == (("engineer", 1.0),) and at_explorer.projection[1] == ()

    sys = sys_annotations(annotation)
    assert sys.projection == (ProjectedCalls(1, "explorer", 10.0), ProjectedCalls(2, "engineer", 1.0))
    wire = convert.sys_annotations(annotation)
    assert [(p.step, p.agent_id, p.expected_calls) for p in wire.projection] == [
        (1, "explorer", 10.0),
        (2, "engineer", 1.0),
    ]


def test_the_projection_setting_bounds_the_steps() -> None:
    settings = ProfilerSettings(profiler_projection_steps=1)
    assert settings.profile_config().projection_steps == 1
    assert ProfilerSettings().profile_config().projection_steps == 8
    assert trained(settings.profile_config().projection_steps).annotate("planner").projection == (
        (("explorer", 10.0),),
    )
    assert trained(projection_steps=0).annotate("planner").projection == ()


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CV_PROFILER_PROJECTION_STEPS", "3")
    assert ProfilerSettings().profile_config().projection_steps == 3


def test_no_projection_in_the_none_and_shadow_tiers() -> None:
    store = ProfileStore()
    none = store.annotate("acme", "never-seen", "planner")
    assert none.confidence is Tier.NONE and none.projection == ()
    shadow = trained(instances=3)  # fewer than min_instances: still learning
    assert shadow.confidence.tier is Tier.SHADOW and shadow.model is not None
    annotation = shadow.annotate("planner")
    assert annotation.confidence is Tier.SHADOW and annotation.projection == ()
    assert sys_annotations(annotation).projection == ()
    assert sys_annotations(Annotation.empty()).projection == ()


def test_annotate_over_the_servicer_sends_the_projection() -> None:
    store = ProfileStore()
    store.profiles[("acme", "fan")] = trained()
    request = profiler_pb2.AnnotateRequest(
        request_id="r1",
        tenant="acme",
        app_metadata=common_pb2.AppMetadata(workflow_type_id="fan", workflow_id="live", agent_id="planner"),
    )
    wire = convert.sys_annotations(ProfilerServicer(store).annotate(request))
    assert [(p.step, p.agent_id, p.expected_calls) for p in wire.projection] == [
        (1, "explorer", 10.0),
        (2, "engineer", 1.0),
    ]
