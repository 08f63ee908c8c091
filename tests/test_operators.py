"""Mobile packages (format = "ort", steps/operators.py): each artifact's required_operators.config, written by ONNX
Runtime's own tool and signed in its manifest, lists exactly the operators of its .ort (subgraphs included: the
truth is read off the decrypted flatbuffer, node by node, not from the tool); the target's merged config in the
release bundle is the union, the same lines the tool writes for all the models at once; a changed config is
TAMPERED; `ortbuild test` opens the .ort through the generated loader; XNNPACK and NNAPI are refused at config
time with where they do ship and what to build instead.

Two generated models (an MLP; a graph with an If whose branches hold their own nodes and int64 shape arithmetic),
one CPU target and one CoreML target (portable here: the Linux wheel has no CoreML).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortbuild.artifact import container, keys, manifest, manifest_types
from ortbuild.errors import ArtifactError, ConfigError, Tampered
from ortbuild.files import sha256_file
from ortbuild.gating import runner
from ortbuild.gating.record import TestResult
from ortbuild.pipeline.build import Builder
from ortbuild.pipeline.steps import operators
from ortbuild.project import capabilities, config, plan
from ortbuild.publish import release, tarball, verify
from ortbuild.status import JobStatus, Verdict
from tests.conftest import TEST_KEY, here_runtime, run_cli

# Not marked `runtime`: its CoreML target needs the stock onnxruntime flavor (the only one whose provider list
# has CoreML), so the OpenVINO flavor's session does not run it; the ORT-format tooling is the same in both.

TARGETS = """
[project]
name = "mob"
version = "1"

[models.mlp]
path = "models/mlp.onnx"
inputs = "models/mlp.npz"

[models.gate]
path = "models/gate.onnx"
inputs = "models/gate.npz"

[targets.mobile]
runtime = "RUNTIME"
providers = ["CPUExecutionProvider"]
format = "ort"
optimization = "basic"

[targets.ios]
runtime = "RUNTIME"
providers = ["CoreMLExecutionProvider", "CPUExecutionProvider"]
format = "ort"
models = ["mlp"]
"""


def _models(folder: Path) -> None:
    folder.mkdir()
    rng = np.random.default_rng(0)
    f32 = TensorProto.FLOAT
    mlp = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Add", ["r", "b"], ["a"]), helper.make_node("Softmax", ["a"], ["y"], axis=-1)],
        "mlp", [helper.make_tensor_value_info("x", f32, ["n", 4])], [helper.make_tensor_value_info("y", f32, ["n", 3])],
        [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")])
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", f32, ["n", 3])],
                             [numpy_helper.from_array(np.array(2, np.float32), "two")])
    other = helper.make_graph([helper.make_node("Sub", ["x", "one"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", f32, ["n", 3])],
                              [numpy_helper.from_array(np.array(1, np.float32), "one")])
    gate = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
         helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Add", ["shape", "one64"], ["k"])],
        "gate", [helper.make_tensor_value_info("x", f32, ["n", 3])],
        [helper.make_tensor_value_info("y", f32, ["n", 3]), helper.make_tensor_value_info("k", TensorProto.INT64, [2])],
        [numpy_helper.from_array(np.array(0, np.float32), "zero"),
         numpy_helper.from_array(np.array(1, np.int64), "one64")])
    for name, graph, cols in (("mlp", mlp, 4), ("gate", gate, 3)):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
        model.ir_version = 9
        onnx.checker.check_model(model, full_check=True)
        onnx.save(model, str(folder / f"{name}.onnx"))
        np.savez(folder / f"{name}.npz", x=rng.standard_normal((2, cols)).astype(np.float32))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mobile")
    _models(root / "models")
    (root / "targets.toml").write_text(TARGETS.replace("RUNTIME", here_runtime()))
    project = config.load(root / "targets.toml")
    results = Builder(project, root / "dist", secrets=keys.read_secrets(), progress=lambda job, msg: None).run(
        plan.jobs(project))
    assert [(r.target, r.model, r.status) for r in results] == [
        ("mobile", "mlp", JobStatus.BUILT), ("mobile", "gate", JobStatus.BUILT), ("ios", "mlp", JobStatus.PORTABLE)], \
        [r.error for r in results]
    return root


def _ort(folder: Path) -> bytes:
    m, _ = manifest.read(folder)
    (entry,) = m.artifact.files
    assert entry.location == "model.ort" and entry.encrypted
    return bytes(container.decrypt((folder / entry.name).read_bytes(), TEST_KEY))


def _flatbuffer_ops(data: bytes) -> set[tuple[str, int, str]]:
    """(domain, since-version, op type) of every node of an ORT-format model, subgraphs included, read off the
    flatbuffer with ORT's generated bindings (not with its config tool)."""
    import onnxruntime.tools.ort_format_model  # noqa: F401  (puts ort_flatbuffers_py on sys.path)
    import ort_flatbuffers_py.fbs as fbs

    assert data[4:8] == b"ORTM"
    found: set[tuple[str, int, str]] = set()

    def walk(graph: Any) -> None:
        for i in range(graph.NodesLength()):
            node = graph.Nodes(i)
            found.add((node.Domain().decode() or "ai.onnx", node.SinceVersion(), node.OpType().decode()))
            for j in range(node.AttributesLength()):
                attr = node.Attributes(j)
                if attr.Type() == fbs.AttributeType.AttributeType.GRAPH:
                    walk(attr.G())
                for k in range(attr.GraphsLength()):
                    walk(attr.Graphs(k))

    walk(fbs.InferenceSession.InferenceSession.GetRootAsInferenceSession(bytearray(data), 0).Model().Graph())
    return found


def _listed(sets: list[manifest_types.OperatorSet]) -> set[tuple[str, int, str]]:
    return {(s.domain, s.opset, op) for s in sets for op in s.ops}


def _onnx_op_types(path: Path) -> set[str]:
    def graphs(g: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
        yield g
        for node in g.node:
            for a in node.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    yield from graphs(sub)

    return {n.op_type for g in graphs(onnx.load(str(path)).graph) for n in g.node}


def test_each_artifact_ships_a_signed_config_listing_exactly_its_operators(built: Path) -> None:
    for target, model in (("mobile", "mlp"), ("mobile", "gate"), ("ios", "mlp")):
        folder = built / "dist" / target / model
        m = manifest.trusted(folder, keys.read_secrets().signing.public_raw)  # type: ignore[union-attr]
        assert m is not None and m.operators is not None and m.artifact.format == "ort"
        text = (folder / operators.CONFIG).read_text()
        assert m.operators.sha256 == sha256_file(folder / operators.CONFIG)
        assert m.operators.config == operators.CONFIG and m.operators.type_reduction
        assert m.operators.made_by.startswith(operators.TOOL)
        truth = _flatbuffer_ops(_ort(folder))
        assert _listed(operators.parse(text)) == _listed(m.operators.operators) == truth
        assert {op for _, _, op in truth} == _onnx_op_types(built / "models" / f"{model}.onnx")  # nothing fused
        assert text.startswith(f"{operators.HEADER}# - {target}/{model}/model.ort\n")  # no temp path
        assert str(built) not in text and "/tmp" not in text
    gate = manifest.read(built / "dist" / "mobile" / "gate")[0].operators
    assert gate is not None
    assert {"If", "Mul", "Sub"} <= {op for _, _, op in _listed(gate.operators)}  # the If's branches' nodes
    types = {op: t for s in gate.operators for op, t in s.types.items()}
    assert types["Add"] == {"inputs": {"0": ["int64_t"]}} and types["Greater"] == {"inputs": {"0": ["float"]}}
    assert "If" not in types  # ORT tracks no types for If


def test_the_typed_config_serves_builds_with_and_without_type_reduction(built: Path, tmp_path: Path) -> None:
    """ORT's parser reads the same operators from the typed config as from an untyped one, and the types only
    with type reduction (build.sh --enable_reduced_operator_type_support)."""
    from onnxruntime.tools import reduced_build_config_parser as parser
    from onnxruntime.tools.ort_format_model import create_config_from_models

    folder = built / "dist" / "mobile" / "gate"
    (tmp_path / "model.ort").write_bytes(_ort(folder))
    create_config_from_models([tmp_path / "model.ort"], tmp_path / "plain.config", False)
    typed, filt = parser.parse_config(str(folder / operators.CONFIG), True)
    plain, none = parser.parse_config(str(tmp_path / "plain.config"), True)
    assert parser.parse_config(str(folder / operators.CONFIG), False)[0] == plain == typed
    assert none is None and filt is not None
    assert filt.is_typed_registration_needed("ai.onnx", "Greater", "float")
    assert not filt.is_typed_registration_needed("ai.onnx", "Greater", "double")


@pytest.fixture(scope="module")
def gated(built: Path) -> list[TestResult]:
    """`ortbuild test`'s golden gate on the mobile target, through the generated Python loader."""
    project = config.load(built / "targets.toml")
    tester = runner.Tester(project, built / "dist", TEST_KEY, "targets.toml", lambda job, msg: None,
                    sign_key=keys.signing_key())
    out = []
    for job in plan.jobs(project, targets=["mobile"]):
        res = TestResult(job.target.name, job.model.name, job.settings.precision)
        tester.accuracy_gate(job, res)
        out.append(res)
    return out


def test_ortbuild_test_opens_the_ort_artifact_through_its_loader(built: Path, gated: list[TestResult],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime

    assert [r.accuracy for r in gated] == [Verdict.PASS, Verdict.PASS], [r.failures for r in gated]
    opened: list[bytes | str] = []  # what each session gets: the loader hands ORT the decrypted bytes

    class Recording(onnxruntime.InferenceSession):  # type: ignore[misc]
        def __init__(self, model: Any, *args: Any, **kwargs: Any) -> None:
            opened.append(str(model) if isinstance(model, str | Path) else bytes(model[:8]))
            super().__init__(model, *args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", Recording)
    project = config.load(built / "targets.toml")
    job = plan.jobs(project, targets=["mobile"], models=["gate"])[0]
    res = TestResult(job.target.name, job.model.name, job.settings.precision)
    runner.Tester(project, built / "dist", TEST_KEY, "targets.toml", lambda job, msg: None).accuracy_gate(job, res)
    loaded = [head for head in opened if isinstance(head, bytes)]
    assert res.accuracy == Verdict.PASS and loaded and all(head[4:8] == b"ORTM" for head in loaded)
    assert [p for p in opened if isinstance(p, str)] == [str(built / "models" / "gate.onnx")]  # the golden source


def test_the_release_bundle_carries_the_merged_config_the_tool_would_write(built: Path, gated: list[TestResult],
                                                                         tmp_path: Path) -> None:
    from onnxruntime.tools.ort_format_model import create_config_from_models

    project = config.load(built / "targets.toml")
    signer = keys.signing_key()
    assert signer is not None
    out = built / "dist" / "release" / "mobile"
    published = release.release_target(project, project.targets["mobile"], built / "dist", out, signer, force=True,
                                         root=built / "dist")
    entry = published.index["operators"]
    assert entry["models"] == ["gate", "mlp"] and entry["type_reduction"]
    checked = verify.verify(out, signer.public_raw, run=False, extract_to=tmp_path / "tree")
    assert checked.target == "mobile"
    merged = (tmp_path / "tree" / operators.CONFIG).read_text()
    assert tarball.sha256(merged.encode()) == entry["sha256"]
    own = tmp_path / "tree" / "mlp" / operators.CONFIG  # each model's own, signed in its manifest: verify's step 5
    m, _ = manifest.read(own.parent)
    assert manifest.integrity_problems(m, own.parent, signer.public_raw) == []
    own.write_text(own.read_text() + "ai.onnx;11;Conv\n")
    assert [p for p in manifest.integrity_problems(m, own.parent, signer.public_raw) if "operator config" in p]

    # the union of the models' operators, and what ORT's tool writes for both .ort files at once
    sections = [manifest.read(built / "dist" / "mobile" / m)[0].operators for m in ("mlp", "gate")]
    assert _listed(operators.parse(merged)) == set().union(*(_listed(s.operators) for s in sections if s))
    for m in ("mlp", "gate"):
        (tmp_path / m).mkdir()
        (tmp_path / m / "model.ort").write_bytes(_ort(built / "dist" / "mobile" / m))
    create_config_from_models([tmp_path / m / "model.ort" for m in ("mlp", "gate")], tmp_path / "all.config", True)
    body = [line for line in (tmp_path / "all.config").read_text().splitlines() if not line.startswith("#")]
    assert [line for line in merged.splitlines() if not line.startswith("#")] == body
    add = {op: t for s in operators.parse(merged) for op, t in s.types.items()}["Add"]
    assert add == {"inputs": {"0": ["float", "int64_t"]}}  # types joined per op across the models
    assert merged.splitlines()[1:] == ["# - mobile/gate/model.ort", "# - mobile/mlp/model.ort", *body]


def test_x86_only_layout_ops_in_the_config_get_a_note(tmp_path: Path) -> None:
    import onnxruntime as ort

    conv = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])],
                             [numpy_helper.from_array(np.ones((16, 8, 3, 3), np.float32), "w")])
    model = helper.make_model(conv, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "model.ort")  # level all (ORT's default): NCHWc on x86
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    made = operators.run(tmp_path / "model.ort", tmp_path, "t/conv/model.ort")
    if not any(s.domain == operators.NCHWC for s in made.operators):
        pytest.skip("ORT used no NCHWc kernel on this CPU")
    assert any("use optimization = \"basic\" for mobile packages" in n for n in made.notes)
    assert not (tmp_path / "opconfig" / operators.CONFIG).exists()  # nothing left behind


def test_merge_joins_types_per_op_as_ort_does(built: Path) -> None:
    a = [manifest_types.OperatorSet("ai.onnx", 13, ["Cast", "OneHot"], {
        "Cast": {"inputs": {"0": ["float"]}, "outputs": {"0": ["int64_t"]}},
        "OneHot": {"custom": [["int64_t", "int64_t", "float"]]}})]
    b = [manifest_types.OperatorSet("ai.onnx", 19, ["Cast"],
                              {"Cast": {"inputs": {"0": ["int32_t"]}, "outputs": {"0": ["float"]}}}),
         manifest_types.OperatorSet("com.microsoft", 1, ["FusedConv"])]
    sections = [manifest_types.Operators("c", "", 0, True, "t", a), manifest_types.Operators("c", "", 0, True, "t", b)]
    text, typed = operators.merge(sections, ["t/b/model.ort", "t/a/model.ort"])
    cast = '{"inputs": {"0": ["float", "int32_t"]}, "outputs": {"0": ["float", "int64_t"]}}'
    assert typed and text == (
        "# Generated from model/s:\n# - t/a/model.ort\n# - t/b/model.ort\n"
        f'ai.onnx;13;Cast{cast},OneHot{{"custom": [["int64_t", "int64_t", "float"]]}}\n'
        f"ai.onnx;19;Cast{cast}\ncom.microsoft;1;FusedConv\n")
    older = manifest.read(built / "dist" / "mobile" / "mlp")[0]
    with pytest.raises(ArtifactError, match=r"mobile/mlp: its \.ort artifact has no operator config"):
        release.merged_operators("mobile", {"mlp": dataclasses.replace(older, operators=None)})
    untyped = [sections[0], manifest_types.Operators("c", "", 0, False, "t", b)]
    assert operators.merge(untyped, [])[0] == "# Generated from model/s:\nai.onnx;13;Cast,OneHot\nai.onnx;19;Cast\n" \
        "com.microsoft;1;FusedConv\n"


def test_a_changed_config_is_tampered(built: Path, tmp_path: Path) -> None:
    folder = tmp_path / "mlp"
    shutil.copytree(built / "dist" / "mobile" / "mlp", folder)
    public = keys.read_secrets().signing.public_raw  # type: ignore[union-attr]
    assert manifest.trusted(folder, public) is not None
    config_file = folder / operators.CONFIG
    config_file.write_text(config_file.read_text().replace("Relu", "Selu"))  # same size, another kernel
    with pytest.raises(Tampered, match=f"operator config {operators.CONFIG} sha256 differs"):
        manifest.trusted(folder, public)
    with config_file.open("a") as f:
        f.write("ai.onnx;11;Conv\n")
    with pytest.raises(Tampered, match=f"operator config {operators.CONFIG} is [0-9]+ bytes, the manifest says"):
        manifest.trusted(folder, public)
    (folder / operators.CONFIG).unlink()
    with pytest.raises(Tampered, match="is missing"):
        manifest.trusted(folder, public)

    # and a build refuses to replace it (a release refuses it through the same check, `ortbuild verify` per model)
    root = tmp_path / "project"
    shutil.copytree(built, root, ignore=shutil.ignore_patterns("release", "logs"))
    (root / "dist" / "mobile" / "gate" / operators.CONFIG).write_text("ai.onnx;16;If\n")
    project = config.load(root / "targets.toml")
    (res,) = Builder(project, root / "dist", secrets=keys.read_secrets(), progress=lambda job, msg: None).run(
        plan.jobs(project, targets=["mobile"], models=["gate"]))
    assert res.status == JobStatus.FAILED and isinstance(res.error, Tampered) and "operator config" in res.reason


def test_the_manifest_section_is_read_strictly(built: Path) -> None:
    doc = json.loads((built / "dist" / "mobile" / "gate" / manifest_types.MANIFEST).read_bytes())
    section = doc["operators"]
    assert set(section) == {"config", "sha256", "size", "type_reduction", "made_by", "operators"}
    assert {"domain": "ai.onnx", "opset": 16, "ops": ["If"], "types": {}} in section["operators"]
    for bad in ({**section, "config": "../x.config"},
                {**section, "operators": [{"domain": "ai.onnx", "opset": 13, "ops": ["Add"], "types": {"Mul": {}}}]}):
        with pytest.raises(ArtifactError, match="damaged manifest: operators"):
            manifest_types.Manifest.from_json(json.dumps({**doc, "operators": bad}))
    assert json.loads((built / "dist" / "ios" / "mlp" / manifest_types.MANIFEST).read_bytes())["status"] == "portable"


@pytest.mark.parametrize("provider, ships", [("XnnpackExecutionProvider", "--use_xnnpack"),
                                             ("NnapiExecutionProvider", "--use_nnapi")])
def test_mobile_only_providers_are_refused_with_where_they_ship(tmp_path: Path, provider: str, ships: str) -> None:
    _models(tmp_path / "models")
    path = tmp_path / "targets.toml"
    path.write_text(TARGETS.replace("RUNTIME", here_runtime()).replace(
        'providers = ["CoreMLExecutionProvider", "CPUExecutionProvider"]', f'providers = ["{provider}"]'))
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert e.value.exit_code == 3 and e.value.where == "targets.ios.providers"
    message = e.value.message
    assert message.startswith(f"{path}: [targets.ios.providers] {provider} is in no ONNX Runtime wheel on PyPI")
    assert capabilities.unsupported(provider) in message
    for said in ("onnxruntime-android", ships, 'format = "ort"', "required_operators.config", "Mobile packages"):
        assert said in message
    if provider == "XnnpackExecutionProvider":  # and through the command line: its exit code
        proc = run_cli("plan", "-c", str(path))
        assert proc.returncode == 3 and "onnxruntime-objc" in proc.stderr and "[targets.ios.providers]" in proc.stderr


def test_format_ort_still_refuses_providers_that_compile_ahead(tmp_path: Path) -> None:
    _models(tmp_path / "models")
    path = tmp_path / "targets.toml"
    path.write_text(TARGETS.replace("RUNTIME", here_runtime()) + '\n[targets.ov]\nruntime = '
                    '"onnxruntime-openvino==1.24.1"\nproviders = ["OpenVINOExecutionProvider"]\nformat = "ort"\n')
    with pytest.raises(ConfigError, match="format 'ort' cannot hold graphs for OpenVINOExecutionProvider"):
        config.load(path)
