"""The profiler's pure core: workflow structure and workload prediction.

No I/O, no clock reads, no transports: inputs in, results out, times passed in.  The modules, in the
order data flows through them:

    trace.py           calls -> steps (Kairos sweep line)
    automaton.py       step transitions with counts, pruning at the dominant percentile (Pythia)
    expr.py            bounded path expressions: AST, parser, printer
    path_automaton.py  expressions compiled to acyclic probabilistic automata
    path_fitting.py    choice probabilities fitted on traces (most likely derivations)
    paths.py           path models: accepts, positions, future agents, expected remaining
                       steps/time, projection, residual path
    synthesis.py       traces -> bounded path expression
    stats.py           per-agent length/latency/gap distributions, Kairos convergence
    ranking.py         Kairos agent rank (Wasserstein + 1-D MDS with a zero anchor)
    remaining.py       remaining work given a running workflow's progress (accelerated failure
                       time), its Gittins index
    agent_names.py     agent-name normalization (pattern, system-prompt hash)
    priors.py          output-length priors for rare and unseen agents
    confidence.py      shadow / low / high tiers (Pythia shadow profiling, SAGA cold start)
    templates.py       prompt-composition templates from chained block hashes, static prefixes
    profile_types.py   a profile's records, results, annotations and settings
    open_instance.py   one open workflow instance: calls, incremental trace, position cache
    workload_stats.py  per-agent and per-workflow statistics of closed instances, convergence
    prediction.py      a request's position in the path model, look-ahead, annotation tables
    profile.py         WorkflowProfile: incremental ingestion, learning at close, annotate,
                       plain-dict state
    store.py           ProfileStore: one profile per (tenant, workflow type)
"""

from clairvoyant.profiler.core.automaton import TransitionAutomaton
from clairvoyant.profiler.core.confidence import ConfidenceConfig, ConfidenceState, Tier
from clairvoyant.profiler.core.expr import Expr, ExpressionError, ParseError, parse, to_text
from clairvoyant.profiler.core.path_fitting import fit_weights
from clairvoyant.profiler.core.paths import (
    NextAgents,
    PathModel,
    Position,
    Remaining,
    accepts,
    expected_remaining,
    future_agents,
    project,
    project_steps,
)
from clairvoyant.profiler.core.profile import WorkflowProfile
from clairvoyant.profiler.core.profile_types import (
    Annotation,
    CallRecord,
    IngestResult,
    IngestStatus,
    ProfileConfig,
)
from clairvoyant.profiler.core.ranking import AgentRanking, kairos_ranking
from clairvoyant.profiler.core.store import ProfileStore
from clairvoyant.profiler.core.synthesis import SynthesisConfig, SynthesisResult, synthesize
from clairvoyant.profiler.core.templates import AgentTemplate, ChainStore, TemplateConfig, TemplateLearner
from clairvoyant.profiler.core.trace import Step, TraceCall, WorkflowTrace, build_trace

__all__ = [
    "AgentTemplate",
    "ChainStore",
    "TemplateConfig",
    "TemplateLearner",
    "AgentRanking",
    "Annotation",
    "CallRecord",
    "ConfidenceConfig",
    "ConfidenceState",
    "Expr",
    "ExpressionError",
    "IngestResult",
    "IngestStatus",
    "NextAgents",
    "ParseError",
    "PathModel",
    "Position",
    "ProfileConfig",
    "ProfileStore",
    "Remaining",
    "Step",
    "SynthesisConfig",
    "SynthesisResult",
    "Tier",
    "TraceCall",
    "TransitionAutomaton",
    "WorkflowProfile",
    "WorkflowTrace",
    "accepts",
    "build_trace",
    "expected_remaining",
    "fit_weights",
    "future_agents",
    "kairos_ranking",
    "parse",
    "project",
    "project_steps",
    "synthesize",
    "to_text",
]
