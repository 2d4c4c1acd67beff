"""Offline checks of infra/: every config loads, validates where a validator exists, names real
workflow entry points with flags they accept, and pins the versions pyproject.toml pins.

    timeout 300 .venv/bin/python -m pytest tests/test_infra.py -q
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from workflows.catalog import paper_tasks

REPO = Path(__file__).resolve().parents[1]
INFRA = REPO / "infra"
# The workflow command-line contract (every workflow takes these flags).
WORKFLOW_FLAGS = {"--preset", "--data", "--num-workers", "--use-gpu", "--max-epochs",
                  "--storage-path", "--tracking-uri", "--experiment", "--run-name",
                  "--accelerator-type", "--set"}
# The paper tasks' workflow files, as found in workflows/.
ALL_WORKFLOWS = {f"workflows/{name}.py" for name in paper_tasks()}


def load(name: str) -> dict:
    return yaml.safe_load((INFRA / name).read_text())


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def pinned(package: str) -> str:
    """The exact version pyproject.toml pins for `package` (fails if it is not pinned with ==)."""
    for dep in pyproject()["project"]["dependencies"]:
        req = Requirement(dep)
        if req.name == package:
            (spec,) = list(req.specifier)
            assert spec.operator == "==", f"pyproject.toml must pin {package} with ==, has {dep}"
            return spec.version
    raise AssertionError(f"{package} is not a dependency in pyproject.toml")


def specifier(package: str) -> SpecifierSet:
    for dep in pyproject()["project"]["dependencies"]:
        req = Requirement(dep)
        if req.name == package:
            return req.specifier
    raise AssertionError(f"{package} is not a dependency in pyproject.toml")


def dockerfile_args(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)", path.read_text(), flags=re.M))


def workflow_commands() -> list[tuple[str, str, list[str]]]:
    """(source, script, argv) of every `python workflows/X.py ...` in the README and the RayJob."""
    blocks = re.findall(r"```bash\n(.*?)```", (INFRA / "README.md").read_text(), flags=re.S)
    readme = "\n".join(blocks).replace("\\\n", " ")  # code blocks, continuation lines joined
    sources = [("infra/README.md", readme),
               ("infra/kuberay-rayjob.yaml", load("kuberay-rayjob.yaml")["spec"]["entrypoint"]),
               ("infra/kuberay-rayjob-s3.yaml",
                load("kuberay-rayjob-s3.yaml")["spec"]["entrypoint"])]
    found = []
    for source, text in sources:
        for script, args in re.findall(r"python\s+(workflows/\w+\.py)([^\n`]*)", text):
            found.append((source, script, shlex.split(args)))
    return found


def flag_values(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, tok in enumerate(argv):
        if tok.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[tok] = None if nxt is None or nxt.startswith("--") else nxt
    return out


# --- every file loads ---------------------------------------------------------------------------


def test_every_infra_file_present_and_yaml_loads():
    for name in ("cluster-aws.yaml", "kuberay-rayjob.yaml", "kuberay-rayjob-s3.yaml",
                 "kuberay-shared-pvc.yaml",
                 "runtime_env.yaml", "mlflow/docker-compose.yaml", "Dockerfile",
                 "Dockerfile.dockerignore", "mlflow/Dockerfile", "mlflow/env.example",
                 "README.md"):
        assert (INFRA / name).is_file(), f"infra/{name} is missing"
    yamls = sorted(INFRA.rglob("*.yaml"))
    assert len(yamls) >= 5
    for path in yamls:
        doc = yaml.safe_load(path.read_text())
        assert isinstance(doc, dict) and doc, f"{path} did not load as a YAML mapping"


# --- entry points -------------------------------------------------------------------------------


def test_entry_points_use_the_workflow_flag_contract():
    commands = workflow_commands()
    assert {script for _, script, _ in commands} == ALL_WORKFLOWS, \
        "README covers every paper workflow"
    for source, script, argv in commands:
        flags = flag_values(argv)
        assert set(flags) <= WORKFLOW_FLAGS, f"{source}: {script} has unknown flags {flags}"
        assert flags.get("--preset") in ("paper", "smoke"), f"{source}: {script} --preset"
        assert flags.get("--storage-path"), f"{source}: {script} needs a shared --storage-path"
        assert int(flags["--num-workers"]) >= 1


_HELP = """
import contextlib, io, json, runpy, sys
out = {}
for script in sys.argv[1:]:
    buf = io.StringIO()
    sys.argv = [script, "--help"]
    with contextlib.redirect_stdout(buf):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit:
            pass
    out[script] = buf.getvalue()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def workflow_help() -> dict[str, str]:
    """`--help` text of every referenced workflow that exists (one interpreter for all)."""
    scripts = sorted({s for _, s, _ in workflow_commands() if (REPO / s).is_file()})
    if not scripts:
        return {}
    proc = subprocess.run([sys.executable, "-c", _HELP, *scripts], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("script", sorted({s for _, s, _ in workflow_commands()}))
def test_entry_point_script_exists_and_takes_its_flags(script, workflow_help):
    assert (REPO / script).is_file(), (
        f"{script} is referenced by infra/ (README.md / kuberay-rayjob.yaml) but does not exist: "
        "the workflow must be written before infra/ can run it"
    )
    help_text = workflow_help[script]
    assert "usage:" in help_text, f"`python {script} --help` printed no argparse usage"
    for src, s, argv in workflow_commands():
        if s == script:
            for flag in flag_values(argv):
                assert flag in help_text, f"{src} passes {flag} to {script}; its --help lacks it"


# --- versions -----------------------------------------------------------------------------------


def test_versions_agree_with_pyproject():
    torch_v, ray_v, mlflow_spec = pinned("torch"), pinned("ray"), specifier("mlflow")
    args = dockerfile_args(INFRA / "Dockerfile")
    assert args["TORCH_VERSION"] == torch_v
    assert args["RAY_VERSION"] == ray_v
    assert args["MLFLOW_VERSION"] in mlflow_spec, f"{args['MLFLOW_VERSION']} not in {mlflow_spec}"
    assert args["PYTHON_VERSION"] + ".0" in SpecifierSet(pyproject()["project"]["requires-python"])
    assert "download.pytorch.org/whl/${TORCH_CUDA}" in (INFRA / "Dockerfile").read_text()
    assert "cuda" in re.search(r"^ARG CUDA_IMAGE=(\S+)", (INFRA / "Dockerfile").read_text(),
                               flags=re.M).group(1)

    # The cluster launcher installs the same versions on its nodes.
    setup = "\n".join(load("cluster-aws.yaml")["setup_commands"])
    assert f"torch=={torch_v}" in setup
    assert f"whl/{args['TORCH_CUDA']}" in setup
    assert f"--python {args['PYTHON_VERSION']}" in setup
    assert f"mlflow=={args['MLFLOW_VERSION']}" in setup

    # KubeRay runs the image built from infra/Dockerfile at the project's version and Ray version.
    spec = load("kuberay-rayjob.yaml")["spec"]["rayClusterSpec"]
    assert spec["rayVersion"] == ray_v
    version = pyproject()["project"]["version"]
    pods = [spec["headGroupSpec"]] + spec["workerGroupSpecs"]
    for group in pods:
        for c in group["template"]["spec"]["containers"]:
            assert c["image"].endswith(f"/convs2s-ray:{version}"), c["image"]

    # The tracking server runs the MLflow version the clients use.
    mlflow_svc = load("mlflow/docker-compose.yaml")["services"]["mlflow"]
    assert mlflow_svc["build"]["args"]["MLFLOW_VERSION"] == args["MLFLOW_VERSION"]
    assert dockerfile_args(INFRA / "mlflow" / "Dockerfile")["MLFLOW_VERSION"] == \
        args["MLFLOW_VERSION"]


def test_dockerfile_copies_the_project():
    text = (INFRA / "Dockerfile").read_text()
    assert re.search(r"^WORKDIR /app$", text, flags=re.M)
    for src in re.findall(r"^COPY (?!--)(.+) \S+$", text, flags=re.M):
        for part in src.split():
            assert (REPO / part).exists(), f"infra/Dockerfile copies {part}, missing in the repo"
    packages = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    for pkg in packages:  # every package pyproject installs is in the build context
        assert f"COPY {pkg.rstrip('*')} " in text, f"infra/Dockerfile does not copy {pkg}"
    assert "wget" in text  # KubeRay's health probes call wget
    # The dependencies are installed before the code is copied, the project after it without
    # them, and the commit's build argument comes last: a code change or a new commit rebuilds
    # neither the dependency layer nor anything above it
    lines = text.splitlines()
    first_code = min(i for i, line in enumerate(lines) if line.startswith("COPY convs2s"))
    deps = next(i for i, line in enumerate(lines) if "uv pip install -r pyproject.toml" in line)
    project = next(i for i, line in enumerate(lines) if "uv pip install --no-deps ." in line)
    commit = next(i for i, line in enumerate(lines) if line.startswith("ARG GIT_COMMIT"))
    assert deps < first_code < project < commit, (deps, first_code, project, commit)
    assert not [line for line in lines[first_code:] if "pip install" in line
                and "--no-deps" not in line]
    ignored = (INFRA / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".git", "data", "runs", "mlruns", "mlflow.db"} <= set(ignored)
    # The team server's secrets (infra/mlflow/.env, which infra/README.md has the user write
    # beside the COPY'd infra/) stay out of the image, as Docker's matcher reads the file
    from fnmatch import fnmatch

    patterns = [p for p in ignored if not p.startswith("#")]
    for secret in ("infra/mlflow/.env", ".env", "infra/mlflow/.env.local"):
        assert any(fnmatch(secret, p) or fnmatch(secret, p.removeprefix("**/"))
                   for p in patterns), f"{secret} would be copied into the image"
    # ... and with a builder that reads no Dockerfile.dockerignore (legacy, kaniko): no COPY
    # takes in the folder that holds it
    copied = [part for src in re.findall(r"^COPY (?!--)(.+) \S+$", text, flags=re.M)
              for part in src.split()]
    assert not [p for p in copied if "infra/mlflow".startswith(p.rstrip("/"))], copied


# --- Ray cluster launcher -----------------------------------------------------------------------


def test_cluster_config_passes_ray_validation():
    from ray.autoscaler._private.commands import prepare_config
    from ray.autoscaler._private.util import validate_config

    raw = load("cluster-aws.yaml")
    validate_config(prepare_config(raw))  # Ray's own schema and node-type checks, no cloud calls
    types = raw["available_node_types"]
    assert raw["provider"]["type"] == "aws"
    assert types[raw["head_node_type"]]["resources"]["GPU"] == 0
    gpu_types = {k: v for k, v in types.items() if v["resources"].get("GPU", 0) > 0}
    assert {v["node_config"]["InstanceType"].split(".")[0] for v in gpu_types.values()} >= \
        {"g5", "p4d"}
    # each GPU node type names its GPU model (a run asks for one with --accelerator-type)
    models = {k: [r for r in v["resources"] if r.startswith("accelerator_type:")]
              for k, v in gpu_types.items()}
    assert all(len(m) == 1 for m in models.values()), models
    assert len({m[0] for m in models.values()}) == len(models)
    for name, t in types.items():
        if name != raw["head_node_type"]:
            assert 0 <= t["min_workers"] <= t["max_workers"], name
    assert sum(t.get("max_workers", 0) for t in types.values()) <= raw["max_workers"]

    # The project is synced and installed, nodes join with token authentication.
    assert raw["file_mounts"]["~/convs2s"] == "."
    assert "~/.ray/auth_token" in raw["file_mounts"]
    assert any("-e ~/convs2s" in c for c in raw["setup_commands"])
    for cmd in raw["head_start_ray_commands"] + raw["worker_start_ray_commands"]:
        if "ray start" in cmd:
            assert "RAY_AUTH_MODE=token" in cmd, cmd
    for heavy in ("/.venv", "/.git", "/data", "/runs", "/mlruns", "mlflow.db", "*.pt"):
        assert heavy in raw["rsync_exclude"], heavy
    assert ".gitignore" in raw["rsync_filter"]  # (MLflow's artifacts, test outputs, stores)
    # No node on Ray's `latest_dlami`: in Ray 2.60 the Ubuntu 18.04 DLAMI (glibc 2.27), where
    # the torch wheel (manylinux_2_28) does not install; the README says which AMI replaces
    # the placeholder, as it does the EFS id's.
    from ray.autoscaler._private.aws.config import DEFAULT_AMI_NAME

    assert "18.04" in DEFAULT_AMI_NAME  # (if Ray moves on, this check may be relaxed)
    images = {t["node_config"]["ImageId"] for t in types.values()}
    assert images == {"ami-REPLACE-ME"}, images
    readme = (INFRA / "README.md").read_text()
    assert "ami-REPLACE-ME" in readme and "base-oss-nvidia-driver-gpu-ubuntu-22.04" in readme
    # `ray get-auth-token` prints the cluster's token: every command given keeps it off screen
    for doc in (INFRA / "README.md", INFRA / "cluster-aws.yaml", INFRA.parent / "README.md"):
        for line in doc.read_text().splitlines():
            if "ray get-auth-token" in line and "--generate" in line:
                assert ">/dev/null" in line, (doc.name, line)


def test_aws_storage_is_shared_and_jobs_fit_the_cluster():
    raw = load("cluster-aws.yaml")
    setup = "\n".join(raw["setup_commands"])
    mount = re.search(r"mountpoint -q (\S+)", setup).group(1)
    assert f"efs.{raw['provider']['region']}.amazonaws.com:/ {mount}" in setup
    gpu_capacity = sum(t.get("max_workers", 0) * t["resources"].get("GPU", 0)
                       for t in raw["available_node_types"].values())
    largest_node = max(t["resources"].get("GPU", 0) for t in raw["available_node_types"].values())
    readme_cmds = [c for c in workflow_commands() if c[0] == "infra/README.md"]
    for _, script, argv in readme_cmds:
        flags = flag_values(argv)
        path = flags["--storage-path"]
        assert path.startswith(mount + "/") or path.startswith("s3://"), (
            f"{script}: --storage-path {path} is not on the shared mount {mount}")
        assert "--use-gpu" in flags and int(flags["--num-workers"]) <= gpu_capacity
        # one GPU model per data-parallel group, with enough of them in the cluster config
        model = flags.get("--accelerator-type")
        assert model, f"{script}: give --accelerator-type (the config has two GPU models)"
        of_model = sum(t.get("max_workers", 0) * t["resources"].get("GPU", 0)
                       for t in raw["available_node_types"].values()
                       if f"accelerator_type:{model}" in t["resources"])
        assert int(flags["--num-workers"]) <= of_model, (script, model, of_model)
    assert largest_node >= 8  # the paper's 8-GPU En-Fr run fits on one node
    assert load("runtime_env.yaml")["env_vars"]["HF_HOME"].startswith(mount + "/")


# --- runtime environment ------------------------------------------------------------------------


def _zip_names(root: Path, excludes: list[str], tmp: Path, include_gitignore: bool) -> list[str]:
    from ray._private.runtime_env.packaging import _zip_files

    out = tmp / "pkg.zip"
    _zip_files(str(root), excludes, str(out), include_gitignore=include_gitignore)
    with zipfile.ZipFile(out) as z:
        return z.namelist()


def test_runtime_env_excludes_heavy_paths(tmp_path):
    from ray.runtime_env import RuntimeEnv

    env = load("runtime_env.yaml")
    assert env["working_dir"] == "."
    RuntimeEnv(**{**env, "working_dir": str(REPO)})  # Ray's own validation of every field

    # A checkout with every heavy path, packaged by Ray's own zip routine with our excludes.
    tree = tmp_path / "checkout"
    keep = ["convs2s/model/network.py", "workflows/wmt14_en_fr.py", "preprocessing/data.py",
            "convs2s/data/readme.txt", "infra/runtime_env.yaml"]
    drop = [".venv/lib/torch.so", ".git/objects/ab", "data/wmt14/train.parquet",
            "runs/exp1/checkpoint_000/checkpoint.pt", "mlruns/0/meta.yaml", "mlflow.db",
            "model.pt", "convs2s/__pycache__/model.cpython-311.pyc",
            # secrets, packaged where .gitignore is not honoured (the team server's passwords)
            "infra/mlflow/.env", ".env.local", "deploy/key.pem"]
    for rel in keep + drop:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("x")
    names = set(_zip_names(tree, env["excludes"], tmp_path, include_gitignore=False))
    assert set(keep) <= names, f"wrongly excluded: {set(keep) - names}"
    assert not names & set(drop), f"not excluded: {names & set(drop)}"


def test_real_checkout_packages_small(tmp_path):
    from ray._private.runtime_env.packaging import PACKAGE_SIZE_WARNING

    env = load("runtime_env.yaml")
    names = _zip_names(REPO, env["excludes"], tmp_path, include_gitignore=True)
    assert "convs2s/metrics/scoring.py" in names and "infra/runtime_env.yaml" in names
    assert not [n for n in names if n.startswith((".venv/", ".git/")) or n.endswith(".pt")]
    size = (tmp_path / "pkg.zip").stat().st_size
    assert size < PACKAGE_SIZE_WARNING, f"working_dir package is {size / 2**20:.0f} MiB"


# --- KubeRay ------------------------------------------------------------------------------------


def test_kuberay_rayjob_runs_a_workflow_on_gpus_with_shared_storage():
    from ray.runtime_env import RuntimeEnv

    job = load("kuberay-rayjob.yaml")
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["rayClusterSpec"]["authOptions"]["mode"] == "token"
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    # /app in the image is the repository (infra/Dockerfile WORKDIR + COPY).
    assert runtime_env["working_dir"] == "/app"
    RuntimeEnv(**{**runtime_env, "working_dir": str(REPO)})
    assert "MLFLOW_TRACKING_URI" in runtime_env["env_vars"]

    (_, script, argv), = [c for c in workflow_commands() if c[0] == "infra/kuberay-rayjob.yaml"]
    assert script == "workflows/wmt14_en_fr.py"
    # KubeRay's submitter pod runs `ray job submit ... -- <entrypoint>` through its own shell,
    # which expands a $VARIABLE before the job's runtime env (env_vars) exists: the driver
    # reads MLFLOW_TRACKING_URI from that env itself
    for name in ("kuberay-rayjob.yaml", "kuberay-rayjob-s3.yaml"):
        assert "$" not in load(name)["spec"]["entrypoint"], name
    flags = flag_values(argv)
    assert flags["--preset"] == "paper" and "--use-gpu" in flags

    cluster = spec["rayClusterSpec"]
    gpus = sum(int(g["replicas"]) * int(c["resources"]["limits"].get("nvidia.com/gpu", 0))
               for g in cluster["workerGroupSpecs"] for c in g["template"]["spec"]["containers"])
    assert int(flags["--num-workers"]) <= gpus

    pvc = load("kuberay-shared-pvc.yaml")
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]
    for group in [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
                  for v in pod["volumes"] if "persistentVolumeClaim" in v}
        shared = [v for v, claim in claims.items() if claim == pvc["metadata"]["name"]]
        assert shared, "every pod mounts the shared claim"
        mounts = [m["mountPath"] for c in pod["containers"] for m in c["volumeMounts"]
                  if m["name"] in shared]
        assert any(flags["--storage-path"].startswith(m + "/") for m in mounts)
        assert runtime_env["env_vars"]["HF_HOME"].startswith(mounts[0] + "/")


def test_kuberay_rayjob_on_a_bucket_is_the_same_job_with_s3_storage_and_no_volume():
    """kuberay-rayjob-s3.yaml: the shared-volume job with its storage path in a bucket, reached
    through the pods' service account; otherwise the same cluster and settings."""
    shared, s3 = load("kuberay-rayjob.yaml"), load("kuberay-rayjob-s3.yaml")
    (_, script, argv), = [c for c in workflow_commands() if c[0] == "infra/kuberay-rayjob-s3.yaml"]
    (_, script0, argv0), = [c for c in workflow_commands() if c[0] == "infra/kuberay-rayjob.yaml"]
    flags, flags0 = flag_values(argv), flag_values(argv0)
    assert script == script0 and flags["--storage-path"].startswith("s3://")
    assert {k: v for k, v in flags.items() if k not in ("--storage-path", "--run-name")} == \
        {k: v for k, v in flags0.items() if k not in ("--storage-path", "--run-name")}
    cluster, cluster0 = s3["spec"]["rayClusterSpec"], shared["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == cluster0["rayVersion"]
    for group in [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        assert pod["serviceAccountName"]  # the bucket's IAM role (IRSA / Pod Identity)
        assert not [v for v in pod.get("volumes", []) if "persistentVolumeClaim" in v]
    env = yaml.safe_load(s3["spec"]["runtimeEnvYAML"])["env_vars"]
    assert not [k for k in env if "SECRET" in k or k == "AWS_ACCESS_KEY_ID"]  # no keys in files


@pytest.mark.parametrize("name", ["kuberay-rayjob.yaml", "kuberay-rayjob-s3.yaml",
                                  "kuberay-rayservice.yaml"])
def test_kuberay_pods_take_the_tracking_login_from_an_optional_secret(name):
    """Head and worker containers get MLFLOW_TRACKING_USERNAME / _PASSWORD from one Secret,
    optional (a server without logins needs none); the job's runtime_env (the service's
    applications') holds no login."""
    spec = load(name)["spec"]
    cluster = spec.get("rayClusterSpec") or spec["rayClusterConfig"]
    secrets = set()
    for group in [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]:
        for container in group["template"]["spec"]["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
                assert var in env, f"{name}: {container['name']} lacks {var}"
                assert "value" not in env[var], f"{name}: {var} written in the file"
                ref = env[var]["valueFrom"]["secretKeyRef"]
                assert ref["optional"] is True and ref["key"]
                secrets.add(ref["name"])
    assert len(secrets) == 1, secrets
    runtime_envs = ([yaml.safe_load(spec["runtimeEnvYAML"])] if "runtimeEnvYAML" in spec else
                    [app.get("runtime_env", {}) for app in
                     yaml.safe_load(spec["serveConfigV2"])["applications"]])
    for runtime_env in runtime_envs:
        assert not {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"} & set(
            runtime_env.get("env_vars", {}))
    (secret,) = secrets
    assert f"kubectl create secret generic {secret}" in (INFRA / "README.md").read_text()


# --- Serve --------------------------------------------------------------------------------------


def test_serve_config_names_the_model_a_workflow_registers():
    """infra/serve/translator.yaml serves Multi30k's champion: the registered model the
    workflow's champion step writes, `<workflow>-<main test set>` (workflows/engine.py)."""
    from ray.serve.schema import ServeDeploySchema

    from workflows.lineage import registered_name
    from workflows.multi30k_en_de import cpu

    doc = yaml.safe_load((INFRA / "serve" / "translator.yaml").read_text())
    ServeDeploySchema.model_validate(doc)  # a config `serve deploy` accepts
    (app,) = doc["applications"]
    uri = app["args"]["model"]
    assert uri.startswith("models:/") and uri.endswith("@champion"), uri
    name = uri.removeprefix("models:/").removesuffix("@champion")
    assert name == registered_name("multi30k_en_de", "test_2016_flickr")
    workflow = cpu()  # the workflow's own name and main test set
    assert (workflow.name, workflow.test_sets["test"]) == ("multi30k_en_de", "test_2016_flickr")


def test_kuberay_rayservice_serves_the_rayjobs_champion_on_gpu_replicas_that_scale():
    """infra/kuberay-rayservice.yaml: the application of infra/serve/translator.yaml (the
    same builder and settings) serving the champion of the En-Fr run infra/kuberay-rayjob.yaml
    trains, a GPU a replica; Serve's autoscaling up to its most replicas fits the GPU worker
    group's most pods (KubeRay's autoscaler adds them); Serve's port is the head's `serve`
    port, which KubeRay's Serve service routes to; every pod knows the tracking server."""
    from ray.serve.schema import ServeDeploySchema

    from convs2s.serving.online import ServeSettings
    from workflows.engine import champion_sets
    from workflows.lineage import registered_name
    from workflows.wmt14_en_fr import paper

    doc = load("kuberay-rayservice.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayService")
    serve_config = yaml.safe_load(doc["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(serve_config)  # a config Serve accepts
    (app,) = serve_config["applications"]
    (local,) = yaml.safe_load((INFRA / "serve" / "translator.yaml").read_text())["applications"]
    assert app["import_path"] == local["import_path"]
    assert "working_dir" not in app.get("runtime_env", {})  # (the image has the project)
    differ = {k for k in set(app["args"]) | set(local["args"])
              if app["args"].get(k) != local["args"].get(k)}
    assert differ == {"model", "gpus_per_replica"}, differ
    assert "wmt14_en_fr.py --preset paper" in load("kuberay-rayjob.yaml")["spec"]["entrypoint"]
    _, main_test = champion_sets(paper().test_sets)
    assert app["args"]["model"] == f"models:/{registered_name('wmt14_en_fr', main_test)}@champion"

    settings = ServeSettings(**app["args"]).for_replicas()
    actor = settings.deployment_options()["ray_actor_options"]
    cluster = doc["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == pinned("ray")
    assert cluster["enableInTreeAutoscaling"] is True
    (gpu,) = cluster["workerGroupSpecs"]
    (worker,) = gpu["template"]["spec"]["containers"]
    per_pod = int(worker["resources"]["limits"]["nvidia.com/gpu"])
    assert 0 < actor["num_gpus"] <= per_pod
    assert settings.max_replicas * actor["num_gpus"] <= gpu["maxReplicas"] * per_pod
    assert settings.min_replicas * actor["num_gpus"] <= gpu["minReplicas"] * per_pod
    assert actor["num_cpus"] <= int(worker["resources"]["limits"]["cpu"])
    (head,) = cluster["headGroupSpec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert ports["serve"] == serve_config["http_options"]["port"]
    version = pyproject()["project"]["version"]
    for container in (head, worker):
        assert container["image"].endswith(f"/convs2s-ray:{version}"), container["image"]
        env = {e["name"]: e for e in container["env"]}
        assert env["MLFLOW_TRACKING_URI"]["value"].startswith("http://")
    assert "kuberay-rayservice.yaml" in (INFRA / "README.md").read_text()


# --- MLflow tracking server ---------------------------------------------------------------------


def test_mlflow_compose_services_and_server_flags():
    compose = load("mlflow/docker-compose.yaml")
    services = compose["services"]
    assert {"postgres", "minio", "create-bucket", "mlflow"} <= set(services)
    cmd = services["mlflow"]["command"]
    assert cmd[:2] == ["mlflow", "server"]
    flags = {tok: (cmd[i + 1] if i + 1 < len(cmd) else None)
             for i, tok in enumerate(cmd) if tok.startswith("--")}

    # Every flag exists in the installed MLflow's `server` command (same major version).
    from mlflow.cli import cli

    known = {o for p in cli.commands["server"].params for o in p.opts}
    assert set(flags) <= known, f"unknown mlflow server flags {set(flags) - known}"

    # The store (its password in it) from the environment, not on the command line (`ps`)
    from mlflow.cli import server

    (store,) = [p for p in server.params if p.name == "backend_store_uri"]
    assert "--backend-store-uri" not in flags and store.envvar == "MLFLOW_BACKEND_STORE_URI"
    backend = services["mlflow"]["environment"][store.envvar]
    pg = services["postgres"]["environment"]
    assert backend.startswith(f"postgresql://{pg['POSTGRES_USER']}:")
    assert backend.endswith(f"@postgres:5432/{pg['POSTGRES_DB']}")
    bucket = flags["--artifacts-destination"]
    assert bucket.startswith("s3://")
    assert f"local/{bucket.removeprefix('s3://')}" in " ".join(services["create-bucket"]["command"])
    assert flags["--host"] == "0.0.0.0" and "--serve-artifacts" in flags
    # Listening on every interface, so authentication is on: MLflow's basic-auth app (an app
    # the installed MLflow registers), configured by the auth entrypoint the image runs (the
    # service keeps the image's entrypoint) from the admin password and key compose requires.
    from importlib.metadata import entry_points

    assert flags["--app-name"] == "basic-auth"
    assert "basic-auth" in {e.name for e in entry_points(group="mlflow.app")}
    mlflow_service = services["mlflow"]
    assert mlflow_service["build"]["dockerfile"] == "Dockerfile"
    assert "entrypoint" not in mlflow_service
    dockerfile = (INFRA / "mlflow" / "Dockerfile").read_text()
    assert "COPY auth-entrypoint.sh /usr/local/bin/auth-entrypoint.sh" in dockerfile
    assert 'ENTRYPOINT ["/usr/local/bin/auth-entrypoint.sh"]' in dockerfile
    for name in ("MLFLOW_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert mlflow_service["environment"][name].startswith(f"${{{name}:?")
    assert services["mlflow"]["environment"]["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert services["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    # No server-side job runner (its huey consumers cost CPU for MLflow features the project
    # does not use), through MLflow's own variable.
    from mlflow.environment_variables import MLFLOW_SERVER_ENABLE_JOB_EXECUTION

    assert services["mlflow"]["environment"][MLFLOW_SERVER_ENABLE_JOB_EXECUTION.name] == "false"

    # The allowed Host headers admit what clients send, NAME:PORT, by MLflow's own matcher (a
    # bare name matched only port 80: every request through a name was a 403, /health not)
    from mlflow.server.security_utils import is_allowed_host_header

    default = flags["--allowed-hosts"].split(":-", 1)[1].rstrip("}").split(",")
    example = dict(line.split("=", 1) for line in (INFRA / "mlflow" / "env.example")
                   .read_text().splitlines() if line and not line.startswith("#"))
    given = example["MLFLOW_ALLOWED_HOSTS"].split(",")
    for hosts, names in ((default, ["mlflow", "localhost", "127.0.0.1"]),
                         (given, ["mlflow", "localhost", "mlflow.example.internal"])):
        for name in names:
            assert is_allowed_host_header(hosts, f"{name}:5000"), (name, hosts)
        assert is_allowed_host_header(hosts, "10.0.3.7:5000")
        assert not is_allowed_host_header(hosts, "attacker.example.com:5000")

    # ... and the UI's POSTs from a browser on the server's name pass MLflow's CORS check
    # (the runs table loads by POST: every page through the name was a 403)
    from mlflow.server.security_utils import should_block_cors_request

    origins = example["MLFLOW_CORS_ALLOWED_ORIGINS"].split(",")
    assert not should_block_cors_request("http://mlflow.example.internal:5000", "POST", origins)
    assert should_block_cors_request("https://attacker.example.com", "POST", origins)
    assert flags["--cors-allowed-origins"].startswith("${MLFLOW_CORS_ALLOWED_ORIGINS:-")

    # Every variable the compose file requires is set in env.example.
    required = set(re.findall(r"\$\{(\w+):\?", (INFRA / "mlflow" / "docker-compose.yaml")
                              .read_text()))
    example = dict(line.split("=", 1) for line in (INFRA / "mlflow" / "env.example")
                   .read_text().splitlines() if line and not line.startswith("#"))
    assert required and required <= set(example), required - set(example)
    assert len(example["MINIO_ROOT_PASSWORD"]) >= 8


@pytest.mark.parametrize("placeholder", ["MLFLOW_ADMIN_PASSWORD",
                                         "MLFLOW_FLASK_SERVER_SECRET_KEY"])
def test_the_auth_entrypoint_refuses_env_examples_placeholders_without_printing_them(
        tmp_path, placeholder):
    """A .env copied from env.example and not edited: the server would listen on every
    interface with an admin password published in the repository. The entrypoint stops
    before the server with one line naming the variable (exit 2), its value never printed and
    no configuration written; with secrets of one's own it starts the command it is given."""
    example = dict(line.split("=", 1) for line in (INFRA / "mlflow" / "env.example")
                   .read_text().splitlines() if line and not line.startswith("#"))
    conf = tmp_path / "basic_auth.ini"

    def entrypoint(**secrets) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin", "MLFLOW_AUTH_CONFIG_PATH": str(conf), **secrets}
        return subprocess.run(["sh", str(INFRA / "mlflow" / "auth-entrypoint.sh"),
                               "echo", "server started"], env=env, capture_output=True,
                              text=True, timeout=30)

    own = {"MLFLOW_ADMIN_PASSWORD": "a-password-of-our-own",
           "MLFLOW_FLASK_SERVER_SECRET_KEY": "a-key-of-our-own"}
    copied = {**own, placeholder: example[placeholder]}
    assert copied[placeholder].startswith("change-me")
    proc = entrypoint(**copied)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    (said,) = proc.stderr.strip().splitlines()
    assert said.startswith(f"error: {placeholder} still holds env.example's change-me")
    assert "infra/mlflow/.env" in said and copied[placeholder] not in said
    assert not conf.exists()

    proc = entrypoint(**own)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "server started\n", "")
    assert f"admin_password = {own['MLFLOW_ADMIN_PASSWORD']}" in conf.read_text()
    # A % in a secret (or a URL-encoded database password) is read back whole by MLflow's
    # reader, whose configparser refused a lone % (the server did not start)
    from mlflow.server.auth.config import read_auth_config

    odd = {**own, "MLFLOW_ADMIN_PASSWORD": "50%-of-a-secret%",
           "MLFLOW_AUTH_DATABASE_URI": "postgresql://u:p%40ss@db/auth"}
    assert entrypoint(**odd).returncode == 0
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_AUTH_CONFIG_PATH", str(conf))
        env.delenv("MLFLOW_AUTH_ADMIN_PASSWORD", raising=False)
        read = read_auth_config()
    assert (read.admin_password, read.database_uri) == (odd["MLFLOW_ADMIN_PASSWORD"],
                                                        odd["MLFLOW_AUTH_DATABASE_URI"])
