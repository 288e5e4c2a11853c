"""Build a configuration router profile from labelled inputs (Aragog, seeds/002 §3.1):
``python -m clairvoyant.scheduler.train_router --groups FILE --group NAME --workflow TYPE
--examples FILE.jsonl --kind table|classifier --out PATH``.

Each line of the examples file is one input, labelled by running every configuration on it::

    {"text": "...", "input_class": "...", "accurate": ["m7+m14+m32", "m32+m32+m32"]}

``accurate`` names (``ConfigSpace.name``: the agents' models joined by '+') the configurations that
kept the reference configuration's accuracy.  The command trains on 80 % of the inputs, prints the
router's precision and recall on the other 20 %, and writes the profile the model group's
``router`` entry points at (table: JSON; classifier: a pickle).

Exit codes: 0 done; 1 an examples file that cannot be used (the message names file and line);
2 a usage error (arguments, groups file, group or workflow).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import NamedTuple

from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.core.model_groups import ROUTER_KINDS, ModelGroupError, load_model_groups
from clairvoyant.policy.aragog.routers import LabelledInput, RouterQuality, TableRouter, precision_recall

HELD_OUT_SHARE = 0.2


class ExamplesError(ValueError):
    """An examples file that cannot be used; the message names the file and line."""


class TrainedProfile(NamedTuple):
    data: bytes  # what goes into the profile file
    quality: RouterQuality  # on the held-out inputs
    held_out: int


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m clairvoyant.scheduler.train_router",
        description="Train a configuration router profile for one workflow type of a model group.",
    )
    parser.add_argument("--groups", required=True, type=Path, help="the model groups declaration (YAML or JSON)")
    parser.add_argument("--group", required=True, help="the model group's name")
    parser.add_argument("--workflow", required=True, help="the workflow type, as the group declares it")
    parser.add_argument("--examples", required=True, type=Path, help="labelled inputs, one JSON object a line")
    parser.add_argument("--kind", required=True, choices=ROUTER_KINDS, help="the router to train")
    parser.add_argument("--out", required=True, type=Path, help="where to write the profile")
    parser.add_argument("--seed", type=int, default=0, help="the held-out split's and the classifiers' seed")
    parser.add_argument("--quantile", type=float, default=0.95,
                        help="table: the share of a class's inputs a configuration must be accurate on")
    parser.add_argument("--target-precision", type=float, default=0.95,
                        help="classifier: the precision each configuration's threshold aims for")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage
        return int(exc.code or 0)
    try:
        group = load_model_groups(args.groups).get(args.group)
    except ModelGroupError as exc:
        return _fail(parser, str(exc), 2)
    if group is None:
        return _fail(parser, f"{args.groups}: no model group {args.group!r}", 2)
    space = group.space(args.workflow)
    if space is None:
        return _fail(parser, f"model group {args.group!r} declares no workflow {args.workflow!r}; "
                             f"it has {sorted(group.workflows)}", 2)
    try:
        examples = read_examples(args.examples, space)
    except FileNotFoundError:
        return _fail(parser, f"cannot read examples file {args.examples}", 2)
    except ExamplesError as exc:
        return _fail(parser, str(exc), 1)
    try:
        trained = train(space, examples, args.kind, seed=args.seed, quantile=args.quantile,
                        target_precision=args.target_precision)
    except ValueError as exc:
        return _fail(parser, f"{args.examples}: {exc}", 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(trained.data)
    print(f"{args.kind} router for {args.group}/{args.workflow}: precision {trained.quality.precision:.3f}, "
          f"recall {trained.quality.recall:.3f} on {trained.held_out} held-out inputs; "
          f"wrote {args.out} ({len(trained.data)} bytes)")
    return 0


def read_examples(path: Path, space: ConfigSpace) -> list[LabelledInput]:
    """The labelled inputs of a JSONL file.  Raises ExamplesError naming the file and line."""
    by_name = {space.name(config): config for config in range(space.size)}
    examples = []
    with path.open() as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                raw = json.loads(line)
            except ValueError as exc:
                raise ExamplesError(f"{where}: not valid JSON: {exc}") from exc
            if not isinstance(raw, dict) or set(raw) != {"text", "input_class", "accurate"}:
                raise ExamplesError(f"{where}: expected an object with keys 'text', 'input_class', 'accurate'")
            if not isinstance(raw["text"], str) or not isinstance(raw["input_class"], str):
                raise ExamplesError(f"{where}: 'text' and 'input_class' must be strings")
            if not isinstance(raw["accurate"], list):
                raise ExamplesError(f"{where}: 'accurate' must be a list of configuration names")
            mask = 0
            for name in raw["accurate"]:
                if name not in by_name:
                    raise ExamplesError(f"{where}: {name!r} is not a configuration of {space.workflow_type!r} "
                                        f"(expected one model per agent {list(space.agents)}, joined by '+')")
                mask |= 1 << by_name[name]
            examples.append(LabelledInput(raw["text"], raw["input_class"], mask))
    if not examples:
        raise ExamplesError(f"{path}: no labelled inputs")
    return examples


def train(space: ConfigSpace, examples: list[LabelledInput], kind: str, seed: int = 0,
          quantile: float = 0.95, target_precision: float = 0.95) -> TrainedProfile:
    """Train on 80 % of ``examples`` (a seeded shuffle), measure on the rest."""
    if len(examples) < 5:
        raise ValueError(f"need five or more labelled inputs to hold out {HELD_OUT_SHARE:.0%}, got {len(examples)}")
    shuffled = list(examples)
    random.Random(seed).shuffle(shuffled)
    held_out = max(1, round(len(shuffled) * HELD_OUT_SHARE))
    evaluation, training = shuffled[:held_out], shuffled[held_out:]
    data: bytes
    if kind == "table":
        table = TableRouter.fit(space, training, quantile=quantile)
        quality = precision_recall(table, space, evaluation)
        data = json.dumps(table.to_dict(), separators=(",", ":")).encode()
    elif kind == "classifier":
        from clairvoyant.policy.aragog.classifier import ClassifierRouter  # scikit-learn loads slowly

        classifier = ClassifierRouter.fit(space, training, target_precision=target_precision, seed=seed)
        quality = precision_recall(classifier, space, evaluation)
        data = classifier.dumps()
    else:
        raise ValueError(f"unknown router kind {kind!r}; expected one of {list(ROUTER_KINDS)}")
    return TrainedProfile(data, quality, held_out)


def _fail(parser: argparse.ArgumentParser, message: str, code: int) -> int:
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
