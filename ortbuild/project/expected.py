"""Expected outputs `ortbuild init` records (docs/project.md): the source's outputs on the golden inputs, written as
the model's `expected` (`models/NAME.expected.npz`), and beside them what they were computed from
(`models/NAME.expected.json`, record_path): the digest of the golden inputs' values, the digest of the expected
outputs' values, and how they were computed. `ortbuild test` reads the record (ortbuild.artifact.golden): where the
golden inputs are those it names, the artifact must reproduce the recorded outputs (a later source whose outputs
differ fails); where they are not, the test warns with how the outputs moved and compares with the source's outputs on
the new inputs instead. `ortbuild init --refresh-expected` records them again."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ortbuild.errors import ConfigError
from ortbuild.project.config import Model

RECORDED_BY = "ortbuild init"
REFRESH = "ortbuild init --refresh-expected"
SUFFIX = ".expected.npz"             # models/NAME.expected.npz


def record_path(expected: Path) -> Path:
    """The record beside expected outputs init computed: models/x.expected.npz -> models/x.expected.json."""
    return expected.with_suffix(".json")


def values_digest(sets: Sequence[tuple[str, Mapping[str, object]]]) -> str:
    """sha256 of data sets' values: each set's name, each array's name, dtype, shape and bytes (not the file's:
    an .npz stamps the time it was written)."""
    h = hashlib.sha256()
    for name, values in sets:
        h.update(f"{name}\0".encode())
        for key in sorted(values):
            arr = np.ascontiguousarray(values[key])
            h.update(f"{key}\0{arr.dtype.str}\0{list(arr.shape)}\0".encode() + arr.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Record:
    """What recorded expected outputs were computed from: digests of the golden inputs' values and of the expected
    outputs' (values_digest), and how they were computed."""

    inputs_sha256: str
    expected_sha256: str
    made_by: str

    def as_json(self, inputs: str, source: str) -> str:
        doc = {"recorded_by": RECORDED_BY, "inputs": inputs, "inputs_sha256": self.inputs_sha256,
               "source": source, "expected_sha256": self.expected_sha256, "made_by": self.made_by,
               "refresh": REFRESH}
        return json.dumps(doc, indent=2) + "\n"


def record_json(feeds: Sequence[tuple[str, Mapping[str, object]]], arrays: Mapping[str, object], how: str,
                inputs: str, source: str) -> str:
    """The record beside expected outputs init computed (`arrays`, from the model at `source` on the one feed of
    `feeds`, read from `inputs`; both as targets.toml names them), as written."""
    record = Record(values_digest(feeds), values_digest([(feeds[0][0], arrays)]), how)
    return record.as_json(inputs, source)


def _refused(model: Model, path: Path, problem: str) -> ConfigError:
    name = model.expected.name if model.expected else "expected"
    return ConfigError(str(path), f"models.{model.name}.expected", problem,
                       f"record them again: {REFRESH} (in the folder of targets.toml); or remove {path.name} (then "
                       f"{name} is taken as your own, and any difference from it fails)")


def read_record(model: Model) -> Record | None:
    """The record beside the model's `expected` .npz, or None (no such file: outputs of the user's own)."""
    if model.expected is None or model.expected.is_dir():
        return None
    path = record_path(model.expected)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or doc.get("recorded_by") != RECORDED_BY:
            raise ValueError(f"no \"recorded_by\": \"{RECORDED_BY}\"")
        return Record(str(doc["inputs_sha256"]), str(doc["expected_sha256"]), str(doc.get("made_by", "")))
    except (OSError, UnicodeDecodeError, ValueError, KeyError) as err:
        raise _refused(model, path, f"is not a record of the inputs {model.expected.name} was computed from "
                                    f"({err})") from None


def moved(model: Model, record: Record, inputs: Sequence[tuple[str, Mapping[str, object]]],
          outputs: Sequence[tuple[str, Mapping[str, object]]]) -> bool:
    """Whether the golden inputs (each data set's name and feed) differ from those the recorded expected `outputs`
    were computed on; a ConfigError where the record is of other outputs than the file holds."""
    if values_digest(outputs) != record.expected_sha256:
        assert model.expected is not None
        raise _refused(model, record_path(model.expected), f"records other outputs than {model.expected.name} "
                                                           "holds (its expected_sha256 differs)")
    return values_digest(inputs) != record.inputs_sha256
