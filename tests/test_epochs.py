"""The rollback model outside the loaders (ortbuild.publish.epochs, and deploy's replacement check): `release`
refuses artifacts below [project] epoch, `verify`/`pull` take --min-epoch, `pull --to` never replaces a newer
release with an older one unless --allow-downgrade, and a lowered [project] epoch is a config error unless
--allow-epoch-decrease. Real builds of the example models; `pull`'s placement is tested on local releases (the
registry round trip is in tests/test_registry.py)."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from ortbuild.artifact import manifest
from ortbuild.errors import ArtifactError, RolledBack, UsageError
from ortbuild.publish import deploy, epochs
from tests.test_release import SIGNER, cli, make_project, public_key_file

MODELS = ("breast_cancer_gb", "tiny_cnn")


def set_epoch(root: Path, epoch: int) -> None:
    """[project] epoch in root/targets.toml (make_project's has none: epoch 0)."""
    path = root / "targets.toml"
    text = re.sub(r"(?m)^epoch = \d+\n", "", path.read_text())
    path.write_text(text.replace('version = "1.0"\n', f'version = "1.0"\nepoch = {epoch}\n', 1))


def dist_epochs(root: Path) -> dict[str, int]:
    return {m: manifest.read(root / "dist" / "cpu" / m)[0].epoch for m in MODELS}


@dataclass(frozen=True)
class Releases:
    root: Path      # the project: [project] epoch = 1, dist/cpu built and tested at epoch 1
    old: Path       # its target cpu released at epoch 0
    new: Path       # ... and at epoch 1


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Releases:
    """One project tested and released at epoch 0, then at epoch 1 (raising the epoch rebuilds: it is part of the
    build key)."""
    root = tmp_path_factory.mktemp("epochs")
    make_project(root)
    out = {}
    for epoch in (0, 1):
        set_epoch(root, epoch)
        proc = cli("test", "-t", "cpu", "-j", "1", cwd=root)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert dist_epochs(root) == dict.fromkeys(MODELS, epoch)
        proc = cli("release", "-t", "cpu", "--to", str(root / f"rel{epoch}"), cwd=root)
        assert proc.returncode == 0, proc.stderr
        out[epoch] = root / f"rel{epoch}" / "cpu"
    return Releases(root, out[0], out[1])


# ---------------------------------------------------------------------------------------------------------
# release


def test_release_refuses_artifacts_below_the_project_epoch_even_forced(releases: Releases, tmp_path: Path) -> None:
    root = releases.root
    set_epoch(root, 2)  # raised, never rebuilt: dist/cpu holds epoch-1 artifacts with their epoch-1 loaders
    try:
        for extra in ([], ["--force"]):
            proc = cli("release", "-t", "cpu", "--to", str(tmp_path / "out"), *extra, cwd=root)
            assert proc.returncode == RolledBack.exit_code == 7, proc.stdout + proc.stderr
            for m in MODELS:
                assert f"cpu/{m}: epoch 1 (" in proc.stderr
            assert "[project] epoch = 2" in proc.stderr and "`ortbuild test -t cpu`" in proc.stderr
            assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
            assert not (tmp_path / "out" / "cpu").exists()
        doc = json.loads(cli("release", "-t", "cpu", "--to", str(tmp_path / "out"), "--json", cwd=root).stdout)
        assert doc["exit_code"] == 7 and doc["released"] == [] and "below [project] epoch = 2" in doc["refused"][0]
    finally:
        set_epoch(root, 1)
    proc = cli("release", "-t", "cpu", "--to", str(tmp_path / "out"), cwd=root)  # at the project's epoch: released
    assert proc.returncode == 0, proc.stderr


def test_below_project_names_only_the_older_artifacts(releases: Releases) -> None:
    from ortbuild.project import config

    project = config.load(releases.root / "targets.toml")  # epoch 1
    epochs.below_project(project, "cpu", {"a": 1, "b": 3})  # not below: nothing raised
    with pytest.raises(RolledBack) as err:
        epochs.below_project(project, "cpu", {"a": 1, "b": 0})
    assert "cpu/b: epoch 0" in err.value.message and "cpu/a" not in err.value.message


def test_release_to_a_file_is_a_usage_error(releases: Releases, tmp_path: Path) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    for to, named in ((afile, afile), (afile / "sub", afile), (link, link)):
        proc = cli("release", "-t", "cpu", "--to", str(to), cwd=releases.root)
        assert proc.returncode == UsageError.exit_code == 2, (to, proc.stderr)
        assert f"--to {to}: {named} is not a directory" in proc.stderr, proc.stderr
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    assert afile.read_text() == "mine"
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "cpu").write_text("a file where the target's directory goes")
    proc = cli("release", "-t", "cpu", "--to", str(tmp_path / "out"), cwd=releases.root)
    assert proc.returncode == 2 and f"{tmp_path / 'out' / 'cpu'} is not a directory" in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------------------
# verify --min-epoch


def test_verify_min_epoch(releases: Releases, tmp_path: Path) -> None:
    pub = str(public_key_file(tmp_path))
    refused = cli("verify", str(releases.old), "--public-key", pub, "--no-run", "--min-epoch", "1", cwd=tmp_path)
    assert refused.returncode == 7, refused.stdout + refused.stderr
    assert "rel-1.0-cpu: epoch 0, below --min-epoch 1" in refused.stderr and "Traceback" not in refused.stderr
    for where, n in ((releases.old, "0"), (releases.new, "1")):
        ok = cli("verify", str(where), "--public-key", pub, "--no-run", "--min-epoch", n, "--json", cwd=tmp_path)
        assert ok.returncode == 0, ok.stderr
        doc = json.loads(ok.stdout)
        assert doc["epoch"] == int(n) and any(c.startswith(f"epoch        {n} (") for c in doc["checks"])
    bad = cli("verify", str(releases.new), "--public-key", pub, "--min-epoch", "-1", cwd=tmp_path)
    assert bad.returncode == 2 and "--min-epoch" in bad.stderr and "not an epoch" in bad.stderr


def test_check_compares_the_lowest_epoch_of_a_release() -> None:
    floor = epochs.Floor(2, "--min-epoch 2", "h")
    epochs.check("r", {"a": 2, "b": 5}, [floor])
    with pytest.raises(RolledBack, match=r"r: epoch 1 \(a 1, b 5\), below --min-epoch 2: its a would roll back"):
        epochs.check("r", {"a": 1, "b": 5}, [floor])


# ---------------------------------------------------------------------------------------------------------
# pull --to: what `ortbuild pull` does after the download, on local releases


def _place(release_dir: Path, dest: Path, **kw: object) -> list[str]:
    v = deploy.place(release_dir, dest, SIGNER.public_raw, source="test", run=False, key=None, **kw)  # type: ignore[arg-type]
    return v.warnings


def test_pull_to_never_replaces_a_newer_release_with_an_older_one(releases: Releases, tmp_path: Path) -> None:
    dest = tmp_path / "deploy"
    assert _place(releases.new, dest) == []
    assert (dest / deploy.PULLED).is_file()
    assert epochs.deployed(dest, SIGNER.public_raw) == ("rel-1.0-cpu", dict.fromkeys(MODELS, 1))
    before = {p.relative_to(dest): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    with pytest.raises(RolledBack) as err:
        _place(releases.old, dest)
    assert f"epoch 0, below epoch 1 of the release already deployed in {dest}" in err.value.message
    assert "--allow-downgrade" in (err.value.hint or "")
    assert {p.relative_to(dest): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy"]  # nothing staged left beside it
    assert _place(releases.new, dest) == []  # the same epoch again: a redeploy
    with pytest.raises(RolledBack, match="--min-epoch 1"):  # --min-epoch holds even with --allow-downgrade
        _place(releases.old, dest, min_epoch=1, allow_downgrade=True)
    warnings = _place(releases.old, dest, allow_downgrade=True)
    assert warnings and "with an older release (epoch 0): --allow-downgrade" in warnings[0]
    assert epochs.deployed(dest, SIGNER.public_raw) == ("rel-1.0-cpu", dict.fromkeys(MODELS, 0))
    assert _place(releases.new, dest) == []  # upgrading is never refused


def test_pull_to_an_empty_or_new_directory_has_no_floor_but_min_epoch(releases: Releases, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _place(releases.old, tmp_path / "empty")
    with pytest.raises(RolledBack):
        _place(releases.old, tmp_path / "new", min_epoch=1)
    assert not (tmp_path / "new").exists()


def test_a_damaged_deployment_is_not_replaced_silently(releases: Releases, tmp_path: Path) -> None:
    dest = tmp_path / "deploy"
    _place(releases.new, dest)
    (dest / "tiny_cnn" / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="cannot tell the epoch of the release deployed there") as err:
        _place(releases.new, dest)
    assert "--allow-downgrade" in (err.value.hint or "")
    _place(releases.new, dest, allow_downgrade=True)
    # only signed epochs count: an epoch edited down, or every manifest removed, leaves no floor to go below
    for m in dest.glob("*/manifest.json"):
        m.write_text(m.read_text().replace('"epoch": 1', '"epoch": 0'))
    with pytest.raises(ArtifactError, match="does not verify with the trusted public key"):
        _place(releases.old, dest)
    _place(releases.new, dest, allow_downgrade=True)
    for m in dest.glob("*/manifest.json"):
        m.unlink()
    with pytest.raises(ArtifactError, match=r"it holds no manifest\.json"):
        _place(releases.old, dest)
    _place(releases.new, dest, allow_downgrade=True)
    assert epochs.deployed(dest, SIGNER.public_raw) == ("rel-1.0-cpu", dict.fromkeys(MODELS, 1))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("x")
    with pytest.raises(UsageError, match="not a release `ortbuild pull` made"):
        _place(releases.new, mine)
    with pytest.raises(UsageError, match=f"{mine / 'keep.txt'} is not a directory"):
        _place(releases.new, mine / "keep.txt" / "sub")


# ---------------------------------------------------------------------------------------------------------
# build/test with a lowered [project] epoch


def test_lowering_the_epoch_is_a_config_error_unless_allowed(releases: Releases, tmp_path: Path) -> None:
    root = tmp_path / "p"
    shutil.copytree(releases.root, root, ignore=lambda d, names: [n for n in names if Path(d) == releases.root
                                                                  and n.startswith("rel")])
    set_epoch(root, 0)  # dist/cpu was built at epoch 1
    for command in ("build", "test"):
        proc = cli(command, "-t", "cpu", "-j", "1", cwd=root)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "targets.toml: [project] epoch = 0 is lower than 1" in proc.stderr, proc.stderr
        assert "--allow-epoch-decrease" in proc.stderr and "Traceback" not in proc.stderr
        assert dist_epochs(root) == dict.fromkeys(MODELS, 1)  # nothing rebuilt
    proc = cli("build", "-t", "cpu", "-j", "1", "--allow-epoch-decrease", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" in proc.stderr and "lowered from 1 to 0 (--allow-epoch-decrease)" in proc.stderr
    assert dist_epochs(root) == dict.fromkeys(MODELS, 0)
    assert "MIN_EPOCH = 0\n" in (root / "dist" / "cpu" / "tiny_cnn" / "loader" / "ortbuild_tiny_cnn.py").read_text()
    proc = cli("build", "-t", "cpu", "-j", "1", cwd=root)  # dist/ now records epoch 0: no decrease, no warning
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr
    set_epoch(root, 3)  # raising it is never refused
    proc = cli("build", "-t", "cpu", "-j", "1", cwd=root)
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr
    assert dist_epochs(root) == dict.fromkeys(MODELS, 3)
