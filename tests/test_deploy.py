"""The deploy files agree with the code: every flag, FLEETCARE_* variable, path and image
in deploy/systemd, deploy/kubernetes and deploy/containers is one the CLI, the config
loaders and the packages really have.

- Kubernetes: every document parses, has the expected kind and only fields the API knows
  (round trip through the official client's models); every container's fleetcare /
  fleetcare-agent command line (args, command, or a ``sh -c`` script) names real
  subcommands and flags and parses; ``$(VAR)`` and every referenced ConfigMap, Secret,
  PVC and ServiceAccount is defined; ``--db`` / ``--lake`` / ``--spool-dir`` / ``--config``
  lie on the right kind of mounted volume; the DuckDB writer is one Recreate replica;
  serve binds 0.0.0.0 and its probes hit ``/healthz`` on its port.
- systemd: the same for every Exec* line, with specifiers and ``${VAR}`` expanded; the
  paths are writable under the unit's sandbox (StateDirectory=, ReadWritePaths=).
- Containerfiles: COPY sources exist and are not excluded by the ignore file; the images
  install the expected distributions; ENTRYPOINT is a console script of one; USER is a
  numeric non-root UID; EXPOSE covers the container ports of the manifests.
- Config files (the ConfigMaps' TOML, deploy/systemd/*.toml) load with the real loaders.

Each check returns a list of problems, so the last tests can show that each one catches
a misspelled flag, variable, path or mount.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shlex
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import Any
from unittest import mock

import pytest
import yaml
from kubernetes.client import ApiClient

from fleetcare.api import cli as api_cli
from fleetcare.api.alerts import config as alerts_config
from fleetcare.api.http_client import TOKEN_ENV
from fleetcare.collectors import cli as agent_cli
from fleetcare.collectors.config import CONFIG_ENV, ENV_PREFIX
from fleetcare.collectors.config import load as load_settings
from fleetcare.collectors.transport.factory import SPOOL_DIR_ENV

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
CONTAINERFILES = sorted(p for p in (DEPLOY / "containers").glob("Containerfile.*")
                        if p.suffix != ".dockerignore")
DISTRIBUTIONS = ("collectors", "pipeline", "models", "api")

PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "fleetcare": api_cli.build_parser, "fleetcare-agent": agent_cli.build_parser}

EXPECTED_KINDS = {
    "fleetcare-agent-daemonset.yaml": ["Namespace", "ConfigMap", "DaemonSet"],
    "fleetcare-service.yaml": ["Namespace", "ConfigMap", "Secret", "PersistentVolumeClaim",
                               "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                               "Deployment", "Service"],
    "fleetcare-ingest.yaml": ["Namespace", "PersistentVolumeClaim", "Service", "StatefulSet"],
}
EXPECTED_UNITS = {  # unit -> the command its ExecStart runs
    "fleetcare-agent.service": ("fleetcare-agent",),
    "fleetcare-serve.service": ("fleetcare", "serve"),
    "fleetcare-serve-lake.service": ("fleetcare", "serve"),
    "fleetcare-ingest@.service": ("fleetcare", "ingest"),
}
EXPECTED_IMAGES = {  # Containerfile -> what `pip install` puts in it
    "Containerfile.agent": {"collectors[nvml,kafka]"},
    "Containerfile.service": {"collectors[kafka]", "pipeline", "models", "api"},
}
IMAGE_FILES = {"fleetcare-agent": "Containerfile.agent",  # image repository -> Containerfile
               "fleetcare-service": "Containerfile.service"}
UNIT_INSTANCE = "9461"  # what %i stands for in a template unit
SYSTEMD_ENV = {"INVOCATION_ID": "0" * 32, "RUNTIME_DIRECTORY": "/run/x"}


# -- fleetcare command lines -----------------------------------------------------------------------
@dataclass
class Invocation:
    """One fleetcare / fleetcare-agent command line found in a deploy file."""

    where: str
    program: str
    argv: list[str]
    problems: list[str] = field(default_factory=list)  # found while extracting it


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_path(program: str, argv: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """The subcommands ``argv`` walks through (``("fleetcare", "tokens", "create")``) and
    its problems: an option the parser at that point does not define (exactly: no
    abbreviations), or an unknown subcommand."""
    parser = PARSERS[program]()
    path = [program]
    problems = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token.startswith("-") and token != "-":
            name, eq, _ = token.partition("=")
            action = parser._option_string_actions.get(name)
            if action is None:
                known = sorted(o for o in parser._option_string_actions if o.startswith("--"))
                problems.append(f"`{' '.join(path)}` has no option {name}; it has "
                                + ", ".join(known))
            elif not eq and action.nargs != 0:
                i += 1  # its value
            continue
        commands = _subcommands(parser)
        if commands:
            if token not in commands:
                problems.append(f"`{' '.join(path)}` has no subcommand {token!r}; it has "
                                + ", ".join(sorted(commands)))
                break
            parser = commands[token]
            path.append(token)
    return tuple(path), problems


@functools.cache
def _top_commands(program: str) -> frozenset[str]:
    return frozenset(_subcommands(PARSERS[program]()))


class _UsageError(Exception):
    pass


def _raise_usage(self: argparse.ArgumentParser, message: str) -> None:
    raise _UsageError(f"{self.prog}: {message}")


def parse_problems(program: str, argv: list[str]) -> list[str]:
    """What the real parser says about ``argv`` (missing or clashing options, bad values)."""
    with mock.patch.object(argparse.ArgumentParser, "error", _raise_usage):
        try:
            PARSERS[program]().parse_args(argv)
        except _UsageError as exc:
            return [str(exc)]
    return []


def invocation_problems(inv: Invocation) -> list[str]:
    path, problems = command_path(inv.program, inv.argv)
    if not problems:
        problems = parse_problems(inv.program, inv.argv)
    if inv.program == "fleetcare-agent":
        problems += [p for value in option_values(inv.argv, "--backend")
                     for p in backend_problems(value)]
    return [f"{inv.where}: {p}" for p in inv.problems + problems]


def backend_problems(value: str) -> list[str]:
    """An agent backend list naming a backend the agent does not have."""
    return [f"--backend / backend: {b!r} is not one of {', '.join(agent_cli.BACKENDS)}"
            for b in (x.strip() for x in value.split(",")) if b and b not in agent_cli.BACKENDS]


def option_values(argv: list[str], name: str) -> list[str]:
    out = []
    for i, token in enumerate(argv):
        if token == name and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif token.startswith(name + "="):
            out.append(token.split("=", 1)[1])
    return out


def shell_invocations(where: str, script: str, *, prose: bool = False) -> Iterator[Invocation]:
    """The fleetcare commands of a ``sh -c`` script, with ``name=value`` assignments
    substituted; a command ends at the first shell operator (| ; && > ...). ``prose``:
    the script is comment text, where the word fleetcare starts a command only when one
    of its subcommands follows (fleetcare-agent: an option), so that ``sudo -u fleetcare``
    and ``kubectl -n fleetcare`` are not commands."""
    assigned: dict[str, str] = {}

    def substitute(word: str) -> str:
        return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: assigned.get(m[1], m[0]), word)

    for line in script.replace("\\\n", " ").splitlines():
        m = re.fullmatch(r"\s*([A-Za-z_]\w*)=(\S+)\s*", line)
        if m:
            assigned[m[1]] = substitute(m[2])
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            tokens = list(lexer)
        except ValueError:  # prose with an apostrophe
            tokens = line.split()
        for i, token in enumerate(tokens):
            program = PurePosixPath(token).name
            if program not in PARSERS:
                continue
            after = tokens[i + 1] if i + 1 < len(tokens) else ""
            if prose and not (after in _top_commands(program)
                              or (program == "fleetcare-agent" and after.startswith("--"))):
                continue
            argv = []
            for word in tokens[i + 1:]:
                if set(word) <= set("();<>|&"):
                    break
                argv.append(substitute(word))
            yield Invocation(where, program, argv)


def comment_invocations(name: str, text: str) -> list[Invocation]:
    """The fleetcare command lines of the comments (install steps operators copy)."""
    lines = [line.lstrip()[1:] for line in text.splitlines() if line.lstrip().startswith("#")]
    return list(shell_invocations(f"{name} (comment)", "\n".join(lines), prose=True))


# -- Containerfiles --------------------------------------------------------------------------------
def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, rest)`` per instruction, continuation lines joined."""
    out = []
    logical = ""
    for line in text.splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):  # a comment inside a continued instruction
            continue
        logical += line.rstrip()
        if logical.endswith("\\"):
            logical = logical[:-1] + " "
            continue
        word, _, rest = logical.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        logical = ""
    return out


def _exec_form(rest: str) -> list[str]:
    return json.loads(rest) if rest.startswith("[") else shlex.split(rest)


def ignore_patterns(containerfile: Path) -> list[str]:
    ignore = containerfile.with_name(containerfile.name + ".dockerignore")
    if not ignore.exists():
        return []
    return [line.strip() for line in ignore.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def is_ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parent folders
    decides; ``!`` patterns take files back."""
    parts = rel.split("/")
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        regex = _glob_regex(pattern.lstrip("!").strip("/"))
        if any(regex.fullmatch("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            ignored = not negated
    return ignored


def console_scripts(distribution: str) -> set[str]:
    meta = tomllib.loads((ROOT / distribution / "pyproject.toml").read_text())["project"]
    return set(meta.get("scripts", {}))


def _source_files(rel: str) -> list[str]:
    """``rel`` and the files under it that a build copies (caches left out)."""
    return [rel] + [str(p.relative_to(ROOT)) for p in (ROOT / rel).rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts
                    and not p.name.endswith(".pyc")
                    and not any(x.endswith(".egg-info") for x in p.parts)]


@dataclass
class Image:
    name: str
    entrypoint: list[str]
    exposed: set[int]
    installed: set[str]  # "collectors[kafka]", "api", ...
    problems: list[str]


def read_containerfile(name: str, text: str, patterns: list[str]) -> Image:
    """What the Containerfile ``text`` builds, and its problems (``patterns``: its ignore
    file)."""
    problems = []
    entrypoint: list[str] = []
    exposed: set[int] = set()
    installed: set[str] = set()
    copied: dict[str, str] = {}  # destination -> source
    user = None
    for word, rest in instructions(text):
        if word == "FROM" and rest.split()[0] != "python:3.11-slim":
            problems.append(f"{name}: FROM {rest}: the base is python:3.11-slim")
        elif word in ("COPY", "ADD"):
            args = _exec_form(rest)
            if any(a.startswith("--from") for a in args):
                continue
            paths = [a for a in args if not a.startswith("--")]
            for src in paths[:-1]:
                rel = src.strip("/")
                if not (ROOT / rel).exists():
                    problems.append(f"{name}: {word} {src}: no such path in the repository")
                    continue
                excluded = [f for f in _source_files(rel) if is_ignored(f, patterns)]
                if excluded:
                    problems.append(f"{name}: {word} {src}: {excluded[0]} is excluded by "
                                    "the ignore file")
                copied[paths[-1].rstrip("/")] = rel
        elif word == "RUN" and "pip install" in rest:
            for arg in shlex.split(rest):
                m = re.fullmatch(r"(/src/[\w-]+)/?(\[[\w,-]+\])?", arg)
                if m:
                    source = copied.get(m[1])
                    if source is None:
                        problems.append(f"{name}: pip install {arg}: {m[1]} was not copied")
                        continue
                    installed.add(source + (m[2] or ""))
        elif word == "ENTRYPOINT":
            entrypoint = _exec_form(rest)
            if not rest.startswith("["):
                problems.append(f"{name}: ENTRYPOINT {rest}: use the exec form [\"...\"] so "
                                "that SIGTERM reaches the process")
        elif word == "EXPOSE":
            exposed |= {int(p.split("/")[0]) for p in rest.split()}
        elif word == "USER":
            user = rest
    if user is None or not re.fullmatch(r"[1-9]\d*(:\d+)?", user):
        problems.append(f"{name}: USER {user}: a numeric non-root UID (runAsNonRoot checks it)")
    scripts = set().union(*(console_scripts(d.split("[")[0]) for d in installed))
    if not entrypoint or entrypoint[0] not in scripts:
        problems.append(f"{name}: ENTRYPOINT {entrypoint}: not a console script of the "
                        f"installed distributions ({', '.join(sorted(scripts)) or 'none'})")
    return Image(name, entrypoint, exposed, installed, problems)


def images() -> dict[str, Image]:
    return {p.name: read_containerfile(p.name, p.read_text(), ignore_patterns(p))
            for p in CONTAINERFILES}


# -- Kubernetes ------------------------------------------------------------------------------------
def load_manifests(texts: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name, text in texts.items()
            for doc in yaml.safe_load_all(text) if doc is not None]


def manifest_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in MANIFESTS}


def _label(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def unknown_fields(doc: dict[str, Any]) -> list[str]:
    """Keys the API does not define: what the official client's models drop in a round
    trip (a misspelled field is otherwise silently ignored by ``kubectl apply``)."""
    version = doc["apiVersion"].split("/")[-1]  # v1 -> models named V1Deployment, ...
    client = ApiClient()
    # the deserializer the client applies to API answers; public only through a response
    model = client._ApiClient__deserialize(  # type: ignore[attr-defined]
        doc, version[0].upper() + version[1:] + doc["kind"])
    back = client.sanitize_for_serialization(model)

    def diff(a: Any, b: Any, path: str) -> Iterator[str]:
        if isinstance(a, dict) and isinstance(b, dict):
            for key, value in a.items():
                if key not in b:
                    yield f"{path}.{key}"
                else:
                    yield from diff(value, b[key], f"{path}.{key}")
        elif isinstance(a, list) and isinstance(b, list):
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                yield from diff(x, y, f"{path}[{i}]")

    return list(diff(doc, back, _label(doc)))


def pod_templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod template of a workload (``metadata`` + ``spec``); none for other kinds."""
    spec = doc.get("spec") or {}
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return [spec["template"]] if "template" in spec else []


def _by_kind(docs: list[tuple[str, dict[str, Any]]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in docs if d["kind"] == kind}


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec.get("initContainers", []) + spec.get("containers", [])


def container_invocations(where: str, container: dict[str, Any],
                          entrypoints: dict[str, list[str]]) -> list[Invocation]:
    """The fleetcare command lines a container runs: its image's ENTRYPOINT with ``args``,
    ``command`` + ``args``, or the commands of a ``sh -c`` script; ``$(VAR)`` replaced
    from the container's ``env``."""
    env = {e["name"]: e.get("value", f"<{e['name']}>") for e in container.get("env", [])}
    problems: list[str] = []

    def expand(word: str) -> str:
        def one(m: re.Match[str]) -> str:
            if m[1] not in env:
                problems.append(f"$({m[1]}) is not in the container's env")
            return env.get(m[1], m[0])
        return re.sub(r"\$\(([A-Za-z_]\w*)\)", one, word)

    command = [expand(w) for w in container.get("command", [])]
    args = [expand(w) for w in container.get("args", [])]
    where = f"{where} container {container['name']}"
    if not command:
        repository = container["image"].rsplit("/", 1)[-1].split(":")[0]
        command = entrypoints.get(repository, [])
        if not command:
            return [Invocation(where, "?", args, [f"image {container['image']} is not built "
                                                  "by a Containerfile in deploy/containers"])]
    line = command + args
    if PurePosixPath(line[0]).name in ("sh", "bash") and "-c" in line:
        script = line[line.index("-c") + 1]
        found = list(shell_invocations(where, script))
    elif PurePosixPath(line[0]).name in PARSERS:
        found = [Invocation(where, PurePosixPath(line[0]).name, line[1:])]
    else:
        found = []
    for inv in found:
        inv.problems = problems + inv.problems
    return found


def entrypoints() -> dict[str, list[str]]:
    built = images()
    return {repo: built[name].entrypoint for repo, name in IMAGE_FILES.items() if name in built}


def manifest_invocations(docs: list[tuple[str, dict[str, Any]]]
                         ) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any],
                                             Invocation]]:
    """``(workload, pod spec, container, invocation)`` for every fleetcare command line."""
    points = entrypoints()
    for name, doc in docs:
        for template in pod_templates(doc):
            spec = template["spec"]
            for container in _containers(spec):
                for inv in container_invocations(f"{name} {_label(doc)}", container, points):
                    yield doc, spec, container, inv


def _mount_for(path: str, container: dict[str, Any]) -> dict[str, Any] | None:
    best = None
    for mount in container.get("volumeMounts", []):
        if PurePosixPath(path).is_relative_to(mount["mountPath"]) and (
                best is None or len(mount["mountPath"]) > len(best["mountPath"])):
            best = mount
    return best


def mount_problems(docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Paths given to --db, --lake, --spool-dir, --config and FLEETCARE_CONFIG lie on a
    mounted volume of the right kind; the DuckDB writer is a single Recreate replica."""
    claims = _by_kind(docs, "PersistentVolumeClaim")
    maps = _by_kind(docs, "ConfigMap")
    problems = []
    for doc, spec, container, inv in manifest_invocations(docs):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        config = [e["value"] for e in container.get("env", [])
                  if e["name"] == CONFIG_ENV and "value" in e]
        wanted = [("--db", p, True) for p in option_values(inv.argv, "--db")]
        wanted += [("--lake", p, False) for p in option_values(inv.argv, "--lake")]
        wanted += [("--spool-dir", p, False) for p in option_values(inv.argv, "--spool-dir")]
        wanted += [("--config", p, True) for p in option_values(inv.argv, "--config")]
        wanted += [(CONFIG_ENV, p, True) for p in config]
        for flag, path, is_file in wanted:
            folder = str(PurePosixPath(path).parent) if is_file else path
            mount = _mount_for(folder, container)
            if mount is None:
                problems.append(f"{inv.where}: {flag} {path}: no volume is mounted there")
                continue
            volume = volumes.get(mount["name"], {})
            if flag in ("--config", CONFIG_ENV):
                cm = maps.get((volume.get("configMap") or {}).get("name", ""), {})
                if PurePosixPath(path).name not in cm.get("data", {}):
                    problems.append(f"{inv.where}: {flag} {path}: the volume {mount['name']} "
                                    "is not a ConfigMap with that key")
                continue
            if mount.get("readOnly"):
                problems.append(f"{inv.where}: {flag} {path}: mounted read-only")
            if flag == "--spool-dir":
                continue
            claim = claims.get((volume.get("persistentVolumeClaim") or {}).get("claimName", ""))
            if claim is None:
                problems.append(f"{inv.where}: {flag} {path}: the volume {mount['name']} is "
                                "not a PersistentVolumeClaim of these manifests")
                continue
            if flag == "--lake" and "ReadWriteMany" not in claim["spec"]["accessModes"]:
                problems.append(f"{inv.where}: --lake {path}: the claim "
                                f"{claim['metadata']['name']} is not ReadWriteMany")
            if flag == "--db" and (doc["kind"] != "Deployment" or doc["spec"].get("replicas") != 1
                                   or doc["spec"].get("strategy", {}).get("type") != "Recreate"):
                problems.append(f"{inv.where}: --db {path}: one DuckDB writer needs a "
                                "Deployment with replicas: 1 and strategy Recreate")
    return problems


def _references(spec: dict[str, Any]) -> Iterator[tuple[str, str, bool]]:
    """``(kind, name, optional)`` of every object a pod spec names."""
    if spec.get("serviceAccountName"):
        yield "ServiceAccount", spec["serviceAccountName"], False
    for v in spec.get("volumes", []):
        if "configMap" in v:
            yield "ConfigMap", v["configMap"]["name"], v["configMap"].get("optional", False)
        if "secret" in v:
            yield "Secret", v["secret"]["secretName"], v["secret"].get("optional", False)
        if "persistentVolumeClaim" in v:
            yield "PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"], False
    for c in _containers(spec):
        refs = [(kind, e[key]) for e in c.get("envFrom", [])
                for kind, key in (("Secret", "secretRef"), ("ConfigMap", "configMapRef"))
                if key in e]
        refs += [(kind, e["valueFrom"][key]) for e in c.get("env", []) if "valueFrom" in e
                 for kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef"))
                 if key in e["valueFrom"]]
        for kind, ref in refs:
            yield kind, ref["name"], ref.get("optional", False)


def reference_problems(docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Objects that pods name are defined here (unless ``optional``), volumeMounts name
    volumes of the pod, and every Service selects pods and targets their named ports."""
    defined = {kind: _by_kind(docs, kind) for kind in
               ("ConfigMap", "Secret", "PersistentVolumeClaim", "ServiceAccount")}
    problems = []
    for name, doc in docs:
        for template in pod_templates(doc):
            where = f"{name} {_label(doc)}"
            spec = template["spec"]
            problems += [f"{where}: {kind} {ref} is not defined in deploy/kubernetes"
                         for kind, ref, optional in _references(spec)
                         if ref not in defined[kind] and not optional]
            volumes = {v["name"] for v in spec.get("volumes", [])}
            problems += [f"{where}: volumeMount {m['name']} is not a volume of the pod"
                         for c in _containers(spec) for m in c.get("volumeMounts", [])
                         if m["name"] not in volumes]
    templates = [t for _, doc in docs for t in pod_templates(doc)]
    for name, svc in _by_kind(docs, "Service").items():
        selector = svc["spec"].get("selector", {})
        chosen = [t["spec"] for t in templates
                  if selector.items() <= t["metadata"].get("labels", {}).items()]
        if not chosen:
            problems.append(f"Service/{name}: its selector {selector} matches no pod")
        names = {p.get("name") for spec in chosen for c in spec["containers"]
                 for p in c.get("ports", [])}
        problems += [f"Service/{name}: targetPort {port['targetPort']} is no container port"
                     for port in svc["spec"]["ports"]
                     if isinstance(port.get("targetPort"), str) and port["targetPort"] not in names]
    return problems


def serve_problems(docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """A containerized serve binds 0.0.0.0 on a declared port, probed at /healthz."""
    problems = []
    for _, _, container, inv in manifest_invocations(docs):
        path, _ = command_path(inv.program, inv.argv)
        if path[:2] != ("fleetcare", "serve"):
            continue
        if option_values(inv.argv, "--host") != ["0.0.0.0"]:
            problems.append(f"{inv.where}: serve must bind --host=0.0.0.0 in a container")
        port = int((option_values(inv.argv, "--port") or ["8000"])[-1])
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        if port not in ports.values():
            problems.append(f"{inv.where}: serve's port {port} is not a containerPort")
        for probe in ("readinessProbe", "livenessProbe"):
            get = (container.get(probe) or {}).get("httpGet") or {}
            target = ports.get(get.get("port"), get.get("port"))
            if get.get("path") != "/healthz" or target != port:
                problems.append(f"{inv.where}: {probe} must GET /healthz on port {port}")
    return problems


# -- systemd ---------------------------------------------------------------------------------------
def unit_entries(text: str) -> list[tuple[str, str, str]]:
    """``(section, key, value)`` per assignment, continuation lines joined."""
    out = []
    section = ""
    logical = ""
    for line in text.splitlines():
        if not logical and (not line.strip() or line.lstrip()[:1] in ("#", ";")):
            continue
        logical += line.strip()
        if logical.endswith("\\"):
            logical = logical[:-1] + " "
            continue
        if logical.startswith("["):
            section = logical.strip("[]")
        else:
            key, _, value = logical.partition("=")
            out.append((section, key.strip(), value.strip()))
        logical = ""
    return out


@dataclass
class Unit:
    name: str
    invocations: list[Invocation]
    writable: list[str]       # StateDirectory= under /var/lib, ReadWritePaths=
    mounts: list[str]         # RequiresMountsFor=
    settings: dict[str, list[str]]
    problems: list[str]


def read_unit(name: str, text: str) -> Unit:
    entries = unit_entries(text)
    settings: dict[str, list[str]] = {}
    for _, key, value in entries:
        settings.setdefault(key, []).append(value)
    env = dict(SYSTEMD_ENV)
    state = [f"/var/lib/{d}" for v in settings.get("StateDirectory", []) for d in v.split()]
    if state:
        env["STATE_DIRECTORY"] = state[0]
    for value in settings.get("Environment", []):
        for assignment in shlex.split(value):
            key, _, val = assignment.partition("=")
            env[key] = val
    instance = UNIT_INSTANCE if "@" in name else ""
    specifiers = {"i": instance, "I": instance, "H": "host-1", "n": name, "N": name,
                  "p": name.split("@")[0], "%": "%"}
    problems: list[str] = []

    def expand(word: str) -> str:
        def spec(m: re.Match[str]) -> str:
            if m[1] not in specifiers:
                problems.append(f"{name}: specifier %{m[1]} is not expanded by this test")
            return specifiers.get(m[1], m[0])

        def var(m: re.Match[str]) -> str:
            key = m[1] or m[2]
            if key not in env:
                problems.append(f"{name}: ${{{key}}} is set by no Environment= of the unit")
            return env.get(key, "")
        word = re.sub(r"%(.)", spec, word)
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", var, word)

    invocations = []
    scripts = set().union(*(console_scripts(d) for d in DISTRIBUTIONS))
    for key in ("ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop"):
        for value in settings.get(key, []):
            words = [expand(w) for w in shlex.split(value.lstrip("-@:+!|"))]
            program = PurePosixPath(words[0]).name
            if words[0] != f"/opt/fleetcare/venv/bin/{program}" or program not in scripts:
                problems.append(f"{name}: {key} runs {words[0]}, not a console script in "
                                "/opt/fleetcare/venv/bin")
                continue
            invocations.append(Invocation(f"{name} {key}", program, words[1:]))
    writable = state + [p.lstrip("-") for v in settings.get("ReadWritePaths", [])
                        for p in v.split()]
    mounts = [p for v in settings.get("RequiresMountsFor", []) for p in v.split()]
    return Unit(name, invocations, writable, mounts, settings, problems)


def unit_problems(unit: Unit) -> list[str]:
    problems = list(unit.problems)
    for inv in unit.invocations:
        problems += invocation_problems(inv)
        for flag, is_file in (("--db", True), ("--lake", False), ("--spool-dir", False)):
            for path in option_values(inv.argv, flag):
                folder = PurePosixPath(path).parent if is_file else PurePosixPath(path)
                if not any(folder.is_relative_to(w) for w in unit.writable):
                    problems.append(f"{inv.where}: {flag} {path} is not writable under "
                                    f"ProtectSystem=strict (StateDirectory=, ReadWritePaths=: "
                                    f"{unit.writable})")
                if flag == "--lake" and not any(folder.is_relative_to(m) for m in unit.mounts):
                    problems.append(f"{inv.where}: --lake {path}: add RequiresMountsFor=")
    for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                       ("ProtectHome", "yes"), ("PrivateTmp", "yes")):
        if value not in unit.settings.get(key, []):
            problems.append(f"{unit.name}: hardening: {key}={value} is missing")
    return problems


# -- FLEETCARE_* variables and config files --------------------------------------------------------
def sink_names(toml_texts: list[str]) -> list[str]:
    return [s["name"] for text in toml_texts
            for s in tomllib.loads(text).get("alerts", {}).get("sinks", [])]


def known_variables(sinks: list[str]) -> set[str]:
    """Every FLEETCARE_* name the code reads (fleetcare/collectors/config.py forms
    ENV_PREFIX + SECTION + "_" + FIELD), plus the secrets of the given alert sinks."""
    known = {CONFIG_ENV, TOKEN_ENV, SPOOL_DIR_ENV}
    known |= {f"{ENV_PREFIX}CLI_{f.name.upper()}" for f in fields(api_cli.Settings)}
    known |= {f"{ENV_PREFIX}AGENT_{f.name.upper()}" for f in fields(agent_cli.AgentConfig)}
    known |= {alerts_config.ENV_PREFIX + key.upper() for key in alerts_config._TOP}
    known |= {alerts_config.env_name(s) + suffix for s in sinks
              for suffix in ("URL", "ROUTING_KEY", "SECRET")}
    return known


def variable_problems(name: str, text: str, known: set[str]) -> list[str]:
    """FLEETCARE_* names in ``text`` (comments too) that the code does not read; a name
    ending in ``_`` is a prefix (FLEETCARE_AGENT_<KEY>) and skipped."""
    found = set(re.findall(r"\bFLEETCARE_[A-Z0-9_]+", text))
    return [f"{name}: {var} is read by no fleetcare code (known: FLEETCARE_CLI_<Settings "
            "field>, FLEETCARE_AGENT_<AgentConfig field>, FLEETCARE_ALERTS_<key or sink>_..., "
            f"{CONFIG_ENV}, {TOKEN_ENV}, {SPOOL_DIR_ENV})"
            for var in sorted(found) if not var.endswith("_") and var not in known]


def configmap_tomls(docs: list[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    return {f"ConfigMap/{cm} {key}": value
            for cm, doc in _by_kind(docs, "ConfigMap").items()
            for key, value in doc.get("data", {}).items() if key.endswith(".toml")}


def config_problems(name: str, text: str, secrets: dict[str, str], tmp: Path) -> list[str]:
    """The file loads with the real loaders: [cli], [agent], [alerts] (with ``secrets``
    as the environment)."""
    path = tmp / "config.toml"
    path.write_text(text)
    tables = tomllib.loads(text)
    problems = [f"{name}: [{t}] is read by no fleetcare code"
                for t in sorted(set(tables) - {"cli", "agent", "alerts"})]
    try:
        if "cli" in tables:
            load_settings(api_cli.Settings, section="cli", path=path, env={})
        if "agent" in tables:
            cfg = load_settings(agent_cli.AgentConfig, section="agent", path=path, env={})
            problems += [f"{name}: {p}" for p in backend_problems(cfg.backend)]
        if "alerts" in tables:
            alerts_config.parse(tables["alerts"], env=secrets)
    except ValueError as exc:
        problems.append(f"{name}: {exc}")
    return problems


# -- the tests -------------------------------------------------------------------------------------
def test_the_deploy_files_exist() -> None:
    assert [p.name for p in MANIFESTS] == sorted(EXPECTED_KINDS)
    assert [p.name for p in UNITS] == sorted(EXPECTED_UNITS)
    assert [p.name for p in CONTAINERFILES] == sorted(EXPECTED_IMAGES)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_kinds_and_fields(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert Counter(d["kind"] for d in docs) == Counter(EXPECTED_KINDS[path.name])
    for doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"]
        if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"].get("namespace") == "fleetcare", _label(doc)
    assert [f for doc in docs for f in unknown_fields(doc)] == []


def test_manifest_command_lines_use_real_subcommands_and_flags() -> None:
    docs = load_manifests(manifest_texts())
    found = list(manifest_invocations(docs))
    problems = [p for *_, inv in found for p in invocation_problems(inv)]
    assert problems == []
    paths = {command_path(inv.program, inv.argv)[0] for *_, inv in found}
    assert paths >= {("fleetcare-agent",), ("fleetcare", "serve"), ("fleetcare", "ingest"),
                     ("fleetcare", "tokens", "create")}


def test_manifest_paths_lie_on_the_right_volumes() -> None:
    assert mount_problems(load_manifests(manifest_texts())) == []


def test_manifest_references_resolve() -> None:
    assert reference_problems(load_manifests(manifest_texts())) == []


def test_containerized_serve_binds_all_addresses_and_is_probed() -> None:
    assert serve_problems(load_manifests(manifest_texts())) == []


def test_images_expose_the_ports_their_containers_declare() -> None:
    built = images()
    problems = []
    for _, _, container, inv in manifest_invocations(load_manifests(manifest_texts())):
        repository = container["image"].rsplit("/", 1)[-1].split(":")[0]
        exposed = built[IMAGE_FILES[repository]].exposed
        problems += [f"{inv.where}: containerPort {p['containerPort']} is not EXPOSEd"
                     for p in container.get("ports", []) if p["containerPort"] not in exposed]
    assert problems == []


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_systemd_unit(path: Path) -> None:
    unit = read_unit(path.name, path.read_text())
    assert unit_problems(unit) == []
    assert [command_path(i.program, i.argv)[0] for i in unit.invocations
            if i.where.endswith("ExecStart")] == [EXPECTED_UNITS[path.name]]


def test_template_unit_uses_its_instance_name() -> None:
    text = (DEPLOY / "systemd" / "fleetcare-ingest@.service").read_text()
    inv = read_unit("fleetcare-ingest@.service", text).invocations[0]
    assert option_values(inv.argv, "--instance-id") == [f"host-1-{UNIT_INSTANCE}"]


@pytest.mark.parametrize("path", CONTAINERFILES, ids=lambda p: p.name)
def test_containerfile(path: Path) -> None:
    image = images()[path.name]
    assert image.problems == []
    assert image.installed == EXPECTED_IMAGES[path.name]


def test_fleetcare_variables_are_ones_the_code_reads() -> None:
    k8s_sinks = sink_names(list(configmap_tomls(load_manifests(manifest_texts())).values()))
    systemd_sinks = sink_names([p.read_text() for p in (DEPLOY / "systemd").glob("*.toml")])
    problems = []
    for folder, sinks in (("kubernetes", k8s_sinks), ("systemd", systemd_sinks),
                          ("containers", [])):
        known = known_variables(sinks)
        for path in sorted((DEPLOY / folder).iterdir()):
            problems += variable_problems(f"{folder}/{path.name}", path.read_text(), known)
    assert problems == []


def test_config_files_load(tmp_path: Path) -> None:
    docs = load_manifests(manifest_texts())
    secrets = {k: str(v) for s in _by_kind(docs, "Secret").values()
               for k, v in (s.get("stringData") or {}).items()}
    problems = []
    for name, text in configmap_tomls(docs).items():
        problems += config_problems(name, text, secrets, tmp_path)
    for path in sorted((DEPLOY / "systemd").glob("*.toml")):
        text = path.read_text()
        # the secrets come from /etc/fleetcare/serve.env on the host
        placeholders = {alerts_config.env_name(s) + k: "https://example.invalid/x"
                        for s in sink_names([text]) for k in ("URL", "ROUTING_KEY", "SECRET")}
        problems += config_problems(path.name, text, placeholders, tmp_path)
    assert problems == []


def test_serve_db_matches_the_configured_db() -> None:
    docs = load_manifests(manifest_texts())
    configured = {tomllib.loads(t).get("cli", {}).get("db") for t in configmap_tomls(docs).values()}
    for *_, inv in manifest_invocations(docs):
        if command_path(inv.program, inv.argv)[0][:2] == ("fleetcare", "serve"):
            assert set(option_values(inv.argv, "--db")) <= configured, inv.where


def test_commands_in_comments_are_real() -> None:
    """The install steps in the files' comments (first admin token, ...) run as written."""
    found = [inv for folder in ("systemd", "kubernetes", "containers")
             for path in sorted((DEPLOY / folder).iterdir())
             for inv in comment_invocations(f"{folder}/{path.name}", path.read_text())]
    assert [p for inv in found for p in invocation_problems(inv)] == []
    assert {command_path(inv.program, inv.argv)[0] for inv in found} >= {
        ("fleetcare", "tokens", "create"), ("fleetcare", "ingest")}


# -- the checks catch mistakes ---------------------------------------------------------------------
def _replace_in_code(text: str, old: str, new: str) -> str:
    """``text`` with the first ``old`` outside comment lines replaced."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if old in line and not line.lstrip().startswith("#"):
            lines[i] = line.replace(old, new, 1)
            return "".join(lines)
    raise AssertionError(f"{old!r} is not in the file (outside comments)")


def _mutated(name: str, old: str, new: str) -> dict[str, str]:
    texts = manifest_texts()
    texts[name] = _replace_in_code(texts[name], old, new)
    return texts


def _caught(problems: list[str], expected: str) -> bool:
    return any(expected in p for p in problems)


@pytest.mark.parametrize(("name", "old", "new", "expected"), [
    ("fleetcare-service.yaml", "  - --instance-id=", "  - --instance-idd=", "--instance-idd"),
    ("fleetcare-service.yaml", "--exit-when-idle", "--exit-when-idel", "--exit-when-idel"),
    ("fleetcare-service.yaml", "tokens create", "tokens creat", "'creat'"),
    ("fleetcare-ingest.yaml", "--flush-interval=", "--flush-intervall=", "--flush-intervall"),
    ("fleetcare-ingest.yaml", "--metrics-port=", "--metrics-por=", "--metrics-por;"),
    ("fleetcare-agent-daemonset.yaml", "--spool-dir=", "--spool-dirs=", "--spool-dirs"),
    ("fleetcare-ingest.yaml", "$(POD_NAME)", "$(POD_NAM)", "$(POD_NAM)"),
    ("fleetcare-service.yaml", "  - --bus=kafka", "  - --lake=/x\n            - --bus=kafka",
     "not allowed with argument --lake"),
])
def test_a_misspelled_command_line_is_caught(name: str, old: str, new: str,
                                             expected: str) -> None:
    docs = load_manifests(_mutated(name, old, new))
    assert _caught([p for *_, inv in manifest_invocations(docs) for p in invocation_problems(inv)],
                   expected)


@pytest.mark.parametrize(("unit", "old", "new", "expected"), [
    ("fleetcare-ingest@.service", "--flush-interval", "--flush-intervall", "--flush-intervall"),
    ("fleetcare-serve.service", "--topic-prefix", "--topic-prefx", "--topic-prefx"),
    ("fleetcare-serve.service", "${KAFKA_GROUP}", "${KAFKA_GRUOP}", "KAFKA_GRUOP"),
    ("fleetcare-agent.service", "--spool-dir", "--spool-dri", "--spool-dri"),
    ("fleetcare-serve-lake.service", "--lake /srv/fleetcare/lake", "--lake /data/lake",
     "--lake /data/lake is not writable"),
    ("fleetcare-serve.service", "--db /var/lib/fleetcare/", "--db /var/lib/fleetcar/",
     "is not writable"),
    ("fleetcare-serve.service", "ProtectSystem=strict", "ProtectSystem=full",
     "ProtectSystem=strict is missing"),
])
def test_a_wrong_unit_is_caught(unit: str, old: str, new: str, expected: str) -> None:
    text = _replace_in_code((DEPLOY / "systemd" / unit).read_text(), old, new)
    assert _caught(unit_problems(read_unit(unit, text)), expected)


@pytest.mark.parametrize(("name", "old", "new", "expected"), [
    ("fleetcare-service.yaml", "- --db=/var/lib/fleetcare/", "- --db=/data/",
     "no volume is mounted"),
    ("fleetcare-ingest.yaml", "mountPath: /srv/fleetcare/lake", "mountPath: /lake",
     "no volume is mounted"),
    ("fleetcare-ingest.yaml", "accessModes: [ReadWriteMany]", "accessModes: [ReadWriteOnce]",
     "not ReadWriteMany"),
    ("fleetcare-service.yaml", "type: Recreate", "type: RollingUpdate", "strategy Recreate"),
    ("fleetcare-service.yaml", "value: /etc/fleetcare/fleetcare.toml",
     "value: /etc/fleetcare/x.toml", "not a ConfigMap with that key"),
])
def test_a_wrong_mount_is_caught(name: str, old: str, new: str, expected: str) -> None:
    assert _caught(mount_problems(load_manifests(_mutated(name, old, new))), expected)


def test_other_mistakes_are_caught(tmp_path: Path) -> None:
    known = known_variables(["ops-slack"])
    wrong = variable_problems("x", "FLEETCARE_CLI_DBB=1 FLEETCARE_AGENT_<KEY>", known)
    assert [p.split(" is ")[0] for p in wrong] == ["x: FLEETCARE_CLI_DBB"]
    assert not variable_problems("x", "FLEETCARE_CLI_DB FLEETCARE_ALERTS_OPS_SLACK_URL", known)
    assert variable_problems("x", "FLEETCARE_ALERTS_PAGER_ROUTING_KEY", known)
    assert unknown_fields(yaml.safe_load(_mutated(
        "fleetcare-ingest.yaml", "podManagementPolicy", "podManagementPolicyy")
        ["fleetcare-ingest.yaml"].split("---")[-1]))
    assert reference_problems(load_manifests(_mutated(
        "fleetcare-service.yaml", "claimName: fleetcare-state", "claimName: fleetcare-stat")))
    assert serve_problems(load_manifests(_mutated(
        "fleetcare-service.yaml", "- --host=0.0.0.0", "- --host=127.0.0.1")))
    assert config_problems("x", "[cli]\nprot = 1\n", {}, tmp_path)
    assert config_problems("x", '[agent]\nbackend = "nvml,infiniban"\n', {}, tmp_path)
    agent = (DEPLOY / "systemd" / "fleetcare-agent.service").read_text()
    assert unit_problems(read_unit("x", agent.replace(",infiniband ", ",infiniban ")))
    assert config_problems("x", '[alerts]\n[[alerts.sinks]]\nname = "s"\nkind = "slack"\n',
                           {}, tmp_path)
    service = (DEPLOY / "containers" / "Containerfile.service").read_text()
    patterns = ignore_patterns(DEPLOY / "containers" / "Containerfile.service")
    for old, new in (("COPY models/", "COPY model/"), ('["fleetcare"]', '["fleetcare-api"]'),
                     ("USER 10001:10001", "USER root")):
        assert read_containerfile("x", service.replace(old, new), patterns).problems, old
    assert read_containerfile("x", service, patterns + ["models/src"]).problems
    unit = (DEPLOY / "systemd" / "fleetcare-serve.service").read_text()
    steps = comment_invocations("x", unit.replace("--scope admin", "--scop admin"))
    assert _caught([p for inv in steps for p in invocation_problems(inv)], "--scop;")


def test_example_alerts_fire_at_the_scoring_models_operating_point(tmp_path: Path) -> None:
    """The example configs alert where the README's prediction figures are measured: at
    the scoring model's operating point (``threshold = "model"``), which on a new
    database is the shipped prior's threshold held for its ``hold_h``, or its immediate
    risk at once."""
    from fleetcare.api.alerts import AlertEngine
    from fleetcare.models import prior
    from fleetcare.pipeline.store import Store

    meta = prior.load()[1]
    docs = load_manifests(manifest_texts())
    texts = {**configmap_tomls(docs),
             **{p.name: p.read_text() for p in sorted((DEPLOY / "systemd").glob("*.toml"))}}
    checked = 0
    store = Store(tmp_path / "new.duckdb")
    try:
        prior.ensure_current(store)
        for name, text in texts.items():
            table = tomllib.loads(text).get("alerts")
            if table is None:
                continue
            # as the service reads it (the sinks, whose secrets are not here, left out)
            cfg = alerts_config.parse({k: v for k, v in table.items() if k != "sinks"}, env={})
            checked += 1
            assert cfg.from_model, name
            rule = AlertEngine.from_config(store, cfg).current_rule()
            assert (rule.threshold, rule.for_s, rule.immediate) == (
                meta["threshold"], meta["hold_h"] * 3600, meta["immediate"]), name
    finally:
        store.close()
    assert checked >= 2
