"""Each setting's default is written once, in the sections (kqp.config.models and
kqp.config.quota_sections): the IO layer's options are the sections themselves or subclasses
of them, and no dataclass in the IO layer repeats one."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest
from pydantic import BaseModel

import kqp.capture
import kqp.config.models
import kqp.config.quota_sections
import kqp.proxy
from kqp.config.models import FleetSection, KqpConfig, ProxySection
from kqp.config.section import Section
from kqp.proxy.fleet import FleetOptions
from kqp.proxy.options import ProxyOptions


def sections() -> list[type[Section]]:
    return [value for module in (kqp.config.models, kqp.config.quota_sections) for value in vars(module).values()
            if isinstance(value, type) and issubclass(value, Section) and value is not Section
            and value.__module__ == module.__name__]


def setting_names() -> set[str]:
    # KqpConfig's own fields are the sections, not settings.
    return {name for section in sections() if section is not KqpConfig for name in section.model_fields}


def io_classes() -> list[type]:
    found = []
    for package in (kqp.proxy, kqp.capture):
        for module_info in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(module_info.name)
            found += [value for value in vars(module).values()
                      if isinstance(value, type) and value.__module__ == module.__name__]
    return found


def _spellings(name: str) -> set[str]:
    # The old mirrors wrote `_s` where the sections write `_seconds`.
    return {name, name.removesuffix("_s") + "_seconds"}


def test_no_dataclass_of_the_io_layer_repeats_a_setting_with_a_default() -> None:
    settings = setting_names()
    repeated = [
        f"{cls.__module__}.{cls.__qualname__}.{field.name}"
        for cls in io_classes() if dataclasses.is_dataclass(cls)
        for field in dataclasses.fields(cls)
        if _spellings(field.name) & settings
        and (field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING)
    ]
    assert repeated == [], "settings with a default of their own outside the sections"


@pytest.mark.parametrize(("options", "section"), [(ProxyOptions, ProxySection), (FleetOptions, FleetSection)])
def test_the_options_are_their_section_with_its_defaults(options: type[BaseModel], section: type[Section]) -> None:
    assert issubclass(options, section)
    for name, field in section.model_fields.items():
        own = options.model_fields[name]
        if own.is_required():
            continue  # resolved by the caller (the fleet's brokers and instance id), no default here
        assert (own.default, own.default_factory) == (field.default, field.default_factory), name


def test_every_pydantic_model_in_the_io_layer_is_built_on_a_section() -> None:
    models = [cls for cls in io_classes() if issubclass(cls, BaseModel)]
    assert models, "the options are pydantic models"
    assert all(issubclass(cls, Section) for cls in models), models
