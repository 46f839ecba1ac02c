"""The GpuShareConfig API: strict decoding, defaults, validation, and the JSON Schema."""

import gc
import json
import time
from pathlib import Path

import jsonschema
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dra_driver.config import ConfigError, GpuShareConfig, decode

SCHEMA = json.loads((Path(__file__).parents[2] / "api/gpushare.dev/v1alpha1/gpushareconfig.schema.json").read_text())
HEAD = {"apiVersion": "gpushare.dev/v1alpha1", "kind": "GpuShareConfig"}


def test_defaults_and_quantities():
    assert decode(dict(HEAD)) == GpuShareConfig(None, None, "Hard")
    assert decode({**HEAD, "memoryLimit": "4Gi", "computeLimit": 30}) == GpuShareConfig(4 << 30, 30, "Hard")
    assert decode({**HEAD, "memoryLimit": "1.5G"}).memory_limit == 1_500_000_000
    assert decode({**HEAD, "memoryLimit": 1024}).memory_limit == 1024


def test_config_only_lowers_limits():
    cfg = decode({**HEAD, "memoryLimit": "2Gi", "computeLimit": 50})
    assert cfg.apply(4 << 30, 30) == (2 << 30, 30)
    assert cfg.apply(1 << 30, 80) == (1 << 30, 50)
    assert GpuShareConfig().apply(123, 45) == (123, 45)


@pytest.mark.parametrize("obj, field, value", [
    ({**HEAD, "memoryLimit": "-4Gi"}, "memoryLimit", "-4Gi"),
    ({**HEAD, "memoryLimit": "4Gx"}, "memoryLimit", "4Gx"),
    ({**HEAD, "memoryLimit": "0"}, "memoryLimit", 0),
    ({**HEAD, "memoryLimit": "100m"}, "memoryLimit", "100m"),
    ({**HEAD, "memoryLimit": True}, "memoryLimit", True),
    ({**HEAD, "computeLimit": 0}, "computeLimit", 0),
    ({**HEAD, "computeLimit": 101}, "computeLimit", 101),
    ({**HEAD, "computeLimit": "30"}, "computeLimit", "30"),
    ({**HEAD, "computePolicy": "Soft"}, "computePolicy", "Soft"),
    ({**HEAD, "memorylimit": "4Gi"}, "memorylimit", "4Gi"),
    ({**HEAD, "sharingStrategy": "mps"}, "sharingStrategy", "mps"),
    ({**HEAD, "sharingStrategy": "None", "computePolicy": "Burst"}, "computePolicy", "Burst"),
    ({**HEAD, "sharingStrategy": "MPS", "computePolicy": "Burst"}, "computePolicy", "Burst"),
    ({**HEAD, "sharingStrategy": "None", "computeLimit": 30}, "computeLimit", 30),
    ({**HEAD, "apiVersion": "gpushare.dev/v9"}, "apiVersion", "gpushare.dev/v9"),
    ({**HEAD, "kind": "Other"}, "kind", "Other"),
])
def test_errors_name_field_and_value(obj, field, value):
    with pytest.raises(ConfigError) as err:
        decode(obj)
    assert err.value.field == field
    assert err.value.value == value
    assert str(err.value).startswith(f"{field}: ")
    assert repr(value) in str(err.value)


def test_not_an_object():
    with pytest.raises(ConfigError, match="expected an object"):
        decode(["not", "a", "dict"])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
plausible_values = {
    "memoryLimit": st.one_of(st.integers(-5, 10**13), st.from_regex(r"\A-?[0-9.]{0,6}(Ki|Mi|Gi|k|M|G|m|e3)?\Z"),
                             json_values),
    "computeLimit": st.one_of(st.integers(-5, 150), json_values),
    "computePolicy": st.one_of(st.sampled_from(["Hard", "Burst", "hard", ""]), json_values),
    "sharingStrategy": st.one_of(st.sampled_from(["TimeSlicing", "MPS", "None", "mps", ""]), json_values),
}
plausible_configs = st.fixed_dictionaries(
    {"apiVersion": st.sampled_from(["gpushare.dev/v1alpha1", "gpushare.dev/v1alpha1", "v1", 7]),
     "kind": st.sampled_from(["GpuShareConfig", "GpuShareConfig", "Pod"])},
    optional={**plausible_values, "extra": json_values},
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(plausible_configs, json_values))
def test_any_input_decodes_or_names_a_field(obj):
    """Never an unexpected exception: a valid config, or a ConfigError naming an input field."""
    try:
        cfg = decode(obj)
    except ConfigError as e:
        known = {"", "apiVersion", "kind"} | (set(obj) if isinstance(obj, dict) else set())
        assert e.field in known
        return
    assert cfg.memory_limit is None or cfg.memory_limit > 0
    assert cfg.compute_limit is None or 1 <= cfg.compute_limit <= 100
    assert cfg.compute_policy in ("Hard", "Burst")
    assert cfg.sharing_strategy in (None, "TimeSlicing", "MPS", "None")


@settings(max_examples=300, deadline=None)
@given(plausible_configs)
def test_schema_accepts_every_config_the_decoder_accepts(obj):
    """The published schema never rejects a config the driver would use."""
    try:
        decode(obj)
    except ConfigError:
        return
    jsonschema.validate(obj, SCHEMA)


def test_schema_rejects_what_users_get_wrong():
    for bad in [{**HEAD, "foo": 1}, {**HEAD, "computeLimit": 0}, {**HEAD, "memoryLimit": "4Gx"},
                {"kind": "GpuShareConfig"}, {**HEAD, "sharingStrategy": "mps"},
                {**HEAD, "sharingStrategy": "None", "computePolicy": "Burst"},
                {**HEAD, "sharingStrategy": "MPS", "computePolicy": "Burst"},
                {**HEAD, "sharingStrategy": "None", "computeLimit": 30}]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, SCHEMA)


def test_sharing_strategy_is_optional_and_kept_unset():
    """Unset stays None: a claim's config without it keeps its DeviceClass's choice (Prepare merges)."""
    assert decode(dict(HEAD)).sharing_strategy is None
    for strategy in ("TimeSlicing", "MPS", "None"):
        assert decode({**HEAD, "sharingStrategy": strategy}).sharing_strategy == strategy
    assert decode({**HEAD, "sharingStrategy": "None", "memoryLimit": "2Gi"}).memory_limit == 2 << 30


def test_burst_policy_is_accepted():
    """Burst (node agent: idle GPU time beyond the share) decodes and reaches the limits."""
    cfg = decode({**HEAD, "computeLimit": 30, "computePolicy": "Burst"})
    assert cfg.compute_policy == "Burst" and cfg.compute_limit == 30


# Hostile memoryLimit values: a tenant writes them into a claim's opaque parameters.
hostile_quantities = st.one_of(
    st.text(max_size=200),
    st.from_regex(r"\A[+-]?[0-9]{0,80}(\.[0-9]{0,80})?([eE][+-]?[0-9]{1,12}|[KMGTPE]i|[numkMGTPE])?\Z"),
    st.builds("{}e{}".format, st.integers(0, 10**6), st.integers(-10**12, 10**12)),
    st.builds(lambda n, suffix: "9" * n + suffix, st.integers(0, 200_000), st.sampled_from(["", "Ei", "e9", ".5"])),
    st.integers(-2**300, 2**300),
)
DECODE_BUDGET_S = 0.010  # the bound; a normal decode takes ~20 us of CPU


@settings(max_examples=200, deadline=None)
@given(st.one_of(hostile_quantities.map(lambda v: {**HEAD, "memoryLimit": v}), plausible_configs, json_values))
@example({**HEAD, "memoryLimit": "1e1000000"})  # froze the plugin for 23 s before quantities were bounded
@example({**HEAD, "memoryLimit": "1e10000000"})
@example({**HEAD, "memoryLimit": "1" * 100_000 + "Ei"})
@example({**HEAD, "memoryLimit": 10**4000})
@example({**HEAD, "extra": [["x" * 10**5] * 100] * 100})  # the error shows a cut repr, not 1 GB
def test_any_config_decodes_or_is_refused_within_10ms(obj):
    """CPU time of this thread, so a loaded machine does not make it flaky, without the
    collector (a full collection of the test process's objects is not decode's cost);
    margin: the bound is ~500x a decode."""
    gc.disable()
    try:
        start = time.thread_time()
        try:
            decode(obj)
        except ConfigError as e:
            assert len(str(e)) < 1000
        took = time.thread_time() - start
    finally:
        gc.enable()
    assert took < DECODE_BUDGET_S


@pytest.mark.parametrize("value, problem", [
    ("1e1000000", "exponent out of range (at most e30)"),
    ("1e-31", "exponent out of range (at most e30)"),
    ("9" * 65, "longer than 64 characters"),
    ("8Ei", "out of range (at most 9223372036854775807)"),
    (2**63, "out of range (at most 9223372036854775807)"),
    ("1_000", "not a valid quantity"),
    ("Infinity", "not a valid quantity"),
    ("NaN", "not a valid quantity"),
    ("\u0661\u0662Gi", "not a valid quantity"),  # Arabic-Indic digits: Decimal takes them, Kubernetes does not
    ("1e3k", "not a valid quantity"),
])
def test_absurd_quantities_are_refused_naming_field_and_value(value, problem):
    with pytest.raises(ConfigError) as err:
        decode({**HEAD, "memoryLimit": value})
    assert str(err.value).startswith(f"memoryLimit: {problem}")
    assert err.value.field == "memoryLimit" and err.value.value == value


def test_largest_quantities_still_decode():
    assert decode({**HEAD, "memoryLimit": "7Ei"}).memory_limit == 7 << 60
    assert decode({**HEAD, "memoryLimit": "1e18"}).memory_limit == 10**18
    assert decode({**HEAD, "memoryLimit": 2**63 - 1}).memory_limit == 2**63 - 1
