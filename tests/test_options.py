from __future__ import annotations

import json
import tomllib

import jsonschema
import pytest

from ortbuild.project import options
from tests.conftest import REPO, run_cli

BAD = sorted((REPO / "tests" / "fixtures" / "bad").glob("*.toml"))


def test_schema_is_valid_and_accepts_the_committed_targets_file() -> None:
    schema = options.json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    data = tomllib.loads((REPO / "targets.toml").read_text())
    jsonschema.validate(data, schema)


def test_shipped_schema_and_reference_are_generated_from_options() -> None:
    assert json.loads((REPO / "ortbuild" / "targets.schema.json").read_text()) == options.json_schema()
    proc = run_cli("schema", "--check")
    assert proc.returncode == 0, proc.stderr


def test_reference_documents_every_key_with_its_default() -> None:
    ref = (REPO / "docs" / "targets-reference.md").read_text()
    for table, keys in options.TABLES.items():
        for k in keys:
            row = next((line for line in ref.splitlines() if line.startswith(f"| `{k.name}` |")), None)
            assert row is not None, (table, k.name)
    assert "| `precision` | fp32 \\| fp16 \\| int8-dynamic \\| int8-static \\| int4-weight | `\"fp32\"` |" in ref


@pytest.mark.parametrize("name", ["unknown_key", "bad_precision", "unknown_provider", "config_key_typo",
                                  "bool_as_string", "unknown_top_table", "empty_providers"])
def test_schema_also_rejects_the_shape_errors(name: str) -> None:
    # editors using the schema catch the same mistakes as `ortbuild` (those a schema can express)
    data = tomllib.loads((REPO / "tests" / "fixtures" / "bad" / f"{name}.toml").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, options.json_schema())


def test_defaults_are_fresh_copies() -> None:
    a = options.defaults("target")
    a["models"].append("x")
    assert options.defaults("target")["models"] == ["*"]
