"""Job configuration: a TOML file and command-line flags, validated into dataclasses (pure).

A job file has the sections ``[store]``, ``[model]``, ``[engine]``, ``[cluster]``,
``[checkpoint]``, ``[output]`` and ``[logging]`` (see ``cluster/job.toml``). Flags the user
actually gave override the file; every value is checked for its key and type, and an error names
the file (or "command line") and the key.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from dask.utils import parse_bytes

from ordnmf_dask.errors import ConfigError

CACHE_CHOICES = ("auto", "on", "off")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
CLUSTER_MODES = ("local", "scheduler", "scheduler_file")
COMMAND_LINE = "command line"



@dataclass
class StoreSection:
    path: str | None = None


@dataclass
class ModelSection:
    kind: str = "ordnmf"  # ordnmf | bepof | pf | dcpf
    n_components: int | None = None
    alpha_W: float = 0.3
    alpha_H: float = 0.3
    tol: float = 1e-5
    max_iter: int = 1000
    min_iter: int = 0
    seed: int = 0
    approx: bool = False
    threshold: int = 1  # bepof / pf: binarize classes >= threshold
    p: float = 0.5  # dcpf: starting element parameter
    init: str | None = None


@dataclass
class EngineSection:
    cache: str = "auto"
    work_dir: str | None = None


@dataclass
class LocalSpec:
    """A LocalCluster started by the job; ``memory_limit`` None means Dask's "auto"."""

    workers: int = 2
    threads_per_worker: int = 1
    memory_limit: str | int | None = None


@dataclass
class ClusterSection:
    """One of ``local``, ``scheduler`` (address) or ``scheduler_file``; TLS files optional."""

    local: LocalSpec | None = None
    scheduler: str | None = None
    scheduler_file: str | None = None
    ca_file: str | None = None
    cert: str | None = None
    key: str | None = None
    require_encryption: bool | None = None

    @property
    def mode(self) -> str:
        if self.scheduler is not None:
            return "scheduler"
        return "scheduler_file" if self.scheduler_file is not None else "local"

    @property
    def local_spec(self) -> LocalSpec:
        return self.local or LocalSpec()

    @property
    def uses_tls(self) -> bool:
        return bool(self.ca_file or self.cert or self.key or self.require_encryption)


@dataclass
class CheckpointSection:
    dir: str | None = None
    every_iterations: int | None = None
    every_minutes: float | None = None


@dataclass
class OutputSection:
    model: str | None = None
    overwrite: bool = False


@dataclass
class LoggingSection:
    level: str = "INFO"
    file: str | None = None


@dataclass
class JobConfig:
    """A resolved job: file values, then flags, then defaults."""

    store: StoreSection = field(default_factory=StoreSection)
    model: ModelSection = field(default_factory=ModelSection)
    engine: EngineSection = field(default_factory=EngineSection)
    cluster: ClusterSection = field(default_factory=ClusterSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    output: OutputSection = field(default_factory=OutputSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what is stored with the model as ``resolved_config``."""
        return dataclasses.asdict(self)


SECTIONS: dict[str, type] = {
    f.name: typing.get_type_hints(JobConfig)[f.name]
    for f in dataclasses.fields(JobConfig) if f.name != "source"
}

# argparse destination -> dotted config key (only flags the user gave are applied).
FLAG_KEYS: dict[str, str] = {
    "store": "store.path",
    "n_components": "model.n_components",
    "alpha_w": "model.alpha_W",
    "alpha_h": "model.alpha_H",
    "tol": "model.tol",
    "max_iter": "model.max_iter",
    "min_iter": "model.min_iter",
    "seed": "model.seed",
    "approx": "model.approx",
    "model_kind": "model.kind",
    "threshold": "model.threshold",
    "p": "model.p",
    "init": "model.init",
    "cache": "engine.cache",
    "work_dir": "engine.work_dir",
    "checkpoint_dir": "checkpoint.dir",
    "checkpoint_every": "checkpoint.every_iterations",
    "checkpoint_minutes": "checkpoint.every_minutes",
    "scheduler": "cluster.scheduler",
    "scheduler_file": "cluster.scheduler_file",
    "workers": "cluster.local.workers",
    "threads_per_worker": "cluster.local.threads_per_worker",
    "memory_limit": "cluster.local.memory_limit",
    "tls_ca_file": "cluster.ca_file",
    "tls_cert": "cluster.cert",
    "tls_key": "cluster.key",
    "out": "output.model",
    "overwrite": "output.overwrite",
    "log_file": "logging.file",
}

# config key -> OrdNMF keyword argument (passed only if the estimator accepts it).
ESTIMATOR_KEYS: dict[str, str] = {
    "model.n_components": "n_components",
    "model.alpha_W": "alpha_W",
    "model.alpha_H": "alpha_H",
    "model.tol": "tol",
    "model.max_iter": "max_iter",
    "model.min_iter": "min_iter",
    "model.seed": "random_state",
    "model.approx": "approx",
    "model.threshold": "threshold",
    "model.p": "p",
    "engine.work_dir": "work_dir",
    "checkpoint.dir": "checkpoint_dir",
    "checkpoint.every_iterations": "checkpoint_every",
    "checkpoint.every_minutes": "checkpoint_minutes",
}


def read_toml(path: str) -> dict[str, Any]:
    """The raw tables of a TOML file; ConfigError naming the file if unreadable or invalid."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a valid TOML file (not UTF-8: byte {exc.start} is "
                          f"0x{exc.object[exc.start]:02x})") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not a valid TOML file ({exc})") from None


def flag_overrides(flags: dict[str, Any]) -> dict[str, Any]:
    """Dotted config keys for the flags that were given (argparse default None = not given).

    ``--debug`` sets the level; ``-q`` does not: it quiets stderr only, the log file keeps it."""
    out = {key: flags[dest] for dest, key in FLAG_KEYS.items() if flags.get(dest) is not None}
    if flags.get("debug"):
        out["logging.level"] = "DEBUG"
    return out


def resolve(path: str | None, overrides: dict[str, Any] | None = None) -> JobConfig:
    """Read ``path`` (if any), apply dotted-key ``overrides``, validate, fill defaults."""
    raw = read_toml(path) if path else {}
    return build(raw, overrides or {}, path or COMMAND_LINE)


def build(raw: dict[str, Any], overrides: dict[str, Any], source: str) -> JobConfig:
    """Validate file tables ``raw`` (from ``source``) merged with ``overrides`` (flags)."""
    raw = _merge(raw, overrides)
    origin = lambda key: COMMAND_LINE if key in overrides else source  # noqa: E731
    sections: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in SECTIONS:
            raise ConfigError(f"{source}: unknown section [{name}] (known: {', '.join(SECTIONS)})")
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: [{name}] must be a table, got {type(value).__name__}")
        sections[name] = _section(SECTIONS[name], value, name, origin)
    cfg = JobConfig(**sections, source=None if source == COMMAND_LINE else source)
    _check_values(cfg, origin)
    return cfg


def estimator_kwargs(cfg: JobConfig, accepted: list[str]) -> tuple[dict[str, Any], list[str]]:
    """OrdNMF keyword arguments from ``cfg`` (None values left to the estimator's defaults);
    also the keys set to a non-default value that the estimator does not accept."""
    kwargs, unused, default = {}, [], JobConfig()
    for key, arg in ESTIMATOR_KEYS.items():
        value = _get(cfg, key)
        if arg in accepted:
            if value is not None:
                kwargs[arg] = value
        elif value != _get(default, key):
            unused.append(key)
    if "cache_blocks" in accepted:
        kwargs["cache_blocks"] = {"auto": "auto", "on": True, "off": False}[cfg.engine.cache]
    if "n_workers" in accepted:
        kwargs["n_workers"] = cfg.cluster.local_spec.workers
    return kwargs, unused


def _merge(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    cluster_modes = {k.split(".")[1] for k in overrides if k.startswith("cluster.")} & set(
        CLUSTER_MODES
    )
    if len(cluster_modes) > 1:
        raise ConfigError(
            f"{COMMAND_LINE}: give only one of --scheduler, --scheduler-file and the local "
            "cluster flags (--workers, --threads-per-worker, --memory-limit)"
        )
    if cluster_modes and isinstance(out.get("cluster"), dict):
        for mode in set(CLUSTER_MODES) - cluster_modes:  # a mode given as a flag wins
            out["cluster"].pop(mode, None)
    for key, value in overrides.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        node[leaf] = value
    return out


def _section(cls: type, table: dict[str, Any], name: str, origin: Any) -> Any:
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    values = {}
    section, _, prefix = name.partition(".")
    for key, value in table.items():
        dotted, shown = f"{name}.{key}", f"{prefix}.{key}" if prefix else key
        if key not in known:
            raise ConfigError(
                f"{origin(dotted)}: unknown key '{shown}' in [{section}] "
                f"(known: {', '.join(known)})"
            )
        hint = hints[key]
        sub = _dataclass_in(hint)
        if sub is not None and isinstance(value, dict):
            values[key] = _section(sub, value, dotted, origin)
            continue
        if not _matches(value, hint):
            raise ConfigError(
                f"{origin(dotted)}: key '{shown}' in [{section}] must be "
                f"{_describe(hint)}, got {type(value).__name__} {value!r}"
            )
        values[key] = float(value) if float in _members(hint) and type(value) is int else value
    return cls(**values)


def _members(hint: Any) -> tuple[Any, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(a for a in typing.get_args(hint) if a is not type(None))
    return (hint,)


def _dataclass_in(hint: Any) -> type | None:
    return next((m for m in _members(hint) if dataclasses.is_dataclass(m)), None)


def _matches(value: Any, hint: Any) -> bool:
    for m in _members(hint):
        if m is bool and type(value) is bool:
            return True
        if m is int and type(value) is int:
            return True
        if m is float and type(value) in (int, float):
            return True
        if m is str and type(value) is str:
            return True
    return False


def _describe(hint: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    return " or ".join(names.get(m, "a table") for m in _members(hint))


def _get(cfg: JobConfig, key: str) -> Any:
    obj: Any = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


MODEL_KINDS = ("ordnmf", "bepof", "pf", "dcpf")


def _check_values(cfg: JobConfig, origin: Any) -> None:
    def fail(key: str, message: str) -> None:
        section, _, leaf = key.partition(".")
        raise ConfigError(f"{origin(key)}: key '{leaf}' in [{section}] {message}")

    m, c = cfg.model, cfg.cluster
    if m.kind not in MODEL_KINDS:
        fail("model.kind", f"must be one of {', '.join(MODEL_KINDS)}, got {m.kind!r}")
    if m.threshold < 1:
        fail("model.threshold", f"must be >= 1, got {m.threshold}")
    if not 0.0 <= m.p <= 1.0:
        fail("model.p", f"must be in [0, 1], got {m.p}")
    if m.n_components is not None and m.n_components < 1:
        fail("model.n_components", f"(K) must be >= 1, got {m.n_components}")
    for key in ("alpha_W", "alpha_H", "tol"):
        if not getattr(m, key) > 0:
            fail(f"model.{key}", f"must be > 0, got {getattr(m, key)}")
    if m.max_iter < 1 or m.min_iter < 0:
        fail("model.max_iter", "must be >= 1 (and min_iter >= 0)")
    if cfg.engine.cache not in CACHE_CHOICES:
        fail("engine.cache", f"must be one of {', '.join(CACHE_CHOICES)}, got {cfg.engine.cache!r}")
    given = [mode for mode in CLUSTER_MODES if getattr(c, mode) is not None]
    if len(given) > 1:
        fail(f"cluster.{given[1]}", f"conflicts with '{given[0]}': give only one of "
             f"{', '.join(CLUSTER_MODES)}")
    spec = c.local_spec
    if spec.workers < 1:
        fail("cluster.local.workers", f"must be >= 1, got {spec.workers}")
    if spec.threads_per_worker < 1:
        fail("cluster.local.threads_per_worker", f"must be >= 1, got {spec.threads_per_worker}")
    if spec.memory_limit is not None and spec.memory_limit != "auto":
        try:
            ok = parse_bytes(spec.memory_limit) > 0
        except (ValueError, TypeError):
            ok = False
        if not ok:
            fail("cluster.local.memory_limit",
                 f"must be 'auto' or a size like '4GB', got {spec.memory_limit!r}")
    if bool(c.cert) != bool(c.key):
        fail("cluster.cert", "and 'key' must be given together")
    if c.cert and not c.ca_file:
        fail("cluster.ca_file", "is required with 'cert' and 'key'")
    ck = cfg.checkpoint
    if ck.every_iterations is not None and ck.every_iterations < 1:
        fail("checkpoint.every_iterations", f"must be >= 1, got {ck.every_iterations}")
    if ck.every_minutes is not None and not ck.every_minutes > 0:
        fail("checkpoint.every_minutes", f"must be > 0, got {ck.every_minutes}")
    level = cfg.logging.level.upper()
    if level not in LOG_LEVELS:
        fail("logging.level", f"must be one of {', '.join(LOG_LEVELS)}, got {cfg.logging.level!r}")
    cfg.logging.level = level
