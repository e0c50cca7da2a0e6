"""Job configuration: a TOML file and command-line flags, validated into dataclasses (pure).

A job file has the sections ``[store]``, ``[model]``, ``[engine]``, ``[cluster]``,
``[checkpoint]``, ``[validation]``, ``[output]`` and ``[logging]`` (see ``cluster/job.toml``).
``[model]``, ``[engine]``, ``[checkpoint]`` and ``[validation]`` are the typed settings sections
of :mod:`ordnmf_dask.params` (keys, types, defaults and rules from its table), ``[model]`` with
the job-only ``kind``, ``init`` and ``init_model`` (:class:`ModelChoice`). Flags the user
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

from ordnmf_dask import params
from ordnmf_dask.app.exits import JOB_INPUTS, JOB_OUTPUTS
from ordnmf_dask.app.parser import job_keys
from ordnmf_dask.errors import ConfigError, InputError
from ordnmf_dask.sources.infile import read_input_bytes
from ordnmf_dask.store.locations import named

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
CLUSTER_MODES = ("local", "scheduler", "scheduler_file")
COMMAND_LINE = "command line"


@dataclass
class StoreSection:
    path: str | None = None


@dataclass(frozen=True, kw_only=True)
class ModelChoice:
    """The job-only keys of ``[model]``: which model (``--model``) and its warm start
    (``--init FILE``, ``--init-model MODEL``)."""

    kind: str = "ordnmf"
    init: str | None = None
    init_model: str | None = None


@dataclass(frozen=True, kw_only=True)
class ModelSection(params.ModelSettings, ModelChoice):
    """``[model]``: the job-only keys of :class:`ModelChoice`, then the model settings of the
    table (:class:`~ordnmf_dask.params.ModelSettings`)."""


#: the job file's sections of table rows -> their typed settings class (the table's, and
#: [model] with its job-only keys); their keys and defaults are the table's rows
TABLE_SECTIONS: dict[str, type] = {**params.SECTION_CLASSES, "model": ModelSection}


def _table_section(name: str) -> Any:
    return field(default_factory=lambda: TABLE_SECTIONS[name](**params.section_defaults(name)))


@dataclass
class LocalSpec:
    """A LocalCluster started by the job; ``memory_limit`` None means Dask's "auto"; workers
    and threads None: one process, the cores shared among the processes
    (:func:`~ordnmf_dask.runtime.cluster.local_layout`)."""

    workers: int | None = None
    threads_per_worker: int | None = None
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
    model: ModelSection = _table_section("model")
    engine: params.EngineSettings = _table_section("engine")
    cluster: ClusterSection = field(default_factory=ClusterSection)
    checkpoint: params.CheckpointSettings = _table_section("checkpoint")
    validation: params.ValidationSettings = _table_section("validation")
    output: OutputSection = field(default_factory=OutputSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what is stored with the model as ``resolved_config``."""
        return dataclasses.asdict(self)


def _section_classes() -> dict[str, type]:
    hints = typing.get_type_hints(JobConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(JobConfig) if f.name != "source"}


def param_keys() -> dict[str, str]:
    """Estimator parameter -> its dotted job-file key (``checkpoint_every`` ->
    ``checkpoint.every``); the flag of a parameter has the parameter's name as destination."""
    return {p.name: f"{p.section}.{p.key}" for p in params.PARAMS.values()}


def flag_keys() -> dict[str, str]:
    """argparse destination -> dotted config key, for every flag that sets a job value: the
    job settings that are not estimator parameters (store, model kind, warm start, cluster,
    output, log file) as ``fit``'s flags declare them, then one per parameter."""
    return {**job_keys("fit"), **param_keys()}


def read_toml(path: str) -> dict[str, Any]:
    """The raw tables of a TOML file (read by the one opener of inputs, at most
    :data:`~ordnmf_dask.sources.infile.SMALL_FILE` bytes); ConfigError naming the file if
    unreadable or invalid, or nested deeper than the parser's recursion allows."""
    try:
        data = read_input_bytes(path, "job file")
    except InputError as exc:
        if str(exc) == f"{path}: no such file":
            raise ConfigError(f"{path}: config file not found") from None
        raise ConfigError(str(exc)) from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not a valid TOML file (not UTF-8: byte {exc.start} is "
            f"0x{exc.object[exc.start]:02x})"
        ) from None
    except RecursionError:
        raise ConfigError(
            f"{path}: not a valid TOML file (arrays or tables nested too deeply)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not a valid TOML file ({exc})") from None


def flag_overrides(flags: dict[str, Any]) -> dict[str, Any]:
    """Dotted config keys for the flags that were given (argparse default None = not given).

    ``--debug`` sets the level; ``-q`` does not: it quiets stderr only, the log file keeps it."""
    out = {key: flags[dest] for dest, key in flag_keys().items() if flags.get(dest) is not None}
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
    known = _section_classes()
    for name, value in raw.items():
        if name not in known:
            raise ConfigError(f"{source}: unknown section [{name}] (known: {', '.join(known)})")
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: [{name}] must be a table, got {type(value).__name__}")
        sections[name] = _section(known[name], value, name, origin)
    cfg = JobConfig(**sections, source=None if source == COMMAND_LINE else source)
    _check_values(cfg, origin)
    return cfg


def estimator_kwargs(cfg: JobConfig, estimator: str) -> tuple[dict[str, Any], list[str]]:
    """The keyword arguments of the estimator class named ``estimator`` from ``cfg``; also the
    keys set to a non-default value that this estimator does not take."""
    kwargs, unused = {}, []
    for name, key in param_keys().items():
        value = _get(cfg, key)
        if estimator in params.PARAMS[name].estimators:
            kwargs[name] = value
        elif value != params.DEFAULTS[name]:
            unused.append(key)
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
    table_params = {p.key: p.name for p in params.PARAMS.values() if p.section == name}
    for key, value in table.items():
        dotted, shown = f"{name}.{key}", f"{prefix}.{key}" if prefix else key
        if key not in known:
            raise ConfigError(
                f"{origin(dotted)}: unknown key '{shown}' in [{section}] "
                f"(known: {', '.join(known)})"
            )
        if key in table_params:  # the table's rule, as the estimator checks it
            param = table_params[key]
            wrong = params.problem(param, value)
            if wrong is not None and origin(dotted) == COMMAND_LINE:  # a flag: named as typed
                raise ConfigError(f"{COMMAND_LINE}: {params.PARAMS[param].flag} {wrong}")
            if wrong is not None:
                raise ConfigError(f"{origin(dotted)}: key '{shown}' in [{section}] {wrong}")
            values[key] = params.convert(param, value)
            continue
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
    if name in params.SECTIONS:  # a typed section of the table: the rows not given, defaults
        values = {**params.section_defaults(name), **values}
    return cls(**values)


def _members(hint: Any) -> tuple[Any, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(a for a in typing.get_args(hint) if a is not type(None))
    return (hint,)


def _dataclass_in(hint: Any) -> type | None:
    return next(
        (m for m in _members(hint) if isinstance(m, type) and dataclasses.is_dataclass(m)), None
    )


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


def _check_values(cfg: JobConfig, origin: Any) -> None:
    def fail(key: str, message: str) -> None:
        section, _, leaf = key.partition(".")
        raise ConfigError(f"{origin(key)}: key '{leaf}' in [{section}] {message}")

    for key in (*JOB_INPUTS, *JOB_OUTPUTS):  # a path of the file names a file
        value = _get(cfg, key)
        if isinstance(value, str) and origin(key) != COMMAND_LINE:  # a flag: named as typed
            try:
                named(value)
            except InputError as exc:
                fail(key, str(exc))
    m, c = cfg.model, cfg.cluster
    if m.kind not in params.MODELS:
        fail("model.kind", f"must be one of {', '.join(params.MODELS)}, got {m.kind!r}")
    given = [mode for mode in CLUSTER_MODES if getattr(c, mode) is not None]
    if len(given) > 1:
        fail(
            f"cluster.{given[1]}",
            f"conflicts with '{given[0]}': give only one of {', '.join(CLUSTER_MODES)}",
        )
    spec = c.local_spec
    if spec.workers is not None and spec.workers < 1:
        fail("cluster.local.workers", f"must be >= 1, got {spec.workers}")
    if spec.threads_per_worker is not None and spec.threads_per_worker < 1:
        fail("cluster.local.threads_per_worker", f"must be >= 1, got {spec.threads_per_worker}")
    if spec.memory_limit is not None and spec.memory_limit != "auto":
        from dask.utils import parse_bytes

        from ordnmf_dask.runtime.memory import worker_limit_problem

        try:
            limit = parse_bytes(spec.memory_limit)
        except (ValueError, TypeError):
            limit = 0
        if limit <= 0:
            fail(
                "cluster.local.memory_limit",
                f"must be 'auto' or a size like '4GB', got {spec.memory_limit!r}",
            )
        wrong = worker_limit_problem(limit)
        if wrong is not None:  # a worker paused before its first task: the fit would hang
            fail("cluster.local.memory_limit", f"= {spec.memory_limit!r} {wrong}")
    if bool(c.cert) != bool(c.key):
        fail("cluster.cert", "and 'key' must be given together")
    if c.cert and not c.ca_file:
        fail("cluster.ca_file", "is required with 'cert' and 'key'")
    level = cfg.logging.level.upper()
    if level not in LOG_LEVELS:
        fail("logging.level", f"must be one of {', '.join(LOG_LEVELS)}, got {cfg.logging.level!r}")
    cfg.logging.level = level
