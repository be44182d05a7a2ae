"""The validated config of a registered method (registry layer): the full key table (the core's keys of
:mod:`fedpers.core.schema`, then each registered method's and extension's own ``KEYS``, in registry order) plus
the checks that need the registry (the method's name, what JDFL can wrap, which methods need Ds).

Apps, tests and benchmarks build configs here; the core (data, models, training) and the methods read
``fedpers.core.schema.Config`` and never import this module.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Iterable, Mapping

import functools

from fedpers.core.errors import ConfigError, shown
from fedpers.registry.methods import EXTENSIONS, METHODS
from fedpers.core.schema import (CORE_KEYS, Config, Key, Schema, Value, coerce_value,  # noqa: F401 (re-exported)
                            load_yaml, parse_id_list, parse_set_arguments, read_config_file, read_yaml_text)

_CORE_BY_NAME = {key.name: key for key in CORE_KEYS}


def check_method(values: Mapping[str, Value]) -> None:
    """``method`` names a registered method (with the closest name as a hint)."""
    name = str(values["method"])
    if name not in METHODS:
        close = difflib.get_close_matches(name, list(METHODS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"config key 'method': unknown method {shown(name)}{hint}; known: {', '.join(sorted(METHODS))}")


def check_method_combinations(values: Mapping[str, Value]) -> None:
    """An extension (JDFL) wraps only the methods its ``ExtensionSpec.wraps`` names; a method that needs Ds
    needs aux_size > 0."""
    spec = METHODS[str(values["method"])]
    for extension in EXTENSIONS:
        if extension.applies(values) and spec.name not in extension.wraps:
            raise ConfigError(f"config key '{extension.name}': {extension.name.upper()} wraps only "
                              f"{', '.join(extension.wraps)}, not method '{spec.name}'")
    if spec.needs_aux and values["aux_size"] == 0 and values["partition"] != "file":
        raise ConfigError(
            f"config key 'aux_size': method '{spec.name}' needs the server's auxiliary set Ds; set aux_size > 0"
        )


METHOD_CHECKS = (check_method, check_method_combinations)


@functools.cache
def full_schema() -> Schema:
    """The run's key table: section ``core`` (:data:`fedpers.core.schema.CORE_KEYS`), then one section per
    registered method and extension that declares keys, named after it; a name declared twice is an error."""
    sections = [("core", CORE_KEYS)]
    sections += [(spec.name, spec.own_keys()) for spec in METHODS.values() if spec.keys]
    sections += [(ext.name, ext.own_keys()) for ext in EXTENSIONS if ext.keys]
    return Schema(tuple(sections), checks=METHOD_CHECKS, owners_read=owners_read)


def owners_read(values: Mapping[str, Value]) -> set[str]:
    """The key table's sections a run with ``values`` reads: the core's, its method's and those of the
    extensions it switches on."""
    return {"core", str(values["method"])} | {ext.name for ext in EXTENSIONS if ext.applies(values)}


def all_keys() -> tuple[Key, ...]:
    """Every config key, in table order."""
    return full_schema().keys


def defaults() -> dict[str, Value]:
    """Every config key with its default."""
    return full_schema().defaults()


def check_core_values(overrides: Mapping[str, Any]) -> None:
    """Each core key's type and range in ``overrides``, checked before :func:`full_schema` is assembled:
    the methods' key tables live in their math modules, which import torch (seconds), and a bad
    ``--set rounds=ten`` or ``--out ""`` should be refused without that."""
    for name, raw in overrides.items():
        key = _CORE_BY_NAME.get(name)
        if key is None:
            continue
        value = coerce_value(key, raw)
        problem = key.check(value) if key.check is not None else None
        if problem:
            raise ConfigError(f"config key '{key.name}': {problem}, got {shown(value)}")


def core_value(name: str, raw: Any) -> Value:
    """The value of core key ``name`` that ``raw`` (a ``--set`` text, a YAML value) gives, its type and range
    checked as :func:`check_core_values` does (without torch)."""
    check_core_values({name: raw})
    return coerce_value(_CORE_BY_NAME[name], raw)


def build_config(overrides: Mapping[str, Any], base: Mapping[str, Value] | None = None) -> Config:
    """Validate ``overrides`` on ``base`` (default: the defaults) against :func:`full_schema`: one
    ConfigError line naming the key for an unknown key, a wrong type, a value out of range or a method
    that is not registered."""
    check_core_values(overrides)
    return full_schema().build(overrides, base)


def ignored_key_names(cfg: Config, given: Iterable[str]) -> list[str]:
    """Those of ``given`` that the run ignores: another method's own keys (``ditto_lambda`` on a FedAvg
    run) and an extension's while it is off (its switch aside)."""
    unread = cfg.unread_keys()
    switches = {ext.name for ext in EXTENSIONS}
    return [name for name in given if name in unread and name not in switches]


def ignored_keys(cfg: Config, given: Iterable[str]) -> list[str]:
    """:func:`ignored_key_names` of ``given`` (keys a user set), each as ``"key (owner)"``."""
    schema = full_schema()
    return [f"{name} ({schema.by_name[name].readers() or schema.owner_of[name]})"
            for name in ignored_key_names(cfg, given)]


def load_config(path: str | Path | None = None, sets: list[str] | None = None, *,
                shared: list[str] | None = None, **extra: Any) -> Config:
    """Schema defaults, then ``shared`` (``--shared key=value``: a sweep's base, common to runs of several
    methods), then the YAML file, then ``--set`` overrides, then ``extra``; validated."""
    overrides: dict[str, Any] = dict(parse_set_arguments(shared or []))
    if path is not None:
        overrides.update(load_yaml(path))
    overrides.update(parse_set_arguments(sets or []))
    overrides.update(extra)
    cfg = build_config(overrides)
    if cfg.partition == "file":
        # num_clients comes from the file; an explicitly given different value is an error.
        from fedpers.core.partition import count_partition_clients

        in_file = count_partition_clients(cfg.partition_file)
        if cfg.num_clients != in_file:
            if "num_clients" in overrides:
                raise ConfigError(f"config key 'num_clients': {cfg.num_clients} given, but partition file "
                                  f"{cfg.partition_file} has {in_file} clients")
            cfg = cfg.replace(num_clients=in_file)
    return cfg


def from_run_config(run_config: Mapping[str, Any]) -> Config:
    """Build a Config from a Flower run-config (keys not in the schema are an error)."""
    return build_config(dict(run_config))
