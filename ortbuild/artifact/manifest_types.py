"""What a manifest holds: `Manifest` (frozen dataclasses), the only place that knows the manifest's keys, and
its strict reader (`Manifest.from_json`: every key known, every required key present, every type right, the
free-form parts every reader indexes well-formed). Stdlib only: the noxfile reads manifests before any venv
exists. Reading one from disk, writing it signed and checking an artifact against it: ortbuild.artifact.manifest."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from ortbuild.artifact.manifest_reader import typed
from ortbuild.artifact.pieces import Pieces, pieces_problem
from ortbuild.errors import ArtifactError
from ortbuild.modelfiles import FileRecord, Signature, ValueInfo
from ortbuild.project.kinds import Kind
from ortbuild.status import ArtifactState

MANIFEST = "manifest.json"
FORMAT_VERSION = 3  # 3: artifact files have piece digests (ortbuild.artifact.pieces); 2 (one sha256) is still read
READABLE_FORMATS = (2, 3)

# The free-form parts of a manifest (JSON objects whose keys the steps that write them choose): typed dicts, so
# every reader indexes a known key. The strict reader checks that each is an object; _content_problem checks
# the keys every reader relies on.


class ProviderEntry(TypedDict):
    """One provider of the target, in priority order: its name and its options as targets.toml gives them."""
    name: str
    options: dict[str, str | int | float | bool]


class Versions(TypedDict):
    ortbuild: str
    onnx: str
    onnxruntime: dict[str, str]      # {"distribution": "onnxruntime-gpu", "version": "1.22.0"}


class Changed(TypedDict):
    """What the precision step converted (steps/accounting.py's Accounting)."""
    ops: dict[str, int]
    tensors: int
    float_bytes_before: int
    reduced_as_float: int
    float_bytes_after: int
    bytes_before: int
    bytes_after: int
    subgraph_ops: int
    converted: float                 # the share of the source's float weight bytes no longer stored as float


class CompiledFor(TypedDict):
    provider: str
    device: str
    cpu: str
    simd_level: str


class TiedTo(TypedDict, total=False):
    """What a non-portable artifact needs at load time (empty: portable)."""
    providers: list[str]             # the providers that fused its contrib ops (or that it was compiled for)
    simd_level: str                  # the SIMD width of its NCHWc layout
    compiled_for: CompiledFor        # compiled ahead of time (steps/compile.py)


class Grown(TypedDict):
    initializer: str
    dtype: str
    bytes: int
    pattern: str                     # the ops that computed it from a stored weight, "Cast <- DequantizeLinear"


class Inflation(TypedDict):
    """What constant folding grew (steps/optimize.py), and what the build did about it."""
    weights_before: int
    weights_after: int
    growth: float
    grown: list[Grown]               # the largest grown initializers
    action: NotRequired[str]


class Compiled(TypedDict):
    """Compiled ahead of time into an EPContext model (steps/compile.py)."""
    provider: str
    device: str
    ep_context_nodes: int
    other_nodes: int
    embedded: bool
    seconds: float


class OpTypes(TypedDict, total=False):
    """ORT's type entry of one op in a reduced-build operator config: per input/output index, its types;
    or OneHot's `custom` type triples."""
    inputs: dict[str, list[str]]
    outputs: dict[str, list[str]]
    custom: list[list[str]]


@dataclass(frozen=True)
class ProjectInfo:
    name: str
    version: str


@dataclass(frozen=True)
class Source:
    path: str
    sha256: str
    size: int
    ir_version: int
    opsets: dict[str, int]
    # every file of the source model: the graph (its own name) and each external-data file (its location, as
    # the graph names it), with sha256 and size; `sha256` above is the graph file's, `size` all files'
    files: list[FileRecord] = field(default_factory=list)


@dataclass(frozen=True)
class ArtifactFile:
    name: str                        # the file in dist/<target>/<model>/ (model.onnx.enc, model.onnx.data.enc)
    role: str                        # model | external_data
    location: str                    # its plaintext name, as the graph's external-data locations name it
    sha256: str                      # of the file as stored (the ciphertext when encrypted)
    size: int
    encrypted: bool
    pieces: Pieces | None = None     # format 3 (None in format 2): the stored bytes' piece digests


@dataclass(frozen=True)
class Artifact:
    file: str                        # the model file's name in its directory
    format: str                      # onnx | ort
    sha256: str
    size: int                        # all files of the artifact together
    size_ratio: float                # size / source size
    files: list[ArtifactFile]        # every file of the artifact; each is signed through this manifest
    external_data: str = ""          # why the weights are external data (model.onnx.data), "" when embedded


@dataclass(frozen=True)
class Encryption:
    container: str                   # ortbuild-container-v1 (docs/container.md)
    algorithm: str                   # AES-256-GCM, chunked (STREAM), envelope: data key wrapped by the KEK
    key_id: str                      # names the key-encryption key, never reveals it
    chunk_size: int
    deterministic: bool              # data key and nonces derived from the KEK and the plaintext digest
    development_key: bool            # built with a `keygen --dev` key: never for a release


@dataclass(frozen=True)
class Signing:
    algorithm: str                   # Ed25519 over the exact bytes of manifest.json, in manifest.sig (base64)
    public_key: str                  # base64 of the raw 32-byte public key (loaders pin it)
    public_key_id: str
    development_key: bool


@dataclass(frozen=True)
class LoaderFile:
    language: str                    # python | node | node-types
    name: str                        # relative to the artifact directory
    sha256: str
    runs_target: bool                # False: this loader refuses the target (e.g. Node for OpenVINO)
    note: str = ""


@dataclass(frozen=True)
class SignedFile:
    """A file beside the artifact that readers use but the loaders do not decrypt (the golden data)."""
    name: str                        # relative to the artifact directory, e.g. golden/test_data_set_0/input_0.pb
    sha256: str
    size: int


@dataclass(frozen=True)
class PrecisionInfo:
    name: str
    options: dict[str, object]       # the precision's options as used (a plain table, recorded for readers)
    changed: Changed | None = None   # what the step converted (steps.accounting); None for fp32


@dataclass(frozen=True)
class Fusion:
    """What ONNX Runtime's transformer optimizer did before the precision step (steps/fusion.py)."""
    model_type: str
    num_heads: int                   # as configured; 0: inferred from the graph by the optimizer
    hidden_size: int
    applied: bool                    # False: nothing fused, or skipped (a portable build): the source was used
    fused_ops: dict[str, int]        # op type -> nodes the optimizer added, e.g. {"Attention": 3}
    nodes_before: int
    nodes_after: int
    reason: str = ""                 # why it was not applied


@dataclass(frozen=True)
class OperatorSet:
    """One line of ONNX Runtime's reduced-build operator config: the op types of one domain at one opset."""
    domain: str                      # ai.onnx, ai.onnx.ml, com.microsoft, ...
    opset: int                       # the ops' since-version, as ORT's config writes it
    ops: list[str]
    types: dict[str, OpTypes] = field(default_factory=dict)  # op -> ORT's type entry ({"inputs": {"0": ["float"]}})


@dataclass(frozen=True)
class Operators:
    """The operators (and, with type reduction, their types) a `format = "ort"` artifact needs: the input of a
    reduced ONNX Runtime build (`--include_ops_by_config`), written by ORT's own tool (steps/operators.py)."""
    config: str                      # the config file beside the artifact (required_operators.config), signed here
    sha256: str
    size: int
    type_reduction: bool             # per-op types listed: for --enable_reduced_operator_type_support
    made_by: str                     # the tool and the ONNX Runtime version that wrote it
    operators: list[OperatorSet]


@dataclass(frozen=True)
class Optimization:
    requested: str
    applied: str
    portable: bool
    tied_to: TiedTo                  # {"providers": [...], "simd_level": "..."} where not portable
    optimized_with: list[str]
    op_domains: dict[str, int]
    disabled_optimizers: list[str] = field(default_factory=list)
    inflation: Inflation | None = None  # what constant folding grew, and what the build did about it


@dataclass(frozen=True)
class GoldenRun:
    providers: list[str]             # what the reload session really ran on
    outputs: list[ValueInfo]         # name, dtype, shape of each output on the golden inputs
    inputs_sha256: str


@dataclass(frozen=True)
class Generative:
    """A generative model built by onnxruntime-genai's model builder (ortbuild.pipeline.genai)."""
    architecture: str                # config.json's `architectures[0]`, e.g. LlamaForCausalLM
    model_type: str                  # genai_config.json's model.type, e.g. llama
    builder: dict[str, str]          # the builder's packages and versions (onnxruntime-genai, torch, transformers)
    runtime: str                     # the pip requirement the loader needs (onnxruntime-genai==...)
    precision: str                   # the builder's `-p`
    execution_provider: str          # the builder's `-e`
    extra_options: dict[str, str]    # the builder's --extra_options, as passed
    context_length: int
    vocab_size: int
    num_layers: int
    eos_token_ids: list[int]
    config: str                      # genai_config.json: beside the graph, signed, not encrypted
    tokenizer: list[str]             # the tokenizer files, signed, not encrypted
    golden_tokens: dict[str, list[int]]  # prompt -> the artifact's greedy tokens at build time (reload step)
    matmuls: list[str] = field(default_factory=list)  # the graph's MatMul nodes, as nodes_to_exclude names them


@dataclass(frozen=True)
class Manifest:
    project: ProjectInfo
    target: str
    model: str
    status: str                      # complete | portable
    missing_providers: dict[str, str]
    source: Source
    artifact: Artifact
    precision: PrecisionInfo
    providers: list[ProviderEntry]   # {"name": ..., "options": {...}}, in priority order
    session: dict[str, object]       # the target's session options, as the loaders pass them to ONNX Runtime
    free_dimensions: dict[str, int]
    optimization: Optimization
    io: Signature                    # {"inputs": [...], "outputs": [...]}: name, dtype, shape
    golden_run: GoldenRun
    versions: Versions
    build_machine: dict[str, object]  # machine.fingerprint(): cpu, simd_level, isa_flags, ...
    build_key: str
    created: str
    encryption: Encryption | None    # None: the target opted out (encrypt = false)
    signing: Signing
    loaders: list[LoaderFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    build_inputs: dict[str, str] = field(default_factory=dict)  # digest of each part of the build key
    plugins: dict[str, dict[str, str]] = field(default_factory=dict)  # provider -> its plugin EP package
    compiled: Compiled | None = None  # compiled ahead of time (EPContext): provider, device, partitions
    # custom-op libraries: name, version, sha256, library, and module (a package's) or file (shipped beside it)
    custom_ops: list[dict[str, str]] = field(default_factory=list)
    epoch: int = 0                   # rollback counter ([project] epoch): loaders refuse one below their pinned minimum
    golden: list[SignedFile] = field(default_factory=list)  # the golden data `ortbuild test` wrote and signed
    fusion: Fusion | None = None     # [targets.X.fusion] on: what the transformer optimizer fused
    operators: Operators | None = None  # format = "ort": ORT's reduced-build operator config (steps/operators.py)
    locked: dict[str, object] | None = None  # the targets.lock entry laid over its settings (project/lockfile.py)
    generative: Generative | None = None  # a generative model built by onnxruntime-genai's model builder
    format_version: int = FORMAT_VERSION

    @property
    def portable_only(self) -> bool:
        return self.status == ArtifactState.PORTABLE

    @property
    def kind(self) -> Kind:  # of its model (ortbuild.project.kinds): its `generative` section says which
        return "generative" if self.generative else "onnx"

    def signed_files(self) -> list[tuple[str, str, int | None, str]]:
        """Every file beside the manifest that it signs, as (name, sha256, size or None, what): the artifact's files,
        the loaders, custom-op libraries shipped beside it, the golden data and the operator config (format ort)."""
        out: list[tuple[str, str, int | None, str]] = [(f.name, f.sha256, f.size, "artifact file")
                                                       for f in self.artifact.files]
        out += [(lf.name, lf.sha256, None, "loader") for lf in self.loaders]
        out += [(c["file"], c["sha256"], None, "custom-op library") for c in self.custom_ops if c.get("file")]
        out += [(g.name, g.sha256, g.size, "golden file") for g in self.golden]
        if self.operators is not None:  # format = "ort": ONNX Runtime's reduced-build operator config
            out.append((self.operators.config, self.operators.sha256, self.operators.size, "operator config"))
        return out

    def to_json(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, text: str | bytes, where: str = MANIFEST) -> Manifest:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:  # RecursionError: arrays nested too deep for json
            raise ArtifactError(f"{where}: unreadable manifest: {e}",
                                "rebuild the artifact with `ortbuild build`") from None
        if not isinstance(data, dict) or data.get("format_version") not in READABLE_FORMATS:
            raise ArtifactError(f"{where}: not an ortbuild manifest (format {READABLE_FORMATS[0]}-{FORMAT_VERSION})",
                                "rebuild the artifact with this ortbuild")
        m = typed(cls, data, where, "")
        problem = _content_problem(m)
        if problem:
            raise ArtifactError(f"{where}: damaged manifest: {problem}",
                                "the manifest was edited or is corrupted: rebuild the artifact with `ortbuild build`")
        return m


def _is_value_info(v: object) -> bool:
    return (isinstance(v, dict) and isinstance(v.get("name"), str) and isinstance(v.get("dtype"), str)
            and (v.get("shape") is None or isinstance(v.get("shape"), list)))


def file_name_problem(name: str) -> str | None:
    """Why a file name in a manifest is not a plain relative name inside the artifact's directory."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or "\0" in name or any(p in ("", ".", "..") for p in parts) \
            or len(parts) > (3 if parts[0] == "golden" else 2):
        return f"file name {name[:80]!r} is not a plain name inside the artifact directory"
    return None


def _content_problem(m: Manifest) -> str | None:
    """What the typed reader cannot see: the free-form parts every reader indexes, and safe file names."""
    for c in m.custom_ops:
        if not all(isinstance(c.get(k), str) for k in ("name", "version", "sha256", "library")):
            return "custom_ops entries must have name, version, sha256 and library"
        if "file" in c and (file_name_problem(c["file"]) or not c["file"].startswith("custom_ops/")):
            return f"custom_ops file {c['file'][:80]!r} is not custom_ops/<name>"
    if m.status not in tuple(ArtifactState):
        return f"status {m.status!r} is neither 'complete' nor 'portable'"
    ort_version = m.versions.get("onnxruntime")
    if not (isinstance(ort_version, dict) and all(isinstance(ort_version.get(k), str)
                                                  for k in ("distribution", "version"))):
        return "versions.onnxruntime must have distribution and version"
    if not all(isinstance(m.build_machine.get(k), str) for k in ("cpu", "simd_level")):
        return "build_machine must have cpu and simd_level"
    for kind in ("inputs", "outputs"):
        if not (isinstance(m.io.get(kind), list) and all(_is_value_info(v) for v in m.io[kind])):
            return f"io.{kind} must be a list of {{name, dtype, shape}}"
    if not all(_is_value_info(v) for v in m.golden_run.outputs):
        return "golden_run.outputs must be a list of {name, dtype, shape}"
    if not all(isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("options", {}), dict)
               for p in m.providers):
        return "providers must be a list of {name, options}"
    names = [f.name for f in m.artifact.files] + [lf.name for lf in m.loaders] + [g.name for g in m.golden]
    for name in names:
        problem = file_name_problem(name)
        if problem:
            return problem
    if any(not g.name.startswith("golden/") for g in m.golden):
        return "golden files must be under golden/"
    if not isinstance(m.epoch, int) or m.epoch < 0:
        return "epoch must be a non-negative integer"
    if m.fusion is not None and not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                        for k, v in m.fusion.fused_ops.items()):
        return "fusion.fused_ops must map op types to counts"
    if m.operators is not None:
        problem = _operators_problem(m.operators)
        if problem:
            return problem
    if problem := next(filter(None, (pieces_problem(f.name, f.size, f.pieces, m.format_version)
                                     for f in m.artifact.files)), None):
        return problem
    if not m.artifact.files or m.artifact.file not in {f.name for f in m.artifact.files}:
        return f"artifact.file {m.artifact.file[:80]!r} is not among artifact.files"
    return None


def _operators_problem(ops: Operators) -> str | None:
    """The operators section's free-form parts: a plain config name, op names, and a type entry per listed op."""
    if file_name_problem(ops.config) or "/" in ops.config:
        return f"operators.config {ops.config[:80]!r} is not a plain file name beside the artifact"
    for s in ops.operators:
        if not all(isinstance(op, str) and op for op in s.ops) or \
                not all(op in s.ops and isinstance(t, dict) for op, t in s.types.items()):
            return f"operators: the {s.domain} opset {s.opset} entry must list op names, and types only for them"
    return None
