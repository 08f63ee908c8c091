"""Run each job's pipeline (stages.PIPELINE) and publish dist/<target>/<model>/{artifact, manifest.json}.

A job runs in three phases:
  prepare  compute the build key from digests alone (always; no model is parsed)
  build    make and publish the artifact, in a private temp dir (skipped when the published one is reused)
  verify   checks on the published artifact (always: on fresh and reused artifacts alike)
Each step returns a frozen result; the Builder hands the results on (job.Done) and records in the JobResult
what the command reports.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
import traceback
import typing
from collections.abc import Callable, Sequence
from pathlib import Path

from ortbuild import installed, logs, modelfiles, paths, runtime, workspace
from ortbuild.artifact import keys, manifest_types
from ortbuild.errors import ConfigError, KeyMissing, OrtbuildError, StepError, Tampered, WrongKey, first_line
from ortbuild.pipeline import buildkey, locking, parallel, stages
from ortbuild.pipeline import cache as cache_
from ortbuild.pipeline.job import Done, JobResult, Prepared
from ortbuild.pipeline.progress import Progress
from ortbuild.pipeline.steps import compile
from ortbuild.project import lockfile
from ortbuild.project.config import Project, Provider, Target
from ortbuild.project.kinds import Kind, kind_rule
from ortbuild.project.plan import Job
from ortbuild.status import Event, JobFinished, JobStatus, PhaseStarted, StepStarted

ProgressSink = Callable[[str, Event], None]


class Builder:
    def __init__(self, project: Project, dist: Path, *, secrets: keys.Secrets, force: bool = False,
                 repair: bool = False, progress: ProgressSink | None = None, capture: bool = True,
                 command: str = "build", cache: cache_.Cache | None = None) -> None:
        self.project = project
        self.cache = cache  # the shared build cache: entries pulled before building, pushed after
        self.cache_where = cache.where if cache else ""
        self.command = command  # the ortbuild command building: what an up-to-date job says to rebuild it
        self.capture = capture  # third-party output into dist/logs/ (ortbuild.logs); False: -v, to the terminal
        self.dist = dist
        self.force = force
        self.repair = repair  # rebuild a TAMPERED artifact (and say what was replaced) instead of refusing
        self.progress: ProgressSink = progress or Progress()
        self.secrets = secrets
        self._probes: dict[tuple[str, str, str], str | None] = {}
        self._digests: dict[tuple[str, int, int], str | None] = {}
        self._models: dict[tuple[str, int, int], tuple[modelfiles.ModelFiles, list[tuple[str, int, int]]]] = {}

    def check_keys(self, buildable: Sequence[Job]) -> None:
        """A build without the keys it needs fails before it starts, with the command that makes them."""
        if buildable and self.secrets.signing is None:
            raise KeyMissing("no signing key: every artifact is signed (ORTBUILD_SIGNING_KEY, "
                             "ORTBUILD_SIGNING_KEY_FILE or --signing-key-file)", keys.make_keys_hint(self.project.root))
        needs = sorted({j.target.name for j in buildable if j.settings.encrypt})
        if needs and self.secrets.encryption is None:
            raise KeyMissing(f"no encryption key, and {', '.join(needs)} encrypt their artifacts (ORTBUILD_KEY, "
                             "ORTBUILD_KEY_FILE or --key-file)",
                             f"make keys: `{keys.MAKE_KEYS}`, or set encrypt = false on a target to opt out")

    def _digest(self, path: Path | None) -> str | None:
        """buildkey.digest(), once per file and run: models and data are shared by many jobs (and a stale job's key
        is computed twice: to find it stale, then to build it)."""
        if path is None:
            return None
        st = path.stat()
        k = (str(path), st.st_size, st.st_mtime_ns)
        if k not in self._digests:
            self._digests[k] = buildkey.digest(path)
        return self._digests[k]

    def model_files(self, path: Path) -> modelfiles.ModelFiles:
        """modelfiles.of(), once per run while neither the graph file nor any of its data files changed."""
        key = modelfiles.stat_key(path)
        known = self._models.get(key)
        if known is not None and all(modelfiles.stat_key(Path(f[0])) == f for f in known[1]):
            return known[0]
        files = modelfiles.of_source(path, where="models")
        self._models[key] = (files, [modelfiles.stat_key(f.path) for f in files.external])
        return files

    def fingerprint(self, job: Job) -> tuple[str, str]:
        """The job's targets.lock digests (source, settings), of its declared settings (lockfile.py)."""
        calibration = self._digest(job.model.calibration) if job.settings.rule.needs_calibration else None
        source = lockfile.source_digest(self.model_files(job.model.path).digests(), self._digest(job.model.inputs),
                                        calibration, self._digest(job.model.expected))
        return source, lockfile.settings_digest(job)

    def lock_jobs(self, jobs: Sequence[Job], lock: lockfile.Lock, *, locked: bool = False) \
            -> tuple[list[Job], list[str]]:
        """The jobs with their up-to-date targets.lock entries laid over their settings, and what to say of the
        others (ortbuild.pipeline.locking; `locked`: --locked)."""
        return locking.lay_over(self.project, jobs, lock, self.fingerprint, locked=locked)

    def _probe(self, p: Provider, target: Target) -> str | None:
        if p.name != "CPUExecutionProvider" and (standin := installed.stand_in(target)) is not None:
            return (f"{standin.reason}; built with the CPU stand-in {standin.requirements[0]} in place of "
                    f"{', '.join(standin.left_out)} (portable artifacts only)")
        plugin = target.plugin_for(p.name)
        key = (p.name, json.dumps(dict(p.options), sort_keys=True), plugin.package if plugin else "")
        if key not in self._probes:
            self._probes[key] = runtime.cached_probe(p, plugin, refresh=self.force)
        return self._probes[key]

    def run(self, jobs: Sequence[Job], workers: int = 1) -> list[JobResult]:
        """Build the jobs, `workers` at a time (in worker processes: the quantizers change the process's
        directory and temp dir, so jobs cannot share one). Results come back in the jobs' order; a failing
        job is reported in its result and stops nothing else."""
        targets = {j.target.name: j.target for j in jobs}
        problems = {name: installed.runtime_problem(t) for name, t in targets.items()}
        buildable = [j for j in jobs if problems[j.target.name] is None]
        self.check_keys(buildable)
        for j in buildable:  # probe once, here: workers get the answers (a probe opens ORT sessions)
            for p in j.settings.providers:
                self._probe(p, j.target)
        results: dict[int, JobResult] = {}
        for i, job in enumerate(jobs):
            if problems[job.target.name]:
                results[i] = JobResult(job.target.name, job.model.name, JobStatus.SKIPPED,
                                       reason=problems[job.target.name] or "", precision=job.settings.precision)
                self.progress(job.name, JobFinished(JobStatus.SKIPPED, f"skipped: {results[i].reason}"))
        for i, job in enumerate(jobs):  # up-to-date jobs are settled here, cheaply (no model is parsed)
            if i not in results and not self.force and (reused := self.run_job(job, reuse_only=True)) is not None:
                results[i] = reused
        todo = [(i, job) for i, job in enumerate(jobs) if i not in results]
        if workers <= 1 or len(todo) <= 1:
            for i, job in todo:
                results[i] = self.run_job(job)
        else:
            results.update(parallel.run_jobs(self.worker_state(), _worker, todo, workers, self.progress))
        return [results[i] for i in range(len(jobs))]

    def worker_state(self) -> parallel.WorkerState:
        """What a worker process needs to build like this builder (it gets it once, at start-up)."""
        return parallel.WorkerState(self.project, self.dist, self.force, self.repair, self.secrets, self._probes,
                                    capture=self.capture, command=self.command, cache=self.cache)

    def _run_phase(self, prep: Prepared, done: Done, res: JobResult, phase: stages.Phase,
                   reused: bool = False) -> None:
        """Run the phase's steps in order: announce each, remember it (a failure names it), time it, hand its
        result on."""
        for step in _pipeline_of(prep):
            if step.phase != phase or (reused and not step.on_reuse) or (step.applies and not step.applies(prep)):
                continue
            self.progress(prep.job.name, StepStarted(step.describe(prep)))
            res.step = step.name
            t, before = time.perf_counter(), len(done)
            try:
                out = step.run(prep, done)
                for result in out if isinstance(out, tuple) else (out,):
                    if result is not None:
                        done.add(result)
                res.steps[step.name] = time.perf_counter() - t
            finally:  # a step that fails still reports what it found first (the share it converted, ...)
                if phase == "build":
                    for result in done.since(before):
                        stages.record(res, result)

    def prepare(self, job: Job) -> Prepared:
        """The job with its build key computed, from digests alone (no model is parsed): usable providers,
        runtime, data, keys (plan uses it to say why a job would rebuild)."""
        usable = [p for p in job.settings.providers if self._probe(p, job.target) is None]
        missing = {p.name: reason for p in job.settings.providers if (reason := self._probe(p, job.target))}
        flavor = installed.installed_flavor()
        if flavor is None:
            raise RuntimeError("runtime_problem() lets no job of a runtime that is not installed start")
        if kind_rule(job.model.kind).directory and not job.model.path.is_dir():  # e.g. made on first use, not yet
            raise ConfigError(str(self.project.file), f"models.{job.model.name}.path",
                              f"{job.model.path} does not exist: generative model '{job.model.name}' is not made yet",
                              "check the path, or make the Hugging Face-format directory first (transformers' "
                              "save_pretrained(); ortbuild's own example: `nox -s example-llm`, which "
                              "`nox -t generative` runs)")
        inputs_sha = self._digest(job.model.inputs) or ""
        secrets = keys.Secrets(self.secrets.encryption if job.settings.encrypt else None, self.secrets.signing)
        if secrets.signing is None:
            raise KeyMissing("no signing key: every artifact is signed", f"make keys: `{keys.MAKE_KEYS}`")
        # the encryption key's id is not part of the key: `ortbuild rekey` re-wraps an artifact under a new key
        # without a rebuild, and the reuse check refuses an artifact sealed for another key (WrongKey)
        sealing: buildkey.Sealing = {"encrypted": secrets.encryption is not None,
                                     "signing_key_id": secrets.signing.key_id,
                                     "deterministic": buildkey.deterministic(), "epoch": self.project.epoch}
        plugins = buildkey.plugin_versions(job.target)
        libraries = runtime.custom_op_libraries(job.settings.custom_ops)
        files = self.model_files(job.model.path)
        parts = buildkey.key_parts(job, files.digests(), inputs_sha, self._digest(job.model.calibration), flavor,
                              missing, sealing, plugins=plugins, libraries=libraries)
        build_key, digests = buildkey.build_key(parts)
        plugin_eps = {p.name: plugin for p in job.settings.providers if (plugin := job.target.plugin_for(p.name))}
        return Prepared(job=job, project=self.project, dist=self.dist,
                        out_dir=paths.inside(self.dist, job.target.name, job.model.name),
                        files=files, usable=usable, missing=missing, flavor=flavor, plugins=plugins,
                        libraries=libraries, inputs_sha=inputs_sha, key=build_key, key_parts=digests, secrets=secrets,
                        plugin_eps=plugin_eps,
                        compile_for=None if missing else compile.provider_to_compile(usable, plugin_eps))

    @typing.overload
    def run_job(self, job: Job) -> JobResult: ...
    @typing.overload
    def run_job(self, job: Job, reuse_only: bool) -> JobResult | None: ...

    def run_job(self, job: Job, reuse_only: bool = False) -> JobResult | None:
        """Build one job (or reuse its published artifact). reuse_only: None unless it can be reused."""
        res = JobResult(job.target.name, job.model.name, JobStatus.FAILED, precision=job.settings.precision)
        start = time.perf_counter()
        try:
            res.step = "prepare"
            prep = self.prepare(job)
            try:
                why, reused = buildkey.published(prep.out_dir, prep.key, prep.secrets.signing, prep.key_parts,
                                            None if self.force else prep.secrets.encryption)
            except Tampered as e:
                if not self.repair:
                    raise
                why, reused = f"TAMPERED, replaced on --repair: {e.message}", None
            if self.force and reused is not None:
                why, reused = "--force", None
            if reuse_only and reused is None:
                return None
            pulled, cache_notes = False, list[str]()
            if reused is None and self.cache is not None and not self.force:  # never read by a forced build
                reused = self._pull(prep, cache_notes)
                pulled = reused is not None
                if pulled and why and why.startswith("TAMPERED"):
                    cache_notes.append(why)
            if reused is None:  # a build is a long phase: said on every stream
                said = "building" if not why else f"building ({why})" if why in ("no artifact yet", "--force") \
                    else f"rebuilding: {why}"
                self.progress(job.name, PhaseStarted(said))
            done = Done()
            if reused is not None:
                if not pulled:
                    self.progress(job.name, JobFinished(JobStatus.UP_TO_DATE, up_to_date(job, self.command)))
                res.notes = list(reused.notes)
                res.source_size = reused.source.size
                if reused.precision.changed is not None:
                    res.converted = reused.precision.changed.get("converted")
            else:
                log = logs.log_path(self.dist, job.target.name, job.model.name, "build") if self.capture else None
                cap: logs.Captured | None = None
                try:
                    with logs.captured(log, self.dist) as cap, \
                            workspace.private_dir(workspace.temp_need(prep.files.size)) as work:
                        self._run_phase(dataclasses.replace(prep, work=work), done, res, "build")
                finally:
                    res.log = cap
                if why and why.startswith("TAMPERED"):  # the summary says what was replaced
                    res.notes.append(why)
            self._run_phase(prep, done, res, "verify", reused=reused is not None)
            m = done[manifest_types.Manifest]
            res.notes[:0] = cache_notes  # the build's own notes replaced the list
            # a reused portable-only artifact is still portable-only: the status says so (and --strict sees it)
            res.status = JobStatus.PORTABLE if prep.missing else (
                JobStatus.BUILT if reused is None else JobStatus.PULLED if pulled else JobStatus.UP_TO_DATE)
            res.level = m.optimization.applied
            res.artifact = str(prep.out_dir / m.artifact.file)
            res.size = m.artifact.size
            res.reason = "; ".join(dict.fromkeys(prep.missing.values()))  # a stand-in's reason once
            if reused is None and self.cache is not None:
                self._push(prep, m, res.notes)
            if reused is None or pulled:
                self.progress(job.name, JobFinished(res.status, f"{res.status}: {res.artifact}"
                                                    + (f" (from {self.cache.where})" if pulled and self.cache else "")))
        except OrtbuildError as e:  # ConfigError (bad inputs/calibration files) included
            if reuse_only:
                return None  # the full run reports it
            res.status = JobStatus.FAILED
            res.error = e
            res.reason = f"{e.label}: {e.message}" if isinstance(e, Tampered | WrongKey) else e.message
        except Exception as e:  # a tool (onnx, ORT, a quantizer) rejected the model: name the step
            if reuse_only:
                return None
            res.status = JobStatus.FAILED
            res.error = StepError(job.target.name, job.model.name, res.step, first_line(e),
                                  "rerun with --debug for the full traceback")
            res.error.__cause__ = e
            res.debug = traceback.format_exc()
            res.reason = res.error.message
        finally:
            res.seconds = time.perf_counter() - start
        if res.status is JobStatus.FAILED:
            self.progress(job.name, JobFinished(JobStatus.FAILED, f"FAILED: {res.reason}"))
        return res


    def _pull(self, prep: Prepared, notes: list[str]) -> manifest_types.Manifest | None:
        """The job's artifact from the cache, verified and installed into dist/, or None (a miss, or an entry
        refused: a warning in the job's notes names it and why; the job is then built)."""
        assert self.cache is not None
        if not prep.job.settings.encrypt:
            return None  # never stored (cache_.PLAINTEXT): _push says so
        entry = cache_.entry_id(prep.key, prep.job.target.name, prep.job.model.name)
        shown = self.cache.shown(entry)
        top = cache_.staging(self.dist)
        folder = top / prep.job.target.name / prep.job.model.name
        try:
            folder.mkdir(parents=True, mode=0o700)
            got = self.cache.fetch(entry, folder)
            if got is None:
                return None
            why, m = buildkey.published(folder, prep.key, prep.secrets.signing, prep.key_parts,
                                        prep.secrets.encryption)
            refusal = (f"its manifest: {why}" if m is None else cache_.cacheable(m)
                       or next((f"it lacks {n}" for n in cache_.entry_names(m) if n not in got), None))
            if refusal is None and m is not None:
                cache_.install(folder, prep.out_dir, cache_.entry_names(m), self.dist)
                notes.append(f"pulled from the cache ({shown})")
                return m
        except cache_.CacheProblem as e:
            self._cache_off(prep, notes, e.message)
            return None
        except OrtbuildError as e:  # Tampered, WrongKey, ArtifactError: the entry is not this build's artifact
            refusal = (f"{e.label}: " + e.message.removeprefix(f"cache entry {shown}: ")
                       .replace(f"{folder}/", "").replace(f"{folder}: ", "").replace(str(folder), "the entry"))
        finally:
            shutil.rmtree(top, ignore_errors=True)
        notes.append(f"WARNING: cache entry {shown} refused ({refusal}); building it, the build replaces it")
        self.progress(prep.job.name, PhaseStarted(notes[-1]))
        return None

    def _cache_off(self, prep: Prepared, notes: list[str], problem: str) -> None:
        """A cache that cannot be read or written is asked nothing more by this builder (each request could stall
        every job for its timeouts); the build goes on."""
        notes.append(f"WARNING: cache {self.cache_where}: {problem}; not used for the rest of this build")
        self.progress(prep.job.name, PhaseStarted(notes[-1]))
        self.cache = None

    def _push(self, prep: Prepared, m: manifest_types.Manifest, notes: list[str]) -> None:
        """Put a built artifact into the cache (a sealed one only); a failure is a warning."""
        assert self.cache is not None
        why = cache_.cacheable(m)
        if why:
            notes.append(f"not cached: {why}")
            return
        entry = cache_.entry_id(prep.key, prep.job.target.name, prep.job.model.name)
        self.progress(prep.job.name, PhaseStarted(f"storing it in the cache ({self.cache.shown(entry)})"))
        try:
            self.cache.store(entry, prep.out_dir, cache_.entry_names(m),
                             {"build_key": prep.key, "target": prep.job.target.name, "model": prep.job.model.name},
                             {name: sha for name, sha, _, _ in m.signed_files()})
        except cache_.CacheProblem as e:
            self._cache_off(prep, notes, e.message)


def _generative_pipeline() -> tuple[stages.Step, ...]:
    from ortbuild.pipeline import genai

    return genai.GENERATIVE


# The steps of each kind of model (ortbuild.project.kinds): a generative model's are ortbuild.pipeline.genai's
PIPELINES: dict[Kind, Callable[[], tuple[stages.Step, ...]]] = {"onnx": lambda: stages.PIPELINE,
                                                                "generative": _generative_pipeline}


def _pipeline_of(prep: Prepared) -> tuple[stages.Step, ...]:
    """The steps of a job: its kind of model's (PIPELINES)."""
    return PIPELINES[prep.job.model.kind]()


def up_to_date(job: Job, command: str) -> str:
    """What a reused job says, with how to rebuild it from the command that printed it (only `ortbuild build` has
    --force: `test` and `profile` build what is missing or stale, and name the build that rebuilds)."""
    if command == "build":
        return "up to date (unchanged build key; --force rebuilds)"
    t, m = job.target.name, job.model.name
    return (f"up to date (unchanged build key; to rebuild it: ortbuild build --force -t {t} -m {m}, or "
            f"nox -s \"{job.target.session('build')}\" -- --force -m {m})")


def _worker(state: parallel.WorkerState, progress: ProgressSink) -> Callable[[Job], JobResult]:
    """A worker process's builder (parallel.run_jobs calls this in each worker, with its progress sink)."""
    builder = Builder(state.project, state.dist, secrets=state.secrets, force=state.force, repair=state.repair,
                      progress=progress, capture=state.capture, command=state.command, cache=state.cache)
    builder._probes = dict(state.probes)
    return builder.run_job
